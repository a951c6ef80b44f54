"""Emulated cycles of our GEMM device code at the ten measured C600 points (facts §13.3).

Each point runs the init entry of ``gemm_f16[_interleaved][_packed64]_kK_cC_rR_rR`` once on
the ISA emulator (:mod:`ipu_stack.isa`, whose constants are the assumptions table and were
not fitted to these points) and is compared with the measurement and with the cost model's
formula (target/, calibrated on the same points). The packed points' output group is not
stated by the source; G = 64 (= C) is used. For them the record also holds our plain
(unpacked) unit's emulated cycles at the same shape and the reference's formula for its
interleaved, unpacked kernel (facts §13.2): the evidence for what the packed kernels differ in.

    PYTHONPATH=src python3 benchmarks/gemm_emulated.py [--out benchmarks/results/gemm_emulated.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ipu_stack.isa import CallResult, Tile, load_unit  # noqa: E402
from ipu_stack.kernels.registry import parse_gemm_variant  # noqa: E402
from ipu_stack.target import ipu21  # noqa: E402
from ipu_stack.target.gemm_cycles import MEASURED_POINTS, gemm_kernel_cycles  # noqa: E402


def _emulate(name: str, right: int) -> CallResult:
    variant = parse_gemm_variant(name)
    tile = Tile(load_unit(variant.source, variant.flags(), variant.name))
    return tile.call(variant.entry_symbols["init_small"],
                     {2: 0xC0000, 3: 0x4D000, 4: right, 11: 0x7F000})  # fmt: skip


def run(out: Path | None) -> list[dict]:
    """Emulate every measured point; print and return one record per point."""
    records = []
    for kind, rows, k, c, weights, measured in MEASURED_POINTS:
        il = "_interleaved" if weights == "interleaved" else ""
        pk = "_packed64" if kind == "packed" else ""
        variant = parse_gemm_variant(f"gemm_f16{il}{pk}_k{k}_c{c}_r{rows}_r{rows}")
        right = 0x90000 if il else 0x60000
        start = time.perf_counter()
        result = _emulate(variant.name, right)
        assert variant.spec.cycles is not None
        model = variant.spec.cycles(rows, k, c)
        rec = {
            "unit": variant.name, "kernel": kind, "weights": weights, "rows": rows, "k": k,
            "c": c, "measured_cycles": measured, "emulated_cycles": result.cycles,
            "emulated_error": round((result.cycles - measured) / measured, 4),
            "model_cycles": model, "model_error": round((model - measured) / measured, 4),
            "supervisor_instructions": result.supervisor_instructions,
            "worker_bundles": result.worker_bundles,
            "panels": (k // 16) * (c // 16), "seconds": round(time.perf_counter() - start, 2),
        }  # fmt: skip
        if kind == "packed":
            rec["plain_unit_emulated_cycles"] = _emulate(
                f"gemm_f16{il}_k{k}_c{c}_r{rows}_r{rows}", right
            ).cycles
            rec["reference_interleaved_formula_cycles"] = gemm_kernel_cycles(rows, k, c)
        records.append(rec)
        print(f"{kind:11} {weights:11} rows={rows:3} K={k:3} C={c:3} measured={measured:6} "
              f"emulated={result.cycles:6} ({100 * rec['emulated_error']:+.1f}%) "
              f"model={model:6} ({100 * rec['model_error']:+.1f}%)")  # fmt: skip
    within = sum(abs(r["emulated_error"]) <= 0.10 for r in records)
    print(f"{within} of {len(records)} points within 10% (launch of "
          f"{ipu21.KERNEL_LAUNCH_CYCLES} cycles not included on either side)")  # fmt: skip
    if out is not None:
        out.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    return records


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/gemm_emulated.json")
    run(parser.parse_args().out)

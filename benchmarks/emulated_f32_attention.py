"""Emulated vs modelled cycles of the F32 GEMM and attention units (kernel-run, seed 0).

*Emulated*: our device code (``templates/gemm_f32.S``, ``templates/attention.S``) run on the
ISA emulator under ``isa/assumptions.py``; *modelled*: the registry's cost model
(``target/gemm_cycles.py`` F32 form; ``target/attention_cycles.py`` via ``low/costs.py``),
launch included. Neither is a measurement; no constant was fitted to the other.

    PYTHONPATH=src python3 benchmarks/emulated_f32_attention.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ipu_stack.kernels.kernel_run import kernel_run  # noqa: E402

UNITS = (
    "gemm_f32_interleaved_k16_c32_r7_r7",
    "gemm_f32_interleaved_k64_c64_r32_r32",
    "gemm_f32_k128_c32_r12_r12",
    "gemm_f32_interleaved_k32_c128_r24_r24",
    "attention_f16_r2_t128_d64_v64",  # the encoder-block example's calls (1,440 tiles)
    "attention_f16_r12_t128_d64_v64",
    "attention_f16_r16_t64_d64_v64_causal",
    "attention_f16_r4_t729_d72_v72",  # SigLIP So400m-like: 729 keys, head dim 72
    "attention_f32_r8_t64_d32_v32_maskrow_f32",
)


def main(out: Path) -> list[dict]:
    rows = []
    for name in UNITS:
        report = kernel_run(name, seed=0)
        entry = report["entries"][0]  # init entry (GEMM) or the one entry (attention)
        err = entry.get("worst_ulp", entry.get("worst_relative"))
        rows.append({
            "unit": name, "ok": report["ok"], "entry": entry["entry"],
            "emulated_cycles": entry["emulated_cycles"],
            "modelled_cycles": entry["modelled_cycles"],
            "ratio": round(entry["emulated_cycles"] / entry["modelled_cycles"], 2),
            "worst_error": err, "error_unit": "ulp" if "worst_ulp" in entry else "relative",
        })  # fmt: skip
        r = rows[-1]
        print(f"| `{name}` | {r['emulated_cycles']:,} | {r['modelled_cycles']:,} | "
              f"{r['ratio']} | {err:.3g} {r['error_unit']} |")  # fmt: skip
    out.write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/emulated_f32_attention.json"
    )
    main(parser.parse_args().out)

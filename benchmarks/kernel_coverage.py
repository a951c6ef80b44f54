"""Device-code coverage of real programs: which kernel calls run on the ISA emulator, and does
every unit they use match its NumPy semantics?

For each model: import, build at ``--tiles``, run once with the default kernel semantics and
once with ``--kernels emulate`` (every call that has device code executes it on the emulator,
in place) on the same inputs; record the units emulated (calls, emulated and modelled cycles),
the kinds left to the semantics, and how far the emulated run's outputs are from the default
run's. Then run ``kernel-run`` (seeded random operands, compared with the registry's
semantics at its tolerance) once on every distinct unit any model used, and report the worst
error per template. Writes ``benchmarks/results/kernel_coverage.json``.

    PYTHONPATH=src python3 benchmarks/kernel_coverage.py                 # examples + fixtures
    PYTHONPATH=src python3 benchmarks/kernel_coverage.py --only bert mlp2 --tiles 16
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.errors import IpuStackError
from ipu_stack.graph.onnx_import import NUMPY_OF, import_onnx
from ipu_stack.kernels.kernel_run import kernel_run
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.emulate import EmulatedKernels
from ipu_stack.runtime.sim import SimDevice

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODELS = [
    ROOT / "examples/mlp2.onnx",
    ROOT / "examples/mlp2_f32.onnx",
    *sorted((ROOT / "tests/data/exports").glob("*.onnx")),
]


def _inputs(path: Path, bindings: Any, seed: int) -> dict[str, np.ndarray]:
    """The export's own ``.npz`` inputs when there are any, else uniform(-1, 1)."""
    npz = path.with_suffix(".npz")
    if npz.exists():
        data = np.load(npz)
        return {k[6:]: data[k] for k in data.files if k.startswith("input:")}
    rng = np.random.default_rng(seed)
    return {
        k: rng.uniform(-1, 1, v.shape).astype(NUMPY_OF[v.dtype]) for k, v in bindings.inputs.items()
    }


def cover_model(path: Path, tiles: int, seed: int) -> dict[str, Any]:
    """One model: default run vs emulated run; a JSON-ready record."""
    record: dict[str, Any] = {"model": path.name, "tiles": tiles}
    try:
        graph, bindings = import_onnx(path)
        built = build(graph, BuildConfig(tiles=tiles))
    except IpuStackError as err:
        return {**record, "error": str(err)[:300]}
    feeds = bindings.feeds(_inputs(path, bindings, seed))
    runs = {}
    emulated = EmulatedKernels()
    for mode in ("model", "emulate"):
        device = SimDevice()
        if mode == "emulate":
            device.kernels = emulated
        start = time.perf_counter()
        result = device.run(built.program, built.placement, built.schedules, feeds)
        runs[mode] = (result.outputs, time.perf_counter() - start)
    report = emulated.report()
    diffs = {}
    for name, ref in runs["model"][0].items():
        a = np.asarray(ref, np.float64)
        b = np.asarray(runs["emulate"][0][name], np.float64)
        scale = float(np.nanmax(np.abs(a))) if a.size else 0.0
        diffs[name] = {
            "max_abs_difference": float(np.nanmax(np.abs(a - b))) if a.size else 0.0,
            "max_abs_default": scale,
            "elements_differing": int(np.count_nonzero(a != b)),
            "elements": int(a.size),
            "dtype": str(np.asarray(ref).dtype),
        }
    return {
        **record,
        "emulated_units": report["emulated_units"],
        "modelled_only": report["modelled_only"],
        "emulated_calls": sum(v["calls"] for v in report["emulated_units"].values()),
        "modelled_calls": sum(v["calls"] for v in report["modelled_only"].values()),
        "outputs": diffs,
        "default_seconds": round(runs["model"][1], 2),
        "emulate_seconds": round(runs["emulate"][1], 2),
    }


def check_units(units: list[str]) -> dict[str, Any]:
    """kernel-run on every unit; per template: units, failures, worst error."""
    by_template: dict[str, dict[str, Any]] = defaultdict(
        lambda: {
            "units": 0,
            "failed": [],
            "worst_abs_error": 0.0,
            "worst_relative": 0.0,
            "worst_ulp": 0.0,
        }
    )
    for name in units:
        report = kernel_run(name, seed=0)
        template = Path(str(report.get("source", "?"))).name
        row = by_template[template]
        row["units"] += 1
        if not report["ok"]:
            row["failed"].append({"unit": name, "fault": str(report.get("fault", ""))[:200]})
        for entry in report["entries"]:
            for key, field in (("worst_abs_error", "max_abs_error"), ("worst_ulp", "worst_ulp"),
                               ("worst_relative", "worst_relative")):  # fmt: skip
                value = entry.get(field)
                if isinstance(value, (int, float)) and np.isfinite(value):
                    row[key] = max(row[key], float(value))
    return {k: dict(v) for k, v in sorted(by_template.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path, help="default: examples + fixtures")
    parser.add_argument("--tiles", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="+", default=[], help="model name substrings")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/kernel_coverage.json"
    )
    args = parser.parse_args()
    models = args.models or DEFAULT_MODELS
    if args.only:
        models = [m for m in models if any(s in m.name for s in args.only)]
    records = []
    for path in models:
        record = cover_model(path, args.tiles, args.seed)
        records.append(record)
        worst = max((d["max_abs_difference"] for d in record.get("outputs", {}).values()),
                    default=0.0)  # fmt: skip
        print(f"{path.name}: emulated {record.get('emulated_calls', 0)} calls, modelled "
              f"{sorted(record.get('modelled_only', {}))}, max |emulated - default| "
              f"{worst:.3g} {record.get('error', '')}", flush=True)  # fmt: skip
    units = sorted({u for r in records for u in r.get("emulated_units", {})})
    print(f"kernel-run on {len(units)} distinct units ...", flush=True)
    templates = check_units(units)
    for template, row in templates.items():
        print(
            f"  {template}: {row['units']} units, {len(row['failed'])} failed, worst abs "
            f"{row['worst_abs_error']:.3g}, worst {row['worst_ulp']:.3g} F16 ulp, worst relative "
            f"{row['worst_relative']:.3g}"
        )
    modelled = defaultdict(int)
    for r in records:
        for kind, v in r.get("modelled_only", {}).items():
            modelled[kind] += v["calls"]
    result = {"tiles": args.tiles, "models": records, "units": units, "templates": templates,
              "modelled_only_calls": dict(sorted(modelled.items()))}  # fmt: skip
    print(f"modelled-only calls over all models: {dict(sorted(modelled.items()))}")
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()

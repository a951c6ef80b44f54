"""Real exporter output end to end: import, compile, simulate, compare with onnxruntime.

Usage: python benchmarks/exporters.py [--dir tests/data/exports] [--tiles 1472]
           [--precision f32|f16] [--only SUBSTRING ...] [--out JSON]
           [--markdown]
       python benchmarks/exporters.py --table F32_JSON F16_JSON   (the README table)

Every ``MODEL__EXPORTER.onnx`` of ``--dir`` (written by examples/export_models.py) is imported,
compiled at ``--tiles`` tiles and run on the simulator on the inputs of its ``.npz``; each
output is compared with onnxruntime's output stored there. Pass: max abs error <= 2e-3 x
max |reference| (F32), <= 0.03 x with ``--precision f16`` (the model and its inputs are
converted to F16 first, as ``compile --precision f16``; the reference stays the F32
onnxruntime run). A model that does not import or compile is listed with its error.
Cycles are the simulator's (kernel calls costed by the registry's cycle models, exchange as
scheduled).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from ipu_stack.errors import IpuStackError
from ipu_stack.graph.onnx_import import import_onnx
from ipu_stack.graph.onnx_precision import convert_precision
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.sim import SimDevice

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = {"f32": 2e-3, "f16": 0.03}


def load_npz(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(inputs, onnxruntime outputs) by ONNX name from an export's ``.npz``."""
    data = np.load(path)
    inputs = {k[6:]: data[k] for k in data.files if k.startswith("input:")}
    outputs = {k[7:]: data[k] for k in data.files if k.startswith("output:")}
    return inputs, outputs


def all_kinds(graph: object) -> list[str]:
    """Operation kinds of ``graph`` and of every rolled loop body in it (a ``repeat``'s
    ``body`` attribute), so attention fused inside a loop counts once per body."""
    kinds = []
    for op in graph.operations:  # type: ignore[attr-defined]
        kinds.append(op.kind)
        if op.kind == "repeat":
            kinds.extend(all_kinds(op.attr("body")))
    return kinds


def check_export(path: Path, tiles: int, precision: str) -> dict[str, object]:
    """One export: import, build, simulate and compare; a JSON-ready record."""
    model, exporter = path.stem.split("__")
    record: dict[str, object] = {"model": model, "exporter": exporter, "precision": precision}
    inputs, expected = load_npz(path.with_suffix(".npz"))
    proto = onnx.load(str(path))
    if precision == "f16":
        proto = convert_precision(proto, "f16")
        inputs = {k: v.astype(np.float16) if v.dtype.kind == "f" else v for k, v in inputs.items()}
    stage = "import"
    try:
        start = time.perf_counter()
        graph, bindings = import_onnx(proto)
        record["import_seconds"] = round(time.perf_counter() - start, 3)
        record["fusions"] = len(bindings.fusions)
        record["fused_attention"] = sum(kind == "flash_attention" for kind in all_kinds(graph))
        stage = "compile"
        start = time.perf_counter()
        built = build(graph, BuildConfig(tiles=tiles))
        record["compile_seconds"] = round(time.perf_counter() - start, 2)
        stage = "simulate"
        run = SimDevice().run(
            built.program, built.placement, built.schedules, bindings.feeds(inputs)
        )
    except IpuStackError as err:
        record.update(stage=stage, error=str(err).split("; supported:")[0][:2000], passed=False)
        return record
    ours = bindings.onnx_outputs(run.outputs)
    worst = 0.0
    for name, want in expected.items():
        want64 = want.astype(np.float64)
        got = np.asarray(ours[name], dtype=np.float64).reshape(want64.shape)
        scale = float(np.abs(want64).max()) or 1.0
        error = float(np.abs(got - want64).max()) / scale
        worst = max(worst, error if np.isfinite(error) else float("inf"))  # NaN/inf fail
    record.update(
        stage="done",
        simulated_cycles=int(run.cycles),
        relative_error=worst,
        tolerance=TOLERANCE[precision],
        passed=bool(worst <= TOLERANCE[precision]),
    )
    return record


def markdown(records: list[dict[str, object]]) -> str:
    """The README table: model x exporter -> compile s, simulated cycles, error."""
    lines = [
        "| model | exporter | precision | compile s | simulated cycles | error / max ref "
        "| result |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if r["stage"] == "done":
            cells = [f"{r['compile_seconds']}", f"{r['simulated_cycles']:,}",
                     f"{r['relative_error']:.1e}", "pass" if r["passed"] else "FAIL"]  # fmt: skip
        else:
            reason = str(r["error"]).split("\n")[-1 if "\n" in str(r["error"]) else 0]
            cells = ["-", "-", "-", f"{r['stage']} fails: {reason[:120]}"]
        lines.append(f"| {r['model']} | {r['exporter']} | {r['precision']} | " + " | ".join(cells)
                     + " |")  # fmt: skip
    return "\n".join(lines)


def readme_table(f32: list[dict[str, object]], f16: list[dict[str, object]]) -> str:
    """The README's table from the two JSON runs: model x exporter -> compile s, simulated
    cycles and error at F32 and at F16, and the fused attentions (loop bodies included)."""

    def cells(r: dict[str, object] | None) -> list[str]:
        if r is None:
            return ["-", "-", "not run"]
        if r["stage"] != "done":
            return ["-", "-", f"{r['stage']} fails"]
        mark = "" if r["passed"] else " FAIL"
        return [f"{r['compile_seconds']}", f"{r['simulated_cycles']:,}",
                f"{r['relative_error']:.1e}{mark}"]  # fmt: skip

    half = {(r["model"], r["exporter"]): r for r in f16}
    lines = [
        "| model | exporter | F32 compile s | F32 cycles | F32 error | F16 compile s "
        "| F16 cycles | F16 error | fused attention |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in f32:
        other = half.get((r["model"], r["exporter"]))
        fused = r.get("fused_attention", "-")
        row = [str(r["model"]), str(r["exporter"]), *cells(r), *cells(other), str(fused)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=str(ROOT / "tests/data/exports"))
    parser.add_argument("--tiles", type=int, default=1472)
    parser.add_argument("--precision", choices=sorted(TOLERANCE), default="f32")
    parser.add_argument("--only", nargs="*", default=[], help="substrings of file names")
    parser.add_argument("--out", help="default: benchmarks/results/exporters[_f16].json")
    parser.add_argument("--markdown", action="store_true", help="print the README table")
    parser.add_argument("--table", nargs=2, metavar=("F32_JSON", "F16_JSON"),
                        help="print the README table of two earlier runs and exit")  # fmt: skip
    args = parser.parse_args(argv)
    if args.table:
        f32, f16 = (json.loads(Path(p).read_text())["records"] for p in args.table)
        print(readme_table(f32, f16))
        return 0
    paths = sorted(Path(args.dir).glob("*__*.onnx"))
    if args.only:
        paths = [p for p in paths if any(s in p.name for s in args.only)]
    if not paths:
        print(f"no MODEL__EXPORTER.onnx files in {args.dir}", file=sys.stderr)
        return 2
    records = []
    for path in paths:
        record = check_export(path, args.tiles, args.precision)
        records.append(record)
        print(json.dumps({k: v for k, v in record.items() if k != "error"}),
              record.get("error", "")[:300] if isinstance(record.get("error"), str) else "",
              flush=True)  # fmt: skip
    suffix = "" if args.precision == "f32" else f"_{args.precision}"
    out = Path(args.out or ROOT / f"benchmarks/results/exporters{suffix}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"tiles": args.tiles, "records": records}, indent=1))
    if args.markdown:
        print(markdown(records))
    return 0 if all(r["passed"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())

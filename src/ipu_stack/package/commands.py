"""The package commands of the ``ipu-stack`` CLI: compile, run, package-inspect."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import time
from collections import Counter
from typing import Any

import numpy as np

from ipu_stack.cli_types import (
    bounded_int,
    finite_float,
    named_shape,
    output_dir,
    output_file,
    seed,
)
from ipu_stack.errors import GraphError
from ipu_stack.target import ipu21
from ipu_stack.trace import Trace

COMMANDS = ("compile", "run", "package-inspect")


def _positive(text: str) -> int:
    from ipu_stack.cli import positive_int

    return positive_int(text, "expected a positive integer")


def _seconds(text: str) -> float:
    from ipu_stack.cli import nonnegative_seconds

    return nonnegative_seconds(text)


def _share(text: str) -> float:
    from ipu_stack.cli_types import share

    return share(text)


def _named_file(text: str) -> tuple[str, str]:
    from ipu_stack.cli_types import named_file

    return named_file(text)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register compile, run and package-inspect on the CLI's sub-parsers."""
    comp = sub.add_parser(
        "compile",
        help="compile an ONNX model into a .ipuexe package",
        description="Prints a plain summary of the build and the package written; --verbose "
        "prints the build trace (every phase with elapsed_ms and success) first.",
    )
    comp.add_argument("model", metavar="MODEL.onnx")
    comp.add_argument("-o", "--output", required=True, metavar="OUT.ipuexe", type=output_file)
    comp.add_argument(
        "--input-shape",
        type=named_shape,
        action="append",
        default=[],
        metavar="NAME=D,D,..",
        help="static shape of an input with symbolic dimensions (repeatable)",
    )
    comp.add_argument(
        "--tiles", type=_positive, default=ipu21.TILES, help=f"tiles to use (1..{ipu21.TILES})"
    )
    comp.add_argument(
        "--finalists", type=_positive, default=None, help="whole-graph plans kept by lower_mid"
    )
    comp.add_argument(
        "--exchange-budget",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="deterministic scheduling budget per exchange phase of the selected plan "
        "(default 1.0; 0 keeps the first list schedule; more can shorten exchange)",
    )
    comp.add_argument(
        "--exchange-refine-share",
        type=_share,
        default=None,
        metavar="FRACTION",
        help="reschedule a phase of the selected plan at the full budget only when the gap its "
        "quick schedule leaves to the lower bound (times its alike phases) is at least this "
        "share of the plan's cycles (default 0.001; 0: every phase above its target gap)",
    )
    comp.add_argument(
        "--precision",
        choices=("f16", "f32"),
        default=None,
        help="convert every float tensor of the model to this precision first (default: keep)",
    )
    comp.add_argument(
        "--weight-precision",
        choices=("f16", "f8"),
        default="f16",
        help="f8: GEMM weights in F143 with a power-of-two scale per tensor, activations cast "
        "to F8 before each such GEMM (scales calibrated on uniform(-1, 1) inputs)",
    )
    comp.add_argument(
        "--export-exchange-snapshot",
        metavar="PATH",
        type=output_file,
        default=None,
        help="write every exchange phase of the build as a snapshot JSON file",
    )
    comp.add_argument("--json", action="store_true", help="print one JSON object")
    comp.add_argument("--verbose", action="store_true",
                      help="print the build trace (key=value events) first")  # fmt: skip
    run = sub.add_parser("run", help="run a .ipuexe package on the simulator")
    run.add_argument("package", metavar="PKG.ipuexe")
    run.add_argument(
        "--input",
        type=_named_file,
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="data of an input (repeatable)",
    )
    run.add_argument(
        "--random-inputs",
        action="store_true",
        help="data for inputs not given: uniform(-1, 1) floats, integers 0 or 1",
    )
    run.add_argument(
        "--cast-inputs",
        action="store_true",
        help="convert --input arrays of another numeric dtype (else they must match exactly)",
    )
    run.add_argument("--seed", type=seed, default=0, help="seed of --random-inputs")
    run.add_argument(
        "--output-dir", metavar="DIR", type=output_dir, default=None,
        help="write NAME.npy per output",
    )  # fmt: skip
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.add_argument("--profile", metavar="OUT.ipuprof", default=None, type=output_file,
                     help="record the run's profile into this file")  # fmt: skip
    run.add_argument(
        "--check",
        metavar="MODEL.onnx",
        default=None,
        help="compare the outputs with onnxruntime on the same inputs (exit 1 on mismatch)",
    )
    run.add_argument(
        "--min-cosine", metavar="C", type=finite_float(0.0, 1.0, "--min-cosine"), default=None,
        help="with --check: an output passes when its cosine similarity to onnxruntime's is >= C "
        "(default with F8 weights: 0.99; else max |error| <= tolerance x max |reference|)",
    )  # fmt: skip
    run.add_argument(
        "--kernels", choices=("model", "emulate"), default="model",
        help="emulate: run every kernel call with device code on the ISA emulator (slow)",
    )  # fmt: skip
    ins = sub.add_parser("package-inspect", help="describe a .ipuexe package")
    ins.add_argument("package", metavar="PKG.ipuexe")
    ins.add_argument("--bindings", action="store_true", help="list every binding")
    ins.add_argument(
        "--tile", type=bounded_int(0, ipu21.TILES - 1, "tile id"), default=None, metavar="N",
        help="physical tile N",
    )  # fmt: skip
    ins.add_argument(
        "--disasm", action="store_true", help="with --tile: the tile's code and exchange rows"
    )
    ins.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    """Run a package command (``args.command`` in :data:`COMMANDS`)."""
    if args.command == "compile":
        return _compile(args)
    if args.command == "run":
        return _run(args)
    return _inspect(args)


# -- compile ------------------------------------------------------------------------------------
def _load_onnx(path: str, precision: str | None, input_shapes: dict[str, Any]) -> Any:

    from ipu_stack.graph.onnx_external import load_model
    from ipu_stack.graph.onnx_precision import convert_precision
    from ipu_stack.graph.onnx_validate import validate_onnx

    proto = load_model(path)  # errors named; large external weights stay memory-mapped
    validate_onnx(proto, path, input_shapes)  # on the file as given, before any conversion
    if not precision:
        return proto
    # converted: inline tensors now, external ones one at a time as the importer reads them
    return convert_precision(proto, precision)


def _compile(args: argparse.Namespace) -> int:
    from ipu_stack.gc_pause import collector_paused

    # No cyclic collector for the whole command: the build and the package make millions of
    # long-lived objects and none in cycles (``build`` and ``assemble_package`` pause it
    # themselves; this also covers import, calibration and the steps between them, where a
    # collection would walk everything the build made).
    with collector_paused():
        return _compile_paused(args)


def _compile_paused(args: argparse.Namespace) -> int:
    from ipu_stack.gc_pause import hold_until_exit
    from ipu_stack.graph.onnx_import import import_onnx
    from ipu_stack.graph.weight_precision import quantize_bindings
    from ipu_stack.package.assemble import assemble_package, report_json
    from ipu_stack.package.build import BuildConfig, build
    from ipu_stack.package.summary import compile_summary
    from ipu_stack.progress import ProgressTrace, enabled, stage

    started = time.perf_counter()
    trace = ProgressTrace() if enabled() and not args.json else Trace()
    shapes = dict(args.input_shape)
    with stage(trace, f"importing {args.model}"):
        proto = _load_onnx(args.model, args.precision, shapes)
        # validated by _load_onnx as read; a precision-converted copy is validated again
        graph, onnx_bindings = import_onnx(
            proto, input_shapes=shapes, validate=bool(args.precision)
        )
    if args.weight_precision != "f16":
        with stage(trace, "calibrating F8 activation scales (float32 run of the model)"):
            graph = quantize_bindings(graph, onnx_bindings, args.weight_precision)
    config = BuildConfig(tiles=args.tiles)
    if args.finalists is not None:
        config.finalists = args.finalists
    if args.exchange_budget is not None:
        config.exchange_time_budget = args.exchange_budget
    if args.exchange_refine_share is not None:
        config.exchange_refine_share = args.exchange_refine_share
    try:
        built = build(graph, config, trace)
    finally:
        if isinstance(trace, ProgressTrace):
            trace.close()
    if args.export_exchange_snapshot is not None:
        from ipu_stack.exchange.snapshot import write_snapshot

        phases = [(index, phase) for index, (phase, _) in sorted(built.schedules.items())]
        write_snapshot(args.export_exchange_snapshot, phases, ipu21.TILES)
    # Bindings take the ONNX names, so `run --input x=...` uses the model's own names.
    names = {v.name: k for k, v in onnx_bindings.inputs.items()}
    names.update({v.name: k for k, v in onnx_bindings.outputs.items()})
    with trace.phase("assemble_package"):
        package = assemble_package(built, onnx_bindings.parameters, names=names)
    with trace.phase("write_package"):
        size, digest = package.write(args.output)
    summary = package_summary(package, args.output, size, digest)
    hold_until_exit(built, package, graph, proto)  # freed by the process's end, not one by one
    if args.json:
        print(json.dumps({**summary, "report": report_json(built.report())}, sort_keys=True))
        return 0
    print(
        f"wrote {args.output}: {size} bytes, sha256 {summary['digest']}, "
        f"{summary['tiles']} tiles, {summary['steps']['compute']} compute + "
        f"{summary['steps']['exchange']} exchange steps, "
        f"{summary['weight_bytes']} weight bytes"
    )
    wall = time.perf_counter() - started
    print("\n".join(compile_summary(args.model, built, package, args.output, size, wall,
                                    args.tiles)))  # fmt: skip
    print(f"estimated_cycles={summary['estimated_cycles']}")
    return 0


# -- run ----------------------------------------------------------------------------------------
def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "output"


def _run(args: argparse.Namespace) -> int:
    from ipu_stack.outputs import atomic_write_many, make_output_dir
    from ipu_stack.runtime.npy_input import check_input_names, load_npy_input
    from ipu_stack.runtime.session import Session, host_dtype
    from ipu_stack.runtime.sim import SimDevice

    device = SimDevice()
    if getattr(args, "kernels", "model") == "emulate":
        from ipu_stack.runtime.emulate import EmulatedKernels

        device.kernels = EmulatedKernels()
    session = Session(device).load(args.package)
    assert session.package is not None
    bindings = {b["name"]: b for b in session.package.bindings("input")}
    check_input_names((name for name, _ in args.input), bindings)
    inputs: dict[str, np.ndarray] = {}
    for name, path in args.input:
        b = bindings[name]
        inputs[name] = load_npy_input(
            f"--input {name}", path, host_dtype(b["dtype"]), b["shape"], args.cast_inputs
        )
    rng = np.random.default_rng(args.seed)
    for name, b in bindings.items():
        if name not in inputs:
            if not args.random_inputs:
                raise GraphError(
                    f"no data for input {name!r}; pass --input {name}=FILE.npy or --random-inputs"
                )
            dtype = np.dtype(host_dtype(b["dtype"]))
            if dtype.kind in "iub":  # token ids, positions, masks: 0 and 1 are valid for all
                inputs[name] = rng.integers(0, 2, b["shape"]).astype(dtype)
            else:
                inputs[name] = rng.uniform(-1, 1, b["shape"]).astype(dtype)
    session.initialize()
    from ipu_stack.progress import SimulationProgress, enabled

    assert session.executable is not None
    bar = SimulationProgress(session.executable.program) if enabled() and not args.json else None
    try:
        outputs = session.run(inputs, profile=args.profile or False, observer=bar)
    finally:
        if bar is not None:
            bar.close()
    result = session.last_run
    assert result is not None and session.profile is not None
    clock = int(session.package.manifest.get("clock_hz", ipu21.CLOCK_HZ))
    written = {}
    if args.output_dir is not None:
        out_dir = make_output_dir(args.output_dir)
        files = []
        for name, value in outputs.items():
            buffer = io.BytesIO()
            np.save(buffer, value)
            files.append((out_dir / f"{_safe_name(name)}.npy", buffer.getvalue()))
            written[name] = str(files[-1][0])
        atomic_write_many(files)
    report = {
        "package": args.package,
        "simulated_cycles": result.cycles,
        "clock_hz": clock,
        "simulated_seconds": result.cycles / clock,
        "simulate_seconds": result.seconds,
        "step_cycles": result.step_cycles,
        "step_kinds": session.profile.kinds,
        **({"profile": args.profile} if args.profile else {}),
        "outputs": [
            {
                "name": name,
                "dtype": str(value.dtype),
                "shape": list(value.shape),
                "min": float(np.min(value)),
                "max": float(np.max(value)),
                "mean": float(np.mean(value, dtype=np.float64)),
                **({"file": written[name]} if name in written else {}),
            }
            for name, value in outputs.items()
        ],
    }
    status = 0
    if args.check is not None:
        from ipu_stack.runtime.check import F8_MIN_COSINE, check_outputs

        dtypes = {b["name"]: b["dtype"] for b in session.package.bindings("output")}
        min_cosine = args.min_cosine
        if min_cosine is None and any(
            b["dtype"] == "f8" for b in session.package.bindings("weight")
        ):
            min_cosine = F8_MIN_COSINE
        report["check"] = check_outputs(args.check, inputs, outputs, dtypes, min_cosine)
        status = 0 if report["check"]["passed"] else 1
    if device.kernels is not None:
        report["kernels"] = device.kernels.report()
    if args.json:
        print(json.dumps(report, sort_keys=True))
        return status
    for out in report["outputs"]:
        where = f" -> {out['file']}" if "file" in out else ""
        print(
            f"output {out['name']} {out['dtype']} {tuple(out['shape'])}: min={out['min']:.4g} "
            f"max={out['max']:.4g} mean={out['mean']:.4g}{where}"
        )
    print(
        f"simulated_cycles={result.cycles} time={result.cycles / clock * 1e6:.3f} us at "
        f"{clock / 1e9:g} GHz (steps={len(result.step_cycles)}, "
        f"simulate_seconds={result.seconds:.2f})"
    )
    if args.profile:
        print(f"profile {args.profile}: {os.path.getsize(args.profile):,} bytes")
    if "check" in report:
        for c in report["check"]["outputs"]:
            criterion = report["check"]["criterion"]
            bound = f"tolerance {c.get('tolerance')}" if criterion == "relative" else criterion
            detail = c.get("reason") or (
                f"max_abs_error={c['max_abs_error']:.4g} relative={c['relative_error']:.3g} "
                f"cosine={c['cosine']:.6f} ({bound})"
            )
            print(f"check {c['name']} against onnxruntime: {detail}")
        print("PASS" if report["check"]["passed"] else "FAIL: outputs differ from onnxruntime")
    if device.kernels is not None:
        kernels = report["kernels"]
        for unit, v in kernels["emulated_units"].items():
            print(f"kernel {unit}: calls={v['calls']} emulated_cycles={v['emulated_cycles']} "
                  f"modelled_cycles={v['modelled_cycles']}")  # fmt: skip
        for kind, v in kernels["modelled_only"].items():
            print(f"kernel {kind}: calls={v['calls']} modelled_cycles={v['modelled_cycles']} "
                  "(no device code: NumPy semantics)")  # fmt: skip
    return status


# -- inspect ------------------------------------------------------------------------------------
def package_summary(
    package: Any, path: str, size: int, digest: str | None = None
) -> dict[str, Any]:
    """What package-inspect prints first: identity, sizes, program shape (``digest``: the
    one just written, if known)."""
    m = package.manifest
    steps = m["program"]["steps"]
    calls = Counter(c[0] for s in steps if s["kind"] == "compute" for c in s["calls"])
    by_role = Counter(b["role"] for b in m["bindings"])
    return {
        "path": path,
        "bytes": size,
        "digest": digest or package.digest,
        "schema_version": m["schema_version"],
        "compiler_version": m["compiler_version"],
        "target": m["target"],
        "tile_memory": [m["tile_memory_base"], m["tile_memory_size"]],
        "tiles": len(m["tiles"]),
        "steps": {
            "compute": sum(s["kind"] == "compute" for s in steps),
            "exchange": sum(s["kind"] == "exchange" for s in steps),
        },
        "calls": dict(sorted(calls.items())),
        "transfers": len(package.table("transfers")),
        "pieces": len(package.table("pieces")),
        "segments": len(package.table("segments")),
        "allocations": len(package.table("allocations")),
        "bindings": {role: by_role.get(role, 0) for role in ("input", "weight", "output")},
        "weight_bytes": m["sections"]["weights"]["size"],
        "host_calls": [c["name"] for c in m["host_calls"]],
        "kernels": [k["name"] for k in m["kernels"]],
        "estimated_cycles": m["program"]["estimated_cycles"],
    }


def _bindings(package: Any) -> list[dict[str, Any]]:
    out = []
    for b in package.bindings():
        sl = package.binding_slices(b)
        out.append(
            {
                "name": b["name"],
                "role": b["role"],
                "dtype": b["dtype"],
                "shape": b["shape"],
                "slices": len(sl),
                "tiles": len(set(sl[:, 0].tolist())),
                "slice_bytes": int(sl[:, 9].sum()) if b.get("embedded") else 0,
            }
        )
    return out


def _tile(package: Any, tile: int) -> dict[str, Any]:
    m = package.manifest
    if tile not in m["tiles"]:
        some = ", ".join(str(t) for t in m["tiles"][:8])
        raise GraphError(
            f"tile {tile} is not in the package; its {len(m['tiles'])} physical tiles are "
            f"{some}{', ...' if len(m['tiles']) > 8 else ''}"
        )
    seg = package.table("segments")
    alloc = package.table("allocations")
    names = m["allocation_names"]
    slices = []
    for b in package.bindings():
        for row in package.binding_slices(b).tolist():
            if row[0] == tile:
                slices.append({"binding": b["name"], "address": row[1], "rows": row[3:5],
                               "cols": row[5:7], "row_stride": row[2]})  # fmt: skip
    transfers = package.table("transfers")
    dests = package.table("destinations")
    steps = []
    for index, step in enumerate(m["program"]["steps"]):
        if step["kind"] == "compute":
            calls = [c for c in step["calls"] if c[1] == tile]
            if calls:
                steps.append({"step": index, "kind": "compute", "calls": calls})
            continue
        start, count = step["transfers"]
        block = transfers[start : start + count]
        sent = int((block[:, 0] == tile).sum())
        d0 = int(block[0, 4])
        d1 = int(transfers[start + count, 4]) if start + count < len(transfers) else len(dests)
        received = int((dests[d0:d1, 0] == tile).sum())
        if sent or received:
            steps.append({"step": index, "kind": "exchange", "label": step.get("label", ""),
                          "sends": sent, "receives": received})  # fmt: skip
    return {
        "tile": tile,
        "logical": m["tiles"].index(tile),
        "segments": [[a, s, f] for _, a, s, f, _ in seg[seg[:, 0] == tile].tolist()],
        "allocations": [
            {
                "name": names[i],
                "address": int(alloc[i, 1]),
                "size": int(alloc[i, 2]),
                "live": [int(alloc[i, 3]), int(alloc[i, 4])],
            }
            for i in np.flatnonzero(alloc[:, 0] == tile).tolist()
        ],
        "slices": slices,
        "steps": steps,
    }


def describe_call(call: list[Any]) -> str:
    """One packaged kernel call as text, addresses in hex."""
    kind = call[0]

    def view(v: list[Any]) -> str:
        return f"{v[0]:#x}[{v[1]}x{v[2]} stride {v[3]} {v[4]}]"

    if kind == "gemm":
        _, _, out, left, right, rows, k, c, prec, acc, weights, scale = call
        mode = "accumulate" if acc else "init"
        scaled = f" scale=2**{scale}" if scale else ""
        return (
            f"gemm {prec} {mode} rows={rows} k={k} c={c} weights={weights}{scaled} out={out:#x} "
            f"left={left:#x} right={right:#x}"
        )
    if kind == "add":
        inputs = ",".join(f"{a:#x}" for a in call[3])
        return f"add {call[5]} elements={call[4]} out={call[2]:#x} inputs={inputs}"
    if kind == "copy":
        return f"copy {call[4]} bytes {call[3]:#x} -> {call[2]:#x}"
    if kind == "copy2d":
        return (
            f"copy {call[5]} runs of {call[4]} bytes {call[3]:#x} (stride {call[7]}) -> "
            f"{call[2]:#x} (stride {call[6]})"
        )
    if kind == "fill":
        return f"fill {call[3]} bytes at {call[2]:#x}"
    attrs = " ".join(f"{k}={v}" for k, v in call[5])
    inputs = " ".join(view(v) for v in call[4])
    return f"map {call[2]} out={view(call[3])} inputs={inputs} {attrs}".rstrip()


def _inspect(args: argparse.Namespace) -> int:
    from ipu_stack.package.format import Package

    package = Package.load(args.package)
    summary = package_summary(package, args.package, os.path.getsize(args.package))
    report: dict[str, Any] = {"summary": summary}
    if args.bindings:
        report["bindings"] = _bindings(package)
    if args.tile is not None:
        report["tile"] = _tile(package, args.tile)
    if args.disasm:
        if args.tile is None:
            raise GraphError("--disasm needs --tile N (a physical tile of the package)")
        from ipu_stack.tilecode.disasm import disassemble

        report["disasm"] = disassemble(package, args.tile)
    if args.json:
        from ipu_stack.package.format import HEADER
        from ipu_stack.tilecode.disasm import segment_records

        with open(args.package, "rb") as f:
            manifest_bytes = HEADER.unpack(f.read(HEADER.size))[3]
        report["segments"] = segment_records(package, manifest_bytes, HEADER.size)
        print(json.dumps(report, sort_keys=True))
        return 0
    s = summary
    print(f"package {s['path']}: {s['bytes']} bytes, sha256 {s['digest']}")
    print(
        f"schema {s['schema_version']}, compiler {s['compiler_version']}, target {s['target']}, "
        f"tile memory {s['tile_memory'][0]:#x} +{s['tile_memory'][1]}"
    )
    print(
        f"tiles={s['tiles']} segments={s['segments']} allocations={s['allocations']} "
        f"weight_bytes={s['weight_bytes']}"
    )
    calls = " ".join(f"{k}={v}" for k, v in s["calls"].items())
    print(
        f"steps: compute={s['steps']['compute']} exchange={s['steps']['exchange']}; "
        f"calls: {calls}; transfers={s['transfers']} pieces={s['pieces']}"
    )
    roles = " ".join(f"{k}={v}" for k, v in s["bindings"].items())
    print(f"bindings: {roles}; host calls: {', '.join(s['host_calls'])}")
    print(f"kernels: {', '.join(s['kernels']) or 'none'}")
    print(f"estimated_cycles={s['estimated_cycles']}")
    for b in report.get("bindings", []):
        print(
            f"  {b['role']:<6} {b['name']} {b['dtype']} {tuple(b['shape'])}: {b['slices']} "
            f"slices on {b['tiles']} tiles, {b['slice_bytes']} data bytes in slices"
        )
    if "tile" in report:
        t = report["tile"]
        print(f"tile {t['tile']} (logical {t['logical']}):")
        for address, size, flags in t["segments"]:
            print(f"  segment [{address:#x}, {address + size:#x}) flags {flags}")
        for a in t["allocations"]:
            print(
                f"  allocation {a['name']} [{a['address']:#x}, {a['address'] + a['size']:#x}) "
                f"live steps {a['live'][0]}..{a['live'][1] - 1}"
            )
        for sl in t["slices"]:
            print(
                f"  slice {sl['binding']} at {sl['address']:#x} rows {sl['rows']} "
                f"cols {sl['cols']} stride {sl['row_stride']}"
            )
        for st in t["steps"]:
            if st["kind"] == "compute":
                for call in st["calls"]:
                    print(f"  step {st['step']} {describe_call(call)}")
            else:
                print(
                    f"  step {st['step']} exchange {st['label']!r}: sends {st['sends']}, "
                    f"receives {st['receives']}"
                )
    for line in report.get("disasm", []):
        print(line)
    return 0

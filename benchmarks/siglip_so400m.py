"""SigLIP So400m/14-384 vision tower: export, compile, simulate, compare with onnxruntime.

    python3 benchmarks/siglip_so400m.py [--model auto|siglip|stand-in] [--batch 1 2]
        [--layers 27] [--weight-precision auto|f16|f8] [--tiles 1472] [--workdir DIR]
        [--out benchmarks/results/siglip_so400m.json] [--no-simulate]

``siglip`` exports ``SiglipVisionModel`` (transformers, random init from the published
So400m/14-384 vision config: hidden 1152, MLP 4304, 27 layers, 16 heads, patch 14, image 384,
``gelu_pytorch_tanh``, layer-norm epsilon 1e-6; no download) with ``torch.onnx.export``,
weights in an external-data file, and compiles it at F16 (``convert_precision``). It needs the
exporter coverage of issue 11 (tanh GeLU, patch Conv, Gather, Concat). ``stand-in`` writes the
encoder tower from ``examples/make_examples.py`` at the same widths (pre-norm layers, exact
GeLU, no patch embedding and no pooling head), saved with external data. ``auto`` tries
``siglip`` and falls back to the stand-in when the import fails, recording why.

Per batch the JSON records seconds per phase (export, import with layer rolling, F8
quantisation, every build phase of the trace, package assembly and writing, simulation,
onnxruntime), the peak RSS after each stage, the package size, the simulated cycles in total
and per part (steps before the loop: embedding; one layer of the loop body: attention up to the
second layer norm, then the MLP; steps after the loop: head), the GEMM utilization of each
GEMM of the loop body (MACs / (tiles x AMP MACs per cycle of its precision x the simulated
cycles of its steps, exchange included)), and cosine and max abs error of every output against
onnxruntime. Simulated cycles are the simulator's: calibrated kernel cycle formulas and
scheduled exchange (see README).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "examples"))

from ipu_stack.errors import GraphError, PlanError  # noqa: E402
from ipu_stack.graph.onnx_import import import_onnx  # noqa: E402
from ipu_stack.graph.weight_precision import quantize_bindings  # noqa: E402
from ipu_stack.low.program import (  # noqa: E402
    ComputeStep,
    CopyCall,
    ExchangeStep,
    FillCall,
    GemmCall,
    RepeatStep,
    View,
)
from ipu_stack.package.assemble import assemble_package  # noqa: E402
from ipu_stack.package.build import BuildConfig, build  # noqa: E402
from ipu_stack.runtime.sim import SimDevice  # noqa: E402
from ipu_stack.target import ipu21  # noqa: E402
from ipu_stack.trace import Trace  # noqa: E402

CONFIG = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "patch_size": 14,
    "image_size": 384,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
REFERENCE = {
    "cycles_batch1": 10_088_124,
    "cycles_batch2": 16_202_412,
    "mlp_cycles_batch1": 176_706,
    "attention_cycles_batch1": 216_444,
    "planning_seconds_batch1": 70.6,
    "gemm_utilization": {"qkv": 0.841, "mlp_up": 0.667, "mlp_down": 0.741, "qk": 0.588,
                         "pv": 0.480},
}  # fmt: skip


def peak_rss_gb() -> float:
    """Peak resident set of this process so far, GB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def export_siglip(path: Path, batch: int, layers: int) -> None:
    """``SiglipVisionModel`` (random init, seed 0) exported to ``path`` with external data."""
    import torch
    from transformers import SiglipVisionConfig, SiglipVisionModel

    torch.manual_seed(0)
    config = SiglipVisionConfig(**{**CONFIG, "num_hidden_layers": layers})
    model = SiglipVisionModel(config).eval()
    pixels = torch.zeros(batch, 3, CONFIG["image_size"], CONFIG["image_size"])
    tmp = path.with_suffix(".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(
            model, (pixels,), str(tmp), input_names=["pixel_values"],
            output_names=["last_hidden_state", "pooler_output"], opset_version=17, dynamo=False,
        )  # fmt: skip
    proto = onnx.load(str(tmp))
    onnx.save(proto, str(path), save_as_external_data=True, location=path.name + ".data")
    tmp.unlink()


def export_stand_in(path: Path, batch: int, layers: int) -> None:
    """The encoder tower at So400m widths from our generator, F16, with external data."""
    import make_examples

    model = make_examples.encoder_block(
        "f16", layers=layers, batch=batch, tokens=729, hidden=1152, heads=16, intermediate=4304
    )
    onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data")


def in_child(fn: Any, *fn_args: Any) -> None:
    """Run an export in a fresh process, so this one's peak RSS is the compiler's alone."""
    import multiprocessing as mp

    proc = mp.get_context("spawn").Process(target=fn, args=fn_args)
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"{fn.__name__} failed with exit code {proc.exitcode}")


def random_inputs(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """uniform(-1, 1) data for every graph input of the model at ``path``."""
    proto = onnx.load(str(path), load_external_data=False)
    rng = np.random.default_rng(seed)
    feeds = {}
    init = {t.name for t in proto.graph.initializer}
    for vi in proto.graph.input:
        if vi.name in init:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        feeds[vi.name] = rng.uniform(-1, 1, shape).astype(dtype)
    return feeds


def step_names(step: Any) -> list[str]:
    """Buffer names a compute step writes, or an exchange step's label."""
    if isinstance(step, ComputeStep):
        names = []
        for call in step.calls:
            target = call.dst if isinstance(call, (CopyCall, FillCall)) else call.out
            names.append(target.ref.buffer if isinstance(target, View) else target.buffer)
        return names
    if isinstance(step, ExchangeStep):
        return [step.label]
    return []


def belongs(name: str, op_name: str) -> bool:
    return name == op_name or name.startswith((op_name + ".", op_name + " "))


def op_cycles(
    steps: list[Any], step_cycles: list[int], indices: range, names: list[str]
) -> dict[str, float]:
    """Simulated cycles of ``steps[indices]`` per operation: an exchange step's to the
    operation its label names; a compute step's split over the operations whose calls its
    busiest tile runs (consecutive calls share a step), in proportion to their modelled
    cycles there."""
    from collections import defaultdict

    from ipu_stack.low.costs import call_cycles

    def owner(buffer: str) -> str:
        return next((n for n in names if belongs(buffer, n)), "other")

    out: dict[str, float] = defaultdict(float)
    for j in indices:
        step, cycles = steps[j], step_cycles[j]
        if isinstance(step, ExchangeStep):
            out[owner(step.label)] += cycles
        elif isinstance(step, ComputeStep) and step.calls:
            per_tile: dict[int, list[Any]] = defaultdict(list)
            for call in step.calls:
                per_tile[call.tile].append(call)
            busiest = max(per_tile.values(), key=lambda cs: sum(call_cycles(c) for c in cs))
            shares: dict[str, int] = defaultdict(int)
            for call, name in zip(busiest, step_names(ComputeStep(busiest)), strict=True):
                shares[owner(name)] += call_cycles(call)
            total = sum(shares.values()) or 1
            for name, share in shares.items():
                out[name] += cycles * share / total
    return dict(out)


def parts(built: Any, step_cycles: list[int]) -> dict[str, Any]:
    """Simulated cycles per part and the GEMM utilizations of the loop body."""
    steps = built.program.steps
    loop = next((i for i, s in enumerate(steps) if isinstance(s, RepeatStep)), None)
    if loop is None:  # one unrolled layer: the whole program
        count, body, sub, loop = 1, range(len(steps)), built.graph, -1
    else:
        count = steps[loop].count
        body = range(loop + 1, loop + 1 + steps[loop].length)
        sub = next(op for op in built.graph.operations if op.kind == "repeat").attr("body")
    norms = [op.name for op in sub.operations if op.kind == "layer_norm"]
    split = body.stop
    if len(norms) >= 2:
        split = next(
            (j for j in body if any(belongs(n, norms[1]) for n in step_names(steps[j]))),
            body.stop,
        )
    per_layer = [step_cycles[j] / count for j in body]
    out: dict[str, Any] = {
        "embedding": int(sum(step_cycles[: max(loop, 0)])),
        "layers": int(sum(step_cycles[j] for j in body)),
        "layer_count": count,
        "one_layer": round(sum(per_layer)),
        "one_layer_attention": round(sum(per_layer[: split - body.start])),
        "one_layer_mlp": round(sum(per_layer[split - body.start :])),
        "head": int(sum(step_cycles[body.stop :])),
    }
    attributed = op_cycles(steps, step_cycles, body, [op.name for op in sub.operations])
    out["one_layer_by_operation"] = {
        name: round(c / count) for name, c in sorted(attributed.items(), key=lambda kv: -kv[1])
    }
    utilization = {}
    for op in sub.operations:
        if op.kind not in ("gemm", "flash_attention"):
            continue
        mine = [j for j in body if any(belongs(n, op.name) for n in step_names(steps[j]))]
        cycles = attributed.get(op.name, 0) / count
        left, right = (sub.value(v) for v in op.inputs[:2])
        res = sub.value(op.output)
        k = left.shape[-2] if op.transpose_left else left.shape[-1]
        if op.kind == "flash_attention":  # QK^T and PV: 2 x tokens x tokens x head width
            k = 2 * right.shape[-2]
        macs = int(np.prod(res.shape, dtype=np.int64)) * k
        prec = ipu21.precision(left.dtype)
        calls = [c for j in mine if isinstance(steps[j], ComputeStep) for c in steps[j].calls]
        if any(isinstance(c, GemmCall) for c in calls):
            prec = next(c for c in calls if isinstance(c, GemmCall)).precision
        peak = built.program.tile_count * prec.amp_macs_per_cycle
        utilization[op.name] = {
            "precision": prec.name,
            "macs": macs,
            "cycles": round(cycles),
            "utilization": round(macs / (peak * cycles), 4) if cycles else None,
        }
    out["gemm_utilization"] = utilization
    return out


def compare(got: np.ndarray, want: np.ndarray) -> dict[str, float]:
    a = np.ravel(got).astype(np.float64)
    b = np.ravel(want).astype(np.float64)
    return {
        "cosine": float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))),
        "max_abs_error": float(np.abs(a - b).max()),
        "max_abs_reference": float(np.abs(b).max()),
    }


def _commit() -> str | None:
    """The checkout's short commit id (None outside a git checkout)."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def run_batch(args: argparse.Namespace, batch: int) -> dict[str, Any]:
    """Export (or write), compile, simulate and check one batch size."""
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    rec: dict[str, Any] = {"batch": batch, "commit": _commit(), "seconds": {}, "peak_rss_gb": {}}
    sec, rss = rec["seconds"], rec["peak_rss_gb"]
    model = args.model
    graph = bindings = None
    t = time.perf_counter()
    if model in ("auto", "siglip"):
        path = work / f"siglip_L{args.layers}_b{batch}.onnx"
        try:
            if not path.exists():
                in_child(export_siglip, path, batch, args.layers)
            sec["export"] = time.perf_counter() - t
            t = time.perf_counter()
            graph, bindings = import_onnx(_f16(path))
            model = "siglip"
        except (GraphError, ImportError, RuntimeError) as err:
            rec["siglip_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:500]}"
            if model == "siglip":
                return rec
            model = "stand-in"
    if model == "stand-in":
        path = work / f"stand_in_L{args.layers}_b{batch}.onnx"
        t = time.perf_counter()
        if not path.exists():
            in_child(export_stand_in, path, batch, args.layers)
        sec["export"] = time.perf_counter() - t
        t = time.perf_counter()
        graph, bindings = import_onnx(path)
    assert graph is not None and bindings is not None
    rec["model"], rec["onnx"] = model, str(path)
    sec["import"] = time.perf_counter() - t
    rss["import"] = peak_rss_gb()
    rec["fusions"] = [f for f in bindings.fusions if f.startswith("rolled")]
    weight_precision = "f8" if args.weight_precision == "auto" else args.weight_precision
    t = time.perf_counter()
    graph = quantize_bindings(graph, bindings, weight_precision)
    sec["quantize_weights"] = time.perf_counter() - t
    rss["quantize_weights"] = peak_rss_gb()
    rec["weight_precision"] = weight_precision
    trace = Trace(quiet=True)
    t = time.perf_counter()
    try:
        built = build(graph, BuildConfig(tiles=args.tiles), trace)
    except PlanError as err:
        sec["build"] = time.perf_counter() - t
        rec["plan_error"] = str(err).splitlines()[0]
        return rec
    sec["build"] = time.perf_counter() - t
    rss["build"] = peak_rss_gb()
    phases: dict[str, float] = {}
    for p in trace.phases:  # planning phases repeat when a tighter memory model retries
        phases[p["name"]] = phases.get(p["name"], 0.0) + p["elapsed_ms"] / 1e3
    rec["build_phases_seconds"] = phases
    rec["program_steps"] = len(built.program.steps)
    rec["estimated_cycles"] = built.program.estimated_cycles
    names = {v.name: k for k, v in bindings.inputs.items()}
    names.update({v.name: k for k, v in bindings.outputs.items()})
    t = time.perf_counter()
    package = assemble_package(built, bindings.parameters, names=names)
    sec["assemble_package"] = time.perf_counter() - t
    t = time.perf_counter()
    rec["package_bytes"] = package.save(str(work / f"{model}_b{batch}.ipuexe"))
    sec["write_package"] = time.perf_counter() - t
    del package
    rss["package"] = peak_rss_gb()
    if args.no_simulate:
        return rec
    inputs = random_inputs(path)
    t = time.perf_counter()
    result = SimDevice().run(
        built.program, built.placement, built.schedules, bindings.feeds(inputs)
    )
    sec["simulate"] = time.perf_counter() - t
    rss["simulate"] = peak_rss_gb()
    rec["cycles"] = result.cycles
    rec["parts"] = parts(built, result.step_cycles)
    got = bindings.onnx_outputs(result.outputs)
    t = time.perf_counter()
    import onnxruntime as ort

    session = ort.InferenceSession(str(path))
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs),
                    strict=True))  # fmt: skip
    sec["onnxruntime"] = time.perf_counter() - t
    rec["accuracy"] = {name: compare(got[name], want[name]) for name in got if name in want}
    return rec


def _f16(path: Path) -> onnx.ModelProto:
    """The F32 export converted to F16 (external weights converted one at a time on read)."""
    from ipu_stack.graph.onnx_external import load_model
    from ipu_stack.graph.onnx_precision import convert_precision

    return convert_precision(load_model(path), "f16")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; writes the JSON and prints a summary line per batch."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("auto", "siglip", "stand-in"), default="auto")
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"])
    parser.add_argument("--weight-precision", choices=("auto", "f16", "f8"), default="auto")
    parser.add_argument("--tiles", type=int, default=ipu21.TILES)
    parser.add_argument("--workdir", default=os.environ.get("TMPDIR", "/tmp") + "/siglip_so400m")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/siglip_so400m.json"))
    parser.add_argument("--no-simulate", action="store_true")
    args = parser.parse_args(argv)
    runs = []
    for batch in args.batch:
        rec = run_batch(args, batch)
        runs.append(rec)
        print(json.dumps({k: rec.get(k) for k in ("batch", "model", "cycles", "plan_error",
                                                    "siglip_error")}), flush=True)  # fmt: skip
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        report = {"config": {**CONFIG, "num_hidden_layers": args.layers}, "reference": REFERENCE,
                  "tiles": args.tiles, "runs": runs}  # fmt: skip
        Path(args.out).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

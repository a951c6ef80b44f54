"""SigLIP parts beside the reference's measured C600 numbers: build, simulate, check; JSON.

Usage: python benchmarks/siglip_parts.py [--out benchmarks/results/siglip_parts.json]
                                         [--only NAME ...] [--repeats N]

Every workload is built with the Python graph API at F16 on 1,472 tiles (GeLU is the exact,
erf form), simulated with random inputs (uniform(-1, 1), fixed seed; weights normal with
1/sqrt(fan-in) spread) and checked against the float64 NumPy reference. Cycles are simulated
(kernel cycles from the calibrated formulas of ``target/``, exchange as scheduled, 600 per
sync); the reference's figures are measured on a C600 (``shared/docs/anchors.md`` §0c).
Build and simulation wall times are medians over ``--repeats`` runs (the cycles and package
are deterministic, so repeats only re-measure time). Each exchange phase is compared with its
strongest lower bound (``exchange.bounds``; the preemptive bounds for a schedule in pieces).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ipu_stack.exchange.bounds import strongest_lower_bound
from ipu_stack.graph.compute_graph import ComputeGraph, Value, evaluate_reference
from ipu_stack.low.program import ComputeStep, ExchangeStep
from ipu_stack.mid.gemm_plan import GemmProblem, enumerate_plans
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.sim import SimDevice
from ipu_stack.target import ipu21

TILES = ipu21.TILES
PEAK_MACS = TILES * ipu21.precision("f16").amp_macs_per_cycle
TOLERANCE = 0.03  # max |error| <= 0.03 x max |reference| (F16)
HIDDEN, INTERMEDIATE, TOKENS, HEADS, HEAD_DIM = 1152, 4304, 729, 16, 72


def _linear(g: ComputeGraph, x: Value, fan_in: int, fan_out: int, name: str) -> Value:
    w = g.parameter(f"{name}.weight", (fan_in, fan_out), "f16")
    b = g.parameter(f"{name}.bias", (fan_out,), "f16")
    return g.add(g.gemm(x, w, name=name), b, name=f"{name}.bias_add")


def siglip_mlp(batch: int) -> ComputeGraph:
    """fc1 (1152 -> 4304) + bias, tanh GeLU, fc2 (4304 -> 1152) + bias (SigLIP's
    ``hidden_act`` is ``gelu_pytorch_tanh``, as in its exports)."""
    g = ComputeGraph()
    x = g.host_input("x", (batch, TOKENS, HIDDEN), "f16")
    h = g.gelu(_linear(g, x, HIDDEN, INTERMEDIATE, "fc1"), approximate="tanh")
    g.set_outputs(_linear(g, h, INTERMEDIATE, HIDDEN, "fc2"))
    return g


def single_gemm(m: int, k: int, n: int) -> ComputeGraph:
    """A host-input left operand times a parameter, no bias (the GEMM alone)."""
    g = ComputeGraph()
    x = g.host_input("x", (m, k), "f16")
    g.set_outputs(g.gemm(x, g.parameter("w", (k, n), "f16"), name="gemm"))
    return g


def attention() -> ComputeGraph:
    """softmax(q k^T / sqrt(72)) v over 16 heads of 729 queries and keys (host inputs)."""
    g = ComputeGraph()
    q, k, v = (g.host_input(n, (1, HEADS, TOKENS, HEAD_DIM), "f16") for n in "qkv")
    g.set_outputs(g.flash_attention(q, k, v, name="attention"))
    return g


def _layer_norm(g: ComputeGraph, x: Value, hidden: int, name: str) -> Value:
    w = g.parameter(f"{name}.w", (hidden,), "f16")
    return g.layer_norm(x, w, g.parameter(f"{name}.b", (hidden,), "f16"), 1e-6, name=name)


def siglip_encoder(layers: int = 2, tokens: int = 196, hidden: int = 768, heads: int = 12,
                   intermediate: int = 3072) -> ComputeGraph:  # fmt: skip
    """SiglipVisionConfig defaults at 224 px: pre-norm layers of LN, QKV, attention, output
    projection, residual, LN, tanh-GeLU MLP, residual."""
    g = ComputeGraph()
    x = g.host_input("x", (1, tokens, hidden), "f16")
    d = hidden // heads
    for i in range(layers):
        p = f"layer{i}"
        ln = _layer_norm(g, x, hidden, f"{p}.ln1")
        q, k, v = (_linear(g, ln, hidden, hidden, f"{p}.{n}_proj") for n in "qkv")
        split = [g.transpose(g.view(t, (1, tokens, heads, d)), (0, 2, 1, 3)) for t in (q, k, v)]
        ctx = g.flash_attention(*split, name=f"{p}.attention")
        ctx = g.view(g.transpose(ctx, (0, 2, 1, 3)), (1, tokens, hidden))
        x = g.add(x, _linear(g, ctx, hidden, hidden, f"{p}.o_proj"))
        ln2 = _layer_norm(g, x, hidden, f"{p}.ln2")
        h = g.gelu(_linear(g, ln2, hidden, intermediate, f"{p}.fc1"), approximate="tanh")
        x = g.add(x, _linear(g, h, intermediate, hidden, f"{p}.fc2"))
    g.set_outputs(x)
    return g


#: name -> (graph factory, reference cycles measured on a C600 or None, reference utilization)
WORKLOADS: dict[str, tuple[Callable[[], ComputeGraph], int | None, float | None]] = {
    "siglip_mlp_b1": (lambda: siglip_mlp(1), 176_706, None),
    "mlp_up_729x1152x4304": (lambda: single_gemm(TOKENS, HIDDEN, INTERMEDIATE), None, 0.667),
    "mlp_down_729x4304x1152": (lambda: single_gemm(TOKENS, INTERMEDIATE, HIDDEN), None, 0.741),
    "qkv_fused_729x1152x3456": (lambda: single_gemm(TOKENS, HIDDEN, 3 * HIDDEN), None, 0.841),
    "attention_b1_16x729x72": (attention, 216_444, None),
    "siglip_mlp_b4": (lambda: siglip_mlp(4), None, None),
    "siglip_encoder_2layers_224px": (siglip_encoder, None, None),
}


def _feeds(graph: ComputeGraph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for v in graph.values:
        if v.kind == "host_input":
            feeds[v.name] = rng.uniform(-1, 1, v.shape).astype(np.float16)
        elif v.kind == "parameter":
            spread = 1 / np.sqrt(v.shape[0]) if len(v.shape) == 2 else 0.1
            feeds[v.name] = rng.normal(0, spread, v.shape).astype(np.float16)
    return feeds


def _macs(graph: ComputeGraph) -> int:
    total = 0
    for op in graph.operations:
        if op.kind == "gemm":
            out = graph.value(op.output)
            k = graph.value(op.inputs[0]).shape[-2 if op.transpose_left else -1]
            total += int(np.prod(out.shape)) * k
        elif op.kind == "flash_attention":
            q, _, v = (graph.value(i).shape for i in op.inputs)
            tk = graph.value(op.inputs[1]).shape[-2]
            total += int(np.prod(q[:-1])) * tk * (q[-1] + v[-1])
    return total


def _exchange_phases(built) -> list[dict[str, object]]:
    rows = []
    for index, (phase, schedule) in sorted(built.schedules.items()):
        pieces = any(len(p) > 1 for p in schedule.pieces)
        bound, name = strongest_lower_bound(phase, preemptive=pieces)
        rows.append(
            {
                "step": index,
                "transfers": len(phase.transfers),
                "horizon": schedule.horizon,
                "strongest_lower_bound": bound,
                "tight_bound": name,
                "ratio": round(schedule.horizon / bound, 4) if bound else 1.0,
                "kind": schedule.kind,
            }
        )
    return rows


#: single-GEMM workloads: (M, K, N) of their plan space
GEMM_SHAPES = {
    "mlp_up_729x1152x4304": (TOKENS, HIDDEN, INTERMEDIATE),
    "mlp_down_729x4304x1152": (TOKENS, INTERMEDIATE, HIDDEN),
    "qkv_fused_729x1152x3456": (TOKENS, HIDDEN, 3 * HIDDEN),
}


def plan_space(m: int, k: int, n: int) -> dict[str, object]:
    """What the planner's model allows over every plan that fits (host-input left operand,
    parameter right, F16, 1,472 tiles): the best estimate, and the least kernel cycles and
    kernel plus reduction-add cycles of any plan, with their utilizations. The kernel terms
    are the calibrated formulas of ``target/``, which issue 16 keeps fixed."""
    problem = GemmProblem(1, m, k, n, ipu21.F16, "host_input", "parameter", True, False)
    plans = enumerate_plans(problem, ipu21.TILES, limit=10**7)
    ideal = m * k * n / PEAK_MACS
    kernel = min(p.kernel_cycles for p in plans)
    kernel_reduce = min(p.kernel_cycles + p.reduction_cycles + p.copy_cycles for p in plans)
    best = plans[0].estimated_cycles
    return {
        "feasible_plans": len(plans),
        "best_estimated_cycles": best,
        "best_estimated_utilization": round(ideal / best, 4),
        "least_kernel_cycles": kernel,
        "least_kernel_utilization": round(ideal / kernel, 4),
        "least_kernel_plus_reduction_cycles": kernel_reduce,
        "least_kernel_plus_reduction_utilization": round(ideal / kernel_reduce, 4),
    }


def run_workload(name: str, repeats: int) -> dict[str, object]:
    factory, ref_cycles, ref_util = WORKLOADS[name]
    build_seconds, sim_seconds = [], []
    for _ in range(repeats):
        graph = factory()
        gc.collect()
        start = time.perf_counter()
        built = build(graph, BuildConfig(compile_kernels=False))
        build_seconds.append(time.perf_counter() - start)
        feeds = _feeds(graph)
        run = SimDevice().run(built.program, built.placement, built.schedules, feeds)
        sim_seconds.append(run.seconds)
    reference = evaluate_reference(graph, feeds)
    error = 0.0
    for key, expected in reference.items():
        got = run.outputs[key].astype(np.float64)
        error = max(error, float(np.abs(got - expected).max() / np.abs(expected).max()))
    compute = sync = exchange = 0
    for step, cycles in zip(built.program.steps, run.step_cycles, strict=True):
        if isinstance(step, ComputeStep):
            compute += cycles
        elif isinstance(step, ExchangeStep):
            sync += min(cycles, ipu21.SYNC_CYCLES)
            exchange += max(0, cycles - ipu21.SYNC_CYCLES)
    macs = _macs(graph)
    phases = _exchange_phases(built)
    row: dict[str, object] = {
        "workload": name,
        "simulated_cycles": run.cycles,
        "estimated_cycles": built.program.estimated_cycles,
        "reference_measured_cycles": ref_cycles,
        "utilization": round(macs / (PEAK_MACS * run.cycles), 4),
        "reference_measured_utilization": ref_util,
        "simulated_breakdown": {"compute": compute, "exchange": exchange, "sync": sync},
        "plans": built.program.plans,
        "exchange_phases": phases,
        "worst_exchange_ratio": max((p["ratio"] for p in phases), default=1.0),
        "build_seconds_median": round(statistics.median(build_seconds), 2),
        "build_seconds": [round(s, 2) for s in build_seconds],
        "build_phases_ms": {p["name"]: p["elapsed_ms"] for p in built.trace.phases},
        "simulate_seconds_median": round(statistics.median(sim_seconds), 2),
        "simulate_seconds": [round(s, 2) for s in sim_seconds],
        "max_abs_error_over_max_reference": error,
        "passed": error <= TOLERANCE,
    }
    if name in GEMM_SHAPES:
        row["plan_space"] = plan_space(*GEMM_SHAPES[name])
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/siglip_parts.json")
    parser.add_argument("--only", action="append", choices=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    out = Path(args.out)
    previous = json.loads(out.read_text())["results"] if out.exists() else []
    rows = {r["workload"]: r for r in previous}
    meta = {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "load_average": os.getloadavg()}  # fmt: skip
    ordered: list[dict[str, object]] = []
    for name in args.only or list(WORKLOADS):
        row = run_workload(name, args.repeats)
        row["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        rows[name] = row
        brief = {k: v for k, v in row.items() if k not in ("plans", "exchange_phases")}
        print(json.dumps(brief), file=sys.stderr)
        ordered = [rows[n] for n in WORKLOADS if n in rows]
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")  # written after every workload, replaced atomically
        tmp.write_text(json.dumps({"meta": meta, "results": ordered}, indent=1) + "\n")
        tmp.replace(out)
    return 0 if all(r["passed"] for r in ordered) else 1


if __name__ == "__main__":
    sys.exit(main())

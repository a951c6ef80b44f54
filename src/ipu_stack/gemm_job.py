"""Compile one GEMM, run it on the simulator, and check it against NumPy (the CLI's `gemm`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ipu_stack.graph.compute_graph import ComputeGraph, evaluate_reference
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.sim import SimDevice
from ipu_stack.target import ipu21
from ipu_stack.trace import Trace

#: Pass thresholds: max |error| <= tolerance x max |reference|.
TOLERANCE = {"f16": 0.02, "f32": 1e-4}


@dataclass(frozen=True, slots=True)
class GemmJob:
    m: int
    k: int
    n: int
    batch: int | None = None
    precision: str = "f16"
    tiles: int = ipu21.TILES
    transpose_left: bool = False
    transpose_right: bool = False
    seed: int = 0
    left_shape: tuple[int, ...] | None = None  # overrides the shape derived from m, k, batch
    right_shape: tuple[int, ...] | None = None


def gemm_graph(job: GemmJob) -> ComputeGraph:
    """Host input ``left`` ([batch,] M, K) times parameter ``right`` (K, N)."""
    ipu21.precision(job.precision)
    g = ComputeGraph()
    lead = (job.batch,) if job.batch is not None else ()
    left_shape = (*lead, job.k, job.m) if job.transpose_left else (*lead, job.m, job.k)
    right_shape = (job.n, job.k) if job.transpose_right else (job.k, job.n)
    left = g.host_input("left", job.left_shape or left_shape, job.precision)
    right = g.parameter("right", job.right_shape or right_shape, job.precision)
    g.set_outputs(g.gemm(left, right, job.transpose_left, job.transpose_right, name="gemm"))
    return g


def run_gemm(
    job: GemmJob, trace: Trace | None = None, exchange_snapshot: str | None = None
) -> dict[str, Any]:
    """Build, simulate and check one GEMM; returns the report the CLI prints.

    ``exchange_snapshot``: if given, every exchange phase of the build is written there in the
    snapshot format of :mod:`ipu_stack.exchange.snapshot`.
    """
    trace = trace or Trace()
    graph = gemm_graph(job)
    t0 = time.perf_counter()
    built = build(graph, BuildConfig(tiles=job.tiles), trace)
    plan_seconds = time.perf_counter() - t0
    if exchange_snapshot is not None:
        from ipu_stack.exchange.snapshot import write_snapshot

        phases = [(index, phase) for index, (phase, _) in sorted(built.schedules.items())]
        write_snapshot(exchange_snapshot, phases, ipu21.TILES)
    rng = np.random.default_rng(job.seed)
    dtype = np.dtype(ipu21.precision(job.precision).numpy_name)
    feeds = {
        v.name: rng.uniform(-1.0, 1.0, v.shape).astype(dtype)
        for v in graph.values
        if v.kind != "operation"
    }
    result = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    reference = evaluate_reference(graph, feeds)["gemm.out"]
    output = result.outputs["gemm.out"].astype(np.float64)
    max_abs_error = float(np.abs(output - reference).max())
    max_abs_reference = float(np.abs(reference).max())
    k = graph.value(0).shape[-2 if job.transpose_left else -1]
    macs = int(np.prod(reference.shape, dtype=np.int64)) * k
    peak = ipu21.TILES * ipu21.precision(job.precision).amp_macs_per_cycle
    plan = built.program.plans["gemm"]
    passed = max_abs_error <= TOLERANCE[job.precision] * max(max_abs_reference, 1e-30)
    return {
        "shape": {
            "left": list(graph.value(0).shape),
            "right": list(graph.value(1).shape),
            "output": list(reference.shape),
        },
        "precision": job.precision,
        "plan": plan,
        "estimated_cycles": built.program.estimated_cycles,
        "simulated_cycles": result.cycles,
        "simulated_seconds_at_clock": result.cycles / ipu21.CLOCK_HZ,
        "utilization": macs / (peak * result.cycles),
        "max_abs_error": max_abs_error,
        "max_abs_reference": max_abs_reference,
        "relative_error": max_abs_error / max(max_abs_reference, 1e-30),
        "tolerance": TOLERANCE[job.precision],
        "passed": bool(passed),
        "phases": built.trace.phases,
        "memory": built.placement.peaks,
        "plan_seconds": plan_seconds,
        "simulate_seconds": result.seconds,
    }

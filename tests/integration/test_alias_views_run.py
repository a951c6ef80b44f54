"""Exporter-style attention (heads split by reshape + transpose, merged back the same way)
moves no data for its reshapes and last-axis-keeping transposes, and still computes the
right values (simulated, compared with the NumPy reference)."""

from __future__ import annotations

import numpy as np

from conftest import random_feeds
from ipu_stack.graph import ComputeGraph
from ipu_stack.graph.compute_graph import evaluate_reference
from ipu_stack.low.program import ExchangeStep
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.sim import SimDevice

T, H, D = 48, 4, 16


def _attention() -> tuple[ComputeGraph, str]:
    g = ComputeGraph()
    x = g.host_input("x", (T, H * D), "f16")

    def project(i: int) -> object:
        y = g.gemm(x, g.parameter(f"w{i}", (H * D, H * D), "f16"), name=f"proj{i}")
        return g.view(y, (1, T, H, D), name=f"split{i}")

    q = g.transpose(project(0), (0, 2, 1, 3), name="q_heads")
    kt = g.transpose(project(1), (0, 2, 3, 1), name="k_heads_t")
    v = g.transpose(project(2), (0, 2, 1, 3), name="v_heads")
    p = g.softmax(g.gemm(q, kt, name="scores"), name="probs")
    o = g.transpose(g.gemm(p, v, name="mixed"), (0, 2, 1, 3), name="merge_heads")
    merged = g.view(o, (T, H * D), name="merged")
    g.set_outputs(merged)
    return g, merged.name


def test_views_rename_bytes_and_the_result_matches_numpy():
    g, out = _attention()
    built = build(g, BuildConfig(tiles=64, finalists=1))
    labels = [s.label for s in built.program.steps if isinstance(s, ExchangeStep)]
    moved = [x for x in labels if x.split()[0] in ("split0", "split2", "q_heads", "v_heads",
                                                    "merge_heads", "merged")]  # fmt: skip
    assert moved == [], labels
    feeds = random_feeds(g)
    run = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    want = evaluate_reference(g, feeds)[out]
    got = run.outputs[out].astype(np.float64)
    error = np.abs(got - want).max() / np.abs(want).max()
    assert error < 0.01, error

"""GEMMs that share a left operand produced on chip read the blocks the first one delivered
(``lower_gemm``'s ``delivered``): the Q, K and V projections of one layer-norm output pay one
operand exchange, not three, and still compute the right values."""

from __future__ import annotations

import numpy as np

from conftest import random_feeds
from ipu_stack.graph import ComputeGraph
from ipu_stack.graph.compute_graph import evaluate_reference
from ipu_stack.low.program import ExchangeStep, GemmCall
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.sim import SimDevice


def _qkv(n_out: int = 3) -> tuple[ComputeGraph, list[str]]:
    g = ComputeGraph()
    x = g.host_input("x", (96, 128), "f16")
    h = g.layer_norm(x, g.parameter("s", (128,), "f16"), g.parameter("b", (128,), "f16"))
    outs = [g.gemm(h, g.parameter(f"w{i}", (128, 64), "f16"), name=f"proj{i}")
            for i in range(n_out)]  # fmt: skip
    g.set_outputs(*outs)
    return g, [v.name for v in outs]


def test_projections_of_one_operand_share_its_delivery_and_match_numpy():
    g, names = _qkv()
    built = build(g, BuildConfig(tiles=32, finalists=1))
    program = built.program
    plans = {name: p["grid"] for name, p in program.plans.items()}
    assert len({str(p) for p in plans.values()}) == 1, plans  # one plan, so one delivery
    labels = [s.label for s in program.steps if isinstance(s, ExchangeStep)]
    merged = "proj0 operands step 0 (with 2 more gemms)"  # one phase for all three
    assert [x for x in labels if "operands" in x] == [merged], labels
    lefts = {c.left.buffer for s in program.steps for c in getattr(s, "calls", ())
             if isinstance(c, GemmCall)}  # fmt: skip
    assert lefts == {"proj0.left"}
    feeds = random_feeds(g)
    run = SimDevice().run(program, built.placement, built.schedules, feeds)
    want = evaluate_reference(g, feeds)
    for name in names:
        got = run.outputs[name].astype(np.float64)
        error = np.abs(got - want[name]).max() / np.abs(want[name]).max()
        assert error < 0.01, (name, error)

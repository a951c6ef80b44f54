"""The simulator's batched elementwise / row-wise calls give the bits of one call at a time."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.graph.compute_graph import ComputeGraph, evaluate_reference
from ipu_stack.low.program import AddCall, MapCall, Ref, View
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime import sim


def _graph() -> ComputeGraph:
    g = ComputeGraph()
    x = g.host_input("x", (96, 64), "f16")
    w = g.parameter("w", (64, 128), "f16")
    h = g.gelu(g.add(g.gemm(x, w, name="mm"), g.parameter("b", (128,), "f16")))
    n = g.layer_norm(h, g.parameter("s", (128,), "f16"), g.parameter("t", (128,), "f16"))
    g.set_outputs(g.mul(g.softmax(n), g.host_input("m", (96, 128), "f16"), name="y"))
    return g


def _run(built, feeds):
    return sim.SimDevice().run(built.program, built.placement, built.schedules, feeds)


def test_batched_map_calls_are_bit_identical_to_single_calls(monkeypatch):
    g = _graph()
    built = build(g, BuildConfig(tiles=16, compile_kernels=False))
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.uniform(-1, 1, v.shape).astype(np.float16) for v in g.values
             if v.kind != "operation"}  # fmt: skip
    runs = [[c for c in s.calls if isinstance(c, MapCall)] for s in built.program.steps
            if hasattr(s, "calls")]  # fmt: skip
    groups = [group for run in runs for group in sim.map_call_groups(run)]
    assert max(len(group) for group in groups) > 1  # something is batched
    batched = _run(built, feeds)
    monkeypatch.setattr(sim, "map_call_groups", lambda calls: [[c] for c in calls])
    single = _run(built, feeds)
    for name, out in batched.outputs.items():
        np.testing.assert_array_equal(out.view(np.uint16), single.outputs[name].view(np.uint16))
    assert batched.cycles == single.cycles
    reference = evaluate_reference(g, feeds)["y.out"]
    error = np.abs(batched.outputs["y.out"].astype(np.float64) - reference).max()
    assert error <= 0.03 * np.abs(reference).max()


def test_groups_keep_each_tiles_calls_in_order():
    def call(tile, kind):
        view = View(Ref("b", 0), 2, 8, 16, "f16")
        return MapCall(tile, kind, view, (view,), ())

    calls = [call(0, "gelu"), call(0, "gelu"), call(1, "gelu"), call(1, "softmax")]
    groups = sim.map_call_groups(calls)
    order = [c for group in groups for c in group]
    for tile in (0, 1):
        mine = [c for c in calls if c.tile == tile]
        assert [c for c in order if c.tile == tile] == mine
    assert all(len({c.tile for c in group}) == len(group) for group in groups)


@pytest.mark.parametrize("special", [False, True])
def test_tables_and_batched_adds_give_the_bits_of_evaluation_call_by_call(monkeypatch, special):
    # GeLU by table (runtime/map_tables.py), bias adds with exact conversions
    # (runtime/map_f16.py) and add calls batched across tiles, against map_semantics
    # evaluated per call and add calls run one by one (_simple)
    g = ComputeGraph()
    x = g.host_input("x", (96, 256), "f16")
    w = g.parameter("w", (256, 128), "f16")
    h = g.gelu(g.add(g.gemm(x, w, name="mm"), g.parameter("b", (128,), "f16")), name="y")
    g.set_outputs(h)
    built = build(g, BuildConfig(tiles=64, compile_kernels=False))
    assert any(isinstance(c, AddCall) for s in built.program.steps for c in getattr(s, "calls", []))
    rng = np.random.default_rng(1)
    feeds = {v.name: (rng.standard_normal(v.shape) * 2).astype(np.float16) for v in g.values
             if v.kind != "operation"}  # fmt: skip
    feeds["b"].reshape(-1)[:3] = [6e-8, -0.0, -6e-8]
    if special:
        feeds["x"].reshape(-1)[:6] = [np.inf, -np.inf, np.nan, 6e-8, -0.0, 65504]
    fast = _run(built, feeds)
    monkeypatch.setattr(sim, "by_table", lambda call: False)
    monkeypatch.setattr(sim, "binary_f16", lambda call: False)
    monkeypatch.setattr(sim, "map_call_groups", lambda calls: [[c] for c in calls])
    original_compute = sim.SimDevice._compute

    def one_by_one(self, mem, placement, calls, step, clock):
        for call in calls:  # every call alone: add calls through _simple
            if isinstance(call, AddCall):
                clock[call.tile] += sim.call_cycles(call)
                self._simple(mem, placement, call, step)
            else:
                original_compute(self, mem, placement, [call], step, clock)

    monkeypatch.setattr(sim.SimDevice, "_compute", one_by_one)
    slow = _run(built, feeds)
    for name, out in fast.outputs.items():
        np.testing.assert_array_equal(out.view(np.uint16), slow.outputs[name].view(np.uint16))
    assert fast.cycles == slow.cycles

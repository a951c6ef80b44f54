"""The planner's tile-0 model: every operation's tiles start at tile 0, so its per-tile
host-written block (GEMM weight blocks, parameters staged beside row layouts) stacks there.
Checked against an independent count of the lowered program's host-written buffers."""

from __future__ import annotations

from collections import defaultdict

import pytest

from ipu_stack.errors import PlanError
from ipu_stack.graph.compute_graph import ComputeGraph
from ipu_stack.low.lower import lower_program
from ipu_stack.low.program import LowProgram
from ipu_stack.mid.beam import beam_search
from ipu_stack.mid.lower_mid import lower_mid
from ipu_stack.place import balance
from ipu_stack.place.sram import Region, usable_bytes
from ipu_stack.trace import Trace

TILES = 64


def _tile0_written(program: LowProgram) -> int:
    """Independent of the planner and of place/balance.py: host-written bytes on tile 0."""
    per_tile: dict[int, int] = defaultdict(int)
    for buf in program.buffers:
        if buf.host_written:
            per_tile[buf.tile] += buf.size
    return per_tile[0]


def _norms(count: int, width: int, rows: int = 16) -> ComputeGraph:
    """``count`` layer norms in a row: ``rows`` rows use 16 of the 64 tiles, and each of those
    tiles holds every norm's scale and bias (2 x width x 4 bytes)."""
    g = ComputeGraph()
    h = g.host_input("x", (rows, width), "f32")
    for i in range(count):
        scale = g.parameter(f"g{i}", (width,), "f32")
        bias = g.parameter(f"b{i}", (width,), "f32")
        h = g.layer_norm(h, scale, bias, 1e-5, name=f"ln{i}")
    g.set_outputs(h)
    return g


def _mixed() -> ComputeGraph:
    """Norms, GEMMs on part of the machine and a bias add: blocks of different tile ranges."""
    g = ComputeGraph()
    x = g.host_input("x", (16, 256), "f32")
    h = g.layer_norm(x, g.parameter("g0", (256,), "f32"), g.parameter("b0", (256,), "f32"),
                     1e-5, name="ln0")  # fmt: skip
    h = g.gemm(h, g.parameter("w0", (256, 512), "f32"), name="mm0")
    h = g.add(h, g.parameter("c0", (512,), "f32"), name="bias0")
    h = g.gemm(h, g.parameter("w1", (512, 256), "f32"), name="mm1")
    h = g.layer_norm(h, g.parameter("g1", (256,), "f32"), g.parameter("b1", (256,), "f32"),
                     1e-5, name="ln1")  # fmt: skip
    g.set_outputs(h)
    return g


def _lowered(graph: ComputeGraph, finalist) -> LowProgram:
    plans = {op.id: finalist.gemm_plans[op.name] for op in graph.operations if op.kind == "gemm"}
    offsets, _ = balance.tile_offsets(graph, finalist.gemm_plans, TILES, finalist.bodies)
    assert offsets == {}  # small weights: nothing rotated, every range starts at tile 0
    return lower_program(graph, plans, TILES, finalist.row_tiles, offsets, finalist.bodies)


@pytest.mark.parametrize("make", [lambda: _norms(3, 512), _mixed])
def test_planner_tile0_figure_is_what_lowering_writes_there(make):
    graph = make()
    for finalist in lower_mid(graph, TILES, 2):
        program = _lowered(graph, finalist)
        # the host input's home (one row per tile here) is the only other host write
        home = 256 * 4 if "mm0" in finalist.gemm_plans else 512 * 4
        assert _tile0_written(program) == finalist.branch.stacked + home
        assert finalist.branch.stacked > finalist.branch.resident_total // TILES  # not spread


def test_spread_model_accepted_a_plan_tile_0_cannot_hold():
    # 17 norms x 2 x 16 KiB staged on each of their 16 tiles: 557,056 B on tile 0, more than
    # its data memory; spread over 64 tiles (the old model) it looked like a quarter of that.
    graph = _norms(17, 4096)
    problems: dict = {}
    with pytest.raises(PlanError, match="total on tile 0"):
        beam_search(graph, TILES, problems)
    relaxed = beam_search(graph, TILES, problems, stack_tile0=False)  # the old model
    assert relaxed[0].stacked > usable_bytes(Region.ANY)
    trace = Trace(quiet=True)
    (finalist, *_) = lower_mid(graph, TILES, 1, trace=trace)  # falls back, says so
    assert any(e["event"] == "planned without tile-0 stacking" for e in trace.events)
    program = _lowered(graph, finalist)
    assert _tile0_written(program) > usable_bytes(Region.ANY)  # what the old plan did
    with pytest.raises(PlanError, match="rejected before placement: tile 0"):
        balance.check_resident(program, 0)
    # 12 norms (393,216 B) fit on tile 0: planned under the strict model, no fallback
    trace = Trace(quiet=True)
    (finalist, *_) = lower_mid(_norms(12, 4096), TILES, 1, trace=trace)
    assert not any(e["event"] == "planned without tile-0 stacking" for e in trace.events)
    program = _lowered(_norms(12, 4096), finalist)
    assert _tile0_written(program) <= usable_bytes(Region.ANY)

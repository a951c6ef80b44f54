"""The fast per-class touch functions and address tables of placement against plain references."""

from __future__ import annotations

import dataclasses

import pytest

from ipu_stack.graph.compute_graph import ComputeGraph
from ipu_stack.low.lower import lower_program
from ipu_stack.low.program import (
    AddCall,
    ComputeStep,
    CopyCall,
    ExchangeStep,
    GemmCall,
    Ref,
    View,
)
from ipu_stack.mid.lower_mid import lower_mid
from ipu_stack.place import assign
from ipu_stack.target.ipu21 import precision


@pytest.fixture(scope="module")
def program():
    g = ComputeGraph()
    x = g.host_input("x", (64, 256), "f16")
    h = g.gelu(g.gemm(x, g.parameter("w1", (256, 512), "f16"), name="up"))
    y = g.gemm(h, g.parameter("w2", (512, 256), "f16"), name="down")
    g.set_outputs(g.softmax(g.add(y, x)))
    best = lower_mid(g, 32)[0]
    plans = {op.id: best.gemm_plans[op.name] for op in g.operations if op.kind == "gemm"}
    return lower_program(g, plans, 32, best.row_tiles)


def _reference_touches(step: ComputeStep) -> dict[tuple[int, str], bool]:
    """Every ref in a call's fields, found by walking them; ``out``/``dst`` are written only
    (read too when the call accumulates), everything else is read. Each key records whether
    the first call that touches it reads it (a call reads before it writes)."""
    touched: dict[tuple[int, str], bool] = {}
    for call in step.calls:
        accumulates = isinstance(call, AddCall) or (isinstance(call, GemmCall) and call.accumulate)
        this_call: dict[tuple[int, str], bool] = {}
        for f in dataclasses.fields(call):
            value = getattr(call, f.name)
            items = value if isinstance(value, tuple) and not isinstance(value, Ref) else (value,)
            for item in items:
                ref = item.ref if isinstance(item, View) else item
                if not isinstance(ref, Ref):
                    continue
                key = (call.tile, ref.buffer)
                read = f.name not in ("out", "dst") or accumulates
                this_call[key] = this_call.get(key, False) or read
        for key, read in this_call.items():
            touched.setdefault(key, read)
    return touched


def test_compute_touches_match_a_field_walk(program):
    steps = [s for s in program.steps if isinstance(s, ComputeStep)]
    assert steps
    for step in steps:
        fast = assign._compute_touches(step)
        assert fast == _reference_touches(step)
        assert list(fast) == list(_reference_touches(step))  # first-seen order too


def test_a_wrong_touch_function_is_caught(program, monkeypatch):
    # Mutation: gemm outputs counted as read even when not accumulating.
    def wrong(call, touched):
        touched[(call.tile, call.out[0])] = True
        touched[(call.tile, call.left[0])] = True
        touched[(call.tile, call.right[0])] = True

    monkeypatch.setitem(assign._TOUCH, GemmCall, wrong)
    steps = [s for s in program.steps if isinstance(s, ComputeStep)]
    assert any(assign._compute_touches(s) != _reference_touches(s) for s in steps)


def test_a_buffer_written_then_read_in_one_step_is_written_first():
    # a gemm writes ``o``, then a copy in the same step reads it: ``o`` is written first (in
    # a loop body it then lives from that step, not for the whole body); ``a`` is read first
    # although the step's last call overwrites it
    a, b, o, d = (Ref(n, 0) for n in ("a", "b", "o", "d"))
    step = ComputeStep(
        [
            GemmCall(0, o, a, b, 4, 16, 16, precision("f16"), False, "interleaved"),
            CopyCall(0, d, o, 64),
            CopyCall(0, a, d, 64),
        ]
    )
    touched = assign._compute_touches(step)
    assert touched == _reference_touches(step)
    assert touched == {(0, "o"): False, (0, "a"): True, (0, "b"): True, (0, "d"): False}


def test_physical_phase_addresses_match_the_allocations(program):
    placement = assign.place_program(program)
    phys = placement.physical.tolist()
    steps = [s for s in program.steps if isinstance(s, ExchangeStep)]
    assert steps
    for step in steps:
        phase = assign.physical_phase(step, placement)
        for logical, physical in zip(step.transfers, phase.transfers, strict=True):
            assert physical.source == phys[logical.source_tile]
            assert physical.source_address == placement.address(logical.source_tile, logical.source)
            assert physical.destinations == tuple(
                (phys[t], placement.address(t, r)) for t, r in logical.destinations
            )
    # The address table follows a replaced allocation list (no stale cache).
    placement.allocations = [dict(a) for a in placement.allocations]
    tile, name = 0, next(iter(placement.allocations[0]))
    old = placement.allocations[tile][name]
    placement.allocations[tile][name] = dataclasses.replace(old, address=old.address + 64)
    assert placement.addresses()[tile][name] == old.address + 64

import dataclasses

import pytest

from ipu_stack.errors import PlanError
from ipu_stack.mid.gemm_plan import (
    INTERLEAVED_DATA_BYTES,
    STANDARD_DATA_BYTES,
    GemmProblem,
    enumerate_plans,
)
from ipu_stack.target.ipu21 import F8, F16, F32


def problem(m, k, n, batch=1, precision=F16, left="host_input", right="parameter"):
    return GemmProblem(batch, m, k, n, precision, left, right, True, batch == 1)


@pytest.mark.parametrize("shape", [(1, 1, 1), (17, 33, 65), (1024, 1024, 1024), (131072, 64, 64)])
def test_plans_cover_the_problem_and_fit(shape):
    m, k, n = shape
    plans = enumerate_plans(problem(m, k, n), 1472)
    assert plans
    costs = [p.estimated_cycles for p in plans]
    assert costs == sorted(costs)
    for p in plans:
        assert p.tiles <= 1472
        assert p.row_parts * p.row_block >= m
        assert p.col_parts * p.col_block >= n and p.col_block % 16 == 0
        assert p.k_parts * p.k_block >= k and p.k_block % 16 == 0
        assert p.peak_bytes <= STANDARD_DATA_BYTES + INTERLEAVED_DATA_BYTES
        assert p.interleaved_bytes <= INTERLEAVED_DATA_BYTES


def test_large_gemm_needs_serial_k_steps_and_an_exchanged_operand():
    """4096^3 in F16: neither operand fits every tile whole, so K runs in serial steps and an
    operand is split over the tiles that share it (the left one, among whole pairs, since
    paired moves; the weights before)."""
    best = enumerate_plans(problem(4096, 4096, 4096), 1472)[0]
    assert best.k_steps > 1
    assert "distributed" in (best.left_mode, best.right_mode)


def test_fewer_tiles_never_make_a_plan_cheaper():
    full = enumerate_plans(problem(2048, 512, 512), 1472)[0].estimated_cycles
    small = enumerate_plans(problem(2048, 512, 512), 64)[0].estimated_cycles
    assert small > full


def test_f32_costs_more_than_f16():
    f16 = enumerate_plans(problem(1024, 1024, 1024), 1472)[0].estimated_cycles
    f32 = enumerate_plans(problem(1024, 1024, 1024, precision=F32), 1472)[0].estimated_cycles
    assert f32 > f16


def test_no_fit_names_the_shortfall():
    with pytest.raises(PlanError, match=r"does not fit in tile memory on 1 tiles: .* more than"):
        enumerate_plans(problem(4096, 4096, 4096), 1)


def test_parameters_cost_no_exchange_when_resident():
    best = enumerate_plans(problem(64, 64, 64, left="parameter", right="parameter"), 1472)[0]
    assert best.operand_exchange_cycles == 0


def test_lean_plans_run_along_the_cycles_memory_frontier():
    # the So400m MLP down-projection's shape at batch 2, in a loop body, scaled down
    p = dataclasses.replace(problem(364, 1076, 288, left="operation"), precision=F8, in_loop=True)
    every = enumerate_plans(p, 368, 1 << 20)
    lean = enumerate_plans(p, 368, 8, lean=True)
    assert 2 <= len(lean) <= 8
    memory = [q.peak_bytes + q.resident_bytes for q in lean]
    cycles = [q.estimated_cycles for q in lean]
    assert cycles == sorted(cycles) and memory == sorted(memory, reverse=True)
    assert len(set(memory)) == len(memory)  # each leaner than the one before
    # from the cheapest plan to the leanest of all
    assert cycles[0] == every[0].estimated_cycles
    assert memory[-1] == min(q.peak_bytes + q.resident_bytes for q in every)
    # nothing cheaper is as lean as any of them
    for q, mem in zip(lean, memory, strict=True):
        assert not any(
            r.estimated_cycles < q.estimated_cycles and r.peak_bytes + r.resident_bytes <= mem
            for r in every
        )
    # and leaner than the cheapest plans a GEMM is otherwise offered
    assert memory[-1] < min(q.peak_bytes + q.resident_bytes for q in every[:256])


def test_loop_body_gemms_are_offered_the_frontier():
    from ipu_stack.graph.compute_graph import ComputeGraph
    from ipu_stack.mid.candidates.gemm import gemm_candidates

    g = ComputeGraph()
    x = g.host_input("x", (364, 1076), "f16")
    w = g.parameter("w", (1076, 288), "f16")
    y = g.gemm(x, w, name="down")
    g.set_outputs(y)
    op = next(o for o in g.operations if o.name == "down")
    base = problem(364, 1076, 288)
    leanest = enumerate_plans(dataclasses.replace(base, in_loop=True), 368, 8, lean=True)[-1]
    looped = dataclasses.replace(base, in_loop=True)
    outside = gemm_candidates(g, op, base, 368, 0.95)
    first = gemm_candidates(g, op, looped, 368)  # full capacity: the usual candidates
    retry = gemm_candidates(g, op, looped, 368, 0.95)
    assert leanest not in [c.choice for c in outside + first]
    lean_retry = enumerate_plans(looped, 368, 8, 0.95, lean=True)[-1]
    assert lean_retry in [c.choice for c in retry]


def test_a_moved_left_block_is_costed_unpaired():
    # Costed paired where its tiles sit in whole pairs, the tower's planner chose plans whose
    # pieces did not pair (9,006,388 -> 9,174,128 simulated cycles): a moved block costs its
    # words at one word per cycle, whatever the column count.
    plans = enumerate_plans(problem(729, 4304, 1152, left="operation"), 1472, 1 << 20)
    moved = [q for q in plans if q.left_mode == "moved" and q.right_mode == "resident"]
    assert {q.col_parts % 2 for q in moved} == {0, 1}
    for q in moved:
        words = q.row_block * q.k_step * 2 // 4
        assert q.operand_exchange_cycles == words * q.k_steps

import pytest

from ipu_stack.errors import PlanError
from ipu_stack.mid.gemm_plan import (
    INTERLEAVED_DATA_BYTES,
    STANDARD_DATA_BYTES,
    GemmProblem,
    enumerate_plans,
)
from ipu_stack.target.ipu21 import F16, F32


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


def test_large_gemm_needs_serial_k_steps_and_distributed_weights():
    best = enumerate_plans(problem(4096, 4096, 4096), 1472)[0]
    assert best.k_steps > 1
    assert best.right_mode == "distributed"


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

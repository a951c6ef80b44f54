"""The kernel cycle model against every measured validation point (facts §13.3)."""

import pytest

from ipu_stack.target.gemm_cycles import (
    MEASURED_POINTS,
    gemm_kernel_cycles,
    packed_gemm_kernel_cycles,
)
from ipu_stack.target.ipu21 import F16, F32

VALIDATION_POINTS = MEASURED_POINTS  # facts §13.3, kept in target/


@pytest.mark.parametrize("kernel,rows,k,c,weights,measured", VALIDATION_POINTS)
def test_cycle_model_matches_measured_point(kernel, rows, k, c, weights, measured):
    model = gemm_kernel_cycles if kernel == "interleaved" else packed_gemm_kernel_cycles
    predicted = model(rows, k, c, F16, weights)
    error = (predicted - measured) / measured
    print(
        f"{kernel} rows={rows} K={k} C={c} {weights}: model {predicted} "
        f"measured {measured} error {error:+.2%}"
    )
    assert abs(error) <= 0.02


def test_standard_weights_cost_more_than_interleaved():
    assert gemm_kernel_cycles(64, 64, 64, F16, "standard") > gemm_kernel_cycles(64, 64, 64, F16)


def test_f32_runs_at_a_quarter_of_the_f16_amp_rate():
    f16 = gemm_kernel_cycles(1024, 256, 256, F16) - 294
    f32 = gemm_kernel_cycles(1024, 256, 256, F32) - 294
    # Row terms dominate at 1024 rows: F32 moves 16 MAC/cycle against 64.
    assert 3.5 < f32 / f16 < 4.1


def test_zero_extent_costs_nothing():
    assert gemm_kernel_cycles(0, 64, 64) == 0

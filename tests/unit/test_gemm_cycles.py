"""The kernel cycle model against every measured validation point (facts §13.3)."""

import pytest

from ipu_stack.target.gemm_cycles import gemm_kernel_cycles, packed_gemm_kernel_cycles
from ipu_stack.target.ipu21 import F16, F32

# (kernel, rows, K, C, weights, measured cycles) from ipu21-facts.md §13.3
VALIDATION_POINTS = [
    ("interleaved", 244, 64, 64, "interleaved", 18_576),
    ("interleaved", 82, 96, 160, "interleaved", 29_508),
    ("interleaved", 122, 80, 128, "interleaved", 26_232),
    ("interleaved", 81, 80, 80, "interleaved", 12_402),
    ("interleaved", 146, 48, 48, "interleaved", 7_122),
    ("interleaved", 56, 64, 80, "interleaved", 8_076),
    ("packed", 48, 240, 64, "standard", 35_022),
    ("packed", 48, 240, 64, "interleaved", 33_102),
    ("packed", 96, 64, 64, "interleaved", 12_108),
    ("packed", 128, 64, 64, "interleaved", 19_872),
]


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

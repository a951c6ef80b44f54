"""The vectorised F16/F8 AMP GEMM semantics against the per-panel loop they replaced."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.kernels import semantics


def _panel_loop(lefts, rights, outs, accumulate, k_micro, scale_exponent=0):
    """The former definition: one matmul per K panel, the partial rounded to f16 after each."""
    k = lefts.shape[-1]
    left32, right32 = lefts.astype(np.float32), rights.astype(np.float32)
    result = outs.astype(np.float16) if accumulate else np.zeros(outs.shape, np.float16)
    acc32 = result.astype(np.float32)
    panel = np.empty_like(acc32)
    for p in range(0, k, k_micro):
        np.matmul(left32[:, :, p : p + k_micro], right32[:, p : p + k_micro, :], out=panel)
        if scale_exponent:
            panel *= np.float32(2.0**scale_exponent)
        with np.errstate(over="ignore"):
            acc32 += panel
            result[...] = acc32
        acc32[...] = result
    return result


CASES = [  # n, rows, k, c, operand scale
    (3, 81, 192, 160, 1.0),
    (5, 7, 40, 16, 1.0),  # K not a multiple of 16: a short last panel
    (2, 122, 160, 128, 1e-4),  # partials in the f16 subnormal range
    (1, 1, 16, 16, 1.0),
    (4, 33, 1, 48, 1.0),
    (3, 20, 64, 32, 3000.0),  # partials overflow to inf
    (40, 9, 48, 16, 1e-3),  # several cache blocks
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_vectorised_f16_gemm_is_bit_identical_to_the_panel_loop(case, accumulate):
    n, rows, k, c, scale = case
    rng = np.random.default_rng(rows * 7 + k)
    lefts = (rng.standard_normal((n, rows, k)) * scale).astype(np.float16)
    rights = rng.standard_normal((n, k, c)).astype(np.float16)
    outs = (rng.standard_normal((n, rows, c)) * scale).astype(np.float16)
    expected = _panel_loop(lefts, rights, outs, accumulate, 16)
    got = semantics.gemm_f16(lefts, rights, outs, accumulate)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


def test_vectorised_f8_gemm_is_bit_identical_to_the_panel_loop():
    rng = np.random.default_rng(3)
    lefts = semantics.encode_f143(rng.standard_normal((6, 17, 96)) * 4, 0)
    rights = semantics.encode_f143(rng.standard_normal((6, 96, 32)) * 4, 0)
    outs = rng.standard_normal((6, 17, 32)).astype(np.float16)
    for accumulate in (False, True):
        expected = _panel_loop(lefts, rights, outs, accumulate, 32, scale_exponent=-3)
        got = semantics.gemm_f8(lefts, rights, outs, accumulate, scale_exponent=-3)
        np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


def test_the_comparison_sees_rounding_once_per_panel():
    # A mutation (rounding to f16 only at the end) gives other bits on these inputs, so the
    # bit-identity tests above can fail.
    rng = np.random.default_rng(5)
    lefts = rng.standard_normal((2, 30, 256)).astype(np.float16)
    rights = rng.standard_normal((2, 256, 48)).astype(np.float16)
    outs = np.zeros((2, 30, 48), np.float16)
    once = np.matmul(lefts.astype(np.float32), rights.astype(np.float32)).astype(np.float16)
    got = semantics.gemm_f16(lefts, rights, outs, False)
    assert not np.array_equal(got.view(np.uint16), once.view(np.uint16))


def test_round_to_f16_matches_numpy_conversion_on_special_values():
    rng = np.random.default_rng(0)
    scales = (1e-8, 1e-6, 6e-5, 1e-3, 1.0, 100.0, 3e4)
    values = np.concatenate([rng.standard_normal(4096) * s for s in scales]).astype(np.float32)
    special = [0.0, -0.0, 65504, 65519, -65519, 65520, -70000, 6.1e-5, 5.96e-8, -2.98e-8]
    values = np.concatenate([values, np.array([*special, np.inf, -np.inf], np.float32)])
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16).astype(np.float32)
    got = values.copy()
    sign, magic = np.empty(got.shape, np.uint32), np.empty(got.shape, np.float32)
    semantics._round_to_f16(got, sign, magic, overflow=True)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_several_cache_blocks_give_the_panel_loop_bits():
    # 9 GEMMs of 100 x 160 partials: 4 per cache block, so 3 blocks (buffers reused)
    rng = np.random.default_rng(11)
    lefts = rng.standard_normal((9, 100, 64)).astype(np.float16)
    rights = rng.standard_normal((9, 64, 160)).astype(np.float16)
    outs = rng.standard_normal((9, 100, 160)).astype(np.float16)
    for accumulate in (False, True):
        expected = _panel_loop(lefts, rights, outs, accumulate, 16)
        got = semantics.gemm_f16(lefts, rights, outs, accumulate)
        np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


def test_abs_max_on_f16_bits_is_the_f32_maximum():
    rng = np.random.default_rng(4)
    values = (rng.standard_normal(1000) * 100).astype(np.float16)
    for special in ([], [np.inf], [-np.inf], [np.nan], [-np.nan, 3.0], [-0.0], [6.0e-8]):
        x = np.concatenate([values, np.array(special, np.float16)])
        want = float(np.abs(x.astype(np.float32)).max())
        got = semantics._abs_max(x)
        assert got == want or (np.isnan(got) and np.isnan(want)), (special, got, want)
    tiny = np.array([-0.0, 6.0e-8, -1.2e-7], np.float16)
    assert semantics._abs_max(tiny) == float(np.abs(tiny.astype(np.float32)).max())

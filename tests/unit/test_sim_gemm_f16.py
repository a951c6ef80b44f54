"""The simulator's F16 GEMM fast path (runtime/gemm_f16.py) against the definition
(kernels/semantics.gemm_f16), bit for bit, on operands laid out in tile memory."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.kernels import semantics
from ipu_stack.runtime import gemm_f16
from ipu_stack.runtime.gemm_f16 import GemmOperands, gemm_f16_in_memory


def _layout(lefts, rights, outs, accumulate):
    """Tile memories holding each GEMM's operands on its own tile (reversed order, gaps)."""
    n, rows, k = lefts.shape
    c = rights.shape[-1]
    sizes = [lefts[0].nbytes, rights[0].nbytes, outs[0].nbytes]
    offsets = [64, 64 + sizes[0] + 32, 64 + sizes[0] + sizes[1] + 96]
    mem = np.zeros((n + 2, offsets[2] + sizes[2] + 64), np.uint8)
    tiles = [n - i for i in range(n)]
    for i, t in enumerate(tiles):
        for array, at in zip((lefts, rights, outs), offsets, strict=True):
            mem[t, at : at + array[i].nbytes] = array[i].reshape(-1).view(np.uint8)
    ops = GemmOperands(tiles, [offsets[0]] * n, [offsets[1]] * n, [offsets[2]] * n, rows, k, c,
                       accumulate)  # fmt: skip
    return mem, ops


def _outputs(mem, ops, n, rows, c):
    at = ops.outs[0]
    views = [mem[t, at : at + 2 * rows * c].view(np.float16) for t in ops.tiles]
    return np.stack(views).reshape(n, rows, c)


CASES = [  # n, rows, k, c, left scale, output scale
    (3, 81, 192, 160, 1.0, 1.0),
    (5, 7, 40, 16, 1.0, 1.0),  # K not a multiple of 16: a short last panel
    (2, 122, 160, 128, 1e-4, 1e-4),  # partials in the f16 subnormal range
    (1, 1, 16, 16, 1.0, 1.0),
    (4, 33, 1, 48, 1.0, 1.0),
    (40, 9, 48, 16, 1e-3, 1e-3),  # several blocks
    (7, 183, 64, 144, 1.0, 1.0),  # blocks of two GEMMs and a short last block
    (6, 30, 96, 32, 2e-6, 0.0),  # many partials round to zero
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_fast_path_gives_the_definitions_bits(case, accumulate):
    n, rows, k, c, scale, out_scale = case
    rng = np.random.default_rng(rows * 7 + k)
    lefts = (rng.standard_normal((n, rows, k)) * scale).astype(np.float16)
    rights = rng.standard_normal((n, k, c)).astype(np.float16)
    outs = (rng.standard_normal((n, rows, c)) * out_scale).astype(np.float16)
    expected = semantics.gemm_f16(lefts, rights, outs, accumulate)
    mem, ops = _layout(lefts, rights, outs, accumulate)
    assert gemm_f16_in_memory(mem, ops)
    got = _outputs(mem, ops, n, rows, c)
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


def test_signed_zeros_and_subnormal_operands():
    # zero rows and columns, -0 operands and partials, subnormal operands: every output
    # that ends at zero is replayed with signs, the rest must agree as they are
    rng = np.random.default_rng(9)
    n, rows, k, c = 4, 24, 48, 32
    lefts = (rng.standard_normal((n, rows, k)) * 1e-3).astype(np.float16)
    lefts[:, ::5] = -0.0
    lefts[:, 1::7, ::3] = np.float16(6e-8)  # f16 subnormals
    rights = rng.standard_normal((n, k, c)).astype(np.float16)
    rights[:, :, ::4] = 0.0
    rights[:, ::2, 1::4] = -0.0
    outs = rng.standard_normal((n, rows, c)).astype(np.float16)
    outs[:, ::3] = -0.0
    outs[:, 1::3, ::2] = np.float16(-6e-8)
    for accumulate in (False, True):
        expected = semantics.gemm_f16(lefts, rights, outs, accumulate)
        assert (expected.view(np.uint16) == 0x8000).any() or not accumulate
        mem, ops = _layout(lefts, rights, outs, accumulate)
        assert gemm_f16_in_memory(mem, ops)
        got = _outputs(mem, ops, n, rows, c)
        np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


@pytest.mark.parametrize("where", ["left", "right", "out"])
@pytest.mark.parametrize("special", [np.inf, -np.inf, np.nan, 3000.0])
def test_outside_the_bound_a_block_gets_the_definitions_bits(monkeypatch, special, where):
    # an inf or NaN operand, or partials that may round to inf, in one GEMM: its block is
    # computed by the definition, the other blocks by the fast path (blocks of 2 GEMMs here)
    monkeypatch.setattr(gemm_f16, "BLOCK_ELEMENTS", 2 * 8 * 16)
    rng = np.random.default_rng(2)
    lefts = rng.standard_normal((5, 8, 32)).astype(np.float16)
    rights = rng.standard_normal((5, 32, 16)).astype(np.float16)
    outs = rng.standard_normal((5, 8, 16)).astype(np.float16)
    {"left": lefts, "right": rights, "out": outs}[where][3, 3, 5] = special
    calls = []
    real = gemm_f16.definition
    monkeypatch.setattr(gemm_f16, "definition", lambda *a: calls.append(len(a[0])) or real(*a))
    with np.errstate(invalid="ignore", over="ignore"):
        expected = semantics.gemm_f16(lefts, rights, outs, True)
        mem, ops = _layout(lefts, rights, outs, True)
        assert gemm_f16_in_memory(mem, ops)
    got = _outputs(mem, ops, 5, 8, 16)
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))
    if where != "out" or special != 3000.0:  # an out of 3000 alone stays within the bound
        assert calls == [2]  # only the block holding GEMM 3


def test_conversions_are_exact_on_every_finite_f16():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = bits.view(np.float16)
    finite = np.isfinite(values)
    wide = np.empty(values.shape, np.float32)
    gemm_f16.f16_to_f32(values[finite], wide[: finite.sum()])
    expected = values[finite].astype(np.float32)
    np.testing.assert_array_equal(wide[: finite.sum()].view(np.uint32), expected.view(np.uint32))
    back = gemm_f16.f32_to_f16_bits(
        expected, np.empty_like(expected), np.empty(expected.shape, np.uint32)
    )
    np.testing.assert_array_equal(back, bits[finite])


def test_rounding_is_numpys_f16_rounding():
    # every f32 in [1, 2) (all mantissas: ties included), scaled over the f16 exponents and
    # into the subnormal range, both signs
    mantissas = np.arange(1 << 23, dtype=np.uint32) | np.uint32(127 << 23)
    one_to_two = mantissas.view(np.float32)
    for exponent in (-30, -25, -24, -20, -15, -14, -13, 0, 7, 15):
        for sign in (1.0, -1.0):
            x = (one_to_two * np.float32(sign * 2.0**exponent)).astype(np.float32)
            if exponent == 15:
                x = x[np.abs(x) < 65504]
            expected = x.astype(np.float16).astype(np.float32)
            got, magic = np.empty_like(x), np.empty_like(x)
            gemm_f16._round(x, got, magic)
            np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("child_fails", [False, True])
def test_half_of_the_blocks_in_a_forked_child_give_the_same_bits(monkeypatch, child_fails):
    monkeypatch.setenv("IPU_STACK_SIM_FORK", "1")
    monkeypatch.setattr(gemm_f16, "FORK_WORK", 0)
    monkeypatch.setattr(gemm_f16, "BLOCK_ELEMENTS", 1000)
    if child_fails:  # the parent then does the child's blocks itself

        def fail(*args):
            raise RuntimeError("child")

        monkeypatch.setattr(gemm_f16, "_child", fail)
    rng = np.random.default_rng(8)
    n, rows, k, c = 9, 20, 64, 48  # 9 blocks of one GEMM: 5 here, 4 in the child
    lefts = rng.standard_normal((n, rows, k)).astype(np.float16)
    rights = rng.standard_normal((n, k, c)).astype(np.float16)
    outs = rng.standard_normal((n, rows, c)).astype(np.float16)
    for accumulate in (False, True):
        expected = semantics.gemm_f16(lefts, rights, outs, accumulate)
        mem, ops = _layout(lefts, rights, outs, accumulate)
        assert gemm_f16_in_memory(mem, ops)
        got = _outputs(mem, ops, n, rows, c)
        np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


@pytest.mark.parametrize("seed", range(3))
def test_add_results_to_f16_are_numpys_cast(seed):
    """The add calls' f32 -> f16 conversion (``sim._to_dtype``): NumPy's cast, bit for bit,
    on halfway points, subnormals, signed zeros, tiny values, values near the f16 maximum
    and (by NumPy itself) inf and NaN."""
    from ipu_stack.runtime.sim import _to_dtype

    rng = np.random.default_rng(seed)
    halves = rng.integers(0, 0x7C00, 4000).astype(np.uint16).view(np.float16).astype(np.float32)
    halfway = (halves.view(np.uint32) + np.uint32(1 << 12)).view(np.float32)  # ties and odd
    values = np.concatenate([
        rng.standard_normal(4000).astype(np.float32) * np.float32(10.0 ** rng.integers(-9, 5)),
        halves, -halves, halfway, -halfway, np.nextafter(halfway, np.float32(0)),
        np.array([0.0, -0.0, 1e-40, -1e-40, 2.0**-25, -(2.0**-25), 2.0**-24 * 1.5, 65504.0,
                  -65504.0, 65519.0], np.float32),
    ]).astype(np.float32)  # fmt: skip
    rng.shuffle(values)
    values = values[: len(values) // 4 * 4]
    got = _to_dtype(values.reshape(4, -1), np.dtype(np.float16))
    assert got.dtype == np.float16 and got.shape == (4, len(values) // 4)
    assert np.array_equal(
        got.reshape(-1).view(np.uint16), values.astype(np.float16).view(np.uint16)
    )
    for special in (np.inf, np.nan, 65520.0):  # NumPy's cast for these batches
        with_special = np.append(values[:99], np.float32(special))
        with np.errstate(over="ignore"):
            assert np.array_equal(
                _to_dtype(with_special, np.dtype(np.float16)).view(np.uint16),
                with_special.astype(np.float16).view(np.uint16),
            )
    wide = _to_dtype(values, np.dtype(np.float32))
    assert np.array_equal(wide, values)

"""NumPy reference semantics of the tile kernels: what each kernel computes, bit for bit.

These functions are the executable definition the simulator runs (through
:mod:`ipu_stack.kernels.registry`); nothing else in the code base computes a kernel's result.

Numeric model of the AMP GEMMs with half partials (``f16v4hihov4amp``, ``f8v8hihov4amp``:
"half in, half out", facts §16.3): the partial sums live in memory as f16. For each
coefficient-store panel (K16 x C16 for F16, K32 x C16 for F8; facts §15.1) the engines form
the products of a row in wider precision (modelled as f32) and add them to the f16 partial
read from memory; the sum is rounded to f16 when written back. So rounding to f16 happens once
per K panel. The internal adder width is not public (facts §16.5 gap 3), so this is a model,
not a bit-exact claim. F8 operands are F143 with one power-of-two scale per tensor; the
product scale is the sum of the operand scales (reference-system §1.4). F32 GEMMs accumulate
in f32 throughout.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F143 = np.dtype(ml_dtypes.float8_e4m3fnuz)  # bias 8, max 240, NaN 0x80, no negative zero
F143_MAX = 240.0


def gemm_half_partials(
    lefts: np.ndarray,
    rights: np.ndarray,
    outs: np.ndarray,
    accumulate: bool,
    k_micro: int,
    scale_exponent: int = 0,
) -> np.ndarray:
    """Batched AMP GEMM with f16 partials: ``outs[i] (+)= lefts[i] @ rights[i]``.

    Args:
        lefts: ``[n, rows, k]`` operands (f16 or F143).
        rights: ``[n, k, c]`` operands (same precision as ``lefts``).
        outs: ``[n, rows, c]`` f16 partials read from memory (ignored unless ``accumulate``).
        accumulate: add to ``outs`` (True) or start from zero (False).
        k_micro: K extent of one coefficient panel; the partial is rounded once per panel.
        scale_exponent: power-of-two scale of every product (F8: sum of operand scales).

    Returns:
        The new ``[n, rows, c]`` f16 partials.
    """
    k = lefts.shape[-1]
    left32, right32 = lefts.astype(np.float32), rights.astype(np.float32)
    result = outs.astype(np.float16) if accumulate else np.zeros(outs.shape, np.float16)
    acc32 = result.astype(np.float32)
    panel = np.empty_like(acc32)
    scale = np.float32(2.0**scale_exponent)
    for p in range(0, k, k_micro):
        q = p + k_micro
        np.matmul(left32[:, :, p:q], right32[:, p:q, :], out=panel)
        if scale_exponent:
            panel *= scale
        acc32 += panel
        result[...] = acc32  # the partial is written back to memory as f16
        acc32[...] = result
    return result


def gemm_f16(
    lefts: np.ndarray, rights: np.ndarray, outs: np.ndarray, accumulate: bool
) -> np.ndarray:
    """F16 AMP GEMM (``f16v4hihov4amp``): f16 partials rounded once per K16 panel."""
    return gemm_half_partials(lefts, rights, outs, accumulate, k_micro=16)


def gemm_f8(
    lefts: np.ndarray,
    rights: np.ndarray,
    outs: np.ndarray,
    accumulate: bool,
    scale_exponent: int = 0,
) -> np.ndarray:
    """F8 AMP GEMM (``f8v8hihov4amp``): F143 operands, f16 partials per K32 panel."""
    return gemm_half_partials(lefts, rights, outs, accumulate, 32, scale_exponent)


def gemm_f32(
    lefts: np.ndarray, rights: np.ndarray, outs: np.ndarray, accumulate: bool
) -> np.ndarray:
    """F32 GEMM: f32 operands, f32 accumulation."""
    product = np.matmul(lefts.astype(np.float32), rights.astype(np.float32))
    if accumulate:
        product += outs.astype(np.float32)
    return product


def encode_f143(values: np.ndarray, scale_exponent: int) -> np.ndarray:
    """Host encoding of ``values`` as F143 with scale ``2**scale_exponent`` (saturating).

    The stored element is ``values / 2**scale_exponent`` clipped to +-240; the hardware
    multiplies products back by the scale (reference-system §1.4).
    """
    scaled = np.asarray(values, np.float32) / np.float32(2.0**scale_exponent)
    return np.clip(scaled, -F143_MAX, F143_MAX).astype(F143)


def decode_f143(stored: np.ndarray, scale_exponent: int) -> np.ndarray:
    """The real values of F143 elements stored with scale ``2**scale_exponent``."""
    return np.asarray(stored).astype(np.float32) * np.float32(2.0**scale_exponent)


def packed_output_offsets(rows: int, c: int, group: int) -> np.ndarray:
    """Element offset of every ``[row, column]`` of a packed GEMM output.

    Packed outputs (projection-output packing, reference-system §4.2) are stored as row
    panels of 16 rows inside ``group``-column groups: group-major, then rows (padded to a
    multiple of 16), then the columns of the group.
    """
    rows16 = -(-rows // 16) * 16
    r = np.arange(rows)[:, None]
    col = np.arange(c)[None, :]
    return (col // group) * rows16 * group + r * group + col % group


def pack_output(out: np.ndarray, group: int) -> np.ndarray:
    """Row-major ``[rows, c]`` -> packed flat storage (padding rows are zero)."""
    rows, c = out.shape
    rows16 = -(-rows // 16) * 16
    flat = np.zeros(-(-c // group) * rows16 * group, out.dtype)
    flat[packed_output_offsets(rows, c, group)] = out
    return flat


def unpack_output(flat: np.ndarray, rows: int, c: int, group: int) -> np.ndarray:
    """Packed flat storage -> row-major ``[rows, c]``."""
    return flat[packed_output_offsets(rows, c, group)]

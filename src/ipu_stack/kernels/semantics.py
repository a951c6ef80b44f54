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

import functools

import ml_dtypes
import numpy as np

F143 = np.dtype(ml_dtypes.float8_e4m3fnuz)  # bias 8, max 240, NaN 0x80, no negative zero
F143_MAX = 240.0
# gemm_half_partials works on blocks of GEMMs whose f32 partials fit in a core's cache
# (~256 KiB) and holds at most ~16 MiB of panel products at once.
_CACHE_ELEMENTS = 1 << 16
_PRODUCT_ELEMENTS = 1 << 22
F16_MAX = 65504.0
_MAGIC_LOW, _MAGIC_HIGH = np.uint32(0x38800000), np.uint32(0x47000000)
_SIGN, _EXPONENT, _PLUS_13 = np.uint32(0x80000000), np.uint32(0x7F800000), np.uint32(13 << 23)
# the clip ufunc itself (np.clip's Python wrapper costs a third of the pass on 65 K elements)
_clip = (getattr(np, "_core", None) or np.core).umath.clip


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
    n, rows, k = lefts.shape
    c = rights.shape[-1]
    result = outs.astype(np.float16) if accumulate else np.zeros(outs.shape, np.float16)
    panels = -(-k // k_micro)
    if n == 0 or rows == 0 or c == 0 or panels == 0:
        return result
    scale = np.float32(2.0**scale_exponent)
    # Blocks of a few GEMMs (their f32 partials stay in cache); per block, every K panel's
    # product at once from one batched matmul of contiguous [panel, rows, k_micro] x
    # [panel, k_micro, c] operands (the last panel zero-padded: zero products add nothing),
    # then the panels added in order, the partial rounded to f16 after each. The blocks are
    # independent, but running them in parallel did not pay on the shared 2-core host: two
    # threads took longer than one (the blocks are thousands of ~15 us NumPy calls, each
    # taking the GIL), and a forked child taking half of the blocks made the batch-4 SigLIP
    # MLP's image run slower (9.1 s against 8.3 s wall at load average ~1.1; the cause, e.g.
    # copy-on-write faults, was not measured), so they run in this process.
    per = rows * c
    batch = max(1, _CACHE_ELEMENTS // per)
    panel_chunk = max(1, min(panels, _PRODUCT_ELEMENTS // (per * batch)))
    padded = panels * k_micro
    # Largest |product| of a panel: bounds the partials, so overflow to inf is handled only
    # where it can occur.
    bound = _abs_max(lefts) * _abs_max(rights) * k_micro * float(scale)

    scratch: dict[str, np.ndarray] = {}  # buffers reused from block to block

    def buffer(name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        # a fresh multi-MiB array per block costs page faults comparable to its matmul
        size = int(np.prod(shape))
        held = scratch.get(name)
        if held is None or held.size < size:
            held = scratch[name] = np.empty(size, dtype)
        return held[:size].reshape(shape)

    def block(a: int, target: np.ndarray) -> None:
        b = min(n, a + batch)
        m = b - a
        left_panels = buffer("left", (m, panels, rows, k_micro), np.float32)
        right_panels = buffer("right", (m, panels, k_micro, c), np.float32)
        if padded == k:  # one converting copy into the panel layout
            left_panels[...] = lefts[a:b].reshape(m, rows, panels, k_micro).transpose(0, 2, 1, 3)
            right_panels.reshape(m, k, c)[...] = rights[a:b]
        else:
            left32 = np.zeros((m, rows, padded), np.float32)
            left32[:, :, :k] = lefts[a:b]
            left_panels[...] = left32.reshape(m, rows, panels, k_micro).transpose(0, 2, 1, 3)
            right_panels.reshape(m, padded, c)[:, k:, :] = 0
            right_panels.reshape(m, padded, c)[:, :k, :] = rights[a:b]
        part = target[a:b]
        acc32 = buffer("acc", part.shape, np.float32)
        acc32[...] = part
        limit = float(np.abs(acc32).max()) if accumulate else 0.0
        sign = buffer("sign", acc32.shape, np.uint32)
        magic = buffer("magic", acc32.shape, np.float32)
        for p in range(0, panels, panel_chunk):
            q = min(panels, p + panel_chunk)
            products = np.matmul(
                left_panels[:, p:q].reshape(-1, rows, k_micro),
                right_panels[:, p:q].reshape(-1, k_micro, c),
                out=buffer("products", (m * (q - p), rows, c), np.float32),
            ).reshape(m, q - p, rows, c)
            if scale_exponent:
                products *= scale
            for j in range(q - p):
                acc32 += products[:, j]
                limit += bound
                _round_to_f16(acc32, sign, magic, limit > F16_MAX)
        part[...] = acc32  # exact: every partial is an f16 value

    for a in range(0, n, batch):
        block(a, result)
    return result


def _abs_max(values: np.ndarray) -> float:
    """``max |values|`` as a float (NaN if there is a NaN). For f16, on the bit patterns: the
    magnitudes order as their low 15 bits, NaNs above infinity (no f32 copy of the array)."""
    if values.dtype == np.float16:
        bits = values.reshape(-1).view(np.uint16)
        buffer = np.empty(max(1, min(len(bits), 1 << 20)), np.uint16)  # no large temporary
        low = 0
        for a in range(0, len(bits), len(buffer)):
            part = buffer[: len(bits[a : a + len(buffer)])]
            np.bitwise_and(bits[a : a + len(buffer)], np.uint16(0x7FFF), out=part)
            low = max(low, int(part.max()))
        return float(np.uint16(low).view(np.float16))
    return float(np.abs(values.astype(np.float32)).max())


def _round_to_f16(acc: np.ndarray, sign: np.ndarray, magic: np.ndarray, overflow: bool) -> None:
    """Round f32 ``acc`` in place to the nearest f16 value (ties to even), kept as f32.

    The same result as ``acc.astype(np.float16).astype(np.float32)`` (what writing the
    partial to memory as f16 and reading it back does), several times faster: adding and
    subtracting ``C = +-2**(e + 13)`` (``e`` the exponent of the element, at least -14, the
    f16 subnormal grid) rounds to a multiple of ``2**(e - 10)``, the f16 spacing there.
    ``overflow``: some element may exceed the f16 range (then those become +-inf).
    """
    bits, magic_bits = acc.view(np.uint32), magic.view(np.uint32)
    np.bitwise_and(bits, _SIGN, out=sign)
    np.bitwise_and(bits, _EXPONENT, out=magic_bits)
    _clip(magic_bits, _MAGIC_LOW, _MAGIC_HIGH, out=magic_bits)  # 2**-14 .. 2**15
    np.add(magic_bits, _PLUS_13, out=magic_bits)
    np.bitwise_or(magic_bits, sign, out=magic_bits)
    np.add(acc, magic, out=acc)
    np.subtract(acc, magic, out=acc)
    np.bitwise_or(bits, sign, out=bits)  # a value rounded to zero keeps its sign, as in f16
    if overflow:
        big = np.abs(acc) > F16_MAX
        acc[big] = np.copysign(np.float32(np.inf), acc[big])


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
    multiplies products back by the scale (reference-system §1.4). Large F16 arrays (the
    weights of a model) are encoded through a table of all 65,536 F16 values made by the
    same formula: the same bytes, without two float32 temporaries of the array's size.
    """
    array = np.asarray(values)
    if array.dtype == np.float16 and array.size > _F143_TABLE_MIN:
        return _f143_table(int(scale_exponent))[array.view(np.uint16)]
    return _encode_f143(array, scale_exponent)


#: F16 arrays above this many elements are encoded through :func:`_f143_table`
_F143_TABLE_MIN = 1 << 16


def _encode_f143(values: np.ndarray, scale_exponent: int) -> np.ndarray:
    scaled = np.asarray(values, np.float32) / np.float32(2.0**scale_exponent)
    return np.clip(scaled, -F143_MAX, F143_MAX).astype(F143)


@functools.lru_cache(maxsize=16)
def _f143_table(scale_exponent: int) -> np.ndarray:
    """The F143 encoding of every F16 bit pattern (index: the pattern) at one scale."""
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    with np.errstate(all="ignore"):  # signalling-NaN patterns; the array's own are encoded alike
        table = _encode_f143(every, scale_exponent)
    table.flags.writeable = False
    return table


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

"""The simulator's fast path of the F16 AMP GEMM semantics (``f16v4hihov4amp``).

:func:`ipu_stack.kernels.semantics.gemm_f16` is the definition: f16 operands, f32 products of
each K16 x C16 coefficient panel summed in order, added to the f16 partial and rounded to f16
once per panel. :func:`gemm_f16_in_memory` computes the same bits faster, on the operands in
tile memory, and leaves the batch to the definition where its shortcuts do not hold:

- operands are converted between f16 and f32 with bit operations (exact for finite values;
  NumPy's f16 casts are scalar code, ~2.5 ns an element);
- every panel's products of a block of GEMMs come from one batched matmul reading the f32
  left operand in place (panel ``p`` is a strided ``[rows, 16]`` view): the same sgemm of the
  same ``[rows, 16] x [16, c]`` panels as the definition's, so the same sums;
- the partial is rounded with ``(s + C) - C``, ``C = 1.5 * 2**(e + 13)`` (``e`` the exponent
  of ``s``, at least -14): the sum lies in one binade whose spacing is the f16 spacing at
  ``s``, so it rounds to nearest even on the f16 grid, the subnormal one included. A result
  of zero is +0 here; the sign of a zero partial only matters while the partial stays zero,
  so outputs that end at zero (rare) are replayed with signed rounding;
- with a spare core, half of a large batch's blocks run in a forked child
  (:mod:`ipu_stack.runtime.spare_core`).

5 passes per panel and element instead of 8 (plus the add), and no per-GEMM conversions by
NumPy: the batch-4 SigLIP MLP's GEMMs (1.8 G panel-element updates) took 5.0 s, now ~3.3 s
on one core. The shortcuts need finite operands whose partials stay below the f16 maximum
(no rounding to infinity): the bound is the definition's own (``max |left| * max |right| *
16`` per panel), with a margin for the rounding of the partials, checked per block on the
converted operands (a pass over every operand beforehand was ~2.5% of the batch-4 SigLIP
MLP's simulation); a block outside it gets its outputs from the definition.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from ipu_stack.kernels.semantics import gemm_f16 as definition
from ipu_stack.runtime.spare_core import Child, spare_core

K_MICRO = 16
F16_MAX = 65504.0
F16_MAX_BITS = int(np.array(F16_MAX, np.float32).view(np.uint32))  # as f32 bits
#: elements of the partials rounded per block: the block's partial, magic and scratch
#: arrays stay in a core's L2 cache
BLOCK_ELEMENTS = 1 << 16
#: element-panels of a batch from which half of its blocks go to a forked child (where a
#: core is spare; runtime/spare_core.py): ~0.1 s of work, against ~10 ms to fork and copy
FORK_WORK = 50_000_000
_EXPONENT = np.uint32(0x7F800000)
_SIGN = np.uint32(0x80000000)
_MAGNITUDE = np.uint16(0x7FFF)
# 2**-14 .. 2**15: the f16 exponents (the subnormal grid has the spacing of 2**-14)
_LOW, _HIGH = np.uint32(113 << 23), np.uint32(142 << 23)
_MAGIC = np.uint32((13 << 23) | (1 << 22))  # 2**e -> 1.5 * 2**(e + 13)
_NOT_SIGN_COPIES = np.int32(0x8FFFFFFF - (1 << 32))  # clears bits 28..30
_UP, _DOWN = np.float32(2.0**112), np.float32(2.0**-112)
_clip = (getattr(np, "_core", None) or np.core).umath.clip


@dataclass(frozen=True, slots=True)
class GemmOperands:
    """A batch of F16 GEMMs of one shape in tile memory: per GEMM its tile and the byte
    offsets (into that tile's memory array) of its left, right and output operands."""

    tiles: list[int]
    lefts: list[int]
    rights: list[int]
    outs: list[int]
    rows: int
    k: int
    c: int
    accumulate: bool


def gemm_f16_in_memory(mem: np.ndarray, ops: GemmOperands) -> bool:
    """Run the batch on the tile memories ``mem`` (``[tiles, bytes]``): each output becomes
    ``left @ right`` (+ the output, if ``accumulate``) with f16 partials, bit for bit
    :func:`~ipu_stack.kernels.semantics.gemm_f16`.

    A block of GEMMs whose operands break the shortcuts' conditions (an inf or NaN, partials
    that could round to inf: :func:`_bounded`) gets its outputs from the definition itself.

    Returns:
        False, with nothing written, where the fast path cannot run at all (f32 arithmetic
        that flushes subnormals; then the caller runs the definition).
    """
    rows, k, c = ops.rows, ops.k, ops.c
    panels = -(-k // K_MICRO)
    if not ops.tiles or rows == 0 or c == 0 or panels == 0 or not _subnormals_kept():
        return not ops.tiles or rows == 0 or c == 0  # nothing to compute
    views = _Views(mem, ops)
    n = len(ops.tiles)
    batch = max(1, min(n, BLOCK_ELEMENTS // (rows * c)))
    blocks = [range(a, min(n, a + batch)) for a in range(0, n, batch)]
    child = None
    if len(blocks) >= 4 and n * rows * c * panels >= FORK_WORK and spare_core():
        half = len(blocks) // 2
        theirs, blocks = blocks[half:], blocks[:half]
        child = Child(2 * rows * c * (n - theirs[0].start), partial(_child, views, theirs))
    scratch = _Scratch(ops)
    try:
        for calls in blocks:
            _block(views, calls, scratch)
        if child is not None:
            done = child.result()
            child = None
            if done is None:  # the child failed: its blocks here
                for calls in theirs:
                    _block(views, calls, scratch)
            else:
                bits = done.view(np.uint16).reshape(-1, rows, c)
                for j, i in enumerate(range(theirs[0].start, n)):
                    views.get("out", i)[...] = bits[j]
    finally:
        if child is not None:
            child.cancel()
    return True


def _child(views: _Views, blocks: list[range], buffer: np.ndarray) -> None:
    """A forked child's part: the blocks' output bits, in call order, into ``buffer``."""
    ops = views.ops
    scratch = _Scratch(ops)
    bits = buffer.view(np.uint16).reshape(-1, ops.rows, ops.c)
    first = blocks[0].start
    for calls in blocks:
        _block(views, calls, scratch, bits[calls.start - first : calls.stop - first])


class _Views:
    """The operands of a batch as f16 views of tile memory."""

    def __init__(self, mem: np.ndarray, ops: GemmOperands) -> None:
        self.mem, self.ops = mem, ops
        self.shapes = {"left": (ops.rows, ops.k), "right": (ops.k, ops.c), "out": (ops.rows, ops.c)}
        self.offsets = {"left": ops.lefts, "right": ops.rights, "out": ops.outs}

    def get(self, name: str, i: int) -> np.ndarray:
        shape = self.shapes[name]
        at = self.offsets[name][i]
        size = 2 * shape[0] * shape[1]
        return self.mem[self.ops.tiles[i], at : at + size].view(np.uint16).reshape(shape)

    def stacked(self, name: str, calls: range) -> np.ndarray:
        """The operand of ``calls`` as one f16 array ``[calls, ...]``."""
        return np.stack([self.get(name, i) for i in calls]).view(np.float16)


class _Scratch:
    """Buffers and their views, made once per block size and reused from block to block (a
    fresh multi-MiB array per block costs page faults comparable to its work)."""

    def __init__(self, ops: GemmOperands) -> None:
        self.ops = ops
        self.held: dict[int, _Buffers] = {}

    def get(self, m: int) -> _Buffers:
        found = self.held.get(m)
        if found is None:
            found = self.held[m] = _Buffers(m, self.ops)
        return found


class _Buffers:
    """A block of ``m`` GEMMs' f32 operands, panel views, products and partials."""

    def __init__(self, m: int, ops: GemmOperands) -> None:
        rows, k, c = ops.rows, ops.k, ops.c
        panels = -(-k // K_MICRO)
        padded = panels * K_MICRO
        self.size = size = m * rows * c
        self.left = np.zeros((m, rows, padded), np.float32)  # a short last panel: zero
        self.right = np.zeros((m, padded, c), np.float32)  # products add nothing
        s = self.left.strides
        # [panel, m, rows, 16] x [panel, m, 16, c]: panel p of the left operand in place
        self.left_panels = np.lib.stride_tricks.as_strided(
            self.left, (panels, m, rows, K_MICRO), (K_MICRO * s[2], s[0], s[1], s[2])
        )
        self.right_panels = self.right.reshape(m, panels, K_MICRO, c).transpose(1, 0, 2, 3)
        self.products = np.empty((panels, m, rows, c), np.float32)
        self.flat = self.products.reshape(panels, size)
        self.init = np.zeros(size, np.float32)
        self.acc, self.other, self.magic = (np.empty(size, np.float32) for _ in range(3))


def _block(views: _Views, calls: range, scratch: _Scratch, sink: np.ndarray | None = None) -> None:
    """The outputs of ``calls``, into tile memory or, given a ``sink``, into it
    (``[calls, rows, c]`` f16 bits)."""
    ops = views.ops
    m, rows, k, c = len(calls), ops.rows, ops.k, ops.c
    buf = scratch.get(m)
    init, flat, acc, other, magic = buf.init, buf.flat, buf.acc, buf.other, buf.magic
    for j, i in enumerate(calls):
        f16_to_f32(views.get("left", i), buf.left[j, :, :k])
        f16_to_f32(views.get("right", i), buf.right[j, :k, :])
        if ops.accumulate:
            f16_to_f32(views.get("out", i), init.reshape(m, rows, c)[j])
    if not _bounded(buf, ops.accumulate, len(flat)):
        out = definition(
            views.stacked("left", calls), views.stacked("right", calls),
            views.stacked("out", calls), ops.accumulate,
        )  # fmt: skip
        _put(views, calls, np.asarray(out, np.float16).view(np.uint16), sink)
        return
    np.matmul(buf.left_panels, buf.right_panels, out=buf.products)
    # in place: a NumPy binary operation into a third array took about twice as long as one
    # whose output is an input (measured on 55 K-element blocks)
    np.add(init, flat[0], out=acc)
    for p in range(1, len(flat)):
        _round_magnitude(acc, acc, magic)
        np.add(acc, flat[p], out=acc)
    _round_magnitude(acc, acc, magic)
    bits = f32_to_f16_bits(acc, magic, other.view(np.uint32))
    if int(bits.min()) == 0:  # rare: outputs at zero (always +0 here) replayed with signs
        zeros = np.flatnonzero(bits == 0)
        bits[zeros] = f32_to_f16_bits(*_replay(init[zeros], flat[:, zeros]))
    _put(views, calls, bits.reshape(m, rows, c), sink)


def _put(views: _Views, calls: range, bits: np.ndarray, sink: np.ndarray | None) -> None:
    """Output bits ``[calls, rows, c]`` into tile memory or the ``sink``."""
    if sink is not None:
        sink[...] = bits
        return
    for j, i in enumerate(calls):
        views.get("out", i)[...] = bits[j]


def _bounded(buf: _Buffers, accumulate: bool, panels: int) -> bool:
    """Whether the shortcuts hold for a block: finite operands and the definition's bound on
    every partial (``max |left| * max |right| * 16`` per panel, from ``max |out|`` when
    accumulating), with a margin for the partials' own rounding (each at most 2**-11
    relative, once per panel), at most the f16 maximum.

    Taken on the block's converted operands (in cache); an inf or NaN converts to at least
    ``2**16`` (:func:`f16_to_f32` is exact only for finite values), above the f16 maximum.
    """
    left, right = _abs_max(buf.left), _abs_max(buf.right)
    start = _abs_max(buf.init) if accumulate else 0.0
    if max(left, right, start) > F16_MAX:
        return False
    limit = start + panels * (left * right * K_MICRO)
    return bool(limit * (1.0 + 2.0**-10) ** (panels + 1) <= F16_MAX)


def _abs_max(values: np.ndarray) -> float:
    return max(float(values.max()), -float(values.min())) if values.size else 0.0


def _round_magnitude(partial: np.ndarray, out: np.ndarray, magic: np.ndarray) -> None:
    """``out`` = ``partial`` rounded to the nearest f16 value (ties to even), as f32, except
    that a result of zero is +0 (``partial`` is left as is unless it is ``out``, ``magic`` is
    scratch).

    Needs ``|partial| < 2**16``. The sign of a zero partial matters only while the partial
    stays zero (``-0 + y == +0 + y`` for any ``y != 0``, and a nonzero partial rounds the same
    either way), so a GEMM output that is not zero has the definition's bits; zero outputs
    are replayed with :func:`_replay`.
    """
    magic_bits = magic.view(np.uint32)
    np.bitwise_and(partial.view(np.uint32), _EXPONENT, out=magic_bits)
    _clip(magic_bits, _LOW, _HIGH, out=magic_bits)
    np.add(magic_bits, _MAGIC, out=magic_bits)
    np.add(partial, magic, out=out)
    np.subtract(out, magic, out=out)


def _round(partial: np.ndarray, out: np.ndarray, magic: np.ndarray) -> None:
    """:func:`_round_magnitude`, and a zero result keeps the sign of ``partial`` (the
    definition's f16 rounding, exactly)."""
    _round_magnitude(partial, out, magic)
    magic_bits, out_bits = magic.view(np.uint32), out.view(np.uint32)
    np.bitwise_and(partial.view(np.uint32), _SIGN, out=magic_bits)
    np.bitwise_or(out_bits, magic_bits, out=out_bits)


def _replay(init: np.ndarray, products: np.ndarray) -> tuple[np.ndarray, ...]:
    """The exact partials (signed zeros included) of a few outputs: ``init`` their starting
    partials, ``products`` their ``[panel, output]`` panel sums. Returns the final partials
    and two work arrays, the arguments of :func:`f32_to_f16_bits`."""
    acc, out, magic = init.copy(), np.empty_like(init), np.empty_like(init)
    for p in range(len(products)):
        np.add(acc, products[p], out=acc)
        _round(acc, out, magic)
        acc, out = out, acc
    return acc, magic, np.empty(acc.shape, np.uint32)


def f16_to_f32(values: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = values`` for finite f16 ``values`` (exact; not for inf and NaN).

    The f16 bits shifted left by 13 are an f32 whose exponent is 112 too small (a
    subnormal f16 becomes a subnormal f32), so one multiplication by ``2**112`` finishes.
    """
    bits = out.view(np.int32)
    np.left_shift(values.view(np.int16), 13, out=bits, dtype=np.int32)  # sign-extended
    np.bitwise_and(bits, _NOT_SIGN_COPIES, out=bits)
    np.multiply(out, _UP, out=out)


def finite_f16(values: np.ndarray) -> bool:
    """Whether every element of the f16 array is finite (no inf or NaN)."""
    magnitudes = np.bitwise_and(values.view(np.uint16), _MAGNITUDE)
    return not magnitudes.size or int(magnitudes.max()) < 0x7C00


def f32_to_f16_bits(values: np.ndarray, scratch: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The f16 bits (in uint32 ``high``) of f32 ``values`` that are finite f16 values
    (exact); ``scratch`` (f32) is a work array of their shape."""
    bits = scratch.view(np.uint32)
    np.multiply(values, _DOWN, out=scratch)  # the f16 exponent bias; subnormals exact
    np.right_shift(bits, 16, out=high)
    np.bitwise_and(high, np.uint32(0x8000), out=high)
    np.right_shift(bits, 13, out=bits)
    np.bitwise_and(bits, np.uint32(0x7FFF), out=bits)
    np.bitwise_or(high, bits, out=high)
    return high


def to_f16_bits(values: np.ndarray) -> np.ndarray | None:
    """The f16 bits (``uint16``, the shape of ``values``) of f32 ``values`` rounded to
    nearest even, as NumPy's cast gives them; None if a value is not finite or above the f16
    maximum (where the cast is left to NumPy).

    Block by block (the rounding's passes on cache-resident blocks: on a whole multi-MiB
    array they took longer than NumPy's cast).
    """
    flat = np.ascontiguousarray(values).reshape(-1)
    out = np.empty(flat.shape, np.uint16)
    n = min(len(flat), BLOCK_ELEMENTS)
    rounded, magic = np.empty(n, np.float32), np.empty(n, np.float32)
    high = np.empty(n, np.uint32)
    for lo in range(0, len(flat), BLOCK_ELEMENTS):
        block = flat[lo : lo + BLOCK_ELEMENTS]
        m = len(block)
        np.bitwise_and(block.view(np.uint32), np.uint32(0x7FFFFFFF), out=high[:m])
        if int(high[:m].max()) > F16_MAX_BITS:
            return None
        _round(block, rounded[:m], magic[:m])
        out[lo : lo + m] = f32_to_f16_bits(rounded[:m], magic[:m], high[:m])
    return out.reshape(values.shape)


def _subnormals_kept() -> bool:
    probe = np.array([1, 0x8001, 0x3C00], np.uint16).view(np.float16)
    wide = np.empty(3, np.float32)
    f16_to_f32(probe, wide)
    back = f32_to_f16_bits(wide, np.empty(3, np.float32), np.empty(3, np.uint32))
    return bool(
        np.array_equal(wide, probe.astype(np.float32))
        and np.array_equal(back, probe.view(np.uint16))
    )

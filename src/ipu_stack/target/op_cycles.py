"""Cycle models of the non-GEMM tile kernels (one tile, one call, launch excluded).

Sources: `shared/docs/ipu21-facts.md` §12 (reference cost constants, [T]) and §14.1 (kernels
measured on a C600, one row each, [T]); linear fits through those points are ours [I].
"""

from __future__ import annotations

from ipu_stack.target import ipu21
from ipu_stack.target.attention_cycles import flash_attention_cycles

# facts §14.1: LayerNorm over 1,152 elements of one row takes 6,732 cycles.
LAYER_NORM_CYCLES_PER_ELEMENT = 6732 / 1152
# facts §14.1: segmented softmax over 729 keys of one row takes 5,232 cycles.
SOFTMAX_CYCLES_PER_ELEMENT = 5232 / 729
# facts §12.2: GeLU 10 cycles per element.
GELU_CYCLES_PER_ELEMENT = 10
# facts §12.2 / reference §2.3: a cast streams (in + out) bytes at 8 B/cycle.
CAST_BYTES_PER_CYCLE = ipu21.LOCAL_COPY_BYTES_PER_CYCLE


# Kinds costed like add/mul (facts §12.2: Add 16 elements/cycle): one vector ALU operation per
# element (sub, max, min, neg, relu: a max with zero), and reduce_mean, one add per *input* element
# plus one scale per row [I].
ADD_LIKE = ("add", "mul", "sub", "max", "min", "neg", "relu", "reduce_mean")
# Kinds costed like GeLU (facts §12.2: 10 cycles/element): one divide, square root or
# transcendental evaluation per element, as the erf of GeLU [I]. Not measured on a C600.
GELU_LIKE = ("gelu", "tanh", "sigmoid", "sqrt", "reciprocal", "div", "pow")


def elementwise_cycles(kind: str, elements: int, in_bytes: int = 0, out_bytes: int = 0) -> int:
    """Cycles of an elementwise kernel over ``elements`` outputs (inputs for reduce_mean)."""
    if kind in ADD_LIKE or kind in ("equal", "where"):  # i32 too: one vector op per element [I]
        return int(ipu21.ADD_FIXED_CYCLES + ipu21.ADD_CYCLES_PER_ELEMENT * elements + 0.999)
    if kind in GELU_LIKE:
        return GELU_CYCLES_PER_ELEMENT * elements
    if kind == "cast":
        return -(-(in_bytes + out_bytes) // CAST_BYTES_PER_CYCLE)
    raise KeyError(kind)


def row_kernel_cycles(kind: str, rows: int, cols: int) -> int:
    """Cycles of a row-wise kernel (layer_norm, softmax) over ``rows`` rows of ``cols``."""
    per = LAYER_NORM_CYCLES_PER_ELEMENT if kind == "layer_norm" else SOFTMAX_CYCLES_PER_ELEMENT
    return int(per * rows * cols + 0.999)


def attention_cycles(q_rows: int, k_rows: int, d: int, dv: int, precision: ipu21.Precision) -> int:
    """Attention on one tile: the call sequence of :mod:`ipu_stack.target.attention_cycles`."""
    return flash_attention_cycles(q_rows, k_rows, d, dv, precision)


# Indexing and rearrangement kernels (no measurement yet; structure of the formulas above, [I]):
# gather_rows streams every output row (owned rows copied, the others zero-filled) at the local
# copy rate with the per-call copy cost, plus a few cycles per id to load it, compare it with
# the block's two bounds and form the row address.
GATHER_CYCLES_PER_ID = 4
# transpose moves one element at a time (a load and a store each, no 64-bit packing).
TRANSPOSE_CYCLES_PER_ELEMENT = 2


def gather_rows_cycles(ids: int, out_bytes: int) -> int:
    """One tile's row gather: ``ids`` ids, ``out_bytes`` bytes of output rows written."""
    copy = -(-out_bytes // ipu21.LOCAL_COPY_BYTES_PER_CYCLE) + ipu21.LOCAL_COPY_CALL_CYCLES
    return copy + GATHER_CYCLES_PER_ID * ids


def transpose_cycles(elements: int) -> int:
    """One tile's local transpose of a staged block of ``elements`` elements."""
    return ipu21.LOCAL_COPY_CALL_CYCLES + TRANSPOSE_CYCLES_PER_ELEMENT * elements


def concat_cycles(input_bytes: list[int]) -> int:
    """Side-by-side copy of the inputs: one local copy per input (facts §12.1 rate)."""
    return sum(
        -(-b // ipu21.LOCAL_COPY_BYTES_PER_CYCLE) + ipu21.LOCAL_COPY_CALL_CYCLES
        for b in input_bytes
    )


def argmax_cycles(in_elements: int) -> int:
    """Row argmax: one compare per input element, at the elementwise add rate [I]."""
    return elementwise_cycles("add", in_elements)

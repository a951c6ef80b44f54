"""Cycle models of the non-GEMM tile kernels (one tile, one call, launch excluded).

Sources: `shared/docs/ipu21-facts.md` §12 (reference cost constants, [T]), §14.1 (kernels
measured on a C600, one row each, [T]) and §14.3 (the reference's formulas fitted to C600
measurements of its F16 GeLU and reduce-add, [T]); linear fits through points are ours [I].
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.target import ipu21
from ipu_stack.target.attention_cycles import flash_attention_cycles

# facts §14.1: LayerNorm over 1,152 elements of one row takes 6,732 cycles.
LAYER_NORM_CYCLES_PER_ELEMENT = 6732 / 1152
# facts §14.1: segmented softmax over 729 keys of one row takes 5,232 cycles.
SOFTMAX_CYCLES_PER_ELEMENT = 5232 / 729
# facts §12.2: GeLU 10 cycles per element (a planner constant of the reference's HEAD, not a
# measurement): the cost of every GeLU-like kind but the F16 tanh GeLU below.
GELU_CYCLES_PER_ELEMENT = 10
# facts §14.3 [T]: the reference's F16 GeLU (tanh form) after its kernel-loop upgrade, fitted
# by the reference to C600 measurements: 300 + 366 * ceil(n / 96) cycles over n elements.
GELU_TANH_F16_FIXED_CYCLES = 300
GELU_TANH_F16_CYCLES_PER_CHUNK = 366
GELU_TANH_F16_CHUNK = 96
# facts §14.3 [T]: reduce-add of P partials over n elements (the same upgrade, F16 partials of
# the F16 AMP GEMMs): 282 + 6 * ceil(n / 48) * (11 + 2 * (P - 1)) cycles.
REDUCE_ADD_F16_FIXED_CYCLES = 282
REDUCE_ADD_F16_CHUNK = 48
REDUCE_ADD_F16_CHUNK_CYCLES = 6
REDUCE_ADD_F16_BASE_BUNDLES = 11
REDUCE_ADD_F16_BUNDLES_PER_PARTIAL = 2
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


def gelu_tanh_f16_cycles(elements: int) -> int:
    """The measured F16 tanh GeLU (facts §14.3) over ``elements`` elements, launch excluded."""
    chunks = -(-elements // GELU_TANH_F16_CHUNK)
    return GELU_TANH_F16_FIXED_CYCLES + GELU_TANH_F16_CYCLES_PER_CHUNK * chunks


def gelu_cycles(elements: int, approximate: str, dtype: str) -> int:
    """A GeLU call over ``elements`` outputs, launch excluded: the measured formula for the
    F16 tanh form, the planner constant of facts §12.2 otherwise (exact erf, F32)."""
    if approximate == "tanh" and dtype == "f16":
        return gelu_tanh_f16_cycles(elements)
    return GELU_CYCLES_PER_ELEMENT * elements


def reduce_add_cycles(partials: Any, elements: Any, dtype: str) -> Any:
    """``out = sum of partials`` over ``elements`` elements (ints or NumPy arrays), launch
    excluded. F16: the cheaper of the add fit of facts §14.1 (one pass per added partial) and
    the measured reduce-add of facts §14.3 (one pass over all partials); both are measured
    kernels, and a reduction of many partials is cheaper in the second. Other precisions: the
    add fit."""
    added = np.asarray(partials) - 1
    by_adds = np.ceil(ipu21.ADD_FIXED_CYCLES + ipu21.ADD_CYCLES_PER_ELEMENT * added * elements)
    cycles = by_adds.astype(np.int64)
    if dtype == "f16":
        chunks = -(-np.asarray(elements) // REDUCE_ADD_F16_CHUNK)
        bundles = REDUCE_ADD_F16_BASE_BUNDLES + REDUCE_ADD_F16_BUNDLES_PER_PARTIAL * added
        by_pass = REDUCE_ADD_F16_FIXED_CYCLES + REDUCE_ADD_F16_CHUNK_CYCLES * chunks * bundles
        cycles = np.minimum(cycles, by_pass)
    return int(cycles) if cycles.ndim == 0 else cycles


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

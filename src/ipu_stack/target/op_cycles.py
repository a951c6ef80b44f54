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


def elementwise_cycles(kind: str, elements: int, in_bytes: int = 0, out_bytes: int = 0) -> int:
    """Cycles of an elementwise kernel over ``elements`` outputs."""
    if kind in ("add", "mul"):
        return int(ipu21.ADD_FIXED_CYCLES + ipu21.ADD_CYCLES_PER_ELEMENT * elements + 0.999)
    if kind == "gelu":
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

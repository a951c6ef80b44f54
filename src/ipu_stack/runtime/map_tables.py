"""Unary elementwise calls with an f16 input and an f16 output, by a table of all 65,536 inputs.

Such a call's result is ``f16(semantics(f32(x)))`` element by element, so it is a function of
the input's 16 bits: the table is those semantics (``sim.map_semantics``, unchanged) evaluated
once on every f16 bit pattern and rounded as the output write rounds them, and a call is one
lookup per element. The bits are the same as evaluating each call (NumPy's f32 ufuncs and
SciPy's ``erf`` are elementwise: an element's result does not depend on its neighbours). For
the batch-4 SigLIP MLP's GeLU (12.5 M elements) this replaces an ``erf`` of every element
and two f16 conversions (NumPy's are scalar code, ~2.5 ns an element).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ipu_stack.low.program import MapCall

#: kinds whose semantics are elementwise in their one input (attributes fixed per table)
TABLE_KINDS = frozenset({"gelu"})

_ALL_F16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def by_table(call: MapCall) -> bool:
    """Whether ``call`` is a unary table-driven call: f16 in, f16 out, same shape."""
    if call.kind not in TABLE_KINDS or len(call.inputs) != 1:
        return False
    x, out = call.inputs[0], call.out
    return (x.dtype, out.dtype, x.rows, x.cols) == ("f16", "f16", out.rows, out.cols)


class Tables:
    """The output bits of every f16 input, per kind and attributes (built when first used)."""

    def __init__(self, semantics: Callable[[MapCall, list[np.ndarray]], np.ndarray]) -> None:
        self.semantics = semantics
        self.held: dict[tuple, np.ndarray] = {}

    def get(self, call: MapCall) -> np.ndarray:
        key = (call.kind, call.attrs)
        table = self.held.get(key)
        if table is None:
            with np.errstate(all="ignore"):  # inf and NaN inputs are in the table too
                result = self.semantics(call, [_ALL_F16.reshape(1, -1)])
                table = np.asarray(result).astype(np.float16).reshape(-1).view(np.uint16)
            self.held[key] = table
        return table


def f16_rows(tile_mem: np.ndarray, offset: int, rows: int, cols: int, stride: int) -> np.ndarray:
    """A ``(rows, cols)`` uint16 view of f16 elements in tile memory, rows ``stride`` bytes
    apart."""
    if rows == 0 or cols == 0:
        return np.zeros((rows, cols), np.uint16)
    span = tile_mem[offset : offset + (rows - 1) * stride + 2 * cols].view(np.uint16)
    return np.lib.stride_tricks.as_strided(span, (rows, cols), (stride, 2), writeable=True)

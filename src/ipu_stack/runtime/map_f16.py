"""Binary f16 elementwise calls (``add``, ``mul``) of a batch at once, with exact conversions.

The semantics (``sim.map_semantics``) are ``f16(f32(a) op f32(b))``, inputs broadcast against
the output. NumPy's f16 conversions are scalar code (~2.5 ns an element each way); here the
inputs are widened with bit operations and the result rounded with the GEMM fast path's
rounding (:mod:`ipu_stack.runtime.gemm_f16`), both exact for finite values below the f16
maximum; a batch outside that (an inf or NaN input, a result that rounds to inf) returns
False and is evaluated as before. Outputs are written straight into tile memory (pads as
zeros). Used for the bias adds after GEMMs (the batch-4 SigLIP MLP: 16 M elements).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ipu_stack.low.program import MapCall
from ipu_stack.runtime.gemm_f16 import f16_to_f32, finite_f16, to_f16_bits
from ipu_stack.runtime.map_tables import f16_rows

KINDS = {"add": np.add, "mul": np.multiply}

#: (tile, what the access is, ref, bytes, alignment) -> offset into the tile's memory array
Span = Callable[[int, str, object, int, int], int]


def binary_f16(call: MapCall) -> bool:
    """Whether ``call`` is an f16 ``add``/``mul`` whose inputs broadcast by rows or columns."""
    if call.kind not in KINDS or len(call.inputs) != 2 or call.attrs:
        return False
    out = call.out
    return out.dtype == "f16" and all(
        v.dtype == "f16" and v.rows in (1, out.rows) and v.cols in (1, out.cols)
        for v in call.inputs
    )


def run_binary_f16(mem: np.ndarray, group: list[MapCall], span: Span) -> bool:
    """Evaluate ``group`` (calls of one kind and shapes on distinct tiles); False, with
    nothing written, where the exact shortcuts do not hold."""
    t0 = group[0]
    out = t0.out
    widened = []
    for i, v in enumerate(t0.inputs):
        bits = np.empty((len(group), v.rows, v.cols), np.uint16)
        for j, call in enumerate(group):
            x = call.inputs[i]
            at = span(call.tile, f"{call.kind} input {i}", x.ref, (x.rows - 1) * x.stride
                      + 2 * x.cols, 4)  # fmt: skip
            bits[j] = f16_rows(mem[call.tile], at, x.rows, x.cols, x.stride)
        if not finite_f16(bits):
            return False
        wide = np.empty(bits.shape, np.float32)
        f16_to_f32(bits.view(np.float16), wide)
        widened.append(wide)
    result = KINDS[t0.kind](widened[0], widened[1])
    result = np.broadcast_to(result, (len(group), out.rows, out.cols))
    bits16 = to_f16_bits(result)
    if bits16 is None:
        return False  # a result rounds to inf: NumPy's conversion
    for j, call in enumerate(group):
        o = call.out
        at = span(call.tile, f"{call.kind} output", o.ref, o.rows * o.stride, 8)
        rows = mem[call.tile, at : at + o.rows * o.stride].reshape(o.rows, -1)
        rows[:, 2 * o.cols :] = 0  # pads are written as zeros
        rows[:, : 2 * o.cols].view(np.uint16)[...] = bits16[j]
    return True

"""NumPy semantics of the integer, indexing and rearrangement tile kernels.

The simulator's :func:`~ipu_stack.runtime.sim.map_semantics` hands these kernels here (the
kernel registry names this module as their reference):

- ``gather_rows``: ``out[i] = table[ids[i] - row_offset]`` for the ids this tile's table
  block holds (``row_offset <= id < row_offset + rows``), zero rows for the others; an id
  outside the whole table ``[0, table_rows)`` is a fault naming the ids value, position, id.
- ``transpose``: ``out = staging[:, col_offset:col_offset + out.rows].T``.
- ``concat``: the inputs side by side along the columns.
- ``argmax``: index of the first maximum of each row (i32, one column).
- ``equal`` (i32 0/1), ``where`` (``cond != 0``), and ``add``/``mul``/``cast`` when a side is
  i32: integer arithmetic wraps like int32; float -> i32 rounds toward zero (NaN -> 0,
  saturating), i32 -> float rounds to nearest.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.errors import SimulationError
from ipu_stack.low.program import MapCall

#: MapCall kinds defined here (besides add/mul/cast on i32)
INDEXING_KERNELS = ("gather_rows", "transpose", "concat", "argmax", "equal", "where")
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


def handles(call: MapCall) -> bool:
    """Whether this module defines ``call``'s semantics."""
    if call.kind in INDEXING_KERNELS:
        return True
    return call.kind in ("add", "mul", "cast") and "i32" in (
        call.out.dtype,
        *(v.dtype for v in call.inputs),
    )


def indexing_semantics(call: MapCall, args: list[np.ndarray]) -> np.ndarray:
    """The result of one call (before rounding to the output precision)."""
    kind = call.kind
    if kind == "gather_rows":
        return _gather_rows(call, args[0], args[1])
    if kind == "transpose":
        c0 = int(call.attr("col_offset"))
        return np.ascontiguousarray(args[0][:, c0 : c0 + call.out.rows].T)
    if kind == "concat":
        return np.concatenate(args, axis=1)
    if kind == "argmax":
        return np.argmax(args[0].astype(np.float64), axis=1)[:, None].astype(np.int32)
    if kind == "equal":
        return (args[0] == args[1]).astype(np.int32)
    if kind == "where":
        return np.where(args[0] != 0, args[1], args[2])
    if kind in ("add", "mul"):
        a, b = (x.astype(np.int64) for x in args)
        wide = a + b if kind == "add" else a * b
        return ((wide - _I32_MIN) % 2**32 + _I32_MIN).astype(np.int32)
    if kind == "cast":
        if call.out.dtype == "i32":
            t = np.trunc(np.nan_to_num(args[0].astype(np.float64), nan=0.0))
            return np.clip(t, _I32_MIN, _I32_MAX).astype(np.int32)
        return args[0].astype(np.float64)
    raise SimulationError(f"no semantics for kernel kind {kind!r}")


def _gather_rows(call: MapCall, table: np.ndarray, ids2: np.ndarray) -> np.ndarray:
    ids = ids2.reshape(-1).astype(np.int64)[: call.out.rows]
    total = int(call.attr("table_rows"))
    bad = np.flatnonzero((ids < 0) | (ids >= total))
    if bad.size:
        shape = tuple(int(d) for d in str(call.attr("ids_shape")).split(","))
        pos = tuple(int(i) for i in np.unravel_index(int(bad[0]), shape))
        raise SimulationError(
            f"{call.attr('op')}: ids {call.attr('ids_name')!r} at position {pos} holds "
            f"{int(ids[bad[0]])}, outside the table's {total} rows [0, {total})"
        )
    r0 = int(call.attr("row_offset"))
    local = ids - r0
    owned = (local >= 0) & (local < table.shape[0])
    out = np.zeros((ids.size, table.shape[1]), dtype=table.dtype)
    out[owned] = table[local[owned]]
    return out

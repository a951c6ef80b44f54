"""ComputeGraph operations on integers and indices: gather, concat, argmax, equal, where.

:class:`IndexingOps` is a base of :class:`~ipu_stack.graph.compute_graph.ComputeGraph`; the
methods here build operations with the same shape rules and error style as the rest of the
graph. :func:`reference_indexing` is their float64/int64 NumPy reference (and that of integer
``add``/``mul``/``cast``), used by ``evaluate_reference``.

Integers are ``i32``: ``add``/``mul`` of two i32 operands wrap like int32, ``cast`` to i32
rounds toward zero (ONNX ``Cast`` float -> int), ``equal`` gives 0/1 in i32, ``argmax`` gives
i32 indices (the first maximum).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ipu_stack.errors import GraphError

if TYPE_CHECKING:
    from ipu_stack.graph.compute_graph import Operation, Value

#: kinds whose operands or outputs may be i32
I32_KINDS = (
    "add",
    "mul",
    "cast",
    "view",
    "transpose",
    "slice",
    "concat",
    "gather",
    "argmax",
    "equal",
    "where",
    "repeat",  # a loop body may read i32 invariants (a padding mask's condition)
)
#: kinds defined in this module (the reference dispatches on them)
INDEXING_KINDS = ("gather", "concat", "argmax", "equal", "where")

_I32_MIN, _I32_SPAN = -(2**31), 2**32


class IndexingOps:
    """Builders of the integer and indexing operations (a base of ComputeGraph)."""

    __slots__ = ()

    if TYPE_CHECKING:

        def _check(self, value: Value) -> Value: ...
        def _name(self, kind: str, name: str | None) -> str: ...
        def _same_dtype(self, op_name: str, *vs: Value) -> str: ...
        def _broadcast(
            self, op_name: str, a: Value, b: Value, sa: tuple[int, ...], sb: tuple[int, ...]
        ) -> tuple[int, ...]: ...
        def _op(
            self,
            kind: str,
            inputs: Sequence[Value],
            shape: Sequence[int],
            dtype: str,
            name: str | None,
            scale_exponent: int = 0,
            **attrs: Any,
        ) -> Value: ...
        def transpose(self, x: Value, perm: Sequence[int], name: str | None = None) -> Value: ...
        def view(self, x: Value, shape: Sequence[int], name: str | None = None) -> Value: ...

    def gather(self, table: Value, ids: Value, name: str | None = None) -> Value:
        """Rows of ``table`` [V, D] picked by the i32 ``ids`` (any shape) at run time.

        The result has shape ``ids.shape + (D,)``. An id outside ``[0, V)`` is a run-time
        error naming the ids value, the position and the id.
        """
        table, ids = self._check(table), self._check(ids)
        op_name = self._name("gather", name)
        if len(table.shape) != 2 or table.dtype not in ("f16", "f32"):
            raise GraphError(
                f"{op_name}: the table {table.name!r} must be a 2-D f16 or f32 value, got "
                f"{table.dtype} {table.shape}"
            )
        if ids.dtype != "i32":
            raise GraphError(f"{op_name}: ids {ids.name!r} must be i32, got {ids.dtype}")
        return self._op("gather", (table, ids), (*ids.shape, table.shape[1]), table.dtype, op_name)

    def concat(self, values: Sequence[Value], axis: int, name: str | None = None) -> Value:
        """Join values of one precision along ``axis`` (the other axes must be equal)."""
        values = [self._check(v) for v in values]
        op_name = self._name("concat", name)
        if not values:
            raise GraphError(f"{op_name}: concat needs at least one value")
        dtype = self._same_dtype(op_name, *values)
        rank = len(values[0].shape)
        if not -rank <= axis < rank:
            raise GraphError(f"{op_name}: axis {axis} out of range for rank {rank}")
        axis %= rank
        for v in values:
            same = len(v.shape) == rank and all(
                d == e
                for i, (d, e) in enumerate(zip(v.shape, values[0].shape, strict=False))
                if i != axis
            )
            if not same:
                raise GraphError(
                    f"{op_name}: {v.name!r} {v.shape} does not match {values[0].name!r} "
                    f"{values[0].shape} outside axis {axis}"
                )
        shape = list(values[0].shape)
        shape[axis] = sum(v.shape[axis] for v in values)
        return self._op("concat", values, shape, dtype, op_name, axis=axis)

    def argmax(
        self, x: Value, axis: int = -1, keepdims: bool = False, name: str | None = None
    ) -> Value:
        """Index (i32) of the first maximum along ``axis``.

        Built as a transpose that brings ``axis`` last (if needed), an ``argmax`` over the
        last axis (keeping it, extent 1) and a view to the requested shape.
        """
        x = self._check(x)
        op_name = self._name("argmax", name)
        rank = len(x.shape)
        if not -rank <= axis < rank:
            raise GraphError(f"{op_name}: axis {axis} out of range for {x.name!r} {x.shape}")
        if x.dtype not in ("f16", "f32", "i32"):
            raise GraphError(f"{op_name}: argmax takes f16, f32 or i32, not {x.dtype}")
        axis %= rank
        src = x
        if axis != rank - 1:
            perm = [a for a in range(rank) if a != axis] + [axis]
            src = self.transpose(x, perm, name=f"{op_name}/to_last")
        last = self._op("argmax", (src,), (*src.shape[:-1], 1), "i32", op_name)
        shape = [1 if a == axis else d for a, d in enumerate(x.shape)]
        if not keepdims:
            shape = [d for a, d in enumerate(x.shape) if a != axis] or [1]
        if tuple(shape) == last.shape:
            return last
        return self.view(last, shape, name=f"{op_name}/shape")

    def equal(self, a: Value, b: Value, name: str | None = None) -> Value:
        """1 where ``a == b`` else 0 (i32), with NumPy broadcasting."""
        a, b = self._check(a), self._check(b)
        op_name = self._name("equal", name)
        self._same_dtype(op_name, a, b)
        shape = self._broadcast(op_name, a, b, a.shape, b.shape)
        return self._op("equal", (a, b), shape, "i32", op_name)

    def where(self, cond: Value, a: Value, b: Value, name: str | None = None) -> Value:
        """``a`` where ``cond`` (i32 0/1) is non-zero, else ``b``; all three broadcast."""
        cond, a, b = self._check(cond), self._check(a), self._check(b)
        op_name = self._name("where", name)
        if cond.dtype != "i32":
            raise GraphError(f"{op_name}: condition {cond.name!r} must be i32, got {cond.dtype}")
        dtype = self._same_dtype(op_name, a, b)
        if dtype == "f8":
            raise GraphError(f"{op_name}: where does not take F8 operands; cast them first")
        try:
            shape = tuple(np.broadcast_shapes(cond.shape, a.shape, b.shape))
        except ValueError:
            raise GraphError(
                f"{op_name}: shapes {cond.shape}, {a.shape} and {b.shape} of {cond.name!r}, "
                f"{a.name!r} and {b.name!r} do not broadcast"
            ) from None
        return self._op("where", (cond, a, b), shape, dtype, op_name)

    def _attention_mask(self, op_name: str, q: Value, k: Value, mask: Value | None) -> list[Value]:
        """The mask operand of flash_attention, checked (empty list when there is none)."""
        if mask is None:
            return []
        mask = self._check(mask)
        scores = (*q.shape[:-1], k.shape[-2])
        try:
            ok = tuple(np.broadcast_shapes(mask.shape, scores)) == scores
        except ValueError:
            ok = False
        if not ok or mask.dtype != q.dtype:
            raise GraphError(
                f"{op_name}: mask {mask.name!r} {mask.dtype} {mask.shape} must be {q.dtype} and "
                f"broadcast to the scores {scores}"
            )
        return [mask]


def wrap_int32(x: np.ndarray) -> np.ndarray:
    """Integers reduced modulo 2**32 into the int32 range (as int64)."""
    return (np.asarray(x, dtype=np.int64) - _I32_MIN) % _I32_SPAN + _I32_MIN


def cast_to_int32(x: np.ndarray) -> np.ndarray:
    """Float -> int32 rounding toward zero (ONNX Cast); NaN -> 0, out of range saturates."""
    t = np.trunc(np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0))
    return np.clip(t, _I32_MIN, 2**31 - 1).astype(np.int64)


def check_ids(ids: np.ndarray, rows: int, what: str, ids_name: str) -> None:
    """Raise ``GraphError`` for the first id outside ``[0, rows)``."""
    bad = np.flatnonzero((ids < 0) | (ids >= rows))
    if bad.size:
        pos = tuple(int(i) for i in np.unravel_index(int(bad[0]), ids.shape))
        value = int(ids.reshape(-1)[bad[0]])
        raise GraphError(
            f"{what}: ids {ids_name!r} at position {pos} holds {value}, outside the table's "
            f"{rows} rows [0, {rows})"
        )


def reference_indexing(
    op: Operation, args: list[np.ndarray], out_dtype: str, names: Sequence[str]
) -> np.ndarray:
    """NumPy reference of the operations of this module and of i32 add/mul/cast.

    ``args`` are float64 (float values) or int64 (i32 values); ``names`` the operand names.
    """
    if op.kind == "gather":
        table, ids = args
        ids = ids.astype(np.int64)
        check_ids(ids, table.shape[0], op.name, names[1])
        return table[ids]
    if op.kind == "concat":
        return np.concatenate(args, axis=op.attr("axis"))
    if op.kind == "argmax":
        return np.argmax(args[0], axis=-1)[..., None].astype(np.int64)
    if op.kind == "equal":
        return (args[0] == args[1]).astype(np.int64)
    if op.kind == "where":
        return np.where(args[0] != 0, args[1], args[2])
    if op.kind in ("add", "mul"):
        a, b = (np.asarray(x, dtype=np.int64) for x in args)
        return wrap_int32(a + b if op.kind == "add" else a * b)
    if op.kind == "cast":
        return cast_to_int32(args[0]) if out_dtype == "i32" else args[0].astype(np.float64)
    raise GraphError(f"{op.name}: no reference for operation kind {op.kind!r}")

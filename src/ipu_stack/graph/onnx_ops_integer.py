"""ONNX boolean and integer operators, and ``GatherND``, as exporters write them around masks.

BERT's padding mask and CLIP-text's end-of-text pooling reach the importer as chains of
``Cast``/``And``/``Expand``/``Where``/``GatherND`` on ``int64``/``bool`` tensors. What folds
to a constant is folded before emission; what depends on a run-time input is computed on the
tiles in ``i32``: booleans are i32 0/1, integer constants become i32 parameters (a value
outside int32 is refused at import, naming the constant and the value), int64 host inputs
are checked to fit int32 when fed.

- ``And``/``Or``/``Xor``/``Not`` of 0/1 values: ``a * b``; ``where(a + b, 1, 0)``;
  ``where(a == b, 0, 1)``; ``where(a, 0, 1)`` (i32 ``where`` tests its condition ``!= 0``);
- ``Cast`` to ``bool``: ``x != 0``, as ``where(x, 1, 0)`` for an integer value and
  ``where(x == 0, 0, 1)`` for a float one;
- ``Where`` with a run-time condition: the graph ``where``;
- ``Expand``: a broadcast, emitted as an add of zeros shaped like the new axes only;
- ``Sub`` of two i32 values: ``a + b * -1``;
- ``CumSum`` (RoBERTa's position ids, ``cumsum(ids != pad) * mask + pad``): a GEMM with a
  constant triangle of ones along the summed axis, in f32 for i32 values (exact below 2**24;
  the extent is at most ``MAX_CUMSUM_EXTENT``) and cast back;
- ``GatherND``: with constant indices, the picked rows as slices (+ a concat); with run-time
  indices, one row ``gather`` from the data viewed as ``[rows, rest]`` at the flat row
  ``sum_k idx[..., k] * stride_k`` computed in i32 (batch axes as constant components); for
  more than one component, each component is range-checked by a gather of its own from a
  ``[extent, 1]`` table of zeros whose (zero) result is added to the flat index, so an index
  outside its axis faults naming the component and the value instead of landing on another
  row. Negative run-time indices are refused the same way (negative constant ones are
  normalised). Indices built by a ``Concat`` (CLIP-text: ``[arange(B), argmax(ids)]``) are
  taken apart: constant components are checked at import and folded into a row offset, and a
  component that is an ``ArgMax`` over an axis no longer than the indexed one needs no check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from onnx import NodeProto, TensorProto

from ipu_stack.errors import GraphError
from ipu_stack.graph.compute_graph import Value
from ipu_stack.graph.onnx_ops import Emitter, _int, _required_constant, as_f32
from ipu_stack.graph.onnx_ops_exported import EMITTERS as EXPORTED
from ipu_stack.graph.onnx_ops_exported import take_indices
from ipu_stack.graph.onnx_patterns import GemmFusion, OnnxIndex

if TYPE_CHECKING:
    from ipu_stack.graph.onnx_import import Importer

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def int32_constant(name: str, array: np.ndarray) -> np.ndarray:
    """An integer or boolean ONNX constant as int32, or GraphError naming a value outside."""
    array = np.asarray(array)
    if array.dtype.kind == "b":
        return array.astype(np.int32)
    if array.dtype.kind == "f" and not np.all(np.isfinite(array) & (array == np.trunc(array))):
        raise GraphError(f"constant {name!r} is used as an integer but holds non-integers")
    wide = array.astype(np.float64) if array.dtype.kind == "f" else array
    bad = np.flatnonzero(
        (wide > INT32_MAX) | ((wide < INT32_MIN) if wide.dtype.kind != "u" else False)
    )
    if bad.size:
        raise GraphError(
            f"integer constant {name!r} holds {int(wide.reshape(-1)[bad[0]])} at flat position "
            f"{int(bad[0])}, outside int32 [{INT32_MIN}, {INT32_MAX}] (ipu-stack computes "
            "integers in int32)"
        )
    return wide.astype(np.int32)


def check_int32_input(name: str, array: np.ndarray) -> None:
    """GraphError naming the first value of host input ``name`` outside int32."""
    wide = array.astype(np.int64) if array.dtype.kind in "biu" else array
    bad = np.flatnonzero((wide < INT32_MIN) | (wide > INT32_MAX))
    if bad.size:
        at = tuple(int(i) for i in np.unravel_index(int(bad[0]), array.shape))
        raise GraphError(
            f"ONNX graph input {name!r} holds {wide.reshape(-1)[bad[0]]} at position {at}, "
            "outside int32 (ipu-stack computes integers in int32)"
        )


def _i32(imp: Importer, name: str) -> Value:
    """The value of ONNX tensor ``name`` as i32 (booleans and integers are i32 on chip)."""
    v = imp.value(name)
    if v.dtype != "i32":
        raise GraphError(f"{name!r} is {v.dtype}; a boolean or integer operand is expected")
    return v


def _const_i32(imp: Importer, base: str, role: str, array: np.ndarray) -> Value:
    """A fresh i32 parameter holding ``array``."""
    data = np.asarray(array, dtype=np.int32).reshape(np.shape(array) or (1,))
    value = imp.graph.parameter(imp._fresh(f"{base}.{role}"), data.shape, "i32")
    imp.bindings.parameters[value.name] = data
    return value


def is_zero(imp: Importer, x: Value, base: str, name: str) -> Value:
    """1 where ``x == 0`` else 0 (i32); ``x`` i32 or float."""
    if x.dtype == "i32":
        return select(imp, x, 0, 1, base, name)
    zero = imp.derived(base, "zero", np.zeros(1), x)
    return imp.graph.equal(x, zero, name=imp.op_name(name))


def select(imp: Importer, cond: Value, if_true: int, if_false: int, base: str, name: str) -> Value:
    """``if_true`` where the i32 ``cond`` is non-zero, else ``if_false`` (one i32 where)."""
    a = _const_i32(imp, base, f"is{if_true}", np.full(1, if_true))
    b = _const_i32(imp, base, f"is{if_false}", np.full(1, if_false))
    return imp.graph.where(cond, a, b, name=imp.op_name(name))


def emit_and(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    a, b = _i32(imp, node.input[0]), _i32(imp, node.input[1])
    return imp.graph.mul(a, b, name=imp.op_name(imp.label(node)))


def emit_or(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    out = imp.label(node)
    a, b = _i32(imp, node.input[0]), _i32(imp, node.input[1])
    total = imp.graph.add(a, b, name=imp.op_name(f"{out}/sum"))
    return select(imp, total, 1, 0, out, out)


def emit_xor(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    out = imp.label(node)
    a, b = _i32(imp, node.input[0]), _i32(imp, node.input[1])
    same = imp.graph.equal(a, b, name=imp.op_name(f"{out}/same"))
    return select(imp, same, 0, 1, out, out)


def emit_not(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    out = imp.label(node)
    return select(imp, _i32(imp, node.input[0]), 0, 1, out, out)


def emit_cast_bool(imp: Importer, node: NodeProto, gemm: GemmFusion | None) -> Value:
    """Cast to bool is ``x != 0`` (0/1 in i32); other casts as ``onnx_ops_exported``."""
    if _int(node, "to", 0) != TensorProto.BOOL:
        return EXPORTED["Cast"](imp, node, gemm)
    out, x = imp.label(node), imp.value(node.input[0])
    if imp.elem_types.get(node.input[0]) == TensorProto.BOOL:
        return x  # already 0/1
    if x.dtype == "i32":
        return select(imp, x, 1, 0, out, out)
    zero = is_zero(imp, x, out, f"{out}/is_zero")
    return select(imp, zero, 0, 1, out, out)


def emit_where(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """``Where(cond, a, b)`` with a run-time or constant condition (i32 0/1)."""
    cond, a, b = (imp.value(n) for n in node.input[:3])
    if cond.dtype != "i32":
        raise GraphError(f"condition {node.input[0]!r} is {cond.dtype}; Where needs a boolean")
    return imp.graph.where(cond, a, b, name=imp.op_name(imp.label(node)))


def emit_expand(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """``Expand(x, shape)``: NumPy broadcasting to ``shape`` (an add of zeros on new axes)."""
    out = imp.label(node)
    x = imp.value(node.input[0])
    target = [int(d) for d in _required_constant(imp, node, 1, "shape").reshape(-1)]
    try:
        shape = tuple(np.broadcast_shapes(x.shape, tuple(target)))
    except ValueError:
        raise GraphError(f"shape {target} does not broadcast with the input {x.shape}") from None
    if shape == x.shape or (not shape and x.shape == (1,)):
        return x
    padded = (1,) * (len(shape) - len(x.shape)) + x.shape
    zeros_shape = tuple(1 if p == s else s for p, s in zip(padded, shape, strict=True))
    if x.dtype == "i32":
        zeros = _const_i32(imp, out, "broadcast", np.zeros(zeros_shape))
    else:
        zeros = imp.derived(out, "broadcast", np.zeros(zeros_shape), x)
    return imp.graph.add(x, zeros, name=imp.op_name(out))


#: the longest axis a CumSum is taken over (its triangle of ones is extent**2 f32 weights)
MAX_CUMSUM_EXTENT = 2048


def emit_cumsum(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """``CumSum(x, axis)`` as ``x @ T`` along the axis, ``T`` a constant triangle of ones
    (``exclusive`` drops the diagonal, ``reverse`` mirrors it); i32 values are summed in f32
    (exact while every partial sum stays below 2**24) and cast back."""
    g, out = imp.graph, imp.label(node)
    x = imp.value(node.input[0])
    rank = len(x.shape)
    axis_value = _required_constant(imp, node, 1, "axis")
    axis = int(np.asarray(axis_value).reshape(-1)[0])
    if not -rank <= axis < rank:
        raise GraphError(f"axis {axis} out of range for shape {x.shape}")
    axis %= rank
    n = x.shape[axis]
    if n > MAX_CUMSUM_EXTENT:
        raise GraphError(
            f"axis {axis} of {x.shape} is {n} long; CumSum is taken over at most "
            f"{MAX_CUMSUM_EXTENT} (a {n} x {n} triangle of weights)"
        )
    i, j = np.indices((n, n))
    ones = (i >= j) if _int(node, "reverse", 0) else (i <= j)
    if _int(node, "exclusive", 0):
        ones &= i != j
    work = g.cast(x, "f32", name=imp.op_name(f"{out}/f32")) if x.dtype == "i32" else x
    perm = [a for a in range(rank) if a != axis] + [axis]
    moved = work if axis == rank - 1 else g.transpose(work, perm, name=imp.op_name(f"{out}/last"))
    rows = g.view(moved, [int(np.prod(moved.shape[:-1])), n], name=imp.op_name(f"{out}/rows"))
    triangle = imp.derived(out, "triangle", ones.astype(np.float64), work)
    summed = g.gemm(rows, triangle, name=imp.op_name(f"{out}/sums"))
    y = g.view(summed, moved.shape, name=imp.op_name(f"{out}/shape"))
    if axis != rank - 1:
        back = [perm.index(a) for a in range(rank)]
        y = g.transpose(y, back, name=imp.op_name(f"{out}/back"))
    return g.cast(y, "i32", name=imp.op_name(out)) if x.dtype == "i32" else y


def emit_gather_elements(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """``GatherElements(data, indices, axis)`` with constant ``data`` whose every line along
    ``axis`` is the same (RoBERTa gathers its zero token-type buffer at the position ids): a
    table lookup of that line at the run-time indices, which faults on an index outside it.
    Integer data is looked up in f32 (exact below 2**24) and cast back to i32."""
    g, out = imp.graph, imp.label(node)
    data = imp.constant(node.input[0])
    if data is None:
        return _gather_computed_elements(imp, node)
    data = np.asarray(data)
    ids = imp.value(node.input[1])
    rank = data.ndim
    axis = _int(node, "axis", 0)
    if rank != len(ids.shape) or not -rank <= axis < rank:
        raise GraphError(f"axis {axis} of data {data.shape} with indices {ids.shape}")
    lines = np.moveaxis(data, axis % rank, -1).reshape(-1, data.shape[axis])
    if not (lines == lines[:1]).all():
        raise GraphError(
            f"data {data.shape} differs between its lines along axis {axis % rank} "
            "(only a table repeated along the other axes is supported)"
        )
    integer = data.dtype.kind in "iub"
    if integer and np.abs(lines[0].astype(np.int64)).max(initial=0) >= 2**24:
        raise GraphError("integer data beyond 2**24 cannot be looked up exactly")
    dtype = "f32" if integer else imp.value(node.input[0]).dtype
    table = imp._new_parameter(f"{out}.table", lines[0].reshape(-1, 1).astype(np.float64), dtype)
    picked = g.gather(table, ids, name=imp.op_name(f"{out}/lookup"))
    y = g.view(picked, ids.shape, name=imp.op_name(f"{out}/shape"))
    return g.cast(y, "i32", name=imp.op_name(out)) if integer else y


def _gather_computed_elements(imp: Importer, node: NodeProto) -> Value:
    """``GatherElements`` of run-time data at constant indices (DeBERTa's relative-position
    scores): each output element is one element of the data, so the data is viewed as a table
    of one-element rows (F32: whole words; F16 data is gathered in F32 and cast back) and
    looked up at the flat positions the indices name."""
    g, out = imp.graph, imp.label(node)
    found = imp.constant(node.input[1])
    if found is None:
        raise GraphError(
            "both the data and the indices are computed at run time (one must be constant)"
        )
    idx = np.asarray(found).astype(np.int64)
    x = imp.value(node.input[0])
    rank = len(x.shape)
    axis = _int(node, "axis", 0)
    if idx.ndim != rank or not -rank <= axis < rank:
        raise GraphError(f"axis {axis} of data {x.shape} with indices {idx.shape}")
    axis %= rank
    extent = x.shape[axis]
    if any(t > d for a, (t, d) in enumerate(zip(idx.shape, x.shape, strict=True)) if a != axis):
        raise GraphError(f"indices {idx.shape} are larger than the data {x.shape} off axis {axis}")
    bad = (idx < -extent) | (idx >= extent)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise GraphError(
            f"index {int(idx[first])} at {first} is outside axis {axis} of length {extent}"
        )
    grid: list[np.ndarray] = [np.asarray(a) for a in np.indices(idx.shape)]
    grid[axis] = np.where(idx < 0, idx + extent, idx)
    flat = np.ravel_multi_index(tuple(grid), x.shape).reshape(-1)
    size = int(np.prod(x.shape))
    work = as_f32(imp, x, f"{out}/f32")
    table = g.view(work, [size, 1], name=imp.op_name(f"{out}/elements"))
    ids = _const_i32(imp, out, "positions", flat)
    picked = g.gather(table, ids, name=imp.op_name(f"{out}/lookup"))
    y = g.view(picked, list(idx.shape), name=imp.op_name(f"{out}/shape"))
    return g.cast(y, "f16", name=imp.op_name(out)) if x.dtype == "f16" else y


def emit_sub_i32(imp: Importer, node: NodeProto, gemm: GemmFusion | None) -> Value:
    """``a - b`` of i32 values as ``a + b * -1``; float subtraction as before."""
    a_const, b_const = imp.constant(node.input[0]), imp.constant(node.input[1])
    a = imp.value(node.input[0]) if a_const is None else None
    b = imp.value(node.input[1]) if b_const is None else None
    integer = any(v is not None and v.dtype == "i32" for v in (a, b))
    if not integer:
        return EXPORTED["Sub"](imp, node, gemm)
    out = imp.label(node)
    left = a if a is not None else imp.value(node.input[0])
    if b_const is not None:
        negated = _const_i32(imp, out, "negated", -int32_constant(node.input[1], b_const))
        return imp.graph.add(left, negated, name=imp.op_name(out))
    assert b is not None
    minus = _const_i32(imp, out, "minus_one", np.full(1, -1))
    neg = imp.graph.mul(b, minus, name=imp.op_name(f"{out}/negated"))
    return imp.graph.add(left, neg, name=imp.op_name(out))


# -- GatherND -----------------------------------------------------------------------------------
def _rows_view(imp: Importer, data: Value, lead: int, out: str) -> Value:
    """``data`` viewed as ``[prod(shape[:lead]), prod(shape[lead:])]``."""
    rows = int(np.prod(data.shape[:lead]))
    rest = int(np.prod(data.shape[lead:]))
    if data.shape == (rows, rest):
        return data
    return imp.graph.view(data, (rows, rest), name=imp.op_name(f"{out}/rows"))


def emit_gather_nd(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """``GatherND(data, indices, batch_dims)`` (see the module docstring for the lowering)."""
    g, out = imp.graph, imp.label(node)
    data = imp.value(node.input[0])
    batch = _int(node, "batch_dims", 0)
    const = imp.constant(node.input[1])
    known = imp.index.shapes.get(node.input[1])
    if const is not None:
        idx_shape = tuple(const.shape)
    else:  # a Concat taken apart (``gather_nd_operands``) is not emitted: use its ONNX shape
        idx_shape = tuple(known) if known is not None else imp.value(node.input[1]).shape
    rank = len(data.shape)
    if not idx_shape:
        raise GraphError("indices are a scalar; GatherND needs rank >= 1 indices")
    k = idx_shape[-1]
    if batch < 0 or batch >= len(idx_shape) or batch + k > rank:
        raise GraphError(
            f"batch_dims {batch} and {k} index components do not fit data {data.shape} and "
            f"indices {idx_shape}"
        )
    if tuple(idx_shape[:batch]) != tuple(data.shape[:batch]):
        raise GraphError(f"batch axes of indices {idx_shape} and data {data.shape} differ")
    extents = data.shape[batch : batch + k]
    result_shape = (*idx_shape[:-1], *data.shape[batch + k :]) or (1,)
    table = _rows_view(imp, data, batch + k, out)
    # per-axis strides of a flat row over data.shape[:batch + k]
    lead = data.shape[: batch + k]
    strides = [int(np.prod(lead[i + 1 :])) for i in range(len(lead))]
    points = idx_shape[:-1]  # one gathered row per point
    batch_offset = np.zeros(points, dtype=np.int64)
    for axis in range(batch):
        shape = [1] * len(points)
        shape[axis] = points[axis]
        batch_offset = batch_offset + np.arange(points[axis]).reshape(shape) * strides[axis]
    if const is not None:
        index = np.asarray(const, dtype=np.int64)
        limit = np.array(extents, dtype=np.int64)
        if np.any(index < -limit) or np.any(index >= limit):
            raise GraphError(f"indices {index.reshape(-1, k).tolist()} out of range for axes "
                             f"{list(extents)} of data {data.shape}")  # fmt: skip
        index = np.where(index < 0, index + limit, index)
        flat = (batch_offset + (index * np.array(strides[batch:])).sum(axis=-1)).reshape(-1)
        joined = take_indices(imp, table, flat, 0, out)
        return g.view(joined, result_shape, name=imp.op_name(out))
    if table.dtype not in ("f16", "f32"):
        raise GraphError(f"run-time indices into {table.dtype} data are not supported (the row "
                         "gather takes f16 or f32 data)")  # fmt: skip
    offset = batch_offset
    flat_idx: Value | None = None
    for c, comp in enumerate(index_components(imp, node.input[1], k, points, out)):
        stride = strides[batch + c]
        if isinstance(comp, np.ndarray):  # a constant component: checked now, folded
            if np.any(comp < -extents[c]) or np.any(comp >= extents[c]):
                raise GraphError(f"constant index component {c} holds {comp.reshape(-1).tolist()}"
                                 f", out of range for axis {batch + c} ({extents[c]})")  # fmt: skip
            offset = offset + np.where(comp < 0, comp + extents[c], comp) * stride
            continue
        value, bound = comp
        if bound is None or bound > extents[c]:  # its own range check (see the docstring)
            zeros = imp.derived(out, f"axis{c}_rows", np.zeros((extents[c], 1)), table)
            check = g.gather(zeros, value, name=imp.op_name(f"{out}/axis{c}_in_range"))
            check = g.view(check, points or (1,), name=imp.op_name(f"{out}/axis{c}_zero"))
            value = g.add(value, g.cast(check, "i32", name=imp.op_name(f"{out}/axis{c}_i32")),
                          name=imp.op_name(f"{out}/index{c}/checked"))  # fmt: skip
        if stride != 1:
            value = g.mul(value, _const_i32(imp, out, f"stride{c}", np.full(1, stride)),
                          name=imp.op_name(f"{out}/index{c}/scaled"))  # fmt: skip
        if flat_idx is not None:
            value = g.add(flat_idx, value, name=imp.op_name(f"{out}/flat{c}"))
        flat_idx = value
    if flat_idx is None:  # every component constant (a fold would have caught it)
        raise GraphError("internal: GatherND with constant indices reached the run-time path")
    if np.any(offset):
        offsets = _const_i32(imp, out, "row_offsets", np.broadcast_to(offset, points or (1,)))
        flat_idx = g.add(flat_idx, offsets, name=imp.op_name(f"{out}/row_offsets"))
    rows_out = g.gather(table, flat_idx, name=imp.op_name(f"{out}/gather"))
    if rows_out.shape == result_shape:
        return rows_out
    return g.view(rows_out, result_shape, name=imp.op_name(out))


#: a GatherND index component: a constant array over the points, or an i32 value over the
#: points with an exclusive upper bound proven at import (None: unknown)
Component = np.ndarray | tuple[Value, int | None]


def argmax_bound(imp: Importer, name: str) -> int | None:
    """The extent of the reduced axis when ``name`` is an ArgMax result (through views and
    integer casts): its values are then in ``[0, extent)``; else None."""
    index = imp.index
    for _ in range(8):
        node = index.node_of(name, ("Unsqueeze", "Squeeze", "Reshape", "Cast", "ArgMax"))
        if node is None:
            return None
        if node.op_type == "ArgMax":
            shape = index.shapes.get(node.input[0])
            if shape is None or not shape:
                return None
            return int(shape[_int(node, "axis", 0) % len(shape)])
        if node.op_type == "Cast" and _int(node, "to", 0) not in (TensorProto.INT64,
                                                                  TensorProto.INT32):  # fmt: skip
            return None
        name = node.input[0]
    return None


def index_concat(index: OnnxIndex, name: str, rank: int) -> NodeProto | None:
    """The Concat along the last axis that builds GatherND indices ``name`` (of ``rank``) and
    feeds nothing else, else None."""
    concat = index.node_of(name, "Concat")
    if concat is None or _int(concat, "axis", 0) not in (-1, rank - 1):
        return None
    users = index.consumers.get(name, [])
    if name in index.graph_outputs or len(users) != 1:
        return None
    return concat


def gather_nd_operands(index: OnnxIndex, node: NodeProto) -> list[str]:
    """The tensors a GatherND needs: its inputs, with a Concat that builds its indices
    replaced by the Concat's inputs (``emit_gather_nd`` takes it apart, so it is dead)."""
    shape = index.shapes.get(node.input[1]) if len(node.input) > 1 else None
    concat = index_concat(index, node.input[1], len(shape)) if shape else None
    if concat is None or node.input[1] in index.constants:
        return list(node.input)
    return [node.input[0], *concat.input]


def index_components(
    imp: Importer, name: str, k: int, points: tuple[int, ...], out: str
) -> list[Component]:
    """The ``k`` components of run-time GatherND indices ``name`` ``[*points, k]``: a
    ``Concat`` along the last axis is taken apart (constant parts stay constant, an ArgMax
    part keeps its bound); anything else is sliced per component."""
    g = imp.graph
    parts: list[tuple[str, int]] = [(name, k)]
    concat = index_concat(imp.index, name, len(points) + 1)
    if concat is not None:
        widths = [imp.index.shapes.get(i, (0,))[-1] if imp.constant(i) is None
                  else imp.constant(i).shape[-1] for i in concat.input]  # type: ignore[union-attr]  # fmt: skip
        if sum(widths) == k and all(w > 0 for w in widths):
            parts = list(zip(concat.input, widths, strict=True))
    components: list[Component] = []
    for part, width in parts:
        const = imp.constant(part)
        if const is not None:
            arr = np.asarray(const, dtype=np.int64)
            components += [np.broadcast_to(arr[..., c], points) for c in range(width)]
            continue
        value = _i32(imp, part)
        bound = argmax_bound(imp, part) if width == 1 else None
        for c in range(width):
            column = value
            if width > 1 or value.shape[-1:] != (1,) or len(value.shape) != len(points) + 1:
                column = g.slice(value, [c], [c + 1], [len(value.shape) - 1],
                                 name=imp.op_name(f"{out}/index{len(components)}"))  # fmt: skip
            flat = g.view(
                column, points or (1,), name=imp.op_name(f"{out}/index{len(components)}/flat")
            )
            components.append((flat, bound))
    return components


EMITTERS: dict[str, Emitter] = {
    "And": emit_and,
    "Or": emit_or,
    "Xor": emit_xor,
    "Not": emit_not,
    "Cast": emit_cast_bool,
    "Where": emit_where,
    "Expand": emit_expand,
    "Sub": emit_sub_i32,
    "GatherND": emit_gather_nd,
    "CumSum": emit_cumsum,
    "GatherElements": emit_gather_elements,
}

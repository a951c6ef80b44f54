"""ONNX operator -> ComputeGraph operations, one emitter per supported op type.

Each emitter gets the importer (for operand values, constants and fresh names), the node and,
for MatMul/Gemm, the ``GemmFusion`` with transposes already folded. It returns the value of
the node's first output and raises ``GraphError`` saying why when the node's attributes or
operands are outside what the machine does; the importer prefixes the node's name and op type.
The last operation an emitter adds is named after the node (its name, else its first
output), intermediates ``<label>/<role>``, so later errors point at the user's node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import NodeProto, TensorProto

from ipu_stack.errors import GraphError
from ipu_stack.graph.compute_graph import Value
from ipu_stack.graph.onnx_patterns import (
    AttentionFusion,
    GemmFusion,
    attribute,
    causal_from_bias,
)

if TYPE_CHECKING:
    from ipu_stack.graph.onnx_import import Importer

Emitter = Callable[["Importer", NodeProto, GemmFusion | None], Value]

PRECISION_OF: dict[int, str] = {TensorProto.FLOAT: "f32", TensorProto.FLOAT16: "f16"}


def _int(node: NodeProto, name: str, default: int) -> int:
    return int(attribute(node, name, default))  # type: ignore[call-overload]


def _float(node: NodeProto, name: str, default: float) -> float:
    return float(attribute(node, name, default))  # type: ignore[arg-type]


def _ints(values: Sequence[object] | np.ndarray) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


def _input(node: NodeProto, i: int) -> str:
    return node.input[i] if len(node.input) > i else ""


def _required_constant(imp: Importer, node: NodeProto, i: int, role: str) -> np.ndarray:
    name = _input(node, i)
    const = imp.constant(name)
    if const is None:
        raise GraphError(
            f"the {role} input {name!r} is computed at run time; ipu-stack needs it constant "
            "(an initializer, a Constant, a foldable shape expression, or bound with "
            "import_onnx(constants=...))"
        )
    return const


# -- gemm family --------------------------------------------------------------------------------
def emit_matmul(imp: Importer, node: NodeProto, gemm: GemmFusion | None) -> Value:
    """MatMul with NumPy semantics; a 1-D operand is viewed as a row/column and dropped after."""
    g, out = imp.graph, imp.label(node)
    assert gemm is not None
    left, right = imp.value(gemm.left), imp.value(gemm.right)
    left_1d, right_1d = len(left.shape) == 1, len(right.shape) == 1
    if left_1d:
        left = g.view(left, (1, left.shape[0]), name=imp.op_name(f"{out}/left_row"))
    if right_1d:
        right = g.view(right, (right.shape[0], 1), name=imp.op_name(f"{out}/right_column"))
    squeeze = left_1d or right_1d
    y = g.gemm(
        left,
        right,
        gemm.transpose_left,
        gemm.transpose_right,
        name=imp.op_name(f"{out}/gemm" if squeeze else out),
    )
    if not squeeze:
        return y
    shape = list(y.shape)
    if right_1d:
        shape.pop(-1)
    if left_1d:
        shape.pop(-2 if not right_1d else -1)
    return g.view(y, shape or [1], name=imp.op_name(out))


def emit_gemm(imp: Importer, node: NodeProto, gemm: GemmFusion | None) -> Value:
    """Y = alpha * A' B' + beta * C: a gemm, a mul by alpha if != 1, an add of the bias."""
    g, out = imp.graph, imp.label(node)
    assert gemm is not None
    alpha, beta = _float(node, "alpha", 1.0), _float(node, "beta", 1.0)
    c_name = _input(node, 2)
    has_alpha, has_bias = alpha != 1.0, bool(c_name) and beta != 0.0
    a, b = imp.value(gemm.left), imp.value(gemm.right)
    for role, v in (("A", a), ("B", b)):
        if len(v.shape) != 2:
            raise GraphError(f"input {role} {v.name!r} has shape {v.shape}; Gemm needs rank 2")
    y = g.gemm(
        a,
        b,
        gemm.transpose_left,
        gemm.transpose_right,
        name=imp.op_name(f"{out}/gemm" if has_alpha or has_bias else out),
    )
    if has_alpha:
        scale = imp.derived(out, "alpha", np.array(alpha), y)
        y = g.mul(y, scale, name=imp.op_name(f"{out}/alpha" if has_bias else out))
    if has_bias:
        c_const = imp.constant(c_name)
        if c_const is not None:
            c = (
                imp.parameter(c_name, c_const)
                if beta == 1.0
                else (imp.derived(out, "beta_c", beta * c_const.astype(np.float64), y))
            )
        else:
            c = imp.value(c_name)
            if beta != 1.0:
                c = g.mul(c, imp.derived(out, "beta", np.array(beta), c),
                          name=imp.op_name(f"{out}/beta"))  # fmt: skip
        y = g.add(y, c, name=imp.op_name(out))
    return y


# -- elementwise --------------------------------------------------------------------------------
def emit_add(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    a, b = imp.value(node.input[0]), imp.value(node.input[1])
    return imp.graph.add(a, b, name=imp.op_name(imp.label(node)))


def emit_mul(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    a, b = imp.value(node.input[0]), imp.value(node.input[1])
    return imp.graph.mul(a, b, name=imp.op_name(imp.label(node)))


def emit_sub(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """a - c for a constant c: add of -c."""
    out, (a_name, c_name) = imp.label(node), node.input[:2]
    c = imp.constant(c_name)
    if c is None:
        raise GraphError(
            f"Sub is supported only when the subtrahend is a constant; {c_name!r} is computed"
        )
    a = imp.value(a_name)
    return imp.graph.add(a, imp.derived(out, "negated", -c.astype(np.float64), a),
                         name=imp.op_name(out))  # fmt: skip


def emit_div(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """a / c for a constant c: mul by 1/c."""
    out, (a_name, c_name) = imp.label(node), node.input[:2]
    c = imp.constant(c_name)
    if c is None:
        raise GraphError(f"Div is supported only by a constant; the divisor {c_name!r} is computed")
    if np.any(c == 0):
        raise GraphError(f"the constant divisor {c_name!r} contains zeros")
    a = imp.value(a_name)
    reciprocal = 1.0 / c.astype(np.float64)
    return imp.graph.mul(a, imp.derived(out, "reciprocal", reciprocal, a), name=imp.op_name(out))


def emit_gelu(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    approximate = attribute(node, "approximate", "none")
    if isinstance(approximate, bytes):
        approximate = approximate.decode()
    if approximate != "none":
        raise GraphError(
            f"approximate={approximate!r} is not supported; ipu-stack's gelu is the exact "
            "erf form (approximate='none')"
        )
    return imp.graph.gelu(imp.value(node.input[0]), name=imp.op_name(imp.label(node)))


def emit_identity(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    return imp.value(node.input[0])


def emit_pad(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """Pad in ``constant`` mode with constant pads (and value, and axes from opset 18): along
    each padded axis, blocks of the value joined before and after the input by a concat; a
    negative pad crops. All-zero pads (Swin pads its windows by ``(-size) % window``) leave
    the input unchanged. Other modes (reflect, edge, wrap) are refused."""
    x = imp.value(node.input[0])
    rank, out = len(x.shape), imp.label(node)
    mode = attribute(node, "mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if len(node.input) > 1 and node.input[1]:
        pads = imp.constant(node.input[1])
        if pads is None:
            raise GraphError("pads computed at run time are not supported (constants only)")
        values = [int(v) for v in np.asarray(pads).ravel()]
    else:  # opset < 11: an attribute
        values = [int(v) for a in node.attribute if a.name == "pads" for v in a.ints]
    if not any(values):
        return x
    if mode != "constant":
        raise GraphError(f"mode {mode!r} is not supported (only 'constant')")
    fill = 0.0
    if imp.opset < 11:
        fill = float(attribute(node, "value", 0.0))  # type: ignore[arg-type]
    elif _input(node, 2):
        found = imp.constant(node.input[2])
        if found is None:
            raise GraphError("the constant value is computed at run time (constants only)")
        fill = float(np.asarray(found).reshape(-1)[0]) if np.size(found) else 0.0
    axes = _ints(_required_constant(imp, node, 3, "axes")) if _input(node, 3) else None
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    if len(values) != 2 * len(axes) or any(not 0 <= a < rank for a in axes):
        raise GraphError(f"pads {values} do not match axes {axes} of shape {x.shape}")
    from ipu_stack.graph.onnx_ops_exported import _concat_values

    y = x
    for i, axis in enumerate(axes):
        before, after = values[i], values[i + len(axes)]
        if before < 0 or after < 0:  # crop first
            start, end = max(-before, 0), y.shape[axis] - max(-after, 0)
            if end <= start:
                raise GraphError(f"pads {values} crop axis {axis} of {x.shape} to nothing")
            y = imp.graph.slice(y, [start], [end], [axis], name=imp.op_name(f"{out}/crop{axis}"))
        joined = []
        for side, count in (("before", before), ("after", after)):
            if side == "after":
                joined.append(y)
            if count > 0:
                shape = [*y.shape[:axis], count, *y.shape[axis + 1 :]]
                joined.append(imp.derived(out, f"{side}{axis}", np.full(shape, fill), y))
        y = _concat_values(imp, joined, axis, imp.op_name(f"{out}/axis{axis}"))
    return imp.graph.view(y, list(y.shape), name=imp.op_name(out))


def emit_cast(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    to = _int(node, "to", 0)
    if to not in PRECISION_OF:
        name = TensorProto.DataType.Name(to).lower() if to in TensorProto.DataType.values() else to
        raise GraphError(
            f"cast to {name} is not supported; ipu-stack computes in float16 and float32"
        )
    x = imp.value(node.input[0])
    if x.dtype == PRECISION_OF[to]:
        return x
    return imp.graph.cast(x, PRECISION_OF[to], name=imp.op_name(imp.label(node)))


# -- normalisation ------------------------------------------------------------------------------
def emit_layer_norm(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """LayerNormalization over axes [axis:], merged into one last axis when axis < rank-1."""
    g, out = imp.graph, imp.label(node)
    x = imp.value(node.input[0])
    rank = len(x.shape)
    axis = _int(node, "axis", -1)
    if not -rank <= axis < rank:
        raise GraphError(f"axis {axis} is out of range for input of shape {x.shape}")
    axis %= rank
    normalized = x.shape[axis:]
    channels = int(np.prod(normalized))

    def per_channel(name: str, role: str, default: float) -> Value:
        if not name:
            return imp.derived(out, role, np.full(channels, default), x)
        const = imp.constant(name)
        if const is not None:
            if const.shape == (channels,) and axis == rank - 1:
                return imp.parameter(name, const)
            try:
                flat = np.broadcast_to(const, normalized).reshape(channels)
            except ValueError:
                raise GraphError(
                    f"{role} {name!r} has shape {const.shape}; expected {normalized}"
                ) from None
            return imp.derived(out, role, flat.astype(np.float64), x)
        v = imp.value(name)
        if v.shape == (channels,):
            return v
        if v.shape != normalized:
            raise GraphError(f"{role} {name!r} has shape {v.shape}; expected {normalized}")
        return g.view(v, (channels,), name=imp.op_name(f"{out}/{role}_flat"))

    scale = per_channel(node.input[1], "scale", 1.0)
    bias = per_channel(_input(node, 2), "bias", 0.0)
    epsilon = _float(node, "epsilon", 1e-5)
    if axis == rank - 1:
        return g.layer_norm(x, scale, bias, epsilon, name=imp.op_name(out))
    flat = g.view(x, (*x.shape[:axis], channels), name=imp.op_name(f"{out}/flat"))
    y = g.layer_norm(flat, scale, bias, epsilon, name=imp.op_name(f"{out}/norm"))
    return g.view(y, x.shape, name=imp.op_name(out))


def emit_softmax(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """Softmax over one axis (opset >= 13) or over the flattened axes [axis:] (opset < 13)."""
    g, out = imp.graph, imp.label(node)
    x = imp.value(node.input[0])
    rank = len(x.shape)
    axis = _int(node, "axis", -1 if imp.opset >= 13 else 1)
    if not -rank <= axis < rank:
        raise GraphError(f"axis {axis} is out of range for input of shape {x.shape}")
    axis %= rank
    if axis == rank - 1:
        return g.softmax(x, name=imp.op_name(out))
    if imp.opset < 13:
        rows = int(np.prod(x.shape[:axis]))
        flat = g.view(x, (rows, x.size // rows), name=imp.op_name(f"{out}/flat"))
        y = g.softmax(flat, name=imp.op_name(f"{out}/softmax"))
        return g.view(y, x.shape, name=imp.op_name(out))
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    moved = g.transpose(x, perm, name=imp.op_name(f"{out}/to_last"))
    y = g.softmax(moved, name=imp.op_name(f"{out}/softmax"))
    return g.transpose(y, perm, name=imp.op_name(out))


# -- data movement ------------------------------------------------------------------------------
def emit_reshape(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """Reshape with ONNX's 0 (copy the input's extent) and -1 (infer) semantics."""
    x = imp.value(node.input[0])
    if len(node.input) > 1:
        target = _ints(_required_constant(imp, node, 1, "shape"))
    else:  # opset < 5: the shape is an attribute
        target = _ints(attribute(node, "shape", []))  # type: ignore[arg-type]
    allow_zero = _int(node, "allowzero", 0)
    for i, d in enumerate(target):
        if d == 0 and allow_zero:
            raise GraphError(f"shape {target} with allowzero=1 makes an empty tensor")
        if d == 0:
            if i >= len(x.shape):
                raise GraphError(
                    f"shape {target}: 0 at axis {i} but the input has rank {len(x.shape)}"
                )
            target[i] = x.shape[i]
    return reshaped(imp, x, target or [1], imp.label(node))


def reshaped(imp: Importer, x: Value, shape: Sequence[int], out: str) -> Value:
    """``x`` viewed as ``shape``. An F16 view between rows of one element and longer rows is
    taken in F32: one F16 element per row moved to (or from) a packed row starts inside a
    32-bit word, which exchange cannot move, where an F32 element is a whole word."""
    g = imp.graph
    before = x.shape[-1] if x.shape else 1
    after = shape[-1] if len(shape) else 1
    if x.dtype != "f16" or before == after or min(before, after) != 1:
        return g.view(x, shape, name=imp.op_name(out))
    viewed = g.view(as_f32(imp, x, f"{out}/f32"), shape, name=imp.op_name(f"{out}/view"))
    return g.cast(viewed, "f16", name=imp.op_name(out))


def as_f32(imp: Importer, x: Value, name: str) -> Value:
    """``x`` in F32 when it is F16 (else ``x``): F16 pieces at odd element offsets start inside
    32-bit words, which exchange cannot move; F32 elements are whole words."""
    return imp.graph.cast(x, "f32", name=imp.op_name(name)) if x.dtype == "f16" else x


def _axes(imp: Importer, node: NodeProto) -> list[int] | None:
    """Constant ``axes``: an input from opset 13, an attribute before; None when absent."""
    if imp.opset >= 13:
        return _ints(_required_constant(imp, node, 1, "axes")) if _input(node, 1) else None
    attr = attribute(node, "axes")
    return _ints(attr) if attr is not None else None  # type: ignore[arg-type]


def _normalised(axes: list[int], rank: int) -> list[int]:
    if any(not -rank <= a < rank for a in axes):
        raise GraphError(f"axes {axes} out of range for rank {rank}")
    return sorted(a % rank for a in axes)


def emit_unsqueeze(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    x = imp.value(node.input[0])
    axes = _axes(imp, node) or []
    shape = list(x.shape)
    for a in _normalised(axes, len(shape) + len(axes)):
        shape.insert(a, 1)
    return reshaped(imp, x, shape, imp.label(node))


def emit_squeeze(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    x = imp.value(node.input[0])
    given = _axes(imp, node)
    axes = (
        _normalised(given, len(x.shape))
        if given is not None
        else ([i for i, d in enumerate(x.shape) if d == 1])
    )
    if any(x.shape[a] != 1 for a in axes):
        raise GraphError(f"cannot squeeze axes {axes} of shape {x.shape}")
    shape = [d for i, d in enumerate(x.shape) if i not in axes]
    return reshaped(imp, x, shape or [1], imp.label(node))


def emit_flatten(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    x = imp.value(node.input[0])
    rank = len(x.shape)
    axis = _int(node, "axis", 1)
    if not -rank <= axis <= rank:
        raise GraphError(f"axis {axis} out of range for shape {x.shape}")
    axis %= rank + 1
    rows = int(np.prod(x.shape[:axis]))
    return reshaped(imp, x, (rows, x.size // rows), imp.label(node))


def emit_transpose(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    x = imp.value(node.input[0])
    perm = attribute(node, "perm")
    order = _ints(perm) if perm is not None else list(reversed(range(len(x.shape))))  # type: ignore[arg-type]
    return imp.graph.transpose(x, order, name=imp.op_name(imp.label(node)))


def emit_slice(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """Slice with constant starts/ends/axes and unit steps."""
    x = imp.value(node.input[0])
    if imp.opset < 10:
        starts = _ints(attribute(node, "starts", []))  # type: ignore[arg-type]
        ends = _ints(attribute(node, "ends", []))  # type: ignore[arg-type]
        axes_attr = attribute(node, "axes")
        axes = _ints(axes_attr) if axes_attr is not None else None  # type: ignore[arg-type]
        steps = None
    else:
        starts = _ints(_required_constant(imp, node, 1, "starts"))
        ends = _ints(_required_constant(imp, node, 2, "ends"))
        axes = _ints(_required_constant(imp, node, 3, "axes")) if _input(node, 3) else None
        steps = _ints(_required_constant(imp, node, 4, "steps")) if _input(node, 4) else None
    if steps is not None and any(s != 1 for s in steps):
        return _strided_slice(imp, node, x, starts, ends, axes, steps)
    return imp.graph.slice(x, starts, ends, axes, name=imp.op_name(imp.label(node)))


def _strided_slice(
    imp: Importer,
    node: NodeProto,
    x: Value,
    starts: list[int],
    ends: list[int],
    axes: list[int] | None,
    steps: list[int],
) -> Value:
    """Slice with steps other than 1 (Swin's patch merging takes every second row and
    column): the indices each axis keeps, as NumPy (and ONNX) slicing clamps them, taken as
    runs of consecutive indices joined by a concat."""
    from ipu_stack.graph.onnx_ops_exported import take_indices

    rank, out = len(x.shape), imp.label(node)
    axes = list(range(len(starts))) if axes is None else axes
    # F16 columns taken one by one start inside 32-bit words: taken in F32 and cast back
    columns = x.dtype == "f16" and any(a % rank == rank - 1 for a in axes if -rank <= a < rank)
    if columns:
        x = as_f32(imp, x, f"{out}/f32")
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise GraphError(
            f"starts {starts}, ends {ends}, axes {axes} and steps {steps} differ in length"
        )
    y = x
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if not -rank <= axis < rank:
            raise GraphError(f"axis {axis} out of range for shape {x.shape}")
        if step == 0:
            raise GraphError(f"steps {steps}: a step of 0 is invalid")
        axis %= rank
        keep = np.arange(x.shape[axis])[slice(start, end, step)]
        if keep.size == 0:
            raise GraphError(f"axis {axis} of {x.shape} sliced [{start}:{end}:{step}] is empty")
        y = take_indices(imp, y, keep, axis, imp.op_name(f"{out}/axis{axis}"))
    if columns:
        return imp.graph.cast(y, "f16", name=imp.op_name(out))
    return imp.graph.view(y, list(y.shape), name=imp.op_name(out))


# -- attention ----------------------------------------------------------------------------------
def causal_bias_of(bias: np.ndarray, tq: int, tk: int) -> bool:
    """``causal_from_bias`` that raises GraphError when the bias is neither zero nor causal."""
    causal = causal_from_bias(bias, tq, tk)
    if causal is None:
        raise GraphError(
            "the attention mask is neither all zeros nor a causal mask (zeros on and below the "
            f"bottom-right-aligned diagonal, <= -1e4 above, over {tq} queries and {tk} keys); "
            "flash_attention supports only those"
        )
    return causal


def attention_fusion(imp: Importer, fusion: AttentionFusion, out: str) -> Value:
    """Emit a matched attention pattern as one flash_attention."""
    g = imp.graph
    q, v = imp.value(fusion.q), imp.value(fusion.v)
    k = imp.value(fusion.k_source)
    if fusion.k_view is not None:  # K with its leading axes merged: restore them (a relabel)
        k = g.view(k, fusion.k_view, name=imp.op_name(f"{out}/k_heads"))
    if fusion.k_perm is not None:
        k = g.transpose(k, fusion.k_perm, name=imp.op_name(f"{out}/k"))
    if fusion.mask is not None:  # a run-time additive mask (flash_attention(mask=...), part B)
        import inspect

        if "mask" not in inspect.signature(g.flash_attention).parameters:
            raise GraphError(
                f"the attention's run-time mask {fusion.mask!r} needs flash_attention(mask=...), "
                "which this build lacks"
            )
        mask = imp.value(fusion.mask)
        return g.flash_attention(q, k, v, fusion.causal, fusion.scale, mask=mask,
                                 name=imp.op_name(out))  # fmt: skip
    return g.flash_attention(q, k, v, fusion.causal, fusion.scale, name=imp.op_name(out))


def repeat_heads(imp: Importer, x: Value, groups: int, out: str) -> Value:
    """``x`` [B, H, S, D] with every head repeated ``groups`` times in place (head h of the
    result is head h // groups of ``x``): a slice per head and one concat on the head axis,
    as grouped-query attention's ``repeat_kv``."""
    g = imp.graph
    picked = [
        g.slice(x, [h], [h + 1], [1], name=imp.op_name(f"{out}/head{h}")) for h in range(x.shape[1])
    ]
    return g.concat([p for p in picked for _ in range(groups)], 1, name=imp.op_name(out))


def emit_attention(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """The opset-23 Attention operator without KV cache or softcap; grouped-query heads are
    repeated (:func:`repeat_heads`)."""
    g, out = imp.graph, imp.label(node)
    cache = [n for n in node.input[4:] if n]
    if cache:
        raise GraphError(f"KV-cache inputs {cache} (past_key/past_value/nonpad_kv_seqlen) are "
                         "not supported")  # fmt: skip
    if _float(node, "softcap", 0.0) != 0.0:
        raise GraphError("softcap is not supported")
    if _int(node, "left_window_size", -1) != -1 or _int(node, "right_window_size", -1) != -1:
        raise GraphError("sliding-window attention is not supported")
    q, k, v = (imp.value(n) for n in node.input[:3])
    rank = len(q.shape)
    if rank == 3:
        q_heads, kv_heads = _int(node, "q_num_heads", 0), _int(node, "kv_num_heads", 0)
        if q_heads <= 0 or kv_heads <= 0:
            raise GraphError("3-D inputs need the q_num_heads and kv_num_heads attributes")
        if q_heads % kv_heads:
            raise GraphError(f"{q_heads} query heads are not a multiple of {kv_heads} "
                             "key/value heads")  # fmt: skip

        def heads(x: Value, role: str, count: int) -> Value:
            b, s, hidden = x.shape
            if hidden % count:
                raise GraphError(f"{role} hidden size {hidden} is not divisible by {count} heads")
            split = g.view(
                x, (b, s, count, hidden // count), name=imp.op_name(f"{out}/{role}_split")
            )
            return g.transpose(split, (0, 2, 1, 3), name=imp.op_name(f"{out}/{role}_heads"))

        q, k, v = heads(q, "q", q_heads), heads(k, "k", kv_heads), heads(v, "v", kv_heads)
    elif rank != 4:
        raise GraphError(f"Q has shape {q.shape}; Attention takes 3-D or 4-D inputs")
    if k.shape[1] != v.shape[1] or q.shape[1] % k.shape[1]:
        raise GraphError(f"Q {q.shape}, K {k.shape}, V {v.shape}: the query heads must be a "
                         "multiple of the key/value heads, and K and V must agree")  # fmt: skip
    if q.shape[1] != k.shape[1]:  # grouped-query attention: each K/V head serves a group
        k = repeat_heads(imp, k, q.shape[1] // k.shape[1], f"{out}/k_groups")
        v = repeat_heads(imp, v, q.shape[1] // v.shape[1], f"{out}/v_groups")
    tq, tk = q.shape[-2], k.shape[-2]
    bias = np.zeros((tq, tk))
    mask_name = _input(node, 3)
    if mask_name and imp.constant(mask_name) is None:  # a run-time mask (part B's mask=)
        from ipu_stack.graph.onnx_ops_exported import runtime_attention_mask

        runtime = runtime_attention_mask(imp, node, mask_name, q)
        causal = bool(_int(node, "is_causal", 0))
        if causal and tq != tk:
            raise GraphError("is_causal with a run-time mask needs equal query and key counts")
        scale_attr = attribute(node, "scale")
        scale = float(scale_attr) if scale_attr is not None else 1.0 / float(np.sqrt(q.shape[-1]))  # type: ignore[arg-type]
        untyped: Any = g  # flash_attention(mask=...) comes with issue 11 part B
        y_name = imp.op_name(out if rank == 4 else f"{out}/attention")
        y = untyped.flash_attention(q, k, v, causal, scale, mask=runtime, name=y_name)
        if rank == 4:
            return y
        merged = g.transpose(y, (0, 2, 1, 3), name=imp.op_name(f"{out}/merge"))
        b, s, h, dv = merged.shape
        return g.view(merged, (b, s, h * dv), name=imp.op_name(out))
    if mask_name:
        mask = _required_constant(imp, node, 3, "attn_mask")
        additive = (
            np.where(mask, 0.0, -np.inf) if mask.dtype == np.bool_ else mask.astype(np.float64)
        )
        if additive.shape[-1] < tk:  # a short mask is padded with -inf (ONNX semantics)
            pad = [(0, 0)] * (additive.ndim - 1) + [(0, tk - additive.shape[-1])]
            additive = np.pad(additive, pad, constant_values=-np.inf)
        bias = bias + additive
    if _int(node, "is_causal", 0):
        # Without a cache ONNX aligns the causal mask top-left: query i sees keys j <= i.
        bias = bias + np.where(np.tril(np.ones((tq, tk), dtype=bool)), 0.0, -np.inf)
    causal = causal_bias_of(bias, tq, tk)
    scale_attr = attribute(node, "scale")
    scale = float(scale_attr) if scale_attr is not None else 1.0 / float(np.sqrt(q.shape[-1]))  # type: ignore[arg-type]
    if rank == 4:
        return g.flash_attention(q, k, v, causal, scale, name=imp.op_name(out))
    y = g.flash_attention(q, k, v, causal, scale, name=imp.op_name(f"{out}/attention"))
    merged = g.transpose(y, (0, 2, 1, 3), name=imp.op_name(f"{out}/merge"))
    b, s, h, dv = merged.shape
    return g.view(merged, (b, s, h * dv), name=imp.op_name(out))


EMITTERS: dict[str, Emitter] = {
    "Add": emit_add,
    "Attention": emit_attention,
    "Cast": emit_cast,
    "Div": emit_div,
    "Flatten": emit_flatten,
    "Gelu": emit_gelu,
    "Gemm": emit_gemm,
    "Identity": emit_identity,
    "Pad": emit_pad,
    "LayerNormalization": emit_layer_norm,
    "MatMul": emit_matmul,
    "Mul": emit_mul,
    "Reshape": emit_reshape,
    "Slice": emit_slice,
    "Softmax": emit_softmax,
    "Squeeze": emit_squeeze,
    "Sub": emit_sub,
    "Transpose": emit_transpose,
    "Unsqueeze": emit_unsqueeze,
}

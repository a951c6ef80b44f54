"""ONNX operators as torch/transformers exporters write them, beyond ``onnx_ops``.

Elementwise functions (Tanh, Sigmoid, Sqrt, Reciprocal, Neg, Pow with a constant exponent,
Sub/Div of computed tensors, ReduceMean over the last axis), tanh GeLU, ``Split``, ``Gather``
with constant indices on a computed tensor, ``Concat``, patch-embedding ``Conv`` and the integer
operators exporters apply to token ids (``ArgMax``, ``Equal``, ``Where``, integer ``Cast``),
the last ones through the graph operations of issue 11 part B when the graph has them.
Same conventions as ``onnx_ops``: an emitter returns the node's first output.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np
from onnx import NodeProto, TensorProto

from ipu_stack.errors import GraphError
from ipu_stack.graph.compute_graph import Value
from ipu_stack.graph.onnx_ops import (
    PRECISION_OF,
    Emitter,
    _input,
    _int,
    _ints,
    _required_constant,
    as_f32,
    emit_div,
    emit_sub,
)
from ipu_stack.graph.onnx_patterns import GemmFusion, attribute

if TYPE_CHECKING:
    from ipu_stack.graph.onnx_import import Importer

#: ONNX op type -> ComputeGraph elementwise function
UNARY_OPS = {"Tanh": "tanh", "Sigmoid": "sigmoid", "Sqrt": "sqrt", "Reciprocal": "reciprocal",
             "Neg": "neg", "Relu": "relu"}  # fmt: skip


def _unary(kind: str) -> Emitter:
    def emit(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
        return imp.graph.unary(kind, imp.value(node.input[0]), name=imp.op_name(imp.label(node)))

    emit.__name__ = f"emit_{kind}"
    return emit


def emit_pow(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """x ** c for a constant scalar c (x * x for c = 2)."""
    exponent = _required_constant(imp, node, 1, "exponent")
    if exponent.size != 1:
        raise GraphError(f"the exponent has shape {exponent.shape}; only a scalar is supported")
    x, out = imp.value(node.input[0]), imp.op_name(imp.label(node))
    c = float(exponent.reshape(()))
    if c == 1.0:
        return x
    if c == 2.0:
        return imp.graph.mul(x, x, name=out)
    return imp.graph.pow(x, c, name=out)


def emit_sub_any(imp: Importer, node: NodeProto, gemm: GemmFusion | None) -> Value:
    """a - b: an add of -b for a constant b, else a sub (either operand may be constant)."""
    if imp.constant(node.input[1]) is not None:
        return emit_sub(imp, node, gemm)
    a, b = imp.value(node.input[0]), imp.value(node.input[1])
    return imp.graph.sub(a, b, name=imp.op_name(imp.label(node)))


def emit_div_any(imp: Importer, node: NodeProto, gemm: GemmFusion | None) -> Value:
    """a / b: a mul by 1/b for a constant b, else a div."""
    if imp.constant(node.input[1]) is not None:
        return emit_div(imp, node, gemm)
    a, b = imp.value(node.input[0]), imp.value(node.input[1])
    return imp.graph.div(a, b, name=imp.op_name(imp.label(node)))


def emit_gelu_any(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    approximate = attribute(node, "approximate", "none")
    if isinstance(approximate, bytes):
        approximate = approximate.decode()
    if approximate not in ("none", "tanh"):
        raise GraphError(f"approximate={approximate!r} is not supported ('none' or 'tanh')")
    x = imp.value(node.input[0])
    return imp.graph.gelu(x, name=imp.op_name(imp.label(node)), approximate=str(approximate))


def emit_reduce_mean(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """ReduceMean (axes an attribute before opset 18, an input after): trailing axes are
    merged into one row by a view (a global average pool over H and W), others are moved
    last by a transpose first."""
    x = imp.value(node.input[0])
    rank = len(x.shape)
    if imp.opset >= 18:
        axes = _ints(_required_constant(imp, node, 1, "axes")) if _input(node, 1) else None
    else:
        attr = attribute(node, "axes")
        axes = _ints(attr) if attr is not None else None  # type: ignore[arg-type]
    if axes is None:
        axes = [] if _int(node, "noop_with_empty_axes", 0) else list(range(rank))
    if not axes:
        return x
    normal = sorted({a % rank for a in axes if -rank <= a < rank})
    if len(normal) != len(axes):
        raise GraphError(f"axes {axes} out of range for shape {x.shape}")
    keep = _int(node, "keepdims", 1)
    out = imp.label(node)
    kept_shape = (
        [1 if a in normal else d for a, d in enumerate(x.shape)]
        if keep
        else [d for a, d in enumerate(x.shape) if a not in normal]
    )
    first = rank - len(normal)
    moved = normal != list(range(first, rank))
    if moved:  # other axes (a channels-first LayerNorm's mean over axis 1): moved last first
        rest = [a for a in range(rank) if a not in normal]
        x = imp.graph.transpose(x, rest + normal, name=imp.op_name(f"{out}/last"))
    if first < rank - 1 or moved:  # one row per leading index
        rows = imp.graph.view(
            x,
            [*x.shape[:first], int(np.prod(x.shape[first:]))]
            if first
            else [1, int(np.prod(x.shape))],
            name=imp.op_name(f"{out}/rows"),
        )
        return _row_means(imp, rows, kept_shape or [1], out)
    y = imp.graph.reduce_mean(x, name=imp.op_name(out if keep else f"{out}/mean"))
    return y if keep else imp.graph.view(y, x.shape[:-1] or (1,), name=imp.op_name(out))


def emit_max_pool(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """MaxPool: see :func:`ipu_stack.graph.onnx_conv.max_pool`."""
    from ipu_stack.graph.onnx_conv import max_pool

    return max_pool(imp, node, imp.label(node))


def _extreme(kind: str) -> Emitter:
    """ONNX Max / Min of two or more tensors (NumPy broadcasting), pairwise."""

    def emit(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
        g, out = imp.graph, imp.label(node)
        values = [imp.value(name) for name in node.input if name]
        step = g.maximum if kind == "max" else g.minimum
        y = values[0]
        for i, v in enumerate(values[1:], 1):
            y = step(y, v, name=imp.op_name(out if i == len(values) - 1 else f"{out}/{kind}{i}"))
        return y

    return emit


def _hard_sigmoid(imp: Importer, x: Value, alpha: float, beta: float, out: str, last: str) -> Value:
    """``max(0, min(1, alpha * x + beta))``: a multiply, an add, a max and a min."""
    g = imp.graph
    scaled = g.mul(
        x, imp.derived(out, "alpha", np.array([alpha]), x), name=imp.op_name(f"{out}/scaled")
    )
    shifted = g.add(
        scaled, imp.derived(out, "beta", np.array([beta]), x), name=imp.op_name(f"{out}/shifted")
    )
    floor = g.maximum(
        shifted, imp.derived(out, "zero", np.array([0.0]), x), name=imp.op_name(f"{out}/floor")
    )
    return g.minimum(floor, imp.derived(out, "one", np.array([1.0]), x), name=imp.op_name(last))


def emit_hard_sigmoid(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """HardSigmoid (``alpha`` 0.2, ``beta`` 0.5 unless given)."""
    out = imp.label(node)
    alpha = float(attribute(node, "alpha", 0.2))  # type: ignore[arg-type]
    beta = float(attribute(node, "beta", 0.5))  # type: ignore[arg-type]
    return _hard_sigmoid(imp, imp.value(node.input[0]), alpha, beta, out, out)


def emit_hard_swish(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """HardSwish (MobileNetV3, LeViT): ``x * HardSigmoid(x)`` with alpha 1/6, beta 1/2."""
    out = imp.label(node)
    x = imp.value(node.input[0])
    gate = _hard_sigmoid(imp, x, 1 / 6, 0.5, out, f"{out}/gate")
    return imp.graph.mul(x, gate, name=imp.op_name(out))


def emit_clip(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """Clip with constant bounds (ReLU6): the larger of x and the lower bound, then the
    smaller of that and the upper bound; a missing bound is not applied."""
    g, out = imp.graph, imp.label(node)
    x = imp.value(node.input[0])
    bounds: list[float | None] = []
    for position, attr in ((1, "min"), (2, "max")):
        if imp.opset < 11:
            value = attribute(node, attr, None)
            bounds.append(None if value is None else float(value))  # type: ignore[arg-type]
            continue
        name = node.input[position] if len(node.input) > position else ""
        if not name:
            bounds.append(None)
            continue
        const = imp.constant(name)
        if const is None:
            raise GraphError(f"the {attr} bound {name!r} is computed at run time (constants only)")
        bounds.append(float(np.asarray(const).reshape(-1)[0]))
    lo, hi = bounds
    y = x
    if lo is not None:
        floor = imp.derived(out, "min", np.array([lo]), x)
        y = g.maximum(y, floor, name=imp.op_name(out if hi is None else f"{out}/floor"))
    if hi is not None:
        y = g.minimum(y, imp.derived(out, "max", np.array([hi]), x), name=imp.op_name(out))
    return y


def emit_batch_norm(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """BatchNormalization at inference (constant statistics): ``x * a + b`` per channel
    (axis 1), ``a = scale / sqrt(var + epsilon)`` and ``b = bias - mean * a`` folded at import."""
    g, out = imp.graph, imp.label(node)
    if _int(node, "training_mode", 0) or any(node.output[1:]):
        raise GraphError("training mode (running statistics as outputs) is not supported")
    x = imp.value(node.input[0])
    stats = [imp.constant(name) for name in node.input[1:5]]
    if any(v is None for v in stats):
        computed = [name for name, v in zip(node.input[1:5], stats, strict=True) if v is None]
        raise GraphError(f"statistics {computed} are computed at run time (constants only)")
    scale, bias, mean, var = (np.asarray(v, np.float64).reshape(-1) for v in stats)
    if len(x.shape) < 2 or any(v.size != x.shape[1] for v in (scale, bias, mean, var)):
        raise GraphError(f"input {x.shape}: statistics must have one value per channel (axis 1)")
    a = scale / np.sqrt(var + float(attribute(node, "epsilon", 1e-5)))  # type: ignore[arg-type]
    shape = (x.shape[1], *([1] * (len(x.shape) - 2)))
    scaled = g.mul(
        x, imp.derived(out, "scale", a.reshape(shape), x), name=imp.op_name(f"{out}/scale")
    )
    shift = imp.derived(out, "shift", (bias - mean * a).reshape(shape), x)
    return g.add(scaled, shift, name=imp.op_name(out))


def emit_instance_norm(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """InstanceNormalization (torch's GroupNorm exports one on ``[N, G, -1]``): a layer norm of
    each ``[n, c]`` row over the spatial axes (unit scale, zero shift), then the constant
    per-channel scale and bias as a multiply and an add."""
    g, out = imp.graph, imp.label(node)
    x = imp.value(node.input[0])
    if len(x.shape) < 3:
        raise GraphError(
            f"input shape {x.shape}: InstanceNormalization needs N, C and spatial axes"
        )
    n, c, spatial = x.shape[0], x.shape[1], int(np.prod(x.shape[2:]))
    consts = [imp.constant(name) for name in node.input[1:3]]
    if any(v is None for v in consts):
        raise GraphError("the scale and bias are computed at run time (constants only)")
    scale, bias = (np.asarray(v, np.float64).reshape(-1) for v in consts)
    if scale.size != c or bias.size != c:
        raise GraphError(f"input {x.shape}: scale and bias must have one value per channel")
    eps = float(attribute(node, "epsilon", 1e-5))  # type: ignore[arg-type]
    rows = g.view(x, [n, c, spatial], name=imp.op_name(f"{out}/rows"))
    ones = imp.derived(out, "unit_scale", np.ones(spatial), x)
    zeros = imp.derived(out, "zero_shift", np.zeros(spatial), x)
    normed = g.layer_norm(rows, ones, zeros, eps, name=imp.op_name(f"{out}/normed"))
    shape = (c, *([1] * (len(x.shape) - 2)))
    back = g.view(normed, x.shape, name=imp.op_name(f"{out}/shape"))
    scaled = g.mul(back, imp.derived(out, "scale", scale.reshape(shape), x),
                   name=imp.op_name(f"{out}/scale"))  # fmt: skip
    return g.add(scaled, imp.derived(out, "bias", bias.reshape(shape), x), name=imp.op_name(out))


def emit_global_average_pool(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """GlobalAveragePool: the mean over every axis after N and C, kept as ones."""
    g, out = imp.graph, imp.label(node)
    x = imp.value(node.input[0])
    if len(x.shape) < 3:
        raise GraphError(f"input shape {x.shape}: GlobalAveragePool needs N, C and spatial axes")
    n, c = x.shape[0], x.shape[1]
    rows = g.view(x, [n, c, int(np.prod(x.shape[2:]))], name=imp.op_name(f"{out}/rows"))
    return _row_means(imp, rows, [n, c, *([1] * (len(x.shape) - 2))], out)


def _row_means(imp: Importer, rows: Value, shape: list[int], out: str) -> Value:
    """The mean of each row of ``rows`` as ``shape``. F16 means are taken in F32 and cast
    back after the reshape: the means are one element per row, and moving one F16 element
    per row into a packed tensor puts pieces inside 32-bit words, which exchange cannot do."""
    g = imp.graph
    narrow = rows.dtype == "f16"
    y = g.reduce_mean(as_f32(imp, rows, f"{out}/f32"), name=imp.op_name(f"{out}/mean"))
    y = g.view(y, shape, name=imp.op_name(f"{out}/shape" if narrow else out))
    return g.cast(y, "f16", name=imp.op_name(out)) if narrow else y


def emit_rms_norm(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """RMSNormalization (opset 23) over the last axis: x / sqrt(mean(x^2) + eps) * scale."""
    g, out = imp.graph, imp.label(node)
    x = imp.value(node.input[0])
    axis = _int(node, "axis", -1)
    if axis % len(x.shape) != len(x.shape) - 1:
        raise GraphError(f"axis {axis} of shape {x.shape}: only the last axis is supported")
    eps = float(attribute(node, "epsilon", 1e-5))  # type: ignore[arg-type]
    square = g.mul(x, x, name=imp.op_name(f"{out}/square"))
    mean = g.reduce_mean(square, name=imp.op_name(f"{out}/mean"))
    shifted = g.add(mean, imp.derived(out, "epsilon", np.array(eps), x),
                    name=imp.op_name(f"{out}/plus_eps"))  # fmt: skip
    inv = g.reciprocal(g.sqrt(shifted, name=imp.op_name(f"{out}/rms")),
                       name=imp.op_name(f"{out}/inverse"))  # fmt: skip
    normed = g.mul(x, inv, name=imp.op_name(f"{out}/normed"))
    return g.mul(normed, imp.value(node.input[1]), name=imp.op_name(out))


# -- data movement ------------------------------------------------------------------------------
def emit_split(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """Split into slices (sizes an input from opset 13, an attribute before, or num_outputs)."""
    x = imp.value(node.input[0])
    rank = len(x.shape)
    axis = _int(node, "axis", 0)
    if not -rank <= axis < rank:
        raise GraphError(f"axis {axis} out of range for shape {x.shape}")
    axis %= rank
    extent, count = x.shape[axis], len(node.output)
    if _input(node, 1):
        sizes = _ints(_required_constant(imp, node, 1, "split"))
    elif attribute(node, "split") is not None:
        sizes = _ints(attribute(node, "split"))  # type: ignore[arg-type]
    else:
        parts = _int(node, "num_outputs", count)
        chunk = -(-extent // parts)
        sizes = [min(chunk, extent - i * chunk) for i in range(parts)]
    if len(sizes) != count or sum(sizes) != extent or min(sizes) <= 0:
        raise GraphError(f"split sizes {sizes} do not cut axis {axis} ({extent}) into {count}")
    label, start, first = imp.label(node), 0, None
    for i, (name, size) in enumerate(zip(node.output, sizes, strict=True)):
        part = imp.graph.slice(x, [start], [start + size], [axis],
                               name=imp.op_name(label if i == 0 else f"{label}/{i}"))  # fmt: skip
        start += size
        if i == 0:
            first = part
        elif name:
            imp.env[name] = part
    assert first is not None
    return first


def _concat_values(imp: Importer, values: list[Value], axis: int, name: str) -> Value:
    if len(values) == 1:
        return values[0]
    return imp.graph.concat(values, axis, name=name)


def emit_concat(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """Concat of computed (or constant) tensors; a single input is passed through."""
    values = [imp.value(n) for n in node.input if n]
    rank = len(values[0].shape)
    axis = _int(node, "axis", 0)
    if not -rank <= axis < rank:
        raise GraphError(f"axis {axis} out of range for rank {rank}")
    return _concat_values(imp, values, axis % rank, imp.op_name(imp.label(node)))


def take_indices(imp: Importer, x: Value, flat: np.ndarray, axis: int, out: str) -> Value:
    """``x`` at the (non-negative, in-range) constant indices ``flat`` along ``axis``: one
    slice per run of consecutive indices, joined by a concat."""
    runs: list[tuple[int, int]] = []
    for i in flat.tolist():
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    picked = [
        imp.graph.slice(x, [lo], [hi], [axis], name=imp.op_name(f"{out}/take{j}"))
        for j, (lo, hi) in enumerate(runs)
    ]
    return _concat_values(imp, picked, axis, imp.op_name(f"{out}/concat"))


def emit_gather(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """Gather with constant indices: slices of the data (+ a concat for scattered indices);
    with run-time indices into a table, the embedding lookup ``gather``."""
    g, out = imp.graph, imp.label(node)
    data_name, index_name = node.input[0], node.input[1]
    axis = _int(node, "axis", 0)
    indices = imp.constant(index_name)
    if indices is None:
        table = imp.value(data_name)
        if axis != 0 or len(table.shape) != 2:
            raise GraphError(
                f"run-time indices {index_name!r} are supported only as an embedding lookup "
                f"(axis 0 of a 2-D table; here axis {axis} of {table.shape})"
            )
        return g.gather(table, imp.value(index_name), name=imp.op_name(out))
    x = imp.value(data_name)
    rank = len(x.shape)
    if not -rank <= axis < rank:
        raise GraphError(f"axis {axis} out of range for shape {x.shape}")
    axis %= rank
    flat = np.asarray(indices, dtype=np.int64).reshape(-1)
    extent = x.shape[axis]
    if np.any(flat < -extent) or np.any(flat >= extent):
        raise GraphError(f"indices {flat.tolist()} out of range for axis {axis} ({extent})")
    flat = np.where(flat < 0, flat + extent, flat)
    y = take_indices(imp, x, flat, axis, out)
    shape = [*x.shape[:axis], *indices.shape, *x.shape[axis + 1 :]]
    return g.view(y, shape or [1], name=imp.op_name(out))


def emit_conv(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """Patch-embedding Conv (kernel == stride, no padding, group 1, dilation 1)."""
    return patch_embedding(imp, node, imp.label(node), tokens=False)


def _is_patch_embedding(node: NodeProto, x: Value, weight: np.ndarray) -> bool:
    """A 2-D Conv whose kernel is its stride, unpadded, group 1, dilation 1."""
    if len(x.shape) != 4 or weight.ndim != 4 or x.shape[1] != weight.shape[1]:
        return False
    kernel = tuple(_ints(attribute(node, "kernel_shape", list(weight.shape[2:]))))  # type: ignore[arg-type]
    from ipu_stack.graph.onnx_conv import auto_pad_of

    return (
        _int(node, "group", 1) == 1
        and all(d == 1 for d in _ints(attribute(node, "dilations", [1, 1])))  # type: ignore[arg-type]
        and tuple(_ints(attribute(node, "strides", [1, 1]))) == kernel  # type: ignore[arg-type]
        and not any(_ints(attribute(node, "pads", [0, 0, 0, 0])))  # type: ignore[arg-type]
        and auto_pad_of(node) in ("NOTSET", "VALID")
        and kernel == tuple(weight.shape[2:])
    )


def patch_embedding(imp: Importer, node: NodeProto, out: str, tokens: bool) -> Value:
    """A patch view of the input (a reshape and a transpose that keeps whole kernel rows) and
    one GEMM ``patches[B, P, C*kh*kw] @ W^T`` -> tokens ``[B, P, O]``; with ``tokens=False``
    transposed back to the Conv's NCHW ``[B, O, Ph, Pw]``."""
    g = imp.graph
    x = imp.value(node.input[0])
    weight = _required_constant(imp, node, 1, "weight")
    if not _is_patch_embedding(node, x, weight):
        from ipu_stack.graph.onnx_conv import general_conv

        y = general_conv(imp, node, out if not tokens else f"{out}/conv", weight)
        if not tokens:
            return y
        b, o = y.shape[:2]
        flat = g.view(y, (b, o, int(np.prod(y.shape[2:]))), name=imp.op_name(f"{out}/flat"))
        return g.transpose(flat, (0, 2, 1), name=imp.op_name(out))
    b, c, h, w = x.shape
    o, _, kh, kw = weight.shape
    ph, pw = h // kh, w // kw
    if ph == 0 or pw == 0:
        raise GraphError(f"the {kh}x{kw} kernel is larger than the input {h}x{w}")
    if (h, w) != (ph * kh, pw * kw):  # the remainder rows/columns fall off, as in the Conv
        x = g.slice(x, [0, 0], [ph * kh, pw * kw], [2, 3], name=imp.op_name(f"{out}/crop"))
    if (kh, kw) == (1, 1) and x.dtype != "f32":
        # pointwise, elements narrower than a word: the grid's one-element pieces would start
        # inside 32-bit words, which exchange cannot move; each pixel's channels as a row
        flat = g.view(x, (b, c, ph * pw), name=imp.op_name(f"{out}/pixels"))
        rows = g.transpose(flat, (0, 2, 1), name=imp.op_name(f"{out}/patch_rows"))
    else:
        grid = g.view(x, (b, c, ph, kh, pw, kw), name=imp.op_name(f"{out}/grid"))
        patches = g.transpose(grid, (0, 2, 4, 1, 3, 5), name=imp.op_name(f"{out}/patches"))
        rows = g.view(patches, (b, ph * pw, c * kh * kw), name=imp.op_name(f"{out}/patch_rows"))
    kernel_columns = weight.reshape(o, c * kh * kw).T
    wv = imp.derived(node.input[1], "columns", kernel_columns.astype(np.float64), x)
    bias_name = _input(node, 2)
    last = tokens and not bias_name
    y = g.gemm(rows, wv, name=imp.op_name(out if last else f"{out}/gemm"))  # [B, P, O]
    if bias_name:
        bias = _required_constant(imp, node, 2, "bias")
        row = imp.derived(out, "bias", bias.astype(np.float64), y)
        y = g.add(y, row, name=imp.op_name(out if tokens else f"{out}/bias"))
    if tokens:
        return y
    channels = g.transpose(y, (0, 2, 1), name=imp.op_name(f"{out}/channels"))
    return g.view(channels, (b, o, ph, pw), name=imp.op_name(out))


# -- integer operators on token ids (graph operations of issue 11 part B) -----------------------
def emit_argmax(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    x = imp.value(node.input[0])
    if _int(node, "select_last_index", 0):
        raise GraphError("select_last_index=1 is not supported")
    axis, keep = _int(node, "axis", 0), bool(_int(node, "keepdims", 1))
    return imp.graph.argmax(x, axis % len(x.shape), keepdims=keep)


def emit_equal(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    a, b = imp.value(node.input[0]), imp.value(node.input[1])
    return imp.graph.equal(a, b, name=imp.op_name(imp.label(node)))


def emit_cast_any(imp: Importer, node: NodeProto, gemm: GemmFusion | None) -> Value:
    """Cast between f16/f32 (``onnx_ops``), and to or from integers (ids) as i32."""
    from ipu_stack.graph.onnx_ops import emit_cast

    to = _int(node, "to", 0)
    x = imp.value(node.input[0])
    integer = (TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL)
    if to in PRECISION_OF and x.dtype != "i32":
        return emit_cast(imp, node, gemm)
    if to in integer and x.dtype == "i32":
        return x
    if to in integer or (to in PRECISION_OF and x.dtype == "i32"):
        from ipu_stack.target.ipu21 import PRECISIONS

        if "i32" not in PRECISIONS:  # no integer values in this build
            return emit_cast(imp, node, gemm)
        target = "i32" if to in integer else PRECISION_OF[to]
        return imp.graph.cast(x, target, name=imp.op_name(imp.label(node)))
    return emit_cast(imp, node, gemm)


def runtime_attention_mask(imp: Importer, node: NodeProto, name: str, q: Value) -> Value:
    """The additive float mask of an Attention node's run-time ``attn_mask`` (a boolean mask
    becomes ``where(mask, 0, -inf)``), for ``flash_attention(mask=...)`` (issue 11 part B)."""
    import inspect

    if "mask" not in inspect.signature(imp.graph.flash_attention).parameters:
        raise GraphError(
            f"the run-time attn_mask {name!r} needs flash_attention(mask=...), which this "
            "build lacks"
        )
    mask = imp.value(name)
    if imp.elem_types.get(name) == TensorProto.BOOL:
        return additive_mask(imp, name, q.dtype)
    return mask


def additive_mask(imp: Importer, name: str, dtype: str) -> Value:
    """``where(mask, 0, -inf)`` of the boolean ONNX tensor ``name``, made once per precision
    (every layer's Attention reads the same one)."""
    key = (name, dtype)
    if key not in imp.mask_cache:
        g, mask = imp.graph, imp.value(name)
        zero, blocked = (imp._new_parameter(f"{name}.{role}", np.array(v), dtype)
                         for role, v in (("open", 0.0), ("blocked", -np.inf)))  # fmt: skip
        imp.mask_cache[key] = g.where(mask, zero, blocked, name=imp.op_name(f"{name}/additive"))
    return imp.mask_cache[key]


def shared_bool_masks(imp: Importer, live: Collection[int]) -> dict[str, str]:
    """Boolean run-time ``attn_mask`` tensors read by several live opset-23 Attention nodes,
    with the precision of their queries: the importer makes their additive form right after
    the tensor is computed, before the first layer, so the layers can roll into one loop."""
    readers: dict[str, list[str]] = {}
    for position in live:
        node = imp.index.nodes[position]
        mask = node.input[3] if node.op_type == "Attention" and len(node.input) > 3 else ""
        elem = imp.elem_types.get(node.input[0]) if mask else None
        boolean = bool(mask) and imp.elem_types.get(mask) == TensorProto.BOOL
        if boolean and imp.constant(mask) is None and elem in PRECISION_OF:
            readers.setdefault(mask, []).append(PRECISION_OF[elem])
    return {m: dtypes[0] for m, dtypes in readers.items() if len(dtypes) > 1}


EMITTERS: dict[str, Emitter] = {
    **{op: _unary(kind) for op, kind in UNARY_OPS.items()},
    "Pow": emit_pow,
    "Sub": emit_sub_any,
    "Div": emit_div_any,
    "Gelu": emit_gelu_any,
    "ReduceMean": emit_reduce_mean,
    "GlobalAveragePool": emit_global_average_pool,
    "BatchNormalization": emit_batch_norm,
    "InstanceNormalization": emit_instance_norm,
    "MaxPool": emit_max_pool,
    "Clip": emit_clip,
    "HardSigmoid": emit_hard_sigmoid,
    "HardSwish": emit_hard_swish,
    "Max": _extreme("max"),
    "Min": _extreme("min"),
    "RMSNormalization": emit_rms_norm,
    "Split": emit_split,
    "Concat": emit_concat,
    "Gather": emit_gather,
    "Conv": emit_conv,
    "ArgMax": emit_argmax,
    "Equal": emit_equal,
    "Cast": emit_cast_any,
}
#: op types whose emitter binds every output itself
MULTI_OUTPUT = ("Split",)

"""ONNX ``Conv`` beyond patch embeddings (padding, strides other than the kernel, dilation,
1-D convolutions, grouped and depthwise convolutions), ``MaxPool`` and ``AveragePool``, built
from slices, concats, one GEMM or elementwise products, sums and maxima.

The padded input is cut into one window per kernel offset (a slice, strided by the step
where the stride is not 1); the windows are stacked along the channels and multiplied by the
weights as one GEMM over each output pixel's ``kh * kw * C`` values (``im2col``). A grouped
convolution is that GEMM with a block-diagonal weight (zeros between a group's outputs and
the other groups' channels); a depthwise convolution (``group == C``, one output per channel)
is the sum of each window times its per-channel weight. Pooling takes the same windows (with
``ceil_mode``, extra end padding for the last partial windows) and their maxima, or their sum
times a constant per-position map of reciprocal window counts. Each window is a graph
operation, so this suits small images; the patch-embedding case (kernel == stride, no
padding) keeps its single view and GEMM (:func:`onnx_ops_exported.patch_embedding`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from onnx import NodeProto

from ipu_stack.errors import GraphError
from ipu_stack.graph.compute_graph import Value
from ipu_stack.graph.onnx_ops import Emitter, _int, _ints, as_f32
from ipu_stack.graph.onnx_patterns import attribute

if TYPE_CHECKING:
    from ipu_stack.graph.onnx_import import Importer
    from ipu_stack.graph.onnx_patterns import GemmFusion

#: the most kernel offsets (windows) a Conv is cut into: each is a graph operation
MAX_WINDOWS = 64


def general_conv(imp: Importer, node: NodeProto, out: str, weight: np.ndarray) -> Value:
    """The Conv ``node`` on its input (NCHW, or NCL for a 1-D convolution) as NCHW (NCL)."""
    g = imp.graph
    x = imp.value(node.input[0])
    one_d = len(x.shape) == 3 and weight.ndim == 3
    if one_d:  # a 1-D convolution is a 2-D one over a height of 1
        x = g.view(x, (*x.shape[:2], 1, x.shape[2]), name=imp.op_name(f"{out}/as_2d"))
        weight = weight[:, :, None, :]
    if len(x.shape) != 4 or weight.ndim != 4:
        raise GraphError(f"input {x.shape} / weight {weight.shape}: only 1-D and 2-D Conv")
    n, c, _, _ = x.shape
    o, per_group, kh, kw = weight.shape
    group = _int(node, "group", 1)
    depthwise = group == c and per_group == 1 and o == c
    if group != 1 and not depthwise:
        weight = block_diagonal(weight, group, c)
    elif group == 1 and per_group != c:
        raise GraphError(f"input channels {c} but the weight takes {per_group}")
    work = as_f32(imp, x, f"{out}/f32")  # windows at any column offset are whole words
    geometry = _geometry(node, one_d, (kh, kw), work.shape[2:])
    windows, (oh, ow) = _windows(imp, work, (kh, kw), geometry, out)
    if depthwise:
        y = _depthwise(imp, windows, weight, work, out)
    else:
        y = _im2col(imp, windows, weight, x.dtype, (n, c, oh, ow), out)
    bias_name = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    if bias_name:
        bias = imp.constant(bias_name)
        if bias is None:
            raise GraphError(f"the bias {bias_name!r} is computed at run time (constants only)")
        shift = imp.derived(out, "bias", np.asarray(bias, np.float64).reshape(o, 1, 1), y)
        y = g.add(y, shift, name=imp.op_name(f"{out}/bias"))
    if y.dtype != x.dtype:
        y = g.cast(y, x.dtype, name=imp.op_name(f"{out}/{x.dtype}"))
    shape = (n, o, ow) if one_d else (n, o, oh, ow)
    return g.view(y, shape, name=imp.op_name(out))


def block_diagonal(weight: np.ndarray, group: int, channels: int) -> np.ndarray:
    """The grouped Conv weight as the dense one that is zero between each group's outputs and
    the other groups' input channels: the same convolution exactly, one windowing and one GEMM
    as for ``group == 1``, but ``group`` times the multiply-adds (the zeros are multiplied
    too); per-group GEMMs joined by a concat would skip them at ``group`` times the graph
    operations.

    Args:
        weight: ``[O, C / group, kh, kw]``.
        group: the Conv's ``group``.
        channels: the input's ``C``.

    Returns:
        ``[O, C, kh, kw]``, block-diagonal over the groups.

    Raises:
        GraphError: ``group`` does not divide ``C`` and ``O``, or the weight's channels are
            not ``C / group``.
    """
    o, per_group = weight.shape[:2]
    if group < 1 or channels % group or o % group:
        raise GraphError(
            f"group={group} must divide the {channels} input channels and the {o} outputs"
        )
    if per_group != channels // group:
        raise GraphError(
            f"group={group} of {channels} channels is {channels // group} channels a group, "
            f"but the weight takes {per_group}"
        )
    dense = np.zeros((o, channels, *weight.shape[2:]), weight.dtype)
    outputs = o // group
    for k in range(group):
        rows, columns = (
            slice(k * outputs, (k + 1) * outputs),
            slice(k * per_group, (k + 1) * per_group),
        )
        dense[rows, columns] = weight[rows]
    return dense


#: strides, pads ``[top, left, bottom, right]`` and dilations of a (2-D-viewed) window op
Geometry = tuple[list[int], list[int], list[int]]


def _windows(
    imp: Importer,
    x: Value,
    kernel: tuple[int, int],
    geometry: Geometry,
    out: str,
    fill: float = 0.0,
) -> tuple[list[Value], tuple[int, int]]:
    """The windows of the NCHW ``x`` (padded with ``fill`` as ``geometry`` says), one per
    kernel offset in row-major order, and the output's height and width."""
    kh, kw = kernel
    if kh * kw > MAX_WINDOWS:
        raise GraphError(f"a {kh}x{kw} kernel is {kh * kw} windows; at most {MAX_WINDOWS}")
    strides, pads, dilations = geometry
    padded = _padded(imp, x, pads, out, fill)
    hp, wp = padded.shape[2:]
    size = (
        (hp - dilations[0] * (kh - 1) - 1) // strides[0] + 1,
        (wp - dilations[1] * (kw - 1) - 1) // strides[1] + 1,
    )
    if min(size) < 1:
        raise GraphError(
            f"the {kh}x{kw} kernel (dilations {dilations}) exceeds the input {x.shape}"
        )
    windows = [
        _window(
            imp, padded, (ky * dilations[0], kx * dilations[1]), strides, size, f"{out}/w{ky}_{kx}"
        )
        for ky in range(kh)
        for kx in range(kw)
    ]
    return windows, size


def _geometry(
    node: NodeProto,
    one_d: bool,
    kernel: tuple[int, ...],
    spatial: tuple[int, ...],
    ceil_mode: bool = False,
) -> Geometry:
    """Strides, pads ``[top, left, bottom, right]`` and dilations of a (2-D-viewed) Conv or
    pooling; with ``ceil_mode`` the end pads grow to hold the last, partial windows."""
    rank = 1 if one_d else 2
    strides = _ints(attribute(node, "strides", [1] * rank))  # type: ignore[arg-type]
    dilations = _ints(attribute(node, "dilations", [1] * rank))  # type: ignore[arg-type]
    pads = _ints(attribute(node, "pads", [0] * 2 * rank))  # type: ignore[arg-type]
    auto_pad = auto_pad_of(node)
    if one_d:
        strides, dilations, pads = [1, *strides], [1, *dilations], [0, pads[0], 0, pads[1]]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0, 0, 0, 0]
        for axis in range(2):
            size, k = spatial[axis], kernel[axis]
            total = max((-(-size // strides[axis]) - 1) * strides[axis]
                        + dilations[axis] * (k - 1) + 1 - size, 0)  # fmt: skip
            first = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pads[axis], pads[axis + 2] = first, total - first
    elif auto_pad not in ("NOTSET", "VALID"):
        raise GraphError(f"auto_pad={auto_pad!r} is not supported")
    if min(strides) < 1 or min(dilations) < 1 or min(pads) < 0:
        raise GraphError(f"strides {strides}, dilations {dilations}, pads {pads}: invalid")
    if ceil_mode:
        pads = list(pads)
        for axis in range(2):
            padded = spatial[axis] + pads[axis] + pads[axis + 2]
            reach = dilations[axis] * (kernel[axis] - 1) + 1
            size = -(-(padded - reach) // strides[axis]) + 1  # ceil
            # ONNX (and onnxruntime, PyTorch): a window may not start in the end padding
            if (size - 1) * strides[axis] >= spatial[axis] + pads[axis]:
                size -= 1
            pads[axis + 2] += max((size - 1) * strides[axis] + reach - padded, 0)
    return strides, pads, dilations


def auto_pad_of(node: NodeProto) -> str:
    """The node's ``auto_pad`` attribute as text (``NOTSET`` when absent)."""
    value = attribute(node, "auto_pad", b"NOTSET")
    return value.decode() if isinstance(value, bytes) else str(value)


def _padded(imp: Importer, x: Value, pads: list[int], out: str, fill: float = 0.0) -> Value:
    """``x`` with rows of ``fill`` above and below and columns of it left and right."""
    g = imp.graph
    for axis, (before, after) in ((2, (pads[0], pads[2])), (3, (pads[1], pads[3]))):
        if not before and not after:
            continue
        parts = []
        for side, size in (("before", before), ("after", after)):
            shape = list(x.shape)
            shape[axis] = size
            if size:
                border = np.full(shape, fill)
                parts.append((side, imp.derived(out, f"pad{axis}_{side}", border, x)))
        pieces = [v for side, v in parts if side == "before"] + [x]
        pieces += [v for side, v in parts if side == "after"]
        x = g.concat(pieces, axis, name=imp.op_name(f"{out}/pad{axis}"))
    return x


def _window(
    imp: Importer,
    x: Value,
    offset: tuple[int, int],
    strides: list[int],
    size: tuple[int, int],
    name: str,
) -> Value:
    """``x[:, :, oy : oy + sy * (h - 1) + 1 : sy, ox : ... : sx]`` (a strided axis as the runs
    of indices it keeps, see ``take_indices``)."""
    from ipu_stack.graph.onnx_ops_exported import take_indices

    g = imp.graph
    ends = [offset[a] + strides[a] * (size[a] - 1) + 1 for a in range(2)]
    y = g.slice(x, list(offset), ends, [2, 3], name=imp.op_name(name))
    for a in range(2):
        if strides[a] != 1:
            keep = np.arange(0, ends[a] - offset[a], strides[a])
            y = take_indices(imp, y, keep, a + 2, imp.op_name(f"{name}/step{a}"))
    return y


def _im2col(
    imp: Importer,
    windows: list[Value],
    weight: np.ndarray,
    dtype: str,
    shape: tuple[int, int, int, int],
    out: str,
) -> Value:
    """The windows stacked along the channels, one GEMM with the weights in ``dtype`` (the
    rows cast to it first when the windows were cut wider), back to NCHW in the windows'
    precision."""
    g = imp.graph
    n, c, oh, ow = shape
    o, _, kh, kw = weight.shape
    stacked = (
        g.concat(windows, 1, name=imp.op_name(f"{out}/windows")) if len(windows) > 1 else windows[0]
    )
    flat = g.view(stacked, (n, kh * kw * c, oh * ow), name=imp.op_name(f"{out}/columns"))
    rows = g.transpose(flat, (0, 2, 1), name=imp.op_name(f"{out}/rows"))
    wide = rows.dtype
    if wide != dtype:
        rows = g.cast(rows, dtype, name=imp.op_name(f"{out}/rows_{dtype}"))
    # the stacked channel (ky * kw + kx) * C + c meets weight[o, c, ky, kx]
    columns = weight.transpose(2, 3, 1, 0).reshape(kh * kw * c, o)
    w = imp.derived(out, "im2col", columns.astype(np.float64), rows)
    y = g.gemm(rows, w, name=imp.op_name(f"{out}/gemm"))  # [N, OH*OW, O]
    if wide != dtype:
        y = g.cast(y, wide, name=imp.op_name(f"{out}/gemm_{wide}"))
    channels = g.transpose(y, (0, 2, 1), name=imp.op_name(f"{out}/channels"))
    return g.view(channels, (n, o, oh, ow), name=imp.op_name(f"{out}/nchw"))


def _depthwise(
    imp: Importer, windows: list[Value], weight: np.ndarray, like: Value, out: str
) -> Value:
    """Sum over the kernel offsets of each window times its per-channel weight."""
    g = imp.graph
    c, kw = weight.shape[0], weight.shape[3]
    total: Value | None = None
    for k, window in enumerate(windows):
        ky, kx = divmod(k, kw)
        w = imp.derived(
            out, f"tap{ky}_{kx}", weight[:, 0, ky, kx].astype(np.float64).reshape(c, 1, 1), like
        )
        term = g.mul(window, w, name=imp.op_name(f"{out}/tap{ky}_{kx}"))
        total = term if total is None else g.add(total, term, name=imp.op_name(f"{out}/sum{k}"))
    assert total is not None
    return total


def max_pool(imp: Importer, node: NodeProto, out: str) -> Value:
    """MaxPool (2-D, or 1-D on NCL): the larger of the windows, offset by offset; padding
    (explicit, or ``ceil_mode``'s past the end) is the precision's lowest finite value, which
    no window of real values loses to."""
    g = imp.graph
    x = imp.value(node.input[0])
    if any(node.output[1:]):
        raise GraphError("the Indices output is not supported")
    x, one_d, kernel = _pooled_input(imp, node, x, out)
    lowest = float(np.finfo(np.float16 if x.dtype == "f16" else np.float32).min)
    wide = as_f32(imp, x, f"{out}/f32")
    geometry = _geometry(node, one_d, kernel, x.shape[2:], bool(_int(node, "ceil_mode", 0)))
    windows, (oh, ow) = _windows(imp, wide, kernel, geometry, out, lowest)
    y = windows[0]
    for k, window in enumerate(windows[1:], 1):
        y = g.maximum(y, window, name=imp.op_name(f"{out}/max{k}"))
    if y.dtype != x.dtype:  # the maximum of F16 values is one of them: exact
        y = g.cast(y, x.dtype, name=imp.op_name(f"{out}/{x.dtype}"))
    n, c = x.shape[:2]
    return g.view(y, (n, c, ow) if one_d else (n, c, oh, ow), name=imp.op_name(out))


def _pooled_input(
    imp: Importer, node: NodeProto, x: Value, out: str
) -> tuple[Value, bool, tuple[int, int]]:
    """The pooling's NCHW input (an NCL one viewed over a height of 1), whether it was 1-D,
    and the 2-D kernel."""
    kernel = _ints(attribute(node, "kernel_shape", []))  # type: ignore[arg-type]
    one_d = len(x.shape) == 3 and len(kernel) == 1
    if one_d:
        x = imp.graph.view(x, (*x.shape[:2], 1, x.shape[2]), name=imp.op_name(f"{out}/as_2d"))
        kernel = [1, *kernel]
    if len(x.shape) != 4 or len(kernel) != 2:
        raise GraphError(f"input {x.shape}, kernel {kernel}: only 1-D and 2-D {node.op_type}")
    return x, one_d, (kernel[0], kernel[1])


def window_counts(
    spatial: tuple[int, int],
    kernel: tuple[int, int],
    geometry: Geometry,
    counted_pads: list[int],
) -> np.ndarray:
    """How many elements each output position's window averages ``[OH, OW]``: those of the
    input and of ``counted_pads`` (the explicit pads with ``count_include_pad=1``, else none);
    never the end padding ``ceil_mode`` adds, as onnxruntime and PyTorch divide."""
    strides, pads, dilations = geometry
    h, w = spatial
    counted = np.ones(
        (h + counted_pads[0] + counted_pads[2], w + counted_pads[1] + counted_pads[3])
    )
    mask = np.zeros((h + pads[0] + pads[2], w + pads[1] + pads[3]))
    top, left = pads[0] - counted_pads[0], pads[1] - counted_pads[1]
    mask[top : top + counted.shape[0], left : left + counted.shape[1]] = counted
    size = [(mask.shape[a] - dilations[a] * (kernel[a] - 1) - 1) // strides[a] + 1 for a in (0, 1)]
    counts = np.zeros(size)
    for ky in range(kernel[0]):
        for kx in range(kernel[1]):
            y0, x0 = ky * dilations[0], kx * dilations[1]
            counts += mask[
                y0 : y0 + strides[0] * (size[0] - 1) + 1 : strides[0],
                x0 : x0 + strides[1] * (size[1] - 1) + 1 : strides[1],
            ]
    return counts


def average_pool(imp: Importer, node: NodeProto, out: str) -> Value:
    """AveragePool (2-D, or 1-D on NCL): the sum of the zero-padded windows times a constant
    map of each position's reciprocal window count (:func:`window_counts`), in F32 for F16
    inputs."""
    g = imp.graph
    x = imp.value(node.input[0])
    x, one_d, kernel = _pooled_input(imp, node, x, out)
    spatial = (x.shape[2], x.shape[3])
    geometry = _geometry(node, one_d, kernel, spatial, bool(_int(node, "ceil_mode", 0)))
    explicit = _geometry(node, one_d, kernel, spatial)[1]
    counted = explicit if _int(node, "count_include_pad", 0) else [0, 0, 0, 0]
    counts = window_counts(spatial, kernel, geometry, counted)
    if counts.min() < 1:
        raise GraphError(f"pads {explicit}: a window holds no input element")
    wide = as_f32(imp, x, f"{out}/f32")
    windows, (oh, ow) = _windows(imp, wide, kernel, geometry, out)
    total = windows[0]
    for k, window in enumerate(windows[1:], 1):
        total = g.add(total, window, name=imp.op_name(f"{out}/sum{k}"))
    scale = imp.derived(out, "reciprocal_counts", 1.0 / counts, total)
    y = g.mul(total, scale, name=imp.op_name(f"{out}/mean"))
    if y.dtype != x.dtype:
        y = g.cast(y, x.dtype, name=imp.op_name(f"{out}/{x.dtype}"))
    n, c = x.shape[:2]
    return g.view(y, (n, c, ow) if one_d else (n, c, oh, ow), name=imp.op_name(out))


def emit_average_pool(imp: Importer, node: NodeProto, _: GemmFusion | None) -> Value:
    """AveragePool: see :func:`average_pool`."""
    return average_pool(imp, node, imp.label(node))


EMITTERS: dict[str, Emitter] = {"AveragePool": emit_average_pool}

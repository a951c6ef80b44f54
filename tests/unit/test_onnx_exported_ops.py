"""ONNX operators and patterns of torch/transformers exports, one at a time, against
onnxruntime (the importer's float64 graph reference vs. an independent runtime), at odd sizes;
their refusals; and one GraphError naming every unsupported node."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from tests.unit.test_onnx_import import check_against_onnxruntime, f32, kinds, make_model, node

from ipu_stack.errors import GraphError
from ipu_stack.graph.onnx_import import import_onnx

pytest.importorskip("onnxruntime")

X = (3, 5, 7)  # odd sizes


def _unary(op: str, **attrs):
    return lambda: make_model([node(op, ["x"], ["y"], **attrs)], {"x": X}, ["y"])


def _positive_sqrt():
    nodes = [node("Mul", ["x", "x"], ["sq"]), node("Sqrt", ["sq"], ["y"])]
    return make_model(nodes, {"x": X}, ["y"])


def _pow(exponent: float):
    nodes = [node("Mul", ["x", "x"], ["sq"]), node("Pow", ["sq", "e"], ["y"])]
    return make_model(nodes, {"x": X}, ["y"], {"e": np.array(exponent, np.float32)})


def _gemm_then(op: str, extra: dict, consts: dict | None = None, opset: int = 20, **attrs):
    """A MatMul first (a computed operand), then ``op``."""
    nodes = [node("MatMul", ["x", "w"], ["h"]), node(op, ["h", *extra], ["y"], **attrs)]
    inputs = {"x": (3, 5, 7), **{k: v for k, v in extra.items() if v is not None}}
    return make_model(nodes, inputs, ["y"], {"w": f32((7, 9)), **(consts or {})}, opset)


def _split(**attrs):
    sizes = attrs.pop("sizes", None)
    inputs = ["h", "s"] if sizes is not None else ["h"]
    nodes = [node("MatMul", ["x", "w"], ["h"]), node("Split", inputs, ["a", "b", "c"], **attrs)]
    consts = {"w": f32((7, 9))}
    if sizes is not None:
        consts["s"] = np.array(sizes, np.int64)
    return make_model(nodes, {"x": X}, ["a", "b", "c"], consts, opset=18)


def _gather(indices, axis: int):
    nodes = [node("MatMul", ["x", "w"], ["h"]), node("Gather", ["h", "i"], ["y"], axis=axis)]
    return make_model(nodes, {"x": X}, ["y"], {"w": f32((7, 9)), "i": np.array(indices)})


def _conv(b=2, c=3, h=12, w=8, o=5, k=4, bias=True):
    inputs = ["x", "wt", "bias"] if bias else ["x", "wt"]
    conv = node("Conv", inputs, ["y"], kernel_shape=[k, k], strides=[k, k])
    consts = {"wt": f32((o, c, k, k))}
    if bias:
        consts["bias"] = f32((o,), seed=3)
    return make_model([conv], {"x": (b, c, h, w)}, ["y"], consts, opset=17)


def _conv_case(x: tuple[int, ...], wt: tuple[int, ...], bias: bool = False, **attrs):
    """One Conv of ``x`` by a constant weight of shape ``wt`` (and a bias ``b``), ``attrs``
    as given."""
    consts = {"wt": f32(wt), **({"b": f32((wt[0],))} if bias else {})}
    conv = node("Conv", ["x", *consts], ["y"], **attrs)
    return make_model([conv], {"x": x}, ["y"], consts)


def _gelu_tanh_legacy(order: int):
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x*x*x))) as the legacy exporter."""
    c = {
        "half": np.float32(0.5),
        "one": np.float32(1.0),
        "k": np.float32(np.sqrt(2 / np.pi)),
        "cubic": np.float32(0.044715),
    }
    nodes = [
        node("Mul", ["x", "x"], ["x2"]),
        node("Mul", ["x2", "x"] if order else ["x", "x2"], ["x3"]),
        node("Mul", ["cubic", "x3"] if order else ["x3", "cubic"], ["cx3"]),
        node("Add", ["x", "cx3"] if order else ["cx3", "x"], ["inner"]),
        node("Mul", ["inner", "k"], ["scaled"]),
        node("Tanh", ["scaled"], ["t"]),
        node("Add", ["one", "t"] if order else ["t", "one"], ["onep"]),
        node("Mul", ["x", "half"], ["hx"]),
        node("Mul", ["hx", "onep"] if order else ["onep", "hx"], ["y"]),
    ]
    return make_model(nodes, {"x": X}, ["y"], c)


def _rms_norm():
    return make_model(
        [node("RMSNormalization", ["x", "s"], ["y"], epsilon=1e-5)],
        {"x": X},
        ["y"],
        {"s": f32((7,))},
        opset=23,
    )


CASES = {
    "tanh": (_unary("Tanh"), "tanh"),
    "sigmoid": (_unary("Sigmoid"), "sigmoid"),
    "neg": (_unary("Neg"), "neg"),
    "relu": (_unary("Relu"), "relu"),
    "reciprocal": (_unary("Reciprocal"), "reciprocal"),
    "sqrt": (_positive_sqrt, "sqrt"),
    "pow_cube": (
        lambda: make_model(
            [node("Pow", ["x", "e"], ["y"])], {"x": X}, ["y"], {"e": np.array(3.0, np.float32)}
        ),
        "pow",
    ),
    "pow_half": (lambda: _pow(0.5), "pow"),
    "pow_square": (
        lambda: make_model(
            [node("Pow", ["x", "e"], ["y"])], {"x": X}, ["y"], {"e": np.array(2.0, np.float32)}
        ),
        "mul",
    ),
    "sub_computed": (
        lambda: make_model([node("Sub", ["x", "z"], ["y"])], {"x": X, "z": (5, 1)}, ["y"]),
        "sub",
    ),
    "sub_from_constant": (
        lambda: make_model(
            [node("Sub", ["one", "x"], ["y"])], {"x": X}, ["y"], {"one": np.float32(1.0)}
        ),
        "sub",
    ),
    "div_computed": (
        lambda: make_model([node("Div", ["x", "z"], ["y"])], {"x": X, "z": (7,)}, ["y"]),
        "div",
    ),
    "reduce_mean_18": (
        lambda: _gemm_then("ReduceMean", {}, {"ax": np.array([-1])}, opset=18),
        "reduce_mean",
    ),
    "reduce_mean_17_nokeep": (
        lambda: _gemm_then("ReduceMean", {}, opset=17, axes=[2], keepdims=0),
        "reduce_mean",
    ),
    "reduce_mean_trailing_two": (
        lambda: _gemm_then("ReduceMean", {}, opset=17, axes=[-2, -1]),
        "reduce_mean",
    ),
    "reduce_mean_all_nokeep": (
        lambda: _gemm_then("ReduceMean", {}, opset=17, keepdims=0),
        "reduce_mean",
    ),
    "global_average_pool": (
        lambda: make_model([node("GlobalAveragePool", ["x"], ["y"])], {"x": (2, 3, 4, 5)}, ["y"]),
        "reduce_mean",
    ),
    "batch_norm_nchw": (
        lambda: make_model(
            [node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)],
            {"x": (2, 3, 4, 5)},
            ["y"],
            {"s": f32((3,)), "b": f32((3,)), "m": f32((3,)), "v": np.abs(f32((3,))) + 0.5},
        ),
        "mul",
    ),
    "batch_norm_1d": (
        lambda: make_model(
            [node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])],
            {"x": (6, 7)},
            ["y"],
            {"s": f32((7,)), "b": f32((7,)), "m": f32((7,)), "v": np.abs(f32((7,))) + 0.5},
        ),
        "add",
    ),
    "instance_norm": (
        lambda: make_model(
            [node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-4)],
            {"x": (2, 3, 4, 5)},
            ["y"],
            {"s": f32((3,)), "b": f32((3,))},
        ),
        "layer_norm",
    ),
    "conv_padded_patches": (
        lambda: _conv_case(
            (1, 3, 8, 8), (4, 3, 2, 2), kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1]
        ),
        "gemm",
    ),
    "conv_3x3_same": (
        lambda: _conv_case(
            (2, 3, 6, 5), (4, 3, 3, 3), True, kernel_shape=[3, 3], pads=[1, 1, 1, 1]
        ),
        "gemm",
    ),
    "conv_strided_dilated": (
        lambda: _conv_case(
            (1, 2, 9, 10),
            (3, 2, 3, 2),
            kernel_shape=[3, 2],
            strides=[2, 3],
            dilations=[2, 1],
            pads=[2, 0, 1, 1],
        ),
        "gemm",
    ),
    "conv_depthwise": (
        lambda: _conv_case(
            (1, 3, 7, 6), (3, 1, 3, 3), True, kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=3
        ),
        "mul",
    ),
    "conv_1d_whisper": (
        lambda: _conv_case((1, 4, 11), (5, 4, 3), True, kernel_shape=[3], strides=[2], pads=[1, 1]),
        "gemm",
    ),
    "conv_same_upper": (
        lambda: _conv_case(
            (1, 2, 7, 8), (3, 2, 3, 3), kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"
        ),
        "gemm",
    ),
    "max_pool_3x3_s2_p1": (
        lambda: make_model(
            [node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
            {"x": (2, 3, 9, 8)},
            ["y"],
        ),
        "max",
    ),
    "max_pool_1d": (
        lambda: make_model(
            [node("MaxPool", ["x"], ["y"], kernel_shape=[2], strides=[2])],
            {"x": (1, 3, 10)},
            ["y"],
        ),
        "max",
    ),
    "clip_relu6": (
        lambda: make_model(
            [node("Clip", ["x", "lo", "hi"], ["y"])],
            {"x": X},
            ["y"],
            {"lo": np.array(0.0, np.float32), "hi": np.array(0.5, np.float32)},
        ),
        "min",
    ),
    "clip_lower_only": (
        lambda: make_model(
            [node("Clip", ["x", "lo"], ["y"])],
            {"x": X},
            ["y"],
            {"lo": np.array(-0.25, np.float32)},
        ),
        "max",
    ),
    "max_of_three": (
        lambda: make_model(
            [node("Max", ["x", "z", "w"], ["y"])],
            {"x": X, "z": X, "w": (7,)},
            ["y"],
        ),
        "max",
    ),
    "min_of_two": (
        lambda: make_model([node("Min", ["x", "z"], ["y"])], {"x": X, "z": X}, ["y"]),
        "min",
    ),
    "gelu_tanh_op": (_unary("Gelu", approximate="tanh"), "gelu"),
    "gelu_tanh_legacy": (lambda: _gelu_tanh_legacy(0), "gelu"),
    "gelu_tanh_legacy_swapped": (lambda: _gelu_tanh_legacy(1), "gelu"),
    "split_sizes": (lambda: _split(axis=2, sizes=[2, 3, 4]), "slice"),
    "split_num_outputs": (lambda: _split(axis=-1, num_outputs=3), "slice"),
    "split_axis1": (lambda: _split(axis=1, sizes=[1, 1, 3]), "slice"),
    "gather_scalar_axis1": (lambda: _gather(np.int64(-2), 1), "slice"),
    "gather_range_axis2": (lambda: _gather(np.array([3, 4, 5], np.int64), 2), "slice"),
    "conv_patches": (_conv, "gemm"),
    "conv_patches_cropped": (lambda: _conv(b=1, h=10, w=9, bias=False), "gemm"),
    "rms_norm": (_rms_norm, "reduce_mean"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_operator_matches_onnxruntime(name):
    build, kind = CASES[name]
    model = build()
    if name == "reduce_mean_18":  # the axes input
        model.graph.node[1].input.append("ax")
    graph, _ = check_against_onnxruntime(model, rtol=2e-5)
    assert kind in kinds(graph)
    if name.startswith("gelu_tanh_legacy"):
        assert kinds(graph) == ["gelu"], "the tanh GeLU pattern must fuse into one gelu"


def test_a_mutated_gelu_constant_is_not_fused():
    """0.045 instead of 0.044715: not GeLU; the ops are emitted one by one and still match."""
    model = _gelu_tanh_legacy(0)
    for init in model.graph.initializer:
        if init.name == "cubic":
            init.CopyFrom(helper.make_tensor("cubic", 1, [], [0.045]))
    graph, _ = check_against_onnxruntime(model, rtol=2e-5)
    assert "gelu" not in kinds(graph) and "tanh" in kinds(graph)


REFUSALS = {
    "conv_kernel_too_large": (
        lambda: _conv_case((1, 2, 12, 12), (2, 2, 9, 9), kernel_shape=[9, 9]),
        r"\(Conv\): a 9x9 kernel is 81 windows; at most 64",
    ),
    "pow_tensor_exponent": (
        lambda: make_model([node("Pow", ["x", "e"], ["y"])], {"x": X, "e": (7,)}, ["y"]),
        r"\(Pow\): the exponent input 'e' is computed at run time",
    ),
    "split_bad_sizes": (
        lambda: _split(axis=2, sizes=[2, 3, 5]),
        # the ONNX validator finds it first (strict shape inference), naming the node
        r"split_a.*Mismatch between the sum of .split. \(10\) and the split dimension",
    ),
    "gather_out_of_range": (
        lambda: _gather(np.int64(9), 2),
        r"\(Gather\): indices \[9\] out of range for axis 2 \(9\)",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_refusal_names_node_and_attribute(name):
    build, pattern = REFUSALS[name]
    with pytest.raises(GraphError, match=pattern):
        import_onnx(build())


def test_three_unsupported_nodes_are_named_in_one_error():
    nodes = [
        node("Elu", ["x"], ["a"]),
        node("Conv", ["img", "wt"], ["b"], kernel_shape=[3, 3], group=2),
        node("Erf", ["x"], ["c"]),
        node("Add", ["a", "x"], ["d"]),  # depends on a failed node: not reported again
    ]
    model = make_model(
        nodes, {"x": (4, 4), "img": (1, 3, 8, 8)}, ["b", "c", "d"], {"wt": f32((4, 3, 3, 3))}
    )
    with pytest.raises(GraphError) as info:
        import_onnx(model)
    message = str(info.value)
    assert "\n" not in message  # one line: the command line prints an error's first
    head, rest = message.split(": ", 1)
    assert head == "3 ONNX nodes cannot be imported"
    parts = rest.split(" | ")
    assert len(parts) == 3
    assert parts[0].startswith("ONNX node 'elu_a' (Elu): op type 'Elu' is not supported")
    assert parts[1].startswith("ONNX node 'conv_b' (Conv): group=2 must divide the 3 input")
    assert parts[2].startswith("ONNX node 'erf_c' (Erf): op type 'Erf' is not supported")


def test_batch_norm_in_training_mode_is_refused():
    stats = {"s": f32((3,)), "b": f32((3,)), "m": f32((3,)), "v": np.abs(f32((3,))) + 0.5}
    model = make_model(
        [node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"],
              training_mode=1)],
        {"x": (2, 3, 4)},
        ["y"],
        stats,
        opset=15,
    )  # fmt: skip
    with pytest.raises(GraphError, match="training mode"):
        import_onnx(model)

"""Grouped ``Conv``, ``MaxPool`` with ``ceil_mode`` and ``AveragePool`` (``graph/onnx_conv.py``)
against onnxruntime: the importer's float64 reference at several shapes and attributes, a few
through the build and the simulator (F32 and F16), and their one-line refusals."""

from __future__ import annotations

import numpy as np
import pytest
from tests.integration.test_cli_onnx import _save, _simulated_and_onnxruntime
from tests.unit.test_onnx_import import check_against_onnxruntime, f32, kinds, make_model, node

from ipu_stack.errors import GraphError
from ipu_stack.graph.onnx_conv import block_diagonal
from ipu_stack.graph.onnx_import import import_onnx

pytest.importorskip("onnxruntime")


def _conv(x_shape, w_shape, bias=False, **attrs):
    inputs = ["x", "wt", "b"] if bias else ["x", "wt"]
    consts = {"wt": f32(w_shape), **({"b": f32((w_shape[0],), seed=2)} if bias else {})}
    return make_model([node("Conv", inputs, ["y"], **attrs)], {"x": x_shape}, ["y"], consts)


def _pool(op, x_shape, opset=19, **attrs):
    return make_model([node(op, ["x"], ["y"], **attrs)], {"x": x_shape}, ["y"], opset=opset)


GROUPED = {
    "2d_group2_padded_strided": ((1, 4, 7, 6), (6, 2, 3, 3), {"kernel_shape": [3, 3],
                                 "strides": [2, 1], "pads": [1, 1, 1, 1], "group": 2}),
    "2d_group3_dilated_bias": ((2, 6, 8, 8), (9, 2, 3, 2), {"kernel_shape": [3, 2],
                               "dilations": [2, 1], "pads": [2, 0, 1, 1], "group": 3}),
    "1d_group4_wav2vec2_pos_conv": ((1, 8, 13), (8, 2, 4), {"kernel_shape": [4], "pads": [2, 2],
                                    "group": 4}),
    "1d_group2_pointwise_squeezebert": ((2, 6, 5), (8, 3, 1), {"kernel_shape": [1], "group": 2}),
    "depth_multiplier_2": ((1, 3, 6, 5), (6, 1, 3, 3), {"kernel_shape": [3, 3], "group": 3}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(GROUPED))
def test_grouped_conv_matches_onnxruntime(name):
    x_shape, w_shape, attrs = GROUPED[name]
    graph, _ = check_against_onnxruntime(
        _conv(x_shape, w_shape, bias="bias" in name, **attrs), rtol=2e-5
    )
    assert "gemm" in kinds(graph)


def test_block_diagonal_weight_is_zero_outside_each_group():
    weight = f32((6, 2, 3, 3))
    dense = block_diagonal(weight, 3, 6)
    assert dense.shape == (6, 6, 3, 3)
    for k in range(3):
        rows = slice(2 * k, 2 * k + 2)
        np.testing.assert_array_equal(dense[rows, 2 * k : 2 * k + 2], weight[rows])
        others = np.delete(dense[rows], [2 * k, 2 * k + 1], axis=1)
        assert not others.any()


MAX_POOLS = {
    # SqueezeNet: 3 x 3 / 2 on an even size, the last window one column short
    "ceil_3x3_s2": ((1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "ceil_3x3_s2_odd": ((2, 3, 9, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    # padded 7 wide: ceil gives 4 windows, but the 4th would start in the end padding: 3
    "ceil_start_in_end_pad": ((1, 2, 5, 5), {"kernel_shape": [2, 2], "strides": [2, 2],
                              "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    "ceil_1d": ((1, 3, 10), {"kernel_shape": [3], "strides": [2], "ceil_mode": 1}),
    "ceil_dilated": ((1, 2, 9, 8), {"kernel_shape": [2, 2], "strides": [3, 2], "dilations": [2, 1],
                     "ceil_mode": 1}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(MAX_POOLS))
def test_max_pool_ceil_mode_matches_onnxruntime(name):
    x_shape, attrs = MAX_POOLS[name]
    graph, _ = check_against_onnxruntime(_pool("MaxPool", x_shape, **attrs), rtol=0)
    assert "max" in kinds(graph)


AVERAGE_POOLS = {
    # PoolFormer's token mixer
    "3x3_p1_exclude_pad": ((1, 3, 6, 5), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                           "count_include_pad": 0}),
    "3x3_p1_include_pad": ((1, 3, 6, 5), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                           "count_include_pad": 1}),
    "2x2_s2": ((2, 2, 8, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "3x2_s2_uneven_pads": ((1, 2, 7, 9), {"kernel_shape": [3, 2], "strides": [2, 3],
                           "pads": [1, 0, 2, 1]}),
    "ceil_exclude_pad": ((1, 2, 8, 7), {"kernel_shape": [3, 3], "strides": [2, 2],
                         "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    "ceil_include_pad": ((1, 2, 8, 7), {"kernel_shape": [3, 3], "strides": [2, 2],
                         "pads": [1, 1, 1, 1], "ceil_mode": 1, "count_include_pad": 1}),
    "ceil_unpadded": ((1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "1d_include_pad": ((1, 3, 11), {"kernel_shape": [4], "strides": [2], "pads": [1, 2],
                       "count_include_pad": 1}),
    "dilated": ((1, 2, 9, 9), {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1]}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(AVERAGE_POOLS))
def test_average_pool_matches_onnxruntime(name):
    x_shape, attrs = AVERAGE_POOLS[name]
    graph, _ = check_against_onnxruntime(_pool("AveragePool", x_shape, **attrs), rtol=2e-6)
    assert "mul" in kinds(graph)


def test_average_pool_of_opset_11_without_dilations():
    model = _pool("AveragePool", (1, 2, 6, 6), opset=11, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    check_against_onnxruntime(model, rtol=2e-6)


REFUSALS = {
    "channels_not_divisible": (
        lambda: _conv((1, 6, 5, 5), (4, 2, 3, 3), kernel_shape=[3, 3], group=4),
        r"\(Conv\): group=4 must divide the 6 input channels and the 4 outputs",
    ),
    "outputs_not_divisible": (
        lambda: _conv((1, 6, 5, 5), (5, 2, 3, 3), kernel_shape=[3, 3], group=3),
        r"\(Conv\): group=3 must divide the 6 input channels and the 5 outputs",
    ),
    "weight_channels_not_a_group": (
        lambda: _conv((1, 6, 5, 5), (6, 3, 3, 3), kernel_shape=[3, 3], group=3),
        r"\(Conv\): group=3 of 6 channels is 2 channels a group, but the weight takes 3",
    ),
    "window_holds_no_input": (
        lambda: _pool("AveragePool", (1, 1, 4, 4), kernel_shape=[2, 2], pads=[2, 2, 0, 0]),
        r"\(AveragePool\): pads \[2, 2, 0, 0\]: a window holds no input element",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_refusal_names_node_and_reason(name):
    build, pattern = REFUSALS[name]
    with pytest.raises(GraphError, match=pattern) as info:
        import_onnx(build())
    assert "\n" not in str(info.value)


def test_grouped_conv_of_a_computed_weight_is_refused_naming_the_node():
    """wav2vec2's weight-normed positional conv, were its weight not folded: one line."""
    nodes = [
        node("Mul", ["x2", "x2"], ["wt"]),
        node("Conv", ["x", "wt"], ["y"], kernel_shape=[3], pads=[1, 1], group=2),
    ]
    model = make_model(nodes, {"x": (1, 4, 9), "x2": (4, 2, 3)}, ["y"])
    with pytest.raises(GraphError, match=r"ONNX node 'conv_y' \(Conv\): the weight input 'wt' "
                       r"is computed at run time") as info:  # fmt: skip
        import_onnx(model)
    assert "\n" not in str(info.value)


SIMULATED = {
    "grouped_conv": (
        [node("Conv", ["x", "wt", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2)],
        (1, 4, 6, 5),
        {"wt": f32((6, 2, 3, 3)), "b": f32((6,), seed=2)},
    ),
    "grouped_conv_1d": (
        [node("Conv", ["x", "wt"], ["y"], kernel_shape=[4], pads=[2, 2], group=4)],
        (1, 8, 9),
        {"wt": f32((8, 2, 4))},
    ),
    "max_pool_ceil": (
        [node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)],
        (2, 3, 8, 7),
        {},
    ),
    "average_pool_exclude_pad": (
        [node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
        (1, 3, 6, 5),
        {},
    ),
    "average_pool_ceil_include_pad": (
        [node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
              pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1)],
        (1, 2, 8, 7),
        {},
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "precision"),
    [(name, precision) for name in sorted(SIMULATED) for precision in ("f32", "f16")],
)
def test_simulated_run_matches_onnxruntime(tmp_path, name, precision):
    """Through the build and the simulator; at F16 the windows are cut in F32 and the result
    cast back (a maximum of F16 values is exact)."""
    nodes, x_shape, consts = SIMULATED[name]
    path = _save(tmp_path, nodes, {"x": list(x_shape)}, consts)
    x = np.random.default_rng(11).standard_normal(x_shape).astype(np.float32)
    if precision == "f16":
        x = x.astype(np.float16).astype(np.float32)  # the same input for onnxruntime
    got, want = _simulated_and_onnxruntime(path, x, precision)
    if name.startswith("max_pool"):
        np.testing.assert_array_equal(got, want)
        return
    tolerance = 0.01 if precision == "f16" else 1e-5
    assert np.abs(got - want).max() <= tolerance * np.abs(want).max()

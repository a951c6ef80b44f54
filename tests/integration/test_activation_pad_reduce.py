"""HardSwish/HardSigmoid, constant Pad, ReduceMean over leading axes and F16 strided column
slices (MobileNetV3 and LeViT, ConvBERT and MobileBERT, channels-first LayerNorm, GPT-J's
interleaved rotary at F16): simulated, against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from tests.integration.test_cli_onnx import _save, _simulated_and_onnxruntime
from tests.unit.test_onnx_import import check_against_onnxruntime, make_model, node

from ipu_stack.errors import GraphError
from ipu_stack.graph.onnx_import import import_onnx

RNG = np.random.default_rng(21)


def test_hard_swish_and_hard_sigmoid_simulate_as_onnxruntime_computes_them(tmp_path):
    nodes = [
        helper.make_node("HardSwish", ["x"], ["s"], name="swish"),
        helper.make_node("HardSigmoid", ["s"], ["y"], alpha=0.3, beta=0.4, name="gate"),
    ]
    path = _save(tmp_path, nodes, {"x": [2, 3, 5]})
    x = (RNG.standard_normal((2, 3, 5)) * 4).astype(np.float32)
    got, want = _simulated_and_onnxruntime(path, x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("pads", "value"),
    [
        ([0, 1, 0, 0, 2, 0], None),  # one axis, zeros
        ([1, 0, 2, 0, 1, 3], 1.5),  # every axis, a value
        ([0, -1, 1, 0, 2, -2], 0.0),  # crops too
    ],
)
def test_constant_pads_simulate_as_onnxruntime_computes_them(tmp_path, pads, value):
    inputs = ["x", "pads"] + (["value"] if value is not None else [])
    consts = {"pads": np.array(pads, np.int64)}
    if value is not None:
        consts["value"] = np.array(value, np.float32)
    path = _save(tmp_path, [helper.make_node("Pad", inputs, ["y"], name="pad")], {"x": [2, 4, 6]},
                 consts)  # fmt: skip
    x = RNG.standard_normal((2, 4, 6)).astype(np.float32)
    got, want = _simulated_and_onnxruntime(path, x)
    np.testing.assert_array_equal(got, want)


def test_pad_modes_other_than_constant_are_refused():
    pad = node("Pad", ["x", "pads"], ["y"], mode="reflect")
    model = make_model([pad], {"x": (2, 4)}, ["y"], {"pads": np.array([0, 1, 0, 1], np.int64)})
    with pytest.raises(GraphError, match="mode 'reflect' is not supported"):
        import_onnx(model)


@pytest.mark.parametrize(("axes", "keepdims"), [([1], 1), ([1], 0), ([0, 2], 1), ([1, 3], 0)])
def test_means_over_leading_axes_match_onnxruntime(axes, keepdims):
    mean = node("ReduceMean", ["x", "axes"], ["y"], keepdims=keepdims)
    model = make_model([mean], {"x": (2, 3, 4, 5)}, ["y"], {"axes": np.array(axes, np.int64)},
                       opset=18)  # fmt: skip
    check_against_onnxruntime(model, rtol=1e-6)


@pytest.mark.parametrize("precision", ["f32", "f16"])
def test_a_channels_first_mean_simulates(tmp_path, precision):
    reduce = helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=1, name="mean")
    path = _save(tmp_path, [reduce], {"x": [2, 6, 3, 4]})
    graph_opset_17 = path.replace("model.onnx", "model17.onnx")
    import onnx

    model = onnx.load(path)
    model.opset_import[0].version = 17  # axes as an attribute
    onnx.save(model, graph_opset_17)
    x = RNG.standard_normal((2, 6, 3, 4)).astype(np.float32)
    got, want = _simulated_and_onnxruntime(graph_opset_17, x, precision)
    tolerance = 1e-5 if precision == "f32" else 2e-3
    assert np.abs(got - want).max() <= tolerance * np.abs(want).max()


def test_f16_columns_taken_every_second_one_simulate(tmp_path):
    """GPT-J's rotary takes x[..., 1::2]: at F16 each column starts inside a 32-bit word."""
    nodes = [
        helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"], name="odd"),
    ]
    consts = {k: np.array([v], np.int64) for k, v in (("s", 1), ("e", 8), ("a", -1), ("st", 2))}
    path = _save(tmp_path, nodes, {"x": [3, 2, 8]}, consts)
    x = RNG.standard_normal((3, 2, 8)).astype(np.float32)
    got, want = _simulated_and_onnxruntime(path, x, "f16")
    assert np.abs(got - want).max() <= 2e-3 * np.abs(want).max()

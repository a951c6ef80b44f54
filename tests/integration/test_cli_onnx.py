"""``ipu-stack onnx MODEL``: exit 0 when the simulated model matches, 2 with a clear message."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ipu_stack.cli import main

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"


def _save(tmp_path: Path, nodes, inputs, initializers=None) -> str:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for n, a in (initializers or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return str(path)


def test_example_passes_with_json_report(capsys):
    assert main(["onnx", str(EXAMPLES_DIR / "mlp2_f32.onnx"), "--tiles", "16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["reference"] == "onnxruntime"
    (output,) = report["outputs"]
    assert output["name"] == "y" and output["relative_error"] <= 1e-3
    assert report["simulated_cycles"] > 0


def test_symbolic_input_needs_input_shape(tmp_path, capsys):
    path = _save(tmp_path, [helper.make_node("Softmax", ["x"], ["y"])], {"x": ["n", 8]})
    assert main(["onnx", path, "--tiles", "4"]) == 2
    assert "input_shapes" in capsys.readouterr().err
    assert main(["onnx", path, "--tiles", "4", "--input-shape", "x=4,8"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_unsupported_operator_exits_2_naming_the_node(tmp_path, capsys):
    path = _save(tmp_path, [helper.make_node("Elu", ["x"], ["y"], name="act")], {"x": [4]})
    assert main(["onnx", path]) == 2
    assert "ONNX node 'act' (Elu): op type 'Elu' is not supported" in capsys.readouterr().err


def test_weights_that_cannot_fit_exit_2_with_the_shortfall(tmp_path, capsys):
    weight = np.zeros((1024, 1024), np.float32)  # 4 MiB on one tile
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="big_matmul")
    path = _save(tmp_path, [node], {"x": [8, 1024]}, {"w": weight})
    assert main(["onnx", path, "--tiles", "1"]) == 2
    err = capsys.readouterr().err
    assert "big_matmul" in err and "does not fit" in err
    assert "more than" in err


@pytest.mark.parametrize("bad", ["x", "=4,8", "x=4,-1"])
def test_bad_input_shape_argument_exits_2(bad, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["onnx", "model.onnx", "--input-shape", bad])
    assert exit_info.value.code == 2


def _simulated_and_onnxruntime(path: str, x: np.ndarray, precision: str = "f32"):
    """(our simulated output, onnxruntime's) for the one-input, one-output model at ``path``,
    imported at ``precision`` (the model converted first for f16), 8 quick tiles."""
    import onnxruntime as ort

    from ipu_stack.graph.onnx_import import import_onnx
    from ipu_stack.graph.onnx_precision import convert_precision
    from ipu_stack.package.build import BuildConfig, build
    from ipu_stack.runtime.sim import SimDevice

    want = ort.InferenceSession(path).run(None, {"x": x})[0]
    model = onnx.load(path)
    graph, bindings = import_onnx(convert_precision(model, "f16") if precision == "f16" else model)
    config = BuildConfig(tiles=8, exchange_time_budget=0.05, finalists=1, compile_kernels=False)
    built = build(graph, config)
    feeds = bindings.feeds({"x": x.astype(np.float16 if precision == "f16" else np.float32)})
    run = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    got = np.asarray(bindings.onnx_outputs(run.outputs)["y"], np.float64).reshape(want.shape)
    return got, want


@pytest.mark.parametrize(("precision", "width"), [("f16", 8), ("f32", 8), ("f32", 7), ("f16", 7)])
def test_a_pointwise_conv_builds_and_matches_onnxruntime(tmp_path, precision, width):
    """A 1 x 1 convolution (an MLP over channels): at F16 its patch view's one-element pieces
    started inside 32-bit words and the build refused them; each pixel's channels are a row
    now. An odd number of F16 pixels still puts rows at odd offsets: refused, one line."""
    from ipu_stack.errors import GraphError

    rng = np.random.default_rng(5)
    weight = (rng.standard_normal((6, 5, 1, 1)) * 0.3).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1], name="pointwise")
    path = _save(tmp_path, [node], {"x": [2, 5, 3, width]}, {"w": weight})
    x = rng.standard_normal((2, 5, 3, width)).astype(np.float32)
    if precision == "f16" and width % 2:
        with pytest.raises(GraphError, match="start inside a 32-bit word"):
            _simulated_and_onnxruntime(path, x, precision)
        return
    got, want = _simulated_and_onnxruntime(path, x, precision)
    tolerance = 0.01 if precision == "f16" else 1e-5
    assert np.abs(got - want).max() <= tolerance * np.abs(want).max()


@pytest.mark.parametrize(
    ("attrs", "weight_shape", "x_shape"),
    [
        ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, (4, 3, 3, 3), (1, 3, 6, 6)),
        ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, (4, 3, 3, 3),
         (1, 3, 7, 8)),
        ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": 3}, (3, 1, 3, 3), (2, 3, 5, 6)),
        ({"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, (5, 4, 3), (1, 4, 12)),
    ],
)  # fmt: skip
def test_general_convs_simulate_as_onnxruntime_computes_them(tmp_path, attrs, weight_shape,
                                                            x_shape):  # fmt: skip
    """Padded, strided, depthwise and 1-D convolutions (windows, then a GEMM or a sum of
    per-channel products) through the build and the simulator, against onnxruntime."""
    rng = np.random.default_rng(6)
    weight = (rng.standard_normal(weight_shape) * 0.3).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **attrs)
    path = _save(tmp_path, [node], {"x": list(x_shape)}, {"w": weight})
    got, want = _simulated_and_onnxruntime(path, rng.standard_normal(x_shape).astype(np.float32))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_max_pool_and_clip_simulate_as_onnxruntime_computes_them(tmp_path):
    """ResNet's stem pooling (3 x 3, stride 2, padded with the lowest value) and MobileNet's
    ReLU6 (Clip 0..6): maxima and minima on the simulator, against onnxruntime."""
    nodes = [
        helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], name="pool"),
        helper.make_node("Clip", ["p", "lo", "hi"], ["y"], name="relu6"),
    ]  # fmt: skip
    consts = {"lo": np.array(0.0, np.float32), "hi": np.array(0.6, np.float32)}
    path = _save(tmp_path, nodes, {"x": [2, 3, 9, 8]}, consts)
    x = np.random.default_rng(8).standard_normal((2, 3, 9, 8)).astype(np.float32)
    got, want = _simulated_and_onnxruntime(path, x)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": 3},
    ],
)
def test_f16_convs_cut_their_windows_in_f32(tmp_path, attrs):
    """At F16 a window at an odd column offset would start inside a 32-bit word: windows are
    cut in F32 and the GEMM (or the depthwise sum's result) is F16 again."""
    rng = np.random.default_rng(9)
    shape = (3, 1, 3, 3) if attrs.get("group") else (4, 3, 3, 3)
    weight = (rng.standard_normal(shape) * 0.3).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **attrs)
    path = _save(tmp_path, [node], {"x": [1, 3, 6, 7]}, {"w": weight})
    x = rng.standard_normal((1, 3, 6, 7)).astype(np.float32)
    got, want = _simulated_and_onnxruntime(path, x, "f16")
    assert np.abs(got - want).max() <= 0.01 * np.abs(want).max()


def test_f16_pooled_means_reshaped_to_rows(tmp_path):
    """MobileNet's head at F16: a mean over H and W kept as [N, C, 1, 1], then reshaped to
    [N, C]. One F16 element per row moved into a packed row would start inside a 32-bit
    word; such views are taken in F32."""
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[2, 3], keepdims=1, name="pool"),
        helper.make_node("Reshape", ["m", "shape"], ["y"], name="flat"),
    ]
    path = _save(tmp_path, nodes, {"x": [2, 5, 3, 4]}, {"shape": np.array([2, 5], np.int64)})
    model = onnx.load(path)
    model.opset_import[0].version = 17  # ReduceMean's axes as an attribute
    onnx.save(model, path)
    x = np.random.default_rng(10).standard_normal((2, 5, 3, 4)).astype(np.float32)
    got, want = _simulated_and_onnxruntime(path, x, "f16")
    assert np.abs(got - want).max() <= 0.01 * np.abs(want).max()

"""ONNX models with external data: weights memory-mapped, files past 2 GB, bad files named."""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ipu_stack.errors import GraphError
from ipu_stack.graph.compute_graph import evaluate_reference
from ipu_stack.graph.onnx_external import load_model, tensor_array
from ipu_stack.graph.onnx_import import import_onnx

BEYOND_2GB = 2**31 + 4096


def mlp(rng):
    w1 = rng.uniform(-0.1, 0.1, (64, 512)).astype(np.float32)
    w2 = rng.uniform(-0.1, 0.1, (512, 32)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Reshape", ["h", "shape"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])],
        [
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(np.array([8, 512], np.int64), "shape"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mapped(array):
    """Whether ``array`` is a view of a memory-mapped file."""
    while isinstance(array, np.ndarray):
        if isinstance(array, np.memmap):
            return True
        array = array.base
    return False


def save_external(model, directory, offset=0):
    """Write ``model`` with every initializer in one side file, the first at ``offset``."""
    data = directory / "weights.bin"
    with open(data, "wb") as f:
        position = offset
        for tensor in model.graph.initializer:
            raw = numpy_helper.to_array(tensor).tobytes()
            f.seek(position)
            f.write(raw)
            tensor.ClearField("raw_data")
            del tensor.float_data[:], tensor.int64_data[:]
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (
                ("location", "weights.bin"),
                ("offset", position),
                ("length", len(raw)),
            ):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, str(value)
            position += -(-len(raw) // 4096) * 4096
    path = directory / "model.onnx"
    onnx.save(model, str(path))
    return path


def test_external_weights_are_memory_mapped_and_import_like_inline(tmp_path):
    rng = np.random.default_rng(0)
    model = mlp(rng)
    inline_graph, inline = import_onnx(model)
    path = save_external(mlp(np.random.default_rng(0)), tmp_path)
    graph, bindings = import_onnx(path)
    big = [a for a in bindings.parameters.values() if a.size == 64 * 512]
    assert big and all(mapped(a) for a in big)
    x = rng.uniform(-1, 1, (8, 64)).astype(np.float32)
    got = evaluate_reference(graph, bindings.feeds({"x": x}))
    want = evaluate_reference(inline_graph, inline.feeds({"x": x}))
    for name in got:
        np.testing.assert_array_equal(got[name], want[name])


def test_model_past_2gb_loads_without_reading_the_whole_file(tmp_path):
    # a sparse side file: the weights sit beyond 2 GB, so offsets need 64 bits
    model = mlp(np.random.default_rng(1))
    reference = ort.InferenceSession(model.SerializeToString())
    path = save_external(model, tmp_path, offset=BEYOND_2GB)
    assert os.path.getsize(tmp_path / "weights.bin") > 2**31
    graph, bindings = import_onnx(path)
    x = np.random.default_rng(2).uniform(-1, 1, (8, 64)).astype(np.float32)
    got = evaluate_reference(graph, bindings.feeds({"x": x}))
    want = reference.run(None, {"x": x})[0]
    assert np.abs(next(iter(got.values())).reshape(want.shape) - want).max() < 1e-5


def test_missing_or_short_external_file_is_named(tmp_path):
    path = save_external(mlp(np.random.default_rng(3)), tmp_path)
    with open(tmp_path / "weights.bin", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(GraphError, match=r"external tensor 'w1': needs 131072 bytes at offset 0"):
        load_model(path)
    os.remove(tmp_path / "weights.bin")
    with pytest.raises(GraphError, match=r"external data file .*weights\.bin.* not found"):
        load_model(path)
    with pytest.raises(GraphError, match="not found"):
        load_model(tmp_path / "absent.onnx")


def test_compile_precision_conversion_reads_external_weights(tmp_path):
    from ipu_stack.package.commands import _load_onnx

    model = mlp(np.random.default_rng(4))
    want = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float16)
    path = save_external(model, tmp_path)
    proto = _load_onnx(str(path), "f16", {})
    w1 = next(t for t in proto.graph.initializer if t.name == "w1")
    # declared F16 but left on disk: converted when read, one tensor at a time
    assert w1.data_type == onnx.TensorProto.FLOAT16 and w1.data_location == 1
    got = tensor_array(w1)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want)
    lazy = _load_onnx(str(path), None, {})
    assert next(t for t in lazy.graph.initializer if t.name == "w1").data_location == 1


def test_precision_converted_external_model_compiles_and_matches(tmp_path):
    # F32 weights on disk, imported as F16 without reading the file into the proto
    from ipu_stack.package.build import BuildConfig, build
    from ipu_stack.package.commands import _load_onnx
    from ipu_stack.runtime.sim import SimDevice

    model = mlp(np.random.default_rng(5))
    reference = ort.InferenceSession(model.SerializeToString())
    path = save_external(model, tmp_path)
    graph, bindings = import_onnx(_load_onnx(str(path), "f16", {}))
    built = build(graph, BuildConfig(tiles=16))
    x = np.random.default_rng(6).uniform(-1, 1, (8, 64)).astype(np.float32)
    feeds = bindings.feeds({"x": x.astype(np.float16)})
    run = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    got = bindings.onnx_outputs(run.outputs)["y"]
    assert got.dtype == np.float16
    want = reference.run(None, {"x": x})[0]
    assert np.abs(got.astype(np.float32) - want).max() <= 0.01 * np.abs(want).max()

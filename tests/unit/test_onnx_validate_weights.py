"""Validation checks large weights without serializing them, and still rejects bad ones."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ipu_stack.errors import GraphError
from ipu_stack.graph.onnx_validate import LIGHT_BYTES, validate_onnx


def _model(rows: int = 64, cols: int = 48, shape: tuple[int, ...] = (2, 64)) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((rows, cols), np.float32), "W")  # 12 KiB: heavy
    assert len(w.raw_data) > LIGHT_BYTES
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [shape[0], cols])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_valid_model_passes_and_is_not_modified():
    m = _model()
    before = m.SerializeToString()
    validate_onnx(m)
    assert m.SerializeToString() == before


def test_a_heavy_initializer_whose_data_does_not_fill_its_dims_is_named():
    m = _model()
    m.graph.initializer[0].dims[0] = 65  # 65 x 48 elements, 64 x 48 of data
    with pytest.raises(GraphError, match=r"initializer 'W' has .* dims \[65, 48\]"):
        validate_onnx(m)


def test_shapes_are_still_inferred_through_heavy_weights():
    # y declared [2, 48] but x [2, 63] cannot multiply a 64 x 48 weight
    with pytest.raises(GraphError, match="shape and type inference"):
        validate_onnx(_model(shape=(2, 63)))

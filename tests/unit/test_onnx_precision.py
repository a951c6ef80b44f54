"""compile --precision f16: float constants beyond the F16 range saturate, infinities stay."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ipu_stack.graph.onnx_precision import convert_precision

LOWEST = float(np.finfo(np.float32).min)


def _masked_softmax() -> object:
    """y = Softmax(x + (1 - m) * finfo(f32).min), the additive padding mask exporters write."""
    nodes = [
        helper.make_node("Sub", ["one", "m"], ["inv"]),
        helper.make_node("Mul", ["inv", "lowest"], ["bias"]),
        helper.make_node("Add", ["x", "bias"], ["s"]),
        helper.make_node("Softmax", ["s"], ["y"], axis=-1),
    ]
    consts = [
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(LOWEST, np.float32), "lowest"),
    ]
    graph = helper.make_graph(
        nodes,
        "masked",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 5]) for n in ("x", "m")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        consts,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_out_of_range_constants_saturate_and_infinities_stay():
    const = numpy_helper.from_array(np.array([LOWEST, 1e5, -np.inf, 3.0], np.float32), "c")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [const],
    )
    half = convert_precision(helper.make_model(graph), "f16")
    values = numpy_helper.to_array(half.graph.initializer[0])
    assert values.dtype == np.float16
    assert values.tolist() == [-65504.0, 65504.0, -np.inf, 3.0]


def test_a_fully_masked_row_stays_finite_in_f16_as_in_f32():
    model = _masked_softmax()
    x = np.random.default_rng(3).standard_normal((2, 5)).astype(np.float32)
    m = np.array([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0]], np.float32)  # row 1: every key padded
    (ref,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x, "m": m})
    half = convert_precision(model, "f16")
    (got,) = ort.InferenceSession(half.SerializeToString()).run(
        None, {"x": x.astype(np.float16), "m": m.astype(np.float16)}
    )
    assert np.isfinite(ref).all() and np.isfinite(got).all()  # as -inf: NaN in row 1
    np.testing.assert_allclose(got[0].astype(np.float32), ref[0], atol=2e-3)
    assert abs(float(got[1].astype(np.float32).sum()) - 1.0) < 2e-3

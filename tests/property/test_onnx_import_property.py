"""Property: importing Slice/Transpose/Reshape chains and evaluating the graph gives what the
onnx package's reference evaluator gives, for any bounds, permutation and target shape."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from ipu_stack.errors import GraphError
from ipu_stack.graph import evaluate_reference
from ipu_stack.graph.onnx_import import import_onnx

reference = pytest.importorskip("onnx.reference")


@st.composite
def slice_transpose_reshape(draw):
    rank = draw(st.integers(1, 4))
    shape = draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank))
    axes = draw(
        st.lists(
            st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank
        )
    )
    starts = [draw(st.integers(-7, 7)) for _ in axes]
    ends = [draw(st.sampled_from([draw(st.integers(-7, 7)), 2**62])) for _ in axes]
    perm = draw(st.permutations(range(rank)))
    # The reshape target keeps the element count; one axis may be -1 and copies may be 0.
    style = draw(st.sampled_from(["flat", "minus_one", "zero"]))
    return shape, axes, starts, ends, list(perm), style


@settings(max_examples=60, deadline=None)
@given(slice_transpose_reshape())
def test_import_matches_the_onnx_reference(case):
    shape, axes, starts, ends, perm, style = case
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    sliced = reference.ReferenceEvaluator(
        helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])
    ).run(None, {"x": x, "s": np.array(starts), "e": np.array(ends), "a": np.array(axes)})[0]
    if sliced.size == 0:
        target = [1]
    elif style == "flat":
        target = [sliced.size]
    elif style == "minus_one":
        target = [-1, sliced.shape[perm[-1]]]
    else:
        target = [0, -1]
    consts = {
        "s": np.array(starts, np.int64),
        "e": np.array(ends, np.int64),
        "a": np.array(axes, np.int64),
        "target": np.array(target, np.int64),
    }
    nodes = [
        helper.make_node("Slice", ["x", "s", "e", "a"], ["sl"]),
        helper.make_node("Transpose", ["sl"], ["tr"], perm=perm),
        helper.make_node("Reshape", ["tr", "target"], ["y"]),
    ]
    graph_proto = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 20)])
    if sliced.size == 0:
        with pytest.raises(GraphError, match=r"\(Slice\).*empty"):
            import_onnx(model)
        return
    expected = reference.ReferenceEvaluator(model).run(None, {"x": x})[0]
    graph, bindings = import_onnx(model)
    actual = bindings.onnx_outputs(evaluate_reference(graph, bindings.feeds({"x": x})))["y"]
    assert actual.shape == expected.shape
    np.testing.assert_array_equal(actual, expected)

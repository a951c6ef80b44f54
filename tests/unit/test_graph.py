import numpy as np
import pytest

from ipu_stack.errors import GraphError
from ipu_stack.graph import ComputeGraph, evaluate_reference


def test_gemm_shape_rules_with_transposes_and_broadcast():
    g = ComputeGraph()
    a = g.host_input("a", (2, 1, 16, 8), "f16")
    b = g.parameter("b", (3, 32, 16), "f16")
    out = g.gemm(a, b, transpose_left=True, transpose_right=True)
    assert out.shape == (2, 3, 8, 32)


def test_inner_mismatch_names_operation_and_operands():
    g = ComputeGraph()
    a = g.host_input("a", (4, 5))
    b = g.parameter("b", (6, 7))
    with pytest.raises(GraphError, match=r"gemm0: inner dimensions differ: 'a' .* K=5, 'b' .* K=6"):
        g.gemm(a, b)


@pytest.mark.parametrize("shape", [(0, 3), (4, -1), ()])
def test_bad_dimensions_rejected(shape):
    with pytest.raises(GraphError, match="positive"):
        ComputeGraph().host_input("x", shape)


def test_unknown_precision_and_duplicate_names():
    g = ComputeGraph()
    with pytest.raises(GraphError, match="unknown precision 'f64'"):
        g.host_input("x", (2, 2), "f64")
    g.host_input("x", (2, 2))
    with pytest.raises(GraphError, match="used twice"):
        g.parameter("x", (2, 2))


def test_batch_axes_that_do_not_broadcast():
    g = ComputeGraph()
    a = g.host_input("a", (2, 4, 4))
    b = g.parameter("b", (3, 4, 4))
    with pytest.raises(GraphError, match="do not broadcast"):
        g.gemm(a, b)


def test_rank_one_and_mixed_precision_rejected():
    g = ComputeGraph()
    v = g.host_input("v", (4,))
    m = g.parameter("m", (4, 4))
    m32 = g.parameter("m32", (4, 4), "f32")
    with pytest.raises(GraphError, match="rank >= 2"):
        g.gemm(v, m)
    with pytest.raises(GraphError, match="precisions differ"):
        g.gemm(m, m32)


def test_reference_evaluation():
    g = ComputeGraph()
    a = g.host_input("a", (3, 4))
    b = g.parameter("b", (5, 4))
    g.set_outputs(g.gemm(a, b, transpose_right=True, name="mm"))
    feeds = {"a": np.ones((3, 4)), "b": np.arange(20.0).reshape(5, 4)}
    np.testing.assert_allclose(evaluate_reference(g, feeds)["mm.out"], feeds["a"] @ feeds["b"].T)


def test_graph_without_outputs_fails_verification():
    with pytest.raises(GraphError, match="no outputs"):
        ComputeGraph().verify()

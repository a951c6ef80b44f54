"""Scalar multiplies after a projection fold into its weights: same values, one op fewer."""

from __future__ import annotations

import numpy as np

from ipu_stack.graph import ComputeGraph
from ipu_stack.graph.compute_graph import evaluate_reference
from ipu_stack.graph.scale_folding import fold_scalar_scales

T, H, D = 6, 2, 4


def _scaled_heads(shared_weights: bool = False, leak: bool = False) -> tuple[ComputeGraph, dict]:
    g = ComputeGraph()
    x = g.host_input("x", (T, H * D), "f32")
    w = g.parameter("w", (H * D, H * D), "f32")
    b = g.parameter("b", (H * D,), "f32")
    c = g.parameter("c", (1,), "f32")
    y = g.add(b, g.gemm(x, w))
    heads = g.transpose(g.view(y, (T, H, D)), (1, 0, 2))
    outs = [g.mul(heads, c, name="scaled")]
    if shared_weights:
        outs.append(g.gemm(x, w, name="again"))
    if leak:
        outs.append(g.gelu(y, name="leak"))
    g.set_outputs(*outs)
    rng = np.random.default_rng(0)
    params = {
        "w": rng.standard_normal((H * D, H * D)).astype(np.float32),
        "b": rng.standard_normal(H * D).astype(np.float32),
        "c": np.array([0.3433], dtype=np.float32),
    }
    return g, params


def test_the_multiply_folds_into_weights_and_bias_with_the_same_values():
    g, params = _scaled_heads()
    result = fold_scalar_scales(g, params)
    assert [op.kind for op in result.graph.operations].count("mul") == 0
    assert result.fusions and "folded 1 scalar multiplies" in result.fusions[0]
    assert "c" not in result.parameters  # nothing uses the scalar any more
    x = np.random.default_rng(1).standard_normal((T, H * D)).astype(np.float32)
    want = evaluate_reference(g, {"x": x, **params})[g.value(g.outputs[0]).name]
    new_out = result.value_map[g.outputs[0]]
    got = evaluate_reference(result.graph, {"x": x, **result.parameters})[new_out.name]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.parameters["w"], params["w"] * np.float32(0.3433), rtol=1e-6)


def test_shared_weights_or_a_value_used_elsewhere_are_left_alone():
    for kwargs in ({"shared_weights": True}, {"leak": True}):
        g, params = _scaled_heads(**kwargs)
        result = fold_scalar_scales(g, params)
        assert result.graph is g and not result.fusions, kwargs
        assert [op.kind for op in g.operations].count("mul") == 1


def test_a_multiply_by_a_tensor_is_not_a_scale():
    g = ComputeGraph()
    x = g.host_input("x", (T, D), "f32")
    w = g.parameter("w", (D, D), "f32")
    s = g.parameter("s", (D,), "f32")
    g.set_outputs(g.mul(g.gemm(x, w), s))
    params = {"w": np.eye(D, dtype=np.float32), "s": np.arange(D, dtype=np.float32)}
    assert not fold_scalar_scales(g, params).fusions

"""Attention key biases are dropped only where softmax cannot see them."""

from __future__ import annotations

import numpy as np

from ipu_stack.graph import ComputeGraph
from ipu_stack.graph.compute_graph import evaluate_reference
from ipu_stack.graph.key_bias import drop_key_biases

T, H, D = 5, 2, 4


def _attention(key_axis_bias: bool = False, scores_escape: bool = False):
    g = ComputeGraph()
    x = g.host_input("x", (T, H * D), "f32")
    wq = g.parameter("wq", (H * D, H * D), "f32")
    wk = g.parameter("wk", (H * D, H * D), "f32")
    bk = g.parameter("bk", (H * D,), "f32")
    q = g.transpose(g.view(g.gemm(x, wq), (T, H, D)), (1, 0, 2))  # [H, T, D]
    k = g.add(bk, g.gemm(x, wk))
    if key_axis_bias:  # [T, H*D] used as it is: the bias runs along the scores' last axis
        scores = g.gemm(g.host_input("y", (2, T), "f32"), k)
    else:  # K^T of the heads: [H, D, T]
        scores = g.gemm(q, g.transpose(g.view(k, (T, H, D)), (1, 2, 0)))
    probs = g.softmax(scores)
    g.set_outputs(probs, scores) if scores_escape else g.set_outputs(probs)
    rng = np.random.default_rng(2)
    params = {n: rng.standard_normal(s).astype(np.float32) * 0.3
              for n, s in (("wq", (H * D, H * D)), ("wk", (H * D, H * D)), ("bk", (H * D,)))}  # fmt: skip
    params["bk"] *= 20  # a large bias: dropping it would show if it mattered
    feeds = {"x": rng.standard_normal((T, H * D)).astype(np.float32),
             "y": rng.standard_normal((2, T)).astype(np.float32), **params}  # fmt: skip
    return g, params, feeds


def test_the_key_bias_of_head_split_attention_is_dropped_and_changes_nothing():
    g, params, feeds = _attention()
    result = drop_key_biases(g, params)
    assert result.fusions and result.fusions[0].startswith("dropped 1 attention key biases")
    assert [op.kind for op in result.graph.operations].count("add") == 0
    assert "bk" not in result.parameters and "wk" in result.parameters
    want = evaluate_reference(g, feeds)[g.value(g.outputs[0]).name]
    got = evaluate_reference(result.graph, {**feeds, **result.parameters})[
        result.value_map[g.outputs[0]].name
    ]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_a_bias_along_the_key_axis_or_visible_scores_are_kept():
    for kwargs in ({"key_axis_bias": True}, {"scores_escape": True}):
        g, params, _ = _attention(**kwargs)
        result = drop_key_biases(g, params)
        assert result.graph is g and not result.fusions, kwargs

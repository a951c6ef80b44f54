"""Attention biases are folded away only where softmax makes them constant."""

from __future__ import annotations

import numpy as np

from ipu_stack.graph import ComputeGraph
from ipu_stack.graph.attention_biases import fold_attention_biases
from ipu_stack.graph.compute_graph import evaluate_reference

T, H, D = 5, 2, 4
SHAPES = {
    "wq": (H * D, H * D),
    "wk": (H * D, H * D),
    "wv": (H * D, H * D),
    "wo": (H * D, H * D),
    "bk": (H * D,),
    "bv": (H * D,),
    "bo": (H * D,),
}


def _attention(key_axis_bias: bool = False, scores_escape: bool = False, mixed_escape=False):
    g = ComputeGraph()
    x = g.host_input("x", (T, H * D), "f32")
    p = {name: g.parameter(name, shape, "f32") for name, shape in SHAPES.items()}

    def heads(y):  # [T, H*D] -> [H, T, D]
        return g.transpose(g.view(y, (T, H, D)), (1, 0, 2))

    q = heads(g.gemm(x, p["wq"]))
    k = g.add(p["bk"], g.gemm(x, p["wk"]))
    if key_axis_bias:  # [T, H*D] used as it is: the bias runs along the scores' last axis
        scores = g.gemm(g.host_input("y", (2, T), "f32"), k)
    else:  # K^T of the heads: [H, D, T]
        scores = g.gemm(q, g.transpose(g.view(k, (T, H, D)), (1, 2, 0)))
    probs = g.softmax(scores)
    outs = [probs] + ([scores] if scores_escape else [])
    if not key_axis_bias:
        mixed = g.gemm(probs, heads(g.add(p["bv"], g.gemm(x, p["wv"]))))  # [H, T, D]
        merged = g.view(g.transpose(mixed, (1, 0, 2)), (T, H * D))
        outs = [g.add(g.gemm(merged, p["wo"]), p["bo"]), *outs[1:]]
        outs += [mixed] if mixed_escape else []
    g.set_outputs(*outs)
    rng = np.random.default_rng(2)
    params = {n: (rng.standard_normal(s) * 0.3).astype(np.float32) for n, s in SHAPES.items()}
    params["bk"] *= 20  # large biases: folding them wrongly would show
    params["bv"] *= 20
    feeds = {
        "x": rng.standard_normal((T, H * D)).astype(np.float32),
        "y": rng.standard_normal((2, T)).astype(np.float32),
        **params,
    }
    return g, params, feeds


def _same_outputs(g, feeds, result):
    want = evaluate_reference(g, feeds)
    got = evaluate_reference(result.graph, {**feeds, **result.parameters})
    for old in g.outputs:
        name = g.value(old).name
        np.testing.assert_allclose(got[result.value_map[old].name], want[name], rtol=1e-4,
                                   atol=1e-5)  # fmt: skip


def test_key_and_value_biases_fold_and_change_nothing():
    g, params, feeds = _attention()
    result = fold_attention_biases(g, params)
    assert result.fusions[0].startswith("dropped 1 attention key biases"), result.fusions
    assert result.fusions[1].startswith("moved 1 attention value biases"), result.fusions
    assert [op.kind for op in result.graph.operations].count("add") == 1  # the output bias
    assert "bk" not in result.parameters and "bv" not in result.parameters
    assert not np.allclose(result.parameters["bo"], params["bo"])
    _same_outputs(g, feeds, result)


def test_biases_that_softmax_does_not_cancel_or_that_escape_are_kept():
    g, params, _ = _attention(key_axis_bias=True)
    assert not fold_attention_biases(g, params).fusions
    g, params, _ = _attention(scores_escape=True, mixed_escape=True)
    assert not fold_attention_biases(g, params).fusions
    g, params, feeds = _attention(mixed_escape=True)  # the key bias still goes
    result = fold_attention_biases(g, params)
    assert len(result.fusions) == 1 and result.fusions[0].startswith("dropped 1")
    _same_outputs(g, feeds, result)

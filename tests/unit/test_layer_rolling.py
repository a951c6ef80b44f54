"""Layer rolling: identical consecutive layers become one repeat; anything else stays."""

import numpy as np
import pytest

from ipu_stack.graph import ComputeGraph, evaluate_reference
from ipu_stack.graph.layer_rolling import roll_layers

D, H = 24, 40


def stack(layers, *, epsilon=None, extra_at=None, escape_at=None, mask=False, seed=0):
    """An encoder-like stack: LN -> up -> gelu -> down -> +residual, per layer."""
    rng = np.random.default_rng(seed)
    g = ComputeGraph()
    x = g.host_input("x", (6, D), "f32")
    m = g.host_input("m", (6, D), "f32") if mask else None
    params = {}
    outs = []
    for i in range(layers):
        names = {k: f"l{i}.{k}" for k in ("s", "b", "w1", "c1", "w2", "c2")}
        shapes = {"s": (D,), "b": (D,), "w1": (D, H), "c1": (H,), "w2": (H, D), "c2": (D,)}
        p = {k: g.parameter(names[k], shapes[k], "f32") for k in names}
        for k in names:
            params[names[k]] = rng.standard_normal(shapes[k]).astype(np.float32) * 0.3
        eps = epsilon[i] if epsilon else 1e-6
        h = g.layer_norm(x, p["s"], p["b"], eps)
        if m is not None:
            h = g.mul(h, m)
        h = g.gelu(g.add(g.gemm(h, p["w1"]), p["c1"]))
        h = g.add(g.gemm(h, p["w2"]), p["c2"])
        if extra_at == i:
            h = g.gelu(h)
        if escape_at == i:
            outs.append(h)
        x = g.add(x, h)
    g.set_outputs(x, *outs)
    feeds = dict(params)
    feeds["x"] = rng.standard_normal((6, D)).astype(np.float32)
    if mask:
        feeds["m"] = rng.standard_normal((6, D)).astype(np.float32)
    return g, params, feeds


@pytest.mark.parametrize("layers", [2, 3, 7])
def test_identical_layers_roll_into_one_repeat(layers):
    g, params, feeds = stack(layers)
    rolled = roll_layers(g, params)
    assert [op.kind for op in rolled.graph.operations] == ["repeat"]
    (op,) = rolled.graph.operations
    assert op.attr("count") == layers
    assert rolled.fusions and rolled.fusions[0].startswith(f"rolled {layers} layers of 7 ")
    # weights of the layers are stacked, the per-layer parameters are gone
    assert not any(n.startswith("l0.") for n in rolled.parameters)
    assert {a.shape[0] for a in rolled.parameters.values()} == {layers}
    want = evaluate_reference(g, feeds)
    rfeeds = {"x": feeds["x"], **rolled.parameters}
    got = evaluate_reference(rolled.graph, rfeeds)
    np.testing.assert_allclose(next(iter(got.values())), next(iter(want.values())), rtol=1e-12)
    assert rolled.value_map[g.outputs[0]].id == rolled.graph.outputs[0]


def test_program_size_does_not_grow_with_depth():
    small = roll_layers(*stack(4)[:2]).graph
    deep = roll_layers(*stack(27)[:2]).graph
    body = [op.attr("body") for op in (small.operations[0], deep.operations[0])]
    assert len(body[0].operations) == len(body[1].operations) == 7


def test_invariant_operand_is_passed_once():
    g, params, feeds = stack(3, mask=True)
    rolled = roll_layers(g, params)
    (op,) = rolled.graph.operations
    assert op.attr("invariants") == 1
    got = evaluate_reference(rolled.graph, {**rolled.parameters, "x": feeds["x"], "m": feeds["m"]})
    want = evaluate_reference(g, feeds)
    np.testing.assert_allclose(next(iter(got.values())), next(iter(want.values())), rtol=1e-12)


def test_structurally_different_layers_stay_unrolled():
    # an attribute differs in the middle layer: rolling may take at most the runs around it
    g, params, _ = stack(3, epsilon=[1e-6, 1e-5, 1e-6])
    rolled = roll_layers(g, params)
    assert all(op.kind != "repeat" for op in rolled.graph.operations)
    assert rolled.graph is g and rolled.fusions == []
    # an extra operation in one layer
    g, params, _ = stack(2, extra_at=1)
    assert all(op.kind != "repeat" for op in roll_layers(g, params).graph.operations)


def test_value_escaping_a_layer_blocks_rolling_of_that_layer():
    g, params, feeds = stack(4, escape_at=1)
    rolled = roll_layers(g, params)
    counts = [op.attr("count") for op in rolled.graph.operations if op.kind == "repeat"]
    assert counts == [2]  # layers 2 and 3 roll; layer 1's value escapes to the outputs
    want = evaluate_reference(g, feeds)
    got = evaluate_reference(rolled.graph, {**rolled.parameters, "x": feeds["x"]})
    for a, b in zip(got.values(), want.values(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_a_partial_run_rolls_the_equal_part():
    # four layers whose last has another epsilon: the first three roll
    g, params, feeds = stack(4, epsilon=[1e-6, 1e-6, 1e-6, 1e-3])
    rolled = roll_layers(g, params)
    kinds = [op.kind for op in rolled.graph.operations]
    assert kinds[0] == "repeat" and rolled.graph.operations[0].attr("count") == 3
    assert len(kinds) == 1 + 7
    got = evaluate_reference(rolled.graph, {**rolled.parameters, "x": feeds["x"]})
    want = evaluate_reference(g, feeds)
    np.testing.assert_allclose(next(iter(got.values())), next(iter(want.values())), rtol=1e-12)

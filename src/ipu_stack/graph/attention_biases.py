"""Attention biases that softmax makes constant, folded away at import.

*Key biases are dropped.* In ``softmax(q @ (k + b)^T)`` over the keys, the bias adds ``q . b``
to every score of query row ``i``, the same for every key ``j``; softmax of a row is
unchanged by adding a constant to the row, so the result equals ``softmax(q @ k^T)``.

*Value biases move into the output projection's bias.* Each row of probabilities sums to 1,
so ``softmax(.) @ (v + b) = softmax(.) @ v + b``; after the head merge ``(o + b) @ W + c =
o @ W + (b @ W + c)``, so ``c`` absorbs ``b @ W`` (computed in float64, stored in ``c``'s
precision) and the add on ``v`` goes.

An exporter writes both projections as ``Add(b, MatMul(x, W))`` followed by reshapes and
transposes into heads: each add is one elementwise pass over a ``[tokens, width]`` tensor per
layer. Conditions: the scores are a GEMM's output used only by a last-axis ``softmax`` (key
side), or the probabilities are a ``softmax`` feeding a GEMM's left operand (value side);
the biased operand comes through views and transposes used only there from an ``add`` of a
parameter bias (broadcast along every axis but the last) to a value used only by it; the
bias, carried through those views and transposes, is constant along the right axis (the key
axis; the contraction axis and, after the merge, every axis but the output projection's
contraction axis). Those conditions are checked by moving an index pattern through the same
operations with NumPy (views and transposes only permute elements), so any head split and
merge is handled.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import numpy as np

from ipu_stack.graph.compute_graph import ComputeGraph, Operation
from ipu_stack.graph.scale_folding import (
    FoldedGraph,
    renamed_from,
    replay_without,
    unused_dropped,
)

RENAMING = ("view", "transpose")


def _pattern_through(
    graph: ComputeGraph, pattern: np.ndarray, chain: list[Operation]
) -> np.ndarray:
    """``pattern`` moved through views and transposes (applied in ``chain`` order)."""
    for step in chain:
        if step.kind == "view":
            pattern = pattern.reshape(graph.value(step.output).shape)
        else:
            pattern = np.transpose(pattern, step.attr("perm"))
    return pattern


def _biased_right(
    graph: ComputeGraph, gemm: Operation, producer: dict[int, Operation], uses: dict[int, int]
) -> tuple[Operation, int, str, np.ndarray] | None:
    """Behind ``gemm``'s right operand, through views and transposes used only there, an
    ``add`` of a parameter bias to a value used only by it: (the add, that value, the bias
    parameter's name, the bias's column index as it lands in the right operand)."""
    outputs = set(graph.outputs)
    found = renamed_from(graph, gemm.inputs[1], producer, uses)
    if found is None:
        return None
    op, chain = found
    if op.kind != "add" or len(op.inputs) != 2:
        return None
    values = [graph.value(i) for i in op.inputs]
    out = graph.value(op.output)
    bias = [v for v in values if v.kind == "parameter"]
    data = [v for v in values if v.kind != "parameter"]
    if len(bias) != 1 or len(data) != 1 or data[0].shape != out.shape:
        return None
    if bias[0].size != out.shape[-1] or uses[data[0].id] != 1 or data[0].id in outputs:
        return None
    pattern = np.broadcast_to(np.arange(out.shape[-1]), out.shape)
    return op, data[0].id, bias[0].name, _pattern_through(graph, pattern, chain[::-1])


def _constant_along(pattern: np.ndarray, axis: int) -> bool:
    moved = np.moveaxis(pattern, axis, -1)
    return bool((moved == moved[..., :1]).all())


def _value_bias(
    graph: ComputeGraph,
    pv: Operation,
    producer: dict[int, Operation],
    consumers: dict[int, list[Operation]],
    uses: dict[int, int],
    params: Mapping[str, np.ndarray],
) -> tuple[Operation, int, str, np.ndarray] | None:
    """For ``pv = softmax(.) @ (v + b)``: (the add, v, the output bias to change, the amount)
    when ``pv`` reaches, through views and transposes used only there, the left operand of
    a GEMM with parameter weights ``W`` whose only use is an ``add`` of a parameter bias ``c``
    used only there. Rows of probabilities sum to 1, so ``pv = softmax(.) @ v + b`` and the
    later ``(.. + b) @ W + c = .. @ W + (b @ W + c)``: the amount is ``b @ W`` (as ``c``)."""
    probs = producer.get(pv.inputs[0])
    if probs is None or probs.kind != "softmax" or pv.transpose_left:
        return None
    found = _biased_right(graph, pv, producer, uses)
    if found is None or found[2] not in params:
        return None
    add, data, bias_name, pattern = found
    contraction = -1 if pv.transpose_right else -2
    if not _constant_along(pattern, contraction):
        return None
    row = np.take(pattern, 0, axis=contraction)  # the bias index of each output column
    if pv.transpose_right:
        return None  # (b would run along the output rows; not an exporter's layout)
    out = np.broadcast_to(row[..., None, :], graph.value(pv.output).shape)
    chain: list[Operation] = []
    vid = pv.output
    outputs = set(graph.outputs)
    while True:
        users = consumers.get(vid, [])
        if len(users) != 1 or vid in outputs:
            return None
        op = users[0]
        if op.kind not in RENAMING:
            break
        chain.append(op)
        vid = op.output
    if op.kind != "gemm" or op.inputs[0] != vid or op.transpose_left or op.transpose_right:
        return None
    weights = graph.value(op.inputs[1])
    after = consumers.get(op.output, [])
    if weights.kind != "parameter" or weights.name not in params or len(after) != 1:
        return None
    bias_add = after[0]
    others = [graph.value(i) for i in bias_add.inputs if i != op.output]
    if bias_add.kind != "add" or len(others) != 1 or op.output in outputs:
        return None
    out_bias = others[0]
    if out_bias.kind != "parameter" or uses[out_bias.id] != 1 or out_bias.name not in params:
        return None
    if out_bias.size != graph.value(op.output).shape[-1]:
        return None
    left = _pattern_through(graph, out, chain)
    flat = left.reshape(-1, left.shape[-1])
    if not (flat == flat[:1]).all():
        return None  # the bias must lie along the GEMM's contraction axis only
    b = np.asarray(params[bias_name], dtype=np.float64).reshape(-1)[flat[0]]
    amount = b @ np.asarray(params[weights.name], dtype=np.float64)
    return add, data, out_bias.name, amount


def fold_attention_biases(graph: ComputeGraph, parameters: Mapping[str, np.ndarray]) -> FoldedGraph:
    """``graph`` without the attention key-bias adds that cannot change its outputs."""
    producer = {op.output: op for op in graph.operations}
    uses: dict[int, int] = defaultdict(int)
    for op in graph.operations:
        for i in set(op.inputs):
            uses[i] += 1
    dropped: dict[int, int] = {}
    for op in graph.operations:
        if op.kind != "softmax":
            continue
        scores = producer.get(op.inputs[0])
        if scores is None or scores.kind != "gemm" or uses[scores.output] != 1:
            continue
        if scores.output in graph.outputs:
            continue
        found = _biased_right(graph, scores, producer, uses)
        # the bias must be constant along the right operand's axis that becomes the key axis
        if found is not None and _constant_along(found[3], -2 if scores.transpose_right else -1):
            dropped[found[0].id] = found[1]
    keys = len(dropped)
    params = dict(parameters)
    consumers: dict[int, list[Operation]] = defaultdict(list)
    for op in graph.operations:
        for i in set(op.inputs):
            consumers[i].append(op)
    moved: list[str] = []
    for op in graph.operations:
        if op.kind != "gemm" or op.id in dropped:
            continue
        value = _value_bias(graph, op, producer, consumers, uses, params)
        if value is None or value[2] in moved:
            continue
        add, data, name, amount = value
        dropped[add.id] = data
        old = np.asarray(params[name])
        params[name] = (old.astype(np.float64) + amount.reshape(old.shape)).astype(old.dtype)
        moved.append(name)
    if not dropped:
        return FoldedGraph(graph, params, {v.id: v for v in graph.values}, [])
    new, vmap = replay_without(graph, dropped)
    lines = []
    if keys:
        lines.append(
            f"dropped {keys} attention key biases (softmax is unchanged by a per-row "
            f"constant; from {graph.operations[min(dropped)].name!r})"
        )
    if moved:
        lines.append(
            f"moved {len(moved)} attention value biases into the output projection's bias "
            f"(probability rows sum to 1; into {moved[0]!r})"
        )
    return FoldedGraph(new, unused_dropped(params, graph, new), vmap, lines)

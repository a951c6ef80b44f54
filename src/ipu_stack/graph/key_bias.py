"""Attention key biases dropped: softmax does not see a constant added to a whole row.

In ``softmax(q @ (k + b)^T)`` over the keys, the bias adds ``q . b`` to every score of query
row ``i``, the same for every key ``j``; softmax of a row is unchanged by adding a constant to
the row, so the result equals ``softmax(q @ k^T)``. An exporter writes the key projection as
``Add(b, MatMul(x, W_k))`` followed by reshapes and transposes into ``K^T``: the ``add`` is
one elementwise pass over a ``[tokens, width]`` tensor per layer that changes nothing.

The bias is dropped when: the scores are a GEMM's output used only by a last-axis ``softmax``;
the GEMM's right operand comes, through views and transposes used only there, from an ``add``
of a parameter bias (broadcast along every axis but the last) to a value used only by it; and
the bias, carried through those views and transposes, is constant along the scores' key axis.
That last condition is checked by moving an index pattern through the same operations with
NumPy (views and transposes only permute elements), so any head split is handled.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import numpy as np

from ipu_stack.graph.compute_graph import ComputeGraph, Operation
from ipu_stack.graph.scale_folding import FoldedGraph, replay_without, unused_dropped

RENAMING = ("view", "transpose")


def _key_bias(
    graph: ComputeGraph, gemm: Operation, producer: dict[int, Operation], uses: dict[int, int]
) -> tuple[Operation, int] | None:
    """(the bias ``add``, the value it biases) behind ``gemm``'s right operand, when droppable."""
    chain: list[Operation] = []
    vid = gemm.inputs[1]
    outputs = set(graph.outputs)
    while True:
        if uses[vid] != 1 or vid in outputs:
            return None
        op = producer.get(vid)
        if op is None:
            return None
        if op.kind not in RENAMING:
            break
        chain.append(op)
        vid = op.inputs[0]
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
    # the bias pattern (its column index everywhere) through the chain: constant along the
    # right operand's axis that becomes the scores' key axis
    pattern = np.broadcast_to(np.arange(out.shape[-1]), out.shape)
    for step in reversed(chain):
        if step.kind == "view":
            pattern = pattern.reshape(graph.value(step.output).shape)
        else:
            pattern = np.transpose(pattern, step.attr("perm"))
    key_axis = -2 if gemm.transpose_right else -1
    moved = np.moveaxis(pattern, key_axis, -1)
    if not (moved == moved[..., :1]).all():
        return None
    return op, data[0].id


def drop_key_biases(graph: ComputeGraph, parameters: Mapping[str, np.ndarray]) -> FoldedGraph:
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
        found = _key_bias(graph, scores, producer, uses)
        if found is not None:
            dropped[found[0].id] = found[1]
    if not dropped:
        return FoldedGraph(graph, dict(parameters), {v.id: v for v in graph.values}, [])
    new, vmap = replay_without(graph, dropped)
    line = (
        f"dropped {len(dropped)} attention key biases (softmax is unchanged by a per-row "
        f"constant; from {graph.operations[min(dropped)].name!r})"
    )
    return FoldedGraph(new, unused_dropped(dict(parameters), graph, new), vmap, [line])

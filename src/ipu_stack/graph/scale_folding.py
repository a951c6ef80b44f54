"""Scalar multiplies folded into the weights of the GEMM that produces their operand.

Exporters scale attention queries and keys by a constant after the projection, the head split
and the transposes: ``Mul(Transpose(Reshape(Add(MatMul(x, W), b))), c)`` (torch's SDPA
decomposition multiplies both Q and K^T by ``sqrt(1/sqrt(d))``). Reshapes and transposes
commute with a scalar, and ``(x @ W + b) * c == x @ (c * W) + c * b``, so the multiply can be
done once, on the weights, at import: the graph loses one elementwise pass over a
``[tokens, width]`` tensor per multiply.

A multiply ``mul(v, s)`` is folded when ``s`` is a one-element parameter with known data and
``v`` comes from a chain of views and transposes (each used only by the next) over a GEMM whose
right operand is a parameter (optionally followed by an ``add`` of a parameter bias), every
value and parameter of the chain used by nothing else. The weights are scaled in float64 and
stored back in their own precision.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ipu_stack.graph.compute_graph import ComputeGraph, Operation, Value

RENAMING = ("view", "transpose")
SCALABLE_DTYPES = ("float16", "float32", "float64")


@dataclass(frozen=True, slots=True)
class FoldedGraph:
    """The result of :func:`fold_scalar_scales` (the input graph when nothing folded).

    Attributes:
        graph: the rewritten graph.
        parameters: parameter data by name (scaled weights replaced, unused scalars dropped).
        value_map: old value id -> new value, for every value that still exists (a folded
            multiply's result maps to its operand's new value).
        fusions: one line when anything was folded.
    """

    graph: ComputeGraph
    parameters: dict[str, np.ndarray]
    value_map: dict[int, Value]
    fusions: list[str]


def _scalar(
    graph: ComputeGraph, op: Operation, params: Mapping[str, np.ndarray]
) -> tuple[int, float] | None:
    """(operand id, scale) of a multiply by a one-element parameter, else None."""
    if op.kind != "mul" or len(op.inputs) != 2:
        return None
    out = graph.value(op.output)
    for a, b in (op.inputs, op.inputs[::-1]):
        s = graph.value(b)
        operand = graph.value(a)
        if (
            s.kind == "parameter"
            and s.size == 1
            and s.name in params
            and (operand.shape, operand.dtype) == (out.shape, out.dtype)
        ):
            return a, float(np.asarray(params[s.name], dtype=np.float64).reshape(-1)[0])
    return None


def _chain(
    graph: ComputeGraph,
    start: int,
    producer: dict[int, Operation],
    uses: dict[int, int],
    params: Mapping[str, np.ndarray],
) -> tuple[Value, Value | None] | None:
    """The (weights, bias) parameters behind value ``start``, when it may be scaled there."""
    outputs = set(graph.outputs)
    found = renamed_from(graph, start, producer, uses)
    if found is None:
        return None
    op = found[0]
    bias = None
    if op.kind == "add":
        values = [graph.value(i) for i in op.inputs]
        biases = [v for v in values if v.kind == "parameter"]
        others = [v for v in values if v.kind != "parameter"]
        if len(biases) != 1 or len(others) != 1:
            return None
        bias = biases[0]
        if uses[bias.id] != 1 or bias.name not in params:
            return None
        vid = others[0].id
        if uses[vid] != 1 or vid in outputs:
            return None
        gemm = producer.get(vid)
        if gemm is None:
            return None
        op = gemm
    if op.kind != "gemm":
        return None
    weights = graph.value(op.inputs[1])
    if weights.kind != "parameter" or uses[weights.id] != 1 or weights.name not in params:
        return None
    if graph.value(op.inputs[0]).id == weights.id:
        return None
    scalable = [weights] + ([bias] if bias is not None else [])
    if any(np.asarray(params[v.name]).dtype.name not in SCALABLE_DTYPES for v in scalable):
        return None
    return weights, bias


def renamed_from(
    graph: ComputeGraph, vid: int, producer: dict[int, Operation], uses: dict[int, int]
) -> tuple[Operation, list[Operation]] | None:
    """The first producer behind value ``vid`` that is not a view or transpose, and the views
    and transposes passed on the way (nearest first), when every value on the way is used
    once and is no graph output; else None."""
    chain: list[Operation] = []
    outputs = set(graph.outputs)
    while True:
        if uses[vid] != 1 or vid in outputs:
            return None
        op = producer.get(vid)
        if op is None:
            return None
        if op.kind not in RENAMING:
            return op, chain
        chain.append(op)
        vid = op.inputs[0]


def fold_scalar_scales(graph: ComputeGraph, parameters: Mapping[str, np.ndarray]) -> FoldedGraph:
    """Fold every foldable scalar multiply of ``graph`` into its GEMM's weights (see module)."""
    params = dict(parameters)
    producer = {op.output: op for op in graph.operations}
    uses: dict[int, int] = defaultdict(int)
    for op in graph.operations:
        for i in set(op.inputs):
            uses[i] += 1
    folded: dict[int, int] = {}  # multiply op id -> operand value id
    scales: dict[str, float] = {}
    for op in graph.operations:
        found = _scalar(graph, op, params)
        if found is None:
            continue
        operand, scale = found
        chain = _chain(graph, operand, producer, uses, params)
        if chain is None or any(v.name in scales for v in chain if v is not None):
            continue
        for v in chain:
            if v is not None:
                scales[v.name] = scale
        folded[op.id] = operand
    if not folded:
        return FoldedGraph(graph, params, {v.id: v for v in graph.values}, [])
    for name, scale in scales.items():
        data = np.asarray(params[name])
        params[name] = (data.astype(np.float64) * scale).astype(data.dtype)
    new, vmap = replay_without(graph, folded)
    params = unused_dropped(params, graph, new)
    line = (
        f"folded {len(folded)} scalar multiplies into the weights of their GEMMs "
        f"(from {graph.operations[min(folded)].name!r})"
    )
    return FoldedGraph(new, params, vmap, [line])


def unused_dropped(
    params: dict[str, np.ndarray], old: ComputeGraph, new: ComputeGraph
) -> dict[str, np.ndarray]:
    """``params`` without the data of parameters ``old`` had and ``new`` no longer has."""
    gone = {v.name for v in old.values if v.kind == "parameter"} - {
        v.name for v in new.values if v.kind == "parameter"
    }
    return {k: v for k, v in params.items() if k not in gone}


def replay_without(
    graph: ComputeGraph, folded: dict[int, int]
) -> tuple[ComputeGraph, dict[int, Value]]:
    """``graph`` replayed without the operations ``folded`` maps (op id -> the value that
    stands for its result) and without the parameters nothing uses any more."""
    used: set[int] = set(graph.outputs)
    for op in graph.operations:
        if op.id not in folded:
            used.update(op.inputs)
    new = ComputeGraph(prefix=graph.prefix)
    vmap: dict[int, Value] = {}
    for v in graph.values:
        if v.kind == "host_input":
            vmap[v.id] = new.host_input(v.name, v.shape, v.dtype, v.scale_exponent)
        elif v.kind == "parameter" and v.id in used:
            vmap[v.id] = new.parameter(v.name, v.shape, v.dtype, v.scale_exponent)
    for op in graph.operations:
        if op.id in folded:
            vmap[op.output] = vmap[folded[op.id]]
            continue
        result = graph.value(op.output)
        vmap[op.output] = new._op(
            op.kind,
            [vmap[i] for i in op.inputs],
            result.shape,
            result.dtype,
            op.name,
            result.scale_exponent,
            **dict(op.attrs),
        )
    new.set_outputs(*(vmap[o] for o in graph.outputs))
    new.verify()
    return new, vmap

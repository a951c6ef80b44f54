"""What the host writes before the run: per-operation lower bounds of resident weight bytes.

Weights (and host-written operand chunks) occupy tile memory from step 0 until their last
reader, so the planner counts them for every operation before that reader, not only for the
operation that uses them (``mid/beam.py``).
"""

from __future__ import annotations

import numpy as np

from ipu_stack.graph.compute_graph import ComputeGraph, Operation
from ipu_stack.target import ipu21


def last_uses(graph: ComputeGraph) -> dict[int, int]:
    """Index of the last operation reading each value (outputs live to the end)."""
    last: dict[int, int] = {}
    for i, op in enumerate(graph.operations):
        for v in op.inputs:
            last[v] = i
    for v in graph.outputs:
        last[v] = len(graph.operations)
    return last


def _bytes(graph: ComputeGraph, vid: int) -> int:
    v = graph.value(vid)
    return int(np.prod(v.shape, dtype=np.int64)) * ipu21.precision(v.dtype).element_bytes


def parameter_bytes(graph: ComputeGraph) -> list[int]:
    """Per operation, the bytes of the parameters it is the last reader of: a lower bound of
    what the host writes for it (every weight element is stored on some tile at least once)."""
    last = last_uses(graph)
    out = [0] * len(graph.operations)
    for v in graph.values:
        if v.kind == "parameter" and last.get(v.id, len(out)) < len(out):
            out[last[v.id]] += _bytes(graph, v.id)
    return out


def enclosing_weights_per_tile(graph: ComputeGraph, op: Operation, tiles: int) -> int:
    """Bytes per tile of ``graph``'s weights other than ``op``'s own, spread evenly (what a
    loop body planned on its own must leave room for)."""
    own = sum(_bytes(graph, v) for v in set(op.inputs) if graph.value(v).kind == "parameter")
    return -(-max(0, sum(parameter_bytes(graph)) - own) // tiles)

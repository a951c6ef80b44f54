"""Pick the candidate family of an operation."""

from __future__ import annotations

from ipu_stack.graph.compute_graph import ComputeGraph, Operation
from ipu_stack.graph.elementwise import KINDS as ELEMENTWISE_KINDS
from ipu_stack.mid.candidates.base import Candidate
from ipu_stack.mid.candidates.gemm import gemm_candidates
from ipu_stack.mid.candidates.indexing import INDEXING_CANDIDATES, transpose_candidates
from ipu_stack.mid.candidates.movement import attention_candidates, movement_candidates
from ipu_stack.mid.candidates.pointwise import pointwise_candidates
from ipu_stack.mid.candidates.repeat import repeat_candidates
from ipu_stack.mid.formats import TensorFormat
from ipu_stack.mid.gemm_plan import GemmProblem


def candidates_for(
    graph: ComputeGraph,
    op: Operation,
    formats: dict[int, TensorFormat],
    tiles: int,
    problem: GemmProblem | None = None,
    capacity_scale: float = 1.0,
    tile0_base: int = 0,
    loop_body: bool = False,
) -> list[Candidate]:
    """Every candidate of ``op`` given the formats its operands are produced in
    (``tile0_base``: a repeat's, see :func:`~ipu_stack.mid.candidates.repeat.body_finalist`;
    ``loop_body``: ``op`` is in one, where parameters may also be staged)."""
    if op.kind == "gemm":
        assert problem is not None
        return gemm_candidates(graph, op, problem, tiles, capacity_scale, formats)
    if op.kind == "transpose":
        return transpose_candidates(graph, op, formats, tiles)
    if op.kind in INDEXING_CANDIDATES:
        return INDEXING_CANDIDATES[op.kind](graph, op, tiles)
    if op.kind in (
        "add", "mul", "gelu", "cast", "layer_norm", "softmax", "equal", "where", *ELEMENTWISE_KINDS
    ):  # fmt: skip
        return pointwise_candidates(graph, op, formats, tiles, loop_body)
    if op.kind in ("view", "transpose", "slice"):
        return movement_candidates(graph, op, formats, tiles)
    if op.kind == "flash_attention":
        return attention_candidates(graph, op, formats, tiles)
    if op.kind == "repeat":
        return repeat_candidates(graph, op, tiles, capacity_scale, tile0_base)
    from ipu_stack.errors import GraphError

    raise GraphError(f"{op.name}: no candidates for operation kind {op.kind!r}")

"""Repeat candidates: the body is planned once (its best finalist) and run ``count`` times."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ipu_stack.graph.compute_graph import ComputeGraph, Operation
from ipu_stack.low.lower_ops import flat_shape
from ipu_stack.mid.candidates.base import Candidate, Footprint
from ipu_stack.mid.formats import row_layout_format
from ipu_stack.mid.gemm_plan import ELEMENT_SLACK
from ipu_stack.mid.residency import enclosing_weights_per_tile
from ipu_stack.target import ipu21

if TYPE_CHECKING:
    from ipu_stack.mid.lower_mid import Finalist


#: body plans by (id(body), tiles): a build plans each loop body once, not once per use
_BODY_PLANS: dict[tuple[int, int, float, int], tuple[ComputeGraph, Finalist]] = {}
_BODY_PLANS_KEPT = 8


def body_finalist(
    body: ComputeGraph,
    tiles: int,
    count: int = 1,
    base: int = 0,
    capacity_scale: float = 1.0,
    tile0_base: int = 0,
) -> Finalist:
    """The best whole-graph plan of a loop body, planned once per body and tile count (the
    repeat's candidates and every finalist's lowering share it; forked workers inherit it).

    The body's weights are stored ``count`` times (one block per iteration) and every tile
    holds ``base`` bytes of the enclosing graph's weights besides: the plan must leave room
    (in ``capacity_scale`` of tile memory, as the enclosing plan's retries tighten it), and
    tile 0 ``tile0_base`` bytes (the enclosing plan's blocks there, once known).
    """
    from ipu_stack.mid.lower_mid import lower_mid

    key = (id(body), tiles, capacity_scale, tile0_base)
    hit = _BODY_PLANS.get(key)
    if hit is None or hit[0] is not body:
        hit = (
            body,
            lower_mid(
                body,
                tiles,
                1,
                capacity_scale=capacity_scale,
                resident_scale=count,
                resident_base=base,
                loop_body=True,
                tile0_base=tile0_base,
            )[0],
        )
        _BODY_PLANS[key] = hit
        while len(_BODY_PLANS) > _BODY_PLANS_KEPT:
            del _BODY_PLANS[next(iter(_BODY_PLANS))]
    return hit[1]


def _own_bytes(cand: Candidate) -> int:
    """An operation's own buffers per tile, without a GEMM plan's allocator slack."""
    slack = 2 * ELEMENT_SLACK if cand.family == "gemm" else 0
    return max(0, cand.footprint.total - slack)


def repeat_candidates(
    graph: ComputeGraph,
    op: Operation,
    tiles: int,
    capacity_scale: float = 1.0,
    tile0_base: int = 0,
) -> list[Candidate]:
    """The repeat planned with its body's best plan (``tile0_base``: see body_finalist)."""
    body: ComputeGraph = op.attr("body")
    count = int(op.attr("count"))
    base = enclosing_weights_per_tile(graph, op, tiles)
    body_plan = body_finalist(body, tiles, count, base, capacity_scale, tile0_base)
    best = body_plan.branch
    out = graph.value(op.output)
    n, c = flat_shape(out.shape)
    fmt = row_layout_format(out.dtype, n, c, tiles)
    # the carried result moves back into its home once per iteration
    carry = ipu21.EXCHANGE_PHASE_OVERHEAD + fmt.shard_bytes() // ipu21.WORD_BYTES
    cycles = count * (best.cycles + carry)
    exchange = count * (best.exchange_cycles + carry)
    footprint = Footprint(
        best.peak_standard,
        best.peak_interleaved,
        best.max_standard_allocation,
        best.exchange_row_bytes,
    )
    tiles_used = max((c.active_tiles for c in best.choices.values()), default=1)
    # Per tile, tile 0's: every body operation's tiles start there, where its weight blocks
    # of all iterations stack (not the body's weights spread evenly); placement keeps them,
    # and the values the body makes, for the whole body. Besides, the largest operation's
    # own buffers (a GEMM's without the allocator slack its footprint carries).
    values = sum(c.output_format.shard_bytes() for c in best.choices.values())
    largest = max((_own_bytes(c) for c in best.choices.values()), default=0)
    during = values + largest + best.stacked
    footprint = replace(
        footprint,
        resident=max(best.stacked, -(-best.resident_total // tiles_used)),
        resident_interleaved=max(
            best.stacked_interleaved, -(-best.resident_interleaved // tiles_used)
        ),
        tile0_extra=during - best.peak_total - best.stacked_interleaved,
        tile0_extra_interleaved=best.stacked_interleaved,
    )
    return [
        Candidate(
            op.name,
            "repeat",
            ("repeat", count, body_plan),
            tuple(None for _ in op.inputs),
            fmt,
            cycles,
            exchange,
            footprint,
            tiles_used,
        )
    ]

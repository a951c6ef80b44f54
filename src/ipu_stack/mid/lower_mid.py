"""``lower_mid``: whole-graph finalists (operator candidates + conversions) for a graph."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ipu_stack.graph.compute_graph import ComputeGraph
from ipu_stack.low.lower import gemm_problems
from ipu_stack.mid.beam import Branch, beam_search
from ipu_stack.mid.gemm_plan import GemmPlan
from ipu_stack.trace import Trace

DEFAULT_FINALISTS = 4
DEFAULT_BEAM_WIDTH = 64


@dataclass(frozen=True, slots=True)
class Finalist:
    """One whole-graph plan: what lowering needs, and what the trace reports."""

    index: int
    branch: Branch
    values: int
    operations: int

    @property
    def gemm_plans(self) -> dict[str, GemmPlan]:
        return {
            name: cand.choice for name, cand in self.branch.choices.items() if cand.family == "gemm"
        }

    @property
    def row_tiles(self) -> dict[str, int]:
        return {
            name: int(cand.choice[1])
            for name, cand in self.branch.choices.items()
            if isinstance(cand.choice, tuple) and cand.choice[0] == "rows"
        }

    @property
    def bodies(self) -> dict[str, Finalist]:
        """The plan of each loop body (repeat operations), by operation name."""
        return {
            name: cand.choice[2]
            for name, cand in self.branch.choices.items()
            if isinstance(cand.choice, tuple) and cand.choice[0] == "repeat"
        }

    def fields(self) -> dict[str, Any]:
        br = self.branch
        tiles = sorted({c.active_tiles for c in br.choices.values()})
        groups = sorted({c.padding_groups for c in br.choices.values() if c.padding_groups > 1})
        return {
            "finalist": self.index,
            "values": self.values,
            "operations": self.operations,
            "estimated_cycles": br.cycles,
            "estimated_exchange_cycles": br.exchange_cycles,
            "exchange_row_bytes": br.exchange_row_bytes,
            "peak_standard_bytes": br.peak_standard,
            "peak_interleaved_bytes": br.peak_interleaved,
            "peak_total_bytes": br.peak_total,
            "maximum_standard_allocation_bytes": br.max_standard_allocation,
            "active_tile_counts": "{" + ", ".join(map(str, tiles)) + "}",
            "padding_group_counts": "{" + ", ".join(map(str, groups)) + "}",
            "conversion_sources": "[" + ", ".join(c.source for c in br.conversions) + "]",
        }


def lower_mid(
    graph: ComputeGraph,
    tiles: int,
    finalists: int = DEFAULT_FINALISTS,
    width: int = DEFAULT_BEAM_WIDTH,
    trace: Trace | None = None,
    capacity_scale: float = 1.0,
    resident_scale: int = 1,
    resident_base: int = 0,
    loop_body: bool = False,
) -> list[Finalist]:
    """Whole-graph plans: the best ``finalists`` (each logged as a retained finalist), then
    the other surviving branches, leanest first, as fallbacks for placement.
    ``resident_scale``, ``resident_base`` and ``loop_body``: see
    :func:`~ipu_stack.mid.beam.beam_search`.

    Raises:
        PlanError: if no plan fits (names the operation, region and shortfall).
    """
    graph.verify()
    branches = beam_search(
        graph,
        tiles,
        gemm_problems(graph),
        width,
        capacity_scale,
        resident_scale,
        resident_base,
        loop_body,
    )
    out = []
    for i, br in enumerate(branches[:finalists]):
        f = Finalist(
            i,
            br,
            len(graph.values) + len(br.conversions),
            len(graph.operations) + len(br.conversions),
        )
        out.append(f)
        if trace is not None:
            trace.event("retained operator-plan finalist", **f.fields())
    return out

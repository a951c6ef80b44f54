"""``lower_mid``: whole-graph finalists (operator candidates + conversions) for a graph."""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from ipu_stack.errors import PlanError
from ipu_stack.graph.compute_graph import ComputeGraph
from ipu_stack.low.lower import gemm_problems
from ipu_stack.mid.beam import Branch, beam_search
from ipu_stack.mid.gemm_plan import GemmPlan
from ipu_stack.trace import Trace

DEFAULT_FINALISTS = 4
DEFAULT_BEAM_WIDTH = 64
#: Judgement, not hardware: a branch whose choices differ from a better finalist's only in
#: operations (and conversions) worth less than this share of that finalist's estimated cycles
#: is a near-duplicate. Physical evaluation of such a pair measured 0.1-0.2% apart (the 224 px
#: SigLIP's four finalists differ in one head GEMM's K split: refined 810,051..811,251 cycles)
#: while each evaluation costs a whole lowering, placement and schedule; the next distinct
#: branch of the beam is kept instead.
NEAR_DUPLICATE_SHARE = 0.02


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
    def staged(self) -> set[str]:
        """Operations whose parameters are gathered from a home (``OpLowering.staged``)."""
        return {
            name
            for name, cand in self.branch.choices.items()
            if isinstance(cand.choice, tuple) and cand.choice[-1] == "staged"
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
    tile0_base: int = 0,
) -> list[Finalist]:
    """Whole-graph plans: the best ``finalists`` (each logged as a retained finalist), then
    the other surviving branches, leanest first, as fallbacks for placement. Plans are first
    searched with every operation's per-tile weight block stacked on tile 0 (what lowering
    makes of them); only if nothing fits so are they searched on the even spread alone.
    ``resident_scale``, ``resident_base``, ``loop_body`` and ``tile0_base``: see
    :func:`~ipu_stack.mid.beam.beam_search`. A graph with loops is planned twice: its loop
    bodies are planned before the operations around them, so the second time each body is
    planned knowing what the first plan put on tile 0 during it.

    Raises:
        PlanError: if no plan fits (names the operation, region and shortfall).
    """
    graph.verify()
    problems = gemm_problems(graph, loop_body)
    args = (graph, tiles, problems, width, capacity_scale, resident_scale, resident_base)
    try:
        branches = beam_search(*args, loop_body, tile0_base=tile0_base)
        bases = loop_tile0_bases(graph, branches[0])
        if bases:
            with suppress(PlanError):  # else the first plan stands
                branches = beam_search(*args, loop_body, tile0_base=tile0_base, tile0_bases=bases)
    except PlanError as strict:
        # Nothing fits with every block stacked on tile 0: plan on the even spread alone and
        # leave it to the weight balance (rotated GEMM tile ranges) and the placement check.
        branches = beam_search(*args, loop_body, stack_tile0=False)  # its error if none
        if trace is not None:
            trace.event("planned without tile-0 stacking", reason=str(strict))
    kept, skipped = distinct_branches(branches, finalists)
    if trace is not None and skipped:
        trace.event("skipped near-duplicate operator-plan branches", branches=skipped,
                    share=NEAR_DUPLICATE_SHARE)  # fmt: skip
    out = []
    for i, br in enumerate(kept):
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


def distinct_branches(branches: list[Branch], count: int) -> tuple[list[Branch], int]:
    """The best ``count`` branches, in order, none a near-duplicate of a better one kept
    (see :data:`NEAR_DUPLICATE_SHARE`); also how many were passed over on the way."""
    kept: list[Branch] = []
    skipped = 0
    for br in branches:
        if len(kept) == count:
            break
        if any(_differing_cycles(br, k) < NEAR_DUPLICATE_SHARE * k.cycles for k in kept):
            skipped += 1
            continue
        kept.append(br)
    return kept, skipped


def _differing_cycles(a: Branch, b: Branch) -> int:
    """Estimated cycles of what ``a`` and ``b`` plan differently: operations whose choice or
    formats differ (the larger of the two estimates) and conversions only one of them makes."""
    total = 0
    for name in a.choices.keys() | b.choices.keys():
        ca, cb = a.choices.get(name), b.choices.get(name)
        if ca is None or cb is None:
            total += (ca or cb).cycles  # type: ignore[union-attr]
        elif ca is not cb and (
            ca.choice != cb.choice
            or ca.input_formats != cb.input_formats
            or ca.output_format != cb.output_format
        ):
            total += max(ca.cycles, cb.cycles)
    conversions_a, conversions_b = set(a.conversions), set(b.conversions)
    total += sum(c.cycles for c in conversions_a ^ conversions_b)
    return total


def loop_tile0_bases(graph: ComputeGraph, branch: Branch) -> dict[str, int]:
    """For each repeat of ``graph``, the bytes ``branch`` has the host write on tile 0 for the
    operations after it (live from step 0 to their use, so through the loop)."""
    out: dict[str, int] = {}
    after = 0
    for op in reversed(graph.operations):
        if op.kind == "repeat":
            out[op.name] = after
        cand = branch.choices.get(op.name)
        if cand is not None:
            after += cand.footprint.resident
    return out

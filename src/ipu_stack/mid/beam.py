"""Whole-graph planning: a Pareto beam over operator candidates.

Operations are visited in program order. A branch is a partial plan: one candidate per
operation so far, the format each value was produced in, conversions inserted where a
consumer wants another format, and running costs and memory peaks. Each step expands every
branch with every candidate of the next operation, drops branches that cannot fit in tile
memory, groups the rest by what later operations can see (the formats of values still
live), keeps the Pareto frontier of each group over seven objectives, and bounds the total
by the beam width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ipu_stack.errors import PlanError
from ipu_stack.graph.compute_graph import ComputeGraph
from ipu_stack.mid.candidates import Candidate, candidates_for
from ipu_stack.mid.formats import TensorFormat
from ipu_stack.mid.gemm_plan import INTERLEAVED_DATA_BYTES, STANDARD_DATA_BYTES, GemmProblem
from ipu_stack.mid.residency import last_uses, parameter_bytes
from ipu_stack.target import ipu21


@dataclass(frozen=True, slots=True)
class Conversion:
    """A rearrange (or cast) inserted before ``consumer`` for operand ``value``."""

    kind: str
    value: str
    source: str  # the operation that produced the value
    consumer: str
    cycles: int


@dataclass(slots=True)
class Branch:
    choices: dict[str, Candidate] = field(default_factory=dict)
    formats: dict[int, TensorFormat] = field(default_factory=dict)
    conversions: list[Conversion] = field(default_factory=list)
    cycles: int = 0
    exchange_cycles: int = 0
    peak_standard: int = 0
    peak_interleaved: int = 0
    peak_total: int = 0
    max_standard_allocation: int = 0
    exchange_row_bytes: int = 0
    # host-written bytes (weights) over all tiles, and the least per-tile headroom left at
    # any operation so far with every weight live until its last use (see ``beam_search``)
    resident_total: int = 0
    headroom: int = 1 << 62
    resident_interleaved: int = 0  # the same for the weights kept in the interleaved region
    headroom_interleaved: int = 1 << 62
    # the same on tile 0, where lowering starts every operation's tiles: each operation's
    # host-written bytes per active tile stacked (see ``beam_search``)
    stacked: int = 0
    stacked_headroom: int = 1 << 62
    stacked_interleaved: int = 0
    stacked_headroom_interleaved: int = 1 << 62

    def objectives(self) -> tuple[int, ...]:
        return (
            self.cycles,
            self.exchange_cycles,
            self.peak_standard,
            self.peak_interleaved,
            self.peak_total,
            self.max_standard_allocation,
            self.exchange_row_bytes,
            self.resident_total,
        )


def conversion_cycles(fmt: TensorFormat) -> int:
    """Moving a value into ``fmt``: the busiest tile receives its whole shard, after a sync."""
    words = fmt.shard_bytes() // ipu21.WORD_BYTES
    return ipu21.EXCHANGE_PHASE_OVERHEAD + words


def pareto(branches: list[Branch]) -> list[Branch]:
    """The branches no kept branch dominates or equals, in objective order (stable)."""
    keep: list[Branch] = []
    kept: list[tuple[int, ...]] = []
    for obj, br in sorted(((br.objectives(), br) for br in branches), key=lambda t: t[0]):
        # dominated by k, or equal to it: every objective at least k's
        if not any(all(x >= y for x, y in zip(obj, k, strict=True)) for k in kept):
            keep.append(br)
            kept.append(obj)
    return keep


def beam_search(
    graph: ComputeGraph,
    tiles: int,
    problems: dict[int, GemmProblem],
    width: int = 64,
    capacity_scale: float = 1.0,
    resident_scale: int = 1,
    resident_base: int = 0,
    loop_body: bool = False,
    stack_tile0: bool = True,
    tile0_base: int = 0,
    tile0_bases: dict[str, int] | None = None,
) -> list[Branch]:
    """Whole-graph plans that fit, cheapest first.

    Resident weights: the host writes every weight before the run, so operation ``j``'s
    weights occupy tile memory from step 0 until ``j``. Placement spreads them evenly over
    the tiles (``place/balance.py``), so at operation ``i`` each tile holds, besides ``i``'s
    own footprint and the live values, about ``sum(R_j for j > i) / tiles`` bytes of later
    operations' weights, where ``R_j`` is operation ``j``'s host-written bytes over all its
    tiles. Later operations are not chosen yet: their parameters' bytes stand in for them (a
    lower bound), and each branch keeps its least headroom so far, lowered as the real
    ``R_j`` become known. ``resident_scale`` multiplies the weights (a loop body's weights
    are stored once per iteration) and ``resident_base`` is what every tile holds besides
    (the enclosing graph's weights, when planning a loop body). In a ``loop_body`` every
    weight lives for the whole body (each iteration needs its block), so an operation also
    counts the weights of the operations before it and all ``resident_scale`` blocks of its
    own (its footprint holds one).

    Tile 0: the even spread is a lower bound of the busiest tile, not what lowering makes of
    it. Every operation's tiles start at tile 0 (``place/balance.py`` rotates a GEMM only when
    that lowers the busiest tile), the first block of an uneven split is the largest, and
    parameters staged beside row-layout operations are replicated on each of their tiles, so
    tile 0 holds the whole per-tile block (``footprint.resident``) of every later operation.
    The same headroom is kept for tile 0 with those blocks stacked (later operations' lower
    bounds still spread), and a candidate that leaves tile 0 short is dropped too, unless
    ``stack_tile0`` is false (the relaxed retry of :func:`~ipu_stack.mid.lower_mid.lower_mid`).
    ``tile0_base`` is what tile 0 holds besides (at least ``resident_base``: in a loop body,
    the enclosing graph's blocks there); ``tile0_bases`` gives it for each repeat's body.

    Raises:
        PlanError: naming the operation, the memory region and the shortfall per tile when
            no branch fits.
    """
    last = last_uses(graph)
    cache: dict[tuple, list[Candidate]] = {}
    branches = [Branch()]
    interleaved_cap = int(INTERLEAVED_DATA_BYTES * capacity_scale)
    standard_cap = int(STANDARD_DATA_BYTES * capacity_scale)
    capacity = int((STANDARD_DATA_BYTES + INTERLEAVED_DATA_BYTES) * capacity_scale)
    lower = [b * resident_scale for b in parameter_bytes(graph)]
    later = np.cumsum([0, *lower[::-1]])[::-1].tolist()  # later[i]: bytes of ops >= i
    base0 = max(resident_base, tile0_base)
    for index, op in enumerate(graph.operations):
        expanded: list[Branch] = []
        best_miss: tuple[int, str, int] | None = None
        for br in branches:
            operand_formats = tuple(br.formats.get(v) for v in op.inputs)
            shapes = tuple(graph.value(v).shape for v in op.inputs)
            key = (op.id, shapes, operand_formats)
            if key not in cache:
                cache[key] = candidates_for(
                    graph, op, br.formats, tiles, problems.get(op.id), capacity_scale,
                    (tile0_bases or {}).get(op.name, 0), loop_body,
                )  # fmt: skip
            live = [v for v, fmt in br.formats.items() if last.get(v, -1) >= index]
            live_std = sum(
                br.formats[v].shard_bytes()
                for v in live
                if br.formats[v].layout.memory != "interleaved"
            )
            live_il = sum(
                br.formats[v].shard_bytes()
                for v in live
                if br.formats[v].layout.memory == "interleaved"
            )
            for cand in cache[key]:
                std = live_std + cand.footprint.standard
                # what the standard region cannot hold spills into the interleaved one
                il = live_il + cand.footprint.interleaved + max(0, std - standard_cap)
                total = live_std + cand.footprint.standard + live_il + cand.footprint.interleaved
                own = cand.footprint.resident * cand.active_tiles * resident_scale
                own = max(own, lower[index])
                once = cand.footprint.resident * cand.active_tiles
                once_il = cand.footprint.resident_interleaved * cand.active_tiles
                earlier = br.resident_total + own - once if loop_body else 0
                # later weights, spread: this op's real bytes replace its lower bound
                headroom = min(
                    br.headroom - -(-(own - lower[index]) // tiles),
                    capacity - resident_base - total - -(-(later[index + 1] + earlier) // tiles),
                )
                own_il = cand.footprint.resident_interleaved * cand.active_tiles * resident_scale
                spread_il = -(-own_il // tiles)
                # the same in the interleaved region (later ops' part of it is not known yet)
                earlier_il = br.resident_interleaved + own_il - once_il if loop_body else 0
                headroom_il = min(
                    br.headroom_interleaved - spread_il,
                    interleaved_cap - il - -(-earlier_il // tiles),
                )
                # tile 0: this op's whole per-tile block replaces its spread lower bound
                tile0 = cand.footprint.resident * resident_scale
                tile0_il = cand.footprint.resident_interleaved * resident_scale
                once0 = cand.footprint.resident
                earlier0 = br.stacked + tile0 - once0 if loop_body else 0
                fp = cand.footprint
                stacked_headroom = min(
                    br.stacked_headroom - max(0, tile0 - lower[index] // tiles),
                    capacity - base0 - total - fp.tile0_extra - fp.tile0_extra_interleaved
                    - -(-later[index + 1] // tiles) - earlier0,
                )  # fmt: skip
                earlier0_il = (
                    br.stacked_interleaved + tile0_il - cand.footprint.resident_interleaved
                    if loop_body
                    else 0
                )
                stacked_headroom_il = min(
                    br.stacked_headroom_interleaved - tile0_il,
                    interleaved_cap - il - fp.tile0_extra_interleaved - earlier0_il,
                )
                checks: tuple[tuple[int, str, int], ...] = (
                    (il, "interleaved", interleaved_cap),
                    (total, "total", capacity),
                    (capacity - headroom, "total (weights included)", capacity),
                    (interleaved_cap - headroom_il, "interleaved (weights included)",
                     interleaved_cap),
                )  # fmt: skip
                if stack_tile0:
                    checks += (
                        (capacity - stacked_headroom, "total on tile 0 (weights included)",
                         capacity),
                        (interleaved_cap - stacked_headroom_il,
                         "interleaved on tile 0 (weights included)", interleaved_cap),
                    )  # fmt: skip
                miss = next((c for c in checks if c[0] > c[2]), None)
                if miss is not None:
                    need, region, cap = miss
                    if best_miss is None or need - cap < best_miss[2]:
                        best_miss = (need, region, need - cap)
                    continue
                nb = Branch(
                    dict(br.choices),
                    dict(br.formats),
                    list(br.conversions),
                    br.cycles + cand.cycles,
                    br.exchange_cycles + cand.exchange_cycles,
                    max(br.peak_standard, std),
                    max(br.peak_interleaved, il),
                    max(br.peak_total, total),
                    max(br.max_standard_allocation, cand.footprint.max_standard_allocation),
                    br.exchange_row_bytes + cand.footprint.exchange_row_bytes,
                    br.resident_total + own,
                    headroom,
                    br.resident_interleaved + own_il,
                    headroom_il,
                    br.stacked + tile0,
                    stacked_headroom,
                    br.stacked_interleaved + tile0_il,
                    stacked_headroom_il,
                )
                nb.choices[op.name] = cand
                for v, wanted in zip(op.inputs, cand.input_formats, strict=True):
                    have = br.formats.get(v)
                    value = graph.value(v)
                    if wanted is None or have is None or have == wanted:
                        continue
                    producer = graph.producer(v)
                    cost = 0 if cand.family == "gemm" else conversion_cycles(wanted)
                    kind = "cast" if have.precision != wanted.precision else "rearrange"
                    nb.conversions.append(
                        Conversion(
                            kind,
                            value.name,
                            producer.name if producer else value.name,
                            op.name,
                            cost,
                        )
                    )
                    nb.cycles += cost
                    nb.exchange_cycles += cost
                nb.formats[op.output] = cand.output_format
                for v in list(nb.formats):
                    if last.get(v, -1) <= index and v not in graph.outputs:
                        del nb.formats[v]
                expanded.append(nb)
        if not expanded:
            need, region, short = best_miss or (0, "total", 0)
            raise PlanError(
                f"{op.name} ({op.kind}) does not fit in tile memory: the {region} region needs "
                f"{need} bytes per tile, {short} more than available"
            )
        groups: dict[tuple, list[Branch]] = {}
        for br in expanded:
            sig = tuple(sorted((v, f) for v, f in br.formats.items()))
            groups.setdefault(sig, []).append(br)
        survivors = [b for group in groups.values() for b in pareto(group)]
        survivors.sort(key=Branch.objectives)
        branches = survivors[:width]
    return sorted(branches, key=Branch.objectives)

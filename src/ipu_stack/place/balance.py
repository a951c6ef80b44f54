"""Resident weight balance: where each GEMM's tile range starts, and what each tile holds.

The host writes every GEMM's weights (resident blocks, distributed chunks) before the run, and
they stay until the GEMM has run, so a tile holds the sum of the weight blocks of every GEMM
that uses it. A GEMM that needs fewer tiles than the machine has would otherwise always start
at tile 0 and pile its weights onto the same tiles as every other small GEMM. Here each such
GEMM gets a rotation of its tile range (``tile = (offset + t) % tiles``): largest per-tile
block first, each into the window whose busiest tile is the least loaded so far (then the
least loaded in total, then the lowest offset: deterministic). A loop body's GEMMs count
once per iteration (their weights are stored one block per iteration).

Rotation is only used when it is needed: if every GEMM starting at tile 0 leaves the busiest
tile with at most ``STACKED_LIMIT`` of its data memory in weights, or if rotating would not
lower the busiest tile's weights, nothing moves (consecutive GEMMs then keep the operand
locality of equal tile ranges, and such models build as before).

``resident_bytes`` measures the result on a lowered program, independently of the planner's
figures: the bytes of every host-written buffer per tile (all live at step 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ipu_stack.errors import PlanError
from ipu_stack.graph.compute_graph import ComputeGraph
from ipu_stack.low.gemm_groups import shared_left_key
from ipu_stack.low.program import LowProgram
from ipu_stack.mid.gemm_plan import GemmPlan
from ipu_stack.place.sram import Region, usable_bytes

OFFSET_GRANULE = 2  # keep the two tiles of an exchange pair together (mapping.py)
STACKED_LIMIT = 0.25  # of a tile's data memory: beyond it, weight-carrying GEMMs are rotated


@dataclass(frozen=True, slots=True)
class _Weights:
    names: tuple[str, ...]  # GEMMs kept on one tile range (low/gemm_groups.py)
    tiles: int
    per_tile: int  # host-written bytes on each of its tiles


def _collect(
    graph: ComputeGraph,
    plans: dict[str, GemmPlan],
    tiles: int,
    scale: int,
    out: list[_Weights],
    bodies: dict[str, Any],
) -> None:
    from ipu_stack.mid.candidates.repeat import body_finalist
    from ipu_stack.mid.residency import enclosing_weights_per_tile

    groups: dict[Any, int] = {}  # shared-left key -> index in ``out``
    for op in graph.operations:
        if op.kind == "gemm" and op.name in plans:
            plan = plans[op.name]
            if plan.resident_bytes > 0:
                key = shared_left_key(graph, op, plan)
                mine = _Weights((op.name,), plan.tiles, plan.resident_bytes * scale)
                if key is not None and key in groups:
                    at = groups[key]
                    prev = out[at]
                    out[at] = _Weights(
                        prev.names + mine.names, prev.tiles, prev.per_tile + mine.per_tile
                    )
                    continue
                if key is not None:
                    groups[key] = len(out)
                out.append(mine)
        elif op.kind == "repeat":
            body: ComputeGraph = op.attr("body")
            count = int(op.attr("count"))
            base = enclosing_weights_per_tile(graph, op, tiles)
            plan_of_body = bodies.get(op.name) or body_finalist(body, tiles, count, base)
            _collect(body, plan_of_body.gemm_plans, tiles, scale * count, out, bodies)


def tile_offsets(
    graph: ComputeGraph,
    plans: dict[str, GemmPlan],
    tiles: int,
    bodies: dict[str, Any] | None = None,
) -> tuple[dict[str, int], np.ndarray]:
    """Start tile of every weight-carrying GEMM (loop bodies included), and the per-tile
    resident weight bytes that result (the planner's figures, before lowering)."""
    entries: list[_Weights] = []
    _collect(graph, plans, tiles, 1, entries, bodies or {})
    stacked = np.zeros(tiles, dtype=np.int64)
    for w in entries:
        stacked[: min(w.tiles, tiles)] += w.per_tile
    if stacked.max(initial=0) <= STACKED_LIMIT * usable_bytes(Region.ANY):
        return {}, stacked
    load = np.zeros(tiles, dtype=np.int64)
    offsets: dict[str, int] = {}
    for w in sorted(entries, key=lambda e: (-e.per_tile, -e.tiles, e.names)):
        used = min(w.tiles, tiles)
        if used >= tiles:
            load += w.per_tile
            continue
        doubled = np.concatenate([load, load[: used - 1]])
        windows = np.lib.stride_tricks.sliding_window_view(doubled, used)[::OFFSET_GRANULE]
        busiest = windows.max(axis=1)
        summed = np.cumsum(np.concatenate([[0], doubled]))
        starts = np.arange(0, tiles, OFFSET_GRANULE)
        totals = summed[starts + used] - summed[starts]
        best = int(starts[np.lexsort((starts, totals, busiest))[0]])
        offsets.update(dict.fromkeys(w.names, best))
        load[(best + np.arange(used)) % tiles] += w.per_tile
    if load.max() >= stacked.max():  # nothing to gain (e.g. GEMMs on almost every tile)
        return {}, stacked
    return offsets, load


def resident_bytes(program: LowProgram, region: Region | None = None) -> np.ndarray:
    """Per logical tile, the bytes of the buffers the host writes before the run (all live
    from step 0: weights, distributed chunks, host inputs); only those of ``region`` if given."""
    out = np.zeros(max(program.tile_count, 1), dtype=np.int64)
    chosen = [
        (b.tile, b.size)
        for b in program.buffers
        if b.host_written and (region is None or b.region == region.value)
    ]
    if chosen:
        tiles, sizes = zip(*chosen, strict=True)
        np.add.at(out, np.asarray(tiles), np.asarray(sizes, dtype=np.int64))
    return out


def check_resident(program: LowProgram, finalist: int) -> dict[str, int]:
    """Refuse a lowered finalist whose host-written buffers cannot fit a tile even before
    anything else is allocated (they are all live at step 0), before the placement attempt.

    Returns the balance figures (busiest tile, its bytes, the mean) for the trace.

    Raises:
        PlanError: naming the finalist, the tile, its resident bytes and the shortfall.
    """
    total = resident_bytes(program)
    interleaved = resident_bytes(program, Region.INTERLEAVED)
    for region, need, cap in (
        ("interleaved", interleaved, usable_bytes(Region.INTERLEAVED)),
        ("data", total, usable_bytes(Region.ANY)),
    ):
        tile = int(np.argmax(need))
        if need[tile] > cap:
            raise PlanError(
                f"finalist {finalist} rejected before placement: tile {tile} holds "
                f"{int(need[tile])} B of weights and inputs written before the run (live from "
                f"step 0) in the {region} region, which holds {cap} B: short by "
                f"{int(need[tile]) - cap} B"
            )
    busiest = int(np.argmax(total))
    return {
        "busiest_tile": busiest,
        "busiest_resident_bytes": int(total[busiest]),
        "mean_resident_bytes": int(total.sum() // max(1, total.size)),
    }

"""Placement: buffer lifetimes, SRAM addresses per tile, and physical exchange phases.

Logical tile ``l`` runs on physical tile ``logical_to_physical(l)`` (the C600 map; tile-mapping
screening comes later). Tiles whose buffer lists are identical share one allocation run.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from ipu_stack.errors import PlanError
from ipu_stack.exchange.model import ExchangePhase, Transfer
from ipu_stack.low.program import (
    AddCall,
    ComputeStep,
    ExchangeStep,
    GemmCall,
    LowProgram,
    Ref,
    RepeatStep,
    View,
)
from ipu_stack.place.sram import BufferRequest, Region, allocate_tile, region_peaks
from ipu_stack.target.ipu21 import TILES
from ipu_stack.target.topology import logical_to_physical


@dataclass(frozen=True, slots=True)
class Allocation:
    name: str
    address: int
    size: int
    live: tuple[int, int]


@dataclass(slots=True)
class Placement:
    """Where every buffer of a program lives."""

    physical: np.ndarray  # logical tile -> physical tile id
    allocations: list[dict[str, Allocation]]  # by logical tile
    peaks: dict[str, int]
    mapped: bool = False  # a screened relabelling replaced the baseline C600 map

    def address(self, tile: int, ref: Ref) -> int:
        return self.allocations[tile][ref.buffer].address + ref.offset


#: Regions by name (``Region(name)`` is a slow enum lookup, made once per buffer).
_REGIONS = {region.value: region for region in Region}


def buffer_lifetimes(program: LowProgram) -> dict[tuple[int, str], tuple[int, int]]:
    """First and last step (inclusive) that touch each buffer."""
    first: dict[tuple[int, str], int] = {}
    last: dict[tuple[int, str], int] = {}
    written_first: set[tuple[int, str]] = set()  # first step only writes it (no read)
    for i, step in enumerate(program.steps):
        # Steps come in order: a buffer's first step is the first seen, its last the latest.
        if isinstance(step, ComputeStep):
            touched = _compute_touches(step)
        elif isinstance(step, ExchangeStep):
            touched = _exchange_touches(step)
        else:
            continue
        last.update(dict.fromkeys(touched, i))
        for key, was_read in touched.items():
            if key not in first:
                first[key] = i
                if not was_read:
                    written_first.add(key)
    keys = list(first)
    return dict(zip(keys, _repeat_spans(program, keys, first, last, written_first), strict=True))


#: Fields of a kernel call that may hold a written (first two) or read operand.
_OPERAND_FIELDS = ("out", "left", "right", "dst", "src")
_WRITTEN_FIELDS = ("out", "dst")
_operand_fields: dict[type, tuple[tuple[str, bool], ...]] = {}


def _fields_of(kind: type) -> tuple[tuple[str, bool], ...]:
    """The operand fields a call class has, each with whether it is an output field."""
    spec = _operand_fields.get(kind)
    if spec is None:
        slotted = hasattr(kind, "__slots__")
        names = [n for n in _OPERAND_FIELDS if not slotted or hasattr(kind, n)]
        spec = tuple((n, n in _WRITTEN_FIELDS) for n in names)
        _operand_fields[kind] = spec
    return spec


def _compute_touches(step: ComputeStep) -> dict[tuple[int, str], bool]:
    """The ``(tile, buffer)`` keys a compute step touches, each with whether it reads it."""
    touched: dict[tuple[int, str], bool] = {}
    for call in step.calls:
        tile = call.tile
        reads_out: bool | None = None
        for field_name, written in _fields_of(type(call)):
            ref = getattr(call, field_name, None)
            if isinstance(ref, View):
                ref = ref.ref
            if isinstance(ref, Ref):
                key = (tile, ref.buffer)
                if written:
                    if reads_out is None:
                        reads_out = _reads_out(call)
                    touched[key] = touched.get(key, False) or reads_out
                else:
                    touched[key] = True
        for ref in getattr(call, "inputs", ()):
            touched[(tile, (ref.ref if isinstance(ref, View) else ref).buffer)] = True
    return touched


def _exchange_touches(step: ExchangeStep) -> dict[tuple[int, str], bool]:
    """The keys an exchange step touches: sources are read, destinations only written."""
    touched = dict.fromkeys(
        ((tile, ref.buffer) for t in step.transfers for tile, ref in t.destinations), False
    )
    touched.update(dict.fromkeys(((t.source_tile, t.source.buffer) for t in step.transfers), True))
    return touched


def _repeat_spans(
    program: LowProgram,
    keys: list[tuple[int, str]],
    first: dict[tuple[int, str], int],
    last: dict[tuple[int, str], int],
    written_first: set[tuple[int, str]],
) -> list[tuple[int, int]]:
    """``(first, last)`` of every key, widened by the loop bodies they live in.

    Inside a loop body a buffer the body reads before writing (carried values, weights,
    invariants) or that lives outside the body lives for the whole body: the next iteration
    comes back to the first step. One the body writes before any read, and that only the body
    touches, is rewritten each iteration: it lives from that write to its last use, and its
    bytes are free for the rest of the body. Bodies are applied in step order, each to the
    spans the earlier ones left.
    """
    lo = np.fromiter((first[k] for k in keys), dtype=np.int64, count=len(keys))
    hi = np.fromiter((last[k] for k in keys), dtype=np.int64, count=len(keys))
    rewritten = np.fromiter((k in written_first for k in keys), dtype=bool, count=len(keys))
    for i, step in enumerate(program.steps):
        if isinstance(step, RepeatStep):
            body_lo, body_hi = i + 1, i + step.length
            overlaps = (lo <= body_hi) & (body_lo <= hi)
            inside = (body_lo <= lo) & (hi <= body_hi) & rewritten
            widen = overlaps & ~inside
            lo[widen] = np.minimum(lo[widen], body_lo)
            hi[widen] = np.maximum(hi[widen], body_hi)
    return list(zip(lo.tolist(), hi.tolist(), strict=True))


def _reads_out(call: object) -> bool:
    """Whether a call's ``out`` is read as well as written (accumulating kernels)."""
    return isinstance(call, AddCall) or (isinstance(call, GemmCall) and call.accumulate)


def place_program(program: LowProgram, physical: np.ndarray | None = None) -> Placement:
    """Allocate every buffer; dead buffers' bytes are reused by later ones.

    Raises:
        PlanError: if a tile's buffers do not fit (names the tile and buffer).
    """
    spans = buffer_lifetimes(program)
    end = len(program.steps) + 1
    per_tile: dict[int, list[BufferRequest]] = defaultdict(list)
    for buf in program.buffers:
        first, last = spans.get((buf.tile, buf.name), (0, 0))
        live = (0 if buf.host_written else first, end if buf.host_read else last + 1)
        per_tile[buf.tile].append(
            BufferRequest(
                buf.name,
                buf.size,
                buf.alignment,
                _REGIONS.get(buf.region) or Region(buf.region),
                live,
                buf.exclusive_element,
                buf.avoid,
            )
        )
    hazards = exchange_hazard_pairs(program)
    # Tiles with equal separated requests get the same addresses and equal allocations (the
    # requests differ at most in ``avoid_element_of``, which allocations do not record).
    cache: dict[tuple, dict[str, Allocation]] = {}
    allocations: list[dict[str, Allocation]] = [{} for _ in range(program.tile_count)]
    peaks = {"standard_peak_bytes": 0, "interleaved_peak_bytes": 0, "largest_standard_bytes": 0}
    for tile in range(program.tile_count):
        requests = sorted(per_tile.get(tile, []), key=lambda r: r.name)
        separated = _separate(requests, hazards.get(tile, {}))
        key = tuple(separated)
        known = cache.get(key)
        if known is None:
            try:
                # First with each phase's send and receive buffers in different elements
                # (no SRAM-element hazard left for the scheduler), else as requested.
                addresses = allocate_tile(separated)
            except PlanError:
                try:
                    addresses = allocate_tile(requests)
                except PlanError as err:
                    raise PlanError(f"tile {tile}: {err}") from None
            for k, v in region_peaks(requests, addresses).items():
                peaks[k] = max(peaks[k], v)
            known = cache[key] = {
                r.name: Allocation(r.name, addresses[r.name], r.size, r.live) for r in requests
            }
        allocations[tile] = dict(known)  # each tile its own dict of the shared, frozen entries
    if physical is None:
        physical = np.asarray(logical_to_physical(np.arange(program.tile_count)), dtype=np.int64)
    return Placement(physical, allocations, peaks)


def exchange_hazard_pairs(program: LowProgram) -> dict[int, dict[str, set[str]]]:
    """Per tile, the buffers each buffer should not share a memory element with: those it
    receives into while the same exchange step sends from the other (an SRAM-element hazard,
    facts §5.4, serialises the two; in different elements they may overlap)."""
    pairs: dict[int, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for step in program.steps:
        if not isinstance(step, ExchangeStep):
            continue
        sends: dict[int, list[str]] = defaultdict(list)
        for tile, buffer in dict.fromkeys((t.source_tile, t.source.buffer) for t in step.transfers):
            sends[tile].append(buffer)
        received = dict.fromkeys(
            (tile, ref.buffer) for t in step.transfers for tile, ref in t.destinations
        )
        for tile, a in received:
            sent = sends.get(tile)
            if sent:
                for b in sent:
                    if a != b:
                        pairs[tile][a].add(b)
    return pairs


def _separate(requests: list[BufferRequest], avoid: dict[str, set[str]]) -> list[BufferRequest]:
    """``requests`` with the hazard pairs of ``avoid`` added to ``avoid_element_of``."""
    if not avoid:
        return requests
    out = []
    for r in requests:
        wanted = avoid.get(r.name)
        if not wanted:
            out.append(r)
            continue
        extra = sorted(wanted - set(r.avoid_element_of))
        out.append(replace(r, avoid_element_of=(*r.avoid_element_of, *extra)) if extra else r)
    return out


def physical_phase(step: ExchangeStep, placement: Placement) -> ExchangePhase:
    """The exchange step with physical tile ids and byte addresses."""
    phys = placement.physical.tolist()
    allocations = placement.allocations
    transfers = tuple(
        Transfer(
            phys[t.source_tile],
            allocations[t.source_tile][t.source.buffer].address + t.source.offset,
            tuple(
                (phys[tile], allocations[tile][ref.buffer].address + ref.offset)
                for tile, ref in t.destinations
            ),
            t.words,
        )
        for t in step.transfers
    )
    return ExchangePhase(transfers, TILES)

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
from ipu_stack.low.program import ComputeStep, ExchangeStep, LowProgram, Ref, RepeatStep, View
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


def buffer_lifetimes(program: LowProgram) -> dict[tuple[int, str], tuple[int, int]]:
    """First and last step (inclusive) that touch each buffer."""
    first: dict[tuple[int, str], int] = {}
    last: dict[tuple[int, str], int] = {}
    written_first: set[tuple[int, str]] = set()  # first step only writes it (no read)
    for i, step in enumerate(program.steps):
        # Steps come in order: a buffer's first step is the first seen, its last the latest.
        touched: set[tuple[int, str]] = set()
        read: set[tuple[int, str]] = set()
        if isinstance(step, ComputeStep):
            for call in step.calls:
                for field_name in ("out", "left", "right", "dst", "src"):
                    ref = getattr(call, field_name, None)
                    if isinstance(ref, View):
                        ref = ref.ref
                    if isinstance(ref, Ref):
                        touched.add((call.tile, ref.buffer))
                        if field_name not in ("out", "dst") or _reads_out(call):
                            read.add((call.tile, ref.buffer))
                for ref in getattr(call, "inputs", ()):
                    key = (call.tile, (ref.ref if isinstance(ref, View) else ref).buffer)
                    touched.add(key)
                    read.add(key)
        elif isinstance(step, ExchangeStep):
            read.update((t.source_tile, t.source.buffer) for t in step.transfers)
            touched.update(read)
            touched.update(
                (tile, ref.buffer) for t in step.transfers for tile, ref in t.destinations
            )
        for key in touched:
            if key not in first:
                first[key] = i
                if key not in read:
                    written_first.add(key)
            last[key] = i
    seen = {key: [first[key], last[key]] for key in first}
    # Inside a loop body a buffer the body reads before writing (carried values, weights,
    # invariants) or that lives outside the body lives for the whole body: the next
    # iteration comes back to the first step. One the body writes before any read, and that
    # only the body touches, is rewritten each iteration: it lives from that write to its
    # last use, and its bytes are free for the rest of the body.
    for i, step in enumerate(program.steps):
        if isinstance(step, RepeatStep):
            lo, hi = i + 1, i + step.length
            for key, span in seen.items():
                if span[0] <= hi and lo <= span[1]:
                    if lo <= span[0] and span[1] <= hi and key in written_first:
                        continue
                    span[0], span[1] = min(span[0], lo), max(span[1], hi)
    return {k: (v[0], v[1]) for k, v in seen.items()}


def _reads_out(call: object) -> bool:
    """Whether a call's ``out`` is read as well as written (accumulating kernels)."""
    from ipu_stack.low.program import AddCall, GemmCall

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
                Region(buf.region),
                live,
                buf.exclusive_element,
                buf.avoid,
            )
        )
    hazards = exchange_hazard_pairs(program)
    cache: dict[tuple, dict[str, int]] = {}
    allocations: list[dict[str, Allocation]] = [{} for _ in range(program.tile_count)]
    peaks = {"standard_peak_bytes": 0, "interleaved_peak_bytes": 0, "largest_standard_bytes": 0}
    for tile in range(program.tile_count):
        requests = sorted(per_tile.get(tile, []), key=lambda r: r.name)
        separated = _separate(requests, hazards.get(tile, {}))
        key = tuple(separated)
        if key not in cache:
            try:
                # First with each phase's send and receive buffers in different elements
                # (no SRAM-element hazard left for the scheduler), else as requested.
                cache[key] = allocate_tile(separated)
            except PlanError:
                try:
                    cache[key] = allocate_tile(requests)
                except PlanError as err:
                    raise PlanError(f"tile {tile}: {err}") from None
            for k, v in region_peaks(requests, cache[key]).items():
                peaks[k] = max(peaks[k], v)
        addresses = cache[key]
        allocations[tile] = {
            r.name: Allocation(r.name, addresses[r.name], r.size, r.live) for r in requests
        }
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
        sends: dict[int, set[str]] = defaultdict(set)
        receives: dict[int, set[str]] = defaultdict(set)
        for t in step.transfers:
            sends[t.source_tile].add(t.source.buffer)
            for tile, ref in t.destinations:
                receives[tile].add(ref.buffer)
        for tile, received in receives.items():
            for a in received:
                for b in sends.get(tile, ()):
                    if a != b:
                        pairs[tile][a].add(b)
    return pairs


def _separate(requests: list[BufferRequest], avoid: dict[str, set[str]]) -> list[BufferRequest]:
    """``requests`` with the hazard pairs of ``avoid`` added to ``avoid_element_of``."""
    if not avoid:
        return requests
    out = []
    for r in requests:
        extra = sorted(avoid.get(r.name, set()) - set(r.avoid_element_of))
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

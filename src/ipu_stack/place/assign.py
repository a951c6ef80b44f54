"""Placement: buffer lifetimes, SRAM addresses per tile, and physical exchange phases.

Logical tile ``l`` runs on physical tile ``logical_to_physical(l)`` (the C600 map; tile-mapping
screening comes later). Tiles whose buffer lists are identical share one allocation run.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from ipu_stack.errors import PlanError
from ipu_stack.exchange.model import PAIRED64, WORD32, ExchangePhase, Transfer
from ipu_stack.low.program import (
    AddCall,
    ComputeStep,
    CopyCall,
    ExchangeStep,
    FillCall,
    GemmCall,
    LowProgram,
    MapCall,
    Ref,
    RepeatStep,
    View,
)
from ipu_stack.place.sram import BufferRequest, Region, allocate_tile, region_peaks
from ipu_stack.target.ipu21 import (
    DEFAULT_SUPPORT_RESERVATION_BYTES,
    PAIRED_ALIGN,
    PAIRED_MIN_WORDS,
    TILES,
)
from ipu_stack.target.topology import PAIR_PARTNER_BIT, logical_to_physical


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
    # (allocations it was made from, buffer -> address of each tile): see ``addresses``
    _addresses: tuple[list, list[dict[str, int]]] | None = field(
        default=None, repr=False, compare=False
    )

    def address(self, tile: int, ref: Ref) -> int:
        return self.allocations[tile][ref.buffer].address + ref.offset

    def addresses(self) -> list[dict[str, int]]:
        """Buffer name -> byte address of each logical tile (made once per allocations)."""
        made = self._addresses
        if made is None or made[0] is not self.allocations:
            table = [{n: a.address for n, a in tile.items()} for tile in self.allocations]
            made = self._addresses = (self.allocations, table)
        return made[1]


#: Regions by name (``Region(name)`` is a slow enum lookup, made once per buffer).
_REGIONS = {region.value: region for region in Region}


def buffer_lifetimes(
    program: LowProgram, exchange_keys: dict[int, tuple[_Keys, _Keys]] | None = None
) -> dict[tuple[int, str], tuple[int, int]]:
    """First and last step (inclusive) that touch each buffer.

    ``exchange_keys`` (from :func:`_all_exchange_keys`) saves walking the transfers again.
    """
    keys_of = exchange_keys if exchange_keys is not None else _all_exchange_keys(program)
    first: dict[tuple[int, str], int] = {}
    last: dict[tuple[int, str], int] = {}
    written_first: set[tuple[int, str]] = set()  # first step only writes it (no read)
    sizes: dict[tuple[int, str], int] | None = None
    for i, step in enumerate(program.steps):
        # Steps come in order: a buffer's first step is the first seen, its last the latest.
        if isinstance(step, ComputeStep):
            touched = _compute_touches(step)
        elif isinstance(step, ExchangeStep):
            sent, received = keys_of[i]
            touched = _exchange_touches_of(sent, received)
        else:
            continue
        last.update(dict.fromkeys(touched, i))
        fresh = [key for key in touched if key not in first]
        first.update(dict.fromkeys(fresh, i))
        written = [key for key in fresh if not touched[key]]
        if written and isinstance(step, ExchangeStep):
            # received in part (a row's other words come later, or are padding read as is):
            # its other bytes are not rewritten here, so it does not count as rewritten
            if sizes is None:
                sizes = {(b.tile, b.name): b.size for b in program.buffers}
            whole = _received_bytes(step)
            written = [key for key in written if whole.get(key, 0) >= sizes.get(key, 0)]
        written_first.update(written)
    keys = list(first)
    return dict(zip(keys, _repeat_spans(program, keys, first, last, written_first), strict=True))


def _received_bytes(step: ExchangeStep) -> dict[tuple[int, str], int]:
    """Bytes each ``(tile, buffer)`` receives in an exchange step (overlaps counted twice)."""
    transfers = step.transfers
    keys = [(tile, ref[0]) for t in transfers for tile, ref in t.destinations]
    if not keys:
        return {}
    counts = np.fromiter(map(len, map(attrgetter("destinations"), transfers)), np.int64,
                         len(transfers))  # fmt: skip
    words = np.fromiter(map(attrgetter("words"), transfers), np.int64, len(transfers))
    position = dict(zip(dict.fromkeys(keys), itertools.count()))
    ids = np.fromiter(map(position.__getitem__, keys), np.int64, len(keys))
    # bincount sums in float64: exact far above any tile's bytes
    received = np.bincount(ids, np.repeat(4 * words, counts), len(position)).astype(np.int64)
    return dict(zip(position, received.tolist(), strict=True))


#: ``(tile, buffer)`` keys in first-seen order (a dict used as an ordered set).
_Keys = dict[tuple[int, str], None]


def _exchange_keys(step: ExchangeStep) -> tuple[_Keys, _Keys]:
    """The keys an exchange step sends from and receives into, each in first-seen order."""
    transfers = step.transfers
    sent = dict.fromkeys([(t.source_tile, t.source[0]) for t in transfers])
    received = dict.fromkeys([(tile, r[0]) for t in transfers for tile, r in t.destinations])
    return sent, received


def _all_exchange_keys(program: LowProgram) -> dict[int, tuple[_Keys, _Keys]]:
    """:func:`_exchange_keys` of every exchange step, by step index."""
    return {
        i: _exchange_keys(step)
        for i, step in enumerate(program.steps)
        if isinstance(step, ExchangeStep)
    }


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


_Touched = dict[tuple[int, str], bool]
# A step's touches: each key once, with whether the first call that touches it reads it (a
# call reads its operands before it writes its output). A buffer a call writes and a later
# call of the same step reads is written first: in a loop body it holds nothing from the
# previous iteration (see ``_repeat_spans``).


def _touch_gemm(call: GemmCall, touched: _Touched) -> None:
    tile = call.tile
    key = (tile, call.out[0])
    if key not in touched:
        touched[key] = call.accumulate
    touched.setdefault((tile, call.left[0]), True)
    touched.setdefault((tile, call.right[0]), True)


def _touch_map(call: MapCall, touched: _Touched) -> None:
    tile = call.tile
    out = call.out
    key = (tile, (out.ref if isinstance(out, View) else out)[0])
    new = key not in touched
    if new:
        touched[key] = False
    for v in call.inputs:
        read = (tile, (v.ref if isinstance(v, View) else v)[0])
        if new and read == key:
            touched[key] = True  # in place: read before it is written
        else:
            touched.setdefault(read, True)


def _touch_add(call: AddCall, touched: _Touched) -> None:
    tile = call.tile
    touched.setdefault((tile, call.out[0]), True)  # accumulates: read as well as written
    for r in call.inputs:
        touched.setdefault((tile, (r.ref if isinstance(r, View) else r)[0]), True)


def _touch_copy(call: CopyCall, touched: _Touched) -> None:
    key = (call.tile, call.dst[0])
    new = key not in touched
    if new:
        touched[key] = False
    src = (call.tile, call.src[0])
    if new and src == key:
        touched[key] = True
    else:
        touched.setdefault(src, True)


def _touch_fill(call: FillCall, touched: _Touched) -> None:
    touched.setdefault((call.tile, call.dst[0]), False)


def _touch_any(call: object, touched: _Touched) -> None:
    """Any call class: its operand fields by name (the generic form of the above)."""
    tile = call.tile  # type: ignore[attr-defined]
    reads_out: bool | None = None
    written_here: set[tuple[int, str]] = set()
    for field_name, written in _fields_of(type(call)):
        ref = getattr(call, field_name, None)
        if isinstance(ref, View):
            ref = ref.ref
        if isinstance(ref, Ref):
            key = (tile, ref.buffer)
            if written:
                if reads_out is None:
                    reads_out = _reads_out(call)
                if key not in touched:
                    touched[key] = reads_out
                    written_here.add(key)
            elif key in written_here:
                touched[key] = True
            else:
                touched.setdefault(key, True)
    for ref in getattr(call, "inputs", ()):
        key = (tile, (ref.ref if isinstance(ref, View) else ref).buffer)
        if key in written_here:
            touched[key] = True
        else:
            touched.setdefault(key, True)


#: The touch function of each kernel call class (operands whose fields hold plain refs).
_TOUCH: dict[type, Callable[[Any, _Touched], None]] = {
    GemmCall: _touch_gemm,
    MapCall: _touch_map,
    AddCall: _touch_add,
    CopyCall: _touch_copy,
    FillCall: _touch_fill,
}


def _compute_touches(step: ComputeStep) -> dict[tuple[int, str], bool]:
    """The ``(tile, buffer)`` keys a compute step touches, each with whether the first call
    that touches it reads it."""
    touched: _Touched = {}
    get = _TOUCH.get
    for call in step.calls:
        (get(type(call)) or _touch_any)(call, touched)
    return touched


def _exchange_touches(step: ExchangeStep) -> dict[tuple[int, str], bool]:
    """The keys an exchange step touches: sources are read, destinations only written."""
    return _exchange_touches_of(*_exchange_keys(step))


def _exchange_touches_of(sent: _Keys, received: _Keys) -> dict[tuple[int, str], bool]:
    """:func:`_exchange_touches` from the step's sent and received keys."""
    touched = dict.fromkeys(received, False)
    touched.update(dict.fromkeys(sent, True))
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


#: A buffer request as a plain tuple: the fields of :class:`BufferRequest`, in order.
_Request = tuple[str, int, int, Region, tuple[int, int], bool, tuple[str, ...]]


def place_program(
    program: LowProgram,
    physical: np.ndarray | None = None,
    reservations: dict[int, int] | None = None,
) -> Placement:
    """Allocate every buffer; dead buffers' bytes are reused by later ones. ``reservations``:
    a larger support reservation (bytes at the top of the standard region) for some logical
    tiles, whose rows, code and tables did not fit the default one.

    Raises:
        PlanError: if a tile's buffers do not fit (names the tile and buffer).
    """
    exchange_keys = _all_exchange_keys(program)
    spans = buffer_lifetimes(program, exchange_keys)
    end = len(program.steps) + 1
    per_tile: dict[int, list[_Request]] = defaultdict(list)
    for buf in program.buffers:
        first, last = spans.get((buf.tile, buf.name), (0, 0))
        live = (0 if buf.host_written else first, end if buf.host_read else last + 1)
        per_tile[buf.tile].append(
            (
                buf.name,
                buf.size,
                buf.alignment,
                _REGIONS.get(buf.region) or Region(buf.region),
                live,
                buf.exclusive_element,
                buf.avoid,
            )
        )
    hazards = _hazard_pairs(program, exchange_keys)
    # Tiles with equal separated requests get the same addresses and equal allocations (the
    # requests differ at most in ``avoid_element_of``, which allocations do not record).
    # Requests stay plain tuples until a tile's are new: most tiles repeat another's.
    cache: dict[tuple, dict[str, Allocation]] = {}
    allocations: list[dict[str, Allocation]] = [{} for _ in range(program.tile_count)]
    peaks = {"standard_peak_bytes": 0, "interleaved_peak_bytes": 0, "largest_standard_bytes": 0}
    for tile in range(program.tile_count):
        raw = sorted(per_tile.get(tile, []), key=itemgetter(0))  # by name
        separated_raw = _separate(raw, hazards.get(tile, {}))
        reservation = (reservations or {}).get(tile, DEFAULT_SUPPORT_RESERVATION_BYTES)
        key = (reservation, tuple(separated_raw))
        known = cache.get(key)
        if known is None:
            requests = [BufferRequest(*r) for r in raw]
            separated = [BufferRequest(*r) for r in separated_raw]
            try:
                # First with each phase's send and receive buffers in different elements
                # (no SRAM-element hazard left for the scheduler), else as requested.
                addresses = allocate_tile(separated, reservation=reservation)
            except PlanError:
                try:
                    addresses = allocate_tile(requests, reservation=reservation)
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
    return _hazard_pairs(program, _all_exchange_keys(program))


def _hazard_pairs(
    program: LowProgram, exchange_keys: dict[int, tuple[_Keys, _Keys]]
) -> dict[int, dict[str, set[str]]]:
    """:func:`exchange_hazard_pairs` from the sent and received keys of every exchange step."""
    pairs: dict[int, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for sent_keys, received in exchange_keys.values():
        sends: dict[int, list[str]] = defaultdict(list)
        for tile, buffer in sent_keys:
            sends[tile].append(buffer)
        for tile, a in received:
            sent = sends.get(tile)
            if sent:
                others = [b for b in sent if b != a]
                if others:
                    pairs[tile][a].update(others)
    return pairs


def _separate(requests: list[_Request], avoid: dict[str, set[str]]) -> list[_Request]:
    """``requests`` (tuples of :class:`BufferRequest` fields) with the hazard pairs of
    ``avoid`` added to ``avoid_element_of``."""
    if not avoid:
        return requests
    out = []
    for r in requests:
        wanted = avoid.get(r[0])
        if not wanted:
            out.append(r)
            continue
        extra = sorted(wanted - set(r[6]))
        out.append((*r[:6], (*r[6], *extra)) if extra else r)
    return out


def physical_phase(step: ExchangeStep, placement: Placement) -> ExchangePhase:
    """The exchange step with physical tile ids and byte addresses; a transfer that can move
    as 64-bit paired items (:func:`paired_width`) is marked so."""
    phys = placement.physical.tolist()
    addresses = placement.addresses()
    transfers = []
    for t in step.transfers:
        source = phys[t.source_tile]
        address = addresses[t.source_tile][t.source[0]] + t.source[1]
        dests = tuple([(phys[tile], addresses[tile][r[0]] + r[1]) for tile, r in t.destinations])
        transfers.append(
            Transfer(source, address, dests, t.words, paired_width(address, dests, t.words))
        )
    return ExchangePhase(tuple(transfers), TILES)


def paired_width(source_address: int, destinations: tuple[tuple[int, int], ...], words: int) -> str:
    """``"paired64"`` for a multicast the exchange can move as 64-bit items, else ``"word32"``.

    The rules (facts §8.5 [T], §7.4 [R]): at least ``PAIRED_MIN_WORDS`` words, an even count,
    8-byte-aligned source and destination addresses, and destinations in complete physical
    pairs (tile ``d`` receives exactly when its partner ``d ^ 2`` does: both tiles of a pair
    take every item). Each such pair then receives at two words per cycle.
    """
    if words < PAIRED_MIN_WORDS or words % 2 or source_address % PAIRED_ALIGN:
        return WORD32
    tiles = {d for d, _ in destinations}
    for d, a in destinations:
        if a % PAIRED_ALIGN or d ^ PAIR_PARTNER_BIT not in tiles:
            return WORD32
    return PAIRED64

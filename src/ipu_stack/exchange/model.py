"""The exchange-phase model: transfers between tiles, the constraints on them, and schedules.

A phase is the set of transfers made between two syncs. A transfer sends ``words`` 32-bit
words from one source tile to one or more destination tiles (multicast: every destination's
receive mux listens to the source in the same cycles, shifted by its own latency, facts §7.4).

**Ports.** Each tile has one send port and one receive port, each moving one 32-bit item per
cycle (facts §7.5), independently of each other (full duplex).

**Widths.** ``"word32"`` moves one word per cycle. ``"paired64"`` moves one 64-bit item (two
words) per cycle using the exchange lanes of both tiles of a physical pair (facts §7.4
supertile send/receive, §8.5 paired plans [T]). Precisely, a ``paired64`` transfer:

- has an even ``words`` and 8-byte-aligned source and destination addresses, and every piece of
  it starts at an even word offset and has an even length (``sendpicp`` alignment, §8.5);
- has destinations in complete physical pairs: tile ``d`` is a destination exactly when its
  partner ``d ^ 2`` is (both tiles of each pair receive every word, at their own address);
- takes ``words / 2`` cycles; for those cycles it occupies the source's send port, the send
  *and* receive ports of the source's partner ``source ^ 2`` (the reserved partner, as the
  reference implementation's ``PartnerBusy``, reference-system §2.6), and the receive port of
  every destination;
- reaches both tiles of a destination pair at the pair's paired latency (the slower of the two,
  §8.4).

**Latency.** Word ``k`` of a piece leaves the source at ``send_cycle + k`` and reaches
destination ``d`` at ``send_cycle + latency(source, d) + k`` (items instead of words for
``paired64``). ``"none"`` is 0 for every pair; ``"time_to_mux"`` is
:func:`ipu_stack.target.topology.exchange_latency` (19..165 cycles: the word reaches the
receiver's mux, the receiver's source select takes it one cycle later and the payload is
written :func:`ipu_stack.target.topology.mux_lead` cycles after that select, facts §8.5/§9).

**Release.** A receiver selects the source ``lead(d)`` cycles before the word is written
(``"none"``: 0), and no select can act before the phase starts, so a piece with destination
``d`` starts at ``send_cycle >= lead(d) - latency(source, d)`` (at most 77 cycles on the C600;
the reference's multicast start ``max(0, -min time_to_mux)``, facts §8.5).

**Memory order.** Transfers are listed in program order. When two transfers touch overlapping
bytes of one tile and at least one of them writes there (a receive), every access of the later
transfer on that tile starts after every access of the earlier one on that tile has ended
(send accesses occupy the send cycles, receive accesses the arrival cycles).

**SRAM-element hazards.** A piece that a tile sends reads the SRAM elements its bytes lie in
(16 KiB elements below the interleaved region, 32 KiB element pairs in it, facts §5.4 [T]); a
piece it receives writes elements the same way. A send and a receive on one tile whose element
sets intersect must not overlap in time (send cycles against arrival cycles).

Each of latency, paired widths, memory order, SRAM hazards and full duplex can be switched off
in :class:`ExchangeModel` so that tests can isolate one rule. (Multicast is part of what a
transfer is; :func:`split_multicasts` rewrites a phase as unicasts to model its absence.)

**Horizon.** The first cycle by which every word has been sent and received.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import chain
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from ipu_stack.errors import ScheduleError
from ipu_stack.target.ipu21 import (
    ELEMENT_BYTES,
    INTERLEAVED_BASE,
    INTERLEAVED_ELEMENT_BYTES,
    TILE_MEMORY_BASE,
    TILE_MEMORY_END,
    TILES,
    WORD_BYTES,
)
from ipu_stack.target.topology import (
    PAIR_PARTNER_BIT,
    exchange_latency,
    mux_lead,
    paired_exchange_latency,
)

IntArray = npt.NDArray[np.int64]

WORD32 = "word32"
PAIRED64 = "paired64"
WIDTHS = (WORD32, PAIRED64)
#: Bytes a ``paired64`` address must be a multiple of (facts §5.2, §8.5).
PAIRED_ALIGNMENT = 8

#: A vectorised latency model: ``(sources, destinations) -> cycles``, element by element.
LatencyModel = Callable[[IntArray, IntArray], IntArray]


def zero_latency(sources: IntArray, destinations: IntArray) -> IntArray:
    """The latency-free model: every destination receives a word in the cycle it is sent."""
    return np.zeros(np.broadcast(sources, destinations).shape, dtype=np.int64)


def _topology_latency(sources: IntArray, destinations: IntArray) -> IntArray:
    return np.asarray(exchange_latency(sources, destinations), dtype=np.int64)


def _paired_topology_latency(sources: IntArray, destinations: IntArray) -> IntArray:
    return np.asarray(paired_exchange_latency(sources, destinations), dtype=np.int64)


def zero_lead(destinations: IntArray) -> IntArray:
    """The latency-free model's lead: the source is selected in the cycle of the write."""
    return np.zeros(np.shape(destinations), dtype=np.int64)


def _topology_lead(destinations: IntArray) -> IntArray:
    return np.asarray(mux_lead(destinations), dtype=np.int64)


#: Source-select leads by latency model name: ``destinations -> cycles``.
LEAD_MODELS: dict[str, Callable[[IntArray], IntArray]] = {
    "none": zero_lead,
    "time_to_mux": _topology_lead,
}


def lead_model(name: str) -> Callable[[IntArray], IntArray]:
    """The source-select lead of latency model ``name`` (see the module docstring); a latency
    model registered without one selects in the cycle of the write (lead 0)."""
    latency_model(name)  # the same names; raises on an unknown one
    return LEAD_MODELS.get(name, zero_lead)


#: Latency models by name: ``(word32 latency, paired64 latency)``.
LATENCY_MODELS: dict[str, tuple[LatencyModel, LatencyModel]] = {
    "none": (zero_latency, zero_latency),
    "time_to_mux": (_topology_latency, _paired_topology_latency),
}


def latency_model(name: str, paired: bool = False) -> LatencyModel:
    """Look up a latency model by name.

    Args:
        name: a key of :data:`LATENCY_MODELS`.
        paired: the latency of paired (64-bit) receives instead of ordinary ones.

    Returns:
        The vectorised latency function.

    Raises:
        ScheduleError: if the name is unknown.
    """
    try:
        return LATENCY_MODELS[name][1 if paired else 0]
    except KeyError:
        known = ", ".join(sorted(LATENCY_MODELS))
        raise ScheduleError(f"unknown latency model {name!r}; known: {known}") from None


@dataclass(frozen=True, slots=True)
class ExchangeModel:
    """Which hardware rules a schedule must obey (all on: the IPU21).

    Attributes:
        latency: ``"time_to_mux"`` (per-pair latency) or ``"none"``.
        paired: ``paired64`` transfers move two words per cycle and reserve the source partner;
            when off they are scheduled as ``word32`` transfers.
        dependencies: memory-order dependencies between transfers.
        sram_hazards: no send and receive on one tile in a shared SRAM element at once.
        full_duplex: a tile sends and receives at once; when off, a tile does one at a time.
    """

    latency: str = "time_to_mux"
    paired: bool = True
    dependencies: bool = True
    sram_hazards: bool = True
    full_duplex: bool = True

    def describe(self) -> str:
        """A short name for logs: the latency model and the rules that are off."""
        off = [
            name
            for name in ("paired", "dependencies", "sram_hazards", "full_duplex")
            if not getattr(self, name)
        ]
        return f"latency={self.latency}" + (f" off={','.join(off)}" if off else "")

    def as_dict(self) -> dict[str, object]:
        """The switches as a JSON-ready dict."""
        return {
            "latency": self.latency,
            "paired": self.paired,
            "dependencies": self.dependencies,
            "sram_hazards": self.sram_hazards,
            "full_duplex": self.full_duplex,
        }


#: The IPU21 as far as we know it: every rule on.
IPU21_MODEL = ExchangeModel()
#: Ports only: one word per cycle per send and receive port, multicast, nothing else.
PORTS_ONLY = ExchangeModel(
    latency="none", paired=False, dependencies=False, sram_hazards=False, full_duplex=True
)


@dataclass(frozen=True, slots=True)
class Transfer:
    """One source sending a contiguous block of words to one or more destinations.

    Attributes:
        source: physical tile id of the sender.
        source_address: byte address of the first word on the sender (word aligned).
        destinations: ``(tile, byte address)`` pairs; distinct tiles, none equal to ``source``.
        words: number of 32-bit words sent (positive).
        width: ``"word32"`` or ``"paired64"`` (see the module docstring).
    """

    source: int
    source_address: int
    destinations: tuple[tuple[int, int], ...]
    words: int
    width: str = WORD32

    @property
    def destination_tiles(self) -> tuple[int, ...]:
        """The destination tile ids, in order."""
        return tuple(tile for tile, _ in self.destinations)


@dataclass(frozen=True, slots=True)
class ExchangePhase:
    """The transfers of one exchange phase.

    Attributes:
        transfers: the transfers in program order; their index is their identity in schedules
            and errors.
        tile_count: number of tiles; tile ids are ``0..tile_count-1`` (physical ids).
    """

    transfers: tuple[Transfer, ...]
    tile_count: int = TILES

    def validate(self) -> None:
        """Check that every transfer is well formed.

        Raises:
            ScheduleError: naming the first bad transfer's index and what is wrong with it.
        """
        known = _VALIDATED.get(id(self))
        if known is not None and known is self:
            return  # immutable, and accepted before (scheduling and verifying both validate)
        if not 1 <= self.tile_count <= TILES:
            raise ScheduleError(f"tile_count must be in 1..{TILES}, got {self.tile_count}")
        for index in _suspects(self):
            _validate_transfer(index, self.transfers[index], self.tile_count)
        if len(_VALIDATED) >= _VALIDATED_SIZE:
            del _VALIDATED[next(iter(_VALIDATED))]
        _VALIDATED[id(self)] = self


#: The phases most recently accepted by :meth:`ExchangePhase.validate`, by identity (each kept
#: alive by its entry, so its id cannot be reused).
_VALIDATED: dict[int, ExchangePhase] = {}
_VALIDATED_SIZE = 4


def _suspects(phase: ExchangePhase) -> list[int]:
    """Indices, in order, of the transfers a vectorised screen cannot clear: every malformed
    transfer is among them (paired64 and unknown widths always are), so checking just these
    one by one finds the first malformed transfer, with its message."""
    count = len(phase.transfers)
    try:
        arrays = phase_arrays(phase)
        widths = list(map(attrgetter("width"), phase.transfers))
        if widths.count(WORD32) == count:
            plain = np.ones(count, dtype=bool)
        else:
            plain = np.fromiter((width == WORD32 for width in widths), dtype=bool, count=count)
    except (TypeError, ValueError, OverflowError):  # fields that are not plain integers
        return list(range(count))
    tiles = arrays.destination_tiles
    owners = arrays.destination_transfers
    span = arrays.words * WORD_BYTES
    bad = ~plain | (arrays.words <= 0) | (arrays.fanouts == 0)
    bad |= (arrays.sources < 0) | (arrays.sources >= phase.tile_count)
    bad |= _outside_memory(arrays.source_addresses, span)
    wrong = (tiles < 0) | (tiles >= phase.tile_count) | (tiles == arrays.sources[owners])
    wrong |= _outside_memory(arrays.destination_addresses, span[owners])
    order = np.lexsort((tiles, owners))
    repeated = (np.diff(owners[order]) == 0) & (np.diff(tiles[order]) == 0)
    wrong[order[1:][repeated]] = True
    bad[owners[wrong]] = True
    return np.flatnonzero(bad).tolist()


def _outside_memory(address: IntArray, span: IntArray) -> npt.NDArray[np.bool_]:
    """Addresses that are not word aligned or whose ``span`` bytes leave tile memory."""
    return (
        (address % WORD_BYTES != 0)
        | (address < TILE_MEMORY_BASE)
        | (address + span > TILE_MEMORY_END)
    )


def _validate_transfer(index: int, transfer: Transfer, tile_count: int) -> None:
    where = f"transfer {index}"
    if transfer.width not in WIDTHS:
        raise ScheduleError(f"{where}: width {transfer.width!r} is not one of {', '.join(WIDTHS)}")
    if transfer.words <= 0:
        raise ScheduleError(f"{where}: words must be positive, got {transfer.words}")
    if not 0 <= transfer.source < tile_count:
        raise ScheduleError(f"{where}: source tile {transfer.source} outside 0..{tile_count - 1}")
    span = transfer.words * WORD_BYTES
    _check_address(where, "source address", transfer.source_address, span)
    if not transfer.destinations:
        raise ScheduleError(f"{where}: no destinations")
    seen: set[int] = set()
    for tile, address in transfer.destinations:
        if not 0 <= tile < tile_count:
            raise ScheduleError(f"{where}: destination tile {tile} outside 0..{tile_count - 1}")
        if tile == transfer.source:
            raise ScheduleError(f"{where}: destination tile {tile} is the source")
        if tile in seen:
            raise ScheduleError(f"{where}: destination tile {tile} appears twice")
        seen.add(tile)
        _check_address(where, f"destination address on tile {tile}", address, span)
    if transfer.width == PAIRED64:
        _validate_paired(where, transfer, seen, tile_count)


def _validate_paired(where: str, transfer: Transfer, tiles: set[int], tile_count: int) -> None:
    if transfer.words % 2:
        raise ScheduleError(f"{where}: paired64 needs an even word count, got {transfer.words}")
    addresses = [("source address", transfer.source_address)] + [
        (f"destination address on tile {tile}", address) for tile, address in transfer.destinations
    ]
    for what, address in addresses:
        if address % PAIRED_ALIGNMENT:
            raise ScheduleError(f"{where}: paired64 {what} {address:#x} is not 8-byte aligned")
    partner = transfer.source ^ PAIR_PARTNER_BIT
    if partner >= tile_count:
        raise ScheduleError(f"{where}: paired64 source partner tile {partner} is not in the phase")
    for tile in sorted(tiles):
        if tile ^ PAIR_PARTNER_BIT not in tiles:
            raise ScheduleError(
                f"{where}: paired64 destination tile {tile} without its pair partner "
                f"{tile ^ PAIR_PARTNER_BIT}"
            )


def _check_address(where: str, what: str, address: int, span: int) -> None:
    if address % WORD_BYTES:
        raise ScheduleError(f"{where}: {what} {address:#x} is not a word-aligned byte address")
    if address < TILE_MEMORY_BASE or address + span > TILE_MEMORY_END:
        raise ScheduleError(
            f"{where}: {what} {address:#x} (+{span} bytes) outside tile memory "
            f"{TILE_MEMORY_BASE:#x}..{TILE_MEMORY_END:#x}"
        )


def element_of(address: IntArray) -> IntArray:
    """SRAM element index of byte addresses (facts §5.4 [T]).

    Standard memory is cut into 16 KiB elements from the tile memory base; the interleaved
    region into 32 KiB element pairs, numbered after the standard ones.

    Args:
        address: byte addresses inside tile memory.

    Returns:
        Element indices, same shape.
    """
    standard = (address - TILE_MEMORY_BASE) // ELEMENT_BYTES
    first_interleaved = (INTERLEAVED_BASE - TILE_MEMORY_BASE) // ELEMENT_BYTES
    interleaved = first_interleaved + (address - INTERLEAVED_BASE) // INTERLEAVED_ELEMENT_BYTES
    return np.where(address < INTERLEAVED_BASE, standard, interleaved).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Piece:
    """A contiguous run of a transfer's words sent one item per cycle.

    Attributes:
        send_cycle: cycle (from the start of the phase) the first item leaves the source.
        offset_words: index of the piece's first word within its transfer.
        words: number of 32-bit words in the piece.
    """

    send_cycle: int
    offset_words: int
    words: int

    @property
    def send_end(self) -> int:
        """First cycle after the piece has left a ``word32`` source's send port."""
        return self.send_cycle + self.words


@dataclass(frozen=True, slots=True)
class PhaseSchedule:
    """A schedule of one exchange phase.

    Attributes:
        pieces: ``pieces[i]`` are the pieces of transfer ``i`` of the phase, in phase order.
        horizon: the cycle by which every word has been sent and received (0 when empty).
        kind: which scheduler made it (``"dense-greedy"``, ``"cp-sat-lns"``, ...).
        model: the rules it was made for (the verifier checks against them).
        first_arrivals: optionally, per transfer and per destination (in the transfer's order),
            the cycle its first word arrives; the verifier checks them against the latency.
    """

    pieces: tuple[tuple[Piece, ...], ...]
    horizon: int
    kind: str
    model: ExchangeModel = field(default=IPU21_MODEL)
    first_arrivals: tuple[tuple[int, ...], ...] | None = None

    @property
    def latency(self) -> str:
        """Name of the latency model used for arrivals."""
        return self.model.latency

    def with_model(self, model: ExchangeModel) -> PhaseSchedule:
        """The same pieces claimed under another model (arrivals dropped)."""
        return replace(self, model=model, first_arrivals=None)


@dataclass(frozen=True, slots=True)
class PhaseArrays:
    """A phase flattened into numpy arrays (destinations in CSR form).

    Attributes:
        sources: ``sources[i]`` is the source tile of transfer ``i``.
        words: ``words[i]`` is the word count of transfer ``i``.
        destination_starts: destinations of transfer ``i`` are
            ``destination_tiles[destination_starts[i]:destination_starts[i + 1]]``.
        destination_tiles: all destination tiles, transfer by transfer.
        destination_transfers: the transfer index of each entry of ``destination_tiles``.
        source_addresses: ``source_addresses[i]`` is the source byte address of transfer ``i``.
        destination_addresses: the byte address of each entry of ``destination_tiles``.
        paired: ``paired[i]`` is true when transfer ``i`` has width ``paired64``.
    """

    sources: IntArray
    words: IntArray
    destination_starts: IntArray
    destination_tiles: IntArray
    destination_transfers: IntArray
    source_addresses: IntArray
    destination_addresses: IntArray
    paired: npt.NDArray[np.bool_]

    @property
    def fanouts(self) -> IntArray:
        """Number of destinations of each transfer."""
        return np.diff(self.destination_starts)


#: The phases most recently flattened, by identity (a phase is immutable, and is kept alive
#: by its entry so its id cannot be reused): validation, compilation, the memo key and the
#: code generator all flatten the phase being scheduled.
_ARRAYS_CACHE: dict[int, tuple[ExchangePhase, PhaseArrays]] = {}
_ARRAYS_CACHE_SIZE = 4


def phase_arrays(phase: ExchangePhase) -> PhaseArrays:
    """Flatten a phase into arrays for vectorised bounds, scheduling and checking.

    The arrays are read-only and shared by every caller flattening the same phase object.

    Args:
        phase: the phase (not validated here).

    Returns:
        The arrays; all ``int64`` except ``paired``.
    """
    known = _ARRAYS_CACHE.get(id(phase))
    if known is not None and known[0] is phase:
        return known[1]
    arrays = _flatten(phase)
    for values in (
        arrays.sources,
        arrays.words,
        arrays.destination_starts,
        arrays.destination_tiles,
        arrays.destination_transfers,
        arrays.source_addresses,
        arrays.destination_addresses,
        arrays.paired,
    ):
        values.flags.writeable = False
    if len(_ARRAYS_CACHE) >= _ARRAYS_CACHE_SIZE:
        del _ARRAYS_CACHE[next(iter(_ARRAYS_CACHE))]
    _ARRAYS_CACHE[id(phase)] = (phase, arrays)
    return arrays


def _flatten(phase: ExchangePhase) -> PhaseArrays:
    transfers = phase.transfers
    count = len(transfers)
    sources, words, source_addresses = (
        np.fromiter(map(attrgetter(name), transfers), dtype=np.int64, count=count)
        for name in ("source", "words", "source_address")
    )
    destination_lists = list(map(attrgetter("destinations"), transfers))
    fanouts = np.fromiter(map(len, destination_lists), dtype=np.int64, count=count)
    starts = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(fanouts, out=starts[1:])
    total = int(starts[-1])
    entries = list(chain.from_iterable(destination_lists))
    if total and set(map(len, entries)) != {2}:
        raise ValueError("destinations must be (tile, address) pairs")
    flat = np.fromiter(chain.from_iterable(entries), dtype=np.int64, count=2 * total)
    tiles, addresses = flat[0::2].copy(), flat[1::2].copy()
    widths = list(map(attrgetter("width"), transfers))
    if widths.count(WORD32) == count:
        paired = np.zeros(count, dtype=bool)
    else:
        paired = np.fromiter((width == PAIRED64 for width in widths), dtype=bool, count=count)
    owners = np.repeat(np.arange(count, dtype=np.int64), fanouts)
    return PhaseArrays(sources, words, starts, tiles, owners, source_addresses, addresses, paired)


def words_sent(phase: ExchangePhase) -> IntArray:
    """Words each tile's send port must send in the phase (multicast counts once).

    Args:
        phase: the phase.

    Returns:
        An ``int64`` array of length ``phase.tile_count``.
    """
    arrays = phase_arrays(phase)
    return _weighted_count(arrays.sources, arrays.words, phase.tile_count)


def words_received(phase: ExchangePhase) -> IntArray:
    """Words each tile's receive port must receive in the phase.

    Args:
        phase: the phase.

    Returns:
        An ``int64`` array of length ``phase.tile_count``.
    """
    arrays = phase_arrays(phase)
    weights = arrays.words[arrays.destination_transfers]
    return _weighted_count(arrays.destination_tiles, weights, phase.tile_count)


def _weighted_count(tiles: IntArray, weights: IntArray, tile_count: int) -> IntArray:
    # bincount on int weights goes through float64: exact below 2**53 words, far above any phase.
    counts = np.bincount(tiles, weights=weights, minlength=tile_count)
    return counts.astype(np.int64)


def maximum_identical_destinations(phase: ExchangePhase) -> int:
    """The most transfers that write the same ``(tile, byte address)`` (1 for a normal phase).

    Args:
        phase: the phase.

    Returns:
        The largest count; 0 for an empty phase.
    """
    arrays = phase_arrays(phase)
    if arrays.destination_tiles.size == 0:
        return 0
    # Sorted by (tile, address): the longest run of equal pairs is the answer.
    tiles = arrays.destination_tiles
    addresses = arrays.destination_addresses
    order = np.lexsort((addresses, tiles))
    tiles, addresses = tiles[order], addresses[order]
    edges = np.flatnonzero((np.diff(tiles) != 0) | (np.diff(addresses) != 0)) + 1
    runs = np.diff(np.concatenate(([0], edges, [tiles.size])))
    return int(runs.max())


def split_multicasts(phase: ExchangePhase) -> ExchangePhase:
    """The phase with every multicast replaced by one unicast per destination, in order.

    Models an exchange without multicast (each destination needs its own send).

    Args:
        phase: the phase.

    Returns:
        A phase of unicast ``word32`` transfers (paired destinations are sent separately).
    """
    transfers = tuple(
        Transfer(t.source, t.source_address, (destination,), t.words)
        for t in phase.transfers
        for destination in t.destinations
    )
    return ExchangePhase(transfers, phase.tile_count)

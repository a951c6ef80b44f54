"""The exchange-phase model: transfers between tiles and their word-level schedules.

A phase is the set of transfers made between two syncs. Each tile has one send port and one
receive port, each moving one 32-bit word per cycle (facts §7.5). A transfer sends ``words``
words from one source tile to one or more destination tiles (multicast: every destination's
receive port listens to the source's send port in the same cycles, facts §7.4).

A schedule cuts each transfer into pieces; a piece occupies its source's send port for
``words`` consecutive cycles from ``send_cycle`` and each destination's receive port for the
same number of cycles starting at ``send_cycle + latency(source, destination)``.

What this model does not express (yet): pair send buses, 64-bit paired receives, SRAM-element
hazards, memory-order dependencies, and per-piece encoding overhead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ipu_stack.errors import ScheduleError
from ipu_stack.target.ipu21 import TILES, WORD_BYTES

IntArray = npt.NDArray[np.int64]

#: A vectorised latency model: ``(sources, destinations) -> cycles``, element by element.
#: The arrival of word ``j`` of a piece at a destination is ``send_cycle + latency + j``.
LatencyModel = Callable[[IntArray, IntArray], IntArray]


def zero_latency(sources: IntArray, destinations: IntArray) -> IntArray:
    """The latency-free model: every destination receives a word in the cycle it is sent."""
    return np.zeros(np.broadcast(sources, destinations).shape, dtype=np.int64)


#: Latency models by the name a :class:`PhaseSchedule` records in ``latency``.
LATENCY_MODELS: dict[str, LatencyModel] = {"none": zero_latency}


def latency_model(name: str) -> LatencyModel:
    """Look up a latency model by name.

    Args:
        name: a key of :data:`LATENCY_MODELS`.

    Returns:
        The vectorised latency function.

    Raises:
        ScheduleError: if the name is unknown.
    """
    try:
        return LATENCY_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(LATENCY_MODELS))
        raise ScheduleError(f"unknown latency model {name!r}; known: {known}") from None


@dataclass(frozen=True, slots=True)
class Transfer:
    """One source sending a contiguous block of words to one or more destinations.

    Attributes:
        source: physical tile id of the sender.
        source_address: byte address of the first word on the sender (word aligned).
        destinations: ``(tile, byte address)`` pairs; distinct tiles, none equal to ``source``.
        words: number of 32-bit words sent (positive).
    """

    source: int
    source_address: int
    destinations: tuple[tuple[int, int], ...]
    words: int

    @property
    def destination_tiles(self) -> tuple[int, ...]:
        """The destination tile ids, in order."""
        return tuple(tile for tile, _ in self.destinations)


@dataclass(frozen=True, slots=True)
class ExchangePhase:
    """The transfers of one exchange phase.

    Attributes:
        transfers: the transfers; their index is their identity in schedules and errors.
        tile_count: number of tiles; tile ids are ``0..tile_count-1``.
    """

    transfers: tuple[Transfer, ...]
    tile_count: int = TILES

    def validate(self) -> None:
        """Check that every transfer is well formed.

        Raises:
            ScheduleError: naming the first bad transfer's index and what is wrong with it.
        """
        if self.tile_count <= 0:
            raise ScheduleError(f"tile_count must be positive, got {self.tile_count}")
        for index, transfer in enumerate(self.transfers):
            _validate_transfer(index, transfer, self.tile_count)


def _validate_transfer(index: int, transfer: Transfer, tile_count: int) -> None:
    where = f"transfer {index}"
    if transfer.words <= 0:
        raise ScheduleError(f"{where}: words must be positive, got {transfer.words}")
    if not 0 <= transfer.source < tile_count:
        raise ScheduleError(f"{where}: source tile {transfer.source} outside 0..{tile_count - 1}")
    _check_address(where, "source address", transfer.source_address)
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
        _check_address(where, f"destination address on tile {tile}", address)


def _check_address(where: str, what: str, address: int) -> None:
    if address < 0 or address % WORD_BYTES:
        raise ScheduleError(f"{where}: {what} {address:#x} is not a word-aligned byte address")


@dataclass(frozen=True, slots=True)
class Piece:
    """A contiguous run of a transfer's words sent one per cycle.

    Attributes:
        send_cycle: cycle (from the start of the phase) the first word leaves the source.
        offset_words: index of the piece's first word within its transfer.
        words: number of words in the piece.
    """

    send_cycle: int
    offset_words: int
    words: int

    @property
    def send_end(self) -> int:
        """First cycle after the piece has left the source's send port."""
        return self.send_cycle + self.words


@dataclass(frozen=True, slots=True)
class PhaseSchedule:
    """A schedule of one exchange phase.

    Attributes:
        pieces: ``pieces[i]`` are the pieces of transfer ``i`` of the phase, in phase order.
        horizon: the cycle by which every piece has been sent and received (0 when empty).
        kind: which scheduler made it (``"greedy"``, ...).
        latency: name of the latency model (see :data:`LATENCY_MODELS`) used for arrivals.
    """

    pieces: tuple[tuple[Piece, ...], ...]
    horizon: int
    kind: str
    latency: str = "none"


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
    """

    sources: IntArray
    words: IntArray
    destination_starts: IntArray
    destination_tiles: IntArray
    destination_transfers: IntArray

    @property
    def fanouts(self) -> IntArray:
        """Number of destinations of each transfer."""
        return np.diff(self.destination_starts)


def phase_arrays(phase: ExchangePhase) -> PhaseArrays:
    """Flatten a phase into arrays for vectorised bounds, scheduling and checking.

    Args:
        phase: the phase (not validated here).

    Returns:
        The arrays; all ``int64``.
    """
    transfers = phase.transfers
    count = len(transfers)
    sources = np.fromiter((t.source for t in transfers), dtype=np.int64, count=count)
    words = np.fromiter((t.words for t in transfers), dtype=np.int64, count=count)
    fanouts = np.fromiter((len(t.destinations) for t in transfers), dtype=np.int64, count=count)
    starts = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(fanouts, out=starts[1:])
    tiles = np.fromiter(
        (tile for t in transfers for tile, _ in t.destinations),
        dtype=np.int64,
        count=int(starts[-1]),
    )
    owners = np.repeat(np.arange(count, dtype=np.int64), fanouts)
    return PhaseArrays(sources, words, starts, tiles, owners)


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

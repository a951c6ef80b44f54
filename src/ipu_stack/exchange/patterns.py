"""Synthetic exchange phases: collective patterns and random phases for tests and benchmarks.

Addresses are plausible but not planned: each transfer reads and writes its own word-aligned
slot above ``STANDARD_DATA_BASE``; nothing here checks tile memory capacity.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ipu_stack.exchange.model import PAIRED64, WORD32, ExchangePhase, Transfer
from ipu_stack.target.ipu21 import INTERLEAVED_BASE, STANDARD_DATA_BASE, TILES, WORD_BYTES
from ipu_stack.target.topology import PAIR_PARTNER_BIT

AllToAllOrder = Literal["round", "source", "shuffled"]


def all_to_all_phase(
    group_size: int,
    chunk_words: int,
    tile_count: int = TILES,
    order: AllToAllOrder = "round",
    seed: int = 0,
) -> ExchangePhase:
    """Round-robin all-to-all of equal chunks in disjoint groups of consecutive tiles.

    Every tile sends its own chunk to each other tile of its group as a separate unicast
    transfer: ``group_size - 1`` disjoint permutations per group. Endpoint bound:
    ``(group_size - 1) * chunk_words``.

    Args:
        group_size: tiles per group (>= 2); trailing tiles that do not fill a group stay idle.
        chunk_words: words per transfer.
        tile_count: tiles in the phase.
        order: transfer order: ``"round"`` (round ``r`` sends ``i -> i + r`` for all ``i``),
            ``"source"`` (source-major) or ``"shuffled"`` (random, from ``seed``).
        seed: shuffle seed for ``order="shuffled"``.

    Returns:
        The phase.
    """
    groups = tile_count // group_size
    chunk_bytes = chunk_words * WORD_BYTES
    pairs: list[tuple[int, int]] = []
    if order == "round":
        pairs = [
            (i, (i + shift) % group_size)
            for shift in range(1, group_size)
            for i in range(group_size)
        ]
    else:
        pairs = [(i, j) for i in range(group_size) for j in range(group_size) if i != j]
    transfers = [
        Transfer(
            source=base + i,
            source_address=STANDARD_DATA_BASE + j * chunk_bytes,
            destinations=((base + j, STANDARD_DATA_BASE + i * chunk_bytes),),
            words=chunk_words,
        )
        for base in range(0, groups * group_size, group_size)
        for i, j in pairs
    ]
    if order == "shuffled":
        permutation = np.random.default_rng(seed).permutation(len(transfers))
        transfers = [transfers[k] for k in permutation.tolist()]
    return ExchangePhase(tuple(transfers), tile_count)


def all_gather_phase(group_size: int, chunk_words: int, tile_count: int = TILES) -> ExchangePhase:
    """Multicast all-gather in disjoint groups: tile ``j`` multicasts its chunk to the others.

    The ``group_size`` multicasts of a group pairwise share a receive port when
    ``group_size >= 3``, so the conflict-clique bound is ``group_size * chunk_words`` while the
    endpoint bound is ``(group_size - 1) * chunk_words``.

    Args:
        group_size: tiles per group (>= 2).
        chunk_words: words each tile contributes.
        tile_count: tiles in the phase.

    Returns:
        The phase.
    """
    chunk_bytes = chunk_words * WORD_BYTES
    transfers = [
        Transfer(
            source=base + j,
            source_address=STANDARD_DATA_BASE + j * chunk_bytes,
            destinations=tuple(
                (base + k, STANDARD_DATA_BASE + j * chunk_bytes)
                for k in range(group_size)
                if k != j
            ),
            words=chunk_words,
        )
        for base in range(0, (tile_count // group_size) * group_size, group_size)
        for j in range(group_size)
    ]
    return ExchangePhase(tuple(transfers), tile_count)


def random_phase(
    rng: np.random.Generator,
    transfer_count: int,
    tile_count: int = TILES,
    max_fanout: int = 1,
    max_words: int = 256,
) -> ExchangePhase:
    """Random transfers: uniform source, 1..max_fanout distinct other destinations, 1..max_words.

    Args:
        rng: random generator.
        transfer_count: number of transfers.
        tile_count: tiles in the phase (>= 2).
        max_fanout: largest number of destinations of one transfer.
        max_words: largest transfer size in words.

    Returns:
        The phase.
    """
    transfers = []
    sources = rng.integers(0, tile_count, size=transfer_count).tolist()
    sizes = rng.integers(1, max_words + 1, size=transfer_count).tolist()
    fanouts = rng.integers(1, min(max_fanout, tile_count - 1) + 1, size=transfer_count).tolist()
    for index, (source, words, fanout) in enumerate(zip(sources, sizes, fanouts, strict=True)):
        # Draw from the other tile_count - 1 tiles, then skip over the source.
        picks = rng.choice(tile_count - 1, size=fanout, replace=False)
        tiles = [int(t) + (t >= source) for t in picks.tolist()]
        address = STANDARD_DATA_BASE + index * WORD_BYTES
        transfers.append(Transfer(source, address, tuple((tile, address) for tile in tiles), words))
    return ExchangePhase(tuple(transfers), tile_count)


# --- Benchmark generators: realistic addresses ---------------------------------------------------
#
# Each tile sends from its own buffers in standard memory and receives into buffers in the
# interleaved region, allocated one after another (8-byte aligned), so transfers never share
# bytes unless a generator makes them (dependencies) and sends never share an SRAM element with
# receives (no hazards) unless a generator asks for it.


class TileBuffers:
    """Bump allocators per tile: send buffers from ``STANDARD_DATA_BASE``, receive buffers from
    the interleaved region (or, with ``shared``, both from the same pointer, which puts sends and
    receives into common SRAM elements)."""

    def __init__(self, tile_count: int = TILES, shared: bool = False) -> None:
        self.send_next = [STANDARD_DATA_BASE] * tile_count
        self.receive_next = [STANDARD_DATA_BASE if shared else INTERLEAVED_BASE] * tile_count
        self.shared = shared

    def send_buffer(self, tile: int, words: int) -> int:
        """A new source buffer of ``words`` on ``tile``."""
        pointers = self.receive_next if self.shared else self.send_next
        address = pointers[tile]
        pointers[tile] = address + _aligned_bytes(words)
        return address

    def receive_buffer(self, tile: int, words: int) -> int:
        """A new destination buffer of ``words`` on ``tile``."""
        address = self.receive_next[tile]
        self.receive_next[tile] = address + _aligned_bytes(words)
        return address


def _aligned_bytes(words: int) -> int:
    return (words * WORD_BYTES + 7) // 8 * 8


def _unicast(buffers: TileBuffers, source: int, dest: int, words: int) -> Transfer:
    return _multicast(buffers, source, [dest], words)


def _multicast(
    buffers: TileBuffers, source: int, dests: list[int], words: int, width: str = WORD32
) -> Transfer:
    """``words`` from a new buffer on ``source`` to a new buffer on each of ``dests``."""
    return Transfer(
        source,
        buffers.send_buffer(source, words),
        tuple((d, buffers.receive_buffer(d, words)) for d in dests),
        words,
        width,
    )


def _other_tile(rng: np.random.Generator, tile_count: int, source: int) -> int:
    pick = int(rng.integers(0, tile_count - 1))
    return pick + (pick >= source)


def random_unicast_phase(
    rng: np.random.Generator,
    transfer_count: int,
    tile_count: int = TILES,
    words: tuple[int, int] = (16, 512),
    hot_tiles: int = 0,
    hot_share: float = 0.0,
) -> ExchangePhase:
    """Uniform random unicasts, optionally skewed toward a few hot receivers.

    Args:
        rng: random generator.
        transfer_count: number of transfers.
        tile_count: tiles.
        words: inclusive range of transfer sizes.
        hot_tiles: number of hot receivers (the first ones of a random permutation).
        hot_share: fraction of transfers aimed at a hot receiver.

    Returns:
        The phase.
    """
    buffers = TileBuffers(tile_count)
    hot = rng.permutation(tile_count)[:hot_tiles].tolist()
    transfers = []
    for _ in range(transfer_count):
        source = int(rng.integers(0, tile_count))
        if hot and rng.random() < hot_share:
            dest = int(hot[int(rng.integers(0, len(hot)))])
            if dest == source:
                dest = _other_tile(rng, tile_count, source)
        else:
            dest = _other_tile(rng, tile_count, source)
        size = int(rng.integers(words[0], words[1] + 1))
        transfers.append(_unicast(buffers, source, dest, size))
    return ExchangePhase(tuple(transfers), tile_count)


def permutation_sum_phase(
    rng: np.random.Generator,
    permutations: int,
    tile_count: int = TILES,
    lengths: tuple[int, ...] = (128, 192, 256),
    by_receiver: bool = False,
) -> ExchangePhase:
    """A sum of random derangements of the tiles (an all-to-all-like phase).

    Args:
        rng: random generator.
        permutations: number of permutations; every tile sends and receives that many chunks.
        tile_count: tiles.
        lengths: chunk sizes to draw from: one per permutation, or with ``by_receiver`` one per
            receiving tile (as a reduce-scatter, where a receiver's block fixes the size).
        by_receiver: size by receiver instead of by permutation.

    Returns:
        The phase.
    """
    buffers = TileBuffers(tile_count)
    receiver_size = rng.choice(np.asarray(lengths), size=tile_count)
    transfers = []
    for _ in range(permutations):
        size = int(rng.choice(np.asarray(lengths)))
        while True:
            perm = rng.permutation(tile_count)
            if not (perm == np.arange(tile_count)).any():
                break
        for source, dest in enumerate(perm.tolist()):
            words = int(receiver_size[dest]) if by_receiver else size
            transfers.append(_unicast(buffers, source, dest, words))
    order = rng.permutation(len(transfers)).tolist()
    return ExchangePhase(tuple(transfers[k] for k in order), tile_count)


def multicast_phase(
    rng: np.random.Generator,
    transfer_count: int,
    fanout: tuple[int, int] = (2, 16),
    tile_count: int = TILES,
    words: tuple[int, int] = (32, 384),
) -> ExchangePhase:
    """Random multicasts with fan-out drawn from ``fanout`` (inclusive).

    Returns:
        The phase.
    """
    buffers = TileBuffers(tile_count)
    transfers = []
    for _ in range(transfer_count):
        source = int(rng.integers(0, tile_count))
        count = int(rng.integers(fanout[0], fanout[1] + 1))
        picks = rng.choice(tile_count - 1, size=count, replace=False)
        size = int(rng.integers(words[0], words[1] + 1))
        dests = [int(t) + (t >= source) for t in picks.tolist()]
        transfers.append(_multicast(buffers, source, dests, size))
    return ExchangePhase(tuple(transfers), tile_count)


def multicast_groups_phase(
    group_size: int, chunk_words: int, tile_count: int = TILES, stride: int = 1
) -> ExchangePhase:
    """All-gather in groups, as a GEMM distributes an operand: each member multicasts its
    chunk to the other ``group_size - 1`` members. Members of a group are ``stride`` apart.

    Returns:
        The phase.
    """
    buffers = TileBuffers(tile_count)
    span = group_size * stride
    transfers = []
    for base in range(0, tile_count - span + 1, span):
        for offset in range(stride):
            members = [base + offset + k * stride for k in range(group_size)]
            for source in members:
                transfers.append(
                    Transfer(
                        source,
                        buffers.send_buffer(source, chunk_words),
                        tuple(
                            (d, buffers.receive_buffer(d, chunk_words))
                            for d in members
                            if d != source
                        ),
                        chunk_words,
                    )
                )
    return ExchangePhase(tuple(transfers), tile_count)


def paired_multicast_phase(
    rng: np.random.Generator,
    transfer_count: int,
    pair_fanout: tuple[int, int] = (1, 8),
    tile_count: int = TILES,
    words: tuple[int, int] = (64, 512),
    paired_share: float = 1.0,
) -> ExchangePhase:
    """Multicasts to complete physical pairs (``d`` and ``d ^ 2``), eligible for ``paired64``.

    A share ``paired_share`` of them is marked ``paired64`` (even length, 8-byte aligned); the
    rest stay ``word32``.

    Returns:
        The phase.
    """
    buffers = TileBuffers(tile_count)
    primaries = np.flatnonzero((np.arange(tile_count) & PAIR_PARTNER_BIT) == 0)
    primaries = primaries[(primaries ^ PAIR_PARTNER_BIT) < tile_count]
    transfers = []
    for _ in range(transfer_count):
        source = int(rng.integers(0, tile_count))
        count = int(rng.integers(pair_fanout[0], pair_fanout[1] + 1))
        own_pair = source & ~PAIR_PARTNER_BIT
        choices = primaries[primaries != own_pair]
        pairs = rng.choice(choices, size=count, replace=False).tolist()
        size = int(rng.integers(words[0] // 2, words[1] // 2 + 1)) * 2
        paired = rng.random() < paired_share
        dests = [tile for p in pairs for tile in (p, p ^ PAIR_PARTNER_BIT)]
        transfers.append(_multicast(buffers, source, dests, size, PAIRED64 if paired else WORD32))
    return ExchangePhase(tuple(transfers), tile_count)


def moved_operand_phase(
    rng: np.random.Generator,
    groups: int,
    group_pairs: int,
    pieces: int,
    words: int,
    tile_count: int = TILES,
) -> ExchangePhase:
    """A GEMM's moved operand, paired: ``groups`` groups of ``group_pairs`` whole physical pairs
    each receive ``pieces`` paired multicasts of ``words`` words, each sent by a tile of
    another group (no tile sends twice). A paired send holds its source partner's receive
    port, so a group whose member sends cannot receive meanwhile (the down projection of the
    SigLIP MLP, where the up projection's output tiles are also the receivers).

    Returns:
        The phase.
    """
    pairs = np.flatnonzero((np.arange(tile_count) & PAIR_PARTNER_BIT) == 0)
    pairs = pairs[(pairs ^ PAIR_PARTNER_BIT) < tile_count]
    if groups * group_pairs > pairs.size or groups < 2:
        raise ValueError(f"{groups} groups of {group_pairs} pairs do not fit {tile_count} tiles")
    chosen = rng.permutation(pairs)[: groups * group_pairs].reshape(groups, group_pairs)
    members = [[t for p in row.tolist() for t in (p, p ^ PAIR_PARTNER_BIT)] for row in chosen]
    idle = [list(rng.permutation(m)) for m in members]
    buffers = TileBuffers(tile_count)
    transfers = []
    size = words + words % 2
    for target in range(groups):
        for _ in range(pieces):
            donors = [g for g in range(groups) if g != target and idle[g]]
            if not donors:
                raise ValueError(f"{groups} groups cannot send {pieces} pieces each")
            source = int(idle[int(rng.choice(donors))].pop())
            transfers.append(_multicast(buffers, source, members[target], size, PAIRED64))
    return ExchangePhase(tuple(transfers), tile_count)


def with_forwarding(
    rng: np.random.Generator, phase: ExchangePhase, share: float = 0.1
) -> ExchangePhase:
    """Add memory-order dependencies: forwards of received data, and buffer reuse.

    For a share of the transfers, a new transfer is appended that reads what the original
    wrote on its first destination and sends it on to another tile (read after write); for as
    many others, a later transfer writes into an earlier transfer's source buffer (write after
    read). All of them keep the ``word32`` width.

    Returns:
        A new phase with the extra transfers after the originals.
    """
    tile_count = phase.tile_count
    extra: list[Transfer] = []
    originals = list(phase.transfers)
    count = int(len(originals) * share)
    picks = rng.choice(len(originals), size=min(2 * count, len(originals)), replace=False).tolist()
    receive_next: dict[int, int] = {}
    for k, index in enumerate(picks):
        transfer = originals[index]
        if k < count:
            tile, address = transfer.destinations[0]
            dest = _other_tile(rng, tile_count, tile)
            slot = receive_next.get(dest, 0xD0000)
            receive_next[dest] = slot + _aligned_bytes(transfer.words)
            extra.append(Transfer(tile, address, ((dest, slot),), transfer.words))
        else:
            source = _other_tile(rng, tile_count, transfer.source)
            extra.append(
                Transfer(
                    source,
                    0xE0000,
                    ((transfer.source, transfer.source_address),),
                    min(transfer.words, 512),
                )
            )
    return ExchangePhase(tuple(originals + extra), tile_count)


def mixed_groups_phase(
    rng: np.random.Generator,
    rounds: int,
    sizes: tuple[int, int] = (3, 17),
    tile_count: int = TILES,
    words: tuple[int, int] = (64, 256),
    extra_unicasts: int = 0,
) -> ExchangePhase:
    """Multicast all-gathers in groups of random size (fan-out ``sizes[0] - 1`` to
    ``sizes[1] - 1``), over ``rounds`` independent random groupings of the tiles (as several
    operands distributed at once), plus some random unicasts.

    Returns:
        The phase.
    """
    buffers = TileBuffers(tile_count)
    transfers: list[Transfer] = []
    for _ in range(rounds):
        order = rng.permutation(tile_count).tolist()
        chunk = int(rng.integers(words[0], words[1] + 1))
        position = 0
        while position + sizes[0] <= tile_count:
            size = min(int(rng.integers(sizes[0], sizes[1] + 1)), tile_count - position)
            members = order[position : position + size]
            position += size
            for source in members:
                transfers.append(
                    Transfer(
                        source,
                        buffers.send_buffer(source, chunk),
                        tuple(
                            (d, buffers.receive_buffer(d, chunk)) for d in members if d != source
                        ),
                        chunk,
                    )
                )
    for _ in range(extra_unicasts):
        source = int(rng.integers(0, tile_count))
        dest = _other_tile(rng, tile_count, source)
        size = int(rng.integers(words[0], words[1] + 1))
        transfers.append(_unicast(buffers, source, dest, size))
    return ExchangePhase(tuple(transfers), tile_count)

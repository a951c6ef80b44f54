"""Synthetic exchange phases: collective patterns and random phases for tests and benchmarks.

Addresses are plausible but not planned: each transfer reads and writes its own word-aligned
slot above ``STANDARD_DATA_BASE``; nothing here checks tile memory capacity.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ipu_stack.exchange.model import ExchangePhase, Transfer
from ipu_stack.target.ipu21 import STANDARD_DATA_BASE, TILES, WORD_BYTES

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

"""Multicasts reshaped so that the exchange can move them as 64-bit paired items.

Both tiles of a physical pair can receive the same data in the same cycles, at two words per
cycle (facts §7.4 [R], §8.5 [T]); the exchange lowering marks a multicast ``paired64`` when
its destinations come in complete pairs (``place/assign.py: paired_width``). The C600 map
puts logical tiles ``2p`` and ``2p + 1`` on one physical pair (facts §8.3), so a multicast
among the members of a group of whole pairs, such as the all-gather of a distributed GEMM
operand (each member sends its chunk to the others), misses exactly one tile of a complete
pair set: the sender's own partner. Such a transfer is split here into a multicast to the
complete pairs (pairable) and a unicast of the same bytes to the partner.
"""

from __future__ import annotations

from ipu_stack.low.program import ExchangeStep, LogicalTransfer, Step
from ipu_stack.target.ipu21 import PAIRED_MIN_WORDS
from ipu_stack.target.topology import LOGICAL_PAIR_BIT


def split_for_pairs(steps: list[Step]) -> int:
    """Split, in place, every multicast of ``steps`` that misses only its source's partner
    to be a multicast to complete pairs; returns how many were split."""
    split = 0
    for step in steps:
        if not isinstance(step, ExchangeStep):
            continue
        out: list[LogicalTransfer] = []
        for t in step.transfers:
            pieces = _split(t)
            split += len(pieces) - 1
            out.extend(pieces)
        step.transfers = out
    return split


def _split(t: LogicalTransfer) -> list[LogicalTransfer]:
    if t.words < PAIRED_MIN_WORDS or t.words % 2 or len(t.destinations) < 3:
        return [t]
    partner = t.source_tile ^ LOGICAL_PAIR_BIT
    tiles = {tile for tile, _ in t.destinations}
    if partner not in tiles:
        return [t]
    if any(tile != partner and tile ^ LOGICAL_PAIR_BIT not in tiles for tile in tiles):
        return [t]
    rest = tuple(d for d in t.destinations if d[0] != partner)
    alone = tuple(d for d in t.destinations if d[0] == partner)
    return [
        LogicalTransfer(t.source_tile, t.source, rest, t.words),
        LogicalTransfer(t.source_tile, t.source, alone, t.words),
    ]

"""Tile-mapping screening: relabel logical tiles onto physical tiles by exchange load.

The two tiles of a physical pair (``phys`` and ``phys ^ 2``) share one outgoing exchange bus
(facts §20 item 4; the reference counts outgoing load per pair bus), and the C600 map puts
logical tiles ``2p`` and ``2p + 1`` on one pair. When neighbouring logical tiles are both
heavy senders, a relabelling that pairs a heavy sender with a light one lowers the busiest
bus. Each candidate is scored per exchange step by its bottleneck (busiest pair bus, busiest
receiver) plus the per-phase overhead; a candidate is accepted only if it lowers the total.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from ipu_stack.low.program import ExchangeStep, LowProgram
from ipu_stack.target.ipu21 import EXCHANGE_PHASE_OVERHEAD, PAIRED_MIN_WORDS, TILES
from ipu_stack.target.topology import logical_to_physical


@dataclass(frozen=True, slots=True)
class MappingChoice:
    physical: np.ndarray  # logical tile -> physical tile id
    candidates: int
    baseline_cycles: int
    candidate_cycles: int
    baseline_pressure: int
    candidate_pressure: int
    mapped: bool


@dataclass(frozen=True, slots=True)
class _StepLoad:
    """One exchange step's transfers as arrays (logical tiles)."""

    sources: np.ndarray
    words: np.ndarray
    owners: np.ndarray  # per destination entry: its transfer
    destinations: np.ndarray
    pairable: np.ndarray  # per transfer: a word count a paired move allows (facts §8.5)
    #: the destination entries of pairable transfers: their transfer, their tile, and the
    #: sorted ``owner * n + destination`` keys (only these can pair)
    pair_owners: np.ndarray
    pair_destinations: np.ndarray
    keys: np.ndarray


def _loads(program: LowProgram) -> list[_StepLoad]:
    """Per exchange step: its transfers' sources, words and destinations."""
    out = []
    n = program.tile_count
    for step in program.steps:
        if not isinstance(step, ExchangeStep):
            continue
        transfers = step.transfers
        count = len(transfers)
        sources = np.fromiter(map(attrgetter("source_tile"), transfers), np.int64, count)
        words = np.fromiter(map(attrgetter("words"), transfers), np.int64, count)
        lists = list(map(attrgetter("destinations"), transfers))
        fanouts = np.fromiter(map(len, lists), np.int64, count)
        destinations = np.asarray([tile for d in lists for tile, _ in d], dtype=np.int64)
        owners = np.repeat(np.arange(count, dtype=np.int64), fanouts)
        pairable = (words >= PAIRED_MIN_WORDS) & (words % 2 == 0) & (fanouts >= 2)
        candidates = pairable[owners]
        pair_owners, pair_destinations = owners[candidates], destinations[candidates]
        keys = np.sort(pair_owners * n + pair_destinations)
        out.append(_StepLoad(sources, words, owners, destinations, pairable, pair_owners,
                             pair_destinations, keys))  # fmt: skip
    return out


def _paired(load: _StepLoad, partner: np.ndarray, n: int) -> np.ndarray:
    """Per transfer: whether its destinations come in complete physical pairs under the
    mapping whose logical partner of each tile is ``partner`` (-1: none)."""
    if load.keys.size == 0:
        return load.pairable
    mate = partner[load.pair_destinations]
    key = load.pair_owners * n + mate
    pos = np.minimum(np.searchsorted(load.keys, key), load.keys.size - 1)
    found = (mate >= 0) & (load.keys[pos] == key)
    missing = np.bincount(load.pair_owners[~found], minlength=load.words.size)
    return load.pairable & (missing == 0)


def _summed(tiles: np.ndarray, words: np.ndarray, n: int) -> np.ndarray:
    """Words per tile ``0..n-1``, summed in int64."""
    return np.bincount(tiles, weights=words, minlength=n).astype(np.int64)


def _score(loads: list[_StepLoad], physical: np.ndarray) -> tuple[int, int]:
    """(cycles, pressure): summed per-step bottlenecks; pressure counts pair buses only.

    A multicast whose destinations form complete physical pairs under this mapping moves as
    64-bit items (``place/assign.py: paired_width``): half the cycles on its source's bus and
    on each receiver, and it holds the source partner's receive port as long.
    """
    n = physical.size
    bus = physical & ~2  # both tiles of a pair map to one bus id
    logical = np.full(TILES, -1, dtype=np.int64)
    logical[physical] = np.arange(n)
    partner = logical[physical ^ 2]
    cycles = pressure = 0
    for load in loads:
        paired = _paired(load, partner, n)
        cost = np.where(paired, load.words // 2, load.words)
        sent = _summed(load.sources, cost, n)
        recv = _summed(load.destinations, cost[load.owners], n)
        mates = partner[load.sources[paired]]
        held = mates >= 0
        recv += _summed(mates[held], cost[paired][held], n)
        bus_load = np.bincount(bus, weights=sent, minlength=TILES)
        worst_bus = int(bus_load.max()) if bus_load.size else 0
        cycles += EXCHANGE_PHASE_OVERHEAD + max(worst_bus, int(recv.max(initial=0)))
        pressure += worst_bus
    return cycles, pressure


def candidate_orders(n: int) -> list[np.ndarray]:
    """Relabellings of ``n`` logical tiles onto the first ``n`` slots of the C600 order."""
    base = np.arange(n)
    orders = []
    for stride in (2, 3, 4, 8, 16, 23, 32, 46, 64):
        if stride >= n:
            continue
        # column-major walk over rows of ``stride``: spreads neighbours across pairs
        orders.append(np.argsort((base % stride) * n + base // stride, kind="stable"))
    half = -(-n // 2)
    orders.append(np.argsort(np.where(base < half, 2 * base, 2 * (base - half) + 1), kind="stable"))
    orders.append(base[::-1].copy())
    return orders


def screen_mappings(program: LowProgram) -> MappingChoice:
    """The best of the baseline C600 map and its relabellings, by exchange bottleneck."""
    n = program.tile_count
    baseline = np.asarray(logical_to_physical(np.arange(n)), dtype=np.int64)
    loads = _loads(program)
    base_cycles, base_pressure = _score(loads, baseline)
    best = (base_cycles, base_pressure, baseline)
    orders = candidate_orders(n) if loads else []
    slots = np.asarray(logical_to_physical(np.arange(n)), dtype=np.int64)
    for order in orders:
        physical = slots[order]
        cycles, pressure = _score(loads, physical)
        if (cycles, pressure) < best[:2]:
            best = (cycles, pressure, physical)
    mapped = best[2] is not baseline
    return MappingChoice(best[2], len(orders), base_cycles, best[0], base_pressure, best[1], mapped)

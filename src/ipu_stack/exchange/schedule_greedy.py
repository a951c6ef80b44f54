"""A fast, deterministic, non-preemptive list scheduler with backfilling.

Each transfer becomes one piece. Transfers are taken in priority order (heaviest endpoint load
first, then larger transfers) and each is placed at the earliest cycle at which its source's send
port and every destination's receive port are free for ``words`` consecutive cycles. Ports keep
sorted lists of busy intervals, so a later transfer can fill a gap that an earlier placement left
(backfilling) instead of only appending after the last busy cycle.

Ties: transfers with equal priority all have the same length, which makes their placement an
edge-colouring problem, where greedy placement in input order can need up to twice the bound
(a source-major all-to-all among 3 tiles takes 3 chunks instead of 2). So within each tie class
multicasts come first (by index), then the unicasts in "matching waves": repeatedly a maximum
bipartite matching (Hopcroft-Karp, scipy) of the remaining ones, each wave by index. A sum of
disjoint permutations (an all-to-all) then schedules at the endpoint bound in any input order.

Limits (what this scheduler does not do or check): latency (it schedules with the ``"none"``
model), preemption, receiver-subset splitting of multicasts, pair send buses, 64-bit paired
receives, SRAM-element hazards and memory-order dependencies. Earliest-fit placement is not a
dense (work-conserving) schedule, so the ``2 * LB`` guarantee of dense unicast schedules
(`exchange-scheduling.md` §1.4) is not promised; measured ratios are in the tests.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np
import numpy.typing as npt
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

from ipu_stack.exchange.model import (
    ExchangePhase,
    PhaseArrays,
    PhaseSchedule,
    Piece,
    phase_arrays,
)

KIND = "greedy"
#: Tie classes up to this many unicasts are matched in Python; larger ones by scipy.
SMALL_MATCHING_EDGES = 256
#: Largest size * degree of a tie class ordered by matching waves (bounds the time spent).
WAVE_WORK_BUDGET = 20_000_000
IntArray = npt.NDArray[np.int64]


def schedule_phase(phase: ExchangePhase) -> PhaseSchedule:
    """Schedule a phase with one piece per transfer by earliest-fit list scheduling.

    Args:
        phase: the phase; it is validated first.

    Returns:
        A schedule of kind ``"greedy"`` with latency model ``"none"``.

    Raises:
        ScheduleError: if the phase is malformed.
    """
    phase.validate()
    count = len(phase.transfers)
    if count == 0:
        return PhaseSchedule(pieces=(), horizon=0, kind=KIND)
    tile_count = phase.tile_count
    arrays = phase_arrays(phase)
    sources = arrays.sources
    words = arrays.words
    send_load = np.bincount(sources, weights=words, minlength=tile_count)
    receive_load = np.bincount(
        arrays.destination_tiles, weights=words[arrays.destination_transfers], minlength=tile_count
    )
    heaviest = send_load[sources].copy()
    np.maximum.at(heaviest, arrays.destination_transfers, receive_load[arrays.destination_tiles])
    order = _priority_order(arrays, heaviest.astype(np.int64), tile_count)

    # Ports 0..tile_count-1 are send ports, tile_count.. are receive ports. Each port holds
    # sorted, disjoint, non-touching busy intervals [starts[k], ends[k]).
    starts: list[list[int]] = [[] for _ in range(2 * tile_count)]
    ends: list[list[int]] = [[] for _ in range(2 * tile_count)]
    send_cycles = [0] * count
    word_list = words.tolist()
    source_list = sources.tolist()
    destination_starts = arrays.destination_starts.tolist()
    receive_ports = (arrays.destination_tiles + tile_count).tolist()

    for index in order.tolist():
        length = word_list[index]
        ports = [source_list[index]]
        ports += receive_ports[destination_starts[index] : destination_starts[index + 1]]
        start = _earliest_common_fit(ports, starts, ends, length)
        for port in ports:
            _occupy(starts[port], ends[port], start, start + length)
        send_cycles[index] = start

    pieces = tuple(
        (Piece(send_cycle=cycle, offset_words=0, words=length),)
        for cycle, length in zip(send_cycles, word_list, strict=True)
    )
    horizon = max(cycle + length for cycle, length in zip(send_cycles, word_list, strict=True))
    return PhaseSchedule(pieces=pieces, horizon=horizon, kind=KIND)


def _priority_order(arrays: PhaseArrays, heaviest: IntArray, tile_count: int) -> IntArray:
    """Transfer indices by priority; tie classes multicast first, then unicast matching waves."""
    count = arrays.words.size
    fanouts = arrays.fanouts
    is_unicast = fanouts == 1
    # lexsort: last key is primary. Heaviest endpoint first, then larger, multicast before
    # unicast, then lower index.
    order = np.lexsort((np.arange(count), is_unicast, -arrays.words, -heaviest))
    key_heaviest = heaviest[order]
    key_words = arrays.words[order]
    boundary = np.flatnonzero(
        (key_heaviest[1:] != key_heaviest[:-1]) | (key_words[1:] != key_words[:-1])
    )
    run_starts = np.concatenate(([0], boundary + 1))
    run_ends = np.concatenate((boundary + 1, [count]))
    first_destination = arrays.destination_tiles[
        np.minimum(arrays.destination_starts[:-1], arrays.destination_tiles.size - 1)
    ]
    # Only classes whose unicasts share a port need waves; find them without a Python loop.
    run_of = np.repeat(np.arange(run_starts.size), run_ends - run_starts)
    unicast_positions = np.flatnonzero(is_unicast[order])
    needs_waves = np.zeros(run_starts.size, dtype=bool)
    for tiles in (arrays.sources, first_destination):
        keys = np.sort(run_of[unicast_positions] * tile_count + tiles[order[unicast_positions]])
        needs_waves[keys[1:][keys[1:] == keys[:-1]] // tile_count] = True
    multicasts_per_run = np.bincount(run_of, weights=~is_unicast[order], minlength=run_starts.size)
    for run in np.flatnonzero(needs_waves).tolist():
        start = int(run_starts[run] + multicasts_per_run[run])  # unicasts close the run
        end = int(run_ends[run])
        unicast = order[start:end]
        sources = arrays.sources[unicast]
        destinations = first_destination[unicast]
        degree = max(int(np.bincount(sources).max()), int(np.bincount(destinations).max()))
        # A star (one port shared by all) has only singleton waves: index order already. Waves
        # cost about size * degree; past the budget keep index order rather than stall.
        if degree == unicast.size or unicast.size * degree > WAVE_WORK_BUDGET:
            continue
        order[start:end] = _matching_waves(unicast, sources, destinations, tile_count)
    return order


def _matching_waves(
    members: IntArray, sources: IntArray, destinations: IntArray, tile_count: int
) -> IntArray:
    """Unicast transfers (sorted by index) reordered as successive maximum matchings."""
    waves: list[IntArray] = []
    while members.size:
        if np.unique(sources).size == sources.size and np.unique(destinations).size == sources.size:
            waves.append(members)  # already a matching: one wave
            break
        chosen = np.zeros(members.size, dtype=bool)
        if members.size <= SMALL_MATCHING_EDGES:
            chosen[_small_maximum_matching(sources.tolist(), destinations.tolist())] = True
        else:
            graph = csr_matrix(
                (np.ones(members.size, dtype=np.int8), (sources, destinations)),
                shape=(tile_count, tile_count),
            )
            matched_column = maximum_bipartite_matching(graph, perm_type="column")
            hits = np.flatnonzero(matched_column[sources] == destinations)
            # Parallel transfers share (source, destination): take the lowest index of each.
            _, first = np.unique(sources[hits], return_index=True)
            chosen[hits[first]] = True
        waves.append(members[chosen])
        members, sources, destinations = (
            members[~chosen],
            sources[~chosen],
            destinations[~chosen],
        )
    return np.concatenate(waves) if waves else members


def _small_maximum_matching(sources: list[int], destinations: list[int]) -> list[int]:
    """Positions of the edges of a maximum matching, by augmenting paths (Kuhn's algorithm).

    For the small tie classes, where scipy's per-call overhead dominates. Among parallel edges
    the lowest position is used, and sources are tried in order of their first edge.
    """
    adjacency: dict[int, list[tuple[int, int]]] = {}
    for position, (source, destination) in enumerate(zip(sources, destinations, strict=True)):
        adjacency.setdefault(source, []).append((destination, position))
    owner: dict[int, tuple[int, int]] = {}  # destination -> (source, edge position)

    def augment(source: int, visited: set[int]) -> bool:
        for destination, position in adjacency[source]:
            if destination in visited:
                continue
            visited.add(destination)
            holder = owner.get(destination)
            if holder is None or augment(holder[0], visited):
                owner[destination] = (source, position)
                return True
        return False

    for source in adjacency:
        augment(source, set())
    return sorted(position for _, position in owner.values())


def _earliest_common_fit(
    ports: list[int], starts: list[list[int]], ends: list[list[int]], length: int
) -> int:
    """The earliest cycle at which every port is free for ``length`` cycles.

    Each step moves ``time`` to the first gap of ``length`` cycles at or after it on the next
    port; when every port has accepted ``time`` in a row, it fits everywhere. (The per-port gap
    search is inlined: it is the scheduler's innermost loop.)
    """
    time = 0
    settled = 0  # ports in a row that accepted ``time`` unchanged
    position = 0
    port_count = len(ports)
    while settled < port_count:
        port_starts = starts[ports[position]]
        port_ends = ends[ports[position]]
        fit = time
        k = bisect_right(port_starts, fit) - 1
        if k >= 0 and port_ends[k] > fit:
            fit = port_ends[k]
        k += 1
        interval_count = len(port_starts)
        while k < interval_count and port_starts[k] < fit + length:
            fit = port_ends[k]
            k += 1
        if fit != time:
            time = fit
            settled = 1  # this port accepts the new time
        else:
            settled += 1
        position = position + 1 if position + 1 < port_count else 0
    return time


def _occupy(starts: list[int], ends: list[int], begin: int, end: int) -> None:
    """Mark ``[begin, end)`` busy (it must be free), merging with touching neighbours."""
    k = bisect_right(starts, begin)
    joins_previous = k > 0 and ends[k - 1] == begin
    joins_next = k < len(starts) and starts[k] == end
    if joins_previous and joins_next:
        ends[k - 1] = ends[k]
        del starts[k]
        del ends[k]
    elif joins_previous:
        ends[k - 1] = end
    elif joins_next:
        starts[k] = begin
    else:
        starts.insert(k, begin)
        ends.insert(k, end)

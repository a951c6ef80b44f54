"""Non-preemptive constructive schedulers on a compiled phase (one piece per transfer).

Two schedulers, both deterministic:

- :func:`dense_greedy` (event driven, `exchange-scheduling.md` §3.2): senders are visited in
  time order; when a sender's port is free it starts, among its ready transfers that fit now,
  the one whose busiest resource has the most remaining work (the critical port first, as in
  Sunflow); if none fits it sleeps until the earliest cycle one could. The schedule is dense
  on send ports: a sender never idles while one of its ready transfers could start.
- :func:`earliest_fit` (list scheduling with backfilling): transfers in a priority order
  (busiest resource first, longer first; equal-length unicasts in matching waves, so sums of
  permutations colour like a bipartite edge colouring) each go to the earliest cycle at which
  all their resources are free, filling gaps left earlier.

Both respect every rule compiled into the problem: ports, reserved partners, latency offsets,
SRAM-element resources and dependency delays (a transfer is placed only after all its
predecessors). Limits: no preemption and no receiver-subset splitting of multicasts; neither
is optimal (the improvement stage is :mod:`ipu_stack.exchange.schedule_lns`).
"""

from __future__ import annotations

import heapq
import time as time_module
from itertools import pairwise

import numpy as np
import numpy.typing as npt
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_flow

from ipu_stack.exchange.busy_calendar import Calendar
from ipu_stack.exchange.constraints import ELEMENT, RECEIVE, SEND, ResourceProblem

IntArray = npt.NDArray[np.int64]
#: Tie classes up to this many unicasts are matched in Python; larger ones by scipy.
SMALL_MATCHING_EDGES = 256
#: Largest size * degree of a tie class ordered by matching waves (bounds the time spent).
WAVE_WORK_BUDGET = 20_000_000
#: Work units the dense greedy charges per event (its use checks cost one unit each).
POP_WORK = 4
#: Matchings recomputed per wave to move SRAM-hazard pairs into different waves.
HAZARD_RETRIES = 16
#: Most waves a whole-phase unicast decomposition may have (one matching per wave).
MAX_GLOBAL_WAVES = 64


_Successors = tuple[list[list[tuple[int, int]]], list[int]]


#: The per-transfer lists most recently built, by problem identity (a problem is immutable and
#: kept alive by its entry, so its id cannot be reused): one phase's list schedulers (priority
#: order, matching waves, preemptive orders, dense greedy) all read the same lists.
_LISTS_CACHE: dict[int, tuple[ResourceProblem, list[list[tuple[int, int]]], _Successors]] = {}
_LISTS_CACHE_SIZE = 2


def _lists(problem: ResourceProblem) -> tuple[list[list[tuple[int, int]]], _Successors]:
    known = _LISTS_CACHE.get(id(problem))
    if known is not None and known[0] is problem:
        return known[1], known[2]
    pairs = list(zip(problem.use_resources.tolist(), problem.use_offsets.tolist(), strict=True))
    bounds = problem.use_starts.tolist()
    uses = [pairs[begin:end] for begin, end in pairwise(bounds)]
    successors: list[list[tuple[int, int]]] = [[] for _ in range(problem.count)]
    waiting = [0] * problem.count
    for b, a, d in zip(
        problem.dependency_before.tolist(),
        problem.dependency_after.tolist(),
        problem.dependency_delay.tolist(),
        strict=True,
    ):
        successors[b].append((a, d))
        waiting[a] += 1
    if len(_LISTS_CACHE) >= _LISTS_CACHE_SIZE:
        del _LISTS_CACHE[next(iter(_LISTS_CACHE))]
    _LISTS_CACHE[id(problem)] = (problem, uses, (successors, waiting))
    return uses, (successors, waiting)


def transfer_uses(problem: ResourceProblem) -> list[list[tuple[int, int]]]:
    """Per transfer, its ``(resource, offset)`` uses (shared lists: do not modify them)."""
    return _lists(problem)[0]


def dependency_successors(
    problem: ResourceProblem,
) -> tuple[list[list[tuple[int, int]]], list[int]]:
    """Per transfer, its ``(successor, delay)`` dependencies (shared lists: do not modify
    them); and its number of predecessors (a fresh list the caller may count down)."""
    successors, waiting = _lists(problem)[1]
    return successors, list(waiting)


def dense_greedy(
    problem: ResourceProblem, max_work: int | None = None, deadline: float | None = None
) -> IntArray | None:
    """Event-driven dense greedy (see the module docstring).

    Args:
        problem: the compiled phase.
        max_work: give up (return None) after this many resource-use checks; a deterministic
            stand-in for a time limit.
        deadline: also give up at this ``time.perf_counter()`` value (a guard for machines
            slower than the work calibration; when it fires the result depends on the clock).

    Returns:
        The send cycle of every transfer, or None if it gave up.
    """
    work = 0
    pops = 0
    limit = max_work if max_work is not None else 1 << 62
    count = problem.count
    uses = transfer_uses(problem)
    durations = problem.durations.tolist()
    sources = problem.arrays.sources.tolist()
    remaining = problem.resource_loads().tolist()
    successors, waiting = dependency_successors(problem)
    release = problem.release.tolist()
    calendar = Calendar(problem.resource_count)
    start = [-1] * count

    pending: dict[int, list[int]] = {}
    for i in range(count):
        pending.setdefault(sources[i], []).append(i)
    clock: dict[int, int] = dict.fromkeys(pending, 0)
    heap = [(0, -remaining[s], s) for s in pending]
    heapq.heapify(heap)
    asleep: set[int] = set()

    while heap:
        time, _, sender = heapq.heappop(heap)
        work += POP_WORK
        if time < clock[sender]:
            continue  # stale entry
        queue = pending[sender]
        best = -1
        best_key: tuple[int, int, int] | None = None
        next_time = -1
        for i in queue:
            if waiting[i]:
                continue
            length = durations[i]
            work += len(uses[i])
            fit = calendar.earliest(uses[i], length, max(time, release[i]))
            if fit == time:
                key = (-max(remaining[r] for r, _ in uses[i]), -length, i)
                if best_key is None or key < best_key:
                    best, best_key = i, key
            elif next_time < 0 or fit < next_time:
                next_time = fit
        if work > limit:
            return None
        pops += 1
        if deadline is not None and pops % 64 == 0 and time_module.perf_counter() > deadline:
            return None
        if best >= 0:
            length = durations[best]
            calendar.occupy_uses(uses[best], time, length)
            for r, _ in uses[best]:
                remaining[r] -= length
            start[best] = time
            queue.remove(best)
            for successor, delay in successors[best]:
                release[successor] = max(release[successor], time + delay)
                waiting[successor] -= 1
                if not waiting[successor]:
                    owner = sources[successor]
                    if owner in asleep:
                        asleep.discard(owner)
                        clock[owner] = max(clock[owner], release[successor])
                        heapq.heappush(heap, (clock[owner], -remaining[owner], owner))
            if queue:
                # The send port is busy for ``length`` cycles; retry when it frees.
                clock[sender] = calendar.first_free(sender, time, 1)
                heapq.heappush(heap, (clock[sender], -remaining[sender], sender))
        elif next_time >= 0:
            clock[sender] = next_time
            heapq.heappush(heap, (next_time, -remaining[sender], sender))
        elif queue:
            asleep.add(sender)  # every pending transfer waits for a predecessor
    if any(s < 0 for s in start):  # pragma: no cover - dependencies always go forward
        raise AssertionError("dense greedy left transfers unscheduled")
    return np.asarray(start, dtype=np.int64)


def earliest_fit(problem: ResourceProblem, order: IntArray | None = None) -> IntArray:
    """List scheduling with backfilling in a priority order (see the module docstring).

    Args:
        problem: the compiled phase.
        order: transfer order; :func:`priority_order` when omitted. A transfer whose
            predecessors are not placed yet waits for them.

    Returns:
        The send cycle of every transfer.
    """
    count = problem.count
    order = priority_order(problem) if order is None else order
    uses = transfer_uses(problem)
    durations = problem.durations.tolist()
    successors, waiting = dependency_successors(problem)
    release = problem.release.tolist()
    calendar = Calendar(problem.resource_count)
    start = [0] * count
    earliest = calendar.earliest
    occupy = calendar.occupy_uses
    if not problem.dependency_before.size and _is_permutation(order, count):
        # Nothing waits: transfers come off the ready queue in exactly the given order.
        for i in order.tolist():
            length = durations[i]
            time = earliest(uses[i], length, release[i])
            occupy(uses[i], time, length)
            start[i] = time
        return np.asarray(start, dtype=np.int64)
    rank = np.empty(count, dtype=np.int64)
    rank[order] = np.arange(count)
    ranks = rank.tolist()
    ready = [(ranks[i], i) for i in range(count) if not waiting[i]]
    heapq.heapify(ready)
    while ready:
        _, i = heapq.heappop(ready)
        length = durations[i]
        time = earliest(uses[i], length, release[i])
        occupy(uses[i], time, length)
        start[i] = time
        for successor, delay in successors[i]:
            release[successor] = max(release[successor], time + delay)
            waiting[successor] -= 1
            if not waiting[successor]:
                heapq.heappush(ready, (ranks[successor], successor))
    return np.asarray(start, dtype=np.int64)


def _is_permutation(order: IntArray, count: int) -> bool:
    """Whether ``order`` lists every transfer ``0..count-1`` exactly once."""
    return bool(order.size == count and np.array_equal(np.sort(order), np.arange(count)))


def wave_order(problem: ResourceProblem) -> IntArray | None:
    """Multicasts by static priority, then all unicasts in regularised matching waves.

    One decomposition over every unicast regardless of length: each wave lets every busiest
    port send or receive once, longest first within a wave. Suits phases that are sums of
    permutations with unequal chunks (reduce-scatters), where equal-priority classes are too
    small to form waves. Returns None when the decomposition would be too costly.
    """
    arrays = problem.arrays
    is_unicast = arrays.fanouts == 1
    unicast = np.flatnonzero(is_unicast)
    if unicast.size == 0:
        return None
    sources = arrays.sources[unicast]
    destinations = arrays.destination_tiles[arrays.destination_starts[unicast]]
    degree = max(int(np.bincount(sources).max()), int(np.bincount(destinations).max()))
    if unicast.size * degree > WAVE_WORK_BUDGET or degree > MAX_GLOBAL_WAVES:
        return None
    tile_count = int(max(sources.max(), destinations.max())) + 1
    # Longest first inside each wave: sort members by length before the decomposition, whose
    # waves keep member order.
    by_length = np.lexsort((unicast, -problem.durations[unicast]))
    waves = _matching_waves(
        unicast[by_length],
        sources[by_length],
        destinations[by_length],
        tile_count,
        _element_roles(problem),
    )
    priority = _heaviest_first(problem)
    multicast_first = priority[~is_unicast[priority]]
    return np.concatenate((multicast_first, waves)).astype(np.int64)


def _heaviest(problem: ResourceProblem) -> IntArray:
    """Per transfer, the total load of its busiest resource."""
    load = problem.resource_loads()
    heaviest = np.zeros(problem.count, dtype=np.int64)
    np.maximum.at(heaviest, problem.use_transfers, load[problem.use_resources])
    return heaviest


def _heaviest_first(problem: ResourceProblem, heaviest: IntArray | None = None) -> IntArray:
    """Busiest resource first, then longer, multicast before unicast, then index."""
    heaviest = _heaviest(problem) if heaviest is None else heaviest
    is_unicast = problem.arrays.fanouts == 1
    return np.lexsort((np.arange(problem.count), is_unicast, -problem.durations, -heaviest))


def priority_order(problem: ResourceProblem) -> IntArray:
    """Transfers by static priority: busiest resource first, then longer, multicast first.

    Within a class of equal priority and length, unicasts are ordered in matching waves
    (repeated maximum bipartite matchings of sender and receiver ports, Hopcroft-Karp), so a
    sum of disjoint permutations is placed colour by colour.
    """
    count = problem.count
    heaviest = _heaviest(problem)
    arrays = problem.arrays
    is_unicast = arrays.fanouts == 1
    durations = problem.durations
    order = _heaviest_first(problem, heaviest)
    key_heaviest = heaviest[order]
    key_length = durations[order]
    boundary = np.flatnonzero(
        (key_heaviest[1:] != key_heaviest[:-1]) | (key_length[1:] != key_length[:-1])
    )
    run_starts = np.concatenate(([0], boundary + 1))
    run_ends = np.concatenate((boundary + 1, [count]))
    tile_count = int(arrays.sources.max(initial=0)) + 1
    if arrays.destination_tiles.size:
        tile_count = max(tile_count, int(arrays.destination_tiles.max()) + 1)
    first_destination = arrays.destination_tiles[
        np.minimum(arrays.destination_starts[:-1], max(arrays.destination_tiles.size - 1, 0))
    ]
    run_of = np.repeat(np.arange(run_starts.size), run_ends - run_starts)
    unicast_positions = np.flatnonzero(is_unicast[order])
    needs_waves = np.zeros(run_starts.size, dtype=bool)
    for tiles in (arrays.sources, first_destination):
        keys = np.sort(run_of[unicast_positions] * tile_count + tiles[order[unicast_positions]])
        needs_waves[keys[1:][keys[1:] == keys[:-1]] // tile_count] = True
    multicasts_per_run = np.bincount(run_of, weights=~is_unicast[order], minlength=run_starts.size)
    hazards = _element_roles(problem)
    for run in np.flatnonzero(needs_waves).tolist():
        begin = int(run_starts[run] + multicasts_per_run[run])  # unicasts close the run
        end = int(run_ends[run])
        unicast = order[begin:end]
        sources = arrays.sources[unicast]
        destinations = first_destination[unicast]
        degree = max(int(np.bincount(sources).max()), int(np.bincount(destinations).max()))
        if degree == unicast.size or unicast.size * degree > WAVE_WORK_BUDGET:
            continue
        order[begin:end] = _matching_waves(unicast, sources, destinations, tile_count, hazards)
    return order


def _element_roles(problem: ResourceProblem) -> dict[int, tuple[list[int], list[int]]]:
    """Per transfer with SRAM-element resources: (elements it reads, elements it writes)."""
    roles: dict[int, tuple[list[int], list[int]]] = {}
    rows = np.flatnonzero(problem.resource_kinds[problem.use_resources] == ELEMENT)
    for row in rows.tolist():
        i = int(problem.use_transfers[row])
        resource = int(problem.use_resources[row])
        reads, writes = roles.setdefault(i, ([], []))
        is_read = int(problem.resource_tiles[resource]) == int(problem.arrays.sources[i])
        (reads if is_read else writes).append(resource)
    return roles


def _wave_conflicts(
    wave: list[int], members: list[int], hazards: dict[int, tuple[list[int], list[int]]]
) -> list[int]:
    """Positions in ``wave`` that read an SRAM element another member of the wave writes."""
    written: set[int] = set()
    for position in wave:
        roles = hazards.get(members[position])
        if roles:
            written.update(roles[1])
    return [
        position
        for position in wave
        if (roles := hazards.get(members[position])) and not written.isdisjoint(roles[0])
    ]


def _unit_matching(
    rows: npt.NDArray[np.integer], cols: npt.NDArray[np.integer], size: int
) -> IntArray:
    """A maximum matching of the bipartite graph with edges ``rows[i] -> cols[i]`` (both
    sides ``size`` vertices): the column matched to each row, -1 where none.

    Solved as a unit-capacity maximum flow by Dinic's algorithm (scipy), O(E sqrt V). Not
    scipy's ``maximum_bipartite_matching``: its Hopcroft-Karp search never marks dead ends
    (scipy issue 26147) and takes exponential time on some layered graphs, e.g. 40 s to
    minutes on a 1,458-vertex, 15-regular phase of the batch-2 So400m tower (Dinic: 9 ms).
    """
    source, sink = 2 * size, 2 * size + 1
    heads = np.concatenate((np.full(size, source), rows, size + np.arange(size)))
    tails = np.concatenate((np.arange(size), size + cols, np.full(size, sink)))
    network = csr_matrix(
        (np.ones(heads.size, dtype=np.int32), (heads, tails)), shape=(2 * size + 2,) * 2
    )
    flow = maximum_flow(network, source, sink, method="dinic").flow.tocoo()
    used = (flow.data > 0) & (flow.row < size) & (flow.col >= size) & (flow.col < 2 * size)
    matched = np.full(size, -1, dtype=np.int64)
    matched[flow.row[used]] = flow.col[used] - size
    return matched


def _matching_waves(
    members: IntArray,
    sources: IntArray,
    destinations: IntArray,
    tile_count: int,
    hazards: dict[int, tuple[list[int], list[int]]] | None = None,
) -> IntArray:
    """Unicast transfers reordered as ``degree`` matchings, each covering every busiest port.

    The sender-receiver multigraph is padded with dummy edges to a ``degree``-regular bipartite
    multigraph, which splits into ``degree`` perfect matchings (König); each matching's real
    edges form one wave, in member order. Plain maximum matchings could leave a busiest port out
    of a wave and so need more waves than its degree. When a wave would send from an SRAM
    element that the same wave receives into (a hazard), the reading edges are banned for that
    wave and the matching recomputed, a few times, so that hazard pairs land in different waves.
    """
    hazards = hazards or {}
    left_ids, left = np.unique(sources, return_inverse=True)
    right_ids, right = np.unique(destinations, return_inverse=True)
    size = max(left_ids.size, right_ids.size)
    left_degree = np.bincount(left, minlength=size)
    right_degree = np.bincount(right, minlength=size)
    degree = int(max(left_degree.max(), right_degree.max()))
    # Distinct edges, each with its real members (lowest position last, for pop()) and dummies.
    key = left.astype(np.int64) * size + right
    edge_keys, edge_of = np.unique(key, return_inverse=True)
    edge_list = edge_of.tolist()
    # The real members of each edge in position order (``by_edge[first[e]:stop[e]]``); the
    # next wave takes edge e's member at ``following[e]``.
    by_edge = np.argsort(edge_of, kind="stable")
    per_edge = np.bincount(edge_of, minlength=edge_keys.size)
    following = np.zeros(edge_keys.size, dtype=np.int64)
    np.cumsum(per_edge[:-1], out=following[1:])
    stop = following + per_edge
    extra: dict[int, int] = {}
    left_deficit = (degree - left_degree).tolist()
    right_deficit = (degree - right_degree).tolist()
    j = 0
    for i in range(size):
        while left_deficit[i] > 0:
            while right_deficit[j] == 0:
                j += 1
            take = min(left_deficit[i], right_deficit[j])
            extra[i * size + j] = extra.get(i * size + j, 0) + take
            left_deficit[i] -= take
            right_deficit[j] -= take
    extra_keys = np.fromiter(extra, dtype=np.int64, count=len(extra))
    # Sorted distinct keys of both (np.union1d hashes first: slower on these sizes).
    all_keys = np.sort(np.concatenate((edge_keys, extra_keys)))
    all_keys = all_keys[np.concatenate(([True], all_keys[1:] != all_keys[:-1]))]
    count = np.zeros(all_keys.size, dtype=np.int64)
    real_index: IntArray = np.asarray(np.searchsorted(all_keys, edge_keys), dtype=np.int64)
    count[real_index] = per_edge
    # Keys of ``extra`` are distinct: one vectorised add per key.
    count[np.searchsorted(all_keys, extra_keys)] += np.fromiter(
        extra.values(), dtype=np.int64, count=len(extra)
    )
    real_of = np.full(all_keys.size, -1, dtype=np.int64)
    real_of[real_index] = np.arange(edge_keys.size)
    real_index_list = real_index.tolist()
    member_list = members.tolist()
    rows_all = all_keys // size
    cols_all = (all_keys % size).astype(np.int32)

    def match(banned: npt.NDArray[np.bool_]) -> tuple[IntArray, bool]:
        active = np.flatnonzero((count > 0) & ~banned)
        matched = _unit_matching(rows_all[active], cols_all[active], size)
        ok = bool((matched >= 0).all())
        rows = np.flatnonzero(matched >= 0)
        return np.searchsorted(all_keys, rows * size + matched[rows]), ok

    waves: list[IntArray] = []
    no_ban = np.zeros(all_keys.size, dtype=bool)
    for _ in range(degree):
        chosen, _ok = match(no_ban)
        if hazards:
            banned = no_ban.copy()
            for _attempt in range(HAZARD_RETRIES):
                wave = by_edge[following[_with_members(real_of[chosen], following, stop)]].tolist()
                clashes = _wave_conflicts(wave, member_list, hazards)
                if not clashes:
                    break
                trial = banned.copy()
                for position in clashes:
                    trial[real_index_list[edge_list[position]]] = True
                retry, ok = match(trial)
                if not ok:
                    trial = banned.copy()
                    trial[real_index_list[edge_list[clashes[0]]]] = True
                    retry, ok = match(trial)
                    if not ok:
                        break  # no perfect matching avoids it: keep the clash
                banned, chosen = trial, retry
        # Matched edges are distinct: one vectorised decrement.
        count[chosen] -= 1
        edges = _with_members(real_of[chosen], following, stop)
        waves.append(np.sort(by_edge[following[edges]]))
        following[edges] += 1
    taken = np.zeros(members.size, dtype=bool)
    for wave_positions in waves:
        taken[wave_positions] = True
    waves.append(np.flatnonzero(~taken))
    return members[np.concatenate(waves)]


def _with_members(edges: IntArray, following: IntArray, stop: IntArray) -> IntArray:
    """The real edges (``>= 0``) among ``edges`` that still have a member to place, in order."""
    edges = edges[edges >= 0]
    return edges[following[edges] < stop[edges]]


def _small_maximum_matching(sources: list[int], destinations: list[int]) -> list[int]:
    """Positions of the edges of a maximum matching, by augmenting paths (Kuhn's algorithm)."""
    adjacency: dict[int, list[tuple[int, int]]] = {}
    for position, (source, destination) in enumerate(zip(sources, destinations, strict=True)):
        adjacency.setdefault(source, []).append((destination, position))
    owner: dict[int, tuple[int, int]] = {}

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


def horizon_of(problem: ResourceProblem, starts: IntArray) -> int:
    """The horizon of send cycles ``starts``: the latest end of any use."""
    if problem.count == 0:
        return 0
    return int((starts + problem.completion).max())


__all__ = [
    "RECEIVE",
    "SEND",
    "dense_greedy",
    "earliest_fit",
    "horizon_of",
    "priority_order",
]

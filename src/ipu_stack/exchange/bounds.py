"""Lower bounds on the horizon of an exchange phase under an :class:`ExchangeModel`.

See `shared/docs/exchange-scheduling.md` §3.1. Every bound here is a true lower bound under the
same rules the schedulers and the verifier use (latency included), so ``horizon / bound`` is an
honest optimality gap. Comparing a schedule with the strongest bound tells whether to improve
the scheduler (a gap) or the mapping and layout (a tight bound).

Bounds (names as reported in ``tight_bound``):

- ``endpoint``: the busiest send or receive port, in cycles, counting 64-bit items for paired
  transfers and the reserved source partner.
- ``latency-endpoint``: each port (and each hazard-shared SRAM element) as a single machine with
  release times (latency, dependency heads) and tails (latency to the slowest destination,
  dependency chains after it), solved exactly for preemption by Jackson's rule.
- ``dependency-chain``: the longest memory-dependency path, with latency.
- ``conflict-clique``: a set of transfers that pairwise share a resource must run in some order,
  each pair separated by at least its duration corrected by the latency difference on the
  shared resource; the cheapest order is found exactly (Held-Karp, :mod:`paths`) for small
  sets and, within a work budget, for the big cliques with the best relaxed values; otherwise
  bounded below by an assignment relaxation.
- ``sram-element``: the busiest hazard-shared SRAM element.

Under preemption (a transfer cut into pieces, :mod:`ipu_stack.exchange.schedule_pieces`) the
port, element, Jackson and chain bounds still hold: Jackson's rule is already the preemptive
single-machine optimum, and a dependent transfer still starts after its predecessor's last
piece. The clique bound does not: its pairwise "one goes first" argument fails when pieces of
two transfers interleave and their latencies on the shared port differ. Those that hold are
:data:`PREEMPTIVE_BOUND_NAMES`.
"""

from __future__ import annotations

import heapq
from itertools import pairwise

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment

from ipu_stack.exchange.constraints import ELEMENT, ResourceProblem, compile_phase
from ipu_stack.exchange.model import IPU21_MODEL, ExchangeModel, ExchangePhase
from ipu_stack.exchange.paths import EXACT_LIMIT, exact_path
from ipu_stack.exchange.paths import exact_work as exact_work_units

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

ENDPOINT = "endpoint"
LATENCY_ENDPOINT = "latency-endpoint"
DEPENDENCY_CHAIN = "dependency-chain"
CONFLICT_CLIQUE = "conflict-clique"
SRAM_ELEMENT = "sram-element"
#: Order of preference when bounds tie: the simplest explanation wins.
BOUND_NAMES = (ENDPOINT, SRAM_ELEMENT, LATENCY_ENDPOINT, DEPENDENCY_CHAIN, CONFLICT_CLIQUE)
#: The bounds that hold for schedules with preempted transfers (see the module docstring).
PREEMPTIVE_BOUND_NAMES = (ENDPOINT, SRAM_ELEMENT, LATENCY_ENDPOINT, DEPENDENCY_CHAIN)
#: Cliques up to this size get the exact best order (Held-Karp), larger ones the relaxation.
EXACT_ORDER_LIMIT = 7
#: Most members of a clique whose order is bounded (its separations are an n x n x resources
#: array): a bigger clique keeps its longest members, a sub-clique and so a sound bound.
CLIQUE_MEMBER_LIMIT = 256


def endpoint_lower_bound(phase: ExchangePhase, model: ExchangeModel = IPU21_MODEL) -> int:
    """The port bound: the most cycles any send or receive port must be busy.

    Args:
        phase: the phase.
        model: the rules (paired widths and full duplex change port loads).

    Returns:
        The bound in cycles; 0 for an empty phase.
    """
    if not phase.transfers:
        return 0
    return _port_bound(compile_phase(phase, model))


def strongest_lower_bound(
    phase: ExchangePhase, model: ExchangeModel = IPU21_MODEL, preemptive: bool = False
) -> tuple[int, str]:
    """The strongest available lower bound and the name of the bound that attains it.

    Args:
        phase: the phase (validated first).
        model: the rules.
        preemptive: only bounds that also hold when transfers are cut into pieces
            (:data:`PREEMPTIVE_BOUND_NAMES`); by default, bounds on one-piece schedules.

    Returns:
        ``(value, name)``; ties go to the first name in :data:`BOUND_NAMES`.
    """
    phase.validate()
    if not phase.transfers:
        return 0, ENDPOINT
    names = PREEMPTIVE_BOUND_NAMES if preemptive else None
    return strongest(lower_bounds(compile_phase(phase, model)), names)


def conflict_lower_bound(phase: ExchangePhase, model: ExchangeModel = IPU21_MODEL) -> int:
    """The conflict-clique bound of a phase (at least the endpoint bound).

    Args:
        phase: the phase.
        model: the rules.

    Returns:
        The bound in cycles.
    """
    if not phase.transfers:
        return 0
    problem = compile_phase(phase, model)
    return max(_port_bound(problem), clique_bound(problem))


def strongest(bounds: dict[str, int], names: tuple[str, ...] | None = None) -> tuple[int, str]:
    """The largest of named bounds, ties broken by :data:`BOUND_NAMES` order.

    Args:
        bounds: ``{name: cycles}``.
        names: only these bounds count (for example :data:`PREEMPTIVE_BOUND_NAMES`); all of
            ``bounds`` when omitted.
    """
    counted = {k: v for k, v in bounds.items() if names is None or k in names}
    best = max(counted.values())
    order = BOUND_NAMES + tuple(k for k in counted if k not in BOUND_NAMES)
    name = next(name for name in order if counted.get(name) == best)
    return best, name


def lower_bounds(problem: ResourceProblem, exact_work: int = 0) -> dict[str, int]:
    """Every bound of a compiled phase, by name.

    Args:
        problem: the compiled phase.
        exact_work: work units (see :func:`ipu_stack.exchange.paths.exact_work`) the clique
            bound may spend on exact orders of cliques too big for the default exact limit.

    Returns:
        ``{name: cycles}`` for every name in :data:`BOUND_NAMES`.
    """
    if problem.count == 0:
        return dict.fromkeys(BOUND_NAMES, 0)
    heads = problem.heads()
    tails = problem.tails()
    load = problem.resource_loads()
    element = problem.resource_kinds == ELEMENT
    bounds = {
        ENDPOINT: int(load[~element].max(initial=0)),
        SRAM_ELEMENT: int(load[element].max(initial=0)),
        DEPENDENCY_CHAIN: int((heads + tails).max()),
    }
    floor = max(bounds[ENDPOINT], bounds[SRAM_ELEMENT])
    bounds[LATENCY_ENDPOINT] = max(bounds[ENDPOINT], jackson_bound(problem, heads, tails, floor))
    bounds[CONFLICT_CLIQUE] = max(
        bounds[ENDPOINT], clique_bound(problem, heads, tails, exact_work=exact_work)
    )
    return bounds


def _port_bound(problem: ResourceProblem) -> int:
    load = problem.resource_loads()
    return int(load[problem.resource_kinds != ELEMENT].max(initial=0))


def jackson_bound(
    problem: ResourceProblem, heads: IntArray, tails: IntArray, floor: int = 0
) -> int:
    """Best single-resource bound with release times and tails (preemptive relaxation).

    On resource ``r`` the use of transfer ``i`` is released at ``head_i + offset`` and must be
    followed by ``tail_i - offset - duration`` cycles before the horizon. Jackson's preemptive
    rule (largest tail first) gives the optimal makespan of that one-machine relaxation.

    Args:
        problem: the compiled phase.
        heads: earliest starts (see :meth:`ResourceProblem.heads`).
        tails: start-to-horizon minima (see :meth:`ResourceProblem.tails`).
        floor: resources that cannot beat this value are skipped.

    Returns:
        The best bound found (0 if no resource beats ``floor``).
    """
    transfers = problem.use_transfers
    release = heads[transfers] + problem.use_offsets
    duration = problem.durations[transfers]
    tail = tails[transfers] - problem.use_offsets - duration
    resources = problem.use_resources
    size = problem.resource_count
    load = np.bincount(resources, weights=duration, minlength=size)
    most = np.full(size, -(2**62), dtype=np.int64)
    np.maximum.at(most, resources, release)
    best_tail = np.full(size, -(2**62), dtype=np.int64)
    np.maximum.at(best_tail, resources, tail)
    optimistic = load + most + best_tail
    candidates = np.flatnonzero(optimistic > floor)
    if candidates.size == 0:
        return 0
    # The loop below returns the largest Jackson value over the candidates (a resource is left
    # out only when an upper bound on its value cannot beat the best so far). Cheap brackets
    # ``low <= value <= high`` of every candidate, computed at once, give most values exactly
    # (``low == high``) and a high start for ``best``, so few resources need Jackson's rule.
    chosen = np.zeros(size, dtype=bool)
    chosen[candidates] = True
    rows = np.flatnonzero(chosen[resources])
    low, high = _brackets(resources[rows], release[rows], duration[rows], tail[rows], size)
    high = np.minimum(high, optimistic.astype(np.int64))
    order = np.argsort(resources, kind="stable")
    bounds_of = np.searchsorted(resources[order], np.arange(size + 1))
    best = max(0, int(low[candidates].max()))
    for resource in candidates[np.argsort(-optimistic[candidates])].tolist():
        if high[resource] <= best:
            continue
        if low[resource] == high[resource]:
            best = int(high[resource])
            continue
        rows = order[bounds_of[resource] : bounds_of[resource + 1]]
        best = max(
            best,
            _jackson(release[rows].tolist(), duration[rows].tolist(), tail[rows].tolist()),
        )
    return best


def _brackets(
    resources: IntArray, release: IntArray, duration: IntArray, tail: IntArray, size: int
) -> tuple[IntArray, IntArray]:
    """Per resource, bounds ``low <= J <= high`` on its one-machine value ``J`` (the optimal
    ``max(C_j + q_j)`` with release times and tails, preemption allowed).

    ``low``: any set ``S`` of the resource's jobs needs ``min r + sum p + min q`` (Carlier),
    taken for the sets of the latest-released jobs, of the longest-tailed jobs, and of single
    jobs. ``high``: the value of one feasible schedule, the jobs in release order without idle
    time beyond the releases (``C_j = P_j + max_{i <= j} (r_i - P_{i-1})`` with ``P`` the
    running sum of durations). Resources without jobs get ``low = high = -2**62``.
    """
    low = np.full(size, -(2**62), dtype=np.int64)
    high = low.copy()
    if resources.size == 0:
        return low, high
    np.maximum.at(low, resources, release + duration + tail)
    by_release = _segment_order(resources, release)
    by_tail = _segment_order(resources, tail)
    for order, key, other in ((by_release, release, tail), (by_tail, tail, release)):
        # Jobs with the largest key first: each prefix is a set with min key = the current one.
        order = order[::-1]
        segment, first = _segments(resources[order])
        work = _running_sums(duration[order], first)
        smallest_other = _running(other[order], segment, np.minimum)
        _segment_max(low, resources[order], first, key[order] + work + smallest_other)
    segment, first = _segments(resources[by_release])
    work = _running_sums(duration[by_release], first)
    before = work - duration[by_release]
    completion = work + _running(release[by_release] - before, segment, np.maximum)
    _segment_max(high, resources[by_release], first, completion + tail[by_release])
    return low, high


def _segment_order(resources: IntArray, key: IntArray) -> IntArray:
    """Positions sorted by resource, then by ``key`` (stable)."""
    return np.lexsort((key, resources))


def _segments(sorted_resources: IntArray) -> tuple[IntArray, IntArray]:
    """For resource ids in runs: the run index of every position, and each run's first one."""
    starts = np.ones(sorted_resources.size, dtype=bool)
    starts[1:] = sorted_resources[1:] != sorted_resources[:-1]
    first = np.flatnonzero(starts)
    return np.cumsum(starts) - 1, first


def _running_sums(values: IntArray, first: IntArray) -> IntArray:
    """Running sums that restart at every run start."""
    total = np.cumsum(values)
    before = np.zeros(first.size, dtype=np.int64)
    before[1:] = total[first[1:] - 1]
    counts = np.diff(np.append(first, values.size))
    return total - np.repeat(before, counts)


def _running(values: IntArray, segment: IntArray, ufunc: np.ufunc) -> IntArray:
    """Running minimum or maximum that restarts at every run (runs numbered ``segment``).

    Each run is lifted by a multiple of the value range so that earlier runs never win:
    above the later ones for a minimum, below them for a maximum (exact in int64: ranges
    and run counts of a phase stay far below ``2**31``)."""
    span = int(values.max()) - int(values.min()) + 1
    lift = segment * span if ufunc is np.maximum else -segment * span
    return ufunc.accumulate(values + lift) - lift


def _segment_max(
    out: IntArray, sorted_resources: IntArray, first: IntArray, values: IntArray
) -> None:
    """``out[r] = max(out[r], max of values over r's run)``."""
    ids = sorted_resources[first]
    out[ids] = np.maximum(out[ids], np.maximum.reduceat(values, first))


def _jackson(release: list[int], duration: list[int], tail: list[int]) -> int:
    """Optimal ``max(C_j + q_j)`` on one machine with preemption (Jackson's rule)."""
    jobs = sorted(zip(release, duration, tail, strict=True))
    ready: list[tuple[int, int]] = []  # (-tail, remaining)
    time = jobs[0][0]
    best = 0
    k = 0
    n = len(jobs)
    while k < n or ready:
        if not ready and time < jobs[k][0]:
            time = jobs[k][0]
        while k < n and jobs[k][0] <= time:
            heapq.heappush(ready, (-jobs[k][2], jobs[k][1]))
            k += 1
        negative_tail, remaining = heapq.heappop(ready)
        next_release = jobs[k][0] if k < n else None
        if next_release is not None and time + remaining > next_release:
            heapq.heappush(ready, (negative_tail, remaining - (next_release - time)))
            time = next_release
        else:
            time += remaining
            best = max(best, time - negative_tail)
    return best


def clique_bound(
    problem: ResourceProblem,
    heads: IntArray | None = None,
    tails: IntArray | None = None,
    max_seeds: int = 48,
    max_candidates: int = 512,
    exact_work: int = 0,
) -> int:
    """The conflict-clique bound (0 when no clique beats a single resource).

    Cliques are grown greedily from the transfers of the busiest resources (the exact maximum
    clique is NP-hard; any clique gives a sound bound). For unicast-only phases without
    paired widths or SRAM resources the conflict graph's cliques are single ports, so the
    search is skipped.

    Args:
        problem: the compiled phase.
        heads: earliest starts (computed when omitted).
        tails: start-to-horizon minima (computed when omitted).
        max_seeds: number of busiest resources whose transfer sets seed the greedy.
        max_candidates: candidates examined per seed.
        exact_work: work units for exact orders of cliques above :data:`EXACT_ORDER_LIMIT`
            members (up to :data:`ipu_stack.exchange.paths.EXACT_LIMIT`), spent on the cliques
            with the best relaxed bounds first; the relaxation stands in for the others.

    Returns:
        The best clique bound found, in cycles.
    """
    if problem.count == 0:
        return 0
    uses_per_transfer = np.diff(problem.use_starts)
    if int(uses_per_transfer.max()) <= 2:
        return 0  # every transfer uses one send and one receive resource: cliques are stars
    heads = problem.heads() if heads is None else heads
    tails = problem.tails() if tails is None else tails
    resources = problem.use_resources
    order = np.argsort(resources, kind="stable")
    bounds_of = np.searchsorted(resources[order], np.arange(problem.resource_count + 1))
    load = problem.resource_loads()
    seeds = np.argsort(-load, kind="stable")[:max_seeds].tolist()
    flat = resources.tolist()
    resource_sets = [frozenset(flat[a:b]) for a, b in pairwise(problem.use_starts.tolist())]
    durations = problem.durations
    best = 0
    seen: set[frozenset[int]] = set()
    relaxed: list[tuple[int, tuple[FloatArray, FloatArray, FloatArray]]] = []
    for seed in seeds:
        members = problem.use_transfers[order[bounds_of[seed] : bounds_of[seed + 1]]].tolist()
        if len(members) < 1:
            continue
        in_clique = set(members)
        candidates: set[int] = set()
        for resource in resource_sets[members[0]]:
            rows = order[bounds_of[resource] : bounds_of[resource + 1]]
            candidates.update(problem.use_transfers[rows].tolist())
        candidates -= in_clique
        ranked = sorted(candidates, key=lambda i: (-int(durations[i]), i))[:max_candidates]
        for candidate in ranked:
            mine = resource_sets[candidate]
            if all(not mine.isdisjoint(resource_sets[m]) for m in members):
                members.append(candidate)
                in_clique.add(candidate)
        key = frozenset(members)
        if len(members) < 2 or key in seen:
            continue
        seen.add(key)
        if len(members) > CLIQUE_MEMBER_LIMIT:  # any sub-clique is still a sound bound
            members = sorted(members, key=lambda i: (-int(durations[i]), i))[:CLIQUE_MEMBER_LIMIT]
        ordered = _ordered_clique(problem, members, heads, tails)
        if ordered is not None:
            value, exact, order_inputs = ordered
            best = max(best, value)
            if not exact and order_inputs[1].size <= EXACT_LIMIT:
                relaxed.append((value, order_inputs))
    # Exact orders for the big cliques with the best relaxed values, while the work lasts.
    for _, (separation, head, tail) in sorted(relaxed, key=lambda r: -r[0]):
        cost = exact_work_units(head.size)
        if cost > exact_work:
            continue
        exact_work -= cost
        best = max(best, int(np.ceil(exact_path(separation, head, tail)[0] - 1e-9)))
    return best


def clique_separations(problem: ResourceProblem, members: list[int]) -> npt.NDArray[np.float64]:
    """``S[i, j]``: least ``x_j - x_i`` when ``i`` goes first (NaN when no usable shared resource).

    On a shared resource ``p`` the two windows are disjoint exactly when
    ``x_j - x_i`` lies outside ``(-s_ji(p), s_ij(p))`` with ``s_ij(p) = D_i + o_ip - o_jp``.
    The forbidden intervals that contain 0 unite to ``(-max s_ji, max s_ij)``, which splits the
    pair's schedules into "i first" and "j first" (other resources only add constraints).
    """
    n = len(members)
    chosen = np.asarray(members, dtype=np.int64)
    first = problem.use_starts[chosen]
    counts = problem.use_starts[chosen + 1] - first
    owner = np.repeat(np.arange(n), counts)
    rows = np.arange(owner.size) + np.repeat(first - np.cumsum(counts) + counts, counts)
    used = problem.use_resources[rows]
    all_resources = np.sort(used)
    all_resources = all_resources[np.concatenate(([True], all_resources[1:] != all_resources[:-1]))]
    # A transfer uses a resource once: one offset per (member, resource).
    columns = np.searchsorted(all_resources, used)
    present = np.zeros((n, all_resources.size), dtype=bool)
    present[owner, columns] = True
    shared = present.sum(axis=0) >= 2
    # Members with the same offsets on the same shared resources and the same duration have
    # the same row and column of S (a multicast clique's members often come from a few
    # sources): S is computed among the distinct members and expanded.
    absent = np.iinfo(np.int64).min
    rows_of = np.full((n, all_resources.size + 1), absent, dtype=np.int64)
    rows_of[owner, columns] = problem.use_offsets[rows]
    rows_of[:, :-1][:, ~shared] = absent
    rows_of[:, -1] = problem.durations[chosen]
    distinct, inverse = np.unique(rows_of, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    kept = distinct[:, :-1][:, shared]
    offsets = np.where(kept == absent, np.nan, kept).astype(np.float32)
    duration = distinct[:, -1].astype(np.float32)
    # With d = o_ip - o_jp: s_ij = D_i + d and s_ji = D_j - d, both positive when
    # -D_i < d < D_j. Offsets and durations are integers far below 2**24, exact in float32.
    with np.errstate(invalid="ignore"):
        difference = offsets[:, None, :] - offsets[None, :, :]
        valid = difference > -duration[:, None, None]
        valid &= difference < duration[None, :, None]
    # the largest valid difference per pair (-inf for none)
    largest = np.max(difference, axis=2, initial=-np.inf, where=valid)
    best = duration[:, None].astype(np.float64) + largest
    best[~np.isfinite(best)] = np.nan
    best = best[np.ix_(inverse, inverse)]
    np.fill_diagonal(best, np.nan)
    return best


def _ordered_clique(
    problem: ResourceProblem, members: list[int], heads: IntArray, tails: IntArray
) -> tuple[int, bool, tuple[FloatArray, FloatArray, FloatArray]] | None:
    """The clique's order bound: ``(value, exact, (separation, head, tail))``, or None.

    Members without a usable shared resource with some other member are dropped first (a
    smaller clique is still sound). Up to :data:`EXACT_ORDER_LIMIT` members the cheapest order
    is exact; above, the assignment relaxation bounds it.
    """
    # A pair's separation depends on the two members alone: computed once, then members are
    # dropped by taking sub-matrices.
    full = clique_separations(problem, members)
    missing = np.isnan(full)
    np.fill_diagonal(missing, False)
    # Unusable pairs per member among those kept (counts updated as members are dropped).
    unusable = missing.sum(axis=0) + missing.sum(axis=1)
    kept = np.ones(len(members), dtype=bool)
    while True:
        counts = np.where(kept, unusable, -1)
        top = int(np.argmax(counts))  # the first kept member with the most unusable pairs
        if counts[top] <= 0:
            break
        # Drop it: its pairs no longer count for the others.
        kept[top] = False
        unusable -= missing[top]
        unusable -= missing[:, top]
        if int(kept.sum()) < 2:
            return None
    keep = np.flatnonzero(kept)
    separation = full[np.ix_(keep, keep)]
    members = [members[k] for k in keep.tolist()]
    head = heads[members].astype(np.float64)
    tail = tails[members].astype(np.float64)
    inputs = (separation, head, tail)
    if len(members) <= EXACT_ORDER_LIMIT:
        return int(np.ceil(exact_path(*inputs)[0] - 1e-9)), True, inputs
    return int(np.ceil(_assignment_bound(*inputs) - 1e-9)), False, inputs


def _assignment_bound(
    separation: FloatArray,
    head: FloatArray,
    tail: FloatArray,
) -> float:
    """Assignment relaxation of the cheapest order (a Hamiltonian path closed by a dummy)."""
    n = head.size
    big = 1e12
    cost = np.full((n + 1, n + 1), big)
    cost[:n, :n] = np.where(np.isnan(separation), big, separation)
    cost[n, :n] = head  # dummy -> first
    cost[:n, n] = tail  # last -> dummy
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].sum())

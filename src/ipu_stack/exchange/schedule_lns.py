"""Improvement stage: large-neighbourhood search with CP-SAT (OR-Tools), seeded by the greedy.

`exchange-scheduling.md` §3.3. Each step frees a *neighbourhood* of transfers, keeps every other
transfer where it is, and asks CP-SAT for the best placement of the freed ones: one start
variable per transfer, one interval per resource use (shifted by its latency offset), a
``NoOverlap`` per touched resource including the fixed transfers' busy intervals, the
dependency delays, and the makespan to minimise, hinted with the incumbent.

Neighbourhoods, most promising first:

1. *Components*: transfers that share no resource (directly or through others) and have no
   dependency between them never interact, so a connected component whose end is above the
   target is re-solved whole when it is small (GEMM phases are many small groups).
2. *Tails*: in a large component, the transfers that end last (all those above the target
   plus their latest neighbours), re-solved as a window; the window grows when a solve finds
   nothing.

The makespan variable is floored at the target (the strongest lower bound), so a neighbourhood
solved down to the bound stops at once. Each CP-SAT call runs single-threaded with a
deterministic time limit, so the result does not depend on machine load; a wall-clock guard
stops the loop at the deadline (a run cut short by the guard may differ from an unhurried one).
The stage's deterministic budget pays for each call's model as well (per call and per interval:
CP-SAT's deterministic clock does not count building, loading and presolving it); a window
whose model would cost more than what is left is halved, down to :data:`SMALLEST_WINDOW`.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from ipu_stack.exchange.constraints import ResourceProblem

IntArray = npt.NDArray[np.int64]
KIND = "cp-sat-lns"
#: Components up to this many transfers are re-solved whole.
COMPONENT_LIMIT = 700
#: First and largest tail window (transfers).
TAIL_START = 200
TAIL_LIMIT = 1600
#: Fewest transfers a window is shrunk to when the model of a larger one costs too much.
SMALLEST_WINDOW = 25
#: OR-Tools deterministic seconds per wall-clock second on a 2-core machine (measured: a
#: single-worker CP-SAT call runs 7-10 wall seconds per deterministic second). The stage's
#: deterministic budget is the wall budget times this, so it usually ends before the guard.
DETERMINISTIC_PER_SECOND = 0.1
#: Deterministic seconds of a component's first CP-SAT call, doubled on every revisit.
FIRST_SLICE = 0.004
LAST_SLICE = 0.1
#: Deterministic seconds charged per call, and per interval of its model, for what CP-SAT's
#: deterministic clock does not count: building the model in Python and loading and presolving
#: it (measured on a 2-core machine: about 8-9 us of wall time per interval, and 24,000-40,000
#: intervals for 200 free multicasts with their fixed neighbours).
CALL_OVERHEAD = 0.001
INTERVAL_OVERHEAD = 1e-6


@dataclass(slots=True)
class LnsResult:
    """Outcome of the improvement stage.

    Attributes:
        starts: the best send cycles found.
        kind: ``"cp-sat-lns"``.
        improvements: neighbourhood solves that lowered their component's end.
        proven_bound: the best lower bound CP-SAT proved for a component solved whole (a
            true lower bound on the phase's horizon: the component alone is a relaxation), or 0.
    """

    starts: IntArray
    kind: str
    improvements: int
    proven_bound: int


@dataclass(slots=True)
class _Outcome:
    starts: IntArray | None
    optimal: bool
    deterministic_time: float
    bound: int = 0  # CP-SAT's proven lower bound on the free transfers' makespan
    skipped: bool = False  # the model would have cost more than the budget left: not built


def components(problem: ResourceProblem) -> tuple[int, IntArray]:
    """Connected components of transfers linked by shared resources or dependencies.

    Returns:
        ``(count, label)`` with ``label[i]`` the component of transfer ``i``.
    """
    n = problem.count
    rows = np.concatenate((problem.use_transfers, problem.dependency_before))
    cols = np.concatenate((n + problem.use_resources, problem.dependency_after))
    graph = coo_matrix(
        (np.ones(rows.size, dtype=np.int8), (rows, cols)),
        shape=(n + problem.resource_count, n + problem.resource_count),
    )
    _, labels = connected_components(graph, directed=False)
    labels = labels[:n]
    # Renumber by first transfer so labels do not depend on resource numbering.
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))
    return int(first.size), rank[inverse].astype(np.int64)


def improve(
    problem: ResourceProblem,
    starts: IntArray,
    target: int,
    deadline: float,
    good_enough: int | None = None,
    planned_seconds: float | None = None,
) -> LnsResult:
    """Improve a schedule until it meets ``target``, nothing is left to try, or time is up.

    The stage works on the component that currently ends last, since only it can lower the
    phase's horizon. Each visit gives it a deterministic-time slice that doubles on every
    revisit; a component solved whole to proven optimality ends the stage (the horizon cannot
    drop below it), and its optimum is reported as a lower bound.

    Args:
        problem: the compiled phase.
        starts: the incumbent send cycles (not modified).
        target: the strongest lower bound (no schedule can end earlier).
        deadline: ``time.perf_counter()`` value at which to stop.
        good_enough: stop once the horizon is at most this (default ``target``).
        planned_seconds: wall-clock seconds the stage plans for, turned into CP-SAT
            deterministic time (so the search path does not depend on the clock); by default
            the time to the deadline. The deadline still stops the stage.

    Returns:
        The best starts found, the number of improving solves and any proven bound.
    """
    try:
        from ortools.sat.python import cp_model  # noqa: F401
    except ImportError:  # pragma: no cover - ortools is a dependency
        return LnsResult(starts, KIND, 0, 0)
    if planned_seconds is None:
        planned_seconds = deadline - time.perf_counter()
    budget = max(planned_seconds, 0.0) * DETERMINISTIC_PER_SECOND
    starts = starts.copy()
    improvements = 0
    proven = 0
    count, label = components(problem)
    order = np.argsort(label, kind="stable")
    bounds_of = np.searchsorted(label[order], np.arange(count + 1))
    component_end = np.zeros(count, dtype=np.int64)
    np.maximum.at(component_end, label, starts + problem.completion)
    heap = [(-int(component_end[c]), c) for c in range(count)]
    heapq.heapify(heap)
    slices = [FIRST_SLICE] * count
    users = _resource_users(problem)
    tail_sizes = [TAIL_START] * count
    while heap and budget > 0 and time.perf_counter() < deadline:
        negative_end, c = heapq.heappop(heap)
        end = -negative_end
        if end <= (target if good_enough is None else max(good_enough, target)):
            break
        members = order[bounds_of[c] : bounds_of[c + 1]]
        limit = min(slices[c], budget)
        if members.size <= COMPONENT_LIMIT:
            window = members
        else:
            window = _critical_neighbourhood(problem, starts, members, target, tail_sizes[c], users)
        outcome = _solve(problem, starts, window, target, deadline, limit, budget)
        while outcome is not None and outcome.skipped and window.size > SMALLEST_WINDOW:
            # Too big a model for what is left: free fewer transfers around the same tail.
            tail_sizes[c] = max(window.size // 2, SMALLEST_WINDOW)
            window = _critical_neighbourhood(problem, starts, members, target, tail_sizes[c], users)
            outcome = _solve(problem, starts, window, target, deadline, limit, budget)
        if outcome is None or outcome.skipped:
            break  # the deadline has come, or even a small model costs more than what is left
        if window.size == members.size:
            # A whole component solved alone is a relaxation of the phase: CP-SAT's bound on
            # its makespan is a lower bound on the phase's horizon.
            proven = max(proven, outcome.bound)
        budget -= outcome.deterministic_time
        if outcome.starts is not None:
            trial = starts.copy()
            trial[window] = outcome.starts
            new_end = int((trial[members] + problem.completion[members]).max())
            if new_end < end:
                starts = trial
                improvements += 1
                end = new_end
            elif members.size > COMPONENT_LIMIT:
                tail_sizes[c] = min(tail_sizes[c] * 2, TAIL_LIMIT)
            if outcome.optimal and window.size == members.size:
                # The whole component is optimal: the phase cannot end before it does.
                proven = max(proven, end)
                break
        slices[c] = min(slices[c] * 2, LAST_SLICE)
        heapq.heappush(heap, (-end, c))
    return LnsResult(starts, KIND, improvements, proven)


def _resource_users(problem: ResourceProblem) -> list[IntArray]:
    """For each resource, the transfers that use it."""
    order = np.argsort(problem.use_resources, kind="stable")
    bounds_of = np.searchsorted(problem.use_resources[order], np.arange(problem.resource_count + 1))
    transfers = problem.use_transfers[order]
    return [transfers[bounds_of[r] : bounds_of[r + 1]] for r in range(problem.resource_count)]


def _critical_neighbourhood(
    problem: ResourceProblem,
    starts: IntArray,
    members: IntArray,
    target: int,
    size: int,
    users: list[IntArray],
) -> IntArray:
    """The transfers that end above the target, then everything sharing a resource with them,
    breadth first, latest-ending first at each level, up to ``size`` transfers.

    Freeing whole resource timelines (not just the tail) lets the solver reorder a critical
    port from its first transfer on.
    """
    end = starts + problem.completion
    member_end = end[members]
    frontier = members[np.lexsort((members, -member_end))]
    frontier = frontier[end[frontier] > target][:size]
    if frontier.size == 0:
        frontier = members[np.argsort(-member_end, kind="stable")[:1]]
    chosen = np.zeros(problem.count, dtype=bool)
    chosen[frontier] = True
    total = int(frontier.size)
    use_starts = problem.use_starts
    while frontier.size and total < size:
        rows = np.concatenate([np.arange(use_starts[i], use_starts[i + 1]) for i in frontier])
        resources = np.unique(problem.use_resources[rows])
        neighbours = np.unique(np.concatenate([users[r] for r in resources.tolist()]))
        neighbours = neighbours[~chosen[neighbours]]
        if neighbours.size == 0:
            break
        neighbours = neighbours[np.lexsort((neighbours, -end[neighbours]))][: size - total]
        chosen[neighbours] = True
        total += int(neighbours.size)
        frontier = neighbours
    return np.flatnonzero(chosen)


def _end(problem: ResourceProblem, member_starts: IntArray, members: IntArray) -> int:
    return int((member_starts + problem.completion[members]).max())


def _solve(
    problem: ResourceProblem,
    starts: IntArray,
    free: IntArray,
    target: int,
    deadline: float,
    limit: float,
    budget: float,
) -> _Outcome | None:
    """Best placement of the ``free`` transfers with all others fixed.

    Args:
        limit: CP-SAT's deterministic-time slice.
        budget: deterministic seconds left for the stage; the model's overhead (per call and
            per interval) counts against it with the solver's time.

    Returns:
        None when the deadline leaves no time to try; a ``skipped`` outcome when the model
        would cost more than ``budget``; otherwise the outcome (``starts`` None when CP-SAT
        found no solution in its slice), whose deterministic time includes the overhead.
    """
    from ortools.sat.python import cp_model

    remaining = deadline - time.perf_counter()
    if remaining <= 0.01:
        return None
    # The incumbent is feasible inside its own end, so the free transfers need not go later.
    horizon = int((starts[free] + problem.completion[free]).max())
    is_free = np.zeros(problem.count, dtype=bool)
    is_free[free] = True
    durations = problem.durations
    completion = problem.completion
    # Resource intervals: free uses as variables, other uses on touched resources as constants.
    use_of_free = is_free[problem.use_transfers]
    touched = np.unique(problem.use_resources[use_of_free])
    is_touched = np.zeros(problem.resource_count, dtype=bool)
    is_touched[touched] = True
    on_touched = is_touched[problem.use_resources]
    fixed_rows = np.flatnonzero(on_touched & ~use_of_free)
    free_rows = np.flatnonzero(use_of_free)
    merged: list[tuple[int, int, int]] = []
    if fixed_rows.size:
        fixed_resource = problem.use_resources[fixed_rows]
        fixed_begin = starts[problem.use_transfers[fixed_rows]] + problem.use_offsets[fixed_rows]
        fixed_end = fixed_begin + durations[problem.use_transfers[fixed_rows]]
        merged = _merge(fixed_resource, fixed_begin, fixed_end)
    overhead = CALL_OVERHEAD + INTERVAL_OVERHEAD * (free_rows.size + len(merged))
    if overhead >= budget:
        return _Outcome(None, False, 0.0, skipped=True)
    free_list = free.tolist()
    model = cp_model.CpModel()
    heads = _free_heads(problem, starts, is_free)
    variables = {}
    for i in free_list:
        latest = horizon - int(completion[i])
        variables[i] = model.new_int_var(int(heads[i]), max(latest, int(heads[i])), f"x{i}")
    per_resource: dict[int, list[Any]] = {int(r): [] for r in touched.tolist()}
    for row in free_rows.tolist():
        i = int(problem.use_transfers[row])
        offset = int(problem.use_offsets[row])
        length = int(durations[i])
        per_resource[int(problem.use_resources[row])].append(
            model.new_fixed_size_interval_var(variables[i] + offset, length, f"u{row}")
        )
    for resource, begin, end in merged:
        per_resource[resource].append(model.new_fixed_size_interval_var(begin, end - begin, "f"))
    for intervals in per_resource.values():
        if len(intervals) > 1:
            model.add_no_overlap(intervals)
    # Dependencies among free transfers (fixed ones became bounds in ``heads``/``latest``).
    if problem.dependency_before.size:
        before = problem.dependency_before
        after = problem.dependency_after
        delay = problem.dependency_delay
        both = is_free[before] & is_free[after]
        for b, a, d in zip(
            before[both].tolist(), after[both].tolist(), delay[both].tolist(), strict=True
        ):
            model.add(variables[a] >= variables[b] + d)
        # A free transfer must also finish early enough for its fixed successors.
        into_fixed = is_free[before] & ~is_free[after]
        for b, a, d in zip(
            before[into_fixed].tolist(),
            after[into_fixed].tolist(),
            delay[into_fixed].tolist(),
            strict=True,
        ):
            model.add(variables[b] <= int(starts[a]) - d)
    # Only the free transfers count: fixed ones elsewhere may end later and are fixed anyway.
    makespan = model.new_int_var(min(target, horizon), horizon, "makespan")
    for i in free_list:
        model.add(makespan >= variables[i] + int(completion[i]))
        model.add_hint(variables[i], int(starts[i]))
    model.minimize(makespan)
    remaining = deadline - time.perf_counter()  # building the model took time too
    if remaining <= 0.01:
        return None
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = max(limit, 0.001)
    solver.parameters.max_time_in_seconds = max(remaining, 0.01)
    status = solver.solve(model)
    spent = float(solver.deterministic_time) + overhead
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _Outcome(None, False, spent, _proven(solver, status, cp_model))
    found = np.asarray([solver.value(variables[i]) for i in free_list], dtype=np.int64)
    return _Outcome(found, status == cp_model.OPTIMAL, spent, _proven(solver, status, cp_model))


def _proven(solver: Any, status: Any, cp_model: Any) -> int:
    """CP-SAT's lower bound on the objective (0 when the search proved nothing)."""
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return 0
    return int(np.ceil(solver.best_objective_bound - 1e-6))


def _free_heads(
    problem: ResourceProblem, starts: IntArray, is_free: npt.NDArray[np.bool_]
) -> IntArray:
    """Earliest start of each transfer given its release and the fixed predecessors (free ones
    add constraints)."""
    heads = problem.release.copy()
    if problem.dependency_before.size:
        before = problem.dependency_before
        after = problem.dependency_after
        delay = problem.dependency_delay
        fixed_before = ~is_free[before]
        np.maximum.at(
            heads, after[fixed_before], starts[before[fixed_before]] + delay[fixed_before]
        )
    return heads


def _merge(resource: IntArray, begin: IntArray, end: IntArray) -> list[tuple[int, int, int]]:
    """Busy intervals per resource with touching or overlapping ones merged."""
    order = np.lexsort((begin, resource))
    merged: list[tuple[int, int, int]] = []
    for r, b, e in zip(
        resource[order].tolist(), begin[order].tolist(), end[order].tolist(), strict=True
    ):
        if merged and merged[-1][0] == r and b <= merged[-1][2]:
            if e > merged[-1][2]:
                merged[-1] = (r, merged[-1][1], e)
        else:
            merged.append((r, b, e))
    return merged

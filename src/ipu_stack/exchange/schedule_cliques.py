"""Sequencing of multicast cliques: a priority order that runs each clique in a cheap order.

In GEMM operand distribution every member of a group multicasts its chunk to all the others, so
the group's transfers pairwise share a receive port and must run one after another. Without
latency any order is optimal; with latency the gap needed between two consecutive transfers
depends on the pair (the separation of :func:`ipu_stack.exchange.bounds.clique_separations`),
so the order matters. This module finds, for every connected component that is such a clique,
a short Hamiltonian path through the separations (exact for small cliques, nearest neighbour
from every start otherwise) and returns a transfer order for the list scheduler: the cliques'
transfers in path order, then everything else by static priority.

Limits: components that are not cliques (overlapping groups) keep the static priority order.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ipu_stack.exchange.bounds import clique_separations
from ipu_stack.exchange.constraints import ResourceProblem
from ipu_stack.exchange.schedule_greedy import priority_order
from ipu_stack.exchange.schedule_lns import components

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
#: Cliques up to this size are ordered exactly (Held-Karp over subsets).
EXACT_LIMIT = 5
#: Largest clique sequenced (bigger components keep the static order).
CLIQUE_LIMIT = 96


def clique_order(problem: ResourceProblem) -> IntArray | None:
    """A transfer order with every clique component in a short separation path.

    Args:
        problem: the compiled phase.

    Returns:
        The order, or None when the phase has no multicast clique component.
    """
    if problem.count == 0 or int(problem.arrays.fanouts.max()) < 2:
        return None
    count, label = components(problem)
    sizes = np.bincount(label, minlength=count)
    order = np.argsort(label, kind="stable")
    bounds_of = np.concatenate(([0], np.cumsum(sizes)))
    heads = problem.heads()
    tails = problem.tails()
    sequenced: list[IntArray] = []
    for c in np.flatnonzero((sizes >= 3) & (sizes <= CLIQUE_LIMIT)).tolist():
        members = order[bounds_of[c] : bounds_of[c + 1]]
        if problem.arrays.fanouts[members].max() < 2:
            continue
        separation = clique_separations(problem, members.tolist())
        off_diagonal = ~np.eye(members.size, dtype=bool)
        if np.isnan(separation[off_diagonal]).any():
            continue  # not a clique
        path = _short_path(separation, heads[members].astype(float), tails[members].astype(float))
        sequenced.append(members[path])
    if not sequenced:
        return None
    first = np.concatenate(sequenced)
    rest = priority_order(problem)
    taken = np.zeros(problem.count, dtype=bool)
    taken[first] = True
    # Interleave cliques by their position so that all groups start together.
    position = np.concatenate([np.arange(p.size) for p in sequenced])
    first = first[np.argsort(position, kind="stable")]
    return np.concatenate((first, rest[~taken[rest]])).astype(np.int64)


def _short_path(separation: FloatArray, head: FloatArray, tail: FloatArray) -> IntArray:
    """An order minimising ``head_first + sum of separations + tail_last`` (heuristically)."""
    n = head.size
    weights = np.where(np.isnan(separation), np.inf, separation)
    if n <= EXACT_LIMIT:
        return _exact_path(weights, head, tail)
    # Nearest neighbour from every start at once, then the best complete path.
    rows = np.arange(n)
    current = rows.copy()
    visited = np.zeros((n, n), dtype=bool)
    visited[rows, current] = True
    cost = head.copy()
    paths = [current.copy()]
    for _ in range(n - 1):
        step = np.where(visited, np.inf, weights[current])
        nxt = np.argmin(step, axis=1)
        cost += step[rows, nxt]
        visited[rows, nxt] = True
        current = nxt
        paths.append(current.copy())
    cost += tail[current]
    best = int(np.argmin(cost))
    return np.asarray([p[best] for p in paths], dtype=np.int64)


def _exact_path(weights: FloatArray, head: FloatArray, tail: FloatArray) -> IntArray:
    n = head.size
    full = 1 << n
    cost = np.full((full, n), np.inf)
    parent = np.full((full, n), -1, dtype=np.int64)
    for v in range(n):
        cost[1 << v, v] = head[v]
    for mask in range(1, full):
        row = cost[mask]
        if not np.isfinite(row).any():
            continue
        for v in range(n):
            if mask >> v & 1:
                continue
            candidates = row + weights[:, v]
            u = int(np.argmin(candidates))
            target = mask | (1 << v)
            if candidates[u] < cost[target, v]:
                cost[target, v] = candidates[u]
                parent[target, v] = u
    last = int(np.argmin(cost[full - 1] + tail))
    path = [last]
    mask = full - 1
    while parent[mask, path[-1]] >= 0:
        previous = int(parent[mask, path[-1]])
        mask ^= 1 << path[-1]
        path.append(previous)
    return np.asarray(path[::-1], dtype=np.int64)

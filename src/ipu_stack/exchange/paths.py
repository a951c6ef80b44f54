"""Cheapest orders of a clique of transfers: Hamiltonian paths through pairwise separations.

Transfers that pairwise share a port run one after another; with latency the least gap between
two consecutive ones depends on the pair (``separation[i, j]``, see
:func:`ipu_stack.exchange.bounds.clique_separations`). An order's length is
``head[first] + sum of consecutive separations + tail[last]``: a lower bound on the horizon of
any one-piece schedule that runs the clique in that order, and, in practice, what the list
scheduler achieves when given that order. Both the conflict-clique bound and the clique
sequencing of :mod:`ipu_stack.exchange.schedule_cliques` need the shortest such path:

- :func:`exact_path`: Held-Karp dynamic programming over subsets, vectorised one subset size at
  a time (``2**n * n**2`` work; up to :data:`EXACT_LIMIT` members);
- :func:`short_path`: nearest neighbour from every start, then or-opt moves (a segment of one
  to three transfers moved elsewhere) on the best few until none improves; any size.

Missing separations (``NaN``: no usable shared port) count as impossible steps.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
#: Largest clique :func:`exact_path` accepts (its table has ``2**n * n`` entries).
EXACT_LIMIT = 17
#: Nearest-neighbour paths improved by or-opt in :func:`short_path`.
STARTS_IMPROVED = 3
#: Longest segment an or-opt move relocates.
SEGMENT_LIMIT = 3
#: Cost of a missing separation inside the heuristic (finite, so that sums stay ordered).
_MISSING = 1e12


def exact_work(size: int) -> int:
    """Work units (table cells times candidates) of :func:`exact_path` on ``size`` members."""
    return (1 << size) * size * size


def path_cost(weights: FloatArray, head: FloatArray, tail: FloatArray, order: IntArray) -> float:
    """Length of one order: head of the first, separations between neighbours, tail of the last."""
    return float(head[order[0]] + weights[order[:-1], order[1:]].sum() + tail[order[-1]])


def exact_path(
    separation: FloatArray, head: FloatArray, tail: FloatArray
) -> tuple[float, IntArray]:
    """The shortest order (Held-Karp), for at most :data:`EXACT_LIMIT` members.

    Returns:
        ``(length, order)``.

    Raises:
        ValueError: if there are too many members.
    """
    n = head.size
    if n > EXACT_LIMIT:
        raise ValueError(f"exact path over {n} members (limit {EXACT_LIMIT})")
    weights = np.where(np.isnan(separation), np.inf, separation)
    np.fill_diagonal(weights, np.inf)
    if n == 1:
        return float(head[0] + tail[0]), np.zeros(1, dtype=np.int64)
    full = 1 << n
    nodes = np.arange(n)
    bits = (1 << nodes).astype(np.int64)
    cost = np.full((full, n), np.inf)
    parent = np.full((full, n), -1, dtype=np.int8)
    cost[bits, nodes] = head
    sizes = np.bitwise_count(np.arange(full, dtype=np.int64))
    for size in range(1, n):
        masks = np.flatnonzero(sizes == size).astype(np.int64)
        # Best way to end at v after visiting ``mask``: the best last member u of ``mask``.
        total = cost[masks][:, :, None] + weights[None, :, :]
        best_last = total.argmin(axis=1)
        best = np.take_along_axis(total, best_last[:, None, :], axis=1)[:, 0, :]
        free = (masks[:, None] & bits[None, :]) == 0
        rows, columns = np.nonzero(free)
        # Every (mask | v, v) is reached from exactly one mask, so assignment suffices.
        targets = masks[rows] | bits[columns]
        cost[targets, columns] = best[rows, columns]
        parent[targets, columns] = best_last[rows, columns]
    final = cost[full - 1] + tail
    last = int(np.argmin(final))
    order = [last]
    mask = full - 1
    while len(order) < n:
        previous = int(parent[mask, order[-1]])
        mask ^= 1 << order[-1]
        order.append(previous)
    return float(final[last]), np.asarray(order[::-1], dtype=np.int64)


def short_path(
    separation: FloatArray, head: FloatArray, tail: FloatArray
) -> tuple[float, IntArray]:
    """A short order for any size: nearest neighbour from every start, then or-opt.

    Returns:
        ``(length, order)``.
    """
    n = head.size
    weights = np.where(np.isnan(separation), _MISSING, separation)
    np.fill_diagonal(weights, _MISSING)
    if n == 1:
        return float(head[0] + tail[0]), np.zeros(1, dtype=np.int64)
    rows = np.arange(n)
    current = rows.copy()
    visited = np.zeros((n, n), dtype=bool)
    visited[rows, current] = True
    cost = head.copy()
    paths = np.empty((n, n), dtype=np.int64)
    paths[:, 0] = current
    for step in range(1, n):
        options = np.where(visited, np.inf, weights[current])
        chosen = np.argmin(options, axis=1)
        cost += options[rows, chosen]
        visited[rows, chosen] = True
        current = chosen
        paths[:, step] = current
    cost += tail[current]
    best_length = np.inf
    best_order = paths[0]
    for start in np.argsort(cost, kind="stable")[:STARTS_IMPROVED].tolist():
        order = _or_opt(weights, head, tail, paths[start].copy())
        length = path_cost(weights, head, tail, order)
        if length < best_length:
            best_length, best_order = length, order
    exact = np.where(np.isnan(separation), np.inf, separation)
    return path_cost(exact, head, tail, best_order), best_order


def _or_opt(weights: FloatArray, head: FloatArray, tail: FloatArray, order: IntArray) -> IntArray:
    """Move segments of 1-3 members to their best place while that shortens the path."""
    n = order.size
    # A closed tour through a dummy node ``n`` (dummy -> v costs head, v -> dummy costs tail).
    closed = np.full((n + 1, n + 1), _MISSING)
    closed[:n, :n] = weights
    closed[n, :n] = head
    closed[:n, n] = tail
    tour = np.concatenate((order, [n]))
    improved = True
    while improved:
        improved = False
        size = n + 1
        for length in range(1, min(SEGMENT_LIMIT, n - 1) + 1):
            # Segment tour[i : i + length], with i + length <= n (never containing the dummy).
            begins = np.arange(size)
            begins = begins[tour[(begins + np.arange(length)[:, None]) % size].max(axis=0) < n]
            if begins.size == 0:
                continue
            before = tour[(begins - 1) % size]
            first = tour[begins]
            last = tour[(begins + length - 1) % size]
            after = tour[(begins + length) % size]
            removed = closed[before, first] + closed[last, after] - closed[before, after]
            # Insert between tour[k] and tour[k + 1] for k outside the segment and its left end.
            k = np.arange(size)
            left = tour[k]
            right = tour[(k + 1) % size]
            added = (
                closed[left[None, :], first[:, None]]
                + closed[last[:, None], right[None, :]]
                - closed[left, right][None, :]
            )
            offset = (k[None, :] - begins[:, None]) % size
            invalid = offset < length  # k inside the segment
            invalid |= offset == size - 1  # k is the node just before the segment
            gain = np.where(invalid, -np.inf, removed[:, None] - added)
            flat = int(np.argmax(gain))
            if gain.flat[flat] > 1e-9:
                i = int(begins[flat // size])
                target = int(k[flat % size])
                tour = _move(tour, i, length, target)
                improved = True
                break
    start = int(np.flatnonzero(tour == n)[0])
    rolled = np.roll(tour, -start - 1)
    return rolled[:n].astype(np.int64)


def _move(tour: IntArray, begin: int, length: int, after: int) -> IntArray:
    """The tour with ``tour[begin : begin + length]`` moved to follow node ``tour[after]``."""
    size = tour.size
    segment_positions = [(begin + s) % size for s in range(length)]
    segment = tour[segment_positions]
    anchor = tour[after]
    rest = np.delete(tour, segment_positions)
    position = int(np.flatnonzero(rest == anchor)[0]) + 1
    return np.concatenate((rest[:position], segment, rest[position:]))

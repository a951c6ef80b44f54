"""Sequencing of multicast cliques: a priority order that runs each clique in a cheap order.

In GEMM operand distribution every member of a group multicasts its chunk to all the others, so
the group's transfers pairwise share a receive port and must run one after another. Without
latency any order is optimal; with latency the gap needed between two consecutive transfers
depends on the pair (the separation of :func:`ipu_stack.exchange.bounds.clique_separations`),
so the order matters. This module finds, for every connected component that is such a clique,
a short Hamiltonian path through the separations (:mod:`ipu_stack.exchange.paths`: exact for
small cliques, nearest neighbour plus or-opt otherwise) and returns a transfer order for the
list scheduler: the cliques' transfers in path order, then everything else by static priority.

Limits: components that are not cliques (overlapping groups) keep the static priority order.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ipu_stack.exchange.bounds import clique_separations
from ipu_stack.exchange.constraints import ResourceProblem
from ipu_stack.exchange.paths import exact_path, short_path
from ipu_stack.exchange.schedule_greedy import priority_order
from ipu_stack.exchange.schedule_lns import components

IntArray = npt.NDArray[np.int64]
#: Cliques up to this size are ordered exactly (Held-Karp over subsets, under 1 ms each).
EXACT_LIMIT = 8
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
        head = heads[members].astype(float)
        tail = tails[members].astype(float)
        if members.size <= EXACT_LIMIT:
            _, path = exact_path(separation, head, tail)
        else:
            _, path = short_path(separation, head, tail)
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

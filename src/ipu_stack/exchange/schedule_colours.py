"""A list order for multicast phases whose senders are also receivers: one colour per group.

A GEMM's moved operand reaches each *receiver group* (the tiles that share an operand block:
joined whenever one multicast reaches both) as several multicasts, one after another, and the
senders are themselves members of receiver groups. A paired (64-bit) send holds its source
partner's receive port, so while a group's member sends, that group cannot receive. Sent in
static priority order, a group's sends scatter over its receive slots and each costs it a slot
(the SigLIP MLP's down projection: 7,282 cycles against a bound of 5,984).

Here each group gets one colour, and all its members' transfers are ordered together: a
group then loses one slot to its own sends, not one per send. Colours are a greedy
(Welsh-Powell) colouring of the groups where a group conflicts with every group that sends to
it, and the groups that send to one group conflict with each other (their sends reach it one
after another). Transfers follow in colour order, each colour's in the lowering's order (by
operand block); the preemptive list scheduler (pieces) places them. The order within a colour
moves the result by several percent either way (6,818 to 7,389 cycles on the phase above), so
this is one more candidate beside the static orders, never a replacement.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from ipu_stack.exchange.constraints import RECEIVE, ResourceProblem

IntArray = npt.NDArray[np.int64]
#: Largest number of conflict edges the colouring may build (bounds its Python work).
MAX_CONFLICT_EDGES = 2_000_000


def _tile_groups(problem: ResourceProblem, tiles: int) -> IntArray:
    """Receiver group of every tile: components of tiles joined by a shared multicast."""
    arrays = problem.arrays
    entries = np.flatnonzero(arrays.fanouts[arrays.destination_transfers] > 1)
    owner = arrays.destination_transfers[entries]
    first = arrays.destination_tiles[arrays.destination_starts[owner]]
    reached = arrays.destination_tiles[entries]
    graph = csr_matrix((np.ones(entries.size, dtype=np.int8), (first, reached)), (tiles, tiles))
    _, label = connected_components(graph, directed=False)
    return label.astype(np.int64)


def _sender_groups(problem: ResourceProblem, group: IntArray, tiles: int) -> IntArray:
    """Per transfer, the group its send keeps from receiving: the group of a receive port it
    holds without delivering there (a paired send's source partner), else its source's."""
    arrays = problem.arrays
    receive = np.flatnonzero(problem.resource_kinds[problem.use_resources] == RECEIVE)
    transfer = problem.use_transfers[receive]
    tile = problem.resource_tiles[problem.use_resources[receive]]
    delivered = arrays.destination_transfers * tiles + arrays.destination_tiles
    held = ~np.isin(transfer * tiles + tile, delivered)
    sender = group[arrays.sources].copy()
    if held.any():
        holder = np.full(problem.count, np.iinfo(np.int64).max)
        np.minimum.at(holder, transfer[held], group[tile[held]])
        sender = np.where(holder < np.iinfo(np.int64).max, holder, sender)
    return sender


def group_colour_order(problem: ResourceProblem) -> IntArray | None:
    """Transfers by the colour of their sender's group, then in the lowering's order; None
    when the phase has no multicast, fewer than two sending groups, or too big a conflict
    graph."""
    colours = transfer_colours(problem)
    return None if colours is None else np.argsort(colours, kind="stable").astype(np.int64)


def transfer_colours(problem: ResourceProblem) -> IntArray | None:
    """The colour of each transfer's sending group (see :func:`group_colour_order`)."""
    arrays = problem.arrays
    if not bool((arrays.fanouts > 1).any()):
        return None
    # every tile a resource names (a held partner port may lie beyond the phase's own tiles)
    tiles = int(max(arrays.sources.max(), problem.resource_tiles.max())) + 1
    group = _tile_groups(problem, tiles)
    sender = _sender_groups(problem, group, tiles)
    target = group[arrays.destination_tiles[arrays.destination_starts[:-1]]]
    external = sender != target
    pairs = np.unique(np.stack((target[external], sender[external])), axis=1)
    if np.unique(sender).size < 2 or pairs.shape[1] == 0:
        return None
    targets, starts = np.unique(pairs[0], return_index=True)
    senders_of = np.split(pairs[1], starts[1:])
    if sum(s.size * (s.size + 1) for s in senders_of) > MAX_CONFLICT_EDGES:
        return None
    neighbours: dict[int, set[int]] = {}
    for receiving, sending in zip(targets.tolist(), senders_of, strict=True):
        members = sending.tolist()
        neighbours.setdefault(receiving, set()).update(members)
        for g in members:
            mine = neighbours.setdefault(g, set())
            mine.update(members)
            mine.add(receiving)
            mine.discard(g)
    colour: dict[int, int] = {}
    for g in sorted(neighbours, key=lambda g: (-len(neighbours[g]), g)):
        taken = {colour[n] for n in neighbours[g] if n in colour}
        c = 0
        while c in taken:
            c += 1
        colour[g] = c
    return np.array([colour.get(g, 0) for g in sender.tolist()], dtype=np.int64)

"""Preemptive list scheduling: transfers cut into a bounded number of pieces.

A one-piece schedule needs every resource of a transfer free for its whole length at once; for
multicasts (a source and up to 16 receive ports) such windows are rare once the calendars
fill, and the last transfers end far beyond the bound. Here each transfer, in a priority order,
takes the earliest window in which all its resources are free for at least ``min_piece``
cycles, as much of that window as it can, and continues in the next window until it is done
(`exchange-scheduling.md` §1.2-1.5: preemption is what lets multicast reach the port bound).

Rules kept: every piece moves the transfer's next words in order, to all its destinations at
once, each shifted by its own latency (multicast); pieces of a ``paired64`` transfer move whole
64-bit items (so offsets and lengths in words stay even); a dependent transfer starts after the
*last* piece of its predecessor has finished on the shared tile (the compiled delay is relative
to a one-piece transfer, so it is taken from the last piece's end minus the transfer's length).
A transfer has at most ``max_pieces`` pieces: the last one waits for a window that holds all
that remains.

Pieces cost exchange code (a send and the receivers' mux and pointer updates per piece, facts
§8.5), not cycles, so the scheduler only selects a preemptive schedule when it ends earlier.
The lower bounds that stay valid under preemption are listed in
:data:`ipu_stack.exchange.bounds.PREEMPTIVE_BOUND_NAMES`.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from ipu_stack.exchange.constraints import ResourceProblem
from ipu_stack.exchange.model import ExchangeModel, PhaseSchedule, Piece
from ipu_stack.exchange.schedule_greedy import Calendar, dependency_successors, transfer_uses

IntArray = npt.NDArray[np.int64]
#: Shortest window (cycles) a piece other than a transfer's last is placed in.
MIN_PIECE = 16
#: Default most pieces per transfer.
MAX_PIECES = 8
_NEVER = 1 << 62


@dataclass(frozen=True, slots=True)
class PieceStarts:
    """A preemptive schedule as flat arrays, ordered by transfer then offset.

    Attributes:
        owner: transfer of each piece.
        send: send cycle of each piece.
        offset: offset of each piece in the transfer, in cycles (items).
        length: cycles (items) of each piece.
    """

    owner: IntArray
    send: IntArray
    offset: IntArray
    length: IntArray

    @property
    def count(self) -> int:
        """Number of pieces."""
        return int(self.owner.size)


def preemptive_fit(
    problem: ResourceProblem,
    order: IntArray,
    min_piece: int = MIN_PIECE,
    max_pieces: int = MAX_PIECES,
) -> PieceStarts:
    """List scheduling with splitting (see the module docstring).

    Args:
        problem: the compiled phase.
        order: transfer priority order; a transfer waits until its predecessors are placed.
        min_piece: shortest window used for a piece that is not the transfer's last.
        max_pieces: most pieces per transfer (at least 1; 1 is the one-piece list scheduler).

    Returns:
        The pieces.
    """
    count = problem.count
    uses = transfer_uses(problem)
    durations = problem.durations.tolist()
    after, waiting = dependency_successors(problem)
    release = problem.release.tolist()
    calendar = Calendar(problem.resource_count)
    rank = np.empty(count, dtype=np.int64)
    rank[order] = np.arange(count)
    ranks = rank.tolist()
    ready = [(ranks[i], i) for i in range(count) if not waiting[i]]
    heapq.heapify(ready)
    owner: list[int] = []
    send: list[int] = []
    offset: list[int] = []
    length: list[int] = []
    limit = max(max_pieces, 1)
    while ready:
        _, i = heapq.heappop(ready)
        remaining = durations[i]
        time = release[i]
        done = 0
        pieces = 0
        while remaining > 0:
            if pieces == limit - 1:
                time = calendar.earliest(uses[i], remaining, time)
                piece = remaining
            else:
                time = calendar.earliest(uses[i], min(remaining, min_piece), time)
                piece = min(remaining, _window(calendar, uses[i], time))
            calendar.occupy_uses(uses[i], time, piece)
            owner.append(i)
            send.append(time)
            offset.append(done)
            length.append(piece)
            done += piece
            remaining -= piece
            time += piece
            pieces += 1
        last_end = time
        for successor, delay in after[i]:
            release[successor] = max(release[successor], last_end - durations[i] + delay)
            waiting[successor] -= 1
            if not waiting[successor]:
                heapq.heappush(ready, (ranks[successor], successor))
    arrays = [np.asarray(a, dtype=np.int64) for a in (owner, send, offset, length)]
    by_transfer = np.lexsort((arrays[2], arrays[0]))
    return PieceStarts(*(a[by_transfer] for a in arrays))


def difficulty_order(problem: ResourceProblem) -> IntArray:
    """Transfers hardest to fit late first: the loads of all their resources, times length.

    A multicast needs all its ports free at once; the more ports and the fuller they are, the
    fewer common windows remain once the calendars fill, so such transfers go first.
    """
    load = problem.resource_loads()
    total = np.add.reduceat(load[problem.use_resources], problem.use_starts[:-1])
    difficulty = total * problem.durations
    return np.lexsort((np.arange(problem.count), -difficulty)).astype(np.int64)


def _window(calendar: Calendar, uses: list[tuple[int, int]], time: int) -> int:
    """Cycles from ``time`` for which every use stays free (uses are free at ``time``)."""
    window = _NEVER
    for resource, offset in uses:
        begin = time + offset
        starts = calendar.starts.get(resource)
        if starts is None:
            continue
        k = bisect_right(starts, begin)
        if k < len(starts):
            window = min(window, starts[k] - begin)
    return window


def pieces_horizon(problem: ResourceProblem, pieces: PieceStarts) -> int:
    """Horizon of a preemptive schedule: the last piece's end on its slowest resource."""
    if pieces.count == 0:
        return 0
    latest_offset = problem.completion - problem.durations
    return int((pieces.send + pieces.length + latest_offset[pieces.owner]).max())


def schedule_from_pieces(
    problem: ResourceProblem, pieces: PieceStarts, kind: str, model: ExchangeModel
) -> PhaseSchedule:
    """The :class:`PhaseSchedule` of a preemptive schedule, with first arrivals.

    Args:
        problem: the compiled phase.
        pieces: the pieces (ordered by transfer then offset).
        kind: the scheduler's name.
        model: the model the problem was compiled under.

    Returns:
        The schedule (piece offsets and lengths in words).
    """
    per_cycle = problem.words_per_cycle[pieces.owner]
    words = (pieces.length * per_cycle).tolist()
    offsets = (pieces.offset * per_cycle).tolist()
    sends = pieces.send.tolist()
    bounds_of = np.searchsorted(pieces.owner, np.arange(problem.count + 1)).tolist()
    grouped = tuple(
        tuple(Piece(sends[k], offsets[k], words[k]) for k in range(bounds_of[i], bounds_of[i + 1]))
        for i in range(problem.count)
    )
    first_send = pieces.send[np.asarray(bounds_of[:-1], dtype=np.int64)]
    arrival = (
        first_send[problem.arrays.destination_transfers] + problem.destination_latency
    ).tolist()
    destination_bounds = problem.arrays.destination_starts.tolist()
    first_arrivals = tuple(tuple(arrival[begin:end]) for begin, end in pairwise(destination_bounds))
    return PhaseSchedule(grouped, pieces_horizon(problem, pieces), kind, model, first_arrivals)

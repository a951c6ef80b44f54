"""An independent checker for exchange-phase schedules.

It shares no code with any scheduler: it re-derives every port's busy intervals from the phase
and the pieces and checks them with vectorised numpy (sort intervals per port by start, compare
each start with the previous interval's end).

What it checks: piece sanity (non-negative send cycle, positive length), exact word coverage of
every transfer, one word per cycle on each send port and on each receive port (under the
schedule's latency model), and that the horizon covers the real end. What it does not check:
pair send buses, 64-bit pairing, SRAM-element hazards, memory-order dependencies, encoding limits.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from ipu_stack.errors import ScheduleError
from ipu_stack.exchange.model import ExchangePhase, PhaseSchedule, latency_model, phase_arrays

IntArray = npt.NDArray[np.int64]
#: Names a flattened piece in messages: ``piece index -> 'transfer i piece k'``.
_PieceNamer = Callable[[int], str]


def verify_schedule(phase: ExchangePhase, schedule: PhaseSchedule) -> None:
    """Check that a schedule realises a phase on the port model.

    Args:
        phase: the phase (validated first).
        schedule: the schedule to check.

    Raises:
        ScheduleError: at the first violation found, naming the transfer (and piece), the tile
            and the cycle involved.
    """
    phase.validate()
    count = len(phase.transfers)
    if len(schedule.pieces) != count:
        raise ScheduleError(
            f"schedule has pieces for {len(schedule.pieces)} transfers, phase has {count}"
        )
    latency = latency_model(schedule.latency)
    arrays = phase_arrays(phase)

    piece_counts = np.fromiter((len(p) for p in schedule.pieces), dtype=np.int64, count=count)
    total = int(piece_counts.sum())
    owner = np.repeat(np.arange(count, dtype=np.int64), piece_counts)
    first_piece = np.zeros(count, dtype=np.int64)
    np.cumsum(piece_counts[:-1], out=first_piece[1:])
    piece_number = np.arange(total, dtype=np.int64) - first_piece[owner]
    send = np.fromiter(
        (p.send_cycle for pieces in schedule.pieces for p in pieces), dtype=np.int64, count=total
    )
    offset = np.fromiter(
        (p.offset_words for pieces in schedule.pieces for p in pieces), dtype=np.int64, count=total
    )
    length = np.fromiter(
        (p.words for pieces in schedule.pieces for p in pieces), dtype=np.int64, count=total
    )

    def piece_name(k: int) -> str:
        return f"transfer {int(owner[k])} piece {int(piece_number[k])}"

    _check_pieces(send, offset, length, piece_name)
    _check_coverage(piece_counts, owner, offset, length, arrays.words, piece_name)

    sources = arrays.sources[owner]
    send_end = send + length
    clash = _first_overlap(sources, send, send_end)
    if clash is not None:
        a, b = clash
        raise ScheduleError(
            f"tile {int(sources[b])} sends two pieces in cycle {int(send[b])}: "
            f"{piece_name(a)} [{int(send[a])}, {int(send_end[a])}) and "
            f"{piece_name(b)} [{int(send[b])}, {int(send_end[b])})"
        )

    # One reception per (piece, destination): expand pieces by their transfer's fan-out.
    fanout = arrays.fanouts[owner]
    reception_piece = np.repeat(np.arange(total, dtype=np.int64), fanout)
    block_start = np.zeros(total, dtype=np.int64)
    np.cumsum(fanout[:-1], out=block_start[1:])
    within = np.arange(reception_piece.size, dtype=np.int64) - block_start[reception_piece]
    destination_index = arrays.destination_starts[owner[reception_piece]] + within
    receivers = arrays.destination_tiles[destination_index]
    arrival = send[reception_piece] + latency(sources[reception_piece], receivers)
    arrival_end = arrival + length[reception_piece]
    clash = _first_overlap(receivers, arrival, arrival_end)
    if clash is not None:
        a, b = clash
        pa, pb = int(reception_piece[a]), int(reception_piece[b])
        raise ScheduleError(
            f"tile {int(receivers[b])} receives from two senders in cycle {int(arrival[b])}: "
            f"{piece_name(pa)} from tile {int(sources[pa])} "
            f"[{int(arrival[a])}, {int(arrival_end[a])}) and "
            f"{piece_name(pb)} from tile {int(sources[pb])} "
            f"[{int(arrival[b])}, {int(arrival_end[b])})"
        )

    _check_horizon(schedule.horizon, send_end, arrival_end, reception_piece, piece_name)


def _check_pieces(
    send: IntArray,
    offset: IntArray,
    length: IntArray,
    piece_name: _PieceNamer,
) -> None:
    for bad, what, values in (
        (send < 0, "negative send_cycle", send),
        (length <= 0, "non-positive words", length),
        (offset < 0, "negative offset_words", offset),
    ):
        if bad.any():
            k = int(np.argmax(bad))
            raise ScheduleError(f"{piece_name(k)}: {what} {int(values[k])}")


def _check_coverage(
    piece_counts: IntArray,
    owner: IntArray,
    offset: IntArray,
    length: IntArray,
    words: IntArray,
    piece_name: _PieceNamer,
) -> None:
    """Every transfer's pieces must tile ``[0, words)`` exactly once."""
    if (piece_counts == 0).any():
        i = int(np.argmax(piece_counts == 0))
        raise ScheduleError(f"transfer {i}: no pieces; words [0, {int(words[i])}) not covered")
    order = np.lexsort((offset, owner))
    sorted_owner = owner[order]
    begin = offset[order]
    end = begin + length[order]
    first = np.ones(order.size, dtype=bool)
    first[1:] = sorted_owner[1:] != sorted_owner[:-1]
    expected = np.zeros(order.size, dtype=np.int64)
    expected[1:] = end[:-1]
    expected[first] = 0
    wrong = begin != expected
    if wrong.any():
        k = int(np.argmax(wrong))
        i, here, due = int(sorted_owner[k]), int(begin[k]), int(expected[k])
        if here < due:
            raise ScheduleError(
                f"transfer {i}: words [{here}, {min(due, int(end[k]))}) covered twice "
                f"({piece_name(int(order[k]))})"
            )
        raise ScheduleError(f"transfer {i}: words [{due}, {here}) not covered")
    last = np.ones(order.size, dtype=bool)
    last[:-1] = first[1:]
    final_end = end[last]
    transfer_words = words[sorted_owner[last]]
    wrong = final_end != transfer_words
    if wrong.any():
        j = int(np.argmax(wrong))
        i = int(sorted_owner[last][j])
        stop, size = int(final_end[j]), int(transfer_words[j])
        if stop < size:
            raise ScheduleError(f"transfer {i}: words [{stop}, {size}) not covered")
        raise ScheduleError(
            f"transfer {i}: pieces cover words [{size}, {stop}) beyond its {size} words"
        )


def _first_overlap(port: IntArray, begin: IntArray, end: IntArray) -> tuple[int, int] | None:
    """Indices ``(earlier, later)`` of the first two intervals on one port that overlap.

    Sorted by (port, start), intervals overlap somewhere on a port exactly when some interval
    starts before its predecessor ends (a nested interval overlaps its predecessor too).
    """
    if begin.size < 2:
        return None
    order = np.lexsort((begin, port))
    p, b, e = port[order], begin[order], end[order]
    clash = (p[1:] == p[:-1]) & (b[1:] < e[:-1])
    if not clash.any():
        return None
    k = int(np.argmax(clash))
    return int(order[k]), int(order[k + 1])


def _check_horizon(
    horizon: int,
    send_end: IntArray,
    arrival_end: IntArray,
    reception_piece: IntArray,
    piece_name: _PieceNamer,
) -> None:
    if horizon < 0:
        raise ScheduleError(f"horizon {horizon} is negative")
    if send_end.size == 0:
        return
    latest_send = int(np.argmax(send_end))
    real_end, culprit = int(send_end[latest_send]), latest_send
    if arrival_end.size and int(arrival_end.max()) > real_end:
        latest = int(np.argmax(arrival_end))
        real_end, culprit = int(arrival_end[latest]), int(reception_piece[latest])
    if horizon < real_end:
        raise ScheduleError(
            f"horizon {horizon} is smaller than the real end {real_end} "
            f"(reached by {piece_name(culprit)})"
        )

"""An independent checker for exchange-phase schedules.

It shares no code with the schedulers or the bounds (not even the compiled resource problem):
from the phase, the pieces and the model's rules it re-derives, for every piece, the cycles in
which each port carries each of its words and the SRAM elements they touch, and rejects:

- malformed pieces (negative cycle or offset, empty; odd offset or length for ``paired64``);
- missing words, words covered twice, words beyond the transfer (each destination receives
  word ``k`` at its address ``+ 4k`` exactly once, as the pieces carry it);
- two words in one cycle on a send port or a receive port (including a ``paired64`` transfer's
  reserved source partner; a single port per tile without full duplex);
- recorded first arrivals that do not match the latency model;
- a piece whose receivers would have to select its source before the phase starts (the
  source select comes the model's lead before the write, facts §8.5);
- a send and a receive on one tile in one SRAM element at once;
- a transfer that touches a tile before an earlier transfer it depends on (overlapping bytes on
  that tile, one of them a write) has finished there;
- a horizon earlier than the last word sent or received.

A cycle-by-cycle replay is equivalent to these interval checks (every word occupies one cycle of
its windows), which run in ``O(n log n)`` with numpy instead of one step per cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from ipu_stack.errors import ScheduleError
from ipu_stack.exchange.model import (
    PAIRED64,
    ExchangeModel,
    ExchangePhase,
    PhaseSchedule,
    element_of,
    latency_model,
    lead_model,
)
from ipu_stack.target.ipu21 import WORD_BYTES

IntArray = npt.NDArray[np.int64]
_PieceNamer = Callable[[int], str]
_PAIR_BIT = 2  # facts §8.3: the paired tile is phys ^ 2 (restated here to stay independent)


def verify_schedule(
    phase: ExchangePhase, schedule: PhaseSchedule, model: ExchangeModel | None = None
) -> None:
    """Check that a schedule realises a phase under the model's rules.

    Args:
        phase: the phase (validated first).
        schedule: the schedule to check.
        model: the rules; the schedule's own ``model`` when omitted.

    Raises:
        ScheduleError: at the first violation found, naming the transfer (and piece), the tile
            and the cycle involved.
    """
    model = schedule.model if model is None else model
    phase.validate()
    count = len(phase.transfers)
    if len(schedule.pieces) != count:
        raise ScheduleError(
            f"schedule has pieces for {len(schedule.pieces)} transfers, phase has {count}"
        )
    plain_latency = latency_model(model.latency)
    paired_latency = latency_model(model.latency, paired=True)
    transfers = phase.transfers

    destination_lists = [t.destinations for t in transfers]
    piece_counts = np.fromiter(map(len, schedule.pieces), dtype=np.int64, count=count)
    total = int(piece_counts.sum())
    owner = np.repeat(np.arange(count, dtype=np.int64), piece_counts)
    first_piece = np.zeros(count, dtype=np.int64)
    np.cumsum(piece_counts[:-1], out=first_piece[1:])
    piece_number = np.arange(total, dtype=np.int64) - first_piece[owner]
    all_pieces = list(chain.from_iterable(schedule.pieces))
    send, offset, length = (
        np.fromiter(map(attrgetter(name), all_pieces), dtype=np.int64, count=total)
        for name in ("send_cycle", "offset_words", "words")
    )
    words, sources, source_addresses = (
        np.fromiter(map(attrgetter(name), transfers), dtype=np.int64, count=count)
        for name in ("words", "source", "source_address")
    )
    paired = np.fromiter(
        (model.paired and t.width == PAIRED64 for t in transfers), dtype=bool, count=count
    )

    def piece_name(k: int) -> str:
        return f"transfer {int(owner[k])} piece {int(piece_number[k])}"

    _check_pieces(send, offset, length, paired[owner], piece_name)
    _check_coverage(piece_counts, owner, offset, length, words, piece_name)

    per_cycle = np.where(paired[owner], 2, 1)
    cycles = length // per_cycle
    piece_source = sources[owner]
    send_end = send + cycles

    # Receptions: one row per (piece, destination).
    fanout = np.fromiter(map(len, destination_lists), dtype=np.int64, count=count)
    destination_start = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(fanout, out=destination_start[1:])
    flat = np.fromiter(
        chain.from_iterable(chain.from_iterable(destination_lists)),
        dtype=np.int64,
        count=2 * int(destination_start[-1]),
    ).reshape(-1, 2)
    destination_tiles, destination_addresses = flat[:, 0], flat[:, 1]
    piece_fanout = fanout[owner]
    reception_piece = np.repeat(np.arange(total, dtype=np.int64), piece_fanout)
    block = np.zeros(total, dtype=np.int64)
    np.cumsum(piece_fanout[:-1], out=block[1:])
    entry = destination_start[owner[reception_piece]] + (
        np.arange(reception_piece.size, dtype=np.int64) - block[reception_piece]
    )
    receivers = destination_tiles[entry]
    reception_source = piece_source[reception_piece]
    reception_paired = paired[owner[reception_piece]]
    latency = np.where(
        reception_paired,
        paired_latency(reception_source, receivers),
        plain_latency(reception_source, receivers),
    )
    arrival = send[reception_piece] + latency
    arrival_end = arrival + cycles[reception_piece]
    select = arrival - lead_model(model.latency)(receivers)
    if select.size and int(select.min()) < 0:
        k = int(np.argmin(select))
        raise ScheduleError(
            f"{piece_name(int(reception_piece[k]))} is sent in cycle "
            f"{int(send[reception_piece[k]])}, so tile {int(receivers[k])} would have to select "
            f"source {int(reception_source[k])} in cycle {int(select[k])}, before the phase starts"
        )

    # Send-side windows: the source, and the reserved partner of a paired piece.
    reserved = np.flatnonzero(paired[owner])
    send_tiles = np.concatenate((piece_source, piece_source[reserved] ^ _PAIR_BIT))
    send_begin = np.concatenate((send, send[reserved]))
    send_stop = np.concatenate((send_end, send_end[reserved]))
    send_piece = np.concatenate((np.arange(total), reserved))
    clash = _first_overlap(send_tiles, send_begin, send_stop)
    if clash is not None:
        a, b = clash
        raise ScheduleError(
            f"tile {int(send_tiles[b])} sends two pieces in cycle {int(send_begin[b])}: "
            f"{piece_name(int(send_piece[a]))} [{int(send_begin[a])}, {int(send_stop[a])}) and "
            f"{piece_name(int(send_piece[b]))} [{int(send_begin[b])}, {int(send_stop[b])})"
        )
    receive_tiles = np.concatenate((receivers, piece_source[reserved] ^ _PAIR_BIT))
    receive_begin = np.concatenate((arrival, send[reserved]))
    receive_stop = np.concatenate((arrival_end, send_end[reserved]))
    receive_piece = np.concatenate((reception_piece, reserved))
    clash = _first_overlap(receive_tiles, receive_begin, receive_stop)
    if clash is not None:
        a, b = clash
        pa, pb = int(receive_piece[a]), int(receive_piece[b])
        raise ScheduleError(
            f"tile {int(receive_tiles[b])} receives from two senders in cycle "
            f"{int(receive_begin[b])}: {piece_name(pa)} from tile {int(piece_source[pa])} "
            f"[{int(receive_begin[a])}, {int(receive_stop[a])}) and "
            f"{piece_name(pb)} from tile {int(piece_source[pb])} "
            f"[{int(receive_begin[b])}, {int(receive_stop[b])})"
        )
    if not model.full_duplex:
        # One port per tile; a paired piece reserves its source partner's port once.
        received = slice(0, receivers.size)
        clash = _first_overlap(
            np.concatenate((send_tiles, receive_tiles[received])),
            np.concatenate((send_begin, receive_begin[received])),
            np.concatenate((send_stop, receive_stop[received])),
        )
        if clash is not None:
            tiles = np.concatenate((send_tiles, receive_tiles[received]))
            raise ScheduleError(
                f"tile {int(tiles[clash[1]])} sends and receives at once without full duplex"
            )

    if schedule.first_arrivals is not None:
        _check_first_arrivals(
            schedule,
            owner,
            offset,
            send,
            fanout,
            destination_tiles,
            destination_start,
            latency,
            reception_piece,
            entry,
        )
    if model.sram_hazards:
        _check_elements(
            piece_source,
            source_addresses[owner] + offset * WORD_BYTES,
            length,
            send,
            send_end,
            receivers,
            destination_addresses[entry] + offset[reception_piece] * WORD_BYTES,
            length[reception_piece],
            arrival,
            arrival_end,
            reception_piece,
            piece_name,
        )
    if model.dependencies:
        _check_dependencies(
            (
                sources,
                source_addresses,
                words * WORD_BYTES,
                destination_tiles,
                destination_addresses,
            ),
            owner,
            send,
            send_end,
            reception_piece,
            entry,
            destination_start,
            arrival,
            arrival_end,
        )
    _check_horizon(schedule.horizon, send_stop, send_piece, receive_stop, receive_piece, piece_name)


def _check_pieces(
    send: IntArray,
    offset: IntArray,
    length: IntArray,
    paired: npt.NDArray[np.bool_],
    piece_name: _PieceNamer,
) -> None:
    for bad, what, values in (
        (send < 0, "negative send_cycle", send),
        (length <= 0, "non-positive words", length),
        (offset < 0, "negative offset_words", offset),
        (paired & (offset % 2 == 1), "paired64 piece at odd offset_words", offset),
        (paired & (length % 2 == 1), "paired64 piece with odd words", length),
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
    starts before its predecessor ends (if ``i < j`` overlap, so do ``i`` and ``i + 1``).
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


def _check_first_arrivals(
    schedule: PhaseSchedule,
    owner: IntArray,
    offset: IntArray,
    send: IntArray,
    fanout: IntArray,
    destination_tiles: IntArray,
    destination_start: IntArray,
    latency: IntArray,
    reception_piece: IntArray,
    entry: IntArray,
) -> None:
    assert schedule.first_arrivals is not None
    claimed = schedule.first_arrivals
    if len(claimed) != fanout.size or not np.array_equal(
        np.fromiter(map(len, claimed), dtype=np.int64, count=len(claimed)), fanout
    ):
        raise ScheduleError("first_arrivals must list one cycle per destination of each transfer")
    flat = np.fromiter(
        chain.from_iterable(claimed), dtype=np.int64, count=int(destination_start[-1])
    )
    leading = offset[reception_piece] == 0
    expected = np.full(flat.size, -1, dtype=np.int64)
    expected[entry[leading]] = send[reception_piece[leading]] + latency[leading]
    wrong = flat != expected
    if wrong.any():
        k = int(np.argmax(wrong))
        i = int(np.searchsorted(destination_start, k, side="right") - 1)
        raise ScheduleError(
            f"transfer {i}: first word recorded arriving at tile {int(destination_tiles[k])} "
            f"in cycle {int(flat[k])}, the latency model says {int(expected[k])}"
        )


def _element_rows(
    tiles: IntArray, addresses: IntArray, length: IntArray, begin: IntArray, end: IntArray
) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    first = element_of(addresses)
    last = element_of(addresses + length * WORD_BYTES - 1)
    spans = last - first + 1
    rows = np.repeat(np.arange(tiles.size), spans)
    starts = np.zeros(tiles.size, dtype=np.int64)
    np.cumsum(spans[:-1], out=starts[1:])
    element = first[rows] + np.arange(rows.size) - starts[rows]
    return rows, tiles[rows] * 1024 + element, begin[rows], end[rows]


def _check_elements(
    send_tiles: IntArray,
    read_addresses: IntArray,
    read_length: IntArray,
    send: IntArray,
    send_end: IntArray,
    receivers: IntArray,
    write_addresses: IntArray,
    write_length: IntArray,
    arrival: IntArray,
    arrival_end: IntArray,
    reception_piece: IntArray,
    piece_name: _PieceNamer,
) -> None:
    read_rows, read_key, read_begin, read_end = _element_rows(
        send_tiles, read_addresses, read_length, send, send_end
    )
    write_rows, write_key, write_begin, write_end = _element_rows(
        receivers, write_addresses, write_length, arrival, arrival_end
    )
    # Two reads (or two writes) on a tile cannot overlap once the ports are checked, so any
    # overlap on one (tile, element) is a read against a write.
    keys = np.concatenate((read_key, write_key))
    clash = _first_overlap(
        keys, np.concatenate((read_begin, write_begin)), np.concatenate((read_end, write_end))
    )
    if clash is None:
        return
    names = []
    for index in clash:
        if index < read_key.size:
            names.append(f"{piece_name(int(read_rows[index]))} reads")
        else:
            names.append(
                f"{piece_name(int(reception_piece[write_rows[index - read_key.size]]))} writes"
            )
    key = int(keys[clash[1]])
    raise ScheduleError(
        f"SRAM element hazard on tile {key // 1024} element {key % 1024}: "
        f"{names[0]} while {names[1]} at once"
    )


def _check_dependencies(
    columns: tuple[IntArray, IntArray, IntArray, IntArray, IntArray],
    owner: IntArray,
    send: IntArray,
    send_end: IntArray,
    reception_piece: IntArray,
    entry: IntArray,
    destination_start: IntArray,
    arrival: IntArray,
    arrival_end: IntArray,
) -> None:
    """Memory order: per tile, overlapping accesses (one a write) keep program order.

    Every access (a transfer's read on its source, or its write on one destination) spans a
    byte range on one tile and a cycle range (first to last cycle of its words there). Any two
    accesses of different transfers on one tile whose byte ranges overlap, one of them a write,
    must not overlap in time out of program order: the later transfer's first cycle there is at
    or after the earlier one's last. Overlapping pairs are enumerated with sorted searches.
    """
    count = columns[0].size
    big = np.iinfo(np.int64).max
    send_first = np.full(count, big, dtype=np.int64)
    send_last = np.zeros(count, dtype=np.int64)
    np.minimum.at(send_first, owner, send)
    np.maximum.at(send_last, owner, send_end)
    entries = int(destination_start[-1])
    receive_first = np.full(entries, big, dtype=np.int64)
    receive_last = np.zeros(entries, dtype=np.int64)
    np.minimum.at(receive_first, entry, arrival)
    np.maximum.at(receive_last, entry, arrival_end)
    accesses = _accesses(columns, destination_start)
    tile, low, high, transfer, is_write = accesses
    first = np.concatenate((send_first, receive_first))
    last = np.concatenate((send_last, receive_last))
    x, y = _overlapping_with_a_write(tile, low, high, is_write)
    keep = transfer[x] != transfer[y]
    x, y = x[keep], y[keep]
    early = np.where(transfer[x] < transfer[y], x, y)
    late = np.where(transfer[x] < transfer[y], y, x)
    wrong = first[late] < last[early]
    if wrong.any():
        _raise_first_dependency(accesses, first, last, np.unique(tile[early[wrong]]))


def _accesses(
    columns: tuple[IntArray, IntArray, IntArray, IntArray, IntArray], destination_start: IntArray
) -> tuple[IntArray, IntArray, IntArray, IntArray, npt.NDArray[np.bool_]]:
    """Every access as arrays ``(tile, low byte, high byte, transfer, is write)``: the reads
    (one per transfer, in order), then the writes (one per destination entry, in order).

    ``columns`` are the phase's sources, source addresses, byte sizes, destination tiles and
    destination addresses (destinations transfer by transfer, as ``destination_start`` cuts
    them)."""
    source, read_low, size, write_tile, write_low = columns
    count = source.size
    write_owner = np.repeat(np.arange(count, dtype=np.int64), np.diff(destination_start))
    tile = np.concatenate((source, write_tile))
    low = np.concatenate((read_low, write_low))
    transfer = np.concatenate((np.arange(count, dtype=np.int64), write_owner))
    high = low + size[transfer]
    is_write = np.concatenate((np.zeros(count, dtype=bool), np.ones(write_tile.size, dtype=bool)))
    return tile, low, high, transfer, is_write


def _overlapping_with_a_write(
    tile: IntArray, low: IntArray, high: IntArray, is_write: npt.NDArray[np.bool_]
) -> tuple[IntArray, IntArray]:
    """Index pairs ``(a, w)`` of accesses on one tile whose byte ranges overlap, ``w`` a write
    (every such unordered pair at least once; pairs of two writes may come twice)."""
    # Tiles and byte addresses as one sortable key: addresses stay far below 2**32.
    start = (tile << 32) | low
    stop = (tile << 32) | high
    writes = np.flatnonzero(is_write)
    by_write_start = writes[np.argsort(start[writes], kind="stable")]
    write_starts = start[by_write_start]
    by_start = np.argsort(start, kind="stable")
    starts = start[by_start]
    # A write starting inside access a (at or after a's start) ...
    a1, w1 = _ranges(
        np.searchsorted(write_starts, start, side="left"),
        np.searchsorted(write_starts, stop, side="left"),
        by_write_start,
    )
    # ... or an access starting strictly inside write w.
    w2, a2 = _ranges(
        np.searchsorted(starts, start[writes], side="right"),
        np.searchsorted(starts, stop[writes], side="left"),
        by_start,
    )
    return np.concatenate((a1, writes[w2])), np.concatenate((w1, a2))


def _ranges(begin: IntArray, end: IntArray, ids: IntArray) -> tuple[IntArray, IntArray]:
    """Pairs ``(row, ids[k])`` for every row and every ``k`` in ``[begin[row], end[row])``."""
    spans = np.maximum(end - begin, 0)
    rows = np.repeat(np.arange(begin.size, dtype=np.int64), spans)
    offsets = np.zeros(begin.size, dtype=np.int64)
    np.cumsum(spans[:-1], out=offsets[1:])
    positions = begin[rows] + np.arange(rows.size, dtype=np.int64) - offsets[rows]
    return rows, ids[positions]


def _raise_first_dependency(
    accesses: tuple[IntArray, IntArray, IntArray, IntArray, npt.NDArray[np.bool_]],
    first: IntArray,
    last: IntArray,
    bad_tiles: IntArray,
) -> None:
    """Raise for the first violation, tiles in order of first access, accesses by address."""
    tile, low, high, transfer, is_write = accesses
    # Access order of the phase: transfer by transfer, its read then its writes.
    reads = transfer.size - int(is_write.sum())
    sequence = np.lexsort((np.arange(tile.size) >= reads, transfer))
    seen_tiles = tile[sequence]
    _, first_seen = np.unique(seen_tiles, return_index=True)
    ordered = bad_tiles[np.argsort(first_seen[np.searchsorted(np.unique(seen_tiles), bad_tiles)])]
    for bad in ordered.tolist():
        rows = np.flatnonzero(tile == bad)
        items = sorted(
            zip(
                low[rows].tolist(),
                high[rows].tolist(),
                transfer[rows].tolist(),
                is_write[rows].tolist(),
                first[rows].tolist(),
                last[rows].tolist(),
                strict=True,
            )
        )
        active: list[tuple[int, int, int, bool, int, int]] = []
        for item in items:
            active = [a for a in active if a[1] > item[0]]
            for other in active:
                if not (item[3] or other[3]) or item[2] == other[2]:
                    continue
                early, late = (other, item) if other[2] < item[2] else (item, other)
                if late[4] < early[5]:
                    raise ScheduleError(
                        f"transfer {late[2]} touches tile {bad} at cycle {late[4]} before "
                        f"transfer {early[2]} (overlapping bytes, earlier in program order) "
                        f"finishes there at cycle {early[5]}"
                    )
            active.append(item)
    raise AssertionError("a dependency violation was found but not located")  # pragma: no cover


def _check_horizon(
    horizon: int,
    send_stop: IntArray,
    send_piece: IntArray,
    receive_stop: IntArray,
    receive_piece: IntArray,
    piece_name: _PieceNamer,
) -> None:
    if horizon < 0:
        raise ScheduleError(f"horizon {horizon} is negative")
    ends = np.concatenate((send_stop, receive_stop))
    if ends.size == 0:
        return
    latest = int(np.argmax(ends))
    culprit = np.concatenate((send_piece, receive_piece))[latest]
    real_end = int(ends[latest])
    if horizon < real_end:
        raise ScheduleError(
            f"horizon {horizon} is smaller than the real end {real_end} "
            f"(reached by {piece_name(int(culprit))})"
        )

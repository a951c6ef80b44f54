"""``lower_exchanges``: a scheduled exchange phase -> per-tile timed rows of encoded words.

Sending side: for every piece, a ``send`` at the piece's cycle (chunks of at most 64 items,
facts §8.5; ``sctl`` = the fabric direction bits of its destinations (facts §8.4, 3 for both),
plus 4 for 64-bit paired items). Receiving side: for every window in which words are written
(the piece's send cycle plus the pair's latency, ``target.topology.exchange_latency``, the
model the scheduler used): a ``delayxpic`` selecting the source ``mux_lead`` cycles before its
first write (``52 + 2 x physical row``, facts §9; selector 1: 64-bit paired items), i.e. one
cycle after the first word reaches the mux; one selecting no source as long before its end
(unless the next window starts there); a PIC pointer write (acting from the next cycle) in
the cycles before the first write, unless the pointer has advanced there already; a PIC and
an XPIC write of one cycle share a directionless ``sendpicp``. The scheduler releases each
piece no earlier than its receivers' source selects allow (cycle >= 0).

Gaps are ``delay``s; a gap longer than a control's event field (``delaypic`` 128,
``delayxpic`` 4096) becomes a ``delay`` (at most 0x80000 events each) plus the control. Rows
begin ``ROW_LEAD`` cycles before the schedule's cycle 0 so a window at cycle 0 can have its
pointer set. A phase that cannot be encoded (receive windows overlapping on one tile) raises
:class:`EncodeError` naming the tile and cycle; nothing is encoded wrongly.

The whole phase is encoded at once with NumPy (:func:`encode_rows` on the flat
:class:`PhaseTables`): events of every tile sorted together, word fields packed by
:func:`ipu_stack.tilecode.encode.encode_many`. A PIC write goes in the latest cycle from the
previous window's last arrival to the one before its window's first that holds no XPIC write
(else that latest cycle, shared as a ``sendpicp``); these ranges are disjoint per tile.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import chain

import numpy as np

from ipu_stack.exchange.model import ExchangePhase, PhaseSchedule, phase_arrays
from ipu_stack.target import topology
from ipu_stack.target.ipu21 import WORD_BYTES
from ipu_stack.tilecode.encode import EncodeError, encode, encode_many
from ipu_stack.tilecode.isa_table import (
    FORMS,
    LINK_REGISTER,
    MUX_NONE,
    PIC_POINTER,
    SCTL_PAIRED,
    XPIC_PAIRED,
)

ROW_LEAD = 2  # row cycles before the schedule's cycle 0 (assumed, see module docstring)
SEND_ITEMS_MAX = 64  # facts §8.5: a send covers at most 64 words (items)
PIC_EVENTS_MAX = 1 << 7  # facts §9.1: 7-bit events - 1
XPIC_EVENTS_MAX = 1 << 12  # facts §9.1: 12-bit events - 1
DELAY_EVENTS_MAX = 1 << 19  # facts §9.1: a delay waits at most 0x80000 events
_XPIC, _PIC, _PICP, _SEND, _TAIL = 0, 1, 2, 3, 4  # event kinds (controls sort before a send)
_TILE_SHIFT = 40  # (tile << 40) | row cycle: one sortable key per tile and cycle

IntArray = np.ndarray


@dataclass(frozen=True, slots=True)
class PhaseTables:
    """A scheduled phase as flat arrays (what the row encoder reads; addresses in bytes)."""

    sources: IntArray  # per transfer: source tile
    source_addresses: IntArray  # per transfer
    words: IntArray  # per transfer
    paired: np.ndarray  # per transfer (bool)
    sctl: IntArray  # per transfer: direction bits of its destinations | SCTL_PAIRED
    dest_starts: IntArray  # per transfer + 1: its first destination
    dest_tiles: IntArray  # per destination
    dest_addresses: IntArray  # per destination
    latency: IntArray  # per destination: cycles from send to the write
    lead: IntArray  # per destination: cycles from its source select to the write
    piece_transfer: IntArray  # per piece (transfer order, then piece order)
    piece_cycle: IntArray
    piece_offset: IntArray  # words into the transfer
    piece_words: IntArray

    def shifted(self, source_shift: IntArray, dest_shift: IntArray) -> PhaseTables:
        """The same schedule with every source / destination address moved by its shift."""
        return replace(
            self,
            source_addresses=self.source_addresses + source_shift,
            dest_addresses=self.dest_addresses + dest_shift,
        )


def phase_tables(phase: ExchangePhase, schedule: PhaseSchedule) -> PhaseTables:
    """The :class:`PhaseTables` of ``phase`` scheduled by ``schedule``."""
    arrays = phase_arrays(phase)
    owner = arrays.destination_transfers
    src = arrays.sources[owner]
    dst = arrays.destination_tiles
    paired = arrays.paired
    latency = np.where(
        paired[owner],
        topology.paired_exchange_latency(src, dst),
        topology.exchange_latency(src, dst),
    )
    sctl = np.zeros(len(phase.transfers), np.int64)
    np.bitwise_or.at(sctl, owner, np.asarray(topology.direction(src, dst), np.int64))
    sctl |= np.where(paired, SCTL_PAIRED, 0)
    counts = np.fromiter(map(len, schedule.pieces), np.int64, len(schedule.pieces))
    total = int(counts.sum())
    flat = list(chain.from_iterable(schedule.pieces))
    return PhaseTables(
        sources=arrays.sources,
        source_addresses=arrays.source_addresses,
        words=arrays.words,
        paired=paired,
        sctl=sctl,
        dest_starts=arrays.destination_starts,
        dest_tiles=dst,
        dest_addresses=arrays.destination_addresses,
        latency=np.asarray(latency, np.int64),
        lead=np.asarray(topology.mux_lead(dst), np.int64),
        piece_transfer=np.repeat(np.arange(len(counts), dtype=np.int64), counts),
        piece_cycle=np.fromiter((p.send_cycle for p in flat), np.int64, total),
        piece_offset=np.fromiter((p.offset_words for p in flat), np.int64, total),
        piece_words=np.fromiter((p.words for p in flat), np.int64, total),
    )


def _expand(counts: IntArray) -> tuple[IntArray, IntArray]:
    """``(owner, k)`` for ``k in range(counts[owner])`` over every owner, in order."""
    owner = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    first = np.cumsum(counts) - counts
    return owner, np.arange(len(owner), dtype=np.int64) - first[owner]


def _items(t: PhaseTables) -> tuple[IntArray, IntArray]:
    """Per piece: items (64-bit items count as one) and words per item."""
    wpi = np.where(t.paired, 2, 1)[t.piece_transfer]
    items = t.piece_words // wpi
    if len(items) and int(items.min()) < 1:
        k = int(np.argmax(items < 1))
        raise EncodeError(
            f"transfer {int(t.piece_transfer[k])}: a piece of {int(t.piece_words[k])} words "
            "holds no item; the phase cannot be encoded"
        )
    return items, wpi


def _sends(t: PhaseTables, items: IntArray, wpi: IntArray) -> dict[str, IntArray]:
    """Send events: every piece in chunks of at most ``SEND_ITEMS_MAX`` items."""
    piece, k = _expand((items + SEND_ITEMS_MAX - 1) // SEND_ITEMS_MAX)
    transfer = t.piece_transfer[piece]
    first = k * SEND_ITEMS_MAX
    base = t.source_addresses[transfer] // WORD_BYTES + t.piece_offset[piece]
    words = encode_many(
        "send",
        count_m1=np.minimum(SEND_ITEMS_MAX, items[piece] - first) - 1,
        word_address=base + first * wpi[piece],
        sctl=t.sctl[transfer],
    )
    return {
        "tile": t.sources[transfer],
        "cycle": t.piece_cycle[piece] + first + ROW_LEAD,
        "word0": words,
    }


def _windows(t: PhaseTables, items: IntArray) -> dict[str, IntArray]:
    """Receive windows of every destination tile, sorted by tile then first cycle (stable)."""
    fanout = np.diff(t.dest_starts)[t.piece_transfer]
    piece, j = _expand(fanout)
    transfer = t.piece_transfer[piece]
    dest = t.dest_starts[transfer] + j
    start = t.piece_cycle[piece] + t.latency[dest]
    tile = t.dest_tiles[dest]
    order = _sort_by_tile(tile, start, 0)
    if order is None:  # windows sharing a first cycle (they overlap: an error below)
        order = np.lexsort((start, tile))
    piece, transfer, dest = piece[order], transfer[order], dest[order]
    start = start[order]
    return {
        "tile": tile[order],
        "start": start,
        "end": start + items[piece],
        "source": t.sources[transfer],
        "pointer": t.dest_addresses[dest] // WORD_BYTES + t.piece_offset[piece],
        "paired": t.paired[transfer].astype(np.int64),
        "lead": t.lead[dest],
    }


def _check_overlaps(w: dict[str, IntArray]) -> None:
    same = w["tile"][1:] == w["tile"][:-1]
    bad = same & (w["start"][1:] < w["end"][:-1])
    if bad.any():
        k = int(np.argmax(bad))
        raise EncodeError(
            f"tile {int(w['tile'][k + 1])}: receive windows overlap at cycle "
            f"{int(w['start'][k + 1])} (sources {int(w['source'][k])} and "
            f"{int(w['source'][k + 1])}); the phase cannot be encoded"
        )


def _member(keys: IntArray, sorted_keys: IntArray) -> np.ndarray:
    at = np.minimum(np.searchsorted(sorted_keys, keys), max(len(sorted_keys) - 1, 0))
    return sorted_keys[at] == keys if len(sorted_keys) else np.zeros(len(keys), bool)


def _controls(w: dict[str, IntArray], merge_pointers: bool) -> dict[str, IntArray]:
    """Control events (XPIC, PIC, shared ``sendpicp``) of every tile's receive windows.

    The XPIC ``lead`` cycles before a window's first write selects the source (selector 1
    for 64-bit paired items, assumed); one selecting no source follows as long before its end
    unless the next window starts there. A window whose first word lands where the previous
    one's pointer has advanced to needs no PIC write (``merge_pointers``; off in loop bodies,
    whose rows must have the same size every iteration).
    """
    tile, start, end = w["tile"], w["start"], w["end"]
    count = len(tile)
    first = np.ones(count, bool)
    first[1:] = tile[1:] != tile[:-1]
    last = np.ones(count, bool)
    last[:-1] = first[1:]
    follows = np.zeros(count, bool)  # the next window starts where this one ends
    follows[:-1] = ~last[:-1] & (start[1:] == end[:-1])
    closing = ~follows
    x_tile = np.concatenate([tile, tile[closing]])
    lead = w["lead"]
    x_cycle = np.concatenate([start - lead, (end - lead)[closing]]) + ROW_LEAD
    if len(x_cycle) and int(x_cycle.min()) < ROW_LEAD:
        k = int(np.argmin(x_cycle))
        raise EncodeError(
            f"tile {int(x_tile[k])}: a source select would act at cycle "
            f"{int(x_cycle[k]) - ROW_LEAD}, before the phase starts; the phase cannot be encoded"
        )
    x_sel = np.concatenate([w["paired"] * XPIC_PAIRED, np.zeros(int(closing.sum()), np.int64)])
    x_value = np.concatenate([w["source"], np.full(int(closing.sum()), MUX_NONE, np.int64)])
    x_key = (x_tile << _TILE_SHIFT) | x_cycle
    fixed = np.sort(x_key)

    prev_end = np.roll(end, 1)
    needed = np.ones(count, bool)
    if merge_pointers and count:
        wpi = 1 + w["paired"]
        advanced = np.roll(w["pointer"] + (end - start) * wpi, 1)
        needed = first | (w["pointer"] != advanced)
    low = np.where(first, 1, prev_end - 1 + ROW_LEAD)[needed]
    high = start[needed] - 1 + ROW_LEAD
    p_tile = tile[needed]
    cycle = high.copy()
    while True:  # the latest cycle in [low, high] without an XPIC write
        busy = (cycle >= low) & _member((p_tile << _TILE_SHIFT) | cycle, fixed)
        if not busy.any():
            break
        cycle -= busy
    cycle = np.where(cycle < low, high, cycle)  # none free: share the latest one
    p_key = (p_tile << _TILE_SHIFT) | cycle
    p_pointer = w["pointer"][needed]

    shared_x = _member(x_key, np.sort(p_key))
    x_pointer = np.zeros(len(x_key), np.int64)
    if shared_x.any():
        by_key = np.argsort(p_key)
        x_pointer[shared_x] = p_pointer[by_key[np.searchsorted(p_key[by_key], x_key[shared_x])]]
    alone = ~_member(p_key, fixed)
    n_alone = int(alone.sum())
    # the controls' words, events 1 (``encode_rows`` adds the waits once rows are ordered)
    xpic = encode_many("delayxpic", events_m1=0, sel=x_sel, value=x_value)
    pic = encode_many("delaypic", events_m1=0, sel=PIC_POINTER, value=p_pointer[alone])
    picp = encode("sendpicp", picsel=PIC_POINTER, count_m1=0, word_address=0, sctl=0)
    word1 = np.zeros(len(x_key) + n_alone, np.int64)
    word1[: len(x_key)][shared_x] = encode_many(
        "picword", xpic=(x_sel[shared_x] << 13) | x_value[shared_x], pic=x_pointer[shared_x]
    )
    return {
        "tile": np.concatenate([x_tile, p_tile[alone]]),
        "cycle": np.concatenate([x_cycle, cycle[alone]]),
        "kind": np.concatenate([np.where(shared_x, _PICP, _XPIC), np.full(n_alone, _PIC)]),
        "word0": np.concatenate([np.where(shared_x, picp, xpic), pic]),
        "word1": word1,
    }


def _tails(
    w: dict[str, IntArray], sends: dict[str, IntArray], controls: dict[str, IntArray]
) -> dict[str, IntArray]:
    """A closing wait on every tile whose last word is written after its last instruction:
    the row must not return (and the tile compute) before its words have landed. An event
    with no word of its own: only the ``delay``s before it."""
    tile = w["tile"]
    last = np.ones(len(tile), bool)
    last[:-1] = tile[1:] != tile[:-1]
    r_tile, r_cycle = tile[last], w["end"][last] - 1 + ROW_LEAD  # the last write's cycle
    other = np.concatenate([sends["tile"], controls["tile"]])
    other_cycle = np.concatenate([sends["cycle"], controls["cycle"]])
    latest = np.full(len(r_tile), -1, np.int64)
    if len(other):
        order = np.lexsort((other_cycle, other))
        ot, oc = other[order], other_cycle[order]
        at = np.searchsorted(ot, r_tile, side="right") - 1
        ok = (at >= 0) & (ot[np.maximum(at, 0)] == r_tile)
        latest = np.where(ok, oc[np.maximum(at, 0)], -1)
    need = r_cycle > latest
    n = int(need.sum())
    return {
        "tile": r_tile[need],
        "cycle": r_cycle[need],
        "kind": np.full(n, _TAIL, np.int64),
        "word0": np.zeros(n, np.int64),
        "word1": np.zeros(n, np.int64),
    }


def _events(
    sends: dict[str, IntArray], controls: dict[str, IntArray], tails: dict[str, IntArray]
) -> dict[str, IntArray]:
    """Every event of the phase, per tile in row order (a control before a send of its cycle)."""
    n_send = len(sends["tile"])
    e = {
        "tile": np.concatenate([controls["tile"], tails["tile"], sends["tile"]]),
        "cycle": np.concatenate([controls["cycle"], tails["cycle"], sends["cycle"]]),
        "kind": np.concatenate([controls["kind"], tails["kind"], np.full(n_send, _SEND)]),
        "word0": np.concatenate([controls["word0"], tails["word0"], sends["word0"]]),
        "word1": np.concatenate([controls["word1"], tails["word1"], np.zeros(n_send, np.int64)]),
    }
    is_send = (e["kind"] == _SEND).astype(np.int64)
    order = _sort_by_tile(e["tile"], e["cycle"], is_send)
    if order is None:  # sends sharing a cycle (not from a valid schedule): by their words,
        # i.e. by (items, address, sctl), the fields' order in a send word
        order = np.lexsort((e["word0"], is_send, e["cycle"], e["tile"]))
    return {k: v[order] for k, v in e.items()}


def _sort_by_tile(tile: IntArray, cycle: IntArray, last: IntArray | int) -> IntArray | None:
    """The order by ``(tile, cycle, last)`` (``last`` 0 or 1) from one int64 key; None when
    two items share a key or a cycle does not fit it (the caller sorts those its own way)."""
    if len(tile) and (int(cycle.min()) < 0 or int(cycle.max()) >= 1 << (_TILE_SHIFT - 1)):
        return None
    key = (tile << _TILE_SHIFT) | (cycle << 1) | last
    order = np.argsort(key)
    ordered = key[order]
    if len(ordered) > 1 and bool((ordered[1:] == ordered[:-1]).any()):
        return None
    return order


def _delays(events: IntArray) -> tuple[IntArray, IntArray]:
    """Per wait: the number of ``delay`` words and the last one's word (the others are full)."""
    count = (events + DELAY_EVENTS_MAX - 1) // DELAY_EVENTS_MAX
    rest = events - np.maximum(count - 1, 0) * DELAY_EVENTS_MAX
    last = encode_many("delay", events_m1=np.where(count > 0, rest - 1, 0))
    return count, last


def _field_shift(mnemonic: str, name: str) -> int:
    return next(shift for field, shift, _ in FORMS[mnemonic].fields if field == name)


_EVENTS_SHIFT = {
    _XPIC: _field_shift("delayxpic", "events_m1"),
    _PIC: _field_shift("delaypic", "events_m1"),
}


def encode_rows(t: PhaseTables, merge_pointers: bool = True) -> dict[int, np.ndarray]:
    """Every tile's encoded row for one phase given as :class:`PhaseTables` (see
    :func:`lower_phase`)."""
    items, wpi = _items(t)
    windows = _windows(t, items)
    _check_overlaps(windows)
    sends, controls = _sends(t, items, wpi), _controls(windows, merge_pointers)
    e = _events(sends, controls, _tails(windows, sends, controls))
    tile, cycle, kind = e["tile"], e["cycle"], e["kind"]
    count = len(tile)
    if not count:
        return {}
    first = np.ones(count, bool)
    first[1:] = tile[1:] != tile[:-1]
    gap = cycle - np.where(first, 0, np.roll(cycle, 1))
    control = (kind == _XPIC) | (kind == _PIC)
    if (control & (gap < 1)).any():  # pragma: no cover - controls get distinct cycles >= 1
        k = int(np.argmax(control & (gap < 1)))
        raise EncodeError(f"tile {int(tile[k])}: two controls at row cycle {int(cycle[k])}")
    limit = np.where(kind == _PIC, PIC_EVENTS_MAX, XPIC_EVENTS_MAX)
    wait = np.where(control, np.minimum(gap, limit), 0)
    delays, last_delay = _delays(gap - wait)
    mains = np.where(kind == _PICP, 2, np.where(kind == _TAIL, 0, 1))
    pad = _sendpicp_pads(first, kind == _PICP, delays + mains, delays)
    # a control waits ``wait`` events: events - 1 in its field (within it: wait <= limit)
    shift = np.where(kind == _PIC, _EVENTS_SHIFT[_PIC], _EVENTS_SHIFT[_XPIC])
    main0 = e["word0"] + np.where(control, (wait - 1) << shift, 0)
    return _assemble_rows(tile, first, delays, last_delay, pad, mains, main0, e["word1"])


def _sendpicp_pads(
    first: np.ndarray, picp: np.ndarray, counts: IntArray, delays: IntArray
) -> IntArray:
    """1 where a ``sendpicp`` needs a padding word to start on an 8-byte boundary (facts §8.5).

    A row starts aligned and each ``sendpicp`` ends aligned, so the parity before one is that
    of the words since the row's start or the previous ``sendpicp``.
    """
    before = np.cumsum(counts) - counts  # words before each event, pads left out
    reset = first.copy()
    reset[1:] |= picp[:-1]
    since = np.maximum.accumulate(np.where(reset, np.arange(len(first)), 0))
    return (picp & (((before - before[since] + delays) & 1) == 1)).astype(np.int64)


def _assemble_rows(
    tile: IntArray,
    first: np.ndarray,
    delays: IntArray,
    last_delay: IntArray,
    pad: IntArray,
    mains: IntArray,
    main0: IntArray,
    main1: IntArray,
) -> dict[int, np.ndarray]:
    """The words of every event, each tile's row closed by ``br $m10`` (and a 0 to stay
    8-byte aligned), split into rows by tile: each word scattered to its place."""
    starts = np.flatnonzero(first)
    per_event = delays + pad + mains
    tile_words = np.add.reduceat(per_event, starts)
    row_length = tile_words + 1 + ((tile_words + 1) & 1)
    row_start = np.cumsum(row_length) - row_length
    group = np.cumsum(first) - 1  # each event's row
    before = np.cumsum(per_event) - per_event
    at = row_start[group] + before - before[starts][group]  # each event's first word
    words = np.zeros(int(row_length.sum()), np.uint32)  # a row's closing pad stays 0
    main_at = at + delays + pad
    one = mains > 0
    words[main_at[one]] = main0[one]
    two = mains == 2
    words[main_at[two] + 1] = main1[two]
    padded = pad == 1
    words[(at + delays)[padded]] = encode("send", count_m1=0, word_address=0, sctl=0)
    waits = delays > 0
    words[(at + delays - 1)[waits]] = last_delay[waits]
    full = delays > 1  # waits beyond one delay: full delays before the last one
    if full.any():
        event, k = _expand(delays[full] - 1)
        words[at[full][event] + k] = encode("delay", events_m1=DELAY_EVENTS_MAX - 1)
    words[row_start + tile_words] = encode("br", reg=LINK_REGISTER)
    ends = row_start + row_length
    return {
        name: words[lo:hi]
        for name, lo, hi in zip(
            tile[starts].tolist(), row_start.tolist(), ends.tolist(), strict=True
        )
    }


def lower_phase(
    phase: ExchangePhase, schedule: PhaseSchedule, merge_pointers: bool = True
) -> dict[int, np.ndarray]:
    """Every tile's encoded row for one phase (tiles with nothing to do are left out).

    Each row ends with ``br $m10`` (the supervisor calls it).

    Raises:
        EncodeError: the phase cannot be encoded within the field limits (names tile, cycle).
    """
    return encode_rows(phase_tables(phase, schedule), merge_pointers)

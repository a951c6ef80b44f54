"""The vectorised exchange-row encoder against the per-tile one it replaced (same words).

``reference_rows`` is the former ``lower_phase``: a Python loop per tile, window and word,
each word through the scalar ``encode``. Random phases and schedules (multicast, paired items,
back-to-back pieces whose windows touch or continue a pointer, gaps beyond every event field)
must give identical rows, or the same error.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipu_stack.exchange.model import (
    PAIRED64,
    WORD32,
    ExchangePhase,
    PhaseSchedule,
    Piece,
    phase_arrays,
)
from ipu_stack.target import topology
from ipu_stack.target.ipu21 import WORD_BYTES
from ipu_stack.tilecode.encode import EncodeError, delay_words, encode
from ipu_stack.tilecode.exchange_rows import lower_phase
from ipu_stack.tilecode.isa_table import (
    LINK_REGISTER,
    MUX_NONE,
    PIC_POINTER,
    SCTL_PAIRED,
    XPIC_PAIRED,
)

ROW_LEAD = 2
SEND_ITEMS_MAX = 64
PIC_EVENTS_MAX = 1 << 7
XPIC_EVENTS_MAX = 1 << 12
_CONTROL, _SEND = 0, 1


@dataclass(frozen=True, slots=True)
class Window:
    """Cycles ``[start, end)`` in which a tile receives from ``source`` at ``pointer``."""

    start: int
    end: int
    source: int
    pointer: int  # word address
    paired: bool
    lead: int  # cycles from the source select to the first write


def _ref_events(
    phase: ExchangePhase, schedule: PhaseSchedule
) -> tuple[dict[int, list[tuple[int, int, int, int]]], dict[int, list[Window]]]:
    """Send events ``(cycle, items, word address, sctl)`` and receive windows, per tile."""
    sends: dict[int, list[tuple[int, int, int, int]]] = defaultdict(list)
    windows: dict[int, list[Window]] = defaultdict(list)
    arrays = phase_arrays(phase)
    owner = arrays.destination_transfers
    src = arrays.sources[owner]
    dst = arrays.destination_tiles
    paired_d = arrays.paired[owner]
    lat = np.where(
        paired_d,
        topology.paired_exchange_latency(src, dst),
        topology.exchange_latency(src, dst),
    ).tolist()
    direction = np.asarray(topology.direction(src, dst), np.int64)
    sctls = np.zeros(len(phase.transfers), np.int64)
    np.bitwise_or.at(sctls, owner, direction)
    starts = arrays.destination_starts.tolist()
    for i, (transfer, pieces) in enumerate(zip(phase.transfers, schedule.pieces, strict=True)):
        paired = transfer.width == PAIRED64
        wpi = 2 if paired else 1
        sctl = int(sctls[i]) | (SCTL_PAIRED if paired else 0)
        latency = lat[starts[i] : starts[i + 1]]
        for piece in pieces:
            items = piece.words // wpi
            base = transfer.source_address // WORD_BYTES + piece.offset_words
            for k in range(0, items, SEND_ITEMS_MAX):
                n = min(SEND_ITEMS_MAX, items - k)
                sends[transfer.source].append((piece.send_cycle + k, n, base + k * wpi, sctl))
            for (tile, address), delay in zip(transfer.destinations, latency, strict=True):
                start = piece.send_cycle + delay
                pointer = address // WORD_BYTES + piece.offset_words
                lead = topology.mux_lead(tile)
                windows[tile].append(
                    Window(start, start + items, transfer.source, pointer, paired, lead)
                )
    return sends, windows


def _ref_controls(
    tile: int, windows: list[Window], merge_pointers: bool
) -> list[tuple[int, str, tuple[int, ...]]]:
    """Control writes ``(row cycle, mnemonic, arguments)`` for one tile's receive windows.

    The XPIC ``lead`` cycles before a window's first write selects the source (selector 1 for
    64-bit paired items, assumed); one selecting no source follows as long before its end
    unless the next window starts there.
    A window whose
    first word lands where the previous one's pointer has advanced to needs no PIC write
    (``merge_pointers``; off in loop bodies, whose rows must have the same size every
    iteration).
    """
    windows = sorted(windows, key=lambda w: w.start)
    fixed: dict[int, tuple[str, int, int]] = {}
    for i, w in enumerate(windows):
        fixed[w.start - w.lead + ROW_LEAD] = (
            "delayxpic",
            XPIC_PAIRED if w.paired else 0,
            w.source,
        )
        following = windows[i + 1].start if i + 1 < len(windows) else None
        if following != w.end:  # a selected source must deliver every cycle (a fault if not)
            fixed[w.end - w.lead + ROW_LEAD] = ("delayxpic", 0, MUX_NONE)
    pics: dict[int, int] = {}
    previous: Window | None = None
    for w in windows:
        if previous is not None and merge_pointers:
            wpi = 2 if previous.paired else 1
            if w.pointer == previous.pointer + (previous.end - previous.start) * wpi:
                previous = w
                continue  # the pointer has advanced to this window's first word already
        # a PIC write acts from the next cycle: any cycle from the previous window's last
        # arrival to the one before this window's first; one holding an XPIC write is shared
        # with it (a directionless sendpicp writes both)
        low = 1 if previous is None else previous.end - 1 + ROW_LEAD
        cycle = next((c for c in range(w.start - 1 + ROW_LEAD, low - 1, -1)
                      if c not in pics and c not in fixed), None)  # fmt: skip
        if cycle is None:
            cycle = next((c for c in range(w.start - 1 + ROW_LEAD, low - 1, -1)
                          if c not in pics), None)  # fmt: skip
        if cycle is None:  # pragma: no cover - windows hold >= 1 word, so ranges are disjoint
            raise EncodeError(
                f"tile {tile}: no cycle for the pointer of the receive window at cycle "
                f"{w.start} (from tile {w.source}); the phase cannot be encoded"
            )
        pics[cycle] = w.pointer
        previous = w
    out: list[tuple[int, str, tuple[int, ...]]] = []
    for c, (_, sel, value) in fixed.items():
        if c in pics:
            out.append((c, "sendpicp", (sel, value, pics.pop(c))))
        else:
            out.append((c, "delayxpic", (sel, value)))
    out += [(c, "delaypic", (PIC_POINTER, value)) for c, value in pics.items()]
    return out


def _ref_overlaps(tile: int, windows: list[Window]) -> None:
    windows = sorted(windows, key=lambda w: w.start)
    for i, w in enumerate(windows):
        if i and w.start < windows[i - 1].end:
            raise EncodeError(
                f"tile {tile}: receive windows overlap at cycle {w.start} (sources "
                f"{windows[i - 1].source} and {w.source}); the phase cannot be encoded"
            )


def reference_rows(
    phase: ExchangePhase, schedule: PhaseSchedule, merge_pointers: bool = True
) -> dict[int, np.ndarray]:
    """Every tile's encoded row for one phase (tiles with nothing to do are left out).

    Each row ends with ``br $m10`` (the supervisor calls it).

    Raises:
        EncodeError: the phase cannot be encoded within the field limits (names tile, cycle).
    """
    sends, windows = _ref_events(phase, schedule)
    for tile in sorted(windows):
        _ref_overlaps(tile, windows[tile])
    early = min(
        ((w.start - w.lead, tile) for tile in sorted(windows) for w in windows[tile]),
        default=(0, 0),
    )
    if early[0] < 0:
        raise EncodeError(
            f"tile {early[1]}: a source select would act at cycle {early[0]}, before the phase "
            "starts; the phase cannot be encoded"
        )
    rows: dict[int, np.ndarray] = {}
    for tile in sorted(set(sends) | set(windows)):
        controls = _ref_controls(tile, windows.get(tile, []), merge_pointers)
        events: list[tuple[int, int, tuple[int, ...], str]] = [
            (c, _CONTROL, args, mnemonic) for c, mnemonic, args in controls
        ]
        events += [(c + ROW_LEAD, _SEND, (n, a, s), "send") for c, n, a, s in sends.get(tile, [])]
        events.sort()
        words: list[int] = []
        clock = 0
        for cycle, order, args, mnemonic in events:
            gap = cycle - clock
            if order == _SEND:
                words += delay_words(gap)
                n, address, sctl = args
                words.append(encode("send", count_m1=n - 1, word_address=address, sctl=sctl))
            elif mnemonic == "sendpicp":
                words += delay_words(gap)
                if len(words) % 2:  # the prefix starts on an 8-byte boundary (facts §8.5)
                    words.append(encode("send", count_m1=0, word_address=0, sctl=0))
                xsel, xvalue, pointer = args
                words.append(encode("sendpicp", picsel=PIC_POINTER, count_m1=0, word_address=0,
                                    sctl=0))  # fmt: skip
                words.append(encode("picword", xpic=(xsel << 13) | xvalue, pic=pointer))
            else:
                if gap < 1:  # pragma: no cover - controls get distinct cycles >= 1
                    raise EncodeError(f"tile {tile}: two controls at row cycle {cycle}")
                limit = PIC_EVENTS_MAX if mnemonic == "delaypic" else XPIC_EVENTS_MAX
                wait = min(gap, limit)
                words += delay_words(gap - wait)
                sel, value = args
                words.append(encode(mnemonic, events_m1=wait - 1, sel=sel, value=value))
            clock = cycle
        last_write = max((w.end - 1 + ROW_LEAD for w in windows.get(tile, [])), default=-1)
        if last_write > clock:  # the row returns only once its last word has landed
            words += delay_words(last_write - clock)
        words.append(encode("br", reg=LINK_REGISTER))
        if len(words) % 2:  # rows stay 8-byte aligned one after another
            words.append(0)
        rows[tile] = np.asarray(words, dtype=np.uint32)
    return rows


# -- random phases ----------------------------------------------------------------------------
TILE_POOL = [0, 1, 2, 3, 6, 7, 40, 41, 700, 702, 1400, 1471]
GAPS = [0, 1, 2, 3, 50, 127, 128, 129, 4095, 4097, 6000, (1 << 19) + 5, 3 * (1 << 19)]


@st.composite
def scheduled_phases(draw: st.DrawFn) -> tuple[ExchangePhase, PhaseSchedule]:
    """A phase and pieces far enough apart (or exactly back to back) that windows never
    overlap, except when ``clash`` starts one piece early on purpose."""
    from ipu_stack.exchange.model import Transfer

    transfers, pieces = [], []
    cycle = 78 + draw(st.integers(0, 3))  # releases are at most 77 cycles
    for _ in range(draw(st.integers(1, 6))):
        source = draw(st.sampled_from(TILE_POOL))
        others = [t for t in TILE_POOL if t != source]
        dests = draw(st.lists(st.sampled_from(others), min_size=1, max_size=3, unique=True))
        paired = draw(st.booleans())
        words = draw(st.integers(1, 150)) * (2 if paired else 1)
        address = 0x90000 + 8 * draw(st.integers(0, 1000))
        destinations = tuple((t, 0xA0000 + 8 * draw(st.integers(0, 1000))) for t in dests)
        transfers.append(
            Transfer(source, address, destinations, words, PAIRED64 if paired else WORD32)
        )
        own = []
        offset = 0
        while offset < words:
            size = min(words - offset, draw(st.integers(1, 90)) * (2 if paired else 1))
            own.append(Piece(cycle, offset, size))
            back_to_back = draw(st.booleans())
            cycle += size // (2 if paired else 1)
            if not back_to_back:
                cycle += 80 + draw(st.sampled_from(GAPS))
            offset += size
        cycle += 80 + draw(st.sampled_from(GAPS))
        pieces.append(tuple(own))
    if draw(st.booleans()) and len(pieces) > 1:  # a clash: the last transfer starts at 0
        last = pieces[-1]
        early = draw(st.integers(0, 3)) + draw(st.sampled_from([0, 78]))  # 0..3: no release
        shift = last[0].send_cycle - early
        pieces[-1] = tuple(Piece(p.send_cycle - shift, p.offset_words, p.words) for p in last)
    schedule = PhaseSchedule(tuple(pieces), horizon=cycle, kind="test")
    return ExchangePhase(tuple(transfers)), schedule


def _outcome(fn, phase, schedule, merge):
    try:
        rows = fn(phase, schedule, merge)
    except EncodeError as err:
        return str(err)
    return {tile: row.tolist() for tile, row in rows.items()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheduled_phases(), st.booleans())
def test_vectorised_rows_equal_the_per_tile_encoder(case, merge):
    phase, schedule = case
    want = _outcome(reference_rows, phase, schedule, merge)
    got = _outcome(lower_phase, phase, schedule, merge)
    assert got == want
    if isinstance(want, dict):
        assert list(_outcome(lower_phase, phase, schedule, merge)) == sorted(want)


def test_a_changed_encoding_is_caught():
    """The comparison is not vacuous: one different word in a row fails it."""
    from ipu_stack.exchange.model import Transfer

    phase = ExchangePhase((Transfer(0, 0x90000, ((1, 0xA0000), (40, 0xA0100)), 100),))
    schedule = PhaseSchedule(((Piece(80, 0, 60), Piece(140, 60, 40)),), horizon=400, kind="t")
    want = reference_rows(phase, schedule, True)
    got = lower_phase(phase, schedule, True)
    assert {t: r.tolist() for t, r in got.items()} == {t: r.tolist() for t, r in want.items()}
    got[1][0] ^= 1
    assert {t: r.tolist() for t, r in got.items()} != {t: r.tolist() for t, r in want.items()}
    with pytest.raises(EncodeError, match="overlap"):
        clash = PhaseSchedule(((Piece(80, 0, 60), Piece(110, 60, 40)),), horizon=400, kind="t")
        lower_phase(phase, clash, True)
    with pytest.raises(EncodeError, match="before the phase starts"):
        lower_phase(phase, PhaseSchedule(((Piece(0, 0, 100),),), horizon=400, kind="t"), True)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["send", "delaypic", "delayxpic", "picword", "add", "delay"]), st.data())
def test_encode_many_matches_encode_word_for_word(mnemonic, data):
    """The vectorised encoder gives the scalar one's words, and refuses what it refuses."""
    from ipu_stack.tilecode.encode import encode_many
    from ipu_stack.tilecode.isa_table import FORMS, SIGNED_FIELDS

    values: dict[str, list[int]] = {}
    for name, _, width in FORMS[mnemonic].fields:
        signed = (mnemonic, name) in SIGNED_FIELDS
        lo, hi = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
        values[name] = data.draw(st.lists(st.integers(lo - 1, hi + 1), min_size=1, max_size=6))
    n = min(len(v) for v in values.values())
    columns = {k: v[:n] for k, v in values.items()}
    want: list[int] | str
    try:
        want = [encode(mnemonic, **{k: v[i] for k, v in columns.items()}) for i in range(n)]
    except EncodeError:
        want = "refused"
    try:
        got: list[int] | str = encode_many(mnemonic, **columns).tolist()
    except EncodeError:
        got = "refused"
    assert got == want

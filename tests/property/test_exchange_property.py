"""Property tests: greedy schedules are valid and bounded; the verifier agrees with a
brute-force word-by-word oracle and rejects deliberately broken schedules."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ipu_stack.errors import ScheduleError
from ipu_stack.exchange.bounds import endpoint_lower_bound, strongest_lower_bound
from ipu_stack.exchange.model import PORTS_ONLY, ExchangePhase, PhaseSchedule, Piece, Transfer
from ipu_stack.exchange.scheduler import schedule_phase as full_schedule_phase
from ipu_stack.exchange.verify import verify_schedule

BASE = 0x60000


def schedule_phase(phase: ExchangePhase) -> PhaseSchedule:
    """The greedy stage alone on the port model (no latency or other rules)."""
    return full_schedule_phase(phase, PORTS_ONLY, 0.0)


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def phases(draw: st.DrawFn) -> ExchangePhase:
    tile_count = draw(st.integers(2, 16))
    transfers = []
    for index in range(draw(st.integers(1, 30))):
        source = draw(st.integers(0, tile_count - 1))
        others = [tile for tile in range(tile_count) if tile != source]
        fanout = draw(st.integers(1, min(4, len(others))))
        dests = draw(
            st.lists(st.sampled_from(others), min_size=fanout, max_size=fanout, unique=True)
        )
        words = draw(st.integers(1, 40))
        transfers.append(Transfer(source, BASE + 4 * index, tuple((d, BASE) for d in dests), words))
    return ExchangePhase(tuple(transfers), tile_count)


def oracle_is_valid(phase: ExchangePhase, schedule: PhaseSchedule) -> bool:
    """Word-by-word, cycle-by-cycle check of the port model (latency "none")."""
    if len(schedule.pieces) != len(phase.transfers):
        return False
    sending: set[tuple[int, int]] = set()
    receiving: set[tuple[int, int]] = set()
    end = 0
    for transfer, pieces in zip(phase.transfers, schedule.pieces, strict=True):
        covered = [0] * transfer.words
        for piece in pieces:
            if piece.send_cycle < 0 or piece.words <= 0 or piece.offset_words < 0:
                return False
            for word in range(piece.offset_words, piece.offset_words + piece.words):
                if word >= transfer.words:
                    return False
                covered[word] += 1
            for cycle in range(piece.send_cycle, piece.send_cycle + piece.words):
                slots = [(transfer.source, cycle)]
                if slots[0] in sending:
                    return False
                sending.add(slots[0])
                for tile, _ in transfer.destinations:
                    if (tile, cycle) in receiving:
                        return False
                    receiving.add((tile, cycle))
            end = max(end, piece.send_cycle + piece.words)
        if covered != [1] * transfer.words:
            return False
    return schedule.horizon >= end


def with_pieces(schedule: PhaseSchedule, index: int, pieces: tuple[Piece, ...]) -> PhaseSchedule:
    all_pieces = list(schedule.pieces)
    all_pieces[index] = pieces
    return replace(schedule, pieces=tuple(all_pieces), first_arrivals=None)


@SETTINGS
@given(phases())
def test_greedy_schedule_is_valid_and_bounded(phase: ExchangePhase) -> None:
    schedule = schedule_phase(phase)
    verify_schedule(phase, schedule)
    assert oracle_is_valid(phase, schedule)
    bound, _ = strongest_lower_bound(phase, PORTS_ONLY)
    assert bound >= endpoint_lower_bound(phase, PORTS_ONLY)
    assert bound <= schedule.horizon <= sum(t.words for t in phase.transfers)
    assert all(len(pieces) == 1 for pieces in schedule.pieces)
    assert schedule.horizon == max(p[0].send_cycle + p[0].words for p in schedule.pieces)


@SETTINGS
@given(phases(), st.data())
def test_serial_split_schedule_passes(phase: ExchangePhase, data: st.DataObject) -> None:
    # Every transfer cut at random points, all pieces sent one after another: always valid.
    time = 0
    all_pieces = []
    for transfer in phase.transfers:
        cuts = sorted(
            data.draw(st.sets(st.integers(1, transfer.words - 1), max_size=3))
            if transfer.words > 1
            else set()
        )
        bounds = [0, *cuts, transfer.words]
        pieces = []
        for begin, stop in pairwise(bounds):
            pieces.append(Piece(time, begin, stop - begin))
            time += stop - begin
        all_pieces.append(tuple(reversed(pieces)))
    schedule = PhaseSchedule(tuple(all_pieces), time, "serial", PORTS_ONLY)
    verify_schedule(phase, schedule)
    assert oracle_is_valid(phase, schedule)


@SETTINGS
@given(phases(), st.data())
def test_verifier_agrees_with_oracle_on_random_mutations(
    phase: ExchangePhase, data: st.DataObject
) -> None:
    schedule = schedule_phase(phase)
    index = data.draw(st.integers(0, len(phase.transfers) - 1))
    (piece,) = schedule.pieces[index]
    operation = data.draw(st.sampled_from(["shift", "split", "drop", "grow", "horizon"]))
    if operation == "shift":
        cycle = data.draw(st.integers(0, schedule.horizon + 5))
        mutated = with_pieces(schedule, index, (replace(piece, send_cycle=cycle),))
        mutated = replace(mutated, horizon=max(schedule.horizon, cycle + piece.words))
    elif operation == "split":
        assume(piece.words > 1)
        cut = data.draw(st.integers(1, piece.words - 1))
        later = data.draw(st.integers(0, schedule.horizon + 5))
        head = Piece(piece.send_cycle, 0, cut)
        tail = Piece(later, cut, piece.words - cut)
        mutated = with_pieces(schedule, index, (head, tail))
        mutated = replace(mutated, horizon=max(schedule.horizon, later + tail.words))
    elif operation == "drop":
        mutated = with_pieces(schedule, index, ())
    elif operation == "grow":
        mutated = with_pieces(schedule, index, (replace(piece, words=piece.words + 1),))
    else:
        mutated = replace(schedule, horizon=data.draw(st.integers(0, schedule.horizon)))
    if oracle_is_valid(phase, mutated):
        verify_schedule(phase, mutated)
    else:
        with pytest.raises(ScheduleError):
            verify_schedule(phase, mutated)


@SETTINGS
@given(phases(), st.data())
def test_moving_onto_a_shared_receiver_is_rejected(
    phase: ExchangePhase, data: st.DataObject
) -> None:
    pairs = [
        (i, j)
        for i, a in enumerate(phase.transfers)
        for j, b in enumerate(phase.transfers)
        if i != j and a.source != b.source and set(a.destination_tiles) & set(b.destination_tiles)
    ]
    assume(pairs)
    i, j = data.draw(st.sampled_from(pairs))
    schedule = schedule_phase(phase)
    target = schedule.pieces[i][0].send_cycle
    moved = with_pieces(schedule, j, (replace(schedule.pieces[j][0], send_cycle=target),))
    moved = replace(moved, horizon=schedule.horizon + phase.transfers[j].words)
    with pytest.raises(ScheduleError, match=r"receives from two senders|sends two pieces"):
        verify_schedule(phase, moved)


@SETTINGS
@given(phases(), st.data())
def test_overlapping_sends_are_rejected(phase: ExchangePhase, data: st.DataObject) -> None:
    pairs = [
        (i, j)
        for i, a in enumerate(phase.transfers)
        for j, b in enumerate(phase.transfers)
        if i != j and a.source == b.source
    ]
    assume(pairs)
    i, j = data.draw(st.sampled_from(pairs))
    schedule = schedule_phase(phase)
    target = schedule.pieces[i][0].send_cycle
    moved = with_pieces(schedule, j, (replace(schedule.pieces[j][0], send_cycle=target),))
    moved = replace(moved, horizon=schedule.horizon + phase.transfers[j].words)
    with pytest.raises(ScheduleError, match="sends two pieces"):
        verify_schedule(phase, moved)


@SETTINGS
@given(phases(), st.data())
def test_dropped_and_duplicated_words_are_rejected(
    phase: ExchangePhase, data: st.DataObject
) -> None:
    schedule = schedule_phase(phase)
    index = data.draw(st.integers(0, len(phase.transfers) - 1))
    (piece,) = schedule.pieces[index]
    with pytest.raises(ScheduleError, match="not covered"):
        verify_schedule(phase, with_pieces(schedule, index, ()))
    if piece.words > 1:
        shorter = replace(piece, words=piece.words - 1)
        with pytest.raises(ScheduleError, match="not covered"):
            verify_schedule(phase, with_pieces(schedule, index, (shorter,)))
    # A second copy of one word, sent after everything else so no port conflicts first.
    word = data.draw(st.integers(0, piece.words - 1))
    extra = Piece(schedule.horizon, word, 1)
    duplicated = replace(with_pieces(schedule, index, (piece, extra)), horizon=schedule.horizon + 1)
    with pytest.raises(ScheduleError, match="covered twice"):
        verify_schedule(phase, duplicated)

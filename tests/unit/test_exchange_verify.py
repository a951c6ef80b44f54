"""The independent schedule verifier: each rule accepts good and rejects broken schedules."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ipu_stack.errors import ScheduleError
from ipu_stack.exchange import model
from ipu_stack.exchange.model import (
    PORTS_ONLY,
    ExchangePhase,
    PhaseSchedule,
    Piece,
    Transfer,
)
from ipu_stack.exchange.verify import verify_schedule

BASE = 0x60000

# Tile 0 multicasts 4 words to tiles 1 and 2; tile 3 sends 3 words to tile 1; tile 0 sends
# 2 words to tile 3.
PHASE = ExchangePhase(
    (
        Transfer(0, BASE, ((1, BASE), (2, BASE)), 4),
        Transfer(3, BASE, ((1, BASE + 16),), 3),
        Transfer(0, BASE + 16, ((3, BASE),), 2),
    ),
    tile_count=4,
)


def schedule(*pieces: tuple[Piece, ...], horizon: int = 7) -> PhaseSchedule:
    return PhaseSchedule(pieces=pieces, horizon=horizon, kind="test", model=PORTS_ONLY)


GOOD = schedule((Piece(0, 0, 4),), (Piece(4, 0, 3),), (Piece(4, 0, 2),))


def test_good_schedule_passes() -> None:
    verify_schedule(PHASE, GOOD)  # must not raise


def test_split_pieces_and_slack_horizon_pass() -> None:
    split = schedule(
        (Piece(2, 2, 2), Piece(0, 0, 2)),  # out of offset order, back to back
        (Piece(4, 0, 1), Piece(9, 1, 2)),
        (Piece(4, 0, 2),),
        horizon=20,
    )
    verify_schedule(PHASE, split)


def test_empty_phase_and_schedule_pass() -> None:
    verify_schedule(ExchangePhase((), tile_count=2), PhaseSchedule((), 0, "test", PORTS_ONLY))


def test_piece_count_must_match_transfers() -> None:
    with pytest.raises(ScheduleError, match="pieces for 2 transfers, phase has 3"):
        verify_schedule(PHASE, schedule((Piece(0, 0, 4),), (Piece(4, 0, 3),)))


def test_malformed_phase_is_rejected() -> None:
    bad = ExchangePhase((Transfer(0, BASE, ((0, BASE),), 1),), tile_count=2)
    with pytest.raises(ScheduleError, match="transfer 0: destination tile 0 is the source"):
        verify_schedule(bad, schedule((Piece(0, 0, 1),)))


@pytest.mark.parametrize(
    ("piece", "message"),
    [
        (Piece(-1, 0, 3), "transfer 1 piece 0: negative send_cycle -1"),
        (Piece(4, 0, 0), "transfer 1 piece 0: non-positive words 0"),
        (Piece(4, -1, 3), "transfer 1 piece 0: negative offset_words -1"),
    ],
)
def test_bad_piece_fields(piece: Piece, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        verify_schedule(PHASE, schedule((Piece(0, 0, 4),), (piece,), (Piece(4, 0, 2),)))


def test_transfer_without_pieces() -> None:
    with pytest.raises(ScheduleError, match=r"transfer 1: no pieces; words \[0, 3\) not covered"):
        verify_schedule(PHASE, schedule((Piece(0, 0, 4),), (), (Piece(4, 0, 2),)))


def test_gap_in_coverage() -> None:
    broken = schedule((Piece(0, 0, 1), Piece(2, 2, 2)), (Piece(4, 0, 3),), (Piece(4, 0, 2),))
    with pytest.raises(ScheduleError, match=r"transfer 0: words \[1, 2\) not covered"):
        verify_schedule(PHASE, broken)


def test_missing_tail() -> None:
    broken = schedule((Piece(0, 0, 4),), (Piece(4, 0, 2),), (Piece(4, 0, 2),))
    with pytest.raises(ScheduleError, match=r"transfer 1: words \[2, 3\) not covered"):
        verify_schedule(PHASE, broken)


def test_words_covered_twice() -> None:
    broken = schedule((Piece(0, 0, 4), Piece(10, 1, 1)), (Piece(4, 0, 3),), (Piece(4, 0, 2),))
    with pytest.raises(ScheduleError, match=r"transfer 0: words \[1, 2\) covered twice"):
        verify_schedule(PHASE, broken)


def test_words_beyond_the_transfer() -> None:
    broken = schedule((Piece(0, 0, 4),), (Piece(4, 0, 3),), (Piece(4, 0, 3),))
    with pytest.raises(ScheduleError, match=r"transfer 2: pieces cover words \[2, 3\) beyond"):
        verify_schedule(PHASE, broken)


def test_overlapping_sends_on_one_tile() -> None:
    broken = schedule((Piece(0, 0, 4),), (Piece(4, 0, 3),), (Piece(3, 0, 2),))
    with pytest.raises(
        ScheduleError,
        match=r"tile 0 sends two pieces in cycle 3: transfer 0 piece 0 \[0, 4\) and "
        r"transfer 2 piece 0 \[3, 5\)",
    ):
        verify_schedule(PHASE, broken)


def test_nested_send_overlap_is_found() -> None:
    phase = ExchangePhase(
        (Transfer(0, BASE, ((1, BASE),), 10), Transfer(0, BASE, ((2, BASE),), 1)), tile_count=3
    )
    broken = schedule((Piece(0, 0, 10),), (Piece(5, 0, 1),), horizon=10)
    with pytest.raises(ScheduleError, match="tile 0 sends two pieces in cycle 5"):
        verify_schedule(phase, broken)


def test_two_senders_into_one_receiver() -> None:
    # Transfer 1 (tile 3 -> tile 1) moved into the multicast's window on tile 1.
    broken = schedule((Piece(0, 0, 4),), (Piece(2, 0, 3),), (Piece(4, 0, 2),))
    with pytest.raises(
        ScheduleError,
        match=r"tile 1 receives from two senders in cycle 2: transfer 0 piece 0 from tile 0 "
        r"\[0, 4\) and transfer 1 piece 0 from tile 3 \[2, 5\)",
    ):
        verify_schedule(PHASE, broken)


def test_receive_overlap_seen_on_a_second_multicast_destination() -> None:
    phase = ExchangePhase(
        (Transfer(0, BASE, ((1, BASE), (2, BASE)), 4), Transfer(3, BASE, ((2, BASE),), 4)),
        tile_count=4,
    )
    broken = schedule((Piece(0, 0, 4),), (Piece(3, 0, 4),))
    with pytest.raises(ScheduleError, match="tile 2 receives from two senders in cycle 3"):
        verify_schedule(phase, broken)


def test_horizon_smaller_than_real_end() -> None:
    with pytest.raises(ScheduleError, match=r"horizon 6 is smaller than the real end 7"):
        verify_schedule(PHASE, schedule(*GOOD.pieces, horizon=6))
    with pytest.raises(ScheduleError, match="horizon -1 is negative"):
        verify_schedule(ExchangePhase((), tile_count=2), PhaseSchedule((), -1, "test", PORTS_ONLY))


def test_unknown_latency_model() -> None:
    bad = PhaseSchedule(
        GOOD.pieces, GOOD.horizon, "test", model=replace(PORTS_ONLY, latency="bogus")
    )
    with pytest.raises(ScheduleError, match="unknown latency model 'bogus'"):
        verify_schedule(PHASE, bad)


def test_latency_hook_shifts_receptions(monkeypatch: pytest.MonkeyPatch) -> None:
    def tile_one_is_late(sources: np.ndarray, dests: np.ndarray) -> np.ndarray:
        return np.where(dests == 1, 3, 0).astype(np.int64)

    monkeypatch.setitem(model.LATENCY_MODELS, "late1", (tile_one_is_late, tile_one_is_late))
    # Fine without latency (tile 1 receives [0, 4) then [4, 7)); with +3 cycles into tile 1
    # the arrivals are [3, 7) and [7, 10): still disjoint, but the horizon must reach 10.
    late = PhaseSchedule(GOOD.pieces, 7, "test", model=replace(PORTS_ONLY, latency="late1"))
    with pytest.raises(ScheduleError, match="horizon 7 is smaller than the real end 10"):
        verify_schedule(PHASE, late)
    verify_schedule(
        PHASE, PhaseSchedule(GOOD.pieces, 10, "test", model=replace(PORTS_ONLY, latency="late1"))
    )
    # Transfer 1 sent at 3 is fine on send port 3, and without latency would collide on
    # tile 1 at cycle 3; the model delays only tile 1's arrivals, so both shift equally.
    shifted = schedule((Piece(0, 0, 4),), (Piece(3, 0, 3),), (Piece(4, 0, 2),), horizon=10)
    with pytest.raises(ScheduleError, match="tile 1 receives from two senders in cycle 3"):
        verify_schedule(PHASE, shifted)
    with pytest.raises(ScheduleError, match="tile 1 receives from two senders in cycle 6"):
        verify_schedule(
            PHASE,
            PhaseSchedule(shifted.pieces, 10, "test", model=replace(PORTS_ONLY, latency="late1")),
        )


def test_latency_can_separate_receptions(monkeypatch: pytest.MonkeyPatch) -> None:
    def tile_three_is_far(sources: np.ndarray, dests: np.ndarray) -> np.ndarray:
        return np.where(sources == 3, 4, 0).astype(np.int64)

    monkeypatch.setitem(model.LATENCY_MODELS, "far3", (tile_three_is_far, tile_three_is_far))
    # Transfer 1 leaves tile 3 at cycle 0 together with the multicast: a collision on tile 1
    # without latency, but with 4 cycles of latency it arrives over [4, 7), after the multicast.
    pieces = ((Piece(0, 0, 4),), (Piece(0, 0, 3),), (Piece(4, 0, 2),))
    with pytest.raises(ScheduleError, match="tile 1 receives from two senders in cycle 0"):
        verify_schedule(PHASE, PhaseSchedule(pieces, 7, "test", PORTS_ONLY))
    verify_schedule(
        PHASE, PhaseSchedule(pieces, 7, "test", model=replace(PORTS_ONLY, latency="far3"))
    )

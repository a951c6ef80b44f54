"""The preemptive list scheduler inside the scheduler: determinism and the piece rules."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.errors import ScheduleError
from ipu_stack.exchange.model import IPU21_MODEL
from ipu_stack.exchange.patterns import multicast_phase
from ipu_stack.exchange.schedule_pieces import MAX_PIECES, MIN_PIECE
from ipu_stack.exchange.scheduler import optimize_phase


def test_preemptive_schedules_are_deterministic_and_respect_the_piece_rules() -> None:
    phase = multicast_phase(np.random.default_rng(0), 150, tile_count=128)
    first = optimize_phase(phase, IPU21_MODEL, 0.5, wall_clock_guards=False)
    second = optimize_phase(phase, IPU21_MODEL, 0.5, wall_clock_guards=False)
    assert first.selected_kind == "preemptive-fit"
    assert first.schedule == second.schedule
    assert first.pieces == sum(len(p) for p in first.schedule.pieces) > len(phase.transfers)
    for pieces in first.schedule.pieces:
        assert 1 <= len(pieces) <= MAX_PIECES
        assert all(piece.words >= MIN_PIECE for piece in pieces[:-1])


def test_preemptive_bound_leaves_out_the_clique_bound() -> None:
    from ipu_stack.exchange.bounds import strongest_lower_bound
    from ipu_stack.exchange.model import PORTS_ONLY
    from ipu_stack.exchange.patterns import all_gather_phase

    # An all-gather group of 4: the clique bound (4 chunks) is proven for one-piece schedules;
    # the preemptive bound keeps only the bounds whose proofs survive preemption (3 chunks).
    phase = all_gather_phase(4, 16, tile_count=8)
    assert strongest_lower_bound(phase, PORTS_ONLY) == (64, "conflict-clique")
    assert strongest_lower_bound(phase, PORTS_ONLY, preemptive=True) == (48, "endpoint")


def test_fewer_than_one_piece_is_refused() -> None:
    phase = multicast_phase(np.random.default_rng(1), 10, tile_count=32)
    with pytest.raises(ScheduleError, match="at least 1 piece per transfer, got 0"):
        optimize_phase(phase, IPU21_MODEL, 0.1, max_pieces=0)

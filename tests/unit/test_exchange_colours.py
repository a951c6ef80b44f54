"""The group-colour order for moved-operand phases (exchange/schedule_colours.py)."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.exchange import scheduler
from ipu_stack.exchange.model import IPU21_MODEL
from ipu_stack.exchange.patterns import moved_operand_phase, random_unicast_phase
from ipu_stack.exchange.schedule_colours import group_colour_order, transfer_colours
from ipu_stack.exchange.scheduler import compile_phase, optimize_phase
from ipu_stack.exchange.verify import verify_schedule
from ipu_stack.target.topology import PAIR_PARTNER_BIT


def _phase():
    return moved_operand_phase(np.random.default_rng(0), 24, 4, 6, 800, tile_count=256)


def test_groups_that_meet_at_a_receiver_get_distinct_colours() -> None:
    phase = _phase()
    problem = compile_phase(phase, IPU21_MODEL)
    colours = transfer_colours(problem)
    order = group_colour_order(problem)
    assert colours is not None and order is not None
    assert sorted(order.tolist()) == list(range(len(phase.transfers)))
    assert np.all(np.diff(colours[order]) >= 0)  # colour by colour
    group_of = {}
    for t in phase.transfers:
        for tile, _ in t.destinations:
            group_of[tile] = min(d for d, _ in t.destinations)
    sender = [group_of[t.source] for t in phase.transfers]
    target = [group_of[t.destinations[0][0]] for t in phase.transfers]
    colour_of = {}
    for g, c in zip(sender, colours.tolist(), strict=True):
        assert colour_of.setdefault(g, c) == c  # one colour per sending group
    assert len(set(colour_of.values())) >= 2
    for receiving in set(target):
        senders = {s for s, r in zip(sender, target, strict=True) if r == receiving}
        # they reach one group one after another, so they take distinct colours; and the
        # receiving group sends in none of their colours
        assert len({colour_of[s] for s in senders}) == len(senders)
        if receiving in colour_of:
            assert colour_of[receiving] not in {colour_of[s] for s in senders}


def test_the_scheduler_picks_it_and_the_verifier_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    phase = _phase()
    report = optimize_phase(phase, IPU21_MODEL, 1.0, wall_clock_guards=False)
    assert report.selected_kind == "group-colours"
    verify_schedule(phase, report.schedule, IPU21_MODEL)
    again = optimize_phase(phase, IPU21_MODEL, 1.0, wall_clock_guards=False)
    assert again.schedule == report.schedule
    monkeypatch.setattr(scheduler, "group_colour_order", lambda problem: None)
    without = optimize_phase(phase, IPU21_MODEL, 1.0, wall_clock_guards=False)
    assert report.selected_horizon < without.selected_horizon


def test_phases_without_sending_groups_get_no_colour_order() -> None:
    unicast = random_unicast_phase(np.random.default_rng(2), 300, tile_count=128)
    assert group_colour_order(compile_phase(unicast, IPU21_MODEL)) is None


def test_the_pattern_sends_from_other_groups_in_whole_pairs() -> None:
    phase = _phase()
    sources = [t.source for t in phase.transfers]
    assert len(sources) == len(set(sources)) == 24 * 6
    for t in phase.transfers:
        tiles = {d for d, _ in t.destinations}
        assert len(tiles) == 8 and all(d ^ PAIR_PARTNER_BIT in tiles for d in tiles)
        assert t.source not in tiles and t.width == "paired64"

"""The constructive schedulers (earliest-fit, dense greedy) and the scheduler on the port model."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.errors import ScheduleError
from ipu_stack.exchange.bounds import endpoint_lower_bound, strongest_lower_bound
from ipu_stack.exchange.constraints import compile_phase
from ipu_stack.exchange.model import PORTS_ONLY, ExchangePhase, Transfer
from ipu_stack.exchange.patterns import all_gather_phase, all_to_all_phase, random_phase
from ipu_stack.exchange.schedule_greedy import dense_greedy, earliest_fit
from ipu_stack.exchange.scheduler import schedule_phase as full_schedule_phase
from ipu_stack.exchange.verify import verify_schedule
from ipu_stack.target.topology import logical_to_physical

BASE = 0x60000


def unicast(source: int, dest: int, words: int) -> Transfer:
    return Transfer(source, BASE, ((dest, BASE),), words)


def schedule_phase(phase: ExchangePhase, budget: float = 0.0):  # type: ignore[no-untyped-def]
    return full_schedule_phase(phase, PORTS_ONLY, budget)


def starts(phase: ExchangePhase) -> list[int]:
    """Earliest-fit send cycles (the list scheduler alone)."""
    phase.validate()
    cycles = earliest_fit(compile_phase(phase, PORTS_ONLY)).tolist()
    assert isinstance(cycles, list)
    return cycles


def test_empty_phase() -> None:
    schedule = schedule_phase(ExchangePhase((), tile_count=4))
    assert schedule.pieces == ()
    assert schedule.horizon == 0
    assert schedule.kind == "dense-greedy"
    assert schedule.latency == "none"


def test_one_piece_per_transfer_covering_it() -> None:
    phase = ExchangePhase((unicast(0, 1, 5), unicast(1, 0, 3)), tile_count=2)
    schedule = schedule_phase(phase)
    assert [len(p) for p in schedule.pieces] == [1, 1]
    assert [(p[0].offset_words, p[0].words) for p in schedule.pieces] == [(0, 5), (0, 3)]
    assert schedule.horizon == 5  # independent ports: both start at 0


def test_malformed_phase_is_rejected() -> None:
    with pytest.raises(ScheduleError, match="transfer 0"):
        schedule_phase(ExchangePhase((unicast(0, 0, 5),), tile_count=2))


def test_heaviest_endpoint_goes_first() -> None:
    # Transfer 0 (light ports) and 1 (its receiver also gets transfer 2) share tile 3's send port.
    phase = ExchangePhase((unicast(3, 0, 4), unicast(3, 1, 4), unicast(2, 1, 10)), tile_count=4)
    cycles = starts(phase)
    assert cycles[2] == 0  # receive port 1 carries 14 words: its transfers lead
    assert cycles[1] == 10  # after transfer 2 on receive port 1
    assert cycles[0] == 0  # backfilled on send port 3 before transfer 1


def test_backfills_into_an_earlier_gap() -> None:
    # 0 -> 1 (10 words) and 2 -> 1 (9) serialise on receive port 1, leaving send port 2 idle
    # over [0, 10); the later, lighter 2 -> 4 fills that gap instead of being appended at 19.
    phase = ExchangePhase(
        (unicast(0, 1, 10), unicast(2, 1, 9), unicast(0, 3, 8), unicast(2, 4, 5)),
        tile_count=5,
    )
    cycles = starts(phase)
    assert cycles[:3] == [0, 10, 10]
    assert cycles[3] == 0
    assert schedule_phase(phase).horizon == 19 == endpoint_lower_bound(phase, PORTS_ONLY)


def test_is_deterministic() -> None:
    phase = random_phase(np.random.default_rng(8), 500, tile_count=40, max_fanout=3)
    assert schedule_phase(phase, 0.5) == schedule_phase(phase, 0.5)
    problem = compile_phase(phase, PORTS_ONLY)
    assert (dense_greedy(problem) == dense_greedy(problem)).all()


@pytest.mark.parametrize("group", [2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("order", ["round", "source", "shuffled"])
def test_all_to_all_reaches_the_endpoint_bound(group: int, order: str) -> None:
    phase = all_to_all_phase(group, 12, tile_count=64, order=order)  # type: ignore[arg-type]
    schedule = schedule_phase(phase)
    verify_schedule(phase, schedule)
    assert schedule.horizon == endpoint_lower_bound(phase, PORTS_ONLY) == (group - 1) * 12


def test_all_to_all_on_mapped_physical_tiles_reaches_the_bound() -> None:
    # Same pattern after the C600 logical-to-physical map: tile ids are no longer consecutive.
    logical = all_to_all_phase(23, 8, order="shuffled", seed=3)
    mapped = ExchangePhase(
        tuple(
            Transfer(
                logical_to_physical(t.source),
                t.source_address,
                tuple((logical_to_physical(d), a) for d, a in t.destinations),
                t.words,
            )
            for t in logical.transfers
        )
    )
    schedule = schedule_phase(mapped)
    verify_schedule(mapped, schedule)
    assert schedule.horizon == endpoint_lower_bound(mapped, PORTS_ONLY) == 22 * 8


@pytest.mark.parametrize("group", [2, 3, 4, 7, 16])
def test_all_gather_reaches_the_clique_bound(group: int) -> None:
    phase = all_gather_phase(group, 20, tile_count=64)
    schedule = schedule_phase(phase)
    verify_schedule(phase, schedule)
    bound, _ = strongest_lower_bound(phase, PORTS_ONLY)
    assert bound == (group * 20 if group >= 3 else 20)
    assert schedule.horizon == bound


def test_random_unicast_phases_stay_near_the_bound() -> None:
    rng = np.random.default_rng(12)
    for _ in range(5):
        phase = random_phase(rng, 2000, tile_count=128, max_words=128)
        schedule = schedule_phase(phase)
        verify_schedule(phase, schedule)
        bound = endpoint_lower_bound(phase, PORTS_ONLY)
        assert bound <= schedule.horizon <= 1.05 * bound


def test_random_multicast_phases_are_valid_and_bounded() -> None:
    rng = np.random.default_rng(13)
    for _ in range(5):
        phase = random_phase(rng, 1500, tile_count=128, max_fanout=4, max_words=64)
        schedule = schedule_phase(phase)
        verify_schedule(phase, schedule)
        bound, _ = strongest_lower_bound(phase, PORTS_ONLY)
        assert bound <= schedule.horizon <= 2 * bound
        assert schedule.horizon <= sum(t.words for t in phase.transfers)

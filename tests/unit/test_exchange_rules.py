"""The IPU21 rules of the exchange model, one at a time: schedulers obey them, the verifier
rejects each violation, and the bounds see them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ipu_stack.errors import ScheduleError
from ipu_stack.exchange.bounds import (
    CONFLICT_CLIQUE,
    DEPENDENCY_CHAIN,
    LATENCY_ENDPOINT,
    SRAM_ELEMENT,
    endpoint_lower_bound,
    strongest_lower_bound,
)
from ipu_stack.exchange.constraints import compile_phase
from ipu_stack.exchange.model import (
    IPU21_MODEL,
    PAIRED64,
    PORTS_ONLY,
    ExchangeModel,
    ExchangePhase,
    PhaseSchedule,
    Piece,
    Transfer,
    maximum_identical_destinations,
    split_multicasts,
)
from ipu_stack.exchange.patterns import all_gather_phase, multicast_groups_phase
from ipu_stack.exchange.scheduler import optimize_phase, schedule_phase
from ipu_stack.exchange.verify import verify_schedule
from ipu_stack.target import topology
from ipu_stack.target.ipu21 import INTERLEAVED_BASE, STANDARD_DATA_BASE
from ipu_stack.target.topology import MIN_TIME_TO_MUX, exchange_latency, mux_lead, time_to_mux

A = STANDARD_DATA_BASE
R = INTERLEAVED_BASE  # receive buffers: another SRAM element than the send buffers


def only(**switches: object) -> ExchangeModel:
    """The port model with the given rules switched on."""
    return replace(PORTS_ONLY, **switches)  # type: ignore[arg-type]


def test_min_time_to_mux_is_the_machine_minimum() -> None:
    tiles = np.arange(1472)
    values = time_to_mux(tiles[:, None], tiles[None, :])
    np.fill_diagonal(values, 10**6)
    assert int(values.min()) == MIN_TIME_TO_MUX


def test_latency_is_send_to_mux_select_to_write() -> None:
    """Absolute timing (facts §8.5, §9): the source select one cycle after the word reaches
    the mux, the write 52 + 2 x (receiver's physical row) after the select; 19..165 cycles."""
    tiles = np.arange(1472)
    latency = exchange_latency(tiles[:, None], tiles[None, :])
    row = tiles[None, :] // 64
    assert (latency == time_to_mux(tiles[:, None], tiles[None, :]) + 1 + 52 + 2 * row).all()
    assert (int(latency.min()), int(latency.max())) == (19, 165)
    assert (mux_lead(tiles) == 52 + 2 * (tiles // 64)).all()


def test_release_keeps_every_source_select_inside_the_phase() -> None:
    """A piece to a pair whose ``time_to_mux`` is -78 cannot start before cycle 77."""
    tiles = np.arange(1472)
    values = time_to_mux(tiles[:, None], tiles[None, :])
    np.fill_diagonal(values, 10**6)
    s, d = np.unravel_index(int(np.argmin(values)), values.shape)
    phase = ExchangePhase((Transfer(int(s), A, ((int(d), R),), 10),))
    schedule = schedule_phase(phase, only(latency="time_to_mux"), 0.0)
    assert schedule.pieces[0][0].send_cycle == -MIN_TIME_TO_MUX - 1
    early = PhaseSchedule(
        pieces=((replace(schedule.pieces[0][0], send_cycle=-MIN_TIME_TO_MUX - 2),),),
        horizon=schedule.horizon,
        kind="test",
        model=schedule.model,
    )
    with pytest.raises(ScheduleError, match="before the phase starts"):
        verify_schedule(phase, early)


def test_latency_shifts_arrivals_and_the_horizon() -> None:
    phase = ExchangePhase((Transfer(0, A, ((700, R),), 10),))
    schedule = schedule_phase(phase, only(latency="time_to_mux"), 0.0)
    latency = exchange_latency(0, 700)
    assert schedule.first_arrivals == ((schedule.pieces[0][0].send_cycle + latency,),)
    assert schedule.horizon == schedule.pieces[0][0].send_cycle + latency + 10
    # Claiming arrival in the send cycle is rejected under the latency model.
    wrong = replace(schedule, first_arrivals=((schedule.pieces[0][0].send_cycle,),))
    with pytest.raises(ScheduleError, match="first word recorded arriving at tile 700"):
        verify_schedule(phase, wrong)
    with pytest.raises(ScheduleError, match="horizon 10 is smaller than the real end"):
        verify_schedule(phase, replace(schedule, horizon=10, first_arrivals=None))
    bound, name = strongest_lower_bound(phase, only(latency="time_to_mux"))
    release = topology.mux_lead(700) - latency  # the select may not act before cycle 0
    assert schedule.pieces[0][0].send_cycle == max(release, 0)
    assert (bound, name) == (max(release, 0) + latency + 10, LATENCY_ENDPOINT)


def test_paired64_validation() -> None:
    good = Transfer(1, A, ((8, R), (10, R)), 4, PAIRED64)
    ExchangePhase((good,), 16).validate()
    for bad, message in [
        (replace(good, words=3), "even word count"),
        (replace(good, source_address=A + 4), "not 8-byte aligned"),
        (replace(good, destinations=((8, R),)), "without its pair partner 10"),
        (replace(good, width="word64"), "width 'word64'"),
    ]:
        with pytest.raises(ScheduleError, match=message):
            ExchangePhase((bad,), 16).validate()


def test_paired64_halves_cycles_and_reserves_the_source_partner() -> None:
    model = only(paired=True)
    paired = Transfer(1, A, ((8, R), (10, R)), 8, PAIRED64)
    partner_send = Transfer(3, A, ((12, R),), 4)  # tile 3 = 1 ^ 2, the reserved partner
    phase = ExchangePhase((paired, partner_send), 16)
    assert endpoint_lower_bound(phase, model) == 4 + 4  # partner's send port: 4 reserved + 4
    schedule = schedule_phase(phase, model, 0.0)
    verify_schedule(phase, schedule)
    assert schedule.horizon == 8
    overlapping = PhaseSchedule(((Piece(0, 0, 8),), (Piece(0, 0, 4),)), 8, "test", model)
    with pytest.raises(ScheduleError, match="tile 3 sends two pieces in cycle 0"):
        verify_schedule(phase, overlapping)
    odd = PhaseSchedule(((Piece(0, 0, 3), Piece(5, 3, 5)), (Piece(4, 0, 4),)), 9, "test", model)
    with pytest.raises(ScheduleError, match="paired64 piece at odd offset_words 3"):
        verify_schedule(phase, odd)
    # With the rule off, the same transfer is an ordinary 8-cycle multicast.
    assert endpoint_lower_bound(phase, PORTS_ONLY) == 8


def test_partner_receive_port_is_reserved_too() -> None:
    model = only(paired=True)
    phase = ExchangePhase(
        (Transfer(1, A, ((8, R), (10, R)), 8, PAIRED64), Transfer(5, A, ((3, R),), 4)), 16
    )
    clash = PhaseSchedule(((Piece(0, 0, 8),), (Piece(1, 0, 4),)), 8, "test", model)
    with pytest.raises(ScheduleError, match="tile 3 receives from two senders"):
        verify_schedule(phase, clash)


def test_memory_order_dependencies() -> None:
    # Transfer 0 writes tile 1 at R; transfer 1 forwards those bytes from tile 1 to tile 2.
    phase = ExchangePhase(
        (Transfer(0, A, ((1, R),), 6), Transfer(1, R, ((2, R),), 6)), tile_count=3
    )
    model = only(dependencies=True)
    problem = compile_phase(phase, model)
    assert problem.dependency_before.tolist() == [0]
    assert problem.dependency_after.tolist() == [1]
    schedule = schedule_phase(phase, model, 0.0)
    verify_schedule(phase, schedule)
    assert schedule.pieces[1][0].send_cycle >= 6
    assert strongest_lower_bound(phase, model)[0] == 12
    assert optimize_phase(phase, model, 0.0).bounds[DEPENDENCY_CHAIN] == 12
    assert optimize_phase(phase, PORTS_ONLY, 0.0).bounds[DEPENDENCY_CHAIN] == 6
    early = PhaseSchedule(((Piece(0, 0, 6),), (Piece(3, 0, 6),)), 9, "test", model)
    with pytest.raises(
        ScheduleError, match="transfer 1 touches tile 1 at cycle 3 before transfer 0"
    ):
        verify_schedule(phase, early)
    verify_schedule(phase, early, PORTS_ONLY)  # legal when the rule is off


def test_write_after_read_is_ordered_too() -> None:
    # Transfer 0 reads tile 0's buffer A; transfer 1 (later) overwrites it from tile 2.
    phase = ExchangePhase(
        (Transfer(0, A, ((1, R),), 5), Transfer(2, A, ((0, A),), 5)), tile_count=3
    )
    model = only(dependencies=True)
    together = PhaseSchedule(((Piece(0, 0, 5),), (Piece(0, 0, 5),)), 5, "test", model)
    with pytest.raises(ScheduleError, match="transfer 1 touches tile 0"):
        verify_schedule(phase, together)
    verify_schedule(phase, schedule_phase(phase, model, 0.0))


def test_sram_element_hazard() -> None:
    # Tile 1 sends from A while receiving into A + 64: one 16 KiB element.
    phase = ExchangePhase(
        (Transfer(1, A, ((2, R),), 8), Transfer(0, A, ((1, A + 64),), 8)), tile_count=3
    )
    model = only(sram_hazards=True)
    at_once = PhaseSchedule(((Piece(0, 0, 8),), (Piece(0, 0, 8),)), 8, "test", model)
    with pytest.raises(ScheduleError, match="SRAM element hazard on tile 1"):
        verify_schedule(phase, at_once)
    verify_schedule(phase, at_once, PORTS_ONLY)
    schedule = schedule_phase(phase, model, 0.0)
    verify_schedule(phase, schedule)
    assert schedule.horizon == 16
    assert strongest_lower_bound(phase, model) == (16, SRAM_ELEMENT)
    # Receiving into another element removes the hazard.
    apart = ExchangePhase(
        (Transfer(1, A, ((2, R),), 8), Transfer(0, A, ((1, R),), 8)), tile_count=3
    )
    assert schedule_phase(apart, model, 0.0).horizon == 8


def test_half_duplex_serialises_send_and_receive() -> None:
    phase = ExchangePhase((Transfer(0, A, ((1, R),), 5), Transfer(1, A, ((2, R),), 5)), 3)
    assert schedule_phase(phase, PORTS_ONLY, 0.0).horizon == 5
    half = only(full_duplex=False)
    assert endpoint_lower_bound(phase, half) == 10
    schedule = schedule_phase(phase, half, 0.0)
    verify_schedule(phase, schedule)
    assert schedule.horizon == 10
    both = PhaseSchedule(((Piece(0, 0, 5),), (Piece(0, 0, 5),)), 5, "test", half)
    with pytest.raises(ScheduleError, match="sends and receives at once without full duplex"):
        verify_schedule(phase, both)


def test_multicast_receivers_share_cycles_and_split_costs_the_sender() -> None:
    phase = all_gather_phase(4, 10, tile_count=8)
    assert strongest_lower_bound(phase, PORTS_ONLY) == (40, CONFLICT_CLIQUE)
    unicast = split_multicasts(phase)
    assert len(unicast.transfers) == 3 * len(phase.transfers)
    assert endpoint_lower_bound(unicast, PORTS_ONLY) == 30
    assert all(len(t.destinations) == 1 for t in unicast.transfers)


def test_latency_aware_clique_bound_is_sound_and_met_on_groups() -> None:
    phase = multicast_groups_phase(6, 64, tile_count=48)
    report = optimize_phase(phase, IPU21_MODEL, 2.0)
    verify_schedule(phase, report.schedule)
    assert report.tight_bound == CONFLICT_CLIQUE
    assert report.strongest_lower_bound > 6 * 64  # latency adds to the plain clique bound
    assert report.strongest_lower_bound <= report.selected_horizon
    assert report.selected_horizon <= 1.02 * report.strongest_lower_bound


def test_maximum_identical_destinations() -> None:
    phase = ExchangePhase(
        (Transfer(0, A, ((1, R),), 2), Transfer(2, A, ((1, R), (3, R)), 2)), tile_count=4
    )
    assert maximum_identical_destinations(phase) == 2
    assert maximum_identical_destinations(ExchangePhase((), 4)) == 0


def test_same_options_give_the_same_schedule() -> None:
    phase = multicast_groups_phase(5, 40, tile_count=60)
    first = optimize_phase(phase, IPU21_MODEL, 1.0).schedule
    second = optimize_phase(phase, IPU21_MODEL, 1.0).schedule
    assert first == second


def test_clique_order_sequences_every_group() -> None:
    from ipu_stack.exchange.schedule_cliques import clique_order

    phase = multicast_groups_phase(7, 48, tile_count=70)
    problem = compile_phase(phase, IPU21_MODEL)
    order = clique_order(problem)
    assert order is not None
    assert sorted(order.tolist()) == list(range(len(phase.transfers)))
    unicast = compile_phase(ExchangePhase((Transfer(0, A, ((1, R),), 4),), 2), IPU21_MODEL)
    assert clique_order(unicast) is None

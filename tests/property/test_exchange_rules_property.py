"""Property tests under the IPU21 rules (latency, paired64, dependencies, SRAM hazards,
full duplex, each randomly on or off): every schedule passes the verifier and a cycle-by-cycle
oracle written independently here, its horizon is never below the strongest lower bound, and
the verifier agrees with the oracle on deliberately broken schedules."""

from __future__ import annotations

from dataclasses import replace
from random import Random

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ipu_stack.errors import ScheduleError
from ipu_stack.exchange.bounds import PREEMPTIVE_BOUND_NAMES, lower_bounds, strongest
from ipu_stack.exchange.constraints import compile_phase
from ipu_stack.exchange.model import (
    PAIRED64,
    WORD32,
    ExchangeModel,
    ExchangePhase,
    PhaseSchedule,
    Piece,
    Transfer,
)
from ipu_stack.exchange.schedule_pieces import preemptive_fit, schedule_from_pieces
from ipu_stack.exchange.scheduler import optimize_phase
from ipu_stack.exchange.verify import verify_schedule
from ipu_stack.target.topology import exchange_latency, paired_exchange_latency

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STANDARD = 0x60000  # 16 KiB elements
INTERLEAVED = 0x90000  # 32 KiB element pairs
ADDRESSES = [STANDARD, STANDARD + 64, STANDARD + 0x4000, INTERLEAVED, INTERLEAVED + 128]
TILES = 12  # tiles 0..11: pairs (0, 2), (1, 3), (4, 6), ...


@st.composite
def models(draw: st.DrawFn) -> ExchangeModel:
    return ExchangeModel(
        latency=draw(st.sampled_from(["none", "time_to_mux"])),
        paired=draw(st.booleans()),
        dependencies=draw(st.booleans()),
        sram_hazards=draw(st.booleans()),
        full_duplex=draw(st.booleans()),
    )


@st.composite
def phases(draw: st.DrawFn) -> ExchangePhase:
    transfers = []
    for _ in range(draw(st.integers(1, 10))):
        source = draw(st.integers(0, TILES - 1))
        paired = draw(st.booleans()) and (source ^ 2) < TILES
        if paired:
            pairs = [p for p in range(TILES) if p & 2 == 0 and p != source & ~2]
            chosen = draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=2, unique=True))
            dests = [tile for p in chosen for tile in (p, p ^ 2)]
            words = 2 * draw(st.integers(1, 10))
        else:
            others = [t for t in range(TILES) if t != source]
            dests = draw(st.lists(st.sampled_from(others), min_size=1, max_size=3, unique=True))
            words = draw(st.integers(1, 20))
        transfers.append(
            Transfer(
                source,
                draw(st.sampled_from(ADDRESSES)),
                tuple((d, draw(st.sampled_from(ADDRESSES))) for d in dests),
                words,
                PAIRED64 if paired else WORD32,
            )
        )
    return ExchangePhase(tuple(transfers), TILES)


def _elements(address: int, size: int) -> set[int]:
    def element(a: int) -> int:
        if a < 0x80000:
            return (a - 0x4C000) // 0x4000
        return 100 + (a - 0x80000) // 0x8000

    return set(range(element(address), element(address + size - 1) + 1))


def oracle_is_valid(phase: ExchangePhase, schedule: PhaseSchedule, model: ExchangeModel) -> bool:
    """Cycle-by-cycle replay of every rule, written from the model's definition."""
    if len(schedule.pieces) != len(phase.transfers):
        return False
    ports: set[tuple[str, int, int]] = set()
    element_use: dict[tuple[int, int, int], str] = {}
    windows: dict[tuple[int, int], list[int]] = {}  # (transfer, tile) -> cycles touched
    end = 0

    def take(kind: str, tile: int, cycle: int) -> bool:
        key = (kind if model.full_duplex else "port", tile, cycle)
        if key in ports:
            return False
        ports.add(key)
        return True

    for index, (transfer, pieces) in enumerate(zip(phase.transfers, schedule.pieces, strict=True)):
        paired = model.paired and transfer.width == PAIRED64
        step = 2 if paired else 1
        covered = [0] * transfer.words
        for piece in pieces:
            if piece.send_cycle < 0 or piece.words <= 0 or piece.offset_words < 0:
                return False
            if paired and (piece.offset_words % 2 or piece.words % 2):
                return False
            for word in range(piece.offset_words, piece.offset_words + piece.words):
                if word >= transfer.words:
                    return False
                covered[word] += 1
            cycles = range(piece.send_cycle, piece.send_cycle + piece.words // step)
            read = (
                _elements(transfer.source_address + 4 * piece.offset_words, 4 * piece.words)
                if model.sram_hazards
                else set()
            )
            for cycle in cycles:
                if not take("send", transfer.source, cycle):
                    return False
                if paired and not (
                    take("send", transfer.source ^ 2, cycle)
                    and (not model.full_duplex or take("receive", transfer.source ^ 2, cycle))
                ):
                    return False
                for element in read:
                    if element_use.setdefault((transfer.source, element, cycle), "r") != "r":
                        return False
                windows.setdefault((index, transfer.source), []).append(cycle)
                end = max(end, cycle + 1)
            for tile, address in transfer.destinations:
                if model.latency == "none":
                    latency = 0
                elif paired:
                    latency = paired_exchange_latency(transfer.source, tile)
                else:
                    latency = exchange_latency(transfer.source, tile)
                written = (
                    _elements(address + 4 * piece.offset_words, 4 * piece.words)
                    if model.sram_hazards
                    else set()
                )
                # the receiver selects the source 52 + 2 x (physical row) cycles before the
                # write (facts §9), and not before the phase starts
                lead = 0 if model.latency == "none" else 52 + 2 * (tile // 64)
                if piece.send_cycle + latency - lead < 0:
                    return False
                for cycle in cycles:
                    if not take("receive", tile, cycle + latency):
                        return False
                    for element in written:
                        key = (tile, element, cycle + latency)
                        if element_use.setdefault(key, "w") != "w":
                            return False
                    windows.setdefault((index, tile), []).append(cycle + latency)
                    end = max(end, cycle + latency + 1)
        if covered != [1] * transfer.words:
            return False
    if model.dependencies:
        for j, later in enumerate(phase.transfers):
            for i in range(j):
                earlier = phase.transfers[i]
                for tile, lo_i, hi_i, w_i in _accesses(earlier):
                    for tile_j, lo_j, hi_j, w_j in _accesses(later):
                        if tile != tile_j or not (w_i or w_j) or hi_i <= lo_j or hi_j <= lo_i:
                            continue
                        if min(windows[(j, tile)]) < max(windows[(i, tile)]) + 1:
                            return False
    return schedule.horizon >= end


def _accesses(transfer: Transfer) -> list[tuple[int, int, int, bool]]:
    size = 4 * transfer.words
    out = [(transfer.source, transfer.source_address, transfer.source_address + size, False)]
    out += [(tile, address, address + size, True) for tile, address in transfer.destinations]
    return out


def oracle(phase: ExchangePhase, schedule: PhaseSchedule, model: ExchangeModel) -> bool:
    return oracle_is_valid(phase, schedule, model)


@SETTINGS
@given(phases(), models(), st.sampled_from([0.0, 0.3]))
def test_schedules_obey_every_rule_and_respect_the_bound(
    phase: ExchangePhase, model: ExchangeModel, budget: float
) -> None:
    report = optimize_phase(phase, model, budget)
    verify_schedule(phase, report.schedule)
    assert oracle(phase, report.schedule, model)
    assert report.strongest_lower_bound <= report.selected_horizon <= report.initial_horizon
    assert report.endpoint_lower_bound <= report.strongest_lower_bound


@SETTINGS
@given(phases(), models(), st.data())
def test_verifier_agrees_with_the_oracle_on_broken_schedules(
    phase: ExchangePhase, model: ExchangeModel, data: st.DataObject
) -> None:
    schedule = optimize_phase(phase, model, 0.0).schedule
    index = data.draw(st.integers(0, len(phase.transfers) - 1))
    (piece,) = schedule.pieces[index]
    operation = data.draw(st.sampled_from(["shift", "split", "drop", "grow", "horizon"]))
    pieces = list(schedule.pieces)
    horizon = schedule.horizon
    if operation == "shift":
        cycle = data.draw(st.integers(0, schedule.horizon + 5))
        pieces[index] = (replace(piece, send_cycle=cycle),)
        horizon += cycle + 400
    elif operation == "split":
        assume(piece.words > 1)
        cut = data.draw(st.integers(1, piece.words - 1))
        later = data.draw(st.integers(0, schedule.horizon + 5))
        pieces[index] = (Piece(piece.send_cycle, 0, cut), Piece(later, cut, piece.words - cut))
        horizon += later + 400
    elif operation == "drop":
        pieces[index] = ()
    elif operation == "grow":
        pieces[index] = (replace(piece, words=piece.words + 2),)
    else:
        horizon = data.draw(st.integers(0, schedule.horizon))
    mutated = PhaseSchedule(tuple(pieces), horizon, "mutated", model)
    if oracle(phase, mutated, model):
        verify_schedule(phase, mutated)
    else:
        with pytest.raises(ScheduleError):
            verify_schedule(phase, mutated)


@SETTINGS
@given(phases(), models(), st.integers(2, 4), st.integers(1, 6), st.randoms())
def test_preemptive_schedules_obey_every_rule_and_the_preemptive_bounds(
    phase: ExchangePhase, model: ExchangeModel, max_pieces: int, min_piece: int, rng: Random
) -> None:
    problem = compile_phase(phase, model)
    order = np.asarray(rng.sample(range(problem.count), problem.count), dtype=np.int64)
    pieces = preemptive_fit(problem, order, min_piece=min_piece, max_pieces=max_pieces)
    schedule = schedule_from_pieces(problem, pieces, "preemptive-fit", model)
    verify_schedule(phase, schedule)
    assert oracle(phase, schedule, model)
    assert max(len(p) for p in schedule.pieces) <= max_pieces
    bound, _ = strongest(lower_bounds(problem), PREEMPTIVE_BOUND_NAMES)
    assert bound <= schedule.horizon

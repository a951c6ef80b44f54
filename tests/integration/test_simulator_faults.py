"""The simulator must reject what hardware would not do, each with a specific error."""

import dataclasses

import pytest

from ipu_stack.errors import ScheduleError, SimulationError
from ipu_stack.exchange.model import PhaseSchedule, Piece
from ipu_stack.low.program import ComputeStep, GemmCall
from ipu_stack.runtime.sim import SimDevice
from ipu_stack.target import ipu21


def run(built, feeds):
    return SimDevice().run(built.program, built.placement, built.schedules, feeds)


def test_unmodified_program_runs(small_build):
    _, built, feeds = small_build
    assert run(built, feeds).cycles > 0


def _first_gemm(built):
    for step in built.program.steps:
        if isinstance(step, ComputeStep):
            for i, call in enumerate(step.calls):
                if isinstance(call, GemmCall):
                    return step, i, call
    raise AssertionError("no gemm")


def test_address_past_tile_memory(small_build):
    _, built, feeds = small_build
    _, _, call = _first_gemm(built)
    allocs = built.placement.allocations[call.tile]
    out = allocs[call.out.buffer]
    allocs[call.out.buffer] = dataclasses.replace(out, address=ipu21.TILE_MEMORY_END - 64)
    with pytest.raises(SimulationError, match="outside loadable tile memory"):
        run(built, feeds)


def test_access_past_tile_memory(small_build):
    _, built, feeds = small_build
    step, i, call = _first_gemm(built)
    far = ipu21.TILE_MEMORY_END - built.placement.address(call.tile, call.out)
    step.calls[i] = dataclasses.replace(call, out=call.out.at(far))
    with pytest.raises(SimulationError, match="past tile memory"):
        run(built, feeds)


def test_misaligned_amp_operand(small_build):
    _, built, feeds = small_build
    step, i, call = _first_gemm(built)
    step.calls[i] = dataclasses.replace(call, left=call.left.at(8))
    with pytest.raises(SimulationError, match=r"gemm left at 0x[0-9a-f]+ is not 32-byte aligned"):
        run(built, feeds)


def test_overlapping_live_buffers(small_build):
    _, built, feeds = small_build
    _, _, call = _first_gemm(built)
    allocs = built.placement.allocations[call.tile]
    left, out = allocs[call.left.buffer], allocs[call.out.buffer]
    allocs[call.left.buffer] = dataclasses.replace(left, address=out.address)
    with pytest.raises(SimulationError, match=r"live allocations .* overlap"):
        run(built, feeds)


def test_receiver_with_two_senders_in_one_cycle(small_build):
    _, built, feeds = small_build
    index, (phase, _schedule) = next(iter(built.schedules.items()))
    receivers = [d for t in phase.transfers for d in t.destination_tiles]
    assert len(receivers) > len(set(receivers)), "fixture must have a tile with two senders"
    # each physical pair's first send at cycle 80 (past every release, at most 77 cycles), its
    # others after it (a paired send holds both tiles' send ports): the senders are free, the
    # receivers are not
    busy: dict[int, int] = {}
    pieces = []
    for t in phase.transfers:
        start = busy.get(t.source & ~2, 80)
        pieces.append((Piece(start, 0, t.words),))
        busy[t.source & ~2] = start + t.words
    crowded = PhaseSchedule(tuple(pieces), max(busy.values()), "broken")
    built.schedules[index] = (phase, crowded)
    with pytest.raises(ScheduleError, match="receives from two senders in cycle"):
        run(built, feeds)


def test_missing_input_is_reported(small_build):
    _, built, feeds = small_build
    del feeds["x"]
    with pytest.raises(SimulationError, match="no data for host_input 'x'"):
        run(built, feeds)

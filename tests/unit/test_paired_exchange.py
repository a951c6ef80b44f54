"""Multicasts to whole physical pairs move as 64-bit paired items (facts §7.4, §8.5)."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.errors import ScheduleError
from ipu_stack.exchange.model import PAIRED64, WORD32
from ipu_stack.exchange.verify import verify_schedule
from ipu_stack.graph import ComputeGraph, evaluate_reference
from ipu_stack.low.pair_multicasts import split_for_pairs
from ipu_stack.low.program import ExchangeStep, LogicalTransfer, Ref
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.place import assign
from ipu_stack.place.mapping import screen_mappings
from ipu_stack.runtime.sim import SimDevice
from ipu_stack.target.ipu21 import PAIRED_MIN_WORDS, TILE_MEMORY_BASE

BASE = TILE_MEMORY_BASE + 0x40000


def _gather(group: int, words: int) -> ExchangeStep:
    """An all-gather among logical tiles 0..group-1: each sends its chunk to the others."""

    def others(s: int) -> tuple[tuple[int, Ref], ...]:
        return tuple((d, Ref("work", 0)) for d in range(group) if d != s)

    return ExchangeStep(
        "all-gather", [LogicalTransfer(s, Ref("home", 0), others(s), words) for s in range(group)]
    )


def test_an_all_gather_among_whole_pairs_splits_off_each_partner():
    step = _gather(6, PAIRED_MIN_WORDS)
    assert split_for_pairs([step]) == 6
    first, alone = step.transfers[0], step.transfers[1]
    assert [d for d, _ in first.destinations] == [2, 3, 4, 5]
    assert [d for d, _ in alone.destinations] == [1]
    assert {t.words for t in step.transfers} == {PAIRED_MIN_WORDS}


@pytest.mark.parametrize(
    ("group", "words"),
    [(5, PAIRED_MIN_WORDS), (6, PAIRED_MIN_WORDS - 2), (6, PAIRED_MIN_WORDS + 1), (2, 1024)],
)
def test_what_cannot_pair_is_left_whole(group, words):
    """An odd group leaves one tile without its partner; short or odd transfers cannot pair;
    a unicast to the partner alone has nothing to split."""
    step = _gather(group, words)
    before = list(step.transfers)
    assert split_for_pairs([step]) == 0
    assert step.transfers == before


def test_paired_width_needs_complete_pairs_even_words_and_8_byte_alignment():
    pairs = ((4, BASE), (6, BASE), (8, BASE), (10, BASE))  # physical pairs are d and d ^ 2
    assert assign.paired_width(BASE, pairs, 256) == PAIRED64
    assert assign.paired_width(BASE, pairs[:3], 256) == WORD32  # 8 without 10
    assert assign.paired_width(BASE, pairs, 255) == WORD32
    assert assign.paired_width(BASE, pairs, PAIRED_MIN_WORDS - 2) == WORD32
    assert assign.paired_width(BASE + 4, pairs, 256) == WORD32
    assert assign.paired_width(BASE, ((4, BASE), (6, BASE + 4)), 256) == WORD32


def _graph() -> ComputeGraph:
    g = ComputeGraph()
    x = g.host_input("x", (32, 64), "f16")
    w = g.parameter("w", (64, 64), "f16")
    w2 = g.parameter("w2", (64, 32), "f16")
    g.set_outputs(g.gemm(g.gemm(x, w, name="mm"), w2, name="mm2"))
    return g


def test_a_build_pairs_its_operand_gather_and_still_computes_the_product():
    g = _graph()
    built = build(g, BuildConfig(tiles=8))
    widths = [t.width for phase, _ in built.schedules.values() for t in phase.transfers]
    assert PAIRED64 in widths
    for phase, schedule in built.schedules.values():
        verify_schedule(phase, schedule)  # the independent checker accepts the paired moves
    rng = np.random.default_rng(1)
    feeds = {
        "x": rng.uniform(-1, 1, (32, 64)).astype(np.float16),
        "w": rng.uniform(-1, 1, (64, 64)).astype(np.float16),
        "w2": rng.uniform(-1, 1, (64, 32)).astype(np.float16),
    }
    run = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    (key,) = run.outputs
    expected = evaluate_reference(g, feeds)[key]
    assert (
        np.abs(run.outputs[key].astype(np.float64) - expected).max() < 0.05 * np.abs(expected).max()
    )


class _Placed:
    """The two things physical_phase reads of a placement: the tile map and addresses."""

    def __init__(self, tiles: int) -> None:
        self.physical = np.arange(tiles, dtype=np.int64) * 2  # logical t on physical 2t
        self._addresses = [{"a": BASE, "b": BASE} for _ in range(tiles)]

    def addresses(self):
        return self._addresses


def test_a_width_that_ignores_pair_partners_is_refused(monkeypatch):
    """Mutant: every even multicast marked paired. Physical tiles 4 and 8 receive without
    their partners 6 and 10; the phase check names the tile."""
    step = ExchangeStep(
        "x", [LogicalTransfer(0, Ref("a", 0), ((2, Ref("b", 0)), (4, Ref("b", 0))), 256)]
    )
    assert assign.physical_phase(step, _Placed(6)).transfers[0].width == WORD32
    assign.physical_phase(step, _Placed(6)).validate()

    def careless(source_address, destinations, words):
        return PAIRED64 if words % 2 == 0 and len(destinations) > 1 else WORD32

    monkeypatch.setattr(assign, "paired_width", careless)
    phase = assign.physical_phase(step, _Placed(6))
    with pytest.raises(ScheduleError, match="without its pair partner"):
        phase.validate()


def test_the_mapping_screen_keeps_pairs_that_receive_together():
    """An all-gather among whole pairs is cheaper on the C600 map than on relabellings that
    separate the pairs: the screen counts paired moves at half their words."""
    from ipu_stack.low.program import LowProgram

    step = _gather(8, 1024)
    split_for_pairs([step])
    program = LowProgram(8, [], [step], [], 0, 0, {})
    choice = screen_mappings(program)
    assert not choice.mapped
    assert choice.baseline_cycles <= choice.candidate_cycles


def test_a_phase_whose_widths_change_is_scheduled_again():
    """A new placement that keeps every buffer in its element keeps the schedules, unless a
    transfer's width changed (paired moves need 8-byte alignment)."""
    from dataclasses import replace as replaced

    from ipu_stack.exchange.scheduler import schedule_phase
    from ipu_stack.package import build as build_module

    built = build(_graph(), BuildConfig(tiles=8))
    plain = {}
    for index, (phase, _) in built.schedules.items():
        word32 = replaced(
            phase, transfers=tuple(replaced(t, width=WORD32) for t in phase.transfers)
        )
        plain[index] = (word32, schedule_phase(word32))
    again = build_module._rescheduled(built.program, built.placement, built.placement, plain)
    for index, (phase, schedule) in again.items():
        paired = any(t.width == PAIRED64 for t in phase.transfers)
        assert (schedule is not plain[index][1]) == paired
        verify_schedule(phase, schedule)

"""Phase reports remembered by content: the key sees every field the scheduler reads."""

import dataclasses

import numpy as np
import pytest

from ipu_stack.exchange import patterns
from ipu_stack.exchange.memo import ScheduleMemo, phase_key
from ipu_stack.exchange.model import IPU21_MODEL, PORTS_ONLY, ExchangePhase, Transfer
from ipu_stack.exchange.scheduler import optimize_phase


def _phase() -> ExchangePhase:
    return patterns.random_unicast_phase(np.random.default_rng(3), 40, tile_count=16)


def _replace_first(phase: ExchangePhase, **changes: object) -> ExchangePhase:
    first = dataclasses.replace(phase.transfers[0], **changes)
    return ExchangePhase((first, *phase.transfers[1:]), phase.tile_count)


def test_equal_content_gives_equal_keys() -> None:
    assert phase_key(_phase(), IPU21_MODEL, 0.5) == phase_key(_phase(), IPU21_MODEL, 0.5)


@pytest.mark.parametrize(
    "change",
    [
        lambda t: {"source_address": t.source_address + 4},
        lambda t: {"words": t.words + 1},
        lambda t: {"destinations": ((t.destinations[0][0], t.destinations[0][1] + 4),)},
        lambda t: {"destinations": (((t.destinations[0][0] + 1) % 16, t.destinations[0][1]),)},
    ],
)
def test_any_transfer_field_changes_the_key(change) -> None:
    phase = _phase()
    first: Transfer = phase.transfers[0]
    if first.source == (first.destinations[0][0] + 1) % 16:
        pytest.skip("the changed destination would equal the source")
    changed = _replace_first(phase, **change(first))
    assert phase_key(changed, IPU21_MODEL, 0.5) != phase_key(phase, IPU21_MODEL, 0.5)


def test_order_model_options_and_tile_count_change_the_key() -> None:
    phase = _phase()
    key = phase_key(phase, IPU21_MODEL, 0.5)
    reordered = ExchangePhase(phase.transfers[::-1], phase.tile_count)
    assert phase_key(reordered, IPU21_MODEL, 0.5) != key
    assert phase_key(phase, PORTS_ONLY, 0.5) != key
    assert phase_key(phase, IPU21_MODEL, 0.2) != key
    assert phase_key(ExchangePhase(phase.transfers, 17), IPU21_MODEL, 0.5) != key


def test_memo_returns_what_was_put_and_counts_hits() -> None:
    phase = _phase()
    report = optimize_phase(phase, time_budget=0.0, wall_clock_guards=False)
    memo = ScheduleMemo()
    key = phase_key(phase, IPU21_MODEL, 0.0)
    assert memo.get(key) is None and memo.hits == 0
    memo.put(key, report)
    assert memo.get(key) is report and memo.hits == 1


def _shifted(phase: ExchangePhase, by: int) -> ExchangePhase:
    """The same transfers with every address moved by ``by`` bytes (no SRAM element changes
    when ``by`` is a multiple of the element size)."""
    return ExchangePhase(
        tuple(
            dataclasses.replace(
                t,
                source_address=t.source_address + by,
                destinations=tuple((d, a + by) for d, a in t.destinations),
            )
            for t in phase.transfers
        ),
        phase.tile_count,
    )


def test_a_phase_moved_to_other_addresses_reuses_the_schedule_and_still_verifies() -> None:
    from ipu_stack.exchange.constraints import compile_phase
    from ipu_stack.exchange.memo import problem_key
    from ipu_stack.exchange.verify import verify_schedule
    from ipu_stack.target.ipu21 import ELEMENT_BYTES

    phase = patterns.multicast_phase(np.random.default_rng(4), 60, tile_count=32, words=(8, 64))
    moved = _shifted(phase, ELEMENT_BYTES)
    assert phase_key(moved, IPU21_MODEL) != phase_key(phase, IPU21_MODEL)
    assert problem_key(compile_phase(moved, IPU21_MODEL), IPU21_MODEL) == problem_key(
        compile_phase(phase, IPU21_MODEL), IPU21_MODEL
    )
    memo = ScheduleMemo()
    first = optimize_phase(phase, time_budget=0.1, wall_clock_guards=False, memo=memo)
    again = optimize_phase(moved, time_budget=0.1, wall_clock_guards=False, memo=memo)
    assert memo.hits == 1 and again.schedule == first.schedule
    verify_schedule(moved, again.schedule)
    # Other options are another question.
    optimize_phase(moved, time_budget=0.1, wall_clock_guards=False, memo=memo, max_pieces=1)
    assert memo.hits == 1 and len(memo.reports) == 2


def test_a_phase_seen_before_is_not_compiled_again(monkeypatch) -> None:
    from ipu_stack.exchange import scheduler

    phase = _phase()
    memo = ScheduleMemo()
    first = optimize_phase(phase, time_budget=0.0, wall_clock_guards=False, memo=memo)
    compiled = []
    real = scheduler.compile_phase
    monkeypatch.setattr(scheduler, "compile_phase", lambda *a: compiled.append(1) or real(*a))
    again = optimize_phase(phase, time_budget=0.0, wall_clock_guards=False, memo=memo)
    assert not compiled and again.schedule == first.schedule and memo.hits == 1
    # an equal phase that is another object, or other options: compiled (then found by content)
    copy = ExchangePhase(tuple(phase.transfers), phase.tile_count)
    same = optimize_phase(copy, time_budget=0.0, wall_clock_guards=False, memo=memo)
    assert compiled == [1] and same.schedule == first.schedule and memo.hits == 2
    # other options: the phase object's problem digest is remembered, so not compiled again
    # to find its key; the new question is scheduled (compiled) once
    optimize_phase(phase, time_budget=0.0, wall_clock_guards=False, memo=memo, max_pieces=1)
    assert compiled == [1, 1]
    optimize_phase(copy, time_budget=0.0, wall_clock_guards=False, memo=memo, max_pieces=1)
    assert compiled == [1, 1] and memo.hits == 3


def test_a_problem_compiled_for_its_key_is_not_compiled_again(monkeypatch) -> None:
    from ipu_stack.exchange import scheduler
    from ipu_stack.package.schedule_program import EXCHANGE_TARGET_GAP, phase_problem_key

    phase = _phase()
    memo = ScheduleMemo()
    key = phase_problem_key(phase, 0.0, memo)
    compiled = []
    real = scheduler.compile_phase
    monkeypatch.setattr(scheduler, "compile_phase", lambda *a: compiled.append(1) or real(*a))
    report = optimize_phase(phase, time_budget=0.0, target_gap=EXCHANGE_TARGET_GAP,
                            wall_clock_guards=False, memo=memo)  # fmt: skip
    assert not compiled and memo.reports[key] is report and not memo.problems
    fresh = optimize_phase(phase, time_budget=0.0, target_gap=EXCHANGE_TARGET_GAP,
                           wall_clock_guards=False)  # fmt: skip
    assert fresh.schedule == report.schedule

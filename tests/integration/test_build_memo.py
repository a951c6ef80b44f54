"""A build schedules each distinct exchange problem once (the memo), with the same result."""

import ipu_stack.exchange.scheduler as scheduler_module
import ipu_stack.package.build as build_module
from ipu_stack.exchange.memo import ScheduleMemo


def test_rescheduling_a_program_with_the_same_memo_reuses_every_report(small_build, monkeypatch):
    _, built, _ = small_build
    calls = []
    real = scheduler_module._optimize

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(scheduler_module, "_optimize", counting)
    memo = ScheduleMemo()
    first = build_module._schedule(built.program, built.placement, 0.1, None, True, memo)
    made = len(calls)
    assert 0 < made <= len(first)
    assert len(memo.verified) == len(first)
    again = build_module._schedule(built.program, built.placement, 0.1, None, True, memo)
    assert len(calls) == made  # nothing scheduled twice
    assert memo.hits == len(first) + len(first) - made
    for index, (phase, schedule) in first.items():
        assert again[index][0] == phase
        assert again[index][1] == schedule
    # A different budget is a different question: scheduled afresh.
    build_module._schedule(built.program, built.placement, 0.2, None, False, memo)
    assert len(calls) == 2 * made

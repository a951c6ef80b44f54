"""A build schedules each distinct exchange problem once (the memo), with the same result."""

import ipu_stack.exchange.scheduler as scheduler_module
from ipu_stack.exchange.memo import ScheduleMemo
from ipu_stack.package.schedule_program import schedule_program


def test_rescheduling_a_program_with_the_same_memo_reuses_every_report(small_build, monkeypatch):
    _, built, _ = small_build
    calls = []
    real = scheduler_module._optimize

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(scheduler_module, "_optimize", counting)
    memo = ScheduleMemo()
    first = schedule_program(built.program, built.placement, 0.1, None, True, memo)
    made = len(calls)
    assert 0 < made <= len(first)
    assert len(memo.verified) == len(first)
    again = schedule_program(built.program, built.placement, 0.1, None, True, memo)
    assert len(calls) == made  # nothing scheduled twice
    assert memo.hits == len(first) + len(first) - made
    for index, (phase, schedule) in first.items():
        assert again[index][0] == phase
        assert again[index][1] == schedule
    # A different budget is a different question: scheduled afresh.
    schedule_program(built.program, built.placement, 0.2, None, False, memo)
    assert len(calls) == 2 * made


def test_phases_scheduled_in_worker_processes_are_the_same(monkeypatch):
    import ipu_stack.package.schedule_program as schedule_module
    from ipu_stack.graph import ComputeGraph
    from ipu_stack.package.build import BuildConfig, build

    g = ComputeGraph()
    x = g.host_input("x", (64, 96), "f16")
    h = g.gelu(g.gemm(x, g.parameter("w1", (96, 160), "f16")))
    g.set_outputs(g.gemm(h, g.parameter("w2", (160, 96), "f16")))
    built = build(g, BuildConfig(tiles=64, finalists=1, exchange_time_budget=0.0))
    alone = schedule_module.schedule_program(built.program, built.placement, 0.1, None)
    phases = {i: p for i, (p, _) in alone.items()}
    monkeypatch.setattr(schedule_module, "PARALLEL_TRANSFERS", 0)
    monkeypatch.setattr(schedule_module.os, "cpu_count", lambda: 3)
    groups = schedule_module._groups(phases)
    assert schedule_module._processes(phases, len(groups)) > 1  # really shared out
    shared = schedule_module.schedule_program(built.program, built.placement, 0.1, None)
    assert shared.keys() == alone.keys()
    for index, (phase, schedule) in alone.items():
        assert shared[index][0] == phase
        assert shared[index][1] == schedule


def test_refine_keeps_quick_schedules_unless_the_gap_is_worth_the_full_budget():
    from ipu_stack.graph import ComputeGraph
    from ipu_stack.package.build import BuildConfig, build
    from ipu_stack.package.schedule_program import Refine
    from ipu_stack.trace import Trace

    g = ComputeGraph()
    x = g.host_input("x", (64, 96), "f16")
    h = g.gelu(g.gemm(x, g.parameter("w1", (96, 160), "f16")))
    g.set_outputs(g.gemm(h, g.parameter("w2", (160, 96), "f16")))
    built = build(g, BuildConfig(tiles=64, finalists=1, exchange_time_budget=0.0))
    program, placement = built.program, built.placement

    def schedules(budget, refine=None, trace=None):
        out = schedule_program(program, placement, budget, trace, True, ScheduleMemo(),
                               refine=refine)  # fmt: skip
        return {i: s for i, (_, s) in out.items()}

    quick, full = schedules(0.0), schedules(0.3)
    assert quick != full  # the full budget shortens some phase here
    # No gap is worth a huge gain: every phase keeps its quick schedule.
    trace = Trace(quiet=True)
    assert schedules(0.3, Refine(0.0, 10**9), trace) == quick
    (event,) = [e for e in trace.events if e["event"] == "refined exchange schedules"]
    assert event["rescheduled"] == 0 and event["kept_quick"] == len(quick)
    # Any gap is worth it (min_gain 0): the full budget everywhere, as without the rule.
    assert schedules(0.3, Refine(0.0, 0)) == full
    # A final budget no larger than the quick one schedules every phase at that budget.
    assert schedules(0.0, Refine(0.3, 0)) == quick

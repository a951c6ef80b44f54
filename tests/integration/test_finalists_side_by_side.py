"""Finalists evaluated side by side (one process each, each distinct exchange problem
scheduled once) give the numbers of separate evaluations; failures are reported."""

import pytest

import ipu_stack.package.finalists as finalists_module
from ipu_stack.errors import PlanError
from ipu_stack.exchange.memo import ScheduleMemo
from ipu_stack.graph import ComputeGraph
from ipu_stack.mid.lower_mid import lower_mid
from ipu_stack.package.finalists import evaluate, evaluate_finalists
from ipu_stack.trace import Trace

TILES = 64


@pytest.fixture(scope="module")
def planned():
    g = ComputeGraph()
    x = g.host_input("x", (64, 96), "f16")
    h = g.gelu(g.gemm(x, g.parameter("w1", (96, 160), "f16")))
    h = g.gelu(g.gemm(h, g.parameter("w2", (160, 128), "f16")))
    g.set_outputs(g.gemm(h, g.parameter("w3", (128, 96), "f16")))
    finalists = lower_mid(g, TILES, 3, trace=Trace(quiet=True))[:3]
    assert len(finalists) >= 2
    return g, finalists


def _placement_raises(monkeypatch, finalist, error):
    """Make placing ``finalist`` raise ``error`` (in whichever process places it)."""
    real = finalists_module.place_finalist

    def raising(graph, candidate, tiles, trace):
        if candidate is finalist:
            raise error
        return real(graph, candidate, tiles, trace)

    monkeypatch.setattr(finalists_module, "place_finalist", raising)


def test_side_by_side_matches_separate_evaluations(planned):
    g, finalists = planned
    memo = ScheduleMemo()
    outcomes, kept = evaluate_finalists(g, finalists, TILES, 0.05, memo)
    assert [err for _, _, err in outcomes] == [None] * len(finalists)
    for finalist, (refined, events, _) in zip(finalists, outcomes, strict=True):
        alone = Trace(quiet=True)
        evaluated = evaluate(g, finalist, TILES, alone, 0.05, ScheduleMemo())
        assert refined == evaluated.refined_cycles
        assert [e["event"] for e in events] == [e["event"] for e in alone.events]
    assert kept is not None and kept.finalist is finalists[0]
    assert kept.refined_cycles == outcomes[0][0]
    assert memo.reports  # finalist 0's reports stay for the winner's refinement


def test_a_worker_placement_failure_is_that_finalists_outcome(planned, monkeypatch):
    g, finalists = planned
    _placement_raises(monkeypatch, finalists[1], PlanError("tile 3: short by 12 B"))
    outcomes, kept = evaluate_finalists(g, finalists, TILES, 0.05, ScheduleMemo())
    assert outcomes[1][0] is None and "short by 12 B" in str(outcomes[1][2])
    assert outcomes[0][0] is not None and kept is not None


def test_finalist_zero_failing_leaves_its_problems_to_the_others(planned, monkeypatch):
    g, finalists = planned
    _placement_raises(monkeypatch, finalists[0], PlanError("tile 0: short by 1 B"))
    outcomes, kept = evaluate_finalists(g, finalists, TILES, 0.05, ScheduleMemo())
    assert kept is None and outcomes[0][2] is not None
    alone = evaluate(g, finalists[1], TILES, Trace(quiet=True), 0.05, ScheduleMemo())
    assert outcomes[1][0] == alone.refined_cycles


def test_a_worker_crash_is_raised_with_its_traceback(planned, monkeypatch):
    g, finalists = planned
    _placement_raises(monkeypatch, finalists[1], ZeroDivisionError("planted"))
    with pytest.raises(RuntimeError, match="finalist worker process failed") as caught:
        evaluate_finalists(g, finalists, TILES, 0.05, ScheduleMemo())
    assert "ZeroDivisionError: planted" in str(caught.value)

"""A loop body's GEMM operands with K padding are zero-filled once, before the loop
(``lower_gemm``'s ``prologue``): each iteration's gather rewrites the data, never the padding,
and the placement keeps those buffers to themselves for the whole loop."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from ipu_stack.graph import ComputeGraph, evaluate_reference
from ipu_stack.low.program import ComputeStep, ExchangeStep, FillCall, Ref, RepeatStep, View
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.place import assign
from ipu_stack.runtime.sim import SimDevice

T, H, INNER, N = 64, 72, 88, 3  # K = 72 and 88: not multiples of the F16 K micro-block


def _repeated() -> tuple[ComputeGraph, str]:
    g = ComputeGraph()
    x = g.host_input("x", (T, H), "f16")
    w1 = g.parameter("W1", (N, H, INNER), "f16")
    w2 = g.parameter("W2", (N, INNER, H), "f16")

    def body(sg, c, inv, it):
        return sg.add(sg.gemm(sg.gelu(sg.gemm(c, it[0])), it[1]), c)

    y = g.repeat(N, x, [], [w1, w2], body)
    g.set_outputs(y)
    return g, y.name


def _check_against_reference(g: ComputeGraph, built, out_name: str, seed: int) -> None:
    """The simulated loop equals the graph's reference within F16 accuracy."""
    rng = np.random.default_rng(seed)
    feeds = {
        "x": rng.uniform(-1, 1, (T, H)).astype(np.float16),
        "W1": (rng.uniform(-1, 1, (N, H, INNER)) * 0.15).astype(np.float16),
        "W2": (rng.uniform(-1, 1, (N, INNER, H)) * 0.15).astype(np.float16),
    }
    got = SimDevice().run(built.program, built.placement, built.schedules, feeds).outputs[out_name]
    want = evaluate_reference(g, feeds)[out_name].astype(np.float64)
    assert np.abs(got.astype(np.float64) - want).max() <= 0.02 * np.abs(want).max()


def _refs(obj: object) -> list[Ref]:
    """Every buffer reference of a call (its fields, views' refs, tuples of them)."""
    out: list[Ref] = []
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        v = getattr(obj, f.name)
        for item in v if isinstance(v, tuple) and not isinstance(v, Ref) else (v,):
            if isinstance(item, Ref):
                out.append(item)
            elif isinstance(item, View):
                out.append(item.ref)
    return out


def _touched_in(steps: list) -> set[tuple[int, str]]:
    keys: set[tuple[int, str]] = set()
    for step in steps:
        if isinstance(step, ComputeStep):
            keys.update((c.tile, r.buffer) for c in step.calls for r in _refs(c))
        elif isinstance(step, ExchangeStep):
            for t in step.transfers:
                keys.add((t.source_tile, t.source.buffer))
                keys.update((tile, r.buffer) for tile, r in t.destinations)
    return keys


@pytest.mark.parametrize("widened", [True, False])
def test_padding_is_filled_once_and_kept_for_the_whole_loop(monkeypatch, widened):
    if not widened:  # the mutation: loop bodies do not widen lifetimes
        monkeypatch.setattr(assign, "_repeat_spans", lambda p, keys, first, last, w: [
            (first[k], last[k]) for k in keys])  # fmt: skip
    g, out_name = _repeated()
    built = build(g, BuildConfig(tiles=64, compile_kernels=False))
    steps = built.program.steps
    loop = next(i for i, s in enumerate(steps) if isinstance(s, RepeatStep))
    body = steps[loop + 1 : loop + 1 + steps[loop].length]
    filled = {
        (c.tile, c.dst.buffer)
        for s in steps[:loop]
        if isinstance(s, ComputeStep)
        for c in s.calls
        if isinstance(c, FillCall)
    }
    assert any(name.endswith(".left") for _, name in filled)
    in_body = {
        (c.tile, c.dst.buffer)
        for s in body
        if isinstance(s, ComputeStep)
        for c in s.calls
        if isinstance(c, FillCall)
    }
    assert not filled & in_body  # filled before the loop, not in every iteration
    # independent of the placement's lifetimes: nothing the body touches shares their bytes
    clashes = []
    for tile, name in sorted(filled):
        mine = built.placement.allocations[tile][name]
        for other_tile, other in _touched_in(body):
            if other_tile != tile or other == name:
                continue
            theirs = built.placement.allocations[tile][other]
            if (
                mine.address < theirs.address + theirs.size
                and theirs.address < mine.address + mine.size
            ):
                clashes.append((tile, name, other))
    assert (not clashes) == widened, clashes[:3]
    if not widened:
        return
    _check_against_reference(g, built, out_name, seed=0)


def _hoisted_placements_fail(monkeypatch, rounds: int) -> list[object]:
    """``place_program`` refuses the first lowering (padding zeroed once) of the first
    ``rounds`` capacity rounds, as if the loop's kept buffers took the room."""
    from ipu_stack.errors import PlanError
    from ipu_stack.package import finalists

    real = finalists.place_program
    calls: list[object] = []

    def refuse(program, *args, **kwargs):
        calls.append(program)
        if len(calls) % 2 == 1 and len(calls) < 2 * rounds:
            raise PlanError("tile 0: no room (as if the loop's zeroed buffers took it)")
        return real(program, *args, **kwargs)

    monkeypatch.setattr(finalists, "place_program", refuse)
    return calls


def _body_fills(built) -> list[FillCall]:
    steps = built.program.steps
    loop = next(i for i, s in enumerate(steps) if isinstance(s, RepeatStep))
    body = steps[loop + 1 : loop + 1 + steps[loop].length]
    return [c for s in body if isinstance(s, ComputeStep) for c in s.calls
            if isinstance(c, FillCall) and c.dst.buffer.endswith(".left")]  # fmt: skip


def _events(built, name: str) -> list[dict]:
    return [e for e in built.trace.events if e.get("event") == name]


def test_a_placement_that_fails_is_tried_again_with_padding_zeroed_every_iteration(monkeypatch):
    calls = _hoisted_placements_fail(monkeypatch, rounds=2)
    g, out_name = _repeated()
    built = build(g, BuildConfig(tiles=64, compile_kernels=False, finalists=1))
    assert len(_events(built, "placed with loop padding zeroed every iteration")) == 2
    # the round after a plan with its padding zeroed every iteration: no third round
    (compared,) = _events(built, "compared plans of two capacity rounds")
    assert not compared["padding_hoisted"] and len(calls) == 4
    assert _body_fills(built)  # zeroed in the body again
    _check_against_reference(g, built, out_name, seed=1)


def test_the_next_rounds_plan_with_padding_zeroed_once_is_kept_when_faster(monkeypatch):
    """A plan that only fits with its loop padding zeroed every iteration is compared with the
    next capacity round's, on the cycles the simulator will charge; the loop's phases count
    once per iteration there, so the prediction is the simulated figure."""
    from ipu_stack.package.finalists import predicted_cycles

    _hoisted_placements_fail(monkeypatch, rounds=1)
    g, out_name = _repeated()
    built = build(g, BuildConfig(tiles=64, compile_kernels=False, finalists=1))
    (compared,) = _events(built, "compared plans of two capacity rounds")
    assert compared["padding_hoisted"] and compared["capacity_scale"] < 1.0
    faster = compared["predicted_cycles"] < compared["earlier_predicted_cycles"]
    assert compared["kept"] == ("this" if faster else "earlier")
    assert (not _body_fills(built)) == faster
    rng = np.random.default_rng(2)
    feeds = {
        "x": rng.uniform(-1, 1, (T, H)).astype(np.float16),
        "W1": (rng.uniform(-1, 1, (N, H, INNER)) * 0.15).astype(np.float16),
        "W2": (rng.uniform(-1, 1, (N, INNER, H)) * 0.15).astype(np.float16),
    }
    run = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    kept = min(compared["predicted_cycles"], compared["earlier_predicted_cycles"])
    assert run.cycles == kept
    selected = SimpleNamespace(program=built.program, schedules=built.schedules)
    assert predicted_cycles(selected) == run.cycles  # type: ignore[arg-type]
    _check_against_reference(g, built, out_name, seed=3)


def test_a_plan_that_fits_with_its_padding_zeroed_once_ends_the_rounds():
    g, _ = _repeated()
    built = build(g, BuildConfig(tiles=64, compile_kernels=False, finalists=1))
    assert not _events(built, "compared plans of two capacity rounds")
    assert len(_events(built, "package build phase finished")) >= 1
    assert sum(e["phase"] == "lower_mid" for e in
               _events(built, "package build phase finished")) == 1  # fmt: skip

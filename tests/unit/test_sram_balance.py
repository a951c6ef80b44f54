"""Resident weight balance: GEMMs on few tiles spread over the machine, finalists that cannot
hold their weights rejected before placement, SRAM failure messages, deterministic builds."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from ipu_stack.errors import PlanError
from ipu_stack.graph.compute_graph import ComputeGraph, evaluate_reference
from ipu_stack.low.lower import lower_program
from ipu_stack.low.program import Buffer, ComputeStep, ExchangeStep, GemmCall, LowProgram
from ipu_stack.mid.lower_mid import lower_mid
from ipu_stack.package import finalists as finalists_module
from ipu_stack.package.assemble import build_package
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.place import balance
from ipu_stack.place.sram import BufferRequest, Region, allocate_tile, usable_bytes
from ipu_stack.runtime.sim import SimDevice
from ipu_stack.trace import Trace

TILES = 64


def _narrow_gemms(count: int = 6) -> tuple[ComputeGraph, dict[str, np.ndarray]]:
    """A chain of M=4 GEMMs with narrow weights: each plan uses a few of the 64 tiles."""
    g = ComputeGraph()
    rng = np.random.default_rng(1)
    x = g.host_input("x", (4, 64), "f32")
    params = {}
    h = x
    for i in range(count):
        w = g.parameter(f"w{i}", (64, 64), "f32")
        params[f"w{i}"] = rng.uniform(-0.2, 0.2, (64, 64)).astype(np.float32)
        h = g.gemm(h, w, name=f"mm{i}")
    g.set_outputs(h)
    return g, params


def _resident_per_tile(program: LowProgram) -> np.ndarray:
    """Independent of place/balance.py: host-written bytes per logical tile."""
    per_tile: dict[int, int] = defaultdict(int)
    for buf in program.buffers:
        if buf.host_written:
            per_tile[buf.tile] += buf.size
    out = np.zeros(TILES, dtype=np.int64)
    for tile, size in per_tile.items():
        out[tile] = size
    return out


def _lowered(graph: ComputeGraph, rotate: bool, finalist) -> LowProgram:
    plans = {op.id: finalist.gemm_plans[op.name] for op in graph.operations if op.kind == "gemm"}
    offsets = balance.tile_offsets(graph, finalist.gemm_plans, TILES)[0] if rotate else {}
    return lower_program(graph, plans, TILES, finalist.row_tiles, offsets)


def test_small_weights_are_not_moved():
    g, _ = _narrow_gemms()
    finalist = lower_mid(g, TILES, 1)[0]
    offsets, stacked = balance.tile_offsets(g, finalist.gemm_plans, TILES)
    assert offsets == {} and 0 < stacked.max() <= balance.STACKED_LIMIT * usable_bytes("any")


def test_narrow_gemm_weights_are_spread_over_the_tiles(monkeypatch):
    monkeypatch.setattr(balance, "STACKED_LIMIT", 0.0)  # as if the weights were large
    g, _ = _narrow_gemms()
    finalist = lower_mid(g, TILES, 1)[0]
    assert max(p.tiles for p in finalist.gemm_plans.values()) < TILES // 2  # few tiles each
    program = _lowered(g, True, finalist)
    rotated = _resident_per_tile(program)
    stacked = _resident_per_tile(_lowered(g, False, finalist))
    mean = rotated.sum() / TILES
    assert rotated.sum() == stacked.sum()  # the same bytes, elsewhere
    assert rotated.max() <= 2 * mean  # balanced
    assert stacked.max() > 3 * mean  # without the rotation every GEMM piles onto tile 0
    # the balance's own figures agree with the independent count
    assert (balance.resident_bytes(program)[:TILES] == rotated).all()


def test_rotated_gemms_still_compute_the_right_result_and_build_deterministically(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(balance, "STACKED_LIMIT", 0.0)
    g, params = _narrow_gemms()
    config = BuildConfig(tiles=TILES, compile_kernels=False)
    built = build(g, config)
    x = np.random.default_rng(2).uniform(-1, 1, (4, 64)).astype(np.float32)
    feeds = {"x": x, **params}
    got = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    (out,) = got.outputs.values()
    ref = evaluate_reference(g, feeds)
    (want,) = ref.values() if isinstance(ref, dict) else (ref,)
    assert np.abs(out - want).max() <= 1e-4 * np.abs(want).max()
    tiles = {c.tile for s in built.program.steps for c in getattr(s, "calls", ())}
    assert max(tiles) >= TILES // 2  # some GEMM really runs away from tile 0
    # same input, same package bytes
    sizes = [build_package(g, config, params).save(tmp_path / f"{i}.ipuexe") for i in range(2)]
    assert sizes[0] == sizes[1]
    assert (tmp_path / "0.ipuexe").read_bytes() == (tmp_path / "1.ipuexe").read_bytes()


def test_resident_check_names_tile_region_and_shortfall():
    cap = usable_bytes(Region.ANY)
    program = LowProgram(
        2,
        [
            Buffer(0, "a.right", 64, 32, "any", host_written=True),
            Buffer(1, "b.right", cap - 1000, 32, "any", host_written=True),
            Buffer(1, "c.right", 2000, 32, "any", host_written=True),
            Buffer(1, "scratch", 100_000, 32, "any"),  # not host-written: not counted
        ],
        [],
        [],
        0,
        0,
        {},
    )
    with pytest.raises(PlanError) as err:
        balance.check_resident(program, 3)
    message = str(err.value)
    assert "finalist 3 rejected before placement: tile 1" in message
    assert f"{cap + 1000} B" in message and "short by 1000 B" in message
    program.buffers.pop(2)
    figures = balance.check_resident(program, 3)
    assert figures["busiest_tile"] == 1 and figures["busiest_resident_bytes"] == cap - 1000


def test_finalist_that_cannot_hold_its_weights_is_rejected_before_placement(monkeypatch):
    g, _ = _narrow_gemms(3)
    monkeypatch.setattr(balance, "usable_bytes", lambda region: 1024)  # a tiny tile

    def never(*args, **kwargs):
        raise AssertionError("placement attempted")

    monkeypatch.setattr(finalists_module, "place_program", never)
    trace = Trace(quiet=True)
    with pytest.raises(PlanError, match="rejected before placement"):
        build(g, BuildConfig(tiles=TILES, finalists=2, compile_kernels=False), trace)
    reasons = [
        e["reason"]
        for e in trace.events
        if e["event"] == "placement failed; trying the next finalist"
    ]
    assert reasons and all("rejected before placement" in str(r) for r in reasons)


def test_sram_failure_reports_free_bytes_within_the_region():
    standard, interleaved = usable_bytes(Region.STANDARD), usable_bytes(Region.INTERLEAVED)
    requests = [
        BufferRequest("s", standard - 512, 8, Region.STANDARD),
        BufferRequest("i", interleaved - 256, 8, Region.INTERLEAVED),
        BufferRequest("x", 4096, 8, Region.ANY),
    ]
    with pytest.raises(PlanError) as err:
        allocate_tile(requests)
    message = str(err.value)
    assert "'x'" in message and "768 B free there" in message
    assert "short by 3584 B" in message  # 4096 - the largest hole (512 B)


def _shared_left(rng: np.random.Generator) -> tuple[ComputeGraph, dict[str, np.ndarray]]:
    """Q, K and V style: three narrow GEMMs reading one on-chip value with equal plans."""
    g = ComputeGraph()
    x = g.host_input("x", (4, 64), "f32")
    params = {"w0": rng.uniform(-0.2, 0.2, (64, 64)).astype(np.float32)}
    h = g.gemm(x, g.parameter("w0", (64, 64), "f32"), name="pre")
    outs = []
    for n in "qkv":
        params[f"w{n}"] = rng.uniform(-0.2, 0.2, (64, 64)).astype(np.float32)
        outs.append(g.gemm(h, g.parameter(f"w{n}", (64, 64), "f32"), name=n))
    g.set_outputs(*outs)
    return g, params


def _left_deliveries(program: LowProgram) -> int:
    """Exchange steps that move ``pre``'s output into a GEMM's left operand buffer."""
    return sum(
        any(
            t.source.buffer == "pre.out" and ref.buffer.endswith(".left")
            for t in s.transfers
            for _, ref in t.destinations
        )
        for s in program.steps
        if isinstance(s, ExchangeStep)
    )


@pytest.mark.parametrize("grouped", [True, False])
def test_gemms_sharing_a_left_operand_keep_one_tile_range_and_one_delivery(monkeypatch, grouped):
    monkeypatch.setattr(balance, "STACKED_LIMIT", 0.0)
    if not grouped:  # the mutation: every GEMM placed on its own
        monkeypatch.setattr(balance, "shared_left_key", lambda *a: None)
    g, params = _shared_left(np.random.default_rng(3))
    finalist = lower_mid(g, TILES, 1)[0]
    plans = finalist.gemm_plans
    assert plans["q"] == plans["k"] == plans["v"] and plans["q"].tiles < TILES // 2
    offsets = balance.tile_offsets(g, plans, TILES)[0]
    assert (offsets["q"] == offsets["k"] == offsets["v"]) == grouped
    program = _lowered(g, True, finalist)
    assert _left_deliveries(program) == (1 if grouped else 3)
    gemm_steps = {
        c.out.buffer: i
        for i, s in enumerate(program.steps)
        if isinstance(s, ComputeStep)
        for c in s.calls
        if isinstance(c, GemmCall)
    }
    # grouped, the three run in one compute step (lowered side by side: gemm_groups.py)
    assert (gemm_steps["q.out"] == gemm_steps["k.out"] == gemm_steps["v.out"]) == grouped
    built = build(g, BuildConfig(tiles=TILES, compile_kernels=False))
    x = np.random.default_rng(4).uniform(-1, 1, (4, 64)).astype(np.float32)
    got = SimDevice().run(built.program, built.placement, built.schedules, {"x": x, **params})
    h = x @ params["w0"]
    for out, n in zip(got.outputs.values(), "qkv", strict=True):
        want = h @ params[f"w{n}"]
        assert np.abs(out - want).max() <= 1e-4 * np.abs(want).max()

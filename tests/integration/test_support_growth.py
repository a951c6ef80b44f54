"""A tile whose exchange rows, code and operand tables outgrow the support reservation gets a
larger one (whole 16 KiB elements), its data placed below it, and the package still runs
from its images with the same outputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ipu_stack.errors import PlanError
from ipu_stack.graph import ComputeGraph
from ipu_stack.package import build as build_module
from ipu_stack.package.assemble import assemble_package
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.session import Session
from ipu_stack.runtime.sim import SimDevice
from ipu_stack.target import ipu21
from ipu_stack.trace import Trace


def _graph() -> tuple[ComputeGraph, dict[str, np.ndarray]]:
    g = ComputeGraph()
    x = g.host_input("x", (64, 96), "f16")
    rng = np.random.default_rng(5)
    params = {n: rng.uniform(-0.2, 0.2, s).astype(np.float16)
              for n, s in (("w1", (96, 160)), ("w2", (160, 96)))}  # fmt: skip
    h = g.gelu(g.gemm(x, g.parameter("w1", (96, 160), "f16")))
    g.set_outputs(g.add(g.gemm(h, g.parameter("w2", (160, 96), "f16")), x))
    return g, params


def _support(images) -> dict[int, int]:
    return {t.tile: t.row_bytes + ipu21.ROW_GUARD_BYTES + t.code_bytes + t.table_bytes
            for t in images.tiles}  # fmt: skip


def _run(built, params, x, tmp_path, name):
    path = tmp_path / f"{name}.ipuexe"
    assemble_package(built, params).save(path)
    session = Session(SimDevice()).load(path)
    session.initialize()
    return next(iter(session.run({"x": x}).values()))


@pytest.mark.parametrize("placed_again", [False, True])
def test_a_tile_outgrowing_its_support_gets_more_and_runs_the_same(
    tmp_path, monkeypatch, placed_again
):
    if placed_again:  # as if the tile's data reached into the larger reservation
        monkeypatch.setattr(build_module, "_clear_of", lambda *a: False)
    g, params = _graph()
    built = build(g, BuildConfig(tiles=16, finalists=1, compile_kernels=False))
    support = sorted(_support(built.images).values())
    small = (support[-1] + support[-2]) // 2  # the busiest tile does not fit, the others do
    if small == support[-1]:
        pytest.skip("two tiles need the same support")
    trace = Trace(quiet=True)
    images, placement, schedules, runtime = build_module._fitted_tile_code(
        built.program, built.placement, built.schedules, built.runtime, trace, small
    )
    grown = [e for e in trace.events if e.get("event") == "support reservation grown"]
    assert len(grown) == 1 and grown[0]["data_moved"] == placed_again
    assert (placement is built.placement) != placed_again
    logical = grown[0]["logical_tile"]
    reservation = grown[0]["reservation_bytes"]
    assert reservation % ipu21.ELEMENT_BYTES == 0 and reservation >= support[-1] > small
    # independent of the allocator: that tile's data lies below its support
    base = ipu21.EXECUTABLE_LIMIT - reservation
    for alloc in placement.allocations[logical].values():
        assert alloc.address + alloc.size <= base or alloc.address >= ipu21.INTERLEAVED_BASE
    image = next(t for t in images.tiles if t.tile == int(placement.physical[logical]))
    assert min(a for a, _, _ in image.segments if a >= ipu21.STANDARD_DATA_BASE) == base
    regrown = dataclasses.replace(built, images=images, placement=placement,
                                  schedules=schedules, runtime=runtime)  # fmt: skip
    x = np.random.default_rng(6).uniform(-1, 1, (64, 96)).astype(np.float16)
    np.testing.assert_array_equal(
        _run(regrown, params, x, tmp_path, "grown"), _run(built, params, x, tmp_path, "plain")
    )


def test_support_that_cannot_grow_enough_is_the_error(monkeypatch):
    g, _ = _graph()
    built = build(g, BuildConfig(tiles=16, finalists=1, compile_kernels=False))
    monkeypatch.setattr(build_module, "MAX_SUPPORT_RESERVATION", 0)
    with pytest.raises(PlanError, match=r"place_storage: tile \d+ needs \d+ bytes of support"):
        build_module._fitted_tile_code(
            built.program, built.placement, built.schedules, built.runtime, Trace(quiet=True), 64
        )

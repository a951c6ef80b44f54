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


def _support(images, tables: bool = True) -> dict[int, int]:
    return {t.tile: t.row_bytes + ipu21.ROW_GUARD_BYTES + t.code_bytes + tables * t.table_bytes
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
    support = sorted(_support(built.images, tables=False).values())
    small = (support[-1] + support[-2]) // 16 * 8  # the busiest tile's rows and code do not fit
    assert small < support[-1]
    trace = Trace(quiet=True)
    images, placement, schedules, runtime = build_module._fitted_tile_code(
        built.program, built.placement, built.schedules, built.runtime, trace, small
    )
    grown = [e for e in trace.events if e.get("event") == "support reservations grown"]
    assert len(grown) == 1 and grown[0]["tiles_with_data_moved"] == int(placed_again)
    assert (placement is built.placement) != placed_again
    assert grown[0]["tiles"] == 1
    logical = grown[0]["busiest_logical_tile"]
    reservation = grown[0]["largest_reservation_bytes"]
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


def test_tables_that_do_not_fit_go_above_the_interleaved_data(tmp_path):
    g, params = _graph()
    built = build(g, BuildConfig(tiles=16, finalists=1, compile_kernels=False))
    code = _support(built.images, tables=False)
    whole = _support(built.images)
    small = -(-max(code.values()) // 8) * 8  # every tile's rows and code fit (8-byte aligned)
    tile = max(whole, key=lambda t: (whole[t], t))
    assert whole[tile] > small  # its tables do not
    trace = Trace(quiet=True)
    images, placement, _, _ = build_module._fitted_tile_code(
        built.program, built.placement, built.schedules, built.runtime, trace, small
    )
    assert not [e for e in trace.events if e.get("event") == "support reservations grown"]
    assert placement is built.placement  # nothing moved
    image = next(t for t in images.tiles if t.tile == tile)
    logical = int(np.flatnonzero(placement.physical == tile)[0])
    # independent of the builder: the tables lie above every buffer, below the loader limit
    top = max(a.address + a.size for a in placement.allocations[logical].values())
    (table,) = [(a, len(d)) for a, f, d in image.segments if a >= ipu21.INTERLEAVED_BASE]
    assert top <= table[0] and table[0] + table[1] <= ipu21.LOADER_LIMIT
    moved = dataclasses.replace(built, images=images)
    x = np.random.default_rng(7).uniform(-1, 1, (64, 96)).astype(np.float16)
    np.testing.assert_array_equal(
        _run(moved, params, x, tmp_path, "tables"), _run(built, params, x, tmp_path, "plain")
    )


def test_the_largest_reservation_is_the_standard_data_region_in_whole_elements():
    """Support may grow over every whole element between the runtime state and the end of
    executable memory, never into the runtime state (facts §4.4)."""
    from ipu_stack.target.ipu21 import ELEMENT_BYTES, EXECUTABLE_LIMIT, STANDARD_DATA_BASE

    start = EXECUTABLE_LIMIT - build_module.MAX_SUPPORT_RESERVATION
    assert start >= STANDARD_DATA_BASE
    assert start - ELEMENT_BYTES < STANDARD_DATA_BASE
    assert build_module.MAX_SUPPORT_RESERVATION % ELEMENT_BYTES == 0

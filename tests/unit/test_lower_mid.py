"""Whole-graph planning: finalists, their logged fields, conversions and memory failures."""

import pytest

from ipu_stack.errors import PlanError
from ipu_stack.graph import ComputeGraph
from ipu_stack.mid.lower_mid import lower_mid
from ipu_stack.trace import Trace

FIELDS = {
    "finalist",
    "values",
    "operations",
    "estimated_cycles",
    "estimated_exchange_cycles",
    "exchange_row_bytes",
    "peak_standard_bytes",
    "peak_interleaved_bytes",
    "peak_total_bytes",
    "maximum_standard_allocation_bytes",
    "active_tile_counts",
    "padding_group_counts",
    "conversion_sources",
}


def mlp(tokens=256, hidden=128, inner=512):
    g = ComputeGraph()
    x = g.host_input("x", (tokens, hidden), "f16")
    h = g.gelu(
        g.add(
            g.gemm(x, g.parameter("w1", (hidden, inner), "f16"), name="up"),
            g.parameter("b1", (inner,), "f16"),
        )
    )
    g.set_outputs(g.gemm(h, g.parameter("w2", (inner, hidden), "f16"), name="down"))
    return g


def test_finalists_are_logged_with_every_field_and_sorted():
    trace = Trace(quiet=True)
    finalists = lower_mid(mlp(), 1472, finalists=3, trace=trace)
    logged = [e for e in trace.events if e["event"] == "retained operator-plan finalist"]
    assert len(logged) == 3
    for event in logged:
        assert event.keys() >= FIELDS
    cycles = [f.branch.cycles for f in finalists[:3]]
    assert cycles == sorted(cycles)
    # every gemm has a plan in every finalist
    assert all(set(f.gemm_plans) == {"up", "down"} for f in finalists)


def test_values_and_operations_count_conversions():
    finalists = lower_mid(mlp(), 1472)
    for f in finalists:
        conversions = len(f.branch.conversions)
        assert f.values == 8 + conversions  # 4 inputs and 4 operation outputs
        assert f.operations == 4 + conversions


def test_weights_that_cannot_fit_name_operation_region_and_shortfall():
    g = ComputeGraph()
    x = g.host_input("x", (64, 8192), "f16")
    g.set_outputs(g.gemm(x, g.parameter("w", (8192, 8192), "f16"), name="huge"))
    with pytest.raises(
        PlanError,
        match=r"huge: .*does not fit in tile memory on 4 tiles: .* "
        r"bytes per tile of tile data memory .* more than",
    ):
        lower_mid(g, 4)


def test_siglip_block_finalists_have_one_tile_group_each():
    g = ComputeGraph()
    x = g.host_input("x", (4, 729, 1152), "f16")
    h = g.gelu(
        g.add(g.gemm(x, g.parameter("w1", (1152, 4304), "f16")), g.parameter("b1", (4304,), "f16"))
    )
    g.set_outputs(
        g.add(g.gemm(h, g.parameter("w2", (4304, 1152), "f16")), g.parameter("b2", (1152,), "f16"))
    )
    finalists = lower_mid(g, 1472)
    best = finalists[0].fields()
    assert best["estimated_cycles"] > best["estimated_exchange_cycles"] > 0
    assert best["peak_total_bytes"] <= 537808

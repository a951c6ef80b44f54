"""Every graph operation compiled, simulated and compared with the float64 NumPy reference."""

import numpy as np
import pytest

from ipu_stack.errors import GraphError
from ipu_stack.graph import ComputeGraph, evaluate_reference
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.sim import SimDevice

TOL = {"f16": 2e-2, "f32": 1e-4}


def check(g, tiles=64, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in g.values:
        if v.kind != "operation":
            dtype = np.float16 if v.dtype == "f16" else np.float32
            feeds[v.name] = rng.uniform(-1, 1, v.shape).astype(dtype)
    built = build(g, BuildConfig(tiles=tiles))
    result = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    for name, ref in evaluate_reference(g, feeds).items():
        got = result.outputs[name].astype(np.float64)
        dtype = next(v.dtype for v in g.values if v.name == name)
        scale = max(np.abs(ref).max(), 1e-6)
        assert got.shape == ref.shape, name
        assert np.abs(got - ref).max() <= TOL[dtype] * scale, name
    return built, result


def test_mlp_with_bias_and_gelu():
    g = ComputeGraph()
    x = g.host_input("x", (64, 96), "f16")
    h = g.gelu(
        g.add(g.gemm(x, g.parameter("w1", (96, 128), "f16")), g.parameter("b1", (128,), "f16"))
    )
    g.set_outputs(g.gemm(h, g.parameter("w2", (128, 40), "f16")))
    check(g, tiles=1472)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_layer_norm_softmax_residual(dtype):
    g = ComputeGraph()
    x = g.host_input("x", (2, 10, 48), dtype)
    ln = g.layer_norm(x, g.parameter("s", (48,), dtype), g.parameter("b", (48,), dtype))
    g.set_outputs(g.add(g.softmax(ln), x), ln)
    check(g, tiles=16)


def test_view_transpose_slice():
    g = ComputeGraph()
    x = g.host_input("x", (2, 6, 8), "f32")
    heads = g.transpose(g.view(x, (2, 6, 2, 4)), (0, 2, 1, 3))
    part = g.slice(heads, [1], [3], [2])
    merged = g.view(g.transpose(heads, (0, 2, 1, 3)), (2, 6, 8))
    g.set_outputs(heads, part, merged, g.transpose(x, (0, 2, 1)))
    check(g, tiles=8)


@pytest.mark.parametrize("causal", [False, True])
def test_attention(causal):
    g = ComputeGraph()
    q, k, v = (g.host_input(n, (2, 3, 20, 16), "f16") for n in "qkv")
    g.set_outputs(g.flash_attention(q, k, v, causal=causal))
    check(g, tiles=64)


def test_cast_and_broadcast_mul():
    g = ComputeGraph()
    x = g.host_input("x", (5, 7), "f32")
    col = g.host_input("col", (5, 1), "f32")
    g.set_outputs(g.cast(g.mul(x, col), "f16"), g.mul(x, g.parameter("row", (1, 7), "f32")))
    check(g, tiles=4)


def test_estimate_tracks_simulation_for_a_block():
    g = ComputeGraph()
    x = g.host_input("x", (128, 64), "f16")
    ln = g.layer_norm(x, g.parameter("s", (64,), "f16"), g.parameter("b", (64,), "f16"))
    y = g.add(g.gemm(ln, g.parameter("w", (64, 64), "f16")), x)
    g.set_outputs(y)
    built, result = check(g, tiles=256)
    assert abs(built.program.estimated_cycles - result.cycles) <= 0.25 * result.cycles


def test_misaligned_f16_slice_is_a_clear_error():
    g = ComputeGraph()
    x = g.host_input("x", (4, 9), "f16")
    g.set_outputs(g.slice(x, [1], [6], [1]))
    with pytest.raises(GraphError, match="inside a 32-bit word"):
        build(g, BuildConfig(tiles=2))


def test_build_trace_has_the_seed_events_and_refined_cycles_formula():
    g = ComputeGraph()
    x = g.host_input("x", (128, 64), "f16")
    h = g.gelu(g.gemm(x, g.parameter("w1", (64, 256), "f16")))
    g.set_outputs(g.gemm(h, g.parameter("w2", (256, 64), "f16")))
    built, _ = check(g, tiles=256)
    events = built.trace.events
    names = {e["event"] for e in events}
    for needed in (
        "retained operator-plan finalist",
        "screened tile mappings by exchange resource load",
        "modelled expanded operator plan",
        "scheduled operator-plan finalist",
        "selected physically scheduled operator-plan finalist",
        "lowered graph for package construction",
        "package build phase finished",
    ):
        assert needed in names, needed
    scheduled = [e for e in events if e["event"] == "scheduled operator-plan finalist"]
    for e in scheduled:
        assert e["refined_cycles"] == (
            e["analytical_cycles"]
            - e["analytical_exchange_cycles"]
            + e["scheduled_exchange_cycles"]
        )
    selected = next(
        e for e in events if e["event"] == "selected physically scheduled operator-plan finalist"
    )
    assert min(scheduled, key=lambda e: e["refined_cycles"])["finalist"] == selected["selected"]


def test_f8_gemm_accumulates_into_f16_and_casts_round_trip():
    rng = np.random.default_rng(1)
    g = ComputeGraph()
    x = g.host_input("x", (96, 128), "f8", scale_exponent=-4)
    w = g.parameter("w", (128, 80), "f8", scale_exponent=-6)
    y = g.gemm(x, w)
    z = g.cast(g.gelu(y), "f8", scale_exponent=-3)
    g.set_outputs(y, z)
    assert y.dtype == "f16" and z.dtype == "f8"
    feeds = {
        "x": rng.uniform(-1, 1, (96, 128)).astype(np.float32),
        "w": (rng.uniform(-1, 1, (128, 80)) * 0.25).astype(np.float32),
    }
    built = build(g, BuildConfig(tiles=64))
    result = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    ref = evaluate_reference(g, feeds)
    for name, expected in ref.items():
        # F143 keeps 3 mantissa bits: a few per cent of the range
        assert np.abs(result.outputs[name] - expected).max() <= 0.08 * np.abs(expected).max()


def test_f8_is_refused_where_no_kernel_takes_it():
    g = ComputeGraph()
    x = g.host_input("x", (8, 8), "f8")
    with pytest.raises(GraphError, match="does not take F8 operands"):
        g.gelu(x)


def test_compile_runtime_gives_every_tile_its_program():
    g = ComputeGraph()
    x = g.host_input("x", (64, 96), "f16")
    g.set_outputs(g.gelu(g.gemm(x, g.parameter("w", (96, 64), "f16"))))
    built, _ = check(g, tiles=32)
    assert {p["name"] for p in built.trace.phases} >= {"compile_runtime", "plan_kernels"}
    runtime = built.runtime
    assert len(runtime) == built.program.tile_count
    exchanges = sum(1 for s in built.program.steps if type(s).__name__ == "ExchangeStep")
    for tile_program in runtime:
        kinds = [e[0] for e in tile_program.entries]
        assert kinds.count("exchange") == exchanges  # every tile takes part in every sync
    symbols = {e[1] for t in runtime for e in t.entries if e[0] == "call"}
    assert any(s.startswith("ipu_stack_gemm_f16_") for s in symbols)

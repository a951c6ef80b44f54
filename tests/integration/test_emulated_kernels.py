"""``run --kernels emulate``: a compiled program's kernel calls on the ISA emulator."""

from pathlib import Path

import numpy as np
import pytest

from ipu_stack.graph import ComputeGraph
from ipu_stack.graph.onnx_import import import_onnx
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.emulate import EmulatedKernels
from ipu_stack.runtime.sim import SimDevice


def test_emulated_run_matches_semantic_run():
    g = ComputeGraph()
    x = g.host_input("x", (24, 64), "f16")
    h = g.add(g.gemm(x, g.parameter("w1", (64, 32), "f16")), g.host_input("r", (24, 32), "f16"))
    g.set_outputs(g.gemm(h, g.parameter("w2", (32, 16), "f16")))
    built = build(g, BuildConfig(tiles=4))
    rng = np.random.default_rng(0)
    feeds = {
        v.name: rng.uniform(-1, 1, v.shape).astype(np.float16)
        for v in g.values
        if v.kind != "operation"
    }
    plain = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    device = SimDevice()
    device.kernels = EmulatedKernels()
    emulated = device.run(built.program, built.placement, built.schedules, feeds)
    report = device.kernels.report()
    assert any(u.startswith("gemm_f16") for u in report["emulated_units"]), report
    for unit in report["emulated_units"].values():
        assert unit["calls"] > 0 and unit["emulated_cycles"] > 0
    assert emulated.cycles == plain.cycles  # the clock stays the cost model's
    for name, want in plain.outputs.items():
        got = emulated.outputs[name].astype(np.float64)
        ulp = np.spacing(np.maximum(np.abs(want), 1.0).astype(np.float16)).astype(np.float64)
        assert np.all(np.abs(got - want) <= 2 * ulp), name


EXPORTS = Path(__file__).resolve().parents[1] / "data" / "exports"


@pytest.mark.parametrize(
    ("fixture", "kind"),
    [("llama_block__dynamo18", "reciprocal"), ("llama_block__legacy17", "div")],
)
def test_llama_rmsnorm_runs_every_call_on_the_emulator(fixture, kind):
    """RMSNorm's 1 / sqrt(mean) (reciprocal, or div in the legacy export) writes its one-row
    [1, 1] result straight into the next mul's operand (low/in_place.py), a row of 4 bytes:
    unary.S's ``_o4`` column form runs it, so no call of the block is left to the semantics."""
    path = EXPORTS / f"{fixture}.onnx"
    graph, bindings = import_onnx(path)
    built = build(graph, BuildConfig(tiles=16))
    data = np.load(path.with_suffix(".npz"))
    feeds = bindings.feeds({k[6:]: data[k] for k in data.files if k.startswith("input:")})
    plain = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    device = SimDevice()
    device.kernels = EmulatedKernels()
    emulated = device.run(built.program, built.placement, built.schedules, feeds)
    report = device.kernels.report()
    assert report["modelled_only"] == {}, report["modelled_only"]
    assert report["emulated_units"][f"{kind}_f32_col_r1_o4"]["calls"] > 0, report
    for name, want in plain.outputs.items():
        want = np.asarray(want, np.float64)
        got = np.asarray(emulated.outputs[name], np.float64)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())

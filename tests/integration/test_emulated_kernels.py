"""``run --kernels emulate``: a compiled program's kernel calls on the ISA emulator."""

import numpy as np

from ipu_stack.graph import ComputeGraph
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

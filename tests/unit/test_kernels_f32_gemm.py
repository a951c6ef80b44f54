"""F32 GEMM device code (templates/gemm_f32.S) on the ISA emulator vs semantics.gemm_f32."""

import numpy as np
import pytest

from ipu_stack.kernels.kernel_run import kernel_run
from ipu_stack.kernels.registry import GEMM_F32_TEMPLATE


@pytest.mark.parametrize(
    ("name", "seed"),
    [
        ("gemm_f32_k8_c16_r1_r1", 0),
        ("gemm_f32_interleaved_k16_c32_r7_r13", 1),
        ("gemm_f32_k24_c16_r6_r6", 2),
        ("gemm_f32_interleaved_k8_c48_r3_r11", 3),
    ],
)
def test_f32_gemm_matches_semantics(name, seed):
    report = kernel_run(name, seed=seed)
    assert report["ok"], report
    for entry in report["entries"]:
        assert entry["worst_relative"] <= 1e-6
        assert entry["emulated_cycles"] > 0 and entry["modelled_cycles"] > 0


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            "ld32step $a0, $m3, $m6+=, 1\n  f32v2mul $a4:5",
            "ld32step $a0, $m3, $m6+=, 0\n  f32v2mul $a4:5",
        ),
        (" brnz $m9, .Lgemm_f32_store", " brz $m9, .Lgemm_f32_store"),
    ],
)
def test_planted_f32_gemm_bug_is_caught(tmp_path, old, new):
    text = GEMM_F32_TEMPLATE.read_text()
    assert old in text
    bad = tmp_path / "gemm_f32.S"
    bad.write_text(text.replace(old, new, 1))
    report = kernel_run("gemm_f32_k16_c16_r7_r7", source=str(bad), seed=0)
    assert not report["ok"]


def test_emulated_f32_graph_matches_semantic_run():
    from ipu_stack.graph import ComputeGraph
    from ipu_stack.package.build import BuildConfig, build
    from ipu_stack.runtime.emulate import EmulatedKernels
    from ipu_stack.runtime.sim import SimDevice

    g = ComputeGraph()
    x = g.host_input("x", (12, 16), "f32")
    g.set_outputs(g.gemm(x, g.parameter("w", (16, 16), "f32")))
    built = build(g, BuildConfig(tiles=2))
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.uniform(-1, 1, v.shape).astype(np.float32)
             for v in g.values if v.kind != "operation"}  # fmt: skip
    plain = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    device = SimDevice()
    device.kernels = EmulatedKernels()
    emulated = device.run(built.program, built.placement, built.schedules, feeds)
    report = device.kernels.report()
    assert any(u.startswith("gemm_f32") for u in report["emulated_units"]), report
    assert not any(k.startswith("gemm") for k in report["modelled_only"]), report
    for name, want in plain.outputs.items():
        got = emulated.outputs[name].astype(np.float64)
        assert np.allclose(got, want, rtol=1e-6, atol=1e-6), name

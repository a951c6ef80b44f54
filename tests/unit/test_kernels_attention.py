"""Attention device code (templates/attention.S) on the ISA emulator vs the simulator."""

import numpy as np
import pytest

from ipu_stack.errors import GraphError
from ipu_stack.kernels.kernel_run import kernel_run
from ipu_stack.kernels.units_attention import ATTENTION_TEMPLATE, parse_attention_unit


@pytest.mark.parametrize(
    ("name", "seed"),
    [
        ("attention_f16_r7_t9_d8_v8", 0),
        ("attention_f16_r13_t20_d16_v8_causal", 1),
        ("attention_f16_r13_t20_d16_v8_causal", 2),
        ("attention_f16_r7_t9_d8_v4_maskfull_f16", 3),
        ("attention_f16_r8_t11_d4_v4_maskrow_f16", 4),
        ("attention_f16_r6_t10_d4_v4_maskcol_f32", 5),
        ("attention_f16_r3_t5_d4_v4_maskscalar_f16", 6),
        ("attention_f32_r9_t13_d4_v6_causal_maskfull_f32", 7),
        ("attention_f32_r5_t7_d6_v2", 8),
    ],
)
def test_attention_matches_simulator_semantics(name, seed):
    report = kernel_run(name, seed=seed)
    assert report["ok"], report
    (entry,) = report["entries"]
    if "worst_ulp" in entry:
        assert entry["worst_ulp"] <= 2.0
    else:
        assert entry["worst_relative"] <= 1e-6


def test_registry_lists_the_attention_abi():
    from ipu_stack.kernels import registry

    spec = registry.KERNELS["attention"]
    assert spec.status == registry.IMPLEMENTED and spec.source == ATTENTION_TEMPLATE
    assert spec.operand("workspace").register == "$m7"
    assert spec.operand("scale").role == "scalar"


def test_attention_names():
    unit = parse_attention_unit("attention_f16_r3_t5_d4_v4_causal_maskrow_f32")
    assert unit.causal and unit.mask == "row" and unit.mask_row_bytes == 0
    assert "-DATT_MASK_PER_KEY=1" in unit.flags()
    full = parse_attention_unit("attention_f16_r3_t5_d4_v4_maskfull_f16")
    assert full.mask_row_bytes == 16  # 5 halves padded to 8 bytes, as the lowering stages it
    for bad in (
        "attention_f16_r3_t5_d6_v4",
        "attention_f8_r1_t1_d4_v4",
        "attention_f16_r0_t5_d4_v4",
    ):
        with pytest.raises(GraphError):
            parse_attention_unit(bad)


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        (" f32max $a14, $a14, $a0", " f32add $a14, $a14, $a0", "attention_f16_r7_t9_d8_v8"),
        (" brnz $m0, .Latt_mask_odd", " brz $m0, .Latt_mask_odd",
         "attention_f16_r7_t9_d8_v8_maskfull_f16"),
        (" max $m5, $m5, 0", " max $m5, $m5, 1", "attention_f16_r13_t20_d16_v8_causal"),
    ],
)  # fmt: skip
def test_planted_attention_bug_is_caught(tmp_path, old, new, name):
    text = ATTENTION_TEMPLATE.read_text()
    assert old in text
    bad = tmp_path / "attention.S"
    bad.write_text(text.replace(old, new, 1))
    assert not kernel_run(name, source=str(bad), seed=1)["ok"]


def test_emulated_attention_graph_matches_semantic_run():
    from ipu_stack.graph import ComputeGraph
    from ipu_stack.package.build import BuildConfig, build
    from ipu_stack.runtime.emulate import EmulatedKernels
    from ipu_stack.runtime.sim import SimDevice

    g = ComputeGraph()
    q, k, v = (g.host_input(n, (1, 2, 9, 8), "f16") for n in "qkv")
    pad = g.host_input("pad", (1, 1, 1, 9), "f16")
    g.set_outputs(g.flash_attention(q, k, v, causal=True), g.flash_attention(q, k, v, mask=pad))
    built = build(g, BuildConfig(tiles=4))
    rng = np.random.default_rng(3)
    feeds = {v.name: rng.uniform(-1, 1, v.shape).astype(np.float16)
             for v in g.values if v.kind != "operation"}  # fmt: skip
    feeds["pad"][..., 6:] = -np.inf
    plain = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    device = SimDevice()
    device.kernels = EmulatedKernels()
    emulated = device.run(built.program, built.placement, built.schedules, feeds)
    report = device.kernels.report()
    assert any(u.startswith("attention_") for u in report["emulated_units"]), report
    assert "attention" not in report["modelled_only"], report
    for name, want in plain.outputs.items():
        got = emulated.outputs[name].astype(np.float64)
        ulp = np.spacing(np.maximum(np.abs(want), 2.0**-14).astype(np.float16)).astype(np.float64)
        assert np.all(np.abs(got - want) <= 2 * ulp), name

"""Row-wise kernels (layer norm, softmax, row mean) on the ISA emulator vs the registry."""

import numpy as np
import pytest

from ipu_stack.errors import GraphError
from ipu_stack.graph import ComputeGraph
from ipu_stack.kernels.kernel_run import kernel_run
from ipu_stack.kernels.registry import TEMPLATE_DIR
from ipu_stack.kernels.units_rowwise import parse_rowwise
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.emulate import EmulatedKernels
from ipu_stack.runtime.sim import SimDevice

# sizes: fewer than 8 columns (summed one by one), one pairwise block with and without a
# remainder, a split row (C > 128) whose last block has a remainder, f16 rows with padding
CASES = [
    ("layer_norm_f32_r7_c6", 0),
    ("layer_norm_f16_r3_c16", 1),
    ("layer_norm_f32_r8_c46", 2),
    ("layer_norm_f16_r2_c302", 3),
    ("layer_norm_f32_r1_c260", 4),
    ("softmax_f32_r4_c6", 0),
    ("softmax_f16_r7_c38", 1),
    ("softmax_f32_r3_c270", 2),
    ("softmax_f16_r1_c130", 3),
    ("reduce_mean_f16_r5_c2", 0),
    ("reduce_mean_f32_r9_c200", 1),
]


@pytest.mark.parametrize(("name", "seed"), CASES)
def test_units_match_the_semantics(name, seed):
    report = kernel_run(name, seed=seed)
    assert report["ok"], report
    (entry,) = report["entries"]
    assert entry["emulated_cycles"] > 0 and entry["padding_zero"]
    if not name.startswith("softmax"):  # pairwise sums and divisions rounded once: exact
        assert entry["max_abs_error"] == 0.0, entry
    elif name.startswith("softmax_f32"):  # the reciprocal multiply: within 3 f32 ulp
        assert entry["worst_relative"] <= 1.8e-7, entry


@pytest.mark.parametrize(
    ("name", "old", "new"),
    [
        # the residual of the division gets the product error's sign wrong
        ("layer_norm_f32_r6_c64", "FP f32v2sub $a0:1, $a0:1, $a10:11        // residual",
         "FP f32v2add $a0:1, $a0:1, $a10:11        // residual"),
        # the pairwise combination adds r1 twice instead of r0 + r1
        ("softmax_f32_r3_c32", "FP f32add $a8, $a0, $a1", "FP f32add $a8, $a1, $a1"),
        # the second row of each worker is read one row early
        ("layer_norm_f16_r9_c12", "add $m1, $m1, WORKER_CONTEXTS * ROW_BYTES",
         "add $m1, $m1, (WORKER_CONTEXTS - 1) * ROW_BYTES"),
    ],
)  # fmt: skip
def test_a_planted_bug_is_caught(tmp_path, name, old, new):
    unit = parse_rowwise(name)
    assert unit is not None
    for path in (unit.source, TEMPLATE_DIR / "rowwise.h"):  # the .S includes rowwise.h
        (tmp_path / path.name).write_text(path.read_text())
    for path in (unit.source, TEMPLATE_DIR / "rowwise.h"):
        text = path.read_text()
        if old in text:
            assert text.count(old) == 1
            (tmp_path / path.name).write_text(text.replace(old, new))
            break
    else:
        raise AssertionError(f"{old!r} is in no template")
    bad = tmp_path / unit.source.name
    assert kernel_run(name, source=str(bad))["ok"] is False


def test_bad_names():
    assert parse_rowwise("layer_norm_f16_r2") is None
    with pytest.raises(GraphError, match="even"):
        parse_rowwise("softmax_f16_r2_c7")


def test_emulated_run_matches_semantic_run():
    g = ComputeGraph()
    x = g.host_input("x", (20, 48), "f16")
    y = g.layer_norm(x, g.parameter("s", (48,), "f16"), g.parameter("b", (48,), "f16"), 1e-5)
    z = g.softmax(y)
    g.set_outputs(z, g.reduce_mean(z))
    built = build(g, BuildConfig(tiles=4))
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.uniform(-1, 1, v.shape).astype(np.float16)
             for v in g.values if v.kind != "operation"}  # fmt: skip
    plain = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    device = SimDevice()
    device.kernels = EmulatedKernels()
    emulated = device.run(built.program, built.placement, built.schedules, feeds)
    units = device.kernels.report()["emulated_units"]
    for kind in ("layer_norm_f16", "softmax_f16", "reduce_mean_f16"):
        assert any(u.startswith(kind) for u in units), units
    for name, want in plain.outputs.items():
        np.testing.assert_array_equal(emulated.outputs[name], want)


def test_one_row_times_its_mean_is_not_taken_for_a_row_broadcast():
    """[1, C] x [1, 1] (RMSNorm-like, one row per tile): the row-broadcast unit must not take
    the [1, C] operand for both sides (it did: llama_block's emulated output was wrong)."""
    g = ComputeGraph()
    x = g.host_input("x", (4, 32), "f32")
    g.set_outputs(g.mul(x, g.reduce_mean(x)))
    built = build(g, BuildConfig(tiles=4))
    feeds = {"x": np.random.default_rng(1).uniform(-1, 1, (4, 32)).astype(np.float32)}
    plain = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    device = SimDevice()
    device.kernels = EmulatedKernels()
    emulated = device.run(built.program, built.placement, built.schedules, feeds)
    units = device.kernels.report()["emulated_units"]
    assert any(u.startswith("reduce_mean_f32_r1") for u in units), units
    for name, want in plain.outputs.items():
        np.testing.assert_array_equal(emulated.outputs[name], want)

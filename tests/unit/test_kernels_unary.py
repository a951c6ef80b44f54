"""Unary, binary, GeLU and column-broadcast units on the ISA emulator vs the registry semantics."""

from pathlib import Path

import numpy as np
import pytest

from ipu_stack.errors import GraphError
from ipu_stack.graph import ComputeGraph
from ipu_stack.kernels.kernel_run import kernel_run
from ipu_stack.kernels.registry import TEMPLATE_DIR
from ipu_stack.kernels.units_unary import check, emulate_job, parse_unary
from ipu_stack.low.program import MapCall, Ref, View
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.emulate import EmulatedKernels
from ipu_stack.runtime.sim import SimDevice

UNITS = [
    ("gelu_tanh_f32_n42", 0), ("gelu_tanh_f32_n100", 2),
    ("gelu_f16_n96", 0), ("gelu_f16_n38", 3), ("gelu_f32_n100", 1), ("gelu_f32_n14", 2),
    ("tanh_f16_n64", 0), ("sigmoid_f32_n34", 1), ("sqrt_f16_n50", 2), ("reciprocal_f32_n30", 0),
    ("neg_f16_n40", 1), ("relu_f16_n40", 2), ("relu_f32_n26", 0), ("sub_f32_n26", 2),
    ("max_f16_n40", 0), ("min_f32_n26", 1), ("max_f32_col_r9", 2), ("min_f16_colscalar_r11", 3),
    ("sub_f16_n72", 0), ("div_f16_n66", 1),
    ("div_f32_n30", 3), ("pow_f16_e3_n40", 0), ("pow_f32_em0p5_n22", 1), ("pow_f32_e4_n18", 2),
    ("pow_f16_em2_n44", 3), ("add_f16_colbcast_r13_c16", 0), ("mul_f32_colbcast_r8_c6", 1),
    ("add_f32_scalarbcast_r7_c10", 2), ("mul_f16_scalarbcast_r9_c12", 0),
    ("sub_f16_colbcast_r20_c16", 1), ("rdiv_f32_colbcast_r9_c6", 2),
    ("div_f16_rowbcast_r13_c16", 0), ("rsub_f32_scalarbcast_r7_c10", 1),
    ("div_f32_scalarbcast_r7_c10", 3), ("rdiv_f16_rowbcast_r8_c12", 2),
]  # fmt: skip


@pytest.mark.parametrize(("name", "seed"), UNITS)
def test_unit_matches_semantics(name, seed):
    report = kernel_run(name, seed=seed)
    assert report["ok"], report
    entry = report["entries"][0]
    assert entry["emulated_cycles"] > 0 and entry["tolerance_used"] <= 1.0


def test_gelu_f16_is_exact_on_most_elements():
    entry = kernel_run("gelu_f16_n200", seed=5)["entries"][0]
    assert entry["worst_ulp"] <= 1.0  # the erf fit is within 2 f32 ulp: F16 rounds the same


def _mutant(tmp_path: Path, template: str, old: str, new: str) -> str:
    text = (TEMPLATE_DIR / template).read_text()
    assert old in text
    for f in TEMPLATE_DIR.iterdir():  # the include directory comes along
        if f.is_dir():
            (tmp_path / f.name).symlink_to(f)
    path = tmp_path / template
    path.write_text(text.replace(old, new, 1))
    return str(path)


@pytest.mark.parametrize(
    ("template", "name", "old", "new"),
    [
        ("gelu_erf.S", "gelu_f32_n60", "PAIR K_Q+3, 0xBD06FBEE", "PAIR K_Q+3, 0xBD07FBEE"),
        ("gelu_erf.S", "gelu_f16_n60", "or64 $a8:9, $a8:9, $a6:7", "fnop"),
        ("unary.S", "div_f32_n40", "DIV2 $a4, $a5, $a0, $a1, $a2, $a3",
         "DIV2 $a4, $a5, $a0, $a1, $a3, $a2"),
        ("broadcast.S", "add_f16_colbcast_r13_c16", "add $m7, $m7, WORKER_CONTEXTS * 8",
         "add $m7, $m7, 8"),
    ],
)  # fmt: skip
def test_planted_bug_is_caught(tmp_path, template, name, old, new):
    report = kernel_run(name, _mutant(tmp_path, template, old, new), seed=0)
    assert not report["ok"]


def test_tolerance_is_tight_for_gelu_f32():
    unit = parse_unary("gelu_f32_n8")
    x = np.array([-3.0, -1.0, -0.5, 0.1, 0.5, 1.0, 2.0, 3.0], np.float32)
    want = unit.reference([x])
    assert check(unit, [x], want)["ok"]
    off = want * np.float32(1 + 4e-6)  # four times the F32 tolerance
    assert not check(unit, [x], off.astype(np.float32))["ok"]


def test_names():
    assert parse_unary("add_f16_n8") is None  # equal-shape add stays with units.py
    assert parse_unary("pow_f32_e2_n4").flags()[-1] == "-DUN_F32=1"
    with pytest.raises(GraphError):
        parse_unary("gelu_f16_n7")
    assert parse_unary("reciprocal_f32_col_r3").out_stride == 8
    assert parse_unary("sqrt_f32_n4_o4") is None  # _o4 is a column form only
    with pytest.raises(GraphError):
        parse_unary("add_f16_colbcast_r4_c3")  # rows must be whole 8-byte atoms


def _view(rows, cols, dtype="f16", stride=None):
    eb = 2 if dtype == "f16" else 4
    return View(Ref("v"), rows, cols, stride if stride is not None else cols * eb, dtype)


def test_emulate_job_mapping():
    def name(call):
        job = emulate_job(call, lambda ref, size, align, what: 0x50000)
        return None if job is None else job[0]

    out = _view(4, 16)
    assert name(MapCall(0, "gelu", out, (out,))) == "gelu_f16_n64"
    assert name(MapCall(0, "gelu", out, (out,), (("approximate", "tanh"),))) == (
        "gelu_tanh_f16_n64"
    )
    out32 = _view(4, 16, "f32")
    tanh_attr = (("approximate", "tanh"),)
    assert name(MapCall(0, "gelu", out32, (out32,), tanh_attr)) == "gelu_tanh_f32_n64"
    assert name(MapCall(0, "pow", out, (out,), (("exponent", 3.0),))) == "pow_f16_e3_n64"
    assert name(MapCall(0, "pow", out, (out,), (("exponent", 1.7),))) is None
    assert name(MapCall(0, "add", out, (out, _view(4, 1, stride=8)))) == ("add_f16_colbcast_r4_c16")
    assert name(MapCall(0, "mul", out, (_view(1, 1, stride=8), out))) == (
        "mul_f16_scalarbcast_r4_c16"
    )
    assert name(MapCall(0, "add", out, (out, out))) is None  # equal shapes: units.py
    assert name(MapCall(0, "add", out, (out, _view(1, 16)))) is None  # rows: units.py
    assert name(MapCall(0, "sub", out, (_view(1, 16), out))) == "rsub_f16_rowbcast_r4_c16"
    assert name(MapCall(0, "div", out, (out, _view(4, 1, stride=8)))) == ("div_f16_colbcast_r4_c16")
    huge = _view(2048, 128)  # 262,144 elements: beyond the templates' item count
    assert name(MapCall(0, "gelu", huge, (huge,))) is None
    assert name(MapCall(0, "gelu", huge, (huge,), (("approximate", "tanh"),))) is None
    padded = _view(4, 3, stride=8)
    assert name(MapCall(0, "tanh", padded, (padded,))) is None


def test_emulated_run_of_unary_graph():
    g = ComputeGraph()
    x = g.host_input("x", (12, 32), "f16")
    c = g.host_input("c", (12, 1), "f16")
    c = g.reciprocal(g.sqrt(g.add(g.mul(c, c), g.host_input("e", (1, 1), "f16"))))  # [R, 1]
    h = g.gelu(g.add(x, c))
    t = g.sub(g.tanh(h), g.mul(g.sigmoid(x), c))
    t = g.div(g.sub(t, c), g.add(g.sub(c, g.tanh(x)), g.host_input("three", (32,), "f16")))
    g.set_outputs(g.div(t, g.pow(g.sqrt(g.host_input("p", (12, 32), "f16")), 2.0)))
    built = build(g, BuildConfig(tiles=3))
    rng = np.random.default_rng(4)
    feeds = {"x": rng.uniform(-3, 3, (12, 32)), "c": rng.uniform(-1, 1, (12, 1)),
             "p": rng.uniform(0.5, 2, (12, 32)), "e": np.full((1, 1), 0.25),
             "three": np.full(32, 3.0)}  # fmt: skip
    feeds = {k: v.astype(np.float16) for k, v in feeds.items()}
    plain = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    device = SimDevice()
    device.kernels = EmulatedKernels()
    emulated = device.run(built.program, built.placement, built.schedules, feeds)
    report = device.kernels.report()
    units = report["emulated_units"]
    for prefix in ("gelu_f16", "tanh_f16", "sigmoid_f16", "sub_f16", "div_f16", "sqrt_f16",
                   "pow_f16_e2", "add_f16_colbcast", "mul_f16_colbcast", "sqrt_f16_col",
                   "reciprocal_f16_col", "mul_f16_col", "add_f16_colscalar",
                   "sub_f16_colbcast", "rsub_f16_colbcast"):  # fmt: skip
        assert any(u.startswith(prefix) for u in units), (prefix, report)
    assert set(report["modelled_only"]) <= {"CopyCall"}, report  # odd-sized staging copies
    for name, want in plain.outputs.items():
        got = emulated.outputs[name].astype(np.float64)
        ulp = np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)
        assert np.all(np.abs(got - want) <= 2 * ulp), name


def test_gelu_tanh_template_matches_registry_semantics():
    """gelu_tanh.S (wired for MapCall gelu approximate='tanh') against map_semantics, not
    only against its own order of operations (units.gelu_tanh_reference)."""
    from ipu_stack.isa import Tile, load_unit
    from ipu_stack.kernels.kernel_run import STACK_TOP
    from ipu_stack.kernels.units import parse_unit
    from ipu_stack.runtime.sim import map_semantics

    unit = parse_unit("gelu_tanh_f16_n192")
    program = load_unit(unit.source, unit.flags(), unit.name)
    view = View(Ref("x"), 1, 192, 384, "f16")
    call = MapCall(0, "gelu", view, (view,), (("approximate", "tanh"),))
    for seed in range(2):
        x = np.random.default_rng(seed).uniform(-6, 6, 192).astype(np.float16)
        tile = Tile(program)
        tile.mem.write(0x50000, x.view(np.uint8), 8)
        tile.call(unit.entry, {2: 0x51000, 3: 0x50000, 11: STACK_TOP})
        got = tile.mem.read(0x51000, 384, 8).view(np.float16).astype(np.float64)
        want = map_semantics(call, [x.reshape(1, -1)]).astype(np.float16).reshape(-1)
        ulp = np.spacing(np.maximum(np.abs(want), 2.0**-14).astype(np.float16))
        tol = 2 * ulp.astype(np.float64) + np.abs(x.astype(np.float64)) / 2 * 2.0**-23
        assert np.all(np.abs(got - want) <= tol)


@pytest.mark.parametrize(
    ("name", "seed"),
    [("sqrt_f32_col_r13", 0), ("reciprocal_f16_col_r20", 1), ("add_f32_colscalar_r9", 2),
     ("div_f16_col_r14", 0), ("sub_f32_colscalar_r30", 1), ("pow_f16_em0p5_col_r8", 2),
     ("neg_f32_col_r1", 0)],
)  # fmt: skip
def test_column_form_matches_and_zeroes_pads(name, seed):
    assert kernel_run(name, seed=seed)["ok"]


def test_column_form_pad_not_zeroed_is_caught(tmp_path):
    old = "  and64 $a6:7, $a6:7, $a12:13\n"
    report = kernel_run("reciprocal_f16_col_r20", _mutant(tmp_path, "unary.S", old, "  fnop\n"))
    assert not report["ok"]


@pytest.mark.parametrize(
    ("name", "seed"),
    [("reciprocal_f32_col_r1_o4", 0), ("div_f32_col_r1_o4", 1), ("reciprocal_f32_col_r20_o4", 2),
     ("div_f32_colscalar_r17_o4", 3), ("pow_f32_em0p5_col_r13_o4", 0), ("sub_f16_col_r19_o4", 1),
     ("reciprocal_f16_col_r20_o4", 2)],
)  # fmt: skip
def test_column_form_with_rows_4_bytes_apart(name, seed):
    """``_o4``: output rows 4 bytes apart (F16 rows with a zero pad), at an address 4 mod 8."""
    unit = parse_unary(name)
    assert unit.out_stride == 4 and "-DUN_OUT_STRIDE=4" in unit.flags()
    assert unit.call().out.stride == 4
    report = kernel_run(name, seed=seed)
    assert report["ok"], report


@pytest.mark.parametrize(
    ("name", "old", "new"),
    [
        ("reciprocal_f32_col_r20_o4", "st32step $a4, $m3, $m6+=, WORKER_CONTEXTS",
         "st32step $a4, $m3, $m6+=, 2 * WORKER_CONTEXTS"),  # rows 8 bytes apart again
        ("reciprocal_f32_col_r1_o4", "st32step $a4, $m3, $m6+=, WORKER_CONTEXTS",
         "st32step $a5, $m3, $m6+=, WORKER_CONTEXTS"),  # the pad lane's 1 / 0
        ("reciprocal_f16_col_r20_o4", "mul $m6, $m0, UN_OUT_STRIDE", "mul $m6, $m0, 8"),
    ],
)  # fmt: skip
def test_column_form_with_rows_4_bytes_apart_mutants_are_caught(tmp_path, name, old, new):
    report = kernel_run(name, _mutant(tmp_path, "unary.S", old, new), seed=0)
    assert not report["ok"]


def test_column_jobs():
    col, one = _view(5, 1, "f32", stride=8), _view(1, 1, "f32", stride=8)

    def name(kind, *ins, attrs=()):
        job = emulate_job(MapCall(0, kind, col, ins, attrs), lambda *a: 0x50000)
        return None if job is None else job[0]

    assert name("sqrt", col) == "sqrt_f32_col_r5"
    assert name("add", one, col) == "add_f32_colscalar_r5"  # swapped: add commutes
    assert name("sub", one, col) is None  # a scalar first operand of sub: modelled
    assert name("div", col, one) == "div_f32_colscalar_r5"
    assert name("pow", col, attrs=(("exponent", -1.0),)) == "pow_f32_em1_col_r5"
    # written into a consumer's operand (low/in_place.py): output rows 4 bytes apart
    for rows, kind, ins in ((5, "sqrt", (col,)), (1, "div", (one, one)), (1, "reciprocal", (one,))):
        out = _view(rows, 1, "f32", stride=4)
        job = emulate_job(MapCall(0, kind, out, ins), lambda *a: 0x50004)
        assert job is not None and job[0] == f"{kind}_f32_col_r{rows}_o4"
        assert "-DUN_OUT_STRIDE=4" in job[2]
    for out in (_view(1, 1, "f16", stride=2), _view(5, 1, "f32", stride=16)):
        assert emulate_job(MapCall(0, "sqrt", out, (col,)), lambda *a: 0x50000) is None


@pytest.mark.parametrize("kind", ["gelu", "gelu_tanh", "tanh", "sqrt", "pow3", "sigmoid"])
def test_padded_rows(kind):
    """Odd row lengths (13 f32: rows padded to 56 bytes): zero-preserving kinds run a flat unit
    over the padded rows (the input pads are checked to be zero); sigmoid(0) = 0.5 would dirty
    the pads, so it stays modelled."""
    g = ComputeGraph()
    x = g.host_input("x", (21, 13), "f32")
    xc = g.gemm(x, g.parameter("eye", (13, 13), "f32"))  # a computed, padded operand
    ops = {
        "gelu": lambda: g.gelu(xc),
        "gelu_tanh": lambda: g.gelu(xc, approximate="tanh"),
        "tanh": lambda: g.tanh(xc),
        "sqrt": lambda: g.sqrt(g.mul(xc, xc)),
        "pow3": lambda: g.pow(xc, 3.0),
        "sigmoid": lambda: g.sigmoid(xc),
    }
    g.set_outputs(ops[kind]())
    built = build(g, BuildConfig(tiles=3, compile_kernels=False))
    rng = np.random.default_rng(1)
    feeds = {
        "x": rng.uniform(-3, 3, (21, 13)).astype(np.float32),
        "eye": np.eye(13, dtype=np.float32),
    }
    plain = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    device = SimDevice()
    device.kernels = EmulatedKernels()
    emulated = device.run(built.program, built.placement, built.schedules, feeds)
    report = device.kernels.report()
    graph_kind = {"gelu_tanh": "gelu", "pow3": "pow"}.get(kind, kind)
    if kind == "sigmoid":
        assert graph_kind in report["modelled_only"]
    else:
        assert graph_kind not in report["modelled_only"], report
    for name, want in plain.outputs.items():
        got = emulated.outputs[name]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=2e-7 * np.abs(want).max())


def test_writes_outside_the_output_are_caught(tmp_path):
    """An extra item past the output, or a frame that spills into the caller's stack, leaves
    the output right but writes memory the unit does not own: kernel-run reports it."""
    over = "add $m5, $m5, ITEMS + WORKER_CONTEXTS - 1"
    report = kernel_run("sqrt_f32_n98", _mutant(tmp_path, "unary.S", over, over[:-4]))
    assert not report["ok"] and report["entries"][0]["clobbered"]
    frame = " .set FRAME_BYTES, 208"
    other = tmp_path / "frame"
    other.mkdir()
    report = kernel_run("gelu_f32_n20", _mutant(other, "gelu_erf.S", frame, frame[:-3] + "200"))
    assert not report["ok"] and report["entries"][0]["clobbered"]

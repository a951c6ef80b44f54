"""The ISA emulator: device code checked against NumPy semantics, mutants caught, faults named."""

import re
from pathlib import Path

import numpy as np
import pytest

from ipu_stack.isa import Fault, Tile, load
from ipu_stack.isa.assumptions import ASSUMPTIONS, value
from ipu_stack.isa.ops import tapack, untapack
from ipu_stack.kernels.asm_expand import Site
from ipu_stack.kernels.kernel_run import kernel_run
from ipu_stack.kernels.registry import TEMPLATE_DIR

ISA_DIR = Path(__file__).parents[2] / "src" / "ipu_stack" / "isa"
GEMM = TEMPLATE_DIR / "gemm_amp.S"


@pytest.mark.parametrize(
    "unit",
    [
        "gemm_f16_interleaved_k32_c48_r13_r20",  # 2 K groups, 3 column groups, 2 row counts
        "gemm_f16_k16_c16_r1_r7",  # standard weights (ld64putcs), 1 and 2 rows per worker
        "gemm_f8_interleaved_k64_c16_r19_r19",
        "gemm_f16_interleaved_packed16_k16_c32_r20_r20",
        "add_f16_n1000",
        "mul_f32_n998",
        "copy_b1000",
        "copy_b1004",  # 4 mod 8 bytes: the 32-bit word copy (EW_OP 5)
        "copy_b12",
        "fill_zero_b64",
        "reduce_add_f16_p3_n200",
        "reduce_add_f32_p1_n62",
        "reduce_add_f16_p15_n24",  # more than six partials: through an address table
        "reduce_add_f32_p8_n20",
        "cast_f16_f32_n100",
        "cast_f32_f16_n100",
        "gelu_tanh_f16_n200",
        "add_f16_rowbcast_r13_c32",
        "mul_f32_rowbcast_r5_c6",
    ],
)
def test_device_code_matches_semantics(unit):
    report = kernel_run(unit, seed=1)
    assert report["ok"], report
    for entry in report["entries"]:
        assert entry["emulated_cycles"] > 0 and entry["modelled_cycles"] > 0


def _mutant(tmp_path, old, new, template=GEMM):
    text = template.read_text()
    assert old in text
    path = tmp_path / template.name
    path.write_text(text.replace(old, new, 1))
    return str(path)


@pytest.mark.parametrize(
    ("old", "new"),
    [  # the four bugs of issue 14 (in today's template's form) and a dropped sync
        ("add $m4, $m4, INNER_GROUP_BYTES", "add $m4, $m4, 0"),
        ("add $m7, $m7, -1", "add $m7, $m7, -2"),
        ("add $m2, $m2, COLUMN_GROUP_BYTES", "add $m2, $m2, 0"),
        ("rpt $m5, 3", "rpt $m5, 1"),
        (" sync SYNC_ZONE_LOCAL\n brnz $m7", " brnz $m7"),
    ],
)
def test_planted_gemm_bugs_are_caught(tmp_path, old, new):
    unit = "gemm_f16_interleaved_k32_c48_r19_r19"
    assert kernel_run(unit)["ok"]
    assert not kernel_run(unit, _mutant(tmp_path, old, new))["ok"]


def test_fault_names_instruction_address_and_site(tmp_path):
    source = _mutant(tmp_path, "tapack $m8:9, $m1, $m2, $m2", "tapack $m8:9, $m1, $m2, $m1")
    report = kernel_run("gemm_f16_interleaved_k16_c16_r12_r12", source)
    assert not report["ok"]
    fault = report["fault"]
    assert re.search(r"fault at 0x[0-9a-f]+ \(worker \d\) `ld2xst64pace", fault), fault
    assert "gemm_amp.S:" in fault and "standard 16 KiB element" in fault


def _tiny(lines):
    statements = [(text, Site("<test>", i + 1)) for i, text in enumerate(lines)]
    return Tile(load("tiny", statements))


def test_barrel_timing_one_bundle_per_worker_every_six_cycles():
    # six workers each run 10 solo nops: 60 bundles, one per cycle; the supervisor's
    # setzi, runall, sync and br take one cycle each in free slots.
    tile = _tiny(
        [".section .text.s", ".supervisor", "entry:", "setzi $m0, w", "runall $m0, $m11, 0",
         "sync 2", "br $m10", ".section .text.w", ".worker", "w:", *["nop"] * 9, "exitz $mzero"]
    )  # fmt: skip
    result = tile.call("entry", {11: 0x60000})
    assert result.worker_bundles == 60
    assert result.supervisor_instructions == 4
    assert 60 <= result.cycles <= 60 + 8


def test_rpt_body_rules_and_misaligned_access_fault():
    tile = _tiny([".supervisor", "entry:", "setzi $m0, w", "runall $m0, $m11, 0", "sync 2",
                  "br $m10", ".worker", ".p2align 3", "w:", "setzi $m1, 0x60004",
                  "ld64 $a0:1, $m1, $mzero, 0", "exitz $mzero"])  # fmt: skip
    with pytest.raises(Fault, match=r"ld64 \$a0:1.*not 8-byte aligned"):
        tile.call("entry", {11: 0x60000})
    tile = _tiny([".supervisor", "entry:", "setzi $m0, w", "runall $m0, $m11, 0", "sync 2",
                  "br $m10", ".worker", ".p2align 3", "w:", "{", "rpt $m15, 0", "fnop", "}",
                  "{", "brz $m15, w", "fnop", "}", "exitz $mzero"])  # fmt: skip
    with pytest.raises(Fault, match="control instruction brz"):
        tile.call("entry", {11: 0x60000})


def test_tapack_round_trip_and_layout():
    lo, hi = tapack(0x5A000, 0x90008, 0xC1238)
    assert untapack(lo, hi) == (0x5A000, 0x90008, 0xC1238)
    assert lo & 0x1FFFFF == 0x5A000 and hi & 0x1FFFFF == 0x90008
    with pytest.raises(Fault):
        tapack(1 << 21, 0, 0)


def test_emulator_reads_its_numbers_from_the_assumptions_table():
    keys = {a.key for a in ASSUMPTIONS}
    assert len(keys) == len(ASSUMPTIONS)
    for a in ASSUMPTIONS:
        assert a.evidence and a.rule
    used = set()
    for path in ISA_DIR.glob("*.py"):
        used |= set(re.findall(r'value\("(\w+)"\)', path.read_text()))
    assert used <= keys and {"barrel_slots", "amp_phase_flags", "cwei_slot_order"} <= used
    assert value("barrel_slots") == 6


def test_emulator_does_not_import_the_cost_model():
    for path in ISA_DIR.glob("*.py"):
        text = path.read_text()
        for banned in ("low.costs", "gemm_cycles", "ipu_stack.mid", "op_cycles", "runtime.sim"):
            assert banned not in text, (path.name, banned)


def test_gemm_worker_fixed_cost_is_at_most_poplibs():
    # rows 24 -> four rows per worker; K 32, C 32 -> four panels. The partition is written
    # once per call, so each worker launch costs 4 bundles a row plus a fixed cost no larger
    # than the poplibs AMP 1x1 worker's (26 + 4 (n - 3) bundles, facts §13.1).
    from ipu_stack.isa import load_unit
    from ipu_stack.kernels.registry import parse_gemm_variant

    v = parse_gemm_variant("gemm_f16_interleaved_k32_c32_r24_r24")
    tile = Tile(load_unit(v.source, v.flags(), v.name))
    regs = {2: 0xC0000, 3: 0x4D000, 4: 0x90000, 11: 0x7F000}
    result = tile.call(v.entry_symbols["init_small"], regs)
    per_worker_launch = result.worker_bundles / (4 * 6)
    assert 4 * 4 < per_worker_launch <= 26 + 4 * (4 - 3)


def test_emulated_gemm_is_not_the_model():
    # the emulated cycles come from executing the code: a longer K costs proportionally more
    a = kernel_run("gemm_f16_interleaved_k16_c16_r24_r24")["entries"][0]["emulated_cycles"]
    b = kernel_run("gemm_f16_interleaved_k32_c16_r24_r24")["entries"][0]["emulated_cycles"]
    assert 1.7 < b / a < 2.1
    assert np.isfinite(a)


@pytest.mark.parametrize("name", ["add_f16_n7", "nonsense", "gemm_f16_k33_c16_r1_r1",
                                  "reduce_add_f16_p257_n8", "cast_f16_f32_n6"])  # fmt: skip
def test_bad_unit_names_are_graph_errors(name):
    from ipu_stack.errors import GraphError

    with pytest.raises(GraphError):
        kernel_run(name)


def test_mutation_suite_edits_apply_to_the_templates():
    import importlib.util

    path = Path(__file__).parents[2] / "benchmarks" / "kernel_mutations.py"
    spec = importlib.util.spec_from_file_location("kernel_mutations", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert len(module.MUTANTS) >= 40
    for template, _unit, _what, old, new, occurrence in module.MUTANTS:
        text = (TEMPLATE_DIR / template).read_text()
        assert module._mutate(text, old, new, occurrence) != text


def test_gelu_tanh_semantics_against_float64_formula():
    from ipu_stack.kernels.units import gelu_tanh_reference

    x = np.linspace(-6, 6, 4001).astype(np.float16)
    x64 = x.astype(np.float64)
    want = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))
    got = gelu_tanh_reference(x).astype(np.float64)
    ulp = np.spacing(np.maximum(np.abs(want), 2.0**-14).astype(np.float16)).astype(np.float64)
    # h + h * tanh(.) cancels for negative x: allow a few f32 ulp of h = x / 2 there
    cancel = 4 * np.spacing((np.abs(x64) / 2).astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(got - want) <= 2 * ulp + cancel)


def test_a_write_past_the_output_fails_kernel_run(tmp_path):
    # one atom too many per worker: the output comes out right, the input after it is clobbered
    ew = TEMPLATE_DIR / "elementwise.S"
    old, new = "add $m5, $m5, ATOMS + WORKER_CONTEXTS - 1", "add $m5, $m5, ATOMS + WORKER_CONTEXTS"
    report = kernel_run("copy_b1024", _mutant(tmp_path, old, new, template=ew))
    assert not report["ok"]
    assert "outside the outputs" in report["entries"][0]["stray_writes"], report

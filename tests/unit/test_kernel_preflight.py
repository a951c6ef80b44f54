"""Preflight: the seed's duplicate-label failure, and the other template faults it must catch."""

from pathlib import Path

import pytest

from ipu_stack.kernels import preflight, registry
from ipu_stack.kernels.asm_expand import Site, expand

DATA = Path(__file__).parents[1] / "data" / "kernels"
SEED = DATA / "gemm_seed_duplicate.S"
SEED_VARIANT = "gemm_f16_interleaved_k64_c80_r11_r12"
DISPLAY = preflight.display_path(str(SEED))


def seed_flags():
    variant = registry.parse_gemm_variant(SEED_VARIANT)
    return [f"-I{DATA / 'include'}", *variant.flags()]


def line_of(text: str, nth: int = 1) -> int:
    hits = [i for i, line in enumerate(SEED.read_text().splitlines(), 1) if line == text]
    return hits[nth - 1]


def test_seed_failure_names_label_both_sites_instantiation_and_variant():
    result = preflight.preflight(SEED, seed_flags(), SEED_VARIANT)
    assert not result.ok
    report = result.report()
    print(report)
    dups = [i for i in result.issues if i.kind == "duplicate"]
    assert [i.message for i in dups] == [
        "symbol '.Lgemm_f16_amp_worker_small' is defined twice",
        "symbol '.Lgemm_f16_amp_worker_large' is defined twice",
    ]
    first, again = dups[0].sites
    name = SEED.name
    assert (Path(first.file).name, first.line) == (name, line_of("\\name:", 2))
    assert (Path(again.file).name, again.line) == (name, line_of("\\name:", 3))
    small_call = line_of(
        " GEMM_WORKER .Lgemm_f16_amp_worker_small, .Lgemm_f16_amp_worker_small_retained_output,"
        " GEMM_SMALL_ROWS"
    )
    assert first.chain == again.chain
    assert first.chain[0][0] == "GEMM_WORKER" and first.chain[0][2] == small_call
    assert SEED_VARIANT in report and ".Lgemm_f16_amp_worker_small" in report
    via = "(in macro GEMM_WORKER instantiated at"
    assert f"first defined at {DISPLAY}:{first.line} {via}" in report
    assert f"again defined at {DISPLAY}:{again.line} {via}" in report
    assert f"{name}:{small_call}" in report


def test_seed_template_passes_once_the_second_label_is_preprocessed_away():
    result = preflight.preflight(SEED, [*seed_flags(), "-DGEMM_RETAIN_ENTRY=0"], SEED_VARIANT)
    assert result.ok, result.report()


def test_all_failing_variants_are_reported_then_one_summary():
    good = registry.parse_gemm_variant("gemm_f16_interleaved_packed64_k64_c64_r32_r32")
    with pytest.raises(preflight.PreflightError) as info:
        preflight.preflight_all(
            [
                (SEED_VARIANT, SEED, seed_flags()),
                (good.name, good.source, good.flags()),
                ("gemm_f16_k64_c80_r5_r6", SEED, seed_flags()),
            ]
        )
    err = info.value
    assert err.summary == (
        f"preflight failed for 2 of 3 kernel variants: {SEED_VARIANT}, gemm_f16_k64_c80_r5_r6"
    )
    assert err.details.count(".Lgemm_f16_amp_worker_small") >= 2


@pytest.mark.parametrize(
    "name",
    [
        "gemm_f16_interleaved_packed64_k64_c64_r32_r32",
        "gemm_f16_interleaved_k64_c80_r11_r12",
        "gemm_f16_k1024_c256_r1_r2",
        "gemm_f8_interleaved_k128_c48_r40_r41",
        "gemm_f16_standard_packed32_k64_c96_r17_r17".replace("standard_", ""),
    ],
)
def test_our_gemm_template_passes_preflight(name):
    variant = registry.parse_gemm_variant(name)
    result = preflight.preflight(variant.source, variant.flags(), variant.name)
    assert result.ok, result.report()
    assert sorted(result.defined_globals) == sorted(variant.entry_symbols.values())
    labels = [s for s in result.symbols.values() if s.kind == "label"]
    assert len({s.name for s in labels}) == len(labels)
    assert any(p.name == "ipu21_tile.h" for p in result.includes)


def run_text(text: str):
    lines = [(line, Site("t.S", i)) for i, line in enumerate(text.splitlines(), 1)]
    return expand(lines)


@pytest.mark.parametrize(
    "text,kind,needle",
    [
        (" bri .Lnowhere\n", "undefined", "'.Lnowhere' is used but never defined"),
        (" .macro M\n add $m0, $m0, 1\n", "unbalanced", ".macro M is never closed"),
        (" .if 1\n nop\n", "unbalanced", "never closed by .endif"),
        (" .endif\n", "unbalanced", ".endif without .if"),
        (" .rept 2\n nop\n", "unbalanced", ".rept is never closed"),
        (" frobnicate $m0\n", "mnemonic", "unknown mnemonic 'frobnicate'"),
        (" .worker\n ld2x64pace $a1:2, $a2:3, $m8:9+=, $m7, 0\n", "operand", "malformed ARF pair"),
        (" add $m16, $m0, 1\n", "operand", "$m16"),
        (" .worker\n tapack $m9:10, $m1, $m2, $m3\n", "operand", "malformed MRF pair"),
        (" setzi $m0, 1 << 21\n", "operand", "outside 0..1048575"),
        (" .supervisor\n f16v4hihov4amp $a6:7, $a0:1, $a2:3, 48\n", "context", "worker instr"),
        (" .worker\n runall $m0, $m11, 0\n", "context", "supervisor instruction"),
        (" { \n nop\n nop\n nop\n }\n", "bundle", "bundle of 3"),
        (" .macro M a\n \\b:\n .endm\n M x\n", "macro", "\\b is not a parameter"),
        (" .equiv X, 1\n .equiv X, 2\n", "duplicate", "'X' is defined twice"),
    ],
)
def test_template_faults_are_reported(text, kind, needle):
    issues = run_text(text).issues
    assert any(i.kind == kind and needle in i.describe() for i in issues), issues


def test_macro_features_expand_like_gnu_as():
    text = "\n".join(
        [
            " .set BASE, 4",
            " .macro PUT name, count=2, rest:vararg",
            "\\name\\()_\\@:",
            " .rept \\count",
            " add $m0, $m0, BASE",
            " .endr",
            " .irp r, \\rest",
            " zero \\r",
            " .endr",
            " .endm",
            " PUT one, 3, $m1, $m2",
            " PUT two, , $m3",
            " .if BASE == 4",
            " nop",
            " .elseif BASE == 5",
            " frob",
            " .else",
            " frob",
            " .endif",
        ]
    )
    result = run_text(text)
    assert result.issues == []
    assert {"one_0", "two_1"} <= set(result.symbols)
    stmts = [s for s, _ in result.expanded if not s.startswith("#")]
    assert stmts.count("add $m0, $m0, BASE") == 5  # 3 + the default 2
    assert "zero $m1" in stmts and "zero $m2" in stmts and "nop" in stmts

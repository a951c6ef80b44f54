"""The kernel registry: one definition of each kernel's ABI, semantics and cycles."""

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipu_stack.errors import GraphError
from ipu_stack.kernels import registry, semantics
from ipu_stack.target.gemm_cycles import MEASURED_POINTS
from ipu_stack.target.ipu21 import F8, F16, F32

VALIDATION_POINTS = MEASURED_POINTS  # facts §13.3, kept in target/


@pytest.mark.parametrize("kernel,rows,k,c,weights,measured", VALIDATION_POINTS)
def test_registry_cycles_match_measured_point_within_10_percent(
    kernel, rows, k, c, weights, measured
):
    spec = registry.gemm_kernel("f16", weights, packed=kernel == "packed")
    predicted = spec.cycles(rows, k, c)
    error = (predicted - measured) / measured
    print(
        f"{spec.name} rows={rows} K={k} C={c}: model {predicted} measured {measured} "
        f"error {error:+.2%}"
    )
    assert abs(error) <= 0.10


def test_seed_variant_names_round_trip():
    for name in (
        "gemm_f16_interleaved_packed64_k64_c64_r32_r32",
        "gemm_f16_interleaved_k64_c80_r11_r12",
    ):
        variant = registry.parse_gemm_variant(name)
        assert variant.name == name
        assert variant.spec.status == registry.IMPLEMENTED
    packed = registry.parse_gemm_variant("gemm_f16_interleaved_packed64_k64_c64_r32_r32")
    assert packed.single_rows and "-DGEMM_SINGLE_ROWS=1" in packed.flags()
    assert set(packed.entry_symbols) == {"init_small", "accumulate_small"}
    pair = registry.parse_gemm_variant("gemm_f16_interleaved_k64_c80_r11_r12")
    assert pair.entry_symbol("init", 12) == (
        "ipu_stack_gemm_f16_init_large_rows_interleaved_k64_c80_r11_r12"
    )


def test_variant_from_spec_sorts_and_dedupes_rows():
    spec = registry.gemm_kernel("f16", "standard")
    assert spec.variant(64, 80, [12, 11, 12]).name == "gemm_f16_k64_c80_r11_r12"
    assert spec.variant(64, 80, [32]).name == "gemm_f16_k64_c80_r32_r32"
    with pytest.raises(GraphError, match="one or two row counts"):
        spec.variant(64, 80, [1, 2, 3])


@pytest.mark.parametrize(
    "name,why",
    [
        ("gemm_f16_interleaved_k60_c80_r11_r12", "multiple of 16"),
        ("gemm_f8_k48_c80_r11_r12", "multiple of 32"),
        ("gemm_f16_k64_c80_r12_r11", "S <= L"),
        ("gemm_f16_interleaved_packed24_k64_c64_r32_r32", "multiple of 16"),
        ("gemm_f64_k64_c80_r11_r12", "not a GEMM unit name"),
    ],
)
def test_impossible_variants_are_rejected(name, why):
    with pytest.raises(GraphError, match=why):
        registry.parse_gemm_variant(name)


def test_every_kernel_declares_abi_semantics_and_cycles():
    assert {
        "gemm_f16_interleaved",
        "gemm_f16_standard",
        "gemm_f8_interleaved",
        "gemm_f32_standard",
        "gemm_f16_interleaved_packed",
    } <= set(registry.KERNELS)
    for spec in registry.KERNELS.values():
        assert spec.status in (registry.IMPLEMENTED, registry.REQUIRED)
        assert spec.reference is not None and spec.cycles is not None
        assert spec.operand("output").register == "$m2"
        if spec.status == registry.IMPLEMENTED:
            assert spec.source is not None and spec.source.exists()
        described = spec.describe()
        assert described["name"] == spec.name and described["operands"]
    f8 = registry.gemm_kernel("f8", "interleaved")
    assert f8.operand("scale_exponent").register == "$m5"
    f32 = registry.gemm_kernel("f32", "standard")  # vector-pipeline device code
    assert f32.status == registry.IMPLEMENTED and f32.source == registry.GEMM_F32_TEMPLATE
    rel = registry.gemm_kernel("f16", "interleaved").relations[0]
    assert rel.kind == "distinct_element" and rel.operands == ("left", "output")


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(0, 400),
    k=st.integers(1, 40).map(lambda x: 16 * x),
    c=st.integers(1, 20).map(lambda x: 16 * x),
    prec=st.sampled_from([F16, F8, F32]),
    interleaved=st.booleans(),
)
def test_planner_array_cycles_equal_simulator_scalar_cycles(rows, k, c, prec, interleaved):
    k = -(-k // prec.k_micro) * prec.k_micro
    spec = registry.gemm_kernel(prec.name, "interleaved" if interleaved else "standard")
    array = registry.gemm_cycles_array(
        np.array([rows]), np.array([k]), np.array([c]), prec, np.array([interleaved])
    )
    assert int(array[0]) == spec.cycles(rows, k, c)


def test_f8_costs_like_f16_with_half_the_k_panels():
    f16 = registry.gemm_kernel("f16", "interleaved").cycles(96, 128, 64)
    f8 = registry.gemm_kernel("f8", "interleaved").cycles(96, 256, 64)
    assert f8 == f16


def test_f16_reference_rounds_partials_once_per_k16_panel():
    rng = np.random.default_rng(1)
    left = rng.uniform(-1, 1, (1, 5, 64)).astype(np.float16)
    right = rng.uniform(-1, 1, (1, 64, 32)).astype(np.float16)
    out = registry.gemm_kernel("f16", "interleaved").reference(
        left, right, np.zeros((1, 5, 32), np.float16), False
    )
    expect = np.zeros((5, 32), np.float32)
    for p in range(0, 64, 16):
        expect = (
            (
                expect
                + left[0, :, p : p + 16].astype(np.float32)
                @ right[0, p : p + 16].astype(np.float32)
            )
            .astype(np.float16)
            .astype(np.float32)
        )
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out[0], expect.astype(np.float16))


def test_f8_reference_applies_power_of_two_scale_and_saturates():
    values = np.array([[0.5, 300.0, -1e-6]], np.float32)
    encoded = semantics.encode_f143(values, scale_exponent=0)
    assert encoded.dtype == semantics.F143
    assert float(encoded[0, 1]) == 240.0  # saturated, not NaN
    assert encoded.view(np.uint8)[0, 2] == 0  # negative values rounding to zero encode as 0
    left = semantics.encode_f143(np.full((1, 2, 32), 1.0), 0)
    right = semantics.encode_f143(np.full((1, 32, 16), 0.5), 0)
    out = registry.gemm_kernel("f8", "standard").reference(
        left, right, np.zeros((1, 2, 16), np.float16), False, scale_exponent=-3
    )
    np.testing.assert_array_equal(out, np.full((1, 2, 16), 16 * 2.0**-3, np.float16))


def test_f32_reference_accumulates():
    left = np.ones((1, 2, 8), np.float32)
    right = np.ones((1, 8, 16), np.float32)
    prior = np.full((1, 2, 16), 1.5, np.float32)
    spec = registry.gemm_kernel("f32", "interleaved")
    np.testing.assert_array_equal(spec.reference(left, right, prior, True), prior + 8)
    np.testing.assert_array_equal(spec.reference(left, right, prior, False), prior * 0 + 8)


def test_packed_output_layout_is_16_row_panels_in_column_groups():
    rows, c, group = 20, 128, 64
    out = np.arange(rows * c, dtype=np.float32).reshape(rows, c)
    flat = semantics.pack_output(out, group)
    assert flat.size == 2 * 32 * 64  # two groups, rows padded to 32
    assert flat[0] == out[0, 0] and flat[64] == out[1, 0]
    assert flat[32 * 64] == out[0, 64]  # the second column group starts after 32 padded rows
    np.testing.assert_array_equal(semantics.unpack_output(flat, rows, c, group), out)


def test_cycle_formulas_are_reached_only_through_the_registry():
    src = Path(registry.__file__).parents[1]
    importers = sorted(
        str(path.relative_to(src))
        for path in src.rglob("*.py")
        if re.search(r"\bgemm_cycles\b", path.read_text()) and path.name != "gemm_cycles.py"
    )
    assert importers == ["kernels/registry.py"], importers


# One unit per map kind the registry marks implemented: kernel-run agrees with the semantics on
# the kind's registry template (a kind marked implemented without working device code fails).
_REPRESENTATIVE_UNITS = {
    "reduce_add": "reduce_add_f16_p3_n200",
    "copy": "copy_b1000",
    "copy2d": "copy2d_b40_r9",
    "fill_zero": "fill_zero_b64",
    "add": "add_f16_n1000",
    "mul": "mul_f32_n998",
    "gelu": "gelu_f16_n200",
    "cast": "cast_f16_f32_n100",
    "layer_norm": "layer_norm_f16_r20_c140",
    "softmax": "softmax_f32_r20_c138",
    "reduce_mean": "reduce_mean_f32_r20_c138",
    "sub": "sub_f32_n100",
    "div": "div_f16_n200",
    "tanh": "tanh_f16_n200",
    "sigmoid": "sigmoid_f32_n98",
    "sqrt": "sqrt_f32_n100",
    "reciprocal": "reciprocal_f16_n200",
    "neg": "neg_f16_n200",
    "relu": "relu_f32_n100",
    "max": "max_f16_n200",
    "min": "min_f32_n100",
    "pow": "pow_f32_e3_n100",
}


def test_implemented_map_kinds_have_device_code_that_matches():
    from ipu_stack.kernels.kernel_run import kernel_run

    assert set(_REPRESENTATIVE_UNITS) == set(registry.OTHER_SOURCES)
    for kind, unit in _REPRESENTATIVE_UNITS.items():
        spec = registry.KERNELS[kind]
        assert spec.status == registry.IMPLEMENTED and spec.source is not None
        report = kernel_run(unit, seed=3)
        assert report["ok"], report
        assert Path(report["source"]).name == spec.source.name, (kind, report["source"])

"""Gather, concat, integer ops, any transpose and masked attention: compiled, simulated and
compared with the NumPy reference (``evaluate_reference``), at small tile counts."""

from dataclasses import replace

import numpy as np
import pytest

from ipu_stack import BuildConfig, Package, Session, SimDevice, build_package
from ipu_stack.errors import GraphError, SimulationError
from ipu_stack.graph import ComputeGraph, evaluate_reference
from ipu_stack.low.program import ComputeStep, ExchangeStep, MapCall
from ipu_stack.package.build import build
from ipu_stack.runtime import indexing_semantics

TOL = {"f16": 2e-2, "f32": 1e-4, "i32": 0}


def feeds_for(g, rng, ints=None):
    feeds = {}
    for v in g.values:
        if v.kind == "operation":
            continue
        if v.dtype == "i32":
            feeds[v.name] = rng.integers(0, (ints or {}).get(v.name, 10), v.shape)
        else:
            dtype = np.float16 if v.dtype == "f16" else np.float32
            feeds[v.name] = rng.uniform(-1, 1, v.shape).astype(dtype)
    return feeds


def compare(g, outputs, feeds):
    for name, ref in evaluate_reference(g, feeds).items():
        got = outputs[name]
        dtype = next(v.dtype for v in g.values if v.name == name)
        assert got.shape == ref.shape, name
        if dtype == "i32":
            assert got.dtype == np.int32
            np.testing.assert_array_equal(got, ref, err_msg=name)
        else:
            scale = max(np.abs(ref).max(), 1e-6)
            assert np.abs(got.astype(np.float64) - ref).max() <= TOL[dtype] * scale, name


def run(g, feeds, tiles):
    built = build(g, BuildConfig(tiles=tiles, finalists=1, exchange_time_budget=0))
    result = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    compare(g, result.outputs, feeds)
    return built, result


def map_calls(program, kind):
    return [
        c
        for s in program.steps
        if isinstance(s, ComputeStep)
        for c in s.calls
        if isinstance(c, MapCall) and c.kind == kind
    ]


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_gather_from_parameter_and_computed_tables(dtype):
    g = ComputeGraph()
    ids = g.host_input("ids", (3, 5), "i32")
    table = g.parameter("table", (37, 22), dtype)
    x = g.host_input("x", (37, 22), dtype)
    computed = g.add(x, table)  # a table produced on chip
    g.set_outputs(g.gather(table, ids), g.gather(computed, g.slice(ids, [1], [3], [0])))
    feeds = feeds_for(g, np.random.default_rng(0), {"ids": 37})
    feeds["ids"][2, 4] = 36  # the last row
    built, _ = run(g, feeds, 16)
    assert map_calls(built.program, "gather_rows")


def test_gather_with_row_blocks_assembles_rows_by_reduce_scatter():
    g = ComputeGraph()
    ids = g.host_input("ids", (7, 3), "i32")
    g.set_outputs(g.gather(g.parameter("table", (5001, 16), "f32"), ids))
    feeds = feeds_for(g, np.random.default_rng(1), {"ids": 5001})
    feeds["ids"][0, 0], feeds["ids"][6, 2] = 0, 5000
    built, _ = run(g, feeds, 16)
    offsets = sorted({c.attr("row_offset") for c in map_calls(built.program, "gather_rows")})
    assert len(offsets) > 1  # the table is split over row blocks
    # mutation: one tile believing it holds other rows gives wrong rows, which the check sees
    bad = replace(built.program, steps=[_shift_first_gather(s) for s in built.program.steps])
    out = SimDevice().run(bad, built.placement, built.schedules, feeds).outputs
    with pytest.raises(AssertionError):
        compare(g, out, feeds)


def _shift_first_gather(step):
    if not isinstance(step, ComputeStep):
        return step
    calls = list(step.calls)
    for i, c in enumerate(calls):
        if isinstance(c, MapCall) and c.kind == "gather_rows" and c.attr("row_offset") > 0:
            attrs = tuple((k, v + 1 if k == "row_offset" else v) for k, v in c.attrs)
            calls[i] = replace(c, attrs=attrs)
            break
    return ComputeStep(calls)


def test_out_of_range_id_is_a_run_time_error_naming_input_position_value():
    g = ComputeGraph()
    ids = g.host_input("token_ids", (2, 4), "i32")
    g.set_outputs(g.gather(g.parameter("table", (10, 8), "f32"), ids))
    built = build(g, BuildConfig(tiles=8, finalists=1, exchange_time_budget=0))
    feeds = feeds_for(g, np.random.default_rng(2))
    for bad in (10, -1):
        feeds["token_ids"][1, 2] = bad
        with pytest.raises(SimulationError) as err:
            SimDevice().run(built.program, built.placement, built.schedules, feeds)
        msg = str(err.value)
        assert "'token_ids'" in msg and "(1, 2)" in msg and f"holds {bad}" in msg
        with pytest.raises(GraphError, match=r"position \(1, 2\) holds"):
            evaluate_reference(g, feeds)


def test_concat_any_axis_with_parameters_and_odd_widths():
    g = ComputeGraph()
    x = g.host_input("x", (2, 9, 7), "f16")
    cls = g.parameter("cls", (2, 1, 7), "f16")
    y = g.mul(x, x)
    g.set_outputs(
        g.concat([cls, x], axis=1),  # ViT's CLS token
        g.concat([x, g.slice(y, [0], [3], [2]), y], axis=-1),  # odd F16 column offsets
        g.concat([y, x], axis=0),
    )
    run(g, feeds_for(g, np.random.default_rng(3)), 16)


def test_integer_ops_argmax_equal_where_cast():
    g = ComputeGraph()
    x = g.host_input("x", (3, 5, 11), "f32")
    ids = g.host_input("ids", (3, 5), "i32")
    big = g.parameter("big", (1,), "i32")
    eot = g.argmax(g.cast(ids, "f32"), axis=-1)  # CLIP's end-of-text position
    hits = g.equal(ids, g.parameter("seven", (1,), "i32"))
    g.set_outputs(
        eot,
        g.argmax(x, axis=1, keepdims=True),
        g.argmax(x, axis=0),
        hits,
        g.where(hits, g.cast(ids, "f32"), g.view(g.slice(x, [0], [1], [2]), (3, 5))),
        g.where(hits, ids, g.add(ids, ids)),
        g.mul(g.add(ids, big), big),  # wraps like int32
        g.cast(g.mul(x, g.parameter("s", (1,), "f32")), "i32"),  # toward zero
    )
    rng = np.random.default_rng(4)
    feeds = feeds_for(g, rng, {"ids": 9})
    feeds["big"] = np.array([2**30 + 3], np.int32)
    feeds["seven"] = np.array([7], np.int32)
    feeds["s"] = np.array([37.5], np.float32)
    run(g, feeds, 16)


def test_transposes_of_on_chip_values_including_the_last_axis(monkeypatch):
    g = ComputeGraph()
    a = g.host_input("a", (192, 40), "f16")
    y = g.gemm(a, g.parameter("w", (40, 352), "f16"))  # produced on chip, column blocks
    x = g.host_input("x", (2, 3, 10, 6), "f32")
    z = g.add(x, x)
    p = g.parameter("p", (3, 5, 7), "f32")
    g.set_outputs(
        g.transpose(y, (1, 0)),  # the last axis of a 192 x 352 tensor
        g.transpose(z, (0, 2, 3, 1)),
        g.transpose(z, (3, 1, 0, 2)),  # leading axes move too
        g.transpose(p, (2, 0, 1)),  # a parameter
        g.transpose(x, (1, 3, 2, 0)),  # a host input
    )
    feeds = feeds_for(g, np.random.default_rng(5))
    built, _ = run(g, feeds, 64)
    assert map_calls(built.program, "transpose")
    labels = [s.label for s in built.program.steps if isinstance(s, ExchangeStep)]
    assert not any(label.startswith("transpose0 ") for label in labels)  # in place, no exchange
    # mutation: a transpose kernel that reverses its rows is caught by the comparison
    real = indexing_semantics.indexing_semantics

    def reversed_rows(call, args):
        out = real(call, args)
        return out[::-1] if call.kind == "transpose" and call.out.rows > 1 else out

    monkeypatch.setattr(indexing_semantics, "indexing_semantics", reversed_rows)
    out = SimDevice().run(built.program, built.placement, built.schedules, feeds).outputs
    with pytest.raises(AssertionError):
        compare(g, out, feeds)


def test_gemm_with_a_transposed_operand_produced_on_chip():
    g = ComputeGraph()
    x = g.host_input("x", (2, 13, 16), "f16")
    h = g.host_input("h", (24, 16), "f16")
    k = g.mul(x, g.parameter("s", (16,), "f16"))
    g.set_outputs(
        g.gemm(x, k, transpose_right=True),
        g.gemm(k, x, transpose_left=True),
        g.gemm(h, g.parameter("w", (24, 8), "f16"), transpose_left=True),
        g.transpose(h, (1, 0)),  # h is held transposed by the gemm above: the host rewrites it
    )
    run(g, feeds_for(g, np.random.default_rng(6)), 16)


def test_masked_attention_matches_numpy():
    g = ComputeGraph()
    q, k, v = (g.host_input(n, (2, 3, 20, 16), "f16") for n in "qkv")
    pad = g.host_input("pad", (2, 1, 1, 20), "f16")  # BERT's padding mask
    bias = g.parameter("bias", (20, 20), "f16")
    g.set_outputs(
        g.flash_attention(q, k, v, mask=pad),
        g.flash_attention(q, k, v, mask=g.add(pad, bias), causal=True),
    )
    feeds = feeds_for(g, np.random.default_rng(7))
    mask = np.zeros((2, 1, 1, 20), np.float16)
    mask[0, ..., 15:] = mask[1, ..., 7:] = -10000
    feeds["pad"] = mask
    built, result = run(g, feeds, 32)
    # masked keys really are ignored: changing their values changes nothing
    feeds2 = dict(feeds, k=feeds["k"].copy(), v=feeds["v"].copy())
    feeds2["k"][1, :, 7:], feeds2["v"][1, :, 7:] = 0.5, -0.5
    other = SimDevice().run(built.program, built.placement, built.schedules, feeds2).outputs
    name = g.value(g.outputs[0]).name
    np.testing.assert_allclose(other[name][1], result.outputs[name][1], atol=1e-3)


def test_i32_inputs_through_a_saved_package(tmp_path):
    g = ComputeGraph()
    ids = g.host_input("ids", (2, 6), "i32")
    g.set_outputs(g.gather(g.parameter("emb", (23, 12), "f16"), ids, name="lookup"))
    rng = np.random.default_rng(8)
    emb = rng.uniform(-1, 1, (23, 12)).astype(np.float16)
    path = tmp_path / "ids.ipuexe"
    config = BuildConfig(tiles=8, finalists=1, exchange_time_budget=0)
    pkg = build_package(g, config, {"emb": emb})
    pkg.save(path)
    assert build_package(g, config, {"emb": emb}).to_bytes() == pkg.to_bytes()  # deterministic
    session = Session(SimDevice()).load(path)
    session.initialize()
    tokens = rng.integers(0, 23, (2, 6)).astype(np.int64)
    out = session.run({"ids": tokens})["lookup.out"]
    np.testing.assert_array_equal(out, emb[tokens])
    assert [b["dtype"] for b in Package.load(path).bindings("input")] == ["i32"]
    with pytest.raises(GraphError, match=r"'ids': value 4294967296 at position \(1, 3\)"):
        session.run({"ids": np.where(np.arange(12).reshape(2, 6) == 9, 2**32, tokens)})
    with pytest.raises(SimulationError, match=r"'ids' at position \(0, 1\) holds 23"):
        session.run({"ids": np.where(np.arange(12).reshape(2, 6) == 1, 23, tokens)})


def test_cli_runs_a_package_with_int64_token_ids(tmp_path):
    import subprocess
    import sys

    g = ComputeGraph()
    ids = g.host_input("ids", (1, 9), "i32")
    g.set_outputs(g.gather(g.parameter("emb", (31, 6), "f32"), ids, name="lookup"))
    emb = np.random.default_rng(9).normal(size=(31, 6)).astype(np.float32)
    pkg = tmp_path / "emb.ipuexe"
    build_package(g, BuildConfig(tiles=8, finalists=1, exchange_time_budget=0), {"emb": emb}).save(
        pkg
    )
    tokens = np.arange(9, dtype=np.int64).reshape(1, 9) * 3
    np.save(tmp_path / "ids.npy", tokens)

    def cli(*args):
        cmd = [sys.executable, "-m", "ipu_stack.cli", "run", str(pkg), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    ok = cli("--input", f"ids={tmp_path / 'ids.npy'}", "--output-dir", str(tmp_path / "o"))
    assert ok.returncode == 0, ok.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o" / "lookup.out.npy"), emb[tokens])
    np.save(tmp_path / "big.npy", np.full((1, 9), 2**40, np.int64))
    bad = cli("--input", f"ids={tmp_path / 'big.npy'}")
    assert bad.returncode == 2 and "value 1099511627776 at position (0, 0)" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1

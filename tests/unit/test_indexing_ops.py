"""Graph-level rules and references of gather, concat, argmax, equal, where, i32 arithmetic
and casts, attention masks; the transpose decomposition; host i32 bindings; kernel semantics."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipu_stack.errors import GraphError, SimulationError
from ipu_stack.graph import ComputeGraph, evaluate_reference
from ipu_stack.low.program import MapCall, Ref, View
from ipu_stack.mid.candidates.indexing import gather_grid, transpose_steps
from ipu_stack.runtime.host_integers import host_int32
from ipu_stack.runtime.indexing_semantics import indexing_semantics


def test_i32_host_input_and_the_ops_that_refuse_it():
    g = ComputeGraph()
    ids = g.host_input("ids", (4, 3), "i32")
    assert ids.dtype == "i32"
    for build in (
        lambda: g.gelu(ids),
        lambda: g.softmax(ids),
        lambda: g.gemm(ids, ids, transpose_right=True),
    ):
        with pytest.raises(GraphError, match="i32"):
            build()
    with pytest.raises(GraphError, match="must be i32"):
        g.gather(g.parameter("t", (5, 2), "f16"), g.host_input("f", (3,), "f32"))
    with pytest.raises(GraphError, match="2-D f16 or f32"):
        g.gather(g.parameter("t3", (5, 2, 2), "f16"), ids)


def test_gather_shape_and_reference_with_odd_sizes():
    g = ComputeGraph()
    ids = g.host_input("ids", (3, 5), "i32")
    out = g.gather(g.parameter("t", (11, 7), "f32"), ids)
    assert out.shape == (3, 5, 7) and out.dtype == "f32"
    g.set_outputs(out)
    rng = np.random.default_rng(0)
    feeds = {"ids": rng.integers(0, 11, (3, 5)), "t": rng.normal(size=(11, 7))}
    np.testing.assert_array_equal(evaluate_reference(g, feeds)[out.name], feeds["t"][feeds["ids"]])


def test_concat_shapes_and_errors():
    g = ComputeGraph()
    a, b = g.host_input("a", (2, 3, 5), "f16"), g.host_input("b", (2, 4, 5), "f16")
    assert g.concat([a, b], axis=1).shape == (2, 7, 5)
    assert g.concat([a, a], axis=-1).shape == (2, 3, 10)
    with pytest.raises(GraphError, match="outside axis 2"):
        g.concat([a, b], axis=2)
    with pytest.raises(GraphError, match="precisions differ"):
        g.concat([a, g.host_input("c", (2, 3, 5), "f32")], axis=0)
    with pytest.raises(GraphError, match="axis 3 out of range"):
        g.concat([a], axis=3)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_argmax_any_axis_matches_numpy(axis, keepdims):
    g = ComputeGraph()
    x = g.host_input("x", (3, 7, 5), "f32")
    out = g.argmax(x, axis, keepdims)
    g.set_outputs(out)
    data = np.random.default_rng(1).normal(size=(3, 7, 5))
    want = np.argmax(data, axis=axis)
    if keepdims:
        want = np.expand_dims(want, axis)
    got = evaluate_reference(g, {"x": data})[out.name]
    assert out.dtype == "i32" and out.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_integer_references_wrap_round_toward_zero_and_select():
    g = ComputeGraph()
    a, b = g.host_input("a", (4,), "i32"), g.host_input("b", (4,), "i32")
    x = g.host_input("x", (4,), "f32")
    eq = g.equal(a, b)
    outs = [g.add(a, b), g.mul(a, b), g.cast(x, "i32"), eq, g.where(eq, x, g.cast(a, "f32"))]
    g.set_outputs(*outs)
    feeds = {
        "a": np.array([2**31 - 1, -5, 7, 3]),
        "b": np.array([1, 2**20, 7, -3]),
        "x": np.array([2.7, -2.7, np.nan, -0.5]),
    }
    got = evaluate_reference(g, feeds)
    np.testing.assert_array_equal(got[outs[0].name], [-(2**31), 2**20 - 5, 14, 0])
    np.testing.assert_array_equal(got[outs[1].name], [2**31 - 1, -5 * 2**20, 49, -9])
    np.testing.assert_array_equal(got[outs[2].name], [2, -2, 0, 0])
    np.testing.assert_array_equal(got[outs[3].name], [0, 0, 1, 0])
    np.testing.assert_array_equal(got[outs[4].name], [2**31 - 1, -5, np.nan, 3])
    with pytest.raises(GraphError, match="condition"):
        g.where(x, x, x)


def test_attention_mask_must_broadcast_to_the_scores():
    g = ComputeGraph()
    q = g.host_input("q", (2, 3, 8, 4), "f32")
    g.flash_attention(q, q, q, mask=g.host_input("m", (2, 1, 1, 8), "f32"))
    with pytest.raises(GraphError, match=r"broadcast to the scores \(2, 3, 8, 8\)"):
        g.flash_attention(q, q, q, mask=g.host_input("bad", (2, 1, 8, 1, 8), "f32"))
    with pytest.raises(GraphError, match="must be f32"):
        g.flash_attention(q, q, q, mask=g.host_input("h", (8, 8), "f16"))


@settings(max_examples=60, deadline=None)
@given(st.permutations(range(5)))
def test_transpose_steps_compose_to_the_permutation(perm):
    perm = tuple(perm)
    data = np.arange(2 * 3 * 4 * 5 * 6).reshape(2, 3, 4, 5, 6)
    want = np.transpose(data, perm)
    if perm[-1] == 4:
        return
    first, second = transpose_steps(perm)
    t1 = np.transpose(data, first) if first else data
    assert t1.shape[-1] == 6 and t1.shape[-2] == data.shape[perm[-1]]
    swapped = np.swapaxes(t1, -1, -2)
    assert second[-1] == len(perm) - 1  # the last step keeps the last axis: a row move
    np.testing.assert_array_equal(np.transpose(swapped, second), want)


@pytest.mark.parametrize(("vocab", "width", "eb"), [(30522, 768, 4), (50257, 768, 2), (7, 3, 2)])
def test_gather_grid_covers_the_table_within_the_tile_budget(vocab, width, eb):
    grid = gather_grid(vocab, width, eb, 1472, "g")
    assert grid.tiles <= 1472
    assert (
        grid.rows_per_block * grid.row_blocks >= vocab > grid.rows_per_block * (grid.row_blocks - 1)
    )
    assert grid.cols_per_block * grid.col_blocks >= width
    assert (grid.cols_per_block * eb) % 4 == 0 or grid.col_blocks == 1
    assert grid.rows_per_block * grid.cols_per_block * eb <= 128 * 1024
    with pytest.raises(GraphError, match="needs"):
        gather_grid(10**7, 768, 4, 16, "g")


def test_host_int32_accepts_int64_that_fits_and_names_what_does_not():
    assert (
        host_int32(np.array([[1, -2]], np.int64), "i32 input 'ids'", GraphError).dtype == np.int32
    )
    with pytest.raises(GraphError, match=r"'ids': value -2147483649 at position \(1, 0\)"):
        host_int32(np.array([[0, 1], [-(2**31) - 1, 3]]), "i32 input 'ids'", GraphError)
    with pytest.raises(SimulationError, match="int32 or int64 array, got float32"):
        host_int32(np.zeros(3, np.float32), "i32 input 'ids'", SimulationError)


def _view(rows, cols, dtype):
    return View(Ref("b"), rows, cols, 64, dtype)


def test_gather_rows_kernel_zero_fills_rows_other_blocks_hold_and_faults_out_of_range():
    attrs = (("op", "g"), ("ids_name", "ids"), ("ids_shape", "2,3"), ("table_rows", 9))
    call = MapCall(
        0,
        "gather_rows",
        _view(6, 2, "f32"),
        (_view(3, 2, "f32"), _view(2, 3, "i32")),
        (*attrs, ("row_offset", 3)),
    )
    table = np.arange(6, dtype=np.float32).reshape(3, 2) + 1
    ids = np.array([[3, 0, 5], [8, 4, 4]], np.int32)
    out = indexing_semantics(call, [table, ids])
    np.testing.assert_array_equal(out, [[1, 2], [0, 0], [5, 6], [0, 0], [3, 4], [3, 4]])
    ids[1, 0] = 9
    with pytest.raises(SimulationError, match=r"g: ids 'ids' at position \(1, 0\) holds 9"):
        indexing_semantics(call, [table, ids])


def test_transpose_and_concat_kernels():
    src = np.arange(12, dtype=np.float16).reshape(3, 4)
    call = MapCall(0, "transpose", _view(4, 3, "f16"), (_view(3, 4, "f16"),), (("col_offset", 0),))
    np.testing.assert_array_equal(indexing_semantics(call, [src]), src.T)
    cat = MapCall(0, "concat", _view(3, 6, "f16"), (_view(3, 4, "f16"), _view(3, 2, "f16")))
    np.testing.assert_array_equal(
        indexing_semantics(cat, [src, src[:, :2]]), np.hstack([src, src[:, :2]])
    )

"""Boolean/integer ONNX operators and GatherND (issue 11) against onnxruntime, at odd sizes:
the graph's float64/int64 reference and, for the run-time paths, the simulator; range checks;
and a property test of the run-time padding mask inside the attention pattern."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from ipu_stack.errors import GraphError, IpuStackError
from ipu_stack.graph.compute_graph import evaluate_reference
from ipu_stack.graph.onnx_import import import_onnx
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.sim import SimDevice

ort = pytest.importorskip("onnxruntime")

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
QUICK = BuildConfig(tiles=8, exchange_time_budget=0.05, finalists=1, compile_kernels=False)


def model(nodes, inputs, outputs, consts=None, opset=18):
    """``inputs``/``outputs``: name -> (elem type, shape or None)."""
    graph = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info(n, e, list(s)) for n, (e, s) in inputs.items()],
        [helper.make_tensor_value_info(n, e, s) for n, (e, s) in outputs.items()],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in (consts or {}).items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def n(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, name=f"{op.lower()}_{outs[0]}", **attrs)


def onnxruntime(m: onnx.ModelProto, feeds):
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in m.graph.output]
    return dict(zip(names, session.run(names, feeds), strict=True))


def ours(m: onnx.ModelProto, feeds, simulate: bool = False):
    graph, bindings = import_onnx(m)
    fed = bindings.feeds(feeds)
    if simulate:
        built = build(graph, QUICK)
        results = SimDevice().run(built.program, built.placement, built.schedules, fed).outputs
    else:
        results = evaluate_reference(graph, fed)
    return graph, bindings.onnx_outputs(results)


def check(m, feeds, simulate=False, rtol=1e-5):
    graph, got = ours(m, feeds, simulate)
    for name, want in onnxruntime(m, feeds).items():
        g = np.asarray(got[name], np.float64).reshape(want.shape)
        scale = max(float(np.abs(want).max()), 1e-6)
        assert float(np.abs(g - want).max()) <= rtol * scale, name
    return graph


RNG = np.random.default_rng(11)
A = RNG.integers(-2, 3, (3, 5)).astype(np.int64)  # zeros and non-zeros
B = RNG.integers(0, 2, (5,)).astype(bool)
X = RNG.standard_normal((3, 5)).astype(np.float32)


def _logic(op: str):
    """y = Where(op(Cast(a, bool), b), x, -x) (Not takes one operand)."""
    ins = ["ab"] if op == "Not" else ["ab", "b"]
    nodes = [n("Cast", ["a"], ["ab"], to=BOOL), n(op, ins, ["c"]), n("Neg", ["x"], ["nx"]),
             n("Where", ["c", "x", "nx"], ["y"])]  # fmt: skip
    inputs = {"a": (I64, (3, 5)), "b": (BOOL, (5,)), "x": (F32, (3, 5))}
    if op == "Not":
        del inputs["b"]
    return model(nodes, inputs, {"y": (F32, None)})


@pytest.mark.parametrize("op", ["And", "Or", "Xor", "Not"])
def test_logical_operators_match_onnxruntime(op):
    feeds = {"a": A, "b": B, "x": X}
    if op == "Not":
        del feeds["b"]
    graph = check(_logic(op), feeds)
    assert "where" in [o.kind for o in graph.operations]


def test_logical_operators_on_the_simulator():
    feeds = {"a": A, "b": B, "x": X}
    check(_logic("Xor"), feeds, simulate=True)


def test_a_wrong_logical_operator_is_caught():
    """Or's result compared with And's reference differs (the check is not vacuous)."""
    feeds = {"a": A, "b": B, "x": X}
    _, got = ours(_logic("Or"), feeds)
    want = onnxruntime(_logic("And"), feeds)["y"]
    assert np.abs(got["y"] - want).max() > 0.1


def test_cast_of_a_float_to_bool_is_not_zero():
    x = X.copy()
    x[0, :3] = 0.0
    nodes = [n("Cast", ["x"], ["c"], to=BOOL), n("Where", ["c", "x", "two"], ["y"])]
    m = model(nodes, {"x": (F32, (3, 5))}, {"y": (F32, None)}, {"two": np.float32(2.0)})
    check(m, {"x": x})


def test_expand_float_and_boolean():
    nodes = [
        n("Expand", ["x", "shape"], ["e"]),
        n("Cast", ["m"], ["mb"], to=BOOL),
        n("Expand", ["mb", "shape"], ["me"]),
        n("Where", ["me", "e", "zero"], ["y"]),
    ]
    consts = {"shape": np.array([2, 3, 1, 7], np.int64), "zero": np.float32(0)}
    m = model(nodes, {"x": (F32, (3, 1, 1)), "m": (I64, (1, 7))}, {"y": (F32, None)}, consts)
    feeds = {"x": RNG.standard_normal((3, 1, 1)).astype(np.float32),
             "m": np.array([[1, 0, 1, 1, 0, 0, 1]], np.int64)}  # fmt: skip
    check(m, feeds)


def test_integer_sub_and_constants():
    nodes = [n("Sub", ["a", "k"], ["d"]), n("Sub", ["d", "a2"], ["e"]),
             n("Cast", ["e"], ["y"], to=F32)]  # fmt: skip
    m = model(nodes, {"a": (I64, (3, 5)), "a2": (I64, (5,))}, {"y": (F32, None)},
              {"k": np.array([7], np.int64)})  # fmt: skip
    check(m, {"a": A, "a2": A[1]})


def test_an_integer_constant_outside_int32_is_refused_naming_it():
    nodes = [n("Add", ["a", "big"], ["s"]), n("Cast", ["s"], ["y"], to=F32)]
    m = model(nodes, {"a": (I64, (3, 5))}, {"y": (F32, None)}, {"big": np.array([2**40])})
    with pytest.raises(GraphError, match=r"'big' holds 1099511627776 .*outside int32"):
        import_onnx(m)


# -- GatherND -----------------------------------------------------------------------------------
def _gather_nd_constant(indices, batch_dims=0, shape=(3, 5, 7)):
    nodes = [n("Mul", ["x", "two"], ["h"]), n("GatherND", ["h", "i"], ["y"], batch_dims=batch_dims)]
    consts = {"two": np.float32(2), "i": np.asarray(indices, np.int64)}
    return model(nodes, {"x": (F32, shape)}, {"y": (F32, None)}, consts)


@pytest.mark.parametrize(
    ("indices", "batch_dims"),
    [
        ([[0, 1], [2, 4], [1, -1]], 0),  # points (a negative constant index is normalised)
        ([[2], [0]], 0),  # whole [5, 7] blocks
        ([[0, 1, 2], [2, 3, 6]], 0),  # scalars
        ([[1], [4], [0]], 1),  # one row per batch entry
    ],
)
def test_gather_nd_with_constant_indices(indices, batch_dims):
    x = RNG.standard_normal((3, 5, 7)).astype(np.float32)
    graph = check(_gather_nd_constant(indices, batch_dims), {"x": x})
    assert "gather" not in [o.kind for o in graph.operations]  # slices of the data


def _gather_nd_runtime(batch_dims=0, k=2, points=(4,)):
    nodes = [n("Mul", ["x", "two"], ["h"]), n("GatherND", ["h", "i"], ["y"], batch_dims=batch_dims)]
    inputs = {"x": (F32, (3, 5, 7)), "i": (I64, (*points, k))}
    return model(nodes, inputs, {"y": (F32, None)}, {"two": np.float32(2)})


@pytest.mark.parametrize(
    ("batch_dims", "indices"),
    [
        (0, np.array([[0, 1], [2, 4], [1, 3], [2, 0]])),
        (0, np.array([[[2], [0]], [[1], [1]]])),  # k = 1 over a [2, 2] grid of points
        (1, np.array([[4], [0], [3]])),
        (1, np.array([[1, 6], [4, 0], [0, 3]])),  # batch axis plus two components
    ],
)
def test_gather_nd_with_run_time_indices_on_the_simulator(batch_dims, indices):
    x = RNG.standard_normal((3, 5, 7)).astype(np.float32)
    m = _gather_nd_runtime(batch_dims, indices.shape[-1], indices.shape[:-1])
    graph = check(m, {"x": x, "i": indices}, simulate=True)
    assert "gather" in [o.kind for o in graph.operations]


def test_gather_nd_component_out_of_its_axis_faults_naming_it():
    """(0, 9) over axes (3, 5) would land on row 9 (= (1, 4)) of the flat table without the
    per-component check: it must fault instead, naming the checked axis and the value."""
    x = RNG.standard_normal((3, 5, 7)).astype(np.float32)
    m = _gather_nd_runtime(0, 2, (2,))
    bad = {"x": x, "i": np.array([[0, 1], [0, 9]])}
    with pytest.raises(IpuStackError, match=r"axis1_in_range.*position \(1,\) holds 9"):
        ours(m, bad)
    with pytest.raises(IpuStackError, match=r"axis1_in_range.*position \(1,\) holds 9"):
        ours(m, bad, simulate=True)


def _clip_pooling(rows: np.ndarray, batch: int = 3):
    """CLIP-text's end-of-text pooling: hidden[rows, argmax(ids)] through Concat + GatherND."""
    nodes = [
        n("Cast", ["ids"], ["ids32"], to=TensorProto.INT32),
        n("ArgMax", ["ids32"], ["am"], axis=-1, keepdims=0),
        n("Unsqueeze", ["am", "ax"], ["amu"]),
        n("Concat", ["rows", "amu"], ["idx"], axis=-1),
        n("Mul", ["x", "two"], ["h"]),
        n("GatherND", ["h", "idx"], ["y"]),
    ]
    consts = {"ax": np.array([-1], np.int64), "rows": rows, "two": np.float32(2)}
    inputs = {"ids": (I64, (batch, 9)), "x": (F32, (batch, 9, 5))}
    return model(nodes, inputs, {"y": (F32, None)}, consts)


def test_clip_style_pooling_from_argmax():
    """The constant batch rows fold into an offset; the ArgMax component (in [0, 9) by
    construction) needs no range check: one gather."""
    ids = np.array([[5, 8, 3, 40, 2, 7, 1, 1, 0], [1, 2, 3, 4, 5, 6, 7, 8, 9],
                    [90, 8, 3, 4, 2, 7, 1, 1, 0]], np.int64)  # fmt: skip
    feeds = {"ids": ids, "x": RNG.standard_normal((3, 9, 5)).astype(np.float32)}
    graph = check(_clip_pooling(np.arange(3).reshape(3, 1)), feeds, simulate=True)
    assert [o.kind for o in graph.operations].count("gather") == 1
    with pytest.raises(GraphError, match=r"constant index component 0 holds \[0, 3, 1\]"):
        import_onnx(_clip_pooling(np.array([[0], [3], [1]])))


# -- the run-time padding mask in the attention pattern -----------------------------------------
T, H, D = 5, 2, 4


def _masked_attention(add_mask_first: bool, and_swapped: bool, mask_form: str, scale_form: str):
    """softmax(q k^T * s + mask(m)) v with BERT's padding mask, in the given spellings."""
    nodes = [n("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), n("MatMul", ["q", "kt"], ["qk"])]
    if scale_form == "div":
        nodes.append(n("Div", ["qk", "c"], ["scores"]))
    else:
        nodes.append(n("Mul", ["c", "qk"] if add_mask_first else ["qk", "c"], ["scores"]))
    nodes += [
        n("Cast", ["m"], ["mb"], to=BOOL),
        n("Unsqueeze", ["mb", "axes"], ["m4"]),  # [B, 1, 1, T]
        n("And", ["m4", "open"] if and_swapped else ["open", "m4"], ["keep"]),
    ]
    if mask_form == "where":
        nodes.append(n("Where", ["keep", "zero", "lowest"], ["bias"]))
    else:  # (1 - keep) * -1e4, the older transformers spelling
        nodes += [n("Cast", ["keep"], ["kf"], to=F32), n("Sub", ["one", "kf"], ["blocked"]),
                  n("Mul", ["blocked", "big"], ["bias"])]  # fmt: skip
    nodes.append(n("Add", ["bias", "scores"] if add_mask_first else ["scores", "bias"], ["z"]))
    nodes += [n("Softmax", ["z"], ["p"], axis=-1), n("MatMul", ["p", "v"], ["y"])]
    scale = np.sqrt(D) if scale_form == "div" else 1 / np.sqrt(D)
    consts = {
        "c": np.float32(scale), "axes": np.array([1, 2], np.int64),
        "open": np.ones((1, 1, T, 1), bool), "zero": np.float32(0),
        "lowest": np.float32(np.finfo(np.float32).min), "one": np.float32(1),
        "big": np.float32(-1e4),
    }  # fmt: skip
    inputs = {"q": (F32, (2, H, T, D)), "k": (F32, (2, H, T, D)), "v": (F32, (2, H, T, D)),
              "m": (I64, (2, T))}  # fmt: skip
    return model(nodes, inputs, {"y": (F32, None)}, consts)


@settings(max_examples=10, deadline=None)
@given(
    add_mask_first=st.booleans(),
    and_swapped=st.booleans(),
    mask_form=st.sampled_from(["where", "arithmetic"]),
    scale_form=st.sampled_from(["div", "mul"]),
    pads=st.lists(st.integers(0, T - 1), min_size=2, max_size=2),
)
def test_a_run_time_padding_mask_fuses_in_any_spelling(
    add_mask_first, and_swapped, mask_form, scale_form, pads
):
    m = _masked_attention(add_mask_first, and_swapped, mask_form, scale_form)
    rng = np.random.default_rng(len(pads) + pads[0])
    mask = np.ones((2, T), np.int64)
    for b, p in enumerate(pads):
        mask[b, T - p :] = 0 if p else 1
    feeds = {r: rng.standard_normal((2, H, T, D)).astype(np.float32) for r in "qkv"}
    feeds["m"] = mask
    graph = check(m, feeds)
    attention = [o for o in graph.operations if o.kind == "flash_attention"]
    assert len(attention) == 1 and len(attention[0].inputs) == 4, "fused with its mask operand"
    assert "softmax" not in [o.kind for o in graph.operations]


def test_the_padding_mask_matters_on_the_simulator():
    """Simulated, it matches onnxruntime; ignoring the mask would not."""
    m = _masked_attention(False, False, "where", "div")
    rng = np.random.default_rng(5)
    feeds = {r: rng.standard_normal((2, H, T, D)).astype(np.float32) for r in "qkv"}
    feeds["m"] = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int64)
    check(m, feeds, simulate=True)
    unmasked = dict(feeds, m=np.ones((2, T), np.int64))
    assert np.abs(onnxruntime(m, unmasked)["y"] - onnxruntime(m, feeds)["y"]).max() > 1e-2


def test_an_int64_input_outside_int32_is_refused_naming_position_and_value():
    _, bindings = import_onnx(_logic("Not"))
    bad = A.copy()
    bad[2, 3] = 2**33
    with pytest.raises(GraphError, match=r"'a' holds 8589934592 at position \(2, 3\), outside"):
        bindings.feeds({"a": bad, "x": X})


@pytest.mark.parametrize(
    ("axis", "exclusive", "reverse"), [(1, 0, 0), (-1, 1, 0), (1, 0, 1), (0, 1, 1)]
)
@pytest.mark.parametrize("simulate", [False, True])
def test_cumsum_of_run_time_integers_and_floats(axis, exclusive, reverse, simulate):
    """RoBERTa's position ids: ``cumsum(ids != pad) * mask + pad`` on int64 ids; and a float
    CumSum along another axis. Both against onnxruntime, on the reference and the simulator."""
    ids = RNG.integers(0, 4, (3, 7)).astype(np.int64)
    nodes = [
        n("Equal", ["ids", "pad"], ["is_pad"]), n("Not", ["is_pad"], ["keep"]),
        n("Cast", ["keep"], ["keep_i"], to=TensorProto.INT64),
        n("CumSum", ["keep_i", "axis"], ["counts"], exclusive=exclusive, reverse=reverse),
        n("Mul", ["counts", "keep_i"], ["kept"]), n("Add", ["kept", "pad"], ["positions"]),
        n("Cast", ["positions"], ["positions_f"], to=F32),
        n("CumSum", ["x", "axis0"], ["running"], exclusive=exclusive, reverse=reverse),
    ]  # fmt: skip
    m = model(
        nodes, {"ids": (I64, (3, 7)), "x": (F32, (3, 7))},
        {"positions_f": (F32, None), "running": (F32, None)},
        {"pad": np.array(1, np.int64), "axis": np.array(axis, np.int64),
         "axis0": np.array(0 if axis != 0 else 1, np.int64)},
    )  # fmt: skip
    x = RNG.standard_normal((3, 7)).astype(np.float32)
    check(m, {"ids": ids, "x": x}, simulate=simulate)


def test_cumsum_over_too_long_an_axis_is_refused():
    m = model([n("CumSum", ["x", "axis"], ["y"])], {"x": (F32, (2, 4096))}, {"y": (F32, None)},
              {"axis": np.array(1, np.int64)})  # fmt: skip
    with pytest.raises(GraphError, match=r"4096 long; CumSum is taken over at most 2048"):
        import_onnx(m)


@pytest.mark.parametrize("simulate", [False, True])
def test_gather_elements_of_a_repeated_constant_table(simulate):
    """RoBERTa gathers its token-type buffer (one line, expanded) at the position ids."""
    line = np.array([5, 0, 3, 9, 2, 7], np.int64)
    table = np.broadcast_to(line, (3, 6)).copy()
    nodes = [n("GatherElements", ["table", "ids"], ["picked"], axis=1),
             n("Cast", ["picked"], ["y"], to=F32)]  # fmt: skip
    m = model(nodes, {"ids": (I64, (3, 4))}, {"y": (F32, None)}, {"table": table})
    ids = RNG.integers(0, 6, (3, 4)).astype(np.int64)
    check(m, {"ids": ids}, simulate=simulate)


def test_gather_elements_of_differing_lines_is_refused():
    table = np.arange(18, dtype=np.float32).reshape(3, 6)
    m = model([n("GatherElements", ["table", "ids"], ["y"], axis=1)], {"ids": (I64, (3, 4))},
              {"y": (F32, None)}, {"table": table})  # fmt: skip
    with pytest.raises(GraphError, match=r"differs between its lines along axis 1"):
        import_onnx(m)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("simulate", [False, True])
def test_gather_elements_of_computed_data_at_constant_indices(axis, simulate):
    """DeBERTa gathers its relative-position scores (computed) at constant positions; the
    indices may be smaller than the data off the axis, and negative."""
    ids = RNG.integers(-4, 4, (3, 4, 2)).astype(np.int64)
    nodes = [n("Relu", ["x"], ["r"]), n("GatherElements", ["r", "ids"], ["y"], axis=axis)]
    m = model(nodes, {"x": (F32, (4, 5, 4))}, {"y": (F32, None)}, {"ids": ids})
    check(m, {"x": RNG.standard_normal((4, 5, 4)).astype(np.float32)}, simulate=simulate)


def test_gather_elements_refuses_indices_outside_the_axis():
    nodes = [n("Relu", ["x"], ["r"]), n("GatherElements", ["r", "ids"], ["y"], axis=1)]
    ids = np.array([[0, 5], [1, 2]], np.int64)
    m = model(nodes, {"x": (F32, (2, 5))}, {"y": (F32, None)}, {"ids": ids})
    with pytest.raises(GraphError, match=r"index 5 at \(0, 1\) is outside axis 1 of length 5"):
        import_onnx(m)

"""ONNX import: each operator and pattern against onnxruntime, and every refusal's message.

The reference here is ``evaluate_reference`` (float64 NumPy over the imported graph), so these
tests check the importer independently of the tile lowering and the simulator.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ipu_stack.errors import GraphError
from ipu_stack.graph import evaluate_reference
from ipu_stack.graph.onnx_import import import_onnx
from ipu_stack.graph.onnx_patterns import causal_from_bias

ort = pytest.importorskip("onnxruntime")

F32 = TensorProto.FLOAT
F16 = TensorProto.FLOAT16
SQRT2 = float(np.sqrt(2.0))


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: dict[str, Sequence[int]],
    outputs: Sequence[str],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 20,
    elem: int = F32,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes),
        "test",
        [helper.make_tensor_value_info(n, elem, list(s)) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, elem, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in (initializers or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for value_info in model.graph.input:
        if value_info.name in initializers:
            continue
        tensor = value_info.type.tensor_type
        shape = [d.dim_value for d in tensor.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        feeds[value_info.name] = rng.uniform(-2, 2, shape).astype(dtype)
    return feeds


def check_against_onnxruntime(model: onnx.ModelProto, rtol: float = 1e-3, **kwargs):
    """Import, evaluate the float64 reference, compare every output with onnxruntime."""
    graph, bindings = import_onnx(model, **kwargs)
    inputs = random_inputs(model)
    ours = bindings.onnx_outputs(evaluate_reference(graph, bindings.feeds(inputs)))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    for name, expected in zip(names, session.run(names, inputs), strict=True):
        actual = ours[name]
        assert actual.shape == expected.shape, name
        scale = max(float(np.abs(expected).max()), 1e-6)
        error = float(np.abs(actual - expected.astype(np.float64)).max()) / scale
        assert error <= rtol, f"{name}: max abs error / max |reference| = {error:.2e}"
    return graph, bindings


def kinds(graph) -> list[str]:
    return [op.kind for op in graph.operations]


def node(op: str, inputs: list[str], outputs: list[str], **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, name=f"{op.lower()}_{outputs[0]}", **attrs)


def f32(shape, seed=1) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


# -- one operator at a time ---------------------------------------------------------------------
OPERATOR_MODELS = {
    "matmul_batched": lambda: make_model(
        [node("MatMul", ["a", "b"], ["y"])], {"a": (2, 3, 8, 16), "b": (3, 16, 4)}, ["y"]
    ),
    "matmul_1d_left": lambda: make_model(
        [node("MatMul", ["a", "b"], ["y"])], {"a": (16,), "b": (2, 16, 4)}, ["y"]
    ),
    "matmul_1d_right": lambda: make_model(
        [node("MatMul", ["a", "b"], ["y"])], {"a": (3, 5, 16), "b": (16,)}, ["y"]
    ),
    "gemm_all_attributes": lambda: make_model(
        [node("Gemm", ["a", "w", "c"], ["y"], transA=1, transB=1, alpha=0.25, beta=0.35)],
        {"a": (12, 6), "c": (1, 5)},
        ["y"],
        {"w": f32((5, 12))},
    ),
    "gemm_constant_bias_beta": lambda: make_model(
        [node("Gemm", ["a", "w", "c"], ["y"], beta=2.0)],
        {"a": (6, 12)},
        ["y"],
        {"w": f32((12, 5)), "c": f32((5,), seed=2)},
    ),
    "add_mul_broadcast_constants": lambda: make_model(
        [node("Add", ["x", "b"], ["t"]), node("Mul", ["s", "t"], ["y"])],
        {"x": (2, 3, 8)},
        ["y"],
        {"b": f32((8,)), "s": f32((3, 1), seed=3)},
    ),
    "sub_div_constants": lambda: make_model(
        [node("Sub", ["x", "c"], ["t"]), node("Div", ["t", "d"], ["y"])],
        {"x": (4, 8)},
        ["y"],
        {"c": f32((8,)), "d": np.array(3.0, np.float32)},
    ),
    "gelu_op": lambda: make_model([node("Gelu", ["x"], ["y"])], {"x": (4, 32)}, ["y"]),
    "layer_norm_last_axis": lambda: make_model(
        [node("LayerNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)],
        {"x": (2, 5, 16)},
        ["y"],
        {"s": f32((16,)), "b": f32((16,), seed=2)},
    ),
    "layer_norm_axis1_no_bias": lambda: make_model(
        [node("LayerNormalization", ["x", "s"], ["y"], axis=1)],
        {"x": (3, 4, 8)},
        ["y"],
        {"s": f32((4, 8))},
    ),
    "softmax_last": lambda: make_model([node("Softmax", ["x"], ["y"])], {"x": (3, 7)}, ["y"]),
    "softmax_axis0_opset13": lambda: make_model(
        [node("Softmax", ["x"], ["y"], axis=0)], {"x": (3, 4, 5)}, ["y"], opset=13
    ),
    "softmax_axis1_opset11_flattens": lambda: make_model(
        [node("Softmax", ["x"], ["y"], axis=1)], {"x": (3, 4, 5)}, ["y"], opset=11
    ),
    "reshape_zero_and_minus_one": lambda: make_model(
        [node("Reshape", ["x", "shape"], ["y"])],
        {"x": (2, 3, 4, 5)},
        ["y"],
        {"shape": np.array([0, -1, 5], np.int64)},
    ),
    "transpose_default_and_perm": lambda: make_model(
        [node("Transpose", ["x"], ["t"]), node("Transpose", ["t"], ["y"], perm=[1, 2, 0])],
        {"x": (2, 3, 4)},
        ["y"],
    ),
    "slice_negative_and_clamped": lambda: make_model(
        [node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])],
        {"x": (6, 10, 5)},
        ["y"],
        {
            "starts": np.array([-4, 1], np.int64),
            "ends": np.array([1000, -1], np.int64),
            "axes": np.array([1, -1], np.int64),
            "steps": np.array([1, 1], np.int64),
        },
    ),
    "cast_f32_to_f16_and_back": lambda: make_model(
        [node("Cast", ["x"], ["h"], to=F16), node("Cast", ["h"], ["y"], to=F32)],
        {"x": (4, 8)},
        ["y"],
    ),
    "unsqueeze_squeeze_flatten": lambda: make_model(
        [
            node("Unsqueeze", ["x", "ax"], ["u"]),
            node("Squeeze", ["u", "sq"], ["s"]),
            node("Flatten", ["s"], ["y"], axis=2),
        ],
        {"x": (2, 1, 3, 4)},
        ["y"],
        {"ax": np.array([0, -1], np.int64), "sq": np.array([0, 2], np.int64)},
    ),
    "squeeze_all_ones_opset11": lambda: make_model(
        [node("Squeeze", ["x"], ["s"]), node("Unsqueeze", ["s"], ["y"], axes=[1])],
        {"x": (1, 3, 1, 4)},
        ["y"],
        opset=11,
    ),
    "identity_output": lambda: make_model([node("Identity", ["x"], ["y"])], {"x": (4,)}, ["y"]),
}


@pytest.mark.parametrize("name", sorted(OPERATOR_MODELS))
def test_operator_matches_onnxruntime(name):
    check_against_onnxruntime(OPERATOR_MODELS[name]())


def test_f16_model_imports_as_f16_and_matches():
    model = make_model(
        [node("MatMul", ["x", "w"], ["t"]), node("Gelu", ["t"], ["y"])],
        {"x": (8, 32)},
        ["y"],
        {"w": f32((32, 16)).astype(np.float16)},
        elem=F16,
    )
    graph, bindings = check_against_onnxruntime(model, rtol=5e-3)
    assert {v.dtype for v in graph.values} == {"f16"}
    assert bindings.parameters["w"].dtype == np.float16


def test_gemm_alpha_and_beta_become_mul_and_add():
    graph, bindings = import_onnx(OPERATOR_MODELS["gemm_all_attributes"](), roll_layers=False)
    # alpha's multiply is folded into the weights (graph/scale_folding.py), beta's stays
    assert kinds(graph) == ["gemm", "mul", "add"]
    assert any(line.startswith("folded 1 scalar multiplies") for line in bindings.fusions)
    gemm = graph.operations[0]
    assert gemm.transpose_left and gemm.transpose_right


def test_same_named_nodes_get_their_own_constants():
    model = make_model(
        [
            helper.make_node("Gemm", ["a", "w"], ["t"], name="g", alpha=2.0),
            helper.make_node("Gemm", ["t", "w"], ["y"], name="g", alpha=3.0),
        ],
        {"a": (4, 4)},
        ["y"],
        {"w": f32((4, 4))},
    )
    # onnxruntime rejects duplicate node names; unrolled, so the constants keep their names
    graph, bindings = import_onnx(model, roll_layers=False)
    a = f32((4, 4), seed=5)
    (y,) = evaluate_reference(graph, bindings.feeds({"a": a})).values()
    w = f32((4, 4)).astype(np.float64)
    np.testing.assert_allclose(y, 3.0 * (2.0 * a @ w) @ w, rtol=1e-12)
    scales = sorted(float(a[0]) for n, a in bindings.parameters.items() if "alpha" in n)
    assert scales == [2.0, 3.0]
    assert len({v.name for v in graph.values}) == len(graph.values)


def test_initializers_become_parameters_and_inputs_host_inputs():
    graph, bindings = import_onnx(OPERATOR_MODELS["layer_norm_last_axis"]())
    assert [v.name for v in graph.by_kind("host_input")] == ["x"]
    assert sorted(v.name for v in graph.by_kind("parameter")) == ["b", "s"]
    np.testing.assert_array_equal(bindings.parameters["s"], f32((16,)))
    assert bindings.outputs["y"].name == "layernormalization_y.out"  # named after the node


def test_transpose_of_last_two_axes_folds_into_gemm():
    model = make_model(
        [
            node("Transpose", ["a"], ["at"], perm=[0, 2, 1]),
            node("Transpose", ["b"], ["bt"], perm=[0, 2, 1]),
            node("MatMul", ["at", "bt"], ["y"]),
        ],
        {"a": (2, 16, 8), "b": (2, 4, 16)},
        ["y"],
    )
    graph, _ = check_against_onnxruntime(model)
    assert kinds(graph) == ["gemm"]
    assert graph.operations[0].transpose_left and graph.operations[0].transpose_right


def test_transpose_used_elsewhere_is_still_computed():
    model = make_model(
        [
            node("Transpose", ["b"], ["bt"], perm=[1, 0]),
            node("MatMul", ["a", "bt"], ["y"]),
            node("Add", ["bt", "bt"], ["z"]),
        ],
        {"a": (3, 16), "b": (4, 16)},
        ["y", "z"],
    )
    graph, _ = check_against_onnxruntime(model)
    assert sorted(kinds(graph)) == ["add", "gemm", "transpose"]


def test_shape_subgraph_folds_into_a_constant_reshape():
    model = make_model(
        [
            node("Shape", ["x"], ["s"]),
            node("Gather", ["s", "zero"], ["d0"], axis=0),
            node("Unsqueeze", ["d0", "axes"], ["d0u"]),
            node("Concat", ["d0u", "rest"], ["shape"], axis=0),
            node("Reshape", ["x", "shape"], ["y"]),
        ],
        {"x": (2, 3, 4)},
        ["y"],
        {
            "zero": np.array(0, np.int64),
            "axes": np.array([0], np.int64),
            "rest": np.array([4, 3], np.int64),
        },
    )
    graph, _ = check_against_onnxruntime(model)
    assert kinds(graph) == ["view"]
    assert graph.value(graph.outputs[0]).shape == (2, 4, 3)


def test_unused_inputs_are_ignored_and_unused_nodes_not_emitted():
    model = make_model(
        [node("Add", ["x", "x"], ["y"]), node("Mul", ["unused", "unused"], ["dead"])],
        {"x": (4,), "unused": (4,)},
        ["y"],
    )
    graph, bindings = import_onnx(model)
    assert kinds(graph) == ["add"]
    assert bindings.ignored_inputs == ("unused",)


def test_symbolic_dimensions_need_input_shapes():
    model = make_model([node("Softmax", ["x"], ["y"])], {"x": ("batch", 8)}, ["y"])
    with pytest.raises(GraphError, match=r"'x' has a symbolic .* --input-shape x=.* input_shapes"):
        import_onnx(model)
    graph, _ = import_onnx(model, input_shapes={"x": (3, 8)})
    assert graph.value(graph.outputs[0]).shape == (3, 8)


def test_integer_inputs_can_be_bound_as_constants():
    model = make_model([node("Reshape", ["x", "shape"], ["y"])], {"x": (2, 6)}, ["y"], opset=20)
    model.graph.input.append(helper.make_tensor_value_info("shape", TensorProto.INT64, [2]))
    graph, _ = import_onnx(model, constants={"shape": np.array([3, 4], np.int64)})
    assert graph.value(graph.outputs[0]).shape == (3, 4)


# -- GeLU pattern -------------------------------------------------------------------------------
def _gelu_forms() -> dict[str, tuple[list[onnx.NodeProto], dict[str, np.ndarray]]]:
    consts = {
        "sqrt2": np.array(SQRT2, np.float32),
        "inv_sqrt2": np.array(1 / SQRT2, np.float32),
        "one": np.array(1.0, np.float32),
        "half": np.array(0.5, np.float32),
        "two": np.array(2.0, np.float32),
    }
    erf_div = [node("Div", ["x", "sqrt2"], ["s"]), node("Erf", ["s"], ["e"])]
    erf_mul = [node("Mul", ["inv_sqrt2", "x"], ["s"]), node("Erf", ["s"], ["e"])]
    return {
        "pytorch": (
            [*erf_div, node("Add", ["e", "one"], ["p"]), node("Mul", ["x", "p"], ["xp"]),
             node("Mul", ["xp", "half"], ["y"])],
            consts,
        ),
        "half_first": (
            [*erf_mul, node("Add", ["one", "e"], ["p"]), node("Mul", ["x", "half"], ["xh"]),
             node("Mul", ["xh", "p"], ["y"])],
            consts,
        ),
        "half_outside_commuted": (
            [*erf_div, node("Add", ["e", "one"], ["p"]), node("Mul", ["p", "x"], ["px"]),
             node("Mul", ["half", "px"], ["y"])],
            consts,
        ),
        "divide_by_two": (
            [*erf_mul, node("Add", ["e", "one"], ["p"]), node("Div", ["x", "two"], ["xh"]),
             node("Mul", ["p", "xh"], ["y"])],
            consts,
        ),
    }  # fmt: skip


@pytest.mark.parametrize("form", sorted(_gelu_forms()))
def test_erf_gelu_pattern_becomes_one_gelu(form):
    nodes, consts = _gelu_forms()[form]
    model = make_model(nodes, {"x": (4, 64)}, ["y"], consts)
    graph, bindings = check_against_onnxruntime(model)
    assert kinds(graph) == ["gelu"]
    assert bindings.parameters == {}
    assert any("GeluFusion" in note for note in bindings.fusions)


def test_erf_with_wrong_constant_is_refused_naming_the_erf_node():
    nodes, consts = _gelu_forms()["pytorch"]
    consts = {**consts, "half": np.array(0.4, np.float32)}
    with pytest.raises(GraphError, match=r"ONNX node 'erf_e' \(Erf\).*GeLU pattern"):
        import_onnx(make_model(nodes, {"x": (4, 8)}, ["y"], consts))


def test_gelu_pattern_with_shared_intermediate_is_not_fused():
    nodes, consts = _gelu_forms()["pytorch"]
    model = make_model(nodes, {"x": (4, 8)}, ["y", "e"], consts)
    with pytest.raises(GraphError, match=r"\(Erf\)"):
        import_onnx(model)


# -- attention pattern --------------------------------------------------------------------------
B, H, T, D = 2, 3, 16, 8


def _attention_model(
    scale: str = "div", mask: str | None = None, mask_value: float = -np.inf,
    k_layout: str = "bhtd", tq: int = T,
) -> onnx.ModelProto:  # fmt: skip
    consts: dict[str, np.ndarray] = {}
    nodes = []
    inputs = {"q": (B, H, tq, D), "v": (B, H, T, D)}
    if k_layout == "bhtd":  # K given per head, transposed by the model
        inputs["k"] = (B, H, T, D)
        nodes.append(node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]))
    elif k_layout == "bthd":  # K before the head transpose: one Transpose straight to K^T
        inputs["k"] = (B, T, H, D)
        nodes.append(node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]))
    else:  # K^T is a graph input
        inputs["kt"] = (B, H, D, T)
    q_name = "q"
    if scale == "split":  # scale applied to q and to k^T (the Attention function body's form)
        consts["sq"] = np.array(D**-0.25, np.float32)
        nodes += [node("Mul", ["q", "sq"], ["qs"]), node("Mul", ["kt", "sq"], ["kts"])]
        q_name, kt_name = "qs", "kts"
    else:
        kt_name = "kt"
    nodes.append(node("MatMul", [q_name, kt_name], ["scores"]))
    if scale == "div":
        consts["c"] = np.array(np.sqrt(D), np.float32)
        nodes.append(node("Div", ["scores", "c"], ["scaled"]))
    elif scale == "mul":
        consts["c"] = np.array(1 / np.sqrt(D), np.float32)
        nodes.append(node("Mul", ["c", "scores"], ["scaled"]))
    logits = "scaled" if scale in ("div", "mul") else "scores"
    blocked = np.triu(np.ones((tq, T), dtype=bool), k=1 + T - tq)
    if mask == "add":
        consts["mask"] = np.where(blocked, mask_value, 0).astype(np.float32)[None, None]
        nodes.append(node("Add", ["mask", logits], ["masked"]))
        logits = "masked"
    elif mask == "add_random":
        consts["mask"] = f32((tq, T), seed=9)
        nodes.append(node("Add", [logits, "mask"], ["masked"]))
        logits = "masked"
    elif mask == "where":
        consts["keep"] = ~blocked
        consts["fill"] = np.array(mask_value, np.float32)
        nodes.append(node("Where", ["keep", logits, "fill"], ["masked"]))
        logits = "masked"
    nodes += [node("Softmax", [logits], ["p"], axis=-1), node("MatMul", ["p", "v"], ["y"])]
    return make_model(nodes, inputs, ["y"], consts)


ATTENTION_FORMS = {
    "div_unmasked": ({}, False),
    "mul_scale_causal_add_inf": ({"scale": "mul", "mask": "add"}, True),
    "causal_add_minus_1e4": ({"mask": "add", "mask_value": -1e4}, True),
    "causal_where_lowest": ({"mask": "where", "mask_value": float(np.finfo(np.float32).min)}, True),
    "split_scale": ({"scale": "split"}, False),
    "no_scale_k_transposed_input": ({"scale": "none", "k_layout": "kt_input"}, False),
    "k_from_bthd": ({"k_layout": "bthd", "mask": "add"}, True),
    "fewer_queries_causal": ({"mask": "add", "tq": 4}, True),
}


@pytest.mark.parametrize("form", sorted(ATTENTION_FORMS))
def test_attention_pattern_becomes_flash_attention(form):
    kwargs, causal = ATTENTION_FORMS[form]
    graph, _ = check_against_onnxruntime(_attention_model(**kwargs))
    attention = [op for op in graph.operations if op.kind == "flash_attention"]
    assert len(attention) == 1
    assert attention[0].attr("causal") is causal
    scale = 1.0 if kwargs.get("scale") == "none" else 1 / np.sqrt(D)
    assert attention[0].attr("scale") == pytest.approx(scale, rel=1e-6)
    assert set(kinds(graph)) <= {"flash_attention", "transpose"}


def test_attention_with_a_non_causal_mask_falls_back_to_separate_operations():
    graph, _ = check_against_onnxruntime(_attention_model(mask="add_random"))
    assert "flash_attention" not in kinds(graph)
    assert kinds(graph).count("gemm") == 2 and "softmax" in kinds(graph)


def test_attention_whose_keys_and_values_overflow_a_tile_stays_unfused(monkeypatch):
    # one head's K and V (T x 2D elements) at the limit: fused; one element over: GEMMs
    from ipu_stack.graph import onnx_patterns

    monkeypatch.setattr(onnx_patterns, "ATTENTION_MAX_KV_ELEMENTS", T * 2 * D)
    graph, _ = check_against_onnxruntime(_attention_model(mask="add"))
    assert "flash_attention" in kinds(graph)
    monkeypatch.setattr(onnx_patterns, "ATTENTION_MAX_KV_ELEMENTS", T * 2 * D - 1)
    graph, _ = check_against_onnxruntime(_attention_model(mask="add"))
    assert "flash_attention" not in kinds(graph)
    assert kinds(graph).count("gemm") == 2 and "softmax" in kinds(graph)


def test_where_mask_that_is_not_causal_falls_back_to_a_where():
    """Not fused (neither causal nor zero), the Where is emitted on its own (issue 11)."""
    model = _attention_model(mask="where")
    keep = next(t for t in model.graph.initializer if t.name == "keep")
    keep.CopyFrom(numpy_helper.from_array(np.eye(T, dtype=bool), "keep"))
    graph, _ = check_against_onnxruntime(model)
    assert "flash_attention" not in kinds(graph) and "where" in kinds(graph)


def test_causal_from_bias_classifies_masks():
    causal = np.where(np.triu(np.ones((4, 6), bool), k=3), -np.inf, 0.0)
    assert causal_from_bias(causal, 4, 6) is True
    assert causal_from_bias(np.zeros((1, 1, 4, 6)), 4, 6) is False
    assert causal_from_bias(np.stack([causal, causal]), 4, 6) is True
    assert causal_from_bias(np.stack([causal, np.zeros((4, 6))]), 4, 6) is None
    top_left = np.where(np.triu(np.ones((4, 6), bool), k=1), -np.inf, 0.0)
    assert causal_from_bias(top_left, 4, 6) is None
    assert causal_from_bias(np.full((4, 6), -5.0), 4, 6) is None


# -- the Attention operator (opset 23) ----------------------------------------------------------
def _attention_op(shape_q, shape_kv, opset=23, **attrs) -> onnx.ModelProto:
    return make_model(
        [node("Attention", ["q", "k", "v"], ["y"], **attrs)],
        {"q": shape_q, "k": shape_kv, "v": shape_kv},
        ["y"],
        opset=opset,
    )


@pytest.mark.parametrize(
    ("shape_q", "shape_kv", "attrs"),
    [
        ((2, 3, 8, 16), (2, 3, 8, 16), {}),
        ((2, 3, 8, 16), (2, 3, 8, 16), {"is_causal": 1, "scale": 0.3}),
        ((2, 8, 48), (2, 8, 48), {"q_num_heads": 3, "kv_num_heads": 3, "is_causal": 1}),
        ((1, 4, 8, 16), (1, 2, 8, 16), {}),  # grouped-query: 2 query heads per K/V head
        ((2, 6, 5, 8), (2, 2, 7, 8), {"scale": 0.2}),
        ((2, 7, 48), (2, 7, 16), {"q_num_heads": 6, "kv_num_heads": 2, "is_causal": 1}),
    ],
)
def test_attention_operator_matches_onnxruntime(shape_q, shape_kv, attrs):
    graph, _ = check_against_onnxruntime(_attention_op(shape_q, shape_kv, **attrs))
    assert kinds(graph).count("flash_attention") == 1


def test_attention_operator_refuses_uneven_groups_and_top_left_causal():
    with pytest.raises(GraphError, match=r"\(Attention\): Q \(1, 3, 8, 16\).*multiple"):
        import_onnx(_attention_op((1, 3, 8, 16), (1, 2, 8, 16)))
    with pytest.raises(GraphError, match=r"\(Attention\): 3 query heads are not a multiple"):
        import_onnx(_attention_op((1, 8, 24), (1, 8, 16), q_num_heads=3, kv_num_heads=2))
    with pytest.raises(GraphError, match=r"\(Attention\): the attention mask is neither"):
        import_onnx(_attention_op((1, 2, 4, 16), (1, 2, 8, 16), is_causal=1))


# -- refusals -----------------------------------------------------------------------------------
def _single(op: str, inputs: dict, consts: dict | None = None, opset: int = 20, **attrs):
    names = [*inputs, *(consts or {})]
    return make_model([node(op, names, ["y"], **attrs)], inputs, ["y"], consts, opset)


def _output_type(model: onnx.ModelProto, elem: int) -> onnx.ModelProto:
    model.graph.output[0].type.tensor_type.elem_type = elem  # a consistent declaration
    return model


REFUSALS = {
    "unknown_op": (lambda: _single("Elu", {"x": (4,)}), r"'elu_y' \(Elu\): op type 'Elu'"),
    "gelu_fast": (
        lambda: _single("Gelu", {"x": (4,)}, approximate="fast"),
        r"\(Gelu\): approximate='fast' is not supported",
    ),
    "div_by_zero": (
        lambda: _single("Div", {"x": (4,)}, {"z": np.zeros(4, np.float32)}),
        r"\(Div\): the constant divisor 'z' contains zeros",
    ),
    "reshape_runtime_shape": (
        lambda: make_model(
            [node("Shape", ["x"], ["s"]), node("Reshape", ["x", "s"], ["y"])],
            {"x": ("n", 4)},
            ["y"],
        ),
        r"'shape_s' \(Shape\): .*static shapes; not known: 'x'",
    ),
    "cast_to_int": (
        lambda: _output_type(_single("Cast", {"x": (4,)}, to=TensorProto.INT8), TensorProto.INT8),
        r"\(Cast\): cast to int8 is not supported",
    ),
    "empty_slice": (
        lambda: _single(
            "Slice",
            {"x": (8,)},
            {"starts": np.array([5], np.int64), "ends": np.array([2], np.int64)},
        ),
        r"\(Slice\): .*is empty",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_unsupported_model_is_refused_naming_node_and_op_type(name):
    build_model, pattern = REFUSALS[name]
    with pytest.raises(GraphError, match=pattern):
        import_onnx(build_model())


def test_layer_norm_statistics_outputs_are_refused():
    model = make_model(
        [node("LayerNormalization", ["x", "s"], ["y", "mean"])],
        {"x": (2, 8)},
        ["y", "mean"],
        {"s": f32((8,))},
    )
    with pytest.raises(GraphError, match=r"\(LayerNormalization\): output\(s\) 'mean'"):
        import_onnx(model)


def test_double_input_is_refused_with_its_dtype():
    model = make_model(
        [node("Add", ["x", "x"], ["y"])], {"x": (4,)}, ["y"], elem=TensorProto.DOUBLE
    )
    with pytest.raises(
        GraphError, match=r"graph input 'x' is double; ipu-stack computes in float16"
    ):
        import_onnx(model)


def test_undefined_input_is_refused_naming_the_node():
    model = make_model([node("Add", ["x", "ghost"], ["y"])], {"x": (4,)}, ["y"])
    with pytest.raises(GraphError, match=r"add_y|ghost"):
        import_onnx(model)


def test_undefined_graph_output_is_refused():
    model = make_model([node("Add", ["x", "x"], ["y"])], {"x": (4,)}, ["nowhere"])
    with pytest.raises(GraphError, match=r"(?i)graph output 'nowhere' is not"):
        import_onnx(model)


def test_unreadable_files_are_graph_errors(tmp_path):
    with pytest.raises(GraphError, match="not found"):
        import_onnx(tmp_path / "missing.onnx")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\xff\x00 definitely not a protobuf")
    with pytest.raises(GraphError, match="cannot read ONNX model"):
        import_onnx(garbage)


def test_feeds_check_inputs():
    _, bindings = import_onnx(OPERATOR_MODELS["softmax_last"]())
    with pytest.raises(GraphError, match="no data for ONNX graph input 'x'"):
        bindings.feeds({})
    with pytest.raises(GraphError, match="expected shape"):
        bindings.feeds({"x": np.zeros((2, 2))})
    assert bindings.feeds({"x": np.zeros((3, 7))})["x"].dtype == np.float32


def test_folding_a_constant_log_of_zero_warns_nothing():
    """T5's position buckets take log(0) in a constant subgraph: folded quietly, as onnxruntime
    computes it (-inf, then clipped), with no NumPy warning on the user's terminal."""
    import warnings

    nodes = [
        node("Log", ["zero_one"], ["logs"]),  # [-inf, 0]
        node("Max", ["logs", "floor"], ["clipped"]),  # [-5, 0]
        node("Add", ["x", "clipped"], ["y"]),
    ]
    model = make_model(
        nodes, {"x": (2,)}, ["y"],
        {"zero_one": np.array([0.0, 1.0], np.float32), "floor": np.array([-5.0], np.float32)},
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph, bindings = import_onnx(model)
    x = np.array([1.0, 2.0], np.float32)
    got = evaluate_reference(graph, bindings.feeds({"x": x}))[graph.value(graph.outputs[0]).name]
    np.testing.assert_allclose(np.asarray(got, np.float64).ravel(), [-4.0, 2.0])


def test_a_pad_of_zeros_is_an_identity_and_real_pads_match_onnxruntime():
    zeros = make_model(
        [node("Pad", ["x", "pads"], ["p"]), node("Add", ["p", "x"], ["y"])],
        {"x": (2, 3)}, ["y"], {"pads": np.zeros(4, np.int64)},
    )  # fmt: skip
    graph, bindings = import_onnx(zeros)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = evaluate_reference(graph, bindings.feeds({"x": x}))[graph.value(graph.outputs[0]).name]
    np.testing.assert_array_equal(np.asarray(got).reshape(2, 3), 2 * x)
    padded = make_model(
        [node("Pad", ["x", "pads"], ["y"])], {"x": (2, 3)}, ["y"],
        {"pads": np.array([0, 0, 0, 1], np.int64)},
    )  # fmt: skip
    check_against_onnxruntime(padded, rtol=0)


@pytest.mark.parametrize(
    ("starts", "ends", "axes", "steps"),
    [
        ([0], [6], [1], [2]),  # every second row (Swin's patch merging)
        ([1, 0], [6, 4], [1, 2], [2, 3]),  # two axes, odd start
        ([-1], [-7], [1], [-1]),  # reversed
        ([5, 3], [0, 0], [1, 2], [-2, -2]),  # reversed with strides, ends excluded
    ],
)
def test_strided_slices_match_numpy(starts, ends, axes, steps):
    x = np.arange(2 * 6 * 4, dtype=np.float32).reshape(2, 6, 4)
    model = make_model(
        [node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])],
        {"x": x.shape}, ["y"],
        {name: np.array(v, np.int64) for name, v in
         [("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps)]},
    )  # fmt: skip
    graph, bindings = import_onnx(model)
    got = evaluate_reference(graph, bindings.feeds({"x": x}))
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    out = np.asarray(got[graph.value(graph.outputs[0]).name])
    np.testing.assert_array_equal(out.reshape(want.shape), want)

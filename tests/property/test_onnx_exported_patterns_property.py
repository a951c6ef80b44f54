"""Property: the exporter patterns (tanh GeLU, NaN-guarded attention with any spelling of
K^T and scale) fuse whatever the operand order and association, and the fused graph matches
onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from ipu_stack.graph import evaluate_reference
from ipu_stack.graph.onnx_import import import_onnx

ort = pytest.importorskip("onnxruntime")


class Builder:
    """Nodes with fresh names; binary ops in a drawn operand order."""

    def __init__(self, draw) -> None:
        self.draw, self.nodes, self.consts, self.n = draw, [], {}, 0

    def fresh(self) -> str:
        self.n += 1
        return f"t{self.n}"

    def const(self, value) -> str:
        name = f"c{len(self.consts)}"
        self.consts[name] = np.asarray(value, np.float32)
        return name

    def op(self, op: str, *inputs: str, commute: bool = True, **attrs) -> str:
        out = self.fresh()
        ins = list(inputs)
        if commute and len(ins) == 2 and self.draw(st.booleans()):
            ins.reverse()
        self.nodes.append(helper.make_node(op, ins, [out], name=f"n{self.n}", **attrs))
        return out

    def model(self, inputs: dict[str, tuple[int, ...]], output: str) -> onnx.ModelProto:
        self.nodes.append(helper.make_node("Identity", [output], ["y"], name="out"))
        graph = helper.make_graph(
            self.nodes,
            "p",
            [
                helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s))
                for n, s in inputs.items()
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(v, k) for k, v in self.consts.items()],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        model.ir_version = 9
        return model


def _cube(b: Builder, x: str) -> str:
    form = b.draw(st.sampled_from(["pow3", "xxx", "x_pow2", "x2_x"]))
    if form == "pow3":
        return b.op("Pow", x, b.const(3.0), commute=False)
    if form == "x_pow2":
        return b.op("Mul", x, b.op("Pow", x, b.const(2.0), commute=False))
    square = b.op("Mul", x, x)
    return b.op("Mul", square, x)


def _gelu_tanh(b: Builder, x: str, cubic: float) -> str:
    inner = b.op("Add", x, b.op("Mul", b.const(cubic), _cube(b, x)))
    scaled = b.op("Mul", inner, b.const(np.sqrt(2 / np.pi)))
    one_plus = b.op("Add", b.op("Tanh", scaled, commute=False), b.const(1.0))
    where = b.draw(st.sampled_from(["half_x", "half_last", "half_tanh"]))
    if where == "half_x":
        return b.op("Mul", b.op("Mul", x, b.const(0.5)), one_plus)
    if where == "half_tanh":
        return b.op("Mul", x, b.op("Mul", b.const(0.5), one_plus))
    return b.op("Mul", b.op("Mul", x, one_plus), b.const(0.5))


def _compare(model: onnx.ModelProto, inputs: dict[str, np.ndarray]):
    graph, bindings = import_onnx(model)
    ours = bindings.onnx_outputs(evaluate_reference(graph, bindings.feeds(inputs)))["y"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(["y"], inputs)[0].astype(np.float64)
    assert np.abs(ours - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    return [op.kind for op in graph.operations]


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_tanh_gelu_fuses_in_any_form(data):
    b = Builder(data.draw)
    y = _gelu_tanh(b, "x", 0.044715)
    x = np.random.default_rng(0).uniform(-3, 3, (3, 7)).astype(np.float32)
    assert [k for k in _compare(b.model({"x": (3, 7)}, y), {"x": x}) if k != "view"] == ["gelu"]


@settings(max_examples=5, deadline=None)
@given(st.data())
def test_a_wrong_cubic_coefficient_is_not_fused(data):
    b = Builder(data.draw)
    y = _gelu_tanh(b, "x", 0.05)
    x = np.random.default_rng(0).uniform(-3, 3, (3, 7)).astype(np.float32)
    assert "gelu" not in _compare(b.model({"x": (3, 7)}, y), {"x": x})


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_guarded_attention_fuses_in_any_form(data):
    b = Builder(data.draw)
    heads, t, d = 2, 5, 4
    scale = 1 / np.sqrt(d)
    k_form = data.draw(st.sampled_from(["transpose", "reshapes", "merged"]))
    if k_form == "transpose":
        kt = b.op("Transpose", "k", commute=False, perm=[0, 1, 3, 2])
    elif k_form == "merged":  # K's leading axes already merged: swap, restore
        merged = b.op("Reshape", "k", b.const_int((heads, t, d)), commute=False)
        merged = b.op("Add", merged, b.const(np.float32(0.25)))  # computed, not a Reshape
        swapped = b.op("Transpose", merged, commute=False, perm=[0, 2, 1])
        kt = b.op("Reshape", swapped, b.const_int((1, heads, d, t)), commute=False)
    else:  # dynamo: merge the leading axes, swap, restore
        merged = b.op("Reshape", "k", b.const_int((heads, t, d)), commute=False)
        swapped = b.op("Transpose", merged, commute=False, perm=[0, 2, 1])
        kt = b.op("Reshape", swapped, b.const_int((1, heads, d, t)), commute=False)
    split = data.draw(st.sampled_from(["scores", "both", "q"]))
    q = "q"
    if split == "both":  # sqrt(scale) on q and on k^T
        q = b.op("Mul", q, b.const(np.sqrt(scale)))
        kt = b.op("Mul", kt, b.const(np.sqrt(scale)))
    elif split == "q":
        q = b.op("Mul", q, b.const(scale))
    scores = b.op("MatMul", q, kt, commute=False)
    if split == "scores":
        scores = b.op("Div", scores, b.const(1 / scale), commute=False)
    probs = b.op("Softmax", scores, commute=False, axis=-1)
    if data.draw(st.booleans()):
        isnan = b.op("IsNaN", probs, commute=False)
        probs = b.op("Where", isnan, b.const(0.0), probs, commute=False)
    y = b.op("MatMul", probs, "v", commute=False)
    rng = np.random.default_rng(1)
    shape = (1, heads, t, d)
    feeds = {n: rng.uniform(-1, 1, shape).astype(np.float32) for n in "qkv"}
    kinds = _compare(b.model({n: shape for n in "qkv"}, y), feeds)
    assert kinds.count("flash_attention") == 1 and "softmax" not in kinds


def _const_int(self: Builder, value) -> str:
    name = f"i{len(self.consts)}"
    self.consts[name] = np.asarray(value, np.int64)
    return name


Builder.const_int = _const_int  # type: ignore[attr-defined]

"""Generate the ONNX example models with ``onnx.helper`` (fixed seeds, no downloads).

    python examples/make_examples.py                 # every example into examples/
    python examples/make_examples.py --out /tmp/m siglip_mlp encoder_block_causal_f32

Each model is written the way exporters write it: ``Gemm``/``MatMul`` + bias ``Add``, GeLU as
the opset-20 ``Gelu`` op (MLP) or as PyTorch's erf expression (the others), LayerNormalization,
and attention with a ``Reshape``/``Transpose`` head split whose shape is partly computed with
``Shape``/``Gather``/``Concat``. Names without a suffix are F16; ``_f32`` variants are F32.
Only the small models are committed (see ``.gitignore``); the rest are generated on demand.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 20
ELEM = {"f16": TensorProto.FLOAT16, "f32": TensorProto.FLOAT}
NUMPY = {"f16": np.float16, "f32": np.float32}


class _Builder:
    """Accumulates nodes and initializers with unique names."""

    def __init__(self, dtype: str, seed: int) -> None:
        self.dtype = dtype
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}_{self.count}"

    def const(self, base: str, array: np.ndarray) -> str:
        name = self.name(base)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, base: str, shape: tuple[int, ...], fan_in: int) -> str:
        data = self.rng.normal(0.0, 1.0 / np.sqrt(fan_in), shape).astype(NUMPY[self.dtype])
        return self.const(base, data)

    def scalar(self, base: str, value: float) -> str:
        return self.const(base, np.array(value, dtype=NUMPY[self.dtype]))

    def node(self, op: str, inputs: list[str], **attrs: object) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{op}_{self.count}", **attrs))
        return out

    def linear(self, x: str, fan_in: int, fan_out: int, base: str) -> str:
        w = self.weight(f"{base}.weight", (fan_in, fan_out), fan_in)
        b = self.const(f"{base}.bias", self.rng.normal(0, 0.02, fan_out).astype(NUMPY[self.dtype]))
        return self.node("Add", [self.node("MatMul", [x, w]), b])

    def gelu_erf(self, x: str) -> str:
        """PyTorch's export of exact GeLU: Mul(Mul(x, Add(Erf(Div(x, sqrt2)), 1)), 0.5)."""
        scaled = self.node("Div", [x, self.scalar("sqrt2", np.sqrt(2.0))])
        one_plus = self.node("Add", [self.node("Erf", [scaled]), self.scalar("one", 1.0)])
        return self.node("Mul", [self.node("Mul", [x, one_plus]), self.scalar("half", 0.5)])

    def layer_norm(self, x: str, channels: int, base: str) -> str:
        scale = self.const(
            f"{base}.weight", (1 + self.rng.normal(0, 0.1, channels)).astype(NUMPY[self.dtype])
        )
        bias = self.const(
            f"{base}.bias", self.rng.normal(0, 0.1, channels).astype(NUMPY[self.dtype])
        )
        return self.node("LayerNormalization", [x, scale, bias], axis=-1, epsilon=1e-6)

    def model(
        self, name: str, inputs: list[onnx.ValueInfoProto], outputs: dict[str, list[int]]
    ) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(o, ELEM[self.dtype], s) for o, s in outputs.items()]
        graph = helper.make_graph(self.nodes, name, inputs, outs, self.initializers)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ipu-stack"
        )
        model.ir_version = 9  # what onnxruntime >= 1.16 reads
        onnx.checker.check_model(model)
        return model


def mlp2(dtype: str = "f16", tokens: int = 64, d_in: int = 128, d_hidden: int = 256,
         d_out: int = 64) -> onnx.ModelProto:  # fmt: skip
    """Two-layer MLP as torch.nn.Linear exports it: Gemm(transB=1) -> Gelu -> Gemm(transB=1)."""
    b = _Builder(dtype, seed=1)
    w1 = b.weight("fc1.weight", (d_hidden, d_in), d_in)
    b1 = b.const("fc1.bias", b.rng.normal(0, 0.02, d_hidden).astype(NUMPY[dtype]))
    w2 = b.weight("fc2.weight", (d_out, d_hidden), d_hidden)
    b2 = b.const("fc2.bias", b.rng.normal(0, 0.02, d_out).astype(NUMPY[dtype]))
    h = b.node("Gemm", ["x", w1, b1], transB=1)
    h = b.node("Gelu", [h])
    y = b.node("Gemm", [h, w2, b2], transB=1)
    b.nodes.append(helper.make_node("Identity", [y], ["y"], name="output"))
    x = helper.make_tensor_value_info("x", ELEM[dtype], [tokens, d_in])
    return b.model("mlp2", [x], {"y": [tokens, d_out]})


def siglip_mlp(dtype: str = "f16", batch: int = 4, tokens: int = 729, hidden: int = 1152,
               intermediate: int = 4304) -> onnx.ModelProto:  # fmt: skip
    """The SigLIP vision MLP block: fc1 (1152 -> 4304), exact GeLU (erf form), fc2."""
    b = _Builder(dtype, seed=2)
    h = b.linear("x", hidden, intermediate, "fc1")
    h = b.gelu_erf(h)
    y = b.linear(h, intermediate, hidden, "fc2")
    b.nodes.append(helper.make_node("Identity", [y], ["y"], name="output"))
    x = helper.make_tensor_value_info("x", ELEM[dtype], [batch, tokens, hidden])
    return b.model("siglip_mlp", [x], {"y": [batch, tokens, hidden]})


def encoder_block(dtype: str = "f16", causal: bool = False, mask: str = "add", batch: int = 1,
                  tokens: int = 128, hidden: int = 768, heads: int = 12,
                  intermediate: int = 3072, layers: int = 1) -> onnx.ModelProto:  # fmt: skip
    """Pre-norm transformer encoder block: LN, 12-head attention, residual, LN, GeLU MLP, residual.

    Args:
        layers: how many blocks to stack (each with its own weights), as an exporter writes
            a multi-layer encoder: unrolled.
        causal: add a causal mask before the softmax.
        mask: ``"add"`` (Add of a constant with -inf above the diagonal) or ``"where"``
            (Where(constant lower-triangle, scores, lowest finite value)).
    """
    b = _Builder(dtype, seed=3 + causal)
    x = "x"
    for _ in range(layers):
        x = _encoder_layer(b, x, dtype, causal, mask, batch, tokens, hidden, heads, intermediate)
    b.nodes.append(helper.make_node("Identity", [x], ["y"], name="output"))
    x_info = helper.make_tensor_value_info("x", ELEM[dtype], [batch, tokens, hidden])
    name = "encoder_block_causal" if causal else "encoder_block"
    return b.model(name, [x_info], {"y": [batch, tokens, hidden]})


def _encoder_layer(b: _Builder, x: str, dtype: str, causal: bool, mask: str, batch: int,
                   tokens: int, hidden: int, heads: int, intermediate: int) -> str:  # fmt: skip
    head = hidden // heads
    normed = b.layer_norm(x, hidden, "ln1")
    q = b.linear(normed, hidden, hidden, "q_proj")
    k = b.linear(normed, hidden, hidden, "k_proj")
    v = b.linear(normed, hidden, hidden, "v_proj")
    # Q's head-split shape is computed as PyTorch exports it: Shape -> Gather -> Unsqueeze ->
    # Concat with the constant head dims; K and V use a constant shape with 0 and -1.
    shape = b.node("Shape", [normed])
    dims = []
    for axis in (0, 1):
        dim = b.node("Gather", [shape, b.const("axis", np.array(axis, np.int64))], axis=0)
        dims.append(b.node("Unsqueeze", [dim, b.const("axes", np.array([0], np.int64))]))
    q_shape = b.node("Concat", [*dims, b.const("heads", np.array([heads, head], np.int64))], axis=0)
    kv_shape = b.const("kv_shape", np.array([0, 0, heads, -1], np.int64))
    qh = b.node("Transpose", [b.node("Reshape", [q, q_shape])], perm=[0, 2, 1, 3])
    kt = b.node("Transpose", [b.node("Reshape", [k, kv_shape])], perm=[0, 2, 3, 1])
    vh = b.node("Transpose", [b.node("Reshape", [v, kv_shape])], perm=[0, 2, 1, 3])
    scores = b.node("MatMul", [qh, kt])
    scores = b.node("Div", [scores, b.scalar("sqrt_head", np.sqrt(head))])
    if causal:
        lower = np.tril(np.ones((tokens, tokens), dtype=bool))
        if mask == "add":
            bias = np.where(lower, 0.0, -np.inf).astype(NUMPY[dtype])
            scores = b.node("Add", [scores, b.const("causal_mask", bias[None, None])])
        else:
            lowest = b.scalar("lowest", float(np.finfo(NUMPY[dtype]).min))
            scores = b.node("Where", [b.const("causal", lower), scores, lowest])
    probs = b.node("Softmax", [scores], axis=-1)
    context = b.node("MatMul", [probs, vh])
    context = b.node("Transpose", [context], perm=[0, 2, 1, 3])
    merged = b.const("merged_shape", np.array([batch, tokens, hidden], np.int64))
    context = b.node("Reshape", [context, merged])
    attn = b.linear(context, hidden, hidden, "o_proj")
    x = b.node("Add", [x, attn])
    h = b.linear(b.layer_norm(x, hidden, "ln2"), hidden, intermediate, "fc1")
    h = b.linear(b.gelu_erf(h), intermediate, hidden, "fc2")
    return b.node("Add", [x, h])


#: Every example by file stem.
EXAMPLES: dict[str, Callable[[], onnx.ModelProto]] = {
    "mlp2": lambda: mlp2("f16"),
    "mlp2_f32": lambda: mlp2("f32"),
    "siglip_mlp": lambda: siglip_mlp("f16"),
    "siglip_mlp_f32": lambda: siglip_mlp("f32"),
    "encoder_block": lambda: encoder_block("f16"),
    "encoder_block_f32": lambda: encoder_block("f32"),
    "encoder_block_causal": lambda: encoder_block("f16", causal=True),
    "encoder_block_causal_f32": lambda: encoder_block("f32", causal=True),
}


def write(names: list[str], out: Path) -> list[Path]:
    """Write the named examples into ``out`` (skipping files that already exist)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        path = out / f"{name}.onnx"
        if not path.exists():
            tmp = path.with_suffix(".onnx.tmp")
            onnx.save(EXAMPLES[name](), tmp)
            tmp.replace(path)  # atomic, so a concurrent reader never sees half a model
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"default: all of {', '.join(EXAMPLES)}")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in EXAMPLES]
    if unknown:
        parser.error(f"unknown example(s) {unknown}; choose from {', '.join(EXAMPLES)}")
    for path in write(args.names or list(EXAMPLES), args.out):
        print(f"{path}  {path.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

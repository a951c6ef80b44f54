"""Export random-init torch/transformers models with the three exporters users have today.

Every model is built from a ``transformers`` config or a ``torch`` module written here (random
init, fixed seed, nothing downloaded) and exported with

    legacy17   torch.onnx.export(dynamo=False, opset_version=17)
    dynamo18   torch.onnx.export(dynamo=True, opset_version=18)
    dynamo23   torch.onnx.export(dynamo=True, opset_version=23)

into ``MODEL__EXPORTER.onnx`` plus ``MODEL__EXPORTER.npz``: the inputs (``input:NAME``) and
onnxruntime's outputs (``output:NAME``) by ONNX name. ``--size tiny`` (the committed test
fixtures, a few kB each) uses hidden sizes of 32-48 and one or two layers; ``--size full``
builds the larger variants (SigLIP at 224 px with 2 layers, BERT/GPT-2 with 128 tokens ...);
``--size variant`` other configs of the same families, for generality checks (BERT with 3
heads of 16, 3 layers, batch 2 x 7 tokens and two padded rows; GPT-2 with 3 heads, 5 tokens;
CLIP-text with batch 3 and the pooled token elsewhere in each row; ViT at 40 px / patch 10).

Needs the ``export`` extra (torch, transformers, onnxscript):

    pip install -e .[export]
    python examples/export_models.py --out tests/data/exports            # tiny, every model
    python examples/export_models.py --size full --out /tmp/exports siglip_vision
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

EXPORTERS = {"legacy17": (False, 17), "dynamo18": (True, 18), "dynamo23": (True, 23)}
SEED = 20261201
PERTURBATION = 0.05  # added noise (x N(0, 1)) so no weight is trivially 0 or 1


@dataclass(frozen=True)
class Sample:
    """A module to export, its example inputs (by ONNX name) and output names."""

    module: object
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...]


def _torch():  # type: ignore[no-untyped-def]
    import torch

    return torch


def _first(*names: str) -> Callable[[object], object]:
    """Wrap a transformers model so it returns plain tensors (export-friendly)."""
    torch = _torch()

    class Wrapped(torch.nn.Module):
        def __init__(self, inner: object) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: object) -> object:
            out = self.inner(*args)
            values = tuple(getattr(out, n) for n in names)
            return values if len(values) > 1 else values[0]

    return Wrapped


def _floats(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _siglip_config(size: str, head: bool):  # type: ignore[no-untyped-def]
    from transformers import SiglipVisionConfig

    if size == "base":  # transformers' default: siglip-base-patch16-224's widths, 2 layers
        return SiglipVisionConfig(num_hidden_layers=2, vision_use_head=head)
    if size == "full":
        return SiglipVisionConfig(
            hidden_size=1152, intermediate_size=4304, num_hidden_layers=2,
            num_attention_heads=16, image_size=224, patch_size=16, vision_use_head=head,
        )  # fmt: skip
    return SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=64, patch_size=16, vision_use_head=head,
    )  # fmt: skip


def siglip_vision(size: str, rng: np.random.Generator, head: bool = True) -> Sample:
    from transformers import SiglipVisionModel

    cfg = _siglip_config(size, head)
    names = ("last_hidden_state", "pooler_output") if head else ("last_hidden_state",)
    model = _first(*names)(SiglipVisionModel(cfg))
    px = _floats(rng, 1, 3, cfg.image_size, cfg.image_size)
    return Sample(model, {"pixel_values": px}, names)


def siglip_vision_nohead(size: str, rng: np.random.Generator) -> Sample:
    return siglip_vision(size, rng, head=False)


def siglip_encoder_layer(size: str, rng: np.random.Generator) -> Sample:
    from transformers.models.siglip.modeling_siglip import SiglipEncoderLayer

    cfg = _siglip_config(size, False)
    torch = _torch()
    tokens = (cfg.image_size // cfg.patch_size) ** 2

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = SiglipEncoderLayer(cfg)

        def forward(self, x: object) -> object:
            out = self.layer(x, None)
            return out[0] if isinstance(out, tuple) else out

    return Sample(Layer(), {"hidden_states": _floats(rng, 1, tokens, cfg.hidden_size)}, ("y",))


def siglip_mlp(size: str, rng: np.random.Generator) -> Sample:
    from transformers.models.siglip.modeling_siglip import SiglipMLP

    cfg = _siglip_config(size, False)
    tokens = (cfg.image_size // cfg.patch_size) ** 2
    return Sample(SiglipMLP(cfg), {"hidden_states": _floats(rng, 1, tokens, cfg.hidden_size)},
                  ("y",))  # fmt: skip


def vit(size: str, rng: np.random.Generator) -> Sample:
    from transformers import ViTConfig, ViTModel

    full = size == "full"
    cfg = ViTConfig(
        hidden_size=192 if full else 32, intermediate_size=768 if full else 64,
        num_hidden_layers=2, num_attention_heads=3 if full else 2,
        image_size=224 if full else 32, patch_size=16 if full else 8,
    )  # fmt: skip
    if size == "variant":  # 40 px in 10 px patches (17 tokens), 3 heads, 3 layers
        cfg = ViTConfig(hidden_size=36, intermediate_size=60, num_hidden_layers=3,
                        num_attention_heads=3, image_size=40, patch_size=10)  # fmt: skip
    model = _first("last_hidden_state", "pooler_output")(ViTModel(cfg, add_pooling_layer=True))
    px = _floats(rng, 1, 3, cfg.image_size, cfg.image_size)
    return Sample(model, {"pixel_values": px}, ("last_hidden_state", "pooler_output"))


def _bert(size: str):  # type: ignore[no-untyped-def]
    from transformers import BertConfig, BertModel

    full = size == "full"
    if size == "variant":  # 3 heads of 16, 3 layers
        cfg = BertConfig(vocab_size=50, hidden_size=48, intermediate_size=80,
                         num_hidden_layers=3, num_attention_heads=3,
                         max_position_embeddings=24, attn_implementation="sdpa")  # fmt: skip
        return cfg, BertModel(cfg, add_pooling_layer=False)
    cfg = BertConfig(
        vocab_size=1000 if full else 64, hidden_size=256 if full else 32,
        intermediate_size=1024 if full else 64, num_hidden_layers=2,
        num_attention_heads=4 if full else 2, max_position_embeddings=512 if full else 32,
        attn_implementation="sdpa",
    )  # fmt: skip
    return cfg, BertModel(cfg, add_pooling_layer=False)


def _mask(rng: np.random.Generator, seq: int, batch: int = 1) -> np.ndarray:
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[0, seq - max(1, seq // 4) :] = 0  # padding at the end
    for b in range(1, batch):  # other rows: padding of another length (row 1 unpadded)
        mask[b, seq - (b - 1) * 2 :] = 0
    return mask


def _bert_shape(size: str) -> tuple[int, int]:
    """(batch, sequence) of the BERT samples."""
    return {"full": (1, 128), "variant": (2, 7)}.get(size, (1, 8))


def _bert_sample(size: str, rng: np.random.Generator, embeds: bool) -> Sample:
    """BERT fed token ids or embeddings (``inputs_embeds``), with a run-time padding mask."""
    cfg, model = _bert(size)
    batch, seq = _bert_shape(size)
    torch = _torch()
    key = "inputs_embeds" if embeds else "input_ids"

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, first: object, attention_mask: object) -> object:
            out = self.inner(**{key: first}, attention_mask=attention_mask)
            return out.last_hidden_state

    if embeds:
        first = _floats(rng, batch, seq, cfg.hidden_size)
    else:
        first = rng.integers(0, cfg.vocab_size, (batch, seq), dtype=np.int64)
    return Sample(Wrapped(), {key: first, "attention_mask": _mask(rng, seq, batch)},
                  ("last_hidden_state",))  # fmt: skip


def bert_ids(size: str, rng: np.random.Generator) -> Sample:
    return _bert_sample(size, rng, embeds=False)


def bert_embeds(size: str, rng: np.random.Generator) -> Sample:
    return _bert_sample(size, rng, embeds=True)


def _gpt2(size: str):  # type: ignore[no-untyped-def]
    from transformers import GPT2Config, GPT2Model

    full = size == "full"
    if size == "variant":  # 3 heads of 8, 2 layers
        cfg = GPT2Config(vocab_size=40, n_embd=24, n_layer=2, n_head=3, n_positions=16,
                         attn_implementation="sdpa")  # fmt: skip
        return cfg, GPT2Model(cfg)
    cfg = GPT2Config(
        vocab_size=1000 if full else 64, n_embd=256 if full else 32, n_layer=2,
        n_head=4 if full else 2, n_positions=256 if full else 32, attn_implementation="sdpa",
    )  # fmt: skip
    return cfg, GPT2Model(cfg)


def _gpt2_seq(size: str) -> int:
    return {"full": 128, "variant": 5}.get(size, 8)


def gpt2_ids(size: str, rng: np.random.Generator) -> Sample:
    cfg, model = _gpt2(size)
    seq = _gpt2_seq(size)
    ids = rng.integers(0, cfg.vocab_size, (1, seq), dtype=np.int64)
    return Sample(_first("last_hidden_state")(model), {"input_ids": ids}, ("last_hidden_state",))


def gpt2_embeds(size: str, rng: np.random.Generator) -> Sample:
    cfg, model = _gpt2(size)
    seq = _gpt2_seq(size)
    torch = _torch()

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, inputs_embeds: object) -> object:
            return self.inner(inputs_embeds=inputs_embeds).last_hidden_state

    x = _floats(rng, 1, seq, cfg.n_embd)
    return Sample(Wrapped(), {"inputs_embeds": x}, ("last_hidden_state",))


def clip_text(size: str, rng: np.random.Generator) -> Sample:
    from transformers import CLIPTextConfig, CLIPTextModel

    full = size == "full"
    cfg = CLIPTextConfig(
        vocab_size=1000 if full else 64, hidden_size=256 if full else 32,
        intermediate_size=1024 if full else 64, num_hidden_layers=2,
        num_attention_heads=4 if full else 2, max_position_embeddings=77 if full else 16,
        eos_token_id=2, attn_implementation="sdpa",
    )  # fmt: skip
    seq = 77 if full else 8
    ids = rng.integers(3, cfg.vocab_size, (1, seq), dtype=np.int64)
    ids[0, seq - 2] = cfg.eos_token_id
    if size == "variant":  # batch 3, 6 tokens, the pooled token at another place per row
        seq = 6
        ids = rng.integers(3, cfg.vocab_size - 1, (3, seq), dtype=np.int64)
        for b in range(3):  # eos_token_id == 2 is the legacy rule: pool at argmax(ids)
            ids[b, seq - 2 - b] = cfg.eos_token_id
            ids[b, (seq - 1 - 2 * b) % seq] = cfg.vocab_size - 1
    model = _first("last_hidden_state", "pooler_output")(CLIPTextModel(cfg))
    return Sample(model, {"input_ids": ids}, ("last_hidden_state", "pooler_output"))


def mha(size: str, rng: np.random.Generator) -> Sample:
    torch = _torch()
    dim, heads, seq = (256, 4, 64) if size == "full" else (32, 2, 8)

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True)

        def forward(self, x: object) -> object:
            return self.attn(x, x, x, need_weights=False)[0]

    return Sample(Attention(), {"x": _floats(rng, 1, seq, dim)}, ("y",))


def mlp_tanh(size: str, rng: np.random.Generator) -> Sample:
    torch = _torch()
    dim, hidden, rows = (768, 3072, 128) if size == "full" else (32, 64, 8)
    module = torch.nn.Sequential(
        torch.nn.Linear(dim, hidden),
        torch.nn.GELU(approximate="tanh"),
        torch.nn.Linear(hidden, dim),
    )
    return Sample(module, {"x": _floats(rng, rows, dim)}, ("y",))


def llama_block(size: str, rng: np.random.Generator, grouped: bool = False) -> Sample:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    full = size == "full"
    heads = 4 if full or grouped else 2
    cfg = LlamaConfig(
        hidden_size=256 if full else 32 * heads // 2, intermediate_size=688 if full else 64,
        num_attention_heads=heads, num_key_value_heads=heads // 2 if grouped else heads,
        num_hidden_layers=1, attn_implementation="sdpa",
    )  # fmt: skip
    seq = 64 if full else 8 + 3 * grouped
    torch = _torch()

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = LlamaDecoderLayer(cfg, 0)
            self.rotary = LlamaRotaryEmbedding(cfg)

        def forward(self, x: object) -> object:
            positions = torch.arange(x.shape[1]).unsqueeze(0)  # type: ignore[attr-defined]
            emb = self.rotary(x, positions)
            out = self.layer(x, position_embeddings=emb, position_ids=positions)
            return out[0] if isinstance(out, tuple) else out

    return Sample(Block(), {"hidden_states": _floats(rng, 1, seq, cfg.hidden_size)}, ("y",))


def llama_gqa(size: str, rng: np.random.Generator) -> Sample:
    """The Llama block with grouped-query attention (half as many K/V heads as query heads)."""
    return llama_block(size, rng, grouped=True)


#: exports the exporter itself cannot write (reported and skipped, not a failure)
UNEXPORTABLE = {
    ("llama_gqa", "legacy17"): "the legacy exporter cannot convert scaled_dot_product_attention "
    "with enable_gqa (torch 2.13)",
}

MODELS: dict[str, Callable[[str, np.random.Generator], Sample]] = {
    "siglip_vision": siglip_vision,
    "siglip_vision_nohead": siglip_vision_nohead,
    "siglip_encoder_layer": siglip_encoder_layer,
    "siglip_mlp": siglip_mlp,
    "vit": vit,
    "bert_ids": bert_ids,
    "bert_embeds": bert_embeds,
    "gpt2_ids": gpt2_ids,
    "gpt2_embeds": gpt2_embeds,
    "clip_text": clip_text,
    "mha": mha,
    "mlp_tanh": mlp_tanh,
    "llama_block": llama_block,
    "llama_gqa": llama_gqa,
}


def strip_metadata(path: Path) -> None:
    """Drop the exporters' per-node doc strings and metadata (source locations, stack
    traces: half of a dynamo file); the graph itself is untouched."""
    import onnx

    model = onnx.load(str(path))
    for node in model.graph.node:
        node.doc_string = ""
        del node.metadata_props[:]
    model.doc_string = ""
    onnx.save(model, str(path))


def export(name: str, exporter: str, size: str, out: Path) -> Path:
    """Build model ``name`` and export it with ``exporter``; returns the ``.onnx`` path."""
    import onnxruntime as ort
    import torch

    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    sample = MODELS[name](size, rng)
    module = sample.module
    module.eval()  # type: ignore[attr-defined]
    with torch.no_grad():  # random init zeroes biases and norm shifts: perturb every parameter
        for param in module.parameters():  # type: ignore[attr-defined]
            param.add_(torch.randn_like(param) * PERTURBATION)
    dynamo, opset = EXPORTERS[exporter]
    args = tuple(torch.from_numpy(a) for a in sample.inputs.values())
    path = out / f"{name}__{exporter}.onnx"
    with warnings.catch_warnings():  # grad mode on: MultiheadAttention skips its fast path
        warnings.simplefilter("ignore")
        kwargs: dict[str, object] = {}
        if dynamo:
            kwargs["external_data"] = False
            kwargs["optimize"] = True
        torch.onnx.export(
            module, args, str(path), dynamo=dynamo, opset_version=opset,
            input_names=list(sample.inputs), output_names=list(sample.outputs), **kwargs,
        )  # fmt: skip
    strip_metadata(path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: sample.inputs[i.name] for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    results = session.run(names, feeds)
    arrays = {f"input:{k}": v for k, v in sample.inputs.items()}
    arrays.update({f"output:{k}": np.asarray(v) for k, v in zip(names, results, strict=True)})
    np.savez(path.with_suffix(".npz"), **arrays)  # type: ignore[arg-type]
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help=f"default: all of {', '.join(MODELS)}")
    parser.add_argument("--out", default="tests/data/exports", help="output directory")
    parser.add_argument("--size", choices=("tiny", "full", "variant", "base"), default="tiny",
                        help="variant: other sizes and configs of BERT, GPT-2, CLIP-text and "
                        "ViT (generality checks; the other models as tiny); base: the SigLIP "
                        "models at transformers' default config (768/3072, 12 heads, 224 px / "
                        "patch 16) with 2 layers, the others as tiny")  # fmt: skip
    parser.add_argument("--exporters", default=",".join(EXPORTERS),
                        help="comma-separated subset of " + ", ".join(EXPORTERS))  # fmt: skip
    args = parser.parse_args(argv)
    unknown = [m for m in args.models if m not in MODELS]
    exporters = args.exporters.split(",")
    bad = [e for e in exporters if e not in EXPORTERS]
    if unknown or bad:
        print(f"unknown model(s) {unknown} or exporter(s) {bad}", file=sys.stderr)
        return 2
    out = Path(args.out)
    os.makedirs(out, exist_ok=True)
    failures = 0
    for name in args.models or list(MODELS):
        for exporter in exporters:
            if (name, exporter) in UNEXPORTABLE:
                print(f"{name}__{exporter}: skipped: {UNEXPORTABLE[name, exporter]}")
                continue
            try:
                path = export(name, exporter, args.size, out)
                print(f"{path}  {path.stat().st_size} bytes")
            except Exception as err:  # an exporter's failure is reported, others go on
                failures += 1
                print(f"{name}__{exporter}: export failed: {type(err).__name__}: {err}"[:400],
                      file=sys.stderr)  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

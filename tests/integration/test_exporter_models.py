"""The committed exports of examples/export_models.py (torch legacy 17, dynamo 18, dynamo 23):
every one imports (or is refused only for a known, listed gap), and a few small ones compile,
simulate and match the onnxruntime outputs stored next to them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ipu_stack.errors import GraphError
from ipu_stack.graph.onnx_import import import_onnx
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.sim import SimDevice

EXPORTS = Path(__file__).resolve().parents[1] / "data" / "exports"
FILES = sorted(EXPORTS.glob("*__*.onnx"))
#: exports the importer does not take yet, and the one reason each may be refused for
#: (empty: BERT's padding-mask chain and CLIP-text's end-of-text pooling import since issue 11)
KNOWN_GAPS: dict[str, tuple[str, ...]] = {}
#: models whose attention must fuse into flash_attention from every exporter
FUSED = ("siglip_encoder_layer", "mha", "gpt2_embeds", "gpt2_ids", "bert_embeds", "bert_ids",
         "clip_text", "vit", "llama_block")  # fmt: skip


def _all_kinds(graph):
    """Operation kinds of ``graph`` and of every loop body in it."""
    for op in graph.operations:
        yield op.kind
        if op.kind == "repeat":
            yield from _all_kinds(op.attr("body"))


def _npz(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    data = np.load(path.with_suffix(".npz"))
    inputs = {k[6:]: data[k] for k in data.files if k.startswith("input:")}
    outputs = {k[7:]: data[k] for k in data.files if k.startswith("output:")}
    return inputs, outputs


def test_the_fixtures_are_there_and_small():
    models = {p.name.split("__")[0] for p in FILES}
    assert len(FILES) >= 36 and len(models) >= 12
    assert {p.name.split("__")[1][:-5] for p in FILES} == {"legacy17", "dynamo18", "dynamo23"}
    total = sum(p.stat().st_size for p in EXPORTS.iterdir())
    assert total < 8_000_000, f"committed exports take {total} bytes"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_export_imports(path):
    try:
        graph, bindings = import_onnx(path)
    except GraphError as err:
        model = path.stem.split("__")[0]
        lines = str(err).split("\n")
        body = lines[1:] if len(lines) > 1 else lines
        known = KNOWN_GAPS.get(model, ())
        other = [line for line in body if not any(marker in line for marker in known)]
        assert not other, f"refused for an unlisted reason: {other}"
        return
    assert path.stem.split("__")[0] not in KNOWN_GAPS, "imports now: remove it from KNOWN_GAPS"
    inputs, outputs = _npz(path)
    assert set(bindings.inputs) <= set(inputs)
    assert set(bindings.outputs) == set(outputs)
    if path.stem.split("__")[0] in FUSED:
        assert "flash_attention" in set(_all_kinds(graph)), "attention fuses"


@pytest.mark.parametrize("model", ["bert_ids", "bert_embeds"])
def test_bert_builds_its_padding_mask_once_from_every_exporter(model):
    """The additive mask is made once before the layers (dynamo 18 computes it mid-layer 0,
    legacy 17 once per layer, dynamo 23 inside every Attention): the same graph each time, with
    the layers rolled into one loop that reads the mask as an invariant (same cycles)."""
    shapes = set()
    for exporter in ("legacy17", "dynamo18", "dynamo23"):
        graph, _ = import_onnx(EXPORTS / f"{model}__{exporter}.onnx")
        kinds = list(_all_kinds(graph))
        assert kinds.count("flash_attention") == 1, exporter
        loops = [op for op in graph.operations if op.kind == "repeat" and op.attr("invariants")]
        assert len(loops) == 1 and loops[0].attr("count") == 2, exporter
        additive = [op for op in graph.operations
                    if op.kind == "where" and graph.value(op.output).dtype == "f32"]  # fmt: skip
        assert len(additive) == 1, "the additive mask is made once, before the loop"
        assert "where" not in list(_all_kinds(loops[0].attr("body"))), exporter
        shapes.add(tuple(sorted(k for k in kinds if k != "view")))  # views are relabellings
    assert len(shapes) == 1


SIMULATED = [
    ("mlp_tanh__legacy17", 8),
    ("siglip_mlp__dynamo18", 8),
    ("siglip_encoder_layer__dynamo23", 16),
    ("bert_ids__legacy17", 16),  # int64 ids and a run-time padding mask
    ("clip_text__dynamo18", 16),  # end-of-text pooling: a GatherND at run-time indices
]


RUNS: dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = {}


def _run(stem: str, tiles: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(our outputs, onnxruntime's) by ONNX name; quick build settings, cached per module."""
    if stem not in RUNS:
        path = EXPORTS / f"{stem}.onnx"
        graph, bindings = import_onnx(path)
        inputs, expected = _npz(path)
        config = BuildConfig(tiles=tiles, exchange_time_budget=0.05, finalists=1,
                             compile_kernels=False)  # fmt: skip
        built = build(graph, config)
        feeds = bindings.feeds(inputs)
        run = SimDevice().run(built.program, built.placement, built.schedules, feeds)
        RUNS[stem] = bindings.onnx_outputs(run.outputs), expected
    return RUNS[stem]


@pytest.mark.parametrize(("stem", "tiles"), SIMULATED)
def test_small_exports_compile_and_match_onnxruntime(stem, tiles):
    ours, expected = _run(stem, tiles)
    for name, want in expected.items():
        want64 = want.astype(np.float64)
        got = np.asarray(ours[name], np.float64).reshape(want.shape)
        assert np.abs(got - want64).max() <= 2e-3 * np.abs(want64).max(), name


def test_a_wrong_stored_reference_is_caught():
    """The comparison above fails on a perturbed reference (it is not vacuous)."""
    ours, expected = _run("mlp_tanh__legacy17", 8)
    got = ours["y"].astype(np.float64)
    want = expected["y"].astype(np.float64)
    want[0, 0] += 0.01 * np.abs(want).max()
    assert np.abs(got - want).max() > 2e-3 * np.abs(want).max()


def test_the_cli_runs_a_bert_export_with_integer_inputs():
    """``ipu-stack onnx`` feeds random 0/1 ids and mask (int64 for onnxruntime, i32 here)."""
    import json
    import subprocess
    import sys

    path = EXPORTS / "bert_ids__legacy17.onnx"
    done = subprocess.run(
        [sys.executable, "-m", "ipu_stack.cli", "onnx", str(path), "--tiles", "16", "--json"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["passed"] and report["reference"] == "onnxruntime"


@pytest.mark.parametrize("stem", ["bert_ids__legacy17", "bert_embeds__dynamo18"])
def test_a_fully_padded_sequence_matches_onnxruntime(stem):
    """Every key padded: the exported graphs give finite outputs (SDPA's NaN guard, or a
    finite finfo.min mask); flash_attention's all-blocked rows must agree, not turn NaN."""
    import onnxruntime as ort

    path = EXPORTS / f"{stem}.onnx"
    inputs, _ = _npz(path)
    inputs["attention_mask"] = np.zeros_like(inputs["attention_mask"])
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(names, inputs), strict=True))
    graph, bindings = import_onnx(path)
    config = BuildConfig(tiles=16, exchange_time_budget=0.05, finalists=1, compile_kernels=False)
    built = build(graph, config)
    run = SimDevice().run(built.program, built.placement, built.schedules, bindings.feeds(inputs))
    ours = bindings.onnx_outputs(run.outputs)
    for name, want in expected.items():
        got = np.asarray(ours[name], np.float64).reshape(want.shape)
        assert np.isfinite(got).all(), name
        np.testing.assert_allclose(got, want, atol=2e-3 * float(np.abs(want).max()))


def test_run_check_feeds_integer_inputs_as_the_model_declares_them(tmp_path):
    """``run --random-inputs --check`` on an export with int64 ids and mask: the package holds
    them as i32 (0 or 1 drawn); onnxruntime gets them as int64, the same values."""
    import subprocess
    import sys

    path = EXPORTS / "bert_ids__legacy17.onnx"
    package = tmp_path / "bert.ipuexe"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ipu_stack.cli", *args], capture_output=True,
                              text=True, timeout=600, check=False)  # fmt: skip

    built = cli("compile", str(path), "-o", str(package), "--tiles", "16", "--finalists", "1")
    assert built.returncode == 0, built.stderr[-2000:]
    done = cli("run", str(package), "--random-inputs", "--check", str(path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "PASS" in done.stdout

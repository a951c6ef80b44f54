"""F8 weights (``--weight-precision f8``): F143 GEMM weights, calibrated activation casts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from ipu_stack.graph.onnx_import import import_onnx
from ipu_stack.graph.weight_precision import (
    ACTIVATION_HEADROOM_BITS,
    F143_MAX,
    activation_maxima,
    calibration_feeds,
    quantize_bindings,
    scale_exponent_for,
)
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.sim import SimDevice

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
import make_examples  # noqa: E402

SMALL = {"tokens": 16, "hidden": 64, "heads": 4, "intermediate": 128}


def test_scale_exponent_is_the_smallest_that_fits_f143():
    assert scale_exponent_for(240.0) == 0
    assert scale_exponent_for(240.5) == 1
    assert scale_exponent_for(0.4858) == -8  # 0.4858 / 2**-8 = 124.4; / 2**-9 = 248.7
    assert scale_exponent_for(120.0, headroom_bits=1) == 0
    assert scale_exponent_for(0.0) == 0 and scale_exponent_for(float("nan")) == 0


def cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def rolled_f8():
    model = make_examples.encoder_block("f16", layers=3, **SMALL)
    graph, bindings = import_onnx(model)
    f16_params = dict(bindings.parameters)
    f8_graph = quantize_bindings(graph, bindings, "f8")
    return model, graph, f16_params, f8_graph, bindings


def test_rolled_encoder_runs_f8_gemms_close_to_onnxruntime(rolled_f8):
    model, _, _, graph, bindings = rolled_f8
    assert any(f.startswith("f8 weights: 6 weight tensors in F143, 4 activation casts")
               for f in bindings.fusions)  # fmt: skip
    (loop,) = graph.operations
    body = loop.attr("body")
    gemms = [op for op in body.operations if op.kind == "gemm"]
    weights = [body.value(op.inputs[1]) for op in gemms if body.value(op.inputs[1]).dtype == "f8"]
    assert len(weights) == 6 and all(w.kind == "parameter" for w in weights)
    # biases and layer-norm parameters stay F16
    assert all(body.value(v).dtype == "f16" for op in body.operations
               if op.kind in ("add", "layer_norm") for v in op.inputs)  # fmt: skip
    x = np.random.default_rng(7).uniform(-1, 1, (1, 16, 64)).astype(np.float16)
    built = build(graph, BuildConfig(tiles=32))
    feeds = bindings.feeds({"x": x})
    result = SimDevice().run(built.program, built.placement, built.schedules, feeds)
    got = bindings.onnx_outputs(result.outputs)["y"]
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    assert cosine(got, want) >= 0.99
    error = np.abs(got.astype(np.float64) - want).max()
    assert error <= 0.15 * np.abs(want).max()
    # it really is F8: the error is far above what the F16 build of this graph shows (~0.006)
    assert error >= 0.02


def test_activation_scales_cover_the_calibration_with_headroom(rolled_f8):
    _, graph, params, f8_graph, _ = rolled_f8
    maxima = activation_maxima(graph, calibration_feeds(graph, params))
    body = f8_graph.operations[0].attr("body")
    casts = [op for op in body.operations if op.kind == "cast"]
    assert len(casts) == 4 and len(maxima) == 4
    chosen = sorted(body.value(op.output).scale_exponent for op in casts)
    expected = [scale_exponent_for(p, ACTIVATION_HEADROOM_BITS) for p in maxima.values()]
    assert chosen == sorted(expected)
    for peak in maxima.values():
        e = scale_exponent_for(peak, ACTIVATION_HEADROOM_BITS)
        assert F143_MAX / 4 < peak / 2.0**e <= F143_MAX / 2


def test_unknown_weight_precision_is_refused(rolled_f8):
    _, graph, _, _, bindings = rolled_f8
    with pytest.raises(Exception, match="unknown weight precision 'f4'; supported: f16, f8"):
        quantize_bindings(graph, bindings, "f4")


def test_cli_compile_weight_precision_f8_writes_f8_weights(tmp_path):
    out = tmp_path / "mlp2_f8.ipuexe"
    cmd = [sys.executable, "-m", "ipu_stack.cli"]
    proc = subprocess.run(
        [*cmd, "compile", str(EXAMPLES / "mlp2.onnx"), "-o", str(out), "--tiles", "32",
         "--weight-precision", "f8"], capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    inspect = subprocess.run([*cmd, "package-inspect", str(out), "--bindings", "--json"],
                             capture_output=True, text=True, timeout=600)  # fmt: skip
    assert inspect.returncode == 0, inspect.stderr
    bindings = json.loads(inspect.stdout)["bindings"]
    weights = [b for b in bindings if b["role"] == "weight"]
    assert weights and {b["dtype"] for b in weights if len(b["shape"]) == 2} == {"f8"}
    run = subprocess.run([*cmd, "run", str(out), "--random-inputs", "--json"],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr
    bad = subprocess.run(
        [*cmd, "compile", str(EXAMPLES / "mlp2.onnx"), "-o", str(tmp_path / "x.ipuexe"),
         "--weight-precision", "f4"], capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert bad.returncode == 2 and "invalid choice: 'f4'" in bad.stderr
    assert not (tmp_path / "x.ipuexe").exists()

"""Rolled ONNX encoders: one loop body whatever the depth, outputs equal to the unrolled build."""

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from ipu_stack.graph.onnx_import import import_onnx
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.sim import SimDevice

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import make_examples

SMALL = {"tokens": 16, "hidden": 64, "heads": 4, "intermediate": 128}
TILES = 32


def encoder(layers, dtype="f32"):
    return make_examples.encoder_block(dtype, layers=layers, **SMALL)


def run(graph, bindings, x):
    built = build(graph, BuildConfig(tiles=TILES))
    result = SimDevice().run(
        built.program, built.placement, built.schedules, bindings.feeds({"x": x})
    )
    return built, bindings.onnx_outputs(result.outputs)["y"]


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(7).uniform(-1, 1, (1, 16, 64)).astype(np.float32)


def test_depths_give_equal_programs_and_say_rolled(x):
    # a 4-layer and a 27-layer export of the same config (the So400m tower's depth)
    programs = {}
    for layers in (4, 27):
        model = encoder(layers, "f16")  # 27 layers of F32 weights do not fit on 32 tiles
        graph, bindings = import_onnx(model)
        assert [op.kind for op in graph.operations] == ["repeat"]
        assert any(f.startswith(f"rolled {layers} layers of ") for f in bindings.fusions)
        built, got = run(graph, bindings, x.astype(np.float16))
        programs[layers] = len(built.program.steps)
        feed = {"x": x.astype(np.float16)}
        want = ort.InferenceSession(model.SerializeToString()).run(None, feed)[0]
        assert np.abs(got.astype(np.float64) - want).max() <= 0.03 * np.abs(want).max()
    assert programs[4] == programs[27]


def test_rolled_outputs_equal_unrolled_and_onnxruntime(x):
    model = encoder(4)
    rolled_graph, rolled_bindings = import_onnx(model)
    flat_graph, flat_bindings = import_onnx(model, roll_layers=False)
    assert all(op.kind != "repeat" for op in flat_graph.operations)
    _, rolled = run(rolled_graph, rolled_bindings, x)
    _, flat = run(flat_graph, flat_bindings, x)
    np.testing.assert_array_equal(rolled, flat)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    assert np.abs(rolled - want).max() <= 2e-3 * np.abs(want).max()

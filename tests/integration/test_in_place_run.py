"""Rows written in place (``low/in_place.py``) on a build where the rewrite applies: the
full-size encoder block's last bias add writes straight into the residual's operand rows.
The run still matches onnxruntime, so a rewrite that put rows in the wrong place (a wrong
stride or offset, a dropped fill) would fail here."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

import ipu_stack.low.lower as lower
from ipu_stack.graph.onnx_import import import_onnx
from ipu_stack.low.in_place import write_in_place
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.sim import SimDevice

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import make_examples


def test_encoder_block_with_rows_written_in_place_matches_onnxruntime(monkeypatch):
    removed: list[int] = []

    def counted(steps, buffers, bindings):
        kept, n = write_in_place(steps, buffers, bindings)
        removed.append(n)
        return kept, n

    monkeypatch.setattr(lower, "write_in_place", counted)
    model = make_examples.encoder_block("f16")
    graph, bindings = import_onnx(model)
    built = build(graph, BuildConfig(finalists=1))
    assert removed and removed[-1] > 0, removed  # the rewrite applied to the built program
    x = np.random.default_rng(3).uniform(-1, 1, bindings.inputs["x"].shape).astype(np.float16)
    run = SimDevice().run(built.program, built.placement, built.schedules, bindings.feeds({"x": x}))
    ours = bindings.onnx_outputs(run.outputs)["y"].astype(np.float64)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    error = float(np.abs(ours - expected).max() / np.abs(expected).max())
    assert error <= 0.03, error

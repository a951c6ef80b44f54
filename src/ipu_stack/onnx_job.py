"""Import an ONNX model, compile it, run it on the simulator, check it (the CLI's ``onnx``).

The check runs the same model in onnxruntime when it is installed (else the float64 NumPy
reference of the imported graph) on the same random inputs (uniform in [-1, 1]; integer and
boolean inputs such as token ids and padding masks 0 or 1).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.graph.compute_graph import evaluate_reference
from ipu_stack.graph.onnx_import import NUMPY_OF, import_onnx
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.sim import SimDevice
from ipu_stack.target import ipu21
from ipu_stack.trace import Trace

#: Pass thresholds (the issue's): max |error| <= tolerance x max |reference|, per output.
TOLERANCE = {"f16": 0.03, "f32": 1e-3}


@dataclass(frozen=True, slots=True)
class OnnxJob:
    path: str
    tiles: int = ipu21.TILES
    seed: int = 0
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


def _reference(path: str, inputs: dict[str, np.ndarray]) -> tuple[str, dict[str, np.ndarray]]:
    try:
        import onnxruntime as ort
    except ImportError:
        return "numpy", {}
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    typed = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}
    feeds = {
        i.name: inputs[i.name].astype(typed.get(i.type, inputs[i.name].dtype))
        for i in session.get_inputs()
        if i.name in inputs
    }
    return "onnxruntime", dict(zip(names, session.run(names, feeds), strict=True))


def run_onnx(job: OnnxJob, trace: Trace | None = None) -> dict[str, Any]:
    """Import, build, simulate and check; returns a JSON-ready report.

    Raises:
        GraphError: the model uses something ipu-stack does not support.
        PlanError: it does not fit in tile memory.
    """
    trace = trace or Trace()
    start = time.perf_counter()
    graph, bindings = import_onnx(job.path, input_shapes=job.input_shapes)
    import_seconds = time.perf_counter() - start
    rng = np.random.default_rng(job.seed)
    inputs = {  # integer and boolean inputs (token ids, masks): 0 or 1, valid for both
        name: rng.integers(0, 2, value.shape).astype(np.int32)
        if value.dtype == "i32"
        else rng.uniform(-1, 1, value.shape).astype(NUMPY_OF[value.dtype])
        for name, value in bindings.inputs.items()
    }
    built = build(graph, BuildConfig(tiles=job.tiles), trace)
    run = SimDevice().run(built.program, built.placement, built.schedules, bindings.feeds(inputs))
    ours = bindings.onnx_outputs(run.outputs)
    reference_kind, expected = _reference(str(Path(job.path)), inputs)
    if not expected:
        expected = bindings.onnx_outputs(evaluate_reference(graph, bindings.feeds(inputs)))
    outputs = []
    for name, value in bindings.outputs.items():
        want = np.asarray(expected[name], dtype=np.float64)
        got = np.asarray(ours[name], dtype=np.float64).reshape(want.shape)
        scale = float(np.abs(want).max()) if want.size else 0.0
        error = float(np.abs(got - want).max()) if want.size else 0.0
        relative = error / scale if scale > 0 else error
        outputs.append(
            {
                "name": name,
                "shape": list(want.shape),
                "precision": value.dtype,
                "max_abs_error": error,
                "max_abs_reference": scale,
                "relative_error": relative,
                "tolerance": TOLERANCE[value.dtype],
                "passed": relative <= TOLERANCE[value.dtype],
            }
        )
    return {
        "model": job.path,
        "tiles": job.tiles,
        "operations": len(graph.operations),
        "operation_kinds": sorted({op.kind for op in graph.operations}),
        "parameters": int(sum(a.size for a in bindings.parameters.values())),
        "fusions": bindings.fusions,
        "import_seconds": import_seconds,
        "phases": trace.phases,
        "estimated_cycles": built.program.estimated_cycles,
        "simulated_cycles": run.cycles,
        "simulate_seconds": run.seconds,
        "reference": reference_kind,
        "outputs": outputs,
        "passed": all(o["passed"] for o in outputs),
    }

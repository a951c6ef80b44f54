"""``ipu-stack run PKG --check MODEL.onnx``: a package's outputs against onnxruntime.

The same inputs go to onnxruntime; every output must be within the ONNX job's tolerance
(max |error| <= tolerance x max |reference|), so a wrong package cannot "run" silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.onnx_job import TOLERANCE

#: ONNX Runtime input types a float input of another width is converted to
_FLOAT_INPUTS = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def check_outputs(
    model: str | Path,
    inputs: Mapping[str, np.ndarray],
    outputs: Mapping[str, np.ndarray],
    dtypes: Mapping[str, str],
) -> dict[str, Any]:
    """Compare ``outputs`` (by ONNX output name) with onnxruntime's on ``inputs``.

    Args:
        model: the ONNX file the package was compiled from.
        inputs: the run's inputs by ONNX input name.
        outputs: the run's outputs by ONNX output name.
        dtypes: each output's package dtype (``f16``, ``f32``; picks the tolerance).

    Returns:
        ``{"passed": bool, "outputs": [{name, max_abs_error, relative_error, tolerance,
        passed}]}``.

    Raises:
        GraphError: the model cannot be read or does not match the package's names.
    """
    try:
        import onnxruntime as ort
    except ImportError:  # pragma: no cover - onnxruntime is a test dependency
        raise GraphError("--check needs onnxruntime (pip install onnxruntime)") from None
    try:
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own exception types
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise GraphError(f"--check: cannot load {model}: {first}") from None
    names = [o.name for o in session.get_outputs()]
    feeds = {}
    for i in session.get_inputs():
        if i.name not in inputs:
            raise GraphError(f"--check: the model's input {i.name!r} is not a package input")
        feeds[i.name] = np.asarray(inputs[i.name])
        # a package compiled with --precision f16 from an F32 model: the same values in F32
        # (exact), so the reference runs the model as exported
        if i.type in _FLOAT_INPUTS and feeds[i.name].dtype.kind == "f":
            feeds[i.name] = feeds[i.name].astype(_FLOAT_INPUTS[i.type])
    try:
        results = session.run(names, feeds)
    except Exception as err:  # onnxruntime's own exception types: a model/package mismatch
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise GraphError(
            f"--check: {model} does not accept the package's inputs: {first}"
        ) from None
    reference = dict(zip(names, results, strict=True))
    report = []
    for name, want in reference.items():
        if name not in outputs:
            raise GraphError(f"--check: the model's output {name!r} is not a package output")
        got = np.asarray(outputs[name], np.float64)
        want64 = np.asarray(want, np.float64)
        if got.shape != want64.shape:
            report.append({"name": name, "passed": False,
                           "reason": f"shape {got.shape} != {want64.shape}"})  # fmt: skip
            continue
        error = float(np.nanmax(np.abs(got - want64))) if got.size else 0.0
        if not np.isfinite(got).all():
            error = float("inf")
        scale = max(float(np.abs(want64).max()) if want64.size else 0.0, 1e-30)
        tolerance = TOLERANCE.get(dtypes.get(name, "f32"), TOLERANCE["f16"])
        report.append({"name": name, "max_abs_error": error, "relative_error": error / scale,
                       "tolerance": tolerance, "passed": error / scale <= tolerance})  # fmt: skip
    return {"passed": all(r["passed"] for r in report), "outputs": report}

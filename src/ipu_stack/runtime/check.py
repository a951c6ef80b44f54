"""``ipu-stack run PKG --check MODEL.onnx``: a package's outputs against onnxruntime.

The same inputs go to onnxruntime; every output must be within the ONNX job's tolerance
(max |error| <= tolerance x max |reference|), so a wrong package cannot "run" silently.
Each output's cosine similarity to the reference is reported too. With a cosine criterion
(``--min-cosine``, and by default for packages holding F8 weights) an output passes when its
cosine reaches the bound instead: F8 weights (F143, three mantissa bits) put single elements
off by several percent of the output range while the output as a whole stays close, which is
how the reference stack and the SigLIP So400m issue judge them.
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
#: ... and those an integer (or boolean) input is converted to: a package holds token ids and
#: masks as i32 where exporters declare int64 (or bool); the values are the same
_INTEGER_INPUTS = {
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}
#: default cosine bound of a package with F8 weights (the So400m issue's accuracy criterion)
F8_MIN_COSINE = 0.99


def cosine(got: np.ndarray, want: np.ndarray) -> float:
    """Cosine similarity of two arrays as flat float64 vectors (1.0 when both are zero)."""
    a, b = got.ravel(), want.ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0 or not (np.isfinite(na) and np.isfinite(nb)):
        return 0.0 if np.isfinite(na) and np.isfinite(nb) else float("nan")
    return float(np.dot(a / na, b / nb))


def check_outputs(
    model: str | Path,
    inputs: Mapping[str, np.ndarray],
    outputs: Mapping[str, np.ndarray],
    dtypes: Mapping[str, str],
    min_cosine: float | None = None,
) -> dict[str, Any]:
    """Compare ``outputs`` (by ONNX output name) with onnxruntime's on ``inputs``.

    Args:
        model: the ONNX file the package was compiled from.
        inputs: the run's inputs by ONNX input name.
        outputs: the run's outputs by ONNX output name.
        dtypes: each output's package dtype (``f16``, ``f32``; picks the tolerance).
        min_cosine: if given, an output passes when its cosine similarity to the reference is
            at least this (and it is finite), whatever its largest element error.

    Returns:
        ``{"passed": bool, "criterion": str, "outputs": [{name, max_abs_error,
        relative_error, tolerance, cosine, passed}]}``.

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
        elif i.type in _INTEGER_INPUTS and feeds[i.name].dtype.kind in "iub":
            feeds[i.name] = feeds[i.name].astype(_INTEGER_INPUTS[i.type])
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
        cos = cosine(got, want64) if got.size else 1.0
        if min_cosine is None:
            passed = error / scale <= tolerance
        else:
            passed = bool(np.isfinite(got).all()) and cos >= min_cosine
        report.append({"name": name, "max_abs_error": error, "relative_error": error / scale,
                       "tolerance": tolerance, "cosine": cos, "passed": passed})  # fmt: skip
    criterion = "relative" if min_cosine is None else f"cosine >= {min_cosine:g}"
    return {"passed": all(r["passed"] for r in report), "criterion": criterion,
            "outputs": report}  # fmt: skip

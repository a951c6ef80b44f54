"""``run --check``: cosine similarity reported per output, and the cosine criterion
(``--min-cosine``; the default for packages with F8 weights) judged by it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ipu_stack.runtime.check import check_outputs, cosine

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MLP2 = EXAMPLES / "mlp2.onnx"


def _reference(seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    session = ort.InferenceSession(str(MLP2), providers=["CPUExecutionProvider"])
    i = session.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in i.shape]
    x = np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float16)
    return {i.name: x}, session.run(None, {i.name: x})[0]


def test_cosine_values():
    a = np.array([1.0, 2.0, -3.0])
    assert cosine(a, a) == 1.0
    assert abs(cosine(a, -a) + 1.0) < 1e-12
    assert cosine(np.zeros(3), np.zeros(3)) == 1.0
    assert cosine(np.zeros(3), a) == 0.0
    assert np.isnan(cosine(np.array([np.inf, 1.0, 0.0]), a))


def test_cosine_criterion_judges_the_whole_output_not_its_worst_element():
    inputs, want = _reference()
    name = "y"
    spiked = want.astype(np.float64).copy()
    spiked.flat[0] += 0.2 * np.abs(want).max()  # one element 20% of the range off
    plain = check_outputs(MLP2, inputs, {name: spiked}, {name: "f16"})
    assert not plain["passed"] and plain["criterion"] == "relative"
    assert plain["outputs"][0]["cosine"] > 0.99
    by_cosine = check_outputs(MLP2, inputs, {name: spiked}, {name: "f16"}, min_cosine=0.99)
    assert by_cosine["passed"] and by_cosine["criterion"] == "cosine >= 0.99"
    # a wrong output fails the cosine criterion: reversed signs, shuffled, or not finite
    assert not check_outputs(MLP2, inputs, {name: -want}, {name: "f16"}, 0.99)["passed"]
    shuffled = np.random.default_rng(1).permutation(want.ravel()).reshape(want.shape)
    assert not check_outputs(MLP2, inputs, {name: shuffled}, {name: "f16"}, 0.99)["passed"]
    bad = want.astype(np.float64).copy()
    bad.flat[3] = np.nan
    assert not check_outputs(MLP2, inputs, {name: bad}, {name: "f16"}, 0.99)["passed"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ipu_stack.cli", *args],
                          capture_output=True, text=True)  # fmt: skip


def test_f8_package_checked_by_cosine_and_bad_bound_is_exit_2(tmp_path):
    pkg = tmp_path / "mlp2_f8.ipuexe"
    built = _cli("compile", str(MLP2), "-o", str(pkg), "--weight-precision", "f8")
    assert built.returncode == 0, built.stderr
    run = _cli("run", str(pkg), "--random-inputs", "--check", str(MLP2))
    assert run.returncode == 0 and "(cosine >= 0.99)" in run.stdout, run.stdout + run.stderr
    strict = _cli("run", str(pkg), "--random-inputs", "--check", str(MLP2), "--min-cosine", "1")
    assert strict.returncode == 1 and "FAIL" in strict.stdout, strict.stdout
    bad = _cli("run", str(pkg), "--random-inputs", "--check", str(MLP2), "--min-cosine", "1.5")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "--min-cosine" in bad.stderr

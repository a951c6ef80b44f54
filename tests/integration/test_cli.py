"""The ``ipu-stack`` command as a user runs it: exit codes, one-line errors, JSON report."""

import json
import subprocess
import sys

import pytest

REQUIRED_KEYS = {
    "estimated_cycles",
    "simulated_cycles",
    "utilization",
    "max_abs_error",
    "max_abs_reference",
    "plan",
    "phases",
    "plan_seconds",
    "simulate_seconds",
}


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "ipu_stack.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["1", "1", "1"],
        ["17", "33", "65"],
        ["64", "48", "32", "--batch", "3"],
        ["40", "24", "56", "--transpose-left", "--transpose-right"],
        ["64", "80", "32", "--precision", "f32"],
    ],
)
def test_gemm_json_passes(args):
    proc = cli("gemm", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report.keys() >= REQUIRED_KEYS
    assert report["passed"] is True
    assert report["max_abs_error"] <= 0.02 * report["max_abs_reference"]
    assert {p["name"] for p in report["phases"]} >= {"lower_mid", "select_finalist", "plan_kernels"}
    assert all(p["success"] for p in report["phases"])


def test_gemm_text_output_prints_trace_and_plan():
    proc = cli("gemm", "32", "32", "32")
    assert proc.returncode == 0, proc.stderr
    assert 'package build phase finished phase="lower_mid" elapsed_ms=' in proc.stdout
    assert "success=true" in proc.stdout
    assert "plan: grid=" in proc.stdout and "utilization=" in proc.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["0", "4", "4"], "dimensions must be positive, got 0"),
        (["4", "-3", "4"], "dimensions must be positive, got -3"),
        (["4", "4", "4", "--precision", "f64"], "invalid choice: 'f64'"),
        (["8", "16", "8", "--right-shape", "17,8"], "inner dimensions differ"),
        (["100000", "100000", "100000"], "does not fit in tile memory"),
        (["4", "4", "4", "--tiles", "2000"], "--tiles must be between 1 and 1472"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, message):
    proc = cli("gemm", *args)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]
    assert "Traceback" not in proc.stderr

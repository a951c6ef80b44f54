"""The CLI as a person reads it: a plain compile summary, progress only on a terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ipu_stack.cli", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, **env})  # fmt: skip


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("readable") / "mlp2.ipuexe"
    env = {k: v for k, v in os.environ.items() if k != "IPU_STACK_PROGRESS"}
    proc = subprocess.run(
        [sys.executable, "-m", "ipu_stack.cli", "compile", str(EXAMPLES / "mlp2.onnx"), "-o",
         str(out), "--tiles", "32"], capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    return out, proc


def test_compile_prints_a_plain_summary_and_nothing_else_when_piped(compiled):
    out, proc = compiled
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no progress bar, no log when piped
    lines = proc.stdout.splitlines()
    assert not [line for line in lines if line.startswith("INFO ")]  # the trace is --verbose
    assert lines[1].startswith("model ") and "5 operations" in lines[1]
    assert lines[2].startswith("tiles: 32 used of the 32 allowed")
    plan = lines[lines.index("plan:") + 1 : next(i for i, x in enumerate(lines)
                                                 if x.startswith("estimated:"))]  # fmt: skip
    assert len(plan) == 5 and all(line.startswith("  ") for line in plan)
    assert any("Gemm_5/gemm: gemm on" in line and "grid" in line for line in plan)
    assert any(line.startswith("peak memory per tile: standard") for line in lines)
    assert any(line.startswith(f"package {out}: ") for line in lines)
    time_line = next(line for line in lines if line.startswith("time: "))
    assert "lower_mid" in time_line and "select_finalist" in time_line and "s wall" in time_line
    assert len(lines) < 20


def test_run_shows_progress_on_a_terminal_only(compiled, tmp_path):
    out, _ = compiled
    piped = cli("run", str(out), "--random-inputs")
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    assert "simulating" not in piped.stdout
    leader, follower = pty.openpty()  # stderr is a terminal: the bar is drawn there
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "IPU_STACK_PROGRESS"}
    proc = subprocess.Popen([sys.executable, "-m", "ipu_stack.cli", "run", str(out),
                             "--random-inputs"], stdout=subprocess.PIPE, stderr=follower,
                            env=env)  # fmt: skip
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    stdout = proc.communicate(timeout=600)[0].decode()
    os.close(leader)
    assert proc.returncode == 0
    assert b"simulating" in seen and b"step" in seen, seen[-400:]

    def results(text: str) -> str:  # wall-clock seconds left out
        return re.sub(r"simulate_seconds=[0-9.]+", "", text)

    assert results(stdout) == results(piped.stdout)  # the bar went to the terminal only


def test_build_progress_follows_the_trace_events(capsys):
    from ipu_stack.progress import ProgressTrace

    trace = ProgressTrace(quiet=True)
    for i in range(3):
        trace.event("retained operator-plan finalist", finalist=i)
    trace.event("package build phase finished", phase="lower_mid", elapsed_ms=1, success=True)
    for i in range(3):
        trace.event("scheduled operator-plan finalist", finalist=i)
    trace.event("prepared large physical exchange phase", phase=0)
    trace.event("finished large physical exchange phase", phase=0)
    trace.event("package build phase finished", phase="select_finalist", elapsed_ms=1,
                success=True)  # fmt: skip
    trace.close()
    err = capsys.readouterr().err
    assert "evaluating finalists" in err and "3/3" in err
    assert "scheduling large exchange phases" in err and "1phase" in err
    assert len(trace.events) == 10 and not trace.bars  # recorded as a Trace, bars closed


def test_build_phases_and_compile_steps_show_a_status_line(capsys):
    from ipu_stack.progress import ProgressTrace, stage
    from ipu_stack.trace import Trace

    trace = ProgressTrace(quiet=True)
    with stage(trace, "importing model.onnx"):
        pass
    with trace.phase("lower_exchanges"):
        pass
    trace.close()
    err = capsys.readouterr().err
    assert "importing model.onnx" in err and "build phase lower_exchanges" in err
    # the status lines record nothing: the events are those of a plain Trace
    plain = Trace(quiet=True)
    with stage(plain, "importing model.onnx"), plain.phase("lower_exchanges"):
        pass
    assert capsys.readouterr().err == ""
    strip = [{k: v for k, v in e.items() if k != "elapsed_ms"} for e in trace.events]
    assert strip == [{k: v for k, v in e.items() if k != "elapsed_ms"} for e in plain.events]

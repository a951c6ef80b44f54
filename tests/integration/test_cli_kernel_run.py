"""``ipu-stack kernel-run``: exit 0 on a match, 1 on a mismatch or fault, 2 on bad input."""

import json
import subprocess
import sys

from ipu_stack.kernels.registry import TEMPLATE_DIR


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "ipu_stack.cli", "kernel-run", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_match_prints_error_and_both_cycle_counts():
    proc = cli("gemm_f16_interleaved_k16_c32_r7_r8", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and len(report["entries"]) == 4
    assert all(e["emulated_cycles"] > 0 and e["modelled_cycles"] > 0 for e in report["entries"])


def test_mismatch_and_fault_exit_1(tmp_path):
    text = (TEMPLATE_DIR / "elementwise.S").read_text()
    bad = tmp_path / "elementwise.S"
    bad.write_text(text.replace("#define EW_INSN f16v4add", "#define EW_INSN f16v4mul"))
    proc = cli("add_f16_n64", "--source", str(bad))
    assert proc.returncode == 1 and "MISMATCH" in proc.stdout
    bad.write_text(text.replace("shl $m4, $m0, 3", "shl $m4, $m0, 2"))
    proc = cli("add_f16_n64", "--source", str(bad))
    assert proc.returncode == 1
    assert (
        "FAULT" in proc.stdout and "ld64step" in proc.stdout and "not 8-byte aligned" in proc.stdout
    )


def test_bad_input_exits_2_with_one_line():
    for args in (("gemm_f16_k33_c16_r1_r1",), ("add_f16_n8", "--source", "/nonexistent.S")):
        proc = cli(*args)
        assert proc.returncode == 2, args
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr

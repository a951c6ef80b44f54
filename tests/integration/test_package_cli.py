"""`ipu-stack compile`, `run` and `package-inspect` as a user runs them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ipu_stack.package.format import HEADER_SIZE, SCHEMA_VERSION, reseal

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TILES = "32"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ipu_stack.cli", *args], capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """mlp2 compiled twice by the CLI (text output with the trace, then --json)."""
    out = tmp_path_factory.mktemp("compiled")
    first = cli("compile", str(EXAMPLES / "mlp2.onnx"), "-o", str(out / "a.ipuexe"),
                "--tiles", TILES, "--verbose")  # fmt: skip
    second = cli("compile", str(EXAMPLES / "mlp2.onnx"), "-o", str(out / "b.ipuexe"),
                 "--tiles", TILES, "--json")  # fmt: skip
    return out, first, second


def test_compile_prints_every_phase_and_is_byte_identical(compiled):
    out, first, second = compiled
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    for phase in ("lower_mid", "select_finalist", "plan_kernels", "compile_kernels",
                  "assemble_package", "write_package"):  # fmt: skip
        assert f'package build phase finished phase="{phase}" elapsed_ms=' in first.stdout
    assert "success=false" not in first.stdout
    assert "lowered graph for package construction logical_shards=" in first.stdout
    assert f"wrote {out / 'a.ipuexe'}:" in first.stdout
    report = json.loads(second.stdout)
    assert all(p["success"] and "elapsed_ms" in p for p in report["report"]["phases"])
    assert (out / "a.ipuexe").read_bytes() == (out / "b.ipuexe").read_bytes()
    assert report["digest"] == (out / "a.ipuexe").read_bytes()[32:64].hex()


def test_run_with_input_files_and_output_dir(compiled, tmp_path):
    out, *_ = compiled
    x = np.random.default_rng(3).uniform(-1, 1, (64, 128)).astype(np.float16)
    np.save(tmp_path / "x.npy", x)
    proc = cli("run", str(out / "a.ipuexe"), "--input", f"x={tmp_path / 'x.npy'}",
               "--output-dir", str(tmp_path / "outs"), "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["simulated_cycles"] > 0
    assert report["simulated_seconds"] == pytest.approx(report["simulated_cycles"] / 1.5e9)
    (output,) = report["outputs"]
    y = np.load(output["file"])
    assert output["name"] == "y" and y.shape == (64, 64) and y.dtype == np.float16

    from ipu_stack import Session

    session = Session().load(out / "a.ipuexe")
    session.initialize()
    assert np.array_equal(session.run({"x": x})["y"].view(np.uint16), y.view(np.uint16))


def test_run_text_output_and_missing_inputs(compiled):
    out, *_ = compiled
    proc = cli("run", str(out / "a.ipuexe"), "--random-inputs")
    assert proc.returncode == 0, proc.stderr
    assert "output y float16 (64, 64)" in proc.stdout
    assert "us at 1.5 GHz" in proc.stdout and "simulated_cycles=" in proc.stdout
    proc = cli("run", str(out / "a.ipuexe"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "ipu-stack: error: no data for input 'x'; pass --input x=FILE.npy or --random-inputs"
    )


def test_package_inspect(compiled):
    out, *_ = compiled
    proc = cli("package-inspect", str(out / "a.ipuexe"), "--bindings")
    assert proc.returncode == 0, proc.stderr
    assert f"schema {SCHEMA_VERSION}, compiler " in proc.stdout
    assert "target ipu21, tile memory 0x4c000 +638976" in proc.stdout
    assert f"tiles={TILES} " in proc.stdout
    assert "bindings: input=1 weight=4 output=1; host calls: initialize, run" in proc.stdout
    assert "  input  x f16 (64, 128): " in proc.stdout
    assert "  output y f16 (64, 64): " in proc.stdout
    proc = cli("package-inspect", str(out / "a.ipuexe"), "--tile", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    tile = json.loads(proc.stdout)["tile"]
    assert tile["logical"] == 0 and tile["allocations"] and tile["segments"]
    assert {s["binding"] for s in tile["slices"]} >= {"x", "y"}
    assert any(step["kind"] == "compute" for step in tile["steps"])
    proc = cli("package-inspect", str(out / "a.ipuexe"), "--tile", "1")
    assert proc.returncode == 2 and "tile 1 is not in the package" in proc.stderr


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda b: b[: len(b) - 1000], "truncated: the header announces"),
        (lambda b: b[:HEADER_SIZE - 1], "truncated:"),
        (lambda b: b[:-500] + bytes([b[-500] ^ 0x10]) + b[-499:], "content digest mismatch"),
        (lambda b: b[:200] + bytes([b[200] ^ 0x01]) + b[201:], "content digest mismatch"),
        (lambda b: reseal(b, SCHEMA_VERSION + 6), f"schema version {SCHEMA_VERSION + 6} is not"),
    ],
    ids=["truncated", "truncated-header", "flipped-data-byte", "flipped-manifest-byte",
         "schema-version"],
)  # fmt: skip
def test_damaged_package_exits_2_with_one_line(compiled, tmp_path, damage, message):
    out, *_ = compiled
    bad = tmp_path / "bad.ipuexe"
    bad.write_bytes(damage((out / "a.ipuexe").read_bytes()))
    for command in ("run", "package-inspect"):
        proc = (
            cli(command, str(bad), "--random-inputs")
            if command == "run"
            else cli(command, str(bad))
        )
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr
        assert lines[0].startswith(f"ipu-stack: error: {bad}: ")
        assert message in lines[0]


def test_compile_errors_exit_2(tmp_path):
    proc = cli("compile", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "m.ipuexe"))
    assert proc.returncode == 2
    assert "not found" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "m.ipuexe").exists()
    proc = cli("run", str(tmp_path / "missing.ipuexe"))
    assert proc.returncode == 2 and "cannot read package" in proc.stderr


def test_precision_conversion(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto

    from ipu_stack.graph.onnx_precision import convert_precision

    model = onnx.load(EXAMPLES / "mlp2_f32.onnx")
    half = convert_precision(model, "f16")
    assert half.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert all(init.data_type == TensorProto.FLOAT16 for init in half.graph.initializer)
    assert model.graph.initializer[0].data_type == TensorProto.FLOAT  # the input is untouched
    from ipu_stack.graph.onnx_import import import_onnx

    graph, bindings = import_onnx(half)
    assert {v.dtype for v in graph.values} == {"f16"}
    assert all(a.dtype == np.float16 for a in bindings.parameters.values())


def test_exchange_budget_option(tmp_path):
    # Budget 0: only the constructive schedulers run (no improvement, no preemption); at
    # 1,472 tiles mlp2's phases are large enough (> 1,000 transfers) to be logged.
    out = tmp_path / "zero.ipuexe"
    proc = cli("compile", str(EXAMPLES / "mlp2.onnx"), "-o", str(out), "--exchange-budget", "0",
               "--verbose")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    kinds = re.findall(r'optimized physical exchange schedule .*selected_kind="([a-z-]+)"',
                       proc.stdout + proc.stderr)  # fmt: skip
    assert kinds and not {"cp-sat-lns", "preemptive-fit"} & set(kinds)
    assert cli("run", str(out), "--random-inputs").returncode == 0
    for bad in ("-1", "inf", "nan", "soon"):
        target = tmp_path / f"bad{bad}.ipuexe"
        proc = cli("compile", str(EXAMPLES / "mlp2.onnx"), "-o", str(target),
                   "--exchange-budget", bad)  # fmt: skip
        assert proc.returncode == 2 and "--exchange-budget" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and not target.exists()

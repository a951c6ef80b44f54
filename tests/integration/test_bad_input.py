"""Every defect of issue 15, reproduced: bad input exits 2 with one line, never a traceback,
never accepted silently, and leaves nothing behind; valid unusual input still works."""

from __future__ import annotations

import contextlib
import copy
import errno
import io
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ipu_stack import BuildConfig, build_package
from ipu_stack.cli import main
from ipu_stack.exchange.model import IPU21_MODEL
from ipu_stack.exchange.snapshot import schedule_document, snapshot_document
from ipu_stack.graph import ComputeGraph
from ipu_stack.package.build import build
from ipu_stack.package.format import SCHEMA_VERSION, Package, _seal, canonical_json

ROOT = os.geteuid() == 0


def cli(*argv: str) -> tuple[int, str, str]:
    """Run the CLI in-process; an exception escaping main fails the test with its traceback."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 2
        except BaseException:
            pytest.fail(f"traceback from {argv}:\n{traceback.format_exc()}")
    return int(code), out.getvalue(), err.getvalue()


def rejected(argv: tuple[str, ...], *needles: str) -> str:
    """Assert exit 2 and one stderr line containing every needle; return the line."""
    code, _, err = cli(*argv)
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("ipu-stack: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A two-GEMM package with an exchange step, its snapshot and schedule, an input file."""
    root = tmp_path_factory.mktemp("tiny")
    g = ComputeGraph()
    x = g.host_input("x", (32, 64), "f16")
    w = g.parameter("w", (64, 64), "f16")  # wide enough that the plan has exchange steps
    w2 = g.parameter("w2", (64, 32), "f16")
    g.set_outputs(g.gemm(g.gemm(x, w, name="mm"), w2, name="mm2"))
    rng = np.random.default_rng(0)
    weights = {"w": rng.uniform(-1, 1, (64, 64)).astype(np.float16),
               "w2": rng.uniform(-1, 1, (64, 32)).astype(np.float16)}  # fmt: skip
    build_package(g, BuildConfig(tiles=8), weights, names={"mm2.out": "y"}).save(root / "t.ipuexe")
    built = build(g, BuildConfig(tiles=8))
    assert built.schedules, "the fixture must have an exchange step"
    phases = [(i, p) for i, (p, _) in sorted(built.schedules.items())]
    (root / "snap.json").write_text(json.dumps(snapshot_document(phases, 1472)))
    scheds = [(i, s) for i, (_, s) in sorted(built.schedules.items())]
    (root / "sched.json").write_text(json.dumps(schedule_document(scheds, IPU21_MODEL)))
    xv = rng.uniform(-1, 1, (32, 64)).astype(np.float16)
    np.save(root / "x.npy", xv)
    ref = (xv.astype(np.float64) @ weights["w"]).astype(np.float16) @ weights["w2"]
    return root, ref


def model(nodes, opset=20, x_shape=(8, 16), y_shape=(8, 8), inits=()):
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))], list(inits),
    )  # fmt: skip
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 10
    return proto


W = numpy_helper.from_array(
    np.random.default_rng(1).uniform(-1, 1, (16, 8)).astype(np.float32), "W"
)


def matmul_gelu(opset=20):
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Gelu", ["h"], ["y"])]
    return model(nodes, opset, inits=[W])


def save(tmp_path, proto, name="m.onnx"):
    onnx.save(proto, str(tmp_path / name))
    return str(tmp_path / name)


def edited_package(path: Path, edit_manifest=None, edit_table=None) -> bytes:
    package = Package.load(path)
    manifest = copy.deepcopy(package.manifest)
    data = bytearray(package.data)
    if edit_manifest:
        edit_manifest(manifest)
    if edit_table:
        name, row, col, value = edit_table
        entry = manifest["sections"][name]
        at = entry["offset"] + (row * entry["shape"][1] + col) * 8
        data[at : at + 8] = int(value).to_bytes(8, "little", signed=True)
    blob = canonical_json(manifest)
    return _seal(SCHEMA_VERSION, blob + b" " * (-len(blob) % 8), bytes(data))


# -- the 16 tracebacks --------------------------------------------------------------------------


def test_impossible_gemm_sizes_are_rejected_up_front():
    big = str(2**40)
    rejected(("gemm", big, big, big), "argument m: 1099511627776 is above the limit 2147483647")
    mid = str(2**20)
    rejected(("gemm", mid, mid, mid), "left 1048576x1048576 (f16)", "hold 940572672 bytes")
    rejected(("gemm", "8", "8", "8", "--batch", mid, "--left-shape", f"{mid},{mid},8"),
             "does not fit in tile memory")  # fmt: skip


@pytest.mark.parametrize("argv", [
    ("compile", "m.onnx", "-o", "o.ipuexe", "--exchange-budget", "1e308"),
    ("exchange-bench", "s.json", "--time-budget", "1e308"),
    ("exchange-bench", "s.json", "--time-budget", "nan"),
])  # fmt: skip
def test_huge_budgets_name_the_limit(argv):
    rejected(argv, "at most 86400")


@pytest.mark.parametrize("bad", ["-0.1", "1.5", "nan", "most"])
def test_refine_share_must_be_a_fraction(bad):
    rejected(("compile", "m.onnx", "-o", "o.ipuexe", "--exchange-refine-share", bad),
             "--exchange-refine-share", bad)  # fmt: skip


def test_empty_and_corrupt_npy_inputs(tiny, tmp_path):
    root, _ = tiny
    (tmp_path / "e.npy").write_bytes(b"")
    rejected(("run", str(root / "t.ipuexe"), "--input", f"x={tmp_path / 'e.npy'}"), "is empty")
    (tmp_path / "c.npy").write_bytes((root / "x.npy").read_bytes()[:200])
    rejected(("run", str(root / "t.ipuexe"), "--input", f"x={tmp_path / 'c.npy'}"),
             "not a valid .npy")  # fmt: skip


def test_outputs_into_missing_dirs_fail_before_the_build(tiny, tmp_path):
    root, _ = tiny
    missing = tmp_path / "no" / "snap.json"
    line = rejected(("gemm", "16", "16", "16", "--tiles", "4", "--export-exchange-snapshot",
                     str(missing)), "does not exist")  # fmt: skip
    assert "no" in line
    rejected(("exchange-bench", str(root / "snap.json"), "--emit-schedule", str(missing)),
             "does not exist")  # fmt: skip
    rejected(("compile", "m.onnx", "-o", str(missing)), "does not exist")
    rejected(("compile", "m.onnx", "-o", str(tmp_path)), "is a directory")
    os.mkfifo(tmp_path / "fifo")
    rejected(("compile", "m.onnx", "-o", str(tmp_path / "fifo")), "not a regular file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


def test_output_dir_that_is_a_file(tiny):
    root, _ = tiny
    rejected(("run", str(root / "t.ipuexe"), "--random-inputs", "--output-dir",
              str(root / "x.npy")), "is not a directory")  # fmt: skip
    rejected(("run", str(root / "t.ipuexe"), "--random-inputs", "--output-dir",
              str(root / "x.npy" / "sub")), "is a file")  # fmt: skip


@pytest.mark.skipif(ROOT, reason="root may write into read-only directories")
def test_read_only_output_directory(tiny, tmp_path):
    root, _ = tiny
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    rejected(("run", str(root / "t.ipuexe"), "--random-inputs", "--output-dir", str(ro)),
             "not writable")  # fmt: skip
    rejected(("exchange-bench", str(root / "snap.json"), "--emit-schedule", str(ro / "s.json")),
             "not writable")  # fmt: skip


@pytest.mark.parametrize("clock", [0, "fast", -5, 1.5e9, True])
def test_resigned_package_with_bad_clock(tiny, tmp_path, clock):
    root, _ = tiny
    bad = tmp_path / "clock.ipuexe"
    bad.write_bytes(edited_package(root / "t.ipuexe", lambda m: m.update(clock_hz=clock)))
    rejected(("run", str(bad), "--random-inputs"), f"{bad}: ", "clock_hz")


def test_kernel_compile_binary_source_and_cache_file(tmp_path, monkeypatch):
    (tmp_path / "bin.S").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    rejected(("kernel-compile", str(tmp_path / "bin.S")), "is binary")
    (tmp_path / "latin.S").write_bytes(b"// caf\xe9\n")
    rejected(("kernel-compile", str(tmp_path / "latin.S")), "not UTF-8")
    (tmp_path / "cache").write_text("a file")
    monkeypatch.setenv("IPU_KERNEL_CACHE", str(tmp_path / "cache"))
    template = Path(__file__).resolve().parents[2] / "src/ipu_stack/kernels/templates/gemm_amp.S"
    name = "gemm_f16_interleaved_k64_c80_r11_r12"
    _, flags, _ = cli("kernel-flags", name)
    rejected(("kernel-compile", str(template), "--name", name, "--", *flags.split()),
             "IPU_KERNEL_CACHE", "is not a directory")  # fmt: skip


@pytest.mark.parametrize("command", ["gemm 32 32 32 --tiles 4", "package-inspect {pkg} --tile 0"])
def test_closed_stdout_ends_quietly(tiny, command):
    """`| true` closes the pipe before the first write: the trace logger's (gemm) and print's."""
    root, _ = tiny
    line = command.format(pkg=root / "t.ipuexe")
    proc = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {sys.executable} -m ipu_stack.cli {line} | true"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


# -- the 20 invalid inputs accepted -------------------------------------------------------------


def test_onnx_duplicate_outputs_and_opsets(tmp_path):
    dup = model([helper.make_node("Gelu", ["x"], ["y"]), helper.make_node("Gelu", ["x"], ["y"])],
                y_shape=(8, 16))  # fmt: skip
    rejected(("onnx", save(tmp_path, dup)), "single static assignment", "'y'")
    rejected(("onnx", save(tmp_path, matmul_gelu(7))), "No Op registered for Gelu")
    rejected(("onnx", save(tmp_path, matmul_gelu(30))), "opset 30", "supported opsets are 1..")
    # valid but unusual: an opset-9 MatMul model is fine
    old = model([helper.make_node("MatMul", ["x", "W"], ["y"])], 9, inits=[W])
    code, out, err = cli("onnx", save(tmp_path, old), "--tiles", "4")
    assert code == 0 and "PASS" in out, err


def test_run_inputs_must_match_shape_and_dtype(tiny, tmp_path):
    root, ref = tiny
    x = np.load(root / "x.npy")
    pkg = str(root / "t.ipuexe")
    for name, array, needle in [
        ("t", np.ascontiguousarray(x.reshape(64, 32)), "expects shape (32, 64), got (64, 32)"),
        ("f64", x.astype(np.float64), "expects dtype float16, got float64"),
        ("i64", x.astype(np.int64), "got int64"),
        ("b", x > 0, "got bool"),
    ]:
        np.save(tmp_path / f"{name}.npy", array)
        rejected(("run", pkg, "--input", f"x={tmp_path / name}.npy"), "--input x", needle)
    code, _, err = cli("run", pkg, "--input", f"x={tmp_path / 'f64.npy'}", "--cast-inputs",
                       "--output-dir", str(tmp_path / "o"))  # fmt: skip
    assert code == 0, err
    assert np.abs(np.load(tmp_path / "o" / "y.npy") - ref).max() <= 0.02 * np.abs(ref).max()
    np.save(tmp_path / "huge.npy", np.full((32, 64), 1e6))
    rejected(("run", pkg, "--input", f"x={tmp_path / 'huge.npy'}", "--cast-inputs"),
             "overflows float16")  # fmt: skip


@pytest.mark.parametrize("shape", [[32, 128], [64, 64], [33, 64], [32, 2, 64, 1, 2]])
def test_package_with_edited_binding_shape(tiny, tmp_path, shape):
    root, _ = tiny
    bad = tmp_path / "shape.ipuexe"

    def edit(m):
        m["bindings"][0]["shape"] = shape

    bad.write_bytes(edited_package(root / "t.ipuexe", edit))
    rejected(("run", str(bad), "--random-inputs"), f"{bad}: ", "binding 'x'")


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d["phases"][0]["transfers"][0]["pieces"][0].update(send_cycle="340"),
     "'send_cycle' must be an integer, got '340'"),
    (lambda d: d["phases"][0]["transfers"][0]["pieces"][0].update(send_cycle=340.5),
     "must be an integer, got 340.5"),
    (lambda d: d.update(format="x"), "format is 'x'"),
    (lambda d: d.update(version=2), "version 2 is not supported"),
    (lambda d: d.update(phases=[]), "'phases' is empty"),
    (lambda d: d["phases"][0].pop("horizon"), "missing key 'horizon'"),
    (lambda d: d["model"].update(paired="yes"), "'paired' must be true or false"),
    (lambda d: d["phases"][0]["transfers"][0].update(first_arrivals=[]), "first_arrivals for"),
])  # fmt: skip
def test_bad_schedules(tiny, tmp_path, edit, needle):
    root, _ = tiny
    doc = json.loads((root / "sched.json").read_text())
    edit(doc)
    (tmp_path / "s.json").write_text(json.dumps(doc))
    rejected(("exchange-verify", str(root / "snap.json"), str(tmp_path / "s.json")), needle)


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d.update(version=2), "version 2 is not supported"),
    (lambda d: d.update(phases=[]), "'phases' is empty"),
    (lambda d: d.pop("version"), "missing key 'version'"),
    (lambda d: d["phases"][0]["transfers"][0].update(words="64"), "'words' must be an integer"),
])  # fmt: skip
def test_bad_snapshots(tiny, tmp_path, edit, needle):
    root, _ = tiny
    doc = json.loads((root / "snap.json").read_text())
    edit(doc)
    (tmp_path / "s.json").write_text(json.dumps(doc))
    rejected(("exchange-bench", str(tmp_path / "s.json"), "--time-budget", "0"), needle)
    rejected(("exchange-verify", str(tmp_path / "s.json"), str(root / "sched.json")), needle)


def test_valid_schedule_still_verifies(tiny):
    root, _ = tiny
    code, out, err = cli("exchange-verify", str(root / "snap.json"), str(root / "sched.json"))
    assert code == 0 and out.startswith("verified phases: "), err


# -- the 6 wrong exit codes ---------------------------------------------------------------------


@pytest.mark.parametrize("edit,needle", [
    ({"edit_manifest": lambda m: m["program"].update(steps=m["program"]["steps"][::-1])},
     "inconsistent"),
    ({"edit_manifest": lambda m: m["program"].update(steps=[m["program"]["steps"][i]
                                                             for i in (0, 2, 1)])},
     "inconsistent"),
    ({"edit_table": ("transfers", 0, 2, 0)}, "transfer 0: 0 words"),
    ({"edit_table": ("transfers", 0, 2, 2**40)}, "1099511627776 words"),
    ({"edit_table": ("pieces", 1, 0, 0)}, "do not cover"),
    # the images are what runs: an edited description no longer matches them
    ({"edit_table": ("destinations", 2, 0, 66)}, "not the one the tile images were built from"),
])  # fmt: skip
def test_inconsistent_packages_exit_2_naming_the_file(tiny, tmp_path, edit, needle):
    root, _ = tiny
    bad = tmp_path / "bad.ipuexe"
    bad.write_bytes(edited_package(root / "t.ipuexe", **edit))
    rejected(("run", str(bad), "--random-inputs"), f"{bad}: ", needle)


# -- the partial file ---------------------------------------------------------------------------


def test_full_disk_leaves_no_partial_output(tiny, tmp_path, monkeypatch):
    root, _ = tiny

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "o"
    rejected(("run", str(root / "t.ipuexe"), "--random-inputs", "--output-dir", str(out)),
             "No space left on device")  # fmt: skip
    assert not out.exists() or list(out.iterdir()) == []


# -- unclear messages ---------------------------------------------------------------------------


def test_clear_messages(tiny, tmp_path):
    root, _ = tiny
    (tmp_path / "empty.onnx").write_bytes(b"")
    rejected(("onnx", str(tmp_path / "empty.onnx")), "is an empty file")
    (tmp_path / "cut.onnx").write_bytes(matmul_gelu().SerializeToString()[:50])
    rejected(("compile", str(tmp_path / "cut.onnx"), "-o", str(tmp_path / "o.ipuexe")), "cut.onnx")
    neg = model([helper.make_node("Gelu", ["x"], ["y"])], x_shape=(-4, 16), y_shape=(8, 16))
    rejected(("onnx", save(tmp_path, neg)), "negative dimension -4 at axis 0")
    sym = model([helper.make_node("MatMul", ["x", "W"], ["y"])], x_shape=("n", 16), inits=[W])
    sym.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "n"
    path = save(tmp_path, sym)
    line = rejected(("onnx", path, "--input-shape", "x=8"), "1 dimensions given", "[n, 16]")
    assert "node0" not in line
    rejected(("onnx", path, "--input-shape", "z=8,16"), "has no graph input 'z'")
    code, out, err = cli("compile", path, "-o", str(tmp_path / "s.ipuexe"), "--tiles", "4",
                         "--input-shape", "x=8,16")  # fmt: skip
    assert code == 0, err
    rejected(("run", str(root / "t.ipuexe"), "--input", f"z={root / 'x.npy'}"),
             "--input 'z'", "its inputs: x")  # fmt: skip
    rejected(("gemm", "8", "8", "8", "--precision", "f8"), "invalid choice: 'f8'")
    code, out, _ = cli("--version")
    assert code == 0 and out.startswith("ipu-stack ")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cut.onnx",
        "empty.onnx",
        "m.onnx",
        "s.ipuexe",
    ]

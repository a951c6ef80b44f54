"""copy2d (CopyCall with rows > 1): elementwise.S EW_OP 6/7 on the emulator against semantics."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ipu_stack.errors import GraphError
from ipu_stack.kernels.kernel_run import kernel_run
from ipu_stack.kernels.registry import TEMPLATE_DIR
from ipu_stack.kernels.units import parse_copy2d
from ipu_stack.low import costs
from ipu_stack.low.program import CopyCall, Ref
from ipu_stack.runtime.emulate import EmulatedKernels
from ipu_stack.runtime.sim import SimDevice
from ipu_stack.target import ipu21

EW = TEMPLATE_DIR / "elementwise.S"


@pytest.mark.parametrize(
    ("name", "seed"),
    [
        ("copy2d_b320_r54", 0),  # nine whole runs per worker
        ("copy2d_b64_r35", 1),  # worker ranges start and end inside runs
        ("copy2d_b1088_r8", 2),  # fewer runs than workers' worth: runs split across workers
        ("copy2d_b8_r100", 3),  # one atom per run
        ("copy2d_b12_r7", 0),  # 4 mod 8 bytes: 32-bit words
        ("copy2d_b40_r9_a4", 1),  # words forced: addresses and strides 4 mod 8
        ("copy2d_b8_r2", 2),  # fewer atoms than workers: idle workers
        ("copy2d_b16_r1", 3),
    ],
)
def test_unit_matches_semantics(name, seed):
    report = kernel_run(name, seed=seed)
    assert report["ok"], report
    e = report["entries"][0]
    assert e["wrong_bytes"] == 0 and "stray_writes" not in e
    call = CopyCall(0, Ref("o"), Ref("s"), e["run_bytes"], e["runs"], e["dst_stride"],
                    e["src_stride"])  # fmt: skip
    assert e["modelled_cycles"] == costs.copy_call_cycles(call) and e["emulated_cycles"] > 0


def test_names_and_reference():
    unit = parse_copy2d("copy2d_b24_r5")
    assert unit is not None and not unit.words and unit.alignment == 8
    assert "-DEW_OP=6" in unit.flags() and "-DEW_ATOMS=3" in unit.flags()
    word = parse_copy2d("copy2d_b24_r5_a4")
    assert word is not None and word.words and "-DEW_ATOMS=6" in word.flags()
    assert parse_copy2d("copy_b24") is None
    for bad in ("copy2d_b6_r2", "copy2d_b0_r2", "copy2d_b8_r0"):
        with pytest.raises(GraphError):
            parse_copy2d(bad)
    with pytest.raises(GraphError):
        kernel_run("copy2d_b10_r3")
    # the reference is run-by-run copying, gaps untouched
    rng = np.random.default_rng(0)
    dst, src = rng.integers(0, 256, 4 * 40 + 24, np.uint8), rng.integers(0, 256, 200, np.uint8)
    got = unit.reference(dst, src, 40, 16)
    want = dst.copy()
    for r in range(5):
        want[r * 40 : r * 40 + 24] = src[r * 16 : r * 16 + 24]
    np.testing.assert_array_equal(got, want)


def _mutant(tmp_path: Path, old: str, new: str, occurrence: int = 0) -> str:
    text = EW.read_text()
    start = -1
    for _ in range(occurrence + 1):
        start = text.index(old, start + 1)
    path = tmp_path / EW.name
    path.write_text(text[:start] + new + text[start + len(old) :])
    return str(path)


def test_mutants_are_caught(tmp_path):
    # the destination stride not applied between whole runs: wrong bytes
    src = _mutant(tmp_path, " add $m3, $m3, $m6\n", " add $m3, $m3, $mzero\n")
    report = kernel_run("copy2d_b64_r35", src, seed=1)
    assert not report["ok"] and report["entries"][0]["wrong_bytes"] > 0
    # one more word per worker's last chunk: right runs, a gap byte written
    src = _mutant(tmp_path, " setzi $m8, C2_NL_\\w\n", " setzi $m8, C2_NL_\\w + 1\n")
    report = kernel_run("copy2d_b12_r7", src, seed=0)
    assert not report["ok"] and "outside the outputs" in report["entries"][0]["stray_writes"]


def _device(size: int):
    """A SimDevice with one tile holding buffers ``a`` and ``b`` (fake placement)."""
    base = ipu21.TILE_MEMORY_BASE + 0x10000
    allocs = {
        "a": SimpleNamespace(address=base, size=size, name="a", live=(0, 1)),
        "b": SimpleNamespace(address=base + size, size=size, name="b", live=(0, 1)),
    }
    placement = SimpleNamespace(allocations=[allocs])
    rng = np.random.default_rng(4)
    mem = rng.integers(0, 256, (1, ipu21.TILE_MEMORY_END - ipu21.TILE_MEMORY_BASE), np.uint8)
    return placement, mem


@pytest.mark.parametrize(
    ("call", "unit"),
    [
        (CopyCall(0, Ref("b", 8), Ref("a"), 48, 20, 64, 48), "copy2d_b48_r20"),
        (CopyCall(0, Ref("b", 4), Ref("a", 12), 48, 20, 52, 60), "copy2d_b48_r20_a4"),
        (CopyCall(0, Ref("b"), Ref("a"), 12, 9, 16, 0), "copy2d_b12_r9"),
        (CopyCall(0, Ref("a", 64), Ref("a"), 32, 10, 96, 96), "copy2d_b32_r10"),  # interleaved
    ],
)
def test_emulate_runs_rows_on_copy2d(call, unit):
    placement, mem = _device(2048)
    want = mem.copy()
    SimDevice()._simple(want, placement, call, 0)  # the semantics
    device = SimDevice()
    device.kernels = EmulatedKernels()
    assert device._emulate(mem, placement, call, 0)
    np.testing.assert_array_equal(mem, want)
    units = device.kernels.report()["emulated_units"]
    assert list(units) == [unit], units  # never the 1-D copy of `size` bytes


def test_emulate_leaves_overlapping_runs_to_the_semantics():
    placement, mem = _device(2048)
    call = CopyCall(0, Ref("a", 16), Ref("a"), 32, 10, 40, 40)  # run r reads run r - 1's bytes
    device = SimDevice()
    device.kernels = EmulatedKernels()
    assert not device._emulate(mem, placement, call, 0)
    assert device.kernels.report()["modelled_only"]["CopyCall"]["calls"] == 1

"""Tile images in the package: disassembly, segment listing, validation, --check, mutants."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ipu_stack import Package, Session
from ipu_stack.errors import PackageError, SimulationError
from ipu_stack.package.format import SEGMENT_EXEC

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ipu_stack.cli", *args], capture_output=True,
                          text=True, timeout=600)  # fmt: skip


@pytest.fixture(scope="module")
def package_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tc") / "mlp2.ipuexe"
    model = str(EXAMPLES / "mlp2.onnx")
    proc = cli("compile", model, "-o", str(path), "--tiles", "32", "--verbose")
    assert proc.returncode == 0, proc.stderr
    for phase in ("lower_exchanges", "link_runtime", "build_tile_images"):
        assert f'phase finished phase="{phase}"' in proc.stdout
    return path


def _resealed(package: Package, data: bytes | None = None, manifest=None) -> bytes:
    return Package(manifest or package.manifest, data or package.data).to_bytes()


def test_disasm_shows_gemm_calls_with_operands_and_timed_rows(package_file):
    package = Package.load(package_file)
    tile = next(t for t, *_ in package.table("rows").tolist())
    proc = cli("package-inspect", str(package_file), "--tile", str(tile), "--disasm")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "setzi reg=0 imm=" in text and "br reg=0" in text  # the entry stub
    assert "(gemm) step" in text and "$m2=0x" in text and "$m4=0x" in text
    assert "row step " in text and "sync zone=3" in text
    row_lines = [line for line in text.splitlines() if "@" in line]
    assert any("send " in line for line in row_lines) or any(
        "delayxpic" in line for line in row_lines
    )
    cycles = [int(line.split("@")[1].split()[0]) for line in row_lines]
    assert cycles and all(c >= 0 for c in cycles)
    bad = cli("package-inspect", str(package_file), "--disasm")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--tile" in bad.stderr


def test_json_lists_every_segment_with_its_file_offset(package_file):
    proc = cli("package-inspect", str(package_file), "--json")
    assert proc.returncode == 0, proc.stderr
    segments = json.loads(proc.stdout)["segments"]
    package = Package.load(package_file)
    assert len(segments) == len(package.table("segments"))
    blob = package_file.read_bytes()
    code = [s for s in segments if s["flags"] & SEGMENT_EXEC]
    assert {s["tile"] for s in code} == set(package.tiles)
    for s in code[:50]:
        data = blob[s["file_offset"] : s["file_offset"] + s["size"]]
        if s["address"] == 0x4C010:  # setzi $m0, main; br $m0
            assert int.from_bytes(data[4:8], "little") == 0x43000000
        assert len(data) == s["size"]
    assert all(s["file_offset"] is None for s in segments if s["flags"] == 3)


def test_run_check_passes_and_a_wrong_package_fails_with_exit_1(package_file, tmp_path):
    ok = cli("run", str(package_file), "--random-inputs", "--check", str(EXAMPLES / "mlp2.onnx"))
    assert ok.returncode == 0, ok.stderr
    assert "check y against onnxruntime" in ok.stdout and "PASS" in ok.stdout
    # the same model in F32: the package's F16 inputs are fed to it as F32 (exact)
    same = cli("run", str(package_file), "--random-inputs", "--check",
               str(EXAMPLES / "mlp2_f32.onnx"))  # fmt: skip
    assert same.returncode == 0 and "PASS" in same.stdout, same.stderr
    # a model whose input the package does not have: bad input, one line, exit 2
    import onnx

    wrong = onnx.load(str(EXAMPLES / "mlp2_f32.onnx"))
    name = wrong.graph.input[0].name
    wrong.graph.input[0].name = "renamed"
    for node in wrong.graph.node:
        node.input[:] = ["renamed" if i == name else i for i in node.input]
    onnx.save(wrong, str(tmp_path / "wrong.onnx"))
    other = cli(
        "run", str(package_file), "--random-inputs", "--check", str(tmp_path / "wrong.onnx")
    )
    assert other.returncode == 2 and other.stderr.count("\n") == 1, other.stderr
    # a send address moved: the package runs and --check rejects its outputs (exit 1), or the
    # moved send now reads bytes its phase receives into, a fault the run names (exit 2); the
    # first sends are tried in turn until one runs to a wrong answer
    package = Package.load(package_file)
    base = package.manifest["sections"]["images"]["offset"]
    words = np.frombuffer(package.data, "<u4")
    sends = []
    for tile, _, _, address, count in package.table("rows").tolist():
        seg = next(s for s in package.table("segments").tolist() if s[0] == tile and s[3] & 4
               and s[1] <= address < s[1] + s[2])  # fmt: skip
        at = base + seg[4] + address - seg[1]
        row = words[at // 4 : at // 4 + count]
        sends += [at + 4 * int(i) for i in np.flatnonzero((row & 0xF8000000) == 0x78000000)]
    for k in sends[:6]:
        data = bytearray(package.data)
        data[k : k + 4] = (int(words[k // 4]) ^ (1 << 3)).to_bytes(4, "little")
        wrong = tmp_path / "wrong.ipuexe"
        wrong.write_bytes(_resealed(package, bytes(data)))
        proc = cli("run", str(wrong), "--random-inputs", "--check", str(EXAMPLES / "mlp2.onnx"))
        if proc.returncode != 2:
            break
        assert "program is inconsistent" in proc.stderr and proc.stderr.count("\n") == 1
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout or proc.stderr.count("\n") == 1


def _edit_manifest(package: Package, edit) -> bytes:
    m = json.loads(json.dumps(package.manifest))
    edit(m)
    return _resealed(package, manifest=m)


def test_validation_rejects_entry_model_overlap_and_rows_outside_memory(package_file):
    package = Package.load(package_file)

    def entry(m):
        m["tile_code"]["entry"] = 0x4C018

    with pytest.raises(PackageError, match="entry 0x4c018 is not the load base 0x4c010"):
        Package.from_bytes(_edit_manifest(package, entry))

    def model(m):
        step = next(s for s in m["program"]["steps"] if s["kind"] == "exchange")
        step["schedule"]["model"]["latency"] = "none"

    with pytest.raises(PackageError, match="is not the IPU21's"):
        Package.from_bytes(_edit_manifest(package, model))

    seg = package.table("segments").copy()
    data_row = int(np.flatnonzero(seg[:, 3] == 3)[0])
    tile = seg[data_row, 0]
    code_row = int(
        np.flatnonzero((seg[:, 0] == tile) & (seg[:, 3] == 5) & (seg[:, 1] > 0x4C010))[0]
    )
    seg[data_row, 1] = seg[code_row, 1]  # a data segment moved onto the tile's code
    blob = bytearray(package.data)
    entry_ = package.manifest["sections"]["segments"]
    blob[entry_["offset"] : entry_["offset"] + entry_["size"]] = seg.astype("<i8").tobytes()
    with pytest.raises(PackageError, match=r"overlaps data|overlap"):
        Package.from_bytes(_resealed(package, bytes(blob)))

    # a row's pointer write aimed past tile memory
    words = np.frombuffer(package.data, "<u4").copy()
    base = package.manifest["sections"]["images"]["offset"] // 4
    for tile, _, _, address, count in package.table("rows").tolist():
        s = next(r for r in package.table("segments").tolist() if r[0] == tile and r[3] & 4
             and r[1] <= address < r[1] + r[2])  # fmt: skip
        at = base + (s[4] + address - s[1]) // 4
        pics = np.flatnonzero((words[at : at + count] & 0xFC000000) == 0x60000000)
        if len(pics):
            words[at + pics[0]] |= 0x3FFFF
            break
    with pytest.raises(PackageError, match="addresses outside tile memory"):
        Package.from_bytes(_resealed(package, words.tobytes()))


def test_a_corrupted_branch_faults_naming_tile_and_address(package_file):
    package = Package.load(package_file)
    words = np.frombuffer(package.data, "<u4").copy()
    base = package.manifest["sections"]["images"]["offset"] // 4
    seg = next(s for s in package.table("segments").tolist() if s[1] == 0x4C010)
    words[base + seg[4] // 4] ^= 0x4  # the stub's setzi $m0, main: main moves one word
    session = Session().load(Package.from_bytes(_resealed(package, words.tobytes())))
    session.initialize()
    with pytest.raises(SimulationError, match=r"tile \d+"):
        session.run({"x": np.zeros((64, 128), np.float16)})


def test_a_branch_to_a_misaligned_address_faults_at_the_fetch(package_file):
    package = Package.load(package_file)
    words = np.frombuffer(package.data, "<u4").copy()
    base = package.manifest["sections"]["images"]["offset"] // 4
    seg = next(s for s in package.table("segments").tolist() if s[1] == 0x4C010)
    words[base + seg[4] // 4] ^= 0x2  # the stub's setzi $m0, main: main two bytes on
    session = Session().load(Package.from_bytes(_resealed(package, words.tobytes())))
    session.initialize()
    with pytest.raises(SimulationError, match=r"tile \d+ cycle \d+: instruction fetch at 0x"):
        session.run({"x": np.zeros((64, 128), np.float16)})


def _image_words(package: Package) -> tuple[np.ndarray, int]:
    return np.frombuffer(package.data, "<u4").copy(), package.manifest["sections"]["images"][
        "offset"
    ] // 4


def _run_words(package: Package, words: np.ndarray) -> None:
    session = Session().load(Package.from_bytes(_resealed(package, words.tobytes())))
    session.initialize()
    session.run({"x": np.zeros((64, 128), np.float16)})


def test_a_stale_or_unset_operand_register_faults(package_file):
    """An ld32 whose delta register is not $m15 (it reads a register nothing set) faults, as
    does a call whose operand register was last set before the previous kernel call."""
    package = Package.load(package_file)
    words, base = _image_words(package)
    code = words[base:]
    # ld32 base=1 dst=2 delta=15 off=1 -> delta 14 (never written)
    at = int(np.flatnonzero((code & 0xFFFFF000) == 0x0112F000)[0])
    mutant = words.copy()
    mutant[base + at] = (int(code[at]) & ~0xF000) | 0xE000
    with pytest.raises(SimulationError, match=r"reads \$m14, which holds no value"):
        _run_words(package, mutant)
    # the first operand load of a later call moves to $m7: $m2 then still holds the value the
    # previous call was given (clobbered by that call)
    loads = np.flatnonzero((code & 0xFFFF0000) == 0x01120000)
    assert len(loads) > 1
    mutant = words.copy()
    mutant[base + int(loads[1])] = (int(code[loads[1]]) & ~0xF0000) | 0x70000
    with pytest.raises(SimulationError, match=r"\$m\d, which holds no value"):
        _run_words(package, mutant)


def test_a_send_delivering_to_no_receiver_faults(package_file):
    """An extra send count or a stray direction bit puts items on the fabric for no one."""
    package = Package.load(package_file)
    words, base = _image_words(package)
    rows = package.table("rows").tolist()
    sends = []
    for tile, _, _, address, count in rows:
        seg = next(s for s in package.table("segments").tolist()
                   if s[0] == tile and s[1] <= address < s[1] + s[2] and s[4] >= 0)  # fmt: skip
        first = base + (seg[4] + address - seg[1]) // 4
        for k in range(count):
            w = int(words[first + k])
            if w & 0xF8000000 == 0x78000000 and w & 3 in (1, 2):
                sends.append(first + k)
    assert sends
    for flip in (2 if int(words[sends[0]]) & 1 else 1, 1 << 26):  # sctl -> 3; count + 32
        mutant = words.copy()
        mutant[sends[0]] ^= flip
        with pytest.raises(SimulationError, match=r"no tile there receives|no sender|port"):
            _run_words(package, mutant)


def test_a_pad_send_addresses_nothing_but_a_real_send_at_zero_is_refused(package_file):
    """``send`` with sctl 0 advances without sending (facts §9.4): no address to check."""
    package = Package.load(package_file)
    words, base = _image_words(package)
    code = words[base:]
    at = base + int(np.flatnonzero((code & 0xF8000003) == 0x78000001)[0])
    for word, ok in ((0x78000000, True), (0x78000001, False)):
        mutant = words.copy()
        mutant[at] = word
        if ok:
            Package.from_bytes(_resealed(package, mutant.tobytes()))
        else:
            with pytest.raises(PackageError, match="addresses outside tile memory"):
                Package.from_bytes(_resealed(package, mutant.tobytes()))

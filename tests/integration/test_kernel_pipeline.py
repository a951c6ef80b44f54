"""Kernel pipeline end to end: CLI, cache hits, key components, SDK driver, concurrency."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ipu_stack.errors import ToolError
from ipu_stack.kernels import registry
from ipu_stack.kernels.build import KernelCompilation, compile_kernel, plan_kernels, unit_key
from ipu_stack.kernels.cache import KernelCache, cache_root
from ipu_stack.kernels.toolchain import Toolchain

DATA = Path(__file__).parents[1] / "data" / "kernels"
SEED_NAMES = (
    "gemm_f16_interleaved_packed64_k64_c64_r32_r32",
    "gemm_f16_interleaved_k64_c80_r11_r12",
)


def cli(*args, cache, env=None):
    full_env = {**os.environ, "IPU_KERNEL_CACHE": str(cache), **(env or {})}
    full_env.pop("POPLAR_SDK_ENABLED", None)
    return subprocess.run(
        [sys.executable, "-m", "ipu_stack.cli", *args],
        capture_output=True, text=True, timeout=120, env=full_env,
    )  # fmt: skip


def gemm_args(name):
    variant = registry.parse_gemm_variant(name)
    return [str(variant.source), "--name", name, "--json", "--", *variant.flags()]


def entries(root: Path):
    return sorted(p for p in root.iterdir() if len(p.name) == 64)


@pytest.mark.parametrize("name", SEED_NAMES)
def test_seed_variants_compile_without_sdk_then_hit(tmp_path, name):
    first = cli("kernel-compile", *gemm_args(name), cache=tmp_path)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report["cache"] == "miss" and report["assembled"] is False and report["object"] is None
    assert report["name"] == name
    assert set(report["symbols"]) == set(registry.parse_gemm_variant(name).entry_symbols.values())
    second = cli("kernel-compile", *gemm_args(name), cache=tmp_path)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["cache"] == "hit"
    (entry,) = entries(tmp_path)
    assert {p.name for p in entry.iterdir()} == {"kernel.S", "kernel.expanded.S", "kernel.json"}
    meta = json.loads((entry / "kernel.json").read_text())
    names = [c["name"] for c in meta["key_components"]]
    assert names[:3] == ["format", "target", "source:gemm_amp.S"]
    assert "include:include/ipu21_tile.h" in names and names[-1] == "toolchain"


def test_text_output_logs_the_seed_lines(tmp_path):
    args = [a for a in gemm_args(SEED_NAMES[1]) if a != "--json"]
    out = cli("kernel-compile", *args, cache=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f'compiling kernel source="{registry.GEMM_TEMPLATE}" name="{SEED_NAMES[1]}" ' \
        'target="ipu21"' in out.stdout  # fmt: skip
    assert "kernel cache miss" in out.stdout and "kernel artifact created object=" in out.stdout
    assert "cache miss" in out.stdout and "symbols" in out.stdout


def test_seed_failure_exits_nonzero_without_traceback_or_entry(tmp_path):
    name = "gemm_f16_interleaved_k64_c80_r11_r12"
    flags = [f"-I{DATA / 'include'}", *registry.parse_gemm_variant(name).flags()]
    out = cli("kernel-compile", str(DATA / "gemm_seed_duplicate.S"), "--name", name, "--", *flags,
              cache=tmp_path)  # fmt: skip
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert "symbol '.Lgemm_f16_amp_worker_small' is defined twice" in out.stderr
    assert out.stderr.count("gemm_seed_duplicate.S:27") == 2  # first site, both workers
    assert out.stderr.count("gemm_seed_duplicate.S:29") == 2  # second site
    assert f"kernel {name}" in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("ipu-stack: error: kernel build failed")
    assert not tmp_path.exists() or entries(tmp_path) == []
    assert not [p for p in tmp_path.glob(".tmp-*")]


def test_missing_source_is_bad_input_with_one_line(tmp_path):
    out = cli("kernel-compile", str(tmp_path / "absent.S"), cache=tmp_path / "c")
    assert out.returncode == 2
    assert (
        out.stderr.strip() == f"ipu-stack: error: kernel source {tmp_path / 'absent.S'} not "
        "found (expected an assembly template .S)"
    )
    assert not (tmp_path / "c").exists() or entries(tmp_path / "c") == []


def test_changing_only_an_included_file_changes_the_key(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for f in ("ok_with_include.S", "tile_defs.h"):
        (src / f).write_bytes((DATA / f).read_bytes())
    unit = KernelCompilation("tiny", src / "ok_with_include.S", ())
    tools = Toolchain(None)
    before, comps = unit_key(unit, tools)
    assert "include:tile_defs.h" in [c.name for c in comps]
    (src / "tile_defs.h").write_text("#define TINY_VALUE 8\n")
    after, _ = unit_key(unit, tools)
    assert after != before
    cache = KernelCache(tmp_path / "cache")
    artifact, _ = compile_kernel(unit, tools, cache)
    assert not artifact.cache_hit and artifact.key == after
    assert "setzi $m0, 8" in (artifact.entry / "kernel.expanded.S").read_text()


def test_corrupt_or_partial_entry_is_rebuilt(tmp_path):
    variant = registry.parse_gemm_variant(SEED_NAMES[0])
    unit = KernelCompilation(variant.name, variant.source, tuple(variant.flags()))
    cache, tools = KernelCache(tmp_path), Toolchain(None)
    good, _ = compile_kernel(unit, tools, cache)
    (good.entry / "kernel.S").write_text("truncated")
    again, _ = compile_kernel(unit, tools, cache)
    assert not again.cache_hit and cache.lookup(again.key) is not None
    (again.entry / "kernel.json").unlink()  # a partial entry (no metadata)
    third, _ = compile_kernel(unit, tools, cache)
    assert not third.cache_hit
    assert compile_kernel(unit, tools, cache)[0].cache_hit


def test_cache_root_resolution(tmp_path):
    assert cache_root({"IPU_KERNEL_CACHE": "/a"}) == Path("/a")
    assert cache_root({"XDG_CACHE_HOME": "/x"}) == Path("/x/ipu-stack/kernels")
    assert cache_root({}) == Path.home() / ".cache" / "ipu-stack" / "kernels"


FAKE_POPC = """#!{python}
import sys
args = sys.argv[1:]
if "--fail" in " ".join(args) or {fail}:
    sys.stderr.write("gemm_amp.S:12: error: fake assembler failure\\n")
    sys.exit(3)
out = args[args.index("-o") + 1]
open(out, "wb").write(b"GP" + " ".join(args).encode())
"""
FAKE_OBJDUMP = """#!{python}
import struct, sys
what, target, gp = sys.argv[1:4]
assert target == "ipu21"
if what == "extract":
    header = b"\\x7fELF" + bytes([1, 1, 1]) + bytes(9) + struct.pack("<HH", 1, 0xF8)
    sys.stdout.buffer.write(header + bytes(32))
else:
    sys.stdout.write('{{"fake": true}}')
"""


def fake_sdk(root: Path, fail: bool = False) -> Path:
    (root / "bin").mkdir(parents=True)
    for name, text in (("popc", FAKE_POPC), ("pop-objdump", FAKE_OBJDUMP)):
        tool = root / "bin" / name
        tool.write_text(text.format(python=sys.executable, fail=fail))
        tool.chmod(0o755)
    return root


def test_sdk_path_runs_popc_and_objdump_and_caches_the_object(tmp_path):
    sdk = fake_sdk(tmp_path / "sdk")
    args = gemm_args(SEED_NAMES[1])
    out = cli("kernel-compile", *args[:3], "--sdk", str(sdk), *args[3:], cache=tmp_path / "c")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["assembled"] is True and report["cache"] == "miss"
    entry = Path(report["entry"])
    assert {"kernel.o", "kernel.gp", "popc-metadata.json", "kernel.json"} <= {
        p.name for p in entry.iterdir()
    }
    gp = (entry / "kernel.gp").read_bytes()
    assert b"--target ipu21 -O2 -DGEMM_INNER_BLOCK_DIMENSION=64" in gp
    env_run = cli("kernel-compile", *args, cache=tmp_path / "c",
                  env={"POPLAR_SDK_ENABLED": str(sdk)})  # fmt: skip
    assert env_run.returncode == 0  # the env var is popped by cli(): check-only, another key
    assert json.loads(env_run.stdout)["assembled"] is False


def test_sdk_tool_failure_raises_tool_error_with_repro_and_leaves_no_entry(tmp_path):
    sdk = fake_sdk(tmp_path / "sdk", fail=True)
    variant = registry.parse_gemm_variant(SEED_NAMES[1])
    unit = KernelCompilation(variant.name, variant.source, tuple(variant.flags()))
    cache = KernelCache(tmp_path / "c")
    with pytest.raises(ToolError) as info:
        compile_kernel(unit, Toolchain.discover(str(sdk)), cache)
    err = info.value
    assert err.tool == "popc" and err.status == 3
    assert "fake assembler failure" in err.stderr
    assert err.repro.startswith(f"{sdk}/bin/popc --target ipu21 -O2 ")
    assert str(variant.source) in err.repro
    assert entries(cache.root) == [] and not list(cache.root.glob(".tmp-*"))
    out = cli("kernel-compile", *gemm_args(SEED_NAMES[1])[:3], "--sdk", str(sdk), "--",
              *variant.flags(), cache=tmp_path / "c")  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "popc exited with status 3" in out.stderr and "repro:" in out.stderr


def test_missing_sdk_tools_are_a_tool_error(tmp_path):
    with pytest.raises(ToolError, match="not found or not executable"):
        Toolchain.discover(str(tmp_path))


def test_ten_concurrent_compiles_leave_one_valid_entry_per_key(tmp_path):
    cache = tmp_path / "shared"
    env = {**os.environ, "IPU_KERNEL_CACHE": str(cache)}
    env.pop("POPLAR_SDK_ENABLED", None)
    command = [sys.executable, "-m", "ipu_stack.cli", "kernel-compile"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "env": env}
    procs = [
        subprocess.Popen([*command, *gemm_args(SEED_NAMES[i % 2])], **pipes) for i in range(10)
    ]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    assert [rc for rc, _, _ in results] == [0] * 10, [err for _, _, err in results]
    reports = [json.loads(out) for _, out, _ in results]
    assert {r["key"] for r in reports} == {e.name for e in entries(cache)}
    assert len(entries(cache)) == 2
    store = KernelCache(cache)
    assert all(store.lookup(e.name) is not None for e in entries(cache))
    assert not list(cache.glob(".tmp-*"))
    misses = sum(r["cache"] == "miss" for r in reports)
    print(f"10 concurrent kernel-compile processes: {misses} misses, {10 - misses} hits")
    assert 2 <= misses <= 10


def test_plan_kernels_pairs_row_counts_per_shape():
    from ipu_stack.low.program import GemmCall, Ref
    from ipu_stack.target.ipu21 import F16, F32

    def call(rows, k=64, c=80, prec=F16, weights="interleaved"):
        return GemmCall(0, Ref("o"), Ref("l"), Ref("r"), rows, k, c, prec, False, weights)

    units = plan_kernels([call(11), call(12), call(11), call(32, c=64), call(5), call(7, prec=F32)])
    names = [u.name for u in units]
    assert names == [
        "gemm_f16_interleaved_k64_c64_r32_r32",
        "gemm_f16_interleaved_k64_c80_r5_r11",
        "gemm_f16_interleaved_k64_c80_r12_r12",
        "gemm_f32_interleaved_k64_c80_r7_r7",
    ]
    assert units[-1].source is not None and units[-1].source.name == "gemm_f32.S"

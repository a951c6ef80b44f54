"""Profiles: capture on the simulator, the .ipuprof file, query, barriers, Chrome trace.

The checks here share no code with the capture: they compare the profile with the
simulator's own per-step clocks (``Session.profile``) and with the package's exchange tables.
"""

from __future__ import annotations

import itertools
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ipu_stack import Session, SimDevice
from ipu_stack.cli import main as cli_main
from ipu_stack.errors import ProfileError
from ipu_stack.graph.onnx_import import import_onnx
from ipu_stack.package.assemble import assemble_package
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.profile import format as profile_format
from ipu_stack.profile.chrome import trace_events

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SYNC = 600  # cycles of a sync on the IPU21 (facts §10.2)


def main(capsys, *args: str) -> tuple[int, str, str]:
    """The CLI in this process (fast): exit code, stdout, stderr."""
    try:
        code = cli_main(list(args))
    except SystemExit as stop:
        code = int(stop.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ipu_stack.cli", *args], capture_output=True,
                          text=True, timeout=600)  # fmt: skip


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """mlp2 on 32 tiles: the package file, a session after a profiled run, the profile file."""
    out = tmp_path_factory.mktemp("profiled")
    graph, bindings = import_onnx(EXAMPLES / "mlp2.onnx")
    names = {v.name: k for k, v in bindings.inputs.items()}
    names.update({v.name: k for k, v in bindings.outputs.items()})
    package = assemble_package(build(graph, BuildConfig(tiles=32)), bindings.parameters,
                               names=names)  # fmt: skip
    package.save(out / "mlp2.ipuexe")
    session = Session(SimDevice()).load(out / "mlp2.ipuexe")
    session.initialize()
    x = np.random.default_rng(0).uniform(-1, 1, (64, 128)).astype(np.float16)
    session.run({"x": x}, profile=out / "mlp2.ipuprof")
    return out, session, x


def check_against_simulator(profile, session) -> None:
    """Independent check: each tile's clock at every step end, and its busy compute cycles."""
    end_cycles = session.profile.end_cycles  # [step, tile], the simulator's record
    seg = profile.tables["segments"]
    execs = profile.tables["executions"]
    assert profile.cycles == session.last_run.cycles
    for e, (step, _, _, _) in enumerate(execs.tolist()):
        mine = seg[seg[:, 1] == e]
        ends = np.zeros(profile.tile_count, np.int64)
        np.maximum.at(ends, mine[:, 0], mine[:, 3])
        touched = np.unique(mine[:, 0])
        want = end_cycles[step, touched]
        if e == len(execs) - 1:  # after its last step a tile idles until the run ends
            tail = mine[(mine[:, 4] == 3) & (mine[:, 3] == profile.cycles)]
            waits = dict(zip(tail[:, 0].tolist(), tail[:, 2].tolist(), strict=True))
            got_ends = ends[touched].tolist()
            for t, w, got in zip(touched.tolist(), want.tolist(), got_ends, strict=True):
                assert got == w or (got == profile.cycles and waits.get(t) == w), f"tile {t}"
            continue
        assert np.array_equal(ends[touched], want), f"step {step}"
    for tile in range(profile.tile_count):
        mine = seg[seg[:, 0] == tile]
        assert (mine[:, 3] - mine[:, 2]).sum() == profile.cycles
    compute = seg[seg[:, 4] == 0]
    step_cycles = session.profile.step_cycles()
    kinds = session.profile.kinds
    busy = np.zeros_like(step_cycles)
    np.add.at(busy, (execs[compute[:, 1], 0], compute[:, 0]), compute[:, 3] - compute[:, 2])
    for step, kind in enumerate(kinds):
        if kind == "compute":  # a tile's compute time is its whole step (no waiting inside)
            assert np.array_equal(busy[step], step_cycles[step]), f"compute step {step}"


def test_profile_agrees_with_the_simulator_and_the_package(profiled):
    out, session, _ = profiled
    profile = profile_format.load(out / "mlp2.ipuprof")
    check_against_simulator(profile, session)
    assert session.last_profile is not None
    # exchange intervals against the package's own tables
    package = session.package
    pieces = package.table("pieces")
    transfers = package.table("transfers")
    dests = package.table("destinations")
    intervals = profile.tables["intervals"]
    assert (intervals[:, 2] == 0).sum() == len(pieces)  # one send interval per piece
    fanout = np.diff(np.append(transfers[:, 4], len(dests)))
    assert (intervals[:, 2] == 1).sum() == int(fanout[pieces[:, 0]].sum())
    recorded = dests[:, 2] >= 0
    if recorded.any():  # the scheduler's first arrivals are where receive intervals start
        starts = set(intervals[intervals[:, 2] == 1, 3].tolist())
        assert set(dests[recorded, 2].tolist()) <= starts
    steps = package.manifest["program"]["steps"]
    horizons = [s["schedule"]["horizon"] for s in steps if s["kind"] == "exchange"]
    assert profile.column("phases", "horizon").tolist() == horizons
    assert (profile.column("phases", "lower_bound") <= profile.column("phases", "horizon")).all()
    assert len(profile.tables["allocations"]) == len(package.table("allocations"))


def test_the_independent_check_catches_a_shifted_segment(profiled):
    out, session, _ = profiled
    profile = profile_format.load(out / "mlp2.ipuprof")
    seg = profile.tables["segments"]
    # the last compute segment of a step one cycle short, the tile's next step a cycle longer
    last = (seg[:-1, 4] == 0) & (seg[1:, 0] == seg[:-1, 0]) & (seg[1:, 1] != seg[:-1, 1])
    i = int(np.flatnonzero(last)[0])
    seg[i, 3] -= 1
    seg[i + 1, 2] -= 1
    with pytest.raises(AssertionError):
        check_against_simulator(profile, session)


def test_capture_is_deterministic(profiled, tmp_path):
    out, session, x = profiled
    session.run({"x": x}, profile=tmp_path / "again.ipuprof")
    assert (tmp_path / "again.ipuprof").read_bytes() == (out / "mlp2.ipuprof").read_bytes()


def test_bad_profile_files_exit_2_with_one_line(profiled, tmp_path, capsys):
    out, *_ = profiled
    data = (out / "mlp2.ipuprof").read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x10
    version = bytearray(data)
    version[8:12] = struct.pack("<I", 9)
    cases = {
        "truncated": (data[:-100], "is truncated: the header announces"),
        "flipped": (bytes(flipped), "content digest mismatch"),
        "version": (bytes(version), "format version 9 is not supported"),
        "text": (b"hello", "is truncated"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / f"{name}.ipuprof"
        path.write_bytes(content)
        for command in ("profile-query", "profile-barriers", "profile-export"):
            extra = (
                ("--chrome-trace", str(tmp_path / "t.json")) if command == "profile-export" else ()
            )
            code, stdout, stderr = main(capsys, command, str(path), *extra)
            assert code == 2, (name, stderr)
            assert message in stderr and stderr.count("\n") == 1, stderr
            assert stdout == ""
    proc = cli("profile-render", str(tmp_path / "flipped.ipuprof"), "-o", str(tmp_path / "r.html"))
    assert proc.returncode == 2 and "content digest mismatch" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "t.json").exists()
    code, _, stderr = main(capsys, "profile-query", str(tmp_path / "missing.ipuprof"))
    assert code == 2 and "not found" in stderr


def test_a_consistent_looking_but_wrong_file_is_rejected(profiled):
    out, *_ = profiled
    profile = profile_format.load(out / "mlp2.ipuprof")
    profile.tables["segments"][5, 3] += 7  # overlaps the tile's next segment
    with pytest.raises(ProfileError, match="gap or overlap"):
        profile_format.decode(profile_format.encode(profile))
    profile = profile_format.load(out / "mlp2.ipuprof")
    profile.tables["segments"][0, 9] += 1
    with pytest.raises(ProfileError, match="phase cycles sum to"):
        profile_format.decode(profile_format.encode(profile))


def test_cli_run_profile_query_barriers_export(profiled, tmp_path, capsys):
    out, *_ = profiled
    prof = tmp_path / "cli.ipuprof"
    run = cli("run", str(out / "mlp2.ipuexe"), "--random-inputs", "--profile", str(prof),
              "--json")  # fmt: skip
    assert run.returncode == 0, run.stderr
    cycles = json.loads(run.stdout)["simulated_cycles"]
    for group in ("kind", "kernel", "operation", "phase", "tile"):
        code, stdout, stderr = main(capsys, "profile-query", str(prof), "--group-by", group,
                                    "--json")  # fmt: skip
        assert code == 0, stderr
        result = json.loads(stdout)
        assert sum(r["phase_cycles"] for r in result["rows"]) == cycles == result["cycles"]
        assert result["total"]["work_cycles"] == cycles * 32
    kinds = {r["name"]: r for r in json.loads(main(capsys, "profile-query", str(prof),
                                                   "--json")[1])["rows"]}  # fmt: skip
    exchanges = len(json.loads(main(capsys, "profile-barriers", str(prof), "--json")[1]))
    assert exchanges > 0 and kinds["sync"]["phase_cycles"] == SYNC * exchanges
    assert kinds["compute"]["count"] > 0 and kinds["exchange"]["bytes"] > 0
    code, stdout, _ = main(capsys, "profile-query", str(prof), "--group-by", "kernel",
                           "--limit", "2", "--sort-by", "work-cycles")  # fmt: skip
    assert code == 0 and f"the run: {cycles:,} simulated cycles" in stdout
    assert "more groups" in stdout and len(stdout.splitlines()) == 6
    code, stdout, _ = main(capsys, "profile-query", str(prof), "--tile", "0", "--kind",
                           "compute", "--json")  # fmt: skip
    assert code == 0 and json.loads(stdout)["total"]["count"] > 0
    code, _, stderr = main(capsys, "profile-query", str(prof), "--tile", "99999")
    assert code == 2 and "tile 99999 is not in the profile" in stderr
    code, _, stderr = main(capsys, "profile-query", str(prof), "--phase", "999")
    assert code == 2 and "phase 999 is not in the profile" in stderr
    code, stdout, _ = main(capsys, "profile-barriers", str(prof))
    assert code == 0 and "late tile" in stdout and "vs bound" in stdout
    trace = tmp_path / "trace.json"
    code, stdout, _ = main(capsys, "profile-export", str(prof), "--chrome-trace", str(trace))
    assert code == 0 and "slices" in stdout
    assert json.loads(trace.read_text())["traceEvents"]


def check_chrome_trace(trace: dict) -> int:
    """Structural check of trace-event JSON; returns the slice count."""
    events = trace["traceEvents"]
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    slices = [e for e in events if e["ph"] == "X"]
    by_track: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in slices:
        assert {"name", "ts", "dur", "pid", "tid"} <= set(e) and e["dur"] >= 0 and e["ts"] >= 0
        assert (e["pid"], e["tid"]) in named
        by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():  # slices of one track never overlap (no broken nesting)
        spans.sort()
        assert all(b[0] >= a[1] - 1e-4 for a, b in itertools.pairwise(spans))
    return len(slices)


def _trace_processor():
    """The perfetto package's TraceProcessor when its binary is present, else a skip reason."""
    tp = pytest.importorskip("perfetto.trace_processor", reason="perfetto is not installed")
    import os

    binary = os.environ.get("IPU_STACK_TRACE_PROCESSOR")
    cached = sorted(Path.home().glob(".local/share/perfetto/prebuilts/trace_processor_shell*"))
    cached = [p for p in cached if p.suffix != ".tmp" and p.stat().st_size > 0]
    if not binary and not cached:
        return tp, None
    return tp, binary or str(cached[0])


def test_chrome_trace_structure(profiled, tmp_path):
    out, *_ = profiled
    profile = profile_format.load(out / "mlp2.ipuprof")
    busy = int((profile.column("segments", "kind") != 3).sum())
    trace = trace_events(profile)
    assert check_chrome_trace(trace) == busy
    grouped = trace_events(profile, tiles_per_track=8)
    assert 0 < check_chrome_trace(grouped) <= 4 * len(profile.tables["executions"])
    broken = json.loads(json.dumps(trace))
    xs = [e for e in broken["traceEvents"] if e["ph"] == "X"]
    same = [e for e in xs if (e["pid"], e["tid"]) == (xs[0]["pid"], xs[0]["tid"])]
    same[1]["ts"] = same[0]["ts"]  # the structural check catches overlapping slices
    with pytest.raises(AssertionError):
        check_chrome_trace(broken)


def test_trace_processor_counts_the_slices(profiled, tmp_path):
    out, *_ = profiled
    profile = profile_format.load(out / "mlp2.ipuprof")
    busy = int((profile.column("segments", "kind") != 3).sum())
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace_events(profile)))
    tp, binary = _trace_processor()
    if binary is None:
        pytest.skip(
            "perfetto's trace_processor_shell binary is not available (the perfetto package "
            "downloads it on first use, and no registry ships it; set IPU_STACK_TRACE_PROCESSOR "
            "to a binary); test_chrome_trace_structure checks the trace without it"
        )
    config = tp.TraceProcessorConfig(bin_path=binary)
    with tp.TraceProcessor(trace=str(path), config=config) as processor:
        count = processor.query("select count(*) as n from slice").as_pandas_dataframe()["n"][0]
    assert int(count) == busy


# -- the HTML report in a real browser ----------------------------------------------------------
BROWSER_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1400,1000", "--virtual-time-budget=20000", "--enable-logging=stderr", "--v=0",
)  # fmt: skip
COMPUTE_RGB = (0x3B, 0x6F, 0xB6)  # the page's compute colour
EXCHANGE_RGB = (0xE8, 0x81, 0x2A)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("chromium is not installed (.ci/run installs Debian's chromium when root)")


def browse(page: Path, tmp: Path, *mode: str) -> subprocess.CompletedProcess[str]:
    """Open ``page`` in headless Chromium with a fresh profile directory."""
    profile_dir = tmp / f"chromium-{len(list(tmp.iterdir()))}"
    profile_dir.mkdir()
    return subprocess.run(
        [_chromium(), *BROWSER_FLAGS, f"--user-data-dir={profile_dir}", *mode, page.as_uri()],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def read_png(path: Path) -> np.ndarray:
    """A screenshot as an RGB array [rows, cols, 3]."""
    image = pytest.importorskip("PIL.Image", reason="Pillow is not installed")
    with image.open(path) as shot:
        return np.asarray(shot.convert("RGB"))


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if "CONSOLE" in line and ("rror" in line or "Uncaught" in line)]  # fmt: skip


def test_report_opens_in_chromium_and_draws_the_timeline(profiled, tmp_path, capsys):
    _chromium()
    out, *_ = profiled
    page = tmp_path / "report.html"
    code, stdout, stderr = main(
        capsys, "profile-render", str(out / "mlp2.ipuprof"), "-o", str(page)
    )
    assert code == 0 and "self-contained" in stdout, stderr
    text = page.read_text()
    assert "<script src" not in text and "<link" not in text and "http://" not in text
    dom = browse(page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-status="ready"' in dom.stdout and 'data-errors="0"' in dom.stdout, dom.stdout[:500]
    assert "<td>Gemm_5/gemm</td>" in dom.stdout  # the per-operation table
    assert not _console_errors(dom.stderr), _console_errors(dom.stderr)
    shot = tmp_path / "report.png"
    done = browse(page, tmp_path, f"--screenshot={shot}")
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    assert not _console_errors(done.stderr)
    pixels = read_png(shot)
    timeline = pixels[100:560, 90:1350]  # the canvas, below the 56-px header and the buttons
    compute = (timeline == COMPUTE_RGB).all(axis=2).mean()
    exchange = (timeline == EXCHANGE_RGB).all(axis=2).mean()
    assert compute > 0.2 and exchange > 0.01, (compute, exchange)
    assert len(np.unique(timeline.reshape(-1, 3), axis=0)) > 3  # not blank, not one colour


def test_browser_check_catches_a_broken_page(profiled, tmp_path):
    _chromium()
    out, *_ = profiled
    from ipu_stack.profile.render import render_html

    html = render_html(profile_format.load(out / "mlp2.ipuprof"))
    page = tmp_path / "broken.html"
    page.write_text(html.replace("ctx.fillRect(xa, y,", "ctx.fillRectangle(xa, y,"))
    dom = browse(page, tmp_path, "--dump-dom")
    assert 'data-status="ready"' not in dom.stdout and 'data-errors="0"' not in dom.stdout


def test_a_loop_is_profiled_once_per_iteration():
    from ipu_stack import BuildConfig as Config
    from ipu_stack import ComputeGraph, build_package

    g = ComputeGraph()
    x = g.host_input("x", (32, 32), "f32")
    w = g.parameter("W", (3, 32, 32), "f32")
    g.set_outputs(g.repeat(3, x, [], [w], lambda sg, c, inv, it: sg.gelu(sg.gemm(c, it[0]))))
    rng = np.random.default_rng(0)
    weights = {"W": (rng.uniform(-1, 1, (3, 32, 32)) * 0.2).astype(np.float32)}
    session = Session(SimDevice()).load(build_package(g, Config(tiles=8), weights))
    session.initialize()
    session.run({"x": rng.uniform(-1, 1, (32, 32)).astype(np.float32)}, profile=True)
    profile = profile_format.decode(profile_format.encode(session.last_profile))  # validated
    steps = session.package.manifest["program"]["steps"]
    loops = [s for s in steps if s["kind"] == "repeat"]
    assert len(loops) == 1 and loops[0]["count"] == 3
    body = loops[0]["length"]
    executions = profile.tables["executions"]
    assert len(executions) == len(steps) - 1 + 2 * body  # the body runs 3 times
    assert sorted(set(profile.column("executions", "iteration").tolist())) == [0, 1, 2]
    assert int(profile.column("segments", "phase_cycles").sum()) == session.last_run.cycles
    # the simulator keeps each step's last iteration: the profile's last iteration agrees
    last = {int(s): e for e, s in enumerate(profile.column("executions", "step").tolist())}
    seg = profile.tables["segments"]
    for step, e in last.items():
        mine = seg[seg[:, 1] == e]
        ends = np.zeros(profile.tile_count, np.int64)
        np.maximum.at(ends, mine[:, 0], mine[:, 3])
        touched = np.unique(mine[:, 0])
        assert np.array_equal(ends[touched], session.profile.end_cycles[step, touched])

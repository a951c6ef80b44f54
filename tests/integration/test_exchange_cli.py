"""Snapshot and schedule files, ``ipu-stack exchange-bench`` and ``exchange-verify``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ipu_stack.cli import main
from ipu_stack.exchange.bench import FIELDS
from ipu_stack.exchange.patterns import multicast_groups_phase, permutation_sum_phase
from ipu_stack.exchange.snapshot import read_schedule, read_snapshot, write_snapshot

A = 0x586E0
R = 0x80000


def snapshot(phases: list[dict[str, Any]], tile_count: int = 1472) -> dict[str, Any]:
    return {
        "format": "ipu-stack-exchange-snapshot",
        "version": 1,
        "tile_count": tile_count,
        "phases": phases,
    }


def transfer(source: int, dests: list[int], words: int = 8, **extra: Any) -> dict[str, Any]:
    return {
        "source": source,
        "source_address": A,
        "destinations": [[d, R] for d in dests],
        "words": words,
        "width": "word32",
        **extra,
    }


@pytest.fixture
def snapshot_file(tmp_path: Path) -> Path:
    import numpy as np

    path = tmp_path / "snap.json.gz"
    phases = [
        (3, multicast_groups_phase(4, 32, tile_count=64)),
        (7, permutation_sum_phase(np.random.default_rng(0), 3, tile_count=64)),
    ]
    write_snapshot(path, phases, 64)
    return path


def test_snapshot_round_trip(snapshot_file: Path) -> None:
    tile_count, phases = read_snapshot(snapshot_file)
    assert tile_count == 64
    assert [pid for pid, _ in phases] == [3, 7]
    assert len(phases[0][1].transfers) == 64


def test_bench_json_schedules_verifies_and_emits(
    snapshot_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "schedule.json"
    assert (
        main(
            [
                "exchange-bench",
                str(snapshot_file),
                "--json",
                "--time-budget",
                "0.5",
                "--emit-schedule",
                str(out),
            ]
        )
        == 0
    )
    records = json.loads(capsys.readouterr().out)
    assert [r["phase"] for r in records] == [3, 7]
    for record in records:
        assert set(FIELDS) <= set(record)
        assert record["strongest_lower_bound"] <= record["selected_horizon"]
        assert record["selected_horizon"] <= record["initial_horizon"]
        assert record["lower_bound_gap"] == (
            record["selected_horizon"] - record["strongest_lower_bound"]
        )
    schedules = read_schedule(out)
    assert sorted(schedules) == [3, 7]
    assert main(["exchange-verify", str(snapshot_file), str(out)]) == 0
    assert "verified phases: 3 7" in capsys.readouterr().out
    # A tampered schedule is rejected with the phase named.
    document = json.loads(out.read_text())
    piece = document["phases"][1]["transfers"][0]["pieces"][0]
    piece["send_cycle"] += 1
    out.write_text(json.dumps(document))
    assert main(["exchange-verify", str(snapshot_file), str(out)]) == 1
    assert "ipu-stack: error: phase 7: " in capsys.readouterr().err


def test_bench_text_and_phase_filter(
    snapshot_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "exchange-bench",
                str(snapshot_file),
                "--phase",
                "7",
                "--time-budget",
                "0",
                "--latency",
                "none",
                "--disable",
                "sram_hazards",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("phase=7 transfers=192 ")
    assert 'selected_kind="' in lines[0] and "tight_bound=" in lines[0]
    assert main(["exchange-bench", str(snapshot_file), "--phase", "9"]) == 2
    assert "has no phase 9" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            snapshot(
                [
                    {
                        "phase": 4,
                        "transfers": [
                            {
                                "source": 1,
                                "source_address": A,
                                "words": 8,
                                "destinations": [[2, R]],
                                "width": "word32",
                            },
                            {"source_address": A, "words": 8, "destinations": [[2, R]]},
                        ],
                    }
                ]
            ),
            "phase 4 transfer 1: missing key 'source'",
        ),
        (
            snapshot([{"phase": 2, "transfers": [transfer(1, [2]), transfer(5, [1500])]}]),
            "phase 2 transfer 1: destination tile 1500 outside 0..1471",
        ),
        (
            snapshot([{"phase": 0, "transfers": [transfer(1, [2], words=0)]}]),
            "phase 0 transfer 0: words must be positive",
        ),
        (
            snapshot(
                [{"phase": 6, "transfers": [transfer(1, [2]), transfer(1, [3]), transfer(9, [9])]}]
            ),
            "phase 6 transfer 2: destination tile 9 is the source",
        ),
        (
            snapshot([{"phase": 1, "transfers": [transfer(1, [2], words="8")]}]),
            "phase 1 transfer 0: 'words' must be an integer",
        ),
        (
            snapshot(
                [{"phase": 1, "transfers": [transfer(1, [8, 10], width="paired64", words=7)]}]
            ),
            "phase 1 transfer 0: paired64 needs an even word count",
        ),
        (snapshot([{"transfers": []}]), "phase entry 0: missing key 'phase'"),
        (
            {k: v for k, v in snapshot([]).items() if k != "tile_count"},
            "snapshot: missing key 'tile_count'",
        ),
    ],
)
def test_malformed_snapshots_exit_2_naming_phase_and_transfer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], document: dict[str, Any], message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    assert main(["exchange-bench", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_unreadable_snapshot_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    assert main(["exchange-bench", str(path)]) == 2
    assert "is not JSON" in capsys.readouterr().err
    assert main(["exchange-bench", str(tmp_path / "missing.json")]) == 2


def test_gemm_exports_its_exchange_phases(tmp_path: Path) -> None:
    path = tmp_path / "gemm.json"
    assert (
        main(
            [
                "gemm",
                "96",
                "128",
                "64",
                "--tiles",
                "32",
                "--json",
                "--export-exchange-snapshot",
                str(path),
            ]
        )
        == 0
    )
    tile_count, phases = read_snapshot(path)
    assert tile_count == 1472 and phases
    assert all(phase.transfers for _, phase in phases)


def test_bench_preempts_multicasts_unless_told_not_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np

    from ipu_stack.exchange.patterns import multicast_phase

    path = tmp_path / "multicast.json"
    write_snapshot(path, [(0, multicast_phase(np.random.default_rng(0), 150, tile_count=128))], 128)
    runs = {}
    for pieces in ("1", "8"):
        out = tmp_path / f"schedule{pieces}.json"
        arguments = ["exchange-bench", str(path), "--json", "--time-budget", "0.5"]
        arguments += ["--max-pieces", pieces, "--emit-schedule", str(out)]
        assert main(arguments) == 0
        (runs[pieces],) = json.loads(capsys.readouterr().out)
        assert main(["exchange-verify", str(path), str(out)]) == 0
        capsys.readouterr()
    one, preempted = runs["1"], runs["8"]
    assert one["pieces"] == one["transfers"] == 150
    assert one["selected_kind"] != "preemptive-fit"
    # Cut into pieces, the multicasts end earlier; the bound is one that holds under preemption.
    assert preempted["selected_kind"] == "preemptive-fit"
    assert preempted["pieces"] > 150
    assert preempted["selected_horizon"] < one["selected_horizon"]
    assert preempted["tight_bound"] in ("endpoint", "sram-element", "latency-endpoint")
    assert preempted["strongest_lower_bound"] <= preempted["selected_horizon"]
    with pytest.raises(SystemExit) as exit_info:
        main(["exchange-bench", str(path), "--max-pieces", "0"])
    assert exit_info.value.code == 2
    assert "pieces per transfer must be at least 1, got 0" in capsys.readouterr().err

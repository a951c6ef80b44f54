"""The exchange-scheduling benchmark set: horizon / strongest lower bound, and seconds.

Usage::

    python benchmarks/exchange.py [--time-budget S] [--only SUBSTRING] [--out results.json]
                                  [--write-snapshots DIR]

The set (all on 1,472 tiles, under the full IPU21 model: time_to_mux latency, paired 64-bit
transfers, memory-order dependencies, SRAM-element hazards, full duplex):

- generated phases (fixed seeds, `ipu_stack.exchange.patterns`): random unicast, skewed toward
  hot receivers, sums of permutations (equal chunks per permutation, or sized by receiver as a
  reduce-scatter), multicast with fan-out 2-16, GEMM-style multicast groups, paired-64
  multicasts to complete physical pairs, a paired moved GEMM operand whose senders are also
  receivers, and some of these again with forwarded data and buffer
  reuse (memory-order dependencies), 1,000-12,000 transfers each;
- every phase of the snapshots in `benchmarks/exchange_snapshots/`, exported from our own GEMM
  builds with ``ipu-stack gemm M K N --export-exchange-snapshot``.

Each phase is scheduled with the default time budget (or ``--time-budget``), checked by the
independent verifier, and recorded with its ratio ``selected_horizon / strongest_lower_bound``.
``seconds`` is scheduling plus verification. Times are wall-clock on whatever machine runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.exchange import patterns
from ipu_stack.exchange.model import IPU21_MODEL, ExchangePhase
from ipu_stack.exchange.scheduler import DEFAULT_TIME_BUDGET, optimize_phase
from ipu_stack.exchange.snapshot import read_snapshot, write_snapshot
from ipu_stack.exchange.verify import verify_schedule
from ipu_stack.target.ipu21 import TILES

SNAPSHOTS = Path(__file__).resolve().parent / "exchange_snapshots"


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


#: Generated phases: name -> maker (each with its own fixed seed).
GENERATED: dict[str, Callable[[], ExchangePhase]] = {
    "random-unicast-5000": lambda: patterns.random_unicast_phase(_rng(1), 5000),
    "random-unicast-12000": lambda: patterns.random_unicast_phase(_rng(2), 12000),
    "hot-receivers-4000": lambda: patterns.random_unicast_phase(
        _rng(3), 4000, hot_tiles=16, hot_share=0.3
    ),
    "hot-receivers-10000": lambda: patterns.random_unicast_phase(
        _rng(4), 10000, hot_tiles=8, hot_share=0.1
    ),
    "permutation-sum-4": lambda: patterns.permutation_sum_phase(_rng(5), 4),
    "permutation-sum-8": lambda: patterns.permutation_sum_phase(_rng(6), 8),
    "reduce-scatter-like-6": lambda: patterns.permutation_sum_phase(_rng(7), 6, by_receiver=True),
    "multicast-fanout-2-16-3337": lambda: patterns.multicast_phase(_rng(8), 3337),
    "multicast-groups-3-17-1472": lambda: patterns.mixed_groups_phase(_rng(18), 1),
    "multicast-groups-3-17-two-rounds-3337": lambda: patterns.mixed_groups_phase(
        _rng(19), 2, extra_unicasts=393
    ),
    "multicast-fanout-2-4-8000": lambda: patterns.multicast_phase(_rng(9), 8000, fanout=(2, 4)),
    "multicast-groups-8x256": lambda: patterns.multicast_groups_phase(8, 256),
    "multicast-groups-16x128-strided": lambda: patterns.multicast_groups_phase(16, 128, stride=4),
    "paired64-multicast-2000": lambda: patterns.paired_multicast_phase(_rng(10), 2000),
    "paired64-half-4000": lambda: patterns.paired_multicast_phase(
        _rng(11), 4000, pair_fanout=(1, 4), paired_share=0.5
    ),
    "moved-operand-paired-81x18": lambda: patterns.moved_operand_phase(_rng(20), 81, 9, 9, 1080),
    "dependencies-random-unicast-5500": lambda: patterns.with_forwarding(
        _rng(12), patterns.random_unicast_phase(_rng(13), 5000)
    ),
    "dependencies-multicast-3300": lambda: patterns.with_forwarding(
        _rng(14), patterns.multicast_phase(_rng(15), 3000, fanout=(2, 8))
    ),
    "dependencies-permutation-sum-4": lambda: patterns.with_forwarding(
        _rng(16), patterns.permutation_sum_phase(_rng(17), 4), share=0.05
    ),
}


def benchmark_phases(only: str | None = None) -> list[tuple[str, ExchangePhase]]:
    """The benchmark set, generated phases first, then every snapshot phase."""
    cases = [(name, make()) for name, make in GENERATED.items() if not only or only in name]
    for path in sorted(SNAPSHOTS.glob("*.json*")):
        stem = path.name.split(".")[0]
        if only and only not in stem:
            continue
        _, phases = read_snapshot(path)
        cases += [(f"{stem}-phase{phase_id}", phase) for phase_id, phase in phases]
    return cases


def measure(name: str, phase: ExchangePhase, time_budget: float) -> dict[str, Any]:
    """Schedule, verify and bound one phase; return one JSON record."""
    started = time.perf_counter()
    report = optimize_phase(phase, IPU21_MODEL, time_budget)
    scheduled = time.perf_counter()
    verify_schedule(phase, report.schedule, IPU21_MODEL)
    finished = time.perf_counter()
    bound = report.strongest_lower_bound
    return {
        "name": name,
        "transfers": report.transfers,
        "initial_horizon": report.initial_horizon,
        "selected_horizon": report.selected_horizon,
        "endpoint_lower_bound": report.endpoint_lower_bound,
        "strongest_lower_bound": bound,
        "tight_bound": report.tight_bound,
        "ratio": round(report.selected_horizon / bound, 4) if bound else 1.0,
        "initial_ratio": round(report.initial_horizon / bound, 4) if bound else 1.0,
        "selected_kind": report.selected_kind,
        "neighborhood_improvements": report.neighborhood_improvements,
        "pieces": report.pieces,
        "verified": True,
        "schedule_seconds": round(scheduled - started, 3),
        "verify_seconds": round(finished - scheduled, 3),
        "seconds": round(finished - started, 3),
        "bounds": report.bounds,
    }


def main() -> None:
    """Run the benchmark set and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-budget", type=float, default=DEFAULT_TIME_BUDGET)
    parser.add_argument("--only", default=None, help="only cases whose name contains this")
    parser.add_argument("--out", default=None, help="write the JSON here (default stdout)")
    parser.add_argument(
        "--write-snapshots",
        default=None,
        metavar="DIR",
        help="also write each generated phase as a snapshot file",
    )
    args = parser.parse_args()
    cases = benchmark_phases(args.only)
    if args.write_snapshots:
        target = Path(args.write_snapshots)
        target.mkdir(parents=True, exist_ok=True)
        for name, phase in cases:
            if name in GENERATED:
                write_snapshot(target / f"{name}.json.gz", [(0, phase)], TILES)
    records = []
    for name, phase in cases:
        record = measure(name, phase, args.time_budget)
        records.append(record)
        print(
            f"{name:40} transfers={record['transfers']:6} ratio={record['ratio']:.4f} "
            f"initial={record['initial_ratio']:.4f} tight={record['tight_bound']:17} "
            f"kind={record['selected_kind']:13} seconds={record['seconds']:.2f}",
            file=sys.stderr,
            flush=True,
        )
    summary = {
        "time_budget": args.time_budget,
        "worst_ratio": max(r["ratio"] for r in records),
        "all_verified": all(r["verified"] for r in records),
        "phases": records,
    }
    text = json.dumps(summary, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)


if __name__ == "__main__":
    main()

"""Benchmark the greedy exchange scheduler: horizon vs strongest lower bound, and run times.

Usage: ``python benchmarks/exchange_schedule.py [out.json]`` (JSON to stdout without a path).
Times are wall-clock on whatever machine runs it; tests never assert them.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ipu_stack.exchange.bounds import strongest_lower_bound
from ipu_stack.exchange.model import ExchangePhase
from ipu_stack.exchange.patterns import all_gather_phase, all_to_all_phase, random_phase
from ipu_stack.exchange.schedule_greedy import schedule_phase
from ipu_stack.exchange.verify import verify_schedule


def _timed(function: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def measure(name: str, phase: ExchangePhase) -> dict[str, Any]:
    """Schedule, verify and bound one phase; return one JSON record."""
    schedule, schedule_seconds = _timed(lambda: schedule_phase(phase))
    _, verify_seconds = _timed(lambda: verify_schedule(phase, schedule))
    (bound, bound_name), bound_seconds = _timed(lambda: strongest_lower_bound(phase))
    return {
        "name": name,
        "transfers": len(phase.transfers),
        "lower_bound": bound,
        "tight_bound": bound_name,
        "horizon": schedule.horizon,
        "ratio": round(schedule.horizon / bound, 4) if bound else 1.0,
        "schedule_seconds": round(schedule_seconds, 3),
        "verify_seconds": round(verify_seconds, 3),
        "bound_seconds": round(bound_seconds, 3),
    }


def main() -> None:
    """Run the benchmark set and write JSON."""
    rng = np.random.default_rng(1)
    cases: list[tuple[str, ExchangePhase]] = []
    for group in (3, 8, 46):
        for order in ("round", "source", "shuffled"):
            phase = all_to_all_phase(group, 64, order=order)
            cases.append((f"all-to-all g={group} {order}", phase))
    for group in (3, 8, 32):
        cases.append((f"all-gather g={group}", all_gather_phase(group, 64)))
    for count, fanout in ((5_000, 1), (60_000, 1), (60_000, 4), (20_000, 8)):
        cases.append(
            (f"random E={count} fanout<={fanout}", random_phase(rng, count, max_fanout=fanout))
        )
    records = [measure(name, phase) for name, phase in cases]
    text = json.dumps(records, indent=2)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()

"""GEMM benchmark: plan, simulate and check the issue's reference shapes; writes JSON.

Usage: python benchmarks/gemm.py [--out benchmarks/results/gemm.json] [--only NAME]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path

from ipu_stack.gemm_job import GemmJob, gemm_graph, run_gemm
from ipu_stack.low.lower import lower_program
from ipu_stack.mid.lower_mid import lower_mid

CASES = {
    "1024^3": GemmJob(1024, 1024, 1024),
    "2048^3": GemmJob(2048, 2048, 2048),
    "4096^3": GemmJob(4096, 4096, 4096),
    "siglip_mlp_up_2916x1152x4304": GemmJob(2916, 1152, 4304),
    "131072x64x64": GemmJob(131072, 64, 64),
}


def plan_and_lower_seconds(job: GemmJob) -> float:
    """Wall time of planning (lower_mid) plus lowering the best finalist to tile shards."""
    graph = gemm_graph(job)
    gc.disable()  # as the build does (package/build.py)
    try:
        start = time.perf_counter()
        best = lower_mid(graph, job.tiles)[0]
        plans = {op.id: best.gemm_plans[op.name] for op in graph.operations}
        lower_program(graph, plans, job.tiles, best.row_tiles)
        return time.perf_counter() - start
    finally:
        gc.enable()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="benchmarks/results/gemm.json")
    parser.add_argument("--only", action="append", choices=sorted(CASES))
    args = parser.parse_args()
    rows = []
    for name in args.only or list(CASES):
        start = time.perf_counter()
        report = run_gemm(CASES[name])
        row = {
            "case": name,
            "utilization": round(report["utilization"], 4),
            "estimated_cycles": report["estimated_cycles"],
            "simulated_cycles": report["simulated_cycles"],
            "estimate_error": round(
                (report["estimated_cycles"] - report["simulated_cycles"])
                / report["simulated_cycles"],
                4,
            ),
            "plan_seconds": round(report["plan_seconds"], 3),
            "plan_and_lower_seconds": round(plan_and_lower_seconds(CASES[name]), 3),
            "simulate_seconds": round(report["simulate_seconds"], 3),
            "total_seconds": round(time.perf_counter() - start, 3),
            "relative_error": report["relative_error"],
            "passed": report["passed"],
            "plan": report["plan"],
        }
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "plan"}), file=sys.stderr)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    os.replace(tmp, out)
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

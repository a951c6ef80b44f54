"""ONNX backend node tests through ipu-stack: passed / failed / unsupported per op type; JSON.

Usage: python benchmarks/onnx_backend.py [--out benchmarks/results/onnx_backend.json]
                                         [--tiles N] [--op OP ...] [--verbose]

By default runs the issue's op types (MatMul, Gemm, Add, Mul, Gelu, LayerNormalization,
Softmax, Reshape, Transpose, Slice, Cast); ``--op Attention`` adds the opset-23 operator.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import onnx

from ipu_stack.onnx_backend import OP_TYPES, collect_cases, run_cases, summarize


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/onnx_backend.json")
    parser.add_argument("--tiles", type=int, default=64, help="tiles per build (default 64)")
    parser.add_argument("--op", action="append", help="op type(s) to run (default: the issue's)")
    parser.add_argument("--verbose", action="store_true", help="print every case's outcome")
    args = parser.parse_args()
    op_types = tuple(args.op) if args.op else OP_TYPES
    start = time.perf_counter()
    cases = collect_cases(op_types)
    results = run_cases(cases, tiles=args.tiles)
    summary = {
        "onnx_version": onnx.__version__,
        "python": platform.python_version(),
        "tiles": args.tiles,
        "op_types": list(op_types),
        "seconds": round(time.perf_counter() - start, 2),
        **summarize(results),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1) + "\n")
    if args.verbose:
        for r in results:
            print(f"{r.status:12s} {r.name}  {r.reason[:200]}", file=sys.stderr)
    print(f"{'op type':20s} {'passed':>7s} {'failed':>7s} {'unsupported':>12s}", file=sys.stderr)
    for op, counts in summary["by_op_type"].items():
        print(
            f"{op:20s} {counts['passed']:7d} {counts['failed']:7d} {counts['unsupported']:12d}",
            file=sys.stderr,
        )
    totals = summary["totals"]
    print(
        f"{'total':20s} {totals['passed']:7d} {totals['failed']:7d} {totals['unsupported']:12d}"
        f"   ({summary['cases']} cases, {summary['seconds']} s) -> {out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

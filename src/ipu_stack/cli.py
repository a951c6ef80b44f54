"""The ``ipu-stack`` command line: thin over the API."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from ipu_stack.cli_types import (
    bounded_int,
    nonnegative_seconds,
    output_file,
    positive_int,
    seed,
)
from ipu_stack.cli_types import (
    named_shape as _named_shape,
)
from ipu_stack.cli_types import shape as _shape
from ipu_stack.errors import GraphError, IpuStackError
from ipu_stack.kernels import commands as kernel_commands
from ipu_stack.kernels import kernel_run_command
from ipu_stack.package import commands as package_commands
from ipu_stack.profile import commands as profile_commands
from ipu_stack.target import ipu21
from ipu_stack.trace import configure_logging


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        sys.stderr.write(f"ipu-stack: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ipu-stack", description="Compile and simulate programs for the IPU21.")
    parser.add_argument("--version", action="version", version=f"ipu-stack {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    gemm = sub.add_parser("gemm", help="compile a GEMM, run it on the simulator, check it")
    gemm.add_argument("m", type=positive_int, help="output rows")
    gemm.add_argument("k", type=positive_int, help="inner extent")
    gemm.add_argument("n", type=positive_int, help="output columns")
    gemm.add_argument("--batch", type=positive_int, default=None, help="leading batch of the left")
    gemm.add_argument("--precision", choices=("f16", "f32"), default="f16")
    gemm.add_argument(
        "--tiles", type=positive_int, default=ipu21.TILES, help=f"tiles to use (1..{ipu21.TILES})"
    )
    gemm.add_argument("--transpose-left", action="store_true")
    gemm.add_argument("--transpose-right", action="store_true")
    gemm.add_argument(
        "--left-shape",
        type=_shape,
        default=None,
        help="override the left operand's shape, e.g. 2,64,32",
    )
    gemm.add_argument(
        "--right-shape",
        type=_shape,
        default=None,
        help="override the right operand's shape, e.g. 32,48",
    )
    gemm.add_argument("--seed", type=seed, default=0, help="seed of the random inputs")
    gemm.add_argument("--json", action="store_true", help="print one JSON object")
    gemm.add_argument(
        "--export-exchange-snapshot",
        metavar="PATH",
        type=output_file,
        default=None,
        help="write every exchange phase of the build as a snapshot JSON file",
    )
    _add_onnx_command(sub)
    _add_exchange_commands(sub)
    kernel_commands.add_commands(sub)
    kernel_run_command.add_commands(sub)
    package_commands.add_commands(sub)
    profile_commands.add_commands(sub)
    return parser


def _add_onnx_command(sub: argparse._SubParsersAction) -> None:
    onnx = sub.add_parser(
        "onnx", help="import an ONNX model, compile it, run it on the simulator, check it"
    )
    onnx.add_argument("model", metavar="MODEL.onnx")
    onnx.add_argument(
        "--tiles", type=positive_int, default=ipu21.TILES, help=f"tiles to use (1..{ipu21.TILES})"
    )
    onnx.add_argument("--seed", type=seed, default=0, help="seed of the random inputs")
    onnx.add_argument(
        "--input-shape",
        type=_named_shape,
        action="append",
        default=[],
        metavar="NAME=D,D,..",
        help="static shape of an input with symbolic dimensions (repeatable)",
    )
    onnx.add_argument("--json", action="store_true", help="print one JSON object")


def _add_exchange_commands(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "exchange-bench", help="schedule and verify the exchange phases of a snapshot"
    )
    bench.add_argument("snapshot", metavar="SNAPSHOT.json")
    bench.add_argument(
        "--phase",
        type=bounded_int(0, 2**63 - 1, "phase id"),
        default=None,
        help="only this phase id",
    )
    bench.add_argument(
        "--time-budget",
        type=nonnegative_seconds,
        default=None,
        metavar="SECONDS",
        help="seconds per phase (default 1.5)",
    )
    bench.add_argument("--emit-schedule", metavar="OUT.json", type=output_file, default=None)
    bench.add_argument(
        "--latency", choices=("time_to_mux", "none"), default="time_to_mux", help="latency model"
    )
    bench.add_argument(
        "--disable",
        action="append",
        default=[],
        choices=("paired", "dependencies", "sram_hazards", "full_duplex"),
        help="switch off one hardware rule (repeatable)",
    )
    bench.add_argument(
        "--max-pieces",
        type=lambda text: positive_int(text, "pieces per transfer must be at least 1"),
        default=None,
        metavar="N",
        help="most pieces per transfer (default 8; 1 forbids preemption)",
    )
    bench.add_argument("--json", action="store_true", help="print a JSON list of phase records")
    check = sub.add_parser("exchange-verify", help="verify a schedule file against a snapshot")
    check.add_argument("snapshot", metavar="SNAPSHOT.json")
    check.add_argument("schedule", metavar="SCHEDULE.json")


def require_gemm_storable(args: argparse.Namespace) -> None:
    """Reject operands no machine could hold before planning allocates anything for them."""
    from ipu_stack.cli_types import require_storable

    lead = (args.batch,) if args.batch else ()
    left = args.left_shape or (*lead, args.m, args.k)
    right = args.right_shape or (args.k, args.n)
    out = (*lead, args.m, args.n)
    require_storable([("left", left), ("right", right), ("output", out)], args.precision)


def _exchange_bench(args: argparse.Namespace) -> int:
    from ipu_stack.exchange.bench import bench_snapshot, format_record
    from ipu_stack.exchange.model import ExchangeModel
    from ipu_stack.exchange.schedule_pieces import MAX_PIECES
    from ipu_stack.exchange.scheduler import DEFAULT_TIME_BUDGET

    model = ExchangeModel(latency=args.latency, **dict.fromkeys(args.disable, False))
    budget = DEFAULT_TIME_BUDGET if args.time_budget is None else args.time_budget
    records = bench_snapshot(
        args.snapshot, args.phase, budget, args.emit_schedule, model, args.max_pieces or MAX_PIECES
    )
    if args.json:
        print(json.dumps(records))
    else:
        for record in records:
            print(format_record(record))
    return 0


def _print_gemm(report: dict[str, object]) -> None:
    plan = report["plan"]
    assert isinstance(plan, dict)
    print(
        f"plan: grid={plan['grid']} block={plan['block']} weights={plan['weights']} "
        f"left={plan['left']} right={plan['right']} active_tiles={plan['active_tiles']}"
    )
    print(
        f"estimated_cycles={report['estimated_cycles']} "
        f"simulated_cycles={report['simulated_cycles']} "
        f"utilization={report['utilization']:.3f}"
    )
    print(
        f"max_abs_error={report['max_abs_error']:.4g} "
        f"max_abs_reference={report['max_abs_reference']:.4g} "
        f"relative={report['relative_error']:.3g} (tolerance {report['tolerance']})"
    )
    print(
        f"plan_seconds={report['plan_seconds']:.3f} "
        f"simulate_seconds={report['simulate_seconds']:.3f}"
    )
    print("PASS" if report["passed"] else "FAIL: error above tolerance")


def _onnx(args: argparse.Namespace) -> int:
    from ipu_stack.onnx_job import OnnxJob, run_onnx

    report = run_onnx(OnnxJob(args.model, args.tiles, args.seed, dict(args.input_shape)))
    if args.json:
        print(json.dumps(report, sort_keys=True))
        return 0 if report["passed"] else 1
    print(f"operations={report['operations']} kinds={','.join(report['operation_kinds'])}")
    for note in report["fusions"]:
        print(f"fused: {note}")
    print(
        f"estimated_cycles={report['estimated_cycles']} "
        f"simulated_cycles={report['simulated_cycles']} "
        f"simulate_seconds={report['simulate_seconds']:.2f}"
    )
    for out in report["outputs"]:
        print(
            f"output {out['name']} {out['precision']} {out['shape']}: "
            f"max_abs_error={out['max_abs_error']:.4g} "
            f"max_abs_reference={out['max_abs_reference']:.4g} "
            f"relative={out['relative_error']:.3g} (tolerance {out['tolerance']}, "
            f"vs {report['reference']})"
        )
    print("PASS" if report["passed"] else "FAIL: error above tolerance")
    return 0 if report["passed"] else 1


def _version() -> str:
    from ipu_stack.package.assemble import compiler_version

    return compiler_version()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ipu-stack`` console script.

    A closed stdout (``ipu-stack ... | head``) ends the program quietly with status 0.
    """
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader is gone: point stdout at /dev/null so the interpreter's final flush
        # does not raise again, and stop without a traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(verbose=getattr(args, "verbose", True) and not getattr(args, "json", False))
    try:
        if args.command in kernel_commands.COMMANDS:
            return kernel_commands.run(args)
        if args.command in kernel_run_command.COMMANDS:
            return kernel_run_command.run(args)
        if args.command in package_commands.COMMANDS:
            return package_commands.run(args)
        if args.command in profile_commands.COMMANDS:
            return profile_commands.run(args)
        if args.command == "exchange-bench":
            return _exchange_bench(args)
        if args.command == "exchange-verify":
            from ipu_stack.exchange.bench import verify_schedule_file

            checked = verify_schedule_file(args.snapshot, args.schedule)
            print(f"verified phases: {' '.join(str(p) for p in checked)}")
            return 0
        if args.command == "onnx":
            return _onnx(args)
        if args.command == "gemm":
            from ipu_stack.gemm_job import GemmJob, run_gemm

            if args.tiles > ipu21.TILES:
                raise GraphError(f"--tiles must be between 1 and {ipu21.TILES}, got {args.tiles}")
            require_gemm_storable(args)
            report = run_gemm(
                GemmJob(
                    args.m,
                    args.k,
                    args.n,
                    args.batch,
                    args.precision,
                    args.tiles,
                    args.transpose_left,
                    args.transpose_right,
                    args.seed,
                    args.left_shape,
                    args.right_shape,
                ),
                exchange_snapshot=args.export_exchange_snapshot,
            )
            if args.json:
                print(json.dumps(report, sort_keys=True))
            else:
                _print_gemm(report)
            return 0 if report["passed"] else 1
    except IpuStackError as err:
        if os.environ.get("IPU_STACK_TRACEBACK") == "1":
            raise
        sys.stderr.write(f"ipu-stack: error: {str(err).splitlines()[0]}\n")
        return err.exit_code
    return 2  # pragma: no cover - argparse requires a command


def entry() -> NoReturn:
    """The ``ipu-stack`` console script: :func:`main`, then a quick exit (the heap is not
    freed object by object; output is flushed first)."""
    from ipu_stack.gc_pause import enable_quick_exit, exit_now

    enable_quick_exit()
    try:
        code = main()
    except SystemExit as stop:  # argparse's exits (--help, bad arguments)
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        if isinstance(stop.code, str):
            sys.stderr.write(stop.code + "\n")
    exit_now(code)


if __name__ == "__main__":  # pragma: no cover
    entry()

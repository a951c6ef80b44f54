"""The ``ipu-stack kernel-run`` command (argument setup and handler)."""

from __future__ import annotations

import argparse
import json

COMMANDS = ("kernel-run",)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``kernel-run`` on the CLI's sub-parsers."""
    kr = sub.add_parser(
        "kernel-run",
        help="run a kernel unit's device code on the ISA emulator and check it against NumPy",
        description="Exit 0: every entry matches its NumPy semantics; 1: mismatch or fault "
        "(the message names instruction and address); 2: bad input.",
    )
    kr.add_argument("name", metavar="NAME", help="unit, e.g. gemm_f16_interleaved_k32_c32_r7_r8")
    kr.add_argument("--source", default=None, help="template to use instead of the registry's")
    kr.add_argument("--seed", type=int, default=0, help="seed of the random operands")
    kr.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    """Run ``kernel-run``; returns the exit status."""
    from ipu_stack.kernels.kernel_run import kernel_run

    report = kernel_run(args.name, args.source, args.seed)
    if args.json:
        print(json.dumps(report, sort_keys=True))
        return 0 if report["ok"] else 1
    if "fault" in report:
        print(f"FAULT {report['fault']}")
        return 1
    for e in report["entries"]:
        err = e.get("worst_ulp", e.get("worst_relative", e.get("wrong_bytes", 0)))
        what = "ulp" if "worst_ulp" in e else "relative" if "worst_relative" in e else "bytes"
        if "error" in e:  # an indexing unit that trapped (kernels/kernel_run_indexing.py)
            print(f"{e['entry']}: TRAP {e['fault']} -> {e['error']}")
            continue
        print(
            f"{e['entry']}: max_abs_error={e['max_abs_error']:.3g} worst={err:.3g} {what} "
            f"emulated_cycles={e['emulated_cycles']} modelled_cycles={e['modelled_cycles']} "
            f"{'ok' if e['ok'] else 'MISMATCH'}"
        )
    print("PASS" if report["ok"] else "FAIL: the device code disagrees with its semantics")
    return 0 if report["ok"] else 1

"""The profile commands of the ``ipu-stack`` CLI: query, barriers, render, export."""

from __future__ import annotations

import argparse
import json

from ipu_stack.profile.query import GROUPS, SORTS

COMMANDS = ("profile-query", "profile-barriers", "profile-render", "profile-export")


def _count(text: str) -> int:
    from ipu_stack.cli import positive_int

    return positive_int(text, "expected a positive integer")


def _index(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register the profile commands on the CLI's sub-parsers."""
    q = sub.add_parser("profile-query", help="where a profiled run's cycles went")
    q.add_argument("profile", metavar="PROF.ipuprof")
    q.add_argument("--group-by", choices=GROUPS, default="kind")
    q.add_argument("--sort-by", choices=SORTS, default="phase-cycles")
    q.add_argument("--tile", type=_index, action="append", default=[], metavar="N",
                   help="only this physical tile (repeatable)")  # fmt: skip
    q.add_argument("--phase", type=_index, action="append", default=[], metavar="N",
                   help="only this phase (an executed step, from 0; repeatable)")  # fmt: skip
    q.add_argument("--kind", action="append", default=[],
                   choices=("compute", "exchange", "sync", "idle"),
                   help="only segments of this kind (repeatable)")  # fmt: skip
    q.add_argument("--limit", type=_count, default=None, metavar="K", help="first K groups")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    b = sub.add_parser("profile-barriers", help="per exchange phase: arrivals, late tile, bound")
    b.add_argument("profile", metavar="PROF.ipuprof")
    b.add_argument("--json", action="store_true", help="print a JSON list")
    r = sub.add_parser("profile-render", help="one self-contained HTML report of a profile")
    r.add_argument("profile", metavar="PROF.ipuprof")
    r.add_argument("-o", "--output", required=True, metavar="REPORT.html")
    e = sub.add_parser("profile-export", help="export a profile (Chrome trace-event JSON)")
    e.add_argument("profile", metavar="PROF.ipuprof")
    e.add_argument("--chrome-trace", required=True, metavar="OUT.json")
    e.add_argument("--tiles-per-track", type=_count, default=1, metavar="N",
                   help="tiles per track (default 1: one track per tile)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Run a profile command (``args.command`` in :data:`COMMANDS`)."""
    from ipu_stack.profile import format as profile_format

    profile = profile_format.load(args.profile)
    if args.command == "profile-query":
        from ipu_stack.profile.query import format_query, query

        result = query(profile, args.group_by, args.sort_by, args.tile, args.phase, args.kind,
                       args.limit)  # fmt: skip
        if args.json:
            print(json.dumps(result, sort_keys=True))
        else:
            print("\n".join(format_query(result)))
        return 0
    if args.command == "profile-barriers":
        from ipu_stack.profile.query import barriers, format_barriers

        records = barriers(profile)
        print(
            json.dumps(records, sort_keys=True)
            if args.json
            else "\n".join(format_barriers(records))
        )
        return 0
    if args.command == "profile-render":
        from ipu_stack.profile.render import write_report

        size = write_report(profile, args.output)
        print(f"wrote {args.output}: {size:,} bytes (self-contained HTML)")
        return 0
    from ipu_stack.profile.chrome import write_chrome_trace

    size, slices = write_chrome_trace(profile, args.chrome_trace, args.tiles_per_track)
    print(f"wrote {args.chrome_trace}: {size:,} bytes, {slices:,} slices (Chrome trace-event JSON)")
    return 0

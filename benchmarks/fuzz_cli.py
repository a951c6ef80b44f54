"""Bad-input fuzzing of the whole CLI, in-process: many thousands of mutated inputs.

    python benchmarks/fuzz_cli.py --cases 5000 --out benchmarks/results/fuzz_cli.json

Families (weights of the mix in ``--mix``): mutated packages (header, manifest and data bytes,
re-signed and not; table cells; manifest fields), mutated snapshots and schedules (types,
ranges, missing keys, versions), mutated ONNX models (shapes, dtypes, attributes, opsets,
dangling and duplicated names, truncated and flipped bytes; compiled at 4 tiles and run,
compared with onnxruntime) and random command lines. The property and oracles are in
``tests/property/fuzz_cases.py``. Exit status 0 when no case broke the property.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "property"))

import fuzz_cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--mix",
        default="package=40,json=30,cli=22,onnx=8",
        help="family=weight,... (default %(default)s)",
    )
    parser.add_argument("--out", type=Path, default=None, help="results JSON")
    args = parser.parse_args()
    mix = {k: float(v) for k, v in (part.split("=") for part in args.mix.split(","))}
    fuzz_cases.env_for_fuzz()
    rng = random.Random(args.seed)
    tally = fuzz_cases.Tally()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ipu-fuzz-") as tmp:
        fx = fuzz_cases.make_fixtures(Path(tmp) / "fixtures")
        work = Path(tmp) / "work"
        work.mkdir()
        families = list(mix)
        weights = [mix[f] for f in families]
        for index in range(args.cases):
            family = rng.choices(families, weights)[0]
            fuzz_cases.FAMILIES[family](fx, random.Random(rng.getrandbits(64)), work, tally)
            if (index + 1) % 500 == 0:
                print(f"{index + 1} cases, {time.perf_counter() - started:.0f} s: "
                      f"tracebacks={tally.tracebacks} invalid_accepted={tally.invalid_accepted} "
                      f"partial_files={tally.partial_files} bad_messages={tally.bad_messages}",
                      file=sys.stderr, flush=True)  # fmt: skip
    logging.getLogger("ipu_stack").handlers.clear()
    summary = {
        "cases": tally.cases,
        "accepted_correct": tally.accepted,
        "clean_rejections": tally.clean_rejections,
        "verify_rule_rejections_exit_1": tally.verify_rejections,
        "resigned_integer_edits_running_another_program": tally.other_program,
        "resigned_image_bit_flips_running_to_other_outputs": tally.code_changed_output,
        "tracebacks": tally.tracebacks,
        "invalid_accepted": tally.invalid_accepted,
        "partial_files": tally.partial_files,
        "bad_messages": tally.bad_messages,
        "by_family": tally.by_family,
        "seed": args.seed,
        "mix": mix,
        "seconds": round(time.perf_counter() - started, 1),
        "failures": tally.failures[:50],
    }
    text = json.dumps(summary, indent=2, sort_keys=True)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "failures"}, sort_keys=True))
    return 0 if tally.ok() else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Simulation wall time of packages, and their outputs and cycles, for before/after checks.

Each package runs ``--repeat`` times as ``ipu-stack run PKG --random-inputs --json`` in a fresh
process (so imports and page faults count as they do for a user), optionally with the
``ipu_stack`` sources of another checkout first on ``PYTHONPATH`` (``--src``: the "before").
Reported per package: every ``simulate_seconds``, their median, the 1-minute load average
before each run (the host is shared: a busy second core slows the runs), the simulated cycles,
a digest of the per-step cycles and a digest of the output bytes (equal digests: bit-identical
outputs and cycles).

    python examples/make_examples.py --out /tmp/m siglip_mlp
    ipu-stack compile /tmp/m/siglip_mlp.onnx -o /tmp/m/siglip_mlp.ipuexe
    python benchmarks/sim_speed.py /tmp/m/siglip_mlp.ipuexe --src /tmp/before/src
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def run_once(package: str, src: str | None) -> dict:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "ipu_stack.cli", "run", package, "--random-inputs",
                   "--json", "--output-dir", out]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        report = json.loads(done.stdout)
        digest = hashlib.sha256()
        for path in sorted(Path(out).glob("*.npy")):
            digest.update(path.name.encode() + np.load(path).tobytes())
    steps = json.dumps(report["step_cycles"]).encode()
    return {
        "simulate_seconds": report["simulate_seconds"],
        "load_before": load,
        "cycles": report["simulated_cycles"],
        "step_cycles_sha256": hashlib.sha256(steps).hexdigest()[:16],
        "outputs_sha256": digest.hexdigest()[:16],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("packages", nargs="+")
    parser.add_argument("--src", help="an ipu_stack src directory to run instead (before)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for package in args.packages:
        runs = [run_once(package, args.src) for _ in range(args.repeat)]
        seconds = [r["simulate_seconds"] for r in runs]
        keys = {(r["cycles"], r["step_cycles_sha256"], r["outputs_sha256"]) for r in runs}
        print(json.dumps({
            "package": package,
            "src": args.src or "installed",
            "median_simulate_seconds": round(statistics.median(seconds), 3),
            "simulate_seconds": [round(s, 3) for s in seconds],
            "load_before": [round(r["load_before"], 2) for r in runs],
            "cycles": runs[0]["cycles"],
            "step_cycles_sha256": runs[0]["step_cycles_sha256"],
            "outputs_sha256": runs[0]["outputs_sha256"],
            "runs_agree": len(keys) == 1,
        }))  # fmt: skip


if __name__ == "__main__":
    main()

"""Tile images against the semantic run: outputs bit for bit, cycles, row bytes, run time.

For each package: run it from its tile images (the default Session) and from its step
description (``Session(execution="description")``, the semantic run of the same program,
whose exchange time is the scheduled 600 + horizon per phase: the scheduled estimate) on the
same random inputs; also against the package's modelled estimate (``estimated_cycles``);
compare the outputs bit for bit and the cycles; report the largest tile's encoded row bytes
beside the old estimate (``compile_runtime``'s 4 x (phases + 42 words per chunk)) and the
reference's 80 KiB table budget. Writes ``benchmarks/results/tile_images.json``.

    python benchmarks/tile_images.py /tmp/m/siglip_mlp.ipuexe /tmp/m/mlp2.ipuexe
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np

from ipu_stack import Package, Session
from ipu_stack.runtime.session import host_dtype

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_ROW_TABLE_BYTES = 80 * 1024  # facts §9.4: the reference budgets 80 KiB per tile


def measure(path: Path, seed: int = 0) -> dict[str, object]:
    package = Package.load(path)
    rng = np.random.default_rng(seed)
    inputs = {b["name"]: rng.uniform(-1, 1, b["shape"]).astype(host_dtype(b["dtype"]))
              for b in package.bindings("input")}  # fmt: skip
    runs = {}
    for mode in ("description", "images"):
        session = Session(execution=mode).load(package)
        session.initialize()
        start = time.perf_counter()
        outputs = session.run(inputs)
        assert session.last_run is not None
        runs[mode] = (outputs, session.last_run.cycles, time.perf_counter() - start)
    (sem, sem_cycles, sem_s), (img, img_cycles, img_s) = runs["description"], runs["images"]
    identical = all(np.array_equal(np.asarray(sem[k]).view(np.uint8),
                                   np.asarray(img[k]).view(np.uint8)) for k in sem)  # fmt: skip
    summary = package.manifest["tile_code"]["summary"]
    return {
        "package": path.name,
        "tiles": len(package.tiles),
        "bit_identical_to_semantic_run": identical,
        "semantic_cycles": sem_cycles,
        "image_cycles": img_cycles,
        "cycle_difference": round((img_cycles - sem_cycles) / sem_cycles, 5),
        "package_estimated_cycles": package.manifest["program"]["estimated_cycles"],
        "difference_from_estimate": round(
            (img_cycles - package.manifest["program"]["estimated_cycles"])
            / package.manifest["program"]["estimated_cycles"],
            5,
        ),
        "semantic_run_seconds": round(sem_s, 2),
        "image_run_seconds": round(img_s, 2),
        "largest_tile_row_bytes": summary["maximum_row_bytes"],
        "largest_tile": summary["maximum_row_bytes_tile"],
        "old_estimate_row_bytes": package.manifest["tile_code"]["estimated_row_bytes"],
        "reference_row_table_budget_bytes": REFERENCE_ROW_TABLE_BYTES,
        "maximum_support_bytes": summary["maximum_support_bytes"],
        "row_words": summary["row_words"],
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/tile_images.json"))
    args = parser.parse_args()
    results = []
    for p in args.packages:
        results.append(measure(Path(p)))
        print(json.dumps(results[-1], sort_keys=True), flush=True)
    out = Path(args.out)
    old = json.loads(out.read_text()) if out.exists() else []
    keep = [r for r in old if r["package"] not in {x["package"] for x in results}]
    out.write_text(json.dumps(keep + results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()

"""Mutation test of the tile images: flip one bit of a random encoded instruction, re-seal the
package, run it, and classify the mutant.

For each example: compile it, pick instruction words at random from every tile's code and
exchange rows (the kernel-entry placeholders and the guard are not instructions), flip one
random bit, re-seal (the digest is recomputed, so only validation and execution can object),
then load and run the package on the simulator with the same inputs as the original and
compare the outputs with onnxruntime (the ``run --check`` path). A mutant is

- ``rejected``: validation refuses the package at load (exit 2, e.g. a row now addresses
  outside tile memory),
- ``fault``: the simulator faults (exit 1; the message names tile, cycle, address),
- ``check``: it runs, but ``--check`` rejects its outputs (exit 1),
- ``survived``: it runs and its outputs pass ``--check``; ``identical`` of those gave
  bit-identical outputs to the original (an equivalent mutant, e.g. a flipped unused bit).

Results per instruction kind and per field (the field the flipped bit lies in, by the
decoder's reading) go to ``benchmarks/results/package_mutations.json``.

    python benchmarks/package_mutations.py          # mlp2@32, mlp2_f32@32, mlp2@256 (tiles)
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack import Package, Session
from ipu_stack.errors import IpuStackError, PackageError, SimulationError
from ipu_stack.graph.onnx_import import NUMPY_OF, import_onnx
from ipu_stack.package.assemble import assemble_package
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.runtime.check import check_outputs
from ipu_stack.tilecode import decode as decoder

ROOT = Path(__file__).resolve().parents[1]
#: examples as MODEL@TILES (one model compiled for two tile counts is two programs)
EXAMPLES = ("mlp2@32", "mlp2_f32@32", "mlp2@256")
COUNTS = {"mlp2@32": 110, "mlp2_f32@32": 110, "mlp2@256": 90}  # mutants (>= 300 in all)


def _field(word: int, bit: int, row_word: bool) -> tuple[str, str]:
    """(instruction kind, field) of a bit of ``word`` by the decoder's reading."""
    if row_word and word == 0:
        return "pad", "-"
    for mask, match, name, fields in decoder._PATTERNS:  # the decoder's own tables
        if word & mask == match:
            for field, low, bits in fields:
                if low <= bit < low + bits:
                    return name, field
            return name, "opcode"
    return "unknown", "-"


def _instructions(package: Package) -> list[tuple[int, int, str, str]]:
    """``(tile, absolute data offset, kind, region)`` of every instruction word."""
    base = package.manifest["sections"]["images"]["offset"]
    entry_base = min(int(e[0]) for e in package.manifest["tile_code"]["kernel_entries"])
    rows = package.table("rows")
    spans: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for tile, _, _, address, words in rows.tolist():
        spans[tile].append((address, address + 4 * words))
    words = np.frombuffer(package.data, "<u4")
    out = []
    seen: set[int] = set()
    for tile, address, size, flags, offset in package.table("segments").tolist():
        if offset < 0 or not flags & 4 or address == entry_base:
            continue
        start = base + offset
        if start in seen:
            continue  # a segment shared by tiles (stored once): mutated once
        seen.add(start)
        for k in range(size // 4):
            a = address + 4 * k
            w = int(words[(start >> 2) + k])
            in_row = any(lo <= a < hi for lo, hi in spans.get(tile, ()))
            if w == 0:
                continue  # guard or pad
            out.append(
                (tile, start + 4 * k, decoder.decode(w).mnemonic, "row" if in_row else "code")
            )
    return out


def _run(package: Package, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = Session().load(package)
    session.initialize()
    return session.run(inputs)


def mutate_example(path: Path, tiles: int, count: int, seed: int) -> dict[str, Any]:
    graph, bindings = import_onnx(path)
    names = {v.name: k for k, v in bindings.inputs.items()}
    names.update({v.name: k for k, v in bindings.outputs.items()})
    built = build(graph, BuildConfig(tiles=tiles))
    package = Package.from_bytes(
        assemble_package(built, bindings.parameters, names=names).to_bytes()
    )
    rng = np.random.default_rng(seed)
    inputs = {
        k: rng.uniform(-1, 1, v.shape).astype(NUMPY_OF[v.dtype]) for k, v in bindings.inputs.items()
    }
    dtypes = {b["name"]: b["dtype"] for b in package.bindings("output")}
    start = time.perf_counter()
    original = _run(package, inputs)
    run_seconds = time.perf_counter() - start
    baseline = check_outputs(path, inputs, original, dtypes)
    assert baseline["passed"], baseline
    candidates = _instructions(package)
    picks = rng.choice(len(candidates), size=min(count, len(candidates)), replace=False)
    mutants = []
    for i in picks.tolist():
        tile, at, kind, region = candidates[i]
        word = int.from_bytes(package.data[at : at + 4], "little")
        bit = int(rng.integers(0, 32))
        kind, field = _field(word, bit, region == "row")
        prev = int.from_bytes(package.data[at - 4 : at], "little") if at >= 4 else 0
        if region == "row" and decoder.decode(prev).mnemonic == "sendpicp":
            kind, field = "picword", "xpic" if bit >= 18 else "pic"
        data = bytearray(package.data)
        data[at : at + 4] = (word ^ (1 << bit)).to_bytes(4, "little")
        record = {"tile": tile, "region": region, "kind": kind, "field": field, "bit": bit,
                  "word": f"{word:#010x}"}  # fmt: skip
        try:
            mutant = Package.from_bytes(Package(package.manifest, bytes(data)).to_bytes())
        except PackageError as err:
            mutants.append({**record, "outcome": "rejected", "message": str(err)[:200]})
            continue
        try:
            outputs = _run(mutant, inputs)
        except SimulationError as err:
            mutants.append({**record, "outcome": "fault", "message": str(err)[:200]})
            continue
        except IpuStackError as err:
            mutants.append({**record, "outcome": "fault", "message": str(err)[:200]})
            continue
        check = check_outputs(path, inputs, outputs, dtypes)
        identical = all(
            np.array_equal(np.asarray(outputs[n]).view(np.uint8), np.asarray(v).view(np.uint8))
            for n, v in original.items()
        )
        outcome = "survived" if check["passed"] else "check"
        mutants.append({**record, "outcome": outcome, "identical": identical})
    return {"model": path.name, "tiles": tiles, "instructions": len(candidates),
            "original_run_seconds": round(run_seconds, 2), "mutants": mutants}  # fmt: skip


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Killed / total per instruction kind and per (kind, field)."""
    by_kind: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    by_field: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in results:
        for m in r["mutants"]:
            for key, table in ((m["kind"], by_kind), (f"{m['kind']}.{m['field']}", by_field)):
                table[key]["total"] += 1
                table[key][m["outcome"]] += 1
                if m["outcome"] != "survived":
                    table[key]["killed"] += 1
                elif m.get("identical"):
                    table[key]["identical"] += 1
    return {"by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
            "by_field": {k: dict(v) for k, v in sorted(by_field.items())}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", default=str(ROOT / "examples"), help="ONNX folder")
    parser.add_argument("--models", nargs="*", default=list(EXAMPLES), help="MODEL@TILES ...")
    parser.add_argument("--per-example", type=int, default=None, help="default: COUNTS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/package_mutations.json"))
    args = parser.parse_args()
    results = []
    for i, example in enumerate(args.models):
        model, _, tiles = example.partition("@")
        path = Path(args.examples) / f"{model}.onnx"
        if not path.exists():
            path = ROOT / "examples" / f"{model}.onnx"
        start = time.perf_counter()
        count = args.per_example or COUNTS.get(example, 100)
        result = mutate_example(path, int(tiles or 32), count, args.seed + i)
        result["seconds"] = round(time.perf_counter() - start, 1)
        results.append(result)
        print(json.dumps(summarise([result])["by_kind"], sort_keys=True), flush=True)
        report = {"examples": results, "summary": summarise(results)}  # saved as it goes
        Path(args.out).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(json.dumps(report["summary"]["by_kind"], indent=1, sort_keys=True))


if __name__ == "__main__":
    main()

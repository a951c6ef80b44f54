"""Package figures per example model: size, load/validate time, determinism, simulated run.

For each model: compile (build + assemble) twice and compare the bytes, save, load (read +
digest + validation), Session load (validation + decode for the simulator), initialize, run
with random inputs and compare bit for bit with the in-memory run. Writes
``benchmarks/results/package.json``.

    python benchmarks/package.py                       # mlp2 and mlp2_f32 at 1,472 tiles
    python benchmarks/package.py --models siglip_mlp --examples /tmp/m --tiles 1472
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from ipu_stack import Package, Session, SimDevice
from ipu_stack.graph.onnx_import import NUMPY_OF, import_onnx
from ipu_stack.package.assemble import assemble_package
from ipu_stack.package.build import BuildConfig, build
from ipu_stack.target import ipu21

ROOT = Path(__file__).resolve().parents[1]


def measure(path: Path, tiles: int) -> dict[str, object]:
    graph, bindings = import_onnx(path)
    names = {v.name: k for k, v in bindings.inputs.items()}
    names.update({v.name: k for k, v in bindings.outputs.items()})
    blobs, build_seconds = [], []
    for _ in range(2):
        start = time.perf_counter()
        built = build(graph, BuildConfig(tiles=tiles))
        package = assemble_package(built, bindings.parameters, names=names)
        build_seconds.append(time.perf_counter() - start)
        blobs.append(package.to_bytes())
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "model.ipuexe"
        start = time.perf_counter()
        size = package.save(file)
        save_seconds = time.perf_counter() - start
        start = time.perf_counter()
        loaded = Package.load(file)
        load_seconds = time.perf_counter() - start
    start = time.perf_counter()
    session = Session(SimDevice()).load(loaded)
    session_seconds = time.perf_counter() - start
    session.initialize()
    rng = np.random.default_rng(0)
    inputs = {
        name: rng.uniform(-1, 1, v.shape).astype(NUMPY_OF[v.dtype])
        for name, v in bindings.inputs.items()
    }
    outputs = session.run(inputs)
    assert session.last_run is not None
    reference = SimDevice().run(
        built.program, built.placement, built.schedules, bindings.feeds(inputs)
    )
    identical = all(
        np.array_equal(
            np.ascontiguousarray(outputs[onnx_name]).view(np.uint8),
            np.ascontiguousarray(reference.outputs[value.name]).view(np.uint8),
        )
        for onnx_name, value in bindings.outputs.items()
    )
    sections = {k: v["size"] for k, v in loaded.manifest["sections"].items()}
    return {
        "model": path.name,
        "tiles": len(loaded.tiles),
        "package_bytes": size,
        "section_bytes": sections,
        "build_and_assemble_seconds": [round(s, 2) for s in build_seconds],
        "byte_identical_twice": blobs[0] == blobs[1],
        "save_seconds": round(save_seconds, 3),
        "load_and_validate_seconds": round(load_seconds, 3),
        "session_load_seconds": round(session_seconds, 3),
        "simulated_cycles": session.last_run.cycles,
        "simulated_ms": session.last_run.cycles / ipu21.CLOCK_HZ * 1e3,
        "bit_identical_to_in_memory": identical,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp2", "mlp2_f32"])
    parser.add_argument("--examples", type=Path, default=ROOT / "examples")
    parser.add_argument("--tiles", type=int, default=ipu21.TILES)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/package.json")
    args = parser.parse_args()
    records = []
    for name in args.models:
        record = measure(args.examples / f"{name}.onnx", args.tiles)
        print(json.dumps(record))
        records.append(record)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()

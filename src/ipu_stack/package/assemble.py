"""From a build to a package: resolve every buffer reference to a physical tile and an address.

The package does not carry the in-memory plan: calls, transfers and bindings name physical
tiles and absolute SRAM addresses; the allocation table (name, address, size, live steps) is
kept so a device can check lifetimes, and the segments are each tile's memory map.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import chain
from typing import Any

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.gc_pause import collector_paused
from ipu_stack.graph.compute_graph import ComputeGraph
from ipu_stack.kernels.semantics import encode_f143
from ipu_stack.low.makers import union_spans
from ipu_stack.low.program import (
    AddCall,
    Binding,
    ComputeStep,
    CopyCall,
    FillCall,
    GemmCall,
    KernelCall,
    MapCall,
    RepeatStep,
    View,
)
from ipu_stack.package.build import Build, BuildConfig, build
from ipu_stack.package.format import (
    HOST_CALLS,
    SCHEMA_VERSION,
    SEGMENT_READ,
    SEGMENT_WRITE,
    TARGET,
    TILE_MEMORY_BASE,
    TILE_MEMORY_SIZE,
    Package,
    SectionWriter,
    flat_rows,
)
from ipu_stack.package.tile_images import description_digest, write_images
from ipu_stack.place.assign import Placement
from ipu_stack.target import ipu21
from ipu_stack.tilecode.exchange_rows import PhaseTables, phase_tables
from ipu_stack.trace import Trace

ROLE_OF = {"host_input": "input", "parameter": "weight", "output": "output"}
#: Report keys whose values are wall-clock times: left out of the package (determinism).
WALL_CLOCK_KEYS = frozenset({"elapsed_ms", "seconds", "wall_seconds", "time_ms"})
#: Events that describe the kernel cache's state on this machine, not the build.
CACHE_EVENTS = frozenset(
    {"kernel cache hit", "kernel cache miss", "compiling kernel", "kernel artifact created"}
)


def compiler_version() -> str:
    """The installed ipu-stack version (``0+unknown`` when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ipu-stack")
    except PackageNotFoundError:  # pragma: no cover - running from a bare source tree
        return "0+unknown"


def build_package(
    graph: ComputeGraph,
    config: BuildConfig | None = None,
    parameters: Mapping[str, np.ndarray] | None = None,
    *,
    names: Mapping[str, str] | None = None,
    trace: Trace | None = None,
) -> Package:
    """Compile ``graph`` and assemble its package.

    Args:
        graph: the program (outputs set).
        config: build options (defaults: all tiles, the default finalists).
        parameters: data of the graph's parameters by value name; when given (all of them),
            the package embeds the weights and ``Session.initialize()`` uploads them.
        names: external names of bindings by graph value name (e.g. ONNX input and output
            names); other bindings keep their value names.
        trace: collects the build's events (a fresh one by default).

    Raises:
        GraphError: the graph is invalid, or parameter data is missing or mis-shaped.
        PlanError: the program does not fit the tiles.
    """
    trace = trace or Trace()
    built = build(graph, config, trace)
    with trace.phase("assemble_package"):
        return assemble_package(built, parameters, names=names)


def assemble_package(
    built: Build,
    parameters: Mapping[str, np.ndarray] | None = None,
    *,
    names: Mapping[str, str] | None = None,
) -> Package:
    """The package of a finished build (see :func:`build_package`)."""
    # Like the build: no cyclic collector while the tables are made (no reference cycles;
    # its full scans of the build's millions of objects would cost more than the work).
    with collector_paused():
        return _assemble(built, parameters, names)


def _assemble(
    built: Build, parameters: Mapping[str, np.ndarray] | None, names: Mapping[str, str] | None
) -> Package:
    program, placement = built.program, built.placement
    physical = [int(p) for p in placement.physical]
    names = dict(names or {})
    writer = SectionWriter()

    # Allocations and segments: every named buffer, and the union of their spans per tile.
    alloc_rows, alloc_names = [], []
    seg_rows: list[tuple[int, ...]] = []
    for logical, allocs in enumerate(placement.allocations):
        tile = physical[logical]
        items = sorted(allocs.values(), key=lambda a: (a.address, a.name))
        for a in items:
            alloc_rows.append((tile, a.address, a.size, a.live[0], a.live[1]))
            alloc_names.append(a.name)
        seg_rows += [
            (tile, lo, hi - lo, SEGMENT_READ | SEGMENT_WRITE, -1)
            for lo, hi in union_spans((a.address, a.address + a.size) for a in items)
        ]
    tile_code = write_images(writer, built, seg_rows)  # code, rows, tables (tile_images.py)
    writer.table("segments", seg_rows)
    writer.table("allocations", alloc_rows)

    # Bindings: slices with physical tiles and addresses; weights carry their bytes.
    writer.begin_blob("weights")
    slice_rows: list[tuple[int, ...]] = []
    bindings: list[dict[str, Any]] = []
    for binding in program.bindings:
        role = ROLE_OF[binding.role]
        name = names.get(binding.name, binding.name)
        data = None
        if role == "weight" and parameters is not None:
            data = _parameter(parameters, binding)
        start = len(slice_rows)
        blocks: dict[tuple[int, int, int, int, bool], tuple[int, int]] = {}  # replicas
        for sh in binding.shards:
            offset, size = -1, 0
            if data is not None:
                key = (sh.rows[0], sh.rows[1], sh.cols[0], sh.cols[1], bool(sh.transposed))
                if key not in blocks:
                    block = data[sh.rows[0] : sh.rows[1], sh.cols[0] : sh.cols[1]]
                    raw = np.ascontiguousarray(block.T if sh.transposed else block).tobytes()
                    blocks[key] = (writer.blob_part("weights", raw), len(raw))
                offset, size = blocks[key]
            slice_rows.append((
                physical[sh.tile], placement.address(sh.tile, sh.ref), sh.row_stride,
                sh.rows[0], sh.rows[1], sh.cols[0], sh.cols[1], int(sh.transposed),
                offset, size,
            ))  # fmt: skip
        bindings.append({
            "name": name, "value": binding.name, "role": role, "dtype": binding.dtype,
            "shape": list(binding.shape), "slices": [start, len(slice_rows) - start],
            "embedded": data is not None, "scale_exponent": int(binding.scale_exponent),
        })  # fmt: skip
    if len({b["name"] for b in bindings}) != len(bindings):
        raise GraphError("two bindings share an external name; check the names given")
    writer.table("slices", slice_rows)

    steps, transfer_rows, dest_rows, piece_rows = _program(built, physical)
    writer.table("transfers", transfer_rows)
    writer.table("destinations", dest_rows)
    writer.table("pieces", piece_rows)

    def names_of(role: str) -> list[str]:
        return [b["name"] for b in bindings if b["role"] == role]

    host_calls = [
        {"name": HOST_CALLS[0], "writes": names_of("weight"), "reads": [],
         "runs_program": False},
        {"name": HOST_CALLS[1], "writes": names_of("input"), "reads": names_of("output"),
         "runs_program": True},
    ]  # fmt: skip
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "compiler_version": compiler_version(),
        "target": TARGET,
        "tile_memory_base": TILE_MEMORY_BASE,
        "tile_memory_size": TILE_MEMORY_SIZE,
        "clock_hz": ipu21.CLOCK_HZ,
        "tiles": physical,
        "sections": writer.sections,
        "allocation_names": alloc_names,
        "bindings": bindings,
        "host_calls": host_calls,
        "program": {
            "steps": steps,
            "estimated_cycles": int(program.estimated_cycles),
            "estimated_exchange_cycles": int(program.estimated_exchange_cycles),
        },
        "kernels": [_kernel(k) for k in built.kernels],
        "tile_code": tile_code,
        "report": deterministic_report(built.report()),
    }
    package = Package(manifest, writer.data())
    tile_code["description_digest"] = description_digest(package)
    return package


def _parameter(parameters: Mapping[str, np.ndarray], binding: Binding) -> np.ndarray:
    """A weight as stored on the device, flat-row view: F8 values are F143-encoded."""
    name, shape = binding.name, binding.shape
    if name not in parameters:
        raise GraphError(f"no data for parameter {name!r}")
    array = np.asarray(parameters[name])
    if array.size != math.prod(shape):
        raise GraphError(f"parameter {name!r}: expected shape {shape}, got {array.shape}")
    if binding.dtype == "f8":
        stored = encode_f143(array, binding.scale_exponent)
    else:
        stored = array.astype(ipu21.precision(binding.dtype).numpy_name)
    return np.asarray(stored).reshape(flat_rows(shape))


def _program(
    built: Build, physical: list[int]
) -> tuple[list[dict[str, Any]], np.ndarray, np.ndarray, np.ndarray]:
    """The program's steps and the exchange tables (transfers, destinations, pieces)."""
    placement = built.placement
    images = built.images
    steps: list[dict[str, Any]] = []
    transfers: list[np.ndarray] = [np.zeros((0, 5), np.int64)]
    destinations: list[np.ndarray] = [np.zeros((0, 3), np.int64)]
    pieces: list[np.ndarray] = [np.zeros((0, 4), np.int64)]
    n_transfers = n_destinations = n_pieces = 0
    for index, step in enumerate(built.program.steps):
        if isinstance(step, ComputeStep):
            calls = [_call(c, placement, physical) for c in step.calls]
            steps.append({"kind": "compute", "calls": calls})
            continue
        if isinstance(step, RepeatStep):
            # Iteration i of the body reads block i of each iterated buffer: i x stride bytes
            # past the addresses the body's calls and transfers name (those of iteration 0).
            iterated = [
                [physical[tile], placement.allocations[tile][name].address, name, stride]
                for (tile, name), stride in sorted(step.iterated.items())
            ]
            steps.append(
                {"kind": "repeat", "count": step.count, "length": step.length,
                 "iterated": iterated}
            )  # fmt: skip
            continue
        phase, schedule = built.schedules[index]
        if len(phase.transfers) != len(step.transfers):
            raise AssertionError(f"step {index}: physical phase and program disagree")
        first, first_piece = n_transfers, n_pieces
        arrivals = schedule.first_arrivals
        if images is not None:
            tables = images.phase_tables(index, phase, schedule)
        else:
            tables = phase_tables(phase, schedule)
        _check_sources(index, step, tables, placement, physical)
        count, dests = len(tables.sources), len(tables.dest_tiles)
        transfers.append(np.stack([
            tables.sources, tables.source_addresses, tables.words,
            tables.paired.astype(np.int64), n_destinations + tables.dest_starts[:-1],
        ], axis=1))  # fmt: skip
        arrival = np.full(dests, -1, np.int64)
        if arrivals is not None:
            arrival = np.fromiter(chain.from_iterable(arrivals), np.int64, dests)
        destinations.append(np.stack([tables.dest_tiles, tables.dest_addresses, arrival], axis=1))
        pieces.append(np.stack([
            first + tables.piece_transfer, tables.piece_cycle, tables.piece_offset,
            tables.piece_words,
        ], axis=1))  # fmt: skip
        n_transfers += count
        n_destinations += dests
        n_pieces += len(tables.piece_transfer)
        steps.append({
            "kind": "exchange",
            "label": step.label,
            "transfers": [first, n_transfers - first],
            "pieces": [first_piece, n_pieces - first_piece],
            "schedule": {
                "horizon": int(schedule.horizon),
                "kind": schedule.kind,
                "model": schedule.model.as_dict(),
                "first_arrivals": arrivals is not None,
            },
        })  # fmt: skip
    return (
        steps,
        np.concatenate(transfers),
        np.concatenate(destinations),
        np.concatenate(pieces),
    )


def _check_sources(
    index: int, step: Any, tables: PhaseTables, placement: Placement, physical: list[int]
) -> None:
    """The physical phase sends what the program's step says (tile and address)."""
    tiles = [physical[t.source_tile] for t in step.transfers]
    addresses = [placement.address(t.source_tile, t.source) for t in step.transfers]
    bad = (np.asarray(tiles, np.int64) != tables.sources) | (
        np.asarray(addresses, np.int64) != tables.source_addresses
    )
    if bad.any():
        raise AssertionError(
            f"step {index} transfer {int(np.argmax(bad))}: physical phase disagrees"
        )


def _call(call: KernelCall, placement: Placement, physical: list[int]) -> list[Any]:
    """One kernel call as a compact JSON list: kind, physical tile, then absolute addresses."""
    t = call.tile

    def at(ref: Any) -> int:
        return placement.address(t, ref)

    def view(v: View) -> list[Any]:
        return [at(v.ref), v.rows, v.cols, v.stride, v.dtype]

    tile = physical[t]
    if isinstance(call, GemmCall):
        return [
            "gemm",
            tile,
            at(call.out),
            at(call.left),
            at(call.right),
            call.rows,
            call.k,
            call.c,
            call.precision.name,
            int(call.accumulate),
            call.weights,
            call.scale_exponent,
        ]
    if isinstance(call, AddCall):
        return [
            "add",
            tile,
            at(call.out),
            [at(r) for r in call.inputs],
            call.elements,
            call.precision.name,
        ]
    if isinstance(call, CopyCall) and call.rows > 1:
        return ["copy2d", tile, at(call.dst), at(call.src), call.size, call.rows,
                call.dst_stride, call.src_stride]  # fmt: skip
    if isinstance(call, CopyCall):
        return ["copy", tile, at(call.dst), at(call.src), call.size]
    if isinstance(call, FillCall):
        return ["fill", tile, at(call.dst), call.size]
    if isinstance(call, MapCall):
        attrs = [[k, _scalar(v)] for k, v in call.attrs]
        return ["map", tile, call.kind, view(call.out), [view(v) for v in call.inputs], attrs]
    raise TypeError(f"cannot package kernel call {call!r}")


def _scalar(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return value


def _kernel(artifact: Any) -> dict[str, Any]:
    """A kernel specialisation: its cache key, symbols and the digests of its sources."""
    meta = artifact.details or {}
    digests = {
        c["name"]: c["sha256"]
        for c in meta.get("key_components", ())
        if c["name"].startswith(("source:", "include:"))
    }
    return {
        "name": artifact.name,
        "kernel": meta.get("kernel", ""),
        "key": artifact.key,
        "symbols": list(artifact.symbols),
        "flags": list(meta.get("flags", ())),
        "assembled": bool(artifact.assembled),
        "source_digests": digests,
    }


def deterministic_report(report: Mapping[str, Any]) -> dict[str, Any]:
    """The build report without wall-clock times and kernel-cache state (see format docs)."""
    clean = _jsonable(report, WALL_CLOCK_KEYS)
    assert isinstance(clean, dict)
    clean["events"] = [e for e in clean.get("events", []) if e.get("event") not in CACHE_EVENTS]
    clean["kernels"] = [
        {k: v for k, v in kernel.items() if k in ("name", "key", "symbols", "assembled")}
        for kernel in clean.get("kernels", [])
    ]
    return clean


def report_json(report: Mapping[str, Any]) -> dict[str, Any]:
    """The whole build report (wall-clock times included) as JSON-ready values."""
    clean = _jsonable(report, frozenset())
    assert isinstance(clean, dict)
    return clean


def _jsonable(value: Any, drop: frozenset[str]) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, drop) for k, v in value.items() if k not in drop}
    if isinstance(value, list | tuple):
        return [_jsonable(v, drop) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist(), drop)
    if isinstance(value, np.generic):
        return _jsonable(value.item(), drop)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)

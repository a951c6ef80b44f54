"""Capture: turn one simulated run into a :class:`~ipu_stack.profile.model.Profile`.

:class:`Recorder` is the simulator's :class:`~ipu_stack.runtime.sim.StepObserver`: all it
keeps is each executed step and every tile's clock before and after it. Everything else is
derived afterwards from the program the simulator ran (its calls, exchange phases and
schedules) and the package (allocations, kernel units), so the capture does not depend on how
the simulator executes a step. Within a compute step a tile's calls run back to back at the
target's cycle formulas (:func:`ipu_stack.low.costs.call_cycles`); when the recorded clocks
disagree with those formulas (a device with another cycle model) the step is kept as one
``compute`` segment per tile, kernel ``unattributed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.exchange.bounds import strongest_lower_bound
from ipu_stack.exchange.model import ExchangePhase, PhaseSchedule, latency_model, phase_arrays
from ipu_stack.kernels.registry import parse_gemm_variant
from ipu_stack.low.costs import call_cycles
from ipu_stack.low.program import (
    AddCall,
    ComputeStep,
    CopyCall,
    ExchangeStep,
    FillCall,
    GemmCall,
    KernelCall,
    MapCall,
    Step,
)
from ipu_stack.profile.model import COMPUTE, EXCHANGE, IDLE, SYNC, TABLE_COLUMNS, Profile
from ipu_stack.target import ipu21
from ipu_stack.target.topology import PAIR_PARTNER_BIT

FORMAT = "ipu-stack-profile"


@dataclass(slots=True)
class Recorder:
    """Records every executed step (index and the tiles' clocks around it)."""

    records: list[tuple[int, Step, np.ndarray, np.ndarray]] = field(default_factory=list)

    def step(self, index: int, step: Step, start: np.ndarray, end: np.ndarray) -> None:
        """Called by the simulator after each executed step."""
        self.records.append((index, step, start, end))


class _Names:
    """A growing name list: name -> id."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        return self.ids.setdefault(name, len(self.ids))

    def names(self) -> list[str]:
        return list(self.ids)


def operation_of(buffer: str) -> str:
    """The operation a buffer belongs to: its name up to the last ``.`` (``fc1/gemm.out``)."""
    return buffer.rsplit(".", 1)[0] if "." in buffer else buffer


def _out_buffer(call: KernelCall) -> str:
    if isinstance(call, MapCall):
        return call.out.ref.buffer
    if isinstance(call, CopyCall | FillCall):
        return call.dst.buffer
    return call.out.buffer


class _KernelNames:
    """Kernel unit names of calls (GEMM units from the package's kernel list)."""

    def __init__(self, kernels: list[dict[str, Any]]) -> None:
        self.units: dict[tuple[str, bool, int, int], list[tuple[int, int, str]]] = {}
        for k in kernels:
            try:
                v = parse_gemm_variant(k["name"])
            except GraphError:  # not a GEMM unit name
                continue
            key = (v.spec.precision.name, v.spec.interleaved, v.k, v.c)
            self.units.setdefault(key, []).append((v.small_rows, v.large_rows, v.name))
        self.cache: dict[tuple, str] = {}

    def __call__(self, call: KernelCall) -> str:
        if isinstance(call, GemmCall):
            key = (call.precision.name, call.weights == "interleaved", call.k, call.c, call.rows)
            if key not in self.cache:
                name = f"gemm_{call.precision.name}_{call.weights}_k{call.k}_c{call.c}"
                for small, large, unit in self.units.get(key[:4], []):
                    if call.rows in (small, large):
                        name = unit
                        break
                self.cache[key] = name
            return self.cache[key]
        if isinstance(call, MapCall):
            return f"{call.kind}_{call.out.dtype}"
        if isinstance(call, AddCall):
            return f"reduce_add_{call.precision.name}"
        return "copy" if isinstance(call, CopyCall) else "fill"


def capture(
    package: Any,
    schedules: dict[int, tuple[ExchangePhase, PhaseSchedule]],
    recorder: Recorder,
    cycles: int,
) -> Profile:
    """Build the profile of a recorded run of ``package``.

    Args:
        package: the :class:`~ipu_stack.package.format.Package` that was run.
        schedules: the exchange phases and schedules the simulator ran, by step index.
        recorder: the run's recorder.
        cycles: the run's simulated cycles.
    """
    tiles = list(package.tiles)
    logical = np.full(max(tiles) + 1 + PAIR_PARTNER_BIT, -1, dtype=np.int64)
    logical[np.asarray(tiles)] = np.arange(len(tiles))
    operations, kernels, bounds = _Names(), _Names(), _Names()
    for kind in ("exchange", "sync", "idle"):
        kernels(kind)
    kernel_name = _KernelNames(package.manifest["kernels"])
    executions, segments, phases, intervals = [], [], [], []
    iterations: dict[int, int] = {}
    compute_cache: dict[int, tuple[np.ndarray, ...]] = {}
    phase_cache: dict[int, tuple[Any, ...]] = {}
    for e, (index, step, start, end) in enumerate(recorder.records):
        iteration = iterations.get(index, 0)
        iterations[index] = iteration + 1
        before, after = int(start.max()), int(end.max())
        executions.append((index, iteration, before, after))
        if isinstance(step, ComputeStep):
            if index not in compute_cache:
                compute_cache[index] = _call_arrays(step, operations, kernels, kernel_name)
            segments.append(
                _compute_segments(e, compute_cache[index], start, end, before, after, kernels)
            )
        elif isinstance(step, ExchangeStep):
            if index not in phase_cache:
                phase, schedule = schedules[index]
                phase_cache[index] = _phase_info(phase, schedule, logical, len(tiles), bounds)
            info = phase_cache[index]
            op = operations(_label_operation(step.label, operations))
            segments.append(_exchange_segments(e, info, start, end, before, op, kernels))
            horizon, bound, bound_id, transfers, pieces, rows = info[:6]
            phases.append((e, horizon, bound, bound_id, transfers, pieces))
            if len(rows):
                block = rows.copy()
                block[:, 0] = len(phases) - 1
                intervals.append(block)
    last = recorder.records[-1][3] if recorder.records else np.zeros(len(tiles), np.int64)
    tail = np.flatnonzero(last < cycles)
    if tail.size:
        n = tail.size
        segments.append(
            _rows(tail, len(executions) - 1, last[tail], np.full(n, cycles), IDLE, 0, 2, 0, 0, 0)
        )
    tables = {
        "executions": np.asarray(executions, dtype=np.int64).reshape(-1, 4),
        "segments": _concat(segments, "segments"),
        "phases": np.asarray(phases, dtype=np.int64).reshape(-1, 6),
        "intervals": _concat(intervals, "intervals"),
        "allocations": _allocations(package, logical),
    }
    seg = tables["segments"]
    tables["segments"] = seg[np.lexsort((seg[:, 2], seg[:, 0]))]
    steps = package.manifest["program"]["steps"]
    meta = {
        "format": FORMAT,
        "tiles": tiles,
        "clock_hz": int(package.manifest.get("clock_hz", ipu21.CLOCK_HZ)),
        "cycles": int(cycles),
        "steps": [{"kind": s["kind"], "label": s.get("label", "")} for s in steps],
        "operations": operations.names(),
        "kernels": kernels.names(),
        "bound_names": bounds.names(),
        "allocation_names": list(dict.fromkeys(package.manifest["allocation_names"])),
        "package": {"digest": package.digest, "compiler_version": package.manifest.get(
            "compiler_version", "")},
    }  # fmt: skip
    return Profile(meta, tables)


def _concat(blocks: list[np.ndarray], name: str) -> np.ndarray:
    width = len(TABLE_COLUMNS[name])
    if not blocks:
        return np.zeros((0, width), dtype=np.int64)
    return np.concatenate(blocks).astype(np.int64).reshape(-1, width)


def _rows(*columns: Any) -> np.ndarray:
    """Segment rows from the columns of :data:`TABLE_COLUMNS` ``segments`` (scalars
    broadcast); drops empty segments."""
    cols = np.broadcast_arrays(*(np.asarray(c, dtype=np.int64) for c in columns))
    rows = np.stack(cols, axis=1)
    return rows[rows[:, 3] > rows[:, 2]]


def _label_operation(label: str, operations: _Names) -> str:
    """An exchange label's operation: the longest known operation it starts with."""
    best = ""
    for name in operations.ids:
        if label.startswith(name + " ") and len(name) > len(best):
            best = name
    return best or label.split(" ", 1)[0] or "exchange"


def _call_arrays(
    step: ComputeStep, operations: _Names, kernels: _Names, kernel_name: _KernelNames
) -> tuple[np.ndarray, ...]:
    """Per call: tile, cycles, operation id, kernel id; ordered by tile (program order kept)."""
    n = len(step.calls)
    tile = np.fromiter((c.tile for c in step.calls), dtype=np.int64, count=n)
    cyc = np.fromiter((call_cycles(c) for c in step.calls), dtype=np.int64, count=n)
    op = np.fromiter(
        (operations(operation_of(_out_buffer(c))) for c in step.calls), dtype=np.int64, count=n
    )
    ker = np.fromiter((kernels(kernel_name(c)) for c in step.calls), dtype=np.int64, count=n)
    order = np.argsort(tile, kind="stable")
    return tile[order], cyc[order], op[order], ker[order]


def _compute_segments(
    e: int,
    calls: tuple[np.ndarray, ...],
    start: np.ndarray,
    end: np.ndarray,
    before: int,
    after: int,
    kernels: _Names,
) -> np.ndarray:
    tile, cyc, op, ker = calls
    spent = np.bincount(tile, weights=cyc, minlength=len(start)).astype(np.int64)
    if tile.size == 0 or not np.array_equal(spent, end - start):
        active = np.flatnonzero(end > start)  # another cycle model: one segment per tile
        critical = int(np.argmax(end))
        phase = np.where(active == critical, after - np.maximum(start[active], before), 0)
        return _rows(active, e, start[active], end[active], COMPUTE, 0,
                     kernels("unattributed"), 0, 0, phase)  # fmt: skip
    # runs of consecutive calls on one tile with the same operation and kernel unit
    new = np.ones(tile.size, dtype=bool)
    new[1:] = (tile[1:] != tile[:-1]) | (op[1:] != op[:-1]) | (ker[1:] != ker[:-1])
    first = np.flatnonzero(new)
    run_cycles = np.add.reduceat(cyc, first)
    run_calls = np.diff(np.append(first, tile.size))
    run_tile = tile[first]
    # each run starts where the tile's previous run ended
    tile_first = np.ones(first.size, dtype=bool)
    tile_first[1:] = run_tile[1:] != run_tile[:-1]
    offsets = np.cumsum(run_cycles) - run_cycles
    base = offsets[tile_first]
    group = np.cumsum(tile_first) - 1
    seg_start = start[run_tile] + offsets - base[group]
    seg_end = seg_start + run_cycles
    critical = int(np.argmax(end))
    on_path = run_tile == critical
    clipped = np.clip(seg_end, before, after) - np.clip(seg_start, before, after)
    phase = np.where(on_path, clipped, 0)
    return _rows(run_tile, e, seg_start, seg_end, COMPUTE, op[first], ker[first], run_calls, 0,
                 phase)  # fmt: skip


def _phase_info(
    phase: ExchangePhase,
    schedule: PhaseSchedule,
    logical: np.ndarray,
    tile_count: int,
    bounds: _Names,
) -> tuple[Any, ...]:
    """Horizon, bound, sizes and per-piece intervals (cycles after the sync) of a phase."""
    busy_end = np.zeros(tile_count, dtype=np.int64)
    moved = np.zeros(tile_count, dtype=np.int64)
    arrays = phase_arrays(phase)
    flat = [(i, p.send_cycle, p.words) for i, parts in enumerate(schedule.pieces) for p in parts]
    pieces = len(flat)
    piece = np.asarray(flat, dtype=np.int64).reshape(-1, 3)
    owner, send, words = piece[:, 0], piece[:, 1], piece[:, 2]
    paired = arrays.paired[owner]
    length = np.where(paired, words // 2, words)
    src = logical[arrays.sources[owner]]
    sends = np.column_stack([np.zeros_like(src), src, np.zeros_like(src), send, send + length,
                             words])  # fmt: skip
    # every destination of every piece: latency from the model the schedule was made for
    dt = arrays.destination_transfers
    s_phys, d_phys = arrays.sources[dt], arrays.destination_tiles
    lat = np.where(
        arrays.paired[dt],
        latency_model(schedule.model.latency, paired=True)(s_phys, d_phys),
        latency_model(schedule.model.latency, paired=False)(s_phys, d_phys),
    ).astype(np.int64)
    fan = arrays.fanouts[owner]
    which = np.repeat(np.arange(pieces), fan)
    within = np.arange(which.size) - np.repeat(np.cumsum(fan) - fan, fan)
    entry = arrays.destination_starts[owner][which] + within
    arrive = send[which] + lat[entry]
    recvs = np.column_stack([np.zeros_like(arrive), logical[d_phys[entry]], np.ones_like(arrive),
                             arrive, arrive + length[which], words[which]])  # fmt: skip
    partner = logical[arrays.sources[owner] ^ PAIR_PARTNER_BIT]
    keep = paired & (partner >= 0)
    busy = np.column_stack([np.zeros(keep.sum(), np.int64), partner[keep],
                            np.full(keep.sum(), 2), send[keep], (send + length)[keep],
                            np.zeros(keep.sum(), np.int64)])  # fmt: skip
    table = np.concatenate([sends, recvs, busy]).astype(np.int64)
    if len(table):
        np.maximum.at(busy_end, table[:, 1], table[:, 4])
        np.add.at(moved, table[:, 1], table[:, 5] * ipu21.WORD_BYTES)
    participates = np.zeros(tile_count, dtype=bool)
    participates[table[:, 1]] = True
    preemptive = pieces > len(phase.transfers)
    bound, name = strongest_lower_bound(phase, schedule.model, preemptive=preemptive)
    info = (schedule.horizon, int(bound), bounds(name), len(phase.transfers), pieces, table)
    return (*info, participates, busy_end, moved)


def _exchange_segments(
    e: int,
    info: tuple[Any, ...],
    start: np.ndarray,
    end: np.ndarray,
    before: int,
    op: int,
    kernels: _Names,
) -> np.ndarray:
    _, *_, participates, busy_end, moved = info
    n = start.size
    tiles = np.arange(n)
    sync0, x0 = before, before + ipu21.SYNC_CYCLES
    # each tile leaves the exchange when the simulator says it did (its executed row ends)
    x1 = np.maximum(end, x0)
    horizon = int(x1.max()) - x0
    # the step's cycles go to the tile whose exchange activity ends last
    critical = int(np.argmax(np.where(participates, busy_end, -1)))
    if x1[critical] != x1.max():
        critical = int(np.argmax(x1))
    on_path = tiles == critical
    kind = np.where(participates, EXCHANGE, IDLE)
    ker = np.where(participates, kernels("exchange"), kernels("idle"))
    return np.concatenate([
        _rows(tiles, e, start, sync0, IDLE, op, kernels("idle"), 0, 0, 0),
        _rows(tiles, e, sync0, x0, SYNC, op, kernels("sync"), 0, 0,
              np.where(on_path, ipu21.SYNC_CYCLES, 0)),
        _rows(tiles, e, x0, x1, kind, op, ker, 0, np.where(participates, moved, 0),
              np.where(on_path, horizon, 0)),
    ])  # fmt: skip


def _allocations(package: Any, logical: np.ndarray) -> np.ndarray:
    table = package.table("allocations")
    names = package.manifest["allocation_names"]
    ids = {name: i for i, name in enumerate(dict.fromkeys(names))}
    name_ids = np.fromiter((ids[n] for n in names), dtype=np.int64, count=len(names))
    region = (table[:, 1] >= ipu21.INTERLEAVED_BASE).astype(np.int64)
    return np.column_stack([logical[table[:, 0]], table[:, 1:5], region, name_ids]).astype(np.int64)

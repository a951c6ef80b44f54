"""Chrome trace-event JSON (``chrome://tracing``, Perfetto) from a profile.

Times are microseconds at the profile's clock (``ts`` and ``dur`` of complete ``"X"``
events). With ``tiles_per_track`` 1 (the default) every tile is a thread track (``tid`` its
physical id) and tiles are grouped 64 to a process (``pid``), so 1,472 tiles make 23
collapsible groups; each compute, exchange and sync segment is a slice (idle time is the gap
between slices). With ``tiles_per_track`` N > 1, each track stands for N tiles and holds one
slice per executed step in which any of them is busy, spanning the step's wall-clock
interval and named after the kernel that takes most of its tile-cycles (``args``: busy
tile-cycles and busy tiles), which keeps the file small for whole-machine runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.profile.model import IDLE, KINDS, Profile

TILES_PER_PROCESS = 64


def trace_events(profile: Profile, tiles_per_track: int = 1) -> dict[str, Any]:
    """The trace as a JSON-able object ``{"traceEvents": [...], ...}``."""
    if tiles_per_track < 1:
        raise GraphError(f"--tiles-per-track must be at least 1, got {tiles_per_track}")
    us = 1e6 / profile.meta["clock_hz"]
    tiles = profile.meta["tiles"]
    kernels, operations = profile.meta["kernels"], profile.meta["operations"]
    seg = profile.tables["segments"]
    seg = seg[seg[:, 4] != IDLE]
    events: list[dict[str, Any]] = []
    tracks = -(-len(tiles) // tiles_per_track)
    group = TILES_PER_PROCESS if tiles_per_track == 1 else max(1, 64 // tiles_per_track)
    for track in range(tracks):
        first = track * tiles_per_track
        last = min(len(tiles), first + tiles_per_track) - 1
        pid = track // group
        if track % group == 0:
            end = min(len(tiles), (track + group) * tiles_per_track) - 1
            events.append({"ph": "M", "name": "process_name", "pid": pid,
                           "args": {"name": f"tiles {first}..{end} (logical)"}})  # fmt: skip
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                           "args": {"sort_index": pid}})  # fmt: skip
        name = f"tile {tiles[first]}" if first == last else f"tiles {first}..{last} (logical)"
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": track,
                       "args": {"name": name}})  # fmt: skip
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": track,
                       "args": {"sort_index": track}})  # fmt: skip
    if tiles_per_track == 1:
        for tile, e, start, end, kind, op, kernel, calls, nbytes, _ in seg.tolist():
            events.append({
                "ph": "X", "name": kernels[kernel], "cat": KINDS[kind],
                "pid": tile // group, "tid": tile,
                "ts": _us(start, us), "dur": round(_us(end, us) - _us(start, us), 4),
                "args": {"operation": operations[op], "phase": e, "cycles": end - start,
                         "calls": calls, "bytes": nbytes},
            })  # fmt: skip
    else:
        events += _grouped(profile, seg, tiles_per_track, group, us)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {"cycles": profile.cycles, "clock_hz": profile.meta["clock_hz"],
                      "tiles": len(tiles), "tiles_per_track": tiles_per_track},
    }  # fmt: skip


def _us(cycles: int, us_per_cycle: float) -> float:
    """A cycle count in microseconds, rounded so that adjacent slices meet exactly."""
    return round(cycles * us_per_cycle, 4)


def _grouped(
    profile: Profile, seg: np.ndarray, per: int, group: int, us: float
) -> list[dict[str, Any]]:
    """One slice per (track, executed step) with any busy tile."""
    execs = profile.tables["executions"]
    kernels = profile.meta["kernels"]
    track = seg[:, 0] // per
    length = seg[:, 3] - seg[:, 2]
    key = track * len(execs) + seg[:, 1]
    events = []
    for k in np.unique(key).tolist():
        rows = key == k
        t, e = divmod(k, len(execs))
        by_kernel = np.bincount(seg[rows, 6], weights=length[rows])
        start, end = int(execs[e, 2]), int(execs[e, 3])
        events.append({
            "ph": "X", "name": kernels[int(np.argmax(by_kernel))], "cat": "step",
            "pid": t // group, "tid": t, "ts": _us(start, us),
            "dur": round(_us(end, us) - _us(start, us), 4),
            "args": {"phase": e, "busy_tile_cycles": int(length[rows].sum()),
                     "busy_tiles": int(np.unique(seg[rows, 0]).size)},
        })  # fmt: skip
    return events


def write_chrome_trace(
    profile: Profile, path: str | os.PathLike[str], tiles_per_track: int = 1
) -> tuple[int, int]:
    """Write the trace JSON; returns (bytes written, slices)."""
    trace = trace_events(profile, tiles_per_track)
    text = json.dumps(trace, separators=(",", ":"))
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, target)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise GraphError(f"cannot write {str(path)!r}: {err.strerror}") from None
    slices = sum(1 for ev in trace["traceEvents"] if ev["ph"] == "X")
    return len(text), slices

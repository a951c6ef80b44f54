"""``profile-render``: one self-contained HTML report of a profile.

The file carries its data and code: no network access when it is opened. The per-tile
segments go in as zlib-compressed little-endian int32 columns (base64), inflated by the
browser's ``DecompressionStream``; tables, phases and the memory heat map go in as JSON. The
drawing is inline canvas code (:mod:`ipu_stack.profile.report_page`): a timeline of up to
1,472 tiles x 10^5 segments needs one ``fillRect`` per segment, which a charting library
would make several megabytes larger and slower, not better.

Sections: a zoomable per-tile timeline coloured by kind (or kernel or operation), the
per-operation and per-kernel tables (:func:`ipu_stack.profile.query.query`), the exchange
phases' horizons against their lower bounds with barrier arrivals, and a tile-memory heat map
(bytes per tile in each region at the tile's peak step).
"""

from __future__ import annotations

import base64
import json
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.profile.model import Profile
from ipu_stack.profile.query import barriers, execution_name, query
from ipu_stack.profile.report_page import PAGE
from ipu_stack.target import ipu21

#: Bytes each region can hold per tile (standard: below the interleaved base).
REGION_CAPACITY = (
    ipu21.INTERLEAVED_BASE - ipu21.TILE_MEMORY_BASE,
    ipu21.LOADER_LIMIT - ipu21.INTERLEAVED_BASE,
)


def memory_peaks(profile: Profile) -> dict[str, Any]:
    """Per tile: the step its live bytes peak at, and the bytes per region then.

    Returns:
        ``{"peak_step": [...], "standard": [...], "interleaved": [...]}`` (logical tiles).
    """
    alloc = profile.tables["allocations"]
    steps = len(profile.meta["steps"])
    tiles = profile.tile_count
    live = np.zeros((tiles, 2, steps + 1), dtype=np.int64)
    if len(alloc):
        first = np.clip(alloc[:, 3], 0, steps)
        end = np.clip(alloc[:, 4], 0, steps)
        np.add.at(live, (alloc[:, 0], alloc[:, 5], first), alloc[:, 2])
        np.add.at(live, (alloc[:, 0], alloc[:, 5], end), -alloc[:, 2])
    live = np.cumsum(live, axis=2)[:, :, :steps] if steps else live[:, :, :1]
    total = live.sum(axis=1)
    peak = np.argmax(total, axis=1)
    at_peak = live[np.arange(tiles), :, peak]
    return {
        "peak_step": peak.tolist(),
        "standard": at_peak[:, 0].tolist(),
        "interleaved": at_peak[:, 1].tolist(),
        "capacity": list(REGION_CAPACITY),
    }


def _column(values: np.ndarray) -> str:
    if values.size and (values.max() >= 2**31 or values.min() < -(2**31)):
        raise GraphError("profile-render: cycle counts beyond 2**31 are not supported")
    raw = np.ascontiguousarray(values, dtype="<i4").tobytes()
    return base64.b64encode(zlib.compress(raw, 9)).decode("ascii")


def report_data(profile: Profile) -> dict[str, Any]:
    """Everything the page shows, as one JSON-able object."""
    seg = profile.tables["segments"]
    execs = profile.tables["executions"]
    columns = {"tile": 0, "start": 2, "end": 3, "kind": 4, "operation": 5, "kernel": 6}
    tables = {g: query(profile, g, "phase-cycles")["rows"] for g in ("operation", "kernel", "kind")}
    return {
        "meta": {
            "tiles": profile.meta["tiles"],
            "cycles": profile.cycles,
            "clock_hz": profile.meta["clock_hz"],
            "kernels": profile.meta["kernels"],
            "operations": profile.meta["operations"],
            "package": profile.meta.get("package", {}),
        },
        "segments": {name: _column(seg[:, c]) for name, c in columns.items()},
        "count": len(seg),
        "executions": [
            {"start": int(s), "end": int(e), "name": execution_name(profile, i)}
            for i, (s, e) in enumerate(execs[:, 2:4].tolist())
        ],
        "tables": tables,
        "barriers": barriers(profile),
        "memory": memory_peaks(profile),
    }


def render_html(profile: Profile) -> str:
    """The report page as text."""
    data = json.dumps(report_data(profile), separators=(",", ":"), sort_keys=True)
    data = data.replace("</", "<\\/")  # never closes the script element early
    return PAGE.replace("/*DATA*/null", data, 1)


def write_report(profile: Profile, path: str | os.PathLike[str]) -> int:
    """Write the report to ``path`` atomically; returns its size in bytes."""
    text = render_html(profile)
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise GraphError(f"cannot write {str(path)!r}: {err.strerror}") from None
    return len(text.encode("utf-8"))

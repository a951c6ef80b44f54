"""Questions asked of a profile: where the cycles went (grouped, filtered) and the barriers.

``phase_cycles`` is a group's share of the run's wall clock (see
:mod:`ipu_stack.profile.model`): over all groups it sums to the run's simulated cycles.
``work_cycles`` is tile-cycles (the sum of the segments' lengths over their tiles);
``mean``, ``p50``, ``p95`` and ``max`` are of segment lengths.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.profile.model import KINDS, Profile

GROUPS = ("kind", "kernel", "operation", "phase", "tile")
SORTS = ("phase-cycles", "work-cycles", "count", "mean", "p50", "p95", "max", "name")


def physical_to_logical(profile: Profile, tiles: Sequence[int]) -> list[int]:
    """Logical indices of physical tile ids.

    Raises:
        GraphError: a tile is not in the profile.
    """
    index = {t: i for i, t in enumerate(profile.meta["tiles"])}
    out = []
    for tile in tiles:
        if tile not in index:
            some = ", ".join(str(t) for t in profile.meta["tiles"][:6])
            raise GraphError(
                f"tile {tile} is not in the profile; its {profile.tile_count} physical tiles "
                f"are {some}{', ...' if profile.tile_count > 6 else ''}"
            )
        out.append(index[tile])
    return out


def _check_phases(profile: Profile, phases: Sequence[int]) -> None:
    count = len(profile.tables["executions"])
    for p in phases:
        if not 0 <= p < count:
            raise GraphError(f"phase {p} is not in the profile (phases 0..{count - 1})")


def execution_name(profile: Profile, execution: int) -> str:
    """``step S`` (``step S iteration I`` inside a loop), its kind and label."""
    step, iteration = (int(v) for v in profile.tables["executions"][execution, :2])
    info = profile.meta["steps"][step]
    loop = profile.column("executions", "iteration")[profile.column("executions", "step") == step]
    name = f"step {step}" + (f" iteration {iteration}" if loop.size > 1 else "")
    label = f" {info['label']}" if info.get("label") else ""
    return f"{name} {info['kind']}{label}"


def query(
    profile: Profile,
    group_by: str = "kind",
    sort_by: str = "phase-cycles",
    tiles: Sequence[int] = (),
    phases: Sequence[int] = (),
    kinds: Sequence[str] = (),
    limit: int | None = None,
) -> dict[str, Any]:
    """Group the profile's segments and measure each group.

    Args:
        profile: the profile.
        group_by: one of :data:`GROUPS`.
        sort_by: one of :data:`SORTS` (descending; ``name`` ascending).
        tiles: keep only these physical tiles.
        phases: keep only these phases (executed steps, numbered from 0).
        kinds: keep only these segment kinds.
        limit: keep the first ``limit`` groups after sorting (totals cover every group).

    Returns:
        ``{"group_by", "rows": [{name, count, phase_cycles, work_cycles, mean, p50, p95,
        max, calls, bytes}], "total": {...}, "cycles"}``.

    Raises:
        GraphError: an unknown group, sort, kind, tile or phase.
    """
    if group_by not in GROUPS:
        raise GraphError(f"--group-by {group_by!r}: choose one of {', '.join(GROUPS)}")
    if sort_by not in SORTS:
        raise GraphError(f"--sort-by {sort_by!r}: choose one of {', '.join(SORTS)}")
    for kind in kinds:
        if kind not in KINDS:
            raise GraphError(f"--kind {kind!r}: choose one of {', '.join(KINDS)}")
    _check_phases(profile, phases)
    seg = profile.tables["segments"]
    keep = np.ones(len(seg), dtype=bool)
    if tiles:
        keep &= np.isin(seg[:, 0], physical_to_logical(profile, tiles))
    if phases:
        keep &= np.isin(seg[:, 1], list(phases))
    if kinds:
        keep &= np.isin(seg[:, 4], [KINDS.index(k) for k in kinds])
    seg = seg[keep]
    column = {"tile": 0, "phase": 1, "kind": 4, "operation": 5, "kernel": 6}[group_by]
    keys, inverse = np.unique(seg[:, column], return_inverse=True)
    length = seg[:, 3] - seg[:, 2]
    rows = []
    order = np.lexsort((length, inverse))
    bounds = np.searchsorted(inverse[order], np.arange(keys.size + 1))
    for g, key in enumerate(keys.tolist()):
        lengths = length[order[bounds[g] : bounds[g + 1]]]
        members = inverse == g
        rows.append(
            {
                "name": _key_name(profile, group_by, key),
                **_stats(lengths),
                "phase_cycles": int(seg[members, 9].sum()),
                "calls": int(seg[members, 7].sum()),
                "bytes": int(seg[members, 8].sum()),
            }
        )
    field = sort_by.replace("-", "_")
    if sort_by == "name":
        rows.sort(key=lambda r: r["name"])
    else:
        rows.sort(key=lambda r: (-r[field], r["name"]))
    total = {
        "name": "total",
        **_stats(np.sort(length)),
        "phase_cycles": int(seg[:, 9].sum()),
        "calls": int(seg[:, 7].sum()),
        "bytes": int(seg[:, 8].sum()),
    }
    return {
        "group_by": group_by,
        "rows": rows[:limit] if limit is not None else rows,
        "groups": len(rows),
        "total": total,
        "cycles": profile.cycles,
        "clock_hz": profile.meta["clock_hz"],
        "filtered": bool(tiles or phases or kinds),
    }


def _stats(lengths: np.ndarray) -> dict[str, Any]:
    """Count, work cycles and mean/p50/p95/max of sorted segment lengths."""
    n = int(lengths.size)
    if n == 0:
        return {"count": 0, "work_cycles": 0, "mean": 0.0, "p50": 0, "p95": 0, "max": 0}

    def pct(q: float) -> int:  # nearest rank
        return int(lengths[min(n - 1, max(0, int(np.ceil(q * n)) - 1))])

    return {
        "count": n,
        "work_cycles": int(lengths.sum()),
        "mean": float(lengths.mean()),
        "p50": pct(0.5),
        "p95": pct(0.95),
        "max": int(lengths[-1]),
    }


def _key_name(profile: Profile, group_by: str, key: int) -> str:
    if group_by == "kind":
        return KINDS[key]
    if group_by == "kernel":
        return str(profile.meta["kernels"][key])
    if group_by == "operation":
        return str(profile.meta["operations"][key])
    if group_by == "tile":
        return f"tile {profile.meta['tiles'][key]}"
    return f"phase {key}: {execution_name(profile, key)}"


def format_query(result: dict[str, Any]) -> list[str]:
    """The query as a text table (one line per group, then the total)."""
    head = ("count", "phase_cycles", "work_cycles", "mean", "p50", "p95", "max")
    rows = [*result["rows"], result["total"]]
    width = max(len(result["group_by"]), *(len(r["name"]) for r in rows))
    lines = [f"{result['group_by']:<{width}}  " + "  ".join(f"{h:>12}" for h in head)]
    for r in rows:
        values = [f"{r[h]:>12,.1f}" if h == "mean" else f"{r[h]:>12,}" for h in head]
        lines.append(f"{r['name']:<{width}}  " + "  ".join(values))
    shown = len(result["rows"])
    if shown < result["groups"]:
        lines.insert(-1, f"... {result['groups'] - shown} more groups (total covers all)")
    cycles, clock = result["cycles"], result["clock_hz"]
    scope = "filtered segments" if result["filtered"] else "all segments"
    lines.append(
        f"phase cycles of {scope}: {result['total']['phase_cycles']:,}; the run: {cycles:,} "
        f"simulated cycles = {cycles / clock * 1e6:.3f} us at {clock / 1e9:g} GHz"
    )
    return lines


def barriers(profile: Profile) -> list[dict[str, Any]]:
    """Per exchange phase: tiles' arrivals at its sync, the late tile, horizon against bound."""
    seg = profile.tables["segments"]
    out = []
    tiles = profile.meta["tiles"]
    for row in profile.tables["phases"].tolist():
        e, horizon, bound, bound_id, transfers, pieces = row
        mine = seg[seg[:, 1] == e]
        arrival = np.full(profile.tile_count, np.iinfo(np.int64).max)
        np.minimum.at(arrival, mine[:, 0], mine[:, 2])
        late = int(np.argmax(arrival))
        first = int(np.argmin(arrival))
        sync_start = int(profile.tables["executions"][e, 2])
        out.append(
            {
                "phase": e,
                "step": int(profile.tables["executions"][e, 0]),
                "name": execution_name(profile, e),
                "first_arrival": int(arrival[first]),
                "first_tile": tiles[first],
                "last_arrival": int(arrival[late]),
                "late_tile": tiles[late],
                "spread": int(arrival[late] - arrival[first]),
                "sync_start": sync_start,
                "horizon": horizon,
                "lower_bound": bound,
                "bound": profile.meta["bound_names"][bound_id],
                "ratio": horizon / bound if bound else None,
                "transfers": transfers,
                "pieces": pieces,
            }
        )
    return out


def format_barriers(records: list[dict[str, Any]]) -> list[str]:
    """Barrier records as text, one line per exchange phase."""
    lines = []
    for r in records:
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        lines.append(
            f"phase {r['phase']} ({r['name']}): arrivals {r['first_arrival']:,} (tile "
            f"{r['first_tile']}) .. {r['last_arrival']:,} (late tile {r['late_tile']}), spread "
            f"{r['spread']:,}; horizon {r['horizon']:,} vs bound {r['lower_bound']:,} "
            f"({r['bound']}, ratio {ratio}); {r['transfers']:,} transfers, {r['pieces']:,} pieces"
        )
    if not records:
        lines.append("no exchange phases")
    return lines

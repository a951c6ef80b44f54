"""Package validation: everything a reader checks before a device uses a package."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ipu_stack.errors import PackageError
from ipu_stack.package.format import (
    HOST_CALLS,
    ROLES,
    SCHEMA_VERSION,
    SEGMENT_EXEC,
    SEGMENT_READ,
    SEGMENT_WRITE,
    TABLE_COLUMNS,
    TARGET,
    TILE_MEMORY_BASE,
    TILE_MEMORY_SIZE,
    Package,
    element_bytes,
    flat_rows,
)
from ipu_stack.package.tile_images import validate_tile_code
from ipu_stack.target import ipu21


def _fail(where: str, message: str) -> PackageError:
    return PackageError(f"{where}: {message}")


def _require(
    manifest: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str
) -> Any:
    if key not in manifest:
        raise _fail(where, f"manifest has no {key!r}")
    value = manifest[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise _fail(where, f"manifest {key!r} has the wrong type ({type(value).__name__})")
    return value


def validate(package: Package, where: str = "<package>") -> None:
    """Check a package before anything uses it.

    Rejects: another target or memory map; no tiles; duplicate or out-of-range tiles; sections
    outside the data; segments outside tile memory or overlapping; allocations outside their
    tile's segments; bindings with empty or duplicate names, unknown roles or dtypes, slices
    outside the binding or outside valid tile memory, or weight data outside the file; host
    calls that are missing, repeated or inconsistent with the bindings; a program whose steps
    name missing transfers or whose pieces name missing transfers.

    Raises:
        PackageError: naming the file and the first problem found (what and where).
    """
    m = package.manifest
    if _require(m, "schema_version", int, where) != SCHEMA_VERSION:
        raise _fail(where, f"manifest schema version {m['schema_version']} != {SCHEMA_VERSION}")
    _require(m, "compiler_version", str, where)
    if _require(m, "target", str, where) != TARGET:
        raise _fail(where, f"target {m['target']!r} is not {TARGET!r}")
    base = _require(m, "tile_memory_base", int, where)
    size = _require(m, "tile_memory_size", int, where)
    if (base, size) != (TILE_MEMORY_BASE, TILE_MEMORY_SIZE):
        raise _fail(
            where,
            f"tile memory [{base:#x}, +{size}) does not match the {TARGET} map "
            f"[{TILE_MEMORY_BASE:#x}, +{TILE_MEMORY_SIZE})",
        )
    tiles = _require(m, "tiles", list, where)
    if not tiles:
        raise _fail(where, "the package has no tiles")
    if not all(isinstance(t, int) and 0 <= t < ipu21.TILES for t in tiles):
        bad = next(t for t in tiles if not (isinstance(t, int) and 0 <= t < ipu21.TILES))
        raise _fail(where, f"tile id {bad!r} outside 0..{ipu21.TILES - 1}")
    if len(set(tiles)) != len(tiles):
        dup = sorted({t for t in tiles if tiles.count(t) > 1})[0]
        raise _fail(where, f"tile {dup} appears twice in the tile list")
    _validate_sections(package, where)
    tile_set = np.asarray(sorted(tiles), dtype=np.int64)
    segments = _validate_segments(package, tile_set, where)
    _validate_allocations(package, tile_set, segments, where)
    _validate_bindings(package, tile_set, segments, where)
    _validate_host_calls(package, where)
    _validate_program(package, where)
    validate_tile_code(package, where)
    _require(m, "kernels", list, where)
    _require(m, "report", dict, where)
    from ipu_stack.package.validate_program import validate_structure

    validate_structure(package, where, segments)


def _validate_sections(package: Package, where: str) -> None:
    sections = _require(package.manifest, "sections", dict, where)
    for name in (*TABLE_COLUMNS, "weights", "images"):
        if name not in sections:
            raise _fail(where, f"section {name!r} is missing")
    for name, entry in sections.items():
        if not isinstance(entry, dict):
            raise _fail(where, f"section {name!r} is not an object")
        offset, size = entry.get("offset"), entry.get("size")
        if not isinstance(offset, int) or not isinstance(size, int) or offset < 0 or size < 0:
            raise _fail(where, f"section {name!r} has a bad offset or size")
        if offset + size > len(package.data):
            raise _fail(
                where,
                f"section {name!r} [{offset}, {offset + size}) runs past the data "
                f"({len(package.data)} bytes)",
            )
        if name in TABLE_COLUMNS:
            shape = entry.get("shape")
            columns = len(TABLE_COLUMNS[name])
            if (
                entry.get("dtype") != "<i8"
                or not isinstance(shape, list)
                or len(shape) != 2
                or shape[1] != columns
                or not isinstance(shape[0], int)
                or shape[0] * columns * 8 != size
                or offset % 8
            ):
                raise _fail(where, f"table {name!r} is not an aligned int64 [rows, {columns}]")


def _tile_names(tiles: np.ndarray, tile_set: np.ndarray, table: str, where: str) -> None:
    known = np.isin(tiles, tile_set)
    if not known.all():
        row = int(np.argmin(known))
        raise _fail(where, f"{table} row {row} names tile {int(tiles[row])}, not in the package")


def _validate_segments(package: Package, tile_set: np.ndarray, where: str) -> np.ndarray:
    seg = package.table("segments")
    if len(seg) == 0:
        raise _fail(where, "no memory segments")
    _tile_names(seg[:, 0], tile_set, "segments", where)
    start, end = seg[:, 1], seg[:, 1] + seg[:, 2]
    limit = TILE_MEMORY_BASE + TILE_MEMORY_SIZE
    bad = (seg[:, 2] <= 0) | (start < TILE_MEMORY_BASE) | (end > limit)
    bad |= (seg[:, 3] & ~(SEGMENT_READ | SEGMENT_WRITE | SEGMENT_EXEC)) != 0
    if bad.any():
        i = int(np.argmax(bad))
        raise _fail(
            where,
            f"tile {int(seg[i, 0])}: segment [{int(start[i]):#x}, {int(end[i]):#x}) (flags "
            f"{int(seg[i, 3])}) lies outside tile memory [{TILE_MEMORY_BASE:#x}, "
            f"{TILE_MEMORY_BASE + TILE_MEMORY_SIZE:#x}) or is empty",
        )
    order = np.lexsort((start, seg[:, 0]))
    s = seg[order]
    same = s[1:, 0] == s[:-1, 0]
    overlap = same & (s[1:, 1] < s[:-1, 1] + s[:-1, 2])
    if overlap.any():
        i = int(np.argmax(overlap))
        raise _fail(
            where,
            f"tile {int(s[i, 0])}: segments [{int(s[i, 1]):#x}, {int(s[i, 1] + s[i, 2]):#x}) "
            f"and [{int(s[i + 1, 1]):#x}, {int(s[i + 1, 1] + s[i + 1, 2]):#x}) overlap",
        )
    return s


def _inside_segments(
    segments: np.ndarray, tiles: np.ndarray, start: np.ndarray, end: np.ndarray
) -> np.ndarray:
    """Whether each span [start, end) on its tile lies inside one segment (segments sorted)."""
    key_seg = segments[:, 0] * (1 << 32) + segments[:, 1]
    key = tiles * (1 << 32) + start
    i = np.searchsorted(key_seg, key, side="right") - 1
    ok = i >= 0
    i = np.maximum(i, 0)
    ok &= segments[i, 0] == tiles
    ok &= segments[i, 1] + segments[i, 2] >= end
    return np.asarray(ok & (end > start))


def _validate_allocations(
    package: Package, tile_set: np.ndarray, segments: np.ndarray, where: str
) -> None:
    alloc = package.table("allocations")
    names = _require(package.manifest, "allocation_names", list, where)
    if len(names) != len(alloc):
        raise _fail(where, f"{len(names)} allocation names for {len(alloc)} allocations")
    _tile_names(alloc[:, 0], tile_set, "allocations", where)
    ok = _inside_segments(segments, alloc[:, 0], alloc[:, 1], alloc[:, 1] + alloc[:, 2])
    ok &= alloc[:, 3] <= alloc[:, 4]
    if not ok.all():
        i = int(np.argmin(ok))
        raise _fail(
            where,
            f"tile {int(alloc[i, 0])}: allocation {names[i]!r} [{int(alloc[i, 1]):#x}, "
            f"+{int(alloc[i, 2])}) lies outside the tile's segments or has a bad lifetime",
        )
    seen: set[tuple[int, str]] = set()
    for tile, name in zip(alloc[:, 0].tolist(), names, strict=True):
        if not isinstance(name, str) or not name or (tile, name) in seen:
            raise _fail(where, f"tile {tile}: allocation name {name!r} is empty or repeated")
        seen.add((tile, name))


def _validate_bindings(
    package: Package, tile_set: np.ndarray, segments: np.ndarray, where: str
) -> None:
    bindings = _require(package.manifest, "bindings", list, where)
    slices = package.table("slices")
    weights_size = package.manifest["sections"]["weights"]["size"]
    names: set[str] = set()
    for b in bindings:
        name = b.get("name") if isinstance(b, dict) else None
        if not isinstance(name, str) or not name:
            raise _fail(where, f"a binding has an empty or missing name: {b!r:.80}")
        here = f"binding {name!r}"
        if name in names:
            raise _fail(where, f"{here} is defined twice")
        names.add(name)
        if b.get("role") not in ROLES:
            raise _fail(where, f"{here}: role {b.get('role')!r} is not one of {', '.join(ROLES)}")
        if not isinstance(b.get("dtype"), str) or b["dtype"] not in ipu21.PRECISIONS:
            raise _fail(where, f"{here}: dtype {b.get('dtype')!r} is not supported")
        shape = b.get("shape")
        if (
            not isinstance(shape, list)
            or not shape
            or not all(isinstance(d, int) and d > 0 for d in shape)
        ):
            raise _fail(where, f"{here}: bad shape {shape!r}")
        span = b.get("slices")
        if (
            not isinstance(span, list)
            or len(span) != 2
            or not all(isinstance(v, int) and v >= 0 for v in span)
            or span[0] + span[1] > len(slices)
            or span[1] == 0
        ):
            raise _fail(where, f"{here}: slice range {span!r} is empty or outside the table")
        _validate_slices(
            b,
            slices[span[0] : span[0] + span[1]],
            tile_set,
            segments,
            weights_size,
            f"{where}: {here}",
        )


def _validate_slices(
    binding: Mapping[str, Any],
    sl: np.ndarray,
    tile_set: np.ndarray,
    segments: np.ndarray,
    weights_size: int,
    where: str,
) -> None:
    n, c = flat_rows(binding["shape"])
    eb = element_bytes(binding["dtype"])
    tile, address, stride, r0, r1, c0, c1, transposed, offset, size = sl.T
    known = np.isin(tile, tile_set)
    if not known.all():
        i = int(np.argmin(known))
        raise PackageError(f"{where}: slice {i} names tile {int(tile[i])}, not in the package")
    bad = (r0 < 0) | (r1 > n) | (r0 >= r1) | (c0 < 0) | (c1 > c) | (c0 >= c1)
    if bad.any():
        i = int(np.argmax(bad))
        raise PackageError(
            f"{where}: slice {i} rows [{int(r0[i])}, {int(r1[i])}) cols [{int(c0[i])}, "
            f"{int(c1[i])}) lie outside the value's [{n}, {c}] view"
        )
    nrows = np.where(transposed != 0, c1 - c0, r1 - r0)
    row_bytes = np.where(transposed != 0, r1 - r0, c1 - c0) * eb
    extent = (nrows - 1) * stride + row_bytes
    ok = (stride >= row_bytes) & (address % ipu21.WORD_ALIGNMENT == 0)
    ok &= _inside_segments(segments, tile, address, address + extent)
    if not ok.all():
        i = int(np.argmin(ok))
        raise PackageError(
            f"{where}: slice {i} on tile {int(tile[i])} [{int(address[i]):#x}, "
            f"{int(address[i] + extent[i]):#x}) is misaligned or not inside the tile's memory "
            "segments"
        )
    embedded = offset >= 0
    if binding["role"] != "weight" and embedded.any():
        raise PackageError(f"{where}: a {binding['role']} binding carries data")
    if binding["role"] == "weight":
        if embedded.any() and not embedded.all():
            raise PackageError(f"{where}: some slices carry data and some do not")
        want = nrows * row_bytes
        bad = embedded & ((size != want) | (offset + size > weights_size))
        if bad.any():
            i = int(np.argmax(bad))
            raise PackageError(
                f"{where}: slice {i} data [{int(offset[i])}, +{int(size[i])}) is not "
                f"{int(want[i])} bytes inside the weights section ({weights_size} bytes)"
            )


def _validate_host_calls(package: Package, where: str) -> None:
    calls = _require(package.manifest, "host_calls", list, where)
    names = [str(c.get("name")) for c in calls if isinstance(c, dict)]
    if sorted(names) != sorted(HOST_CALLS) or len(names) != len(calls):
        raise _fail(where, f"host calls are {names!r}, expected exactly {list(HOST_CALLS)}")
    by_role = {role: sorted(b["name"] for b in package.bindings(role)) for role in ROLES}
    expect = {
        "initialize": (by_role["weight"], [], False),
        "run": (by_role["input"], by_role["output"], True),
    }
    for call in calls:
        want_writes, want_reads, runs = expect[call["name"]]
        writes, reads = call.get("writes"), call.get("reads")
        if (
            not isinstance(writes, list)
            or not all(isinstance(w, str) for w in writes)
            or sorted(writes) != want_writes
            or len(set(writes)) != len(writes)
        ):
            raise _fail(
                where,
                f"host call {call['name']!r} writes {writes!r}, but the {call['name']} "
                f"bindings are {want_writes!r}",
            )
        if (
            not isinstance(reads, list)
            or not all(isinstance(r, str) for r in reads)
            or sorted(reads) != want_reads
        ):
            raise _fail(
                where, f"host call {call['name']!r} reads {reads!r}, expected {want_reads!r}"
            )
        if call.get("runs_program") is not runs:
            raise _fail(where, f"host call {call['name']!r}: runs_program must be {runs}")
    if not by_role["output"]:
        raise _fail(where, "the package has no output binding")


def _validate_program(package: Package, where: str) -> None:
    program = _require(package.manifest, "program", dict, where)
    steps = _require(program, "steps", list, f"{where}: program")
    transfers = package.table("transfers")
    destinations = package.table("destinations")
    pieces = package.table("pieces")
    covered = 0
    for index, step in enumerate(steps):
        kind = step.get("kind") if isinstance(step, dict) else None
        if kind == "compute":
            if not isinstance(step.get("calls"), list):
                raise _fail(where, f"step {index}: compute step without a call list")
        elif kind == "exchange":
            span, pspan = _range(step.get("transfers")), _range(step.get("pieces"))
            if span is None or span[0] != covered or span[1] < 1 or sum(span) > len(transfers):
                raise _fail(
                    where,
                    f"step {index}: transfer range {step.get('transfers')!r} is not a "
                    f"non-empty range starting at {covered} inside the table",
                )
            covered += span[1]
            if pspan is None or sum(pspan) > len(pieces):
                raise _fail(where, f"step {index}: piece range {step.get('pieces')!r} is bad")
            owners = pieces[pspan[0] : sum(pspan), 0]
            if ((owners < span[0]) | (owners >= sum(span))).any():
                raise _fail(where, f"step {index}: a piece names a transfer of another step")
            schedule = step.get("schedule")
            if not isinstance(schedule, dict) or not isinstance(schedule.get("horizon"), int):
                raise _fail(where, f"step {index}: exchange step without a schedule")
        elif kind == "repeat":
            count, length = step.get("count"), step.get("length")
            if (
                not isinstance(count, int)
                or count < 1
                or not isinstance(length, int)
                or not (1 <= length < len(steps) - index)
            ):
                raise _fail(
                    where,
                    f"step {index}: repeat count {count!r} or body length "
                    f"{length!r} is bad (steps after it: {len(steps) - index - 1})",
                )
            if not isinstance(step.get("iterated"), list):
                raise _fail(where, f"step {index}: repeat without an iterated list")
        else:
            raise _fail(where, f"step {index}: unknown step kind {kind!r}")
    if covered != len(transfers):
        raise _fail(where, f"steps cover {covered} of {len(transfers)} transfers")
    first = transfers[:, 4]
    ends = np.append(first[1:], len(destinations))
    if len(transfers) and (first[0] != 0 or (np.diff(first) < 1).any() or (ends - first < 1).any()):
        raise _fail(where, "transfer destination ranges are not consecutive and non-empty")


def _range(value: object) -> tuple[int, int] | None:
    """A ``[start, count]`` pair of non-negative ints, else None."""
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        return value[0], value[1]
    return None

"""The ``.ipuprof`` file: one versioned, compressed, digest-covered file, validated on load.

Layout (integers little-endian)::

    offset  size  field
    0       8     magic b"\\x89IPUPRF\\n"
    8       4     u32 format version (FORMAT_VERSION)
    12      4     u32 header size (64)
    16      8     u64 body size in bytes (compressed)
    24      8     u64 payload size in bytes (uncompressed)
    32      32    SHA-256 over bytes 0..32 and the body
    64      ...   body: zlib (level 6) of the payload

The payload is a canonical JSON header (sorted keys, no spaces), space-padded to 8 bytes,
then the tables of :data:`~ipu_stack.profile.model.TABLE_COLUMNS` as little-endian int64
arrays, each described in ``header["tables"]`` as ``{offset, rows}`` (offset from the start of
the table data, columns fixed by the format). The rest of the header is the profile's
``meta``: ``tiles`` (physical ids), ``clock_hz``, ``cycles``, ``steps`` (kind and label of
each package step), the name lists ``operations``, ``kernels``, ``bound_names`` and
``allocation_names``, and ``package`` (path, digest, compiler version). No wall-clock values:
the same package gives the same profile bytes.

:func:`load` checks, before anything uses the file: size, magic, version, digest, the
payload's size and JSON, the tables (inside the payload, right columns), and their contents:
ids within the tiles, executions and name lists, intervals with start <= end, each tile's
segments covering the run from 0 to ``cycles`` without gap or overlap, phase cycles summing to
``cycles``, allocations inside tile memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from ipu_stack.errors import ProfileError
from ipu_stack.profile.model import (
    INTERVAL_KINDS,
    KINDS,
    NAME_LISTS,
    REGIONS,
    TABLE_COLUMNS,
    Profile,
)
from ipu_stack.target import ipu21

MAGIC = b"\x89IPUPRF\n"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sIIQQ32s")
HEADER_SIZE = HEADER.size  # 64
#: The largest payload :func:`load` will inflate (a guard against decompression bombs).
MAX_PAYLOAD_BYTES = 1 << 32


def encode(profile: Profile) -> bytes:
    """The file's bytes for ``profile`` (deterministic)."""
    tables, blobs, offset = {}, [], 0
    for name in TABLE_COLUMNS:
        array = np.ascontiguousarray(profile.tables[name], dtype="<i8")
        tables[name] = {"offset": offset, "rows": int(array.shape[0])}
        blobs.append(array.tobytes())
        offset += array.nbytes
    header = {**profile.meta, "tables": tables}
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    raw = text.encode("ascii")
    raw += b" " * (-len(raw) % 8)
    payload = struct.pack("<Q", len(raw)) + raw + b"".join(blobs)
    body = zlib.compress(payload, 6)
    head = struct.pack("<8sIIQQ", MAGIC, FORMAT_VERSION, HEADER_SIZE, len(body), len(payload))
    digest = hashlib.sha256(head + body).digest()
    return head + digest + body


def save(profile: Profile, path: str | os.PathLike[str]) -> int:
    """Write ``profile`` to ``path`` atomically (temporary file + rename); returns its size."""
    data = encode(profile)
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise ProfileError(f"cannot write profile {str(path)!r}: {err.strerror}") from None
    return len(data)


def load(path: str | os.PathLike[str]) -> Profile:
    """Read and validate a profile file.

    Raises:
        ProfileError: missing, truncated, corrupt, another version, or inconsistent content;
            the message names the file and the problem.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ProfileError(f"profile {str(path)!r} not found") from None
    except OSError as err:
        raise ProfileError(f"cannot read profile {str(path)!r}: {err.strerror}") from None
    return decode(data, str(path))


def decode(data: bytes, where: str = "<bytes>") -> Profile:
    """Parse and validate the bytes of a profile file (see :func:`load`)."""
    what = f"profile {where!r}"
    if len(data) < HEADER_SIZE:
        raise ProfileError(f"{what} is truncated: {len(data)} bytes, the header needs 64")
    magic, version, header_size, body_size, payload_size, digest = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ProfileError(f"{what} is not an ipu-stack profile (bad magic {magic!r})")
    if version != FORMAT_VERSION:
        raise ProfileError(
            f"{what}: format version {version} is not supported (this ipu-stack reads "
            f"version {FORMAT_VERSION})"
        )
    if header_size != HEADER_SIZE:
        raise ProfileError(f"{what}: header size {header_size}, expected {HEADER_SIZE}")
    if len(data) != HEADER_SIZE + body_size:
        state = "truncated" if len(data) < HEADER_SIZE + body_size else "too long"
        raise ProfileError(
            f"{what} is {state}: the header announces {HEADER_SIZE + body_size} bytes, "
            f"the file has {len(data)}"
        )
    body = data[HEADER_SIZE:]
    if hashlib.sha256(data[:32] + body).digest() != digest:
        raise ProfileError(f"{what}: content digest mismatch: the file is corrupt")
    if payload_size > MAX_PAYLOAD_BYTES:
        raise ProfileError(f"{what}: payload of {payload_size} bytes is over the limit")
    try:
        payload = zlib.decompress(body)
    except zlib.error as err:
        raise ProfileError(f"{what}: cannot decompress the body ({err})") from None
    if len(payload) != payload_size:
        raise ProfileError(
            f"{what}: payload is {len(payload)} bytes, the header announces {payload_size}"
        )
    try:
        (text_size,) = struct.unpack_from("<Q", payload)
        header = json.loads(payload[8 : 8 + text_size].decode("ascii"))
        assert isinstance(header, dict)
    except (struct.error, UnicodeDecodeError, ValueError, AssertionError):
        raise ProfileError(f"{what}: the header JSON is malformed") from None
    base = 8 + text_size
    tables = {}
    specs = header.pop("tables", None)
    if not isinstance(specs, dict):
        raise ProfileError(f"{what}: the header has no table list")
    for name, columns in TABLE_COLUMNS.items():
        spec = specs.get(name)
        if not isinstance(spec, dict) or not {"offset", "rows"} <= set(spec):
            raise ProfileError(f"{what}: table {name!r} is missing from the header")
        start, rows = spec["offset"], spec["rows"]
        size = rows * len(columns) * 8 if isinstance(rows, int) else -1
        if not isinstance(start, int) or start < 0 or size < 0:
            raise ProfileError(f"{what}: table {name!r} has a bad offset or row count")
        if base + start + size > len(payload):
            raise ProfileError(f"{what}: table {name!r} runs past the end of the payload")
        array = np.frombuffer(payload, dtype="<i8", count=size // 8, offset=base + start)
        tables[name] = array.reshape(rows, len(columns)).astype(np.int64)
    profile = Profile(header, tables)
    validate(profile, what)
    return profile


def validate(profile: Profile, what: str = "profile") -> None:
    """Check a profile's contents (see :func:`load`).

    Raises:
        ProfileError: the first inconsistency found, naming the table and row.
    """
    meta = profile.meta
    for key in ("tiles", "clock_hz", "cycles", "steps", *NAME_LISTS):
        if key not in meta:
            raise ProfileError(f"{what}: the header has no {key!r}")
    tiles, cycles = len(meta["tiles"]), meta["cycles"]
    if not isinstance(cycles, int) or cycles < 0 or tiles == 0:
        raise ProfileError(f"{what}: bad cycles {cycles!r} or no tiles")
    t = profile.tables
    execs = len(t["executions"])
    names = {key: len(meta[key]) for key in NAME_LISTS}
    limits = {
        "executions": {"step": len(meta["steps"])},
        "segments": {
            "tile": tiles, "execution": execs, "kind": len(KINDS),
            "operation": names["operations"], "kernel": names["kernels"],
        },
        "phases": {"execution": execs, "bound_name": names["bound_names"]},
        "intervals": {"phase": len(t["phases"]), "tile": tiles, "kind": len(INTERVAL_KINDS)},
        "allocations": {
            "tile": tiles, "region": len(REGIONS), "name": names["allocation_names"],
        },
    }  # fmt: skip
    for table, columns in limits.items():
        for column, limit in columns.items():
            values = profile.column(table, column)
            bad = np.flatnonzero((values < 0) | (values >= limit))
            if bad.size:
                row = int(bad[0])
                raise ProfileError(
                    f"{what}: {table} row {row}: {column} {int(values[row])} is outside "
                    f"0..{limit - 1}"
                )
    for table in ("executions", "segments", "intervals"):
        start, end = profile.column(table, "start"), profile.column(table, "end")
        bad = np.flatnonzero((start < 0) | (end < start))
        if bad.size:
            row = int(bad[0])
            raise ProfileError(
                f"{what}: {table} row {row}: interval [{int(start[row])}, {int(end[row])}) "
                "is empty-reversed or negative"
            )
    _check_coverage(profile, what)
    low, high = profile.column("allocations", "address"), profile.column("allocations", "size")
    bad = np.flatnonzero(
        (low < ipu21.TILE_MEMORY_BASE) | (low + high > ipu21.TILE_MEMORY_END) | (high <= 0)
    )
    if bad.size:
        raise ProfileError(f"{what}: allocations row {int(bad[0])} lies outside tile memory")


def _check_coverage(profile: Profile, what: str) -> None:
    """Each tile's segments tile [0, cycles); phase cycles sum to the run's cycles."""
    seg = profile.tables["segments"]
    cycles = profile.cycles
    tile, start, end = seg[:, 0], seg[:, 2], seg[:, 3]
    order = np.lexsort((start, tile))
    tile, start, end = tile[order], start[order], end[order]
    first = np.ones(len(tile), dtype=bool)
    first[1:] = tile[1:] != tile[:-1]
    last = np.ones(len(tile), dtype=bool)
    last[:-1] = tile[1:] != tile[:-1]
    covered = np.unique(tile)
    if covered.size != profile.tile_count:
        missing = sorted(set(range(profile.tile_count)) - set(covered.tolist()))
        raise ProfileError(f"{what}: tile {missing[0]} has no segments")
    gaps = np.flatnonzero(~first[1:] & (start[1:] != end[:-1])) + 1
    if gaps.size:
        i = int(gaps[0])
        raise ProfileError(
            f"{what}: tile {int(tile[i])}: segments leave a gap or overlap at cycle "
            f"{int(end[i - 1])}..{int(start[i])}"
        )
    if (start[first] != 0).any() or (end[last] != cycles).any():
        raise ProfileError(f"{what}: some tile's segments do not run from 0 to {cycles}")
    total = int(profile.column("segments", "phase_cycles").sum())
    if total != cycles:
        raise ProfileError(f"{what}: phase cycles sum to {total}, the run took {cycles}")

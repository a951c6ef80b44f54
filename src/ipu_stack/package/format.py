"""The ``.ipuexe`` package: one file, schema-versioned, digest-covered, validated on load.

Layout (all integers little-endian)::

    offset  size  field
    0       8     magic b"\\x89IPUEXE\\n" (a high byte and a newline catch text-mode mangling)
    8       4     u32 schema version (SCHEMA_VERSION)
    12      4     u32 header size (64)
    16      8     u64 manifest size in bytes (a multiple of 8)
    24      8     u64 data size in bytes
    32      32    SHA-256 over bytes 0..32, the manifest and the data (everything but itself)
    64      ...   manifest: canonical JSON (sorted keys, no spaces, ASCII), space-padded to 8
    ...     ...   data: sections, each starting on an 8-byte boundary

The manifest holds the scalars, the tile program (calls as compact JSON lists with absolute
addresses), the bindings, host calls, kernels and the build report; every large table is a
*section* of the data, described in ``manifest["sections"]`` as ``{offset, size, dtype,
shape}`` (a little-endian int64 array) or ``{offset, size}`` (raw bytes). Tables:

``segments``     [S, 5] physical tile, address, size, flags (READ 1, WRITE 2, EXEC 4), data
                 offset: each tile's loadable memory map, non-overlapping. Data segments (the
                 union of its allocations, READ|WRITE) are zero-filled at load (offset -1);
                 image segments (code and rows READ|EXEC, operand tables READ) have their
                 bytes in ``images`` at the offset (``package/tile_images.py``).
``allocations``  [A, 5] physical tile, address, size, first step, end step: every named buffer
                 and the steps it is live in (names in ``manifest["allocation_names"]``).
``slices``       [N, 10] physical tile, address, row stride, row0, row1, col0, col1, transposed,
                 data offset (-1: none), data size: where each part of a binding lives. Rows
                 and columns are of the binding's flat-row view [N, C]; storage rows are value
                 rows (value columns when transposed) ``row stride`` bytes apart.
``transfers``    [T, 5] source tile, source address, words, paired64, first destination.
``destinations`` [D, 3] tile, address, scheduled first arrival (-1: not recorded).
``pieces``       [P, 4] transfer, send cycle, offset (words), words: the exchange schedules.
``rows``         [R, 5] physical tile, step, loop iteration, address, words: each exchange row.
``weights``      raw bytes: the weight slices' data, identical blocks stored once.
``images``       raw bytes: the image segments' data (identical segments stored once).
``kernel_objects`` raw bytes: kernel objects when an SDK compiled them (``manifest["tile_code"]``).

Determinism: the file is a function of the graph, the parameters and the config only. The
embedded report leaves out wall-clock values (phase ``elapsed_ms``, ``seconds``) and the
kernel cache's state (hit or miss, cache paths); the printed trace still has them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.errors import PackageError
from ipu_stack.gc_pause import collector_paused
from ipu_stack.target import ipu21

MAGIC = b"\x89IPUEXE\n"
SCHEMA_VERSION = 2  # 2: tile images (code, rows, operand tables) in segments with data
HEADER = struct.Struct("<8sIIQQ32s")
HEADER_SIZE = HEADER.size  # 64
TARGET = "ipu21"
TILE_MEMORY_BASE = ipu21.TILE_MEMORY_BASE
TILE_MEMORY_SIZE = ipu21.TILE_MEMORY_END - ipu21.TILE_MEMORY_BASE
SEGMENT_READ, SEGMENT_WRITE, SEGMENT_EXEC = 1, 2, 4
ROLES = ("input", "weight", "output")
HOST_CALLS = ("initialize", "run")

#: Columns of each table section, in order (their names are the format's documentation).
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "segments": ("tile", "address", "size", "flags", "data_offset"),
    "allocations": ("tile", "address", "size", "live_first", "live_end"),
    "slices": (
        "tile", "address", "row_stride", "row0", "row1", "col0", "col1", "transposed",
        "data_offset", "data_size",
    ),
    "transfers": ("source_tile", "source_address", "words", "paired64", "first_destination"),
    "destinations": ("tile", "address", "first_arrival"),
    "pieces": ("transfer", "send_cycle", "offset_words", "words"),
    "rows": ("tile", "step", "iteration", "address", "words"),
}  # fmt: skip


def element_bytes(dtype: str) -> int:
    """Bytes per element of a binding dtype (``f16`` or ``f32``)."""
    return ipu21.precision(dtype).element_bytes


def flat_rows(shape: Iterable[int]) -> tuple[int, int]:
    """The flat-row view ``[N, C]`` of a shape (``C`` the last axis)."""
    dims = [int(d) for d in shape]
    return (math.prod(dims[:-1]) if len(dims) > 1 else 1, dims[-1])


# one encoder for every call (what ``json.dumps`` with these options builds each time);
# the values are trees (no reference cycles), so the cycle check is left out
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False,
    check_circular=False,
)  # fmt: skip


def canonical_json(value: Any) -> bytes:
    """The one byte form of a JSON value: sorted keys, no whitespace, ASCII only."""
    return _CANONICAL.encode(value).encode("ascii")


@dataclass(frozen=True, slots=True)
class Package:
    """A loaded or freshly assembled ``.ipuexe``: the manifest and the data sections.

    Build one with :func:`ipu_stack.package.assemble.assemble_package`; read one with
    :meth:`load`, which validates it before returning.
    """

    manifest: dict[str, Any]
    data: bytes

    # -- sections -------------------------------------------------------------------------------
    def table(self, name: str) -> np.ndarray:
        """A table section as a read-only ``int64`` array of shape ``[rows, columns]``."""
        entry = self.manifest["sections"][name]
        rows, columns = entry["shape"]
        array = np.frombuffer(self.data, dtype="<i8", count=rows * columns, offset=entry["offset"])
        return array.reshape(rows, columns)

    def blob(self, name: str) -> memoryview:
        """A raw-bytes section."""
        entry = self.manifest["sections"][name]
        return memoryview(self.data)[entry["offset"] : entry["offset"] + entry["size"]]

    # -- convenience ----------------------------------------------------------------------------
    @property
    def tiles(self) -> list[int]:
        """Physical tile ids, in the program's logical tile order."""
        return list(self.manifest["tiles"])

    def bindings(self, role: str | None = None) -> list[dict[str, Any]]:
        """Binding records (``name, role, dtype, shape, slices: [start, count]``)."""
        return [b for b in self.manifest["bindings"] if role is None or b["role"] == role]

    def binding_slices(self, binding: Mapping[str, Any]) -> np.ndarray:
        start, count = binding["slices"]
        return self.table("slices")[start : start + count]

    # -- bytes ----------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The file's bytes (header, manifest, data), digest included."""
        return b"".join(self._sealed())

    def _sealed(self) -> list[bytes]:
        """The file's parts in order: header head, digest, manifest, data."""
        manifest = canonical_json(self.manifest)
        manifest += b" " * (-len(manifest) % 8)
        return _seal_parts(SCHEMA_VERSION, manifest, self.data)

    @property
    def digest(self) -> str:
        """Hex SHA-256 content digest, as stored in the header."""
        return self.to_bytes()[32:64].hex()

    def save(self, path: str | os.PathLike[str]) -> int:
        """Write the package atomically (a temporary file, then ``os.replace``).

        Returns:
            The file size in bytes.

        Raises:
            PackageError: the file could not be written (nothing is left at ``path``).
        """
        return self.write(path)[0]

    def write(self, path: str | os.PathLike[str]) -> tuple[int, str]:
        """:meth:`save`, also returning the digest written (without sealing the package
        again, as :attr:`digest` would)."""
        from ipu_stack.outputs import OutputError, atomic_write

        try:
            with collector_paused():
                parts = self._sealed()
            # written part by part: the data area (most of a large model's file) is not
            # copied into one more buffer of the file's size
            return atomic_write(path, parts), parts[1].hex()
        except OutputError as err:
            raise PackageError(str(err)) from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Package:
        """Read and validate a package file.

        Raises:
            PackageError: unreadable, truncated, corrupt (digest), another schema version, or
                inconsistent; the message names the file and what is wrong where.
        """
        try:
            blob = Path(path).read_bytes()
        except OSError as err:
            raise PackageError(f"cannot read package {path}: {err.strerror or err}") from None
        return cls.from_bytes(blob, str(path))

    @classmethod
    def from_bytes(cls, blob: bytes, where: str = "<bytes>") -> Package:
        """Parse and validate a package's bytes (see :meth:`load`)."""
        if len(blob) < HEADER_SIZE:
            raise PackageError(
                f"{where}: truncated: {len(blob)} bytes, shorter than the {HEADER_SIZE}-byte header"
            )
        magic, version, header_size, manifest_size, data_size, digest = HEADER.unpack_from(blob)
        if magic != MAGIC:
            raise PackageError(f"{where}: not an .ipuexe package (bad magic {magic!r})")
        if version != SCHEMA_VERSION:
            raise PackageError(
                f"{where}: schema version {version} is not supported (this reader reads "
                f"version {SCHEMA_VERSION}); recompile the model"
            )
        if header_size != HEADER_SIZE:
            raise PackageError(f"{where}: header size {header_size}, expected {HEADER_SIZE}")
        expected = HEADER_SIZE + manifest_size + data_size
        if len(blob) < expected:
            raise PackageError(
                f"{where}: truncated: the header announces {expected} bytes, the file has "
                f"{len(blob)}"
            )
        if len(blob) > expected:
            raise PackageError(
                f"{where}: {len(blob) - expected} trailing bytes after the announced {expected}"
            )
        actual = _digest(blob[:32], blob[HEADER_SIZE:])
        if actual != digest:
            raise PackageError(
                f"{where}: content digest mismatch (stored {digest.hex()[:16]}..., computed "
                f"{actual.hex()[:16]}...): the file is corrupt"
            )
        try:
            manifest = json.loads(blob[HEADER_SIZE : HEADER_SIZE + manifest_size])
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise PackageError(f"{where}: manifest is not valid JSON: {err}") from None
        if not isinstance(manifest, dict):
            raise PackageError(f"{where}: manifest is not a JSON object")
        from ipu_stack.package.validate import validate

        package = cls(manifest, bytes(blob[HEADER_SIZE + manifest_size :]))
        validate(package, where)
        return package


def _digest(header_head: bytes, body: bytes) -> bytes:
    h = hashlib.sha256()
    h.update(header_head)
    h.update(body)
    return h.digest()


def _seal(version: int, manifest: bytes, data: bytes) -> bytes:
    return b"".join(_seal_parts(version, manifest, data))


def _seal_parts(version: int, manifest: bytes, data: bytes) -> list[bytes]:
    head = HEADER.pack(MAGIC, version, HEADER_SIZE, len(manifest), len(data), b"\0" * 32)[:32]
    h = hashlib.sha256(head)
    h.update(manifest)
    h.update(data)  # hashed in place
    return [head, h.digest(), manifest, data]


def reseal(blob: bytes, version: int | None = None) -> bytes:
    """Recompute a file's digest (optionally stating another schema version).

    For tests and tools that edit a package on purpose; a reader still validates everything.
    """
    _, old_version, _, manifest_size, _, _ = HEADER.unpack_from(blob)
    body = blob[HEADER_SIZE:]
    return _seal(
        old_version if version is None else version, body[:manifest_size], body[manifest_size:]
    )


class SectionWriter:
    """Appends 8-byte-aligned sections to a data area; identical blobs are stored once."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._blobs: dict[tuple[str, bytes], int] = {}
        self.sections: dict[str, dict[str, Any]] = {}

    def _append(self, data: bytes) -> int:
        offset = self._size
        self._parts.append(data)
        pad = -len(data) % 8
        if pad:
            self._parts.append(b"\0" * pad)
        self._size += len(data) + pad
        return offset

    def table(self, name: str, rows: Iterable[Iterable[int]] | np.ndarray) -> None:
        columns = len(TABLE_COLUMNS[name])
        array = np.asarray(rows if isinstance(rows, np.ndarray) else list(rows), dtype="<i8")
        array = array.reshape(-1, columns)
        offset = self._append(array.tobytes())
        self.sections[name] = {
            "offset": offset,
            "size": array.nbytes,
            "dtype": "<i8",
            "shape": [int(array.shape[0]), columns],
            "columns": list(TABLE_COLUMNS[name]),
        }

    def begin_blob(self, name: str) -> None:
        self.sections[name] = {"offset": self._size, "size": 0}

    def blob_part(self, name: str, data: bytes) -> int:
        """Append ``data`` to blob section ``name`` (the last begun); returns its offset in it."""
        entry = self.sections[name]
        if (name, data) in self._blobs:
            return self._blobs[(name, data)]
        offset = self._append(data) - entry["offset"]
        entry["size"] = self._size - entry["offset"]
        self._blobs[(name, data)] = offset
        return offset

    def data(self) -> bytes:
        return b"".join(self._parts)

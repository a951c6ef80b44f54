"""Content-addressed kernel cache: one directory per SHA-256 key, published atomically.

Layout: ``<root>/<key>/`` holds ``kernel.S`` (the preprocessed source), ``kernel.expanded.S``
(after our macro expansion), ``kernel.o`` and ``kernel.gp`` when assembled, and
``kernel.json`` (our metadata: name, target, flags, symbols, key components, tool identity,
file sizes and digests, timings). ``<root>/.locks/<key>.lock`` serialises builders of one key.

Root: ``$IPU_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/ipu-stack/kernels``, else
``~/.cache/ipu-stack/kernels``.

Key: SHA-256 over named components in order (each: name, NUL, 8-byte little-endian length,
bytes). Unlike the reference (reference-system §1.10), the components include every file the
template includes, so an edited header is never served stale.

Safety: an entry is built in a temporary directory under the root and published with
``os.replace``, under the per-entry lock; a failed build leaves nothing. A hit requires
``kernel.json`` to parse, name this key and format, and list files whose sizes and SHA-256
digests all match (plus a Colossus ELF header for ``kernel.o``); anything else is a corrupt
or partial entry, which is removed and rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipu_stack.target.ipu21 import ELF_MACHINE_COLOSSUS

CACHE_FORMAT = "ipu-stack-kernel-cache-v1"
METADATA = "kernel.json"

LOGGER = logging.getLogger("ipu_stack.kernels.cache")


def cache_root(environ: dict[str, str] | None = None) -> Path:
    """The cache directory from the environment (see module docstring)."""
    env = os.environ if environ is None else environ
    if env.get("IPU_KERNEL_CACHE"):
        return Path(env["IPU_KERNEL_CACHE"])
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "ipu-stack" / "kernels"
    return Path.home() / ".cache" / "ipu-stack" / "kernels"


@dataclass(frozen=True, slots=True)
class KeyComponent:
    name: str
    value: bytes

    def describe(self) -> dict[str, object]:
        text = self.value.decode("utf-8", "replace")
        short = len(self.value) <= 120 and text.isprintable()
        return {
            "name": self.name,
            "bytes": len(self.value),
            "sha256": hashlib.sha256(self.value).hexdigest(),
            **({"value": text} if short else {}),
        }


def cache_key(components: Sequence[KeyComponent]) -> str:
    """SHA-256 over the named components, in order; each is logged at DEBUG."""
    digest = hashlib.sha256()
    for c in components:
        name = c.name.encode()
        digest.update(name + b"\0" + struct.pack("<Q", len(c.value)) + c.value)
        LOGGER.debug(
            "kernel cache key component name=%s bytes=%d sha256=%s",
            c.name,
            len(c.value),
            hashlib.sha256(c.value).hexdigest()[:16],
        )
    return digest.hexdigest()


def is_colossus_elf(path: Path) -> bool:
    """Little-endian ELF32 with machine 0xF8 (facts §19.1)."""
    try:
        with path.open("rb") as f:
            head = f.read(20)
    except OSError:
        return False
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[4] != 1 or head[5] != 1:
        return False
    return struct.unpack_from("<H", head, 18)[0] == ELF_MACHINE_COLOSSUS


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class CacheEntry:
    key: str
    path: Path
    metadata: dict[str, Any]

    @property
    def metadata_path(self) -> Path:
        return self.path / METADATA

    def file(self, name: str) -> Path | None:
        return self.path / name if name in self.metadata.get("files", {}) else None


class KernelCache:
    """The kernel cache at ``root`` (default: :func:`cache_root`)."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else cache_root()

    def entry_path(self, key: str) -> Path:
        return self.root / key

    def lookup(self, key: str) -> CacheEntry | None:
        """The valid entry for ``key``, or None (missing, partial or corrupt)."""
        path = self.entry_path(key)
        try:
            meta = json.loads((path / METADATA).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or meta.get("format") != CACHE_FORMAT:
            return None
        if meta.get("key") != key or not isinstance(meta.get("files"), dict):
            return None
        for name, info in meta["files"].items():
            file = path / name
            try:
                if file.stat().st_size != info["bytes"] or _sha256(file) != info["sha256"]:
                    return None
            except (OSError, KeyError, TypeError):
                return None
        if "kernel.o" in meta["files"] and not is_colossus_elf(path / "kernel.o"):
            return None
        return CacheEntry(key, path, meta)

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Exclusive per-entry lock (``flock`` on ``.locks/<key>.lock``)."""
        locks = self.root / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        with (locks / f"{key}.lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def get_or_create(
        self, key: str, build: Callable[[Path], dict[str, Any]]
    ) -> tuple[CacheEntry, bool]:
        """The entry for ``key`` and whether it was a hit; builds it on a miss.

        ``build(tmpdir)`` writes the entry's files into ``tmpdir`` and returns metadata; the
        cache adds ``format``, ``key`` and each file's size and digest, writes ``kernel.json``
        and publishes the directory. If ``build`` raises, nothing is published.
        """
        entry = self.lookup(key)
        if entry is not None:
            return entry, True
        from ipu_stack.kernels.source_check import ensure_cache_dir

        ensure_cache_dir(self.root)
        with self.lock(key):
            entry = self.lookup(key)  # another process may have built it meanwhile
            if entry is not None:
                return entry, True
            final = self.entry_path(key)
            if final.exists() or final.is_symlink():
                LOGGER.info("kernel cache entry is corrupt or partial; rebuilding key=%s", key)
                _remove(final)
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=self.root))
            try:
                meta = dict(build(tmp))
                files = {
                    p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
                    for p in sorted(tmp.iterdir())
                    if p.is_file() and p.name != METADATA
                }
                meta.update(format=CACHE_FORMAT, key=key, files=files)
                (tmp / METADATA).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
                os.replace(tmp, final)
            except BaseException:
                _remove(tmp)
                raise
        entry = self.lookup(key)
        if entry is None:
            raise OSError(f"kernel cache entry {final} failed validation right after creation")
        return entry, False


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def tree_digest(root: Path | str) -> str:
    """SHA-256 of a source tree: for each file in sorted relative-path order, the path, NUL,
    its bytes, NUL (``kernel-build-id``; reference-system §1.2)."""
    base = Path(root)
    if not base.is_dir():
        raise NotADirectoryError(f"{root} is not a directory")
    digest = hashlib.sha256()
    files = sorted(p for p in base.rglob("*") if p.is_file())
    for path in sorted(files, key=lambda p: p.relative_to(base).as_posix()):
        digest.update(path.relative_to(base).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()

"""Checks of what the kernel tools read and write: sources are text, the cache is a directory.

A kernel source given on the command line must be a readable UTF-8 text file without NUL
bytes (an object file, an image or a truncated binary is named as such, exit status 2, not a
preprocessor crash). The kernel cache root (``$IPU_KERNEL_CACHE``, ...) must be a directory
that can be created and written; a file or an unwritable directory is named with the
variable that chose it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ipu_stack.errors import GraphError


def check_kernel_source(path: str | os.PathLike[str]) -> Path:
    """The source as a Path, after checking it is a readable text file.

    Raises:
        GraphError: missing, a directory, unreadable, or binary (NUL bytes, not UTF-8).
    """
    source = Path(path)
    if not source.exists():
        raise GraphError(f"kernel source {source} not found (expected an assembly template .S)")
    if not source.is_file():
        raise GraphError(f"kernel source {source} is not a file")
    try:
        data = source.read_bytes()
    except OSError as err:
        raise GraphError(f"cannot read kernel source {source}: {err.strerror or err}") from None
    nul = data.find(b"\0")
    if nul >= 0:
        raise GraphError(f"kernel source {source} is binary (a NUL byte at offset {nul})")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise GraphError(
            f"kernel source {source} is not UTF-8 text (byte {data[err.start]:#04x} at offset "
            f"{err.start})"
        ) from None
    return source


def ensure_cache_dir(root: Path) -> None:
    """Create the cache root if needed; reject a file or an unwritable directory.

    Raises:
        GraphError: naming the root and the environment variable that chose it.
    """
    origin = "IPU_KERNEL_CACHE" if os.environ.get("IPU_KERNEL_CACHE") else "the cache root"
    if root.exists() and not root.is_dir():
        raise GraphError(f"kernel cache {root} ({origin}) is not a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise GraphError(
            f"kernel cache {root} ({origin}) cannot be created: {err.strerror or err}"
        ) from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise GraphError(f"kernel cache {root} ({origin}) is not writable")

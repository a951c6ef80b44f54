"""Output files: checked before any work starts, written whole or not at all.

Every file ipu-stack writes goes through :func:`atomic_write`: the bytes go to a temporary
name in the target's own directory (``.NAME.PID.RANDOM.tmp``), are flushed and synced, and
the file is renamed onto the target; on any failure (full disk, permissions, an interrupt)
the temporary file is removed, so the target is either the old file or the complete new one.

:func:`check_output_file` and :func:`check_output_dir` say up front whether a path can be
written (the CLI's ``output_file``/``output_dir`` argument types call them at parse time), so
a bad path fails in milliseconds instead of after a long build.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from ipu_stack.errors import GraphError


class OutputError(GraphError):
    """An output path cannot be written (exit status 2)."""


def _writable_dir(directory: Path, what: str) -> None:
    if not directory.exists():
        raise OutputError(f"{what}: directory {str(directory)!r} does not exist")
    if not directory.is_dir():
        raise OutputError(f"{what}: {str(directory)!r} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise OutputError(f"{what}: directory {str(directory)!r} is not writable")


def check_output_file(path: str | os.PathLike[str]) -> Path:
    """Check that ``path`` can be written as a file (directory exists and is writable).

    Raises:
        OutputError: naming the path and what is wrong.
    """
    target = Path(path)
    if not str(path):
        raise OutputError("output path is empty")
    if target.is_dir():
        raise OutputError(f"output {str(path)!r} is a directory, expected a file name")
    if target.exists() and not target.is_file():
        # a device or FIFO: the rename that makes writes atomic would replace it
        raise OutputError(f"output {str(path)!r} is not a regular file")
    if target.exists() and not os.access(target, os.W_OK):
        # a rename would still replace it, but the user marked it read-only: respect that
        raise OutputError(f"output {str(path)!r} exists and is read-only")
    _writable_dir(target.parent, f"output {str(path)!r}")
    return target


def check_output_dir(path: str | os.PathLike[str]) -> Path:
    """Check that ``path`` is a writable directory, or can be created as one.

    Raises:
        OutputError: naming the path and what is wrong.
    """
    directory = Path(path)
    if not str(path):
        raise OutputError("output directory is empty")
    if directory.exists():
        _writable_dir(directory, "output directory")
        return directory
    parent = directory.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(
            f"output directory {str(path)!r} cannot be created: {str(parent)!r} is a file"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(
            f"output directory {str(path)!r} cannot be created: {str(parent)!r} is not writable"
        )
    return directory


def make_output_dir(path: str | os.PathLike[str]) -> Path:
    """Create (if needed) and return a checked output directory.

    Raises:
        OutputError: it cannot be created or written.
    """
    directory = check_output_dir(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot create output directory {str(path)!r}: {err.strerror}") from None
    return directory


#: a file's bytes: one buffer, or a list of buffers written one after another (not joined)
Content = bytes | list[bytes]


def _size(data: Content) -> int:
    return sum(len(part) for part in data) if isinstance(data, list) else len(data)


def _stage(target: Path, data: Content) -> Path:
    """Write ``data`` to a new temporary file beside ``target``; returns its path."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        # os.open with 0o666 keeps the user's umask (mkstemp would make the file 0600).
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as err:
        raise OutputError(f"cannot write {target}: {err.strerror or err}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            for part in data if isinstance(data, list) else [data]:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise OutputError(f"cannot write {target}: {err.strerror or err}") from None
        raise
    return tmp


def atomic_write_many(files: Sequence[tuple[str | os.PathLike[str], Content]]) -> list[int]:
    """Write several files whole or not at all: every one is staged before any is renamed.

    Returns:
        The bytes written per file.

    Raises:
        OutputError: a file could not be written; no target was touched and no temporary
            file is left (a failing rename, after every file was staged, leaves the earlier
            targets complete and the rest untouched).
    """
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in files:
            target = Path(path)
            staged.append((_stage(target, data), target))
        while staged:
            tmp, target = staged[0]
            try:
                os.replace(tmp, target)
            except OSError as err:
                raise OutputError(f"cannot write {target}: {err.strerror or err}") from None
            staged.pop(0)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
    return [_size(data) for _, data in files]


def atomic_write(path: str | os.PathLike[str], data: Content) -> int:
    """Write ``data`` (bytes, or a list of buffers written in turn) to ``path`` whole or not
    at all (temporary name, fsync, rename).

    Returns:
        The number of bytes written.

    Raises:
        OutputError: the file could not be written; nothing is left behind.
    """
    return atomic_write_many([(path, data)])[0]

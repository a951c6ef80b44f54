"""Allocation of the simulated tile memories, and of the simulator's temporaries.

NumPy asks the kernel for transparent huge pages on large arrays (``madvise``). On a host
whose THP ``defrag`` setting compacts memory on fault, the first touch of each tile's memory
then stalls for milliseconds (measured: 4.4 s to touch one byte of each of 1,024 tile
memories, 0.016 s without huge pages). Tile memories are sparse (a few KiB of code and the
live buffers of each 640 KiB tile), so ordinary 4 KiB pages are the right granularity.

The same holds for the simulator's large temporaries (the exchange matcher's per-overlap
arrays and block copies, the GEMM semantics' panels), allocated and freed many times per
run: the runs execute under :func:`small_pages` (measured on the batch-4 SigLIP MLP's first
exchange phase, 0.76 M block copies: 2.18 s with the hint, 0.43 s without).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

_core = getattr(np, "_core", None) or np.core  # NumPy 2 / 1


@contextmanager
def small_pages() -> Iterator[None]:
    """NumPy allocations inside the block (or the decorated function) without the huge-page
    hint; the previous setting is restored after it."""
    previous = _core.multiarray._set_madvise_hugepage(False)
    try:
        yield
    finally:
        _core.multiarray._set_madvise_hugepage(previous)


def tile_memories(tiles: int, size: int) -> np.ndarray:
    """Zeroed ``(tiles, size)`` bytes, allocated without the huge-page hint."""
    with small_pages():
        return np.zeros((tiles, size), dtype=np.uint8)


# glibc's mallopt parameters (malloc.h) and their documented initial values
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_GLIBC_INITIAL = 128 * 1024
#: during a run, blocks below this come from the heap (the tile memories, larger, do not) ...
HEAP_BELOW = 256 << 20
#: ... and up to this much freed heap is kept for the next temporaries
KEEP_FREE = 2 << 30
_kept = [0]  # nesting depth of heap_kept


def _glibc() -> tuple[Callable[[int, int], int], Callable[[int], int]] | None:
    """glibc's ``mallopt`` and ``malloc_trim``, where the process runs on glibc."""
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return None
        libc = ctypes.CDLL(None)
        return libc.mallopt, libc.malloc_trim
    except (AttributeError, OSError, ValueError):
        return None


@contextmanager
def heap_kept() -> Iterator[None]:
    """Temporaries of the block reuse freed heap memory instead of fresh pages (glibc).

    glibc serves large blocks with their own ``mmap`` and returns freed heap above 2x the
    largest freed block to the system, so each of a run's multi-MiB NumPy temporaries (the
    exchange matcher's arrays over a million row words, the GEMM scratch) came back as fresh
    pages, a page fault and a zeroed page each: the batch-4 SigLIP MLP's image run took 470 K
    page faults, 330 K with the heap kept (the rest: the tile memories' first touch). After
    the block the thresholds are glibc's initial ones and the kept memory goes back to the
    system (``malloc_trim``); elsewhere, and with another C library, this does nothing.
    """
    functions = _glibc() if _kept[0] == 0 else None
    _kept[0] += 1
    try:
        if functions is not None:
            mallopt, _ = functions
            mallopt(_M_MMAP_THRESHOLD, HEAP_BELOW)
            mallopt(_M_TRIM_THRESHOLD, KEEP_FREE)
        yield
    finally:
        _kept[0] -= 1
        if functions is not None:
            mallopt, trim = functions
            mallopt(_M_TRIM_THRESHOLD, _GLIBC_INITIAL)
            mallopt(_M_MMAP_THRESHOLD, _GLIBC_INITIAL)
            trim(0)

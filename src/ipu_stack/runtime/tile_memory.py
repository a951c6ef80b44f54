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

from collections.abc import Iterator
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

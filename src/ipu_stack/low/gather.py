"""Assemble tile-local copies of value regions from the tiles that hold them.

A :class:`GatherRequest` asks for value rows ``rows`` x columns ``cols`` (flat-row view) to be
placed on ``tile`` at ``ref``, one storage row every ``stride`` bytes. The request is cut
against the value's shards; pieces on the same tile become local copies, the others logical
transfers (identical source runs wanted by several tiles become one multicast). Parameters are
never gathered: the host writes them wherever they are wanted (see :func:`host_fill`).

The cut is interval arithmetic on NumPy arrays (:mod:`ipu_stack.low.gather_arrays`): every
(request, shard) overlap at once, expanded into row runs, grouped by source run for the
multicasts; only the resulting calls and transfers are Python objects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ipu_stack.low.program import KernelCall, LogicalTransfer, Ref, Shard
from ipu_stack.target.ipu21 import WORD_BYTES


@dataclass(frozen=True, slots=True)
class GatherRequest:
    tile: int
    ref: Ref
    stride: int
    rows: tuple[int, int]
    cols: tuple[int, int]


def _word_up(nbytes: int) -> int:
    return -(-nbytes // WORD_BYTES) * WORD_BYTES


class ShardIndex:
    """The shards of one value as arrays, for vectorised intersection.

    ``box`` holds (row start, row end, column start, column end) per shard; ``fields`` holds
    (tile, byte offset, row stride, transposed), ``buffers`` the buffer names and
    ``buffer_ids`` a number per distinct name.
    """

    def __init__(self, shards: list[Shard]) -> None:
        self.shards = shards
        rows = [(*sh.rows, *sh.cols, sh.tile, sh.ref.offset, sh.row_stride, sh.transposed)
                for sh in shards]  # fmt: skip
        table = np.array(rows, dtype=np.int64).reshape(-1, 8)
        self.box = table[:, :4]
        self.fields = table[:, 4:]
        names = [sh.ref.buffer for sh in shards]
        self.buffers = np.array(names, dtype=object)
        ids: dict[str, int] = {}
        self.buffer_ids = np.array([ids.setdefault(n, len(ids)) for n in names], dtype=np.int64)

    def hits(self, rows: tuple[int, int], cols: tuple[int, int]) -> np.ndarray:
        b = self.box
        return np.flatnonzero(
            (b[:, 0] < rows[1]) & (rows[0] < b[:, 1]) & (b[:, 2] < cols[1]) & (cols[0] < b[:, 3])
        )


def gather(
    requests: list[GatherRequest], index: ShardIndex, eb: int, what: str
) -> tuple[list[KernelCall], list[LogicalTransfer]]:
    """Local copies and transfers that satisfy ``requests`` from the shards in ``index``.

    Copies come in request order (then shard order, then row order); transfers are grouped by
    source run in order of first use, a destination tile at most once per multicast (repeated
    wants of one source go in later sends).

    Raises:
        GraphError: if a piece would start inside a 32-bit word (e.g. an F16 slice at an odd
            column), which the word-wide exchange cannot express; if a shard is stored
            transposed; if a request is not covered by the shards.
    """
    from ipu_stack.low.gather_arrays import RequestArrays, gather_arrays

    return gather_arrays(RequestArrays.of(requests), index, eb, what)


def host_fill(req: GatherRequest) -> Shard:
    """The host-written shard that satisfies a request for a parameter (free replication)."""
    return Shard(req.tile, req.ref, req.rows, req.cols, req.stride)


def row_runs(src_rows: np.ndarray) -> list[tuple[int, int, int]]:
    """Cut a vector of source rows into runs (first source row, length, first position)."""
    if src_rows.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(src_rows) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [src_rows.size]])
    return [(int(src_rows[s]), int(e - s), int(s)) for s, e in zip(starts, ends, strict=True)]

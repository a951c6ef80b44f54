"""Assemble tile-local copies of value regions from the tiles that hold them.

A :class:`GatherRequest` asks for value rows ``rows`` x columns ``cols`` (flat-row view) to be
placed on ``tile`` at ``ref``, one storage row every ``stride`` bytes. The request is cut
against the value's shards; pieces on the same tile become local copies, the others logical
transfers (identical source runs wanted by several tiles become one multicast). Parameters are
never gathered: the host writes them wherever they are wanted (see :func:`host_fill`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.low.program import CopyCall, KernelCall, LogicalTransfer, Ref, Shard
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
    """The shards of one value as arrays, for vectorised intersection."""

    def __init__(self, shards: list[Shard]) -> None:
        self.shards = shards
        self.box = np.array([(*sh.rows, *sh.cols) for sh in shards], dtype=np.int64).reshape(-1, 4)

    def hits(self, rows: tuple[int, int], cols: tuple[int, int]) -> np.ndarray:
        b = self.box
        return np.flatnonzero(
            (b[:, 0] < rows[1]) & (rows[0] < b[:, 1]) & (b[:, 2] < cols[1]) & (cols[0] < b[:, 3])
        )


def gather(
    requests: list[GatherRequest], index: ShardIndex, eb: int, what: str
) -> tuple[list[KernelCall], list[LogicalTransfer]]:
    """Local copies and transfers that satisfy ``requests`` from the shards in ``index``.

    Raises:
        GraphError: if a piece would start inside a 32-bit word (e.g. an F16 slice at an odd
            column), which the word-wide exchange cannot express.
    """
    copies: list[KernelCall] = []
    by_source: dict[tuple[int, str, int, int], list[tuple[int, Ref]]] = defaultdict(list)
    for req in requests:
        covered = 0
        for i in index.hits(req.rows, req.cols):
            sh = index.shards[int(i)]
            if sh.transposed:
                raise GraphError(
                    f"{what}: a value stored transposed cannot be gathered on chip yet"
                )
            rlo, rhi = max(sh.rows[0], req.rows[0]), min(sh.rows[1], req.rows[1])
            clo, chi = max(sh.cols[0], req.cols[0]), min(sh.cols[1], req.cols[1])
            covered += (rhi - rlo) * (chi - clo)
            src_off = (clo - sh.cols[0]) * eb
            dst_off = (clo - req.cols[0]) * eb
            if src_off % WORD_BYTES or dst_off % WORD_BYTES:
                raise GraphError(
                    f"{what}: columns {clo}..{chi} start inside a 32-bit word "
                    "(odd F16 column offset), which exchange cannot move"
                )
            row_bytes = (chi - clo) * eb
            src_buffer, dst_buffer = sh.ref.buffer, req.ref.buffer
            src_base = sh.ref.offset + src_off - sh.rows[0] * sh.row_stride
            dst_base = req.ref.offset + dst_off - req.rows[0] * req.stride
            if row_bytes == sh.row_stride == req.stride:  # one contiguous run
                nbytes = _word_up((rhi - rlo) * row_bytes)
                rows = range(rlo, rlo + 1)
            else:  # one run per row
                nbytes = _word_up(row_bytes)
                rows = range(rlo, rhi)
            src_stride, dst_stride = sh.row_stride, req.stride
            if sh.tile == req.tile:
                copies.extend(
                    CopyCall(
                        req.tile,
                        Ref(dst_buffer, dst_base + r * dst_stride),
                        Ref(src_buffer, src_base + r * src_stride),
                        nbytes,
                    )
                    for r in rows
                )
            else:
                source = sh.tile
                for r in rows:
                    by_source[(source, src_buffer, src_base + r * src_stride, nbytes)].append(
                        (req.tile, Ref(dst_buffer, dst_base + r * dst_stride))
                    )
        need = (req.rows[1] - req.rows[0]) * (req.cols[1] - req.cols[0])
        if covered != need:
            raise GraphError(f"{what}: rows {req.rows} cols {req.cols} are not all produced")
    transfers = []
    for (tile, buf, off, nbytes), dests in by_source.items():
        # A tile appears once per multicast; repeated wants of one source go in later sends.
        while dests:
            seen: set[int] = set()
            now: list[tuple[int, Ref]] = []
            later: list[tuple[int, Ref]] = []
            for d in dests:
                (later if d[0] in seen else now).append(d)
                seen.add(d[0])
            transfers.append(LogicalTransfer(tile, Ref(buf, off), tuple(now), nbytes // 4))
            dests = later
    return copies, transfers


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

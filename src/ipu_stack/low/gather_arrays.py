"""The gather of :mod:`ipu_stack.low.gather` as interval arithmetic on NumPy arrays.

Requests and shards are rows of integer arrays. All (request, shard) overlaps are found at
once (blocked broadcasting), clipped, checked, and expanded into *pieces*: one contiguous run
when the request, the shard and the piece all have the same row length in bytes, else one
run per row. Pieces on the requesting tile become :class:`CopyCall`; the others are grouped by
source run (tile, buffer, offset, bytes) into multicasts, each destination tile at most once
per multicast. Only the final calls and transfers are built as Python objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.low.makers import make_copy, make_transfer
from ipu_stack.low.program import KernelCall, LogicalTransfer, Ref
from ipu_stack.target.ipu21 import WORD_BYTES

if TYPE_CHECKING:
    from ipu_stack.low.gather import GatherRequest, ShardIndex

_PAIR_BLOCK = 1 << 21  # request x shard comparisons per broadcast block


@dataclass(slots=True)
class RequestArrays:
    """Gather requests as arrays: destination tile, buffer name, byte offset, row stride,
    value rows [r0, r1) and columns [c0, c1) (flat-row view)."""

    tile: np.ndarray
    buffer: np.ndarray  # object array of buffer names
    offset: np.ndarray
    stride: np.ndarray
    r0: np.ndarray
    r1: np.ndarray
    c0: np.ndarray
    c1: np.ndarray

    @classmethod
    def of(cls, requests: Sequence[GatherRequest]) -> RequestArrays:
        """The arrays of a list of :class:`~ipu_stack.low.gather.GatherRequest`."""
        table = np.array(
            [(r.tile, r.ref.offset, r.stride, *r.rows, *r.cols) for r in requests],
            dtype=np.int64,
        ).reshape(-1, 7)
        names = np.array([r.ref.buffer for r in requests], dtype=object)
        t = table.T
        return cls(t[0], names, t[1], t[2], t[3], t[4], t[5], t[6])

    @classmethod
    def row_runs(
        cls,
        tiles: np.ndarray,
        buffer: str,
        offsets: np.ndarray,
        stride: int,
        src_rows: np.ndarray,
        cols: tuple[int, int],
        chunks: np.ndarray,
    ) -> RequestArrays:
        """One request per run of destination rows whose source rows advance by one.

        Destination row ``p`` (of ``tiles[p]``, stored at byte ``offsets[p]`` of ``buffer``)
        takes source row ``src_rows[p]``; a run ends where the source row jumps or the
        destination chunk ``chunks[p]`` changes (the requests of
        :func:`~ipu_stack.low.gather.row_runs`, chunk by chunk in order).
        """
        n = src_rows.size
        brk = np.ones(n, dtype=bool)
        brk[1:] = (np.diff(src_rows) != 1) | (chunks[1:] != chunks[:-1])
        starts = np.flatnonzero(brk)
        lengths = np.diff(np.append(starts, n))
        r0 = src_rows[starts].astype(np.int64)
        k = starts.size
        return cls(
            tiles[starts].astype(np.int64),
            np.full(k, buffer, dtype=object),
            offsets[starts].astype(np.int64),
            np.full(k, stride, dtype=np.int64),
            r0,
            r0 + lengths,
            np.full(k, cols[0], dtype=np.int64),
            np.full(k, cols[1], dtype=np.int64),
        )

    def requests(self) -> list[GatherRequest]:
        """The same requests as :class:`~ipu_stack.low.gather.GatherRequest` objects."""
        from ipu_stack.low.gather import GatherRequest

        return [
            GatherRequest(t, Ref(b, o), s, (r0, r1), (c0, c1))
            for t, b, o, s, r0, r1, c0, c1 in zip(
                self.tile.tolist(), self.buffer.tolist(), self.offset.tolist(),
                self.stride.tolist(), self.r0.tolist(), self.r1.tolist(), self.c0.tolist(),
                self.c1.tolist(), strict=True,
            )
        ]  # fmt: skip

    def __len__(self) -> int:
        return int(self.tile.size)


def _word_up(nbytes: np.ndarray) -> np.ndarray:
    return -(-nbytes // WORD_BYTES) * WORD_BYTES


def _refs(buffers: list[str], offsets: list[int]) -> list[Ref]:
    """``Ref(buffer, offset)`` for each pair (tuples made in C, no Python call per item)."""
    return list(map(tuple.__new__, repeat(Ref), zip(buffers, offsets, strict=True)))


def overlaps(req: RequestArrays, box: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All (request j, shard i) pairs whose row and column ranges overlap, ordered by j then i.

    Shards sorted by first row: those starting before a request's end row are a prefix, and
    those before the first position where the running maximum of end rows passes the
    request's first row cannot overlap it; only the window between is compared.
    """
    n, s = len(req), box.shape[0]
    if n == 0 or s == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(box[:, 0], kind="stable")
    starts = box[order, 0]
    reach = np.maximum.accumulate(box[order, 1])
    lo = np.searchsorted(reach, req.r0, side="right")
    hi = np.searchsorted(starts, req.r1, side="left")
    width = np.maximum(hi - lo, 0)
    ends = np.cumsum(width)
    js, is_ = [], []
    first = 0
    while first < n:  # blocks of requests with at most _PAIR_BLOCK candidates
        base = int(ends[first - 1]) if first else 0
        last = max(first + 1, int(np.searchsorted(ends, base + _PAIR_BLOCK, side="right")))
        last = min(last, n)
        cnt = width[first:last]
        j = np.repeat(np.arange(first, last), cnt)
        k = np.arange(j.size) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        i = order[lo[j] + k]
        keep = (
            (box[i, 0] < req.r1[j])
            & (req.r0[j] < box[i, 1])
            & (box[i, 2] < req.c1[j])
            & (req.c0[j] < box[i, 3])
        )
        js.append(j[keep])
        is_.append(i[keep])
        first = last
    j, i = np.concatenate(js), np.concatenate(is_)
    o = np.lexsort((i, j))
    return j[o].astype(np.int64), i[o].astype(np.int64)


def _check(
    req: RequestArrays,
    j: np.ndarray,
    transposed: np.ndarray,
    misaligned: np.ndarray,
    covered: np.ndarray,
    what: str,
    clo: np.ndarray,
    chi: np.ndarray,
) -> None:
    """Raise the first error in request order (a bad piece before its request's coverage)."""
    bad_piece = transposed | misaligned
    short = covered != (req.r1 - req.r0) * (req.c1 - req.c0)
    first_piece = int(np.argmax(bad_piece)) if bad_piece.any() else -1
    first_short = int(np.argmax(short)) if short.any() else -1
    if first_piece >= 0 and (first_short < 0 or int(j[first_piece]) <= first_short):
        p = first_piece
        if transposed[p]:
            raise GraphError(f"{what}: a value stored transposed cannot be gathered on chip yet")
        raise GraphError(
            f"{what}: columns {int(clo[p])}..{int(chi[p])} start inside a 32-bit word "
            "(odd F16 column offset), which exchange cannot move"
        )
    if first_short >= 0:
        q = first_short
        rows = (int(req.r0[q]), int(req.r1[q]))
        cols = (int(req.c0[q]), int(req.c1[q]))
        raise GraphError(f"{what}: rows {rows} cols {cols} are not all produced")


def gather_arrays(
    req: RequestArrays, index: ShardIndex, eb: int, what: str
) -> tuple[list[KernelCall], list[LogicalTransfer]]:
    """:func:`ipu_stack.low.gather.gather` on request arrays (``index`` a ``ShardIndex``)."""
    box: np.ndarray = index.box
    fields: np.ndarray = index.fields
    j, i = overlaps(req, box)
    rlo = np.maximum(box[i, 0], req.r0[j])
    rhi = np.minimum(box[i, 1], req.r1[j])
    clo = np.maximum(box[i, 2], req.c0[j])
    chi = np.minimum(box[i, 3], req.c1[j])
    src_off = (clo - box[i, 2]) * eb
    dst_off = (clo - req.c0[j]) * eb
    covered = np.bincount(j, weights=(rhi - rlo) * (chi - clo), minlength=len(req))
    misaligned = ((src_off % WORD_BYTES) != 0) | ((dst_off % WORD_BYTES) != 0)
    _check(req, j, fields[i, 3] != 0, misaligned, covered.astype(np.int64), what, clo, chi)
    if j.size == 0:
        return [], []
    sh_stride, dst_stride = fields[i, 2], req.stride[j]
    src_base = fields[i, 1] + src_off - box[i, 0] * sh_stride
    dst_base = req.offset[j] + dst_off - req.r0[j] * dst_stride
    row_bytes = (chi - clo) * eb
    whole = (row_bytes == sh_stride) & (sh_stride == dst_stride)  # one contiguous run
    count = np.where(whole, 1, rhi - rlo)
    nbytes = _word_up(np.where(whole, (rhi - rlo) * row_bytes, row_bytes))
    # expand pairs into pieces (one per row unless contiguous)
    pair = np.repeat(np.arange(j.size), count)
    first = np.cumsum(count) - count
    row = rlo[pair] + (np.arange(pair.size) - first[pair])
    src = src_base[pair] + row * sh_stride[pair]
    dst = dst_base[pair] + row * dst_stride[pair]
    pj, pi = j[pair], i[pair]
    size = nbytes[pair]
    src_tile, dst_tile = fields[pi, 0], req.tile[pj]
    local = src_tile == dst_tile
    copies = _copies(req, index, pj[local], pi[local], dst[local], src[local], size[local])
    remote = ~local
    transfers = _multicasts(
        req, index, pj[remote], pi[remote], src_tile[remote], src[remote], size[remote],
        dst_tile[remote], dst[remote],
    )  # fmt: skip
    return copies, transfers


def _copies(
    req: RequestArrays,
    index: ShardIndex,
    pj: np.ndarray,
    pi: np.ndarray,
    dst: np.ndarray,
    src: np.ndarray,
    size: np.ndarray,
) -> list[KernelCall]:
    """The local pieces as copy calls, in piece order."""
    if pj.size == 0:
        return []
    buffers: np.ndarray = index.buffers
    dst_refs = _refs(req.buffer[pj].tolist(), dst.tolist())
    src_refs = _refs(buffers[pi].tolist(), src.tolist())
    tiles = req.tile[pj].tolist()  # one run each: rows 1, strides 0 (make_copy takes every field)
    return list(map(make_copy, tiles, dst_refs, src_refs, size.tolist(), repeat(1), repeat(0),
                    repeat(0)))  # fmt: skip


def _multicasts(
    req: RequestArrays,
    index: ShardIndex,
    pj: np.ndarray,
    pi: np.ndarray,
    src_tile: np.ndarray,
    src: np.ndarray,
    size: np.ndarray,
    dst_tile: np.ndarray,
    dst: np.ndarray,
) -> list[LogicalTransfer]:
    """Remote pieces grouped by source run (in order of first use) into multicasts."""
    n = pj.size
    if n == 0:
        return []
    buffers: np.ndarray = index.buffers
    src_names = buffers[pi]
    sid = index.buffer_ids[pi]
    pos = np.arange(n)
    order = np.lexsort((pos, size, src, sid, src_tile))
    key = np.stack([src_tile, sid, src, size])[:, order]
    new = np.ones(n, dtype=bool)
    new[1:] = (key[:, 1:] != key[:, :-1]).any(axis=0)
    group_sorted = np.cumsum(new) - 1
    group = np.empty(n, dtype=np.int64)
    group[order] = group_sorted
    first_pos = order[new]  # stable sort: the first piece of each group in piece order
    rank = np.empty(first_pos.size, dtype=np.int64)
    rank[np.argsort(first_pos, kind="stable")] = np.arange(first_pos.size)
    grank = rank[group]
    # round: how many earlier pieces of the same group go to the same tile
    o2 = np.lexsort((pos, dst_tile, grank))
    k2 = np.stack([grank[o2], dst_tile[o2]])
    seg = np.ones(n, dtype=bool)
    seg[1:] = (k2[:, 1:] != k2[:, :-1]).any(axis=0)
    seg_start = np.maximum.accumulate(np.where(seg, np.arange(n), 0))
    rnd = np.empty(n, dtype=np.int64)
    rnd[o2] = np.arange(n) - seg_start
    final = np.lexsort((pos, rnd, grank))
    fg, fr = grank[final], rnd[final]
    cut = np.ones(n, dtype=bool)
    cut[1:] = (fg[1:] != fg[:-1]) | (fr[1:] != fr[:-1])
    starts = np.flatnonzero(cut)
    ends = np.append(starts[1:], n)
    dests = tuple(
        zip(
            dst_tile[final].tolist(),
            _refs(req.buffer[pj[final]].tolist(), dst[final].tolist()),
            strict=True,
        )
    )
    heads = final[starts]
    srcs = _refs(src_names[heads].tolist(), src[heads].tolist())
    words = (size[heads] // 4).tolist()
    return list(
        map(
            make_transfer,
            src_tile[heads].tolist(),
            srcs,
            map(dests.__getitem__, map(slice, starts.tolist(), ends.tolist())),
            words,
        )
    )

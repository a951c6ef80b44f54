"""The vectorised gather against a plain per-row reference on random shardings."""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipu_stack.errors import GraphError
from ipu_stack.low.gather import GatherRequest, ShardIndex, gather, row_runs
from ipu_stack.low.gather_arrays import RequestArrays, overlaps
from ipu_stack.low.program import CopyCall, LogicalTransfer, Ref, Shard


def reference_gather(requests, shards, eb, what):
    """Request by request, shard by shard, row by row (the pre-vectorised algorithm)."""
    copies, by_source = [], defaultdict(list)
    for req in requests:
        covered = 0
        for sh in shards:
            if not (
                sh.rows[0] < req.rows[1]
                and req.rows[0] < sh.rows[1]
                and sh.cols[0] < req.cols[1]
                and req.cols[0] < sh.cols[1]
            ):
                continue
            if sh.transposed:
                raise GraphError(
                    f"{what}: a value stored transposed cannot be gathered on chip yet"
                )
            rlo, rhi = max(sh.rows[0], req.rows[0]), min(sh.rows[1], req.rows[1])
            clo, chi = max(sh.cols[0], req.cols[0]), min(sh.cols[1], req.cols[1])
            covered += (rhi - rlo) * (chi - clo)
            src_off, dst_off = (clo - sh.cols[0]) * eb, (clo - req.cols[0]) * eb
            if src_off % 4 or dst_off % 4:
                raise GraphError(
                    f"{what}: columns {clo}..{chi} start inside a 32-bit word "
                    "(odd F16 column offset), which exchange cannot move"
                )
            row_bytes = (chi - clo) * eb
            src_base = sh.ref.offset + src_off - sh.rows[0] * sh.row_stride
            dst_base = req.ref.offset + dst_off - req.rows[0] * req.stride
            if row_bytes == sh.row_stride == req.stride:
                nbytes, rows = -(-(rhi - rlo) * row_bytes // 4) * 4, range(rlo, rlo + 1)
            else:
                nbytes, rows = -(-row_bytes // 4) * 4, range(rlo, rhi)
            for r in rows:
                src = Ref(sh.ref.buffer, src_base + r * sh.row_stride)
                dst = Ref(req.ref.buffer, dst_base + r * req.stride)
                if sh.tile == req.tile:
                    copies.append(CopyCall(req.tile, dst, src, nbytes))
                else:
                    by_source[(sh.tile, src, nbytes)].append((req.tile, dst))
        if covered != (req.rows[1] - req.rows[0]) * (req.cols[1] - req.cols[0]):
            raise GraphError(f"{what}: rows {req.rows} cols {req.cols} are not all produced")
    transfers = []
    for (tile, src, nbytes), dests in by_source.items():
        while dests:
            seen, now, later = set(), [], []
            for d in dests:
                (later if d[0] in seen else now).append(d)
                seen.add(d[0])
            transfers.append(LogicalTransfer(tile, src, tuple(now), nbytes // 4))
            dests = later
    return copies, transfers


def _cuts(draw, total, pieces, even):
    inner = draw(st.lists(st.integers(1, total - 1), max_size=pieces - 1)) if total > 1 else []
    cuts = sorted({c - (c % 2 if even else 0) for c in inner} - {0})
    return [0, *cuts, total]


@st.composite
def _case(draw):
    eb = draw(st.sampled_from([2, 4]))
    n, c = draw(st.integers(1, 12)), draw(st.integers(1, 12)) * 2
    even = draw(st.booleans()) or eb == 4
    row_cuts, col_cuts = _cuts(draw, n, 4, False), _cuts(draw, c, 3, even)
    tiles = draw(st.integers(1, 4))
    shards = []
    for a, b in pairwise(row_cuts):
        for p, q in pairwise(col_cuts):
            width = (q - p) * eb
            stride = width + draw(st.sampled_from([0, 0, 4, 8]))
            buf = draw(st.sampled_from(["x", "y"]))
            offset = draw(st.integers(0, 8)) * 8
            shards.append(
                Shard(draw(st.integers(0, tiles - 1)), Ref(buf, offset), (a, b), (p, q), stride)
            )
    if draw(st.integers(0, 20)) == 0 and shards:  # rarely: a transposed shard
        sh = shards[0]
        shards[0] = Shard(sh.tile, sh.ref, sh.rows, sh.cols, sh.row_stride, True)
    if draw(st.integers(0, 20)) == 0 and len(shards) > 1:  # rarely: a hole
        shards.pop(draw(st.integers(0, len(shards) - 1)))
    requests = []
    for _ in range(draw(st.integers(0, 6))):
        r0 = draw(st.integers(0, n - 1))
        r1 = draw(st.integers(r0 + 1, n))
        c0 = draw(st.integers(0, c - 1))
        c0 -= c0 % 2 if even else 0
        c1 = draw(st.integers(c0 + 1, c))
        width = (c1 - c0) * eb
        stride = -(-width // 8) * 8 + draw(st.sampled_from([0, 8]))
        ref = Ref(draw(st.sampled_from(["a", "b"])), draw(st.integers(0, 4)) * 8)
        requests.append(
            GatherRequest(draw(st.integers(0, tiles - 1)), ref, stride, (r0, r1), (c0, c1))
        )
    return requests, shards, eb


def _per_row(copies):
    """Copies of several runs as one plain copy per run, in order."""
    return [
        CopyCall(c.tile, Ref(c.dst.buffer, c.dst.offset + r * c.dst_stride),
                 Ref(c.src.buffer, c.src.offset + r * c.src_stride), c.size)
        for c in copies
        for r in range(c.rows)
    ]  # fmt: skip


def test_local_rows_of_another_width_are_one_copy_of_runs():
    # tile 0 holds rows of 4 f32 (stride 16); it wants columns 0..2 of rows 0..3 at stride 8
    shards = [Shard(0, Ref("v"), (0, 4), (0, 4), 16)]
    copies, transfers = gather([GatherRequest(0, Ref("a"), 8, (0, 3), (0, 2))],
                               ShardIndex(shards), 4, "op")  # fmt: skip
    assert transfers == []
    assert copies == [CopyCall(0, Ref("a"), Ref("v"), 8, 3, 8, 16)]


def _outcome(fn):
    try:
        return fn()
    except GraphError as e:
        return str(e)


@settings(max_examples=150, deadline=None)
@given(_case())
def test_vectorised_gather_matches_reference(case):
    requests, shards, eb = case
    got = _outcome(lambda: gather(requests, ShardIndex(shards), eb, "op"))
    want = _outcome(lambda: reference_gather(requests, shards, eb, "op"))
    if isinstance(got, tuple):  # a copy of several runs stands for the reference's row copies
        for c in got[0]:
            assert c.rows == 1 or (c.dst_stride >= c.size and c.dst_stride % 4 == 0), c
        assert len(got[0]) <= len(want[0])
        got = (_per_row(got[0]), got[1])
    assert got == want
    if isinstance(got, tuple):  # offsets are Python ints, as the package encoder expects
        assert all(type(c.dst.offset) is int and type(c.size) is int for c in got[0])
        assert all(type(t.words) is int and type(t.source.offset) is int for t in got[1])


def test_multicast_and_repeated_destination():
    shards = [Shard(0, Ref("v"), (0, 2), (0, 4), 16)]
    requests = [
        GatherRequest(1, Ref("a"), 16, (0, 2), (0, 4)),
        GatherRequest(2, Ref("a"), 16, (0, 2), (0, 4)),
        GatherRequest(1, Ref("b"), 16, (0, 2), (0, 4)),  # tile 1 again: a second send
        GatherRequest(0, Ref("c"), 8, (1, 2), (2, 4)),  # local: one copy
    ]
    copies, transfers = gather(requests, ShardIndex(shards), 4, "op")
    assert copies == [CopyCall(0, Ref("c"), Ref("v", 24), 8)]
    assert transfers == [
        LogicalTransfer(0, Ref("v"), ((1, Ref("a")), (2, Ref("a"))), 8),
        LogicalTransfer(0, Ref("v"), ((1, Ref("b")),), 8),
    ]


def test_uncovered_request_names_rows_and_cols():
    shards = [Shard(0, Ref("v"), (0, 2), (0, 4), 16)]
    with pytest.raises(GraphError, match=r"rows \(0, 3\) cols \(0, 4\) are not all produced"):
        gather([GatherRequest(1, Ref("a"), 16, (0, 3), (0, 4))], ShardIndex(shards), 4, "op")


_box = st.tuples(st.integers(0, 20), st.integers(1, 8), st.integers(0, 20), st.integers(1, 8))


@settings(max_examples=100, deadline=None)
@given(st.lists(_box, max_size=12), st.lists(_box, max_size=12))
def test_overlaps_match_all_pairs(shard_boxes, request_boxes):
    box = np.array([(r, r + h, c, c + w) for r, h, c, w in shard_boxes], np.int64).reshape(-1, 4)
    reqs = [GatherRequest(0, Ref("a"), 8, (r, r + h), (c, c + w)) for r, h, c, w in request_boxes]
    want = [
        (j, i)
        for j, q in enumerate(reqs)
        for i, b in enumerate(box.tolist())
        if b[0] < q.rows[1] and q.rows[0] < b[1] and b[2] < q.cols[1] and q.cols[0] < b[3]
    ]
    j, i = overlaps(RequestArrays.of(reqs), box)
    assert list(zip(j.tolist(), i.tolist(), strict=True)) == want


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.lists(st.integers(0, 6), min_size=1, max_size=6)),
        max_size=5,
    )
)
def test_request_row_runs_match_per_chunk_runs(chunks):
    """Per chunk (tile, source rows), the arrays hold the requests of gather.row_runs."""
    stride, base, want = 16, 64, []
    for k, (tile, rows) in enumerate(chunks):
        at = base + 1000 * k
        want += [
            GatherRequest(tile, Ref("o", at + pos * stride), stride, (s, s + cnt), (0, 4))
            for s, cnt, pos in row_runs(np.array(rows, dtype=np.int64))
        ]
    sizes = [len(rows) for _, rows in chunks]
    which = np.repeat(np.arange(len(chunks)), sizes).astype(np.int64)
    tiles = np.array([t for t, _ in chunks], dtype=np.int64)[which]
    start = np.cumsum([0, *sizes])[:-1]
    offsets = (
        base + 1000 * which + (np.arange(which.size) - np.asarray(start, np.int64)[which]) * stride
    )
    src = np.array([r for _, rows in chunks for r in rows], dtype=np.int64)
    got = RequestArrays.row_runs(tiles, "o", offsets, stride, src, (0, 4), which).requests()
    assert got == want

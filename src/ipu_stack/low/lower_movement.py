"""Lower any transpose of any value: exchange-based re-tiling plus a local transpose kernel.

A permutation that keeps the last axis is a *row move*: every output row is one source row,
so whole-row runs are gathered into a row layout (local copies and exchange; parameters are
written by the host). A permutation that moves the last axis is cut into three steps
(:func:`~ipu_stack.mid.candidates.indexing.transpose_steps`):

1. a row move to ``[*lead, X, Y]`` (skipped when it is the identity), ``Y`` the source's last
   axis and ``X`` the axis that becomes last;
2. a batched swap ``[B, X, Y] -> [B, Y, X]``: output rows are cut into strips of ``s``
   columns of ``Y`` (word-aligned, about one strip per tile, at most
   ``TRANSPOSE_MAX_PIECES`` pieces in the phase); the tile of strip ``(b, y0)`` receives the
   ``[X, s]`` block ``T1[b, :, y0:y0+s]`` (one piece per source row) and the ``transpose``
   kernel writes its ``s`` output rows of ``X``;
3. a row move to the requested order (skipped when it is the identity).

Each step is costed in the planner (``mid/candidates/indexing.py``), placed and simulated like
every other step.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.graph.compute_graph import Operation, Value
from ipu_stack.low.gather import GatherRequest, ShardIndex, gather, row_runs
from ipu_stack.low.lower_ops import OpLowering, _stride, flat_shape, row_partition
from ipu_stack.low.program import KernelCall, LogicalTransfer, MapCall, Shard, View
from ipu_stack.mid.candidates.indexing import transpose_steps, transpose_strip
from ipu_stack.target.ipu21 import precision as lookup_precision

Source = Value | list[Shard]
#: a tile's staging for a swap may not exceed this many bytes (data region headroom)
MAX_STAGING_BYTES = 256 * 1024


class _Moves:
    """Calls and transfers of one transpose, phase by phase (for the estimate)."""

    def __init__(self) -> None:
        self.calls: list[KernelCall] = []
        self.transfers: list[LogicalTransfer] = []


def _fetch(
    ctx: OpLowering, src: Source, dtype: str, reqs: list[GatherRequest], what: str
) -> tuple[list[KernelCall], list[LogicalTransfer]]:
    if isinstance(src, Value):
        return ctx.fetch(src, reqs, what)
    return gather(reqs, ShardIndex(src), lookup_precision(dtype).element_bytes, what)


def _row_move(
    ctx: OpLowering,
    op: Operation,
    src: Source,
    shape: tuple[int, ...],
    perm: tuple[int, ...],
    dtype: str,
    label: str,
    moves: _Moves,
) -> list[Shard]:
    """``transpose(src, perm)`` for a ``perm`` that keeps the last axis, in a row layout."""
    rank = len(shape)
    out_shape = tuple(shape[p] for p in perm)
    n, c = flat_shape(out_shape)
    eb = lookup_precision(dtype).element_bytes
    stride = _stride(c, eb)
    reqs: list[GatherRequest] = []
    shards = []
    for tile, r0, r1 in row_partition(n, ctx.row_tiles.get(op.name, ctx.tiles)):
        ref = ctx.carve(tile, f"{op.name}.{label}", (r1 - r0) * stride)
        shards.append(Shard(tile, ref, (r0, r1), (0, c), stride))
        if rank == 1:
            reqs.append(GatherRequest(tile, ref, stride, (0, 1), (0, c)))
            continue
        idx = np.unravel_index(np.arange(r0, r1), out_shape[:-1])
        src_idx: list[np.ndarray] = [np.zeros(0, np.int64)] * (rank - 1)
        for i, p in enumerate(perm[:-1]):
            src_idx[p] = np.asarray(idx[i])
        rows = np.ravel_multi_index(tuple(src_idx), shape[:-1]).astype(np.int64).reshape(-1)
        reqs += [
            GatherRequest(tile, ref.at(pos * stride), stride, (s, s + cnt), (0, c))
            for s, cnt, pos in row_runs(rows)
        ]
    ctx.close_buffers()
    copies, transfers = _fetch(ctx, src, dtype, reqs, op.name)
    ctx.builder.compute(copies)
    ctx.builder.exchange(f"{op.name} {label}", transfers)
    moves.calls += copies
    moves.transfers += transfers
    return shards


def _swap_last_two(
    ctx: OpLowering,
    op: Operation,
    src: Source,
    batch: int,
    x: int,
    y: int,
    dtype: str,
    moves: _Moves,
) -> list[Shard]:
    """``[B, X, Y] -> [B, Y, X]`` (flat rows ``B*X`` of ``Y`` -> ``B*Y`` of ``X``)."""
    eb = lookup_precision(dtype).element_bytes
    strip = transpose_strip(batch, x, y, eb, ctx.tiles)
    items = [(b, y0) for b in range(batch) for y0 in range(0, y, strip)]
    per_tile = -(-len(items) // ctx.tiles)
    out_stride = _stride(x, eb)
    staging = per_tile * x * _stride(strip, eb) + per_tile * strip * out_stride
    if staging > MAX_STAGING_BYTES:
        raise GraphError(
            f"{op.name}: swapping axes of [{batch}, {x}, {y}] needs {staging} staging bytes "
            f"per tile on {ctx.tiles} tiles (limit {MAX_STAGING_BYTES})"
        )
    reqs: list[GatherRequest] = []
    calls: list[KernelCall] = []
    shards = []
    for i, (b, y0) in enumerate(items):
        tile = i // per_tile
        y1 = min(y, y0 + strip)
        st = _stride(y1 - y0, eb)
        sref = ctx.carve(tile, f"{op.name}.strip", x * st)
        reqs.append(GatherRequest(tile, sref, st, (b * x, (b + 1) * x), (y0, y1)))
        oref = ctx.carve(tile, f"{op.name}.swapped", (y1 - y0) * out_stride)
        calls.append(
            MapCall(
                tile,
                "transpose",
                View(oref, y1 - y0, x, out_stride, dtype),
                (View(sref, x, y1 - y0, st, dtype),),
                (("col_offset", 0),),
            )
        )
        shards.append(Shard(tile, oref, (b * y + y0, b * y + y1), (0, x), out_stride))
    ctx.close_buffers()
    copies, transfers = _fetch(ctx, src, dtype, reqs, op.name)
    ctx.builder.compute(copies)
    ctx.builder.exchange(f"{op.name} strips", transfers)
    ctx.builder.compute(calls)
    moves.calls += copies + calls
    moves.transfers += transfers
    return shards


def lower_transpose_any(ctx: OpLowering, op: Operation) -> list[Shard]:
    """Any permutation of any value (host input, parameter or produced on chip)."""
    g = ctx.graph
    src, out = g.value(op.inputs[0]), g.value(op.output)
    perm = tuple(op.attr("perm"))
    rank = len(perm)
    moves = _Moves()
    if perm[-1] == rank - 1:
        shards = _row_move(ctx, op, src, src.shape, perm, out.dtype, "out", moves)
        ctx.costs[op.name] = (moves.calls, moves.transfers, [])
        return shards
    first, second = transpose_steps(perm)
    a = perm[-1]
    lead = [p for p in perm if p not in (a, rank - 1)]
    t1_shape = (*(src.shape[p] for p in lead), src.shape[a], src.shape[-1])
    current: Source = src
    if first is not None:
        current = _row_move(ctx, op, src, src.shape, first, out.dtype, "regroup", moves)
    x, y = src.shape[a], src.shape[-1]
    batch = src.size // (x * y)
    current = _swap_last_two(ctx, op, current, batch, x, y, out.dtype, moves)
    if second != tuple(range(rank)):
        t2_shape = (*t1_shape[:-2], y, x)
        current = _row_move(ctx, op, current, t2_shape, second, out.dtype, "out", moves)
    ctx.costs[op.name] = (moves.calls, moves.transfers, [])
    assert isinstance(current, list)
    return current

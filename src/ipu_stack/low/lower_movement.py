"""Lower any transpose of any value: exchange-based re-tiling plus a local transpose kernel.

A permutation that keeps the last axis is a *row move*: every output row is one source row,
so whole-row runs are gathered into a row layout (local copies and exchange; parameters are
written by the host). A permutation that moves the last axis is cut into three steps
(:func:`~ipu_stack.mid.candidates.indexing.transpose_steps`), ``Y`` the source's last axis
and ``X`` the axis that becomes last:

1. *re-tile* into ``T1 = [*lead, X, Y]`` (flat rows ``B*X`` of ``Y``), cut into chunks of
   rows that stay inside one ``[X, Y]`` matrix and start on 32-bit words of the output
   (:func:`batch_aligned_partition`): one exchange of whole-row runs (host writes for a
   parameter). Skipped when the value's own shards already have that property.
2. *local transpose*: every tile transposes its chunk ``T1[b, x0:x1, c0:c1]`` in place of
   the producer (``transpose`` kernel, no exchange) into the output block rows
   ``b*Y + c0 .. b*Y + c1``, columns ``x0 .. x1``: the swapped value is held as 2-D blocks.
3. a row move to the requested order when the leading axes also move (skipped otherwise).

A host input that a GEMM already holds transposed is written again by the host into the
re-tiled chunks (exchange cannot gather transposed shards). Each step is costed in the planner
(``mid/candidates/indexing.py``), placed and simulated like every other step.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.graph.compute_graph import Operation, Value
from ipu_stack.low.alias_views import MAX_ALIAS_SPREAD, alias_shards, renamed_again
from ipu_stack.low.gather import ShardIndex, host_fill
from ipu_stack.low.gather_arrays import RequestArrays, gather_arrays
from ipu_stack.low.lower_ops import OpLowering, _stride, flat_shape, row_partition
from ipu_stack.low.program import KernelCall, LogicalTransfer, MapCall, Shard, View
from ipu_stack.mid.candidates.indexing import transpose_steps
from ipu_stack.target.ipu21 import precision as lookup_precision

Source = Value | list[Shard]


class _Moves:
    """Calls and transfers of one transpose, phase by phase (for the estimate)."""

    def __init__(self) -> None:
        self.calls: list[KernelCall] = []
        self.transfers: list[LogicalTransfer] = []


def _stored_transposed(ctx: OpLowering, src: Source) -> bool:
    """A host input a GEMM already holds transposed (exchange cannot gather those shards)."""
    if not isinstance(src, Value) or src.kind != "host_input":
        return False
    return any(sh.transposed for sh in ctx.value_shards.get(src.id, ()))


def _fetch(
    ctx: OpLowering, src: Source, dtype: str, reqs: RequestArrays, what: str
) -> tuple[list[KernelCall], list[LogicalTransfer]]:
    if isinstance(src, Value) and _stored_transposed(ctx, src):
        # the host writes it again
        ctx.host_shards[src.id].extend(host_fill(r) for r in reqs.requests())
        return [], []
    if isinstance(src, Value):
        return ctx.fetch(src, reqs, what)
    return gather_arrays(reqs, ShardIndex(src), lookup_precision(dtype).element_bytes, what)


def _row_move(
    ctx: OpLowering,
    op: Operation,
    src: Source,
    shape: tuple[int, ...],
    perm: tuple[int, ...],
    dtype: str,
    label: str,
    moves: _Moves,
    partition: list[tuple[int, int, int]] | None = None,
) -> list[Shard]:
    """``transpose(src, perm)`` for a ``perm`` that keeps the last axis, in a row layout
    (``partition``: (tile, first row, end row) chunks; default: rows spread evenly)."""
    rank = len(shape)
    out_shape = tuple(shape[p] for p in perm)
    n, c = flat_shape(out_shape)
    eb = lookup_precision(dtype).element_bytes
    stride = _stride(c, eb)
    shards = []
    if partition is None:
        partition = row_partition(n, ctx.row_tiles.get(op.name, ctx.tiles))
    name = f"{op.name}.{label}"
    for tile, r0, r1 in partition:
        ref = ctx.carve(tile, name, (r1 - r0) * stride)
        shards.append(Shard(tile, ref, (r0, r1), (0, c), stride))
    part = np.array([(t, r0, r1) for t, r0, r1 in partition], dtype=np.int64).reshape(-1, 3)
    base = np.array([sh.ref.offset for sh in shards], dtype=np.int64)
    if rank == 1:
        one = np.zeros(len(shards), dtype=np.int64)  # every chunk takes the whole vector
        chunks = np.arange(len(shards))
        reqs = RequestArrays.row_runs(part[:, 0], name, base, stride, one, (0, c), chunks)
    else:
        # every output row of every tile at once: the source row it reads, its tile, its byte
        counts = part[:, 2] - part[:, 1]
        which = np.repeat(np.arange(len(shards)), counts)
        out_rows = np.concatenate([np.arange(r0, r1) for _, r0, r1 in partition]).astype(np.int64)
        idx = np.unravel_index(out_rows, out_shape[:-1])
        src_idx: list[np.ndarray] = [np.zeros(0, np.int64)] * (rank - 1)
        for i, p in enumerate(perm[:-1]):
            src_idx[p] = np.asarray(idx[i])
        rows = np.ravel_multi_index(tuple(src_idx), shape[:-1]).astype(np.int64).reshape(-1)
        offsets = base[which] + (out_rows - part[which, 1]) * stride
        reqs = RequestArrays.row_runs(part[which, 0], name, offsets, stride, rows, (0, c), which)
    ctx.close_buffers()
    copies, transfers = _fetch(ctx, src, dtype, reqs, op.name)
    ctx.builder.compute(copies)
    ctx.builder.exchange(f"{op.name} {label}", transfers)
    moves.calls += copies
    moves.transfers += transfers
    return shards


def batch_aligned_partition(
    batch: int, x: int, tiles: int, unit: int
) -> list[tuple[int, int, int]]:
    """Chunks of the ``batch * x`` rows of ``[B, X, Y]``: each inside one matrix, starting
    at a multiple of ``unit`` rows from the matrix start: (tile, first row, end row)."""
    if batch >= tiles:
        per = -(-batch // tiles)
        return [(t, t * per * x, min(batch, (t + 1) * per) * x) for t in range(-(-batch // per))]
    parts = max(1, tiles // batch)
    rows = -(-x // parts)
    chunk = -(-rows // unit) * unit
    out: list[tuple[int, int, int]] = []
    for b in range(batch):
        for x0 in range(0, x, chunk):
            out.append((len(out), b * x + x0, b * x + min(x, x0 + chunk)))
    return out


def _sub_blocks(sh: Shard, x: int) -> list[tuple[int, int, int]]:
    """The parts of a shard's rows inside each matrix: (matrix, first row, end row)."""
    out = []
    for b in range(sh.rows[0] // x, -(-sh.rows[1] // x)):
        lo, hi = max(sh.rows[0], b * x), min(sh.rows[1], (b + 1) * x)
        if hi > lo:
            out.append((b, lo, hi))
    return out


def _aligned(shards: list[Shard], x: int, unit: int) -> bool:
    """Whether every shard can be transposed where it is (word-aligned output columns)."""
    return all(
        not sh.transposed and all((lo - b * x) % unit == 0 for b, lo, _ in _sub_blocks(sh, x))
        for sh in shards
    )


def _swap_local(
    ctx: OpLowering, op: Operation, shards: list[Shard], x: int, y: int, dtype: str, moves: _Moves
) -> list[Shard]:
    """``[B, X, Y] -> [B, Y, X]`` by transposing every shard's blocks on its own tile."""
    eb = lookup_precision(dtype).element_bytes
    calls: list[KernelCall] = []
    out = []
    for sh in shards:
        c0, c1 = sh.cols
        for b, lo, hi in _sub_blocks(sh, x):
            stride = _stride(hi - lo, eb)
            ref = ctx.carve(sh.tile, f"{op.name}.swapped", (c1 - c0) * stride)
            src = View(sh.ref.at((lo - sh.rows[0]) * sh.row_stride), hi - lo, c1 - c0,
                       sh.row_stride, dtype)  # fmt: skip
            calls.append(
                MapCall(
                    sh.tile,
                    "transpose",
                    View(ref, c1 - c0, hi - lo, stride, dtype),
                    (src,),
                    (("col_offset", 0),),
                )
            )
            out.append(
                Shard(sh.tile, ref, (b * y + c0, b * y + c1), (lo - b * x, hi - b * x), stride)
            )
    ctx.close_buffers()
    ctx.builder.compute(calls)
    moves.calls += calls
    return out


def _renamed_rows(
    ctx: OpLowering, src: Value, perm: tuple[int, ...], spread: int | None
) -> list[Shard] | None:
    """``transpose(src, perm)`` (``perm`` keeping the last axis) as new coordinates on the
    bytes of ``src``'s shards, or ``None`` (see :mod:`ipu_stack.low.alias_views`)."""
    if src.kind in ("parameter", "host_input"):
        return None
    shards = ctx.shards_of(src)
    if shards is None:
        return None
    lead = src.shape[:-1]
    out_lead = tuple(lead[p] for p in perm[:-1])
    # the view row of every source row: unravel in the source order, ravel in the new one
    idx = np.unravel_index(np.arange(int(np.prod(lead, dtype=np.int64))), lead)
    view_row = np.ravel_multi_index(tuple(idx[p] for p in perm[:-1]), out_lead)
    eb = lookup_precision(src.dtype).element_bytes
    c = src.shape[-1]
    base = ctx.alias_base.get(src.id, len(shards))
    return alias_shards(shards, eb, c, c, np.asarray(view_row, dtype=np.int64), spread, base)


def lower_transpose_any(ctx: OpLowering, op: Operation) -> list[Shard]:
    """Any permutation of any value (host input, parameter or produced on chip)."""
    g = ctx.graph
    src, out = g.value(op.inputs[0]), g.value(op.output)
    perm = tuple(op.attr("perm"))
    rank = len(perm)
    moves = _Moves()
    if perm[-1] == rank - 1:
        spread = None if renamed_again(g, out) else MAX_ALIAS_SPREAD
        aliased = _renamed_rows(ctx, src, perm, spread)
        if aliased is not None:  # the same bytes under the output's coordinates
            ctx.costs[op.name] = ([], [], [])
            ctx.alias_base[out.id] = ctx.alias_base.get(src.id, len(ctx.shards_of(src) or ()))
            return aliased
        shards = _row_move(ctx, op, src, src.shape, perm, out.dtype, "out", moves)
        ctx.costs[op.name] = (moves.calls, moves.transfers, [])
        return shards
    first, second = transpose_steps(perm)
    a = perm[-1]
    lead = [p for p in perm if p not in (a, rank - 1)]
    t1_shape = (*(src.shape[p] for p in lead), src.shape[a], src.shape[-1])
    x, y = src.shape[a], src.shape[-1]
    batch = src.size // (x * y)
    unit = max(1, 4 // lookup_precision(out.dtype).element_bytes)
    own = ctx.shards_of(src) if first is None and src.kind != "parameter" else None
    parts = batch_aligned_partition(batch, x, ctx.row_tiles.get(op.name, ctx.tiles), unit)
    if first is not None:  # the regroup as a renaming of src's bytes, unless that makes
        own = _renamed_rows(ctx, src, first, MAX_ALIAS_SPREAD)  # finer pieces than a move
        if own is not None and len(own) > len(parts):
            own = None
    if own is not None and _aligned(own, x, unit):
        current = _swap_local(ctx, op, own, x, y, out.dtype, moves)
    else:
        regroup = first or tuple(range(rank))
        t1 = _row_move(ctx, op, src, src.shape, regroup, out.dtype, "regroup", moves, parts)
        current = _swap_local(ctx, op, t1, x, y, out.dtype, moves)
    if second != tuple(range(rank)):
        t2_shape = (*t1_shape[:-2], y, x)
        current = _row_move(ctx, op, current, t2_shape, second, out.dtype, "out", moves)
    ctx.costs[op.name] = (moves.calls, moves.transfers, [])
    return current

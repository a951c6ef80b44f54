"""Lower the indexing operations: gather (embedding lookup), concat and argmax.

**gather** ``table[ids]``, table ``[V, D]``: the table is cut into a grid of row blocks x
column blocks (:func:`~ipu_stack.mid.candidates.indexing.gather_grid`), one block per tile
(parameters written there by the host; a computed table gathered from its producer). Every
table tile receives all ids (one multicast phase) and runs ``gather_rows``: for each id, the
row it holds is copied into a staging buffer ``[N, w]``, the rows other blocks hold are
written as zeros, and an id outside ``[0, V)`` faults with the ids value, position and id.
With one row block the staging buffers are the output (column blocks). With ``R`` row blocks,
a fixed reduce-scatter assembles the rows: tile ``(r, c)`` receives rows block ``r`` of the
other ``R - 1`` partials of column ``c`` and adds them to its own (``reduce_add``; exactly one
term of each row is non-zero, so the sum is the row itself).

**concat** along the last axis stages each operand's rows on the output tile and copies them
side by side (``concat`` kernel); along another axis each output row is one operand row, moved
straight into place (local copies and exchange; parameters written by the host).

**argmax** (over the last axis) stages whole rows and writes the first maximum's index (i32).
"""

from __future__ import annotations

import numpy as np

from ipu_stack.graph.compute_graph import Operation
from ipu_stack.low.gather import GatherRequest
from ipu_stack.low.lower_ops import OpLowering, _finish, _stride, flat_shape, row_partition
from ipu_stack.low.program import AddCall, KernelCall, LogicalTransfer, MapCall, Ref, Shard, View
from ipu_stack.mid.candidates.indexing import gather_grid
from ipu_stack.target.ipu21 import precision as lookup_precision


def lower_gather(ctx: OpLowering, op: Operation) -> list[Shard]:
    """Gather rows of a tile-distributed table by run-time ids (see module docstring)."""
    g = ctx.graph
    table, ids, out = g.value(op.inputs[0]), g.value(op.inputs[1]), g.value(op.output)
    vocab, width = table.shape
    eb = lookup_precision(table.dtype).element_bytes
    grid = gather_grid(vocab, width, eb, ctx.tiles, op.name)
    n_ids = ids.size
    id_rows, id_cols = flat_shape(ids.shape)
    id_stride = _stride(id_cols, 4)
    attrs_common = (
        ("op", op.name),
        ("ids_name", ids.name),
        ("ids_shape", ",".join(map(str, ids.shape))),
        ("table_rows", vocab),
    )
    table_reqs: list[GatherRequest] = []
    id_reqs: list[GatherRequest] = []
    calls: list[KernelCall] = []
    partials: dict[tuple[int, int], tuple[int, Ref, int, tuple[int, int]]] = {}
    for r in range(grid.row_blocks):
        v0, v1 = r * grid.rows_per_block, min(vocab, (r + 1) * grid.rows_per_block)
        for c in range(grid.col_blocks):
            c0, c1 = c * grid.cols_per_block, min(width, (c + 1) * grid.cols_per_block)
            tile = r * grid.col_blocks + c
            t_stride = _stride(c1 - c0, eb)
            t_ref = ctx.carve(tile, f"{op.name}.table", (v1 - v0) * t_stride)
            table_reqs.append(GatherRequest(tile, t_ref, t_stride, (v0, v1), (c0, c1)))
            i_ref = ctx.carve(tile, f"{op.name}.ids", id_rows * id_stride)
            id_reqs.append(GatherRequest(tile, i_ref, id_stride, (0, id_rows), (0, id_cols)))
            p_stride = _stride(c1 - c0, eb)
            p_ref = ctx.carve(tile, f"{op.name}.rows", n_ids * p_stride)
            calls.append(
                MapCall(
                    tile,
                    "gather_rows",
                    View(p_ref, n_ids, c1 - c0, p_stride, out.dtype),
                    (
                        View(t_ref, v1 - v0, c1 - c0, t_stride, table.dtype),
                        View(i_ref, id_rows, id_cols, id_stride, "i32"),
                    ),
                    (*attrs_common, ("row_offset", v0)),
                )
            )
            partials[(r, c)] = (tile, p_ref, p_stride, (c0, c1))
    reduce_calls: list[KernelCall] = []
    transfers: list[LogicalTransfer] = []
    block = -(-n_ids // grid.row_blocks)
    shards: list[Shard] = []
    if grid.row_blocks == 1:
        shards = [Shard(t, ref, (0, n_ids), cols, st) for t, ref, st, cols in partials.values()]
    else:
        for (r, c), (tile, p_ref, p_stride, cols) in partials.items():
            lo, hi = r * block, min(n_ids, (r + 1) * block)
            if hi <= lo:
                continue
            own = p_ref.at(lo * p_stride)
            inputs = []
            for q in range(grid.row_blocks):
                if q == r:
                    continue
                src_tile, src_ref, _, _ = partials[(q, c)]
                slot = ctx.carve(tile, f"{op.name}.recv", (hi - lo) * p_stride)
                words = (hi - lo) * p_stride // 4
                transfers.append(
                    LogicalTransfer(src_tile, src_ref.at(lo * p_stride), ((tile, slot),), words)
                )
                inputs.append(slot)
            elements = (hi - lo) * p_stride // eb  # row padding is zero in every partial
            precision = lookup_precision(table.dtype)
            reduce_calls.append(AddCall(tile, own, tuple(inputs), elements, precision))
            shards.append(Shard(tile, own, (lo, hi), cols, p_stride))
    ctx.close_buffers()
    copies: list[KernelCall] = []
    fetched: list[LogicalTransfer] = []
    for value, reqs in ((table, table_reqs), (ids, id_reqs)):
        local, moved = ctx.fetch(value, reqs, op.name)
        copies += local
        fetched += moved
    ctx.builder.compute(copies)
    ctx.builder.exchange(f"{op.name} table and ids", fetched)
    ctx.builder.compute(calls)
    ctx.builder.exchange(f"{op.name} assemble rows", transfers)
    ctx.builder.compute(reduce_calls)
    ctx.costs[op.name] = (copies + calls, fetched + transfers, reduce_calls)
    return shards


def lower_concat(ctx: OpLowering, op: Operation) -> list[Shard]:
    """Concatenate along any axis into a row layout of the output."""
    g = ctx.graph
    out = g.value(op.output)
    ins = [g.value(i) for i in op.inputs]
    axis = int(op.attr("axis"))
    rank = len(out.shape)
    n, c = flat_shape(out.shape)
    eb = lookup_precision(out.dtype).element_bytes
    stride = _stride(c, eb)
    requests: dict[int, list[GatherRequest]] = {v.id: [] for v in ins}
    calls: list[KernelCall] = []
    shards = []
    tiles = ctx.row_tiles.get(op.name, ctx.tiles)
    for tile, r0, r1 in row_partition(n, tiles):
        ref = ctx.carve(tile, f"{op.name}.out", (r1 - r0) * stride)
        shards.append(Shard(tile, ref, (r0, r1), (0, c), stride))
        if axis == rank - 1:
            views = []
            for j, v in enumerate(ins):
                w = v.shape[-1]
                st = _stride(w, eb)
                sref = ctx.carve(tile, f"{op.name}.in{j}", (r1 - r0) * st)
                requests[v.id].append(GatherRequest(tile, sref, st, (r0, r1), (0, w)))
                views.append(View(sref, r1 - r0, w, st, v.dtype))
            out_view = View(ref, r1 - r0, c, stride, out.dtype)
            calls.append(MapCall(tile, "concat", out_view, tuple(views)))
            continue
        # out row -> (operand, operand row): split the leading axes at ``axis``
        idx = np.unravel_index(np.arange(r0, r1), out.shape[:-1])
        along = np.asarray(idx[axis])
        edges = np.cumsum([0] + [v.shape[axis] for v in ins])
        which = np.searchsorted(edges, along, side="right") - 1
        for j, v in enumerate(ins):
            sel = np.flatnonzero(which == j)
            if not sel.size:
                continue
            src_idx = [np.asarray(i)[sel] for i in idx]
            src_idx[axis] = along[sel] - edges[j]
            rows = np.ravel_multi_index(tuple(src_idx), v.shape[:-1]).astype(np.int64)
            for s, cnt, pos in _paired_runs(rows, sel):
                at = ref.at(pos * stride)
                requests[v.id].append(GatherRequest(tile, at, stride, (s, s + cnt), (0, c)))
    ctx.close_buffers()
    _finish(ctx, op, ins, requests, calls)
    return shards


def _paired_runs(src: np.ndarray, dst: np.ndarray) -> list[tuple[int, int, int]]:
    """Runs where both the source rows and the destination rows advance by one:
    (first source row, length, first destination row)."""
    breaks = np.flatnonzero((np.diff(src) != 1) | (np.diff(dst) != 1)) + 1
    starts = np.concatenate([[0], breaks]).astype(np.int64)
    ends = np.concatenate([breaks, [src.size]]).astype(np.int64)
    return [(int(src[a]), int(b - a), int(dst[a])) for a, b in zip(starts, ends, strict=True)]


def lower_argmax(ctx: OpLowering, op: Operation) -> list[Shard]:
    """Index of the first maximum of each row (the last axis), as i32."""
    g = ctx.graph
    src, out = g.value(op.inputs[0]), g.value(op.output)
    n, c = flat_shape(src.shape)
    eb = lookup_precision(src.dtype).element_bytes
    requests: dict[int, list[GatherRequest]] = {src.id: []}
    calls: list[KernelCall] = []
    shards = []
    for tile, r0, r1 in row_partition(n, ctx.row_tiles.get(op.name, ctx.tiles)):
        st = _stride(c, eb)
        sref = ctx.carve(tile, f"{op.name}.in", (r1 - r0) * st)
        requests[src.id].append(GatherRequest(tile, sref, st, (r0, r1), (0, c)))
        oref = ctx.carve(tile, f"{op.name}.out", (r1 - r0) * 8)
        calls.append(
            MapCall(
                tile,
                "argmax",
                View(oref, r1 - r0, 1, 8, out.dtype),
                (View(sref, r1 - r0, c, st, src.dtype),),
            )
        )
        shards.append(Shard(tile, oref, (r0, r1), (0, 1), 8))
    ctx.close_buffers()
    _finish(ctx, op, [src], requests, calls)
    return shards


def _lower_transpose(ctx: OpLowering, op: Operation) -> list[Shard]:
    from ipu_stack.low.lower_movement import lower_transpose_any

    return lower_transpose_any(ctx, op)


#: lowerings of the operations of this module and lower_movement (override lower_ops')
INDEXING_LOWERINGS = {
    "gather": lower_gather,
    "concat": lower_concat,
    "argmax": lower_argmax,
    "transpose": _lower_transpose,
}

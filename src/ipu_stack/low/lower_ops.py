"""Lower the non-GEMM operations: elementwise, row-wise, data movement and attention.

Values live as shards in flat-row coordinates (``[N, C]``: ``C`` the last axis). Elementwise
operations keep the layout of their anchor input (the operand with the output's shape), so a
bias add or GeLU after a GEMM runs in place on the GEMM's tiles; row-wise operations need whole
rows and keep the anchor layout only if its shards have them, else rows are spread over the
tiles. Other operands are staged next to the output: parameters are written there by the host
(replication is free), everything else is gathered (local copies and exchange).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.graph.compute_graph import ComputeGraph, Operation, Value
from ipu_stack.graph.elementwise import KINDS as ELEMENTWISE_KINDS
from ipu_stack.low.alias_views import MAX_ALIAS_SPREAD, alias_shards, renamed_again
from ipu_stack.low.gather import GatherRequest, ShardIndex, gather, host_fill, row_runs
from ipu_stack.low.gather_arrays import RequestArrays, gather_arrays
from ipu_stack.low.makers import make_buffer
from ipu_stack.low.program import (
    KernelCall,
    LogicalTransfer,
    MapCall,
    ProgramBuilder,
    Ref,
    Shard,
    View,
)
from ipu_stack.target.ipu21 import WORD_BYTES
from ipu_stack.target.ipu21 import precision as lookup_precision

ROW_ALIGN = 8  # storage rows start on 64-bit boundaries (facts §5.2: natural alignment)
BUFFER_ALIGN = 8
MAX_GATHER_REQUESTS = 400_000  # element-wise rearrangements beyond this are refused
HOME_CHUNK_BYTES = 256  # a staged parameter's home: chunks of this many bytes per tile
HOME_SPREAD = 97  # tiles between the homes of consecutive parameters (coprime with 1,472)


def flat_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """The flat-row view ``[N, C]`` of a shape."""
    return (int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1, shape[-1])


def _stride(cols: int, eb: int) -> int:
    return -(-cols * eb // ROW_ALIGN) * ROW_ALIGN


def row_partition(rows: int, tiles: int) -> list[tuple[int, int, int]]:
    """Rows spread evenly over at most ``tiles`` tiles: (tile, first row, end row)."""
    used = min(tiles, rows)
    chunk = -(-rows // used)
    return [(t, t * chunk, min(rows, (t + 1) * chunk)) for t in range(-(-rows // chunk))]


@dataclass(slots=True)
class OpLowering:
    """Shared state while lowering a graph: shards of every value and the host's writes."""

    graph: ComputeGraph
    builder: ProgramBuilder
    tiles: int
    value_shards: dict[int, list[Shard]]
    host_shards: dict[int, list[Shard]]
    buffer_use: dict[tuple[int, str], int] = field(default_factory=dict)
    # ops the mid-level plan puts in a row layout over this many tiles (else: anchor layout)
    row_tiles: dict[str, int] = field(default_factory=dict)
    # gemms whose tile range starts at this tile (wrapping; place/balance.py), else 0
    tile_offsets: dict[str, int] = field(default_factory=dict)
    # the plan of each loop body by repeat operation (else planned on first use)
    bodies: dict[str, Any] = field(default_factory=dict)
    # ops whose parameters are moved in from a home each run (loop bodies), not host-written
    # beside every use: see :meth:`parameter_home`
    staged: set[str] = field(default_factory=set)
    # a loop body's lowering: parameters are per iteration (homes, see GemmProblem.in_loop)
    staged_homes: bool = False
    # left operands produced on chip that a gemm delivered, by delivery (see lower_gemm's
    # ``delivered``): a later gemm with the same left operand and blocks reads them there
    delivered: dict[tuple, str] = field(default_factory=dict)
    # a loop body's: calls to run once before the loop (zero padding, see lower_gemm)
    prologue: list[KernelCall] = field(default_factory=list)
    # whether loop bodies put their padding fills in ``prologue`` (placement may need them not to)
    hoist_padding: bool = True
    #: value id -> shard count of the value whose bytes it renames (aliases of aliases too)
    alias_base: dict[int, int] = field(default_factory=dict)
    # per op: (calls before exchange, transfers, calls after) for the estimate
    costs: dict[str, tuple[list[KernelCall], list[LogicalTransfer], list[KernelCall]]] = field(
        default_factory=dict
    )

    # -- buffers ------------------------------------------------------------------------------
    def carve(self, tile: int, name: str, size: int) -> Ref:
        """Space inside a per-op buffer on ``tile`` (created when the op is finished)."""
        key = (tile, name)
        used = self.buffer_use.get(key, 0)
        self.buffer_use[key] = used + -(-size // BUFFER_ALIGN) * BUFFER_ALIGN
        return Ref(name, used)

    def close_buffers(self, host_written: set[tuple[int, str]] | None = None) -> None:
        for (tile, name), size in self.buffer_use.items():
            written = bool(host_written and (tile, name) in host_written)
            self.builder.buffer(
                make_buffer(tile, name, max(size, BUFFER_ALIGN), BUFFER_ALIGN, "any", False, (),
                            written, False)
            )  # fmt: skip
        self.buffer_use.clear()

    # -- values -------------------------------------------------------------------------------
    def shards_of(self, value: Value) -> list[Shard] | None:
        """The value's shards, homing a host input in a row layout on first use."""
        if value.id in self.value_shards:
            return self.value_shards[value.id]
        if value.kind != "host_input":
            return None
        n, c = flat_shape(value.shape)
        eb = lookup_precision(value.dtype).element_bytes
        stride = _stride(c, eb)
        shards = []
        name = f"{value.name}.home"
        for tile, r0, r1 in row_partition(n, self.tiles):
            ref = self.carve(tile, name, (r1 - r0) * stride)
            shards.append(Shard(tile, ref, (r0, r1), (0, c), stride))
        self.host_shards[value.id].extend(shards)
        self.value_shards[value.id] = shards
        homes = {(sh.tile, name) for sh in shards}
        self.close_buffers(homes)
        return shards

    def parameter_home(self, value: Value) -> list[Shard]:
        """A parameter stored once, spread over a few tiles (the host writes it there), to
        be gathered by the operations that read it (``staged``). A loop body's per-iteration
        parameter is then stored once per iteration rather than beside every use: a layer
        norm's scale on every tile of its rows, 27 times over, is what does not fit.

        Single-row parameters are cut into column chunks of ``HOME_CHUNK_BYTES``, others into
        row blocks; consecutive tiles from a start that differs per parameter, so the homes
        of several parameters spread out.
        """
        if value.id in self.value_shards:
            return self.value_shards[value.id]
        n, c = flat_shape(value.shape)
        eb = lookup_precision(value.dtype).element_bytes
        start = (value.id * HOME_SPREAD) % self.tiles
        name = f"{value.name}.home"
        shards = []
        if n == 1:
            width = max(1, HOME_CHUNK_BYTES // eb)
            for j, c0 in enumerate(range(0, c, width)):
                c1 = min(c, c0 + width)
                tile = (start + j) % self.tiles
                stride = _stride(c1 - c0, eb)
                shards.append(Shard(tile, self.carve(tile, name, stride), (0, 1), (c0, c1), stride))
        else:
            stride = _stride(c, eb)
            for j, r0, r1 in row_partition(n, min(self.tiles, -(-n * stride // HOME_CHUNK_BYTES))):
                tile = (start + j) % self.tiles
                ref = self.carve(tile, name, (r1 - r0) * stride)
                shards.append(Shard(tile, ref, (r0, r1), (0, c), stride))
        self.host_shards[value.id].extend(shards)
        self.value_shards[value.id] = shards
        self.close_buffers({(sh.tile, name) for sh in shards})
        return shards

    def fetch(
        self, value: Value, requests: list[GatherRequest] | RequestArrays, what: str
    ) -> tuple[list[KernelCall], list[LogicalTransfer]]:
        """Make ``requests`` of ``value`` true: host writes for parameters, else a gather."""
        if value.kind == "parameter" and what not in self.staged:
            if isinstance(requests, RequestArrays):
                requests = requests.requests()
            self.host_shards[value.id].extend(host_fill(r) for r in requests)
            return [], []
        shards = self.parameter_home(value) if value.kind == "parameter" else self.shards_of(value)
        assert shards is not None
        eb = lookup_precision(value.dtype).element_bytes
        if len(requests) > MAX_GATHER_REQUESTS:
            raise GraphError(f"{what}: needs {len(requests)} separate pieces of {value.name!r}")
        if isinstance(requests, RequestArrays):
            return gather_arrays(requests, ShardIndex(shards), eb, what)
        return gather(requests, ShardIndex(shards), eb, what)


def broadcast_rows(
    out_shape: tuple[int, ...], in_shape: tuple[int, ...], r0: int, r1: int
) -> np.ndarray:
    """For output flat rows [r0, r1), the input flat row each one reads (NumPy broadcast)."""
    lead_out = out_shape[:-1]
    lead_in = (1,) * (len(out_shape) - len(in_shape)) + in_shape[:-1] if len(in_shape) > 1 else ()
    if not lead_out:
        return np.zeros(r1 - r0, dtype=np.int64)
    if not lead_in:
        return np.zeros(r1 - r0, dtype=np.int64)
    lead_in = lead_in[-len(lead_out) :]
    idx = np.unravel_index(np.arange(r0, r1), lead_out)
    idx_in = tuple(np.where(np.array(d) == 1, 0, i) for i, d in zip(idx, lead_in, strict=True))
    return np.ravel_multi_index(idx_in, lead_in).astype(np.int64)


def _stage(
    ctx: OpLowering,
    op: Operation,
    value: Value,
    tile: int,
    out_rows: tuple[int, int],
    out_cols: tuple[int, int],
    out_shape: tuple[int, ...],
    buf: str,
) -> tuple[View, list[GatherRequest]]:
    """Stage the part of a (broadcast) operand that an output shard reads."""
    _n_in, c_in = flat_shape(value.shape)
    eb = lookup_precision(value.dtype).element_bytes
    cols = out_cols if c_in == out_shape[-1] else (0, 1)
    if c_in not in (1, out_shape[-1]):
        raise GraphError(f"{op.name}: operand {value.name!r} {value.shape} does not broadcast")
    count = out_rows[1] - out_rows[0]
    runs: list[tuple[int, int, int]]
    if len(value.shape) > 1 and value.shape[:-1] == out_shape[:-1]:  # row r reads row r
        one_row, runs = count == 1, [(out_rows[0], count, 0)]
    elif len(value.shape) <= 1:  # a vector: every row reads row 0
        one_row, runs = True, [(0, 1, 0)]
    else:
        rows = broadcast_rows(out_shape, value.shape, *out_rows)
        one_row = bool(np.all(rows == rows[0]))
        runs = [(int(rows[0]), 1, 0)] if one_row else row_runs(rows)
    nrows = 1 if one_row else count
    ncols = cols[1] - cols[0]
    stride = _stride(ncols, eb)
    ref = ctx.carve(tile, buf, nrows * stride)
    requests = [
        GatherRequest(tile, ref.at(pos * stride), stride, (src, src + count), cols)
        for src, count, pos in runs
    ]
    return View(ref, nrows, ncols, stride, value.dtype), requests


def _anchor_layout(
    ctx: OpLowering, op: Operation, anchor: Value | None, full_rows: bool
) -> list[Shard] | None:
    if anchor is None:
        return None
    shards = ctx.shards_of(anchor)
    if shards is None:
        return None
    if full_rows and any(sh.cols != (0, anchor.shape[-1]) for sh in shards):
        return None
    # the output's blocks must start (and end, inside a row) on 32-bit words in its own
    # precision, or exchange could not read them (e.g. an F8 cast of 14-column F16 pieces)
    eb = lookup_precision(ctx.graph.value(op.output).dtype).element_bytes
    c = anchor.shape[-1]
    starts_off = any((sh.cols[0] * eb) % WORD_BYTES for sh in shards)
    if starts_off or any((sh.cols[1] * eb) % WORD_BYTES and sh.cols[1] != c for sh in shards):
        return None
    return shards


def lower_map(ctx: OpLowering, op: Operation) -> list[Shard]:
    """Elementwise (add, mul, gelu, cast) and row-wise (layer_norm, softmax) operations."""
    g = ctx.graph
    out = g.value(op.output)
    ins = [g.value(i) for i in op.inputs]
    n, c = flat_shape(out.shape)
    full_rows = op.kind in ("layer_norm", "softmax")
    anchor = next((v for v in ins if v.shape == out.shape), None) if op.kind != "cast" else ins[0]
    anchor_shards = None if op.name in ctx.row_tiles else _anchor_layout(ctx, op, anchor, full_rows)
    if anchor_shards is not None:
        layout: list[tuple[int, tuple[int, int], tuple[int, int], Shard | None]] = [
            (sh.tile, sh.rows, sh.cols, sh) for sh in anchor_shards
        ]
    else:
        tiles = ctx.row_tiles.get(op.name, ctx.tiles)
        layout = [(t, (r0, r1), (0, c), None) for t, r0, r1 in row_partition(n, tiles)]
    eb_out = lookup_precision(out.dtype).element_bytes
    calls: list[KernelCall] = []
    requests: dict[int, list[GatherRequest]] = defaultdict(list)
    out_shards = []
    attrs = tuple((k, v) for k, v in op.attrs if isinstance(v, (int, float, bool, str)))
    if op.kind == "cast":  # F8 scales on either side
        attrs += (
            ("scale_exponent", out.scale_exponent),
            ("source_scale_exponent", ins[0].scale_exponent),
        )
    for tile, rows, cols, anchor_shard in layout:
        ncols = cols[1] - cols[0]
        stride = _stride(ncols, eb_out)
        ref = ctx.carve(tile, f"{op.name}.out", (rows[1] - rows[0]) * stride)
        out_view = View(ref, rows[1] - rows[0], ncols, stride, out.dtype)
        views = []
        for j, v in enumerate(ins):
            if anchor_shard is not None and v is anchor:
                sh = anchor_shard
                views.append(View(sh.ref, rows[1] - rows[0], ncols, sh.row_stride, v.dtype))
                continue
            if full_rows and j > 0:  # scale and bias: one row of the whole last axis
                view, reqs = _stage(ctx, op, v, tile, (0, 1), (0, c), (1, c), f"{op.name}.in{j}")
            elif op.kind == "reduce_mean":  # whole input rows for each output row
                c_in, full = v.shape[-1], (*out.shape[:-1], v.shape[-1])
                view, reqs = _stage(ctx, op, v, tile, rows, (0, c_in), full, f"{op.name}.in{j}")
            else:
                view, reqs = _stage(ctx, op, v, tile, rows, cols, out.shape, f"{op.name}.in{j}")
            views.append(view)
            requests[v.id].extend(reqs)
        calls.append(MapCall(tile, op.kind, out_view, tuple(views), attrs))
        out_shards.append(Shard(tile, ref, rows, cols, stride))
    ctx.close_buffers()
    _finish(ctx, op, ins, requests, calls)
    return out_shards


def _finish(
    ctx: OpLowering,
    op: Operation,
    ins: list[Value],
    requests: dict[int, list[GatherRequest]],
    calls: list[KernelCall],
) -> None:
    copies: list[KernelCall] = []
    transfers: list[LogicalTransfer] = []
    for v in {v.id: v for v in ins}.values():
        if requests.get(v.id):
            c, t = ctx.fetch(v, requests[v.id], op.name)
            copies += c
            transfers += t
    ctx.builder.compute(copies)
    ctx.builder.exchange(f"{op.name} operands", transfers)
    ctx.builder.compute(calls)
    ctx.costs[op.name] = (copies, transfers, calls)


RequestMaker = Callable[[int, Ref, int, int, int], list[GatherRequest]]


def _move(ctx: OpLowering, op: Operation, src_rows_of: RequestMaker, out_c: int) -> list[Shard]:
    """Pure data movement into a row layout of the output (view, transpose, slice)."""
    g = ctx.graph
    out, src = g.value(op.output), g.value(op.inputs[0])
    n, _ = flat_shape(out.shape)
    eb = lookup_precision(out.dtype).element_bytes
    requests: list[GatherRequest] = []
    shards = []
    for tile, r0, r1 in row_partition(n, ctx.row_tiles.get(op.name, ctx.tiles)):
        stride = _stride(out_c, eb)
        ref = ctx.carve(tile, f"{op.name}.out", (r1 - r0) * stride)
        requests += src_rows_of(tile, ref, stride, r0, r1)
        shards.append(Shard(tile, ref, (r0, r1), (0, out_c), stride))
    ctx.close_buffers()
    copies, transfers = ctx.fetch(src, requests, op.name)
    ctx.builder.compute(copies)
    ctx.builder.exchange(f"{op.name} rearrange", transfers)
    ctx.costs[op.name] = (copies, transfers, [])
    return shards


def lower_view(ctx: OpLowering, op: Operation) -> list[Shard]:
    g = ctx.graph
    out, src = g.value(op.output), g.value(op.inputs[0])
    _n_in, c_in = flat_shape(src.shape)
    _n_out, c_out = flat_shape(out.shape)
    shards = ctx.shards_of(src)
    if src.kind == "parameter":
        raise GraphError(f"{op.name}: viewing a parameter is not supported; reshape its data")
    assert shards is not None
    eb = lookup_precision(src.dtype).element_bytes
    if c_in == c_out:  # same rows: a relabel, no data moves
        ctx.costs[op.name] = ([], [], [])
        return shards
    full = all(sh.cols == (0, c_in) and sh.row_stride == c_in * eb for sh in shards)
    if full and c_in % c_out == 0 and (c_out * eb) % 4 == 0:
        k = c_in // c_out
        ctx.costs[op.name] = ([], [], [])
        return [
            Shard(sh.tile, sh.ref, (sh.rows[0] * k, sh.rows[1] * k), (0, c_out), c_out * eb)
            for sh in shards
        ]
    if full and c_out % c_in == 0:
        k = c_out // c_in
        if all(sh.rows[0] % k == 0 and sh.rows[1] % k == 0 for sh in shards):
            ctx.costs[op.name] = ([], [], [])
            return [
                Shard(sh.tile, sh.ref, (sh.rows[0] // k, sh.rows[1] // k), (0, c_out), c_out * eb)
                for sh in shards
            ]

    spread = None if renamed_again(g, out) else MAX_ALIAS_SPREAD
    base = ctx.alias_base.get(src.id, len(shards))
    aliased = alias_shards(shards, eb, c_in, c_out, spread=spread, base=base)
    if aliased is not None:  # the same bytes under the view's coordinates
        ctx.costs[op.name] = ([], [], [])
        ctx.alias_base[out.id] = base
        return aliased

    def requests(tile: int, ref: Ref, stride: int, r0: int, r1: int) -> list[GatherRequest]:
        out_reqs = []
        for r in range(r0, r1):
            f0, f1 = r * c_out, (r + 1) * c_out
            f = f0
            while f < f1:
                sr, sc = divmod(f, c_in)
                take = min(f1 - f, c_in - sc)
                pos = (r - r0) * stride + (f - f0) * eb
                out_reqs.append(
                    GatherRequest(tile, ref.at(pos), stride, (sr, sr + 1), (sc, sc + take))
                )
                f += take
        return out_reqs

    return _move(ctx, op, requests, c_out)


def lower_slice(ctx: OpLowering, op: Operation) -> list[Shard]:
    g = ctx.graph
    out, src = g.value(op.output), g.value(op.inputs[0])
    bounds = op.attr("bounds")
    if src.kind == "parameter":
        raise GraphError(f"{op.name}: slicing a parameter is not supported; slice its data")

    def requests(tile: int, ref: Ref, stride: int, r0: int, r1: int) -> list[GatherRequest]:
        if len(out.shape) > 1:
            idx = np.unravel_index(np.arange(r0, r1), out.shape[:-1])
            src_idx = tuple(i + lo for i, (lo, _) in zip(idx, bounds[:-1], strict=True))
            rows = np.ravel_multi_index(src_idx, src.shape[:-1])
        else:
            rows = np.zeros(r1 - r0, dtype=np.int64)
        cols = bounds[-1]
        return [
            GatherRequest(tile, ref.at(pos * stride), stride, (s, s + cnt), cols)
            for s, cnt, pos in row_runs(np.asarray(rows, dtype=np.int64))
        ]

    return _move(ctx, op, requests, out.shape[-1])


def lower_attention(ctx: OpLowering, op: Operation) -> list[Shard]:
    """Each tile takes a block of query rows of one head, with that head's keys and values."""
    g = ctx.graph
    q, k, v = (g.value(i) for i in op.inputs[:3])
    mask = g.value(op.inputs[3]) if len(op.inputs) == 4 else None
    out = g.value(op.output)
    tq, d = q.shape[-2:]
    tk, dv = v.shape[-2:]
    heads = int(np.prod(q.shape[:-2], dtype=np.int64)) if len(q.shape) > 2 else 1
    tiles = ctx.row_tiles.get(op.name, ctx.tiles)
    parts = max(1, min(tq, tiles // heads)) if heads <= tiles else 1
    qb = -(-tq // parts)
    eb = lookup_precision(out.dtype).element_bytes
    requests: dict[int, list[GatherRequest]] = defaultdict(list)
    calls: list[KernelCall] = []
    shards = []
    tile = 0
    per_tile = max(1, -(-heads * -(-tq // qb) // tiles))
    count = 0
    for h in range(heads):
        for q0 in range(0, tq, qb):
            q1 = min(tq, q0 + qb)
            rows = q1 - q0
            views = []
            for role, val, r_lo, r_hi, width in (
                ("q", q, h * tq + q0, h * tq + q1, d),
                ("k", k, h * tk, (h + 1) * tk, d),
                ("v", v, h * tk, (h + 1) * tk, dv),
            ):
                stride = _stride(width, eb)
                ref = ctx.carve(tile, f"{op.name}.{role}", (r_hi - r_lo) * stride)
                requests[val.id].append(GatherRequest(tile, ref, stride, (r_lo, r_hi), (0, width)))
                views.append(View(ref, r_hi - r_lo, width, stride, val.dtype))
            if mask is not None:  # the mask rows of these scores, broadcast where it can
                scores = (*q.shape[:-1], tk)
                span = (h * tq + q0, h * tq + q1)
                view, reqs = _stage(ctx, op, mask, tile, span, (0, tk), scores, f"{op.name}.mask")
                views.append(view)
                requests[mask.id].extend(reqs)
            stride = _stride(dv, eb)
            oref = ctx.carve(tile, f"{op.name}.out", rows * stride)
            attrs = (
                ("causal", bool(op.attr("causal"))),
                ("scale", float(op.attr("scale"))),
                ("q_offset", q0),
                ("q_total", tq),
            )
            calls.append(
                MapCall(
                    tile, "attention", View(oref, rows, dv, stride, out.dtype), tuple(views), attrs
                )
            )
            shards.append(Shard(tile, oref, (h * tq + q0, h * tq + q1), (0, dv), stride))
            count += 1
            if count == per_tile:
                tile, count = tile + 1, 0
    ctx.close_buffers()
    _finish(ctx, op, [q, k, v] + ([mask] if mask else []), requests, calls)
    return shards


LOWERINGS = {
    "add": lower_map,
    "mul": lower_map,
    "gelu": lower_map,
    "cast": lower_map,
    "equal": lower_map,
    "where": lower_map,
    "layer_norm": lower_map,
    "softmax": lower_map,
    "view": lower_view,
    "slice": lower_slice,
    "flash_attention": lower_attention,
    **dict.fromkeys(ELEMENTWISE_KINDS, lower_map),
}

"""Lower ``repeat``: the loop body is planned and lowered once and run ``count`` times.

The carried value lives in the body's home for its carried input (wherever the body's first
consumer wants it). Before the loop the initial value is gathered (or written by the host)
there; at the end of each iteration the body's result is gathered back into it, so the next
iteration, and the operation's consumers after the loop, read it in place. Per-iteration
weights are stored as ``count`` equal blocks per buffer; iteration ``i`` reads block ``i``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from ipu_stack.graph.compute_graph import ComputeGraph, Operation
from ipu_stack.low.gather import GatherRequest
from ipu_stack.low.lower_ops import OpLowering, flat_shape
from ipu_stack.low.makers import make_shard, ref, union_spans
from ipu_stack.low.program import (
    Buffer,
    ComputeStep,
    CopyCall,
    ExchangeStep,
    KernelCall,
    LogicalTransfer,
    ProgramBuilder,
    Ref,
    Shard,
)
from ipu_stack.target.ipu21 import precision as lookup_precision

BLOCK_ALIGN = 32
STAGE_SUFFIX = ".stage"


def stage_iterated_sources(body: ProgramBuilder, iterated: dict[tuple[int, str], int]) -> int:
    """Exchanges of a loop body send from non-iterated copies of the iterated bytes they read.

    An exchange row holds absolute addresses, so a send from an iterated buffer (a weight
    chunk that is multicast to the tiles of its block) would need its rows encoded once per
    iteration: exchange code growing with depth. Instead, in the compute step before such an
    exchange, each tile copies the byte ranges it sends from this iteration's block into a
    ``.stage`` buffer (one block of those ranges, reused by every iteration), and the
    exchange sends from there. Returns the busiest tile's copy cycles (for the estimate).
    """
    from ipu_stack.low.costs import call_cycles

    staged: dict[tuple[int, str], int] = {}  # stage buffer sizes
    per_tile: dict[int, int] = defaultdict(int)
    index = 0
    while index < len(body.steps):
        step = body.steps[index]
        if not isinstance(step, ExchangeStep):
            index += 1
            continue
        ranges: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
        for lt in step.transfers:
            key = (lt.source_tile, lt.source.buffer)
            if key in iterated:
                ranges[key].append((lt.source.offset, lt.source.offset + 4 * lt.words))
        if not ranges:
            index += 1
            continue
        copies: list[KernelCall] = []
        for (tile, name), spans in sorted(ranges.items()):
            stage = name + STAGE_SUFFIX
            merged = union_spans(spans)
            for lo, hi in merged:
                call = CopyCall(tile, Ref(stage, lo), Ref(name, lo), hi - lo)
                copies.append(call)
                per_tile[tile] += call_cycles(call)
            staged[(tile, stage)] = max(staged.get((tile, stage), 0), merged[-1][1])
        step.transfers = [
            replace(lt, source=Ref(lt.source.buffer + STAGE_SUFFIX, lt.source.offset))
            if (lt.source_tile, lt.source.buffer) in iterated
            else lt
            for lt in step.transfers
        ]
        before = body.steps[index - 1] if index else None
        if isinstance(before, ComputeStep):
            before.calls.extend(copies)
            index += 1
        else:
            body.steps.insert(index, ComputeStep(copies))
            index += 2
    for (tile, stage), size in staged.items():
        source = body.buffers[(tile, stage[: -len(STAGE_SUFFIX)])]
        body.buffers[(tile, stage)] = Buffer(
            tile, stage, -(-size // BLOCK_ALIGN) * BLOCK_ALIGN, source.alignment, source.region
        )
    return max(per_tile.values(), default=0)


def _requests(homes: list[Shard]) -> list[GatherRequest]:
    return [GatherRequest(sh.tile, sh.ref, sh.row_stride, sh.rows, sh.cols) for sh in homes]


def lower_repeat(ctx: OpLowering, op: Operation) -> tuple[list[Shard], int]:
    """Lower a repeat; returns the shards of its result and its estimated cycles."""
    from ipu_stack.low.lower import lower_operations, step_estimate
    from ipu_stack.mid.candidates.repeat import body_finalist
    from ipu_stack.mid.residency import enclosing_weights_per_tile

    g = ctx.graph
    sub: ComputeGraph = op.attr("body")
    count = int(op.attr("count"))
    n_inv = int(op.attr("invariants"))
    outer = [g.value(v) for v in op.inputs]
    inner = [v for v in sub.values if v.kind != "operation"]
    finalist = ctx.bodies.get(op.name) or body_finalist(
        sub, ctx.tiles, count, enclosing_weights_per_tile(g, op, ctx.tiles)
    )
    plans = {o.id: finalist.gemm_plans[o.name] for o in sub.operations if o.kind == "gemm"}
    body = ProgramBuilder()
    body_ctx = OpLowering(sub, body, ctx.tiles, {}, defaultdict(list))
    body_ctx.row_tiles.update(finalist.row_tiles)
    body_ctx.staged.update(finalist.staged)
    body_ctx.staged_homes = True
    body_ctx.hoist_padding = ctx.hoist_padding
    body_ctx.tile_offsets.update(ctx.tile_offsets)
    body_ctx.bodies.update(ctx.bodies)
    estimates = lower_operations(body_ctx, plans)
    carried_in = inner[0]
    homes = body_ctx.value_shards.get(carried_in.id) or body_ctx.shards_of(carried_in) or []
    body_ctx.close_buffers({(sh.tile, sh.ref.buffer) for sh in homes})
    # End of each iteration: the result goes back into the carried home.
    result = sub.value(sub.outputs[0])
    eb = lookup_precision(result.dtype).element_bytes
    from ipu_stack.low.gather import ShardIndex, gather

    copies, transfers = gather(
        _requests(homes), ShardIndex(body_ctx.value_shards[result.id]), eb, op.name
    )
    body.compute(copies)
    body.exchange(f"{op.name} carried", transfers)
    body_cost = sum(estimates.values()) + step_estimate(copies, transfers, [])

    # Before the loop: initial carried value and activation invariants into their homes.
    before_calls: list[KernelCall] = []
    before_transfers: list[LogicalTransfer] = []
    for j, (outer_v, inner_v) in enumerate(
        zip(outer[: 1 + n_inv], inner[: 1 + n_inv], strict=True)
    ):
        if inner_v.kind == "parameter":
            ctx.host_shards[outer_v.id].extend(body_ctx.host_shards[inner_v.id])
            continue
        targets = homes if j == 0 else body_ctx.value_shards.get(inner_v.id, [])
        if outer_v.kind == "host_input" and outer_v.id not in ctx.value_shards:
            ctx.host_shards[outer_v.id].extend(targets)  # the host writes it in place
            continue
        c, t = ctx.fetch(outer_v, _requests(targets), op.name)
        before_calls += c
        before_transfers += t
    before_calls += body_ctx.prologue  # zero padding the body's gathers keep (lower_gemm)
    ctx.builder.compute(before_calls)
    ctx.builder.exchange(f"{op.name} initial", before_transfers)
    before_cost = step_estimate(before_calls, before_transfers, [])

    # Per-iteration weights: one block per iteration in each buffer that holds them.
    iterated: dict[tuple[int, str], int] = {}
    for outer_v, inner_v in zip(outer[1 + n_inv :], inner[1 + n_inv :], strict=True):
        n_rows, _ = flat_shape(inner_v.shape)
        shards = body_ctx.host_shards[inner_v.id]
        for sh in shards:
            key = (sh.tile, sh.ref.buffer)
            if key not in iterated:
                size = body.buffers[key].size
                iterated[key] = -(-size // BLOCK_ALIGN) * BLOCK_ALIGN
        # count x shards host shards (the host writes every layer's block): built in one
        # comprehension per shard, the shard's fields looked up once
        out = ctx.host_shards[outer_v.id]
        per_shard = []
        for sh in shards:
            stride = iterated[(sh.tile, sh.ref.buffer)]
            name, off, (r0, r1) = sh.ref.buffer, sh.ref.offset, sh.rows
            tile, cols, rs, tr = sh.tile, sh.cols, sh.row_stride, sh.transposed
            per_shard.append(
                [
                    make_shard(tile, ref(name, off + i * stride), (r0 + d, r1 + d), cols, rs, tr)
                    for i, d in zip(range(count), range(0, count * n_rows, n_rows), strict=True)
                ]
            )
        out.extend(s for i in range(count) for s in (blocks[i] for blocks in per_shard))
    for key, stride in iterated.items():
        buf = body.buffers[key]
        body.buffers[key] = Buffer(
            buf.tile,
            buf.name,
            stride * count,
            buf.alignment,
            buf.region,
            buf.exclusive_element,
            buf.avoid,
            True,
            buf.host_read,
        )
    body_cost += stage_iterated_sources(body, iterated)
    ctx.builder.loop(count, body, iterated)
    return list(homes), before_cost + count * body_cost

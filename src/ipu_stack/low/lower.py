"""Lower a planned ComputeGraph to a tile program over logical tiles."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.gc_pause import collector_paused
from ipu_stack.graph.compute_graph import ComputeGraph, GemmOp, Value
from ipu_stack.low.costs import busiest_tile_cycles
from ipu_stack.low.gemm_groups import delivery_groups, merge_members
from ipu_stack.low.in_place import write_in_place
from ipu_stack.low.lower_gemm import folded_shapes, lower_gemm
from ipu_stack.low.lower_indexing import INDEXING_LOWERINGS
from ipu_stack.low.lower_ops import LOWERINGS, OpLowering
from ipu_stack.low.makers import make_buffer
from ipu_stack.low.pair_multicasts import split_for_pairs
from ipu_stack.low.program import (
    Binding,
    KernelCall,
    LogicalTransfer,
    LowProgram,
    ProgramBuilder,
    Shard,
)
from ipu_stack.mid.gemm_plan import GemmPlan, GemmProblem, enumerate_plans
from ipu_stack.target.ipu21 import EXCHANGE_PHASE_OVERHEAD
from ipu_stack.target.ipu21 import precision as lookup_precision


def gemm_problem(
    graph: ComputeGraph,
    op: GemmOp,
    homed: set[int] | frozenset[int] = frozenset(),
    in_loop: bool = False,
) -> GemmProblem:
    """The planner's view of one gemm; host inputs already placed by an earlier consumer
    count as produced on chip (they are moved, not delivered again). ``in_loop``: ``graph``
    is a loop body (see ``GemmProblem.in_loop``)."""
    left, right, out = graph.value(op.left), graph.value(op.right), graph.value(op.output)
    shapes = folded_shapes(left.shape, right.shape, out.shape, op.transpose_left)
    left_shape, right_shape, out_shape = shapes
    out_batch = int(np.prod(out_shape[:-2], dtype=np.int64)) if out_shape[:-2] else 1
    m, n = out_shape[-2:]
    k = left_shape[-2] if op.transpose_left else left_shape[-1]

    def batched(v_shape: tuple[int, ...]) -> bool:
        own = int(np.prod(v_shape[:-2], dtype=np.int64)) if v_shape[:-2] else 1
        return own > 1 or out_batch == 1

    def kind(v: Value) -> str:
        return "operation" if v.kind == "host_input" and v.id in homed else v.kind

    return GemmProblem(
        batch=out_batch,
        m=m,
        k=k,
        n=n,
        precision=lookup_precision(left.dtype),
        left_kind=kind(left),
        right_kind=kind(right),
        left_batched=batched(left_shape),
        right_batched=batched(right_shape),
        in_loop=in_loop,
    )


def gemm_problems(graph: ComputeGraph, in_loop: bool = False) -> dict[int, GemmProblem]:
    """The problem of every gemm, in program order (which host inputs are already homed)."""
    homed: set[int] = set()
    problems = {}
    for op in graph.operations:
        if op.kind == "gemm":
            problems[op.id] = gemm_problem(graph, op, homed, in_loop)
        homed.update(i for i in op.inputs if graph.value(i).kind == "host_input")
    return problems


def plan_graph(graph: ComputeGraph, tiles: int) -> dict[int, list[GemmPlan]]:
    """Ranked plans for every gemm (cheapest first)."""
    return {op_id: enumerate_plans(p, tiles) for op_id, p in gemm_problems(graph).items()}


def lower_program(
    graph: ComputeGraph,
    plans: dict[int, GemmPlan],
    tile_count: int,
    row_tiles: dict[str, int] | None = None,
    tile_offsets: dict[str, int] | None = None,
    bodies: dict[str, Any] | None = None,
    hoist_padding: bool = True,
) -> LowProgram:
    """Lower every operation with its chosen plan (``hoist_padding``: loop bodies zero their
    GEMM operands' padding once, before the loop; see ``lower_gemm``'s ``prologue``).

    Args:
        graph: a verified graph.
        plans: the chosen plan of each operation, by operation id.
        tile_count: the number of tiles available.
        row_tiles: operations the plan puts in whole-row layouts, with their tile counts.
        tile_offsets: gemms whose tiles start at this tile (``place/balance.py``).
        bodies: the plan (a ``Finalist``) of each repeat's body, by operation name.

    Returns:
        The program over logical tiles, with host bindings for inputs, parameters, outputs.
    """
    with collector_paused():
        return _lower_program(
            graph, plans, tile_count, row_tiles, tile_offsets, bodies, hoist_padding
        )


def _lower_program(
    graph: ComputeGraph,
    plans: dict[int, GemmPlan],
    tile_count: int,
    row_tiles: dict[str, int] | None,
    tile_offsets: dict[str, int] | None,
    bodies: dict[str, Any] | None,
    hoist_padding: bool = True,
) -> LowProgram:
    graph.verify()
    builder = ProgramBuilder()
    host_shards: dict[int, list[Shard]] = defaultdict(list)
    value_shards: dict[int, list[Shard]] = {}
    ctx = OpLowering(graph, builder, tile_count, value_shards, host_shards)
    ctx.row_tiles.update(row_tiles or {})
    ctx.tile_offsets.update(tile_offsets or {})
    ctx.bodies.update(bodies or {})
    ctx.hoist_padding = hoist_padding
    estimates = lower_operations(ctx, plans)
    bindings = []
    for v in graph.values:
        if v.kind in ("host_input", "parameter"):
            if not graph.consumers(v.id) and v.id not in graph.outputs:
                continue
            if v.id in graph.outputs and v.id not in value_shards:
                raise GraphError(f"output {v.name!r} is a {v.kind} that no operation uses")
            bindings.append(
                Binding(
                    v.name, v.kind, v.dtype, v.shape, tuple(host_shards[v.id]), v.scale_exponent
                )
            )
    outputs = []
    for vid in graph.outputs:
        v = graph.value(vid)
        if vid not in value_shards:
            raise GraphError(f"output {v.name!r} is not computed by any operation")
        outputs.append(
            Binding(v.name, "output", v.dtype, v.shape, tuple(value_shards[vid]), v.scale_exponent)
        )
    # Buffers the host reads or writes stay live for the whole run.
    host_read = {(sh.tile, sh.ref.buffer) for b in outputs for sh in b.shards}
    host_written = {(sh.tile, sh.ref.buffer) for b in bindings for sh in b.shards}
    buffers = []
    for key, buf in builder.buffers.items():
        if key in host_read or key in host_written:
            written, read = (
                buf.host_written or key in host_written,
                buf.host_read or key in host_read,
            )
            buf = make_buffer(
                buf.tile, buf.name, buf.size, buf.alignment, buf.region, buf.exclusive_element,
                buf.avoid, written, read,
            )  # fmt: skip
        buffers.append(buf)
    # Elementwise rows that local copies would move are written where they are wanted.
    buffers, _ = write_in_place(builder.steps, buffers, bindings + outputs)
    # Multicasts among whole pairs that miss only the sender's partner: pairable (64-bit).
    split_for_pairs(builder.steps)
    used = max((b.tile for b in buffers), default=-1) + 1
    if used > tile_count:  # pragma: no cover - the planner never exceeds the budget
        raise AssertionError(f"program uses {used} tiles, budget {tile_count}")
    chosen = [plans[op.id] for op in graph.operations if op.kind == "gemm"]
    return LowProgram(
        tile_count=used,
        buffers=buffers,
        steps=builder.steps,
        bindings=bindings + outputs,
        estimated_cycles=sum(estimates.values()),
        estimated_exchange_cycles=sum(p.exchange_cycles for p in chosen),
        plans={op.name: plans[op.id].describe() for op in graph.operations if op.kind == "gemm"},
    )


def lower_operations(ctx: OpLowering, plans: dict[int, GemmPlan]) -> dict[str, int]:
    """Lower every operation of ``ctx.graph`` into ``ctx.builder``; returns per-op estimates."""
    graph, builder = ctx.graph, ctx.builder
    host_shards, value_shards = ctx.host_shards, ctx.value_shards
    estimates: dict[str, int] = {}
    groups = delivery_groups(graph, plans, ctx.tile_offsets)
    grouped = {op.id for members in groups.values() for op in members[1:]}
    for op in graph.operations:
        if op.id in grouped:
            continue  # lowered with its group's first member
        if op.kind == "gemm":
            members = groups.get(op.id, [op])
            subs = [(m.name, ProgramBuilder(buffers=builder.buffers)) for m in members]
            if len(members) == 1:
                subs = [(op.name, builder)]
            for m, (_, sub) in zip(members, subs, strict=True):
                precision = lookup_precision(graph.value(m.left).dtype)
                value_shards[m.output] = lower_gemm(
                    graph, m, plans[m.id], precision, sub, host_shards, value_shards,
                    ctx.tile_offsets.get(m.name, 0), ctx.tiles, bool(ctx.staged_homes),
                    ctx.delivered, ctx.prologue if ctx.staged_homes and ctx.hoist_padding else None,
                )  # fmt: skip
                for vid in m.inputs:  # host inputs this gemm delivered are homed there now
                    if graph.value(vid).kind == "host_input" and vid not in value_shards:
                        value_shards[vid] = list(host_shards[vid])
                estimates[m.name] = plans[m.id].estimated_cycles
            if len(members) > 1:
                merge_members(builder, subs)
        elif op.kind == "repeat":
            from ipu_stack.low.lower_repeat import lower_repeat

            value_shards[op.output], estimates[op.name] = lower_repeat(ctx, op)
        elif op.kind in LOWERINGS or op.kind in INDEXING_LOWERINGS:
            lowering = INDEXING_LOWERINGS.get(op.kind) or LOWERINGS[op.kind]
            value_shards[op.output] = lowering(ctx, op)
            estimates[op.name] = step_estimate(*ctx.costs[op.name])
        else:
            raise GraphError(f"{op.name}: operation kind {op.kind!r} cannot be lowered yet")
    return estimates


def step_estimate(
    before: list[KernelCall], transfers: list[LogicalTransfer], after: list[KernelCall]
) -> int:
    """Busiest-tile cycles of an operation's local work, exchange (endpoint words + sync)."""

    exchange = 0
    if transfers:
        words = np.array([t.words for t in transfers], dtype=np.int64)
        fan = np.array([len(t.destinations) for t in transfers], dtype=np.int64)
        sources = np.array([t.source_tile for t in transfers], dtype=np.int64)
        dests = np.array([d[0] for t in transfers for d in t.destinations], dtype=np.int64)
        sent = _tile_sums(sources, words)
        received = _tile_sums(dests, np.repeat(words, fan))
        exchange = EXCHANGE_PHASE_OVERHEAD + max(sent, received)
    return busiest_tile_cycles(before) + exchange + busiest_tile_cycles(after)


def _tile_sums(tiles: np.ndarray, words: np.ndarray) -> int:
    """The largest per-tile sum of ``words`` (integer sums, no float rounding)."""
    order = np.argsort(tiles, kind="stable")
    t, w = tiles[order], words[order]
    starts = np.flatnonzero(np.r_[True, t[1:] != t[:-1]])
    return int(np.add.reduceat(w, starts).max())

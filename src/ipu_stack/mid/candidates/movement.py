"""Data-movement candidates (view, transpose, slice) and attention."""

from __future__ import annotations

import numpy as np

from ipu_stack.graph.compute_graph import ComputeGraph, Operation
from ipu_stack.low.lower_ops import flat_shape
from ipu_stack.mid.candidates.base import Candidate, Footprint
from ipu_stack.mid.formats import Layout, TensorFormat, row_layout_format
from ipu_stack.target import ipu21
from ipu_stack.target.op_cycles import attention_cycles


def movement_candidates(
    graph: ComputeGraph, op: Operation, formats: dict[int, TensorFormat], tiles: int
) -> list[Candidate]:
    out, src = graph.value(op.output), graph.value(op.inputs[0])
    n, c = flat_shape(out.shape)
    src_fmt = formats.get(src.id)
    if op.kind == "view" and src_fmt is not None and src.shape[-1] == out.shape[-1]:
        fmt = TensorFormat(out.dtype, src_fmt.layout)  # same rows: a relabel
        return [
            Candidate(
                op.name,
                "movement",
                ("inherit",),
                (None,),
                fmt,
                0,
                0,
                Footprint(),
                src_fmt.layout.tile_group,
            )
        ]
    fmt = row_layout_format(out.dtype, n, c, tiles)
    words = fmt.shard_bytes() // 4
    exchange = ipu21.EXCHANGE_PHASE_OVERHEAD + words
    return [
        Candidate(
            op.name,
            "movement",
            ("rows", tiles),
            (None,),
            fmt,
            exchange,
            exchange,
            Footprint(fmt.shard_bytes(), 0, fmt.shard_bytes()),
            fmt.layout.tile_group,
            1,
        )
    ]


def attention_candidates(
    graph: ComputeGraph, op: Operation, formats: dict[int, TensorFormat], tiles: int
) -> list[Candidate]:
    del formats
    q, _, v = (graph.value(i) for i in op.inputs[:3])
    out = graph.value(op.output)
    tq, d = q.shape[-2:]
    tk, dv = v.shape[-2:]
    heads = int(np.prod(q.shape[:-2], dtype=np.int64)) if len(q.shape) > 2 else 1
    parts = max(1, min(tq, tiles // heads)) if heads <= tiles else 1
    qb = -(-tq // parts)
    per_tile = max(1, -(-heads * -(-tq // qb) // tiles))
    eb = ipu21.precision(q.dtype).element_bytes
    precision = ipu21.precision(q.dtype)
    compute = per_tile * (attention_cycles(qb, tk, d, dv, precision) + ipu21.KERNEL_LAUNCH_CYCLES)
    mask = per_tile * qb * tk * eb if len(op.inputs) == 4 else 0  # worst case: no broadcast
    words = (per_tile * (qb * d + tk * (d + dv)) * eb + mask) // 4
    exchange = ipu21.EXCHANGE_PHASE_OVERHEAD + words
    n, c = flat_shape(out.shape)
    fmt = row_layout_format(out.dtype, n, c, min(tiles, heads * -(-tq // qb)))
    fmt = TensorFormat(
        fmt.precision,
        Layout(fmt.layout.order, fmt.layout.tiling, 1, fmt.layout.tile_group, "any", heads),
    )
    staged = per_tile * (qb * d + tk * (d + dv) + qb * dv) * eb + mask
    return [
        Candidate(
            op.name,
            "attention",
            ("rows", tiles),
            tuple(None for _ in op.inputs),
            fmt,
            compute + exchange,
            exchange,
            Footprint(staged, 0, staged),
            fmt.layout.tile_group,
            1,
            heads,
        )
    ]

"""Elementwise and row-wise candidates: run in the anchor's format, or in whole rows."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ipu_stack.graph.compute_graph import ComputeGraph, Operation, Value
from ipu_stack.low.lower_ops import flat_shape
from ipu_stack.mid.candidates.base import Candidate, Footprint
from ipu_stack.mid.formats import TensorFormat, row_layout_format
from ipu_stack.target import ipu21
from ipu_stack.target.op_cycles import elementwise_cycles, gelu_cycles, row_kernel_cycles

ROW_WISE = ("layer_norm", "softmax", "reduce_mean")
STAGE_ALIGN = 8  # staged rows start on 64-bit boundaries (low/lower_ops.py: ROW_ALIGN)


def tile_choices(tiles: int, rows: int) -> list[int]:
    """A few tile counts for whole-row layouts: all tiles, and leaner groups."""
    counts = {min(tiles, rows), max(1, min(tiles, rows) // 4), max(1, min(tiles, rows) // 16)}
    return sorted(counts, reverse=True)


def kernel_cycles(
    op: Operation, rows: int, cols: int, in_dtype: str, out_dtype: str, in_cols: int = 0
) -> int:
    if op.kind == "reduce_mean":  # costed over its input row
        return elementwise_cycles(op.kind, rows * in_cols, 0, 0) + ipu21.KERNEL_LAUNCH_CYCLES
    if op.kind in ROW_WISE:
        return row_kernel_cycles(op.kind, rows, cols) + ipu21.KERNEL_LAUNCH_CYCLES
    n = rows * cols
    if op.kind == "gelu":  # the measured F16 tanh form is cheaper
        approximate = str(op.attr("approximate", "none"))
        return gelu_cycles(n, approximate, out_dtype) + ipu21.KERNEL_LAUNCH_CYCLES
    in_eb = ipu21.precision(in_dtype).element_bytes
    out_eb = ipu21.precision(out_dtype).element_bytes
    return elementwise_cycles(op.kind, n, n * in_eb, n * out_eb) + ipu21.KERNEL_LAUNCH_CYCLES


def staged_parameter_bytes(
    op: Operation, params: list[Value], out_shape: tuple[int, ...], rows: int, cols: int
) -> int:
    """Bytes per tile of the parameters staged beside an output block of ``rows`` x ``cols``
    (the host writes them there before the run, on every tile of the layout): one row of a
    parameter that every row reads (a bias, a layer norm's scale), else the block's rows."""
    total = 0
    out_c = out_shape[-1]
    for v in params:
        eb = ipu21.precision(v.dtype).element_bytes
        width = out_c if op.kind in ROW_WISE else cols if v.shape[-1] == out_c else 1
        lead = v.shape[:-1][-(len(out_shape) - 1) :] if len(out_shape) > 1 else ()
        one_row = op.kind in ROW_WISE or all(d == 1 for d in lead)
        stride = -(-width * eb // STAGE_ALIGN) * STAGE_ALIGN
        total += (1 if one_row else rows) * stride
    return total


def staged_twin(cand: Candidate, params: list[Value], tiles: int) -> Candidate:
    """``cand`` with its parameters gathered from a home each run instead of written by the
    host beside every use (``OpLowering.parameter_home``): the parameters are stored once,
    spread over the tiles, and every tile of the layout receives its staged copy (one more
    exchange phase unless the candidate has one)."""
    staged = cand.footprint.resident
    home = sum(
        int(np.prod(v.shape, dtype=np.int64)) * ipu21.precision(v.dtype).element_bytes
        for v in params
    )
    words = staged // ipu21.WORD_BYTES
    overhead = 0 if cand.exchange_phases else ipu21.EXCHANGE_PHASE_OVERHEAD
    fp = cand.footprint
    return replace(
        cand,
        choice=(*cand.choice, "staged"),
        cycles=cand.cycles + overhead + words,
        exchange_cycles=cand.exchange_cycles + overhead + words,
        footprint=replace(
            fp,
            standard=fp.standard + staged,
            max_standard_allocation=max(fp.max_standard_allocation, staged),
            resident=-(-home // max(1, min(tiles, cand.active_tiles))),
        ),
        exchange_phases=max(1, cand.exchange_phases),
    )


def pointwise_candidates(
    graph: ComputeGraph,
    op: Operation,
    formats: dict[int, TensorFormat],
    tiles: int,
    loop_body: bool = False,
) -> list[Candidate]:
    """Candidates of an elementwise or row-wise operation; in a loop body, each that keeps
    parameters beside its blocks also comes staged (:func:`staged_twin`)."""
    result = _candidates(graph, op, formats, tiles)
    params = [graph.value(v) for v in op.inputs if graph.value(v).kind == "parameter"]
    if loop_body and params:
        result += [staged_twin(c, params, tiles) for c in result if c.footprint.resident]
    return result


def _candidates(
    graph: ComputeGraph, op: Operation, formats: dict[int, TensorFormat], tiles: int
) -> list[Candidate]:
    out = graph.value(op.output)
    ins = [graph.value(i) for i in op.inputs]
    n, c = flat_shape(out.shape)
    anchor = ins[0] if op.kind == "cast" else next((v for v in ins if v.shape == out.shape), None)
    result = []
    anchor_fmt = formats.get(anchor.id) if anchor is not None else None
    row_wise = op.kind in ROW_WISE
    params = [v for v in ins if v.kind == "parameter"]
    if anchor_fmt is not None and not (row_wise and anchor_fmt.layout.tiling[1].partitions > 1):
        rows_t, cols_t = anchor_fmt.layout.tiling
        out_fmt = TensorFormat(out.dtype, anchor_fmt.layout)
        staged = 0
        for v in ins:
            if v is not anchor and v.kind != "parameter":
                staged += rows_t.block * cols_t.block * ipu21.precision(v.dtype).element_bytes
        exchange = (ipu21.EXCHANGE_PHASE_OVERHEAD + staged // 4) if staged else 0
        cycles = kernel_cycles(op, rows_t.block, cols_t.block, ins[0].dtype, out.dtype) + exchange
        hosted = staged_parameter_bytes(op, params, out.shape, rows_t.block, cols_t.block)
        result.append(
            Candidate(
                op.name,
                "pointwise",
                ("inherit",),
                tuple(None for _ in ins),
                out_fmt,
                cycles,
                exchange,
                Footprint(out_fmt.shard_bytes() + staged, 0, out_fmt.shard_bytes(), 0, hosted),
                anchor_fmt.layout.tile_group,
                1 if staged else 0,
            )
        )
    for t in tile_choices(tiles, n):
        fmt = row_layout_format(out.dtype, n, c, t)
        rows = fmt.layout.tiling[0].block
        needs: list[TensorFormat | None] = []
        words = 0
        for v in ins:
            reduced = op.kind == "reduce_mean"
            if v.kind == "parameter" or (v.shape != out.shape and not reduced):
                needs.append(None)
                continue
            layout = row_layout_format(v.dtype, n, v.shape[-1], t).layout if reduced else None
            need = TensorFormat(v.dtype, layout or fmt.layout)
            needs.append(need)
            if formats.get(v.id) != need and v.id in formats:
                words += need.shard_bytes() // 4
        exchange = (ipu21.EXCHANGE_PHASE_OVERHEAD + words) if words else 0
        cycles = kernel_cycles(op, rows, c, ins[0].dtype, out.dtype, ins[0].shape[-1])
        result.append(
            Candidate(
                op.name,
                "pointwise",
                ("rows", t),
                tuple(needs),
                fmt,
                cycles,
                0,
                Footprint(
                    fmt.shard_bytes() * (1 + len(ins)),
                    0,
                    fmt.shard_bytes(),
                    0,
                    staged_parameter_bytes(op, params, out.shape, rows, c),
                ),
                t,
            )
        )
    return result

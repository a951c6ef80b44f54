"""Candidates of the indexing operations (gather, concat, argmax) and of transposes.

The costs follow the lowerings in ``low/lower_indexing.py`` and ``low/lower_movement.py``:
kernel cycles from ``target/op_cycles.py``, exchange as one sync plus the busiest tile's
received words per phase (the same rule as the other non-GEMM candidates).
"""

from __future__ import annotations

from dataclasses import dataclass

from ipu_stack.errors import GraphError
from ipu_stack.graph.compute_graph import ComputeGraph, Operation
from ipu_stack.low.lower_ops import flat_shape
from ipu_stack.mid.candidates.base import Candidate, Footprint
from ipu_stack.mid.formats import AxisTiling, Layout, TensorFormat, row_layout_format
from ipu_stack.target import ipu21
from ipu_stack.target.op_cycles import (
    argmax_cycles,
    concat_cycles,
    elementwise_cycles,
    gather_rows_cycles,
    transpose_cycles,
)

#: bytes of table rows one tile may hold for a gather (a quarter of the data region)
GATHER_TABLE_BLOCK_BYTES = 128 * 1024
#: narrowest column block of a gather table in bytes (wider blocks keep downstream
#: rearrangements to few pieces per row)
GATHER_MIN_BLOCK_BYTES = 64


@dataclass(frozen=True, slots=True)
class GatherGrid:
    """Tiles of a gather: ``row_blocks`` x ``col_blocks``, tile (r, c) holds table rows
    ``r * rows_per_block ..`` and columns ``c * cols_per_block ..``."""

    row_blocks: int
    col_blocks: int
    rows_per_block: int
    cols_per_block: int

    @property
    def tiles(self) -> int:
        return self.row_blocks * self.col_blocks


def gather_grid(vocab: int, width: int, eb: int, tiles: int, what: str) -> GatherGrid:
    """The tile grid of a gather from a ``[vocab, width]`` table.

    Raises:
        GraphError: if the table does not fit on ``tiles`` tiles.
    """
    unit = max(1, ipu21.WORD_BYTES // eb)  # column blocks start on 32-bit words
    w = max(unit, -(-GATHER_MIN_BLOCK_BYTES // eb))
    w = min(-(-width // unit) * unit, -(-w // unit) * unit)
    cols = -(-width // w)
    rows = max(1, -(-vocab * w * eb // GATHER_TABLE_BLOCK_BYTES))
    while rows * cols > tiles and w < width:  # fewer, wider column blocks
        w = min(-(-width // unit) * unit, 2 * w)
        cols = -(-width // w)
        rows = max(1, -(-vocab * w * eb // GATHER_TABLE_BLOCK_BYTES))
    if rows * cols > tiles:
        raise GraphError(
            f"{what}: a [{vocab}, {width}] table needs {rows * cols} tiles of at most "
            f"{GATHER_TABLE_BLOCK_BYTES} bytes, only {tiles} are available"
        )
    per = -(-vocab // rows)
    return GatherGrid(-(-vocab // per), cols, per, w)


def _phase(words: int) -> int:
    return ipu21.EXCHANGE_PHASE_OVERHEAD + words if words else 0


def gather_candidates(graph: ComputeGraph, op: Operation, tiles: int) -> list[Candidate]:
    table, ids = graph.value(op.inputs[0]), graph.value(op.inputs[1])
    out = graph.value(op.output)
    eb = ipu21.precision(table.dtype).element_bytes
    vocab, width = table.shape
    grid = gather_grid(vocab, width, eb, tiles, op.name)
    n = ids.size
    partial = n * grid.cols_per_block * eb
    cycles = gather_rows_cycles(n, partial) + ipu21.KERNEL_LAUNCH_CYCLES
    exchange = _phase(n)  # every table tile receives all ids
    if table.kind != "parameter":
        exchange += _phase(grid.rows_per_block * grid.cols_per_block * eb // 4)
    block = -(-n // grid.row_blocks)
    if grid.row_blocks > 1:  # reduce-scatter of the masked partials within a column
        received = (grid.row_blocks - 1) * block * grid.cols_per_block * eb
        exchange += _phase(received // 4)
        cycles += elementwise_cycles("add", grid.row_blocks * block * grid.cols_per_block)
    tiling = (
        AxisTiling(grid.row_blocks, block),
        AxisTiling(grid.col_blocks, grid.cols_per_block),
    )
    fmt = TensorFormat(out.dtype, Layout("row_major", tiling, 1, grid.tiles))
    table_bytes = grid.rows_per_block * grid.cols_per_block * eb
    own = table_bytes + 4 * n + 2 * partial
    return [
        Candidate(
            op.name,
            "gather",
            ("grid", grid.row_blocks, grid.col_blocks),
            (None, None),
            fmt,
            cycles + exchange,
            exchange,
            # a parameter table's block is written by the host on each table tile
            Footprint(
                own,
                0,
                max(table_bytes, partial),
                0,
                table_bytes if table.kind == "parameter" else 0,
            ),
            grid.tiles,
            2 + (grid.row_blocks > 1),
        )
    ]


def _row_candidate(
    op: Operation, fmt: TensorFormat, tiles: int, cycles: int, words: int, staged: int
) -> Candidate:
    exchange = _phase(words)
    return Candidate(
        op.name,
        "indexing",
        ("rows", tiles),
        tuple(None for _ in op.inputs),
        fmt,
        cycles + exchange,
        exchange,
        Footprint(fmt.shard_bytes() + staged, 0, max(fmt.shard_bytes(), staged)),
        fmt.layout.tile_group,
        1 if words else 0,
    )


def concat_candidates(graph: ComputeGraph, op: Operation, tiles: int) -> list[Candidate]:
    out = graph.value(op.output)
    n, c = flat_shape(out.shape)
    fmt = row_layout_format(out.dtype, n, c, tiles)
    rows = fmt.layout.tiling[0].block
    eb = ipu21.precision(out.dtype).element_bytes
    words = rows * c * eb // 4
    if op.attr("axis") != len(out.shape) - 1:  # whole rows straight into the output
        return [_row_candidate(op, fmt, tiles, 0, words, 0)]
    widths = [graph.value(i).shape[-1] for i in op.inputs]
    kernel = concat_cycles([rows * w * eb for w in widths]) + ipu21.KERNEL_LAUNCH_CYCLES
    return [_row_candidate(op, fmt, tiles, kernel, words, rows * c * eb)]


def argmax_candidates(graph: ComputeGraph, op: Operation, tiles: int) -> list[Candidate]:
    src, out = graph.value(op.inputs[0]), graph.value(op.output)
    n, c = flat_shape(src.shape)
    fmt = row_layout_format(out.dtype, n, 1, tiles)
    rows = fmt.layout.tiling[0].block
    eb = ipu21.precision(src.dtype).element_bytes
    kernel = argmax_cycles(rows * c) + ipu21.KERNEL_LAUNCH_CYCLES
    return [_row_candidate(op, fmt, tiles, kernel, rows * c * eb // 4, rows * c * eb)]


def transpose_steps(perm: tuple[int, ...]) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
    """A transpose that moves the last axis as row move -> last-two swap -> row move.

    Returns the first row move's permutation (``None`` when it is the identity) and the
    second one (applied to the swapped value; the identity when not needed).
    """
    rank = len(perm)
    a = perm[-1]
    lead = [p for p in perm if p not in (a, rank - 1)]
    first = (*lead, a, rank - 1)
    swapped = (*lead, rank - 1, a)
    second = tuple(swapped.index(p) for p in perm)
    return (None if first == tuple(range(rank)) else first), second


def transpose_candidates(
    graph: ComputeGraph, op: Operation, formats: dict[int, TensorFormat], tiles: int
) -> list[Candidate]:
    src, out = graph.value(op.inputs[0]), graph.value(op.output)
    perm = op.attr("perm")
    rank = len(perm)
    n, c = flat_shape(out.shape)
    eb = ipu21.precision(out.dtype).element_bytes
    fmt = row_layout_format(out.dtype, n, c, tiles)
    row_words = fmt.layout.tiling[0].block * c * eb // 4
    if perm[-1] == rank - 1:  # rows move, the last axis stays
        return [_row_candidate(op, fmt, tiles, 0, row_words, 0)]
    first, second = transpose_steps(perm)
    src_fmt = formats.get(src.id)
    words = 0
    if first is None and src_fmt is not None:  # transposed where the producer holds it
        rows_t, cols_t = src_fmt.layout.tiling
        block = rows_t.block * cols_t.block
    else:  # re-tiled into matrix-aligned row chunks first
        block = -(-src.size // tiles)
        words += ipu21.EXCHANGE_PHASE_OVERHEAD + block * eb // 4
    kernel = transpose_cycles(block) + ipu21.KERNEL_LAUNCH_CYCLES
    if second != tuple(range(rank)):
        words += ipu21.EXCHANGE_PHASE_OVERHEAD + row_words
    staged = block * eb
    return [_row_candidate(op, fmt, tiles, kernel, words, staged)]


INDEXING_CANDIDATES = {
    "gather": gather_candidates,
    "concat": concat_candidates,
    "argmax": argmax_candidates,
}

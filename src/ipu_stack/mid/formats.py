"""Tensor formats: how a value is laid out over the tiles.

A format is a value (hashable, comparable, printable): precision + layout. A layout is an
element order, a tiling per axis of the value's flat-row view ``[N, C]`` (partitions, block,
padding multiple, what to do with padding), replication, the tile-group size and the memory
class. Two consumers agree with a producer exactly when the formats are equal; otherwise a
conversion (rearrange, or cast for precision) sits between them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ipu_stack.target.ipu21 import precision as lookup_precision

ORDERS = ("row_major", "amp_left", "amp_right", "amp_output", "block_major")


@dataclass(frozen=True, slots=True, order=True)
class AxisTiling:
    """How one axis is cut: ``partitions`` blocks of ``block`` elements (the last shorter)."""

    partitions: int
    block: int
    pad_multiple: int = 1  # storage extent of a block rounds up to this
    padding: str = "zero"  # zero (pad with zeros) | reject (extent must divide)

    def __str__(self) -> str:
        pad = f"/{self.pad_multiple}" if self.pad_multiple > 1 else ""
        return f"{self.partitions}x{self.block}{pad}"


@dataclass(frozen=True, slots=True, order=True)
class Layout:
    order: str
    tiling: tuple[AxisTiling, AxisTiling]  # rows (N), columns (C) of the flat-row view
    replication: int = 1
    tile_group: int = 1
    memory: str = "any"  # standard | interleaved | any
    padding_groups: int = 1  # independently padded groups along rows (e.g. attention heads)

    def __str__(self) -> str:
        rows, cols = self.tiling
        rep = f" rep{self.replication}" if self.replication > 1 else ""
        return f"{self.order}[{rows},{cols}]{rep} tiles={self.tile_group} {self.memory}"


@dataclass(frozen=True, slots=True, order=True)
class TensorFormat:
    precision: str
    layout: Layout

    def __str__(self) -> str:
        return f"{self.precision}:{self.layout}"

    def shard_bytes(self) -> int:
        """Bytes of the largest shard on one tile (padded storage)."""
        rows, cols = self.layout.tiling
        eb = lookup_precision(self.precision).element_bytes
        width = -(-cols.block // cols.pad_multiple) * cols.pad_multiple
        return rows.block * width * eb


def row_layout_format(dtype: str, n: int, c: int, tiles: int) -> TensorFormat:
    """Whole rows spread evenly over ``tiles`` tiles (the default of non-GEMM operations)."""
    used = min(tiles, n)
    block = -(-n // used)
    parts = -(-n // block)
    eb = lookup_precision(dtype).element_bytes
    pad = max(1, 8 // eb)
    return TensorFormat(
        dtype,
        Layout("row_major", (AxisTiling(parts, block), AxisTiling(1, c, pad)), 1, parts),
    )

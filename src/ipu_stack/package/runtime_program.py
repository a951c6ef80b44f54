"""``compile_runtime``: the per-tile program the package's supervisor code would run.

Each tile gets an ordered list of entries: exchange phases (a sync, then the tile's part of
the schedule), kernel calls by entry symbol with absolute operand addresses and scalar
arguments, local copies, fills, and loop brackets. Tiles a step does not involve still see
every exchange phase (they take part in the sync). Each tile's support layout, runtime state,
exchange tables and code, must fit the space the allocator reserved for it (facts §4.4/§4.5).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ipu_stack.exchange.model import ExchangePhase, PhaseSchedule
from ipu_stack.kernels import registry
from ipu_stack.low.program import (
    AddCall,
    ComputeStep,
    CopyCall,
    ExchangeStep,
    FillCall,
    GemmCall,
    KernelCall,
    LowProgram,
    MapCall,
    RepeatStep,
    View,
)
from ipu_stack.place.assign import Placement
from ipu_stack.target import ipu21


@dataclass(slots=True)
class TileProgram:
    tile: int  # physical tile id
    entries: list[tuple[Any, ...]] = field(default_factory=list)
    exchange_chunks: int = 0
    phases: int = 0

    @property
    def exchange_row_bytes(self) -> int:
        return 4 * (self.phases + self.exchange_chunks * ipu21.EXCHANGE_ROW_WORDS_PER_CHUNK)

    @property
    def code_bytes(self) -> int:
        return ipu21.CODE_BYTES_PER_ENTRY * len(self.entries)


def _gemm_symbols(calls: list[GemmCall]) -> dict[tuple[str, str, int, int, int], str]:
    """Entry symbol of every GEMM specialisation (rows paired small/large as plan_kernels)."""
    rows: dict[tuple[str, str, int, int], set[int]] = defaultdict(set)
    for call in calls:
        rows[(call.precision.name, call.weights, call.k, call.c)].add(call.rows)
    out = {}
    for (prec, weights, k, c), counts in rows.items():
        spec = registry.gemm_kernel(prec, weights)
        ordered = sorted(counts)
        for i in range(0, len(ordered), 2):
            pair = ordered[i : i + 2]
            symbols = spec.variant(k, c, pair).entry_symbols
            for size, r in zip(("small", "large"), pair, strict=False):
                out[(prec, weights, k, c, r)] = symbols.get(f"init_{size}", "")
    return out


def _address(placement: Placement, tile: int, ref: Any) -> int:
    ref = ref.ref if isinstance(ref, View) else ref
    return placement.address(tile, ref)


def _entry(call: KernelCall, placement: Placement, symbols: dict) -> tuple[Any, ...]:
    t = call.tile
    if isinstance(call, GemmCall):
        symbol = symbols[(call.precision.name, call.weights, call.k, call.c, call.rows)]
        if call.accumulate:
            symbol = symbol.replace("_init_", "_accumulate_")
        return (
            "call",
            symbol,
            _address(placement, t, call.out),
            _address(placement, t, call.left),
            _address(placement, t, call.right),
            call.rows,
            call.k,
            call.c,
        )
    if isinstance(call, AddCall):
        return (
            "call",
            f"ipu_stack_add_{call.precision.name}",
            _address(placement, t, call.out),
            *(_address(placement, t, r) for r in call.inputs),
            call.elements,
        )
    if isinstance(call, MapCall):
        return (
            "call",
            f"ipu_stack_{call.kind}_{call.out.dtype}",
            _address(placement, t, call.out),
            *(_address(placement, t, v) for v in call.inputs),
            call.out.rows,
            call.out.cols,
        )
    if isinstance(call, CopyCall) and call.rows > 1:
        return (
            "copy2d",
            _address(placement, t, call.dst),
            _address(placement, t, call.src),
            call.size,
            call.rows,
            call.dst_stride,
            call.src_stride,
        )
    if isinstance(call, CopyCall):
        return (
            "copy",
            _address(placement, t, call.dst),
            _address(placement, t, call.src),
            call.size,
        )
    assert isinstance(call, FillCall)
    return ("fill", _address(placement, t, call.dst), call.size)


def compile_runtime(
    program: LowProgram,
    placement: Placement,
    schedules: dict[int, tuple[ExchangePhase, PhaseSchedule]],
) -> list[TileProgram]:
    """The per-tile programs of a placed, scheduled program (see :func:`support_overflow`)."""
    physical = placement.physical
    tiles = [TileProgram(int(physical[t])) for t in range(program.tile_count)]
    gemms = [
        c
        for s in program.steps
        if isinstance(s, ComputeStep)
        for c in s.calls
        if isinstance(c, GemmCall)
    ]
    symbols = _gemm_symbols(gemms)
    for index, step in enumerate(program.steps):
        if isinstance(step, RepeatStep):
            for tp in tiles:
                tp.entries.append(("repeat", step.count, step.length))
        elif isinstance(step, ComputeStep):
            for call in step.calls:
                tiles[call.tile].entries.append(_entry(call, placement, symbols))
        elif isinstance(step, ExchangeStep):
            _, schedule = schedules[index]
            for tp in tiles:
                tp.entries.append(("exchange", index))
                tp.phases += 1
            for t, pieces in zip(step.transfers, schedule.pieces, strict=True):
                tiles[t.source_tile].exchange_chunks += len(pieces)
                for tile, _ in t.destinations:
                    tiles[tile].exchange_chunks += len(pieces)
    return tiles


def support_overflow(
    tiles: list[TileProgram], reservation: int = ipu21.DEFAULT_SUPPORT_RESERVATION_BYTES
) -> tuple[TileProgram, int] | None:
    """The tile whose estimated exchange tables and code most exceed the support reservation
    (facts §4.4: 3 x 16 KiB by default), with the excess in bytes; None when all fit."""
    worst = max(tiles, key=lambda t: t.exchange_row_bytes + t.code_bytes, default=None)
    if worst is None:
        return None
    excess = worst.exchange_row_bytes + worst.code_bytes - reservation
    return (worst, excess) if excess > 0 else None


def describe(tiles: list[TileProgram]) -> dict[str, int]:
    """Summary figures for the trace."""
    return {
        "tiles": len(tiles),
        "maximum_entries": max((len(t.entries) for t in tiles), default=0),
        "maximum_exchange_row_bytes": max((t.exchange_row_bytes for t in tiles), default=0),
        "maximum_code_bytes": max((t.code_bytes for t in tiles), default=0),
    }

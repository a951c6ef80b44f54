"""The plain summary ``ipu-stack compile`` ends with (the trace is behind ``--verbose``)."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

from ipu_stack.low.program import ComputeStep, CopyCall, FillCall, MapCall
from ipu_stack.target import ipu21


def process_seconds() -> float | None:
    """Wall seconds since this process started (Linux ``/proc``), imports included."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _operation_tiles(program: Any) -> dict[str, tuple[set[int], set[str]]]:
    """Per operation (buffer-name prefix): the tiles its calls run on and the call kinds."""
    out: dict[str, tuple[set[int], set[str]]] = defaultdict(lambda: (set(), set()))
    for step in program.steps:
        if not isinstance(step, ComputeStep):
            continue
        for call in step.calls:
            if isinstance(call, MapCall):
                buffer, kind = call.out.ref.buffer, call.kind
            elif isinstance(call, CopyCall | FillCall):
                buffer, kind = call.dst.buffer, type(call).__name__[:-4].lower()
            else:
                buffer, kind = call.out.buffer, type(call).__name__[:-4].lower()
            tiles, kinds = out[buffer.rsplit(".", 1)[0]]
            tiles.add(call.tile)
            kinds.add(kind)
    return out


def _plan_line(name: str, plan: dict[str, Any]) -> str:
    g, b = plan["grid"], plan["block"]
    return (
        f"{name}: gemm on {plan['active_tiles']:,} tiles, grid {g['batch']}x{g['rows']}x"
        f"{g['cols']}x{g['k']} (batch x rows x cols x K), block {b['rows']}x{b['cols']}x{b['k']}"
        f", left {plan['left']}, right {plan['right']}, weights {plan['weights']}, "
        f"{plan['estimated_cycles']:,} est. cycles"
    )


def compile_summary(
    model: str, built: Any, package: Any, path: str, size: int, wall: float, tiles: int
) -> list[str]:
    """Lines of the summary: model, tiles, plan per operation, cycles, memory, size, times."""
    graph, program = built.graph, built.program
    kinds: dict[str, int] = defaultdict(int)
    for op in graph.operations:
        kinds[op.kind] += 1
    ops = ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(kinds.items()))
    lines = [f"model {model}: {len(graph.operations)} operations ({ops})"]
    lines.append(f"tiles: {len(package.tiles):,} used of the {tiles:,} allowed "
                 f"({ipu21.TILES:,} on the IPU21)")  # fmt: skip
    lines.append("plan:")
    plans = program.plans
    runs = _operation_tiles(program)
    for op in graph.operations:
        plan = plans.get(op.name) if op.kind == "gemm" else None
        if plan and "grid" in plan:
            lines.append("  " + _plan_line(op.name, plan))
            continue
        mine = [v for k, v in runs.items() if k == op.name or k.startswith(op.name + "/")]
        used: set[int] = set().union(*(t for t, _ in mine)) if mine else set()
        calls = sorted(set().union(*(c for _, c in mine))) if mine else []
        where = (f"on {len(used):,} tiles ({', '.join(calls)} calls)" if used
                 else "no calls of its own (fused into a neighbour, or a view)")  # fmt: skip
        lines.append(f"  {op.name}: {op.kind} {where}")
    est, xch = program.estimated_cycles, program.estimated_exchange_cycles
    lines.append(f"estimated: {est:,} cycles = {est / ipu21.CLOCK_HZ * 1e6:.3f} us at "
                 f"{ipu21.CLOCK_HZ / 1e9:g} GHz (exchange {xch:,} cycles; modelled, "
                 "before simulation)")  # fmt: skip
    peaks = built.placement.peaks
    lines.append(f"peak memory per tile: standard {peaks['standard_peak_bytes']:,} B, "
                 f"interleaved {peaks['interleaved_peak_bytes']:,} B (largest standard "
                 f"allocation {peaks['largest_standard_bytes']:,} B)")  # fmt: skip
    m = package.manifest
    steps = m["program"]["steps"]
    lines.append(f"package {path}: {size:,} bytes ({m['sections']['weights']['size']:,} weight "
                 f"bytes), {sum(s['kind'] == 'compute' for s in steps)} compute + "
                 f"{sum(s['kind'] == 'exchange' for s in steps)} exchange steps")  # fmt: skip
    phases = ", ".join(f"{p['name']} {p['elapsed_ms'] / 1000:.1f} s" for p in built.trace.phases)
    whole = process_seconds()
    since = f"whole command {whole:.1f} s wall, with start-up" if whole else f"{wall:.1f} s wall"
    lines.append(f"time: {phases}; {since}")
    return lines

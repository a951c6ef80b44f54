"""``kernel-run`` of the F32 GEMM units (``gemm_f32[_interleaved]_kK_cC_rS_rL``).

The unit's entries run on the emulator over seeded random f32 operands at ABI addresses (left
in the standard region, right in its weight region, output interleaved) and are compared with
the registry's ``semantics.gemm_f32``. F32 tolerance, 1e-6 relative, is taken relative to the
magnitude the dot product sums, ``|left| @ |right| (+ |prior|)`` per output element: the
device adds the K products in order while NumPy's matmul may block or fuse them, and both are
within a few f32 ulp of that magnitude (an element that cancels to near zero has no
meaningful relative error of its own).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.isa import Tile
from ipu_stack.kernels import registry
from ipu_stack.target import ipu21

F32_TOLERANCE = 1e-6


def run_gemm_f32(
    program: Any, variant: registry.GemmVariant, rng: np.random.Generator, placer: Any
) -> list[dict[str, Any]]:
    """Every entry of an F32 GEMM unit on the emulator vs ``semantics.gemm_f32``."""
    from ipu_stack.kernels.kernel_run import STACK_TOP

    spec = variant.spec
    k, c = variant.k, variant.c
    out = []
    for key, symbol in variant.entry_symbols.items():
        phase, size = key.split("_")
        rows = variant.small_rows if size == "small" else variant.large_rows
        accumulate = phase == "accumulate"
        left = rng.uniform(-1, 1, (rows, k)).astype(np.float32)
        right = rng.uniform(-1, 1, (k, c)).astype(np.float32)
        prior = rng.uniform(-1, 1, (rows, c)).astype(np.float32)
        p = placer()
        left_at = p.take("standard", left.nbytes)
        right_at = p.take(spec.operand("right").region, right.nbytes)
        out_at = p.take("interleaved", prior.nbytes)
        modelled = (spec.cycles(rows, k, c) if spec.cycles else 0) + ipu21.KERNEL_LAUNCH_CYCLES
        tile = Tile(program)
        tile.max_cycles = 100_000 + 40 * rows * k * c  # a runaway loop is a fault
        tile.mem.write(left_at, left.view(np.uint8).reshape(-1), 8)
        tile.mem.write(right_at, right.view(np.uint8).reshape(-1), 8)
        for end in (left_at + left.nbytes, right_at + right.nbytes):  # over-reads show
            tile.mem.write(end, rng.uniform(-1, 1, 64).astype(np.float32).view(np.uint8), 8)
        tile.mem.write(out_at, prior.view(np.uint8).reshape(-1), 8)
        before = tile.mem.data.copy()
        result = tile.call(symbol, {2: out_at, 3: left_at, 4: right_at, 11: STACK_TOP})
        stray = stray_writes(tile, before, [(out_at, prior.nbytes)])
        got = tile.mem.read(out_at, prior.nbytes, 8).view(np.float32).reshape(rows, c)
        assert spec.reference is not None
        want = spec.reference(left[None], right[None], prior[None], accumulate)[0]
        bound = np.abs(left.astype(np.float64)) @ np.abs(right.astype(np.float64))
        if accumulate:
            bound += np.abs(prior.astype(np.float64))
        err = np.abs(got.astype(np.float64) - want.astype(np.float64))
        worst = float(np.nanmax(err / np.maximum(bound, 1e-30))) if err.size else 0.0
        ok = bool(np.isfinite(got).all() and worst <= F32_TOLERANCE and not stray)
        out.append({
            "entry": symbol, "rows": rows, "accumulate": accumulate,
            "max_abs_error": float(np.nanmax(err)) if err.size else 0.0,
            "worst_relative": worst, "ok": ok, "emulated_cycles": result.cycles,
            "modelled_cycles": int(modelled),
            **({"stray_writes": stray} if stray else {}),
        })  # fmt: skip
    return out


def stray_writes(tile: Tile, before: np.ndarray, allowed: list[tuple[int, int]]) -> str:
    """Where the call wrote memory outside ``allowed`` (address, bytes) spans and its stack
    frames (the 4 KiB below the stack top); empty when it did not."""
    from ipu_stack.kernels.kernel_run import STACK_TOP

    changed = before != tile.mem.data
    base = tile.mem.base
    for at, size in [*allowed, (STACK_TOP - 0x1000, 0x1000)]:
        changed[at - base : at - base + size] = False
    if not changed.any():
        return ""
    first = int(np.flatnonzero(changed)[0]) + base
    return f"{int(changed.sum())} bytes written outside the outputs, the first at {first:#x}"

"""Calibrated cycle formulas of the IPU21 AMP GEMM kernel on one tile.

Sources: `shared/docs/ipu21-facts.md` §13.2 (formulas of the reference implementation, [T])
and §13.3 (measured validation points on a C600, [T]). The F32 form is our inference [I]:
`f32sisov2amp` runs 16 MAC/cycle (facts §3) on K8 x C16 panels (facts §15.1), and a K8 x C16
F32 panel has the same 512 bytes of coefficients as a K16 x C16 F16 panel, so it keeps the
same per-panel weight-load overhead while its row term doubles. F8 "halves K" (facts §13.2,
SEPT): a K32 x C16 panel at 128 MAC/cycle costs what a K16 x C16 F16 panel costs.

Callers reach these formulas through :mod:`ipu_stack.kernels.registry` (each GEMM kernel's
``cycles`` and ``cycles_array``), so the simulator and the planner share one definition.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.target.ipu21 import F16, WORKERS, Precision

CALL_OVERHEAD_CYCLES = 294  # facts §13.2: supervisor set-up per kernel call [T]
PANEL_OVERHEAD_CYCLES = 160  # facts §13.2: weight load + pipeline per K x C16 panel [T]
ROW_CYCLES_PER_PANEL = 4  # facts §13.2: 4 tile cycles per row per F16 panel [T]
PACKED_CALL_OVERHEAD_CYCLES = 342  # facts §13.2 packed output [T]
PACKED_ROW_CYCLES = 24  # per row per worker per panel [T]
PACKED_CHUNK_CYCLES = 184  # per 16-row panel crossing [T]
PACKED_PANEL_CYCLES = {"interleaved": 170, "standard": 202}  # [T]
STANDARD_WEIGHT_PANEL_GROUP = 1063  # facts §13.2 standard weights G [T]


#: Measured F16 GEMM kernel cycles on a C600 (facts §13.3 [T]):
#: (kernel, rows, K, C, weight class, cycles); "packed" rows use the packed-output kernel.
MEASURED_POINTS: tuple[tuple[str, int, int, int, str, int], ...] = (
    ("interleaved", 244, 64, 64, "interleaved", 18_576),
    ("interleaved", 82, 96, 160, "interleaved", 29_508),
    ("interleaved", 122, 80, 128, "interleaved", 26_232),
    ("interleaved", 81, 80, 80, "interleaved", 12_402),
    ("interleaved", 146, 48, 48, "interleaved", 7_122),
    ("interleaved", 56, 64, 80, "interleaved", 8_076),
    ("packed", 48, 240, 64, "standard", 35_022),
    ("packed", 48, 240, 64, "interleaved", 33_102),
    ("packed", 96, 64, 64, "interleaved", 12_108),
    ("packed", 128, 64, 64, "interleaved", 19_872),
)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def panels(k: int, c: int, precision: Precision = F16) -> int:
    """Number of coefficient-store panels (K micro x C micro) covering a K x C block."""
    return _ceil_div(k, precision.k_micro) * _ceil_div(c, precision.c_micro)


def gemm_kernel_cycles(
    rows: int, k: int, c: int, precision: Precision = F16, weights: str = "interleaved"
) -> int:
    """Cycles of one GEMM kernel call computing a rows x c block over an inner extent k.

    Args:
        rows: rows of the left operand (and output) on the tile.
        k: inner extent (padded to the precision's K micro block by the kernel).
        c: output columns (padded to 16).
        precision: the AMP precision.
        weights: "interleaved" (ld128putcs weight feed) or "standard" (ld64putcs).

    Returns:
        Tile cycles of the call, supervisor set-up included.
    """
    if rows <= 0 or k <= 0 or c <= 0:
        return 0
    # F16 moves 4 rows' worth of K16 x C16 MACs per 4 cycles; slower precisions scale up.
    rate_ratio = (precision.k_micro * precision.c_micro) // precision.amp_macs_per_cycle
    row_cycles = rows * ROW_CYCLES_PER_PANEL * rate_ratio // 4
    if weights == "interleaved":
        return CALL_OVERHEAD_CYCLES + panels(k, c, precision) * (row_cycles + PANEL_OVERHEAD_CYCLES)
    # Standard weights: ld64putcs halves the weight-feed rate; the reference charges
    # ceil(ceil(C/16) * 1063 / 4) per K panel for it (facts §13.2, standard weights).
    k_panels = _ceil_div(k, precision.k_micro)
    c_groups = _ceil_div(c, precision.c_micro)
    return CALL_OVERHEAD_CYCLES + k_panels * (
        _ceil_div(c * row_cycles, precision.c_micro)
        + _ceil_div(c_groups * STANDARD_WEIGHT_PANEL_GROUP, 4)
    )


def worker_rows(rows: int, workers: int = WORKERS) -> list[tuple[int, int]]:
    """Split rows over the workers: rows/workers each, the remainder to the first workers."""
    base, extra = divmod(rows, workers)
    spans, start = [], 0
    for w in range(workers):
        count = base + (1 if w < extra else 0)
        spans.append((start, count))
        start += count
    return spans


def packed_gemm_kernel_cycles(
    rows: int, k: int, c: int, precision: Precision = F16, weights: str = "interleaved"
) -> int:
    """Cycles of the packed-output GEMM kernel (facts §13.2 "Packed output").

    Each worker's cost is 24 cycles per row plus 184 per 16-row output panel its rows touch;
    the slowest worker sets the pace of every panel.
    """
    if rows <= 0 or k <= 0 or c <= 0:
        return 0
    slowest = 0
    for start, count in worker_rows(rows):
        if count == 0:
            continue
        chunks = (start + count - 1) // 16 - start // 16 + 1
        slowest = max(slowest, PACKED_ROW_CYCLES * count + PACKED_CHUNK_CYCLES * chunks)
    return PACKED_CALL_OVERHEAD_CYCLES + panels(k, c, precision) * (
        slowest + PACKED_PANEL_CYCLES[weights]
    )


def gemm_kernel_cycles_array(
    rows: np.ndarray, k: np.ndarray, c: np.ndarray, precision: Precision, weights: str
) -> np.ndarray:
    """Vectorised :func:`gemm_kernel_cycles` over arrays of shapes (same formula).

    ``weights`` is ``"interleaved"`` or ``"standard"``; callers choose per element with
    ``np.where`` (see :func:`ipu_stack.kernels.registry.gemm_cycles_array`).
    """
    rows, k, c = (np.asarray(x, dtype=np.int64) for x in (rows, k, c))
    rate_ratio = (precision.k_micro * precision.c_micro) // precision.amp_macs_per_cycle
    row_cycles = rows * ROW_CYCLES_PER_PANEL * rate_ratio // 4
    k_panels = -(-k // precision.k_micro)
    c_groups = -(-c // precision.c_micro)
    if weights == "interleaved":
        out = CALL_OVERHEAD_CYCLES + k_panels * c_groups * (row_cycles + PANEL_OVERHEAD_CYCLES)
    else:
        out = CALL_OVERHEAD_CYCLES + k_panels * (
            -(-(c * row_cycles) // precision.c_micro)
            + -(-(c_groups * STANDARD_WEIGHT_PANEL_GROUP) // 4)
        )
    return np.where((rows > 0) & (k > 0) & (c > 0), out, 0)

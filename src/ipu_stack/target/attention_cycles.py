"""Cycle model of the flash-attention tile kernel, from the calls it is specified to issue.

The attention kernel has no device code of its own yet (registry status ``required``), and
no emulated or measured point exists for it. Its cost is therefore that of the documented call
sequence it runs on one tile (reference-system §2.3, "Flash": 4 kernel launches per 64-key
block), each call costed by a calibrated formula of this package, not by the AMP peak rate:

1. ``S = Q K^T`` for the block: one call of the AMP GEMM template (``templates/gemm_amp.S``)
   with rows = query rows, K = head dim, C = the block's keys; cycles from the kernel
   registry's interleaved GEMM unit, i.e. the calibrated GEMM formula of ``target/``
   (facts §13.2, checked against the measured points of §13.3). Products in the operand
   precision (F16), partials F16.
2. The block's softmax statistics in F32 (running max, exponentials, running sum): the
   measured segmented-softmax rate of facts §14.1 (5,232 cycles for 729 keys of one row) per
   score element.
3. ``O = O * rescale + P V``: the rescale of the running output is one multiply call
   (facts §14.1 add/mul rate: ``ADD_FIXED_CYCLES + ADD_CYCLES_PER_ELEMENT`` per element) and
   ``P V`` one GEMM template call with rows = query rows, K = the block's keys, C = value dim.
4. 4 launches per block (``KERNEL_LAUNCH_CYCLES`` each, reference-system §2.3), once per tile
   the transpose of the tile's keys into the GEMM's right-operand layout (a local copy at
   8 B/cycle plus the copy call, facts §12.1), and the final ``O / l`` (one multiply call).

These are modelled cycles of a call sequence, not emulated cycles of device code.
"""

from __future__ import annotations

from ipu_stack.target import ipu21
from ipu_stack.target.ipu21 import Precision

KEY_BLOCK = 64  # keys per block (reference-system §2.3)
LAUNCHES_PER_BLOCK = 4  # QK^T, statistics, rescale, PV (reference-system §2.3)
# facts §14.1: segmented softmax over 729 keys of one row takes 5,232 cycles.
SOFTMAX_STAT_CYCLES_PER_SCORE = 5232 / 729


def _multiply_call_cycles(elements: int) -> int:
    return int(ipu21.ADD_FIXED_CYCLES + ipu21.ADD_CYCLES_PER_ELEMENT * elements + 0.999)


def flash_attention_breakdown(
    q_rows: int, k_rows: int, d: int, dv: int, precision: Precision
) -> dict[str, int]:
    """Cycles of each part of one tile's attention call (see the module docstring)."""
    if q_rows <= 0 or k_rows <= 0:
        return {"scores": 0, "statistics": 0, "rescale": 0, "values": 0, "fixed": 0}
    from ipu_stack.kernels.registry import gemm_kernel  # the GEMM formula's one entry point

    gemm = gemm_kernel(precision.name, "interleaved").cycles
    assert gemm is not None
    scores = values = rescale = 0
    for start in range(0, k_rows, KEY_BLOCK):
        keys = min(KEY_BLOCK, k_rows - start)
        scores += gemm(q_rows, d, keys)
        values += gemm(q_rows, keys, dv)
        rescale += _multiply_call_cycles(q_rows * dv)
    blocks = -(-k_rows // KEY_BLOCK)
    statistics = int(SOFTMAX_STAT_CYCLES_PER_SCORE * q_rows * k_rows + 0.999)
    transpose = (
        -(-(k_rows * d * precision.element_bytes) // ipu21.LOCAL_COPY_BYTES_PER_CYCLE)
        + ipu21.LOCAL_COPY_CALL_CYCLES
    )
    fixed = (
        blocks * LAUNCHES_PER_BLOCK * ipu21.KERNEL_LAUNCH_CYCLES
        + transpose
        + _multiply_call_cycles(q_rows * dv)
    )
    return {
        "scores": scores,
        "statistics": statistics,
        "rescale": rescale,
        "values": values,
        "fixed": fixed,
    }


def flash_attention_cycles(q_rows: int, k_rows: int, d: int, dv: int, precision: Precision) -> int:
    """Cycles of one tile's attention over ``q_rows`` queries and ``k_rows`` keys."""
    return sum(flash_attention_breakdown(q_rows, k_rows, d, dv, precision).values())

"""The attention cycle model, recomputed by hand from the facts' figures."""

from __future__ import annotations

import math

from ipu_stack.target import ipu21
from ipu_stack.target.attention_cycles import flash_attention_breakdown, flash_attention_cycles


def _gemm(rows: int, k: int, c: int) -> int:
    # facts §13.2 (SEPT, interleaved F16): 294 + ceil(K/16) ceil(C/16) (4 rows + 160)
    return 294 + math.ceil(k / 16) * math.ceil(c / 16) * (4 * rows + 160)


def _mul(elements: int) -> int:
    # facts §14.1: Add of 1,152 elements 1,368 cycles, of 2,152 elements 2,124 (linear)
    per = (2124 - 1368) / (2152 - 1152)
    return math.ceil(1368 - per * 1152 + per * elements)


def test_siglip_tile_call_matches_the_hand_computation():
    q, keys, d, dv = 8, 729, 72, 72  # one tile of the SigLIP b1 attention (1-D query split)
    blocks = [64] * 11 + [25]
    want = {
        "scores": sum(_gemm(q, d, b) for b in blocks),
        "statistics": math.ceil(5232 / 729 * q * keys),  # facts §14.1 softmax, per score
        "rescale": 12 * _mul(q * dv),
        "values": sum(_gemm(q, b, dv) for b in blocks),
        # 4 launches of 11 per block, the key transpose at 8 B/cycle + 288 per copy call,
        # the final normalisation
        "fixed": 12 * 4 * 11 + math.ceil(keys * d * 2 / 8) + 288 + _mul(q * dv),
    }
    got = flash_attention_breakdown(q, keys, d, dv, ipu21.F16)
    assert got == want
    assert flash_attention_cycles(q, keys, d, dv, ipu21.F16) == sum(want.values())


def test_cost_is_not_the_amp_peak_rate():
    # The products alone cost more than MACs / 64 (per-panel overhead of the GEMM template).
    q, keys, d, dv = 8, 729, 72, 72
    got = flash_attention_breakdown(q, keys, d, dv, ipu21.F16)
    assert got["scores"] + got["values"] > 3 * q * keys * (d + dv) / 64
    assert flash_attention_cycles(0, keys, d, dv, ipu21.F16) == 0

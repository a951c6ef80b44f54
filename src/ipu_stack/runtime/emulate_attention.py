"""``run --kernels emulate`` for attention calls: a MapCall -> its ``attention.S`` unit.

The lowering (``low/lower_ops.py: lower_attention``) stages q, k, v (and an additive mask,
possibly broadcast over rows or keys) per tile and emits one MapCall of kind ``attention``
with attributes scale, causal, q_offset and q_total. The unit takes the scale and the causal
offset as registers and needs a workspace of 6 x T f32 that the lowering does not allocate:
the emulated call borrows a span of tile memory outside every operand and the executor
restores it after the call (on hardware the planner would carve it, like the stack).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.kernels.units_attention import AttentionUnit, parse_attention_unit, visible_keys
from ipu_stack.low.program import MapCall
from ipu_stack.target import ipu21

_EB = {"f16": 2, "f32": 4}


def _stride(cols: int, eb: int) -> int:
    return -(-cols * eb // 8) * 8


def attention_job(call: MapCall, address: Any) -> tuple | None:
    """(name, source, flags, entry, regs, workspace span) of an attention call, or None
    when its shapes or dtypes are outside the template's forms."""
    out = call.out
    if len(call.inputs) not in (3, 4):
        return None
    q, k, v = call.inputs[:3]
    dt = out.dtype
    if dt not in _EB or any(x.dtype != dt for x in (q, k, v)):
        return None
    eb = _EB[dt]
    if (q.cols * eb) % 8 or (v.cols * eb) % 8 or k.cols != q.cols or v.rows != k.rows:
        return None
    if q.rows != out.rows or out.cols != v.cols:
        return None
    if any(x.stride != x.cols * eb for x in (q, k, v, out)):
        return None
    name = f"attention_{dt}_r{out.rows}_t{k.rows}_d{q.cols}_v{v.cols}"
    if call.attr("causal"):
        name += "_causal"
    mask = call.inputs[3] if len(call.inputs) == 4 else None
    if mask is not None:
        if mask.dtype not in _EB or mask.rows not in (1, out.rows) or mask.cols not in (1, k.rows):
            return None
        per_row = mask.rows == out.rows and out.rows > 1
        per_key = mask.cols == k.rows and k.rows > 1
        form = {(True, True): "full", (False, True): "row", (True, False): "col",
                (False, False): "scalar"}[(per_row, per_key)]  # fmt: skip
        if per_row and mask.stride != _stride(mask.cols, _EB[mask.dtype]):
            return None
        name += f"_mask{form}_{mask.dtype}"
    try:
        unit: AttentionUnit = parse_attention_unit(name)
    except GraphError:  # beyond the template's sizes: the call stays modelled
        return None
    regs = {
        2: address(out.ref, out.rows * out.stride, 8, "attention output"),
        3: address(q.ref, q.rows * q.stride, 8, "attention q"),
        4: address(k.ref, k.rows * k.stride, 8, "attention k"),
        5: address(v.ref, v.rows * v.stride, 8, "attention v"),
    }
    spans = [(regs[2], out.rows * out.stride), (regs[3], q.rows * q.stride),
             (regs[4], k.rows * k.stride), (regs[5], v.rows * v.stride)]  # fmt: skip
    if mask is not None:
        regs[6] = address(mask.ref, mask.rows * mask.stride, 4, "attention mask")
        spans.append((regs[6], mask.rows * mask.stride))
    workspace = _free_span(spans, unit.workspace_bytes)
    if workspace is None:
        return None
    regs[7] = workspace
    regs[8] = int(np.array([call.attr("scale")], np.float32).view(np.uint32)[0])
    visible = visible_keys(unit, int(call.attr("q_offset")), int(call.attr("q_total")))
    regs[9] = visible & 0xFFFFFFFF
    span = (workspace, workspace + unit.workspace_bytes)
    return unit.name, unit.source, tuple(unit.flags()), unit.entry, regs, span


def _free_span(spans: list[tuple[int, int]], size: int) -> int | None:
    """The highest 8-aligned address below the loader limit whose ``size`` bytes overlap no
    operand span."""
    top = ipu21.LOADER_LIMIT
    while True:
        at = (top - size) // 8 * 8
        if at < ipu21.TILE_MEMORY_BASE:
            return None
        clash = [a for a, n in spans if a < at + size and at < a + n]
        if not clash:
            return at
        top = min(clash)

"""Cycles of the non-GEMM kernel calls, shared by the simulator and the estimates."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ipu_stack.kernels.registry import gemm_kernel
from ipu_stack.low.program import AddCall, CopyCall, FillCall, GemmCall, KernelCall, MapCall
from ipu_stack.target import ipu21
from ipu_stack.target.op_cycles import (
    argmax_cycles,
    attention_cycles,
    concat_cycles,
    elementwise_cycles,
    gather_rows_cycles,
    gelu_cycles,
    reduce_add_cycles,
    row_kernel_cycles,
    transpose_cycles,
)


def copy_call_cycles(call: CopyCall | FillCall) -> int:
    """Local copy or zero fill: 8 bytes per cycle plus the per-call cost (facts §12.1); a copy
    of several runs also pays ``LOCAL_COPY_ROW_CYCLES`` per run after the first [I]."""
    rows = call.rows if isinstance(call, CopyCall) else 1
    moved = -(-rows * call.size // ipu21.LOCAL_COPY_BYTES_PER_CYCLE)
    return moved + ipu21.LOCAL_COPY_CALL_CYCLES + (rows - 1) * ipu21.LOCAL_COPY_ROW_CYCLES


def add_call_cycles(call: AddCall) -> int:
    """``out += sum(inputs)``: a reduce-add of ``len(inputs) + 1`` partials, launch included."""
    partials = len(call.inputs) + 1
    return (
        reduce_add_cycles(partials, call.elements, call.precision.name) + ipu21.KERNEL_LAUNCH_CYCLES
    )


def map_call_cycles(call: MapCall) -> int:
    """Cycles of one elementwise, row-wise or attention call, launch included."""
    out = call.out
    elements = out.rows * out.cols
    launch = ipu21.KERNEL_LAUNCH_CYCLES
    if call.kind in ("layer_norm", "softmax"):
        return row_kernel_cycles(call.kind, out.rows, out.cols) + launch
    if call.kind == "attention":
        q, k, v = call.inputs[:3]
        precision = ipu21.precision(q.dtype)
        mask = elementwise_cycles("add", q.rows * k.rows) if len(call.inputs) == 4 else 0
        return attention_cycles(q.rows, k.rows, q.cols, v.cols, precision) + mask + launch
    if call.kind == "gelu":
        approximate = str(dict(call.attrs).get("approximate", "none"))
        return gelu_cycles(elements, approximate, out.dtype) + launch
    if call.kind in ("gather_rows", "transpose", "concat", "argmax"):
        return indexing_call_cycles(call) + launch
    if call.kind == "cast":
        src = call.inputs[0]
        in_bytes = elements * ipu21.precision(src.dtype).element_bytes
        out_bytes = elements * ipu21.precision(out.dtype).element_bytes
        return elementwise_cycles("cast", elements, in_bytes, out_bytes) + launch
    if call.kind == "reduce_mean":  # one add per input element
        elements = call.inputs[0].rows * call.inputs[0].cols
    return elementwise_cycles(call.kind, elements) + launch


def indexing_call_cycles(call: MapCall) -> int:
    """Cycles of a gather_rows, transpose, concat or argmax call (launch excluded)."""
    out = call.out
    if call.kind == "gather_rows":
        return gather_rows_cycles(out.rows, out.rows * out.cols * _eb(out.dtype))
    if call.kind == "transpose":
        return transpose_cycles(out.rows * out.cols)
    if call.kind == "concat":
        return concat_cycles([v.rows * v.cols * _eb(v.dtype) for v in call.inputs])
    src = call.inputs[0]
    return argmax_cycles(src.rows * src.cols)


def _eb(dtype: str) -> int:
    return ipu21.precision(dtype).element_bytes


def call_cycles(call: KernelCall) -> int:
    """Cycles of any kernel call, launch included (the target formulas)."""
    if isinstance(call, GemmCall):
        spec = gemm_kernel(call.precision.name, call.weights)  # the registry's cycle model
        assert spec.cycles is not None
        return spec.cycles(call.rows, call.k, call.c) + ipu21.KERNEL_LAUNCH_CYCLES
    if isinstance(call, AddCall):
        return add_call_cycles(call)
    if isinstance(call, MapCall):
        return map_call_cycles(call)
    return copy_call_cycles(call)


def busiest_tile_cycles(calls: Iterable[KernelCall]) -> int:
    """The largest per-tile sum of call cycles: what a compute step of these calls takes."""
    per_tile: dict[int, int] = defaultdict(int)
    for call in calls:
        per_tile[call.tile] += call_cycles(call)
    return max(per_tile.values(), default=0)

"""``run --kernels emulate`` for the integer, indexing and rearrangement calls.

:func:`indexing_job` maps a :class:`~ipu_stack.low.program.MapCall` the registry's indexing
semantics handle (``runtime/indexing_semantics.py``), or an F8 cast, onto its unit of
:mod:`ipu_stack.kernels.units_indexing` when its views have the unit's geometry (row strides
of the lowering, dtypes the template supports); otherwise None and the call stays modelled
(F8 equality, F8 <-> I32 casts, more than six concat inputs). :func:`trap_error` turns a gather
kernel's trap into the error the semantics raise.
"""

from __future__ import annotations

from typing import Any

from ipu_stack.isa.ops_indexing import Trap
from ipu_stack.kernels.kernel_run_indexing import trap_error
from ipu_stack.kernels.units_indexing import (
    BITS,
    MAX_CONCAT_INPUTS,
    IndexingUnit,
    parse_indexing_unit,
    row_stride,
)
from ipu_stack.low.program import MapCall, View
from ipu_stack.runtime import indexing_semantics

__all__ = ["Trap", "handles", "indexing_job", "trap_error"]


def _plain(v: View) -> bool:
    return v.dtype in BITS and v.stride == row_stride(v.cols, v.dtype)


def _span(v: View) -> int:
    return (v.rows - 1) * v.stride + v.cols * BITS[v.dtype] // 8


def _name(call: MapCall) -> str | None:
    out, ins = call.out, call.inputs
    kind = call.kind
    if kind == "transpose":
        src = ins[0]
        c0 = int(call.attr("col_offset"))
        if src.dtype != out.dtype or out.dtype not in BITS or not _plain(out):
            return None
        if (out.cols, out.rows) != (src.rows, min(out.rows, src.cols - c0)) or src.stride % 4:
            return None
        return f"transpose_{out.dtype}_x{out.cols}_s{out.rows}_i{src.stride}_o{c0}"
    if kind == "gather_rows":
        table, ids = ins
        if table.dtype != out.dtype or out.dtype == "i32" or not all(map(_plain, (out, ids))):
            return None
        if table.cols != out.cols or table.stride != out.stride:
            return None
        return (f"gather_rows_{out.dtype}_n{out.rows}_w{out.cols}_v{table.rows}"
                f"_i{ids.rows}x{ids.cols}")  # fmt: skip
    if kind == "concat":
        if len(ins) > MAX_CONCAT_INPUTS or not all(map(_plain, (out, *ins))):
            return None
        if any(v.dtype != out.dtype or v.rows != out.rows for v in ins):
            return None
        if sum(v.cols for v in ins) != out.cols:
            return None
        return f"concat_{out.dtype}_r{out.rows}_w{'x'.join(str(v.cols) for v in ins)}"
    if kind == "argmax":
        src = ins[0]
        if src.dtype not in ("f16", "f32", "i32") or not _plain(src) or out.stride != 8:
            return None
        return f"argmax_{src.dtype}_r{src.rows}_c{src.cols}"
    if kind == "cast":
        src = ins[0]
        if not (_plain(out) and _plain(src)) or (src.rows, src.cols) != (out.rows, out.cols):
            return None
        if {src.dtype, out.dtype} <= {"f16", "f32", "i32"}:
            return f"cast_{src.dtype}_{out.dtype}_r{out.rows}_c{out.cols}"
        if {src.dtype, out.dtype} in ({"f8", "f16"}, {"f8", "f32"}):
            key = "scale_exponent" if out.dtype == "f8" else "source_scale_exponent"
            other = "source_scale_exponent" if out.dtype == "f8" else "scale_exponent"
            scale = int(call.attr(key))
            if int(dict(call.attrs).get(other, 0)) or abs(scale) > 64:
                return None
            tag = f"m{-scale}" if scale < 0 else str(scale)
            return f"cast_{src.dtype}_{out.dtype}_r{out.rows}_c{out.cols}_e{tag}"
        return None
    if kind in ("equal", "where", "add", "mul"):
        if not all(map(_plain, (out, *ins))):
            return None
        pattern = ""
        letters = {(1, 1): "s", (out.rows, 1): "c", (1, out.cols): "r", (out.rows, out.cols): "f"}
        for v in ins:
            if (v.rows, v.cols) not in letters:
                return None
            pattern += letters[(v.rows, v.cols)]
        r, c = out.rows, out.cols
        if kind == "equal" and len(ins) == 2 and ins[0].dtype == ins[1].dtype != "f8":
            return f"equal_{ins[0].dtype}_r{r}_c{c}_b{pattern}" if out.dtype == "i32" else None
        if (
            kind == "where"
            and len(ins) == 3
            and ins[0].dtype == "i32"
            and (ins[1].dtype == ins[2].dtype == out.dtype)
        ):
            return f"where_{out.dtype}_r{r}_c{c}_b{pattern}"
        if kind in ("add", "mul") and all(v.dtype == "i32" for v in (out, *ins)):
            return f"{kind}_i32_r{r}_c{c}_b{pattern}"
    return None


def handles(call: MapCall) -> bool:
    """Whether this module maps ``call`` (an indexing or i32 kernel, or a cast with an F8
    side); :func:`indexing_job` may still leave it modelled."""
    if indexing_semantics.handles(call):
        return True
    return call.kind == "cast" and "f8" in (call.out.dtype, *(v.dtype for v in call.inputs))


def indexing_job(call: MapCall, address: Any) -> tuple | None:
    """(unit name, source, flags, entry, registers) of ``call``, or None (modelled).

    ``address(ref, size, alignment, what)`` is the simulator's checked address of a ref.
    """
    name = _name(call)
    if name is None:
        return None
    unit = parse_indexing_unit(name)
    assert isinstance(unit, IndexingUnit)
    out = call.out
    regs = {2: address(out.ref, out.rows * out.stride, 4, f"{call.kind} output")}
    for i, v in enumerate(call.inputs):
        regs[3 + i] = address(v.ref, _span(v), 4, f"{call.kind} input {i}")
    if call.kind == "gather_rows":
        regs[5] = int(call.attr("row_offset"))
        regs[6] = int(call.attr("table_rows"))
    return unit.name, unit.source, tuple(unit.flags()), unit.entry, regs

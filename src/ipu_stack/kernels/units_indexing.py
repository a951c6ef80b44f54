"""Integer, indexing and rearrangement kernel units: names, flags, operands and semantics.

A unit name fixes the geometry the template needs; row strides are the lowering's
(``low/lower_ops._stride``: rows padded to 8 bytes) unless the name gives them:

- ``transpose_{f8|f16|f32|i32}_x{X}_s{S}[_i{ISTRIDE}][_o{COL}]`` (``transpose.S``):
  ``out[S, X] = staging[X, COL:COL + S].T``, staging rows ``ISTRIDE`` bytes apart;
- ``gather_rows_{f8|f16|f32}_n{N}_w{W}_v{ROWS}[_i{IR}x{IC}]`` (``gather.S``): N ids (an
  ``[IR, IC]`` i32 view, default ``[1, N]``) into rows of W elements from a block of ROWS
  table rows; ``row_offset`` ($m5) and ``table_rows`` ($m6) are runtime scalars; an id
  outside ``[0, table_rows)`` traps with its flat position in $m0 and the id in $m1;
- ``concat_{dt}_r{R}_w{W0}x{W1}...`` (``concat.S``, up to 6 inputs): rows side by side;
- ``{equal|where}_{dt}_r{R}_c{C}[_b{P}]``, ``{add|mul}_i32_r{R}_c{C}[_b{P}]`` (``select.S``):
  elementwise with NumPy broadcast, P one letter per input: ``f`` full ``[R, C]``, ``r`` a row
  ``[1, C]``, ``c`` a column ``[R, 1]``, ``s`` a scalar ``[1, 1]``; equal's dtype is its
  inputs' (output i32), where's is its values' (condition i32);
- ``argmax_{f16|f32|i32}_r{R}_c{C}`` (``argmax.S``): first maximum of each row, i32 output
  rows of 8 bytes;
- ``cast_{f16|f32|i32}_{f16|f32|i32}_r{R}_c{C}``, one side i32 (``cast_i32.S``): float -> i32
  toward zero (NaN 0, saturating), i32 -> float to nearest even;
- ``cast_{f16|f32}_f8_r{R}_c{C}_e{S}``, ``cast_f8_{f16|f32}_r{R}_c{C}_e{S}`` (``cast_f8.S``):
  F143 with scale ``2**S`` (``m3`` is -3), the semantics of ``encode_f143``/``decode_f143``.

The semantics are the registry's (:func:`ipu_stack.runtime.sim.map_semantics`
on a :class:`~ipu_stack.low.program.MapCall` built from the unit), written like the simulator
writes a map call's output (row padding zero); comparisons are byte-exact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.kernels.registry import ENTRY_PREFIX, TEMPLATE_DIR
from ipu_stack.low.program import MapCall, Ref, View
from ipu_stack.target import ipu21

BITS = {"f8": 8, "f16": 16, "f32": 32, "i32": 32}
SELECT_OPS = {"add": 1, "mul": 2, "equal": 3, "where": 4}
MAX_CONCAT_INPUTS = 6
MAX_ROWS = 65530  # the workers divide rows by 6 exactly below 2**16
GATHER_TRAP = 1
_PREFIX = {"transpose.S": "TR", "gather.S": "GATHER", "concat.S": "CONCAT", "select.S": "SEL",
           "argmax.S": "ARGMAX", "cast_i32.S": "CI", "cast_f8.S": "CF"}  # fmt: skip

_NAME = re.compile(
    r"^(?:transpose_(?P<tdt>f8|f16|f32|i32)_x(?P<tx>\d+)_s(?P<ts>\d+)(?:_i(?P<ti>\d+))?"
    r"(?:_o(?P<to>\d+))?"
    r"|gather_rows_(?P<gdt>f8|f16|f32)_n(?P<gn>\d+)_w(?P<gw>\d+)_v(?P<gv>\d+)"
    r"(?:_i(?P<gir>\d+)x(?P<gic>\d+))?"
    r"|concat_(?P<cdt>f8|f16|f32|i32)_r(?P<cr>\d+)_w(?P<cw>\d+(?:x\d+)*)"
    r"|(?P<sop>equal|where|add|mul)_(?P<sdt>f8|f16|f32|i32)_r(?P<sr>\d+)_c(?P<sc>\d+)"
    r"(?:_b(?P<sb>[frcs]+))?"
    r"|argmax_(?P<adt>f16|f32|i32)_r(?P<ar>\d+)_c(?P<ac>\d+)"
    r"|cast_(?P<xs>f8|f16|f32|i32)_(?P<xd>f8|f16|f32|i32)_r(?P<xr>\d+)_c(?P<xc>\d+)"
    r"(?:_e(?P<xe>m?\d+))?)$"
)


def row_stride(cols: int, dtype: str) -> int:
    """Bytes of a row of ``cols`` elements padded to 8 bytes (the lowering's rows)."""
    return -(-cols * BITS[dtype] // 8 // 8) * 8


@dataclass(frozen=True, slots=True)
class Operand2D:
    """A 2-D operand of a unit: rows, cols, row stride in bytes, dtype."""

    rows: int
    cols: int
    stride: int
    dtype: str

    @property
    def nbytes(self) -> int:
        return self.rows * self.stride

    def view(self, name: str) -> View:
        return View(Ref(name), self.rows, self.cols, self.stride, self.dtype)


@dataclass(frozen=True, slots=True)
class IndexingUnit:
    """One compile unit of the indexing family."""

    name: str
    kind: str  # transpose | gather_rows | concat | equal | where | add | mul | argmax
    template: str
    out: Operand2D
    inputs: tuple[Operand2D, ...]
    flags_: tuple[str, ...]
    attrs: tuple[tuple[str, float | int | bool | str], ...] = ()
    ids_shape: tuple[int, int] = (1, 1)
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def source(self) -> Path:
        return TEMPLATE_DIR / self.template

    @property
    def entry(self) -> str:
        return f"{ENTRY_PREFIX}{self.name}"

    def flags(self) -> list[str]:
        return [*self.flags_, f"-D{_PREFIX[self.template]}_SYMBOL={self.entry}"]

    def call(self, attrs: tuple = ()) -> MapCall:
        """The registry MapCall this unit executes (dummy refs)."""
        ins = tuple(v.view(f"in{i}") for i, v in enumerate(self.inputs))
        return MapCall(0, self.kind, self.out.view("out"), ins, self.attrs + attrs)

    def reference(self, args: list[np.ndarray], attrs: tuple = ()) -> np.ndarray:
        """The output bytes the simulator writes: the registry semantics, rounded to the
        output dtype, rows padded with zeros to the stride."""
        from ipu_stack.runtime.sim import map_semantics

        result = map_semantics(self.call(attrs), args)
        dtype = np.dtype(ipu21.precision(self.out.dtype).numpy_name)
        padded = np.zeros((self.out.rows, self.out.stride), np.uint8)
        with np.errstate(over="ignore"):  # i32 -> f16 overflows to inf, as the simulator's
            data = np.asarray(result).astype(dtype)
        data = np.broadcast_to(data, (self.out.rows, self.out.cols))
        padded[:, : self.out.cols * dtype.itemsize] = data.view(np.uint8)
        return padded.reshape(-1)


def _check(name: str, ok: bool, why: str) -> None:
    if not ok:
        raise GraphError(f"unit {name}: {why}")


def _rows_ok(name: str, *counts: int) -> None:
    for n in counts:
        _check(name, 1 <= n <= MAX_ROWS, f"extent {n} out of range 1..{MAX_ROWS}")


def _transpose(name: str, dt: str, x: int, s: int, istride: int | None, col: int) -> IndexingUnit:
    _rows_ok(name, x, s)
    eb = BITS[dt] // 8
    istride = row_stride(col + s, dt) if istride is None else istride
    _check(name, istride % eb == 0 and istride >= (col + s) * eb, "bad staging stride")
    _check(name, istride % 4 == 0, "staging rows must start on words")
    out = Operand2D(s, x, row_stride(x, dt), dt)
    src = Operand2D(x, col + s, istride, dt)
    flags = (f"-DTR_BITS={BITS[dt]}", f"-DTR_X={x}", f"-DTR_S={s}", f"-DTR_ISTRIDE={istride}",
             f"-DTR_COL={col}", f"-DTR_OSTRIDE={out.stride}")  # fmt: skip
    return IndexingUnit(name, "transpose", "transpose.S", out, (src,), flags,
                        (("col_offset", col),))  # fmt: skip


def _gather(name: str, dt: str, n: int, w: int, rows: int, ids: tuple[int, int]) -> IndexingUnit:
    _rows_ok(name, n, w, rows, *ids)
    _check(name, ids[0] * ids[1] >= n, f"ids view {ids} holds fewer than {n} ids")
    out = Operand2D(n, w, row_stride(w, dt), dt)
    table = Operand2D(rows, w, out.stride, dt)
    id_view = Operand2D(ids[0], ids[1], row_stride(ids[1], "i32"), "i32")
    flags = (f"-DGATHER_N={n}", f"-DGATHER_ROW_BYTES={w * BITS[dt] // 8}",
             f"-DGATHER_STRIDE={out.stride}", f"-DGATHER_ROWS={rows}",
             f"-DGATHER_ID_COLS={ids[1]}", f"-DGATHER_ID_STRIDE={id_view.stride}",
             f"-DGATHER_TRAP_CODE={GATHER_TRAP}")  # fmt: skip
    return IndexingUnit(name, "gather_rows", "gather.S", out, (table, id_view), flags,
                        ids_shape=ids)  # fmt: skip


def _concat(name: str, dt: str, r: int, widths: list[int]) -> IndexingUnit:
    _rows_ok(name, r, *widths)
    _check(name, len(widths) <= MAX_CONCAT_INPUTS, f"at most {MAX_CONCAT_INPUTS} inputs")
    out = Operand2D(r, sum(widths), row_stride(sum(widths), dt), dt)
    ins = tuple(Operand2D(r, w, row_stride(w, dt), dt) for w in widths)
    flags = [f"-DCONCAT_BITS={BITS[dt]}", f"-DCONCAT_ROWS={r}", f"-DCONCAT_INPUTS={len(widths)}",
             f"-DCONCAT_COLS={out.cols}", f"-DCONCAT_OSTRIDE={out.stride}"]  # fmt: skip
    for j, v in enumerate(ins):
        flags += [f"-DCONCAT_W{j}={v.cols}", f"-DCONCAT_S{j}={v.stride}"]
    return IndexingUnit(name, "concat", "concat.S", out, ins, tuple(flags))


def _select(name: str, op: str, dt: str, r: int, c: int, pattern: str | None) -> IndexingUnit:
    _rows_ok(name, r, c)
    n_in = 3 if op == "where" else 2
    pattern = pattern or "f" * n_in
    _check(name, len(pattern) == n_in, f"broadcast pattern needs {n_in} letters")
    if op in ("add", "mul"):
        _check(name, dt == "i32", "add/mul units of this family are i32")
    in_dts = ["i32", dt, dt] if op == "where" else [dt, dt]
    out_dt = "i32" if op == "equal" else dt
    ins = []
    flags = [f"-DSEL_OP={SELECT_OPS[op]}", f"-DSEL_R={r}", f"-DSEL_C={c}",
             f"-DSEL_OUT_BITS={BITS[out_dt]}", f"-DSEL_OSTRIDE={row_stride(c, out_dt)}",
             f"-DSEL_INPUTS={n_in}"]  # fmt: skip
    if op == "equal" and dt != "i32":
        flags.append(f"-DSEL_FLOAT_BITS={BITS[dt]}")
    for i, (p, idt) in enumerate(zip(pattern, in_dts, strict=True)):
        rows, cols = (1 if p in "rs" else r), (1 if p in "cs" else c)
        v = Operand2D(rows, cols, row_stride(cols, idt), idt)
        ins.append(v)
        rstep = v.stride if rows > 1 else 0
        flags += [f"-DSEL_IN{i}_BITS={BITS[idt]}", f"-DSEL_IN{i}_RSTEP={rstep}",
                  f"-DSEL_IN{i}_CSTEP={1 if cols > 1 else 0}"]  # fmt: skip
    out = Operand2D(r, c, row_stride(c, out_dt), out_dt)
    return IndexingUnit(name, op, "select.S", out, tuple(ins), tuple(flags))


def _argmax(name: str, dt: str, r: int, c: int) -> IndexingUnit:
    _rows_ok(name, r, c)
    src = Operand2D(r, c, row_stride(c, dt), dt)
    out = Operand2D(r, 1, 8, "i32")
    flags = (f"-DARGMAX_BITS={BITS[dt]}", f"-DARGMAX_FLOAT={int(dt != 'i32')}",
             f"-DARGMAX_R={r}", f"-DARGMAX_C={c}", f"-DARGMAX_ISTRIDE={src.stride}",
             f"-DARGMAX_OSTRIDE={out.stride}")  # fmt: skip
    return IndexingUnit(name, "argmax", "argmax.S", out, (src,), flags)


def _cast_f8(name: str, src: str, dst: str, r: int, c: int, scale: int) -> IndexingUnit:
    _rows_ok(name, r, c)
    _check(name, {src, dst} in ({"f8", "f16"}, {"f8", "f32"}), "F8 casts are to or from F16/F32")
    _check(name, abs(scale) <= 64, f"scale exponent {scale} out of range -64..64")
    inp = Operand2D(r, c, row_stride(c, src), src)
    out = Operand2D(r, c, row_stride(c, dst), dst)
    flags = (f"-DCF_MODE={1 if dst == 'f8' else 2}", f"-DCF_IN_BITS={BITS[src]}",
             f"-DCF_OUT_BITS={BITS[dst]}", f"-DCF_SCALE={scale}", f"-DCF_R={r}", f"-DCF_C={c}",
             f"-DCF_ISTRIDE={inp.stride}", f"-DCF_OSTRIDE={out.stride}")  # fmt: skip
    attrs = (("scale_exponent", scale if dst == "f8" else 0),
             ("source_scale_exponent", scale if src == "f8" else 0))  # fmt: skip
    return IndexingUnit(name, "cast", "cast_f8.S", out, (inp,), flags, attrs)


def _cast(name: str, src: str, dst: str, r: int, c: int) -> IndexingUnit:
    _rows_ok(name, r, c)
    _check(name, "i32" in (src, dst), "one side of an integer cast is i32")
    mode = 0 if src == dst else 1 if dst == "i32" else 2
    inp = Operand2D(r, c, row_stride(c, src), src)
    out = Operand2D(r, c, row_stride(c, dst), dst)
    flags = (f"-DCI_MODE={mode}", f"-DCI_IN_BITS={BITS[src]}", f"-DCI_OUT_BITS={BITS[dst]}",
             f"-DCI_R={r}", f"-DCI_C={c}", f"-DCI_ISTRIDE={inp.stride}",
             f"-DCI_OSTRIDE={out.stride}")  # fmt: skip
    return IndexingUnit(name, "cast", "cast_i32.S", out, (inp,), flags)


def parse_indexing_unit(name: str) -> IndexingUnit | None:
    """The unit ``name`` denotes, or None when it is not a name of this family.

    Raises:
        GraphError: a name of this family with an impossible geometry.
    """
    m = _NAME.match(name)
    if not m:
        return None
    if m["tdt"]:
        ti = int(m["ti"]) if m["ti"] else None
        return _transpose(name, m["tdt"], int(m["tx"]), int(m["ts"]), ti, int(m["to"] or 0))
    if m["gdt"]:
        ids = (int(m["gir"]), int(m["gic"])) if m["gir"] else (1, int(m["gn"]))
        return _gather(name, m["gdt"], int(m["gn"]), int(m["gw"]), int(m["gv"]), ids)
    if m["cdt"]:
        return _concat(name, m["cdt"], int(m["cr"]), [int(w) for w in m["cw"].split("x")])
    if m["sop"]:
        if m["sop"] in ("add", "mul") and m["sdt"] != "i32":
            return None  # the float elementwise units (kernels/units.py)
        return _select(name, m["sop"], m["sdt"], int(m["sr"]), int(m["sc"]), m["sb"])
    if m["xs"]:
        r, c = int(m["xr"]), int(m["xc"])
        if "f8" in (m["xs"], m["xd"]):
            scale = int(m["xe"].replace("m", "-")) if m["xe"] else 0
            return _cast_f8(name, m["xs"], m["xd"], r, c, scale)
        if "i32" not in (m["xs"], m["xd"]):
            return None  # the float casts (kernels/units.py)
        return _cast(name, m["xs"], m["xd"], r, c)
    return _argmax(name, m["adt"], int(m["ar"]), int(m["ac"]))

"""Unary, binary and broadcast elementwise units: names, flags, semantics, kernel-run.

Unit names (N elements, even; R rows of C columns):

- ``gelu_{f16|f32}_n{N}``: exact (erf) GeLU, ``templates/gelu_erf.S``;
  ``gelu_tanh_f32_n{N}``: tanh GeLU in F32, ``templates/gelu_tanh.S`` (F16:
  ``gelu_tanh_f16_n{N}`` of :mod:`ipu_stack.kernels.units`);
- ``{tanh|sigmoid|sqrt|reciprocal|neg|sub|div}_{f16|f32}_n{N}`` and ``pow_{f16|f32}_e{E}_n{N}``
  with E one of ``2 3 4 0p5 m0p5 m1 m2`` (the exponents 2, 3, 4, 0.5, -0.5, -1, -2):
  ``templates/unary.S``;
- column form of unary.S, [R, 1] operands staged one element per 8-byte row, pads written as
  zeros: ``{kind}_{f16|f32}[_e{E}]_col_r{R}`` (the kinds above and add/mul/sub/div of two
  columns) and ``{add|mul|sub|div}_{f16|f32}_colscalar_r{R}`` (the second operand [1, 1]);
  with ``_o4`` the output rows are 4 bytes apart (F32 rows without pads, F16 rows with a
  2-byte zero pad), as ``low/in_place.py`` leaves a one-row result written into its consumer;
- ``{add|mul|sub|div|rsub|rdiv}_{f16|f32}_{colbcast|scalarbcast}_r{R}_c{C}`` and
  ``{sub|div|rsub|rdiv}_{f16|f32}_rowbcast_r{R}_c{C}``: an [R, C] operand with an [R, 1]
  column (rows 8 bytes apart), a [1, 1] scalar or a [1, C] row; ``r``: the broadcast operand
  comes first. ``templates/broadcast.S`` (C * element bytes a multiple of 8).

The semantics are the registry's own, evaluated through :func:`ipu_stack.runtime.sim.
map_semantics` on a :class:`MapCall` of the unit's shapes (f32 arithmetic rounded once to the
output type). :func:`emulate_job` maps a simulator call onto a unit (``run --kernels
emulate``); :func:`run_unit` is ``kernel-run``'s check of one unit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.kernels.registry import ENTRY_PREFIX, TEMPLATE_DIR
from ipu_stack.low.program import MapCall, Ref, View

GELU_ERF_TEMPLATE = TEMPLATE_DIR / "gelu_erf.S"
UNARY_TEMPLATE = TEMPLATE_DIR / "unary.S"
GELU_TANH_TEMPLATE = TEMPLATE_DIR / "gelu_tanh.S"
BROADCAST_TEMPLATE = TEMPLATE_DIR / "broadcast.S"

#: unary.S operation codes (UN_OP)
UNARY_OPS = {"tanh": 1, "sigmoid": 2, "sqrt": 3, "reciprocal": 4, "neg": 5, "pow": 6,
             "sub": 7, "div": 8, "relu": 11, "max": 12, "min": 13}  # fmt: skip
#: two-operand kinds of unary.S (elementwise and column forms)
BINARY_KINDS = ("sub", "div", "max", "min", "add", "mul")
#: unary.S column form only (UN_COL): add and mul of [R, 1] columns
COLUMN_OPS = {**UNARY_OPS, "add": 9, "mul": 10}
#: pow exponents with device code: name tag -> (exponent, UN_POW code)
POW_EXPONENTS = {"2": (2.0, 1), "3": (3.0, 2), "4": (4.0, 3), "0p5": (0.5, 4),
                 "m0p5": (-0.5, 5), "m1": (-1.0, 6), "m2": (-2.0, 7)}  # fmt: skip
MAX_ITEMS = 65530  # the workers divide by 6 exactly below 2**16
GUARD = 64  # kernel-run: bytes checked untouched before and after the output, above the stack

_NAME = re.compile(
    r"^(?:(?P<k>gelu|tanh|sigmoid|sqrt|reciprocal|neg|relu|sub|div|max|min)_(?P<p>f16|f32)_n(?P<n>\d+)"
    r"|pow_(?P<pp>f16|f32)_e(?P<e>2|3|4|0p5|m0p5|m1|m2)_n(?P<pn>\d+)|gelu_tanh_f32_n(?P<tn>\d+)"
    r"|(?P<ck>tanh|sigmoid|sqrt|reciprocal|neg|relu|sub|div|max|min|add|mul|pow)_(?P<cp>f16|f32)"
    r"(?:_e(?P<ce>2|3|4|0p5|m0p5|m1|m2))?_(?P<cform>col|colscalar)_r(?P<cr>\d+)(?P<o4>_o4)?"
    r"|(?P<bop>add|mul|r?sub|r?div)_(?P<bp>f16|f32)_(?P<form>colbcast|scalarbcast|rowbcast)"
    r"_r(?P<r>\d+)_c(?P<c>\d+))$"
)


@dataclass(frozen=True, slots=True)
class UnaryUnit:
    """One unit of this family."""

    name: str
    kind: str  # gelu | tanh | ... | pow | sub | div | add | mul
    dtype: str  # f16 | f32
    count: int  # elements (rows * cols for the broadcast forms)
    exponent: str = ""  # pow: a POW_EXPONENTS tag
    rows: int = 1  # broadcast forms
    form: str = ""  # colbcast | scalarbcast | rowbcast | col | colscalar | "" (elementwise)
    swap: bool = False  # broadcast forms: the broadcast operand comes first (rsub, rdiv)
    out_stride: int = 8  # column forms: bytes between output rows (8, or 4 with ``_o4``)

    @property
    def broadcast(self) -> bool:
        """broadcast.S forms: an [R, C] operand with a column, scalar or row vector."""
        return self.form in ("colbcast", "scalarbcast", "rowbcast")

    @property
    def source(self) -> Path:
        if self.broadcast:
            return BROADCAST_TEMPLATE
        if self.kind == "gelu_tanh":
            return GELU_TANH_TEMPLATE
        return GELU_ERF_TEMPLATE if self.kind == "gelu" else UNARY_TEMPLATE

    @property
    def entry(self) -> str:
        return f"{ENTRY_PREFIX}{self.name}"

    @property
    def element_bytes(self) -> int:
        return 2 if self.dtype == "f16" else 4

    @property
    def cols(self) -> int:
        return self.count // self.rows

    @property
    def column(self) -> bool:
        """unary.S column form: R rows of one element, inputs 8 bytes apart (the output
        ``out_stride``)."""
        return self.form in ("col", "colscalar")

    @property
    def inputs(self) -> int:
        return 2 if self.broadcast or self.kind in BINARY_KINDS else 1

    def flags(self) -> list[str]:
        """The ``-D`` flags specialising the template to this unit."""
        f32 = ["-D{}_F32=1"] if self.dtype == "f32" else []
        if self.column:
            out = [f"-DUN_OP={COLUMN_OPS[self.kind]}", f"-DUN_ITEMS={self.rows}",
                   f"-DUN_SYMBOL={self.entry}", "-DUN_COL=1"]  # fmt: skip
            if self.form == "colscalar":
                out.append("-DUN_B_STEP=0")
            if self.out_stride != 8:
                out.append(f"-DUN_OUT_STRIDE={self.out_stride}")
            if self.kind == "pow":
                out.append(f"-DUN_POW={POW_EXPONENTS[self.exponent][1]}")
            return out + [x.format("UN") for x in f32]
        if self.broadcast:
            atoms = self.cols * self.element_bytes // 8
            code = {"add": 1, "mul": 2, "sub": 3, "div": 4}[self.kind]
            out = [f"-DBC_OP={code}", f"-DBC_ROWS={self.rows}", f"-DBC_ATOMS={atoms}",
                   f"-DBC_SYMBOL={self.entry}"]  # fmt: skip
            if self.form != "rowbcast":
                out += ["-DBC_COLUMN=1", f"-DBC_COL_STEP={int(self.form == 'colbcast')}"]
            if self.swap:
                out.append("-DBC_SWAP=1")
            return out + [x.format("BC") for x in f32]
        items = self.count // 2
        if self.kind == "gelu_tanh":  # f32 only here (f16: units.py gelu_tanh_f16_nN)
            return [f"-DGT_GROUPS={items}", f"-DGT_SYMBOL={self.entry}", "-DGT_F32=1"]
        if self.kind == "gelu":
            return [f"-DGE_ITEMS={items}", f"-DGE_SYMBOL={self.entry}"] + [
                x.format("GE") for x in f32
            ]
        out = [f"-DUN_OP={UNARY_OPS[self.kind]}", f"-DUN_ITEMS={items}",
               f"-DUN_SYMBOL={self.entry}"]  # fmt: skip
        if self.kind == "pow":
            out.append(f"-DUN_POW={POW_EXPONENTS[self.exponent][1]}")
        return out + [x.format("UN") for x in f32]

    def call(self) -> MapCall:
        """A simulator call of this unit's shapes (its views are placeholders)."""
        eb = self.element_bytes
        rows, cols = (self.rows, self.cols) if self.form else (1, self.count)
        stride = 8 if self.column else cols * eb
        out_stride = self.out_stride if self.column else stride
        full = View(Ref("a"), rows, cols, stride, self.dtype)
        ins = [full]
        if self.column:
            if self.inputs == 2:
                ins.append(
                    View(Ref("b"), 1 if self.form == "colscalar" else rows, 1, 8, self.dtype)
                )
        elif self.form == "rowbcast":
            ins.append(View(Ref("b"), 1, cols, cols * eb, self.dtype))
        elif self.form:
            ins.append(View(Ref("b"), rows if self.form == "colbcast" else 1, 1, 8, self.dtype))
        elif self.inputs == 2:
            ins.append(View(Ref("b"), rows, cols, cols * eb, self.dtype))
        if self.swap:
            ins.reverse()
        attrs: tuple[tuple[str, float | int | bool | str], ...] = ()
        kind = "gelu" if self.kind == "gelu_tanh" else self.kind
        if kind != self.kind:
            attrs = (("approximate", "tanh"),)
        if self.kind == "pow":
            attrs = (("exponent", POW_EXPONENTS[self.exponent][0]),)
        return MapCall(0, kind, View(Ref("o"), rows, cols, out_stride, self.dtype),
                       tuple(ins), attrs)  # fmt: skip

    def reference(self, args: list[np.ndarray]) -> np.ndarray:
        """The registry's semantics on the operands (flat arrays), rounded to ``dtype``."""
        from ipu_stack.runtime.sim import map_semantics

        call = self.call()
        args = args[::-1] if self.swap else args  # args: the full operand first
        shaped = [a.reshape(v.rows, v.cols) for a, v in zip(args, call.inputs, strict=True)]
        with np.errstate(all="ignore"):
            r = map_semantics(call, shaped)
        return np.asarray(r).astype(args[0].dtype).reshape(-1)


def parse_unary(name: str) -> UnaryUnit | None:
    """The unit ``name`` denotes, or None when the name is not of this family.

    Raises:
        GraphError: a name of this family with an impossible size.
    """
    m = _NAME.match(name)
    if not m:
        return None
    if m["bop"]:
        if m["bop"] in ("add", "mul") and m["form"] == "rowbcast":
            return None  # kernels/units.py
        rows, cols = int(m["r"]), int(m["c"])
        op, swap = m["bop"].lstrip("r"), m["bop"].startswith("r")
        unit = UnaryUnit(name, op, m["bp"], rows * cols, rows=rows, form=m["form"], swap=swap)
        if not 1 <= rows <= MAX_ITEMS or cols <= 0 or (cols * unit.element_bytes) % 8:
            raise GraphError(f"unit {name}: rows 1..{MAX_ITEMS}, rows of a multiple of 8 bytes")
        if cols * unit.element_bytes // 8 > 0xFFFF:
            raise GraphError(f"unit {name}: {cols} columns out of range")
        return unit
    if m["cform"]:
        kind, binary = m["ck"], m["ck"] in BINARY_KINDS
        if (kind == "pow") != bool(m["ce"]) or (m["cform"] == "colscalar" and not binary):
            raise GraphError(f"unit {name}: pow takes an exponent, colscalar a binary kind")
        unit = UnaryUnit(name, kind, m["cp"], int(m["cr"]), exponent=m["ce"] or "",
                         rows=int(m["cr"]), form=m["cform"],
                         out_stride=4 if m["o4"] else 8)  # fmt: skip
        if not 1 <= unit.rows <= MAX_ITEMS:
            raise GraphError(f"unit {name}: rows 1..{MAX_ITEMS}")
        return unit
    if m["tn"]:
        unit = UnaryUnit(name, "gelu_tanh", "f32", int(m["tn"]))
    elif m["e"]:
        unit = UnaryUnit(name, "pow", m["pp"], int(m["pn"]), exponent=m["e"])
    else:
        unit = UnaryUnit(name, m["k"], m["p"], int(m["n"]))
    if unit.count <= 0 or unit.count % 2 or unit.count // 2 > MAX_ITEMS:
        raise GraphError(f"unit {name}: {unit.count} elements must be even, 2..{2 * MAX_ITEMS}")
    return unit


# -- kernel-run ----------------------------------------------------------------------------------
def _operands(unit: UnaryUnit, rng: np.random.Generator) -> list[np.ndarray]:
    dtype = np.dtype(np.float16 if unit.dtype == "f16" else np.float32)
    n = unit.count

    def away_from_zero(size: int) -> np.ndarray:
        return rng.choice([-1.0, 1.0], size) * rng.uniform(0.25, 4, size)

    kind, e = unit.kind, unit.exponent
    if kind.startswith("gelu"):
        a = rng.uniform(-6, 6, n)
    elif kind == "sqrt" or (kind == "pow" and e in ("0p5", "m0p5")):
        a = rng.uniform(0.01, 4, n)
    elif kind in ("reciprocal", "div") or (kind == "pow" and e.startswith("m")):
        a = away_from_zero(n) if kind != "div" else rng.uniform(-2, 2, n)
    else:
        a = (
            rng.uniform(-4, 4, n)
            if kind in ("tanh", "sigmoid", "neg", "relu")
            else rng.uniform(-2, 2, n)
        )
    args = [a.astype(dtype)]
    if unit.column and unit.inputs == 2:
        size = 1 if unit.form == "colscalar" else n
        b = away_from_zero(size) if kind == "div" else rng.uniform(-2, 2, size)
        args.append(b.astype(dtype))
    elif unit.broadcast:
        size = {"colbcast": unit.rows, "scalarbcast": 1, "rowbcast": unit.cols}[unit.form]
        b = away_from_zero(size) if kind == "div" and not unit.swap else rng.uniform(-2, 2, size)
        args.append(b.astype(dtype))
        if kind == "div" and unit.swap:
            args[0] = away_from_zero(n).astype(dtype)
    elif unit.inputs == 2:
        b = away_from_zero(n) if kind == "div" else rng.uniform(-2, 2, n)
        args.append(b.astype(dtype))
    return args


def check(unit: UnaryUnit, args: list[np.ndarray], got: np.ndarray) -> dict[str, Any]:
    """Compare ``got`` with the semantics: F16 within 2 ulp, F32 within 1e-6 relative; GeLU
    also allows the semantics' own rounding of erf (2 f32 ulp at magnitude 1, times |x| / 2)."""
    want = unit.reference(args)
    w64, g64 = want.astype(np.float64), got.astype(np.float64)
    with np.errstate(invalid="ignore"):
        err = np.where(np.isnan(want) & np.isnan(got), 0.0, np.abs(g64 - w64))
    if unit.dtype == "f16":
        scale = np.spacing(np.maximum(np.abs(want), 2.0**-14).astype(np.float16))
        scale = scale.astype(np.float64)  # one ulp
        tol = 2 * scale
    else:
        scale = np.maximum(np.abs(w64), 1e-30)  # relative error
        tol = 1e-6 * scale
    if unit.kind.startswith("gelu"):
        tol = tol + np.abs(args[0].astype(np.float64)) / 2 * 2.0**-23
    used = float(np.nanmax(err / tol)) if err.size else 0.0
    worst = float(np.nanmax(err / scale)) if err.size else 0.0
    ok = bool(used <= 1.0 and not np.any(np.isnan(got) & ~np.isnan(want)))
    key = "worst_ulp" if unit.dtype == "f16" else "worst_relative"
    return {"max_abs_error": float(np.nanmax(err)) if err.size else 0.0, key: worst,
            "tolerance_used": used, "ok": ok}  # fmt: skip


def run_unit(program: Any, unit: UnaryUnit, rng: np.random.Generator) -> dict[str, Any]:
    """kernel-run of one unit: seeded operands at ABI addresses, emulate, compare."""
    from ipu_stack.isa import Tile
    from ipu_stack.kernels.kernel_run import STACK_TOP, _Placer
    from ipu_stack.low import costs

    args = _operands(unit, rng)
    placer = _Placer()
    nbytes = unit.rows * unit.out_stride if unit.column else unit.count * unit.element_bytes
    tile = Tile(program)
    modelled = costs.map_call_cycles(unit.call())
    tile.max_cycles = 200_000 + 40 * modelled
    # the output between two 64-byte guards (60 below an _o4 output); guards above the stack
    # top (the caller's frame)
    guarded = placer.take("standard", nbytes + 2 * GUARD, packed=True)
    out_at = guarded + GUARD
    if unit.out_stride == 4:  # _o4 needs word alignment only: hold it to 4 mod 8
        out_at -= 4
    tile.mem.write(guarded, rng.integers(0, 256, nbytes + 2 * GUARD, dtype=np.uint8), 8)
    tile.mem.write(STACK_TOP, rng.integers(0, 256, GUARD, dtype=np.uint8), 8)
    untouched = [(guarded, out_at - guarded), (out_at + nbytes, GUARD), (STACK_TOP, GUARD)]
    regs = {2: out_at, 11: STACK_TOP}
    for i, a in enumerate(args):
        raw = a.view(np.uint8)
        if unit.column:  # one element per 8-byte row, zero pads (clean padded storage)
            raw = _rows8(raw, unit.element_bytes)
        elif unit.form == "colbcast":  # one value per 8-byte row of the staged column
            if i == 1:
                padded = np.zeros((unit.rows, 8), np.uint8)
                padded[:, : unit.element_bytes] = raw.reshape(unit.rows, -1)
                raw = padded.reshape(-1)
        elif unit.form == "scalarbcast" and i == 1:
            raw = np.concatenate([raw, np.zeros(8 - raw.size, np.uint8)])
        regs[3 + i] = placer.take("standard", raw.size, packed=True)
        tile.mem.write(regs[3 + i], raw, 8)
        untouched.append((regs[3 + i], raw.size))
    before = [tile.mem.read(at, size, 1).copy() for at, size in untouched]
    result = tile.call(unit.entry, regs)
    clobbered = [f"{at:#x}+{size}" for (at, size), old in zip(untouched, before, strict=True)
                 if not np.array_equal(tile.mem.read(at, size, 1), old)]  # fmt: skip
    if unit.column:  # the pads (if the rows have any) must come out as zeros
        raw = tile.mem.read(out_at, nbytes, 4).reshape(unit.rows, unit.out_stride)
        got = raw[:, : unit.element_bytes].copy().reshape(-1).view(args[0].dtype)
        report = check(unit, args, got)
        if raw[:, unit.element_bytes :].any():
            report["ok"], report["pad_error"] = False, "row pads not written as zeros"
    else:
        got = tile.mem.read(out_at, nbytes, 8).view(args[0].dtype).copy()
        report = check(unit, args, got)
    if clobbered:  # an input, a guard beside the output or the caller's stack was written
        report["ok"], report["clobbered"] = False, clobbered
    return {"entry": unit.entry, "elements": unit.count, **report,
            "emulated_cycles": result.cycles, "modelled_cycles": modelled}  # fmt: skip


def _rows8(raw: np.ndarray, element_bytes: int) -> np.ndarray:
    """Elements (bytes) laid out one per 8-byte row, pads zero."""
    rows = np.zeros((raw.size // element_bytes, 8), np.uint8)
    rows[:, :element_bytes] = raw.reshape(-1, element_bytes)
    return rows.reshape(-1)


# -- run --kernels emulate -----------------------------------------------------------------------
#: kinds with f(+0) = +0 (bit pattern zero), so a flat unit may run over padded rows whose
#: input pads are zero: it writes the output pads as zeros, as the semantics do
ZERO_PRESERVING = ("gelu", "tanh", "sqrt", "sub")
ZERO_PRESERVING_POW = ("2", "3", "4", "0p5")


def emulate_job(call: MapCall, address: Any, memory: np.ndarray | None = None) -> tuple | None:
    """(name, source, flags, entry, registers) of the unit for ``call``, or None.

    ``memory`` (the tile's bytes from TILE_MEMORY_BASE) lets a zero-preserving kind run over
    padded rows after checking that the input pads are zero (padded storage is clean, the
    ``View`` invariant); without it padded rows stay modelled.
    """
    out = call.out
    if out.dtype not in ("f16", "f32") or any(v.dtype != out.dtype for v in call.inputs):
        return None
    eb = 2 if out.dtype == "f16" else 4
    n = out.rows * out.cols
    if out.cols == 1 and call.kind in COLUMN_OPS:
        return _one_column_job(call, address)
    if call.kind in ("add", "mul", "sub", "div") and (job := _broadcast_job(call, address, eb)):
        return job
    if call.kind in ("add", "mul"):
        return None  # equal shapes and row vectors: runtime/emulate.py (kernels/units.py)
    if any((v.rows, v.cols) != (out.rows, out.cols) or v.stride != out.stride
           for v in call.inputs):  # fmt: skip
        return None
    if out.stride * out.rows != n * eb:  # padded rows: pads and all, if f(0) = 0 and pads are 0
        if not _padded_ok(call, address, memory, eb):
            return None
        n = out.rows * out.stride // eb
    name = _elementwise_name(call, out.dtype, n)
    if name is None:
        return None
    if name.startswith("gelu_tanh_f16"):
        from ipu_stack.kernels.units import parse_unit

        try:
            tanh_unit = parse_unit(name)
        except GraphError:
            return None
        regs = {2: address(out.ref, n * eb, 8, "gelu output"),
                3: address(call.inputs[0].ref, n * eb, 8, "gelu input")}  # fmt: skip
        return name, tanh_unit.source, tuple(tanh_unit.flags()), tanh_unit.entry, regs
    unit = _parse_or_none(name)
    if unit is None:
        return None
    regs = {2 + i: address(v.ref, n * eb, 8, f"{call.kind} operand {i}")
            for i, v in enumerate((out, *call.inputs))}  # fmt: skip
    return unit.name, unit.source, tuple(unit.flags()), unit.entry, regs


def _elementwise_name(call: MapCall, p: str, n: int) -> str | None:
    kind = call.kind
    if kind == "gelu":
        if dict(call.attrs).get("approximate") == "tanh":
            if p == "f32":
                return f"gelu_tanh_f32_n{n}" if n % 2 == 0 else None
            return f"gelu_tanh_f16_n{n}" if n % 4 == 0 else None
        return f"gelu_{p}_n{n}" if n % 2 == 0 else None
    if n % 2:
        return None
    if kind == "pow":
        e = float(call.attr("exponent"))
        tags = [tag for tag, (value, _) in POW_EXPONENTS.items() if value == e]
        return f"pow_{p}_e{tags[0]}_n{n}" if tags else None
    if kind in UNARY_OPS:
        return f"{kind}_{p}_n{n}"
    return None


def _broadcast_job(call: MapCall, address: Any, eb: int) -> tuple | None:
    """broadcast.S: an [R, C] operand with an [R, 1] column, a [1, 1] scalar or (sub, div) a
    [1, C] row vector, in either order (sub/div with the broadcast operand first: rsub, rdiv)."""
    out, ins = call.out, call.inputs
    if len(ins) != 2 or out.cols == 1:
        return None
    full = [i for i, v in enumerate(ins) if (v.rows, v.cols) == (out.rows, out.cols)]
    if len(full) != 1:
        return None
    a, b = ins[full[0]], ins[1 - full[0]]
    if (out.cols * eb) % 8 or a.stride != out.cols * eb or out.stride != out.cols * eb:
        return None
    if b.cols == 1 and b.rows in (1, out.rows):
        form = "scalarbcast" if b.rows == 1 else "colbcast"
        if form == "colbcast" and b.stride != 8:
            return None
        b_bytes = eb if form == "scalarbcast" else out.rows * 8
    elif b.rows == 1 and b.cols == out.cols and call.kind in ("sub", "div"):
        form, b_bytes = "rowbcast", out.cols * eb
    else:
        return None  # add/mul with a row vector: runtime/emulate.py (kernels/units.py)
    swap = full[0] == 1 and call.kind in ("sub", "div")
    unit = _parse_or_none(f"{'r' if swap else ''}{call.kind}_{out.dtype}_{form}_r{out.rows}"
                       f"_c{out.cols}")  # fmt: skip
    if unit is None:
        return None
    size = out.rows * out.cols * eb
    regs = {2: address(out.ref, size, 8, f"{call.kind} output"),
            3: address(a.ref, size, 8, f"{call.kind} operand"),
            4: address(b.ref, b_bytes, 2 if form != "rowbcast" else 8,
                       f"{call.kind} broadcast operand")}  # fmt: skip
    return unit.name, unit.source, tuple(unit.flags()), unit.entry, regs


def _one_column_job(call: MapCall, address: Any) -> tuple | None:
    """unary.S column form: [R, 1] operands staged one element per 8-byte row (b may be a
    [1, 1] scalar; a scalar first operand of add/mul is swapped, of sub/div stays modelled);
    output rows 8 bytes apart, or 4 (``_o4``: a result written into its consumer's operand)."""
    out, ins = call.out, list(call.inputs)
    if out.stride not in (4, 8) or any(v.cols != 1 or v.stride != 8 for v in ins):
        return None
    if len(ins) == 2 and ins[0].rows != out.rows and call.kind in ("add", "mul"):
        ins.reverse()
    if ins[0].rows != out.rows or (len(ins) == 2 and ins[1].rows not in (1, out.rows)):
        return None
    scalar = len(ins) == 2 and ins[1].rows == 1 and out.rows > 1
    form = "colscalar" if scalar else "col"
    exponent = ""
    if call.kind == "pow":
        e = float(call.attr("exponent"))
        tags = [tag for tag, (value, _) in POW_EXPONENTS.items() if value == e]
        if not tags:
            return None
        exponent = f"_e{tags[0]}"
    if (len(ins) == 2) != (call.kind in BINARY_KINDS):
        return None
    o4 = "_o4" if out.stride == 4 else ""
    unit = _parse_or_none(f"{call.kind}_{out.dtype}{exponent}_{form}_r{out.rows}{o4}")
    if unit is None:
        return None
    regs = {2: address(out.ref, out.rows * out.stride, out.stride, f"{call.kind} output")}
    for i, v in enumerate(ins):
        regs[3 + i] = address(v.ref, v.rows * 8, 8, f"{call.kind} operand {i}")
    return unit.name, unit.source, tuple(unit.flags()), unit.entry, regs


def _parse_or_none(name: str) -> UnaryUnit | None:
    """The unit, or None when its size is beyond the template (the call stays modelled)."""
    try:
        return parse_unary(name)
    except GraphError:
        return None


def _padded_ok(call: MapCall, address: Any, memory: np.ndarray | None, eb: int) -> bool:
    """Whether a flat unit may run over ``call``'s padded rows (see ZERO_PRESERVING)."""
    from ipu_stack.target import ipu21

    out = call.out
    if memory is None or out.stride % 8 or call.kind not in (*ZERO_PRESERVING, "pow"):
        return False
    if call.kind == "pow":
        tags = [t for t, (v, _) in POW_EXPONENTS.items() if v == float(call.attr("exponent"))]
        if not tags or tags[0] not in ZERO_PRESERVING_POW:
            return False
    size = out.rows * out.stride
    for i, v in enumerate(call.inputs):
        start = address(v.ref, size, 8, f"{call.kind} operand {i}") - ipu21.TILE_MEMORY_BASE
        rows = memory[start : start + size].reshape(out.rows, out.stride)
        if rows[:, out.cols * eb :].any():
            return False
    return True

"""Non-GEMM kernel units with device code: names, flags, operands and NumPy semantics.

A unit name fixes everything the template needs (kernels/templates/elementwise.S):
``add_{f16|f32}_n{N}``, ``mul_{f16|f32}_n{N}`` (N elements, N * bytes a multiple of 8),
``copy_b{N}`` (N bytes, a multiple of 4: 32-bit words when not of 8) and ``fill_zero_b{N}``
(N bytes, a multiple of 8); ``copy2d_b{B}_r{R}[_a4]`` (:class:`Copy2dUnit`, the registry's
copy2d: R runs of B bytes at strides passed at run time, 64-bit atoms when B is a multiple of
8 unless ``_a4`` asks for 32-bit words, which need only 4-byte alignment); and
``reduce_add_{f16|f32}_p{P}_n{N}`` (kernels/templates/reduce_add.S: ``out += sum`` of P
partials, f32 sum rounded once, the registry's reduce_add); ``cast_{f16_f32|f32_f16}_n{N}``
(kernels/templates/cast.S, N a multiple of 4; ``dtype`` is the output's);
``{add|mul}_{f16|f32}_rowbcast_r{R}_c{C}`` (kernels/templates/broadcast.S: an [R, C] operand
and a [1, C] row vector); ``gelu_tanh_f16_n{N}`` (kernels/templates/gelu_tanh.S, N a multiple
of 4; semantics :func:`gelu_tanh_reference`, to be registered with the registry's tanh GeLU).
Each unit's semantics are the registry's (``runtime.sim.map_semantics`` for add/mul: f32
arithmetic rounded once; copy and fill move or zero bytes), restated here as NumPy on arrays.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.kernels.registry import ENTRY_PREFIX, TEMPLATE_DIR

ELEMENTWISE_TEMPLATE = TEMPLATE_DIR / "elementwise.S"
_NAME = re.compile(
    r"^(?:(?P<op>add|mul)_(?P<p>f16|f32)_n(?P<n>\d+)|(?P<mv>copy|fill_zero)_b(?P<b>\d+)"
    r"|reduce_add_(?P<rp>f16|f32)_p(?P<parts>\d+)_n(?P<rn>\d+)"
    r"|cast_(?P<cs>f16_f32|f32_f16)_n(?P<cn>\d+)|gelu_tanh_f16_n(?P<gn>\d+)"
    r"|(?P<bop>add|mul)_(?P<bp>f16|f32)_rowbcast_r(?P<br>\d+)_c(?P<bc>\d+))$"
)
BROADCAST_TEMPLATE = TEMPLATE_DIR / "broadcast.S"
GELU_TANH_TEMPLATE = TEMPLATE_DIR / "gelu_tanh.S"
CAST_TEMPLATE = TEMPLATE_DIR / "cast.S"
REDUCE_TEMPLATE = TEMPLATE_DIR / "reduce_add.S"
_OPS = {"add": 1, "mul": 2, "copy": 3, "fill_zero": 4}
MAX_PARTS = 256  # reduce_add partials (more than 6 through an address table)
MAX_ATOMS = 65530  # the workers divide by 6 exactly below 2**16 (elementwise.S)


@dataclass(frozen=True, slots=True)
class ElementwiseUnit:
    """One elementwise compile unit."""

    name: str
    kind: str  # add | mul | copy | fill_zero
    dtype: str  # f16 | f32 | bytes
    count: int  # elements (add/mul/reduce_add) or bytes (copy/fill)
    parts: int = 0  # reduce_add: partial inputs
    rows: int = 1  # row broadcast: rows of the output (count is then the columns)

    @property
    def source(self) -> Path:
        if self.kind == "cast":
            return CAST_TEMPLATE
        if self.kind == "gelu_tanh":
            return GELU_TANH_TEMPLATE
        if self.broadcast:
            return BROADCAST_TEMPLATE
        return REDUCE_TEMPLATE if self.kind == "reduce_add" else ELEMENTWISE_TEMPLATE

    @property
    def dtype_numpy(self) -> str:
        return {"f16": "float16", "f32": "float32"}.get(self.dtype, "uint8")

    @property
    def nbytes(self) -> int:
        """Bytes of the output."""
        return self.rows * self.count * (1 if self.dtype == "bytes" else int(self.dtype[1:]) // 8)

    @property
    def table(self) -> bool:
        """reduce_add with more than six partials: $m3 points at a table of their addresses."""
        return self.kind == "reduce_add" and self.parts > 6

    @property
    def broadcast(self) -> bool:
        return self.kind.endswith("_rowbcast")

    @property
    def entry(self) -> str:
        return f"{ENTRY_PREFIX}{self.name}"

    def flags(self) -> list[str]:
        """The ``-D`` flags specialising the template to this unit."""
        if self.broadcast:
            row_atoms = self.nbytes // self.rows // 8
            out = [f"-DBC_OP={1 if self.kind.startswith('add') else 2}", f"-DBC_ROWS={self.rows}",
                   f"-DBC_ATOMS={row_atoms}", f"-DBC_SYMBOL={self.entry}"]  # fmt: skip
            return [*out, "-DBC_F32=1"] if self.dtype == "f32" else out
        if self.kind == "gelu_tanh":
            return [f"-DGT_GROUPS={self.count // 4}", f"-DGT_SYMBOL={self.entry}"]
        if self.kind == "cast":
            to_f32 = int(self.dtype == "f32")
            return [f"-DCAST_TO_F32={to_f32}", f"-DCAST_GROUPS={self.count // 4}",
                    f"-DCAST_SYMBOL={self.entry}"]  # fmt: skip
        if self.kind == "reduce_add":
            out = [f"-DRA_INPUTS={self.parts}", f"-DRA_ATOMS={self.nbytes // 8}",
                   f"-DRA_SYMBOL={self.entry}"]  # fmt: skip
            if self.table:
                out.append("-DRA_TABLE=1")
            return [*out, "-DRA_F32=1"] if self.dtype == "f32" else out
        if self.kind == "copy" and self.nbytes % 8:  # 32-bit words (EW_OP 5)
            return ["-DEW_OP=5", f"-DEW_ATOMS={self.nbytes // 4}", f"-DEW_SYMBOL={self.entry}"]
        out = [f"-DEW_OP={_OPS[self.kind]}", f"-DEW_ATOMS={self.nbytes // 8}",
               f"-DEW_SYMBOL={self.entry}"]  # fmt: skip
        if self.dtype == "f32":
            out.append("-DEW_F32=1")
        return out

    @property
    def inputs(self) -> int:
        fixed = {"add": 2, "mul": 2, "copy": 1, "fill_zero": 0, "cast": 1, "gelu_tanh": 1,
                 "add_rowbcast": 2, "mul_rowbcast": 2}  # fmt: skip
        return fixed.get(self.kind, self.parts + 1)

    @property
    def input_dtype(self) -> str:
        if self.kind == "cast":
            return "f16" if self.dtype == "f32" else "f32"
        return self.dtype

    def reference(self, args: list[np.ndarray]) -> np.ndarray:
        """NumPy semantics on the operands (arrays of ``dtype``; bytes as uint8)."""
        if self.kind == "copy":
            return args[0].copy()
        if self.kind == "fill_zero":
            return np.zeros(self.count, np.uint8)
        if self.kind == "gelu_tanh":
            return gelu_tanh_reference(args[0])
        if self.broadcast:  # args: a [rows * count], b [count]
            a = args[0].astype(np.float32).reshape(self.rows, self.count)
            b = args[1].astype(np.float32).reshape(1, self.count)
            r = a + b if self.kind.startswith("add") else a * b
            return r.astype(args[0].dtype).reshape(-1)
        if self.kind == "cast":
            return args[0].astype(np.float32).astype(np.dtype(self.dtype_numpy))
        if self.kind == "reduce_add":  # args: the prior output, then the partials
            total = args[0].astype(np.float32)
            for x in args[1:]:
                total += x.astype(np.float32)
            return total.astype(args[0].dtype)
        a, b = (x.astype(np.float32) for x in args)
        r = a + b if self.kind == "add" else a * b
        return r.astype(np.dtype(np.float16 if self.dtype == "f16" else np.float32))


def gelu_tanh_reference(x: np.ndarray) -> np.ndarray:
    """Tanh GeLU in f32, in the device's order, rounded once to ``x``'s dtype.

    ``h + h * tanh(c0 * (x + c1 * x**3))`` with ``h = x / 2``, ``c0 = sqrt(2 / pi)`` and
    ``c1 = 0.044715`` (each operation rounded to f32, as the f32v2 instructions do).
    """
    x32 = x.astype(np.float32)
    c0, c1, half = np.float32(np.sqrt(2 / np.pi)), np.float32(0.044715), np.float32(0.5)
    inner = ((x32 * x32) * x32) * c1 + x32
    t = np.tanh(inner * c0).astype(np.float32)
    h = x32 * half
    return (h + t * h).astype(x.dtype)


def parse_unit(name: str) -> ElementwiseUnit:
    """The unit a name denotes.

    Raises:
        GraphError: the name does not follow the scheme or the size is impossible.
    """
    m = _NAME.match(name)
    if not m:
        raise GraphError(
            f"{name!r} is not an elementwise unit name "
            "(add|mul_{f16|f32}_nN, copy_bN, fill_zero_bN, reduce_add_{f16|f32}_pP_nN, "
            "cast_{f16_f32|f32_f16}_nN, gelu_tanh_f16_nN, {add|mul}_{f16|f32}_rowbcast_rR_cC)"
        )
    if m["bop"]:
        unit = ElementwiseUnit(name, f"{m['bop']}_rowbcast", m["bp"], int(m["bc"]),
                               rows=int(m["br"]))  # fmt: skip
        if unit.rows <= 0 or unit.rows > 65530 or (unit.nbytes // max(unit.rows, 1)) % 8:
            raise GraphError(f"unit {name}: rows 1..65530 and rows of a multiple of 8 bytes")
        if unit.count <= 0 or unit.nbytes // unit.rows // 8 > 0xFFFF:
            raise GraphError(f"unit {name}: {unit.count} columns out of range")
        return unit
    if m["gn"]:
        unit = ElementwiseUnit(name, "gelu_tanh", "f16", int(m["gn"]))
        if unit.count % 4:
            raise GraphError(f"unit {name}: {unit.count} elements must be a multiple of 4")
    elif m["cs"]:
        unit = ElementwiseUnit(name, "cast", m["cs"][4:], int(m["cn"]))
        if unit.count % 4:
            raise GraphError(f"unit {name}: {unit.count} elements must be a multiple of 4")
    elif m["rp"]:
        unit = ElementwiseUnit(name, "reduce_add", m["rp"], int(m["rn"]), int(m["parts"]))
        if not 1 <= unit.parts <= MAX_PARTS:
            raise GraphError(
                f"unit {name}: {unit.parts} partials, the template takes 1..{MAX_PARTS}"
            )
    elif m["op"]:
        unit = ElementwiseUnit(name, m["op"], m["p"], int(m["n"]))
    else:
        unit = ElementwiseUnit(name, m["mv"], "bytes", int(m["b"]))
    if unit.kind == "copy" and unit.nbytes % 8:  # a word copy: 4-byte multiples
        if unit.nbytes % 4 or unit.nbytes // 4 > MAX_ATOMS:
            raise GraphError(
                f"unit {name}: {unit.nbytes} bytes must be a positive multiple of 4, at most "
                f"{MAX_ATOMS * 4}"
            )
        return unit
    if unit.count <= 0 or unit.nbytes % 8 or unit.nbytes // 8 > MAX_ATOMS:
        raise GraphError(
            f"unit {name}: {unit.nbytes} bytes must be a positive multiple of 8, at most "
            f"{MAX_ATOMS * 8}"
        )
    return unit


_COPY2D = re.compile(r"^copy2d_b(?P<b>\d+)_r(?P<r>\d+)(?P<a4>_a4)?$")
MAX_RUNS = (1 << 20) - 1  # run indices and counts are `setzi` immediates (elementwise.S)


@dataclass(frozen=True, slots=True)
class Copy2dUnit:
    """A copy of ``runs`` runs of ``run_bytes`` bytes (registry kernel copy2d, EW_OP 6 or 7 of
    elementwise.S): run ``r`` from ``src + r * src_stride`` to ``dst + r * dst_stride``, the
    strides (bytes) passed at run time in ``$m7`` and ``$m6``."""

    name: str
    run_bytes: int
    runs: int
    words: bool  # 32-bit words (EW_OP 7): 4-byte alignment; else 64-bit atoms (EW_OP 6)

    @property
    def source(self) -> Path:
        return ELEMENTWISE_TEMPLATE

    @property
    def entry(self) -> str:
        return f"{ENTRY_PREFIX}{self.name}"

    @property
    def alignment(self) -> int:
        """Bytes the addresses and strides must be multiples of."""
        return 4 if self.words else 8

    def flags(self) -> list[str]:
        atoms = self.run_bytes // self.alignment
        return [f"-DEW_OP={7 if self.words else 6}", f"-DEW_ATOMS={atoms}",
                f"-DEW_RUNS={self.runs}", f"-DEW_SYMBOL={self.entry}"]  # fmt: skip

    def extents(self, dst_stride: int, src_stride: int) -> tuple[int, int]:
        """Bytes from the destination and from the source to the end of their last run."""
        last = self.runs - 1
        return last * dst_stride + self.run_bytes, last * src_stride + self.run_bytes

    def reference(self, dst: np.ndarray, src: np.ndarray, dst_stride: int,
                  src_stride: int) -> np.ndarray:  # fmt: skip
        """The destination's bytes after the copy (runtime.sim's CopyCall semantics): ``dst``
        and ``src`` are the uint8 extents from the two addresses; gaps keep their bytes."""
        if dst_stride < self.run_bytes:
            raise GraphError(f"{self.name}: destination stride {dst_stride} < run bytes")
        out = dst.copy()
        cols = np.arange(self.run_bytes)
        rows = np.arange(self.runs)[:, None]
        out[rows * dst_stride + cols] = src[rows * src_stride + cols]
        return out


def parse_copy2d(name: str) -> Copy2dUnit | None:
    """The copy2d unit ``name`` denotes, or None when it is not a copy2d name.

    Raises:
        GraphError: a copy2d name with an impossible size.
    """
    m = _COPY2D.match(name)
    if not m:
        return None
    b, r = int(m["b"]), int(m["r"])
    unit = Copy2dUnit(name, b, r, bool(m["a4"]) or b % 8 != 0)
    if b <= 0 or b % 4 or b // unit.alignment > MAX_ATOMS:
        raise GraphError(
            f"unit {name}: {b} bytes per run must be a positive multiple of 4, at most "
            f"{MAX_ATOMS} atoms of {unit.alignment} bytes"
        )
    if not 1 <= r <= MAX_RUNS:
        raise GraphError(f"unit {name}: {r} runs, the template takes 1..{MAX_RUNS}")
    return unit

"""Instructions of the integer, indexing and rearrangement kernels (one function per family).

Sub-word loads (``ldz8``, ``ldz16``, ``lds8``, ``lds16`` and their ``step`` forms; Tile
Vertex ISA: zero- or sign-extended, naturally aligned, MRF destinations), ``clz`` and
``trap``. :data:`OPS` is merged into :data:`ipu_stack.isa.ops.OPS`; rules public
documentation leaves open are rows of :mod:`ipu_stack.isa.assumptions` (``trap_*``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ipu_stack.isa import assumptions
from ipu_stack.isa.program import Instr
from ipu_stack.isa.state import MASK32, Context, Fault, mreg, operand_value, signed32

if TYPE_CHECKING:
    from ipu_stack.isa.machine import Tile
    from ipu_stack.isa.ops import Effects, Op

#: the registers a trap reports (assumption trap_reports)
TRAP_REGISTERS: tuple[str, ...] = tuple(assumptions.value("trap_reports"))  # type: ignore[arg-type]


class Trap(Fault):
    """``trap zimm4`` executed: the tile stops; the code and reported registers are kept."""

    def __init__(self, message: str, code: int, registers: dict[str, int]) -> None:
        super().__init__(message)
        self.code = code
        self.registers = registers


_SUBWORD = {"ldz8": (1, False), "lds8": (1, True), "ldz16": (2, False), "lds16": (2, True)}


def op_subword_load(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    """ldz8/lds8/ldz16/lds16 (base + delta + offset x size) and their step forms (delta
    post-incremented by the signed immediate or stride register, scaled to the size)."""
    name = ins.mnemonic
    width, signed = _SUBWORD[name.removesuffix("step")]
    dst, base_text, delta_text = ins.operands[:3]
    base = c.m[mreg(base_text)]
    delta = c.m[mreg(delta_text)]
    if name.endswith("step"):
        address = (base + delta) & MASK32
        inc = signed32(operand_value(c, ins, 3))
        e.m.append((c, mreg(delta_text), delta + inc * width))
    else:  # the offset is unsigned (zimm12 or a register)
        address = (base + delta + operand_value(c, ins, 3) * width) & MASK32
    raw = t.mem.read(address, width)
    value = int(raw.view(np.uint8 if width == 1 else np.uint16)[0])
    if signed and value >> (8 * width - 1):
        value -= 1 << (8 * width)
    e.m.append((c, mreg(dst), value & MASK32))


def op_clz(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    """clz $mDst, $mSrc: leading zero bits of the 32-bit source (32 for zero)."""
    v = c.m[mreg(ins.operands[1])] & MASK32
    e.m.append((c, mreg(ins.operands[0]), 32 - v.bit_length()))


def op_trap(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    """trap zimm4: raise an exception event; the registers of assumption trap_reports are
    kept for the host (the caller turns them into the error the semantics raise)."""
    code = operand_value(c, ins, 0)
    regs = {name: c.m[mreg(name)] for name in TRAP_REGISTERS}
    shown = ", ".join(f"{k}={signed32(v)}" for k, v in regs.items())
    raise Trap(f"trap {code} ({shown})", code, regs)


OPS: dict[str, Op] = {
    **{name: op_subword_load for name in _SUBWORD},
    **{f"{name}step": op_subword_load for name in _SUBWORD},
    "trap": op_trap,
    "clz": op_clz,
}

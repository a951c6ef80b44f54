"""Instruction semantics for the unary and broadcast elementwise templates (``unary.S``,
``gelu_erf.S``, the column form of ``broadcast.S``): vector compares, 64-bit ARF bitwise
logic, the scalar f32 sigmoid, and the 16-bit load-and-broadcast ``ldb16``/``ldb16step``.

Mnemonics and operand forms are those of the public Tile Vertex ISA (hover text of
``graphcore/ipu_assembly_support``); what it does not say (compare masks, rounding and
accuracy of the scalar functions, NaN handling of min/max) is a row of
:mod:`ipu_stack.isa.assumptions` (``compare_mask``,
``exp_sigmoid_accuracy``, ``ldb16_offset_units``). Merged into :data:`ipu_stack.isa.ops.OPS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ipu_stack.isa.state import MASK32, areg, mreg

if TYPE_CHECKING:
    from ipu_stack.isa.machine import Tile
    from ipu_stack.isa.program import Instr
    from ipu_stack.isa.state import Context


def _words(c: Context, text: str, n: int) -> np.ndarray:
    if text in ("$azero", "$azeros"):
        return np.zeros(n, np.uint32)
    return c.a[areg(text) : areg(text) + n].copy()


_CMP: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "f32v2cmplt": np.less,
    "f32v2cmple": np.less_equal,
    "f32v2cmpgt": np.greater,
    "f32v2cmpge": np.greater_equal,
    "f32v2cmpeq": np.equal,
    "f32v2cmpne": np.not_equal,
}

_BITS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "and64": np.bitwise_and,
    "andc64": lambda a, b: np.bitwise_and(a, np.bitwise_not(b)),
    "or64": np.bitwise_or,
}


def op_compare(t: Tile, c: Context, ins: Instr, e: Any) -> None:
    """f32v2cmpXX: each lane all ones when true, zero when false (assumption compare_mask)."""
    a = _words(c, ins.operands[1], 2).view(np.float32)
    b = _words(c, ins.operands[2], 2).view(np.float32)
    r = np.where(_CMP[ins.mnemonic](a, b), np.uint32(MASK32), np.uint32(0)).astype(np.uint32)
    e.a.append((c, areg(ins.operands[0]), r))


def op_bits64(t: Tile, c: Context, ins: Instr, e: Any) -> None:
    """and64 / andc64 / or64 of two ARF pairs."""
    a = _words(c, ins.operands[1], 2)
    b = _words(c, ins.operands[2], 2)
    e.a.append((c, areg(ins.operands[0]), _BITS[ins.mnemonic](a, b).astype(np.uint32)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


# f32exp, f32sqrt and f32oox are isa/ops.py's (op_f32_unary), f32div and the vector
# sub/min/max its op_vector: one definition of each instruction for every template.
_SCALAR1: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "f32sigm": _sigmoid,
}


def op_scalar(t: Tile, c: Context, ins: Instr, e: Any) -> None:
    """f32sigm $aD, $aS: the exact function rounded once to f32 (exp_sigmoid_accuracy)."""
    x = _words(c, ins.operands[1], 1).view(np.float32)
    with np.errstate(all="ignore"):
        r = _SCALAR1[ins.mnemonic](x).astype(np.float32)
    e.a.append((c, areg(ins.operands[0]), r.view(np.uint32)))


def op_ldb16(t: Tile, c: Context, ins: Instr, e: Any) -> None:
    """ldb16 / ldb16step: one naturally aligned 16-bit load, duplicated into both halves of
    an ARF register (Tile Vertex ISA ldb16). The offset / increment counts 16-bit atoms."""
    reg, base_text, delta_text = ins.operands[:3]
    base = c.m[mreg(base_text)]
    delta = c.m[mreg(delta_text)]
    text = ins.operands[3]
    step = c.m[mreg(text)] if text.startswith("$") else (ins.imms[3] or 0)
    step = step - (1 << 32) if step & 0x80000000 else step
    if ins.mnemonic == "ldb16step":
        address = (base + delta) & MASK32
        e.m.append((c, mreg(delta_text), delta + step * 2))
    else:
        address = (base + delta + step * 2) & MASK32
    raw = t.mem.read(address, 2, 2).view(np.uint16)
    word = np.array([int(raw[0]) | (int(raw[0]) << 16)], np.uint32)
    e.a.append((c, areg(reg), word))


OPS_UNARY: dict[str, Callable[..., None]] = {
    **{name: op_compare for name in _CMP},
    **{name: op_bits64 for name in _BITS},
    **{name: op_scalar for name in _SCALAR1},
    "ldb16": op_ldb16,
    "ldb16step": op_ldb16,
}

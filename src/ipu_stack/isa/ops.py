"""Instruction semantics of the ISA emulator: one function per instruction family.

In the style of tinygrad's ``ops_python``: a table maps each mnemonic to the function of its
family. A function reads registers and memory *now* and records its effects in a
:class:`Effects`; the machine commits a bundle's effects after both of its instructions have
read (assumption ``bundle_read_before_write``). Numbers that public documentation does not
give come from :mod:`ipu_stack.isa.assumptions`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from ipu_stack.isa import assumptions
from ipu_stack.isa.ops_unary import OPS_UNARY
from ipu_stack.isa.program import Instr
from ipu_stack.isa.state import (
    CSR_FP_INFMT,
    CSR_FP_ISCL,
    CSR_INDEX,
    MASK32,
    Context,
    Fault,
    areg,
    csr_index,
    element,
    mpair,
    mreg,
    operand_value,
    require_interleaved,
    signed32,
)

if TYPE_CHECKING:
    from ipu_stack.isa.machine import Tile

F143 = np.dtype(ml_dtypes.float8_e4m3fnuz)
_PHASES: dict[int, int] = dict(assumptions.value("amp_phase_flags"))  # type: ignore[call-overload]
_CWEI_ORDER: tuple[int, ...] = tuple(assumptions.value("cwei_slot_order"))  # type: ignore[arg-type]
#: panel word n lives in CWEI slot _PANEL_SLOT[n] (assumption cwei_slot_order)
PANEL_SLOT = np.array([_CWEI_ORDER[n // 8] + n % 8 for n in range(64)])


@dataclass(slots=True)
class Effects:
    """Deferred effects of one bundle."""

    m: list[tuple[Context, int, int]] = field(default_factory=list)
    a: list[tuple[Context, int, np.ndarray]] = field(default_factory=list)  # first reg, words
    mem: list[tuple[int, np.ndarray]] = field(default_factory=list)
    jump: int | None = None

    def commit(self, tile: Tile) -> None:
        for ctx, i, v in self.m:
            if i != 15:
                ctx.m[i] = v & MASK32
        for ctx, i, words in self.a:
            if i != 15:
                ctx.a[i : i + len(words)] = words
        for address, raw in self.mem:
            tile.mem.write(address, raw)


Op = Callable[["Tile", Context, Instr, Effects], None]


def _a_words(c: Context, text: str, n: int) -> np.ndarray:
    if text in ("$azero", "$azeros"):
        return np.zeros(n, np.uint32)
    return c.a[areg(text) : areg(text) + n].copy()


# -- integer ALU -------------------------------------------------------------------------------
_ALU: dict[str, Callable[[int, int], int]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
    "shl": lambda a, b: a << (b & 31),
    "shr": lambda a, b: (a & MASK32) >> (b & 31),
    "shrs": lambda a, b: signed32(a) >> (b & 31),
    "mul": lambda a, b: signed32(a) * signed32(b),
    "min": lambda a, b: min(signed32(a), signed32(b)),
    "max": lambda a, b: max(signed32(a), signed32(b)),
    "cmpult": lambda a, b: int((a & MASK32) < (b & MASK32)),
    "cmpslt": lambda a, b: int(signed32(a) < signed32(b)),
    "cmpeq": lambda a, b: int((a & MASK32) == (b & MASK32)),
    "cmpne": lambda a, b: int((a & MASK32) != (b & MASK32)),
}


def op_alu(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    a = c.m[mreg(ins.operands[1])]
    e.m.append((c, mreg(ins.operands[0]), _ALU[ins.mnemonic](a, operand_value(c, ins, 2))))


def op_set(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    dst = ins.operands[0]
    value = 0 if ins.mnemonic == "zero" else operand_value(c, ins, 1)
    if dst.startswith("$a"):
        e.a.append((c, areg(dst), np.array([value], np.uint32)))
    else:
        e.m.append((c, mreg(dst), value))


# -- control -----------------------------------------------------------------------------------
def op_branch(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    name = ins.mnemonic
    if name == "br":
        e.jump = c.m[mreg(ins.operands[0])]
        return
    if name == "bri":
        e.jump = operand_value(c, ins, 0)
        return
    value = c.m[mreg(ins.operands[0])]
    if (value == 0) == (name == "brz"):
        e.jump = operand_value(c, ins, 1)


def op_nop(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    return None


def op_rpt(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    t.start_repeat(c, ins, operand_value(c, ins, 0), operand_value(c, ins, 1))


def op_worker_control(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    name = ins.mnemonic
    if name == "exitz":
        t.exit_worker(c)
    elif name == "sync":
        t.sync(c, operand_value(c, ins, 0))
    else:  # run, runall
        entry, base = c.m[mreg(ins.operands[0])], c.m[mreg(ins.operands[1])]
        t.launch(name, entry, base, operand_value(c, ins, 2))


# -- CSRs --------------------------------------------------------------------------------------
def op_csr(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    name = ins.mnemonic
    if name in ("get", "uget"):
        index = csr_index(ins.operands[1], ins.imms[1])
        value = t.read_csr(c, index)
        dst = ins.operands[0]
        if dst.startswith("$a"):
            e.a.append((c, areg(dst), np.array([value], np.uint32)))
        else:
            e.m.append((c, mreg(dst), value))
        return
    index = csr_index(ins.operands[0], ins.imms[0])
    src = ins.operands[1]
    value = int(c.a[areg(src)]) if src.startswith("$a") else c.m[mreg(src)]
    t.write_csr(c, index, value)


# -- loads and stores ---------------------------------------------------------------------------
def _width(name: str) -> int:
    return 16 if "128" in name else 8 if "64" in name else 4


def op_load_store(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    """ld32/st32 (MRF or ARF), ld64/st64, ld128, ld64step/st64step/ld32step/st32step."""
    name = ins.mnemonic
    width = _width(name)
    reg, base_text, delta_text = ins.operands[:3]
    base = c.m[mreg(base_text)]
    delta = c.m[mreg(delta_text)]
    if name.endswith("step"):
        address = (base + delta) & MASK32
        inc = operand_value(c, ins, 3)
        e.m.append((c, mreg(delta_text), delta + signed32(inc) * width))
    else:
        address = (base + delta + signed32(operand_value(c, ins, 3)) * width) & MASK32
    if width == 16:
        require_interleaved(address, name)
    words = width // 4
    if name.startswith("ld"):
        raw = t.mem.read(address, width).view(np.uint32).copy()
        if reg.startswith("$a"):
            e.a.append((c, areg(reg), raw))
        else:
            e.m.append((c, mreg(reg), int(raw[0])))
        return
    if reg.startswith("$a"):
        data = _a_words(c, reg, words)
    else:
        data = np.array([c.m[mreg(reg)]], np.uint32)
    t.mem.read(address, width)  # bounds and alignment now
    e.mem.append((address, data.view(np.uint8)))


def tapack(a0: int, a1: int, a2: int) -> tuple[int, int]:
    """Pack three 21-bit addresses into a register pair (assumption tapack_layout)."""
    for a in (a0, a1, a2):
        if not 0 <= a < 1 << 21:
            raise Fault(f"tapack address {a:#x} does not fit 21 bits")
    lo = a0 | ((a2 & 0x7FF) << 21)
    hi = a1 | ((a2 >> 11) << 21)
    return lo & MASK32, hi & MASK32


def untapack(lo: int, hi: int) -> tuple[int, int, int]:
    return lo & 0x1FFFFF, hi & 0x1FFFFF, (lo >> 21) | ((hi >> 21) << 11)


def op_tapack(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    d = mpair(ins.operands[0])
    lo, hi = tapack(*(c.m[mreg(x)] for x in ins.operands[1:4]))
    e.m += [(c, d, lo), (c, d + 1, hi)]


def _pace_step(code: int, stride: int) -> int:
    if code == 0:
        return 8
    if code == 3:
        return 0
    field_ = (stride >> (10 * (code - 1))) & 0x3FF
    return (field_ - 0x400 if field_ & 0x200 else field_) * 8


# which packed addresses each pace instruction uses: (loads, stores)
_PACE = {
    "ld2x64pace": ((0, 1), ()),
    "ld2xst64pace": ((0, 1), (2,)),
    "ldst64pace": ((0,), (2,)),
    "st64pace": ((), (2,)),
}


def op_pace(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    """The triple-packed-address loads and stores (facts §16.3)."""
    name = ins.mnemonic
    loads, stores = _PACE[name]
    ops = ins.operands
    addr_text = ops[-3]
    p = mpair(addr_text)
    addrs = list(untapack(c.m[p], c.m[p + 1]))
    stride = c.m[mreg(ops[-2])]
    code = operand_value(c, ins, len(ops) - 1)
    used = [*loads, *stores]
    elements = [element(addrs[i]) for i in used]
    named = [x for x in elements if x is not None]
    if len(set(named)) < len(named):
        where = ", ".join(f"{addrs[i]:#x}" for i in used)
        raise Fault(f"{name} accesses {where} hit one standard 16 KiB element in one cycle")
    if name == "ld2x64pace":
        if ops[0] == ops[1]:
            raise Fault("ld2x64pace destination pairs must differ")
        dests = [areg(ops[0]), areg(ops[1])]
    elif name == "ld2xst64pace":
        dests = [areg(ops[0]), areg(ops[0]) + 2]
    else:
        dests = [areg(ops[0])]
    for n, i in enumerate(loads):
        raw = t.mem.read(addrs[i], 8).view(np.uint32).copy()
        if ops[0] != "$azeros":
            e.a.append((c, dests[n], raw))
    if stores:
        data = _a_words(c, ops[len(ops) - 4], 2)
        t.mem.read(addrs[2], 8)
        e.mem.append((addrs[2], data.view(np.uint8)))
    for n, i in enumerate(used):
        addrs[i] = (addrs[i] + _pace_step((code >> (2 * n)) & 3, stride)) & 0x1FFFFF
    lo, hi = tapack(*addrs)
    e.m += [(c, p, lo), (c, p + 1, hi)]


def op_putcs(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    """ld64putcs / ld128putcs: coefficient-store loads from $CCCSLOAD (post-incremented)."""
    width = 16 if ins.mnemonic == "ld128putcs" else 8
    slot = operand_value(c, ins, 0)
    t.require_workers_idle(ins.mnemonic)
    address = t.csr.get(CSR_INDEX["CCCSLOAD"], 0)
    if width == 16:
        require_interleaved(address, "ld128putcs")
        if slot % 2:
            raise Fault(f"ld128putcs slot {slot} must be even")
    raw = t.mem.read(address, width)
    t.cwei[slot * 8 : slot * 8 + width] = raw
    t.cwei_version += 1
    t.csr[CSR_INDEX["CCCSLOAD"]] = (address + width) & MASK32


# -- AMP ----------------------------------------------------------------------------------------
def op_amp(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    """f16v4hihov4amp / f8v8hihov4amp (facts §16.3; dataflow assumptions amp_*)."""
    fp8 = ins.mnemonic.startswith("f8")
    flags = operand_value(c, ins, 3)
    if flags not in _PHASES:
        raise Fault(f"{ins.mnemonic} flags {flags} name no AMP phase")
    phase = _PHASES[flags]
    infmt = t.csr.get(CSR_FP_INFMT, 0)
    if infmt != (3 if fp8 else 0):
        raise Fault(f"{ins.mnemonic} with FP_INFMT = {infmt}")
    weights = t.weights(fp8)
    x_raw = _a_words(c, ins.operands[1], 2)
    part = _a_words(c, ins.operands[2], 2).view(np.float16).astype(np.float32)
    if fp8:
        x = x_raw.view(np.uint8).view(F143).astype(np.float32)
        rows = weights[8 * phase : 8 * phase + 8]
        scale = np.float32(2.0 ** signed32(t.csr.get(CSR_FP_ISCL, 0)))
        products = (x @ rows) * scale
    else:
        x = x_raw.view(np.float16).astype(np.float32)
        products = x @ weights[4 * phase : 4 * phase + 4]
    out = c.acc_done[0][4 * phase : 4 * phase + 4].astype(np.float16)
    c.acc_cur = c.acc_cur + products
    c.acc_cur[4 * phase : 4 * phase + 4] += part
    if phase == 3:  # the row is complete: it leaves amp_pipeline_rows rows later
        c.acc_done.append(c.acc_cur)
        c.acc_done.popleft()
        c.acc_cur = np.zeros(16, np.float32)
    e.a.append((c, areg(ins.operands[0]), out.view(np.uint32)))


# -- vector arithmetic ---------------------------------------------------------------------------
_VEC = {
    "f16v4add": (np.float16, 2, np.add),
    "f16v4mul": (np.float16, 2, np.multiply),
    "f32v2add": (np.float32, 2, np.add),
    "f32v2mul": (np.float32, 2, np.multiply),
    "f16v2add": (np.float16, 1, np.add),
    "f16v2mul": (np.float16, 1, np.multiply),
    "f32add": (np.float32, 1, np.add),
    "f32mul": (np.float32, 1, np.multiply),
    "f32sub": (np.float32, 1, np.subtract),
    "f32v2sub": (np.float32, 2, np.subtract),
    "f16v4sub": (np.float16, 2, np.subtract),
    "f32max": (np.float32, 1, np.maximum),
    "f32v2max": (np.float32, 2, np.maximum),
    "f32v2min": (np.float32, 2, np.minimum),
    "f32div": (np.float32, 1, np.divide),
}


def _vec_operand(c: Context, text: str, words: int) -> np.ndarray:
    """Source words of a vector instruction; ``$aN:B`` repeats one word in every lane."""
    if text.endswith(":B"):
        return np.repeat(_a_words(c, text[:-2], 1), words)
    return _a_words(c, text, words)


def op_vector(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    """Elementwise F16/F32 add, sub, mul, min, max and f32div, rounded to nearest even
    (assumptions vector_rounding, min_max_nan, f32_divide_sqrt_rounding)."""
    dtype, words, fn = _VEC[ins.mnemonic]
    a = _vec_operand(c, ins.operands[1], words).view(dtype)
    b = _vec_operand(c, ins.operands[2], words).view(dtype)
    with np.errstate(all="ignore"):
        r = fn(a.astype(np.float32), b.astype(np.float32)).astype(dtype)
    e.a.append((c, areg(ins.operands[0]), r.view(np.uint32)))


def op_convert(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    """f16v2tof32 ($aD:D+1 <- two halves of $aS), f32v2tof16 ($aD <- $aS:S+1)."""
    if ins.mnemonic == "f16v2tof32":
        r = _a_words(c, ins.operands[1], 1).view(np.float16).astype(np.float32)
    else:
        with np.errstate(all="ignore"):
            r = _a_words(c, ins.operands[1], 2).view(np.float32).astype(np.float16)
    e.a.append((c, areg(ins.operands[0]), r.view(np.uint32)))


_TRANSCENDENTAL = {"f32tanh": np.tanh}
# rules these implementations follow (assumptions.py); a changed value fails here, not silently
for _key, _supported in (("vector_broadcast_operand", "lane-repeat"),
                         ("transcendental_accuracy", "numpy-f32"),
                         ("long_latency_single_issue", True)):  # fmt: skip
    if assumptions.value(_key) != _supported:
        raise NotImplementedError(f"the emulator implements {_key} = {_supported!r} only")


def op_transcendental(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    """f32tanh of one f32 (assumption transcendental_accuracy)."""
    x = _a_words(c, ins.operands[1], 1).view(np.float32)
    with np.errstate(all="ignore"):
        r = _TRANSCENDENTAL[ins.mnemonic](x).astype(np.float32)
    e.a.append((c, areg(ins.operands[0]), r.view(np.uint32)))


OPS: dict[str, Op] = {
    **{name: op_alu for name in _ALU},
    "setzi": op_set,
    "zero": op_set,
    **{name: op_branch for name in ("br", "bri", "brz", "brnz")},
    "nop": op_nop,
    "fnop": op_nop,
    "rpt": op_rpt,
    **{name: op_worker_control for name in ("exitz", "sync", "run", "runall")},
    **{name: op_csr for name in ("get", "put", "uget", "uput")},
    **{name: op_load_store for name in ("ld32", "st32", "ld64", "st64", "ld128", "ld64step",
                                          "st64step", "ld32step", "st32step")},
    "tapack": op_tapack,
    **{name: op_pace for name in _PACE},
    "ld64putcs": op_putcs,
    "ld128putcs": op_putcs,
    "f16v4hihov4amp": op_amp,
    "f8v8hihov4amp": op_amp,
    **{name: op_vector for name in _VEC},
    "f16v2tof32": op_convert,
    "f32v2tof16": op_convert,
    "f32tanh": op_transcendental,
}  # fmt: skip

# -- f32 functions of one register (layer norm, softmax, attention, GeLU) -----------------------
for _key, _supported in (("f32exp_accuracy", "numpy-f32"), ("min_max_nan", "propagate"),
                         ("f32_divide_sqrt_rounding", "correctly rounded")):  # fmt: skip
    if assumptions.value(_key) != _supported:
        raise NotImplementedError(f"the emulator implements {_key} = {_supported!r} only")


def _reciprocal(x: np.ndarray) -> np.ndarray:
    return np.float32(1.0) / x


#: f32 functions of one register (assumptions f32exp_accuracy, f32_divide_sqrt_rounding)
_UNARY_F32: dict[str, Callable[[np.ndarray], Any]] = {
    "f32exp": np.exp,
    "f32oox": _reciprocal,
    "f32sqrt": np.sqrt,
}


def op_f32_unary(t: Tile, c: Context, ins: Instr, e: Effects) -> None:
    """f32exp / f32oox (1/x) / f32sqrt of one f32 register."""
    x = _a_words(c, ins.operands[1], 1).view(np.float32)
    with np.errstate(all="ignore"):
        r = np.asarray(_UNARY_F32[ins.mnemonic](x), np.float32)
    e.a.append((c, areg(ins.operands[0]), r.view(np.uint32)))


OPS.update({name: op_f32_unary for name in _UNARY_F32})

#: instructions that may not appear in a rpt body (facts §16.3 rpt: control and system)
CONTROL = {"br", "bri", "brz", "brnz", "rpt", "exitz", "sync", "run", "runall", "put", "uput",
           "get", "uget"}  # fmt: skip

# the integer, indexing and rearrangement kernels' instructions (isa/ops_indexing.py)
from ipu_stack.isa.ops_indexing import OPS as _INDEXING_OPS  # noqa: E402

OPS.update(_INDEXING_OPS)
# unary / broadcast elementwise templates (compares, ARF bitwise logic, f32sigm, ldb16):
# isa/ops_unary.py
OPS.update(OPS_UNARY)

"""The IPU21 instruction subset our templates use: mnemonics, operand forms, contexts.

Operand forms follow the syntax in facts §16.3 (from ``graphcore/ipu_assembly_support``) and
the reference implementation's printed source (seed log). Each form is a list of operand
kinds; an instruction accepts any of its forms. This is a checker for our templates, not a
full assembler: instructions outside the table are reported as unknown, so a template that
needs a new instruction adds it here (with its source) first.

Operand kinds:
    m      MRF register ($m0-$m15 and aliases)       a     ARF register ($a0-$a15, $azero)
    a2     ARF pair $aN:N+1, N even, or $azeros      a4    ARF quad $aN:N+3, N % 4 == 0
    aB     one ARF register broadcast to both lanes ($aN:B)
    m2     MRF pair $mN:N+1, N even                  m2+=  the same, post-incremented
    m+=    MRF register, post-incremented            csr   a CSR name or an index expression
    i      immediate expression (may name labels)    mi    m or i
    ma     m or a
Immediate ranges, where the facts give them, are checked as ``(kind, low, high)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MRF_ALIASES = {"$mzero": 15, "$mvertex_base": 13, "$mworker_base": 12, "$sp": 11, "$lr": 10,
               "$fp": 9}  # fmt: skip
ARF_ALIASES = {"$azero": 15}
ARF_PAIR_ALIASES = {"$azeros"}

# facts §6 (indices where given); names are what the assembler accepts after `$`.
CSRS = {
    "CR", "FP_ICTL", "CCCSLOAD", "CTXT_STS", "WSR", "VERTEX_BASE", "REPEAT_COUNT", "FP_CLR",
    "TAS", "FP_CTL", "SSR",
    *(f"WORKER{i}_BASE" for i in range(6)),
    "INCOMING_MUX", "INCOMING_MUXPAIR", "INCOMING_DELTA", "INCOMING_FORMAT", "INCOMING_BASE",
    "INCOMING_SINIT", "INCOMING_DCOUNT", "OUTGOING_BASE", "OUTGOING_DELTA", "EXCHANGE_CTL",
    "ANS_DCOUNT", "EXCHANGE_ADJ",
}  # fmt: skip

SUPERVISOR = "supervisor"
WORKER = "worker"
ANY = "any"


@dataclass(frozen=True, slots=True)
class Instruction:
    mnemonic: str
    forms: tuple[tuple[object, ...], ...]
    context: str = ANY  # supervisor | worker | any
    source: str = ""


def _i(*forms: tuple[object, ...], context: str = ANY, source: str = "") -> tuple:
    return forms, context, source


_ALU = (("m", "m", "mi"),)
_TABLE: dict[str, tuple] = {
    # integer and control (main pipeline), facts §16.3 and the seed log
    **{op: _i(*_ALU) for op in ("add", "sub", "and", "or", "xor", "shl", "shr", "shrs", "mul",
                                "min", "max", "cmpult", "cmpslt", "cmpeq", "cmpne")},
    "zero": _i(("m",)),
    "setzi": _i(("ma", ("i", 0, (1 << 20) - 1)), source="facts §16.3 setzi zimm20"),
    "brz": _i(("m", "i")),
    "brnz": _i(("m", "i"), source="facts §16.3 brnz"),
    "bri": _i(("i",)),
    "br": _i(("m",)),
    "get": _i(("m", "csr")),
    "put": _i(("csr", "m"), source="facts §16.3 put"),
    "uget": _i(("a", "csr"), context=WORKER),
    "uput": _i(("csr", "a"), context=WORKER, source="facts §6 $FP_CLR via uput"),
    "ld32": _i(("m", "m", "m", "mi"), ("a", "m", "m", "mi")),
    "st32": _i(("m", "m", "m", "mi"), ("a", "m", "m", "mi")),
    "ld64": _i(("a2", "m", "m", "mi"), context=WORKER),
    "st64": _i(("a2", "m", "m", "mi"), context=WORKER),
    "ld64step": _i(("a2", "m", "m+=", "mi"), context=WORKER, source="facts §16.3"),
    "ld32step": _i(("m", "m", "m+=", "mi"), ("a", "m", "m+=", "mi"), context=WORKER,
                   source="facts §16.3 (ld64step); Tile Vertex ISA ld32step $aDst0"),
    "st32step": _i(("a", "m", "m+=", "mi"), context=WORKER, source="Tile Vertex ISA st32step"),
    "st64step": _i(("a2", "m", "m+=", "mi"), context=WORKER, source="facts §16.3 (ld64step)"),
    **{op: _i(("a2", "a2", "a2"), context=WORKER, source="Tile Vertex ISA vector arithmetic")
       for op in ("f16v4add", "f16v4mul", "f32v2add", "f32v2mul")},
    # the scalar-broadcast form `$aSrc0:B` of f32v2mul/f32v2sub (Tile Vertex ISA syntax)
    "f32v2mul": _i(("a2", "a2", "a2"), ("a2", "aB", "a2"), context=WORKER,
                   source="Tile Vertex ISA f32v2mul (two forms)"),
    **{op: _i(("a", "a", "a"), context=WORKER, source=f"Tile Vertex ISA {op} (scalar f32)")
       for op in ("f32add", "f32mul", "f32sub", "f32max", "f32div")},
    **{op: _i(("a", "a"), context=WORKER, source=f"Tile Vertex ISA {op} $aDst0, $aSrc0")
       for op in ("f32exp", "f32oox", "f32sqrt", "f32sigm")},
    "f16v2tof32": _i(("a2", "a"), context=WORKER, source="Tile Vertex ISA conversions"),
    "f32tanh": _i(("a", "a"), context=WORKER, source="Graphcore LLVM fork llvm.colossus.tanh.f32"),
    "f32v2tof16": _i(("a", "a2"), context=WORKER, source="Tile Vertex ISA conversions"),
    "ld128": _i(("a4", "m", "m", "mi"), context=WORKER, source="facts §5.1"),
    "ld128putcs": _i((("i", 0, 63),), context=SUPERVISOR, source="facts §16.3"),
    "ld64putcs": _i((("i", 0, 63),), context=SUPERVISOR, source="facts §16.3"),
    "ld2x64pace": _i(("a2", "a2", "m2+=", "m", ("i", 0, 15)), context=WORKER),
    "ld2xst64pace": _i(("a4", "a2", "m2+=", "m", ("i", 0, 63)), context=WORKER),
    "ldst64pace": _i(("a2", "a2", "m2+=", "m", ("i", 0, 15)), context=WORKER),
    "st64pace": _i(("a2", "m2+=", "m", ("i", 0, 3)), context=WORKER),
    "tapack": _i(("m2", "m", "m", "m"), context=WORKER),
    "rpt": _i(("mi", ("i", 0, 255)), context=WORKER, source="facts §16.3 rpt"),
    "nop": _i(()),
    "fnop": _i((), context=WORKER),
    "runall": _i(("m", "m", ("i", 0, 65535)), context=SUPERVISOR, source="facts §16.3 runall"),
    "run": _i(("m", "m", ("i", 0, 65535)), context=SUPERVISOR),
    "sync": _i((("i", 0, 15),), context=SUPERVISOR, source="facts §10.1 sync zimm4"),
    "exitz": _i(("m",), context=WORKER),
    # AMP (aux pipeline): out pair, input pair, partials pair, phase flags; facts §16.3
    "f16v4hihov4amp": _i(("a2", "a2", "a2", "i"), context=WORKER),
    "f8v8hihov4amp": _i(("a2", "a2", "a2", "i"), context=WORKER),
}  # fmt: skip
# integer, indexing and rearrangement kernels (transpose.S, gather.S, concat.S, select.S,
# argmax.S, cast_i32.S): Tile Vertex ISA (graphcore/ipu_assembly_support hover pages)
_TABLE.update({
    **{op: _i(("m", "m", "m", "mi"), source="Tile Vertex ISA ldz8/lds8/ldz16/lds16")
       for op in ("ldz8", "lds8", "ldz16", "lds16")},
    **{f"{op}step": _i(("m", "m", "m+=", "mi"), source="Tile Vertex ISA ldz8step/ldz16step")
       for op in ("ldz8", "lds8", "ldz16", "lds16")},
    "trap": _i((("i", 0, 15),), source="Tile Vertex ISA trap zimm4"),
    "clz": _i(("m", "m"), source="Tile Vertex ISA clz"),
})  # fmt: skip

# vector sub/min/max/compares, ARF bit logic, ldb16 and the ARF forms of the 32-bit loads and
# stores (unary.S, gelu_erf.S, broadcast.S columns, the row-wise and indexing kernels): public
# Tile Vertex ISA mnemonics (graphcore/ipu_assembly_support hover text)
_VERTEX_ISA = "Tile Vertex ISA (ipu_assembly_support hover text)"
_TABLE.update({
    **{op: _i(("a2", "a2", "a2"), context=WORKER, source=_VERTEX_ISA)
       for op in ("f16v4sub", "f32v2sub", "f32v2max", "f32v2min", "f32v2cmplt", "f32v2cmple",
                  "f32v2cmpgt", "f32v2cmpge", "f32v2cmpeq", "f32v2cmpne", "and64", "andc64",
                  "or64")},
    "ldb16": _i(("a", "m", "m", "mi"), context=WORKER, source=_VERTEX_ISA),
    "ldb16step": _i(("a", "m", "m+=", "mi"), context=WORKER, source=_VERTEX_ISA),
    "ld32": _i(("m", "m", "m", "mi"), ("a", "m", "m", "mi"), source=_VERTEX_ISA),
    "st32": _i(("m", "m", "m", "mi"), ("a", "m", "m", "mi"), source=_VERTEX_ISA),
    "ld32step": _i(("ma", "m", "m+=", "mi"), context=WORKER, source=_VERTEX_ISA),
    "st32step": _i(("ma", "m", "m+=", "mi"), context=WORKER, source=_VERTEX_ISA),
})  # fmt: skip

INSTRUCTIONS: dict[str, Instruction] = {
    name: Instruction(name, forms, context, source)
    for name, (forms, context, source) in _TABLE.items()
}

_MREG = re.compile(r"^\$m(\d+)$")
_AREG = re.compile(r"^\$a(\d+)$")
_APAIR = re.compile(r"^\$a(\d+):(\d+)$")
_MPAIR = re.compile(r"^\$m(\d+):(\d+)$")


def register_error(kind: str, text: str) -> str | None:
    """Why ``text`` is not an operand of ``kind`` (None when it is)."""
    t = text.strip()
    if kind in ("m", "m+="):
        if kind == "m+=":
            if not t.endswith("+="):
                return f"expected a post-incremented MRF register ($mN+=), got {t!r}"
            t = t[:-2]
        if t in MRF_ALIASES:
            return None
        m = _MREG.match(t)
        if m and int(m[1]) <= 15:
            return None
        return f"expected an MRF register ($m0-$m15), got {t!r}"
    if kind == "a":
        if t in ARF_ALIASES:
            return None
        m = _AREG.match(t)
        if m and int(m[1]) <= 15:
            return None
        return f"expected an ARF register ($a0-$a15), got {t!r}"
    if kind == "aB":
        if not t.endswith(":B"):
            return f"expected a broadcast ARF register ($aN:B), got {t!r}"
        return register_error("a", t[:-2])
    if kind in ("a2", "a4"):
        width = 2 if kind == "a2" else 4
        if kind == "a2" and t in ARF_PAIR_ALIASES:
            return None
        m = _APAIR.match(t)
        if not m:
            return f"expected an ARF register {'pair' if width == 2 else 'quad'}, got {t!r}"
        lo, hi = int(m[1]), int(m[2])
        if hi != lo + width - 1 or lo % width or hi > 15:
            return (
                f"malformed ARF {'pair' if width == 2 else 'quad'} {t!r}: needs $aN:N+{width - 1} "
                f"with N a multiple of {width}, at most $a15"
            )
        return None
    if kind in ("m2", "m2+="):
        if kind == "m2+=":
            if not t.endswith("+="):
                return f"expected a post-incremented MRF pair ($mN:N+1+=), got {t!r}"
            t = t[:-2]
        m = _MPAIR.match(t)
        if not m:
            return f"expected an MRF pair ($mN:N+1), got {t!r}"
        lo, hi = int(m[1]), int(m[2])
        if hi != lo + 1 or lo % 2 or hi > 15:
            return f"malformed MRF pair {t!r}: needs $mN:N+1 with N even, at most $m15"
        return None
    if kind == "csr":
        if t.startswith("$"):
            return None if t[1:] in CSRS else f"unknown CSR {t!r}"
        return None  # an index expression
    if kind == "ma":
        if register_error("m", t) is None or register_error("a", t) is None:
            return None
        return f"expected an MRF or ARF register, got {t!r}"
    if kind == "mi":
        if t.startswith("$"):
            return register_error("m", t)
        return None
    if kind == "i":
        return f"expected an immediate, got register {t!r}" if t.startswith("$") else None
    raise AssertionError(kind)

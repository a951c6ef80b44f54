"""A kernel unit's expanded assembly laid out at IPU21 addresses, ready to execute.

Input: the statements :func:`ipu_stack.kernels.preflight.preflight` produces (macro-expanded,
with their template sites). Sections are placed one after another from the code base in the
order they first appear; ``.p2align`` pads; every instruction is 4 bytes and every bundle
``{ main ; aux }`` 8 bytes, which must start 8-byte aligned. ``.set`` values are evaluated in
statement order, labels get their addresses, and every operand expression is resolved, so
execution never parses text.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from ipu_stack.errors import IpuStackError
from ipu_stack.kernels import isa
from ipu_stack.kernels.asm_expand import Site, _split_word
from ipu_stack.kernels.asm_expr import ExprError, Unresolved, evaluate, split_top_level
from ipu_stack.target import ipu21

CODE_BASE = ipu21.TILE_MEMORY_BASE


class LoadError(IpuStackError):
    """The unit cannot be laid out (bad alignment, unresolved operand)."""


@dataclass(slots=True)
class Instr:
    """One decoded instruction: mnemonic, operand texts and resolved immediates."""

    mnemonic: str
    operands: tuple[str, ...]
    site: Site
    address: int
    imms: tuple[int | None, ...] = ()

    def describe(self) -> str:
        return f"{self.mnemonic} {', '.join(self.operands)}".strip()


@dataclass(slots=True)
class Bundle:
    """What one issue executes: one instruction, or a main + aux pair (``rpt`` included)."""

    address: int
    instrs: tuple[Instr, ...]
    context: str  # supervisor | worker

    @property
    def size(self) -> int:
        return 4 * len(self.instrs)


@dataclass(slots=True)
class Program:
    """A unit laid out in memory: bundles by address, labels and absolute symbols."""

    name: str
    bundles: dict[int, Bundle] = field(default_factory=dict)
    labels: dict[str, int] = field(default_factory=dict)
    symbols: dict[str, int] = field(default_factory=dict)
    end: int = CODE_BASE

    def at(self, address: int) -> Bundle | None:
        return self.bundles.get(address)


_SKIP = {".type", ".size", ".globl", ".global", ".local", ".weak", ".hidden", ".file", ".loc",
         ".ident", ".allow_optimizations", ".cfi_startproc", ".cfi_endproc", ".print"}  # fmt: skip


def load(name: str, statements: list[tuple[str, Site]]) -> Program:
    """Lay out ``statements`` (an expansion's ``expanded`` list) as a :class:`Program`.

    Raises:
        LoadError: a misaligned bundle, a data directive in code, an unresolvable operand.
    """
    sections: dict[str, list[tuple[str, Site, str]]] = {}
    current = ".text"
    context = "supervisor"
    for text, site in statements:
        stmt = text.strip()
        if not stmt or stmt.startswith("#"):
            continue
        word, rest = _split_word(stmt)
        lw = word.lower()
        if lw == ".section":
            current = split_top_level(rest)[0].strip()
            continue
        if lw in (".text", ".data", ".bss"):
            current = lw
            continue
        if lw in (".supervisor", ".worker"):
            context = lw[1:]
        sections.setdefault(current, []).append((stmt, site, context))
    # pass 1: addresses of labels and bundles
    program = Program(name)
    layout: list[tuple[int, list[tuple[str, Site]], str]] = []
    sets: list[tuple[int, str, str, Site]] = []  # (order, name, expr, site)
    address = CODE_BASE
    order = 0
    for body in sections.values():
        pending: list[tuple[str, Site]] | None = None
        for stmt, site, context in body:
            order += 1
            word, rest = _split_word(stmt)
            lw = word.lower()
            if stmt == "{":
                pending = []
                continue
            if stmt == "}":
                if pending:
                    layout.append((address, pending, context))
                    if address % 8:
                        raise LoadError(
                            f"{name}: bundle at {address:#x} is not 8-byte aligned "
                            f"({site.describe()})"
                        )
                    address += 4 * len(pending)
                pending = None
                continue
            if stmt.endswith(":") and " " not in stmt:
                program.labels[stmt[:-1]] = address
                continue
            if lw in (".p2align", ".balign", ".align"):
                n = int(evaluate(split_top_level(rest)[0], program.symbols))
                step = 1 << n if lw == ".p2align" else n
                aligned = -(-address // step) * step
                while address < aligned and pending is None:  # the assembler pads with nop
                    layout.append((address, [("nop", site)], context))
                    address += 4
                address = aligned
                continue
            if lw in (".set", ".equ", ".equiv", ".eqv"):
                parts = split_top_level(rest)
                sets.append((order, parts[0].strip(), parts[1], site))
                layout.append((address, [(f".set {parts[0]}, {parts[1]}", site)], "set"))
                continue
            if lw.startswith("."):
                if lw in _SKIP or lw in (".supervisor", ".worker"):
                    continue
                raise LoadError(f"{name}: directive {word} in code is not supported by the "
                                f"emulator ({site.describe()})")  # fmt: skip
            if pending is not None:
                pending.append((stmt, site))
                continue
            layout.append((address, [(stmt, site)], context))
            address += 4
    program.end = address
    # pass 2: resolve operands (sets evaluated in order; labels known)
    symbols: dict[str, int] = dict(program.labels)
    for addr, items, context in layout:
        if context == "set":
            stmt, site = items[0]
            parts = split_top_level(stmt[5:])
            with contextlib.suppress(Unresolved, ExprError):
                symbols[parts[0].strip()] = evaluate(parts[1], symbols)
            continue
        instrs = []
        a = addr
        for stmt, site in items:
            word, rest = _split_word(stmt)
            operands = tuple(o.strip() for o in split_top_level(rest)) if rest.strip() else ()
            instrs.append(Instr(word.lower(), operands, site, a, _resolve(operands, symbols)))
            a += 4
        program.bundles[addr] = Bundle(addr, tuple(instrs), context)
    program.symbols = symbols
    return program


def _resolve(operands: tuple[str, ...], symbols: dict[str, int]) -> tuple[int | None, ...]:
    out: list[int | None] = []
    for op in operands:
        if op.startswith("$"):
            out.append(None)
            continue
        try:
            out.append(evaluate(op, symbols))
        except (Unresolved, ExprError):
            out.append(None)
    return tuple(out)


def known_mnemonic(mnemonic: str) -> bool:
    """Whether the checker's instruction table lists ``mnemonic``."""
    return mnemonic in isa.INSTRUCTIONS

"""Assembler-level expansion of a preprocessed unit, with its symbol table and checks.

Our own implementation of the GNU assembler's macro layer (the subset our templates use):
``.macro``/``.endm`` with positional, keyword, default, ``:req`` and ``:vararg`` arguments,
``\\@`` (the unit's macro-expansion count) and ``\\()``; ``.set``/``.equ``/``.equiv``/``=``;
the ``.if`` family with ``.elseif``/``.else``/``.endif``; ``.rept``/``.irp``/``.irpc``/``.endr``;
``.exitm`` and ``.error``. Every expanded statement keeps its template file:line and the chain
of macro instantiations that produced it, so a report can name both.

Checks: duplicate definitions, uses of undefined local ``.L`` labels, globals declared but not
defined, unbalanced macros, loops, conditionals and bundles, unknown directives and
mnemonics, malformed operands and out-of-range immediates (:mod:`ipu_stack.kernels.isa`),
instructions in the wrong context (floating point in supervisor code, ``runall`` in a worker).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ipu_stack.kernels import isa
from ipu_stack.kernels.asm_expr import SYMBOL, ExprError, Unresolved, evaluate, split_top_level

MAX_MACRO_DEPTH = 64
MAX_LOOP_COUNT = 100_000

_LABEL = re.compile(r"^\s*([A-Za-z_.$][\w.$]*|\d+)\s*:(?!:)")
_ASSIGN = re.compile(r"^\s*([A-Za-z_.$][\w.$]*)\s*=(?!=)\s*(.+)$")
_MACRO_ARG = re.compile(r"\\(\(\)|@|[A-Za-z_]\w*)")

_CONDITIONALS = {".if", ".ifdef", ".ifndef", ".ifeq", ".ifne", ".ifb", ".ifnb", ".ifc", ".ifnc",
                 ".ifgt", ".ifge", ".iflt", ".ifle"}  # fmt: skip
_LOOPS = {".rept", ".irp", ".irpc"}
_PLAIN_DIRECTIVES = {
    ".text", ".data", ".bss", ".section", ".globl", ".global", ".type", ".size", ".p2align",
    ".align", ".balign", ".supervisor", ".worker", ".allow_optimizations", ".word", ".long",
    ".int", ".short", ".half", ".byte", ".quad", ".zero", ".space", ".skip", ".local", ".weak",
    ".hidden", ".file", ".loc", ".ident", ".previous", ".pushsection", ".popsection",
    ".print", ".warning", ".ascii", ".asciz", ".string", ".cfi_startproc", ".cfi_endproc",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Site:
    """Where a line came from: template file:line, and the macro calls that expanded it."""

    file: str
    line: int
    chain: tuple[tuple[str, str, int], ...] = ()  # (macro, call file, call line), outermost first

    def describe(self) -> str:
        text = f"{display_path(self.file)}:{self.line}"
        for macro, file, line in reversed(self.chain):
            text += f" (in macro {macro} instantiated at {display_path(file)}:{line})"
        return text


@dataclass(frozen=True, slots=True)
class Issue:
    kind: str  # duplicate | undefined | unbalanced | mnemonic | operand | context | ...
    message: str
    sites: tuple[Site, ...]

    def describe(self) -> str:
        if self.kind == "duplicate" and len(self.sites) == 2:
            first, again = self.sites
            return (
                f"{self.message}\n      first defined at {first.describe()}"
                f"\n      again defined at {again.describe()}"
            )
        where = "; ".join(s.describe() for s in self.sites)
        return f"{self.message} at {where}" if where else self.message


@dataclass(slots=True)
class Symbol:
    name: str
    kind: str  # label | set | equiv
    site: Site
    value: int | None = None


def display_path(path: str) -> str:
    """``path`` relative to the working directory when it lies below it."""
    if path.startswith("<"):
        return path
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


@dataclass(slots=True)
class Expansion:
    """A unit after macro expansion: its statements, symbol table and problems."""

    expanded: list[tuple[str, Site]] = field(default_factory=list)
    symbols: dict[str, Symbol] = field(default_factory=dict)
    globals: list[str] = field(default_factory=list)
    externals: list[str] = field(default_factory=list)
    issues: list[Issue] = field(default_factory=list)


def expand(lines: list[tuple[str, Site]]) -> Expansion:
    """Expand and check one preprocessed unit (lines paired with their template sites)."""
    result = Expansion()
    unit = _Unit(result)
    unit.run(lines)
    unit.finish()
    result.externals = sorted(
        {
            m[1]
            for stmt, _ in result.expanded
            for m in SYMBOL.finditer(_strip_strings(stmt))
            if m[1] in unit.declared_globals and m[1] not in result.symbols
        }
    )
    return result


@dataclass(slots=True)
class _Macro:
    name: str
    params: list[tuple[str, str | None, str]]  # (name, default, qualifier)
    body: list[tuple[str, Site]]
    site: Site


class _Unit:
    """Expands one preprocessed unit and builds its symbol table."""

    def __init__(self, result: Expansion) -> None:
        self.r = result
        self.macros: dict[str, _Macro] = {}
        self.counter = 0  # \@: macro expansions so far in this unit
        self.context: str | None = None  # supervisor | worker
        self.bundle: list[Site] | None = None
        self.bundle_site: Site | None = None
        self.refs: list[tuple[str, Site]] = []
        self.declared_globals: dict[str, Site] = {}
        self.stop = False

    def issue(self, kind: str, message: str, *sites: Site) -> None:
        self.r.issues.append(Issue(kind, message, sites))

    @property
    def absolute(self) -> dict[str, int]:
        return {n: s.value for n, s in self.r.symbols.items() if s.value is not None}

    def value(self, expr: str, site: Site, what: str) -> int | None:
        try:
            return evaluate(expr, self.absolute)
        except Unresolved as err:
            self.issue("expression", f"{what}: {err.symbol!r} has no absolute value", site)
        except ExprError as err:
            self.issue("expression", f"{what}: {err}", site)
        return None

    # -- driver ----------------------------------------------------------------------------
    def run(self, lines: list[tuple[str, Site]], depth: int = 0) -> None:
        """Process ``lines`` (one file or one expansion); conditionals must balance inside."""
        conds: list[list] = []  # [active, taken, seen_else, site]
        i = 0
        while i < len(lines) and not self.stop:
            text, site = lines[i]
            i += 1
            for stmt in _statements(text):
                word, rest = _split_word(stmt)
                lw = word.lower()
                active = all(c[0] for c in conds)
                if lw in _CONDITIONALS:
                    if not active:
                        conds.append([False, True, False, site])
                    else:
                        taken = self.condition(lw, rest, site)
                        conds.append([taken, taken, False, site])
                    continue
                if lw == ".elseif":
                    if not conds or conds[-1][2]:
                        self.issue("unbalanced", ".elseif without .if", site)
                        continue
                    c = conds[-1]
                    outer = all(x[0] for x in conds[:-1])
                    now = outer and not c[1] and self.condition(".if", rest, site)
                    c[0], c[1] = now, c[1] or now
                    continue
                if lw == ".else":
                    if not conds or conds[-1][2]:
                        self.issue("unbalanced", ".else without .if", site)
                        continue
                    c = conds[-1]
                    c[0], c[2] = not c[1], True
                    continue
                if lw in (".endif", ".endc"):
                    if not conds:
                        self.issue("unbalanced", ".endif without .if", site)
                    else:
                        conds.pop()
                    continue
                if not active:
                    continue
                if lw == ".macro":
                    i = self.define_macro(rest, site, lines, i)
                    continue
                if lw in _LOOPS:
                    i = self.loop(lw, rest, site, lines, i, depth)
                    continue
                if lw in (".endm", ".endr"):
                    self.issue("unbalanced", f"{word} without a matching opening directive", site)
                    continue
                if lw == ".exitm":
                    if depth == 0:
                        self.issue("unbalanced", ".exitm outside a macro", site)
                    return
                self.statement(stmt, word, rest, site, depth)
        for c in conds:
            self.issue("unbalanced", "conditional .if is never closed by .endif", c[3])

    def condition(self, directive: str, rest: str, site: Site) -> bool:
        arg = rest.strip()
        if directive in (".ifdef", ".ifndef"):
            defined = arg in self.r.symbols
            return defined if directive == ".ifdef" else not defined
        if directive in (".ifb", ".ifnb"):
            return (arg == "") == (directive == ".ifb")
        if directive in (".ifc", ".ifnc"):
            parts = split_top_level(arg)
            same = len(parts) == 2 and parts[0].strip("'\"") == parts[1].strip("'\"")
            return same == (directive == ".ifc")
        value = self.value(arg, site, directive)
        if value is None:
            return False
        return {
            ".if": value != 0,
            ".ifne": value != 0,
            ".ifeq": value == 0,
            ".ifgt": value > 0,
            ".ifge": value >= 0,
            ".iflt": value < 0,
            ".ifle": value <= 0,
        }[directive]

    def _collect(
        self, lines: list[tuple[str, Site]], i: int, opens: set[str], close: str, site: Site
    ) -> tuple[list[tuple[str, Site]], int, bool]:
        """Raw lines up to the matching ``close``; returns (body, next index, closed)."""
        body: list[tuple[str, Site]] = []
        nesting = 0
        while i < len(lines):
            text, s = lines[i]
            i += 1
            word = _split_word(text.strip())[0].lower()
            if word in opens:
                nesting += 1
            elif word == close:
                if nesting == 0:
                    return body, i, True
                nesting -= 1
            body.append((text, s))
        return body, i, False

    def define_macro(self, rest: str, site: Site, lines: list[tuple[str, Site]], i: int) -> int:
        body, i, closed = self._collect(lines, i, {".macro"}, ".endm", site)
        name, _, params_text = rest.strip().partition(" ")
        name = name.rstrip(",")
        if not closed:
            self.issue("unbalanced", f".macro {name} is never closed by .endm", site)
            return i
        if not name:
            self.issue("syntax", ".macro without a name", site)
            return i
        if name in self.macros:
            self.issue(
                "duplicate", f"macro {name!r} is defined twice", self.macros[name].site, site
            )
        params = []
        for part in re.split(r"[,\s]+", params_text.strip()) if params_text.strip() else []:
            pname, _, default = part.partition("=")
            pname, _, qual = pname.partition(":")
            params.append((pname, default if "=" in part else None, qual))
        self.macros[name] = _Macro(name, params, body, site)
        return i

    def loop(
        self,
        directive: str,
        rest: str,
        site: Site,
        lines: list[tuple[str, Site]],
        i: int,
        depth: int,
    ) -> int:
        body, i, closed = self._collect(lines, i, _LOOPS, ".endr", site)
        if not closed:
            self.issue("unbalanced", f"{directive} is never closed by .endr", site)
            return i
        if directive == ".rept":
            count = self.value(rest, site, ".rept count")
            if count is None:
                return i
            if not 0 <= count <= MAX_LOOP_COUNT:
                self.issue("expression", f".rept count {count} out of range", site)
                return i
            for _ in range(count):
                self.run(body, depth)
            return i
        parts = split_top_level(rest)
        var, values = parts[0], parts[1:]
        if directive == ".irpc":
            values = list("".join(values).strip())
        for value in values:
            expanded = [(_substitute(t, {var: value}), s) for t, s in body]
            self.run(expanded, depth)
        return i

    # -- statements ---------------------------------------------------------------------------
    def statement(self, stmt: str, word: str, rest: str, site: Site, depth: int) -> None:
        if stmt == "{":
            if self.bundle is not None:
                self.issue("unbalanced", "'{' inside a bundle", site)
            self.bundle, self.bundle_site = [], site
            self.r.expanded.append((stmt, site))
            return
        if stmt == "}":
            if self.bundle is None:
                self.issue("unbalanced", "'}' without '{'", site)
            elif len(self.bundle) > 2:
                self.issue("bundle", f"bundle of {len(self.bundle)} instructions (at most 2)",
                           site)  # fmt: skip
            self.bundle = None
            self.r.expanded.append((stmt, site))
            return
        leftover = _MACRO_ARG.search(_strip_strings(stmt))
        if leftover:
            self.issue(
                "macro",
                f"\\{leftover[1]} is not a parameter of any enclosing macro or loop",
                site,
            )
            return
        label = _LABEL.match(stmt)
        if label:
            self.define(label[1], "label", site)
            self.r.expanded.append((f"{label[1]}:", site))
            rest_stmt = stmt[label.end() :].strip()
            if rest_stmt:
                w, r = _split_word(rest_stmt)
                self.statement(rest_stmt, w, r, site, depth)
            return
        assign = _ASSIGN.match(stmt)
        if assign:
            self.assign(assign[1], assign[2], "set", site)
            return
        lw = word.lower()
        if word in self.macros:
            self.r.expanded.append((f"# {stmt}", site))  # the expansion follows
            self.expand(self.macros[word], rest, site, depth)
            return
        self.r.expanded.append((stmt, site))
        if lw in (".set", ".equ", ".equiv", ".eqv"):
            parts = split_top_level(rest)
            if len(parts) != 2 or not parts[0]:
                self.issue("syntax", f"{word} needs NAME, VALUE", site)
                return
            self.assign(parts[0], parts[1], "equiv" if lw == ".equiv" else "set", site)
            return
        if lw == ".error":
            self.issue("error", f".error {rest.strip()}", site)
            return
        if lw in (".globl", ".global"):
            for name in split_top_level(rest):
                self.declared_globals.setdefault(name, site)
                if name not in self.r.globals:
                    self.r.globals.append(name)
            return
        if lw in (".supervisor", ".worker"):
            self.context = lw[1:]
            return
        if lw.startswith("."):
            if lw not in _PLAIN_DIRECTIVES:
                self.issue("directive", f"unknown directive {word}", site)
            else:
                self.references(rest, site, lw)
            return
        self.instruction(word, rest, site)

    def define(self, name: str, kind: str, site: Site, value: int | None = None) -> None:
        if name.isdigit():
            return  # numeric local labels may repeat
        old = self.r.symbols.get(name)
        if old is not None and not (kind == "set" and old.kind == "set"):
            self.issue("duplicate", f"symbol {name!r} is defined twice", old.site, site)
            return
        self.r.symbols[name] = Symbol(name, kind, site, value)

    def assign(self, name: str, expr: str, kind: str, site: Site) -> None:
        try:
            value: int | None = evaluate(expr, self.absolute)
        except Unresolved:
            value = None  # relative to a label or external: fine, but not absolute
            self.references(expr, site, ".set")
        except ExprError as err:
            self.issue("expression", f"{name}: {err}", site)
            return
        self.define(name, kind, site, value)

    def references(self, text: str, site: Site, where: str) -> None:
        if where in (".section", ".type", ".file", ".ident"):
            return
        for m in SYMBOL.finditer(_strip_strings(text)):
            if m[1].startswith(".L"):
                self.refs.append((m[1], site))

    def expand(self, macro: _Macro, rest: str, site: Site, depth: int) -> None:
        if depth >= MAX_MACRO_DEPTH:
            self.issue("macro", f"macro {macro.name} nested deeper than {MAX_MACRO_DEPTH}", site)
            self.stop = True
            return
        args = split_top_level(rest) if rest.strip() else []
        values: dict[str, str] = {}
        positional = [a for a in args]
        names = [p[0] for p in macro.params]
        keyword = {}
        for a in list(positional):
            key, eq, val = a.partition("=")
            if eq and key.strip() in names and not key.strip().startswith("$"):
                keyword[key.strip()] = val.strip()
                positional.remove(a)
        for idx, (pname, default, qual) in enumerate(macro.params):
            if qual == "vararg":
                values[pname] = ", ".join(positional[idx:])
                positional = positional[:idx]
                break
            if pname in keyword:
                values[pname] = keyword[pname]
            elif idx < len(positional) and (positional[idx] or default is None):
                values[pname] = positional[idx]
            elif default is not None:
                values[pname] = default
            else:
                if qual == "req":
                    self.issue("macro", f"macro {macro.name}: missing argument {pname}", site)
                values[pname] = ""
        if len(positional) > len(macro.params):
            self.issue(
                "macro",
                f"macro {macro.name} takes {len(macro.params)} arguments, got {len(positional)}",
                site,
            )
        self.counter += 1
        serial = str(self.counter - 1)
        chain = (*site.chain, (macro.name, site.file, site.line))
        body = []
        for text, s in macro.body:
            # Unknown \names stay: an inner .irp may bind them; statement() reports leftovers.
            expanded = _substitute_macro(text, values, serial)
            body.append((expanded, Site(s.file, s.line, chain)))
        self.run(body, depth + 1)

    def instruction(self, mnemonic: str, rest: str, site: Site) -> None:
        spec = isa.INSTRUCTIONS.get(mnemonic.lower())
        if self.bundle is not None:
            self.bundle.append(site)
        if spec is None:
            self.issue("mnemonic", f"unknown mnemonic {mnemonic!r}", site)
            return
        operands = split_top_level(rest) if rest.strip() else []
        if spec.context != isa.ANY and self.context is not None and spec.context != self.context:
            used = f"{mnemonic} is a {spec.context} instruction, used in {self.context} code"
            self.issue("context", used, site)
        best: str | None = None
        for form in spec.forms:
            if len(form) != len(operands):
                best = best or (
                    f"{mnemonic} takes {' or '.join(str(len(f)) for f in spec.forms)} "
                    f"operands, got {len(operands)}"
                )
                continue
            problem = self._check_form(mnemonic, form, operands)
            if problem is None:
                best = None
                break
            best = problem
        if best:
            self.issue("operand", best, site)
            return
        if mnemonic == "ld2x64pace" and operands[0] == operands[1]:
            self.issue("operand", "ld2x64pace destination pairs must differ (facts §16.3)", site)
        for op in operands:
            self.references(op, site, mnemonic)

    def _check_form(self, mnemonic: str, form: tuple, operands: list[str]) -> str | None:
        for kind, text in zip(form, operands, strict=True):
            low = high = None
            if isinstance(kind, tuple):
                kind, low, high = kind
            problem = isa.register_error(str(kind), text)
            if problem:
                return f"{mnemonic}: {problem}"
            if low is not None and high is not None and not text.startswith("$"):
                try:
                    v = evaluate(text, self.absolute)
                except (Unresolved, ExprError):
                    continue
                if not low <= v <= high:
                    return f"{mnemonic}: immediate {text} = {v} outside {low}..{high}"
        return None

    def finish(self) -> None:
        if self.bundle is not None and self.bundle_site is not None:
            self.issue("unbalanced", "bundle '{' is never closed by '}'", self.bundle_site)
        seen: set[str] = set()
        for name, site in self.refs:
            if name not in self.r.symbols and name not in seen:
                seen.add(name)
                self.issue("undefined", f"local label {name!r} is used but never defined", site)
        for name, site in self.declared_globals.items():
            if name not in self.r.symbols:
                self.issue("undefined", f"global symbol {name!r} is declared but not defined",
                           site)  # fmt: skip


def _strip_strings(text: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)


def _statements(text: str) -> list[str]:
    """Split a source line into statements: ``;`` separators and bundle braces."""
    out: list[str] = []
    current: list[str] = []
    quoted = False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if not quoted and ch in ";{}":
            out.append("".join(current).strip())
            if ch in "{}":
                out.append(ch)
            current = []
            continue
        current.append(ch)
    out.append("".join(current).strip())
    return [s for s in out if s]


def _split_word(stmt: str) -> tuple[str, str]:
    parts = stmt.split(None, 1)
    if not parts:
        return "", ""
    return parts[0], parts[1] if len(parts) > 1 else ""


def _substitute(text: str, values: dict[str, str]) -> str:
    return _MACRO_ARG.sub(lambda m: values.get(m[1], m[0]) if m[1] not in "()@" else m[0], text)


def _substitute_macro(text: str, values: dict[str, str], serial: str) -> str:
    def sub(m: re.Match[str]) -> str:
        key = m[1]
        if key == "()":
            return ""
        if key == "@":
            return serial
        return values.get(key, m[0])

    return _MACRO_ARG.sub(sub, text)

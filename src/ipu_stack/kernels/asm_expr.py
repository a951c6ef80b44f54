"""GNU assembler expressions: tokens, precedence and absolute evaluation.

Precedence follows the GNU as manual ("Infix Operators"), which differs from C: ``<<`` and
``>>`` bind as tightly as ``*``; ``|``, ``&``, ``^`` and or-not ``!`` sit between those and
``+``/``-``/comparisons; ``&&`` and ``||`` are lowest. A true comparison is -1.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_TOKEN = re.compile(
    r"\s*(?:(?P<num>0[xX][0-9a-fA-F]+|0[bB][01]+|\d+)"
    r"|(?P<reg>\$[A-Za-z_][\w]*(?::\d+)?)"
    r"|(?P<sym>[A-Za-z_.$][\w.$]*)"
    r"|(?P<op><<|>>|<=|>=|==|!=|<>|&&|\|\||[-+*/%&|^~!<>()]))"
)
SYMBOL = re.compile(r"(?<![\w.$])([A-Za-z_.][\w.$]*)")

_LEVELS: list[dict[str, Callable[[int, int], int]]] = [
    {"&&": lambda a, b: -1 if (a and b) else 0, "||": lambda a, b: -1 if (a or b) else 0},
    {
        "+": lambda a, b: a + b,
        "-": lambda a, b: a - b,
        "==": lambda a, b: -1 if a == b else 0,
        "!=": lambda a, b: -1 if a != b else 0,
        "<>": lambda a, b: -1 if a != b else 0,
        "<": lambda a, b: -1 if a < b else 0,
        ">": lambda a, b: -1 if a > b else 0,
        "<=": lambda a, b: -1 if a <= b else 0,
        ">=": lambda a, b: -1 if a >= b else 0,
    },
    {
        "|": lambda a, b: a | b,
        "&": lambda a, b: a & b,
        "^": lambda a, b: a ^ b,
        "!": lambda a, b: a | ~b,
    },
    {
        "*": lambda a, b: a * b,
        "/": lambda a, b: int(a / b) if b else _div_zero(),
        "%": lambda a, b: a - b * int(a / b) if b else _div_zero(),
        "<<": lambda a, b: a << b,
        ">>": lambda a, b: a >> b,
    },
]


class ExprError(ValueError):
    """The expression is malformed (a template bug)."""


class Unresolved(ValueError):
    """The expression names a symbol with no absolute value (a label or an external)."""

    def __init__(self, symbol: str) -> None:
        super().__init__(symbol)
        self.symbol = symbol


def _div_zero() -> int:
    raise ExprError("division by zero")


def tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ExprError(f"unexpected {text[pos:]!r} in expression {text!r}")
        kind = m.lastgroup
        assert kind is not None
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    return tokens


def evaluate(text: str, symbols: dict[str, int]) -> int:
    """The absolute value of ``text``; ``symbols`` maps names to absolute values.

    Raises:
        ExprError: malformed expression.
        Unresolved: a name without an absolute value (a label, register or external).
    """
    tokens = tokenize(text)
    if not tokens:
        raise ExprError("empty expression")
    pos = 0

    def peek() -> tuple[str, str] | None:
        return tokens[pos] if pos < len(tokens) else None

    def unary() -> int:
        nonlocal pos
        tok = peek()
        if tok is None:
            raise ExprError(f"expression {text!r} ends early")
        pos += 1
        kind, value = tok
        if kind == "num":
            if value[:2] in ("0x", "0X"):
                return int(value, 16)
            if value[:2] in ("0b", "0B"):
                return int(value[2:], 2)
            return int(value, 8) if len(value) > 1 and value[0] == "0" else int(value)
        if kind == "sym":
            if value in symbols:
                return symbols[value]
            raise Unresolved(value)
        if kind == "reg":
            raise Unresolved(value)
        if value == "(":
            result = binary(0)
            if peek() != ("op", ")"):
                raise ExprError(f"unbalanced parentheses in {text!r}")
            pos += 1
            return result
        if value == "-":
            return -unary()
        if value == "+":
            return unary()
        if value == "~":
            return ~unary()
        if value == "!":
            return -1 if unary() == 0 else 0
        raise ExprError(f"unexpected {value!r} in expression {text!r}")

    def binary(level: int) -> int:
        nonlocal pos
        if level == len(_LEVELS):
            return unary()
        left = binary(level + 1)
        while (tok := peek()) is not None and tok[0] == "op" and tok[1] in _LEVELS[level]:
            pos += 1
            left = _LEVELS[level][tok[1]](left, binary(level + 1))
        return left

    result = binary(0)
    if pos != len(tokens):
        raise ExprError(f"unexpected {tokens[pos][1]!r} in expression {text!r}")
    return result


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside parentheses and double quotes; strips each part."""
    parts: list[str] = []
    current: list[str] = []
    depth, quoted = 0, False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
        if ch == sep and depth == 0 and not quoted:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    return parts

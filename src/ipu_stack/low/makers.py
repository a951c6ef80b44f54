"""Fast constructors for the frozen program records that lowering builds by the hundred thousand.

A frozen dataclass's ``__init__`` sets every field through ``object.__setattr__`` (about five
times the cost of a plain attribute store). :func:`maker` returns a function that builds the
same object — same class, same field values, still frozen and hashable — by calling the slot
descriptors directly. Every field must be passed positionally (no defaults, no checks): use it
only where the caller supplies all fields, e.g. in the vectorised gather and the GEMM lowering.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

from ipu_stack.low.program import (
    AddCall,
    Buffer,
    CopyCall,
    GemmCall,
    LogicalTransfer,
    Ref,
    Shard,
)

T = TypeVar("T")


def maker(cls: type[T]) -> Callable[..., T]:
    """A positional constructor of the frozen, slotted dataclass ``cls`` (all fields)."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    scope.update({f"_set_{n}": getattr(cls, n).__set__ for n in names})
    body = "".join(f"    _set_{n}(obj, {n})\n" for n in names)
    source = f"def make({', '.join(names)}):\n    obj = _new(_cls)\n{body}    return obj\n"
    exec(source, scope)
    make: Callable[..., T] = scope["make"]
    make.__doc__ = f"{cls.__name__}({', '.join(names)}) without the frozen __init__."
    return make


_tuple_new = tuple.__new__


def ref(buffer: str, offset: int) -> Ref:
    """``Ref(buffer, offset)`` without the named tuple's Python-level ``__new__``."""
    return _tuple_new(Ref, (buffer, offset))


make_transfer = maker(LogicalTransfer)
make_copy = maker(CopyCall)
make_buffer = maker(Buffer)
make_shard = maker(Shard)
make_gemm = maker(GemmCall)
make_add = maker(AddCall)


def union_spans(spans: Any) -> list[tuple[int, int]]:
    """The union of ``(lo, hi)`` intervals: sorted, overlapping or touching ones merged."""
    merged: list[list[int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]

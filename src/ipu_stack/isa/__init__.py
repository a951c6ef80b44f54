"""An emulator of the IPU21 instruction subset our kernels use, on expanded assembly.

:func:`load_unit` preflights a template with a unit's flags and lays the expansion out at
IPU21 addresses (:mod:`ipu_stack.isa.program`); :class:`~ipu_stack.isa.machine.Tile` runs
calls on a tile's memory (:mod:`ipu_stack.isa.machine`, semantics in
:mod:`ipu_stack.isa.ops`). Every rule public documentation leaves open is in
:mod:`ipu_stack.isa.assumptions`. Nothing here imports the planner's cost model.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from ipu_stack.isa.machine import CallResult, Tile
from ipu_stack.isa.program import LoadError, Program, load
from ipu_stack.isa.state import Fault, Memory

__all__ = ["CallResult", "Fault", "LoadError", "Memory", "Program", "Tile", "load_unit"]


def load_unit(source: Path | str, flags: Sequence[str], name: str) -> Program:
    """Preflight ``source`` with ``flags`` and lay the unit out (cached per source text).

    Raises:
        LoadError: preflight found problems, or the expansion cannot be laid out.
    """
    text = Path(source).read_text() if Path(source).is_file() else ""
    return _load_cached(str(Path(source).resolve()), text, tuple(flags), name)


@lru_cache(maxsize=64)
def _load_cached(source: str, text: str, flags: tuple[str, ...], name: str) -> Program:
    from ipu_stack.kernels.preflight import preflight

    result = preflight(source, flags, name)
    if not result.ok:
        raise LoadError(result.report())
    return load(name, result.expansion.expanded)

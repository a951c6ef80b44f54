"""What every candidate carries: formats in and out, cost, memory footprint."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ipu_stack.mid.formats import TensorFormat


@dataclass(frozen=True, slots=True)
class Footprint:
    """Per-tile bytes of an operator's own buffers (worst tile)."""

    standard: int = 0
    interleaved: int = 0
    max_standard_allocation: int = 0
    exchange_row_bytes: int = 0
    # bytes per active tile the host writes before the run (weights): live from step 0
    resident: int = 0
    resident_interleaved: int = 0  # the part of ``resident`` that must be interleaved
    # what tile 0 holds while the operation runs besides the above (a loop body: every value
    # it makes, live through the body, and all its weight blocks); its interleaved part
    tile0_extra: int = 0
    tile0_extra_interleaved: int = 0

    @property
    def total(self) -> int:
        return self.standard + self.interleaved


@dataclass(frozen=True, slots=True)
class Candidate:
    """One way to run one operation.

    ``input_formats[i]`` is the format the operation needs operand ``i`` in; ``None`` means
    it takes the operand as produced (no conversion). ``choice`` is what lowering needs:
    a :class:`~ipu_stack.mid.gemm_plan.GemmPlan`, ``("inherit",)`` or ``("rows", tiles)``.
    """

    op: str
    family: str
    choice: Any
    input_formats: tuple[TensorFormat | None, ...]
    output_format: TensorFormat
    cycles: int
    exchange_cycles: int
    footprint: Footprint
    active_tiles: int
    exchange_phases: int = 0
    padding_groups: int = 1

    def describe(self) -> str:
        return f"{self.family}:{self.choice if not hasattr(self.choice, 'tiles') else 'gemm'}"

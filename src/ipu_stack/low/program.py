"""The tile-level program: buffers, kernel calls, logical transfers, bindings.

Everything here names memory as a :class:`Ref` (buffer name + byte offset on a tile) until
placement turns refs into addresses (:mod:`ipu_stack.place.assign`). A program is a list of
bulk-synchronous steps: a :class:`ComputeStep` (each tile runs its calls in order) or an
:class:`ExchangeStep` (a global sync, then every transfer of the phase).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ipu_stack.target.ipu21 import Precision


class Ref(NamedTuple):
    """A byte position inside a named buffer of one tile (a tuple: cheap to make by the million)."""

    buffer: str
    offset: int = 0

    def at(self, delta: int) -> Ref:
        """The position ``delta`` bytes further on in the same buffer."""
        return _tuple_new(Ref, (self[0], self[1] + delta))


_tuple_new = tuple.__new__


@dataclass(frozen=True, slots=True)
class Buffer:
    """A tile allocation request; ``live`` is filled in from the steps that touch it."""

    tile: int
    name: str
    size: int
    alignment: int
    region: str  # standard | interleaved | any
    exclusive_element: bool = False
    avoid: tuple[str, ...] = ()  # buffers that must not share a memory element with this one
    host_written: bool = False  # written by the host before the run: live from step 0
    host_read: bool = False  # read by the host after the run: live to the end


@dataclass(frozen=True, slots=True)
class GemmCall:
    """out[rows, c] (+)= left[rows, k] @ right[k, c] on one tile (AMP kernel)."""

    tile: int
    out: Ref
    left: Ref
    right: Ref
    rows: int
    k: int
    c: int
    precision: Precision
    accumulate: bool
    weights: str  # interleaved | standard
    scale_exponent: int = 0  # F8: products are scaled by 2**scale_exponent

    @property
    def output_precision(self) -> Precision:
        """Precision of the output and partials (F8 products accumulate into F16)."""
        from ipu_stack.target.ipu21 import GEMM_OUTPUT_PRECISION, precision

        return precision(GEMM_OUTPUT_PRECISION[self.precision.name])


@dataclass(frozen=True, slots=True)
class AddCall:
    """out[elements] += sum(inputs[i][elements]) in the tensor precision."""

    tile: int
    out: Ref
    inputs: tuple[Ref, ...]
    elements: int
    precision: Precision


@dataclass(frozen=True, slots=True)
class CopyCall:
    """Local copy on one tile: ``rows`` runs of ``size`` bytes, run ``r`` from ``src`` +
    ``r * src_stride`` to ``dst`` + ``r * dst_stride`` (one run: a plain copy, strides 0).

    A run of rows is one call (one launch, one fixed cost) instead of one call per row:
    what gathers an operand block's rows from a producer's rows of another width emit.
    """

    tile: int
    dst: Ref
    src: Ref
    size: int
    rows: int = 1
    dst_stride: int = 0
    src_stride: int = 0

    @property
    def dst_extent(self) -> int:
        """Bytes from ``dst`` to the end of the last run."""
        return (self.rows - 1) * self.dst_stride + self.size

    @property
    def src_extent(self) -> int:
        """Bytes from ``src`` to the end of the last run."""
        return (self.rows - 1) * self.src_stride + self.size


@dataclass(frozen=True, slots=True)
class FillCall:
    """Zero ``size`` bytes on one tile (padding that is not written otherwise)."""

    tile: int
    dst: Ref
    size: int


@dataclass(frozen=True, slots=True)
class View:
    """A 2-D strided operand: ``rows x cols`` elements, rows ``stride`` bytes apart.

    Padding bytes between ``cols`` and ``stride`` belong to the operand: outputs write them
    as zeros, so padded storage is always clean.
    """

    ref: Ref
    rows: int
    cols: int
    stride: int
    dtype: str


@dataclass(frozen=True, slots=True)
class MapCall:
    """A non-GEMM tile kernel (elementwise, row-wise or attention) on 2-D views.

    Inputs broadcast like NumPy against the output (a 1-row view is a row vector, a 1-column
    view a per-row scalar). ``attrs`` carry kernel options (epsilon, causal, scale, ...).
    """

    tile: int
    kind: str
    out: View
    inputs: tuple[View, ...]
    attrs: tuple[tuple[str, float | int | bool | str], ...] = ()

    def attr(self, key: str) -> float | int | bool | str:
        return dict(self.attrs)[key]


KernelCall = GemmCall | AddCall | CopyCall | FillCall | MapCall


@dataclass(frozen=True, slots=True)
class LogicalTransfer:
    """``words`` 32-bit words from a source tile to one or more destination tiles."""

    source_tile: int
    source: Ref
    destinations: tuple[tuple[int, Ref], ...]
    words: int


@dataclass(slots=True)
class ComputeStep:
    calls: list[KernelCall] = field(default_factory=list)


@dataclass(slots=True)
class ExchangeStep:
    label: str
    transfers: list[LogicalTransfer] = field(default_factory=list)


@dataclass(slots=True)
class RepeatStep:
    """The next ``length`` steps are a loop body run ``count`` times.

    Buffers in ``iterated`` hold one block per iteration: iteration ``i`` reads
    ``stride`` x ``i`` bytes further on (per-iteration weights advance by a base pointer).
    """

    count: int
    length: int
    iterated: dict[tuple[int, str], int] = field(default_factory=dict)


Step = ComputeStep | ExchangeStep | RepeatStep


def step_runs(steps: list[Step]) -> list[int]:
    """How many times each step runs: a loop body's steps ``count`` times, the rest (and the
    ``RepeatStep`` markers themselves) once. Loops do not nest (the supervisor refuses it)."""
    runs = [1] * len(steps)
    for index, step in enumerate(steps):
        if isinstance(step, RepeatStep):
            runs[index + 1 : index + 1 + step.length] = [step.count] * step.length
    return runs


@dataclass(frozen=True, slots=True)
class Shard:
    """Part of a value held on one tile.

    Coordinates are those of the value's flat-row view ``[N, C]`` (``C`` the last axis, ``N``
    the product of the others). The shard holds rows ``rows[0]:rows[1]`` and columns
    ``cols[0]:cols[1]``; storage rows are value rows (or value columns when ``transposed``),
    ``row_stride`` bytes apart, elements packed within a storage row.
    """

    tile: int
    ref: Ref
    rows: tuple[int, int]
    cols: tuple[int, int]
    row_stride: int
    transposed: bool = False


@dataclass(frozen=True, slots=True)
class Binding:
    """How the host reaches a graph value: the shards it writes (inputs) or reads (outputs)."""

    name: str
    role: str  # host_input | parameter | output
    dtype: str
    shape: tuple[int, ...]
    shards: tuple[Shard, ...]
    scale_exponent: int = 0  # F8: stored element = value / 2**scale_exponent


@dataclass(slots=True)
class LowProgram:
    """A lowered program over logical tiles 0..tile_count-1."""

    tile_count: int
    buffers: list[Buffer]
    steps: list[Step]
    bindings: list[Binding]
    estimated_cycles: int
    estimated_exchange_cycles: int
    plans: dict[str, dict[str, object]]
    finalist: dict[str, object] = field(default_factory=dict)


@dataclass(slots=True)
class ProgramBuilder:
    """Appends steps, merging consecutive compute steps; drops empty exchange steps."""

    steps: list[Step] = field(default_factory=list)
    buffers: dict[tuple[int, str], Buffer] = field(default_factory=dict)
    sealed: bool = False  # the last step closes a loop body: start a new step

    def compute(self, calls: list[KernelCall]) -> None:
        if not calls:
            return
        if self.steps and isinstance(self.steps[-1], ComputeStep) and not self.sealed:
            self.steps[-1].calls.extend(calls)
        else:
            self.steps.append(ComputeStep(list(calls)))
        self.sealed = False

    def exchange(self, label: str, transfers: list[LogicalTransfer]) -> None:
        if transfers:
            self.steps.append(ExchangeStep(label, list(transfers)))
            self.sealed = False

    def loop(self, count: int, body: ProgramBuilder, iterated: dict[tuple[int, str], int]) -> None:
        """Append ``body``'s steps as a loop run ``count`` times, and adopt its buffers."""
        if not body.steps:
            return
        self.steps.append(RepeatStep(count, len(body.steps), dict(iterated)))
        self.steps.extend(body.steps)
        for buf in body.buffers.values():
            self.buffer(buf)
        self.sealed = True

    def buffer(self, buf: Buffer) -> Ref:
        key = (buf.tile, buf.name)
        if key in self.buffers:
            raise ValueError(f"buffer {buf.name} defined twice on tile {buf.tile}")
        self.buffers[key] = buf
        return _tuple_new(Ref, (buf.name, 0))  # Ref(buf.name), without the Python __new__

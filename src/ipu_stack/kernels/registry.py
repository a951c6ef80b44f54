"""Kernel ABI registry: every tile kernel the planner can call, defined once.

Each :class:`KernelSpec` states a kernel's entry symbols, operand registers, operand layouts
and alignment, memory-element relations, status (``implemented``: device code exists in
``kernels/templates``; ``required``: the planner and simulator use it but no device code
exists yet), its NumPy reference semantics and its cycle model. The simulator
(:mod:`ipu_stack.runtime.sim`) runs ``reference`` and charges ``cycles``; the planner
(:mod:`ipu_stack.mid.gemm_plan`) charges ``cycles_array``; the kernel build
(:mod:`ipu_stack.kernels.build`) renders ``source`` with a variant's flags. Nothing else
defines what a kernel computes or costs.

Calling convention (reference-system §2.11, facts §19.3): supervisor entry, ``$m2`` output,
``$m3``.. inputs, scalars after the inputs, ``$m10`` return address, ``$m11`` stack.

GEMM variants follow the reference's naming scheme (reference-system §4.2, SEPT-mid):
``gemm_{f16|f8|f32}{_interleaved}{_packed{G}}_k{K}_c{C}_r{S}_r{L}`` where K and C are the
padded local inner and output-column extents, S <= L the two row counts of the tiles that run
the unit (S == L for a single row count), and G the packed-output column group.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.graph.elementwise import KINDS as ELEMENTWISE_KINDS
from ipu_stack.kernels import semantics
from ipu_stack.target import gemm_cycles, ipu21
from ipu_stack.target.ipu21 import F8, F16, F32, Precision

TEMPLATE_DIR = Path(__file__).parent / "templates"
GEMM_TEMPLATE = TEMPLATE_DIR / "gemm_amp.S"
GEMM_F32_TEMPLATE = TEMPLATE_DIR / "gemm_f32.S"  # vector pipeline (f32sisov2amp is not public)
ENTRY_PREFIX = "ipu_stack_"

IMPLEMENTED = "implemented"
REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class Operand:
    """One kernel operand: what register carries it and how its memory must look."""

    name: str
    role: str  # output | input | scalar
    register: str
    dtype: str
    layout: str
    alignment: int = 1  # bytes; 1 for scalars
    region: str = "any"  # interleaved | standard | any


@dataclass(frozen=True, slots=True)
class MemoryRelation:
    """A constraint between two operands' memory (facts §5)."""

    kind: str  # distinct_element
    operands: tuple[str, str]
    why: str


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """A tile kernel's ABI, semantics and cost (see module docstring)."""

    name: str
    summary: str
    status: str
    operands: tuple[Operand, ...]
    entry_symbols: tuple[str, ...]  # patterns; {fields} filled from the variant
    relations: tuple[MemoryRelation, ...] = ()
    source: Path | None = None
    reference: Callable[..., Any] | None = None
    cycles: Callable[..., int] | None = None
    cycles_array: Callable[..., np.ndarray] | None = None

    def operand(self, name: str) -> Operand:
        for op in self.operands:
            if op.name == name:
                return op
        raise KeyError(f"kernel {self.name} has no operand {name!r}")

    def describe(self) -> dict[str, object]:
        """JSON-friendly summary (what ``kernel.json`` and docs print)."""
        return {
            "name": self.name,
            "summary": self.summary,
            "status": self.status,
            "source": self.source.name if self.source else None,
            "entry_symbols": list(self.entry_symbols),
            "operands": [
                {
                    "name": o.name,
                    "role": o.role,
                    "register": o.register,
                    "dtype": o.dtype,
                    "layout": o.layout,
                    "alignment": o.alignment,
                    "region": o.region,
                }
                for o in self.operands
            ],
            "relations": [
                {"kind": r.kind, "operands": list(r.operands), "why": r.why} for r in self.relations
            ],
        }


@dataclass(frozen=True, slots=True)
class GemmKernelSpec(KernelSpec):
    """An AMP GEMM kernel family: one precision, one weight memory class, packed or not."""

    precision: Precision = F16
    interleaved: bool = True
    packed: bool = False

    @property
    def weights(self) -> str:
        return "interleaved" if self.interleaved else "standard"

    def variant(self, k: int, c: int, rows: Iterable[int], group: int = 0) -> GemmVariant:
        """The compile unit for local extents K x C run by tiles with these row counts."""
        counts = sorted(set(rows))
        if not 1 <= len(counts) <= 2:
            raise GraphError(f"a GEMM unit serves one or two row counts, got {counts}")
        if self.packed != bool(group):
            raise GraphError(f"kernel {self.name}: output group {group} does not match")
        return GemmVariant(self, k, c, counts[0], counts[-1], group)


GEMM_PHASES = ("init", "accumulate")
GEMM_SIZES = ("small", "large")
_GEMM_NAME = re.compile(
    r"^gemm_(?P<p>f16|f8|f32)(?P<il>_interleaved)?(?:_packed(?P<g>\d+))?"
    r"_k(?P<k>\d+)_c(?P<c>\d+)_r(?P<s>\d+)_r(?P<l>\d+)$"
)


@dataclass(frozen=True, slots=True)
class GemmVariant:
    """One GEMM compile unit: a family specialised to K, C, a row-count pair and group."""

    spec: GemmKernelSpec
    k: int
    c: int
    small_rows: int
    large_rows: int
    group: int = 0

    def __post_init__(self) -> None:
        p = self.spec.precision
        problems = []
        if self.k <= 0 or self.k % p.k_micro:
            problems.append(f"K={self.k} must be a positive multiple of {p.k_micro}")
        if self.c <= 0 or self.c % p.c_micro:
            problems.append(f"C={self.c} must be a positive multiple of {p.c_micro}")
        if not 1 <= self.small_rows <= self.large_rows:
            problems.append(
                f"rows must satisfy 1 <= S <= L, got {self.small_rows}, {self.large_rows}"
            )
        if self.group and (self.group % 16 or self.group > 1024):
            problems.append(f"output group G={self.group} must be a multiple of 16, <= 1024")
        if problems:
            raise GraphError(f"bad GEMM variant {self.spec.name}: " + "; ".join(problems))

    @property
    def single_rows(self) -> bool:
        return self.small_rows == self.large_rows

    def _suffix(self) -> str:
        il = "_interleaved" if self.spec.interleaved else ""
        packed = f"_packed{self.group}" if self.group else ""
        return f"{il}{packed}_k{self.k}_c{self.c}_r{self.small_rows}_r{self.large_rows}"

    @property
    def name(self) -> str:
        return f"gemm_{self.spec.precision.name}{self._suffix()}"

    def entry_symbol(self, phase: str, rows: int) -> str:
        """The entry a tile with ``rows`` rows calls (``phase``: init or accumulate)."""
        if rows not in (self.small_rows, self.large_rows):
            raise KeyError(f"{self.name} serves rows {self.small_rows}/{self.large_rows}")
        size = "small" if rows == self.small_rows else "large"
        return f"{ENTRY_PREFIX}gemm_{self.spec.precision.name}_{phase}_{size}_rows{self._suffix()}"

    @property
    def entry_symbols(self) -> dict[str, str]:
        sizes = ("small",) if self.single_rows else GEMM_SIZES
        out = {}
        for phase in GEMM_PHASES:
            for size in sizes:
                rows = self.small_rows if size == "small" else self.large_rows
                out[f"{phase}_{size}"] = self.entry_symbol(phase, rows)
        return out

    @property
    def source(self) -> Path:
        assert self.spec.source is not None, f"{self.spec.name} has no device code"
        return self.spec.source

    def flags(self) -> list[str]:
        """The ``-D`` flags that specialise :data:`GEMM_TEMPLATE` to this unit."""
        flags = [
            f"-DGEMM_INNER_BLOCK_DIMENSION={self.k}",
            f"-DGEMM_OUTPUT_COLUMNS={self.c}",
            f"-DGEMM_SMALL_ROWS={self.small_rows}",
            f"-DGEMM_LARGE_ROWS={self.large_rows}",
        ]
        if self.single_rows:
            flags.append("-DGEMM_SINGLE_ROWS=1")
        if self.spec.interleaved:
            flags.append("-DGEMM_INTERLEAVED_WEIGHTS=1")
        if self.group:
            flags.append(f"-DGEMM_OUTPUT_GROUP={self.group}")
        if self.spec.precision is F8:
            flags.append("-DGEMM_NATIVE_FP8=1")
        for key, symbol in self.entry_symbols.items():
            flags.append(f"-DGEMM_{key.upper()}_SYMBOL={symbol}")
        return flags


def _gemm_operands(precision: Precision, interleaved: bool, packed: bool) -> tuple[Operand, ...]:
    out_dtype = "f32" if precision is F32 else "f16"
    out_layout = (
        "packed: 16-row panels inside G-column groups (semantics.packed_output_offsets)"
        if packed
        else "row-major [rows, C], C padded to 16"
    )
    align = ipu21.AMP_OPERAND_ALIGNMENT
    ops = [
        Operand("output", "output", "$m2", out_dtype, out_layout, align, "interleaved"),
        Operand("left", "input", "$m3", precision.name, "row-major [rows, K]", align, "any"),
        Operand(
            "right",
            "input",
            "$m4",
            precision.name,
            "row-major [K, C]; read as K x 16 coefficient panels",
            align,
            "interleaved" if interleaved else "any",
        ),
    ]
    if precision is F8:
        ops.append(Operand("scale_exponent", "scalar", "$m5", "i32", "sum of operand scales"))
    return tuple(ops)


_GEMM_RELATIONS = (
    MemoryRelation(
        "distinct_element",
        ("left", "output"),
        "the worker loads left rows and stores partials in one bundle (facts §5.1, §5.4)",
    ),
)


def _gemm_reference(precision: Precision) -> Callable[..., np.ndarray]:
    if precision is F16:
        return semantics.gemm_f16
    if precision is F8:
        return semantics.gemm_f8
    return semantics.gemm_f32


def _gemm_spec(precision: Precision, interleaved: bool, packed: bool) -> GemmKernelSpec:
    weights = "interleaved" if interleaved else "standard"
    name = f"gemm_{precision.name}_{weights}" + ("_packed" if packed else "")
    il = "_interleaved" if interleaved else ""
    pk = "_packed{G}" if packed else ""
    entries = tuple(
        f"{ENTRY_PREFIX}gemm_{precision.name}_{phase}_{size}_rows{il}{pk}_k{{K}}_c{{C}}_r{{S}}_r{{L}}"
        for phase in GEMM_PHASES
        for size in GEMM_SIZES
    )
    # F32: the AMP dataflow (f32sisov2amp) is not public; gemm_f32.S uses f32v2mul/f32v2add
    template = GEMM_F32_TEMPLATE if precision is F32 else GEMM_TEMPLATE
    cycles_array: Callable[..., np.ndarray] | None = None
    if packed:
        cycles = partial(
            gemm_cycles.packed_gemm_kernel_cycles, precision=precision, weights=weights
        )
    else:
        cycles = partial(gemm_cycles.gemm_kernel_cycles, precision=precision, weights=weights)
        cycles_array = partial(
            gemm_cycles.gemm_kernel_cycles_array, precision=precision, weights=weights
        )
    return GemmKernelSpec(
        name=name,
        summary=(
            f"{precision.name.upper()} AMP GEMM out[rows, C] (+)= left[rows, K] @ right[K, C], "
            f"{weights} weights" + (", packed output" if packed else "")
        ),
        status=IMPLEMENTED,
        operands=_gemm_operands(precision, interleaved, packed),
        entry_symbols=entries,
        relations=_GEMM_RELATIONS,
        source=template,
        reference=_gemm_reference(precision),
        cycles=cycles,
        cycles_array=cycles_array,
        precision=precision,
        interleaved=interleaved,
        packed=packed,
    )


def _defined_in(module: str, attr: str) -> Callable[..., Any]:
    """A definition that lives in a later stage (imported on first use: no import cycle)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        import importlib

        target: Any = importlib.import_module(module)
        for part in attr.split("."):
            target = getattr(target, part)
        return target(*args, **kwargs)

    call.__qualname__ = call.__name__ = f"{module}.{attr}"
    return call


def _other_kernel(
    name: str, summary: str, operands: tuple[Operand, ...], cycles: str, reference: str
) -> KernelSpec:
    """A non-GEMM kernel: ABI and status here; its cycle model (taking the call) and its
    semantics are single definitions in ``low/costs.py`` and ``runtime/sim.py``."""
    mod_c, fn_c = cycles.split(":")
    mod_r, fn_r = reference.split(":")
    return KernelSpec(
        name=name,
        summary=summary,
        status=REQUIRED,
        operands=operands,
        entry_symbols=(f"{ENTRY_PREFIX}{name}_{{p}}",),
        reference=_defined_in(mod_r, fn_r),
        cycles=_defined_in(mod_c, fn_c),
    )


_OUT = Operand("output", "output", "$m2", "f16|f32", "row-major 2-D view", 8)
_IN = Operand("inputs", "input", "$m3..", "f16|f32", "row-major 2-D views, NumPy broadcast", 8)
_COSTS, _SIM = "ipu_stack.low.costs", "ipu_stack.runtime.sim"
_OTHER_KERNELS = (
    _other_kernel(
        "reduce_add",
        "out[n] += sum_i in_i[n]: f32 sum, rounded once (K-split reduction)",
        (_OUT, _IN, Operand("elements", "scalar", "after the inputs", "u32", "count")),
        f"{_COSTS}:add_call_cycles",
        f"{_SIM}:SimDevice._simple",
    ),
    _other_kernel(
        "copy",
        "local copy of n bytes",
        (
            Operand("output", "output", "$m2", "bytes", "contiguous", 4),
            Operand("source", "input", "$m3", "bytes", "contiguous", 4),
            Operand("size", "scalar", "$m4", "u32", "bytes"),
        ),
        f"{_COSTS}:copy_call_cycles",
        f"{_SIM}:SimDevice._simple",
    ),
    _other_kernel(
        "copy2d",
        "local copy of rows runs of n bytes at a source and a destination row stride",
        (
            Operand("output", "output", "$m2", "bytes", "rows runs, dst_stride apart", 4),
            Operand("source", "input", "$m3", "bytes", "rows runs, src_stride apart", 4),
            Operand("size", "scalar", "$m4", "u32", "bytes per run"),
            Operand("rows", "scalar", "$m5", "u32", "runs (>= 2)"),
            Operand("dst_stride", "scalar", "$m6", "u32", "bytes, >= size"),
            Operand("src_stride", "scalar", "$m7", "u32", "bytes"),
        ),
        f"{_COSTS}:copy_call_cycles",
        f"{_SIM}:SimDevice._simple",
    ),
    _other_kernel(
        "fill_zero",
        "zero n bytes",
        (
            Operand("output", "output", "$m2", "bytes", "contiguous", 4),
            Operand("size", "scalar", "$m3", "u32", "bytes"),
        ),
        f"{_COSTS}:copy_call_cycles",
        f"{_SIM}:SimDevice._simple",
    ),
    *(
        _other_kernel(
            kind,
            f"{kind} over 2-D views (MapCall kind={kind!r})",
            (_OUT, _IN),
            f"{_COSTS}:map_call_cycles",
            f"{_SIM}:map_semantics",
        )
        for kind in ("add", "mul", "gelu", "cast", "layer_norm", "softmax", "attention")
    ),
    *(  # graph/elementwise.py: the same ABI (gelu takes approximate='tanh' as an attribute)
        _other_kernel(
            kind,
            f"{kind} over 2-D views (MapCall kind={kind!r}; f32 arithmetic, rounded once)",
            (_OUT, _IN),
            f"{_COSTS}:map_call_cycles",
            f"{_SIM}:map_semantics",
        )
        for kind in ELEMENTWISE_KINDS
    ),
)

_IDX = "ipu_stack.runtime.indexing_semantics:indexing_semantics"
_MAP_CYCLES = f"{_COSTS}:map_call_cycles"
_I32_OUT = Operand("output", "output", "$m2", "i32", "row-major 2-D view", 8)


def _view(name: str, register: str, dtype: str, layout: str = "row-major 2-D view") -> Operand:
    return Operand(name, "input", register, dtype, layout, 8)


# Integer, indexing and rearrangement kernels (MapCall kinds; semantics in
# runtime/indexing_semantics.py, cycle models in target/op_cycles.py via low/costs.py).
_INDEXING_KERNELS = tuple(
    _other_kernel(name, summary, operands, _MAP_CYCLES, _IDX)
    for name, summary, operands in (
        (
            "gather_rows",
            "out[i] = table[ids[i] - row_offset] for the ids this table block holds, zero rows "
            "for the others; an id outside [0, table_rows) faults (names ids, position, id)",
            (
                _OUT,
                _view("table", "$m3", "f16|f32", "[rows, w] block of table rows"),
                _view("ids", "$m4", "i32", "all ids, row-major"),
                Operand("row_offset", "scalar", "$m5", "u32", "first table row of the block"),
                Operand("table_rows", "scalar", "$m6", "u32", "rows of the whole table"),
            ),
        ),
        (
            "transpose",
            "out[s, X] = staging[X, s].T (local part of an on-chip transpose)",
            (_OUT, _view("staging", "$m3", "f16|f32|f8|i32", "[X, s] strip")),
        ),
        ("concat", "inputs side by side along the columns", (_OUT, _IN)),
        ("argmax", "index of the first maximum of each row (i32)", (_I32_OUT, _IN)),
        ("equal", "1 where a == b else 0 (i32), NumPy broadcast", (_I32_OUT, _IN)),
        (
            "where",
            "a where cond != 0 else b, NumPy broadcast",
            (
                _OUT,
                _view("cond", "$m3", "i32"),
                _view("a", "$m4", "f16|f32|i32"),
                _view("b", "$m5", "f16|f32|i32"),
            ),
        ),
        (
            "add_i32",
            "a + b on i32, wrapping like int32",
            (_I32_OUT, _view("inputs", "$m3..", "i32")),
        ),
        (
            "mul_i32",
            "a * b on i32, wrapping like int32",
            (_I32_OUT, _view("inputs", "$m3..", "i32")),
        ),
        (
            "cast_i32",
            "float -> i32 rounding toward zero (NaN -> 0, saturating); i32 -> float to nearest",
            (_OUT, _view("source", "$m3", "f16|f32|i32")),
        ),
    )
)

GEMM_KERNELS: dict[tuple[str, str, bool], GemmKernelSpec] = {
    (p.name, "interleaved" if il else "standard", packed): _gemm_spec(p, il, packed)
    for p in (F16, F8, F32)
    for il in (True, False)
    for packed in (False, True)
    if not (packed and p is F32)  # packed output is an F16-accumulator path
}
# Map kinds and local kernels with device code: their main template (the unit names of
# kernels/units.py, units_unary.py and units_rowwise.py pick the template of each form: add and
# mul with a broadcast operand run broadcast.S, tanh GeLU gelu_tanh.S). Forms no unit covers
# keep their NumPy semantics in ``run --kernels emulate`` (README "Kernels on the emulator").
OTHER_SOURCES = {
    "reduce_add": "reduce_add.S", "copy": "elementwise.S", "copy2d": "elementwise.S",
    "fill_zero": "elementwise.S",
    "add": "elementwise.S", "mul": "elementwise.S", "gelu": "gelu_erf.S", "cast": "cast.S",
    "layer_norm": "layer_norm.S", "softmax": "softmax.S", "reduce_mean": "layer_norm.S",
    **dict.fromkeys(("sub", "div", "max", "min", "tanh", "sigmoid", "sqrt", "reciprocal", "neg",
                     "pow", "relu"), "unary.S"),
}  # fmt: skip
# the indexing kernels' device code (units: kernels/units_indexing.py)
_INDEXING_SOURCES = {"gather_rows": "gather.S", "transpose": "transpose.S", "concat": "concat.S",
                     "argmax": "argmax.S", "equal": "select.S", "where": "select.S",
                     "add_i32": "select.S", "mul_i32": "select.S",
                     "cast_i32": "cast_i32.S"}  # fmt: skip


def _with_device_code(kernels: tuple[KernelSpec, ...], sources: dict[str, str]) -> list:
    """``kernels`` with those named in ``sources`` implemented by their template."""
    return [
        dataclasses.replace(k, status=IMPLEMENTED, source=TEMPLATE_DIR / sources[k.name])
        if k.name in sources
        else k
        for k in kernels
    ]


KERNELS: dict[str, KernelSpec] = {
    **{spec.name: spec for spec in GEMM_KERNELS.values()},
    **{spec.name: spec for spec in _with_device_code(_OTHER_KERNELS, OTHER_SOURCES)},
    **{spec.name: spec for spec in _with_device_code(_INDEXING_KERNELS, _INDEXING_SOURCES)},
}


def gemm_kernel(precision: str, weights: str, packed: bool = False) -> GemmKernelSpec:
    """The GEMM kernel for a precision name, weight class and output packing."""
    try:
        return GEMM_KERNELS[(precision, weights, packed)]
    except KeyError:
        raise GraphError(
            f"no GEMM kernel for precision={precision} weights={weights} packed={packed}"
        ) from None


def gemm_cycles_array(
    rows: np.ndarray, k: np.ndarray, c: np.ndarray, precision: Precision, interleaved: np.ndarray
) -> np.ndarray:
    """Kernel cycles over arrays of candidate shapes; ``interleaved`` picks the weight class.

    The planner's cost model (one vectorised call per candidate table).
    """
    il = gemm_kernel(precision.name, "interleaved").cycles_array
    std = gemm_kernel(precision.name, "standard").cycles_array
    assert il is not None and std is not None
    return np.where(np.asarray(interleaved, bool), il(rows, k, c), std(rows, k, c))


def parse_gemm_variant(name: str) -> GemmVariant:
    """The :class:`GemmVariant` a unit name denotes (inverse of ``GemmVariant.name``).

    Raises:
        GraphError: the name does not follow the scheme, or names an impossible unit.
    """
    m = _GEMM_NAME.match(name)
    if not m:
        raise GraphError(
            f"{name!r} is not a GEMM unit name "
            "(gemm_{f16|f8|f32}[_interleaved][_packedG]_kK_cC_rS_rL)"
        )
    group = int(m["g"] or 0)
    spec = gemm_kernel(m["p"], "interleaved" if m["il"] else "standard", bool(group))
    return GemmVariant(spec, int(m["k"]), int(m["c"]), int(m["s"]), int(m["l"]), group)


# Attention has device code (templates/attention.S; unit names in kernels/units_attention.py):
# its ABI, with the scale, causal offset and workspace registers the template takes.
def _attention_spec(spec: KernelSpec) -> KernelSpec:
    import dataclasses

    def op(name: str, register: str, dtype: str, layout: str, role: str = "input") -> Operand:
        return Operand(name, role, register, dtype, layout, 1 if role == "scalar" else 8)

    operands = (
        op("output", "$m2", "f16|f32", "[R, DV] rows dense", "output"),
        op("q", "$m3", "f16|f32", "[R, D] rows dense (D * bytes a multiple of 8)"),
        op("k", "$m4", "f16|f32", "[T, D] rows dense"),
        op("v", "$m5", "f16|f32", "[T, DV] rows dense (DV * bytes a multiple of 8)"),
        op("mask", "$m6", "f16|f32", "optional [R|1, T|1], rows padded to 8 bytes"),
        op("workspace", "$m7", "f32", "6 * T + 8 f32 of scratch"),
        op("scale", "$m8", "f32", "bits of the f32 scale", "scalar"),
        op("visible", "$m9", "i32", "causal: keys visible to query row 0", "scalar"),
    )
    return dataclasses.replace(
        spec,
        status=IMPLEMENTED,
        source=TEMPLATE_DIR / "attention.S",
        operands=operands,
        entry_symbols=(
            f"{ENTRY_PREFIX}attention_{{p}}_r{{R}}_t{{T}}_d{{D}}_v{{DV}}[_causal][_mask...]",
        ),
    )


KERNELS["attention"] = _attention_spec(KERNELS["attention"])

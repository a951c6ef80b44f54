"""Row-wise kernel units with device code: layer norm, softmax and the row mean.

Unit names (kernels/templates/layer_norm.S and softmax.S):
``layer_norm_{f16|f32}_r{R}_c{C}``, ``softmax_{f16|f32}_r{R}_c{C}`` and
``reduce_mean_{f16|f32}_r{R}_c{C}`` (the mean over the last axis, kept as one column): R rows
of C columns (C even), rows 8-byte aligned and ``row_bytes`` apart (the lowering's padded
stride). The semantics are the registry's own, called here on the operands:
``runtime.sim.map_semantics`` (layer_norm, softmax; reduce_mean through
``runtime.elementwise_sim``), f32 arithmetic rounded once to the output dtype.

ABI (supervisor): ``$m2`` output, ``$m3`` x, and for layer norm ``$m4`` scale ``[1, C]``,
``$m5`` bias ``[1, C]``, ``$m6`` epsilon as f32 bits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.kernels.registry import ENTRY_PREFIX, TEMPLATE_DIR

_NAME = re.compile(
    r"^(?P<k>layer_norm|softmax|reduce_mean)_(?P<p>f16|f32)_r(?P<r>\d+)_c(?P<c>\d+)$"
)
MAX_ROWS = 65530  # the workers divide by 6 exactly below 2**16
MAX_COLS = 65534  # rpt counts (pairs) fit 16 bits
DEFAULT_EPSILON = 1e-5


@dataclass(frozen=True, slots=True)
class RowwiseUnit:
    """One row-wise compile unit."""

    name: str
    kind: str  # layer_norm | softmax | reduce_mean
    dtype: str  # f16 | f32
    rows: int
    cols: int

    @property
    def source(self) -> Path:
        return TEMPLATE_DIR / ("softmax.S" if self.kind == "softmax" else "layer_norm.S")

    @property
    def entry(self) -> str:
        return f"{ENTRY_PREFIX}{self.name}"

    @property
    def element_bytes(self) -> int:
        return 4 if self.dtype == "f32" else 2

    @property
    def row_bytes(self) -> int:
        """Bytes between input rows (and output rows but for reduce_mean): 8-byte padded."""
        return -(-self.cols * self.element_bytes // 8) * 8

    @property
    def out_row_bytes(self) -> int:
        return 8 if self.kind == "reduce_mean" else self.row_bytes

    @property
    def out_cols(self) -> int:
        return 1 if self.kind == "reduce_mean" else self.cols

    @property
    def numpy_dtype(self) -> np.dtype:
        return np.dtype(np.float32 if self.dtype == "f32" else np.float16)

    def flags(self) -> list[str]:
        """The ``-D`` flags specialising the template to this unit."""
        out = [f"-DRW_ROWS={self.rows}", f"-DRW_COLS={self.cols}", f"-DRW_SYMBOL={self.entry}"]
        if self.kind != "softmax":
            c_bits = int(np.array(self.cols, np.float32).view(np.uint32))
            out.append(f"-DRW_C_BITS={c_bits:#x}")
        if self.kind == "reduce_mean":
            out.append("-DRW_MEAN_ONLY=1")
        return [*out, "-DRW_F32=1"] if self.dtype == "f32" else out

    def call(self, epsilon: float = DEFAULT_EPSILON) -> Any:
        """The simulator's MapCall this unit executes (for the semantics and the cost model)."""
        from ipu_stack.low.program import MapCall, Ref, View

        out = View(Ref("out"), self.rows, self.out_cols, self.out_row_bytes, self.dtype)
        x = View(Ref("x"), self.rows, self.cols, self.row_bytes, self.dtype)
        if self.kind != "layer_norm":
            return MapCall(0, self.kind, out, (x,))
        vec = View(Ref("v"), 1, self.cols, self.row_bytes, self.dtype)
        return MapCall(0, self.kind, out, (x, vec, vec), (("epsilon", float(epsilon)),))

    def reference(self, args: list[np.ndarray], epsilon: float = DEFAULT_EPSILON) -> np.ndarray:
        """The registry's semantics on [R, C] (and [1, C]) operands, rounded to the dtype."""
        from ipu_stack.runtime.sim import map_semantics

        with np.errstate(all="ignore"):
            result = map_semantics(self.call(epsilon), args)
        return np.asarray(result).astype(self.numpy_dtype)

    def modelled_cycles(self) -> int:
        """The cost model's cycles of this call (low/costs.py), for comparison only."""
        from ipu_stack.low import costs

        return int(costs.map_call_cycles(self.call()))


def parse_rowwise(name: str) -> RowwiseUnit | None:
    """The unit a row-wise name denotes; None if ``name`` is not a row-wise name.

    Raises:
        GraphError: a row-wise name with an impossible size.
    """
    m = _NAME.match(name)
    if not m:
        return None
    unit = RowwiseUnit(name, m["k"], m["p"], int(m["r"]), int(m["c"]))
    if not 1 <= unit.rows <= MAX_ROWS:
        raise GraphError(f"unit {name}: rows must be 1..{MAX_ROWS}")
    if not 2 <= unit.cols <= MAX_COLS or unit.cols % 2:
        raise GraphError(f"unit {name}: columns must be even, 2..{MAX_COLS}")
    return unit


def random_operands(unit: RowwiseUnit, rng: np.random.Generator) -> list[np.ndarray]:
    """Seeded operands: x [R, C] (softmax: some -inf entries, in every fourth row one 100
    among values in [-6, 6], whose exps then underflow but whose sum is exactly 1, and from
    3 rows one fully masked row), then scale and bias [1, C] for layer norm."""
    dt = unit.numpy_dtype
    shape = (unit.rows, unit.cols)
    if unit.kind == "softmax":
        x = rng.uniform(-6, 6, shape).astype(np.float32)
        x[rng.random(shape) < 0.05] = -np.inf
        pairs = unit.cols // 2
        for r in range(0, unit.rows, 4):  # a maximum that matters: missing it overflows exp
            k = int(rng.integers(0, max(1, (pairs - 5 + r % 6) // 6)))
            pair = min(pairs - 1, 6 * k + 5 - r % 6)  # in a different worker's share per row
            x[r, 2 * pair + int(rng.integers(0, 2))] = 100.0
        if unit.rows >= 3:
            x[1] = -np.inf
        return [x.astype(dt)]
    x = (rng.normal(0.0, 1.5, shape) + rng.uniform(-3, 3, (unit.rows, 1))).astype(dt)
    if unit.kind == "reduce_mean":
        return [x]
    scale = rng.uniform(-2, 2, (1, unit.cols)).astype(dt)
    bias = rng.uniform(-2, 2, (1, unit.cols)).astype(dt)
    return [x, scale, bias]


def compare(unit: RowwiseUnit, got: np.ndarray, want: np.ndarray) -> tuple[float, float, bool]:
    """(max abs error, worst ulp (F16) or relative error (F32), ok) as kernel-run judges:
    F16 within 2 ulp of the semantics' rounding, F32 within 1e-6 relative; NaN and inf
    must be where the semantics have them."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    same_special = np.array_equal(np.isnan(g), np.isnan(w)) and np.array_equal(
        np.where(np.isinf(w), w, 0), np.where(np.isinf(g), g, 0)
    )
    finite = np.isfinite(w) & np.isfinite(g)
    err = np.abs(g[finite] - w[finite])
    if not err.size:
        return 0.0, 0.0, bool(same_special)
    if unit.dtype == "f16":
        ulp = np.spacing(np.maximum(np.abs(want[finite]), 2.0**-14).astype(np.float16))
        worst = float(np.max(err / ulp.astype(np.float64)))
        return float(err.max()), worst, bool(same_special and worst <= 2.0)
    worst = float(np.max(err / np.maximum(np.abs(w[finite]), 1e-30)))
    return float(err.max()), worst, bool(same_special and worst <= 1e-6)


def run_rowwise(program: Any, unit: RowwiseUnit, rng: np.random.Generator,
                placer: Any, epsilon: float = DEFAULT_EPSILON) -> dict[str, Any]:  # fmt: skip
    """Run ``unit`` once on random operands placed by ``placer`` (kernel_run._Placer)."""
    from ipu_stack.isa import Tile
    from ipu_stack.kernels.kernel_run import STACK_TOP
    from ipu_stack.kernels.kernel_run_f32 import stray_writes

    args = random_operands(unit, rng)
    tile = Tile(program)
    modelled = unit.modelled_cycles()
    tile.max_cycles = 200_000 + 50 * modelled  # a runaway loop is a fault
    out_bytes = unit.rows * unit.out_row_bytes
    out_at = placer.take("standard", out_bytes)
    tile.mem.write(out_at, rng.integers(0, 256, out_bytes, dtype=np.uint8), 8)
    regs = {2: out_at, 11: STACK_TOP}
    for i, a in enumerate(args):
        rows = a.shape[0]
        stored = np.zeros((rows, unit.row_bytes), np.uint8)
        stored[:, : unit.cols * unit.element_bytes] = a.view(np.uint8).reshape(rows, -1)
        regs[3 + i] = placer.take("standard", stored.nbytes)
        tile.mem.write(regs[3 + i], stored.reshape(-1), 8)
    if unit.kind == "layer_norm":
        regs[6] = int(np.array(epsilon, np.float32).view(np.uint32))
    before = tile.mem.data.copy()
    result = tile.call(unit.entry, regs)
    stray = stray_writes(tile, before, [(out_at, out_bytes)])
    raw = tile.mem.read(out_at, out_bytes, 8).reshape(unit.rows, unit.out_row_bytes)
    used = unit.out_cols * unit.element_bytes
    got = raw[:, :used].copy().view(unit.numpy_dtype).reshape(unit.rows, unit.out_cols)
    want = unit.reference(args, epsilon).reshape(unit.rows, unit.out_cols)
    max_abs, worst, ok = compare(unit, got, want)
    padding_clean = bool((raw[:, used:] == 0).all())
    return {
        "entry": unit.entry, "rows": unit.rows, "cols": unit.cols, "max_abs_error": max_abs,
        "worst_ulp" if unit.dtype == "f16" else "worst_relative": worst,
        "padding_zero": padding_clean, "ok": ok and padding_clean and not stray,
        "emulated_cycles": result.cycles, "modelled_cycles": modelled,
        **({"stray_writes": stray} if stray else {}),
    }  # fmt: skip


ROWWISE_KINDS = ("layer_norm", "softmax", "reduce_mean")


def emulate_job(call: Any, address: Any) -> tuple | None:
    """``run --kernels emulate``: (unit name, source, flags, entry, registers) of a row-wise
    MapCall, or None when its operands do not fit a unit (mixed dtypes, odd columns, strides
    other than the 8-byte padded rows, a scale or bias that is not one row)."""
    out, ins = call.out, call.inputs
    x = ins[0]
    if out.dtype not in ("f16", "f32") or any(v.dtype != out.dtype for v in ins):
        return None
    if x.cols % 2 or x.cols < 2 or x.rows != out.rows or x.rows > MAX_ROWS:
        return None
    unit = parse_rowwise(f"{call.kind}_{out.dtype}_r{x.rows}_c{x.cols}")
    assert unit is not None
    strided = x.stride != unit.row_bytes or out.stride != unit.out_row_bytes
    if out.cols != unit.out_cols or (x.rows > 1 and strided):
        return None  # (one row: any stride)
    regs = {2: address(out.ref, out.rows * unit.out_row_bytes, 8, f"{call.kind} output"),
            3: address(x.ref, x.rows * unit.row_bytes, 8, f"{call.kind} input")}  # fmt: skip
    if call.kind == "layer_norm":
        if len(ins) != 3 or any((v.rows, v.cols) != (1, x.cols) for v in ins[1:]):
            return None
        regs[4] = address(ins[1].ref, unit.cols * unit.element_bytes, 8, "layer_norm scale")
        regs[5] = address(ins[2].ref, unit.cols * unit.element_bytes, 8, "layer_norm bias")
        regs[6] = int(np.array(call.attr("epsilon"), np.float32).view(np.uint32))
    elif len(ins) != 1:
        return None
    return unit.name, unit.source, tuple(unit.flags()), unit.entry, regs

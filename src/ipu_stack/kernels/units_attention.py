"""Attention kernel units (MapCall kind ``attention``): names, flags, semantics, kernel-run.

A unit name fixes what ``kernels/templates/attention.S`` needs:
``attention_{f16|f32}_r{R}_t{T}_d{D}_v{DV}[_causal][_mask{full|row|col|scalar}_{f16|f32}]``:
R query rows, T keys, head dim D, value dim DV (q, k, v and the output share the dtype; D and
DV times the element size a multiple of 8 bytes), the causal form, and an additive mask of
shape [R, T] (full), [1, T] (row: one row for every query), [R, 1] (col) or [1, 1] (scalar),
stored like the lowering stages it (rows of ``ceil(cols * bytes / 8) * 8`` bytes). The scale,
the causal offset and a workspace are call operands (registers, see the template), not part of
the name. The semantics are the simulator's own (``runtime.sim.map_semantics`` on a MapCall of
the same shape), f32 throughout and rounded once to the output dtype.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.kernels.registry import ENTRY_PREFIX, TEMPLATE_DIR

ATTENTION_TEMPLATE = TEMPLATE_DIR / "attention.S"
_NAME = re.compile(
    r"^attention_(?P<p>f16|f32)_r(?P<r>\d+)_t(?P<t>\d+)_d(?P<d>\d+)_v(?P<v>\d+)"
    r"(?P<causal>_causal)?(?:_mask(?P<mask>full|row|col|scalar)_(?P<mp>f16|f32))?$"
)
_MASK_SHAPE = {"full": (True, True), "row": (False, True), "col": (True, False),
               "scalar": (False, False)}  # (one row per query, one value per key)  # fmt: skip
MAX_KEYS = 16383  # T * 4 bytes within a 16-bit immediate; the workspace must fit a tile


def _stride(cols: int, eb: int) -> int:
    return -(-cols * eb // 8) * 8


@dataclass(frozen=True, slots=True)
class AttentionUnit:
    """One attention compile unit."""

    name: str
    dtype: str
    rows: int
    keys: int
    d: int
    dv: int
    causal: bool = False
    mask: str = ""  # "" | full | row | col | scalar
    mask_dtype: str = ""

    @property
    def source(self) -> Path:
        return ATTENTION_TEMPLATE

    @property
    def entry(self) -> str:
        return f"{ENTRY_PREFIX}{self.name}"

    @property
    def eb(self) -> int:
        return 4 if self.dtype == "f32" else 2

    @property
    def mask_shape(self) -> tuple[int, int]:
        per_row, per_key = _MASK_SHAPE[self.mask]
        return (self.rows if per_row else 1, self.keys if per_key else 1)

    @property
    def mask_row_bytes(self) -> int:
        rows, cols = self.mask_shape
        return _stride(cols, 4 if self.mask_dtype == "f32" else 2) if rows > 1 else 0

    @property
    def workspace_bytes(self) -> int:
        return 6 * self.keys * 4 + 32  # six rows of scores, then 1 / l per row

    def flags(self) -> list[str]:
        out = [f"-DATT_F32={int(self.dtype == 'f32')}", f"-DATT_ROWS={self.rows}",
               f"-DATT_KEYS={self.keys}", f"-DATT_D={self.d}", f"-DATT_DV={self.dv}",
               f"-DATT_CAUSAL={int(self.causal)}", f"-DATT_SYMBOL={self.entry}"]  # fmt: skip
        if self.mask:
            out += ["-DATT_MASK=1", f"-DATT_MASK_F32={int(self.mask_dtype == 'f32')}",
                    f"-DATT_MASK_ROW_BYTES={self.mask_row_bytes}",
                    f"-DATT_MASK_PER_KEY={int(_MASK_SHAPE[self.mask][1])}"]  # fmt: skip
        return out

    def map_call(self, scale: float, q_offset: int, q_total: int) -> Any:
        """The simulator's MapCall of this shape (what ``map_semantics`` defines)."""
        from ipu_stack.low.program import MapCall, Ref, View

        def view(name: str, rows: int, cols: int, dtype: str) -> View:
            return View(Ref(name), rows, cols, _stride(cols, 4 if dtype == "f32" else 2), dtype)

        views = [view("q", self.rows, self.d, self.dtype), view("k", self.keys, self.d, self.dtype),
                 view("v", self.keys, self.dv, self.dtype)]  # fmt: skip
        if self.mask:
            views.append(view("mask", *self.mask_shape, self.mask_dtype))
        attrs = (("causal", self.causal), ("scale", float(scale)), ("q_offset", q_offset),
                 ("q_total", q_total))  # fmt: skip
        out = view("out", self.rows, self.dv, self.dtype)
        return MapCall(0, "attention", out, tuple(views), attrs)

    def reference(self, args: list[np.ndarray], scale: float, q_offset: int, q_total: int):
        """The simulator's semantics, rounded to the output dtype."""
        from ipu_stack.runtime.sim import map_semantics

        call = self.map_call(scale, q_offset, q_total)
        with np.errstate(all="ignore"):
            result = map_semantics(call, args)
        return np.asarray(result).astype(np.float16 if self.dtype == "f16" else np.float32)


def parse_attention_unit(name: str) -> AttentionUnit:
    """The unit a name denotes.

    Raises:
        GraphError: the name does not follow the scheme or the sizes are impossible.
    """
    m = _NAME.match(name)
    if not m:
        raise GraphError(
            f"{name!r} is not an attention unit name (attention_{{f16|f32}}_rR_tT_dD_vDV"
            "[_causal][_mask{full|row|col|scalar}_{f16|f32}])"
        )
    unit = AttentionUnit(name, m["p"], int(m["r"]), int(m["t"]), int(m["d"]), int(m["v"]),
                         bool(m["causal"]), m["mask"] or "", m["mp"] or "")  # fmt: skip
    chunk = 8 // unit.eb
    if not 1 <= unit.rows <= 65530 or not 1 <= unit.keys <= MAX_KEYS:
        raise GraphError(f"unit {name}: rows 1..65530 and keys 1..{MAX_KEYS}")
    if unit.d <= 0 or unit.dv <= 0 or unit.d % chunk or unit.dv % chunk:
        raise GraphError(f"unit {name}: D and DV must be positive multiples of {chunk}")
    if max(unit.d, unit.dv) * unit.eb > 65535:  # the template's 16-bit immediates
        raise GraphError(f"unit {name}: rows of more than 65535 bytes")
    return unit


def attention_operands(
    unit: AttentionUnit, rng: np.random.Generator
) -> tuple[list[np.ndarray], float, int, int]:
    """Seeded operands (q, k, v[, mask]), scale and causal offsets for kernel-run."""
    dt = np.float16 if unit.dtype == "f16" else np.float32
    q = rng.uniform(-2, 2, (unit.rows, unit.d)).astype(dt)
    k = rng.uniform(-2, 2, (unit.keys, unit.d)).astype(dt)
    v = rng.uniform(-1, 1, (unit.keys, unit.dv)).astype(dt)
    args = [q, k, v]
    if unit.mask:
        mdt = np.float16 if unit.mask_dtype == "f16" else np.float32
        mask = rng.uniform(-3, 3, unit.mask_shape).astype(mdt)
        mask[rng.random(unit.mask_shape) < 0.2] = -np.inf  # blocked keys (and whole rows)
        # scores far below zero in one row (every row for a shared mask row): exp(s) alone
        # underflows there, so a kernel that does not subtract the row max shows it
        mask[unit.mask_shape[0] // 2] -= mdt(150)
        args.append(mask)
    scale = float(1 / np.sqrt(unit.d))
    # causal: more queries than keys in all, so the first rows see no key at all
    q_total = unit.keys + 2 if unit.causal else unit.rows
    q_offset = int(rng.integers(0, 3)) if unit.causal else 0
    return args, scale, q_offset, q_total


def visible_keys(unit: AttentionUnit, q_offset: int, q_total: int) -> int:
    """``$m9``: the keys visible to query row 0 (causal; row r sees this + r)."""
    return q_offset + 1 + unit.keys - q_total


def run_attention(program: Any, unit: AttentionUnit, rng: np.random.Generator,
                  placer: Any) -> dict[str, Any]:  # fmt: skip
    """Run the unit on the emulator vs the simulator's semantics (kernel-run)."""
    from ipu_stack.isa import Tile
    from ipu_stack.kernels.kernel_run import STACK_TOP

    args, scale, q_offset, q_total = attention_operands(unit, rng)
    p = placer()
    tile = Tile(program)
    regs = {11: STACK_TOP}
    for reg, a in zip((3, 4, 5, 6), args, strict=False):
        cols = a.shape[1]
        stride = _stride(cols, a.dtype.itemsize)
        padded = np.zeros((a.shape[0], stride // a.dtype.itemsize), a.dtype)
        padded[:, :cols] = a
        regs[reg] = _take(p, padded.nbytes + 256)
        tile.mem.write(regs[reg], padded.view(np.uint8).reshape(-1), 8)
        garbage = rng.uniform(-1, 1, 256 // a.dtype.itemsize).astype(a.dtype)  # over-reads show
        tile.mem.write(regs[reg] + padded.nbytes, garbage.view(np.uint8), 8)
    out_bytes = unit.rows * unit.dv * unit.eb
    regs[2] = _take(p, out_bytes)
    tile.mem.write(regs[2], rng.integers(0, 256, out_bytes, dtype=np.uint8), 8)
    regs[7] = _take(p, unit.workspace_bytes)
    regs[8] = int(np.array([scale], np.float32).view(np.uint32)[0])
    regs[9] = visible_keys(unit, q_offset, q_total) & 0xFFFFFFFF
    modelled = attention_model_cycles(unit)
    tile.max_cycles = 200_000 + 200 * unit.rows * unit.keys * (unit.d + unit.dv)
    before = tile.mem.data.copy()
    result = tile.call(unit.entry, regs)
    from ipu_stack.kernels.kernel_run_f32 import stray_writes

    stray = stray_writes(tile, before, [(regs[2], out_bytes), (regs[7], unit.workspace_bytes)])
    dt = np.float16 if unit.dtype == "f16" else np.float32
    got = tile.mem.read(regs[2], out_bytes, 8).view(dt).reshape(unit.rows, unit.dv)
    want = unit.reference(args, scale, q_offset, q_total)
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    err[np.isnan(err) & ~np.isnan(want)] = np.inf  # a NaN where the semantics has a number
    entry: dict[str, Any] = {
        "entry": unit.entry, "rows": unit.rows, "keys": unit.keys,
        "max_abs_error": float(np.nanmax(err)),
        "emulated_cycles": result.cycles, "modelled_cycles": modelled,
    }  # fmt: skip
    finite = bool(np.isfinite(got).all()) and not stray
    if stray:
        entry["stray_writes"] = stray
    if unit.dtype == "f16":
        ulp = np.spacing(np.maximum(np.abs(want), 2.0**-14).astype(np.float16)).astype(np.float64)
        entry["worst_ulp"] = float(np.nanmax(err / ulp))
        entry["ok"] = finite and entry["worst_ulp"] <= 2.0
    else:  # relative to the magnitude the output sums: sum_j p_j |v_j| <= max |v|
        bound = np.maximum(np.abs(args[2].astype(np.float64)).max(), 1e-30)
        entry["worst_relative"] = float(np.nanmax(err) / bound)
        entry["ok"] = finite and entry["worst_relative"] <= 1e-6
    return entry


def _take(placer: Any, size: int) -> int:
    """Standard memory first, the interleaved region when it is full (the ABI takes either)."""
    try:
        return int(placer.take("standard", size, packed=True))
    except GraphError:
        return int(placer.take("interleaved", size, packed=True))


def attention_model_cycles(unit: AttentionUnit) -> int:
    """The cost model's cycles of this call (low/costs.py), for comparison only."""
    from ipu_stack.low import costs

    return int(costs.map_call_cycles(unit.map_call(1.0, 0, unit.rows)))

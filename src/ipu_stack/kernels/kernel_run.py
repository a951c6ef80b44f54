"""``kernel-run``: run one kernel unit's device code on the ISA emulator and check it.

The unit (a GEMM name of :func:`ipu_stack.kernels.registry.parse_gemm_variant`, a row-wise
name of :func:`ipu_stack.kernels.units_rowwise.parse_rowwise` or an elementwise name of
:func:`ipu_stack.kernels.units.parse_unit`) is specialised from its
template (or ``source``), its operands are random (seeded) at addresses that satisfy the
registry ABI (regions, alignment, left and output in distinct memory elements), every entry
runs on :class:`ipu_stack.isa.Tile`, and the result is compared with the registry's NumPy
semantics: F16 within 2 ulp of the semantics' rounding (the ulp of the largest partial the
semantics rounds on the way), F32 within 1e-6 relative. The emulated cycles are reported
next to the cost model's (``cycles`` of the registry, launch included), which the emulator
never sees.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.isa import Fault, LoadError, Tile, load_unit
from ipu_stack.kernels import registry, semantics
from ipu_stack.kernels.kernel_run_f32 import stray_writes
from ipu_stack.kernels.kernel_run_indexing import run_indexing
from ipu_stack.kernels.units import Copy2dUnit, ElementwiseUnit, parse_copy2d, parse_unit
from ipu_stack.kernels.units_indexing import parse_indexing_unit
from ipu_stack.kernels.units_rowwise import parse_rowwise, run_rowwise
from ipu_stack.kernels.units_unary import parse_unary
from ipu_stack.kernels.units_unary import run_unit as run_unary
from ipu_stack.target import ipu21

STACK_TOP = ipu21.INTERLEAVED_BASE - 0x1000  # 0x7F000: standard region, frames below it
STANDARD_DATA = 0x4C000 + 0x1000
INTERLEAVED_DATA = ipu21.INTERLEAVED_BASE


class _Placer:
    """Bump allocation of operands, each in its region, 16 KiB / 32 KiB apart (distinct)."""

    def __init__(self) -> None:
        self.next = {"standard": STANDARD_DATA, "interleaved": INTERLEAVED_DATA}

    def take(self, region: str, size: int, align: int = 32, packed: bool = False) -> int:
        """An address for ``size`` bytes; the next operand starts in a new memory element
        unless ``packed`` (operands without element relations)."""
        region = "interleaved" if region == "interleaved" else "standard"
        step = ipu21.INTERLEAVED_ELEMENT_BYTES if region == "interleaved" else ipu21.ELEMENT_BYTES
        step = 64 if packed else step
        address = -(-self.next[region] // align) * align
        self.next[region] = -(-(address + size) // step) * step
        limit = STACK_TOP - 0x1000 if region == "standard" else ipu21.LOADER_LIMIT
        if self.next[region] > limit:
            raise GraphError(f"operands of {size} bytes do not fit the {region} region of a tile")
        return address


def kernel_run(name: str, source: str | None = None, seed: int = 0) -> dict[str, Any]:
    """Run unit ``name`` on the emulator; the report says per entry error, cycles and ok.

    Raises:
        GraphError: bad unit name or source file (exit 2).
    """
    if source is not None and not Path(source).is_file():
        raise GraphError(f"--source {source}: no such file")
    rng = np.random.default_rng(seed)
    report: dict[str, Any] = {"unit": name, "seed": seed, "entries": []}
    try:
        if name.startswith("gemm_"):
            variant = registry.parse_gemm_variant(name)
            src = Path(source) if source else variant.source
            program = load_unit(src, variant.flags(), name)
            report["source"] = str(src)
            report["entries"] = _run_gemm(program, variant, rng)
        elif (iunit := parse_indexing_unit(name)) is not None:  # kernels/units_indexing.py
            src = Path(source) if source else iunit.source
            program = load_unit(src, iunit.flags(), name)
            report["source"] = str(src)
            report["entries"] = [run_indexing(program, iunit, rng)]
        elif (rowwise := parse_rowwise(name)) is not None:  # layer_norm, softmax, reduce_mean
            src = Path(source) if source else rowwise.source
            program = load_unit(src, rowwise.flags(), name)
            report["source"] = str(src)
            report["entries"] = [run_rowwise(program, rowwise, rng, _Placer())]
        elif (unary := parse_unary(name)) is not None:  # kernels/units_unary.py
            src = Path(source) if source else unary.source
            program = load_unit(src, unary.flags(), name)
            report["source"] = str(src)
            report["entries"] = [run_unary(program, unary, rng)]
        elif name.startswith("attention_"):  # kernels/units_attention.py
            from ipu_stack.kernels import units_attention as ua

            att = ua.parse_attention_unit(name)
            src = Path(source) if source else att.source
            program = load_unit(src, att.flags(), name)
            report["source"] = str(src)
            report["entries"] = [ua.run_attention(program, att, rng, _Placer)]
        elif (c2 := parse_copy2d(name)) is not None:  # runs at strides (registry copy2d)
            src = Path(source) if source else c2.source
            program = load_unit(src, c2.flags(), name)
            report["source"] = str(src)
            report["entries"] = [_run_copy2d(program, c2, rng)]
        else:
            unit = parse_unit(name)
            src = Path(source) if source else unit.source
            program = load_unit(src, unit.flags(), name)
            report["source"] = str(src)
            report["entries"] = [_run_elementwise(program, unit, rng)]
    except (Fault, LoadError) as err:
        report["fault"] = str(err)
        report["ok"] = False
        return report
    report["ok"] = all(e["ok"] for e in report["entries"])
    return report


def _gemm_panels_bound(left: np.ndarray, right: np.ndarray, prior: np.ndarray, k_micro: int,
                       scale: float) -> np.ndarray:  # fmt: skip
    """Per output element: the largest |partial| the semantics rounds (float64)."""
    acc = prior.astype(np.float64)
    peak = np.abs(acc)
    l64, r64 = left.astype(np.float64), right.astype(np.float64)
    for p in range(0, left.shape[-1], k_micro):
        acc = acc + (l64[:, p : p + k_micro] @ r64[p : p + k_micro]) * scale
        peak = np.maximum(peak, np.abs(acc))
    return peak


def _run_gemm(program: Any, variant: registry.GemmVariant, rng: np.random.Generator) -> list:
    spec = variant.spec
    p = spec.precision
    if p is ipu21.F32:  # vector-pipeline kernel (gemm_f32.S): f32 output, f32 tolerance
        from ipu_stack.kernels.kernel_run_f32 import run_gemm_f32

        return run_gemm_f32(program, variant, rng, _Placer)
    fp8 = p is ipu21.F8
    k, c = variant.k, variant.c
    out = []
    for key, symbol in variant.entry_symbols.items():
        phase, size = key.split("_")
        rows = variant.small_rows if size == "small" else variant.large_rows
        accumulate = phase == "accumulate"
        scale_exponent = -2 if fp8 else 0
        left = rng.uniform(-1, 1, (rows, k)).astype(np.float32)
        right = rng.uniform(-1, 1, (k, c)).astype(np.float32)
        if fp8:
            left_s = semantics.encode_f143(left * 4, 0)
            right_s = semantics.encode_f143(right * 4, 0)
        else:
            left_s, right_s = left.astype(np.float16), right.astype(np.float16)
        prior = rng.uniform(-1, 1, (rows, c)).astype(np.float16)
        group = variant.group
        placer = _Placer()
        left_at = placer.take("standard", left_s.nbytes)
        right_at = placer.take(spec.operand("right").region, right_s.nbytes)
        out_rows = -(-rows // 16) * 16 if group else rows
        out_bytes = out_rows * c * 2
        out_at = placer.take("interleaved", out_bytes)
        modelled = (spec.cycles(rows, k, c) if spec.cycles else 0) + ipu21.KERNEL_LAUNCH_CYCLES
        tile = Tile(program)
        tile.max_cycles = 100_000 + 20 * int(modelled)  # a runaway loop is a fault
        stored_prior = semantics.pack_output(prior, group) if group else prior.reshape(-1)
        tile.mem.write(left_at, left_s.view(np.uint8).reshape(-1), 8)
        tile.mem.write(right_at, right_s.view(np.uint8).reshape(-1), 8)
        tile.mem.write(out_at, stored_prior.view(np.uint8), 8)
        regs = {2: out_at, 3: left_at, 4: right_at, 11: STACK_TOP}
        if fp8:
            regs[5] = scale_exponent
        before = tile.mem.data.copy()
        result = tile.call(symbol, regs)
        stray = stray_writes(tile, before, [(out_at, out_bytes)])
        raw = tile.mem.read(out_at, out_bytes, 8).view(np.float16)
        got = semantics.unpack_output(raw, rows, c, group) if group else raw.reshape(rows, c)
        extra = {"scale_exponent": scale_exponent} if fp8 else {}
        assert spec.reference is not None
        want = spec.reference(left_s[None], right_s[None], prior[None], accumulate, **extra)[0]
        lf = left_s.astype(np.float32)
        rf = right_s.astype(np.float32)
        peak = _gemm_panels_bound(lf, rf, prior if accumulate else prior * 0, p.k_micro,
                                  2.0**scale_exponent)  # fmt: skip
        ulp = np.spacing(np.maximum(peak, 2.0**-14).astype(np.float16)).astype(np.float64)
        err = np.abs(got.astype(np.float64) - want.astype(np.float64))
        worst = float(np.nanmax(err / ulp)) if err.size else 0.0
        ok = bool(np.isfinite(got).all() and worst <= 2.0 and not stray)
        out.append({
            "entry": symbol, "rows": rows, "accumulate": accumulate,
            "max_abs_error": float(np.nanmax(err)) if err.size else 0.0,
            "worst_ulp": worst, "ok": ok, "emulated_cycles": result.cycles,
            "modelled_cycles": int(modelled), **({"stray_writes": stray} if stray else {}),
        })  # fmt: skip
    return out


def _run_elementwise(program: Any, unit: ElementwiseUnit, rng: np.random.Generator) -> dict:
    placer = _Placer()
    dtype = np.dtype(np.uint8 if unit.dtype == "bytes" else np.float16 if unit.dtype == "f16"
                     else np.float32)  # fmt: skip
    if unit.dtype == "bytes":
        args = [rng.integers(0, 256, unit.count, dtype=np.uint8) for _ in range(unit.inputs)]
    else:
        in_dtype = np.dtype(np.float16 if unit.input_dtype == "f16" else np.float32)
        sizes = [unit.rows * unit.count] * unit.inputs
        if unit.broadcast:
            sizes[1] = unit.count
        args = [rng.uniform(-2, 2, n).astype(in_dtype) for n in sizes]
    tile = Tile(program)
    tile.max_cycles = 100_000 + 20 * _elementwise_model(unit)  # a runaway loop is a fault
    out_at = placer.take("standard", unit.nbytes, packed=True)
    garbage = rng.integers(0, 256, unit.nbytes, dtype=np.uint8)
    if unit.kind == "reduce_add":  # the output is read: args[0] is its prior value
        garbage = args.pop(0).view(np.uint8)
    tile.mem.write(out_at, garbage, 8)
    regs = {2: out_at, 11: STACK_TOP}
    addresses = []
    for a in args:
        addresses.append(placer.take("standard", a.nbytes, packed=True))
        tile.mem.write(addresses[-1], a.view(np.uint8), 8)
    if unit.table:  # more than six partials: $m3 points at their addresses
        table = np.array(addresses, np.uint32)
        regs[3] = placer.take("standard", table.nbytes, packed=True)
        tile.mem.write(regs[3], table.view(np.uint8), 4)
    else:
        regs.update({3 + i: at for i, at in enumerate(addresses)})
    if unit.kind == "copy":
        regs[4] = unit.nbytes
    if unit.kind == "fill_zero":
        regs[3] = unit.nbytes
    before = tile.mem.data.copy()
    result = tile.call(unit.entry, regs)
    stray = stray_writes(tile, before, [(out_at, unit.nbytes)])
    got = tile.mem.read(out_at, unit.nbytes, 8).view(dtype)
    if unit.kind == "reduce_add":
        args.insert(0, garbage.view(dtype))
    want = unit.reference(args)
    if unit.dtype == "bytes":
        err = np.abs(got.astype(np.int64) - want.astype(np.int64))
        worst = float(err.max())
        ok = worst == 0
    elif unit.dtype == "f16":
        err = np.abs(got.astype(np.float64) - want.astype(np.float64))
        ulp = np.spacing(np.maximum(np.abs(want), 2.0**-14).astype(np.float16)).astype(np.float64)
        worst = float(np.nanmax(err / ulp))
        ok = bool(np.isfinite(got).all() and worst <= 2.0)
    else:
        err = np.abs(got.astype(np.float64) - want.astype(np.float64))
        worst = float(np.nanmax(err / np.maximum(np.abs(want.astype(np.float64)), 1e-30)))
        ok = bool(np.isfinite(got).all() and worst <= 1e-6)
    return {
        "entry": unit.entry, "elements": unit.count, "max_abs_error": float(np.nanmax(err)),
        "worst_ulp" if unit.dtype == "f16" else "worst_relative": worst, "ok": ok and not stray,
        "emulated_cycles": result.cycles, "modelled_cycles": _elementwise_model(unit),
        **({"stray_writes": stray} if stray else {}),
    }  # fmt: skip


def _run_copy2d(program: Any, unit: Copy2dUnit, rng: np.random.Generator) -> dict:
    """Runs at seeded strides: the destination stride leaves a gap of 1..4 atoms between runs
    (random bytes that must survive), the source stride is anything from 0 (every run reads
    the same bytes) to 3 atoms more than a run; word units (``_a4`` or B 4 mod 8) get addresses
    4 mod 8."""
    u, b = unit.alignment, unit.run_bytes
    dst_stride = b + u * int(rng.integers(1, 5))
    src_stride = max(0, b + u * int(rng.integers(-2, 4)))
    if rng.integers(0, 4) == 0:
        src_stride = b  # contiguous source rows, the common case
    dst_ext, src_ext = unit.extents(dst_stride, src_stride)
    placer = _Placer()
    skew = 4 if unit.words else 0
    dst_at = placer.take("standard", dst_ext + skew + 64, packed=True) + skew
    src_at = placer.take("interleaved", src_ext + skew + 64, packed=True) + skew
    tile = Tile(program)
    modelled = _copy2d_model(unit, dst_stride, src_stride)
    tile.max_cycles = 100_000 + 20 * modelled  # a runaway loop is a fault
    prior = rng.integers(0, 256, dst_ext + 64, dtype=np.uint8)  # 64 guard bytes after the end
    data = rng.integers(0, 256, src_ext, dtype=np.uint8)
    tile.mem.write(dst_at, prior, 4)
    tile.mem.write(src_at, data, 4)
    regs = {2: dst_at, 3: src_at, 4: b, 5: unit.runs, 6: dst_stride, 7: src_stride,
            11: STACK_TOP}  # fmt: skip
    before = tile.mem.data.copy()
    result = tile.call(unit.entry, regs)
    runs = [(dst_at + r * dst_stride, b) for r in range(unit.runs)]
    stray = stray_writes(tile, before, runs)
    got = tile.mem.read(dst_at, dst_ext, 4)
    want = unit.reference(prior[:dst_ext], data, dst_stride, src_stride)
    err = np.abs(got.astype(np.int64) - want.astype(np.int64))
    wrong = int(np.count_nonzero(err))
    return {
        "entry": unit.entry, "runs": unit.runs, "run_bytes": b, "dst_stride": dst_stride,
        "src_stride": src_stride, "max_abs_error": float(err.max()), "wrong_bytes": wrong,
        "ok": wrong == 0 and not stray, "emulated_cycles": result.cycles,
        "modelled_cycles": modelled, **({"stray_writes": stray} if stray else {}),
    }  # fmt: skip


def _copy2d_model(unit: Copy2dUnit, dst_stride: int, src_stride: int) -> int:
    """The cost model's cycles for the call (low/costs.py copy_call_cycles), for comparison."""
    from ipu_stack.low import costs
    from ipu_stack.low.program import CopyCall, Ref

    call = CopyCall(0, Ref("o"), Ref("s"), unit.run_bytes, unit.runs, dst_stride, src_stride)
    return costs.copy_call_cycles(call)


def _elementwise_model(unit: ElementwiseUnit) -> int:
    """The cost model's cycles for this unit's call (low/costs.py), for comparison only."""
    from ipu_stack.low import costs
    from ipu_stack.low.program import AddCall, CopyCall, FillCall, MapCall, Ref, View

    if unit.kind == "copy":
        return costs.copy_call_cycles(CopyCall(0, Ref("o"), Ref("s"), unit.nbytes))
    if unit.kind == "fill_zero":
        return costs.copy_call_cycles(FillCall(0, Ref("o"), unit.nbytes))
    if unit.kind == "reduce_add":
        parts = tuple(Ref(f"p{i}") for i in range(unit.parts))
        return costs.add_call_cycles(
            AddCall(0, Ref("o"), parts, unit.count, ipu21.precision(unit.dtype))
        )
    view = View(Ref("o"), unit.rows, unit.count, unit.nbytes // unit.rows, unit.dtype)
    if unit.broadcast:
        row = View(Ref("b"), 1, unit.count, unit.nbytes // unit.rows, unit.dtype)
        return costs.map_call_cycles(MapCall(0, unit.kind[:3], view, (view, row)))
    if unit.kind == "gelu_tanh":
        tanh = (("approximate", "tanh"),)
        return costs.map_call_cycles(MapCall(0, "gelu", view, (view,), tanh))
    if unit.kind == "cast":
        eb = 2 if unit.input_dtype == "f16" else 4
        src = View(Ref("i"), 1, unit.count, unit.count * eb, unit.input_dtype)
        return costs.map_call_cycles(MapCall(0, "cast", view, (src,)))
    return costs.map_call_cycles(MapCall(0, unit.kind, view, (view, view)))

"""``run --kernels emulate``: kernel calls executed by their device code on the ISA emulator.

:class:`EmulatedKernels` is the simulator's kernel-call executor when it is chosen: a call whose
kernel has device code (F16/F8/F32 GEMMs; attention, see ``runtime/emulate_attention.py``;
contiguous add/mul of equal shapes or with a row vector; 8-byte copies and fills; copies of
runs at strides (``copy2d`` units, when source and destination bytes do not overlap); reduce-add of
up to 256 partials; GeLU, the unary kinds, sub/div and the column, scalar and [R, 1] forms of
:mod:`ipu_stack.kernels.units_unary`; layer norm, softmax and the row mean of
:mod:`ipu_stack.kernels.units_rowwise`; the indexing, integer and F8-cast kernels of
:mod:`ipu_stack.runtime.emulate_indexing`) runs its unit's assembly on
:class:`ipu_stack.isa.Tile` over the tile's memory bytes, in place; any other call keeps its
NumPy semantics and is counted as ``modelled``. The simulator clock still advances by the cost
model; the emulated cycles are reported next to it per kernel unit. GEMM calls run the
single-row-count unit of their row count (``gemm_..._rR_rR``), whose entry code is that of the
paired unit the package lists.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from ipu_stack.isa import Memory, Tile, load_unit
from ipu_stack.kernels import registry, units_unary
from ipu_stack.kernels.units import MAX_ATOMS, MAX_PARTS, MAX_RUNS, parse_copy2d, parse_unit
from ipu_stack.kernels.units_rowwise import ROWWISE_KINDS
from ipu_stack.kernels.units_rowwise import emulate_job as rowwise_emulate_job
from ipu_stack.low.program import AddCall, CopyCall, FillCall, GemmCall, KernelCall, MapCall
from ipu_stack.runtime import emulate_indexing
from ipu_stack.runtime.emulate_indexing import Trap, trap_error
from ipu_stack.target import ipu21

STACK_TOP = ipu21.TILE_MEMORY_END  # frames live above the loader limit, never allocated
TABLE_ADDRESS = ipu21.LOADER_LIMIT  # reduce_add address tables (up to 256 entries), same scratch


class EmulatedKernels:
    """Runs kernel calls on the emulator; keeps per-unit emulated and modelled cycles."""

    def __init__(self) -> None:
        self.units: dict[str, dict[str, int]] = defaultdict(
            lambda: {"calls": 0, "emulated_cycles": 0, "modelled_cycles": 0}
        )
        self._table: np.ndarray | None = None
        self._workspace: tuple[int, int] | None = None  # attention scratch, restored after
        self.modelled: dict[str, dict[str, int]] = defaultdict(
            lambda: {"calls": 0, "modelled_cycles": 0}
        )

    def run(self, tile_mem: Any, call: KernelCall, address: Any, modelled: int) -> bool:
        """Execute ``call`` if it has device code (True), else leave it to the semantics.

        ``address(ref, size, alignment, what)`` is the simulator's checked address of a ref.
        """
        self._tile_mem = tile_mem  # units_unary checks the zero pads of padded inputs
        job = self._unit(call, address)
        if job is None:
            kind = call.kind if isinstance(call, MapCall) else type(call).__name__
            if isinstance(call, GemmCall):
                kind = f"gemm_{call.precision.name}"
            self.modelled[kind]["calls"] += 1
            self.modelled[kind]["modelled_cycles"] += modelled
            return False
        name, source, flags, entry, regs = job
        program = load_unit(source, flags, name)
        scratch = STACK_TOP - TABLE_ADDRESS
        saved = tile_mem[-scratch:].copy()
        memory = Memory(tile_mem)
        if self._table is not None:
            memory.write(TABLE_ADDRESS, self._table.view(np.uint8), 4)
            self._table = None
        borrowed = None
        if self._workspace is not None:  # attention: a workspace the lowering does not carve
            lo, hi = (x - ipu21.TILE_MEMORY_BASE for x in self._workspace)
            borrowed, self._workspace = (lo, tile_mem[lo:hi].copy()), None
        try:
            result = Tile(program, memory).call(entry, {**regs, 11: STACK_TOP})
        except Trap as trap:  # a gather id out of range: the semantics' error
            raise trap_error(call, trap) from None
        tile_mem[-scratch:] = saved
        if borrowed is not None:
            tile_mem[borrowed[0] : borrowed[0] + len(borrowed[1])] = borrowed[1]
        unit = self.units[name]
        unit["calls"] += 1
        unit["emulated_cycles"] += result.cycles + ipu21.KERNEL_LAUNCH_CYCLES
        unit["modelled_cycles"] += modelled
        return True

    def _unit(self, call: KernelCall, address: Any) -> tuple | None:
        if isinstance(call, MapCall) and emulate_indexing.handles(call):
            return emulate_indexing.indexing_job(call, address)
        if isinstance(call, GemmCall):
            if call.precision is ipu21.F32 and 4 * max(call.k, call.c) > 0xFFFF:
                return None  # beyond gemm_f32.S's immediates (its .error): stays modelled
            il = "_interleaved" if call.weights == "interleaved" else ""
            name = f"gemm_{call.precision.name}{il}_k{call.k}_c{call.c}_r{call.rows}_r{call.rows}"
            v = registry.parse_gemm_variant(name)
            eb = call.precision.element_bytes
            ob = 4 if call.precision is ipu21.F32 else 2  # F32: gemm_f32.S, f32 output
            regs = {
                2: address(call.out, call.rows * call.c * ob, 32, "gemm output"),
                3: address(call.left, call.rows * call.k * eb, 32, "gemm left"),
                4: address(call.right, call.k * call.c * eb, 32, "gemm right"),
            }
            if call.precision is ipu21.F8:
                regs[5] = call.scale_exponent
            phase = "accumulate" if call.accumulate else "init"
            return name, v.source, tuple(v.flags()), v.entry_symbol(phase, call.rows), regs
        if isinstance(call, CopyCall) and call.rows > 1:  # runs at strides: copy2d units
            return _copy2d_job(call, address)
        if isinstance(call, (CopyCall, FillCall)):
            kind = "copy" if isinstance(call, CopyCall) else "fill_zero"
            align = 4 if kind == "copy" and call.size % 8 == 4 else 8  # word copies: 4 mod 8
            if call.size % align:
                return None
            unit = parse_unit(f"{kind}_b{call.size}")
            regs = {2: address(call.dst, call.size, align, kind)}
            if isinstance(call, CopyCall):
                regs[3] = address(call.src, call.size, align, "copy source")
            return unit.name, unit.source, tuple(unit.flags()), unit.entry, regs
        if isinstance(call, AddCall):
            eb = call.precision.element_bytes
            n = call.elements * eb
            if n % 8 or not 1 <= len(call.inputs) <= MAX_PARTS or call.precision is ipu21.F8:
                return None
            p = call.precision.name
            unit = parse_unit(f"reduce_add_{p}_p{len(call.inputs)}_n{call.elements}")
            regs = {2: address(call.out, n, 8, "reduce_add output")}
            inputs = [
                address(ref, n, 8, f"reduce_add input {i}") for i, ref in enumerate(call.inputs)
            ]
            if unit.table:  # the address table lives in the scratch above the loader limit
                regs[3] = TABLE_ADDRESS
                self._table = np.array(inputs, np.uint32)
            else:
                regs.update({3 + i: a for i, a in enumerate(inputs)})
            return unit.name, unit.source, tuple(unit.flags()), unit.entry, regs
        if isinstance(call, MapCall) and (
            job := units_unary.emulate_job(call, address, getattr(self, "_tile_mem", None))
        ):
            return job  # GeLU (erf, tanh), unary, sub/div, column and scalar broadcast forms
        if isinstance(call, MapCall) and call.kind == "cast":
            src, out = call.inputs[0], call.out
            pair = (src.dtype, out.dtype)
            if pair not in (("f16", "f32"), ("f32", "f16")) or (src.rows, src.cols) != (
                out.rows,
                out.cols,
            ):
                return None
            if call.attr("source_scale_exponent") or (out.rows * out.cols) % 4:
                return None
            n = out.rows * out.cols
            in_eb, out_eb = (2, 4) if src.dtype == "f16" else (4, 2)
            if src.stride != out.cols * in_eb or out.stride != out.cols * out_eb:
                return None
            unit = parse_unit(f"cast_{src.dtype}_{out.dtype}_n{n}")
            regs = {2: address(out.ref, n * out_eb, 8, "cast output"),
                    3: address(src.ref, n * in_eb, 8, "cast input")}  # fmt: skip
            return unit.name, unit.source, tuple(unit.flags()), unit.entry, regs
        if isinstance(call, MapCall) and call.kind == "attention":
            from ipu_stack.runtime.emulate_attention import attention_job

            job = attention_job(call, address)
            if job is not None:
                self._workspace = job[-1]
                return job[:-1]
            return None
        if isinstance(call, MapCall) and call.kind in ("add", "mul"):
            out = call.out
            if out.dtype not in ("f16", "f32"):
                return None  # integer add/mul: no device code
            eb = ipu21.precision(out.dtype).element_bytes
            views = (out, *call.inputs)
            if any((v.rows, v.cols, v.dtype) != (out.rows, out.cols, out.dtype) for v in views):
                return self._row_broadcast(call, address)
            if any(v.stride != out.cols * eb for v in views) or (out.rows * out.cols * eb) % 8:
                return None
            n = out.rows * out.cols
            unit = parse_unit(f"{call.kind}_{out.dtype}_n{n}")
            regs = {2 + i: address(v.ref, n * eb, 8, f"{call.kind} operand {i}")
                    for i, v in enumerate(views)}  # fmt: skip
            return unit.name, unit.source, tuple(unit.flags()), unit.entry, regs
        if isinstance(call, MapCall) and call.kind in ROWWISE_KINDS:  # layer norm, softmax, mean
            return rowwise_emulate_job(call, address)
        return None

    def _row_broadcast(self, call: MapCall, address: Any) -> tuple | None:
        """add/mul of an [R, C] operand and a [1, C] row vector (either order)."""
        out = call.out
        if out.dtype not in ("f16", "f32"):
            return None  # integer add/mul (add_i32, mul_i32): no device code
        eb = ipu21.precision(out.dtype).element_bytes
        if len(call.inputs) != 2:
            return None
        x, y = call.inputs
        shapes = ((x.rows, x.cols), (y.rows, y.cols))
        if shapes == ((out.rows, out.cols), (1, out.cols)):
            a, b = x, y
        elif shapes == ((1, out.cols), (out.rows, out.cols)):
            a, b = y, x
        else:  # column broadcast or mixed forms (a [1, 1] scalar of a 1-row output): no code yet
            return None
        if any(v.dtype != out.dtype for v in (a, b)) or (out.cols * eb) % 8:
            return None
        if a.stride != out.cols * eb or out.stride != out.cols * eb:
            return None
        unit = parse_unit(f"{call.kind}_{out.dtype}_rowbcast_r{out.rows}_c{out.cols}")
        n = out.rows * out.cols * eb
        regs = {2: address(out.ref, n, 8, f"{call.kind} output"),
                3: address(a.ref, n, 8, f"{call.kind} operand"),
                4: address(b.ref, out.cols * eb, 8, f"{call.kind} row vector")}  # fmt: skip
        return unit.name, unit.source, tuple(unit.flags()), unit.entry, regs

    def report(self) -> dict[str, Any]:
        """Per unit: calls, emulated and modelled cycles; and the calls left to semantics."""
        return {
            "emulated_units": {k: dict(v) for k, v in sorted(self.units.items())},
            "modelled_only": {k: dict(v) for k, v in sorted(self.modelled.items())},
        }


def _copy2d_job(call: CopyCall, address: Any) -> tuple | None:
    """A copy of ``rows`` runs at strides on ``copy2d_b{size}_r{rows}``: 64-bit atoms when
    size, strides and both addresses are multiples of 8, else the word unit (``_a4``). Runs
    whose source bytes overlap destination bytes stay with the semantics (the workers copy
    in parallel; the semantics copy run after run)."""
    n, rows, ds, ss = call.size, call.rows, call.dst_stride, call.src_stride
    if n % 4 or ds % 4 or ss % 4 or ds < n:
        return None  # the simulator's semantics reject it with their message
    if n // 4 > MAX_ATOMS or rows > MAX_RUNS:
        return None  # beyond the template's rpt counts and setzi immediates: stays modelled
    dst = address(call.dst, call.dst_extent, 4, "copy destination")
    src = address(call.src, call.src_extent, 4, "copy source")
    if _runs_overlap(dst, ds, src, ss, n, rows):
        return None
    wide = all(x % 8 == 0 for x in (ds, ss, dst, src))  # sizes 4 mod 8 are words anyway
    unit = parse_copy2d(f"copy2d_b{n}_r{rows}{'' if wide or n % 8 else '_a4'}")
    assert unit is not None
    regs = {2: dst, 3: src, 4: n, 5: rows, 6: ds, 7: ss}
    return unit.name, unit.source, tuple(unit.flags()), unit.entry, regs


def _runs_overlap(dst: int, ds: int, src: int, ss: int, n: int, rows: int) -> bool:
    """Whether any source run shares a byte with any destination run (destination runs are
    disjoint and ascending: ``ds >= n``)."""
    if src + (rows - 1) * ss + n <= dst or dst + (rows - 1) * ds + n <= src:
        return False
    starts = dst + ds * np.arange(rows, dtype=np.int64)
    s = src + ss * np.arange(rows, dtype=np.int64)
    last = np.searchsorted(starts, s + n, side="left") - 1  # the last run starting before s + n
    return bool(np.any((last >= 0) & (starts[np.maximum(last, 0)] + n > s)))

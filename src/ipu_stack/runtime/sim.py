"""SimDevice: the embedded IPU21 simulator, and the executable definition of a program.

Per-tile SRAM is a byte array at the IPU21 addresses (only tiles the program uses are
allocated). The host writes inputs and weights through bindings; exchange steps move words as
scheduled; kernels run their reference semantics (NumPy) on the bytes at their operand
addresses; each tile keeps a cycle clock.

It does not trust the compiler. It rejects allocations outside tile memory, in reserved
ranges, or overlapping another live allocation; accesses outside a live allocation or
misaligned for their kernel; schedules in which a receiver hears two senders in one cycle (or
that otherwise fail the independent exchange verifier); and a tile sending from bytes that the
same phase writes.

Numeric model of the F16 AMP GEMM (``f16v4hihov4amp``, "half in, half out"): inputs are f16,
and the partial sums live in memory as f16. For each K16 x C16 coefficient panel the engines
form the 16 products of a row in wider precision (modelled as f32) and add them to the f16
partial read from memory; the sum is rounded to f16 when written back. So rounding to f16
happens once per K16 panel, K/16 times per output. F32 GEMMs accumulate in f32 throughout.
The reduction add sums its inputs in f32 and rounds once to the tensor precision.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np
from scipy.special import erf  # at import: ~0.25 s, formerly inside the first run

from ipu_stack.errors import SimulationError
from ipu_stack.exchange.model import ExchangePhase, PhaseSchedule
from ipu_stack.exchange.verify import verify_schedule
from ipu_stack.gc_pause import collector_paused
from ipu_stack.kernels.registry import KernelSpec, gemm_kernel
from ipu_stack.kernels.semantics import decode_f143, encode_f143, gemm_f16
from ipu_stack.low.costs import call_cycles
from ipu_stack.low.program import (
    AddCall,
    ComputeStep,
    CopyCall,
    ExchangeStep,
    FillCall,
    GemmCall,
    KernelCall,
    LowProgram,
    MapCall,
    Ref,
    RepeatStep,
    Shard,
    Step,
    View,
)
from ipu_stack.place.assign import Placement
from ipu_stack.runtime import indexing_semantics
from ipu_stack.runtime.elementwise_sim import elementwise_semantics, gelu_tanh
from ipu_stack.runtime.gemm_f16 import (
    GemmOperands,
    f16_to_f32,
    finite_f16,
    gemm_f16_in_memory,
    to_f16_bits,
)
from ipu_stack.runtime.host_integers import host_int32
from ipu_stack.runtime.host_threads import one_blas_thread
from ipu_stack.runtime.map_f16 import binary_f16, run_binary_f16
from ipu_stack.runtime.map_tables import Tables, by_table, f16_rows
from ipu_stack.runtime.tile_memory import heap_kept, small_pages, tile_memories
from ipu_stack.target import ipu21

MEMORY_BYTES = ipu21.TILE_MEMORY_END - ipu21.TILE_MEMORY_BASE


@dataclass(slots=True)
class RunResult:
    outputs: dict[str, np.ndarray]
    cycles: int
    tile_cycles: np.ndarray
    step_cycles: list[int]
    seconds: float
    #: ``[step, tile]``: each tile's clock when the step ends (the per-step profile record)
    step_end_cycles: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))


class StepObserver(Protocol):
    """Told about each executed step: the one place runs are recorded (profiles, progress).

    ``start`` and ``end`` are every tile's clock before and after the step (a loop body's
    steps are reported once per iteration). An exchange step starts at ``start.max()``: its
    sync takes ``SYNC_CYCLES``, then the schedule's horizon.
    """

    def step(self, index: int, step: Step, start: np.ndarray, end: np.ndarray) -> None: ...


class SimDevice:
    """Runs a placed, scheduled program on simulated IPU21 tiles."""

    name = "sim"

    def __init__(self, clock_hz: int = ipu21.CLOCK_HZ) -> None:
        self.clock_hz = clock_hz
        # byte offsets of iterated buffers in the current loop iteration: (tile, buffer) -> bytes
        self._offsets: dict[tuple[int, str], int] = {}
        #: the kernel-call executor: None runs NumPy semantics; ``run --kernels emulate``
        #: sets a :class:`ipu_stack.runtime.emulate.EmulatedKernels`
        self.kernels: Any = None
        self._tables = Tables(map_semantics)  # unary f16 kernels' results by input bits

    # -- checks -------------------------------------------------------------------------------
    @staticmethod
    def check_allocations(placement: Placement) -> None:
        """Reject allocations outside tile memory, in reserved ranges, or overlapping."""
        seen: set[tuple] = set()
        for tile, allocs in enumerate(placement.allocations):
            key = tuple(sorted((a.address, a.size, a.live) for a in allocs.values()))
            if key in seen:
                continue
            seen.add(key)
            items = sorted(allocs.values(), key=lambda a: a.address)
            for a in items:
                end = a.address + a.size
                if a.address < ipu21.TILE_MEMORY_BASE or end > ipu21.LOADER_LIMIT:
                    raise SimulationError(
                        f"tile {tile}: allocation {a.name!r} [{a.address:#x}, {end:#x}) lies "
                        f"outside loadable tile memory [{ipu21.TILE_MEMORY_BASE:#x}, "
                        f"{ipu21.LOADER_LIMIT:#x})"
                    )
                for lo, hi in ipu21.RESERVED_RANGES:
                    if a.address < hi and lo < end:
                        raise SimulationError(
                            f"tile {tile}: allocation {a.name!r} [{a.address:#x}, {end:#x}) "
                            f"overlaps the reserved range [{lo:#x}, {hi:#x})"
                        )
            for i, a in enumerate(items):
                for b in items[i + 1 :]:
                    if b.address >= a.address + a.size:
                        break
                    if a.live[0] < b.live[1] and b.live[0] < a.live[1]:
                        raise SimulationError(
                            f"tile {tile}: live allocations {a.name!r} [{a.address:#x}, "
                            f"{a.address + a.size:#x}) and {b.name!r} [{b.address:#x}, "
                            f"{b.address + b.size:#x}) overlap during steps "
                            f"{max(a.live[0], b.live[0])}..{min(a.live[1], b.live[1]) - 1}"
                        )

    def _span(
        self,
        placement: Placement,
        tile: int,
        ref: Ref,
        size: int,
        step: int | None,
        alignment: int,
        what: str,
    ) -> int:
        """Check an access and return its offset into the tile's memory array."""
        alloc = placement.allocations[tile].get(ref.buffer)
        if alloc is None:
            raise SimulationError(
                f"step {step} tile {tile}: {what} names no allocation {ref.buffer!r}"
            )
        offset = ref.offset + self._offsets.get((tile, ref.buffer), 0)
        address = alloc.address + offset
        if address < ipu21.TILE_MEMORY_BASE or address + size > ipu21.TILE_MEMORY_END:
            raise SimulationError(
                f"step {step} tile {tile}: {what} [{address:#x}, {address + size:#x}) is past "
                f"tile memory [{ipu21.TILE_MEMORY_BASE:#x}, {ipu21.TILE_MEMORY_END:#x})"
            )
        if address % alignment:
            raise SimulationError(
                f"step {step} tile {tile}: {what} at {address:#x} is not {alignment}-byte aligned"
            )
        if offset < 0 or offset + size > alloc.size:
            raise SimulationError(
                f"step {step} tile {tile}: {what} [{address:#x}, {address + size:#x}) runs "
                f"outside its allocation {alloc.name!r} [{alloc.address:#x}, "
                f"{alloc.address + alloc.size:#x})"
            )
        if step is not None and not alloc.live[0] <= step < alloc.live[1]:
            raise SimulationError(
                f"step {step} tile {tile}: {what} uses {alloc.name!r} outside its lifetime "
                f"{alloc.live}"
            )
        return address - ipu21.TILE_MEMORY_BASE

    # -- host access --------------------------------------------------------------------------
    def write_value(
        self, mem: np.ndarray, placement: Placement, shards: tuple[Shard, ...], array2: np.ndarray
    ) -> None:
        """Host writes: each shard's region of the flat-row view ``array2`` ([N, C])."""
        eb = array2.dtype.itemsize
        for sh in shards:
            block = array2[sh.rows[0] : sh.rows[1], sh.cols[0] : sh.cols[1]]
            if sh.transposed:
                block = block.T
            nrows, ncols = block.shape
            off = self._span(
                placement,
                sh.tile,
                sh.ref,
                (nrows - 1) * sh.row_stride + ncols * eb,
                0,
                4,
                "host write",
            )
            if nrows and ncols and off % eb == 0 and sh.row_stride % eb == 0:
                # one strided copy straight into tile memory (no contiguous temporary)
                shape, strides = (nrows, ncols), (sh.row_stride, eb)
                np.ndarray(shape, array2.dtype, mem[sh.tile], off, strides)[...] = block
                continue
            block = np.ascontiguousarray(block)
            dest = _strided_rows(mem[sh.tile], off, nrows, ncols * eb, sh.row_stride)
            dest[...] = block.view(np.uint8).reshape(nrows, ncols * eb).view(dest.dtype)

    def read_value(
        self,
        mem: np.ndarray,
        placement: Placement,
        shards: tuple[Shard, ...],
        shape2: tuple[int, int],
        dtype: np.dtype,
    ) -> np.ndarray:
        """Host reads: the flat-row view ``[N, C]`` of a value from its shards.

        Raises:
            SimulationError: if the shards leave elements of the value uncovered.
        """
        out = np.zeros(shape2, dtype=dtype)
        covered = np.zeros(shape2, dtype=bool)
        eb = dtype.itemsize
        for sh in shards:
            nrows, ncols = sh.rows[1] - sh.rows[0], sh.cols[1] - sh.cols[0]
            off = self._span(
                placement,
                sh.tile,
                sh.ref,
                (nrows - 1) * sh.row_stride + ncols * eb,
                None,
                4,
                "host read",
            )
            rows = _strided_rows(mem[sh.tile], off, nrows, ncols * eb, sh.row_stride)
            out[sh.rows[0] : sh.rows[1], sh.cols[0] : sh.cols[1]] = (
                np.ascontiguousarray(rows).view(np.uint8).view(dtype).reshape(nrows, ncols)
            )
            covered[sh.rows[0] : sh.rows[1], sh.cols[0] : sh.cols[1]] = True
        if not covered.all():
            missing = int((~covered).sum())
            raise SimulationError(f"{missing} elements of the value are held by no shard")
        return out

    # -- execution ----------------------------------------------------------------------------
    @small_pages()
    @heap_kept()
    @collector_paused()
    def run(
        self,
        program: LowProgram,
        placement: Placement,
        schedules: dict[int, tuple[ExchangePhase, PhaseSchedule]],
        feeds: dict[str, np.ndarray],
        observer: StepObserver | None = None,
    ) -> RunResult:
        """Execute ``program``: host writes, every step in order, host reads.

        Args:
            program: the lowered program.
            placement: its buffer addresses.
            schedules: for each exchange step index, its physical phase and schedule.
            feeds: arrays for every host input and parameter, by name.
            observer: told about every executed step (profiles, progress), see
                :class:`StepObserver`.

        Raises:
            SimulationError: on anything the hardware would not do (see module docstring).
        """
        start = time.perf_counter()
        self.check_allocations(placement)
        mem = tile_memories(program.tile_count, MEMORY_BYTES)
        self.write_bindings(mem, program, placement, feeds)
        clock = np.zeros(program.tile_count, dtype=np.int64)
        step_cycles = [0] * len(program.steps)
        step_end_cycles = np.zeros((len(program.steps), program.tile_count), dtype=np.int64)

        def execute(index: int) -> None:
            step = program.steps[index]
            before = int(clock.max())
            start_clock = clock.copy() if observer is not None else clock
            if isinstance(step, ComputeStep):
                self._compute(mem, placement, step.calls, index, clock)
            elif isinstance(step, ExchangeStep):
                phase, schedule = schedules[index]
                self._exchange(mem, placement, step.transfers, phase, schedule, index)
                clock[:] = before + ipu21.SYNC_CYCLES + schedule.horizon
            step_cycles[index] += int(clock.max()) - before
            step_end_cycles[index] = clock
            if observer is not None:
                observer.step(index, step, start_clock, clock.copy())

        index = 0
        while index < len(program.steps):
            step = program.steps[index]
            if isinstance(step, RepeatStep):
                body = range(index + 1, index + 1 + step.length)
                for i in range(step.count):  # iteration i reads block i of iterated buffers
                    self._offsets = {key: i * stride for key, stride in step.iterated.items()}
                    for j in body:
                        execute(j)
                self._offsets = {}
                index = body.stop
                continue
            execute(index)
            index += 1
        outputs = self.read_outputs(mem, program, placement)
        seconds = time.perf_counter() - start
        return RunResult(outputs, int(clock.max()), clock, step_cycles, seconds, step_end_cycles)

    def write_bindings(
        self,
        mem: np.ndarray,
        program: LowProgram,
        placement: Placement,
        feeds: dict[str, np.ndarray] | Any,
    ) -> None:
        """Host writes of every input and parameter (F8 values F143-encoded)."""
        for binding in program.bindings:
            if binding.role == "output":
                continue
            if binding.name not in feeds:
                raise SimulationError(f"no data for {binding.role} {binding.name!r}")
            array = np.asarray(feeds[binding.name])
            if tuple(array.shape) != binding.shape:
                raise SimulationError(
                    f"{binding.role} {binding.name!r}: expected shape {binding.shape}, "
                    f"got {tuple(array.shape)}"
                )
            dtype = np.dtype(ipu21.precision(binding.dtype).numpy_name)
            if binding.dtype == "i32":
                array = host_int32(array, f"i32 input {binding.name!r}", SimulationError)
            stored = (
                encode_f143(array, binding.scale_exponent)
                if binding.dtype == "f8"
                else array.astype(dtype)
            )
            self.write_value(mem, placement, binding.shards, _as2d(stored))

    def read_outputs(
        self, mem: np.ndarray, program: LowProgram, placement: Placement
    ) -> dict[str, np.ndarray]:
        """Host reads of every output binding."""
        outputs = {}
        for binding in program.bindings:
            if binding.role != "output":
                continue
            dtype = np.dtype(ipu21.precision(binding.dtype).numpy_name)
            shape2 = _shape2(binding.shape)
            try:
                value = self.read_value(mem, placement, binding.shards, shape2, dtype)
            except SimulationError as err:
                raise SimulationError(f"output {binding.name!r}: {err}") from None
            if binding.dtype == "f8":
                value = decode_f143(value, binding.scale_exponent)
            outputs[binding.name] = value.reshape(binding.shape)
        return outputs

    def _compute(
        self,
        mem: np.ndarray,
        placement: Placement,
        calls: list[KernelCall],
        step: int,
        clock: np.ndarray,
    ) -> None:
        # Calls run in program order; a run of consecutive GEMM calls executes as one batch
        # (each tile's calls stay ordered, and tiles share no memory).
        gemms: dict[tuple, list[GemmCall]] = defaultdict(list)
        ordinal: dict[int, int] = defaultdict(int)  # GEMM calls per tile in the current run
        maps: list[MapCall | AddCall] = []  # a run of elementwise / row-wise / add calls
        for call in calls:
            clock[call.tile] += call_cycles(call)
            if self.kernels is not None:
                ordinal.clear()
                self._flush(mem, placement, gemms, step)
                self._map_run(mem, placement, maps, step)
                maps = []
                if self._emulate(mem, placement, call, step):
                    continue
            if isinstance(call, AddCall) or (
                isinstance(call, MapCall) and call.kind in BATCHED_MAP_KINDS
            ):
                self._flush(mem, placement, gemms, step)
                ordinal.clear()
                maps.append(call)
                continue
            if maps:
                self._map_run(mem, placement, maps, step)
                maps = []
            if isinstance(call, GemmCall):
                n = ordinal[call.tile]
                ordinal[call.tile] = n + 1
                key = (
                    n,
                    call.rows,
                    call.k,
                    call.c,
                    call.precision.name,
                    call.accumulate,
                    call.scale_exponent,
                )
                gemms[key].append(call)
                continue
            ordinal.clear()
            self._flush(mem, placement, gemms, step)
            self._simple(mem, placement, call, step)
        self._map_run(mem, placement, maps, step)
        self._flush(mem, placement, gemms, step)

    def _emulate(self, mem: np.ndarray, placement: Placement, call: KernelCall, step: int) -> bool:
        """Run ``call`` on the ISA emulator when it has device code (``self.kernels``)."""

        def address(ref: Ref, size: int, alignment: int, what: str) -> int:
            off = self._span(placement, call.tile, ref, size, step, alignment, what)
            return off + ipu21.TILE_MEMORY_BASE

        return bool(self.kernels.run(mem[call.tile], call, address, call_cycles(call)))

    def _map_run(
        self, mem: np.ndarray, placement: Placement, calls: list[MapCall | AddCall], step: int
    ) -> None:
        """Run consecutive map calls, those of equal kind, shapes and attributes at the same
        position in their tile's sequence as one batched NumPy evaluation (tiles share no
        memory, and each tile's calls stay in order)."""
        for mixed in map_call_groups(calls):
            if isinstance(mixed[0], AddCall):
                self._add_batch(mem, placement, cast(list[AddCall], mixed), step)
                continue
            group = cast(list[MapCall], mixed)
            t0 = group[0]
            if by_table(t0):
                self._map_by_table(mem, placement, group, step)
                continue

            def span(tile: int, what: str, ref: Any, size: int, alignment: int) -> int:
                return self._span(placement, tile, ref, size, step, alignment, what)

            if binary_f16(t0) and run_binary_f16(mem, group, span):
                continue
            args = [
                np.stack(
                    [
                        self._read_view(
                            mem, placement, c.tile, c.inputs[i], step, f"{c.kind} input {i}"
                        )
                        for c in group
                    ]
                )
                for i in range(len(t0.inputs))
            ]
            results = map_semantics(t0, args)
            for call, result in zip(group, results, strict=True):
                self._write_map(mem, placement, call, result, step)

    def _add_batch(
        self, mem: np.ndarray, placement: Placement, group: list[AddCall], step: int
    ) -> None:
        """Add calls of one shape on different tiles at once: ``out += inputs`` summed in f32
        in input order and rounded once, as :meth:`_simple` does call by call."""
        t0 = group[0]
        dtype = np.dtype(t0.precision.numpy_name)
        n = t0.elements * dtype.itemsize
        spans = []
        for call in group:
            out = self._span(placement, call.tile, call.out, n, step, 8, "add output")
            ins = [
                self._span(placement, call.tile, ref, n, step, 8, "add input")
                for ref in call.inputs
            ]
            spans.append((call.tile, out, ins))
        total = np.empty((len(group), t0.elements), np.float32)
        wide = np.empty_like(total)
        part = np.empty((len(group), t0.elements), dtype)
        for j in range(-1, len(t0.inputs)):  # the output, then each input in order
            for i, (t, out, ins) in enumerate(spans):
                at = out if j < 0 else ins[j]
                part[i] = mem[t, at : at + n].view(dtype)
            if dtype == np.float16 and finite_f16(part):
                f16_to_f32(part, wide)  # exact, faster than NumPy's conversion
            else:
                wide[...] = part
            if j < 0:
                total, wide = wide, total
            else:
                total += wide
        result = _to_dtype(total, dtype).view(np.uint8)
        for i, (t, out, _) in enumerate(spans):
            mem[t, out : out + n] = result[i]

    def _map_by_table(
        self, mem: np.ndarray, placement: Placement, group: list[MapCall], step: int
    ) -> None:
        """Unary f16 calls by table lookup (runtime/map_tables.py), the same bits as
        :meth:`_map_run`'s evaluation, with its checks; pads written as zeros."""
        table = self._tables.get(group[0])
        for call in group:
            x, out = call.inputs[0], call.out
            src = self._span(
                placement, call.tile, x.ref, (x.rows - 1) * x.stride + 2 * x.cols, step, 4,
                f"{call.kind} input 0",
            )  # fmt: skip
            dst = self._span(
                placement, call.tile, out.ref, out.rows * out.stride, step, 8,
                f"{call.kind} output",
            )  # fmt: skip
            result = table[f16_rows(mem[call.tile], src, x.rows, x.cols, x.stride)]
            rows = mem[call.tile, dst : dst + out.rows * out.stride].reshape(out.rows, -1)
            rows[:, 2 * out.cols :] = 0  # pads are written as zeros
            rows[:, : 2 * out.cols].view(np.uint16)[...] = result

    def _flush(
        self, mem: np.ndarray, placement: Placement, gemms: dict[tuple, list[GemmCall]], step: int
    ) -> None:
        for key in sorted(gemms, key=lambda k: k[0]):
            _, rows, k, c, _, accumulate, _ = key
            group = gemms[key]
            self._gemm_batch(
                mem, placement, group, rows, k, c, group[0].precision, accumulate, step
            )
        gemms.clear()

    def _read_view(
        self, mem: np.ndarray, placement: Placement, tile: int, view: View, step: int, what: str
    ) -> np.ndarray:
        dtype = np.dtype(ipu21.precision(view.dtype).numpy_name)
        row_bytes = view.cols * dtype.itemsize
        off = self._span(
            placement, tile, view.ref, (view.rows - 1) * view.stride + row_bytes, step, 4, what
        )
        rows = _strided_rows(mem[tile], off, view.rows, row_bytes, view.stride)
        return np.ascontiguousarray(rows).view(np.uint8).view(dtype).reshape(view.rows, view.cols)

    def _map(self, mem: np.ndarray, placement: Placement, call: MapCall, step: int) -> None:
        t = call.tile
        args = [
            self._read_view(mem, placement, t, v, step, f"{call.kind} input {i}")
            for i, v in enumerate(call.inputs)
        ]
        self._write_map(mem, placement, call, map_semantics(call, args), step)

    def _write_map(
        self, mem: np.ndarray, placement: Placement, call: MapCall, result: np.ndarray, step: int
    ) -> None:
        t = call.tile
        out = call.out
        dtype = np.dtype(ipu21.precision(out.dtype).numpy_name)
        off = self._span(
            placement, t, out.ref, out.rows * out.stride, step, 8, f"{call.kind} output"
        )
        padded = np.zeros((out.rows, out.stride), dtype=np.uint8)  # pads are written as zeros
        padded[:, : out.cols * dtype.itemsize] = (
            result.astype(dtype).reshape(out.rows, out.cols).view(np.uint8)
        )
        mem[t, off : off + out.rows * out.stride] = padded.reshape(-1)

    def _simple(self, mem: np.ndarray, placement: Placement, call: KernelCall, step: int) -> None:
        t = call.tile
        if isinstance(call, MapCall):
            self._map(mem, placement, call, step)
            return
        if isinstance(call, CopyCall):
            n, rows = call.size, call.rows
            src = self._span(placement, t, call.src, call.src_extent, step, 4, "copy source")
            dst = self._span(placement, t, call.dst, call.dst_extent, step, 4, "copy destination")
            if rows == 1:
                mem[t, dst : dst + n] = mem[t, src : src + n]
            else:  # runs in order (a later run may overwrite an earlier one's bytes)
                ss, ds = call.src_stride, call.dst_stride
                if ss % 4 or ds % 4 or ds < n:
                    raise SimulationError(
                        f"step {step} tile {t}: copy of {rows} runs of {n} bytes with strides "
                        f"{ss} (source) and {ds} (destination): not word multiples, or runs overlap"
                    )
                for r in range(rows):
                    a, b = dst + r * ds, src + r * ss
                    mem[t, a : a + n] = mem[t, b : b + n]
        elif isinstance(call, FillCall):
            dst = self._span(placement, t, call.dst, call.size, step, 4, "fill")
            mem[t, dst : dst + call.size] = 0
        elif isinstance(call, AddCall):
            dtype = np.dtype(call.precision.numpy_name)
            n = call.elements * dtype.itemsize
            out = self._span(placement, t, call.out, n, step, 8, "add output")
            total = mem[t, out : out + n].view(dtype).astype(np.float32)
            for ref in call.inputs:
                src = self._span(placement, t, ref, n, step, 8, "add input")
                total += mem[t, src : src + n].view(dtype).astype(np.float32)
            mem[t, out : out + n] = total.astype(dtype).view(np.uint8)

    def _gemm_batch(
        self,
        mem: np.ndarray,
        placement: Placement,
        group: list[GemmCall],
        rows: int,
        k: int,
        c: int,
        precision: ipu21.Precision,
        accumulate: bool,
        step: int,
    ) -> None:
        # Operand rules, semantics: the kernel registry's definition (one per kernel).
        spec = gemm_kernel(precision.name, group[0].weights)
        assert spec.reference is not None
        dtype = np.dtype(precision.numpy_name)
        out_dtype = np.dtype(group[0].output_precision.numpy_name)
        eb, out_eb = dtype.itemsize, out_dtype.itemsize
        sizes = {"left": rows * k * eb, "right": k * c * eb, "output": rows * c * out_eb}
        ops = GemmOperands([], [], [], [], rows, k, c, accumulate)
        for call in group:
            t = call.tile
            rules = gemm_kernel(precision.name, call.weights)
            spans = {}
            for name, ref in (("left", call.left), ("right", call.right), ("output", call.out)):
                align = rules.operand(name).alignment
                spans[name] = self._span(
                    placement, t, ref, sizes[name], step, align, f"gemm {name}"
                )
            _check_kernel_memory(rules, spans, sizes, t, step)
            ops.tiles.append(t)
            ops.lefts.append(spans["left"])
            ops.rights.append(spans["right"])
            ops.outs.append(spans["output"])
        # F16: the definition's bits by a faster route where it applies (runtime/gemm_f16.py)
        if spec.reference is gemm_f16 and not group[0].scale_exponent:
            with one_blas_thread():
                if gemm_f16_in_memory(mem, ops):
                    return
        lefts = np.empty((len(group), rows, k), dtype)
        rights = np.empty((len(group), k, c), dtype)
        outs = np.empty((len(group), rows, c), out_dtype)
        for i, (t, lo, ro, oo) in enumerate(
            zip(ops.tiles, ops.lefts, ops.rights, ops.outs, strict=True)
        ):
            lefts[i] = mem[t, lo : lo + rows * k * eb].view(dtype).reshape(rows, k)
            rights[i] = mem[t, ro : ro + k * c * eb].view(dtype).reshape(k, c)
            if accumulate:
                outs[i] = mem[t, oo : oo + rows * c * out_eb].view(out_dtype).reshape(rows, c)
        extra = {"scale_exponent": group[0].scale_exponent} if group[0].scale_exponent else {}
        with one_blas_thread():
            outs = spec.reference(lefts, rights, outs, accumulate, **extra).astype(
                out_dtype, copy=False
            )
        nbytes = rows * c * out_eb
        for i, (t, oo) in enumerate(zip(ops.tiles, ops.outs, strict=True)):
            mem[t, oo : oo + nbytes] = outs[i].reshape(-1).view(np.uint8)

    def _exchange(
        self,
        mem: np.ndarray,
        placement: Placement,
        transfers: list,
        phase: ExchangePhase,
        schedule: PhaseSchedule,
        step: int,
    ) -> None:
        verify_schedule(phase, schedule)  # independent of the scheduler that produced it
        reads: dict[int, list[tuple[int, int]]] = defaultdict(list)
        writes: dict[int, list[tuple[int, int]]] = defaultdict(list)
        moves = []
        for t in transfers:
            n = t.words * ipu21.WORD_BYTES
            src = self._span(placement, t.source_tile, t.source, n, step, 4, "exchange send")
            reads[t.source_tile].append((src, src + n))
            dsts = []
            for tile, ref in t.destinations:
                dst = self._span(placement, tile, ref, n, step, 4, "exchange receive")
                writes[tile].append((dst, dst + n))
                dsts.append((tile, dst))
            moves.append((t.source_tile, src, n, dsts))
        for tile, ws in writes.items():
            _check_disjoint(tile, ws, reads.get(tile, []), step)
        data = [mem[s, o : o + n].copy() for s, o, n, _ in moves]
        for (_, _, n, dsts), words in zip(moves, data, strict=True):
            for tile, dst in dsts:
                mem[tile, dst : dst + n] = words


def _to_dtype(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``values.astype(dtype)`` for f32 ``values``; to f16 by the exact rounding of the GEMM
    fast path (:func:`~ipu_stack.runtime.gemm_f16.to_f16_bits`) where every value is finite
    and at most the f16 maximum."""
    if dtype == np.float16 and values.size:
        bits = to_f16_bits(values)
        if bits is not None:
            return bits.view(np.float16)
    return values.astype(dtype)


def _elements(offset: int, size: int) -> set[tuple[str, int]]:
    """Memory elements (16 KiB standard, 32 KiB interleaved pairs) a byte span touches."""
    out = set()
    for address in range(offset, offset + size, ipu21.ELEMENT_BYTES):
        out.add(_element(address + ipu21.TILE_MEMORY_BASE))
    out.add(_element(offset + size - 1 + ipu21.TILE_MEMORY_BASE))
    return out


def _element(address: int) -> tuple[str, int]:
    if address < ipu21.INTERLEAVED_BASE:
        return ("standard", address // ipu21.ELEMENT_BYTES)
    return ("interleaved", (address - ipu21.INTERLEAVED_BASE) // ipu21.INTERLEAVED_ELEMENT_BYTES)


def _check_kernel_memory(
    spec: KernelSpec, spans: dict[str, int], sizes: dict[str, int], tile: int, step: int
) -> None:
    """A kernel's operand regions and memory-element relations, as its registry entry states."""
    for name, offset in spans.items():
        address = offset + ipu21.TILE_MEMORY_BASE
        if spec.operand(name).region == "interleaved" and address < ipu21.INTERLEAVED_BASE:
            raise SimulationError(
                f"step {step} tile {tile}: {spec.name} {name} at {address:#x} must be in the "
                f"interleaved region (from {ipu21.INTERLEAVED_BASE:#x})"
            )
    for rel in spec.relations:
        a, b = rel.operands
        shared = _elements(spans[a], sizes[a]) & _elements(spans[b], sizes[b])
        if rel.kind == "distinct_element" and shared:
            raise SimulationError(
                f"step {step} tile {tile}: {spec.name} {a} and {b} share a memory element "
                f"({rel.why})"
            )


def _check_disjoint(
    tile: int, writes: list[tuple[int, int]], reads: list[tuple[int, int]], step: int
) -> None:
    """A tile must not receive twice into one byte, nor send bytes that the phase writes."""
    ws = sorted(writes)
    for (_a0, a1), (b0, b1) in itertools.pairwise(ws):
        if b0 < a1:
            raise SimulationError(
                f"step {step} tile {tile}: two receives write [{b0 + ipu21.TILE_MEMORY_BASE:#x}, "
                f"{min(a1, b1) + ipu21.TILE_MEMORY_BASE:#x})"
            )
    if not reads:
        return
    starts = np.array([w[0] for w in ws])
    ends = np.array([w[1] for w in ws])
    for r0, r1 in reads:
        i = np.searchsorted(starts, r1) - 1
        if i >= 0 and ends[: i + 1].max() > r0:
            raise SimulationError(
                f"step {step} tile {tile}: sends bytes [{r0 + ipu21.TILE_MEMORY_BASE:#x}, "
                f"{r1 + ipu21.TILE_MEMORY_BASE:#x}) that the same phase receives into"
            )


def _strided_rows(
    tile_mem: np.ndarray, offset: int, nrows: int, row_bytes: int, stride: int
) -> np.ndarray:
    """A (rows, row_bytes) view of tile memory; 32-bit elements when everything is aligned."""
    if offset % 4 == 0 and row_bytes % 4 == 0 and stride % 4 == 0:
        words = tile_mem.view(np.uint32)[offset // 4 :]
        return np.lib.stride_tricks.as_strided(
            words, shape=(nrows, row_bytes // 4), strides=(stride, 4)
        )
    return np.lib.stride_tricks.as_strided(
        tile_mem[offset:], shape=(nrows, row_bytes), strides=(stride, 1)
    )


#: Map kinds whose semantics work on stacked ``[calls, rows, cols]`` operands as well.
BATCHED_MAP_KINDS = frozenset({"add", "mul", "gelu", "cast", "layer_norm", "softmax"})


def map_call_groups(calls: list[MapCall | AddCall]) -> list[list[MapCall | AddCall]]:
    """Calls of one run grouped for batched evaluation, in an order that keeps every tile's
    calls in program order: the n-th call of each tile goes into round n; within a round,
    calls of equal kind, attributes and operand shapes form one group."""
    rounds: list[dict[tuple, list[MapCall | AddCall]]] = []
    seen: dict[int, int] = defaultdict(int)
    for call in calls:
        n = seen[call.tile]
        seen[call.tile] = n + 1
        if n == len(rounds):
            rounds.append({})
        if isinstance(call, AddCall):
            key: tuple = ("add call", call.elements, len(call.inputs), call.precision.name)
        else:
            shapes = tuple((v.rows, v.cols, v.dtype) for v in (call.out, *call.inputs))
            key = (call.kind, call.attrs, shapes)
        rounds[n].setdefault(key, []).append(call)
    return [group for r in rounds for group in r.values()]


def map_semantics(call: MapCall, args: list[np.ndarray]) -> np.ndarray:
    """NumPy semantics of the non-GEMM kernels: f32 arithmetic, rounded once on output."""
    if indexing_semantics.handles(call):  # integer, indexing and rearrangement kernels
        return indexing_semantics.indexing_semantics(call, args)
    x = [a.astype(np.float32) for a in args]
    if call.kind == "cast":
        source = decode_f143(args[0], int(call.attr("source_scale_exponent")))
        if call.out.dtype == "f8":
            return encode_f143(source, int(call.attr("scale_exponent")))
        return source
    if call.kind == "add":
        return x[0] + x[1]
    if call.kind == "mul":
        return x[0] * x[1]
    if call.kind == "gelu" and dict(call.attrs).get("approximate") == "tanh":
        return gelu_tanh(x[0])
    if (result := elementwise_semantics(call, x)) is not None:
        return result
    if call.kind == "gelu":
        return x[0] * 0.5 * (1.0 + erf(x[0] / np.float32(np.sqrt(2.0))))
    if call.kind == "layer_norm":
        mean = x[0].mean(axis=-1, keepdims=True)
        var = ((x[0] - mean) ** 2).mean(axis=-1, keepdims=True)
        eps = np.float32(call.attr("epsilon"))
        return (x[0] - mean) / np.sqrt(var + eps) * x[1] + x[2]
    if call.kind == "softmax":
        return _softmax_rows(x[0])
    if call.kind == "attention":
        q, k, v = x[:3]
        s = (q @ k.T) * np.float32(call.attr("scale"))
        if len(x) == 4:  # additive mask: a [rows, Tk] block, or one row / column broadcast
            s = s + x[3]
        if call.attr("causal"):
            q0, tq = int(call.attr("q_offset")), int(call.attr("q_total"))
            qi = np.arange(q0, q0 + q.shape[0])[:, None] + (k.shape[0] - tq)
            s = np.where(np.arange(k.shape[0])[None, :] > qi, -np.inf, s)
        return _softmax_rows(s) @ v
    raise SimulationError(f"no semantics for kernel kind {call.kind!r}")


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; a row whose every entry is -inf (all keys blocked) gives
    zeros, the value of SDPA's NaN guard ``Where(IsNaN(p), 0, p)`` that the importer absorbs."""
    top = s.max(axis=-1, keepdims=True)
    blocked = top == -np.inf
    e = np.exp(s - np.where(blocked, 0, top).astype(s.dtype))
    return e / np.where(blocked, 1, e.sum(axis=-1, keepdims=True)).astype(s.dtype)


def _as2d(array: np.ndarray) -> np.ndarray:
    return array.reshape(_shape2(array.shape))


def _shape2(shape: tuple[int, ...]) -> tuple[int, int]:
    """The flat-row view [N, C] of a shape."""
    return (int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1, shape[-1])

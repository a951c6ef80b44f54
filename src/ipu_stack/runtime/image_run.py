"""Run a package from its tile images: decode and execute each tile's supervisor code.

The interpreter covers the subset ``emit_tile_code`` emits (``setzi``, ``ld32``, ``st32``,
``add``, ``call``, ``br``, ``brz``, ``sync``; exchange rows go to
:mod:`ipu_stack.runtime.exchange_sim`). Words are fetched from the tile's memory, where the
image segments were loaded, and decoded by :mod:`ipu_stack.tilecode.decode` (which shares no
code with the encoder). Tiles run until they block at a ``sync``; when every tile waits at a
``sync 3`` the kernel calls made since the last barrier run (the registry's reference
semantics, on the operands the code put in ``$m2``.., checked against the package's
allocations), the global sync costs ``SYNC_CYCLES``, and every tile that then enters its row
takes part in the cycle-level exchange. ``sync 15`` is the host barrier (input, then output).

Cycles: 1 per supervisor instruction (modelled [I]), the registry's cycle model per kernel
call (modelled), ``SYNC_CYCLES`` per exchange sync (facts §10.2 [T]) and each row's executed
length (simulated from the rows). The package's stored horizons are not used. The manifest's
step list is used only to attribute cycles to steps (the profile) and to name the step a call
belongs to for lifetime checks (operand table word 0).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ipu_stack.errors import PackageError, SimulationError
from ipu_stack.gc_pause import collector_paused
from ipu_stack.low.costs import call_cycles
from ipu_stack.low.program import KernelCall
from ipu_stack.package.format import Package
from ipu_stack.package.validate_program import check_call
from ipu_stack.runtime.exchange_sim import Row, simulate
from ipu_stack.runtime.sim import MEMORY_BYTES, RunResult, SimDevice, StepObserver
from ipu_stack.runtime.tile_memory import heap_kept, small_pages, tile_memories
from ipu_stack.target import ipu21
from ipu_stack.tilecode.decode import Decoded, decode

BASE = ipu21.TILE_MEMORY_BASE
_EXECUTABLE_LIMIT = ipu21.EXECUTABLE_LIMIT
ROW_LIMIT_WORDS = MEMORY_BYTES // 4
#: a runaway program (a corrupted branch) faults instead of hanging: at most this many
#: instructions per code word of the package (loops run their bodies many times) ...
INSTRUCTIONS_PER_CODE_WORD = 200
INSTRUCTION_FLOOR = 1_000_000  # ... and at least this many
_ROW_MNEMONICS = frozenset({"delay", "delaypic", "delayxpic", "send", "sendoff", "sendpic"})
RUN, SYNC, ROW, DONE = "run", "sync", "row", "done"
#: the register fields each interpreted instruction reads
_READS = {"ld32": ("base", "delta"), "st32": ("base", "src", "delta"), "add": ("src",),
          "br": ("reg",), "brz": ("reg",)}  # fmt: skip


def _sequence(steps: list[dict[str, Any]]) -> list[int]:
    """Step indices in execution order (loop bodies repeated)."""
    out: list[int] = []
    index = 0
    while index < len(steps):
        step = steps[index]
        if step["kind"] == "repeat":
            body = list(range(index + 1, index + 1 + int(step["length"])))
            out += body * int(step["count"])
            index += 1 + int(step["length"])
            continue
        out.append(index)
        index += 1
    return out


#: registers that hold a value at reset: only ``$m15`` (reads as zero, isa_table) ...
_DEFINED_AT_RESET = 1 << 15
#: ... and those a kernel call leaves undefined (assumed caller-saved: the registry ABI passes
#: operands in ``$m2``..``$m9`` and the kernel may use them and ``$m0``/``$m1`` as scratch;
#: ``emit_tile_code`` reloads every register it needs after a call). Reading an undefined
#: register is a fault: code relying on a stale operand is wrong on hardware.
_CLOBBERED_BY_KERNEL = sum(1 << r for r in range(10))


class _Tile:
    __slots__ = ("defined", "logical", "ordinal", "pc", "physical", "regs", "state", "walk",
                 "zone")  # fmt: skip

    def __init__(self, logical: int, physical: int, entry: int) -> None:
        self.logical, self.physical, self.pc = logical, physical, entry
        self.regs = [0] * 16
        self.defined = _DEFINED_AT_RESET
        self.state, self.zone, self.walk, self.ordinal = RUN, -1, 0, 0


@small_pages()
@heap_kept()
@collector_paused()  # the package's millions of objects: no collections walking them
def run_images(
    device: SimDevice, package: Package, executable: Any, feeds: Mapping[str, np.ndarray],
    resolver: Any, make_call: Any, observer: StepObserver | None = None,
) -> RunResult:  # fmt: skip
    """Execute ``package`` from its tile images (see module docstring).

    ``observer`` is told about every executed step occurrence after the run, in program
    order, with every tile's clock before and after it (profiles, progress).

    Raises:
        SimulationError: a fault, naming tile, cycle or step and instruction address.
    """
    start_time = time.perf_counter()
    program, placement = executable.program, executable.placement
    tiles = package.tiles
    count = len(tiles)
    mem = tile_memories(count, MEMORY_BYTES)
    _load_segments(package, mem)
    device.write_bindings(mem, program, placement, feeds)
    words32 = mem.view(np.uint32)
    logical_of = np.full(ipu21.TILES, -1, np.int64)
    logical_of[np.asarray(tiles, np.int64)] = np.arange(count)
    code = package.manifest["tile_code"]
    entries = {int(a): (str(sym), int(n), tmpl) for a, sym, n, tmpl in code["kernel_entries"]}
    steps_json = package.manifest["program"]["steps"]
    seq = _sequence(steps_json)
    exchange_occ = [i for i, s in enumerate(seq) if steps_json[s]["kind"] == "exchange"]
    end_occ = np.zeros((len(seq) + 1, count), np.int64)
    clock = np.zeros(count, np.int64)
    state = [_Tile(i, int(p), int(code["entry"])) for i, p in enumerate(tiles)]
    cache: dict[int, Decoded] = {}
    pending: list[tuple[int, int, int, KernelCall]] = []
    code_words = sum(
        size // 4
        for _, _, size, flags, offset in package.table("segments").tolist()
        if offset >= 0 and flags & 4
    )
    limit = max(INSTRUCTION_FLOOR, INSTRUCTIONS_PER_CODE_WORD * code_words)
    budget = [limit]
    barriers = 0
    host_syncs = 0

    def fetch(t: _Tile) -> Decoded:
        pc = t.pc
        if pc % 4 or not BASE <= pc < ipu21.EXECUTABLE_LIMIT:
            raise SimulationError(
                f"tile {t.physical} cycle {clock[t.logical]}: instruction fetch at {pc:#x} "
                f"(fetch needs a 4-byte aligned address in [{BASE:#x}, "
                f"{ipu21.EXECUTABLE_LIMIT:#x}))"
            )
        word = int(words32[t.logical, (pc - BASE) >> 2])
        found = cache.get(word)
        if found is None:
            found = cache[word] = decode(word)
        return found

    def mem_word(t: _Tile, address: int, what: str, pc: int) -> int:
        if address % 4 or not BASE <= address < ipu21.TILE_MEMORY_END:
            raise SimulationError(
                f"tile {t.physical} cycle {clock[t.logical]}: {what} at {pc:#x} accesses "
                f"{address:#x} (not a 4-byte aligned tile-memory address)"
            )
        return (address - BASE) >> 2

    def undefined(t: _Tile, reg: int, what: str, pc: int) -> SimulationError:
        return SimulationError(
            f"tile {t.physical} cycle {clock[t.logical]}: {what} at {pc:#x} reads $m{reg}, "
            "which holds no value (never written, or clobbered by the last kernel call)"
        )

    prepared: dict[int, tuple[int, Any]] = {}  # entry -> (registers needed, call builder)

    def kernel_call(t: _Tile, target: int, pc: int) -> None:
        symbol, nregs, template = entries[target]
        if target not in prepared:
            needed = sum(1 << r for r in range(2, 2 + nregs)) | 2  # $m1: the operand table
            if "$s" in str(template):
                needed |= 1 << 9  # the spilled operands' pointer
            prepared[target] = (needed, _builder(template))
        needed, build = prepared[target]
        if needed & ~t.defined:
            reg = (needed & ~t.defined).bit_length() - 1
            raise undefined(t, reg, f"call to {symbol}", pc)
        values = t.regs[2 : 2 + nregs]
        step_index = int(words32[t.logical, mem_word(t, t.regs[1], "operand table", pc)])

        def spilled(k: int) -> int:
            return int(words32[t.logical, mem_word(t, t.regs[9] + 4 * k, "spilled operand", pc)])

        try:
            call = build(values, spilled)
            call[1] = t.physical
        except (IndexError, TypeError, ValueError) as err:  # a malformed call template
            raise SimulationError(
                f"tile {t.physical} cycle {clock[t.logical]}: call at {pc:#x} to {symbol}: its "
                f"call template {str(template)[:80]} does not fit its registers ({err})"
            ) from None
        walk = t.walk
        while walk < len(seq) and seq[walk] != step_index:
            walk += 1
        if walk == len(seq):
            raise SimulationError(
                f"tile {t.physical} cycle {clock[t.logical]}: call at {pc:#x} to {symbol} names "
                f"step {step_index}, which does not follow in program order"
            )
        if walk != t.walk:
            t.walk, t.ordinal = walk, 0
        try:
            check_call(call, f"call at {pc:#x}")
            kc = make_call(call, resolver, step_index)
        except (PackageError, IndexError, KeyError, TypeError, ValueError) as err:
            raise SimulationError(
                f"tile {t.physical} cycle {clock[t.logical]}: call at {pc:#x} to {symbol}: {err}"
            ) from None
        clock[t.logical] += call_cycles(kc)
        end_occ[walk, t.logical] = clock[t.logical]
        pending.append((walk, t.ordinal, t.logical, kc))
        t.ordinal += 1

    def run_tile(t: _Tile) -> None:
        regs, logical = t.regs, t.logical
        code = words32[logical]
        while True:
            budget[0] -= 1
            if budget[0] < 0:
                raise SimulationError(
                    f"tile {t.physical}: more than {limit} instructions executed "
                    f"(pc {t.pc:#x}): the program does not terminate"
                )
            pc = t.pc
            if pc & 3 or not BASE <= pc < _EXECUTABLE_LIMIT:
                fetch(t)  # raises: misaligned or outside executable memory
            word = int(code[(pc - BASE) >> 2])
            ins = cache.get(word)
            if ins is None:
                ins = cache[word] = decode(word)
            m, f = ins.mnemonic, ins.fields
            regs[15] = 0
            clock[logical] += 1
            reads = _READS.get(m)
            if reads is not None:
                for name in reads:
                    if not t.defined >> f[name] & 1:
                        raise undefined(t, f[name], m, pc)
            if m == "setzi":
                regs[f["reg"]] = f["imm"]
                t.defined |= 1 << f["reg"]
            elif m == "ld32":
                a = regs[f["base"]] + regs[f["delta"]] + 4 * f["off"]
                regs[f["dst"]] = int(words32[t.logical, mem_word(t, a, "ld32", pc)])
                t.defined |= 1 << f["dst"]
            elif m == "st32":
                a = regs[f["base"]] + regs[f["delta"]] + 4 * f["off"]
                words32[t.logical, mem_word(t, a, "st32", pc)] = regs[f["src"]] & 0xFFFFFFFF
            elif m == "add":
                regs[f["dst"]] = (regs[f["src"]] + f["simm"]) & 0xFFFFFFFF
                t.defined |= 1 << f["dst"]
            elif m == "call":
                target = f["target_words"] << 2
                regs[f["reg"]] = pc + 4
                t.defined |= 1 << f["reg"]
                if target in entries:
                    kernel_call(t, target, pc)
                    t.defined &= ~_CLOBBERED_BY_KERNEL
                    if not t.defined >> 10 & 1:
                        raise undefined(t, 10, "the return of a kernel call", pc)
                    t.pc = regs[10]  # the kernel returns with br $m10 (registry ABI)
                    continue
                t.pc = target
                continue
            elif m == "br":
                t.pc = regs[f["reg"]]
                continue
            elif m == "brz":
                if regs[f["reg"]] == 0:
                    t.pc = f["target_words"] << 2
                    continue
            elif m == "sync":
                t.state, t.zone, t.pc = SYNC, f["zone"], pc + 4
                return
            elif m in _ROW_MNEMONICS:
                clock[t.logical] -= 1
                t.state = ROW
                return
            else:
                raise SimulationError(
                    f"tile {t.physical} cycle {clock[t.logical]}: instruction {ins.text()} at "
                    f"{pc:#x} is outside the supervisor subset the simulator executes"
                )
            t.pc = pc + 4

    def flush() -> None:
        # calls in program order per tile; across tiles by position so GEMMs batch
        pending.sort(key=lambda p: (p[0], p[1], p[2]))
        scratch = np.zeros(count, np.int64)
        i = 0
        while i < len(pending):
            j = i
            while j < len(pending) and pending[j][0] == pending[i][0]:
                j += 1
            device._compute(mem, placement, [p[3] for p in pending[i:j]], seq[pending[i][0]],
                            scratch)  # fmt: skip
            i = j
        pending.clear()

    while True:
        for t in state:
            if t.state == RUN:
                run_tile(t)
        zones = {t.zone for t in state}
        if len(zones) != 1:
            a = next(t for t in state if t.zone == min(zones))
            b = next(t for t in state if t.zone == max(zones))
            raise SimulationError(
                f"tiles disagree at a sync: tile {a.physical} waits at sync {a.zone} "
                f"({a.pc - 4:#x}), tile {b.physical} at sync {b.zone} ({b.pc - 4:#x})"
            )
        zone = zones.pop()
        if zone == 15:
            host_syncs += 1
            if host_syncs == 2:
                break
            for t in state:
                t.state, t.zone = RUN, -1
            continue
        if zone != 3:
            raise SimulationError(f"sync {zone} is not a zone this program uses (3 and 15)")
        flush()
        if barriers >= len(exchange_occ):
            raise SimulationError(
                f"exchange sync {barriers + 1}: the program has only {len(exchange_occ)} "
                "exchange steps"
            )
        occ = exchange_occ[barriers]
        barriers += 1
        step_index = seq[occ]
        release = int(clock.max()) + ipu21.SYNC_CYCLES
        clock[:] = release
        rows = []
        for t in state:
            t.state, t.zone, t.walk, t.ordinal = RUN, -1, occ, 0
            run_tile(t)
            if t.state == ROW:
                rows.append(_row(t, words32))
        ends = simulate(rows, words32, logical_of, f"step {step_index}")
        for r, end in zip(rows, ends.tolist(), strict=True):
            t = state[r.logical]
            clock[t.logical] = release + end
            reg = int(r.words[-1] >> 20) & 0xF
            if not t.defined >> reg & 1:
                raise undefined(t, reg, "the br closing the exchange row", r.address)
            t.pc = t.regs[reg]
            t.state = RUN
        end_occ[occ] = clock
        # tiles without a row went straight on to their next sync: already blocked there
    flush()
    for t in state:
        done = int(words32[t.logical, (ipu21.COMPLETION_WORD - BASE) >> 2])
        if done != 1:
            raise SimulationError(
                f"tile {t.physical}: completion word at {ipu21.COMPLETION_WORD:#x} is {done}, "
                "not 1: the program did not finish"
            )
    outputs = device.read_outputs(mem, program, placement)
    if seq:  # the completion code counts into the last step
        end_occ[len(seq) - 1] = np.maximum(end_occ[len(seq) - 1], clock)
    filled = np.maximum.accumulate(end_occ[: len(seq)], axis=0)
    step_cycles = [0] * len(steps_json)
    step_end = np.zeros((len(steps_json), count), np.int64)
    previous = 0
    for o, s in enumerate(seq):
        top = int(filled[o].max()) if count else 0
        step_cycles[s] += top - previous
        previous = top
        step_end[s] = filled[o]
        if observer is not None:
            before = filled[o - 1] if o else np.zeros(count, np.int64)
            observer.step(s, program.steps[s], before.copy(), filled[o].copy())
    seconds = time.perf_counter() - start_time
    return RunResult(outputs, int(clock.max()), clock.copy(), step_cycles, seconds, step_end)


def _row(t: _Tile, words32: np.ndarray) -> Row:
    start = (t.pc - BASE) >> 2
    limit = min(start + ROW_LIMIT_WORDS, words32.shape[1])
    chunk = 256
    at = start
    while at < limit:
        part = words32[t.logical, at : min(at + chunk, limit)]
        ends = np.flatnonzero((part & np.uint32(0xFF0FFFFF)) == np.uint32(0x43000000))
        if len(ends):
            stop = at + int(ends[0]) + 1
            return Row(t.logical, t.physical, t.pc, words32[t.logical, start:stop].copy())
        at += len(part)
        chunk *= 2
    raise SimulationError(f"tile {t.physical}: the exchange row at {t.pc:#x} never returns")


def _builder(template: Any) -> Callable[[list[int], Any], Any]:
    """A function of (register values, spilled-operand reader) giving the package call list
    of a kernel entry: ``$mN`` is register N's value, ``$sK`` the K-th spilled operand, lists
    are rebuilt and anything else is kept (the template is walked once per entry, not once
    per call; a malformed item raises when the call is made, as before)."""
    if isinstance(template, str) and template.startswith("$m"):
        try:
            index = int(template[2:]) - 2
        except ValueError:
            return lambda values, spilled: int(template[2:])  # raises the ValueError
        return lambda values, spilled: int(values[index])
    if isinstance(template, str) and template.startswith("$s"):
        return lambda values, spilled: spilled(int(template[2:]))
    if isinstance(template, list):
        parts = [_builder(x) for x in template]
        return lambda values, spilled: [part(values, spilled) for part in parts]
    return lambda values, spilled: template


def _load_segments(package: Package, mem: np.ndarray) -> None:
    logical = {p: i for i, p in enumerate(package.tiles)}
    blob = package.blob("images")
    for tile, address, size, _flags, offset in package.table("segments").tolist():
        if offset < 0:
            continue
        lo = address - BASE
        mem[logical[tile], lo : lo + size] = np.frombuffer(blob[offset : offset + size], np.uint8)

"""``link_runtime`` and ``emit_tile_code``: kernel entries and per-tile supervisor programs.

``link_runtime`` gives every distinct kernel specialisation (the call with its operand
addresses left out) one entry address in link region 1 (facts §4.5, from 0x4c018). Without
an SDK there is no kernel object: the entry holds a placeholder (``br $m10; trap 0``) and the
package records the absence; the simulator runs the registry's reference semantics for a
``call`` to that address.

``emit_tile_code`` writes each tile's supervisor program (a list of ops assembled by
:mod:`ipu_stack.tilecode.images` once addresses are known):

- ``sync 15`` (host input phase), then the program's steps in order;
- a kernel call: ``setzi $m1, table`` (in a loop: the iteration's table base from the loop
  state plus an ``add``), ``ld32`` of every operand register from the call's operand table
  (word 0: the step index, debug metadata), ``call $m10, entry``; registers per the registry
  ABI: ``$m2`` output, ``$m3``.. inputs, scalars after;
- an exchange: ``sync 3``, then the tile's row (``call $m10, row``; in a loop the row's
  address comes from the loop state and the return address is set with ``setzi $m10``);
- a repeat loop: counter, table base and row base kept in the runtime state words
  (``LOOP_STATE``), decremented / advanced by the body's strides each iteration, ``brz``
  out, ``br`` back;
- the completion word (1 at ``COMPLETION_WORD``), then ``sync 15`` (host output phase).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any

import numpy as np

from ipu_stack.errors import PlanError
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
    View,
)
from ipu_stack.package.format import canonical_json
from ipu_stack.target import ipu21
from ipu_stack.tilecode.encode import encode
from ipu_stack.tilecode.isa_table import LINK_REGISTER, SYNC_HOST, SYNC_SUPERVISOR, ZERO_REGISTER

KERNEL_ENTRY_BYTES = 8
FIRST_OPERAND_REGISTER = 2  # $m2 (registry ABI)
LAST_OPERAND_REGISTER = 9  # $m10 is the return address, $m11 the stack
TABLE_REGISTER = 1
ADD_MAX = (1 << 15) - 1
ROW_STRIDE_ADDS = 4  # a loop's row stride is added in this many fixed ``add``s (< 128 KiB)


@dataclass(frozen=True, slots=True)
class KernelEntry:
    """One linked kernel specialisation: its entry address, symbol and call template."""

    address: int
    symbol: str
    template: list[Any]  # a package call list; "$mN" strings stand for operand registers
    registers: int


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


SPILL = "spill"  # the operand word holding the address of the spilled operands


def call_operands(call: KernelCall) -> tuple[list[Any], list[Any]]:
    """A call's template (package call list, registers as ``"$mN"``) and its operand words
    in register order (buffer references, or plain scalars).

    Operands beyond the ABI's registers are spilled: ``$m9`` then holds the address of the
    rest, which follow in the operand table (template ``"$sK"``: spilled word K).
    """
    count = _operand_count(call)
    registers = LAST_OPERAND_REGISTER - FIRST_OPERAND_REGISTER + 1
    direct = count if count <= registers else registers - 1
    names = _register_names(count, direct)
    refs: list[Any] = []

    def reg(value: Ref | int) -> str:
        refs.append(value)
        return names[len(refs) - 1]

    def ref(r: Any) -> Ref:
        return r.ref if isinstance(r, View) else r

    if isinstance(call, GemmCall):
        out, left, right = reg(call.out), reg(call.left), reg(call.right)
        template: list[Any] = [
            "gemm", 0, out, left, right, call.rows, call.k, call.c, call.precision.name,
            int(call.accumulate), call.weights, call.scale_exponent,
        ]  # fmt: skip
    elif isinstance(call, AddCall):
        out = reg(call.out)
        template = [
            "add",
            0,
            out,
            [reg(r) for r in call.inputs],
            call.elements,
            call.precision.name,
        ]
    elif isinstance(call, CopyCall) and call.rows > 1:
        template = ["copy2d", 0, reg(call.dst), reg(call.src), reg(call.size), reg(call.rows),
                    reg(call.dst_stride), reg(call.src_stride)]  # fmt: skip
    elif isinstance(call, CopyCall):
        template = ["copy", 0, reg(call.dst), reg(call.src), reg(call.size)]
    elif isinstance(call, FillCall):
        template = ["fill", 0, reg(call.dst), reg(call.size)]
    else:
        assert isinstance(call, MapCall)

        def view(v: View) -> list[Any]:
            return [reg(ref(v)), v.rows, v.cols, v.stride, v.dtype]

        out_view = view(call.out)
        template = [
            "map", 0, call.kind, out_view, [view(v) for v in call.inputs],
            [[k, _scalar(v)] for k, v in call.attrs],
        ]  # fmt: skip
    words = refs[:direct] + ([SPILL, *refs[direct:]] if count > direct else [])
    return template, words


def _operand_count(call: KernelCall) -> int:
    """Operands a call passes in registers or spilled (what ``call_operands`` names)."""
    if isinstance(call, CopyCall):
        return 6 if call.rows > 1 else 3
    if isinstance(call, GemmCall):
        return 3
    if isinstance(call, FillCall):
        return 2
    if isinstance(call, AddCall | MapCall):
        return 1 + len(call.inputs)
    raise TypeError(f"cannot emit kernel call {call!r}")


@cache
def _register_names(count: int, direct: int) -> tuple[str, ...]:
    """``$m2``.. for the direct operands, ``$s0``.. for the spilled ones."""
    names = [f"$m{FIRST_OPERAND_REGISTER + i}" for i in range(direct)]
    return (*names, *(f"$s{i}" for i in range(count - direct)))


def _symbol(call: KernelCall, gemm_symbols: dict[tuple[str, str, int, int, int], str]) -> str:
    if isinstance(call, GemmCall):
        key = (call.precision.name, call.weights, call.k, call.c, call.rows)
        symbol = gemm_symbols.get(key) or f"ipu_stack_gemm_{call.precision.name}"
        return symbol.replace("_init_", "_accumulate_") if call.accumulate else symbol
    if isinstance(call, AddCall):
        return f"ipu_stack_reduce_add_{call.precision.name}"
    if isinstance(call, CopyCall):
        return "ipu_stack_copy2d" if call.rows > 1 else "ipu_stack_copy"
    if isinstance(call, FillCall):
        return "ipu_stack_fill_zero"
    assert isinstance(call, MapCall)
    return f"ipu_stack_{call.kind}_{call.out.dtype}"


@dataclass(slots=True)
class Linked:
    """The linked runtime: kernel entries by template key."""

    entries: dict[bytes, KernelEntry] = field(default_factory=dict)
    # per call object (by id, the call kept alive): its entry and operand words
    _calls: dict[int, tuple[KernelCall, dict, KernelEntry, list[Any]]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def entry(self, call: KernelCall, gemm_symbols: dict) -> KernelEntry:
        """The entry of ``call``'s specialisation (linked on first sight)."""
        return self.resolve(call, gemm_symbols)[0]

    def resolve(self, call: KernelCall, gemm_symbols: dict) -> tuple[KernelEntry, list[Any]]:
        """The entry of ``call`` and its operand words (:func:`call_operands`), remembered
        per call so each call's template is built and keyed once."""
        known = self._calls.get(id(call))
        if known is not None and known[0] is call and known[1] is gemm_symbols:
            return known[2], known[3]
        found, operands = self._link(call, gemm_symbols)
        self._calls[id(call)] = (call, gemm_symbols, found, operands)
        return found, operands

    def _link(self, call: KernelCall, gemm_symbols: dict) -> tuple[KernelEntry, list[Any]]:
        template, ops = call_operands(call)
        symbol = _symbol(call, gemm_symbols)
        key = canonical_json([symbol, template])
        found = self.entries.get(key)
        if found is None:
            address = ipu21.KERNEL_ENTRY_BASE + KERNEL_ENTRY_BYTES * len(self.entries)
            if address + KERNEL_ENTRY_BYTES > ipu21.KERNEL_ENTRY_END:
                raise PlanError(
                    f"link_runtime: {len(self.entries) + 1} kernel specialisations do not fit "
                    f"the link region [{ipu21.KERNEL_ENTRY_BASE:#x}, "
                    f"{ipu21.KERNEL_ENTRY_END:#x}) at {KERNEL_ENTRY_BYTES} bytes each"
                )
            found = KernelEntry(
                address,
                symbol,
                template,
                min(len(ops), LAST_OPERAND_REGISTER - FIRST_OPERAND_REGISTER + 1),
            )
            self.entries[key] = found
        return found, ops

    def image(self) -> bytes:
        """The entry placeholders (no kernel objects: ``br $m10; trap 0`` each)."""
        words = [encode("br", reg=LINK_REGISTER), encode("trap", code=0)] * len(self.entries)
        return np.asarray(words, dtype="<u4").tobytes()

    def records(self) -> list[list[Any]]:
        """``[address, symbol, registers, template]`` per entry, by address."""
        items = sorted(self.entries.values(), key=lambda e: e.address)
        return [[e.address, e.symbol, e.registers, e.template] for e in items]


def calls_by_tile(program: LowProgram) -> dict[int, dict[int, list[KernelCall]]]:
    """Each logical tile's calls by compute step index, in program order."""
    out: dict[int, dict[int, list[KernelCall]]] = {}
    for index, step in enumerate(program.steps):
        if isinstance(step, ComputeStep):
            for call in step.calls:
                out.setdefault(call.tile, {}).setdefault(index, []).append(call)
    return out


def link_runtime(program: LowProgram, gemm_symbols: dict) -> Linked:
    """Every kernel specialisation the program calls, at its entry address."""
    linked = Linked()
    for step in program.steps:
        if isinstance(step, ComputeStep):
            for call in step.calls:
                linked.entry(call, gemm_symbols)
    return linked


# -- supervisor programs as ops --------------------------------------------------------------
# An op is ("w", word) | ("setzi", reg, label) | ("call", reg, label) | ("brz", reg, label)
# | ("label", name) | ("tableoffset", table) | ("rowoffset", step, row) (one ``add`` each)
# | ("rowstride", repeat step) (ROW_STRIDE_ADDS ``add``s).
# Labels: ("table", n) operand table n of the tile, ("row", n) row n, ("rowbase", repeat step)
# ("loop", n) / ("exit", n) loop top and exit, ("ret", n) a return point.
Op = tuple[Any, ...]


def _w(mnemonic: str, **fields: int) -> Op:
    return _word(mnemonic, tuple(fields.items()))


@lru_cache(maxsize=4096)
def _word(mnemonic: str, fields: tuple[tuple[str, int], ...]) -> Op:
    """The op of one encoded word (few distinct ones: encoded once each)."""
    return ("w", encode(mnemonic, **dict(fields)))


def _adds(reg: int, amount: int) -> list[Op]:
    out = []
    while amount:
        step = max(-ADD_MAX - 1, min(ADD_MAX, amount))
        out.append(_w("add", src=reg, dst=reg, simm=step))
        amount -= step
    return out


def _loop_state(slot: int) -> int:
    return ipu21.LOOP_STATE // 4 + slot


def emit_program(
    tile: int,
    program: LowProgram,
    linked: Linked,
    gemm_symbols: dict,
    rows: dict[tuple[int, int], int],
    calls: dict[int, list[KernelCall]] | None = None,
    fixed: AbstractSet[int] = frozenset(),
) -> tuple[list[Op], list[list[int]], dict[int, tuple[int, int]]]:
    """Ops, operand tables and per-repeat strides of one (logical) tile's supervisor program.

    Args:
        rows: ``(step, iteration) -> row number`` for the exchange rows this tile has.
        calls: this tile's calls by compute step (default: taken from ``program``).
        fixed: loop steps whose rows are stored once and called at their own address (the
            same in every iteration) rather than from the loop's row base.

    Returns:
        ``(ops, tables, strides)``: tables in emission order (the loops' tables iteration by
        iteration); ``strides[repeat step] = (table bytes, row bytes)`` per iteration, filled
        in by :mod:`ipu_stack.tilecode.images` once row sizes are known (here: table bytes).
    """
    if calls is None:
        calls = calls_by_tile(program).get(tile, {})
    ops: list[Op] = [_w("sync", zone=SYNC_HOST)]
    tables: list[list[int]] = []
    strides: dict[int, tuple[int, int]] = {}
    steps = program.steps
    index = 0
    loops = 0
    while index < len(steps):
        step = steps[index]
        if isinstance(step, RepeatStep):
            body = range(index + 1, index + 1 + step.length)
            if any(isinstance(steps[j], RepeatStep) for j in body):
                raise PlanError(f"step {index}: nested repeat loops are not supported")
            n = loops
            loops += 1
            first_table = len(tables)
            body_ops: list[Op] = []
            static: list[list[int]] = []  # tables of calls that read no iterated buffer
            # calls whose tables differ per iteration, in table order (found in iteration 0)
            iterated: list[tuple[int, Any]] = []
            for j in body if step.count else ():
                body_ops += _step_ops(
                    tile, j, steps[j], 0, step, linked, gemm_symbols, rows, tables, calls,
                    static, iterated, fixed,
                )  # fmt: skip
            shifts = step.iterated
            for i in range(1, step.count):  # later iterations add only their own tables
                tables += [
                    _iterated_words(operands.operands, operands.positions, shifts, tile, i)
                    if isinstance(operands, _Split)
                    else _table_words(j, operands, shifts, tile, i)
                    for j, operands in iterated
                ]
            per_iteration = len(tables) - first_table
            # the static tables follow the iterated ones, once for all iterations
            body_ops = [
                ("setzi", op[1], ("table", len(tables) + op[2][1]))
                if op[0] == "setzi" and isinstance(op[2], tuple) and op[2][0] == "static"
                else op
                for op in body_ops
            ]
            tables += static
            table_bytes = 0
            if step.count:
                table_bytes = sum(
                    4 * len(t) for t in tables[first_table:][: per_iteration // step.count]
                )
            strides[index] = (table_bytes, 0)
            ops += [
                _w("setzi", reg=0, imm=step.count),
                _w("setzi", reg=TABLE_REGISTER, imm=ipu21.LOOP_STATE),
                _w("st32", base=TABLE_REGISTER, src=0, delta=ZERO_REGISTER, off=0),
                ("setzi", 0, ("table", first_table))
                if len(tables) > first_table
                else _w("setzi", reg=0, imm=0),
                _w("st32", base=TABLE_REGISTER, src=0, delta=ZERO_REGISTER, off=1),
                ("setzi", 0, ("rowbase", index)),
                _w("st32", base=TABLE_REGISTER, src=0, delta=ZERO_REGISTER, off=2),
                ("label", ("loop", n)),
                *body_ops,
                _w("setzi", reg=TABLE_REGISTER, imm=ipu21.LOOP_STATE),
                _w("ld32", base=TABLE_REGISTER, dst=0, delta=ZERO_REGISTER, off=0),
                *_adds(0, -1),
                _w("st32", base=TABLE_REGISTER, src=0, delta=ZERO_REGISTER, off=0),
                _w("ld32", base=TABLE_REGISTER, dst=0, delta=ZERO_REGISTER, off=1),
                *_adds(0, table_bytes),
                _w("st32", base=TABLE_REGISTER, src=0, delta=ZERO_REGISTER, off=1),
                _w("ld32", base=TABLE_REGISTER, dst=0, delta=ZERO_REGISTER, off=2),
                ("rowstride", index),
                _w("st32", base=TABLE_REGISTER, src=0, delta=ZERO_REGISTER, off=2),
                _w("ld32", base=TABLE_REGISTER, dst=0, delta=ZERO_REGISTER, off=0),
                ("brz", 0, ("exit", n)),
                ("setzi", 0, ("loop", n)),
                _w("br", reg=0),
                ("label", ("exit", n)),
            ]
            index = body.stop
            continue
        ops += _step_ops(tile, index, step, 0, None, linked, gemm_symbols, rows, tables, calls)
        index += 1
    ops += [
        _w("setzi", reg=0, imm=1),
        _w("setzi", reg=TABLE_REGISTER, imm=ipu21.COMPLETION_WORD),
        _w("st32", base=TABLE_REGISTER, src=0, delta=ZERO_REGISTER, off=0),
        _w("sync", zone=SYNC_HOST),
    ]
    return ops, tables, strides


def _step_ops(
    tile: int,
    index: int,
    step: Any,
    iteration: int,
    repeat: RepeatStep | None,
    linked: Linked,
    gemm_symbols: dict,
    rows: dict[tuple[int, int], int],
    tables: list[list[int]],
    calls: dict[int, list[KernelCall]],
    static: list[list[int]] | None = None,
    iterated: list[tuple[int, Any]] | None = None,
    fixed: AbstractSet[int] = frozenset(),
) -> list[Op]:
    """Ops of one step, its calls' operand tables appended to ``tables`` (in a loop:
    ``iteration``'s, except those of calls that read no iterated buffer: once, into
    ``static``, referenced as ``("static", n)`` until the loop places them). ``iterated``
    collects ``(step, operands)`` of every call with a per-iteration table, in table order:
    :func:`emit_program` makes the later iterations' tables from them."""
    if isinstance(step, ExchangeStep):
        ops: list[Op] = [_sync_supervisor()]
        row = rows.get((index, iteration)) if rows else None
        if row is None:
            return ops
        if repeat is None or index in fixed:
            ops.append(("call", LINK_REGISTER, ("row", row)))
        else:
            ops += [
                _w("setzi", reg=0, imm=ipu21.LOOP_STATE),
                _w("ld32", base=0, dst=0, delta=ZERO_REGISTER, off=2),
                ("rowoffset", index, row),
                ("setzi", LINK_REGISTER, ("ret", (index, row))),
                _w("br", reg=0),
                ("label", ("ret", (index, row))),
            ]
        return ops
    assert isinstance(step, ComputeStep)
    ops = []
    here = calls.get(index)
    if not here:
        return ops
    shifts = repeat.iterated if repeat else None
    for call in here:
        entry, operands = linked.resolve(call, gemm_symbols)
        if (
            shifts is not None
            and static is not None
            and not any(isinstance(v, Ref) and (tile, v.buffer) in shifts for v in operands)
        ):
            if iteration == 0:  # the same table in every iteration
                static.append(_table_words(index, operands, None, tile, 0))
                ops.append(("setzi", TABLE_REGISTER, ("static", len(static) - 1)))
                ops += _operand_loads(
                    min(len(operands), LAST_OPERAND_REGISTER - FIRST_OPERAND_REGISTER + 1)
                )
                ops.append(_call_op(entry.address))
            continue
        positions = _split_positions(operands, shifts, tile) if static is not None else None
        if positions is not None and repeat is not None and static is not None:
            # the iteration-independent words once (iteration 0's addresses), then a small
            # table per iteration with only the iterated register operands, loaded over them
            # ($m1 holds the whole table at the call: the image runner reads its step word)
            assert iteration == 0
            table = len(tables)
            tables.append(_iterated_words(operands, positions, shifts, tile, 0))
            if iterated is not None:
                iterated.append((index, _Split(operands, positions)))
            ops += _loop_table_base()
            ops.append(("tableoffset", table))
            ops += [
                _w("ld32", base=TABLE_REGISTER, dst=FIRST_OPERAND_REGISTER + j,
                   delta=ZERO_REGISTER, off=k)
                for k, j in enumerate(positions)
            ]  # fmt: skip
            static.append(_table_words(index, operands, None, tile, 0))
            ops.append(("setzi", TABLE_REGISTER, ("static", len(static) - 1)))
            count = min(len(operands), LAST_OPERAND_REGISTER - FIRST_OPERAND_REGISTER + 1)
            ops += [op for j, op in enumerate(_operand_loads(count)) if j not in positions]
            ops.append(_call_op(entry.address))
            continue
        words = _table_words(index, operands, shifts, tile, iteration)
        table = len(tables)
        tables.append(words)
        if iterated is not None:
            iterated.append((index, operands))
        if repeat is None:
            ops.append(("setzi", TABLE_REGISTER, ("table", table)))
        else:
            ops += _loop_table_base()
            ops.append(("tableoffset", table))
        ops += _operand_loads(
            min(len(operands), LAST_OPERAND_REGISTER - FIRST_OPERAND_REGISTER + 1)
        )
        ops.append(_call_op(entry.address))
    return ops


@dataclass(frozen=True, slots=True)
class _Split:
    """A loop call whose table is split: the full words once, ``positions`` per iteration."""

    operands: Any
    positions: list[int]


def _split_positions(
    operands: Any, shifts: dict[tuple[int, str], int] | None, tile: int
) -> list[int] | None:
    """The register positions of a call's iterated operands when all of them are passed in
    registers (none spilled), else None (the whole table is written per iteration)."""
    if not shifts:
        return None
    registers = LAST_OPERAND_REGISTER - FIRST_OPERAND_REGISTER + 1
    positions = [
        j for j, v in enumerate(operands) if isinstance(v, Ref) and (tile, v.buffer) in shifts
    ]
    if not positions:
        return None
    spilled = len(operands) > registers
    last_direct = registers - 1 if spilled else registers  # the last register: the spill word
    if any(j >= last_direct for j in positions):
        return None
    return positions


def _iterated_words(
    operands: Any,
    positions: list[int],
    shifts: dict[tuple[int, str], int] | None,
    tile: int,
    iteration: int,
) -> list[Any]:
    """The per-iteration table of a split call: its iterated operands, advanced."""
    assert shifts is not None
    return [
        ("ref", operands[j], shifts.get((tile, operands[j].buffer), 0) * iteration)
        for j in positions
    ]


def _table_words(
    index: int,
    operands: Any,
    shifts: dict[tuple[int, str], int] | None,
    tile: int,
    iteration: int,
) -> list[Any]:
    """A call's operand table: the step index, then each operand (a buffer reference advanced
    by ``iteration`` strides of its iterated buffer, a spill pointer, or a scalar)."""
    words: list[Any] = [index]
    for value in operands:
        if value is SPILL:
            words.append(("spill", 1 + LAST_OPERAND_REGISTER - FIRST_OPERAND_REGISTER + 1))
        elif isinstance(value, Ref):
            shift = shifts.get((tile, value.buffer), 0) * iteration if shifts else 0
            words.append(("ref", value, shift))
        else:
            words.append(int(value))
    return words


@cache
def _sync_supervisor() -> Op:
    return _w("sync", zone=SYNC_SUPERVISOR)


@cache
def _call_op(address: int) -> Op:
    """``call $m10, address`` (a kernel entry)."""
    return _w("call", reg=LINK_REGISTER, target_words=address >> 2)


@cache
def _loop_table_base() -> tuple[Op, ...]:
    """In a loop: ``$m1`` = the iteration's table base from the loop state."""
    return (
        _w("setzi", reg=TABLE_REGISTER, imm=ipu21.LOOP_STATE),
        _w("ld32", base=TABLE_REGISTER, dst=TABLE_REGISTER, delta=ZERO_REGISTER, off=1),
    )


@cache
def _operand_loads(count: int) -> tuple[Op, ...]:
    """``ld32`` of the first ``count`` operand registers from the call's operand table."""
    return tuple(
        _w("ld32", base=TABLE_REGISTER, dst=FIRST_OPERAND_REGISTER + j, delta=ZERO_REGISTER,
           off=1 + j)
        for j in range(count)
    )  # fmt: skip

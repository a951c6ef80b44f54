"""``lower_exchanges``, ``place_storage``, ``emit_tile_code`` and ``build_tile_images``.

Per tile, the support reservation at the top of the standard region (facts §4.4: 3 x 16 KiB
below 0x80000, 16 KiB aligned, executable) holds, in order: the tile's exchange rows (every
phase, loop bodies iteration by iteration), a 64-byte guard, the supervisor code, and the
operand tables. Tables that do not fit there go above every buffer of the tile's interleaved
region when they fit there (they are read, never executed; no data is ever there).
The entry stub (``setzi $m0, main; br $m0``) sits at 0x4c010 and the kernel
entries from 0x4c018 (:mod:`ipu_stack.tilecode.supervisor`). A tile whose support does not fit
fails the build with the tile and the bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ipu_stack.errors import PlanError
from ipu_stack.exchange.model import ExchangePhase, PhaseSchedule
from ipu_stack.low.program import ExchangeStep, LowProgram, Ref, RepeatStep
from ipu_stack.place.assign import Placement
from ipu_stack.target import ipu21
from ipu_stack.tilecode.encode import EncodeError, encode
from ipu_stack.tilecode.exchange_rows import PhaseTables, encode_rows, phase_tables
from ipu_stack.tilecode.supervisor import (
    ADD_MAX,
    ROW_STRIDE_ADDS,
    TABLE_REGISTER,
    Linked,
    Op,
    calls_by_tile,
    emit_program,
    link_runtime,
)

SEGMENT_READ, SEGMENT_WRITE, SEGMENT_EXEC = 1, 2, 4  # as the package format's flags


class SupportOverflow(PlanError):
    """Tiles whose rows, code and tables do not fit their support reservation: the first
    one's message, and the bytes each needs (by logical tile)."""

    def __init__(self, message: str, needed: dict[int, int]) -> None:
        super().__init__(message)
        self.needed = needed


SUPPORT_BASE = ipu21.EXECUTABLE_LIMIT - ipu21.DEFAULT_SUPPORT_RESERVATION_BYTES


@dataclass(slots=True)
class TileImage:
    """One tile's loadable image: segments ``(address, flags, bytes)`` and row records."""

    tile: int  # physical
    segments: list[tuple[int, int, bytes]] = field(default_factory=list)
    rows: list[tuple[int, int, int, int]] = field(default_factory=list)  # step, iter, addr, words
    row_bytes: int = 0
    code_bytes: int = 0
    table_bytes: int = 0


@dataclass(slots=True)
class TileImages:
    """The images of every tile and the linked kernel entries."""

    tiles: list[TileImage]
    linked: Linked
    # exchange step -> (phase, schedule, their tables): reused while the build keeps them
    phases: dict[int, tuple[ExchangePhase, PhaseSchedule, PhaseTables]] = field(
        default_factory=dict
    )

    def phase_tables(
        self, index: int, phase: ExchangePhase, schedule: PhaseSchedule
    ) -> PhaseTables:
        """The tables of step ``index``'s ``phase`` and ``schedule`` (made again if either is
        not the one the rows were encoded from)."""
        known = self.phases.get(index)
        if known is not None and known[0] is phase and known[1] is schedule:
            return known[2]
        return phase_tables(phase, schedule)

    def largest_rows(self) -> TileImage:
        """The tile with the most encoded row bytes."""
        return max(self.tiles, key=lambda t: t.row_bytes)

    def describe(self) -> dict[str, int]:
        """Summary figures for the trace and the manifest."""
        big = self.largest_rows()
        support = max((t.row_bytes + t.code_bytes + t.table_bytes for t in self.tiles), default=0)
        return {
            "tiles": len(self.tiles),
            "kernel_entries": len(self.linked.entries),
            "maximum_row_bytes": big.row_bytes,
            "maximum_row_bytes_tile": big.tile,
            "maximum_code_bytes": max((t.code_bytes for t in self.tiles), default=0),
            "maximum_table_bytes": max((t.table_bytes for t in self.tiles), default=0),
            "maximum_support_bytes": support + ipu21.ROW_GUARD_BYTES,
            "row_words": sum(t.row_bytes for t in self.tiles) // 4,
        }


def _shifts(
    tables: PhaseTables, step: ExchangeStep, repeat: RepeatStep
) -> tuple[np.ndarray, np.ndarray]:
    """Per transfer and per destination: the bytes an iteration advances its address by
    (the stride of the iterated buffer it reads or writes, 0 for the others)."""
    # the physical phase is the step's transfers with tiles renumbered (place/assign.py
    # physical_phase): its destinations are the step's, in order, at physical[tile]
    strides = repeat.iterated
    get = strides.get
    source = [get((lt.source_tile, lt.source.buffer), 0) for lt in step.transfers]
    names = {buffer for _, buffer in strides}
    dest = [
        get((tile, ref.buffer), 0) if ref.buffer in names else 0
        for lt in step.transfers
        for tile, ref in lt.destinations
    ]
    if len(dest) != len(tables.dest_tiles):  # pragma: no cover
        raise AssertionError("physical phase and program disagree")
    return np.asarray(source, np.int64), np.asarray(dest, np.int64)


class ExchangeRows(dict[tuple[int, int], dict[int, np.ndarray]]):
    """Rows by ``(step, iteration)``; ``tables`` keeps each step's :class:`PhaseTables` (the
    package's exchange tables are written from them)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[int, tuple[ExchangePhase, PhaseSchedule, PhaseTables]] = {}


def lower_exchanges(
    program: LowProgram,
    placement: Placement,
    schedules: dict[int, tuple[ExchangePhase, PhaseSchedule]],
) -> dict[tuple[int, int], dict[int, np.ndarray]]:
    """Rows of every exchange occurrence: ``(step, iteration) -> physical tile -> words``.

    Raises:
        PlanError: a phase cannot be encoded (the encoder's message, with the step).
    """
    out = ExchangeRows()
    repeat_of = _repeats(program)
    for index, step in enumerate(program.steps):
        if not isinstance(step, ExchangeStep):
            continue
        phase, schedule = schedules[index]
        repeat = repeat_of.get(index)
        tables = phase_tables(phase, schedule)
        out.tables[index] = (phase, schedule, tables)
        shifts = None
        if repeat is not None and repeat.iterated:
            shifts = _shifts(tables, step, repeat)
            if not (shifts[0].any() or shifts[1].any()):
                shifts = None  # no address moves: every iteration's rows are iteration 0's
        for i in range(repeat.count if repeat else 1):
            if shifts is None and i:
                out[(index, i)] = out[(index, 0)]
                continue
            # iteration i: iterated buffers advanced by i x stride
            shifted = tables
            if shifts is not None and i:
                shifted = tables.shifted(i * shifts[0], i * shifts[1])
            try:
                out[(index, i)] = encode_rows(shifted, merge_pointers=repeat is None)
            except EncodeError as err:
                raise PlanError(f"lower_exchanges: step {index} iteration {i}: {err}") from None
    return out


def _repeats(program: LowProgram) -> dict[int, RepeatStep]:
    out = {}
    for index, step in enumerate(program.steps):
        if isinstance(step, RepeatStep):
            for j in range(index + 1, index + 1 + step.length):
                out[j] = step
    return out


def _occurrences(program: LowProgram) -> list[tuple[int, int]]:
    """Exchange ``(step, iteration)`` in execution order."""
    out = []
    steps = program.steps
    index = 0
    while index < len(steps):
        step = steps[index]
        if isinstance(step, RepeatStep):
            body = range(index + 1, index + 1 + step.length)
            out += [(j, i) for i in range(step.count) for j in body
                    if isinstance(steps[j], ExchangeStep)]  # fmt: skip
            index = body.stop
            continue
        if isinstance(step, ExchangeStep):
            out.append((index, 0))
        index += 1
    return out


def _size(op: Op) -> int:
    kind = op[0]
    if kind == "label":
        return 0
    if kind == "rowstride":
        return ROW_STRIDE_ADDS
    return 1


def _add_word(reg: int, amount: int, what: str, tile: int) -> int:
    if not -ADD_MAX - 1 <= amount <= ADD_MAX:
        raise PlanError(f"tile {tile}: {what} of {amount} bytes does not fit one add (simm16)")
    return encode("add", src=reg, dst=reg, simm=amount)


def build_tile_images(
    program: LowProgram,
    placement: Placement,
    schedules: dict[int, tuple[ExchangePhase, PhaseSchedule]],
    gemm_symbols: dict,
    rows: dict[tuple[int, int], dict[int, np.ndarray]] | None = None,
    reservation: int = ipu21.DEFAULT_SUPPORT_RESERVATION_BYTES,
    linked: Linked | None = None,
    reservations: dict[int, int] | None = None,
) -> TileImages:
    """Link, place and emit every tile's image (see module docstring); ``reservations``:
    a larger support reservation for some logical tiles (the placement must leave it free).

    Raises:
        SupportOverflow: a tile's support does not fit (names the tile and the bytes).
        PlanError: the program cannot be encoded.
    """
    rows = rows if rows is not None else lower_exchanges(program, placement, schedules)
    linked = linked if linked is not None else link_runtime(program, gemm_symbols)
    rows_of = _rows_by_tile(program, rows)
    by_tile = calls_by_tile(program)
    loops = _loop_lookups(program)
    images = []
    overflows: dict[int, int] = {}  # logical tile -> support bytes it needs
    first_message = ""
    for logical in range(program.tile_count):
        physical = int(placement.physical[logical])
        tile_reservation = (reservations or {}).get(logical, reservation)
        support_base = ipu21.EXECUTABLE_LIMIT - tile_reservation
        numbered: dict[tuple[int, int], int] = {}
        row_words: list[np.ndarray] = []
        occurrences = rows_of.get(physical, ())
        # loop steps whose rows are the same in every iteration are stored once, after
        # everything else, and called at their own address; the others are laid out
        # iteration by iteration and called from the loop's row base
        fixed = _invariant_steps(occurrences, loops)
        deferred: list[tuple[tuple[int, int], np.ndarray]] = []
        for occurrence, words in occurrences:
            step, i = occurrence
            if step in fixed:
                if i == 0:
                    deferred.append((occurrence, words))
                continue
            numbered[occurrence] = len(row_words)
            row_words.append(words)
        for occurrence, words in deferred:
            numbered[occurrence] = len(row_words)
            row_words.append(words)
        for occurrence, _ in occurrences:
            if occurrence[0] in fixed and occurrence[1]:
                numbered[occurrence] = numbered[(occurrence[0], 0)]
        ops, tables, strides = emit_program(
            logical, program, linked, gemm_symbols, numbered, by_tile.get(logical, {}), fixed
        )
        # place_storage: rows from the 16 KiB-aligned support base, guard, code, tables.
        row_address = []
        cursor = support_base
        for words in row_words:
            row_address.append(cursor)
            cursor += 4 * len(words)
        row_bytes = cursor - support_base
        code_base = cursor + ipu21.ROW_GUARD_BYTES
        labels, code_words = _labels(ops, code_base)
        table_base = code_base + 4 * code_words
        table_address = []
        cursor = table_base
        for t in tables:
            table_address.append(cursor)
            cursor += 4 * len(t)
        end = cursor
        code_end = table_base  # rows, guard and code must lie below the executable limit
        relocated = False
        if end > ipu21.EXECUTABLE_LIMIT >= code_end:
            spare = _spare_top(placement.allocations[logical])
            relocated = spare[1] - spare[0] >= end - table_base
        if relocated:
            # the tables go where no data ever is
            table_base = spare[0]
            offsets = np.cumsum([0] + [4 * len(t) for t in tables]).tolist()
            table_address = [table_base + o for o in offsets[:-1]]
            end = table_base + offsets[-1]
        if code_end > ipu21.EXECUTABLE_LIMIT or (not relocated and end > ipu21.EXECUTABLE_LIMIT):
            if not overflows:  # the first tile's message; every such tile's bytes
                first_message = (
                    f"place_storage: tile {physical} needs {end - support_base} bytes of "
                    f"support ({row_bytes} exchange rows + {ipu21.ROW_GUARD_BYTES} guard + "
                    f"{4 * code_words} code + {end - table_base} operand tables) but the "
                    f"reservation holds {tile_reservation} bytes [{support_base:#x}, "
                    f"{ipu21.EXECUTABLE_LIMIT:#x}); most rows: "
                    f"{_largest_rows(program, numbered, row_words)}"
                )
            overflows[logical] = end - support_base
            continue
        for n, address in enumerate(row_address):
            labels[("row", n)] = address
        for n, address in enumerate(table_address):
            labels[("table", n)] = address
        for index, (table_stride, _) in strides.items():
            first = [
                n
                for (s, i), n in numbered.items()
                if i == 0 and loops.body.get(s) == index and s not in fixed
            ]
            labels[("rowbase", index)] = row_address[min(first)] if first else 0
            stride = sum(4 * len(row_words[n]) for n in first)
            strides[index] = (table_stride, stride)
        code = _assemble(ops, labels, strides, physical, loops, row_address)
        table_data = _table_words(tables, table_address, placement.allocations[logical])
        stub = [
            encode("setzi", reg=0, imm=code_base),
            encode("br", reg=0),
        ]
        image = TileImage(physical, row_bytes=row_bytes, code_bytes=4 * code_words,
                          table_bytes=end - table_base)  # fmt: skip
        image.segments.append(
            (ipu21.APPLICATION_LOAD_BASE, SEGMENT_READ | SEGMENT_EXEC, _bytes(stub))
        )
        guard = np.zeros(ipu21.ROW_GUARD_BYTES // 4, np.uint32)
        exec_words = np.concatenate([*row_words, guard, np.asarray(code, np.uint32)])
        image.segments.append(
            (support_base, SEGMENT_READ | SEGMENT_EXEC, exec_words.astype("<u4").tobytes())
        )
        if table_data:
            image.segments.append((table_base, SEGMENT_READ, _bytes(table_data)))
        image.rows = [
            (step, i, row_address[n], len(row_words[n])) for (step, i), n in numbered.items()
        ]
        images.append(image)
    if overflows:
        raise SupportOverflow(first_message, overflows)
    return TileImages(images, linked, dict(getattr(rows, "tables", {})))


def _spare_top(allocations: dict[str, Any]) -> tuple[int, int]:
    """The range above every buffer of a tile's interleaved region, up to the loader limit:
    no data is ever there, so operand tables (read, never executed) may be."""
    top = max(
        (a.address + a.size for a in allocations.values() if a.address >= ipu21.INTERLEAVED_BASE),
        default=ipu21.INTERLEAVED_BASE,
    )
    start = -(-top // 8) * 8
    return start, max(start, ipu21.LOADER_LIMIT)


def _largest_rows(
    program: LowProgram, numbered: dict[tuple[int, int], int], row_words: list[np.ndarray]
) -> str:
    """The three exchange steps whose stored rows take the most bytes on one tile (a row
    shared by several iterations counted once), for an error message."""
    per_step: dict[int, int] = {}
    seen: set[int] = set()
    for (step, _), n in numbered.items():
        if n not in seen:
            seen.add(n)
            per_step[step] = per_step.get(step, 0) + 4 * len(row_words[n])
    top = sorted(per_step.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    return ", ".join(
        f"{n} B in {getattr(program.steps[step], 'label', f'step {step}')!r}" for step, n in top
    )


def _table_words(tables: list[list[Any]], addresses: list[int], allocations: Any) -> list[int]:
    """The operand-table words of one tile: a buffer address (advanced for the loop
    iteration), the address of the table's spilled operands, or a scalar."""
    out = []
    for table, address in zip(tables, addresses, strict=True):
        for word in table:
            if type(word) is not tuple:
                out.append(int(word))
            elif word[0] == "ref":
                ref = word[1]
                out.append(allocations[ref.buffer].address + ref.offset + word[2])
            elif word[0] == "spill":
                out.append(address + 4 * word[1])
            else:  # pragma: no cover - emit_program makes only these words
                raise TypeError(f"not an operand-table word: {word!r}")
    return out


@dataclass(frozen=True, slots=True)
class _Loops:
    """Per program: the repeat step whose body holds each step (``body``)."""

    body: dict[int, int]


def _loop_lookups(program: LowProgram) -> _Loops:
    body = {}
    for index, step in enumerate(program.steps):
        if isinstance(step, RepeatStep):
            body.update(dict.fromkeys(range(index + 1, index + 1 + step.length), index))
    return _Loops(body)


def _invariant_steps(
    occurrences: Sequence[tuple[tuple[int, int], np.ndarray]], loops: _Loops
) -> set[int]:
    """The loop steps whose rows on this tile are the same in every iteration."""
    first: dict[int, np.ndarray] = {}
    varies: set[int] = set()
    for (step, i), words in occurrences:
        if step not in loops.body:
            continue
        if i == 0:
            first[step] = words
        elif step not in varies:
            base = first.get(step)
            if base is None or (base is not words and not np.array_equal(base, words)):
                varies.add(step)
    return set(first) - varies


def _rows_by_tile(
    program: LowProgram, rows: dict[tuple[int, int], dict[int, np.ndarray]]
) -> dict[int, list[tuple[tuple[int, int], np.ndarray]]]:
    """Each physical tile's rows ``(occurrence, words)`` in execution order."""
    out: dict[int, list[tuple[tuple[int, int], np.ndarray]]] = {}
    for occurrence in _occurrences(program):
        for tile, words in rows[occurrence].items():
            out.setdefault(tile, []).append((occurrence, words))
    return out


def _bytes(words: list[int]) -> bytes:
    return np.asarray(words, dtype="<u4").tobytes()


def _labels(ops: list[Op], base: int) -> tuple[dict[Any, int], int]:
    """The address of every label in ``ops`` placed from ``base``, and the ops' words."""
    labels = {}
    words = 0
    for op in ops:
        kind = op[0]
        if kind == "w":
            words += 1
        elif kind == "label":
            labels[op[1]] = base + 4 * words
        else:
            words += _size(op)
    return labels, words


def _assemble(
    ops: list[Op],
    labels: dict[Any, int],
    strides: dict[int, tuple[int, int]],
    tile: int,
    loops: _Loops,
    row_address: list[int],
) -> list[int]:
    """The code words of ``ops`` with every label resolved."""
    words = []
    loop_first = _first_tables_of_loops(ops)
    for op in ops:
        kind = op[0]
        if kind == "w":
            words.append(op[1])
        elif kind == "label":
            continue
        elif kind == "setzi":
            words.append(encode("setzi", reg=op[1], imm=labels[op[2]]))
        elif kind == "call":
            words.append(encode("call", reg=op[1], target_words=labels[op[2]] >> 2))
        elif kind == "brz":
            words.append(encode("brz", reg=op[1], target_words=labels[op[2]] >> 2))
        elif kind == "tableoffset":
            table = op[1]
            repeat_first = loop_first[table]
            offset = labels[("table", table)] - labels[("table", repeat_first)]
            words.append(_add_word(TABLE_REGISTER, offset, "an operand-table offset", tile))
        elif kind == "rowoffset":
            _, step, row = op
            if step not in loops.body:
                raise AssertionError(f"step {step} is in no loop")
            base = labels[("rowbase", loops.body[step])]
            words.append(_add_word(0, row_address[row] - base, "a row offset", tile))
        elif kind == "rowstride":
            stride = strides[op[1]][1]
            for _ in range(ROW_STRIDE_ADDS):
                part = min(stride, ADD_MAX)
                words.append(encode("add", src=0, dst=0, simm=part))
                stride -= part
            if stride:
                raise PlanError(
                    f"tile {tile}: a loop's row stride does not fit {ROW_STRIDE_ADDS} adds"
                )
        else:  # pragma: no cover - every op kind is handled above
            raise AssertionError(f"unknown op {op!r}")
    return words


def _first_tables_of_loops(ops: list[Op]) -> dict[int, int]:
    """Per ``tableoffset`` table: the first operand table of its loop (its iteration-0 base)."""
    out = {}
    first = None
    for op in ops:
        # the loop set-up stores the body's first table through $m0
        if op[0] == "setzi" and op[1] == 0 and isinstance(op[2], tuple) and op[2][0] == "table":
            first = op[2][1]
        elif op[0] == "tableoffset" and op[1] not in out:
            assert first is not None, f"table {op[1]} is in no loop"
            out[op[1]] = first
    return out


__all__ = ["Ref", "TileImages", "build_tile_images", "lower_exchanges"]

"""``kernel-run`` for the integer, indexing and rearrangement units (kernels/units_indexing.py).

Operands are seeded random data chosen to exercise each kind (raw bit patterns for the
data-moving kernels, ties and signed zeros for argmax and equal, owned and foreign ids for
gather); each lives in its own 64-byte-aligned span of the standard region. The device code
runs on :class:`ipu_stack.isa.Tile`; its output bytes (row padding included) must equal those
the simulator writes from the registry semantics, exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.errors import GraphError, SimulationError
from ipu_stack.isa import Tile
from ipu_stack.isa.ops_indexing import Trap
from ipu_stack.kernels.units_indexing import GATHER_TRAP, IndexingUnit, Operand2D


def _bits(rng: np.random.Generator, v: Operand2D) -> np.ndarray:
    """Random raw element bits of an operand (NaN patterns included for floats)."""
    eb = {"f8": 1, "f16": 2, "f32": 4, "i32": 4}[v.dtype]
    raw = rng.integers(0, 256, (v.rows, v.cols * eb), dtype=np.uint8)
    return _typed(raw, v.dtype)


def _typed(raw: np.ndarray, dtype: str) -> np.ndarray:
    from ipu_stack.target import ipu21

    return raw.view(np.dtype(ipu21.precision(dtype).numpy_name))


def _values(rng: np.random.Generator, v: Operand2D, pool: np.ndarray) -> np.ndarray:
    """Elements drawn from ``pool`` (float64 values), stored in the operand's dtype."""
    from ipu_stack.target import ipu21

    x = rng.choice(pool, (v.rows, v.cols))
    return x.astype(np.dtype(ipu21.precision(v.dtype).numpy_name))


_FLOAT_POOL = np.array([-2.5, -1.0, -0.0, 0.0, 0.5, 1.0, 3.0, np.inf, -np.inf, np.nan])


def operands(unit: IndexingUnit, rng: np.random.Generator) -> tuple[list[np.ndarray], dict]:
    """Seeded inputs of the unit and the runtime scalars (registers) it takes."""
    kind = unit.kind
    scalars: dict[int, int] = {}
    if kind == "gather_rows":
        table, ids_v = unit.inputs
        total = table.rows * 3
        offset = table.rows
        ids = rng.integers(0, total, (ids_v.rows, ids_v.cols)).astype(np.int32)
        scalars = {5: offset, 6: total}
        return [_bits(rng, table), ids], scalars
    if kind == "argmax":
        (v,) = unit.inputs
        if v.dtype == "i32":
            return [rng.integers(-4, 4, (v.rows, v.cols)).astype(np.int32)], scalars
        return [_values(rng, v, _FLOAT_POOL[:-1] if v.cols > 3 else _FLOAT_POOL)], scalars
    if kind == "equal":
        if unit.inputs[0].dtype == "i32":
            pool = np.array([-(2**31), -7, -1, 0, 1, 7, 2**31 - 1], np.float64)
        else:
            pool = _FLOAT_POOL
        a, b = (_values(rng, v, pool) for v in unit.inputs)
        if a.shape == b.shape:  # equal pairs (NaN with NaN included) in half the elements
            b = np.where(rng.random(a.shape) < 0.5, a, b)
        return [a, b], scalars
    if kind == "where":
        cond = rng.choice(np.array([0, 0, 1, -1, 7, -(2**31)]), (unit.inputs[0].rows,
                                                                 unit.inputs[0].cols))  # fmt: skip
        return [cond.astype(np.int32), *(_bits(rng, v) for v in unit.inputs[1:])], scalars
    if kind in ("add", "mul"):
        big = [rng.integers(-(2**31), 2**31, (v.rows, v.cols), dtype=np.int64).astype(np.int32)
               for v in unit.inputs]  # fmt: skip
        return big, scalars
    if kind == "cast" and "f8" in (unit.out.dtype, unit.inputs[0].dtype):
        return [_f8_cast_input(rng, unit)], scalars
    if kind == "cast":
        return [_cast_input(rng, unit.inputs[0])], scalars
    return [_bits(rng, v) for v in unit.inputs], scalars


_I32_SPECIAL = [0, 1, -1, 2**31 - 1, -(2**31), 2049, 2051, -2051, 4097, 65504, 65519, 65520,
                -65520, 2**24 + 1, 2**24 + 3, -(2**24) - 3, 2**25 + 6, 2**31 - 64, 2**31 - 65,
                2**23 + 5, -(2**23) - 1, 1025, 2047]  # fmt: skip
_FLOAT_SPECIAL = [0.0, -0.0, 0.5, -0.5, 0.99, -1.0, 1.5, -2.5, 65504.0, np.inf, -np.inf, np.nan,
                  2.0**31, -(2.0**31), 2.0**31 - 128, 3e9, -3e9, 1e-8]  # fmt: skip


def _cast_input(rng: np.random.Generator, v: Operand2D) -> np.ndarray:
    """Cast operands: every special first (ties, overflow, NaN, signed zeros), then random."""
    from ipu_stack.target import ipu21

    n = v.rows * v.cols
    if v.dtype == "i32":
        mixed = np.concatenate([rng.integers(-(2**31), 2**31, n), rng.integers(-70000, 70000, n)])
        pool = np.concatenate([np.array(_I32_SPECIAL, np.int64), rng.permutation(mixed)])
        return pool[:n].reshape(v.rows, v.cols).astype(np.int32)
    mixed = np.concatenate([rng.uniform(-3e9, 3e9, n), rng.uniform(-100, 100, n)])
    pool = np.concatenate([np.array(_FLOAT_SPECIAL), rng.permutation(mixed)])
    with np.errstate(over="ignore"):
        return pool[:n].reshape(v.rows, v.cols).astype(ipu21.precision(v.dtype).numpy_name)


def _place(tile: Tile, at: int, v: Operand2D, data: np.ndarray, rng: np.random.Generator) -> None:
    """Write ``data`` as rows of ``v.stride`` bytes; the row padding holds garbage."""
    raw = rng.integers(0, 256, (v.rows, v.stride), dtype=np.uint8)
    row_bytes = data.shape[1] * data.dtype.itemsize
    raw[:, :row_bytes] = np.ascontiguousarray(data).view(np.uint8).reshape(v.rows, row_bytes)
    tile.mem.write(at, raw.reshape(-1), 4)


def run_indexing(program: Any, unit: IndexingUnit, rng: np.random.Generator,
                 args: list[np.ndarray] | None = None) -> dict:  # fmt: skip
    """Run ``unit`` once on seeded (or given) operands; the entry's report."""
    from ipu_stack.kernels.kernel_run import STACK_TOP, _Placer
    from ipu_stack.kernels.kernel_run_f32 import stray_writes
    from ipu_stack.low import costs

    generated, scalars = operands(unit, rng)
    args = generated if args is None else args
    placer = _Placer()
    tile = Tile(program)
    modelled = costs.map_call_cycles(unit.call(_attrs(unit, scalars)))
    tile.max_cycles = 200_000 + 40 * modelled
    out_at = placer.take("standard", unit.out.nbytes, align=64, packed=True)
    tile.mem.write(out_at, rng.integers(0, 256, unit.out.nbytes, dtype=np.uint8), 4)
    regs = {2: out_at, 11: STACK_TOP}
    for i, (v, data) in enumerate(zip(unit.inputs, args, strict=True)):
        at = placer.take("standard", v.nbytes, align=64, packed=True)
        _place(tile, at, v, data, rng)
        regs[3 + i] = at
    regs.update(scalars)
    report: dict[str, Any] = {"entry": unit.entry, "kind": unit.kind, "modelled_cycles": modelled}
    try:
        want = unit.reference(args, _attrs(unit, scalars))
    except SimulationError as err:
        want, report["expected_error"] = None, str(err)
    before = tile.mem.data.copy()
    try:
        result = tile.call(unit.entry, regs)
    except Trap as trap:
        got_error = trap_error(unit.call(_attrs(unit, scalars)), trap)
        report.update(fault=str(trap), error=str(got_error),
                      ok=report.get("expected_error") == str(got_error))  # fmt: skip
        return report
    got = tile.mem.read(out_at, unit.out.nbytes, 4)
    if want is None:
        report.update(ok=False, mismatch="the semantics raise but the kernel returned")
        return report
    wrong = np.flatnonzero(got != want)
    stray = stray_writes(tile, before, [(out_at, unit.out.nbytes)])
    report.update(
        ok=not wrong.size and not stray, wrong_bytes=int(wrong.size),
        emulated_cycles=result.cycles, max_abs_error=0.0 if not wrong.size else float("nan"),
        **({"stray_writes": stray} if stray else {}),
    )  # fmt: skip
    if wrong.size:
        report["first_wrong_byte"] = int(wrong[0])
    return report


def _attrs(unit: IndexingUnit, scalars: dict[int, int]) -> tuple:
    if unit.kind != "gather_rows":
        return ()
    shape = ",".join(map(str, unit.ids_shape))
    return (("op", "gather0"), ("ids_name", "ids"), ("ids_shape", shape),
            ("table_rows", scalars[6]), ("row_offset", scalars[5]))  # fmt: skip


def trap_error(call: Any, trap: Trap) -> SimulationError | Trap:
    """The error the semantics raise, from a gather kernel's trap ($m0 position, $m1 id)."""
    if call.kind != "gather_rows" or trap.code != GATHER_TRAP:
        return trap
    total = int(call.attr("table_rows"))
    position = trap.registers["$m0"]
    value = int(np.array([trap.registers["$m1"]], np.uint32).view(np.int32)[0])
    shape = tuple(int(d) for d in str(call.attr("ids_shape")).split(","))
    if position >= int(np.prod(shape)):
        raise GraphError(f"gather trap reports position {position} outside ids {shape}")
    pos = tuple(int(i) for i in np.unravel_index(position, shape))
    return SimulationError(
        f"{call.attr('op')}: ids {call.attr('ids_name')!r} at position {pos} holds "
        f"{value}, outside the table's {total} rows [0, {total})"
    )


_F8_SPECIAL = [0.0, -0.0, np.nan, np.inf, -np.inf, 240.0, 241.0, -300.0, 232.0, 236.0, 248.0,
               1.0625, 1.1875, -1.0625, 2.0**-10, 2.0**-11, 3 * 2.0**-11, -(2.0**-11) * 3,
               2.0**-12, -(2.0**-12), 2.0**-7 * 1.0625, 0.0078125, 1e-30, -1e-30]  # fmt: skip


def _f8_cast_input(rng: np.random.Generator, unit: IndexingUnit) -> np.ndarray:
    """F8 cast operands: every F143 pattern (from F8), or ties, clips, subnormals and NaN
    scaled by the unit's power of two (to F8)."""
    from ipu_stack.target import ipu21

    v = unit.inputs[0]
    n = v.rows * v.cols
    if v.dtype == "f8":
        raw = np.concatenate([rng.permutation(256), rng.integers(0, 256, n)])[:n]
        return raw.astype(np.uint8).reshape(v.rows, v.cols).view(ipu21.precision("f8").numpy_name)
    scale = 2.0 ** int(dict(unit.attrs)["scale_exponent"])
    mixed = np.concatenate([rng.uniform(-300, 300, n), 2.0 ** rng.uniform(-14, 8, n)])
    pool = np.concatenate([np.array(_F8_SPECIAL), rng.permutation(mixed)])[:n] * scale
    with np.errstate(over="ignore"):
        return pool.reshape(v.rows, v.cols).astype(ipu21.precision(v.dtype).numpy_name)

"""``check_call`` (a short path for in-range ``int`` fields) against its former form on valid
calls of every kind and on mutants: each field replaced by a bool, a float, a string, a
list, a NumPy integer or a value just outside its range. Both must accept the same calls and
raise the same message."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.errors import PackageError
from ipu_stack.json_fields import integer
from ipu_stack.package.format import TILE_MEMORY_SIZE
from ipu_stack.package.validate_program import CALL_FIELDS, _operand_bytes, check_call
from ipu_stack.target import ipu21


def _reference_field_ok(kind: str, value: object) -> bool:
    def is_int(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if kind in "anzb":
        low = {"a": 0, "n": 1, "z": -(2**31), "b": 0}[kind]
        high = {"a": 2**32, "n": TILE_MEMORY_SIZE, "z": 2**31, "b": 1}[kind]
        return is_int(value) and low <= value <= high  # type: ignore[operator]
    if kind == "p":
        return isinstance(value, str) and value in ipu21.PRECISIONS
    if kind == "s":
        return isinstance(value, str)
    if kind == "A":
        ok = isinstance(value, list) and bool(value)
        return ok and all(_reference_field_ok("a", v) for v in value)
    if kind == "v":
        return (
            isinstance(value, list)
            and len(value) == 5
            and all(_reference_field_ok(k, v) for k, v in zip("annap", value, strict=True))
        )
    if kind == "V":
        return isinstance(value, list) and all(_reference_field_ok("v", v) for v in value)
    return isinstance(value, list) and all(
        isinstance(a, list) and len(a) == 2 and isinstance(a[0], str) for a in value
    )


def _reference_check_call(call: object, where: str) -> None:
    """The former ``check_call``: every field through the general checker."""
    if not isinstance(call, list) or len(call) < 2 or not isinstance(call[0], str):
        raise PackageError(f"{where}: {call!r:.60} is not [kind, tile, ...]")
    integer(call[1], f"{where}: tile", 0, ipu21.TILES - 1)
    spec = CALL_FIELDS.get(call[0])
    if spec is None:
        return
    if len(call) != len(spec) + 2:
        raise PackageError(f"{where}: a {call[0]} call has {len(call) - 2} fields, not {len(spec)}")
    for index, (kind, value) in enumerate(zip(spec, call[2:], strict=True)):
        if not _reference_field_ok(kind, value):
            raise PackageError(f"{where}: {call[0]} field {index + 2} is bad: {value!r:.60}")
    if call[0] == "gemm" and call[8] != "f8" and call[11] != 0:
        raise PackageError(f"{where}: a {call[8]} gemm has a scale exponent ({call[11]})")
    if max(_operand_bytes(call)) > TILE_MEMORY_SIZE:
        raise PackageError(
            f"{where}: a {call[0]} call's operand of {max(_operand_bytes(call))} bytes does "
            f"not fit in tile memory ({TILE_MEMORY_SIZE} bytes)"
        )


VALID = [
    ["gemm", 5, 819136, 362208, 680960, 162, 192, 160, "f16", 0, "interleaved", 0],
    ["gemm", 1471, 0, 64, 128, 1, 16, 16, "f8", 1, "standard", -3],
    ["add", 0, 4096, [8192, 12288], 160, "f16"],
    ["copy", 7, 362208, 425984, 2304],
    ["copy2d", 7, 362208, 425984, 320, 54, 1088, 320],
    ["fill", 9, 362208, 2304],
    ["map", 3, "gelu", [4096, 6, 160, 320, "f16"], [[8192, 6, 160, 320, "f16"]],
     [["approximate", "tanh"]]],
    ["map", 3, "add", [4096, 6, 160, 320, "f16"],
     [[8192, 6, 160, 320, "f16"], [0, 1, 160, 320, "f16"]], []],
    ["nosuchkind", 3, 1, 2],
]  # fmt: skip

ODD = [True, False, 1.0, "7", [], [1], None, np.int64(3), -1, 0, 1, 2**31, 2**32, 2**32 + 1,
       -(2**31) - 1, TILE_MEMORY_SIZE, TILE_MEMORY_SIZE + 1, ipu21.TILES, "f16", "x"]  # fmt: skip


def _outcome(check, call):
    try:
        check(call, "step 1 call 0")
    except PackageError as err:
        return str(err)
    return None


def _mutants():
    yield from VALID
    yield []
    yield ["gemm"]
    yield [3, 4]
    yield ["copy", 1, 2, 3]  # a field short
    for call in VALID:
        for index in range(1, len(call)):
            for odd in ODD:
                mutated = list(call)
                mutated[index] = odd
                yield mutated
            if isinstance(call[index], list):  # inside a list field
                for inner in range(len(call[index])):
                    for odd in ODD[:8]:
                        mutated = list(call)
                        mutated[index] = list(call[index])
                        mutated[index][inner] = odd
                        yield mutated


def test_check_call_matches_its_former_form():
    seen_ok = seen_bad = 0
    for call in _mutants():
        new, old = _outcome(check_call, call), _outcome(_reference_check_call, call)
        assert new == old, call
        seen_ok += new is None
        seen_bad += new is not None
    assert seen_ok > len(VALID) and seen_bad > 100


@pytest.mark.parametrize("kind", sorted(CALL_FIELDS))
def test_every_kind_is_exercised(kind):
    assert any(call[0] == kind for call in VALID)

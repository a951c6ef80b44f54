"""Package validation, second part: scalars, exchange tables, schedules and coverage.

:func:`validate_structure` runs after :func:`ipu_stack.package.validate.validate` has checked
the sections, segments, allocations, bindings and step ranges. It rejects what would
otherwise reach the simulator as a crash or a silent misreading:

- ``clock_hz``, ``estimated_cycles`` and ``estimated_exchange_cycles`` that are not positive
  (non-negative) integers;
- transfers of no words, of more words than a tile's memory, with a width flag other than 0/1,
  from or to a tile outside the package, at a misaligned address or outside the tiles' memory
  segments; destinations equal to their source, first arrivals below -1;
- pieces that do not cover each transfer's words exactly once, in order of offset, with
  non-negative send cycles (two pieces claiming the same words collide);
- exchange schedules whose horizon, kind or model fields are not of their type;
- repeat steps whose iterated entries are not ``[tile, address, name, stride]``;
- input and output bindings whose slices leave elements of the value uncovered (an edited
  shape).

Raises :class:`~ipu_stack.errors.PackageError` naming the file and the first problem.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.errors import PackageError
from ipu_stack.json_fields import int_field, integer, list_field, model_from_json, str_field
from ipu_stack.package.format import TILE_MEMORY_SIZE, Package, flat_rows
from ipu_stack.target import ipu21

#: Largest clock a package may state (100 GHz): a sanity limit, not a hardware number.
MAX_CLOCK_HZ = 100_000_000_000
MAX_WORDS = TILE_MEMORY_SIZE // ipu21.WORD_BYTES


def validate_structure(package: Package, where: str, segments: np.ndarray) -> None:
    """Run every check of this module (``segments`` sorted by tile, address)."""
    m = package.manifest
    if "clock_hz" in m:
        int_field(m, "clock_hz", where, 1, MAX_CLOCK_HZ)
    program = m["program"]
    int_field(program, "estimated_cycles", f"{where}: program")
    int_field(program, "estimated_exchange_cycles", f"{where}: program")
    tile_set = np.asarray(sorted(package.tiles), dtype=np.int64)
    _transfers(package, tile_set, segments, where)
    _pieces(package, where)
    for index, step in enumerate(program["steps"]):
        here = f"{where}: step {index}"
        if step["kind"] == "exchange":
            schedule = step["schedule"]
            int_field(schedule, "horizon", here)
            str_field(schedule, "kind", here)
            model_from_json(schedule.get("model"), here)
            if not isinstance(schedule.get("first_arrivals"), bool):
                raise PackageError(f"{here}: schedule 'first_arrivals' must be true or false")
            if not isinstance(step.get("label", ""), str):
                raise PackageError(f"{here}: label must be a string")
        elif step["kind"] == "repeat":
            for entry in list_field(step, "iterated", here):
                if not (
                    isinstance(entry, list)
                    and len(entry) == 4
                    and isinstance(entry[2], str)
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in entry[:2])
                    and isinstance(entry[3], int)
                    and not isinstance(entry[3], bool)
                ):
                    raise PackageError(f"{here}: iterated entry {entry!r:.60} is not "
                                       "[tile, address, name, stride]")  # fmt: skip
        else:
            for position, call in enumerate(step["calls"]):
                check_call(call, f"{here} call {position}")
    _binding_fields(package, where)
    for index, kernel in enumerate(m["kernels"]):
        if not isinstance(kernel, dict) or not isinstance(kernel.get("name"), str):
            raise PackageError(f"{where}: kernel entry {index} has no name")
    _coverage(package, where)


def _binding_fields(package: Package, where: str) -> None:
    for b in package.bindings():
        here = f"{where}: binding {b['name']!r}"
        if "scale_exponent" in b:
            int_field(b, "scale_exponent", here, -128, 127)
        if "embedded" in b and not isinstance(b["embedded"], bool):
            raise PackageError(f"{here}: 'embedded' must be true or false")


#: Field kinds of each call (after kind and tile): ``a`` address or count >= 0, ``n`` count
#: >= 1, ``z`` any int, ``b`` 0/1, ``p`` precision, ``s`` string, ``A`` list of addresses,
#: ``v`` view [address, rows >= 1, cols >= 1, stride, precision], ``V`` list of views,
#: ``K`` attributes [[name, value], ...].
CALL_FIELDS = {
    "gemm": "aaannnpbsz",
    "add": "aAnp",
    "copy": "aan",
    "copy2d": "aannaa",  # dst, src, run bytes, runs, dst stride, src stride
    "fill": "an",
    "map": "svVK",
}


#: ``[low, high]`` of the integer field kinds
_INT_BOUNDS = {"a": (0, 2**32), "n": (1, TILE_MEMORY_SIZE), "z": (-(2**31), 2**31), "b": (0, 1)}


def check_call(call: object, where: str) -> None:
    """One kernel call's fields typed and ranged (a package call list, or one the simulator
    filled in from a kernel entry's template and the operand registers).

    The image run checks every call it makes (22 K in the batch-4 SigLIP MLP), so plain
    ``int`` fields in range take a short path; anything else gets the full check.
    """
    if not isinstance(call, list) or len(call) < 2 or not isinstance(call[0], str):
        raise PackageError(f"{where}: {call!r:.60} is not [kind, tile, ...]")
    tile = call[1]
    if type(tile) is not int or not 0 <= tile < ipu21.TILES:
        integer(tile, f"{where}: tile", 0, ipu21.TILES - 1)
    spec = CALL_FIELDS.get(call[0])
    if spec is None:
        return  # the loader names unknown kinds
    if len(call) != len(spec) + 2:
        raise PackageError(f"{where}: a {call[0]} call has {len(call) - 2} fields, not {len(spec)}")
    for index, kind in enumerate(spec, 2):
        value = call[index]
        bounds = _INT_BOUNDS.get(kind)
        if bounds is not None and type(value) is int and bounds[0] <= value <= bounds[1]:
            continue
        if not _field_ok(kind, value):
            raise PackageError(f"{where}: {call[0]} field {index} is bad: {value!r:.60}")
    if call[0] == "gemm" and call[8] != "f8" and call[11] != 0:
        raise PackageError(f"{where}: a {call[8]} gemm has a scale exponent ({call[11]})")
    if max(_operand_bytes(call)) > TILE_MEMORY_SIZE:
        raise PackageError(
            f"{where}: a {call[0]} call's operand of {max(_operand_bytes(call))} bytes does "
            f"not fit in tile memory ({TILE_MEMORY_SIZE} bytes)"
        )


def _operand_bytes(call: list) -> list[int]:
    """The bytes each operand of a (well-typed) call spans at least."""
    kind = call[0]
    if kind == "gemm":
        rows, k, cols, eb = call[5], call[6], call[7], ipu21.precision(call[8]).element_bytes
        return [rows * k * eb, k * cols * eb, rows * cols * eb]
    if kind == "add":
        return [call[4] * ipu21.precision(call[5]).element_bytes]
    if kind in ("copy", "fill"):
        return [call[-1]]
    if kind == "copy2d":
        size, rows = call[4], call[5]
        return [(rows - 1) * call[6] + size, (rows - 1) * call[7] + size]
    if kind == "map":
        views = [call[3], *call[4]]
        return [v[1] * v[2] * ipu21.precision(v[4]).element_bytes for v in views] or [0]
    return [0]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field_ok(kind: str, value: object) -> bool:
    bounds = _INT_BOUNDS.get(kind)
    if bounds is not None:
        return _is_int(value) and bounds[0] <= value <= bounds[1]  # type: ignore[operator]
    if kind == "p":
        return isinstance(value, str) and value in ipu21.PRECISIONS
    if kind == "s":
        return isinstance(value, str)
    if kind == "A":
        return isinstance(value, list) and bool(value) and all(_field_ok("a", v) for v in value)
    if kind == "v":
        return (
            isinstance(value, list)
            and len(value) == 5
            and all(_field_ok(k, v) for k, v in zip("annap", value, strict=True))
        )
    if kind == "V":
        return isinstance(value, list) and all(_field_ok("v", v) for v in value)
    return isinstance(value, list) and all(
        isinstance(a, list) and len(a) == 2 and isinstance(a[0], str) for a in value
    )


def _inside(
    segments: np.ndarray, tiles: np.ndarray, start: np.ndarray, end: np.ndarray
) -> np.ndarray:
    key_seg = segments[:, 0] * (1 << 32) + segments[:, 1]
    i = np.searchsorted(key_seg, tiles * (1 << 32) + start, side="right") - 1
    ok = i >= 0
    i = np.maximum(i, 0)
    ok &= segments[i, 0] == tiles
    ok &= segments[i, 1] + segments[i, 2] >= end
    return np.asarray(ok & (end > start))


def _transfers(package: Package, tile_set: np.ndarray, segments: np.ndarray, where: str) -> None:
    t = package.table("transfers")
    d = package.table("destinations")
    if len(t) == 0:
        return
    source, address, words, paired = t[:, 0], t[:, 1], t[:, 2], t[:, 3]
    bad = (words < 1) | (words > MAX_WORDS) | ((paired != 0) & (paired != 1))
    if bad.any():
        i = int(np.argmax(bad))
        raise PackageError(
            f"{where}: transfer {i}: {int(words[i])} words (must be 1..{MAX_WORDS}) or width "
            f"flag {int(paired[i])} (must be 0 or 1)"
        )
    ok = np.isin(source, tile_set) & (address % ipu21.WORD_BYTES == 0)
    ok &= _inside(segments, source, address, address + words * ipu21.WORD_BYTES)
    if not ok.all():
        i = int(np.argmin(ok))
        raise PackageError(
            f"{where}: transfer {i} reads tile {int(source[i])} [{int(address[i]):#x}, "
            f"+{int(words[i]) * 4}): not a package tile, misaligned or outside its segments"
        )
    owner = np.repeat(np.arange(len(t)), np.diff(np.append(t[:, 4], len(d))))
    dt, da, arrival = d[:, 0], d[:, 1], d[:, 2]
    span = words[owner] * ipu21.WORD_BYTES
    ok = np.isin(dt, tile_set) & (da % ipu21.WORD_BYTES == 0) & (dt != source[owner])
    ok &= _inside(segments, dt, da, da + span) & (arrival >= -1)
    if not ok.all():
        i = int(np.argmin(ok))
        raise PackageError(
            f"{where}: transfer {int(owner[i])} destination tile {int(dt[i])} "
            f"[{int(da[i]):#x}, +{int(span[i])}) arrival {int(arrival[i])}: not a package tile, "
            "the source itself, misaligned, outside its segments or a bad arrival"
        )


def _pieces(package: Package, where: str) -> None:
    t = package.table("transfers")
    p = package.table("pieces")
    if len(t) == 0 and len(p) == 0:
        return
    owner, send, offset, words = p[:, 0], p[:, 1], p[:, 2], p[:, 3]
    bad = (owner < 0) | (owner >= len(t)) | (send < 0) | (offset < 0) | (words < 1)
    if bad.any():
        i = int(np.argmax(bad))
        raise PackageError(
            f"{where}: piece {i} (transfer {int(owner[i])}, send cycle {int(send[i])}, offset "
            f"{int(offset[i])}, {int(words[i])} words) names no transfer or has a negative field"
        )
    order = np.lexsort((offset, owner))
    o, off, w = owner[order], offset[order], words[order]
    first = np.ones(len(o), dtype=bool)
    first[1:] = o[1:] != o[:-1]
    expected = np.where(first, 0, np.append(0, off[:-1] + w[:-1]))
    total = np.bincount(o, weights=w, minlength=len(t)).astype(np.int64)
    if (off != expected).any() or (total != t[:, 2]).any():
        bad_transfer = (
            int(o[np.argmax(off != expected)])
            if (off != expected).any()
            else int(np.argmax(total != t[:, 2]))
        )
        raise PackageError(
            f"{where}: the pieces of transfer {bad_transfer} do not cover its "
            f"{int(t[bad_transfer, 2])} words exactly once (gaps, overlaps or colliding pieces)"
        )


def _coverage(package: Package, where: str) -> None:
    for b in package.bindings():
        n, c = flat_rows(b["shape"])
        if n * c > 1 << 28:
            raise PackageError(f"{where}: binding {b['name']!r} of {n * c} elements is too large")
        sl = package.binding_slices(b)
        key = sl[:, 0] * (1 << 32) + sl[:, 1]
        if len(np.unique(key)) != len(key):
            raise PackageError(f"{where}: binding {b['name']!r} has two slices at one tile address")
        seen = np.zeros((n, c), dtype=bool)
        for _, _, _, r0, r1, c0, c1, *_ in package.binding_slices(b).tolist():
            seen[r0:r1, c0:c1] = True
        if b["role"] != "weight" and not seen.all():  # weight_arrays checks weights
            raise PackageError(
                f"{where}: binding {b['name']!r} {tuple(b['shape'])}: {int((~seen).sum())} of "
                f"{n * c} elements are in no slice (the shape does not match the program)"
            )

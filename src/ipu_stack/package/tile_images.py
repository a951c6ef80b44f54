"""The package's tile images: segments with data, exchange-row records, linked kernel entries.

Written by :func:`ipu_stack.package.assemble.assemble_package`; checked by
:func:`validate_tile_code`. Per tile the ``segments`` table holds its data segments (READ |
WRITE, zero-filled at load, ``data_offset`` -1) and its image segments (READ | EXEC code and
rows, READ operand tables) whose bytes are in the ``images`` section at ``data_offset``. The
``rows`` table records every exchange row (tile, step, iteration, address, words).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from ipu_stack.errors import PackageError
from ipu_stack.exchange.model import IPU21_MODEL
from ipu_stack.package.format import SEGMENT_EXEC, SEGMENT_WRITE, Package, SectionWriter
from ipu_stack.target import ipu21
from ipu_stack.tilecode.decode import decode_rows

ABSENT = "no kernel object: no SDK compiled the kernel (check-only build); the entry holds a placeholder and the simulator runs the registry's reference semantics"  # noqa: E501


def write_images(writer: SectionWriter, built: Any, seg_rows: list[Any]) -> dict:
    """Append the image segments (to ``seg_rows``), the ``images`` blob, the ``rows`` table
    and the kernel objects; returns the manifest's ``tile_code`` record."""
    images = built.images
    writer.begin_blob("images")
    linked_image = images.linked.image()
    row_rows = []
    for image in images.tiles:
        segments = list(image.segments)
        if linked_image:
            segments.append((ipu21.KERNEL_ENTRY_BASE, 1 | SEGMENT_EXEC, linked_image))
        for address, flags, data in sorted(segments):
            offset = writer.blob_part("images", data)
            seg_rows.append((image.tile, address, len(data), flags, offset))
        row_rows += [(image.tile, *r) for r in image.rows]
    writer.table("rows", row_rows)
    writer.begin_blob("kernel_objects")
    objects = []
    for artifact in built.kernels:
        path = artifact.object
        if path is not None and path.exists():
            data = path.read_bytes()
            offset = writer.blob_part("kernel_objects", data)
            digest = hashlib.sha256(data).hexdigest()
            objects.append(
                {"name": artifact.name, "offset": offset, "size": len(data), "sha256": digest}
            )
        else:
            objects.append({"name": artifact.name, "absent": ABSENT})
    return {
        "entry": ipu21.APPLICATION_LOAD_BASE,
        "kernel_entries": images.linked.records(),
        "kernel_objects": objects or [{"name": "*", "absent": ABSENT}],
        "summary": images.describe(),
        "estimated_row_bytes": max((t.exchange_row_bytes for t in built.runtime), default=0),
    }


#: the parts of a package that describe the program the tile images were built from
DESCRIPTION_TABLES = ("transfers", "destinations", "pieces")


def description_digest(package: Package) -> str:
    """SHA-256 of the step description (program steps and the exchange tables).

    The images are what runs; the description is kept as debug metadata and to rebuild the
    simulator's view of the program. Its digest, taken when the images are built, lets
    validation reject a package whose description was edited afterwards (re-signed or not).
    """
    import json

    h = hashlib.sha256()
    steps = package.manifest["program"]["steps"]
    h.update(json.dumps(steps, sort_keys=True, separators=(",", ":")).encode())
    for name in DESCRIPTION_TABLES:
        table = package.table(name)
        h.update(name.encode() + np.asarray(table.shape, "<i8").tobytes() + table.tobytes())
    return h.hexdigest()


def _validate_kernel_entries(entries: Any, where: str) -> None:
    """Each kernel entry is ``[address, symbol, registers, call template]``; the template's
    ``$mK`` names one of the entry's operand registers ($m2..), ``$sK`` a spilled operand."""
    if not isinstance(entries, list):
        raise _fail(where, "tile_code kernel_entries is not a list")
    seen: set[object] = set()
    for i, e in enumerate(entries):
        what = f"tile_code kernel entry {i}"
        if not (isinstance(e, list) and len(e) == 4):
            raise _fail(where, f"{what} is not [address, symbol, registers, call template]")
        address, symbol, nregs, template = e
        if (
            type(address) is not int
            or not ipu21.TILE_MEMORY_BASE <= address < ipu21.TILE_MEMORY_END
        ):
            raise _fail(where, f"{what}: address {address!r} is not a tile-memory address")
        if address in seen:
            raise _fail(where, f"{what}: a second entry at {address:#x}")
        seen.add(address)
        if not isinstance(symbol, str) or type(nregs) is not int or not 0 <= nregs <= 14:
            raise _fail(
                where, f"{what}: symbol {symbol!r} or register count {nregs!r} is malformed"
            )
        if not (isinstance(template, list) and len(template) >= 2 and isinstance(template[0], str)):
            raise _fail(where, f"{what}: call template {str(template)[:60]} is malformed")
        stack = list(template)
        while stack:
            x = stack.pop()
            if isinstance(x, list):
                stack.extend(x)
            elif isinstance(x, str) and x[:2] in ("$m", "$s"):
                k = x[2:]
                top = 2 + nregs if x[1] == "m" else 1 << 16
                low = 2 if x[1] == "m" else 0
                if not k.isdigit() or not low <= int(k) < top:
                    raise _fail(where, f"{what}: {x!r} names no operand of its {nregs} registers")


def _linked_slots(entries: list, seg: np.ndarray, where: str) -> None:
    """The kernel entries are the consecutive 8-byte slots of the linked kernel segment just
    after the entry (every tile's), one entry each: a call into a slot with no entry would
    otherwise run the slot's stub as code."""
    first = ipu21.APPLICATION_LOAD_BASE + 8
    addresses = sorted(int(e[0]) for e in entries)
    if addresses != list(range(first, first + 8 * len(addresses), 8)):
        raise _fail(where, f"kernel entries are not the consecutive 8-byte slots from {first:#x}")
    linked = seg[(seg[:, 1] == first) & ((seg[:, 3] & SEGMENT_EXEC) != 0)]
    wrong = linked[linked[:, 2] != 8 * len(addresses)]
    if len(wrong):
        tile, size = int(wrong[0, 0]), int(wrong[0, 2])
        raise _fail(
            where,
            f"tile {tile}: the linked kernel segment holds {size // 8} slots, the kernel entry "
            f"table {len(addresses)}",
        )


def check_description(package: Package, where: str) -> None:
    """Reject a package whose step description is not the one its images were built from
    (run last: the structural checks name a malformed description more precisely)."""
    if package.manifest["tile_code"].get("description_digest") != description_digest(package):
        raise _fail(
            where,
            "the step description (program steps, transfers, destinations, pieces) is not the "
            "one the tile images were built from: it was edited after the build",
        )


def _fail(where: str, message: str) -> PackageError:
    return PackageError(f"{where}: {message}")


def validate_tile_code(package: Package, where: str) -> None:
    """Reject: an entry other than 0x4c010 (or a tile without code there), code outside the
    executable region or overlapping data, image data outside the images section, rows whose
    sends or pointers address outside tile memory, and a schedule claimed under an exchange
    model other than the IPU21's.

    Raises:
        PackageError: naming the file and the first problem.
    """
    m = package.manifest
    code = m.get("tile_code")
    if not isinstance(code, dict):
        raise _fail(where, "manifest has no 'tile_code' record")
    _validate_kernel_entries(code.get("kernel_entries"), where)
    entry = code.get("entry")
    if entry != ipu21.APPLICATION_LOAD_BASE:
        shown = f"{entry:#x}" if isinstance(entry, int) else repr(entry)
        raise _fail(where, f"entry {shown} is not the load base {ipu21.APPLICATION_LOAD_BASE:#x}")
    for index, step in enumerate(m["program"]["steps"]):
        if step.get("kind") == "exchange":
            model = step.get("schedule", {}).get("model")
            if model != IPU21_MODEL.as_dict():
                raise _fail(
                    where,
                    f"step {index}: exchange model {model} is not the IPU21's "
                    f"{IPU21_MODEL.as_dict()}",
                )
    seg = package.table("segments")
    _linked_slots(code["kernel_entries"], seg, where)
    blob = package.blob("images")
    tile, start, size, flags, offset = (seg[:, i] for i in range(5))
    end = start + size
    carries = offset >= 0
    bad = carries & (offset + size > len(blob))
    bad |= ~carries & (offset != -1)
    if bad.any():
        i = int(np.argmax(bad))
        raise _fail(
            where,
            f"tile {int(tile[i])}: segment {int(start[i]):#x} data "
            f"[{int(offset[i])}, +{int(size[i])}) is outside the images section",
        )
    exe = (flags & SEGMENT_EXEC) != 0
    if (exe & ~carries).any() or (exe & (end > ipu21.EXECUTABLE_LIMIT)).any():
        i = int(np.argmax((exe & ~carries) | (exe & (end > ipu21.EXECUTABLE_LIMIT))))
        raise _fail(
            where,
            f"tile {int(tile[i])}: code segment [{int(start[i]):#x}, "
            f"{int(end[i]):#x}) has no data or reaches past "
            f"{ipu21.EXECUTABLE_LIMIT:#x} (instruction fetch limit)",
        )
    data = (flags & SEGMENT_WRITE) != 0
    ce, de = np.flatnonzero(exe), np.flatnonzero(data)
    for i in ce.tolist():
        same = de[tile[de] == tile[i]]
        hit = same[(start[same] < end[i]) & (start[i] < end[same])]
        if len(hit):
            j = int(hit[0])
            raise _fail(
                where,
                f"tile {int(tile[i])}: code [{int(start[i]):#x}, {int(end[i]):#x})"
                f" overlaps data [{int(start[j]):#x}, {int(end[j]):#x})",
            )
    entries = set(tile[exe & (start == ipu21.APPLICATION_LOAD_BASE)].tolist())
    missing = sorted(set(m["tiles"]) - entries)
    if missing:
        raise _fail(where, f"tile {missing[0]} has no code at the entry {entry:#x}")
    _validate_rows(package, seg, blob, where)


def _validate_rows(package: Package, seg: np.ndarray, blob: memoryview, where: str) -> None:
    rows = package.table("rows")
    exe = seg[(seg[:, 3] & SEGMENT_EXEC) != 0]
    for tile, step, iteration, address, words in rows.tolist():
        inside = exe[(exe[:, 0] == tile) & (exe[:, 1] <= address)
                     & (exe[:, 1] + exe[:, 2] >= address + 4 * words)]  # fmt: skip
        if not len(inside):
            raise _fail(
                where,
                f"tile {tile}: row of step {step} at {address:#x} (+{4 * words} "
                "bytes) is in no code segment",
            )
        s = inside[0]
        lo = int(s[4] + address - s[1])
        row = np.frombuffer(blob[lo : lo + 4 * words], "<u4")
        d = decode_rows(row)
        wpi = 1 + ((d.sctl >> 2) & 1)
        send = (d.kind == 4) & ((d.sctl & 3) != 0)  # sctl 0 advances without sending (§9.4)
        first, last = d.address * 4, (d.address + d.items * wpi) * 4
        out = send & ((first < ipu21.TILE_MEMORY_BASE) | (last > ipu21.TILE_MEMORY_END))
        pic = (d.kind == 2) & (d.sel == 0)
        out |= pic & (
            (d.value * 4 < ipu21.TILE_MEMORY_BASE) | (d.value * 4 >= ipu21.TILE_MEMORY_END)
        )
        if out.any():
            k = int(np.argmax(out))
            raise _fail(
                where,
                f"tile {tile}: row of step {step} iteration {iteration}: the "
                f"instruction at {address + 4 * k:#x} addresses outside tile "
                "memory",
            )

"""``package-inspect --tile N --disasm``: a tile's supervisor code and exchange rows as text.

Reads the package's segments and row records and decodes every word with
:mod:`ipu_stack.tilecode.decode` only (never the encoder). Code lines: address, word,
mnemonic and operands; a ``call`` to a linked kernel entry is annotated with the kernel's
symbol and the operand values the code loads from its operand table (``setzi $m1`` then
``ld32``). Row lines add the row cycle at which each instruction acts (its events summed).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipu_stack.package.format import SEGMENT_EXEC, Package
from ipu_stack.tilecode.decode import decode, decode_picword

_WAITS = {"delay", "delaypic", "delayxpic"}


def _words(package: Package, tile: int) -> dict[int, int]:
    """Every image word of ``tile`` by address."""
    blob = package.blob("images")
    out: dict[int, int] = {}
    for t, address, size, _flags, offset in package.table("segments").tolist():
        if t == tile and offset >= 0:
            words = np.frombuffer(blob[offset : offset + size], "<u4").tolist()
            out.update(zip(range(address, address + size, 4), words, strict=True))
    return out


def disassemble(package: Package, tile: int) -> list[str]:
    """The lines of a tile's disassembly (see module docstring)."""
    words = _words(package, tile)
    code = package.manifest["tile_code"]
    entries = {int(a): (s, int(n), t) for a, s, n, t in code["kernel_entries"]}
    rows = [r for r in package.table("rows").tolist() if r[0] == tile]
    in_rows: set[int] = set()
    for _, _, _, address, count in rows:
        in_rows.update(range(address, address + 4 * count, 4))
    seg = package.table("segments")
    lines = [f"tile {tile}: entry {code['entry']:#x}"]
    for t, address, size, flags, offset in seg.tolist():
        if t != tile or offset < 0 or not flags & SEGMENT_EXEC:
            continue
        if address == min(entries, default=-1):
            lines.append(f"kernel entries [{address:#x}, {address + size:#x}): "
                         f"{len(entries)} placeholders (no kernel objects)")  # fmt: skip
            continue
        lines.append(f"code [{address:#x}, {address + size:#x}):")
        table = 0
        regs: dict[int, int] = {}
        for a in range(address, address + size, 4):
            if a in in_rows:
                continue
            word = words[a]
            if word == 0:
                continue  # the guard after the rows
            ins = decode(word)
            note = ""
            f = ins.fields
            if ins.mnemonic == "setzi":
                regs[f["reg"]] = f["imm"]
                if f["reg"] == 1:
                    table = f["imm"]
            elif ins.mnemonic == "ld32" and f["dst"] == 1:
                table = -1  # a loop body: the table base comes from the loop state
            elif ins.mnemonic == "call":
                target = f["target_words"] << 2
                if target in entries and table < 0:
                    symbol, _, template = entries[target]
                    note = f"  ; {symbol} ({template[0]}): operands from this iteration's table"
                elif target in entries:
                    symbol, n, template = entries[target]
                    values = [words.get(table + 4 * (1 + i)) for i in range(n)]
                    shown = " ".join(
                        f"$m{2 + i}={v:#x}" if isinstance(v, int) else f"$m{2 + i}=?"
                        for i, v in enumerate(values)
                    )
                    step = words.get(table)
                    note = f"  ; {symbol} ({template[0]}) step {step}: {shown}"
                else:
                    note = f"  ; exchange row at {target:#x}"
            lines.append(f"  {a:#010x}  {word:08x}  {ins.text()}{note}")
    for _, step, iteration, address, count in rows:
        lines.append(f"row step {step} iteration {iteration} [{address:#x}, "
                     f"{address + 4 * count:#x}): {count} words")  # fmt: skip
        cycle = 0
        second = False
        for k in range(count):
            a = address + 4 * k
            ins = decode_picword(words[a]) if second else decode(words[a])
            second = ins.mnemonic == "sendpicp"
            if ins.mnemonic in _WAITS:
                cycle += ins.fields["events_m1"] + 1
            lines.append(f"  {a:#010x}  {words[a]:08x}  @{cycle:<7} {ins.text()}")
    return lines


def segment_records(
    package: Package, manifest_bytes: int, header_bytes: int
) -> list[dict[str, Any]]:
    """Every segment of every tile: tile, address, size, flags and the file offset of its
    data (``None`` for zero-filled data segments)."""
    base = header_bytes + manifest_bytes + package.manifest["sections"]["images"]["offset"]
    return [
        {
            "tile": t,
            "address": a,
            "size": s,
            "flags": f,
            "file_offset": base + o if o >= 0 else None,
        }
        for t, a, s, f, o in package.table("segments").tolist()
    ]

"""JSON formats for exchange phases (snapshots) and their schedules.

Both formats are plain JSON (gzip-compressed when the file name ends in ``.gz``) so that a
program other than ours can schedule a snapshot or check a schedule. Integers are JSON numbers;
byte addresses are decimal.

**Snapshot** (``ipu-stack gemm ... --export-exchange-snapshot PATH`` writes one)::

    {
      "format": "ipu-stack-exchange-snapshot", "version": 1,
      "tile_count": 1472,
      "phases": [
        {"phase": 2,
         "transfers": [
           {"source": 17, "source_address": 362208,
            "destinations": [[18, 362208], [19, 362208]],
            "words": 384, "width": "word32"}
         ]}
      ]
    }

- ``tile_count``: tiles of the machine; tile ids are physical ids ``0..tile_count-1``.
- ``phase``: the phase's identifier (the build's step index; any non-negative integer, unique).
- ``transfers``: in program order (memory-order dependencies follow it).
- ``source``, ``destinations[k][0]``: physical tile ids; destinations distinct, none the source.
- ``source_address``, ``destinations[k][1]``: byte addresses in tile memory, word aligned.
- ``words``: 32-bit words moved, positive.
- ``width``: ``"word32"`` or ``"paired64"`` (even ``words``, 8-byte-aligned addresses,
  destinations in complete physical pairs ``d``/``d ^ 2``; see :mod:`ipu_stack.exchange.model`).
  Optional, default ``"word32"``.

**Schedule** (``ipu-stack exchange-bench ... --emit-schedule OUT`` writes one)::

    {
      "format": "ipu-stack-exchange-schedule", "version": 1,
      "model": {"latency": "time_to_mux", "paired": true, "dependencies": true,
                "sram_hazards": true, "full_duplex": true},
      "phases": [
        {"phase": 2, "horizon": 2740, "kind": "cp-sat-lns",
         "transfers": [
           {"pieces": [{"send_cycle": 0, "offset_words": 0, "words": 384}],
            "first_arrivals": [101, 99]}
         ]}
      ]
    }

- ``model``: the rules the schedule obeys (:class:`ipu_stack.exchange.model.ExchangeModel`).
- ``transfers``: one entry per snapshot transfer, in snapshot order.
- ``pieces``: contiguous runs of the transfer's words; word ``offset_words + j`` of a piece
  leaves the source in cycle ``send_cycle + j`` (``+ j // 2`` for ``paired64``).
- ``first_arrivals``: per destination (snapshot order), the cycle the transfer's word 0 reaches
  it: its piece's ``send_cycle`` plus the pair's latency.
- ``horizon``: the cycle by which every word has been sent and received.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ipu_stack.errors import PackageError, ScheduleError
from ipu_stack.exchange.model import (
    WIDTHS,
    WORD32,
    ExchangeModel,
    ExchangePhase,
    PhaseSchedule,
    Piece,
    Transfer,
)
from ipu_stack.json_fields import field, int_field, integer, list_field, model_from_json, str_field

SNAPSHOT_FORMAT = "ipu-stack-exchange-snapshot"
SCHEDULE_FORMAT = "ipu-stack-exchange-schedule"
VERSION = 1


def _read_text(path: str | Path) -> str:
    """A file's text; ``.gz`` files are decompressed."""
    data = Path(path).read_bytes()
    if str(path).endswith(".gz"):
        data = gzip.decompress(data)
    return data.decode("utf-8")


def _write_text(path: str | Path, text: str) -> None:
    from ipu_stack.outputs import atomic_write

    data = text.encode("utf-8")
    if str(path).endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    atomic_write(path, data)


def snapshot_document(
    phases: Iterable[tuple[int, ExchangePhase]], tile_count: int
) -> dict[str, Any]:
    """The snapshot of phases as a JSON-ready dict.

    Args:
        phases: ``(phase id, phase)`` pairs in order.
        tile_count: tiles of the machine.

    Returns:
        The document.
    """
    return {
        "format": SNAPSHOT_FORMAT,
        "version": VERSION,
        "tile_count": tile_count,
        "phases": [
            {
                "phase": phase_id,
                "transfers": [
                    {
                        "source": t.source,
                        "source_address": t.source_address,
                        "destinations": [[tile, address] for tile, address in t.destinations],
                        "words": t.words,
                        "width": t.width,
                    }
                    for t in phase.transfers
                ],
            }
            for phase_id, phase in phases
        ],
    }


def write_snapshot(
    path: str | Path, phases: Iterable[tuple[int, ExchangePhase]], tile_count: int
) -> None:
    """Write a snapshot file (see the module docstring)."""
    text = json.dumps(snapshot_document(phases, tile_count), separators=(",", ":"))
    _write_text(path, text + "\n")


def read_snapshot(path: str | Path) -> tuple[int, list[tuple[int, ExchangePhase]]]:
    """Read and validate a snapshot file.

    Args:
        path: the file.

    Returns:
        ``(tile_count, [(phase id, phase), ...])``.

    Raises:
        PackageError: naming the phase and transfer of the first problem (exit status 2).
    """
    try:
        document = json.loads(_read_text(path))
    except OSError as err:
        raise PackageError(f"cannot read snapshot {path}: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise PackageError(f"snapshot {path} is not JSON: {err}") from None
    return parse_snapshot(document)


def parse_snapshot(document: object) -> tuple[int, list[tuple[int, ExchangePhase]]]:
    """Validate a decoded snapshot document (see :func:`read_snapshot`)."""
    if not isinstance(document, dict):
        raise PackageError("snapshot: the top level must be an object")
    _format_and_version(document, SNAPSHOT_FORMAT, "snapshot")
    tile_count = int_field(document, "tile_count", "snapshot", 1, 1 << 20)
    phases_value = list_field(document, "phases", "snapshot", nonempty=True)
    phases: list[tuple[int, ExchangePhase]] = []
    seen: set[int] = set()
    for position, entry in enumerate(phases_value):
        where = f"phase entry {position}"
        if not isinstance(entry, dict):
            raise PackageError(f"{where}: must be an object")
        phase_id = _integer(entry, "phase", where)
        where = f"phase {phase_id}"
        if phase_id < 0 or phase_id in seen:
            raise PackageError(f"{where}: phase ids must be distinct and non-negative")
        seen.add(phase_id)
        transfers_value = _field(entry, "transfers", where)
        if not isinstance(transfers_value, list):
            raise PackageError(f"{where}: 'transfers' must be a list")
        transfers = tuple(
            _transfer(item, f"{where} transfer {index}")
            for index, item in enumerate(transfers_value)
        )
        phase = ExchangePhase(transfers, tile_count)
        try:
            phase.validate()
        except ScheduleError as err:
            raise PackageError(f"{where} {err}") from None
        phases.append((phase_id, phase))
    return tile_count, phases


def _format_and_version(document: dict[str, Any], fmt: str, what: str) -> None:
    """``format`` must be this format and ``version`` this reader's version (both required)."""
    if str_field(document, "format", what) != fmt:
        raise PackageError(f"{what}: format is {document['format']!r:.40}, expected {fmt!r}")
    version = int_field(document, "version", what)
    if version != VERSION:
        raise PackageError(
            f"{what}: version {version} is not supported (this reader reads {VERSION})"
        )


def _field(mapping: dict[str, Any], key: str, where: str) -> Any:
    if key not in mapping:
        raise PackageError(f"{where}: missing key {key!r}")
    return mapping[key]


#: Bound of every integer of a snapshot: far above any tile id, address or length, far below
#: where int64 arithmetic on them (a length in bytes, an end address) could overflow.
_INTEGER_LIMIT = 2**40


def _integer(mapping: dict[str, Any], key: str, where: str) -> int:
    value = _field(mapping, key, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PackageError(f"{where}: {key!r} must be an integer, got {value!r:.40}")
    if abs(value) > _INTEGER_LIMIT:
        raise PackageError(f"{where}: {key!r} is {value}, beyond the limit +-2^40")
    return value


def _transfer(item: object, where: str) -> Transfer:
    if not isinstance(item, dict):
        raise PackageError(f"{where}: must be an object")
    source = _integer(item, "source", where)
    source_address = _integer(item, "source_address", where)
    words = _integer(item, "words", where)
    width = item.get("width", WORD32)
    if width not in WIDTHS:
        raise PackageError(f"{where}: width {width!r} is not one of {', '.join(WIDTHS)}")
    destinations_value = _field(item, "destinations", where)
    if not isinstance(destinations_value, list):
        raise PackageError(f"{where}: 'destinations' must be a list of [tile, address]")
    destinations = []
    for pair in destinations_value:
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) for v in pair)
            or any(abs(v) > _INTEGER_LIMIT for v in pair)
        ):
            raise PackageError(f"{where}: destination {pair!r} is not [tile, address]")
        destinations.append((pair[0], pair[1]))
    return Transfer(source, source_address, tuple(destinations), words, width)


def schedule_document(
    schedules: Sequence[tuple[int, PhaseSchedule]], model: ExchangeModel
) -> dict[str, Any]:
    """Schedules of snapshot phases as a JSON-ready dict (see the module docstring)."""
    return {
        "format": SCHEDULE_FORMAT,
        "version": VERSION,
        "model": model.as_dict(),
        "phases": [
            {
                "phase": phase_id,
                "horizon": schedule.horizon,
                "kind": schedule.kind,
                "transfers": [
                    {
                        "pieces": [
                            {
                                "send_cycle": p.send_cycle,
                                "offset_words": p.offset_words,
                                "words": p.words,
                            }
                            for p in pieces
                        ],
                        "first_arrivals": list(arrivals),
                    }
                    for pieces, arrivals in zip(
                        schedule.pieces, schedule.first_arrivals or (), strict=True
                    )
                ],
            }
            for phase_id, schedule in schedules
        ],
    }


def write_schedule(
    path: str | Path, schedules: Sequence[tuple[int, PhaseSchedule]], model: ExchangeModel
) -> None:
    """Write a schedule file (see the module docstring)."""
    text = json.dumps(schedule_document(schedules, model), separators=(",", ":"))
    _write_text(path, text + "\n")


def read_schedule(path: str | Path) -> dict[int, PhaseSchedule]:
    """Read a schedule file into schedules by phase id (not verified here).

    Raises:
        PackageError: if the file is not a schedule document.
    """
    try:
        document = json.loads(_read_text(path))
    except OSError as err:
        raise PackageError(f"cannot read schedule {path}: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise PackageError(f"schedule {path} is not JSON: {err}") from None
    return parse_schedule(document, f"schedule {path}")


def parse_schedule(document: object, where: str = "schedule") -> dict[int, PhaseSchedule]:
    """Validate a decoded schedule document: every field typed, ranged and present.

    Raises:
        PackageError: naming the phase, transfer and field of the first problem.
    """
    if not isinstance(document, dict):
        raise PackageError(f"{where}: the top level must be an object")
    _format_and_version(document, SCHEDULE_FORMAT, where)
    model = model_from_json(field(document, "model", where), where)
    result: dict[int, PhaseSchedule] = {}
    for position, entry in enumerate(list_field(document, "phases", where, nonempty=True)):
        here = f"{where}: phase entry {position}"
        phase_id = int_field(entry, "phase", here)
        here = f"{where}: phase {phase_id}"
        if phase_id in result:
            raise PackageError(f"{here}: appears twice")
        horizon = int_field(entry, "horizon", here)
        kind = str_field(entry, "kind", here) if "kind" in entry else "external"
        pieces, arrivals = [], []
        for index, transfer in enumerate(list_field(entry, "transfers", here)):
            at = f"{here} transfer {index}"
            pieces.append(
                tuple(
                    Piece(
                        int_field(p, "send_cycle", f"{at} piece {j}"),
                        int_field(p, "offset_words", f"{at} piece {j}"),
                        int_field(p, "words", f"{at} piece {j}", 1),
                    )
                    for j, p in enumerate(list_field(transfer, "pieces", at, nonempty=True))
                )
            )
            arrivals.append(
                tuple(
                    integer(c, f"{at} first_arrivals[{k}]")
                    for k, c in enumerate(list_field(transfer, "first_arrivals", at))
                )
            )
        result[phase_id] = PhaseSchedule(tuple(pieces), horizon, kind, model, tuple(arrivals))
    return result

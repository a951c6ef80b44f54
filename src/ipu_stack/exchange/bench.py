"""Schedule and verify the phases of a snapshot file (the CLI's ``exchange-bench``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ipu_stack.errors import GraphError, PackageError, ScheduleError
from ipu_stack.exchange.model import ExchangeModel, ExchangePhase, PhaseSchedule
from ipu_stack.exchange.schedule_pieces import MAX_PIECES
from ipu_stack.exchange.scheduler import DEFAULT_TIME_BUDGET, optimize_phase
from ipu_stack.exchange.snapshot import read_schedule, read_snapshot, write_schedule
from ipu_stack.exchange.verify import verify_schedule

#: Keys of one phase's record, in print order.
FIELDS = (
    "phase",
    "transfers",
    "maximum_identical_destinations",
    "initial_horizon",
    "selected_horizon",
    "endpoint_lower_bound",
    "strongest_lower_bound",
    "tight_bound",
    "lower_bound_gap",
    "selected_kind",
    "neighborhood_improvements",
    "pieces",
    "seconds",
)


def bench_snapshot(
    path: str | Path,
    phase: int | None = None,
    time_budget: float = DEFAULT_TIME_BUDGET,
    emit_schedule: str | Path | None = None,
    model: ExchangeModel | None = None,
    max_pieces: int = MAX_PIECES,
) -> list[dict[str, Any]]:
    """Schedule every (or one) phase of a snapshot, verify each schedule, report.

    Args:
        path: the snapshot file.
        phase: only this phase id.
        time_budget: seconds per phase.
        emit_schedule: write the schedules here (schedule format).
        model: the rules (the IPU21's by default).
        max_pieces: most pieces per transfer (1: no preemption).

    Returns:
        One record per phase with the keys of :data:`FIELDS` (``seconds`` covers scheduling
        and verification) plus ``verify_seconds``.

    Raises:
        PackageError: the snapshot is malformed (names phase and transfer).
        GraphError: ``phase`` is not in the snapshot.
        ScheduleError: a schedule failed verification (a scheduler bug).
    """
    model = model or ExchangeModel()
    _, phases = read_snapshot(path)
    if phase is not None:
        phases = [(pid, p) for pid, p in phases if pid == phase]
        if not phases:
            raise GraphError(f"snapshot {path} has no phase {phase}")
    records = []
    schedules: list[tuple[int, PhaseSchedule]] = []
    for phase_id, exchange_phase in phases:
        started = time.perf_counter()
        report = optimize_phase(exchange_phase, model, time_budget, max_pieces=max_pieces)
        verify_started = time.perf_counter()
        try:
            verify_schedule(exchange_phase, report.schedule, model)
        except ScheduleError as err:
            raise ScheduleError(f"phase {phase_id}: schedule rejected: {err}") from None
        finished = time.perf_counter()
        record = {"phase": phase_id, **report.fields()}
        record["seconds"] = round(finished - started, 4)
        record["verify_seconds"] = round(finished - verify_started, 4)
        records.append(record)
        schedules.append((phase_id, report.schedule))
    if emit_schedule is not None:
        write_schedule(emit_schedule, schedules, model)
    return records


def verify_schedule_file(snapshot: str | Path, schedule: str | Path) -> list[int]:
    """Verify a schedule file against a snapshot (the CLI's ``exchange-verify``).

    Returns:
        The phase ids verified.

    Raises:
        PackageError: a file is malformed.
        ScheduleError: a schedule breaks a rule (names phase, transfer, tile and cycle).
    """
    _, phases = read_snapshot(snapshot)
    schedules = read_schedule(schedule)
    checked = []
    for phase_id, exchange_phase in phases:
        if phase_id not in schedules:
            raise PackageError(f"phase {phase_id}: no schedule in {schedule}")
        _check_shape(exchange_phase, schedules[phase_id], f"{schedule}: phase {phase_id}")
        try:
            verify_schedule(exchange_phase, schedules[phase_id])
        except ScheduleError as err:
            raise ScheduleError(f"phase {phase_id}: {err}") from None
        checked.append(phase_id)
    return checked


def _check_shape(phase: ExchangePhase, schedule: PhaseSchedule, where: str) -> None:
    """A schedule's structure matches its snapshot phase (a file problem, exit status 2)."""
    if len(schedule.pieces) != len(phase.transfers):
        raise PackageError(
            f"{where}: {len(schedule.pieces)} transfer entries for the snapshot's "
            f"{len(phase.transfers)} transfers"
        )
    arrivals = schedule.first_arrivals or ()
    for index, (transfer, cycles) in enumerate(zip(phase.transfers, arrivals, strict=True)):
        if len(cycles) != len(transfer.destinations):
            raise PackageError(
                f"{where} transfer {index}: {len(cycles)} first_arrivals for "
                f"{len(transfer.destinations)} destinations"
            )


def format_record(record: dict[str, Any]) -> str:
    """One phase's record as ``key=value`` fields in :data:`FIELDS` order."""
    parts = []
    for key in FIELDS:
        value = record[key]
        parts.append(f'{key}="{value}"' if isinstance(value, str) else f"{key}={value}")
    return " ".join(parts)

"""Finalists lowered, placed and compared on quick exchange schedules, side by side.

The finalists of a build plan most operations alike, so their programs share most exchange
phases: on the 224 px SigLIP vision model the second finalist's 45 phases compile to 44
problems the first one already has. Each finalist is lowered and placed in its own process
(forked: the graph and finalists are inherited), and each process reports the content digest
of every phase (``exchange.memo.phase_key``, addresses included); a phase whose content one of
finalist 0's has is that phase's problem, and the worker compiles only its other phases for
their memo keys (:func:`~ipu_stack.package.schedule_program.phase_problem_key`; on the 224 px
SigLIP 23 of 68). Each distinct
problem is then scheduled once, by the first finalist (in index order) that has it: the build
process schedules finalist 0's (sharing them with forked workers, ``schedule_program``) while
each worker schedules the problems only it has. Schedules are deterministic, so a problem's
horizon is the same in whichever process it was made, and every finalist's refined cycles
are those a separate evaluation would give. Only keys and horizons travel between processes.

Without fork (or with one finalist), the finalists are evaluated in turn in this process,
sharing one memo: the same numbers. A lone finalist's phases are scheduled by forked workers
(``schedule_program(parallel=True)``), as the selected finalist's final schedules are.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from ipu_stack.errors import PlanError
from ipu_stack.exchange.memo import ScheduleMemo, phase_key
from ipu_stack.exchange.model import IPU21_MODEL, ExchangePhase, PhaseSchedule
from ipu_stack.graph.compute_graph import ComputeGraph
from ipu_stack.low.costs import busiest_tile_cycles
from ipu_stack.low.lower import lower_program
from ipu_stack.low.program import ComputeStep, ExchangeStep, LowProgram, step_runs
from ipu_stack.mid.gemm_plan import GemmPlan
from ipu_stack.mid.lower_mid import Finalist
from ipu_stack.package.schedule_program import (
    phase_problem_key,
    preload_solver,
    program_phases,
    schedule_program,
)
from ipu_stack.place.assign import Placement, place_program
from ipu_stack.place.balance import check_resident, tile_offsets
from ipu_stack.place.mapping import screen_mappings
from ipu_stack.target.ipu21 import SYNC_CYCLES
from ipu_stack.trace import Trace

#: per finalist: refined cycles (None if it could not be placed), its trace events, its error
Outcome = tuple[int | None, list[dict[str, object]], PlanError | None]


@dataclass(slots=True)
class Placed:
    """A finalist lowered, mapped and placed (not yet scheduled)."""

    finalist: Finalist
    program: LowProgram
    placement: Placement
    plans: dict[int, GemmPlan]
    #: False when the loops' padded operand blocks are zeroed in every iteration (the
    #: finalist did not fit with them zeroed once, before the loop)
    padding_hoisted: bool = True


@dataclass(slots=True)
class Evaluated:
    """A finalist lowered, mapped, placed and physically scheduled."""

    finalist: Finalist
    program: LowProgram
    placement: Placement
    schedules: dict[int, tuple[ExchangePhase, PhaseSchedule]]
    plans: dict[int, GemmPlan]
    refined_cycles: int
    padding_hoisted: bool = True
    #: whether ``schedules`` are the final ones (quick ones rescheduled where it pays, every
    #: one verified), not only the quick schedules finalists are compared on
    full_schedules: bool = False


def place_finalist(graph: ComputeGraph, finalist: Finalist, tiles: int, trace: Trace) -> Placed:
    """Lower, map and place one finalist.

    Raises:
        PlanError: the finalist's weights or buffers do not fit a tile.
    """
    plans = {op.id: finalist.gemm_plans[op.name] for op in graph.operations if op.kind == "gemm"}
    # Weight-carrying gemms spread over the tiles; a tile that cannot hold what the host
    # writes before the run rejects the finalist here, before placement.
    bodies = finalist.bodies
    offsets, _ = tile_offsets(graph, finalist.gemm_plans, tiles, bodies)
    program = lower_program(graph, plans, tiles, finalist.row_tiles, offsets, bodies)
    balance = check_resident(program, finalist.index)
    trace.event("balanced resident weights", finalist=finalist.index, **balance)
    mapping = screen_mappings(program)
    trace.event(
        "screened tile mappings by exchange resource load",
        candidates=mapping.candidates,
        baseline_cycles=mapping.baseline_cycles,
        candidate_cycles=mapping.candidate_cycles,
        baseline_pressure=mapping.baseline_pressure,
        candidate_pressure=mapping.candidate_pressure,
    )
    trace.event(
        "modelled expanded operator plan",
        finalist=finalist.index,
        modelled_cycles=program.estimated_cycles,
        estimated_cycles=finalist.branch.cycles,
        estimated_exchange_cycles=finalist.branch.exchange_cycles,
    )
    hoisted = True
    try:
        placement = place_program(program, mapping.physical)
    except PlanError:
        if not any(op.kind == "repeat" for op in graph.operations):
            raise
        # A loop's padding zeroed once keeps those operand buffers for the whole loop: lower
        # and place again with the zeroing in every iteration before a tighter plan is tried.
        program = lower_program(graph, plans, tiles, finalist.row_tiles, offsets, bodies, False)
        mapping = screen_mappings(program)
        placement = place_program(program, mapping.physical)
        trace.event("placed with loop padding zeroed every iteration", finalist=finalist.index)
        hoisted = False
    placement.mapped = mapping.mapped
    return Placed(finalist, program, placement, plans, hoisted)


def refined_cycles(finalist: Finalist, scheduled: int, trace: Trace, mapped: bool) -> int:
    """The finalist's analytical cycles with its modelled exchange replaced by ``scheduled``."""
    analytical, analytical_exchange = finalist.branch.cycles, finalist.branch.exchange_cycles
    refined = analytical - analytical_exchange + scheduled
    trace.event(
        "scheduled operator-plan finalist",
        finalist=finalist.index,
        mapped=mapped,
        analytical_cycles=analytical,
        analytical_exchange_cycles=analytical_exchange,
        scheduled_exchange_cycles=scheduled,
        refined_cycles=refined,
    )
    return refined


def predicted_cycles(evaluated: Evaluated) -> int:
    """The cycles the simulator's clock will charge the evaluated program: each compute
    step's busiest tile (the target formulas, as the simulator charges them) and each
    exchange step's scheduled horizon plus sync, times the iterations the step runs. Unlike
    the refined cycles, this counts what lowering added (copies, zero fills, a loop's
    padding zeroed in every iteration) and a loop body's phases once per iteration."""
    steps = evaluated.program.steps
    total = 0
    for index, (runs, step) in enumerate(zip(step_runs(steps), steps, strict=True)):
        if isinstance(step, ComputeStep):
            total += runs * busiest_tile_cycles(step.calls)
        elif isinstance(step, ExchangeStep):
            total += runs * (SYNC_CYCLES + evaluated.schedules[index][1].horizon)
    return total


def evaluate(
    graph: ComputeGraph,
    finalist: Finalist,
    tiles: int,
    trace: Trace,
    budget: float,
    memo: ScheduleMemo | None = None,
    parallel: bool = False,
) -> Evaluated:
    """Lower, map, place and schedule one finalist; refined cycles use its schedules."""
    placed = place_finalist(graph, finalist, tiles, trace)
    schedules = schedule_program(
        placed.program, placed.placement, budget, None, False, memo, parallel
    )
    scheduled = sum(SYNC_CYCLES + s.horizon for _, s in schedules.values())
    refined = refined_cycles(finalist, scheduled, trace, placed.placement.mapped)
    return Evaluated(
        finalist, placed.program, placed.placement, schedules, placed.plans, refined,
        placed.padding_hoisted,
    )  # fmt: skip


def evaluate_finalists(
    graph: ComputeGraph,
    finalists: list[Finalist],
    tiles: int,
    budget: float,
    memo: ScheduleMemo,
) -> tuple[list[Outcome], Evaluated | None]:
    """Every finalist's outcome (in finalist order) and the evaluation of finalist 0, kept
    in this process (None if it could not be placed); ``memo`` gains finalist 0's reports."""
    if len(finalists) < 2 or "fork" not in mp.get_all_start_methods():
        # a lone finalist's phases go to forked workers as the final schedules' do (the same
        # schedules: they are deterministic; the workers' reports join ``memo``)
        return _in_turn(graph, finalists, tiles, budget, memo, parallel=len(finalists) == 1)
    preload_solver()  # imported once, before forking
    context = mp.get_context("fork")
    workers: list[tuple[Any, Connection]] = []
    reported = False
    try:
        for finalist in finalists[1:]:
            mine, theirs = context.Pipe()
            process = context.Process(
                target=_worker, args=(theirs, graph, finalist, tiles, budget), daemon=True
            )
            process.start()
            theirs.close()
            workers.append((process, mine))
        outcome = _side_by_side(graph, finalists, tiles, budget, memo, [c for _, c in workers])
        reported = True
        return outcome
    finally:
        for process, connection in workers:
            connection.close()
            if reported:  # each worker has sent its last report and is exiting: not waited for
                continue  # (multiprocessing reaps it at the next process start, or at exit)
            process.join(timeout=5)
            if process.is_alive():  # pragma: no cover - only after an error elsewhere
                process.kill()


def _in_turn(
    graph: ComputeGraph,
    finalists: list[Finalist],
    tiles: int,
    budget: float,
    memo: ScheduleMemo,
    parallel: bool = False,
) -> tuple[list[Outcome], Evaluated | None]:
    outcomes: list[Outcome] = []
    kept: Evaluated | None = None
    for i, finalist in enumerate(finalists):
        trace = Trace(quiet=True)
        try:
            evaluated = evaluate(graph, finalist, tiles, trace, budget, memo, parallel)
        except PlanError as err:
            outcomes.append((None, trace.events, err))
            continue
        kept = evaluated if i == 0 else kept
        outcomes.append((evaluated.refined_cycles, trace.events, None))
    return outcomes, kept


def _side_by_side(
    graph: ComputeGraph,
    finalists: list[Finalist],
    tiles: int,
    budget: float,
    memo: ScheduleMemo,
    connections: list[Connection],
) -> tuple[list[Outcome], Evaluated | None]:
    trace = Trace(quiet=True)
    placed: Placed | None = None
    error: PlanError | None = None
    phases: dict[int, ExchangePhase] = {}
    try:
        placed = place_finalist(graph, finalists[0], tiles, trace)
        phases = program_phases(placed.program, placed.placement)
    except PlanError as err:
        error = err
    # Each distinct problem is scheduled by the first placed finalist that has it.
    first_keys = {i: phase_problem_key(p, budget, memo) for i, p in phases.items()}
    owned = set(first_keys.values())
    # A worker's phase with the same content as one of finalist 0's (addresses included) is
    # the same problem: only its other phases are compiled for their keys.
    by_content = {phase_key(p, IPU21_MODEL): first_keys[i] for i, p in phases.items()}
    # The workers' reports are taken (and answered) by a thread while this process schedules
    # finalist 0's phases; the answers depend only on the reports, taken in finalist order.
    reports: list[list[Any]] = []
    failed: list[BaseException] = []

    def assign() -> None:
        try:
            reports.extend(list(_receive(c)) for c in connections)
            for connection, report in zip(connections, reports, strict=True):
                if report[0] == "placed":
                    contents: dict[int, bytes] = report[1]
                    connection.send(sorted(i for i, c in contents.items() if c not in by_content))
            for connection, report in zip(connections, reports, strict=True):
                if report[0] == "placed":
                    compiled: dict[int, bytes] = _receive(connection)[1]
                    keys = {i: compiled[i] if i in compiled else by_content[c]
                            for i, c in report[1].items()}  # fmt: skip
                    report[1] = keys  # the worker's problem keys, for its refined cycles
                    connection.send(sorted(i for i, k in keys.items() if k not in owned))
                    owned.update(keys.values())
        except BaseException as err:  # raised in the build process after the join
            failed.append(err)

    assigning = threading.Thread(target=assign, name="finalist-reports", daemon=True)
    assigning.start()
    kept: Evaluated | None = None
    outcomes: list[Outcome] = []
    horizons: dict[bytes, int] = {}
    if placed is not None:
        schedules = schedule_program(
            placed.program, placed.placement, budget, None, False, memo, True, phases=phases
        )
        for index, (_, schedule) in schedules.items():
            horizons[first_keys[index]] = schedule.horizon
        scheduled = sum(SYNC_CYCLES + s.horizon for _, s in schedules.values())
        refined = refined_cycles(finalists[0], scheduled, trace, placed.placement.mapped)
        kept = Evaluated(
            finalists[0], placed.program, placed.placement, schedules, placed.plans, refined,
            placed.padding_hoisted,
        )  # fmt: skip
        outcomes.append((refined, trace.events, None))
    else:
        outcomes.append((None, trace.events, error))
    assigning.join()
    if failed:
        raise failed[0]
    for connection, report in zip(connections, reports, strict=True):
        if report[0] == "placed":
            horizons.update(_receive(connection)[1])
    for finalist, report in zip(finalists[1:], reports, strict=True):
        events = report[-1]
        if report[0] != "placed":
            outcomes.append((None, events, report[1]))
            continue
        keys, mapped = report[1], report[2]
        scheduled = sum(SYNC_CYCLES + horizons[k] for k in keys.values())
        own = Trace(quiet=True)
        refined = refined_cycles(finalist, scheduled, own, mapped)
        outcomes.append((refined, events + own.events, None))
    return outcomes, kept


def _receive(connection: Connection) -> tuple[Any, ...]:
    """A worker's next message; a worker's failure (other than a placement error) is raised."""
    try:
        message: tuple[Any, ...] = connection.recv()
    except EOFError:
        raise RuntimeError("a finalist worker process ended without reporting") from None
    if message[0] == "crashed":
        raise RuntimeError(f"a finalist worker process failed:\n{message[1]}")
    return message


def _worker(
    connection: Connection, graph: ComputeGraph, finalist: Finalist, tiles: int, budget: float
) -> None:
    """In a forked process: place ``finalist``, report its phases' keys, then schedule the
    phases it is sent and report their horizons by key."""
    trace = Trace(quiet=True)
    try:
        try:
            placed = place_finalist(graph, finalist, tiles, trace)
        except PlanError as err:
            connection.send(("failed", err, trace.events))
            return
        phases = program_phases(placed.program, placed.placement)
        contents = {i: phase_key(p, IPU21_MODEL) for i, p in phases.items()}
        connection.send(("placed", contents, placed.placement.mapped, trace.events))
        unknown: list[int] = connection.recv()  # phases the build process cannot key
        memo = ScheduleMemo()
        keys = {i: phase_problem_key(phases[i], budget, memo) for i in unknown}
        connection.send(("keyed", keys))
        wanted: list[int] = connection.recv()
        memo.drop_problems_except(phases[i] for i in wanted)
        part = {i: phases[i] for i in wanted}
        schedules = schedule_program(
            placed.program, placed.placement, budget, None, False, memo, False, phases=part
        )
        connection.send(("scheduled", {keys[i]: s.horizon for i, (_, s) in schedules.items()}))
    except EOFError:  # the build process stopped listening
        return
    except BaseException:
        connection.send(("crashed", traceback.format_exc()))
    finally:
        connection.close()

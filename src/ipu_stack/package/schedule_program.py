"""Every exchange phase of a placed program, scheduled and verified, in parallel processes.

The phases of a program are independent problems once the program is placed, and
``optimize_phase`` is deterministic on deterministic budgets: a phase gets the same schedule
in whichever process schedules it, so the phases are handed out as tasks to forked
workers (where fork is available; heaviest group first, taken by whichever worker is free)
without changing a byte of the result. Phases that look
alike (same transfer and word counts: the Q/K/V projections, a GEMM's row blocks, a rolled
loop's iterations) go to the same process, so its memo (``exchange/memo.py``) still
schedules each distinct problem once.

With a :class:`Refine` rule, a program already scheduled at a quick budget is rescheduled at the
full budget only where that can pay: a phase keeps its quick schedule unless its gap to the
strongest lower bound, times the number of alike phases, is at least the rule's ``min_gain``
cycles (the gap bounds what any search can still gain; README "Finalist selection" has the
measurement behind it).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from operator import attrgetter

from ipu_stack.exchange.constraints import compile_phase
from ipu_stack.exchange.memo import ScheduleMemo, options_key, phase_key, problem_digest
from ipu_stack.exchange.model import (
    IPU21_MODEL,
    ExchangeModel,
    ExchangePhase,
    PhaseSchedule,
    maximum_identical_destinations,
)
from ipu_stack.exchange.schedule_pieces import MAX_PIECES
from ipu_stack.exchange.scheduler import PhaseReport, exchange_row_words, optimize_phase
from ipu_stack.exchange.verify import verify_schedule
from ipu_stack.low.program import ExchangeStep, LowProgram
from ipu_stack.place.assign import Placement, physical_phase
from ipu_stack.trace import Trace

LARGE_PHASE_TRANSFERS = 1000
EXCHANGE_TARGET_GAP = 0.01  # stop improving an exchange schedule within 1% of its bound
#: Below this many transfers in all, a program is scheduled in this process alone (a worker's
#: start costs more than it saves).
PARALLEL_TRANSFERS = 20_000
MAX_SCHEDULE_WORKERS = 4


@dataclass(frozen=True, slots=True)
class Refine:
    """Reschedule a quickly scheduled program only where the gain could be worth it.

    Attributes:
        quick_budget: the budget the program was scheduled at (its reports are in the memo).
        min_gain: cycles; a phase is rescheduled at the full budget only when its quick gap to
            the strongest lower bound times the number of alike phases reaches this.
    """

    quick_budget: float
    min_gain: int


@dataclass(frozen=True, slots=True)
class _Job:
    phases: dict[int, ExchangePhase]
    time_budget: float
    verify: bool
    logged: bool
    refine: Refine | None = None
    alike: dict[int, int] = field(default_factory=dict)  # phase index -> alike phases


_JOB: tuple[_Job, ScheduleMemo, list[list[int]]] | None = None  # what forked workers read
#: per phase: its schedule, its log fields (large phases) and whether the full budget ran
_Result = dict[int, tuple[PhaseSchedule, dict[str, object] | None, bool]]


def schedule_program(
    program: LowProgram,
    placement: Placement,
    time_budget: float,
    trace: Trace | None,
    verify: bool = True,
    memo: ScheduleMemo | None = None,
    parallel: bool = True,
    refine: Refine | None = None,
    phases: dict[int, ExchangePhase] | None = None,
) -> dict[int, tuple[ExchangePhase, PhaseSchedule]]:
    """Schedule (and with ``verify``, verify) every exchange step of a placed program; large
    phases are logged to ``trace`` in program order.

    Phases that compile to a problem ``memo`` has seen reuse its report; a phase and schedule
    the verifier has accepted before are not verified again. With ``parallel``, large programs
    share their phases with forked workers (the same schedules; workers' memo entries stay in
    the workers). With ``refine`` (and ``time_budget`` above its quick budget), a phase keeps
    its quick schedule unless the gap it leaves could be worth the full budget; the trace then
    says how many phases were rescheduled. ``phases`` are the program's physical phases if
    the caller has made them already (:func:`program_phases`). Reports made in workers are
    added to ``memo`` too.
    """
    memo = memo if memo is not None else ScheduleMemo()
    phases = phases if phases is not None else program_phases(program, placement)
    groups = _groups(phases)
    if refine is not None and time_budget <= refine.quick_budget:
        refine = None  # a budget no larger than the quick one: every phase at that budget
    alike = {index: len(group) for group in groups for index in group}
    job = _Job(phases, time_budget, verify, trace is not None, refine, alike)
    results = _run(job, memo, groups, _processes(phases, len(groups)) if parallel else 0)
    memo.drop_problems_except()  # those kept for these phases were taken here or in workers
    for phase in phases.values():  # validated here or in a worker (else it raised)
        memo.valid[id(phase)] = phase
    schedules: dict[int, tuple[ExchangePhase, PhaseSchedule]] = {}
    if refine is not None and trace is not None:
        rescheduled = [i for i, r in results.items() if r[2]]
        trace.event(
            "refined exchange schedules",
            phases=len(phases),
            rescheduled=len(rescheduled),
            kept_quick=len(phases) - len(rescheduled),
            min_gain_cycles=refine.min_gain,
            quick_budget=refine.quick_budget,
            full_budget=time_budget,
        )
    for index, phase in phases.items():
        schedule, fields, _ = results[index]
        if fields is not None and trace is not None:
            trace.event(
                "prepared large physical exchange phase",
                phase=index,
                transfers=len(phase.transfers),
                maximum_identical_destinations=maximum_identical_destinations(phase),
            )
            trace.event("optimized physical exchange schedule", phase=index, **fields)
            tile, row_words = exchange_row_words(phase, schedule)
            trace.event(
                "finished large physical exchange phase",
                phase=index,
                tile=tile,
                row_words=row_words,
                horizon=schedule.horizon,
            )
        schedules[index] = (phase, schedule)
    return schedules


def program_phases(program: LowProgram, placement: Placement) -> dict[int, ExchangePhase]:
    """The physical exchange phase of every exchange step, by step index."""
    return {
        index: physical_phase(step, placement)
        for index, step in enumerate(program.steps)
        if isinstance(step, ExchangeStep)
    }


def phase_problem_key(
    phase: ExchangePhase, budget: float, memo: ScheduleMemo | None = None
) -> bytes:
    """The memo key :func:`schedule_program` files a phase's report under at ``budget``: equal
    keys, equal schedules (in any process). With ``memo``, the phase's problem digest is
    remembered and its compiled problem kept there, so scheduling it does not compile it
    again (and an alike phase is found without compiling it)."""
    problem = compile_phase(phase, IPU21_MODEL)
    digest = problem_digest(problem, IPU21_MODEL)
    if memo is not None:
        memo.remember_digest(phase, IPU21_MODEL, digest)
        memo.keep_problem(phase, IPU21_MODEL, problem)
    return options_key(digest, (budget, EXCHANGE_TARGET_GAP, False, MAX_PIECES))


def _processes(phases: dict[int, ExchangePhase], groups: int) -> int:
    """Worker processes for a program's phases: one per core (at most
    :data:`MAX_SCHEDULE_WORKERS`, at most one per group), or 0 (this process alone) for a
    small program or without fork."""
    if "fork" not in mp.get_all_start_methods() or groups < 2:
        return 0
    if sum(len(p.transfers) for p in phases.values()) < PARALLEL_TRANSFERS:
        return 0
    return max(0, min(os.cpu_count() or 1, MAX_SCHEDULE_WORKERS, groups))


def _groups(phases: dict[int, ExchangePhase]) -> list[list[int]]:
    """Phase indices in groups of alike phases (same transfer and word counts), the heaviest
    group first: most resource uses (transfers plus destinations: a multicast's receivers
    cost the schedulers as much as its send) in its first phase, then most transfers."""
    groups: dict[tuple[int, int], list[int]] = {}
    uses: dict[tuple[int, int], int] = {}
    for index, phase in phases.items():
        words = sum(t.words for t in phase.transfers)
        key = (len(phase.transfers), words)
        if key not in groups:
            uses[key] = key[0] + sum(map(len, map(attrgetter("destinations"), phase.transfers)))
        groups.setdefault(key, []).append(index)
    ordered = sorted(groups.items(), key=lambda g: (-uses[g[0]], -g[0][0], g[0][1], g[1][0]))
    return [members for _, members in ordered]


def _run(job: _Job, memo: ScheduleMemo, groups: list[list[int]], processes: int) -> _Result:
    """Every group's schedules: here, or as tasks of a pool of ``processes`` forked workers
    taking the groups heaviest first (each group in one worker: its memo sees them all)."""
    global _JOB
    if processes < 2:
        return _schedule_part(job, memo, sorted(i for g in groups for i in g))
    _JOB = (job, memo, groups)
    preload_solver()
    results: _Result = {}
    pool = ProcessPoolExecutor(processes, mp_context=mp.get_context("fork"))
    done = False
    try:
        futures = [pool.submit(_child, k) for k in range(len(groups))]
        for future in futures:
            part, reports, verified, keys = future.result()
            results.update(part)
            memo.reports.update(reports)  # later programs of this build reuse them
            memo.verified.update(verified)
            for index, model, digest in keys:
                memo.remember_digest(job.phases[index], model, digest)
        done = True
    finally:
        _JOB = None
        # Every result is in: the workers' exit (freeing their copies of a large heap) is
        # not waited for; the executor joins them in the background.
        pool.shutdown(wait=not done, cancel_futures=not done)
    return results


def preload_solver() -> None:
    """Import CP-SAT (and the pandas it imports) before forking: each worker would otherwise
    import it again on its first improvement stage (1-2 s each)."""
    with contextlib.suppress(ImportError):  # ortools is a dependency
        import ortools.sat.python.cp_model  # noqa: F401


#: per phase of a group: (its index, the model it was compiled under, its problem digest)
_Keys = list[tuple[int, ExchangeModel, bytes]]


def _child(k: int) -> tuple[_Result, dict[bytes, PhaseReport], set[bytes], _Keys]:
    """One group's schedules, with the reports and verifications this worker added and the
    problem keys of the group's phases (the build process then finds their reports without
    compiling them again: the phase objects are the ones it forked with)."""
    assert _JOB is not None
    job, memo, parts = _JOB
    known, verified = set(memo.reports), set(memo.verified)
    out = _schedule_part(job, memo, parts[k])
    added = {key: r for key, r in memo.reports.items() if key not in known}
    mine = {id(job.phases[i]): i for i in parts[k]}
    keys = [
        (mine[pid], model, digest)
        for (pid, model), (phase, digest) in memo.keys.items()
        if pid in mine and phase is job.phases[mine[pid]]
    ]
    return out, added, memo.verified - verified, keys


def _schedule_part(job: _Job, memo: ScheduleMemo, indices: list[int]) -> _Result:
    out: _Result = {}
    for index in indices:
        phase = job.phases[index]
        budget = job.time_budget
        full = True
        if job.refine is not None:
            report = _optimize(phase, job.refine.quick_budget, memo)
            full = report.lower_bound_gap * job.alike.get(index, 1) >= job.refine.min_gain
            if not full:
                budget = job.refine.quick_budget
        if full:
            report = _optimize(phase, budget, memo)
        schedule = report.schedule
        if job.verify:
            # The same phase under the same options has the same schedule: verified once.
            content = phase_key(phase, IPU21_MODEL, budget, EXCHANGE_TARGET_GAP)
            if content not in memo.verified:
                verify_schedule(phase, schedule)  # independent of the scheduler
                memo.verified.add(content)
        large = job.logged and len(phase.transfers) > LARGE_PHASE_TRANSFERS
        out[index] = (schedule, report.log_fields() if large else None, full)
    return out


def _optimize(phase: ExchangePhase, budget: float, memo: ScheduleMemo) -> PhaseReport:
    # Greedy, then CP-SAT LNS until within EXCHANGE_TARGET_GAP of the strongest bound.
    # Deterministic budgets only: the same build gives the same bytes on any machine, and
    # a phase that compiles to a problem scheduled before gets the same report (the memo).
    return optimize_phase(
        phase,
        IPU21_MODEL,
        time_budget=budget,
        target_gap=EXCHANGE_TARGET_GAP,
        wall_clock_guards=False,
        memo=memo,
    )

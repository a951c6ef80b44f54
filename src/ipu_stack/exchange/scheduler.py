"""The exchange scheduler: constructive schedulers, then an improvement stage under a budget.

``optimize_phase`` runs, on the compiled phase (:mod:`ipu_stack.exchange.constraints`):

1. the lower bounds (:mod:`ipu_stack.exchange.bounds`), so every stage can stop once a schedule
   meets the strongest one (it is then optimal);
2. constructive schedulers, one piece per transfer, keeping the best (``initial_horizon``):
   for unicast-heavy phases the earliest-fit list scheduler in priority order and in whole-phase
   matching waves (:mod:`ipu_stack.exchange.schedule_greedy`); for multicast-heavy phases the
   list scheduler with every multicast clique in a short latency-aware order
   (:mod:`ipu_stack.exchange.schedule_cliques`), the event-driven dense greedy, and always
   (unless one of those meets the bound) the plain list scheduler;
3. with ``max_pieces > 1``, when the one-piece schedules leave a gap, the preemptive list
   scheduler (:mod:`ipu_stack.exchange.schedule_pieces`; in multicast-heavy phases it takes
   the dense greedy's place) in difficulty order, in priority order and, for multicast phases
   whose senders also receive, in sending-group colour order
   (:mod:`ipu_stack.exchange.schedule_colours`), as far as the budget goes;
4. CP-SAT large-neighbourhood search (:mod:`ipu_stack.exchange.schedule_lns`) on the best
   one-piece schedule with what remains of the time budget, while it is above the bound. When
   it proves a connected component optimal above the analytical bounds, that optimum is
   reported as the bound ``component-optimum`` (a proof by exhaustive search, as sound as the
   formulas, for one-piece schedules).

The selected schedule is the one that ends first (one piece per transfer on a tie). Its
``strongest_lower_bound`` is the strongest bound that holds for its class: every bound for a
one-piece schedule, :data:`~ipu_stack.exchange.bounds.PREEMPTIVE_BOUND_NAMES` for a preemptive
one (a non-preemptive proof such as a clique order or a CP-SAT optimum says nothing about
schedules whose pieces interleave). ``bounds`` lists every bound computed.

It reports the selected schedule and the seed's fields (``selected_kind``,
``neighborhood_improvements``, ...). Optional stages are budgeted from the phase's size and from
CP-SAT deterministic time, never from the clock, so the same phase, model and budget give the
same schedule; wall-clock guards keep the call within the budget, and only when one fires (on
a machine much slower than the calibration) can the result differ. The mandatory part
(validation, compilation, the bounds and the list schedule in priority order, unless an earlier
constructive schedule already meets the bound) runs whatever the budget.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import cache
from itertools import pairwise, repeat

import numpy as np
import numpy.typing as npt

from ipu_stack.errors import ScheduleError
from ipu_stack.exchange.bounds import (
    ENDPOINT,
    PREEMPTIVE_BOUND_NAMES,
    lower_bounds,
    strongest,
)
from ipu_stack.exchange.constraints import ResourceProblem, compile_phase
from ipu_stack.exchange.memo import ScheduleMemo, options_key, problem_digest
from ipu_stack.exchange.model import (
    IPU21_MODEL,
    ExchangeModel,
    ExchangePhase,
    PhaseSchedule,
    Piece,
    maximum_identical_destinations,
    phase_arrays,
)
from ipu_stack.exchange.schedule_cliques import clique_order
from ipu_stack.exchange.schedule_colours import group_colour_order
from ipu_stack.exchange.schedule_greedy import (
    dense_greedy,
    earliest_fit,
    horizon_of,
    priority_order,
    wave_order,
)
from ipu_stack.exchange.schedule_pieces import (
    MAX_PIECES,
    difficulty_order,
    pieces_horizon,
    preemptive_fit,
    schedule_from_pieces,
)
from ipu_stack.target.ipu21 import RECEIVE_ROW_WORDS_PER_PIECE, SEND_ROW_WORDS_PER_PIECE

IntArray = npt.NDArray[np.int64]
#: Default seconds for the whole of one phase's scheduling (bounds, greedies, improvement).
DEFAULT_TIME_BUDGET = 1.5
#: Share of the budget an optional constructive scheduler's estimated cost may take.
OPTIONAL_SHARE = 0.4
#: Measured costs per resource use on a 2-core machine, for budgeting (estimates, not limits).
#: Matching waves plus their list schedule: 0.7-3.5 us per use without memory-order
#: dependencies, 7.6-18.5 us with them (every unicast-heavy phase of benchmarks/exchange.py and
#: of the SigLIP MLP's build, 2-core machine at load 3; the 15 us used before covered both and
#: kept the waves from the MLP's 34,866-transfer reduce-scatter, 9,425 -> 8,454 cycles).
WAVES_SECONDS_PER_USE = 4e-6
WAVES_SECONDS_PER_USE_DEPENDENT = 20e-6
#: The dense greedy's measured seconds per work unit (1.1-4.5 us on a 2-core machine) and
#: the share of the budget it may plan for.
DENSE_SECONDS_PER_WORK = 2.0e-6
DENSE_SHARE = 0.5
#: The preemptive list scheduler's measured seconds per resource use (1.5-14 us on an idle
#: 2-core machine over the benchmark set) and the share of the budget it may plan for.
PIECES_SECONDS_PER_USE = 14e-6
PIECES_SHARE = 0.6
#: Wall-clock guard for the optional constructive stage, as a share of the budget.
GUARD_SHARE = 0.75
#: Work units per budget second the clique bound may spend on exact orders of big cliques
#: (Held-Karp, about 10 ns per unit on a 2-core machine: a quarter of the budget).
CLIQUE_EXACT_WORK_PER_SECOND = 27_000_000
#: Share of the budget the improvement stage plans for (in CP-SAT deterministic time).
IMPROVEMENT_SHARE = 0.5
DENSE_GREEDY = "dense-greedy"
#: Bound name for a component that CP-SAT solved whole to proven optimality.
COMPONENT_OPTIMUM = "component-optimum"
EARLIEST_FIT = "earliest-fit"
WAVES = "matching-waves"
CLIQUE_PATHS = "clique-paths"
MULTICAST_FIRST = "multicast-first"
PREEMPTIVE_FIT = "preemptive-fit"
GROUP_COLOURS = "group-colours"


@dataclass(slots=True)
class PhaseReport:
    """What scheduling one phase produced, with the fields the bench and the build log print."""

    schedule: PhaseSchedule
    transfers: int
    maximum_identical_destinations: int
    initial_horizon: int
    selected_horizon: int
    endpoint_lower_bound: int
    strongest_lower_bound: int
    tight_bound: str
    lower_bound_gap: int
    selected_kind: str
    neighborhood_improvements: int
    seconds: float
    bounds: dict[str, int] = field(default_factory=dict)

    @property
    def pieces(self) -> int:
        """Pieces in the selected schedule (``transfers`` when none is preempted)."""
        return sum(len(p) for p in self.schedule.pieces)

    def log_fields(self) -> dict[str, object]:
        """The fields of the build's "optimized physical exchange schedule" log line."""
        fields = self.fields()
        del fields["transfers"], fields["maximum_identical_destinations"]
        return fields

    def fields(self) -> dict[str, object]:
        """The reported fields as a JSON-ready dict (without the schedule)."""
        return {
            "transfers": self.transfers,
            "maximum_identical_destinations": self.maximum_identical_destinations,
            "initial_horizon": self.initial_horizon,
            "selected_horizon": self.selected_horizon,
            "endpoint_lower_bound": self.endpoint_lower_bound,
            "strongest_lower_bound": self.strongest_lower_bound,
            "tight_bound": self.tight_bound,
            "lower_bound_gap": self.lower_bound_gap,
            "selected_kind": self.selected_kind,
            "neighborhood_improvements": self.neighborhood_improvements,
            "pieces": self.pieces,
            "seconds": round(self.seconds, 4),
        }


def schedule_phase(
    phase: ExchangePhase,
    model: ExchangeModel = IPU21_MODEL,
    time_budget: float = DEFAULT_TIME_BUDGET,
) -> PhaseSchedule:
    """Schedule one phase (see :func:`optimize_phase`) and return just the schedule.

    Raises:
        ScheduleError: if the phase is malformed.
    """
    return optimize_phase(phase, model, time_budget).schedule


def optimize_phase(
    phase: ExchangePhase,
    model: ExchangeModel = IPU21_MODEL,
    time_budget: float = DEFAULT_TIME_BUDGET,
    target_gap: float = 0.0,
    wall_clock_guards: bool = True,
    max_pieces: int = MAX_PIECES,
    memo: ScheduleMemo | None = None,
) -> PhaseReport:
    """Schedule one phase as well as the time budget allows.

    With ``wall_clock_guards=False`` only the deterministic budgets (work counts, CP-SAT
    deterministic time) apply: the result never depends on how busy the machine is, and a
    slow machine takes longer instead (what a build needs for byte-identical packages).
    With a ``memo``, a phase that compiles to a problem scheduled before with the same model
    and options gets that report again (:mod:`ipu_stack.exchange.memo`).

    Args:
        phase: the phase; it is validated first.
        model: the rules the schedule must obey.
        time_budget: wall-clock seconds for the whole call; the improvement stage uses what the
            bounds and greedies leave (0 skips it).
        target_gap: stop improving once ``horizon <= bound * (1 + target_gap)``.
        max_pieces: most pieces per transfer; 1 allows no preemption.
        memo: reports of problems already scheduled (read and extended).

    Returns:
        The report with the selected schedule.

    Raises:
        ScheduleError: if the phase is malformed or ``max_pieces`` is below 1.
    """
    started = time.perf_counter()
    if max_pieces < 1:
        raise ScheduleError(f"max_pieces must be at least 1 piece per transfer, got {max_pieces}")
    if memo is not None:
        memo.validate(phase)  # once per phase object while the memo lives
    else:
        phase.validate()
    options = (model, time_budget, target_gap, wall_clock_guards, max_pieces)
    seen: bytes | None = None
    if memo is not None:  # this phase object's report, without compiling it again
        seen = memo.key_of(phase, options)
        known = memo.get(seen) if seen is not None else None
        if known is not None:
            return replace(known, seconds=time.perf_counter() - started)
    # a problem compiled for its key (schedule_program.phase_problem_key) is not compiled again
    problem = memo.take_problem(phase, model) if memo is not None else None
    problem = problem if problem is not None else compile_phase(phase, model)
    key = b""
    if memo is not None:
        if seen is None:
            digest = problem_digest(problem, model)
            memo.remember_digest(phase, model, digest)
            seen = options_key(digest, options[1:])
            known = memo.get(seen)
            if known is not None:
                return replace(known, seconds=time.perf_counter() - started)
        key = seen
    report = _optimize(
        problem, phase, model, time_budget, target_gap, wall_clock_guards, max_pieces, started
    )
    if memo is not None:
        memo.put(key, report)
    return report


def _optimize(
    problem: ResourceProblem,
    phase: ExchangePhase,
    model: ExchangeModel,
    time_budget: float,
    target_gap: float,
    wall_clock_guards: bool,
    max_pieces: int,
    started: float,
) -> PhaseReport:
    """The stages of :func:`optimize_phase` on the compiled problem."""
    if problem.count == 0:
        empty = PhaseSchedule((), 0, DENSE_GREEDY, model, ())
        return PhaseReport(
            empty, 0, 0, 0, 0, 0, 0, ENDPOINT, 0, DENSE_GREEDY, 0, time.perf_counter() - started
        )
    # Constructive stages run when the budget covers their estimated cost; estimates depend
    # only on the phase's size, never on the clock, so the same phase and budget always take
    # the same path. At least one schedule (the list scheduler's) is always made.
    budget = max(time_budget, 0.0)
    bounds = lower_bounds(problem, int(CLIQUE_EXACT_WORK_PER_SECOND * budget))
    bound, tight = strongest(bounds)
    preemptive_bound, preemptive_tight = strongest(bounds, PREEMPTIVE_BOUND_NAMES)
    preempt = max_pieces > 1
    candidates: list[tuple[IntArray, str]] = []

    def worth(estimate: float) -> bool:
        if not candidates:
            return True
        best = min(horizon_of(problem, c[0]) for c in candidates)
        return best > bound and estimate <= OPTIONAL_SHARE * budget

    uses = int(problem.use_transfers.size)
    # The static priority order (with its matching waves) serves several stages: make it once.
    by_priority = cache(lambda: priority_order(problem))

    unicast_heavy = bool((problem.arrays.fanouts == 1).mean() >= 0.5)
    if unicast_heavy:
        candidates.append((earliest_fit(problem, by_priority()), EARLIEST_FIT))
        # Sums of permutations and reduce-scatters: all unicasts in matching waves.
        dependent = problem.dependency_before.size > 0
        per_use = WAVES_SECONDS_PER_USE_DEPENDENT if dependent else WAVES_SECONDS_PER_USE
        if worth(per_use * uses):
            order = wave_order(problem)
            if order is not None:
                candidates.append((earliest_fit(problem, order), WAVES))
        # An all-gather among whole pairs is half unicasts (each sender's own partner) and half
        # paired multicasts (low/pair_multicasts.py): the multicasts placed first, in priority
        # order, and the unicasts fitted around them (SigLIP MLP batch 4: 22,366 -> 21,083).
        multicast = problem.arrays.fanouts > 1
        if multicast.any() and worth(0.0):
            ranked = by_priority()
            first = multicast[ranked]
            order = np.concatenate((ranked[first], ranked[~first]))
            candidates.append((earliest_fit(problem, order), MULTICAST_FIRST))
    else:
        # Multicast cliques (GEMM operand groups) in a short latency-aware order.
        order = clique_order(problem)
        if order is not None:
            candidates.append((earliest_fit(problem, order), CLIQUE_PATHS))
        if budget > 0 and worth(0.0) and not preempt:
            # The dense greedy gives up deterministically after its share of the budget's
            # work; the list scheduler then stands in.
            dense = dense_greedy(
                problem,
                int(DENSE_SHARE * budget / DENSE_SECONDS_PER_WORK),
                started + GUARD_SHARE * budget if wall_clock_guards else None,
            )
            if dense is not None:
                candidates.append((dense, DENSE_GREEDY))
        # The list scheduler in static priority order is the baseline every phase gets: a
        # clique-paths order can be much worse when the cliques overlap at shared receivers
        # (a GEMM operand phase whose groups straddle tiles: 1,824 against 1,526 cycles), so
        # it never stands in for it. Its cost (0.5-2 us per resource use) is not budgeted.
        if worth(0.0):
            candidates.append((earliest_fit(problem, by_priority()), EARLIEST_FIT))
    starts, kind = min(candidates, key=lambda c: (horizon_of(problem, c[0]), c[1]))
    initial = horizon_of(problem, starts)
    good_enough = int(bound * (1.0 + target_gap))
    pieces = None
    pieces_end = 0
    pieces_kind = PREEMPTIVE_FIT
    if preempt and initial > good_enough and budget > 0:
        # Hardest-to-fit first, then the one-piece priority order, then the sending groups'
        # colours (multicast phases whose senders also receive; None elsewhere, at no charge),
        # while the budget covers it.
        planned = 0.0
        orders = (
            (lambda: difficulty_order(problem), PREEMPTIVE_FIT),
            (by_priority, PREEMPTIVE_FIT),
            (lambda: group_colour_order(problem), GROUP_COLOURS),
        )
        for make_order, name in orders:
            if planned + PIECES_SECONDS_PER_USE * uses > PIECES_SHARE * budget:
                break
            order = make_order()
            if order is None:
                continue
            planned += PIECES_SECONDS_PER_USE * uses
            trial = preemptive_fit(problem, order, max_pieces=max_pieces)
            end = pieces_horizon(problem, trial)
            if end < min(initial, pieces_end or initial):
                pieces, pieces_end, pieces_kind = trial, end, name
            if pieces_end and pieces_end <= int(preemptive_bound * (1.0 + target_gap)):
                break
    improvements = 0
    # Leave some of the budget for building the schedule after the search.
    deadline = started + 0.85 * budget - 0.02 if wall_clock_guards else float("inf")
    settled = pieces is not None and pieces_end <= int(preemptive_bound * (1.0 + target_gap))
    if initial > good_enough and not settled and budget > 0 and time.perf_counter() < deadline:
        from ipu_stack.exchange.schedule_lns import improve

        result = improve(problem, starts, bound, deadline, good_enough, IMPROVEMENT_SHARE * budget)
        if result.improvements:
            starts, kind, improvements = result.starts, result.kind, result.improvements
        if result.proven_bound > bound:
            # CP-SAT proved a whole component optimal: a true lower bound on one-piece schedules.
            bounds[COMPONENT_OPTIMUM] = result.proven_bound
            bound, tight = result.proven_bound, COMPONENT_OPTIMUM
    horizon = horizon_of(problem, starts)
    if pieces is not None and pieces_end < horizon:
        schedule = schedule_from_pieces(problem, pieces, pieces_kind, model)
        horizon, kind, improvements = pieces_end, pieces_kind, 0
        bound, tight = preemptive_bound, preemptive_tight
    else:
        schedule = schedule_from_starts(problem, starts, kind, model)
    return PhaseReport(
        schedule=schedule,
        transfers=problem.count,
        maximum_identical_destinations=maximum_identical_destinations(phase),
        initial_horizon=min(initial, pieces_end) if pieces is not None else initial,
        selected_horizon=horizon,
        endpoint_lower_bound=bounds[ENDPOINT],
        strongest_lower_bound=bound,
        tight_bound=tight,
        lower_bound_gap=horizon - bound,
        selected_kind=kind,
        neighborhood_improvements=improvements,
        seconds=time.perf_counter() - started,
        bounds=bounds,
    )


def schedule_from_starts(
    problem: ResourceProblem, starts: IntArray, kind: str, model: ExchangeModel
) -> PhaseSchedule:
    """A one-piece-per-transfer schedule from send cycles, with first arrivals.

    Args:
        problem: the compiled phase.
        starts: send cycle of every transfer.
        kind: the scheduler's name.
        model: the model the problem was compiled under.

    Returns:
        The schedule.
    """
    words = problem.arrays.words.tolist()
    send = starts.tolist()
    # zip of one iterable makes the 1-tuples (one piece per transfer) without a Python loop.
    pieces = tuple(zip(map(Piece, send, repeat(0), words)))
    arrival = (starts[problem.arrays.destination_transfers] + problem.destination_latency).tolist()
    first_arrivals = _per_transfer(arrival, problem.arrays.destination_starts)
    return PhaseSchedule(pieces, horizon_of(problem, starts), kind, model, first_arrivals)


def _per_transfer(values: list[int], starts: IntArray) -> tuple[tuple[int, ...], ...]:
    """``values`` cut into one tuple per transfer at the CSR ``starts``."""
    if len(values) == starts.size - 1:  # one entry per transfer (all unicasts)
        return tuple(zip(values))
    bounds = starts.tolist()
    return tuple(tuple(values[begin:end]) for begin, end in pairwise(bounds))


def exchange_row_words(phase: ExchangePhase, schedule: PhaseSchedule) -> tuple[int, int]:
    """The tile with the most estimated exchange-code words in a schedule, and that count.

    Args:
        phase: the phase.
        schedule: its schedule.

    Returns:
        ``(tile, row_words)``; ``(0, 0)`` for an empty phase.
    """
    if not phase.transfers:
        return 0, 0
    arrays = phase_arrays(phase)
    pieces = np.fromiter(map(len, schedule.pieces), np.int64, len(schedule.pieces))
    tiles = max(int(arrays.sources.max()), int(arrays.destination_tiles.max(initial=0))) + 1
    words = np.bincount(arrays.sources, SEND_ROW_WORDS_PER_PIECE * pieces, tiles)
    words += np.bincount(
        arrays.destination_tiles,
        RECEIVE_ROW_WORDS_PER_PIECE * pieces[arrays.destination_transfers],
        tiles,
    )
    tile = int(np.argmax(words))  # the lowest tile among the busiest
    return tile, round(float(words[tile]))

"""Phase reports remembered by content, so a build schedules each distinct phase once.

A program repeats exchange phases: the query, key and value projections of an attention block
move the same operand to the same tiles, the row blocks of a large GEMM move equal blocks
between the same tiles at other addresses, and the finalists of a build share the phases of the
operators they plan alike. The schedulers read only the compiled problem
(:mod:`ipu_stack.exchange.constraints`: resources, latency offsets, lengths, dependencies and
SRAM-element resources), never the addresses themselves, and ``optimize_phase`` is
deterministic on deterministic budgets, so two phases that compile to the same problem get the
same schedule: :func:`problem_key` digests the compiled problem with the model and options.
:func:`phase_key` digests the phase itself, addresses included (what the verifier reads).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ipu_stack.exchange.constraints import ResourceProblem
from ipu_stack.exchange.model import ExchangeModel, ExchangePhase, phase_arrays

if TYPE_CHECKING:
    from ipu_stack.exchange.scheduler import PhaseReport


def _digest(head: object, arrays: Iterable[npt.ArrayLike]) -> bytes:
    digest = hashlib.blake2b(digest_size=32)
    digest.update(repr(head).encode())
    for values in arrays:
        array = np.ascontiguousarray(values, dtype=np.int64)
        digest.update(repr(array.shape).encode())
        digest.update(array.tobytes())
    return digest.digest()


def problem_digest(problem: ResourceProblem, model: ExchangeModel) -> bytes:
    """A digest of everything the schedulers read of a compiled phase, and the model (no
    options: :func:`options_key` adds them, so a phase compiled once has a key for any)."""
    arrays = problem.arrays
    return _digest(
        (problem.count, problem.resource_count, model),
        (
            problem.durations,
            problem.use_starts,
            problem.use_resources,
            problem.use_offsets,
            problem.resource_kinds,
            problem.resource_tiles,
            problem.dependency_before,
            problem.dependency_after,
            problem.dependency_delay,
            problem.destination_latency,
            problem.release,
            problem.words_per_cycle,
            arrays.sources,
            arrays.words,
            arrays.paired,
            arrays.destination_starts,
            arrays.destination_tiles,
        ),
    )


def options_key(digest: bytes, options: tuple[object, ...]) -> bytes:
    """The memo key of a problem (its :func:`problem_digest`) scheduled under ``options``."""
    return hashlib.blake2b(digest + repr(options).encode(), digest_size=32).digest()


def problem_key(problem: ResourceProblem, model: ExchangeModel, *options: object) -> bytes:
    """A digest of everything the schedulers read of a compiled phase, the model and options."""
    return options_key(problem_digest(problem, model), options)


def phase_key(phase: ExchangePhase, model: ExchangeModel, *options: object) -> bytes:
    """A digest of a phase's whole content (addresses included), the model and options."""
    arrays = phase_arrays(phase)
    return _digest(
        (phase.tile_count, model, options),
        (
            arrays.sources,
            arrays.words,
            arrays.paired,
            arrays.source_addresses,
            arrays.destination_starts,
            arrays.destination_tiles,
            arrays.destination_addresses,
        ),
    )


@dataclass(slots=True)
class ScheduleMemo:
    """Reports by :func:`problem_key`, and which phases the verifier has accepted.

    Attributes:
        reports: the remembered reports.
        verified: :func:`phase_key` of phases whose schedule passed
            :func:`ipu_stack.exchange.verify.verify_schedule`.
        hits: lookups answered from memory.
    """

    reports: dict[bytes, PhaseReport] = field(default_factory=dict)
    verified: set[bytes] = field(default_factory=set)
    hits: int = 0
    #: (id of a phase, model) -> (the phase, its :func:`problem_digest`): a phase object seen
    #: before is not compiled again to find its report under any options (phases are
    #: immutable; each entry keeps its phase alive, so the id is not reused)
    keys: dict[tuple[int, ExchangeModel], tuple[ExchangePhase, bytes]] = field(default_factory=dict)
    #: (id of a phase, model) -> (the phase, its compiled problem), kept by
    #: :meth:`keep_problem` for the scheduler to take instead of compiling the phase again
    problems: dict[tuple[int, ExchangeModel], tuple[ExchangePhase, ResourceProblem]] = field(
        default_factory=dict
    )

    #: phases :meth:`ExchangePhase.validate` accepted, by identity (immutable; kept alive)
    valid: dict[int, ExchangePhase] = field(default_factory=dict)

    def validate(self, phase: ExchangePhase) -> None:
        """``phase.validate()``, once per phase object in this memo's life.

        Raises:
            ScheduleError: as :meth:`ExchangePhase.validate`.
        """
        if self.valid.get(id(phase)) is not phase:
            phase.validate()
            self.valid[id(phase)] = phase

    def key_of(self, phase: ExchangePhase, options: tuple[object, ...]) -> bytes | None:
        """The problem key of this phase object under ``options`` (model first), if its
        problem's digest is remembered."""
        model = options[0]
        assert isinstance(model, ExchangeModel)
        known = self.keys.get((id(phase), model))
        if known is None or known[0] is not phase:
            return None
        return options_key(known[1], options[1:])

    def remember_digest(self, phase: ExchangePhase, model: ExchangeModel, digest: bytes) -> None:
        """Remember ``phase``'s :func:`problem_digest` under ``model``."""
        self.keys[(id(phase), model)] = (phase, digest)

    def keep_problem(
        self, phase: ExchangePhase, model: ExchangeModel, problem: ResourceProblem
    ) -> None:
        """Keep ``phase``'s compiled problem until :meth:`take_problem` (or :meth:`drop`)."""
        self.problems[(id(phase), model)] = (phase, problem)

    def take_problem(self, phase: ExchangePhase, model: ExchangeModel) -> ResourceProblem | None:
        """The kept compiled problem of this phase object, if any (no longer kept)."""
        kept = self.problems.pop((id(phase), model), None)
        return kept[1] if kept is not None and kept[0] is phase else None

    def drop_problems_except(self, phases: Iterable[ExchangePhase] = ()) -> None:
        """Forget every kept compiled problem (their arrays are large) but those of
        ``phases``."""
        wanted = {id(phase) for phase in phases}
        self.problems = {k: v for k, v in self.problems.items() if k[0] in wanted}

    def get(self, key: bytes) -> PhaseReport | None:
        """The report remembered for ``key``, if any."""
        report = self.reports.get(key)
        if report is not None:
            self.hits += 1
        return report

    def put(self, key: bytes, report: PhaseReport) -> None:
        """Remember a report."""
        self.reports[key] = report

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


def problem_key(problem: ResourceProblem, model: ExchangeModel, *options: object) -> bytes:
    """A digest of everything the schedulers read of a compiled phase, the model and options."""
    arrays = problem.arrays
    return _digest(
        (problem.count, problem.resource_count, model, options),
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
    #: (id of a phase, model and options) -> (the phase, its :func:`problem_key`): a phase
    #: object seen before is not compiled again to find its report (phases are immutable; each
    #: entry keeps its phase alive, so the id is not reused)
    keys: dict[tuple[int, tuple[object, ...]], tuple[ExchangePhase, bytes]] = field(
        default_factory=dict
    )

    def key_of(self, phase: ExchangePhase, options: tuple[object, ...]) -> bytes | None:
        """The problem key remembered for this phase object under ``options``, if any."""
        known = self.keys.get((id(phase), options))
        return known[1] if known is not None and known[0] is phase else None

    def remember_key(self, phase: ExchangePhase, options: tuple[object, ...], key: bytes) -> None:
        """Remember ``phase``'s problem key under ``options``."""
        self.keys[(id(phase), options)] = (phase, key)

    def get(self, key: bytes) -> PhaseReport | None:
        """The report remembered for ``key``, if any."""
        report = self.reports.get(key)
        if report is not None:
            self.hits += 1
        return report

    def put(self, key: bytes, report: PhaseReport) -> None:
        """Remember a report."""
        self.reports[key] = report

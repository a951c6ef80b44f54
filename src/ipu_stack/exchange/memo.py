"""Phase reports remembered by content, so a build schedules each distinct phase once.

A program often repeats an exchange phase exactly: the query, key and value projections of an
attention block move the same operand to the same tiles and addresses, and the finalists of a
build share the phases of the operators they plan alike. ``optimize_phase`` is deterministic
for a phase, model and options when it runs on deterministic budgets only, so its report for a
repeated phase can be reused instead of recomputed. The key is a digest of everything the
scheduler reads: every transfer's source, words, width, source address, destinations and their
addresses (in order), the tile count, the model and the options.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from ipu_stack.exchange.model import ExchangeModel, ExchangePhase, phase_arrays
from ipu_stack.exchange.scheduler import PhaseReport


def phase_key(phase: ExchangePhase, model: ExchangeModel, *options: object) -> bytes:
    """A digest of a phase's content, the model and the scheduling options."""
    arrays = phase_arrays(phase)
    digest = hashlib.blake2b(digest_size=32)
    digest.update(repr((phase.tile_count, model, options)).encode())
    for values in (
        arrays.sources,
        arrays.words,
        arrays.paired,
        arrays.source_addresses,
        arrays.destination_starts,
        arrays.destination_tiles,
        arrays.destination_addresses,
    ):
        digest.update(np.ascontiguousarray(values, dtype=np.int64).tobytes())
    return digest.digest()


@dataclass(slots=True)
class ScheduleMemo:
    """Reports by :func:`phase_key`, and which of them the verifier has accepted.

    Attributes:
        reports: the remembered reports.
        verified: keys whose schedule passed :func:`ipu_stack.exchange.verify.verify_schedule`.
        hits: lookups answered from memory.
    """

    reports: dict[bytes, PhaseReport] = field(default_factory=dict)
    verified: set[bytes] = field(default_factory=set)
    hits: int = 0

    def get(self, key: bytes) -> PhaseReport | None:
        """The report remembered for ``key``, if any."""
        report = self.reports.get(key)
        if report is not None:
            self.hits += 1
        return report

    def put(self, key: bytes, report: PhaseReport) -> None:
        """Remember a report."""
        self.reports[key] = report

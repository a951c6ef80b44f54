"""The in-memory profile of one simulated run: columnar tables plus a JSON-able header.

Every table is a little-endian ``int64`` array whose columns are named in
:data:`TABLE_COLUMNS`. Tiles are *logical*: an index into ``meta["tiles"]`` (their physical
ids, the package's tile order). Cycles are the simulator's modelled cycles from the start of
the run; exchange intervals count from the end of their phase's sync.

``segments`` covers each tile's whole run without gaps or overlaps: per tile, its segments
laid end to end run from 0 to ``meta["cycles"]``. Kinds (:data:`KINDS`): ``compute`` (a run of
consecutive kernel calls of one operation and kernel unit), ``exchange`` (the phase's horizon,
on tiles that send, receive or lend their exchange port as a paired partner), ``sync`` (the
sync before an exchange phase, ``SYNC_CYCLES``) and ``idle`` (waiting for the last tile at a
sync, a phase the tile takes no part in, or the end of the run). ``phase_cycles`` is a
segment's share of the run's wall clock: in each step the tile that ends it last carries the
step's cycles (a compute step: its compute segments inside the step's span; an exchange step:
its sync and exchange segments), so ``phase_cycles`` sums to the run's simulated cycles over
any grouping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

KINDS = ("compute", "exchange", "sync", "idle")
COMPUTE, EXCHANGE, SYNC, IDLE = range(4)
INTERVAL_KINDS = ("send", "receive", "partner-busy")
REGIONS = ("standard", "interleaved")

#: Columns of each table, in order.
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    # one row per executed step (a loop body's steps once per iteration)
    "executions": ("step", "iteration", "start", "end"),
    "segments": (
        "tile", "execution", "start", "end", "kind", "operation", "kernel", "calls", "bytes",
        "phase_cycles",
    ),
    # one row per executed exchange phase; horizon and bound in cycles after the sync
    "phases": ("execution", "horizon", "lower_bound", "bound_name", "transfers", "pieces"),
    # per phase row: each tile's send, receive and partner-busy intervals (one per piece)
    "intervals": ("phase", "tile", "kind", "start", "end", "words"),
    # the package's memory map: every allocation and the steps it is live in
    "allocations": ("tile", "address", "size", "live_first", "live_end", "region", "name"),
}  # fmt: skip

#: Keys of ``meta`` that index tables (name lists).
NAME_LISTS = ("operations", "kernels", "bound_names", "allocation_names")


@dataclass(slots=True)
class Profile:
    """A run's profile: ``meta`` (JSON) and the tables of :data:`TABLE_COLUMNS`."""

    meta: dict[str, Any]
    tables: dict[str, np.ndarray] = field(default_factory=dict)

    def column(self, table: str, name: str) -> np.ndarray:
        """One column of a table by name."""
        return self.tables[table][:, TABLE_COLUMNS[table].index(name)]

    @property
    def cycles(self) -> int:
        """The run's simulated cycles."""
        return int(self.meta["cycles"])

    @property
    def tile_count(self) -> int:
        """Tiles in the profile (logical tiles ``0..tile_count-1``)."""
        return len(self.meta["tiles"])

    def names(self, key: str) -> list[str]:
        """A name list of ``meta`` (:data:`NAME_LISTS`)."""
        return list(self.meta[key])


def empty_table(name: str) -> np.ndarray:
    """A table with no rows."""
    return np.zeros((0, len(TABLE_COLUMNS[name])), dtype=np.int64)

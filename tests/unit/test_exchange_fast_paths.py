"""The vectorised and short-cut paths of the scheduler and bounds against plain references.

Each reference below is written from the rule it checks (not from the code under test): the
clique separations from the pairwise definition, the list scheduler from "the earliest cycle
at which every use of the transfer is free", and the identical-destination count by counting.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ipu_stack.exchange import bounds
from ipu_stack.exchange.constraints import ResourceProblem, compile_phase
from ipu_stack.exchange.model import (
    IPU21_MODEL,
    ExchangePhase,
    Transfer,
    maximum_identical_destinations,
    phase_arrays,
)
from ipu_stack.exchange.patterns import random_phase
from ipu_stack.exchange.schedule_greedy import earliest_fit

NO_DEPENDENCIES = replace(IPU21_MODEL, dependencies=False)


def _uses(problem: ResourceProblem, i: int) -> dict[int, int]:
    rows = range(int(problem.use_starts[i]), int(problem.use_starts[i + 1]))
    return {int(problem.use_resources[r]): int(problem.use_offsets[r]) for r in rows}


def _reference_separations(problem: ResourceProblem, members: list[int]) -> np.ndarray:
    """``S[i, j]`` = max over shared resources p of ``D_i + o_ip - o_jp`` where both that and
    ``D_j + o_jp - o_ip`` are positive (NaN when no resource qualifies)."""
    n = len(members)
    out = np.full((n, n), np.nan)
    uses = [_uses(problem, m) for m in members]
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            da, db = int(problem.durations[members[a]]), int(problem.durations[members[b]])
            values = [
                da + uses[a][p] - uses[b][p]
                for p in uses[a].keys() & uses[b].keys()
                if da + uses[a][p] - uses[b][p] > 0 and db + uses[b][p] - uses[a][p] > 0
            ]
            if values:
                out[a, b] = max(values)
    return out


def _reference_list_schedule(problem: ResourceProblem, order: np.ndarray) -> list[int]:
    """Each transfer in order at the earliest cycle where all its uses are free (no deps)."""
    busy: dict[int, list[tuple[int, int]]] = {}
    starts = [0] * problem.count
    for i in order.tolist():
        length = int(problem.durations[i])
        uses = _uses(problem, i)
        time = int(problem.release[i])
        moved = True
        while moved:
            moved = False
            for resource, offset in uses.items():
                for begin, end in busy.get(resource, []):
                    if begin < time + offset + length and time + offset < end:
                        time = end - offset
                        moved = True
        for resource, offset in uses.items():
            busy.setdefault(resource, []).append((time + offset, time + offset + length))
        starts[i] = time
    return starts


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 40), st.integers(1, 6))
def test_clique_separations_match_the_pairwise_definition(seed: int, count: int, fanout: int):
    rng = np.random.default_rng(seed)
    phase = random_phase(rng, count, tile_count=12, max_fanout=fanout, max_words=64)
    problem = compile_phase(phase, IPU21_MODEL)
    members = rng.choice(count, size=int(rng.integers(1, count + 1)), replace=False).tolist()
    got = bounds.clique_separations(problem, members)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, _reference_separations(problem, members))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 60), st.integers(1, 5))
def test_earliest_fit_without_dependencies_is_the_plain_list_schedule(
    seed: int, count: int, fanout: int
):
    rng = np.random.default_rng(seed)
    phase = random_phase(rng, count, tile_count=10, max_fanout=fanout, max_words=48)
    problem = compile_phase(phase, NO_DEPENDENCIES)
    order = rng.permutation(count).astype(np.int64)
    assert earliest_fit(problem, order).tolist() == _reference_list_schedule(problem, order)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), min_size=0, max_size=30))
def test_maximum_identical_destinations_counts_repeated_pairs(slots: list[tuple[int, int]]):
    base = 0x60000
    transfers = tuple(Transfer(6, base, ((tile, base + 4 * slot),), 1) for tile, slot in slots)
    counts: dict[tuple[int, int], int] = {}
    for tile, slot in slots:
        counts[(tile, slot)] = counts.get((tile, slot), 0) + 1
    phase = ExchangePhase(transfers, tile_count=8)
    assert maximum_identical_destinations(phase) == max(counts.values(), default=0)


def test_phase_arrays_are_shared_and_read_only():
    phase = random_phase(np.random.default_rng(3), 20, tile_count=8, max_fanout=3)
    arrays = phase_arrays(phase)
    assert phase_arrays(phase) is arrays
    assert not arrays.sources.flags.writeable
    # An equal but distinct phase object is flattened on its own, to equal arrays.
    twin = ExchangePhase(tuple(phase.transfers), phase.tile_count)
    assert phase_arrays(twin) is not arrays
    np.testing.assert_array_equal(phase_arrays(twin).destination_tiles, arrays.destination_tiles)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 40))
def test_row_words_of_the_busiest_tile_match_a_count_by_tile(seed, count):
    from ipu_stack.exchange.scheduler import exchange_row_words, optimize_phase
    from ipu_stack.target.ipu21 import RECEIVE_ROW_WORDS_PER_PIECE, SEND_ROW_WORDS_PER_PIECE

    phase = random_phase(np.random.default_rng(seed), count, 16, max_fanout=4)
    schedule = optimize_phase(phase, time_budget=0.05).schedule
    words: dict[int, int] = {}
    for transfer, pieces in zip(phase.transfers, schedule.pieces, strict=True):
        words[transfer.source] = words.get(transfer.source, 0) + SEND_ROW_WORDS_PER_PIECE * len(
            pieces
        )
        for tile in transfer.destination_tiles:
            words[tile] = words.get(tile, 0) + RECEIVE_ROW_WORDS_PER_PIECE * len(pieces)
    busiest = max(words.values())
    assert exchange_row_words(phase, schedule) == (
        min(t for t, w in words.items() if w == busiest),
        busiest,
    )

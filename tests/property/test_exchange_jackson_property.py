"""The latency-endpoint bound's shortcuts against Jackson's rule on every resource.

``jackson_bound`` skips Jackson's rule on a resource whose cheap brackets settle it; the
result must be exactly the largest Jackson value over the resources that can beat the floor,
and the brackets must hold on random one-machine instances.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipu_stack.exchange.bounds import _brackets, _jackson, jackson_bound
from ipu_stack.exchange.constraints import ResourceProblem, compile_phase
from ipu_stack.exchange.model import IPU21_MODEL, ExchangePhase, Transfer

IntArray = npt.NDArray[np.int64]
BASE = 0x60000
SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _every_resource(problem: ResourceProblem, heads: IntArray, tails: IntArray, floor: int) -> int:
    """Jackson's rule on each resource whose trivial upper bound beats ``floor``."""
    transfers = problem.use_transfers
    release = heads[transfers] + problem.use_offsets
    duration = problem.durations[transfers]
    tail = tails[transfers] - problem.use_offsets - duration
    best = 0
    for resource in np.unique(problem.use_resources).tolist():
        rows = np.flatnonzero(problem.use_resources == resource)
        optimistic = duration[rows].sum() + release[rows].max() + tail[rows].max()
        if optimistic > floor:
            value = _jackson(release[rows].tolist(), duration[rows].tolist(), tail[rows].tolist())
            best = max(best, value)
    return int(best)


@st.composite
def _phases(draw: st.DrawFn) -> ExchangePhase:
    tile_count = draw(st.integers(3, 40))
    transfers = []
    for index in range(draw(st.integers(1, 25))):
        source = draw(st.integers(0, tile_count - 1))
        others = [tile for tile in range(tile_count) if tile != source]
        destinations = draw(st.lists(st.sampled_from(others), min_size=1, max_size=4, unique=True))
        words = draw(st.integers(1, 50))
        # Shared addresses make memory-order dependencies (heads and tails that differ).
        address = BASE + 256 * draw(st.integers(0, 3))
        transfers.append(
            Transfer(source, address + 4 * index, tuple((d, address) for d in destinations), words)
        )
    return ExchangePhase(tuple(transfers), tile_count)


@SETTINGS
@given(_phases(), st.integers(0, 120))
def test_jackson_bound_is_the_best_resource(phase: ExchangePhase, floor: int) -> None:
    problem = compile_phase(phase, IPU21_MODEL)
    heads, tails = problem.heads(), problem.tails()
    assert jackson_bound(problem, heads, tails, floor) == _every_resource(
        problem, heads, tails, floor
    )


@SETTINGS
@given(
    st.lists(
        st.tuples(st.integers(0, 60), st.integers(1, 30), st.integers(0, 60)),
        min_size=1,
        max_size=12,
    )
)
def test_brackets_hold(jobs: list[tuple[int, int, int]]) -> None:
    release, duration, tail = np.asarray(jobs, dtype=np.int64).T.copy()
    resources = np.zeros(len(jobs), dtype=np.int64)
    low, high = _brackets(resources, release, duration, tail, 1)
    value = _jackson(release.tolist(), duration.tolist(), tail.tolist())
    assert low[0] <= value <= high[0]

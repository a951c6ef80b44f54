"""Cheapest clique orders: Held-Karp against brute force, the heuristic against Held-Karp, and
the exact clique bound on an all-gather group with latency."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ipu_stack.exchange.bounds import lower_bounds
from ipu_stack.exchange.constraints import compile_phase
from ipu_stack.exchange.model import IPU21_MODEL
from ipu_stack.exchange.paths import EXACT_LIMIT, exact_path, path_cost, short_path
from ipu_stack.exchange.patterns import multicast_groups_phase
from ipu_stack.exchange.scheduler import optimize_phase


def _instance(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    separation = rng.integers(50, 150, (n, n)).astype(float)
    if n > 2:
        separation[rng.integers(0, n), rng.integers(0, n)] = np.nan  # one missing step
    head = rng.integers(0, 50, n).astype(float)
    tail = rng.integers(100, 200, n).astype(float)
    return separation, head, tail


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_exact_path_matches_brute_force(n: int) -> None:
    rng = np.random.default_rng(n)
    for _ in range(10):
        separation, head, tail = _instance(rng, n)
        weights = np.where(np.isnan(separation), np.inf, separation)
        np.fill_diagonal(weights, np.inf)
        best = min(
            path_cost(weights, head, tail, np.asarray(p)) for p in itertools.permutations(range(n))
        )
        length, order = exact_path(separation, head, tail)
        assert length == pytest.approx(best)
        assert sorted(order.tolist()) == list(range(n))
        assert path_cost(weights, head, tail, order) == pytest.approx(length)
        short, short_order = short_path(separation, head, tail)
        assert sorted(short_order.tolist()) == list(range(n))
        assert short >= length - 1e-9
        assert path_cost(weights, head, tail, short_order) == pytest.approx(short)


def test_short_path_is_close_to_exact_on_larger_cliques() -> None:
    rng = np.random.default_rng(11)
    for n in (9, 12):
        separation, head, tail = _instance(rng, n)
        exact, _ = exact_path(separation, head, tail)
        short, _ = short_path(separation, head, tail)
        assert exact <= short <= 1.1 * exact
    with pytest.raises(ValueError, match="limit"):
        exact_path(*_instance(rng, EXACT_LIMIT + 1))


def test_exact_clique_orders_tighten_the_bound_and_the_schedule_meets_it() -> None:
    # 12-member all-gather groups with real latency: the relaxation is below the best order.
    phase = multicast_groups_phase(12, 64, tile_count=96)
    problem = compile_phase(phase, IPU21_MODEL)
    relaxed = lower_bounds(problem)["conflict-clique"]
    exact = lower_bounds(problem, exact_work=10**8)["conflict-clique"]
    assert exact > relaxed >= 12 * 64
    report = optimize_phase(phase, IPU21_MODEL, 1.0)
    assert report.strongest_lower_bound >= exact
    assert report.selected_horizon <= 1.01 * report.strongest_lower_bound

"""Lower bounds on exchange-phase horizons."""

from __future__ import annotations

import numpy as np

from ipu_stack.exchange.bounds import (
    conflict_lower_bound,
    endpoint_lower_bound,
    strongest_lower_bound,
)
from ipu_stack.exchange.model import PORTS_ONLY, ExchangePhase, Transfer
from ipu_stack.exchange.patterns import all_gather_phase, all_to_all_phase, random_phase

BASE = 0x60000


def multicast(source: int, dests: tuple[int, ...], words: int) -> Transfer:
    return Transfer(source, BASE, tuple((d, BASE) for d in dests), words)


def test_empty_phase_has_zero_bounds() -> None:
    phase = ExchangePhase((), tile_count=4)
    assert endpoint_lower_bound(phase, PORTS_ONLY) == 0
    assert conflict_lower_bound(phase, PORTS_ONLY) == 0
    assert strongest_lower_bound(phase, PORTS_ONLY) == (0, "endpoint")


def test_endpoint_bound_takes_the_busiest_port() -> None:
    # Tile 0 sends 5 + 7 = 12; tile 2 receives 7 + 9 = 16.
    phase = ExchangePhase(
        (multicast(0, (1,), 5), multicast(0, (2,), 7), multicast(3, (2, 1), 9)), tile_count=4
    )
    assert endpoint_lower_bound(phase, PORTS_ONLY) == 16


def test_triangle_of_multicasts_needs_three_slots() -> None:
    # exchange-scheduling.md §1.5: A->{X,Y}, B->{Y,Z}, C->{Z,X} has port LB 2w but needs 3w.
    w = 10
    phase = ExchangePhase(
        (multicast(0, (3, 4), w), multicast(1, (4, 5), w), multicast(2, (5, 3), w)), tile_count=6
    )
    assert endpoint_lower_bound(phase, PORTS_ONLY) == 2 * w
    assert conflict_lower_bound(phase, PORTS_ONLY) == 3 * w
    assert strongest_lower_bound(phase, PORTS_ONLY) == (3 * w, "conflict-clique")


def test_all_gather_clique_bound() -> None:
    for group in (3, 4, 8):
        phase = all_gather_phase(group, 16, tile_count=24)
        assert endpoint_lower_bound(phase, PORTS_ONLY) == (group - 1) * 16
        assert strongest_lower_bound(phase, PORTS_ONLY) == (group * 16, "conflict-clique")
    pairs = all_gather_phase(2, 16, tile_count=8)  # g = 2: the two sends share no port
    assert strongest_lower_bound(pairs, PORTS_ONLY) == (16, "endpoint")


def test_unicast_clique_bound_equals_endpoint_bound() -> None:
    rng = np.random.default_rng(2)
    for phase in (random_phase(rng, 300, tile_count=20), all_to_all_phase(5, 8, tile_count=20)):
        assert conflict_lower_bound(phase, PORTS_ONLY) == endpoint_lower_bound(phase, PORTS_ONLY)
        assert strongest_lower_bound(phase, PORTS_ONLY)[1] == "endpoint"


def test_conflict_bound_is_never_below_endpoint_bound() -> None:
    rng = np.random.default_rng(4)
    for _ in range(20):
        phase = random_phase(rng, 40, tile_count=10, max_fanout=4, max_words=20)
        assert conflict_lower_bound(phase, PORTS_ONLY) >= endpoint_lower_bound(phase, PORTS_ONLY)

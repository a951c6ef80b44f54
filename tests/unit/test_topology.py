"""C600 tile map and time_to_mux (facts §8.3, §8.4)."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.target import topology
from ipu_stack.target.ipu21 import TILES
from ipu_stack.target.topology import (
    direction,
    is_pair_primary,
    logical_to_physical,
    paired_tile,
    paired_time_to_mux,
    physical_to_logical,
    time_to_mux,
)

ALL = np.arange(TILES, dtype=np.int64)


def _reference_time_to_mux(s: int, d: int) -> int:
    """Scalar transcription of facts §8.4 with plain ints, to check the vectorised version."""
    raw_s, raw_d = (s >> 2) & 15, (d >> 2) & 15
    col_s = raw_s ^ 15 if raw_s > 7 else raw_s
    col_d = raw_d ^ 15 if raw_d > 7 else raw_d
    src_mux = col_s + ((raw_s >> 3) ^ (s & 1))
    lane, half = d & 3, raw_d >> 3
    extra = (2 if half == (d & 1) else 4) if lane > 1 else (1 if half == lane else 5)
    disp = (col_d - src_mux) * 6 + extra
    edge_s = (raw_s * 4) ^ 60 if raw_s > 7 else raw_s * 4
    edge_d = (raw_d * 4) ^ 60 if raw_d > 7 else raw_d * 4
    low_s = (s >> 2) & 7
    local = ((s >> 2) & 8) | ((s >> 3) & 3)
    crossing = local - raw_d + ((low_s >> 1) ^ 3)
    turn = low_s + 1 if ((s ^ d) & 0x20) == 0 else 16 - low_s
    group_delta = (((s >> 6) & 31) - ((d >> 6) & 31)) * 2
    return crossing + edge_s + turn - edge_d + group_delta + abs(disp) - 34


@pytest.fixture(scope="module")
def all_pairs() -> np.ndarray:
    return time_to_mux(ALL[:, None], ALL[None, :])


def test_map_is_a_permutation_of_all_tiles() -> None:
    physical = logical_to_physical(ALL)
    assert physical.shape == (TILES,)
    assert np.array_equal(np.sort(physical), ALL)


def test_known_map_values() -> None:
    # pair 0 -> row 0, column 0; lane 1 adds 2; pair 1 -> row 1; pair 23 -> block 1, reversed.
    assert logical_to_physical(0) == 0
    assert logical_to_physical(1) == 2
    assert logical_to_physical(2) == 64
    assert logical_to_physical(46) == 22 * 64 + 1
    assert logical_to_physical(92) == 4  # block 2: column 4, row 0
    assert isinstance(logical_to_physical(5), int)


def test_inverse_round_trips_both_ways() -> None:
    assert np.array_equal(physical_to_logical(logical_to_physical(ALL)), ALL)
    assert np.array_equal(logical_to_physical(physical_to_logical(ALL)), ALL)
    assert physical_to_logical(logical_to_physical(777)) == 777


def test_logical_lanes_form_a_physical_pair() -> None:
    even = logical_to_physical(ALL[0::2])
    odd = logical_to_physical(ALL[1::2])
    assert np.array_equal(paired_tile(even), odd)
    assert is_pair_primary(even).all()
    assert not is_pair_primary(odd).any()


def test_pairing_is_an_involution_with_one_primary() -> None:
    partner = paired_tile(ALL)
    assert np.array_equal(paired_tile(partner), ALL)
    assert not np.any(partner == ALL)
    assert np.array_equal(is_pair_primary(ALL), ~is_pair_primary(partner))
    assert is_pair_primary(0) is True
    assert paired_tile(2) == 0


@pytest.mark.parametrize("bad", [-1, TILES])
def test_out_of_range_ids_are_rejected(bad: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        logical_to_physical(bad)
    with pytest.raises(ValueError, match="outside"):
        time_to_mux(0, np.array([0, bad]))


def test_vectorised_time_to_mux_matches_scalar_transcription() -> None:
    rng = np.random.default_rng(7)
    sources = rng.integers(0, TILES, size=400)
    dests = rng.integers(0, TILES, size=400)
    vectorised = time_to_mux(sources, dests)
    for s, d, value in zip(sources.tolist(), dests.tolist(), vectorised.tolist(), strict=True):
        assert value == _reference_time_to_mux(s, d)
        assert time_to_mux(s, d) == value


def test_time_to_mux_range_over_all_pairs(all_pairs: np.ndarray) -> None:
    distinct = all_pairs[~np.eye(TILES, dtype=bool)]
    # facts §8.4 report -78..+111 from random pairs; exhaustively the maximum is 112, reached
    # by exactly 2 of the 2.17M ordered pairs, so a random sample almost never sees it.
    assert distinct.min() == -78
    assert distinct.max() == 112
    assert int((distinct > 111).sum()) == 2
    p5, p95 = np.percentile(distinct, [5, 95])
    assert (p5, p95) == (-50, 38)


def test_random_sample_range_matches_facts() -> None:
    rng = np.random.default_rng(11)
    values = time_to_mux(rng.integers(0, TILES, 200_000), rng.integers(0, TILES, 200_000))
    assert -78 <= values.min() < -60
    assert 90 < values.max() <= 112


def test_direction_takes_both_values_evenly() -> None:
    values = direction(ALL[:, None], ALL[None, :])
    counts = np.bincount(values.ravel(), minlength=3)
    assert counts[0] == 0
    assert counts[1] == counts[2] == TILES * TILES // 2
    assert direction(0, 1) in (1, 2)


def test_paired_time_to_mux_is_the_slower_partner(all_pairs: np.ndarray) -> None:
    paired = paired_time_to_mux(ALL[:, None], ALL[None, :])
    assert np.array_equal(paired, np.maximum(all_pairs, all_pairs[:, paired_tile(ALL)]))
    assert (paired >= all_pairs).all()
    assert (paired > all_pairs).any()


def _classes(sources: np.ndarray, dests: np.ndarray) -> np.ndarray:
    """Class id 0..3: fabric direction x same/different region (bit 0x20)."""
    same_region = ((sources ^ dests) & 0x20) == 0
    return (direction(sources, dests) - 1) * 2 + same_region.astype(np.int64)


def _separable_residual(latency: np.ndarray, mask: np.ndarray) -> float:
    """Largest residual of the least-squares fit latency[s, d] = a[s] + b[d] over ``mask``."""
    rows, cols = np.nonzero(mask)
    n_s, n_d = latency.shape
    design = np.zeros((rows.size, n_s + n_d))
    design[np.arange(rows.size), rows] = 1.0
    design[np.arange(rows.size), n_s + cols] = 1.0
    target = latency[rows, cols].astype(float)
    solution, *_ = np.linalg.lstsq(design, target, rcond=None)
    return float(np.abs(design @ solution - target).max())


def test_latency_is_separable_within_each_class_least_squares() -> None:
    rng = np.random.default_rng(3)
    sources = rng.choice(TILES, size=60, replace=False)
    dests = rng.choice(TILES, size=60, replace=False)
    latency = time_to_mux(sources[:, None], dests[None, :])
    classes = _classes(sources[:, None], dests[None, :])
    for cls in range(4):
        mask = classes == cls
        assert mask.sum() > 300
        assert _separable_residual(latency, mask) < 1e-6
    # Control: over all classes together the same fit does not hold.
    assert _separable_residual(latency, np.ones_like(classes, dtype=bool)) > 1.0


def test_latency_rectangle_identity_within_each_class(all_pairs: np.ndarray) -> None:
    rng = np.random.default_rng(5)
    s1, s2, d1, d2 = (rng.integers(0, TILES, 400_000) for _ in range(4))
    c11, c22 = _classes(s1, d1), _classes(s2, d2)
    c12, c21 = _classes(s1, d2), _classes(s2, d1)
    same = (c11 == c22) & (c11 == c12) & (c11 == c21)
    lhs = all_pairs[s1, d1] + all_pairs[s2, d2]
    rhs = all_pairs[s1, d2] + all_pairs[s2, d1]
    for cls in range(4):
        in_class = same & (c11 == cls)
        assert in_class.sum() > 1000
        assert np.array_equal(lhs[in_class], rhs[in_class])
    # Control: across classes the identity fails.
    assert not np.array_equal(lhs[~same], rhs[~same])


def test_latency_allowance_is_the_slowest_pairs_send_to_write_time() -> None:
    from ipu_stack.target.ipu21 import EXCHANGE_LATENCY_ALLOWANCE

    tiles = np.arange(1472)
    s, d = tiles[:, None], tiles[None, :]
    latency = topology.exchange_latency(s, d)
    release = np.maximum(topology.mux_lead(tiles)[None, :] - latency, 0)
    assert int((release + latency).max()) == EXCHANGE_LATENCY_ALLOWANCE

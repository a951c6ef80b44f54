"""The verifier's vectorised memory-order check against a plain per-tile sweep.

Random phases on a few tiles with byte ranges that often overlap, and random send and arrival
cycles: the vectorised check must accept and reject exactly what the reference sweep does, with
the same message (the first violation, tiles in order of first access, accesses by address).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipu_stack.errors import ScheduleError
from ipu_stack.exchange.verify import _check_dependencies

WORD = 4
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _reference(
    transfers: list[tuple[int, int, list[tuple[int, int]], int]],
    send: list[int],
    arrival: list[list[int]],
) -> str | None:
    """The per-tile sweep over address-sorted accesses (one piece per transfer)."""
    accesses: dict[int, list[tuple[int, int, int, bool, int, int]]] = {}
    for i, (source, address, destinations, words) in enumerate(transfers):
        size = words * WORD
        accesses.setdefault(source, []).append(
            (address, address + size, i, False, send[i], send[i] + words)
        )
        for (tile, at), cycle in zip(destinations, arrival[i], strict=True):
            accesses.setdefault(tile, []).append((at, at + size, i, True, cycle, cycle + words))
    for tile, items in accesses.items():
        items.sort()
        active: list[tuple[int, int, int, bool, int, int]] = []
        for item in items:
            active = [a for a in active if a[1] > item[0]]
            for other in active:
                if not (item[3] or other[3]) or item[2] == other[2]:
                    continue
                early, late = (other, item) if other[2] < item[2] else (item, other)
                if late[4] < early[5]:
                    return (
                        f"transfer {late[2]} touches tile {tile} at cycle {late[4]} before "
                        f"transfer {early[2]} (overlapping bytes, earlier in program order) "
                        f"finishes there at cycle {early[5]}"
                    )
            active.append(item)
    return None


@st.composite
def _cases(draw: st.DrawFn) -> tuple[list[tuple[int, int, list[tuple[int, int]], int]], ...]:
    tiles = draw(st.integers(2, 5))
    count = draw(st.integers(1, 8))
    transfers = []
    send = []
    arrival = []
    for _ in range(count):
        source = draw(st.integers(0, tiles - 1))
        others = [t for t in range(tiles) if t != source]
        chosen = draw(st.lists(st.sampled_from(others), min_size=1, max_size=3, unique=True))
        words = draw(st.integers(1, 6))
        address = WORD * draw(st.integers(0, 12))
        destinations = [(tile, WORD * draw(st.integers(0, 12))) for tile in chosen]
        transfers.append((source, address, destinations, words))
        cycle = draw(st.integers(0, 30))
        send.append(cycle)
        arrival.append([cycle + draw(st.integers(0, 4)) for _ in chosen])
    return transfers, send, arrival


def _vectorised(
    transfers: list[tuple[int, int, list[tuple[int, int]], int]],
    send: list[int],
    arrival: list[list[int]],
) -> str | None:
    count = len(transfers)
    words = np.asarray([t[3] for t in transfers], dtype=np.int64)
    fanout = np.asarray([len(t[2]) for t in transfers], dtype=np.int64)
    destination_start = np.concatenate(([0], np.cumsum(fanout))).astype(np.int64)
    owners = np.repeat(np.arange(count, dtype=np.int64), fanout)
    columns = (
        np.asarray([t[0] for t in transfers], dtype=np.int64),
        np.asarray([t[1] for t in transfers], dtype=np.int64),
        words * WORD,
        np.asarray([d[0] for t in transfers for d in t[2]], dtype=np.int64),
        np.asarray([d[1] for t in transfers for d in t[2]], dtype=np.int64),
    )
    sends = np.asarray(send, dtype=np.int64)
    arrivals = np.asarray([c for row in arrival for c in row], dtype=np.int64)
    try:
        _check_dependencies(
            columns,
            np.arange(count, dtype=np.int64),
            sends,
            sends + words,
            owners,
            np.arange(owners.size, dtype=np.int64),
            destination_start,
            arrivals,
            arrivals + words[owners],
        )
    except ScheduleError as err:
        return str(err)
    return None


@SETTINGS
@given(_cases())
def test_vectorised_dependency_check_matches_the_sweep(case: tuple) -> None:
    transfers, send, arrival = case
    assert _vectorised(transfers, send, arrival) == _reference(transfers, send, arrival)


def test_a_mutated_cycle_is_caught() -> None:
    # Transfer 0 writes tile 1 at 0x40; transfer 1 then reads those bytes from tile 1.
    transfers = [(0, 0, [(1, 64)], 4), (1, 64, [(2, 0)], 4)]
    assert _vectorised(transfers, [0, 4], [[0], [4]]) is None
    message = _vectorised(transfers, [0, 3], [[0], [3]])
    assert message is not None and message.startswith("transfer 1 touches tile 1 at cycle 3")

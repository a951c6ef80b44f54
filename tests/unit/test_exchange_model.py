"""Exchange phase model: validation, loads, arrays, latency models."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.errors import ScheduleError
from ipu_stack.exchange.model import (
    LATENCY_MODELS,
    ExchangePhase,
    Piece,
    Transfer,
    latency_model,
    phase_arrays,
    words_received,
    words_sent,
    zero_latency,
)
from ipu_stack.target.ipu21 import TILES

BASE = 0x60000


def unicast(source: int, dest: int, words: int) -> Transfer:
    return Transfer(source, BASE, ((dest, BASE),), words)


def test_default_tile_count_is_the_machine() -> None:
    assert ExchangePhase(()).tile_count == TILES


def test_valid_phase_passes() -> None:
    phase = ExchangePhase(
        (unicast(0, 1, 3), Transfer(2, BASE + 4, ((0, BASE), (1, BASE + 8)), 5)), tile_count=3
    )
    phase.validate()  # must not raise
    assert phase.transfers[1].destination_tiles == (0, 1)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (unicast(0, 1, 0), "transfer 1: words must be positive"),
        (unicast(0, 1, -3), "transfer 1: words must be positive"),
        (unicast(4, 1, 2), "transfer 1: source tile 4 outside 0..3"),
        (unicast(-1, 1, 2), "transfer 1: source tile -1 outside"),
        (unicast(0, 4, 2), "transfer 1: destination tile 4 outside"),
        (unicast(2, 2, 2), "transfer 1: destination tile 2 is the source"),
        (
            Transfer(0, BASE, ((1, BASE), (1, BASE + 4)), 2),
            "transfer 1: destination tile 1 appears",
        ),
        (Transfer(0, BASE + 2, ((1, BASE),), 2), "transfer 1: source address 0x60002"),
        (Transfer(0, BASE, ((1, BASE + 6),), 2), "transfer 1: destination address on tile 1"),
        (Transfer(0, BASE, (), 2), "transfer 1: no destinations"),
    ],
)
def test_validate_names_the_bad_transfer(bad: Transfer, message: str) -> None:
    phase = ExchangePhase((unicast(0, 1, 1), bad), tile_count=4)
    with pytest.raises(ScheduleError, match=message):
        phase.validate()


def test_loads_count_multicast_once_on_the_sender() -> None:
    phase = ExchangePhase(
        (
            Transfer(0, BASE, ((1, BASE), (2, BASE), (3, BASE)), 10),
            unicast(1, 2, 4),
            unicast(1, 0, 6),
        ),
        tile_count=5,
    )
    assert words_sent(phase).tolist() == [10, 10, 0, 0, 0]
    assert words_received(phase).tolist() == [6, 10, 14, 10, 0]
    assert words_sent(phase).dtype == np.int64


def test_loads_of_an_empty_phase_are_zero() -> None:
    phase = ExchangePhase((), tile_count=3)
    assert words_sent(phase).tolist() == [0, 0, 0]
    assert words_received(phase).tolist() == [0, 0, 0]


def test_phase_arrays_are_csr() -> None:
    phase = ExchangePhase(
        (Transfer(3, BASE, ((1, BASE), (2, BASE)), 7), unicast(0, 3, 2)), tile_count=4
    )
    arrays = phase_arrays(phase)
    assert arrays.sources.tolist() == [3, 0]
    assert arrays.words.tolist() == [7, 2]
    assert arrays.destination_starts.tolist() == [0, 2, 3]
    assert arrays.destination_tiles.tolist() == [1, 2, 3]
    assert arrays.destination_transfers.tolist() == [0, 0, 1]
    assert arrays.fanouts.tolist() == [2, 1]


def test_latency_models() -> None:
    assert latency_model("none") is zero_latency
    assert "none" in LATENCY_MODELS
    cycles = zero_latency(np.array([1, 2, 3]), np.array([4, 5, 6]))
    assert cycles.tolist() == [0, 0, 0]
    with pytest.raises(ScheduleError, match="unknown latency model 'ttm'"):
        latency_model("ttm")


def test_piece_send_end_and_frozen() -> None:
    piece = Piece(send_cycle=5, offset_words=2, words=3)
    assert piece.send_end == 8
    with pytest.raises(AttributeError):
        piece.words = 4  # type: ignore[misc]

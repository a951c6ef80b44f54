"""The vectorised phase validation finds the same first malformed transfer, with the same
message, as checking every transfer one by one (random phases, most transfers well formed,
some with one defect of each kind)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipu_stack.errors import ScheduleError
from ipu_stack.exchange.model import PAIRED64, ExchangePhase, Transfer, _validate_transfer
from ipu_stack.target.ipu21 import TILE_MEMORY_BASE, TILE_MEMORY_END

TILES = 8
GOOD_ADDRESSES = [TILE_MEMORY_BASE, TILE_MEMORY_BASE + 8, 0x80000]
DEFECTS = [
    lambda t, d: replace(t, words=d.draw(st.sampled_from([0, -3]))),
    lambda t, d: replace(t, source=d.draw(st.sampled_from([-1, TILES]))),
    lambda t, d: replace(t, source_address=d.draw(st.sampled_from([TILE_MEMORY_BASE + 2, 0]))),
    lambda t, d: replace(t, source_address=TILE_MEMORY_END - 4 * t.words + 4),
    lambda t, d: replace(t, destinations=()),
    lambda t, d: replace(t, destinations=(*t.destinations, (TILES, TILE_MEMORY_BASE))),
    lambda t, d: replace(t, destinations=(*t.destinations, (t.source, TILE_MEMORY_BASE))),
    lambda t, d: replace(t, destinations=(*t.destinations, t.destinations[-1])),
    lambda t, d: replace(t, destinations=((t.destinations[0][0], TILE_MEMORY_BASE - 4),)),
    lambda t, d: replace(t, width=d.draw(st.sampled_from([PAIRED64, "word16"]))),
]


@st.composite
def transfers(draw: st.DrawFn) -> Transfer:
    source = draw(st.integers(0, TILES - 1))
    others = [tile for tile in range(TILES) if tile != source]
    tiles = draw(st.lists(st.sampled_from(others), min_size=1, max_size=4, unique=True))
    transfer = Transfer(
        source,
        draw(st.sampled_from(GOOD_ADDRESSES)),
        tuple((tile, draw(st.sampled_from(GOOD_ADDRESSES))) for tile in tiles),
        draw(st.integers(1, 64)),
    )
    defect = draw(st.integers(-len(DEFECTS), len(DEFECTS) - 1))  # half the time none
    return DEFECTS[defect](transfer, _Draw(draw)) if defect >= 0 else transfer


class _Draw:
    """Gives the defects ``d.draw``."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw


def _first_error(phase: ExchangePhase) -> str | None:
    for index, transfer in enumerate(phase.transfers):
        try:
            _validate_transfer(index, transfer, phase.tile_count)
        except ScheduleError as err:
            return str(err)
    return None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(transfers(), max_size=10))
def test_vectorised_validation_matches_the_transfer_by_transfer_check(items):
    phase = ExchangePhase(tuple(items), TILES)
    expected = _first_error(phase)
    try:
        phase.validate()
    except ScheduleError as err:
        assert str(err) == expected
    else:
        assert expected is None

"""C600 tile topology: the logical-to-physical tile map and pairwise exchange latency.

Formulas follow `shared/docs/ipu21-facts.md` §8.3 (tile map) and §8.4 (`time_to_mux`), both
tagged [T]: taken from the reference implementation's reverse-engineered topology code, so
treat them as unverified against hardware.

Every function accepts either a Python ``int`` (and then returns a Python scalar) or an integer
numpy array (and then returns an array, broadcasting two-argument functions). Arguments are
physical tile ids unless the name says ``logical``.
"""

from __future__ import annotations

from typing import Any, overload

import numpy as np
import numpy.typing as npt

from ipu_stack.target.ipu21 import TILES

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
IntLike = int | np.integer[Any]
ArrayInput = npt.NDArray[np.integer[Any]]

# --- Physical geometry (facts §8.3 [T]) ----------------------------------------------------
PHYSICAL_ROWS = 23  # physical id = row * PHYSICAL_COLUMNS + column
PHYSICAL_COLUMNS = 64
PAIRS_PER_BLOCK = 23  # a block of pairs fills one column pair, top to bottom
PAIR_PARTNER_BIT = 2  # the paired tile is phys ^ 2
LOGICAL_PAIR_BIT = 1  # facts §8.3: logical tiles 2p and 2p + 1 sit on one physical pair
REGION_BIT = 0x20  # tiles in the same "region" agree on this bit (facts §8.4)

# --- time_to_mux constants (facts §8.4 [T]) ------------------------------------------------
DISPLACEMENT_CYCLES_PER_COLUMN = 6
GROUP_CYCLES_PER_ROW = 2
TIME_TO_MUX_OFFSET = 34
#: The smallest ``time_to_mux`` over all ordered pairs of distinct C600 tiles (computed from the
#: facts §8.4 [T] formula; the test suite recomputes it).
MIN_TIME_TO_MUX = -78

# --- Absolute exchange timing (facts §8.5 and §9 "Timing and field facts" [T]) --------------
# The reference's point-to-point plan starts the sender ``111 - time_to_mux`` events into the
# phase and selects the source on the receiver (XPIC) at event 112: a word sent at cycle t is
# at the receiver's mux at ``t + time_to_mux`` and the XPIC that takes it acts one cycle later.
# The payload is then written ``52 + 2 x (physical row of the receiver)`` events after that
# source select (the PIC pointer event, 51 + 2 x row, is the cycle before it).
MUX_SELECT_AFTER_ARRIVAL = 1
PAYLOAD_AFTER_MUX_SELECT = 52
PAYLOAD_CYCLES_PER_ROW = 2
#: Fabric directions as the send-control bits name them.
DIRECTION_ONE = 1
DIRECTION_TWO = 2


def _as_array(x: IntLike | ArrayInput) -> IntArray:
    return np.asarray(x, dtype=np.int64)


def _check_range(values: IntArray, what: str) -> None:
    if values.size and (values.min() < 0 or values.max() >= TILES):
        bad = values[(values < 0) | (values >= TILES)].flat[0]
        raise ValueError(f"{what} tile id {int(bad)} outside 0..{TILES - 1}")


def _logical_to_physical_array(logical: IntArray) -> IntArray:
    pair = logical >> 1
    lane = logical & 1
    block = pair // PAIRS_PER_BLOCK
    row = pair % PAIRS_PER_BLOCK
    # Odd blocks run bottom to top so consecutive blocks meet at the same row (snake order).
    row = np.where(block & 1, PAIRS_PER_BLOCK - 1 - row, row)
    column = (block >> 1) * 4 + (block & 1)
    return row * PHYSICAL_COLUMNS + column + lane * PAIR_PARTNER_BIT


_LOGICAL_TO_PHYSICAL: IntArray = _logical_to_physical_array(np.arange(TILES, dtype=np.int64))
_PHYSICAL_TO_LOGICAL: IntArray = np.empty(TILES, dtype=np.int64)
_PHYSICAL_TO_LOGICAL[_LOGICAL_TO_PHYSICAL] = np.arange(TILES, dtype=np.int64)
_LOGICAL_TO_PHYSICAL.setflags(write=False)
_PHYSICAL_TO_LOGICAL.setflags(write=False)


@overload
def logical_to_physical(logical: IntLike) -> int: ...
@overload
def logical_to_physical(logical: ArrayInput) -> IntArray: ...
def logical_to_physical(logical: IntLike | ArrayInput) -> int | IntArray:
    """Map logical tile ids to C600 physical tile ids (facts §8.3).

    Args:
        logical: logical tile id(s) in ``0..TILES-1``.

    Returns:
        The physical id(s), same shape as the input.

    Raises:
        ValueError: if an id is out of range.
    """
    values = _as_array(logical)
    _check_range(values, "logical")
    result = _LOGICAL_TO_PHYSICAL[values]
    return int(result) if result.ndim == 0 else result


@overload
def physical_to_logical(physical: IntLike) -> int: ...
@overload
def physical_to_logical(physical: ArrayInput) -> IntArray: ...
def physical_to_logical(physical: IntLike | ArrayInput) -> int | IntArray:
    """Inverse of :func:`logical_to_physical`, by table lookup.

    Args:
        physical: physical tile id(s) in ``0..TILES-1``.

    Returns:
        The logical id(s), same shape as the input.

    Raises:
        ValueError: if an id is out of range.
    """
    values = _as_array(physical)
    _check_range(values, "physical")
    result = _PHYSICAL_TO_LOGICAL[values]
    return int(result) if result.ndim == 0 else result


@overload
def paired_tile(physical: IntLike) -> int: ...
@overload
def paired_tile(physical: ArrayInput) -> IntArray: ...
def paired_tile(physical: IntLike | ArrayInput) -> int | IntArray:
    """The other tile of a physical pair: ``phys ^ 2`` (facts §8.3)."""
    values = _as_array(physical)
    _check_range(values, "physical")
    result = values ^ PAIR_PARTNER_BIT
    return int(result) if result.ndim == 0 else result


@overload
def is_pair_primary(physical: IntLike) -> bool: ...
@overload
def is_pair_primary(physical: ArrayInput) -> BoolArray: ...
def is_pair_primary(physical: IntLike | ArrayInput) -> bool | BoolArray:
    """Whether a tile is the primary of its physical pair (``phys & 2 == 0``, facts §8.3)."""
    values = _as_array(physical)
    _check_range(values, "physical")
    result = (values & PAIR_PARTNER_BIT) == 0
    return bool(result) if result.ndim == 0 else result


def _raw(x: IntArray) -> IntArray:
    return (x >> 2) & 15


def _folded_column(raw: IntArray) -> IntArray:
    return np.where(raw > 7, raw ^ 15, raw)


def _displacement(s: IntArray, d: IntArray) -> IntArray:
    """Signed route displacement from source to destination in fabric steps (facts §8.4)."""
    raw_s = _raw(s)
    raw_d = _raw(d)
    source_mux = _folded_column(raw_s) + ((raw_s >> 3) ^ (s & 1))
    lane = d & 3
    half = raw_d >> 3
    extra = np.where(
        lane > 1,
        np.where(half == (d & 1), 2, 4),
        np.where(half == lane, 1, 5),
    )
    return (_folded_column(raw_d) - source_mux) * DISPLACEMENT_CYCLES_PER_COLUMN + extra


def _pair_arrays(
    source: IntLike | ArrayInput, dest: IntLike | ArrayInput
) -> tuple[IntArray, IntArray, bool]:
    s = _as_array(source)
    d = _as_array(dest)
    _check_range(s, "source")
    _check_range(d, "destination")
    s, d = np.broadcast_arrays(s, d)
    return s, d, s.ndim == 0


@overload
def direction(source: IntLike, dest: IntLike) -> int: ...
@overload
def direction(source: ArrayInput | IntLike, dest: ArrayInput) -> IntArray: ...
@overload
def direction(source: ArrayInput, dest: ArrayInput | IntLike) -> IntArray: ...
def direction(source: IntLike | ArrayInput, dest: IntLike | ArrayInput) -> int | IntArray:
    """Fabric direction (1 or 2) a send from ``source`` to ``dest`` takes (facts §8.4).

    Args:
        source: physical source tile id(s).
        dest: physical destination tile id(s); broadcast against ``source``.

    Returns:
        ``2`` where the displacement is below 1, else ``1``.
    """
    s, d, scalar = _pair_arrays(source, dest)
    result = np.where(_displacement(s, d) < 1, DIRECTION_TWO, DIRECTION_ONE).astype(np.int64)
    return int(result) if scalar else result


#: Below this many pairs, :func:`_time_to_mux_array` evaluates the formula; above, it reads
#: the formula's table over every (source, destination) pair, made once per process.
_TABLE_FROM = 4096
_TIME_TO_MUX_TABLE: list[IntArray] = []


def _time_to_mux_array(s: IntArray, d: IntArray) -> IntArray:
    """:func:`time_to_mux` of in-range arrays (a large phase's pairs from a table)."""
    if s.size < _TABLE_FROM:
        return _time_to_mux_formula(s, d)
    if not _TIME_TO_MUX_TABLE:
        sources, dests = np.divmod(np.arange(TILES * TILES, dtype=np.int64), TILES)
        _TIME_TO_MUX_TABLE.append(_time_to_mux_formula(sources, dests).astype(np.int16))
    return _TIME_TO_MUX_TABLE[0][s * TILES + d].astype(np.int64)


def _time_to_mux_formula(s: IntArray, d: IntArray) -> IntArray:
    raw_s = _raw(s)
    raw_d = _raw(d)
    edge_s = np.where(raw_s > 7, (raw_s * 4) ^ 60, raw_s * 4)
    edge_d = np.where(raw_d > 7, (raw_d * 4) ^ 60, raw_d * 4)
    low_s = (s >> 2) & 7
    local = ((s >> 2) & 8) | ((s >> 3) & 3)
    crossing = local - raw_d + ((low_s >> 1) ^ 3)
    same_region = ((s ^ d) & REGION_BIT) == 0
    turn = np.where(same_region, low_s + 1, 16 - low_s)
    group_delta = (((s >> 6) & 31) - ((d >> 6) & 31)) * GROUP_CYCLES_PER_ROW
    displacement = np.abs(_displacement(s, d))
    return crossing + edge_s + turn - edge_d + group_delta + displacement - TIME_TO_MUX_OFFSET


@overload
def time_to_mux(source: IntLike, dest: IntLike) -> int: ...
@overload
def time_to_mux(source: ArrayInput | IntLike, dest: ArrayInput) -> IntArray: ...
@overload
def time_to_mux(source: ArrayInput, dest: ArrayInput | IntLike) -> IntArray: ...
def time_to_mux(source: IntLike | ArrayInput, dest: IntLike | ArrayInput) -> int | IntArray:
    """Relative cycles from a send on ``source`` to the data at ``dest``'s mux (facts §8.4).

    The value is relative (it can be negative, range about -78..+111); only differences and
    the reference implementation's fixed sender/receiver offsets give absolute times.

    Args:
        source: physical source tile id(s).
        dest: physical destination tile id(s); broadcast against ``source``.

    Returns:
        The latency in cycles, same (broadcast) shape as the inputs.
    """
    s, d, scalar = _pair_arrays(source, dest)
    result = _time_to_mux_array(s, d)
    return int(result) if scalar else result


@overload
def paired_time_to_mux(source: IntLike, dest: IntLike) -> int: ...
@overload
def paired_time_to_mux(source: ArrayInput | IntLike, dest: ArrayInput) -> IntArray: ...
@overload
def paired_time_to_mux(source: ArrayInput, dest: ArrayInput | IntLike) -> IntArray: ...
def paired_time_to_mux(source: IntLike | ArrayInput, dest: IntLike | ArrayInput) -> int | IntArray:
    """Latency of a paired (64-bit) receive: the slower of ``dest`` and its partner (§8.4)."""
    s, d, scalar = _pair_arrays(source, dest)
    result = np.maximum(_time_to_mux_array(s, d), _time_to_mux_array(s, d ^ PAIR_PARTNER_BIT))
    return int(result) if scalar else result


@overload
def mux_lead(dest: IntLike) -> int: ...
@overload
def mux_lead(dest: ArrayInput) -> IntArray: ...
def mux_lead(dest: IntLike | ArrayInput) -> int | IntArray:
    """Cycles from a receiver's source select (XPIC) to the payload's write on ``dest``:
    ``52 + 2 x (physical row)`` (facts §9 [T]); the same for both tiles of a pair."""
    d = _as_array(dest)
    _check_range(d, "destination")
    result = _lead_array(d)
    return int(result) if d.ndim == 0 else result


def _lead_array(d: IntArray) -> IntArray:
    return PAYLOAD_AFTER_MUX_SELECT + PAYLOAD_CYCLES_PER_ROW * (d // PHYSICAL_COLUMNS)


@overload
def exchange_latency(source: IntLike, dest: IntLike) -> int: ...
@overload
def exchange_latency(source: ArrayInput | IntLike, dest: ArrayInput) -> IntArray: ...
@overload
def exchange_latency(source: ArrayInput, dest: ArrayInput | IntLike) -> IntArray: ...
def exchange_latency(source: IntLike | ArrayInput, dest: IntLike | ArrayInput) -> int | IntArray:
    """Cycles from a word leaving ``source`` to its write into ``dest``'s memory.

    ``time_to_mux + 1 + mux_lead(dest)``: the word is at the mux after ``time_to_mux``
    (§8.4), the XPIC that selects it acts one cycle later and the payload is written
    :func:`mux_lead` cycles after that (facts §8.5, §9 [T]). Over all C600 pairs 19..165.
    """
    s, d, scalar = _pair_arrays(source, dest)
    result = _time_to_mux_array(s, d) + MUX_SELECT_AFTER_ARRIVAL + _lead_array(d)
    return int(result) if scalar else result


@overload
def paired_exchange_latency(source: IntLike, dest: IntLike) -> int: ...
@overload
def paired_exchange_latency(source: ArrayInput | IntLike, dest: ArrayInput) -> IntArray: ...
@overload
def paired_exchange_latency(source: ArrayInput, dest: ArrayInput | IntLike) -> IntArray: ...
def paired_exchange_latency(
    source: IntLike | ArrayInput, dest: IntLike | ArrayInput
) -> int | IntArray:
    """Latency of a paired (64-bit) receive on ``dest``'s pair: the slower of the two tiles
    (``paired_time_to_mux + 1 + mux_lead(dest)``; both tiles share a physical row)."""
    s, d, scalar = _pair_arrays(source, dest)
    ttm = np.maximum(_time_to_mux_array(s, d), _time_to_mux_array(s, d ^ PAIR_PARTNER_BIT))
    result = ttm + MUX_SELECT_AFTER_ARRIVAL + _lead_array(d)
    return int(result) if scalar else result

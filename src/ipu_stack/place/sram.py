"""SRAM allocation for one IPU21 tile.

The planner hands this module the buffers one tile needs, each with a size, an alignment, a
memory region and a live interval of program steps, and gets back byte addresses. Buffers whose
live intervals do not intersect may share bytes, so dead buffers' space is reused.

Memory map (``ipu_stack.target.ipu21``, facts §4.4/§4.5):

* **standard** data: ``[STANDARD_DATA_BASE, INTERLEAVED_BASE - reservation)``. The support
  reservation (runtime code, exchange row tables, host programs, profile samples; default
  ``DEFAULT_SUPPORT_RESERVATION_BYTES``) is carved from the *top* of the standard region, directly
  below ``INTERLEAVED_BASE``. Those support allocations must sit below ``0x80000`` because only
  region 0 fetches instructions, and putting them in one contiguous block at the top keeps the
  data arena contiguous and leaves the reservation element-aligned (the default is three whole
  16 KiB elements ending at the 16 KiB-aligned interleaved base), so support code never shares an
  element with data.
* **interleaved** data: ``[INTERLEAVED_BASE, LOADER_LIMIT)``.
* ``RESERVED_RANGES`` are subtracted from both and never allocated.

With the default reservation the usable bytes are 112,928 standard (0x586E0..0x74000) and
424,880 interleaved (0x80000..0xE7BB0).

Memory elements (facts §5.4): a standard element is 16 KiB, index ``addr // 0x4000``; in the
interleaved region the unit is a 32 KiB element pair, index ``(addr - 0x80000) // 0x8000``.

Algorithm: lifetime-aware first-fit in order of decreasing size (ties broken by name). Each
buffer is placed at the lowest suitably aligned address that overlaps no already-placed buffer
whose live interval intersects its own. ``Region.ANY`` buffers try the standard region first,
keeping the interleaved region (needed by ``ld128`` / AMP accumulators) for buffers that must be
there. If that ordering fails, a second deterministic ordering that places region-constrained
buffers before ``ANY`` buffers is tried before reporting the first failure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from ipu_stack.errors import PlanError
from ipu_stack.target.ipu21 import (
    DEFAULT_SUPPORT_RESERVATION_BYTES,
    ELEMENT_BYTES,
    INTERLEAVED_BASE,
    INTERLEAVED_ELEMENT_BYTES,
    LOADER_LIMIT,
    RESERVED_RANGES,
    STANDARD_DATA_BASE,
    TILE_MEMORY_BASE,
    TILE_MEMORY_END,
)

__all__ = [
    "FOREVER",
    "BufferRequest",
    "Region",
    "allocate_tile",
    "element_of",
    "region_peaks",
    "usable_bytes",
    "usable_ranges",
    "verify_allocation",
]

#: A live-interval end meaning "until the end of the program".
FOREVER = 1 << 62

_Interval = tuple[int, int]


class Region(StrEnum):
    """Where in tile memory a buffer may be placed."""

    #: Below ``INTERLEAVED_BASE`` (region 0, interleave factor 1).
    STANDARD = "standard"
    #: ``[INTERLEAVED_BASE, LOADER_LIMIT)`` (region 1, interleave factor 2).
    INTERLEAVED = "interleaved"
    #: Either region; the whole buffer lies in one of them.
    ANY = "any"


@dataclass(frozen=True, slots=True)
class BufferRequest:
    """One buffer a tile needs.

    Attributes:
        name: Unique name within the tile.
        size: Size in bytes, > 0.
        alignment: Byte alignment of the start address; a power of two >= 4.
        region: Region the buffer must lie in.
        live: Half-open interval ``[first, end)`` of program step indices during which the buffer
            must not be overwritten. Buffers whose intervals do not intersect may share bytes.
        exclusive_element: If true, no other simultaneously-live buffer may share any memory
            element (16 KiB, or 32 KiB element pair when interleaved) with this one. The
            allocation is rounded up to whole elements and element-aligned.
        avoid_element_of: Names of other buffers on the tile that must not share a memory
            element with this one while both are live (the relation is symmetric).
    """

    name: str
    size: int
    alignment: int = 8
    region: Region = Region.ANY
    live: tuple[int, int] = (0, FOREVER)
    exclusive_element: bool = False
    avoid_element_of: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size <= 0:
            raise PlanError(f"buffer {self.name!r}: size must be a positive int, got {self.size!r}")
        a = self.alignment
        if not isinstance(a, int) or a < 4 or a & (a - 1):
            raise PlanError(
                f"buffer {self.name!r}: alignment must be a power of two >= 4, got {a!r}"
            )
        if self.region.__class__ is not Region:  # a member needs no lookup
            try:
                region = Region(self.region)
            except ValueError:
                raise PlanError(
                    f"buffer {self.name!r}: unknown region {self.region!r}; "
                    f"expected one of {', '.join(r.value for r in Region)}"
                ) from None
            object.__setattr__(self, "region", region)
        live = self.live
        if not (  # the common case, a pair of plain ints in order, is kept as it is
            live.__class__ is tuple
            and len(live) == 2
            and live[0].__class__ is int
            and live[1].__class__ is int
            and live[0] < live[1]
        ):
            given = tuple(self.live)
            if (
                len(given) != 2
                or not all(isinstance(x, int) for x in given)
                or given[0] >= given[1]
            ):
                raise PlanError(
                    f"buffer {self.name!r}: live must be a non-empty half-open interval "
                    f"(start, end) of ints, got {self.live!r}"
                )
            object.__setattr__(self, "live", (given[0], given[1]))
        if self.avoid_element_of.__class__ is not tuple:
            object.__setattr__(self, "avoid_element_of", tuple(self.avoid_element_of))


# --- Memory map helpers ----------------------------------------------------------------------


def _subtract(ranges: Iterable[_Interval], holes: Iterable[_Interval]) -> list[_Interval]:
    """Return ``ranges`` minus ``holes``, sorted, empty pieces dropped."""
    out = sorted(r for r in ranges if r[0] < r[1])
    for h_lo, h_hi in holes:
        nxt: list[_Interval] = []
        for lo, hi in out:
            if h_hi <= lo or h_lo >= hi:
                nxt.append((lo, hi))
                continue
            if lo < h_lo:
                nxt.append((lo, h_lo))
            if h_hi < hi:
                nxt.append((h_hi, hi))
        out = nxt
    return out


def _check_reservation(reservation: int) -> None:
    limit = INTERLEAVED_BASE - STANDARD_DATA_BASE
    if not isinstance(reservation, int) or not 0 <= reservation <= limit:
        raise PlanError(
            f"support reservation must be between 0 and {limit} bytes, got {reservation!r}"
        )


def usable_ranges(
    region: Region | str, *, reservation: int = DEFAULT_SUPPORT_RESERVATION_BYTES
) -> list[_Interval]:
    """The half-open byte ranges data may be allocated into.

    Args:
        region: ``standard``, ``interleaved`` or ``any`` (standard ranges first).
        reservation: Bytes of support reservation at the top of the standard region.

    Returns:
        Sorted, disjoint ``(start, end)`` ranges, with ``RESERVED_RANGES`` removed.
    """
    _check_reservation(reservation)
    region = Region(region)
    standard = _subtract([(STANDARD_DATA_BASE, INTERLEAVED_BASE - reservation)], RESERVED_RANGES)
    interleaved = _subtract([(INTERLEAVED_BASE, LOADER_LIMIT)], RESERVED_RANGES)
    if region is Region.STANDARD:
        return standard
    if region is Region.INTERLEAVED:
        return interleaved
    return standard + interleaved


def usable_bytes(
    region: Region | str, *, reservation: int = DEFAULT_SUPPORT_RESERVATION_BYTES
) -> int:
    """Total bytes available for data in ``region`` (see :func:`usable_ranges`)."""
    return sum(hi - lo for lo, hi in usable_ranges(region, reservation=reservation))


def _element_bytes_at(address: int) -> int:
    return INTERLEAVED_ELEMENT_BYTES if address >= INTERLEAVED_BASE else ELEMENT_BYTES


def element_of(address: int) -> tuple[str, int]:
    """The memory element holding ``address``.

    Returns:
        ``("standard", addr // 0x4000)`` below ``INTERLEAVED_BASE``, otherwise
        ``("interleaved", (addr - INTERLEAVED_BASE) // 0x8000)`` (a 32 KiB element pair).
    """
    if address >= INTERLEAVED_BASE:
        return (Region.INTERLEAVED.value, (address - INTERLEAVED_BASE) // INTERLEAVED_ELEMENT_BYTES)
    return (Region.STANDARD.value, address // ELEMENT_BYTES)


def _elements(address: int, size: int) -> set[tuple[str, int]]:
    """Every memory element the bytes ``[address, address + size)`` touch."""
    out: set[tuple[str, int]] = set()
    a = address
    end = address + size
    while a < end:
        out.add(element_of(a))
        step = _element_bytes_at(a)
        base = INTERLEAVED_BASE if a >= INTERLEAVED_BASE else 0
        a = base + ((a - base) // step + 1) * step
    return out


def _align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def _footprint(req: BufferRequest, address: int) -> int:
    """Bytes a placed buffer occupies (element-rounded for ``exclusive_element``)."""
    if req.exclusive_element:
        return _align_up(req.size, _element_bytes_at(address))
    return req.size


def _lives_intersect(a: _Interval, b: _Interval) -> bool:
    return a[0] < b[1] and b[0] < a[1]


# --- Allocation ----------------------------------------------------------------------------


def _element_span(start: int, end: int) -> _Interval:
    e = _element_bytes_at(start)
    return (start // e * e, _align_up(end, e))


def _first_fit(segment: _Interval, blocked: list[_Interval], size: int, align: int) -> int | None:
    """Lowest ``align``-aligned start in ``segment`` whose ``size`` bytes avoid ``blocked``.

    ``blocked`` must be sorted by start.
    """
    lo, hi = segment
    cand = _align_up(lo, align)
    for b_lo, b_hi in blocked:
        if cand + size > hi:
            return None
        if b_hi <= cand:
            continue
        if b_lo >= cand + size:
            break
        cand = _align_up(b_hi, align)
    return cand if cand + size <= hi else None


def _free_space(segment: _Interval, blocked: list[_Interval], align: int) -> tuple[int, int]:
    """(free bytes, largest ``align``-aligned hole) in ``segment`` outside ``blocked``."""
    lo, hi = segment
    free = 0
    largest = 0
    cursor = lo
    for b_lo, b_hi in [*blocked, (hi, hi)]:
        # clipped to the segment: a blocked range past its end frees nothing beyond it
        b_lo, b_hi = min(max(b_lo, lo), hi), max(min(b_hi, hi), lo)
        if b_lo > cursor:
            free += b_lo - cursor
            largest = max(largest, b_lo - _align_up(cursor, align))
        cursor = max(cursor, b_hi)
    return free, largest


def _placement_params(req: BufferRequest, segment: _Interval) -> tuple[int, int]:
    """(footprint, alignment) for ``req`` inside ``segment``."""
    if req.exclusive_element:
        e = _element_bytes_at(segment[0])
        return _align_up(req.size, e), max(req.alignment, e)
    return req.size, req.alignment


def _avoids(a: BufferRequest, b: BufferRequest) -> bool:
    return b.name in a.avoid_element_of or a.name in b.avoid_element_of


def _try_order(
    order: Sequence[BufferRequest], segments: Mapping[Region, list[_Interval]]
) -> tuple[dict[str, int], None] | tuple[None, PlanError]:
    # placed buffers as plain tuples (no attribute loads in the scan): live first, live end,
    # start, end (start + footprint), [start, end) rounded out to whole elements, name, and
    # the names it avoids
    placed: list[tuple[int, int, int, int, _Interval, str, tuple[str, ...]]] = []
    out: dict[str, int] = {}
    for req in order:
        lo, hi = req.live
        name, avoid = req.name, req.avoid_element_of
        blocked = [
            span if (p_name in avoid or name in p_avoid) else (start, end)
            for p_lo, p_hi, start, end, span, p_name, p_avoid in placed
            if p_lo < hi and lo < p_hi  # lives intersect
        ]
        blocked.sort()
        address: int | None = None
        for seg in segments[req.region]:
            size, align = _placement_params(req, seg)
            address = _first_fit(seg, blocked, size, align)
            if address is not None:
                break
        if address is None:
            return None, _failure(req, segments[req.region], blocked)
        end = address + _placement_params(req, (address, address))[0]
        placed.append((lo, hi, address, end, _element_span(address, end), name, avoid))
        out[name] = address
    return out, None


def _failure(req: BufferRequest, segs: list[_Interval], blocked: list[_Interval]) -> PlanError:
    free = 0
    largest = 0
    footprint = req.size
    shortfall: int | None = None
    for seg in segs:
        size, align = _placement_params(req, seg)
        seg_free, seg_largest = _free_space(seg, blocked, align)
        free += seg_free
        if shortfall is None or size - seg_largest < shortfall:
            shortfall, largest, footprint = size - seg_largest, seg_largest, size
    shortfall = max(shortfall or footprint, 1)
    rounded = f", {footprint} B after element rounding" if footprint != req.size else ""
    frag = (
        f"; {free} B free in total but fragmented, largest suitably aligned hole {largest} B"
        if free >= footprint
        else f"; largest suitably aligned hole {largest} B"
    )
    return PlanError(
        f"SRAM: buffer {req.name!r} ({req.size} B{rounded}, alignment {req.alignment}) does not "
        f"fit in the {req.region.value} region: {free} B free there during steps "
        f"[{req.live[0]}, {req.live[1]}){frag}; short by {shortfall} B"
    )


def _check_requests(requests: Sequence[BufferRequest]) -> None:
    names: set[str] = set()
    for r in requests:
        if r.name in names:
            raise PlanError(f"SRAM: duplicate buffer name {r.name!r}")
        names.add(r.name)
    for r in requests:
        for other in r.avoid_element_of:
            if other not in names:
                raise PlanError(
                    f"SRAM: buffer {r.name!r} avoids the element of unknown buffer {other!r}"
                )


def allocate_tile(
    requests: Sequence[BufferRequest], *, reservation: int = DEFAULT_SUPPORT_RESERVATION_BYTES
) -> dict[str, int]:
    """Assign a byte address to every buffer of one tile.

    Lifetime-aware first-fit by decreasing size (ties by name): buffers only conflict with
    already-placed buffers whose live intervals intersect theirs, so space is reused once a
    buffer is dead. The result is deterministic for a given request list (its order does not
    matter).

    Args:
        requests: The tile's buffers; names must be unique.
        reservation: Support reservation in bytes at the top of the standard region.

    Returns:
        ``{name: address}`` for every request.

    Raises:
        PlanError: A buffer does not fit. The message names the buffer, its size, its region, the
            bytes free there during its lifetime and the shortfall in bytes.
    """
    _check_requests(requests)
    segments = {r: usable_ranges(r, reservation=reservation) for r in Region}
    by_size = sorted(requests, key=lambda r: (-r.size, r.name))
    result, error = _try_order(by_size, segments)
    if result is not None:
        return result
    rank = {Region.STANDARD: 0, Region.INTERLEAVED: 0, Region.ANY: 1}
    constrained_first = sorted(by_size, key=lambda r: rank[r.region])
    if constrained_first != by_size:
        retry, _ = _try_order(constrained_first, segments)
        if retry is not None:
            return retry
    assert error is not None
    raise error


# --- Verification --------------------------------------------------------------------------


def verify_allocation(
    requests: Sequence[BufferRequest],
    addresses: Mapping[str, int],
    *,
    reservation: int = DEFAULT_SUPPORT_RESERVATION_BYTES,
) -> None:
    """Check an allocation independently of :func:`allocate_tile`.

    Checks that every buffer has an address, lies inside tile memory and the loader limit, is
    aligned (to its element size too if ``exclusive_element``), lies wholly in an allowed region
    and outside ``RESERVED_RANGES`` and the support reservation, that no two simultaneously-live
    buffers overlap in bytes, and that the element constraints hold.

    Args:
        requests: The tile's buffers.
        addresses: ``{name: address}`` to check.
        reservation: Support reservation in bytes at the top of the standard region.

    Raises:
        PlanError: On the first violation found, describing it.
    """
    _check_requests(requests)
    _check_reservation(reservation)
    standard_hi = INTERLEAVED_BASE - reservation
    for r in requests:
        if r.name not in addresses:
            raise PlanError(f"SRAM verify: buffer {r.name!r} has no address")
        a = addresses[r.name]
        end = a + r.size
        if a < TILE_MEMORY_BASE or end > TILE_MEMORY_END:
            raise PlanError(
                f"SRAM verify: {r.name!r} [{a:#x}, {end:#x}) is outside tile memory "
                f"[{TILE_MEMORY_BASE:#x}, {TILE_MEMORY_END:#x})"
            )
        if end > LOADER_LIMIT:
            raise PlanError(
                f"SRAM verify: {r.name!r} ends at {end:#x}, past the loader limit {LOADER_LIMIT:#x}"
            )
        if a % r.alignment:
            raise PlanError(f"SRAM verify: {r.name!r} at {a:#x} is not {r.alignment}-aligned")
        for lo, hi in RESERVED_RANGES:
            if a < hi and lo < end:
                raise PlanError(
                    f"SRAM verify: {r.name!r} [{a:#x}, {end:#x}) overlaps reserved range "
                    f"[{lo:#x}, {hi:#x})"
                )
        in_standard = a >= STANDARD_DATA_BASE and end <= standard_hi
        in_interleaved = a >= INTERLEAVED_BASE and end <= LOADER_LIMIT
        ok = {
            Region.STANDARD: in_standard,
            Region.INTERLEAVED: in_interleaved,
            Region.ANY: in_standard or in_interleaved,
        }[r.region]
        if not ok:
            raise PlanError(
                f"SRAM verify: {r.name!r} [{a:#x}, {end:#x}) is not inside the {r.region.value} "
                f"data region (standard [{STANDARD_DATA_BASE:#x}, {standard_hi:#x}), "
                f"interleaved [{INTERLEAVED_BASE:#x}, {LOADER_LIMIT:#x}))"
            )
        if r.exclusive_element and a % _element_bytes_at(a):
            raise PlanError(
                f"SRAM verify: exclusive-element buffer {r.name!r} at {a:#x} is not aligned to "
                f"its {_element_bytes_at(a)} B memory element"
            )

    elements = {r.name: _elements(addresses[r.name], r.size) for r in requests}
    ordered = sorted(requests, key=lambda r: (addresses[r.name], r.name))
    for i, x in enumerate(ordered):
        xa = addresses[x.name]
        for y in ordered[i + 1 :]:
            if not _lives_intersect(x.live, y.live):
                continue
            ya = addresses[y.name]
            if ya < xa + x.size:
                raise PlanError(
                    f"SRAM verify: {x.name!r} [{xa:#x}, {xa + x.size:#x}) and {y.name!r} "
                    f"[{ya:#x}, {ya + y.size:#x}) overlap while both live "
                    f"(steps {x.live} and {y.live})"
                )
    for i, x in enumerate(requests):
        for y in requests[i + 1 :]:
            if not _lives_intersect(x.live, y.live):
                continue
            why = (
                "exclusive_element"
                if x.exclusive_element or y.exclusive_element
                else "avoid_element_of"
                if _avoids(x, y)
                else None
            )
            if why is None:
                continue
            shared = elements[x.name] & elements[y.name]
            if shared:
                region, idx = min(shared)
                raise PlanError(
                    f"SRAM verify: {x.name!r} and {y.name!r} share {region} memory element "
                    f"{idx} while both live, violating {why}"
                )


def region_peaks(requests: Sequence[BufferRequest], addresses: Mapping[str, int]) -> dict[str, int]:
    """Peak simultaneously-live bytes per region for a placed tile.

    Bytes are footprints: ``exclusive_element`` buffers count their element-rounded size, since
    that is what they occupy. The region of a buffer is where it was placed.

    Args:
        requests: The tile's buffers.
        addresses: Their addresses, as returned by :func:`allocate_tile`.

    Returns:
        ``standard_peak_bytes``, ``interleaved_peak_bytes`` (maxima over program steps of the
        live bytes in each region) and ``largest_standard_bytes`` (the largest single footprint
        placed in the standard region; 0 if none).
    """
    events: dict[str, list[tuple[int, int]]] = {"standard": [], "interleaved": []}
    largest_standard = 0
    for r in requests:
        a = addresses[r.name]
        fp = _footprint(r, a)
        key = "interleaved" if a >= INTERLEAVED_BASE else "standard"
        if key == "standard":
            largest_standard = max(largest_standard, fp)
        events[key].append((r.live[0], fp))
        events[key].append((r.live[1], -fp))
    peaks: dict[str, int] = {}
    for key, evs in events.items():
        evs.sort()  # ends (negative deltas) sort before starts at the same step: half-open
        live = peak = 0
        for _, delta in evs:
            live += delta
            peak = max(peak, live)
        peaks[f"{key}_peak_bytes"] = peak
    peaks["largest_standard_bytes"] = largest_standard
    return peaks

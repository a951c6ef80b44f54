"""Tests for the single-tile SRAM allocator (ipu_stack.place.sram)."""

from __future__ import annotations

import random
import re

import pytest

from ipu_stack.errors import PlanError
from ipu_stack.place.sram import (
    BufferRequest,
    Region,
    allocate_tile,
    region_peaks,
    usable_bytes,
    usable_ranges,
    verify_allocation,
)
from ipu_stack.target.ipu21 import (
    DEFAULT_SUPPORT_RESERVATION_BYTES,
    INTERLEAVED_BASE,
    LOADER_LIMIT,
    RESERVED_RANGES,
    STANDARD_DATA_BASE,
)

STD_ELEM = 0x4000
ILV_ELEM = 0x8000


def element_indices(addr: int, size: int) -> set[tuple[str, int]]:
    """Element ids touched by [addr, addr + size), computed byte-wise from the spec."""
    out = set()
    for a in range(addr, addr + size, 64):
        out.add(element_id(a))
    out.add(element_id(addr + size - 1))
    return out


def element_id(a: int) -> tuple[str, int]:
    if a < 0x80000:
        return ("s", a // STD_ELEM)
    return ("i", (a - 0x80000) // ILV_ELEM)


def overlaps(a0: int, s0: int, a1: int, s1: int) -> bool:
    return a0 < a1 + s1 and a1 < a0 + s0


def allocate_and_verify(reqs: list[BufferRequest], **kw: int) -> dict[str, int]:
    addrs = allocate_tile(reqs, **kw)
    verify_allocation(reqs, addrs, **kw)
    assert set(addrs) == {r.name for r in reqs}
    return addrs


def test_usable_byte_counts() -> None:
    std = INTERLEAVED_BASE - DEFAULT_SUPPORT_RESERVATION_BYTES - STANDARD_DATA_BASE
    assert usable_bytes(Region.STANDARD) == std == 112_928
    assert usable_bytes("interleaved") == LOADER_LIMIT - INTERLEAVED_BASE == 424_880
    assert usable_bytes(Region.ANY) == std + 424_880
    assert usable_bytes("standard", reservation=0) == 162_080
    with pytest.raises(PlanError):
        usable_ranges("standard", reservation=-1)


def test_disjoint_lifetimes_share_addresses() -> None:
    reqs = [
        BufferRequest("a", 40_000, region=Region.STANDARD, live=(0, 2)),
        BufferRequest("b", 40_000, region=Region.STANDARD, live=(2, 4)),
        BufferRequest("c", 40_000, region=Region.STANDARD, live=(4, 6)),
    ]
    addrs = allocate_and_verify(reqs)
    assert addrs["a"] == addrs["b"] == addrs["c"]
    # Three of them could not fit in the standard region at once (3 * 40000 > 112928).
    peaks = region_peaks(reqs, addrs)
    assert peaks["standard_peak_bytes"] == 40_000
    assert peaks["interleaved_peak_bytes"] == 0
    assert peaks["largest_standard_bytes"] == 40_000


def test_space_of_dead_buffers_is_reused_to_fit() -> None:
    big = usable_bytes(Region.INTERLEAVED) - 64
    reqs = [
        BufferRequest(f"t{i}", big, region=Region.INTERLEAVED, live=(i, i + 1)) for i in range(5)
    ]
    addrs = allocate_and_verify(reqs)
    assert len(set(addrs.values())) == 1


def test_overlapping_lifetimes_do_not_overlap_in_bytes() -> None:
    reqs = [
        BufferRequest("a", 1000, live=(0, 3)),
        BufferRequest("b", 2000, live=(2, 5)),
        BufferRequest("c", 3000, live=(1, 2)),
        BufferRequest("d", 500, live=(4, 9)),
    ]
    addrs = allocate_and_verify(reqs)
    for x in reqs:
        for y in reqs:
            if x.name < y.name and x.live[0] < y.live[1] and y.live[0] < x.live[1]:
                assert not overlaps(addrs[x.name], x.size, addrs[y.name], y.size)


def test_half_open_intervals_touching_may_share() -> None:
    reqs = [BufferRequest("a", 64, live=(0, 1)), BufferRequest("b", 64, live=(1, 2))]
    addrs = allocate_and_verify(reqs)
    assert addrs["a"] == addrs["b"]


def test_regions() -> None:
    reqs = [
        BufferRequest("acc", 20_000, alignment=16, region=Region.INTERLEAVED, live=(0, 4)),
        BufferRequest("w", 8_000, alignment=16, region="interleaved", live=(0, 4)),  # type: ignore[arg-type]
        BufferRequest("s", 30_000, region=Region.STANDARD, live=(0, 4)),
        BufferRequest("any", 1_000, region=Region.ANY, live=(0, 4)),
    ]
    addrs = allocate_and_verify(reqs)
    assert addrs["acc"] >= 0x80000 and addrs["w"] >= 0x80000
    assert addrs["acc"] + 20_000 <= LOADER_LIMIT
    assert addrs["s"] >= STANDARD_DATA_BASE and addrs["s"] + 30_000 <= 0x80000
    # ANY prefers the standard region while it has room.
    assert addrs["any"] < 0x80000
    assert reqs[1].region is Region.INTERLEAVED


def test_standard_respects_support_reservation() -> None:
    reqs = [BufferRequest("x", usable_bytes(Region.STANDARD), alignment=4, region="standard")]  # type: ignore[arg-type]
    addrs = allocate_and_verify(reqs)
    assert addrs["x"] + reqs[0].size == INTERLEAVED_BASE - DEFAULT_SUPPORT_RESERVATION_BYTES
    with pytest.raises(PlanError):
        allocate_tile([BufferRequest("x", reqs[0].size + 4, alignment=4, region=Region.STANDARD)])
    # Custom reservation: more room.
    allocate_and_verify(
        [BufferRequest("x", reqs[0].size + 4, alignment=4, region=Region.STANDARD)],
        reservation=0,
    )


def test_alignment_respected() -> None:
    reqs = [
        BufferRequest(f"b{i}", 4 + 3 * i, alignment=1 << (2 + i % 9), live=(0, 10))
        for i in range(30)
    ]
    addrs = allocate_and_verify(reqs)
    for r in reqs:
        assert addrs[r.name] % r.alignment == 0


def test_reserved_ranges_avoided() -> None:
    reqs = [BufferRequest(f"b{i}", 5_000 + i, live=(0, 1)) for i in range(100)]
    addrs = allocate_and_verify(reqs)
    for r in reqs:
        a = addrs[r.name]
        for lo, hi in RESERVED_RANGES:
            assert not (a < hi and lo < a + r.size)
        assert a >= STANDARD_DATA_BASE
        assert a + r.size <= LOADER_LIMIT
        # Nothing lands in the support reservation or straddles the region boundary.
        assert a + r.size <= INTERLEAVED_BASE - DEFAULT_SUPPORT_RESERVATION_BYTES or (
            a >= INTERLEAVED_BASE
        )


def test_exclusive_element_standard_and_interleaved() -> None:
    reqs = [
        BufferRequest("lhs", 1000, region=Region.STANDARD, live=(0, 3), exclusive_element=True),
        BufferRequest("out", 5000, region=Region.INTERLEAVED, live=(0, 3), exclusive_element=True),
        *(BufferRequest(f"s{i}", 100 + i, region=Region.STANDARD, live=(0, 3)) for i in range(20)),
        *(
            BufferRequest(f"i{i}", 100 + i, region=Region.INTERLEAVED, live=(0, 3))
            for i in range(20)
        ),
        BufferRequest("late", 100, region=Region.STANDARD, live=(3, 4)),
    ]
    addrs = allocate_and_verify(reqs)
    assert addrs["lhs"] % STD_ELEM == 0
    assert (addrs["out"] - 0x80000) % ILV_ELEM == 0
    for ex in ("lhs", "out"):
        ex_req = next(r for r in reqs if r.name == ex)
        ex_elems = element_indices(addrs[ex], ex_req.size)
        for r in reqs:
            if r.name == ex or r.live[1] <= ex_req.live[0] or ex_req.live[1] <= r.live[0]:
                continue
            assert not ex_elems & element_indices(addrs[r.name], r.size), (ex, r.name)
    # A buffer that is not live at the same time may reuse the exclusive element.
    later = [reqs[0], BufferRequest("late", 20_000, region=Region.STANDARD, live=(3, 4))]
    got = allocate_and_verify(later)
    assert element_indices(got["late"], 20_000) & element_indices(got["lhs"], 1000)
    peaks = region_peaks(reqs, addrs)
    assert peaks["largest_standard_bytes"] == STD_ELEM  # rounded footprint
    assert peaks["interleaved_peak_bytes"] == ILV_ELEM + sum(100 + i for i in range(20))


def test_avoid_element_of_honoured() -> None:
    reqs = [
        BufferRequest("lhs", 3000, region=Region.STANDARD, live=(0, 2)),
        BufferRequest("out", 2000, region=Region.STANDARD, live=(0, 2), avoid_element_of=("lhs",)),
        BufferRequest("x", 64, region=Region.STANDARD, live=(0, 2)),
        BufferRequest("acc", 3000, region=Region.INTERLEAVED, live=(1, 4), avoid_element_of=("y",)),
        BufferRequest("y", 3000, region=Region.INTERLEAVED, live=(0, 2)),
    ]
    addrs = allocate_and_verify(reqs)
    assert not element_indices(addrs["lhs"], 3000) & element_indices(addrs["out"], 2000)
    assert not element_indices(addrs["acc"], 3000) & element_indices(addrs["y"], 3000)
    # Unconstrained buffers still pack tightly next to the others.
    assert element_indices(addrs["x"], 64) & (
        element_indices(addrs["lhs"], 3000) | element_indices(addrs["out"], 2000)
    )


def test_avoid_element_ignored_when_not_both_live() -> None:
    reqs = [
        BufferRequest("a", 3000, region=Region.STANDARD, live=(0, 2)),
        BufferRequest("b", 2000, region=Region.STANDARD, live=(2, 3), avoid_element_of=("a",)),
    ]
    addrs = allocate_and_verify(reqs)
    assert addrs["a"] == addrs["b"]


def test_too_big_raises_with_shortfall() -> None:
    size = usable_bytes(Region.INTERLEAVED) + 1000
    with pytest.raises(PlanError) as exc:
        allocate_tile([BufferRequest("huge", size, region=Region.INTERLEAVED, live=(0, 1))])
    msg = str(exc.value)
    assert "'huge'" in msg and str(size) in msg and "interleaved" in msg
    assert "short by 1000 B" in msg
    assert f"{usable_bytes(Region.INTERLEAVED)} B free" in msg


def test_too_big_given_live_neighbours_reports_free_at_lifetime() -> None:
    total = usable_bytes(Region.STANDARD)
    reqs = [
        BufferRequest("held", 100_000, alignment=4, region=Region.STANDARD, live=(0, 10)),
        BufferRequest("new", 20_000, alignment=4, region=Region.STANDARD, live=(5, 6)),
    ]
    with pytest.raises(PlanError) as exc:
        allocate_tile(reqs)
    msg = str(exc.value)
    free = total - 100_000
    assert "'new'" in msg and "20000 B" in msg and "standard" in msg
    assert f"{free} B free" in msg
    assert f"short by {20_000 - free} B" in msg
    # With disjoint lifetimes it fits.
    reqs[1] = BufferRequest("new", 20_000, alignment=4, region=Region.STANDARD, live=(10, 12))
    allocate_and_verify(reqs)


def test_verify_catches_overlap() -> None:
    reqs = [BufferRequest("a", 256, live=(0, 2)), BufferRequest("b", 256, live=(1, 3))]
    base = STANDARD_DATA_BASE + 0x20
    with pytest.raises(PlanError, match="overlap"):
        verify_allocation(reqs, {"a": base, "b": base + 128})
    verify_allocation(reqs, {"a": base, "b": base + 256})
    # Not simultaneously live: sharing is fine.
    verify_allocation([reqs[0], BufferRequest("b", 256, live=(2, 3))], {"a": base, "b": base})


@pytest.mark.parametrize(
    ("req", "addr", "pattern"),
    [
        (BufferRequest("m", 64, alignment=16), STANDARD_DATA_BASE + 8, "aligned"),
        (BufferRequest("r", 64, region=Region.INTERLEAVED), STANDARD_DATA_BASE, "interleaved"),
        (BufferRequest("r", 64, region=Region.STANDARD), INTERLEAVED_BASE, "standard"),
        (BufferRequest("h", 64), 0x50000, "reserved"),
        (BufferRequest("o", 64), 0xE8000, "outside tile memory"),
        (BufferRequest("l", 0x400), 0xE7BB0 - 0x200, "loader limit"),
        (BufferRequest("s", 64), INTERLEAVED_BASE - 0x100, "not inside"),  # support reservation
        (BufferRequest("x", 64, exclusive_element=True), 0x5C000 + 64, "element"),
        (BufferRequest("b", 0x200), INTERLEAVED_BASE - 0x100, "not inside"),  # straddles
    ],
)
def test_verify_catches_bad_placements(req: BufferRequest, addr: int, pattern: str) -> None:
    with pytest.raises(PlanError, match=pattern):
        verify_allocation([req], {req.name: addr}, reservation=0 if req.name == "b" else 0xC000)


def test_verify_catches_element_violations() -> None:
    reqs = [
        BufferRequest("lhs", 64, live=(0, 2), exclusive_element=True),
        BufferRequest("other", 64, live=(1, 2)),
    ]
    with pytest.raises(PlanError, match="exclusive_element"):
        verify_allocation(reqs, {"lhs": 0x5C000, "other": 0x5C000 + 0x1000})
    verify_allocation(reqs, {"lhs": 0x5C000, "other": 0x60000})
    reqs = [
        BufferRequest("a", 64, live=(0, 2), avoid_element_of=("b",)),
        BufferRequest("b", 64, live=(1, 2)),
    ]
    with pytest.raises(PlanError, match="avoid_element_of"):
        verify_allocation(reqs, {"a": 0x80000, "b": 0x84000})  # same 32 KiB pair
    verify_allocation(reqs, {"a": 0x80000, "b": 0x88000})
    with pytest.raises(PlanError, match="no address"):
        verify_allocation(reqs, {"a": 0x80000})


def test_bad_requests_rejected() -> None:
    with pytest.raises(PlanError):
        BufferRequest("a", 0)
    with pytest.raises(PlanError):
        BufferRequest("a", 8, alignment=2)
    with pytest.raises(PlanError):
        BufferRequest("a", 8, alignment=12)
    with pytest.raises(PlanError):
        BufferRequest("a", 8, live=(3, 3))
    with pytest.raises(PlanError):
        BufferRequest("a", 8, region="fast")  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="duplicate"):
        allocate_tile([BufferRequest("a", 8), BufferRequest("a", 16)])
    with pytest.raises(PlanError, match="unknown buffer"):
        allocate_tile([BufferRequest("a", 8, avoid_element_of=("zz",))])


def random_requests(rng: random.Random, n: int) -> list[BufferRequest]:
    names = [f"buf{i:02d}" for i in range(n)]
    reqs = []
    for i, name in enumerate(names):
        start = rng.randrange(0, 40)
        avoid = tuple(rng.sample(names[:i], k=min(i, rng.choice([0, 0, 0, 1, 2]))))
        reqs.append(
            BufferRequest(
                name,
                rng.choice([16, 100, 1000, 4096, 6000, 20_000, 40_000]) + rng.randrange(0, 64) * 4,
                alignment=rng.choice([4, 8, 16, 32, 64]),
                region=rng.choice(list(Region)),
                live=(start, start + rng.randrange(1, 20)),
                exclusive_element=rng.random() < 0.1,
                avoid_element_of=avoid,
            )
        )
    return reqs


def test_determinism_and_order_independence() -> None:
    rng = random.Random(7)
    reqs = random_requests(rng, 40)
    first = allocate_tile(reqs)
    assert allocate_tile(reqs) == first
    shuffled = list(reqs)
    rng.shuffle(shuffled)
    assert allocate_tile(shuffled) == first


def test_random_allocations_verify() -> None:
    rng = random.Random(1234)
    placed = 0
    for _ in range(200):
        reqs = random_requests(rng, rng.randrange(1, 50))
        try:
            addrs = allocate_tile(reqs)
        except PlanError as err:
            assert re.search(r"short by \d+ B", str(err))
            continue
        placed += 1
        verify_allocation(reqs, addrs)
        for x in reqs:
            for y in reqs:
                if x.name >= y.name or x.live[1] <= y.live[0] or y.live[1] <= x.live[0]:
                    continue
                if x.exclusive_element or y.exclusive_element or x.name in y.avoid_element_of:
                    assert not element_indices(addrs[x.name], x.size) & element_indices(
                        addrs[y.name], y.size
                    )
    assert placed > 150

"""Placement keeps each exchange phase's send and receive buffers in different SRAM elements."""

from __future__ import annotations

import pytest

from ipu_stack.graph.compute_graph import ComputeGraph
from ipu_stack.low.lower import lower_program
from ipu_stack.mid.lower_mid import lower_mid
from ipu_stack.place import assign

INTERLEAVED_BASE = 0x80000  # facts §4.5; elements: 16 KiB below, 32 KiB pairs above


def _elements(address: int, size: int) -> set[tuple[str, int]]:
    out = set()
    for a in range(address, address + size, 0x1000):  # 4 KiB steps hit every element
        out.add(
            ("std", a // 0x4000)
            if a < INTERLEAVED_BASE
            else ("il", (a - INTERLEAVED_BASE) // 0x8000)
        )
    last = address + size - 1
    out.add(
        ("std", last // 0x4000)
        if last < INTERLEAVED_BASE
        else ("il", (last - INTERLEAVED_BASE) // 0x8000)
    )
    return out


@pytest.fixture(scope="module")
def program():
    g = ComputeGraph()
    x = g.host_input("x", (128, 512), "f16")
    h = g.gelu(g.gemm(x, g.parameter("w1", (512, 1024), "f16"), name="up"))
    g.set_outputs(g.gemm(h, g.parameter("w2", (1024, 512), "f16"), name="down"))
    best = lower_mid(g, 32)[0]
    plans = {op.id: best.gemm_plans[op.name] for op in g.operations if op.kind == "gemm"}
    return lower_program(g, plans, 32, best.row_tiles)


def _shared(program, placement) -> list[tuple[int, str, str]]:
    """(tile, received, sent) pairs of one exchange step that share a memory element."""
    bad = []
    for tile, pairs in assign.exchange_hazard_pairs(program).items():
        alloc = placement.allocations[tile]
        for received, sent in pairs.items():
            for other in sent:
                a, b = alloc[received], alloc[other]
                if _elements(a.address, a.size) & _elements(b.address, b.size):
                    bad.append((tile, received, other))
    return bad


def test_send_and_receive_buffers_of_a_phase_share_no_element(program):
    assert assign.exchange_hazard_pairs(program)  # the program has such pairs
    assert _shared(program, assign.place_program(program)) == []


def test_without_the_separation_some_pair_shares_an_element(program, monkeypatch):
    # The mutation (no separation) is caught by the check above.
    monkeypatch.setattr(assign, "_separate", lambda requests, avoid: requests)
    assert _shared(program, assign.place_program(program))

"""Exchange rows: lowered from a schedule, executed cycle by cycle, checked against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from ipu_stack.errors import SimulationError
from ipu_stack.exchange.model import PAIRED64, ExchangePhase, Transfer
from ipu_stack.exchange.scheduler import optimize_phase
from ipu_stack.runtime.exchange_sim import Row, simulate
from ipu_stack.target import ipu21, topology
from ipu_stack.tilecode.decode import decode
from ipu_stack.tilecode.encode import encode
from ipu_stack.tilecode.exchange_rows import lower_phase

BASE = ipu21.TILE_MEMORY_BASE
TILES = [0, 1, 2, 3, 6, 7, 40, 41]  # physical ids; 2/0, 3/1, 6/4.. pairs where needed
SRC, DST = 0x90000, 0xA0000


def _phase() -> ExchangePhase:
    return ExchangePhase(
        (
            Transfer(0, SRC, ((1, DST), (40, DST + 0x400)), 150),  # multicast, > 64 words
            Transfer(1, SRC, ((0, DST),), 7),
            Transfer(6, SRC, ((2, DST), (0, DST + 0x800)), 130, PAIRED64),  # paired: 0 and 2
            Transfer(41, SRC + 0x100, ((7, DST + 0x1000),), 33),
        )
    )


def _memory(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    words = np.zeros((len(TILES), (ipu21.TILE_MEMORY_END - BASE) // 4), np.uint32)
    words[:, (SRC - BASE) // 4 : (SRC - BASE) // 4 + 512] = rng.integers(
        0, 2**32, (len(TILES), 512)
    )
    logical = np.full(ipu21.TILES, -1, np.int64)
    logical[TILES] = np.arange(len(TILES))
    return words, logical


def _rows(rows_by_tile: dict[int, np.ndarray], logical: np.ndarray) -> list[Row]:
    base = 0x74000
    out = []
    for tile in sorted(rows_by_tile):
        out.append(Row(int(logical[tile]), tile, base, rows_by_tile[tile]))
    return out


def _expected(phase: ExchangePhase, words: np.ndarray, logical: np.ndarray) -> np.ndarray:
    want = words.copy()
    for t in phase.transfers:
        s = (t.source_address - BASE) // 4
        data = words[logical[t.source], s : s + t.words]
        for tile, address in t.destinations:
            d = (address - BASE) // 4
            want[logical[tile], d : d + t.words] = data
    return want


@pytest.fixture(scope="module")
def lowered():
    phase = _phase()
    schedule = optimize_phase(phase, time_budget=0.2, wall_clock_guards=False).schedule
    return phase, schedule, lower_phase(phase, schedule)


def test_rows_move_every_word_where_numpy_says_in_about_the_horizon(lowered):
    phase, schedule, rows = lowered
    words, logical = _memory(np.random.default_rng(0))
    want = _expected(phase, words, logical)
    ends = simulate(_rows(rows, logical), words, logical, "test")
    assert np.array_equal(words, want)
    assert schedule.horizon <= ends.max() <= schedule.horizon + 8
    # field limits: every send <= 64 items; every row ends with br $m10
    for row in rows.values():
        tail = row[:-1] if row[-1] == 0 else row  # rows are padded to 8-byte multiples
        assert decode(int(tail[-1])).text() == "br reg=10" and len(row) % 2 == 0
        sends = [decode(int(w)) for w in row if decode(int(w)).mnemonic == "send"]
        assert all(s.fields["count_m1"] < 64 for s in sends)


def _flip(rows: dict[int, np.ndarray], tile: int, mnemonic: str, field_bit: int):
    out = {t: r.copy() for t, r in rows.items()}
    row = out[tile]
    k = next(i for i, w in enumerate(row) if decode(int(w)).mnemonic == mnemonic)
    row[k] ^= np.uint32(1 << field_bit)
    return out


@pytest.mark.parametrize(
    ("tile", "mnemonic", "bit", "message"),
    [
        (0, "send", 3, None),  # send address: wrong data (or a fault)
        (0, "send", 22, "receive with no sender|port"),  # count field
        (1, "delayxpic", 0, "receive with no sender|is no tile"),  # mux value
        (1, "delayxpic", 14, "receive with no sender|pointer"),  # delay field
        (1, "delaypic", 17, "outside tile memory"),  # pointer far out of memory
        (2, "delaypic", 0, None),  # pointer (or format): wrong place or a fault
    ],
)
def test_a_flipped_bit_faults_or_moves_wrong_words(lowered, tile, mnemonic, bit, message):
    phase, _, rows = lowered
    words, logical = _memory(np.random.default_rng(1))
    want = _expected(phase, words, logical)
    mutated = _flip(rows, tile, mnemonic, bit)
    try:
        simulate(_rows(mutated, logical), words, logical, "test")
    except SimulationError as err:
        assert "tile" in str(err) and "0x" in str(err)
        if message is not None:
            assert any(m in str(err) for m in message.split("|")), str(err)
        return
    assert message is None, "expected a fault"
    assert not np.array_equal(words, want)


def test_faults_name_tile_cycle_and_address():
    words, logical = _memory(np.random.default_rng(2))
    # a mux selecting tile 3, which sends nothing (the row waits for the writes to land)
    lead = topology.mux_lead(1)
    row = np.array([
        encode("delaypic", events_m1=0, sel=0, value=DST // 4),
        encode("delayxpic", events_m1=4, sel=0, value=3),
        encode("delayxpic", events_m1=9, sel=0, value=0x1FFF),
        encode("delay", events_m1=lead - 1),
        encode("br", reg=10),
    ], np.uint32)  # fmt: skip
    with pytest.raises(SimulationError, match=r"tile 1 cycle 6: receive with no sender .* 0x74004"):
        simulate([Row(int(logical[1]), 1, 0x74000, row)], words, logical, "step 3")
    # the same row returning before the writes of its window have landed
    early = np.delete(row, 3)
    with pytest.raises(SimulationError, match=r"tile 1: its exchange row returns at cycle 17 "):
        simulate([Row(int(logical[1]), 1, 0x74000, early)], words, logical, "step 3")
    # a 64-bit item into a receiver left in 32-bit format: the select one cycle after the item
    # reaches the mux (latency - lead after the send)
    send = np.array([encode("delay", events_m1=59),  # the send acts at cycle 60
                     encode("send", count_m1=0, word_address=SRC // 4, sctl=7),
                     encode("br", reg=10)], np.uint32)  # fmt: skip
    select = 60 + topology.paired_exchange_latency(0, 2) - topology.mux_lead(2)
    recv = np.array([
        encode("delaypic", events_m1=0, sel=0, value=DST // 4),
        encode("delayxpic", events_m1=select - 2, sel=0, value=0),
        encode("delayxpic", events_m1=0, sel=0, value=0x1FFF),
        encode("delay", events_m1=topology.mux_lead(2) - 1),
        encode("br", reg=10),
    ], np.uint32)  # fmt: skip
    rows = [Row(int(logical[0]), 0, 0x74000, send), Row(int(logical[2]), 2, 0x74000, recv)]
    with pytest.raises(SimulationError, match="unexpected format"):
        simulate(rows, words, logical, "step 3")


def test_back_to_back_one_word_windows_share_a_sendpicp():
    # tile 7 receives one word from each of 63 sources into scattered addresses, back to back:
    # the pointer of a window is written the cycle before its first write, which is the cycle
    # in which the window ``lead - 1`` later selects its source: one sendpicp writes both
    sources = [t for t in range(64) if t != 7]
    phase = ExchangePhase(tuple(
        Transfer(s, SRC + 4 * i, ((7, DST + 0x100 * i),), 1) for i, s in enumerate(sources)
    ))  # fmt: skip
    schedule = optimize_phase(phase, time_budget=0.2, wall_clock_guards=False).schedule
    rows = lower_phase(phase, schedule)
    mnemonics = [decode(int(w)).mnemonic for w in rows[7]]
    tiles = sorted(set(sources) | {7})
    words = np.zeros((len(tiles), (ipu21.TILE_MEMORY_END - BASE) // 4), np.uint32)
    words[:, (SRC - BASE) // 4 : (SRC - BASE) // 4 + 512] = np.random.default_rng(3).integers(
        0, 2**32, (len(tiles), 512)
    )
    logical = np.full(ipu21.TILES, -1, np.int64)
    logical[tiles] = np.arange(len(tiles))
    want = _expected(phase, words, logical)
    simulate(_rows(rows, logical), words, logical, "test")
    assert np.array_equal(words, want)
    arrivals = sorted(p[0].send_cycle + topology.exchange_latency(t.source, 7)
                      for t, p in zip(phase.transfers, schedule.pieces, strict=True))  # fmt: skip
    run = max(len(list(g)) for _, g in __import__("itertools").groupby(
        np.diff(arrivals) == 1))  # fmt: skip
    assert run >= topology.mux_lead(7)  # the schedule packs them back to back...
    assert "sendpicp" in mnemonics  # ...so some pointer write shares a cycle with a select

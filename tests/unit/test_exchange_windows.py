"""The exchange simulation per receive run and send piece against the per-cycle reference.

``runtime.exchange_sim.simulate`` works per window and per send piece (block copies, checks
on endpoints and intervals); ``runtime.exchange_cycles.simulate`` is the former simulation,
which expands every item and every receive cycle. On lowered phases and on rows with random
bit flips (which produce every kind of fault: no sender, wrong format, pointers and sends
outside memory, words written twice, busy ports, stray directions, ...) both must write the
same memory and return the same end cycles, or raise the same fault message.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from ipu_stack.errors import SimulationError
from ipu_stack.exchange.model import PAIRED64, ExchangePhase, Transfer
from ipu_stack.exchange.scheduler import optimize_phase
from ipu_stack.runtime import exchange_cycles, exchange_sim
from ipu_stack.runtime.exchange_sim import Row
from ipu_stack.target import ipu21
from ipu_stack.tilecode.decode import decode
from ipu_stack.tilecode.encode import EncodeError, encode
from ipu_stack.tilecode.exchange_rows import lower_phase

BASE = ipu21.TILE_MEMORY_BASE
TILES = [0, 1, 2, 3, 6, 7, 40, 41, 64, 65]
SRC, DST = 0x90000, 0xA0000
MUTANTS = 160


def _random_phase(seed: int) -> ExchangePhase:
    rng = np.random.default_rng(seed)
    transfers = []
    slot = 0
    sources = rng.permutation(TILES)[: int(rng.integers(2, 6))]
    for i, source in enumerate(sources.tolist()):
        others = [t for t in TILES if t != source]
        fan = int(rng.integers(1, 4))
        dests = rng.choice(others, fan, replace=False).tolist()
        words = int(rng.integers(1, 140))
        destinations = []
        for tile in sorted(dests):
            destinations.append((tile, DST + 0x400 * slot))
            slot += 1
        transfers.append(Transfer(source, SRC + 0x200 * i, tuple(destinations), words))
    if seed % 2 == 0:  # a 64-bit multicast as in test_tile_exchange (6 -> 2 and 0)
        transfers.append(
            Transfer(6, SRC + 0x1000, ((2, DST + 0x8000), (0, DST + 0x9000)), 40, PAIRED64)
        )
    sources_used = {t.source for t in transfers}
    if len(sources_used) < len(transfers):  # one transfer per source in this generator
        transfers = [t for t in transfers if t.source != 6 or t.width == PAIRED64]
    return ExchangePhase(tuple(transfers))


def _memory(seed: int) -> tuple[np.ndarray, np.ndarray]:
    words = np.zeros((len(TILES), (ipu21.TILE_MEMORY_END - BASE) // 4), np.uint32)
    lo = (SRC - BASE) // 4
    words[:, lo : lo + 0x1400] = np.random.default_rng(seed).integers(
        0, 2**32, (len(TILES), 0x1400)
    )
    logical = np.full(ipu21.TILES, -1, np.int64)
    logical[TILES] = np.arange(len(TILES))
    return words, logical


def _rows(rows_by_tile: dict[int, np.ndarray], logical: np.ndarray) -> list[Row]:
    return [Row(int(logical[t]), t, 0x74000, rows_by_tile[t]) for t in sorted(rows_by_tile)]


def _outcome(simulate, rows, words, logical):
    memory = words.copy()
    try:
        ends = simulate(rows, memory, logical, "step 1")
    except SimulationError as err:
        return ("fault", str(err))
    return ("ok", ends.tolist(), memory)


def _kind(message: str) -> str:
    return re.sub(r"0x[0-9a-f]+|\d+", "#", message)


def _same(new, old, exact: bool = True) -> str | None:
    """None when the outcomes agree, else a description of the difference."""
    if new[0] != old[0]:
        return f"new {new[:2]} vs old {old[:2]}"
    if new[0] == "fault":
        a, b = (new[1], old[1]) if exact else (_kind(new[1]), _kind(old[1]))
        return None if a == b else f"new {new[1]!r} vs old {old[1]!r}"
    if new[1] != old[1]:
        return f"ends {new[1]} vs {old[1]}"
    if not np.array_equal(new[2], old[2]):
        return "memories differ"
    return None


@pytest.fixture(scope="module")
def phases():
    out = []
    for seed in range(4):
        phase = _random_phase(seed)
        schedule = optimize_phase(phase, time_budget=0.2, wall_clock_guards=False).schedule
        out.append(lower_phase(phase, schedule))
    return out


def _mutants(phases, count: int, seed: int):
    """Each lowered phase, then ``count`` mutants: rows with one or two fields of their
    instructions changed (a small step or a random value; a pointer sometimes moved into
    the words the phase sends), or a random bit flipped."""
    rng = np.random.default_rng(seed)
    yield from phases
    for rows in phases:
        yield from _targeted(rows)
    for _ in range(count):
        rows = phases[int(rng.integers(len(phases)))]
        mutated = {t: r.copy() for t, r in rows.items()}
        for _ in range(int(rng.integers(1, 3))):
            tile = sorted(mutated)[int(rng.integers(len(mutated)))]
            row = mutated[tile]
            at = int(rng.integers(len(row)))
            mutated[tile][at] = _mutate(int(row[at]), rng)
        yield mutated


def _targeted(rows: dict[int, np.ndarray]):
    """Pointer writes moved onto another pointer's words (written twice), onto the words
    the same tile sends (sent and received), and past the end of tile memory."""
    end = (ipu21.TILE_MEMORY_END - 8) // 4
    for tile, row in sorted(rows.items()):
        ins = [decode(int(w)) for w in row]
        pics = [i for i, x in enumerate(ins) if x.mnemonic == "delaypic"]
        sent = [x.fields["word_address"] for x in ins if x.mnemonic == "send"]
        values = [ins[i].fields["value"] for i in pics]
        for i in pics[:2]:
            for value in [*values[:2], *sent[:1], end]:
                if value == ins[i].fields["value"]:
                    continue
                mutated = {t: r.copy() for t, r in rows.items()}
                mutated[tile][i] = encode("delaypic", **{**ins[i].fields, "value": value})
                yield mutated


def _mutate(word: int, rng: np.random.Generator) -> int:
    ins = decode(word)
    fields = dict(ins.fields)
    if ins.mnemonic == "br" or not fields or rng.random() < 0.1:
        return word ^ (1 << int(rng.integers(32)))
    name = sorted(fields)[int(rng.integers(len(fields)))]
    if ins.mnemonic in ("delaypic", "sendpicp") and name == "value" and rng.random() < 0.3:
        fields[name] = (SRC + 0x200 * int(rng.integers(4))) // 4 + int(rng.integers(64))
    elif rng.random() < 0.8:
        fields[name] += int(rng.choice([-2, -1, 1, 2, 64]))
    else:
        fields[name] = int(rng.integers(0, 1 << 8))
    try:
        return int(encode(ins.mnemonic, **fields))
    except (EncodeError, ValueError, KeyError, OverflowError):
        return word ^ (1 << int(rng.integers(32)))


def _compare(phases, count: int, seed: int) -> tuple[list[str], dict[str, int]]:
    differences, kinds = [], {}
    words, logical = _memory(seed)
    for rows_by_tile in _mutants(phases, count, seed):
        rows = _rows(rows_by_tile, logical)
        new = _outcome(exchange_sim.simulate, rows, words, logical)
        old = _outcome(exchange_cycles.simulate, rows, words, logical)
        key = "ok" if old[0] == "ok" else _kind(old[1]).split(": ", 1)[-1][:40]
        kinds[key] = kinds.get(key, 0) + 1
        problem = _same(new, old)
        if problem is not None:
            differences.append(problem)
    return differences, kinds


def test_lowered_phases_and_bit_flips_match_the_per_cycle_simulation(phases):
    differences, kinds = _compare(phases, MUTANTS, seed=7)
    assert not differences, differences[:5]
    # the mutants reach the checks: correct runs and every kind of fault of the run matcher
    assert kinds.get("ok", 0) >= len(phases)
    reached = " ".join(kinds)
    for fault in (
        "receive with no sender",
        "with no incoming",
        "unexpected format",
        "incoming pointer",
        "a second word is written",
        "which the same phas",
        "drives direction",
        "reads word address",
        "while the previous send",
        "returns at cycle",
    ):
        assert fault in reached, (fault, kinds)


@pytest.mark.parametrize("bug", ["copy", "coverage", "direction", "pointer", "hazard"])
def test_a_planted_bug_in_the_fast_path_is_caught(phases, monkeypatch, bug):
    if bug == "copy":  # every block one word short
        real = exchange_sim._copy

        def short(words32, src, src_word, dst, dst_word, count):
            real(words32, src, src_word, dst, dst_word, np.maximum(count - 1, 1))

        monkeypatch.setattr(exchange_sim, "_copy", short)
    elif bug == "coverage":  # a run's last cycle need not be covered
        real_uncovered = exchange_sim._uncovered
        monkeypatch.setattr(
            exchange_sim,
            "_uncovered",
            lambda run, a, b, s0, n: real_uncovered(run, a, b, s0, np.maximum(n - 1, 0)),
        )
    elif bug == "direction":  # every receiver in direction 1
        monkeypatch.setattr(exchange_sim, "_direction", lambda src, dest: np.ones_like(src))
    elif bug == "hazard":  # sent words not collected
        monkeypatch.setattr(exchange_sim, "_union", lambda start, stop: (start[:0], stop[:0]))
    else:  # pointers one word off
        monkeypatch.setattr(exchange_sim, "_BASE_WORD", exchange_sim._BASE_WORD + 1)
    differences, _ = _compare(phases, 40, seed=11)
    assert differences


def test_merged_send_pieces_change_nothing(phases, monkeypatch):
    """Consecutive sends continuing one another are matched as one piece: the lowered phases
    have such sends (transfers longer than a send's 64 items), and the memory and end cycles
    are those of the matching send by send."""
    merged = []
    real = exchange_sim._merged

    def spy(sends):
        out = real(sends)
        merged.append(len(out.tile) < len(sends.tile))
        return out

    words, logical = _memory(3)
    monkeypatch.setattr(exchange_sim, "_merged", spy)
    with_merge = [
        _outcome(exchange_sim.simulate, _rows(r, logical), words, logical) for r in phases
    ]
    assert any(merged)
    monkeypatch.setattr(exchange_sim, "_merged", lambda sends: sends)
    per_send = [_outcome(exchange_sim.simulate, _rows(r, logical), words, logical) for r in phases]
    for a, b in zip(with_merge, per_send, strict=True):
        assert a[0] == "ok" and _same(a, b) is None

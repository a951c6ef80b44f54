"""The per-cycle exchange simulation: the reference the fast one is tested against.

This is :func:`ipu_stack.runtime.exchange_sim.simulate` as it was before it worked per receive
window and send piece (kept unchanged; ``tests/unit/test_exchange_windows.py`` runs both on
random phases and requires the same writes, end cycles and faults). It expands every item and
every receive cycle, so it is slow on large multicast phases (~134 M receive cycles in the
batch-4 SigLIP MLP).

Semantics (README "Tile code"; the row timing is the project's stated assumption):

- each row instruction waits its events and then acts at its row cycle (``send`` waits 0);
- a ``send`` of n items puts item k on the fabric at cycle ``start + k`` (64-bit items, two
  words, with ``sctl`` bit 2), in the fabric directions of ``sctl`` bits 0-1; a second send
  before the first has finished is a fault (one send port);
- a tile whose mux (XPIC) selects source s in cycle c takes the item s sent at
  ``c - (latency(s, tile) - lead(tile))``, i.e. one cycle after it reached the mux
  (``target.topology.exchange_latency`` and ``mux_lead``, facts §8.5/§9; XPIC selector 1
  selects 64-bit paired items, at the paired latency); it is written ``lead(tile)`` cycles
  later (``52 + 2 x physical row``) at the incoming pointer of that cycle, which then advances
  by the item's words; a PIC pointer write acts from the next cycle; a directionless
  ``sendpicp`` (8-byte aligned) writes an XPIC and a PIC at once;
- a row returns (its last instruction) only after its last word has been written: a row
  that returns while words are still to land is a fault (the tile would compute on them);
- faults, naming tile, cycle and instruction address: a cycle in which the mux selects a source
  that sent nothing (or sent in the other direction) to arrive then, an item whose width is not
  the receiver's format, a pointer or send address outside tile memory, a word written twice in
  one phase, a tile sending words that the same phase receives into, an instruction a row may
  not hold, a second send on a busy port.

Every item and every receive cycle is expanded into arrays and matched with a sorted join, so
the cost is proportional to the words moved, not to cycles x tiles.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ipu_stack.errors import SimulationError
from ipu_stack.runtime.exchange_sim import Row
from ipu_stack.target import ipu21, topology
from ipu_stack.tilecode.decode import ROW_KINDS, decode, decode_rows

IntArray = npt.NDArray[np.int64]
_K = {name: i for i, name in enumerate(ROW_KINDS)}
_BIG = 1 << 32  # key = tile * _BIG + cycle
_MUX_NONE = 0x1FFF  # the decoder's reading of "no source" (facts: 13-bit XPIC values)
_BASE_WORD = ipu21.TILE_MEMORY_BASE // 4
_END_WORD = ipu21.TILE_MEMORY_END // 4
_TAIL = 256  # cycles past the last send within which every open window must have closed
CHUNK_CYCLES = 2_000_000  # receive cycles expanded at once (memory: ~100 bytes each)


def _segments(lengths: IntArray) -> tuple[IntArray, IntArray]:
    """Owner index and position within owner for a concatenation of ``lengths`` runs."""
    owner = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return owner, np.arange(int(lengths.sum()), dtype=np.int64) - starts[owner]


def simulate(rows: list[Row], words32: np.ndarray, logical_of: IntArray, where: str) -> IntArray:
    """Run one exchange phase; writes land in ``words32`` ([logical tile, word]).

    Args:
        rows: the rows of the tiles taking part, in tile order.
        words32: tile memories as 32-bit words (updated in place).
        logical_of: physical tile id -> logical tile index (-1: not in the package).
        where: a prefix for fault messages (the step).

    Returns:
        Each row's end cycle (the cycle after its last action, send or receive).

    Raises:
        SimulationError: a fault (see the module docstring).
    """
    if not rows:
        return np.zeros(0, np.int64)
    # rows in physical tile order: every (tile, cycle) key below is then generated in order
    perm = np.argsort(np.array([r.physical for r in rows], np.int64), kind="stable")
    if (np.diff(perm) != 1).any():
        out = np.empty(len(rows), np.int64)
        out[perm] = simulate([rows[i] for i in perm.tolist()], words32, logical_of, where)
        return out
    lengths = np.array([_length(r) for r in rows], np.int64)  # up to the closing br
    body = np.concatenate([r.words[:n] for r, n in zip(rows, lengths.tolist(), strict=True)])
    owner, pos = _segments(lengths)
    d = decode_rows(body)
    phys = np.array([r.physical for r in rows], np.int64)[owner]
    addr = np.array([r.address for r in rows], np.int64)[owner] + 4 * pos
    row_kinds = [_K[k] for k in ("delay", "delaypic", "delayxpic", "send", "sendpicp", "picword")]
    bad = ~_isin(d.kind, np.array(row_kinds, np.int64))
    bad |= ((d.kind == _K["delaypic"]) | (d.kind == _K["sendpicp"])) & (d.sel != 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SimulationError(
            f"{where} tile {phys[i]}: instruction {decode(int(body[i])).text()} at "
            f"{addr[i]:#x} cannot be part of an exchange row"
        )
    pairs = np.flatnonzero(d.kind == _K["sendpicp"])
    if len(pairs) and (addr[pairs] % 8).any():
        i = int(pairs[np.flatnonzero(addr[pairs] % 8)[0]])
        raise SimulationError(
            f"{where} tile {phys[i]}: sendpicp at {addr[i]:#x} is not 8-byte aligned"
        )
    # act cycle of every instruction: events summed within its row
    csum = np.cumsum(d.events)
    row_start = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    before = np.where(row_start > 0, csum[np.maximum(row_start - 1, 0)], 0)
    act = csum - before[owner] if len(csum) else csum
    ends = np.zeros(len(rows), np.int64)
    np.maximum.at(ends, owner, act + (d.kind != _K["send"]))

    # -- sends: every item ---------------------------------------------------------------
    s_mask = ((d.kind == _K["send"]) | (d.kind == _K["sendpicp"])) & ((d.sctl & 3) != 0)
    s_tile, s_start, s_items = phys[s_mask], act[s_mask], d.items[s_mask]
    s_addr, s_sctl, s_where = d.address[s_mask], d.sctl[s_mask], addr[s_mask]
    s_owner = owner[s_mask]
    s_end = s_start + s_items
    if len(s_tile) > 1:
        busy = (s_owner[1:] == s_owner[:-1]) & (s_start[1:] < s_end[:-1])
        if busy.any():
            i = int(np.flatnonzero(busy)[0]) + 1
            raise SimulationError(
                f"{where} tile {s_tile[i]} cycle {s_start[i]}: send at {s_where[i]:#x} starts "
                f"while the previous send occupies the port until cycle {s_end[i - 1]}"
            )
    np.maximum.at(ends, s_owner, s_end)
    i_send, i_k = _segments(s_items)
    wpi = 1 + ((s_sctl >> 2) & 1)
    item_tile, item_cycle = s_tile[i_send], s_start[i_send] + i_k
    item_word = s_addr[i_send] + i_k * wpi[i_send]
    item_paired = wpi[i_send] == 2
    outside = (item_word < _BASE_WORD) | (item_word + wpi[i_send] > _END_WORD)
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise SimulationError(
            f"{where} tile {item_tile[i]} cycle {item_cycle[i]}: send at {s_where[i_send[i]]:#x} "
            f"reads word address {item_word[i] * 4:#x}, outside tile memory"
        )
    order = np.argsort(item_tile * _BIG + item_cycle, kind="stable")
    item_key = (item_tile * _BIG + item_cycle)[order]
    horizon = int(s_end.max()) if len(s_end) else 0

    # -- receive windows: every cycle with a source selected -----------------------------
    # source selects: delayxpic, and a sendpicp's XPIC half (selector bit 13, 13-bit value)
    is_pair = d.kind == _K["sendpicp"]
    x_mask = (d.kind == _K["delayxpic"]) | is_pair
    x_sel = np.where(is_pair, (d.xpic >> 13) & 1, d.sel)[x_mask]
    x_tile, x_act, x_where = phys[x_mask], act[x_mask], addr[x_mask]
    x_value = np.where(is_pair, d.xpic & 0x1FFF, d.value)[x_mask]
    x_paired = x_sel == 1
    x_owner = owner[x_mask]
    x_next = np.append(x_act[1:], 0)
    last = np.append(x_owner[1:] != x_owner[:-1], True)
    x_stop = np.where(last, horizon + _TAIL, x_next)
    x_live = x_value != _MUX_NONE
    unknown = x_live & (x_value >= ipu21.TILES)
    if unknown.any():
        i = int(np.flatnonzero(unknown)[0])
        raise SimulationError(
            f"{where} tile {x_tile[i]} cycle {x_act[i]}: delayxpic at {x_where[i]:#x} selects "
            f"mux {x_value[i]:#x}, which is no tile"
        )
    x_lead = np.asarray(topology.mux_lead(x_tile), np.int64)
    written = np.zeros(len(rows), np.int64)
    np.maximum.at(written, x_owner[x_live], (np.minimum(x_stop, horizon + _TAIL) + x_lead)[x_live])
    early = written > ends
    if early.any():
        i = int(np.flatnonzero(early)[0])
        raise SimulationError(
            f"{where} tile {rows[i].physical}: its exchange row returns at cycle {ends[i]} while "
            f"words are written into it until cycle {written[i]}"
        )
    w_len = np.maximum(np.where(x_live, x_stop - x_act, 0), 0)
    # every sent word a phase reads (for the hazard check), then the receive cycles in chunks
    # of whole tiles (bounded memory: a multicast phase can have tens of millions of them)
    wpi_item = np.where(item_paired, 2, 1)
    read_tile = logical_of[item_tile]
    read_key = _unique(np.concatenate([
        read_tile * _BIG + item_word - _BASE_WORD,
        (read_tile * _BIG + item_word + 1 - _BASE_WORD)[wpi_item == 2],
    ]))  # fmt: skip
    p_mask = d.kind == _K["delaypic"]
    bounds = _chunks(x_owner, w_len, CHUNK_CYCLES)
    reached = np.zeros((len(item_tile), 4), bool)  # [item, direction bit]: some tile got it
    for lo, hi in bounds:
        chunk = (owner >= lo) & (owner < hi)
        sel = (x_owner >= lo) & (x_owner < hi)
        _receive(
            where, rows, words32, logical_of, d, phys, act, addr, is_pair, p_mask, chunk,
            x_tile[sel], x_act[sel], x_value[sel], x_where[sel], x_paired[sel], w_len[sel],
            item_key, order, s_sctl, i_send, item_paired, item_word, s_where, read_key, reached,
        )  # fmt: skip
    # every item goes somewhere: each direction bit of a send reaches a receiver that takes
    # the item (a word sent into the fabric for no one is a wrong row: an extra count, a
    # stray direction bit)
    wanted = s_sctl[i_send] & 3
    lost = ((wanted & 1) != 0) & ~reached[:, 1] | ((wanted & 2) != 0) & ~reached[:, 2]
    if lost.any():
        i = int(np.flatnonzero(lost)[0])
        side = 1 if wanted[i] & 1 and not reached[i, 1] else 2
        raise SimulationError(
            f"{where} tile {item_tile[i]} cycle {item_cycle[i]}: send at {s_where[i_send[i]]:#x} "
            f"(sctl {s_sctl[i_send[i]]}) drives direction {side} with an item no tile there "
            "receives"
        )
    return ends


def _chunks(x_owner: IntArray, w_len: IntArray, limit: int) -> list[tuple[int, int]]:
    """Row ranges ``[lo, hi)`` whose receive cycles total about ``limit`` each."""
    if not len(x_owner):
        return []
    per_row = np.bincount(x_owner, weights=w_len, minlength=int(x_owner.max()) + 1)
    out, lo, total = [], 0, 0.0
    for row, n in enumerate(per_row.tolist()):
        if total and total + n > limit:
            out.append((lo, row))
            lo, total = row, 0.0
        total += n
    out.append((lo, len(per_row)))
    return out


def _receive(
    where: str, rows: list[Row], words32: np.ndarray, logical_of: IntArray, d: Any,
    phys: IntArray, act: IntArray, addr: IntArray, is_pair: Any, p_mask: Any, chunk: Any,
    x_tile: IntArray, x_act: IntArray, x_value: IntArray, x_where: IntArray, x_paired: Any,
    w_len: IntArray, item_key: IntArray, order: IntArray, s_sctl: IntArray, i_send: IntArray,
    item_paired: Any, item_word: IntArray, s_where: IntArray, read_key: IntArray, reached: Any,
) -> None:  # fmt: skip
    """Receive cycles of one chunk of rows: match, check and write (see module docstring)."""
    # per window: the pair's latency and fabric direction (constant over the window)
    x_src = np.clip(x_value, 0, ipu21.TILES - 1)
    x_lead = np.asarray(topology.mux_lead(x_tile), np.int64)
    x_lat = (
        np.where(
            x_paired,
            topology.paired_exchange_latency(x_src, x_tile),
            topology.exchange_latency(x_src, x_tile),
        )
        - x_lead
    )  # send -> source select
    x_dir = topology.direction(x_src, x_tile)
    w_idx, w_k = _segments(w_len)
    r_tile, r_cycle, r_src = x_tile[w_idx], x_act[w_idx] + w_k, x_value[w_idx]
    r_where, r_paired = x_where[w_idx], x_paired[w_idx]
    r_key = r_tile * _BIG + r_cycle
    if not len(r_key):
        return
    # rows come in physical tile order and windows in cycle order, so keys are sorted unless
    # windows overlap (then sort, and report what the sorted order shows)
    if (r_key[1:] < r_key[:-1]).any():
        r_order = np.argsort(r_key, kind="stable")
        w_idx, r_tile, r_cycle, r_src, r_where, r_key, r_paired = (
            a[r_order] for a in (w_idx, r_tile, r_cycle, r_src, r_where, r_key, r_paired)
        )

    # the pointer at every write cycle, ``lead`` after the select (a PIC write acts from the
    # next cycle); the lead is constant per tile, so write keys are sorted as ``r_key``
    r_write = r_cycle + x_lead[w_idx]
    r_wkey = r_tile * _BIG + r_write
    p_mask = d.kind == _K["delaypic"]
    pic_mask = (p_mask | is_pair) & (d.sel == 0) & chunk
    pic_value = np.where(is_pair, d.pic, d.value)
    effect = act[pic_mask] + 1  # a PIC write acts from the next cycle
    ptr_idx, ptr_value = _latest(phys, effect, pic_mask, r_wkey, pic_value)
    ptr_where = addr[pic_mask]
    missing = ptr_idx < 0
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise SimulationError(
            f"{where} tile {r_tile[i]} cycle {r_write[i]}: receive (mux set at {r_where[i]:#x}) "
            "with no incoming pointer set"
        )
    r_wpi = 1 + r_paired.astype(np.int64)
    eff_key = r_tile * _BIG + effect[ptr_idx]
    first = np.searchsorted(r_wkey, eff_key, side="left")
    cum = np.concatenate([[0], np.cumsum(r_wpi)])
    r_ptr = ptr_value + (cum[np.arange(len(r_key))] - cum[first])

    # match each receive cycle with the item its source sent
    want = r_src * _BIG + (r_cycle - x_lat[w_idx])
    j = np.searchsorted(item_key, want)
    if len(item_key):
        found = (j < len(item_key)) & (item_key[np.minimum(j, len(item_key) - 1)] == want)
        item = order[np.minimum(j, len(order) - 1)]
    else:
        found, item = np.zeros(len(want), bool), np.zeros(len(want), np.int64)
    if len(order):
        reaches = (s_sctl[i_send[item]] & x_dir[w_idx]) != 0
        reached[item, x_dir[w_idx]] = True
        found &= reaches
    if not found.all():
        i = int(np.flatnonzero(~found)[0])
        raise SimulationError(
            f"{where} tile {r_tile[i]} cycle {r_cycle[i]}: receive with no sender (mux selects "
            f"tile {r_src[i]} from {r_where[i]:#x}; nothing it sent arrives then)"
        )
    wrong = item_paired[item] != r_paired
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        got = "64-bit" if item_paired[item[i]] else "32-bit"
        raise SimulationError(
            f"{where} tile {r_tile[i]} cycle {r_cycle[i]}: unexpected format: a {got} item from "
            f"tile {r_src[i]} (send at {s_where[i_send[item[i]]]:#x}) reaches a receiver in "
            f"{'64' if r_paired[i] else '32'}-bit format (mux set at {r_where[i]:#x})"
        )
    outside = (r_ptr < _BASE_WORD) | (r_ptr + r_wpi > _END_WORD)
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise SimulationError(
            f"{where} tile {r_tile[i]} cycle {r_write[i]}: incoming pointer {r_ptr[i] * 4:#x} "
            f"(set at {ptr_where[ptr_idx[i]]:#x}) is outside tile memory"
        )
    # words: the second word of a 64-bit item follows the first
    two = r_paired
    w_slot = np.concatenate([np.arange(len(r_key)), np.flatnonzero(two)])
    w_second = np.concatenate([np.zeros(len(r_key), np.int64), np.ones(int(two.sum()), np.int64)])
    src_log = logical_of[r_src[w_slot]]
    dst_log = logical_of[r_tile[w_slot]]
    src_word = item_word[item[w_slot]] + w_second - _BASE_WORD
    dst_word = r_ptr[w_slot] + w_second - _BASE_WORD
    if (src_log < 0).any() or (dst_log < 0).any():  # pragma: no cover - rows name package tiles
        raise SimulationError(f"{where}: an exchange names a tile outside the package")
    dst_key = dst_log * _BIG + dst_word
    sorted_dst = np.sort(dst_key)
    twice = sorted_dst[1:] == sorted_dst[:-1]
    if twice.any():
        k = sorted_dst[1:][twice][0]
        i = int(np.flatnonzero(dst_key == k)[1])
        raise SimulationError(
            f"{where} tile {r_tile[w_slot[i]]} cycle {r_write[w_slot[i]]}: a second word is "
            f"written at {(dst_word[i] + _BASE_WORD) * 4:#x} in one phase (pointer set at "
            f"{ptr_where[ptr_idx[w_slot[i]]]:#x})"
        )
    hazard = _isin(sorted_dst, read_key, keys_sorted=True)  # sorted needles: cache-friendly
    if hazard.any():
        k = int(sorted_dst[hazard][0])
        physical = {r.logical: r.physical for r in rows}
        tile = physical.get(k // _BIG, k // _BIG)
        raise SimulationError(
            f"{where} tile {tile}: sends the word at {(k % _BIG + _BASE_WORD) * 4:#x}, which the "
            "same phase receives into"
        )
    values = words32[src_log, src_word]
    _apply(words32, logical_of, dst_log, dst_word, values)


def _unique(values: IntArray) -> IntArray:
    """Sorted distinct values. (NumPy 2.4's ``np.unique`` and ``np.isin`` take ~2.5 us per
    int64 element here, about 80 times a sort: measured 4.1 s for 1.7 M keys.)"""
    s = np.sort(values)
    return s[np.concatenate([[True], s[1:] != s[:-1]])] if len(s) else s


def _isin(values: IntArray, keys: IntArray, keys_sorted: bool = False) -> npt.NDArray[np.bool_]:
    """Which ``values`` occur in ``keys`` (by a sort, unless ``keys_sorted``, and a binary
    search)."""
    keys = keys if keys_sorted else np.sort(keys)
    if not len(keys):
        return np.zeros(len(values), bool)
    at = np.minimum(np.searchsorted(keys, values), len(keys) - 1)
    return np.asarray(keys[at] == values)


def _length(row: Row) -> int:
    """Words before the row's closing ``br`` (all of them if there is none)."""
    ends = np.flatnonzero((row.words & np.uint32(0xFF0FFFFF)) == np.uint32(0x43000000))
    return int(ends[0]) if len(ends) else len(row.words)


def _apply(words32: np.ndarray, logical_of: IntArray, dst: IntArray, word: IntArray,
           values: np.ndarray) -> None:  # fmt: skip
    if len(dst):
        words32[dst, word] = values


def _latest(
    phys: IntArray,
    effect: IntArray,
    mask: npt.NDArray[np.bool_],
    keys: IntArray,
    values: IntArray,
) -> tuple[IntArray, IntArray]:
    """For each receive key, the index (into the masked writes, or -1) and value of the latest
    PIC write in ``mask`` on the same tile that has taken effect (``effect``) by then."""
    tiles, vals = phys[mask], values[mask]
    pkeys = tiles * _BIG + effect
    order = np.argsort(pkeys, kind="stable")
    idx = np.searchsorted(pkeys[order], keys, side="right") - 1
    ok = idx >= 0
    idx_c = np.maximum(idx, 0)
    chosen = order[idx_c] if len(order) else np.zeros_like(idx_c)
    if len(order):
        ok &= tiles[chosen] == keys // _BIG
    out_idx = np.where(ok, chosen, -1)
    out_val = np.where(ok, vals[chosen] if len(vals) else 0, 0)
    return out_idx, out_val

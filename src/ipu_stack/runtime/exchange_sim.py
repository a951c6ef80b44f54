"""Cycle-level exchange from decoded rows, vectorised across tiles (NumPy, no per-cycle loop).

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

The simulation is exact per cycle but works per *run* and per send *piece*, never per cycle
or per word: a run is a receive window (a live select up to the next select) split where a
pointer write takes effect inside it, so within a run the receiver takes one item per cycle
from one source into consecutive pointer words; a piece is one ``send`` (consecutive items
from consecutive words, one per cycle). Each run is matched with the pieces of its source
whose send cycles it covers (sorted searches on ``tile x 2**32 + cycle`` keys); each overlap
of a run with a piece is one block copy. The faults are found on endpoints and intervals
(uncovered send cycles of a run, the piece's direction bits and width, the run's pointer
range, overlapping write intervals, write intervals meeting the sends' read intervals, items
of a piece no run covers in a direction it is sent) and reported with the tile, cycle and
address of the first faulty cycle, as the per-cycle simulation
(:mod:`ipu_stack.runtime.exchange_cycles`, kept as the tests' reference) reports them. The
cost is proportional to the runs and pieces plus the words copied (memcpy per block): the
batch-4 SigLIP MLP's 134 M receive cycles (and words) are 2.1 M overlaps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from ipu_stack.errors import SimulationError
from ipu_stack.target import ipu21, topology
from ipu_stack.tilecode.decode import ROW_KINDS, decode, decode_rows

IntArray = npt.NDArray[np.int64]
_K = {name: i for i, name in enumerate(ROW_KINDS)}
_BIG = 1 << 32  # key = tile * _BIG + cycle
_MUX_NONE = 0x1FFF  # the decoder's reading of "no source" (facts: 13-bit XPIC values)
_BASE_WORD = ipu21.TILE_MEMORY_BASE // 4
_END_WORD = ipu21.TILE_MEMORY_END // 4
_TAIL = 256  # cycles past the last send within which every open window must have closed
_COPY_WORDS = 1 << 18  # words moved per gather and scatter (the temporary stays in cache)


@dataclass(frozen=True, slots=True)
class Row:
    """One tile's row: logical and physical tile, the address of its first word, its words
    (up to and including the closing ``br``)."""

    logical: int
    physical: int
    address: int
    words: npt.NDArray[np.uint32]


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
    # (index arrays: one scan of each mask instead of one per array taken)
    s_at = np.flatnonzero(
        ((d.kind == _K["send"]) | (d.kind == _K["sendpicp"])) & ((d.sctl & 3) != 0)
    )
    s_tile, s_start, s_items = phys[s_at], act[s_at], d.items[s_at]
    s_addr, s_sctl, s_where = d.address[s_at], d.sctl[s_at], addr[s_at]
    s_owner = owner[s_at]
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
    s_wpi = 1 + ((s_sctl >> 2) & 1)
    s_stop = s_addr + s_items * s_wpi  # one past the last word a send reads
    outside = (s_items > 0) & ((s_addr < _BASE_WORD) | (s_stop > _END_WORD))
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        k = 0 if s_addr[i] < _BASE_WORD else (_END_WORD - s_wpi[i] - s_addr[i]) // s_wpi[i] + 1
        raise SimulationError(
            f"{where} tile {s_tile[i]} cycle {s_start[i] + k}: send at {s_where[i]:#x} "
            f"reads word address {(s_addr[i] + k * s_wpi[i]) * 4:#x}, outside tile memory"
        )
    horizon = int(s_end.max()) if len(s_end) else 0

    # -- receive windows: the cycles from each source select to the next -----------------
    # source selects: delayxpic, and a sendpicp's XPIC half (selector bit 13, 13-bit value)
    is_pair = d.kind == _K["sendpicp"]
    x_at = np.flatnonzero((d.kind == _K["delayxpic"]) | is_pair)
    x_pair, x_xpic = is_pair[x_at], d.xpic[x_at]
    x_sel = np.where(x_pair, (x_xpic >> 13) & 1, d.sel[x_at])
    x_tile, x_act, x_where = phys[x_at], act[x_at], addr[x_at]
    x_value = np.where(x_pair, x_xpic & 0x1FFF, d.value[x_at])
    x_paired = x_sel == 1
    x_owner = owner[x_at]
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
    win = np.flatnonzero(w_len > 0)
    p_at = np.flatnonzero(((d.kind == _K["delaypic"]) | is_pair) & (d.sel == 0))
    pics = _Pics(
        phys[p_at], act[p_at] + 1, np.where(is_pair[p_at], d.pic[p_at], d.value[p_at]),
        addr[p_at],
    )  # fmt: skip
    windows = _Windows(
        x_tile[win], x_act[win], w_len[win], x_value[win], x_paired[win], x_where[win],
        x_lead[win],
    )  # fmt: skip
    sends = _Sends(s_tile, s_start, s_items, s_addr, s_wpi, s_sctl, s_where)
    pieces = _merged(sends)
    try:
        _transfer(where, rows, words32, logical_of, pieces, windows, pics)
    except SimulationError:
        if pieces is sends:
            raise
        # a fault (nothing was written yet): named per send, as the per-cycle simulation does
        _transfer(where, rows, words32, logical_of, sends, windows, pics)
        raise  # pragma: no cover - the sends' own matching faults as well
    return ends


def _merged(sends: _Sends) -> _Sends:
    """The sends with every run of consecutive sends of a tile that continue one another
    (the next cycle, the next words, the same width and directions) as one piece.

    A transfer longer than a ``send``'s 64 items is several such sends: the matching, checks
    and block copies are then per transfer instead of per send (the batch-4 SigLIP MLP's
    0.57 M sends are 51 K pieces). Overlaps, coverage and copies are unchanged by the
    merge; fault messages name a send, so a faulty phase is matched again send by send.
    """
    if len(sends.tile) < 2:
        return sends
    end = sends.start + sends.items
    joins = (
        (sends.tile[1:] == sends.tile[:-1])
        & (sends.start[1:] == end[:-1])
        & (sends.addr[1:] == sends.addr[:-1] + sends.items[:-1] * sends.wpi[:-1])
        & (sends.sctl[1:] == sends.sctl[:-1])
        & (sends.items[1:] > 0)
        & (sends.items[:-1] > 0)
    )
    if not joins.any():
        return sends
    heads = np.flatnonzero(np.concatenate([[True], ~joins]))
    return _Sends(
        sends.tile[heads], sends.start[heads], np.add.reduceat(sends.items, heads),
        sends.addr[heads], sends.wpi[heads], sends.sctl[heads], sends.where[heads],
    )  # fmt: skip


class _Sends(NamedTuple):
    """The sends of a phase that put items on the fabric, in physical tile and row order."""

    tile: IntArray
    start: IntArray  # cycle of the first item
    items: IntArray
    addr: IntArray  # word address of the first item
    wpi: IntArray  # words per item (1, or 2 for 64-bit items)
    sctl: IntArray
    where: IntArray  # instruction address


class _Windows(NamedTuple):
    """Receive windows (a live source select up to the next select), in physical tile and
    cycle order; every window has at least one cycle."""

    tile: IntArray
    start: IntArray  # first select cycle
    length: IntArray
    src: IntArray
    paired: npt.NDArray[np.bool_]
    where: IntArray
    lead: IntArray  # select -> write


class _Pics(NamedTuple):
    """Incoming-pointer writes (``delaypic`` and ``sendpicp``), in row order."""

    tile: IntArray
    effect: IntArray  # first write cycle that uses the pointer
    value: IntArray
    where: IntArray


def _transfer(
    where: str,
    rows: list[Row],
    words32: np.ndarray,
    logical_of: IntArray,
    sends: _Sends,
    w: _Windows,
    pics: _Pics,
) -> None:
    """Match every receive window with the sends it takes items from, check and copy.

    The work is per receive *run* (a window, split where a pointer write takes effect inside
    it: within a run the receiver writes consecutive pointer words, one item per cycle) and
    per *overlap* of a run with a send piece (the source's consecutive items), never per cycle:
    an overlap is one block copy. The checks are those of the per-cycle simulation
    (:mod:`ipu_stack.runtime.exchange_cycles`), made on run and piece endpoints: a run's
    cycles must be covered by sends of its source in the run's direction with its item width;
    its pointer range must lie in tile memory; no word may be written twice (the runs' word
    intervals are disjoint) or be read by a send of the phase (disjoint from the sends'
    intervals); every item must reach a receiver in every direction it is sent.
    """
    # per window: the pair's latency from send to select, and the fabric direction
    src = np.clip(w.src, 0, ipu21.TILES - 1)
    # computed once per run of windows of one (source, tile, width): a row selects the same
    # source window after window
    pair = (src * ipu21.TILES + w.tile) * 2 + w.paired
    new = np.concatenate([[True], pair[1:] != pair[:-1]]) if len(pair) else pair > 0
    heads = np.flatnonzero(new)
    of = np.cumsum(new) - 1
    h_src, h_tile = src[heads], w.tile[heads]
    h_latency = np.where(
        w.paired[heads],
        topology.paired_exchange_latency(h_src, h_tile),
        topology.exchange_latency(h_src, h_tile),
    )
    latency = h_latency[of] - w.lead
    direction = _direction(h_src, h_tile)[of]
    # runs: keys are tile * _BIG + write cycle (the lead is constant per tile, so write keys
    # are in select order); windows are disjoint and sorted
    w_key = w.tile * _BIG + w.start + w.lead
    w_stop = w_key + w.length
    p_order = np.argsort(pics.tile * _BIG + pics.effect, kind="stable")
    p_tile, p_value, p_where = pics.tile[p_order], pics.value[p_order], pics.where[p_order]
    p_key = p_tile * _BIG + pics.effect[p_order]
    j = np.searchsorted(w_key, p_key, side="right") - 1
    jc = np.maximum(j, 0)
    inside = (j >= 0) & (p_key > w_key[jc]) & (p_key < w_stop[jc]) if len(w_key) else j < -1
    r_key = _unique(np.concatenate([w_key, p_key[inside]]))
    if not len(r_key):
        return
    r_win = np.searchsorted(w_key, r_key, side="right") - 1
    same_next = np.append(r_win[1:] == r_win[:-1], False)
    r_len = np.where(same_next, np.append(r_key[1:], 0), w_stop[r_win]) - r_key
    r_tile = w.tile[r_win]
    r_write = r_key - r_tile * _BIG  # write cycle of the run's first item
    r_cycle = r_write - w.lead[r_win]  # its select cycle
    r_paired = w.paired[r_win]
    r_wpi = 1 + r_paired.astype(np.int64)
    r_src, r_where = w.src[r_win], w.where[r_win]

    # the pointer: the latest pointer write in effect at the run's first write, advanced by
    # the words the tile has received since that write took effect
    pi = np.searchsorted(p_key, r_key, side="right") - 1
    pic = np.maximum(pi, 0)
    has = (pi >= 0) & (p_tile[pic] == r_tile) if len(p_key) else pi > len(p_key)
    if not has.all():
        i = int(np.flatnonzero(~has)[0])
        raise SimulationError(
            f"{where} tile {r_tile[i]} cycle {r_write[i]}: receive (mux set at {r_where[i]:#x}) "
            "with no incoming pointer set"
        )
    cum = np.concatenate([[0], np.cumsum(r_len * r_wpi)])
    r_ptr = p_value[pic] + cum[:-1] - cum[np.searchsorted(r_key, p_key[pic], side="left")]

    # overlaps of each run with the send pieces of its source (send cycles s0 .. s0 + len)
    s_end = sends.start + sends.items
    s0 = r_cycle - latency[r_win]
    q0 = r_src * _BIG + s0
    lo = np.searchsorted(sends.tile * _BIG + s_end, q0, side="right")
    hi = np.searchsorted(sends.tile * _BIG + sends.start, q0 + r_len, side="left")
    n_ov = np.maximum(hi - lo, 0)
    ov_run, k = _segments(n_ov)
    ov_piece = lo[ov_run] + k
    ov_a = np.maximum(s0[ov_run], sends.start[ov_piece])
    ov_b = np.minimum((s0 + r_len)[ov_run], s_end[ov_piece])
    # cycles of a run no piece covers, or covered by a piece sent the other way
    misses = _uncovered(ov_run, ov_a, ov_b, s0, r_len)
    wrong_way = (sends.sctl[ov_piece] & direction[r_win[ov_run]]) == 0
    misses.append((ov_run[wrong_way], ov_a[wrong_way]))
    miss_run = np.concatenate([m[0] for m in misses])
    if len(miss_run):
        miss_cycle = np.concatenate([m[1] for m in misses]) + latency[r_win[miss_run]]
        i = int(np.argmin(r_tile[miss_run] * _BIG + miss_cycle))
        run = int(miss_run[i])
        raise SimulationError(
            f"{where} tile {r_tile[run]} cycle {miss_cycle[i]}: receive with no sender (mux "
            f"selects tile {r_src[run]} from {r_where[run]:#x}; nothing it sent arrives then)"
        )
    ov_lat = latency[r_win[ov_run]]
    wrong = (sends.wpi[ov_piece] == 2) != r_paired[ov_run]
    if wrong.any():
        o = np.flatnonzero(wrong)
        i = int(o[np.argmin(r_tile[ov_run[o]] * _BIG + ov_a[o] + ov_lat[o])])
        run, piece = int(ov_run[i]), int(ov_piece[i])
        got = "64-bit" if sends.wpi[piece] == 2 else "32-bit"
        raise SimulationError(
            f"{where} tile {r_tile[run]} cycle {ov_a[i] + ov_lat[i]}: unexpected format: a {got} "
            f"item from tile {r_src[run]} (send at {sends.where[piece]:#x}) reaches a receiver "
            f"in {'64' if r_paired[run] else '32'}-bit format (mux set at {r_where[run]:#x})"
        )
    r_words = r_len * r_wpi
    outside = (r_ptr < _BASE_WORD) | (r_ptr + r_words > _END_WORD)
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        n = 0 if r_ptr[i] < _BASE_WORD else (_END_WORD - r_wpi[i] - r_ptr[i]) // r_wpi[i] + 1
        raise SimulationError(
            f"{where} tile {r_tile[i]} cycle {r_write[i] + n}: incoming pointer "
            f"{(r_ptr[i] + n * r_wpi[i]) * 4:#x} (set at {p_where[pic[i]]:#x}) is outside tile "
            "memory"
        )
    dst_log = logical_of[r_tile]
    src_log = logical_of[r_src]
    if (src_log < 0).any() or (dst_log < 0).any():  # pragma: no cover - rows name package tiles
        raise SimulationError(f"{where}: an exchange names a tile outside the package")
    # no word written twice: the runs' word intervals are disjoint
    d_key = dst_log * _BIG + r_ptr - _BASE_WORD
    order = np.argsort(d_key, kind="stable")
    d_sorted, d_stop = d_key[order], (d_key + r_words)[order]
    reach = np.maximum.accumulate(d_stop)
    twice = d_sorted[1:] < reach[:-1]
    if twice.any():
        b = int(np.flatnonzero(twice)[0]) + 1
        word = int(d_sorted[b])
        a = int(np.flatnonzero(d_stop[:b] > word)[0])
        # the later of the two writes of that word
        at = [
            (int(r_write[r] + (word - d_key[r]) // r_wpi[r]), int(r)) for r in (order[a], order[b])
        ]
        cycle, run = max(at)
        raise SimulationError(
            f"{where} tile {r_tile[run]} cycle {cycle}: a second word is written at "
            f"{(word % _BIG + _BASE_WORD) * 4:#x} in one phase (pointer set at "
            f"{p_where[pic[run]]:#x})"
        )
    # no word both sent and received in the phase
    sent = sends.items > 0
    s_key = (logical_of[sends.tile] * _BIG + sends.addr - _BASE_WORD)[sent]
    u_start, u_stop = _union(s_key, s_key + (sends.items * sends.wpi)[sent])
    if len(u_start):
        u = np.searchsorted(u_stop, d_key, side="right")
        uc = np.minimum(u, len(u_start) - 1)
        hit = (u < len(u_start)) & (u_start[uc] < d_key + r_words)
        if hit.any():
            word = int(np.maximum(d_key, u_start[uc])[hit].min())
            physical = {r.logical: r.physical for r in rows}
            tile = physical.get(word // _BIG, word // _BIG)
            raise SimulationError(
                f"{where} tile {tile}: sends the word at {(word % _BIG + _BASE_WORD) * 4:#x}, "
                "which the same phase receives into"
            )
    # every item goes somewhere: each direction bit of a send reaches a receiver that takes
    # the item (a word sent into the fabric for no one is a wrong row: an extra count, a
    # stray direction bit)
    _check_reached(where, sends, ov_piece, direction[r_win[ov_run]], ov_a, ov_b)
    wpi = sends.wpi[ov_piece]
    _copy(
        words32,
        src_log[ov_run],
        sends.addr[ov_piece] + (ov_a - sends.start[ov_piece]) * wpi - _BASE_WORD,
        dst_log[ov_run],
        r_ptr[ov_run] + (ov_a - s0[ov_run]) * wpi - _BASE_WORD,
        (ov_b - ov_a) * wpi,
    )


def _check_reached(
    where: str, sends: _Sends, ov_piece: IntArray, ov_dir: IntArray, ov_a: IntArray, ov_b: IntArray
) -> None:
    """Every item of a send reaches a receiver in each direction it is sent (a word sent into
    the fabric for no one is a wrong row: an extra count, a stray direction bit).

    Per (piece, direction): the union of the overlaps' send cycles ``[ov_a, ov_b)`` must
    cover the piece; the fault names the first item (in piece and item order) missed.
    """
    s_end = sends.start + sends.items
    group = ov_piece * 4 + ov_dir
    order = np.argsort(group * _BIG + ov_a, kind="stable")
    g, a, b = group[order], ov_a[order], ov_b[order]
    new = np.concatenate([[True], g[1:] != g[:-1]]) if len(g) else g > 0
    gid = np.cumsum(new) - 1
    keys = g[new]
    reach = np.maximum.accumulate(gid * _BIG + b) - gid * _BIG  # covered up to, per group
    piece = keys // 4
    covered_to = np.where(new, sends.start[g // 4], np.concatenate([[0], reach[:-1]]))
    first_miss = s_end[piece].copy()  # per group: first send cycle no overlap covers
    gap = a > covered_to
    np.minimum.at(first_miss, gid[gap], covered_to[gap])
    last = np.append(np.flatnonzero(new)[1:], len(g)) - 1
    first_miss = np.minimum(
        first_miss, np.where(reach[last] < s_end[piece], reach[last], s_end[piece])
    )
    missed = np.full((len(sends.items), 2), -1, np.int64)  # first missed item, per direction
    pieces = np.arange(len(sends.items))
    for bit in (1, 2):
        want = (sends.sctl & bit) != 0
        at = np.searchsorted(keys, pieces * 4 + bit)
        atc = np.minimum(at, max(len(keys) - 1, 0))
        has = (at < len(keys)) & (keys[atc] == pieces * 4 + bit) if len(keys) else at < 0
        miss = np.where(has, first_miss[atc] if len(keys) else 0, sends.start)
        missed[:, bit - 1] = np.where(want & (miss < s_end), miss - sends.start, -1)
    lost = (missed >= 0).any(axis=1)
    if lost.any():
        p = int(np.flatnonzero(lost)[0])
        one, two = missed[p]
        side = 1 if one >= 0 and (two < 0 or one <= two) else 2
        k = int(one if side == 1 else two)
        raise SimulationError(
            f"{where} tile {sends.tile[p]} cycle {sends.start[p] + k}: send at "
            f"{sends.where[p]:#x} (sctl {sends.sctl[p]}) drives direction {side} with an item no "
            "tile there receives"
        )


def _direction(src: IntArray, dest: IntArray) -> IntArray:
    """Fabric direction (1 or 2) of each window's source."""
    return np.asarray(topology.direction(src, dest), np.int64)


def _uncovered(
    ov_run: IntArray, ov_a: IntArray, ov_b: IntArray, s0: IntArray, r_len: IntArray
) -> list[tuple[IntArray, IntArray]]:
    """Send cycles of runs that no overlap covers: (run, first missing send cycle) pairs for a
    gap before an overlap, a run with no overlap, and a run whose overlaps stop early.

    Overlaps (send cycles ``[ov_a, ov_b)`` of run ``ov_run``) come in run and cycle order;
    run r needs send cycles ``[s0[r], s0[r] + r_len[r])``.
    """
    n_ov = np.bincount(ov_run, minlength=len(s0))
    first_ov = np.concatenate([[True], ov_run[1:] != ov_run[:-1]]) if len(ov_run) else ov_run > 0
    covered_to = np.where(first_ov, s0[ov_run], np.concatenate([[0], ov_b[:-1]]))
    tail = s0 + r_len
    run_end = np.full(len(s0), -1, np.int64)
    last = np.append(ov_run[1:] != ov_run[:-1], True) if len(ov_run) else ov_run > 0
    run_end[ov_run[last]] = ov_b[last]
    empty = n_ov == 0
    short = ~empty & (run_end < tail)
    gap = ov_a > covered_to
    return [
        (ov_run[gap], covered_to[gap]),
        (np.flatnonzero(empty), s0[empty]),
        (np.flatnonzero(short), run_end[short]),
    ]


def _copy(
    words32: np.ndarray,
    src: IntArray,
    src_word: IntArray,
    dst: IntArray,
    dst_word: IntArray,
    count: IntArray,
) -> None:
    """Copy blocks ``words32[src, src_word:+count]`` to ``words32[dst, dst_word:+count]``.

    The blocks are disjoint from one another and from their sources (checked by the
    caller), so the order does not matter. Blocks of one length are moved by one gather and
    one scatter on a view of the memory whose element at each word address is the block of
    that length starting there (opaque bytes: a memcpy per block; measured ~10 times faster
    than a ``[blocks, words]`` sliding-window gather).
    """
    if not len(count):
        return
    if not words32.flags.c_contiguous:  # pragma: no cover - the simulator's memory is
        raise ValueError("exchange: tile memories must be one C-contiguous array")
    flat = words32.reshape(-1)
    step = flat.strides[0]
    width = words32.shape[1]
    src_flat = src * width + src_word
    dst_flat = dst * width + dst_word
    order = np.argsort(count, kind="stable")
    lengths = count[order]
    cuts = np.flatnonzero(np.diff(lengths)) + 1
    for group in np.split(order, cuts):
        n = int(count[group[0]])
        # every word address starts an n-word block, one NumPy element (memcpy per index)
        windows = np.lib.stride_tricks.as_strided(
            flat, shape=(len(flat) - n + 1, n), strides=(step, step), writeable=True
        )
        blocks = windows.view(np.dtype((np.void, step * n)))[:, 0]
        # in slices of ~1 MiB: a large temporary costs more in page faults than the copy
        per = max(1, _COPY_WORDS // n)
        for lo in range(0, len(group), per):
            part = group[lo : lo + per]
            blocks[dst_flat[part]] = blocks[src_flat[part]]


def _union(start: IntArray, stop: IntArray) -> tuple[IntArray, IntArray]:
    """The union of intervals ``[start, stop)`` as sorted disjoint intervals."""
    if not len(start):
        return start, stop
    order = np.argsort(start, kind="stable")
    start, stop = start[order], stop[order]
    reach = np.maximum.accumulate(stop)
    new = np.concatenate([[True], start[1:] > reach[:-1]])
    heads = np.flatnonzero(new)
    ends = np.append(heads[1:], len(start)) - 1
    return start[heads], reach[ends]


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

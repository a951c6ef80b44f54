"""Reshapes and row permutations as new names for bytes already on chip (no data moves).

A value ``V`` that is a reshape or a last-axis-keeping transpose of ``S`` holds the same
elements; where every row of ``S``'s shards lands in ``V`` as one run of columns, the shards of
``V`` are the same bytes read with other coordinates. Each source shard is cut into *atoms*
(one source row, one run of view columns), every atom is given its view row and columns, and
atoms that continue each other (next view row, next storage row of the same shard, same
columns) are merged back into shards. ``None`` means the bytes cannot be named that way (a
transposed shard, a piece that would not start on a 32-bit word of memory or of the view's
rows, a reshape whose row widths do not divide): the caller moves the data instead.

Three element maps, all on the flat-row views ``[Ns, Cs]`` and ``[Nv, Cv]``:

- *rows* (``Cv == Cs``): source row ``q`` is view row ``view_row[q]`` (a transpose that keeps
  the last axis, or a reshape of the leading axes);
- *split* (``Cs == k * Cv``): source row ``q`` columns ``[j*Cv, (j+1)*Cv)`` are view row
  ``q*k + j``;
- *merge* (``Cv == k * Cs``): source row ``q`` is view row ``q // k`` at columns
  ``(q % k) * Cs`` onwards.
"""

from __future__ import annotations

import numpy as np

from ipu_stack.graph.compute_graph import ComputeGraph, Value
from ipu_stack.low.program import Ref, Shard
from ipu_stack.target.ipu21 import WORD_BYTES

#: Most shards an alias may have per source shard before moving the data is preferred (an
#: elementwise consumer makes one call per shard of its anchor).
MAX_ALIAS_SPREAD = 4


def _table(shards: list[Shard]) -> tuple[np.ndarray, list[str]]:
    names = sorted({sh.ref.buffer for sh in shards})
    ids = {name: i for i, name in enumerate(names)}
    table = np.array(
        [(sh.tile, ids[sh.ref.buffer], sh.ref.offset, sh.row_stride, *sh.rows, *sh.cols)
         for sh in shards],
        dtype=np.int64,
    ).reshape(-1, 8)  # fmt: skip
    return table, names


def alias_shards(
    shards: list[Shard],
    eb: int,
    c_src: int,
    c_view: int,
    view_row: np.ndarray | None = None,
    spread: int | None = MAX_ALIAS_SPREAD,
    base: int | None = None,
) -> list[Shard] | None:
    """The view's shards on the bytes of ``shards`` (source row width ``c_src`` elements of
    ``eb`` bytes, view row width ``c_view``), or ``None`` where that is not possible.

    ``view_row`` (only when the widths are equal) gives each source row's view row; by
    default rows keep their flat order. ``spread`` bounds the shards per shard of the bytes'
    owner (``base`` shards when ``shards`` are themselves an alias, else ``len(shards)``;
    ``None``: no bound, for a view that another view renames again).
    """
    if not shards or any(sh.transposed for sh in shards):
        return None
    if c_src != c_view and view_row is not None:
        raise ValueError("a row permutation needs equal row widths")
    if c_src % c_view and c_view % c_src:
        return None
    table, names = _table(shards)
    tile, buf, off, stride, r0, r1, c0, c1 = table.T
    counts = r1 - r0
    # one atom per (shard, source row)
    which = np.repeat(np.arange(len(shards)), counts)
    q = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    byte = off[which] + q * stride[which]
    q = q + r0[which]
    lo, hi = c0[which], c1[which]
    if c_src == c_view:
        vrow = q if view_row is None else np.asarray(view_row, dtype=np.int64)[q]
        vlo, vhi = lo, hi
    elif c_src > c_view:  # split: each source row is k view rows
        k = c_src // c_view
        first, last = lo // c_view, (hi - 1) // c_view
        pieces = last - first + 1
        which = np.repeat(which, pieces)
        j = np.repeat(first, pieces) + (
            np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)
        )
        q, byte, lo, hi = (np.repeat(a, pieces) for a in (q, byte, lo, hi))
        start = np.maximum(lo, j * c_view)
        end = np.minimum(hi, (j + 1) * c_view)
        byte = byte + (start - lo) * eb
        vrow, vlo, vhi = q * k + j, start - j * c_view, end - j * c_view
    else:  # merge: k source rows make one view row
        k = c_view // c_src
        vrow, vlo, vhi = q // k, (q % k) * c_src + lo, (q % k) * c_src + hi
    if (byte % WORD_BYTES).any() or (stride % WORD_BYTES).any():
        return None
    # pieces must start (and, inside a row, end) on words of the view's rows too: exchange
    # moves whole words from word-aligned column offsets
    if ((vlo * eb) % WORD_BYTES).any() or (((vhi * eb) % WORD_BYTES != 0) & (vhi != c_view)).any():
        return None
    st = stride[which]
    # merge atoms that continue each other: same tile, buffer, stride and columns, next view
    # row at the next storage row
    order = np.lexsort((vrow, vhi, vlo, st, buf[which], tile[which]))
    t_o, b_o, s_o = tile[which][order], buf[which][order], st[order]
    lo_o, hi_o, v_o, by_o = vlo[order], vhi[order], vrow[order], byte[order]
    cont = np.zeros(order.size, dtype=bool)
    cont[1:] = (
        (t_o[1:] == t_o[:-1]) & (b_o[1:] == b_o[:-1]) & (s_o[1:] == s_o[:-1])
        & (lo_o[1:] == lo_o[:-1]) & (hi_o[1:] == hi_o[:-1])
        & (v_o[1:] == v_o[:-1] + 1) & (by_o[1:] == by_o[:-1] + s_o[:-1])
    )  # fmt: skip
    starts = np.flatnonzero(~cont)
    if spread is not None and starts.size > spread * (base or len(shards)):
        return None
    lengths = np.diff(np.append(starts, order.size))
    return [
        Shard(t, Ref(names[b], o), (v, v + n), (a, e), s)
        for t, b, o, v, n, a, e, s in zip(
            t_o[starts].tolist(), b_o[starts].tolist(), by_o[starts].tolist(),
            v_o[starts].tolist(), lengths.tolist(), lo_o[starts].tolist(),
            hi_o[starts].tolist(), s_o[starts].tolist(), strict=True,
        )
    ]  # fmt: skip


def renamed_again(graph: ComputeGraph, value: Value) -> bool:
    """Whether every consumer of ``value`` renames its bytes again (a reshape, or a transpose
    whose first step keeps the last axis), so that a finely cut alias of ``value`` is only an
    intermediate and may have any number of shards."""
    consumers = graph.consumers(value.id)
    if not consumers:
        return False
    for op in consumers:
        if op.kind == "view":
            continue
        if op.kind != "transpose":
            return False
        # (imported here: the planner's candidates import lowering helpers at module level)
        from ipu_stack.mid.candidates.indexing import transpose_steps

        perm = tuple(op.attr("perm"))
        if perm[-1] != len(perm) - 1 and transpose_steps(perm)[0] is None:
            return False  # transposes value's own shards where they are: no renaming first
    return True

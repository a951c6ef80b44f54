"""Write an elementwise call's rows straight where local copies would have moved them.

Lowering delivers an operation's operand block by cutting it against the producer's shards:
pieces already on the tile become local copies (``low/gather.py``). When the producer is an
elementwise or row-wise call (a ``MapCall``: bias add, GeLU, layer norm, softmax) whose output
rows are each copied whole into another buffer at a constant row stride, the copies are pure
overhead: one call per row, each paying the copy kernel's fixed cost (facts §12.1: 288 cycles
for a 320-byte row that takes 40 to move). The batch-4 SigLIP MLP spent 54 such copies,
17,712 cycles per tile, moving GeLU rows into the down projection's left block.

:func:`write_in_place` rewrites such a call to write its output view into the copies'
destination (same rows, columns and element type, the destination's row stride) and drops the
copies and the buffer nobody reads any more. It applies only when it cannot change what any
call reads:

- the source buffer (on that tile) is referenced nowhere else: not by another step, an
  exchange, a loop's iterated buffers, a host binding, or another call of the step except
  the ``MapCall`` s writing it (which must not read it) and the copies reading it;
- every row every writer writes is copied whole, once, after the writer, into one buffer at
  offsets ``d0 + i * stride`` (word-aligned like the original view), and every copy is such a
  row;
- between the first writer and the last copy no other call on the tile touches the
  destination buffer, except zero fills of it, which move to just before the first writer
  (they ran before the copies overwrote those bytes; they now run before the writer does).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace

from ipu_stack.low.program import (
    AddCall,
    Binding,
    Buffer,
    ComputeStep,
    CopyCall,
    ExchangeStep,
    FillCall,
    GemmCall,
    KernelCall,
    MapCall,
    Ref,
    RepeatStep,
    Step,
    View,
)
from ipu_stack.target import ipu21

_Key = tuple[int, str]


def _buffers(call: KernelCall) -> Iterator[tuple[str, bool]]:
    """``(buffer, written)`` for every operand of ``call``."""
    if isinstance(call, MapCall):
        yield call.out.ref.buffer, True
        for v in call.inputs:
            yield v.ref.buffer, False
    elif isinstance(call, CopyCall):
        yield call.dst.buffer, True
        yield call.src.buffer, False
    elif isinstance(call, FillCall):
        yield call.dst.buffer, True
    elif isinstance(call, GemmCall):
        yield call.out.buffer, True
        yield call.left.buffer, False
        yield call.right.buffer, False
    elif isinstance(call, AddCall):
        yield call.out.buffer, True
        for r in call.inputs:
            yield r.buffer, False
    else:  # pragma: no cover - every call class is listed above
        raise TypeError(type(call).__name__)


def _candidates(steps: list[Step]) -> dict[_Key, int]:
    """``(tile, buffer)`` written by a MapCall and read by a CopyCall of the same step."""
    found: dict[_Key, int] = {}
    repeated: set[_Key] = set()
    for si, step in enumerate(steps):
        if not isinstance(step, ComputeStep):
            continue
        outs = {(c.tile, c.out.ref.buffer) for c in step.calls if type(c) is MapCall}
        if not outs:
            continue
        for c in step.calls:
            key = (c.tile, c.src.buffer) if type(c) is CopyCall else None
            if key in outs and found.setdefault(key, si) != si:
                repeated.add(key)
    for k in repeated:
        del found[k]
    return found


def _referenced_elsewhere(
    steps: list[Step], bindings: list[Binding], cands: dict[_Key, int]
) -> set[_Key]:
    """Candidates some reference other than their step's writers and copies touches."""
    bad: set[_Key] = set()
    for b in bindings:
        bad.update(k for sh in b.shards if (k := (sh.tile, sh.ref.buffer)) in cands)
    for si, step in enumerate(steps):
        if isinstance(step, RepeatStep):
            bad.update(k for k in step.iterated if k in cands)
        elif isinstance(step, ExchangeStep):
            transfers = step.transfers
            touched = {(t.source_tile, t.source.buffer) for t in transfers}
            touched.update([(tile, ref[0]) for t in transfers for tile, ref in t.destinations])
            bad.update(touched.intersection(cands))
        else:
            for c in step.calls:
                for buf, written in _buffers(c):
                    k = (c.tile, buf)
                    if k not in cands:
                        continue
                    ok = cands[k] == si and (
                        (type(c) is MapCall and written) or (type(c) is CopyCall and not written)
                    )
                    if not ok:
                        bad.add(k)
    return bad


def _rewrite(
    calls: list[KernelCall | None],
    positions: list[int],
    source: str,
    ahead: dict[int, list[KernelCall]],
    on_tile: list[int],
) -> bool:
    """Rewrite one tile's writers of ``source`` (calls at ``positions`` of the step, in
    order); returns whether it did. ``calls`` is edited in place (dropped calls -> None);
    calls to run just before position ``p`` are added to ``ahead[p]``. ``on_tile``: the
    positions of every call of the tile, ascending."""
    writers = [p for p in positions if type(calls[p]) is MapCall]
    # every run of every copy: source offset -> (position, destination buffer, offset, bytes)
    runs: dict[int, tuple[int, str, int, int]] = {}
    for p in positions:
        c = calls[p]
        if type(c) is CopyCall:
            for r in range(c.rows):
                at = c.src.offset + r * c.src_stride
                if at in runs:
                    return False
                runs[at] = (p, c.dst.buffer, c.dst.offset + r * c.dst_stride, c.size)
    plan: list[tuple[int, View]] = []
    matched = 0
    used: set[int] = set()
    target = None
    for wp in writers:
        w0 = calls[wp]
        assert isinstance(w0, MapCall)
        out = w0.out
        row_bytes = out.cols * ipu21.precision(out.dtype).element_bytes
        if any(v.ref.buffer == source for v in w0.inputs):
            return False
        dsts = []
        for i in range(out.rows):
            run = runs.pop(out.ref.offset + i * out.stride, None)
            if run is None or run[0] < wp or run[3] != row_bytes or target not in (None, run[1]):
                return False
            target = run[1]
            used.add(run[0])
            matched += 1
            dsts.append(run[2])
        stride = dsts[1] - dsts[0] if len(dsts) > 1 else row_bytes
        if stride < row_bytes or any(d != dsts[0] + i * stride for i, d in enumerate(dsts)):
            return False
        if (dsts[0] - out.ref.offset) % 8 or (len(dsts) > 1 and (stride - out.stride) % 8):
            return False
        assert target is not None
        plan.append((wp, View(Ref(target, dsts[0]), out.rows, out.cols, stride, out.dtype)))
    if not plan or runs or target is None or target == source:
        return False  # a run no writer's row accounts for: the source is read otherwise
    first, last = min(writers), max(used)
    fills = []
    mine = set(writers) | used
    for p in on_tile[bisect_left(on_tile, first) : bisect_right(on_tile, last)]:
        c = calls[p]
        if c is None or p in mine:
            continue
        if any(buf == target for buf, _ in _buffers(c)):
            if type(c) is not FillCall:
                return False
            fills.append(p)
    for wp in writers:
        w = calls[wp]
        assert isinstance(w, MapCall)
        if any(v.ref.buffer == target for v in w.inputs):
            return False
    for wp, view in plan:
        w = calls[wp]
        assert isinstance(w, MapCall)
        calls[wp] = MapCall(w.tile, w.kind, view, w.inputs, w.attrs)
    for p in used:
        calls[p] = None
    for p in fills:  # the zero fills now run just before the first writer
        fill = calls[p]
        assert fill is not None
        ahead[first].append(fill)
        calls[p] = None
    return True


def write_in_place(
    steps: list[Step], buffers: list[Buffer], bindings: list[Binding]
) -> tuple[list[Buffer], int]:
    """Apply the rewrite to every qualifying (tile, buffer); edits ``steps`` in place.

    Returns the buffers still used and the number of copy calls removed.
    """
    cands = _candidates(steps)
    if not cands:
        return buffers, 0
    for k in _referenced_elsewhere(steps, bindings, cands):
        del cands[k]
    by_step: dict[int, list[_Key]] = defaultdict(list)
    for k, si in cands.items():
        by_step[si].append(k)
    dropped: set[_Key] = set()
    removed = 0
    for si, keys in sorted(by_step.items()):
        step = steps[si]
        assert isinstance(step, ComputeStep)
        wanted = set(keys)
        tiles = {k[0] for k in keys}
        positions: dict[_Key, list[int]] = defaultdict(list)
        on_tile: dict[int, list[int]] = defaultdict(list)
        for p, c in enumerate(step.calls):
            if c.tile in tiles:
                on_tile[c.tile].append(p)
            if type(c) is MapCall:
                k = (c.tile, c.out.ref.buffer)
            elif type(c) is CopyCall:
                k = (c.tile, c.src.buffer)
            else:
                continue
            if k in wanted:
                positions[k].append(p)
        calls: list[KernelCall | None] = list(step.calls)
        ahead: dict[int, list[KernelCall]] = defaultdict(list)
        for k in sorted(keys):
            if _rewrite(calls, positions[k], k[1], ahead, on_tile[k[0]]):
                dropped.add(k)
        kept: list[KernelCall] = []
        for p, maybe in enumerate(calls):
            kept.extend(ahead.get(p, ()))
            if maybe is not None:
                kept.append(maybe)
        removed += len(step.calls) - len(kept)
        step.calls[:] = kept
    if not dropped:
        return buffers, 0
    gone_by_tile: dict[int, set[str]] = defaultdict(set)
    for tile, name in dropped:
        gone_by_tile[tile].add(name)
    out = []
    for b in buffers:
        gone = gone_by_tile.get(b.tile)
        if gone is None:
            out.append(b)
        elif b.name not in gone:
            if any(a in gone for a in b.avoid):
                b = replace(b, avoid=tuple(a for a in b.avoid if a not in gone))
            out.append(b)
    return out, removed

"""Layer rolling: consecutive identical subgraphs become one structured ``repeat``.

An exporter writes a 27-layer encoder as 27 copies of the same operations that differ only in
their weights. Lowering and scheduling such a graph costs 27 times one layer, and so does the
package. ``roll_layers`` finds the longest run of consecutive segments of the operation list
that are the same program (same kinds, attributes, shapes, precisions and internal dataflow),
where

- exactly one value flows from each segment into the next (the carried value, e.g. the
  hidden state), with the same shape and precision going in and out;
- every other operand of a segment is either a parameter (the segment's own weights: the
  segments' parameters at one position are stacked into one ``[count, ...]`` parameter that
  the loop iterates) or the same value in every segment (an invariant, e.g. an attention mask
  computed once before the layers);
- nothing a segment computes is used outside the run except the last segment's result;

and rebuilds the graph with that run as one ``repeat`` whose body is the first segment.
Graphs whose "layers" differ in any structural way (a shape, an attribute, an extra operation,
a value that escapes) are left as they are.

Detection compares cheap per-operation signatures (kind, attributes, shapes and precisions of
the result and the operands) shifted by every period with NumPy, so the search is quadratic in the
number of operations with vectorised inner loops; the exact structural check then runs only
on the candidates that cover the most operations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ipu_stack.graph.compute_graph import ComputeGraph, Operation, Value

#: fewest segments worth a loop
MIN_COUNT = 2
#: structural checks tried before giving up on a graph (each is linear in the run's length)
MAX_CHECKS = 200


@dataclass(frozen=True, slots=True)
class _Run:
    """A validated run: ``count`` segments of ``period`` operations from ``start``."""

    start: int
    period: int
    count: int
    carried_in: int  # value id entering segment 0
    carried_slot: int  # position (within a segment) of the operation producing the result
    invariants: tuple[int, ...]  # value ids shared by every segment
    iterated: tuple[tuple[int, ...], ...]  # per weight sequence, the parameter of each segment
    operand_roles: dict[tuple[int, int], tuple[str, int]] = field(default_factory=dict)
    sequence_of: dict[tuple[int, int], int] = field(default_factory=dict)  # operand -> sequence


@dataclass(slots=True)
class RolledGraph:
    """The result of ``roll_layers``.

    Attributes:
        graph: the rewritten graph (the input graph itself when nothing was rolled).
        parameters: parameter data by name for the new graph (stacked per-layer weights added,
            weights used only inside rolled layers removed).
        value_map: old value id -> new value, for every value that still exists (host inputs,
            parameters still used, operations outside the rolled runs, the run's result).
        fusions: one line per rolled run (``rolled 27 layers of 31 operations ...``).
    """

    graph: ComputeGraph
    parameters: dict[str, np.ndarray]
    value_map: dict[int, Value]
    fusions: list[str]


def roll_layers(
    graph: ComputeGraph, parameters: Mapping[str, np.ndarray], min_count: int = MIN_COUNT
) -> RolledGraph:
    """Roll every run of identical consecutive layers of ``graph`` into a ``repeat``.

    Args:
        graph: a verified graph (outputs set).
        parameters: data of the graph's parameters by name (needed to stack layer weights).
        min_count: the fewest consecutive equal segments that become a loop.

    Returns:
        The rolled graph, its parameter data, the value map and one fusion line per run.
    """
    params = dict(parameters)
    value_map = {v.id: v for v in graph.values}
    fusions: list[str] = []
    while True:
        run = _find_run(graph, min_count)
        if run is None:
            return RolledGraph(graph, params, value_map, fusions)
        graph, params, step_map, line = _rebuild(graph, params, run)
        value_map = {old: step_map[v.id] for old, v in value_map.items() if v.id in step_map}
        fusions.append(line)


# -- detection ---------------------------------------------------------------------------------
def _signatures(graph: ComputeGraph) -> np.ndarray:
    """One integer per operation; equal integers = same local shape of computation."""
    codes: dict[object, int] = {}
    out = np.empty(len(graph.operations), dtype=np.int64)
    for i, op in enumerate(graph.operations):
        if op.kind == "repeat":
            out[i] = -1 - i  # never matches anything: loops are not nested by rolling
            continue
        # operand kinds are left out: the first layer reads the carried value from a host
        # input or a parameter where the others read an operation's result
        operands = tuple((graph.value(v).shape, graph.value(v).dtype) for v in op.inputs)
        result = graph.value(op.output)
        key = (op.kind, _attrs_key(op), operands, result.shape, result.dtype, result.scale_exponent)
        out[i] = codes.setdefault(key, len(codes))
    return out


def _attrs_key(op: Operation) -> tuple[tuple[str, str], ...]:
    return tuple((k, repr(v)) for k, v in op.attrs)


def _candidates(sig: np.ndarray, min_count: int) -> list[tuple[int, int, int]]:
    """(coverage, start, period) of every periodic stretch, most operations first."""
    n = len(sig)
    found: list[tuple[int, int, int]] = []
    for period in range(1, n // min_count + 1):
        same = sig[:-period] == sig[period:]
        if not same.any():
            continue
        # maximal runs of True: ops i..j with sig[i] == sig[i + period]
        padded = np.concatenate(([False], same, [False]))
        edges = np.flatnonzero(padded[1:] != padded[:-1])
        for lo, hi in zip(edges[::2], edges[1::2], strict=True):
            span = int(hi - lo) + period  # periodic operations lo .. hi - 1 + period
            if span >= min_count * period:
                found.append((span, int(lo), period))
    found.sort(key=lambda c: (-c[0], c[2], c[1]))
    return found


def _find_run(graph: ComputeGraph, min_count: int) -> _Run | None:
    """The valid run covering the most operations (the shortest period on a tie)."""
    sig = _signatures(graph)
    best: _Run | None = None
    checks = 0
    for span, lo, period in _candidates(sig, min_count):
        if best is not None and span < best.period * best.count:
            break
        for shift in range(period):
            count = (span - shift) // period
            if count < min_count or (best and _worse(count * period, period, best)):
                continue
            run = _check(graph, lo + shift, period, count, min_count, best)
            checks += 1
            if run is not None:
                best = run
            if checks >= MAX_CHECKS:
                return best
    return best


def _worse(coverage: int, period: int, best: _Run) -> bool:
    return (coverage, -period) <= (best.count * best.period, -best.period)


def _check(
    graph: ComputeGraph, start: int, period: int, count: int, min_count: int, best: _Run | None
) -> _Run | None:
    """The longest valid sub-run of ``count`` segments from ``start`` (whole segments)."""
    for length in range(count, min_count - 1, -1):
        if best is not None and _worse(length * period, period, best):
            return None
        for skip in range(count - length + 1):
            run = _check_exact(graph, start + skip * period, period, length)
            if run is not None:
                return run
    return None


def _check_exact(graph: ComputeGraph, start: int, period: int, count: int) -> _Run | None:
    ops = graph.operations
    end = start + period * count
    position = {op.output: i for i, op in enumerate(ops)}
    seg_of = {ops[i].output: (i - start) // period for i in range(start, end)}

    roles: dict[tuple[int, int], tuple[str, int]] = {}  # (slot, operand) -> role
    invariant_ids: dict[tuple[int, int], int] = {}
    iterated: dict[tuple[int, int], list[int]] = {}
    carried_in = -1
    for j in range(count):
        base = start + j * period
        for slot in range(period):
            op = ops[base + slot]
            for m, vid in enumerate(op.inputs):
                value = graph.value(vid)
                if vid in seg_of and seg_of[vid] == j:
                    role = ("internal", position[vid] - base)
                elif vid in seg_of and seg_of[vid] == j - 1:
                    role = ("carried", position[vid] - (base - period))
                elif vid in seg_of:
                    return None  # reaches two or more segments back
                elif value.kind == "parameter":
                    role = ("parameter", 0)
                else:
                    role = ("invariant", 0)
                key = (slot, m)
                if j == 0:
                    roles[key] = role
                    if role[0] == "parameter":
                        iterated[key] = [vid]
                    elif role[0] == "invariant":
                        invariant_ids[key] = vid
                    continue
                first = roles[key]
                if first == role:
                    if role[0] == "parameter":
                        iterated[key].append(vid)
                    elif role[0] == "invariant" and invariant_ids[key] != vid:
                        return None
                    continue
                # segment 0 reads the carried value from before the run
                if role[0] != "carried" or first[0] not in ("invariant", "parameter"):
                    return None
                if j == 1:
                    entering = invariant_ids.pop(key, None)
                    if entering is None:
                        entering = iterated.pop(key)[0]
                    if carried_in not in (-1, entering):
                        return None
                    carried_in = entering
                    roles[key] = role
                elif roles[key] != role:
                    return None
    carried_slots = {r[1] for r in roles.values() if r[0] == "carried"}
    if len(carried_slots) != 1 or carried_in < 0:
        return None
    (carried_slot,) = carried_slots
    # the carried value keeps its shape and precision
    entering_v, leaving_v = graph.value(carried_in), graph.value(ops[start + carried_slot].output)
    if (entering_v.shape, entering_v.dtype) != (leaving_v.shape, leaving_v.dtype):
        return None
    # a parameter position whose segments share one value is an invariant, not a sequence
    for key, ids in list(iterated.items()):
        if len(set(ids)) == 1:
            del iterated[key]
            invariant_ids[key] = ids[0]
            roles[key] = ("invariant", 0)
    # nothing but the last result escapes the run (SSA: nothing before it reads inside it)
    last_result = ops[end - period + carried_slot].output
    used_after = set(graph.outputs)
    for op in ops[end:]:
        used_after.update(op.inputs)
    if any(vid in used_after and vid != last_result for vid in seg_of):
        return None
    inv = tuple(dict.fromkeys(invariant_ids[k] for k in sorted(invariant_ids)))
    if carried_in in inv:
        return None  # the value entering the loop is also read unchanged by later layers
    sequences: dict[tuple[int, ...], int] = {}
    sequence_of = {
        key: sequences.setdefault(tuple(iterated[key]), len(sequences)) for key in sorted(iterated)
    }
    return _Run(
        start,
        period,
        count,
        carried_in,
        carried_slot,
        inv,
        tuple(sequences),
        dict(sorted(roles.items())),
        sequence_of,
    )


# -- rebuilding ----------------------------------------------------------------------------------
def _rebuild(
    graph: ComputeGraph, params: dict[str, np.ndarray], run: _Run
) -> tuple[ComputeGraph, dict[str, np.ndarray], dict[int, Value], str]:
    ops = graph.operations
    end = run.start + run.period * run.count
    inside = {ops[i].output for i in range(run.start, end)}
    rolled_params = {pid for ids in run.iterated for pid in ids}
    used_outside: set[int] = set(graph.outputs) | set(run.invariants) | {run.carried_in}
    for i, op in enumerate(ops):
        if not run.start <= i < end:
            used_outside.update(op.inputs)

    new = ComputeGraph(prefix=graph.prefix)
    vmap: dict[int, Value] = {}
    new_params: dict[str, np.ndarray] = {}
    for v in graph.values:
        if v.kind == "host_input":
            vmap[v.id] = new.host_input(v.name, v.shape, v.dtype, v.scale_exponent)
        elif v.kind == "parameter" and (v.id in used_outside or v.id not in rolled_params):
            vmap[v.id] = new.parameter(v.name, v.shape, v.dtype, v.scale_exponent)
            if v.name in params:
                new_params[v.name] = params[v.name]

    for op in ops[: run.start]:
        vmap[op.output] = _replay(new, graph, op, vmap)

    name = _loop_name(graph)
    stacked: list[Value] = []
    for slot, ids in enumerate(run.iterated):
        first = graph.value(ids[0])
        stack_name = f"{name}/weights{slot}"
        stacked.append(
            new.parameter(stack_name, (run.count, *first.shape), first.dtype, first.scale_exponent)
        )
        if all(graph.value(i).name in params for i in ids):
            new_params[stack_name] = np.stack([params[graph.value(i).name] for i in ids])

    invariant_slot = {vid: s for s, vid in enumerate(run.invariants)}
    segment = ops[run.start : run.start + run.period]

    def body(sub: ComputeGraph, carried: Value, inv: list[Value], it: list[Value]) -> Value:
        local: dict[int, Value] = {}
        for slot, op in enumerate(segment):
            args = []
            for m, vid in enumerate(op.inputs):
                role, _ = run.operand_roles[(slot, m)]
                if role == "internal":
                    args.append(local[vid])
                elif role == "carried" or vid == run.carried_in:
                    args.append(carried)
                elif role == "parameter":
                    args.append(it[run.sequence_of[(slot, m)]])
                else:
                    args.append(inv[invariant_slot[vid]])
            local[op.output] = _emit(sub, graph, op, args, f"{name}/{op.name}")
        return local[segment[run.carried_slot].output]

    carried = vmap[run.carried_in]
    invariants = [vmap[v] for v in run.invariants]
    result = new.repeat(run.count, carried, invariants, stacked, body, name=name)
    vmap[ops[end - run.period + run.carried_slot].output] = result

    for op in ops[end:]:
        vmap[op.output] = _replay(new, graph, op, vmap)
    new.set_outputs(*(vmap[o] for o in graph.outputs))
    new.verify()
    survivors = {old: v for old, v in vmap.items() if old not in inside or v is result}
    line = (
        f"rolled {run.count} layers of {run.period} operations into {name!r} "
        f"(from {ops[run.start].name!r}; {len(run.iterated)} weight sequences, "
        f"{len(run.invariants)} invariants)"
    )
    return new, new_params, survivors, line


def _loop_name(graph: ComputeGraph) -> str:
    taken = {op.name for op in graph.operations} | {v.name for v in graph.values}
    base, n = f"{graph.prefix}layers", 0
    while (name := base if n == 0 else f"{base}{n}") in taken:
        n += 1
    return name


def _replay(new: ComputeGraph, old: ComputeGraph, op: Operation, vmap: dict[int, Value]) -> Value:
    return _emit(new, old, op, [vmap[v] for v in op.inputs], op.name)


def _emit(
    new: ComputeGraph, old: ComputeGraph, op: Operation, args: list[Value], name: str
) -> Value:
    """Append ``op`` to ``new`` on ``args`` (same kind, attributes, shape and precision)."""
    result = old.value(op.output)
    return new._op(
        op.kind, args, result.shape, result.dtype, name, result.scale_exponent, **dict(op.attrs)
    )

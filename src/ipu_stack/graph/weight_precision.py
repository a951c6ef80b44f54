"""F8 weights: GEMM weights stored as F143 with one power-of-two scale per tensor.

``quantize_weights`` rewrites a graph so that every F16 GEMM whose one operand is a weight (a
parameter, or a loop's per-iteration weight sequence) runs on the F8 AMP units
(``f8v8hihov4amp``): the weight becomes an F8 parameter, its scale ``2**e`` chosen from the
tensor's maximum so that ``max |w| / 2**e <= 240`` (the F143 maximum) with the smallest such
``e``; the activation operand is cast to F8 just before the GEMM (once per value, shared by the
GEMMs that read it, e.g. the Q, K and V projections); the GEMM accumulates in F16 and its
result stays F16, as before. A weight sequence of a rolled loop (the 27 layers' tensors at one
position) is one tensor with one scale, its maximum taken over all layers.

**Activation scales** are static (the F8 GEMM kernels take the product scale as an immediate):
they come from a calibration run. The graph is evaluated in float32 with NumPy on calibration
inputs (the caller's, or uniform(-1, 1) with a fixed seed, as ``run --random-inputs`` draws
them); for every activation cast the largest magnitude seen (over all iterations of a loop) is
mapped one power of two below the F143 maximum (``ACTIVATION_HEADROOM_BITS``), so inputs up to
twice as large as the calibration's still do not saturate; F143's relative precision (3
mantissa bits) is the same at any scale inside its normal range.

Weights used by anything but a GEMM (biases, layer-norm scales) stay as they were, and so do
GEMMs of two activations (attention scores) and F32 GEMMs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.graph.compute_graph import ComputeGraph, Operation, Value, reference_op

#: the largest F143 magnitude (reference-system §1.4)
F143_MAX = 240.0
#: calibrated activation maxima map this many powers of two below F143_MAX
ACTIVATION_HEADROOM_BITS = 1
#: weight precisions ``quantize_weights`` offers
WEIGHT_PRECISIONS = ("f16", "f8")


def scale_exponent_for(max_abs: float, headroom_bits: int = 0) -> int:
    """The smallest ``e`` with ``max_abs * 2**headroom_bits / 2**e <= 240`` (0 for 0 or NaN)."""
    if not math.isfinite(max_abs) or max_abs <= 0.0:
        return 0
    e = math.ceil(math.log2(max_abs * 2.0**headroom_bits / F143_MAX))
    while max_abs * 2.0**headroom_bits / 2.0**e > F143_MAX:  # log2 rounding at exact powers
        e += 1
    return int(e)


@dataclass(slots=True)
class QuantizedGraph:
    """The result of ``quantize_weights``.

    Attributes:
        graph: the rewritten graph (outputs set).
        parameters: parameter data by name (the F8 weights keep their real values; the package
            and the simulator encode them as F143 with their scale).
        value_map: old value id -> new value for the outer graph's values.
        lines: one line per converted weight and per activation cast (name, scale exponent).
    """

    graph: ComputeGraph
    parameters: dict[str, np.ndarray]
    value_map: dict[int, Value]
    lines: list[str]


def _weight_operand(graph: ComputeGraph, op: Operation) -> int | None:
    """Operand index of the weight of an F16 gemm with exactly one parameter operand."""
    if op.kind != "gemm":
        return None
    kinds = [graph.value(v).kind == "parameter" for v in op.inputs]
    if kinds.count(True) != 1 or any(graph.value(v).dtype != "f16" for v in op.inputs):
        return None
    return kinds.index(True)


def _convertible(graph: ComputeGraph) -> set[int]:
    """Parameters of ``graph`` whose every use is the weight operand of an F16 gemm (directly
    or, through a repeat, inside its body)."""
    uses: dict[int, list[bool]] = {}
    for op in graph.operations:
        weight = _weight_operand(graph, op)
        inner_ok: set[int] = set()
        if op.kind == "repeat":
            body: ComputeGraph = op.attr("body")
            inner = [v for v in body.values if v.kind != "operation"]
            good = _convertible(body)
            inner_ok = {j for j, v in enumerate(inner) if v.id in good}
        for m, vid in enumerate(op.inputs):
            if graph.value(vid).kind == "parameter":
                uses.setdefault(vid, []).append(m == weight or m in inner_ok)
    outputs = set(graph.outputs)
    return {vid for vid, ok in uses.items() if all(ok) and vid not in outputs}


def activation_maxima(
    graph: ComputeGraph, feeds: Mapping[str, np.ndarray]
) -> dict[tuple[int, int], float]:
    """Largest magnitude of every activation operand of a weight gemm, in float32.

    Keys are ``(id(graph or loop body), value id)``; a loop body's maxima are taken over all
    its iterations.
    """
    maxima: dict[tuple[int, int], float] = {}
    _calibrate(graph, feeds, maxima)
    return maxima


def max_abs(array: np.ndarray) -> float:
    """Largest magnitude of ``array``, a leading-axis slice at a time (no full-size temporary)."""
    a = np.asarray(array)
    if a.ndim < 3:
        return float(np.max(np.abs(a), initial=0.0))
    return max((float(np.max(np.abs(part), initial=0.0)) for part in a), default=0.0)


def _calibrate(
    graph: ComputeGraph, feeds: Mapping[str, np.ndarray], maxima: dict[tuple[int, int], float]
) -> list[np.ndarray]:
    env: dict[int, np.ndarray] = {}
    for v in graph.values:
        if v.kind != "operation":
            env[v.id] = np.asarray(feeds[v.name])  # converted to float32 where used
    for op in graph.operations:
        weight = _weight_operand(graph, op)
        if weight is not None:
            key = (id(graph), op.inputs[1 - weight])
            maxima[key] = max(maxima.get(key, 0.0), max_abs(env[op.inputs[1 - weight]]))
        if op.kind == "repeat":
            args = [env[i] for i in op.inputs]  # stacked weights stay as they are
            body: ComputeGraph = op.attr("body")
            n_inv = int(op.attr("invariants"))
            names = [v.name for v in body.values if v.kind != "operation"]
            carried = args[0]
            for i in range(int(op.attr("count"))):
                inner = [carried, *args[1 : 1 + n_inv], *(a[i] for a in args[1 + n_inv :])]
                carried = _calibrate(body, dict(zip(names, inner, strict=True)), maxima)[0]
            env[op.output] = carried
            continue
        args = [np.asarray(env[i], np.float32) for i in op.inputs]
        if op.kind == "view":
            env[op.output] = args[0].reshape(graph.value(op.output).shape)
        elif op.kind == "gemm":  # float32 products (the reference's are float64: slower)
            a = np.swapaxes(args[0], -1, -2) if op.transpose_left else args[0]
            b = np.swapaxes(args[1], -1, -2) if op.transpose_right else args[1]
            env[op.output] = _matmul(a, b)
        elif op.kind in _ROW_WISE and len(args) == 1 and args[0].flags.c_contiguous:
            env[op.output] = _row_blocks(op, args[0])
        else:
            env[op.output] = np.asarray(reference_op(op, args), np.float32)
    return [env[i] for i in graph.outputs]


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b``; a stack of products (attention's per-head ones) with one BLAS thread.

    Each product of a stack is one small sgemm, which OpenBLAS splits over its threads: the
    hand-offs cost more than the product (measured on the 2-core host under load: 16 heads of
    729 x 72 x 729 in 0.28 s of CPU with two threads, 0.021 s with one). The values do not
    depend on it (threads split the output, never K; ``runtime/host_threads.py``).
    """
    if math.prod(np.broadcast_shapes(a.shape[:-2], b.shape[:-2])) > 1:
        from ipu_stack.runtime.host_threads import one_blas_thread

        with one_blas_thread():
            return np.matmul(a, b)
    return np.matmul(a, b)


#: operations computed row by row (last axis) with one operand: evaluated in row blocks
_ROW_WISE = frozenset({"gelu", "softmax"})
#: elements per row block, at most (the temporaries of a block stay in the core's cache)
_BLOCK_ELEMENTS = 1 << 16


def _row_blocks(op: Operation, x: np.ndarray) -> np.ndarray:
    """``reference_op`` of a row-wise operation on a C-contiguous array in blocks of whole
    rows, in float32: the same values as on the whole array (each element or row is computed
    alike; blocks of 16 rows keep the vector loops' element alignment), without temporaries
    of the whole array's size (tanh GeLU makes five, two of them float64)."""
    if x.ndim == 0 or x.size == 0:
        return np.asarray(reference_op(op, [x]), np.float32)
    rows = x.reshape(-1, x.shape[-1])
    out = np.empty(rows.shape, np.float32)
    step = 16 * max(1, _BLOCK_ELEMENTS // (16 * rows.shape[1]))
    starts = range(0, rows.shape[0], step)

    def block(start: int) -> None:
        out[start : start + step] = reference_op(op, [rows[start : start + step]])

    threads = min(os.cpu_count() or 1, 2, len(starts))
    if threads < 2:
        for start in starts:
            block(start)
    else:  # NumPy's loops release the GIL: the blocks go to two threads (disjoint outputs)
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(block, starts))
    return out.reshape(x.shape)


def calibration_feeds(
    graph: ComputeGraph, parameters: Mapping[str, np.ndarray], seed: int = 0
) -> dict[str, np.ndarray]:
    """``parameters`` plus uniform(-1, 1) data for every host input (``run --random-inputs``)."""
    rng = np.random.default_rng(seed)
    feeds = dict(parameters)
    for v in graph.by_kind("host_input"):
        feeds[v.name] = rng.uniform(-1, 1, v.shape).astype(np.float32)
    return feeds


def quantize_weights(
    graph: ComputeGraph,
    parameters: Mapping[str, np.ndarray],
    feeds: Mapping[str, np.ndarray] | None = None,
) -> QuantizedGraph:
    """Store the GEMM weights of ``graph`` as F8 (see the module docstring).

    Args:
        graph: a verified graph.
        parameters: data of its parameters by name.
        feeds: calibration data of its host inputs by name (default: uniform(-1, 1), seed 0).

    Returns:
        The rewritten graph, its parameter data, the value map and one line per decision.
    """
    params = dict(parameters)
    cal = dict(params)
    cal.update(feeds if feeds is not None else calibration_feeds(graph, {}))
    maxima = activation_maxima(graph, cal)
    lines: list[str] = []
    new = ComputeGraph(prefix=graph.prefix)
    vmap: dict[int, Value] = {}
    convert = _convertible(graph)
    for v in graph.values:
        if v.kind == "host_input":
            vmap[v.id] = new.host_input(v.name, v.shape, v.dtype, v.scale_exponent)
        elif v.kind == "parameter" and v.id in convert and v.name in params:
            peak = max_abs(params[v.name])
            e = scale_exponent_for(peak)
            vmap[v.id] = new.parameter(v.name, v.shape, "f8", e)
            lines.append(f"weight {v.name!r} {v.shape}: f8, scale 2**{e} (max |w| {peak:.4g})")
        elif v.kind == "parameter":
            vmap[v.id] = new.parameter(v.name, v.shape, v.dtype, v.scale_exponent)
    _replay(graph, new, vmap, maxima, lines)
    new.set_outputs(*(vmap[o] for o in graph.outputs))
    new.verify()
    return QuantizedGraph(new, params, vmap, lines)


def _replay(
    old: ComputeGraph,
    new: ComputeGraph,
    vmap: dict[int, Value],
    maxima: dict[tuple[int, int], float],
    lines: list[str],
) -> None:
    """Emit ``old``'s operations into ``new``, F8 GEMMs where the weight became F8."""
    casts: dict[int, Value] = {}
    for op in old.operations:
        args = [vmap[v] for v in op.inputs]
        result = old.value(op.output)
        weight = _weight_operand(old, op)
        if weight is not None and args[weight].dtype == "f8":
            act_id = op.inputs[1 - weight]
            if act_id not in casts:
                e = scale_exponent_for(maxima.get((id(old), act_id), 0.0), ACTIVATION_HEADROOM_BITS)
                name = f"{op.name}/to_f8"
                casts[act_id] = new.cast(args[1 - weight], "f8", name, scale_exponent=e)
                lines.append(f"activation {old.value(act_id).name!r}: cast to f8, scale 2**{e}")
            args[1 - weight] = casts[act_id]
            attrs = dict(op.attrs)
            attrs["accumulation"] = "f16"
            attrs["product_scale_exponent"] = args[0].scale_exponent + args[1].scale_exponent
            vmap[op.output] = new._op("gemm", args, result.shape, "f16", op.name, **attrs)
        elif op.kind == "repeat":
            vmap[op.output] = _replay_repeat(old, new, op, args, maxima, lines)
        else:
            vmap[op.output] = new._op(
                op.kind, args, result.shape, result.dtype, op.name, result.scale_exponent,
                **dict(op.attrs),
            )  # fmt: skip


def _replay_repeat(
    old: ComputeGraph,
    new: ComputeGraph,
    op: Operation,
    args: list[Value],
    maxima: dict[tuple[int, int], float],
    lines: list[str],
) -> Value:
    body: ComputeGraph = op.attr("body")
    n_inv = int(op.attr("invariants"))
    inner = [v for v in body.values if v.kind != "operation"]

    def build(sub: ComputeGraph, carried: Value, inv: list[Value], it: list[Value]) -> Value:
        local = dict(zip((v.id for v in inner), [carried, *inv, *it], strict=True))
        _replay(body, sub, local, maxima, lines)
        return local[body.outputs[0]]

    return new.repeat(int(op.attr("count")), args[0], args[1 : 1 + n_inv], args[1 + n_inv :],
                      build, name=op.name)  # fmt: skip


def quantize_bindings(graph: ComputeGraph, bindings: Any, precision: str) -> ComputeGraph:
    """``graph`` with its GEMM weights in ``precision`` (``f16``: unchanged); updates the
    ``OnnxBindings`` ``bindings`` in place (parameters, inputs, outputs, one fusion line)."""
    if precision not in WEIGHT_PRECISIONS:
        raise GraphError(
            f"unknown weight precision {precision!r}; supported: {', '.join(WEIGHT_PRECISIONS)}"
        )
    if precision == "f16":
        return graph
    result = quantize_weights(graph, bindings.parameters)
    bindings.parameters = result.parameters
    bindings.inputs = {k: result.value_map[v.id] for k, v in bindings.inputs.items()}
    bindings.outputs = {k: result.value_map[v.id] for k, v in bindings.outputs.items()}
    weights = sum(line.startswith("weight ") for line in result.lines)
    casts = len(result.lines) - weights
    bindings.fusions = [
        *bindings.fusions,
        f"f8 weights: {weights} weight tensors in F143, {casts} activation casts",
    ]
    return result.graph

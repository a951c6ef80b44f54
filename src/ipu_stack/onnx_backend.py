"""The ONNX backend node test cases, run through ipu-stack: import, build, simulate, compare.

``onnx.backend.test.case.node.collect_testcases()`` gives each case's model, inputs and
expected outputs. A case is selected when its model is a single node of one of ``OP_TYPES``
(the ``*_expanded`` variants are function bodies built from other operators). Each case ends as
exactly one of

passed        every output has the expected shape and dtype and is within tolerance
failed        a wrong result, or any exception other than GraphError/PlanError (a bug)
unsupported   GraphError or PlanError: ipu-stack says clearly what it does not do

and nothing a case does can stop the run. Integer inputs that feed a shape-like operand
(Reshape's shape, Slice's starts/ends/axes/steps) are bound as compile-time constants, since
ipu-stack compiles static graphs; every other input is a host input.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ipu_stack.errors import GraphError, PlanError

OP_TYPES = (
    "MatMul", "Gemm", "Add", "Mul", "Gelu", "LayerNormalization", "Softmax", "Reshape",
    "Transpose", "Slice", "Cast",
)  # fmt: skip
#: Input slots whose integer data the harness binds as constants.
SHAPE_OPERANDS = {"Reshape": (1,), "Slice": (1, 2, 3, 4)}
#: Tolerances when any value is F16 (the cases' own are for F32 and F64 references): F16
#: spacing is 2^-10 relative, and F16 partial sums round once per 16-element AMP panel.
F16_RTOL, F16_ATOL = 1e-2, 1e-3
STATUSES = ("passed", "failed", "unsupported")


@dataclass(frozen=True, slots=True)
class CaseResult:
    """The outcome of one backend test case."""

    name: str
    op_type: str
    status: str
    reason: str = ""
    max_abs_error: float | None = None
    seconds: float = 0.0


def collect_cases(op_types: Sequence[str] = OP_TYPES) -> list[Any]:
    """The onnx package's node test cases that are one node of ``op_types``."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators overflow casts on purpose
        cases = collect_testcases()
    selected = []
    for case in cases:
        if case.model is None:  # model-zoo cases carry a URL instead of a model
            continue
        nodes = case.model.graph.node
        if len(nodes) == 1 and nodes[0].op_type in op_types and nodes[0].domain in ("", "ai.onnx"):
            selected.append(case)
    return sorted(selected, key=lambda c: (c.model.graph.node[0].op_type, c.name))


def _array(data: Any) -> np.ndarray:
    """A case's input or output as an array (cases store some as TensorProto)."""
    from onnx import TensorProto, numpy_helper

    return numpy_helper.to_array(data) if isinstance(data, TensorProto) else np.asarray(data)


def _shape_constants(model: Any, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    bound = {}
    for node in model.graph.node:
        for slot in SHAPE_OPERANDS.get(node.op_type, ()):
            if slot < len(node.input) and node.input[slot] in inputs:
                array = inputs[node.input[slot]]
                if array.dtype.kind in "iu":
                    bound[node.input[slot]] = array
    return bound


def _compare(
    name: str, actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float
) -> tuple[str, float]:
    """'' if ``actual`` matches, else why; and the max abs error (0 when not comparable)."""
    if actual.dtype != expected.dtype:
        return f"output {name!r} is {actual.dtype}, expected {expected.dtype}", 0.0
    if actual.shape != expected.shape:
        return f"output {name!r} has shape {actual.shape}, expected {expected.shape}", 0.0
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    same = (a == e) | (np.isnan(a) & np.isnan(e))
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(a - e))
    error = float(np.nanmax(diff)) if diff.size else 0.0
    within = same | (diff <= atol + rtol * np.abs(e))
    if not np.all(within):
        bad = int(np.size(within) - np.count_nonzero(within))
        return (
            f"output {name!r}: {bad} of {within.size} elements outside rtol={rtol:g}, "
            f"atol={atol:g} (max abs error {error:.3g})",
            error,
        )
    return "", error


def run_case(case: Any, tiles: int = 64) -> CaseResult:
    """Import, build, simulate and check one case; never raises."""
    start = time.perf_counter()
    op_type = case.model.graph.node[0].op_type

    def result(status: str, reason: str = "", error: float | None = None) -> CaseResult:
        return CaseResult(case.name, op_type, status, reason, error, time.perf_counter() - start)

    try:
        return _run(case, tiles, result)
    except (GraphError, PlanError) as err:
        return result("unsupported", f"{type(err).__name__}: {err}")
    except Exception as err:  # a bug in ipu-stack: report it, keep going
        return result("failed", f"{type(err).__name__}: {err}")


def _run(case: Any, tiles: int, result: Any) -> CaseResult:
    from ipu_stack.graph.onnx_import import import_onnx
    from ipu_stack.package.build import BuildConfig, build
    from ipu_stack.runtime.sim import SimDevice

    model = case.model
    initializers = {t.name for t in model.graph.initializer}
    input_names = [i.name for i in model.graph.input if i.name not in initializers]
    output_names = [o.name for o in model.graph.output]
    data_sets = [
        (
            dict(zip(input_names, map(_array, inputs), strict=False)),
            dict(zip(output_names, map(_array, outputs), strict=False)),
        )
        for inputs, outputs in case.data_sets
    ]
    constants = _shape_constants(model, data_sets[0][0])
    for inputs, _ in data_sets[1:]:
        if any(not np.array_equal(inputs[n], v) for n, v in constants.items()):
            raise GraphError("data sets differ in a shape-like input bound as a constant")
    graph, bindings = import_onnx(model, constants=constants)
    built = build(graph, BuildConfig(tiles=tiles))
    f16 = any(v.dtype == "f16" for v in graph.values)
    rtol = max(case.rtol, F16_RTOL) if f16 else case.rtol
    atol = max(case.atol, F16_ATOL) if f16 else case.atol
    worst = 0.0
    for inputs, expected in data_sets:
        run = SimDevice().run(
            built.program, built.placement, built.schedules, bindings.feeds(inputs)
        )
        actual = bindings.onnx_outputs(run.outputs)
        for name, want in expected.items():
            reason, error = _compare(name, actual[name], np.asarray(want), rtol, atol)
            worst = max(worst, error)
            if reason:
                return result("failed", reason, worst)
    return result("passed", "", worst)


def run_cases(cases: Iterable[Any], tiles: int = 64) -> list[CaseResult]:
    """``run_case`` over ``cases``."""
    return [run_case(case, tiles) for case in cases]


def summarize(results: Sequence[CaseResult]) -> dict[str, Any]:
    """Counts overall and per op type, the commonest reasons, and every case's result."""
    by_op: dict[str, Counter[str]] = defaultdict(Counter)
    reasons: Counter[str] = Counter()
    for r in results:
        by_op[r.op_type][r.status] += 1
        if r.reason:
            # Group by the message's first clause so per-case names do not split the counts.
            reasons[f"{r.status}: {r.reason.split(';')[0].split(': ', 2)[-1][:160]}"] += 1
    totals = Counter(r.status for r in results)
    return {
        "cases": len(results),
        "totals": {s: totals.get(s, 0) for s in STATUSES},
        "by_op_type": {
            op: {s: counts.get(s, 0) for s in STATUSES} for op, counts in sorted(by_op.items())
        },
        "top_reasons": [{"count": n, "reason": why} for why, n in reasons.most_common(25)],
        "results": [asdict(r) for r in results],
    }

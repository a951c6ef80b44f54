"""The elementwise functions beyond add/mul/gelu: their names, attributes and float64 reference.

Each is one graph operation kind, one kernel registry entry (``kernels/registry.py``), one
cycle model (``target/op_cycles.py``) and one simulator semantics (``runtime/elementwise_sim.py``,
float32 arithmetic rounded once, written independently of the float64 reference here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ipu_stack.errors import GraphError

if TYPE_CHECKING:
    from ipu_stack.graph.compute_graph import Operation

#: one-operand functions, by kind (``pow`` takes a constant ``exponent`` attribute)
UNARY = ("tanh", "sigmoid", "sqrt", "reciprocal", "neg", "pow", "relu")
#: two-operand functions with NumPy broadcasting (besides add and mul)
BINARY = ("sub", "div", "max", "min")
#: every kind this module defines (reduce_mean: mean over the last axis, keepdims)
KINDS = (*UNARY, *BINARY, "reduce_mean")


def check_unary(op_name: str, kind: str, attrs: dict[str, Any]) -> None:
    """Raise GraphError when ``attrs`` do not fit ``kind``."""
    expected = {"exponent"} if kind == "pow" else set()
    if set(attrs) != expected:
        raise GraphError(
            f"{op_name}: {kind} takes attributes {sorted(expected)}, got {sorted(attrs)}"
        )
    if kind == "pow" and not np.isfinite(attrs["exponent"]):
        raise GraphError(f"{op_name}: pow exponent must be finite, got {attrs['exponent']}")


def reference_elementwise(op: Operation, args: list[np.ndarray]) -> np.ndarray | None:
    """float64 NumPy semantics of the kinds in ``KINDS``; None for any other kind."""
    kind = op.kind
    if kind not in KINDS:
        return None
    x = np.asarray(args[0], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if kind == "sub":
            return x - args[1]
        if kind == "div":
            return x / args[1]
        if kind == "max":
            return np.maximum(x, args[1])
        if kind == "min":
            return np.minimum(x, args[1])
        if kind == "tanh":
            return np.tanh(x)
        if kind == "sigmoid":
            return 1.0 / (1.0 + np.exp(-x))
        if kind == "sqrt":
            return np.sqrt(x)
        if kind == "reciprocal":
            return 1.0 / x
        if kind == "neg":
            return -x
        if kind == "relu":
            return np.maximum(x, 0.0)
        if kind == "pow":
            return np.power(x, float(op.attr("exponent")))
        return x.mean(axis=-1, keepdims=True)

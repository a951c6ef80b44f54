"""Simulator semantics of the elementwise kernels of ``graph/elementwise.py`` and tanh GeLU.

float32 arithmetic on the staged operands, rounded once to the output precision by the
caller, as every non-GEMM kernel (``sim.map_semantics``).
"""

from __future__ import annotations

import numpy as np

from ipu_stack.low.program import MapCall

#: kinds defined here
SIM_KINDS = (
    "sub", "div", "max", "min", "tanh", "sigmoid", "sqrt", "reciprocal", "neg", "pow", "relu",
    "reduce_mean",
)  # fmt: skip
_SQRT_2_OVER_PI = np.float32(0.7978845608028654)
_GELU_CUBIC = np.float32(0.044715)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in float32."""
    x = x.astype(np.float32)
    inner = _SQRT_2_OVER_PI * (x + _GELU_CUBIC * x * x * x)
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))


def elementwise_semantics(call: MapCall, x: list[np.ndarray]) -> np.ndarray | None:
    """The result of a ``SIM_KINDS`` call on float32 operands; None for other kinds."""
    kind = call.kind
    if kind not in SIM_KINDS:
        return None
    a = x[0]
    one = np.float32(1.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if kind == "sub":
            return a - x[1]
        if kind == "div":
            return a / x[1]
        if kind == "max":
            return np.maximum(a, x[1])
        if kind == "min":
            return np.minimum(a, x[1])
        if kind == "tanh":
            return np.tanh(a)
        if kind == "sigmoid":
            return one / (one + np.exp(-a))
        if kind == "sqrt":
            return np.sqrt(a)
        if kind == "reciprocal":
            return one / a
        if kind == "neg":
            return -a
        if kind == "relu":
            return np.maximum(a, np.float32(0.0))
        if kind == "pow":
            return np.power(a, np.float32(call.attr("exponent")))
        return a.sum(axis=-1, keepdims=True, dtype=np.float32) / np.float32(a.shape[-1])

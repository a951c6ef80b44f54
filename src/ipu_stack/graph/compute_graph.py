"""ComputeGraph: the user's tensor program as structured SSA.

Values are produced once (by a host input, a parameter, or an operation) and never mutated.
Every value is row-major; an operation's shape rule runs when it is added, so a bad program
fails at the line that builds it, with a message naming the operation and its operands.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.graph.indexing_ops import (
    I32_KINDS,
    INDEXING_KINDS,
    IndexingOps,
    reference_indexing,
)
from ipu_stack.target.ipu21 import GEMM_OUTPUT_PRECISION, PRECISIONS


@dataclass(frozen=True, slots=True)
class Value:
    """An SSA value: its id, name, shape, precision, and what produces it."""

    id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "host_input" | "parameter" | "operation"
    scale_exponent: int = 0  # F8 only: stored element = value / 2**scale_exponent (F143)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation: its kind, operand value ids, output value id and attributes."""

    id: int
    name: str
    kind: str
    inputs: tuple[int, ...]
    output: int
    attrs: tuple[tuple[str, Any], ...] = ()

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    # gemm conveniences
    @property
    def left(self) -> int:
        return self.inputs[0]

    @property
    def right(self) -> int:
        return self.inputs[1]

    @property
    def transpose_left(self) -> bool:
        return bool(self.attr("transpose_left", False))

    @property
    def transpose_right(self) -> bool:
        return bool(self.attr("transpose_right", False))


GemmOp = Operation  # the gemm view of an operation (kept for readability at call sites)

#: operations that may produce or consume F8 values (the rest need f16 or f32)
F8_KINDS = ("gemm", "cast", "view", "transpose", "slice", "repeat")

ELEMENTWISE_BINARY = ("add", "mul", "sub", "div")


@dataclass(slots=True)
class ComputeGraph(IndexingOps):
    """A tensor program under construction.

    Example:
        >>> g = ComputeGraph()
        >>> x = g.host_input("x", (128, 64), "f16")
        >>> w = g.parameter("w", (64, 32), "f16")
        >>> g.set_outputs(g.gelu(g.gemm(x, w)))
    """

    values: list[Value] = field(default_factory=list)
    operations: list[Operation] = field(default_factory=list)
    outputs: tuple[int, ...] = ()
    prefix: str = ""  # prepended to generated names (loop bodies use "<repeat>/")

    # -- construction -----------------------------------------------------------------------
    def _new_value(
        self, name: str, shape: Sequence[int], dtype: str, kind: str, scale_exponent: int = 0
    ) -> Value:
        if dtype not in PRECISIONS:
            known = ", ".join(sorted(PRECISIONS))
            raise GraphError(f"value {name!r}: unknown precision {dtype!r}; supported: {known}")
        shape = tuple(int(d) for d in shape)
        bad = [d for d in shape if d <= 0]
        if not shape or bad:
            raise GraphError(
                f"value {name!r}: every dimension must be a positive integer, got shape {shape}"
            )
        if any(v.name == name for v in self.values):
            raise GraphError(f"value name {name!r} is used twice")
        if scale_exponent and dtype != "f8":
            raise GraphError(f"value {name!r}: a scale exponent needs precision f8, not {dtype}")
        value = Value(len(self.values), name, shape, dtype, kind, int(scale_exponent))
        self.values.append(value)
        return value

    def host_input(
        self, name: str, shape: Sequence[int], dtype: str = "f16", scale_exponent: int = 0
    ) -> Value:
        """A tensor the host writes before each run (delivered once, not replicated).

        F8 values are F143 with one power-of-two scale per tensor: the host stores
        ``value / 2**scale_exponent``, saturating at +-240.
        """
        return self._new_value(name, shape, dtype, "host_input", scale_exponent)

    def parameter(
        self, name: str, shape: Sequence[int], dtype: str = "f16", scale_exponent: int = 0
    ) -> Value:
        """Weights uploaded once before runs; the plan may store them in any layout."""
        return self._new_value(name, shape, dtype, "parameter", scale_exponent)

    def _check(self, value: Value) -> Value:
        if (
            not isinstance(value, Value)
            or value.id >= len(self.values)
            or self.values[value.id] != value
        ):
            raise GraphError(f"{value!r} is not a value of this graph")
        return value

    def _op(
        self,
        kind: str,
        inputs: Sequence[Value],
        shape: Sequence[int],
        dtype: str,
        name: str | None,
        scale_exponent: int = 0,
        **attrs: Any,
    ) -> Value:
        op_name = name or f"{self.prefix}{kind}{len(self.operations)}"
        if kind in ("view", "transpose", "slice", "repeat") and inputs:
            scale_exponent = inputs[0].scale_exponent  # data movement keeps the F8 scale
        if dtype == "f8" and kind not in F8_KINDS:
            raise GraphError(f"{op_name}: {kind} does not take F8 operands; cast them to f16 first")
        if kind not in I32_KINDS and any(v.dtype == "i32" for v in (*inputs,)):
            raise GraphError(f"{op_name}: {kind} does not take i32 operands; cast them first")
        out = self._new_value(f"{op_name}.out", shape, dtype, "operation", scale_exponent)
        self.operations.append(
            Operation(
                len(self.operations),
                op_name,
                kind,
                tuple(v.id for v in inputs),
                out.id,
                tuple(sorted(attrs.items())),
            )
        )
        return out

    def _name(self, kind: str, name: str | None) -> str:
        return name or f"{self.prefix}{kind}{len(self.operations)}"

    def _same_dtype(self, op_name: str, *vs: Value) -> str:
        dtypes = {v.dtype for v in vs}
        if len(dtypes) > 1:
            detail = ", ".join(f"{v.name!r} is {v.dtype}" for v in vs)
            raise GraphError(f"{op_name}: operand precisions differ: {detail}")
        return vs[0].dtype

    def gemm(
        self,
        left: Value,
        right: Value,
        transpose_left: bool = False,
        transpose_right: bool = False,
        name: str | None = None,
    ) -> Value:
        """Matrix product on the last two axes with NumPy broadcasting of batch axes.

        Raises:
            GraphError: if an operand has rank < 2, precisions differ, the inner extents
                differ, or the batch axes cannot broadcast.
        """
        left, right = self._check(left), self._check(right)
        op_name = self._name("gemm", name)
        for role, v in (("left", left), ("right", right)):
            if len(v.shape) < 2:
                raise GraphError(
                    f"{op_name}: {role} operand {v.name!r} has shape {v.shape}; "
                    "gemm needs rank >= 2"
                )
        dtype = self._same_dtype(op_name, left, right)
        if dtype == "i32":
            raise GraphError(f"{op_name}: gemm does not take i32 operands; cast them first")
        # An operand produced on chip is transposed by an explicit on-chip rearrangement.
        if transpose_left and left.kind == "operation":
            left, transpose_left = self._swap_last(left, f"{op_name}/left_t"), False
        if transpose_right and right.kind == "operation":
            right, transpose_right = self._swap_last(right, f"{op_name}/right_t"), False
        m, k_left = left.shape[-2:][::-1] if transpose_left else left.shape[-2:]
        k_right, n = right.shape[-2:][::-1] if transpose_right else right.shape[-2:]
        if k_left != k_right:
            raise GraphError(
                f"{op_name}: inner dimensions differ: {left.name!r} {left.shape}"
                f"{' (transposed)' if transpose_left else ''} has K={k_left}, "
                f"{right.name!r} {right.shape}{' (transposed)' if transpose_right else ''} "
                f"has K={k_right}"
            )
        batch = self._broadcast(op_name, left, right, left.shape[:-2], right.shape[:-2])
        # F8 products accumulate into F16 (f8v8hihov4amp), scaled by both operand scales.
        return self._op(
            "gemm",
            (left, right),
            (*batch, m, n),
            GEMM_OUTPUT_PRECISION[dtype],
            op_name,
            transpose_left=bool(transpose_left),
            transpose_right=bool(transpose_right),
            accumulation=GEMM_OUTPUT_PRECISION[dtype],
            product_scale_exponent=left.scale_exponent + right.scale_exponent,
        )

    def _swap_last(self, x: Value, name: str) -> Value:
        rank = len(x.shape)
        return self.transpose(x, (*range(rank - 2), rank - 1, rank - 2), name=name)

    def _broadcast(
        self, op_name: str, a: Value, b: Value, sa: tuple[int, ...], sb: tuple[int, ...]
    ) -> tuple[int, ...]:
        try:
            return tuple(np.broadcast_shapes(sa, sb))
        except ValueError:
            raise GraphError(
                f"{op_name}: shapes {sa} of {a.name!r} and {sb} of {b.name!r} do not broadcast"
            ) from None

    def _binary(self, kind: str, a: Value, b: Value, name: str | None) -> Value:
        a, b = self._check(a), self._check(b)
        op_name = self._name(kind, name)
        dtype = self._same_dtype(op_name, a, b)
        shape = self._broadcast(op_name, a, b, a.shape, b.shape)
        return self._op(kind, (a, b), shape, dtype, op_name)

    def add(self, a: Value, b: Value, name: str | None = None) -> Value:
        """a + b with NumPy broadcasting."""
        return self._binary("add", a, b, name)

    def mul(self, a: Value, b: Value, name: str | None = None) -> Value:
        """a * b with NumPy broadcasting."""
        return self._binary("mul", a, b, name)

    def gelu(self, x: Value, name: str | None = None, approximate: str = "none") -> Value:
        """GeLU: exact ``x * 0.5 * (1 + erf(x / sqrt(2)))``, or with ``approximate="tanh"``
        ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``."""
        x = self._check(x)
        if approximate not in ("none", "tanh"):
            raise GraphError(f"{self._name('gelu', name)}: approximate must be 'none' or "
                             f"'tanh', got {approximate!r}")  # fmt: skip
        attrs: dict[str, Any] = {"approximate": "tanh"} if approximate == "tanh" else {}
        return self._op("gelu", (x,), x.shape, x.dtype, name, **attrs)

    # elementwise functions (semantics: graph/elementwise.py, one kernel each)
    def sub(self, a: Value, b: Value, name: str | None = None) -> Value:
        """a - b with NumPy broadcasting."""
        return self._binary("sub", a, b, name)

    def div(self, a: Value, b: Value, name: str | None = None) -> Value:
        """a / b with NumPy broadcasting."""
        return self._binary("div", a, b, name)

    def maximum(self, a: Value, b: Value, name: str | None = None) -> Value:
        """The larger of a and b, elementwise (NaN if either is), NumPy broadcasting."""
        return self._binary("max", a, b, name)

    def minimum(self, a: Value, b: Value, name: str | None = None) -> Value:
        """The smaller of a and b, elementwise (NaN if either is), NumPy broadcasting."""
        return self._binary("min", a, b, name)

    def unary(self, kind: str, x: Value, name: str | None = None, **attrs: Any) -> Value:
        """One of the elementwise functions of ``elementwise.UNARY`` (tanh, sigmoid, ...)."""
        from ipu_stack.graph.elementwise import UNARY, check_unary

        x = self._check(x)
        if kind not in UNARY:
            raise GraphError(f"unknown elementwise function {kind!r}; known: {', '.join(UNARY)}")
        check_unary(self._name(kind, name), kind, attrs)
        return self._op(kind, (x,), x.shape, x.dtype, name, **attrs)

    def tanh(self, x: Value, name: str | None = None) -> Value:
        """Hyperbolic tangent."""
        return self.unary("tanh", x, name)

    def sigmoid(self, x: Value, name: str | None = None) -> Value:
        """1 / (1 + exp(-x))."""
        return self.unary("sigmoid", x, name)

    def sqrt(self, x: Value, name: str | None = None) -> Value:
        """Square root (NaN below zero, as NumPy)."""
        return self.unary("sqrt", x, name)

    def reciprocal(self, x: Value, name: str | None = None) -> Value:
        """1 / x."""
        return self.unary("reciprocal", x, name)

    def neg(self, x: Value, name: str | None = None) -> Value:
        """-x."""
        return self.unary("neg", x, name)

    def relu(self, x: Value, name: str | None = None) -> Value:
        """max(x, 0)."""
        return self.unary("relu", x, name)

    def pow(self, x: Value, exponent: float, name: str | None = None) -> Value:
        """x ** exponent for a constant exponent."""
        return self.unary("pow", x, name, exponent=float(exponent))

    def reduce_mean(self, x: Value, name: str | None = None) -> Value:
        """Mean over the last axis, kept as an axis of 1 (``keepdims``)."""
        x = self._check(x)
        return self._op("reduce_mean", (x,), (*x.shape[:-1], 1), x.dtype, name)

    def layer_norm(
        self,
        x: Value,
        scale: Value,
        bias: Value,
        epsilon: float = 1e-5,
        name: str | None = None,
    ) -> Value:
        """Normalise over the last axis, then scale and shift (both of shape ``(C,)``)."""
        x, scale, bias = self._check(x), self._check(scale), self._check(bias)
        op_name = self._name("layer_norm", name)
        self._same_dtype(op_name, x, scale, bias)
        for role, v in (("scale", scale), ("bias", bias)):
            if v.shape != (x.shape[-1],):
                raise GraphError(
                    f"{op_name}: {role} {v.name!r} has shape {v.shape}, expected "
                    f"({x.shape[-1]},) to match the last axis of {x.name!r} {x.shape}"
                )
        if not epsilon > 0:
            raise GraphError(f"{op_name}: epsilon must be positive, got {epsilon}")
        return self._op(
            "layer_norm", (x, scale, bias), x.shape, x.dtype, op_name, epsilon=float(epsilon)
        )

    def softmax(self, x: Value, name: str | None = None) -> Value:
        """Softmax over the last axis."""
        x = self._check(x)
        return self._op("softmax", (x,), x.shape, x.dtype, name)

    def view(self, x: Value, shape: Sequence[int], name: str | None = None) -> Value:
        """Reshape (row-major order kept); one dimension may be -1."""
        x = self._check(x)
        op_name = self._name("view", name)
        shape = [int(d) for d in shape]
        if shape.count(-1) > 1 or any(d == 0 or d < -1 for d in shape):
            raise GraphError(f"{op_name}: bad target shape {tuple(shape)} for {x.name!r}")
        if -1 in shape:
            known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
            if known == 0 or x.size % known:
                raise GraphError(f"{op_name}: cannot view {x.name!r} {x.shape} as {tuple(shape)}")
            shape[shape.index(-1)] = x.size // known
        if int(np.prod(shape, dtype=np.int64)) != x.size:
            raise GraphError(
                f"{op_name}: cannot view {x.name!r} {x.shape} ({x.size} elements) as "
                f"{tuple(shape)} ({int(np.prod(shape, dtype=np.int64))} elements)"
            )
        return self._op("view", (x,), tuple(shape), x.dtype, op_name)

    def transpose(self, x: Value, perm: Sequence[int], name: str | None = None) -> Value:
        """Permute axes: output axis i is input axis perm[i]."""
        x = self._check(x)
        op_name = self._name("transpose", name)
        perm = tuple(
            int(p) % len(x.shape) if -len(x.shape) <= p < len(x.shape) else -1 for p in perm
        )
        if sorted(perm) != list(range(len(x.shape))):
            raise GraphError(
                f"{op_name}: perm {tuple(perm)} is not a permutation of the {len(x.shape)} "
                f"axes of {x.name!r} {x.shape}"
            )
        shape = tuple(x.shape[p] for p in perm)
        return self._op("transpose", (x,), shape, x.dtype, op_name, perm=perm)

    def slice(
        self,
        x: Value,
        starts: Sequence[int],
        ends: Sequence[int],
        axes: Sequence[int] | None = None,
        name: str | None = None,
    ) -> Value:
        """Contiguous slice (step 1) along ``axes``; bounds clamp like NumPy."""
        x = self._check(x)
        op_name = self._name("slice", name)
        axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
        if not len(starts) == len(ends) == len(axes):
            raise GraphError(f"{op_name}: starts, ends and axes must have equal lengths")
        bounds = [(0, d) for d in x.shape]
        for s, e, a in zip(starts, ends, axes, strict=True):
            if not -len(x.shape) <= a < len(x.shape):
                raise GraphError(f"{op_name}: axis {a} out of range for {x.name!r} {x.shape}")
            a %= len(x.shape)
            lo, hi, _ = slice(int(s), int(e)).indices(x.shape[a])
            if hi <= lo:
                raise GraphError(
                    f"{op_name}: slice [{s}:{e}] of axis {a} of {x.name!r} {x.shape} is empty"
                )
            bounds[a] = (lo, hi)
        shape = tuple(hi - lo for lo, hi in bounds)
        return self._op("slice", (x,), shape, x.dtype, op_name, bounds=tuple(bounds))

    def flash_attention(
        self,
        q: Value,
        k: Value,
        v: Value,
        causal: bool = False,
        scale: float | None = None,
        name: str | None = None,
        mask: Value | None = None,
    ) -> Value:
        """softmax(q @ k^T * scale [+ mask] [+ causal mask]) @ v over the last two axes.

        q is ``[..., Tq, D]``, k ``[..., Tk, D]``, v ``[..., Tk, Dv]``; leading axes equal.
        ``mask`` (q's precision) is added to the scaled scores; it broadcasts to
        ``[..., Tq, Tk]`` (a padding mask ``[B, 1, 1, Tk]`` broadcasts over heads and queries).
        """
        q, k, v = self._check(q), self._check(k), self._check(v)
        op_name = self._name("flash_attention", name)
        dtype = self._same_dtype(op_name, q, k, v)
        if len(q.shape) < 2 or q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
            raise GraphError(
                f"{op_name}: q {q.shape}, k {k.shape} and v {v.shape} need equal leading axes"
            )
        if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
            raise GraphError(
                f"{op_name}: q {q.shape} and k {k.shape} need the same last axis and k and v "
                f"{v.shape} the same key count"
            )
        scale = float(scale) if scale is not None else float(1.0 / np.sqrt(q.shape[-1]))
        shape = (*q.shape[:-1], v.shape[-1])
        operands = (q, k, v, *self._attention_mask(op_name, q, k, mask))
        return self._op(
            "flash_attention", operands, shape, dtype, op_name, causal=bool(causal), scale=scale
        )

    def cast(self, x: Value, dtype: str, name: str | None = None, scale_exponent: int = 0) -> Value:
        """Convert to another precision (to F8: stored as ``x / 2**scale_exponent``)."""
        x = self._check(x)
        op_name = self._name("cast", name)
        if dtype not in PRECISIONS:
            known = ", ".join(sorted(PRECISIONS))
            raise GraphError(f"{op_name}: unknown precision {dtype!r}; supported: {known}")
        if {x.dtype, dtype} == {"f8", "i32"}:
            raise GraphError(f"{op_name}: cast between f8 and i32 goes through f16 or f32")
        return self._op("cast", (x,), x.shape, dtype, op_name, scale_exponent)

    def repeat(
        self,
        count: int,
        carried: Value,
        invariants: Sequence[Value],
        iterated: Sequence[Value],
        body: Callable[[ComputeGraph, Value, list[Value], list[Value]], Value],
        name: str | None = None,
    ) -> Value:
        """A structured loop, lowered once: ``carried = body(g, carried, invariants, slices)``
        ``count`` times, where ``slices[j]`` is ``iterated[j][i]`` in iteration ``i``.

        ``body`` builds the loop body in the sub-graph ``g`` it is given (from stand-ins for
        its arguments) and returns the new carried value, which must keep the carried shape
        and precision. Iterated values are parameters with a leading axis of ``count``.
        """
        op_name = self._name("repeat", name)
        carried = self._check(carried)
        if count < 1:
            raise GraphError(f"{op_name}: count must be >= 1, got {count}")
        sub = ComputeGraph(prefix=f"{op_name}/")
        c_in = sub.host_input(f"{op_name}/carried", carried.shape, carried.dtype)
        inv_in = []
        for j, v in enumerate(invariants):
            v = self._check(v)
            make = sub.parameter if v.kind == "parameter" else sub.host_input
            inv_in.append(make(f"{op_name}/invariant{j}", v.shape, v.dtype, v.scale_exponent))
        it_in = []
        for j, v in enumerate(iterated):
            v = self._check(v)
            if v.kind != "parameter" or len(v.shape) < 2 or v.shape[0] != count:
                raise GraphError(
                    f"{op_name}: iterated value {v.name!r} {v.shape} must be a parameter with a "
                    f"leading axis of {count}"
                )
            it_in.append(
                sub.parameter(f"{op_name}/iterated{j}", v.shape[1:], v.dtype, v.scale_exponent)
            )
        result = body(sub, c_in, inv_in, it_in)
        if not isinstance(result, Value) or (result.shape, result.dtype) != (
            carried.shape,
            carried.dtype,
        ):
            raise GraphError(
                f"{op_name}: the body must return a value of the carried shape {carried.shape} "
                f"and precision {carried.dtype}"
            )
        sub.set_outputs(result)
        sub.verify()
        return self._op(
            "repeat",
            (carried, *invariants, *iterated),
            carried.shape,
            carried.dtype,
            op_name,
            count=int(count),
            invariants=len(invariants),
            body=sub,
        )

    def set_outputs(self, *values: Value) -> None:
        """Mark the values the host reads after a run."""
        if not values:
            raise GraphError("set_outputs needs at least one value")
        self.outputs = tuple(self._check(v).id for v in values)

    # -- queries ----------------------------------------------------------------------------
    def value(self, value_id: int) -> Value:
        return self.values[value_id]

    def by_kind(self, kind: str) -> list[Value]:
        return [v for v in self.values if v.kind == kind]

    def consumers(self, value_id: int) -> list[Operation]:
        return [op for op in self.operations if value_id in op.inputs]

    def producer(self, value_id: int) -> Operation | None:
        for op in self.operations:
            if op.output == value_id:
                return op
        return None

    def verify(self) -> None:
        """Check structural invariants: SSA order, outputs set, operands defined before use."""
        if not self.outputs:
            raise GraphError("the graph has no outputs; call set_outputs(...)")
        produced = {v.id for v in self.values if v.kind != "operation"}
        for op in self.operations:
            for operand in op.inputs:
                if operand not in produced:
                    raise GraphError(f"{op.name}: operand value {operand} used before definition")
            produced.add(op.output)


def reference_gemm(
    left: np.ndarray, right: np.ndarray, transpose_left: bool, transpose_right: bool
) -> np.ndarray:
    """The exact float64 result of a gemm, for checking the simulator."""
    a = np.swapaxes(left, -1, -2) if transpose_left else left
    b = np.swapaxes(right, -1, -2) if transpose_right else right
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def reference_op(op: Operation, args: list[np.ndarray]) -> np.ndarray:
    """float64 NumPy semantics of one operation (the independent reference)."""
    from scipy.special import erf

    if op.kind == "gemm":
        return reference_gemm(args[0], args[1], op.transpose_left, op.transpose_right)
    if op.kind == "add":
        return args[0] + args[1]
    if op.kind == "mul":
        return args[0] * args[1]
    if op.kind == "gelu" and op.attr("approximate") == "tanh":
        x = args[0]
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    if op.kind == "gelu":
        x = args[0]
        return x * 0.5 * (1.0 + erf(x / np.sqrt(2.0)))
    from ipu_stack.graph.elementwise import reference_elementwise

    if (result := reference_elementwise(op, args)) is not None:
        return result
    if op.kind == "layer_norm":
        x, scale, bias = args
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) / np.sqrt(var + op.attr("epsilon")) * scale + bias
    if op.kind == "softmax":
        return _reference_softmax(args[0])
    if op.kind == "transpose":
        return np.transpose(args[0], op.attr("perm"))
    if op.kind == "slice":
        return args[0][tuple(slice(lo, hi) for lo, hi in op.attr("bounds"))]
    if op.kind == "flash_attention":
        q, k, v = args[:3]
        s = np.matmul(q, np.swapaxes(k, -1, -2)) * op.attr("scale")
        if len(args) == 4:  # additive mask
            s = s + args[3]
        if op.attr("causal"):
            tq, tk = s.shape[-2:]
            mask = np.triu(np.ones((tq, tk), bool), k=1 + tk - tq)
            s = np.where(mask, -np.inf, s)
        return np.matmul(_reference_softmax(s), v)
    if op.kind == "cast":
        return args[0]
    raise GraphError(f"{op.name}: no reference for operation kind {op.kind!r}")


def _reference_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; a row with no finite entry above -inf (every key blocked)
    is all zeros (softmax and attention define it so: SDPA's NaN guard gives that value)."""
    open_row = np.isfinite(x).any(axis=-1, keepdims=True) | (x == np.inf).any(-1, keepdims=True)
    safe = np.where(open_row, x, 0.0)
    e = np.exp(safe - safe.max(axis=-1, keepdims=True))
    return np.where(open_row, e / e.sum(axis=-1, keepdims=True), 0.0)


def evaluate_reference(graph: ComputeGraph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate the graph in float64 with NumPy (the independent reference)."""
    env: dict[int, np.ndarray] = {}
    for v in graph.values:
        if v.kind != "operation":
            env[v.id] = np.asarray(feeds[v.name], dtype=_reference_dtype(v.dtype))
    for op in graph.operations:
        args = [env[i] for i in op.inputs]
        out = graph.value(op.output)
        dtypes = (out.dtype, *(graph.value(i).dtype for i in op.inputs))
        if op.kind in INDEXING_KINDS or ("i32" in dtypes and op.kind in ("add", "mul", "cast")):
            names = [graph.value(i).name for i in op.inputs]
            result = reference_indexing(op, args, out.dtype, names)
            env[op.output] = result.astype(_reference_dtype(out.dtype))
            continue
        if op.kind == "repeat":
            env[op.output] = _reference_repeat(op, args)
            continue
        if op.kind == "view":
            env[op.output] = args[0].reshape(graph.value(op.output).shape)
        else:
            env[op.output] = reference_op(op, args)
    return {graph.value(i).name: env[i] for i in graph.outputs}


def _reference_dtype(dtype: str) -> type:
    """Reference arrays: float64 for float values, int64 for i32 ones (exact both ways)."""
    return np.int64 if dtype == "i32" else np.float64


def _reference_repeat(op: Operation, args: list[np.ndarray]) -> np.ndarray:
    sub: ComputeGraph = op.attr("body")
    n_inv = op.attr("invariants")
    carried, invariants, iterated = args[0], args[1 : 1 + n_inv], args[1 + n_inv :]
    names = [v.name for v in sub.values if v.kind != "operation"]
    for i in range(op.attr("count")):
        feeds = dict(zip(names, [carried, *invariants, *(a[i] for a in iterated)], strict=True))
        carried = next(iter(evaluate_reference(sub, feeds).values()))
    return carried

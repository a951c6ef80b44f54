"""ComputeGraph: the user's tensor program as structured SSA.

Values are produced once (by a host input, a parameter, or an operation) and never mutated.
Every value is row-major; an operation's shape rule runs when it is added, so a bad program
fails at the line that builds it, with a message naming the operation and its operands.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.target.ipu21 import PRECISIONS


@dataclass(frozen=True, slots=True)
class Value:
    """An SSA value: its id, name, shape, precision, and what produces it."""

    id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "host_input" | "parameter" | "operation"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True, slots=True)
class GemmOp:
    """output = left @ right on the last two axes, leading batch axes broadcast like NumPy."""

    id: int
    name: str
    left: int
    right: int
    output: int
    transpose_left: bool = False
    transpose_right: bool = False


@dataclass(slots=True)
class ComputeGraph:
    """A tensor program under construction.

    Example:
        >>> g = ComputeGraph()
        >>> x = g.host_input("x", (128, 64), "f16")
        >>> w = g.parameter("w", (64, 32), "f16")
        >>> g.set_outputs(g.gemm(x, w))
    """

    values: list[Value] = field(default_factory=list)
    operations: list[GemmOp] = field(default_factory=list)
    outputs: tuple[int, ...] = ()

    # -- construction -----------------------------------------------------------------------
    def _new_value(self, name: str, shape: tuple[int, ...], dtype: str, kind: str) -> Value:
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
        value = Value(len(self.values), name, shape, dtype, kind)
        self.values.append(value)
        return value

    def host_input(self, name: str, shape: tuple[int, ...], dtype: str = "f16") -> Value:
        """A tensor the host writes before each run (delivered once, not replicated)."""
        return self._new_value(name, shape, dtype, "host_input")

    def parameter(self, name: str, shape: tuple[int, ...], dtype: str = "f16") -> Value:
        """Weights uploaded once before runs; the plan may store them in any layout."""
        return self._new_value(name, shape, dtype, "parameter")

    def _check(self, value: Value) -> Value:
        if not isinstance(value, Value) or value.id >= len(self.values):
            raise GraphError(f"{value!r} is not a value of this graph")
        if self.values[value.id] is not value and self.values[value.id] != value:
            raise GraphError(f"{value!r} is not a value of this graph")
        return value

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
        op_name = name or f"gemm{len(self.operations)}"
        for role, v in (("left", left), ("right", right)):
            if len(v.shape) < 2:
                raise GraphError(
                    f"{op_name}: {role} operand {v.name!r} has shape {v.shape}; "
                    "gemm needs rank >= 2"
                )
        if left.dtype != right.dtype:
            raise GraphError(
                f"{op_name}: operand precisions differ: {left.name!r} is {left.dtype}, "
                f"{right.name!r} is {right.dtype}"
            )
        m, k_left = left.shape[-2:][::-1] if transpose_left else left.shape[-2:]
        k_right, n = right.shape[-2:][::-1] if transpose_right else right.shape[-2:]
        if k_left != k_right:
            raise GraphError(
                f"{op_name}: inner dimensions differ: {left.name!r} {left.shape}"
                f"{' (transposed)' if transpose_left else ''} has K={k_left}, "
                f"{right.name!r} {right.shape}{' (transposed)' if transpose_right else ''} "
                f"has K={k_right}"
            )
        try:
            batch = np.broadcast_shapes(left.shape[:-2], right.shape[:-2])
        except ValueError:
            raise GraphError(
                f"{op_name}: batch axes {left.shape[:-2]} of {left.name!r} and "
                f"{right.shape[:-2]} of {right.name!r} do not broadcast"
            ) from None
        out = self._new_value(f"{op_name}.out", (*batch, m, n), left.dtype, "operation")
        self.operations.append(
            GemmOp(
                len(self.operations),
                op_name,
                left.id,
                right.id,
                out.id,
                transpose_left,
                transpose_right,
            )
        )
        return out

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

    def consumers(self, value_id: int) -> list[GemmOp]:
        return [op for op in self.operations if value_id in (op.left, op.right)]

    def verify(self) -> None:
        """Check structural invariants: SSA order, outputs set, operands defined before use."""
        if not self.outputs:
            raise GraphError("the graph has no outputs; call set_outputs(...)")
        produced = {v.id for v in self.values if v.kind != "operation"}
        for op in self.operations:
            for operand in (op.left, op.right):
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


def evaluate_reference(graph: ComputeGraph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate the graph in float64 with NumPy (the independent reference)."""
    env: dict[int, np.ndarray] = {}
    for v in graph.values:
        if v.kind != "operation":
            env[v.id] = np.asarray(feeds[v.name], dtype=np.float64)
    for op in graph.operations:
        env[op.output] = reference_gemm(
            env[op.left], env[op.right], op.transpose_left, op.transpose_right
        )
    return {graph.value(i).name: env[i] for i in graph.outputs}

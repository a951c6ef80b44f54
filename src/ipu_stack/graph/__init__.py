"""The user-facing program representation."""

from ipu_stack.graph.compute_graph import (
    ComputeGraph,
    GemmOp,
    Operation,
    Value,
    evaluate_reference,
)

__all__ = ["ComputeGraph", "GemmOp", "Operation", "Value", "evaluate_reference"]

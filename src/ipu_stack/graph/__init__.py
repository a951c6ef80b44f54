"""The user-facing program representation."""

from ipu_stack.graph.compute_graph import ComputeGraph, GemmOp, Value, evaluate_reference

__all__ = ["ComputeGraph", "GemmOp", "Value", "evaluate_reference"]

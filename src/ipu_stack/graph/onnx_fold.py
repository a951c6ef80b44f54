"""NumPy constant folding for ONNX operators ``onnx.reference`` fails on.

``onnx.reference`` 1.23.2 raises on ``GatherElements`` with the index tensors exporters write
(BERT's legacy position ids); the importer folds such nodes here instead. Each function
takes the node and its constant inputs and returns its outputs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import NodeProto

from ipu_stack.graph.onnx_patterns import attribute


def _gather_elements(node: NodeProto, data: np.ndarray, indices: np.ndarray) -> list[np.ndarray]:
    axis = int(attribute(node, "axis", 0))  # type: ignore[call-overload]
    axis %= data.ndim
    indices = np.asarray(indices, dtype=np.int64)
    indices = np.where(indices < 0, indices + data.shape[axis], indices)
    if np.any(indices < 0) or np.any(indices >= data.shape[axis]):
        raise ValueError(f"GatherElements index out of range for axis {axis} of {data.shape}")
    return [np.take_along_axis(data, indices, axis=axis)]


FALLBACKS: dict[str, Callable[..., list[np.ndarray]]] = {
    "GatherElements": _gather_elements,
}


def numpy_fold(node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray] | None:
    """The outputs of ``node`` on constant ``inputs``, or None when there is no fallback."""
    fold = FALLBACKS.get(node.op_type)
    return None if fold is None else fold(node, *inputs)

"""Convert an ONNX model's floating-point tensors to one precision (``compile --precision``).

Every FLOAT and FLOAT16 tensor of the main graph becomes the target type: graph inputs,
outputs and value_info declarations, initializers, ``Constant`` and ``ConstantOfShape`` values,
and ``Cast`` nodes whose target is FLOAT or FLOAT16 (they become casts to the target, so a
mixed-precision model computes entirely in the target precision). Values are rounded to the
nearest representable number; finite F32 values beyond the F16 range (|x| > 65504) saturate
to +-65504 (exporters write ``finfo(float32).min`` as "minus a large finite number" in masks:
as -inf, ``0 * mask`` would be NaN and a fully masked row's softmax NaN, where F32 gives a
uniform row); infinities stay infinite.
Integer, boolean and float64 tensors are left as they are; subgraphs are not visited.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ipu_stack.errors import GraphError

ELEM_OF = {"f16": TensorProto.FLOAT16, "f32": TensorProto.FLOAT}
NUMPY_OF: dict[str, type[np.generic]] = {"f16": np.float16, "f32": np.float32}
FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16)
#: external-data entry of a tensor converted on read: the data type stored in the file
SOURCE_TYPE_KEY = "ipu_stack_source_type"


def convert_precision(model: onnx.ModelProto, precision: str) -> onnx.ModelProto:
    """A copy of ``model`` whose float tensors are all ``precision`` (``f16`` or ``f32``).

    Raises:
        GraphError: ``precision`` is not ``f16`` or ``f32``.
    """
    if precision not in ELEM_OF:
        raise GraphError(f"--precision must be f16 or f32, got {precision!r}")
    elem, dtype = ELEM_OF[precision], NUMPY_OF[precision]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    for info in (*graph.input, *graph.output, *graph.value_info):
        tensor_type = info.type.tensor_type
        if tensor_type.elem_type in FLOAT_TYPES:
            tensor_type.elem_type = elem
    for index, init in enumerate(graph.initializer):
        if init.data_type in FLOAT_TYPES and init.data_location == TensorProto.EXTERNAL:
            # left on disk: converted one tensor at a time when read (onnx_external)
            mark_converted(init, elem)
        elif init.data_type in FLOAT_TYPES:
            graph.initializer[index].CopyFrom(_converted(init, dtype))
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i in FLOAT_TYPES:
                attr.i = elem
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in FLOAT_TYPES:
                attr.t.CopyFrom(_converted(attr.t, dtype))
    return out


def _converted(tensor: TensorProto, dtype: type[np.generic]) -> TensorProto:
    return numpy_helper.from_array(
        converted_array(numpy_helper.to_array(tensor), dtype), tensor.name
    )


#: arrays above this many elements are converted in blocks of this many (element by element
#: the same values, without full-size temporaries: a weight read from disk is read once)
_BLOCK = 1 << 16


def converted_array(array: np.ndarray, dtype: type[np.generic] | np.dtype) -> np.ndarray:
    """``array`` in ``dtype``, rounded to nearest; finite values beyond F16 saturate."""
    if array.size > _BLOCK and array.flags.c_contiguous and array.dtype != np.dtype(dtype):
        flat = array.reshape(-1)
        out = np.empty(flat.shape, dtype)
        for start in range(0, flat.size, _BLOCK):
            out[start : start + _BLOCK] = _converted_block(flat[start : start + _BLOCK], dtype)
        return out.reshape(array.shape)
    return _converted_block(array, dtype)


def _converted_block(array: np.ndarray, dtype: type[np.generic] | np.dtype) -> np.ndarray:
    if np.dtype(dtype) == np.float16 and array.dtype != np.float16:
        top = float(np.finfo(np.float16).max)
        array = np.where(np.isfinite(array), np.clip(array, -top, top), array)
    return array.astype(dtype)


def mark_converted(tensor: TensorProto, elem: int) -> None:
    """Declare an external tensor as ``elem`` without reading it: the file's type is kept in
    its external-data entries (``SOURCE_TYPE_KEY``) for the reader to convert from."""
    if tensor.data_type == elem:
        return
    entries = {entry.key: entry for entry in tensor.external_data}
    if SOURCE_TYPE_KEY not in entries:
        entry = tensor.external_data.add()
        entry.key, entry.value = SOURCE_TYPE_KEY, str(tensor.data_type)
    tensor.data_type = elem

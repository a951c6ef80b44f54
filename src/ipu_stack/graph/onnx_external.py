"""ONNX files with external data, of any size: weights are memory-mapped, never copied in.

A protobuf message cannot exceed 2 GB, so large exports (``torch.onnx.export`` of a model
over 2 GB, or ``onnx.save(..., save_as_external_data=True)``) keep their initializers in side
files, each tensor given by ``location``, ``offset`` and ``length``. ``load_model`` reads only
the graph: small external tensors (shape constants and the like, up to ``INLINE_BYTES``, and
every non-float tensor) are read into the proto, so shape inference and constant folding see
them; large ones stay external with their ``location`` made absolute, and ``tensor_array``
returns them as a read-only ``numpy.memmap`` of the side file, so import, build and package
writing read the weights from the page cache instead of holding copies of the file in memory.
The proto that remains is small, so ``onnx.shape_inference.infer_shapes`` works on it
whatever the weights weigh.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ipu_stack.errors import GraphError

#: external tensors up to this size are read into the proto (shape constants, small biases)
INLINE_BYTES = 64 * 1024
_FLOAT_TYPES: dict[int, type[np.floating]] = {
    TensorProto.FLOAT: np.float32,
    TensorProto.FLOAT16: np.float16,
}


def load_model(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Load an ONNX file; its large external tensors are left on disk (see the module doc).

    Raises:
        GraphError: the file is missing or unreadable, or an external data file is missing or
            shorter than a tensor says (naming the tensor, the file and the sizes).
    """
    path = os.fspath(path)
    try:
        proto = onnx.load(path, load_external_data=False)
    except FileNotFoundError:
        raise GraphError(f"ONNX model {path!r} not found") from None
    except IsADirectoryError:
        raise GraphError(f"ONNX model {path!r} is a directory") from None
    except Exception as err:  # protobuf raises DecodeError and friends
        line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise GraphError(f"cannot read ONNX model {path!r}: {line}") from None
    base = os.path.dirname(os.path.abspath(path))
    for tensor in proto.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            _resolve(tensor, base)
    return proto


def _external_info(tensor: TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def _resolve(tensor: TensorProto, base: str) -> None:
    """Make ``tensor``'s location absolute and check the file; read it in if it is small."""
    info = _external_info(tensor)
    if "location" not in info:
        raise GraphError(f"external tensor {tensor.name!r} has no location")
    location = os.path.join(base, info["location"])
    offset = int(info.get("offset", 0))
    nbytes = _nbytes(tensor)
    length = int(info.get("length", nbytes))
    try:
        size = os.path.getsize(location)
    except OSError:
        raise GraphError(
            f"external data file {location!r} of tensor {tensor.name!r} not found"
        ) from None
    if length < nbytes or offset + length > size:
        raise GraphError(
            f"external tensor {tensor.name!r}: needs {nbytes} bytes at offset {offset} of "
            f"{location!r}, which has {size} bytes"
        )
    if nbytes <= INLINE_BYTES or tensor.data_type not in _FLOAT_TYPES:
        with open(location, "rb") as f:
            f.seek(offset)
            tensor.raw_data = f.read(nbytes)
        del tensor.external_data[:]
        tensor.data_location = TensorProto.DEFAULT
        return
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = location


def _nbytes(tensor: TensorProto) -> int:
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    return int(np.prod(tensor.dims, dtype=np.int64)) * np.dtype(dtype).itemsize


def tensor_array(tensor: TensorProto) -> np.ndarray:
    """The data of an initializer: a read-only memmap if it is still external, else a copy."""
    if tensor.data_location != TensorProto.EXTERNAL:
        return numpy_helper.to_array(tensor)
    from ipu_stack.graph.onnx_precision import SOURCE_TYPE_KEY, converted_array

    info = _external_info(tensor)
    stored = int(info.get(SOURCE_TYPE_KEY, tensor.data_type))
    dtype = np.dtype(_FLOAT_TYPES[stored]).newbyteorder("<")
    shape = tuple(int(d) for d in tensor.dims)
    mapped = np.memmap(
        info["location"], dtype=dtype, mode="r", offset=int(info.get("offset", 0)), shape=shape
    )
    if stored == tensor.data_type:
        return mapped
    # converted (``compile --precision``): this tensor alone is read in, in the new type
    return converted_array(mapped, _FLOAT_TYPES[tensor.data_type])

"""ONNX model validation, before import: the onnx checker's rules plus ours.

:func:`validate_onnx` runs first in :func:`ipu_stack.graph.onnx_import.import_onnx` (and on
the file ``compile`` reads), so a malformed model is rejected with one line naming what is
wrong before the importer interprets it. In order:

1. the file is not empty and parses as a ModelProto with a graph (an empty or truncated file
   is named as such);
2. the default-domain (``ai.onnx``) opset is imported once and lies in 1..the newest opset the
   installed onnx package knows (``onnx.defs.onnx_opset_version()``); the IR version is known;
3. no dimension of a graph input, output, value_info or initializer is negative;
4. ``onnx.checker.check_model``: SSA (each tensor produced once: duplicate node outputs are
   rejected, as onnxruntime does), topological order (no dangling inputs), every operator
   exists in the declared opset (``Gelu`` needs opset 20), attribute names and types;
5. ``input_shapes`` (``--input-shape``) names graph inputs that are not initializers, with the
   model's rank, and agrees with every static dimension the model declares;
6. strict shape and type inference (``onnx.shape_inference``, ``check_type``, ``strict_mode``):
   a declared type or shape that contradicts what the operators compute (a FLOAT16 output of
   a FLOAT computation, an initializer whose data does not fill its dims) is rejected.

Raises :class:`~ipu_stack.errors.GraphError` (exit status 2).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import onnx

from ipu_stack.errors import GraphError

#: Lowest default-domain opset accepted (ONNX's first).
MIN_OPSET = 1
_KNOWN_TYPES = frozenset(v for v in onnx.TensorProto.DataType.values() if v != 0)


def newest_opset() -> int:
    """The newest default-domain opset of the installed onnx package."""
    return int(onnx.defs.onnx_opset_version())


def validate_onnx(
    proto: onnx.ModelProto,
    source: object = None,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> None:
    """Check a loaded model (see the module docstring).

    Args:
        proto: the model as loaded.
        source: the path it came from (names the file in messages and detects empty files),
            or anything else (a ModelProto) for "the ONNX model".
        input_shapes: static shapes the caller will give graph inputs.

    Raises:
        GraphError: the first problem, in one line.
    """
    path = os.fspath(source) if isinstance(source, str | os.PathLike) else None
    name = f"ONNX model {path!r}" if path else "the ONNX model"
    if path is not None and os.path.isfile(path) and os.path.getsize(path) == 0:
        raise GraphError(f"{name} is an empty file (0 bytes)")
    if not proto.HasField("graph") or proto.ir_version == 0:
        raise GraphError(
            f"{name} is not a complete ONNX model (no graph or no IR version: empty, "
            "truncated or not ONNX)"
        )
    if proto.ir_version > onnx.IR_VERSION:
        raise GraphError(
            f"{name} has IR version {proto.ir_version}; the installed onnx reads up to "
            f"{onnx.IR_VERSION}"
        )
    _check_opset(proto, name)
    _check_names(proto, name)
    _check_dims(proto, name)
    light = _light_for_checking(proto, name)
    try:
        onnx.checker.check_model(_shapes_marked(light))
    except (onnx.checker.ValidationError, ValueError) as err:
        line = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), repr(err))
        raise GraphError(f"{name} fails the ONNX checker: {line}") from None
    if input_shapes:
        _check_input_shapes(proto, input_shapes, name)
    try:
        onnx.shape_inference.infer_shapes(light, check_type=True, strict_mode=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError,
            ValueError, TypeError) as err:  # fmt: skip
        line = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), repr(err))
        raise GraphError(f"{name} fails ONNX shape and type inference: {line}") from None


def _light_for_checking(proto: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """The model as the onnx checker and shape inference see it: without the bytes of its
    weights, which they only serialize (seconds for a model of 100 MB; impossible past
    protobuf's 2 GB).

    An initializer of more than :data:`LIGHT_BYTES` of ``raw_data`` (or external, resolved to
    an absolute path by ``graph/onnx_external.py``, which checked its file) becomes a graph
    input of its type and shape in the copy; its data is checked to fill its dims here (what
    strict inference would check). Small initializers stay: shape tensors and other constants
    that inference reads keep their values. The caller's model is not modified.
    """
    heavy = [i for i, t in enumerate(proto.graph.initializer) if _heavy(t, name)]
    if not heavy:
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    inputs = {info.name for info in copy.graph.input}
    for i in sorted(heavy, reverse=True):
        tensor = copy.graph.initializer[i]
        if tensor.name not in inputs:
            copy.graph.input.append(
                onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims)
            )
        del copy.graph.initializer[i]
    return copy


def _shapes_marked(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` for ``check_model``: a graph input or output without a shape gets an
    unknown-rank marker (ONNX allows it and onnxruntime runs it; ``check_model`` requires the
    field; the marker would read as rank 0 to shape inference, which gets ``proto`` itself)."""
    graph = proto.graph
    missing = [
        (kind, i)
        for kind, infos in (("input", graph.input), ("output", graph.output))
        for i, info in enumerate(infos)
        if info.type.HasField("tensor_type") and not info.type.tensor_type.HasField("shape")
    ]
    if not missing:
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for kind, i in missing:
        info = (copy.graph.input if kind == "input" else copy.graph.output)[i]
        info.type.tensor_type.shape.SetInParent()
    return copy


#: Initializers with more raw bytes than this are checked without their data (see above).
LIGHT_BYTES = 4096


def _heavy(tensor: onnx.TensorProto, name: str) -> bool:
    """Whether ``tensor`` is checked without its data: external (resolved), or raw data of
    more than :data:`LIGHT_BYTES`, which must then hold exactly its dims' elements."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return any(e.key == "location" and os.path.isabs(e.value) for e in tensor.external_data)
    raw = len(tensor.raw_data)
    if raw <= LIGHT_BYTES:
        return False
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return False  # an unusual type: left to the checker with its data
    if tensor.data_type in _SUB_BYTE:
        return False
    elements = 1
    for d in tensor.dims:
        elements *= d
    if elements * itemsize != raw:
        raise GraphError(
            f"{name} fails ONNX shape and type inference: initializer {tensor.name!r} has "
            f"{raw} bytes of data but its dims {list(tensor.dims)} need {elements * itemsize}"
        )
    return True


_SUB_BYTE = frozenset(
    getattr(onnx.TensorProto, t)
    for t in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(onnx.TensorProto, t)
)


def _check_names(proto: onnx.ModelProto, name: str) -> None:
    """Every name and op type is text (protobuf hands invalid UTF-8 back as bytes)."""
    graph = proto.graph
    infos = [*graph.input, *graph.output, *graph.value_info, *graph.initializer]
    for info in infos:
        if not isinstance(info.name, str):
            raise GraphError(f"{name}: a graph tensor name is not valid UTF-8 text: {info.name!r}")
    for position, node in enumerate(graph.node):
        texts = [node.name, node.op_type, node.domain, *node.input, *node.output]
        texts += [a.name for a in node.attribute]
        bad = next((t for t in texts if not isinstance(t, str)), None)
        if bad is not None:
            raise GraphError(
                f"{name}: node {position} ({node.op_type!r}) has a name that is not valid "
                f"UTF-8 text: {bad!r:.60}"
            )


def _check_opset(proto: onnx.ModelProto, name: str) -> None:
    default = [e.version for e in proto.opset_import if e.domain in ("", "ai.onnx")]
    if not default:
        raise GraphError(f"{name} imports no default-domain (ai.onnx) opset")
    if len(default) > 1:
        raise GraphError(f"{name} imports the default-domain opset {len(default)} times")
    newest = newest_opset()
    if not MIN_OPSET <= default[0] <= newest:
        raise GraphError(
            f"{name} declares opset {default[0]}; supported opsets are {MIN_OPSET}..{newest} "
            "(the installed onnx package's range)"
        )


def _check_dims(proto: onnx.ModelProto, name: str) -> None:
    graph = proto.graph
    for kind, infos in (
        ("input", graph.input),
        ("output", graph.output),
        ("value_info", graph.value_info),
    ):
        for info in infos:
            tensor = info.type.tensor_type
            known = tensor.elem_type in _KNOWN_TYPES or kind == "value_info"
            if info.type.HasField("tensor_type") and not known:
                raise GraphError(
                    f"{name}: graph {kind} {info.name!r} has element type {tensor.elem_type} "
                    "(undefined or unknown)"
                )
            if not tensor.HasField("shape"):
                continue
            for axis, dim in enumerate(tensor.shape.dim):
                if dim.HasField("dim_value") and dim.dim_value < 0:
                    raise GraphError(
                        f"{name}: graph {kind} {info.name!r} has negative dimension "
                        f"{dim.dim_value} at axis {axis}"
                    )
    for init in graph.initializer:
        if any(d < 0 for d in init.dims):
            raise GraphError(
                f"{name}: initializer {init.name!r} has a negative dimension {list(init.dims)}"
            )
        _check_initializer_size(init, name)


def _check_initializer_size(init: onnx.TensorProto, name: str) -> None:
    """The data of an (embedded) initializer holds exactly the elements its dims announce."""
    if init.data_location == onnx.TensorProto.EXTERNAL or init.data_type in (
        onnx.TensorProto.STRING,
        onnx.TensorProto.UNDEFINED,
    ):
        return
    want = 1
    for d in init.dims:
        want *= d
    try:
        if init.HasField("raw_data"):
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
            bits = _bits(init.data_type, itemsize)
            if len(init.raw_data) == (want * bits + 7) // 8:
                return
            have = len(init.raw_data) * 8 // bits
        elif _bits(init.data_type, 1) == 4:
            return  # packed 4-bit types in typed fields: left to the checker
        else:
            have = len(getattr(init, onnx.helper.tensor_dtype_to_field(init.data_type)))
            if init.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
                have //= 2
    except (KeyError, ValueError, TypeError):
        raise GraphError(
            f"{name}: initializer {init.name!r} has unknown data type {init.data_type}"
        ) from None
    if have != want and not (want == 0 and have == 0):
        raise GraphError(
            f"{name}: initializer {init.name!r} has {have} elements of data for dims "
            f"{list(init.dims)} ({want} elements)"
        )


def _bits(data_type: int, itemsize: int) -> int:
    """Bits per element in raw data (4 for the packed 4-bit types)."""
    packed = {
        getattr(onnx.TensorProto, n)
        for n in ("INT4", "UINT4", "FLOAT4E2M1")
        if hasattr(onnx.TensorProto, n)
    }
    return 4 if data_type in packed else 8 * itemsize


def _check_input_shapes(
    proto: onnx.ModelProto, input_shapes: Mapping[str, tuple[int, ...]], name: str
) -> None:
    initializers = {i.name for i in proto.graph.initializer}
    inputs = {i.name: i for i in proto.graph.input if i.name not in initializers}
    for input_name, shape in input_shapes.items():
        if input_name not in inputs:
            raise GraphError(
                f"--input-shape {input_name}: {name} has no graph input {input_name!r}; its "
                f"inputs: {', '.join(sorted(inputs)) or 'none'}"
            )
        tensor = inputs[input_name].type.tensor_type
        if not tensor.HasField("shape"):
            continue
        dims = tensor.shape.dim
        if len(dims) != len(shape):
            raise GraphError(
                f"--input-shape {input_name}: {len(shape)} dimensions given, the model's input "
                f"has {len(dims)} ({_describe(dims)})"
            )
        for axis, (dim, value) in enumerate(zip(dims, shape, strict=True)):
            if dim.HasField("dim_value") and dim.dim_value != value:
                raise GraphError(
                    f"--input-shape {input_name}: axis {axis} is {value}, the model declares "
                    f"{dim.dim_value} ({_describe(dims)})"
                )


def _describe(dims: object) -> str:
    parts = []
    for dim in dims:  # type: ignore[attr-defined]
        parts.append(str(dim.dim_value) if dim.HasField("dim_value") else dim.dim_param or "?")
    return "[" + ", ".join(parts) + "]"

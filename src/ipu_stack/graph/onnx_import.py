"""ONNX front end: an ONNX model becomes a ComputeGraph plus the data to feed it.

Stages, in order:

load          read the model; bind caller-given constants and input shapes
infer         ONNX shape inference (static shapes feed Shape folding and the patterns)
fold          evaluate every node whose inputs are all known (shape subgraphs, Constant, ...)
match         find GeLU / attention / transpose-into-gemm patterns (``onnx_patterns``)
live          walk back from the graph outputs so dead and folded nodes emit nothing
emit          one or a few ComputeGraph operations per live node, in ONNX order

Initializers used as tensors become parameters (their data is in ``OnnxBindings.parameters``);
graph inputs become host inputs. What the machine cannot do fails with ``GraphError`` naming
the ONNX node, its op type and why.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import NodeProto, TensorProto, numpy_helper

from ipu_stack.errors import GraphError
from ipu_stack.graph import (
    attention_biases,
    layer_rolling,
    onnx_conv,
    onnx_external,
    onnx_ops,
    onnx_ops_exported,
    onnx_ops_integer,
    scale_folding,
)
from ipu_stack.graph.compute_graph import ComputeGraph, Value
from ipu_stack.graph.onnx_fold import numpy_fold
from ipu_stack.graph.onnx_ops import PRECISION_OF
from ipu_stack.graph.onnx_patterns import (
    AttentionFusion,
    Fusion,
    GeluFusion,
    GemmFusion,
    NanGuardFusion,
    OnnxIndex,
    PatchFusion,
    attribute,
    match_fusions,
)
from ipu_stack.graph.onnx_patterns_exported import merge_duplicate_masks, shared_masks_first
from ipu_stack.graph.onnx_validate import validate_onnx
from ipu_stack.target.ipu21 import PRECISIONS

NUMPY_OF = {"f32": np.float32, "f16": np.float16}
#: Op types the importer emits (others only fold to constants or sit inside a pattern).
EMITTERS = {
    **onnx_ops.EMITTERS,
    **onnx_ops_exported.EMITTERS,
    **onnx_ops_integer.EMITTERS,
    **onnx_conv.EMITTERS,
}
SUPPORTED_OPS = tuple(sorted(EMITTERS))
#: nodes named in full by the error when several cannot be imported (the rest are counted)
MAX_FAILURES_NAMED = 4
#: Never folded, even with constant inputs: their result is not a function of their inputs.
NONDETERMINISTIC = ("Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike",
                    "RandomUniform", "RandomUniformLike")  # fmt: skip


@dataclass(slots=True)
class OnnxBindings:
    """How an imported graph's values relate to the ONNX model's names, and parameter data.

    Attributes:
        parameters: data of every graph parameter, by parameter name, in its precision.
        inputs: ONNX graph input name -> its host input value (inputs nothing uses are absent).
        outputs: ONNX graph output name -> the graph value holding it.
        output_shapes: ONNX graph output name -> its ONNX shape (a rank-0 ONNX tensor is a
            ``(1,)`` graph value).
        ignored_inputs: ONNX graph inputs no output depends on.
        fusions: one line per matched pattern (what was fused, which nodes it absorbed).
        opset: the model's default-domain opset.
    """

    parameters: dict[str, np.ndarray] = field(default_factory=dict)
    inputs: dict[str, Value] = field(default_factory=dict)
    outputs: dict[str, Value] = field(default_factory=dict)
    output_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    ignored_inputs: tuple[str, ...] = ()
    fusions: list[str] = field(default_factory=list)
    opset: int = 0

    def feeds(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Everything a run needs, by graph value name: parameters plus ``inputs``.

        Args:
            inputs: arrays by ONNX graph input name (extra names are ignored).

        Raises:
            GraphError: if a used input is missing or has the wrong number of elements.
        """
        feeds = dict(self.parameters)
        for onnx_name, value in self.inputs.items():
            if onnx_name not in inputs:
                raise GraphError(f"no data for ONNX graph input {onnx_name!r}")
            array = np.asarray(inputs[onnx_name])
            if array.size != value.size:
                raise GraphError(
                    f"ONNX graph input {onnx_name!r}: expected shape {value.shape}, "
                    f"got {array.shape}"
                )
            if value.dtype == "i32":
                onnx_ops_integer.check_int32_input(onnx_name, array)
                feeds[value.name] = array.astype(np.int32).reshape(value.shape)
                continue
            feeds[value.name] = array.astype(NUMPY_OF[value.dtype]).reshape(value.shape)
        return feeds

    def onnx_outputs(self, results: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Results by graph value name -> results by ONNX output name, in ONNX shapes."""
        named = {}
        for onnx_name, value in self.outputs.items():
            array = np.asarray(results[value.name])
            shape = self.output_shapes.get(onnx_name, value.shape)
            named[onnx_name] = array.reshape(shape) if array.size == int(np.prod(shape)) else array
        return named


def import_onnx(
    model: onnx.ModelProto | str | os.PathLike[str],
    *,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    constants: Mapping[str, np.ndarray] | None = None,
    roll_layers: bool = True,
    validate: bool = True,
) -> tuple[ComputeGraph, OnnxBindings]:
    """Import an ONNX model as a ComputeGraph.

    Args:
        model: a ModelProto or the path of a ``.onnx`` file.
        input_shapes: static shapes for graph inputs with symbolic dimensions.
        constants: graph inputs to bind as compile-time constants (e.g. the ``shape`` input of
            a Reshape), by name.
        roll_layers: roll consecutive identical layers into one ``repeat``
            (``graph/layer_rolling.py``; a ``rolled N layers ...`` line in ``fusions``).
        validate: run :func:`~ipu_stack.graph.onnx_validate.validate_onnx` first (False only
            for a model the caller has just validated itself).

    Returns:
        The graph (outputs set) and its ``OnnxBindings``.

    Raises:
        GraphError: the model is malformed, or uses an operator, attribute or data type
            ipu-stack does not support; the message names the node and its op type.
    """
    proto = _load(model)
    if validate:
        validate_onnx(proto, model, input_shapes)  # checker rules + ours, before anything else
    graph, bindings = Importer(proto, dict(input_shapes or {}), dict(constants or {})).run()
    graph, bindings = scales_folded(graph, bindings)
    graph, bindings = _rewritten(
        attention_biases.fold_attention_biases(graph, bindings.parameters), graph, bindings
    )
    return rolled(graph, bindings) if roll_layers else (graph, bindings)


def scales_folded(graph: ComputeGraph, bindings: OnnxBindings) -> tuple[ComputeGraph, OnnxBindings]:
    """``graph`` with its scalar multiplies folded into GEMM weights where they can be
    (``graph/scale_folding.py``), and ``bindings`` to match."""
    return _rewritten(scale_folding.fold_scalar_scales(graph, bindings.parameters), graph, bindings)


def rolled(graph: ComputeGraph, bindings: OnnxBindings) -> tuple[ComputeGraph, OnnxBindings]:
    """``graph`` with its identical consecutive layers rolled, and ``bindings`` to match."""
    return _rewritten(layer_rolling.roll_layers(graph, bindings.parameters), graph, bindings)


def _rewritten(
    result: Any, graph: ComputeGraph, bindings: OnnxBindings
) -> tuple[ComputeGraph, OnnxBindings]:
    """The graph of a rewrite ``result`` (``graph`` itself when it has no fusion line), and
    ``bindings`` moved onto its values and parameters."""
    if not result.fusions:
        return graph, bindings
    bindings.parameters = result.parameters
    bindings.inputs = {k: result.value_map[v.id] for k, v in bindings.inputs.items()}
    bindings.outputs = {k: result.value_map[v.id] for k, v in bindings.outputs.items()}
    bindings.fusions = [*bindings.fusions, *result.fusions]
    return result.graph, bindings


# -- load and check -----------------------------------------------------------------------------
def _load(model: onnx.ModelProto | str | os.PathLike[str]) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy
    return onnx_external.load_model(model)  # large external weights stay memory-mapped


def describe(node: NodeProto, position: int) -> str:
    """How error messages name an ONNX node."""
    label = repr(node.name) if node.name else f"#{position} (output {node.output[0]!r})"
    return f"ONNX node {label} ({node.op_type})"


def _static_shape(value_info: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    tensor = value_info.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
    return None if any(d < 0 for d in dims) else dims


def _dtype_name(elem_type: int) -> str:
    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"element type {elem_type}"


#: initializers above this many elements are hidden from shape inference (only their type and
#: shape matter there; serialising a large model's weights dominated its import time)
INFERENCE_DATA_LIMIT = 4096


def _infer_shapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with ONNX shape inference's value_info (and output types) added.

    Inference runs on a copy whose large initializers are declared as graph inputs of the
    same type and shape, without their data; small ones (shape tensors) keep their values
    for data propagation.
    """
    light = onnx.ModelProto()
    light.CopyFrom(proto)
    graph = light.graph
    large = [t for t in graph.initializer if int(np.prod(t.dims)) > INFERENCE_DATA_LIMIT]
    if large:
        small = [t for t in graph.initializer if int(np.prod(t.dims)) <= INFERENCE_DATA_LIMIT]
        declared = {i.name for i in graph.input}
        for t in large:
            if t.name not in declared:
                graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type,
                                                                      list(t.dims)))  # fmt: skip
        del graph.initializer[:]
        graph.initializer.extend(small)
    inferred = onnx.shape_inference.infer_shapes(light, data_prop=True)
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(inferred.graph.value_info)
    for out, typed in zip(proto.graph.output, inferred.graph.output, strict=True):
        out.type.CopyFrom(typed.type)
    return proto


def _opset(proto: onnx.ModelProto) -> int:
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    raise GraphError("the ONNX model imports no default-domain (ai.onnx) opset")


class Importer:
    def __init__(
        self,
        proto: onnx.ModelProto,
        input_shapes: dict[str, tuple[int, ...]],
        constants: dict[str, np.ndarray],
    ) -> None:
        self.opset = _opset(proto)
        graph = proto.graph
        initializer_names = {t.name for t in graph.initializer}
        declared = {i.name for i in graph.input}
        for name in [*input_shapes, *constants]:
            if name not in declared:
                raise GraphError(f"{name!r} is not an input of the ONNX graph")
        # Bound constants become initializers, so shape inference sees their values.
        for name, array in constants.items():
            graph.initializer.append(numpy_helper.from_array(np.asarray(array), name))
        kept = [i for i in graph.input if i.name not in constants]
        del graph.input[:]
        graph.input.extend(kept)
        for value_info in graph.input:
            if value_info.name in input_shapes:
                shape = value_info.type.tensor_type.shape
                del shape.dim[:]
                for d in input_shapes[value_info.name]:
                    shape.dim.add().dim_value = int(d)
        try:
            proto = _infer_shapes(proto)
        except Exception as err:  # InferenceError: inconsistent shapes or types
            raise GraphError(f"ONNX shape inference failed: {err}") from None
        self.graph_proto = proto.graph
        self.proto = proto
        self.inputs = {
            i.name: i for i in proto.graph.input if i.name not in initializer_names | set(constants)
        }
        self.index = OnnxIndex(
            list(proto.graph.node), self.opset, frozenset(o.name for o in proto.graph.output)
        )
        for value_info in [*proto.graph.input, *proto.graph.value_info, *proto.graph.output]:
            shape = _static_shape(value_info)
            if shape is not None:
                self.index.shapes[value_info.name] = shape
        self.elem_types = {
            vi.name: vi.type.tensor_type.elem_type
            for vi in [*proto.graph.input, *proto.graph.value_info, *proto.graph.output]
        }
        self.index.elem_types = self.elem_types
        for tensor in proto.graph.initializer:
            self.index.constants[tensor.name] = onnx_external.tensor_array(tensor)
        self.fold_failures: dict[int, str] = {}
        self.graph = ComputeGraph()
        self.bindings = OnnxBindings(opset=self.opset)
        self.env: dict[str, Value] = {}
        self.params: dict[tuple[str, str], Value] = {}
        self.taken: set[str] = set()
        self.mask_cache: dict[tuple[str, str], Value] = {}  # additive forms of boolean masks

    # -- driver ---------------------------------------------------------------------------------
    def run(self) -> tuple[ComputeGraph, OnnxBindings]:
        self._check_order()
        self._fold()
        for _ in range(3):  # folded constants give shapes, which give more folding
            if not self._reinfer():
                break
            self._fold()
        merged = merge_duplicate_masks(self.index)
        plan = match_fusions(self.index)
        self.bindings.fusions = [*merged, *plan.notes]
        live = self._live(plan.roots)
        failures: list[str] = []
        failed: set[str] = set()  # outputs of failed nodes: their users are not tried
        shared = onnx_ops_exported.shared_bool_masks(self, live)
        for name in [m for m in shared if m in self.inputs]:
            onnx_ops_exported.additive_mask(self, name, shared[name])
        for position in shared_masks_first(self.index, plan.roots, live):
            node = self.index.nodes[position]
            fusion = plan.roots.get(position)
            operands = [*fusion.operands, *node.input[2:3]] if fusion else list(node.input)
            if failed.intersection(operands):
                failed.update(node.output)
                continue
            try:
                self._emit(node, position, fusion, live[position])
                for name in [o for o in node.output if o in shared]:
                    onnx_ops_exported.additive_mask(self, name, shared[name])
            except GraphError as err:
                failures.append(f"{describe(node, position)}: {err}")
                failed.update(node.output)
        if len(failures) == 1:
            raise GraphError(failures[0])
        if failures:
            # one line (the command line prints an error's first): the first few in full
            shown = " | ".join(failures[:MAX_FAILURES_NAMED])
            more = len(failures) - MAX_FAILURES_NAMED
            rest = f" | and {more} more" if more > 0 else ""
            raise GraphError(f"{len(failures)} ONNX nodes cannot be imported: {shown}{rest}")
        self._outputs()
        self.bindings.ignored_inputs = tuple(n for n in self.inputs if n not in self.env)
        self.graph.verify()
        return self.graph, self.bindings

    def _check_order(self) -> None:
        known = set(self.index.constants) | set(self.inputs)
        for position, node in enumerate(self.index.nodes):
            for name in node.input:
                if name and name not in known:
                    raise GraphError(
                        f"{describe(node, position)}: input {name!r} is not a graph input, an "
                        "initializer or the output of an earlier node"
                    )
            known.update(o for o in node.output if o)

    def _fold(self) -> None:
        from onnx.reference import ReferenceEvaluator

        constants, shapes = self.index.constants, self.index.shapes
        for position, node in enumerate(self.index.nodes):
            inputs = [n for n in node.input if n]
            if node.domain not in ("", "ai.onnx") or node.op_type in NONDETERMINISTIC:
                continue
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                   for a in node.attribute):  # fmt: skip
                continue
            if node.op_type in ("Shape", "Size") and inputs and inputs[0] in shapes:
                shape = np.array(shapes[inputs[0]], dtype=np.int64)
                if node.op_type == "Size":
                    constants[node.output[0]] = np.array(int(np.prod(shape)), dtype=np.int64)
                else:
                    start = int(attribute(node, "start", 0))  # type: ignore[call-overload]
                    end = attribute(node, "end", None)
                    constants[node.output[0]] = shape[start : None if end is None else int(end)]  # type: ignore[call-overload]
                continue
            if not all(n in constants for n in inputs):
                continue
            results: Any = None
            try:
                # folded values that overflow or divide by zero are the model's (T5's
                # position buckets take log(0)): no NumPy warnings on the user's terminal
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    results = ReferenceEvaluator(node).run(None, {n: constants[n] for n in inputs})
            except Exception as err:  # the reference raises whatever NumPy raises
                failure = f"{type(err).__name__}: {err}"
                try:  # a NumPy implementation where the reference fails (GatherElements)
                    results = numpy_fold(node, [constants[n] for n in inputs])
                except Exception as fallback_err:
                    failure, results = f"{type(fallback_err).__name__}: {fallback_err}", None
                if results is None:
                    self.fold_failures[position] = failure
                    continue
            for name, result in zip(node.output, results, strict=False):
                if name:
                    constants[name] = np.asarray(result)

    def _reinfer(self) -> bool:
        """Shape inference again with folded tensors as initializers (shapes computed by
        Shape/Expand/ConstantOfShape chains become static); True if a shape was learned."""
        unknown = [
            o
            for n in self.index.nodes
            for o in n.output
            if o and o not in self.index.shapes and o not in self.index.constants
        ]
        if not unknown:  # nothing to learn (most models: skip a second inference)
            return False
        model = onnx.ModelProto()
        model.CopyFrom(self.proto)
        graph = model.graph
        known = {t.name for t in graph.initializer}
        kept = [n for n in graph.node if not all(o in self.index.constants for o in n.output if o)]
        del graph.node[:]
        graph.node.extend(kept)
        del graph.value_info[:]
        for name, array in self.index.constants.items():
            if name not in known and array.dtype != object:
                graph.initializer.append(numpy_helper.from_array(np.asarray(array), name))
        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception:  # inference disagrees with a fold: keep what we have
            return False
        learned = False
        for value_info in [*inferred.graph.value_info, *inferred.graph.output]:
            shape = _static_shape(value_info)
            if shape is not None and value_info.name not in self.index.shapes:
                self.index.shapes[value_info.name] = shape
                self.elem_types.setdefault(value_info.name, value_info.type.tensor_type.elem_type)
                learned = True
        return learned

    def _live(self, roots: dict[int, Fusion]) -> dict[int, set[str]]:
        """Nodes some graph output depends on, with which of their outputs are needed."""
        live: dict[int, set[str]] = {}
        stack = [o.name for o in self.graph_proto.output]
        seen: set[str] = set()
        while stack:
            name = stack.pop()
            if name in seen or name in self.index.constants or name in self.inputs:
                continue
            seen.add(name)
            position = self.index.producer.get(name)
            if position is None:
                raise GraphError(
                    f"graph output {name!r} is not a graph input, an initializer or the output "
                    "of any node"
                )
            first = position not in live
            live.setdefault(position, set()).add(name)
            if first:
                fusion = roots.get(position)
                node = self.index.nodes[position]
                operands = list(node.input)
                if fusion is not None:
                    # A Gemm's C input stays an operand of the fused node.
                    operands = [*fusion.operands, *node.input[2:3]]
                elif node.op_type == "GatherND":  # a Concat of its indices is taken apart
                    operands = onnx_ops_integer.gather_nd_operands(self.index, node)
                stack.extend(n for n in operands if n)
        return live

    # -- values ---------------------------------------------------------------------------------
    def _fresh(self, name: str, suffix: str = "") -> str:
        candidate, n = name, 1
        while candidate + suffix in self.taken:
            n += 1
            candidate = f"{name}#{n}"
        self.taken.add(candidate + suffix)
        return candidate

    def constant(self, name: str) -> np.ndarray | None:
        return self.index.constants.get(name) if name else None

    def value(self, name: str) -> Value:
        """The graph value of an ONNX tensor: computed, a host input, or a constant parameter."""
        if name in self.env:
            return self.env[name]
        const = self.constant(name)
        if const is not None:
            return self.parameter(name, const)
        if name in self.inputs:
            return self._host_input(name)
        raise GraphError(f"tensor {name!r} has no value (internal: not emitted)")

    def _host_input(self, name: str) -> Value:
        info = self.inputs[name]
        elem = info.type.tensor_type.elem_type
        integer = elem in (TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL)
        if integer and "i32" in PRECISIONS:  # token ids: i32 host inputs (issue 11 part B)
            shape = self.index.shapes.get(name)
            if shape is None:
                raise GraphError(_symbolic_shape(name))
            value = self.graph.host_input(self._fresh(name), shape or (1,), "i32")
            self.env[name] = value
            self.bindings.inputs[name] = value
            return value
        if elem not in PRECISION_OF:
            hint = (
                " (an integer input can be bound as a constant)"
                if "int" in _dtype_name(elem)
                else ""
            )
            raise GraphError(
                f"graph input {name!r} is {_dtype_name(elem)}; ipu-stack computes in float16 "
                f"and float32{hint}"
            )
        shape = self.index.shapes.get(name)
        if shape is None:
            raise GraphError(_symbolic_shape(name))
        if 0 in shape:
            raise GraphError(f"graph input {name!r} has an empty dimension: shape {shape}")
        value = self.graph.host_input(self._fresh(name), shape or (1,), PRECISION_OF[elem])
        self.env[name] = value
        self.bindings.inputs[name] = value
        return value

    def parameter(self, name: str, array: np.ndarray, dtype: str | None = None) -> Value:
        """The parameter of ONNX constant ``name`` (one per name and precision)."""
        array = np.asarray(array)
        if dtype is None and array.dtype.kind in "biu" and "i32" in PRECISIONS:
            dtype = "i32"  # booleans and integers (masks, index arithmetic) are i32 0/1
            array = onnx_ops_integer.int32_constant(name, array)
        if dtype is None:
            if array.dtype not in (np.float16, np.float32):
                raise GraphError(
                    f"{name!r} is a {array.dtype} constant used as a tensor; ipu-stack computes "
                    "in float16 and float32"
                )
            dtype = "f16" if array.dtype == np.float16 else "f32"
        key = (name, dtype)
        if key not in self.params:
            self.params[key] = self._new_parameter(name, array, dtype)
        return self.params[key]

    def derived(self, base: str, role: str, array: np.ndarray, like: Value) -> Value:
        """A new constant parameter (a scale, a negated subtrahend...) in ``like``'s precision."""
        if like.dtype == "i32":
            return self._new_parameter(
                f"{base}.{role}", onnx_ops_integer.int32_constant(base, array), "i32"
            )
        return self._new_parameter(f"{base}.{role}", np.asarray(array, np.float64), like.dtype)

    def _new_parameter(self, name: str, array: np.ndarray, dtype: str) -> Value:
        if array.size == 0:
            raise GraphError(f"constant {name!r} is empty (shape {array.shape})")
        numpy_type = np.int32 if dtype == "i32" else NUMPY_OF[dtype]
        data = array.astype(numpy_type, copy=False).reshape(array.shape or (1,))
        value = self.graph.parameter(self._fresh(name), data.shape, dtype)
        self.bindings.parameters[value.name] = data
        return value

    def op_name(self, base: str) -> str:
        return self._fresh(base, ".out")

    def label(self, node: NodeProto) -> str:
        """What the operations of ``node`` are named after: its name, else its first output."""
        return node.name or node.output[0]

    # -- emission -------------------------------------------------------------------------------
    def _emit(
        self, node: NodeProto, position: int, fusion: Fusion | None, needed: set[str]
    ) -> None:
        out, label = node.output[0], self.label(node)
        if isinstance(fusion, GeluFusion):
            x = self.value(fusion.x)
            self.env[out] = self.graph.gelu(x, self.op_name(label), fusion.approximate)
            return
        if isinstance(fusion, NanGuardFusion):
            self.env[out] = self.value(fusion.x)
            return
        if isinstance(fusion, PatchFusion):
            conv = self.index.nodes[fusion.conv]
            self.env[out] = onnx_ops_exported.patch_embedding(self, conv, label, tokens=True)
            return
        if isinstance(fusion, AttentionFusion):
            self.env[out] = onnx_ops.attention_fusion(self, fusion, label)
            return
        if node.domain not in ("", "ai.onnx"):
            raise GraphError(f"operators of domain {node.domain!r} are not supported")
        emitter = EMITTERS.get(node.op_type)
        if emitter is None:
            raise GraphError(self._unsupported_reason(node, position))
        extra = [n for n in node.output[1:] if n in needed]
        if extra and node.op_type not in onnx_ops_exported.MULTI_OUTPUT:
            raise GraphError(
                f"output(s) {', '.join(map(repr, extra))} are not supported; only the first "
                f"output {out!r} of {node.op_type} can be computed"
            )
        gemm = fusion if isinstance(fusion, GemmFusion) else None
        self.env[out] = emitter(self, node, gemm)

    def _unsupported_reason(self, node: NodeProto, position: int) -> str:
        reason = f"op type {node.op_type!r} is not supported"
        if node.op_type == "Erf":
            reason += " (Erf is accepted only inside the GeLU pattern x*0.5*(1+erf(x/sqrt(2))))"
        elif position in self.fold_failures:
            reason += (
                f" (its inputs are constant but folding failed: {self.fold_failures[position]})"
            )
        else:
            unknown = [n for n in node.input if n and n not in self.index.constants]
            if node.op_type in ("Shape", "Size", "Gather", "Concat"):
                reason += (
                    f" at run time (it folds only when its inputs are constant or have static "
                    f"shapes; not known: {', '.join(map(repr, unknown))})"
                )
        return f"{reason}; supported: {', '.join(SUPPORTED_OPS)}"

    def _outputs(self) -> None:
        values = []
        for out in self.graph_proto.output:
            name = out.name
            value = self.env.get(name)
            producer = None if value is None else self.graph.producer(value.id)
            if value is None or producer is None or value in values:
                # An input, a constant or a repeated output still needs its own computed value.
                source = self.value(name)
                value = self.graph.view(source, source.shape, name=self.op_name(name))
            values.append(value)
            self.bindings.outputs[name] = value
            shape = self.index.shapes.get(name)
            if shape is None and name in self.index.constants:
                shape = tuple(self.index.constants[name].shape)
            self.bindings.output_shapes[name] = shape if shape is not None else value.shape
            elem = self.elem_types.get(name)
            if elem is not None and elem in PRECISION_OF and PRECISION_OF[elem] != value.dtype:
                raise GraphError(
                    f"graph output {name!r}: declared {_dtype_name(elem)} but computes "
                    f"{value.dtype}"
                )
        if not values:
            raise GraphError("the ONNX graph has no outputs")
        self.graph.set_outputs(*values)


def _symbolic_shape(name: str) -> str:
    """The error for a graph input without a fixed shape: how to give one, both ways."""
    return (
        f"graph input {name!r} has a symbolic or unknown shape; give it with "
        f"--input-shape {name}=D1,D2,... (Python: input_shapes={{{name!r}: (...)}})"
    )

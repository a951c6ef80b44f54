"""Structural patterns in an ONNX graph that map to one ipu-stack operation.

An exporter writes GeLU as ``x * 0.5 * (1 + erf(x / sqrt(2)))`` and attention as
``softmax(q @ k^T * scale + mask) @ v``, in whichever operand order and association its
tracer happened to produce. ``match_fusions`` finds them by walking producers backward from a
root node, so the importer can emit ``gelu`` and ``flash_attention`` instead of operators the
machine does not have (``Erf``, ``Where``). Every MatMul and Gemm also becomes a ``GemmFusion``
so that a Transpose of its last two axes folds into the gemm's transpose flags.

A match only absorbs a node whose outputs feed nothing outside the pattern and are not graph
outputs, so fusing never duplicates work; anything the pattern does not absorb is emitted on
its own by the importer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from onnx import NodeProto, helper

#: ``|value - expected| <= tolerance * |expected|`` for constants in a pattern (f16 sqrt(2) is
#: 1.4140625, off by 1.3e-4).
CONSTANT_TOLERANCE = 2e-3
#: An additive attention mask entry at or below this blocks the key (exporters use -inf,
#: -1e4, -1e9 or the dtype's lowest value).
MASK_BLOCKED = -1e4


@dataclass(slots=True)
class OnnxIndex:
    """An ONNX graph indexed for matching: producers, consumers, known constants and shapes."""

    nodes: list[NodeProto]
    opset: int
    graph_outputs: frozenset[str]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    elem_types: dict[str, int] = field(default_factory=dict)  # ONNX element type by tensor
    producer: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))

    def __post_init__(self) -> None:
        for index, node in enumerate(self.nodes):
            for name in node.output:
                if name:
                    self.producer[name] = index
            for name in node.input:
                if name:
                    self.consumers[name].append(index)

    def node_of(self, tensor: str, op_type: str | tuple[str, ...]) -> NodeProto | None:
        """The producer of ``tensor`` if it has one of the given op types (default domain)."""
        index = self.producer.get(tensor)
        if index is None:
            return None
        node = self.nodes[index]
        kinds = (op_type,) if isinstance(op_type, str) else op_type
        if node.domain not in ("", "ai.onnx") or node.op_type not in kinds:
            return None
        return node

    def private(self, tensor: str, user: int) -> bool:
        """True if ``tensor`` is consumed only by node ``user`` and is not a graph output."""
        return tensor not in self.graph_outputs and self.consumers.get(tensor, []) == [user]

    def scalar(self, tensor: str) -> float | None:
        """The value of a one-element floating constant, else None."""
        value = self.constants.get(tensor)
        if value is None or value.size != 1 or value.dtype.kind != "f":
            return None
        return float(value.reshape(()))

    def index_of(self, node: NodeProto) -> int:
        return self.producer[node.output[0]]


def attribute(node: NodeProto, name: str, default: object = None) -> object:
    """The value of a node attribute, or ``default``."""
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _close(value: float | None, expected: float) -> bool:
    return value is not None and abs(value - expected) <= CONSTANT_TOLERANCE * abs(expected)


# -- fusions ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GemmFusion:
    """MatMul/Gemm core: ``left @ right`` with transposes folded from Transpose producers."""

    left: str
    right: str
    transpose_left: bool
    transpose_right: bool

    @property
    def operands(self) -> tuple[str, ...]:
        return (self.left, self.right)


@dataclass(frozen=True, slots=True)
class GeluFusion:
    """``x * 0.5 * (1 + erf(x / sqrt(2)))`` (or the tanh form) in any commuted or associated
    form."""

    x: str
    approximate: str = "none"

    @property
    def operands(self) -> tuple[str, ...]:
        return (self.x,)


@dataclass(frozen=True, slots=True)
class AttentionFusion:
    """``softmax(q @ k^T * scale [+ causal mask]) @ v``.

    ``k`` is ``transpose(k_source, k_perm)`` (no transpose when ``k_perm`` is None).
    """

    q: str
    k_source: str
    k_perm: tuple[int, ...] | None
    v: str
    scale: float
    causal: bool
    mask: str | None = None  # a run-time additive mask tensor
    k_view: tuple[int, ...] | None = None  # k_source is viewed as this shape first

    @property
    def operands(self) -> tuple[str, ...]:
        return (self.q, self.k_source, self.v, *([self.mask] if self.mask else []))


@dataclass(frozen=True, slots=True)
class NanGuardFusion:
    """``Where(IsNaN(p), 0, p)`` of a softmax output p: p itself."""

    x: str

    @property
    def operands(self) -> tuple[str, ...]:
        return (self.x,)


@dataclass(frozen=True, slots=True)
class PatchFusion:
    """Patch-embedding ``Conv`` -> ``Reshape``/``Flatten`` to ``[B, O, P]`` ->
    ``Transpose(0, 2, 1)``: the tokens ``[B, P, O]`` straight from one GEMM."""

    x: str
    conv: int  # node index of the Conv

    @property
    def operands(self) -> tuple[str, ...]:
        return (self.x,)


Fusion = GemmFusion | GeluFusion | AttentionFusion | NanGuardFusion | PatchFusion


@dataclass(slots=True)
class FusionPlan:
    """The fusion rooted at each node index, and every node a fusion absorbed."""

    roots: dict[int, Fusion] = field(default_factory=dict)
    absorbed: set[int] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)


def match_fusions(index: OnnxIndex) -> FusionPlan:
    """Find GeLU, attention and transpose-folding patterns, latest root first.

    Walking in reverse order lets the largest pattern claim its nodes before a smaller pattern
    inside it (the attention's QK MatMul) is tried as a root of its own.
    """
    plan = FusionPlan()
    for position in range(len(index.nodes) - 1, -1, -1):
        if position in plan.absorbed:
            continue
        node = index.nodes[position]
        if node.domain not in ("", "ai.onnx"):
            continue
        matched: tuple[Fusion, list[int]] | None = None
        if node.op_type == "MatMul":
            matched = _match_attention(index, position)
            if matched is None:
                matched = (_gemm(index, node.input[0], node.input[1], False, False), [])
        elif node.op_type == "Gemm":
            trans_a = bool(attribute(node, "transA", 0))
            trans_b = bool(attribute(node, "transB", 0))
            matched = (_gemm(index, node.input[0], node.input[1], trans_a, trans_b), [])
        elif node.op_type == "Mul":
            matched = _match_gelu(index, position)
        elif node.op_type == "Where":
            matched = match_nan_guard(index, position)
        elif node.op_type == "Transpose":
            matched = match_patch_tokens(index, position)
        if matched is None:
            continue
        fusion, absorbed = matched
        plan.roots[position] = fusion
        plan.absorbed.update(absorbed)
        if absorbed:
            names = ", ".join(index.nodes[i].name or index.nodes[i].output[0] for i in absorbed)
            plan.notes.append(
                f"{type(fusion).__name__} at {node.name or node.output[0]!r} absorbs [{names}]"
            )
    return plan


# -- gemm: fold Transpose of the last two axes -------------------------------------------------
def _swap_last_two(perm: tuple[int, ...]) -> bool:
    rank = len(perm)
    return rank >= 2 and perm == (*range(rank - 2), rank - 1, rank - 2)


def transpose_perm(index: OnnxIndex, node: NodeProto) -> tuple[int, ...] | None:
    """The permutation of a Transpose node, when its input rank is known."""
    perm = attribute(node, "perm")
    if perm is not None:
        return tuple(int(p) for p in perm)  # type: ignore[attr-defined]
    shape = index.shapes.get(node.input[0])
    return None if shape is None else tuple(reversed(range(len(shape))))


def _gemm(index: OnnxIndex, left: str, right: str, trans_l: bool, trans_r: bool) -> GemmFusion:
    operands = []
    for name, flag in ((left, trans_l), (right, trans_r)):
        node = index.node_of(name, "Transpose")
        perm = transpose_perm(index, node) if node is not None else None
        if node is not None and perm is not None and _swap_last_two(perm):
            operands.append((node.input[0], not flag))
        else:
            operands.append((name, flag))
    (lname, lflag), (rname, rflag) = operands
    return GemmFusion(lname, rname, lflag, rflag)


# -- GeLU ---------------------------------------------------------------------------------------
def _product(index: OnnxIndex, tensor: str, user: int | None) -> tuple[list[str], float, list[int]]:
    """Flatten a tree of Mul (and Div by a constant) into (factors, constant product, nodes)."""
    position = index.producer.get(tensor)
    node = None if position is None else index.nodes[position]
    expandable = (
        node is not None and node.op_type in ("Mul", "Div") and node.domain in ("", "ai.onnx")
    )
    if expandable and user is not None:
        expandable = index.private(tensor, user)
    if not expandable or node is None or position is None:
        constant = index.scalar(tensor)
        return ([], constant, []) if constant is not None else ([tensor], 1.0, [])
    a, b = node.input[0], node.input[1]
    if node.op_type == "Div":
        divisor = index.scalar(b)
        if divisor is None or divisor == 0.0:
            return [tensor], 1.0, []
        factors, constant, nodes = _product(index, a, position)
        return factors, constant / divisor, [*nodes, position]
    fa, ca, na = _product(index, a, position)
    fb, cb, nb = _product(index, b, position)
    return fa + fb, ca * cb, [*na, *nb, position]


def _erf_term(index: OnnxIndex, tensor: str, user: int) -> tuple[str, list[int]] | None:
    """Match ``1 + erf(x / sqrt(2))``; returns x and the nodes."""
    add = index.node_of(tensor, "Add")
    if add is None or not index.private(tensor, user):
        return None
    add_pos = index.index_of(add)
    for erf_in, one in ((add.input[0], add.input[1]), (add.input[1], add.input[0])):
        erf = index.node_of(erf_in, "Erf")
        if erf is None or not _close(index.scalar(one), 1.0) or not index.private(erf_in, add_pos):
            continue
        erf_pos = index.index_of(erf)
        arg = erf.input[0]
        scaled = index.node_of(arg, ("Div", "Mul"))
        if scaled is None or not index.private(arg, erf_pos):
            continue
        scaled_pos = index.index_of(scaled)
        if scaled.op_type == "Div" and _close(index.scalar(scaled.input[1]), float(np.sqrt(2.0))):
            return scaled.input[0], [scaled_pos, erf_pos, add_pos]
        if scaled.op_type == "Mul":
            for x, c in ((scaled.input[0], scaled.input[1]), (scaled.input[1], scaled.input[0])):
                if _close(index.scalar(c), float(np.sqrt(0.5))):
                    return x, [scaled_pos, erf_pos, add_pos]
    return None


def _match_gelu(index: OnnxIndex, root: int) -> tuple[Fusion, list[int]] | None:
    node = index.nodes[root]
    fa, ca, na = _product(index, node.input[0], root)
    fb, cb, nb = _product(index, node.input[1], root)
    factors, constant, nodes = fa + fb, ca * cb, [*na, *nb]
    if len(factors) != 2 or not _close(constant, 0.5):
        return None
    for x, term in ((factors[0], factors[1]), (factors[1], factors[0])):
        producer = index.producer.get(term)
        users = [i for i in [*nodes, root] if term in index.nodes[i].input]
        if producer is None or len(users) != 1:
            continue
        erf = _erf_term(index, term, users[0])
        if erf is not None and erf[0] == x:
            return GeluFusion(x), [*nodes, *erf[1]]
        tanh = tanh_term(index, term, users[0])
        if tanh is not None and tanh[0] == x:
            return GeluFusion(x, "tanh"), [*nodes, *tanh[1]]
    return None


# -- attention ----------------------------------------------------------------------------------
def softmax_is_last_axis(node: NodeProto, rank: int, opset: int) -> bool:
    """Whether a Softmax node normalises exactly the last axis (opset < 13 flattens [axis:])."""
    axis = int(attribute(node, "axis", -1 if opset >= 13 else 1))  # type: ignore[call-overload]
    return axis % rank == rank - 1 if -rank <= axis < rank else False


def causal_from_bias(bias: np.ndarray, tq: int, tk: int) -> bool | None:
    """Classify an additive attention bias over (..., tq, tk).

    Returns:
        False when the bias is all zeros, True when it blocks exactly the keys after each
        query (bottom-right aligned, as ``flash_attention(causal=True)``), else None.
    """
    bias = np.asarray(bias, dtype=np.float64)
    bias = bias.reshape((1,) * max(0, 2 - bias.ndim) + bias.shape)
    planes = bias.reshape(-1, *bias.shape[-2:])
    if not np.all(planes == planes[:1]):
        return None
    try:
        plane = np.broadcast_to(planes[0], (tq, tk))
    except ValueError:
        return None
    open_ = plane == 0.0
    blocked = plane <= MASK_BLOCKED
    if not np.all(open_ | blocked):
        return None
    if np.all(open_):
        return False
    expected = np.triu(np.ones((tq, tk), dtype=bool), k=1 + tk - tq)
    return True if np.array_equal(blocked, expected) else None


def _strip_scale(index: OnnxIndex, tensor: str, user: int) -> tuple[str, float, list[int]]:
    """``t * c``, ``c * t`` or ``t / c`` with a scalar constant: (t, c, [node])."""
    node = index.node_of(tensor, ("Mul", "Div"))
    if node is None or not index.private(tensor, user):
        return tensor, 1.0, []
    position = index.index_of(node)
    if node.op_type == "Div":
        c = index.scalar(node.input[1])
        if c is not None and c != 0.0 and index.scalar(node.input[0]) is None:
            return node.input[0], 1.0 / c, [position]
        return tensor, 1.0, []
    for t, c_name in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
        c = index.scalar(c_name)
        if c is not None and index.scalar(t) is None:
            return t, c, [position]
    return tensor, 1.0, []


@dataclass(frozen=True, slots=True)
class RuntimeMask:
    """An additive attention mask computed at run time (the tensor's name)."""

    name: str


def _scores_side(index: OnnxIndex, tensor: str) -> bool:
    """Whether ``tensor`` is a MatMul result, possibly scaled by scalar constants (the
    attention scores side of an Add, not a run-time mask such as ``(1 - m) * -1e4``)."""
    for _ in range(4):
        node = index.node_of(tensor, ("MatMul", "Mul", "Div"))
        if node is None:
            return False
        if node.op_type == "MatMul":
            return True
        scalars = [index.scalar(n) is not None for n in node.input[:2]]
        if scalars == [False, True]:
            tensor = node.input[0]
        elif scalars == [True, False] and node.op_type == "Mul":
            tensor = node.input[1]
        else:
            return False
    return False


def _mask(
    index: OnnxIndex, tensor: str, user: int
) -> tuple[str, np.ndarray | RuntimeMask | None, list[int]]:
    """Peel an additive (Add) or selecting (Where) constant mask: (scores, bias, nodes)."""
    if not index.private(tensor, user):
        return tensor, None, []
    add = index.node_of(tensor, "Add")
    if add is not None:
        for s, m in ((add.input[0], add.input[1]), (add.input[1], add.input[0])):
            if m in index.constants and s not in index.constants:
                return s, index.constants[m], [index.index_of(add)]
        first = _scores_side(index, add.input[0]) or not _scores_side(index, add.input[1])
        s, m = (add.input[0], add.input[1]) if first else (add.input[1], add.input[0])
        return s, RuntimeMask(m), [index.index_of(add)]
    where = index.node_of(tensor, "Where")
    if where is not None:
        cond = index.constants.get(where.input[0])
        if cond is None:
            return tensor, None, []
        a, b = where.input[1], where.input[2]
        for s, fill, keep_when in ((a, b, True), (b, a, False)):
            fill_value = index.scalar(fill)
            if fill_value is None or s in index.constants or fill_value > MASK_BLOCKED:
                continue
            keep = cond.astype(bool) if keep_when else ~cond.astype(bool)
            bias = np.where(keep, 0.0, fill_value)
            return s, bias, [index.index_of(where)]
    return tensor, None, []


#: The fused attention kernel holds one head's keys and values whole on every tile that runs
#: its queries (``low/lower_ops.py``, ``lower_attention``). Beyond this many key and value
#: elements per head (a quarter of a tile's 537,808 data bytes at F16; the So400m tower's
#: 729 x (72 + 72) = 104,976 are 210 KB) the pattern is not fused: its MatMuls are planned
#: as GEMMs, whose grids split keys and values over tiles like any operand.
ATTENTION_MAX_KV_ELEMENTS = 537_808 // 4 // 2


def _match_attention(index: OnnxIndex, root: int) -> tuple[Fusion, list[int]] | None:
    final = index.nodes[root]
    probs, v = final.input[0], final.input[1]
    probs, guard_nodes = peel_probabilities(index, probs, root)
    softmax = index.node_of(probs, "Softmax")
    probs_user = guard_nodes[-1] if guard_nodes else root
    guarded = bool(guard_nodes) and set(index.consumers.get(probs, [])) <= set(guard_nodes)
    if softmax is None or not (index.private(probs, probs_user) or guarded):
        return None
    soft_pos = index.index_of(softmax)
    scores_shape = index.shapes.get(softmax.input[0])
    if scores_shape is None or not softmax_is_last_axis(softmax, len(scores_shape), index.opset):
        return None
    scaled, bias, mask_nodes = _mask(index, softmax.input[0], soft_pos)
    scaled_user = mask_nodes[0] if mask_nodes else soft_pos
    qk, scale, scale_nodes = _strip_scale(index, scaled, scaled_user)
    qk_node = index.node_of(qk, "MatMul")
    qk_user = scale_nodes[0] if scale_nodes else scaled_user
    if qk_node is None or not index.private(qk, qk_user):
        return None
    qk_pos = index.index_of(qk_node)
    q, q_scale, q_nodes = _strip_scale(index, qk_node.input[0], qk_pos)
    kt, k_scale, k_nodes = _strip_scale(index, qk_node.input[1], qk_pos)
    scale *= q_scale * k_scale
    # k^T is either a Transpose we can compose into one permutation of its input, or a tensor
    # we transpose back with the last two axes swapped.
    k_source, k_perm, k_transpose = kt, None, list[int]()
    k_view: tuple[int, ...] | None = None
    kt_shape = index.shapes.get(kt)
    if kt_shape is None:
        return None
    rank = len(kt_shape)
    swap = (*range(rank - 2), rank - 1, rank - 2)
    transpose = index.node_of(kt, "Transpose")
    perm = transpose_perm(index, transpose) if transpose is not None else None
    reshaped = swapped_by_reshapes(index, kt, k_nodes[0] if k_nodes else qk_pos)
    if reshaped is not None:
        k_source, k_transpose, k_view = reshaped
    elif (
        transpose is not None
        and perm is not None
        and index.private(kt, k_nodes[0] if k_nodes else qk_pos)
    ):
        composed = tuple(perm[i] for i in swap)
        k_source = transpose.input[0]
        k_perm = None if composed == tuple(range(rank)) else composed
        k_transpose = [index.index_of(transpose)]
    else:
        k_perm = swap
    q_shape, v_shape, src_shape = (index.shapes.get(n) for n in (q, v, k_source))
    src_shape = k_view or src_shape
    if q_shape is None or v_shape is None or src_shape is None:
        return None
    k_shape = src_shape if k_perm is None else tuple(src_shape[p] for p in k_perm)
    if not (len(q_shape) == len(k_shape) == len(v_shape) >= 2):
        return None
    if q_shape[:-2] != k_shape[:-2] or k_shape[:-2] != v_shape[:-2]:
        return None
    if q_shape[-1] != k_shape[-1] or k_shape[-2] != v_shape[-2]:
        return None
    if k_shape[-2] * (k_shape[-1] + v_shape[-1]) > ATTENTION_MAX_KV_ELEMENTS:
        return None  # kept as MatMul / Softmax / MatMul: GEMM plans that split the keys
    causal = False
    mask = bias.name if isinstance(bias, RuntimeMask) else None
    if mask is not None:
        mask_shape, scores_shape = index.shapes.get(mask), index.shapes.get(qk)
        try:
            if (
                mask_shape is None
                or scores_shape is None
                or (np.broadcast_shapes(mask_shape, scores_shape) != scores_shape)
            ):
                return None
        except ValueError:
            return None
    elif isinstance(bias, np.ndarray):
        scores_shape = index.shapes.get(qk)
        try:
            if (
                scores_shape is None
                or np.broadcast_shapes(bias.shape, scores_shape) != scores_shape
            ):
                return None
        except ValueError:
            return None
        classified = causal_from_bias(bias, q_shape[-2], k_shape[-2])
        if classified is None:
            return None
        causal = classified
    fusion = AttentionFusion(q, k_source, k_perm, v, float(scale), causal, mask, k_view)
    absorbed = [soft_pos, *mask_nodes, *scale_nodes, qk_pos, *q_nodes, *k_nodes, *k_transpose,
                *guard_nodes]  # fmt: skip
    return fusion, absorbed


from ipu_stack.graph.onnx_patterns_exported import (  # noqa: E402  (they use the helpers above)
    match_nan_guard,
    match_patch_tokens,
    peel_probabilities,
    swapped_by_reshapes,
    tanh_term,
)

"""Pattern pieces torch's exporters add around GeLU and attention (used by ``onnx_patterns``).

- tanh GeLU ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` with the cube as
  ``Pow(x, 3)`` (dynamo) or ``x * x * x`` (legacy), in any operand order and association;
- the softmax NaN guard of SDPA, ``Where(IsNaN(p), 0, p)``, and identity ``Cast`` round trips
  between the softmax and the second attention MatMul;
- ``K^T`` written as ``Reshape -> Transpose(0, 2, 1) -> Reshape`` over merged leading axes.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ipu_stack.graph.onnx_patterns import (
    NanGuardFusion,
    OnnxIndex,
    PatchFusion,
    _close,
    _product,
    attribute,
    transpose_perm,
)

GELU_TANH_SCALE = float(np.sqrt(2.0 / np.pi))
GELU_TANH_CUBIC = 0.044715


def _cube_factors(index: OnnxIndex, factors: list[str], user: int) -> tuple[str, list[int]] | None:
    """``factors`` multiply to ``x**3`` (``Pow(x, 3)``, ``x * Pow(x, 2)``, ``x * x * x``)."""
    counts: dict[str, int] = {}
    nodes: list[int] = []
    for f in factors:
        power = index.node_of(f, "Pow")
        exponent = index.scalar(power.input[1]) if power is not None else None
        users = [i for i in index.consumers.get(f, [])]
        if power is not None and exponent in (2.0, 3.0) and len(users) == 1:
            if f in index.graph_outputs:
                return None
            counts[power.input[0]] = counts.get(power.input[0], 0) + int(exponent)
            nodes.append(index.index_of(power))
        else:
            counts[f] = counts.get(f, 0) + 1
    if len(counts) != 1 or next(iter(counts.values())) != 3:
        return None
    return next(iter(counts)), nodes


def _inner(index: OnnxIndex, tensor: str, user: int) -> tuple[str, list[int]] | None:
    """Match ``c * (x + 0.044715 * x^3)`` with c = sqrt(2/pi); returns x and the nodes."""
    factors, constant, nodes = _product(index, tensor, user)
    if len(factors) != 1 or not _close(constant, GELU_TANH_SCALE):
        return None
    add = index.node_of(factors[0], "Add")
    add_user = nodes[-1] if nodes else user
    if add is None or not index.private(factors[0], add_user):
        return None
    add_pos = index.index_of(add)
    for x, cubic in ((add.input[0], add.input[1]), (add.input[1], add.input[0])):
        c_factors, c_constant, c_nodes = _product(index, cubic, add_pos)
        if not c_nodes or not _close(c_constant, GELU_TANH_CUBIC):
            continue
        cube = _cube_factors(index, c_factors, c_nodes[-1])
        if cube is not None and cube[0] == x:
            return x, [*nodes, add_pos, *c_nodes, *cube[1]]
    return None


def tanh_term(index: OnnxIndex, tensor: str, user: int) -> tuple[str, list[int]] | None:
    """Match ``1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))``; returns x and the nodes."""
    add = index.node_of(tensor, "Add")
    if add is None or not index.private(tensor, user):
        return None
    add_pos = index.index_of(add)
    for t, one in ((add.input[0], add.input[1]), (add.input[1], add.input[0])):
        tanh = index.node_of(t, "Tanh")
        if tanh is None or not _close(index.scalar(one), 1.0) or not index.private(t, add_pos):
            continue
        tanh_pos = index.index_of(tanh)
        inner = _inner(index, tanh.input[0], tanh_pos)
        if inner is not None:
            return inner[0], [*inner[1], tanh_pos, add_pos]
    return None


def match_nan_guard(index: OnnxIndex, root: int) -> tuple[NanGuardFusion, list[int]] | None:
    """``Where(IsNaN(p), 0, p)`` rooted at the Where, p a Softmax output."""
    where = index.nodes[root]
    if len(where.input) != 3:
        return None
    cond, zero, p = where.input
    isnan = index.node_of(cond, "IsNaN")
    if isnan is None or isnan.input[0] != p or index.scalar(zero) != 0.0:
        return None
    if index.node_of(p, "Softmax") is None or not index.private(cond, root):
        return None
    return NanGuardFusion(p), [index.index_of(isnan)]


def peel_probabilities(index: OnnxIndex, probs: str, user: int) -> tuple[str, list[int]]:
    """Strip a NaN guard and identity Casts between a softmax and its consumer ``user``."""
    nodes: list[int] = []
    while True:
        where = index.node_of(probs, "Where")
        if where is not None and index.private(probs, user):
            guard = match_nan_guard(index, index.index_of(where))
            p = where.input[2]
            isnan_pos = guard[1][0] if guard is not None else -1
            if (
                guard is not None
                and sorted(index.consumers.get(p, [])) == sorted([isnan_pos, index.index_of(where)])
                and p not in index.graph_outputs
            ):
                nodes += [index.index_of(where), isnan_pos]
                probs, user = p, isnan_pos
                continue
        cast = index.node_of(probs, "Cast")
        if cast is not None and index.private(probs, user):
            source = cast.input[0]
            source_type = index.elem_types.get(source)
            if source_type is not None and attribute(cast, "to") == source_type:
                nodes.append(index.index_of(cast))
                probs, user = source, index.index_of(cast)
                continue
        return probs, nodes


def swapped_by_reshapes(
    index: OnnxIndex, kt: str, user: int
) -> tuple[str, list[int], tuple[int, ...] | None] | None:
    """``Reshape(Transpose(Reshape(k), (0, 2, 1)))`` that equals ``k`` with its last two axes
    swapped (leading axes merged and restored): returns k, the three nodes and None. Without
    the inner Reshape (the transposed tensor is K with merged leading axes already), returns
    that tensor, the two nodes and the shape to view it as."""
    outer = index.node_of(kt, "Reshape")
    if outer is None or not index.private(kt, user):
        return None
    outer_pos = index.index_of(outer)
    transpose = index.node_of(outer.input[0], "Transpose")
    if transpose is None or not index.private(outer.input[0], outer_pos):
        return None
    t_pos = index.index_of(transpose)
    perm, out = transpose_perm(index, transpose), index.shapes.get(kt)
    merged_k = index.shapes.get(transpose.input[0])
    inner = index.node_of(transpose.input[0], "Reshape")
    if inner is None or not index.private(transpose.input[0], t_pos):
        if perm != (0, 2, 1) or out is None or merged_k is None or len(out) < 3:
            return None
        view = (*out[:-2], out[-1], out[-2])
        if len(merged_k) != 3 or merged_k != (int(np.prod(out[:-2])), *view[-2:]):
            return None
        return transpose.input[0], [outer_pos, t_pos], view
    k = inner.input[0]
    k_shape, mid, out = (index.shapes.get(n) for n in (k, transpose.input[0], kt))
    perm = transpose_perm(index, transpose)
    if k_shape is None or mid is None or out is None or len(k_shape) < 2:
        return None
    merged = (int(np.prod(k_shape[:-2])), *k_shape[-2:])
    if perm != (0, 2, 1) or tuple(mid) != merged:
        return None
    if tuple(out) != (*k_shape[:-2], k_shape[-1], k_shape[-2]):
        return None
    return k, [outer_pos, t_pos, index.index_of(inner)], None


def _only_live_user(index: OnnxIndex, tensor: str, user: int) -> bool:
    """``private`` ignoring consumers that fold to constants (a Shape of a static tensor)."""
    if tensor in index.graph_outputs:
        return False
    users = [
        i
        for i in index.consumers.get(tensor, [])
        if not all(o in index.constants for o in index.nodes[i].output if o)
    ]
    return users == [user]


def match_patch_tokens(index: OnnxIndex, root: int) -> tuple[PatchFusion, list[int]] | None:
    """``Transpose(0, 2, 1)`` of a ``[B, O, P]`` Reshape/Flatten of a Conv ``[B, O, Ph, Pw]``."""
    transpose = index.nodes[root]
    if transpose_perm(index, transpose) != (0, 2, 1):
        return None
    flat = index.node_of(transpose.input[0], ("Reshape", "Flatten"))
    if flat is None or not _only_live_user(index, transpose.input[0], root):
        return None
    flat_pos = index.index_of(flat)
    conv = index.node_of(flat.input[0], "Conv")
    if conv is None or not _only_live_user(index, flat.input[0], flat_pos):
        return None
    conv_shape, flat_shape = index.shapes.get(flat.input[0]), index.shapes.get(flat.output[0])
    if conv_shape is None or flat_shape is None or len(conv_shape) != 4:
        return None
    b, o, ph, pw = conv_shape
    if tuple(flat_shape) != (b, o, ph * pw):
        return None
    conv_pos = index.index_of(conv)
    return PatchFusion(conv.input[0], conv_pos), [flat_pos, conv_pos]


def shared_masks_first(
    index: OnnxIndex, roots: Mapping[int, object], live: Mapping[int, object]
) -> list[int]:
    """The live node positions in emission order: ONNX order, except that the producer of a
    run-time attention mask read by several fused attentions moves up to just after the
    producers of its inputs. A dynamo export computes BERT's padding mask once, in the middle
    of layer 0; emitted there it would tie layer 0 to the later layers and keep them from
    rolling into one loop (the legacy exporter recomputes it in every layer)."""
    from ipu_stack.graph.onnx_patterns import AttentionFusion

    readers: dict[str, int] = {}
    for fusion in roots.values():
        if isinstance(fusion, AttentionFusion) and fusion.mask:
            readers[fusion.mask] = readers.get(fusion.mask, 0) + 1
    order = sorted(live)
    for mask in (m for m, count in readers.items() if count > 1):
        position = index.producer.get(mask)
        if position is None or position not in live or position in roots:
            continue
        node = index.nodes[position]
        sources = [index.producer[i] for i in node.input if i in index.producer]
        earliest = max((order.index(p) for p in sources if p in live), default=-1) + 1
        order.remove(position)
        order.insert(earliest, position)
    return order


def merge_duplicate_masks(index: OnnxIndex) -> list[str]:
    """Let every reader of a repeated mask builder ``Where(cond, c1, c2)`` (scalar constants
    ``c1``, ``c2``; the legacy exporter writes one per layer from the same condition) read the
    first one instead; the others become dead. Returns one note per merged node."""
    first: dict[tuple[object, ...], str] = {}
    notes = []
    for node in index.nodes:
        if node.op_type != "Where" or node.domain not in ("", "ai.onnx") or len(node.input) != 3:
            continue
        cond, a, b = node.input
        ca, cb = index.constants.get(a), index.constants.get(b)
        if cond in index.constants or ca is None or cb is None or ca.size != 1 or cb.size != 1:
            continue
        key = (cond, ca.dtype.str, ca.shape, ca.tobytes(), cb.dtype.str, cb.shape, cb.tobytes())
        out = node.output[0]
        kept = first.setdefault(key, out)
        if kept == out or out in index.graph_outputs:
            continue
        for user in index.consumers.pop(out, []):
            reader = index.nodes[user]
            for i, name in enumerate(reader.input):
                if name == out:
                    reader.input[i] = kept
            index.consumers[kept].append(user)
        notes.append(f"mask {node.name or out!r} is the same as {kept!r}: read once")
    return notes

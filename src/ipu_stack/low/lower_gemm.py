"""Lower one planned gemm to tile buffers, kernel calls, transfers and shards.

Tile ``t = ((bi * pr + ri) * pc + ci) * pk + ki`` computes output batches ``bi``, rows ``ri``,
columns ``ci`` over the K part ``ki``. Per K step it needs a left block (rows x K-step) and a
right block (K-step x columns) per distinct operand batch entry. How a block reaches the tile
depends on the operand's mode (see :class:`~ipu_stack.mid.gemm_plan.GemmPlan`):

* resident: the host writes the whole block into the tile's work buffer before the run;
* distributed: the block is cut by storage rows into one chunk per tile sharing it; the host
  writes chunk j onto member j, which multicasts it to the other members before the step;
* moved: the block is gathered from the producing operation's shards.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ipu_stack.errors import GraphError
from ipu_stack.graph.compute_graph import ComputeGraph, GemmOp
from ipu_stack.low.gather import GatherRequest, ShardIndex, gather
from ipu_stack.low.makers import (
    make_add,
    make_buffer,
    make_gemm,
    make_shard,
    make_transfer,
)
from ipu_stack.low.makers import ref as make_ref
from ipu_stack.low.program import (
    Buffer,
    CopyCall,
    FillCall,
    KernelCall,
    LogicalTransfer,
    ProgramBuilder,
    Ref,
    Shard,
)
from ipu_stack.mid.gemm_plan import GemmPlan
from ipu_stack.target import ipu21
from ipu_stack.target.ipu21 import GEMM_OUTPUT_PRECISION, Precision
from ipu_stack.target.ipu21 import precision as lookup_precision

ALIGN = ipu21.AMP_OPERAND_ALIGNMENT


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


#: batches of matrices with fewer rows than this are folded (see :func:`folded_shapes`): the
#: fold is for many short matrices (729 one-row products of a sequence-first MAP head); a few
#: tall ones plan as well batched (batch-4 SigLIP MLP: 614,411 vs 608,546 estimated cycles)
#: and their folded moved operand, cut at rows that cross matrices, took 5x the build time
FOLD_BELOW_ROWS = 64


def folded_shapes(
    left: tuple[int, ...], right: tuple[int, ...], out: tuple[int, ...], transpose_left: bool
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Operand and output shapes as planned: a batched left operand of short matrices
    (``m < FOLD_BELOW_ROWS``) times one shared right matrix is one GEMM with the batch folded
    into its rows (``[B, m, k] x [k, n]`` is ``[B m, k] x [k, n]``: the same flat rows), not
    ``B`` GEMMs of ``m`` rows each."""
    batch = int(np.prod(out[:-2], dtype=np.int64)) if out[:-2] else 1
    shared = int(np.prod(right[:-2], dtype=np.int64)) if right[:-2] else 1
    if batch == 1 or shared != 1 or transpose_left or out[-2] >= FOLD_BELOW_ROWS:
        return left, right, out
    rows = batch * out[-2]
    return (rows, left[-1]), right[-2:], (rows, out[-1])


def batch_map(operand_shape: tuple[int, ...], out_batch: tuple[int, ...]) -> np.ndarray:
    """For each flattened output batch index, the operand's flattened batch index."""
    own = operand_shape[:-2]
    count = int(np.prod(own, dtype=np.int64)) if own else 1
    ids = np.arange(count).reshape(own) if own else np.array(0)
    return np.broadcast_to(ids, out_batch).reshape(-1)


@dataclass(slots=True)
class _Block:
    """One operand block a tile needs for one K step, in kernel orientation."""

    tile: int
    ref: Ref  # where the kernel reads it
    vbatch: int
    krows: tuple[int, int]  # kernel-orientation storage rows (value range)
    kcols: tuple[int, int]  # kernel-orientation storage cols (value range)
    storage_rows: int  # padded
    storage_cols: int  # padded
    transposed: bool  # value stored transposed relative to kernel orientation
    row_base: int = 0  # flat row of the value where this batch entry starts


@dataclass(slots=True)
class GemmLowering:
    """Accumulates what one gemm contributes to the program."""

    builder: ProgramBuilder
    bindings: dict[int, list[Shard]] = field(default_factory=lambda: defaultdict(list))


def _block_bytes(role: str, rows: int, kp: int, cpad: int, eb: int) -> int:
    return (rows * kp if role == "left" else kp * cpad) * eb


def _block_shard(block: _Block, row_lo: int, row_hi: int, eb: int) -> Shard | None:
    """The shard of value elements stored in kernel-storage rows [row_lo, row_hi) of a block."""
    real_hi = min(row_hi, block.krows[1] - block.krows[0])
    if real_hi <= row_lo:
        return None
    rows = (block.krows[0] + row_lo, block.krows[0] + real_hi)
    row_stride = block.storage_cols * eb
    ref = block.ref.at(row_lo * row_stride)
    base = block.row_base
    if block.transposed:  # storage rows are value columns
        vrows = (base + block.kcols[0], base + block.kcols[1])
        return make_shard(block.tile, ref, vrows, rows, row_stride, True)
    return make_shard(
        block.tile, ref, (base + rows[0], base + rows[1]), block.kcols, row_stride, False
    )


def lower_gemm(
    graph: ComputeGraph,
    op: GemmOp,
    plan: GemmPlan,
    precision: Precision,
    builder: ProgramBuilder,
    host_shards: dict[int, list[Shard]],
    value_shards: dict[int, list[Shard]],
    tile_offset: int = 0,
    tile_count: int = 0,
    in_loop: bool = False,
    delivered: dict[tuple, str] | None = None,
    prologue: list[KernelCall] | None = None,
) -> list[Shard]:
    """Lower ``op`` under ``plan``; returns the shards of its output value (``in_loop``: a
    loop body's, whose distributed chunks always live in a home: ``GemmProblem.in_loop``).

    The plan's tile ``t`` runs on tile ``(tile_offset + t) % tile_count`` (the weight
    balance of ``place/balance.py``); by default on tile ``t``.

    Host-written shards of host inputs and parameters are appended to ``host_shards``;
    ``value_shards`` holds the shards of values produced by earlier operations.

    ``delivered`` records, per left operand produced on chip and moved in one K step, the
    buffer its blocks were gathered into, keyed by everything that fixes those blocks and their
    tiles (value, shapes, grid, block sizes, tile offset). A later gemm of the same key (the
    Q, K and V projections of one layer-norm output) reads the blocks there: no gather, no
    exchange phase of its own for them. Values never change once computed, and a gemm's
    operand buffer is written only by its own gather, so the blocks are still there.

    ``prologue`` (a loop body's lowering): where the zero fills of padded moved blocks go
    when the GEMM has one K step, to run once before the loop instead of every iteration.
    Each iteration's gather writes the same rows and columns of the block again, never its
    padding, and a buffer touched before a loop lives through the whole loop
    (``place/assign.py``): the zeros stay. With several K steps one buffer takes every
    step's block, and a full block's data would cover the next one's padding.
    """
    eb = precision.element_bytes
    out_precision = lookup_precision(GEMM_OUTPUT_PRECISION[precision.name])
    out_eb = out_precision.element_bytes
    scale = int(op.attr("product_scale_exponent", 0))
    left_v, right_v, out_v = graph.value(op.left), graph.value(op.right), graph.value(op.output)
    left_shape, right_shape, out_shape = folded_shapes(
        left_v.shape, right_v.shape, out_v.shape, op.transpose_left
    )
    out_batch = out_shape[:-2]
    batch = int(np.prod(out_batch, dtype=np.int64)) if out_batch else 1
    m, n = out_shape[-2:]
    k = left_shape[-2] if op.transpose_left else left_shape[-1]
    lmap, rmap = batch_map(left_shape, out_batch), batch_map(right_shape, out_batch)
    for v, flag in ((left_v, op.transpose_left), (right_v, op.transpose_right)):
        if v.kind == "operation" and flag:
            raise GraphError(
                f"{op.name}: a transposed operand produced on chip ({v.name!r}) needs an "
                "on-chip rearrangement, which is not supported yet"
            )
    kmicro, cmicro = precision.k_micro, precision.c_micro
    pb, pr, pc, pk = plan.batch_parts, plan.row_parts, plan.col_parts, plan.k_parts
    name = op.name
    out_name = f"{name}.out"
    kernels_by_step: dict[int, list[KernelCall]] = defaultdict(list)
    copies_by_step: dict[int, list[KernelCall]] = defaultdict(list)
    blocks: dict[int, dict[tuple, list[_Block]]] = defaultdict(lambda: defaultdict(list))
    modes: dict[tuple, str] = {}
    moved_blocks: dict[int, list[tuple[_Block, int]]] = defaultdict(list)
    out_shards: list[Shard] = []
    reduce_groups: list[list[tuple[int, Ref, int, int, int, tuple[int, int], tuple[int, int]]]] = []
    steps_max = 0

    lmap_of, rmap_of = lmap.tolist(), rmap.tolist()
    reuse_key: tuple | None = None
    if delivered is not None and plan.left_mode == "moved" and plan.k_step >= plan.k_block:
        reuse_key = (
            left_v.id, left_shape, tuple(out_batch), op.transpose_left, precision.name,
            pb, plan.batch_block, pr, plan.row_block, pc, pk, plan.k_block, tile_offset,
            tile_count,
        )  # fmt: skip
        reused = delivered.get(reuse_key)
    else:
        reused = None
    pair_columns = plan.left_mode != "resident" and pc % 2 == 0
    for bi in range(pb):
        b0, b1 = bi * plan.batch_block, min(batch, (bi + 1) * plan.batch_block)
        # operand batch slots of this batch part, and each output batch entry's slots
        lslots = list(dict.fromkeys(lmap_of[b0:b1]))
        rslots = list(dict.fromkeys(rmap_of[b0:b1]))
        slot_of = [(b, lslots.index(lmap_of[b]), rslots.index(rmap_of[b])) for b in range(b0, b1)]
        for ri in range(pr):
            r0, r1 = ri * plan.row_block, min(m, (ri + 1) * plan.row_block)
            for ci in range(pc):
                c0, c1 = ci * plan.col_block, min(n, (ci + 1) * plan.col_block)
                cpad = _round_up(c1 - c0, cmicro)
                group = []
                for ki in range(pk):
                    k0, k1 = ki * plan.k_block, min(k, (ki + 1) * plan.k_block)
                    if pair_columns:  # tiles sharing a left block side by side (pairs)
                        tile = ((bi * pr + ri) * pk + ki) * pc + ci
                    else:
                        tile = ((bi * pr + ri) * pc + ci) * pk + ki
                    if tile_offset:
                        tile = (tile_offset + tile) % tile_count
                    rows = r1 - r0
                    ksteps = [(s, min(k1, s + plan.k_step)) for s in range(k0, k1, plan.k_step)]
                    steps_max = max(steps_max, len(ksteps))
                    out_stride = rows * cpad * out_eb
                    out_ref = builder.buffer(
                        make_buffer(tile, out_name, _round_up((b1 - b0) * out_stride, ALIGN),
                                    ALIGN, "interleaved", False, (reused,) if reused else (),
                                    False, False)
                    )  # fmt: skip
                    operand_refs = {}
                    step_base: dict[tuple[str, int], int] = {}
                    for role, v, v_shape, slots, mode, trans in (
                        ("left", left_v, left_shape, lslots, plan.left_mode, op.transpose_left),
                        ("right", right_v, right_shape, rslots, plan.right_mode,
                         op.transpose_right),
                    ):  # fmt: skip
                        # bytes of one operand block per K step (one batch slot)
                        block_bytes = [
                            _block_bytes(role, rows, _round_up(ks[1] - ks[0], kmicro), cpad, eb)
                            for ks in ksteps
                        ]
                        per_step = [len(slots) * b for b in block_bytes]
                        resident = mode == "resident"
                        size = sum(per_step) if resident else max(per_step)
                        if role == "left" and reused is not None:
                            operand_refs[role] = make_ref(reused, 0)  # delivered earlier
                            step_base[(role, 0)] = 0
                            continue
                        operand_refs[role] = builder.buffer(
                            make_buffer(
                                tile,
                                f"{name}.{role}",
                                _round_up(size, ALIGN),
                                ALIGN,
                                "interleaved"
                                if role == "right" and plan.weights == "interleaved"
                                else "any",
                                False,
                                (out_name,) if role == "left" else (),
                                resident,
                                False,
                            )
                        )
                        base = 0
                        for s, ks in enumerate(ksteps):
                            kp = _round_up(ks[1] - ks[0], kmicro)
                            step_base[(role, s)] = base
                            for j, vb in enumerate(slots):
                                ref = operand_refs[role].at(base + j * block_bytes[s])
                                base_row = vb * v_shape[-2]
                                if role == "left":
                                    blk = _Block(
                                        tile, ref, vb, (r0, r1), ks, rows, kp, trans, base_row
                                    )
                                else:
                                    blk = _Block(
                                        tile, ref, vb, ks, (c0, c1), kp, cpad, trans, base_row
                                    )
                                key = (role, vb, blk.krows, blk.kcols)
                                modes[key] = mode
                                if mode == "moved":
                                    moved_blocks[s].append((blk, v.id))
                                else:
                                    blocks[s][key].append(blk)
                            if resident:
                                base += per_step[s]
                    left_buf, left_off = operand_refs["left"]
                    right_buf, right_off = operand_refs["right"]
                    out_buf, out_off = out_ref
                    weights = plan.weights
                    for s, ks in enumerate(ksteps):
                        kp = _round_up(ks[1] - ks[0], kmicro)
                        lbase = left_off + step_base[("left", s)]
                        rbase = right_off + step_base[("right", s)]
                        lbytes, rbytes = rows * kp * eb, kp * cpad * eb
                        kernels_by_step[s].extend(
                            [
                                make_gemm(
                                    tile,
                                    make_ref(out_buf, out_off + (b - b0) * out_stride),
                                    make_ref(left_buf, lbase + lj * lbytes),
                                    make_ref(right_buf, rbase + rj * rbytes),
                                    rows,
                                    kp,
                                    cpad,
                                    precision,
                                    s > 0,
                                    weights,
                                    scale,
                                )
                                for b, lj, rj in slot_of
                            ]
                        )
                    group.append((tile, out_ref, out_stride, b0, b1, (r0, r1), (c0, cpad)))
                reduce_groups.append(group)
                if pk == 1:
                    tile, out_ref, out_stride, b0, b1, rr, _ = group[0]
                    for b in range(b0, b1):
                        out_shards.append(
                            make_shard(
                                tile,
                                out_ref.at((b - b0) * out_stride),
                                (b * m + rr[0], b * m + rr[1]),
                                (c0, c1),
                                cpad * out_eb,
                                False,
                            )
                        )

    if reuse_key is not None and reused is None:
        assert delivered is not None
        delivered[reuse_key] = f"{name}.left"
    # Operand delivery per K step, then the step's kernels.
    home_sizes: dict[int, dict[str, int]] = defaultdict(dict)
    for s in range(steps_max):
        transfers: list[LogicalTransfer] = []
        for key, members in blocks[s].items():
            role, mode = key[0], modes[key]
            if mode == "resident":
                for blk in members:
                    shard = _block_shard(blk, 0, blk.storage_rows, eb)
                    if shard is not None:
                        host_shards[left_v.id if role == "left" else right_v.id].append(shard)
                continue
            vid = left_v.id if role == "left" else right_v.id
            transfers += _distribute(
                members,
                s,
                steps_max > 1 or in_loop,
                eb,
                vid,
                host_shards,
                home_sizes,
                copies_by_step,
                f"{name}.{role}.home",
            )
        fills, moved = _gather_moved(moved_blocks[s], value_shards, eb, name)
        if prologue is not None and steps_max == 1:
            prologue += fills  # once, before the loop: see the docstring
            fills = []
        builder.compute(fills + copies_by_step[s] + moved[0])
        builder.exchange(f"{name} operands step {s}", transfers + moved[1])
        builder.compute(kernels_by_step[s])
    for tile, sizes in home_sizes.items():
        for buf_name, size in sizes.items():
            builder.buffer(
                Buffer(tile, buf_name, _round_up(size, ALIGN), ALIGN, "any", host_written=True)
            )
    if pk > 1:
        out_shards += _reduce(reduce_groups, pk, m, n, out_precision, builder, name)
    return out_shards


def _distribute(
    members: list[_Block],
    step: int,
    via_home: bool,
    eb: int,
    value_id: int,
    host_shards: dict[int, list[Shard]],
    home_sizes: dict[int, dict[str, int]],
    copies_by_step: dict[int, list[KernelCall]],
    home_name: str,
) -> list[LogicalTransfer]:
    """Split a shared block into one chunk per member and multicast each to the others."""
    members = sorted(members, key=lambda b: b.tile)
    first = members[0]
    row_bytes = first.storage_cols * eb
    h = -(-first.storage_rows // len(members))
    out = []
    for j, owner in enumerate(members):
        lo, hi = j * h, min(first.storage_rows, (j + 1) * h)
        if hi <= lo:
            continue
        size = (hi - lo) * row_bytes
        if via_home:
            used = home_sizes[owner.tile].get(home_name, 0)
            home_sizes[owner.tile][home_name] = used + _round_up(size, ALIGN)
            src = Ref(home_name, used)
            copies_by_step[step].append(
                CopyCall(owner.tile, owner.ref.at(lo * row_bytes), src, size)
            )
        else:
            src = owner.ref.at(lo * row_bytes)
        shard = _block_shard(owner, lo, hi, eb)
        if shard is not None:
            host_shards[value_id].append(
                Shard(shard.tile, src, shard.rows, shard.cols, shard.row_stride, shard.transposed)
            )
        dests = tuple((b.tile, b.ref.at(lo * row_bytes)) for b in members if b is not owner)
        if dests:
            out.append(LogicalTransfer(owner.tile, src, dests, size // 4))
    return out


def _gather_moved(
    needs: list[tuple[_Block, int]], value_shards: dict[int, list[Shard]], eb: int, what: str
) -> tuple[list[KernelCall], tuple[list[KernelCall], list[LogicalTransfer]]]:
    """Zero-fills, local copies and transfers that assemble blocks from a producer's shards."""
    fills: list[KernelCall] = []
    by_value: dict[int, list[GatherRequest]] = defaultdict(list)
    for blk, vid in needs:
        if blk.transposed:
            raise GraphError(f"{what}: a transposed operand produced on chip is not supported")
        size = blk.storage_rows * blk.storage_cols * eb
        if (
            blk.krows[1] - blk.krows[0] < blk.storage_rows
            or blk.kcols[1] - blk.kcols[0] < blk.storage_cols
        ):
            fills.append(FillCall(blk.tile, blk.ref, size))
        rows = (blk.row_base + blk.krows[0], blk.row_base + blk.krows[1])
        by_value[vid].append(
            GatherRequest(blk.tile, blk.ref, blk.storage_cols * eb, rows, blk.kcols)
        )
    copies: list[KernelCall] = []
    transfers: list[LogicalTransfer] = []
    for vid, requests in by_value.items():
        c, t = gather(requests, ShardIndex(value_shards[vid]), eb, what)
        copies += c
        transfers += t
    return fills, (copies, transfers)


def _reduce(
    groups: list[list[tuple[int, Ref, int, int, int, tuple[int, int], tuple[int, int]]]],
    pk: int,
    m_rows: int,
    n: int,
    precision: Precision,
    builder: ProgramBuilder,
    name: str,
) -> list[Shard]:
    """Reduce-scatter of K partial products: member q sums row slice q of the group's block."""
    eb = precision.element_bytes
    transfers: list[LogicalTransfer] = []
    adds: list[KernelCall] = []
    shards: list[Shard] = []
    partials = f"{name}.partials"
    for group in groups:
        _tile0, _, out_stride, b0, b1, (r0, r1), (c0, cpad) = group[0]
        rows = r1 - r0
        rs = -(-rows // pk)
        row_bytes = cpad * eb
        for q, (tile, out_ref, _, _, _, _, _) in enumerate(group):
            lo, hi = q * rs, min(rows, (q + 1) * rs)
            if hi <= lo:
                continue
            slice_bytes = (hi - lo) * row_bytes
            words = slice_bytes // 4
            others = [g for p, g in enumerate(group) if p != q]
            recv = builder.buffer(
                make_buffer(tile, partials, _round_up(len(others) * (b1 - b0) * slice_bytes, ALIGN),
                            ALIGN, "any", False, (), False, False)
            )  # fmt: skip
            # the senders' partial slices (tile, buffer, offset of batch entry 0)
            senders = [(o[0], o[1][0], o[1][1] + lo * row_bytes) for o in others]
            recv_buf, recv_off = recv
            nb = b1 - b0
            for j in range(nb):
                inputs = [
                    make_ref(recv_buf, recv_off + (p * nb + j) * slice_bytes)
                    for p in range(len(senders))
                ]
                jo = j * out_stride
                transfers.extend(
                    [
                        make_transfer(o_tile, make_ref(o_buf, o_off + jo), ((tile, dst),), words)
                        for (o_tile, o_buf, o_off), dst in zip(senders, inputs, strict=True)
                    ]
                )
                adds.append(
                    make_add(
                        tile,
                        out_ref.at(j * out_stride + lo * row_bytes),
                        tuple(inputs),
                        (hi - lo) * cpad,
                        precision,
                    )
                )
            for j in range(b1 - b0):
                b = b0 + j
                shards.append(
                    make_shard(
                        tile,
                        out_ref.at(j * out_stride + lo * row_bytes),
                        (b * m_rows + r0 + lo, b * m_rows + r0 + hi),
                        (c0, min(n, c0 + cpad)),
                        row_bytes,
                        False,
                    )
                )
    builder.exchange(f"{name} reduction", transfers)
    builder.compute(adds)
    return shards

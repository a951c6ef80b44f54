"""GEMM planning: enumerate tile grids and block shapes, cost them, keep the cheapest that fit.

A plan splits the (broadcast, flattened) batch axis, the output rows, the output columns and
the inner K axis over a grid of ``pb x pr x pc x pk`` tiles. Each tile multiplies a
``rows x kc`` left block by a ``kc x c`` right block (K padded to the AMP panel depth, columns
to 16) for each of its batch entries. With ``pk > 1`` the K partial products are combined by a
reduce-scatter (an exchange phase plus an add on each tile). The whole space is evaluated at
once with NumPy; there are typically 10^4-10^5 candidates.

Cost model (all per busiest tile, in cycles):
    kernel      = batches x (kernel registry cycles(rows, kc, c) + launch)
    operands    = words to receive for exchanged operands (host inputs are delivered split
                  across the tiles that share a block and multicast between them: a group of
                  g >= 3 tiles needs the whole block time, g == 2 half of it, g == 1 nothing;
                  a left block shared by whole physical pairs of tiles moves as 64-bit items:
                  (g + 1) / 2g of it distributed; a moved block stays costed unpaired)
    reduction   = (pk - 1) x slice words + add kernel
    syncs       = 600 per exchange phase
Parameters (weights) are stored in whatever layout the plan wants, replicated as needed; they
are uploaded before the run and cost nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ipu_stack.errors import PlanError
from ipu_stack.kernels.registry import gemm_cycles_array
from ipu_stack.target import ipu21
from ipu_stack.target.ipu21 import Precision
from ipu_stack.target.op_cycles import reduce_add_cycles

STANDARD_DATA_BYTES = (
    ipu21.INTERLEAVED_BASE - ipu21.STANDARD_DATA_BASE - ipu21.DEFAULT_SUPPORT_RESERVATION_BYTES
)
INTERLEAVED_DATA_BYTES = ipu21.LOADER_LIMIT - ipu21.INTERLEAVED_BASE
ALIGN = ipu21.AMP_OPERAND_ALIGNMENT
# Tolerance for allocator losses (element rounding of exclusive buffers, alignment).
ELEMENT_SLACK = ipu21.INTERLEAVED_ELEMENT_BYTES


@dataclass(frozen=True, slots=True)
class GemmProblem:
    """What the planner needs to know about one gemm, in canonical 3-D form."""

    batch: int  # flattened output batch
    m: int
    k: int
    n: int
    precision: Precision
    left_kind: str  # host_input | parameter | operation
    right_kind: str
    left_batched: bool  # left has the full output batch (else broadcast to it)
    right_batched: bool
    # When set, K is cut exactly at multiples of this many elements: a moved left operand then
    # arrives in whole-row runs from a producer whose column blocks have this width.
    k_align: int | None = None
    # In a loop body: a distributed operand's chunks live in a home buffer (one block per
    # iteration) and are copied into the work buffer each run, even with one K step, so the
    # work buffer is stored once rather than once per iteration.
    in_loop: bool = False


@dataclass(frozen=True, slots=True)
class GemmPlan:
    """One way to run a gemm on the tiles, with its estimated cost.

    ``left_mode`` / ``right_mode`` say where an operand lives: ``resident`` (each tile holds
    its whole block from the start: parameters only), ``distributed`` (the block is split
    over the tiles that share it and multicast between them before each K step), or
    ``moved`` (produced on chip by another operation and moved into place).
    """

    batch_parts: int
    row_parts: int
    col_parts: int
    k_parts: int
    k_steps: int
    batch_block: int
    row_block: int
    col_block: int  # padded to 16
    k_block: int  # per parallel K part, padded to the AMP panel depth
    k_step: int  # per serial step, padded to the AMP panel depth
    weights: str  # interleaved | standard: memory class of the right operand
    left_mode: str
    right_mode: str
    tiles: int
    kernel_cycles: int
    copy_cycles: int
    operand_exchange_cycles: int
    reduction_exchange_cycles: int
    reduction_cycles: int
    exchange_phases: int
    estimated_cycles: int
    peak_bytes: int
    interleaved_bytes: int
    # bytes per tile the host writes before the run (resident blocks, distributed chunks):
    # live from step 0 until the gemm, whatever runs in between
    resident_bytes: int = 0
    resident_interleaved_bytes: int = 0  # the part of them in the interleaved region

    @property
    def exchange_cycles(self) -> int:
        return (
            self.operand_exchange_cycles
            + self.reduction_exchange_cycles
            + self.exchange_phases * ipu21.EXCHANGE_PHASE_OVERHEAD
        )

    def describe(self) -> dict[str, object]:
        return {
            "grid": {
                "batch": self.batch_parts,
                "rows": self.row_parts,
                "cols": self.col_parts,
                "k": self.k_parts,
                "k_steps": self.k_steps,
            },
            "block": {
                "batch": self.batch_block,
                "rows": self.row_block,
                "cols": self.col_block,
                "k": self.k_block,
                "k_step": self.k_step,
            },
            "weights": self.weights,
            "left": self.left_mode,
            "right": self.right_mode,
            "active_tiles": self.tiles,
            "estimated_cycles": self.estimated_cycles,
            "kernel_cycles": self.kernel_cycles,
            "exchange_cycles": self.exchange_cycles,
            "reduction_cycles": self.reduction_cycles,
            "exchange_phases": self.exchange_phases,
            "peak_bytes_per_tile": self.peak_bytes,
        }


def _ceil_div(a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
    return -(-np.asarray(a) // np.asarray(b))


def _chunk_choices(extent: int, max_parts: int) -> np.ndarray:
    """Distinct chunk sizes ceil(extent / p) for p = 1..min(extent, max_parts)."""
    parts = np.arange(1, min(extent, max_parts) + 1)
    return np.unique(_ceil_div(extent, parts))


def _k_choices(p: GemmProblem, k_blocks: int, tiles: int) -> np.ndarray:
    if p.k_align and p.k_align % p.precision.k_micro == 0:
        return np.array([min(k_blocks, p.k_align // p.precision.k_micro)])
    return _chunk_choices(k_blocks, tiles)


def _round_up(x: np.ndarray, m: int) -> np.ndarray:
    return _ceil_div(x, m) * m


def _multicast_cycles(words: np.ndarray, group: np.ndarray, paired: np.ndarray) -> np.ndarray:
    # A block split over g tiles and multicast among them: for g >= 3 every pair of transfers
    # shares a receiver, so they serialise to the whole block; g == 2 swaps halves in parallel.
    # With the g tiles side by side in whole physical pairs (``paired``), a chunk reaches the
    # other pairs as 64-bit items (half the cycles on each receiver, and its source partner's
    # receive port held as long) and the source's partner by itself: (g + 1) / 2 chunks' time
    # (low/pair_multicasts.py).
    whole = np.where(paired, _ceil_div(words * (group + 1), 2 * np.maximum(group, 1)), words)
    return np.where(group >= 3, whole, np.where(group == 2, _ceil_div(words, 2), 0))


def _packs(
    buffers: np.ndarray, il_extra: np.ndarray, standard: int, interleaved_free: np.ndarray
) -> np.ndarray:
    """Whether each candidate's free-region buffers fit, first-fit decreasing, in what is left
    of the standard region and of the interleaved region (buffers are contiguous).

    ``il_extra[i]`` is what buffer kind ``i`` costs in addition when it lands in the
    interleaved region (the GEMM left operand then keeps a whole element pair off the output).
    """
    order = np.argsort(-buffers, axis=0, kind="stable")
    ordered = np.take_along_axis(buffers, order, axis=0)
    extra = il_extra[order]
    std = np.full(buffers.shape[1], standard, dtype=np.int64)
    il = interleaved_free.copy()
    ok = il >= 0
    for size, more in zip(ordered, extra, strict=True):
        to_std = size <= std
        std = np.where(to_std, std - size, std)
        to_il = ~to_std & (size + more <= il)
        il = np.where(to_il, il - size - more, il)
        ok &= to_std | to_il
    return ok


def _frontier(order: np.ndarray, peak: np.ndarray, limit: int) -> np.ndarray:
    """Of candidates ``order`` (cheapest first), those no cheaper one matches in ``peak``
    bytes (the cycles/memory Pareto frontier), thinned to ``limit``: for bytes evenly spaced
    from the cheapest plan's to the leanest plan's, the cheapest plan within each."""
    peaks = peak[order]
    before = np.concatenate(([np.iinfo(np.int64).max], np.minimum.accumulate(peaks)[:-1]))
    front = order[peaks < before]
    if front.size <= limit:
        return front
    descending = peak[front]  # strictly decreasing along the frontier
    targets = np.linspace(descending[0], descending[-1], limit)
    picks = np.searchsorted(-descending, -targets, side="left")
    return front[np.unique(np.minimum(picks, front.size - 1))]


def _expand(cands: dict[str, np.ndarray], name: str, choices: np.ndarray) -> dict[str, np.ndarray]:
    """Cartesian product of the candidate table with one more column."""
    n, m = next(iter(cands.values())).size, choices.size
    out = {key: np.repeat(col, m) for key, col in cands.items()}
    out[name] = np.tile(choices, n)
    return out


def _modes(kind: str) -> list[str]:
    if kind == "parameter":
        return ["resident", "distributed"]
    return ["moved" if kind == "operation" else "distributed"]


MODE_CODES = {"resident": 0, "distributed": 1, "moved": 2}
MODE_NAMES = {v: k for k, v in MODE_CODES.items()}


#: Plans already ranked, by (problem, tiles, capacity scale, lean): (limit asked, plans). A
#: graph asks again for the same problem (Q/K/V, every loop body planned with its enclosing
#: graph), and a shorter list is a prefix of a longer one (one total order).
_RANKED: dict[tuple[GemmProblem, int, float, bool], tuple[int, list[GemmPlan]]] = {}
_RANKED_KEPT = 256


def enumerate_plans(
    problem: GemmProblem,
    tiles: int,
    limit: int = 16,
    capacity_scale: float = 1.0,
    lean: bool = False,
) -> list[GemmPlan]:
    """The cheapest feasible plans for ``problem`` on at most ``tiles`` tiles, best first.

    ``lean``: instead, the plans that trade cycles for memory: the Pareto frontier of
    (estimated cycles, peak bytes per tile plus host-written bytes per tile) over every
    feasible plan, from the cheapest to the leanest, thinned to ``limit`` plans spread over
    it (cheapest first); host-written blocks count twice as they are stored once per
    iteration of a loop body, whose GEMMs these plans are for. A loop
    body's GEMMs are stored once per iteration and run beside every layer's weights; the
    cheapest plans of a large one can leave no room for them (the So400m tower at batch 2).

    Raises:
        PlanError: if no plan fits in tile memory, naming the smallest shortfall.
    """
    key = (problem, tiles, capacity_scale, lean)
    hit = _RANKED.get(key)
    if hit is not None and (hit[0] >= limit or len(hit[1]) < hit[0]):
        return hit[1][:limit]
    plans = _rank_plans(problem, tiles, limit, capacity_scale, lean)
    _RANKED[key] = (limit, plans)
    while len(_RANKED) > _RANKED_KEPT:
        del _RANKED[next(iter(_RANKED))]
    return plans[:]


def _rank_plans(
    problem: GemmProblem, tiles: int, limit: int, capacity_scale: float, lean: bool = False
) -> list[GemmPlan]:
    p = problem
    eb = p.precision.element_bytes
    out_eb = ipu21.precision(ipu21.GEMM_OUTPUT_PRECISION[p.precision.name]).element_bytes
    kmicro, cmicro = p.precision.k_micro, p.precision.c_micro
    k_blocks = int(_ceil_div(p.k, kmicro))
    c_blocks = int(_ceil_div(p.n, cmicro))
    grid = np.array(
        np.meshgrid(
            _chunk_choices(p.batch, tiles),
            _chunk_choices(p.m, tiles),
            _chunk_choices(c_blocks, tiles),
            _k_choices(p, k_blocks, tiles),
            indexing="ij",
        )
    ).reshape(4, -1)
    used = (
        _ceil_div(p.batch, grid[0])
        * _ceil_div(p.m, grid[1])
        * _ceil_div(c_blocks, grid[2])
        * _ceil_div(k_blocks, grid[3])
    )
    keep = used <= tiles
    cands = {"bb": grid[0][keep], "rb": grid[1][keep], "cb": grid[2][keep], "kb": grid[3][keep]}
    steps = 2 ** np.arange(0, int(np.log2(max(k_blocks, 1))) + 1)
    cands = _expand(cands, "steps", steps)
    cands = {k: v[cands["steps"] <= cands["kb"]] for k, v in cands.items()}
    cands = _expand(cands, "wint", np.array([1, 0]))
    cands = _expand(cands, "lmode", np.array([MODE_CODES[m] for m in _modes(p.left_kind)]))
    cands = _expand(cands, "rmode", np.array([MODE_CODES[m] for m in _modes(p.right_kind)]))
    bb, rb, cb, kb = cands["bb"], cands["rb"], cands["cb"], cands["kb"]
    wint, lmode, rmode = cands["wint"].astype(bool), cands["lmode"], cands["rmode"]
    pb = _ceil_div(p.batch, bb)
    pr = _ceil_div(p.m, rb)
    pc = _ceil_div(c_blocks, cb)
    pk = _ceil_div(k_blocks, kb)
    ksb = _ceil_div(kb, cands["steps"])  # K blocks per serial step
    steps = _ceil_div(kb, ksb)
    used = pb * pr * pc * pk
    cols, kc, kstep = cb * cmicro, kb * kmicro, ksb * kmicro
    launch = ipu21.KERNEL_LAUNCH_CYCLES

    # Kernel cycles of the busiest tile: full steps plus a shorter last step.
    last = kb - (steps - 1) * ksb
    per_step = gemm_cycles_array(rb, kstep, cols, p.precision, wint) + launch
    last_step = gemm_cycles_array(rb, last * kmicro, cols, p.precision, wint) + launch
    kernel = bb * ((steps - 1) * per_step + last_step)

    left_slots = bb if p.left_batched else np.ones_like(bb)
    right_slots = bb if p.right_batched else np.ones_like(bb)
    left_group = pc * (1 if p.left_batched else pb)
    right_group = pr * (1 if p.right_batched else pb)
    left_step_bytes = left_slots * rb * kstep * eb
    right_step_bytes = right_slots * kstep * cols * eb

    def operand(mode: np.ndarray, step_bytes: np.ndarray, group: np.ndarray, paired: np.ndarray):
        words = step_bytes // 4
        # a moved block arrives in pieces cut by its producer's layout, paired only where
        # the pieces allow: costed unpaired (costing it paired when the tiles sharing it sit
        # in whole pairs took the SigLIP MLP b1 export from 165,951 to 160,530 simulated
        # cycles but the So400m tower from 9,006,388 to 9,174,128: plans chosen for paired
        # moves whose pieces, or whose senders' partner ports, did not let them pair)
        distributed = _multicast_cycles(words, group, paired)
        exchange = np.where(
            mode == MODE_CODES["resident"],
            0,
            np.where(mode == MODE_CODES["distributed"], distributed, words),
        )
        resident = mode == MODE_CODES["resident"]
        split = (mode == MODE_CODES["distributed"]) & ((steps > 1) | p.in_loop)
        work = _round_up(np.where(resident, steps * step_bytes, step_bytes), ALIGN)
        home = np.where(split, _round_up(steps * _ceil_div(step_bytes, group), ALIGN), 0)
        # The tile's own share of a split block is copied locally into the work buffer.
        copy = np.where(
            split,
            _ceil_div(_ceil_div(step_bytes, group), ipu21.LOCAL_COPY_BYTES_PER_CYCLE)
            + ipu21.LOCAL_COPY_CALL_CYCLES,
            0,
        )
        # host-written before the run: a resident block, a split block's home, or the chunk
        # of an unsplit distributed block (written into the work buffer itself)
        chunk = np.where(mode == MODE_CODES["distributed"], work, 0)
        host = np.where(resident, work, np.where(split, home, chunk))
        return exchange * steps, work, home, copy * steps, host

    # The tiles that share a left block sit side by side when the columns split evenly
    # (lower_gemm's tile order), so its multicasts reach whole physical pairs.
    left_paired = (pc % 2 == 0) & (left_step_bytes // 4 >= 2 * ipu21.PAIRED_MIN_WORDS)
    left_x, left_work, left_home, left_copy, left_host = operand(
        lmode, left_step_bytes, left_group, left_paired
    )
    right_x, right_work, right_home, right_copy, right_host = operand(
        rmode, right_step_bytes, right_group, np.zeros_like(pc, dtype=bool)
    )
    host_bytes = left_host + right_host
    operand_x = left_x + right_x
    operand_phases = np.where(operand_x > 0, steps, 0)
    out_bytes = _round_up(bb * rb * cols * out_eb, ALIGN)
    slice_rows = _ceil_div(rb, pk)
    slice_elems = bb * slice_rows * cols
    reduce_words = np.where(pk > 1, (pk - 1) * _ceil_div(slice_elems * out_eb, 4), 0)
    reduce_bytes = np.where(pk > 1, (pk - 1) * _round_up(slice_elems * out_eb, ALIGN), 0)
    out_name = ipu21.GEMM_OUTPUT_PRECISION[p.precision.name]
    reduce_kernel = np.where(pk > 1, reduce_add_cycles(pk, slice_elems, out_name) + launch, 0)
    phases = operand_phases + (pk > 1)
    copies = left_copy + right_copy
    total = (
        kernel
        + copies
        + operand_x
        + reduce_words
        + reduce_kernel
        + phases * ipu21.EXCHANGE_PHASE_OVERHEAD
    )
    # Output accumulators (and interleaved weights) must sit in the interleaved region; the
    # left operand and the output must not share an element (each rounds to one element).
    interleaved = out_bytes + np.where(wint, right_work, 0)
    peak = (
        left_work
        + left_home
        + right_work
        + right_home
        + out_bytes
        + reduce_bytes
        + 2 * ELEMENT_SLACK
    )
    # capacity_scale < 1 leaves room for allocator losses when a first placement failed.
    capacity = int((STANDARD_DATA_BYTES + INTERLEAVED_DATA_BYTES) * capacity_scale)
    packs = _packs(
        np.stack([left_work, left_home, np.where(wint, 0, right_work), right_home, reduce_bytes]),
        np.array([ELEMENT_SLACK, 0, 0, 0, 0]),
        int(STANDARD_DATA_BYTES * capacity_scale),
        (INTERLEAVED_DATA_BYTES * capacity_scale - interleaved).astype(np.int64),
    )
    fits = packs & (peak <= capacity)
    if not fits.any():
        if (peak <= capacity).any():
            raise PlanError(
                f"gemm {p.batch}x{p.m}x{p.k}x{p.n} ({p.precision.name}) does not fit in tile "
                f"memory on {tiles} tiles: plans small enough in total cannot lay their buffers "
                f"out in the standard ({int(STANDARD_DATA_BYTES * capacity_scale)} bytes) and "
                f"interleaved ({int(INTERLEAVED_DATA_BYTES * capacity_scale)} bytes) regions"
            )
        shortfall = int((peak - capacity).min())
        raise PlanError(
            f"gemm {p.batch}x{p.m}x{p.k}x{p.n} ({p.precision.name}) does not fit in tile memory "
            f"on {tiles} tiles: the smallest plan needs {int(peak.min())} bytes per tile of "
            f"tile data memory (standard + interleaved regions), {shortfall} more than the "
            f"{capacity} available"
        )
    idx = np.flatnonzero(fits)
    # Cheapest first; ties go to fewer tiles, then to the smaller memory footprint.
    order = idx[np.lexsort((peak[idx], used[idx], total[idx]))]
    if lean:
        # a loop body's host-written blocks are stored once per iteration: counted twice
        order = _frontier(order, peak + host_bytes, limit)
    plans = []
    for i in order[:limit]:
        plans.append(
            GemmPlan(
                batch_parts=int(pb[i]),
                row_parts=int(pr[i]),
                col_parts=int(pc[i]),
                k_parts=int(pk[i]),
                k_steps=int(steps[i]),
                batch_block=int(bb[i]),
                row_block=int(rb[i]),
                col_block=int(cols[i]),
                k_block=int(kc[i]),
                k_step=int(kstep[i]),
                weights="interleaved" if wint[i] else "standard",
                left_mode=MODE_NAMES[int(lmode[i])],
                right_mode=MODE_NAMES[int(rmode[i])],
                tiles=int(used[i]),
                kernel_cycles=int(kernel[i]),
                copy_cycles=int(copies[i]),
                operand_exchange_cycles=int(operand_x[i]),
                reduction_exchange_cycles=int(reduce_words[i]),
                reduction_cycles=int(reduce_kernel[i]),
                exchange_phases=int(phases[i]),
                estimated_cycles=int(total[i]),
                peak_bytes=int(peak[i]),
                interleaved_bytes=int(interleaved[i]),
                resident_bytes=int(host_bytes[i]),
                resident_interleaved_bytes=int(np.where(wint, right_host, 0)[i]),
            )
        )
    return plans

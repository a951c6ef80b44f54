"""GEMM candidates: the cheapest tile plans of :mod:`ipu_stack.mid.gemm_plan`."""

from __future__ import annotations

from dataclasses import replace

from ipu_stack.errors import PlanError
from ipu_stack.graph.compute_graph import ComputeGraph, Operation
from ipu_stack.mid.candidates.base import Candidate, Footprint
from ipu_stack.mid.formats import AxisTiling, Layout, TensorFormat
from ipu_stack.mid.gemm_plan import GemmPlan, GemmProblem, enumerate_plans
from ipu_stack.target.ipu21 import EXCHANGE_FRAGMENT_CYCLES, EXCHANGE_ROW_WORDS_PER_CHUNK

PLANS_PER_GEMM = 6
LEAN_PLANS = 2
#: plans along the cycles/memory frontier offered to a loop body's GEMMs
FRONTIER_PLANS = 8


def _formats(plan: GemmPlan, problem: GemmProblem) -> tuple[TensorFormat, ...]:
    p = problem.precision
    dtype = p.name
    k16 = p.k_micro
    left = TensorFormat(
        dtype,
        Layout(
            "amp_left",
            (
                AxisTiling(plan.batch_parts * plan.row_parts, plan.row_block),
                AxisTiling(plan.k_parts, plan.k_block, k16),
            ),
            plan.col_parts,
            plan.tiles,
            "any",
        ),
    )
    right = TensorFormat(
        dtype,
        Layout(
            "amp_right",
            (
                AxisTiling(plan.k_parts, plan.k_block, k16),
                AxisTiling(plan.col_parts, plan.col_block, p.c_micro),
            ),
            plan.row_parts,
            plan.tiles,
            plan.weights,
        ),
    )
    rows = plan.batch_parts * plan.row_parts * plan.k_parts
    out = TensorFormat(
        dtype,
        Layout(
            "amp_output",
            (
                AxisTiling(rows, -(-plan.row_block // plan.k_parts)),
                AxisTiling(plan.col_parts, plan.col_block, p.c_micro),
            ),
            1,
            plan.tiles,
            "interleaved",
        ),
    )
    return left, right, out


def gemm_candidates(
    graph: ComputeGraph,
    op: Operation,
    problem: GemmProblem,
    tiles: int,
    capacity_scale: float = 1.0,
    formats: dict[int, TensorFormat] | None = None,
) -> list[Candidate]:
    """Candidates for one gemm; conversions of moved operands are inside the plan's cost.

    A left operand produced on chip arrives in one piece per matching row run of producer
    and consumer blocks. Unless K is cut at the producer's column blocks (the aligned
    candidates), that is one piece per row, each paying the exchange fragment cost.
    """
    producer_fmt = (formats or {}).get(op.left) if problem.left_kind == "operation" else None
    try:
        ranked = enumerate_plans(problem, tiles, 256, capacity_scale)
    except PlanError as err:
        raise PlanError(f"{op.name}: {err}") from None
    aligned: list[GemmPlan] = []
    if producer_fmt is not None and not op.transpose_left:
        width = producer_fmt.layout.tiling[1].block
        try:
            aligned = enumerate_plans(
                replace(problem, k_align=width), tiles, PLANS_PER_GEMM, capacity_scale
            )
        except PlanError:
            aligned = []
    # The cheapest plans, and the leanest ones in case placement finds memory tighter.
    lean = sorted(ranked, key=lambda p: (p.peak_bytes, p.estimated_cycles))[:LEAN_PLANS]
    # and those that write the fewest weight bytes before the run (replicate the least)
    lean += sorted(ranked, key=lambda p: (p.resident_bytes * p.tiles, p.estimated_cycles))[
        :LEAN_PLANS
    ]
    plans = ranked[:PLANS_PER_GEMM] + [p for p in lean if p not in ranked[:PLANS_PER_GEMM]]
    plans += [p for p in aligned if p not in plans]
    if problem.in_loop and capacity_scale < 1.0:
        # on a capacity retry (a plan at full capacity could not be placed), the frontier
        # from the cheapest plan to the leanest over every feasible plan (the 256 cheapest
        # can all be too large beside every layer's weights). Not at full capacity: there it
        # changed the So400m tower's batch-1 plan for 0.8% more scheduled cycles.
        frontier = enumerate_plans(problem, tiles, FRONTIER_PLANS, capacity_scale, lean=True)
        plans += [p for p in frontier if p not in plans]
    out = []
    for plan in plans:
        penalty = 0
        if plan.left_mode == "moved" and producer_fmt is not None:
            width = producer_fmt.layout.tiling[1].block
            if plan.k_step != width and plan.k_step < problem.k:
                # one fragment per row of the left block and K step
                fragments = plan.row_block * plan.batch_block * plan.k_steps
                penalty = fragments * EXCHANGE_FRAGMENT_CYCLES
        left, right, result = _formats(plan, problem)
        needs = []
        for mode, fmt in ((plan.left_mode, left), (plan.right_mode, right)):
            needs.append(fmt if mode == "moved" else None)
        standard = plan.peak_bytes - plan.interleaved_bytes
        out.append(
            Candidate(
                op.name,
                "gemm",
                plan,
                tuple(needs),
                result,
                plan.estimated_cycles + penalty,
                plan.exchange_cycles + penalty,
                Footprint(
                    standard,
                    plan.interleaved_bytes,
                    standard,
                    4
                    * (
                        plan.exchange_phases + EXCHANGE_ROW_WORDS_PER_CHUNK * max(1, plan.col_parts)
                    ),
                    plan.resident_bytes,
                    plan.resident_interleaved_bytes,
                ),
                plan.tiles,
                plan.exchange_phases,
            )
        )
    return out

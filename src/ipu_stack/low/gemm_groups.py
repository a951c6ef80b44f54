"""GEMMs that read one delivery of their left operand, lowered side by side.

A layer's Q, K and V projections read the same layer-norm output with the same plan. When
they also start on the same tile (``place/balance.py`` keeps such GEMMs together), the first
one gathers the left blocks and the others read them there (``lower_gemm``'s ``delivered``).
Lowered one after another, each would still have exchange phases of its own: its weights'
staging, its K-split reduction. Lowered as a group, the members' steps are interleaved: the
calls each member runs before its exchange phase named ``X`` (``"operands step 0"``,
``"reduction"``) go into the compute step just before the group's ``X`` phase, which carries
every member's transfers of that phase. So the group has one operand phase, one GEMM step,
one reduction phase and one reduction step, however many members it has.

Every member's calls and transfers keep their order relative to each other (its phases come
in the same order in the group), and a member that reads the gathered left blocks runs its
GEMM calls after the group's operand phase (where the gathering member's transfers are).
Members read nothing another member writes but those blocks: they may only read values made
before the group's first member.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise
from typing import Any

from ipu_stack.graph.compute_graph import ComputeGraph, Operation
from ipu_stack.low.program import (
    ComputeStep,
    ExchangeStep,
    KernelCall,
    LogicalTransfer,
    ProgramBuilder,
    Step,
)
from ipu_stack.mid.gemm_plan import GemmPlan


def shared_left_key(graph: ComputeGraph, op: Operation, plan: GemmPlan) -> tuple | None:
    """What GEMMs must share to read one delivery of their left operand: the same on-chip
    left value, moved in one K step, under the same plan (None when ``op`` cannot share)."""
    if plan.left_mode != "moved" or plan.k_step < plan.k_block:
        return None
    if graph.value(op.left).kind != "operation":
        return None
    return (op.left, bool(op.attr("transpose_left", False)), plan)


def delivery_groups(
    graph: ComputeGraph, plans: dict[int, GemmPlan], offsets: dict[str, int]
) -> dict[int, list[Operation]]:
    """Groups of two or more GEMMs to lower together, by their first member's id: equal
    :func:`shared_left_key` and start tile, and inputs all made before the first member."""
    made_at: dict[int, int] = {}
    first_at: dict[Any, int] = {}
    groups: dict[Any, list[Operation]] = {}
    for i, op in enumerate(graph.operations):
        made_at[op.output] = i
        if op.kind != "gemm" or op.id not in plans:
            continue
        key = shared_left_key(graph, op, plans[op.id])
        if key is None:
            continue
        key = (key, offsets.get(op.name, 0))
        if key not in groups:
            groups[key], first_at[key] = [op], i
        elif all(made_at.get(v, -1) < first_at[key] for v in op.inputs):
            groups[key].append(op)
    return {members[0].id: members for members in groups.values() if len(members) > 1}


def _suffix(label: str, name: str) -> str:
    return label[len(name) :] if label.startswith(name) else label


def _phases(
    steps: list[Step], name: str
) -> tuple[list[tuple[str, list[KernelCall], ExchangeStep]], list[KernelCall]]:
    """A member's steps as (phase suffix, calls before it, the exchange) and the calls after
    its last exchange phase."""
    out: list[tuple[str, list[KernelCall], ExchangeStep]] = []
    calls: list[KernelCall] = []
    for step in steps:
        if isinstance(step, ComputeStep):
            calls.extend(step.calls)
        elif isinstance(step, ExchangeStep):
            out.append((_suffix(step.label, name), calls, step))
            calls = []
        else:  # pragma: no cover - a GEMM's lowering makes no loops
            raise AssertionError(f"{name}: unexpected {type(step).__name__} in a GEMM's steps")
    return out, calls


def _strictly_rising(ranks: list[int]) -> bool:
    """Every phase known to the first member, each once, in its order."""
    return all(r >= 0 for r in ranks) and all(a < b for a, b in pairwise(ranks))


def merge_members(builder: ProgramBuilder, members: list[tuple[str, ProgramBuilder]]) -> None:
    """Append the members' steps (``(name, its own builder)``, in graph order) to
    ``builder`` interleaved by phase; one after another when their phases do not line up."""
    split = [_phases(sub.steps, name) for name, sub in members]
    order = [suffix for suffix, _, _ in split[0][0]]
    rank = {s: i for i, s in enumerate(order)}
    lined_up = len(rank) == len(order) and all(
        _strictly_rising([rank.get(s, -1) for s, _, _ in phases]) for phases, _ in split
    )
    if not lined_up:
        for _, sub in members:
            for step in sub.steps:
                if isinstance(step, ComputeStep):
                    builder.compute(step.calls)
                elif isinstance(step, ExchangeStep):
                    builder.exchange(step.label, step.transfers)
        return
    before: dict[str, list[KernelCall]] = defaultdict(list)
    moved: dict[str, list[LogicalTransfer]] = defaultdict(list)
    for phases, _ in split:
        for suffix, calls, step in phases:
            before[suffix].extend(calls)
            moved[suffix].extend(step.transfers)
    first = split[0][0]
    others = len(members) - 1
    for suffix, _, step in first:
        builder.compute(before[suffix])
        builder.exchange(f"{step.label} (with {others} more gemms)", moved[suffix])
    builder.compute([c for _, tail in split for c in tail])

"""merge_members: GEMMs lowered side by side keep each member's order, or fall back to one
after another when their exchange phases do not line up."""

from __future__ import annotations

from ipu_stack.low.gemm_groups import merge_members
from ipu_stack.low.program import (
    ComputeStep,
    ExchangeStep,
    FillCall,
    LogicalTransfer,
    ProgramBuilder,
    Ref,
)


def _call(tag: str) -> FillCall:
    return FillCall(0, Ref(tag, 0), 8)


def _move(tag: str) -> LogicalTransfer:
    return LogicalTransfer(0, Ref(tag, 0), ((1, Ref(tag, 0)),), 1)


def _member(name: str, phases: list[str]) -> tuple[str, ProgramBuilder]:
    b = ProgramBuilder()
    for i, phase in enumerate(phases):
        b.compute([_call(f"{name}.c{i}")])
        b.exchange(f"{name} {phase}", [_move(f"{name}.x{i}")])
    b.compute([_call(f"{name}.tail")])
    return name, b


def _flat(builder: ProgramBuilder) -> list[tuple[str, list[str]]]:
    out = []
    for s in builder.steps:
        if isinstance(s, ComputeStep):
            out.append(("C", [c.dst.buffer for c in s.calls]))
        elif isinstance(s, ExchangeStep):
            out.append((s.label, [t.source.buffer for t in s.transfers]))
    return out


def test_members_with_the_same_phases_share_each_step():
    main = ProgramBuilder()
    merge_members(main, [_member("q", ["operands step 0", "reduction"]),
                         _member("k", ["reduction"])])  # fmt: skip
    assert _flat(main) == [
        ("C", ["q.c0"]),
        ("q operands step 0 (with 1 more gemms)", ["q.x0"]),
        ("C", ["q.c1", "k.c0"]),  # k's calls before its reduction: after q's operands
        ("q reduction (with 1 more gemms)", ["q.x1", "k.x0"]),
        ("C", ["q.tail", "k.tail"]),
    ]


def test_members_whose_phases_do_not_line_up_run_one_after_another():
    for k_phases in (["reduction", "operands step 0"], ["reduction", "reduction"], ["other"]):
        main = ProgramBuilder()
        merge_members(main, [_member("q", ["operands step 0", "reduction"]),
                             _member("k", k_phases)])  # fmt: skip
        labels = [label for label, _ in _flat(main) if label != "C"]
        assert labels == ["q operands step 0", "q reduction"] + [f"k {p}" for p in k_phases]

"""Finalists differ where it matters: near-duplicate branches are passed over."""

from types import SimpleNamespace

from ipu_stack.mid.beam import Branch, Conversion
from ipu_stack.mid.lower_mid import NEAR_DUPLICATE_SHARE, _differing_cycles, distinct_branches


def _branch(plans: dict[str, tuple[str, int]], conversions=()) -> Branch:
    choices = {
        name: SimpleNamespace(choice=choice, input_formats=(), output_format=None, cycles=c)
        for name, (choice, c) in plans.items()
    }
    total = sum(c for _, c in plans.values())
    return Branch(choices=choices, conversions=list(conversions), cycles=total)  # type: ignore[arg-type]


def test_a_branch_differing_only_in_a_small_operation_is_a_near_duplicate():
    best = _branch({"big": ("a", 9_000), "small": ("x", 100)})
    twin = _branch({"big": ("a", 9_000), "small": ("y", 110)})
    other = _branch({"big": ("b", 9_050), "small": ("x", 100)})
    assert _differing_cycles(best, twin) == 110
    kept, skipped = distinct_branches([best, twin, other], 4)
    assert kept == [best, other] and skipped == 1


def test_the_share_is_measured_against_the_better_branch():
    best = _branch({"a": ("p", 10_000), "b": ("q", 50)})
    edge = -(-int(NEAR_DUPLICATE_SHARE * best.cycles * 1000) // 1000)  # ceil of share x cycles
    under = _branch({"a": ("p", 10_000), "b": ("r", edge - 1)})
    at = _branch({"a": ("p", 10_000), "b": ("s", edge)})
    kept, skipped = distinct_branches([best, under, at], 4)
    assert kept == [best, at] and skipped == 1


def test_conversions_only_one_branch_makes_count():
    conv = Conversion("rearrange", "v", "p", "c", 5_000)
    best = _branch({"a": ("p", 100_000)})
    converted = _branch({"a": ("p", 100_000)}, [conv])
    assert _differing_cycles(best, converted) == 5_000
    assert distinct_branches([best, converted], 4) == ([best, converted], 0)


def test_count_caps_the_kept_branches_in_order():
    branches = [_branch({"a": (str(i), 1_000 + i)}) for i in range(6)]
    kept, skipped = distinct_branches(branches, 3)
    assert kept == branches[:3] and skipped == 0

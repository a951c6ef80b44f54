"""The list scheduler in priority order is a candidate of every phase, whatever the budget.

Regression for the 2-layer SigLIP encoder's output-projection operand phase (issue 16): one
GEMM operand group, 20 tiles each multicasting two 32-word chunks to the same 24 tiles. Its
clique-paths order (the shortest path through pairwise separations) ends at 1,824 cycles,
because with latency the separations break the triangle inequality and the path's non-adjacent
pairs force gaps it does not count; the priority list ends at 1,499. The scheduler used to skip
the priority list when its (10x pessimistic) cost estimate exceeded the budget's optional
share once clique-paths had made a schedule, and so kept 1,824.
"""

from __future__ import annotations

from ipu_stack.exchange.constraints import compile_phase
from ipu_stack.exchange.model import IPU21_MODEL, ExchangePhase, Transfer
from ipu_stack.exchange.schedule_cliques import clique_order
from ipu_stack.exchange.schedule_greedy import earliest_fit, horizon_of, priority_order
from ipu_stack.exchange.scheduler import optimize_phase
from ipu_stack.exchange.verify import verify_schedule

SOURCES = (413, 290, 1056, 1187, 417, 294, 1060, 1191, 421, 298,
           321, 326, 1092, 1095, 325, 330, 1096, 1099, 329, 334)  # fmt: skip
RECEIVERS = (790, 667, 802, 679, 814, 691, 826, 66, 1351, 78, 1363, 90,
             1375, 102, 1387, 114, 1399, 126, 579, 842, 591, 854, 603, 866)  # fmt: skip
WORDS = 32


def operand_group() -> ExchangePhase:
    transfers = []
    for source in SOURCES:
        for chunk in range(2):
            receive = 0x586E0 + 256 * len(transfers)
            destinations = tuple((tile, receive) for tile in RECEIVERS)
            transfers.append(Transfer(source, 0x64AE0 + 128 * chunk, destinations, WORDS))
    return ExchangePhase(tuple(transfers))


def test_fixture_has_a_clique_order_worse_than_the_priority_list() -> None:
    problem = compile_phase(operand_group(), IPU21_MODEL)
    order = clique_order(problem)
    assert order is not None
    by_cliques = horizon_of(problem, earliest_fit(problem, order))
    by_priority = horizon_of(problem, earliest_fit(problem, priority_order(problem)))
    assert (by_cliques, by_priority) == (1824, 1499)


def test_priority_list_is_a_candidate_even_on_a_tiny_budget() -> None:
    phase = operand_group()
    # 0.01 s: too little for any optional stage (the improvement stage's deadline has passed).
    report = optimize_phase(phase, IPU21_MODEL, time_budget=0.01)
    assert report.selected_horizon == 1499
    assert report.selected_kind == "earliest-fit"
    verify_schedule(phase, report.schedule)
    again = optimize_phase(phase, IPU21_MODEL, time_budget=0.01)
    assert again.schedule == report.schedule  # deterministic

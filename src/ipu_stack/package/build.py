"""The build driver: named phases in order, each timed and traced.

plan          rank operator plans per operation (vectorised cost model)
lower         lower the chosen plans to logical tile shards, work lists, exchange steps
place         lifetimes + SRAM addresses on the IPU21 map (falls back to leaner plans)
schedule      physical exchange phases, scheduled and verified
plan_kernels  every kernel specialisation the program calls (GEMM rows paired small/large)
compile_kernels  preflight + popc (or check-only without an SDK) through the kernel cache
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ipu_stack.errors import PlanError
from ipu_stack.exchange.model import (
    ExchangePhase,
    PhaseSchedule,
    maximum_identical_destinations,
)
from ipu_stack.exchange.scheduler import exchange_row_words, optimize_phase
from ipu_stack.exchange.verify import verify_schedule
from ipu_stack.graph.compute_graph import ComputeGraph
from ipu_stack.kernels.build import KernelArtifact, compile_kernels, plan_kernels
from ipu_stack.kernels.toolchain import Toolchain
from ipu_stack.low.lower import lower_program
from ipu_stack.low.program import ComputeStep, ExchangeStep, LowProgram
from ipu_stack.mid.gemm_plan import GemmPlan
from ipu_stack.mid.lower_mid import DEFAULT_BEAM_WIDTH, DEFAULT_FINALISTS, lower_mid
from ipu_stack.place.assign import Placement, physical_phase, place_program
from ipu_stack.target.ipu21 import TILES
from ipu_stack.trace import Trace

LARGE_PHASE_TRANSFERS = 1000
EXCHANGE_TARGET_GAP = 0.01  # stop improving an exchange schedule within 1% of its bound
CAPACITY_SCALES = (1.0, 0.85, 0.7)


@dataclass(slots=True)
class BuildConfig:
    """Build options; every default is what a user gets from the CLI."""

    tiles: int = TILES
    exchange_time_budget: float = 0.5  # seconds per exchange phase for the scheduler
    finalists: int = DEFAULT_FINALISTS  # whole-graph plans kept by lower_mid
    beam_width: int = DEFAULT_BEAM_WIDTH  # partial plans kept per operation
    compile_kernels: bool = True  # check or compile each kernel unit (the simulator needs none)
    kernel_sdk: str | None = None  # Poplar SDK root (default $POPLAR_SDK_ENABLED, else check)


@dataclass(slots=True)
class Build:
    """Everything a build produced, ready to run on a device."""

    graph: ComputeGraph
    program: LowProgram
    placement: Placement
    schedules: dict[int, tuple[ExchangePhase, PhaseSchedule]]
    trace: Trace
    plans: dict[int, GemmPlan] = field(default_factory=dict)
    kernels: list[KernelArtifact] = field(default_factory=list)

    def report(self) -> dict[str, object]:
        return {
            "kernels": [k.describe() for k in self.kernels],
            "phases": self.trace.phases,
            "events": self.trace.events,
            "plans": self.program.plans,
            "finalist": self.program.finalist,
            "finalists": [
                e for e in self.trace.events if e["event"] == "retained operator-plan finalist"
            ],
            "estimated_cycles": self.program.estimated_cycles,
            "estimated_exchange_cycles": self.program.estimated_exchange_cycles,
            "memory": self.placement.peaks,
        }


def build(
    graph: ComputeGraph, config: BuildConfig | None = None, trace: Trace | None = None
) -> Build:
    """Compile ``graph`` for the IPU21: plan, lower, place, schedule.

    Raises:
        GraphError: the graph is invalid.
        PlanError: nothing fits in tile memory (says what and by how much).
    """
    with _no_gc():
        return _build(graph, config, trace)


@contextmanager
def _no_gc() -> Iterator[None]:
    # Lowering makes millions of small long-lived tuples; the cyclic collector's repeated
    # scans of them cost more than the work itself, and the build makes no reference cycles.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _build(graph: ComputeGraph, config: BuildConfig | None, trace: Trace | None) -> Build:
    config = config or BuildConfig()
    trace = trace or Trace()
    if not 1 <= config.tiles <= TILES:
        from ipu_stack.errors import GraphError

        raise GraphError(f"--tiles must be between 1 and {TILES}, got {config.tiles}")
    graph.verify()
    error: PlanError | None = None
    for scale in CAPACITY_SCALES:
        # A tighter memory model on retry leaves room for allocator losses.
        with trace.phase("lower_mid"):
            finalists = lower_mid(graph, config.tiles, config.finalists, config.beam_width,
                                  trace, scale)
        for finalist in finalists:
            plans = {op.id: finalist.gemm_plans[op.name] for op in graph.operations
                     if op.kind == "gemm"}
            with trace.phase("lower"):
                program = lower_program(graph, plans, config.tiles, finalist.row_tiles)
            try:
                with trace.phase("place"):
                    placement = place_program(program)
                error = None
                break
            except PlanError as err:
                error = err
                trace.event("placement failed; trying the next finalist",
                            finalist=finalist.index, reason=str(err).splitlines()[0])
        if error is None:
            break
    if error is not None:
        raise error
    program.finalist = finalist.fields()
    for op in graph.operations:
        if op.name in program.plans:
            trace.event("selected gemm plan", operation=op.name, **_flat(program.plans[op.name]))
    schedules: dict[int, tuple[ExchangePhase, PhaseSchedule]] = {}
    with trace.phase("schedule_exchange"):
        for index, step in enumerate(program.steps):
            if not isinstance(step, ExchangeStep):
                continue
            phase = physical_phase(step, placement)
            large = len(phase.transfers) > LARGE_PHASE_TRANSFERS
            if large:
                trace.event(
                    "prepared large physical exchange phase",
                    phase=index,
                    transfers=len(phase.transfers),
                    maximum_identical_destinations=maximum_identical_destinations(phase),
                )
            # Greedy, then CP-SAT LNS until within EXCHANGE_TARGET_GAP of the strongest bound.
            report = optimize_phase(
                phase, time_budget=config.exchange_time_budget, target_gap=EXCHANGE_TARGET_GAP
            )
            schedule = report.schedule
            verify_schedule(phase, schedule)  # independent of the scheduler
            if large:
                trace.event("optimized physical exchange schedule", phase=index,
                            **report.log_fields())
                tile, row_words = exchange_row_words(phase, schedule)
                trace.event("finished large physical exchange phase", phase=index, tile=tile,
                            row_words=row_words, horizon=schedule.horizon)
            schedules[index] = (phase, schedule)
    trace.event(
        "lowered graph for package construction",
        logical_shards=sum(len(b.shards) for b in program.bindings),
        exchange_phases=len(schedules),
    )
    # Each kernel unit is checked (or compiled) once, through the content-addressed cache.
    with trace.phase("plan_kernels"):
        calls = (c for s in program.steps if isinstance(s, ComputeStep) for c in s.calls)
        units = plan_kernels(calls)
    kernels: list[KernelArtifact] = []
    if config.compile_kernels:
        with trace.phase("compile_kernels"):
            kernels = compile_kernels(units, Toolchain.discover(config.kernel_sdk), trace=trace)
    return Build(graph, program, placement, schedules, trace, plans, kernels)


def _flat(d: dict[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}_"))
        else:
            out[f"{prefix}{k}"] = v
    return out

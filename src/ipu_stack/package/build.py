"""The build driver: named phases in order, each timed and traced.

plan          rank operator plans per operation (vectorised cost model)
lower         lower the chosen plans to logical tile shards, work lists, exchange steps
place         lifetimes + SRAM addresses on the IPU21 map (falls back to leaner plans)
schedule      physical exchange phases, scheduled and verified
plan_kernels  every kernel specialisation the program calls (GEMM rows paired small/large)
compile_kernels  preflight + popc (or check-only without an SDK) through the kernel cache
lower_exchanges  scheduled phases -> per-tile encoded exchange rows (tilecode/exchange_rows)
link_runtime     kernel specialisations -> entry addresses (tilecode/supervisor)
build_tile_images  supervisor code + operand tables + rows placed in support (tilecode/images)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ipu_stack.errors import PlanError
from ipu_stack.exchange.memo import ScheduleMemo
from ipu_stack.exchange.model import ExchangePhase, PhaseSchedule
from ipu_stack.exchange.scheduler import schedule_phase
from ipu_stack.gc_pause import collector_paused
from ipu_stack.graph.compute_graph import ComputeGraph
from ipu_stack.kernels.build import KernelArtifact, compile_kernels, plan_kernels
from ipu_stack.kernels.toolchain import Toolchain
from ipu_stack.low.program import ComputeStep, ExchangeStep, GemmCall, LowProgram
from ipu_stack.mid.gemm_plan import GemmPlan
from ipu_stack.mid.lower_mid import DEFAULT_BEAM_WIDTH, DEFAULT_FINALISTS, Finalist, lower_mid
from ipu_stack.package.finalists import (
    Evaluated,
    evaluate,
    evaluate_finalists,
    predicted_cycles,
)
from ipu_stack.package.runtime_program import (
    TileProgram,
    _gemm_symbols,
    compile_runtime,
    support_overflow,
)
from ipu_stack.package.runtime_program import describe as describe_runtime
from ipu_stack.package.schedule_program import Refine, schedule_program
from ipu_stack.place.assign import Placement, physical_phase, place_program
from ipu_stack.place.sram import element_of
from ipu_stack.target.ipu21 import (
    DEFAULT_SUPPORT_RESERVATION_BYTES,
    ELEMENT_BYTES,
    EXECUTABLE_LIMIT,
    INTERLEAVED_BASE,
    STANDARD_DATA_BASE,
    TILES,
)
from ipu_stack.tilecode.images import (
    SupportOverflow,
    TileImages,
    build_tile_images,
    lower_exchanges,
)
from ipu_stack.tilecode.supervisor import link_runtime
from ipu_stack.trace import Trace

#: Tile memory the planner may count on, as a share of it: a plan placement cannot lay out is
#: planned again tighter. 0.95 first: the So400m tower at batch 2 places at 0.95 (one leaner
#: MLP GEMM in its loop body) where 0.85 plans every operation leaner (27.8M estimated cycles
#: against 21.5M).
CAPACITY_SCALES = (1.0, 0.95, 0.85, 0.7)
FINALIST_EXCHANGE_BUDGET = 0.2  # seconds per phase while comparing finalists (at most)

#: the scheduled exchange phases of a program, by step index
Schedules = dict[int, tuple[ExchangePhase, PhaseSchedule]]


@dataclass(slots=True)
class BuildConfig:
    """Build options; every default is what a user gets from the CLI."""

    tiles: int = TILES
    exchange_time_budget: float = 1.0  # seconds per exchange phase for the scheduler
    #: a phase of the selected plan gets ``exchange_time_budget`` only when its quick schedule's
    #: gap to the lower bound (times its alike phases) is at least this share of the plan's
    #: cycles; 0 reschedules every phase not already within the target gap of its bound
    exchange_refine_share: float = 0.001
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
    schedules: Schedules
    trace: Trace
    plans: dict[int, GemmPlan] = field(default_factory=dict)
    kernels: list[KernelArtifact] = field(default_factory=list)
    runtime: list[TileProgram] = field(default_factory=list)  # per-tile programs
    images: TileImages | None = None  # per-tile code, rows and tables (tilecode/)

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
    with collector_paused():  # lowering and placement: millions of small objects
        return _build(graph, config, trace)


def _build(graph: ComputeGraph, config: BuildConfig | None, trace: Trace | None) -> Build:
    config = config or BuildConfig()
    trace = trace or Trace()
    if not 1 <= config.tiles <= TILES:
        from ipu_stack.errors import GraphError

        raise GraphError(f"--tiles must be between 1 and {TILES}, got {config.tiles}")
    graph.verify()
    selected: Evaluated | None = None
    error: PlanError | None = None
    memo = ScheduleMemo()  # rounds share it: their plans have most phases alike
    for scale in CAPACITY_SCALES:
        # A tighter memory model on retry leaves room for allocator losses.
        with trace.phase("lower_mid"):
            finalists = lower_mid(
                graph, config.tiles, config.finalists, config.beam_width, trace, scale
            )
        with trace.phase("select_finalist"):
            last = scale == CAPACITY_SCALES[-1]
            found, error = _select_finalist(graph, finalists, config, trace, memo, last)
        if selected is not None:  # the one round after a plan with its loop padding zeroed
            selected = _faster(selected, found, scale, trace) if found else selected
            if not selected.full_schedules:
                with trace.phase("select_finalist"):
                    selected = _refined(selected, config, trace, memo)
            break
        selected = found
        if selected is not None and selected.padding_hoisted:
            break
        # If its loops zero their padded operand blocks in every iteration (it did not fit
        # with the zeroing done once, before the loop), which neither the planner nor the
        # refined cycles count, the next round's plan, for a tighter memory model, may fit
        # with it hoisted and be faster: one round more, and the faster of the two is kept.
    if selected is None:
        assert error is not None
        raise error
    program, placement, schedules = selected.program, selected.placement, selected.schedules
    program.finalist = selected.finalist.fields()
    plans = selected.plans
    for op in graph.operations:
        if op.name in program.plans:
            trace.event("selected gemm plan", operation=op.name, **_flat(program.plans[op.name]))
    trace.event(
        "lowered graph for package construction",
        logical_shards=sum(len(b.shards) for b in program.bindings),
        exchange_phases=len(schedules),
    )
    # The per-tile programs: steps in order, calls by entry symbol with absolute addresses;
    # each tile's exchange tables and code must fit its support reservation.
    with trace.phase("compile_runtime"):
        runtime = compile_runtime(program, placement, schedules)
        trace.event("compiled tile programs", **describe_runtime(runtime))
        overflow = support_overflow(runtime)
        if overflow is not None:
            # The simulator does not need the tables; hardware would (reported, not fatal).
            tile_program, excess = overflow
            trace.event(
                "support reservation exceeded",
                tile=tile_program.tile,
                exchange_row_bytes=tile_program.exchange_row_bytes,
                code_bytes=tile_program.code_bytes,
                excess_bytes=excess,
            )
    # Each kernel unit is checked (or compiled) once, through the content-addressed cache.
    with trace.phase("plan_kernels"):
        calls = (c for s in program.steps if isinstance(s, ComputeStep) for c in s.calls)
        units = plan_kernels(calls)
    kernels: list[KernelArtifact] = []
    if config.compile_kernels:
        with trace.phase("compile_kernels"):
            kernels = compile_kernels(units, Toolchain.discover(config.kernel_sdk), trace=trace)
    images, placement, schedules, runtime = _fitted_tile_code(
        program, placement, schedules, runtime, trace
    )
    return Build(graph, program, placement, schedules, trace, plans, kernels, runtime, images)


#: the most support a tile may be given when its rows, code and tables outgrow the default
#: reservation: the whole elements of the standard data region (facts §4.4: executable memory
#: ends at 0x80000; the runtime state ends at STANDARD_DATA_BASE), 9 elements, 144 KiB; the
#: tile's data then lives in the interleaved region. (It was 6 elements, a choice, not a
#: limit: a 4-stage transformers ResNet's tile 0 needs 121-133 KiB of code, tables and rows.)
MAX_SUPPORT_RESERVATION = (EXECUTABLE_LIMIT - STANDARD_DATA_BASE) // ELEMENT_BYTES * ELEMENT_BYTES


def _fitted_tile_code(
    program: LowProgram,
    placement: Placement,
    schedules: Schedules,
    runtime: list[TileProgram],
    trace: Trace,
    reservation: int = DEFAULT_SUPPORT_RESERVATION_BYTES,
) -> tuple[TileImages, Placement, Schedules, list[TileProgram]]:
    """:func:`_tile_code`; a tile whose support outgrows ``reservation`` gets a larger one
    (whole 16 KiB elements). Where the tile's data already lies below it nothing moves;
    else the tiles are placed again with it, while its data fits (else the overflow is the
    error), and a phase whose buffers changed memory element is scheduled again
    (:func:`_rescheduled`). Every tile starts at ``reservation``."""
    reservations: dict[int, int] = {}
    while True:
        try:
            images = _tile_code(program, placement, schedules, runtime, trace, reservation,
                                reservations)  # fmt: skip
            return images, placement, schedules, runtime
        except SupportOverflow as err:
            moved: list[int] = []
            for tile, needed in sorted(err.needed.items()):
                grown = -(-needed // ELEMENT_BYTES) * ELEMENT_BYTES
                if grown > MAX_SUPPORT_RESERVATION or reservations.get(tile, 0) >= grown:
                    raise
                reservations[tile] = grown
                if not _clear_of(placement, tile, EXECUTABLE_LIMIT - grown):
                    moved.append(tile)
            needs = err.needed
            busiest = max(needs, key=lambda t: (needs[t], -t))
            trace.event(
                "support reservations grown",
                tiles=len(needs),
                busiest_logical_tile=busiest,
                busiest_needed_bytes=needs[busiest],
                largest_reservation_bytes=max(reservations.values()),
                tiles_with_data_moved=len(moved),
            )
            if not moved:  # the tiles' data already lies below the larger reservations
                continue
            try:
                again = place_program(program, placement.physical, reservations)
            except PlanError as placing:
                raise PlanError(f"{err}; with larger support reservations: {placing}") from None
            again = replace(again, mapped=placement.mapped)
            schedules = _rescheduled(program, placement, again, schedules)
            placement = again
            runtime = compile_runtime(program, placement, schedules)


def _clear_of(placement: Placement, logical_tile: int, support_base: int) -> bool:
    """Whether no buffer of the tile reaches into a support reservation from ``support_base``
    (standard region addresses only: the interleaved region lies above it)."""
    return all(
        a.address + a.size <= support_base or a.address >= INTERLEAVED_BASE
        for a in placement.allocations[logical_tile].values()
    )


def _tile_code(
    program: LowProgram,
    placement: Placement,
    schedules: Schedules,
    runtime: list[TileProgram],
    trace: Trace,
    reservation: int = DEFAULT_SUPPORT_RESERVATION_BYTES,
    reservations: dict[int, int] | None = None,
) -> TileImages:
    """The phases after compile_kernels (tilecode/): rows, linked entries, tile images."""
    # Every scheduled phase -> per-tile rows of encoded exchange words within the field
    # limits; a phase that cannot be encoded fails the build (never encoded wrongly).
    with trace.phase("lower_exchanges"):
        rows = lower_exchanges(program, placement, schedules)
    # Each kernel specialisation gets its entry address (the call targets of emit_tile_code).
    with trace.phase("link_runtime"):
        gemms = [c for s in program.steps if isinstance(s, ComputeStep) for c in s.calls
                 if isinstance(c, GemmCall)]  # fmt: skip
        symbols = _gemm_symbols(gemms)
        linked = link_runtime(program, symbols)
    # emit_tile_code + place_storage: supervisor code, operand tables and rows placed in each
    # tile's support reservation (a tile that does not fit fails with its bytes), as images.
    with trace.phase("build_tile_images"):
        images = build_tile_images(program, placement, schedules, symbols, rows, reservation,
                                   linked, reservations)  # fmt: skip
        trace.event(
            "built tile images",
            **images.describe(),
            estimated_row_bytes=max((t.exchange_row_bytes for t in runtime), default=0),
        )
    return images


def _select_finalist(
    graph: ComputeGraph,
    finalists: list[Finalist],
    config: BuildConfig,
    trace: Trace,
    memo: ScheduleMemo,
    refine_degraded: bool = True,
) -> tuple[Evaluated | None, PlanError | None]:
    """Evaluate the finalists physically; keep the one with the fewest refined cycles.

    Past the logged finalists come leaner fallbacks: they are tried only if no finalist
    could be placed. Without ``refine_degraded``, a selection whose loop padding is zeroed
    every iteration keeps its quick schedules (:func:`_refined` once it is kept).
    """
    error: PlanError | None = None
    head = finalists[: config.finalists]
    winner: tuple[int, Finalist] | None = None
    outcomes, kept = evaluate_finalists(graph, head, config.tiles, _quick_budget(config), memo)
    for finalist, (refined, events, err) in zip(head, outcomes, strict=True):
        for event in events:  # replayed in finalist order: the trace stays deterministic
            trace.event(str(event.pop("event")), **event)
        if err is not None:
            error = err
            trace.event(
                "placement failed; trying the next finalist",
                finalist=finalist.index,
                reason=str(err).splitlines()[0],
            )
        elif refined is not None and (winner is None or refined < winner[0]):
            winner = (refined, finalist)
    candidates = [winner[1]] if winner else finalists[config.finalists :]
    for finalist in candidates:  # the winner, or else the leaner fallbacks in turn
        try:
            # Finalists were compared on quick schedules; the one kept is rescheduled at the
            # full budget where the gap its quick schedules leave could be worth it, and every
            # schedule it keeps is verified.
            if kept is not None and finalist is kept.finalist:
                best = kept  # evaluated in this process: its quick reports are in the memo
            else:
                best = evaluate(
                    graph,
                    finalist,
                    config.tiles,
                    Trace(quiet=True),
                    _quick_budget(config),
                    memo,
                    parallel=True,
                )
            if best.padding_hoisted or refine_degraded:
                best = _refined(best, config, trace, memo)
        except PlanError as err:
            error = err
            continue
        trace.event(
            "selected physically scheduled operator-plan finalist",
            selected=best.finalist.index,
            mapped=best.placement.mapped,
        )
        return best, None
    return None, error


def _refined(best: Evaluated, config: BuildConfig, trace: Trace, memo: ScheduleMemo) -> Evaluated:
    """``best`` rescheduled at the full budget where the gap its quick schedules leave could
    be worth it; every schedule it keeps is verified."""
    refine = Refine(_quick_budget(config), int(config.exchange_refine_share * best.refined_cycles))
    best.schedules = schedule_program(
        best.program,
        best.placement,
        config.exchange_time_budget,
        trace,
        True,
        memo,
        parallel=True,
        refine=refine,
        phases={index: phase for index, (phase, _) in best.schedules.items()},
    )
    best.full_schedules = True
    return best


def _faster(kept: Evaluated, found: Evaluated, scale: float, trace: Trace) -> Evaluated:
    """``found`` (planned at capacity ``scale``) or the plan ``kept`` from an earlier round,
    whichever the simulator's clock will charge fewer cycles (:func:`predicted_cycles`).
    ``kept`` is judged on its quick schedules (refined only if it stays), which refining
    reschedules only where the gap to a phase's bound is worth it: a bias of at most those
    gaps toward ``found``."""
    before, now = predicted_cycles(kept), predicted_cycles(found)
    trace.event(
        "compared plans of two capacity rounds",
        capacity_scale=scale,
        predicted_cycles=now,
        padding_hoisted=found.padding_hoisted,
        earlier_predicted_cycles=before,
        kept="this" if now < before else "earlier",
    )
    return found if now < before else kept


def _quick_budget(config: BuildConfig) -> float:
    """Seconds per phase while comparing finalists: never more than the final budget."""
    return min(FINALIST_EXCHANGE_BUDGET, config.exchange_time_budget)


def _flat(d: dict[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}_"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _rescheduled(
    program: LowProgram,
    before: Placement,
    placement: Placement,
    schedules: Schedules,
) -> Schedules:
    """The schedules of ``program`` on a new placement. A schedule depends on addresses only
    through the memory elements its transfers read and write on each tile (facts §5.4:
    a receive into an element a send reads from serialises); a phase none of whose buffers
    changed element keeps its schedule at the new addresses, the others are scheduled again."""
    moved: set[tuple[int, str]] = set()
    for tile, (old, new) in enumerate(zip(before.allocations, placement.allocations, strict=True)):
        for name, a in new.items():
            b = old.get(name)
            if b is None or _element_span(a.address, a.size) != _element_span(b.address, b.size):
                moved.add((tile, name))
    out = {}
    for index, (old_phase, schedule) in schedules.items():
        step = program.steps[index]
        assert isinstance(step, ExchangeStep)
        fresh = physical_phase(step, placement)
        # an address moved within its element can still change a transfer's width (paired
        # moves need 8-byte alignment), and a schedule is made for its widths
        widths = [t.width for t in fresh.transfers] != [t.width for t in old_phase.transfers]
        if widths or any(
            (t.source_tile, t.source.buffer) in moved
            or any((tile, ref.buffer) in moved for tile, ref in t.destinations)
            for t in step.transfers
        ):
            schedule = schedule_phase(fresh, schedule.model)
        out[index] = (fresh, schedule)
    return out


def _element_span(address: int, size: int) -> tuple[tuple[str, int], tuple[str, int]]:
    return element_of(address), element_of(address + max(size, 1) - 1)

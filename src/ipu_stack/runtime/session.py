"""Session: load a package onto a device, upload its weights, run it.

The simulator executes programs in its own form (logical tiles, buffers named per tile); a
package names physical tiles and absolute addresses. :func:`executable_program` turns the
package into that form and nothing else: a package tile's position in the tile list is its
logical tile, and each operand address becomes (the allocation live at that step which holds
it, offset). So the one execution engine, :class:`~ipu_stack.runtime.sim.SimDevice`, runs
exactly what the package contains and still checks every access against the package's
allocations and lifetimes.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ipu_stack.errors import (
    GraphError,
    InconsistentPackageError,
    PackageError,
    ScheduleError,
    SimulationError,
)
from ipu_stack.exchange.model import (
    PAIRED64,
    WORD32,
    ExchangeModel,
    ExchangePhase,
    PhaseSchedule,
    Piece,
    Transfer,
)
from ipu_stack.kernels.semantics import decode_f143
from ipu_stack.low.program import (
    AddCall,
    Binding,
    ComputeStep,
    CopyCall,
    ExchangeStep,
    FillCall,
    GemmCall,
    KernelCall,
    LogicalTransfer,
    LowProgram,
    MapCall,
    Ref,
    RepeatStep,
    Shard,
    Step,
    View,
)
from ipu_stack.package.format import Package, element_bytes, flat_rows
from ipu_stack.package.tile_images import check_description
from ipu_stack.package.validate import validate
from ipu_stack.place.assign import Allocation, Placement
from ipu_stack.runtime.npy_input import check_array
from ipu_stack.runtime.sim import RunResult, SimDevice, StepObserver
from ipu_stack.target import ipu21

if TYPE_CHECKING:
    from ipu_stack.profile.model import Profile

PRECISION_BY_NAME = {p.name: p for p in (ipu21.F16, ipu21.F32, ipu21.F8)}


def host_dtype(dtype: str) -> np.dtype:
    """The host-side NumPy type of a binding: F8 values are exchanged as float32 reals."""
    return np.dtype(np.float32 if dtype == "f8" else ipu21.precision(dtype).numpy_name)


ROLE_IN_PROGRAM = {"input": "host_input", "weight": "parameter", "output": "output"}


@dataclass(slots=True)
class Executable:
    """A package in the simulator's form."""

    program: LowProgram
    placement: Placement
    schedules: dict[int, tuple[ExchangePhase, PhaseSchedule]]


class _Resolver:
    """Absolute address on a physical tile at a step -> (logical tile, Ref into an allocation)."""

    def __init__(self, package: Package) -> None:
        self.logical = {tile: i for i, tile in enumerate(package.tiles)}
        table = package.table("allocations")
        names = package.manifest["allocation_names"]
        self.allocations: list[dict[str, Allocation]] = [{} for _ in self.logical]
        per_tile: dict[int, list[tuple[int, int, int, int, str]]] = {}
        for (tile, address, size, first, end), name in zip(table.tolist(), names, strict=True):
            per_tile.setdefault(tile, []).append((address, address + size, first, end, name))
            self.allocations[self.logical[tile]][name] = Allocation(
                name, address, size, (first, end)
            )
        self.spans = {t: sorted(v) for t, v in per_tile.items()}
        self.starts = {t: [s[0] for s in v] for t, v in self.spans.items()}

    def tile(self, physical: int, where: str) -> int:
        try:
            return self.logical[physical]
        except KeyError:
            raise PackageError(f"{where}: tile {physical} is not in the package") from None

    def ref(self, physical: int, address: int, step: int, where: str) -> Ref:
        spans = self.spans.get(physical, [])
        i = bisect.bisect_right(self.starts.get(physical, []), address)
        holding = None
        for lo, hi, first, end, name in reversed(spans[:i]):
            if lo <= address < hi:
                if first <= step < end:
                    return Ref(name, address - lo)
                holding = holding or (name, lo)
        if holding is not None:  # not live then: the simulator reports the lifetime error
            return Ref(holding[0], address - holding[1])
        raise PackageError(f"{where}: tile {physical} address {address:#x} is in no allocation")


def executable_program(package: Package) -> Executable:
    """Rebuild the simulator's program, placement and schedules from a package.

    Raises:
        PackageError: an operand address lies in no allocation of its tile.
    """
    r = _Resolver(package)
    manifest = package.manifest
    steps_json = manifest["program"]["steps"]
    end_step = len(steps_json)
    bindings = []
    for b in package.bindings():
        role = ROLE_IN_PROGRAM[b["role"]]
        step = end_step if role == "output" else 0
        shards = []
        for i, row in enumerate(package.binding_slices(b).tolist()):
            tile, address, stride, r0, r1, c0, c1, transposed, _, _ = row
            where = f"binding {b['name']!r} slice {i}"
            shards.append(
                Shard(
                    r.tile(tile, where),
                    r.ref(tile, address, step, where),
                    (r0, r1),
                    (c0, c1),
                    stride,
                    bool(transposed),
                )
            )
        bindings.append(
            Binding(b["name"], role, b["dtype"], tuple(b["shape"]), tuple(shards),
                    int(b.get("scale_exponent", 0)))
        )  # fmt: skip
    transfers = package.table("transfers").tolist()
    destinations = package.table("destinations").tolist()
    pieces = package.table("pieces").tolist()
    steps: list[Step] = []
    schedules: dict[int, tuple[ExchangePhase, PhaseSchedule]] = {}
    for index, step_json in enumerate(steps_json):
        if step_json["kind"] == "compute":
            calls = [_call(c, r, index) for c in step_json["calls"]]
            steps.append(ComputeStep(calls))
            continue
        if step_json["kind"] == "repeat":
            iterated = {}
            for tile, address, name, stride in step_json["iterated"]:
                where = f"step {index} repeat"
                logical = r.tile(tile, where)
                alloc = r.allocations[logical].get(name)
                if alloc is None or alloc.address != address:
                    raise PackageError(
                        f"{where}: tile {tile} has no allocation {name!r} at {address:#x}"
                    )
                iterated[(logical, name)] = stride
            steps.append(RepeatStep(step_json["count"], step_json["length"], iterated))
            continue
        start, count = step_json["transfers"]
        logical_transfers, physical = [], []
        arrivals: list[tuple[int, ...]] = []
        for g in range(start, start + count):
            source, address, words, paired, first = transfers[g]
            last = transfers[g + 1][4] if g + 1 < len(transfers) else len(destinations)
            dests = destinations[first:last]
            where = f"step {index} transfer {g - start}"
            logical_transfers.append(
                LogicalTransfer(
                    r.tile(source, where),
                    r.ref(source, address, index, where),
                    tuple((r.tile(t, where), r.ref(t, a, index, where)) for t, a, _ in dests),
                    words,
                )
            )
            physical.append(
                Transfer(
                    source,
                    address,
                    tuple((t, a) for t, a, _ in dests),
                    words,
                    PAIRED64 if paired else WORD32,
                )
            )
            arrivals.append(tuple(arrival for _, _, arrival in dests))
        per_transfer: list[list[Piece]] = [[] for _ in range(count)]
        p0, pn = step_json["pieces"]
        for g, send, offset, words in pieces[p0 : p0 + pn]:
            per_transfer[g - start].append(Piece(send, offset, words))
        info = step_json["schedule"]
        schedule = PhaseSchedule(
            tuple(tuple(p) for p in per_transfer),
            info["horizon"],
            info["kind"],
            ExchangeModel(**info["model"]),
            tuple(arrivals) if info["first_arrivals"] else None,
        )
        steps.append(ExchangeStep(step_json.get("label", ""), logical_transfers))
        schedules[index] = (ExchangePhase(tuple(physical), ipu21.TILES), schedule)
    program = LowProgram(
        tile_count=len(package.tiles),
        buffers=[],
        steps=steps,
        bindings=bindings,
        estimated_cycles=manifest["program"]["estimated_cycles"],
        estimated_exchange_cycles=manifest["program"]["estimated_exchange_cycles"],
        plans={},
    )
    placement = Placement(np.asarray(package.tiles, dtype=np.int64), r.allocations, {})
    return Executable(program, placement, schedules)


def _call(c: list[Any], r: _Resolver, step: int) -> KernelCall:
    kind, tile = c[0], c[1]
    where = f"step {step} {kind} call"
    t = r.tile(tile, where)

    def ref(address: int) -> Ref:
        return r.ref(tile, address, step, where)

    def view(v: list[Any]) -> View:
        return View(ref(v[0]), v[1], v[2], v[3], v[4])

    try:
        if kind == "gemm":
            _, _, out, left, right, rows, k, cols, prec, acc, weights, scale = c
            return GemmCall(
                t, ref(out), ref(left), ref(right), rows, k, cols, PRECISION_BY_NAME[prec],
                bool(acc), weights, scale,
            )  # fmt: skip
        if kind == "add":
            _, _, out, inputs, elements, prec = c
            return AddCall(
                t, ref(out), tuple(ref(a) for a in inputs), elements, PRECISION_BY_NAME[prec]
            )
        if kind == "copy":
            return CopyCall(t, ref(c[2]), ref(c[3]), c[4])
        if kind == "copy2d":
            return CopyCall(t, ref(c[2]), ref(c[3]), c[4], c[5], c[6], c[7])
        if kind == "fill":
            return FillCall(t, ref(c[2]), c[3])
        if kind == "map":
            _, _, name, out, inputs, attrs = c
            return MapCall(
                t, name, view(out), tuple(view(v) for v in inputs), tuple(map(tuple, attrs))
            )
    except (ValueError, TypeError, KeyError, IndexError) as err:
        raise PackageError(f"{where} on tile {tile}: malformed call {c!r:.120} ({err})") from None
    raise PackageError(f"{where} on tile {tile}: unknown call kind {kind!r}")


def weight_arrays(package: Package) -> dict[str, np.ndarray]:
    """The embedded weights as host arrays, gathered from their slices.

    Replicated slices must agree bit for bit and every element must be covered.

    Raises:
        PackageError: a weight's slices disagree or leave elements unset.
    """
    blob = package.blob("weights")
    arrays = {}
    for b in package.bindings("weight"):
        if not b.get("embedded"):
            continue
        n, c = flat_rows(b["shape"])
        dtype = np.dtype(ipu21.precision(b["dtype"]).numpy_name)
        bits = np.dtype(f"<u{element_bytes(b['dtype'])}")
        out = np.zeros((n, c), dtype=bits)
        seen = np.zeros((n, c), dtype=bool)
        for i, row in enumerate(package.binding_slices(b).tolist()):
            _, _, _, r0, r1, c0, c1, transposed, offset, size = row
            block = np.frombuffer(blob[offset : offset + size], dtype=bits)
            block = block.reshape((c1 - c0, r1 - r0) if transposed else (r1 - r0, c1 - c0))
            if transposed:
                block = block.T
            region, known = out[r0:r1, c0:c1], seen[r0:r1, c0:c1]
            if (region[known] != block[known]).any():
                raise PackageError(f"weight {b['name']!r}: slice {i} disagrees with a replica")
            region[...] = block
            known[...] = True
        if not seen.all():
            raise PackageError(
                f"weight {b['name']!r}: {int((~seen).sum())} elements are in no slice"
            )
        stored = out.view(dtype).reshape(b["shape"])
        # F8 weights are F143-encoded on the device; the host side holds their real values.
        arrays[b["name"]] = (
            decode_f143(stored, int(b.get("scale_exponent", 0))) if b["dtype"] == "f8" else stored
        )
    return arrays


@dataclass(slots=True)
class StepProfile:
    """Cycle record of the last run: ``end_cycles[step, tile]`` is a tile's clock after a step.

    Tiles are in the package's tile order (``tiles`` gives their physical ids).
    """

    tiles: list[int]
    kinds: list[str]
    end_cycles: np.ndarray

    def step_cycles(self) -> np.ndarray:
        """Cycles each tile spent in each step (waiting at a sync included), ``[step, tile]``."""
        start = np.vstack([np.zeros((1, self.end_cycles.shape[1]), np.int64), self.end_cycles])
        return np.diff(start, axis=0)


@dataclass(slots=True)
class Session:
    """A package loaded onto a device.

    Example:
        >>> session = Session(SimDevice()).load("model.ipuexe")  # doctest: +SKIP
        >>> session.initialize()  # doctest: +SKIP
        >>> outputs = session.run({"x": x})  # doctest: +SKIP
    """

    device: SimDevice = field(default_factory=SimDevice)
    package: Package | None = None
    executable: Executable | None = None
    weights: dict[str, np.ndarray] | None = None
    last_run: RunResult | None = None
    profile: StepProfile | None = None
    source: str = "<package>"
    #: the last run's full profile when ``run(..., profile=...)`` asked for one
    last_profile: Profile | None = None
    #: ``"images"``: execute the tile images (the default); ``"description"``: the package's
    #: step description (debug metadata, the pre-tile-code path)
    execution: str = "images"

    def load(self, package: Package | str | os.PathLike[str]) -> Session:
        """Validate and load a package (or a package file); returns the session.

        Raises:
            PackageError: the file is invalid (see :meth:`Package.load`).
        """
        if isinstance(package, Package):
            validate(package)  # an in-memory package gets the checks a file gets
            self.package = package
            self.source = "<package>"
        else:
            self.package = Package.load(package)
            self.source = os.fspath(package)
        try:
            self.executable = executable_program(self.package)
            self.device.check_allocations(self.executable.placement)
        except PackageError as err:
            if str(err).startswith(self.source):
                raise
            raise PackageError(f"{self.source}: {str(err).splitlines()[0]}") from None
        except (SimulationError, ScheduleError) as err:
            raise InconsistentPackageError(f"{self.source}: {str(err).splitlines()[0]}") from None
        if self.execution == "images":  # the description must be the one the images came from
            check_description(self.package, self.source)
        self.weights = None
        return self

    def _loaded(self) -> tuple[Package, Executable]:
        if self.package is None or self.executable is None:
            raise GraphError("no package is loaded; call Session.load first")
        return self.package, self.executable

    def initialize(
        self, weights: Mapping[str, np.ndarray] | None = None, cast: bool = False
    ) -> None:
        """The ``initialize`` host call: upload the weights (the package's, or ``weights``).

        Args:
            weights: arrays by weight binding name; they replace embedded weights of the same
                name and are required for weights the package does not embed.
            cast: convert arrays of another numeric dtype (else they are rejected).

        Raises:
            GraphError: a weight has no data, the wrong shape or (without ``cast``) dtype.
        """
        package, _ = self._loaded()
        arrays = weight_arrays(package)
        for name, array in (weights or {}).items():
            arrays[name] = np.asarray(array)
        self.weights = self._checked(arrays, "weight", "initialize", cast)

    def _checked(
        self, arrays: Mapping[str, np.ndarray], role: str, call: str, cast: bool = False
    ) -> dict[str, np.ndarray]:
        package, _ = self._loaded()
        expected = {b["name"]: b for b in package.bindings(role)}
        unknown = sorted(set(arrays) - set(expected))
        if unknown:
            raise GraphError(f"{call}: no {role} named {unknown[0]!r}; {role}s: "
                             f"{', '.join(sorted(expected)) or 'none'}")  # fmt: skip
        out = {}
        for name, b in expected.items():
            if name not in arrays:
                raise GraphError(f"{call}: no data for {role} {name!r}")
            what = f"{call}: {role} {name!r}"
            out[name] = check_array(what, arrays[name], host_dtype(b["dtype"]), b["shape"], cast)
        return out

    def run(
        self,
        inputs: Mapping[str, np.ndarray],
        cast: bool = False,
        profile: bool | str | os.PathLike[str] = False,
        observer: StepObserver | None = None,
    ) -> dict[str, np.ndarray]:
        """The ``run`` host call: write the inputs, execute the program, read the outputs.

        Inputs must have their binding's shape and host dtype exactly (``cast=True`` converts
        other numeric dtypes).

        Args:
            inputs: arrays by input binding name.
            cast: convert inputs of another numeric dtype instead of rejecting them.
            profile: capture the run's profile into :attr:`last_profile`
                (:mod:`ipu_stack.profile`); a path also writes it there as ``.ipuprof``.
            observer: also told about every executed step (e.g. a progress bar).

        Raises:
            GraphError: an input is missing, unknown, mis-shaped or of another dtype, or
                weights were not uploaded.
            InconsistentPackageError: the device rejected the package's program (a
                ``PackageError`` naming the file, and a ``SimulationError``).
        """
        package, exe = self._loaded()
        if self.weights is None:
            if package.bindings("weight"):
                raise GraphError("run: call Session.initialize() first (weights not uploaded)")
            self.weights = {}
        feeds = {**self.weights, **self._checked(inputs, "input", "run", cast)}
        recorder = None
        if profile is not False:
            from ipu_stack.profile.capture import Recorder

            recorder = Recorder()
        observers = [o for o in (recorder, observer) if o is not None]
        try:
            if self.execution == "images":
                from ipu_stack.runtime.image_run import run_images

                resolver = _Resolver(package)
                result = run_images(
                    self.device, package, exe, feeds, resolver, _call, _fan_out(observers)
                )
            else:
                result = self.device.run(
                    exe.program, exe.placement, exe.schedules, feeds, _fan_out(observers)
                )
        except (SimulationError, ScheduleError) as err:
            # The package passed validation, so the program itself is inconsistent.
            line = str(err).splitlines()[0]
            raise InconsistentPackageError(
                f"{self.source}: the package's program is inconsistent: {line}"
            ) from None
        self.last_run = result
        if recorder is not None:
            from ipu_stack.profile import format as profile_format
            from ipu_stack.profile.capture import capture

            self.last_profile = capture(package, exe.schedules, recorder, result.cycles)
            if not isinstance(profile, bool):
                profile_format.save(self.last_profile, profile)
        self.profile = StepProfile(
            package.tiles,
            [s["kind"] for s in package.manifest["program"]["steps"]],
            result.step_end_cycles,
        )
        return dict(result.outputs)


class _Observers:
    """Several step observers as one."""

    def __init__(self, observers: list[StepObserver]) -> None:
        self.observers = observers

    def step(self, index: int, step: Step, start: np.ndarray, end: np.ndarray) -> None:
        for observer in self.observers:
            observer.step(index, step, start, end)


def _fan_out(observers: list[StepObserver]) -> StepObserver | None:
    if not observers:
        return None
    return observers[0] if len(observers) == 1 else _Observers(observers)

"""Kernel build phases: plan every specialisation a program uses, then compile or check each.

``plan_kernels`` walks a lowered program's kernel calls and groups GEMM calls per (precision,
weight class, K, C); the row counts of each group are paired, in sorted order, as (small,
large) units (reference-system §2.11, §4.2). ``compile_kernels`` runs each unit through
preflight, the toolchain (or check-only mode) and the cache, in parallel across processes,
and reports every failing unit before failing with a one-line summary.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipu_stack.errors import IpuStackError
from ipu_stack.kernels import registry
from ipu_stack.kernels.cache import CacheEntry, KernelCache, KeyComponent, cache_key
from ipu_stack.kernels.preflight import (
    PREFLIGHT_VERSION,
    included_files,
    preflight,
    raise_for_failures,
)
from ipu_stack.kernels.toolchain import TARGET, Toolchain
from ipu_stack.low.program import GemmCall
from ipu_stack.trace import Trace

LOGGER = logging.getLogger("ipu_stack")
PARALLEL_MIN_UNITS = 3


class KernelBuildError(IpuStackError):
    """Kernel units failed preflight or compilation; ``details`` reports each of them."""

    exit_code = 1

    def __init__(self, summary: str, details: str) -> None:
        super().__init__(f"{summary}\n{details}")
        self.summary = summary
        self.details = details


@dataclass(frozen=True, slots=True)
class KernelCompilation:
    """One compile unit: a source, its name and flags (one popc run)."""

    name: str
    source: Path | None  # None: the kernel has no device code yet (status "required")
    flags: tuple[str, ...] = ()
    kernel: str = ""  # registry entry name
    entry_symbols: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class KernelArtifact:
    """A compiled or checked unit in the cache."""

    name: str
    key: str
    entry: Path
    metadata: Path
    object: Path | None
    symbols: tuple[str, ...]
    cache_hit: bool
    assembled: bool
    details: dict[str, Any] = field(default_factory=dict, compare=False)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "entry": str(self.entry),
            "metadata": str(self.metadata),
            "object": str(self.object) if self.object else None,
            "symbols": list(self.symbols),
            "cache_hit": self.cache_hit,
            "assembled": self.assembled,
        }


def plan_kernels(calls: Iterable[Any]) -> list[KernelCompilation]:
    """Every kernel specialisation used by ``calls`` (a program's kernel calls), sorted.

    GEMM calls are grouped per (precision, weight class, K, C); their row counts are paired
    in sorted order into (small, large) units, a lone count making a single-row unit.
    """
    groups: dict[tuple[str, str, int, int], set[int]] = defaultdict(set)
    for call in calls:
        if isinstance(call, GemmCall):
            groups[(call.precision.name, call.weights, call.k, call.c)].add(call.rows)
    units = []
    for (prec, weights, k, c), rows in sorted(groups.items()):
        spec = registry.gemm_kernel(prec, weights)
        counts = sorted(rows)
        for i in range(0, len(counts), 2):
            variant = spec.variant(k, c, counts[i : i + 2])
            units.append(
                KernelCompilation(
                    variant.name,
                    spec.source,
                    tuple(variant.flags()) if spec.source else (),
                    spec.name,
                    tuple(variant.entry_symbols.values()),
                )
            )
    return units


def key_components(
    unit: KernelCompilation, includes: Sequence[Path], toolchain: Toolchain
) -> list[KeyComponent]:
    """The named, ordered components of a unit's cache key."""
    assert unit.source is not None
    source = unit.source.resolve()
    flags = list(unit.flags)
    if not any(f.startswith("-O") for f in flags):
        flags.insert(0, "-O2")  # popc's default in the reference driver
    parts = [
        KeyComponent("format", b"ipu-stack-kernel-cache-v1"),
        KeyComponent("target", TARGET.encode()),
        KeyComponent(f"source:{source.name}", source.read_bytes()),
    ]
    for inc in includes:
        rel = os.path.relpath(inc.resolve(), source.parent)
        parts.append(KeyComponent(f"include:{rel}", inc.read_bytes()))
    parts += [KeyComponent("flag", f.encode()) for f in flags]
    parts.append(KeyComponent("checker", PREFLIGHT_VERSION.encode()))
    parts.append(KeyComponent("toolchain", toolchain.identity()))
    return parts


def unit_key(unit: KernelCompilation, toolchain: Toolchain) -> tuple[str, list[KeyComponent]]:
    """The unit's cache key and its components (the preprocessor names the includes)."""
    assert unit.source is not None
    comps = key_components(unit, included_files(unit.source, unit.flags), toolchain)
    return cache_key(comps), comps


def compile_kernel(
    unit: KernelCompilation, toolchain: Toolchain, cache: KernelCache
) -> tuple[KernelArtifact, list[KeyComponent]]:
    """Preflight, compile (or check) and cache one unit.

    Raises:
        PreflightError: the unit failed preflight (nothing is cached).
        ToolError: popc or pop-objdump failed (nothing is cached).
    """
    assert unit.source is not None
    source = unit.source.resolve()
    key, comps = unit_key(unit, toolchain)

    def build(tmp: Path) -> dict[str, Any]:
        start = time.perf_counter()
        result = preflight(source, unit.flags, unit.name)
        raise_for_failures([result])
        timings = {"preflight_ms": (time.perf_counter() - start) * 1000}
        (tmp / "kernel.S").write_text(result.preprocessed)
        (tmp / "kernel.expanded.S").write_text(result.expanded_text())
        if toolchain.assembles:
            timings.update(toolchain.compile(source, unit.flags, tmp))
        return {
            "name": unit.name,
            "kernel": unit.kernel,
            "target": TARGET,
            "source": str(source),
            "flags": list(unit.flags),
            "includes": [str(p) for p in result.includes],
            "symbols": result.defined_globals,
            "externals": result.externals,
            "assembled": toolchain.assembles,
            "toolchain": toolchain.describe(),
            "key_components": [c.describe() for c in comps],
            "timings_ms": {k: round(v, 3) for k, v in timings.items()},
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    entry, hit = cache.get_or_create(key, build)
    return _artifact(unit, entry, hit), comps


def _artifact(unit: KernelCompilation, entry: CacheEntry, hit: bool) -> KernelArtifact:
    meta = entry.metadata
    return KernelArtifact(
        unit.name,
        entry.key,
        entry.path,
        entry.metadata_path,
        entry.file("kernel.o"),
        tuple(meta.get("symbols", ())),
        hit,
        bool(meta.get("assembled")),
        meta,
    )


def _compile_in_worker(
    unit: KernelCompilation, sdk: str | None, root: str
) -> tuple[KernelArtifact | None, str | None]:
    """Process-pool entry: never raises for unit faults (every failure gets reported)."""
    try:
        artifact, _ = compile_kernel(unit, Toolchain(Path(sdk) if sdk else None), KernelCache(root))
        return artifact, None
    except IpuStackError as err:
        return None, getattr(err, "details", None) or str(err)


def compile_kernels(
    units: Sequence[KernelCompilation],
    toolchain: Toolchain | None = None,
    cache: KernelCache | None = None,
    trace: Trace | None = None,
    jobs: int | None = None,
) -> list[KernelArtifact]:
    """Compile or check every unit through the cache; cache misses run in parallel processes.

    Logs ``compiling kernel``, a cache hit/miss line and ``kernel artifact created`` per unit.

    Raises:
        KernelBuildError: one or more units failed; every failure is in ``details``.
    """
    toolchain = toolchain or Toolchain.discover()
    cache = cache or KernelCache()
    trace = trace or Trace()
    artifacts: dict[str, KernelArtifact] = {}
    misses: list[KernelCompilation] = []
    failures: list[str] = []
    for unit in units:
        if unit.source is None:
            trace.event("kernel has no device code yet", name=unit.name, kernel=unit.kernel,
                        status=registry.REQUIRED)  # fmt: skip
            continue
        trace.event("compiling kernel", source=str(unit.source), name=unit.name, target=TARGET)
        try:
            key, _ = unit_key(unit, toolchain)
        except (OSError, IpuStackError) as err:
            failures.append(f"kernel {unit.name}: {err}")
            continue
        entry = cache.lookup(key)
        if entry is not None:
            trace.event("kernel cache hit", name=unit.name, key=key)
            artifacts[unit.name] = _artifact(unit, entry, True)
        else:
            trace.event("kernel cache miss", name=unit.name, key=key)
            misses.append(unit)
    if misses:  # a cache root that is a file or unwritable: one GraphError, not per unit
        from ipu_stack.kernels.source_check import ensure_cache_dir

        ensure_cache_dir(cache.root)
    # Processes pay off from a handful of misses; fewer run inline (no pool start-up).
    workers = min(len(misses), jobs or os.cpu_count() or 1)
    if workers > 1 and len(misses) >= PARALLEL_MIN_UNITS:
        sdk = str(toolchain.sdk) if toolchain.sdk else None
        with ProcessPoolExecutor(workers) as pool:
            futures = [pool.submit(_compile_in_worker, u, sdk, str(cache.root)) for u in misses]
            results = [f.result() for f in futures]
    else:
        results = []
        for u in misses:
            try:
                results.append((compile_kernel(u, toolchain, cache)[0], None))
            except IpuStackError as err:
                results.append((None, getattr(err, "details", None) or str(err)))
    for unit, (artifact, error) in zip(misses, results, strict=True):
        if artifact is None:
            failures.append(error or f"kernel {unit.name}: failed")
            continue
        artifacts[unit.name] = artifact
        trace.event(
            "kernel artifact created",
            object=str(artifact.object) if artifact.object else "none (not assembled)",
            metadata=str(artifact.metadata),
        )
    if failures:
        summary = (
            f"kernel build failed for {len(failures)} of {len(units)} units "
            "(details above; IPU_STACK_TRACEBACK=1 for a traceback)"
        )
        raise KernelBuildError(summary, "\n".join(failures))
    return [artifacts[u.name] for u in units if u.name in artifacts]

"""Progress bars on a terminal (tqdm on stderr), and nothing at all when output is piped.

Bars are shown when stderr is a terminal, or when ``IPU_STACK_PROGRESS=1``;
``IPU_STACK_PROGRESS=0`` turns them off. The build's bars follow its trace events
(:class:`ProgressTrace`): finalists evaluated (``scheduled operator-plan finalist`` of the
``retained`` ones) and large exchange phases scheduled, and every build phase shows a status
line with its name and a running clock while it works (:func:`stage` does the same for the
compile command's steps outside the build: import, F8 calibration); the simulator's bar
follows its steps (:class:`SimulationProgress`, a step observer). None of this adds trace
events (the package's report holds them).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ipu_stack.low.program import LowProgram, RepeatStep, Step, step_runs
from ipu_stack.trace import Trace


def enabled() -> bool:
    """Whether to draw progress bars (see the module docstring)."""
    setting = os.environ.get("IPU_STACK_PROGRESS", "")
    if setting in ("0", "1"):
        return setting == "1"
    return sys.stderr.isatty()


def _bar(total: int | None, desc: str, unit: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                dynamic_ncols=True)  # fmt: skip


#: held while a status line is redrawn from its thread, and across every fork (the build
#: forks workers): a child never starts with the terminal stream's lock held by a thread it
#: does not have
_DRAWING = threading.Lock()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_DRAWING.acquire,
        after_in_parent=_DRAWING.release,
        after_in_child=_DRAWING.release,
    )


class _Status:
    """A one-line status (``desc`` and the seconds so far) redrawn each second by a daemon
    thread until closed."""

    def __init__(self, desc: str) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=None, desc=desc, file=sys.stderr, leave=False,
                        bar_format="{desc} ({elapsed})", dynamic_ncols=True)  # fmt: skip
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._tick, daemon=True)
        self.thread.start()

    def _tick(self) -> None:
        while not self.done.wait(1.0):
            with _DRAWING:
                if not self.done.is_set():
                    self.bar.refresh()

    def close(self) -> None:
        self.done.set()
        self.thread.join()
        self.bar.close()


@contextlib.contextmanager
def stage(trace: Trace, desc: str) -> Iterator[None]:
    """Show ``desc`` with a running clock while the block runs, if ``trace`` draws progress
    (a :class:`ProgressTrace`); nothing is recorded."""
    if not isinstance(trace, ProgressTrace):
        yield
        return
    status = _Status(desc)
    try:
        yield
    finally:
        status.close()


@dataclass(slots=True)
class ProgressTrace(Trace):
    """A build trace that also drives progress bars from its events."""

    finalists: int = 0
    bars: dict[str, Any] | None = None

    def event(self, message: str, **fields: Any) -> None:
        """Record (and log) the event, then advance the matching bar."""
        Trace.event(self, message, **fields)
        bars = self.bars if self.bars is not None else {}
        self.bars = bars
        if message == "retained operator-plan finalist":
            self.finalists += 1
        elif message == "scheduled operator-plan finalist":
            if "finalists" not in bars:
                bars["finalists"] = _bar(self.finalists or None, "evaluating finalists", "plan")
            bars["finalists"].update(1)
            bars["finalists"].refresh()
        elif message == "prepared large physical exchange phase":
            if "schedule" not in bars:
                bars["schedule"] = _bar(None, "scheduling large exchange phases", "phase")
        elif message == "finished large physical exchange phase" and "schedule" in bars:
            bars["schedule"].update(1)
            bars["schedule"].refresh()
        elif message == "package build phase finished" and fields.get("phase") == "lower_mid":
            # finalist evaluation starts now (the events come as finalists finish)
            bars["finalists"] = _bar(self.finalists or None, "evaluating finalists", "plan")
        elif message == "package build phase finished":
            done = ("finalists", "schedule") if fields.get("phase") == "select_finalist" else ()
            for name in done:
                if name in bars:
                    bars.pop(name).close()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """:meth:`Trace.phase`, with a status line naming the phase while it runs."""
        with stage(self, f"build phase {name}"), Trace.phase(self, name):
            yield

    def close(self) -> None:
        """Remove any bar still open."""
        for bar in (self.bars or {}).values():
            bar.close()
        self.bars = {}


def executed_steps(program: LowProgram) -> int:
    """Steps the simulator executes (a loop body once per iteration)."""
    steps = program.steps
    return sum(
        runs for runs, step in zip(step_runs(steps), steps, strict=True)
        if not isinstance(step, RepeatStep)
    )  # fmt: skip


class SimulationProgress:
    """A step observer showing the simulation's progress (steps executed)."""

    def __init__(self, program: LowProgram) -> None:
        self.bar = _bar(executed_steps(program), "simulating", "step")

    def step(self, index: int, step: Step, start: np.ndarray, end: np.ndarray) -> None:
        """Advance by one executed step."""
        self.bar.update(1)

    def close(self) -> None:
        """Remove the bar."""
        self.bar.close()

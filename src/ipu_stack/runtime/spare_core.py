"""Half of a large piece of simulator work in a forked child, when the host has a spare core.

The GEMM semantics of a large compute step are thousands of independent blocks of NumPy work,
each ~10 us calls that take the GIL: two threads ran no faster than one (measured on the
2-core host: 1.92 s against 1.93 s for the batch-4 SigLIP MLP's two largest GEMM batches).
A forked child runs without the GIL: it reads its operands from its copy of the parent's
memory (a snapshot at the fork, where the inputs already are) and returns its results in a
shared anonymous mapping, which the parent copies into the tile memories. Results do not
depend on the split (the blocks are independent), so a run gives the same bits with or
without the child; a child that fails only costs its work being done again by the parent.

Forking pays only with a core to spare: it is skipped when the 1-minute load average (this
process included) leaves less than half a core (``IPU_STACK_SIM_FORK=0`` turns it off,
``=1`` forces it).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable

import numpy as np

ENV = "IPU_STACK_SIM_FORK"


def spare_core() -> bool:
    """Whether a second process can run now: the environment's choice, else the load."""
    choice = os.environ.get(ENV)
    if choice is not None:
        return choice not in ("0", "")
    if not hasattr(os, "fork"):  # pragma: no cover - not on this host
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cores or 1) >= 2 and os.getloadavg()[0] <= (cores or 1) - 0.5


class Child:
    """A forked child running ``work(buffer)`` on a shared ``uint8`` buffer of ``nbytes``."""

    def __init__(self, nbytes: int, work: Callable[[np.ndarray], None]) -> None:
        self._map = mmap.mmap(-1, max(1, nbytes))
        self.buffer = np.frombuffer(self._map, np.uint8)[:nbytes]
        self.pid = os.fork()
        if self.pid == 0:  # the child: work, then leave without running the parent's exits
            status = 1
            try:
                work(self.buffer)
                status = 0
            finally:
                os._exit(status)

    def result(self) -> np.ndarray | None:
        """Wait for the child: its buffer if it finished its work, else None."""
        _, status = os.waitpid(self.pid, 0)
        return self.buffer if os.waitstatus_to_exitcode(status) == 0 else None

    def cancel(self) -> None:
        """Stop the child (the parent failed)."""
        try:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except OSError:  # pragma: no cover - already gone
            pass

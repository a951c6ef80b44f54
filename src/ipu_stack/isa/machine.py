"""The tile machine of the ISA emulator: supervisor and six workers on the six-slot barrel.

:class:`Tile` holds memory, the coefficient store (CWEI), the supervisor's CSRs and seven
contexts. :meth:`Tile.call` runs one kernel call: the supervisor enters at a symbol with the
ABI registers set and the return address in ``$m10``; the call ends when the supervisor
branches back to it with every worker exited. Each cycle belongs to slot ``cycle % 6``: the
worker that owns the slot issues one bundle, otherwise the supervisor issues one
instruction (assumptions ``barrel_slots``, ``worker_bundle_cycles``,
``supervisor_issue_per_slot``). Faults name the instruction, its address and template site.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ipu_stack.isa import assumptions
from ipu_stack.isa.ops import CONTROL, F143, OPS, PANEL_SLOT, Effects
from ipu_stack.isa.program import Bundle, Program
from ipu_stack.isa.state import CSR_INDEX, MASK32, POISON, Context, Fault, Memory
from ipu_stack.target import ipu21

SLOTS = int(assumptions.value("barrel_slots"))  # type: ignore[call-overload]
RETURN_ADDRESS = 0xFFFF8  # $m10 on entry: the caller; branching here ends the call
SUPERVISOR = ipu21.WORKERS
ZAACC = 1 << 3
# Rules of the table the machine implements structurally: it supports these values only, so
# editing one in assumptions.py without changing the code fails here rather than silently.
for _key, _supported in (("worker_bundle_cycles", SLOTS), ("supervisor_issue_per_slot", 1),
                         ("result_latency_bundles", 0), ("bundle_read_before_write", True),
                         ("sync_local_cycles", 0), ("runall_start_slot", "next"),
                         ("call_overhead_cycles", 0), ("stochastic_rounding_modelled", False),
                         ("interleaved_ports", True), ("standard_element_conflict", True),
                         ("code_outside_data", True)):  # fmt: skip
    if assumptions.value(_key) != _supported:
        raise NotImplementedError(f"the emulator implements {_key} = {_supported!r} only")
ZCWEI = 1 << 2


@dataclass(slots=True)
class CallResult:
    """Cycles of one call (tile cycles from entry to return) and issue counts."""

    cycles: int
    supervisor_instructions: int
    worker_bundles: int


class Tile:
    """One IPU21 tile running one :class:`Program` (see module docstring)."""

    def __init__(self, program: Program, memory: Memory | None = None) -> None:
        self.program = program
        self.mem = memory or Memory()
        self.cwei = np.zeros(64 * 8, np.uint8)
        self.cwei_version = 0
        self._weights: tuple[int, bool, np.ndarray] | None = None
        self.csr: dict[int, int] = {}
        self.contexts = [Context(i) for i in range(ipu21.WORKERS + 1)]
        self.cycle = 0
        self.max_cycles = 50_000_000

    # -- services for ops ---------------------------------------------------------------------
    def weights(self, fp8: bool) -> np.ndarray:
        """The CWEI panel as a [K micro, 16] f32 matrix (assumption cwei_slot_order)."""
        if self._weights and self._weights[:2] == (self.cwei_version, fp8):
            return self._weights[2]
        panel = self.cwei.reshape(64, 8)[PANEL_SLOT].reshape(-1)
        if fp8:
            w = panel.view(F143).astype(np.float32).reshape(32, 16)
        else:
            w = panel.view(np.float16).astype(np.float32).reshape(16, 16)
        self._weights = (self.cwei_version, fp8, w)
        return w

    def read_csr(self, c: Context, index: int) -> int:
        if c.is_worker:
            if index == CSR_INDEX["WSR"]:
                return c.index
            if index in c.csr:
                return c.csr[index]
            if index == CSR_INDEX["FP_CTL"]:
                return self.csr.get(CSR_INDEX["FP_ICTL"], 0)
            return 0
        return self.csr.get(index, 0)

    def write_csr(self, c: Context, index: int, value: int) -> None:
        if c.is_worker:
            if index == CSR_INDEX["FP_CLR"]:
                if value & ZAACC:
                    c.clear_accumulators()
                return
            c.csr[index] = value & MASK32
            return
        if index == CSR_INDEX["CR"] and value & ZCWEI:
            self.require_workers_idle("put $CR.ZCWEI")
            self.cwei[:] = 0
            self.cwei_version += 1
        self.csr[index] = value & MASK32

    def require_workers_idle(self, what: str) -> None:
        """The coefficient store is shared: no worker may run while it changes."""
        busy = [w.index for w in self.contexts[:SUPERVISOR] if w.active]
        if busy and assumptions.value("cwei_write_needs_idle_workers"):
            raise Fault(f"{what} writes the shared coefficient store while worker {busy[0]} "
                        "runs (sync first, facts §15.2)")  # fmt: skip

    def start_repeat(self, c: Context, ins: object, count: int, size: int) -> None:
        if not c.is_worker:
            raise Fault("rpt in supervisor code")
        if count > 0xFFFF:
            raise Fault(f"rpt count {count} exceeds 16 bits")
        here = self.program.at(c.pc)
        start = c.pc + (here.size if here is not None else 4)
        end = start + 8 * (size + 1)
        for address in range(start, end, 8):
            b = self.program.at(address)
            if b is None or len(b.instrs) != 2:
                raise Fault(f"rpt body bundle at {address:#x} is not a two-instruction bundle")
            for i in b.instrs:
                if i.mnemonic in CONTROL:
                    raise Fault(f"rpt body holds control instruction {i.mnemonic} at "
                                f"{i.address:#x}")  # fmt: skip
        c.rpt = (start, end, count) if count else None
        c.pc = start if count else end

    def exit_worker(self, c: Context) -> None:
        if not c.is_worker:
            raise Fault("exitz in supervisor code")
        c.active = False

    def sync(self, c: Context, zone: int) -> None:
        if any(w.active for w in self.contexts[:SUPERVISOR]):
            c.waiting_sync = True  # retried at the supervisor's next free slot

    def launch(self, kind: str, entry: int, base: int, words: int) -> None:
        if entry % 4 or base % 4:
            raise Fault(f"{kind} entry {entry:#x} or vertex base {base:#x} misaligned")
        target = self.program.at(entry)
        if target is None or target.context != "worker":
            raise Fault(f"{kind} entry {entry:#x} is not worker code")
        workers = self.contexts[:SUPERVISOR]
        if kind == "runall":
            busy = [w.index for w in workers if w.active]
            if busy:
                raise Fault(f"runall while worker {busy[0]} is active")
            for w in workers:
                w.launch(entry, base + w.index * words * 4, self.cycle)
            return
        free = [w for w in workers if not w.active]
        if not free:
            raise Fault("run with no free worker context")
        free[0].launch(entry, base + words * 4, self.cycle)

    # -- execution ------------------------------------------------------------------------------
    def call(self, entry: str, registers: dict[int, int]) -> CallResult:
        """Run the supervisor from symbol ``entry`` until it returns; count tile cycles.

        Raises:
            Fault: with the instruction, its address and template site.
        """
        if entry not in self.program.labels:
            raise Fault(f"{self.program.name}: no entry symbol {entry!r}")
        sup = self.contexts[SUPERVISOR]
        sup.m = [POISON | n for n in range(15)] + [0]  # undefined on entry ($m15 = $mzero)
        for reg, value in registers.items():
            sup.m[reg] = value & MASK32
        sup.m[10] = RETURN_ADDRESS
        sup.pc, sup.active, sup.waiting_sync = self.program.labels[entry], True, False
        start = self.cycle
        sup_count = bundles = 0
        workers = self.contexts[:SUPERVISOR]
        while sup.active or any(w.active for w in workers):
            if self.cycle - start > self.max_cycles:
                raise Fault(f"{self.program.name}: call did not return in {self.max_cycles} cycles")
            w = workers[self.cycle % SLOTS]
            if w.active:
                if self.cycle >= w.ready:
                    self._issue(w)
                    bundles += 1
            elif sup.active:
                if sup.waiting_sync:
                    if not any(x.active for x in workers):
                        sup.waiting_sync = False
                        sup.pc += 4
                        sup_count += 1
                else:
                    self._issue(sup)
                    sup_count += 1
                    if sup.pc == RETURN_ADDRESS:
                        sup.active = False
                        busy = [x.index for x in workers if x.active]
                        if busy and assumptions.value("return_needs_idle_workers"):
                            raise Fault(
                                f"{self.program.name}: the supervisor returned while "
                                f"worker {busy[0]} still runs (no sync before br)"
                            )
            self.cycle += 1
        return CallResult(self.cycle - start, sup_count, bundles)

    def _issue(self, c: Context) -> None:
        bundle = self.program.at(c.pc)
        if bundle is None:
            raise Fault(f"{self.program.name}: context {_name(c)} jumped to {c.pc:#x}, which "
                        "holds no instruction")  # fmt: skip
        expected = "worker" if c.is_worker else "supervisor"
        if bundle.context != expected:
            raise Fault(self._where(bundle, f"{bundle.context} code run by {_name(c)}"))
        effects = Effects()
        pc = c.pc
        try:
            for ins in bundle.instrs:
                op = OPS.get(ins.mnemonic)
                if op is None:
                    raise Fault(f"the emulator does not implement {ins.mnemonic}")
                op(self, c, ins, effects)
            effects.commit(self)
        except Fault as err:  # the same class (a Trap keeps its registers), located
            err.args = (self._where(bundle, str(err), c),)
            raise
        if c.waiting_sync:
            return
        if c.pc != pc:  # rpt moved it
            return
        nxt = effects.jump if effects.jump is not None else pc + bundle.size
        if c.rpt is not None and nxt == c.rpt[1]:
            start, end, left = c.rpt
            if left > 1:
                c.rpt = (start, end, left - 1)
                nxt = start
            else:
                c.rpt = None
        c.pc = nxt

    def _where(self, bundle: Bundle, problem: str, c: Context | None = None) -> str:
        ins = bundle.instrs[0]
        text = " ; ".join(i.describe() for i in bundle.instrs)
        who = f" ({_name(c)})" if c is not None else ""
        return (
            f"{self.program.name}: fault at {bundle.address:#x}{who} `{text}` "
            f"[{ins.site.describe()}]: {problem}"
        )


def _name(c: Context) -> str:
    return f"worker {c.index}" if c.is_worker else "supervisor"

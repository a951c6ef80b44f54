"""Tile state of the ISA emulator: memory as bytes at IPU21 addresses, contexts, CSRs, faults."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

from ipu_stack.errors import IpuStackError
from ipu_stack.isa import assumptions
from ipu_stack.kernels.isa import ARF_ALIASES, MRF_ALIASES
from ipu_stack.target import ipu21

if TYPE_CHECKING:
    from ipu_stack.isa.program import Instr

MASK32 = 0xFFFFFFFF
AMP_PIPELINE_ROWS = int(assumptions.value("amp_pipeline_rows"))  # type: ignore[call-overload]
POISON = 0xBAD0_0000  # registers of a new worker (undefined on hardware) start as POISON | n
CSR_INDEX = {"WSR": 0x01, "CR": 0x02, "VERTEX_BASE": 0x02, "REPEAT_COUNT": 0x04, "FP_ICTL": 0x20,
             "CCCSLOAD": 0x50, "CTXT_STS": 0x72, "FP_CLR": 0x101, "FP_CTL": 0x103,
             "TAS": 0x108}  # fmt: skip
CSR_FP_INFMT = 49
CSR_FP_ISCL = 51


class Fault(IpuStackError):
    """The device code did something the hardware rejects (or the emulator cannot model)."""

    exit_code = 1


@dataclass(slots=True)
class Context:
    """One hardware context: the supervisor (index 6) or worker 0..5."""

    index: int
    m: list[int] = field(default_factory=lambda: [0] * 16)
    a: np.ndarray = field(default_factory=lambda: np.zeros(16, np.uint32))
    pc: int = 0
    active: bool = False
    ready: int = 0  # first cycle at which it may issue
    waiting_sync: bool = False
    csr: dict[int, int] = field(default_factory=dict)
    rpt: tuple[int, int, int] | None = None  # (body start, body end, iterations left)
    acc_cur: np.ndarray = field(default_factory=lambda: np.full(16, np.nan, np.float32))
    acc_done: deque = field(default_factory=deque)  # finished rows still in the AMP pipeline
    bundles: int = 0

    @property
    def is_worker(self) -> bool:
        return self.index < ipu21.WORKERS

    def launch(self, entry: int, vertex: int, cycle: int) -> None:
        """Start as a worker at ``entry`` with vertex base ``vertex`` (registers undefined)."""
        self.m = [(POISON | n) for n in range(16)]
        self.m[15] = 0
        self.m[13] = vertex & MASK32
        self.a = np.array([POISON | n for n in range(16)], np.uint32)
        self.a[15] = 0
        self.pc, self.active, self.ready, self.rpt = entry, True, cycle + 1, None
        self.csr = {CSR_INDEX["VERTEX_BASE"]: vertex}
        self.clear_accumulators(np.nan)

    def clear_accumulators(self, fill: float = 0.0) -> None:
        """Zero (ZAACC) or poison the AMP accumulators: the row being fed and the rows in flight."""
        self.acc_cur = np.full(16, fill, np.float32)
        self.acc_done = deque(np.full(16, fill, np.float32) for _ in range(AMP_PIPELINE_ROWS))


@cache
def mreg(name: str) -> int:
    """MRF index of ``$mN`` or an alias."""
    name = name.removesuffix("+=")
    if name in MRF_ALIASES:
        return MRF_ALIASES[name]
    return int(name[2:])


@cache
def areg(name: str) -> int:
    """ARF index of the first register of ``$aN``, ``$aN:M`` or an alias (``$azeros`` -> 15)."""
    if name in ARF_ALIASES or name == "$azeros":
        return 15
    return int(name[2:].split(":")[0])


@cache
def mpair(name: str) -> int:
    return int(name.removesuffix("+=")[2:].split(":")[0])


def csr_index(text: str, value: int | None) -> int:
    if text.startswith("$"):
        return CSR_INDEX[text[1:]]
    assert value is not None
    return value


class Memory:
    """Tile memory [TILE_MEMORY_BASE, TILE_MEMORY_END) as bytes, with the access rules."""

    def __init__(self, data: np.ndarray | None = None) -> None:
        size = ipu21.TILE_MEMORY_END - ipu21.TILE_MEMORY_BASE
        self.data = np.zeros(size, np.uint8) if data is None else data
        self.base = ipu21.TILE_MEMORY_BASE

    def offset(self, address: int, size: int, align: int) -> int:
        if address % align:
            raise Fault(f"address {address:#x} is not {align}-byte aligned for a {size}-byte "
                        "access")  # fmt: skip
        if address < self.base or address + size > self.base + len(self.data):
            raise Fault(
                f"address {address:#x} (+{size}) is outside tile memory "
                f"[{self.base:#x}, {self.base + len(self.data):#x})"
            )
        return address - self.base

    def read(self, address: int, size: int, align: int | None = None) -> np.ndarray:
        o = self.offset(address, size, size if align is None else align)
        return self.data[o : o + size]

    def write(self, address: int, raw: np.ndarray | bytes, align: int | None = None) -> None:
        raw = np.frombuffer(bytes(raw), np.uint8) if isinstance(raw, bytes) else raw
        o = self.offset(address, len(raw), len(raw) if align is None else align)
        self.data[o : o + len(raw)] = raw


def element(address: int) -> tuple[str, int] | None:
    """The 16 KiB standard element of ``address``; None in the interleaved region."""
    if address >= ipu21.INTERLEAVED_BASE:
        return None
    return ("standard", address // ipu21.ELEMENT_BYTES)


def require_interleaved(address: int, what: str) -> None:
    if address < ipu21.INTERLEAVED_BASE:
        raise Fault(f"{what} at {address:#x} must be in the interleaved region (from "
                    f"{ipu21.INTERLEAVED_BASE:#x})")  # fmt: skip


def signed32(v: int) -> int:
    """A 32-bit register value read as two's-complement."""
    v &= MASK32
    return v - (1 << 32) if v & 0x80000000 else v


def operand_value(c: Context, ins: Instr, i: int) -> int:
    """Operand ``i`` of ``ins``: an MRF register's value or the immediate, as 32 bits."""
    text = ins.operands[i]
    if text.startswith("$"):
        return c.m[mreg(text)]
    value = ins.imms[i]
    if value is None:
        raise Fault(f"operand {text!r} has no value")
    return value & MASK32

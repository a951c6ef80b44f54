"""IPU21 (C600) machine constants: the single source of truth for hardware numbers.

Every number cites `shared/docs/ipu21-facts.md` (section numbers as "facts §N") and the
confidence tag given there: [R] stated by a public source, [I] inferred, [T] taken from the
reference implementation's reverse-engineered code.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes  # noqa: F401  (registers float8_e4m3fnuz with NumPy for numpy_name)

# --- Machine -------------------------------------------------------------------------------
TILES = 1472  # facts §2.1 [R] S3
WORKERS = 6  # facts §2.1, §16.2 [R] S5: one supervisor + six worker contexts
CLOCK_HZ = 1_500_000_000  # facts §2.1/§14.2 [T]: reference profiles default to 1.5 GHz

# --- Tile memory map (facts §4.4, §4.5 [T]; base [R] S8) ------------------------------------
TILE_MEMORY_BASE = 0x4C000
TILE_MEMORY_END = 0xE8000  # 624 KiB per tile
INTERLEAVED_BASE = 0x80000  # region 1 (interleave factor 2) starts here
LOADER_LIMIT = 0xE7BB0  # the final 0x450 bytes cannot be populated by the loader
EXECUTABLE_LIMIT = 0x80000  # instruction fetch only below region 1
ELEMENT_BYTES = 0x4000  # 16 KiB memory element (standard region)
INTERLEAVED_ELEMENT_BYTES = 0x8000  # 32 KiB element pair in the interleaved region
APPLICATION_LOAD_BASE = 0x4C010
HOST_EXCHANGE_APERTURE = (0x50000, 0x58000)
RUNTIME_STATE = (0x58000, 0x586E0)  # completion, profile stamps, worker stacks
STANDARD_DATA_BASE = 0x586E0
DEFAULT_SUPPORT_RESERVATION_BYTES = 3 * 0x4000  # facts §4.4: runtime code, exchange tables
# Tile code (facts §4.5 [T]): the entry stub at the load base, linked code from 0x4c018 up to
# the host aperture, the completion word at the runtime-state base; row tables are followed by
# a 64-byte guard (supervisor fetch lookahead, facts §4.4/§9.4).
KERNEL_ENTRY_BASE = 0x4C018
KERNEL_ENTRY_END = 0x50000
COMPLETION_WORD = 0x58000
LOOP_STATE = 0x58010  # assumed: three loop words (counter, table base, row base) after the stamps
ROW_GUARD_BYTES = 64

# Ranges no planner may allocate data into: boot/stub + linked code, host aperture, runtime state.
RESERVED_RANGES: tuple[tuple[int, int], ...] = (
    (TILE_MEMORY_BASE, 0x50000),
    HOST_EXCHANGE_APERTURE,
    RUNTIME_STATE,
)

# --- Exchange and sync ---------------------------------------------------------------------
EXCHANGE_BYTES_PER_CYCLE = 4  # facts §7.5 [T]/[I]: one 32-bit word per cycle each way per tile
WORD_BYTES = 4
# facts §8.5 [T]: a paired 64-bit multicast needs >= 64 items (SEPT's mapping model: >= 128
# words, an even count) and 8-byte-aligned addresses (`sendpicp`); §7.4 [R]: both tiles of a
# physical pair then receive the same data in the same cycles.
PAIRED_MIN_WORDS = 128
PAIRED_ALIGN = 8
SYNC_CYCLES = 600  # facts §10.2 [T]: global sync per exchange phase on ipu21
# Estimates add the worst pair latency once per phase: the slowest C600 pair's send-to-write
# time, ``time_to_mux + 1 + 52 + 2 x row`` at its release (facts §8.4, §8.5, §9 [T]); 165,
# found by the exhaustive check in test_topology. (It was 112, the largest ``time_to_mux``,
# while the exchange model measured latency relative to the quickest pair.)
EXCHANGE_LATENCY_ALLOWANCE = 165
EXCHANGE_PHASE_OVERHEAD = SYNC_CYCLES + EXCHANGE_LATENCY_ALLOWANCE  # per phase, in estimates
# facts §8.5 / exchange-scheduling §1.4 [T]: about 160 event cycles per independent fragment
EXCHANGE_FRAGMENT_CYCLES = 160
# reference-system §2.3 [T]: exchange-row bytes = 4 x (phases + 42 words per transfer chunk)
EXCHANGE_ROW_WORDS_PER_CHUNK = 7 * 6
# supervisor code per program entry (a call or an exchange set-up): two 8-byte bundles [I]
CODE_BYTES_PER_ENTRY = 16
# Exchange-code words per scheduled piece: a sending tile runs a delay and a send, a receiving
# tile a `delayxpic` and a `delaypic` (facts §8.5, exchange-scheduling §2 [I]).
SEND_ROW_WORDS_PER_PIECE = 2
RECEIVE_ROW_WORDS_PER_PIECE = 2
# ELF e_machine of Colossus (IPU) objects (facts §19.1 [T])
ELF_MACHINE_COLOSSUS = 0xF8

# --- Kernel launch and local data movement (facts §12.1 [T]) --------------------------------
KERNEL_LAUNCH_CYCLES = 11
LOCAL_COPY_BYTES_PER_CYCLE = 8
LOCAL_COPY_CALL_CYCLES = 288
# A copy of several runs (CopyCall rows > 1) pays the call cost once and this much per run
# after the first [I, assumed, not measured]: a worker steps both pointers and sets up its
# `rpt` for each run (about six instructions), the six workers' runs interleaved in the barrel.
# The emulated cycles of the copy device code are reported beside it (kernel-run copy2d_*).
LOCAL_COPY_ROW_CYCLES = 6
AMP_LEFT_PACK_CYCLES_PER_ELEMENT = 4  # facts §12.2 [T]: repack into AMP-left order

# --- Alignment (facts §5.2 [R], §2.2 reference operand rules [T]) ---------------------------
AMP_OPERAND_ALIGNMENT = 32
WORD_ALIGNMENT = 4

# Elementwise add fit from the measured points of facts §14.1 [T]:
# Add 1152 -> 1368 cycles, Add 2152 -> 2124 cycles (one row each).
ADD_CYCLES_PER_ELEMENT = (2124 - 1368) / (2152 - 1152)
ADD_FIXED_CYCLES = 1368 - ADD_CYCLES_PER_ELEMENT * 1152


@dataclass(frozen=True, slots=True)
class Precision:
    """A numeric precision as the AMP engines see it."""

    name: str
    element_bytes: int
    amp_macs_per_cycle: int  # per tile, facts §3 [I]
    k_micro: int  # K elements per coefficient-store panel, facts §15.1 [T]
    c_micro: int  # output columns per panel, facts §15.1 [T]
    numpy_name: str


F16 = Precision("f16", 2, 64, 16, 16, "float16")
F32 = Precision("f32", 4, 16, 8, 16, "float32")
# F143 (1 sign, 4 exponent, 3 mantissa bits; bias 8, max 240, NaN = 0x80): ml_dtypes'
# float8_e4m3fnuz. AMP rate facts §3 [I], K micro 32 facts §15.1 [T], format reference-system §1.4.
# Graphs use it for GEMM operands (products accumulate into F16), casts and data movement.
F8 = Precision("f8", 1, 128, 32, 16, "float8_e4m3fnuz")
# 32-bit integers (token ids, argmax indices, 0/1 masks): word-sized like F32 (facts §5.2
# natural alignment); no AMP path (rate 0), so GEMMs and attention refuse them.
I32 = Precision("i32", 4, 0, 1, 1, "int32")
PRECISIONS: dict[str, Precision] = {p.name: p for p in (F16, F32, F8, I32)}
#: precisions that hold floating-point values (everything but the integer one)
FLOAT_PRECISIONS = ("f16", "f32", "f8")
#: precision of a GEMM's output (and partials) for each operand precision
GEMM_OUTPUT_PRECISION = {"f16": "f16", "f32": "f32", "f8": "f16"}


def precision(name: str) -> Precision:
    """Look up a precision by name (``f16``, ``f32``, ``f8`` or ``i32``)."""
    try:
        return PRECISIONS[name]
    except KeyError:
        from ipu_stack.errors import GraphError

        known = ", ".join(sorted(PRECISIONS))
        raise GraphError(f"unknown precision {name!r}; supported: {known}") from None

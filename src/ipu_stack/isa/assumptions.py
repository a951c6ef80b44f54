"""Every rule the ISA emulator relies on that public documentation does not state.

One table, :data:`ASSUMPTIONS`: each row names a rule, the value the emulator uses, and its
evidence (a section of ``shared/docs/ipu21-facts.md``, a poplibs source named there) or
``assumed`` when nothing public pins it down. The emulator (:mod:`ipu_stack.isa`) reads every
number below from :func:`value`; nothing here was fitted to the measured C600 GEMM points
(facts §13.3; they are only compared against, in ``benchmarks``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Assumption:
    """One semantic or timing rule: its value and why we believe it."""

    key: str
    value: object
    rule: str
    evidence: str


ASSUMPTIONS: tuple[Assumption, ...] = (
    # -- issue model -----------------------------------------------------------------------
    Assumption(
        "barrel_slots",
        6,
        "six round-robin issue slots; worker context i owns slot i "
        "while it runs, the supervisor issues in every slot no worker owns",
        "facts §16.2 [R] asm_vertices §4.2.1; slot-to-context mapping assumed",
    ),
    Assumption(
        "worker_bundle_cycles",
        6,
        "an active worker issues one bundle (or one solo instruction) every 6 tile cycles",
        "facts §16.2 [I] poplibs x numWorkerContexts",
    ),
    Assumption(
        "supervisor_issue_per_slot",
        1,
        "the supervisor issues one instruction in each "
        "free slot (1 per cycle with no worker running)",
        "facts §16.2 'runs in all execution slots'; one instruction per slot assumed",
    ),
    Assumption(
        "result_latency_bundles",
        0,
        "a register written by an instruction is visible "
        "to the next instruction its context issues (the 6-slot interleave hides the "
        "pipeline; supervisor back-to-back hazards are not modelled)",
        "facts §16.2 [I] 'results become visible after about 6 slots'; assumed",
    ),
    Assumption(
        "bundle_read_before_write",
        True,
        "both instructions of a bundle read their "
        "operands before either writes (a load in bundle t feeds bundle t+1)",
        "assumed",
    ),
    Assumption(
        "sync_local_cycles",
        0,
        "sync SYNC_ZONE_LOCAL costs no cycle beyond its issue slot once every worker has exited",
        "assumed",
    ),
    Assumption(
        "runall_start_slot",
        "next",
        "a worker launched by run/runall issues its first "
        "bundle at its own slot's next turn after the launching cycle",
        "assumed",
    ),
    Assumption(
        "call_overhead_cycles",
        0,
        "a kernel call's cycles are counted from the "
        "supervisor's first entry instruction to its return (br $m10); the 11-cycle "
        "launch of target/ipu21.py is not added by the emulator",
        "assumed",
    ),
    # -- memory -------------------------------------------------------------------------------
    Assumption(
        "alignment_padding",
        "nop",
        "the assembler fills a code alignment gap with nop "
        "instructions, which cost an issue when execution falls through them",
        "assumed (GNU as pads code sections with the target's nop)",
    ),
    Assumption(
        "code_outside_data",
        True,
        "instructions are fetched from the unit's own image "
        "(placed at the tile memory base); fetch does not contend with data accesses",
        "assumed",
    ),
    Assumption(
        "standard_element_conflict",
        True,
        "two accesses of one instruction (ld2x64pace, "
        "ld2xst64pace, ldst64pace) to one 16 KiB element of the standard region fault",
        "facts §5.2 CAUSEID_CONFLICT_EA [R], §5.3 [I]",
    ),
    Assumption(
        "interleaved_ports",
        True,
        "accesses of one instruction inside the interleaved "
        "region never conflict (two elements per pair, partials read through the second "
        "port of ld2xst64pace)",
        "facts §5.3 [I], §5.4 [T]",
    ),
    Assumption(
        "tapack_layout",
        "lo=a0|(a2&0x7ff)<<21, hi=a1|(a2>>11)<<21",
        "tapack packs three "
        "21-bit byte addresses: address 0 in the low register, address 1 in the high "
        "one, address 2 split over both registers' bits 31..21",
        "facts §16.3 ldst64pace 'split across the upper bits of both registers' [R]; "
        "bit positions assumed",
    ),
    Assumption(
        "pace_increment_codes",
        "00:+1 atom 01:stride field 0 10:field 1 11:+0",
        "each pace address has a 2-bit increment code; strides are signed 10-bit counts "
        "of 64-bit atoms",
        "facts §16.3 [R] inlineAssemblerConv.hpp",
    ),
    Assumption(
        "pace_code_order",
        "address 0 in bits 1..0, address 1 in 3..2, address 2 in 5..4",
        "field order of Strimm2x2 / Strimm3x2 (st64pace: address 2 in bits 1..0)",
        "assumed (consistent with the poplibs usage cited in facts §16.3)",
    ),
    # -- AMP ----------------------------------------------------------------------------------
    Assumption(
        "cwei_slot_order",
        (0, 32, 8, 40, 16, 48, 24, 56),
        "the coefficient store holds "
        "64 x 64 bits; the n-th 64-bit word of a panel (K micro rows of 16 columns, "
        "row-major) goes to slot ORDER[n // 8] + n % 8, and the AMP reads the panel back "
        "in that same order",
        "facts §15.1 [T] load order; the read-back mapping assumed",
    ),
    Assumption(
        "cwei_write_needs_idle_workers",
        True,
        "writing the coefficient store "
        "(ld64putcs, ld128putcs, $CR.ZCWEI) while a worker runs is reported as a fault: "
        "there is no interlock, so the result would depend on timing",
        "facts §15.2 [R] poplibs 'must wait for all workers ... as it is shared'",
    ),
    Assumption(
        "return_needs_idle_workers",
        True,
        "a call that returns (br $m10) while a "
        "worker still runs is a fault (its results would race the caller)",
        "assumed",
    ),
    Assumption(
        "amp_pipeline_rows",
        1,
        "f16v4hihov4amp / f8v8hihov4amp: the result of a row's "
        "phase-p column quarter leaves the AMP as the output of the phase-p instruction "
        "one row (four instructions) later",
        "facts §16.3 [I] (f16v4sisoamp table: "
        "result 8 instructions after warm-up for 8 engines); assumed for 16 engines",
    ),
    Assumption(
        "amp_phase_columns",
        "phase p feeds K quarter p to all 16 engines and takes the "
        "partials of output columns 4p..4p+3",
        "phase p consumes input elements "
        "[p*4, p*4+4) (F16) or [p*8, p*8+8) (F8) and partial columns [4p, 4p+4)",
        "facts §16.3 [R] poplibs usage of TAMP_F16V4_E4_P0..3; column mapping assumed",
    ),
    Assumption(
        "amp_accumulator_precision",
        "f32",
        "products and sums inside the AMP are f32, "
        "the result is rounded once to f16 (round to nearest even) when it leaves",
        "facts §16.5 gap 3: the adder width is not public; assumed",
    ),
    Assumption(
        "stochastic_rounding_modelled",
        False,
        "FP_ICTL.ESR is recorded but rounding is always to nearest even",
        "assumed (deterministic emulation)",
    ),
    Assumption(
        "amp_phase_flags",
        {48: 0, 49: 1, 50: 2, 51: 3},
        "the TAMP_*_E4_P0..3 flag values select phases 0..3 (the same values for F8)",
        "seed log [T]; F8 assumed (facts §16.5 gap 1)",
    ),
    Assumption(
        "f8_scale",
        "products x 2**FP_ISCL",
        "F8 AMP products are scaled by a power of two read from FP_ISCL (CSR 51)",
        "facts §15.1 [T]",
    ),
    # -- vector arithmetic -----------------------------------------------------------------------
    Assumption(
        "vector_rounding",
        "nearest-even",
        "f16v4/f32v2 add, mul and conversions round "
        "to nearest even, with IEEE subnormals and no exceptions",
        "assumed",
    ),
    Assumption(
        "vector_broadcast_operand",
        "lane-repeat",
        "the `$aSrc0:B` operand form of f32v2mul repeats the one f32 in $aSrc0 in both lanes "
        "(a scalar times a vector)",
        "syntax from the Tile Vertex ISA (ipu_assembly_support hover f32v2mul, f32v2sub: a "
        "second form `$aSrc0:B`); that B means broadcast is assumed",
    ),
    Assumption(
        "compare_mask",
        "0xffffffff / 0",
        "f32v2cmpXX writes, per lane, all ones when the comparison holds and zero otherwise "
        "(a NaN operand compares false except for cmpne), so and64/andc64/or64 select lanes",
        "Tile Vertex ISA hover 'vector less-than test' (result format not stated); assumed",
    ),
    Assumption(
        "min_max_nan",
        "propagate",
        "f32max, f32v2max and f32v2min return NaN when an operand is NaN (as NumPy's maximum "
        "and minimum)",
        "assumed (the ISA text says only 'maximum' / 'minimum')",
    ),
    # -- scalar f32 functions (softmax, GeLU, attention, layer norm, the unary kinds) ----------
    Assumption(
        "f32_divide_sqrt_rounding",
        "correctly rounded",
        "f32div, f32oox (1/x) and f32sqrt return the correctly rounded f32 result (IEEE "
        "division and square root, nearest even); the layer-norm division corrects a "
        "quotient from f32oox with an exact residual, so it stays exact if f32oox is off by "
        "an ulp",
        "Tile Vertex ISA hover 'floating-point division', 'single-precision reciprocal', "
        "'square root' (f32div.md, f32oox.md, f32sqrt.md; accuracy not stated); assumed",
    ),
    Assumption(
        "f32exp_accuracy",
        "numpy-f32",
        "f32exp returns NumPy's f32 exp (the function the softmax and attention semantics "
        "call); the hardware's accuracy is not public, so on a C600 softmax, attention and "
        "GeLU outputs may differ from the semantics by the exp error (a few f32 ulp) besides "
        "what the emulator shows",
        "instruction in the Tile Vertex ISA (ipu_assembly_support hover/f32exp.md, no text); "
        "accuracy assumed",
    ),
    Assumption(
        "transcendental_accuracy",
        "numpy-f32",
        "f32tanh returns NumPy's f32 tanh (correctly rounded in practice); the hardware's "
        "accuracy is not public",
        "instruction from Graphcore's public LLVM fork (llvm.colossus.tanh.f32); accuracy assumed",
    ),
    Assumption(
        "exp_sigmoid_accuracy",
        "exact-rounded-once",
        "f32sigm returns the exact 1 / (1 + exp(-x)) rounded once to f32",
        "instructions in the Tile Vertex ISA hover list (no text); accuracy assumed",
    ),
    Assumption(
        "long_latency_single_issue",
        True,
        "f32div, f32oox, f32sqrt, f32exp, f32sigm and f32tanh issue like any other "
        "instruction (one bundle slot, result visible to the context's next bundle); no extra "
        "cycles are charged, so the emulated cycles of the units that use them (GeLU, "
        "softmax, layer norm, attention, the unary kinds) are a lower bound",
        "assumed (their latencies are not public; facts §16.5 timing)",
    ),
    Assumption(
        "ldb16_offset_units",
        "16-bit atoms",
        "ldb16's immediate / register offset and ldb16step's increment count 16-bit atoms "
        "(scaled to the access size like ld64step's 64-bit atoms)",
        "Tile Vertex ISA hover ldb16step 'scaled to atom size'; the ldb16 offset scale assumed",
    ),
    # -- integer, indexing and rearrangement kernels ---------------------------------------------
    Assumption(
        "trap_reports",
        ("$m0", "$m1"),
        "trap zimm4 stops the tile with an exception event; the host reads the trapping "
        "context's $m0 and $m1 (our kernels put the failing position and value there, e.g. "
        "gather_rows: flat id position and id)",
        "trap: Tile Vertex ISA 'raise a patched breakpoint exception event' [R]; which "
        "registers the host reads back (debug interface) assumed",
    ),
)

_BY_KEY = {a.key: a for a in ASSUMPTIONS}


def value(key: str) -> object:
    """The value the emulator uses for assumption ``key``."""
    return _BY_KEY[key].value


def table_markdown() -> str:
    """The table as Markdown (README and ``kernel-run --assumptions``)."""
    rows = ["| key | value | rule | evidence |", "|---|---|---|---|"]
    for a in ASSUMPTIONS:
        rows.append(f"| `{a.key}` | `{a.value}` | {a.rule} | {a.evidence} |")
    return "\n".join(rows)

# ruff: noqa: E501  (the mutant table keeps one mutant per line)
"""Mutation suite of the kernel templates: single-edit mutants, each run through kernel-run.

Each mutant changes one thing in one template (a pointer increment, a stride, a loop count,
a register number, a dropped sync, swapped operands, ...), is written to a temporary copy of
the template directory, and is run with ``kernel-run``'s API on a unit large enough to reach
the edited code (every worker has at least three rows, so the steady-state loop runs; the GEMM
short-row paths use units of 5 and 11 rows). A mutant is *caught* when kernel-run reports a
mismatch or a fault (or preflight rejects it).

    PYTHONPATH=src python3 benchmarks/kernel_mutations.py [--out benchmarks/results/kernel_mutations.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ipu_stack.kernels.kernel_run import kernel_run  # noqa: E402
from ipu_stack.kernels.registry import TEMPLATE_DIR  # noqa: E402

GEMM = "gemm_amp.S"
EW = "elementwise.S"
RA = "reduce_add.S"
BC = "broadcast.S"
GT = "gelu_tanh.S"
CAST = "cast.S"
RA = "reduce_add.S"
CAST = "cast.S"
G_IL = "gemm_f16_interleaved_k32_c48_r20_r25"  # two row counts, 2 K groups, 3 column groups
G_STD = "gemm_f16_k32_c32_r19_r19"
G_F8 = "gemm_f8_interleaved_k64_c32_r20_r20"
G_PK = "gemm_f16_interleaved_packed16_k32_c48_r20_r20"
G_SHORT = "gemm_f16_interleaved_k32_c48_r5_r11"  # workers with no row, one row and two rows
G_SHORT_11 = "gemm_f16_interleaved_k32_c48_r11_r11"  # one worker with one row

# (template, unit, what, old text, new text, occurrence (0-based) of old)
MUTANTS: list[tuple[str, str, str, str, str, int]] = [
    (
        GEMM,
        G_IL,
        "K-group pointer increment 0",
        "add $m4, $m4, INNER_GROUP_BYTES",
        "add $m4, $m4, 0",
        0,
    ),
    (GEMM, G_IL, "inner loop decrement -2", "add $m7, $m7, -1", "add $m7, $m7, -2", 0),
    (GEMM, G_IL, "column loop decrement -2", "add $m6, $m6, -1", "add $m6, $m6, -2", 0),
    (
        GEMM,
        G_IL,
        "output column-group stride 0",
        "add $m2, $m2, COLUMN_GROUP_BYTES",
        "add $m2, $m2, 0",
        0,
    ),
    (GEMM, G_IL, "rpt body 3 -> 1", "rpt $m5, 3", "rpt $m5, 1", 0),
    (
        GEMM,
        G_IL,
        "dropped sync after the workers' launch",
        " sync SYNC_ZONE_LOCAL\n brnz $m7",
        " brnz $m7",
        0,
    ),
    (
        GEMM,
        G_IL,
        "input row jump +1 atom",
        ".set INPUT_ROW_JUMP, LEFT_ROW_BYTES / 8 - 3",
        ".set INPUT_ROW_JUMP, LEFT_ROW_BYTES / 8 - 2",
        0,
    ),
    (
        GEMM,
        G_IL,
        "output row jump -1 atom",
        ".set OUTPUT_ROW_JUMP, OUTPUT_ROW_BYTES / 8 - 3",
        ".set OUTPUT_ROW_JUMP, OUTPUT_ROW_BYTES / 8 - 4",
        0,
    ),
    (
        GEMM,
        G_IL,
        "store row code NEXT",
        "PACE3_STORE_ROW, 0b100000",
        "PACE3_STORE_ROW, 0b000000",
        0,
    ),
    (GEMM, G_IL, "load row code NEXT", "PACE3_LOAD_ROW, 0b001001", "PACE3_LOAD_ROW, 0b000000", 0),
    (GEMM, G_IL, "prologue row code NEXT", ".set PACE2_ROW, 0b1001", ".set PACE2_ROW, 0b0000", 0),
    (
        GEMM,
        G_IL,
        "partials stride uses field 0",
        ".set PACE2_ROW, 0b1001",
        ".set PACE2_ROW, 0b0101",
        0,
    ),
    (
        GEMM,
        G_IL,
        "AMP phase P1 -> P2 in the loop",
        "GEMM_AMP $a6:7, $a0:1, \\partials, GEMM_AMP_P1\n }\n {\n  ld2xst64pace $a0:3, $a6:7, $m8:9+=, $m7, PACE3_LOAD_ROW",
        "GEMM_AMP $a6:7, $a0:1, \\partials, GEMM_AMP_P2\n }\n {\n  ld2xst64pace $a0:3, $a6:7, $m8:9+=, $m7, PACE3_LOAD_ROW",
        0,
    ),
    (
        GEMM,
        G_IL,
        "AMP input register $a0:1 -> $a2:3",
        "GEMM_AMP $a6:7, $a0:1, \\partials, GEMM_AMP_P3\n }\n {\n  ld2xst64pace",
        "GEMM_AMP $a6:7, $a2:3, \\partials, GEMM_AMP_P3\n }\n {\n  ld2xst64pace",
        0,
    ),
    (
        GEMM,
        G_IL,
        "swapped AMP input and partials",
        "GEMM_AMP $a6:7, $a0:1, \\partials, GEMM_AMP_P0\n }\n {\n  rpt",
        "GEMM_AMP $a6:7, \\partials, $a0:1, GEMM_AMP_P0\n }\n {\n  rpt",
        0,
    ),
    (
        GEMM,
        G_IL,
        "tapack left/output swapped",
        "tapack $m8:9, $m1, $m2, $m2",
        "tapack $m8:9, $m2, $m1, $m2",
        0,
    ),
    (
        GEMM,
        G_IL,
        "store to the left operand",
        "tapack $m8:9, $m1, $m2, $m2",
        "tapack $m8:9, $m1, $m2, $m1",
        0,
    ),
    (
        GEMM,
        G_IL,
        "row partition: no remainder",
        "setzi $m6, PART_ROWS + 1",
        "setzi $m6, PART_ROWS",
        0,
    ),
    (
        GEMM,
        G_IL,
        "row offset ignores remainder",
        ".set PART_START, \\w * PART_ROWS + PART_EXTRA",
        ".set PART_START, \\w * PART_ROWS",
        0,
    ),
    (
        GEMM,
        G_IL,
        "left row bytes wrong",
        "setzi $m7, PART_START * LEFT_ROW_BYTES",
        "setzi $m7, PART_START * (OUTPUT_ROW_BYTES + 8)",
        0,
    ),
    (
        GEMM,
        G_IL,
        "output row offset wrong",
        "setzi $m7, PART_START * OUTPUT_ROW_BYTES",
        "setzi $m7, PART_START * (LEFT_ROW_BYTES - 8)",
        0,
    ),
    (GEMM, G_IL, "no accumulator clear", "uput $FP_CLR, $a6", "fnop", 0),
    (GEMM, G_IL, "rpt count register $m5 -> $m4", "rpt $m5, 3", "rpt $m4, 3", 0),
    (
        GEMM,
        G_IL,
        "one fewer steady-state row",
        "add $m8, $m8, -2",
        "add $m8, $m8, -3",
        0,
    ),
    (
        GEMM,
        G_IL,
        "drain store dropped",
        " st64pace $a6:7, $m8:9+=, $m7, PACE1_NEXT\n.Lgemm_worker_exit",
        " nop\n.Lgemm_worker_exit",
        0,
    ),
    (
        GEMM,
        G_IL,
        "drain AMP phase P3 -> P2",
        "GEMM_AMP $a6:7, $azeros, $azeros, GEMM_AMP_P3",
        "GEMM_AMP $a6:7, $azeros, $azeros, GEMM_AMP_P2",
        0,
    ),
    (
        GEMM,
        G_IL,
        "init flag inverted",
        "GEMM_ENTRY GEMM_INIT_SMALL_SYMBOL, .Lgemm_worker_zero",
        "GEMM_ENTRY GEMM_INIT_SMALL_SYMBOL, .Lgemm_worker_accumulate",
        0,
    ),
    (
        GEMM,
        G_IL,
        "large entry uses small rows",
        "GEMM_ENTRY GEMM_INIT_LARGE_SYMBOL, .Lgemm_worker_zero, .Lgemm_partition_large",
        "GEMM_ENTRY GEMM_INIT_LARGE_SYMBOL, .Lgemm_worker_zero, .Lgemm_partition_small",
        0,
    ),
    (GEMM, G_IL, "zeroing kept after first group", " setzi $m0, .Lgemm_worker_accumulate\n", "", 0),
    (
        GEMM,
        G_IL,
        "CWEI slot order swapped",
        ".irp group, 0, 32, 8, 40, 16, 48, 24, 56\n#ifdef",
        ".irp group, 32, 0, 8, 40, 16, 48, 24, 56\n#ifdef",
        0,
    ),
    (
        GEMM,
        G_IL,
        "weight K row stride wrong",
        " add $m5, $m5, RIGHT_ROW_BYTES\n .endif\n ld128putcs",
        " add $m5, $m5, KROW_BYTES\n .endif\n ld128putcs",
        0,
    ),
    (
        GEMM,
        G_IL,
        "right column group stride 0",
        " add $m9, $m9, RIGHT_GROUP_BYTES",
        " add $m9, $m9, 0",
        0,
    ),
    (
        GEMM,
        G_IL,
        "every worker given worker 0's vertex state",
        "runall $m0, $m11, WORKER_FRAME_WORDS",
        "runall $m0, $m11, 0",
        0,
    ),
    (
        GEMM,
        G_IL,
        "worker output reads its left pointer",
        "ld32 $m2, $mvertex_base, $mzero, WF_OUTPUT",
        "ld32 $m2, $mvertex_base, $mzero, WF_LEFT",
        0,
    ),
    (
        GEMM,
        G_IL,
        "worker 0's left pointer not advanced",
        "st32 $m4, $m11, $mzero, WF_LEFT",
        "st32 $m3, $m11, $mzero, WF_LEFT",
        0,
    ),
    (
        GEMM,
        G_IL,
        "worker left pointers ignore their offsets",
        "add $m8, $m8, $m4",
        "add $m8, $m4, 0",
        0,
    ),
    (
        GEMM,
        G_IL,
        "worker output pointers ignore their offsets",
        "add $m8, $m8, $m2",
        "add $m8, $m2, 0",
        0,
    ),
    (
        GEMM,
        G_IL,
        "output pointers all written to worker 0's state",
        "st32 $m8, $m11, $mzero, \\w * WORKER_FRAME_WORDS + WF_OUTPUT",
        "st32 $m8, $m11, $mzero, WF_OUTPUT",
        0,
    ),
    (
        GEMM,
        G_IL,
        "extra-row workers' rpt count one short",
        "add $m6, $m6, -2",
        "add $m6, $m6, -3",
        0,
    ),
    (
        GEMM,
        G_IL,
        "first worker of each column group not reloaded",
        "ld32 $m0, $m11, $mzero, FRAME_FIRST_WORKER",
        "setzi $m0, .Lgemm_worker_accumulate",
        0,
    ),
    (
        GEMM,
        G_SHORT,
        "no-row test inverted",
        "brnz $m5, .Lgemm_worker_exit_\\@",
        "brz $m5, .Lgemm_worker_exit_\\@",
        0,
    ),
    (
        GEMM,
        G_SHORT,
        "short-row test misses one row",
        "cmpslt $m3, $m5, 0",
        "cmpslt $m3, $m5, -1",
        0,
    ),
    (
        GEMM,
        G_SHORT,
        "one-row path skips the drain",
        "bri .Lgemm_worker_drain_\\@",
        "bri .Lgemm_worker_exit_\\@",
        0,
    ),
    (
        GEMM,
        G_SHORT,
        "one-row path drops phase P3",
        "  nop\n  GEMM_AMP $a6:7, $a0:1, \\partials, GEMM_AMP_P3",
        "  nop\n  fnop",
        0,
    ),
    (
        GEMM,
        G_SHORT_11,
        "short paths left out at 11 rows",
        ".set SHORT_WORKERS, GEMM_SMALL_ROWS < 2 * WORKER_CONTEXTS",
        ".set SHORT_WORKERS, GEMM_SMALL_ROWS < WORKER_CONTEXTS",
        0,
    ),
    (
        GEMM,
        G_STD,
        "ld64putcs slot +1",
        "ld64putcs (\\group + \\slot)",
        "ld64putcs (\\group + \\slot + 1)",
        0,
    ),
    (
        GEMM,
        G_STD,
        "standard weight K row stride",
        " add $m5, $m5, RIGHT_ROW_BYTES\n .endif\n ld64putcs",
        " add $m5, $m5, 0\n .endif\n ld64putcs",
        0,
    ),
    (
        GEMM,
        G_F8,
        "F8 input format F16",
        "#define GEMM_INPUT_FORMAT FP_INFMT_F143",
        "#define GEMM_INPUT_FORMAT FP_INFMT_F16",
        0,
    ),
    (
        GEMM,
        G_F8,
        "F8 scale not written",
        "put CSR_S_FP_ISCL__INDEX, $m5",
        "put CSR_S_FP_ISCL__INDEX, $mzero",
        0,
    ),
    (GEMM, G_F8, "F8 K micro 16", "#define GEMM_K_MICRO 32", "#define GEMM_K_MICRO 16", 0),
    (
        GEMM,
        G_PK,
        "packed group skip wrong",
        "* OUTPUT_ROW_BYTES + COLUMN_GROUP_BYTES",
        "* OUTPUT_ROW_BYTES",
        0,
    ),
    (
        GEMM,
        G_PK,
        "packed group counter not reset",
        " setzi $m1, GROUP_COLUMN_GROUPS\n bri",
        " bri",
        0,
    ),
    (EW, "add_f16_n1000", "add -> mul", "#define EW_INSN f16v4add", "#define EW_INSN f16v4mul", 0),
    (
        EW,
        "add_f32_n998",
        "f32 add -> f16 add",
        "#define EW_INSN f32v2add",
        "#define EW_INSN f16v4add",
        0,
    ),
    (
        EW,
        "mul_f16_n1000",
        "second operand = first",
        "ld64step $a2:3, $m2, $m4+=, 0",
        "ld64step $a2:3, $m1, $m4+=, 0",
        0,
    ),
    (
        EW,
        "add_f16_n1000",
        "worker stride 5",
        "st64step $a4:5, $m3, $m4+=, WORKER_CONTEXTS",
        "st64step $a4:5, $m3, $m4+=, 5",
        0,
    ),
    (EW, "add_f16_n1000", "worker start atom 0", "shl $m4, $m0, 3", "shl $m4, $mzero, 3", 0),
    (
        EW,
        "add_f16_n1000",
        "count rounding down",
        "add $m5, $m5, ATOMS + WORKER_CONTEXTS - 1",
        "add $m5, $m5, ATOMS",
        0,
    ),
    (EW, "add_f16_n1000", "rpt body 3 -> 2", "rpt $m5, 3", "rpt $m5, 2", 0),
    (EW, "copy_b1024", "copy body 1 -> 0", "rpt $m5, 1", "rpt $m5, 0", 0),
    (
        EW,
        "copy_b1024",
        "copy source = destination",
        "ld64step $a0:1, $m1, $m4+=, 0\n  fnop\n }\n {\n  st64step $a0:1",
        "ld64step $a0:1, $m3, $m4+=, 0\n  fnop\n }\n {\n  st64step $a0:1",
        0,
    ),
    (EW, "copy_b1004", "word copy body 1 -> 0", "rpt $m5, 1", "rpt $m5, 0", 1),
    (EW, "copy_b1004", "word copy start as atoms", "shl $m4, $m0, 2", "shl $m4, $m0, 3", 0),
    (
        EW,
        "copy_b1004",
        "word copy stride 5",
        "st32step $a0, $m3, $m4+=, WORKER_CONTEXTS",
        "st32step $a0, $m3, $m4+=, WORKER_CONTEXTS - 1",
        0,
    ),
    (
        EW,
        "fill_zero_b1000",
        "fill stride 7",
        "st64step $azeros, $m3, $m4+=, WORKER_CONTEXTS",
        "st64step $azeros, $m3, $m4+=, 7",
        0,
    ),
    (EW, "add_f16_n1000", "dropped sync", " sync SYNC_ZONE_LOCAL\n", "", 0),
    (
        EW,
        "add_f16_n1000",
        "operands swapped in frame",
        "st32 $m3, $m11, $mzero, FRAME_A",
        "st32 $m4, $m11, $mzero, FRAME_A",
        0,
    ),
    (
        RA,
        "reduce_add_f16_p3_n200",
        "prior output not added",
        "f16v2tof32 $a2:3, $a0\n }\n {\n  nop\n  f16v2tof32 $a4:5, $a1",
        "f16v2tof32 $a2:3, $azero\n }\n {\n  nop\n  f16v2tof32 $a4:5, $a1",
        1,  # the second copy: the register form (the first is the address-table worker)
    ),
    (
        RA,
        "reduce_add_f16_p3_n200",
        "one partial dropped",
        " .set RA_INPUTS_LEFT, RA_INPUTS\n",
        " .set RA_INPUTS_LEFT, RA_INPUTS - 1\n",
        0,
    ),
    (
        RA,
        "reduce_add_f16_p3_n200",
        "high halves added to low",
        "f32v2add $a4:5, $a4:5, $a6:7",
        "f32v2add $a2:3, $a2:3, $a6:7",
        0,
    ),
    (
        RA,
        "reduce_add_f16_p3_n200",
        "input register repeated",
        ".irp reg, $m1, $m2, $m6",
        ".irp reg, $m1, $m1, $m6",
        0,
    ),
    (
        RA,
        "reduce_add_f32_p2_n200",
        "rpt body one short",
        "rpt $m5, BODY - 1",
        "rpt $m5, BODY - 2",
        0,
    ),
    (
        RA,
        "reduce_add_f32_p2_n200",
        "frame input 1 not stored",
        " st32 $m4, $m11, $mzero, FRAME_IN + 1\n",
        "",
        0,
    ),
    (
        CAST,
        "cast_f16_f32_n1000",
        "output stride 6 atoms",
        "st64step $a4:5, $m3, $m6+=, 2 * WORKER_CONTEXTS - 1",
        "st64step $a4:5, $m3, $m6+=, WORKER_CONTEXTS",
        0,
    ),
    (
        CAST,
        "cast_f16_f32_n1000",
        "halves swapped",
        "f16v2tof32 $a2:3, $a0\n",
        "f16v2tof32 $a2:3, $a1\n",
        0,
    ),
    (
        CAST,
        "cast_f32_f16_n1000",
        "second input atom offset",
        "ld64step $a0:1, $m1, $m4+=, 1",
        "ld64step $a0:1, $m1, $m4+=, 2",
        0,
    ),
    (
        CAST,
        "cast_f32_f16_n1000",
        "worker output start",
        "shl $m6, $m0, 3               // output: one atom",
        "shl $m6, $m0, 4               // output: one atom",
        0,
    ),
    (
        GT,
        "gelu_tanh_f16_n1000",
        "c1 constant bit flipped",
        ".set C1_BITS, 0x3D372713",
        ".set C1_BITS, 0x3D372717",
        0,
    ),
    (
        GT,
        "gelu_tanh_f16_n1000",
        "tanh of the wrong lane",
        "f32tanh $a7, $a7",
        "f32tanh $a7, $a6",
        0,
    ),
    (
        GT,
        "gelu_tanh_f16_n1000",
        "x^2 instead of x^3",
        "f32v2mul $a6:7, $a6:7, \\p\n",
        "f32v2mul $a6:7, $a6:7, $a12:13\n",
        0,
    ),
    (
        GT,
        "gelu_tanh_f16_n1000",
        "half constant slot",
        "ld64 $a12:13, $mvertex_base, $mzero, FRAME_HALF",
        "ld64 $a12:13, $mvertex_base, $mzero, FRAME_C0",
        0,
    ),
    (
        BC,
        "add_f16_rowbcast_r20_c64",
        "vector offset not reset per row",
        " zero $m7 ",
        " add $m7, $m7, 0 ",
        0,
    ),
    (
        BC,
        "add_f16_rowbcast_r20_c64",
        "row stride of one worker",
        "add $m6, $m6, WORKER_CONTEXTS * ROW_BYTES",
        "add $m6, $m6, ROW_BYTES",
        0,
    ),
    (
        BC,
        "add_f16_rowbcast_r20_c64",
        "vector walks two atoms",
        "ld64step $a2:3, $m2, $m7+=, 1",
        "ld64step $a2:3, $m2, $m7+=, 2",
        0,
    ),
    (
        BC,
        "mul_f32_rowbcast_r20_c32",
        "mul reads a twice",
        "ld64step $a2:3, $m2, $m7+=, 1",
        "ld64step $a2:3, $m1, $m7+=, 1",
        0,
    ),
    (
        RA,
        "reduce_add_f16_p15_n64",
        "table walk skips an entry",
        "ld32step $m1, $mzero, $m9+=, 1",
        "ld32step $m1, $mzero, $m9+=, 2",
        0,
    ),
    (
        RA,
        "reduce_add_f16_p15_n64",
        "one partial short",
        " setzi $m10, RA_INPUTS\n",
        " setzi $m10, RA_INPUTS - 1\n",
        0,
    ),
    (
        RA,
        "reduce_add_f32_p9_n64",
        "atom stride 5",
        " add $m4, $m4, 8 * WORKER_CONTEXTS\n",
        " add $m4, $m4, 8 * 5\n",
        0,
    ),
]

# integer, indexing and rearrangement templates (kernels/units_indexing.py)
TR, GA, CC, SE, AM = "transpose.S", "gather.S", "concat.S", "select.S", "argmax.S"
MUTANTS += [
    (
        TR,
        "transpose_f16_x10_s7",
        "staging column step of one worker",
        "add $m4, $m4, WORKER_CONTEXTS * EB",
        "add $m4, $m4, EB",
        0,
    ),
    (
        TR,
        "transpose_f32_x9_s5_i64_o3",
        "column offset dropped",
        "add $m1, $m0, TR_COL",
        "add $m1, $m0, 0",
        0,
    ),
    (
        TR,
        "transpose_f16_x10_s7",
        "staging stride one element short",
        "setzi $m5, TR_ISTRIDE / EB",
        "setzi $m5, TR_ISTRIDE / EB - 1",
        0,
    ),
    (
        TR,
        "transpose_f8_x13_s12",
        "output row skip of one worker",
        "setzi $m10, (WORKER_CONTEXTS - 1) * TR_OSTRIDE",
        "setzi $m10, WORKER_CONTEXTS * TR_OSTRIDE",
        0,
    ),
    (
        GA,
        "gather_rows_f16_n20_w7_v9_i4x5",
        "row offset not subtracted",
        "sub $m0, $m0, $m4",
        "sub $m0, $m0, $mzero",
        0,
    ),
    (
        GA,
        "gather_rows_f16_n20_w7_v9_i4x5",
        "ids row padding not skipped",
        "add $m3, $m3, GATHER_ID_STRIDE - 4 * GATHER_ID_COLS",
        "add $m3, $m3, 0",
        0,
    ),
    (
        GA,
        "gather_rows_f32_n13_w8_v5",
        "block rows bound one short",
        "cmpult $m1, $m0, GATHER_ROWS",
        "cmpult $m1, $m0, GATHER_ROWS - 1",
        0,
    ),
    (
        GA,
        "gather_rows_f16_n20_w7_v9_i4x5",
        "partial word not masked",
        "and $m0, $m0, $m1",
        "or $m0, $m0, $mzero",
        0,
    ),
    (
        GA,
        "gather_rows_f32_n13_w8_v5",
        "copy loop one word short",
        "setzi $m7, FULL_WORDS",
        "setzi $m7, FULL_WORDS - 1",
        0,
    ),
    (
        CC,
        "concat_f16_r9_w3x5x1",
        "input walks two elements",
        "LOAD_STEP CONCAT_BITS, $m0, $mzero, $m3, 1",
        "LOAD_STEP CONCAT_BITS, $m0, $mzero, $m3, 2",
        0,
    ),
    (
        CC,
        "concat_f32_r13_w5x3",
        "input row stride of row 0",
        "mul $m1, $m1, $m10",
        "mul $m1, $m1, $m0",
        0,
    ),
    (
        CC,
        "concat_f8_r7_w3x2x9x1x4x2",
        "inputs 4 and 5 swapped",
        "st32 $m7, $m11, $mzero, FRAME_IN + 4",
        "st32 $m8, $m11, $mzero, FRAME_IN + 4",
        0,
    ),
    (
        SE,
        "where_f32_r9_c6",
        "where picks the wrong side",
        "brnz $m11, .Lse_keep",
        "brz $m11, .Lse_keep",
        0,
    ),
    (SE, "equal_f32_r11_c6", "NaN equals itself", "xor $m11, $m11, 1", "or $m11, $mzero, 1", 0),
    (
        SE,
        "mul_i32_r7_c9_bfr",
        "row vector advances per row",
        "ROW_POINTER 1, $m4, SEL_IN1_RSTEP",
        "ROW_POINTER 1, $m4, SEL_IN0_RSTEP",
        0,
    ),
    (
        SE,
        "add_i32_r13_c5",
        "add reads a twice",
        "LOAD_STEP SEL_IN1_BITS, $m1, $mzero, $m4, SEL_IN1_CSTEP",
        "LOAD_STEP SEL_IN1_BITS, $m1, $mzero, $m3, SEL_IN1_CSTEP",
        0,
    ),
    (
        AM,
        "argmax_f32_r8_c3",
        "last maximum instead of first",
        "cmpslt $m1, $m4, $m0",
        "cmpslt $m1, $m0, $m4",
        0,
    ),
    (
        AM,
        "argmax_f16_r9_c5",
        "negative keys not negated",
        "sub $m1, $mzero, $m1",
        "add $m1, $mzero, $m1",
        0,
    ),
    (
        AM,
        "argmax_i32_r20_c2",
        "index of the element after",
        "sub $m5, $m5, $m7",
        "sub $m5, $m5, $m7\n add $m5, $m5, 1",
        0,
    ),
]
CI = "cast_i32.S"
MUTANTS += [
    (
        CI,
        "cast_i32_f16_r9_c5",
        "ties rounded up, not to even",
        "and $m5, $m5, 1",
        "and $m5, $m5, 0",
        0,
    ),
    (
        CI,
        "cast_f32_i32_r9_c7",
        "saturation exponent one low",
        ".set SAT_E, 158",
        ".set SAT_E, 157",
        0,
    ),
    (CI, "cast_f16_i32_r7_c5", "NaN not zeroed", "brnz $m4, .Lci_zero\\@", "nop", 0),
    (
        CI,
        "cast_i32_f32_r11_c6",
        "exact range one bit short",
        "cmpult $m1, $m4, MB + 1",
        "cmpult $m1, $m4, MB",
        0,
    ),
]
CF = "cast_f8.S"
MUTANTS += [
    (
        CF,
        "cast_f32_f8_r9_c7",
        "ties rounded up, not to even",
        "and $m5, $m5, 1",
        "and $m5, $m5, 0",
        0,
    ),
    (CF, "cast_f32_f8_r9_c7", "no clip at 240", "cmpult $m1, $m5, $m0", "cmpult $m1, $m0, $m0", 0),
    (
        CF,
        "cast_f16_f8_r7_c6_e3",
        "scale ignored",
        ".set SCALE_ADD, -(CF_SCALE)",
        ".set SCALE_ADD, 0",
        0,
    ),
    (
        CF,
        "cast_f8_f16_r9_c29_em6",
        "subnormal shift one short",
        "add $m1, $m1, 1\n sub $m1, $m1, $m4",
        "sub $m1, $m1, $m4",
        0,
    ),
    (
        CF,
        "cast_f8_f16_r12_c22",
        "F8 subnormal exponent one off",
        "add $m4, $m4, 1 - BIASI - MBI + SCALE_ADD",
        "add $m4, $m4, 2 - BIASI - MBI + SCALE_ADD",
        0,
    ),
    (CF, "cast_f32_f8_r9_c7", "negative zero kept", "brz $m0, .Lcf_end\\@", "nop", 0),
]
# Row-wise kernels (layer_norm.S, softmax.S and their shared macros rowwise.h): units whose
# workers have 3 or 4 rows and whose rows split into pairwise blocks with a remainder.
LN, SM, RWH = "layer_norm.S", "softmax.S", "rowwise.h"
LN16, LN32 = "layer_norm_f16_r20_c140", "layer_norm_f32_r20_c138"
SM16, SM32 = "softmax_f16_r20_c140", "softmax_f32_r20_c138"
MUTANTS += [
    (LN, LN16, "input row stride of one worker", "add $m1, $m1, WORKER_CONTEXTS * ROW_BYTES", "add $m1, $m1, ROW_BYTES", 0),
    (LN, LN32, "output row stride one row short", "add $m2, $m2, WORKER_CONTEXTS * ROW_BYTES", "add $m2, $m2, (WORKER_CONTEXTS - 1) * ROW_BYTES", 0),
    (LN, LN16, "epsilon slot", "ld64 $a12:13, $mvertex_base, $mzero, PAIR_EPS", "ld64 $a12:13, $mvertex_base, $mzero, PAIR_C", 0),
    (LN, LN32, "variance sums x, not (x - mean)^2", "PW COLS, 0, 0, 2", "PW COLS, 0, 0, 1", 0),
    (LN, LN32, "scale read from the bias", "ld64 $a12:13, $m3, $m9, 0", "ld64 $a12:13, $m4, $m9, 0", 0),
    (LN, LN16, "dropped sync before the return", " sync SYNC_ZONE_LOCAL", " nop", 2),
    (LN, "reduce_mean_f32_r20_c138", "mean output row stride 4", "add $m2, $m2, WORKER_CONTEXTS * 8", "add $m2, $m2, WORKER_CONTEXTS * 4", 0),
    (RWH, LN32, "pairwise block one group of 8 short", "setzi $m8, (\\n) / 8", "setzi $m8, (\\n) / 8 - 1", 0),
    (RWH, LN32, "divisor low half negated", "FP f32v2sub $a6:7, $a0:1, $a4:5          // bl = b - bh", "FP f32v2sub $a6:7, $a4:5, $a0:1          // bl = b - bh", 0),
    (RWH, LN32, "pairwise split not a multiple of 8", ".set rw_h\\@, (\\n) / 2 - ((\\n) / 2) % 8", ".set rw_h\\@, (\\n) / 2", 0),
    (RWH, SM32, "exp of the wrong lane", "FP f32exp $a13, $a13", "FP f32exp $a13, $a12", 0),
    (SM, SM16, "sum floor -FLT_MAX instead of 1", "FP f32max $a14, $a14, $a13", "FP f32max $a14, $a14, $a12", 0),
    (SM, SM32, "output offset not reset per row", " zero $m9", " add $m9, $m9, 0", 0),
    (SM, SM16, "reciprocal of the wrong register", "FP f32oox $a1, $a14", "FP f32oox $a1, $a13", 0),
    # fewer than six rows: statistics by worker r, then the elements split over all workers
    (LN, "layer_norm_f16_r3_c100", "dropped sync between statistics and elements", " sync SYNC_ZONE_LOCAL", " nop", 1),
    (LN, "layer_norm_f16_r3_c140", "dropped sync between the split pairwise steps", " sync SYNC_ZONE_LOCAL", " nop", 0),
    (RWH, "layer_norm_f32_r2_c300", "block owner counter wraps at 7", "cmpeq $m10, $m9, WORKER_CONTEXTS", "cmpeq $m10, $m9, WORKER_CONTEXTS + 1", 0),
    (LN, "layer_norm_f16_r3_c302", "block tables of all rows at row 0", " add $m2, $m2, ROW_BYTES", " add $m2, $m2, 0", 0),
    (LN, "layer_norm_f32_r2_c138", "split elements one pair apart", "NORMALIZE WORKER_CONTEXTS", "NORMALIZE 1", 0),
    (SM, "softmax_f32_r3_c138", "every row uses row 0's statistics", " add $m6, $m6, SCRATCH_BYTES", " add $m6, $m6, 0", 0),
    (SM, "softmax_f16_r1_c300", "split starts at pair 0 on every worker", " mul $m10, $m0, 2 * EB", " mul $m10, $m0, 0", 1),
    (SM, "softmax_f32_r3_c270", "partial maxima start at pair 0", " mul $m10, $m0, 2 * EB", " mul $m10, $m0, 0", 0),
    (SM, "softmax_f16_r2_c300", "top from five partial maxima", " .rept WORKER_CONTEXTS", " .rept WORKER_CONTEXTS - 1", 0),
    (SM, "softmax_f32_r3_c270", "partial maxima of all rows in one word", " shl $m9, $m5, 2", " shl $m9, $m5, 0", 0),
]  # fmt: skip


def _source(root: Path, template: str, unit: str) -> Path:
    """The file kernel-run specialises: the template, or for an included file the unit's."""
    if template.endswith(".S"):
        return root / template
    return root / ("softmax.S" if unit.startswith("softmax") else "layer_norm.S")


# unary family (kernels/units_unary.py): exact GeLU, unary.S, the column form of broadcast.S
GE = "gelu_erf.S"
UN = "unary.S"
MUTANTS += [
    (GE, "gelu_f16_n200", "sign taken from the mask", "and64 $a6:7, $a2:3, $a14:15", "and64 $a6:7, $a4:5, $a14:15", 0),
    (GE, "gelu_f32_n100", "central/tail compare swapped", "f32v2cmplt $a4:5, $a6:7, $a14:15", "f32v2cmplt $a4:5, $a14:15, $a6:7", 0),
    (GE, "gelu_f16_n200", "tail Horner step dropped", " HORNER $a4:5, $a0:1, K_Q+5\n", "", 0),
    (GE, "gelu_f32_n100", "central coefficient slot", "HORNER $a0:1, $a10:11, K_P+2", "HORNER $a0:1, $a10:11, K_P+3", 0),
    (GE, "gelu_f16_n200", "exp of the wrong lane", "f32exp $a11, $a11", "f32exp $a11, $a10", 0),
    (GE, "gelu_f16_n200", "output stride 5 items", "st32step $a0, $m3, $m4+=, WORKER_CONTEXTS", "st32step $a0, $m3, $m4+=, WORKER_CONTEXTS - 1", 0),
    (GE, "gelu_f32_n100", "dropped sync before return", " sync SYNC_ZONE_LOCAL\n add $m11, $m11, FRAME_BYTES", " add $m11, $m11, FRAME_BYTES", 0),
    (GE, "gelu_f32_n100", "tail clamp at the wrong constant", "f32v2min $a10:11, $a6:7, $a14:15", "f32v2min $a10:11, $a6:7, $a12:13", 0),
    (GE, "gelu_f16_n200", "half constant replaced by one", "f32v2mul $a2:3, $a2:3, $a12:13         // x * 0.5", "f32v2mul $a2:3, $a2:3, $a14:15         // x * 0.5", 0),
    (GE, "gelu_f32_n100", "z of lane 1 from lane 0", "f32div $a5, $a3, $a12", "f32div $a5, $a2, $a12", 0),
    (GT, "gelu_tanh_f32_n100", "F32: 1 + tanh uses the half constant", "f32v2add $a6:7, $a14:15, $a6:7", "f32v2add $a6:7, $a12:13, $a6:7", 0),
    (GT, "gelu_tanh_f32_n100", "F32: x^2 instead of x^3", "f32v2mul $a6:7, $a6:7, \\p\n", "f32v2mul $a6:7, $a6:7, $a14:15\n", 2),
    (UN, "reciprocal_f16_col_r20", "column form: pads not masked", "  and64 $a6:7, $a6:7, $a12:13\n", "  fnop\n", 0),
    (UN, "sub_f32_colscalar_r30", "scalar b starts at the worker's row", "mul $m7, $m0, 8 * UN_B_STEP", "mul $m7, $m0, 8", 0),
    (UN, "div_f32_col_r14", "column b walks one atom short", "ld64step $a2:3, $m2, $m7+=, WORKER_CONTEXTS * UN_B_STEP", "ld64step $a2:3, $m2, $m7+=, WORKER_CONTEXTS * UN_B_STEP - 1", 0),
    (UN, "reciprocal_f32_col_r20_o4", "_o4: output rows 8 bytes apart", "st32step $a4, $m3, $m6+=, WORKER_CONTEXTS", "st32step $a4, $m3, $m6+=, 2 * WORKER_CONTEXTS", 0),
    (UN, "div_f32_colscalar_r20_o4", "_o4: workers start 8 bytes per row apart", "mul $m6, $m0, UN_OUT_STRIDE", "mul $m6, $m0, 8", 0),
    (UN, "reciprocal_f32_col_r20_o4", "_o4: the pad lane stored", "st32step $a4, $m3, $m6+=, WORKER_CONTEXTS", "st32step $a5, $m3, $m6+=, WORKER_CONTEXTS", 0),
    (UN, "sub_f16_col_r20_o4", "_o4 F16: the input stays at the worker's first row", "ld64step $a6:7, $m1, $m4+=, WORKER_CONTEXTS", "ld64step $a6:7, $m1, $m4+=, 0", 0),
    (BC, "rdiv_f16_rowbcast_r8_c12", "rdiv divides the wrong way", "F32DIV $a6, $a7, $a8, $a9, $a6, $a7", "F32DIV $a6, $a7, $a6, $a7, $a8, $a9", 0),
    (BC, "div_f32_rowbcast_r20_c32", "div lane 1 by lane 0's divisor", " F32DIV \\d0, \\d1, \\x0, \\x1, \\y0, \\y1", " F32DIV \\d0, \\d1, \\x0, \\x1, \\y0, \\y0", 0),
    (GE, "gelu_f32_n100", "frame 8 bytes short (writes the caller's stack)", " .set FRAME_BYTES, 208", " .set FRAME_BYTES, 200", 0),
    (UN, "sqrt_f32_n98", "one item too many (writes past the output)", "add $m5, $m5, ITEMS + WORKER_CONTEXTS - 1", "add $m5, $m5, ITEMS + WORKER_CONTEXTS", 0),
    (UN, "tanh_f16_n200", "tanh of lane 0 twice", "LANES2 f32tanh, $a4, $a5, $a0, $a1", "LANES2 f32tanh, $a4, $a5, $a0, $a0", 0),
    (UN, "sub_f32_n100", "sub operands swapped", "f32v2sub $a4:5, $a0:1, $a2:3", "f32v2sub $a4:5, $a2:3, $a0:1", 0),
    (UN, "div_f16_n200", "divisor read from the dividend", "ld32step $a7, $m2, $m4+=, 0", "ld32step $a7, $m1, $m4+=, 0", 0),
    (UN, "pow_f32_e3_n100", "x^3 computed as x^4", "f32v2mul $a4:5, $a4:5, $a0:1           // x^2 x", "f32v2mul $a4:5, $a4:5, $a4:5           // x^2 x", 0),
    (UN, "neg_f16_n200", "neg constant +1", ".set K_BITS, 0xBF800000", ".set K_BITS, 0x3F800000", 0),
    (UN, "relu_f16_n200", "relu max -> min", "f32v2max $a4:5, $a0:1, $a14:15", "f32v2min $a4:5, $a0:1, $a14:15", 0),
    (UN, "relu_f32_n100", "relu zero -> one", ".set K_BITS, 0  ", ".set K_BITS, 0x3F800000  ", 0),
    (UN, "max_f16_n200", "max -> min", "f32v2max $a4:5, $a0:1, $a2:3", "f32v2min $a4:5, $a0:1, $a2:3", 0),
    (UN, "min_f32_n100", "min of a with itself", "f32v2min $a4:5, $a0:1, $a2:3", "f32v2min $a4:5, $a0:1, $a0:1", 0),
    (UN, "sigmoid_f32_n98", "worker item count one short", "add $m5, $m5, ITEMS + WORKER_CONTEXTS - 1", "add $m5, $m5, ITEMS + WORKER_CONTEXTS - 2", 0),
    (BC, "add_f16_colbcast_r20_c64", "column not advanced per worker row", "add $m7, $m7, WORKER_CONTEXTS * 8 * BC_COL_STEP", "add $m7, $m7, 8 * BC_COL_STEP", 0),
    (BC, "mul_f32_colbcast_r20_c32", "second lane from the next row", "ld32 $a3, $m2, $m7, 0", "ld32 $a3, $m2, $m7, 2", 0),
    (BC, "mul_f16_colbcast_r20_c64", "column rows of one worker", "add $m6, $m6, ROW_BYTES * WORKER_CONTEXTS", "add $m6, $m6, ROW_BYTES", 0),
    (BC, "add_f16_colbcast_r20_c64", "second pair from the pad", "ldb16 $a3, $m2, $m7, 0", "ldb16 $a3, $m2, $m7, 1", 0),
]  # fmt: skip
# F32 GEMM (gemm_f32.S) and attention (attention.S): every worker has at least three rows.
GF32 = "gemm_f32.S"
ATT = "attention.S"
G_F32 = "gemm_f32_interleaved_k16_c32_r4_r20"  # small entry: idle workers; large: 3+ rows each
A_MASK = "attention_f16_r20_t13_d16_v8_causal_maskfull_f16"  # odd T: both mask halves; D = 4 chunks
A_F32 = "attention_f32_r20_t11_d6_v6"
MUTANTS += [
    (
        GF32,
        G_F32,
        "left walks 0 in the loop",
        "ld32step $a0, $m3, $m6+=, 1\n  f32v2mul $a4:5",
        "ld32step $a0, $m3, $m6+=, 0\n  f32v2mul $a4:5",
        0,
    ),
    (
        GF32,
        G_F32,
        "right row stride one pair short",
        "setzi $m11, COLUMN_PAIRS ",
        "setzi $m11, COLUMN_PAIRS - 1 ",
        0,
    ),
    (GF32, G_F32, "rpt count K-3", "setzi $m8, K_BLOCK - 2", "setzi $m8, K_BLOCK - 3", 0),
    (
        GF32,
        G_F32,
        "accumulate test inverted",
        "brnz $m9, .Lgemm_f32_store",
        "brz $m9, .Lgemm_f32_store",
        0,
    ),
    (GF32, G_F32, "column pair step 16", "add $m7, $m7, 8", "add $m7, $m7, 16", 0),
    (
        GF32,
        G_F32,
        "worker row step of 5 rows",
        "setzi $m0, WORKER_CONTEXTS * LEFT_ROW_BYTES",
        "setzi $m0, 5 * LEFT_ROW_BYTES",
        0,
    ),
    (
        GF32,
        G_F32,
        "loop adds the right operand",
        "f32v2add $a6:7, $a6:7, $a4:5",
        "f32v2add $a6:7, $a6:7, $a2:3",
        0,
    ),
    (GF32, G_F32, "dropped sync before return", " sync SYNC_ZONE_LOCAL\n add $m11", " add $m11", 0),
    (
        GF32,
        G_F32,
        "idle worker does not exit",
        " brz $m5, .Lgemm_f32_idle\n",
        "\n",
        0,
    ),
    (
        GF32,
        G_F32,
        "one row too few per worker",
        "add $m5, $m5, WORKER_CONTEXTS - 1",
        "add $m5, $m5, WORKER_CONTEXTS - 2",
        0,
    ),
    (
        ATT,
        A_MASK,
        "key chunk walks two atoms",
        "ld64step $a2:3, $m12, $m10+=, 1",
        "ld64step $a2:3, $m12, $m10+=, 2",
        0,
    ),
    (
        ATT,
        A_MASK,
        "key row from the query index",
        "mul $m6, $m2, QROW_BYTES",
        "mul $m6, $m1, QROW_BYTES",
        0,
    ),
    (
        ATT,
        A_MASK,
        "scale added, not multiplied",
        " f32mul $a12, $a12, $a0",
        " f32add $a12, $a12, $a0",
        0,
    ),
    (
        ATT,
        A_MASK,
        "mask halves swapped",
        "brnz $m0, .Latt_mask_odd",
        "brz $m0, .Latt_mask_odd",
        0,
    ),
    (
        ATT,
        A_MASK,
        "causal limit from the chunk row",
        "add $m5, $m5, $m4",
        "add $m5, $m5, $m1",
        0,
    ),
    (
        ATT,
        A_MASK,
        "causal clamp one key short",
        "min $m5, $m5, KEYS",
        "min $m5, $m5, KEYS - 1",
        0,
    ),
    (
        ATT,
        A_MASK,
        "exp pass does not walk",
        "st32step $a0, $m7, $m0+=, 1",
        "st32step $a0, $m7, $m0+=, 0",
        0,
    ),
    (
        ATT,
        A_MASK,
        "normalisation by l, not 1 / l",
        "f32div $a13, $a1, $a13",
        "f32max $a13, $a1, $a13",
        0,
    ),
    (
        ATT,
        A_MASK,
        "value row stride +1 atom",
        "setzi $m11, VROW_BYTES / 8 ",
        "setzi $m11, VROW_BYTES / 8 + 1 ",
        0,
    ),
    (
        ATT,
        A_MASK,
        "output pairs dealt with step 7",
        "add $m2, $m2, WORKER_CONTEXTS\n bri .Latt_output_wrap",
        "add $m2, $m2, 7\n bri .Latt_output_wrap",
        0,
    ),
    (
        ATT,
        A_MASK,
        "value lanes swapped",
        "f16v2tof32 $a4:5, $a2\n f16v2tof32 $a6:7, $a3",
        "f16v2tof32 $a4:5, $a3\n f16v2tof32 $a6:7, $a2",
        0,
    ),
    (
        ATT,
        A_MASK,
        "P V rpt body one bundle short",
        "rpt $m8, 5",
        "rpt $m8, 4",
        0,
    ),
    (
        ATT,
        A_MASK,
        "dot rpt body one bundle short",
        "rpt $m8, 7",
        "rpt $m8, 6",
        0,
    ),
    (
        ATT,
        A_MASK,
        "dropped sync between phases 2 and 3",
        " sync SYNC_ZONE_LOCAL\n setzi $m6, .Latt_output",
        " setzi $m6, .Latt_output",
        0,
    ),
    (
        ATT,
        A_MASK,
        "dropped sync before the next chunk",
        " sync SYNC_ZONE_LOCAL\n add $m1, $m1",
        " add $m1, $m1",
        0,
    ),
    (
        ATT,
        A_MASK,
        "running max starts at 1.0",
        "$mzero, FRAME_NEG_MAX",
        "$mzero, FRAME_ONE",
        0,
    ),
    (
        ATT,
        A_F32,
        "f32 dot adds instead of multiplying",
        "f32v2mul $a4:5, $a0:1, $a2:3",
        "f32v2add $a4:5, $a0:1, $a2:3",
        0,
    ),
    (
        ATT,
        A_F32,
        "chunk of five rows",
        "min $m6, $m6, WORKER_CONTEXTS",
        "min $m6, $m6, WORKER_CONTEXTS - 1",
        0,
    ),
]


# copy2d (elementwise.S EW_OP 6/7, kernels/units.py Copy2dUnit): 280 atoms of 64 bits in runs of 8,
# each worker's range starts inside a run (but worker 0's), spans 4-5 whole runs and ends inside one;
# the word form (EW_OP 7) on 40 runs of 15 words at addresses and strides 4 mod 8 for _a4.
C2, C2W, C2A4 = "copy2d_b64_r35", "copy2d_b60_r40", "copy2d_b64_r35_a4"
MUTANTS += [
    (EW, C2, "copy2d first chunk body 1 -> 0", "rpt $m5, 1", "rpt $m5, 0", 2),
    (EW, C2, "copy2d whole-run body 1 -> 0", "rpt $m9, 1", "rpt $m9, 0", 0),
    (EW, C2, "copy2d last chunk body 1 -> 0", "rpt $m8, 1", "rpt $m8, 0", 0),
    (EW, C2, "copy2d destination stride not applied (whole runs)", " add $m3, $m3, $m6\n", " add $m3, $m3, $mzero\n", 0),
    (EW, C2, "copy2d source stride not applied (last chunk)", " add $m1, $m1, $m2\n", " add $m1, $m1, $mzero\n", 1),
    (EW, C2, "copy2d source stride keeps the run bytes", "sub $m2, $m2, $m0", "sub $m2, $m2, $mzero", 0),
    (EW, C2, "copy2d destination stride keeps the run bytes", "sub $m6, $m6, $m0", "sub $m6, $m6, $mzero", 0),
    (EW, C2, "copy2d strides swapped in frame", "st32 $m6, $m11, $mzero, FRAME_DST_STRIDE", "st32 $m7, $m11, $mzero, FRAME_DST_STRIDE", 0),
    (EW, C2, "copy2d source read as the destination", "ld32 $m1, $mvertex_base, $mzero, FRAME_SRC", "ld32 $m1, $mvertex_base, $mzero, FRAME_OUT", 0),
    (EW, C2, "copy2d worker start offset 0", "setzi $m4, (C2_S_\\w - C2_R0_\\w * C2_ATOMS) * C2_UNIT", "setzi $m4, 0", 0),
    (EW, C2, "copy2d worker start run 0", "setzi $m9, C2_R0_\\w", "setzi $m9, 0", 0),
    (EW, C2, "copy2d ranges split by five", ".set C2_S_\\w, (\\w * C2_TOTAL) / WORKER_CONTEXTS", ".set C2_S_\\w, (\\w * C2_TOTAL) / (WORKER_CONTEXTS - 1)", 0),
    (EW, C2, "copy2d last chunk one atom more", "setzi $m8, C2_NL_\\w", "setzi $m8, C2_NL_\\w + 1", 0),
    (EW, C2, "copy2d first chunk one atom short", "setzi $m5, C2_N0_\\w", "setzi $m5, C2_N0_\\w - 1", 0),
    (EW, C2, "copy2d whole-run loop decrement -2", "add $m7, $m7, -1", "add $m7, $m7, -2", 0),
    (EW, C2, "copy2d whole-run loop brnz -> brz", "brnz $m7, .Lc2_full", "brz $m7, .Lc2_full", 0),
    (EW, C2, "copy2d every worker takes block 0", "mul $m0, $m0, .Lc2_w1 - .Lc2_w0", "mul $m0, $m0, 0", 0),
    (EW, C2, "copy2d store step 0", "st64step $a0:1, $m3, $m4+=, 1", "st64step $a0:1, $m3, $m4+=, 0", 0),
    (EW, C2, "copy2d dropped sync", " sync SYNC_ZONE_LOCAL\n", "", 1),
    (EW, C2W, "copy2d words: word store step 2", "st32step $a0, $m3, $m4+=, 1", "st32step $a0, $m3, $m4+=, 2", 0),
    (EW, C2W, "copy2d words: unit of 8 bytes", " .set C2_UNIT, 4", " .set C2_UNIT, 8", 0),
    (EW, C2A4, "copy2d words at 4 mod 8: load from the store's base", "ld32step $a0, $m1, $m4+=, 0", "ld32step $a0, $m3, $m4+=, 0", 1),
]  # fmt: skip


def _mutate(text: str, old: str, new: str, occurrence: int) -> str:
    start = -1
    for _ in range(occurrence + 1):
        start = text.find(old, start + 1)
        if start < 0:
            raise ValueError(f"mutation text not found: {old!r}")
    return text[:start] + new + text[start + len(old) :]


def run(out: Path | None, only: list[str] | None = None) -> dict:
    """Run every mutant (of the templates in ``only``, if given); return (and write) them."""
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "templates"
        shutil.copytree(TEMPLATE_DIR, root)
        for template, unit, what, old, new, occurrence in MUTANTS:
            if only and template not in only:
                continue
            original = (TEMPLATE_DIR / template).read_text()
            mutant = root / template
            mutant.write_text(_mutate(original, old, new, occurrence))
            start = time.perf_counter()
            report = kernel_run(unit, str(_source(root, template, unit)), seed=0)
            mutant.write_text(original)
            caught = not report["ok"]
            how = "fault" if "fault" in report else "mismatch" if caught else "survived"
            records.append({
                "template": template, "unit": unit, "mutation": what, "caught": caught,
                "how": how, "detail": report.get("fault", "")[:300],
                "seconds": round(time.perf_counter() - start, 2),
            })  # fmt: skip
            print(f"{'CAUGHT' if caught else 'SURVIVED'} {how:8} {template} {unit}: {what}")
    caught = sum(r["caught"] for r in records)
    result = {"mutants": len(records), "caught": caught,
              "caught_fraction": round(caught / len(records), 4), "records": records}  # fmt: skip
    print(f"{caught} of {len(records)} mutants caught ({100 * caught / len(records):.1f}%)")
    if out is not None:
        out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="results JSON (default: benchmarks/results/kernel_mutations.json "
                        "for the whole suite, none for a filtered run)")  # fmt: skip
    parser.add_argument("--only", nargs="+", metavar="TEMPLATE", default=[],
                        help="run only the mutants of these templates")  # fmt: skip
    parser.add_argument("--template", action="append", default=[],
                        help="run only the mutants of this template (repeatable)")  # fmt: skip
    args = parser.parse_args()
    only = [*args.only, *args.template]
    default_out = None if only else ROOT / "benchmarks/results/kernel_mutations.json"
    run(args.out or default_out, only or None)

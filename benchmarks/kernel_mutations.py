# ruff: noqa: E501  (the mutant table keeps one mutant per line)
"""Mutation suite of the kernel templates: single-edit mutants, each run through kernel-run.

Each mutant changes one thing in one template (a pointer increment, a stride, a loop count,
a register number, a dropped sync, swapped operands, ...), is written to a temporary copy of
the template directory, and is run with ``kernel-run``'s API on a unit large enough to reach
the edited code (every worker has at least three rows, so the steady-state loop runs). A
mutant is *caught* when kernel-run reports a mismatch or a fault (or preflight rejects it).

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
        "dropped sync before weight load",
        " sync SYNC_ZONE_LOCAL\n st32 $m2",
        " st32 $m2",
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
        "add $m5, $m5, $m1\n min",
        "add $m5, $m1, 0\n min",
        0,
    ),
    (
        GEMM,
        G_IL,
        "row offset ignores remainder",
        "add $m3, $m3, $m4\n brz",
        "add $m3, $m3, 0\n brz",
        0,
    ),
    (
        GEMM,
        G_IL,
        "left row bytes wrong",
        "mul $m4, $m3, LEFT_ROW_BYTES",
        "mul $m4, $m3, OUTPUT_ROW_BYTES + 8",
        0,
    ),
    (
        GEMM,
        G_IL,
        "output row offset wrong",
        "mul $m4, $m3, OUTPUT_ROW_BYTES",
        "mul $m4, $m3, LEFT_ROW_BYTES - 8",
        0,
    ),
    (GEMM, G_IL, "no accumulator clear", " uput $FP_CLR, $a6\n", "", 0),
    (GEMM, G_IL, "rpt count register $m5 -> $m4", "rpt $m5, 3", "rpt $m4, 3", 0),
    (
        GEMM,
        G_IL,
        "one fewer steady-state row",
        " add $m5, $m5, -1\n .p2align 3",
        " add $m5, $m5, -2\n .p2align 3",
        0,
    ),
    (
        GEMM,
        G_IL,
        "drain store dropped",
        " st64pace $a6:7, $m8:9+=, $m7, PACE1_NEXT\n.Lgemm_worker_idle",
        " nop\n.Lgemm_worker_idle",
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
        "GEMM_ENTRY GEMM_INIT_SMALL_SYMBOL, 1, GEMM_SMALL_ROWS",
        "GEMM_ENTRY GEMM_INIT_SMALL_SYMBOL, 0, GEMM_SMALL_ROWS",
        0,
    ),
    (
        GEMM,
        G_IL,
        "large entry uses small rows",
        "GEMM_ENTRY GEMM_INIT_LARGE_SYMBOL, 1, GEMM_LARGE_ROWS",
        "GEMM_ENTRY GEMM_INIT_LARGE_SYMBOL, 1, GEMM_SMALL_ROWS",
        0,
    ),
    (GEMM, G_IL, "zeroing kept after first group", " zero $m9\n", "", 0),
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
        " add $m5, $m5, RIGHT_GROUP_BYTES",
        " add $m5, $m5, 0",
        0,
    ),
    (
        GEMM,
        G_IL,
        "worker id mask dropped",
        "and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK",
        "and $m0, $m0, 0",
        0,
    ),
    (
        GEMM,
        G_IL,
        "frame output reads left",
        "ld32 $m2, $mvertex_base, $mzero, FRAME_OUTPUT",
        "ld32 $m2, $mvertex_base, $mzero, FRAME_LEFT",
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


def _mutate(text: str, old: str, new: str, occurrence: int) -> str:
    start = -1
    for _ in range(occurrence + 1):
        start = text.find(old, start + 1)
        if start < 0:
            raise ValueError(f"mutation text not found: {old!r}")
    return text[:start] + new + text[start + len(old) :]


def run(out: Path | None, only: set[str] | None = None) -> dict:
    """Run every mutant (of the templates in ``only``, if given); return (and write) results."""
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
            report = kernel_run(unit, str(mutant), seed=0)
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
    parser.add_argument(
        "--out", type=Path, default=None,
        help="results JSON (default benchmarks/results/kernel_mutations.json; none with --only)",
    )  # fmt: skip
    parser.add_argument("--only", action="append", metavar="TEMPLATE",
                        help="run only the mutants of this template file (repeatable)")  # fmt: skip
    args = parser.parse_args()
    default = None if args.only else ROOT / "benchmarks/results/kernel_mutations.json"
    run(args.out or default, set(args.only or ()))

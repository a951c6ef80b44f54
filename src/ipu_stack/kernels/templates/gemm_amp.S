// gemm_amp.S -- IPU21 AMP GEMM: out[rows, C] (+)= left[rows, K] @ right[K, C] on one tile.
//
// Written for ipu-stack from the ISA facts in shared/docs/ipu21-facts.md: registers and CSRs
// (§6), AMP micro blocks and the coefficient-store (CWEI) load order (§15), the instructions
// (§16.3), the supervisor/worker structure of the poplibs AMP 1x1 kernel (§16.4) and the
// codelet directives (§19.3). ipu_stack.kernels.preflight checks every variant before any
// assembler runs. Not yet assembled by popc or run on a C600: the AMP result latency below
// and the F8 phase flags are assumptions [I] to confirm on hardware.
//
// One compile unit per variant; kernels/registry.py (GemmVariant.flags) supplies:
//   GEMM_INNER_BLOCK_DIMENSION  K, a multiple of the K micro block (16 F16, 32 F8)
//   GEMM_OUTPUT_COLUMNS         C, a multiple of 16
//   GEMM_SMALL_ROWS, GEMM_LARGE_ROWS, GEMM_SINGLE_ROWS (when the two are equal)
//   GEMM_INTERLEAVED_WEIGHTS    ld128putcs weight feed (weights in interleaved memory)
//   GEMM_OUTPUT_GROUP           packed output: 16-row panels inside G-column groups
//   GEMM_NATIVE_FP8             F143 operands (f8v8hihov4amp); scale exponent in $m5
//   GEMM_{INIT,ACCUMULATE}_{SMALL,LARGE}_SYMBOL  entry symbols
//
// ABI (supervisor): $m2 output, $m3 left, $m4 right (row-major [K, C], as the registry and
// the lowering lay it out; LOAD_AMP_WEIGHTS feeds each K micro x C16 panel to the coefficient
// store K row by K row), $m5 F8 scale exponent, $m10 return address, $m11 stack (the call
// uses FRAME_BYTES below it: the six workers' vertex states and three words of its own).
//
// Structure (after poplibs' AMP 1x1 kernel, facts §16.4): the row partition is fixed per
// entry, so the supervisor writes it once per call into one vertex state per worker (runall
// with a per-worker base), and per panel only the pointers that move; a worker loads its
// state (5 issues, 7 when a worker may have fewer than two rows) and runs the AMP pipeline
// over its rows.
//
// Labels are unique per unit by construction: the dispatch loop, the partition set-up of
// each row count and the two worker entries are written once, outside any macro; GEMM_ENTRY
// defines only its own \name argument (a distinct entry symbol per instantiation) and the
// worker body macro's labels carry \@.
#include "ipu21_tile.h"

#ifndef GEMM_INNER_BLOCK_DIMENSION
#error "GEMM_INNER_BLOCK_DIMENSION (K) is required"
#endif
#ifndef GEMM_OUTPUT_COLUMNS
#error "GEMM_OUTPUT_COLUMNS (C) is required"
#endif
#ifndef GEMM_SMALL_ROWS
#error "GEMM_SMALL_ROWS is required"
#endif
#ifndef GEMM_LARGE_ROWS
#define GEMM_LARGE_ROWS GEMM_SMALL_ROWS
#endif
#ifndef GEMM_OUTPUT_GROUP
#define GEMM_OUTPUT_GROUP 0
#endif
#ifndef GEMM_STOCHASTIC_ROUNDING
#define GEMM_STOCHASTIC_ROUNDING 1
#endif

#ifdef GEMM_NATIVE_FP8
#define GEMM_AMP f8v8hihov4amp
#define GEMM_AMP_P0 TAMP_F8V8_E4_P0
#define GEMM_AMP_P1 TAMP_F8V8_E4_P1
#define GEMM_AMP_P2 TAMP_F8V8_E4_P2
#define GEMM_AMP_P3 TAMP_F8V8_E4_P3
#define GEMM_INPUT_BYTES 1
#define GEMM_K_MICRO 32
#define GEMM_INPUT_FORMAT FP_INFMT_F143
#else
#define GEMM_AMP f16v4hihov4amp
#define GEMM_AMP_P0 TAMP_F16V4_E4_P0
#define GEMM_AMP_P1 TAMP_F16V4_E4_P1
#define GEMM_AMP_P2 TAMP_F16V4_E4_P2
#define GEMM_AMP_P3 TAMP_F16V4_E4_P3
#define GEMM_INPUT_BYTES 2
#define GEMM_K_MICRO 16
#define GEMM_INPUT_FORMAT FP_INFMT_F16
#endif

 .set K_BLOCK, GEMM_INNER_BLOCK_DIMENSION
 .set OUTPUT_COLUMNS, GEMM_OUTPUT_COLUMNS
 .set OUTPUT_GROUP, GEMM_OUTPUT_GROUP
 .set INNER_GROUPS, K_BLOCK / GEMM_K_MICRO
 .set COLUMN_GROUPS, OUTPUT_COLUMNS / 16
 .set INNER_GROUP_BYTES, GEMM_K_MICRO * GEMM_INPUT_BYTES
 .set COLUMN_GROUP_BYTES, 16 * 2
 .set LEFT_ROW_BYTES, K_BLOCK * GEMM_INPUT_BYTES
 .set KROW_BYTES, 16 * GEMM_INPUT_BYTES      // one K row of a C16 weight panel
 .set RIGHT_ROW_BYTES, OUTPUT_COLUMNS * GEMM_INPUT_BYTES
 .set RIGHT_GROUP_BYTES, KROW_BYTES          // from one column group of right to the next
 .if OUTPUT_GROUP
 .set OUTPUT_ROW_BYTES, OUTPUT_GROUP * 2
 .set GROUP_COLUMN_GROUPS, OUTPUT_GROUP / 16
 .else
 .set OUTPUT_ROW_BYTES, OUTPUT_COLUMNS * 2
 .endif

 // Per-row pointer jumps of the pace loads and stores, in 64-bit atoms: field 0 (input) and
 // field 1 (partials) of the stride register, signed 10 bits each (facts §16.3 ld2x64pace).
 .set INPUT_ROW_JUMP, LEFT_ROW_BYTES / 8 - 3
 .set OUTPUT_ROW_JUMP, OUTPUT_ROW_BYTES / 8 - 3
 .if (INPUT_ROW_JUMP > 511) || (OUTPUT_ROW_JUMP > 511)
 .error "row too long for the 10-bit pace strides"
 .endif
 .set PACE_STRIDES, (INPUT_ROW_JUMP & 0x3ff) | ((OUTPUT_ROW_JUMP & 0x3ff) << 10)
 .set PACE2_NEXT, 0b0000       // both loads +1 atom
 .set PACE2_ROW, 0b1001        // input +field 0, partial +field 1
 .set PACE3_NEXT, 0b000000
 .set PACE3_LOAD_ROW, 0b001001 // input +field 0, partial +field 1, store +1 atom
 .set PACE3_STORE_ROW, 0b100000  // loads +1 atom, store +field 1
 .set PACE1_NEXT, 0b00
 .set PACE1_ROW, 0b10

 // The call's stack frame, in 32-bit words from $m11 (8-byte multiple). Words 0..35 are the
 // six workers' vertex states, WORKER_FRAME_WORDS apart (runall gives worker w the base
 // $m11 + 4 * WORKER_FRAME_WORDS * w). The entry writes each worker's row count and row
 // offsets once per call; the dispatch loop writes its row pointers when they change (left
 // every inner group, output every column group), so a worker only loads them.
 .set WORKER_FRAME_WORDS, 6
 .set WF_LEFT, 0               // worker: its first left row in the current inner group
 .set WF_OUTPUT, 1             // worker: its first output row in the current column group
 .set WF_ROWS_LESS_2, 2        // worker: its row count - 2 (the steady-state rpt count)
 .set WF_LEFT_OFFSET, 3        // supervisor: bytes from left to the worker's first row
 .set WF_OUTPUT_OFFSET, 4      // supervisor: bytes from the output to its first row
 .set FRAME_FIRST_WORKER, 6 * WORKER_FRAME_WORDS  // worker entry of an output's first group
 .set FRAME_GROUP_SKIP, FRAME_FIRST_WORKER + 1    // packed output: from group to group
 .set FRAME_FP_ICTL, FRAME_FIRST_WORKER + 2       // caller's $FP_ICTL
 .set FRAME_BYTES, ((FRAME_FP_ICTL + 2) / 2) * 8
 // Fewer than 12 rows leave some worker with fewer than two: the worker then needs the
 // one-row and no-row paths (rows of the large entry are never fewer than the small's).
 .set SHORT_WORKERS, GEMM_SMALL_ROWS < 2 * WORKER_CONTEXTS

// Weight feed for one K micro x C16 panel of the row-major [K, C] right operand: 512 bytes
// in Poplin's IPU21 1x1 slot order (facts §15.1): groups 0, 32, 8, 40, 16, 48, 24, 56, each
// eight 64-bit slots holding the next panel words; ld128putcs writes slot pairs. $CCCSLOAD
// post-increments, so with more than one column group every K row of the panel (16
// contiguous elements) is addressed afresh from $m5, which walks down the K rows.
 .macro LOAD_AMP_WEIGHTS
 .irp group, 0, 32, 8, 40, 16, 48, 24, 56
#ifdef GEMM_INTERLEAVED_WEIGHTS
 .irp slot, 0, 2, 4, 6
 .if (COLUMN_GROUPS > 1) && (((\slot * 8) % KROW_BYTES) == 0)
 put $CCCSLOAD, $m5
 add $m5, $m5, RIGHT_ROW_BYTES
 .endif
 ld128putcs (\group + \slot)
 .endr
#else
 .irp slot, 0, 1, 2, 3, 4, 5, 6, 7
 .if (COLUMN_GROUPS > 1) && (((\slot * 8) % KROW_BYTES) == 0)
 put $CCCSLOAD, $m5
 add $m5, $m5, RIGHT_ROW_BYTES
 .endif
 ld64putcs (\group + \slot)
 .endr
#endif
 .endr
 .endm

// A supervisor entry: allocates the frame, records which worker entry starts each output
// (zeroing or accumulating partials) and joins the set-up of its row count.
 .macro GEMM_ENTRY name, first_worker, partition
 .section .text.\name,"ax",@progbits
 .globl \name
 .type \name,@function
 .p2align 3
\name:
 .supervisor
 add $m11, $m11, -FRAME_BYTES
 setzi $m6, \first_worker
 st32 $m6, $m11, $mzero, FRAME_FIRST_WORKER
 bri \partition
 .size \name, .-\name
 .endm

 GEMM_ENTRY GEMM_INIT_SMALL_SYMBOL, .Lgemm_worker_zero, .Lgemm_partition_small
 GEMM_ENTRY GEMM_ACCUMULATE_SMALL_SYMBOL, .Lgemm_worker_accumulate, .Lgemm_partition_small
#ifndef GEMM_SINGLE_ROWS
 GEMM_ENTRY GEMM_INIT_LARGE_SYMBOL, .Lgemm_worker_zero, .Lgemm_partition_large
 GEMM_ENTRY GEMM_ACCUMULATE_LARGE_SYMBOL, .Lgemm_worker_accumulate, .Lgemm_partition_large
#endif

// The row partition of one row count, once per call: worker w gets rows/6 rows, the first
// rows%6 one more, starting at row w*(rows/6) + min(w, rows%6). Each worker's row count
// less two and (from worker 1 on; worker 0 starts at row 0) its byte offsets into left and
// output go into its vertex state. Uses $m6..$m8 only ($m2..$m5 hold the call's arguments).
 .macro GEMM_PARTITION rows
 .set PART_ROWS, (\rows) / WORKER_CONTEXTS
 .set PART_EXTRA, (\rows) % WORKER_CONTEXTS
 setzi $m6, PART_ROWS + 1
 add $m6, $m6, -2
 setzi $m8, PART_ROWS
 add $m8, $m8, -2
 .irp w, 0, 1, 2, 3, 4, 5
 .if \w < PART_EXTRA
 .set PART_START, \w * (PART_ROWS + 1)
 st32 $m6, $m11, $mzero, \w * WORKER_FRAME_WORDS + WF_ROWS_LESS_2
 .else
 .set PART_START, \w * PART_ROWS + PART_EXTRA
 st32 $m8, $m11, $mzero, \w * WORKER_FRAME_WORDS + WF_ROWS_LESS_2
 .endif
 .if \w
 setzi $m7, PART_START * LEFT_ROW_BYTES
 st32 $m7, $m11, $mzero, \w * WORKER_FRAME_WORDS + WF_LEFT_OFFSET
 setzi $m7, PART_START * OUTPUT_ROW_BYTES
 st32 $m7, $m11, $mzero, \w * WORKER_FRAME_WORDS + WF_OUTPUT_OFFSET
 .endif
 .endr
 .if OUTPUT_GROUP
 // from the last column group of one output group to the first of the next
 setzi $m6, ((((\rows) + 15) / 16) * 16 - 1) * OUTPUT_ROW_BYTES + COLUMN_GROUP_BYTES
 st32 $m6, $m11, $mzero, FRAME_GROUP_SKIP
 .endif
 .endm

// The dispatch loop, once per unit: column groups x inner groups. Each iteration writes the
// workers' row pointers, loads one weight panel, runs the six workers over the rows and waits
// for them (the coefficient store and the vertex states are shared, facts §15.2).
 .section .text.gemm_amp_dispatch,"ax",@progbits
 .p2align 3
 .supervisor
.Lgemm_partition_small:
 GEMM_PARTITION GEMM_SMALL_ROWS
#ifndef GEMM_SINGLE_ROWS
 bri .Lgemm_dispatch
.Lgemm_partition_large:
 GEMM_PARTITION GEMM_LARGE_ROWS
#endif
.Lgemm_dispatch:
 get $m8, $FP_ICTL
 st32 $m8, $m11, $mzero, FRAME_FP_ICTL
#if GEMM_STOCHASTIC_ROUNDING
 setzi $m6, FP_ICTL_ESR
 or $m8, $m8, $m6
#endif
 put $FP_ICTL, $m8
 setzi $m6, GEMM_INPUT_FORMAT
 put CSR_S_FP_INFMT__INDEX, $m6
#ifdef GEMM_NATIVE_FP8
 put CSR_S_FP_ISCL__INDEX, $m5
#endif
 setzi $m6, CR_ZCWEI
 put $CR, $m6
 put $CCCSLOAD, $m4
 .if COLUMN_GROUPS > 1
 add $m9, $m4, 0               // right operand at the current column group
 .endif
 setzi $m6, COLUMN_GROUPS
 .if OUTPUT_GROUP
 setzi $m1, GROUP_COLUMN_GROUPS
 .endif
.Lgemm_column_group:
 ld32 $m0, $m11, $mzero, FRAME_FIRST_WORKER
 add $m4, $m3, 0               // left at the current inner group
 setzi $m7, INNER_GROUPS
 .if COLUMN_GROUPS > 1
 add $m5, $m9, 0
 .endif
 st32 $m2, $m11, $mzero, WF_OUTPUT
 .irp w, 1, 2, 3, 4, 5
 ld32 $m8, $m11, $mzero, \w * WORKER_FRAME_WORDS + WF_OUTPUT_OFFSET
 add $m8, $m8, $m2
 st32 $m8, $m11, $mzero, \w * WORKER_FRAME_WORDS + WF_OUTPUT
 .endr
.Lgemm_inner_group:
 st32 $m4, $m11, $mzero, WF_LEFT
 .irp w, 1, 2, 3, 4, 5
 ld32 $m8, $m11, $mzero, \w * WORKER_FRAME_WORDS + WF_LEFT_OFFSET
 add $m8, $m8, $m4
 st32 $m8, $m11, $mzero, \w * WORKER_FRAME_WORDS + WF_LEFT
 .endr
 LOAD_AMP_WEIGHTS
 runall $m0, $m11, WORKER_FRAME_WORDS
 // these issue in the slots of workers that finish first
 setzi $m0, .Lgemm_worker_accumulate
 add $m4, $m4, INNER_GROUP_BYTES
 add $m7, $m7, -1
 sync SYNC_ZONE_LOCAL
 brnz $m7, .Lgemm_inner_group
 .if COLUMN_GROUPS > 1
 add $m9, $m9, RIGHT_GROUP_BYTES
 .endif
 .if OUTPUT_GROUP
 add $m1, $m1, -1
 brnz $m1, .Lgemm_same_output_group
 ld32 $m8, $m11, $mzero, FRAME_GROUP_SKIP
 add $m2, $m2, $m8
 setzi $m1, GROUP_COLUMN_GROUPS
 bri .Lgemm_next_column_group
.Lgemm_same_output_group:
 .endif
 add $m2, $m2, COLUMN_GROUP_BYTES
.Lgemm_next_column_group:
 add $m6, $m6, -1
 brnz $m6, .Lgemm_column_group
 ld32 $m8, $m11, $mzero, FRAME_FP_ICTL
 put $FP_ICTL, $m8
 add $m11, $m11, FRAME_BYTES
 br $m10

// Worker: loads its row count and row pointers from its vertex state (setzi/uput of the
// accumulator clear ride in the aux slots of the loads, as in poplibs' workers), then a
// software pipeline over its n rows: four AMP instructions (phases P0..P3, 16 output columns)
// per row. Bundle t loads input/partial quarter t, runs AMP instruction t-1 and stores the
// result of instruction t-2: a load feeds the next bundle, and a row's results leave the AMP
// one row (four instructions) after its inputs (isa/assumptions.py amp_pipeline_rows).
 .macro GEMM_WORKER_ROWS partials
 {
  ld32 $m5, $mvertex_base, $mzero, WF_ROWS_LESS_2
  setzi $a6, FP_CLR_ZAACC
 }
 {
  ld32 $m1, $mvertex_base, $mzero, WF_LEFT
  uput $FP_CLR, $a6
 }
 {
  setzi $m7, PACE_STRIDES
  fnop
 }
 ld32 $m2, $mvertex_base, $mzero, WF_OUTPUT
 tapack $m8:9, $m1, $m2, $m2
 .if SHORT_WORKERS
 cmpslt $m3, $m5, 0
 brnz $m3, .Lgemm_worker_short_\@
 .endif
 .p2align 3
 {
  ld2x64pace $a0:1, $a2:3, $m8:9+=, $m7, PACE2_NEXT
  fnop
 }
 {
  ld2x64pace $a0:1, $a2:3, $m8:9+=, $m7, PACE2_NEXT
  GEMM_AMP $a6:7, $a0:1, \partials, GEMM_AMP_P0
 }
 {
  ld2x64pace $a0:1, $a2:3, $m8:9+=, $m7, PACE2_NEXT
  GEMM_AMP $a6:7, $a0:1, \partials, GEMM_AMP_P1
 }
 {
  ld2x64pace $a0:1, $a2:3, $m8:9+=, $m7, PACE2_ROW
  GEMM_AMP $a6:7, $a0:1, \partials, GEMM_AMP_P2
 }
 {
  ld2x64pace $a0:1, $a2:3, $m8:9+=, $m7, PACE2_NEXT
  GEMM_AMP $a6:7, $a0:1, \partials, GEMM_AMP_P3
 }
 {
  ld2x64pace $a0:1, $a2:3, $m8:9+=, $m7, PACE2_NEXT
  GEMM_AMP $a6:7, $a0:1, \partials, GEMM_AMP_P0
 }
 {
  rpt $m5, 3
  fnop
 }
 {
  ld2xst64pace $a0:3, $a6:7, $m8:9+=, $m7, PACE3_NEXT
  GEMM_AMP $a6:7, $a0:1, \partials, GEMM_AMP_P1
 }
 {
  ld2xst64pace $a0:3, $a6:7, $m8:9+=, $m7, PACE3_LOAD_ROW
  GEMM_AMP $a6:7, $a0:1, \partials, GEMM_AMP_P2
 }
 {
  ld2xst64pace $a0:3, $a6:7, $m8:9+=, $m7, PACE3_NEXT
  GEMM_AMP $a6:7, $a0:1, \partials, GEMM_AMP_P3
 }
 {
  ld2xst64pace $a0:3, $a6:7, $m8:9+=, $m7, PACE3_STORE_ROW
  GEMM_AMP $a6:7, $a0:1, \partials, GEMM_AMP_P0
 }
 {
  ld2xst64pace $a0:3, $a6:7, $m8:9+=, $m7, PACE3_NEXT
  GEMM_AMP $a6:7, $a0:1, \partials, GEMM_AMP_P1
 }
 {
  ld2xst64pace $a0:3, $a6:7, $m8:9+=, $m7, PACE3_LOAD_ROW
  GEMM_AMP $a6:7, $a0:1, \partials, GEMM_AMP_P2
 }
 {
  st64pace $a6:7, $m8:9+=, $m7, PACE1_NEXT
  GEMM_AMP $a6:7, $a0:1, \partials, GEMM_AMP_P3
 }
 {
  st64pace $a6:7, $m8:9+=, $m7, PACE1_ROW
  GEMM_AMP $a6:7, $azeros, $azeros, GEMM_AMP_P0
 }
.Lgemm_worker_drain_\@:
 {
  st64pace $a6:7, $m8:9+=, $m7, PACE1_NEXT
  GEMM_AMP $a6:7, $azeros, $azeros, GEMM_AMP_P1
 }
 {
  st64pace $a6:7, $m8:9+=, $m7, PACE1_NEXT
  GEMM_AMP $a6:7, $azeros, $azeros, GEMM_AMP_P2
 }
 {
  st64pace $a6:7, $m8:9+=, $m7, PACE1_NEXT
  GEMM_AMP $a6:7, $azeros, $azeros, GEMM_AMP_P3
 }
 st64pace $a6:7, $m8:9+=, $m7, PACE1_NEXT
.Lgemm_worker_exit_\@:
 exitz $mzero
 .if SHORT_WORKERS
 // one row (n - 2 = -1) or none (-2)
.Lgemm_worker_short_\@:
 add $m5, $m5, 1
 brnz $m5, .Lgemm_worker_exit_\@
 .p2align 3
 {
  ld2x64pace $a0:1, $a2:3, $m8:9+=, $m7, PACE2_NEXT
  fnop
 }
 {
  ld2x64pace $a0:1, $a2:3, $m8:9+=, $m7, PACE2_NEXT
  GEMM_AMP $a6:7, $a0:1, \partials, GEMM_AMP_P0
 }
 {
  ld2x64pace $a0:1, $a2:3, $m8:9+=, $m7, PACE2_NEXT
  GEMM_AMP $a6:7, $a0:1, \partials, GEMM_AMP_P1
 }
 {
  ld2x64pace $a0:1, $a2:3, $m8:9+=, $m7, PACE2_ROW
  GEMM_AMP $a6:7, $a0:1, \partials, GEMM_AMP_P2
 }
 {
  nop
  GEMM_AMP $a6:7, $a0:1, \partials, GEMM_AMP_P3
 }
 {
  bri .Lgemm_worker_drain_\@
  GEMM_AMP $a6:7, $azeros, $azeros, GEMM_AMP_P0
 }
 .endif
 .endm

 .section .text.gemm_amp_worker,"ax",@progbits
 .worker
 .p2align 3
.Lgemm_worker_zero:
 GEMM_WORKER_ROWS $azeros
 .p2align 3
.Lgemm_worker_accumulate:
 GEMM_WORKER_ROWS $a2:3

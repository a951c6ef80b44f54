// softmax.S -- IPU21 softmax over the last axis on one tile:
//   top = max(x) (a fully masked row, top = -inf, uses -FLT_MAX: every exp is 0),
//   e = exp(x - top), s = pairwise sum(e), y = e * (1 / max(s, 1))
// in f32, in the order of the registry's semantics (runtime/sim.py _softmax_rows), rounded
// once to the output dtype. s is NumPy's pairwise sum of the same f32 exps (rowwise.h),
// so it is the semantics' own; a row that is not fully masked has s >= 1 (its maximum gives
// exp(0) = 1), and a fully masked one s = 0, which the semantics divide by 1. The division
// e / s is a multiplication by the f32 reciprocal: within 3 f32 ulp of the semantics' quotient
// (1.8e-7 relative; outputs below 2^-126, exps of less than -87, may differ by one subnormal
// step). exp is f32exp (assumption f32exp_accuracy).
//
// Written for ipu-stack from the ISA facts in shared/docs/ipu21-facts.md (§16.2, §16.3) and
// the Tile Vertex ISA instruction list. One compile unit per unit name
// softmax_{f16|f32}_r{R}_c{C} (kernels/units_rowwise.py):
//   RW_F32        f32 operands, else f16
//   RW_ROWS       R rows
//   RW_COLS       C columns (even)
//   RW_SYMBOL     the entry symbol
// ABI (supervisor, like the map kernels): $m2 output [R, C], $m3 x [R, C] (rows 8-byte aligned,
// ROW_BYTES apart); $m10 return address, $m11 stack (FRAME_BYTES used).
// From 6 rows, worker w handles rows w, w + 6, ...: the maximum, the pairwise sum of the exps,
// the output. Fewer rows (COOP): worker r computes row r's top and 1 / s into its scratch (with
// more than 128 columns from partial maxima of every worker and pairwise blocks summed by all
// workers into a table at the row's output), then every worker w writes element pairs
// w, w + 6, ... of every row.
#include "ipu21_tile.h"

#ifndef RW_ROWS
#error "RW_ROWS is required"
#endif

 .set ROWS, RW_ROWS
 .set FRAME_OUT, 0
 .set FRAME_X, 1
 .set PAIR_FLOOR, 1            // 64-bit slot: (-FLT_MAX, 1.0)
 .set NEG_MAX_BITS, 0xFF7FFFFF // f32 -3.4028235e38
 .set ONE_BITS, 0x3F800000     // f32 1.0
 .set SCRATCH, 16
 .set SCRATCH_BYTES, 80
 .set FRAME_BYTES, SCRATCH + WORKER_CONTEXTS * SCRATCH_BYTES
 .set SCR_TOP, 0               // 64-bit slots: (top, top), (1 / s, 1 / s)
 .set SCR_RCP, 1
 .set SCR_STACK, 4             // words 4..13 of the pairwise-sum stack
 .set SCR_PMAX, 14             // words 14..18: the worker's partial maxima of rows 0..4

#include "rowwise.h"

 // The statistics of the row at $m1: top = max(max(x), -FLT_MAX) into $a10:11 and
 // SCR_TOP, 1 / max(s, 1) into $a0:1 and SCR_RCP, s the pairwise sum of exp(x - top).
 .macro STATS
 zero $m7
 LOADSTEP
 FP f32v2max $a0:1, $a12:13, $a12:13
 setzi $m8, PAIRS - 1
 .p2align 3
 {
  rpt $m8, (.Lsm_max_end\@ - .Lsm_max\@) / 8 - 1
  fnop
 }
.Lsm_max\@:
 LOADSTEP
 FP f32v2max $a0:1, $a0:1, $a12:13
.Lsm_max_end\@:
 .p2align 3
 {
  ld64 $a12:13, $mvertex_base, $mzero, PAIR_FLOOR
  f32max $a0, $a0, $a1
 }
 FP f32max $a10, $a0, $a12
 FP f32max $a11, $a0, $a12
 st64 $a10:11, $m6, $mzero, SCR_TOP
 PW COLS, 0, 0, 3
 RECIPROCAL
 .endm

 // 1 / max(s, 1) from the sum s in $a14 into $a0:1 and SCR_RCP
 .macro RECIPROCAL
 .p2align 3
 {
  ld64 $a12:13, $mvertex_base, $mzero, PAIR_FLOOR
  fnop
 }
 FP f32max $a14, $a14, $a13
 FP f32oox $a0, $a14
 FP f32oox $a1, $a14
 st64 $a0:1, $m6, $mzero, SCR_RCP
 .endm

 // y = exp(x - top) * (1 / s) for $m8 element pairs, step pairs apart, from x offset $m7 and
 // output offset $m9 (bytes); top in $a10:11, 1 / s in $a0:1.
 .macro OUTPUT step
 .p2align 3
 {
  rpt $m8, (.Lsm_out_end\@ - .Lsm_out\@) / 8 - 1
  fnop
 }
.Lsm_out\@:
 LOADSTEP \step
 TRANSFORM 3
 FP f32v2mul $a12:13, $a12:13, $a0:1
#if RW_F32
 .p2align 3
 {
  st64step $a12:13, $m2, $m9+=, \step
  fnop
 }
#else
 FP f32v2tof16 $a8, $a12:13
 .p2align 3
 {
  st32step $a8, $m2, $m9+=, \step
  fnop
 }
#endif
.Lsm_out_end\@:
#if !RW_F32 && (RW_COLS % 4)
 setzi $m9, COLS * EB
 st32 $azero, $m2, $m9, 0      // the row's 4 padding bytes are written as zeros
#endif
 .endm

 .section .text.RW_SYMBOL,"ax",@progbits
 .globl RW_SYMBOL
 .type RW_SYMBOL,@function
 .p2align 3
 .supervisor
RW_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_X
 CONSTANT NEG_MAX_BITS
 st32 $m6, $m11, $mzero, 2 * PAIR_FLOOR
 CONSTANT ONE_BITS
 st32 $m6, $m11, $mzero, 2 * PAIR_FLOOR + 1
 .if COOP
 .if PARALLEL_SUMS
 .irp step, .Lsm_pmax, .Lsm_top, .Lsm_blocks, .Lsm_sum
 setzi $m6, \step             // maxima and blocks over all workers, then row r's by worker r
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 .endr
 .else
 setzi $m6, .Lsm_stats         // row r's statistics by worker r
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 .endif
 setzi $m6, .Lsm_split         // every row's elements over all workers
 .else
 setzi $m6, .Lsm_worker
 .endif
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size RW_SYMBOL, .-RW_SYMBOL

 .section .text.sm_worker,"ax",@progbits
 .worker
 .if COOP
 .if PARALLEL_SUMS
 .p2align 3
.Lsm_pmax:                     // the maximum of pairs w, w + 6, ... of each row: SCR_PMAX + r
 PROLOGUE
 ld32 $m1, $mvertex_base, $mzero, FRAME_X
 WORKER_SHARE $m8, PAIRS
 mul $m10, $m0, 2 * EB         // byte offset of pair w
 setzi $m5, 0
.Lsm_pmax_row:
 ld64 $a0:1, $mvertex_base, $mzero, PAIR_FLOOR   // no pair: -FLT_MAX
 brz $m8, .Lsm_pmax_store
 add $m7, $m10, 0
 LOADSTEP WORKER_CONTEXTS
 FP f32v2max $a0:1, $a12:13, $a12:13
 add $m9, $m8, -1
 .p2align 3
 {
  rpt $m9, (.Lsm_pmax_end - .Lsm_pmax_loop) / 8 - 1
  fnop
 }
.Lsm_pmax_loop:
 LOADSTEP WORKER_CONTEXTS
 FP f32v2max $a0:1, $a0:1, $a12:13
.Lsm_pmax_end:
 FP f32max $a0, $a0, $a1
.Lsm_pmax_store:
 shl $m9, $m5, 2
 add $m9, $m9, 4 * SCR_PMAX
 st32 $a0, $m6, $m9, 0
 add $m1, $m1, ROW_BYTES
 add $m5, $m5, 1
 cmpult $m9, $m5, ROWS
 brnz $m9, .Lsm_pmax_row
 exitz $mzero

 .p2align 3
.Lsm_top:                      // worker r: row r's top from the six partial maxima
 PROLOGUE
 cmpult $m5, $m0, ROWS
 brz $m5, .Lsm_idle
 ld64 $a10:11, $mvertex_base, $mzero, PAIR_FLOOR
 shl $m9, $m0, 2
 add $m9, $m9, $mvertex_base
 add $m9, $m9, SCRATCH + 4 * SCR_PMAX   // word r of worker 0's partial maxima
 .rept WORKER_CONTEXTS
 ld32 $a0, $m9, $mzero, 0
 FP f32max $a10, $a10, $a0
 add $m9, $m9, SCRATCH_BYTES
 .endr
 FP f32max $a11, $a10, $a10
 st64 $a10:11, $m6, $mzero, SCR_TOP
 exitz $mzero

 .p2align 3
.Lsm_blocks:
 ROW_BLOCKS 3, SCR_TOP

 .p2align 3
.Lsm_sum:
 ROW_SUM .Lsm_idle
 RECIPROCAL
 exitz $mzero
 .else
 .p2align 3
.Lsm_stats:
 PROLOGUE
 cmpult $m5, $m0, ROWS
 brz $m5, .Lsm_idle
 ld32 $m1, $mvertex_base, $mzero, FRAME_X
 mul $m8, $m0, ROW_BYTES       // row w
 add $m1, $m1, $m8
 STATS
 exitz $mzero

 .endif
 .p2align 3
.Lsm_split:
 PROLOGUE
 WORKER_SHARE $m8, PAIRS       // pairs w, w + 6, ... of every row
 brz $m8, .Lsm_idle
 ld32 $m1, $mvertex_base, $mzero, FRAME_X
 ld32 $m2, $mvertex_base, $mzero, FRAME_OUT
 mul $m10, $m0, 2 * EB         // byte offset of pair w
 add $m6, $mvertex_base, SCRATCH   // row r's statistics: worker r's scratch
 setzi $m5, ROWS
.Lsm_split_row:
 ld64 $a10:11, $m6, $mzero, SCR_TOP
 ld64 $a0:1, $m6, $mzero, SCR_RCP
 add $m7, $m10, 0
 add $m9, $m10, 0
 OUTPUT WORKER_CONTEXTS
 add $m1, $m1, ROW_BYTES
 add $m2, $m2, ROW_BYTES
 add $m6, $m6, SCRATCH_BYTES
 add $m5, $m5, -1
 brnz $m5, .Lsm_split_row
 exitz $mzero
 .else
 .p2align 3
.Lsm_worker:
 PROLOGUE
 WORKER_SHARE $m5, ROWS        // rows w, w + 6, ...
 brz $m5, .Lsm_idle
 ld32 $m1, $mvertex_base, $mzero, FRAME_X
 ld32 $m2, $mvertex_base, $mzero, FRAME_OUT
 mul $m8, $m0, ROW_BYTES       // this worker's first row
 add $m1, $m1, $m8
 add $m2, $m2, $m8
.Lsm_row:
 STATS
 zero $m7
 zero $m9
 setzi $m8, PAIRS
 OUTPUT 1
 add $m1, $m1, WORKER_CONTEXTS * ROW_BYTES
 add $m2, $m2, WORKER_CONTEXTS * ROW_BYTES
 add $m5, $m5, -1
 brnz $m5, .Lsm_row
 .endif
.Lsm_idle:
 exitz $mzero

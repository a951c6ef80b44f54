// layer_norm.S -- IPU21 layer normalisation over the last axis on one tile, and the row mean:
//   mean = sum(x) / C, var = sum((x - mean)^2) / C,
//   y = (x - mean) / sqrt(var + eps) * scale + bias            (RW_MEAN_ONLY: y = mean)
// in f32, in the operation order of the registry's semantics (runtime/sim.py map_semantics;
// reduce_mean: runtime/elementwise_sim.py), each operation rounded to f32, the output rounded
// once (kernels/units_rowwise.py restates them). Sums are NumPy's pairwise sums and every
// division is rounded once (rowwise.h), so F32 results are the semantics' own.
//
// Written for ipu-stack from the ISA facts in shared/docs/ipu21-facts.md (§16.2, §16.3) and
// the Tile Vertex ISA instruction list. One compile unit per unit name
// layer_norm_{f16|f32}_r{R}_c{C} or reduce_mean_{f16|f32}_r{R}_c{C} (kernels/units_rowwise.py):
//   RW_F32        f32 operands, else f16
//   RW_ROWS       R rows
//   RW_COLS       C columns (even)
//   RW_C_BITS     the f32 bit pattern of C
//   RW_MEAN_ONLY  reduce_mean: the output is [R, 1], one element per 8-byte row
//   RW_SYMBOL     the entry symbol
// ABI (supervisor, like the map kernels): $m2 output [R, C], $m3 x [R, C], $m4 scale [1, C],
// $m5 bias [1, C] (rows 8-byte aligned, ROW_BYTES apart), $m6 epsilon (f32 bits); reduce_mean:
// $m2 output [R, 1] (8-byte rows), $m3 x. $m10 return address, $m11 stack (FRAME_BYTES used).
// From 6 rows, worker w normalises rows w, w + 6, ...: the pairwise sum, the mean, the squared
// deviations' pairwise sum, the variance, then every element (one division each). Fewer rows
// (COOP) run in steps: worker r computes row r's statistics into its scratch (with more than
// 128 columns the pairwise blocks of every row are first summed by all workers into a table
// at the row's output, ROW_BLOCKS, and worker r combines them, ROW_SUM), then every worker w
// normalises element pairs w, w + 6, ... of every row. The output is written last.
#include "ipu21_tile.h"

#ifndef RW_ROWS
#error "RW_ROWS is required"
#endif
#ifndef RW_C_BITS
#error "RW_C_BITS is required"
#endif
#ifndef RW_MEAN_ONLY
#define RW_MEAN_ONLY 0
#endif

 .set ROWS, RW_ROWS
 // frame (32-bit words from $m11): pointers, then f32 pairs (64-bit slots)
 .set FRAME_OUT, 0
 .set FRAME_X, 1
 .set FRAME_SCALE, 2
 .set FRAME_BIAS, 3
 .set PAIR_EPS, 2              // 64-bit slot: (eps, eps)
 .set PAIR_SPLIT, 3            // (4097, 4097)
 .set PAIR_C, 4                // (C, C)
 .set SCRATCH, 48              // bytes: the workers' scratch areas, SCRATCH_BYTES each
 .set SCRATCH_BYTES, 112
 .set FRAME_BYTES, SCRATCH + WORKER_CONTEXTS * SCRATCH_BYTES
 // a worker's scratch: 64-bit pair slots, then 32-bit words of the pairwise-sum stack
 .set SCR_MEAN, 0
 .set SCR_DB, 1
 .set SCR_DR, 2
 .set SCR_DBH, 3
 .set SCR_DBL, 4
 .set SCR_CB, 5
 .set SCR_CR, 6
 .set SCR_CBH, 7
 .set SCR_CBL, 8
 .set SCR_STACK, 18            // words 18..27 (9 levels: C < 2^16)

#include "rowwise.h"
#if RW_MEAN_ONLY
 .set SPLIT_MODE, 0
#else
 .set SPLIT_MODE, COOP
#endif

 // The statistics of the row at $m1 into the scratch at $m6: the mean (SCR_MEAN) and the
 // divisor sqrt(var + eps) with its reciprocal and halves (SCR_DB..); reduce_mean: the mean
 // into $a0 (and $a1). The divisor C must be at SCR_CB...
 .macro STATS
 PW COLS, 0, 0, 1              // mean = pairwise sum / C
 MEAN_OF_SUM
#if !RW_MEAN_ONLY
 ld64 $a10:11, $m6, $mzero, SCR_MEAN
 PW COLS, 0, 0, 2              // var = pairwise sum of (x - mean)^2 / C
 DIVISOR_OF_SUM
#endif
 .endm

 // $a0:1 / C rounded once ($a12:13 = 1 / C): a power of two C scales exactly
 .macro DIVIDE_BY_C
 .if COLS & (COLS - 1)
 DIVIDE SCR_CB, SCR_CR, SCR_CBH, SCR_CBL, PAIR_SPLIT
 .else
 FP f32v2mul $a0:1, $a0:1, $a12:13
 .endif
 .endm

 // the mean from the pairwise sum in $a14 into $a0:1 (and SCR_MEAN unless reduce_mean)
 .macro MEAN_OF_SUM
 FP f32add $a0, $a14, $azero
 .p2align 3
 {
  ld64 $a12:13, $m6, $mzero, SCR_CR
  f32add $a1, $a14, $azero
 }
 DIVIDE_BY_C
#if !RW_MEAN_ONLY
 st64 $a0:1, $m6, $mzero, SCR_MEAN
#endif
 .endm

 // the divisor sqrt(sum / C + eps) from the pairwise sum in $a14 into SCR_DB..
 .macro DIVISOR_OF_SUM
 FP f32add $a0, $a14, $azero
 .p2align 3
 {
  ld64 $a12:13, $m6, $mzero, SCR_CR
  f32add $a1, $a14, $azero
 }
 DIVIDE_BY_C
 ld64 $a12:13, $mvertex_base, $mzero, PAIR_EPS
 FP f32v2add $a0:1, $a0:1, $a12:13
 FP f32sqrt $a0, $a0
 FP f32sqrt $a1, $a1
 DIVISOR SCR_DB, SCR_DR, SCR_DBH, SCR_DBL, PAIR_SPLIT
 .endm

 // y = (x - mean) / d * scale + bias for $m8 element pairs, step pairs apart, from x offset
 // $m7 and scale / bias / output offset $m9 (bytes); the row's statistics at $m6.
 .macro NORMALIZE step
 .p2align 3
 {
  rpt $m8, (.Lln_norm_end\@ - .Lln_norm\@) / 8 - 1
  fnop
 }
.Lln_norm\@:
 LOADSTEP \step
 .p2align 3
 {
  ld64 $a0:1, $m6, $mzero, SCR_MEAN
  fnop
 }
 .p2align 3
 {
  ld64 $a12:13, $m6, $mzero, SCR_DR
  f32v2sub $a0:1, $a12:13, $a0:1          // x - mean (x read before the load lands)
 }
 DIVIDE SCR_DB, SCR_DR, SCR_DBH, SCR_DBL, PAIR_SPLIT
#if RW_F32
 .p2align 3
 {
  ld64 $a12:13, $m3, $m9, 0
  fnop
 }
 .p2align 3
 {
  ld64 $a12:13, $m4, $m9, 0
  f32v2mul $a0:1, $a0:1, $a12:13
 }
 FP f32v2add $a0:1, $a0:1, $a12:13
 .p2align 3
 {
  st64step $a0:1, $m2, $m9+=, \step
  fnop
 }
#else
 .p2align 3
 {
  ld32 $a8, $m3, $m9, 0
  fnop
 }
 FP f16v2tof32 $a12:13, $a8
 .p2align 3
 {
  ld32 $a8, $m4, $m9, 0
  f32v2mul $a0:1, $a0:1, $a12:13
 }
 FP f16v2tof32 $a12:13, $a8
 FP f32v2add $a0:1, $a0:1, $a12:13
 FP f32v2tof16 $a8, $a0:1
 .p2align 3
 {
  st32step $a8, $m2, $m9+=, \step
  fnop
 }
#endif
.Lln_norm_end\@:
#if !RW_F32 && (RW_COLS % 4)
 setzi $m9, COLS * EB
 st32 $azero, $m2, $m9, 0      // the row's 4 padding bytes are written as zeros
#endif
 .endm

 // the worker's pointers: $m1 x, $m2 output, $m3 scale, $m4 bias
 .macro POINTERS
 ld32 $m1, $mvertex_base, $mzero, FRAME_X
 ld32 $m2, $mvertex_base, $mzero, FRAME_OUT
 ld32 $m3, $mvertex_base, $mzero, FRAME_SCALE
 ld32 $m4, $mvertex_base, $mzero, FRAME_BIAS
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
 st32 $m4, $m11, $mzero, FRAME_SCALE
 st32 $m5, $m11, $mzero, FRAME_BIAS
 st32 $m6, $m11, $mzero, 2 * PAIR_EPS
 st32 $m6, $m11, $mzero, 2 * PAIR_EPS + 1
 CONSTANT SPLIT_BITS
 st32 $m6, $m11, $mzero, 2 * PAIR_SPLIT
 st32 $m6, $m11, $mzero, 2 * PAIR_SPLIT + 1
 CONSTANT RW_C_BITS
 st32 $m6, $m11, $mzero, 2 * PAIR_C
 st32 $m6, $m11, $mzero, 2 * PAIR_C + 1
 .if SPLIT_MODE
 .if PARALLEL_SUMS
 .irp step, .Lln_blocks1, .Lln_mean, .Lln_blocks2, .Lln_var
 setzi $m6, \step             // blocks over all workers, then row r's sums by worker r
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 .endr
 .else
 setzi $m6, .Lln_stats         // row r's statistics by worker r
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 .endif
 setzi $m6, .Lln_split         // every row's elements over all workers
 .else
 setzi $m6, .Lln_worker
 .endif
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size RW_SYMBOL, .-RW_SYMBOL

 .section .text.ln_worker,"ax",@progbits
 .worker
 .if SPLIT_MODE
 .if PARALLEL_SUMS
 .p2align 3
.Lln_blocks1:
 ROW_BLOCKS 1, 0
 .p2align 3
.Lln_mean:
 ROW_SUM .Lln_idle
 ld64 $a0:1, $mvertex_base, $mzero, PAIR_C   // the divisor C, kept for .Lln_var
 DIVISOR SCR_CB, SCR_CR, SCR_CBH, SCR_CBL, PAIR_SPLIT
 MEAN_OF_SUM
 exitz $mzero
 .p2align 3
.Lln_blocks2:
 ROW_BLOCKS 2, SCR_MEAN
 .p2align 3
.Lln_var:
 ROW_SUM .Lln_idle
 DIVISOR_OF_SUM
 exitz $mzero
 .else
 .p2align 3
.Lln_stats:
 PROLOGUE
 cmpult $m5, $m0, ROWS
 brz $m5, .Lln_idle
 ld32 $m1, $mvertex_base, $mzero, FRAME_X
 mul $m8, $m0, ROW_BYTES       // row w
 add $m1, $m1, $m8
 ld64 $a0:1, $mvertex_base, $mzero, PAIR_C
 DIVISOR SCR_CB, SCR_CR, SCR_CBH, SCR_CBL, PAIR_SPLIT
 STATS
 exitz $mzero

 .endif
 .p2align 3
.Lln_split:
 PROLOGUE
 WORKER_SHARE $m8, PAIRS       // pairs w, w + 6, ... of every row
 brz $m8, .Lln_idle
 POINTERS
 mul $m10, $m0, 2 * EB         // byte offset of pair w
 add $m6, $mvertex_base, SCRATCH   // row r's statistics: worker r's scratch
 setzi $m5, ROWS
.Lln_split_row:
 add $m7, $m10, 0
 add $m9, $m10, 0
 NORMALIZE WORKER_CONTEXTS
 add $m1, $m1, ROW_BYTES
 add $m2, $m2, ROW_BYTES
 add $m6, $m6, SCRATCH_BYTES
 add $m5, $m5, -1
 brnz $m5, .Lln_split_row
 exitz $mzero
 .else
 .p2align 3
.Lln_worker:
 PROLOGUE
 WORKER_SHARE $m5, ROWS        // rows w, w + 6, ...
 brz $m5, .Lln_idle
 POINTERS
 mul $m8, $m0, ROW_BYTES       // this worker's first row
 add $m1, $m1, $m8
#if RW_MEAN_ONLY
 shl $m8, $m0, 3               // output rows of 8 bytes
#endif
 add $m2, $m2, $m8
 ld64 $a0:1, $mvertex_base, $mzero, PAIR_C   // the divisor C
 DIVISOR SCR_CB, SCR_CR, SCR_CBH, SCR_CBL, PAIR_SPLIT
.Lln_row:
 STATS
#if RW_MEAN_ONLY
 setzi $a1, 0                  // the row's padding is written as zeros
#if !RW_F32
 FP f32v2tof16 $a0, $a0:1
#endif
 st64 $a0:1, $m2, $mzero, 0
 add $m2, $m2, WORKER_CONTEXTS * 8
#else
 zero $m7                      // x offset (LOADSTEP)
 zero $m9                      // scale, bias and output offset
 setzi $m8, PAIRS
 NORMALIZE 1
 add $m2, $m2, WORKER_CONTEXTS * ROW_BYTES
#endif
 add $m1, $m1, WORKER_CONTEXTS * ROW_BYTES
 add $m5, $m5, -1
 brnz $m5, .Lln_row
 .endif
.Lln_idle:
 exitz $mzero

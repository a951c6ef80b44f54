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
// Worker w handles rows w, w + 6, ...: the maximum, the pairwise sum of the exps, the output.
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
 .set SCR_STACK, 0             // words of the pairwise-sum stack

#include "rowwise.h"

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
 setzi $m6, .Lsm_worker
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size RW_SYMBOL, .-RW_SYMBOL

 .section .text.sm_worker,"ax",@progbits
 .worker
 .p2align 3
.Lsm_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 WORKER_ROWS ROWS
 brz $m5, .Lsm_idle
 ld32 $m1, $mvertex_base, $mzero, FRAME_X
 ld32 $m2, $mvertex_base, $mzero, FRAME_OUT
 mul $m6, $m0, SCRATCH_BYTES
 add $m6, $m6, $mvertex_base
 add $m6, $m6, SCRATCH
 mul $m8, $m0, ROW_BYTES       // this worker's first row
 add $m1, $m1, $m8
 add $m2, $m2, $m8
.Lsm_row:
 // top = max(max(x), -FLT_MAX) into both halves of $a10:11
 zero $m7
 LOADSTEP
 FP f32v2max $a0:1, $a12:13, $a12:13
 setzi $m8, PAIRS - 1
 .p2align 3
 {
  rpt $m8, (.Lsm_max_end - .Lsm_max) / 8 - 1
  fnop
 }
.Lsm_max:
 LOADSTEP
 FP f32v2max $a0:1, $a0:1, $a12:13
.Lsm_max_end:
 .p2align 3
 {
  ld64 $a12:13, $mvertex_base, $mzero, PAIR_FLOOR
  f32max $a0, $a0, $a1
 }
 FP f32max $a10, $a0, $a12
 FP f32max $a11, $a0, $a12
 // s = pairwise sum of exp(x - top); $a0:1 = 1 / max(s, 1)
 PW COLS, 0, 0, 3
 .p2align 3
 {
  ld64 $a12:13, $mvertex_base, $mzero, PAIR_FLOOR
  fnop
 }
 FP f32max $a14, $a14, $a13
 FP f32oox $a0, $a14
 FP f32oox $a1, $a14
 // y = exp(x - top) * (1 / s), one element pair per iteration
 zero $m7
 zero $m9
 setzi $m8, PAIRS
 .p2align 3
 {
  rpt $m8, (.Lsm_out_end - .Lsm_out) / 8 - 1
  fnop
 }
.Lsm_out:
 LOADSTEP
 TRANSFORM 3
 FP f32v2mul $a12:13, $a12:13, $a0:1
#if RW_F32
 .p2align 3
 {
  st64step $a12:13, $m2, $m9+=, 1
  fnop
 }
#else
 FP f32v2tof16 $a8, $a12:13
 .p2align 3
 {
  st32step $a8, $m2, $m9+=, 1
  fnop
 }
#endif
.Lsm_out_end:
#if !RW_F32 && (RW_COLS % 4)
 st32 $azero, $m2, $m9, 0      // the row's 4 padding bytes are written as zeros
#endif
 add $m1, $m1, WORKER_CONTEXTS * ROW_BYTES
 add $m2, $m2, WORKER_CONTEXTS * ROW_BYTES
 add $m5, $m5, -1
 brnz $m5, .Lsm_row
.Lsm_idle:
 exitz $mzero

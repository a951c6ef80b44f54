// unary.S -- IPU21 elementwise functions on one tile, F16 or F32 in and out, f32 arithmetic
// rounded once to the output type (the registry's semantics, runtime/elementwise_sim.py):
//   tanh, sigmoid, sqrt, reciprocal, neg, relu, pow with a constant exponent, and the two-operand
//   sub and div (equal shapes).
//
// Written for ipu-stack from the Tile Vertex ISA (ld32step/ld64step, rpt, runall, exitz,
// f16v2tof32/f32v2tof16, f32v2add/sub/mul/max/min, f32div, f32sqrt, f32sigm, f32tanh; hover text of
// graphcore/ipu_assembly_support) and shared/docs/ipu21-facts.md §16. Unit names (kernels/
// units_unary.py): {tanh|sigmoid|sqrt|reciprocal|neg|relu|sub|div|max|min}_{f16|f32}_n{N},
// pow_{f16|f32}_e{E}_n{N}, N even:
//   UN_OP      1 tanh, 2 sigmoid, 3 sqrt, 4 reciprocal, 5 neg, 6 pow, 7 sub, 8 div, 11 relu,
//              12 max, 13 min (two operands)
//   UN_POW     pow: 1 x^2, 2 x^3, 3 x^4, 4 x^0.5, 5 x^-0.5, 6 x^-1, 7 x^-2
//   UN_ITEMS   pairs of elements (N / 2)
//   UN_F32     f32 data (64-bit items), else f16 (32-bit items, widened to f32)
//   UN_SYMBOL  the entry symbol
//   UN_COL     column form: UN_ITEMS rows of ONE element, rows 8 bytes apart (an [R, 1] view
//              as the lowering stages it); the pad of each row is written as zeros. Names
//              {kind}_{f16|f32}_col_r{R} (unary, and add/mul/sub/div of two columns) and
//              {add|mul|sub|div}_{f16|f32}_colscalar_r{R} (b a [1, 1] scalar: UN_B_STEP 0)
//   UN_OUT_STRIDE  column form: bytes between output rows, 8 (default) or 4. Rows 4 bytes apart
//              are what low/in_place.py leaves when it writes an [R, 1] result straight into
//              its consumer's operand (one F32 element per row, or F16 and a zero pad); each row
//              is one 32-bit store, so the output needs only word alignment. Name suffix _o4
// ABI (supervisor, like the map kernels): $m2 output, $m3 input (sub/div: $m3 a, $m4 b), all
// 8-byte aligned (an _o4 output: 4); $m10 return address, $m11 stack. Worker w handles items
// w, w + 6, ...
#include "ipu21_tile.h"

#ifndef UN_OP
#error "UN_OP is required"
#endif
#ifndef UN_ITEMS
#error "UN_ITEMS is required"
#endif
#ifndef UN_POW
#define UN_POW 0
#endif
#ifndef UN_COL
#define UN_COL 0
#endif
#ifndef UN_B_STEP
#define UN_B_STEP 1
#endif
#ifndef UN_OUT_STRIDE
#define UN_OUT_STRIDE 8
#endif
#if UN_OUT_STRIDE != 8 && !(UN_OUT_STRIDE == 4 && UN_COL)
#error "UN_OUT_STRIDE is 8, or 4 in the column form"
#endif

 .set ITEMS, UN_ITEMS
#if UN_F32 || UN_COL
 .set ITEM_BYTES, 8
#else
 .set ITEM_BYTES, 4
#endif
#if UN_F32
 .set LANE_MASK, 0xFFFFFFFF    // column form: keep lane 0 of the pair, zero the pad
#else
 .set LANE_MASK, 0xFFFF
#endif
 .set FRAME_OUT, 0
 .set FRAME_A, 1
 .set FRAME_B, 2
 .set FRAME_K, 2               // 64-bit slot 2: the constant pair (1, 1) or (-1, -1)
 .set FRAME_MASK, 3            // 64-bit slot 3: (LANE_MASK, 0), the column form's store mask
 .set FRAME_BYTES, 32
#if UN_OP == 5
 .set K_BITS, 0xBF800000       // -1: neg multiplies
#elif UN_OP == 11
 .set K_BITS, 0                // 0: relu takes the larger of x and zero
#else
 .set K_BITS, 0x3F800000       // 1: the dividend of reciprocals
#endif

 .section .text.UN_SYMBOL,"ax",@progbits
 .globl UN_SYMBOL
 .type UN_SYMBOL,@function
 .p2align 3
 .supervisor
UN_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_A
 st32 $m4, $m11, $mzero, FRAME_B
 setzi $m6, (K_BITS) >> 12
 shl $m6, $m6, 12
 st32 $m6, $m11, $mzero, 2 * FRAME_K
 st32 $m6, $m11, $mzero, 2 * FRAME_K + 1
#if UN_COL
 setzi $m6, LANE_MASK >> 12
 shl $m6, $m6, 12
 or $m6, $m6, LANE_MASK & 0xFFF
 st32 $m6, $m11, $mzero, 2 * FRAME_MASK
 st32 $mzero, $m11, $mzero, 2 * FRAME_MASK + 1
#endif
 setzi $m6, .Lun_worker
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size UN_SYMBOL, .-UN_SYMBOL

// One aux instruction per lane: \op $a4, \x0 (, \y0) and $a5 likewise.
 .macro LANES2 op, d0, d1, x0, x1
 {
  nop
  \op \d0, \x0
 }
 {
  nop
  \op \d1, \x1
 }
 .endm
 .macro DIV2 d0, d1, n0, n1, q0, q1
 {
  nop
  f32div \d0, \n0, \q0
 }
 {
  nop
  f32div \d1, \n1, \q1
 }
 .endm

// The function of the f32 pair $a0:1 (and $a2:3 for sub/div) into $a4:5; $a14:15 = K.
 .macro FUNCTION
#if UN_OP == 1
 LANES2 f32tanh, $a4, $a5, $a0, $a1
#elif UN_OP == 2
 LANES2 f32sigm, $a4, $a5, $a0, $a1
#elif UN_OP == 3
 LANES2 f32sqrt, $a4, $a5, $a0, $a1
#elif UN_OP == 4
 DIV2 $a4, $a5, $a14, $a15, $a0, $a1
#elif UN_OP == 5
 {
  nop
  f32v2mul $a4:5, $a0:1, $a14:15
 }
#elif UN_OP == 7
 {
  nop
  f32v2sub $a4:5, $a0:1, $a2:3
 }
#elif UN_OP == 8
 DIV2 $a4, $a5, $a0, $a1, $a2, $a3
#elif UN_OP == 9
 {
  nop
  f32v2add $a4:5, $a0:1, $a2:3
 }
#elif UN_OP == 10
 {
  nop
  f32v2mul $a4:5, $a0:1, $a2:3
 }
#elif UN_OP == 11
 {
  nop
  f32v2max $a4:5, $a0:1, $a14:15
 }
#elif UN_OP == 12
 {
  nop
  f32v2max $a4:5, $a0:1, $a2:3
 }
#elif UN_OP == 13
 {
  nop
  f32v2min $a4:5, $a0:1, $a2:3
 }
#elif UN_OP == 6 && (UN_POW == 1 || UN_POW == 2 || UN_POW == 3 || UN_POW == 7)
 {
  nop
  f32v2mul $a4:5, $a0:1, $a0:1           // x^2
 }
#if UN_POW == 2
 {
  nop
  f32v2mul $a4:5, $a4:5, $a0:1           // x^2 x
 }
#elif UN_POW == 3
 {
  nop
  f32v2mul $a4:5, $a4:5, $a4:5           // (x^2)^2
 }
#elif UN_POW == 7
 DIV2 $a4, $a5, $a14, $a15, $a4, $a5     // 1 / x^2
#endif
#elif UN_OP == 6 && (UN_POW == 4 || UN_POW == 5)
 LANES2 f32sqrt, $a4, $a5, $a0, $a1
#if UN_POW == 5
 DIV2 $a4, $a5, $a14, $a15, $a4, $a5     // 1 / sqrt(x)
#endif
#elif UN_OP == 6 && UN_POW == 6
 DIV2 $a4, $a5, $a14, $a15, $a0, $a1
#else
#error "UN_OP / UN_POW name no function"
#endif
 .endm

 .section .text.un_worker,"ax",@progbits
 .worker
 .p2align 3
.Lun_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 // items of this worker: (ITEMS - w + 5) / 6, exact below 2^16
 sub $m5, $mzero, $m0
 add $m5, $m5, ITEMS + WORKER_CONTEXTS - 1
 mul $m5, $m5, 43691
 shr $m5, $m5, 18
 brz $m5, .Lun_idle
 ld32 $m3, $mvertex_base, $mzero, FRAME_OUT
 ld32 $m1, $mvertex_base, $mzero, FRAME_A
 ld32 $m2, $mvertex_base, $mzero, FRAME_B
 ld64 $a14:15, $mvertex_base, $mzero, FRAME_K
 mul $m4, $m0, ITEM_BYTES
#if UN_COL
 ld64 $a12:13, $mvertex_base, $mzero, FRAME_MASK
 mul $m7, $m0, 8 * UN_B_STEP   // b offset: its own walk (0 for a scalar b)
 mul $m6, $m0, UN_OUT_STRIDE   // output offset: its own walk (rows 8 or 4 bytes apart)
 .p2align 3
 {
  rpt $m5, (.Lun_col_end - .Lun_col_start) / 8 - 1
  fnop
 }
.Lun_col_start:
#if UN_F32
 {
  ld64step $a0:1, $m1, $m4+=, WORKER_CONTEXTS
  fnop
 }
#if (UN_OP >= 7 && UN_OP <= 10) || UN_OP == 12 || UN_OP == 13
 {
  ld64step $a2:3, $m2, $m7+=, WORKER_CONTEXTS * UN_B_STEP
  fnop
 }
#endif
 FUNCTION
#if UN_OUT_STRIDE == 4
 {
  st32step $a4, $m3, $m6+=, WORKER_CONTEXTS   // lane 0 alone: the row has no pad
  fnop
 }
#else
 {
  nop
  and64 $a4:5, $a4:5, $a12:13
 }
 {
  st64step $a4:5, $m3, $m6+=, WORKER_CONTEXTS
  fnop
 }
#endif
#else
 {
  ld64step $a6:7, $m1, $m4+=, WORKER_CONTEXTS
  fnop
 }
#if (UN_OP >= 7 && UN_OP <= 10) || UN_OP == 12 || UN_OP == 13
 {
  ld64step $a8:9, $m2, $m7+=, WORKER_CONTEXTS * UN_B_STEP
  f16v2tof32 $a0:1, $a6
 }
 {
  nop
  f16v2tof32 $a2:3, $a8
 }
#else
 {
  nop
  f16v2tof32 $a0:1, $a6
 }
#endif
 FUNCTION
 {
  nop
  f32v2tof16 $a6, $a4:5
 }
 {
  nop
  and64 $a6:7, $a6:7, $a12:13
 }
#if UN_OUT_STRIDE == 4
 {
  st32step $a6, $m3, $m6+=, WORKER_CONTEXTS   // the F16 element and its zero pad
  fnop
 }
#else
 {
  st64step $a6:7, $m3, $m6+=, WORKER_CONTEXTS
  fnop
 }
#endif
#endif
.Lun_col_end:
 exitz $mzero
#endif
 .p2align 3
 {
  rpt $m5, (.Lun_end - .Lun_start) / 8 - 1
  fnop
 }
.Lun_start:
#if UN_F32
 {
  ld64step $a0:1, $m1, $m4+=, 0
  fnop
 }
#if (UN_OP >= 7 && UN_OP <= 10) || UN_OP == 12 || UN_OP == 13
 {
  ld64step $a2:3, $m2, $m4+=, 0
  fnop
 }
#endif
 FUNCTION
 {
  st64step $a4:5, $m3, $m4+=, WORKER_CONTEXTS
  fnop
 }
#else
 {
  ld32step $a6, $m1, $m4+=, 0
  fnop
 }
#if (UN_OP >= 7 && UN_OP <= 10) || UN_OP == 12 || UN_OP == 13
 {
  ld32step $a7, $m2, $m4+=, 0
  f16v2tof32 $a0:1, $a6
 }
 {
  nop
  f16v2tof32 $a2:3, $a7
 }
#else
 {
  nop
  f16v2tof32 $a0:1, $a6
 }
#endif
 FUNCTION
 {
  nop
  f32v2tof16 $a6, $a4:5
 }
 {
  st32step $a6, $m3, $m4+=, WORKER_CONTEXTS
  fnop
 }
#endif
.Lun_end:
.Lun_idle:
 exitz $mzero

// select.S -- IPU21 integer and selection elementwise kernels on one tile, NumPy broadcast:
// equal (i32 1/0), where (cond != 0 ? a : b), i32 add and mul (wrapping).
//
// Written for ipu-stack from the Tile Vertex ISA (ldz8step/ldz16step/ld32step, add, mul,
// cmpeq, cmpult, shl, st32step, runall, exitz). Float equality is IEEE: +0.0 == -0.0, a NaN
// equals nothing. Flags from the unit name (kernels/units_indexing.py):
//   SEL_OP       1 add, 2 mul, 3 equal, 4 where      SEL_R, SEL_C  output rows, columns
//   SEL_OUT_BITS output element bits                 SEL_OSTRIDE   bytes between output rows
//   SEL_INPUTS   2 or 3                              SEL_FLOAT_BITS  equal on f16/f32 inputs
//   SEL_INi_BITS, SEL_INi_RSTEP (bytes per output row, 0: broadcast row),
//   SEL_INi_CSTEP (elements per output column, 0: broadcast column)
//   SEL_SYMBOL   the entry symbol
// ABI (supervisor): $m2 output, $m3.. inputs (where: cond, a, b); $m10 return address,
// $m11 stack. Worker w writes rows w, w + 6, ...
#include "ipu21_tile.h"
#include "ipu21_pack.inc"

 .set OUT_BITS, SEL_OUT_BITS
 .set FRAME_OUT, 0
 .set FRAME_IN, 1
 .set FRAME_BYTES, 16
#ifndef SEL_FLOAT_BITS
#define SEL_FLOAT_BITS 0
#endif
#ifndef SEL_IN2_BITS
#define SEL_IN2_BITS 32
#define SEL_IN2_RSTEP 0
#define SEL_IN2_CSTEP 0
#endif

// \reg <- input \i's pointer for the row in $m10
 .macro ROW_POINTER i, reg, rstep
 ld32 \reg, $mvertex_base, $mzero, FRAME_IN + \i
 .if \rstep
 setzi $m1, \rstep
 mul $m1, $m1, $m10
 add \reg, \reg, $m1
 .endif
 .endm

// $m0 <- (a == b) for the f16/f32 bits in $m0, $m1 (scratch $m11)
 .macro FLOAT_EQUAL
 or $m11, $m0, $m1
 shl $m11, $m11, 33 - SEL_FLOAT_BITS
 brz $m11, .Lse_true\@          // +0.0 == -0.0
 cmpeq $m11, $m0, $m1
 brz $m11, .Lse_done\@
 shl $m0, $m0, 33 - SEL_FLOAT_BITS
 .if SEL_FLOAT_BITS == 32
 CONST32 $m1, 0x7f800000 << 1
 .else
 CONST32 $m1, 0x7c00 << 17
 .endif
 cmpult $m11, $m1, $m0          // equal bits: a NaN is not equal to itself
 xor $m11, $m11, 1
 bri .Lse_done\@
.Lse_true\@:
 setzi $m11, 1
.Lse_done\@:
 or $m0, $m11, 0
 .endm

 .section .text.SEL_SYMBOL,"ax",@progbits
 .globl SEL_SYMBOL
 .type SEL_SYMBOL,@function
 .p2align 3
 .supervisor
SEL_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_IN
 st32 $m4, $m11, $mzero, FRAME_IN + 1
#if SEL_INPUTS > 2
 st32 $m5, $m11, $mzero, FRAME_IN + 2
#endif
 setzi $m6, .Lse_worker
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size SEL_SYMBOL, .-SEL_SYMBOL

 .section .text.se_worker,"ax",@progbits
 .worker
 .p2align 3
.Lse_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 WORKER_ROWS SEL_R
 brz $m6, .Lse_idle
 or $m10, $m0, 0                // the row
 ld32 $m2, $mvertex_base, $mzero, FRAME_OUT
 setzi $m1, SEL_OSTRIDE
 mul $m1, $m1, $m0
 add $m2, $m2, $m1
 zero $m8
 zero $m9
.Lse_row:
 ROW_POINTER 0, $m3, SEL_IN0_RSTEP
 ROW_POINTER 1, $m4, SEL_IN1_RSTEP
#if SEL_INPUTS > 2
 ROW_POINTER 2, $m5, SEL_IN2_RSTEP
#endif
 setzi $m7, SEL_C
.Lse_element:
#if SEL_OP == 4
 LOAD_STEP SEL_IN0_BITS, $m11, $mzero, $m3, SEL_IN0_CSTEP
 LOAD_STEP SEL_IN1_BITS, $m0, $mzero, $m4, SEL_IN1_CSTEP
 LOAD_STEP SEL_IN2_BITS, $m1, $mzero, $m5, SEL_IN2_CSTEP
 brnz $m11, .Lse_keep
 or $m0, $m1, 0
.Lse_keep:
#else
 LOAD_STEP SEL_IN0_BITS, $m0, $mzero, $m3, SEL_IN0_CSTEP
 LOAD_STEP SEL_IN1_BITS, $m1, $mzero, $m4, SEL_IN1_CSTEP
#if SEL_OP == 1
 add $m0, $m0, $m1
#elif SEL_OP == 2
 mul $m0, $m0, $m1
#elif SEL_FLOAT_BITS
 FLOAT_EQUAL
#else
 cmpeq $m0, $m0, $m1
#endif
#endif
 PUT_ELEMENT
 add $m7, $m7, -1
 brnz $m7, .Lse_element
 END_ROW SEL_C, SEL_OSTRIDE
 setzi $m1, (WORKER_CONTEXTS - 1) * SEL_OSTRIDE
 add $m2, $m2, $m1
 add $m10, $m10, WORKER_CONTEXTS
 add $m6, $m6, -1
 brnz $m6, .Lse_row
.Lse_idle:
 exitz $mzero

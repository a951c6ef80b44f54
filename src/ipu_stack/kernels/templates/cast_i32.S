// cast_i32.S -- IPU21 casts to and from i32 on one tile (the registry's cast_i32).
//
// Written for ipu-stack from the Tile Vertex ISA, integer instructions only (ldz16step,
// ld32step, shl/shr, clz, cmpult, st32step, runall, exitz): the rounding is done in the MRF,
// so no floating-point rounding mode or saturation rule is assumed.
//   float -> i32: toward zero; NaN -> 0; beyond the i32 range (infinities) saturates
//   i32 -> float: to nearest, ties to even (f16: 65520 and above -> inf)
//   i32 -> i32:   a copy
// Flags from the unit name (kernels/units_indexing.py):
//   CI_MODE      1 float -> i32, 2 i32 -> float, 0 i32 -> i32
//   CI_IN_BITS, CI_OUT_BITS  element bits          CI_R, CI_C  rows, columns
//   CI_ISTRIDE, CI_OSTRIDE   bytes between rows    CI_SYMBOL   the entry symbol
// ABI (supervisor): $m2 output, $m3 input; $m10 return address, $m11 stack. Worker w does
// rows w, w + 6, ...; $m12 is a scratch register of our workers (they take their state from
// $mvertex_base only).
#include "ipu21_tile.h"
#include "ipu21_pack.inc"

 .set OUT_BITS, CI_OUT_BITS
 .set FRAME_OUT, 0
 .set FRAME_IN, 1
 .set FRAME_BYTES, 8
#if CI_MODE == 1
 .set FB, CI_IN_BITS
#else
 .set FB, CI_OUT_BITS
#endif
 .if FB == 32
 .set MB, 23                    // mantissa bits
 .set BIAS, 127
 .set SAT_E, 158                // |x| >= 2**31
 .set INF_BITS, 0x7f800000
 .else
 .set MB, 10
 .set BIAS, 15
 .set SAT_E, 31                 // infinities (finite f16 fit i32)
 .set INF_BITS, 0x7c00
 .endif

// $m0 <- i32 of the float bits in $m0 ($m5 = +inf bits; scratch $m1, $m4, $m11)
 .macro TO_I32
 shr $m11, $m0, FB - 1          // sign
 shl $m1, $m0, 33 - FB
 shr $m1, $m1, 33 - FB          // magnitude
 cmpult $m4, $m5, $m1
 brnz $m4, .Lci_zero\@          // NaN
 shr $m4, $m1, MB               // biased exponent
 cmpult $m0, $m4, BIAS
 brnz $m0, .Lci_zero\@          // |x| < 1
 cmpult $m0, $m4, SAT_E
 brz $m0, .Lci_saturate\@
 shl $m1, $m1, 32 - MB
 shr $m1, $m1, 32 - MB
 setzi $m0, 1
 shl $m0, $m0, MB
 or $m1, $m1, $m0               // the significand with its hidden bit
 sub $m4, $m4, BIAS + MB        // binary point shift
 cmpslt $m0, $m4, 0
 brnz $m0, .Lci_right\@
 shl $m1, $m1, $m4
 bri .Lci_sign\@
.Lci_right\@:
 sub $m4, $mzero, $m4
 shr $m1, $m1, $m4              // drops the fraction: toward zero
.Lci_sign\@:
 brz $m11, .Lci_positive\@
 sub $m1, $mzero, $m1
.Lci_positive\@:
 or $m0, $m1, 0
 bri .Lci_end\@
.Lci_saturate\@:
 sub $m0, $mzero, 1
 shr $m0, $m0, 1
 add $m0, $m0, $m11             // INT_MAX, or INT_MIN when negative
 bri .Lci_end\@
.Lci_zero\@:
 zero $m0
.Lci_end\@:
 .endm

// $m0 <- the float bits of the i32 in $m0 (scratch $m1, $m4, $m5, $m11, $m12)
 .macro FROM_I32
 or $m11, $m0, 0                // the value (its sign is needed last)
 shr $m1, $m0, 31
 brz $m1, .Lcf_abs\@
 sub $m0, $mzero, $m0           // |x| as unsigned (INT_MIN stays 2**31)
.Lcf_abs\@:
 brz $m0, .Lcf_end\@
 clz $m4, $m0
 setzi $m1, 31
 sub $m4, $m1, $m4              // e: position of the top bit
 cmpult $m1, $m4, MB + 1
 brz $m1, .Lcf_round\@
 setzi $m1, MB
 sub $m1, $m1, $m4
 shl $m0, $m0, $m1              // exact
 add $m4, $m4, BIAS - 1
 shl $m4, $m4, MB
 bri .Lcf_pack\@
.Lcf_round\@:
 sub $m1, $m4, MB               // s: bits to drop (>= 1)
 add $m4, $m4, BIAS - 1
 shl $m4, $m4, MB
 shr $m5, $m0, $m1
 and $m5, $m5, 1
 add $m0, $m0, $m5              // + the kept lsb (ties to even)
 setzi $m12, 32
 sub $m12, $m12, $m1
 sub $m5, $mzero, 1
 shr $m5, $m5, 1
 shr $m5, $m5, $m12             // 2**(s-1) - 1
 add $m0, $m0, $m5
 shr $m0, $m0, $m1
.Lcf_pack\@:
 add $m0, $m0, $m4              // a carry out of the significand raises the exponent
 .if FB == 16
 cmpult $m1, $m0, INF_BITS
 brnz $m1, .Lcf_finite\@
 setzi $m0, INF_BITS
.Lcf_finite\@:
 .endif
 shr $m1, $m11, 31
 shl $m1, $m1, FB - 1
 or $m0, $m0, $m1
.Lcf_end\@:
 .endm

 .section .text.CI_SYMBOL,"ax",@progbits
 .globl CI_SYMBOL
 .type CI_SYMBOL,@function
 .p2align 3
 .supervisor
CI_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_IN
 setzi $m6, .Lci_worker
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size CI_SYMBOL, .-CI_SYMBOL

 .section .text.ci_worker,"ax",@progbits
 .worker
 .p2align 3
.Lci_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 WORKER_ROWS CI_R
 brz $m6, .Lci_idle
 ld32 $m2, $mvertex_base, $mzero, FRAME_OUT
 ld32 $m10, $mvertex_base, $mzero, FRAME_IN
 setzi $m1, CI_OSTRIDE
 mul $m1, $m1, $m0
 add $m2, $m2, $m1
 setzi $m1, CI_ISTRIDE
 mul $m1, $m1, $m0
 add $m10, $m10, $m1            // input row w
 zero $m8
 zero $m9
.Lci_row:
 or $m3, $m10, 0
 setzi $m7, CI_C
.Lci_element:
#if CI_MODE == 1
 CONST32 $m5, INF_BITS
#endif
 LOAD_STEP CI_IN_BITS, $m0, $mzero, $m3, 1
#if CI_MODE == 1
 TO_I32
#elif CI_MODE == 2
 FROM_I32
#endif
 PUT_ELEMENT
 add $m7, $m7, -1
 brnz $m7, .Lci_element
 END_ROW CI_C, CI_OSTRIDE
 setzi $m1, (WORKER_CONTEXTS - 1) * CI_OSTRIDE
 add $m2, $m2, $m1
 setzi $m1, WORKER_CONTEXTS * CI_ISTRIDE
 add $m10, $m10, $m1
 add $m6, $m6, -1
 brnz $m6, .Lci_row
.Lci_idle:
 exitz $mzero

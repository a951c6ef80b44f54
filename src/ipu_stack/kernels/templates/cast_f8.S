// cast_f8.S -- IPU21 casts between F143 (F8 with a power-of-two scale) and F16/F32 on one
// tile (the registry's cast with an F8 side).
//
// Written for ipu-stack from the Tile Vertex ISA, integer instructions only (ldz8step,
// ldz16step, ld32step, shl/shr, clz, cmpult, cmpslt, st32step, runall, exitz): the public ISA
// text we found names no F8 conversion instruction, so the conversion is done exactly in the
// MRF and no rounding rule is assumed. The registry semantics (runtime/sim.py map_semantics,
// kernels/semantics.py encode_f143/decode_f143):
//   to F8:   x / 2**SCALE clipped to +-240, rounded to nearest even (F143: bias 8, no
//            infinities, NaN 0x80, no negative zero)
//   from F8: the element times 2**SCALE, rounded to nearest even in F16/F32 (NaN -> the
//            negative quiet NaN NumPy produces)
// Flags from the unit name (kernels/units_indexing.py):
//   CF_MODE   1 to F8, 2 from F8      CF_IN_BITS, CF_OUT_BITS  element bits
//   CF_SCALE  the F8 side's scale exponent (signed)
//   CF_R, CF_C  rows, columns         CF_ISTRIDE, CF_OSTRIDE  bytes between rows
//   CF_SYMBOL   the entry symbol
// ABI (supervisor): $m2 output, $m3 input; $m10 return address, $m11 stack. Worker w does
// rows w, w + 6, ...; $m12 is a scratch register of our workers.
#include "ipu21_tile.h"
#include "ipu21_pack.inc"

 .set OUT_BITS, CF_OUT_BITS
 .set FRAME_OUT, 0
 .set FRAME_IN, 1
 .set FRAME_BYTES, 8
// the source format (I*) and the target format (O*): mantissa bits, bias
 .if CF_IN_BITS == 32
 .set MBI, 23
 .set BIASI, 127
 .elseif CF_IN_BITS == 16
 .set MBI, 10
 .set BIASI, 15
 .else
 .set MBI, 3
 .set BIASI, 8
 .endif
 .if CF_OUT_BITS == 32
 .set MBO, 23
 .set BIASO, 127
 .set OSAT, 0x7f800000          // overflow: +inf
 .set ONAN, 0xffc00000
 .elseif CF_OUT_BITS == 16
 .set MBO, 10
 .set BIASO, 15
 .set OSAT, 0x7c00
 .set ONAN, 0xfe00
 .else
 .set MBO, 3
 .set BIASO, 8
 .set OSAT, 0x7f                // 240: the clip
 .set ONAN, 0x80
 .endif
 .if CF_MODE == 1
 .set SCALE_ADD, -(CF_SCALE)    // value / 2**SCALE
 .else
 .set SCALE_ADD, CF_SCALE       // value * 2**SCALE
 .endif

// $m0 <- the target bits of sign $m12, significand $m0 (> 0), exponent $m4:
// value = $m0 * 2**$m4, rounded to nearest even (scratch $m1, $m5, $m11)
 .macro ENCODE
 clz $m1, $m0
 setzi $m5, 31
 sub $m1, $m5, $m1              // e: the top bit of the significand
 add $m4, $m4, $m1
 add $m4, $m4, BIASO            // the biased target exponent
 cmpslt $m5, $m4, 1
 brnz $m5, .Lcf_subnormal\@
 sub $m1, $m1, MBO              // bits to drop (negative: to add)
 add $m4, $m4, -1
 shl $m4, $m4, MBO              // exponent field less the hidden bit's
 bri .Lcf_shift\@
.Lcf_subnormal\@:
 sub $m1, $m1, MBO
 add $m1, $m1, 1
 sub $m1, $m1, $m4
 zero $m4
.Lcf_shift\@:
 cmpslt $m5, $m1, 1
 brz $m5, .Lcf_right\@
 sub $m1, $mzero, $m1
 shl $m0, $m0, $m1
 bri .Lcf_pack\@
.Lcf_right\@:
 cmpult $m5, $m1, 32
 brnz $m5, .Lcf_round\@
 zero $m0                       // below half the smallest step
 bri .Lcf_pack\@
.Lcf_round\@:
 shr $m5, $m0, $m1
 and $m5, $m5, 1
 add $m0, $m0, $m5              // + the kept lsb (ties to even)
 setzi $m11, 32
 sub $m11, $m11, $m1
 sub $m5, $mzero, 1
 shr $m5, $m5, 1
 shr $m5, $m5, $m11             // 2**(s-1) - 1
 add $m0, $m0, $m5
 shr $m0, $m0, $m1
.Lcf_pack\@:
 add $m0, $m0, $m4              // a carry out of the significand raises the exponent
 CONST32 $m5, OSAT
 cmpult $m1, $m5, $m0
 brz $m1, .Lcf_in_range\@
 or $m0, $m5, 0
.Lcf_in_range\@:
 .if CF_OUT_BITS == 8
 brz $m0, .Lcf_end\@            // F143 has no negative zero
 .endif
 shl $m5, $m12, CF_OUT_BITS - 1
 or $m0, $m0, $m5
.Lcf_end\@:
 .endm

// the element in $m0 -> target bits in $m0
 .macro CONVERT
 shr $m12, $m0, CF_IN_BITS - 1  // sign
 .if CF_IN_BITS == 8
 setzi $m1, 0x80
 cmpeq $m1, $m0, $m1            // the F143 NaN
 .else
 shl $m0, $m0, 33 - CF_IN_BITS
 shr $m0, $m0, 33 - CF_IN_BITS  // magnitude
 CONST32 $m1, ((1 << (CF_IN_BITS - 1 - MBI)) - 1) << MBI
 cmpult $m1, $m1, $m0           // NaN: magnitude above infinity
 .endif
 brz $m1, .Lcv_number\@
 CONST32 $m0, ONAN
 bri .Lcv_end\@
.Lcv_number\@:
 .if CF_IN_BITS == 8
 and $m0, $m0, 0x7f
 .endif
 shr $m4, $m0, MBI              // biased exponent
 shl $m0, $m0, 32 - MBI
 shr $m0, $m0, 32 - MBI         // fraction
 brz $m4, .Lcv_small\@
 setzi $m1, 1
 shl $m1, $m1, MBI
 or $m0, $m0, $m1               // hidden bit
 add $m4, $m4, -(BIASI + MBI) + SCALE_ADD
 bri .Lcv_encode\@
.Lcv_small\@:
 brz $m0, .Lcv_end\@            // zero: +0 (F143 holds no -0)
 setzi $m4, 0
 add $m4, $m4, 1 - BIASI - MBI + SCALE_ADD
.Lcv_encode\@:
 ENCODE
.Lcv_end\@:
 .endm

 .section .text.CF_SYMBOL,"ax",@progbits
 .globl CF_SYMBOL
 .type CF_SYMBOL,@function
 .p2align 3
 .supervisor
CF_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_IN
 setzi $m6, .Lcf_worker
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size CF_SYMBOL, .-CF_SYMBOL

 .section .text.cf_worker,"ax",@progbits
 .worker
 .p2align 3
.Lcf_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 WORKER_ROWS CF_R
 brz $m6, .Lcf_idle
 ld32 $m2, $mvertex_base, $mzero, FRAME_OUT
 ld32 $m10, $mvertex_base, $mzero, FRAME_IN
 setzi $m1, CF_OSTRIDE
 mul $m1, $m1, $m0
 add $m2, $m2, $m1
 setzi $m1, CF_ISTRIDE
 mul $m1, $m1, $m0
 add $m10, $m10, $m1            // input row w
 zero $m8
 zero $m9
.Lcf_row:
 or $m3, $m10, 0
 setzi $m7, CF_C
.Lcf_element:
 LOAD_STEP CF_IN_BITS, $m0, $mzero, $m3, 1
 CONVERT
 PUT_ELEMENT
 add $m7, $m7, -1
 brnz $m7, .Lcf_element
 END_ROW CF_C, CF_OSTRIDE
 setzi $m1, (WORKER_CONTEXTS - 1) * CF_OSTRIDE
 add $m2, $m2, $m1
 setzi $m1, WORKER_CONTEXTS * CF_ISTRIDE
 add $m10, $m10, $m1
 add $m6, $m6, -1
 brnz $m6, .Lcf_row
.Lcf_idle:
 exitz $mzero

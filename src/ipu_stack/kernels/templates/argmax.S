// argmax.S -- IPU21 row argmax on one tile (the registry's argmax): the index of the first
// maximum of each row, as i32 in rows of ARGMAX_OSTRIDE bytes (padding zero).
//
// Written for ipu-stack from the Tile Vertex ISA (ldz16step/ld32step, shl/shr, cmpslt,
// cmpult, st32step, runall, exitz). Floats compare as signed integer keys: +magnitude for
// positive values, -magnitude for negative ones (so -0.0 == +0.0), NaN the largest key (the
// first NaN wins, as NumPy's argmax). Flags from the unit name (kernels/units_indexing.py):
//   ARGMAX_BITS   element bits (16 f16, 32 f32/i32)   ARGMAX_FLOAT  1 for f16/f32
//   ARGMAX_R, ARGMAX_C  rows, columns                  ARGMAX_ISTRIDE  bytes between rows
//   ARGMAX_OSTRIDE  bytes between output rows          ARGMAX_SYMBOL   the entry symbol
// ABI (supervisor): $m2 output, $m3 input; $m10 return address, $m11 stack. Worker w does
// rows w, w + 6, ...
#include "ipu21_tile.h"
#include "ipu21_pack.inc"

 .set OUT_BITS, 32
 .set FB, ARGMAX_BITS
 .set FRAME_OUT, 0
 .set FRAME_IN, 1
 .set FRAME_BYTES, 8

// $m0 <- the comparison key of element $m0 (scratch $m1, $m11; $m3 = +inf bits, $m9 = INT_MAX)
 .macro KEY
 .if ARGMAX_FLOAT
 shl $m1, $m0, 33 - FB
 shr $m1, $m1, 33 - FB          // magnitude bits
 shr $m0, $m0, FB - 1           // sign
 cmpult $m11, $m3, $m1          // NaN: magnitude above +inf
 brz $m0, .Lam_positive\@
 sub $m1, $mzero, $m1
.Lam_positive\@:
 brz $m11, .Lam_number\@
 or $m1, $m9, 0
.Lam_number\@:
 or $m0, $m1, 0
 .endif
 .endm

 .section .text.ARGMAX_SYMBOL,"ax",@progbits
 .globl ARGMAX_SYMBOL
 .type ARGMAX_SYMBOL,@function
 .p2align 3
 .supervisor
ARGMAX_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_IN
 setzi $m6, .Lam_worker
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size ARGMAX_SYMBOL, .-ARGMAX_SYMBOL

 .section .text.am_worker,"ax",@progbits
 .worker
 .p2align 3
.Lam_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 WORKER_ROWS ARGMAX_R
 brz $m6, .Lam_idle
 ld32 $m2, $mvertex_base, $mzero, FRAME_OUT
 ld32 $m10, $mvertex_base, $mzero, FRAME_IN
 setzi $m1, ARGMAX_OSTRIDE
 mul $m1, $m1, $m0
 add $m2, $m2, $m1
 setzi $m1, ARGMAX_ISTRIDE
 mul $m1, $m1, $m0
 add $m10, $m10, $m1            // row w of the input
 .if FB == 32
 CONST32 $m3, 0x7f800000
 .else
 setzi $m3, 0x7c00
 .endif
 sub $m9, $mzero, 1
 shr $m9, $m9, 1                // INT_MAX
.Lam_row:
 or $m8, $m10, 0
 LOAD_STEP FB, $m0, $mzero, $m8, 1
 KEY
 or $m4, $m0, 0                 // best key
 zero $m5                       // its index
 setzi $m7, ARGMAX_C - 1
 brz $m7, .Lam_store
.Lam_element:
 LOAD_STEP FB, $m0, $mzero, $m8, 1
 KEY
 cmpslt $m1, $m4, $m0
 brz $m1, .Lam_next
 or $m4, $m0, 0
 setzi $m5, ARGMAX_C
 sub $m5, $m5, $m7
.Lam_next:
 add $m7, $m7, -1
 brnz $m7, .Lam_element
.Lam_store:
 st32step $m5, $mzero, $m2+=, 1
 END_ROW 1, ARGMAX_OSTRIDE
 setzi $m1, (WORKER_CONTEXTS - 1) * ARGMAX_OSTRIDE
 add $m2, $m2, $m1
 setzi $m1, WORKER_CONTEXTS * ARGMAX_ISTRIDE
 add $m10, $m10, $m1
 add $m6, $m6, -1
 brnz $m6, .Lam_row
.Lam_idle:
 exitz $mzero

// transpose.S -- IPU21 local transpose on one tile: out[s, x] = staging[x, COL + s].
//
// Written for ipu-stack from the Tile Vertex ISA (ldz8step/ldz16step/ld32step with a stride
// register, st32step, runall, exitz). The registry's `transpose` kernel (the local step of an
// on-chip transpose, attention's K^T). Flags from the unit name (kernels/units_indexing.py):
//   TR_BITS     element bits (8 f8, 16 f16, 32 f32/i32)
//   TR_X        columns of the output = rows of the staging strip
//   TR_S        rows of the output = staging columns used
//   TR_ISTRIDE  bytes between staging rows       TR_COL  first staging column
//   TR_OSTRIDE  bytes between output rows (row padding is written as zeros)
//   TR_SYMBOL   the entry symbol
// ABI (supervisor): $m2 output, $m3 staging; $m10 return address, $m11 stack. Worker w writes
// output rows w, w + 6, ...: each row walks one staging column down with a stride register
// and packs the elements into 32-bit stores.
#include "ipu21_tile.h"
#include "ipu21_pack.inc"

 .set OUT_BITS, TR_BITS
 .set EB, TR_BITS / 8
 .set FRAME_OUT, 0
 .set FRAME_IN, 1
 .set FRAME_BYTES, 8

 .section .text.TR_SYMBOL,"ax",@progbits
 .globl TR_SYMBOL
 .type TR_SYMBOL,@function
 .p2align 3
 .supervisor
TR_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_IN
 setzi $m6, .Ltr_worker
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size TR_SYMBOL, .-TR_SYMBOL

 .section .text.tr_worker,"ax",@progbits
 .worker
 .p2align 3
.Ltr_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 WORKER_ROWS TR_S
 brz $m6, .Ltr_idle
 ld32 $m2, $mvertex_base, $mzero, FRAME_OUT
 ld32 $m4, $mvertex_base, $mzero, FRAME_IN
 setzi $m1, TR_OSTRIDE
 mul $m1, $m1, $m0
 add $m2, $m2, $m1             // output row w
 add $m1, $m0, TR_COL
 mul $m1, $m1, EB
 add $m4, $m4, $m1             // staging column COL + w
 setzi $m5, TR_ISTRIDE / EB    // staging row stride in elements
 setzi $m10, (WORKER_CONTEXTS - 1) * TR_OSTRIDE
 zero $m8
 zero $m9
.Ltr_row:
 or $m3, $m4, 0
 setzi $m7, TR_X
.Ltr_element:
 LOAD_STEP TR_BITS, $m0, $mzero, $m3, $m5
 PUT_ELEMENT
 add $m7, $m7, -1
 brnz $m7, .Ltr_element
 END_ROW TR_X, TR_OSTRIDE
 add $m2, $m2, $m10            // skip the other workers' rows
 add $m4, $m4, WORKER_CONTEXTS * EB
 add $m6, $m6, -1
 brnz $m6, .Ltr_row
.Ltr_idle:
 exitz $mzero

// concat.S -- IPU21 concatenation along the columns on one tile (the registry's concat).
//
// Written for ipu-stack from the Tile Vertex ISA (ldz8step/ldz16step/ld32step, st32step,
// runall, exitz). out[r] = in0[r] ++ in1[r] ++ ...; every row padded with zeros to its stride.
// Flags from the unit name (kernels/units_indexing.py):
//   CONCAT_BITS     element bits (8, 16, 32)      CONCAT_ROWS    rows
//   CONCAT_INPUTS   inputs (1..6)                 CONCAT_COLS    output columns
//   CONCAT_OSTRIDE  bytes between output rows     CONCAT_Wj, CONCAT_Sj  input j's columns, stride
//   CONCAT_SYMBOL   the entry symbol
// ABI (supervisor): $m2 output, $m3.. inputs; $m10 return address, $m11 stack. Worker w
// writes rows w, w + 6, ...; elements are packed into 32-bit stores across input boundaries.
#include "ipu21_tile.h"
#include "ipu21_pack.inc"

 .set OUT_BITS, CONCAT_BITS
 .set FRAME_OUT, 0
 .set FRAME_IN, 1
 .set FRAME_BYTES, 32

// the elements of input \j's row $m10 appended to the output row
 .macro CONCAT_INPUT j, width, stride
 ld32 $m3, $mvertex_base, $mzero, FRAME_IN + \j
 setzi $m1, \stride
 mul $m1, $m1, $m10
 add $m3, $m3, $m1
 setzi $m7, \width
.Lcc_element\@:
 LOAD_STEP CONCAT_BITS, $m0, $mzero, $m3, 1
 PUT_ELEMENT
 add $m7, $m7, -1
 brnz $m7, .Lcc_element\@
 .endm

 .section .text.CONCAT_SYMBOL,"ax",@progbits
 .globl CONCAT_SYMBOL
 .type CONCAT_SYMBOL,@function
 .p2align 3
 .supervisor
CONCAT_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_IN
#if CONCAT_INPUTS > 1
 st32 $m4, $m11, $mzero, FRAME_IN + 1
#endif
#if CONCAT_INPUTS > 2
 st32 $m5, $m11, $mzero, FRAME_IN + 2
#endif
#if CONCAT_INPUTS > 3
 st32 $m6, $m11, $mzero, FRAME_IN + 3
#endif
#if CONCAT_INPUTS > 4
 st32 $m7, $m11, $mzero, FRAME_IN + 4
#endif
#if CONCAT_INPUTS > 5
 st32 $m8, $m11, $mzero, FRAME_IN + 5
#endif
 setzi $m9, .Lcc_worker
 runall $m9, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size CONCAT_SYMBOL, .-CONCAT_SYMBOL

 .section .text.cc_worker,"ax",@progbits
 .worker
 .p2align 3
.Lcc_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 WORKER_ROWS CONCAT_ROWS
 brz $m6, .Lcc_idle
 or $m10, $m0, 0                // the row
 ld32 $m2, $mvertex_base, $mzero, FRAME_OUT
 setzi $m1, CONCAT_OSTRIDE
 mul $m1, $m1, $m0
 add $m2, $m2, $m1
 zero $m8
 zero $m9
.Lcc_row:
 CONCAT_INPUT 0, CONCAT_W0, CONCAT_S0
#if CONCAT_INPUTS > 1
 CONCAT_INPUT 1, CONCAT_W1, CONCAT_S1
#endif
#if CONCAT_INPUTS > 2
 CONCAT_INPUT 2, CONCAT_W2, CONCAT_S2
#endif
#if CONCAT_INPUTS > 3
 CONCAT_INPUT 3, CONCAT_W3, CONCAT_S3
#endif
#if CONCAT_INPUTS > 4
 CONCAT_INPUT 4, CONCAT_W4, CONCAT_S4
#endif
#if CONCAT_INPUTS > 5
 CONCAT_INPUT 5, CONCAT_W5, CONCAT_S5
#endif
 END_ROW CONCAT_COLS, CONCAT_OSTRIDE
 setzi $m1, (WORKER_CONTEXTS - 1) * CONCAT_OSTRIDE
 add $m2, $m2, $m1
 add $m10, $m10, WORKER_CONTEXTS
 add $m6, $m6, -1
 brnz $m6, .Lcc_row
.Lcc_idle:
 exitz $mzero

// broadcast.S -- IPU21 row-broadcast add/mul on one tile: out[r, c] = a[r, c] (+|*) b[c].
//
// Written for ipu-stack from the ISA facts in shared/docs/ipu21-facts.md (§16.3 ld64step,
// st64step, rpt, runall, exitz; §16.2 bundles). One compile unit per variant; the flags come
// from the unit name {add|mul}_{f16|f32}_rowbcast_r{R}_c{C} (kernels/units.py):
//   BC_OP        1 add, 2 mul
//   BC_F32       f32 operands (f32v2), else f16 (f16v4)
//   BC_ROWS      R rows
//   BC_ATOMS     64-bit atoms per row (C * element bytes / 8)
//   BC_SYMBOL    the entry symbol
// ABI (supervisor, like the map kernels): $m2 output [R, C], $m3 a [R, C] (rows contiguous),
// $m4 b [1, C] (the row vector), all 8-byte aligned; $m10 return address, $m11 stack.
// Worker w handles rows w, w + 6, w + 12, ...
// Column form (BC_COLUMN, units {add|mul}_{f16|f32}_{colbcast|scalarbcast}_rR_cC of
// kernels/units_unary.py): out[r, c] = a[r, c] (+|*) b[r]; $m4 points at the column, one
// value per 8-byte row as the lowering stages an [R, 1] view (BC_COL_STEP 1), or at one
// scalar (BC_COL_STEP 0). The value is loaded once per row and broadcast to the lanes
// (ldb16 for f16, two ld32 for f32).
#include "ipu21_tile.h"

#ifndef BC_ROWS
#error "BC_ROWS is required"
#endif
#ifndef BC_ATOMS
#error "BC_ATOMS is required"
#endif
#ifndef BC_COLUMN
#define BC_COLUMN 0
#endif

 .set ROWS, BC_ROWS
 .set ROW_BYTES, BC_ATOMS * 8
 .set FRAME_OUT, 0
 .set FRAME_A, 1
 .set FRAME_B, 2
 .set FRAME_BYTES, 16

#ifndef BC_SWAP
#define BC_SWAP 0
#endif
#if BC_OP == 1
#if BC_F32
#define BC_INSN f32v2add
#else
#define BC_INSN f16v4add
#endif
#elif BC_OP == 2
#if BC_F32
#define BC_INSN f32v2mul
#else
#define BC_INSN f16v4mul
#endif
#elif BC_OP == 3
#if BC_F32
#define BC_INSN f32v2sub
#else
#define BC_INSN f16v4sub
#endif
#endif

// out pair \d = a \x (op) broadcast \y, or \y (op) \x with BC_SWAP (sub, div: units_unary.py
// r-forms). BC_OP 4 divides in f32 (f16 widened, rounded once); $a6:9 are its scratch.
 .macro F32DIV d0, d1, n0, n1, q0, q1
 {
  nop
  f32div \d0, \n0, \q0
 }
 {
  nop
  f32div \d1, \n1, \q1
 }
 .endm
 .macro F16DIV d, x, y           // two f16 lanes, widened, divided, rounded once
 {
  nop
  f16v2tof32 $a6:7, \x
 }
 {
  nop
  f16v2tof32 $a8:9, \y
 }
#if BC_SWAP
 F32DIV $a6, $a7, $a8, $a9, $a6, $a7
#else
 F32DIV $a6, $a7, $a6, $a7, $a8, $a9
#endif
 {
  nop
  f32v2tof16 \d, $a6:7
 }
 .endm
 .macro BC_APPLY d, d0, d1, x, x0, x1, y, y0, y1
#if BC_OP != 4
 {
  nop
#if BC_SWAP
  BC_INSN \d, \y, \x
#else
  BC_INSN \d, \x, \y
#endif
 }
#elif BC_F32
#if BC_SWAP
 F32DIV \d0, \d1, \y0, \y1, \x0, \x1
#else
 F32DIV \d0, \d1, \x0, \x1, \y0, \y1
#endif
#else
 F16DIV \d0, \x0, \y0
 F16DIV \d1, \x1, \y1
#endif
 .endm

 .section .text.BC_SYMBOL,"ax",@progbits
 .globl BC_SYMBOL
 .type BC_SYMBOL,@function
 .p2align 3
 .supervisor
BC_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_A
 st32 $m4, $m11, $mzero, FRAME_B
 setzi $m6, .Lbc_worker
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size BC_SYMBOL, .-BC_SYMBOL

 .section .text.bc_worker,"ax",@progbits
 .worker
 .p2align 3
.Lbc_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 // rows of this worker: (ROWS - w + 5) / 6, exact below 2^16
 sub $m5, $mzero, $m0
 add $m5, $m5, ROWS + WORKER_CONTEXTS - 1
 mul $m5, $m5, 43691
 shr $m5, $m5, 18
 brz $m5, .Lbc_idle
 ld32 $m3, $mvertex_base, $mzero, FRAME_OUT
 ld32 $m1, $mvertex_base, $mzero, FRAME_A
 ld32 $m2, $mvertex_base, $mzero, FRAME_B
 mul $m6, $m0, ROW_BYTES       // byte offset of this worker's first row
 setzi $m8, BC_ATOMS
#if BC_COLUMN
 mul $m7, $m0, 8 * BC_COL_STEP // this worker's first column value (8-byte rows)
.Lbc_col_row:
#if BC_F32
 ld32 $a2, $m2, $m7, 0
 ld32 $a3, $m2, $m7, 0
#else
 ldb16 $a2, $m2, $m7, 0
 ldb16 $a3, $m2, $m7, 0
#endif
 add $m4, $m6, 0               // a / out offset: walks the row
 .p2align 3
 {
  rpt $m8, (.Lbc_col_end - .Lbc_col_start) / 8 - 1
  fnop
 }
.Lbc_col_start:
 {
  ld64step $a0:1, $m1, $m4+=, 0
  fnop
 }
 BC_APPLY $a4:5, $a4, $a5, $a0:1, $a0, $a1, $a2:3, $a2, $a3
 {
  st64step $a4:5, $m3, $m4+=, 1
  fnop
 }
.Lbc_col_end:
 add $m7, $m7, WORKER_CONTEXTS * 8 * BC_COL_STEP
 add $m6, $m6, ROW_BYTES * WORKER_CONTEXTS
 add $m5, $m5, -1
 brnz $m5, .Lbc_col_row
 exitz $mzero
#endif
.Lbc_row:
 add $m4, $m6, 0               // a / out offset: walks the row
 zero $m7                      // b offset: walks the vector
 .p2align 3
 {
  rpt $m8, (.Lbc_row_end - .Lbc_row_start) / 8 - 1
  fnop
 }
.Lbc_row_start:
 {
  ld64step $a0:1, $m1, $m4+=, 0
  fnop
 }
 {
  ld64step $a2:3, $m2, $m7+=, 1
  fnop
 }
 BC_APPLY $a4:5, $a4, $a5, $a0:1, $a0, $a1, $a2:3, $a2, $a3
 {
  st64step $a4:5, $m3, $m4+=, 1
  fnop
 }
.Lbc_row_end:
 add $m6, $m6, WORKER_CONTEXTS * ROW_BYTES
 add $m5, $m5, -1
 brnz $m5, .Lbc_row
.Lbc_idle:
 exitz $mzero

// elementwise.S -- IPU21 elementwise kernels on one tile: add, mul (F16 or F32), copy, fill.
//
// Written for ipu-stack from the ISA facts in shared/docs/ipu21-facts.md (§16.3: ld64step,
// st64step, rpt, runall, exitz; §16.2 bundles). One compile unit per variant; the flags come
// from the unit name (kernels/units.py):
//   EW_OP        1 add, 2 mul, 3 copy, 4 fill (zero), 5 copy of 32-bit words (sizes 4 mod 8)
//   EW_F32       operands are f32 (f32v2 arithmetic), else f16 (f16v4)
//   EW_ATOMS     64-bit atoms of the output (elements * element bytes / 8); words for EW_OP 5
//   EW_SYMBOL    the entry symbol
// ABI (supervisor): $m2 output; add/mul: $m3, $m4 inputs; copy: $m3 source; all 8-byte
// aligned (EW_OP 5: 4-byte aligned); $m10 return address, $m11 stack. Worker w handles
// atoms (EW_OP 5: words) w, w + 6, w + 12, ...
#include "ipu21_tile.h"

#ifndef EW_OP
#error "EW_OP is required"
#endif
#ifndef EW_ATOMS
#error "EW_ATOMS is required"
#endif

 .set ATOMS, EW_ATOMS
 .set FRAME_OUT, 0
 .set FRAME_A, 1
 .set FRAME_B, 2
 .set FRAME_BYTES, 16

 .section .text.EW_SYMBOL,"ax",@progbits
 .globl EW_SYMBOL
 .type EW_SYMBOL,@function
 .p2align 3
 .supervisor
EW_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_A
 st32 $m4, $m11, $mzero, FRAME_B
 setzi $m6, .Lew_worker
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size EW_SYMBOL, .-EW_SYMBOL

 .section .text.ew_worker,"ax",@progbits
 .worker
 .p2align 3
.Lew_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 // atoms of this worker: (ATOMS - w + 5) / 6
 sub $m5, $mzero, $m0
 add $m5, $m5, ATOMS + WORKER_CONTEXTS - 1
 // unsigned divide by 6 as a multiply: (x * 43691) >> 18 is exact for x < 2^16
 mul $m5, $m5, 43691
 shr $m5, $m5, 18
 brz $m5, .Lew_idle
#if EW_OP != 5
 shl $m4, $m0, 3
#else
 shl $m4, $m0, 2
#endif
 ld32 $m3, $mvertex_base, $mzero, FRAME_OUT
 ld32 $m1, $mvertex_base, $mzero, FRAME_A
 ld32 $m2, $mvertex_base, $mzero, FRAME_B
#if EW_OP == 4
 .p2align 3
 {
  rpt $m5, 0
  fnop
 }
 {
  st64step $azeros, $m3, $m4+=, WORKER_CONTEXTS
  fnop
 }
#elif EW_OP == 3
 .p2align 3
 {
  rpt $m5, 1
  fnop
 }
 {
  ld64step $a0:1, $m1, $m4+=, 0
  fnop
 }
 {
  st64step $a0:1, $m3, $m4+=, WORKER_CONTEXTS
  fnop
 }
#elif EW_OP == 5
 .p2align 3
 {
  rpt $m5, 1
  fnop
 }
 {
  ld32step $a0, $m1, $m4+=, 0
  fnop
 }
 {
  st32step $a0, $m3, $m4+=, WORKER_CONTEXTS
  fnop
 }
#else
#if EW_OP == 1
#if EW_F32
#define EW_INSN f32v2add
#else
#define EW_INSN f16v4add
#endif
#else
#if EW_F32
#define EW_INSN f32v2mul
#else
#define EW_INSN f16v4mul
#endif
#endif
 .p2align 3
 {
  rpt $m5, 3
  fnop
 }
 {
  ld64step $a0:1, $m1, $m4+=, 0
  fnop
 }
 {
  ld64step $a2:3, $m2, $m4+=, 0
  fnop
 }
 {
  nop
  EW_INSN $a4:5, $a0:1, $a2:3
 }
 {
  st64step $a4:5, $m3, $m4+=, WORKER_CONTEXTS
  fnop
 }
#endif
.Lew_idle:
 exitz $mzero

// elementwise.S -- IPU21 elementwise kernels on one tile: add, mul (F16 or F32), copy, fill.
//
// Written for ipu-stack from the ISA facts in shared/docs/ipu21-facts.md (§16.3: ld64step,
// st64step, rpt, runall, exitz; §16.2 bundles). One compile unit per variant; the flags come
// from the unit name (kernels/units.py):
//   EW_OP        1 add, 2 mul, 3 copy, 4 fill (zero), 5 copy of 32-bit words (sizes 4 mod 8),
//                6 copy of runs in 64-bit atoms, 7 copy of runs in 32-bit words (copy2d)
//   EW_F32       operands are f32 (f32v2 arithmetic), else f16 (f16v4)
//   EW_ATOMS     64-bit atoms of the output (elements * element bytes / 8); words for EW_OP 5;
//                atoms (EW_OP 7: words) per run for EW_OP 6 and 7
//   EW_RUNS      runs (EW_OP 6 and 7)
//   EW_SYMBOL    the entry symbol
// ABI (supervisor): $m2 output; add/mul: $m3, $m4 inputs; copy: $m3 source; all 8-byte
// aligned (EW_OP 5: 4-byte aligned); $m10 return address, $m11 stack. Worker w handles
// atoms (EW_OP 5: words) w, w + 6, w + 12, ...
// Runs (EW_OP 6, 7; the registry's copy2d): $m2 destination, $m3 source, $m4 bytes per run,
// $m5 runs (both fixed by the unit; not read), $m6 destination stride, $m7 source stride
// (bytes, read at run time); run r copies from $m3 + r * $m7 to $m2 + r * $m6. EW_OP 6 needs
// addresses and strides 8-byte aligned, EW_OP 7 4-byte aligned. The RUNS * ATOMS atoms, in
// run order, are split into six contiguous ranges of equal size (+-1); worker w copies its
// range, which may start and end inside a run: per run it pays two pointer steps, the `rpt`
// and a loop count and branch (five bundles), and runs no longer than six atoms still keep
// all six workers busy.
#include "ipu21_tile.h"

#ifndef EW_OP
#error "EW_OP is required"
#endif
#ifndef EW_ATOMS
#error "EW_ATOMS is required"
#endif

#if EW_OP < 6
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
#else
// ---- copy of runs (copy2d): EW_OP 6 (64-bit atoms) or 7 (32-bit words) --------------------
#ifndef EW_RUNS
#error "EW_RUNS is required for a copy of runs"
#endif
 .set C2_ATOMS, EW_ATOMS
 .set C2_TOTAL, EW_ATOMS * EW_RUNS
#if EW_OP == 6
 .set C2_UNIT, 8
#else
 .set C2_UNIT, 4
#endif
 .set C2_RUN_BYTES, C2_ATOMS * C2_UNIT
 .set FRAME_OUT, 0
 .set FRAME_SRC, 1
 .set FRAME_DST_STRIDE, 2
 .set FRAME_SRC_STRIDE, 3
 .set FRAME_BYTES, 16

#if EW_OP == 6
#define C2_LOAD ld64step $a0:1, $m1, $m4+=, 0
#define C2_STORE st64step $a0:1, $m3, $m4+=, 1
#else
#define C2_LOAD ld32step $a0, $m1, $m4+=, 0
#define C2_STORE st32step $a0, $m3, $m4+=, 1
#endif

 .section .text.EW_SYMBOL,"ax",@progbits
 .globl EW_SYMBOL
 .type EW_SYMBOL,@function
 .p2align 3
 .supervisor
EW_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_SRC
 st32 $m6, $m11, $mzero, FRAME_DST_STRIDE
 st32 $m7, $m11, $mzero, FRAME_SRC_STRIDE
 setzi $m8, .Lc2_worker
 runall $m8, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size EW_SYMBOL, .-EW_SYMBOL

 .section .text.c2_worker,"ax",@progbits
 .worker
 .p2align 3
.Lc2_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 // jump to this worker's block of constants (six blocks of equal size)
 mul $m0, $m0, .Lc2_w1 - .Lc2_w0
 setzi $m1, .Lc2_w0
 add $m1, $m1, $m0
 br $m1
 // worker w: atoms [S, E) of the flat run-order index, S = w * TOTAL / 6; it starts at atom
 // O0 of run R0, copies N0 atoms to the end of that run (or of its range), then F whole runs,
 // then NL atoms of the run after them (F = NL = 0 when the range ends in run R0)
 .irp w, 0, 1, 2, 3, 4, 5
 .set C2_S_\w, (\w * C2_TOTAL) / WORKER_CONTEXTS
 .set C2_E_\w, ((\w + 1) * C2_TOTAL) / WORKER_CONTEXTS
 .set C2_R0_\w, C2_S_\w / C2_ATOMS
 .set C2_END0_\w, (C2_R0_\w + 1) * C2_ATOMS
 .set C2_CROSS_\w, (C2_E_\w > C2_END0_\w)
 .set C2_N0_\w, C2_END0_\w + ((C2_E_\w < C2_END0_\w) & (C2_E_\w - C2_END0_\w)) - C2_S_\w
 .set C2_F_\w, ((C2_E_\w / C2_ATOMS) - C2_R0_\w - 1) & C2_CROSS_\w
 .set C2_NL_\w, (C2_E_\w % C2_ATOMS) & C2_CROSS_\w
.Lc2_w\w:
 setzi $m4, (C2_S_\w - C2_R0_\w * C2_ATOMS) * C2_UNIT
 setzi $m5, C2_N0_\w
 setzi $m7, C2_F_\w
 setzi $m8, C2_NL_\w
 setzi $m9, C2_R0_\w
 bri .Lc2_go
 .endr
.Lc2_go:
 ld32 $m1, $mvertex_base, $mzero, FRAME_SRC
 ld32 $m3, $mvertex_base, $mzero, FRAME_OUT
 ld32 $m2, $mvertex_base, $mzero, FRAME_SRC_STRIDE
 ld32 $m6, $mvertex_base, $mzero, FRAME_DST_STRIDE
 // bases of run R0; $m4 (the offset in the run) keeps growing, so each later run moves the
 // bases by the stride less one run's bytes
 mul $m0, $m2, $m9
 add $m1, $m1, $m0
 mul $m0, $m6, $m9
 add $m3, $m3, $m0
 setzi $m0, C2_RUN_BYTES
 sub $m2, $m2, $m0
 sub $m6, $m6, $m0
 setzi $m9, C2_ATOMS
 .p2align 3
 {
  rpt $m5, 1
  fnop
 }
 {
  C2_LOAD
  fnop
 }
 {
  C2_STORE
  fnop
 }
 brz $m7, .Lc2_last
 .p2align 3
.Lc2_full:
 add $m1, $m1, $m2
 add $m3, $m3, $m6
 {
  rpt $m9, 1
  fnop
 }
 {
  C2_LOAD
  fnop
 }
 {
  C2_STORE
  fnop
 }
 add $m7, $m7, -1
 brnz $m7, .Lc2_full
.Lc2_last:
 add $m1, $m1, $m2
 add $m3, $m3, $m6
 {
  rpt $m8, 1
  fnop
 }
 {
  C2_LOAD
  fnop
 }
 {
  C2_STORE
  fnop
 }
 exitz $mzero
#endif

// cast.S -- IPU21 precision casts on one tile: f16 -> f32 and f32 -> f16 (round to nearest).
//
// Written for ipu-stack from the ISA facts in shared/docs/ipu21-facts.md (§16.3 ld64step,
// rpt, runall, exitz; §16.2 bundles). One compile unit per variant; the flags come from the
// unit name cast_{f16_f32|f32_f16}_n{N} (kernels/units.py):
//   CAST_TO_F32  1: f16 -> f32, 0: f32 -> f16
//   CAST_GROUPS  groups of four elements (N / 4)
//   CAST_SYMBOL  the entry symbol
// ABI (supervisor, registry cast): $m2 output, $m3 input, both 8-byte aligned; $m10 return
// address, $m11 stack. Worker w converts groups w, w + 6, w + 12, ... (four f16 = one 64-bit
// atom, four f32 = two atoms).
#include "ipu21_tile.h"

#ifndef CAST_GROUPS
#error "CAST_GROUPS is required"
#endif

 .set GROUPS, CAST_GROUPS
 .set FRAME_OUT, 0
 .set FRAME_IN, 1
 .set FRAME_BYTES, 8

 .section .text.CAST_SYMBOL,"ax",@progbits
 .globl CAST_SYMBOL
 .type CAST_SYMBOL,@function
 .p2align 3
 .supervisor
CAST_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_IN
 setzi $m6, .Lcast_worker
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size CAST_SYMBOL, .-CAST_SYMBOL

 .section .text.cast_worker,"ax",@progbits
 .worker
 .p2align 3
.Lcast_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 // groups of this worker: (GROUPS - w + 5) / 6, exact below 2^16
 sub $m5, $mzero, $m0
 add $m5, $m5, GROUPS + WORKER_CONTEXTS - 1
 mul $m5, $m5, 43691
 shr $m5, $m5, 18
 brz $m5, .Lcast_idle
 ld32 $m3, $mvertex_base, $mzero, FRAME_OUT
 ld32 $m1, $mvertex_base, $mzero, FRAME_IN
#if CAST_TO_F32
 shl $m4, $m0, 3               // input: one atom per group
 shl $m6, $m0, 4               // output: two atoms per group
 .p2align 3
 {
  rpt $m5, 4
  fnop
 }
 {
  ld64step $a0:1, $m1, $m4+=, WORKER_CONTEXTS
  fnop
 }
 {
  nop
  f16v2tof32 $a2:3, $a0
 }
 {
  nop
  f16v2tof32 $a4:5, $a1
 }
 {
  st64step $a2:3, $m3, $m6+=, 1
  fnop
 }
 {
  st64step $a4:5, $m3, $m6+=, 2 * WORKER_CONTEXTS - 1
  fnop
 }
#else
 shl $m4, $m0, 4               // input: two atoms per group
 shl $m6, $m0, 3               // output: one atom per group
 .p2align 3
 {
  rpt $m5, 4
  fnop
 }
 {
  ld64step $a0:1, $m1, $m4+=, 1
  fnop
 }
 {
  ld64step $a2:3, $m1, $m4+=, 2 * WORKER_CONTEXTS - 1
  fnop
 }
 {
  nop
  f32v2tof16 $a4, $a0:1
 }
 {
  nop
  f32v2tof16 $a5, $a2:3
 }
 {
  st64step $a4:5, $m3, $m6+=, WORKER_CONTEXTS
  fnop
 }
#endif
.Lcast_idle:
 exitz $mzero

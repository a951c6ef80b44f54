// reduce_add.S -- IPU21 reduction add on one tile: out[n] += sum_i in_i[n], summed in f32 and
// rounded once to the tensor precision (the K-split reduction of the GEMM plans).
//
// Written for ipu-stack from the ISA facts in shared/docs/ipu21-facts.md (§16.3 ld64step,
// rpt, runall, exitz; §16.2 bundles). One compile unit per variant; the flags come from the
// unit name reduce_add_{f16|f32}_p{P}_n{N} (kernels/units.py):
//   RA_INPUTS   P, 1..6 partial inputs
//   RA_F32      f32 operands, else f16 (converted to f32 exactly, summed, rounded once)
//   RA_ATOMS    64-bit atoms of the output (N * element bytes / 8)
//   RA_SYMBOL   the entry symbol
//   RA_TABLE    P > 6: $m3 points at a table of P 32-bit input addresses instead (the
//               registry's $m3.. register list cannot hold more than six inputs and $m11)
// ABI (supervisor, registry reduce_add): $m2 output (read and written), $m3.. the P inputs,
// all 8-byte aligned; $m10 return address, $m11 stack. Worker w handles atoms w, w + 6, ...
#include "ipu21_tile.h"

#ifndef RA_INPUTS
#error "RA_INPUTS is required"
#endif
#ifndef RA_ATOMS
#error "RA_ATOMS is required"
#endif
#ifndef RA_TABLE
#if RA_INPUTS < 1 || RA_INPUTS > 6
#error "RA_INPUTS must be 1..6 without RA_TABLE"
#endif
#endif

 .set ATOMS, RA_ATOMS
 .set FRAME_OUT, 0
 .set FRAME_IN, 1              // inputs at words 1..6
 .set FRAME_BYTES, 32

 .section .text.RA_SYMBOL,"ax",@progbits
 .globl RA_SYMBOL
 .type RA_SYMBOL,@function
 .p2align 3
 .supervisor
RA_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_IN + 0
 st32 $m4, $m11, $mzero, FRAME_IN + 1
 st32 $m5, $m11, $mzero, FRAME_IN + 2
 st32 $m6, $m11, $mzero, FRAME_IN + 3
 st32 $m7, $m11, $mzero, FRAME_IN + 4
 st32 $m8, $m11, $mzero, FRAME_IN + 5
 setzi $m6, .Lra_worker
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size RA_SYMBOL, .-RA_SYMBOL

// One input's contribution to the f32 accumulators $a2:3 (low halves) and $a4:5 (high).
 .macro RA_ADD_INPUT ptr
 {
  ld64step $a0:1, \ptr, $m4+=, 0
  fnop
 }
#if RA_F32
 {
  nop
  f32v2add $a2:3, $a2:3, $a0:1
 }
#else
 {
  nop
  f16v2tof32 $a6:7, $a0
 }
 {
  nop
  f32v2add $a2:3, $a2:3, $a6:7
 }
 {
  nop
  f16v2tof32 $a6:7, $a1
 }
 {
  nop
  f32v2add $a4:5, $a4:5, $a6:7
 }
#endif
 .endm

#ifdef RA_TABLE
 .section .text.ra_worker,"ax",@progbits
 .worker
 .p2align 3
.Lra_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 // atoms of this worker: (ATOMS - w + 5) / 6, exact for ATOMS < 2^16 - 5
 sub $m5, $mzero, $m0
 add $m5, $m5, ATOMS + WORKER_CONTEXTS - 1
 mul $m5, $m5, 43691
 shr $m5, $m5, 18
 brz $m5, .Lra_idle
 shl $m4, $m0, 3
 ld32 $m3, $mvertex_base, $mzero, FRAME_OUT
 ld32 $m2, $mvertex_base, $mzero, FRAME_IN + 0
 setzi $m10, RA_INPUTS
 .p2align 3
.Lra_atom:
 {
  ld64 $a0:1, $m3, $m4, 0
  fnop
 }
#if RA_F32
 {
  add $m9, $m2, 0
  f32v2add $a2:3, $a0:1, $azeros
 }
#else
 {
  add $m9, $m2, 0
  f16v2tof32 $a2:3, $a0
 }
 {
  nop
  f16v2tof32 $a4:5, $a1
 }
#endif
 {
#if RA_F32
  rpt $m10, 2
#else
  rpt $m10, 5
#endif
  fnop
 }
 {
  ld32step $m1, $mzero, $m9+=, 1
  fnop
 }
 {
  ld64 $a0:1, $m1, $m4, 0
  fnop
 }
#if RA_F32
 {
  nop
  f32v2add $a2:3, $a2:3, $a0:1
 }
#else
 {
  nop
  f16v2tof32 $a6:7, $a0
 }
 {
  nop
  f32v2add $a2:3, $a2:3, $a6:7
 }
 {
  nop
  f16v2tof32 $a6:7, $a1
 }
 {
  nop
  f32v2add $a4:5, $a4:5, $a6:7
 }
 {
  nop
  f32v2tof16 $a0, $a2:3
 }
 {
  nop
  f32v2tof16 $a1, $a4:5
 }
#endif
 {
#if RA_F32
  st64 $a2:3, $m3, $m4, 0
#else
  st64 $a0:1, $m3, $m4, 0
#endif
  fnop
 }
 {
  add $m4, $m4, 8 * WORKER_CONTEXTS
  fnop
 }
 {
  add $m5, $m5, -1
  fnop
 }
 brnz $m5, .Lra_atom
.Lra_idle:
 exitz $mzero
#else
 .section .text.ra_worker,"ax",@progbits
 .worker
 .p2align 3
.Lra_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 // atoms of this worker: (ATOMS - w + 5) / 6, exact for ATOMS < 2^16 - 5
 sub $m5, $mzero, $m0
 add $m5, $m5, ATOMS + WORKER_CONTEXTS - 1
 mul $m5, $m5, 43691
 shr $m5, $m5, 18
 brz $m5, .Lra_idle
 shl $m4, $m0, 3
 ld32 $m3, $mvertex_base, $mzero, FRAME_OUT
 ld32 $m1, $mvertex_base, $mzero, FRAME_IN + 0
 ld32 $m2, $mvertex_base, $mzero, FRAME_IN + 1
 ld32 $m6, $mvertex_base, $mzero, FRAME_IN + 2
 ld32 $m7, $mvertex_base, $mzero, FRAME_IN + 3
 ld32 $m8, $mvertex_base, $mzero, FRAME_IN + 4
 ld32 $m9, $mvertex_base, $mzero, FRAME_IN + 5
#if RA_F32
 .set BODY, 2 + 2 * RA_INPUTS + 1
#else
 .set BODY, 3 + 5 * RA_INPUTS + 3
#endif
 .p2align 3
 {
  rpt $m5, BODY - 1
  fnop
 }
 {
  ld64step $a0:1, $m3, $m4+=, 0
  fnop
 }
#if RA_F32
 {
  nop
  f32v2add $a2:3, $a0:1, $azeros
 }
#else
 {
  nop
  f16v2tof32 $a2:3, $a0
 }
 {
  nop
  f16v2tof32 $a4:5, $a1
 }
#endif
 .set RA_INPUTS_LEFT, RA_INPUTS
 .irp reg, $m1, $m2, $m6, $m7, $m8, $m9
 .if RA_INPUTS_LEFT > 0
 RA_ADD_INPUT \reg
 .endif
 .set RA_INPUTS_LEFT, RA_INPUTS_LEFT - 1
 .endr
#if RA_F32
 {
  st64step $a2:3, $m3, $m4+=, WORKER_CONTEXTS
  fnop
 }
#else
 {
  nop
  f32v2tof16 $a0, $a2:3
 }
 {
  nop
  f32v2tof16 $a1, $a4:5
 }
 {
  st64step $a0:1, $m3, $m4+=, WORKER_CONTEXTS
  fnop
 }
#endif
.Lra_idle:
 exitz $mzero
#endif

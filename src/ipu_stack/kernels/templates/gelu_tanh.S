// gelu_tanh.S -- IPU21 tanh-approximation GeLU on one tile, F16 in and out, f32 arithmetic:
//   y = h + h * tanh(c0 * (x + c1 * x^3)),  h = x / 2,  c0 = sqrt(2 / pi), c1 = 0.044715
// evaluated in that order in f32 and rounded once to f16 (kernels/units.py gelu_tanh_reference).
//
// Written for ipu-stack from the ISA facts in shared/docs/ipu21-facts.md (§16.3 ld64step,
// rpt, runall, exitz; §16.2 bundles) and the f32tanh instruction of Graphcore's public LLVM
// fork (llvm.colossus.tanh.f32). Not yet in the kernel registry (tanh GeLU is being added
// there); unit name gelu_tanh_f16_n{N}, N a multiple of 4 (kernels/units.py):
//   GT_GROUPS   groups of four elements (N / 4)
//   GT_SYMBOL   the entry symbol
// ABI (supervisor, like the map kernels): $m2 output, $m3 input, both 8-byte aligned; $m10
// return address, $m11 stack. Worker w handles groups w, w + 6, ... (one 64-bit atom each).
#include "ipu21_tile.h"

#ifndef GT_GROUPS
#error "GT_GROUPS is required"
#endif
#ifndef GT_F32
#define GT_F32 0
#endif

 .set GROUPS, GT_GROUPS
 .set C0_BITS, 0x3F4C422A      // f32 sqrt(2 / pi) = 0.7978846
 .set C1_BITS, 0x3D372713      // f32 0.044715
 .set HALF_BITS, 0x3F000000    // f32 0.5
 .set FRAME_OUT, 0
 .set FRAME_IN, 1
 .set FRAME_C1, 1              // 64-bit slots: (c1, c1), (c0, c0), (0.5, 0.5)
 .set FRAME_C0, 2
 .set FRAME_HALF, 3
 .set FRAME_ONE, 4             // (1, 1), used by the F32 order
 .set FRAME_BYTES, 40

// An f32 constant into $m6 from its bit pattern (20-bit setzi, then the low 12 bits).
 .macro CONSTANT bits
 setzi $m6, (\bits) >> 12
 shl $m6, $m6, 12
 or $m6, $m6, (\bits) & 0xfff
 .endm

 .section .text.GT_SYMBOL,"ax",@progbits
 .globl GT_SYMBOL
 .type GT_SYMBOL,@function
 .p2align 3
 .supervisor
GT_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_IN
 CONSTANT C1_BITS
 st32 $m6, $m11, $mzero, 2 * FRAME_C1
 st32 $m6, $m11, $mzero, 2 * FRAME_C1 + 1
 CONSTANT C0_BITS
 st32 $m6, $m11, $mzero, 2 * FRAME_C0
 st32 $m6, $m11, $mzero, 2 * FRAME_C0 + 1
 CONSTANT HALF_BITS
 st32 $m6, $m11, $mzero, 2 * FRAME_HALF
 st32 $m6, $m11, $mzero, 2 * FRAME_HALF + 1
#if GT_F32
 CONSTANT 0x3F800000
 st32 $m6, $m11, $mzero, 2 * FRAME_ONE
 st32 $m6, $m11, $mzero, 2 * FRAME_ONE + 1
#endif
 setzi $m6, .Lgt_worker
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size GT_SYMBOL, .-GT_SYMBOL

// GeLU of the f32 pair \p in place; $a6:7 is scratch; constants in $a8:9, $a10:11, $a12:13.
 .macro GELU_PAIR p
 {
  nop
  f32v2mul $a6:7, \p, \p
 }
 {
  nop
  f32v2mul $a6:7, $a6:7, \p
 }
 {
  nop
  f32v2mul $a6:7, $a6:7, $a8:9
 }
 {
  nop
  f32v2add $a6:7, $a6:7, \p
 }
 {
  nop
  f32v2mul $a6:7, $a6:7, $a10:11
 }
 {
  nop
  f32tanh $a6, $a6
 }
 {
  nop
  f32tanh $a7, $a7
 }
 {
  nop
  f32v2mul \p, \p, $a12:13
 }
 {
  nop
  f32v2mul $a6:7, $a6:7, \p
 }
 {
  nop
  f32v2add \p, \p, $a6:7
 }
 .endm

// F32: the registry's order exactly (runtime/elementwise_sim.py gelu_tanh), as an f32 output
// shows every rounding: inner = c0 (x + ((c1 x) x) x), y = (0.5 x) (1 + tanh(inner));
// $a14:15 holds (1, 1).
 .macro GELU_PAIR_F32 p
 {
  nop
  f32v2mul $a6:7, \p, $a8:9
 }
 {
  nop
  f32v2mul $a6:7, $a6:7, \p
 }
 {
  nop
  f32v2mul $a6:7, $a6:7, \p
 }
 {
  nop
  f32v2add $a6:7, \p, $a6:7
 }
 {
  nop
  f32v2mul $a6:7, $a10:11, $a6:7
 }
 {
  nop
  f32tanh $a6, $a6
 }
 {
  nop
  f32tanh $a7, $a7
 }
 {
  nop
  f32v2add $a6:7, $a14:15, $a6:7
 }
 {
  nop
  f32v2mul \p, $a12:13, \p
 }
 {
  nop
  f32v2mul \p, \p, $a6:7
 }
 .endm

 .section .text.gt_worker,"ax",@progbits
 .worker
 .p2align 3
.Lgt_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 // groups of this worker: (GROUPS - w + 5) / 6, exact below 2^16
 sub $m5, $mzero, $m0
 add $m5, $m5, GROUPS + WORKER_CONTEXTS - 1
 mul $m5, $m5, 43691
 shr $m5, $m5, 18
 brz $m5, .Lgt_idle
 ld32 $m3, $mvertex_base, $mzero, FRAME_OUT
 ld32 $m1, $mvertex_base, $mzero, FRAME_IN
 ld64 $a8:9, $mvertex_base, $mzero, FRAME_C1
 ld64 $a10:11, $mvertex_base, $mzero, FRAME_C0
 ld64 $a12:13, $mvertex_base, $mzero, FRAME_HALF
 shl $m4, $m0, 3
#if GT_F32
 // F32 (units_unary.py gelu_tanh_f32_nN): GT_GROUPS counts f32 pairs, one atom each
 ld64 $a14:15, $mvertex_base, $mzero, FRAME_ONE
 .p2align 3
 {
  rpt $m5, 11
  fnop
 }
 {
  ld64step $a2:3, $m1, $m4+=, 0
  fnop
 }
 GELU_PAIR_F32 $a2:3
 {
  st64step $a2:3, $m3, $m4+=, WORKER_CONTEXTS
  fnop
 }
 exitz $mzero
#endif
 .p2align 3
 {
  rpt $m5, 25
  fnop
 }
 {
  ld64step $a0:1, $m1, $m4+=, 0
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
 GELU_PAIR $a2:3
 GELU_PAIR $a4:5
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
.Lgt_idle:
 exitz $mzero

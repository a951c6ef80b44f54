// gelu_erf.S -- IPU21 exact (erf) GeLU on one tile, F16 or F32 in and out, f32 arithmetic:
//   y = (x * 0.5) * (1 + erf(x / sqrt(2)))
// in the registry's order (runtime/sim.py map_semantics), rounded once to the output type.
//
// Written for ipu-stack from the Tile Vertex ISA (ld32step/ld64step, rpt, runall, exitz,
// f32v2 arithmetic, f32v2min/max/cmplt, and64/andc64/or64, f32div, f32exp; hover text of
// graphcore/ipu_assembly_support) and shared/docs/ipu21-facts.md §16. There is no erf
// instruction; erf is our own approximation (benchmarks/erf_coefficients.py derives it):
//   |z| <  T:       erf(z) = z * P(z^2), P of degree 6 (relative error 2e-10)
//   T <= |z| <= 4:  erf(|z|) = 1 - exp(-v^2) * Q((v - M) / H), v = clamp(|z|, T, 4), Q of
//                   degree 9 fitted to erfc(v) exp(v^2) (absolute erf error 1e-9)
//   |z| > 4:        v = 4 gives 1 - 1.5e-8, which rounds to 1 like the f32 erf
// with T = 0.875, M = (4 + T) / 2, H = (4 - T) / 2; the sign is copied from x. In f32 this
// order is within 2 f32 ulp of the correctly rounded erf (1 ulp in the tail).
// Unit name gelu_{f16|f32}_n{N}, N even (kernels/units_unary.py):
//   GE_ITEMS    pairs of elements (N / 2)
//   GE_F32      f32 data (64-bit items), else f16 (32-bit items)
//   GE_SYMBOL   the entry symbol
// ABI (supervisor, like the map kernels): $m2 output, $m3 input, both 8-byte aligned; $m10
// return address, $m11 stack. Worker w handles items w, w + 6, ...
#include "ipu21_tile.h"

#ifndef GE_ITEMS
#error "GE_ITEMS is required"
#endif

 .set ITEMS, GE_ITEMS
#if GE_F32
 .set ITEM_BYTES, 8
#else
 .set ITEM_BYTES, 4
#endif
 // frame: word 0 output, word 1 input; 64-bit slots from 1 hold (c, c) constant pairs
 .set FRAME_OUT, 0
 .set FRAME_IN, 1
 .set K_SQRT2, 1
 .set K_SIGN, 2
 .set K_T, 3
 .set K_TOP, 4
 .set K_M, 5
 .set K_INVH, 6
 .set K_HALF, 7
 .set K_ONE, 8
 .set K_P, 9                   // P0..P6 in slots 9..15
 .set K_Q, 16                  // Q0..Q9 in slots 16..25
 .set FRAME_BYTES, 208

// An f32 constant pair into frame slot \slot from its bit pattern (through $m6).
 .macro PAIR slot, bits
 setzi $m6, (\bits) >> 12
 shl $m6, $m6, 12
 or $m6, $m6, (\bits) & 0xfff
 st32 $m6, $m11, $mzero, 2 * (\slot)
 st32 $m6, $m11, $mzero, 2 * (\slot) + 1
 .endm

 .section .text.GE_SYMBOL,"ax",@progbits
 .globl GE_SYMBOL
 .type GE_SYMBOL,@function
 .p2align 3
 .supervisor
GE_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_IN
 PAIR K_SQRT2, 0x3FB504F3      // f32 sqrt(2)
 PAIR K_SIGN, 0x80000000
 PAIR K_T, 0x3F600000          // 0.875
 PAIR K_TOP, 0x40800000        // 4
 PAIR K_M, 0x401C0000          // 2.4375
 PAIR K_INVH, 0x3F23D70A       // 1 / 1.5625
 PAIR K_HALF, 0x3F000000
 PAIR K_ONE, 0x3F800000
 PAIR K_P+0, 0x3F906EBB
 PAIR K_P+1, 0xBEC093A2
 PAIR K_P+2, 0x3DE71742
 PAIR K_P+3, 0xBCDC0CD3
 PAIR K_P+4, 0x3BAA9D5D
 PAIR K_P+5, 0xBA573FC7
 PAIR K_P+6, 0x38B5EFA1
 PAIR K_Q+0, 0x3E5CB9C2
 PAIR K_Q+1, 0xBDF8350F
 PAIR K_Q+2, 0x3D846BDE
 PAIR K_Q+3, 0xBD06FBEE
 PAIR K_Q+4, 0x3C8905B4
 PAIR K_Q+5, 0xBBD1B9F5
 PAIR K_Q+6, 0x3B645BF3
 PAIR K_Q+7, 0xBB9461D4
 PAIR K_Q+8, 0xBB586C1C
 PAIR K_Q+9, 0xBB0A7D7A
 setzi $m6, .Lge_worker
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size GE_SYMBOL, .-GE_SYMBOL

// One Horner step acc = acc * x + K[slot]: the coefficient loads with the multiply.
 .macro HORNER acc, x, slot
 {
  ld64 $a12:13, $mvertex_base, $mzero, \slot
  f32v2mul \acc, \acc, \x
 }
 {
  nop
  f32v2add \acc, \acc, $a12:13
 }
 .endm

// GeLU of the f32 pair $a2:3 in place. Scratch: $a0:1 (central accumulator), $a4:5 (z, then
// the tail accumulator, then the mask), $a6:7 |z|, $a8:9 u then erf, $a10:11 u^2 then v then
// exp(-v^2), $a12:13 and $a14:15 constants.
 .macro GELU_PAIR
 {
  ld64 $a12:13, $mvertex_base, $mzero, K_SQRT2
  fnop
 }
 {
  ld64 $a14:15, $mvertex_base, $mzero, K_SIGN
  f32div $a4, $a2, $a12
 }
 {
  nop
  f32div $a5, $a3, $a12
 }
 {
  ld64 $a12:13, $mvertex_base, $mzero, K_T
  andc64 $a6:7, $a4:5, $a14:15           // |z|
 }
 {
  ld64 $a14:15, $mvertex_base, $mzero, K_P+6
  f32v2min $a8:9, $a6:7, $a12:13         // u = min(|z|, T)
 }
 {
  ld64 $a12:13, $mvertex_base, $mzero, K_P+5
  f32v2mul $a10:11, $a8:9, $a8:9         // s = u^2
 }
 {
  nop
  f32v2mul $a0:1, $a10:11, $a14:15       // P6 s
 }
 {
  nop
  f32v2add $a0:1, $a0:1, $a12:13         // + P5
 }
 HORNER $a0:1, $a10:11, K_P+4
 HORNER $a0:1, $a10:11, K_P+3
 HORNER $a0:1, $a10:11, K_P+2
 HORNER $a0:1, $a10:11, K_P+1
 HORNER $a0:1, $a10:11, K_P+0
 {
  ld64 $a14:15, $mvertex_base, $mzero, K_TOP
  f32v2mul $a8:9, $a8:9, $a0:1           // central erf = u P(s)
 }
 {
  ld64 $a12:13, $mvertex_base, $mzero, K_T
  f32v2min $a10:11, $a6:7, $a14:15       // min(|z|, 4)
 }
 {
  ld64 $a14:15, $mvertex_base, $mzero, K_M
  f32v2max $a10:11, $a10:11, $a12:13     // v = max(., T)
 }
 {
  ld64 $a12:13, $mvertex_base, $mzero, K_INVH
  f32v2sub $a0:1, $a10:11, $a14:15       // v - M
 }
 {
  ld64 $a14:15, $mvertex_base, $mzero, K_Q+9
  f32v2mul $a0:1, $a0:1, $a12:13         // t = (v - M) / H
 }
 {
  ld64 $a12:13, $mvertex_base, $mzero, K_Q+8
  f32v2mul $a10:11, $a10:11, $a10:11     // v^2
 }
 {
  nop
  f32v2sub $a10:11, $azeros, $a10:11     // -v^2
 }
 {
  nop
  f32v2mul $a4:5, $a0:1, $a14:15         // Q9 t
 }
 {
  nop
  f32v2add $a4:5, $a4:5, $a12:13         // + Q8
 }
 HORNER $a4:5, $a0:1, K_Q+7
 HORNER $a4:5, $a0:1, K_Q+6
 HORNER $a4:5, $a0:1, K_Q+5
 HORNER $a4:5, $a0:1, K_Q+4
 HORNER $a4:5, $a0:1, K_Q+3
 HORNER $a4:5, $a0:1, K_Q+2
 HORNER $a4:5, $a0:1, K_Q+1
 HORNER $a4:5, $a0:1, K_Q+0
 {
  nop
  f32exp $a10, $a10
 }
 {
  nop
  f32exp $a11, $a11
 }
 {
  ld64 $a12:13, $mvertex_base, $mzero, K_ONE
  f32v2mul $a10:11, $a10:11, $a4:5       // erfc(v) = exp(-v^2) Q(t)
 }
 {
  ld64 $a14:15, $mvertex_base, $mzero, K_T
  f32v2sub $a10:11, $a12:13, $a10:11     // tail erf = 1 - erfc(v)
 }
 {
  nop
  f32v2cmplt $a4:5, $a6:7, $a14:15       // mask: |z| < T
 }
 {
  nop
  and64 $a8:9, $a8:9, $a4:5
 }
 {
  nop
  andc64 $a10:11, $a10:11, $a4:5
 }
 {
  ld64 $a14:15, $mvertex_base, $mzero, K_SIGN
  or64 $a8:9, $a8:9, $a10:11             // erf(|z|)
 }
 {
  ld64 $a12:13, $mvertex_base, $mzero, K_HALF
  and64 $a6:7, $a2:3, $a14:15            // sign of x (that of z)
 }
 {
  ld64 $a14:15, $mvertex_base, $mzero, K_ONE
  or64 $a8:9, $a8:9, $a6:7               // erf(z)
 }
 {
  nop
  f32v2add $a8:9, $a8:9, $a14:15         // 1 + erf(z)
 }
 {
  nop
  f32v2mul $a2:3, $a2:3, $a12:13         // x * 0.5
 }
 {
  nop
  f32v2mul $a2:3, $a2:3, $a8:9
 }
 .endm

 .section .text.ge_worker,"ax",@progbits
 .worker
 .p2align 3
.Lge_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 // items of this worker: (ITEMS - w + 5) / 6, exact below 2^16
 sub $m5, $mzero, $m0
 add $m5, $m5, ITEMS + WORKER_CONTEXTS - 1
 mul $m5, $m5, 43691
 shr $m5, $m5, 18
 brz $m5, .Lge_idle
 ld32 $m3, $mvertex_base, $mzero, FRAME_OUT
 ld32 $m1, $mvertex_base, $mzero, FRAME_IN
 mul $m4, $m0, ITEM_BYTES
 .p2align 3
 {
  rpt $m5, (.Lge_end - .Lge_start) / 8 - 1
  fnop
 }
.Lge_start:
#if GE_F32
 {
  ld64step $a2:3, $m1, $m4+=, 0
  fnop
 }
 GELU_PAIR
 {
  st64step $a2:3, $m3, $m4+=, WORKER_CONTEXTS
  fnop
 }
#else
 {
  ld32step $a0, $m1, $m4+=, 0
  fnop
 }
 {
  nop
  f16v2tof32 $a2:3, $a0
 }
 GELU_PAIR
 {
  nop
  f32v2tof16 $a0, $a2:3
 }
 {
  st32step $a0, $m3, $m4+=, WORKER_CONTEXTS
  fnop
 }
#endif
.Lge_end:
.Lge_idle:
 exitz $mzero

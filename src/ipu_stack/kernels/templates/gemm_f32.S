// gemm_f32.S -- IPU21 F32 GEMM on one tile: out[rows, C] (+)= left[rows, K] @ right[K, C].
//
// Written for ipu-stack from the public Tile Vertex ISA (f32v2mul with its scalar-broadcast
// form `$aSrc0:B`, f32v2add, ld32step/ld64step/st64, rpt) and the facts in
// shared/docs/ipu21-facts.md (§16.2 issue model, §16.3 rpt/runall/exitz). The F32 AMP
// dataflow (f32sisov2amp) is not public, so this kernel uses the vector pipeline instead: one
// f32v2mul and one f32v2add per K step and output column pair, i.e. 2 MACs per two bundles.
//
// One compile unit per variant; kernels/registry.py (GemmVariant.flags) supplies the same
// flags as the AMP GEMM: GEMM_INNER_BLOCK_DIMENSION (K, a multiple of 8),
// GEMM_OUTPUT_COLUMNS (C, a multiple of 16), GEMM_SMALL_ROWS, GEMM_LARGE_ROWS,
// GEMM_SINGLE_ROWS, GEMM_INTERLEAVED_WEIGHTS (no effect: ld64step reads either region) and
// the GEMM_{INIT,ACCUMULATE}_{SMALL,LARGE}_SYMBOL entry symbols.
//
// ABI (supervisor): $m2 output [rows, C] f32, $m3 left [rows, K] f32, $m4 right [K, C] f32
// (row-major), all 8-byte aligned; $m10 return address, $m11 stack.
// Numerics: out = (sum over k in order of left[r, k] * right[k, c], each product and each
// sum rounded to f32) + prior (accumulate entries), the registry's semantics.gemm_f32.
// Worker w computes rows w, w + 6, w + 12, ...; per column pair, a software pipeline: the
// bundle that multiplies step k loads left[k + 1], the next adds it and loads right[k + 1].
#include "ipu21_tile.h"

#ifndef GEMM_INNER_BLOCK_DIMENSION
#error "GEMM_INNER_BLOCK_DIMENSION (K) is required"
#endif
#ifndef GEMM_OUTPUT_COLUMNS
#error "GEMM_OUTPUT_COLUMNS (C) is required"
#endif
#ifndef GEMM_SMALL_ROWS
#error "GEMM_SMALL_ROWS is required"
#endif
#ifndef GEMM_LARGE_ROWS
#define GEMM_LARGE_ROWS GEMM_SMALL_ROWS
#endif

 .set K_BLOCK, GEMM_INNER_BLOCK_DIMENSION
 .set OUTPUT_COLUMNS, GEMM_OUTPUT_COLUMNS
 .set LEFT_ROW_BYTES, K_BLOCK * 4
 .set ROW_BYTES, OUTPUT_COLUMNS * 4       // right and output rows
 .set COLUMN_PAIRS, OUTPUT_COLUMNS / 2
 .if K_BLOCK < 2
 .error "K must be at least 2"
 .endif
 // mul/add immediates are 16 bits, setzi 20 (Tile Vertex ISA)
 .if (LEFT_ROW_BYTES > 65535) || (ROW_BYTES > 65535) || (6 * LEFT_ROW_BYTES > 0xfffff)
 .error "F32 GEMM unit too large for the kernel's immediates"
 .endif
 .if 6 * ROW_BYTES > 0xfffff
 .error "F32 GEMM unit too large for the kernel's immediates"
 .endif

 .set FRAME_OUTPUT, 0
 .set FRAME_LEFT, 1
 .set FRAME_RIGHT, 2
 .set FRAME_ROWS, 3
 .set FRAME_INITIAL, 4
 .set FRAME_BYTES, 24

 .macro GEMM_F32_ENTRY name, initial, rows
 .section .text.\name,"ax",@progbits
 .globl \name
 .type \name,@function
 .p2align 3
\name:
 .supervisor
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUTPUT
 st32 $m3, $m11, $mzero, FRAME_LEFT
 st32 $m4, $m11, $mzero, FRAME_RIGHT
 setzi $m6, \rows
 st32 $m6, $m11, $mzero, FRAME_ROWS
 setzi $m6, \initial
 st32 $m6, $m11, $mzero, FRAME_INITIAL
 bri .Lgemm_f32_run
 .size \name, .-\name
 .endm

 GEMM_F32_ENTRY GEMM_INIT_SMALL_SYMBOL, 1, GEMM_SMALL_ROWS
 GEMM_F32_ENTRY GEMM_ACCUMULATE_SMALL_SYMBOL, 0, GEMM_SMALL_ROWS
#ifndef GEMM_SINGLE_ROWS
 GEMM_F32_ENTRY GEMM_INIT_LARGE_SYMBOL, 1, GEMM_LARGE_ROWS
 GEMM_F32_ENTRY GEMM_ACCUMULATE_LARGE_SYMBOL, 0, GEMM_LARGE_ROWS
#endif

 .section .text.gemm_f32_run,"ax",@progbits
 .p2align 3
 .supervisor
.Lgemm_f32_run:
 setzi $m6, .Lgemm_f32_worker
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10

 .section .text.gemm_f32_worker,"ax",@progbits
 .worker
 .p2align 3
.Lgemm_f32_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 ld32 $m1, $mvertex_base, $mzero, FRAME_ROWS
 // rows of this worker: (rows - w + 5) / 6, exact below 2^16
 sub $m5, $m1, $m0
 add $m5, $m5, WORKER_CONTEXTS - 1
 mul $m5, $m5, 43691
 shr $m5, $m5, 18
 brz $m5, .Lgemm_f32_idle
 ld32 $m2, $mvertex_base, $mzero, FRAME_OUTPUT
 ld32 $m3, $mvertex_base, $mzero, FRAME_LEFT
 ld32 $m4, $mvertex_base, $mzero, FRAME_RIGHT
 ld32 $m9, $mvertex_base, $mzero, FRAME_INITIAL
 mul $m6, $m0, LEFT_ROW_BYTES
 add $m3, $m3, $m6             // this worker's first left row
 mul $m6, $m0, ROW_BYTES
 add $m2, $m2, $m6             // and output row
 setzi $m8, K_BLOCK - 2        // pipelined K steps
 setzi $m11, COLUMN_PAIRS      // right row stride in 64-bit atoms
.Lgemm_f32_row:
 zero $m7                      // byte offset of the column pair
 setzi $m1, COLUMN_PAIRS
.Lgemm_f32_pair:
 zero $m6                      // left offset: walks the row
 add $m10, $m7, 0              // right offset: walks down the column pair
 ld32step $a0, $m3, $m6+=, 1
 ld64step $a2:3, $m4, $m10+=, $m11
 .p2align 3
 {
  ld32step $a0, $m3, $m6+=, 1
  f32v2mul $a6:7, $a0:B, $a2:3
 }
 {
  ld64step $a2:3, $m4, $m10+=, $m11
  fnop
 }
 {
  rpt $m8, 1
  fnop
 }
 {
  ld32step $a0, $m3, $m6+=, 1
  f32v2mul $a4:5, $a0:B, $a2:3
 }
 {
  ld64step $a2:3, $m4, $m10+=, $m11
  f32v2add $a6:7, $a6:7, $a4:5
 }
 f32v2mul $a4:5, $a0:B, $a2:3
 f32v2add $a6:7, $a6:7, $a4:5
 brnz $m9, .Lgemm_f32_store
 ld64 $a4:5, $m2, $m7, 0       // accumulate: the prior output pair
 f32v2add $a6:7, $a6:7, $a4:5
.Lgemm_f32_store:
 st64 $a6:7, $m2, $m7, 0
 add $m7, $m7, 8
 add $m1, $m1, -1
 brnz $m1, .Lgemm_f32_pair
 setzi $m0, WORKER_CONTEXTS * LEFT_ROW_BYTES   // row steps: beyond add's 16-bit immediate
 add $m3, $m3, $m0
 setzi $m0, WORKER_CONTEXTS * ROW_BYTES
 add $m2, $m2, $m0
 add $m5, $m5, -1
 brnz $m5, .Lgemm_f32_row
.Lgemm_f32_idle:
 exitz $mzero

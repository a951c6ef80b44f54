// attention.S -- IPU21 attention of one tile's query block (MapCall kind "attention"):
//   out[r] = softmax(scale * q[r] K^T (+ mask[r]), causal keys blocked) V, in f32 throughout.
//
// Written for ipu-stack from the public Tile Vertex ISA (f16v2tof32, f32v2mul with its
// scalar-broadcast form `$aSrc0:B`, f32v2add, f32add, f32mul, f32sub, f32max, f32div,
// f32exp, f32v2tof16, ld32/ld64/st32/st64 and their step forms, rpt) and facts §16.2-16.3
// (runall, exitz, sync, bundles). One compile unit per variant; kernels/units_attention.py
// supplies:
//   ATT_F32          q, k, v and out are f32 (else f16)
//   ATT_ROWS         query rows R       ATT_KEYS  keys T
//   ATT_D            head dim D (D * element bytes a multiple of 8)
//   ATT_DV           value dim DV (DV * element bytes a multiple of 8)
//   ATT_CAUSAL       row r sees keys j < visible(r) = clamp($m9 + r, 0, T)
//   ATT_MASK         an additive mask operand; ATT_MASK_F32 its dtype (else f16);
//   ATT_MASK_ROW_BYTES  bytes from one mask row to the next (0: one row for every query);
//   ATT_MASK_PER_KEY    1: one value per key, 0: one value per row (column broadcast)
//   ATT_SYMBOL       the entry symbol
// ABI (supervisor): $m2 out [R, DV], $m3 q [R, D], $m4 k [T, D], $m5 v [T, DV] (rows dense),
// $m6 mask (when ATT_MASK; rows of ceil(cols * bytes / 8) * 8 bytes), $m7 workspace of
// 6 * T + 8 f32 (8-byte aligned; the kernel's own scratch), $m8 scale (f32 bits), $m9 visible
// keys of query row 0 (signed; causal units), $m10 return address, $m11 stack.
//
// The supervisor walks the rows in chunks of up to six and runs three worker phases per chunk
// (the workspace holds the chunk's scores and, after them, one 1/l per row):
//  (1) scores: the chunk's (row, key) pairs dealt round-robin to the six workers;
//      s = (q . k_j) * scale (+ mask) for every visible key;
//  (2) statistics: worker i takes chunk row i: m = max(-FLT_MAX, s_j) (so a row whose keys are
//      all -inf gives exp(-inf) = 0, not NaN), p_j = exp(s_j - m) in place, l = sum p_j, and
//      stores 1 / max(l, 1) (l >= 1 whenever a key is visible: the max key contributes
//      exp(0); a fully blocked row gives zeros, the simulator's NaN guard);
//  (3) output: the chunk's (row, column group) pairs round-robin: sum_j p_j v[j, group],
//      times 1 / l, rounded once to the output dtype.
// The dot product and the P V sum are software-pipelined rpt loops (a load in one bundle
// feeds the next; isa/assumptions.py bundle_read_before_write).
#include "ipu21_tile.h"

#ifndef ATT_ROWS
#error "ATT_ROWS is required"
#endif
#ifndef ATT_CAUSAL
#define ATT_CAUSAL 0
#endif
#ifndef ATT_MASK
#define ATT_MASK 0
#endif

 .set KEYS, ATT_KEYS
#if ATT_F32
 .set EB, 4
#else
 .set EB, 2
#endif
 .set QROW_BYTES, ATT_D * EB
 .set VROW_BYTES, ATT_DV * EB
 .set OUT_ROW_BYTES, ATT_DV * EB
 .set DOT_CHUNKS, QROW_BYTES / 8   // 64-bit chunks of a q or k row
 .set GROUPS, OUT_ROW_BYTES / 8    // 64-bit column groups of an output row
 .set WS_ROW_BYTES, KEYS * 4
 .set STATS_OFFSET, 6 * WS_ROW_BYTES
 // immediates: mul/cmpult/min/add take 16 bits, setzi 20 (Tile Vertex ISA)
 .if (STATS_OFFSET > 0xfffff) || (QROW_BYTES > 65535) || (OUT_ROW_BYTES > 65535)
 .error "attention unit too large for the kernel's immediates"
 .endif

 .set FRAME_OUT, 0
 .set FRAME_Q, 1
 .set FRAME_K, 2
 .set FRAME_V, 3
 .set FRAME_MASK, 4
 .set FRAME_WS, 5
 .set FRAME_SCALE, 6
 .set FRAME_VISIBLE, 7
 .set FRAME_NEG_MAX, 8          // -FLT_MAX, the running max's start
 .set FRAME_ONE, 9              // 1.0f
 .set FRAME_ROW0, 10            // first row of the chunk
 .set FRAME_CHUNK, 11           // rows in the chunk (1..6)
 .set FRAME_BYTES, 48

 .section .text.ATT_SYMBOL,"ax",@progbits
 .globl ATT_SYMBOL
 .type ATT_SYMBOL,@function
 .p2align 3
 .supervisor
ATT_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_Q
 st32 $m4, $m11, $mzero, FRAME_K
 st32 $m5, $m11, $mzero, FRAME_V
 st32 $m6, $m11, $mzero, FRAME_MASK
 st32 $m7, $m11, $mzero, FRAME_WS
 st32 $m8, $m11, $mzero, FRAME_SCALE
 st32 $m9, $m11, $mzero, FRAME_VISIBLE
 setzi $m6, 0xff7ff             // -FLT_MAX = 0xff7fffff
 shl $m6, $m6, 12
 or $m6, $m6, 0xfff
 st32 $m6, $m11, $mzero, FRAME_NEG_MAX
 setzi $m6, 0x3f800             // 1.0f = 0x3f800000
 shl $m6, $m6, 12
 st32 $m6, $m11, $mzero, FRAME_ONE
 zero $m1                       // first row of the chunk
.Latt_chunk:
 st32 $m1, $m11, $mzero, FRAME_ROW0
 setzi $m6, ATT_ROWS
 sub $m6, $m6, $m1
 min $m6, $m6, WORKER_CONTEXTS
 st32 $m6, $m11, $mzero, FRAME_CHUNK
 setzi $m6, .Latt_scores
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 setzi $m6, .Latt_stats
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 setzi $m6, .Latt_output
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m1, $m1, WORKER_CONTEXTS
 cmpult $m6, $m1, ATT_ROWS
 brnz $m6, .Latt_chunk
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size ATT_SYMBOL, .-ATT_SYMBOL

// $m5 <- keys visible to chunk row $m1 (row $m4 = ROW0 + $m1 computed here); clobbers $m6.
 .macro VISIBLE_KEYS
 ld32 $m4, $mvertex_base, $mzero, FRAME_ROW0
 add $m4, $m4, $m1
#if ATT_CAUSAL
 ld32 $m5, $mvertex_base, $mzero, FRAME_VISIBLE
 add $m5, $m5, $m4
 max $m5, $m5, 0
 min $m5, $m5, KEYS
#else
 setzi $m5, KEYS
#endif
 .endm

// ---- phase 1: scores of the chunk's (row i, key j) pairs, dealt round-robin -----------------
 .section .text.att_scores,"ax",@progbits
 .worker
 .p2align 3
.Latt_scores:
 get $m2, $WSR
 and $m2, $m2, CSR_W_WSR__CTXTID_M1__MASK   // key j = worker id (then +6)
 ld32 $m3, $mvertex_base, $mzero, FRAME_CHUNK
 ld32 $m7, $mvertex_base, $mzero, FRAME_WS
 zero $m1                                   // chunk row i
.Latt_scores_wrap:
 cmpult $m0, $m2, KEYS
 brnz $m0, .Latt_scores_item
 add $m2, $m2, -KEYS
 add $m1, $m1, 1
 bri .Latt_scores_wrap
.Latt_scores_item:
 cmpult $m0, $m1, $m3
 brz $m0, .Latt_scores_exit
 VISIBLE_KEYS
 cmpult $m0, $m2, $m5
 brz $m0, .Latt_scores_next                 // a blocked key: phase 2 never reads it
 ld32 $m9, $mvertex_base, $mzero, FRAME_Q
 mul $m6, $m4, QROW_BYTES
 add $m9, $m9, $m6                          // q row
 ld32 $m12, $mvertex_base, $mzero, FRAME_K
 mul $m6, $m2, QROW_BYTES
 add $m12, $m12, $m6                        // k row j
 setzi $a12, 0
 setzi $a13, 0
 setzi $m8, DOT_CHUNKS - 1
 ld64 $a0:1, $m9, $mzero, 0
 zero $m10
 ld64step $a2:3, $m12, $m10+=, 1
#if ATT_F32
 .p2align 3
 {
  rpt $m8, 2
  fnop
 }
 {
  ld64 $a0:1, $m9, $m10, 0
  f32v2mul $a4:5, $a0:1, $a2:3
 }
 {
  ld64step $a2:3, $m12, $m10+=, 1
  fnop
 }
 {
  nop
  f32v2add $a12:13, $a12:13, $a4:5
 }
 f32v2mul $a4:5, $a0:1, $a2:3
 f32v2add $a12:13, $a12:13, $a4:5
#else
 .p2align 3
 {
  rpt $m8, 7
  fnop
 }
 {
  nop
  f16v2tof32 $a4:5, $a0
 }
 {
  nop
  f16v2tof32 $a6:7, $a1
 }
 {
  nop
  f16v2tof32 $a8:9, $a2
 }
 {
  ld64 $a0:1, $m9, $m10, 0
  f16v2tof32 $a10:11, $a3
 }
 {
  ld64step $a2:3, $m12, $m10+=, 1
  f32v2mul $a4:5, $a4:5, $a8:9
 }
 {
  nop
  f32v2mul $a6:7, $a6:7, $a10:11
 }
 {
  nop
  f32v2add $a12:13, $a12:13, $a4:5
 }
 {
  nop
  f32v2add $a12:13, $a12:13, $a6:7
 }
 f16v2tof32 $a4:5, $a0
 f16v2tof32 $a6:7, $a1
 f16v2tof32 $a8:9, $a2
 f16v2tof32 $a10:11, $a3
 f32v2mul $a4:5, $a4:5, $a8:9
 f32v2mul $a6:7, $a6:7, $a10:11
 f32v2add $a12:13, $a12:13, $a4:5
 f32v2add $a12:13, $a12:13, $a6:7
#endif
 f32add $a12, $a12, $a13
 ld32 $a0, $mvertex_base, $mzero, FRAME_SCALE
 f32mul $a12, $a12, $a0
#if ATT_MASK
 ld32 $m6, $mvertex_base, $mzero, FRAME_MASK
 mul $m0, $m4, ATT_MASK_ROW_BYTES
 add $m6, $m6, $m0                          // mask row
#if ATT_MASK_PER_KEY
#if ATT_MASK_F32
 shl $m0, $m2, 2
 ld32 $a0, $m6, $m0, 0
 f32add $a12, $a12, $a0
#else
 shr $m0, $m2, 1                            // the aligned word holding mask element j
 shl $m0, $m0, 2
 ld32 $a0, $m6, $m0, 0
 f16v2tof32 $a2:3, $a0
 and $m0, $m2, 1
 brnz $m0, .Latt_mask_odd
 f32add $a12, $a12, $a2
 bri .Latt_mask_done
.Latt_mask_odd:
 f32add $a12, $a12, $a3
.Latt_mask_done:
#endif
#else
 ld32 $a0, $m6, $mzero, 0                   // one value for the whole row
#if ATT_MASK_F32
 f32add $a12, $a12, $a0
#else
 f16v2tof32 $a2:3, $a0
 f32add $a12, $a12, $a2
#endif
#endif
#endif
 mul $m0, $m1, WS_ROW_BYTES
 shl $m6, $m2, 2
 add $m0, $m0, $m6
 st32 $a12, $m7, $m0, 0
.Latt_scores_next:
 add $m2, $m2, WORKER_CONTEXTS
 bri .Latt_scores_wrap
.Latt_scores_exit:
 exitz $mzero

// ---- phase 2: worker i: max, p_j = exp(s_j - max) in place, 1 / max(l, 1) -----------------
 .section .text.att_stats,"ax",@progbits
 .worker
 .p2align 3
.Latt_stats:
 get $m1, $WSR
 and $m1, $m1, CSR_W_WSR__CTXTID_M1__MASK   // chunk row i = worker id
 ld32 $m3, $mvertex_base, $mzero, FRAME_CHUNK
 cmpult $m0, $m1, $m3
 brz $m0, .Latt_stats_exit
 VISIBLE_KEYS
 ld32 $m7, $mvertex_base, $mzero, FRAME_WS
 mul $m0, $m1, WS_ROW_BYTES
 add $m7, $m7, $m0                          // scores of row i
 ld32 $a14, $mvertex_base, $mzero, FRAME_NEG_MAX
 zero $m0
 add $m10, $m5, 0
 brz $m10, .Latt_max_done
.Latt_max:
 ld32step $a0, $m7, $m0+=, 1
 f32max $a14, $a14, $a0
 add $m10, $m10, -1
 brnz $m10, .Latt_max
.Latt_max_done:
 setzi $a13, 0
 zero $m0
 add $m10, $m5, 0
 brz $m10, .Latt_exp_done
.Latt_exp:
 ld32 $a0, $m7, $m0, 0
 f32sub $a0, $a0, $a14
 f32exp $a0, $a0
 st32step $a0, $m7, $m0+=, 1
 f32add $a13, $a13, $a0
 add $m10, $m10, -1
 brnz $m10, .Latt_exp
.Latt_exp_done:
 ld32 $a1, $mvertex_base, $mzero, FRAME_ONE
 f32max $a13, $a13, $a1
 f32div $a13, $a1, $a13                     // 1 / max(l, 1)
 ld32 $m7, $mvertex_base, $mzero, FRAME_WS
 shl $m0, $m1, 2
 setzi $m6, STATS_OFFSET
 add $m0, $m0, $m6
 st32 $a13, $m7, $m0, 0
.Latt_stats_exit:
 exitz $mzero

// ---- phase 3: out[row i, group g] for the chunk's (i, g) pairs, dealt round-robin ---------
 .section .text.att_output,"ax",@progbits
 .worker
 .p2align 3
.Latt_output:
 get $m2, $WSR
 and $m2, $m2, CSR_W_WSR__CTXTID_M1__MASK   // column group g = worker id (then +6)
 ld32 $m3, $mvertex_base, $mzero, FRAME_CHUNK
 zero $m1                                   // chunk row i
 setzi $m11, VROW_BYTES / 8                 // v row stride in 64-bit atoms
.Latt_output_wrap:
 cmpult $m0, $m2, GROUPS
 brnz $m0, .Latt_output_item
 add $m2, $m2, -GROUPS
 add $m1, $m1, 1
 bri .Latt_output_wrap
.Latt_output_item:
 cmpult $m0, $m1, $m3
 brz $m0, .Latt_output_exit
 VISIBLE_KEYS
 ld32 $m7, $mvertex_base, $mzero, FRAME_WS
 mul $m0, $m1, WS_ROW_BYTES
 add $m7, $m7, $m0                          // p of row i
 ld32 $m9, $mvertex_base, $mzero, FRAME_V
 shl $m12, $m2, 3                           // v offset: column group g of key 0
 setzi $a8, 0
 setzi $a9, 0
 setzi $a10, 0
 setzi $a11, 0
 brz $m5, .Latt_acc_done
 add $m8, $m5, -1
 zero $m0
 ld32step $a0, $m7, $m0+=, 1
 ld64step $a2:3, $m9, $m12+=, $m11
#if ATT_F32
 .p2align 3
 {
  rpt $m8, 2
  fnop
 }
 {
  ld32step $a0, $m7, $m0+=, 1
  f32v2mul $a4:5, $a0:B, $a2:3
 }
 {
  ld64step $a2:3, $m9, $m12+=, $m11
  fnop
 }
 {
  nop
  f32v2add $a8:9, $a8:9, $a4:5
 }
 f32v2mul $a4:5, $a0:B, $a2:3
 f32v2add $a8:9, $a8:9, $a4:5
#else
 .p2align 3
 {
  rpt $m8, 5
  fnop
 }
 {
  nop
  f16v2tof32 $a4:5, $a2
 }
 {
  ld64step $a2:3, $m9, $m12+=, $m11
  f16v2tof32 $a6:7, $a3
 }
 {
  nop
  f32v2mul $a4:5, $a0:B, $a4:5
 }
 {
  ld32step $a0, $m7, $m0+=, 1
  f32v2mul $a6:7, $a0:B, $a6:7
 }
 {
  nop
  f32v2add $a8:9, $a8:9, $a4:5
 }
 {
  nop
  f32v2add $a10:11, $a10:11, $a6:7
 }
 f16v2tof32 $a4:5, $a2
 f16v2tof32 $a6:7, $a3
 f32v2mul $a4:5, $a0:B, $a4:5
 f32v2mul $a6:7, $a0:B, $a6:7
 f32v2add $a8:9, $a8:9, $a4:5
 f32v2add $a10:11, $a10:11, $a6:7
#endif
.Latt_acc_done:
 ld32 $m7, $mvertex_base, $mzero, FRAME_WS
 shl $m0, $m1, 2
 setzi $m6, STATS_OFFSET
 add $m0, $m0, $m6
 ld32 $a13, $m7, $m0, 0                     // 1 / l of row i
 ld32 $m6, $mvertex_base, $mzero, FRAME_OUT
 mul $m0, $m4, OUT_ROW_BYTES
 add $m6, $m6, $m0
 shl $m0, $m2, 3
 f32v2mul $a8:9, $a13:B, $a8:9
#if ATT_F32
 st64 $a8:9, $m6, $m0, 0
#else
 f32v2mul $a10:11, $a13:B, $a10:11
 f32v2tof16 $a0, $a8:9
 f32v2tof16 $a1, $a10:11
 st64 $a0:1, $m6, $m0, 0
#endif
 add $m2, $m2, WORKER_CONTEXTS
 bri .Latt_output_wrap
.Latt_output_exit:
 exitz $mzero

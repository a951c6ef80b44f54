// attention.S -- IPU21 attention of one tile's query block (MapCall kind "attention"):
//   out[r] = softmax(scale * q[r] K^T (+ mask[r]), causal keys blocked) V, in f32 throughout.
//
// Written for ipu-stack from the public Tile Vertex ISA (f16v2tof32, f32v2mul with its
// scalar-broadcast form `$aSrc0:B`, f32v2add, f32add, f32mul, f32sub, f32max, f32div,
// f32exp, f32v2tof16, ld32/ld64/st32/st64 and their step forms) and facts §16.2-16.3
// (runall, exitz, sync). One compile unit per variant; kernels/units_attention.py supplies:
//   ATT_F32          q, k, v and out are f32 (else f16)
//   ATT_ROWS         query rows R       ATT_KEYS  keys T
//   ATT_D            head dim D (D * element bytes a multiple of 8)
//   ATT_DV           value dim DV (DV * element bytes a multiple of 8)
//   ATT_CAUSAL       keys j > visible(r) - 1 blocked; visible(r) = $m9 + r (clamped to 0..T)
//   ATT_MASK         an additive mask operand; ATT_MASK_F32 its dtype (else f16);
//   ATT_MASK_ROW_BYTES  bytes from one mask row to the next (0: one row for every query);
//   ATT_MASK_PER_KEY    1: one value per key, 0: one value per row (column broadcast)
//   ATT_SYMBOL       the entry symbol
// ABI (supervisor): $m2 out [R, DV], $m3 q [R, D], $m4 k [T, D], $m5 v [T, DV] (rows dense),
// $m6 mask (when ATT_MASK; rows of ceil(cols * bytes / 8) * 8 bytes), $m7 workspace of
// 6 * T f32 (8-byte aligned; the kernel's own scratch), $m8 scale (f32 bits), $m9 visible
// keys of query row 0 (signed; causal units), $m10 return address, $m11 stack.
//
// Per query row (worker w takes rows w, w + 6, ...), three passes over its n visible keys:
// (1) s_j = (q . k_j) * scale (+ mask), into the worker's workspace, running max m (from
// -FLT_MAX, so a row whose keys are all -inf gives exp(-inf) = 0, not NaN); (2) p_j =
// exp(s_j - m) in place, l = sum p_j; (3) per output column group, sum_j p_j v_j, times
// 1 / max(l, 1) (l >= 1 whenever a key is visible: the max key contributes exp(0); a fully
// blocked row gives zeros, the simulator's NaN guard), rounded once to the output dtype.
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
 .set CHUNK, 2                  // elements per 64-bit load
#else
 .set EB, 2
 .set CHUNK, 4
#endif
 .set QROW_BYTES, ATT_D * EB
 .set VROW_BYTES, ATT_DV * EB
 .set OUT_ROW_BYTES, ATT_DV * EB
 .set DOT_CHUNKS, ATT_D / CHUNK
 .set WS_BYTES, KEYS * 4
 // immediates: mul/cmpult/min/add take 16 bits, setzi 20 (Tile Vertex ISA)
 .if (WS_BYTES > 65535) || (QROW_BYTES > 65535) || (6 * OUT_ROW_BYTES > 0xfffff)
 .error "attention unit too large for the kernel's immediates"
 .endif
 .if 6 * QROW_BYTES > 0xfffff
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
 .set FRAME_BYTES, 40

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
 setzi $m6, .Latt_worker
 runall $m6, $m11, 0
 sync SYNC_ZONE_LOCAL
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size ATT_SYMBOL, .-ATT_SYMBOL

 .section .text.att_worker,"ax",@progbits
 .worker
 .p2align 3
.Latt_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 // rows of this worker: (ROWS - w + 5) / 6, exact below 2^16
 sub $m1, $mzero, $m0
 add $m1, $m1, ATT_ROWS + WORKER_CONTEXTS - 1
 mul $m1, $m1, 43691
 shr $m1, $m1, 18
 brz $m1, .Latt_idle
 ld32 $m2, $mvertex_base, $mzero, FRAME_OUT
 mul $m4, $m0, OUT_ROW_BYTES
 add $m2, $m2, $m4              // out row of this worker
 ld32 $m3, $mvertex_base, $mzero, FRAME_Q
 mul $m4, $m0, QROW_BYTES
 add $m3, $m3, $m4              // q row
 ld32 $m5, $mvertex_base, $mzero, FRAME_V
 ld32 $m7, $mvertex_base, $mzero, FRAME_WS
 mul $m4, $m0, WS_BYTES
 add $m7, $m7, $m4              // this worker's scores
#if ATT_MASK
 ld32 $m6, $mvertex_base, $mzero, FRAME_MASK
 mul $m4, $m0, ATT_MASK_ROW_BYTES
 add $m6, $m6, $m4              // mask row
#endif
#if ATT_CAUSAL
 ld32 $m9, $mvertex_base, $mzero, FRAME_VISIBLE
 add $m9, $m9, $m0              // visible keys of this worker's first row
#endif

.Latt_row:
#if ATT_CAUSAL
 max $m8, $m9, 0
 min $m8, $m8, KEYS
#else
 setzi $m8, KEYS
#endif
 // -- pass 1: scores and their running max ------------------------------------------------
 ld32 $a14, $mvertex_base, $mzero, FRAME_NEG_MAX
 ld32 $m12, $mvertex_base, $mzero, FRAME_K
 zero $m10                      // key j
 brz $m8, .Latt_scores_done
.Latt_score:
 setzi $a12, 0
 setzi $a13, 0
 zero $m11
 setzi $m0, DOT_CHUNKS
.Latt_dot:
 ld64 $a0:1, $m3, $m11, 0
 ld64step $a2:3, $m12, $m11+=, 1
#if ATT_F32
 f32v2mul $a4:5, $a0:1, $a2:3
 f32v2add $a12:13, $a12:13, $a4:5
#else
 f16v2tof32 $a4:5, $a0
 f16v2tof32 $a6:7, $a1
 f16v2tof32 $a8:9, $a2
 f16v2tof32 $a10:11, $a3
 f32v2mul $a4:5, $a4:5, $a8:9
 f32v2mul $a6:7, $a6:7, $a10:11
 f32v2add $a12:13, $a12:13, $a4:5
 f32v2add $a12:13, $a12:13, $a6:7
#endif
 add $m0, $m0, -1
 brnz $m0, .Latt_dot
 add $m12, $m12, QROW_BYTES     // next key row (k rows are D wide, like q)
 f32add $a12, $a12, $a13
 ld32 $a0, $mvertex_base, $mzero, FRAME_SCALE
 f32mul $a12, $a12, $a0
#if ATT_MASK
#if ATT_MASK_PER_KEY
#if ATT_MASK_F32
 shl $m0, $m10, 2
 ld32 $a0, $m6, $m0, 0
 f32add $a12, $a12, $a0
#else
 shr $m0, $m10, 1               // the aligned word holding mask element j
 shl $m0, $m0, 2
 ld32 $a0, $m6, $m0, 0
 f16v2tof32 $a2:3, $a0
 and $m0, $m10, 1
 brnz $m0, .Latt_mask_odd
 f32add $a12, $a12, $a2
 bri .Latt_mask_done
.Latt_mask_odd:
 f32add $a12, $a12, $a3
.Latt_mask_done:
#endif
#else
 ld32 $a0, $m6, $mzero, 0       // one value for the whole row
#if ATT_MASK_F32
 f32add $a12, $a12, $a0
#else
 f16v2tof32 $a2:3, $a0
 f32add $a12, $a12, $a2
#endif
#endif
#endif
 shl $m0, $m10, 2
 st32 $a12, $m7, $m0, 0
 f32max $a14, $a14, $a12
 add $m10, $m10, 1
 cmpult $m0, $m10, $m8
 brnz $m0, .Latt_score
.Latt_scores_done:

 // -- pass 2: p_j = exp(s_j - m) in place, l = sum p_j --------------------------------------
 setzi $a13, 0
 zero $m0
 add $m10, $m8, 0
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
 f32div $a13, $a1, $a13         // 1 / max(l, 1)

 // -- pass 3: out[r, group] = (sum_j p_j v[j, group]) / l ----------------------------------
 setzi $m11, VROW_BYTES / 8     // v row stride in 64-bit atoms
 zero $m4                       // byte offset of the column group
.Latt_group:
 zero $m0
 add $m12, $m4, 0
 add $m10, $m8, 0
 setzi $a8, 0
 setzi $a9, 0
 setzi $a10, 0
 setzi $a11, 0
 brz $m10, .Latt_group_done
.Latt_acc:
 ld32step $a0, $m7, $m0+=, 1
 ld64step $a2:3, $m5, $m12+=, $m11
#if ATT_F32
 f32v2mul $a4:5, $a0:B, $a2:3
 f32v2add $a8:9, $a8:9, $a4:5
#else
 f16v2tof32 $a4:5, $a2
 f16v2tof32 $a6:7, $a3
 f32v2mul $a4:5, $a0:B, $a4:5
 f32v2mul $a6:7, $a0:B, $a6:7
 f32v2add $a8:9, $a8:9, $a4:5
 f32v2add $a10:11, $a10:11, $a6:7
#endif
 add $m10, $m10, -1
 brnz $m10, .Latt_acc
.Latt_group_done:
 f32v2mul $a8:9, $a13:B, $a8:9
#if ATT_F32
 st64 $a8:9, $m2, $m4, 0
#else
 f32v2mul $a10:11, $a13:B, $a10:11
 f32v2tof16 $a0, $a8:9
 f32v2tof16 $a1, $a10:11
 st64 $a0:1, $m2, $m4, 0
#endif
 add $m4, $m4, 8
 cmpult $m0, $m4, OUT_ROW_BYTES
 brnz $m0, .Latt_group

 // -- next row of this worker (steps through a register: add takes 16-bit immediates) --------
 setzi $m0, WORKER_CONTEXTS * OUT_ROW_BYTES
 add $m2, $m2, $m0
 setzi $m0, WORKER_CONTEXTS * QROW_BYTES
 add $m3, $m3, $m0
#if ATT_MASK
 setzi $m0, WORKER_CONTEXTS * ATT_MASK_ROW_BYTES
 add $m6, $m6, $m0
#endif
#if ATT_CAUSAL
 add $m9, $m9, WORKER_CONTEXTS
#endif
 add $m1, $m1, -1
 brnz $m1, .Latt_row
.Latt_idle:
 exitz $mzero

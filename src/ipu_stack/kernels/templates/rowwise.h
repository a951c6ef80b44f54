// rowwise.h -- worker macros shared by the row-wise kernels (layer_norm.S, softmax.S).
//
// Written for ipu-stack from the ISA facts in shared/docs/ipu21-facts.md (§16.2 bundles,
// §16.3 ld64step, rpt) and the Tile Vertex ISA instruction list (ld32step / st32step with ARF
// registers, f32v2add/sub/mul/max, f32add/max, f32exp, f32oox, f32sqrt).
//
// The registry's semantics (runtime/sim.py: map_semantics) compute in f32 with NumPy; these
// macros reproduce that arithmetic operation for operation, so the f32 results are the same:
//   * a row sum is NumPy's pairwise sum: a block of n <= 128 elements is summed by eight
//     accumulators (element i into accumulator i % 8, the first block added to zero), combined
//     as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the n % 8 last elements one by
//     one; a longer row splits at h = n / 2 - (n / 2) % 8 and adds the two halves' sums
//     (a row of fewer than 8 elements is summed one by one from zero);
//   * a division a / b is rounded once: q0 = a * (1 / b), the residual a - q0 * b computed
//     exactly (Dekker's product with 4097-splitting), q = q0 + residual * (1 / b).
//
// Flags: RW_F32 (f32 rows, else f16 converted to f32 on load), RW_COLS (C, even).
// Worker registers: $m1 the row (input), $m6 this worker's scratch, $m7 the element offset
// (bytes) of the pass, $m8 loop counts; $a0..$a7 the eight accumulators, $a10:11 the pass
// constant (mean or maximum), $a12:13 the current element pair, $a14 a pass's sum, $a8:9
// scratch. Scratch words (32-bit, from $m6) are named SCR_* by the including template.

#ifndef RW_COLS
#error "RW_COLS is required"
#endif

#if RW_F32
 .set EB, 4                    // element bytes
#else
 .set EB, 2
#endif
 .set COLS, RW_COLS
 .set PAIRS, RW_COLS / 2
 .set ROW_BYTES, ((RW_COLS * EB + 7) / 8) * 8   // rows start 8-byte aligned
 .set SPLIT_BITS, 0x45801000   // f32 4097 = 2^12 + 1 (Veltkamp splitting of 24-bit f32)

// An aux-pipeline (floating-point) instruction bundled with a main-pipeline nop.
 .macro FP insn:vararg
 .p2align 3
 {
  nop
  \insn
 }
 .endm

// The next element pair of the row ($m1 + $m7) as f32 into $a12:13; $m7 advances step pairs.
 .macro LOADSTEP step=1
#if RW_F32
 .p2align 3
 {
  ld64step $a12:13, $m1, $m7+=, \step
  fnop
 }
#else
 .p2align 3
 {
  ld32step $a8, $m1, $m7+=, \step
  fnop
 }
 FP f16v2tof32 $a12:13, $a8
#endif
 .endm

// The element function of a summing pass on $a12:13: 1 x, 2 (x - $a10:11)^2, 3 exp(x - $a10:11).
 .macro TRANSFORM pass
 .if \pass == 2
 FP f32v2sub $a12:13, $a12:13, $a10:11
 FP f32v2mul $a12:13, $a12:13, $a12:13
 .elseif \pass == 3
 FP f32v2sub $a12:13, $a12:13, $a10:11
 FP f32exp $a12, $a12
 FP f32exp $a13, $a13
 .endif
 .endm

// NumPy's pairwise block of n elements from element off: the sum into $a14.
 .macro LEAF n, off, pass
 setzi $m7, (\off) * EB
 .if (\n) >= 8
 setzi $a0, 0
 setzi $a1, 0
 setzi $a2, 0
 setzi $a3, 0
 setzi $a4, 0
 setzi $a5, 0
 setzi $a6, 0
 setzi $a7, 0
 setzi $m8, (\n) / 8
 .p2align 3
 {
  rpt $m8, (.Lrw_end\@ - .Lrw_body\@) / 8 - 1
  fnop
 }
.Lrw_body\@:
 LOADSTEP
 TRANSFORM \pass
 FP f32v2add $a0:1, $a0:1, $a12:13
 LOADSTEP
 TRANSFORM \pass
 FP f32v2add $a2:3, $a2:3, $a12:13
 LOADSTEP
 TRANSFORM \pass
 FP f32v2add $a4:5, $a4:5, $a12:13
 LOADSTEP
 TRANSFORM \pass
 FP f32v2add $a6:7, $a6:7, $a12:13
.Lrw_end\@:
 FP f32add $a8, $a0, $a1
 FP f32add $a9, $a2, $a3
 FP f32add $a8, $a8, $a9
 FP f32add $a9, $a4, $a5
 FP f32add $a12, $a6, $a7
 FP f32add $a9, $a9, $a12
 FP f32add $a14, $a8, $a9
 .else
 setzi $a14, 0
 .endif
 .rept ((\n) % 8) / 2
 LOADSTEP
 TRANSFORM \pass
 FP f32add $a14, $a14, $a12
 FP f32add $a14, $a14, $a13
 .endr
 .endm

// NumPy's pairwise sum of n elements from element off into $a14 (lvl: depth, a scratch word).
// pass 4 takes each block's sum from word rw_leaf (the block's number) of the table at $m2.
 .macro PW n, off, lvl, pass
 .if (\n) <= 128
 .if \pass == 4
 ld32 $a14, $m2, $mzero, rw_leaf
 .set rw_leaf, rw_leaf + 1
 .else
 LEAF \n, \off, \pass
 .endif
 .else
 .set rw_h\@, (\n) / 2 - ((\n) / 2) % 8
 .set rw_r\@, (\n) - rw_h\@
 .set rw_o\@, (\off) + rw_h\@
 PW rw_h\@, \off, \lvl + 1, \pass
 st32 $a14, $m6, $mzero, SCR_STACK + \lvl
 PW rw_r\@, rw_o\@, \lvl + 1, \pass
 ld32 $a12, $m6, $mzero, SCR_STACK + \lvl
 FP f32add $a14, $a12, $a14
 .endif
 .endm

// The pairwise blocks of n elements from element off, numbered from rw_leaf in row order:
// the blocks whose number (counted modulo 6 in $m9 from the row's first) is this worker's
// ($m0) are summed (pass as in LEAF) into word rw_leaf of the table at $m2.
 .macro BLOCKS n, off, pass
 .if (\n) <= 128
 cmpeq $m10, $m9, $m0
 brz $m10, .Lrw_other\@
 LEAF \n, \off, \pass
 st32 $a14, $m2, $mzero, rw_leaf
.Lrw_other\@:
 add $m9, $m9, 1
 cmpeq $m10, $m9, WORKER_CONTEXTS
 brz $m10, .Lrw_next\@
 zero $m9
.Lrw_next\@:
 .set rw_leaf, rw_leaf + 1
 .else
 .set rw_h\@, (\n) / 2 - ((\n) / 2) % 8
 BLOCKS rw_h\@, \off, \pass
 BLOCKS (\n) - rw_h\@, (\off) + rw_h\@, \pass
 .endif
 .endm

// A worker entry: every row's pairwise blocks, split over the workers, into the table at the
// row's output (pass as in LEAF; passes 2 and 3 take $a10:11 from pair slot const of row r's
// statistics, worker r's scratch). Frame words FRAME_X, FRAME_OUT hold the rows.
 .macro ROW_BLOCKS pass, const
 PROLOGUE
 ld32 $m1, $mvertex_base, $mzero, FRAME_X
 ld32 $m2, $mvertex_base, $mzero, FRAME_OUT
 add $m6, $mvertex_base, SCRATCH   // row r's statistics: worker r's scratch
 zero $m9                      // the block number modulo 6
 setzi $m5, ROWS
.Lrw_blocks_row\@:
 .if \pass != 1
 ld64 $a10:11, $m6, $mzero, \const
 .endif
 .set rw_leaf, 0
 BLOCKS COLS, 0, \pass
 add $m1, $m1, ROW_BYTES
 add $m2, $m2, ROW_BYTES
 add $m6, $m6, SCRATCH_BYTES
 add $m5, $m5, -1
 brnz $m5, .Lrw_blocks_row\@
 exitz $mzero
 .endm

// A worker entry's start: worker r < ROWS (others go to idle) sums row r from its blocks'
// table (at the row's output) in NumPy's pairwise order into $a14.
 .macro ROW_SUM idle
 PROLOGUE
 cmpult $m5, $m0, ROWS
 brz $m5, \idle
 ld32 $m2, $mvertex_base, $mzero, FRAME_OUT
 mul $m8, $m0, ROW_BYTES       // row w
 add $m2, $m2, $m8
 .set rw_leaf, 0
 PW COLS, 0, 0, 4
 .endm

// $a0:1 <- $a0:1 / b, rounded once (see the header), with b, 1/b, b's high and low 12-bit
// halves as f32 pairs at scratch pair slots sb, sr, sbh, sbl; the 4097 pair at $m13 + sp.
// $a12:13 must hold 1/b on entry. Uses $a2..$a13.
 .macro DIVIDE sb, sr, sbh, sbl, sp
 .p2align 3
 {
  ld64 $a12:13, $mvertex_base, $mzero, \sp
  f32v2mul $a2:3, $a0:1, $a12:13          // q0 = a * (1 / b)
 }
 .p2align 3
 {
  ld64 $a12:13, $m6, $mzero, \sb
  f32v2mul $a4:5, $a2:3, $a12:13          // t = q0 * 4097
 }
 FP f32v2mul $a8:9, $a2:3, $a12:13        // p = q0 * b
 FP f32v2sub $a6:7, $a4:5, $a2:3          // t - q0
 FP f32v2sub $a4:5, $a4:5, $a6:7          // qh = t - (t - q0)
 .p2align 3
 {
  ld64 $a12:13, $m6, $mzero, \sbh
  f32v2sub $a6:7, $a2:3, $a4:5            // ql = q0 - qh
 }
 FP f32v2mul $a10:11, $a4:5, $a12:13      // qh * bh
 FP f32v2sub $a10:11, $a10:11, $a8:9      // e = qh * bh - p
 FP f32v2sub $a0:1, $a0:1, $a8:9          // a - p (exact)
 FP f32v2mul $a8:9, $a6:7, $a12:13        // ql * bh
 .p2align 3
 {
  ld64 $a12:13, $m6, $mzero, \sbl
  f32v2add $a10:11, $a10:11, $a8:9
 }
 FP f32v2mul $a8:9, $a4:5, $a12:13        // qh * bl
 FP f32v2add $a10:11, $a10:11, $a8:9
 FP f32v2mul $a8:9, $a6:7, $a12:13        // ql * bl
 .p2align 3
 {
  ld64 $a12:13, $m6, $mzero, \sr
  f32v2add $a10:11, $a10:11, $a8:9        // e: q0 * b = p + e exactly
 }
 FP f32v2sub $a0:1, $a0:1, $a10:11        // residual a - q0 * b
 FP f32v2mul $a0:1, $a0:1, $a12:13        // residual / b
 FP f32v2add $a0:1, $a2:3, $a0:1          // q
 .endm

// Store the divisor pair $a0:1 and its reciprocal and 12-bit halves at scratch pair slots
// sb, sr, sbh, sbl (the 4097 pair at $m13 + sp). Uses $a2..$a7, $a12:13.
 .macro DIVISOR sb, sr, sbh, sbl, sp
 .p2align 3
 {
  ld64 $a12:13, $mvertex_base, $mzero, \sp
  f32oox $a2, $a0
 }
 FP f32oox $a3, $a1
 FP f32v2mul $a4:5, $a0:1, $a12:13        // t = b * 4097
 FP f32v2sub $a6:7, $a4:5, $a0:1
 FP f32v2sub $a4:5, $a4:5, $a6:7          // bh = t - (t - b)
 FP f32v2sub $a6:7, $a0:1, $a4:5          // bl = b - bh
 st64 $a0:1, $m6, $mzero, \sb
 st64 $a2:3, $m6, $mzero, \sr
 st64 $a4:5, $m6, $mzero, \sbh
 st64 $a6:7, $m6, $mzero, \sbl
 .endm

// An f32 constant into $m6 from its bit pattern (20-bit setzi, then the low 12 bits).
 .macro CONSTANT bits
 setzi $m6, (\bits) >> 12
 shl $m6, $m6, 12
 or $m6, $m6, (\bits) & 0xfff
 .endm

// Items w, w + 6, ... of n for this worker ($m0 = its id) into reg: (n - w + 5) / 6, exact
// below 2^16.
 .macro WORKER_SHARE reg, n
 sub \reg, $mzero, $m0
 add \reg, \reg, \n + WORKER_CONTEXTS - 1
 mul \reg, \reg, 43691
 shr \reg, \reg, 18
 .endm

// The worker prologue: $m0 its id, $m6 its scratch (frame + SCRATCH + id * SCRATCH_BYTES).
 .macro PROLOGUE
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 mul $m6, $m0, SCRATCH_BYTES
 add $m6, $m6, $mvertex_base
 add $m6, $m6, SCRATCH
 .endm

// Rows of at most this many rows are shared by all six workers (statistics of row r by
// worker r, then every row's elements split over the workers); longer ones row by row.
 .set COOP, RW_ROWS < WORKER_CONTEXTS
 .set PARALLEL_SUMS, RW_COLS > 128   // COOP: more than one pairwise block per row

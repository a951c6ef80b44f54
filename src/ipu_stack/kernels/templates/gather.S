// gather.S -- IPU21 embedding-row gather on one tile (the registry's gather_rows kernel).
//
// Written for ipu-stack from the Tile Vertex ISA (ld32/ld32step/st32step, cmpult, runall,
// exitz, sync, trap). out[i] = table[ids[i] - row_offset] for the ids this table block holds
// (row_offset <= id < row_offset + ROWS), zero rows for the others; an id outside the whole
// table [0, table_rows) stops the tile with `trap GATHER_TRAP_CODE`, $m0 = its flat position
// and $m1 = the id (the first such id in flat order; assumption trap_reports).
// Flags from the unit name (kernels/units_indexing.py):
//   GATHER_N          ids (= output rows)          GATHER_ROW_BYTES  bytes of a table row
//   GATHER_STRIDE     bytes between table rows and between output rows (zero padded)
//   GATHER_ROWS       rows of this table block
//   GATHER_ID_COLS    columns of the ids view      GATHER_ID_STRIDE  bytes between its rows
//   GATHER_TRAP_CODE  the trap code                GATHER_SYMBOL     the entry symbol
// ABI (supervisor): $m2 output, $m3 table, $m4 ids, $m5 row_offset, $m6 table_rows; $m10
// return address, $m11 stack. Worker w handles the ids [w * CHUNK, (w + 1) * CHUNK) and
// reports its first bad id in its frame slots; the supervisor traps on the first report.
#include "ipu21_tile.h"
#include "ipu21_pack.inc"

 .set CHUNK, (GATHER_N + WORKER_CONTEXTS - 1) / WORKER_CONTEXTS
 .set FULL_WORDS, GATHER_ROW_BYTES / 4
 .set PART_BYTES, GATHER_ROW_BYTES % 4
 .set USED_WORDS, (GATHER_ROW_BYTES + 3) / 4
 .set PAD_WORDS, GATHER_STRIDE / 4 - USED_WORDS
 .set FRAME_OUT, 0
 .set FRAME_TABLE, 1
 .set FRAME_IDS, 2
 .set FRAME_OFFSET, 3
 .set FRAME_TOTAL, 4
 .set FRAME_BAD, 6              // per worker: first bad position (-1: none), its id
 .set FRAME_BYTES, 72

 .section .text.GATHER_SYMBOL,"ax",@progbits
 .globl GATHER_SYMBOL
 .type GATHER_SYMBOL,@function
 .p2align 3
 .supervisor
GATHER_SYMBOL:
 add $m11, $m11, -FRAME_BYTES
 st32 $m2, $m11, $mzero, FRAME_OUT
 st32 $m3, $m11, $mzero, FRAME_TABLE
 st32 $m4, $m11, $mzero, FRAME_IDS
 st32 $m5, $m11, $mzero, FRAME_OFFSET
 st32 $m6, $m11, $mzero, FRAME_TOTAL
 setzi $m7, .Lga_worker
 runall $m7, $m11, 0
 sync SYNC_ZONE_LOCAL
 // workers' ranges ascend with their index: the first report is the first bad id
 .irp w, 0, 1, 2, 3, 4, 5
 ld32 $m0, $m11, $mzero, FRAME_BAD + 2 * \w
 add $m1, $m0, 1
 brz $m1, .Lga_ok_\w
 ld32 $m1, $m11, $mzero, FRAME_BAD + 2 * \w + 1
 trap GATHER_TRAP_CODE
.Lga_ok_\w:
 .endr
 add $m11, $m11, FRAME_BYTES
 br $m10
 .size GATHER_SYMBOL, .-GATHER_SYMBOL

 .section .text.ga_worker,"ax",@progbits
 .worker
 .p2align 3
.Lga_worker:
 get $m0, $WSR
 and $m0, $m0, CSR_W_WSR__CTXTID_M1__MASK
 setzi $m10, CHUNK
 mul $m10, $m10, $m0            // first flat id position of this worker
 setzi $m6, GATHER_N
 sub $m6, $m6, $m10
 min $m6, $m6, CHUNK            // ids of this worker
 cmpslt $m1, $m6, 1
 brnz $m1, .Lga_none
 ld32 $m2, $mvertex_base, $mzero, FRAME_OUT
 ld32 $m8, $mvertex_base, $mzero, FRAME_TABLE
 ld32 $m3, $mvertex_base, $mzero, FRAME_IDS
 ld32 $m4, $mvertex_base, $mzero, FRAME_OFFSET
 ld32 $m5, $mvertex_base, $mzero, FRAME_TOTAL
 setzi $m1, GATHER_STRIDE
 mul $m1, $m1, $m10
 add $m2, $m2, $m1              // output row of the first id
 or $m9, $m10, 0                // column of the first id in the ids view
 setzi $m7, GATHER_ID_COLS
 setzi $m11, GATHER_ID_STRIDE
.Lga_find_row:
 cmpult $m1, $m9, $m7
 brnz $m1, .Lga_found
 sub $m9, $m9, $m7
 add $m3, $m3, $m11
 bri .Lga_find_row
.Lga_found:
 shl $m1, $m9, 2
 add $m3, $m3, $m1
.Lga_id:
 ld32 $m0, $m3, $mzero, 0
 cmpult $m1, $m0, $m5           // 0 <= id < table_rows (negative ids are large unsigned)
 brz $m1, .Lga_bad
 sub $m0, $m0, $m4
 cmpult $m1, $m0, GATHER_ROWS
 brz $m1, .Lga_foreign
 setzi $m1, GATHER_STRIDE
 mul $m0, $m0, $m1
 add $m11, $m8, $m0             // the table row
 .if FULL_WORDS
 setzi $m7, FULL_WORDS
.Lga_copy:
 ld32step $m0, $mzero, $m11+=, 1
 st32step $m0, $mzero, $m2+=, 1
 add $m7, $m7, -1
 brnz $m7, .Lga_copy
 .endif
 .if PART_BYTES
 ld32 $m0, $m11, $mzero, 0
 CONST32 $m1, (1 << (8 * PART_BYTES)) - 1
 and $m0, $m0, $m1              // the row's last elements; the rest is padding
 st32step $m0, $mzero, $m2+=, 1
 .endif
 bri .Lga_pad
.Lga_foreign:
 setzi $m7, USED_WORDS
.Lga_zero:
 st32step $mzero, $mzero, $m2+=, 1
 add $m7, $m7, -1
 brnz $m7, .Lga_zero
.Lga_pad:
 .rept PAD_WORDS
 st32step $mzero, $mzero, $m2+=, 1
 .endr
 add $m10, $m10, 1
 add $m3, $m3, 4
 add $m9, $m9, 1
 cmpult $m1, $m9, GATHER_ID_COLS
 brnz $m1, .Lga_same_row
 zero $m9
 add $m3, $m3, GATHER_ID_STRIDE - 4 * GATHER_ID_COLS
.Lga_same_row:
 add $m6, $m6, -1
 brnz $m6, .Lga_id
.Lga_none:
 get $m1, $WSR
 and $m1, $m1, CSR_W_WSR__CTXTID_M1__MASK
 shl $m1, $m1, 3
 add $m1, $m1, $mvertex_base
 sub $m0, $mzero, 1
 st32 $m0, $m1, $mzero, FRAME_BAD
 exitz $mzero
.Lga_bad:
 get $m1, $WSR
 and $m1, $m1, CSR_W_WSR__CTXTID_M1__MASK
 shl $m1, $m1, 3
 add $m1, $m1, $mvertex_base
 st32 $m10, $m1, $mzero, FRAME_BAD
 st32 $m0, $m1, $mzero, FRAME_BAD + 1
 exitz $mzero

// Reproduces the seed build failure (shared/seed/seed-log.txt, compile_kernels): the worker
// macro emits its \name argument as a label on two paths that are both live after C
// preprocessing, so every instantiation defines the same literal label twice.
#include "seed_defs.h"

 .set OUTPUT_COLUMNS, GEMM_OUTPUT_COLUMNS
 .set INNER_GROUPS, GEMM_INNER_BLOCK_DIMENSION / 16

 .macro GEMM_SUPERVISOR name, rows, worker
 .section .text.\name,"ax",@progbits
 .globl \name
 .type \name,@function
\name:
 .supervisor
 setzi $m0, \worker
 runall $m0, $m11, 0
 br $m10
 .size \name, .-\name
 .endm

 GEMM_SUPERVISOR GEMM_INIT_SMALL_SYMBOL, GEMM_SMALL_ROWS, .Lgemm_f16_amp_worker_small
 GEMM_SUPERVISOR GEMM_INIT_LARGE_SYMBOL, GEMM_LARGE_ROWS, .Lgemm_f16_amp_worker_large

 .worker
 .macro GEMM_WORKER name, retained_output_name, rows
 .p2align 3
\name:
#if GEMM_RETAIN_ENTRY
\name:
#endif
 setzi $m5, (\rows) / 6
 brz $m5, .Lgemm_f16_no_rows_\@
\retained_output_name:
 exitz $mzero
.Lgemm_f16_no_rows_\@:
 exitz $mzero
 .endm

 GEMM_WORKER .Lgemm_f16_amp_worker_small, .Lgemm_f16_amp_worker_small_retained_output, GEMM_SMALL_ROWS
 GEMM_WORKER .Lgemm_f16_amp_worker_large, .Lgemm_f16_amp_worker_large_retained_output, GEMM_LARGE_ROWS

// Defaults of the seed-failure fixture (a -D flag overrides them).
#ifndef GEMM_RETAIN_ENTRY
#define GEMM_RETAIN_ENTRY 1
#endif

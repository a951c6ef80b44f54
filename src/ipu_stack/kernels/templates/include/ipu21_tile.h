// ipu21_tile.h -- IPU21 tile constants used by ipu-stack's assembly templates.
//
// Our own header (the SDK's arch/gc_tile_defines.h is not needed). Each value cites
// shared/docs/ipu21-facts.md ("facts") or the seed build log (shared/seed/seed-log.txt), whose
// printed, preprocessed reference source shows the values the SDK headers expand to.
#ifndef IPU_STACK_IPU21_TILE_H
#define IPU_STACK_IPU21_TILE_H

#define WORKER_CONTEXTS 6                // facts §2.1, §16.2
#define CSR_W_WSR__CTXTID_M1__MASK 0x7   // facts §6: $WSR CTXTID_M1 [2:0]
#define CR_ZCWEI (1 << 2)                // facts §6: $CR bit 2 zeros the coefficient store
#define FP_CLR_ZAACC (1 << 3)            // facts §6: $FP_CLR bit 3 zeros the accumulators
#define FP_ICTL_ESR (1 << 19)            // facts §6: stochastic rounding enable
#define SYNC_ZONE_LOCAL 2                // seed log: `.set SYNC_COMPUTE_SET, (2)`

// FP input format and F8 scale CSRs (facts §6, §15.1; index from the seed log `put (49)`).
#define CSR_S_FP_INFMT__INDEX 49
#define CSR_S_FP_ISCL__INDEX (CSR_S_FP_INFMT__INDEX + 2)
#define FP_INFMT_F16 0
#define FP_INFMT_F143 3

// AMP phase flags of f16v4hihov4amp (seed log: `(48)` .. `(51)`; facts §16.3 TAMP_F16V4_E4_P*).
#define TAMP_F16V4_E4_P0 48
#define TAMP_F16V4_E4_P1 49
#define TAMP_F16V4_E4_P2 50
#define TAMP_F16V4_E4_P3 51

// The F8 phase flags (TAMP_F8V8_E4_P*) are not public (facts §16.5 gap 1). Assumed [I] to
// use the F16 encoding; an SDK header that defines them first takes precedence.
#ifndef TAMP_F8V8_E4_P0
#define TAMP_F8V8_E4_P0 TAMP_F16V4_E4_P0
#define TAMP_F8V8_E4_P1 TAMP_F16V4_E4_P1
#define TAMP_F8V8_E4_P2 TAMP_F16V4_E4_P2
#define TAMP_F8V8_E4_P3 TAMP_F16V4_E4_P3
#endif

#endif

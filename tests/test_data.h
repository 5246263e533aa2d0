// test_data.h - what the C tests share besides the harness: their pseudo-random numbers (a 32-bit
// LCG, so every test draws the same data on every platform and run) and a context per instruction
// set. Include after harness.h.
//
//   uint32_t seed = 7;
//   float x = rand_sym(&seed);                  // [-1, 1), 2^-23 apart
//   attn_ctx *ctx = test_ctx(ATTN_ISA_AVX2, 2);  // a failed create ends the case
#ifndef ATTN_TEST_DATA_H
#define ATTN_TEST_DATA_H

#include <stdint.h>
#include <string.h>

#include "attn.h"
#include "harness.h"

// The next state of the LCG (Numerical Recipes' constants); the high 24 bits are the ones drawn.
static inline uint32_t lcg(uint32_t *s) { return *s = *s * 1664525u + 1013904223u; }
// Uniform on [0, 1), a multiple of 2^-24 (exact in float and in double).
static inline float rand_unit(uint32_t *s) { return (float)(lcg(s) >> 8) * (1.0f / 16777216.0f); }
static inline double rand_unit_d(uint32_t *s) { return (double)(lcg(s) >> 8) / 16777216.0; }
// Uniform on [-1, 1), a multiple of 2^-23.
static inline float rand_sym(uint32_t *s) { return rand_unit(s) * 2.0f - 1.0f; }
// Uniform on 0 .. n - 1 (n > 0).
static inline int rand_pick(uint32_t *s, int n) { return (int)((lcg(s) >> 8) % (uint32_t)n); }

// A context on `isa` with `threads` threads and the other parameters at their defaults.
static inline attn_ctx *test_ctx(attn_isa isa, int threads) {
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.isa = isa;
    p.n_threads = threads;
    attn_ctx *ctx = NULL;
    if (attn_ctx_create(&p, &ctx) != ATTN_OK) FAIL("cannot create a %s context", attn_isa_name(isa));
    return ctx;
}

// The fused instruction sets this CPU runs (every value after ATTN_ISA_REF that
// attn_isa_supported accepts) into isas (room for 16); returns their count.
static inline int fused_isas(attn_isa *isas) {
    int n = 0;
    for (int i = ATTN_ISA_GENERIC; i < 64 && n < 16; i++)
        if (strcmp(attn_isa_name((attn_isa)i), "?") != 0 && attn_isa_supported((attn_isa)i)) isas[n++] = (attn_isa)i;
    return n;
}

#endif

// philox.h - the counter-based generator of ATTN_DROPOUT_RNG_PHILOX (attn.h) and its dropout rule,
// one definition for the CPU sources (C) and the CUDA kernels (C++), so both draw the same mask.
//
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
// 128-bit counter and a 64-bit key give four 32-bit words after ten rounds of two 32x32->64
// multiplications, the key bumped by Weyl constants between rounds. Checked against the
// published known-answer vectors (tests/test_philox.c).
//
// The dropout element (b, h, i, j) of a call with `seed` and `offset` (b the sequence, i the query
// row and j the key inside it, h the query head, H heads) takes word j % 4 of
//   philox(counter = {j / 4, i, b * H + h, offset}, key = {seed low 32 bits, seed high 32 bits})
// and is kept when that word is below the threshold floor((1 - p) * 2^32), so p = 0 keeps all and
// p = 1 none. Every element is a pure function of its coordinates: the same mask on every thread
// layout, tile shape and device.
#ifndef ATTN_PHILOX_H
#define ATTN_PHILOX_H

#include <stdint.h>

#if defined(__CUDACC__)
#define ATTN__PHILOX_FN __host__ __device__ __forceinline__
#else
#define ATTN__PHILOX_FN static inline
#endif

typedef struct attn__philox4 {
    uint32_t v[4];
} attn__philox4;

ATTN__PHILOX_FN void attn__philox_round(uint32_t c[4], uint32_t k0, uint32_t k1) {
    const uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
    const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0, hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c[0] = hi1 ^ c[1] ^ k0;
    c[1] = lo1;
    c[2] = hi0 ^ c[3] ^ k1;
    c[3] = lo0;
}

// Philox4x32-10 of counter {c0, c1, c2, c3} under key {k0, k1}.
ATTN__PHILOX_FN attn__philox4 attn__philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                                  uint32_t k1) {
    attn__philox4 r;
    r.v[0] = c0, r.v[1] = c1, r.v[2] = c2, r.v[3] = c3;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int round = 0; round < 10; round++) {
        if (round > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
        attn__philox_round(r.v, k0, k1);
    }
    return r;
}

// floor((1 - p) * 2^32) for p in [0, 1]: words below it are kept (2^32 keeps every word).
ATTN__PHILOX_FN uint64_t attn__philox_keep_threshold(double p) {
    const double t = (1.0 - p) * 4294967296.0;
    return t <= 0.0 ? 0 : (t >= 4294967296.0 ? (uint64_t)1 << 32 : (uint64_t)t);
}

// The words of keys 4 * (j / 4) .. 4 * (j / 4) + 3 of query row i of (b, h) = bh.
ATTN__PHILOX_FN attn__philox4 attn__philox_dropout_words(uint64_t seed, uint32_t offset, int64_t bh, int64_t i,
                                                         int64_t j) {
    return attn__philox4x32_10((uint32_t)(j >> 2), (uint32_t)i, (uint32_t)bh, offset, (uint32_t)seed,
                               (uint32_t)(seed >> 32));
}

// Word j % 4 of w, by selects rather than an index (a register array indexed at run time would go
// to local memory on a GPU).
ATTN__PHILOX_FN uint32_t attn__philox_word(const attn__philox4 *w, int64_t j) {
    return (j & 2) ? ((j & 1) ? w->v[3] : w->v[2]) : ((j & 1) ? w->v[1] : w->v[0]);
}

// Whether element (bh, i, j) is kept (one generator call; kernels that visit four consecutive keys
// call attn__philox_dropout_words once for the four).
ATTN__PHILOX_FN int attn__philox_dropout_kept(uint64_t seed, uint32_t offset, uint64_t threshold, int64_t bh,
                                              int64_t i, int64_t j) {
    const attn__philox4 w = attn__philox_dropout_words(seed, offset, bh, i, j);
    return (uint64_t)attn__philox_word(&w, j) < threshold;
}

// The words of n counters {c0, i0 + l, c2, c3} (l < n), lane by lane: the portable form of the
// kernel tables' philox_lanes (CPU only).
#if !defined(__CUDACC__)
static inline void attn__philox_lanes_scalar(uint32_t c0, int64_t i0, uint32_t c2, uint32_t c3, uint64_t seed, int n,
                                             uint32_t *w0, uint32_t *w1, uint32_t *w2, uint32_t *w3) {
    for (int l = 0; l < n; l++) {
        const attn__philox4 r = attn__philox4x32_10(c0, (uint32_t)(i0 + l), c2, c3, (uint32_t)seed, (uint32_t)(seed >> 32));
        w0[l] = r.v[0], w1[l] = r.v[1], w2[l] = r.v[2], w3[l] = r.v[3];
    }
}
#endif

#endif

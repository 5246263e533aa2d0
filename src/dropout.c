// dropout.c - preparing and applying the dropout mask of an SDPA call (dropout.h).
#include "dropout.h"

#include "cpu/cpu.h"

#include <string.h>

size_t attn__dropout_bits_bytes(const attn_sdpa_desc *d, const attn__sdpa_shape *sh) {
    if (!(d->dropout_p > 0.0) || d->dropout_rng == ATTN_DROPOUT_RNG_PHILOX) return 0;
    return (size_t)((sh->B * sh->H * sh->L * sh->S + 7) / 8);
}

void attn__dropout_init(attn__dropout *dr, const attn__kernels *kn, const attn_sdpa_desc *d, const attn__sdpa_shape *sh,
                        attn_generator *gen, uint8_t *bits) {
    memset(dr, 0, sizeof *dr);
    dr->kn = kn;
    if (!(d->dropout_p > 0.0)) return;
    const bool all = d->dropout_p >= 1.0;
    dr->on = true;
    dr->keep_scale = all ? 0.0f : 1.0f / (float)(1.0 - d->dropout_p);
    dr->H = sh->H, dr->L = sh->L, dr->S = sh->S, dr->seq0 = sh->seq0;
    if (d->dropout_rng == ATTN_DROPOUT_RNG_PHILOX) {
        dr->philox = true;
        dr->seed = d->dropout_seed, dr->offset = d->dropout_offset;
        dr->threshold = attn__philox_keep_threshold(d->dropout_p);
        return;
    }
    const int64_t n = sh->B * sh->H * sh->L * sh->S;
    const double keep_prob = 1.0 - d->dropout_p;
    memset(bits, 0, (size_t)((n + 7) / 8));
    if (!all)
        for (int64_t e = 0; e < n; e++)
            if (attn__dropout_keep(gen, keep_prob)) bits[e >> 3] |= (uint8_t)(1u << (e & 7));
    dr->bits = bits;
}

void attn__dropout_tile(const attn__dropout *dr, int64_t b, int64_t h, int64_t i0, int nq, int64_t j0, int nj,
                        float *t, int64_t ld, float kept_mul) {
    if (!dr->philox) {
        for (int j = 0; j < nj; j++)
            for (int i = 0; i < nq; i++) {
                float *x = t + (int64_t)j * ld + i;
                *x = attn__dropout_kept(dr, b, h, i0 + i, j0 + j) ? *x * kept_mul : 0.0f;
            }
        return;
    }
    const uint32_t bh = (uint32_t)((dr->seq0 + b) * dr->H + h);
    const uint32_t thr = (uint32_t)dr->threshold; // < 2^32: p > 0 here
    uint32_t w[4][ATTN_PHILOX_LANES];
    for (int64_t j = j0; j < j0 + nj;) { // one group of four keys (one counter) at a time
        const int64_t end = (j | 3) + 1 < j0 + nj ? (j | 3) + 1 : j0 + nj;
        for (int i = 0; i < nq; i += ATTN_PHILOX_LANES) {
            dr->kn->philox_lanes((uint32_t)(j >> 2), i0 + i, bh, dr->offset, dr->seed, w);
            const int n = nq - i < ATTN_PHILOX_LANES ? nq - i : ATTN_PHILOX_LANES;
            for (int64_t jj = j; jj < end; jj++) {
                const uint32_t *word = w[jj & 3];
                float *x = t + (jj - j0) * ld + i;
                for (int l = 0; l < n; l++) x[l] = word[l] < thr ? x[l] * kept_mul : 0.0f;
            }
        }
        j = end;
    }
}

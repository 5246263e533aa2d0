// ref_scores.h - one attention score of the scalar references (forward and backward), so both
// apply exactly the masking rules of attn.h.
#ifndef ATTN_REF_SCORES_H
#define ATTN_REF_SCORES_H

#include <math.h>

#include "internal.h"

// Additive contribution of one mask element: BOOL True blocks (-inf), F32 is added.
static inline double attn__ref_mask_term(const void *mask, attn_dtype dtype, int64_t off) {
    if (dtype == ATTN_DTYPE_BOOL) return ((const uint8_t *)mask)[off] ? -INFINITY : 0.0;
    return (double)((const float *)mask)[off];
}

// True when causal masking hides key j from query i.
static inline bool attn__ref_causal_hidden(attn_causal c, int64_t i, int64_t j, int64_t L, int64_t S) {
    if (c == ATTN_CAUSAL_TOP_LEFT) return j > i;
    if (c == ATTN_CAUSAL_BOTTOM_RIGHT) return j > i + (S - L);
    return false;
}

// The score s[b,h,i,j] in double: -inf when causal masking or any mask term blocks the key (the
// key's data and the other terms are then not read), else scale * q.k + the sum of the terms.
// q_row: (D) at q_stride[3]
static inline double attn__ref_score(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, const float *q_row,
                                     const float *k, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (attn__ref_causal_hidden(d->causal, i, j, sh->L, sh->S)) return -INFINITY;
    double bias = 0.0;
    if (d->mask != NULL) {
        const double t = attn__ref_mask_term(d->mask, d->mask_dtype, attn__offset4(d->mask_stride, b, h, i, j));
        if (t == -INFINITY) return -INFINITY;
        bias += t;
    }
    if (d->key_padding_mask != NULL) {
        const int64_t kpm_stride4[4] = {d->key_padding_mask_stride[0], d->key_padding_mask_stride[1], 0, 0};
        const double t =
            attn__ref_mask_term(d->key_padding_mask, d->key_padding_mask_dtype, attn__offset4(kpm_stride4, b, j, 0, 0));
        if (t == -INFINITY) return -INFINITY;
        bias += t;
    }
    // k_row: (D) at k_stride[3]
    const float *k_row = k + attn__offset4(d->k_stride, b, h / sh->group, j, 0);
    double dot = 0.0;
    for (int64_t t = 0; t < sh->D; t++) dot += (double)q_row[t * d->q_stride[3]] * (double)k_row[t * d->k_stride[3]];
    return (double)sh->scale * dot + bias;
}

#endif

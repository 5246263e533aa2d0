// ref_scores.h - one attention score of the scalar references (forward and backward), so both
// apply exactly the rules of attn.h: causal and local-window bounds, soft-capping, ALiBi, masks.
#ifndef ATTN_REF_SCORES_H
#define ATTN_REF_SCORES_H

#include <math.h>

#include "half.h"
#include "internal.h"

// Additive contribution of one mask element: BOOL True blocks (-inf), F32 is added.
static inline double attn__ref_mask_term(const void *mask, attn_dtype dtype, int64_t off) {
    if (dtype == ATTN_DTYPE_BOOL) return ((const uint8_t *)mask)[off] ? -INFINITY : 0.0;
    return (double)((const float *)mask)[off];
}

// True when the causal mask or the local window hides key j from query i.
static inline bool attn__ref_bounds_hide(const attn_sdpa_desc *d, int64_t i, int64_t j, int64_t L, int64_t S) {
    const int64_t off = d->causal == ATTN_CAUSAL_BOTTOM_RIGHT ? S - L : 0;
    if (d->causal != ATTN_CAUSAL_NONE && j > i + off) return true;
    if (d->use_window) {
        if (d->window_left >= 0 && j < i + off - d->window_left) return true;
        if (d->window_right >= 0 && j > i + off + d->window_right) return true;
    }
    return false;
}

// The score s[b,h,i,j] in double: -inf when the bounds or any mask term hide the key (the key's
// data and the other terms are then not read), else cap(scale * q.k) + ALiBi + the mask terms.
// *dcap receives d s / d (scale * q.k): 1, or 1 - tanh^2 with soft-capping.
// q: (B, H, L, D) at q_stride, of d->q_dtype; the row read is q[b, h, i, :]
static inline double attn__ref_score(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, const void *q,
                                     const void *k, int64_t b, int64_t h, int64_t i, int64_t j, double *dcap) {
    *dcap = 1.0;
    if (attn__ref_bounds_hide(d, i, j, sh->L, sh->S)) return -INFINITY;
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
    // k_row: (D) at k_stride[3], of d->kv_dtype; q_row: (D) at q_stride[3], of d->q_dtype
    const int64_t k_row = attn__offset4(d->k_stride, b, h / sh->group, j, 0);
    const int64_t q_row = attn__offset4(d->q_stride, b, h, i, 0);
    double dot = 0.0;
    for (int64_t t = 0; t < sh->D; t++)
        dot += (double)attn__kv_at(q, d->q_dtype, q_row + t * d->q_stride[3]) *
               (double)attn__kv_at(k, d->kv_dtype, k_row + t * d->k_stride[3]);
    double s = (double)sh->scale * dot;
    if (d->softcap > 0.0f) {
        const double c = (double)d->softcap, th = tanh(s / c);
        s = c * th;
        *dcap = 1.0 - th * th;
    }
    if (d->alibi_slopes != NULL) {
        const int64_t off = d->causal == ATTN_CAUSAL_BOTTOM_RIGHT ? sh->S - sh->L : 0;
        const int64_t dist = i + off - j;
        s -= (double)d->alibi_slopes[h] * (double)(dist < 0 ? -dist : dist);
    }
    return s + bias;
}

// The row's softmax with the head's sink z (attn.h, sinks; -inf: none) as one more term of the
// normaliser: given the keys' largest score max (-inf when every key is hidden), *top receives the
// shift and the return value the sink's term exp(z - top), to which the caller adds the keys'
// exp(s_j - top). A NaN or +inf z gives NaN.
static inline double attn__ref_sink_term(const attn_sdpa_desc *d, int64_t h, double max, double *top) {
    const double z = d->sinks != NULL ? (double)d->sinks[h] : -INFINITY;
    *top = z > max ? z : max;
    if (z == -INFINITY) return 0.0;
    return z == INFINITY ? NAN : exp(z - *top);
}

#endif

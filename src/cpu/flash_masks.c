// flash_masks.c - masking of score tiles, shared by the fused forward and backward: causal masks
// of both alignments, attention masks (bool or additive) and key padding masks, applied to a
// transposed score tile st (nj keys x brp queries) in the log2 domain. A hidden score becomes -inf
// whatever its value, so NaN in a key that a query cannot see never reaches that query.
#include <math.h>

#include "cpu/flash.h"

#define LOG2E 1.4426950408889634

int64_t attn__keys_visible_until(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t last_query) {
    // one past the last key any query up to last_query may see
    int64_t end = sh->S;
    if (d->causal == ATTN_CAUSAL_TOP_LEFT) end = last_query + 1;
    if (d->causal == ATTN_CAUSAL_BOTTOM_RIGHT) end = last_query + 1 + (sh->S - sh->L);
    if (end > sh->S) end = sh->S;
    return end < 0 ? 0 : end;
}

static inline float mask_value(const void *mask, attn_dtype dt, int64_t off) {
    if (dt == ATTN_DTYPE_BOOL) return ((const uint8_t *)mask)[off] ? -INFINITY : 0.0f;
    return ((const float *)mask)[off];
}

bool attn__mask_tile(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int brp, int64_t b, int64_t h, int64_t i0,
                     int nq, int64_t j0, int nj, float *st) {
    const int64_t L = sh->L, S = sh->S;
    const float log2e = (float)LOG2E;
    bool any_visible = false;
    for (int j = 0; j < nj; j++) {
        const int64_t jj = j0 + j;
        float kpm = 0.0f;
        if (d->key_padding_mask != NULL)
            kpm = mask_value(d->key_padding_mask, d->key_padding_mask_dtype,
                             b * d->key_padding_mask_stride[0] + jj * d->key_padding_mask_stride[1]);
        float *s = st + (int64_t)j * brp;
        for (int i = 0; i < nq; i++) {
            const int64_t ii = i0 + i;
            bool hidden = kpm == -INFINITY;
            if (d->causal == ATTN_CAUSAL_TOP_LEFT) hidden = hidden || jj > ii;
            if (d->causal == ATTN_CAUSAL_BOTTOM_RIGHT) hidden = hidden || jj > ii + (S - L);
            float bias = kpm;
            if (!hidden && d->mask != NULL) {
                const float mv = mask_value(d->mask, d->mask_dtype, attn__offset4(d->mask_stride, b, h, ii, jj));
                hidden = mv == -INFINITY;
                bias += mv;
            }
            if (hidden) {
                s[i] = -INFINITY;
            } else {
                if (bias != 0.0f) s[i] += bias * log2e;
                any_visible = true;
            }
        }
    }
    return any_visible;
}

void attn__causal_tile(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int brp, int64_t i0, int nq, int64_t j0,
                       int nj, float *st) {
    const int64_t shift = d->causal == ATTN_CAUSAL_BOTTOM_RIGHT ? sh->S - sh->L : 0;
    for (int j = 0; j < nj; j++) {
        int64_t hidden = j0 + j - shift - i0; // columns [0, hidden) cannot see this key
        if (hidden <= 0) continue;
        if (hidden > nq) hidden = nq;
        float *s = st + (int64_t)j * brp;
        for (int64_t i = 0; i < hidden; i++) s[i] = -INFINITY;
    }
}


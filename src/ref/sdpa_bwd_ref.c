// sdpa_bwd_ref.c - the scalar reference of the attention backward: the specification of
// attn_sdpa_bwd. One query row at a time, weights recomputed in double precision, gradients
// accumulated in double in the workspace and rounded once at the end (to float, then to grad_dtype).
// q, k, v, dout are read as the values their element types hold.
//
// For a row (b, h, i) with weights p (after masks, before dropout; the head's sink in the
// normaliser), kept keys z_j (dropout) and c = 1/(1-p_drop):
//   dp_j = z_j * c * (dout_i . v_j)      ds_j = p_j * (dp_j - sum_k p_k dp_k)
//   dq_i += scale * sum_j ds_j k_j       dk_j += scale * ds_j q_i       dv_j += z_j * c * p_j * dout_i
//   dmask[b, h, i, j] += ds_j            (the additive mask's gradient; broadcast dims sum)
// Masked keys have p_j = 0 and are never read; a fully masked row contributes nothing. The dropout
// draws are the forward's: two 32-bit draws per (b, h, i, j) from a copy of the generator state the
// forward started from.
#include <math.h>
#include <string.h>

#include "dropout.h"
#include "internal.h"
#include "ref/ref_scores.h"

// Double accumulators for dk (B, Hkv, S, D), dv (B, Hkv, S, Dv), dq of one row (D), and the
// row's scores (S).
typedef struct bwd_bufs {
    double *dk, *dv, *dq, *s, *dp, *dc;
    double *dmask; // (B, H, L, S) by the mask's element offsets, or NULL
} bwd_bufs;

static size_t mask_span(const attn_sdpa_desc *d, const attn__sdpa_shape *sh) {
    const int64_t n[4] = {sh->B, sh->H, sh->L, sh->S};
    int64_t extent = 0;
    attn__view_extent(n, d->mask_stride, &extent);
    return (size_t)extent + 1;
}

static size_t layout(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, bool want_dmask, char *base, bwd_bufs *b) {
    attn__arena a = {.base = base};
    const size_t dd = sizeof(double);
    b->dk = attn__arena_take(&a, (size_t)(sh->B * sh->Hkv * sh->S * sh->D) * dd);
    b->dv = attn__arena_take(&a, (size_t)(sh->B * sh->Hkv * sh->S * sh->Dv) * dd);
    b->dq = attn__arena_take(&a, (size_t)sh->D * dd);
    b->s = attn__arena_take(&a, (size_t)sh->S * dd);
    b->dp = attn__arena_take(&a, (size_t)sh->S * dd);
    b->dc = attn__arena_take(&a, (size_t)sh->S * dd); // d s / d (scale q.k) per key (soft-capping)
    b->dmask = want_dmask ? attn__arena_take(&a, mask_span(d, sh) * dd) : NULL;
    return a.used;
}

size_t attn__sdpa_bwd_ref_workspace(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, bool want_dmask) {
    bwd_bufs b;
    return layout(d, sh, want_dmask, NULL, &b);
}

void attn__sdpa_bwd_ref(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, const attn_generator *dropout_state,
                        const void *q, const void *k, const void *v, const void *dout, void *dq, void *dk, void *dv,
                        float *dmask, void *ws) {
    const int64_t B = sh->B, H = sh->H, L = sh->L, S = sh->S, D = sh->D, Dv = sh->Dv;
    bwd_bufs w;
    layout(d, sh, dmask != NULL, ws, &w);
    memset(w.dk, 0, (size_t)(B * sh->Hkv * S * D) * sizeof(double));
    memset(w.dv, 0, (size_t)(B * sh->Hkv * S * Dv) * sizeof(double));
    if (w.dmask != NULL) memset(w.dmask, 0, mask_span(d, sh) * sizeof(double));
    attn_generator gen;
    const bool dropout = d->dropout_p > 0.0, drop_all = d->dropout_p >= 1.0;
    if (attn__dropout_needs_state(d)) gen = *dropout_state;
    const uint64_t threshold = attn__philox_keep_threshold(d->dropout_p);
    const double keep_scale = drop_all ? 0.0 : (double)(1.0f / (float)(1.0 - d->dropout_p));
    const double scale = (double)sh->scale;

    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t hk = h / sh->group;
            double *dk_head = w.dk + (b * sh->Hkv + hk) * S * D, *dv_head = w.dv + (b * sh->Hkv + hk) * S * Dv;
            for (int64_t i = 0; i < L; i++) {
                // q_row: (D) at q_stride[3] of q_dtype; do_row: (Dv) at o_stride[3] of out_dtype
                const int64_t q_row = attn__offset4(d->q_stride, b, h, i, 0);
                const int64_t do_row = attn__offset4(d->o_stride, b, h, i, 0);
                // the forward's weights of this row (w.s holds the scores, -inf where hidden)
                double max = -INFINITY;
                bool has_nan = false;
                for (int64_t j = 0; j < S; j++) {
                    w.s[j] = attn__ref_score(d, sh, q, k, b, h, i, j, &w.dc[j]);
                    if (w.s[j] == -INFINITY) continue;
                    if (isnan(w.s[j])) has_nan = true;
                    else if (w.s[j] > max) max = w.s[j];
                }
                double top, sum = attn__ref_sink_term(d, h, max, &top); // the head's sink, or 0
                if (isnan(sum)) has_nan = true;
                if (!has_nan && top != -INFINITY) {
                    for (int64_t j = 0; j < S; j++) sum += w.s[j] == -INFINITY ? 0.0 : exp(w.s[j] - top);
                }
                // p_j into w.s; dp_j into w.dp; the draws of the row in key order
                double pdp = 0.0;
                for (int64_t j = 0; j < S; j++) {
                    const bool keep = !dropout || attn__dropout_draw(d, sh, &gen, threshold, b, h, i, j);
                    double p;
                    if (w.s[j] == -INFINITY) p = 0.0; // hidden: no weight, even in a row holding NaN
                    else if (has_nan) p = NAN;
                    else p = exp(w.s[j] - top) / sum;
                    w.s[j] = p;
                    w.dp[j] = 0.0;
                    if (p == 0.0) continue; // a key without weight is not read
                    const double c = dropout ? (keep ? keep_scale : 0.0) : 1.0;
                    if (c == 0.0) continue;
                    const int64_t v_row = attn__offset4(d->v_stride, b, hk, j, 0);
                    double dot = 0.0;
                    for (int64_t t = 0; t < Dv; t++)
                        dot += (double)attn__kv_at(dout, d->out_dtype, do_row + t * d->o_stride[3]) *
                               attn__kv_at(v, d->kv_dtype, v_row + t * d->v_stride[3]);
                    w.dp[j] = c * dot;
                    pdp += p * w.dp[j];
                    for (int64_t t = 0; t < Dv; t++)
                        dv_head[j * Dv + t] += c * p * (double)attn__kv_at(dout, d->out_dtype, do_row + t * d->o_stride[3]);
                }
                for (int64_t t = 0; t < D; t++) w.dq[t] = 0.0;
                for (int64_t j = 0; j < S; j++) {
                    if (w.s[j] == 0.0) continue;
                    const double ds = w.s[j] * (w.dp[j] - pdp);
                    if (w.dmask != NULL) w.dmask[attn__offset4(d->mask_stride, b, h, i, j)] += ds;
                    const double dsq = scale * ds * w.dc[j]; // through the soft cap to q.k
                    const int64_t k_row = attn__offset4(d->k_stride, b, hk, j, 0);
                    for (int64_t t = 0; t < D; t++) {
                        w.dq[t] += dsq * (double)attn__kv_at(k, d->kv_dtype, k_row + t * d->k_stride[3]);
                        dk_head[j * D + t] += dsq * (double)attn__kv_at(q, d->q_dtype, q_row + t * d->q_stride[3]);
                    }
                }
                const int64_t dq_row = attn__offset4(d->q_stride, b, h, i, 0);
                for (int64_t t = 0; t < D; t++) attn__elem_set(dq, d->grad_dtype, dq_row + t * d->q_stride[3], (float)w.dq[t]);
            }
        }
    for (int64_t b = 0; b < B; b++)
        for (int64_t hk = 0; hk < sh->Hkv; hk++)
            for (int64_t j = 0; j < S; j++) {
                const int64_t dk_row = attn__offset4(d->k_stride, b, hk, j, 0);
                const int64_t dv_row = attn__offset4(d->v_stride, b, hk, j, 0);
                const double *ak = w.dk + ((b * sh->Hkv + hk) * S + j) * D, *av = w.dv + ((b * sh->Hkv + hk) * S + j) * Dv;
                for (int64_t t = 0; t < D; t++) attn__elem_set(dk, d->grad_dtype, dk_row + t * d->k_stride[3], (float)ak[t]);
                for (int64_t t = 0; t < Dv; t++) attn__elem_set(dv, d->grad_dtype, dv_row + t * d->v_stride[3], (float)av[t]);
            }
    if (dmask != NULL) {
        const size_t span = mask_span(d, sh);
        for (size_t e = 0; e < span; e++) dmask[e] = (float)w.dmask[e];
    }
}

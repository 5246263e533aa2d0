// sdpa_ref.c - the scalar reference of scaled dot-product attention: the specification.
//
// Plain loops over (b, h, i), one query row at a time, with the whole score row materialised in
// double precision. q, k, v are read as the values their element types hold (float16 and bfloat16
// converted exactly); out is rounded to its type at the end (through float). No SIMD, no threads, no tiling. Every faster kernel is tested against this
// function; it is tested against PyTorch. It does no validation: attn__sdpa_check has run.
//
// Per row (see attn.h): s_j = scale * q.k_j + mask terms, p = softmax(s) (with the head's sink
// as one more term of the normaliser; a fully masked row gives p = 0 and lse = -inf, or the
// sink), dropout draws two 32-bit numbers per element in (b, h, i, j) order exactly like
// F.dropout on the (B*H, L, S) weights (or the element's Philox word), out = p' V.
#include <math.h>
#include <string.h>

#include "dropout.h"
#include "internal.h"
#include "ref/ref_scores.h"

size_t attn__sdpa_ref_workspace(const attn__sdpa_shape *sh) {
    attn__arena a = {0};
    attn__arena_take(&a, (size_t)sh->S * sizeof(double)); // scores of one row
    attn__arena_take(&a, (size_t)sh->S * sizeof(float));  // weights of one row
    return a.used;
}

void attn__sdpa_fwd_ref(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, attn_generator *gen, const void *q,
                        const void *k, const void *v, void *out, float *lse, float *weights, void *ws) {
    const int64_t B = sh->B, H = sh->H, L = sh->L, S = sh->S, Dv = sh->Dv;
    attn__arena arena = {.base = ws};
    double *s = attn__arena_take(&arena, (size_t)S * sizeof(double)); // s: (S) scores of the row
    float *p = attn__arena_take(&arena, (size_t)S * sizeof(float));   // p: (S) weights of the row
    const bool dropout = d->dropout_p > 0.0;
    const bool drop_all = d->dropout_p >= 1.0;
    const float keep_scale = drop_all ? 0.0f : 1.0f / (float)(1.0 - d->dropout_p);
    const uint64_t threshold = attn__philox_keep_threshold(d->dropout_p);

    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < H; h++) {
            const int64_t hk = h / sh->group;
            for (int64_t i = 0; i < L; i++) {
                double max = -INFINITY;
                bool has_nan = false;
                for (int64_t j = 0; j < S; j++) {
                    // Masks first (attn__ref_score): NaN or inf in a key that a row cannot see
                    // does not reach that row.
                    double dcap;
                    const double sj = attn__ref_score(d, sh, q, k, b, h, i, j, &dcap);
                    s[j] = sj;
                    if (isnan(sj))
                        has_nan = true;
                    else if (sj > max)
                        max = sj;
                }
                double row_lse, top;
                double sum = attn__ref_sink_term(d, h, max, &top); // the sink's term, or 0
                if (has_nan || isnan(sum)) { // NaN in the inputs (or the sink) poisons this row only
                    for (int64_t j = 0; j < S; j++) p[j] = NAN;
                    row_lse = NAN;
                } else if (top == -INFINITY) { // fully masked row without a sink: zeros, never NaN
                    for (int64_t j = 0; j < S; j++) p[j] = 0.0f;
                    row_lse = -INFINITY;
                } else {
                    for (int64_t j = 0; j < S; j++) {
                        s[j] = exp(s[j] - top);
                        sum += s[j];
                    }
                    for (int64_t j = 0; j < S; j++) p[j] = (float)(s[j] / sum);
                    row_lse = top + log(sum);
                }
                if (lse != NULL) lse[(b * H + h) * L + i] = (float)row_lse;
                if (dropout) { // F.dropout: bernoulli(1-p) per element, kept values * fl(1/fl(1-p))
                    for (int64_t j = 0; j < S; j++) {
                        const bool keep = attn__dropout_draw(d, sh, gen, threshold, b, h, i, j);
                        p[j] *= keep ? keep_scale : 0.0f; // F.dropout multiplies: a NaN stays NaN
                    }
                }
                if (d->weights_mode == ATTN_WEIGHTS_PER_HEAD) {
                    memcpy(weights + ((b * H + h) * L + i) * S, p, (size_t)S * sizeof(float));
                } else if (d->weights_mode == ATTN_WEIGHTS_AVERAGE) { // ((h0 + h1) + ...) / H in float
                    float *w = weights + (b * L + i) * S;
                    for (int64_t j = 0; j < S; j++) w[j] = h == 0 ? p[j] : w[j] + p[j];
                    if (h == H - 1)
                        for (int64_t j = 0; j < S; j++) w[j] /= (float)H;
                }
                // out_row: (Dv) at o_stride[3], of d->out_dtype
                const int64_t out_row = attn__offset4(d->o_stride, b, h, i, 0);
                for (int64_t t = 0; t < Dv; t++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < S; j++) {
                        if (p[j] == 0.0f) continue; // keys with no weight (masked, dropped) are not read
                        acc += (double)p[j] * (double)attn__kv_at(v, d->kv_dtype, attn__offset4(d->v_stride, b, hk, j, t));
                    }
                    attn__elem_set(out, d->out_dtype, out_row + t * d->o_stride[3], (float)acc);
                }
            }
        }
    }
}

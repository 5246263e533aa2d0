// sinks.c - attention sinks (attn.h, attn_sdpa_desc.sinks): one logit per query head that joins
// each row's softmax normaliser without a value. The fused kernels run their rows as without a
// sink and let attn__softmax_finish add it once a row's keys are all summed; the references add it
// to their double sums (ref/ref_scores.h); the sinks' gradient is a pass over out, dout and lse.
#include <float.h>
#include <math.h>

#include "half.h"
#include "internal.h"

#define LN2 0.6931471805599453
#define LOG2E 1.4426950408889634

float attn__softmax_finish(float m, float l, float keep_scale, const float *sinks, int64_t h, float *lse) {
    const float z = sinks != NULL ? sinks[h] : -INFINITY;
    if (z == -INFINITY) { // no sink: the row as the keys leave it
        if (lse != NULL) *lse = l > 0.0f ? (float)(((double)m + log2((double)l)) * LN2) : (l == 0.0f ? -INFINITY : l);
        return l > 0.0f ? keep_scale / l : (l == 0.0f ? 0.0f : l);
    }
    // the sink as one more term 2^(z2 - top) of the sum; a NaN or +inf z (or a NaN l) makes it NaN.
    // z2 is clamped to float's range as the kernels' log2-domain scores are (attn.h, the note on
    // float arithmetic), so the lse stays within about +-FLT_MAX ln 2 as theirs does.
    double z2 = (double)z * LOG2E;
    if (isfinite(z2)) z2 = z2 > FLT_MAX ? FLT_MAX : z2 < -FLT_MAX ? -FLT_MAX : z2;
    const double mk = l == 0.0f ? -INFINITY : (double)m; // no key seen: the sink alone
    const double top = z2 > mk ? z2 : mk;
    const double keys = l == 0.0f ? 0.0 : exp2(mk - top);
    const double sum = (double)l * keys + exp2(z2 - top);
    if (lse != NULL) *lse = (float)((top + log2(sum)) * LN2);
    return (float)((double)keep_scale * keys / sum);
}

// The (B, H, L) rows of a checked descriptor, or of a packed batch as one sequence of all its
// queries (varlen: out at the desc's strides with stride[0] unused, lse (H, total_q)).
attn_status attn_sdpa_sinks_bwd(attn_ctx *ctx, const attn_sdpa_desc *desc, const int64_t *cu_seqlens_q,
                                const int64_t *cu_seqlens_k, const void *out, const void *dout, const float *lse,
                                float *dsinks) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (desc == NULL || out == NULL || dout == NULL || lse == NULL || dsinks == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa_sinks_bwd: desc, out, dout, lse and dsinks must not be NULL");
    if ((cu_seqlens_q == NULL) != (cu_seqlens_k == NULL))
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG,
                          "sdpa_sinks_bwd: cu_seqlens_q and cu_seqlens_k are both NULL (padded) or both given (packed)");
    attn_sdpa_desc run = *desc;
    int64_t B, H, L, Dv;
    if (cu_seqlens_q == NULL) {
        attn__sdpa_shape sh;
        ATTN_RETURN_IF_ERR(attn__sdpa_prepare(ctx, desc, &sh, &run));
        B = sh.B, H = sh.H, L = sh.L, Dv = sh.Dv;
    } else {
        ATTN_RETURN_IF_ERR(attn_sdpa_varlen_desc_check(ctx, desc, cu_seqlens_q, cu_seqlens_k));
        B = 1, H = desc->n_heads, L = cu_seqlens_q[desc->batch];
        Dv = desc->head_dim_v == 0 ? desc->head_dim : desc->head_dim_v;
        run.o_stride[0] = 0;
    }
    if (desc->sinks == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa_sinks_bwd: desc->sinks is NULL (no sinks to differentiate)");
    for (int64_t h = 0; h < H; h++) {
        const double z = (double)desc->sinks[h];
        double acc = 0.0;
        for (int64_t b = 0; b < B && z != -INFINITY; b++)
            for (int64_t i = 0; i < L; i++) {
                const double p = exp(z - (double)lse[(b * H + h) * L + i]); // the sink's weight in the row
                if (p == 0.0) continue;
                // row: (Dv) of out and dout at o_stride[3], of out_dtype
                const int64_t row = attn__offset4(run.o_stride, b, h, i, 0);
                double dot = 0.0;
                for (int64_t t = 0; t < Dv; t++) {
                    const int64_t o = row + t * run.o_stride[3];
                    dot += (double)attn__kv_at(dout, run.out_dtype, o) * (double)attn__kv_at(out, run.out_dtype, o);
                }
                acc -= p * dot;
            }
        dsinks[h] = (float)acc;
    }
    return ATTN_OK;
}

/*
 * float_range.c - soft caps and ALiBi slopes that attn.h accepts but the fused kernels turn into
 * NaN, because they compute softcap * log2(e), its inverse and slope * log2(e) in float
 * (ATTN_FUZZ_SKIP=softcap-range, alibi-range): a cap above FLT_MAX / log2(e) (~2.36e38) or below
 * 1 / (FLT_MAX log2(e)) (~2.0e-39, where a score of exactly 0 gives 0 * inf), and a slope above
 * FLT_MAX / log2(e) (the diagonal gives inf * 0). The reference stays finite.
 *
 *   cc -std=c11 -Iinclude fuzz/findings/float_range.c build/libattn.a -lm -lpthread
 * (plus the BLAS library, e.g. -lopenblas, when the build found one)
 */
#include <float.h>
#include <stdio.h>

#include "attn.h"

static void run(attn_isa isa, float softcap, float slope) {
    attn_ctx_params cp;
    attn_ctx_params_init(&cp);
    cp.isa = isa;
    attn_ctx *ctx;
    if (attn_ctx_create(&cp, &ctx) != ATTN_OK) return;
    /* one query, two keys, D = Dv = 1 */
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = 1, d.n_heads = 1, d.len_q = 1, d.len_kv = 2, d.head_dim = 1;
    attn_layout_strides(ATTN_LAYOUT_BHLD, 1, 1, 1, 1, d.q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, 1, 1, 2, 1, d.k_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, 1, 1, 2, 1, d.v_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, 1, 1, 1, 1, d.o_stride);
    d.softcap = softcap;
    float slopes[1] = {slope};
    if (slope != 0.0f) d.alibi_slopes = slopes;
    float q[1] = {0.5f}, k[2] = {0.0f, 1.0f}, v[2] = {1.0f, 2.0f}, out[1], lse[1];
    float dout[1] = {1.0f}, dq[1], dk[2], dv[2];
    const attn_status st = attn_sdpa_fwd(ctx, &d, q, k, v, out, lse, NULL);
    const attn_status st2 = attn_sdpa_bwd(ctx, &d, q, k, v, out, dout, lse, NULL, dq, dk, dv, NULL);
    printf("softcap %-12g slope %-8g %-8s status %d/%d  out %-10g lse %-10g dq %-10g dk {%g, %g}\n", (double)softcap,
           (double)slope, attn_isa_name(isa), (int)st, (int)st2, (double)out[0], (double)lse[0], (double)dq[0],
           (double)dk[0], (double)dk[1]);
    attn_ctx_free(ctx);
}

int main(void) {
    const float caps[] = {FLT_MAX, 3e38f, 1e-39f, FLT_TRUE_MIN};
    for (int c = 0; c < 4; c++)
        for (attn_isa isa = ATTN_ISA_REF; isa <= ATTN_ISA_AVX512; isa++) run(isa, caps[c], 0.0f);
    for (attn_isa isa = ATTN_ISA_REF; isa <= ATTN_ISA_AVX512; isa++) run(isa, 0.0f, 3e38f);
    return 0;
}

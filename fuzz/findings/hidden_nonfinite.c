/*
 * hidden_nonfinite.c - the fused backward lets NaN or inf in a query row's dout (or q) reach the
 * gradients of keys that row cannot see (ATTN_FUZZ_SKIP=bwd-hidden-nonfinite): the zero weights of
 * hidden pairs are multiplied by dout and q (0 * NaN, 0 * inf), where the reference never reads a
 * key without weight. attn.h: hidden keys are not reached by data a row cannot see, and "Fully
 * masked rows contribute nothing".
 *   case 1: L = S = 2, top-left causal (query 0 sees key 0 only), dout[0] = NaN: the reference's
 *           dk[1] and dv[1] are finite (only query 1 sees key 1); the fused kernels give NaN.
 *   case 2: L = 2, S = 1, bottom-right causal (query 0 sees no key), dout[0] = NaN: the reference
 *           gives dq = {0, 0}, dk = 0, dv = 1; the fused kernels NaN in dq[0], dk and dv.
 *   case 3: as case 2 with finite inputs only, v = 3e37 and dout[0] = 100: dout[0] * v overflows
 *           float for the hidden pair, and 0 * inf reaches dq[0] and dk.
 *
 *   cc -std=c11 -Iinclude fuzz/findings/hidden_nonfinite.c build/libattn.a -lm -lpthread
 * (plus the BLAS library, e.g. -lopenblas, when the build found one)
 */
#include <math.h>
#include <stdio.h>

#include "attn.h"

static void run(attn_isa isa, int64_t L, int64_t S, attn_causal causal, float dout0, float v0) {
    attn_ctx_params cp;
    attn_ctx_params_init(&cp);
    cp.isa = isa;
    attn_ctx *ctx;
    if (attn_ctx_create(&cp, &ctx) != ATTN_OK) return;
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = 1, d.n_heads = 1, d.len_q = L, d.len_kv = S, d.head_dim = 1;
    attn_layout_strides(ATTN_LAYOUT_BHLD, 1, 1, L, 1, d.q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, 1, 1, S, 1, d.k_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, 1, 1, S, 1, d.v_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, 1, 1, L, 1, d.o_stride);
    d.causal = causal;
    float q[2] = {0.5f, 0.25f}, k[2] = {1.0f, -1.0f}, v[2] = {v0, 3.0f}, out[2], lse[2];
    float dout[2] = {dout0, 1.0f}, dq[2], dk[2] = {0.0f, 0.0f}, dv[2] = {0.0f, 0.0f};
    const attn_status st = attn_sdpa_fwd(ctx, &d, q, k, v, out, lse, NULL);
    const attn_status st2 = attn_sdpa_bwd(ctx, &d, q, k, v, out, dout, lse, NULL, dq, dk, dv, NULL);
    printf("L=%lld S=%lld %-8s status %d/%d  dq = {%g, %g}  dk = {%g, %g}  dv = {%g, %g}\n", (long long)L,
           (long long)S, attn_isa_name(isa), (int)st, (int)st2, (double)dq[0], (double)dq[1], (double)dk[0],
           (double)(S > 1 ? dk[1] : 0.0f), (double)dv[0], (double)(S > 1 ? dv[1] : 0.0f));
    attn_ctx_free(ctx);
}

int main(void) {
    for (attn_isa isa = ATTN_ISA_REF; isa <= ATTN_ISA_AVX512; isa++) {
        run(isa, 2, 2, ATTN_CAUSAL_TOP_LEFT, NAN, 2.0f);        /* case 1 */
        run(isa, 2, 1, ATTN_CAUSAL_BOTTOM_RIGHT, NAN, 2.0f);    /* case 2 */
        run(isa, 2, 1, ATTN_CAUSAL_BOTTOM_RIGHT, 100.0f, 3e37f); /* case 3 */
    }
    return 0;
}

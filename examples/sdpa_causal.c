// sdpa_causal.c - causal scaled dot-product attention on a (B, L, H*D) batch-first tensor, read in
// place through strides, with the per-row log-sum-exp that a backward pass would need.
#include <stdio.h>
#include <stdlib.h>

#include "attn.h"

int main(void) {
    enum { B = 2, H = 4, L = 5, D = 8 };
    attn_ctx *ctx;
    attn_ctx_params params;
    attn_ctx_params_init(&params);
    params.seed = 42; // the context's generator: torch.manual_seed(42)
    if (attn_ctx_create(&params, &ctx) != ATTN_OK) return 1;

    // q, k, v: (B, L, H*D) as a batch_first projection would produce them; torch.randn each
    static float q[B * L * H * D], k[B * L * H * D], v[B * L * H * D], out[B * L * H * D], lse[B * H * L];
    attn_generator *g = attn_ctx_generator(ctx);
    attn_rand_normal(g, q, B * L * H * D, 0.0, 1.0);
    attn_rand_normal(g, k, B * L * H * D, 0.0, 1.0);
    attn_rand_normal(g, v, B * L * H * D, 0.0, 1.0);

    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = B, d.n_heads = H, d.len_q = L, d.len_kv = L, d.head_dim = D;
    d.causal = ATTN_CAUSAL_TOP_LEFT; // query i sees keys 0..i
    attn_layout_strides(ATTN_LAYOUT_BLHD, B, H, L, D, d.q_stride);
    attn_layout_strides(ATTN_LAYOUT_BLHD, B, H, L, D, d.k_stride);
    attn_layout_strides(ATTN_LAYOUT_BLHD, B, H, L, D, d.v_stride);
    attn_layout_strides(ATTN_LAYOUT_BLHD, B, H, L, D, d.o_stride);

    attn_status st = attn_sdpa_fwd(ctx, &d, q, k, v, out, lse, NULL);
    if (st != ATTN_OK) {
        fprintf(stderr, "sdpa: %s\n", attn_ctx_last_error(ctx));
        attn_ctx_free(ctx);
        return 1;
    }
    // The first query of every head sees only key 0: its output is v[0] of that head exactly.
    int exact = 1;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < D; t++) exact &= out[b * L * H * D + h * D + t] == v[b * L * H * D + h * D + t];
    printf("first query equals the first value in every head: %s\n", exact ? "yes" : "no");
    printf("log-sum-exp of batch 0, head 0: ");
    for (int i = 0; i < L; i++) printf("%.4f ", lse[i]);
    printf("\n");
    attn_ctx_free(ctx);
    return exact ? 0 : 1;
}

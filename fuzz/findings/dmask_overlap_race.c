/*
 * dmask_overlap_race.c - attn_sdpa_bwd's mask gradient for a mask view whose cells share elements
 * through non-zero strides (here mask_stride = {0, 1, 1, 1}: element h + i + j) depends on the
 * thread count and changes from run to run: the fused backward groups the work items of pass 2 so
 * that only dimensions of stride 0 are summed by one item, so items on different threads add into
 * the same dmask elements at once (a data race; updates are lost). attn.h accepts any mask strides
 * and promises identical results for every thread count. Found by fuzz_bwd_diff.
 *
 *   cc -std=c11 -Iinclude fuzz/findings/dmask_overlap_race.c build/libattn.a -lm -lpthread
 * (plus the BLAS library, e.g. -lopenblas, when the build found one)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"

enum { H = 8, L = 96, S = 96, D = 8, M = H + L + S }; /* M: elements the mask view spans */

static int grad(int threads, const float *q, const float *k, const float *v, const float *mask, const float *dout,
                float *dmask) {
    attn_ctx_params cp;
    attn_ctx_params_init(&cp);
    cp.isa = attn_isa_supported(ATTN_ISA_AVX2) ? ATTN_ISA_AVX2 : ATTN_ISA_GENERIC;
    cp.n_threads = threads;
    attn_ctx *ctx;
    if (attn_ctx_create(&cp, &ctx) != ATTN_OK) return 1;
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = 1, d.n_heads = H, d.len_q = L, d.len_kv = S, d.head_dim = D;
    attn_layout_strides(ATTN_LAYOUT_BHLD, 1, H, L, D, d.q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, 1, H, S, D, d.k_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, 1, H, S, D, d.v_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, 1, H, L, D, d.o_stride);
    d.mask = mask, d.mask_dtype = ATTN_DTYPE_F32;
    d.mask_stride[0] = 0, d.mask_stride[1] = 1, d.mask_stride[2] = 1, d.mask_stride[3] = 1;
    float *out = malloc(sizeof(float) * H * L * D), *lse = malloc(sizeof(float) * H * L);
    float *dq = malloc(sizeof(float) * H * L * D), *dk = malloc(sizeof(float) * H * S * D);
    float *dv = malloc(sizeof(float) * H * S * D);
    attn_status st = attn_sdpa_fwd(ctx, &d, q, k, v, out, lse, NULL);
    if (st == ATTN_OK) st = attn_sdpa_bwd(ctx, &d, q, k, v, out, dout, lse, NULL, dq, dk, dv, dmask);
    free(out), free(lse), free(dq), free(dk), free(dv);
    attn_ctx_free(ctx);
    return st != ATTN_OK;
}

static float uniform(void) { return (float)((double)rand() / RAND_MAX); }

int main(void) {
    static float q[H * L * D], k[H * S * D], v[H * S * D], dout[H * L * D], mask[M], ref[M], got[M];
    srand(1);
    for (int i = 0; i < H * L * D; i++) q[i] = uniform() - 0.5f, dout[i] = uniform();
    for (int i = 0; i < H * S * D; i++) k[i] = uniform() - 0.5f, v[i] = uniform();
    for (int i = 0; i < M; i++) mask[i] = uniform();
    if (grad(1, q, k, v, mask, dout, ref)) return 1;
    int differ = 0;
    for (int run = 0; run < 20; run++) {
        if (grad(4, q, k, v, mask, dout, got)) return 1;
        differ += memcmp(ref, got, sizeof ref) != 0;
    }
    printf("dmask with 4 threads differs from 1 thread in %d of 20 runs\n", differ);
    return differ != 0;
}

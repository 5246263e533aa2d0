// test_dropout.c - the counter-based dropout of ATTN_DROPOUT_RNG_PHILOX: the generator against the
// published Philox4x32-10 known-answer vectors, the keep rate and the scaling of kept weights
// (binomial bounds, through the weights output), the mask attn.h defines element by element, the
// fused forward against the reference on every ISA with identical bits for 1, 2 and 3 threads, a
// packed batch equal to the plain batch of the same sequences, the context's generator left alone,
// no (B, H, L, S) mask in the scratch, and the argument checks. (The backward with this mask is
// tested against finite differences and the reference in test_grad.c.)
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"
#include "test_data.h"
#include "philox.h"


// Random123's known-answer vectors for Philox4x32-10 (counter, key -> result).
static void test_known_answers(void) {
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
         0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
         0x24126ea1},
    };
    for (int c = 0; c < 3; c++) {
        const uint32_t *v = kat[c];
        const attn__philox4 r = attn__philox4x32_10(v[0], v[1], v[2], v[3], v[4], v[5]);
        for (int w = 0; w < 4; w++) ASSERT_EQ_U64(r.v[w], v[6 + w]);
    }
    ASSERT_EQ_U64(attn__philox_keep_threshold(0.0), (uint64_t)1 << 32);
    ASSERT_EQ_U64(attn__philox_keep_threshold(1.0), 0);
    ASSERT_EQ_U64(attn__philox_keep_threshold(0.5), (uint64_t)1 << 31);
    ASSERT_EQ_U64(attn__philox_keep_threshold(0.25), (uint64_t)3 << 30);
}

typedef struct shape {
    int64_t B, H, L, S, D;
} shape;

static void fill_desc(attn_sdpa_desc *d, const shape *s, double p, uint64_t seed, uint32_t offset) {
    attn_sdpa_desc_init(d);
    d->batch = s->B, d->n_heads = s->H, d->len_q = s->L, d->len_kv = s->S, d->head_dim = s->D;
    attn_layout_strides(ATTN_LAYOUT_BHLD, s->B, s->H, s->L, s->D, d->q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, s->B, s->H, s->S, s->D, d->k_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, s->B, s->H, s->S, s->D, d->v_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, s->B, s->H, s->L, s->D, d->o_stride);
    d->dropout_p = p, d->dropout_rng = ATTN_DROPOUT_RNG_PHILOX, d->dropout_seed = seed, d->dropout_offset = offset;
}

// Through the weights output (q = 0: every weight 1/S before dropout): each weight is 0 where the
// element is dropped and float(1/S) * float(1/float(1 - p)) where kept, the drops are the elements
// attn.h names, and the keep rate lies within 5 standard deviations of 1 - p.
static void test_mask_and_keep_rate(void) {
    const shape s = {2, 3, 40, 250, 8};
    const int64_t nq = s.B * s.H * s.L * s.D, nk = s.B * s.H * s.S * s.D, nw = s.B * s.H * s.L * s.S;
    float *q = calloc((size_t)nq, 4), *k = malloc((size_t)nk * 4), *v = malloc((size_t)nk * 4);
    float *out = malloc((size_t)nq * 4), *w = malloc((size_t)nw * 4);
    uint32_t seed = 5;
    for (int64_t e = 0; e < nk; e++) k[e] = rand_sym(&seed), v[e] = rand_sym(&seed);
    attn_ctx *ctx = test_ctx(ATTN_ISA_REF, 1);
    const double ps[4] = {0.1, 0.5, 0.9, 1.0};
    for (int c = 0; c < 4; c++) {
        attn_sdpa_desc d;
        fill_desc(&d, &s, ps[c], 0x123456789abcdefull, 7u + (uint32_t)c);
        d.weights_mode = ATTN_WEIGHTS_PER_HEAD;
        ASSERT_OK(attn_sdpa_fwd(ctx, &d, q, k, v, out, NULL, w));
        const float kept_w = ps[c] < 1.0 ? (1.0f / (float)s.S) * (1.0f / (float)(1.0 - ps[c])) : 0.0f;
        const uint64_t thr = attn__philox_keep_threshold(ps[c]);
        int64_t kept = 0;
        for (int64_t e = 0; e < nw; e++) {
            const int64_t j = e % s.S, i = e / s.S % s.L, bh = e / (s.S * s.L);
            const bool want = attn__philox_dropout_kept(d.dropout_seed, d.dropout_offset, thr, bh, i, j) != 0;
            if (want != (w[e] != 0.0f))
                FAIL("p = %g: element %lld is %s, the Philox word says %s", ps[c], (long long)e,
                     w[e] != 0.0f ? "kept" : "dropped", want ? "kept" : "dropped");
            if (want && fabsf(w[e] - kept_w) > 1e-6f * kept_w)
                FAIL("p = %g: a kept weight is %.9g, not %.9g", ps[c], (double)w[e], (double)kept_w);
            kept += want;
        }
        const double n = (double)nw, mean = n * (1.0 - ps[c]), sd = sqrt(n * ps[c] * (1.0 - ps[c]));
        harness_checks++;
        if (fabs((double)kept - mean) > 5.0 * sd + 0.5)
            FAIL("p = %g: %lld of %lld kept, expected %.0f +- %.0f", ps[c], (long long)kept, (long long)nw, mean, 5 * sd);
    }
    // Another offset or seed gives another mask; the same pair the same one.
    attn_sdpa_desc d;
    fill_desc(&d, &s, 0.5, 1, 0);
    d.weights_mode = ATTN_WEIGHTS_PER_HEAD;
    float *w2 = malloc((size_t)nw * 4);
    ASSERT_OK(attn_sdpa_fwd(ctx, &d, q, k, v, out, NULL, w));
    ASSERT_OK(attn_sdpa_fwd(ctx, &d, q, k, v, out, NULL, w2));
    ASSERT_TRUE(memcmp(w, w2, (size_t)nw * 4) == 0);
    d.dropout_offset = 1;
    ASSERT_OK(attn_sdpa_fwd(ctx, &d, q, k, v, out, NULL, w2));
    int64_t same = 0;
    for (int64_t e = 0; e < nw; e++) same += (w[e] != 0.0f) == (w2[e] != 0.0f);
    ASSERT_TRUE(same < nw * 6 / 10); // independent masks agree on about half the elements
    attn_ctx_free(ctx);
    free(q), free(k), free(v), free(out), free(w), free(w2);
}

// The fused forward against the reference with Philox dropout and causal masking, GQA and a window;
// identical bits for 1, 2 and 3 threads; the context's generator untouched.
static void test_fused_forward(void) {
    const shape shapes[3] = {{1, 4, 130, 200, 64}, {2, 2, 64, 64, 16}, {1, 2, 1, 300, 32}};
    for (int c = 0; c < 3; c++) {
        const shape *s = &shapes[c];
        const int64_t nq = s->B * s->H * s->L * s->D, nk = s->B * (s->H / 2) * s->S * s->D, nl = s->B * s->H * s->L;
        float *q = malloc((size_t)nq * 4), *k = malloc((size_t)nk * 4), *v = malloc((size_t)nk * 4);
        float *ref = malloc((size_t)nq * 4), *got = malloc((size_t)nq * 4), *got3 = malloc((size_t)nq * 4);
        float *lref = malloc((size_t)nl * 4), *lgot = malloc((size_t)nl * 4);
        uint32_t seed = 100u + (uint32_t)c;
        for (int64_t e = 0; e < nq; e++) q[e] = rand_sym(&seed);
        for (int64_t e = 0; e < nk; e++) k[e] = rand_sym(&seed), v[e] = rand_sym(&seed);
        attn_sdpa_desc d;
        fill_desc(&d, s, 0.3, 99, 3);
        d.n_kv_heads = s->H / 2;
        attn_layout_strides(ATTN_LAYOUT_BHLD, s->B, s->H / 2, s->S, s->D, d.k_stride);
        attn_layout_strides(ATTN_LAYOUT_BHLD, s->B, s->H / 2, s->S, s->D, d.v_stride);
        d.causal = c == 1 ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_BOTTOM_RIGHT;
        if (c == 0) d.use_window = 1, d.window_left = 90, d.window_right = -1;
        attn_ctx *r = test_ctx(ATTN_ISA_REF, 1);
        ASSERT_OK(attn_sdpa_fwd(r, &d, q, k, v, ref, lref, NULL));
        attn_ctx_free(r);
        const attn_isa isas[3] = {ATTN_ISA_GENERIC, ATTN_ISA_AVX2, ATTN_ISA_AVX512};
        for (int i = 0; i < 3; i++) {
            if (!attn_isa_supported(isas[i])) continue;
            attn_ctx *c1 = test_ctx(isas[i], 1), *c3 = test_ctx(isas[i], 3);
            attn_generator before = *attn_ctx_generator(c1);
            ASSERT_OK(attn_sdpa_fwd(c1, &d, q, k, v, got, lgot, NULL));
            ASSERT_TRUE(memcmp(&before, attn_ctx_generator(c1), sizeof before) == 0);
            harness_assert_close(__FILE__, __LINE__, attn_isa_name(isas[i]), got, ref, nq, 1e-5, 1e-4);
            harness_assert_close(__FILE__, __LINE__, attn_isa_name(isas[i]), lgot, lref, nl, 1e-5, 1e-5);
            ASSERT_OK(attn_sdpa_fwd(c3, &d, q, k, v, got3, NULL, NULL));
            if (memcmp(got, got3, (size_t)nq * 4) != 0) FAIL("%s: 1 and 3 threads differ", attn_isa_name(isas[i]));
            attn_ctx_free(c1), attn_ctx_free(c3);
        }
        free(q), free(k), free(v), free(ref), free(got), free(got3), free(lref), free(lgot);
    }
}

// A packed batch of equal sequences draws the mask of the plain batch: sequence b counts as batch b.
static void test_varlen_matches_plain(void) {
    const shape s = {3, 2, 20, 30, 16};
    const int64_t nq = s.B * s.H * s.L * s.D, nk = s.B * s.H * s.S * s.D;
    float *q = malloc((size_t)nq * 4), *k = malloc((size_t)nk * 4), *v = malloc((size_t)nk * 4);
    float *plain = malloc((size_t)nq * 4), *packed = malloc((size_t)nq * 4);
    float *dq = malloc((size_t)nq * 4), *dk = malloc((size_t)nk * 4), *dv = malloc((size_t)nk * 4);
    float *dq2 = malloc((size_t)nq * 4), *dk2 = malloc((size_t)nk * 4), *dv2 = malloc((size_t)nk * 4);
    float *lse = malloc((size_t)(s.B * s.H * s.L) * 4), *lse2 = malloc((size_t)(s.B * s.H * s.L) * 4);
    float *dout = malloc((size_t)nq * 4);
    uint32_t seed = 17;
    for (int64_t e = 0; e < nq; e++) q[e] = rand_sym(&seed);
    for (int64_t e = 0; e < nk; e++) k[e] = rand_sym(&seed), v[e] = rand_sym(&seed);
    for (int64_t e = 0; e < nq; e++) dout[e] = rand_sym(&seed);
    const attn_isa isas[2] = {ATTN_ISA_REF, ATTN_ISA_AUTO};
    for (int i = 0; i < 2; i++) {
        attn_ctx *ctx = test_ctx(isas[i], 2);
        // plain: (B, L, H, D) rows, so that the packed view (total, H, D) is the same memory
        attn_sdpa_desc d;
        fill_desc(&d, &s, 0.4, 42, 9);
        attn_layout_strides(ATTN_LAYOUT_BLHD, s.B, s.H, s.L, s.D, d.q_stride);
        attn_layout_strides(ATTN_LAYOUT_BLHD, s.B, s.H, s.S, s.D, d.k_stride);
        attn_layout_strides(ATTN_LAYOUT_BLHD, s.B, s.H, s.S, s.D, d.v_stride);
        attn_layout_strides(ATTN_LAYOUT_BLHD, s.B, s.H, s.L, s.D, d.o_stride);
        d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
        ASSERT_OK(attn_sdpa_fwd(ctx, &d, q, k, v, plain, lse, NULL));
        ASSERT_OK(attn_sdpa_bwd(ctx, &d, q, k, v, plain, dout, lse, NULL, dq, dk, dv, NULL));
        int64_t cu_q[4], cu_k[4];
        for (int b = 0; b <= 3; b++) cu_q[b] = b * s.L, cu_k[b] = b * s.S;
        attn_sdpa_desc pd = d;
        pd.q_stride[0] = pd.k_stride[0] = pd.v_stride[0] = pd.o_stride[0] = 0;
        ASSERT_OK(attn_sdpa_varlen_fwd(ctx, &pd, cu_q, cu_k, q, k, v, packed, lse2));
        harness_assert_close(__FILE__, __LINE__, "packed out", packed, plain, nq, 1e-6, 1e-6);
        ASSERT_OK(attn_sdpa_varlen_bwd(ctx, &pd, cu_q, cu_k, q, k, v, packed, dout, lse2, NULL, dq2, dk2, dv2));
        harness_assert_close(__FILE__, __LINE__, "packed dk", dk2, dk, nk, 1e-6, 1e-5);
        harness_assert_close(__FILE__, __LINE__, "packed dv", dv2, dv, nk, 1e-6, 1e-5);
        harness_assert_close(__FILE__, __LINE__, "packed dq", dq2, dq, nq, 1e-6, 1e-5);
        attn_ctx_free(ctx);
    }
    free(q), free(k), free(v), free(plain), free(packed), free(dq), free(dk), free(dv), free(dq2), free(dk2), free(dv2);
    free(lse), free(lse2), free(dout);
}

// With Philox the scratch holds nothing of size L x S: at L = S = 4096, 8 heads, the context
// generator's mask alone is 16 MiB of bits.
static void test_no_quadratic_scratch(void) {
    const shape s = {1, 8, 4096, 4096, 64};
    attn_ctx *ctx = test_ctx(ATTN_ISA_AUTO, 2);
    attn_sdpa_desc d;
    fill_desc(&d, &s, 0.1, 1, 0);
    size_t philox_fwd, philox_bwd, ctx_fwd, ctx_bwd, none_fwd;
    ASSERT_OK(attn_sdpa_fwd_workspace_size(ctx, &d, &philox_fwd));
    ASSERT_OK(attn_sdpa_bwd_workspace_size(ctx, &d, 0, &philox_bwd));
    d.dropout_rng = ATTN_DROPOUT_RNG_CONTEXT;
    ASSERT_OK(attn_sdpa_fwd_workspace_size(ctx, &d, &ctx_fwd));
    ASSERT_OK(attn_sdpa_bwd_workspace_size(ctx, &d, 0, &ctx_bwd));
    d.dropout_p = 0.0;
    ASSERT_OK(attn_sdpa_fwd_workspace_size(ctx, &d, &none_fwd));
    const size_t bits = (size_t)(s.B * s.H * s.L * s.S / 8);
    ASSERT_TRUE(ctx_fwd >= bits && ctx_bwd >= bits);
    ASSERT_TRUE(philox_fwd < bits / 8 && philox_bwd < ctx_bwd - bits + 64);
    ASSERT_TRUE(philox_fwd <= none_fwd + 64);
    attn_ctx_free(ctx);
}

static void test_errors(void) {
    attn_ctx *ctx = test_ctx(ATTN_ISA_REF, 1);
    const shape s = {1, 1, 2, 2, 2};
    attn_sdpa_desc d;
    fill_desc(&d, &s, 0.5, 0, 0);
    d.dropout_rng = (attn_dropout_rng)7;
    ASSERT_STATUS(attn_sdpa_desc_check(ctx, &d), ATTN_ERR_INVALID_ARG);
    ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "dropout_rng") != NULL);
    fill_desc(&d, &s, 0.5, 0, 0);
    d.len_kv = ((int64_t)1 << 34) + 1;
    d.k_stride[2] = d.v_stride[2] = 0; // a broadcast key row: the sizes alone are checked
    d.k_stride[0] = d.k_stride[1] = d.v_stride[0] = d.v_stride[1] = 0;
    ASSERT_STATUS(attn_sdpa_desc_check(ctx, &d), ATTN_ERR_BAD_SHAPE);
    ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "Philox") != NULL);
    d.dropout_rng = ATTN_DROPOUT_RNG_CONTEXT; // the same sizes are fine for the context's generator
    ASSERT_OK(attn_sdpa_desc_check(ctx, &d));
    attn_ctx_free(ctx);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_known_answers),      HARNESS_CASE(test_mask_and_keep_rate),
        HARNESS_CASE(test_fused_forward),      HARNESS_CASE(test_varlen_matches_plain),
        HARNESS_CASE(test_no_quadratic_scratch), HARNESS_CASE(test_errors),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

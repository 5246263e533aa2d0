// test_sdpa.c - scaled dot-product attention: the public entry point against an independent naive
// computation in this file, the equivalences between options (layouts, GQA, causal vs explicit
// masks, bool vs float masks, key padding), fully masked rows, log-sum-exp, dropout order, and
// every argument error.
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"

// ---- helpers -------------------------------------------------------------------------------

static attn_ctx *new_ctx(void) {
    attn_ctx *ctx = NULL;
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.isa = ATTN_ISA_REF;
    if (attn_ctx_create(&p, &ctx) != ATTN_OK) FAIL("attn_ctx_create failed");
    return ctx;
}

static float *randn(attn_ctx *ctx, int64_t n, double std) {
    float *x = malloc((size_t)n * sizeof(float));
    if (x == NULL || attn_rand_normal(attn_ctx_generator(ctx), x, n, 0.0, std) != ATTN_OK) FAIL("randn failed");
    return x;
}

// A (B, H, L, D) problem in contiguous BHLD layout.
typedef struct problem {
    int64_t B, H, Hkv, L, S, D, Dv;
    float *q, *k, *v;
} problem;

static problem make_problem(attn_ctx *ctx, int64_t B, int64_t H, int64_t Hkv, int64_t L, int64_t S, int64_t D,
                            int64_t Dv) {
    problem p = {B, H, Hkv, L, S, D, Dv, NULL, NULL, NULL};
    p.q = randn(ctx, B * H * L * D, 1.0);
    p.k = randn(ctx, B * Hkv * S * D, 1.0);
    p.v = randn(ctx, B * Hkv * S * Dv, 1.0);
    return p;
}

static void free_problem(problem *p) {
    free(p->q);
    free(p->k);
    free(p->v);
}

static void desc_for(const problem *p, attn_sdpa_desc *d) {
    attn_sdpa_desc_init(d);
    d->batch = p->B, d->n_heads = p->H, d->n_kv_heads = p->Hkv, d->len_q = p->L, d->len_kv = p->S;
    d->head_dim = p->D, d->head_dim_v = p->Dv;
    attn_layout_strides(ATTN_LAYOUT_BHLD, p->B, p->H, p->L, p->D, d->q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, p->B, p->Hkv, p->S, p->D, d->k_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, p->B, p->Hkv, p->S, p->Dv, d->v_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, p->B, p->H, p->L, p->Dv, d->o_stride);
}

// Naive attention written independently of the library: the full (B, H, L, S) score tensor,
// masks given as a dense additive float tensor `bias` (B, H, L, S) or NULL.
static void naive(const problem *p, float scale, const float *bias, float *out, float *weights, float *lse) {
    const int64_t G = p->H / p->Hkv;
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < p->H; h++)
            for (int64_t i = 0; i < p->L; i++) {
                double s[512], m = -INFINITY, sum = 0;
                const float *qi = p->q + ((b * p->H + h) * p->L + i) * p->D;
                for (int64_t j = 0; j < p->S; j++) {
                    const float *kj = p->k + ((b * p->Hkv + h / G) * p->S + j) * p->D;
                    double acc = 0;
                    for (int64_t t = 0; t < p->D; t++) acc += (double)qi[t] * kj[t];
                    s[j] = acc * scale + (bias ? bias[((b * p->H + h) * p->L + i) * p->S + j] : 0.0);
                    if (s[j] > m) m = s[j];
                }
                for (int64_t j = 0; j < p->S; j++) sum += m == -INFINITY ? 0.0 : exp(s[j] - m);
                float *oi = out + ((b * p->H + h) * p->L + i) * p->Dv;
                for (int64_t t = 0; t < p->Dv; t++) oi[t] = 0;
                for (int64_t j = 0; j < p->S; j++) {
                    double w = m == -INFINITY ? 0.0 : exp(s[j] - m) / sum;
                    if (weights) weights[((b * p->H + h) * p->L + i) * p->S + j] = (float)w;
                    const float *vj = p->v + ((b * p->Hkv + h / G) * p->S + j) * p->Dv;
                    for (int64_t t = 0; t < p->Dv; t++) oi[t] += (float)(w * vj[t]);
                }
                if (lse) lse[(b * p->H + h) * p->L + i] = m == -INFINITY ? -INFINITY : (float)(m + log(sum));
            }
}

static float *alloc_f(int64_t n) {
    float *x = calloc((size_t)n, sizeof(float));
    if (x == NULL) FAIL("out of memory");
    return x;
}

// ---- tests -----------------------------------------------------------------------------------

static void test_matches_naive(void) {
    attn_ctx *ctx = new_ctx();
    const int64_t shapes[][7] = {{1, 1, 1, 1, 1, 1, 1}, {2, 3, 3, 5, 7, 4, 4}, {1, 4, 2, 9, 6, 8, 3},
                                 {3, 2, 1, 1, 13, 5, 7}, {1, 2, 2, 17, 3, 16, 16}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int64_t *s = shapes[c];
        problem p = make_problem(ctx, s[0], s[1], s[2], s[3], s[4], s[5], s[6]);
        attn_sdpa_desc d;
        desc_for(&p, &d);
        d.weights_mode = ATTN_WEIGHTS_PER_HEAD;
        const int64_t no = p.B * p.H * p.L * p.Dv, nw = p.B * p.H * p.L * p.S, nl = p.B * p.H * p.L;
        float *o = alloc_f(no), *w = alloc_f(nw), *l = alloc_f(nl), *o2 = alloc_f(no), *w2 = alloc_f(nw), *l2 = alloc_f(nl);
        ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, l, w));
        naive(&p, (float)(1.0 / sqrt((double)p.D)), NULL, o2, w2, l2);
        ASSERT_CLOSE(o, o2, no, 1e-6, 1e-5);
        ASSERT_CLOSE(w, w2, nw, 1e-7, 1e-5);
        ASSERT_CLOSE(l, l2, nl, 1e-6, 1e-6);
        // a custom scale
        d.scale = 0.37f;
        ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, l, w));
        naive(&p, 0.37f, NULL, o2, w2, l2);
        ASSERT_CLOSE(o, o2, no, 1e-6, 1e-5);
        free(o), free(w), free(l), free(o2), free(w2), free(l2);
        free_problem(&p);
    }
    attn_ctx_free(ctx);
}

// (B, H, L, D) data copied into another layout gives bit-identical results through strides.
static void test_layouts_are_views(void) {
    attn_ctx *ctx = new_ctx();
    const int64_t B = 2, H = 3, L = 5, S = 5, D = 4;
    problem p = make_problem(ctx, B, H, H, L, S, D, D);
    attn_sdpa_desc d;
    desc_for(&p, &d);
    const int64_t n = B * H * L * D;
    float *ref = alloc_f(n);
    ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, ref, NULL, NULL));
    const attn_layout layouts[2] = {ATTN_LAYOUT_BLHD, ATTN_LAYOUT_LBHD};
    for (int li = 0; li < 2; li++) {
        int64_t st[4];
        ASSERT_OK(attn_layout_strides(layouts[li], B, H, L, D, st));
        float *q = alloc_f(n), *k = alloc_f(n), *v = alloc_f(n), *o = alloc_f(n), *o_bhld = alloc_f(n);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < L; i++)
                    for (int64_t t = 0; t < D; t++) {
                        int64_t src = ((b * H + h) * L + i) * D + t, dst = b * st[0] + h * st[1] + i * st[2] + t * st[3];
                        q[dst] = p.q[src], k[dst] = p.k[src], v[dst] = p.v[src];
                    }
        attn_sdpa_desc d2 = d;
        memcpy(d2.q_stride, st, sizeof st);
        memcpy(d2.k_stride, st, sizeof st);
        memcpy(d2.v_stride, st, sizeof st);
        memcpy(d2.o_stride, st, sizeof st);
        ASSERT_OK(attn_sdpa_fwd(ctx, &d2, q, k, v, o, NULL, NULL));
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < L; i++)
                    for (int64_t t = 0; t < D; t++)
                        o_bhld[((b * H + h) * L + i) * D + t] = o[b * st[0] + h * st[1] + i * st[2] + t * st[3]];
        ASSERT_BITS_EQ(o_bhld, ref, n);
        free(q), free(k), free(v), free(o), free(o_bhld);
    }
    free(ref);
    free_problem(&p);
    attn_ctx_free(ctx);
}

// Grouped-query attention equals plain attention with each kv head repeated H/Hkv times.
static void test_gqa_equals_repeated_kv(void) {
    attn_ctx *ctx = new_ctx();
    const int64_t B = 2, H = 6, Hkv = 2, L = 4, S = 7, D = 5;
    problem p = make_problem(ctx, B, H, Hkv, L, S, D, D);
    problem r = p;
    r.Hkv = H;
    r.k = alloc_f(B * H * S * D), r.v = alloc_f(B * H * S * D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            memcpy(r.k + (b * H + h) * S * D, p.k + (b * Hkv + h / (H / Hkv)) * S * D, (size_t)(S * D) * sizeof(float)),
                memcpy(r.v + (b * H + h) * S * D, p.v + (b * Hkv + h / (H / Hkv)) * S * D, (size_t)(S * D) * sizeof(float));
    attn_sdpa_desc d1, d2;
    desc_for(&p, &d1);
    desc_for(&r, &d2);
    float *o1 = alloc_f(B * H * L * D), *o2 = alloc_f(B * H * L * D);
    ASSERT_OK(attn_sdpa_fwd(ctx, &d1, p.q, p.k, p.v, o1, NULL, NULL));
    ASSERT_OK(attn_sdpa_fwd(ctx, &d2, r.q, r.k, r.v, o2, NULL, NULL));
    ASSERT_BITS_EQ(o1, o2, B * H * L * D);
    free(r.k), free(r.v), free(o1), free(o2);
    free_problem(&p);
    attn_ctx_free(ctx);
}

// Runs `d` and a copy of it with `alt` changes; asserts identical outputs, weights and lse.
static void assert_same_result(attn_ctx *ctx, const problem *p, const attn_sdpa_desc *a, const attn_sdpa_desc *b) {
    const int64_t no = p->B * p->H * p->L * p->Dv, nw = p->B * p->H * p->L * p->S, nl = p->B * p->H * p->L;
    float *o1 = alloc_f(no), *o2 = alloc_f(no), *w1 = alloc_f(nw), *w2 = alloc_f(nw), *l1 = alloc_f(nl), *l2 = alloc_f(nl);
    attn_sdpa_desc da = *a, db = *b;
    da.weights_mode = db.weights_mode = ATTN_WEIGHTS_PER_HEAD;
    ASSERT_OK(attn_sdpa_fwd(ctx, &da, p->q, p->k, p->v, o1, l1, w1));
    ASSERT_OK(attn_sdpa_fwd(ctx, &db, p->q, p->k, p->v, o2, l2, w2));
    ASSERT_BITS_EQ(o1, o2, no);
    ASSERT_BITS_EQ(w1, w2, nw);
    ASSERT_BITS_EQ(l1, l2, nl);
    free(o1), free(o2), free(w1), free(w2), free(l1), free(l2);
}

static void test_causal_equals_explicit_mask(void) {
    attn_ctx *ctx = new_ctx();
    const int64_t LS[][2] = {{5, 5}, {3, 8}, {8, 3}, {1, 6}};
    for (size_t c = 0; c < 4; c++) {
        const int64_t L = LS[c][0], S = LS[c][1];
        problem p = make_problem(ctx, 2, 2, 2, L, S, 3, 3);
        for (int mode = 1; mode <= 2; mode++) {
            attn_sdpa_desc a, b;
            desc_for(&p, &a);
            desc_for(&p, &b);
            a.causal = (attn_causal)mode;
            uint8_t *m = malloc((size_t)(L * S));
            for (int64_t i = 0; i < L; i++)
                for (int64_t j = 0; j < S; j++) m[i * S + j] = mode == 1 ? j > i : j > i + S - L; // triu(ones(L,S), 1)
            b.mask = m, b.mask_dtype = ATTN_DTYPE_BOOL;
            b.mask_stride[2] = S, b.mask_stride[3] = 1; // (L, S) broadcast over B and H
            assert_same_result(ctx, &p, &a, &b);
            free(m);
        }
        free_problem(&p);
    }
    attn_ctx_free(ctx);
}

static void test_bool_mask_equals_float_inf_mask(void) {
    attn_ctx *ctx = new_ctx();
    const int64_t B = 2, H = 3, L = 4, S = 6;
    problem p = make_problem(ctx, B, H, H, L, S, 5, 5);
    uint8_t *bm = malloc((size_t)(B * H * L * S));
    float *fm = alloc_f(B * H * L * S);
    float u[1];
    for (int64_t i = 0; i < B * H * L * S; i++) {
        attn_rand_uniform(attn_ctx_generator(ctx), u, 1, 0.0, 1.0);
        bm[i] = u[0] < 0.3f && i % S != 0; // keep column 0 visible
        fm[i] = bm[i] ? -INFINITY : 0.0f;
    }
    attn_sdpa_desc a, b;
    desc_for(&p, &a);
    desc_for(&p, &b);
    a.mask = bm, a.mask_dtype = ATTN_DTYPE_BOOL; // one mask per (batch, head)
    b.mask = fm, b.mask_dtype = ATTN_DTYPE_F32;
    const int64_t st[4] = {H * L * S, L * S, S, 1};
    memcpy(a.mask_stride, st, sizeof st);
    memcpy(b.mask_stride, st, sizeof st);
    assert_same_result(ctx, &p, &a, &b);
    // and a float mask with finite values equals the naive additive bias
    for (int64_t i = 0; i < B * H * L * S; i++) fm[i] = (float)(i % 7) * 0.25f - 0.5f;
    float *o = alloc_f(B * H * L * 5), *o2 = alloc_f(B * H * L * 5);
    ASSERT_OK(attn_sdpa_fwd(ctx, &b, p.q, p.k, p.v, o, NULL, NULL));
    naive(&p, (float)(1.0 / sqrt(5.0)), fm, o2, NULL, NULL);
    ASSERT_CLOSE(o, o2, B * H * L * 5, 1e-6, 1e-5);
    free(o), free(o2), free(bm), free(fm);
    free_problem(&p);
    attn_ctx_free(ctx);
}

static void test_key_padding_equals_mask(void) {
    attn_ctx *ctx = new_ctx();
    const int64_t B = 3, H = 2, L = 4, S = 5;
    problem p = make_problem(ctx, B, H, H, L, S, 3, 3);
    uint8_t kpm[3 * 5] = {0, 0, 0, 1, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 1};
    attn_sdpa_desc a, b;
    desc_for(&p, &a);
    desc_for(&p, &b);
    a.key_padding_mask = kpm, a.key_padding_mask_dtype = ATTN_DTYPE_BOOL;
    a.key_padding_mask_stride[0] = S, a.key_padding_mask_stride[1] = 1;
    b.mask = kpm, b.mask_dtype = ATTN_DTYPE_BOOL; // the same bytes viewed as (B, H, L, S): broadcast H and L
    b.mask_stride[0] = S, b.mask_stride[3] = 1;
    assert_same_result(ctx, &p, &a, &b);
    // float key padding: -inf equals True
    float fk[3 * 5];
    for (int i = 0; i < 15; i++) fk[i] = kpm[i] ? -INFINITY : 0.0f;
    b = a;
    b.key_padding_mask = fk, b.key_padding_mask_dtype = ATTN_DTYPE_F32;
    assert_same_result(ctx, &p, &a, &b);
    free_problem(&p);
    attn_ctx_free(ctx);
}

static void test_fully_masked_rows_give_zeros(void) {
    attn_ctx *ctx = new_ctx();
    const int64_t B = 2, H = 2, L = 3, S = 4, D = 3;
    problem p = make_problem(ctx, B, H, H, L, S, D, D);
    uint8_t m[3 * 4] = {0, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0}; // row 1 fully masked
    uint8_t kpm[2 * 4] = {0, 0, 0, 0, 1, 1, 1, 1};          // batch 1 has every key padded
    attn_sdpa_desc d;
    desc_for(&p, &d);
    d.mask = m, d.mask_dtype = ATTN_DTYPE_BOOL, d.mask_stride[2] = S, d.mask_stride[3] = 1;
    d.key_padding_mask = kpm, d.key_padding_mask_dtype = ATTN_DTYPE_BOOL;
    d.key_padding_mask_stride[0] = S, d.key_padding_mask_stride[1] = 1;
    d.weights_mode = ATTN_WEIGHTS_PER_HEAD;
    float o[2 * 2 * 3 * 3], w[2 * 2 * 3 * 4], l[2 * 2 * 3];
    ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, l, w));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++) {
                bool dead = b == 1 || i == 1;
                int64_t r = (b * H + h) * L + i;
                for (int64_t j = 0; j < S; j++) {
                    ASSERT_TRUE(!isnan(w[r * S + j]));
                    if (dead) ASSERT_TRUE(w[r * S + j] == 0.0f);
                }
                for (int64_t t = 0; t < D; t++) {
                    ASSERT_TRUE(!isnan(o[r * D + t]));
                    if (dead) ASSERT_TRUE(o[r * D + t] == 0.0f);
                }
                ASSERT_TRUE(dead ? l[r] == -INFINITY : isfinite(l[r]));
                if (!dead) {
                    double sum = 0;
                    for (int64_t j = 0; j < S; j++) sum += w[r * S + j];
                    ASSERT_TRUE(fabs(sum - 1.0) < 1e-6);
                }
            }
    free_problem(&p);
    attn_ctx_free(ctx);
}

static void test_average_weights(void) {
    attn_ctx *ctx = new_ctx();
    const int64_t B = 2, H = 3, L = 4, S = 5;
    problem p = make_problem(ctx, B, H, H, L, S, 4, 4);
    attn_sdpa_desc d;
    desc_for(&p, &d);
    float *o = alloc_f(B * H * L * 4), *wh = alloc_f(B * H * L * S), *wa = alloc_f(B * L * S), *want = alloc_f(B * L * S);
    d.weights_mode = ATTN_WEIGHTS_PER_HEAD;
    ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, wh));
    d.weights_mode = ATTN_WEIGHTS_AVERAGE;
    ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, wa));
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < L * S; i++) { // ((h0 + h1) + h2) / H in float, as PyTorch
            float acc = wh[(b * H) * L * S + i];
            for (int64_t h = 1; h < H; h++) acc += wh[(b * H + h) * L * S + i];
            want[b * L * S + i] = acc / (float)H;
        }
    ASSERT_BITS_EQ(wa, want, B * L * S);
    free(o), free(wh), free(wa), free(want);
    free_problem(&p);
    attn_ctx_free(ctx);
}

// Dropout draws in (b, h, i, j) order like F.dropout on the (B*H, L, S) weights: the weights SDPA
// returns equal attn_rand_dropout applied to the undropped weights from the same seed.
static void test_dropout_matches_functional_dropout(void) {
    attn_ctx *ctx = new_ctx();
    const int64_t B = 2, H = 2, L = 3, S = 9, D = 4;
    problem p = make_problem(ctx, B, H, H, L, S, D, D);
    attn_sdpa_desc d;
    desc_for(&p, &d);
    d.weights_mode = ATTN_WEIGHTS_PER_HEAD;
    const int64_t nw = B * H * L * S, no = B * H * L * D;
    float *w0 = alloc_f(nw), *w1 = alloc_f(nw), *want = alloc_f(nw), *o = alloc_f(no), *o_want = alloc_f(no);
    ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, w0));
    const double ps[3] = {0.1, 0.5, 0.7};
    for (int c = 0; c < 3; c++) {
        d.dropout_p = ps[c];
        attn_generator_seed(attn_ctx_generator(ctx), 1234);
        ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, w1));
        uint32_t next_sdpa = attn_generator_random(attn_ctx_generator(ctx));
        attn_generator g;
        attn_generator_seed(&g, 1234);
        ASSERT_OK(attn_rand_dropout(&g, w0, want, nw, ps[c]));
        ASSERT_BITS_EQ(w1, want, nw);
        ASSERT_EQ_U64(next_sdpa, attn_generator_random(&g)); // the same number of draws
        // out = dropped weights @ v
        for (int64_t r = 0; r < B * H * L; r++)
            for (int64_t t = 0; t < D; t++) {
                double acc = 0;
                for (int64_t j = 0; j < S; j++) acc += (double)want[r * S + j] * p.v[(r / L * S + j) * D + t];
                o_want[r * D + t] = (float)acc;
            }
        ASSERT_CLOSE(o, o_want, no, 1e-6, 1e-6);
    }
    free(w0), free(w1), free(want), free(o), free(o_want);
    free_problem(&p);
    attn_ctx_free(ctx);
}

static void test_nan_poisons_only_its_row(void) {
    attn_ctx *ctx = new_ctx();
    problem p = make_problem(ctx, 1, 1, 1, 3, 4, 2, 2);
    p.q[1 * 2 + 0] = NAN; // query row 1
    attn_sdpa_desc d;
    desc_for(&p, &d);
    float o[3 * 2];
    ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL));
    ASSERT_TRUE(isnan(o[2]) && isnan(o[3]));
    ASSERT_TRUE(isfinite(o[0]) && isfinite(o[1]) && isfinite(o[4]) && isfinite(o[5]));
    free_problem(&p);
    attn_ctx_free(ctx);
}

// A NaN in key j reaches exactly the rows that see key j; masked keys (causal, bool, -inf float,
// key padding) are never read, so NaN or inf there changes nothing.
static void test_nan_in_keys_reaches_only_rows_that_see_them(void) {
    attn_ctx *ctx = new_ctx();
    const int64_t L = 5, S = 5, D = 3;
    problem p = make_problem(ctx, 1, 1, 1, L, S, D, D);
    attn_sdpa_desc d;
    desc_for(&p, &d);
    float clean[5 * 3], o[5 * 3];
    d.causal = ATTN_CAUSAL_TOP_LEFT;
    ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, clean, NULL, NULL));
    p.k[2 * D + 1] = NAN; // key 2: seen by rows 2, 3, 4 only
    p.v[4 * D] = INFINITY; // value 4: seen by row 4 only
    ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL));
    for (int64_t i = 0; i < L; i++)
        for (int64_t t = 0; t < D; t++) {
            if (i < 2) ASSERT_TRUE(harness_f32_bits(o[i * D + t]) == harness_f32_bits(clean[i * D + t]));
            else ASSERT_TRUE(isnan(o[i * D + t]) || isinf(o[i * D + t]));
        }
    // hide keys 2 and 4 from every row with each kind of mask: the result is finite everywhere
    uint8_t bm[5] = {0, 0, 1, 0, 1};
    float fm[5] = {0, 0, -INFINITY, 0, -INFINITY};
    d.causal = ATTN_CAUSAL_NONE;
    for (int kind = 0; kind < 3; kind++) {
        attn_sdpa_desc e = d;
        if (kind == 0) e.mask = bm, e.mask_dtype = ATTN_DTYPE_BOOL, e.mask_stride[3] = 1;
        if (kind == 1) e.mask = fm, e.mask_dtype = ATTN_DTYPE_F32, e.mask_stride[3] = 1;
        if (kind == 2)
            e.key_padding_mask = bm, e.key_padding_mask_dtype = ATTN_DTYPE_BOOL, e.key_padding_mask_stride[1] = 1;
        ASSERT_OK(attn_sdpa_fwd(ctx, &e, p.q, p.k, p.v, o, NULL, NULL));
        for (int64_t i = 0; i < L * D; i++) ASSERT_TRUE(isfinite(o[i]));
    }
    free_problem(&p);
    attn_ctx_free(ctx);
}

static void test_huge_scores_stay_finite(void) {
    attn_ctx *ctx = new_ctx();
    problem p = make_problem(ctx, 1, 1, 1, 2, 3, 2, 2);
    for (int i = 0; i < 4; i++) p.q[i] *= 1e15f;
    for (int i = 0; i < 6; i++) p.k[i] *= 1e15f; // scores of order +-1e30
    attn_sdpa_desc d;
    desc_for(&p, &d);
    d.weights_mode = ATTN_WEIGHTS_PER_HEAD;
    float o[4], w[6], l[2];
    ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, l, w));
    for (int i = 0; i < 6; i++) ASSERT_TRUE(isfinite(w[i]) && w[i] >= 0.0f && w[i] <= 1.0f);
    for (int i = 0; i < 4; i++) ASSERT_TRUE(isfinite(o[i]));
    free_problem(&p);
    attn_ctx_free(ctx);
}

static attn_ctx *ctx_with(attn_isa isa) {
    attn_ctx *ctx = NULL;
    attn_ctx_params cp;
    attn_ctx_params_init(&cp);
    cp.isa = isa;
    if (attn_ctx_create(&cp, &ctx) != ATTN_OK) FAIL("attn_ctx_create failed");
    return ctx;
}

// A key that any mask blocks is hidden whatever the other masks hold there (NaN, +inf): the
// reference and the fast kernels agree, as attn.h specifies. A NaN term on a visible key poisons
// the row.
static void test_blocked_key_ignores_other_mask_terms(void) {
    const attn_isa isas[2] = {ATTN_ISA_REF, ATTN_ISA_AUTO};
    for (int c = 0; c < 2; c++) {
        attn_ctx *ctx = ctx_with(isas[c]);
        problem p = make_problem(ctx, 1, 1, 1, 2, 3, 2, 2);
        attn_sdpa_desc d;
        desc_for(&p, &d);
        float only[2 * 2], o[2 * 2];
        uint8_t bm[3] = {0, 1, 0};
        d.mask = bm, d.mask_dtype = ATTN_DTYPE_BOOL, d.mask_stride[2] = 0, d.mask_stride[3] = 1;
        ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, only, NULL, NULL));
        const float terms[2] = {NAN, INFINITY};
        for (int t = 0; t < 2; t++) {
            float kpm[3] = {0.0f, terms[t], 0.0f}; // on the key the bool mask blocks
            attn_sdpa_desc e = d;
            e.key_padding_mask = kpm, e.key_padding_mask_dtype = ATTN_DTYPE_F32, e.key_padding_mask_stride[1] = 1;
            ASSERT_OK(attn_sdpa_fwd(ctx, &e, p.q, p.k, p.v, o, NULL, NULL));
            ASSERT_BITS_EQ(only, o, 4);
            e.causal = ATTN_CAUSAL_BOTTOM_RIGHT; // query 0 cannot see key 2: NaN there is hidden too
            kpm[2] = NAN;
            ASSERT_OK(attn_sdpa_fwd(ctx, &e, p.q, p.k, p.v, o, NULL, NULL));
            ASSERT_TRUE(isfinite(o[0]) && isfinite(o[1]) && isnan(o[2]) && isnan(o[3]));
        }
        free_problem(&p);
        attn_ctx_free(ctx);
    }
}

// Dropout multiplies, as F.dropout does: a NaN row stays NaN even where every key is dropped.
static void test_dropout_keeps_nan_rows_nan(void) {
    const attn_isa isas[2] = {ATTN_ISA_REF, ATTN_ISA_AUTO};
    for (int c = 0; c < 2; c++) {
        attn_ctx *ctx = ctx_with(isas[c]);
        problem p = make_problem(ctx, 1, 1, 1, 1, 1, 1, 1);
        p.q[0] = NAN;
        attn_sdpa_desc d;
        desc_for(&p, &d);
        d.dropout_p = 1.0; // every key dropped
        float o[1];
        ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL));
        ASSERT_TRUE(isnan(o[0]));
        p.q[0] = 1.0f; // a finite row: all dropped gives 0
        ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL));
        ASSERT_TRUE(o[0] == 0.0f);
        free_problem(&p);
        attn_ctx_free(ctx);
    }
}

// The stride of a length-1 dimension is never used to reach an element: any value gives the same
// result (the kernels must not step a pointer by it).
static void test_length_one_dims_ignore_strides(void) {
    const attn_isa isas[2] = {ATTN_ISA_REF, ATTN_ISA_AUTO};
    for (int c = 0; c < 2; c++) {
        attn_ctx *ctx = ctx_with(isas[c]);
        problem p = make_problem(ctx, 1, 1, 1, 3, 1, 4, 4); // one key
        attn_sdpa_desc d;
        desc_for(&p, &d);
        float o1[3 * 4], o2[3 * 4];
        ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o1, NULL, NULL));
        for (int i = 0; i < 3; i++) d.k_stride[i] = d.v_stride[i] = (int64_t)1 << 61;
        d.q_stride[0] = d.q_stride[1] = d.o_stride[0] = d.o_stride[1] = (int64_t)1 << 61;
        ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o2, NULL, NULL));
        ASSERT_BITS_EQ(o1, o2, 3 * 4);
        free_problem(&p);
        attn_ctx_free(ctx);
    }
}

static void test_argument_errors(void) {
    attn_ctx *ctx = new_ctx();
    problem p = make_problem(ctx, 1, 2, 2, 3, 3, 4, 4);
    float o[2 * 3 * 4], w[2 * 3 * 3];
    attn_sdpa_desc good, d;
    desc_for(&p, &good);
    ASSERT_OK(attn_sdpa_fwd(ctx, &good, p.q, p.k, p.v, o, NULL, NULL));
    ASSERT_STATUS(attn_sdpa_fwd(NULL, &good, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_sdpa_fwd(ctx, NULL, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &good, NULL, p.k, p.v, o, NULL, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &good, p.q, p.k, p.v, NULL, NULL, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_TRUE(strlen(attn_ctx_last_error(ctx)) > 0);
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &good, p.q, p.k, p.v, o, NULL, w), ATTN_ERR_INVALID_ARG); // weights w/o mode
    d = good, d.weights_mode = ATTN_WEIGHTS_PER_HEAD;
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_INVALID_ARG);
    d = good, d.batch = 0;
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_BAD_SHAPE);
    d = good, d.head_dim = -3;
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_BAD_SHAPE);
    d = good, d.n_kv_heads = 3; // 2 % 3 != 0
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_BAD_SHAPE);
    d = good, d.scale = INFINITY;
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_INVALID_ARG);
    d = good, d.scale = NAN;
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_INVALID_ARG);
    d = good, d.causal = (attn_causal)7;
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_INVALID_ARG);
    d = good, d.dropout_p = 1.5;
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_INVALID_ARG);
    d = good, d.dropout_p = NAN;
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_INVALID_ARG);
    d = good, d.weights_mode = (attn_weights_mode)9;
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, w), ATTN_ERR_INVALID_ARG);
    d = good, d.q_stride[2] = -1;
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_INVALID_ARG);
    d = good, d.o_stride[2] = 0; // rows of the output would overwrite each other
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_INVALID_ARG);
    d = good, d.len_q = INT64_MAX / 2; // offsets overflow
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_OVERFLOW);
    d = good, d.k_stride[0] = INT64_MAX / 2, d.batch = 3;
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_OVERFLOW);
    uint8_t m[9] = {0};
    d = good, d.mask = m, d.mask_dtype = ATTN_DTYPE_I64;
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_BAD_MASK);
    d = good, d.key_padding_mask = m, d.key_padding_mask_dtype = ATTN_DTYPE_F16;
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_BAD_MASK);
    d = good, d.mask = m, d.mask_dtype = ATTN_DTYPE_BOOL, d.mask_stride[3] = -1;
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_INVALID_ARG);
    // element types: anything but F32, F16 and BF16 is invalid for each of them
    const attn_dtype bad_types[] = {ATTN_DTYPE_F64, ATTN_DTYPE_BOOL, ATTN_DTYPE_I32, (attn_dtype)99};
    for (size_t t = 0; t < sizeof bad_types / sizeof bad_types[0]; t++) {
        d = good, d.kv_dtype = bad_types[t];
        ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_INVALID_ARG);
        ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "kv_dtype") != NULL);
        d = good, d.q_dtype = bad_types[t];
        ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_INVALID_ARG);
        ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "q_dtype") != NULL);
        d = good, d.out_dtype = bad_types[t];
        ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_INVALID_ARG);
        ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "out_dtype") != NULL);
        d = good, d.grad_dtype = bad_types[t];
        ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o, NULL, NULL), ATTN_ERR_INVALID_ARG);
        ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "grad_dtype") != NULL);
    }
    int64_t st[4];
    ASSERT_STATUS(attn_layout_strides((attn_layout)5, 1, 1, 1, 1, st), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_layout_strides(ATTN_LAYOUT_BHLD, 0, 1, 1, 1, st), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_layout_strides(ATTN_LAYOUT_BHLD, INT64_MAX, 2, 2, 2, st), ATTN_ERR_OVERFLOW);
    // nothing was written by failing calls: the output still holds the good call's result
    float o2[2 * 3 * 4];
    ASSERT_OK(attn_sdpa_fwd(ctx, &good, p.q, p.k, p.v, o2, NULL, NULL));
    ASSERT_BITS_EQ(o, o2, 2 * 3 * 4);
    free_problem(&p);
    attn_ctx_free(ctx);
}

static void caller_workspace_with(attn_isa isa) {
    attn_ctx *ctx = ctx_with(isa);
    problem p = make_problem(ctx, 1, 2, 2, 5, 7, 4, 4);
    attn_sdpa_desc d;
    desc_for(&p, &d);
    size_t need = 0;
    ASSERT_OK(attn_sdpa_fwd_workspace_size(ctx, &d, &need));
    ASSERT_TRUE(need > 0);
    float o1[2 * 5 * 4], o2[2 * 5 * 4];
    ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o1, NULL, NULL));
    // The reported size covers any alignment: 63 bytes of it are room to reach a 64-byte boundary.
    ASSERT_TRUE(need > 63);
    char *buf = NULL;
    ASSERT_TRUE(posix_memalign((void **)&buf, 64, need + 64) == 0);
    ASSERT_OK(attn_ctx_set_workspace(ctx, buf, need - 64)); // aligned, one byte short
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o2, NULL, NULL), ATTN_ERR_WORKSPACE);
    ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "workspace") != NULL);
    ASSERT_OK(attn_ctx_set_workspace(ctx, buf, need - 63)); // aligned, exactly enough
    ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o2, NULL, NULL));
    ASSERT_BITS_EQ(o1, o2, 2 * 5 * 4);
    for (size_t off = 1; off < 64; off++) { // any start address works with the reported size
        memset(o2, 0, sizeof o2);
        ASSERT_OK(attn_ctx_set_workspace(ctx, buf + off, need));
        ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o2, NULL, NULL));
        ASSERT_BITS_EQ(o1, o2, 2 * 5 * 4);
    }
    ASSERT_OK(attn_ctx_set_workspace(ctx, buf + 1, 10)); // too small to reach the boundary: usable 0
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o2, NULL, NULL), ATTN_ERR_WORKSPACE);
    ASSERT_STATUS(attn_ctx_set_workspace(ctx, buf, 0), ATTN_ERR_INVALID_ARG);
    ASSERT_OK(attn_ctx_set_workspace(ctx, NULL, 0)); // back to context-owned scratch
    ASSERT_OK(attn_ctx_reserve(ctx, 1 << 16));
    ASSERT_OK(attn_sdpa_fwd(ctx, &d, p.q, p.k, p.v, o2, NULL, NULL));
    ASSERT_BITS_EQ(o1, o2, 2 * 5 * 4);
    free(buf);
    free_problem(&p);
    attn_ctx_free(ctx);
}

// Caller-owned scratch of any alignment, for the reference and the fast kernels (which use aligned
// vector loads on it).
static void test_caller_workspace(void) {
    caller_workspace_with(ATTN_ISA_REF);
    caller_workspace_with(ATTN_ISA_AUTO);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_matches_naive),
        HARNESS_CASE(test_layouts_are_views),
        HARNESS_CASE(test_gqa_equals_repeated_kv),
        HARNESS_CASE(test_causal_equals_explicit_mask),
        HARNESS_CASE(test_bool_mask_equals_float_inf_mask),
        HARNESS_CASE(test_key_padding_equals_mask),
        HARNESS_CASE(test_fully_masked_rows_give_zeros),
        HARNESS_CASE(test_average_weights),
        HARNESS_CASE(test_dropout_matches_functional_dropout),
        HARNESS_CASE(test_nan_poisons_only_its_row),
        HARNESS_CASE(test_nan_in_keys_reaches_only_rows_that_see_them),
        HARNESS_CASE(test_huge_scores_stay_finite),
        HARNESS_CASE(test_blocked_key_ignores_other_mask_terms),
        HARNESS_CASE(test_dropout_keeps_nan_rows_nan),
        HARNESS_CASE(test_length_one_dims_ignore_strides),
        HARNESS_CASE(test_argument_errors),
        HARNESS_CASE(test_caller_workspace),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

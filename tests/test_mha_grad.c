// test_mha_grad.c - nn.MultiheadAttention's backward against finite differences of a double-
// precision forward written here from the definition (projections, bias_k/bias_v, the zero key,
// heads, masks widened over the extra keys, q divided by sqrt(head_dim), softmax, dropout with the
// forward's mask, out_proj), for every option: bias, add_bias_kv, add_zero_attn, kdim/vdim, bool
// and float 2-D/3-D masks, causal, bool and float key padding, dropout, and self-attention (one
// tensor as query, key and value: its gradient is the sum of the three paths). The book's modules
// are tested the same way in test_book_grad.c.
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"
#include "test_data.h"

typedef struct mcase {
    int64_t N, L, S, E, H, kdim, vdim;
    int bias, bias_kv, zero_attn, self;
    int mask; // 0 none, 1 bool (L, S), 2 float (N*H, L, S), 3 causal
    int kpm;  // 0 none, 1 bool, 2 float
    double dropout;
} mcase;

// Every variable of the loss in double, laid out like the state_dict and the (N, L, E) inputs.
typedef struct vars {
    double *wq, *wk, *wv, *b_in, *bias_k, *bias_v, *wo, *bo; // b_in: (3E)
    double *q, *k, *v;
    float *mask_f, *kpm_f, *keep, *g; // fixed data: masks, dropout keep mask (N*H, L, S'), dL/dout
    uint8_t *mask_b, *kpm_b;
} vars;

static int64_t S2_of(const mcase *c) { return c->S + (c->bias_kv ? 1 : 0) + (c->zero_attn ? 1 : 0); }

static double *rnd(int64_t n, uint32_t *seed, double scale) {
    double *x = malloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++) x[i] = (double)(float)(scale * (2 * rand_unit_d(seed) - 1));
    return x;
}

// loss = sum G * out for batch-first (N, L, E) inputs and output, all in double.
static double mha_loss(const mcase *c, const vars *x) {
    const int64_t N = c->N, L = c->L, S = c->S, E = c->E, H = c->H, hd = E / H, S2 = S2_of(c);
    const double div = (double)(float)sqrt((double)hd);
    const double drop = c->dropout > 0 ? (double)(1.0f / (float)(1.0 - c->dropout)) : 1.0;
    const double *kin = c->self ? x->q : x->k, *vin = c->self ? x->q : x->v;
    const int64_t kd = c->self ? E : c->kdim, vd = c->self ? E : c->vdim;
    double *Q = calloc((size_t)(L * E), 8), *K = calloc((size_t)(S2 * E), 8), *V = calloc((size_t)(S2 * E), 8);
    double *C = calloc((size_t)(L * E), 8), s[64];
    double total = 0;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t r = 0; r < L; r++)
            for (int64_t e = 0; e < E; e++) {
                double a = c->bias ? x->b_in[e] : 0;
                for (int64_t i = 0; i < E; i++) a += x->q[(n * L + r) * E + i] * x->wq[e * E + i];
                Q[r * E + e] = a / div;
            }
        for (int64_t r = 0; r < S; r++)
            for (int64_t e = 0; e < E; e++) {
                double a = c->bias ? x->b_in[E + e] : 0, b = c->bias ? x->b_in[2 * E + e] : 0;
                for (int64_t i = 0; i < kd; i++) a += kin[(n * S + r) * kd + i] * x->wk[e * kd + i];
                for (int64_t i = 0; i < vd; i++) b += vin[(n * S + r) * vd + i] * x->wv[e * vd + i];
                K[r * E + e] = a, V[r * E + e] = b;
            }
        for (int64_t e = 0; e < E; e++) {
            if (c->bias_kv) K[S * E + e] = x->bias_k[e], V[S * E + e] = x->bias_v[e];
            if (c->zero_attn) K[(S2 - 1) * E + e] = 0, V[(S2 - 1) * E + e] = 0;
        }
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++) {
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < S2; j++) {
                    bool hidden = false;
                    double bias = 0;
                    if (j < S) { // masks cover the real keys only
                        if (c->mask == 1) hidden = x->mask_b[i * S + j];
                        if (c->mask == 2) bias += x->mask_f[((n * H + h) * L + i) * S + j];
                        if (c->mask == 3) hidden = j > i;
                        if (c->kpm == 1) hidden = hidden || x->kpm_b[n * S + j];
                        if (c->kpm == 2) bias += x->kpm_f[n * S + j];
                    }
                    if (hidden || bias == -INFINITY) {
                        s[j] = -INFINITY;
                        continue;
                    }
                    double dot = 0;
                    for (int64_t t = 0; t < hd; t++) dot += Q[i * E + h * hd + t] * K[j * E + h * hd + t];
                    s[j] = dot + bias;
                    if (s[j] > mx) mx = s[j];
                }
                for (int64_t t = 0; t < hd; t++) C[i * E + h * hd + t] = 0;
                if (mx == -INFINITY) continue;
                for (int64_t j = 0; j < S2; j++) sum += s[j] == -INFINITY ? 0 : exp(s[j] - mx);
                for (int64_t j = 0; j < S2; j++) {
                    if (s[j] == -INFINITY) continue;
                    double w = exp(s[j] - mx) / sum;
                    if (c->dropout > 0) w *= x->keep[((n * H + h) * L + i) * S2 + j] * drop;
                    for (int64_t t = 0; t < hd; t++) C[i * E + h * hd + t] += w * V[j * E + h * hd + t];
                }
            }
        for (int64_t r = 0; r < L; r++)
            for (int64_t e = 0; e < E; e++) {
                double a = c->bias ? x->bo[e] : 0;
                for (int64_t i = 0; i < E; i++) a += C[r * E + i] * x->wo[e * E + i];
                total += a * x->g[(n * L + r) * E + e];
            }
    }
    free(Q), free(K), free(V), free(C);
    return total;
}

static void fd(const mcase *c, vars *x, double *p, int64_t n, double *grad) {
    const double h = 1e-4;
    for (int64_t i = 0; i < n; i++) {
        const double keep = p[i];
        p[i] = keep + h;
        const double up = mha_loss(c, x);
        p[i] = keep - h;
        const double down = mha_loss(c, x);
        p[i] = keep;
        grad[i] = (up - down) / (2 * h);
    }
}

static float *to_f32(const double *x, int64_t n) {
    float *y = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}

static void close_enough(const char *what, const float *got, const double *want, int64_t n) {
    double scale = 1e-3, worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= worst)) worst = e, at = i;
    }
    harness_checks++;
    if (!(worst <= 3e-4 * scale + 1e-5))
        FAIL("%s: |got - finite difference| = %.3g at [%lld] (got %.7g, want %.7g, largest %.3g)", what, worst,
             (long long)at, (double)got[at], want[at], scale);
}

static void check_mha(const mcase *c, uint32_t seed, attn_isa isa) {
    const int64_t N = c->N, L = c->L, S = c->S, E = c->E, H = c->H, S2 = S2_of(c);
    const int64_t kd = c->self ? E : c->kdim, vd = c->self ? E : c->vdim;
    const bool separate = kd != E || vd != E;
    vars x;
    memset(&x, 0, sizeof x);
    x.wq = rnd(E * E, &seed, 0.5), x.wk = rnd(E * kd, &seed, 0.5), x.wv = rnd(E * vd, &seed, 0.5);
    x.b_in = rnd(3 * E, &seed, 0.3), x.bias_k = rnd(E, &seed, 0.5), x.bias_v = rnd(E, &seed, 0.5);
    x.wo = rnd(E * E, &seed, 0.5), x.bo = rnd(E, &seed, 0.3);
    x.q = rnd(N * L * E, &seed, 1), x.k = rnd(N * S * kd, &seed, 1), x.v = rnd(N * S * vd, &seed, 1);
    x.mask_f = malloc((size_t)(N * H * L * S) * 4), x.mask_b = malloc((size_t)(L * S));
    x.kpm_f = malloc((size_t)(N * S) * 4), x.kpm_b = malloc((size_t)(N * S));
    x.g = malloc((size_t)(N * L * E) * 4), x.keep = malloc((size_t)(N * H * L * S2) * 4);
    for (int64_t i = 0; i < N * H * L * S; i++) x.mask_f[i] = rand_unit_d(&seed) < 0.15 ? -INFINITY : (float)(rand_unit_d(&seed) - 0.5);
    for (int64_t i = 0; i < L * S; i++) x.mask_b[i] = i % S != 0 && rand_unit_d(&seed) < 0.3;
    for (int64_t i = 0; i < N * S; i++) x.kpm_b[i] = i % S != 1 && rand_unit_d(&seed) < 0.3, x.kpm_f[i] = (float)(rand_unit_d(&seed) - 0.5);
    for (int64_t i = 0; i < N * L * E; i++) x.g[i] = (float)(2 * rand_unit_d(&seed) - 1);
    attn_generator gen;
    attn_generator_seed(&gen, 4321);
    if (c->dropout > 0) attn_rand_bernoulli(&gen, x.keep, N * H * L * S2, 1.0 - c->dropout);

    // the module from the same (float) values
    float *fw_in = malloc((size_t)(3 * E * E) * 4), *fwk = to_f32(x.wk, E * kd), *fwv = to_f32(x.wv, E * vd);
    float *fwq = to_f32(x.wq, E * E), *fb = to_f32(x.b_in, 3 * E), *fbk = to_f32(x.bias_k, E), *fbv = to_f32(x.bias_v, E);
    float *fwo = to_f32(x.wo, E * E), *fbo = to_f32(x.bo, E);
    memcpy(fw_in, fwq, (size_t)(E * E) * 4);
    if (!separate) memcpy(fw_in + E * E, fwk, (size_t)(E * E) * 4), memcpy(fw_in + 2 * E * E, fwv, (size_t)(E * E) * 4);
    attn_tensor t[8];
    int nt = 0;
    if (separate) {
        t[nt++] = (attn_tensor){"q_proj_weight", ATTN_DTYPE_F32, 2, {E, E}, fwq};
        t[nt++] = (attn_tensor){"k_proj_weight", ATTN_DTYPE_F32, 2, {E, kd}, fwk};
        t[nt++] = (attn_tensor){"v_proj_weight", ATTN_DTYPE_F32, 2, {E, vd}, fwv};
    } else {
        t[nt++] = (attn_tensor){"in_proj_weight", ATTN_DTYPE_F32, 2, {3 * E, E}, fw_in};
    }
    if (c->bias) t[nt++] = (attn_tensor){"in_proj_bias", ATTN_DTYPE_F32, 1, {3 * E}, fb};
    if (c->bias_kv) {
        t[nt++] = (attn_tensor){"bias_k", ATTN_DTYPE_F32, 3, {1, 1, E}, fbk};
        t[nt++] = (attn_tensor){"bias_v", ATTN_DTYPE_F32, 3, {1, 1, E}, fbv};
    }
    t[nt++] = (attn_tensor){"out_proj.weight", ATTN_DTYPE_F32, 2, {E, E}, fwo};
    if (c->bias) t[nt++] = (attn_tensor){"out_proj.bias", ATTN_DTYPE_F32, 1, {E}, fbo};
    attn_tensor_list state = {nt, t};
    attn_ctx_params cp;
    attn_ctx_params_init(&cp);
    cp.isa = isa, cp.n_threads = 2;
    attn_ctx *ctx;
    ASSERT_OK(attn_ctx_create(&cp, &ctx));
    attn_mha_config extra;
    attn_mha_config_init(&extra, 1, 1);
    extra.add_zero_attn = c->zero_attn, extra.batch_first = 1, extra.dropout = c->dropout;
    attn_mha *m;
    ASSERT_OK(attn_mha_create_from_state(ctx, &state, H, &extra, &m));
    float *fq = to_f32(x.q, N * L * E), *fk = to_f32(x.k, N * S * kd), *fv = to_f32(x.v, N * S * vd);
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = fq, a.key = c->self ? NULL : fk, a.value = c->self ? NULL : fv;
    a.batch = N, a.len_q = L, a.len_kv = S, a.need_weights = 0, a.training = c->dropout > 0;
    if (c->mask == 1) a.attn_mask = x.mask_b, a.attn_mask_dtype = ATTN_DTYPE_BOOL, a.attn_mask_ndim = 2;
    if (c->mask == 2) a.attn_mask = x.mask_f, a.attn_mask_dtype = ATTN_DTYPE_F32, a.attn_mask_ndim = 3;
    if (c->mask == 3) a.causal = 1;
    if (c->kpm == 1) a.key_padding_mask = x.kpm_b, a.key_padding_mask_dtype = ATTN_DTYPE_BOOL;
    if (c->kpm == 2) a.key_padding_mask = x.kpm_f, a.key_padding_mask_dtype = ATTN_DTYPE_F32;
    size_t saved_size;
    ASSERT_OK(attn_mha_saved_size(ctx, m, &a, &saved_size));
    void *saved = malloc(saved_size);
    float *out = malloc((size_t)(N * L * E) * 4);
    attn_generator_seed(attn_ctx_generator(ctx), 4321);
    ASSERT_OK(attn_mha_forward_train(ctx, m, &a, out, NULL, saved, saved_size));
    // gradients in state_dict order
    float *dp[8] = {0}, *dq = malloc((size_t)(N * L * E) * 4), *dk = malloc((size_t)(N * S * kd) * 4),
          *dv = malloc((size_t)(N * S * vd) * 4);
    for (int i = 0; i < nt; i++) dp[i] = malloc((size_t)attn_tensor_numel(&t[i]) * 4);
    ASSERT_OK(attn_mha_backward(ctx, m, &a, saved, saved_size, x.g, dq, c->self ? NULL : dk, c->self ? NULL : dv, dp));
    // finite differences of each variable, compared with its gradient
    double *gbuf = malloc((size_t)(3 * E * E + N * L * E + N * S * (kd + vd)) * 8);
    const char *isa_name = attn_isa_name(isa);
    char what[96];
    int idx = 0;
    if (separate) {
        fd(c, &x, x.wq, E * E, gbuf), snprintf(what, sizeof what, "%s q_proj_weight", isa_name);
        close_enough(what, dp[idx++], gbuf, E * E);
        fd(c, &x, x.wk, E * kd, gbuf), close_enough("k_proj_weight", dp[idx++], gbuf, E * kd);
        fd(c, &x, x.wv, E * vd, gbuf), close_enough("v_proj_weight", dp[idx++], gbuf, E * vd);
    } else {
        fd(c, &x, x.wq, E * E, gbuf), fd(c, &x, x.wk, E * E, gbuf + E * E), fd(c, &x, x.wv, E * E, gbuf + 2 * E * E);
        snprintf(what, sizeof what, "%s in_proj_weight", isa_name);
        close_enough(what, dp[idx++], gbuf, 3 * E * E);
    }
    if (c->bias) fd(c, &x, x.b_in, 3 * E, gbuf), close_enough("in_proj_bias", dp[idx++], gbuf, 3 * E);
    if (c->bias_kv) {
        fd(c, &x, x.bias_k, E, gbuf), close_enough("bias_k", dp[idx++], gbuf, E);
        fd(c, &x, x.bias_v, E, gbuf), close_enough("bias_v", dp[idx++], gbuf, E);
    }
    fd(c, &x, x.wo, E * E, gbuf), close_enough("out_proj.weight", dp[idx++], gbuf, E * E);
    if (c->bias) fd(c, &x, x.bo, E, gbuf), close_enough("out_proj.bias", dp[idx++], gbuf, E);
    fd(c, &x, x.q, N * L * E, gbuf), close_enough(c->self ? "query (sum of three paths)" : "query", dq, gbuf, N * L * E);
    if (!c->self) {
        fd(c, &x, x.k, N * S * kd, gbuf), close_enough("key", dk, gbuf, N * S * kd);
        fd(c, &x, x.v, N * S * vd, gbuf), close_enough("value", dv, gbuf, N * S * vd);
    }
    for (int i = 0; i < nt; i++) free(dp[i]);
    free(gbuf), free(dq), free(dk), free(dv), free(saved), free(out), free(fq), free(fk), free(fv);
    free(fw_in), free(fwq), free(fwk), free(fwv), free(fb), free(fbk), free(fbv), free(fwo), free(fbo);
    free(x.wq), free(x.wk), free(x.wv), free(x.b_in), free(x.bias_k), free(x.bias_v), free(x.wo), free(x.bo);
    free(x.q), free(x.k), free(x.v), free(x.mask_f), free(x.mask_b), free(x.kpm_f), free(x.kpm_b), free(x.g), free(x.keep);
    attn_mha_free(m);
    attn_ctx_free(ctx);
}

static void test_mha_finite_differences(void) {
    const mcase cases[] = {
        {2, 3, 4, 4, 2, 4, 4, 1, 0, 0, 0, 0, 0, 0.0},   // plain cross-attention
        {2, 3, 3, 4, 2, 4, 4, 1, 0, 0, 1, 3, 0, 0.0},   // self-attention, causal: dquery sums three paths
        {1, 3, 4, 6, 3, 2, 5, 1, 0, 0, 0, 1, 1, 0.0},   // kdim/vdim, bool mask, bool kpm
        {2, 3, 4, 4, 2, 4, 4, 1, 1, 1, 0, 2, 2, 0.0},   // bias_kv + zero_attn, float 3-D mask, float kpm
        {2, 4, 4, 4, 1, 4, 4, 0, 1, 0, 1, 3, 0, 0.0},   // no bias, bias_kv with causal (widened)
        {2, 3, 5, 4, 2, 4, 4, 1, 0, 1, 0, 0, 1, 0.4},   // dropout, zero_attn, kpm
    };
    const attn_isa isas[3] = {ATTN_ISA_REF, ATTN_ISA_AVX2, ATTN_ISA_AVX512};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int i = 0; i < 3; i++)
            if (attn_isa_supported(isas[i])) check_mha(&cases[c], 7u + 13u * (uint32_t)c, isas[i]);
    check_mha(&cases[3], 99u, ATTN_ISA_GENERIC);
}

static void test_backward_errors(void) {
    attn_ctx *ctx;
    ASSERT_OK(attn_ctx_create(NULL, &ctx));
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, 4, 2);
    attn_mha *m, *other;
    ASSERT_OK(attn_mha_create(ctx, &cfg, &m));
    cfg.embed_dim = 8;
    ASSERT_OK(attn_mha_create(ctx, &cfg, &other));
    float x[3 * 2 * 4] = {0}, out[24], g[24], dq[24], dk[24];
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = x, a.batch = 2, a.len_q = 3, a.need_weights = 0;
    size_t n;
    ASSERT_OK(attn_mha_saved_size(ctx, m, &a, &n));
    char *saved = malloc(n);
    ASSERT_STATUS(attn_mha_forward_train(ctx, m, &a, out, NULL, saved, n - 1), ATTN_ERR_WORKSPACE);
    ASSERT_STATUS(attn_mha_backward(ctx, m, &a, saved, n, g, dq, NULL, NULL, NULL), ATTN_ERR_INVALID_ARG); // not filled
    ASSERT_OK(attn_mha_forward_train(ctx, m, &a, out, NULL, saved, n));
    ASSERT_OK(attn_mha_backward(ctx, m, &a, saved, n, g, dq, NULL, NULL, NULL));
    ASSERT_STATUS(attn_mha_backward(ctx, m, &a, saved, n, g, dq, dk, NULL, NULL), ATTN_ERR_INVALID_ARG); // key is query
    ASSERT_STATUS(attn_mha_backward(ctx, m, &a, saved, n, NULL, dq, NULL, NULL, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_mha_backward(ctx, m, &a, saved, n - 1, g, dq, NULL, NULL, NULL), ATTN_ERR_INVALID_ARG);
    attn_mha_args b = a;
    b.len_q = 2;
    ASSERT_STATUS(attn_mha_backward(ctx, m, &b, saved, n, g, dq, NULL, NULL, NULL), ATTN_ERR_INVALID_ARG); // other args
    free(saved);
    attn_mha_free(m), attn_mha_free(other);
    attn_ctx_free(ctx);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_mha_finite_differences),
        HARNESS_CASE(test_backward_errors),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

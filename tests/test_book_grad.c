// test_book_grad.c - the backward of the book's trainable modules (SelfAttention_v1/v2,
// CausalAttention, MultiHeadAttentionWrapper, the weight-split MultiHeadAttention) against finite
// differences of a double-precision forward written here from the Python classes: x projected by
// raw matrices (v1) or nn.Linear layers, scores q k^T masked by the causal triangle, softmax of
// scores / sqrt(d_k), dropout on the weights with the forward's mask, context = weights V, the
// wrapper's heads concatenated, out_proj for the weight-split module. Every parameter's gradient
// (state_dict names) and dx, which sums x's three uses and, for the wrapper, the heads.
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"
#include "test_data.h"

typedef struct bcase {
    attn_book_kind kind;
    int64_t batch, n, d_in, d_out, heads;
    int bias;
    double dropout;
} bcase;

// The loss's variables in double: the module's parameters (state_dict order) and x.
typedef struct model {
    const bcase *c;
    int np;
    const char *names[16];
    double *p[16];
    int64_t numel[16];
    double *x;      // (batch, n, d_in)
    float *keep;    // dropout keep mask (groups, batch, heads per group, n, n)
    float *g;       // dL/dout (batch, n, out_features)
} model;


static int64_t groups(const bcase *c) { return c->kind == ATTN_BOOK_MHA_WRAPPER ? c->heads : 1; }
static int64_t heads_per_group(const bcase *c) { return c->kind == ATTN_BOOK_MHA ? c->heads : 1; }
static int64_t out_features(const bcase *c) { return groups(c) * c->d_out; }
static bool causal(const bcase *c) { return c->kind >= ATTN_BOOK_CAUSAL_ATTENTION; }

static const double *param(const model *m, const char *name) {
    for (int i = 0; i < m->np; i++)
        if (strcmp(m->names[i], name) == 0) return m->p[i];
    return NULL;
}

// y (n, d_out) = x (n, d_in) projected by parameter `base` of group g (+ its bias when present).
static void project(const model *m, int64_t g, const char *proj, const double *x, double *y) {
    const bcase *c = m->c;
    char name[64], prefix[32] = "";
    if (c->kind == ATTN_BOOK_MHA_WRAPPER) snprintf(prefix, sizeof prefix, "heads.%lld.", (long long)g);
    const bool raw = c->kind == ATTN_BOOK_SELF_ATTENTION_V1; // (d_in, d_out), x @ W
    snprintf(name, sizeof name, "%s%s%s", prefix, proj, raw ? "" : ".weight");
    const double *W = param(m, name);
    snprintf(name, sizeof name, "%s%s.bias", prefix, proj);
    const double *b = param(m, name);
    for (int64_t r = 0; r < c->n; r++)
        for (int64_t o = 0; o < c->d_out; o++) {
            double a = b != NULL ? b[o] : 0.0;
            for (int64_t i = 0; i < c->d_in; i++) a += x[r * c->d_in + i] * (raw ? W[i * c->d_out + o] : W[o * c->d_in + i]);
            y[r * c->d_out + o] = a;
        }
}

static double loss(const model *m) {
    const bcase *c = m->c;
    const int64_t n = c->n, E = c->d_out, Hg = heads_per_group(c), hd = E / Hg, F = out_features(c);
    const double drop = c->dropout > 0 ? (double)(1.0f / (float)(1.0 - c->dropout)) : 1.0;
    double *Q = malloc((size_t)(n * E) * 8), *K = malloc((size_t)(n * E) * 8), *V = malloc((size_t)(n * E) * 8);
    double *C = malloc((size_t)(n * E) * 8), *out = calloc((size_t)(n * F), 8), s[64];
    double total = 0;
    for (int64_t b = 0; b < c->batch; b++) {
        const double *xb = m->x + b * n * c->d_in;
        for (int64_t g = 0; g < groups(c); g++) {
            project(m, g, "W_query", xb, Q), project(m, g, "W_key", xb, K), project(m, g, "W_value", xb, V);
            for (int64_t h = 0; h < Hg; h++)
                for (int64_t i = 0; i < n; i++) {
                    double mx = -INFINITY, sum = 0;
                    for (int64_t j = 0; j < n; j++) {
                        double dot = 0;
                        for (int64_t t = 0; t < hd; t++) dot += Q[i * E + h * hd + t] * K[j * E + h * hd + t];
                        s[j] = causal(c) && j > i ? -INFINITY : dot / sqrt((double)hd);
                        if (s[j] > mx) mx = s[j];
                    }
                    for (int64_t j = 0; j < n; j++) sum += exp(s[j] - mx);
                    for (int64_t t = 0; t < hd; t++) C[i * E + h * hd + t] = 0;
                    for (int64_t j = 0; j < n; j++) {
                        double w = exp(s[j] - mx) / sum;
                        if (c->dropout > 0) w *= m->keep[(((g * c->batch + b) * Hg + h) * n + i) * n + j] * drop;
                        for (int64_t t = 0; t < hd; t++) C[i * E + h * hd + t] += w * V[j * E + h * hd + t];
                    }
                }
            for (int64_t r = 0; r < n; r++)
                for (int64_t e = 0; e < E; e++) out[r * F + g * E + e] = C[r * E + e];
        }
        if (c->kind == ATTN_BOOK_MHA) { // out_proj
            const double *Wo = param(m, "out_proj.weight"), *bo = param(m, "out_proj.bias");
            for (int64_t r = 0; r < n; r++) {
                for (int64_t e = 0; e < E; e++) C[r * E + e] = out[r * F + e];
                for (int64_t e = 0; e < E; e++) {
                    double a = bo[e];
                    for (int64_t i = 0; i < E; i++) a += C[r * E + i] * Wo[e * E + i];
                    out[r * F + e] = a;
                }
            }
        }
        for (int64_t i = 0; i < n * F; i++) total += out[i] * m->g[b * n * F + i];
    }
    free(Q), free(K), free(V), free(C), free(out);
    return total;
}

static void finite_differences(const model *m, double *v, int64_t count, double *grad) {
    const double h = 1e-4;
    for (int64_t i = 0; i < count; i++) {
        const double keep = v[i];
        v[i] = keep + h;
        const double up = loss(m);
        v[i] = keep - h;
        const double down = loss(m);
        v[i] = keep;
        grad[i] = (up - down) / (2 * h);
    }
}

static void close_enough(const char *what, const float *got, const double *want, int64_t n) {
    double scale = 1e-3, worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - want[i]);
        if (!(e <= worst)) worst = e, at = i;
    }
    harness_checks++;
    if (!(worst <= 3e-4 * scale + 1e-5))
        FAIL("%s: |got - finite difference| = %.3g at [%lld] (got %.7g, want %.7g, largest %.3g)", what, worst,
             (long long)at, (double)got[at], want[at], scale);
}

static attn_status create(attn_ctx *ctx, const bcase *c, attn_book **b) {
    const int64_t ctx_len = c->n + 2;
    switch (c->kind) {
    case ATTN_BOOK_SELF_ATTENTION_V1: return attn_book_self_attention_v1(ctx, c->d_in, c->d_out, b);
    case ATTN_BOOK_SELF_ATTENTION_V2: return attn_book_self_attention_v2(ctx, c->d_in, c->d_out, c->bias, b);
    case ATTN_BOOK_CAUSAL_ATTENTION:
        return attn_book_causal_attention(ctx, c->d_in, c->d_out, ctx_len, c->dropout, c->bias, b);
    case ATTN_BOOK_MHA_WRAPPER:
        return attn_book_mha_wrapper(ctx, c->d_in, c->d_out, ctx_len, c->dropout, c->heads, c->bias, b);
    default: return attn_book_mha(ctx, c->d_in, c->d_out, ctx_len, c->dropout, c->heads, c->bias, b);
    }
}

static void check_book(const bcase *c, uint32_t seed, attn_isa isa) {
    attn_ctx_params cp;
    attn_ctx_params_init(&cp);
    cp.isa = isa, cp.n_threads = 2, cp.seed = seed;
    attn_ctx *ctx;
    ASSERT_OK(attn_ctx_create(&cp, &ctx));
    attn_book *bk;
    ASSERT_OK(create(ctx, c, &bk));
    const int64_t n = c->n, F = out_features(c), nx = c->batch * n * c->d_in;
    model m = {.c = c, .np = attn_book_param_count(bk)};
    ASSERT_TRUE(m.np <= 16);
    float *fp[16];
    for (int i = 0; i < m.np; i++) {
        int ndim;
        int64_t shape[2];
        ASSERT_OK(attn_book_param_at(bk, i, &m.names[i], &ndim, shape, &fp[i]));
        m.numel[i] = ndim == 2 ? shape[0] * shape[1] : shape[0];
        m.p[i] = malloc((size_t)m.numel[i] * 8);
        for (int64_t j = 0; j < m.numel[i]; j++) m.p[i][j] = fp[i][j];
    }
    float *x = malloc((size_t)nx * 4), *out = malloc((size_t)(c->batch * n * F) * 4);
    m.x = malloc((size_t)nx * 8);
    for (int64_t i = 0; i < nx; i++) x[i] = (float)(2 * rand_unit_d(&seed) - 1), m.x[i] = x[i];
    m.g = malloc((size_t)(c->batch * n * F) * 4);
    for (int64_t i = 0; i < c->batch * n * F; i++) m.g[i] = (float)(2 * rand_unit_d(&seed) - 1);
    const int64_t nkeep = groups(c) * c->batch * heads_per_group(c) * n * n;
    m.keep = malloc((size_t)nkeep * 4);
    // the module's dropout draws: F.dropout on each group's (batch, heads, n, n) weights in turn
    attn_generator gen;
    attn_generator_seed(&gen, 2024);
    if (c->dropout > 0) ASSERT_OK(attn_rand_bernoulli(&gen, m.keep, nkeep, 1.0 - c->dropout));
    attn_generator_seed(attn_ctx_generator(ctx), 2024);

    const int training = c->dropout > 0;
    size_t saved_size;
    ASSERT_OK(attn_book_saved_size(ctx, bk, c->batch, n, &saved_size));
    void *saved = malloc(saved_size);
    ASSERT_OK(attn_book_forward_train(ctx, bk, x, c->batch, n, training, out, NULL, saved, saved_size));
    float *dx = malloc((size_t)nx * 4), *dp[16];
    for (int i = 0; i < m.np; i++) dp[i] = malloc((size_t)m.numel[i] * 4);
    ASSERT_OK(attn_book_backward(ctx, bk, x, c->batch, n, training, saved, saved_size, m.g, dx, dp));

    double *want = malloc((size_t)(nx > 256 ? nx : 256) * 8);
    char what[128];
    for (int i = 0; i < m.np; i++) {
        finite_differences(&m, m.p[i], m.numel[i], want);
        snprintf(what, sizeof what, "kind %d %s: %s", (int)c->kind, attn_isa_name(isa), m.names[i]);
        close_enough(what, dp[i], want, m.numel[i]);
    }
    finite_differences(&m, m.x, nx, want);
    snprintf(what, sizeof what, "kind %d %s: dx", (int)c->kind, attn_isa_name(isa));
    close_enough(what, dx, want, nx);

    // the same gradients from a moved copy of `saved`, and with only dx asked for
    void *moved = malloc(saved_size);
    memcpy(moved, saved, saved_size);
    memset(saved, 0, saved_size);
    float *dx2 = malloc((size_t)nx * 4);
    ASSERT_OK(attn_book_backward(ctx, bk, x, c->batch, n, training, moved, saved_size, m.g, dx2, NULL));
    ASSERT_BITS_EQ(dx, dx2, nx);

    for (int i = 0; i < m.np; i++) free(m.p[i]), free(dp[i]);
    free(x), free(out), free(m.x), free(m.g), free(m.keep), free(saved), free(moved), free(dx), free(dx2), free(want);
    attn_book_free(bk);
    attn_ctx_free(ctx);
}

static void test_book_finite_differences(void) {
    const bcase cases[] = {
        {ATTN_BOOK_SELF_ATTENTION_V1, 1, 4, 3, 2, 1, 0, 0.0},
        {ATTN_BOOK_SELF_ATTENTION_V2, 1, 4, 3, 2, 1, 1, 0.0},
        {ATTN_BOOK_CAUSAL_ATTENTION, 2, 5, 3, 2, 1, 0, 0.0},
        {ATTN_BOOK_CAUSAL_ATTENTION, 2, 5, 3, 2, 1, 1, 0.3},
        {ATTN_BOOK_MHA_WRAPPER, 2, 4, 3, 2, 2, 1, 0.25},
        {ATTN_BOOK_MHA, 2, 4, 3, 4, 2, 1, 0.0},
        {ATTN_BOOK_MHA, 2, 5, 3, 4, 2, 0, 0.2},
    };
    const attn_isa isas[3] = {ATTN_ISA_REF, ATTN_ISA_AVX2, ATTN_ISA_AVX512};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int i = 0; i < 3; i++)
            if (attn_isa_supported(isas[i])) check_book(&cases[c], 11u + 7u * (uint32_t)c, isas[i]);
    check_book(&cases[4], 5u, ATTN_ISA_GENERIC);
}

static void test_book_backward_errors(void) {
    attn_ctx *ctx;
    ASSERT_OK(attn_ctx_create(NULL, &ctx));
    attn_book *m;
    ASSERT_OK(attn_book_causal_attention(ctx, 3, 2, 4, 0.0, 0, &m));
    float x[2 * 4 * 3] = {0}, out[16], g[16] = {0}, dx[24];
    size_t n;
    ASSERT_STATUS(attn_book_saved_size(ctx, m, 2, 5, &n), ATTN_ERR_CONTEXT_LENGTH);
    ASSERT_STATUS(attn_book_saved_size(ctx, m, 2, 4, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_OK(attn_book_saved_size(ctx, m, 2, 4, &n));
    char *saved = malloc(n + 16);
    ASSERT_STATUS(attn_book_forward_train(ctx, m, x, 2, 4, 0, out, NULL, saved, n - 1), ATTN_ERR_WORKSPACE);
    ASSERT_STATUS(attn_book_forward_train(ctx, m, x, 2, 4, 0, out, NULL, NULL, n), ATTN_ERR_WORKSPACE);
    ASSERT_STATUS(attn_book_forward_train(ctx, m, x, 2, 4, 0, out, NULL, saved + 4, n), ATTN_ERR_INVALID_ARG);
    ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "aligned") != NULL);
    memset(saved, 0, n);
    ASSERT_STATUS(attn_book_backward(ctx, m, x, 2, 4, 0, saved, n, g, dx, NULL), ATTN_ERR_INVALID_ARG); // not filled
    ASSERT_OK(attn_book_forward_train(ctx, m, x, 2, 4, 0, out, NULL, saved, n));
    ASSERT_OK(attn_book_backward(ctx, m, x, 2, 4, 0, saved, n, g, dx, NULL));
    ASSERT_STATUS(attn_book_backward(ctx, m, x, 2, 4, 0, saved, n, NULL, dx, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_book_backward(ctx, m, x, 2, 4, 0, saved, n - 1, g, dx, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_book_backward(ctx, m, x, 1, 4, 0, saved, n, g, dx, NULL), ATTN_ERR_INVALID_ARG); // other batch
    ASSERT_STATUS(attn_book_backward(ctx, m, x, 2, 3, 0, saved, n, g, dx, NULL), ATTN_ERR_INVALID_ARG); // other length
    ASSERT_STATUS(attn_book_backward(ctx, NULL, x, 2, 4, 0, saved, n, g, dx, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_TRUE(attn_ctx_last_error(ctx)[0] != '\0');
    free(saved);
    attn_book_free(m);
    attn_ctx_free(ctx);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_book_finite_differences),
        HARNESS_CASE(test_book_backward_errors),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

// test_mha.c - nn.MultiheadAttention: state_dict names and shapes, construction, the equivalences
// between its input forms (packed vs separate weights, batch_first, unbatched, causal vs mask,
// omitted key/value), dropout in training mode, and argument errors. Numerical agreement with
// PyTorch itself is checked by tests/parity/mha_parity.py.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"

static attn_ctx *new_ctx(uint64_t seed) {
    attn_ctx *ctx = NULL;
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.seed = seed;
    if (attn_ctx_create(&p, &ctx) != ATTN_OK) FAIL("attn_ctx_create failed");
    return ctx;
}

static float *randn(attn_ctx *ctx, int64_t n) {
    float *x = malloc((size_t)n * sizeof(float));
    if (x == NULL || attn_rand_normal(attn_ctx_generator(ctx), x, n, 0.0, 1.0) != ATTN_OK) FAIL("randn failed");
    return x;
}

static float *alloc_f(int64_t n) {
    float *x = calloc((size_t)n, sizeof(float));
    if (x == NULL) FAIL("out of memory");
    return x;
}

static attn_mha *new_mha(attn_ctx *ctx, int64_t E, int64_t H, int64_t kdim, int64_t vdim, int bias, int bias_kv,
                         int zero_attn, int batch_first) {
    attn_mha_config c;
    attn_mha_config_init(&c, E, H);
    c.kdim = kdim, c.vdim = vdim, c.bias = bias, c.add_bias_kv = bias_kv, c.add_zero_attn = zero_attn;
    c.batch_first = batch_first;
    attn_mha *m = NULL;
    ASSERT_OK(attn_mha_create(ctx, &c, &m));
    // non-zero biases so that they matter
    for (int i = 0; i < attn_mha_param_count(m); i++) {
        const char *name;
        int nd;
        int64_t sh[3];
        float *data;
        ASSERT_OK(attn_mha_param_at(m, i, &name, &nd, sh, &data));
        if (strcmp(name, "in_proj_bias") == 0 || strcmp(name, "out_proj.bias") == 0)
            attn_rand_normal(attn_ctx_generator(ctx), data, sh[0], 0.0, 1.0);
    }
    return m;
}

// ---- state_dict --------------------------------------------------------------------------------

static void expect_params(attn_mha *m, int n, const char *const *names, const int64_t (*shapes)[3]) {
    ASSERT_EQ_INT(attn_mha_param_count(m), n);
    for (int i = 0; i < n; i++) {
        const char *name;
        int nd;
        int64_t sh[3];
        ASSERT_OK(attn_mha_param_at(m, i, &name, &nd, sh, NULL));
        if (strcmp(name, names[i]) != 0) FAIL("parameter %d is %s, expected %s", i, name, names[i]);
        for (int d = 0; d < 3; d++) ASSERT_EQ_INT(sh[d], shapes[i][d]);
    }
}

static void test_state_dict_names_and_shapes(void) {
    attn_ctx *ctx = new_ctx(1);
    attn_mha *m = new_mha(ctx, 8, 2, 0, 0, 1, 0, 0, 0);
    expect_params(m, 4, (const char *const[]){"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"},
                  (const int64_t[][3]){{24, 8, 0}, {24, 0, 0}, {8, 8, 0}, {8, 0, 0}});
    attn_mha_free(m);
    m = new_mha(ctx, 8, 2, 0, 0, 0, 0, 0, 0);
    expect_params(m, 2, (const char *const[]){"in_proj_weight", "out_proj.weight"},
                  (const int64_t[][3]){{24, 8, 0}, {8, 8, 0}});
    attn_mha_free(m);
    m = new_mha(ctx, 8, 2, 0, 0, 1, 1, 0, 0);
    expect_params(m, 6,
                  (const char *const[]){"in_proj_weight", "in_proj_bias", "bias_k", "bias_v", "out_proj.weight",
                                        "out_proj.bias"},
                  (const int64_t[][3]){{24, 8, 0}, {24, 0, 0}, {1, 1, 8}, {1, 1, 8}, {8, 8, 0}, {8, 0, 0}});
    attn_mha_free(m);
    m = new_mha(ctx, 8, 2, 5, 3, 1, 0, 0, 0);
    expect_params(m, 6,
                  (const char *const[]){"q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias",
                                        "out_proj.weight", "out_proj.bias"},
                  (const int64_t[][3]){{8, 8, 0}, {8, 5, 0}, {8, 3, 0}, {24, 0, 0}, {8, 8, 0}, {8, 0, 0}});
    attn_mha_free(m);
    // kdim = vdim = E is the packed layout, as in PyTorch
    m = new_mha(ctx, 8, 2, 8, 8, 1, 0, 0, 0);
    ASSERT_OK(attn_mha_param(m, "in_proj_weight", NULL, NULL, NULL));
    ASSERT_STATUS(attn_mha_param(m, "q_proj_weight", NULL, NULL, NULL), ATTN_ERR_NOT_FOUND);
    attn_mha_free(m);
    attn_ctx_free(ctx);
}

static void test_biases_start_at_zero(void) {
    attn_ctx *ctx = new_ctx(3);
    attn_mha_config c;
    attn_mha_config_init(&c, 6, 3);
    attn_mha *m;
    ASSERT_OK(attn_mha_create(ctx, &c, &m));
    float *b, *ob;
    int64_t sh[3];
    ASSERT_OK(attn_mha_param(m, "in_proj_bias", NULL, sh, &b));
    for (int i = 0; i < 18; i++) ASSERT_TRUE(b[i] == 0.0f);
    ASSERT_OK(attn_mha_param(m, "out_proj.bias", NULL, sh, &ob));
    for (int i = 0; i < 6; i++) ASSERT_TRUE(ob[i] == 0.0f);
    float *w;
    ASSERT_OK(attn_mha_param(m, "in_proj_weight", NULL, sh, &w));
    double bound = sqrt(3.0) * sqrt(2.0 / (6 + 18)); // xavier_uniform_ on (3E, E)
    int nonzero = 0;
    for (int i = 0; i < 18 * 6; i++) {
        ASSERT_TRUE(fabs(w[i]) <= bound);
        nonzero += w[i] != 0.0f;
    }
    ASSERT_TRUE(nonzero > 100);
    attn_mha_free(m);
    attn_ctx_free(ctx);
}

// ---- equivalences ------------------------------------------------------------------------------

typedef struct run_out {
    float *out, *w;
} run_out;

static run_out run(attn_ctx *ctx, attn_mha *m, const attn_mha_args *a, int64_t n_out, int64_t n_w) {
    run_out r = {alloc_f(n_out), a->need_weights ? alloc_f(n_w) : NULL};
    ASSERT_OK(attn_mha_forward(ctx, m, a, r.out, r.w));
    return r;
}

static void free_run(run_out *r) {
    free(r->out);
    free(r->w);
}

static void test_separate_weights_equal_packed(void) {
    attn_ctx *ctx = new_ctx(5);
    const int64_t E = 8, H = 2, L = 5, S = 7, N = 3;
    attn_mha *packed = new_mha(ctx, E, H, 0, 0, 1, 0, 0, 0);
    float *w, *b, *wo, *bo;
    int64_t sh[3];
    attn_mha_param(packed, "in_proj_weight", NULL, sh, &w);
    attn_mha_param(packed, "in_proj_bias", NULL, sh, &b);
    attn_mha_param(packed, "out_proj.weight", NULL, sh, &wo);
    attn_mha_param(packed, "out_proj.bias", NULL, sh, &bo);
    attn_tensor t[6] = {
        {"q_proj_weight", ATTN_DTYPE_F32, 2, {E, E}, w},
        {"k_proj_weight", ATTN_DTYPE_F32, 2, {E, E}, w + E * E},
        {"v_proj_weight", ATTN_DTYPE_F32, 2, {E, E}, w + 2 * E * E},
        {"in_proj_bias", ATTN_DTYPE_F32, 1, {3 * E}, b},
        {"out_proj.weight", ATTN_DTYPE_F32, 2, {E, E}, wo},
        {"out_proj.bias", ATTN_DTYPE_F32, 1, {E}, bo},
    };
    attn_tensor_list state = {6, t};
    attn_mha *sep;
    ASSERT_OK(attn_mha_create_from_state(ctx, &state, H, NULL, &sep));
    ASSERT_STATUS(attn_mha_param(sep, "in_proj_weight", NULL, NULL, NULL), ATTN_ERR_NOT_FOUND);
    float *q = randn(ctx, L * N * E), *k = randn(ctx, S * N * E), *v = randn(ctx, S * N * E);
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = q, a.key = k, a.value = v, a.batch = N, a.len_q = L, a.len_kv = S;
    run_out r1 = run(ctx, packed, &a, L * N * E, N * L * S), r2 = run(ctx, sep, &a, L * N * E, N * L * S);
    ASSERT_BITS_EQ(r1.out, r2.out, L * N * E);
    ASSERT_BITS_EQ(r1.w, r2.w, N * L * S);
    free_run(&r1), free_run(&r2);
    free(q), free(k), free(v);
    attn_mha_free(packed), attn_mha_free(sep);
    attn_ctx_free(ctx);
}

// (N, L, E) with batch_first equals (L, N, E) without it; unbatched equals a batch of one.
static void test_layouts_agree(void) {
    attn_ctx *ctx = new_ctx(6);
    const int64_t E = 6, H = 3, L = 4, S = 5, N = 2;
    attn_mha *m = new_mha(ctx, E, H, 0, 0, 1, 1, 1, 0);
    attn_mha_config bf_cfg = *attn_mha_get_config(m);
    float *q = randn(ctx, L * N * E), *k = randn(ctx, S * N * E), *v = randn(ctx, S * N * E);
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = q, a.key = k, a.value = v, a.batch = N, a.len_q = L, a.len_kv = S;
    const int64_t S2 = attn_mha_weights_len_kv(m, S);
    ASSERT_EQ_INT(S2, S + 2);
    run_out r = run(ctx, m, &a, L * N * E, N * L * S2);

    // the same module with batch_first: rebuild from its own state
    attn_tensor t[8];
    for (int i = 0; i < attn_mha_param_count(m); i++) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].dtype = ATTN_DTYPE_F32;
        attn_mha_param_at(m, i, (const char **)&t[i].name, &t[i].ndim, t[i].shape, (float **)&t[i].data);
    }
    attn_tensor_list state = {attn_mha_param_count(m), t};
    bf_cfg.batch_first = 1;
    attn_mha *mbf;
    ASSERT_OK(attn_mha_create_from_state(ctx, &state, H, &bf_cfg, &mbf));
    float *qt = alloc_f(L * N * E), *kt = alloc_f(S * N * E), *vt = alloc_f(S * N * E);
    for (int64_t n = 0; n < N; n++) {
        for (int64_t l = 0; l < L; l++) memcpy(qt + (n * L + l) * E, q + (l * N + n) * E, (size_t)E * sizeof(float));
        for (int64_t s = 0; s < S; s++) {
            memcpy(kt + (n * S + s) * E, k + (s * N + n) * E, (size_t)E * sizeof(float));
            memcpy(vt + (n * S + s) * E, v + (s * N + n) * E, (size_t)E * sizeof(float));
        }
    }
    attn_mha_args b = a;
    b.query = qt, b.key = kt, b.value = vt;
    run_out rb = run(ctx, mbf, &b, L * N * E, N * L * S2);
    for (int64_t n = 0; n < N; n++)
        for (int64_t l = 0; l < L; l++) ASSERT_BITS_EQ(rb.out + (n * L + l) * E, r.out + (l * N + n) * E, E);
    ASSERT_BITS_EQ(rb.w, r.w, N * L * S2);

    // unbatched: batch element 1 alone, as (L, E)
    float *q1 = alloc_f(L * E), *k1 = alloc_f(S * E), *v1 = alloc_f(S * E);
    memcpy(q1, qt + L * E, (size_t)(L * E) * sizeof(float));
    memcpy(k1, kt + S * E, (size_t)(S * E) * sizeof(float));
    memcpy(v1, vt + S * E, (size_t)(S * E) * sizeof(float));
    attn_mha_args u = a;
    u.query = q1, u.key = k1, u.value = v1, u.unbatched = 1, u.batch = 0;
    run_out ru = run(ctx, m, &u, L * E, L * S2);
    ASSERT_BITS_EQ(ru.out, rb.out + L * E, L * E);
    ASSERT_BITS_EQ(ru.w, rb.w + L * S2, L * S2);

    free_run(&r), free_run(&rb), free_run(&ru);
    free(q), free(k), free(v), free(qt), free(kt), free(vt), free(q1), free(k1), free(v1);
    attn_mha_free(m), attn_mha_free(mbf);
    attn_ctx_free(ctx);
}

// causal = a bool triu(ones(L, S), 1) attn_mask, also when bias_k and the zero key widen S.
static void test_causal_equals_triu_mask(void) {
    attn_ctx *ctx = new_ctx(7);
    const int64_t E = 4, H = 2, L = 5, N = 2;
    for (int extra = 0; extra < 2; extra++) {
        attn_mha *m = new_mha(ctx, E, H, 0, 0, 1, extra, extra, 0);
        float *x = randn(ctx, L * N * E);
        uint8_t mask[5 * 5];
        for (int i = 0; i < L; i++)
            for (int j = 0; j < L; j++) mask[i * L + j] = j > i;
        attn_mha_args a, b;
        attn_mha_args_init(&a);
        a.query = a.key = a.value = x, a.batch = N, a.len_q = a.len_kv = L;
        b = a;
        a.causal = 1;
        b.attn_mask = mask, b.attn_mask_dtype = ATTN_DTYPE_BOOL, b.attn_mask_ndim = 2;
        const int64_t S2 = attn_mha_weights_len_kv(m, L);
        run_out r1 = run(ctx, m, &a, L * N * E, N * L * S2), r2 = run(ctx, m, &b, L * N * E, N * L * S2);
        ASSERT_BITS_EQ(r1.out, r2.out, L * N * E);
        ASSERT_BITS_EQ(r1.w, r2.w, N * L * S2);
        if (extra) // the appended keys stay visible to every query, as in PyTorch's padded mask
            for (int64_t i = 0; i < N * L; i++) ASSERT_TRUE(r1.w[i * S2 + L] > 0.0f);
        free_run(&r1), free_run(&r2), free(x);
        attn_mha_free(m);
    }
    attn_ctx_free(ctx);
}

// key omitted = key is the query; value omitted = value is the key.
static void test_omitted_key_and_value(void) {
    attn_ctx *ctx = new_ctx(8);
    const int64_t E = 6, H = 2, L = 3, N = 2;
    attn_mha *m = new_mha(ctx, E, H, 0, 0, 1, 0, 0, 0);
    float *x = randn(ctx, L * N * E);
    float *xc = alloc_f(L * N * E);
    memcpy(xc, x, (size_t)(L * N * E) * sizeof(float));
    attn_mha_args a, b;
    attn_mha_args_init(&a);
    a.query = x, a.batch = N, a.len_q = L;
    b = a;
    b.key = xc, b.value = xc, b.len_kv = L;
    run_out r1 = run(ctx, m, &a, L * N * E, N * L * L), r2 = run(ctx, m, &b, L * N * E, N * L * L);
    ASSERT_BITS_EQ(r1.out, r2.out, L * N * E);
    free_run(&r1), free_run(&r2), free(x), free(xc);
    attn_mha_free(m);
    attn_ctx_free(ctx);
}

// Per-head weights average to the averaged weights; rows sum to one without dropout.
static void test_weights_per_head_and_average(void) {
    attn_ctx *ctx = new_ctx(9);
    const int64_t E = 6, H = 3, L = 4, S = 5, N = 2;
    attn_mha *m = new_mha(ctx, E, H, 0, 0, 1, 0, 0, 1);
    float *q = randn(ctx, N * L * E), *kv = randn(ctx, N * S * E);
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = q, a.key = a.value = kv, a.batch = N, a.len_q = L, a.len_kv = S;
    run_out avg = run(ctx, m, &a, N * L * E, N * L * S);
    a.average_attn_weights = 0;
    run_out per = run(ctx, m, &a, N * L * E, N * H * L * S);
    ASSERT_BITS_EQ(avg.out, per.out, N * L * E);
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < L * S; i++) {
            float acc = per.w[(n * H) * L * S + i];
            for (int64_t h = 1; h < H; h++) acc += per.w[(n * H + h) * L * S + i];
            ASSERT_TRUE(harness_f32_bits(acc / (float)H) == harness_f32_bits(avg.w[n * L * S + i]));
        }
    for (int64_t r = 0; r < N * H * L; r++) {
        double s = 0;
        for (int64_t j = 0; j < S; j++) s += per.w[r * S + j];
        ASSERT_TRUE(fabs(s - 1.0) < 1e-6);
    }
    a.need_weights = 0; // the fused kernels (asking for weights runs the reference): equal to rounding
    run_out none = run(ctx, m, &a, N * L * E, 0);
    ASSERT_CLOSE(none.out, avg.out, N * L * E, 1e-6, 1e-5);
    free_run(&avg), free_run(&per), free_run(&none), free(q), free(kv);
    attn_mha_free(m);
    attn_ctx_free(ctx);
}

static void test_dropout_only_in_training(void) {
    attn_ctx *ctx = new_ctx(10);
    const int64_t E = 4, H = 2, L = 6, N = 1;
    attn_mha_config c;
    attn_mha_config_init(&c, E, H);
    c.dropout = 0.5;
    attn_mha *m;
    ASSERT_OK(attn_mha_create(ctx, &c, &m));
    float *x = randn(ctx, L * N * E);
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = x, a.batch = N, a.len_q = L, a.average_attn_weights = 0;
    run_out eval = run(ctx, m, &a, L * N * E, N * H * L * L);
    int zeros = 0;
    for (int64_t i = 0; i < N * H * L * L; i++) zeros += eval.w[i] == 0.0f;
    ASSERT_EQ_INT(zeros, 0);
    a.training = 1;
    attn_generator_seed(attn_ctx_generator(ctx), 42);
    run_out t1 = run(ctx, m, &a, L * N * E, N * H * L * L);
    attn_generator_seed(attn_ctx_generator(ctx), 42);
    run_out t2 = run(ctx, m, &a, L * N * E, N * H * L * L);
    ASSERT_BITS_EQ(t1.out, t2.out, L * N * E); // same seed, same mask
    zeros = 0;
    for (int64_t i = 0; i < N * H * L * L; i++) {
        zeros += t1.w[i] == 0.0f;
        if (t1.w[i] != 0.0f) ASSERT_TRUE(harness_f32_bits(t1.w[i]) == harness_f32_bits(eval.w[i] * 2.0f));
    }
    ASSERT_TRUE(zeros > 10 && zeros < 62);
    free_run(&eval), free_run(&t1), free_run(&t2), free(x);
    attn_mha_free(m);
    attn_ctx_free(ctx);
}

// ---- errors ------------------------------------------------------------------------------------

static void test_config_errors(void) {
    attn_ctx *ctx = new_ctx(0);
    attn_mha_config c;
    attn_mha *m = (attn_mha *)1;
    attn_mha_config_init(&c, 10, 3);
    ASSERT_STATUS(attn_mha_create(ctx, &c, &m), ATTN_ERR_BAD_SHAPE);
    ASSERT_TRUE(m == NULL);
    ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "divisible") != NULL);
    attn_mha_config_init(&c, 0, 1);
    ASSERT_STATUS(attn_mha_create(ctx, &c, &m), ATTN_ERR_BAD_SHAPE);
    attn_mha_config_init(&c, 4, -2);
    ASSERT_STATUS(attn_mha_create(ctx, &c, &m), ATTN_ERR_BAD_SHAPE);
    attn_mha_config_init(&c, 4, 2);
    c.kdim = -1;
    ASSERT_STATUS(attn_mha_create(ctx, &c, &m), ATTN_ERR_BAD_SHAPE);
    attn_mha_config_init(&c, 4, 2);
    c.dropout = 1.5;
    ASSERT_STATUS(attn_mha_create(ctx, &c, &m), ATTN_ERR_INVALID_ARG);
    attn_mha_config_init(&c, INT64_MAX / 2, 1);
    ASSERT_STATUS(attn_mha_create(ctx, &c, &m), ATTN_ERR_OVERFLOW);
    ASSERT_STATUS(attn_mha_create(ctx, NULL, &m), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_mha_create(NULL, &c, &m), ATTN_ERR_INVALID_ARG);
    attn_mha_free(NULL);
    attn_ctx_free(ctx);
}

static void test_forward_errors(void) {
    attn_ctx *ctx = new_ctx(0);
    const int64_t E = 4, H = 2, L = 3, S = 5, N = 2;
    attn_mha *m = new_mha(ctx, E, H, 0, 6, 1, 0, 0, 0); // vdim 6
    float q[3 * 2 * 4], k[5 * 2 * 4], v[5 * 2 * 6], out[3 * 2 * 4], w[2 * 3 * 5];
    memset(q, 0, sizeof q), memset(k, 0, sizeof k), memset(v, 0, sizeof v);
    attn_mha_args good, a;
    attn_mha_args_init(&good);
    good.query = q, good.key = k, good.value = v, good.batch = N, good.len_q = L, good.len_kv = S;
    ASSERT_OK(attn_mha_forward(ctx, m, &good, out, w));
    ASSERT_STATUS(attn_mha_forward(ctx, m, &good, out, NULL), ATTN_ERR_INVALID_ARG); // need_weights, no buffer
    ASSERT_STATUS(attn_mha_forward(ctx, m, &good, NULL, w), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_mha_forward(ctx, NULL, &good, out, w), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_mha_forward(ctx, m, NULL, out, w), ATTN_ERR_INVALID_ARG);
    a = good, a.need_weights = 0;
    ASSERT_STATUS(attn_mha_forward(ctx, m, &a, out, w), ATTN_ERR_INVALID_ARG); // buffer, no need_weights
    a = good, a.query = NULL;
    ASSERT_STATUS(attn_mha_forward(ctx, m, &a, out, w), ATTN_ERR_INVALID_ARG);
    a = good, a.value = NULL; // value = key, but vdim != kdim
    ASSERT_STATUS(attn_mha_forward(ctx, m, &a, out, w), ATTN_ERR_BAD_SHAPE);
    a = good, a.len_q = 0;
    ASSERT_STATUS(attn_mha_forward(ctx, m, &a, out, w), ATTN_ERR_BAD_SHAPE);
    a = good, a.batch = -1;
    ASSERT_STATUS(attn_mha_forward(ctx, m, &a, out, w), ATTN_ERR_BAD_SHAPE);
    uint8_t mask[3 * 5] = {0};
    a = good, a.attn_mask = mask, a.attn_mask_dtype = ATTN_DTYPE_BOOL, a.attn_mask_ndim = 2, a.causal = 1;
    ASSERT_STATUS(attn_mha_forward(ctx, m, &a, out, w), ATTN_ERR_INVALID_ARG);
    a = good, a.attn_mask = mask, a.attn_mask_dtype = ATTN_DTYPE_I64, a.attn_mask_ndim = 2;
    ASSERT_STATUS(attn_mha_forward(ctx, m, &a, out, w), ATTN_ERR_BAD_MASK);
    a = good, a.attn_mask = mask, a.attn_mask_dtype = ATTN_DTYPE_BOOL, a.attn_mask_ndim = 4;
    ASSERT_STATUS(attn_mha_forward(ctx, m, &a, out, w), ATTN_ERR_BAD_MASK);
    a = good, a.key_padding_mask = mask, a.key_padding_mask_dtype = ATTN_DTYPE_F64;
    ASSERT_STATUS(attn_mha_forward(ctx, m, &a, out, w), ATTN_ERR_BAD_MASK);
    a = good, a.len_q = INT64_MAX / 4;
    ASSERT_STATUS(attn_mha_forward(ctx, m, &a, out, w), ATTN_ERR_OVERFLOW);
    attn_mha_free(m);
    attn_ctx_free(ctx);
}

static void test_state_errors(void) {
    attn_ctx *ctx = new_ctx(0);
    float w[12 * 4] = {0}, wo[16] = {0}, b[12] = {0}, bo[4] = {0}, bk[4] = {0};
    attn_tensor good[4] = {
        {"in_proj_weight", ATTN_DTYPE_F32, 2, {12, 4}, w},
        {"in_proj_bias", ATTN_DTYPE_F32, 1, {12}, b},
        {"out_proj.weight", ATTN_DTYPE_F32, 2, {4, 4}, wo},
        {"out_proj.bias", ATTN_DTYPE_F32, 1, {4}, bo},
    };
    attn_tensor t[5];
    attn_tensor_list st = {4, t};
    attn_mha *m;
    memcpy(t, good, sizeof good);
    ASSERT_OK(attn_mha_create_from_state(ctx, &st, 2, NULL, &m));
    ASSERT_EQ_INT(attn_mha_get_config(m)->bias, 1);
    attn_mha_free(m);
    ASSERT_STATUS(attn_mha_create_from_state(ctx, &st, 3, NULL, &m), ATTN_ERR_BAD_SHAPE); // 4 % 3
    memcpy(t, good, sizeof good), t[0].shape[0] = 11;
    ASSERT_STATUS(attn_mha_create_from_state(ctx, &st, 2, NULL, &m), ATTN_ERR_BAD_SHAPE);
    memcpy(t, good, sizeof good), t[1].dtype = ATTN_DTYPE_F64;
    ASSERT_STATUS(attn_mha_create_from_state(ctx, &st, 2, NULL, &m), ATTN_ERR_UNSUPPORTED);
    memcpy(t, good, sizeof good), t[2].name = "out_proj.wait";
    ASSERT_STATUS(attn_mha_create_from_state(ctx, &st, 2, NULL, &m), ATTN_ERR_INVALID_ARG);
    memcpy(t, good, sizeof good);
    st.count = 3; // out_proj.bias missing but in_proj_bias present
    ASSERT_STATUS(attn_mha_create_from_state(ctx, &st, 2, NULL, &m), ATTN_ERR_NOT_FOUND);
    memcpy(t, good, sizeof good);
    t[4] = (attn_tensor){"bias_k", ATTN_DTYPE_F32, 3, {1, 1, 4}, bk};
    st.count = 5; // bias_k without bias_v
    ASSERT_STATUS(attn_mha_create_from_state(ctx, &st, 2, NULL, &m), ATTN_ERR_NOT_FOUND);
    st.count = 2; // no out_proj.weight
    t[0] = good[0], t[1] = good[1];
    ASSERT_STATUS(attn_mha_create_from_state(ctx, &st, 2, NULL, &m), ATTN_ERR_NOT_FOUND);
    ASSERT_STATUS(attn_mha_create_from_state(ctx, NULL, 2, NULL, &m), ATTN_ERR_INVALID_ARG);
    attn_ctx_free(ctx);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_state_dict_names_and_shapes),
        HARNESS_CASE(test_biases_start_at_zero),
        HARNESS_CASE(test_separate_weights_equal_packed),
        HARNESS_CASE(test_layouts_agree),
        HARNESS_CASE(test_causal_equals_triu_mask),
        HARNESS_CASE(test_omitted_key_and_value),
        HARNESS_CASE(test_weights_per_head_and_average),
        HARNESS_CASE(test_dropout_only_in_training),
        HARNESS_CASE(test_config_errors),
        HARNESS_CASE(test_forward_errors),
        HARNESS_CASE(test_state_errors),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

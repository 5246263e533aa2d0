// test_golden.c - the seeds' six examples, (a)-(f), against PyTorch's values in golden.json
// (written by torch 1.13; see tests/golden/README.md). Parameters drawn from the seeded generator
// must equal PyTorch's bit for bit; computed tensors must agree to 1e-6.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"
#include "io/file.h"
#include "io/json.h"

static attn_ctx *ctx;
static attn__json_doc doc;
static const attn__json *example;

static const float inputs[6 * 3] = {0.43f, 0.15f, 0.89f, 0.55f, 0.87f, 0.66f, 0.57f, 0.85f, 0.64f,
                                    0.22f, 0.58f, 0.33f, 0.77f, 0.25f, 0.10f, 0.05f, 0.80f, 0.55f};

static void load(const char *name) {
    if (ctx == NULL) {
        if (attn_ctx_create(NULL, &ctx) != ATTN_OK) FAIL("attn_ctx_create");
        void *text;
        size_t size;
        if (attn__file_read_all(ctx, ATTN_TEST_DATA_DIR "/golden.json", 1 << 20, &text, &size) != ATTN_OK)
            FAIL("cannot read golden.json: %s", attn_ctx_last_error(ctx));
        attn_status st = attn__json_parse(ctx, text, size, NULL, &doc);
        attn__free(ctx, text);
        if (st != ATTN_OK) FAIL("golden.json: %s", attn_ctx_last_error(ctx));
    }
    example = attn__json_get(doc.root, name);
    if (example == NULL) FAIL("golden.json has no %s", name);
}

// The "float32" values of tensor `path` ("key" or "key/sub") within the current example, checked
// to have `n` elements. The caller frees the result.
static float *golden(const attn__json *obj, const char *key, int64_t n) {
    const attn__json *t = attn__json_get(attn__json_get(obj, key), "float32");
    if (t == NULL) FAIL("golden.json: no tensor %s", key);
    int64_t shape[ATTN_MAX_DIMS], numel = 1;
    int ndim;
    float *x;
    if (attn__json_to_f32(ctx, t, key, shape, &ndim, &x) != ATTN_OK) FAIL("%s: %s", key, attn_ctx_last_error(ctx));
    for (int i = 0; i < ndim; i++) numel *= shape[i];
    if (numel != n) FAIL("%s has %lld elements, expected %lld", key, (long long)numel, (long long)n);
    return x;
}

static void check_close(const attn__json *obj, const char *key, const float *got, int64_t n) {
    float *want = golden(obj, key, n);
    harness_assert_close(__FILE__, __LINE__, key, got, want, n, 1e-6, 0.0);
    attn__free(ctx, want);
}

static void check_bits(const attn__json *obj, const char *key, const float *got, int64_t n) {
    float *want = golden(obj, key, n);
    for (int64_t i = 0; i < n; i++)
        if (harness_f32_bits(got[i]) != harness_f32_bits(want[i]))
            FAIL("%s[%lld]: 0x%08x != PyTorch's 0x%08x", key, (long long)i, harness_f32_bits(got[i]),
                 harness_f32_bits(want[i]));
    harness_checks++;
    attn__free(ctx, want);
}

static float *book_param(attn_book *m, const char *name) {
    float *p;
    ASSERT_OK(attn_book_param(m, name, NULL, NULL, &p));
    return p;
}

// (a) torch.manual_seed(123); three torch.rand(3, 2); scores, weights, context.
static void test_a_rand_weights(void) {
    load("a_rand_weights_self_attention");
    attn_generator_seed(attn_ctx_generator(ctx), 123);
    attn_book *m;
    ASSERT_OK(attn_book_self_attention_v1(ctx, 3, 2, &m));
    const char *names[3][2] = {{"W_query", "queries"}, {"W_key", "keys"}, {"W_value", "values"}};
    float proj[3][12];
    for (int i = 0; i < 3; i++) {
        float *w = book_param(m, names[i][0]);
        check_bits(example, names[i][0], w, 6);
        ASSERT_OK(attn_linear(ctx, inputs, 6, 3, w, ATTN_WEIGHT_IN_OUT, NULL, 2, proj[i]));
        check_close(example, names[i][1], proj[i], 12);
    }
    float scores[36], weights[36], context[12];
    ASSERT_OK(attn_linear(ctx, proj[0], 6, 2, proj[1], ATTN_WEIGHT_OUT_IN, NULL, 6, scores));
    check_close(example, "attn_scores", scores, 36);
    ASSERT_OK(attn_book_forward(ctx, m, inputs, 1, 6, 0, context, weights));
    check_close(example, "attn_weights", weights, 36);
    check_close(example, "context", context, 12);
    const attn__json *x2 = attn__json_get(example, "x2_only");
    check_close(x2, "query_2", proj[0] + 2, 2);
    check_close(x2, "attn_scores_2", scores + 6, 6);
    check_close(x2, "attn_weights_2", weights + 6, 6);
    check_close(x2, "context_2", context + 2, 2);
    attn_book_free(m);
}

// (b) torch.manual_seed(789); SelfAttention_v2(3, 2).
static void test_b_linear_seed789(void) {
    load("b_linear_self_attention_seed789");
    attn_generator_seed(attn_ctx_generator(ctx), 789);
    attn_book *m;
    ASSERT_OK(attn_book_self_attention_v2(ctx, 3, 2, 0, &m));
    const char *names[3] = {"W_query.weight", "W_key.weight", "W_value.weight"};
    for (int i = 0; i < 3; i++) check_bits(example, names[i], book_param(m, names[i]), 6);
    float q[12], k[12], scores[36], weights[36], context[12];
    ASSERT_OK(attn_linear(ctx, inputs, 6, 3, book_param(m, names[0]), ATTN_WEIGHT_OUT_IN, NULL, 2, q));
    ASSERT_OK(attn_linear(ctx, inputs, 6, 3, book_param(m, names[1]), ATTN_WEIGHT_OUT_IN, NULL, 2, k));
    ASSERT_OK(attn_linear(ctx, q, 6, 2, k, ATTN_WEIGHT_OUT_IN, NULL, 6, scores));
    check_close(example, "attn_scores", scores, 36);
    ASSERT_OK(attn_book_forward(ctx, m, inputs, 1, 6, 0, context, weights));
    check_close(example, "attn_weights", weights, 36);
    check_close(example, "context", context, 12);
    attn_book_free(m);
}

// (c) torch.manual_seed(123); MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2) on a batch of 2.
static void test_c_wrapper_seed123(void) {
    load("c_two_causal_heads_concat_seed123");
    attn_generator_seed(attn_ctx_generator(ctx), 123);
    attn_book *m;
    ASSERT_OK(attn_book_mha_wrapper(ctx, 3, 2, 6, 0.0, 2, 0, &m));
    float batch[36], out[2 * 6 * 4], weights[2 * 2 * 36];
    memcpy(batch, inputs, sizeof inputs);
    memcpy(batch + 18, inputs, sizeof inputs);
    ASSERT_OK(attn_book_forward(ctx, m, batch, 2, 6, 0, out, weights));
    const attn__json *heads = attn__json_get(example, "heads");
    for (int h = 0; h < 2; h++) {
        const attn__json *head = attn__json_at(heads, (size_t)h);
        const char *names[3] = {"W_query.weight", "W_key.weight", "W_value.weight"};
        for (int i = 0; i < 3; i++) {
            char name[64];
            snprintf(name, sizeof name, "heads.%d.%s", h, names[i]);
            check_bits(head, names[i], book_param(m, name), 6);
        }
        float w_head[2 * 36], c_head[2 * 12];
        for (int b = 0; b < 2; b++) {
            memcpy(w_head + b * 36, weights + (b * 2 + h) * 36, 36 * sizeof(float));
            for (int t = 0; t < 6; t++) memcpy(c_head + (b * 6 + t) * 2, out + (b * 6 + t) * 4 + h * 2, 2 * sizeof(float));
        }
        check_close(head, "attn_weights", w_head, 72);
        check_close(head, "context", c_head, 24);
    }
    check_close(example, "context_concat", out, 48);
    attn_book_free(m);
}

// (d) torch.manual_seed(123); MultiHeadAttention(3, 2, 6, 0.0, num_heads=2).
static void test_d_weight_split_seed123(void) {
    load("d_split_weight_mha_causal_seed123");
    attn_generator_seed(attn_ctx_generator(ctx), 123);
    attn_book *m;
    ASSERT_OK(attn_book_mha(ctx, 3, 2, 6, 0.0, 2, 0, &m));
    const char *names[5] = {"W_query.weight", "W_key.weight", "W_value.weight", "out_proj.weight", "out_proj.bias"};
    const int64_t sizes[5] = {6, 6, 6, 4, 2};
    for (int i = 0; i < 5; i++) check_bits(example, names[i], book_param(m, names[i]), sizes[i]);
    float batch[36], out[24], weights[2 * 2 * 36];
    memcpy(batch, inputs, sizeof inputs);
    memcpy(batch + 18, inputs, sizeof inputs);
    ASSERT_OK(attn_book_forward(ctx, m, batch, 2, 6, 0, out, weights));
    check_close(example, "attn_weights", weights, 144);
    check_close(example, "output", out, 24);
    attn_book_free(m);
}

// (e) torch.manual_seed(1); q, k, v = torch.rand(1, 8, 4); torch.manual_seed(1);
// nn.MultiheadAttention(4, 2, bias=True, batch_first=True) with the causal bool mask.
static void test_e_multiheadattention_seed1(void) {
    load("e_nn_multiheadattention_causal_seed1");
    attn_generator *g = attn_ctx_generator(ctx);
    float q[32], k[32], v[32];
    attn_generator_seed(g, 1);
    ASSERT_OK(attn_rand_uniform(g, q, 32, 0.0, 1.0));
    ASSERT_OK(attn_rand_uniform(g, k, 32, 0.0, 1.0));
    ASSERT_OK(attn_rand_uniform(g, v, 32, 0.0, 1.0));
    check_bits(example, "q", q, 32);
    check_bits(example, "k", k, 32);
    check_bits(example, "v", v, 32);
    attn_generator_seed(g, 1);
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, 4, 2);
    cfg.batch_first = 1;
    attn_mha *m;
    ASSERT_OK(attn_mha_create(ctx, &cfg, &m));
    const char *names[4] = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
    const int64_t sizes[4] = {48, 12, 16, 4};
    for (int i = 0; i < 4; i++) {
        float *p;
        ASSERT_OK(attn_mha_param(m, names[i], NULL, NULL, &p));
        check_bits(example, names[i], p, sizes[i]);
    }
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = q, a.key = k, a.value = v, a.batch = 1, a.len_q = a.len_kv = 8, a.causal = 1, a.training = 1;
    float out[32], w_avg[64], w_heads[128];
    ASSERT_OK(attn_mha_forward(ctx, m, &a, out, w_avg));
    check_close(example, "output", out, 32);
    check_close(example, "attn_weights_avg", w_avg, 64);
    a.average_attn_weights = 0;
    ASSERT_OK(attn_mha_forward(ctx, m, &a, out, w_heads));
    check_close(example, "attn_weights_per_head", w_heads, 128);
    attn_mha_free(m);
}

// (f) torch.manual_seed(123); nn.Dropout(0.5)(torch.ones(6, 6)).
static void test_f_dropout_seed123(void) {
    load("f_dropout_ones_seed123");
    float ones[36], out[36];
    for (int i = 0; i < 36; i++) ones[i] = 1.0f;
    attn_generator g;
    attn_generator_seed(&g, 123);
    ASSERT_OK(attn_rand_dropout(&g, ones, out, 36, 0.5));
    check_bits(example, "output", out, 36);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_a_rand_weights),         HARNESS_CASE(test_b_linear_seed789),
        HARNESS_CASE(test_c_wrapper_seed123),      HARNESS_CASE(test_d_weight_split_seed123),
        HARNESS_CASE(test_e_multiheadattention_seed1), HARNESS_CASE(test_f_dropout_seed123),
    };
    int rc = harness_main(argc, argv, cases, HARNESS_COUNT(cases));
    attn__json_free(ctx, &doc);
    attn_ctx_free(ctx);
    return rc;
}

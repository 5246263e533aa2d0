// test_book.c - the book's attention modules: parameter names and shapes, the equivalences the
// chapter points at (v2 -> v1 weight transfer, tril + renormalise = -inf masking, the wrapper = the
// weight-split module with stacked weights and no output projection), the context_length limit,
// the simplified attention's two normalisations, and argument errors. The seeded examples'
// numbers are checked against PyTorch in test_golden.c.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"

static const float inputs[6 * 3] = {0.43f, 0.15f, 0.89f, 0.55f, 0.87f, 0.66f, 0.57f, 0.85f, 0.64f,
                                    0.22f, 0.58f, 0.33f, 0.77f, 0.25f, 0.10f, 0.05f, 0.80f, 0.55f};

static attn_ctx *new_ctx(uint64_t seed) {
    attn_ctx *ctx = NULL;
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.seed = seed;
    if (attn_ctx_create(&p, &ctx) != ATTN_OK) FAIL("attn_ctx_create failed");
    return ctx;
}

static float *param(attn_book *m, const char *name, int64_t *numel) {
    float *data;
    int nd;
    int64_t sh[2];
    if (attn_book_param(m, name, &nd, sh, &data) != ATTN_OK) FAIL("no parameter %s", name);
    if (numel) *numel = nd == 1 ? sh[0] : sh[0] * sh[1];
    return data;
}

static void test_parameter_names(void) {
    attn_ctx *ctx = new_ctx(1);
    attn_book *m;
    ASSERT_OK(attn_book_self_attention_v1(ctx, 3, 2, &m));
    ASSERT_EQ_INT(attn_book_param_count(m), 3);
    int nd;
    int64_t sh[2];
    const char *name;
    ASSERT_OK(attn_book_param_at(m, 1, &name, &nd, sh, NULL));
    ASSERT_TRUE(strcmp(name, "W_key") == 0 && nd == 2 && sh[0] == 3 && sh[1] == 2);
    attn_book_free(m);
    ASSERT_OK(attn_book_self_attention_v2(ctx, 3, 2, 1, &m));
    ASSERT_EQ_INT(attn_book_param_count(m), 6);
    ASSERT_OK(attn_book_param_at(m, 1, &name, &nd, sh, NULL));
    ASSERT_TRUE(strcmp(name, "W_query.bias") == 0 && nd == 1 && sh[0] == 2);
    ASSERT_OK(attn_book_param_at(m, 4, &name, &nd, sh, NULL));
    ASSERT_TRUE(strcmp(name, "W_value.weight") == 0 && nd == 2 && sh[0] == 2 && sh[1] == 3);
    attn_book_free(m);
    ASSERT_OK(attn_book_mha_wrapper(ctx, 3, 2, 6, 0.0, 3, 0, &m));
    ASSERT_EQ_INT(attn_book_param_count(m), 9);
    ASSERT_EQ_INT(attn_book_out_features(m), 6);
    ASSERT_OK(attn_book_param_at(m, 7, &name, NULL, NULL, NULL));
    ASSERT_TRUE(strcmp(name, "heads.2.W_key.weight") == 0);
    attn_book_free(m);
    ASSERT_OK(attn_book_mha(ctx, 3, 4, 6, 0.0, 2, 0, &m));
    ASSERT_EQ_INT(attn_book_param_count(m), 5);
    ASSERT_OK(attn_book_param_at(m, 3, &name, &nd, sh, NULL));
    ASSERT_TRUE(strcmp(name, "out_proj.weight") == 0 && sh[0] == 4 && sh[1] == 4);
    ASSERT_OK(attn_book_param_at(m, 4, &name, &nd, sh, NULL));
    ASSERT_TRUE(strcmp(name, "out_proj.bias") == 0 && sh[0] == 4);
    ASSERT_EQ_INT(attn_book_get_kind(m), ATTN_BOOK_MHA);
    attn_book_free(m);
    attn_ctx_free(ctx);
}

// The exercise: v1's W = v2's W^T gives the same outputs.
static void test_v2_to_v1_transfer(void) {
    attn_ctx *ctx = new_ctx(123);
    attn_book *v2, *v1;
    ASSERT_OK(attn_book_self_attention_v2(ctx, 3, 2, 0, &v2));
    ASSERT_OK(attn_book_self_attention_v1(ctx, 3, 2, &v1));
    float o1[12], o2[12];
    ASSERT_OK(attn_book_forward(ctx, v2, inputs, 1, 6, 0, o2, NULL));
    ASSERT_OK(attn_book_forward(ctx, v1, inputs, 1, 6, 0, o1, NULL));
    double diff = 0;
    for (int i = 0; i < 12; i++) diff = fmax(diff, fabs(o1[i] - o2[i]));
    ASSERT_TRUE(diff > 1e-3); // different random weights before the transfer
    ASSERT_OK(attn_book_transfer_v2_to_v1(v2, v1));
    ASSERT_OK(attn_book_forward(ctx, v1, inputs, 1, 6, 0, o1, NULL));
    ASSERT_CLOSE(o1, o2, 12, 1e-6, 0); // allclose(atol=1e-6), as the exercise checks
    ASSERT_STATUS(attn_book_transfer_v2_to_v1(v1, v2), ATTN_ERR_INVALID_ARG);
    attn_book *v1b;
    ASSERT_OK(attn_book_self_attention_v1(ctx, 3, 4, &v1b));
    ASSERT_STATUS(attn_book_transfer_v2_to_v1(v2, v1b), ATTN_ERR_BAD_SHAPE);
    attn_book_free(v1b), attn_book_free(v1), attn_book_free(v2);
    attn_ctx_free(ctx);
}

// Copies every parameter of `src` into `dst` (same names expected).
static void copy_params(attn_book *src, attn_book *dst) {
    for (int i = 0; i < attn_book_param_count(src); i++) {
        const char *name;
        float *data;
        int nd;
        int64_t sh[2];
        ASSERT_OK(attn_book_param_at(src, i, &name, &nd, sh, &data));
        int64_t n;
        float *d = param(dst, name, &n);
        memcpy(d, data, (size_t)n * sizeof(float));
    }
}

// tril(softmax) renormalised by row sums equals softmax with -inf above the diagonal.
static void test_tril_renormalise_equals_masking(void) {
    attn_ctx *ctx = new_ctx(789);
    attn_book *v2, *ca;
    ASSERT_OK(attn_book_self_attention_v2(ctx, 3, 2, 0, &v2));
    ASSERT_OK(attn_book_causal_attention(ctx, 3, 2, 6, 0.0, 0, &ca));
    copy_params(v2, ca);
    float o[12], w_full[36], w_causal[36], renorm[36];
    ASSERT_OK(attn_book_forward(ctx, v2, inputs, 1, 6, 0, o, w_full));
    ASSERT_OK(attn_book_forward(ctx, ca, inputs, 1, 6, 0, o, w_causal));
    for (int i = 0; i < 6; i++) {
        double sum = 0;
        for (int j = 0; j <= i; j++) sum += w_full[i * 6 + j];
        for (int j = 0; j < 6; j++) renorm[i * 6 + j] = j <= i ? (float)(w_full[i * 6 + j] / sum) : 0.0f;
    }
    ASSERT_CLOSE(w_causal, renorm, 36, 1e-7, 1e-6);
    for (int i = 0; i < 6; i++)
        for (int j = i + 1; j < 6; j++) ASSERT_TRUE(w_causal[i * 6 + j] == 0.0f);
    attn_book_free(v2), attn_book_free(ca);
    attn_ctx_free(ctx);
}

// The wrapper of H causal heads (d_out each) equals the weight-split module with d_out*H outputs,
// the heads' weights stacked, and an identity output projection.
static void test_wrapper_equals_weight_split(void) {
    attn_ctx *ctx = new_ctx(123);
    const int64_t H = 3, d_in = 3, d_out = 2, B = 2, T = 6;
    attn_book *wrap, *split;
    ASSERT_OK(attn_book_mha_wrapper(ctx, d_in, d_out, T, 0.0, H, 1, &wrap));
    ASSERT_OK(attn_book_mha(ctx, d_in, d_out * H, T, 0.0, H, 1, &split));
    static const char *const projs[3] = {"W_query", "W_key", "W_value"};
    for (int p = 0; p < 3; p++) {
        char name[64];
        snprintf(name, sizeof name, "%s.weight", projs[p]);
        float *W = param(split, name, NULL); // (H*d_out, d_in): head h's rows at h*d_out
        snprintf(name, sizeof name, "%s.bias", projs[p]);
        float *b = param(split, name, NULL);
        for (int64_t h = 0; h < H; h++) {
            snprintf(name, sizeof name, "heads.%lld.%s.weight", (long long)h, projs[p]);
            memcpy(W + h * d_out * d_in, param(wrap, name, NULL), (size_t)(d_out * d_in) * sizeof(float));
            snprintf(name, sizeof name, "heads.%lld.%s.bias", (long long)h, projs[p]);
            memcpy(b + h * d_out, param(wrap, name, NULL), (size_t)d_out * sizeof(float));
        }
    }
    float *wo = param(split, "out_proj.weight", NULL), *bo = param(split, "out_proj.bias", NULL);
    for (int64_t i = 0; i < d_out * H; i++) {
        bo[i] = 0.0f;
        for (int64_t j = 0; j < d_out * H; j++) wo[i * d_out * H + j] = i == j ? 1.0f : 0.0f;
    }
    float x[2 * 6 * 3];
    memcpy(x, inputs, sizeof inputs);
    memcpy(x + 18, inputs, sizeof inputs);
    x[20] = -1.5f; // make the two batch rows differ
    float o1[2 * 6 * 6], o2[2 * 6 * 6], w1[2 * 3 * 36], w2[2 * 3 * 36];
    ASSERT_OK(attn_book_forward(ctx, wrap, x, B, T, 0, o1, w1));
    ASSERT_OK(attn_book_forward(ctx, split, x, B, T, 0, o2, w2));
    ASSERT_BITS_EQ(o1, o2, B * T * d_out * H);
    ASSERT_BITS_EQ(w1, w2, B * H * T * T);
    attn_book_free(wrap), attn_book_free(split);
    attn_ctx_free(ctx);
}

static void test_context_length_limit(void) {
    attn_ctx *ctx = new_ctx(1);
    attn_book *m;
    ASSERT_OK(attn_book_causal_attention(ctx, 3, 2, 4, 0.0, 0, &m));
    float out[6 * 2];
    ASSERT_OK(attn_book_forward(ctx, m, inputs, 1, 4, 0, out, NULL));
    ASSERT_STATUS(attn_book_forward(ctx, m, inputs, 1, 5, 0, out, NULL), ATTN_ERR_CONTEXT_LENGTH);
    ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "context_length") != NULL);
    attn_book_free(m);
    ASSERT_OK(attn_book_mha(ctx, 3, 2, 4, 0.0, 2, 0, &m));
    ASSERT_STATUS(attn_book_forward(ctx, m, inputs, 1, 6, 0, out, NULL), ATTN_ERR_CONTEXT_LENGTH);
    attn_book_free(m);
    ASSERT_OK(attn_book_self_attention_v2(ctx, 3, 2, 0, &m)); // no context_length: any length
    ASSERT_OK(attn_book_forward(ctx, m, inputs, 1, 6, 0, out, NULL));
    attn_book_free(m);
    attn_ctx_free(ctx);
}

// Dropout in training mode follows the context's generator; eval ignores it.
static void test_causal_dropout(void) {
    attn_ctx *ctx = new_ctx(123);
    attn_book *m;
    ASSERT_OK(attn_book_causal_attention(ctx, 3, 2, 6, 0.5, 0, &m));
    float o[12], w_eval[36], w1[36], w2[36];
    ASSERT_OK(attn_book_forward(ctx, m, inputs, 1, 6, 0, o, w_eval));
    attn_generator_seed(attn_ctx_generator(ctx), 123);
    ASSERT_OK(attn_book_forward(ctx, m, inputs, 1, 6, 1, o, w1));
    attn_generator g;
    attn_generator_seed(&g, 123);
    ASSERT_OK(attn_rand_dropout(&g, w_eval, w2, 36, 0.5)); // torch.manual_seed(123); dropout(attn_weights)
    ASSERT_BITS_EQ(w1, w2, 36);
    attn_book_free(m);
    attn_ctx_free(ctx);
}

static void test_simple_attention(void) {
    attn_ctx *ctx = new_ctx(0);
    float s[36], w[36], c[18], ws[36], cs[18];
    ASSERT_OK(attn_simple_self_attention(ctx, inputs, 6, 3, ATTN_SIMPLE_SOFTMAX, s, w, c));
    ASSERT_OK(attn_simple_self_attention(ctx, inputs, 6, 3, ATTN_SIMPLE_SUM, NULL, ws, cs));
    for (int i = 0; i < 6; i++) {
        double sw = 0, ss = 0, ssum = 0;
        for (int j = 0; j < 6; j++) {
            double dot = 0;
            for (int t = 0; t < 3; t++) dot += (double)inputs[i * 3 + t] * inputs[j * 3 + t];
            ASSERT_TRUE(fabs(s[i * 6 + j] - dot) < 1e-6);
            sw += w[i * 6 + j];
            ss += ws[i * 6 + j];
            ssum += dot;
        }
        ASSERT_TRUE(fabs(sw - 1) < 1e-6 && fabs(ss - 1) < 1e-6);
        for (int j = 0; j < 6; j++) ASSERT_TRUE(fabs(ws[i * 6 + j] - s[i * 6 + j] / ssum) < 1e-7);
        for (int t = 0; t < 3; t++) {
            double acc = 0, acc2 = 0;
            for (int j = 0; j < 6; j++) acc += (double)w[i * 6 + j] * inputs[j * 3 + t], acc2 += (double)ws[i * 6 + j] * inputs[j * 3 + t];
            ASSERT_TRUE(fabs(c[i * 3 + t] - acc) < 1e-6 && fabs(cs[i * 3 + t] - acc2) < 1e-6);
        }
    }
    // the seeds' "journey" row: softmax weights and the sum-normalised ones
    const float want_soft[6] = {0.1385f, 0.2379f, 0.2333f, 0.1240f, 0.1082f, 0.1581f};
    const float want_sum[6] = {0.1455f, 0.2278f, 0.2249f, 0.1285f, 0.1077f, 0.1656f};
    ASSERT_CLOSE(w + 6, want_soft, 6, 5e-5, 0);
    ASSERT_CLOSE(ws + 6, want_sum, 6, 5e-5, 0);
    ASSERT_STATUS(attn_simple_self_attention(ctx, NULL, 6, 3, ATTN_SIMPLE_SUM, s, w, c), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_simple_self_attention(ctx, inputs, 0, 3, ATTN_SIMPLE_SUM, s, w, c), ATTN_ERR_BAD_SHAPE);
    ASSERT_STATUS(attn_simple_self_attention(ctx, inputs, 6, 3, (attn_simple_norm)4, s, w, c), ATTN_ERR_INVALID_ARG);
    attn_ctx_free(ctx);
}

static void test_errors(void) {
    attn_ctx *ctx = new_ctx(0);
    attn_book *m = NULL;
    ASSERT_STATUS(attn_book_mha(ctx, 3, 5, 6, 0.0, 2, 0, &m), ATTN_ERR_BAD_SHAPE); // 5 % 2
    ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "divisible") != NULL);
    ASSERT_STATUS(attn_book_self_attention_v1(ctx, 0, 2, &m), ATTN_ERR_BAD_SHAPE);
    ASSERT_STATUS(attn_book_causal_attention(ctx, 3, 2, 0, 0.0, 0, &m), ATTN_ERR_BAD_SHAPE);
    ASSERT_STATUS(attn_book_causal_attention(ctx, 3, 2, 6, -0.1, 0, &m), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_book_mha_wrapper(ctx, 3, 2, 6, 0.0, INT64_MAX, 0, &m), ATTN_ERR_OVERFLOW);
    ASSERT_STATUS(attn_book_self_attention_v2(NULL, 3, 2, 0, &m), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_book_self_attention_v2(ctx, 3, 2, 0, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_OK(attn_book_self_attention_v2(ctx, 3, 2, 0, &m));
    float out[12];
    ASSERT_STATUS(attn_book_forward(ctx, m, NULL, 1, 6, 0, out, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_book_forward(ctx, m, inputs, 0, 6, 0, out, NULL), ATTN_ERR_BAD_SHAPE);
    ASSERT_STATUS(attn_book_forward(ctx, m, inputs, 1, 6, 0, NULL, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_book_param(m, "W_nothing", NULL, NULL, NULL), ATTN_ERR_NOT_FOUND);
    ASSERT_STATUS(attn_book_param_at(m, 3, NULL, NULL, NULL, NULL), ATTN_ERR_INVALID_ARG);
    attn_book_free(m);
    attn_book_free(NULL);
    attn_ctx_free(ctx);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_parameter_names),       HARNESS_CASE(test_v2_to_v1_transfer),
        HARNESS_CASE(test_tril_renormalise_equals_masking), HARNESS_CASE(test_wrapper_equals_weight_split),
        HARNESS_CASE(test_context_length_limit),  HARNESS_CASE(test_causal_dropout),
        HARNESS_CASE(test_simple_attention),      HARNESS_CASE(test_errors),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

// test_errors.c - the general API contract: status strings, version, dtype helpers, context
// parameters, the allocator hook (every allocation goes through it, all is given back, a failing
// allocator gives ATTN_ERR_OUT_OF_MEMORY), NULL-safe frees, and attn_linear's checks.
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"

typedef struct counting {
    long allocs, frees, fail_after; // fail_after < 0: never fail
    size_t largest;
} counting;

static void *count_alloc(void *user, size_t size, size_t align) {
    counting *c = user;
    if (c->fail_after >= 0 && c->allocs >= c->fail_after) return NULL;
    c->allocs++;
    if (size > c->largest) c->largest = size;
    void *p = NULL;
    return posix_memalign(&p, align, size) == 0 ? p : NULL;
}

static void count_free(void *user, void *p) {
    counting *c = user;
    c->frees++;
    free(p);
}

static attn_ctx *counted_ctx(counting *c) {
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.allocator = (attn_allocator){count_alloc, count_free, c};
    attn_ctx *ctx = NULL;
    attn_status st = attn_ctx_create(&p, &ctx);
    if (st != ATTN_OK) return NULL;
    return ctx;
}

static void test_status_strings(void) {
    const char *seen[16] = {0};
    for (int s = ATTN_OK; s <= ATTN_ERR_DEVICE; s++) {
        const char *msg = attn_strerror((attn_status)s);
        ASSERT_TRUE(msg != NULL && strlen(msg) > 3);
        for (int t = 0; t < s; t++) ASSERT_TRUE(strcmp(seen[t], msg) != 0);
        seen[s] = msg;
    }
    ASSERT_TRUE(strcmp(attn_strerror((attn_status)999), "unknown status") == 0);
    // pinned values
    ASSERT_EQ_INT(ATTN_ERR_INVALID_ARG, 1);
    ASSERT_EQ_INT(ATTN_ERR_BAD_FILE, 11);
    ASSERT_EQ_INT(ATTN_ERR_CAPACITY, 12);
    ASSERT_EQ_INT(ATTN_ERR_DEVICE, 13);
}

static void test_version_and_dtypes(void) {
    ASSERT_EQ_INT(attn_version_number(), ATTN_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", ATTN_VERSION_MAJOR, ATTN_VERSION_MINOR, ATTN_VERSION_PATCH);
    ASSERT_TRUE(strcmp(attn_version_string(), want) == 0);
    ASSERT_EQ_INT(attn_dtype_size(ATTN_DTYPE_F32), 4);
    ASSERT_EQ_INT(attn_dtype_size(ATTN_DTYPE_BF16), 2);
    ASSERT_EQ_INT(attn_dtype_size(ATTN_DTYPE_I64), 8);
    ASSERT_EQ_INT(attn_dtype_size((attn_dtype)99), 0);
    ASSERT_TRUE(strcmp(attn_dtype_name(ATTN_DTYPE_BOOL), "BOOL") == 0);
    ASSERT_TRUE(strcmp(attn_dtype_name((attn_dtype)99), "?") == 0);
}

static void test_context_params(void) {
    attn_ctx *ctx = (attn_ctx *)1;
    attn_ctx_params p;
    ASSERT_STATUS(attn_ctx_create(NULL, NULL), ATTN_ERR_INVALID_ARG);
    attn_ctx_params_init(&p);
    p.n_threads = -1;
    ASSERT_STATUS(attn_ctx_create(&p, &ctx), ATTN_ERR_INVALID_ARG);
    ASSERT_TRUE(ctx == NULL);
    attn_ctx_params_init(&p);
    p.isa = (attn_isa)77;
    ASSERT_STATUS(attn_ctx_create(&p, &ctx), ATTN_ERR_INVALID_ARG);
    attn_ctx_params_init(&p);
    p.allocator.alloc = count_alloc; // alloc without free
    ASSERT_STATUS(attn_ctx_create(&p, &ctx), ATTN_ERR_INVALID_ARG);
    attn_ctx_params_init(&p);
    p.seed = 5 + (1ull << 32); // only the low 32 bits seed the generator, as torch.manual_seed
    ASSERT_OK(attn_ctx_create(&p, &ctx));
    attn_generator g;
    attn_generator_seed(&g, 5);
    ASSERT_EQ_U64(attn_generator_random(attn_ctx_generator(ctx)), attn_generator_random(&g));
    ASSERT_TRUE(strcmp(attn_ctx_last_error(ctx), "") == 0);
    ASSERT_STATUS(attn_ctx_set_workspace(NULL, NULL, 0), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_ctx_reserve(NULL, 10), ATTN_ERR_INVALID_ARG);
    ASSERT_TRUE(attn_ctx_generator(NULL) == NULL);
    ASSERT_TRUE(strcmp(attn_ctx_last_error(NULL), "") == 0);
    attn_ctx_free(ctx);
    attn_ctx_free(NULL);
}

// A whole session (module, forward, files) allocates only through the hook and frees everything.
static void test_allocator_hook_sees_everything(void) {
    counting c = {0, 0, -1, 0};
    attn_ctx *ctx = counted_ctx(&c);
    ASSERT_TRUE(ctx != NULL);
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, 8, 2);
    cfg.add_bias_kv = 1;
    attn_mha *m;
    ASSERT_OK(attn_mha_create(ctx, &cfg, &m));
    float x[5 * 3 * 8], out[5 * 3 * 8], w[3 * 5 * 6];
    ASSERT_OK(attn_rand_normal(attn_ctx_generator(ctx), x, 5 * 3 * 8, 0.0, 1.0));
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = x, a.batch = 3, a.len_q = 5, a.causal = 1;
    ASSERT_OK(attn_mha_forward(ctx, m, &a, out, w));
    attn_mha_free(m);
    attn_ctx_free(ctx);
    ASSERT_TRUE(c.allocs > 3);
    ASSERT_EQ_INT(c.allocs, c.frees);
}

// An allocator that always fails: creation reports ATTN_ERR_OUT_OF_MEMORY; one that fails later
// makes each call fail cleanly and leaves nothing allocated.
static void test_out_of_memory(void) {
    counting c = {0, 0, 0, 0};
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.allocator = (attn_allocator){count_alloc, count_free, &c};
    attn_ctx *ctx = (attn_ctx *)1;
    ASSERT_STATUS(attn_ctx_create(&p, &ctx), ATTN_ERR_OUT_OF_MEMORY);
    ASSERT_TRUE(ctx == NULL);
    c.fail_after = 1; // the context itself, then nothing
    ASSERT_OK(attn_ctx_create(&p, &ctx));
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, 4, 2);
    attn_mha *m = (attn_mha *)1;
    ASSERT_STATUS(attn_mha_create(ctx, &cfg, &m), ATTN_ERR_OUT_OF_MEMORY);
    ASSERT_TRUE(m == NULL);
    ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "allocate") != NULL);
    attn_book *b;
    ASSERT_STATUS(attn_book_self_attention_v2(ctx, 3, 2, 0, &b), ATTN_ERR_OUT_OF_MEMORY);
    float x[12] = {0}, o[12];
    ASSERT_STATUS(attn_simple_self_attention(ctx, x, 4, 3, ATTN_SIMPLE_SOFTMAX, NULL, NULL, o), ATTN_ERR_OUT_OF_MEMORY);
    attn_ctx_free(ctx);
    ASSERT_EQ_INT(c.allocs, c.frees);
}

// attn_sdpa_desc_check and attn_sdpa_varlen_desc_check: the checks of the entry points, shared by
// other backends; they accept element types the CPU kernels do not run (q and out in BF16).
static void test_sdpa_desc_checks(void) {
    attn_ctx *ctx;
    ASSERT_OK(attn_ctx_create(NULL, &ctx));
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = 2, d.n_heads = 4, d.n_kv_heads = 2, d.len_q = 3, d.len_kv = 5, d.head_dim = 8;
    attn_layout_strides(ATTN_LAYOUT_BHLD, 2, 4, 3, 8, d.q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, 2, 2, 5, 8, d.k_stride);
    memcpy(d.v_stride, d.k_stride, sizeof d.k_stride);
    memcpy(d.o_stride, d.q_stride, sizeof d.q_stride);
    ASSERT_OK(attn_sdpa_desc_check(ctx, &d));
    d.q_dtype = d.kv_dtype = d.out_dtype = ATTN_DTYPE_BF16;
    ASSERT_OK(attn_sdpa_desc_check(ctx, &d));
    d.n_kv_heads = 3;
    ASSERT_STATUS(attn_sdpa_desc_check(ctx, &d), ATTN_ERR_BAD_SHAPE);
    ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "n_kv_heads") != NULL);
    d.n_kv_heads = 2, d.out_dtype = ATTN_DTYPE_I32;
    ASSERT_STATUS(attn_sdpa_desc_check(ctx, &d), ATTN_ERR_INVALID_ARG);
    d.out_dtype = ATTN_DTYPE_BF16, d.o_stride[2] = 0;
    ASSERT_STATUS(attn_sdpa_desc_check(ctx, &d), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_sdpa_desc_check(ctx, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_sdpa_desc_check(NULL, &d), ATTN_ERR_INVALID_ARG);
    // packed: two sequences of 3 + 1 queries and 5 + 2 keys
    d.o_stride[2] = 8;
    const int64_t cu_q[3] = {0, 3, 4}, cu_k[3] = {0, 5, 7}, bad_k[3] = {0, 6, 7};
    ASSERT_OK(attn_sdpa_varlen_desc_check(ctx, &d, cu_q, cu_k));
    ASSERT_STATUS(attn_sdpa_varlen_desc_check(ctx, &d, cu_q, bad_k), ATTN_ERR_BAD_SHAPE);
    ASSERT_STATUS(attn_sdpa_varlen_desc_check(ctx, &d, NULL, cu_k), ATTN_ERR_INVALID_ARG);
    attn_ctx_free(ctx);
}

static void test_linear(void) {
    attn_ctx *ctx;
    ASSERT_OK(attn_ctx_create(NULL, &ctx));
    const float x[2 * 3] = {1, 2, 3, 4, 5, 6};
    const float w_oi[2 * 3] = {1, 0, -1, 0.5f, 0.5f, 0.5f}; // (out 2, in 3)
    const float w_io[3 * 2] = {1, 0.5f, 0, 0.5f, -1, 0.5f}; // the same map as (in 3, out 2)
    const float b[2] = {10, 20};
    float y1[4], y2[4];
    ASSERT_OK(attn_linear(ctx, x, 2, 3, w_oi, ATTN_WEIGHT_OUT_IN, b, 2, y1));
    ASSERT_OK(attn_linear(ctx, x, 2, 3, w_io, ATTN_WEIGHT_IN_OUT, b, 2, y2));
    const float want[4] = {1 - 3 + 10, 3 + 20, 4 - 6 + 10, 7.5f + 20};
    ASSERT_BITS_EQ(y1, want, 4);
    ASSERT_BITS_EQ(y2, want, 4);
    ASSERT_STATUS(attn_linear(NULL, x, 2, 3, w_oi, ATTN_WEIGHT_OUT_IN, b, 2, y1), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_linear(ctx, NULL, 2, 3, w_oi, ATTN_WEIGHT_OUT_IN, b, 2, y1), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_linear(ctx, x, 2, 3, w_oi, (attn_weight_layout)3, b, 2, y1), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_linear(ctx, x, 0, 3, w_oi, ATTN_WEIGHT_OUT_IN, b, 2, y1), ATTN_ERR_BAD_SHAPE);
    ASSERT_STATUS(attn_linear(ctx, x, INT64_MAX, 3, w_oi, ATTN_WEIGHT_OUT_IN, b, 2, y1), ATTN_ERR_OVERFLOW);
    attn_ctx_free(ctx);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_status_strings),       HARNESS_CASE(test_version_and_dtypes),
        HARNESS_CASE(test_context_params),       HARNESS_CASE(test_allocator_hook_sees_everything),
        HARNESS_CASE(test_out_of_memory),        HARNESS_CASE(test_linear),
        HARNESS_CASE(test_sdpa_desc_checks),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

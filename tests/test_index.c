// test_index.c - 64-bit index arithmetic and size checks: the offset and extent helpers used by
// every kernel are exact beyond 2^31 and detect overflow, and sizes whose buffers would overflow
// are rejected before anything is allocated.
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"
#include "internal.h"

static void test_offset_beyond_2_31(void) {
    const int64_t s[4] = {(int64_t)1 << 33, (int64_t)3 << 31, 5000000007LL, 1};
    ASSERT_EQ_INT(attn__offset4(s, 3, 2, 1, 7), 3 * ((int64_t)1 << 33) + 2 * ((int64_t)3 << 31) + 5000000007LL + 7);
    // (B, H, L, D) = (1, 1, 2^20, 2^12): the last element sits at 2^32 - 1
    int64_t st[4];
    ASSERT_OK(attn_layout_strides(ATTN_LAYOUT_BHLD, 1, 1, (int64_t)1 << 20, (int64_t)1 << 12, st));
    ASSERT_EQ_INT(attn__offset4(st, 0, 0, ((int64_t)1 << 20) - 1, ((int64_t)1 << 12) - 1), ((int64_t)1 << 32) - 1);
    ASSERT_OK(attn_layout_strides(ATTN_LAYOUT_LBHD, 3, 64, (int64_t)1 << 22, 128, st));
    ASSERT_EQ_INT(st[2], 3 * 64 * 128); // row stride of (L, B, H*D)
    ASSERT_EQ_INT(attn__offset4(st, 2, 63, ((int64_t)1 << 22) - 1, 127), 3LL * 64 * 128 * ((1LL << 22) - 1) + 2 * 64 * 128 + 63 * 128 + 127);
}

static void test_extent_and_checked_math(void) {
    int64_t e;
    const int64_t n[4] = {2, 3, (int64_t)1 << 20, 4096}, s[4] = {(int64_t)3 << 32, (int64_t)1 << 32, 4096, 1};
    ASSERT_TRUE(attn__view_extent(n, s, &e));
    ASSERT_EQ_INT(e, ((int64_t)3 << 32) + 2 * ((int64_t)1 << 32) + (((int64_t)1 << 20) - 1) * 4096 + 4095);
    const int64_t big[4] = {2, 1, 1, 1}, huge_s[4] = {INT64_MAX, 0, 0, 0};
    ASSERT_TRUE(attn__view_extent(big, huge_s, &e) && e == INT64_MAX);
    const int64_t three[4] = {3, 1, 1, 1};
    ASSERT_TRUE(!attn__view_extent(three, huge_s, &e));
    const int64_t neg[4] = {1, 1, 1, -1};
    ASSERT_TRUE(!attn__view_extent(three, neg, &e));
    int64_t r;
    ASSERT_TRUE(attn__mul_i64((int64_t)1 << 31, (int64_t)1 << 31, &r) && r == (int64_t)1 << 62);
    ASSERT_TRUE(!attn__mul_i64((int64_t)1 << 32, (int64_t)1 << 31, &r));
    ASSERT_TRUE(!attn__mul_i64(-1, 2, &r));
    ASSERT_TRUE(attn__add_i64(INT64_MAX - 1, 1, &r) && r == INT64_MAX);
    ASSERT_TRUE(!attn__add_i64(INT64_MAX, 1, &r));
}

typedef struct counting {
    size_t largest;
    long allocs;
} counting;

static void *count_alloc(void *user, size_t size, size_t align) {
    counting *c = user;
    c->allocs++;
    if (size > c->largest) c->largest = size;
    void *p = NULL;
    return size <= ((size_t)1 << 30) && posix_memalign(&p, align, size) == 0 ? p : NULL;
}

static void count_free(void *user, void *p) {
    (void)user;
    free(p);
}

// Sizes whose buffers would overflow (or be absurd) come back as errors, and the allocator never
// sees a request for them.
static void test_overflow_rejected_before_allocation(void) {
    counting c = {0, 0};
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.allocator = (attn_allocator){count_alloc, count_free, &c};
    attn_ctx *ctx;
    ASSERT_OK(attn_ctx_create(&p, &ctx));
    size_t after_ctx = c.largest;

    attn_mha_config cfg;
    attn_mha *m = NULL;
    attn_mha_config_init(&cfg, (int64_t)1 << 31, 1); // in_proj_weight 3 * 2^62 elements
    ASSERT_STATUS(attn_mha_create(ctx, &cfg, &m), ATTN_ERR_OVERFLOW);
    attn_mha_config_init(&cfg, (int64_t)1 << 20, 1);
    cfg.kdim = (int64_t)1 << 50;
    ASSERT_STATUS(attn_mha_create(ctx, &cfg, &m), ATTN_ERR_OVERFLOW);
    attn_book *b = NULL;
    ASSERT_STATUS(attn_book_self_attention_v2(ctx, (int64_t)1 << 40, (int64_t)1 << 40, 0, &b), ATTN_ERR_OVERFLOW);

    // SDPA: every view is addressable, but the (B, H, L, S) weights would not fit in size_t
    float q[4] = {0}, o[4];
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = 1, d.n_heads = 1, d.len_q = d.len_kv = (int64_t)1 << 40, d.head_dim = 1;
    d.q_stride[2] = d.k_stride[2] = d.v_stride[2] = 0; // broadcast: the same row everywhere
    d.o_stride[2] = 1, d.o_stride[3] = 1;
    d.weights_mode = ATTN_WEIGHTS_PER_HEAD;
    ASSERT_STATUS(attn_sdpa_fwd(ctx, &d, q, q, q, o, NULL, o), ATTN_ERR_OVERFLOW);
    // a view whose largest offset fits int64_t but whose bytes would not (no tensor that large can
    // lie in memory): refused, forward and backward (whose dmask is zeroed over the mask's extent:
    // extent + 1 overflowed there before)
    attn_sdpa_desc_init(&d);
    d.batch = 2, d.n_heads = 1, d.len_q = d.len_kv = 1, d.head_dim = 1;
    d.q_stride[0] = d.k_stride[0] = d.v_stride[0] = d.o_stride[0] = 1;
    d.mask = q, d.mask_dtype = ATTN_DTYPE_F32, d.mask_stride[0] = INT64_MAX;
    ASSERT_STATUS(attn_sdpa_desc_check(ctx, &d), ATTN_ERR_OVERFLOW);
    ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "sdpa: mask: the bytes") != NULL);
    float lse[2] = {0}, g[3][2], dm[2];
    ASSERT_STATUS(attn_sdpa_bwd(ctx, &d, q, q, q, o, o, lse, NULL, g[0], g[1], g[2], dm), ATTN_ERR_OVERFLOW);
    d.mask_stride[0] = INT64_MAX / 4 - 1; // the largest offset accepted
    ASSERT_OK(attn_sdpa_desc_check(ctx, &d));
    d.mask = NULL, d.q_stride[0] = INT64_MAX / 4;
    ASSERT_STATUS(attn_sdpa_desc_check(ctx, &d), ATTN_ERR_OVERFLOW);
    // MHA forward: (N, L, E) projections that overflow
    attn_mha_config_init(&cfg, 4, 2);
    ASSERT_OK(attn_mha_create(ctx, &cfg, &m));
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = q, a.batch = (int64_t)1 << 40, a.len_q = (int64_t)1 << 40, a.need_weights = 0;
    ASSERT_STATUS(attn_mha_forward(ctx, m, &a, o, NULL), ATTN_ERR_OVERFLOW);
    attn_mha_free(m);
    float x[4] = {0};
    ASSERT_STATUS(attn_simple_self_attention(ctx, x, (int64_t)1 << 33, 1, ATTN_SIMPLE_SUM, NULL, NULL, NULL),
                  ATTN_ERR_OVERFLOW);
    ASSERT_TRUE(c.largest < ((size_t)1 << 20)); // nothing near the sizes asked for
    (void)after_ctx;
    attn_ctx_free(ctx);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_offset_beyond_2_31),
        HARNESS_CASE(test_extent_and_checked_math),
        HARNESS_CASE(test_overflow_rejected_before_allocation),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

// test_threads.c - separate contexts used from several threads at once give exactly the results
// each gives alone; modules and inputs are shared read-only between them. Covered: MHA, the book's
// modules and SDPA; KV caches of every type with decode steps; SDPA forward and backward with
// float32, float16 and bfloat16 tensors, on contexts with two threads each. Run under ThreadSanitizer by
// `make test-tsan` (CTest label: threads).
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"

enum { N = 2, L = 16, E = 16, H = 4, THREADS = 4, ROUNDS = 3 };

typedef struct job {
    const attn_mha *mha;   // shared, only read
    const attn_book *book; // shared, only read
    const float *x;        // (L, N, E), shared
    uint64_t seed;
    float mha_out[L * N * E], mha_w[N * L * L], book_out[N * L * E], sdpa_out[N * L * E];
    attn_status status;
} job;

// Everything one context does: MHA in training mode (dropout from the context's generator), the
// wrapper module, and SDPA with a causal mask.
static attn_status work(job *j) {
    attn_ctx *ctx;
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.seed = j->seed;
    attn_status st = attn_ctx_create(&p, &ctx);
    if (st != ATTN_OK) return st;
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = j->x, a.batch = N, a.len_q = L, a.causal = 1, a.training = 1;
    for (int r = 0; r < ROUNDS && st == ATTN_OK; r++) {
        attn_generator_seed(attn_ctx_generator(ctx), j->seed);
        st = attn_mha_forward(ctx, (attn_mha *)j->mha, &a, j->mha_out, j->mha_w);
        if (st == ATTN_OK)
            st = attn_book_forward(ctx, (attn_book *)j->book, j->x, N, L, 1, j->book_out, NULL);
        attn_sdpa_desc d;
        attn_sdpa_desc_init(&d);
        d.batch = N, d.n_heads = H, d.len_q = d.len_kv = L, d.head_dim = E / H, d.causal = ATTN_CAUSAL_TOP_LEFT;
        attn_layout_strides(ATTN_LAYOUT_LBHD, N, H, L, E / H, d.q_stride);
        memcpy(d.k_stride, d.q_stride, sizeof d.q_stride);
        memcpy(d.v_stride, d.q_stride, sizeof d.q_stride);
        memcpy(d.o_stride, d.q_stride, sizeof d.q_stride);
        if (st == ATTN_OK) st = attn_sdpa_fwd(ctx, &d, j->x, j->x, j->x, j->sdpa_out, NULL, NULL);
    }
    attn_ctx_free(ctx);
    return st;
}

static void *thread_main(void *arg) {
    job *j = arg;
    j->status = work(j);
    return NULL;
}

static void test_contexts_in_parallel_match_alone(void) {
    attn_ctx *ctx;
    ASSERT_OK(attn_ctx_create(NULL, &ctx));
    attn_mha_config c;
    attn_mha_config_init(&c, E, H);
    c.dropout = 0.25;
    attn_mha *m;
    ASSERT_OK(attn_mha_create(ctx, &c, &m));
    attn_book *b;
    ASSERT_OK(attn_book_mha_wrapper(ctx, E, 4, L, 0.1, 2, 1, &b));
    static float x[L * N * E];
    ASSERT_OK(attn_rand_normal(attn_ctx_generator(ctx), x, L * N * E, 0.0, 1.0));

    static job alone[THREADS], together[THREADS];
    for (int t = 0; t < THREADS; t++) {
        alone[t] = (job){.mha = m, .book = b, .x = x, .seed = 100 + (uint64_t)t};
        together[t] = alone[t];
        ASSERT_OK(work(&alone[t]));
    }
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) ASSERT_EQ_INT(pthread_create(&th[t], NULL, thread_main, &together[t]), 0);
    for (int t = 0; t < THREADS; t++) ASSERT_EQ_INT(pthread_join(th[t], NULL), 0);
    for (int t = 0; t < THREADS; t++) {
        ASSERT_OK(together[t].status);
        ASSERT_BITS_EQ(together[t].mha_out, alone[t].mha_out, L * N * E);
        ASSERT_BITS_EQ(together[t].mha_w, alone[t].mha_w, N * L * L);
        ASSERT_BITS_EQ(together[t].book_out, alone[t].book_out, N * L * E);
        ASSERT_BITS_EQ(together[t].sdpa_out, alone[t].sdpa_out, N * L * E);
    }
    // different seeds really give different dropout masks, so the comparison above means something
    ASSERT_TRUE(memcmp(alone[0].mha_out, alone[1].mha_out, sizeof alone[0].mha_out) != 0);
    attn_mha_free(m);
    attn_book_free(b);
    attn_ctx_free(ctx);
}

// ---- the new element types, caches and backward, on contexts with threads of their own ----------

enum { KD = 32, KTYPES = 5, FTYPES = 3, NEL = N * H * L * KD };
static const attn_dtype kv_types[KTYPES] = {ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16, ATTN_DTYPE_Q8_0,
                                            ATTN_DTYPE_Q4_0};
static const attn_dtype float_types[FTYPES] = {ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16};

typedef struct typed_job {
    const void *x[FTYPES];                  // (N, H, L, KD) in each float type, shared, only read
    float decode[KTYPES][N * H * KD];       // the last decode step of each cache type
    unsigned char out[FTYPES][NEL * 4];     // SDPA forward, in each type
    unsigned char grad[FTYPES][3][NEL * 4]; // dq, dk, dv of the backward, in each type
    attn_status status;
} typed_job;

// A KV cache of every type per context, L appends of x's rows with a decode step after each; then
// SDPA forward and backward (dout = out) with q, k, v, out and gradients of each float type.
static attn_status typed_work(typed_job *j) {
    attn_ctx *ctx;
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.n_threads = 2; // a pool inside each context too
    attn_status st = attn_ctx_create(&p, &ctx);
    if (st != ATTN_OK) return st;
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = N, d.n_heads = H, d.len_q = 1, d.head_dim = KD, d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    attn_layout_strides(ATTN_LAYOUT_BHLD, N, H, L, KD, d.q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, N, H, 1, KD, d.o_stride);
    const float *x = j->x[0];
    for (int t = 0; t < KTYPES && st == ATTN_OK; t++) {
        attn_kv_cache_config c;
        attn_kv_cache_config_init(&c);
        c.batch = N, c.n_kv_heads = H, c.head_dim = KD, c.capacity = L, c.dtype = kv_types[t];
        attn_kv_cache *cache = NULL;
        st = attn_kv_cache_create(ctx, &c, &cache);
        for (int64_t i = 0; i < L && st == ATTN_OK; i++) {
            st = attn_kv_cache_append(ctx, cache, 1, x + i * KD, d.q_stride, x + i * KD, d.q_stride);
            if (st == ATTN_OK) st = attn_kv_cache_attend(ctx, cache, &d, x + i * KD, j->decode[t], NULL);
        }
        attn_kv_cache_free(cache);
    }
    for (int t = 0; t < FTYPES && st == ATTN_OK; t++) {
        d.len_q = d.len_kv = L, d.causal = ATTN_CAUSAL_TOP_LEFT;
        memcpy(d.k_stride, d.q_stride, sizeof d.q_stride);
        memcpy(d.v_stride, d.q_stride, sizeof d.q_stride);
        memcpy(d.o_stride, d.q_stride, sizeof d.q_stride);
        d.q_dtype = d.kv_dtype = d.out_dtype = d.grad_dtype = float_types[t];
        float lse[N * H * L];
        st = attn_sdpa_fwd(ctx, &d, j->x[t], j->x[t], j->x[t], j->out[t], lse, NULL);
        if (st == ATTN_OK)
            st = attn_sdpa_bwd(ctx, &d, j->x[t], j->x[t], j->x[t], j->out[t], j->out[t], lse, NULL, j->grad[t][0],
                               j->grad[t][1], j->grad[t][2], NULL);
    }
    attn_ctx_free(ctx);
    return st;
}

static void *typed_thread(void *arg) {
    typed_job *j = arg;
    j->status = typed_work(j);
    return NULL;
}

static void test_caches_and_types_in_parallel_match_alone(void) {
    static float x[NEL];
    static uint16_t xh[2][NEL];
    uint32_t seed = 7;
    for (int i = 0; i < NEL; i++) x[i] = (float)((seed = seed * 1664525u + 1013904223u) >> 8) / 8388608.0f - 1.0f;
    ASSERT_OK(attn_convert(ATTN_DTYPE_F16, xh[0], ATTN_DTYPE_F32, x, NEL));
    ASSERT_OK(attn_convert(ATTN_DTYPE_BF16, xh[1], ATTN_DTYPE_F32, x, NEL));
    static typed_job alone[THREADS], together[THREADS];
    for (int t = 0; t < THREADS; t++) {
        alone[t] = (typed_job){.x = {x, xh[0], xh[1]}};
        together[t] = alone[t];
        memset(together[t].out, 0xff, sizeof together[t].out); // poisoned: every element must be written
        memset(together[t].grad, 0xff, sizeof together[t].grad);
        ASSERT_OK(typed_work(&alone[t]));
    }
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) ASSERT_EQ_INT(pthread_create(&th[t], NULL, typed_thread, &together[t]), 0);
    for (int t = 0; t < THREADS; t++) ASSERT_EQ_INT(pthread_join(th[t], NULL), 0);
    for (int t = 0; t < THREADS; t++) {
        ASSERT_OK(together[t].status);
        for (int k = 0; k < KTYPES; k++) ASSERT_BITS_EQ(together[t].decode[k], alone[t].decode[k], N * H * KD);
        for (int k = 0; k < FTYPES; k++) { // the bytes of NEL elements of the type
            const size_t bytes = (size_t)NEL * attn_dtype_size(float_types[k]);
            ASSERT_TRUE(memcmp(together[t].out[k], alone[t].out[k], bytes) == 0);
            for (int g = 0; g < 3; g++) ASSERT_TRUE(memcmp(together[t].grad[k][g], alone[t].grad[k][g], bytes) == 0);
        }
    }
    // the types really differ, so the comparisons above cover each
    ASSERT_TRUE(memcmp(alone[0].decode[0], alone[0].decode[4], sizeof alone[0].decode[0]) != 0);
    ASSERT_TRUE(memcmp(alone[0].out[1], alone[0].out[2], NEL * 2) != 0);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {HARNESS_CASE(test_contexts_in_parallel_match_alone),
                                         HARNESS_CASE(test_caches_and_types_in_parallel_match_alone)};
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

// test_threads.c - separate contexts used from several threads at once give exactly the results
// each gives alone; modules are shared read-only between them. Run under ThreadSanitizer by
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

int main(int argc, char **argv) {
    static const harness_case cases[] = {HARNESS_CASE(test_contexts_in_parallel_match_alone)};
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

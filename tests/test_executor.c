// test_executor.c - contexts whose parallel loops run on the caller's threads (attn_ctx_params.executor):
// the same bits as a one-thread context, whatever the executor does with the calls (one thread per
// index, all on the caller in reverse order, none at all), every index in [0, n_threads) handed
// out once a loop; attn_executor_gomp on the OpenMP runtime the test is linked with (when CMake
// found one; not under ThreadSanitizer, which does not see the runtime's synchronisation), also
// from inside a parallel region; the arguments' checks. CTest label: threads.
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define TSAN 1
#endif
#if defined(ATTN_TEST_GOMP) && !defined(TSAN)
#include <omp.h>
#define WITH_GOMP 1
void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
#endif

enum { B = 2, H = 4, L = 96, D = 32, NEL = B * H * L * D, THREADS = 3, E = 64 };

// Everything one context computes: SDPA forward (causal) and backward, an MHA forward, a decode
// step of a Q8_0 cache; each big enough (over a million flops) to run on the context's threads.
typedef struct results {
    float out[NEL], lse[B * H * L], dq[NEL], dk[NEL], dv[NEL], mha[L * B * E], decode[B * H * D];
} results;

static void compute(attn_ctx *ctx, const float *x, results *r) {
    memset(r, 0xff, sizeof *r); // poisoned: every element must be written
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = B, d.n_heads = H, d.len_q = d.len_kv = L, d.head_dim = D, d.causal = ATTN_CAUSAL_TOP_LEFT;
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, L, D, d.q_stride);
    memcpy(d.k_stride, d.q_stride, sizeof d.q_stride);
    memcpy(d.v_stride, d.q_stride, sizeof d.q_stride);
    memcpy(d.o_stride, d.q_stride, sizeof d.q_stride);
    const float *q = x, *k = x + 1, *v = x + 2; // three different views of one buffer
    ASSERT_OK(attn_sdpa_fwd(ctx, &d, q, k, v, r->out, r->lse, NULL));
    ASSERT_OK(attn_sdpa_bwd(ctx, &d, q, k, v, r->out, r->out, r->lse, NULL, r->dq, r->dk, r->dv, NULL));

    attn_mha_config c;
    attn_mha_config_init(&c, E, 4);
    attn_mha *m;
    attn_generator_seed(attn_ctx_generator(ctx), 5);
    ASSERT_OK(attn_mha_create(ctx, &c, &m));
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = x, a.batch = B, a.len_q = L, a.need_weights = 0;
    ASSERT_OK(attn_mha_forward(ctx, m, &a, r->mha, NULL));
    attn_mha_free(m);

    attn_kv_cache_config kc;
    attn_kv_cache_config_init(&kc);
    kc.batch = B, kc.n_kv_heads = H, kc.head_dim = D, kc.capacity = L, kc.dtype = ATTN_DTYPE_Q8_0;
    attn_kv_cache *cache;
    ASSERT_OK(attn_kv_cache_create(ctx, &kc, &cache));
    ASSERT_OK(attn_kv_cache_append(ctx, cache, L, k, d.k_stride, v, d.v_stride));
    d.len_q = 1, d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, 1, D, d.o_stride);
    ASSERT_OK(attn_kv_cache_attend(ctx, cache, &d, q, r->decode, NULL));
    attn_kv_cache_free(cache);
}

static float *inputs(void) {
    float *x = malloc(sizeof(float) * (NEL + 2));
    ASSERT_TRUE(x != NULL);
    uint32_t s = 3;
    for (int i = 0; i < NEL + 2; i++) x[i] = (float)((s = s * 1664525u + 1013904223u) >> 8) / 8388608.0f - 1.0f;
    return x;
}

static void compute_with(const attn_executor *e, int threads, const float *x, results *r) {
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.n_threads = threads;
    if (e != NULL) p.executor = *e;
    attn_ctx *ctx;
    ASSERT_OK(attn_ctx_create(&p, &ctx));
    compute(ctx, x, r);
    attn_ctx_free(ctx);
}

static void assert_same(const results *got, const results *want) {
    ASSERT_BITS_EQ(got->out, want->out, NEL);
    ASSERT_BITS_EQ(got->lse, want->lse, B * H * L);
    ASSERT_BITS_EQ(got->dq, want->dq, NEL);
    ASSERT_BITS_EQ(got->dk, want->dk, NEL);
    ASSERT_BITS_EQ(got->dv, want->dv, NEL);
    ASSERT_BITS_EQ(got->mha, want->mha, L * B * E);
    ASSERT_BITS_EQ(got->decode, want->decode, B * H * D);
}

// What an executor was asked: loops, calls, indices seen (bit i), the largest n.
typedef struct tally {
    atomic_int loops, calls, bad;
    atomic_uint seen;
    int n;
} tally;

// Calls every index on the caller, last first.
static void serial_reverse(void *user, int n, void (*task)(void *, int), void *arg) {
    tally *t = user;
    atomic_fetch_add(&t->loops, 1);
    t->n = n;
    for (int i = n - 1; i >= 0; i--) {
        atomic_fetch_add(&t->calls, 1);
        atomic_fetch_or(&t->seen, 1u << i);
        task(arg, i);
    }
}

// Calls none: the context must run the loop's tasks itself.
static void idle(void *user, int n, void (*task)(void *, int), void *arg) {
    tally *t = user;
    atomic_fetch_add(&t->loops, 1);
}

typedef struct thread_call {
    void (*task)(void *, int);
    void *arg;
    int i;
    tally *t;
} thread_call;

static void *thread_call_main(void *varg) {
    thread_call *c = varg;
    atomic_fetch_add(&c->t->calls, 1);
    atomic_fetch_or(&c->t->seen, 1u << c->i);
    c->task(c->arg, c->i);
    return NULL;
}

// One thread per index (index 0 on the caller), joined before returning.
static void one_thread_each(void *user, int n, void (*task)(void *, int), void *arg) {
    tally *t = user;
    atomic_fetch_add(&t->loops, 1);
    t->n = n;
    if (n > 16) {
        atomic_fetch_add(&t->bad, 1);
        return;
    }
    pthread_t th[16];
    thread_call c[16];
    for (int i = 0; i < n; i++) c[i] = (thread_call){task, arg, i, t};
    for (int i = 1; i < n; i++)
        if (pthread_create(&th[i], NULL, thread_call_main, &c[i]) != 0) atomic_fetch_add(&t->bad, 1);
    thread_call_main(&c[0]);
    for (int i = 1; i < n; i++) pthread_join(th[i], NULL);
}

static void test_executors_give_the_same_bits(void) {
    float *x = inputs();
    static results want, got;
    compute_with(NULL, 1, x, &want);
    compute_with(NULL, THREADS, x, &got); // the context's own threads
    assert_same(&got, &want);

    void (*const fns[3])(void *, int, void (*)(void *, int), void *) = {one_thread_each, serial_reverse, idle};
    for (int f = 0; f < 3; f++) {
        tally t = {0};
        const attn_executor e = {fns[f], &t};
        compute_with(&e, THREADS, x, &got);
        assert_same(&got, &want);
        ASSERT_TRUE(atomic_load(&t.loops) >= 4); // the loops went to the executor
        ASSERT_EQ_INT(atomic_load(&t.bad), 0);
        if (fns[f] != idle) {
            ASSERT_EQ_INT(t.n, THREADS);
            ASSERT_EQ_INT(atomic_load(&t.calls), THREADS * atomic_load(&t.loops));
            ASSERT_EQ_INT((int)atomic_load(&t.seen), (1 << THREADS) - 1);
        }
    }
    // a one-thread context never calls its executor
    tally t = {0};
    const attn_executor e = {serial_reverse, &t};
    compute_with(&e, 1, x, &got);
    assert_same(&got, &want);
    ASSERT_EQ_INT(atomic_load(&t.loops), 0);
    free(x);
}

static void test_executor_arguments(void) {
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    ASSERT_TRUE(p.executor.parallel == NULL && p.executor.user == NULL);
    int user;
    p.n_threads = 2, p.executor.user = &user; // a user pointer without a function
    attn_ctx *ctx = (attn_ctx *)&user;
    ASSERT_STATUS(attn_ctx_create(&p, &ctx), ATTN_ERR_INVALID_ARG);
    ASSERT_TRUE(ctx == NULL);
    attn_executor e = {serial_reverse, &user};
    ASSERT_STATUS(attn_executor_gomp(NULL, &e), ATTN_ERR_INVALID_ARG);
    ASSERT_TRUE(e.parallel == serial_reverse && e.user == &user); // untouched
    ASSERT_STATUS(attn_executor_gomp(&user, NULL), ATTN_ERR_INVALID_ARG);
}

#ifdef WITH_GOMP
// An executor around another that counts its calls and the threads they ran on.
typedef struct counted {
    attn_executor inner;
    tally t;
    pthread_mutex_t mu;
    pthread_t threads[64];
    int n_threads;
} counted;

typedef struct counted_loop {
    counted *c;
    void (*task)(void *, int);
    void *arg;
} counted_loop;

static void counted_task(void *varg, int i) {
    counted_loop *l = varg;
    counted *c = l->c;
    atomic_fetch_add(&c->t.calls, 1);
    atomic_fetch_or(&c->t.seen, 1u << i);
    pthread_mutex_lock(&c->mu);
    int known = 0;
    for (int k = 0; k < c->n_threads; k++) known |= pthread_equal(c->threads[k], pthread_self());
    if (!known && c->n_threads < 64) c->threads[c->n_threads++] = pthread_self();
    pthread_mutex_unlock(&c->mu);
    l->task(l->arg, i);
}

static void counted_parallel(void *user, int n, void (*task)(void *, int), void *arg) {
    counted *c = user;
    atomic_fetch_add(&c->t.loops, 1);
    c->t.n = n;
    counted_loop l = {c, task, arg};
    c->inner.parallel(c->inner.user, n, counted_task, &l);
}

static void test_gomp_executor(void) {
    float *x = inputs();
    static results want, got;
    compute_with(NULL, 1, x, &want);
    void (*entry)(void (*)(void *), void *, unsigned, unsigned) = GOMP_parallel;
    void *symbol;
    memcpy(&symbol, &entry, sizeof symbol); // as dlsym would return it
    static counted c;
    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.mu, NULL);
    ASSERT_OK(attn_executor_gomp(symbol, &c.inner));
    const attn_executor e = {counted_parallel, &c};
    compute_with(&e, THREADS, x, &got);
    assert_same(&got, &want);
    ASSERT_TRUE(atomic_load(&c.t.loops) >= 4);
    ASSERT_EQ_INT(atomic_load(&c.t.calls), THREADS * atomic_load(&c.t.loops)); // every index, every loop
    ASSERT_EQ_INT((int)atomic_load(&c.t.seen), (1 << THREADS) - 1);
    fprintf(stderr, "    %d loops ran on %d threads\n", atomic_load(&c.t.loops), c.n_threads);
    pthread_mutex_destroy(&c.mu);

    // from inside a parallel region: each thread its own context on the runtime (a nested region:
    // one thread)
    static results inside[2];
    int ok = 1;
#pragma omp parallel num_threads(2)
    {
        const int me = omp_get_thread_num();
        attn_executor g;
        attn_ctx_params p;
        attn_ctx_params_init(&p);
        p.n_threads = THREADS;
        attn_ctx *ctx = NULL;
        if (attn_executor_gomp(symbol, &g) != ATTN_OK) ok = 0;
        p.executor = g;
        if (attn_ctx_create(&p, &ctx) != ATTN_OK) ok = 0;
        else {
            compute(ctx, x, &inside[me]);
            attn_ctx_free(ctx);
        }
    }
    ASSERT_TRUE(ok);
    for (int t = 0; t < 2; t++) assert_same(&inside[t], &want);
    free(x);
}
#else
static void test_gomp_executor(void) { SKIP("built without an OpenMP runtime to test (or under ThreadSanitizer)"); }
#endif

int main(int argc, char **argv) {
    static const harness_case cases[] = {HARNESS_CASE(test_executors_give_the_same_bits),
                                         HARNESS_CASE(test_executor_arguments), HARNESS_CASE(test_gomp_executor)};
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

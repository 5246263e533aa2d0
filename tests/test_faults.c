// test_faults.c - fault injection: for every public call that allocates, fail its k-th allocation
// for every k until the call needs no more, and check each time that the call reports
// ATTN_ERR_OUT_OF_MEMORY (or succeeds when no allocation failed), leaves its outputs untouched or
// NULL, and that everything allocated is given back. The file readers and writers get the same
// treatment in test_io.c.
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"

typedef struct faulty {
    long count;    // allocations attempted since the window opened
    long fail_at;  // index of the allocation to fail; < 0: none
    long live;     // blocks currently allocated (whole test)
} faulty;

static void *faulty_alloc(void *user, size_t size, size_t align) {
    faulty *f = user;
    if (f->fail_at >= 0 && f->count++ == f->fail_at) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, align, size) != 0) return NULL;
    f->live++;
    return p;
}

static void faulty_free(void *user, void *p) {
    faulty *f = user;
    f->live--;
    free(p);
}

// One scenario: set up what the call needs (allocations may not fail then), run the call inside
// the fault window, tear down. `state` is scratch owned by the scenario.
typedef struct scenario {
    const char *name;
    void (*setup)(attn_ctx *ctx, void *state);
    attn_status (*call)(attn_ctx *ctx, void *state);
    void (*teardown)(void *state);
} scenario;

typedef struct state {
    attn_mha *mha;
    attn_kv_cache *cache;
    attn_book *book;
    attn_tensor_list list;
    attn_tensor t[8];
    float x[2 * 6 * 8], out[2 * 6 * 8 * 4], w[2 * 2 * 6 * 8];
    uint8_t mask[6 * 6];
} state;

static void run_scenario(const scenario *sc) {
    long calls_needed = -1;
    for (long k = 0; k < 200 && calls_needed < 0; k++) {
        faulty f = {0, -1, 0};
        attn_ctx_params p;
        attn_ctx_params_init(&p);
        p.seed = 7;
        p.allocator = (attn_allocator){faulty_alloc, faulty_free, &f};
        attn_ctx *ctx = NULL;
        ASSERT_OK(attn_ctx_create(&p, &ctx));
        state *s = calloc(1, sizeof *s);
        if (sc->setup) sc->setup(ctx, s);
        f.count = 0;
        f.fail_at = k; // the window: fail the k-th allocation of the call
        attn_status st = sc->call(ctx, s);
        long attempted = f.count;
        f.fail_at = -1;
        if (st == ATTN_OK) {
            if (attempted > k) FAIL("%s: allocation %ld failed but the call returned ATTN_OK", sc->name, k);
            calls_needed = k; // no allocation was failed: the call needs k allocations
        } else if (st != ATTN_ERR_OUT_OF_MEMORY) {
            FAIL("%s: failing allocation %ld gave %s (%s)", sc->name, k, attn_strerror(st), attn_ctx_last_error(ctx));
        }
        if (sc->teardown) sc->teardown(s);
        free(s);
        attn_ctx_free(ctx);
        if (f.live != 0) FAIL("%s: %ld blocks leaked after failing allocation %ld", sc->name, f.live, k);
        harness_checks++;
    }
    if (calls_needed < 0) FAIL("%s never succeeded", sc->name);
    fprintf(stderr, "    %-28s %ld allocations, each failed once: clean\n", sc->name, calls_needed);
}

// ---- scenarios ------------------------------------------------------------------------------------

static void fill_x(attn_ctx *ctx, state *s) {
    attn_rand_normal(attn_ctx_generator(ctx), s->x, (int64_t)(sizeof s->x / sizeof s->x[0]), 0.0, 1.0);
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 6; j++) s->mask[i * 6 + j] = j > i;
}

static attn_status call_ctx_reserve(attn_ctx *ctx, void *st) {
    (void)st;
    return attn_ctx_reserve(ctx, 1 << 20);
}

static attn_status call_mha_create(attn_ctx *ctx, void *st) {
    state *s = st;
    attn_mha_config c;
    attn_mha_config_init(&c, 8, 2);
    c.add_bias_kv = 1, c.kdim = 5;
    s->mha = (attn_mha *)s; // must come back NULL on failure
    attn_status r = attn_mha_create(ctx, &c, &s->mha);
    if (r != ATTN_OK && s->mha != NULL) FAIL("mha_create left a module pointer on failure");
    return r;
}

// A bfloat16 module: drawn in float32, then converted (a second module, its own allocations).
static attn_status call_mha_create_bf16(attn_ctx *ctx, void *st) {
    state *s = st;
    attn_mha_config c;
    attn_mha_config_init(&c, 8, 2);
    c.dtype = ATTN_DTYPE_BF16;
    s->mha = (attn_mha *)s;
    attn_status r = attn_mha_create(ctx, &c, &s->mha);
    if (r != ATTN_OK && s->mha != NULL) FAIL("mha_create (bf16) left a module pointer on failure");
    return r;
}

static void setup_mha(attn_ctx *ctx, void *st) {
    state *s = st;
    attn_mha_config c;
    attn_mha_config_init(&c, 8, 2);
    c.add_bias_kv = 1, c.add_zero_attn = 1;
    ASSERT_OK(attn_mha_create(ctx, &c, &s->mha));
    fill_x(ctx, s);
}

static attn_status call_mha_forward(attn_ctx *ctx, void *st) {
    state *s = st;
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = s->x, a.batch = 2, a.len_q = 6;
    a.attn_mask = s->mask, a.attn_mask_dtype = ATTN_DTYPE_BOOL, a.attn_mask_ndim = 2; // widened: a copy
    a.average_attn_weights = 0;
    return attn_mha_forward(ctx, s->mha, &a, s->out, s->w);
}

static attn_status call_mha_forward_causal(attn_ctx *ctx, void *st) {
    state *s = st;
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = s->x, a.batch = 2, a.len_q = 6, a.causal = 1, a.need_weights = 0;
    return attn_mha_forward(ctx, s->mha, &a, s->out, NULL);
}

static void setup_state_list(attn_ctx *ctx, void *st) {
    state *s = st;
    setup_mha(ctx, st);
    for (int i = 0; i < attn_mha_param_count(s->mha); i++) {
        float *data;
        int64_t shape[3];
        ASSERT_OK(attn_mha_param_at(s->mha, i, (const char **)&s->t[i].name, &s->t[i].ndim, shape, &data));
        memcpy(s->t[i].shape, shape, sizeof shape);
        s->t[i].data = data;
        s->t[i].dtype = ATTN_DTYPE_F32;
    }
    s->list.count = attn_mha_param_count(s->mha);
    s->list.tensors = s->t;
}

static attn_status call_mha_from_state(attn_ctx *ctx, void *st) {
    state *s = st;
    attn_mha *m = (attn_mha *)s;
    attn_mha_config extra;
    attn_mha_config_init(&extra, 1, 1);
    extra.add_zero_attn = 1;
    attn_status r = attn_mha_create_from_state(ctx, &s->list, 2, &extra, &m);
    if (r == ATTN_OK) attn_mha_free(m);
    else if (m != NULL) FAIL("create_from_state left a module pointer on failure");
    return r;
}

static void teardown_mha(void *st) {
    state *s = st;
    attn_mha_free(s->mha);
    attn_book_free(s->book);
    attn_kv_cache_free(s->cache);
}

static attn_status call_kv_cache_create(attn_ctx *ctx, void *st) {
    state *s = st;
    attn_kv_cache_config c;
    attn_kv_cache_config_init(&c);
    c.batch = 2, c.n_kv_heads = 2, c.head_dim = 4, c.capacity = 8, c.dtype = ATTN_DTYPE_F16;
    s->cache = (attn_kv_cache *)s; // must come back NULL on failure
    attn_status r = attn_kv_cache_create(ctx, &c, &s->cache);
    if (r != ATTN_OK && s->cache != NULL) FAIL("kv_cache_create left a pointer on failure");
    return r;
}

// A module without bias_k / zero attention and its cache (batch 2, 2 heads of 4).
static void setup_cached(attn_ctx *ctx, void *st) {
    state *s = st;
    attn_mha_config c;
    attn_mha_config_init(&c, 8, 2);
    ASSERT_OK(attn_mha_create(ctx, &c, &s->mha));
    attn_kv_cache_config kc;
    attn_kv_cache_config_init(&kc);
    kc.batch = 2, kc.n_kv_heads = 2, kc.head_dim = 4, kc.capacity = 12;
    ASSERT_OK(attn_kv_cache_create(ctx, &kc, &s->cache));
    fill_x(ctx, s);
}

static attn_status call_mha_forward_cached(attn_ctx *ctx, void *st) {
    state *s = st;
    attn_status r = attn_mha_forward_cached(ctx, s->mha, s->cache, s->x, 2, 6, s->out);
    if (r != ATTN_OK && attn_kv_cache_length(s->cache) != 0) FAIL("mha_forward_cached grew the cache and failed");
    return r;
}

static attn_status call_kv_cache_attend(attn_ctx *ctx, void *st) {
    state *s = st;
    ASSERT_OK(attn_kv_cache_append(ctx, s->cache, 6, s->x, NULL, s->x, NULL)); // allocates nothing
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = 2, d.n_heads = 4, d.len_q = 1, d.head_dim = 4, d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    attn_layout_strides(ATTN_LAYOUT_BHLD, 2, 4, 1, 4, d.q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, 2, 4, 1, 4, d.o_stride);
    return attn_kv_cache_attend(ctx, s->cache, &d, s->x, s->out, NULL);
}

static attn_status call_sdpa_varlen(attn_ctx *ctx, void *st) {
    state *s = st;
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = 2, d.n_heads = 2, d.len_q = 4, d.len_kv = 4, d.head_dim = 4, d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    const int64_t st4[4] = {0, 4, 8, 1}, cu[3] = {0, 2, 6};
    memcpy(d.q_stride, st4, sizeof st4), memcpy(d.k_stride, st4, sizeof st4);
    memcpy(d.v_stride, st4, sizeof st4), memcpy(d.o_stride, st4, sizeof st4);
    fill_x(ctx, s);
    return attn_sdpa_varlen_fwd(ctx, &d, cu, cu, s->x, s->x, s->x, s->out, s->w);
}

#define BOOK_CREATE(fn, ...)                                                    \
    static attn_status call_##fn(attn_ctx *ctx, void *st) {                     \
        state *s = st;                                                          \
        s->book = (attn_book *)s;                                               \
        attn_status r = attn_##fn(ctx, __VA_ARGS__, &s->book);                  \
        if (r != ATTN_OK && s->book != NULL) FAIL(#fn " left a pointer on failure"); \
        return r;                                                               \
    }
BOOK_CREATE(book_self_attention_v1, 3, 2)
BOOK_CREATE(book_self_attention_v2, 3, 2, 1)
BOOK_CREATE(book_causal_attention, 3, 2, 6, 0.1, 0)
BOOK_CREATE(book_mha_wrapper, 3, 2, 6, 0.0, 3, 1)
BOOK_CREATE(book_mha, 3, 4, 6, 0.0, 2, 0)

static void setup_wrapper(attn_ctx *ctx, void *st) {
    state *s = st;
    ASSERT_OK(attn_book_mha_wrapper(ctx, 8, 2, 6, 0.2, 2, 0, &s->book));
    fill_x(ctx, s);
}

static attn_status call_book_forward(attn_ctx *ctx, void *st) {
    state *s = st;
    return attn_book_forward(ctx, s->book, s->x, 2, 6, 1, s->out, s->w);
}

static attn_status call_simple(attn_ctx *ctx, void *st) {
    state *s = st;
    fill_x(ctx, s);
    return attn_simple_self_attention(ctx, s->x, 6, 8, ATTN_SIMPLE_SOFTMAX, NULL, NULL, s->out);
}

static attn_status call_sdpa(attn_ctx *ctx, void *st) {
    state *s = st;
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = 2, d.n_heads = 2, d.len_q = d.len_kv = 6, d.head_dim = 4;
    attn_layout_strides(ATTN_LAYOUT_BLHD, 2, 2, 6, 4, d.q_stride);
    memcpy(d.k_stride, d.q_stride, sizeof d.q_stride);
    memcpy(d.v_stride, d.q_stride, sizeof d.q_stride);
    memcpy(d.o_stride, d.q_stride, sizeof d.q_stride);
    d.weights_mode = ATTN_WEIGHTS_AVERAGE;
    return attn_sdpa_fwd(ctx, &d, s->x, s->x, s->x, s->out, NULL, s->w);
}

static void test_every_allocation_of_every_call(void) {
    static const scenario scenarios[] = {
        {"attn_ctx_reserve", NULL, call_ctx_reserve, NULL},
        {"attn_mha_create", NULL, call_mha_create, teardown_mha},
        {"attn_mha_create (bf16)", NULL, call_mha_create_bf16, teardown_mha},
        {"attn_mha_forward (mask)", setup_mha, call_mha_forward, teardown_mha},
        {"attn_mha_forward (causal)", setup_mha, call_mha_forward_causal, teardown_mha},
        {"attn_mha_create_from_state", setup_state_list, call_mha_from_state, teardown_mha},
        {"attn_book_self_attention_v1", NULL, call_book_self_attention_v1, teardown_mha},
        {"attn_book_self_attention_v2", NULL, call_book_self_attention_v2, teardown_mha},
        {"attn_book_causal_attention", NULL, call_book_causal_attention, teardown_mha},
        {"attn_book_mha_wrapper", NULL, call_book_mha_wrapper, teardown_mha},
        {"attn_book_mha", NULL, call_book_mha, teardown_mha},
        {"attn_book_forward", setup_wrapper, call_book_forward, teardown_mha},
        {"attn_simple_self_attention", NULL, call_simple, NULL},
        {"attn_sdpa_fwd", NULL, call_sdpa, NULL},
        {"attn_kv_cache_create", NULL, call_kv_cache_create, teardown_mha},
        {"attn_mha_forward_cached", setup_cached, call_mha_forward_cached, teardown_mha},
        {"attn_kv_cache_attend", setup_cached, call_kv_cache_attend, teardown_mha},
        {"attn_sdpa_varlen_fwd", NULL, call_sdpa_varlen, NULL},
    };
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++) run_scenario(&scenarios[i]);
}

// Creating a context: fail its allocations too.
static void test_context_creation(void) {
    for (long k = 0; k < 4; k++) {
        faulty f = {0, k, 0};
        attn_ctx_params p;
        attn_ctx_params_init(&p);
        p.allocator = (attn_allocator){faulty_alloc, faulty_free, &f};
        attn_ctx *ctx = (attn_ctx *)&f;
        attn_status st = attn_ctx_create(&p, &ctx);
        ASSERT_TRUE(st == ATTN_OK || (st == ATTN_ERR_OUT_OF_MEMORY && ctx == NULL));
        attn_ctx_free(st == ATTN_OK ? ctx : NULL);
        ASSERT_EQ_INT(f.live, 0);
    }
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_every_allocation_of_every_call),
        HARNESS_CASE(test_context_creation),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

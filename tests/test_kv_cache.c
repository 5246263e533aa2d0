// test_kv_cache.c - the KV cache: storage and conversion on append, capacity errors that leave the
// cache unchanged, truncate/reset (speculative roll-back), attend against attn_sdpa_fwd on the
// same keys and values with bottom-right causal masking (GQA, half precision, several appends),
// and the module's cached forward against attn_mha_forward with causal masking over the whole
// sequence at every decoding step (1e-5); large storage on 2 MiB boundaries, advised for
// transparent huge pages on Linux, and a caller's allocator used as it is.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"
#include "test_data.h"

static float *randn(int64_t n, uint32_t *seed) {
    float *x = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = rand_sym(seed);
    return x;
}

static attn_kv_cache *make_cache(attn_ctx *ctx, int64_t B, int64_t Hkv, int64_t D, int64_t cap, attn_dtype dt) {
    attn_kv_cache_config c;
    attn_kv_cache_config_init(&c);
    c.batch = B, c.n_kv_heads = Hkv, c.head_dim = D, c.capacity = cap, c.dtype = dt;
    attn_kv_cache *kc = NULL;
    ASSERT_OK(attn_kv_cache_create(ctx, &c, &kc));
    return kc;
}

static void test_storage_and_errors(void) {
    attn_ctx *ctx = test_ctx(ATTN_ISA_AUTO, 1);
    uint32_t seed = 1;
    const int64_t B = 2, Hkv = 3, D = 5, cap = 7;
    const attn_dtype dts[3] = {ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
    for (int t = 0; t < 3; t++) {
        attn_kv_cache *kc = make_cache(ctx, B, Hkv, D, cap, dts[t]);
        ASSERT_TRUE(attn_kv_cache_length(kc) == 0);
        // k given as (B, n, Hkv, D) in memory (strided), v contiguous (B, Hkv, n, D)
        const int64_t n = 4;
        float *k = randn(B * n * Hkv * D, &seed), *v = randn(B * Hkv * n * D, &seed);
        const int64_t ks[4] = {n * Hkv * D, D, Hkv * D, 1};
        ASSERT_OK(attn_kv_cache_append(ctx, kc, n, k, ks, v, NULL));
        ASSERT_TRUE(attn_kv_cache_length(kc) == n);
        void *kst, *vst;
        int64_t kss[4], vss[4];
        attn_kv_cache_storage(kc, &kst, kss, &vst, vss);
        ASSERT_TRUE(kss[2] == D && kss[1] == cap * D && vss[0] == Hkv * cap * D);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hkv; h++)
                for (int64_t i = 0; i < n; i++)
                    for (int64_t e = 0; e < D; e++) {
                        const float kin = k[b * ks[0] + h * ks[1] + i * ks[2] + e];
                        const float vin = v[((b * Hkv + h) * n + i) * D + e];
                        float kw, vw, kgot, vgot;
                        attn_convert(dts[t], &kw, ATTN_DTYPE_F32, &kin, 1); // rounded as the cache must
                        attn_convert(ATTN_DTYPE_F32, &kgot, dts[t], &kw, 1);
                        attn_convert(dts[t], &vw, ATTN_DTYPE_F32, &vin, 1);
                        attn_convert(ATTN_DTYPE_F32, &vgot, dts[t], &vw, 1);
                        const int64_t o = ((b * Hkv + h) * cap + i) * D + e;
                        float kc_val, vc_val;
                        attn_convert(ATTN_DTYPE_F32, &kc_val, dts[t], (const char *)kst + o * (int64_t)attn_dtype_size(dts[t]), 1);
                        attn_convert(ATTN_DTYPE_F32, &vc_val, dts[t], (const char *)vst + o * (int64_t)attn_dtype_size(dts[t]), 1);
                        harness_checks++;
                        if (kc_val != kgot || vc_val != vgot) FAIL("%s cache: stored value differs at %lld", attn_dtype_name(dts[t]), (long long)o);
                    }
        // capacity: 4 + 4 > 7 fails and changes nothing; 3 more fit exactly
        ASSERT_STATUS(attn_kv_cache_append(ctx, kc, 4, k, ks, v, NULL), ATTN_ERR_CAPACITY);
        ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "capacity") != NULL);
        ASSERT_TRUE(attn_kv_cache_length(kc) == n);
        ASSERT_OK(attn_kv_cache_append(ctx, kc, 3, k, ks, v, NULL));
        ASSERT_TRUE(attn_kv_cache_length(kc) == cap);
        ASSERT_STATUS(attn_kv_cache_append(ctx, kc, 1, k, ks, v, NULL), ATTN_ERR_CAPACITY);
        ASSERT_OK(attn_kv_cache_append(ctx, kc, 0, NULL, NULL, NULL, NULL));
        ASSERT_STATUS(attn_kv_cache_truncate(ctx, kc, cap + 1), ATTN_ERR_INVALID_ARG);
        ASSERT_STATUS(attn_kv_cache_truncate(ctx, kc, -1), ATTN_ERR_INVALID_ARG);
        ASSERT_OK(attn_kv_cache_truncate(ctx, kc, 2));
        ASSERT_TRUE(attn_kv_cache_length(kc) == 2);
        attn_kv_cache_reset(kc);
        ASSERT_TRUE(attn_kv_cache_length(kc) == 0);
        ASSERT_STATUS(attn_kv_cache_append(ctx, kc, 1, NULL, NULL, v, NULL), ATTN_ERR_INVALID_ARG);
        ASSERT_STATUS(attn_kv_cache_append(ctx, kc, -1, k, NULL, v, NULL), ATTN_ERR_BAD_SHAPE);
        const int64_t neg[4] = {-1, 0, 0, 1};
        ASSERT_STATUS(attn_kv_cache_append(ctx, kc, 1, k, neg, v, NULL), ATTN_ERR_INVALID_ARG);
        free(k), free(v);
        attn_kv_cache_free(kc);
    }
    attn_kv_cache_config c;
    attn_kv_cache_config_init(&c);
    attn_kv_cache *kc = NULL;
    ASSERT_STATUS(attn_kv_cache_create(ctx, &c, &kc), ATTN_ERR_BAD_SHAPE);
    c.batch = c.n_kv_heads = c.head_dim = c.capacity = 1, c.dtype = ATTN_DTYPE_I32;
    ASSERT_STATUS(attn_kv_cache_create(ctx, &c, &kc), ATTN_ERR_INVALID_ARG);
    c.dtype = ATTN_DTYPE_F32, c.capacity = INT64_MAX / 2;
    ASSERT_TRUE(attn_kv_cache_create(ctx, &c, &kc) != ATTN_OK);
    ASSERT_TRUE(kc == NULL);
    attn_kv_cache_free(NULL);
    attn_ctx_free(ctx);
}

// attend == attn_sdpa_fwd over the same positions with bottom-right causal masking.
static void check_attend(attn_ctx *ctx, attn_kv_cache *kc, const float *kall, const float *vall, int64_t H,
                         int64_t L, const float *sinks, uint32_t *seed, const char *what) {
    const attn_kv_cache_config *c = attn_kv_cache_get_config(kc);
    const int64_t B = c->batch, Hkv = c->n_kv_heads, D = c->head_dim, S = attn_kv_cache_length(kc);
    float *q = randn(B * H * L * D, seed), *o1 = malloc((size_t)(B * H * L * D) * 4), *o2 = malloc((size_t)(B * H * L * D) * 4);
    float *l1 = malloc((size_t)(B * H * L) * 4), *l2 = malloc((size_t)(B * H * L) * 4);
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = B, d.n_heads = H, d.len_q = L, d.head_dim = D, d.causal = ATTN_CAUSAL_BOTTOM_RIGHT, d.sinks = sinks;
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, L, D, d.q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, L, D, d.o_stride);
    ASSERT_OK(attn_kv_cache_attend(ctx, kc, &d, q, o1, l1));
    // the same with k and v given directly (rounded to the cache's type), (B, Hkv, capacity, D) views
    const int64_t cap = c->capacity, n = B * Hkv * cap * D;
    void *kh = malloc((size_t)n * 4), *vh = malloc((size_t)n * 4);
    ASSERT_OK(attn_convert(c->dtype, kh, ATTN_DTYPE_F32, kall, n));
    ASSERT_OK(attn_convert(c->dtype, vh, ATTN_DTYPE_F32, vall, n));
    attn_sdpa_desc e = d;
    e.n_kv_heads = Hkv, e.len_kv = S, e.kv_dtype = c->dtype;
    const int64_t st[4] = {Hkv * cap * D, cap * D, D, 1};
    memcpy(e.k_stride, st, sizeof st);
    memcpy(e.v_stride, st, sizeof st);
    attn_ctx *ref = test_ctx(ATTN_ISA_REF, 1);
    ASSERT_OK(attn_sdpa_fwd(ref, &e, q, kh, vh, o2, l2, NULL));
    attn_ctx_free(ref);
    harness_assert_close(__FILE__, __LINE__, what, o1, o2, B * H * L * D, 1e-6, 1e-5);
    harness_assert_close(__FILE__, __LINE__, what, l1, l2, B * H * L, 1e-6, 1e-5);
    free(q), free(o1), free(o2), free(l1), free(l2), free(kh), free(vh);
}

static void test_attend(void) {
    uint32_t seed = 7;
    const attn_dtype dts[3] = {ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
    for (int t = 0; t < 3; t++)
        for (int threads = 1; threads <= 2; threads++) {
            attn_ctx *ctx = test_ctx(ATTN_ISA_AUTO, threads);
            const int64_t B = 2, H = 8, Hkv = 2, D = 32, cap = 2000;
            attn_kv_cache *kc = make_cache(ctx, B, Hkv, D, cap, dts[t]);
            // kall / vall: what the cache should hold, (B, Hkv, cap, D)
            float *kall = calloc((size_t)(B * Hkv * cap * D), 4), *vall = calloc((size_t)(B * Hkv * cap * D), 4);
            int64_t len = 0;
            float sinks[8]; // attention sinks for some of the attends
            for (int h = 0; h < 8; h++) sinks[h] = 4.0f * rand_sym(&seed);
            const int64_t blocks[5] = {37, 1, 1, 1700, 1};
            for (int s = 0; s < 5; s++) {
                const int64_t n = blocks[s];
                float *k = randn(B * Hkv * n * D, &seed), *v = randn(B * Hkv * n * D, &seed);
                ASSERT_OK(attn_kv_cache_append(ctx, kc, n, k, NULL, v, NULL));
                for (int64_t bh = 0; bh < B * Hkv; bh++)
                    for (int64_t i = 0; i < n; i++)
                        for (int64_t e = 0; e < D; e++) {
                            kall[(bh * cap + len + i) * D + e] = k[(bh * n + i) * D + e];
                            vall[(bh * cap + len + i) * D + e] = v[(bh * n + i) * D + e];
                        }
                len += n;
                check_attend(ctx, kc, kall, vall, H, 1, NULL, &seed, "one query");
                check_attend(ctx, kc, kall, vall, H, n < 5 ? n : 5, NULL, &seed, "a block");
                check_attend(ctx, kc, kall, vall, H, 1, sinks, &seed, "one query, sinks");
                check_attend(ctx, kc, kall, vall, H, n < 5 ? n : 5, sinks, &seed, "a block, sinks");
                if (s == 2) { // roll back two positions, as after rejected speculative tokens
                    ASSERT_OK(attn_kv_cache_truncate(ctx, kc, len - 2));
                    len -= 2;
                    check_attend(ctx, kc, kall, vall, H, 1, NULL, &seed, "after truncate");
                }
                free(k), free(v);
            }
            // errors
            attn_sdpa_desc d;
            attn_sdpa_desc_init(&d);
            d.batch = B, d.n_heads = H, d.len_q = 1, d.head_dim = D, d.causal = ATTN_CAUSAL_TOP_LEFT;
            attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, 1, D, d.q_stride);
            attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, 1, D, d.o_stride);
            float q[2 * 8 * 32], o[2 * 8 * 32];
            for (int i = 0; i < 2 * 8 * 32; i++) q[i] = rand_sym(&seed);
            ASSERT_STATUS(attn_kv_cache_attend(ctx, kc, &d, q, o, NULL), ATTN_ERR_INVALID_ARG);
            d.causal = ATTN_CAUSAL_BOTTOM_RIGHT, d.dropout_p = 0.1;
            ASSERT_STATUS(attn_kv_cache_attend(ctx, kc, &d, q, o, NULL), ATTN_ERR_INVALID_ARG);
            d.dropout_p = 0, d.head_dim = 16;
            ASSERT_STATUS(attn_kv_cache_attend(ctx, kc, &d, q, o, NULL), ATTN_ERR_BAD_SHAPE);
            d.head_dim = D, d.n_heads = 6; // not a multiple of Hkv = 4? (2 divides 6): use 7
            d.n_heads = 7;
            ASSERT_STATUS(attn_kv_cache_attend(ctx, kc, &d, q, o, NULL), ATTN_ERR_BAD_SHAPE);
            attn_kv_cache_reset(kc);
            d.n_heads = H;
            ASSERT_STATUS(attn_kv_cache_attend(ctx, kc, &d, q, o, NULL), ATTN_ERR_BAD_SHAPE);
            free(kall), free(vall);
            attn_kv_cache_free(kc);
            attn_ctx_free(ctx);
        }
}

// The cached module forward, step by step, against the full causal forward of the sequence so far
// (on the reference kernels) at the rows of the new tokens, to 1e-5.
static void check_module_decoding(int batch_first, attn_dtype dt, int threads) {
    attn_ctx *ctx = test_ctx(ATTN_ISA_AUTO, threads), *ref = test_ctx(ATTN_ISA_REF, 1);
    attn_generator_seed(attn_ctx_generator(ctx), 3);
    const int64_t E = 64, H = 4, N = 2, T = 24, prompt = 7;
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, E, H);
    cfg.batch_first = batch_first;
    attn_mha *m = NULL;
    ASSERT_OK(attn_mha_create(ctx, &cfg, &m));
    float *bias;
    ASSERT_OK(attn_mha_param(m, "in_proj_bias", NULL, NULL, &bias));
    uint32_t seed = 11;
    for (int64_t i = 0; i < 3 * E; i++) bias[i] = rand_sym(&seed) * 0.5f; // torch initialises it to 0
    attn_kv_cache *kc = make_cache(ctx, N, H, E / H, T, dt);
    float *x = randn(T * N * E, &seed); // token t of sequence n: x + (t * N + n) * E
    float *xs = malloc((size_t)(T * N * E) * 4), *os = malloc((size_t)(T * N * E) * 4);
    float *xp = malloc((size_t)(T * N * E) * 4), *op = malloc((size_t)(T * N * E) * 4);
    // row of (token t, sequence n) in a (len, N, E) or (N, len, E) tensor
#define AT(len, t, n) ((batch_first ? (n) * (len) + (t) : (t) * N + (n)) * E)
    int64_t done = 0;
    while (done < T) {
        const int64_t len = done == 0 ? prompt : 1, P = done + len;
        for (int64_t t = 0; t < len; t++)
            for (int64_t n = 0; n < N; n++) memcpy(xs + AT(len, t, n), x + (done + t) * N * E + n * E, (size_t)E * 4);
        ASSERT_OK(attn_mha_forward_cached(ctx, m, kc, xs, N, len, os));
        ASSERT_TRUE(attn_kv_cache_length(kc) == P);
        for (int64_t t = 0; t < P; t++)
            for (int64_t n = 0; n < N; n++) memcpy(xp + AT(P, t, n), x + t * N * E + n * E, (size_t)E * 4);
        attn_mha_args a;
        attn_mha_args_init(&a);
        a.query = xp, a.batch = N, a.len_q = P, a.causal = 1, a.need_weights = 0;
        ASSERT_OK(attn_mha_forward(ref, m, &a, op, NULL));
        for (int64_t t = 0; t < len; t++)
            for (int64_t n = 0; n < N; n++)
                harness_assert_close(__FILE__, __LINE__, "cached step", os + AT(len, t, n), op + AT(P, done + t, n), E,
                                     dt == ATTN_DTYPE_F32 ? 1e-5 : 2e-3, dt == ATTN_DTYPE_F32 ? 1e-5 : 1e-2);
        done = P;
    }
#undef AT
    // a full cache refuses more tokens and stays as it was
    ASSERT_STATUS(attn_mha_forward_cached(ctx, m, kc, xs, N, 1, os), ATTN_ERR_CAPACITY);
    ASSERT_TRUE(attn_kv_cache_length(kc) == T);
    ASSERT_STATUS(attn_mha_forward_cached(ctx, m, kc, xs, N + 1, 1, os), ATTN_ERR_BAD_SHAPE);
    free(x), free(xs), free(os), free(xp), free(op);
    attn_kv_cache_free(kc);
    attn_mha_free(m);
    attn_ctx_free(ctx), attn_ctx_free(ref);
}

static void test_module_decoding(void) {
    for (int bf = 0; bf <= 1; bf++) check_module_decoding(bf, ATTN_DTYPE_F32, 1 + bf);
    check_module_decoding(1, ATTN_DTYPE_F16, 2); // half cache: within the rounding of k and v
    // modules the cached path does not serve
    attn_ctx *ctx = test_ctx(ATTN_ISA_AUTO, 1);
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, 8, 2);
    cfg.add_bias_kv = 1;
    attn_mha *m = NULL;
    ASSERT_OK(attn_mha_create(ctx, &cfg, &m));
    attn_kv_cache *kc = make_cache(ctx, 1, 2, 4, 4, ATTN_DTYPE_F32);
    float x[8] = {0}, o[8];
    ASSERT_STATUS(attn_mha_forward_cached(ctx, m, kc, x, 1, 1, o), ATTN_ERR_UNSUPPORTED);
    ASSERT_STATUS(attn_mha_forward_cached(ctx, m, NULL, x, 1, 1, o), ATTN_ERR_INVALID_ARG);
    attn_kv_cache_free(kc);
    attn_mha_free(m);
    attn_ctx_free(ctx);
}

// The transparent-huge-page mode in the system's brackets ("always", "madvise" or "never"), or ""
// where the file is missing (not Linux, or a kernel without THP).
static void thp_mode(char mode[16]) {
    mode[0] = '\0';
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f == NULL) return;
    char line[128] = {0};
    if (fgets(line, sizeof line, f) != NULL) {
        const char *a = strchr(line, '['), *b = a != NULL ? strchr(a, ']') : NULL;
        if (b != NULL && b - a - 1 < 16) memcpy(mode, a + 1, (size_t)(b - a - 1)), mode[b - a - 1] = '\0';
    }
    fclose(f);
}

// /proc/self/smaps' THPeligible of the mapping holding p: 1 or 0, -1 where it is not reported.
static int thp_eligible(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (f == NULL) return -1;
    char line[1024];
    int inside = 0, got = -1;
    while (got < 0 && fgets(line, sizeof line, f) != NULL) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && line[strspn(line, "0123456789abcdef")] == '-')
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (inside && strncmp(line, "THPeligible:", 12) == 0)
            got = atoi(line + 12);
    }
    fclose(f);
    return got;
}

typedef struct alloc_log {
    size_t largest_align; // the largest alignment asked for
    long live;
} alloc_log;

static void *logged_alloc(void *user, size_t size, size_t align) {
    alloc_log *l = user;
    if (align > l->largest_align) l->largest_align = align;
    void *p = NULL;
    if (posix_memalign(&p, align, size) != 0) return NULL;
    l->live++;
    return p;
}

static void logged_free(void *user, void *p) {
    ((alloc_log *)user)->live--;
    free(p);
}

// With the system allocator a cache's K and V of 2 MiB or more start on 2 MiB boundaries and, where
// the kernel offers transparent huge pages on request ("madvise"), are eligible for them (not
// checked with ATTN_TEST_EMULATOR set: a user-mode emulator such as qemu-aarch64 accepts madvise
// without passing it on); a caller's allocator is asked for the usual alignment and nothing more.
static void test_large_storage(void) {
    attn_ctx *ctx = test_ctx(ATTN_ISA_AUTO, 1);
    const int64_t B = 1, Hkv = 2, D = 128, cap = 4096; // 4 MiB each in float32
    attn_kv_cache *kc = make_cache(ctx, B, Hkv, D, cap, ATTN_DTYPE_F32);
    void *k, *v;
    int64_t ks[4], vs[4];
    attn_kv_cache_storage(kc, &k, ks, &v, vs);
    harness_checks++;
    if ((uintptr_t)k % (2u << 20) != 0 || (uintptr_t)v % (2u << 20) != 0) FAIL("cache storage %p, %p not on 2 MiB boundaries", k, v);
    char mode[16];
    thp_mode(mode);
    if (strcmp(mode, "madvise") == 0 && getenv("ATTN_TEST_EMULATOR") == NULL) { // only the library's advice makes it eligible
        const int ek = thp_eligible(k), ev = thp_eligible(v);
        harness_checks++;
        if (ek == 0 || ev == 0) FAIL("cache storage not advised for huge pages (THPeligible %d, %d)", ek, ev);
    }
    uint32_t seed = 3;
    float *x = randn(B * Hkv * 5 * D, &seed);
    ASSERT_OK(attn_kv_cache_append(ctx, kc, 5, x, NULL, x, NULL));
    ASSERT_TRUE(memcmp(k, x, (size_t)D * sizeof(float)) == 0); // position 0 of head 0, stored as given
    free(x);
    attn_kv_cache_free(kc);
    attn_ctx_free(ctx);

    alloc_log log = {0, 0};
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.allocator = (attn_allocator){logged_alloc, logged_free, &log};
    ASSERT_OK(attn_ctx_create(&p, &ctx));
    kc = make_cache(ctx, B, Hkv, D, cap, ATTN_DTYPE_F32);
    ASSERT_TRUE(log.largest_align < (2u << 20));
    attn_kv_cache_free(kc);
    attn_ctx_free(ctx);
    ASSERT_TRUE(log.live == 0);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_storage_and_errors),
        HARNESS_CASE(test_large_storage),
        HARNESS_CASE(test_attend),
        HARNESS_CASE(test_module_decoding),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

// test_soak.c - a long decode loop on KV caches of every type: appends, truncations and resets in
// a random order, one attend per step. Checks that the loop allocates nothing after its first
// steps (every allocation of the context goes through a counting allocator), that the resident
// memory stays flat, that every cache holds exactly what a model of it holds, and that the last
// step's result equals, bit for bit, a fresh cache filled with the same final positions at once.
//
// `make test` runs ATTN_SOAK_STEPS (default 10 000) steps; `make soak` runs 100 000.
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attn.h"
#include "harness.h"
#include "test_data.h"

// Sanitizers keep freed memory aside and map shadow memory: resident memory is theirs to grow.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SOAK_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SOAK_SANITIZED 1
#endif
#endif
#ifndef SOAK_SANITIZED
#define SOAK_SANITIZED 0
#endif

enum { B = 2, HKV = 2, H = 4, D = 32, CAP = 96, N_TYPES = 5 };

static const attn_dtype types[N_TYPES] = {ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16, ATTN_DTYPE_Q8_0,
                                          ATTN_DTYPE_Q4_0};

typedef struct counting {
    atomic_long allocs;
} counting;

static void *count_alloc(void *user, size_t size, size_t align) {
    atomic_fetch_add(&((counting *)user)->allocs, 1);
    void *p = NULL;
    return posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size ? size : 1) == 0 ? p : NULL;
}

static void count_free(void *user, void *p) {
    (void)user;
    free(p);
}


// Resident memory in bytes (Linux /proc/self/statm), -1 where it cannot be read.
// Resident anonymous memory: statm's resident pages minus its shared (file-backed) ones, so code
// pages faulted in lazily (a branch first taken late, or the page cache under other load) do not
// count as growth.
static long resident_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL) return -1;
    long size = 0, resident = -1, shared = 0;
    if (fscanf(f, "%ld %ld %ld", &size, &resident, &shared) != 3) resident = -1;
    fclose(f);
    return resident < 0 ? -1 : (resident - shared) * sysconf(_SC_PAGESIZE);
}

static long steps_wanted(void) {
    const char *e = getenv("ATTN_SOAK_STEPS");
    long n = e != NULL ? strtol(e, NULL, 10) : 10000;
    return n >= 100 ? n : 100;
}

// A one-query decode step of every head against the cache: bottom-right causal, GQA.
static void attend(attn_ctx *ctx, const attn_kv_cache *cache, const float *q, float *out) {
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = B, d.n_heads = H, d.len_q = 1, d.head_dim = D;
    d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, 1, D, d.q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, 1, D, d.o_stride);
    ASSERT_OK(attn_kv_cache_attend(ctx, cache, &d, q, out, NULL));
}

// The stored bytes of positions [0, len) of each (b, hk) row block of k and v.
static void assert_same_storage(attn_kv_cache *a, attn_kv_cache *b, attn_dtype dt, int64_t len) {
    void *ka, *va, *kb, *vb;
    int64_t ksa[4], vsa[4], ksb[4], vsb[4];
    attn_kv_cache_storage(a, &ka, ksa, &va, vsa);
    attn_kv_cache_storage(b, &kb, ksb, &vb, vsb);
    const size_t row = (size_t)(D / attn_dtype_block_size(dt)) * attn_dtype_size(dt);
    for (int64_t bh = 0; bh < B * HKV; bh++) {
        const size_t off = (size_t)(bh * CAP * D / attn_dtype_block_size(dt)) * attn_dtype_size(dt);
        ASSERT_TRUE(memcmp((char *)ka + off, (char *)kb + off, row * (size_t)len) == 0);
        ASSERT_TRUE(memcmp((char *)va + off, (char *)vb + off, row * (size_t)len) == 0);
    }
}

static void test_decode_loop_every_cache_type(void) {
    const long steps = steps_wanted(), warm = steps / 10;
    counting cnt;
    atomic_init(&cnt.allocs, 0);
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.n_threads = 2;
    p.allocator = (attn_allocator){count_alloc, count_free, &cnt};
    attn_ctx *ctx = NULL;
    ASSERT_OK(attn_ctx_create(&p, &ctx));
    attn_kv_cache *cache[N_TYPES];
    for (int t = 0; t < N_TYPES; t++) {
        attn_kv_cache_config c;
        attn_kv_cache_config_init(&c);
        c.batch = B, c.n_kv_heads = HKV, c.head_dim = D, c.capacity = CAP, c.dtype = types[t];
        ASSERT_OK(attn_kv_cache_create(ctx, &c, &cache[t]));
    }
    // the model: the float positions each cache was given, (B, HKV, CAP, D)
    static float km[B * HKV * CAP * D], vm[B * HKV * CAP * D];
    static float knew[B * HKV * 3 * D], vnew[B * HKV * 3 * D], q[B * H * D], out[N_TYPES][B * H * D];
    int64_t len = 0;
    long appends = 0, truncations = 0, resets = 0, allocs_after_warm = -1, rss_warm = -1;
    uint32_t seed = 12345;
    for (long step = 0; step < steps; step++) {
        const uint32_t r = step == steps - 1 ? 0 : lcg(&seed) % 100; // the last step appends
        if (r < 80) { // append 1 to 3 positions, first truncating a full cache to half
            const int64_t n = 1 + (int64_t)(lcg(&seed) % 3);
            if (len + n > CAP) {
                len /= 2;
                for (int t = 0; t < N_TYPES; t++) ASSERT_OK(attn_kv_cache_truncate(ctx, cache[t], len));
                truncations++;
            }
            for (int64_t i = 0; i < B * HKV * n * D; i++) knew[i] = rand_sym(&seed) * 3.0f, vnew[i] = rand_sym(&seed);
            for (int t = 0; t < N_TYPES; t++) ASSERT_OK(attn_kv_cache_append(ctx, cache[t], n, knew, NULL, vnew, NULL));
            for (int64_t bh = 0; bh < B * HKV; bh++)
                for (int64_t i = 0; i < n; i++) {
                    memcpy(km + (bh * CAP + len + i) * D, knew + (bh * n + i) * D, D * sizeof(float));
                    memcpy(vm + (bh * CAP + len + i) * D, vnew + (bh * n + i) * D, D * sizeof(float));
                }
            len += n, appends++;
        } else if (r < 95) {
            len = len > 0 ? (int64_t)(lcg(&seed) % (uint32_t)(len + 1)) : 0;
            for (int t = 0; t < N_TYPES; t++) ASSERT_OK(attn_kv_cache_truncate(ctx, cache[t], len));
            truncations++;
        } else {
            len = 0;
            for (int t = 0; t < N_TYPES; t++) attn_kv_cache_reset(cache[t]);
            resets++;
        }
        for (int t = 0; t < N_TYPES; t++) ASSERT_EQ_INT(attn_kv_cache_length(cache[t]), len);
        if (len == 0) continue;
        for (int64_t i = 0; i < B * H * D; i++) q[i] = rand_sym(&seed);
        for (int t = 0; t < N_TYPES; t++) attend(ctx, cache[t], q, out[t]);
        if (step == warm) allocs_after_warm = atomic_load(&cnt.allocs), rss_warm = resident_bytes();
    }
    ASSERT_TRUE(allocs_after_warm >= 0);
    const long allocs_loop = atomic_load(&cnt.allocs) - allocs_after_warm, rss_end = resident_bytes();
    printf("  %ld steps: %ld appends, %ld truncations, %ld resets; allocations after step %ld: %ld; "
           "resident %.1f MiB at step %ld, %.1f MiB at the end\n",
           steps, appends, truncations, resets, warm, allocs_loop, rss_warm / 1048576.0, warm, rss_end / 1048576.0);
    fflush(stdout);
    ASSERT_EQ_INT(allocs_loop, 0); // the loop allocates nothing once its buffers have grown
#if !SOAK_SANITIZED
    // flat: at most 256 KiB more than after the warm-up (the loop itself allocates nothing)
    if (rss_warm > 0 && rss_end > 0) ASSERT_TRUE(rss_end - rss_warm <= 256 * 1024);
#endif

    // A fresh context and fresh caches given the final positions in one append: the same bytes stored
    // and the same bits out for the last step's queries.
    ASSERT_TRUE(len > 0);
    attn_ctx *fresh_ctx = NULL;
    attn_ctx_params fp;
    attn_ctx_params_init(&fp);
    fp.n_threads = 2;
    ASSERT_OK(attn_ctx_create(&fp, &fresh_ctx));
    for (int t = 0; t < N_TYPES; t++) {
        attn_kv_cache_config c = *attn_kv_cache_get_config(cache[t]);
        attn_kv_cache *fresh = NULL;
        ASSERT_OK(attn_kv_cache_create(fresh_ctx, &c, &fresh));
        const int64_t st[4] = {HKV * CAP * D, CAP * D, D, 1};
        ASSERT_OK(attn_kv_cache_append(fresh_ctx, fresh, len, km, st, vm, st));
        assert_same_storage(cache[t], fresh, types[t], len);
        static float again[B * H * D];
        attend(fresh_ctx, fresh, q, again);
        ASSERT_BITS_EQ(again, out[t], B * H * D);
        attn_kv_cache_free(fresh);
    }
    attn_ctx_free(fresh_ctx);
    for (int t = 0; t < N_TYPES; t++) attn_kv_cache_free(cache[t]);
    attn_ctx_free(ctx);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {HARNESS_CASE(test_decode_loop_every_cache_type)};
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

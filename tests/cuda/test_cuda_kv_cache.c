// test_cuda_kv_cache.c - device KV caches (attn_cuda_kv_cache_*): random batches of sequences of
// different lengths appended in several steps, each step's attend (1 to 3 new queries per sequence,
// bottom-right causal, GQA, BF16/F16/F32, head dims 40, 64, 128) against the CPU's
// attn_sdpa_varlen_fwd on the same rows packed (tolerance 4u max|v|, 1e-5 for F32); a paged cache
// (pages of 1, 3, 16, 24 or 64 tokens, not adjacent in the pool) and a contiguous one holding the
// same rows give the same bits; capacity errors leave the cache as it was. Without a GPU the cases
// report themselves skipped (ATTN_CUDA_REQUIRE_GPU turns that into a failure).
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attn_cuda.h"
#include "harness.h"
#include "cuda_test_util.h"

enum { MAXB = 4, CAP = 200 };

static void run_case(attn_cuda_ctx *g) {
    const uint64_t seed = rng;
    static const int64_t dims[3] = {40, 64, 128};
    static const attn_dtype types[3] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16, ATTN_DTYPE_F32};
    const attn_dtype t = types[pick(3)];
    const int64_t B = 1 + pick(MAXB), Hkv = 1 + pick(3), G = 1 + pick(4), H = Hkv * G, D = dims[pick(3)];
    const size_t es = attn_dtype_size(t);
    attn_cuda_kv_cache_config cfg;
    attn_cuda_kv_cache_config_init(&cfg);
    cfg.batch = B, cfg.n_kv_heads = Hkv, cfg.head_dim = D, cfg.capacity = CAP, cfg.dtype = t;
    attn_cuda_kv_cache *flat = NULL, *paged = NULL;
    ASSERT_OK(attn_cuda_kv_cache_create(g, &cfg, &flat));
    static const int64_t page_sizes[5] = {1, 3, 16, 24, 64}; // below, across and above decode-vec's 8-key pass
    cfg.page_size = page_sizes[pick(5)];
    ASSERT_OK(attn_cuda_kv_cache_create(g, &cfg, &paged));
    // the host's copy of every sequence's rows, as floats of the type's values: (B, CAP, Hkv, D)
    float *hk = calloc((size_t)(B * CAP * Hkv * D), 4), *hv = calloc((size_t)(B * CAP * Hkv * D), 4);
    int64_t len[MAXB] = {0};
    attn_ctx *cpu = NULL;
    attn_ctx_params hp;
    attn_ctx_params_init(&hp);
    hp.isa = ATTN_ISA_REF;
    ASSERT_OK(attn_ctx_create(&hp, &cpu));
    for (int step = 0; step < 3; step++) {
        int64_t n[MAXB], total = 0;
        for (int64_t b = 0; b < B; b++) n[b] = pick(61), total += n[b];
        float *kf = malloc((size_t)(total * Hkv * D + 1) * 4), *vf = malloc((size_t)(total * Hkv * D + 1) * 4);
        void *kt = malloc((size_t)(total * Hkv * D + 1) * es), *vt = malloc((size_t)(total * Hkv * D + 1) * es);
        for (int64_t x = 0; x < total * Hkv * D; x++) kf[x] = urand(), vf[x] = urand();
        ASSERT_OK(attn_convert(t, kt, ATTN_DTYPE_F32, kf, total * Hkv * D));
        ASSERT_OK(attn_convert(t, vt, ATTN_DTYPE_F32, vf, total * Hkv * D));
        ASSERT_OK(attn_convert(ATTN_DTYPE_F32, kf, t, kt, total * Hkv * D)); // the values stored
        ASSERT_OK(attn_convert(ATTN_DTYPE_F32, vf, t, vt, total * Hkv * D));
        void *dk = up(kt, (size_t)(total * Hkv * D) * es), *dv = up(vt, (size_t)(total * Hkv * D) * es);
        ASSERT_OK(attn_cuda_kv_cache_append(g, flat, n, dk, dv));
        ASSERT_OK(attn_cuda_kv_cache_append(g, paged, n, dk, dv));
        for (int64_t b = 0, r = 0; b < B; b++)
            for (int64_t i = 0; i < n[b]; i++, r++) {
                memcpy(hk + ((b * CAP + len[b] + i) * Hkv) * D, kf + r * Hkv * D, (size_t)(Hkv * D) * 4);
                memcpy(hv + ((b * CAP + len[b] + i) * Hkv) * D, vf + r * Hkv * D, (size_t)(Hkv * D) * 4);
            }
        for (int64_t b = 0; b < B; b++) len[b] += n[b];
        int64_t got_len[MAXB];
        ASSERT_OK(attn_cuda_kv_cache_lengths(flat, got_len));
        for (int64_t b = 0; b < B; b++) ASSERT_EQ_INT(got_len[b], len[b]);

        // queries: 1 to 3 per sequence, packed (total_q, H, D)
        int64_t cu_q[MAXB + 1] = {0}, lq_max = 1;
        for (int64_t b = 0; b < B; b++) {
            const int64_t lq = 1 + pick(3);
            cu_q[b + 1] = cu_q[b] + lq;
            if (lq > lq_max) lq_max = lq;
        }
        const int64_t tq = cu_q[B], nq = tq * H * D;
        float *qf = malloc((size_t)nq * 4), *ref = malloc((size_t)nq * 4), *a = malloc((size_t)nq * 4);
        void *qt = malloc((size_t)nq * es), *o1 = malloc((size_t)nq * es), *o2 = malloc((size_t)nq * es);
        for (int64_t x = 0; x < nq; x++) qf[x] = urand();
        ASSERT_OK(attn_convert(t, qt, ATTN_DTYPE_F32, qf, nq));
        ASSERT_OK(attn_convert(ATTN_DTYPE_F32, qf, t, qt, nq));
        void *dq = up(qt, (size_t)nq * es), *dout1 = up(NULL, (size_t)nq * es), *dout2 = up(NULL, (size_t)nq * es);
        attn_sdpa_desc d;
        attn_sdpa_desc_init(&d);
        d.batch = B, d.n_heads = H, d.n_kv_heads = Hkv, d.len_q = lq_max, d.head_dim = D;
        d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
        d.q_stride[1] = d.o_stride[1] = D, d.q_stride[2] = d.o_stride[2] = H * D, d.q_stride[3] = d.o_stride[3] = 1;
        d.q_dtype = d.kv_dtype = d.out_dtype = t;
        ASSERT_OK(attn_cuda_kv_cache_attend(g, flat, &d, cu_q, dq, dout1, NULL));
        ASSERT_OK(attn_cuda_kv_cache_attend(g, paged, &d, cu_q, dq, dout2, NULL));
        if (cudaDeviceSynchronize() != cudaSuccess) FAIL("seed %llu: a kernel failed", (unsigned long long)seed);
        cudaMemcpy(o1, dout1, (size_t)nq * es, cudaMemcpyDeviceToHost);
        cudaMemcpy(o2, dout2, (size_t)nq * es, cudaMemcpyDeviceToHost);
        if (memcmp(o1, o2, (size_t)nq * es) != 0) FAIL("seed %llu: paged and contiguous caches differ", (unsigned long long)seed);
        // the reference: the same rows packed, (total_k, Hkv, D)
        int64_t cu_k[MAXB + 1] = {0};
        for (int64_t b = 0; b < B; b++) cu_k[b + 1] = cu_k[b] + len[b];
        float *pk = malloc((size_t)(cu_k[B] * Hkv * D + 1) * 4), *pv = malloc((size_t)(cu_k[B] * Hkv * D + 1) * 4);
        for (int64_t b = 0; b < B; b++) {
            memcpy(pk + cu_k[b] * Hkv * D, hk + b * CAP * Hkv * D, (size_t)(len[b] * Hkv * D) * 4);
            memcpy(pv + cu_k[b] * Hkv * D, hv + b * CAP * Hkv * D, (size_t)(len[b] * Hkv * D) * 4);
        }
        attn_sdpa_desc rd = d;
        rd.len_kv = 1;
        for (int64_t b = 0; b < B; b++) rd.len_kv = len[b] > rd.len_kv ? len[b] : rd.len_kv;
        rd.k_stride[1] = rd.v_stride[1] = D, rd.k_stride[2] = rd.v_stride[2] = Hkv * D, rd.k_stride[3] = rd.v_stride[3] = 1;
        rd.q_dtype = rd.kv_dtype = rd.out_dtype = ATTN_DTYPE_F32;
        ASSERT_OK(attn_sdpa_varlen_fwd(cpu, &rd, cu_q, cu_k, qf, pk, pv, ref, NULL));
        ASSERT_OK(attn_convert(ATTN_DTYPE_F32, a, t, o1, nq));
        const double u = t == ATTN_DTYPE_BF16 ? 0x1p-8 : t == ATTN_DTYPE_F16 ? 0x1p-11 : 0.25e-5;
        for (int64_t x = 0; x < nq; x++)
            if (!(fabs((double)a[x] - ref[x]) <= 4 * u))
                FAIL("seed %llu: out[%lld] = %g, reference %g", (unsigned long long)seed, (long long)x, a[x], ref[x]);
        harness_checks++;
        cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dout1), cudaFree(dout2);
        free(kf), free(vf), free(kt), free(vt), free(qf), free(ref), free(a), free(qt), free(o1), free(o2), free(pk), free(pv);
    }
    // a sequence past its capacity: ATTN_ERR_CAPACITY, nothing appended
    int64_t n[MAXB] = {0};
    n[B - 1] = CAP - len[B - 1] + 1;
    void *big = up(NULL, (size_t)(n[B - 1] * Hkv * D) * es);
    ASSERT_STATUS(attn_cuda_kv_cache_append(g, flat, n, big, big), ATTN_ERR_CAPACITY);
    int64_t after[MAXB];
    ASSERT_OK(attn_cuda_kv_cache_lengths(flat, after));
    for (int64_t b = 0; b < B; b++) ASSERT_EQ_INT(after[b], len[b]);
    cudaFree(big);
    free(hk), free(hv);
    attn_ctx_free(cpu);
    attn_cuda_kv_cache_free(flat);
    attn_cuda_kv_cache_free(paged);
}

static void test_against_reference(void) {
    attn_cuda_ctx *g = gpu_ctx();
    for (int r = 0; r < 12; r++) run_case(g);
    attn_cuda_ctx_free(g);
}

// Soak: a long decode loop over six caches (F32, F16, BF16; contiguous and paged by 16) of B = 2
// sequences, Hkv = 2, H = 4, D = 32, 96 positions: in a random order appends of 1 to 3 tokens per
// sequence (80%; a full sequence is first cut to half), truncations to random lengths (15%) and
// resets (5%), the same on every cache, then one query per sequence attended on each. Checked: the
// lengths against a model at every step; the contiguous and paged caches of a type give the same
// bits at every step; the device memory free (cudaMemGetInfo, whose granules are 2 MiB) at the end
// within 4 MiB, and the resident host memory (/proc/self/statm) within 1 MiB, of their values after
// the first tenth of the steps
// (every buffer of the loop is allocated before it); at the end, fresh caches given the final
// positions in one append give the same bits for the last step's queries. ATTN_SOAK_STEPS steps
// (default 2000; 100 000 for the long run of docs/reliability.md).
enum { SB = 2, SHKV = 2, SH = 4, SD = 32, SCAP = 96, SROW = SHKV * SD, SNQ = SB * SH * SD };

static const attn_dtype soak_types[3] = {ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16};

typedef struct soak {
    attn_cuda_ctx *g;
    attn_cuda_kv_cache *caches[6];      // 2t: contiguous, 2t + 1: paged, of soak_types[t]
    unsigned char *mk[3], *mv[3];       // the model: (SB, SCAP, SROW) keys and values in each type's bytes
    int64_t len[SB];
    void *dk, *dv, *dq, *dout;          // device staging, allocated once
    unsigned char q[3][SNQ * 4];        // the last queries, in each type's bytes
    unsigned char out[6][SNQ * 4];      // each cache's last output
} soak;

static long resident_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f == NULL) return -1;
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = -1;
    fclose(f);
    return rss < 0 ? -1 : rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static attn_cuda_kv_cache *soak_cache(attn_cuda_ctx *g, int c) {
    attn_cuda_kv_cache_config cfg;
    attn_cuda_kv_cache_config_init(&cfg);
    cfg.batch = SB, cfg.n_kv_heads = SHKV, cfg.head_dim = SD, cfg.capacity = SCAP, cfg.dtype = soak_types[c / 2];
    cfg.page_size = c % 2 ? 16 : 0;
    attn_cuda_kv_cache *cache = NULL;
    ASSERT_OK(attn_cuda_kv_cache_create(g, &cfg, &cache));
    return cache;
}

// Appends n[b] random tokens to sequence b of every cache (and the model).
static void soak_append(soak *w, const int64_t n[SB]) {
    float kf[SB * 3 * SROW], vf[SB * 3 * SROW];
    unsigned char kt[sizeof kf], vt[sizeof vf];
    const int64_t r = n[0] + n[1];
    for (int64_t x = 0; x < r * SROW; x++) kf[x] = urand(), vf[x] = urand();
    for (int t = 0; t < 3; t++) {
        const size_t es = attn_dtype_size(soak_types[t]);
        ASSERT_OK(attn_convert(soak_types[t], kt, ATTN_DTYPE_F32, kf, r * SROW));
        ASSERT_OK(attn_convert(soak_types[t], vt, ATTN_DTYPE_F32, vf, r * SROW));
        if (cudaMemcpy(w->dk, kt, (size_t)(r * SROW) * es, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemcpy(w->dv, vt, (size_t)(r * SROW) * es, cudaMemcpyHostToDevice) != cudaSuccess)
            FAIL("cudaMemcpy");
        for (int c = 2 * t; c < 2 * t + 2; c++) ASSERT_OK(attn_cuda_kv_cache_append(w->g, w->caches[c], n, w->dk, w->dv));
        for (int64_t b = 0, o = 0; b < SB; o += n[b], b++) {
            const size_t at = (size_t)((b * SCAP + w->len[b]) * SROW) * es, from = (size_t)(o * SROW) * es;
            memcpy(w->mk[t] + at, kt + from, (size_t)(n[b] * SROW) * es);
            memcpy(w->mv[t] + at, vt + from, (size_t)(n[b] * SROW) * es);
        }
    }
    for (int b = 0; b < SB; b++) w->len[b] += n[b];
}

static void soak_truncate(soak *w, const int64_t cut[SB]) {
    for (int c = 0; c < 6; c++) ASSERT_OK(attn_cuda_kv_cache_truncate(w->g, w->caches[c], cut));
    memcpy(w->len, cut, sizeof w->len);
}

// One query per sequence on cache c of type t (queries w->q[t]) into out.
static void soak_attend(soak *w, attn_cuda_kv_cache *cache, int t, unsigned char *out) {
    static const int64_t cu_q[SB + 1] = {0, 1, 2};
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = SB, d.n_heads = SH, d.n_kv_heads = SHKV, d.len_q = 1, d.head_dim = SD, d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    d.q_stride[1] = d.o_stride[1] = SD, d.q_stride[2] = d.o_stride[2] = SH * SD, d.q_stride[3] = d.o_stride[3] = 1;
    d.q_dtype = d.kv_dtype = d.out_dtype = soak_types[t];
    const size_t bytes = (size_t)SNQ * attn_dtype_size(soak_types[t]);
    if (cudaMemcpy(w->dq, w->q[t], bytes, cudaMemcpyHostToDevice) != cudaSuccess) FAIL("cudaMemcpy");
    ASSERT_OK(attn_cuda_kv_cache_attend(w->g, cache, &d, cu_q, w->dq, w->dout, NULL));
    down(out, w->dout, bytes);
}

static void test_soak(void) {
    soak *w = calloc(1, sizeof *w);
    w->g = gpu_ctx();
    const char *env = getenv("ATTN_SOAK_STEPS");
    const long steps = env != NULL ? strtol(env, NULL, 10) : 2000;
    for (int c = 0; c < 6; c++) w->caches[c] = soak_cache(w->g, c);
    for (int t = 0; t < 3; t++) w->mk[t] = calloc((size_t)(SB * SCAP * SROW), 4), w->mv[t] = calloc((size_t)(SB * SCAP * SROW), 4);
    w->dk = up(NULL, (size_t)(SB * 3 * SROW) * 4), w->dv = up(NULL, (size_t)(SB * 3 * SROW) * 4);
    w->dq = up(NULL, (size_t)SNQ * 4), w->dout = up(NULL, (size_t)SNQ * 4);
    size_t free0 = 0, free1 = 0, total = 0;
    long rss0 = -1, appends = 0, truncations = 0, resets = 0;
    for (long s = 0; s < steps || w->len[0] == 0 || w->len[1] == 0; s++) { // ends on a step that attends
        if (s == steps / 10) {
            if (cudaDeviceSynchronize() != cudaSuccess || cudaMemGetInfo(&free0, &total) != cudaSuccess) FAIL("cudaMemGetInfo");
            rss0 = resident_kib();
        }
        const int act = s >= steps ? 0 : pick(100);
        if (act < 80) {
            int64_t n[SB], cut[SB];
            int full = 0;
            for (int b = 0; b < SB; b++) n[b] = 1 + pick(3), cut[b] = w->len[b] + n[b] > SCAP ? w->len[b] / 2 : w->len[b], full |= cut[b] != w->len[b];
            if (full) soak_truncate(w, cut), truncations++;
            soak_append(w, n), appends++;
        } else if (act < 95) {
            int64_t cut[SB];
            for (int b = 0; b < SB; b++) cut[b] = pick((int)w->len[b] + 1);
            soak_truncate(w, cut), truncations++;
        } else {
            for (int c = 0; c < 6; c++) ASSERT_OK(attn_cuda_kv_cache_reset(w->g, w->caches[c]));
            memset(w->len, 0, sizeof w->len), resets++;
        }
        for (int c = 0; c < 6; c++) {
            int64_t got[SB];
            ASSERT_OK(attn_cuda_kv_cache_lengths(w->caches[c], got));
            for (int b = 0; b < SB; b++)
                if (got[b] != w->len[b])
                    FAIL("step %ld: cache %d, sequence %d holds %lld, the model %lld", s, c, b, (long long)got[b], (long long)w->len[b]);
        }
        if (w->len[0] == 0 || w->len[1] == 0) continue; // every sequence needs a key to attend to
        float qf[SNQ];
        for (int x = 0; x < SNQ; x++) qf[x] = urand();
        for (int t = 0; t < 3; t++) {
            ASSERT_OK(attn_convert(soak_types[t], w->q[t], ATTN_DTYPE_F32, qf, SNQ));
            soak_attend(w, w->caches[2 * t], t, w->out[2 * t]);
            soak_attend(w, w->caches[2 * t + 1], t, w->out[2 * t + 1]);
            if (memcmp(w->out[2 * t], w->out[2 * t + 1], (size_t)SNQ * attn_dtype_size(soak_types[t])) != 0)
                FAIL("step %ld: the %s contiguous and paged caches differ", s, attn_dtype_name(soak_types[t]));
        }
    }
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemGetInfo(&free1, &total) != cudaSuccess) FAIL("cudaMemGetInfo");
    const long rss1 = resident_kib();
    fprintf(stderr, "    %ld steps: %ld appends, %ld truncations, %ld resets; device free %.1f -> %.1f MiB, resident %ld -> %ld KiB\n",
            steps, appends, truncations, resets, free0 / 1048576.0, free1 / 1048576.0, rss0, rss1);
    if (steps >= 10 && free1 + (4 << 20) < free0) FAIL("device memory free fell by %zu bytes", free0 - free1);
    if (steps >= 10 && rss0 > 0 && rss1 > rss0 + 1024) FAIL("resident memory grew from %ld to %ld KiB", rss0, rss1);
    // fresh caches given the final positions in one append: the last queries, the same bits
    for (int t = 0; t < 3; t++) {
        const size_t es = attn_dtype_size(soak_types[t]);
        unsigned char *k = malloc((size_t)((w->len[0] + w->len[1]) * SROW) * es), *v = malloc((size_t)((w->len[0] + w->len[1]) * SROW) * es);
        for (int64_t b = 0, o = 0; b < SB; o += w->len[b], b++) {
            memcpy(k + (size_t)(o * SROW) * es, w->mk[t] + (size_t)(b * SCAP * SROW) * es, (size_t)(w->len[b] * SROW) * es);
            memcpy(v + (size_t)(o * SROW) * es, w->mv[t] + (size_t)(b * SCAP * SROW) * es, (size_t)(w->len[b] * SROW) * es);
        }
        void *fk = up(k, (size_t)((w->len[0] + w->len[1]) * SROW) * es), *fv = up(v, (size_t)((w->len[0] + w->len[1]) * SROW) * es);
        for (int c = 2 * t; c < 2 * t + 2; c++) {
            attn_cuda_kv_cache *fresh = soak_cache(w->g, c);
            ASSERT_OK(attn_cuda_kv_cache_append(w->g, fresh, w->len, fk, fv));
            unsigned char got[SNQ * 4];
            soak_attend(w, fresh, t, got);
            if (memcmp(got, w->out[c], (size_t)SNQ * es) != 0)
                FAIL("the %s %s cache differs from a fresh one holding the same positions", attn_dtype_name(soak_types[t]),
                     c % 2 ? "paged" : "contiguous");
            attn_cuda_kv_cache_free(fresh);
        }
        harness_checks++;
        cudaFree(fk), cudaFree(fv), free(k), free(v);
    }
    for (int c = 0; c < 6; c++) attn_cuda_kv_cache_free(w->caches[c]);
    for (int t = 0; t < 3; t++) free(w->mk[t]), free(w->mv[t]);
    cudaFree(w->dk), cudaFree(w->dv), cudaFree(w->dq), cudaFree(w->dout);
    attn_cuda_ctx_free(w->g);
    free(w);
}

// Without a device: the arguments a cache call checks first.
static void test_arguments(void) {
    attn_cuda_kv_cache_config cfg;
    memset(&cfg, 0x5a, sizeof cfg);
    attn_cuda_kv_cache_config_init(&cfg);
    ASSERT_EQ_INT(cfg.page_size, 0);
    ASSERT_EQ_INT(cfg.dtype, ATTN_DTYPE_F32);
    attn_cuda_kv_cache *c = NULL;
    ASSERT_STATUS(attn_cuda_kv_cache_create(NULL, &cfg, &c), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_cuda_kv_cache_lengths(NULL, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_cuda_kv_cache_append(NULL, NULL, NULL, NULL, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_cuda_kv_cache_truncate(NULL, NULL, NULL), ATTN_ERR_INVALID_ARG);
    attn_cuda_kv_cache_free(NULL);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {HARNESS_CASE(test_arguments), HARNESS_CASE(test_against_reference),
                                         HARNESS_CASE(test_soak)};
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

// test_cuda_kv_cache.c - device KV caches (attn_cuda_kv_cache_*): random batches of sequences of
// different lengths appended in several steps, each step's attend (1 to 3 new queries per sequence,
// bottom-right causal, GQA, BF16/F16/F32, head dims 40, 64, 128) against the CPU's
// attn_sdpa_varlen_fwd on the same rows packed (tolerance 4u max|v|, 1e-5 for F32); a paged cache
// (pages of 16 and 64 tokens, not adjacent in the pool) and a contiguous one holding the same rows
// give the same bits; capacity errors leave the cache as it was. Without a GPU the cases report
// themselves skipped (ATTN_CUDA_REQUIRE_GPU turns that into a failure).
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    cfg.page_size = pick(2) ? 16 : 64;
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
    attn_cuda_kv_cache_free(NULL);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {HARNESS_CASE(test_arguments), HARNESS_CASE(test_against_reference)};
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

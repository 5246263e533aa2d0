// cuda_test_util.h - what the GPU tests share: a context on GPU 0 (the case is skipped without a
// usable GPU, or fails when ATTN_CUDA_REQUIRE_GPU is set, as make test-cuda sets), device buffers,
// and a seeded generator of test data. Include after harness.h.
#ifndef ATTN_CUDA_TEST_UTIL_H
#define ATTN_CUDA_TEST_UTIL_H

#include <cuda_runtime_api.h>
#include <stdlib.h>

#include "attn_cuda.h"

static uint64_t rng = 12345;
static inline uint32_t next32(void) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng >> 33);
}
// Uniform in [-1, 1).
static inline float urand(void) { return (float)(next32() >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }
static inline int pick(int n) { return (int)(next32() % (uint32_t)n); }

static inline attn_cuda_ctx *gpu_ctx(void) {
    char why[256];
    if (attn_cuda_probe(0, why, sizeof why) != ATTN_OK) {
        if (getenv("ATTN_CUDA_REQUIRE_GPU") != NULL) FAIL("no usable GPU: %s", why);
        SKIP("no usable GPU: %s", why);
    }
    attn_cuda_ctx *ctx = NULL;
    ASSERT_OK(attn_cuda_ctx_create(NULL, &ctx));
    return ctx;
}

// A device buffer of `bytes`, holding h's bytes when h is not NULL.
static inline void *up(const void *h, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes > 0 ? bytes : 1) != cudaSuccess) FAIL("cudaMalloc(%zu)", bytes);
    if (h != NULL && bytes > 0 && cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess) FAIL("cudaMemcpy");
    return d;
}
static inline void down(void *h, const void *d, size_t bytes) {
    if (cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) FAIL("cudaMemcpy back");
}

#endif

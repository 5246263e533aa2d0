// ctx.h - the context of libattn_cuda (attn_cuda.h): device, stream, workspace and last error.
#ifndef ATTN_CUDA_CTX_H
#define ATTN_CUDA_CTX_H

#include <cuda_runtime_api.h>
#include <stdbool.h>

#include "plan.h"

struct attn_cuda_ctx {
    attn__cuda_err err;         // last error; err.host is a libattn context for the shared checks
    int device;
    cudaStream_t stream;
    attn_cuda_kernels kernels;
    bool deterministic;         // the backward without atomics (attn_cuda_ctx_params.deterministic)
    attn__cuda_device dev;      // what the planner needs of the device
    void *ws;                   // device workspace: owned (stream-ordered allocation) or the caller's
    size_t ws_size;
    bool ws_external;
    bool pageable_ok;           // the device reads pageable host memory (HMM / ATS systems)
    attn_cuda_allocator mem;    // device memory hooks (mem.c); alloc NULL: the CUDA runtime's
};

// Device memory through a context's hooks (attn_cuda_allocator; mem.c): `bytes` on `stream`
// (ordered: cudaMallocAsync without hooks, else cudaMalloc). NULL hooks' failures are CUDA errors;
// a hook's NULL is cudaErrorMemoryAllocation. attn__cuda_mem_free takes the same `ordered`.
int attn__cuda_mem_alloc(const attn_cuda_allocator *mem, void **p, size_t bytes, cudaStream_t stream, bool ordered);
void attn__cuda_mem_free(const attn_cuda_allocator *mem, void *p, cudaStream_t stream, bool ordered);

// A failed CUDA call as ATTN_ERR_DEVICE with "<what>: <CUDA error name>: <description>".
attn_status attn__cuda_device_fail(attn__cuda_err *e, int cuda_error, const char *what);

// A workspace of at least `bytes` (0: none) starting on an ATTN__CU_WS_ALIGN boundary: the
// caller's (ATTN_ERR_WORKSPACE when too small) or the context's own, grown stream-ordered.
attn_status attn__cuda_workspace(attn_cuda_ctx *ctx, size_t bytes, unsigned char **base);

// Whether the device can read `p` (NULL: nothing to check; sdpa.c). A host pointer the device
// cannot reach would fault inside a kernel or product and leave the CUDA context unusable; it is
// refused instead (ATTN_ERR_INVALID_ARG, "<what> is host memory the GPU cannot read"), unless the
// device reads pageable memory.
attn_status attn__cuda_check_device_ptr(attn_cuda_ctx *ctx, const void *p, const char *what);

// Enqueues a forward planned by attn__cuda_plan_sdpa (sdpa.c), its parameters possibly adjusted
// (the KV caches' per-sequence key counts and page tables); the tensors' pointers checked first.
attn_status attn__cuda_run_planned(attn_cuda_ctx *ctx, const attn_sdpa_desc *d, attn__cuda_sdpa_plan *plan,
                                   const attn__cuda_seqs *seqs, const void *q, const void *k, const void *v, void *out,
                                   float *lse);

// Whether an append of n_new[b] tokens to each of the cache's sequences followed by
// attn_cuda_kv_cache_attend(desc, cu_seqlens_q, q, out) would be accepted (the cache's fit, its
// capacity, the planner's checks), changing and launching nothing: attn_cuda_mha_forward_cached
// checks its step with it before it projects anything.
attn_status attn__cuda_kv_cache_check_step(attn_cuda_ctx *ctx, const attn_cuda_kv_cache *c, const int64_t *n_new,
                                           const attn_sdpa_desc *desc, const int64_t *cu_seqlens_q, const void *q,
                                           const void *out);

#endif

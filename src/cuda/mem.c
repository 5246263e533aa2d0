// mem.c - device memory for libattn_cuda: the caller's hooks (attn_cuda_ctx_params.allocator) when
// set, else the CUDA runtime (stream-ordered for the workspace and scratch, plain for storage that
// outlives any one call: caches and parameters).
#include "ctx.h"

int attn__cuda_mem_alloc(const attn_cuda_allocator *mem, void **p, size_t bytes, cudaStream_t stream, bool ordered) {
    *p = NULL;
    if (mem->alloc != NULL) {
        *p = mem->alloc(mem->user, bytes, (attn_cuda_stream)stream);
        return *p != NULL ? cudaSuccess : cudaErrorMemoryAllocation;
    }
    return ordered ? cudaMallocAsync(p, bytes, stream) : cudaMalloc(p, bytes);
}

void attn__cuda_mem_free(const attn_cuda_allocator *mem, void *p, cudaStream_t stream, bool ordered) {
    if (p == NULL) return;
    if (mem->free != NULL) mem->free(mem->user, p, (attn_cuda_stream)stream);
    else if (ordered) cudaFreeAsync(p, stream);
    else cudaFree(p);
}

// kv_append.cu - appending new key and value rows to a device KV cache (kv_cache.c): one thread per
// element of the packed new rows ((total_new, Hkv, D) and (total_new, Hkv, Dv)), each written at its
// sequence's next free position, through the page table when the cache is paged.
#include <cuda_runtime.h>

#include "../launch.h"
#include "common.cuh"

namespace attn_cuda {

__device__ __forceinline__ int64_t dest_row(const attn__cuda_kv_append &a, const int64_t st[4], int64_t b, int64_t hk,
                                            int64_t t) {
    if (a.page_table != nullptr) {
        const int64_t page = a.page_table[b * a.max_pages + t / a.page_size];
        return page * st[0] + hk * st[1] + (t % a.page_size) * st[2];
    }
    return b * st[0] + hk * st[1] + t * st[2];
}

__global__ void kv_append_kernel(const attn__cuda_kv_append a) {
    const int64_t per_row = a.Hkv * (a.D + a.Dv);
    const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= a.total_new * per_row) return;
    const int64_t r = x / per_row, rest = x % per_row;
    int64_t lo = 0, hi = a.B; // the sequence of packed row r: cu_new[b] <= r < cu_new[b + 1]
    while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        if (a.cu_new[mid] <= r) lo = mid;
        else hi = mid;
    }
    const int64_t b = lo, t = a.len[b] + (r - a.cu_new[b]);
    const bool is_k = rest < a.Hkv * a.D;
    const int64_t w = is_k ? a.D : a.Dv, e = is_k ? rest : rest - a.Hkv * a.D, hk = e / w, d = e % w;
    const int64_t src = (r * a.Hkv + hk) * w + d;
    const int64_t dst = dest_row(a, is_k ? a.k_stride : a.v_stride, b, hk, t) + d;
    if (a.elem_size == 4)
        static_cast<float *>(is_k ? a.k : a.v)[dst] = static_cast<const float *>(is_k ? a.k_new : a.v_new)[src];
    else
        static_cast<uint16_t *>(is_k ? a.k : a.v)[dst] = static_cast<const uint16_t *>(is_k ? a.k_new : a.v_new)[src];
}

} // namespace attn_cuda

extern "C" int attn__cuda_launch_kv_append(const attn__cuda_kv_append *a, cudaStream_t stream) {
    const int64_t n = a->total_new * a->Hkv * (a->D + a->Dv);
    if (n == 0) return cudaSuccess;
    const int threads = 256;
    attn_cuda::kv_append_kernel<<<dim3((unsigned)((n + threads - 1) / threads)), threads, 0, stream>>>(*a);
    return cudaGetLastError();
}

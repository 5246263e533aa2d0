// mha_rows.cu - the rows the module adds to its keys and values (bias_k/bias_v and the zero key of
// add_zero_attn) and the masks widened to those keys (mha.c): element by element, one thread each.
#include <cuda_runtime.h>

#include "../launch.h"
#include "common.cuh"

namespace attn_cuda {

__global__ void rows_put_kernel(unsigned char *dst, int64_t rows, int64_t pitch, const unsigned char *src,
                                int64_t width) {
    const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= rows * width) return;
    const int64_t r = x / width, c = x % width;
    dst[r * pitch + c] = src != nullptr ? src[c] : 0;
}

__global__ void mask_widen_kernel(unsigned char *dst, const unsigned char *src, int64_t src_pitch, int64_t rows,
                                  int64_t L, int64_t S, int64_t S2, int64_t elem) {
    const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= rows * S2) return;
    const int64_t r = x / S2, j = x % S2;
    unsigned char *out = dst + x * elem;
    if (src == nullptr) { // the causal mask (bool): key j hidden from query row r % L when j > r, j < S
        out[0] = (unsigned char)(j < S && j > r % L);
        return;
    }
    const unsigned char *in = src + (r * src_pitch + j) * elem;
    for (int64_t b = 0; b < elem; b++) out[b] = j < S ? in[b] : 0;
}

} // namespace attn_cuda

extern "C" int attn__cuda_launch_rows_put(void *dst, int64_t rows, int64_t pitch, const void *src, int64_t width,
                                          cudaStream_t stream) {
    const int64_t n = rows * width;
    if (n == 0) return cudaSuccess;
    const int threads = 256;
    attn_cuda::rows_put_kernel<<<dim3((unsigned)((n + threads - 1) / threads)), threads, 0, stream>>>(
        static_cast<unsigned char *>(dst), rows, pitch, static_cast<const unsigned char *>(src), width);
    return cudaGetLastError();
}

extern "C" int attn__cuda_launch_mask_widen(void *dst, const void *src, int64_t src_pitch, int64_t rows, int64_t L,
                                            int64_t S, int64_t S2, int64_t elem, cudaStream_t stream) {
    const int64_t n = rows * S2;
    if (n == 0) return cudaSuccess;
    const int threads = 256;
    attn_cuda::mask_widen_kernel<<<dim3((unsigned)((n + threads - 1) / threads)), threads, 0, stream>>>(
        static_cast<unsigned char *>(dst), static_cast<const unsigned char *>(src), src_pitch, rows, L, S, S2, elem);
    return cudaGetLastError();
}

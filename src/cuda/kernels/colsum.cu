// colsum.cu - column sums of a row-major matrix into float32 (the bias gradients of the modules):
// one thread per column, rows in order (coalesced across the threads of a warp), so the sums are
// the same bits on every run.
#include <cuda_runtime.h>

#include "../launch.h"
#include "common.cuh"

namespace attn_cuda {

__global__ void colsum_kernel(const void *x, int32_t dtype, int64_t rows, int64_t cols, int64_t ld, float *out) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.0f;
    for (int64_t r = 0; r < rows; r++) s += load_as_float(x, dtype, r * ld + c);
    out[c] = s;
}

} // namespace attn_cuda

extern "C" int attn__cuda_launch_colsum(const void *x, int32_t dtype, int64_t rows, int64_t cols, int64_t ld, float *out,
                                        cudaStream_t stream) {
    const int threads = 256;
    attn_cuda::colsum_kernel<<<dim3((unsigned)((cols + threads - 1) / threads)), threads, 0, stream>>>(x, dtype, rows, cols,
                                                                                                      ld, out);
    return cudaGetLastError();
}

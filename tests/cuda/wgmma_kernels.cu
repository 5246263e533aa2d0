// wgmma_kernels.cu - test_cuda_wgmma's device side: the Hopper forward's building blocks
// (kernels/wgmma.cuh) on their own, one warpgroup each: a tile copied by cp_async_rows into the
// 128-byte-swizzled layout, then
//  - S = Q K^T (64 x 128) by wgmma with both operands in shared memory (K-major descriptors), as
//    flash_sm90.cuh computes scores;
//  - O = P V (64 x D) by wgmma with P in registers (mma.m16n8k16's A fragments) and V in shared
//    memory read as a transposed operand (MN-major descriptors), as it accumulates its output;
// the accumulators stored row-major through the layout wgmma.cuh documents. Q, K, P, V row-major
// 16-bit values (bf16 or f16), float results.
#include <cuda_runtime.h>
#include <stdint.h>

#include "wgmma.cuh"

namespace {

using namespace attn_cuda;

constexpr int kThreads = 128; // one warpgroup

__device__ unsigned char *aligned_1024(unsigned char *raw) { return raw + ((1024u - (smem_u32(raw) & 1023u)) & 1023u); }

// The accumulator d of a 64 x N product at out (row-major, N columns).
template <int N> __device__ void store_acc(const float (&d)[N / 2], float *out) {
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
#pragma unroll
    for (int i = 0; i < N / 2; i++) {
        const int row = 16 * warp + g + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * c + i % 2;
        out[row * N + col] = d[i];
    }
}

template <typename T, int D> __global__ void __launch_bounds__(kThreads) qk_kernel(const T *q, const T *k, float *s) {
    extern __shared__ unsigned char raw[];
    T *sq = reinterpret_cast<T *>(aligned_1024(raw)), *sk = sq + 64 * D;
    cp_async_rows<64, D, kThreads, Sw128Rows<64>>(sq, q, D, 64, threadIdx.x);
    cp_async_rows<128, D, kThreads, Sw128Rows<128>>(sk, k, D, 128, threadIdx.x);
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; i++) d[i] = 0.0f;
    wgmma_fence_regs(d);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) wgmma_ss<T, 128>(d, kmajor_desc(smem_u32(sq), 64, 0, kk), kmajor_desc(smem_u32(sk), 128, 0, kk), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(d);
    store_acc<128>(d, s);
}

template <typename T, int D> __global__ void __launch_bounds__(kThreads) pv_kernel(const T *p, const T *v, float *o) {
    extern __shared__ unsigned char raw[];
    T *sv = reinterpret_cast<T *>(aligned_1024(raw));
    cp_async_rows<128, D, kThreads, Sw128Rows<128>>(sv, v, D, 128, threadIdx.x);
    cp_async_commit();
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
    uint32_t a[8][4]; // k-step kb: rows 16 warp + g (+ 8), keys 16 kb + 2 c (+ 8)
    const uint32_t *p32 = reinterpret_cast<const uint32_t *>(p);
#pragma unroll
    for (int kb = 0; kb < 8; kb++) {
        const int r0 = 16 * warp + g, k0 = 16 * kb + 2 * c;
        a[kb][0] = p32[(r0 * 128 + k0) / 2], a[kb][1] = p32[((r0 + 8) * 128 + k0) / 2];
        a[kb][2] = p32[(r0 * 128 + k0 + 8) / 2], a[kb][3] = p32[((r0 + 8) * 128 + k0 + 8) / 2];
    }
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    float d[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) d[i] = 0.0f;
    wgmma_fence_regs(a);
    wgmma_fence_regs(d);
    wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < 8; kb++) wgmma_rs_tb<T, D>(d, a[kb], mnmajor_desc(smem_u32(sv), 128, kb));
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(d);
    store_acc<D>(d, o);
}

template <typename T, int D> cudaError_t launch(int op, const void *a, const void *b, float *out) {
    if (op == 0) {
        const size_t smem = (64 + 128) * D * sizeof(T) + 1024;
        cudaError_t e = cudaFuncSetAttribute(qk_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        qk_kernel<T, D><<<1, kThreads, smem>>>(static_cast<const T *>(a), static_cast<const T *>(b), out);
    } else {
        const size_t smem = 128 * D * sizeof(T) + 1024;
        cudaError_t e = cudaFuncSetAttribute(pv_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        pv_kernel<T, D><<<1, kThreads, smem>>>(static_cast<const T *>(a), static_cast<const T *>(b), out);
    }
    return cudaGetLastError();
}

} // namespace

// op 0: out (64 x 128) = a (64 x D) b (128 x D)^T; op 1: out (64 x D) = a (64 x 128) b (128 x D). a, b
// device arrays of bf16 (bf16 != 0) or f16, out a device float array; D = 64 or 128. Returns the CUDA
// error of the launch and the wait.
extern "C" int attn_test_wgmma(int op, int bf16, int D, const void *a, const void *b, float *out) {
    cudaError_t e;
    if (D == 64) e = bf16 ? launch<__nv_bfloat16, 64>(op, a, b, out) : launch<__half, 64>(op, a, b, out);
    else if (D == 128) e = bf16 ? launch<__nv_bfloat16, 128>(op, a, b, out) : launch<__half, 128>(op, a, b, out);
    else return (int)cudaErrorInvalidValue;
    if (e != cudaSuccess) return (int)e;
    return (int)cudaDeviceSynchronize();
}

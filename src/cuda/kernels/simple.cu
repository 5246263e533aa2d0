// simple.cu - the simple attention kernel: float32 arithmetic, one warp per query row, any head dim,
// every option of attn_sdpa_desc (Philox dropout included), every element type, packed batches. It is
// the GPU's fallback for what the tensor-core kernels do not take, and the first thing to trust on
// a new device: it follows the reference (src/ref/sdpa_ref.c) step by step, with the online softmax
// of one row in place of the materialised score row.
//
// Block: 4 warps = 4 consecutive query rows of one (b, h). Per warp, in shared memory: the query
// row as floats (D) and the output accumulator (Dv), lane l owning elements l, l + 32, ...
// Keys go 32 at a time: for each key, the lanes split the dot product over D and reduce it with
// shuffles; lane jj keeps the score of key j0 + jj. Then one online-softmax update per 32 keys, and
// each key with a non-zero weight adds p * v to the accumulator (keys of weight 0 are not read, so
// NaN or inf in a hidden key's value does not reach the row, as in the reference).
#include <cuda_runtime.h>

#include "../launch.h"
#include "common.cuh"

namespace attn_cuda {

constexpr int kSimpleWarps = 4;

__global__ void __launch_bounds__(32 * kSimpleWarps) simple_kernel(const P p) {
    extern __shared__ float smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const RowBlock rb = row_block(blockIdx.x, (p.L + kSimpleWarps - 1) / kSimpleWarps, p.H);
    const int64_t h = rb.head, b = rb.b, hk = h / p.group;
    const Seq s = seq_of(p, b);
    const int64_t i = rb.tile * kSimpleWarps + warp;
    if (i >= s.L) return; // whole warp: no block-wide synchronisation below
    float *q = smem + warp * (p.D + p.Dv); // q: (D) floats
    float *acc = q + p.D;                  // acc: (Dv) floats, unnormalised output
    const int64_t qo = q_row(p, s, b, h, i);
    for (int64_t e = lane; e < p.D; e += 32) q[e] = load_as_float(p.q, p.q_dtype, qo + e * p.q_stride[3]);
    for (int64_t e = lane; e < p.Dv; e += 32) acc[e] = 0.0f;
    __syncwarp();

    float m = -CUDART_INF_F, l = 0.0f; // running max and sum of exp(s - m), natural units
    bool nan_seen = false;
    const int64_t lo = first_key(p, s, i), hi = end_key(p, s, i);
    for (int64_t j0 = lo; j0 < hi; j0 += 32) {
        float mine = -CUDART_INF_F; // lane jj: score of key j0 + jj
        for (int jj = 0; jj < 32 && j0 + jj < hi; jj++) {
            const int64_t j = j0 + jj;
            const int64_t ko = kv_row(p, p.k_stride, s, b, hk, j);
            float part = 0.0f;
            for (int64_t e = lane; e < p.D; e += 32) part += q[e] * load_as_float(p.k, p.kv_dtype, ko + e * p.k_stride[3]);
            const float dot = warp_sum(part);
            const float x = score(p, s, dot, b, h, i, j);
            if (lane == jj) mine = x;
        }
        nan_seen |= __any_sync(0xffffffffu, isnan(mine)) != 0;
        const float m_new = fmaxf(m, warp_max(mine));
        if (m_new == -CUDART_INF_F) continue; // every key so far hidden
        const float alpha = expf(m - m_new);  // 0 when m was -inf
        const float pj = expf(mine - m_new);  // 0 for hidden keys
        l = l * alpha + warp_sum(pj);
        // dropout after the row sum: a dropped key adds nothing to the output (keep_scale at the end)
        const float pv = p.dropout && j0 + lane < hi && !dropout_kept(p, b, h, i, j0 + lane) ? 0.0f : pj;
        for (int64_t e = lane; e < p.Dv; e += 32) acc[e] *= alpha;
        for (int jj = 0; jj < 32 && j0 + jj < hi; jj++) {
            const float w = __shfl_sync(0xffffffffu, pv, jj);
            if (w == 0.0f) continue; // keys of weight 0 are not read (same for the whole warp)
            const int64_t vo = kv_row(p, p.v_stride, s, b, hk, j0 + jj);
            for (int64_t e = lane; e < p.Dv; e += 32) acc[e] += w * load_as_float(p.v, p.kv_dtype, vo + e * p.v_stride[3]);
        }
        m = m_new;
    }
    // A NaN score poisons its row (the reference's rule); a fully masked row gives zeros, lse -inf.
    const float inv = nan_seen ? CUDART_NAN_F : (l > 0.0f ? (p.dropout ? p.keep_scale : 1.0f) / l : 0.0f);
    const int64_t oo = o_row(p, s, b, h, i);
    for (int64_t e = lane; e < p.Dv; e += 32) store_from_float(p.out, p.out_dtype, oo + e * p.o_stride[3], acc[e] * inv);
    if (p.lse != nullptr && lane == 0)
        p.lse[lse_index(p, s, b, h, i)] = nan_seen ? CUDART_NAN_F : (l > 0.0f ? m + logf(l) : -CUDART_INF_F);
}

} // namespace attn_cuda

extern "C" int attn__cuda_launch_simple(const attn__cuda_sdpa_params *p, int64_t row_blocks, cudaStream_t stream) {
    const size_t smem = (size_t)(attn_cuda::kSimpleWarps * (p->D + p->Dv)) * sizeof(float);
    cudaError_t err = cudaFuncSetAttribute(attn_cuda::simple_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
    const dim3 grid((unsigned)(row_blocks * p->B * p->H));
    attn_cuda::simple_kernel<<<grid, 32 * attn_cuda::kSimpleWarps, smem, stream>>>(*p);
    return cudaGetLastError();
}

extern "C" int attn__cuda_kernels_loadable(void) {
    cudaFuncAttributes a;
    return cudaFuncGetAttributes(&a, attn_cuda::simple_kernel);
}

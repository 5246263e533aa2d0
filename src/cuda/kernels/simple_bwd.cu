// simple_bwd.cu - the simple attention backward: float32 arithmetic, one warp per row, any head dims,
// every option of attn_sdpa_desc the forward takes (Philox dropout included), every element type,
// packed batches. It follows the reference backward (src/ref/sdpa_bwd_ref.c) with the weights
// recomputed from q, k and the forward's lse (nothing of size L x S is stored), in three kernels:
//   rowdot: D_i = dout_i . out_i                         (one warp per query row; bwd_rows.cu)
//   dq:     dq_i = sum_j dS_ij scale' k_j                (one warp per query row, keys in order;
//           with dmask, dS_ij added at the float mask's offset: atomics where cells share one)
//   dkdv:   dv_j = sum_{h in group, i} P'_ij dout_i,     (one warp per key row, heads and queries
//           dk_j = sum_{h in group, i} dS_ij scale' q_i   in order)
// with P_ij = exp(s_ij - lse_i), dP_ij = dout_i . v_j (times the dropout mask and keep_scale),
// dS_ij = P_ij (dP_ij - D_i), P' = P times the mask and keep_scale, and scale' = scale times
// 1 - tanh^2 of the soft cap's argument. Each sum has one fixed order and no atomics: the results are
// the same bits on every run (dmask too where no two (b, h, i, j) share a mask element). Hidden
// pairs (score -inf) are skipped, so they contribute nothing.
#include <cuda_runtime.h>

#include "../launch.h"
#include "common.cuh"

namespace attn_cuda {

constexpr int kBwdWarps = 4;

// Block: 4 warps = 4 consecutive query rows of one (b, h). Per warp in shared memory: q (D), dout
// (Dv) and the dq accumulator (D), as floats.
__global__ void __launch_bounds__(32 * kBwdWarps) dq_kernel(const P p) {
    extern __shared__ float smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const RowBlock rb = row_block(blockIdx.x, (p.L + kBwdWarps - 1) / kBwdWarps, p.H);
    const int64_t h = rb.head, b = rb.b, hk = h / p.group;
    const Seq s = seq_of(p, b);
    const int64_t i = rb.tile * kBwdWarps + warp;
    if (i >= s.L) return;
    float *q = smem + warp * (2 * p.D + p.Dv); // q: (D)
    float *dout = q + p.D;                       // dout: (Dv)
    float *acc = dout + p.Dv;                    // acc: (D)
    const int64_t qo = q_row(p, s, b, h, i), oo = o_row(p, s, b, h, i);
    for (int64_t e = lane; e < p.D; e += 32) q[e] = load_as_float(p.q, p.q_dtype, qo + e * p.q_stride[3]), acc[e] = 0.0f;
    for (int64_t e = lane; e < p.Dv; e += 32) dout[e] = load_as_float(p.dout, p.out_dtype, oo + e * p.o_stride[3]);
    __syncwarp();
    const float lse = clamp_lse(p.lse[lse_index(p, s, b, h, i)]), rd = p.rowdot[lse_index(p, s, b, h, i)];
    const int64_t lo = first_key(p, s, i), hi = end_key(p, s, i);
    for (int64_t j = lo; j < hi; j++) {
        const int64_t ko = kv_row(p, p.k_stride, s, b, hk, j);
        float part = 0.0f;
        for (int64_t e = lane; e < p.D; e += 32) part += q[e] * load_as_float(p.k, p.kv_dtype, ko + e * p.k_stride[3]);
        const float dot = warp_sum(part);
        const float x = score(p, s, dot, b, h, i, j);
        if (x == -CUDART_INF_F) continue; // hidden: no weight, no gradient (the whole warp)
        const float pij = expf(x - lse);
        const int64_t vo = kv_row(p, p.v_stride, s, b, hk, j);
        float dpart = 0.0f;
        for (int64_t e = lane; e < p.Dv; e += 32) dpart += dout[e] * load_as_float(p.v, p.kv_dtype, vo + e * p.v_stride[3]);
        float dp = warp_sum(dpart);
        if (p.dropout) dp = dropout_kept(p, b, h, i, j) ? dp * p.keep_scale : 0.0f;
        if (p.dmask != nullptr && lane == 0) // the mask is added to the score: its gradient is dS
            atomicAdd(p.dmask + b * p.mask_stride[0] + h * p.mask_stride[1] + i * p.mask_stride[2] + j * p.mask_stride[3],
                      pij * (dp - rd));
        const float g = pij * (dp - rd) * dscore_ddot(p, dot);
        for (int64_t e = lane; e < p.D; e += 32) acc[e] += g * load_as_float(p.k, p.kv_dtype, ko + e * p.k_stride[3]);
    }
    for (int64_t e = lane; e < p.D; e += 32) store_from_float(p.dq, p.grad_dtype, qo + e * p.q_stride[3], acc[e]);
}

// Block: 4 warps = 4 consecutive key rows of one (b, kv head). Per warp in shared memory: k (D),
// v (Dv), and the dk (D) and dv (Dv) accumulators, as floats.
__global__ void __launch_bounds__(32 * kBwdWarps) dkdv_kernel(const P p) {
    extern __shared__ float smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const RowBlock rb = row_block(blockIdx.x, (p.S + kBwdWarps - 1) / kBwdWarps, p.Hkv);
    const int64_t hk = rb.head, b = rb.b;
    const Seq s = seq_of(p, b);
    const int64_t j = rb.tile * kBwdWarps + warp;
    if (j >= s.S) return;
    float *k = smem + warp * 2 * (p.D + p.Dv); // k: (D)
    float *v = k + p.D;                          // v: (Dv)
    float *dk = v + p.Dv;                        // dk: (D)
    float *dv = dk + p.D;                        // dv: (Dv)
    const int64_t ko = kv_row(p, p.k_stride, s, b, hk, j), vo = kv_row(p, p.v_stride, s, b, hk, j);
    for (int64_t e = lane; e < p.D; e += 32) k[e] = load_as_float(p.k, p.kv_dtype, ko + e * p.k_stride[3]), dk[e] = 0.0f;
    for (int64_t e = lane; e < p.Dv; e += 32) v[e] = load_as_float(p.v, p.kv_dtype, vo + e * p.v_stride[3]), dv[e] = 0.0f;
    __syncwarp();
    for (int64_t h = hk * p.group; h < (hk + 1) * p.group; h++)
        for (int64_t i = 0; i < s.L; i++) {
            if (j < first_key(p, s, i) || j >= end_key(p, s, i)) continue; // bounds: the same for the warp
            const int64_t qo = q_row(p, s, b, h, i), oo = o_row(p, s, b, h, i);
            float part = 0.0f;
            for (int64_t e = lane; e < p.D; e += 32) part += k[e] * load_as_float(p.q, p.q_dtype, qo + e * p.q_stride[3]);
            const float dot = warp_sum(part);
            const float x = score(p, s, dot, b, h, i, j);
            if (x == -CUDART_INF_F) continue;
            const float pij = expf(x - clamp_lse(p.lse[lse_index(p, s, b, h, i)]));
            float dpart = 0.0f;
            for (int64_t e = lane; e < p.Dv; e += 32) dpart += v[e] * load_as_float(p.dout, p.out_dtype, oo + e * p.o_stride[3]);
            float dp = warp_sum(dpart), pd = pij;
            if (p.dropout) {
                const bool kept = dropout_kept(p, b, h, i, j);
                dp = kept ? dp * p.keep_scale : 0.0f;
                pd = kept ? pij * p.keep_scale : 0.0f;
            }
            const float g = pij * (dp - p.rowdot[lse_index(p, s, b, h, i)]) * dscore_ddot(p, dot);
            for (int64_t e = lane; e < p.Dv; e += 32) dv[e] += pd * load_as_float(p.dout, p.out_dtype, oo + e * p.o_stride[3]);
            for (int64_t e = lane; e < p.D; e += 32) dk[e] += g * load_as_float(p.q, p.q_dtype, qo + e * p.q_stride[3]);
        }
    for (int64_t e = lane; e < p.D; e += 32) store_from_float(p.dk, p.grad_dtype, ko + e * p.k_stride[3], dk[e]);
    for (int64_t e = lane; e < p.Dv; e += 32) store_from_float(p.dv, p.grad_dtype, vo + e * p.v_stride[3], dv[e]);
}

} // namespace attn_cuda

extern "C" int attn__cuda_launch_simple_bwd(const attn__cuda_sdpa_params *p, cudaStream_t stream) {
    using namespace attn_cuda;
    const int64_t q_blocks = (p->L + kBwdWarps - 1) / kBwdWarps * p->B * p->H;
    const int64_t k_blocks = (p->S + kBwdWarps - 1) / kBwdWarps * p->B * p->Hkv;
    const size_t smem_dq = (size_t)(kBwdWarps * (2 * p->D + p->Dv)) * sizeof(float);
    const size_t smem_dkdv = (size_t)(kBwdWarps * 2 * (p->D + p->Dv)) * sizeof(float);
    cudaError_t err = cudaFuncSetAttribute(dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_dq);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(dkdv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_dkdv);
    if (err != cudaSuccess) return err;
    err = (cudaError_t)attn__cuda_launch_bwd_rowdot(p, stream);
    if (err != cudaSuccess) return err;
    dq_kernel<<<dim3((unsigned)q_blocks), 32 * kBwdWarps, smem_dq, stream>>>(*p);
    dkdv_kernel<<<dim3((unsigned)k_blocks), 32 * kBwdWarps, smem_dkdv, stream>>>(*p);
    return cudaGetLastError();
}

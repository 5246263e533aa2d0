// bwd_rows.cu - the backward's per-query-row kernels around the main ones, one warp per row, 4 rows
// per block of one (b, h):
//   rowdot:     D_i = dout_i . out_i (float32, lse's layout), and in the tensor-core backward's
//               atomic mode the zeroing of the row's float32 dQ accumulator (p.dq_acc);
//   dq_convert: dq_i = scale * (the accumulator's row), in grad_dtype at q_stride (atomic mode).
#include <cuda_runtime.h>

#include "../launch.h"
#include "common.cuh"

namespace attn_cuda {

constexpr int kRowWarps = 4;

__global__ void __launch_bounds__(32 * kRowWarps) rowdot_kernel(const P p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const RowBlock rb = row_block(blockIdx.x, (p.L + kRowWarps - 1) / kRowWarps, p.H);
    const int64_t h = rb.head, b = rb.b;
    const Seq s = seq_of(p, b);
    const int64_t i = rb.tile * kRowWarps + warp;
    if (i >= s.L) return;
    const int64_t oo = o_row(p, s, b, h, i), li = lse_index(p, s, b, h, i);
    float part = 0.0f;
    for (int64_t e = lane; e < p.Dv; e += 32) {
        const int64_t off = oo + e * p.o_stride[3];
        part += load_as_float(p.dout, p.out_dtype, off) * load_as_float(p.out, p.out_dtype, off);
    }
    const float d = warp_sum(part);
    if (lane == 0) p.rowdot[li] = d;
    if (p.dq_acc != nullptr)
        for (int64_t e = lane; e < p.D; e += 32) p.dq_acc[li * p.D + e] = 0.0f;
}

__global__ void __launch_bounds__(32 * kRowWarps) dq_convert_kernel(const P p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const RowBlock rb = row_block(blockIdx.x, (p.L + kRowWarps - 1) / kRowWarps, p.H);
    const int64_t h = rb.head, b = rb.b;
    const Seq s = seq_of(p, b);
    const int64_t i = rb.tile * kRowWarps + warp;
    if (i >= s.L) return;
    const float *acc = p.dq_acc + lse_index(p, s, b, h, i) * p.D;
    const int64_t qo = q_row(p, s, b, h, i);
    for (int64_t e = lane; e < p.D; e += 32) store_from_float(p.dq, p.grad_dtype, qo + e * p.q_stride[3], acc[e] * p.scale);
}

static dim3 row_grid(const P &p) { return dim3((unsigned)((p.L + kRowWarps - 1) / kRowWarps * p.B * p.H)); }

} // namespace attn_cuda

extern "C" int attn__cuda_launch_bwd_rowdot(const attn__cuda_sdpa_params *p, cudaStream_t stream) {
    attn_cuda::rowdot_kernel<<<attn_cuda::row_grid(*p), 32 * attn_cuda::kRowWarps, 0, stream>>>(*p);
    return cudaGetLastError();
}

extern "C" int attn__cuda_launch_bwd_dq_convert(const attn__cuda_sdpa_params *p, cudaStream_t stream) {
    attn_cuda::dq_convert_kernel<<<attn_cuda::row_grid(*p), 32 * attn_cuda::kRowWarps, 0, stream>>>(*p);
    return cudaGetLastError();
}

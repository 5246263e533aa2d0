// bwd_rows.cu - the backward's per-query-row kernels around the main ones:
//   rowdot:     D_i = dout_i . out_i (float32, lse's layout), and in the tensor-core backward's
//               atomic mode the zeroing of the row's float32 dQ accumulator (p.dq_acc);
//   dq_convert: dq_i = scale * (the accumulator's row), in grad_dtype at q_stride (atomic mode).
// Each in two forms: a warp per row reading element by element (any type and stride: the simple
// backward's calls), and a vector form for the views the tensor-core backward reads (BF16/F16 rows of
// unit stride, 16-byte aligned): a lane per 8 elements, a warp per 4 rows with every row's loads in
// flight before its sums, 16 rows a block.
#include <cuda_runtime.h>

#include "../launch.h"
#include "common.cuh"
#include "mma.cuh"

namespace attn_cuda {

constexpr int kRowWarps = 4;  // warps a block, both forms
constexpr int kVecRows = 4;   // rows a warp, vector form
constexpr int kVecMaxD = 256; // the vector form's widest row: 8 elements a lane

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

// 8 elements of T (16 bytes) as floats.
template <typename T> __device__ __forceinline__ void unpack8(const uint4 &u, float f[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        T lo, hi;
        const uint16_t bits_lo = (uint16_t)(w[k] & 0xffffu), bits_hi = (uint16_t)(w[k] >> 16);
        memcpy(&lo, &bits_lo, 2), memcpy(&hi, &bits_hi, 2);
        f[2 * k] = to_float<T>(lo), f[2 * k + 1] = to_float<T>(hi);
    }
}

// The vector form's rows: warp `warp` of the block takes the kVecRows rows from
// i0 = kVecRows * (tile * kRowWarps + warp) of one (b, h) (those below the sequence's length).
struct VecRows {
    int64_t b, h, i0;
    Seq s;
};
__device__ __forceinline__ VecRows vec_rows(const P &p) {
    const int warp = threadIdx.x / 32;
    constexpr int per_block = kVecRows * kRowWarps;
    const RowBlock rb = row_block(blockIdx.x, (p.L + per_block - 1) / per_block, p.H);
    VecRows r;
    r.b = rb.b, r.h = rb.head, r.s = seq_of(p, r.b);
    r.i0 = (rb.tile * kRowWarps + warp) * kVecRows;
    return r;
}

template <typename T> __global__ void __launch_bounds__(32 * kRowWarps) rowdot_vec_kernel(const P p) {
    const int lane = threadIdx.x % 32;
    const VecRows r = vec_rows(p);
    if (r.i0 >= r.s.L) return;
    const bool mine = lane * 8 < p.Dv; // this lane's 8 elements of each row
    const T *out = static_cast<const T *>(p.out), *dout = static_cast<const T *>(p.dout);
    uint4 o[kVecRows], g[kVecRows];
#pragma unroll
    for (int n = 0; n < kVecRows; n++) { // every row's loads first
        o[n] = g[n] = make_uint4(0, 0, 0, 0);
        if (mine && r.i0 + n < r.s.L) {
            const int64_t off = o_row(p, r.s, r.b, r.h, r.i0 + n) + lane * 8;
            o[n] = *reinterpret_cast<const uint4 *>(out + off);
            g[n] = *reinterpret_cast<const uint4 *>(dout + off);
        }
    }
#pragma unroll
    for (int n = 0; n < kVecRows; n++) {
        float fo[8], fg[8];
        unpack8<T>(o[n], fo), unpack8<T>(g[n], fg);
        float part = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) part += fg[e] * fo[e];
        const float d = warp_sum(part);
        const int64_t i = r.i0 + n;
        if (i >= r.s.L) break;
        const int64_t li = lse_index(p, r.s, r.b, r.h, i);
        if (lane == 0) p.rowdot[li] = d;
        if (p.dq_acc != nullptr) {
            float4 *row = reinterpret_cast<float4 *>(p.dq_acc + li * p.D);
            for (int64_t e = lane; e < p.D / 4; e += 32) row[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
}

// dq of 8 elements from 8 floats times scale: G = T (16 bytes) or float (32 bytes).
template <typename G> __device__ __forceinline__ void store8(G *dst, const float f[8]);
template <> __device__ __forceinline__ void store8<float>(float *dst, const float f[8]) {
    reinterpret_cast<float4 *>(dst)[0] = make_float4(f[0], f[1], f[2], f[3]);
    reinterpret_cast<float4 *>(dst)[1] = make_float4(f[4], f[5], f[6], f[7]);
}
template <typename G> __device__ __forceinline__ void store8(G *dst, const float f[8]) {
    *reinterpret_cast<uint4 *>(dst) = make_uint4(pack2<G>(f[0], f[1]), pack2<G>(f[2], f[3]), pack2<G>(f[4], f[5]), pack2<G>(f[6], f[7]));
}

template <typename G> __global__ void __launch_bounds__(32 * kRowWarps) dq_convert_vec_kernel(const P p) {
    const int lane = threadIdx.x % 32;
    const VecRows r = vec_rows(p);
    if (r.i0 >= r.s.L || lane * 8 >= p.D) return;
    float4 a[kVecRows][2];
#pragma unroll
    for (int n = 0; n < kVecRows; n++) { // every row's loads first
        if (r.i0 + n >= r.s.L) continue;
        const float4 *acc = reinterpret_cast<const float4 *>(p.dq_acc + lse_index(p, r.s, r.b, r.h, r.i0 + n) * p.D + lane * 8);
        a[n][0] = acc[0], a[n][1] = acc[1];
    }
    G *dq = static_cast<G *>(p.dq);
#pragma unroll
    for (int n = 0; n < kVecRows; n++) {
        if (r.i0 + n >= r.s.L) break;
        const float f[8] = {a[n][0].x * p.scale, a[n][0].y * p.scale, a[n][0].z * p.scale, a[n][0].w * p.scale,
                            a[n][1].x * p.scale, a[n][1].y * p.scale, a[n][1].z * p.scale, a[n][1].w * p.scale};
        store8<G>(dq + q_row(p, r.s, r.b, r.h, r.i0 + n) + lane * 8, f);
    }
}

static dim3 row_grid(const P &p) { return dim3((unsigned)((p.L + kRowWarps - 1) / kRowWarps * p.B * p.H)); }
static dim3 vec_grid(const P &p) {
    constexpr int per_block = kVecRows * kRowWarps;
    return dim3((unsigned)((p.L + per_block - 1) / per_block * p.B * p.H));
}

// Whether rows of n elements of `bytes` each at `stride` (elements) from `base` can be read 8 elements
// at a time: unit stride along the row, 16-byte aligned rows (strides of length-1 dimensions are 0).
static bool vec_rows_ok(const void *base, const int64_t stride[4], int64_t n, int bytes) {
    const int64_t step = 16 / bytes;
    return n % 8 == 0 && n <= kVecMaxD && stride[3] == 1 && stride[0] % step == 0 && stride[1] % step == 0 &&
           stride[2] % step == 0 && ((uintptr_t)base & 15u) == 0;
}
static bool two_byte(int32_t t) { return t == ATTN__CU_BF16 || t == ATTN__CU_F16; }

} // namespace attn_cuda

extern "C" int attn__cuda_launch_bwd_rowdot(const attn__cuda_sdpa_params *p, cudaStream_t stream) {
    using namespace attn_cuda;
    const bool vec = two_byte(p->out_dtype) && vec_rows_ok(p->out, p->o_stride, p->Dv, 2) &&
                     vec_rows_ok(p->dout, p->o_stride, p->Dv, 2) && (p->dq_acc == nullptr || p->D % 4 == 0);
    if (vec && p->out_dtype == ATTN__CU_BF16)
        rowdot_vec_kernel<__nv_bfloat16><<<vec_grid(*p), 32 * kRowWarps, 0, stream>>>(*p);
    else if (vec)
        rowdot_vec_kernel<__half><<<vec_grid(*p), 32 * kRowWarps, 0, stream>>>(*p);
    else
        rowdot_kernel<<<row_grid(*p), 32 * kRowWarps, 0, stream>>>(*p);
    return cudaGetLastError();
}

extern "C" int attn__cuda_launch_bwd_dq_convert(const attn__cuda_sdpa_params *p, cudaStream_t stream) {
    using namespace attn_cuda;
    const int bytes = p->grad_dtype == ATTN__CU_F32 ? 4 : 2;
    if (vec_rows_ok(p->dq, p->q_stride, p->D, bytes) && p->grad_dtype == ATTN__CU_BF16)
        dq_convert_vec_kernel<__nv_bfloat16><<<vec_grid(*p), 32 * kRowWarps, 0, stream>>>(*p);
    else if (vec_rows_ok(p->dq, p->q_stride, p->D, bytes) && p->grad_dtype == ATTN__CU_F16)
        dq_convert_vec_kernel<__half><<<vec_grid(*p), 32 * kRowWarps, 0, stream>>>(*p);
    else if (vec_rows_ok(p->dq, p->q_stride, p->D, bytes) && p->grad_dtype == ATTN__CU_F32)
        dq_convert_vec_kernel<float><<<vec_grid(*p), 32 * kRowWarps, 0, stream>>>(*p);
    else
        dq_convert_kernel<<<row_grid(*p), 32 * kRowWarps, 0, stream>>>(*p);
    return cudaGetLastError();
}

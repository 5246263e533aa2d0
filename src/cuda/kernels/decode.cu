// decode.cu - split-KV decoding (flash-decoding): calls with few query rows per kv head (R = group * L
// rows, at most 16: one new token for each head of a GQA group, or a few), where a tile of 128 query
// rows would be mostly empty. Every query row of a kv head is handled by the same warp, so each key
// and value row is read once for the whole group.
//
// Pass 1 (decode_split_kernel): the keys of a sequence are cut into splits of split_keys; one warp
// per (split, b, kv head), 4 warps per block. Lane l holds elements l, l + 32, ... of a row (PL per
// lane, D and Dv <= 32 PL); the group's query rows, pre-scaled, sit in shared memory. Per key: the R
// dot products (lane partial sums reduced across the warp), the score rule where the call needs it,
// one online-softmax step per row (exp2 domain), and the accumulators updated with the value row
// (Philox dropout after the row sums, as the other kernels). The split's (m, l, acc) per row go to
// the workspace.
// Pass 2 (decode_combine_kernel): one warp per query row merges its splits: M = max m, out =
// sum 2^(m - M) acc / sum 2^(m - M) l (times keep_scale with dropout), lse = (M + log2 l) ln 2.
#include <cuda_runtime.h>

#include "../launch.h"
#include "common.cuh"

namespace attn_cuda {

constexpr int kDecWarps = 4;

// Rows of the group and of the sequence: row r is query i = r % L of head h = hk * group + r / L.
template <int ROWS, int PL>
__global__ void __launch_bounds__(32 * kDecWarps) decode_split_kernel(const P p, int64_t split_keys, int64_t n_splits,
                                                                     int R, float *part) {
    extern __shared__ float q_s[]; // (R, D) query rows times scale * log2(e) (raw with the whole score rule)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t blocks_per_head = (n_splits + kDecWarps - 1) / kDecWarps;
    int64_t bid = blockIdx.x;
    const int64_t sb = bid % blocks_per_head;
    bid /= blocks_per_head;
    const int64_t hk = bid % p.Hkv, b = bid / p.Hkv;
    const Seq s = seq_of(p, b);
    // masks, ALiBi and soft caps take the whole score rule per key; causality and windows alone only
    // the bounds test (the queries then carry scale * log2(e))
    const bool rule = has_elementwise(p);
    const float qscale = rule ? 1.0f : p.scale * kLog2e;
    for (int x = threadIdx.x; x < R * p.D; x += blockDim.x) {
        const int r = x / (int)p.D;
        const int64_t e = x % p.D, i = r % p.L, h = hk * p.group + r / p.L;
        q_s[x] = i < s.L ? load_as_float(p.q, p.q_dtype, q_row(p, s, b, h, i) + e * p.q_stride[3]) * qscale : 0.0f;
    }
    __syncthreads();
    const int64_t split = sb * kDecWarps + warp;
    if (split >= n_splits) return;
    const int64_t j_lo = split * split_keys, j_hi = min(j_lo + split_keys, s.S);

    float m[ROWS], l[ROWS], acc[ROWS][PL];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        m[r] = -CUDART_INF_F, l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < PL; e++) acc[r][e] = 0.0f;
    }
    // key and value rows one ahead: the loads of key j + 1 are in flight while key j is computed
    float kn[PL], vn[PL];
    auto load_row = [&](int64_t j, float *kd, float *vd) {
        const int64_t ko = kv_row(p, p.k_stride, s, b, hk, j), vo = kv_row(p, p.v_stride, s, b, hk, j);
#pragma unroll
        for (int e = 0; e < PL; e++) {
            const int64_t d = lane + 32 * e;
            kd[e] = d < p.D ? load_as_float(p.k, p.kv_dtype, ko + d * p.k_stride[3]) : 0.0f;
            vd[e] = d < p.Dv ? load_as_float(p.v, p.kv_dtype, vo + d * p.v_stride[3]) : 0.0f;
        }
    };
    if (j_lo < j_hi) load_row(j_lo, kn, vn);
    for (int64_t j = j_lo; j < j_hi; j++) {
        float kv[PL], vv[PL];
#pragma unroll
        for (int e = 0; e < PL; e++) kv[e] = kn[e], vv[e] = vn[e];
        if (j + 1 < j_hi) load_row(j + 1, kn, vn);
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            if (r >= R) break;
            float part = 0.0f;
#pragma unroll
            for (int e = 0; e < PL; e++)
                if (lane + 32 * e < p.D) part += q_s[r * p.D + lane + 32 * e] * kv[e];
            const float dot = warp_sum(part);
            const int64_t i = r % p.L, h = hk * p.group + r / p.L;
            if (i >= s.L) continue;
            const float x = rule ? score(p, s, dot, b, h, i, j) * kLog2e : (bounds_hide(p, s, i, j) ? -CUDART_INF_F : dot);
            const float m_new = fmaxf(m[r], x);
            if (m_new == -CUDART_INF_F) continue; // hidden, and nothing seen yet
            const float alpha = exp2f(m[r] - m_new), pj = exp2f(x - m_new);
            l[r] = l[r] * alpha + pj;
            m[r] = m_new;
            const float w = p.dropout && !dropout_kept(p, b, h, i, j) ? 0.0f : pj;
#pragma unroll
            for (int e = 0; e < PL; e++) acc[r][e] = acc[r][e] * alpha + w * vv[e];
        }
    }
    // the split's partial result per row: (m, l, acc[Dv]) at part + ((bk * n_splits + split) * R + r) * (2 + Dv)
    const int64_t bk = b * p.Hkv + hk;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        if (r >= R) break;
        float *o = part + ((bk * n_splits + split) * R + r) * (2 + p.Dv);
        if (lane == 0) o[0] = m[r], o[1] = l[r];
#pragma unroll
        for (int e = 0; e < PL; e++)
            if (lane + 32 * e < p.Dv) o[2 + lane + 32 * e] = acc[r][e];
    }
}

// One warp per query row (b, h, i): the splits merged, out and lse written.
__global__ void __launch_bounds__(32 * kDecWarps) decode_combine_kernel(const P p, int64_t n_splits, int R,
                                                                       const float *part) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t row = (int64_t)blockIdx.x * kDecWarps + warp; // (b, hk, r)
    if (row >= p.B * p.Hkv * R) return;
    const int r = (int)(row % R);
    const int64_t bk = row / R, hk = bk % p.Hkv, b = bk / p.Hkv;
    const Seq s = seq_of(p, b);
    const int64_t i = r % p.L, h = hk * p.group + r / p.L;
    if (i >= s.L) return;
    const int64_t stride = 2 + p.Dv, tstride = R * stride;
    const float *base = part + (bk * n_splits * R + r) * stride; // split t at base + t * tstride
    float M = -CUDART_INF_F;
    for (int64_t t = lane; t < n_splits; t += 32) M = fmaxf(M, base[t * tstride]);
    M = warp_max(M);
    // splits 32 at a time: lane t's weight 2^(m - M) (0 for a split that saw nothing), handed round by
    // shuffles; each lane sums its elements e = lane + 32 k of the value rows (independent loads)
    float L = 0.0f, a[8];
#pragma unroll
    for (int k = 0; k < 8; k++) a[k] = 0.0f;
    for (int64_t t0 = 0; t0 < n_splits; t0 += 32) {
        const int64_t t = t0 + lane;
        const float mt = t < n_splits ? base[t * tstride] : -CUDART_INF_F;
        const float w = mt != -CUDART_INF_F ? exp2f(mt - M) : 0.0f;
        if (t < n_splits) L += w * base[t * tstride + 1];
        const int n = (int)min((int64_t)32, n_splits - t0);
        for (int u = 0; u < n; u++) {
            const float wu = __shfl_sync(0xffffffffu, w, u);
            const float *row = base + (t0 + u) * tstride + 2;
#pragma unroll
            for (int k = 0; k < 8; k++)
                if (lane + 32 * k < p.Dv && wu != 0.0f) a[k] += wu * row[lane + 32 * k];
        }
    }
    L = warp_sum(L);
    const float inv = L > 0.0f ? (p.dropout ? p.keep_scale : 1.0f) / L : 0.0f;
    const int64_t oo = o_row(p, s, b, h, i);
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (lane + 32 * k < p.Dv) store_from_float(p.out, p.out_dtype, oo + (lane + 32 * k) * p.o_stride[3], a[k] * inv);
    if (p.lse != nullptr && lane == 0) p.lse[lse_index(p, s, b, h, i)] = lse_of(M, L);
}

template <int ROWS, int PL>
static int split_launch(const P &p, int64_t split_keys, int64_t n_splits, int R, float *part, cudaStream_t stream) {
    const size_t smem = (size_t)R * (size_t)p.D * sizeof(float);
    cudaError_t err = cudaFuncSetAttribute(decode_split_kernel<ROWS, PL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem);
    if (err != cudaSuccess) return err;
    const int64_t blocks = (n_splits + kDecWarps - 1) / kDecWarps * p.B * p.Hkv;
    decode_split_kernel<ROWS, PL><<<dim3((unsigned)blocks), 32 * kDecWarps, smem, stream>>>(p, split_keys, n_splits, R, part);
    return cudaGetLastError();
}

template <int ROWS>
static int split_by_lanes(const P &p, int64_t split_keys, int64_t n_splits, int R, float *part, cudaStream_t stream) {
    const int64_t dmax = p.D > p.Dv ? p.D : p.Dv;
    if (dmax <= 64) return split_launch<ROWS, 2>(p, split_keys, n_splits, R, part, stream);
    if (dmax <= 128) return split_launch<ROWS, 4>(p, split_keys, n_splits, R, part, stream);
    if constexpr (ROWS <= 4) return split_launch<ROWS, 8>(p, split_keys, n_splits, R, part, stream);
    return cudaErrorInvalidValue; // 16 rows of 256 dims: the planner keeps them off (128 accumulators a lane)
}

} // namespace attn_cuda

extern "C" int attn__cuda_launch_decode(const attn__cuda_sdpa_params *p, int64_t split_keys, int64_t n_splits, int rows,
                                        float *part, cudaStream_t stream) {
    using namespace attn_cuda;
    int err;
    if (rows <= 1) err = split_by_lanes<1>(*p, split_keys, n_splits, rows, part, stream);
    else if (rows <= 4) err = split_by_lanes<4>(*p, split_keys, n_splits, rows, part, stream);
    else err = split_by_lanes<16>(*p, split_keys, n_splits, rows, part, stream);
    if (err != cudaSuccess) return err;
    const int64_t rows_total = p->B * p->Hkv * rows;
    decode_combine_kernel<<<dim3((unsigned)((rows_total + kDecWarps - 1) / kDecWarps)), 32 * kDecWarps, 0, stream>>>(
        *p, n_splits, rows, part);
    return cudaGetLastError();
}

// common.cuh - device helpers every attention kernel shares: element loads and stores of the three
// float types, the per-sequence view of a batch (plain, packed, KV cache, paged), and the score
// rule of attn.h (bounds, masks, scale, soft cap, ALiBi) and the dropout mask, so each kernel applies
// the same rule.
// Plain and packed (varlen) batches.
#ifndef ATTN_CUDA_COMMON_CUH
#define ATTN_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>
#include <stdint.h>

#include "../../philox.h"
#include "../sdpa_params.h"

namespace attn_cuda {

using P = attn__cuda_sdpa_params;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---- element types ------------------------------------------------------------------------------
__device__ __forceinline__ float load_as_float(const void *base, int32_t dtype, int64_t off) {
    if (dtype == ATTN__CU_BF16) return __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[off]);
    if (dtype == ATTN__CU_F16) return __half2float(static_cast<const __half *>(base)[off]);
    return static_cast<const float *>(base)[off];
}

__device__ __forceinline__ void store_from_float(void *base, int32_t dtype, int64_t off, float x) {
    if (dtype == ATTN__CU_BF16)
        static_cast<__nv_bfloat16 *>(base)[off] = __float2bfloat16_rn(x);
    else if (dtype == ATTN__CU_F16)
        static_cast<__half *>(base)[off] = __float2half_rn(x);
    else
        static_cast<float *>(base)[off] = x;
}

template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// ---- warps and blocks ---------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// Block `bid` of a grid of `tiles` row tiles for each (b, head) of `heads` heads, the tiles of one
// (b, head) consecutive: which tile, head and batch it is.
struct RowBlock {
    int64_t tile, head, b;
};
__device__ __forceinline__ RowBlock row_block(int64_t bid, int64_t tiles, int64_t heads) {
    RowBlock r;
    r.tile = bid % tiles;
    bid /= tiles;
    r.head = bid % heads, r.b = bid / heads;
    return r;
}

// ---- sequences ----------------------------------------------------------------------------------
// Sequence b of a call: its query and key counts and the rows where they start (plain or packed).
struct Seq {
    int64_t L, S;         // queries, keys
    int64_t q_row0, k_row0;
    int64_t off;          // query i is aligned with key i + off (bottom-right causal: S - L)
};

__device__ __forceinline__ Seq seq_of(const P &p, int64_t b) {
    Seq s;
    s.L = p.cu_q != nullptr ? p.cu_q[b + 1] - p.cu_q[b] : p.L;
    s.q_row0 = p.cu_q != nullptr ? p.cu_q[b] : 0;
    s.S = p.seq_k != nullptr ? p.seq_k[b] : p.cu_k != nullptr ? p.cu_k[b + 1] - p.cu_k[b] : p.S;
    s.k_row0 = p.cu_k != nullptr && p.seq_k == nullptr ? p.cu_k[b] : 0;
    s.off = p.causal == 2 ? s.S - s.L : 0; // ATTN_CAUSAL_BOTTOM_RIGHT
    return s;
}

// Element offsets of row starts: q and out (b, h, query i), k and v (b, kv head hk, key j).
__device__ __forceinline__ int64_t q_row(const P &p, const Seq &s, int64_t b, int64_t h, int64_t i) {
    return b * p.q_stride[0] + h * p.q_stride[1] + (s.q_row0 + i) * p.q_stride[2];
}
__device__ __forceinline__ int64_t o_row(const P &p, const Seq &s, int64_t b, int64_t h, int64_t i) {
    return b * p.o_stride[0] + h * p.o_stride[1] + (s.q_row0 + i) * p.o_stride[2];
}
__device__ __forceinline__ int64_t lse_index(const P &p, const Seq &s, int64_t b, int64_t h, int64_t i) {
    return b * p.lse_stride[0] + h * p.lse_stride[1] + (s.q_row0 + i) * p.lse_stride[2];
}
// A key or value row (st: k_stride or v_stride); through the page table of a paged cache.
__device__ __forceinline__ int64_t kv_row(const P &p, const int64_t st[4], const Seq &s, int64_t b, int64_t hk,
                                          int64_t j) {
    if (p.page_table != nullptr) {
        const int64_t page = p.page_table[b * p.max_pages + j / p.page_size];
        return page * st[0] + hk * st[1] + (j % p.page_size) * st[2];
    }
    return b * st[0] + hk * st[1] + (s.k_row0 + j) * st[2];
}

// ---- the score rule (attn.h) --------------------------------------------------------------------
// Whether the causal mask or the local window hides key j from query i.
__device__ __forceinline__ bool bounds_hide(const P &p, const Seq &s, int64_t i, int64_t j) {
    if (p.causal != 0 && j > i + s.off) return true;
    if (p.use_window) {
        if (p.window_left >= 0 && j < i + s.off - p.window_left) return true;
        if (p.window_right >= 0 && j > i + s.off + p.window_right) return true;
    }
    return false;
}

// Keys [lo, hi) that query i may see (before the masks): bounds and the sequence's length.
__device__ __forceinline__ int64_t first_key(const P &p, const Seq &s, int64_t i) {
    int64_t lo = 0;
    if (p.use_window && p.window_left >= 0) lo = max(lo, i + s.off - p.window_left);
    return lo;
}
__device__ __forceinline__ int64_t end_key(const P &p, const Seq &s, int64_t i) {
    int64_t hi = s.S;
    if (p.causal != 0) hi = min(hi, i + s.off + 1);
    if (p.use_window && p.window_right >= 0) hi = min(hi, i + s.off + p.window_right + 1);
    return max(hi, (int64_t)0);
}

// Additive term of one mask element: BOOL True hides (-inf), F32 is added.
__device__ __forceinline__ float mask_term(const void *m, int32_t dtype, int64_t off) {
    if (dtype == ATTN__CU_BOOL) return static_cast<const uint8_t *>(m)[off] ? -CUDART_INF_F : 0.0f;
    return static_cast<const float *>(m)[off];
}

// Whether the score needs more than scale * dot on keys inside the bounds.
__device__ __forceinline__ bool has_elementwise(const P &p) {
    return p.mask != nullptr || p.kpm != nullptr || p.alibi != nullptr || p.softcap > 0.0f;
}

// The score of (b, h, i, j) in natural units from the raw dot product q.k: -inf when the bounds or
// a mask hide the key, else cap(scale * dot) + ALiBi + the mask terms. Key j < s.S, query i < s.L.
__device__ __forceinline__ float score(const P &p, const Seq &s, float dot, int64_t b, int64_t h, int64_t i,
                                       int64_t j) {
    if (bounds_hide(p, s, i, j)) return -CUDART_INF_F;
    float bias = 0.0f;
    if (p.mask != nullptr) {
        const float t = mask_term(p.mask, p.mask_dtype,
                                  b * p.mask_stride[0] + h * p.mask_stride[1] + i * p.mask_stride[2] + j * p.mask_stride[3]);
        if (t == -CUDART_INF_F) return -CUDART_INF_F;
        bias += t;
    }
    if (p.kpm != nullptr) {
        const float t = mask_term(p.kpm, p.kpm_dtype, b * p.kpm_stride[0] + j * p.kpm_stride[1]);
        if (t == -CUDART_INF_F) return -CUDART_INF_F;
        bias += t;
    }
    float x = p.scale * dot;
    if (p.softcap > 0.0f) x = p.softcap * tanhf(x / p.softcap);
    if (p.alibi != nullptr) {
        const int64_t dist = i + s.off - j;
        x -= p.alibi[h] * (float)(dist < 0 ? -dist : dist);
    }
    return x + bias;
}

// ---- dropout (Philox, src/philox.h) -------------------------------------------------------------
// Whether the weight of (b, h, i, j) is kept (p.dropout set; b the sequence).
__device__ __forceinline__ bool dropout_kept(const P &p, int64_t b, int64_t h, int64_t i, int64_t j) {
    return attn__philox_dropout_kept(p.drop_seed, p.drop_offset, p.drop_threshold, b * p.H + h, i, j) != 0;
}

// Natural-log log-sum-exp of a row from its running max (log2 domain) and sum of 2^(x - max).
__device__ __forceinline__ float lse_of(float m_log2, float l) {
    if (l == 0.0f) return -CUDART_INF_F; // fully masked (or no keys)
    return (m_log2 + log2f(l)) * kLn2;
}

} // namespace attn_cuda

#endif

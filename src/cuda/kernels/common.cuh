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
#include "mma.cuh"

namespace attn_cuda {

using P = attn__cuda_sdpa_params;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// How far (log2 units) a score may pass its row's running max before the forward's online softmax
// takes a new max (and rescales the row's output and sum): weights up to 2^8 (flash_sm80.cuh).
constexpr float kRescaleSlack = 8.0f;

// 2^x on the special-function unit, results below 2^-126 flushed to zero (ex2.approx.ftz: one
// instruction, where exp2f adds a range test and two multiplies for subnormal results). For softmax
// weights, whose row maximum is 2^0: a weight below 2^-126 adds nothing a float sum can hold.
// exp2_ftz(-inf) = 0, NaN stays NaN.
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

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

// Programmatic dependent launch (sm_90+; nothing on older devices, and nothing when the grid was
// launched without the attribute): a kernel launched with it may start before the previous kernel of
// its stream has finished; pdl_wait() blocks until that kernel has completed and its writes are
// visible, so it comes before a kernel's first global read or write. pdl_release() lets the next
// such kernel be launched once every block of this grid has called it (or exited).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
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

// Element offsets of row starts: q and out (b, h, query i), k and v (b, kv head hk, key j). Each is
// a base of the sequence and head (the *_base helpers, computed once by loops over many rows) plus
// the row's part (*_at).
__device__ __forceinline__ int64_t q_base(const P &p, const Seq &s, int64_t b, int64_t h) {
    return b * p.q_stride[0] + h * p.q_stride[1] + s.q_row0 * p.q_stride[2];
}
__device__ __forceinline__ int64_t o_base(const P &p, const Seq &s, int64_t b, int64_t h) {
    return b * p.o_stride[0] + h * p.o_stride[1] + s.q_row0 * p.o_stride[2];
}
__device__ __forceinline__ int64_t q_row(const P &p, const Seq &s, int64_t b, int64_t h, int64_t i) {
    return q_base(p, s, b, h) + i * p.q_stride[2];
}
__device__ __forceinline__ int64_t o_row(const P &p, const Seq &s, int64_t b, int64_t h, int64_t i) {
    return o_base(p, s, b, h) + i * p.o_stride[2];
}
__device__ __forceinline__ int64_t lse_index(const P &p, const Seq &s, int64_t b, int64_t h, int64_t i) {
    return b * p.lse_stride[0] + h * p.lse_stride[1] + (s.q_row0 + i) * p.lse_stride[2];
}
// A key or value row (st: k_stride or v_stride); through the page table of a paged cache (the base
// is then the head's offset inside a page).
__device__ __forceinline__ int64_t kv_base(const P &p, const int64_t st[4], const Seq &s, int64_t b, int64_t hk) {
    return p.page_table != nullptr ? hk * st[1] : b * st[0] + hk * st[1] + s.k_row0 * st[2];
}
__device__ __forceinline__ int64_t kv_at(const P &p, const int64_t st[4], int64_t base, int64_t b, int64_t j) {
    if (p.page_table != nullptr) {
        const int64_t page = p.page_table[b * p.max_pages + j / p.page_size];
        return page * st[0] + base + (j % p.page_size) * st[2];
    }
    return base + j * st[2];
}
__device__ __forceinline__ int64_t kv_row(const P &p, const int64_t st[4], const Seq &s, int64_t b, int64_t hk,
                                          int64_t j) {
    return kv_at(p, st, kv_base(p, st, s, b, hk), b, j);
}
// cp.async of keys and values n0 .. n0 + ROWS of sequence b into shared memory at dk and dv (mma.cuh's
// tile copies; kb, vb: kv_base of their (b, kv head)): a cache in sequence order as strided tiles, a
// paged one row by row through its page table. Rows past the sequence are zero-filled.
template <int ROWS, int D, int NTH, int LD, typename T>
__device__ __forceinline__ void cp_async_kv_tiles(T *dk, T *dv, const T *gk, const T *gv, const P &p, int64_t kb,
                                                  int64_t vb, const Seq &s, int64_t b, int64_t n0, int tid) {
    if (p.page_table == nullptr) {
        cp_async_tile_strided<ROWS, D, NTH, LD>(dk, gk + kb + n0 * p.k_stride[2], p.k_stride[2], s.S - n0, tid);
        cp_async_tile_strided<ROWS, D, NTH, LD>(dv, gv + vb + n0 * p.v_stride[2], p.v_stride[2], s.S - n0, tid);
    } else {
        cp_async_tile<ROWS, D, NTH, LD>(dk, gk, n0, s.S, tid, [&](int64_t j) { return kv_at(p, p.k_stride, kb, b, j); });
        cp_async_tile<ROWS, D, NTH, LD>(dv, gv, n0, s.S, tid, [&](int64_t j) { return kv_at(p, p.v_stride, vb, b, j); });
    }
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

// Queries [lo, hi) that may see key j (before the masks): the bounds of first_key / end_key turned
// around (query i sees key j when first_key(i) <= j < end_key(i)); empty when lo >= hi.
__device__ __forceinline__ int64_t first_query(const P &p, const Seq &s, int64_t j) {
    int64_t lo = 0;
    if (p.causal != 0) lo = max(lo, j - s.off);
    if (p.use_window && p.window_right >= 0) lo = max(lo, j - s.off - p.window_right);
    return lo;
}
__device__ __forceinline__ int64_t end_query(const P &p, const Seq &s, int64_t j) {
    int64_t hi = s.L;
    if (p.use_window && p.window_left >= 0) hi = min(hi, j - s.off + p.window_left + 1);
    return max(hi, (int64_t)0);
}

// Whether every pair of queries [i0, i0 + rows) and keys [j0, j0 + cols) lies inside the bounds and
// the sequence (so the score is scale * dot alone when the call has no element-wise term).
__device__ __forceinline__ bool tile_inside(const P &p, const Seq &s, int64_t i0, int rows, int64_t j0, int cols) {
    return i0 + rows <= s.L && first_key(p, s, i0 + rows - 1) <= j0 && end_key(p, s, i0) >= j0 + cols;
}

// The bounds (causal, window, the sequence's ends) of a thread's elements in a tile, relative to a
// corner: element (row0 + ri, col0 + cj) is inside when lo <= cj - ri <= hi, ri < rows and cj < cols
// (bounds_hide's test and the sequence's ends, in 32-bit arithmetic per element: the tiles that cross
// a causal diagonal or a window's edge without masks, ALiBi or soft cap, take this and not score()).
// Values beyond +-2^30 are clamped: ri and cj are tile offsets, far smaller.
struct TileBounds {
    int lo, hi, rows, cols;
};
__device__ __forceinline__ int clamp_int(int64_t x) {
    return (int)(x < -(1LL << 30) ? -(1LL << 30) : x > (1LL << 30) ? (1LL << 30) : x);
}
__device__ __forceinline__ TileBounds tile_bounds(const P &p, const Seq &s, int64_t row0, int64_t col0) {
    const int64_t d = row0 + s.off - col0; // (i + off) - j at the corner
    int64_t lo = -(1LL << 40), hi = 1LL << 40;
    if (p.causal != 0) hi = d;
    if (p.use_window && p.window_right >= 0) hi = min(hi, d + p.window_right);
    if (p.use_window && p.window_left >= 0) lo = d - p.window_left;
    TileBounds t;
    t.lo = clamp_int(lo), t.hi = clamp_int(hi), t.rows = clamp_int(s.L - row0), t.cols = clamp_int(s.S - col0);
    return t;
}
__device__ __forceinline__ bool tile_visible(const TileBounds &t, int ri, int cj) {
    const int x = cj - ri;
    return x >= t.lo && x <= t.hi && ri < t.rows && cj < t.cols;
}

// Additive term of one mask element: BOOL True hides (-inf), F32 is added.
__device__ __forceinline__ float mask_term(const void *m, int32_t dtype, int64_t off) {
    if (dtype == ATTN__CU_BOOL) return static_cast<const uint8_t *>(m)[off] ? -CUDART_INF_F : 0.0f;
    return static_cast<const float *>(m)[off];
}

// Whether the score needs more than scale * dot on keys inside the bounds.
__device__ __forceinline__ bool has_elementwise(const P &p) { return attn__cuda_elementwise(&p) != 0; }

// The score rule's parts of (b, h, i, j) from the raw dot product q.k: false when the bounds or a
// mask hide the key, else x = cap(scale * dot) + ALiBi (natural units) and bias = the sum of the
// mask terms. Key j < s.S, query i < s.L.
__device__ __forceinline__ bool score_parts(const P &p, const Seq &s, float dot, int64_t b, int64_t h, int64_t i,
                                            int64_t j, float &x, float &bias) {
    if (bounds_hide(p, s, i, j)) return false;
    bias = 0.0f;
    if (p.mask != nullptr) {
        const float t = mask_term(p.mask, p.mask_dtype,
                                  b * p.mask_stride[0] + h * p.mask_stride[1] + i * p.mask_stride[2] + j * p.mask_stride[3]);
        if (t == -CUDART_INF_F) return false;
        bias += t;
    }
    if (p.kpm != nullptr) {
        const float t = mask_term(p.kpm, p.kpm_dtype, b * p.kpm_stride[0] + j * p.kpm_stride[1]);
        if (t == -CUDART_INF_F) return false;
        bias += t;
    }
    x = p.scale * dot;
    if (p.softcap > 0.0f) x = p.softcap * tanhf(x / p.softcap);
    if (p.alibi != nullptr) {
        const int64_t dist = i + s.off - j;
        x -= p.alibi[h] * (float)(dist < 0 ? -dist : dist);
    }
    return true;
}

// The end of the log2 domain (FLT_MAX) and the same in natural units (FLT_MAX ln 2, about 2.36e38,
// rounded down).
constexpr float kMaxLog2 = 3.40282347e38f;
constexpr float kMaxNatural = 2.35865744e38f;

// y = x + the mask terms, with a sum the terms took past +-top (or to +-inf) clamped to +-top; an
// infinite or NaN x stays what it makes of y.
__device__ __forceinline__ float clamp_sum(float x, float y, float top) {
    return isfinite(x) && fabsf(y) > top ? copysignf(top, y) : y;
}

// The score of (b, h, i, j) in the log2 domain: -inf when the bounds or a mask hide the key, else
// (cap(scale * dot) + ALiBi) log2 e plus the mask terms times log2 e, clamped to float's range as
// the CPU kernels clamp it (attn.h, the note before attn_causal): a finite mask term past
// FLT_MAX / log2 e leaves its row finite, keys past the clamp weigh alike, and the row's lse stays
// within +-FLT_MAX ln 2. (The CPU forms the sum in double; here in float, an overflow clamped: the
// two differ only where a score near 1e38 cancels such a term.)
__device__ __forceinline__ float score_log2(const P &p, const Seq &s, float dot, int64_t b, int64_t h, int64_t i,
                                            int64_t j) {
    float x, bias;
    if (!score_parts(p, s, dot, b, h, i, j, x, bias)) return -CUDART_INF_F;
    const float x2 = x * kLog2e;
    return clamp_sum(x2, x2 + bias * kLog2e, kMaxLog2);
}

// The same score in natural units (the fp32 simple kernels' exp domain), clamped at +-FLT_MAX ln 2,
// so that those kernels' rows and lse agree with the log2-domain kernels'.
__device__ __forceinline__ float score(const P &p, const Seq &s, float dot, int64_t b, int64_t h, int64_t i,
                                       int64_t j) {
    float x, bias;
    if (!score_parts(p, s, dot, b, h, i, j, x, bias)) return -CUDART_INF_F;
    return bias == 0.0f ? x : clamp_sum(x, x + bias, kMaxNatural);
}

// A forward's lse (natural units; a caller's, maybe the CPU reference's) as the backward uses it,
// clamped as the scores are: within +-FLT_MAX ln 2 (clamp_lse), or +-FLT_MAX in the log2 domain
// (lse_in_log2), so that a row past the clamp keeps its top keys' weight. NaN and the infinities
// stay what they are.
__device__ __forceinline__ float clamp_lse(float lse) { return clamp_sum(lse, lse, kMaxNatural); }
__device__ __forceinline__ float lse_in_log2(float lse) { return clamp_sum(lse, lse * kLog2e, kMaxLog2); }

// The soft cap's factor in the score's derivative with respect to scale * dot: 1 - tanh^2 of the
// cap's argument (1 without a cap); dscore_ddot is the whole derivative with respect to the dot.
__device__ __forceinline__ float softcap_dfactor(const P &p, float dot) {
    if (p.softcap <= 0.0f) return 1.0f;
    const float t = tanhf(p.scale * dot / p.softcap);
    return 1.0f - t * t;
}
__device__ __forceinline__ float dscore_ddot(const P &p, float dot) { return p.scale * softcap_dfactor(p, dot); }

// ---- dropout (Philox, src/philox.h) -------------------------------------------------------------
// Whether the weight of (b, h, i, j) is kept (p.dropout set; b the sequence).
__device__ __forceinline__ bool dropout_kept(const P &p, int64_t b, int64_t h, int64_t i, int64_t j) {
    return attn__philox_dropout_kept(p.drop_seed, p.drop_offset, p.drop_threshold, b * p.H + h, i, j) != 0;
}

// Whether keys j and j + 1 (j even) of query row i of bh = b H + h are kept: one generator call
// gives both (words j % 4 and j % 4 + 1 of their group of four).
__device__ __forceinline__ void dropout_kept_pair(const P &p, int64_t bh, int64_t i, int64_t j, bool &k0, bool &k1) {
    const attn__philox4 w = attn__philox_dropout_words(p.drop_seed, p.drop_offset, bh, i, j);
    const bool upper = (j & 2) != 0;
    k0 = (uint64_t)(upper ? w.v[2] : w.v[0]) < p.drop_threshold;
    k1 = (uint64_t)(upper ? w.v[3] : w.v[1]) < p.drop_threshold;
}

// The keep flags of a lane's four elements of an mma accumulator tile whose rows are keys and
// columns queries (the key-major layout of the backward's dK/dV kernel): element e is key
// kw0 + g + (e >> 1) * 8, query iq + 2c + (e & 1) (g = lane / 4, c = lane % 4; kw0 a multiple of 4).
// The four lanes of equal c and g / 4 hold 16 elements, four groups of four keys of one query:
// each lane draws one group (one generator call) and the words go round in three shuffles.
__device__ __forceinline__ void dropout_kept_keymajor(const P &p, int64_t bh, int64_t iq, int64_t kw0, int lane,
                                                      bool kept[4]) {
    const int g = lane >> 2, c = lane & 3, r = g & 3;
    // this lane draws element r's group: query iq + 2c + (r & 1), keys kw0 + 4 (g / 4) + (r >> 1) 8 ...
    const attn__philox4 w =
        attn__philox_dropout_words(p.drop_seed, p.drop_offset, bh, iq + 2 * c + (r & 1), kw0 + 4 * (g >> 2) + (r >> 1) * 8);
    // Round t: lane ^ 4t (g % 4 = r ^ t) drew the group of this lane's element r ^ t, in which this
    // lane's key is word r; it sends word r of its group, as this lane sends word r ^ t of its own.
    // So v[t] is the word of element r ^ t.
    uint32_t v[4];
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const uint32_t mine = attn__philox_word(&w, r ^ t);
        v[t] = t == 0 ? mine : __shfl_xor_sync(0xffffffffu, mine, t << 2);
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int t = e ^ r;
        const uint32_t word = (t & 2) ? ((t & 1) ? v[3] : v[2]) : ((t & 1) ? v[1] : v[0]);
        kept[e] = (uint64_t)word < p.drop_threshold;
    }
}

// Natural-log log-sum-exp of a row from its running max (log2 domain) and sum of 2^(x - max).
__device__ __forceinline__ float lse_of(float m_log2, float l) {
    if (l == 0.0f) return -CUDART_INF_F; // fully masked (or no keys)
    return (m_log2 + log2f(l)) * kLn2;
}

} // namespace attn_cuda

#endif

// flash_softmax.cuh - the per-tile steps of the tensor-core forwards (flash_sm80.cuh on mma.sync,
// flash_sm90.cuh on Hopper's wgmma) between S = Q K^T and O += P V, and their epilogue. Both hold a
// warp's scores and output in the accumulator layout of mma.m16n8 (mma.cuh), which wgmma's
// m64nNk16 accumulators repeat per warp: for m-tile m (16 rows) and n-tile nt (8 columns),
// acc[m][nt][e] is row g + 8 (e / 2), column 8 nt + 2 c + e % 2, with g = lane / 4, c = lane % 4.
// Weights live in the exp2 domain: the scores are multiplied by scale * log2(e) (or that factor is
// folded into the exponent, fs) and each row keeps a running max m and sum l of 2^(s fs - m).
#ifndef ATTN_CUDA_FLASH_SOFTMAX_CUH
#define ATTN_CUDA_FLASH_SOFTMAX_CUH

#include "common.cuh"

namespace attn_cuda {

// A forward block's query tile: rows i0 .. i0 + Br - 1 of (b, h) (kv head hk), the last query tiles
// of the grid first (most keys under causal masking); the key tiles of Bc rows any of its rows may
// see, n_begin .. n_begin + n_tiles - 1 (bounds only; masks apply per element), and the keys
// [full_lo, full_hi) every row sees. empty: no row of the tile lies in its sequence.
struct QueryTile {
    Seq s;
    int64_t b, h, hk, i0, n_begin, full_lo, full_hi;
    int n_tiles;
    bool empty;
};
template <int Br, int Bc> __device__ __forceinline__ QueryTile query_tile(const P &p) {
    QueryTile q;
    const int64_t bh_count = p.B * p.H;
    const int64_t m_blocks = (p.L + Br - 1) / Br;
    const int64_t bid = blockIdx.x;
    const int64_t mt = m_blocks - 1 - bid / bh_count, bh = bid % bh_count;
    q.b = bh / p.H, q.h = bh % p.H, q.hk = q.h / p.group;
    q.s = seq_of(p, q.b);
    q.i0 = mt * Br;
    q.empty = q.i0 >= q.s.L;
    const int64_t i_last = min(q.i0 + Br, q.s.L) - 1;
    const int64_t k_lo = first_key(p, q.s, q.i0), k_hi = end_key(p, q.s, i_last);
    q.full_lo = first_key(p, q.s, i_last), q.full_hi = end_key(p, q.s, q.i0);
    q.n_begin = k_lo < k_hi ? k_lo / Bc : 0;
    const int64_t n_end = k_lo < k_hi ? (k_hi + Bc - 1) / Bc : 0;
    q.n_tiles = (int)(n_end - q.n_begin);
    return q;
}

// Scores of one key tile (keys n0 .., Bc = 8 NT of them) for MW m-tiles whose first rows are
// iw + 16 m: on tiles inside the bounds the dot products as they are when the scale is folded into
// the exponent (fold: a positive scale), else times scale_log2; -inf outside the bounds on tiles
// that cross them (pre_scale times the others); the whole rule (log2 domain) where the call needs
// it (elementwise).
template <int MW, int NT>
__device__ __forceinline__ void tile_scores(float (&sacc)[MW][NT][4], const P &p, const Seq &s, int64_t b, int64_t h,
                                            int64_t iw, int64_t n0, bool inside, bool elementwise, bool fold,
                                            float scale_log2, float pre_scale, int g, int c) {
#pragma unroll
    for (int m = 0; m < MW; m++) {
        if (!elementwise && inside) {
            if (!fold) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) sacc[m][nt][e] *= scale_log2;
            }
        } else if (!elementwise) { // bounds only (a causal diagonal, a window's edge, the ends)
            const TileBounds tb = tile_bounds(p, s, iw + m * 16 + g, n0 + 2 * c);
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    sacc[m][nt][e] = tile_visible(tb, (e >> 1) * 8, nt * 8 + (e & 1)) ? sacc[m][nt][e] * pre_scale : -CUDART_INF_F;
        } else {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int64_t i = iw + m * 16 + g + (e >> 1) * 8, j = n0 + nt * 8 + 2 * c + (e & 1);
                    sacc[m][nt][e] = i < s.L && j < s.S ? score_log2(p, s, sacc[m][nt][e], b, h, i, j) : -CUDART_INF_F;
                }
        }
    }
}

// Online softmax of one tile, weights exp2(s * fs - m) left in sacc: rows g (elements 0, 1) and g + 8
// (elements 2, 3) of each m-tile; a row's 4 threads agree. A row keeps its running max m while no
// score of the tile passes it by more than kRescaleSlack (its weights then at most 2^8, within fp32's
// and bf16's range, and the output the same once divided by the sum): the warp rescales O and the
// sums only when one of its rows needs a new max (FlashAttention-4's conditional rescaling; after
// the first tiles seldom).
template <int MW, int NT, int NO>
__device__ __forceinline__ void tile_softmax(float (&sacc)[MW][NT][4], float (&oacc)[MW][NO][4], float (&row_m)[MW][2],
                                             float (&row_l)[MW][2], float fs) {
    float tile_max[MW][2];
    bool grow = false;
#pragma unroll
    for (int m = 0; m < MW; m++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -CUDART_INF_F;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(sacc[m][nt][2 * r], sacc[m][nt][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            tile_max[m][r] = mx * fs;
            grow |= tile_max[m][r] > row_m[m][r] + kRescaleSlack;
        }
    if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
        for (int m = 0; m < MW; m++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const float m_new = fmaxf(row_m[m][r], tile_max[m][r]);
                const float alpha = exp2_ftz(row_m[m][r] - (m_new == -CUDART_INF_F ? 0.0f : m_new));
                row_m[m][r] = m_new;
                row_l[m][r] *= alpha;
#pragma unroll
                for (int no = 0; no < NO; no++) oacc[m][no][2 * r] *= alpha, oacc[m][no][2 * r + 1] *= alpha;
            }
    }
#pragma unroll
    for (int m = 0; m < MW; m++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float m_use = row_m[m][r] == -CUDART_INF_F ? 0.0f : row_m[m][r]; // no key seen yet: weights 0, not NaN
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                sacc[m][nt][2 * r] = exp2_ftz(fmaf(sacc[m][nt][2 * r], fs, -m_use));
                sacc[m][nt][2 * r + 1] = exp2_ftz(fmaf(sacc[m][nt][2 * r + 1], fs, -m_use));
                sum += sacc[m][nt][2 * r] + sacc[m][nt][2 * r + 1];
            }
            row_l[m][r] += sum;
        }
}

// The end of a warp's rows (WR = 16 MW of them, from query iw): O divided by the row sums (times
// keep, dropout's 1 / (1 - p)), lse written per row, and O through shared memory (so, WR rows at a
// pitch of LD elements, the warp's own) to 16-byte stores.
template <typename T, int MW, int NO, int LD>
__device__ __forceinline__ void store_rows(const float (&oacc)[MW][NO][4], const float (&row_m)[MW][2], const float (&row_l)[MW][2],
                                           float keep, const P &p, const Seq &s, int64_t b, int64_t h, int64_t iw, T *so,
                                           int lane) {
    constexpr int D = 8 * NO, WR = 16 * MW, CPR = D / 8;
    const int g = lane / 4, c = lane % 4;
#pragma unroll
    for (int m = 0; m < MW; m++) {
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = row_l[m][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            inv[r] = l > 0.0f ? keep / l : (l == 0.0f ? 0.0f : l); // NaN stays NaN
            const int64_t i = iw + m * 16 + g + r * 8;
            if (p.lse != nullptr && c == 0 && i < s.L) p.lse[lse_index(p, s, b, h, i)] = lse_of(row_m[m][r], l);
        }
#pragma unroll
        for (int no = 0; no < NO; no++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                *reinterpret_cast<uint32_t *>(so + (m * 16 + g + r * 8) * LD + no * 8 + 2 * c) =
                    pack2<T>(oacc[m][no][2 * r] * inv[r], oacc[m][no][2 * r + 1] * inv[r]);
    }
    __syncwarp();
    T *gout = static_cast<T *>(p.out);
    for (int ch = lane; ch < WR * CPR; ch += 32) {
        const int r = ch / CPR, col = (ch % CPR) * 8;
        const int64_t i = iw + r;
        if (i < s.L)
            *reinterpret_cast<uint4 *>(gout + o_row(p, s, b, h, i) + col) = *reinterpret_cast<const uint4 *>(so + r * LD + col);
    }
}

} // namespace attn_cuda

#endif

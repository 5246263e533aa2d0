// flash_bwd_sm80.cuh - the tensor-core SDPA backward (FlashAttention-2's backward, Dao 2023 section
// 3.2, on mma.sync, sm_80+), two kernels per (element type, head dim):
//
// flash_bwd_dkdv_kernel: one block per (key tile of Bc = 64 rows, slice, b, kv head), 4 warps of 16
// keys; a slice is the kDs columns of dK, dV and dQ the block accumulates (flash_traits.cuh: the
// whole head dim up to 128, half of it at 256, S and dP then computed by both slices' blocks).
// K_j and V_j stay in shared memory; the block loops over the query heads of the GQA group and, per
// head, over the query tiles (Br rows) that may see the tile's keys, Q_i and dO_i (with lse_i and
// D_i = dO_i . O_i) loaded by cp.async into shared memory. Per query tile each warp computes, for
// its 16 keys and the tile's Br queries, in the key-major layout (keys are the mma's rows, so the
// accumulators are the A operands of the next products without a transpose):
//   dP^T = V dO^T and S^T = K Q^T                     (mma)
//   P = exp2(S * scale * log2 e - lse * log2 e)        (the score rule of common.cuh on tiles that
//                                                       need it: masks, ALiBi, soft cap, bounds)
//   P' = P with the Philox mask and 1 / (1 - p) applied (the forward's mask, regenerated)
//   dS = P (dP' - D) times the soft cap's 1 - tanh^2   (dP' = dP with the mask and 1 / (1 - p))
//   dV += P'^T dO, dK += dS^T Q                        (mma; P' and dS rounded to T first)
// and, in the default (atomic) mode, dS^T goes to shared memory and dQ += dS K (mma) is added to
// the float32 accumulator p.dq_acc with atomicAdd (8-byte red.global.add.v2.f32 on sm_90; a later
// kernel scales and converts it). dK (times scale) and dV are written once, in grad_dtype, summed
// over the group's heads.
//
// flash_bwd_dq_kernel (deterministic mode): one block per 64 query rows of one (b, h) and slice of
// dQ's columns, 4 warps of 16 rows, the forward's layout; key tiles in order (cp.async, two
// stages), recomputing S and dP, dQ += dS K in registers; written once (times scale). No atomics
// anywhere: the same bits every run.
//
// Both kernels come in two instances per (T, D), with and without the dropout code (Dropout), and
// each tile's scores take the cheapest rule it allows (bwd_scores: scale alone, the bounds, or the
// whole score rule), so a call without masks runs an element loop of a few instructions a score.
//
// Rows past the sequence are zero-filled in shared memory and get lse = +inf (no weight); a row the
// masks hide wholly (lse = -inf) too. Preconditions (plan.c): q, k, v, out, dout of type T (bf16 or
// f16), head_dim = head_dim_v = D, unit stride along D, 16-byte aligned rows.
#ifndef ATTN_CUDA_FLASH_BWD_SM80_CUH
#define ATTN_CUDA_FLASH_BWD_SM80_CUH

#include <cuda_runtime.h>

#include "common.cuh"
#include "flash_traits.cuh"
#include "mma.cuh"

namespace attn_cuda {

// The score of one element in the log2 domain under the whole score rule (masks, ALiBi, soft cap,
// bounds: common.cuh) from its raw product sv = q . k, -inf past the sequence's ends; f: the soft
// cap's factor 1 - tanh^2 for dS (1 without a cap).
__device__ __forceinline__ float bwd_score_log2(const P &p, const Seq &s, float sv, int64_t b, int64_t h, int64_t i,
                                                int64_t j, float &f) {
    if (i >= s.L || j >= s.S) return -CUDART_INF_F;
    f = softcap_dfactor(p, sv);
    return score_log2(p, s, sv, b, h, i, j);
}

// One element of the backward from its score x (log2 domain, -inf: no weight) and its raw product
// dpv = dout . v: sv becomes the weight the forward used for the output (P', dropout applied: dV's
// factor), dpv the score's gradient over scale (dS: dK's and dQ's factor). lse2: the row's lse times
// log2 e (+inf: no weight); di: the row's dout . out; f: the soft cap's factor; kept: the mask's bit.
template <bool Dropout>
__device__ __forceinline__ void bwd_element(const P &p, float x, float f, float lse2, float di, bool kept, float &sv,
                                            float &dpv) {
    const float pr = exp2_ftz(x - lse2);
    float dp = dpv, pd = pr;
    if (Dropout && p.dropout) {
        dp = kept ? dp * p.keep_scale : 0.0f;
        pd = kept ? pr * p.keep_scale : 0.0f;
    }
    sv = pd;
    dpv = pr * (dp - di) * f;
}

// The scores of a warp's tile, by the cheapest rule the tile allows: scale alone where every element
// lies inside the bounds and the call has no element-wise term; the bounds tested in 32-bit
// tile-relative arithmetic (TileBounds, computed only then) where it has none but the tile crosses
// them; else the whole rule. Each branch covers the whole tile, so no element carries the others'
// code. each(score_of) runs the tile's element loop with score_of(n, e, sv, f) -> x; visible(tb, n, e)
// is an element's bounds verdict, rule(n, e, sv, f) its score under the whole rule. Split = false
// sends the tiles inside the bounds through the bounds' branch too (one copy of the element loop
// fewer: the instances with dropout, whose loop is long, spill less).
template <bool Split, typename Each, typename Bounds, typename Visible, typename Rule>
__device__ __forceinline__ void bwd_scores(bool elementwise, bool inside, float sl2, Each each, Bounds bounds,
                                           Visible visible, Rule rule) {
    if (Split && !elementwise && inside) {
        each([&](int, int, float sv, float &) { return sv * sl2; });
    } else if (!elementwise) {
        const TileBounds tb = bounds();
        each([&](int n, int e, float sv, float &) { return visible(tb, n, e) ? sv * sl2 : -CUDART_INF_F; });
    } else {
        each([&](int n, int e, float sv, float &f) { return rule(n, e, sv, f); });
    }
}

// A row's lse in the log2 domain as the kernels use it: +inf for rows past the sequence and rows
// with no weight (lse = -inf), so that every P of the row is exp2(-inf) = 0; within +-FLT_MAX as
// the scores are (lse_in_log2: an lse past FLT_MAX ln 2 would give the row's top keys no weight).
__device__ __forceinline__ float lse_log2(float lse, bool valid) {
    return valid && lse != -CUDART_INF_F ? lse_in_log2(lse) : CUDART_INF_F;
}

template <typename T, int D, bool Dropout>
__global__ void __launch_bounds__(FlashBwdTraits<D>::kThreads, 1) flash_bwd_dkdv_kernel(const P p) {
    using Tr = FlashBwdTraits<D>;
    constexpr int Bc = Tr::kBc, Br = Tr::kBr, NTH = Tr::kThreads;
    constexpr int LD = D + 8;              // shared row pitch of K, V, Q, dO (elements)
    constexpr int LDS = Br + 8;            // shared row pitch of dS^T
    constexpr int NQ = Br / 8;             // n-tiles of S^T and dP^T per warp (8 queries each)
    constexpr int DS = Tr::kDs, NS = Tr::kSlices; // this block's columns of dK, dV, dQ; blocks a key tile
    constexpr int KD = D / 16;             // k-steps over the head dim
    constexpr int ND = DS / 8;             // n-tiles of dK and dV
    constexpr int KQ = Br / 16;            // k-steps over the queries (dV, dK)
    constexpr int RG = Br / 16;            // dQ: warps split the tile into RG row groups ...
    constexpr int DSL = Tr::kWarps / RG;   // ... times DSL parts of the block's columns
    constexpr int DW = DS / DSL;
    static_assert(Bc == 16 * Tr::kWarps && DW % 16 == 0 && Br <= NTH, "tile shapes");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sK = reinterpret_cast<T *>(smem_raw);               // (Bc, LD)
    T *sV = sK + Bc * LD;                                  // (Bc, LD)
    T *sQ = sV + Bc * LD;                                  // (Br, LD)
    T *sdO = sQ + Br * LD;                                 // (Br, LD)
    T *sdS = sdO + Br * LD;                                // (Bc, LDS): dS^T of the query tile
    float *sLse = reinterpret_cast<float *>(sdS + Bc * LDS); // (Br) the forward's lse, then lse_log2 of it
    float *sDi = sLse + Br;                                // (Br) dout . out

    // Block -> (key tile, slice, b, kv head); the first key tiles (most queries under causal masking)
    // first, a tile's slices side by side (they read the same K, V, Q and dO).
    const int64_t heads = p.B * p.Hkv;
    const int64_t nk = blockIdx.x / (heads * NS), bhk = blockIdx.x % heads;
    const int d0 = NS == 1 ? 0 : (int)(blockIdx.x / heads % NS) * DS; // the slice's first column
    const int64_t b = bhk / p.Hkv, hk = bhk % p.Hkv;
    const Seq s = seq_of(p, b);
    const int64_t j0 = nk * Bc;
    if (j0 >= s.S) return; // whole block
    const int64_t j_last = min(j0 + Bc, s.S) - 1;
    // Query tiles that may see a key of the tile (bounds only; masks apply per element).
    const int64_t q_lo = first_query(p, s, j0), q_hi = end_query(p, s, j_last);
    const int64_t m_begin = q_lo < q_hi ? q_lo / Br : 0, m_end = q_lo < q_hi ? (q_hi + Br - 1) / Br : 0;
    const int m_tiles = (int)(m_end - m_begin);
    const int n_iters = m_tiles * (int)p.group; // (head, query tile) pairs, heads outer
    const bool elementwise = has_elementwise(p), atomic = p.dq_acc != nullptr;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
    const int kr0 = warp * 16; // this warp's keys in the tile
    const T *gq = static_cast<const T *>(p.q), *gk = static_cast<const T *>(p.k), *gv = static_cast<const T *>(p.v);
    const T *gdo = static_cast<const T *>(p.dout);

    {
        const int64_t kb = kv_base(p, p.k_stride, s, b, hk), vb = kv_base(p, p.v_stride, s, b, hk);
        cp_async_tile<Bc, D, NTH, LD>(sK, gk, j0, s.S, tid, [&](int64_t j) { return kv_at(p, p.k_stride, kb, b, j); });
        cp_async_tile<Bc, D, NTH, LD>(sV, gv, j0, s.S, tid, [&](int64_t j) { return kv_at(p, p.v_stride, vb, b, j); });
    }
    auto load_q = [&](int hq, int mi) { // head hq of the group, query tile m_begin + mi
        const int64_t h = hk * p.group + hq, i0 = (m_begin + mi) * Br;
        cp_async_tile_strided<Br, D, NTH, LD>(sQ, gq + q_base(p, s, b, h) + i0 * p.q_stride[2], p.q_stride[2], s.L - i0, tid);
        cp_async_tile_strided<Br, D, NTH, LD>(sdO, gdo + o_base(p, s, b, h) + i0 * p.o_stride[2], p.o_stride[2], s.L - i0, tid);
        if (tid < Br) { // one row a thread (Br <= NTH)
            const int64_t i = i0 + tid;
            const bool ok = i < s.L;
            const int64_t li = ok ? lse_index(p, s, b, h, i) : 0;
            cp_async4(sLse + tid, p.lse + li, ok);
            cp_async4(sDi + tid, p.rowdot + li, ok);
        }
    };
    if (n_iters > 0) load_q(0, 0);
    cp_async_commit(); // K, V and the first query tile

    float dv[ND][4], dk[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dv[n][e] = dk[n][e] = 0.0f;

    const float sl2 = p.scale * kLog2e;
    for (int it = 0, hq = 0, mi = 0; it < n_iters; it++) { // (hq, mi): this iteration's head and query tile
        const int64_t h = hk * p.group + hq, i0 = (m_begin + mi) * Br;
        cp_async_wait<0>(); // this query tile (and K, V) have landed for this thread ...
        if (tid < Br) sLse[tid] = lse_log2(sLse[tid], i0 + tid < s.L); // its own row's lse, now log2
        __syncthreads();    // ... and for every thread

        // dP^T = V dO^T and S^T = K Q^T: this warp's 16 keys x the tile's Br queries
        float sacc[NQ][4], dpacc[NQ][4];
#pragma unroll
        for (int n = 0; n < NQ; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) sacc[n][e] = dpacc[n][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            uint32_t ak[4], av[4];
            ldsm_a(ak, sK, LD, kr0, kk * 16, lane);
            ldsm_a(av, sV, LD, kr0, kk * 16, lane);
            mma_row<T, NQ / 2, false>(sacc, ak, sQ, LD, kk * 16, lane);
            mma_row<T, NQ / 2, false>(dpacc, av, sdO, LD, kk * 16, lane);
        }

        // P' and dS, element (key kr0 + g + (e >> 1) 8, query 2c + (e & 1) of n-tile n)
        const int64_t bh = b * p.H + h;
        auto each = [&](auto score_of) {
#pragma unroll
            for (int n = 0; n < NQ; n++) {
                bool kept[4] = {true, true, true, true};
                if (Dropout && p.dropout) dropout_kept_keymajor(p, bh, i0 + n * 8, j0 + kr0, lane, kept);
#pragma unroll
                for (int q2 = 0; q2 < 2; q2++) { // the thread's two queries of the n-tile
                    const int ql = n * 8 + 2 * c + q2;
                    const float lse2 = sLse[ql], di = sDi[ql];
#pragma unroll
                    for (int e = q2; e < 4; e += 2) {
                        float f = 1.0f;
                        const float x = score_of(n, e, sacc[n][e], f);
                        bwd_element<Dropout>(p, x, f, lse2, di, kept[e], sacc[n][e], dpacc[n][e]);
                    }
                }
            }
        };
        bwd_scores<!Dropout>(
            elementwise, tile_inside(p, s, i0, Br, j0, Bc), sl2, each,
            [&] { return tile_bounds(p, s, i0 + 2 * c, j0 + kr0 + g); }, // rows: queries, cols: keys
            [&](const TileBounds &tb, int n, int e) { return tile_visible(tb, n * 8 + (e & 1), (e >> 1) * 8); },
            [&](int n, int e, float sv, float &f) {
                return bwd_score_log2(p, s, sv, b, h, i0 + n * 8 + 2 * c + (e & 1), j0 + kr0 + g + (e >> 1) * 8, f);
            });

        // dV += P'^T dO and dK += dS^T Q: the accumulators of two n-tiles are one A fragment.
#pragma unroll
        for (int kq = 0; kq < KQ; kq++) {
            uint32_t ap[4], as[4];
            acc_to_a<T>(ap, sacc[2 * kq], sacc[2 * kq + 1]);
            acc_to_a<T>(as, dpacc[2 * kq], dpacc[2 * kq + 1]);
            mma_row<T, DS / 16, true>(dv, ap, sdO + d0, LD, kq * 16, lane);
            mma_row<T, DS / 16, true>(dk, as, sQ + d0, LD, kq * 16, lane);
        }
        if (atomic) { // dS^T to shared memory (rounded to T, as the dK product saw it)
#pragma unroll
            for (int n = 0; n < NQ; n++) {
                *reinterpret_cast<uint32_t *>(sdS + (kr0 + g) * LDS + n * 8 + 2 * c) = pack2<T>(dpacc[n][0], dpacc[n][1]);
                *reinterpret_cast<uint32_t *>(sdS + (kr0 + g + 8) * LDS + n * 8 + 2 * c) = pack2<T>(dpacc[n][2], dpacc[n][3]);
            }
        }
        __syncthreads(); // every warp is done with Q, dO, lse, D of this tile, and dS^T is whole
        if (++mi == m_tiles) mi = 0, hq++;
        if (it + 1 < n_iters) load_q(hq, mi); // the next tile loads while dQ is computed
        cp_async_commit();

        if (atomic) { // dQ += dS K: warp (rg, ds) takes query rows 16 rg.. and columns d0 + DW ds..
            const int rg = warp % RG, ds = warp / RG;
            float dq[DW / 8][4];
#pragma unroll
            for (int n = 0; n < DW / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
#pragma unroll
            for (int kb = 0; kb < Bc / 16; kb++) {
                uint32_t a[4]; // dS rows (queries) from dS^T: the transposed load
                ldsm_a_km(a, sdS, LDS, rg * 16, kb * 16, lane);
                mma_row<T, DW / 16, true>(dq, a, sK + d0 + ds * DW, LD, kb * 16, lane);
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int64_t i = i0 + rg * 16 + g + r * 8;
                if (i >= s.L) continue;
                float *row = p.dq_acc + lse_index(p, s, b, h, i) * D + d0 + ds * DW + 2 * c;
#pragma unroll
                for (int n = 0; n < DW / 8; n++) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 // one 8-byte reduction (red.global.add.v2.f32)
                    atomicAdd(reinterpret_cast<float2 *>(row + n * 8), make_float2(dq[n][2 * r], dq[n][2 * r + 1]));
#else
                    atomicAdd(row + n * 8, dq[n][2 * r]);
                    atomicAdd(row + n * 8 + 1, dq[n][2 * r + 1]);
#endif
                }
            }
        }
    }
    cp_async_wait<0>(); // nothing in flight (K and V when there were no query tiles)

#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t j = j0 + kr0 + g + (e >> 1) * 8, d = d0 + n * 8 + 2 * c + (e & 1);
            if (j >= s.S) continue;
            store_from_float(p.dk, p.grad_dtype, kv_row(p, p.k_stride, s, b, hk, j) + d * p.k_stride[3], dk[n][e] * p.scale);
            store_from_float(p.dv, p.grad_dtype, kv_row(p, p.v_stride, s, b, hk, j) + d * p.v_stride[3], dv[n][e]);
        }
}

template <typename T, int D, bool Dropout>
__global__ void __launch_bounds__(FlashBwdTraits<D>::kThreads, 1) flash_bwd_dq_kernel(const P p) {
    using Tr = FlashBwdTraits<D>;
    constexpr int Br = Tr::kBrQ, Bc = Tr::kBcQ, ST = Tr::kStagesQ, NTH = Tr::kThreads;
    constexpr int LD = D + 8;
    constexpr int NT = Bc / 8;   // n-tiles of S and dP per warp (8 keys each)
    constexpr int KD = D / 16;   // k-steps of Q K^T and dO V^T
    constexpr int DS = Tr::kDs, NS = Tr::kSlices; // this block's columns of dQ; blocks a query tile
    constexpr int NO = DS / 8;   // n-tiles of dQ
    constexpr int KB = Bc / 16;  // k-steps of dS K
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sQ = reinterpret_cast<T *>(smem_raw); // (Br, LD)
    T *sdO = sQ + Br * LD;                    // (Br, LD)
    T *sK = sdO + Br * LD;                    // (ST, Bc, LD)
    T *sV = sK + ST * Bc * LD;                // (ST, Bc, LD)

    // Block -> (query tile, slice, b, h) as the forward: the last query tiles (most keys) first.
    const int64_t bh_count = p.B * p.H;
    const int64_t m_blocks = (p.L + Br - 1) / Br;
    const int64_t mt = m_blocks - 1 - blockIdx.x / (bh_count * NS), bh = blockIdx.x % bh_count;
    const int d0 = NS == 1 ? 0 : (int)(blockIdx.x / bh_count % NS) * DS; // the slice's first column
    const int64_t b = bh / p.H, h = bh % p.H, hk = h / p.group;
    const Seq s = seq_of(p, b);
    const int64_t i0 = mt * Br;
    if (i0 >= s.L) return;
    const int64_t i_last = min(i0 + Br, s.L) - 1;
    const int64_t k_lo = first_key(p, s, i0), k_hi = end_key(p, s, i_last);
    const int64_t n_begin = k_lo < k_hi ? k_lo / Bc : 0, n_end = k_lo < k_hi ? (k_hi + Bc - 1) / Bc : 0;
    const int n_tiles = (int)(n_end - n_begin);
    const bool elementwise = has_elementwise(p);

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
    const T *gq = static_cast<const T *>(p.q), *gk = static_cast<const T *>(p.k), *gv = static_cast<const T *>(p.v);
    const T *gdo = static_cast<const T *>(p.dout);

    cp_async_tile_strided<Br, D, NTH, LD>(sQ, gq + q_base(p, s, b, h) + i0 * p.q_stride[2], p.q_stride[2], s.L - i0, tid);
    cp_async_tile_strided<Br, D, NTH, LD>(sdO, gdo + o_base(p, s, b, h) + i0 * p.o_stride[2], p.o_stride[2], s.L - i0, tid);
    const int64_t kb = kv_base(p, p.k_stride, s, b, hk), vb = kv_base(p, p.v_stride, s, b, hk);
    auto load_kv = [&](int64_t tile, int stage) {
        cp_async_kv_tiles<Bc, D, NTH, LD>(sK + stage * Bc * LD, sV + stage * Bc * LD, gk, gv, p, kb, vb, s, b, tile * Bc, tid);
    };
#pragma unroll
    for (int st = 0; st < ST - 1; st++) {
        if (st < n_tiles) load_kv(n_begin + st, st);
        cp_async_commit(); // group st (group 0 also holds Q and dO)
    }

    // this thread's rows g and g + 8 of the warp's 16
    float lse2[2], di[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t i = i0 + warp * 16 + g + r * 8;
        const bool ok = i < s.L;
        const int64_t li = ok ? lse_index(p, s, b, h, i) : 0;
        lse2[r] = lse_log2(ok ? p.lse[li] : 0.0f, ok);
        di[r] = ok ? p.rowdot[li] : 0.0f;
    }
    float dq[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

    const float sl2 = p.scale * kLog2e;
    for (int t = 0; t < n_tiles; t++) {
        const int pre = t + ST - 1;
        if (pre < n_tiles) load_kv(n_begin + pre, pre % ST);
        cp_async_commit();
        cp_async_wait<ST - 1>();
        __syncthreads();
        const T *k_s = sK + (t % ST) * Bc * LD, *v_s = sV + (t % ST) * Bc * LD;

        // S = Q K^T and dP = dO V^T for this warp's 16 rows and the tile's Bc keys
        float sacc[NT][4], dpacc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) sacc[n][e] = dpacc[n][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            uint32_t aq[4], ao[4];
            ldsm_a(aq, sQ, LD, warp * 16, kk * 16, lane);
            ldsm_a(ao, sdO, LD, warp * 16, kk * 16, lane);
            mma_row<T, NT / 2, false>(sacc, aq, k_s, LD, kk * 16, lane);
            mma_row<T, NT / 2, false>(dpacc, ao, v_s, LD, kk * 16, lane);
        }

        // dS, element (row g + (e >> 1) 8, key 2c + (e & 1) of n-tile n)
        const int64_t n0 = (n_begin + t) * Bc;
        auto each = [&](auto score_of) {
#pragma unroll
            for (int n = 0; n < NT; n++) {
                bool kept[4] = {true, true, true, true};
                if (Dropout && p.dropout) {
#pragma unroll
                    for (int r = 0; r < 2; r++)
                        dropout_kept_pair(p, bh, i0 + warp * 16 + g + r * 8, n0 + n * 8 + 2 * c, kept[2 * r], kept[2 * r + 1]);
                }
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float f = 1.0f;
                    const float x = score_of(n, e, sacc[n][e], f);
                    bwd_element<Dropout>(p, x, f, lse2[e >> 1], di[e >> 1], kept[e], sacc[n][e], dpacc[n][e]);
                }
            }
        };
        bwd_scores<!Dropout>(
            elementwise, tile_inside(p, s, i0, Br, n0, Bc), sl2, each,
            [&] { return tile_bounds(p, s, i0 + warp * 16 + g, n0 + 2 * c); },
            [&](const TileBounds &tb, int n, int e) { return tile_visible(tb, (e >> 1) * 8, n * 8 + (e & 1)); },
            [&](int n, int e, float sv, float &f) {
                return bwd_score_log2(p, s, sv, b, h, i0 + warp * 16 + g + (e >> 1) * 8, n0 + n * 8 + 2 * c + (e & 1), f);
            });

        // dQ += dS K
#pragma unroll
        for (int kb = 0; kb < KB; kb++) {
            uint32_t a[4];
            acc_to_a<T>(a, dpacc[2 * kb], dpacc[2 * kb + 1]);
            mma_row<T, DS / 16, true>(dq, a, k_s + d0, LD, kb * 16, lane);
        }
        __syncthreads(); // the stage read here is the one the next iteration's prefetch overwrites
    }
    cp_async_wait<0>();

#pragma unroll
    for (int n = 0; n < NO; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t i = i0 + warp * 16 + g + (e >> 1) * 8, d = d0 + n * 8 + 2 * c + (e & 1);
            if (i < s.L) store_from_float(p.dq, p.grad_dtype, q_row(p, s, b, h, i) + d * p.q_stride[3], dq[n][e] * p.scale);
        }
}

// Shared memory of the two kernels (bytes): plan.c computes the same from its copy of the traits.
template <int D> constexpr size_t flash_bwd_dkdv_smem() {
    using Tr = FlashBwdTraits<D>;
    return (size_t)(2 * Tr::kBc + 2 * Tr::kBr) * (D + 8) * 2 + (size_t)Tr::kBc * (Tr::kBr + 8) * 2 + 2 * Tr::kBr * sizeof(float);
}
template <int D> constexpr size_t flash_bwd_dq_smem() {
    using Tr = FlashBwdTraits<D>;
    return (size_t)(2 * Tr::kBrQ + 2 * Tr::kStagesQ * Tr::kBcQ) * (D + 8) * 2;
}

// dK and dV (and dQ: into p.dq_acc in the atomic mode, directly with `deterministic`).
template <typename T, int D, bool Dropout> int flash_bwd_launch_as(const P &p, int deterministic, cudaStream_t stream) {
    using Tr = FlashBwdTraits<D>;
    const size_t smem_kv = flash_bwd_dkdv_smem<D>();
    cudaError_t err =
        cudaFuncSetAttribute(flash_bwd_dkdv_kernel<T, D, Dropout>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv);
    if (err != cudaSuccess) return err;
    const int64_t key_tiles = (p.S + Tr::kBc - 1) / Tr::kBc;
    flash_bwd_dkdv_kernel<T, D, Dropout>
        <<<dim3((unsigned)(key_tiles * Tr::kSlices * p.B * p.Hkv)), Tr::kThreads, smem_kv, stream>>>(p);
    if (deterministic) {
        const size_t smem_q = flash_bwd_dq_smem<D>();
        err = cudaFuncSetAttribute(flash_bwd_dq_kernel<T, D, Dropout>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q);
        if (err != cudaSuccess) return err;
        const int64_t q_tiles = (p.L + Tr::kBrQ - 1) / Tr::kBrQ;
        flash_bwd_dq_kernel<T, D, Dropout>
            <<<dim3((unsigned)(q_tiles * Tr::kSlices * p.B * p.H)), Tr::kThreads, smem_q, stream>>>(p);
    }
    return cudaGetLastError();
}

// Calls with dropout take the instances with its code, the others those without it (fewer registers
// and no per-element test), as the forward's.
template <typename T, int D> int flash_bwd_launch(const P &p, int deterministic, cudaStream_t stream) {
    return p.dropout ? flash_bwd_launch_as<T, D, true>(p, deterministic, stream)
                     : flash_bwd_launch_as<T, D, false>(p, deterministic, stream);
}

} // namespace attn_cuda

#endif

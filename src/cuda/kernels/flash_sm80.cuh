// flash_sm80.cuh - the tensor-core SDPA forward (FlashAttention-2's algorithm on mma.sync, sm_80+):
// one block per 128 query rows of one (b, h), warps of 16 or 32 rows (flash_traits.cuh); keys and values stream
// through shared memory in tiles of Bc rows (cp.async, two stages: the next tile loads while this
// one is computed); per tile each warp computes S = Q K^T on tensor cores, applies the score rule
// where the tile needs it (bounds, masks, ALiBi, soft cap: common.cuh), updates its rows' running
// max and sum in registers (online softmax, exp2 domain), drops weights by the Philox mask when
// dropout is on, and accumulates O += P V on tensor cores.
// The output goes through shared memory to 16-byte stores; lse is written per row.
//
// Preconditions (checked by plan.c): q, k, v, out of type T (bf16 or f16), head_dim = head_dim_v =
// D, unit stride along D, 16-byte aligned rows; any batch/head/row strides, GQA, packed batches.
//
// Shared memory: rows padded by 8 elements (16 bytes), so the 8 row addresses of an ldmatrix fall
// in 8 different bank groups (no conflicts) for every D here.
#ifndef ATTN_CUDA_FLASH_SM80_CUH
#define ATTN_CUDA_FLASH_SM80_CUH

#include <cuda_runtime.h>

#include "common.cuh"
#include "flash_softmax.cuh"
#include "flash_traits.cuh"
#include "mma.cuh"

namespace attn_cuda {

// Dropout: whether the instance holds the Philox dropout code (run when p.dropout is set); the
// instance without it keeps the generator's state out of its registers. Wide: the 4-warp form of
// flash_traits.cuh, for calls with the bounds alone (no score rule per element) and no dropout.
template <typename T, int D, bool Dropout, bool Wide>
__global__ void __launch_bounds__(FlashTraits<D, Wide>::kThreads, FlashTraits<D, Wide>::kMinBlocks)
    flash_fwd_kernel(const P p) {
    static_assert(!(Wide && Dropout), "the wide form runs calls without dropout");
    using Tr = FlashTraits<D, Wide>;
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, ST = Tr::kStages, NTH = Tr::kThreads, MW = Tr::kMW;
    constexpr int WR = 16 * MW;     // query rows a warp
    constexpr int LD = D + 8;       // shared row pitch (elements)
    constexpr int NT = Bc / 8;      // n-tiles of S per m-tile (8 keys each)
    constexpr int KD = D / 16;      // k-steps of Q K^T
    constexpr int NO = D / 8;       // n-tiles of O (8 dims each)
    constexpr int KB = Bc / 16;     // k-steps of P V
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sQ = reinterpret_cast<T *>(smem_raw);   // (Br, LD)
    T *sK = sQ + Br * LD;                      // (ST, Bc, LD)
    T *sV = sK + ST * Bc * LD;                 // (ST, Bc, LD)

    // Block -> (query tile, b, h) and the key tiles it visits (flash_softmax.cuh)
    const QueryTile qt = query_tile<Br, Bc>(p);
    if (qt.empty) return; // whole block
    const Seq &s = qt.s;
    const int64_t b = qt.b, h = qt.h, hk = qt.hk, i0 = qt.i0;
    const int64_t n_begin = qt.n_begin, full_lo = qt.full_lo, full_hi = qt.full_hi;
    const int n_tiles = qt.n_tiles;
    const bool elementwise = !Wide && has_elementwise(p);
    const float scale_log2 = p.scale * kLog2e;
    // A positive scale multiplies each weight's exponent (one FMA with the max) instead of each score;
    // pre_scale multiplies the scores of tiles that cross the bounds, fs the exponent.
    const bool fold = !elementwise && scale_log2 > 0.0f;
    const float pre_scale = fold ? 1.0f : scale_log2, fs = fold ? scale_log2 : 1.0f;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
    const int64_t iw = i0 + warp * WR; // the warp's first row; m-tile m holds rows iw + 16 m ..
    const T *gq = static_cast<const T *>(p.q), *gk = static_cast<const T *>(p.k), *gv = static_cast<const T *>(p.v);

    // ---- loads (16-byte chunks, every thread its own; rows from the (b, h) bases) ----
    const int64_t kb = kv_base(p, p.k_stride, s, b, hk), vb = kv_base(p, p.v_stride, s, b, hk);
    cp_async_tile_strided<Br, D, NTH, LD>(sQ, gq + q_base(p, s, b, h) + i0 * p.q_stride[2], p.q_stride[2], s.L - i0, tid);
    auto load_kv = [&](int64_t tile, int stage) { // rows past the sequence are zero-filled, never read
        cp_async_kv_tiles<Bc, D, NTH, LD>(sK + stage * Bc * LD, sV + stage * Bc * LD, gk, gv, p, kb, vb, s, b, tile * Bc, tid);
    };
#pragma unroll
    for (int st = 0; st < ST - 1; st++) {
        if (st < n_tiles) load_kv(n_begin + st, st);
        cp_async_commit(); // group st (group 0 also holds Q)
    }

    float oacc[MW][NO][4];
#pragma unroll
    for (int m = 0; m < MW; m++)
#pragma unroll
        for (int no = 0; no < NO; no++) oacc[m][no][0] = oacc[m][no][1] = oacc[m][no][2] = oacc[m][no][3] = 0.0f;
    float row_m[MW][2], row_l[MW][2]; // rows g and g + 8 of each m-tile
#pragma unroll
    for (int m = 0; m < MW; m++) row_m[m][0] = row_m[m][1] = -CUDART_INF_F, row_l[m][0] = row_l[m][1] = 0.0f;
    uint32_t qf[Tr::kQInRegs ? KD : 1][MW][4];
    const T *q_s = sQ + warp * WR * LD;

    for (int t = 0; t < n_tiles; t++) {
        const int pre = t + ST - 1;
        if (pre < n_tiles) load_kv(n_begin + pre, pre % ST);
        cp_async_commit();
        cp_async_wait<ST - 1>(); // tile t (and Q) have landed for this thread ...
        __syncthreads();         // ... and for every thread
        const T *k_s = sK + (t % ST) * Bc * LD, *v_s = sV + (t % ST) * Bc * LD;
        if (Tr::kQInRegs && t == 0) {
#pragma unroll
            for (int kk = 0; kk < (Tr::kQInRegs ? KD : 1); kk++)
#pragma unroll
                for (int m = 0; m < MW; m++) ldsm_a(qf[kk][m], q_s, LD, m * 16, kk * 16, lane);
        }

        // S = Q K^T for this warp's rows and the tile's Bc keys
        float sacc[MW][NT][4];
#pragma unroll
        for (int m = 0; m < MW; m++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) sacc[m][nt][0] = sacc[m][nt][1] = sacc[m][nt][2] = sacc[m][nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            uint32_t a[MW][4];
#pragma unroll
            for (int m = 0; m < MW; m++) {
                if (Tr::kQInRegs) {
#pragma unroll
                    for (int e = 0; e < 4; e++) a[m][e] = qf[Tr::kQInRegs ? kk : 0][m][e];
                } else {
                    ldsm_a(a[m], q_s, LD, m * 16, kk * 16, lane);
                }
            }
            mma_rows<T, MW, NT / 2, false>(sacc, a, k_s, LD, kk * 16, lane);
        }

        // Scores (flash_softmax.cuh), then the online softmax leaves the tile's weights in sacc.
        const int64_t n0 = (n_begin + t) * Bc;
        const bool inside = n0 >= full_lo && n0 + Bc <= full_hi;
        tile_scores<MW, NT>(sacc, p, s, b, h, iw, n0, inside, elementwise, fold, scale_log2, pre_scale, g, c);
        tile_softmax<MW, NT, NO>(sacc, oacc, row_m, row_l, fs);

        // Dropout after the row sums: a dropped weight adds nothing to O (keep_scale at the end). The
        // keys 2c, 2c + 1 of an n-tile share one Philox call (the words of an aligned group of four).
        if (Dropout && p.dropout) { // a run-time test too: the compiler then keeps the code as a branch
#pragma unroll
            for (int m = 0; m < MW; m++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        bool k0, k1;
                        dropout_kept_pair(p, b * p.H + h, iw + m * 16 + g + r * 8, n0 + nt * 8 + 2 * c, k0, k1);
                        if (!k0) sacc[m][nt][2 * r] = 0.0f;
                        if (!k1) sacc[m][nt][2 * r + 1] = 0.0f;
                    }
        }

        // O += P V: the S accumulators of two n-tiles are one A fragment (rounded to T).
#pragma unroll
        for (int kb = 0; kb < KB; kb++) {
            uint32_t a[MW][4];
#pragma unroll
            for (int m = 0; m < MW; m++) acc_to_a<T>(a[m], sacc[m][2 * kb], sacc[m][2 * kb + 1]);
            mma_rows<T, MW, D / 16, true>(oacc, a, v_s, LD, kb * 16, lane);
        }
        __syncthreads(); // the stage read here is the one the next iteration's prefetch overwrites
    }
    cp_async_wait<0>(); // nothing in flight (Q when there were no tiles, empty groups)
    __syncthreads();

    // Normalise; lse; O through this warp's own Q rows in shared memory to 16-byte stores.
    store_rows<T, MW, NO, LD>(oacc, row_m, row_l, Dropout && p.dropout ? p.keep_scale : 1.0f, p, s, b, h, iw,
                              sQ + warp * WR * LD, lane);
}

template <typename T, int D, bool Dropout, bool Wide> int flash_launch_as(const P &p, int64_t row_blocks, cudaStream_t stream) {
    using Tr = FlashTraits<D, Wide>;
    static_assert(Tr::kBr == 128, "plan.c counts row blocks of 128 rows");
    const size_t smem = (size_t)(Tr::kBr + 2 * Tr::kStages * Tr::kBc) * (size_t)(D + 8) * sizeof(T);
    cudaError_t err =
        cudaFuncSetAttribute(flash_fwd_kernel<T, D, Dropout, Wide>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
    flash_fwd_kernel<T, D, Dropout, Wide><<<dim3((unsigned)(row_blocks * p.B * p.H)), Tr::kThreads, smem, stream>>>(p);
    return cudaGetLastError();
}

// Calls with dropout take the instance with its code, the others the one without it (fewer
// registers: docs/cuda.md); at D = 32, 64 and 128, calls with the bounds alone and no dropout take
// the wide form (flash_traits.cuh). D = 256 has one kernel for all (the instance without dropout
// spilled on sm_80).
template <typename T, int D> int flash_launch(const P &p, int64_t row_blocks, cudaStream_t stream) {
    if constexpr (D == 256) {
        return flash_launch_as<T, D, true, false>(p, row_blocks, stream);
    } else {
        if (p.dropout) return flash_launch_as<T, D, true, false>(p, row_blocks, stream);
        if constexpr (kFlashWide<D>) {
            if (!attn__cuda_elementwise(&p)) return flash_launch_as<T, D, false, true>(p, row_blocks, stream);
        }
        return flash_launch_as<T, D, false, false>(p, row_blocks, stream);
    }
}

} // namespace attn_cuda

#endif

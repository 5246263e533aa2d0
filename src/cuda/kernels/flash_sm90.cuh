// flash_sm90.cuh - the Hopper SDPA forward (sm_90a): FlashAttention-2's algorithm with the products
// on warpgroup MMA (wgmma.cuh). One block per 128 query rows of one (b, h): two warpgroups of 64
// rows (warp w holds rows 16 w ..). Q and the key and value tiles of Bc = 128 rows are copied by
// cp.async into 128-byte-swizzled shared memory (two stages: the next tile loads while this one is
// computed); per tile each warpgroup computes S = Q K^T with A and B from shared memory (no
// ldmatrix: the tensor cores read K once for all 64 rows), applies the bounds and the online
// softmax of flash_softmax.cuh to its accumulators, and accumulates O += P V with P from registers
// and V from shared memory (transposed operand). The epilogue is the sm_80 kernel's.
//
// Calls it takes (plan.c): q, k, v, out all bf16 or all f16, D = Dv of 64 or 128, unit stride along
// D and 16-byte aligned rows, the bounds alone (no mask, key padding mask, ALiBi or soft cap), no
// dropout, keys in sequence order (no page table); plain and packed batches, GQA, causal both ways
// and windows. Shared memory: (128 + 2 * 2 * 128) * D * 2 bytes and 1024 for the alignment.
#ifndef ATTN_CUDA_FLASH_SM90_CUH
#define ATTN_CUDA_FLASH_SM90_CUH

#include <cuda_runtime.h>

#include "common.cuh"
#include "flash_softmax.cuh"
#include "wgmma.cuh"

namespace attn_cuda {

struct FlashSm90Tile {
    static constexpr int kWarpGroups = 2, kThreads = 128 * kWarpGroups, kBr = 64 * kWarpGroups, kBc = 128, kStages = 2;
};

template <typename T, int D>
__global__ void __launch_bounds__(FlashSm90Tile::kThreads, 1) flash_fwd_sm90_kernel(const P p) {
#if ATTN_CU_WGMMA
    static_assert(D == 64 || D == 128, "flash_fwd_sm90_kernel: head dims 64 and 128");
    using Tr = FlashSm90Tile;
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, ST = Tr::kStages, NTH = Tr::kThreads;
    constexpr int NT = Bc / 8;   // n-tiles of S (8 keys each)
    constexpr int KD = D / 16;   // k-steps of Q K^T
    constexpr int NO = D / 8;    // n-tiles of O (8 dims each)
    constexpr int KB = Bc / 16;  // k-steps of P V
    constexpr int LDO = D + 8;   // the epilogue's row pitch
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // the swizzle's 1024-byte period starts on a 1024-byte boundary
    T *sQ = reinterpret_cast<T *>(smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u)); // Br x D, swizzled
    T *sK = sQ + Br * D;                                                                            // (ST, Bc x D)
    T *sV = sK + ST * Bc * D;                                                                       // (ST, Bc x D)

    // Block -> (query tile, b, h) and the key tiles it visits (flash_softmax.cuh)
    const QueryTile qt = query_tile<Br, Bc>(p);
    if (qt.empty) return; // whole block
    const Seq &s = qt.s;
    const float scale_log2 = p.scale * kLog2e;
    const bool fold = scale_log2 > 0.0f;
    const float pre_scale = fold ? 1.0f : scale_log2, fs = fold ? scale_log2 : 1.0f;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4, wg = warp / 4;
    const int64_t iw = qt.i0 + warp * 16; // the warp's first row
    const T *gq = static_cast<const T *>(p.q), *gk = static_cast<const T *>(p.k), *gv = static_cast<const T *>(p.v);

    const int64_t kb = kv_base(p, p.k_stride, s, qt.b, qt.hk), vb = kv_base(p, p.v_stride, s, qt.b, qt.hk);
    const T *q_rows = gq + q_base(p, s, qt.b, qt.h) + qt.i0 * p.q_stride[2];
    cp_async_rows<Br, D, NTH, Sw128Rows<Br>>(sQ, q_rows, p.q_stride[2], s.L - qt.i0, tid);
    auto load_kv = [&](int64_t tile, int stage) { // rows past the sequence are zero-filled, never read
        const int64_t n0 = tile * Bc;
        cp_async_rows<Bc, D, NTH, Sw128Rows<Bc>>(sK + stage * Bc * D, gk + kb + n0 * p.k_stride[2], p.k_stride[2], s.S - n0, tid);
        cp_async_rows<Bc, D, NTH, Sw128Rows<Bc>>(sV + stage * Bc * D, gv + vb + n0 * p.v_stride[2], p.v_stride[2], s.S - n0, tid);
    };
    if (qt.n_tiles > 0) load_kv(qt.n_begin, 0);
    cp_async_commit(); // group 0: Q and the first tile

    float oacc[1][NO][4], sacc[1][NT][4];
#pragma unroll
    for (int no = 0; no < NO; no++) oacc[0][no][0] = oacc[0][no][1] = oacc[0][no][2] = oacc[0][no][3] = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) sacc[0][nt][0] = sacc[0][nt][1] = sacc[0][nt][2] = sacc[0][nt][3] = 0.0f;
    float(&od)[NO * 4] = *reinterpret_cast<float(*)[NO * 4]>(&oacc[0][0][0]);
    float(&sd)[NT * 4] = *reinterpret_cast<float(*)[NT * 4]>(&sacc[0][0][0]);
    float row_m[1][2] = {{-CUDART_INF_F, -CUDART_INF_F}}, row_l[1][2] = {{0.0f, 0.0f}};
    const uint32_t q_at = smem_u32(sQ); // the warpgroup's rows: 64 wg .. in each panel

    for (int t = 0; t < qt.n_tiles; t++) {
        if (t + 1 < qt.n_tiles) load_kv(qt.n_begin + t + 1, (t + 1) % ST);
        cp_async_commit();
        cp_async_wait<1>();  // tile t (and Q) have landed for this thread ...
        fence_proxy_async(); // ... visible to the tensor cores' reads ...
        __syncthreads();     // ... and for every thread
        const uint32_t k_at = smem_u32(sK + (t % ST) * Bc * D), v_at = smem_u32(sV + (t % ST) * Bc * D);

        // S = Q K^T: A (Q) and B (K) K-major
        wgmma_fence_regs(sd);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            wgmma_ss<T, Bc>(sd, kmajor_desc(q_at, Br, 64 * wg, kk), kmajor_desc(k_at, Bc, 0, kk), kk > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_regs(sd);

        const int64_t n0 = (qt.n_begin + t) * Bc;
        const bool inside = n0 >= qt.full_lo && n0 + Bc <= qt.full_hi;
        tile_scores<1, NT>(sacc, p, s, qt.b, qt.h, iw, n0, inside, false, fold, scale_log2, pre_scale, g, c);
        tile_softmax<1, NT, NO>(sacc, oacc, row_m, row_l, fs);

        // O += P V: P (rounded to T) from registers, V MN-major
        uint32_t pa[KB][4];
#pragma unroll
        for (int k = 0; k < KB; k++) acc_to_a<T>(pa[k], sacc[0][2 * k], sacc[0][2 * k + 1]);
        wgmma_fence_regs(pa);
        wgmma_fence_regs(od);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < KB; k++) wgmma_rs_tb<T, D>(od, pa[k], mnmajor_desc(v_at, Bc, k));
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_regs(od);
        __syncthreads(); // the stage read here is the one the next iteration's copy overwrites
    }
    cp_async_wait<0>(); // nothing in flight (Q when there were no tiles)
    __syncthreads();

    // Normalise; lse; O through this warp's 16 rows of the K stages' memory to 16-byte stores.
    store_rows<T, 1, NO, LDO>(oacc, row_m, row_l, 1.0f, p, s, qt.b, qt.h, iw, sK + warp * 16 * LDO, lane);
#else
    __trap(); // no sm_90a code loaded: plan.c never launches it so (attn__cuda_device.flash_sm90)
#endif
}

template <typename T, int D> size_t flash_sm90_smem() {
    using Tr = FlashSm90Tile;
    return (size_t)(Tr::kBr + 2 * Tr::kStages * Tr::kBc) * D * sizeof(T) + 1024;
}

template <typename T, int D> int flash_sm90_launch(const P &p, int64_t row_blocks, cudaStream_t stream) {
    static_assert(FlashSm90Tile::kBr == 128, "plan.c counts row blocks of 128 rows");
    const size_t smem = flash_sm90_smem<T, D>();
    cudaError_t err = cudaFuncSetAttribute(flash_fwd_sm90_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
    flash_fwd_sm90_kernel<T, D><<<dim3((unsigned)(row_blocks * p.B * p.H)), FlashSm90Tile::kThreads, smem, stream>>>(p);
    return cudaGetLastError();
}

} // namespace attn_cuda

#endif

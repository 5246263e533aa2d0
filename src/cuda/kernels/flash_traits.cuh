// flash_traits.cuh - tile shapes of the tensor-core forward per head dim, Br = 128 query rows a
// block in both forms:
//  - FlashTraits<D, false>: 8 warps of one m-tile (16 rows) each; every call can run it (masks,
//    ALiBi, soft cap, dropout: the whole score rule in one instance);
//  - FlashTraits<D, true> ("wide", D = 32, 64 and 128: kFlashWide): 4 warps of two m-tiles (32 rows)
//    each, for calls with the bounds alone and no dropout. A warp's two m-tiles share each K and V
//    fragment it loads from shared memory (ldmatrix), which halves those bytes per tensor-core
//    product (FlashAttention-2's 4 warps of 32 rows); two blocks an SM keep 8 warps an SM. At
//    D = 128, O alone takes 128 registers a thread: Q is read from shared memory and the key tiles
//    are 32 rows (S 32 registers; with 64, 96 bytes of spills). On an H100 the wide form ran D = 64
//    11-17% and D = 128 16-20% faster than the 8-warp form; D = 96 keeps the 8-warp form
//    (docs/cuda-tuning.md).
// Key tiles of Bc rows in two shared-memory stages, Q in registers when it fits. Registers per
// thread: O is kMW * D/2 floats, S is kMW * Bc/2 floats, Q fragments kMW * D/4 words in registers;
// the shapes keep the sum, with the addressing, near 255 (ptxas -v: docs/cuda.md). Shared memory:
// (Br + 2 * 2 * Bc) * (D + 8) * 2 bytes; plan.c keeps a copy of this table for the host.
#ifndef ATTN_CUDA_FLASH_TRAITS_CUH
#define ATTN_CUDA_FLASH_TRAITS_CUH

namespace attn_cuda {

template <int Warps, int MW, int Bc_, bool QInRegs> struct FlashTile {
    static constexpr int kWarps = Warps, kMW = MW, kThreads = 32 * kWarps, kBr = 16 * kMW * kWarps, kBc = Bc_,
                         kStages = 2, kMinBlocks = kWarps == 4 ? 2 : 1;
    static constexpr bool kQInRegs = QInRegs;
};
template <int D, bool Wide> struct FlashTraits;
template <> struct FlashTraits<32, false> : FlashTile<8, 1, 128, true> {};
template <> struct FlashTraits<64, false> : FlashTile<8, 1, 128, true> {};
template <> struct FlashTraits<96, false> : FlashTile<8, 1, 64, true> {};
template <> struct FlashTraits<128, false> : FlashTile<8, 1, 64, true> {};
template <> struct FlashTraits<256, false> : FlashTile<8, 1, 32, false> {};
template <> struct FlashTraits<32, true> : FlashTile<4, 2, 64, true> {};
template <> struct FlashTraits<64, true> : FlashTile<4, 2, 64, true> {};
template <> struct FlashTraits<128, true> : FlashTile<4, 2, 32, false> {};
// The head dims with a wide form.
template <int D> constexpr bool kFlashWide = D == 32 || D == 64 || D == 128;

// The tensor-core backward (flash_bwd_sm80.cuh), 4 warps. dK/dV kernel: a block per key tile of
// kBc = 64 rows (16 per warp), query tiles of kBr rows (64 for D = 32, else 32); per thread dK and dV
// are kDs floats, S^T and dP^T kBr / 4. Deterministic dQ kernel: a block per kBrQ = 64 query rows (16
// per warp), key tiles of kBcQ rows (64, 32 at D = 256) in two stages; per thread dQ is kDs / 2
// floats, S and dP kBcQ / 4. kBr = 64 spilled at D = 64 and 128 (8 and 168 bytes, ptxas), 32 does
// not. kDs: the columns of dK, dV and dQ one block accumulates, the whole head dim up to 128; at
// D = 256 (256 accumulators a thread whole) kSlices = 2 blocks share a tile, each accumulating 128
// columns and each computing S and dP over the whole head dim (S and dP twice: 14 products of the
// tile's size where one block would do 10). plan.c keeps a copy of this table for the host.
template <int D> struct FlashBwdTraits {
    static_assert(D == 32 || D == 64 || D == 96 || D == 128 || D == 256, "flash backward head dims");
    static constexpr int kWarps = 4, kThreads = 32 * kWarps, kBc = 64, kBr = D <= 32 ? 64 : 32, kBrQ = 16 * kWarps,
                         kBcQ = D <= 128 ? 64 : 32, kStagesQ = 2, kDs = D <= 128 ? D : 128, kSlices = D / kDs;
};

} // namespace attn_cuda

#endif

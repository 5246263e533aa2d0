// flash_traits.cuh - tile shapes of the tensor-core forward per head dim: 8 warps of 16 query rows
// (Br = 128), key tiles of Bc rows in two shared-memory stages, Q kept in registers when it fits.
// Registers per thread: O is D/2 floats, S is Bc/2 floats, Q fragments D/4 words; Bc shrinks as D
// grows so the sum stays under 255 without spills (ptxas -v: docs/cuda-notes.md). Shared memory:
// (Br + 2 * 2 * Bc) * (D + 8) * 2 bytes; plan.c keeps a copy of this table for the host.
#ifndef ATTN_CUDA_FLASH_TRAITS_CUH
#define ATTN_CUDA_FLASH_TRAITS_CUH

namespace attn_cuda {

template <int D> struct FlashTraits;
template <int Bc_, bool QInRegs> struct FlashTile {
    static constexpr int kWarps = 8, kThreads = 32 * kWarps, kBr = 16 * kWarps, kBc = Bc_, kStages = 2;
    static constexpr bool kQInRegs = QInRegs;
};
template <> struct FlashTraits<32> : FlashTile<128, true> {};
template <> struct FlashTraits<64> : FlashTile<128, true> {};
template <> struct FlashTraits<96> : FlashTile<64, true> {};
template <> struct FlashTraits<128> : FlashTile<64, true> {};
template <> struct FlashTraits<256> : FlashTile<32, false> {};

} // namespace attn_cuda

#endif

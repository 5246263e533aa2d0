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

// The tensor-core backward (flash_bwd_sm80.cuh), 4 warps. dK/dV kernel: a block per key tile of
// kBc = 64 rows (16 per warp), query tiles of kBr rows (64 for D = 32, else 32); per thread dK and dV
// are D floats, S^T and dP^T kBr / 4. Deterministic dQ kernel: a block per kBrQ = 64 query rows (16
// per warp), key tiles of kBcQ = 64 rows in two stages; per thread dQ is D / 2 floats, S and dP
// kBcQ / 4. kBr = 64 spilled at D = 64 and 128 (8 and 168 bytes, ptxas), 32 does not. D = 256 would
// hold 256 accumulators a thread in the dK/dV kernel: it runs on the simple backward. plan.c keeps
// a copy of this table for the host.
template <int D> struct FlashBwdTraits {
    static_assert(D == 32 || D == 64 || D == 96 || D == 128, "flash backward head dims");
    static constexpr int kWarps = 4, kThreads = 32 * kWarps, kBc = 64, kBr = D <= 32 ? 64 : 32, kBrQ = 16 * kWarps, kBcQ = 64,
                         kStagesQ = 2;
};

} // namespace attn_cuda

#endif

// wgmma.cuh - the sm_90a instructions of the Hopper forward (flash_sm90.cuh), one inline-asm wrapper
// each: warpgroup matrix multiply-accumulate (wgmma.mma_async, bf16 or f16 operands, float32
// accumulators) with B, and A when it is not in registers, read from shared memory through matrix
// descriptors, and the fences and waits that order it.
//
// A warpgroup is four consecutive warps (128 threads); wgmma m64nNk16 multiplies a 64 x 16 A by a
// 16 x N B into the 64 x N accumulator D, warp w of the group holding rows 16 w .. 16 w + 15 in the
// layout of mma.m16n8 (mma.cuh), repeated per 8 columns: d[4 nt + e] is row g + 8 (e / 2), column
// 8 nt + 2 c + e % 2 (g = lane / 4, c = lane % 4); an A in registers is mma.m16n8k16's A fragment.
//
// Shared-memory operands use the 128-byte swizzle: a tile is stored in panels of 64 columns (128
// bytes of a row), each panel rows x 128 bytes on a 1024-byte boundary, and the 16-byte chunk k of
// row r at chunk position k ^ (r % 8) (sw128_offset). The descriptor (PTX ISA, "Matrix Descriptor
// Format") holds the start address, the leading- and stride-dimension byte offsets (each / 16) and
// the swizzle mode (1 = 128 bytes, bits 62-63). For an operand stored K-major (rows of the M or N
// dimension, K along the row: Q and K in Q K^T) the stride offset is 1024 (eight rows) and a step of
// 16 along K adds 32 bytes to the start inside a panel; for one stored MN-major (V in P V: rows
// along K, N along the row; imm-trans-b = 1) the leading offset steps from one 64-column panel to
// the next and the stride offset (1024) from eight K rows to the next eight.
//
// Every operand in shared memory written by ordinary stores or cp.async must be made visible to the
// tensor cores' asynchronous proxy (fence_proxy_async) before the barrier that precedes the wgmma;
// registers an mma_async reads or writes must not be touched until wgmma_wait says it is done
// (wgmma_fence_regs keeps the compiler from moving accesses across).
#ifndef ATTN_CUDA_WGMMA_CUH
#define ATTN_CUDA_WGMMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "mma.cuh"

// The sm_90a instructions exist only in the sm_90a compilation; elsewhere the wrappers are empty and
// the kernels using them are never launched (plan.c takes them only where attn__cuda_device.flash_sm90).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATTN_CU_WGMMA 1
#else
#define ATTN_CU_WGMMA 0
#endif

namespace attn_cuda {

// Element offset of the 8 elements (16 bytes) at row r, column col (a multiple of 8) of a tile of
// ROWS rows stored in 128-byte-swizzled panels of 64 2-byte columns.
template <int ROWS> __device__ __forceinline__ int sw128_offset(int r, int col) {
    return (col / 64) * ROWS * 64 + r * 64 + (((col % 64) / 8) ^ (r % 8)) * 8;
}

// The layout of such a tile for mma.cuh's row copies (cp_async_rows: rows of one thread 8k apart keep
// their chunk positions).
template <int ROWS> struct Sw128Rows {
    static constexpr int kPeriod = 8, kStep = 64; // rows 8 apart: the same chunk positions
    template <typename T> __device__ __forceinline__ static T *at(T *tile, int r, int col) { return tile + sw128_offset<ROWS>(r, col); }
};

// A 128-byte-swizzle descriptor of the operand starting at shared address addr (bytes).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lead_bytes, uint32_t stride_bytes) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)((lead_bytes >> 4) & 0x3FFFu) << 16) |
           ((uint64_t)((stride_bytes >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

// The descriptor of k-step kk (columns 16 kk ..) of an operand stored K-major: rows r0 .. of a tile of
// `rows` rows in 64-column panels at shared address tile (bytes); r0 a multiple of 8.
__device__ __forceinline__ uint64_t kmajor_desc(uint32_t tile, int rows, int r0, int kk) {
    return sw128_desc(tile + (uint32_t)((kk / 4) * rows * 128 + r0 * 128 + (kk % 4) * 32), 16, 1024);
}
// The descriptor of k-step kk (rows 16 kk ..) of an operand stored MN-major: a tile of `rows` rows
// along K, its N columns in 64-column panels, at shared address tile.
__device__ __forceinline__ uint64_t mnmajor_desc(uint32_t tile, int rows, int kk) {
    return sw128_desc(tile + (uint32_t)(kk * 16 * 128), (uint32_t)rows * 128, 1024);
}

__device__ __forceinline__ void fence_proxy_async() {
#if ATTN_CU_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Before the first mma_async of a batch: the registers it uses hold what earlier instructions wrote.
__device__ __forceinline__ void wgmma_fence() {
#if ATTN_CU_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if ATTN_CU_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed groups of this warpgroup's mma_async are in flight.
template <int N> __device__ __forceinline__ void wgmma_wait() {
#if ATTN_CU_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Orders the compiler's accesses to the n registers of r around the asynchronous instructions.
template <int n> __device__ __forceinline__ void wgmma_fence_regs(float (&r)[n]) {
#pragma unroll
    for (int i = 0; i < n; i++) asm volatile("" : "+f"(r[i])::"memory");
}
// The same for A fragments in registers (m k-steps of 4 words): written before the wgmma_fence.
template <int m> __device__ __forceinline__ void wgmma_fence_regs(uint32_t (&r)[m][4]) {
#pragma unroll
    for (int i = 0; i < m; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) asm volatile("" : "+r"(r[i][j])::"memory");
}
// The asm statement of a wrapper, or nothing outside the sm_90a compilation.
#if ATTN_CU_WGMMA
#define ATTN_WG_ASM(...) asm volatile(__VA_ARGS__)
#else
#define ATTN_WG_ASM(...) ((void)0)
#endif
// The operands of the accumulators d[0 .. n) of a 64 x 2n product, and their place in the text.
#define ATTN_WG_ACC32 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
    "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), \
    "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
    "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define ATTN_WG_ACC64 ATTN_WG_ACC32, \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define ATTN_WG_TEXT32 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define ATTN_WG_TEXT64 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, " \
    "%39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, " \
    "%58, %59, %60, %61, %62, %63}"

// For element type CT (PTX name PT) and N = 2 NR columns (the other operands from %NR on, as text):
//  - wgmma_ss_n<N>: d (64 x N) = A B (+ d when accumulate), A and B from shared memory (descriptors);
//  - wgmma_rs_n<N>_tb: d (64 x N) += A B, A in registers (mma.m16n8k16's fragment), B from shared
//    memory stored MN-major (imm-trans-b = 1).
// The element type is a tag argument (a null pointer of CT).
#define ATTN_WGMMA_DEFS(N, NR, CT, PT, R0, R1, R2, R3, R4, R5)                                                          \
    __device__ __forceinline__ void wgmma_ss_n##N(float (&d)[NR], uint64_t desc_a, uint64_t desc_b, int accumulate,     \
                                                  CT *) {                                                               \
        ATTN_WG_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, " R2 ", 0;\n"                                                     \
                    "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PT "." PT " " ATTN_WG_TEXT##NR                    \
                    ", " R0 ", " R1 ", p, 1, 1, 0, 0;\n}\n"                                                             \
                    : ATTN_WG_ACC##NR                                                                                   \
                    : "l"(desc_a), "l"(desc_b), "r"(accumulate));                                                       \
    }                                                                                                                   \
    __device__ __forceinline__ void wgmma_rs_n##N##_tb(float (&d)[NR], const uint32_t (&a)[4], uint64_t desc_b, CT *) { \
        ATTN_WG_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, " R5 ", 0;\n"                                                     \
                    "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PT "." PT " " ATTN_WG_TEXT##NR                    \
                    ", {" R0 ", " R1 ", " R2 ", " R3 "}, " R4 ", p, 1, 1, 1;\n}\n"                                      \
                    : ATTN_WG_ACC##NR                                                                                   \
                    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));                                 \
    }
ATTN_WGMMA_DEFS(64, 32, __nv_bfloat16, "bf16", "%32", "%33", "%34", "%35", "%36", "%37")
ATTN_WGMMA_DEFS(64, 32, __half, "f16", "%32", "%33", "%34", "%35", "%36", "%37")
ATTN_WGMMA_DEFS(128, 64, __nv_bfloat16, "bf16", "%64", "%65", "%66", "%67", "%68", "%69")
ATTN_WGMMA_DEFS(128, 64, __half, "f16", "%64", "%65", "%66", "%67", "%68", "%69")
#undef ATTN_WGMMA_DEFS

// d (64 x N) = A B (+ d) with A and B in shared memory; d (64 x N) += A B with A in registers and B
// stored MN-major: N = 64 or 128, T's instruction.
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    static_assert(N == 64 || N == 128, "wgmma_ss: N");
    if constexpr (N == 64) wgmma_ss_n64(d, desc_a, desc_b, accumulate, static_cast<T *>(nullptr));
    else wgmma_ss_n128(d, desc_a, desc_b, accumulate, static_cast<T *>(nullptr));
}
template <typename T, int N> __device__ __forceinline__ void wgmma_rs_tb(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) {
    static_assert(N == 64 || N == 128, "wgmma_rs_tb: N");
    if constexpr (N == 64) wgmma_rs_n64_tb(d, a, desc_b, static_cast<T *>(nullptr));
    else wgmma_rs_n128_tb(d, a, desc_b, static_cast<T *>(nullptr));
}

} // namespace attn_cuda

#endif

// mma.cuh - the sm_80 instructions the tensor-core kernels use, one inline-asm wrapper each:
// cp.async (16- and 4-byte global -> shared copies, zero-filled when the source is out of range, and
// a tile of rows copied by a block in 16-byte chunks),
// ldmatrix (8x8 b16 tiles from shared memory into mma fragments, plain and transposed) and
// mma.sync m16n8k16 with float32 accumulators (bf16 and f16 operands).
//
// Fragment layouts of mma.m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16"), with
// g = lane / 4 and c = lane % 4:
//   A (16x16, row-major) a0: (g, 2c..2c+1)  a1: (g+8, 2c..)  a2: (g, 2c+8..)  a3: (g+8, 2c+8..)
//   B (16x8, "col")      b0: (k 2c..2c+1, n g)  b1: (k 2c+8..2c+9, n g)
//   C (16x8, float)      c0, c1: (g, 2c), (g, 2c+1)   c2, c3: (g+8, 2c), (g+8, 2c+1)
// ldmatrix.x4: lanes 8m..8m+7 give the row addresses of matrix m; register m of lane t receives
// (row t/4, columns 2(t%4), 2(t%4)+1) of matrix m, or with .trans (rows 2(t%4), 2(t%4)+1, column t/4).
#ifndef ATTN_CUDA_MMA_CUH
#define ATTN_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace attn_cuda {

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16 bytes from global to shared; with valid == false nothing is read and the 16 bytes are zeroed.
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(n) : "memory");
}
// 4 bytes global -> shared (through L1); with valid == false nothing is read and the 4 bytes are zeroed.
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem, bool valid) {
    const int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(n) : "memory");
}
// cp.async of a tile of ROWS rows of D elements (T) into shared memory at a row pitch of LD elements
// by the NTH threads of a block: thread tid copies the 16-byte chunks ch = tid + u NTH (tile row
// ch / (D / 8), column 8 (ch % (D / 8))), the loop over u unrolled. Tile row r is source row
// j = row0 + r, at src + at(j) elements; rows with j >= n_rows are zero-filled, nothing read.
template <int ROWS, int D, int NTH, int LD, typename T, typename At>
__device__ __forceinline__ void cp_async_tile(T *dst, const T *src, int64_t row0, int64_t n_rows, int tid, At at) {
    constexpr int CPR = D / 8, N = (ROWS * CPR + NTH - 1) / NTH;
#pragma unroll
    for (int u = 0; u < N; u++) {
        const int ch = tid + u * NTH;
        if (ROWS * CPR % NTH != 0 && ch >= ROWS * CPR) break;
        const int r = ch / CPR, col = ch % CPR * 8;
        const int64_t j = row0 + r;
        const bool ok = j < n_rows;
        cp_async16(dst + r * LD + col, src + (ok ? at(j) : 0) + col, ok);
    }
}
// Where a tile's rows lie in shared memory: Lay::at(tile, r, col) is the address of row r, column col
// (a multiple of 8), and row r + kPeriod k lies kPeriod k kStep elements after row r. PitchRows: rows LD
// elements apart (wgmma.cuh has the 128-byte-swizzled form).
template <int LD> struct PitchRows {
    static constexpr int kPeriod = 1, kStep = LD;
    template <typename T> __device__ __forceinline__ static T *at(T *tile, int r, int col) { return tile + r * LD + col; }
};
// cp.async of a tile of a strided tensor: tile row r at first + r * step (elements), rows r >= rows
// zero-filled, into the layout Lay, by NTH threads whose chunks each lie in one column (NTH a
// multiple of D / 8): thread tid copies rows tid / (D / 8) + u NTH / (D / 8), one address a tile
// and a constant step a chunk, and no per-row test in a whole tile (rows >= ROWS).
template <int ROWS, int D, int NTH, typename Lay, typename T>
__device__ __forceinline__ void cp_async_rows(T *dst, const T *first, int64_t step, int64_t rows, int tid) {
    constexpr int CPR = D / 8, N = ROWS * CPR / NTH, RS = NTH / CPR;
    static_assert(NTH % CPR == 0 && ROWS * CPR % NTH == 0, "each thread's chunks in one column");
    static_assert(RS % Lay::kPeriod == 0, "a thread's rows a whole number of the layout's periods apart");
    const int r0 = tid / CPR, col = tid % CPR * 8;
    const T *g = first + r0 * step + col;
    T *d = Lay::at(dst, r0, col);
    if (rows >= ROWS) {
#pragma unroll
        for (int u = 0; u < N; u++) cp_async16(d + u * RS * Lay::kStep, g + u * RS * step, true);
    } else {
#pragma unroll
        for (int u = 0; u < N; u++) {
            const bool ok = r0 + u * RS < rows;
            cp_async16(d + u * RS * Lay::kStep, ok ? g + u * RS * step : first, ok);
        }
    }
}
// The same at a row pitch of LD elements for any NTH (cp_async_tile's per-chunk form when the
// chunks do not fall in columns).
template <int ROWS, int D, int NTH, int LD, typename T>
__device__ __forceinline__ void cp_async_tile_strided(T *dst, const T *first, int64_t step, int64_t rows, int tid) {
    constexpr int CPR = D / 8;
    if constexpr (NTH % CPR == 0 && ROWS * CPR % NTH == 0) {
        cp_async_rows<ROWS, D, NTH, PitchRows<LD>>(dst, first, step, rows, tid);
    } else {
        cp_async_tile<ROWS, D, NTH, LD>(dst, first, 0, rows, tid, [&](int64_t r) { return r * step; });
    }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(smem)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(smem)));
}

// c += a * b for one 16x8x16 tile (T = __nv_bfloat16 or __half operands).
template <typename T> __device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to T and packed, lo in the low half (the first column of a fragment pair).
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// Fragments of 16 x 16 tiles of a shared-memory array of T with row pitch ld (elements), for the
// calling lane; each helper is one ldmatrix.x4:
//   ldsm_a:    A (rows m0.., columns k0..) of a row-major (m, k) array;
//   ldsm_a_km: A (rows m0.., columns k0..) of an array stored (k, m), i.e. of its transpose;
//   ldsm_b_nk: B for two n-tiles (n0.., n0 + 8..) over k0.. of an array stored (n, k) (K in Q K^T):
//              b[0], b[1] for the first n-tile, b[2], b[3] for the second;
//   ldsm_b_kn: the same of an array stored (k, n) (V in P V).
template <typename T> __device__ __forceinline__ void ldsm_a(uint32_t a[4], const T *s, int ld, int m0, int k0, int lane) {
    ldmatrix_x4(a, s + (m0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + k0 + (lane >> 4) * 8);
}
template <typename T> __device__ __forceinline__ void ldsm_a_km(uint32_t a[4], const T *s, int ld, int m0, int k0, int lane) {
    ldmatrix_x4_trans(a, s + (k0 + (lane & 7) + (lane >> 4) * 8) * ld + m0 + ((lane >> 3) & 1) * 8);
}
template <typename T> __device__ __forceinline__ void ldsm_b_nk(uint32_t b[4], const T *s, int ld, int n0, int k0, int lane) {
    ldmatrix_x4(b, s + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8);
}
template <typename T> __device__ __forceinline__ void ldsm_b_kn(uint32_t b[4], const T *s, int ld, int n0, int k0, int lane) {
    ldmatrix_x4_trans(b, s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8);
}

// Two float accumulator tiles (16 x 8: columns 0-7 in lo, 8-15 in hi) as one A fragment (16 x 16),
// rounded to T: how P and dS feed the next product without leaving registers.
template <typename T> __device__ __forceinline__ void acc_to_a(uint32_t a[4], const float lo[4], const float hi[4]) {
    a[0] = pack2<T>(lo[0], lo[1]), a[1] = pack2<T>(lo[2], lo[3]);
    a[2] = pack2<T>(hi[0], hi[1]), a[3] = pack2<T>(hi[2], hi[3]);
}

// acc[m][2 j], acc[m][2 j + 1] += a[m] times B's n-tiles 2 j, 2 j + 1 (j < NP) of an array stored
// (k, n) (kn = true) or (n, k), over the 16 k's from k0, for MW rows of 16 x 8 products sharing each
// B fragment: one ldmatrix for the MW tensor-core products of each n-tile.
template <typename T, int MW, int NP, bool kn, int NACC>
__device__ __forceinline__ void mma_rows(float (*acc)[NACC][4], const uint32_t (*a)[4], const T *s, int ld, int k0,
                                         int lane) {
#pragma unroll
    for (int j = 0; j < NP; j++) {
        uint32_t b[4];
        if (kn)
            ldsm_b_kn(b, s, ld, j * 16, k0, lane);
        else
            ldsm_b_nk(b, s, ld, j * 16, k0, lane);
#pragma unroll
        for (int m = 0; m < MW; m++) {
            mma16816<T>(acc[m][2 * j], a[m], b[0], b[1]);
            mma16816<T>(acc[m][2 * j + 1], a[m], b[2], b[3]);
        }
    }
}

// One row of them: acc[2 j], acc[2 j + 1] += a times B's n-tiles 2 j, 2 j + 1.
template <typename T, int NP, bool kn>
__device__ __forceinline__ void mma_row(float (*acc)[4], const uint32_t a[4], const T *s, int ld, int k0, int lane) {
    mma_rows<T, 1, NP, kn, 2 * NP>(reinterpret_cast<float (*)[2 * NP][4]>(acc), reinterpret_cast<const uint32_t (*)[4]>(a), s,
                                   ld, k0, lane);
}

} // namespace attn_cuda

#endif

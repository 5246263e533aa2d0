// quant_rows.h - what the Q8_0 / Q4_0 kernel files (quant_kernels_avx2.c, quant_kernels_avx512.c,
// quant_kernels_avx512bf16.c) share: the block helpers (quant_block.h) and the loops around their
// row kernels (the element type made a constant for each call; pv_rows four rows and a key tile at
// a time). Each file defines qk_rows_impl (q.k of float query rows) and pv_rows_impl (declared
// below) and wraps qk_rows_q and pv_rows_q in its entry points. Include after <immintrin.h> (or
// simd512.h) with F16C enabled.
#ifndef ATTN_CPU_X86_QUANT_ROWS_H
#define ATTN_CPU_X86_QUANT_ROWS_H

#include <stdbool.h>
#include <stdint.h>

#include "attn.h"
#include "cpu/cpu.h"
#include "cpu/x86/quant_block.h"
#include "half.h"

// The including file's kernels. qk_rows_impl: s[r s_r + j s_j] = q row r . key row j (rows <= 4 at a
// time inside) for nj keys of D elements, rows of ks_row elements. pv_rows_impl: four rows' (nr of
// them real) weights pp (advancing by ldp a key) times nj <= PV_KEYS value rows, added to o's rows
// (ldo apart), o scaled by alpha first when scale_o; prefetch: request the next tile's lines.
INLINE void qk_rows_impl(const attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const float *q, int rows,
                         float *s, int64_t s_r, int64_t s_j);
INLINE void pv_rows_impl(const attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pp,
                         int64_t ldp, const float *alpha, bool scale_o, int nr, bool prefetch, float *o, int64_t ldo);

#define PV_KEYS FLASH_BC // keys whose scaled weights pv_rows_impl holds at once

// cpu.h's qk_rows_q: the kernel instantiated for each element type.
INLINE void qk_rows_q(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const float *q, int rows, float *s,
                      int64_t s_r, int64_t s_j) { // q: the float rows (these tables have no prep_q)
    if (dt == ATTN_DTYPE_Q8_0) qk_rows_impl(ATTN_DTYPE_Q8_0, k, ks_row, nj, D, q, rows, s, s_r, s_j);
    else qk_rows_impl(ATTN_DTYPE_Q4_0, k, ks_row, nj, D, q, rows, s, s_r, s_j);
}

// cpu.h's pv_rows_q: four rows at a time, PV_KEYS keys at a time (the decode tiles have at most that
// many: one pass); the first pass over the keys scales o by alpha, the first rows' pass prefetches.
INLINE void pv_rows_q(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt, int64_t ldp,
                      const float *alpha, int rows, float *o, int64_t ldo) {
    for (int r0 = 0; r0 < rows; r0 += 4) {
        const int nr = rows - r0 < 4 ? rows - r0 : 4;
        for (int j0 = 0; j0 < nj; j0 += PV_KEYS) {
            const int n = nj - j0 < PV_KEYS ? nj - j0 : PV_KEYS;
            const void *vj = block_at(v, dt, (int64_t)j0 * vs_row);
            const float *pj = pt + (int64_t)j0 * ldp + r0;
            if (dt == ATTN_DTYPE_Q8_0)
                pv_rows_impl(ATTN_DTYPE_Q8_0, vj, vs_row, n, Dv, pj, ldp, alpha + r0, j0 == 0, nr, r0 == 0, o + (int64_t)r0 * ldo, ldo);
            else
                pv_rows_impl(ATTN_DTYPE_Q4_0, vj, vs_row, n, Dv, pj, ldp, alpha + r0, j0 == 0, nr, r0 == 0, o + (int64_t)r0 * ldo, ldo);
        }
    }
}

#endif

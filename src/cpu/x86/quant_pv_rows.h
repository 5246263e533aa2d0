// quant_pv_rows.h - the P V half of what the Q8_0 / Q4_0 kernel files share (quant_kernels_avx2.c,
// quant_kernels_avx512.c, quant_kernels_avx512bf16.c; quant_rows.h is the q.k half): the loop around
// their P V row kernel, four rows and a key tile at a time. Each file with P V defines pv_rows_impl
// (declared below) and wraps pv_rows_q in its entry point. Include after <immintrin.h> (or
// simd512.h) with F16C enabled.
#ifndef ATTN_CPU_X86_QUANT_PV_ROWS_H
#define ATTN_CPU_X86_QUANT_PV_ROWS_H

#include <stdbool.h>
#include <stdint.h>

#include "attn.h"
#include "cpu/cpu.h"
#include "cpu/x86/quant_block.h"

// The including file's kernel: four rows' (nr of them real) weights pp (advancing by ldp a key)
// times nj <= PV_KEYS value rows, added to o's rows (ldo apart), o scaled by alpha first when
// scale_o; prefetch: request the next tile's lines.
INLINE void pv_rows_impl(const attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pp,
                         int64_t ldp, const float *alpha, bool scale_o, int nr, bool prefetch, float *o, int64_t ldo);

#define PV_KEYS FLASH_BC // keys whose scaled weights pv_rows_impl holds at once

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

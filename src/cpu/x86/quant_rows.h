// quant_rows.h - the q.k half of what the Q8_0 / Q4_0 kernel files share (quant_kernels_avx2.c,
// quant_kernels_avx512.c, quant_kernels_avx512vnni.c): the block helpers (quant_block.h) and the
// loop around their q.k row kernel (the element type made a constant for each call); quant_pv_rows.h
// is the P V half. Each file with q.k defines qk_rows_impl (declared below) and wraps qk_rows_q in
// its entry point. Include after <immintrin.h> (or simd512.h) with F16C enabled.
#ifndef ATTN_CPU_X86_QUANT_ROWS_H
#define ATTN_CPU_X86_QUANT_ROWS_H

#include <stdint.h>

#include "attn.h"
#include "cpu/cpu.h"
#include "cpu/x86/quant_block.h"
#include "half.h"

// The including file's kernel: s[r s_r + j s_j] = q row r . key row j (rows <= 4 at a time inside)
// for nj keys of D elements, rows of ks_row elements.
INLINE void qk_rows_impl(const attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const float *q, int rows,
                         float *s, int64_t s_r, int64_t s_j);

// cpu.h's qk_rows_q: the kernel instantiated for each element type.
INLINE void qk_rows_q(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const float *q, int rows, float *s,
                      int64_t s_r, int64_t s_j) { // q: the float rows (these tables have no prep_q)
    if (dt == ATTN_DTYPE_Q8_0) qk_rows_impl(ATTN_DTYPE_Q8_0, k, ks_row, nj, D, q, rows, s, s_r, s_j);
    else qk_rows_impl(ATTN_DTYPE_Q4_0, k, ks_row, nj, D, q, rows, s, s_r, s_j);
}

#endif

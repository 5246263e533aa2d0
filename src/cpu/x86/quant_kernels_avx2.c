// quant_kernels_avx2.c - the AVX2 table's decode row kernels for Q8_0 and Q4_0 (quant_avx2.h) on
// vpmaddubsw and vpmaddwd, for every CPU with AVX2, FMA3 and F16C; quant_kernels_avxvnni.c has
// the form on AVX-VNNI's dot products. Compiled with -mavx2 -mfma -mf16c for this file only.
#include "cpu/x86/quant_avx2.h"
#include "cpu/x86/quant_kernels.h"

void attn__prep_q_avx2(attn_dtype dt, const float *q, int rows, int D, void *out) { prep_q(dt, q, rows, D, out); }

void attn__qk_rows_q_avx2(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const void *q, int rows,
                          float *s, int64_t s_r, int64_t s_j) {
    qk_rows_prepared(dt, k, ks_row, nj, D, q, rows, s, s_r, s_j);
}

void attn__pv_rows_q_avx2(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt, int64_t ldp,
                          const float *alpha, int rows, float *o, int64_t ldo) {
    pv_rows_q(dt, v, vs_row, nj, Dv, pt, ldp, alpha, rows, o, ldo);
}

void attn__dequant_rows_avx2(attn_dtype dt, const void *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += ATTN_QBLOCK) {
        const uint8_t *b = block_at(x, dt, i);
        const __m256 d = scale_of(b);
        for (int c = 0; c < 4; c++) _mm256_storeu_ps(y + i + 8 * c, load8(dt, b, d, c));
    }
}

// quant_kernels_avxvnni.c - the decode row kernels of quant_avx2.h for Q8_0 and Q4_0 on AVX-VNNI's
// vpdpbusd (q.k) and vpdpwssd (P V), for the "avx2+vnni" form of the AVX2 table (CPUs reporting
// AVX-VNNI; dispatch.c): the same bits as quant_kernels_avx2.c's form with fewer instructions (one
// dot product in place of vpmaddubsw, vpaddw and vpmaddwd, or of vpmaddwd and vpaddd; Q8_0's quants
// flipped once a step vector instead of the query's sign applied for each row). Its prep_q differs
// from the other form's for Q8_0 (the flip's -128 in the column sums). Compiled with -mavx2 -mfma
// -mf16c -mavxvnni for this file only.
#define ATTN_AVX_VNNI 1

#include "cpu/x86/quant_avx2.h"
#include "cpu/x86/quant_kernels.h"

void attn__prep_q_avxvnni(attn_dtype dt, const float *q, int rows, int D, void *out) { prep_q(dt, q, rows, D, out); }

void attn__qk_rows_q_avxvnni(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const void *q, int rows,
                             float *s, int64_t s_r, int64_t s_j) {
    qk_rows_prepared(dt, k, ks_row, nj, D, q, rows, s, s_r, s_j);
}

void attn__pv_rows_q_avxvnni(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt,
                             int64_t ldp, const float *alpha, int rows, float *o, int64_t ldo) {
    pv_rows_q(dt, v, vs_row, nj, Dv, pt, ldp, alpha, rows, o, ldo);
}

// quant_kernels.h - the Q8_0 / Q4_0 row kernels (signatures of cpu.h's qk_rows_q, pv_rows_q,
// dequant_rows and prep_q) of quant_kernels_avx2.c (the AVX2 table), quant_kernels_avxvnni.c (its
// "avx2+vnni" form's prep_q, q.k and P V on AVX-VNNI), quant_kernels_avx512.c (the
// AVX-512 tables), quant_kernels_avx512vnni.c (the q.k of "avx512vnni" and of the two bf16 tables,
// the P V of "avx512vnni" without AVX512-VBMI), quant_kernels_avx512vbmi.c (the P V of "avx512vnni"
// with AVX512-VBMI and of "amxbf16") and quant_kernels_avx512bf16.c (the P V of "avx512bf16").
#ifndef ATTN_CPU_X86_QUANT_KERNELS_H
#define ATTN_CPU_X86_QUANT_KERNELS_H

#include <stdint.h>

#include "attn.h"

void attn__qk_rows_q_avx2(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const void *q, int rows,
                          float *s, int64_t s_r, int64_t s_j);
void attn__pv_rows_q_avx2(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt, int64_t ldp,
                          const float *alpha, int rows, float *o, int64_t ldo);
void attn__dequant_rows_avx2(attn_dtype dt, const void *x, float *y, int64_t n);
void attn__prep_q_avx2(attn_dtype dt, const float *q, int rows, int D, void *out);
void attn__prep_q_avxvnni(attn_dtype dt, const float *q, int rows, int D, void *out);
void attn__qk_rows_q_avxvnni(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const void *q, int rows,
                             float *s, int64_t s_r, int64_t s_j);
void attn__pv_rows_q_avxvnni(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt,
                             int64_t ldp, const float *alpha, int rows, float *o, int64_t ldo);
void attn__qk_rows_q_avx512(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const void *q, int rows,
                            float *s, int64_t s_r, int64_t s_j);
void attn__pv_rows_q_avx512(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt, int64_t ldp,
                            const float *alpha, int rows, float *o, int64_t ldo);
void attn__dequant_rows_avx512(attn_dtype dt, const void *x, float *y, int64_t n);
void attn__prep_q_avx512vnni(attn_dtype dt, const float *q, int rows, int D, void *out);
void attn__qk_rows_q_avx512vnni(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const void *q, int rows,
                                float *s, int64_t s_r, int64_t s_j);
void attn__pv_rows_q_avx512vnni(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt,
                                int64_t ldp, const float *alpha, int rows, float *o, int64_t ldo);
void attn__pv_rows_q_avx512vbmi(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt,
                                int64_t ldp, const float *alpha, int rows, float *o, int64_t ldo);
void attn__pv_rows_q_avx512bf16(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt,
                                int64_t ldp, const float *alpha, int rows, float *o, int64_t ldo);

#endif

// quant_kernels_avx512vbmi.c - the P V of the decode row kernels of cpu.h for Q8_0 and Q4_0 values
// on vpdpwssd (quant_pv_int16.h) with AVX512-VBMI's vpermb pairing two keys' Q4_0 quants, for the
// "avx512vnni" table on CPUs with AVX512-VBMI (Intel's since Ice Lake; Cascade Lake takes
// quant_kernels_avx512vnni.c's form) and for "amxbf16". The same bits as the other form with fewer
// shuffles: a Q4_0 block of a key pair takes one byte permute of both keys' bytes, loaded together,
// where pair_bytes takes two unpacks, an insertion and a widening (the P V's time in BENCHMARKS.md,
// the Xeon section); Q8_0's pairing is the same in both forms. Compiled with -mavx512f -mavx512bw
// -mavx512vl -mavx512vnni -mavx512vbmi for this file only.
#include "cpu/x86/simd512.h"

#define ATTN_PV_VBMI 1

#include "cpu/cpu.h"
#include "cpu/x86/quant_kernels.h"
#include "cpu/x86/quant_pv_int16.h"

void attn__pv_rows_q_avx512vbmi(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt,
                                int64_t ldp, const float *alpha, int rows, float *o, int64_t ldo) {
    pv_rows_q(dt, v, vs_row, nj, Dv, pt, ldp, alpha, rows, o, ldo);
}

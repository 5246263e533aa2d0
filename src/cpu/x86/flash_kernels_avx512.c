// flash_kernels_avx512.c - the flash primitives of cpu.h with AVX-512F (16 floats per register;
// compiled with -mavx512f for this file only; chosen at run time when the CPU and the OS support it).
//
// With 32 registers the blocks grow: the general product uses 6 rows x 64 columns (24
// accumulators, 4 vector loads and 6 broadcasts per 24 FMAs), and so does P V (6 output rows x 64
// columns). Narrower blocks serve the edges. exp2 scales with vscalefps, which needs no exponent bit tricks.
#include "cpu/x86/simd512.h"
#include <math.h>

#include "cpu/cpu.h"
#include "cpu/unroll.h"
#include "cpu/x86/decode_prefetch.h"
#include "cpu/x86/quant_kernels.h"
#include "cpu/x86/sum512.h"
#include "half.h"

#define INLINE static inline __attribute__((always_inline))

// this file stores the softmax's weights as floats only (flash_kernels_avx512bf16.c adds the pairs)
#define SOFTMAX512_STORE_PAIRS(pp, e0, e1) ((void)(pp), (void)(e0), (void)(e1))
#include "cpu/x86/softmax512.h"

static void exp2_avx512(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, exp2_ps512(_mm512_loadu_ps(x + i)));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, exp2_ps512(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

// C[r][c*16 ..] (+)= sum_k A[r][k] * B[k][c*16 ..] for R rows of A and C registers of columns.
INLINE void gemm_block(const float *A, int64_t a_rs, int64_t a_cs, int K, const float *B, int64_t ldb, float *Cm,
                       int64_t ldc, bool acc, const int R, const int C) {
    __m512 c[6][4];
ATTN_UNROLL
    for (int r = 0; r < R; r++)
ATTN_UNROLL
        for (int x = 0; x < C; x++)
            c[r][x] = acc ? _mm512_loadu_ps(Cm + (int64_t)r * ldc + 16 * x) : _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        const float *b = B + (int64_t)k * ldb;
        __m512 bv[4];
ATTN_UNROLL
        for (int x = 0; x < C; x++) bv[x] = _mm512_loadu_ps(b + 16 * x);
        const float *ak = A + (int64_t)k * a_cs;
ATTN_UNROLL
        for (int r = 0; r < R; r++) {
            const __m512 av = _mm512_set1_ps(ak[(int64_t)r * a_rs]);
ATTN_UNROLL
            for (int x = 0; x < C; x++) c[r][x] = _mm512_fmadd_ps(av, bv[x], c[r][x]);
        }
    }
ATTN_UNROLL
    for (int r = 0; r < R; r++)
ATTN_UNROLL
        for (int x = 0; x < C; x++) _mm512_storeu_ps(Cm + (int64_t)r * ldc + 16 * x, c[r][x]);
}

// All N columns of R rows of A.
INLINE void gemm_rows(const float *A, int64_t a_rs, int64_t a_cs, int K, const float *B, int64_t ldb, int N, float *Cm,
                      int64_t ldc, bool acc, const int R) {
    int n = 0;
    for (; n + 64 <= N; n += 64) gemm_block(A, a_rs, a_cs, K, B + n, ldb, Cm + n, ldc, acc, R, 4);
    if (n + 32 <= N) {
        gemm_block(A, a_rs, a_cs, K, B + n, ldb, Cm + n, ldc, acc, R, 2);
        n += 32;
    }
    if (n < N) gemm_block(A, a_rs, a_cs, K, B + n, ldb, Cm + n, ldc, acc, R, 1);
}

static void gemm_avx512(const float *A, int64_t a_rs, int64_t a_cs, int M, int K, const float *B, int64_t ldb, int N,
                        float *Cm, int64_t ldc, bool acc) {
    int m = 0;
    for (; m + 6 <= M; m += 6) gemm_rows(A + (int64_t)m * a_rs, a_rs, a_cs, K, B, ldb, N, Cm + (int64_t)m * ldc, ldc, acc, 6);
    for (; m + 2 <= M; m += 2) gemm_rows(A + (int64_t)m * a_rs, a_rs, a_cs, K, B, ldb, N, Cm + (int64_t)m * ldc, ldc, acc, 2);
    if (m < M) gemm_rows(A + (int64_t)m * a_rs, a_rs, a_cs, K, B, ldb, N, Cm + (int64_t)m * ldc, ldc, acc, 1);
}

// The softmax of a compact tile of few columns (br = 4 or 8): the tile read as one array, 16 / br
// keys per vector, lane i holding column i % br; the lane groups are combined for each column's
// maximum and sum, and group 0's maximum is the base of every group.
static void softmax_compact(float *st, int nj, int br, float *m, float *l, float *alpha) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    const __mmask16 cols = (__mmask16)((1u << br) - 1u);
    const __m512i col_of = _mm512_and_si512(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(br - 1));
    const __m512 m_old = _mm512_permutexvar_ps(col_of, _mm512_maskz_loadu_ps(cols, m));
    const int64_t n = (int64_t)nj * br, n16 = n / 16 * 16;
    const __mmask16 tail = (__mmask16)((1u << (n - n16)) - 1u);
    // four chains of maxima, not one chain of the max's latency (the same maximum in any order where
    // no score is NaN; a NaN score makes its row's sum, and so its output, NaN either way)
    __m512 mx = m_old, mx1 = neg_inf, mx2 = neg_inf, mx3 = neg_inf;
    int64_t k = 0;
    for (; k + 64 <= n16; k += 64) {
        mx = _mm512_max_ps(mx, _mm512_loadu_ps(st + k)), mx1 = _mm512_max_ps(mx1, _mm512_loadu_ps(st + k + 16));
        mx2 = _mm512_max_ps(mx2, _mm512_loadu_ps(st + k + 32)), mx3 = _mm512_max_ps(mx3, _mm512_loadu_ps(st + k + 48));
    }
    for (; k < n16; k += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(st + k));
    if (tail) mx1 = _mm512_max_ps(mx1, _mm512_mask_loadu_ps(neg_inf, tail, st + n16));
    mx = _mm512_max_ps(_mm512_max_ps(mx, mx1), _mm512_max_ps(mx2, mx3));
    mx = _mm512_max_ps(mx, _mm512_shuffle_f32x4(mx, mx, _MM_SHUFFLE(1, 0, 3, 2)));
    if (br == 4) mx = _mm512_max_ps(mx, _mm512_shuffle_f32x4(mx, mx, _MM_SHUFFLE(2, 3, 0, 1)));
    mx = _mm512_permutexvar_ps(col_of, mx);
    const __m512 base = _mm512_mask_mov_ps(mx, _mm512_cmp_ps_mask(mx, neg_inf, _CMP_EQ_OQ), _mm512_setzero_ps());
    const __m512 a = exp2_ps512(_mm512_sub_ps(m_old, base));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n16; i += 16) {
        const __m512 e = exp2_ps512(_mm512_sub_ps(_mm512_loadu_ps(st + i), base));
        _mm512_storeu_ps(st + i, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (tail) { // -inf in the lanes past the tile: their exponentials are 0
        const __m512 e = exp2_ps512(_mm512_sub_ps(_mm512_mask_loadu_ps(neg_inf, tail, st + n16), base));
        _mm512_mask_storeu_ps(st + n16, tail, e);
        sum = _mm512_add_ps(sum, e);
    }
    sum = _mm512_add_ps(sum, _mm512_shuffle_f32x4(sum, sum, _MM_SHUFFLE(1, 0, 3, 2)));
    if (br == 4) sum = _mm512_add_ps(sum, _mm512_shuffle_f32x4(sum, sum, _MM_SHUFFLE(2, 3, 0, 1)));
    _mm512_mask_storeu_ps(alpha, cols, a);
    _mm512_mask_storeu_ps(l, cols, _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(cols, l), sum));
    _mm512_mask_storeu_ps(m, cols, mx);
}

static void softmax_avx512(float *st, int nj, int br, int64_t ld, float *m, float *l, float *alpha) {
    if (br < 16) softmax_compact(st, nj, br, m, l, alpha);
    else softmax512_tile(st, nj, br, ld, m, l, alpha, NULL, NULL);
}

// ot[r][c*16 ..] = alpha * ot[r][..] + sum_j v[j][r] * st[j][c*16 ..] for R <= 6 output rows and C
// registers: R C accumulators, the tile's C vectors loaded once per key for all R rows (R = 6, C = 4:
// the 6 x 64 block, 24 FMAs to 4 loads of the tile, as the general product's block).
INLINE void pv_block(const float *v, int64_t vs_row, int64_t vs_d, int nj, const float *st, int64_t ld, const float *alpha,
                     float *ot, const int R, const int C) {
    __m512 acc[6][4], al[4];
ATTN_UNROLL
    for (int c = 0; c < C; c++) al[c] = _mm512_load_ps(alpha + 16 * c);
ATTN_UNROLL
    for (int r = 0; r < R; r++)
ATTN_UNROLL
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_mul_ps(_mm512_load_ps(ot + (int64_t)r * ld + 16 * c), al[c]);
    for (int j = 0; j < nj; j++, v += vs_row, st += ld) {
        __m512 p[4];
ATTN_UNROLL
        for (int c = 0; c < C; c++) p[c] = _mm512_load_ps(st + 16 * c);
ATTN_UNROLL
        for (int r = 0; r < R; r++) {
            const __m512 b = _mm512_set1_ps(v[(int64_t)r * vs_d]);
ATTN_UNROLL
            for (int c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(b, p[c], acc[r][c]);
        }
    }
ATTN_UNROLL
    for (int r = 0; r < R; r++)
ATTN_UNROLL
        for (int c = 0; c < C; c++) _mm512_store_ps(ot + (int64_t)r * ld + 16 * c, acc[r][c]);
}

// Every output row d for the columns [i0, i0 + 16 C): six rows at a time, then 4, 2 and 1.
INLINE void pv_dv_rows(const float *v, int64_t vs_row, int64_t vs_d, int nj, int Dv, const float *st, int64_t ld,
                       const float *alpha, float *ot, const int C) {
    int d = 0;
    for (; d + 6 <= Dv; d += 6) pv_block(v + (int64_t)d * vs_d, vs_row, vs_d, nj, st, ld, alpha, ot + (int64_t)d * ld, 6, C);
    if (d + 4 <= Dv) {
        pv_block(v + (int64_t)d * vs_d, vs_row, vs_d, nj, st, ld, alpha, ot + (int64_t)d * ld, 4, C);
        d += 4;
    }
    if (d + 2 <= Dv) {
        pv_block(v + (int64_t)d * vs_d, vs_row, vs_d, nj, st, ld, alpha, ot + (int64_t)d * ld, 2, C);
        d += 2;
    }
    if (d < Dv) pv_block(v + (int64_t)d * vs_d, vs_row, vs_d, nj, st, ld, alpha, ot + (int64_t)d * ld, 1, C);
}

// The columns in blocks of 64 (then 32 and 16), each block's weights (nj x 64 floats) read for all
// of Dv's rows before the next: they stay in L1 beside the value tile, where the whole tile of
// weights (nj x br) would not.
static void pv_avx512(const float *v, int64_t vs_row, int64_t vs_d, int nj, int Dv, const float *st, int br,
                      int64_t ld, const float *alpha, float *ot) {
    int i0 = 0;
    for (; i0 + 64 <= br; i0 += 64) pv_dv_rows(v, vs_row, vs_d, nj, Dv, st + i0, ld, alpha + i0, ot + i0, 4);
    if (i0 + 32 <= br) {
        pv_dv_rows(v, vs_row, vs_d, nj, Dv, st + i0, ld, alpha + i0, ot + i0, 2);
        i0 += 32;
    }
    if (i0 < br) pv_dv_rows(v, vs_row, vs_d, nj, Dv, st + i0, ld, alpha + i0, ot + i0, 1);
}

static void bwd_p_avx512(float *st, int nj, int br, const float *lse2) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    for (int i0 = 0; i0 < br; i0 += 16) {
        const __m512 l = _mm512_load_ps(lse2 + i0);
        const __m512 base = _mm512_mask_mov_ps(l, _mm512_cmp_ps_mask(l, neg_inf, _CMP_EQ_OQ), _mm512_setzero_ps());
        float *s = st + i0;
        for (int j = 0; j < nj; j++, s += br) { // hidden (-inf) scores give 0 whatever lse2 holds
            const __m512 x = _mm512_load_ps(s);
            const __mmask16 seen = _mm512_cmp_ps_mask(x, neg_inf, _CMP_NEQ_UQ);
            _mm512_store_ps(s, _mm512_maskz_mov_ps(seen, exp2_ps512(_mm512_sub_ps(x, base))));
        }
    }
}

static void bwd_ds_avx512(const float *pt, float *dst, int nj, int br, const float *rowdot) {
    for (int i0 = 0; i0 < br; i0 += 16) {
        const __m512 r = _mm512_load_ps(rowdot + i0);
        for (int j = 0; j < nj; j++) {
            const int64_t e = (int64_t)j * br + i0;
            const __m512 pe = _mm512_load_ps(pt + e);
            const __mmask16 nz = _mm512_cmp_ps_mask(pe, _mm512_setzero_ps(), _CMP_NEQ_UQ); // dS = 0 where P = 0
            _mm512_store_ps(dst + e, _mm512_maskz_mul_ps(nz, pe, _mm512_sub_ps(_mm512_load_ps(dst + e), r)));
        }
    }
}

// 16 elements of a k or v row of type dt from element i, as floats; `n` < 16 reads only n of them
// (the others are 0).
INLINE __m512 load_kv16(const void *p, attn_dtype dt, int64_t i, int n) {
    if (n < 16) {
        float t[16] = {0};
        for (int c = 0; c < n; c++) t[c] = attn__kv_at(p, dt, i + c);
        return _mm512_loadu_ps(t);
    }
    if (dt == ATTN_DTYPE_F32) return _mm512_loadu_ps((const float *)p + i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    if (dt == ATTN_DTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); // bfloat16
}

// One step of qk_rows_block: n (<= 16) elements from d of NK keys (at their offsets `at`) and NR
// rows (masked loads past n), the keys' lines DECODE_PF_BYTES on requested first with `prefetch`.
INLINE void qk_step(const attn_dtype dt, const int NR, const int NK, const void *k, const int64_t *at,
                    const float *const *qr, int d, int n, bool prefetch, __m512 *acc) {
    if (prefetch) {
        ATTN_UNROLL
        for (int c = 0; c < NK; c++) decode_prefetch(k, dt, at[c] + d);
    }
    const __mmask16 m = (__mmask16)(n == 16 ? 0xffffu : (1u << n) - 1u);
    __m512 x[4];
    ATTN_UNROLL
    for (int r = 0; r < NR; r++) x[r] = _mm512_maskz_loadu_ps(m, qr[r] + d);
    ATTN_UNROLL
    for (int c = 0; c < NK; c++) {
        const __m512 kv = load_kv16(k, dt, at[c] + d, n);
        ATTN_UNROLL
        for (int r = 0; r < NR; r++) acc[r * NK + c] = _mm512_fmadd_ps(kv, x[r], acc[r * NK + c]);
    }
}

// NR query rows against NK = 16 / NR keys at a time (16 accumulators; each q vector loaded once for
// the NK keys, each key vector once for the NR rows), 16 lanes of d per step, the 16 dot products
// reduced together by sum16 (lane NR c + r: key c, row r). Rows past nr repeat row 0 and a tile's
// last keys (nj not a multiple of NK) its last key; every (row, key) sum runs along d in one
// accumulator and is reduced in the same order whatever its lane, so its bits do not depend on NR,
// NK or the key's place in the group. NR = 4 takes blocks of three or four rows, 2 and 1 the few
// rows of decoding without GQA, which would otherwise spend four rows' products on one.
INLINE void qk_rows_block(const attn_dtype dt, const int NR, const void *k, int64_t ks_row, int nj, int D,
                          const float *q, int nr, float *s, int64_t s_r, int64_t s_j, bool prefetch) {
    const int NK = 16 / NR, d16 = D / 16 * 16, line = decode_line_elems(dt);
    const float *qr[4];
    ATTN_UNROLL
    for (int r = 0; r < NR; r++) qr[r] = q + (r < nr ? (int64_t)r * D : 0);
    for (int j = 0; j < nj; j += NK) {
        int64_t at[16];
        ATTN_UNROLL
        for (int c = 0; c < NK; c++) at[c] = (int64_t)(j + c < nj ? j + c : nj - 1) * ks_row;
        __m512 acc[16];
        ATTN_UNROLL
        for (int x = 0; x < 16; x++) acc[x] = _mm512_setzero_ps();
        int d = 0; // whole vectors, then a partial one
        for (; d < d16; d += 16) qk_step(dt, NR, NK, k, at, qr, d, 16, prefetch && d % line == 0, acc);
        if (d < D) qk_step(dt, NR, NK, k, at, qr, d, D - d, prefetch && d % line == 0, acc);
        store_dots16(acc, NR, s + (int64_t)j * s_j, s_r, s_j, nr, nj - j < NK ? nj - j : NK);
    }
}

INLINE void qk_rows_impl(const attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const float *q, int rows,
                         float *s, int64_t s_r, int64_t s_j) {
    for (int r0 = 0; r0 < rows; r0 += 4) {
        const int nr = rows - r0 < 4 ? rows - r0 : 4;
        const float *qb = q + (int64_t)r0 * D;
        float *sb = s + (int64_t)r0 * s_r;
        if (nr >= 3) qk_rows_block(dt, 4, k, ks_row, nj, D, qb, nr, sb, s_r, s_j, r0 == 0);
        else if (nr == 2) qk_rows_block(dt, 2, k, ks_row, nj, D, qb, nr, sb, s_r, s_j, r0 == 0);
        else qk_rows_block(dt, 1, k, ks_row, nj, D, qb, nr, sb, s_r, s_j, r0 == 0);
    }
}

static void qk_rows_avx512(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const float *q, int rows,
                           float *s, int64_t s_r, int64_t s_j) {
    if (dt == ATTN_DTYPE_F16) qk_rows_impl(ATTN_DTYPE_F16, k, ks_row, nj, D, q, rows, s, s_r, s_j);
    else if (dt == ATTN_DTYPE_BF16) qk_rows_impl(ATTN_DTYPE_BF16, k, ks_row, nj, D, q, rows, s, s_r, s_j);
    else qk_rows_impl(ATTN_DTYPE_F32, k, ks_row, nj, D, q, rows, s, s_r, s_j);
}

// Columns of a row of Dv that vector x of a block from column e holds: 0 to 16.
INLINE int block_cols(int Dv, int e, int x) {
    const int left = Dv - e - 16 * x;
    return left < 0 ? 0 : left < 16 ? left : 16;
}

// pv_rows over NR rows and the NV vectors of columns from e (NR * NV <= 16 accumulators; `full`: all
// 16 NV columns inside the row, known when compiled; else NV is 1 and the row's last Dv - e < 16
// columns): per key, the value vectors and the rows' weights, adjacent in the tile (pp[0 .. NR - 1],
// pp advancing by ldp), broadcast. Row r's sums are left in out[r * NV ..].
INLINE void pv_cols(const attn_dtype dt, const int NR, const int NV, const bool full, const void *v, int64_t vs_row,
                    int nj, int Dv, int e, const float *pp, int64_t ldp, bool prefetch, __m512 out[16]) {
    __m512 c[16];
    ATTN_UNROLL
    for (int x = 0; x < NR * NV; x++) c[x] = _mm512_setzero_ps();
    for (int j = 0; j < nj; j++, pp += ldp) {
        const int64_t vj = (int64_t)j * vs_row + e;
        if (prefetch) decode_prefetch_cols(v, dt, vj, vs_row, e, 16 * NV, Dv);
        __m512 vv[16];
        ATTN_UNROLL
        for (int x = 0; x < NV; x++) vv[x] = load_kv16(v, dt, vj + 16 * x, full ? 16 : Dv - e);
        ATTN_UNROLL
        for (int r = 0; r < NR; r++) {
            const __m512 w = _mm512_set1_ps(pp[r]);
            ATTN_UNROLL
            for (int x = 0; x < NV; x++) c[r * NV + x] = _mm512_fmadd_ps(w, vv[x], c[r * NV + x]);
        }
    }
    ATTN_UNROLL
    for (int x = 0; x < NR * NV; x++) out[x] = c[x];
}

// pv_cols' sums for NR rows (nr of them real) over the w <= 16 NV columns from e, added to the rows
// of o scaled by alpha.
INLINE void pv_rows_cols(const attn_dtype dt, const int NR, const int NV, const bool full, const void *v,
                         int64_t vs_row, int nj, int Dv, int e, int w, const float *pt, int64_t ldp,
                         const float *alpha, int nr, float *o, int64_t ldo, bool prefetch) {
    __m512 c[16];
    pv_cols(dt, NR, NV, full, v, vs_row, nj, Dv, e, pt, ldp, prefetch, c);
    ATTN_UNROLL
    for (int r = 0; r < NR; r++) {
        float *orow = o + (int64_t)r * ldo + e;
        const __m512 a = _mm512_set1_ps(r < nr ? alpha[r] : 0.0f);
        ATTN_UNROLL
        for (int x = 0; x < NV; x++) {
            const int cols = r < nr ? block_cols(e + w, e, x) : 0;
            const __mmask16 m = (__mmask16)((1u << cols) - 1u); // 0 columns: none
            _mm512_mask_storeu_ps(orow + 16 * x, m,
                                  _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(m, orow + 16 * x), c[r * NV + x]));
        }
    }
}

// Blocks of NR rows (4, or 2 and 1 for the last rows) and W = 256 / NR columns (64, 128, 256); the
// last Dv % W columns in narrower blocks of whole vectors (128, 64, 32, 16 columns, each at most
// once) and a last partial vector, so that no product is spent on columns past Dv.
INLINE void pv_rows_block(const attn_dtype dt, const int NR, const void *v, int64_t vs_row, int nj, int Dv,
                          const float *pt, int64_t ldp, const float *alpha, int nr, float *o, int64_t ldo,
                          bool prefetch) {
    const int NV = 16 / NR, W = 16 * NV;
    int e = 0;
    for (; e + W <= Dv; e += W)
        pv_rows_cols(dt, NR, NV, true, v, vs_row, nj, Dv, e, W, pt, ldp, alpha, nr, o, ldo, prefetch);
    if (NV > 8 && Dv - e >= 128) {
        pv_rows_cols(dt, NR, 8, true, v, vs_row, nj, Dv, e, 128, pt, ldp, alpha, nr, o, ldo, prefetch);
        e += 128;
    }
    if (NV > 4 && Dv - e >= 64) {
        pv_rows_cols(dt, NR, 4, true, v, vs_row, nj, Dv, e, 64, pt, ldp, alpha, nr, o, ldo, prefetch);
        e += 64;
    }
    if (NV > 2 && Dv - e >= 32) {
        pv_rows_cols(dt, NR, 2, true, v, vs_row, nj, Dv, e, 32, pt, ldp, alpha, nr, o, ldo, prefetch);
        e += 32;
    }
    if (Dv - e >= 16) {
        pv_rows_cols(dt, NR, 1, true, v, vs_row, nj, Dv, e, 16, pt, ldp, alpha, nr, o, ldo, prefetch);
        e += 16;
    }
    if (e < Dv) pv_rows_cols(dt, NR, 1, false, v, vs_row, nj, Dv, e, Dv - e, pt, ldp, alpha, nr, o, ldo, prefetch);
}

INLINE void pv_rows_impl(const attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt,
                         int64_t ldp, const float *alpha, int rows, float *o, int64_t ldo) {
    for (int r0 = 0; r0 < rows; r0 += 4) {
        const int nr = rows - r0 < 4 ? rows - r0 : 4;
        float *ob = o + (int64_t)r0 * ldo;
        if (nr >= 3) pv_rows_block(dt, 4, v, vs_row, nj, Dv, pt + r0, ldp, alpha + r0, nr, ob, ldo, r0 == 0);
        else if (nr == 2) pv_rows_block(dt, 2, v, vs_row, nj, Dv, pt + r0, ldp, alpha + r0, nr, ob, ldo, r0 == 0);
        else pv_rows_block(dt, 1, v, vs_row, nj, Dv, pt + r0, ldp, alpha + r0, nr, ob, ldo, r0 == 0);
    }
}

static void pv_rows_avx512(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt, int64_t ldp,
                           const float *alpha, int rows, float *o, int64_t ldo) {
    if (dt == ATTN_DTYPE_F16) pv_rows_impl(ATTN_DTYPE_F16, v, vs_row, nj, Dv, pt, ldp, alpha, rows, o, ldo);
    else if (dt == ATTN_DTYPE_BF16) pv_rows_impl(ATTN_DTYPE_BF16, v, vs_row, nj, Dv, pt, ldp, alpha, rows, o, ldo);
    else pv_rows_impl(ATTN_DTYPE_F32, v, vs_row, nj, Dv, pt, ldp, alpha, rows, o, ldo);
}

static void half_to_f32_avx512(attn_dtype dt, const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    if (dt == ATTN_DTYPE_F16) {
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
        for (; i < n; i++) y[i] = attn__f16_to_f32(x[i]);
    } else {
        for (; i + 16 <= n; i += 16) {
            const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + i)));
            _mm512_storeu_ps(y + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
        }
        for (; i < n; i++) y[i] = attn__bf16_to_f32(x[i]);
    }
}

// The entries of the three AVX-512 tables (the bf16 ones have block-type decode kernels of their own).
#define AVX512_ENTRIES \
    .gemm = gemm_avx512, \
    .softmax = softmax_avx512, \
    .pv = pv_avx512, \
    .exp2 = exp2_avx512, \
    .bwd_p = bwd_p_avx512, \
    .bwd_ds = bwd_ds_avx512, \
    .qk_rows = qk_rows_avx512, \
    .pv_rows = pv_rows_avx512, \
    .half_to_f32 = half_to_f32_avx512, \
    .f32_to_half = attn__f32_to_half_avx2, \
    .dequant_rows = attn__dequant_rows_avx512, \
    .philox_lanes = attn__philox_lanes_avx2

const attn__kernels attn__kernels_avx512 = {
    .name = "avx512",
    .isa = ATTN_ISA_AVX512,
    AVX512_ENTRIES,
    .qk_rows_q = attn__qk_rows_q_avx512,
    .pv_rows_q = attn__pv_rows_q_avx512,
};

#if defined(ATTN_HAVE_AVX512VNNI)
// The AVX-512 table with the q.k of its Q8_0 and Q4_0 decode kernels on AVX512-VNNI's 8-bit dot
// products and a P V of their own on vpdpwssd, the weights times the block scales
// (quant_pv_int16.h): for CPUs with AVX512-VNNI where AUTO passes over the bf16 tables (Intel's
// Cascade Lake, Ice Lake, Tiger Lake, Rocket Lake, and the later Xeons without tiles granted).
// Two forms, the same bits: the P V pairing keys with AVX512-VBMI's byte permutes where the CPU
// has it (quant_kernels_avx512vbmi.c; every one above but Cascade Lake), else with unpacks
// (quant_kernels_avx512vnni.c). attn__kernels_for picks; attn__kernel_tables lists both.
// The q.k of the Q8_0 and Q4_0 decode kernels on vpdpbusd, shared with the bf16 tables.
#define VNNI_QK_ENTRIES \
    .qk_rows_q = attn__qk_rows_q_avx512vnni, \
    .prep_q = attn__prep_q_avx512vnni

const attn__kernels attn__kernels_avx512vnni = {
    .name = "avx512vnni",
    .isa = ATTN_ISA_AVX512_VNNI,
    AVX512_ENTRIES,
    VNNI_QK_ENTRIES,
    .pv_rows_q = attn__pv_rows_q_avx512vnni,
};
#if defined(ATTN_HAVE_AVX512VBMI)
const attn__kernels attn__kernels_avx512vnni_vbmi = {
    .name = "avx512vnni+vbmi",
    .isa = ATTN_ISA_AVX512_VNNI,
    AVX512_ENTRIES,
    VNNI_QK_ENTRIES,
    .pv_rows_q = attn__pv_rows_q_avx512vbmi,
};
#endif
#endif

#if defined(ATTN_HAVE_AVX512BF16)
// The entries around gemm_bf16 of both tables with bf16 dot products (flash_kernels_avx512bf16.c),
// and the q.k of their decode kernels for Q8_0 and Q4_0 (quant_kernels_avx512vnni.c).
#define BF16_DOT_ENTRIES \
    .pack_pairs_bf16 = attn__pack_pairs_bf16_avx512, \
    .pair_rows_bf16 = attn__pair_rows_bf16_avx512, \
    .round_bf16 = attn__round_bf16_avx512, \
    .transpose_pairs_bf16 = attn__transpose_pairs_bf16_avx512, \
    .scale_to_bf16 = attn__scale_to_bf16_avx512, \
    .softmax_pairs_bf16 = attn__softmax_pairs_bf16_avx512, \
    VNNI_QK_ENTRIES

// The decode kernels' P V on vdpbf16ps (quant_kernels_avx512bf16.c).
const attn__kernels attn__kernels_avx512bf16 = {
    .name = "avx512bf16",
    .isa = ATTN_ISA_AVX512_BF16,
    AVX512_ENTRIES,
    .gemm_bf16 = attn__gemm_bf16_avx512,
    BF16_DOT_ENTRIES,
    .pv_rows_q = attn__pv_rows_q_avx512bf16,
};
#endif

#if defined(ATTN_HAVE_AMXBF16)
// The "avx512bf16" table with its bf16 products on AMX tiles (flash_kernels_amx.c) and the decode
// kernels' P V of the "avx512vnni" table (vpdpwssd, in its AVX512-VBMI form: every CPU with tiles
// has it): the CPUs with tiles are Intel's, whose vdpbf16ps runs at a quarter of vpdpwssd's rate
// (BENCHMARKS.md; attn__isa_caps).
const attn__kernels attn__kernels_amxbf16 = {
    .name = "amxbf16",
    .isa = ATTN_ISA_AMX_BF16,
    AVX512_ENTRIES,
    .gemm_bf16 = attn__gemm_bf16_amx,
    BF16_DOT_ENTRIES,
    .pv_rows_q = attn__pv_rows_q_avx512vbmi,
};
#endif

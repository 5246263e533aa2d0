// flash_kernels_avx2.c - the flash primitives of cpu.h with AVX2 and FMA3 (compiled with
// -mavx2 -mfma for this file only; chosen at run time when the CPU has both).
//
// The products use a 6 x 16 register block: 12 accumulators of 8 floats, two vector loads of the
// row operand and six scalar broadcasts from the other per step, i.e. 12 FMAs for 8 loads, which
// keeps the two FMA pipes busy. Key and value rows are read in place with any strides.
#include <immintrin.h>
#include <math.h>

#include "cpu/cpu.h"
#include "cpu/unroll.h"
#include "cpu/x86/decode_prefetch.h"
#include "cpu/x86/quant_kernels.h"
#include "half.h"

// p(f) of cpu.h's exp2 polynomial, fused multiply-adds (f in [-0.5, 0.5]: 2^f).
static inline __m256 exp2_poly_ps(__m256 f) {
    __m256 p = _mm256_set1_ps(ATTN_EXP2_C6);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(ATTN_EXP2_C5));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(ATTN_EXP2_C4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(ATTN_EXP2_C3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(ATTN_EXP2_C2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(ATTN_EXP2_C1));
    return _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
}

// 2^x, same polynomial as attn__exp2f (cpu/generic/flash_kernels.c), fused: within 1 ulp on
// [-126, 128]; x < -126.5 and -inf give 0; NaN stays NaN (min/max take x as the second operand).
static inline __m256 exp2_ps(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(128.0f), x);
    x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x);
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(x, n);
    const __m256 p = exp2_poly_ps(f);
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)); // 0 .. 255
    const __m256 top = _mm256_castsi256_ps(_mm256_cmpgt_epi32(e, _mm256_set1_epi32(254)));
    e = _mm256_min_epi32(e, _mm256_set1_epi32(254));
    const __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
    return _mm256_blendv_ps(r, _mm256_add_ps(r, r), top);
}

// 2^x for x <= 0 or -inf (the softmax's arguments): exp2_ps without the overflow handling.
static inline __m256 exp2_nonpos_ps(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x);
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(x, n);
    const __m256 p = exp2_poly_ps(f);
    const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)); // 0 .. 127
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
}

static void exp2_avx2(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp2_ps(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = attn__exp2f(x[i]);
}

// C[0:R, 0:16] (+)= A[0:R, 0:K] B[0:K, 0:16] for R = 1 .. 6 rows: rows of A broadcast element by
// element (any strides), B and C read as vectors (unaligned loads: row strides need not be
// multiples of 16). 2R accumulators: R = 6 is the 6 x 16 block; a product's last M % 6 rows take
// R = 4, 2 and 1, whose 8, 4 and 2 chains of FMAs keep more of the pipes busy than rows one by one.
static inline __attribute__((always_inline)) void gemm_rx16(const float *A, int64_t a_rs, int64_t a_cs, int K,
                                                            const float *B, int64_t ldb, float *C, int64_t ldc,
                                                            bool acc, const int R) {
    __m256 c[6][2];
    ATTN_UNROLL
    for (int r = 0; r < R; r++) {
        c[r][0] = acc ? _mm256_loadu_ps(C + (int64_t)r * ldc) : _mm256_setzero_ps();
        c[r][1] = acc ? _mm256_loadu_ps(C + (int64_t)r * ldc + 8) : _mm256_setzero_ps();
    }
    const float *b = B;
    for (int k = 0; k < K; k++, b += ldb) {
        const float *ak = A + (int64_t)k * a_cs;
        const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        ATTN_UNROLL
        for (int r = 0; r < R; r++) {
            const __m256 x = _mm256_broadcast_ss(ak + (int64_t)r * a_rs);
            c[r][0] = _mm256_fmadd_ps(x, b0, c[r][0]), c[r][1] = _mm256_fmadd_ps(x, b1, c[r][1]);
        }
    }
    ATTN_UNROLL
    for (int r = 0; r < R; r++)
        _mm256_storeu_ps(C + (int64_t)r * ldc, c[r][0]), _mm256_storeu_ps(C + (int64_t)r * ldc + 8, c[r][1]);
}

// All N columns of R rows.
static inline __attribute__((always_inline)) void gemm_rows(const float *A, int64_t a_rs, int64_t a_cs, int K,
                                                            const float *B, int64_t ldb, int N, float *C, int64_t ldc,
                                                            bool acc, const int R) {
    for (int n = 0; n < N; n += 16) gemm_rx16(A, a_rs, a_cs, K, B + n, ldb, C + n, ldc, acc, R);
}

static void gemm_avx2(const float *A, int64_t a_rs, int64_t a_cs, int M, int K, const float *B, int64_t ldb, int N,
                      float *C, int64_t ldc, bool acc) {
    int m = 0;
    for (; m + 6 <= M; m += 6) gemm_rows(A + (int64_t)m * a_rs, a_rs, a_cs, K, B, ldb, N, C + (int64_t)m * ldc, ldc, acc, 6);
    if (m + 4 <= M) {
        gemm_rows(A + (int64_t)m * a_rs, a_rs, a_cs, K, B, ldb, N, C + (int64_t)m * ldc, ldc, acc, 4);
        m += 4;
    }
    if (m + 2 <= M) {
        gemm_rows(A + (int64_t)m * a_rs, a_rs, a_cs, K, B, ldb, N, C + (int64_t)m * ldc, ldc, acc, 2);
        m += 2;
    }
    if (m < M) gemm_rows(A + (int64_t)m * a_rs, a_rs, a_cs, K, B, ldb, N, C + (int64_t)m * ldc, ldc, acc, 1);
}

// The softmax of a compact tile of four columns (br = 4): the tile read as one array, two keys
// per vector, lane i holding column i % 4; the halves are combined for each column's maximum and
// sum, and the low half's maximum is the base of both.
static void softmax_compact(float *st, int nj, float *m, float *l, float *alpha) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    const __m128 m4 = _mm_loadu_ps(m);
    const __m256 m_old = _mm256_insertf128_ps(_mm256_castps128_ps256(m4), m4, 1);
    const int n8 = nj / 2 * 8;
    // four chains of maxima, not one chain of the max's latency (the same maximum in any order where
    // no score is NaN; a NaN score makes its row's sum, and so its output, NaN either way)
    __m256 mx = m_old, mx1 = neg_inf, mx2 = neg_inf, mx3 = neg_inf;
    int k = 0;
    for (; k + 32 <= n8; k += 32) {
        mx = _mm256_max_ps(mx, _mm256_loadu_ps(st + k)), mx1 = _mm256_max_ps(mx1, _mm256_loadu_ps(st + k + 8));
        mx2 = _mm256_max_ps(mx2, _mm256_loadu_ps(st + k + 16)), mx3 = _mm256_max_ps(mx3, _mm256_loadu_ps(st + k + 24));
    }
    for (; k < n8; k += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(st + k));
    if (nj % 2) mx1 = _mm256_max_ps(mx1, _mm256_insertf128_ps(neg_inf, _mm_loadu_ps(st + n8), 0));
    mx = _mm256_max_ps(_mm256_max_ps(mx, mx1), _mm256_max_ps(mx2, mx3));
    mx = _mm256_max_ps(mx, _mm256_permute2f128_ps(mx, mx, 1));
    mx = _mm256_permute2f128_ps(mx, mx, 0);
    const __m256 base = _mm256_blendv_ps(mx, _mm256_setzero_ps(), _mm256_cmp_ps(mx, neg_inf, _CMP_EQ_OQ));
    const __m256 a = exp2_nonpos_ps(_mm256_sub_ps(m_old, base));
    __m256 sum = _mm256_setzero_ps();
    for (int i = 0; i < n8; i += 8) {
        const __m256 e = exp2_nonpos_ps(_mm256_sub_ps(_mm256_loadu_ps(st + i), base));
        _mm256_storeu_ps(st + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (nj % 2) { // -inf in the high half, past the tile: its exponentials are 0
        const __m256 e = exp2_nonpos_ps(_mm256_sub_ps(_mm256_insertf128_ps(neg_inf, _mm_loadu_ps(st + n8), 0), base));
        _mm_storeu_ps(st + n8, _mm256_castps256_ps128(e));
        sum = _mm256_add_ps(sum, e);
    }
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    const __m128 a4 = _mm256_castps256_ps128(a);
    _mm_storeu_ps(alpha, a4);
    _mm_storeu_ps(l, _mm_fmadd_ps(a4, _mm_loadu_ps(l), s4));
    _mm_storeu_ps(m, _mm256_castps256_ps128(mx));
}

// The softmax of W (1 or 2) vectors of columns from st (br apart a key): each key's row of 16
// columns is one cache line, read in the maximum pass and again in the exponential pass, so both
// vectors of a line are taken together, the 2W exponentials of two keys in flight at once. Each
// column's sum adds its even keys and its odd keys apart and the two at the end, whatever W is.
static inline __attribute__((always_inline)) void softmax_cols(float *st, int nj, int64_t ld, float *m, float *l,
                                                               float *alpha, const int W) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    __m256 m_old[2], mx[2], mx1[2], base[2], sum0[2], sum1[2];
    ATTN_UNROLL
    for (int w = 0; w < W; w++) m_old[w] = _mm256_load_ps(m + 8 * w), mx[w] = m_old[w], mx1[w] = neg_inf;
    const float *sr = st;
    int j = 0;
    for (; j + 2 <= nj; j += 2, sr += 2 * ld) {
        ATTN_UNROLL
        for (int w = 0; w < W; w++)
            mx[w] = _mm256_max_ps(mx[w], _mm256_load_ps(sr + 8 * w)),
            mx1[w] = _mm256_max_ps(mx1[w], _mm256_load_ps(sr + ld + 8 * w));
    }
    ATTN_UNROLL
    for (int w = 0; w < W; w++) {
        if (j < nj) mx[w] = _mm256_max_ps(mx[w], _mm256_load_ps(sr + 8 * w));
        mx[w] = _mm256_max_ps(mx[w], mx1[w]);
        base[w] = _mm256_blendv_ps(mx[w], _mm256_setzero_ps(), _mm256_cmp_ps(mx[w], neg_inf, _CMP_EQ_OQ));
        sum0[w] = _mm256_setzero_ps(), sum1[w] = sum0[w];
    }
    float *s = st;
    for (j = 0; j + 2 <= nj; j += 2, s += 2 * ld) {
        __m256 e0[2], e1[2];
        ATTN_UNROLL
        for (int w = 0; w < W; w++) {
            e0[w] = exp2_nonpos_ps(_mm256_sub_ps(_mm256_load_ps(s + 8 * w), base[w]));
            e1[w] = exp2_nonpos_ps(_mm256_sub_ps(_mm256_load_ps(s + ld + 8 * w), base[w]));
        }
        ATTN_UNROLL
        for (int w = 0; w < W; w++) {
            _mm256_store_ps(s + 8 * w, e0[w]), _mm256_store_ps(s + ld + 8 * w, e1[w]);
            sum0[w] = _mm256_add_ps(sum0[w], e0[w]), sum1[w] = _mm256_add_ps(sum1[w], e1[w]);
        }
    }
    ATTN_UNROLL
    for (int w = 0; w < W; w++) {
        if (j < nj) {
            const __m256 e0 = exp2_nonpos_ps(_mm256_sub_ps(_mm256_load_ps(s + 8 * w), base[w]));
            _mm256_store_ps(s + 8 * w, e0);
            sum0[w] = _mm256_add_ps(sum0[w], e0);
        }
        const __m256 a = exp2_nonpos_ps(_mm256_sub_ps(m_old[w], base[w]));
        _mm256_store_ps(alpha + 8 * w, a);
        _mm256_store_ps(l + 8 * w, _mm256_fmadd_ps(a, _mm256_load_ps(l + 8 * w), _mm256_add_ps(sum0[w], sum1[w])));
        _mm256_store_ps(m + 8 * w, mx[w]);
    }
}

static void softmax_avx2(float *st, int nj, int br, int64_t ld, float *m, float *l, float *alpha) {
    if (br == 4) {
        softmax_compact(st, nj, m, l, alpha);
        return;
    }
    int i0 = 0;
    for (; i0 + 16 <= br; i0 += 16) softmax_cols(st + i0, nj, ld, m + i0, l + i0, alpha + i0, 2);
    if (i0 < br) softmax_cols(st + i0, nj, ld, m + i0, l + i0, alpha + i0, 1); // br = 8
}

// ot[r][0..16) = alpha * ot[r][..] + sum_j v[j][r] * st[j][0..16) for R = 1 .. 6 output rows: 2R
// accumulators, the tile's two vectors loaded once per key for all R rows (R = 6: the 6 x 16 block).
static inline __attribute__((always_inline)) void pv_block(const float *v, int64_t vs_row, int64_t vs_d, int nj,
                                                           const float *st, int64_t ld, __m256 al0, __m256 al1, float *ot,
                                                           const int R) {
    __m256 a0[6], a1[6];
ATTN_UNROLL
    for (int r = 0; r < R; r++) {
        a0[r] = _mm256_mul_ps(_mm256_load_ps(ot + (int64_t)r * ld), al0);
        a1[r] = _mm256_mul_ps(_mm256_load_ps(ot + (int64_t)r * ld + 8), al1);
    }
    for (int j = 0; j < nj; j++, v += vs_row, st += ld) {
        const __m256 p0 = _mm256_load_ps(st), p1 = _mm256_load_ps(st + 8);
ATTN_UNROLL
        for (int r = 0; r < R; r++) {
            const __m256 b = _mm256_broadcast_ss(v + (int64_t)r * vs_d);
            a0[r] = _mm256_fmadd_ps(b, p0, a0[r]), a1[r] = _mm256_fmadd_ps(b, p1, a1[r]);
        }
    }
ATTN_UNROLL
    for (int r = 0; r < R; r++) {
        _mm256_store_ps(ot + (int64_t)r * ld, a0[r]);
        _mm256_store_ps(ot + (int64_t)r * ld + 8, a1[r]);
    }
}

static void pv_avx2(const float *v, int64_t vs_row, int64_t vs_d, int nj, int Dv, const float *st, int br,
                    int64_t ld, const float *alpha, float *ot) {
    for (int i0 = 0; i0 < br; i0 += 16) {
        const __m256 al0 = _mm256_load_ps(alpha + i0), al1 = _mm256_load_ps(alpha + i0 + 8);
        int d = 0;
        for (; d + 6 <= Dv; d += 6)
            pv_block(v + (int64_t)d * vs_d, vs_row, vs_d, nj, st + i0, ld, al0, al1, ot + (int64_t)d * ld + i0, 6);
        if (d + 4 <= Dv) {
            pv_block(v + (int64_t)d * vs_d, vs_row, vs_d, nj, st + i0, ld, al0, al1, ot + (int64_t)d * ld + i0, 4);
            d += 4;
        }
        if (d + 2 <= Dv) {
            pv_block(v + (int64_t)d * vs_d, vs_row, vs_d, nj, st + i0, ld, al0, al1, ot + (int64_t)d * ld + i0, 2);
            d += 2;
        }
        for (; d < Dv; d++)
            pv_block(v + (int64_t)d * vs_d, vs_row, vs_d, nj, st + i0, ld, al0, al1, ot + (int64_t)d * ld + i0, 1);
    }
}

static void bwd_p_avx2(float *st, int nj, int br, const float *lse2) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    for (int i0 = 0; i0 < br; i0 += 8) {
        const __m256 l = _mm256_load_ps(lse2 + i0);
        const __m256 base = _mm256_blendv_ps(l, _mm256_setzero_ps(), _mm256_cmp_ps(l, neg_inf, _CMP_EQ_OQ));
        float *s = st + i0;
        for (int j = 0; j < nj; j++, s += br) { // hidden (-inf) scores give 0 whatever lse2 holds
            const __m256 x = _mm256_load_ps(s);
            const __m256 seen = _mm256_cmp_ps(x, neg_inf, _CMP_NEQ_UQ);
            _mm256_store_ps(s, _mm256_and_ps(seen, exp2_nonpos_ps(_mm256_sub_ps(x, base))));
        }
    }
}

static void bwd_ds_avx2(const float *pt, float *dst, int nj, int br, const float *rowdot) {
    for (int i0 = 0; i0 < br; i0 += 8) {
        const __m256 r = _mm256_load_ps(rowdot + i0);
        for (int j = 0; j < nj; j++) {
            const int64_t e = (int64_t)j * br + i0;
            const __m256 pe = _mm256_load_ps(pt + e);
            const __m256 nz = _mm256_cmp_ps(pe, _mm256_setzero_ps(), _CMP_NEQ_UQ); // dS = 0 where P = 0
            _mm256_store_ps(dst + e, _mm256_and_ps(nz, _mm256_mul_ps(pe, _mm256_sub_ps(_mm256_load_ps(dst + e), r))));
        }
    }
}

// F16C converts half exactly; bfloat16 is the top half of a float.
// 8 elements of a k or v row of type dt from element i, as floats; `n` < 8 reads only n of them
// (the others are 0).
static inline __attribute__((always_inline)) __m256 load_kv8(const void *p, attn_dtype dt, int64_t i, int n) {
    if (n < 8) {
        float t[8] = {0};
        for (int c = 0; c < n; c++) t[c] = attn__kv_at(p, dt, i + c);
        return _mm256_loadu_ps(t);
    }
    if (dt == ATTN_DTYPE_F32) return _mm256_loadu_ps((const float *)p + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (dt == ATTN_DTYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); // bfloat16
}

static inline __attribute__((always_inline)) __m256 load_f8(const float *p, int n) {
    if (n == 8) return _mm256_loadu_ps(p);
    float t[8] = {0};
    for (int c = 0; c < n; c++) t[c] = p[c];
    return _mm256_loadu_ps(t);
}

// The four sums of 8 lanes each of a0..a3.
static inline __attribute__((always_inline)) __m128 sum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 s01 = _mm256_hadd_ps(a0, a1), s23 = _mm256_hadd_ps(a2, a3);
    const __m256 s0123 = _mm256_hadd_ps(s01, s23);
    return _mm_add_ps(_mm256_castps256_ps128(s0123), _mm256_extractf128_ps(s0123, 1));
}

// One step of qk_rows_block: n (<= 8) elements from d of NK keys (at their offsets `at`) and NR rows,
// the keys' lines DECODE_PF_BYTES on requested first with `prefetch`.
static inline __attribute__((always_inline)) void qk_step(const attn_dtype dt, const int NR, const int NK,
                                                          const void *k, const int64_t *at, const float *const *qr,
                                                          int d, int n, bool prefetch, __m256 *acc) {
    if (prefetch) {
        ATTN_UNROLL
        for (int c = 0; c < NK; c++) decode_prefetch(k, dt, at[c] + d);
    }
    __m256 kv[8];
    ATTN_UNROLL
    for (int c = 0; c < NK; c++) kv[c] = load_kv8(k, dt, at[c] + d, n);
    ATTN_UNROLL
    for (int r = 0; r < NR; r++) {
        const __m256 x = load_f8(qr[r] + d, n);
        ATTN_UNROLL
        for (int c = 0; c < NK; c++) acc[r * NK + c] = _mm256_fmadd_ps(kv[c], x, acc[r * NK + c]);
    }
}

// NR query rows against NK keys at a time (NR * NK accumulators, 12 or 8, a multiple of 4; each q
// vector loaded once for the NK keys, each key vector once for the NR rows): rows past nr repeat
// row 0 and a tile's last keys (nj not a multiple of NK) its last key. Every (row, key) sum runs
// along d in one accumulator and is reduced by sum4, so its bits do not depend on NR, NK or the
// key's place in the group. NR = 4 takes blocks of three or four rows, 2 and 1 the few rows of
// decoding without GQA, which would otherwise spend four rows' products on one.
static inline __attribute__((always_inline)) void qk_rows_block(const attn_dtype dt, const int NR, const int NK,
                                                                const void *k, int64_t ks_row, int nj, int D,
                                                                const float *q, int nr, float *s, int64_t s_r,
                                                                int64_t s_j, bool prefetch) {
    const int d8 = D / 8 * 8, line = decode_line_elems(dt);
    const float *qr[4];
    ATTN_UNROLL
    for (int r = 0; r < NR; r++) qr[r] = q + (r < nr ? (int64_t)r * D : 0);
    for (int j = 0; j < nj; j += NK) {
        int64_t at[8];
        ATTN_UNROLL
        for (int c = 0; c < NK; c++) at[c] = (int64_t)(j + c < nj ? j + c : nj - 1) * ks_row;
        __m256 acc[12];
        ATTN_UNROLL
        for (int x = 0; x < NR * NK; x++) acc[x] = _mm256_setzero_ps();
        int d = 0; // whole vectors, then a partial one (two loops: one would test n at every step)
        for (; d < d8; d += 8) qk_step(dt, NR, NK, k, at, qr, d, 8, prefetch && d % line == 0, acc);
        if (d < D) qk_step(dt, NR, NK, k, at, qr, d, D - d, prefetch && d % line == 0, acc);
        float out[12]; // out[c * NR + r]: key c, row r
        ATTN_UNROLL
        for (int i = 0; i < NR * NK; i += 4) // vector i + t: key (i + t) / NR, row (i + t) % NR
            _mm_storeu_ps(out + i, sum4(acc[(i % NR) * NK + i / NR], acc[((i + 1) % NR) * NK + (i + 1) / NR],
                                        acc[((i + 2) % NR) * NK + (i + 2) / NR],
                                        acc[((i + 3) % NR) * NK + (i + 3) / NR]));
        const int nk = nj - j < NK ? nj - j : NK;
        float *sj = s + (int64_t)j * s_j;
        if (NR == 4 && nr == 4 && s_r == 1) { // a key's four scores adjacent (the tile layout)
            for (int c = 0; c < nk; c++) _mm_storeu_ps(sj + c * s_j, _mm_loadu_ps(out + 4 * c));
        } else {
            for (int c = 0; c < nk; c++)
                for (int r = 0; r < nr; r++) sj[c * s_j + r * s_r] = out[c * NR + r];
        }
    }
}

static inline __attribute__((always_inline)) void qk_rows_impl(const attn_dtype dt, const void *k, int64_t ks_row,
                                                               int nj, int D, const float *q, int rows, float *s,
                                                               int64_t s_r, int64_t s_j) {
    for (int r0 = 0; r0 < rows; r0 += 4) {
        const int nr = rows - r0 < 4 ? rows - r0 : 4;
        const float *qb = q + (int64_t)r0 * D;
        float *sb = s + (int64_t)r0 * s_r;
        if (nr >= 3) qk_rows_block(dt, 4, 3, k, ks_row, nj, D, qb, nr, sb, s_r, s_j, r0 == 0);
        else if (nr == 2) qk_rows_block(dt, 2, 4, k, ks_row, nj, D, qb, nr, sb, s_r, s_j, r0 == 0);
        else qk_rows_block(dt, 1, 8, k, ks_row, nj, D, qb, nr, sb, s_r, s_j, r0 == 0);
    }
}

static void qk_rows_avx2(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const float *q, int rows,
                         float *s, int64_t s_r, int64_t s_j) {
    if (dt == ATTN_DTYPE_F16) qk_rows_impl(ATTN_DTYPE_F16, k, ks_row, nj, D, q, rows, s, s_r, s_j);
    else if (dt == ATTN_DTYPE_BF16) qk_rows_impl(ATTN_DTYPE_BF16, k, ks_row, nj, D, q, rows, s, s_r, s_j);
    else qk_rows_impl(ATTN_DTYPE_F32, k, ks_row, nj, D, q, rows, s, s_r, s_j);
}

// pv_rows over NR rows and the NV vectors of columns from e (NR * NV <= 8 accumulators; `full`:
// all 8 * NV columns inside the row, known when compiled; else NV is 1 and the row's last Dv - e < 8
// columns): per key, the value vectors and the rows' weights, adjacent in the tile (pp[0 .. NR - 1],
// pp advancing by ldp), broadcast. Row r's sums are left in out[r * NV ..].
static inline __attribute__((always_inline)) void pv_cols(const attn_dtype dt, const int NR, const int NV,
                                                          const bool full, const void *v, int64_t vs_row, int nj,
                                                          int Dv, int e, const float *pp, int64_t ldp, bool prefetch,
                                                          __m256 out[8]) {
    __m256 c[8];
    ATTN_UNROLL
    for (int x = 0; x < NR * NV; x++) c[x] = _mm256_setzero_ps();
    for (int j = 0; j < nj; j++, pp += ldp) {
        const int64_t vj = (int64_t)j * vs_row + e;
        if (prefetch) decode_prefetch_cols(v, dt, vj, vs_row, e, 8 * NV, Dv);
        __m256 vv[8];
        ATTN_UNROLL
        for (int x = 0; x < NV; x++) vv[x] = load_kv8(v, dt, vj + 8 * x, full ? 8 : Dv - e);
        ATTN_UNROLL
        for (int r = 0; r < NR; r++) {
            const __m256 w = _mm256_broadcast_ss(pp + r);
            ATTN_UNROLL
            for (int x = 0; x < NV; x++) c[r * NV + x] = _mm256_fmadd_ps(w, vv[x], c[r * NV + x]);
        }
    }
    ATTN_UNROLL
    for (int x = 0; x < NR * NV; x++) out[x] = c[x];
}

// pv_cols' sums for NR rows (nr of them real) over the w <= 8 NV columns from e, added to the rows of
// o scaled by alpha.
static inline __attribute__((always_inline)) void pv_rows_cols(const attn_dtype dt, const int NR, const int NV,
                                                           const bool full, const void *v, int64_t vs_row, int nj,
                                                           int Dv, int e, int w, const float *pt, int64_t ldp,
                                                           const float *alpha, int nr, float *o, int64_t ldo,
                                                           bool prefetch) {
    __m256 c[8];
    pv_cols(dt, NR, NV, full, v, vs_row, nj, Dv, e, pt, ldp, prefetch, c);
    ATTN_UNROLL
    for (int r = 0; r < NR; r++) {
        float *orow = o + (int64_t)r * ldo + e;
        const __m256 a = _mm256_set1_ps(r < nr ? alpha[r] : 0.0f);
        ATTN_UNROLL
        for (int x = 0; x < NV; x++) { // a o + c, rounded twice (a product, then a sum), as before
            const int n = r < nr ? w - 8 * x : 0;
            if (n >= 8) {
                const __m256 y = _mm256_add_ps(_mm256_mul_ps(a, _mm256_loadu_ps(orow + 8 * x)), c[r * NV + x]);
                _mm256_storeu_ps(orow + 8 * x, y);
            } else if (n > 0) {
                const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
                const __m256 y = _mm256_add_ps(_mm256_mul_ps(a, _mm256_maskload_ps(orow + 8 * x, m)), c[r * NV + x]);
                _mm256_maskstore_ps(orow + 8 * x, m, y);
            }
        }
    }
}

// Blocks of NR rows (4, or 2 and 1 for the last rows) and W = 64 / NR columns; the last Dv % W
// columns in narrower blocks of whole vectors (32, 16 and 8 columns, each at most once) and a last
// partial vector, so that no product is spent on columns past Dv.
static inline __attribute__((always_inline)) void pv_rows_block(const attn_dtype dt, const int NR, const void *v,
                                                                int64_t vs_row, int nj, int Dv, const float *pt,
                                                                int64_t ldp, const float *alpha, int nr, float *o,
                                                                int64_t ldo, bool prefetch) {
    const int NV = 8 / NR, W = 8 * NV;
    int e = 0;
    for (; e + W <= Dv; e += W)
        pv_rows_cols(dt, NR, NV, true, v, vs_row, nj, Dv, e, W, pt, ldp, alpha, nr, o, ldo, prefetch);
    if (NV > 4 && Dv - e >= 32) {
        pv_rows_cols(dt, NR, 4, true, v, vs_row, nj, Dv, e, 32, pt, ldp, alpha, nr, o, ldo, prefetch);
        e += 32;
    }
    if (NV > 2 && Dv - e >= 16) {
        pv_rows_cols(dt, NR, 2, true, v, vs_row, nj, Dv, e, 16, pt, ldp, alpha, nr, o, ldo, prefetch);
        e += 16;
    }
    if (Dv - e >= 8) {
        pv_rows_cols(dt, NR, 1, true, v, vs_row, nj, Dv, e, 8, pt, ldp, alpha, nr, o, ldo, prefetch);
        e += 8;
    }
    if (e < Dv) pv_rows_cols(dt, NR, 1, false, v, vs_row, nj, Dv, e, Dv - e, pt, ldp, alpha, nr, o, ldo, prefetch);
}

static inline __attribute__((always_inline)) void pv_rows_impl(const attn_dtype dt, const void *v, int64_t vs_row,
                                                               int nj, int Dv, const float *pt, int64_t ldp,
                                                               const float *alpha, int rows, float *o, int64_t ldo) {
    for (int r0 = 0; r0 < rows; r0 += 4) {
        const int nr = rows - r0 < 4 ? rows - r0 : 4;
        float *ob = o + (int64_t)r0 * ldo;
        if (nr >= 3) pv_rows_block(dt, 4, v, vs_row, nj, Dv, pt + r0, ldp, alpha + r0, nr, ob, ldo, r0 == 0);
        else if (nr == 2) pv_rows_block(dt, 2, v, vs_row, nj, Dv, pt + r0, ldp, alpha + r0, nr, ob, ldo, r0 == 0);
        else pv_rows_block(dt, 1, v, vs_row, nj, Dv, pt + r0, ldp, alpha + r0, nr, ob, ldo, r0 == 0);
    }
}

static void pv_rows_avx2(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt, int64_t ldp,
                         const float *alpha, int rows, float *o, int64_t ldo) {
    if (dt == ATTN_DTYPE_F16) pv_rows_impl(ATTN_DTYPE_F16, v, vs_row, nj, Dv, pt, ldp, alpha, rows, o, ldo);
    else if (dt == ATTN_DTYPE_BF16) pv_rows_impl(ATTN_DTYPE_BF16, v, vs_row, nj, Dv, pt, ldp, alpha, rows, o, ldo);
    else pv_rows_impl(ATTN_DTYPE_F32, v, vs_row, nj, Dv, pt, ldp, alpha, rows, o, ldo);
}

static void half_to_f32_avx2(attn_dtype dt, const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    if (dt == ATTN_DTYPE_F16) {
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
        for (; i < n; i++) y[i] = attn__f16_to_f32(x[i]);
    } else {
        for (; i + 8 <= n; i += 8) {
            const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
            _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
        for (; i < n; i++) y[i] = attn__bf16_to_f32(x[i]);
    }
}

// cpu.h's f32_to_half, also the AVX-512 tables': F16 by F16C's vcvtps2ph (to nearest even; NaN
// quiet with the top of its payload, as attn__f32_to_f16), BF16 by attn__f32_to_bf16's integer
// rounding on eight lanes, two vectors packed to sixteen halves; the last n % 16 values scalar.
void attn__f32_to_half_avx2(attn_dtype dt, const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    if (dt == ATTN_DTYPE_F16) {
        for (; i + 16 <= n; i += 16) {
            _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
            _mm_storeu_si128((__m128i *)(y + i + 8), _mm256_cvtps_ph(_mm256_loadu_ps(x + i + 8), _MM_FROUND_TO_NEAREST_INT));
        }
        for (; i < n; i++) y[i] = attn__f32_to_f16(x[i]);
        return;
    }
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i magnitude = _mm256_set1_epi32(0x7fffffff), quiet = _mm256_set1_epi32(0x40);
    for (; i + 16 <= n; i += 16) {
        __m256i h[2];
        for (int v = 0; v < 2; v++) {
            const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i + 8 * v));
            const __m256i nearest = _mm256_srli_epi32(
                _mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(_mm256_srli_epi32(u, 16), one)), 16);
            const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);
            h[v] = _mm256_blendv_epi8(nearest, nan, _mm256_cmpgt_epi32(_mm256_and_si256(u, magnitude), inf));
        }
        // packus interleaves the 128-bit lanes: quadwords 0, 2, 1, 3 after it
        _mm256_storeu_si256((__m256i *)(y + i), _mm256_permute4x64_epi64(_mm256_packus_epi32(h[0], h[1]), 0xD8));
    }
    for (; i < n; i++) y[i] = attn__f32_to_bf16(x[i]);
}

// The high and low 32 bits of the eight 32 x 32-bit products x * m: even lanes by one
// vpmuludq, odd lanes by one on the shifted vector, blended back into place.
static inline void mul_hilo(__m256i x, __m256i m, __m256i *hi, __m256i *lo) {
    const __m256i even = _mm256_mul_epu32(x, m), odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
    *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

// philox_lanes (cpu.h): Philox4x32-10 on eight counters per vector, two vectors.
void attn__philox_lanes_avx2(uint32_t c0, int64_t i0, uint32_t c2, uint32_t c3, uint64_t seed,
                             uint32_t w[4][ATTN_PHILOX_LANES]) {
    const __m256i m0 = _mm256_set1_epi32((int)0xD2511F53u), m1 = _mm256_set1_epi32((int)0xCD9E8D57u);
    for (int half = 0; half < ATTN_PHILOX_LANES / 8; half++) {
        __m256i a = _mm256_set1_epi32((int)c0), c = _mm256_set1_epi32((int)c2), d = _mm256_set1_epi32((int)c3);
        __m256i b = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)(i0 + 8 * half)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
        for (int round = 0; round < 10; round++) {
            if (round > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
            __m256i hi0, lo0, hi1, lo1;
            mul_hilo(a, m0, &hi0, &lo0);
            mul_hilo(c, m1, &hi1, &lo1);
            a = _mm256_xor_si256(_mm256_xor_si256(hi1, b), _mm256_set1_epi32((int)k0));
            c = _mm256_xor_si256(_mm256_xor_si256(hi0, d), _mm256_set1_epi32((int)k1));
            b = lo1, d = lo0;
        }
        _mm256_storeu_si256((__m256i *)(w[0] + 8 * half), a);
        _mm256_storeu_si256((__m256i *)(w[1] + 8 * half), b);
        _mm256_storeu_si256((__m256i *)(w[2] + 8 * half), c);
        _mm256_storeu_si256((__m256i *)(w[3] + 8 * half), d);
    }
}

// The entries both forms of the AVX2 table share.
#define AVX2_ENTRIES \
    .isa = ATTN_ISA_AVX2, \
    .gemm = gemm_avx2, \
    .softmax = softmax_avx2, \
    .pv = pv_avx2, \
    .exp2 = exp2_avx2, \
    .bwd_p = bwd_p_avx2, \
    .bwd_ds = bwd_ds_avx2, \
    .qk_rows = qk_rows_avx2, \
    .pv_rows = pv_rows_avx2, \
    .half_to_f32 = half_to_f32_avx2, \
    .f32_to_half = attn__f32_to_half_avx2, \
    .dequant_rows = attn__dequant_rows_avx2, \
    .philox_lanes = attn__philox_lanes_avx2

const attn__kernels attn__kernels_avx2 = {
    .name = "avx2",
    AVX2_ENTRIES,
    .qk_rows_q = attn__qk_rows_q_avx2,
    .pv_rows_q = attn__pv_rows_q_avx2,
    .prep_q = attn__prep_q_avx2,
};

#if defined(ATTN_HAVE_AVXVNNI)
// The AVX2 table with the Q8_0 and Q4_0 decode kernels on AVX-VNNI's vpdpbusd and vpdpwssd
// (quant_kernels_avxvnni.c; the same bits): attn__kernels_for gives it to ATTN_ISA_AVX2 where the
// CPU reports AVX-VNNI, and attn__kernel_tables lists both.
const attn__kernels attn__kernels_avx2_vnni = {
    .name = "avx2+vnni",
    AVX2_ENTRIES,
    .qk_rows_q = attn__qk_rows_q_avxvnni,
    .pv_rows_q = attn__pv_rows_q_avxvnni,
    .prep_q = attn__prep_q_avxvnni,
};
#endif

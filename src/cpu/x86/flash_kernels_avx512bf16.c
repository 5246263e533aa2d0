// flash_kernels_avx512bf16.c - the bf16 products of the fused forward on vdpbf16ps (AVX512-BF16:
// each float32 lane adds the two products of a pair of bf16 values to its sum; 32 products per
// instruction, twice an FMA's), and the packing they read. Compiled with -mavx512f -mavx512bw
// -mavx512bf16 for this file only; flash_kernels_avx512.c builds the "avx512bf16" table from the
// AVX-512 kernels and these, chosen at run time on CPUs with AVX512-BF16 (cpu.h has the layouts).
#include <math.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/unroll.h"
#include "half.h"
#include "cpu/x86/simd512.h"

#define INLINE static inline __attribute__((always_inline))

// vcvtne2ps2bf16 puts row r's 16 values in words 0-15 and row r+1's in 16-31; vpermw interleaves them.
INLINE __m512i interleave_words(void) {
    return _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
                            19, 3, 18, 2, 17, 1, 16, 0);
}

// The weights e0 and e1 of two consecutive keys, 16 columns, as 16 bf16 pairs at pp (softmax512.h).
#define SOFTMAX512_STORE_PAIRS(pp, e0, e1) \
    _mm512_storeu_si512((void *)(pp), _mm512_permutexvar_epi16(interleave_words(), (__m512i)_mm512_cvtne2ps_pbh(e1, e0)))
#include "cpu/x86/softmax512.h"

// The same bits as pairs of bf16 (a vector cast: no instruction; memcpy made gcc bounce a register
// through the stack in the 6 x 4 block's loop).
INLINE __m512bh as_bh(__m512i x) { return (__m512bh)x; }

// One pair of bf16 values (two adjacent elements) broadcast to every lane.
INLINE __m512bh bcast_pair(const uint16_t *p) {
    int32_t w;
    memcpy(&w, p, sizeof w);
    return as_bh(_mm512_set1_epi32(w));
}

// C[r][x*16 ..] = (rowscale ? rowscale[r] C[r][..] : 0) + scale sum_e A(r, e) . B(e, x*16 ..) for
// R rows and C registers of columns (R x C accumulators).
INLINE void gemm_block(const uint16_t *A, int64_t a_rs, int64_t a_ps, int K2, const uint16_t *B, int64_t ldb,
                       float *Cm, int64_t ldc, const float *rowscale, float scale, const int R, const int C) {
    __m512 c[6][4];
ATTN_UNROLL
    for (int r = 0; r < R; r++)
ATTN_UNROLL
        for (int x = 0; x < C; x++) c[r][x] = _mm512_setzero_ps();
    for (int e = 0; e < K2; e++) {
        const uint16_t *b = B + (int64_t)e * 2 * ldb, *a = A + (int64_t)e * a_ps;
        __m512bh bv[4];
ATTN_UNROLL
        for (int x = 0; x < C; x++) bv[x] = as_bh(_mm512_loadu_si512((const void *)(b + 32 * x)));
ATTN_UNROLL
        for (int r = 0; r < R; r++) {
            const __m512bh av = bcast_pair(a + (int64_t)r * a_rs);
ATTN_UNROLL
            for (int x = 0; x < C; x++) c[r][x] = _mm512_dpbf16_ps(c[r][x], av, bv[x]);
        }
    }
    const __m512 s = _mm512_set1_ps(scale);
ATTN_UNROLL
    for (int r = 0; r < R; r++) {
        float *row = Cm + (int64_t)r * ldc;
        if (rowscale != NULL) {
            const __m512 g = _mm512_set1_ps(rowscale[r]);
ATTN_UNROLL
            for (int x = 0; x < C; x++)
                _mm512_storeu_ps(row + 16 * x, _mm512_fmadd_ps(g, _mm512_loadu_ps(row + 16 * x), _mm512_mul_ps(s, c[r][x])));
        } else {
ATTN_UNROLL
            for (int x = 0; x < C; x++) _mm512_storeu_ps(row + 16 * x, _mm512_mul_ps(s, c[r][x]));
        }
    }
}

// All N columns of R rows.
INLINE void gemm_rows(const uint16_t *A, int64_t a_rs, int64_t a_ps, int K2, const uint16_t *B, int64_t ldb, int N,
                      float *Cm, int64_t ldc, const float *rowscale, float scale, const int R) {
    int n = 0;
    for (; n + 64 <= N; n += 64) gemm_block(A, a_rs, a_ps, K2, B + 2 * n, ldb, Cm + n, ldc, rowscale, scale, R, 4);
    if (n + 32 <= N) {
        gemm_block(A, a_rs, a_ps, K2, B + 2 * n, ldb, Cm + n, ldc, rowscale, scale, R, 2);
        n += 32;
    }
    if (n < N) gemm_block(A, a_rs, a_ps, K2, B + 2 * n, ldb, Cm + n, ldc, rowscale, scale, R, 1);
}

void attn__gemm_bf16_avx512(const uint16_t *A, int64_t a_rs, int64_t a_ps, int M, int K2, const uint16_t *B,
                            int64_t ldb, int N, float *Cm, int64_t ldc, const float *rowscale, float scale) {
    int m = 0;
    for (; m + 6 <= M; m += 6)
        gemm_rows(A + (int64_t)m * a_rs, a_rs, a_ps, K2, B, ldb, N, Cm + (int64_t)m * ldc, ldc,
                  rowscale != NULL ? rowscale + m : NULL, scale, 6);
    for (; m + 2 <= M; m += 2)
        gemm_rows(A + (int64_t)m * a_rs, a_rs, a_ps, K2, B, ldb, N, Cm + (int64_t)m * ldc, ldc,
                  rowscale != NULL ? rowscale + m : NULL, scale, 2);
    if (m < M)
        gemm_rows(A + (int64_t)m * a_rs, a_rs, a_ps, K2, B, ldb, N, Cm + (int64_t)m * ldc, ldc,
                  rowscale != NULL ? rowscale + m : NULL, scale, 1);
}

void attn__softmax_pairs_bf16_avx512(float *st, int nj, int br, int64_t ld, float *m, float *l, float *alpha,
                                     uint16_t *pp, const int32_t *span) {
    softmax512_tile(st, nj, br, ld, m, l, alpha, pp, span);
}

void attn__pack_pairs_bf16_avx512(const float *x, int64_t ld, int rows, int n, uint16_t *y) {
    const __m512i inter = interleave_words();
    for (int r = 0; r < rows; r += 2) {
        const float *x0 = x + (int64_t)r * ld, *x1 = x0 + ld;
        uint16_t *yr = y + (int64_t)r * n;
        for (int c = 0; c < n; c += 16) {
            const __m512 a = _mm512_loadu_ps(x0 + c), b = r + 1 < rows ? _mm512_loadu_ps(x1 + c) : _mm512_setzero_ps();
            const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(b, a);
            _mm512_storeu_si512((void *)(yr + 2 * c), _mm512_permutexvar_epi16(inter, w));
        }
    }
}

void attn__pair_rows_bf16_avx512(const uint16_t *x, int64_t ld, int rows, int cols, int n, uint16_t *y) {
    const int c16 = cols / 16 * 16;
    for (int r = 0; r < rows; r += 2) {
        const uint16_t *x0 = x + (int64_t)r * ld, *x1 = r + 1 < rows ? x0 + ld : NULL;
        uint16_t *yr = y + (int64_t)r * n;
        for (int c = 0; c < c16; c += 16) {
            const __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x0 + c)));
            const __m512i b = x1 != NULL ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x1 + c)))
                                         : _mm512_setzero_si512();
            _mm512_storeu_si512((void *)(yr + 2 * c), _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
        }
        for (int c = c16; c < n; c++) {
            yr[2 * c] = c < cols ? x0[c] : 0;
            yr[2 * c + 1] = c < cols && x1 != NULL ? x1[c] : 0;
        }
    }
}

void attn__round_bf16_avx512(const float *x, int64_t n, uint16_t *y) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) { // words 0-15 from the second operand: the elements in order
        const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
        _mm512_storeu_si512((void *)(y + i), (__m512i)h);
    }
    for (; i < n; i += 16) {
        const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_setzero_ps(), _mm512_loadu_ps(x + i));
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_castsi512_si256((__m512i)h));
    }
}

// The 32 bf16 values of v times 2^k: the exponent fields moved when every value is normal and stays
// so (exact), else each through float32 (its 64 bytes given again in src).
INLINE __m512i scale_row_pow2(__m512i v, int k, const uint16_t *src) {
    if (k == 0) return v;
    const int lo = k < 0 ? 1 - k : 1, hi = k > 0 ? 254 - k : 254;
    const __m512i ex = _mm512_and_si512(_mm512_srli_epi16(v, 7), _mm512_set1_epi16(0xff));
    const __mmask32 ok = _mm512_cmpge_epu16_mask(ex, _mm512_set1_epi16((short)lo)) &
                         _mm512_cmple_epu16_mask(ex, _mm512_set1_epi16((short)hi));
    if (ok == 0xffffffffu) return _mm512_add_epi16(v, _mm512_set1_epi16((short)(k * 128)));
    uint16_t h[32];
    for (int i = 0; i < 32; i++) h[i] = attn__bf16_times_pow2(src[i], k);
    return _mm512_loadu_si512((const void *)h);
}

// r[c] = column c of the 16 x 16 matrix of 32-bit elements whose row t is r[t].
INLINE void transpose16_epi32(__m512i r[16]) {
    __m512i t[16], u[16], v[16];
ATTN_UNROLL
    for (int j = 0; j < 16; j += 2)
        t[j] = _mm512_unpacklo_epi32(r[j], r[j + 1]), t[j + 1] = _mm512_unpackhi_epi32(r[j], r[j + 1]);
ATTN_UNROLL
    for (int g = 0; g < 16; g += 4) { // u[g + c], 128-bit lane L: rows g..g+3 of column 4L + c
        u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]), u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]), u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
ATTN_UNROLL
    for (int c = 0; c < 4; c++) {
        v[c] = _mm512_shuffle_i32x4(u[c], u[c + 4], 0x88), v[c + 4] = _mm512_shuffle_i32x4(u[c], u[c + 4], 0xdd);
        v[c + 8] = _mm512_shuffle_i32x4(u[c + 8], u[c + 12], 0x88);
        v[c + 12] = _mm512_shuffle_i32x4(u[c + 8], u[c + 12], 0xdd);
    }
ATTN_UNROLL
    for (int c = 0; c < 8; c++)
        r[c] = _mm512_shuffle_i32x4(v[c], v[c + 8], 0x88), r[c + 8] = _mm512_shuffle_i32x4(v[c], v[c + 8], 0xdd);
}

void attn__transpose_pairs_bf16_avx512(const uint16_t *x, int64_t ld, int rows, int npairs, int w, int k, uint16_t *y) {
    const int e16 = npairs / 16 * 16;
    // every line requested first: the blocks below each wait for 16 rows' loads
    for (int i = 0; i < rows; i++)
        for (int b = 0; b < 4 * npairs; b += 64) _mm_prefetch((const char *)(x + (int64_t)i * ld) + b, _MM_HINT_T0);
    for (int i0 = 0; i0 < w; i0 += 16) {
        for (int e0 = 0; e0 < e16; e0 += 16) { // blocks of 16 rows x 16 pairs
            __m512i r[16];
            for (int t = 0; t < 16; t++) {
                r[t] = _mm512_setzero_si512();
                if (i0 + t >= rows) continue;
                const uint16_t *src = x + (int64_t)(i0 + t) * ld + 2 * e0;
                r[t] = scale_row_pow2(_mm512_loadu_si512((const void *)src), k, src);
            }
            transpose16_epi32(r);
            for (int t = 0; t < 16; t++) _mm512_storeu_si512((void *)(y + 2 * ((int64_t)(e0 + t) * w + i0)), r[t]);
        }
        for (int i = i0; i < i0 + 16; i++) // the last pairs, fewer than 16
            for (int e = e16; e < npairs; e++)
                for (int t = 0; t < 2; t++)
                    y[2 * ((int64_t)e * w + i) + t] = i < rows ? attn__bf16_times_pow2(x[(int64_t)i * ld + 2 * e + t], k) : 0;
    }
}

void attn__scale_to_bf16_avx512(const float *x, int64_t n, float scale, uint16_t *y) {
    const __m512 s = _mm512_set1_ps(scale);
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff), abs = _mm512_set1_epi32(0x7fffffff);
    const __m512i inf = _mm512_set1_epi32(0x7f800000), quiet = _mm512_set1_epi32(0x40);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) { // the integer rounding of attn__f32_to_bf16, 16 lanes at a time
        const __m512i u = _mm512_castps_si512(_mm512_mul_ps(s, _mm512_loadu_ps(x + i)));
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(half, lsb)), 16);
        const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs), inf); // both non-negative
        r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), quiet);
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtepi32_epi16(r));
    }
    for (; i < n; i++) y[i] = attn__f32_to_bf16(x[i] * scale);
}

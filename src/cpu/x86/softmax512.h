// softmax512.h - the AVX-512 exp2 and the online softmax of a key tile (cpu.h: softmax), shared by
// flash_kernels_avx512.c and flash_kernels_avx512bf16.c. The latter also writes the weights as bf16
// pairs for the dot products (softmax_pairs_bf16), which needs its instructions: the includer
// defines SOFTMAX512_STORE_PAIRS(pp, e0, e1), storing the weights e0 and e1 of two consecutive
// keys for 16 columns at pp (32 bf16, interleaved), and INLINE.
#ifndef ATTN_CPU_X86_SOFTMAX512_H
#define ATTN_CPU_X86_SOFTMAX512_H

#include <math.h>
#include <stdint.h>

#include "cpu/cpu.h"
#include "cpu/x86/simd512.h"

// exp2_ps512 (below) without its upper clamp, for x finite, -inf or NaN (+inf gives NaN; x >= 129
// gives +inf as there): the softmax's arguments, scores less a base no smaller than them or, in
// softmax512_tile's first try, less the running max, where a score more than 8 larger (so +inf)
// makes the tile start over. x below -126 (and -inf) gives 0 without any lane computing a result
// below 2^-126: on Intel's cores an instruction that makes a denormal result (or takes one in)
// takes a microcode assist, which cost a causal forward up to 30% of its time there (its masked
// keys' -inf; BENCHMARKS.md).
INLINE __m512 exp2_ps512_upto129(__m512 x) {
    const __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ); // NaN too
    x = _mm512_max_ps(_mm512_set1_ps(-126.0f), x);
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(ATTN_EXP2_C6);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(ATTN_EXP2_C5));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(ATTN_EXP2_C4));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(ATTN_EXP2_C3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(ATTN_EXP2_C2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(ATTN_EXP2_C1));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(normal, _mm512_scalef_ps(p, n)); // n >= -126, p >= 1 at n = -126: normal
}

// 2^x as p(f) * 2^n with the polynomial of attn__exp2f: within 1 ulp where the result is normal;
// -inf and x < -126 give 0 (no denormal results: the generic kernel's are 0 below about 2^-126.5),
// x >= 129 and +inf give +inf (clamped first: inf - round(inf) would be NaN), NaN stays NaN (min and
// max take x as their second operand).
INLINE __m512 exp2_ps512(__m512 x) { return exp2_ps512_upto129(_mm512_min_ps(_mm512_set1_ps(129.0f), x)); }

// The weights 2^(s - base) of 16 columns (st + i0, rows ld apart) for keys [jb, je) of nj (jb even),
// into pp as pairs (rows of br pairs; 0 for the pairs outside) or back into st (pp NULL: jb = 0, je = nj); returns
// their sum (the even keys' and the odd keys' summed apart, then added) and *seen the largest
// score read (base where none is larger).
INLINE __m512 softmax512_exps(float *st, int i0, int br, int64_t ld, int jb, int je, int nj, __m512 base,
                              uint16_t *pp, __m512 *seen) {
    __m512 sum0 = _mm512_setzero_ps(), sum1 = sum0, mx0 = base, mx1 = base;
    int j = 0;
    for (; j < jb; j += 2) SOFTMAX512_STORE_PAIRS(pp + 2 * ((int64_t)(j / 2) * br + i0), sum0, sum0);
    float *s = st + i0 + (int64_t)jb * ld;
    for (; j + 2 <= je; j += 2, s += 2 * ld) {
        const __m512 x0 = _mm512_load_ps(s), x1 = _mm512_load_ps(s + ld);
        mx0 = _mm512_max_ps(mx0, x0), mx1 = _mm512_max_ps(mx1, x1);
        const __m512 e0 = exp2_ps512_upto129(_mm512_sub_ps(x0, base)), e1 = exp2_ps512_upto129(_mm512_sub_ps(x1, base));
        if (pp != NULL) SOFTMAX512_STORE_PAIRS(pp + 2 * ((int64_t)(j / 2) * br + i0), e0, e1);
        else _mm512_store_ps(s, e0), _mm512_store_ps(s + ld, e1);
        sum0 = _mm512_add_ps(sum0, e0), sum1 = _mm512_add_ps(sum1, e1);
    }
    if (j < je) { // an odd last key: its partner is past nj or hidden (weight 0)
        const __m512 x0 = _mm512_load_ps(s);
        mx0 = _mm512_max_ps(mx0, x0);
        const __m512 e0 = exp2_ps512_upto129(_mm512_sub_ps(x0, base));
        if (pp != NULL) SOFTMAX512_STORE_PAIRS(pp + 2 * ((int64_t)(j / 2) * br + i0), e0, _mm512_setzero_ps());
        else _mm512_store_ps(s, e0);
        sum0 = _mm512_add_ps(sum0, e0);
        j += 2;
    }
    for (; j < nj; j += 2) SOFTMAX512_STORE_PAIRS(pp + 2 * ((int64_t)(j / 2) * br + i0), _mm512_setzero_ps(), _mm512_setzero_ps());
    *seen = _mm512_max_ps(mx0, mx1);
    return _mm512_add_ps(sum0, sum1);
}

// The largest of m_old and the scores of 16 columns (st + i0, rows ld apart) for keys [jb, je): the
// maxima in softmax512_exps's order, so the same bits as its *seen for base m_old.
INLINE __m512 softmax512_max(const float *st, int i0, int64_t ld, int jb, int je, __m512 m_old) {
    __m512 mx0 = m_old, mx1 = m_old;
    const float *s = st + i0 + (int64_t)jb * ld;
    int j = jb;
    for (; j + 2 <= je; j += 2, s += 2 * ld) {
        mx0 = _mm512_max_ps(mx0, _mm512_load_ps(s));
        mx1 = _mm512_max_ps(mx1, _mm512_load_ps(s + ld));
    }
    if (j < je) mx0 = _mm512_max_ps(mx0, _mm512_load_ps(s));
    return _mm512_max_ps(mx0, mx1);
}

// How far (log2) a tile's scores may pass the running max before softmax512_tile's pairs take a new
// base: weights up to 2^8, exact in float32 and as wide as bf16 holds them.
#define SOFTMAX512_LAZY_MAX 8.0f

// The softmax update of cpu.h for br a multiple of 16 (st's rows ld apart). With pp (not NULL) the weights go to pp as
// bf16 pairs along the keys (pack_pairs_bf16's layout, (ceil(nj/2), br pairs); the pair of an odd
// last key holds 0) instead of back into st; the row sums are of the float weights either way.
// span (with pp only; NULL: every key) holds for each 16 columns c the keys [span[2c], span[2c+1])
// outside which their scores are -inf: those keys' max and exp are skipped and their pairs written
// 0 (exp2(-inf) = 0, and adding 0 leaves the sums as they are).
// With pp, 16 columns whose running maxima are all finite first take them as the base, in one pass
// (as FlashAttention-4 rescales only when the max grows by enough): where no score passes its
// column's max by more than SOFTMAX512_LAZY_MAX, m stays, alpha is 1 and l gains the sums; else the
// pass is redone on the tile's max as below. Either base gives the same softmax: the weights and l
// are scaled alike, and the weights' bf16 rounding is relative.
INLINE void softmax512_tile(float *st, int nj, int br, int64_t ld, float *m, float *l, float *alpha, uint16_t *pp,
                            const int32_t *span) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    for (int i0 = 0; i0 < br; i0 += 16) {
        const int jb = span != NULL ? span[i0 / 8] / 2 * 2 : 0, je = span != NULL ? span[i0 / 8 + 1] : nj;
        const __m512 m_old = _mm512_load_ps(m + i0);
        __m512 seen;
        const bool first_try = pp != NULL && _mm512_cmp_ps_mask(m_old, neg_inf, _CMP_EQ_OQ) == 0;
        if (first_try) {
            const __m512 sum = softmax512_exps(st, i0, br, ld, jb, je, nj, m_old, pp, &seen);
            const __m512 limit = _mm512_add_ps(m_old, _mm512_set1_ps(SOFTMAX512_LAZY_MAX));
            if (_mm512_cmp_ps_mask(seen, limit, _CMP_GT_OQ) == 0) {
                _mm512_store_ps(alpha + i0, _mm512_set1_ps(1.0f));
                _mm512_store_ps(l + i0, _mm512_add_ps(_mm512_load_ps(l + i0), sum));
                continue;
            }
        }
        // the tile's max: a first try that failed has read it already
        const __m512 mx = first_try ? seen : softmax512_max(st, i0, ld, jb, je, m_old);
        const __m512 base = _mm512_mask_mov_ps(mx, _mm512_cmp_ps_mask(mx, neg_inf, _CMP_EQ_OQ), _mm512_setzero_ps());
        const __m512 a = exp2_ps512(_mm512_sub_ps(m_old, base));
        const __m512 sum = softmax512_exps(st, i0, br, ld, jb, je, nj, base, pp, &seen);
        _mm512_store_ps(alpha + i0, a);
        _mm512_store_ps(l + i0, _mm512_fmadd_ps(a, _mm512_load_ps(l + i0), sum));
        _mm512_store_ps(m + i0, mx);
    }
}

#endif

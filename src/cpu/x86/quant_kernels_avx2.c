// quant_kernels_avx2.c - the decode row kernels of cpu.h (qk_rows_q, pv_rows_q, dequant_rows) for
// Q8_0 and Q4_0 keys and values, with AVX2, FMA3 and F16C (compiled with those flags for this file
// only). The AVX2 and AVX-512 tables both use them. The block helpers and the loops around the
// kernels (per element type, rows and key tiles) are quant_rows.h's, shared with the AVX-512 file.
//
// Blocks are dequantised in registers as they are loaded: 8 quants at a time are widened to int32
// and converted to float (Q4_0: the low nibbles of the block's 16 bytes are its values 0..15, the
// high ones 16..31). qk_rows multiplies them by the block's scale d (exact: q * d needs at most 19
// bits), so its products and sums are those of the float kernels on the dequantised values; it runs
// four query rows against two keys per pass (8 accumulators, each key vector loaded once for the
// four rows; the half-precision kernel's three keys leave no register for the scales). pv_rows instead folds d
// into the weights: per block of 32 columns it first forms each key's four weights times the
// block's scale (p * d, one rounding more than p * (q * d); the error bound of attn.h allows it),
// then runs the block's two halves of 16 columns over the keys with unscaled values (8
// accumulators: four rows, two vectors), which takes the scale's conversion and two multiplies
// out of every key's step.
//
// Prefetch (see decode_prefetch.h): qk_rows requests each key row's lines DECODE_PF_BYTES ahead as
// it reads the row; each pv_rows pass requests the half-block it reads, FLASH_BC rows on.
#include <immintrin.h>

#include "cpu/cpu.h"
#include "cpu/x86/decode_prefetch.h"
#include "cpu/x86/quant_kernels.h"
#include "cpu/x86/quant_rows.h"
#include "half.h"

// The scale d of the block at b, broadcast: as float16 (vpbroadcastw), then converted in the vector.
INLINE __m256 scale_of(const uint8_t *b) { return _mm256_cvtph_ps(_mm_set1_epi16((short)scale_bits(b))); }

// Values 8c .. 8c + 7 (c < 4) of the block at b as floats, not yet multiplied by its scale.
INLINE __m256 load8_unscaled(attn_dtype dt, const uint8_t *b, int c) {
    if (dt == ATTN_DTYPE_Q8_0) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * c))));
    __m256i n = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * (c % 2))));
    n = c < 2 ? _mm256_and_si256(n, _mm256_set1_epi32(15)) : _mm256_srli_epi32(n, 4);
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(n, _mm256_set1_epi32(8)));
}

// Values 8c .. 8c + 7 (c < 4) of the block at b, its scale d broadcast in `d`, as floats.
INLINE __m256 load8(attn_dtype dt, const uint8_t *b, __m256 d, int c) { return _mm256_mul_ps(load8_unscaled(dt, b, c), d); }

// Requests the lines of the `bytes` bytes from p, DECODE_PF_BYTES on, into L2.
INLINE void prefetch_row(const uint8_t *p, int bytes) {
    for (int x = 0; x < bytes; x += 64) _mm_prefetch((const char *)p + x + DECODE_PF_BYTES, _MM_HINT_T1);
}

// The four sums of 8 lanes each of a0..a3.
INLINE __m128 sum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 s01 = _mm256_hadd_ps(a0, a1), s23 = _mm256_hadd_ps(a2, a3);
    const __m256 s0123 = _mm256_hadd_ps(s01, s23);
    return _mm_add_ps(_mm256_castps256_ps128(s0123), _mm256_extractf128_ps(s0123, 1));
}

// Four query rows against two keys per pass (8 accumulators, the two keys' scales, their value
// vectors and a query vector: 13 of the 16 registers; three keys, as the half-precision kernel
// runs, would need 19 with the scales and spill); a tile's last key (nj odd) repeats. Every key's
// sum runs along d in the same order whatever its place in the pair.
INLINE void qk_rows_impl(const attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const float *q, int rows,
                         float *s, int64_t s_r, int64_t s_j) {
    const int row_bytes = D / ATTN_QBLOCK * block_bytes(dt);
    for (int r0 = 0; r0 < rows; r0 += 4) {
        const int nr = rows - r0 < 4 ? rows - r0 : 4;
        const float *q0 = q + (int64_t)r0 * D, *q1 = q0 + (nr > 1 ? D : 0), *q2 = q0 + (nr > 2 ? 2 * D : 0),
                    *q3 = q0 + (nr > 3 ? 3 * D : 0);
        for (int j = 0; j < nj; j += 2) {
            const uint8_t *ka = block_at(k, dt, (int64_t)j * ks_row);
            const uint8_t *kb = block_at(k, dt, (int64_t)(j + 1 < nj ? j + 1 : nj - 1) * ks_row);
            if (r0 == 0) prefetch_row(ka, row_bytes), prefetch_row(kb, row_bytes);
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            for (int d0 = 0; d0 < D; d0 += ATTN_QBLOCK) {
                const int64_t boff = d0 / ATTN_QBLOCK * block_bytes(dt);
                const __m256 da = scale_of(ka + boff), db = scale_of(kb + boff);
                for (int c = 0; c < 4; c++) {
                    const int d = d0 + 8 * c;
                    const __m256 xa = load8(dt, ka + boff, da, c), xb = load8(dt, kb + boff, db, c);
                    __m256 x = _mm256_loadu_ps(q0 + d);
                    a0 = _mm256_fmadd_ps(xa, x, a0), b0 = _mm256_fmadd_ps(xb, x, b0);
                    x = _mm256_loadu_ps(q1 + d);
                    a1 = _mm256_fmadd_ps(xa, x, a1), b1 = _mm256_fmadd_ps(xb, x, b1);
                    x = _mm256_loadu_ps(q2 + d);
                    a2 = _mm256_fmadd_ps(xa, x, a2), b2 = _mm256_fmadd_ps(xb, x, b2);
                    x = _mm256_loadu_ps(q3 + d);
                    a3 = _mm256_fmadd_ps(xa, x, a3), b3 = _mm256_fmadd_ps(xb, x, b3);
                }
            }
            float out[8];
            _mm_storeu_ps(out, sum4(a0, a1, a2, a3));
            _mm_storeu_ps(out + 4, sum4(b0, b1, b2, b3));
            const int nk = nj - j < 2 ? nj - j : 2;
            float *sj = s + (int64_t)r0 * s_r + (int64_t)j * s_j;
            for (int c = 0; c < nk; c++)
                for (int r = 0; r < nr; r++) sj[c * s_j + r * s_r] = out[4 * c + r];
        }
    }
}

void attn__qk_rows_q_avx2(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const void *q, int rows,
                          float *s, int64_t s_r, int64_t s_j) {
    qk_rows_q(dt, k, ks_row, nj, D, q, rows, s, s_r, s_j);
}

// Half h (columns 16h .. 16h + 15) of one block of the value rows (b: key 0's block, the next
// key's row_bytes on) for four rows with the weights w (the block's scale folded in): per key two
// vectors of values and the four weights broadcast, eight accumulators, left in c[0..7] (row r:
// c[2r], c[2r + 1]).
INLINE void pv_half(const attn_dtype dt, const int h, const uint8_t *b, int64_t row_bytes, int nj,
                    const float (*w)[4], bool prefetch, __m256 c[8]) {
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    const int64_t pf = FLASH_BC * row_bytes; // the same columns, a tile on
    for (int j = 0; j < nj; j++, b += row_bytes) {
        if (prefetch) _mm_prefetch((const char *)b + pf + 2 + 16 * h, _MM_HINT_T1);
        const __m256 v0 = load8_unscaled(dt, b, 2 * h), v1 = load8_unscaled(dt, b, 2 * h + 1);
        const __m256 w0 = _mm256_broadcast_ss(&w[j][0]), w1 = _mm256_broadcast_ss(&w[j][1]),
                     w2 = _mm256_broadcast_ss(&w[j][2]), w3 = _mm256_broadcast_ss(&w[j][3]);
        c0 = _mm256_fmadd_ps(w0, v0, c0), c1 = _mm256_fmadd_ps(w0, v1, c1);
        c2 = _mm256_fmadd_ps(w1, v0, c2), c3 = _mm256_fmadd_ps(w1, v1, c3);
        c4 = _mm256_fmadd_ps(w2, v0, c4), c5 = _mm256_fmadd_ps(w2, v1, c5);
        c6 = _mm256_fmadd_ps(w3, v0, c6), c7 = _mm256_fmadd_ps(w3, v1, c7);
    }
    c[0] = c0, c[1] = c1, c[2] = c2, c[3] = c3, c[4] = c4, c[5] = c5, c[6] = c6, c[7] = c7;
}

// Four rows (pp: their weights in the tile, pp[0..3], advancing by ldp) and nj <= PV_KEYS keys, a
// block of 32 columns at a time: first each key's four weights times the block's scale (w), then
// the block's two halves; the sums are added to the rows of o, scaled by alpha when `scale_o`.
INLINE void pv_rows_impl(const attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pp,
                         int64_t ldp, const float *alpha, bool scale_o, int nr, bool prefetch, float *o, int64_t ldo) {
    const int64_t row_bytes = vs_row / ATTN_QBLOCK * block_bytes(dt);
    float w[PV_KEYS][4] __attribute__((aligned(16)));
    for (int e = 0; e < Dv; e += ATTN_QBLOCK) {
        const uint8_t *b = block_at(v, dt, e);
        for (int j = 0; j < nj; j++)
            _mm_store_ps(w[j], _mm_mul_ps(_mm_loadu_ps(pp + (int64_t)j * ldp), _mm_set1_ps(scale_f(b + (int64_t)j * row_bytes))));
        __m256 c[16];
        pv_half(dt, 0, b, row_bytes, nj, (const float (*)[4])w, prefetch, c);
        pv_half(dt, 1, b, row_bytes, nj, (const float (*)[4])w, prefetch, c + 8);
        for (int r = 0; r < nr; r++) {
            float *orow = o + (int64_t)r * ldo + e;
            const __m256 a = _mm256_set1_ps(scale_o ? alpha[r] : 1.0f);
            for (int x = 0; x < 4; x++) // column vector x: half x / 2, its vector x % 2
                _mm256_storeu_ps(orow + 8 * x, _mm256_fmadd_ps(a, _mm256_loadu_ps(orow + 8 * x), c[8 * (x / 2) + 2 * r + x % 2]));
        }
    }
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

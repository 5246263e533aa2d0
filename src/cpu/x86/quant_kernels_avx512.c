// quant_kernels_avx512.c - the decode row kernels of cpu.h (qk_rows_q, pv_rows_q, dequant_rows) for
// Q8_0 and Q4_0 keys and values with AVX-512F and F16C (16 floats a register; compiled with those
// flags for this file only), in the AVX-512 table (and as the float path of the others: the
// "avx512vnni" and bf16 tables take its q.k for a query holding a NaN or an infinity). The
// arithmetic of quant_kernels_avx2.c's float kernels at twice the width, with the 32 registers
// used for more keys a pass:
//  - a block's 32 quants are two vectors of 16, times the block's scale d (load_block_scaled). Q8_0:
//    sign-extended to int32, converted, multiplied by d. Q4_0: the low nibbles of its 16 bytes are
//    values 0-15, the high ones 16-31; each nibble n becomes (n - 8) d by one permute of a 16-entry
//    table scaled by d. Both products are exact (at most 8 + 11 significant bits), as in the AVX2
//    kernel: the dequantised values themselves;
//  - qk_rows: four query rows against four keys a pass (16 accumulators, each block's eight query
//    vectors loaded once for the four keys), the products and sums those of the float kernels on the
//    dequantised values, summed 16 lanes wide, the 16 dot products reduced together (sum16);
//  - pv_rows: two blocks (64 columns) a pass, each key's four weights broadcast once and each block's
//    values multiplied by its scale (Q4_0: the table scaled, then permuted), 16 accumulators (the
//    AVX2 kernel scales the weights instead, a block at a time).
// Prefetch (decode_prefetch.h): qk_rows requests each key row's lines DECODE_PF_BYTES ahead as it
// starts the row; pv_rows requests each pass's two blocks' lines a key tile (FLASH_BC rows) on.
// The block helpers and the loops around these kernels are quant_rows.h's and quant_pv_rows.h's.
#include "cpu/x86/simd512.h"

#include "cpu/cpu.h"
#include "cpu/x86/decode_prefetch.h"
#include "cpu/x86/quant_kernels.h"
#include "cpu/x86/quant_pv_rows.h"
#include "cpu/x86/quant_rows.h"
#include "cpu/x86/sum512.h"
#include "half.h"

// The block at b times its scale d: values 0-15 in lo, 16-31 in hi. d is broadcast as float16 and
// converted in the vector (vpbroadcastw, vcvtph2ps); Q8_0's values are converted and multiplied,
// Q4_0's 16-entry table (the nibble n gives n - 8) is scaled once and permuted (vpermps reads the
// low 4 bits of each index, so the low nibbles need no mask).
INLINE void load_block_scaled(attn_dtype dt, const uint8_t *b, __m512 *lo, __m512 *hi) {
    const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)scale_bits(b)));
    if (dt == ATTN_DTYPE_Q8_0) {
        *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)))), d);
        *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18)))), d);
    } else {
        const __m512 table = _mm512_mul_ps(_mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7), d);
        const __m512i n = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)));
        *lo = _mm512_permutexvar_ps(n, table);
        *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(n, 4), table);
    }
}

// Four query rows against four keys per pass; a tile's last keys (nj not a multiple of 4) repeat
// its last key, and every key's sum is the same whatever its place in the group.
INLINE void qk_rows_impl(const attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const float *q, int rows,
                         float *s, int64_t s_r, int64_t s_j) {
    const int row_bytes = D / ATTN_QBLOCK * block_bytes(dt);
    for (int r0 = 0; r0 < rows; r0 += 4) {
        const int nr = rows - r0 < 4 ? rows - r0 : 4;
        const float *q0 = q + (int64_t)r0 * D, *q1 = q0 + (nr > 1 ? D : 0), *q2 = q0 + (nr > 2 ? 2 * D : 0),
                    *q3 = q0 + (nr > 3 ? 3 * D : 0);
        for (int j = 0; j < nj; j += 4) {
            const uint8_t *kb[4];
            for (int c = 0; c < 4; c++) {
                kb[c] = block_at(k, dt, (int64_t)(j + c < nj ? j + c : nj - 1) * ks_row);
                if (r0 == 0) decode_prefetch_bytes(kb[c], DECODE_PF_BYTES, row_bytes);
            }
            // accumulators in named variables (an array is kept in memory across the loop)
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            __m512 c0 = a0, c1 = a0, c2 = a0, c3 = a0, e0 = a0, e1 = a0, e2 = a0, e3 = a0;
            for (int d0 = 0; d0 < D; d0 += ATTN_QBLOCK) {
                const int64_t boff = d0 / ATTN_QBLOCK * block_bytes(dt);
                const __m512 x0 = _mm512_loadu_ps(q0 + d0), y0 = _mm512_loadu_ps(q0 + d0 + 16);
                const __m512 x1 = _mm512_loadu_ps(q1 + d0), y1 = _mm512_loadu_ps(q1 + d0 + 16);
                const __m512 x2 = _mm512_loadu_ps(q2 + d0), y2 = _mm512_loadu_ps(q2 + d0 + 16);
                const __m512 x3 = _mm512_loadu_ps(q3 + d0), y3 = _mm512_loadu_ps(q3 + d0 + 16);
#define KEY_STEP(c, v0, v1, v2, v3)                                                                                      \
    do {                                                                                                                 \
        __m512 lo, hi;                                                                                                   \
        load_block_scaled(dt, kb[c] + boff, &lo, &hi);                                                                   \
        v0 = _mm512_fmadd_ps(hi, y0, _mm512_fmadd_ps(lo, x0, v0)), v1 = _mm512_fmadd_ps(hi, y1, _mm512_fmadd_ps(lo, x1, v1)); \
        v2 = _mm512_fmadd_ps(hi, y2, _mm512_fmadd_ps(lo, x2, v2)), v3 = _mm512_fmadd_ps(hi, y3, _mm512_fmadd_ps(lo, x3, v3)); \
    } while (0)
                KEY_STEP(0, a0, a1, a2, a3);
                KEY_STEP(1, b0, b1, b2, b3);
                KEY_STEP(2, c0, c1, c2, c3);
                KEY_STEP(3, e0, e1, e2, e3);
#undef KEY_STEP
            }
            const __m512 acc[16] = {a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, e0, e1, e2, e3};
            const __m512 sums = sum16(acc); // lane 4c + r: key j + c, row r0 + r
            const int nk = nj - j < 4 ? nj - j : 4;
            float *sj = s + (int64_t)r0 * s_r + (int64_t)j * s_j;
            store_sums16(sums, 4, sj, s_r, s_j, nr, nk);
        }
    }
}

void attn__qk_rows_q_avx512(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const void *q, int rows,
                            float *s, int64_t s_r, int64_t s_j) {
    qk_rows_q(dt, k, ks_row, nj, D, q, rows, s, s_r, s_j);
}

// Four rows (pp: their weights in the tile, pp[0..3], advancing by ldp) and nj <= PV_KEYS keys, two
// blocks (64 columns) at a time: per key the four weights broadcast once, each block's values
// scaled by its d, 16 accumulators (row r: block 0 in c[4r], c[4r + 1], block 1 in c[4r + 2],
// c[4r + 3]); the sums are added to the rows of o, scaled by alpha when `scale_o`. An odd last
// block is computed twice in its pass and stored once.
INLINE void pv_rows_impl(const attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pp,
                         int64_t ldp, const float *alpha, bool scale_o, int nr, bool prefetch, float *o, int64_t ldo) {
    const int64_t row_bytes = vs_row / ATTN_QBLOCK * block_bytes(dt), pf = FLASH_BC * row_bytes;
    const int bb = block_bytes(dt);
    for (int e = 0; e < Dv; e += 2 * ATTN_QBLOCK) {
        const bool two = e + ATTN_QBLOCK < Dv;
        const uint8_t *b = block_at(v, dt, e);
        const int off1 = two ? bb : 0; // the second block's place in a row
        // accumulators in named variables (an array is kept in memory across the loop)
        __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
        __m512 c8 = c0, c9 = c0, c10 = c0, c11 = c0, c12 = c0, c13 = c0, c14 = c0, c15 = c0;
        const uint8_t *bj = b;
        for (int j = 0; j < nj; j++, bj += row_bytes) {
            if (prefetch) decode_prefetch_bytes(bj, pf, bb + off1);
            const float *pj = pp + (int64_t)j * ldp;
            const __m512 w0 = _mm512_set1_ps(pj[0]), w1 = _mm512_set1_ps(pj[1]), w2 = _mm512_set1_ps(pj[2]),
                         w3 = _mm512_set1_ps(pj[3]);
            __m512 lo, hi;
            load_block_scaled(dt, bj, &lo, &hi);
            c0 = _mm512_fmadd_ps(w0, lo, c0), c1 = _mm512_fmadd_ps(w0, hi, c1);
            c4 = _mm512_fmadd_ps(w1, lo, c4), c5 = _mm512_fmadd_ps(w1, hi, c5);
            c8 = _mm512_fmadd_ps(w2, lo, c8), c9 = _mm512_fmadd_ps(w2, hi, c9);
            c12 = _mm512_fmadd_ps(w3, lo, c12), c13 = _mm512_fmadd_ps(w3, hi, c13);
            load_block_scaled(dt, bj + off1, &lo, &hi);
            c2 = _mm512_fmadd_ps(w0, lo, c2), c3 = _mm512_fmadd_ps(w0, hi, c3);
            c6 = _mm512_fmadd_ps(w1, lo, c6), c7 = _mm512_fmadd_ps(w1, hi, c7);
            c10 = _mm512_fmadd_ps(w2, lo, c10), c11 = _mm512_fmadd_ps(w2, hi, c11);
            c14 = _mm512_fmadd_ps(w3, lo, c14), c15 = _mm512_fmadd_ps(w3, hi, c15);
        }
        const __m512 c[16] = {c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15};
        for (int r = 0; r < nr; r++) {
            float *orow = o + (int64_t)r * ldo + e;
            const __m512 a = _mm512_set1_ps(scale_o ? alpha[r] : 1.0f);
            for (int x = 0; x < (two ? 4 : 2); x++)
                _mm512_storeu_ps(orow + 16 * x, _mm512_fmadd_ps(a, _mm512_loadu_ps(orow + 16 * x), c[4 * r + x]));
        }
    }
}

void attn__pv_rows_q_avx512(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt, int64_t ldp,
                            const float *alpha, int rows, float *o, int64_t ldo) {
    pv_rows_q(dt, v, vs_row, nj, Dv, pt, ldp, alpha, rows, o, ldo);
}

void attn__dequant_rows_avx512(attn_dtype dt, const void *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += ATTN_QBLOCK) {
        const uint8_t *b = block_at(x, dt, i);
        __m512 lo, hi;
        if (dt == ATTN_DTYPE_Q8_0) load_block_scaled(ATTN_DTYPE_Q8_0, b, &lo, &hi);
        else load_block_scaled(ATTN_DTYPE_Q4_0, b, &lo, &hi);
        _mm512_storeu_ps(y + i, lo);
        _mm512_storeu_ps(y + i + 16, hi);
    }
}

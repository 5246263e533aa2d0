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
//  - qk_rows: four query rows against four keys a pass (16 accumulators, each block's query
//    vectors loaded once for the keys), or two rows against eight keys, or one against sixteen (the
//    few rows of decoding without GQA); the products and sums those of the float kernels on the
//    dequantised values, summed 16 lanes wide, the 16 dot products reduced together (sum16), each
//    (row, key) sum the same whatever the rows beside it;
//  - pv_rows: for four rows two blocks (64 columns) a pass, for two rows four, for one eight (a row's
//    last blocks in narrower passes), each key's weights broadcast once and each block's values
//    multiplied by its scale (Q4_0: the table scaled, then permuted), 16 accumulators (the AVX2
//    kernel scales the weights instead, a block at a time).
// Prefetch (decode_prefetch.h): qk_rows requests each key row's lines DECODE_PF_BYTES ahead as it
// starts the row; pv_rows requests each pass's blocks' lines a key tile (FLASH_BC rows) on.
// The block helpers and the loops around these kernels are quant_rows.h's and quant_pv_rows.h's.
#include "cpu/x86/simd512.h"

#include "cpu/cpu.h"
#include "cpu/unroll.h"
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

// NR (4, 2 or 1) query rows (nr of them real, the others repeat the first) against NK = 16 / NR keys
// per pass; a tile's last keys (nj not a multiple of NK) repeat its last key, and every key's sum is
// the same whatever its place in the pass and the rows beside it.
INLINE void qk_rows_block(const attn_dtype dt, const int NR, const void *k, int64_t ks_row, int nj, int D,
                          const float *q, int nr, bool prefetch, float *s, int64_t s_r, int64_t s_j) {
    const int NK = 16 / NR, row_bytes = D / ATTN_QBLOCK * block_bytes(dt);
    const float *qr[4];
    ATTN_UNROLL
    for (int r = 0; r < NR; r++) qr[r] = q + (r < nr ? (int64_t)r * D : 0);
    for (int j = 0; j < nj; j += NK) {
        const uint8_t *kb[16];
        ATTN_UNROLL
        for (int c = 0; c < NK; c++) {
            kb[c] = block_at(k, dt, (int64_t)(j + c < nj ? j + c : nj - 1) * ks_row);
            if (prefetch) decode_prefetch_bytes(kb[c], DECODE_PF_BYTES, row_bytes);
        }
        __m512 acc[16]; // row r, key c: acc[r NK + c]
        ATTN_UNROLL
        for (int x = 0; x < 16; x++) acc[x] = _mm512_setzero_ps();
        for (int d0 = 0; d0 < D; d0 += ATTN_QBLOCK) {
            const int64_t boff = d0 / ATTN_QBLOCK * block_bytes(dt);
            __m512 x[4], y[4];
            ATTN_UNROLL
            for (int r = 0; r < NR; r++) x[r] = _mm512_loadu_ps(qr[r] + d0), y[r] = _mm512_loadu_ps(qr[r] + d0 + 16);
            ATTN_UNROLL
            for (int c = 0; c < NK; c++) {
                __m512 lo, hi;
                load_block_scaled(dt, kb[c] + boff, &lo, &hi);
                ATTN_UNROLL
                for (int r = 0; r < NR; r++)
                    acc[r * NK + c] = _mm512_fmadd_ps(hi, y[r], _mm512_fmadd_ps(lo, x[r], acc[r * NK + c]));
            }
        }
        store_dots16(acc, NR, s + (int64_t)j * s_j, s_r, s_j, nr, nj - j < NK ? nj - j : NK);
    }
}

// Four rows at a time: blocks of three or four rows, or of two and one (decoding without GQA).
INLINE void qk_rows_impl(const attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const float *q, int rows,
                         float *s, int64_t s_r, int64_t s_j) {
    for (int r0 = 0; r0 < rows; r0 += 4) {
        const int nr = rows - r0 < 4 ? rows - r0 : 4;
        const float *qb = q + (int64_t)r0 * D;
        float *sb = s + (int64_t)r0 * s_r;
        if (nr >= 3) qk_rows_block(dt, 4, k, ks_row, nj, D, qb, nr, r0 == 0, sb, s_r, s_j);
        else if (nr == 2) qk_rows_block(dt, 2, k, ks_row, nj, D, qb, nr, r0 == 0, sb, s_r, s_j);
        else qk_rows_block(dt, 1, k, ks_row, nj, D, qb, nr, r0 == 0, sb, s_r, s_j);
    }
}

void attn__qk_rows_q_avx512(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const void *q, int rows,
                            float *s, int64_t s_r, int64_t s_j) {
    qk_rows_q(dt, k, ks_row, nj, D, q, rows, s, s_r, s_j);
}

// NR (4, 2 or 1) rows (pp: their weights in the tile, pp[0..NR-1], advancing by ldp; nr <= NR of them
// real) and nj <= PV_KEYS keys, NB blocks from block b of each row (NR NB <= 8): per key the
// weights broadcast once, each block's values scaled by its d, accumulators c[2 (r NB + bb) + x]
// (row r, block bb, columns 16x..); the sums are added to the rows of o from column 32 b, scaled by
// alpha when `scale_o`. Each column's sum over the keys is the same whatever NR and NB.
INLINE void pv_pass(const attn_dtype dt, const int NR, const int NB, const uint8_t *v, int64_t row_bytes, int nj,
                    int b, const float *pp, int64_t ldp, const float *alpha, bool scale_o, int nr, bool prefetch,
                    float *o, int64_t ldo) {
    const int bb_bytes = block_bytes(dt);
    const int64_t pf = FLASH_BC * row_bytes;
    __m512 c[16];
    ATTN_UNROLL
    for (int x = 0; x < 16; x++) c[x] = _mm512_setzero_ps();
    const uint8_t *bj = v + (int64_t)b * bb_bytes;
    for (int j = 0; j < nj; j++, bj += row_bytes) {
        if (prefetch) decode_prefetch_bytes(bj, pf, NB * bb_bytes);
        const float *pj = pp + (int64_t)j * ldp;
        __m512 w[4];
        ATTN_UNROLL
        for (int r = 0; r < NR; r++) w[r] = _mm512_set1_ps(pj[r]);
        ATTN_UNROLL
        for (int bb = 0; bb < NB; bb++) {
            __m512 lo, hi;
            load_block_scaled(dt, bj + bb * bb_bytes, &lo, &hi);
            ATTN_UNROLL
            for (int r = 0; r < NR; r++) {
                c[2 * (r * NB + bb)] = _mm512_fmadd_ps(w[r], lo, c[2 * (r * NB + bb)]);
                c[2 * (r * NB + bb) + 1] = _mm512_fmadd_ps(w[r], hi, c[2 * (r * NB + bb) + 1]);
            }
        }
    }
    for (int r = 0; r < nr; r++) {
        float *orow = o + (int64_t)r * ldo + (int64_t)b * ATTN_QBLOCK;
        const __m512 a = _mm512_set1_ps(scale_o ? alpha[r] : 1.0f);
        ATTN_UNROLL
        for (int x = 0; x < 2 * NB; x++)
            _mm512_storeu_ps(orow + 16 * x, _mm512_fmadd_ps(a, _mm512_loadu_ps(orow + 16 * x), c[2 * r * NB + x]));
    }
}

// The passes over a row's Dv / 32 blocks for NR rows: 8 / NR blocks a pass, the last blocks in
// passes of half as many, down to one.
INLINE void pv_rows_block(const attn_dtype dt, const int NR, const void *v, int64_t vs_row, int nj, int Dv,
                          const float *pp, int64_t ldp, const float *alpha, bool scale_o, int nr, bool prefetch,
                          float *o, int64_t ldo) {
    const int64_t row_bytes = vs_row / ATTN_QBLOCK * block_bytes(dt);
    const int nb = Dv / ATTN_QBLOCK;
    int b = 0;
    for (; b + 8 / NR <= nb; b += 8 / NR)
        pv_pass(dt, NR, 8 / NR, v, row_bytes, nj, b, pp, ldp, alpha, scale_o, nr, prefetch, o, ldo);
    if (NR == 1 && b + 4 <= nb) {
        pv_pass(dt, NR, 4, v, row_bytes, nj, b, pp, ldp, alpha, scale_o, nr, prefetch, o, ldo);
        b += 4;
    }
    if (NR <= 2 && b + 2 <= nb) {
        pv_pass(dt, NR, 2, v, row_bytes, nj, b, pp, ldp, alpha, scale_o, nr, prefetch, o, ldo);
        b += 2;
    }
    if (b < nb) pv_pass(dt, NR, 1, v, row_bytes, nj, b, pp, ldp, alpha, scale_o, nr, prefetch, o, ldo);
}

// quant_pv_rows.h's kernel: blocks of four rows, or of two and one (decoding without GQA).
INLINE void pv_rows_impl(const attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pp,
                         int64_t ldp, const float *alpha, bool scale_o, int nr, bool prefetch, float *o, int64_t ldo) {
    if (nr >= 3) pv_rows_block(dt, 4, v, vs_row, nj, Dv, pp, ldp, alpha, scale_o, nr, prefetch, o, ldo);
    else if (nr == 2) pv_rows_block(dt, 2, v, vs_row, nj, Dv, pp, ldp, alpha, scale_o, nr, prefetch, o, ldo);
    else pv_rows_block(dt, 1, v, vs_row, nj, Dv, pp, ldp, alpha, scale_o, nr, prefetch, o, ldo);
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

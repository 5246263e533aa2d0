// quant_kernels_avx512bf16.c - the P V of the decode row kernels of cpu.h for Q8_0 and Q4_0 values
// (pv_rows_q) on AVX512-BF16's vdpbf16ps, for the two bf16 tables ("avx512bf16", "amxbf16"), whose
// q.k runs on vpdpbusd (quant_kernels_avx512vnni.c). Compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512bf16 for this file only.
//
// pv_rows multiplies each weight by its key's block scale and rounds the product to bf16 (as
// FlashAttention rounds P before P V), and the values (Q4_0's n - 8, Q8_0's q: exact in bf16) are
// built for two keys at once as interleaved pairs (Q4_0: unpack, widen, a 32-entry vpermw table;
// Q8_0: widen, convert, the floats' high words): vdpbf16ps adds two keys' products a lane, 16
// instructions a key for four rows and 128 columns instead of 32 FMAs. The error this adds (the
// weights' bf16 rounding and the flush of their denormals) is written with the kv_dtype bound of
// attn.h and tested (tests/test_quant.c).
//
// A block whose scale is infinite or NaN makes, through the weight p d, its value NaN or +-inf for
// the rows that weigh it, as the float kernels' q d values do.
#include "cpu/x86/simd512.h"

#include "cpu/cpu.h"
#include "cpu/x86/decode_prefetch.h"
#include "cpu/x86/quant_groups512.h"
#include "cpu/x86/quant_kernels.h"
#include "cpu/x86/quant_pv_rows.h"
#include "half.h"

#define PV_BLOCKS 4 // blocks whose weights pv_rows pairs at once

// Where pv_pass finds the weights that pair_weights wrote for keys 4g.. 4g + 3: w[g][h] dword
// 8 (b % 2) + 2 r + i holds (key 4g + 2i, key 4g + 2i + 1)'s weights of row r for block b = 2h + b % 2.
typedef uint32_t pv_weights[2][16];

// The weights of four rows (pp[j * ldp + r]) times each key's block scales for PV_BLOCKS blocks
// from the row's byte v (block_weights4), rounded to bf16 and paired along the keys (keys past nj
// weigh 0), four keys at a time: lanes 4r + l, so that vcvtne2ps2bf16 pairs adjacent keys.
INLINE void pair_weights(const attn_dtype dt, const uint8_t *v, int64_t stride, int nj, const float *pp, int64_t ldp,
                         group_span sp, pv_weights *w) {
    const weight_lanes wl = weight_lanes_of(dt);
    for (int j = 0; j < nj; j += 4) {
        __m512 x[4];
        block_weights4(dt, v, stride, j, nj - j < 4 ? nj - j : 4, pp, ldp, sp, &wl, x);
        _mm512_storeu_si512((void *)w[j / 4][0], (__m512i)_mm512_cvtne2ps_pbh(x[1], x[0]));
        _mm512_storeu_si512((void *)w[j / 4][1], (__m512i)_mm512_cvtne2ps_pbh(x[3], x[2]));
    }
}

// The bf16 values of one block of two keys, at x and y, as pairs (x's, y's): lo for columns 0-15,
// hi for 16-31. Q4_0: n - 8 of the 16 nibble bytes (vpermw reads an index's low 5 bits: the table
// repeats its 16 entries). Q8_0: the int8 q, whose floats have zero low halves: their high words.
INLINE void value_pairs(const attn_dtype dt, const uint8_t *x, const uint8_t *y, __m512i table, __m512bh *lo, __m512bh *hi) {
    if (dt == ATTN_DTYPE_Q4_0) {
        const __m512i u = pair_bytes(x, y);
        *lo = (__m512bh)_mm512_permutexvar_epi16(u, table);
        *hi = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(u, 4), table);
    } else { // table: word 2i = word 2i + 1 of the first, 2i + 1 = that of the second
        for (int half = 0; half < 2; half++) {
            const __m512 fa = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(x + 16 * half))));
            const __m512 fb = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(y + 16 * half))));
            const __m512bh p = (__m512bh)_mm512_permutex2var_epi16(_mm512_castps_si512(fa), table, _mm512_castps_si512(fb));
            *(half == 0 ? lo : hi) = p;
        }
    }
}

// One pass over nj keys for nbp (1 or 2) blocks from block b0 of the PV_BLOCKS at byte goff of each
// row, for NR (4, 2 or 1) rows, nr <= NR of them real (decoding without GQA takes one or two):
// c[8 bb + 2 r + x] sums row r's columns 16x.. of block b0 + bb; then added to o.
INLINE void pv_pass(const attn_dtype dt, const int NR, const uint8_t *v, int64_t stride, int nj, int64_t goff, int b0,
                    const int nbp, const pv_weights *w, __m512i table, const float *alpha, bool scale_o, int nr,
                    bool prefetch, float *o, int64_t ldo, int col0) {
    __m512 c[16];
    for (int x = 0; x < 16; x++) c[x] = _mm512_setzero_ps();
    const int bb_bytes = block_bytes(dt);
    for (int j = 0; j < nj; j += 2) {
        const uint8_t *rx, *ry;
        key_pair_rows(v, stride, j, nj, goff + (int64_t)b0 * bb_bytes, nbp * bb_bytes, prefetch, &rx, &ry);
        for (int bb = 0; bb < nbp; bb++) {
            __m512bh lo, hi;
            value_pairs(dt, rx + bb * bb_bytes + 2, ry + bb * bb_bytes + 2, table, &lo, &hi);
            const int b = b0 + bb;
            const uint32_t *wj = w[j / 4][b / 2] + 8 * (b % 2) + (j / 2) % 2;
            for (int r = 0; r < NR; r++) {
                const __m512bh wr = (__m512bh)_mm512_set1_epi32((int)wj[2 * r]);
                c[8 * bb + 2 * r] = _mm512_dpbf16_ps(c[8 * bb + 2 * r], lo, wr);
                c[8 * bb + 2 * r + 1] = _mm512_dpbf16_ps(c[8 * bb + 2 * r + 1], hi, wr);
            }
        }
    }
    add_block_sums(c, nbp, alpha, scale_o, nr, o, ldo, col0);
}

// pv_pass over a group's sp.blocks blocks from goff, two a pass (one for an odd last).
INLINE void pv_passes(const attn_dtype dt, const int NR, const uint8_t *v, int64_t stride, int nj, int64_t goff, int g0,
                      group_span sp, const pv_weights *w, __m512i table, const float *alpha, bool scale_o, int nr,
                      bool prefetch, float *o, int64_t ldo) {
    for (int b0 = 0; b0 < sp.blocks; b0 += 2) {
        const int col0 = (g0 + b0) * ATTN_QBLOCK;
        if (b0 + 1 < sp.blocks)
            pv_pass(dt, NR, v, stride, nj, goff, b0, 2, w, table, alpha, scale_o, nr, prefetch, o, ldo, col0);
        else
            pv_pass(dt, NR, v, stride, nj, goff, b0, 1, w, table, alpha, scale_o, nr, prefetch, o, ldo, col0);
    }
}

// quant_pv_rows.h's pv_rows_impl: four rows' weights pp (advancing by ldp a key) and nj <= PV_KEYS keys,
// PV_BLOCKS blocks at a time: their paired weights, then passes of two blocks (one for an odd last)
// for blocks of four rows, or of two and one (decoding without GQA).
INLINE void pv_rows_impl(const attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pp,
                         int64_t ldp, const float *alpha, bool scale_o, int nr, bool prefetch, float *o, int64_t ldo) {
    const int nb = Dv / ATTN_QBLOCK;
    const int64_t stride = vs_row / ATTN_QBLOCK * block_bytes(dt);
    pv_weights w[(PV_KEYS + 3) / 4];
    uint16_t tw[32]; // Q4_0: bf16 of n - 8 for the index n (mod 16); Q8_0: high words of two floats
    for (int i = 0; i < 32; i++)
        tw[i] = dt == ATTN_DTYPE_Q4_0 ? attn__f32_to_bf16((float)((i & 15) - 8)) : (uint16_t)(i % 2 ? 32 + i : i + 1);
    const __m512i table = _mm512_loadu_si512(tw);
    for (int g0 = 0; g0 < nb; g0 += PV_BLOCKS) {
        const group_span sp = span_of(dt, nb, g0, PV_BLOCKS);
        const int64_t goff = (int64_t)g0 * block_bytes(dt);
        pair_weights(dt, (const uint8_t *)v + goff, stride, nj, pp, ldp, sp, w);
        const pv_weights *pw = (const pv_weights *)w;
        if (nr >= 3) pv_passes(dt, 4, v, stride, nj, goff, g0, sp, pw, table, alpha, scale_o, nr, prefetch, o, ldo);
        else if (nr == 2)
            pv_passes(dt, 2, v, stride, nj, goff, g0, sp, pw, table, alpha, scale_o, nr, prefetch, o, ldo);
        else pv_passes(dt, 1, v, stride, nj, goff, g0, sp, pw, table, alpha, scale_o, nr, prefetch, o, ldo);
    }
}

void attn__pv_rows_q_avx512bf16(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt,
                                int64_t ldp, const float *alpha, int rows, float *o, int64_t ldo) {
    pv_rows_q(dt, v, vs_row, nj, Dv, pt, ldp, alpha, rows, o, ldo);
}

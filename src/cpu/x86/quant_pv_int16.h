// quant_pv_int16.h - the P V of the decode kernels for Q8_0 and Q4_0 values on AVX512-VNNI's
// vpdpwssd (the "avx512vnni" and "amxbf16" tables): included by quant_kernels_avx512vnni.c, and by
// quant_kernels_avx512vbmi.c with ATTN_PV_VBMI defined, where AVX512-VBMI's vpermb pairs two keys'
// Q4_0 quants (key_pairs). The two give the same bits (the int32 sums are exact). Include after
// simd512.h, in a file compiled with AVX512-VNNI (and AVX512-VBMI for ATTN_PV_VBMI).
//
// The AVX-512 table's P V (quant_kernels_avx512.c) multiplies each value block by its scale and
// meets it with 32 FMAs a key (four rows, 128 columns); where 512-bit shuffles and FMAs share two
// ports (Intel's cores) the block's conversions cost as much again. Here the four rows' weights are
// multiplied by their keys' block scales first, sixteen products a vector (block_weights4), so the
// values are the quants themselves, exact in int16 (Q4_0's nibbles n, Q8_0's q), and two keys go in
// each dword (key_pairs); vpdpwssd adds two keys' products a lane: 16 instructions a key for four
// rows and 128 columns instead of 32 FMAs. For that the weights w = p d of each row and block over
// the tile (at most PV_KEYS keys) are rounded to int16 against their largest magnitude W:
// w' = round(w * 32767 / W), an error of at most W / 65534 (plus float32 rounding) each, and the
// int32 sums (exact: at most 96 * 32767 * 255 in magnitude, Q4_0's whole bytes) are scaled back by
// W / 32767; Q4_0's n - 8 is the nibbles' sum less 8 times the rounded weights' sum. A W below
// 2^-110 counts as 2^-110 (32767 / W stays finite). The error this adds is written with the kv_dtype
// bound of attn.h and tested (tests/test_quant.c): over a tile each row's weights sum to at least
// their largest, so it is at most 96 / 65534 of the largest block scale times the largest quant
// magnitude, relative to the row's weights' sum.
//
// A tile whose weights are not all finite (an infinite or NaN block scale: nan_if_infinite) takes
// the float pass (fpv_pass), where such a scale makes the rows that weigh it NaN or +-inf as the
// float kernels' q d values do; it multiplies the quants as floats by the same products p d.

#ifndef ATTN_CPU_X86_QUANT_PV_INT16_H
#define ATTN_CPU_X86_QUANT_PV_INT16_H

#include <stdbool.h>
#include <stdint.h>

#include "attn.h"
#include "cpu/flash.h"
#include "cpu/x86/quant_block.h"
#include "cpu/x86/quant_groups512.h"
#include "cpu/x86/quant_pv_rows.h"

typedef float pv_fweights[4][16];   // keys 4g .. 4g + 3: [b][4r + l], key 4g + l's weight of row r times its block b's scale
typedef int32_t pv_iweights[2][16]; // the same rounded, paired: [h] dword 4r + 2 (b % 2) + i holds the int16 weights of
                                    // keys 4g + 2i (low word) and 4g + 2i + 1 of row r for block b = 2h + b % 2

_Static_assert(PV_KEYS <= 96, "the int32 sums of the int16 P V and attn.h's bound assume tiles of at most 96 keys");

// c + the products of a and b's word pairs (vpdpwssd). GCC before 13 copies the accumulator around
// the intrinsic where it is carried through a loop (two moves an instruction); the instruction
// itself in that case.
INLINE __m512i dpwssd(__m512i c, __m512i a, __m512i b) {
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13 && !defined(ATTN_EMULATE_AVX512)
    __asm__("vpdpwssd %2, %1, %0" : "+v"(c) : "v"(a), "v"(b));
    return c;
#else
    return _mm512_dpwssd_epi32(c, a, b);
#endif
}

// The 16 float values of one block's quants from its byte 2 (x): lo for columns 0-15, hi 16-31.
INLINE void block_values(const attn_dtype dt, const uint8_t *x, __m512 table, __m512 *lo, __m512 *hi) {
    if (dt == ATTN_DTYPE_Q4_0) { // vpermps reads an index's low 4 bits: the low nibbles need no mask
        const __m512i n = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)x));
        *lo = _mm512_permutexvar_ps(n, table);
        *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(n, 4), table);
    } else {
        *lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)x)));
        *hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(x + 16))));
    }
}

// The byte indices of key_pairs' vpermb for Q4_0 (ATTN_PV_VBMI): from the two keys' 16 bytes side
// by side (x's at 0, y's at 16).
typedef struct pair_index {
    __m512i q4;
} pair_index;

INLINE pair_index pair_index_of(void) {
    uint8_t q4[64];
    for (int i = 0; i < 16; i++)
        for (int k = 0; k < 4; k++) q4[4 * i + k] = (uint8_t)(k < 2 ? i : 16 + i);
    pair_index p;
    p.q4 = _mm512_loadu_si512(q4);
    return p;
}

// One block's quants of two keys (from byte 2 of the block: x and y) paired for vpdpwssd, each dword
// one column of key x (low word) and of key y (high word). Q4_0: dword i of *lo holds byte i's low
// nibble n (column i), of *hi the whole byte u = 16 n' + n, whose high nibble n' is column 16 + i
// (ipv_pass takes its sums as sum (u - n) w = 16 sum n' w, one shift instead of one a key pair);
// with AVX512-VBMI (ATTN_PV_VBMI) one vpermb places both keys' bytes from one load of both, else
// pair_bytes (two unpacks, an insertion and a widening). Q8_0: each key's 32 quants sign-extended to
// words as they load (vpmovsxbw) and the two keys' words interleaved within each 128-bit lane
// (vpunpck[lh]wd), four instructions a block, so that *lo's dwords hold columns 0-3, 8-11, 16-19,
// 24-27 and *hi's 4-7, 12-15, 20-23, 28-31; q8_columns puts the sums back in order.
INLINE void key_pairs(const attn_dtype dt, const uint8_t *x, const uint8_t *y, const pair_index *ix, __m512i *lo,
                      __m512i *hi) {
    if (dt == ATTN_DTYPE_Q8_0) {
        const __m512i xw = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)x));
        const __m512i yw = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)y));
        *lo = _mm512_unpacklo_epi16(xw, yw), *hi = _mm512_unpackhi_epi16(xw, yw);
        return;
    }
#if defined(ATTN_PV_VBMI)
    const __m256i xy = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)x)),
                                               _mm_loadu_si128((const __m128i *)y), 1);
    *hi = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, ix->q4, _mm512_castsi256_si512(xy));
#else
    (void)ix;
    *hi = pair_bytes(x, y);
#endif
    *lo = _mm512_and_si512(*hi, _mm512_set1_epi16(0x0F));
}

// Q8_0's sums over key_pairs' columns (*lo: 0-3, 8-11, 16-19, 24-27; *hi: 4-7, 12-15, 20-23, 28-31)
// back in order: *lo columns 0-15, *hi 16-31 (a qword permute each).
INLINE void q8_columns(__m512i *lo, __m512i *hi) {
    const __m512i a = *lo, b = *hi;
    *lo = _mm512_permutex2var_epi64(a, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), b);
    *hi = _mm512_permutex2var_epi64(a, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), b);
}

// One pass over nj keys for nbp (1 or 2) blocks from block b0 of the group at byte goff of each row,
// in floats: c[8 bb + 2 r + x] sums row r's columns 16x.. of block b0 + bb; then added to o from
// column col0.
INLINE void fpv_pass(const attn_dtype dt, const uint8_t *v, int64_t stride, int nj, int64_t goff, int b0, const int nbp,
                     const pv_fweights *w, __m512 table, const float *alpha, bool scale_o, int nr, bool prefetch,
                     float *o, int64_t ldo, int col0) {
    __m512 c[16];
    for (int x = 0; x < 16; x++) c[x] = _mm512_setzero_ps();
    const int64_t pf = FLASH_BC * stride;
    const int bb_bytes = block_bytes(dt);
    const uint8_t *rx = v + goff + (int64_t)b0 * bb_bytes;
    for (int j = 0; j < nj; j++, rx += stride) {
        if (prefetch)
            _mm_prefetch((const char *)rx + pf, _MM_HINT_T1), _mm_prefetch((const char *)rx + pf + nbp * bb_bytes - 1, _MM_HINT_T1);
        for (int bb = 0; bb < nbp; bb++) {
            __m512 lo, hi;
            block_values(dt, rx + bb * bb_bytes + 2, table, &lo, &hi);
            const float *wj = w[j / 4][b0 + bb] + j % 4;
            for (int r = 0; r < 4; r++) {
                const __m512 wr = _mm512_set1_ps(wj[4 * r]);
                c[8 * bb + 2 * r] = _mm512_fmadd_ps(wr, lo, c[8 * bb + 2 * r]);
                c[8 * bb + 2 * r + 1] = _mm512_fmadd_ps(wr, hi, c[8 * bb + 2 * r + 1]);
            }
        }
    }
    add_block_sums(c, nbp, alpha, scale_o, nr, o, ldo, col0);
}

// The same pass on the rounded weights w (pv_iweights), keys in pairs, for NR (4, 2 or 1) rows, nr
// <= NR of them real (decoding without GQA takes one or two): the int32 sums, less 8 times the
// weights' sum wsum[b][4r] for Q4_0, times unit[b][4r] (W / 32767 of row r and block b).
INLINE void ipv_pass(const attn_dtype dt, const int NR, const uint8_t *v, int64_t stride, int nj, int64_t goff, int b0,
                     const int nbp, const pv_iweights *w, const pair_index *ix, const float unit[4][16],
                     const int32_t wsum[4][16], const float *alpha, bool scale_o, int nr, bool prefetch, float *o,
                     int64_t ldo, int col0) {
    __m512i c[16];
    for (int x = 0; x < 16; x++) c[x] = _mm512_setzero_si512();
    const int bb_bytes = block_bytes(dt);
    for (int j = 0; j < nj; j += 2) {
        const uint8_t *rx, *ry;
        key_pair_rows(v, stride, j, nj, goff + (int64_t)b0 * bb_bytes, nbp * bb_bytes, prefetch, &rx, &ry);
        for (int bb = 0; bb < nbp; bb++) {
            __m512i lo, hi;
            key_pairs(dt, rx + bb * bb_bytes + 2, ry + bb * bb_bytes + 2, ix, &lo, &hi);
            const int b = b0 + bb;
            const int32_t *wj = w[j / 4][b / 2] + 2 * (b % 2) + (j / 2) % 2;
            for (int r = 0; r < NR; r++) {
                const __m512i wr = _mm512_set1_epi32(wj[4 * r]);
                c[8 * bb + 2 * r] = dpwssd(c[8 * bb + 2 * r], lo, wr);
                c[8 * bb + 2 * r + 1] = dpwssd(c[8 * bb + 2 * r + 1], hi, wr);
            }
        }
    }
    __m512 f[16];
    for (int bb = 0; bb < nbp; bb++)
        for (int r = 0; r < NR; r++) {
            const int b = b0 + bb;
            if (dt == ATTN_DTYPE_Q8_0) q8_columns(&c[8 * bb + 2 * r], &c[8 * bb + 2 * r + 1]);
            if (dt == ATTN_DTYPE_Q4_0) // the high nibbles' sums: sum (u - n) w = 16 sum n' w, exactly
                c[8 * bb + 2 * r + 1] = _mm512_srai_epi32(_mm512_sub_epi32(c[8 * bb + 2 * r + 1], c[8 * bb + 2 * r]), 4);
            const __m512i less = _mm512_set1_epi32(dt == ATTN_DTYPE_Q4_0 ? 8 * wsum[b][4 * r] : 0);
            const __m512 u = _mm512_set1_ps(unit[b][4 * r]);
            for (int x = 0; x < 2; x++)
                f[8 * bb + 2 * r + x] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c[8 * bb + 2 * r + x], less)), u);
        }
    add_block_sums(f, nbp, alpha, scale_o, nr, o, ldo, col0);
}

// The float weights wf of nj keys rounded to int16 for ipv_pass (wi), with their units and sums:
// wmax[b] holds the weights' magnitudes' bit patterns' lane-wise maxima (lane 4r + l). False, with
// wi and wsum not written, when a weight of the nr real rows is not finite.
INLINE bool round_weights(const attn_dtype dt, const pv_fweights *wf, int nj, int nr, const __m512i wmax[4],
                          pv_iweights *wi, float unit[4][16], int32_t wsum[4][16]) {
    const __mmask16 real = (__mmask16)((1u << (4 * nr)) - 1);
    // lane i of swap2 is lane i ^ 2, of swap1 lane i ^ 1
    const __m512i swap2 = _mm512_setr_epi32(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    const __m512i swap1 = _mm512_setr_epi32(1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    __m512 scale[4];
    for (int b = 0; b < 4; b++) { // each row's largest over its four lanes, in all four
        __m512i m = _mm512_max_epu32(wmax[b], _mm512_permutexvar_epi32(swap2, wmax[b]));
        m = _mm512_max_epu32(m, _mm512_permutexvar_epi32(swap1, m));
        if ((_mm512_cmpge_epu32_mask(m, _mm512_set1_epi32(0x7F800000)) & real) != 0) return false;
        const __m512 top = _mm512_max_ps(_mm512_castsi512_ps(m), _mm512_set1_ps(0x1p-110f));
        scale[b] = _mm512_div_ps(_mm512_set1_ps(32767.0f), top);
        _mm512_store_ps(unit[b], _mm512_div_ps(top, _mm512_set1_ps(32767.0f)));
    }
    __m512i sum[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int g = 0; g < (nj + 3) / 4; g++) {
        __m512i y[4];
        for (int b = 0; b < 4; b++) {
            y[b] = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_load_ps(wf[g][b]), scale[b]),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            sum[b] = _mm512_add_epi32(sum[b], y[b]);
        }
        // per 128-bit lane r: words (block 2h: keys 0-3, block 2h + 1: keys 0-3)
        _mm512_store_si512(wi[g][0], _mm512_packs_epi32(y[0], y[1]));
        _mm512_store_si512(wi[g][1], _mm512_packs_epi32(y[2], y[3]));
    }
    if (dt == ATTN_DTYPE_Q4_0)
        for (int b = 0; b < 4; b++) { // row r's sum over its four lanes, in lane 4r
            const __m512i s2 = _mm512_add_epi32(sum[b], _mm512_permutexvar_epi32(swap2, sum[b]));
            _mm512_store_si512(wsum[b], _mm512_add_epi32(s2, _mm512_permutexvar_epi32(swap1, s2)));
        }
    return true;
}

// ipv_pass over a group's sp.blocks blocks from goff, two a pass (one for an odd last).
INLINE void ipv_passes(const attn_dtype dt, const int NR, const uint8_t *v, int64_t stride, int nj, int64_t goff,
                       int g0, group_span sp, const pv_iweights *w, const pair_index *ix, const float unit[4][16],
                       const int32_t wsum[4][16], const float *alpha, bool scale_o, int nr, bool prefetch, float *o,
                       int64_t ldo) {
    for (int b0 = 0; b0 < sp.blocks; b0 += 2) {
        const int col0 = (g0 + b0) * ATTN_QBLOCK;
        if (b0 + 1 < sp.blocks)
            ipv_pass(dt, NR, v, stride, nj, goff, b0, 2, w, ix, unit, wsum, alpha, scale_o, nr, prefetch, o, ldo, col0);
        else
            ipv_pass(dt, NR, v, stride, nj, goff, b0, 1, w, ix, unit, wsum, alpha, scale_o, nr, prefetch, o, ldo, col0);
    }
}

// quant_pv_rows.h's pv_rows_impl: four rows' weights pp (advancing by ldp a key) and nj <= PV_KEYS
// keys, four blocks at a time: their scaled weights, rounded, then passes of two blocks (one for an
// odd last) for blocks of four rows, or of two and one (decoding without GQA); the float passes
// (four rows) for a tile whose weights are not finite.
INLINE void pv_rows_impl(const attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pp,
                         int64_t ldp, const float *alpha, bool scale_o, int nr, bool prefetch, float *o, int64_t ldo) {
    const int nb = Dv / ATTN_QBLOCK;
    const int64_t stride = vs_row / ATTN_QBLOCK * block_bytes(dt);
    const weight_lanes wl = weight_lanes_of(dt);
    const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
    const pair_index ix = pair_index_of();
    pv_fweights wf[(PV_KEYS + 3) / 4] __attribute__((aligned(64)));
    pv_iweights wi[(PV_KEYS + 3) / 4] __attribute__((aligned(64)));
    float unit[4][16] __attribute__((aligned(64)));
    int32_t wsum[4][16] __attribute__((aligned(64)));
    for (int g0 = 0; g0 < nb; g0 += 4) {
        const group_span sp = span_of(dt, nb, g0, 4);
        const int64_t goff = (int64_t)g0 * block_bytes(dt);
        __m512i wmax[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
        for (int j = 0; j < nj; j += 4) {
            __m512 x[4];
            block_weights4(dt, (const uint8_t *)v + goff, stride, j, nj - j < 4 ? nj - j : 4, pp, ldp, sp, &wl, x);
            for (int b = 0; b < 4; b++) {
                _mm512_store_ps(wf[j / 4][b], x[b]);
                wmax[b] = _mm512_max_epu32(wmax[b], _mm512_and_si512(_mm512_castps_si512(x[b]), magnitude));
            }
        }
        const bool ints = round_weights(dt, (const pv_fweights *)wf, nj, nr, wmax, wi, unit, wsum);
        const pv_iweights *w = (const pv_iweights *)wi;
        if (ints && nr >= 3)
            ipv_passes(dt, 4, v, stride, nj, goff, g0, sp, w, &ix, unit, wsum, alpha, scale_o, nr, prefetch, o, ldo);
        else if (ints && nr == 2)
            ipv_passes(dt, 2, v, stride, nj, goff, g0, sp, w, &ix, unit, wsum, alpha, scale_o, nr, prefetch, o, ldo);
        else if (ints)
            ipv_passes(dt, 1, v, stride, nj, goff, g0, sp, w, &ix, unit, wsum, alpha, scale_o, nr, prefetch, o, ldo);
        for (int b0 = 0; !ints && b0 < sp.blocks; b0 += 2) {
            const int col0 = (g0 + b0) * ATTN_QBLOCK, nbp = b0 + 1 < sp.blocks ? 2 : 1;
            if (nbp == 2)
                fpv_pass(dt, v, stride, nj, goff, b0, 2, (const pv_fweights *)wf, table, alpha, scale_o, nr, prefetch, o, ldo, col0);
            else
                fpv_pass(dt, v, stride, nj, goff, b0, 1, (const pv_fweights *)wf, table, alpha, scale_o, nr, prefetch, o, ldo, col0);
        }
    }
}


#endif

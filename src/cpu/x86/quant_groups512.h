// quant_groups512.h - what the AVX-512 decode kernels on dot-product instructions share
// (quant_kernels_avx512vnni.c: q.k on vpdpbusd and the P V of the "avx512vnni" table on vpdpwssd;
// quant_kernels_avx512bf16.c: P V on vdpbf16ps): the span of a group of blocks in a key or value row
// and the masks of its two 64-byte loads, the scale check that makes a key's score, or its weighted
// value, NaN where its block's scale is infinite or NaN, the P V weights times their keys' block
// scales, two keys' quants paired for the dot products of pairs, and the P V sums' addition to the
// output rows. Include after simd512.h.
#ifndef ATTN_CPU_X86_QUANT_GROUPS512_H
#define ATTN_CPU_X86_QUANT_GROUPS512_H

#include <stdbool.h>

#include "attn.h"
#include "cpu/flash.h"
#include "cpu/x86/quant_block.h"

// The blocks of a group of at most `per` blocks starting at block first of a row of nb, and the byte
// masks of its two 64-byte loads.
typedef struct group_span {
    int blocks;
    __mmask64 m0, m1;
} group_span;

INLINE __mmask64 bytes_mask(int n) { return n >= 64 ? ~(__mmask64)0 : n <= 0 ? 0 : (((__mmask64)1 << n) - 1); }

INLINE group_span span_of(attn_dtype dt, int nb, int first, int per) {
    group_span s;
    s.blocks = nb - first < per ? nb - first : per;
    const int bytes = s.blocks * block_bytes(dt);
    s.m0 = bytes_mask(bytes), s.m1 = bytes_mask(bytes - 64);
    return s;
}

// d + (d - d): NaN for an infinite or NaN scale d, else d.
INLINE __m512 nan_if_infinite(__m512 d) { return _mm512_add_ps(d, _mm512_sub_ps(d, d)); }

// The permutes of block_weights4 for a block type: sidx gathers a key's four block scales from its
// loads into words 4l + b, tidx moves the weights from lane 4l + r to 4r + l, db[b] block b's scales
// from lane 4l + b to 4r + l.
typedef struct weight_lanes {
    __m512i sidx, tidx, db[4];
} weight_lanes;

INLINE weight_lanes weight_lanes_of(attn_dtype dt) {
    uint16_t sw[32] = {0};
    int32_t tr[16], db[4][16];
    for (int i = 0; i < 16; i++) sw[i] = (uint16_t)(i % 4 * block_bytes(dt) / 2);
    for (int r = 0; r < 4; r++)
        for (int l = 0; l < 4; l++) {
            tr[4 * r + l] = 4 * l + r;
            for (int b = 0; b < 4; b++) db[b][4 * r + l] = 4 * l + b;
        }
    weight_lanes w;
    w.sidx = _mm512_loadu_si512(sw), w.tidx = _mm512_loadu_si512(tr);
    for (int b = 0; b < 4; b++) w.db[b] = _mm512_loadu_si512(db[b]);
    return w;
}

// The weights of four rows (pp[j * ldp + r]) for keys j .. j + nk - 1 (nk <= 4) times each key's
// scales of the (up to four) blocks of a group from byte v of its row (rows `stride` bytes apart;
// sp: the group's load masks): x[b] lane 4r + l holds key j + l's weight of row r times its block
// b's scale (0 for keys past nk). The 16 scales are gathered into one vector (Q4_0: they lie in a
// key's first 64 bytes, one vpermw each; Q8_0: two loads and vpermt2w) and converted once; an
// infinite or NaN scale gives NaN for every row.
INLINE void block_weights4(const attn_dtype dt, const uint8_t *v, int64_t stride, int j, int nk, const float *pp,
                           int64_t ldp, group_span sp, const weight_lanes *wl, __m512 x[4]) {
    __m512i dw = _mm512_setzero_si512();
    for (int l = 0; l < nk; l++) {
        const uint8_t *row = v + (int64_t)(j + l) * stride;
        const __mmask32 mine = (__mmask32)0xF << (4 * l);
        if (dt == ATTN_DTYPE_Q4_0)
            dw = _mm512_mask_permutexvar_epi16(dw, mine, wl->sidx, _mm512_maskz_loadu_epi8(sp.m0, row));
        else
            dw = _mm512_mask_mov_epi16(dw, mine, _mm512_permutex2var_epi16(_mm512_maskz_loadu_epi8(sp.m0, row), wl->sidx,
                                                                           _mm512_maskz_loadu_epi8(sp.m1, row + 64)));
    }
    const __m512 d = nan_if_infinite(_mm512_cvtph_ps(_mm512_castsi512_si256(dw))); // lane 4l + b
    __m512 p; // lane 4l + r: key j + l's weight of row r
    if (ldp == 4) p = _mm512_maskz_loadu_ps((__mmask16)((1u << (4 * nk)) - 1), pp + (int64_t)j * 4);
    else {
        p = _mm512_setzero_ps();
        for (int l = 0; l < nk; l++)
            p = _mm512_mask_broadcast_f32x4(p, (__mmask16)(0xFu << (4 * l)), _mm_loadu_ps(pp + (int64_t)(j + l) * ldp));
    }
    p = _mm512_permutexvar_ps(wl->tidx, p);
    for (int b = 0; b < 4; b++) x[b] = _mm512_mul_ps(p, _mm512_permutexvar_ps(wl->db[b], d)); // keys past nk: p = d = 0
}

// The rows of keys j and j + 1 from byte off of each (rows `stride` bytes apart; for j + 1 = nj the
// row of key j again, which its partner's weight 0 cancels), in *x and *y; with prefetch, their
// bytes [off, off + span) one key tile (FLASH_BC rows) on are requested into L2 (decode_prefetch.h).
INLINE void key_pair_rows(const uint8_t *v, int64_t stride, int j, int nj, int64_t off, int span, bool prefetch,
                          const uint8_t **x, const uint8_t **y) {
    *x = v + (int64_t)j * stride + off;
    *y = j + 1 < nj ? *x + stride : *x;
    if (prefetch) {
        const int64_t pf = FLASH_BC * stride;
        _mm_prefetch((const char *)*x + pf, _MM_HINT_T1), _mm_prefetch((const char *)*x + pf + span - 1, _MM_HINT_T1);
        _mm_prefetch((const char *)*y + pf, _MM_HINT_T1), _mm_prefetch((const char *)*y + pf + span - 1, _MM_HINT_T1);
    }
}

// Two keys' 16 quant bytes side by side, x's and y's: word 2i of the result holds byte i of x, word
// 2i + 1 byte i of y, zero-extended, so that dword i pairs the two keys' byte i for the dot products
// of pairs (vpdpwssd, vdpbf16ps).
INLINE __m512i pair_bytes(const uint8_t *x, const uint8_t *y) {
    const __m128i a = _mm_loadu_si128((const __m128i *)x), b = _mm_loadu_si128((const __m128i *)y);
    return _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b)));
}

// o's four rows (ldo apart; nr of them real) from column col0: o = alpha o + the sums c (row r's
// columns 16x.. of block bb in c[8 bb + 2 r + x], nbp blocks), alpha 1 unless scale_o.
INLINE void add_block_sums(const __m512 c[16], const int nbp, const float *alpha, bool scale_o, int nr, float *o,
                           int64_t ldo, int col0) {
    for (int r = 0; r < nr; r++) {
        float *orow = o + (int64_t)r * ldo + col0;
        const __m512 a = _mm512_set1_ps(scale_o ? alpha[r] : 1.0f);
        for (int bb = 0; bb < nbp; bb++)
            for (int x = 0; x < 2; x++) {
                float *q = orow + ATTN_QBLOCK * bb + 16 * x;
                _mm512_storeu_ps(q, _mm512_fmadd_ps(a, _mm512_loadu_ps(q), c[8 * bb + 2 * r + x]));
            }
    }
}

#endif

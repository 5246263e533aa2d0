// quant_avx2.h - the decode row kernels of cpu.h (prep_q, qk_rows_q, pv_rows_q, dequant_rows) for
// Q8_0 and Q4_0 keys and values in the AVX2 table, with AVX2, FMA3 and F16C, in two forms that give
// the same bits: quant_kernels_avx2.c compiles them on vpmaddubsw and vpmaddwd, and
// quant_kernels_avxvnni.c (ATTN_AVX_VNNI) on AVX-VNNI's vpdpbusd and vpdpwssd, which sum 8- and
// 16-bit products into int32 lanes in one instruction (the table "avx2+vnni", which
// attn__kernels_for gives ATTN_ISA_AVX2 where CPUID reports AVX-VNNI: Intel's cores since Alder
// Lake and Sapphire Rapids, among others). The block helpers and the loops around the row kernels
// (per element type, rows and key tiles) are quant_rows.h's and quant_pv_rows.h's, shared with the
// AVX-512 files.
//
// q.k runs on 8-bit products, as the AVX-512 VNNI kernels' (quant_kernels_avx512vnni.c, whose step
// layout quant_steps.h holds for both) and as ggml rounds its query for these types: prep_q rounds each
// query row to int8 per block of 32 (d_q = max|q| / 127), laid out per step; two keys go at once,
// each block's quants of both keys loaded into the two 128-bit lanes and transposed by dwords
// (Q4_0) or qwords (Q8_0) into step vectors whose lane 4l + c holds key l's bytes for column c (one
// block's), so that the lanes need no sums across them until the row's end. vpmaddubsw (unsigned
// times signed bytes, pairs summed) meets them with the query bytes: Q4_0's nibbles n as they are
// (the -8 of n - 8 as -8 times the column's query sum), Q8_0's quants as |q| against the query
// bytes given q's sign. vpdpbusd (four such products summed into an int32 lane, added to it, no
// saturation) takes Q8_0's quants flipped to q + 128 instead, one flip a step vector for every row
// (the -128 as -128 times the column's query sum, as the AVX-512 VNNI kernels do: so the forms'
// prep_q differ there). One conversion and one multiply by d_k d_q a row serve two keys and four
// columns. A query holding a NaN or an infinity stays float (prep_header) and goes to the float
// q.k below (8 quants at a time widened to int32, converted to float and multiplied by the
// block's scale d: q * d is exact, so its products are those of the float kernels on the
// dequantised values; four query rows against two keys a pass). attn.h gives the bound of the
// query's rounding (attn_isa_int8_query); a block with an infinite or NaN scale makes its key's
// score NaN (d_k + (d_k - d_k)). Every integer sum is exact in both forms (the bounds are at each
// sum), so the two give the same scores.
//
// pv_rows folds d into the weights: for four blocks of 32 columns at a time it first forms each
// key's four weights times each block's scale (p * d; two blocks a vector), rounds them to int16
// against their largest magnitude over the tile (as the AVX512_VNNI table, "P V" below) and runs
// each block's two halves of 16 columns over the keys in pairs on vpmaddwd and vpaddd, or vpdpwssd
// (8 accumulators: four rows, two vectors; Q4_0's n - 8 as the sum over n less 8 times the sum of
// the weights); a tile whose weights are not all finite takes the same passes with the quants as
// floats.
//
// Prefetch (see decode_prefetch.h): qk_rows requests each key row's lines DECODE_PF_BYTES ahead as
// it reads the row; each pv_rows pass requests the half-block it reads, FLASH_BC rows on.
#ifndef ATTN_CPU_X86_QUANT_AVX2_H
#define ATTN_CPU_X86_QUANT_AVX2_H

#ifndef ATTN_AVX_VNNI
#define ATTN_AVX_VNNI 0
#endif

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/x86/decode_prefetch.h"
#include "cpu/x86/quant_pv_rows.h"
#include "cpu/x86/quant_rows.h"
#include "cpu/x86/quant_steps.h"
#include "half.h"

#if ATTN_AVX_VNNI && !defined(ATTN_EMULATE_AVX512)
// c + the sums of a's unsigned bytes times b's signed bytes, four a lane (vpdpbusd); c + the sums of
// a's and b's word pairs' products (vpdpwssd). No saturation.
#define vnni_dpbusd _mm256_dpbusd_avx_epi32
#define vnni_dpwssd _mm256_dpwssd_avx_epi32
#elif ATTN_AVX_VNNI
// The emulated AVX-512 build (a test build) compiles this form without -mavxvnni and runs it on any
// CPU with AVX2 through these plain-C models of the two instructions.
INLINE __m256i vnni_dpbusd(__m256i c, __m256i a, __m256i b) {
    int32_t acc[8];
    uint8_t u[32];
    int8_t v[32];
    memcpy(acc, &c, sizeof acc), memcpy(u, &a, sizeof u), memcpy(v, &b, sizeof v);
    for (int i = 0; i < 8; i++)
        for (int t = 0; t < 4; t++) acc[i] += (int32_t)u[4 * i + t] * v[4 * i + t];
    memcpy(&c, acc, sizeof acc);
    return c;
}
INLINE __m256i vnni_dpwssd(__m256i c, __m256i a, __m256i b) {
    int32_t acc[8];
    int16_t x[16], y[16];
    memcpy(acc, &c, sizeof acc), memcpy(x, &a, sizeof x), memcpy(y, &b, sizeof y);
    for (int i = 0; i < 8; i++) acc[i] += (int32_t)x[2 * i] * y[2 * i] + (int32_t)x[2 * i + 1] * y[2 * i + 1];
    memcpy(&c, acc, sizeof acc);
    return c;
}
#endif

// The scale d of the block at b, broadcast: as float16 (vpbroadcastw), then converted in the vector.
INLINE __m256 scale_of(const uint8_t *b) { return _mm256_cvtph_ps(_mm_set1_epi16((short)scale_bits(b))); }

// The quants 8c .. 8c + 7 (c < 4) of the block at b as floats: Q8_0's q, Q4_0's nibbles n (the
// values without the -8 of n - 8).
INLINE __m256 load8_quants(attn_dtype dt, const uint8_t *b, int c) {
    if (dt == ATTN_DTYPE_Q8_0) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * c))));
    const __m256i n = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * (c % 2))));
    return _mm256_cvtepi32_ps(c < 2 ? _mm256_and_si256(n, _mm256_set1_epi32(15)) : _mm256_srli_epi32(n, 4));
}

// Values 8c .. 8c + 7 (c < 4) of the block at b as floats, not yet multiplied by its scale.
INLINE __m256 load8_unscaled(attn_dtype dt, const uint8_t *b, int c) {
    const __m256 x = load8_quants(dt, b, c);
    return dt == ATTN_DTYPE_Q4_0 ? _mm256_sub_ps(x, _mm256_set1_ps(8.0f)) : x;
}

// Values 8c .. 8c + 7 (c < 4) of the block at b, its scale d broadcast in `d`, as floats.
INLINE __m256 load8(attn_dtype dt, const uint8_t *b, __m256 d, int c) { return _mm256_mul_ps(load8_unscaled(dt, b, c), d); }

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
            if (r0 == 0) {
                decode_prefetch_bytes(ka, DECODE_PF_BYTES, row_bytes);
                decode_prefetch_bytes(kb, DECODE_PF_BYTES, row_bytes);
            }
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

// ---- q.k on 8-bit products --------------------------------------------------------------------

// One query row's group as prep_q lays it out (quant_steps.h's layout, two keys a vector: key l in
// lanes 4l .. 4l + 3), each field repeated in both keys' 128-bit lanes: q[s] the 16 query bytes of
// step s (byte 4c + i: the value that column c's byte i meets; Q8_0 uses steps 0-3), init[c] -8
// times the sum of column c's bytes over the steps (Q4_0, for the n of n - 8; Q8_0 -128 for the
// flip to q + 128 in the AVX-VNNI form, else 0), dq[c] the scale of column c's block. Blocks past
// the row's end are 0.
typedef struct q_group {
    int8_t q[8][32];
    int32_t init[8];
    float dq[8];
} __attribute__((aligned(32))) q_group;

// One block of 32 query values rounded to int8: d = max|x| / 127 and q = x * (127 / max|x|) to
// nearest even; a block whose largest magnitude is below 2^-96 becomes zeros. The values are finite.
static void quantise_block(const float *x, int8_t q[32], float *dq) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + 8 * i), m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const bool ok = amax >= 0x1p-96f;
    *dq = ok ? amax / 127.0f : 0.0f;
    const __m256 id = _mm256_set1_ps(ok ? 127.0f / amax : 0.0f);
    __m256i n[4];
    for (int i = 0; i < 4; i++)
        n[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // the packs interleave the 128-bit lanes: dwords 0, 4, 1, 5, ... after both
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// One row's group in q_group form (prep_rows' store): the bytes of each step, -8 (Q4_0) or -128
// (Q8_0 with AVX-VNNI; else 0) times the column sums and the scales, repeated in both keys' lanes.
static void store_group(attn_dtype dt, void *groups, int64_t index, const int32_t step[8][4], const int32_t sum[4],
                        const float dq[4]) {
    q_group *p = (q_group *)groups + index;
    int32_t init[4];
    for (int c = 0; c < 4; c++) init[c] = (dt == ATTN_DTYPE_Q4_0 ? -8 : ATTN_AVX_VNNI ? -128 : 0) * sum[c];
    for (int s = 0; s < qk_steps(dt); s++)
        _mm256_store_si256((__m256i *)p->q[s], _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)step[s])));
    _mm256_store_si256((__m256i *)p->init, _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)init)));
    _mm256_store_ps(p->dq, _mm256_broadcast_ps((const __m128 *)dq));
}


// d + (d - d): NaN for an infinite or NaN scale d, else d.
INLINE __m256 nan_if_infinite(__m256 d) { return _mm256_add_ps(d, _mm256_sub_ps(d, d)); }

// 16 bytes of key 0 at a and of key 1 at b (zeros where a is NULL): a vector with each in its lane.
INLINE __m256i load_pair(const uint8_t *a, const uint8_t *b) {
    if (a == NULL) return _mm256_setzero_si256();
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                   _mm_loadu_si128((const __m128i *)b), 1);
}

// The scales of the two keys' blocks, lane 4l + c: key l's block of column c (0 past the row's end;
// NaN for an infinite or NaN scale), as floats.
INLINE __m256 pair_scales(const attn_dtype dt, const uint8_t *x0, const uint8_t *x1, int blocks) {
    if (dt == ATTN_DTYPE_Q8_0) { // two blocks a key, each scale in two lanes: one 16-bit unpack
        const int bb = block_bytes(dt);
        const uint32_t s0 = scale_bits(x0) | (blocks > 1 ? (uint32_t)scale_bits(x0 + bb) << 16 : 0u);
        const uint32_t s1 = scale_bits(x1) | (blocks > 1 ? (uint32_t)scale_bits(x1 + bb) << 16 : 0u);
        const __m128i s = _mm_insert_epi32(_mm_cvtsi32_si128((int)s0), (int)s1, 1);
        return nan_if_infinite(_mm256_cvtph_ps(_mm_unpacklo_epi16(s, s)));
    }
    if (blocks >= 4) { // Q4_0, a whole group: key l's four scales in dwords 2l, 2l + 1
        const int bb = block_bytes(dt);
        const uint32_t a0 = scale_bits(x0) | (uint32_t)scale_bits(x0 + bb) << 16;
        const uint32_t a1 = scale_bits(x0 + 2 * bb) | (uint32_t)scale_bits(x0 + 3 * bb) << 16;
        const uint32_t b0 = scale_bits(x1) | (uint32_t)scale_bits(x1 + bb) << 16;
        const uint32_t b1 = scale_bits(x1 + 2 * bb) | (uint32_t)scale_bits(x1 + 3 * bb) << 16;
        return nan_if_infinite(_mm256_cvtph_ps(_mm_setr_epi32((int)a0, (int)a1, (int)b0, (int)b1)));
    }
    uint64_t w[2] = {0, 0}; // Q4_0's last group of fewer blocks
    for (int c = 0; c < 4; c++) {
        const int b = column_block(dt, c);
        if (b < blocks)
            w[0] |= (uint64_t)scale_bits(x0 + b * block_bytes(dt)) << (16 * c),
            w[1] |= (uint64_t)scale_bits(x1 + b * block_bytes(dt)) << (16 * c);
    }
    return nan_if_infinite(_mm256_cvtph_ps(_mm_set_epi64x((long long)w[1], (long long)w[0])));
}

// Q4_0: two keys' groups (x0, x1: the group's first block; `blocks` of them in the row) against NR
// (4, 2 or 1) query rows' groups p[r]: in i32[r] lane 4l + c row r's products with key l over column
// c (the nibbles n, less 8 times the query's column sum: n - 8). Each block's 16 quant bytes of both keys
// are loaded into the two lanes, transposed by dwords into the step vectors and split into nibbles;
// each row's 8 steps meet them with its query bytes in vpmaddubsw (unsigned times signed bytes,
// pairs summed), added in 16 bits (at most 8 * 2 * 15 * 127 = 30480) and widened once by vpmaddwd,
// or in vpdpbusd, summed into the int32 lanes from the start.
INLINE void q4_pairs(const int NR, const uint8_t *x0, const uint8_t *x1, int blocks, const q_group *const p[4],
                     __m256i i32[4]) {
    const int bb = block_bytes(ATTN_DTYPE_Q4_0);
    __m256i x[4], k[8];
    for (int b = 0; b < 4; b++) x[b] = load_pair(b < blocks ? x0 + b * bb + 2 : NULL, x1 + b * bb + 2);
    const __m256i t01l = _mm256_unpacklo_epi32(x[0], x[1]), t01h = _mm256_unpackhi_epi32(x[0], x[1]);
    const __m256i t23l = _mm256_unpacklo_epi32(x[2], x[3]), t23h = _mm256_unpackhi_epi32(x[2], x[3]);
    const __m256i st[4] = {_mm256_unpacklo_epi64(t01l, t23l), _mm256_unpackhi_epi64(t01l, t23l),
                           _mm256_unpacklo_epi64(t01h, t23h), _mm256_unpackhi_epi64(t01h, t23h)};
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int t = 0; t < 4; t++) k[t] = _mm256_and_si256(st[t], m4), k[4 + t] = _mm256_and_si256(_mm256_srli_epi16(st[t], 4), m4);
    for (int r = 0; r < NR; r++) {
#if ATTN_AVX_VNNI
        __m256i a = _mm256_load_si256((const __m256i *)p[r]->init);
        for (int s = 0; s < 8; s++) a = vnni_dpbusd(a, k[s], _mm256_load_si256((const __m256i *)p[r]->q[s]));
        i32[r] = a;
#else
        __m256i a = _mm256_maddubs_epi16(k[0], _mm256_load_si256((const __m256i *)p[r]->q[0]));
        for (int s = 1; s < 8; s++)
            a = _mm256_add_epi16(a, _mm256_maddubs_epi16(k[s], _mm256_load_si256((const __m256i *)p[r]->q[s])));
        i32[r] = _mm256_add_epi32(_mm256_madd_epi16(a, _mm256_set1_epi16(1)), _mm256_load_si256((const __m256i *)p[r]->init));
#endif
    }
}

// Q8_0, a group of two blocks (column c: block c / 2): both halves of each block of both keys loaded
// into the two lanes and transposed by qwords into the step vectors st, k their magnitudes |k|
// (vpmaddubsw multiplies unsigned by signed bytes; q8_row gives the query bytes k's sign), or with
// AVX-VNNI the quants flipped to k + 128 (the query bytes as they are; init holds the -128).
INLINE void q8_steps(const uint8_t *x0, const uint8_t *x1, int blocks, __m256i st[4], __m256i k[4]) {
    const int bb = block_bytes(ATTN_DTYPE_Q8_0);
    __m256i lo[2], hi[2];
    for (int b = 0; b < 2; b++) {
        lo[b] = load_pair(b < blocks ? x0 + b * bb + 2 : NULL, x1 + b * bb + 2);
        hi[b] = load_pair(b < blocks ? x0 + b * bb + 18 : NULL, x1 + b * bb + 18);
    }
    st[0] = _mm256_unpacklo_epi64(lo[0], lo[1]), st[1] = _mm256_unpackhi_epi64(lo[0], lo[1]);
    st[2] = _mm256_unpacklo_epi64(hi[0], hi[1]), st[3] = _mm256_unpackhi_epi64(hi[0], hi[1]);
#if ATTN_AVX_VNNI
    for (int t = 0; t < 4; t++) k[t] = _mm256_xor_si256(st[t], _mm256_set1_epi8((char)0x80));
#else
    for (int t = 0; t < 4; t++) k[t] = _mm256_abs_epi8(st[t]);
#endif
}

// One query row's group p against q8_steps' vectors: lane 4l + c, the products with key l over column
// c; each step's pair sums (at most 2 * 128 * 127) widened by vpmaddwd and added in 32 bits, or with
// AVX-VNNI the flipped quants' products summed by vpdpbusd from init (-128 times the query's sums).
INLINE __m256i q8_row(const __m256i st[4], const __m256i k[4], const q_group *p) {
#if ATTN_AVX_VNNI
    (void)st;
    __m256i i32 = _mm256_load_si256((const __m256i *)p->init);
    for (int t = 0; t < 4; t++) i32 = vnni_dpbusd(i32, k[t], _mm256_load_si256((const __m256i *)p->q[t]));
#else
    __m256i i32 = _mm256_setzero_si256();
    for (int t = 0; t < 4; t++) {
        const __m256i qs = _mm256_sign_epi8(_mm256_load_si256((const __m256i *)p->q[t]), st[t]);
        i32 = _mm256_add_epi32(i32, _mm256_madd_epi16(_mm256_maddubs_epi16(k[t], qs), _mm256_set1_epi16(1)));
    }
#endif
    return i32;
}

// Two keys' groups against NR query rows' groups (q4_pairs; q8_steps and q8_row): acc[r] lane
// 4l + c gains row r's products with key l over column c, converted and multiplied by d_k d_q.
INLINE void keys_group(const attn_dtype dt, const int NR, const uint8_t *x0, const uint8_t *x1, int blocks,
                       const q_group *const p[4], __m256 acc[4]) {
    __m256i i32[4], st[4], k[4];
    if (dt == ATTN_DTYPE_Q4_0) q4_pairs(NR, x0, x1, blocks, p, i32);
    else q8_steps(x0, x1, blocks, st, k);
    const __m256 dk = pair_scales(dt, x0, x1, blocks);
    for (int r = 0; r < NR; r++) {
        const __m256i n = dt == ATTN_DTYPE_Q4_0 ? i32[r] : q8_row(st, k, p[r]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(n), _mm256_mul_ps(dk, _mm256_load_ps(p[r]->dq)), acc[r]);
    }
}

// The scores of nr rows (lane r) of nk keys (key c in half c of h) at s[c s_j + r s_r].
INLINE void store_pair(__m256 h, float *s, int64_t s_r, int64_t s_j, int nr, int nk) {
    if (s_r == 1 && nr == 4) { // the decode tiles' layout: a key's rows side by side
        _mm_storeu_ps(s, _mm256_castps256_ps128(h));
        if (nk > 1) _mm_storeu_ps(s + s_j, _mm256_extractf128_ps(h, 1));
        return;
    }
    if (s_r == 1) {
        const __m128i m = _mm_cmpgt_epi32(_mm_set1_epi32(nr), _mm_setr_epi32(0, 1, 2, 3));
        _mm_maskstore_ps(s, m, _mm256_castps256_ps128(h));
        if (nk > 1) _mm_maskstore_ps(s + s_j, m, _mm256_extractf128_ps(h, 1));
        return;
    }
    float out[8];
    _mm256_storeu_ps(out, h);
    for (int c = 0; c < nk; c++)
        for (int r = 0; r < nr; r++) s[c * s_j + r * s_r] = out[4 * c + r];
}

// q.k of NR prepared rows (G groups a row; nr of them real, the others repeat the first) against nj
// keys, two keys a pass (a tile's odd last key repeats). NR = 4 takes blocks of three or four rows,
// 2 and 1 the few rows of decoding without GQA: a missing row's sums are the first row's, copied
// rather than computed. Each (row, key) sum is the same whatever NR.
INLINE void qk_rows_block(const attn_dtype dt, const int NR, const void *k, int64_t ks_row, int nj, const int D,
                          const int G, const q_group *qg, int nr, bool prefetch, float *s, int64_t s_r, int64_t s_j) {
    const int nb = D / ATTN_QBLOCK, per = qk_blocks(dt), row_bytes = nb * block_bytes(dt);
    const q_group *qr[4];
    for (int r = 0; r < 4; r++) qr[r] = qg + (int64_t)(r < nr ? r : 0) * G;
    for (int j = 0; j < nj; j += 2) {
        const uint8_t *x0 = block_at(k, dt, (int64_t)j * ks_row);
        const uint8_t *x1 = block_at(k, dt, (int64_t)(j + 1 < nj ? j + 1 : nj - 1) * ks_row);
        if (prefetch) {
            decode_prefetch_bytes(x0, DECODE_PF_BYTES, row_bytes);
            decode_prefetch_bytes(x1, DECODE_PF_BYTES, row_bytes);
        }
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int g = 0; g < G; g++) {
            const int64_t off = (int64_t)g * per * block_bytes(dt);
            const q_group *const pg[4] = {qr[0] + g, qr[1] + g, qr[2] + g, qr[3] + g};
            keys_group(dt, NR, x0 + off, x1 + off, nb - per * g, pg, acc);
        }
        for (int r = NR; r < 4; r++) acc[r] = acc[0];
        // acc[r] lane 4l + c -> the sum over c: lane r of key 0 (low half), of key 1 (high half)
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
        store_pair(h, s + (int64_t)j * s_j, s_r, s_j, nr, nj - j < 2 ? nj - j : 2);
    }
}

// q.k of the prepared rows (G groups a row) against nj keys, four rows at a time.
INLINE void qk_rows_int8(const attn_dtype dt, const void *k, int64_t ks_row, int nj, const int D, const int G,
                         const q_group *qg, int rows, float *s, int64_t s_r, int64_t s_j) {
    for (int r0 = 0; r0 < rows; r0 += 4) {
        const int nr = rows - r0 < 4 ? rows - r0 : 4;
        const q_group *qb = qg + (int64_t)r0 * G;
        float *sb = s + (int64_t)r0 * s_r;
        if (nr >= 3) qk_rows_block(dt, 4, k, ks_row, nj, D, G, qb, nr, r0 == 0, sb, s_r, s_j);
        else if (nr == 2) qk_rows_block(dt, 2, k, ks_row, nj, D, G, qb, nr, r0 == 0, sb, s_r, s_j);
        else qk_rows_block(dt, 1, k, ks_row, nj, D, G, qb, nr, r0 == 0, sb, s_r, s_j);
    }
}


// P V. The float form multiplies the quants as floats by the weights times their keys' block
// scales (p * d, folded in once a key and block) in vector FMAs: 64 a key for four rows and 128
// columns, and a conversion of the quants for every 8 of them. The integer form rounds those
// products w = p * d of each row and block over the tile (at most PV_KEYS keys) to int16 against
// their largest magnitude W, w' = round(w * 32767 / W) (W taken as at least 2^-110), as the
// AVX512_VNNI table does; two keys' quants (exact in int16: Q4_0's nibbles n, Q8_0's q) go in each
// dword, and vpmaddwd meets them with the two keys' rounded weights, its int32 sums added by vpaddd:
// 32 vpmaddwd and 32 vpaddd a key (the sums are exact: at most 96 * 32767 * 255 in magnitude). The
// sums are scaled back by W / 32767; Q4_0's n - 8 is the nibbles' sum less 8 times the rounded
// weights' sum, and its high nibbles n' meet the weights as the whole bytes u = 16 n' + n, whose
// sums less the low nibbles' are 16 times theirs (exactly; a subtraction and a shift a sum in the
// end instead of two shifts a key pair). attn.h's kv_dtype bound gives the error this adds (each
// weight within W / 65534 plus float32 rounding; over a tile a row's weights sum to at least their
// largest). A tile whose weights are not all finite (an infinite or NaN block scale:
// nan_if_infinite in group_scales) takes the float form, where such a scale makes the rows that
// weigh it NaN or +-inf as the float kernels' q * d values do.

_Static_assert(PV_KEYS <= 96, "the int32 sums of the int16 P V and attn.h's bound assume tiles of at most 96 keys");

// Half h (columns 16h .. 16h + 15) of one block of the value rows (b: key 0's block, the next
// key's row_bytes on) for four rows with the weights w (the block's scale folded in; key j's four
// at w[16 j]), in floats: per key two vectors of quants (load8_quants: Q4_0's -8 is the caller's)
// and the four weights broadcast, eight accumulators, left in c[0..7] (row r: c[2r], c[2r + 1]).
INLINE void pv_half(const attn_dtype dt, const int h, const uint8_t *b, int64_t row_bytes, int nj, const float *w,
                    bool prefetch, __m256 c[8]) {
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    const int64_t pf = FLASH_BC * row_bytes; // the same columns, a tile on
    for (int j = 0; j < nj; j++, b += row_bytes, w += 16) {
        if (prefetch) _mm_prefetch((const char *)b + pf + 2 + 16 * h, _MM_HINT_T1);
        const __m256 v0 = load8_quants(dt, b, 2 * h), v1 = load8_quants(dt, b, 2 * h + 1);
        const __m256 w0 = _mm256_broadcast_ss(w), w1 = _mm256_broadcast_ss(w + 1), w2 = _mm256_broadcast_ss(w + 2),
                     w3 = _mm256_broadcast_ss(w + 3);
        c0 = _mm256_fmadd_ps(w0, v0, c0), c1 = _mm256_fmadd_ps(w0, v1, c1);
        c2 = _mm256_fmadd_ps(w1, v0, c2), c3 = _mm256_fmadd_ps(w1, v1, c3);
        c4 = _mm256_fmadd_ps(w2, v0, c4), c5 = _mm256_fmadd_ps(w2, v1, c5);
        c6 = _mm256_fmadd_ps(w3, v0, c6), c7 = _mm256_fmadd_ps(w3, v1, c7);
    }
    c[0] = c0, c[1] = c1, c[2] = c2, c[3] = c3, c[4] = c4, c[5] = c5, c[6] = c6, c[7] = c7;
}

// c + the products of a and b's word pairs (vpmaddwd, vpaddd; vpdpwssd with AVX-VNNI). GCC (12)
// gives the sum a register of its own and copies it back into the accumulator carried through the
// loop (a move an instruction, and a spill in ipv_half); the addition, or the dot product, itself
// in that case.
INLINE __m256i add_madd(__m256i c, __m256i a, __m256i b) {
#if ATTN_AVX_VNNI && defined(__GNUC__) && !defined(__clang__) && !defined(ATTN_EMULATE_AVX512)
    __asm__("%{vex%} vpdpwssd %2, %1, %0" : "+x"(c) : "x"(a), "x"(b)); // the VEX form: AVX-VNNI, not AVX512-VL
    return c;
#elif ATTN_AVX_VNNI
    return vnni_dpwssd(c, a, b);
#elif defined(__GNUC__) && !defined(__clang__)
    const __m256i t = _mm256_madd_epi16(a, b);
    __asm__("vpaddd %1, %0, %0" : "+x"(c) : "x"(t));
    return c;
#else
    return _mm256_add_epi32(c, _mm256_madd_epi16(a, b));
#endif
}

// The products of one key pair (x, y: their blocks; wi: the pair's dwords of rounded weights, row r
// at wi[r]) for half h added to c[0 .. 2 NR - 1] as ipv_half's, whose columns they leave in the
// order 0-3, 8-11 (c[2r]) and 4-7, 12-15 (c[2r + 1]) of the half. Each key's 16 quant bytes of the half
// are widened to words straight from memory (vpmovzxbw / vpmovsxbw with a memory operand: the same
// widening from a register is a lane-crossing shuffle that a Zen 3 runs at 0.8 a cycle, against 2) and
// the two keys' words interleaved in each lane (vpunpck[lh]wd), so that a dword holds both keys'
// value of one column.
INLINE void ipv_pair(const attn_dtype dt, const int NR, const int h, const uint8_t *x, const uint8_t *y,
                     const int32_t *wi, __m256i c[8]) {
    const int off = dt == ATTN_DTYPE_Q4_0 ? 2 : 2 + 16 * h; // Q4_0: the half's nibbles, low or high, of all 16 bytes
    const __m128i *xa = (const __m128i *)(x + off), *ya = (const __m128i *)(y + off);
    __m256i xw, yw; // the half's 16 values of each key, as words (Q4_0's second half: the whole bytes)
    if (dt == ATTN_DTYPE_Q4_0) {
        const __m256i m4 = _mm256_set1_epi16(0x0F);
        xw = _mm256_cvtepu8_epi16(_mm_loadu_si128(xa)), yw = _mm256_cvtepu8_epi16(_mm_loadu_si128(ya));
        if (h == 0) xw = _mm256_and_si256(xw, m4), yw = _mm256_and_si256(yw, m4);
    } else {
        xw = _mm256_cvtepi8_epi16(_mm_loadu_si128(xa)), yw = _mm256_cvtepi8_epi16(_mm_loadu_si128(ya));
    }
    const __m256i v0 = _mm256_unpacklo_epi16(xw, yw), v1 = _mm256_unpackhi_epi16(xw, yw);
    for (int r = 0; r < NR; r++) {
        const __m256i w = _mm256_set1_epi32(wi[r]);
        c[2 * r] = add_madd(c[2 * r], v0, w), c[2 * r + 1] = add_madd(c[2 * r + 1], v1, w);
    }
}

// The same half as pv_half on the rounded weights, keys in pairs (wi: pair i's 16 dwords from wi[16
// i], dword r: row r's int16 weights of keys 2i (low word) and 2i + 1 for this block; a tile's odd
// last key pairs with itself under the weight 0): int32 sums of NR rows in c[0 .. 2 NR - 1] as
// pv_half's, which requests the same lines a tile on when `prefetch`.
INLINE void ipv_half(const attn_dtype dt, const int NR, const int h, const uint8_t *b, int64_t row_bytes, int nj,
                     const int32_t *wi, bool prefetch, __m256i c[8]) {
    __m256i acc[8];
    for (int x = 0; x < 2 * NR; x++) acc[x] = _mm256_setzero_si256();
    const int64_t pf = FLASH_BC * row_bytes + 2 + 16 * h;
    int j = 0;
    for (; j + 1 < nj; j += 2, b += 2 * row_bytes, wi += 16) {
        if (prefetch) _mm_prefetch((const char *)b + pf, _MM_HINT_T1), _mm_prefetch((const char *)b + row_bytes + pf, _MM_HINT_T1);
        ipv_pair(dt, NR, h, b, b + row_bytes, wi, acc);
    }
    if (j < nj) {
        if (prefetch) _mm_prefetch((const char *)b + pf, _MM_HINT_T1);
        ipv_pair(dt, NR, h, b, b, wi, acc);
    }
    for (int x = 0; x < 2 * NR; x++) c[x] = acc[x];
}

// The scales of the nbg (at most four) blocks from b as floats, lanes past nbg 0.
INLINE __m128 group_scales(const attn_dtype dt, const uint8_t *b, int nbg) {
    const int bb = block_bytes(dt);
    const uint32_t s0 = scale_bits(b), s1 = nbg > 1 ? scale_bits(b + bb) : 0u;
    const uint32_t s2 = nbg > 2 ? scale_bits(b + 2 * bb) : 0u, s3 = nbg > 3 ? scale_bits(b + 3 * bb) : 0u;
    return _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128((int)(s0 | s1 << 16)), (int)(s2 | s3 << 16), 1));
}

// A tile's weights for the integer form: wf (key j: block g's four at wf[16 j + 4 g], row r's at
// + r) rounded against wmax (lane 4 (g % 2) + r of wmax[g / 2]: the largest magnitude's bits, over
// the keys) into wi (pair i's dwords at wi[16 i + 4 g + r]), with unit[4 g + r] = W / 32767 and
// wsum[4 g + r] the rounded weights' sum. False, with nothing written, when a weight of the nr real
// rows is not finite.
INLINE bool round_weights(const float *wf, int nj, int nr, const __m256i wmax[2], int32_t *wi, float unit[16],
                          int32_t wsum[16]) {
    const __m256i real = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3));
    const __m256i inf = _mm256_set1_epi32(0x7F7FFFFF);
    const __m256i bad = _mm256_or_si256(_mm256_cmpgt_epi32(wmax[0], inf), _mm256_cmpgt_epi32(wmax[1], inf));
    if (!_mm256_testz_si256(bad, real)) return false;
    __m256 scale[2];
    for (int x = 0; x < 2; x++) {
        const __m256 top = _mm256_max_ps(_mm256_castsi256_ps(wmax[x]), _mm256_set1_ps(0x1p-110f));
        scale[x] = _mm256_div_ps(_mm256_set1_ps(32767.0f), top);
        _mm256_storeu_ps(unit + 8 * x, _mm256_div_ps(top, _mm256_set1_ps(32767.0f)));
    }
    __m256i sum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int j = 0; j < nj; j += 2, wi += 16)
        for (int x = 0; x < 2; x++) {
            const __m256 f0 = _mm256_mul_ps(_mm256_load_ps(wf + 16 * j + 8 * x), scale[x]);
            const __m256i y0 = _mm256_cvtps_epi32(_mm256_round_ps(f0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            __m256i y1 = _mm256_setzero_si256();
            if (j + 1 < nj) {
                const __m256 f1 = _mm256_mul_ps(_mm256_load_ps(wf + 16 * (j + 1) + 8 * x), scale[x]);
                y1 = _mm256_cvtps_epi32(_mm256_round_ps(f1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            }
            sum[x] = _mm256_add_epi32(sum[x], _mm256_add_epi32(y0, y1));
            _mm256_store_si256((__m256i *)(wi + 8 * x), _mm256_blend_epi16(y0, _mm256_slli_epi32(y1, 16), 0xAA));
        }
    _mm256_storeu_si256((__m256i *)wsum, sum[0]), _mm256_storeu_si256((__m256i *)(wsum + 8), sum[1]);
    return true;
}

// o's nr rows (ldo apart) at column e: o = a o + f (row r's 16 columns in f[2r], f[2r + 1]; a =
// alpha[r] when scale_o, else 1).
INLINE void add_half(const __m256 f[8], const float *alpha, bool scale_o, int nr, float *o, int64_t ldo, int e) {
    for (int r = 0; r < nr; r++) {
        float *orow = o + (int64_t)r * ldo + e;
        const __m256 a = _mm256_set1_ps(scale_o ? alpha[r] : 1.0f);
        for (int x = 0; x < 2; x++)
            _mm256_storeu_ps(orow + 8 * x, _mm256_fmadd_ps(a, _mm256_loadu_ps(orow + 8 * x), f[2 * r + x]));
    }
}

// Half h of block g of a group for NR rows: in f[2r], f[2r + 1] row r's sums over the nj keys of
// the block's columns 16h .. 16h + 15, from the rounded weights (ints: wi, with their sums isum and
// units unit) or the float ones (w, with 8 times their sums wsum; four rows, a tile that is rarely
// taken); prefetch: pv_half's. low: the int32 sums of the first half, kept by its call for the
// second's (Q4_0: the whole bytes' sums less these are 16 times the high nibbles').
INLINE void half_sums(const attn_dtype dt, const int NR, const int h, bool ints, const uint8_t *b, int64_t row_bytes,
                      int nj, int g, const int32_t *wi, const int32_t isum[16], const float unit[16], const float *w,
                      const float wsum[16], bool prefetch, __m256i low[8], __m256 f[8]) {
    if (ints) {
        __m256i c[8];
        ipv_half(dt, NR, h, b, row_bytes, nj, wi + 4 * g, prefetch, c);
        for (int x = 0; x < 2 * NR; x++) {
            if (h == 0) low[x] = c[x];
            else if (dt == ATTN_DTYPE_Q4_0) c[x] = _mm256_srai_epi32(_mm256_sub_epi32(c[x], low[x]), 4);
        }
        for (int r = 0; r < NR; r++) {
            const __m256i less = _mm256_set1_epi32(dt == ATTN_DTYPE_Q4_0 ? 8 * isum[4 * g + r] : 0);
            const __m256 u = _mm256_set1_ps(unit[4 * g + r]);
            // ipv_pair's column order (0-3, 8-11 and 4-7, 12-15) back to 0-7 and 8-15
            const __m256i lo = _mm256_permute2x128_si256(c[2 * r], c[2 * r + 1], 0x20);
            const __m256i hi = _mm256_permute2x128_si256(c[2 * r], c[2 * r + 1], 0x31);
            f[2 * r] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(lo, less)), u);
            f[2 * r + 1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(hi, less)), u);
        }
    } else {
        pv_half(dt, h, b, row_bytes, nj, w + 4 * g, prefetch, f);
        for (int r = 0; r < 4; r++) {
            const __m256 m = _mm256_set1_ps(wsum[4 * g + r]); // 0 for Q8_0
            f[2 * r] = _mm256_sub_ps(f[2 * r], m), f[2 * r + 1] = _mm256_sub_ps(f[2 * r + 1], m);
        }
    }
}

// NR rows (pp: their weights in the tile, pp[0..3], advancing by ldp; nr <= NR of them real) and nj <=
// PV_KEYS keys, four
// blocks of 32 columns at a time: first each key's four weights times each block's scale (w, two
// blocks a vector: p * d), with their largest magnitudes over the keys; then, in the integer form
// where those weights are finite (round_weights), else in the float form (with their sums), each
// block's two halves; Q4_0's n - 8 as the sum over the nibbles n less 8 times the sum of the weights;
// the sums are added to the rows of o, scaled by alpha when `scale_o`.
INLINE void pv_rows_block(const attn_dtype dt, const int NR, const void *v, int64_t vs_row, int nj, int Dv,
                          const float *pp, int64_t ldp, const float *alpha, bool scale_o, int nr, bool prefetch,
                          float *o, int64_t ldo) {
    const int64_t row_bytes = vs_row / ATTN_QBLOCK * block_bytes(dt);
    const __m256i lo = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), hi = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
    const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
    float w[PV_KEYS * 16] __attribute__((aligned(32)));      // key j: block g's four weights at w[16 j + 4 g]
    int32_t wi[PV_KEYS / 2 * 16 + 16] __attribute__((aligned(32))); // the same rounded, pair i at wi[16 i]
    float unit[16];
    int32_t isum[16];
    for (int e0 = 0; e0 < Dv; e0 += 4 * ATTN_QBLOCK) {
        const int nbg = (Dv - e0) / ATTN_QBLOCK < 4 ? (Dv - e0) / ATTN_QBLOCK : 4;
        const uint8_t *b0 = block_at(v, dt, e0);
        __m256i wmax[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int j = 0; j < nj; j++) {
            const __m256 p = _mm256_broadcast_ps((const __m128 *)(pp + (int64_t)j * ldp));
            const __m256 d = _mm256_castps128_ps256(group_scales(dt, b0 + (int64_t)j * row_bytes, nbg));
            const __m256 x01 = _mm256_mul_ps(p, _mm256_permutevar8x32_ps(d, lo));
            const __m256 x23 = _mm256_mul_ps(p, _mm256_permutevar8x32_ps(d, hi));
            _mm256_store_ps(w + 16 * j, x01), _mm256_store_ps(w + 16 * j + 8, x23);
            wmax[0] = _mm256_max_epu32(wmax[0], _mm256_and_si256(_mm256_castps_si256(x01), magnitude));
            wmax[1] = _mm256_max_epu32(wmax[1], _mm256_and_si256(_mm256_castps_si256(x23), magnitude));
        }
        const bool ints = round_weights(w, nj, nr, wmax, wi, unit, isum);
        float wsum[16] __attribute__((aligned(32))); // float form: 8 times block g's sum of row r's weights at 4g + r (Q4_0)
        __m256 ws01 = _mm256_setzero_ps(), ws23 = ws01;
        for (int j = 0; !ints && dt == ATTN_DTYPE_Q4_0 && j < nj; j++) // the keys in order
            ws01 = _mm256_add_ps(ws01, _mm256_load_ps(w + 16 * j)), ws23 = _mm256_add_ps(ws23, _mm256_load_ps(w + 16 * j + 8));
        _mm256_store_ps(wsum, _mm256_mul_ps(ws01, _mm256_set1_ps(8.0f)));
        _mm256_store_ps(wsum + 8, _mm256_mul_ps(ws23, _mm256_set1_ps(8.0f)));
        for (int g = 0; g < nbg; g++) {
            const uint8_t *b = block_at(v, dt, e0 + g * ATTN_QBLOCK);
            __m256 f[8];
            __m256i low[8] = {_mm256_setzero_si256()}; // set by the first half_sums where the second reads it
            half_sums(dt, NR, 0, ints, b, row_bytes, nj, g, wi, isum, unit, w, wsum, prefetch, low, f);
            add_half(f, alpha, scale_o, nr, o, ldo, e0 + g * ATTN_QBLOCK);
            half_sums(dt, NR, 1, ints, b, row_bytes, nj, g, wi, isum, unit, w, wsum, prefetch, low, f);
            add_half(f, alpha, scale_o, nr, o, ldo, e0 + g * ATTN_QBLOCK + 16);
        }
    }
}

// quant_pv_rows.h's kernel: blocks of four rows, or of two and one (decoding without GQA).
INLINE void pv_rows_impl(const attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pp,
                         int64_t ldp, const float *alpha, bool scale_o, int nr, bool prefetch, float *o, int64_t ldo) {
    if (nr >= 3) pv_rows_block(dt, 4, v, vs_row, nj, Dv, pp, ldp, alpha, scale_o, nr, prefetch, o, ldo);
    else if (nr == 2) pv_rows_block(dt, 2, v, vs_row, nj, Dv, pp, ldp, alpha, scale_o, nr, prefetch, o, ldo);
    else pv_rows_block(dt, 1, v, vs_row, nj, Dv, pp, ldp, alpha, scale_o, nr, prefetch, o, ldo);
}

// The prepared query (quant_steps.h's prep_rows; a query holding a NaN or an infinity keeps its
// float rows, for the float q.k).
INLINE void prep_q(attn_dtype dt, const float *q, int rows, int D, void *out) {
    prep_rows(dt, q, rows, D, out, quantise_block, store_group);
}

#endif

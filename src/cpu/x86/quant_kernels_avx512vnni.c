// quant_kernels_avx512vnni.c - the q.k of the decode row kernels of cpu.h for Q8_0 and Q4_0 keys
// (prep_q, qk_rows_q) on AVX512-VNNI's vpdpbusd, for the tables "avx512vnni" and "avx512bf16" /
// "amxbf16" (whose P V is on vdpbf16ps, quant_kernels_avx512bf16.c), and the P V of the
// "avx512vnni" table on vpdpwssd (pv_rows_q, at the end). Compiled with -mavx512f -mavx512bw
// -mavx512vl -mavx512vnni for this file only.
//
// A float32 kernel spends 7 instructions dequantising a block for its 8 FMAs with the four query
// rows of a GQA group (quant_kernels_avx512.c); here prep_q rounds each query row to int8 per block
// of 32, with a float scale d_q = max|q| / 127, as ggml rounds its query to Q8_0 for these types,
// laid out for the steps below (q_group). Four keys go at once: each key's group of a row (Q4_0:
// four blocks, 72 bytes; Q8_0: two blocks, 68 bytes) is gathered by one vpermt2w, and a transpose of
// the four keys' 128-bit quarters makes step vectors whose lane 4l + c holds key l's bytes for
// column c (one block's), split into low and high nibbles (Q4_0) or flipped to q + 128 (Q8_0).
// vpdpbusd (64 unsigned x signed byte products an instruction, four summed a lane) meets each step
// with the query bytes of its columns, repeated for the four keys, so the lanes need no sums across
// them: one conversion and one multiply by d_k d_q a row serve four keys, and the columns are added
// once, at the end. The -8 of Q4_0's n - 8 and the -128 of Q8_0's flip start the lanes, as -8 or
// -128 times the column's query sum. A query holding a NaN or an infinity stays float
// (prep_header) and goes to the float kernel, whose scores match the reference's in which keys they
// make infinite. The error the query's rounding adds is written with the kv_dtype bound of attn.h
// and tested (tests/test_quant.c).
//
// A block whose scale is infinite or NaN makes its key's score NaN (d_k + (d_k - d_k) is NaN there,
// added to every row's scale), as the float kernels' q d values make it +-inf or NaN.
#include "cpu/x86/simd512.h"

#include <string.h>

#include "cpu/cpu.h"
#include "cpu/x86/decode_prefetch.h"
#include "cpu/x86/quant_groups512.h"
#include "cpu/x86/quant_kernels.h"
#include "cpu/x86/quant_pv_rows.h"
#include "cpu/x86/quant_steps.h"
#include "cpu/x86/sum512.h"
#include "half.h"

// One query row's group as prep_q lays it out (quant_steps.h's layout, four keys a vector: key l
// in lanes 4l .. 4l + 3), each field repeated in the four keys' 128-bit quarters (lane or byte
// offset 16l): q[s] holds the 16 int8 query bytes of step s (byte 4c + i: the
// value that column c's byte i meets; Q8_0 uses steps 0-3), init[c] -8 (Q4_0) or -128 (Q8_0) times
// the sum of column c's bytes over the steps (vpdpbusd multiplies unsigned bytes: the nibbles n for
// n - 8, the Q8_0 quants q flipped to q + 128), dq[c] the scale of column c's block. Blocks past the
// row's end are 0.
typedef struct q_group {
    int8_t q[8][64];
    int32_t init[16];
    float dq[16];
} __attribute__((aligned(64))) q_group;

// One block of 32 query values rounded to int8: d = max|x| / 127 and q = x / d to nearest even; a
// block whose largest magnitude is below 2^-96 becomes zeros (1/d would overflow for the smallest
// ones). The values are finite (prep_q keeps a query with NaN or inf as floats).
static void quantise_block(const float *x, int8_t q[32], float *dq) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const bool ok = amax >= 0x1p-96f;
    *dq = ok ? amax / 127.0f : 0.0f;
    const __m512 id = _mm512_set1_ps(ok ? 127.0f / amax : 0.0f);
    const __m512i i0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(x0, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i i1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(x1, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(i0));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(i1));
}

// One row's group in q_group form (prep_rows' store): the bytes of each step, -8 or -128 times the
// column sums and the scales, repeated in the four keys' quarters.
static void store_group(attn_dtype dt, void *groups, int64_t index, const int32_t step[8][4], const int32_t sum[4],
                        const float dq[4]) {
    q_group *p = (q_group *)groups + index;
    int32_t init[4];
    for (int c = 0; c < 4; c++) init[c] = (dt == ATTN_DTYPE_Q4_0 ? -8 : -128) * sum[c];
    for (int s = 0; s < qk_steps(dt); s++)
        _mm512_store_si512(p->q[s], _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)step[s])));
    _mm512_store_si512(p->init, _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)init)));
    _mm512_store_ps(p->dq, _mm512_broadcast_f32x4(_mm_loadu_ps(dq)));
}

// The prepared query (quant_steps.h's prep_rows): a header saying which form follows, then the
// rows. A query holding a NaN or an infinity keeps its float rows (the float kernel then gives the
// float kernels' results: an infinite element makes each score +-inf or NaN, as the reference's).
void attn__prep_q_avx512vnni(attn_dtype dt, const float *q, int rows, int D, void *out) {
    prep_rows(dt, q, rows, D, out, quantise_block, store_group);
}

// The word indices gathering a key's group from its two 64-byte loads in q.k's order: dword 4t + c
// of the result is the group's quant dword key_dword(t, c) (block b's quants start at byte 2 of the
// block: word b * block_bytes / 2 + 1).
INLINE __m512i key_words(attn_dtype dt) {
    const int half = block_bytes(dt) / 2, per_block = ATTN_QBLOCK / (dt == ATTN_DTYPE_Q8_0 ? 4 : 8);
    uint16_t w[32];
    for (int t = 0; t < 4; t++)
        for (int c = 0; c < 4; c++) {
            const int d = key_dword(dt, t, c), word = half * (d / per_block) + 1 + 2 * (d % per_block);
            w[2 * (4 * t + c)] = (uint16_t)word, w[2 * (4 * t + c) + 1] = (uint16_t)(word + 1);
        }
    return _mm512_loadu_si512(w);
}

// The word indices putting the scale of column c's block of keys l0 and l0 + 1 (from their first 64
// bytes) at words 4l + c.
INLINE __m512i key_scale_words(attn_dtype dt, int l0) {
    const int half = block_bytes(dt) / 2;
    uint16_t w[32] = {0};
    for (int c = 0; c < 4; c++)
        w[4 * l0 + c] = (uint16_t)(half * column_block(dt, c)), w[4 * l0 + 4 + c] = (uint16_t)(32 + half * column_block(dt, c));
    return _mm512_loadu_si512(w);
}

// Four key rows' groups at x[c] (the group's blocks and load masks in sp) against NR (4, 2 or 1)
// query rows' groups p[r]: acc[r] lane 4l + c gains row r's products with key l over column c.
// Each key's group is gathered in step order (kw), the four keys' 128-bit quarters transposed so
// that vector t holds step t of every key, then split into nibbles (Q4_0) or flipped (Q8_0); each
// row's steps meet them with its query bytes (repeated for the four keys), and one float conversion
// and one multiply by d_k d_q apply to four keys at once.
INLINE void keys_group(const attn_dtype dt, const int NR, const uint8_t *const x[4], group_span sp,
                       const q_group *const p[4], __m512i kw, __m512i s01, __m512i s23, __m512 acc[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    __m512i kc[4], z0[4], k[8];
    for (int l = 0; l < 4; l++) {
        z0[l] = _mm512_maskz_loadu_epi8(sp.m0, x[l]);
        kc[l] = _mm512_permutex2var_epi16(z0[l], kw, _mm512_maskz_loadu_epi8(sp.m1, x[l] + 64));
    }
    // quarter t of kc[l] -> quarter l of step t
    const __m512i a = _mm512_shuffle_i32x4(kc[0], kc[1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i b = _mm512_shuffle_i32x4(kc[0], kc[1], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i c = _mm512_shuffle_i32x4(kc[2], kc[3], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i d = _mm512_shuffle_i32x4(kc[2], kc[3], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i st[4] = {_mm512_shuffle_i32x4(a, c, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_i32x4(a, c, _MM_SHUFFLE(3, 1, 3, 1)),
                           _mm512_shuffle_i32x4(b, d, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_i32x4(b, d, _MM_SHUFFLE(3, 1, 3, 1))};
    for (int t = 0; t < 4; t++) {
        if (dt == ATTN_DTYPE_Q4_0) k[t] = _mm512_and_si512(st[t], m4), k[4 + t] = _mm512_and_si512(_mm512_srli_epi16(st[t], 4), m4);
        else k[t] = _mm512_xor_si512(st[t], flip); // q + 128, unsigned
    }
    // lane 4l + c: key l's scale for column c
    const __m512i dw = _mm512_mask_blend_epi16(0xFF00u, _mm512_permutex2var_epi16(z0[0], s01, z0[1]),
                                               _mm512_permutex2var_epi16(z0[2], s23, z0[3]));
    const __m512 dk = nan_if_infinite(_mm512_cvtph_ps(_mm512_castsi512_si256(dw)));
    for (int r = 0; r < NR; r++) {
        __m512i e = _mm512_load_si512(p[r]->init), o = _mm512_setzero_si512(); // two chains: even and odd steps
        for (int s = 0; s < qk_steps(dt); s += 2) {
            e = _mm512_dpbusd_epi32(e, k[s], _mm512_load_si512(p[r]->q[s]));
            o = _mm512_dpbusd_epi32(o, k[s + 1], _mm512_load_si512(p[r]->q[s + 1]));
        }
        const __m512 dq = _mm512_load_ps(p[r]->dq);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(e, o)), _mm512_mul_ps(dk, dq), acc[r]);
    }
}

// q.k of NR prepared rows (G groups a row; nr of them real, the others repeat the first) against nj
// keys, four keys a pass (a tile's last keys, nj not a multiple of 4, repeat its last key). NR = 4
// takes blocks of three or four rows, 2 and 1 the few rows of decoding without GQA: a missing row's
// sums are the first row's, copied rather than computed. Each (row, key) sum is the same whatever NR.
INLINE void qk_rows_block(const attn_dtype dt, const int NR, const void *k, int64_t ks_row, int nj, const int D,
                          const int G, const q_group *qg, int nr, bool prefetch, float *s, int64_t s_r, int64_t s_j) {
    const int nb = D / ATTN_QBLOCK, per = qk_blocks(dt), row_bytes = nb * block_bytes(dt);
    const int64_t stride = ks_row / ATTN_QBLOCK * block_bytes(dt), group_bytes = (int64_t)per * block_bytes(dt);
    const __m512i kw = key_words(dt), s01 = key_scale_words(dt, 0), s23 = key_scale_words(dt, 2);
    const q_group *qr[4];
    for (int r = 0; r < 4; r++) qr[r] = qg + (int64_t)(r < nr ? r : 0) * G;
    for (int j = 0; j < nj; j += 4) {
        const uint8_t *x[4];
        for (int c = 0; c < 4; c++) {
            x[c] = (const uint8_t *)k + (int64_t)(j + c < nj ? j + c : nj - 1) * stride;
            if (prefetch) decode_prefetch_bytes(x[c], DECODE_PF_BYTES, row_bytes);
        }
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int g = 0; g < G; g++) {
            const int64_t off = (int64_t)g * group_bytes;
            const uint8_t *const xg[4] = {x[0] + off, x[1] + off, x[2] + off, x[3] + off};
            const q_group *const pg[4] = {qr[0] + g, qr[1] + g, qr[2] + g, qr[3] + g};
            keys_group(dt, NR, xg, span_of(dt, nb, per * g, per), pg, kw, s01, s23, acc);
        }
        for (int r = NR; r < 4; r++) acc[r] = acc[0];
        // acc[r] lane 4l + c -> the sum over c, lane 4l + r
        const __m512 sums = quarter_sums4(acc);
        const int nk = nj - j < 4 ? nj - j : 4;
        store_sums16(sums, 4, s + (int64_t)j * s_j, s_r, s_j, nr, nk);
    }
}

// G: groups_of(dt, D), a constant for the common head sizes (qk_rows_groups) so that the compiler
// unrolls the groups. Four rows at a time.
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

// quant_rows.h's q.k of float rows (its qk_rows_q): a query left in float32 takes the float kernel.
INLINE void qk_rows_impl(const attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const float *q, int rows,
                         float *s, int64_t s_r, int64_t s_j) {
    attn__qk_rows_q_avx512(dt, k, ks_row, nj, D, q, rows, s, s_r, s_j);
}

void attn__qk_rows_q_avx512vnni(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const void *q, int rows,
                                float *s, int64_t s_r, int64_t s_j) {
    qk_rows_prepared(dt, k, ks_row, nj, D, q, rows, s, s_r, s_j);
}

// ---- P V of the "avx512vnni" table (int16 dot products, the weights scaled and rounded) ----
//
// The AVX-512 table's P V (quant_kernels_avx512.c) multiplies each value block by its scale and
// meets it with 32 FMAs a key (four rows, 128 columns); where 512-bit shuffles and FMAs share two
// ports (Intel's cores) the block's conversions cost as much again. Here the four rows' weights are
// multiplied by their keys' block scales first, sixteen products a vector (block_weights4), so the
// values are the quants themselves, exact in int16 (Q4_0's nibbles n, Q8_0's q), and two keys go in
// each dword (pair_bytes: one widening of both keys' bytes a block half); vpdpwssd adds two keys'
// products a lane: 16 instructions a key for four rows and 128 columns instead of 32 FMAs. For that
// the weights w = p d of each row and block over the tile (at most PV_KEYS keys) are rounded to
// int16 against their largest magnitude W: w' = round(w * 32767 / W), an error of at most
// W / 65534 (plus float32 rounding) each, and the int32 sums (exact: at most 96 * 32767 * 128 in
// magnitude) are scaled back by W / 32767; Q4_0's n - 8 is the nibbles' sum less 8 times the rounded
// weights' sum. A W below 2^-110 counts as 2^-110 (32767 / W stays finite). The error this adds is
// written with the kv_dtype bound of attn.h and tested (tests/test_quant.c): over a tile each row's
// weights sum to at least their largest, so it is at most 96 / 65534 of the largest block scale
// times the largest quant magnitude, relative to the row's weights' sum.
//
// A tile whose weights are not all finite (an infinite or NaN block scale: nan_if_infinite) takes
// the float pass (fpv_pass), where such a scale makes the rows that weigh it NaN or +-inf as the
// float kernels' q d values do; it multiplies the quants as floats by the same products p d.

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
                     const int nbp, const pv_iweights *w, const float unit[4][16], const int32_t wsum[4][16],
                     const float *alpha, bool scale_o, int nr, bool prefetch, float *o, int64_t ldo, int col0) {
    __m512i c[16];
    for (int x = 0; x < 16; x++) c[x] = _mm512_setzero_si512();
    const int bb_bytes = block_bytes(dt);
    const __m512i m4 = _mm512_set1_epi16(0x0F);
    for (int j = 0; j < nj; j += 2) {
        const uint8_t *rx, *ry;
        key_pair_rows(v, stride, j, nj, goff + (int64_t)b0 * bb_bytes, nbp * bb_bytes, prefetch, &rx, &ry);
        for (int bb = 0; bb < nbp; bb++) {
            const uint8_t *x = rx + bb * bb_bytes + 2, *y = ry + bb * bb_bytes + 2;
            __m512i lo, hi;
            if (dt == ATTN_DTYPE_Q4_0) {
                const __m512i u = pair_bytes(x, y, false);
                lo = _mm512_and_si512(u, m4), hi = _mm512_srli_epi16(u, 4);
            } else {
                lo = pair_bytes(x, y, true), hi = pair_bytes(x + 16, y + 16, true);
            }
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
                       int g0, group_span sp, const pv_iweights *w, const float unit[4][16],
                       const int32_t wsum[4][16], const float *alpha, bool scale_o, int nr, bool prefetch, float *o,
                       int64_t ldo) {
    for (int b0 = 0; b0 < sp.blocks; b0 += 2) {
        const int col0 = (g0 + b0) * ATTN_QBLOCK;
        if (b0 + 1 < sp.blocks)
            ipv_pass(dt, NR, v, stride, nj, goff, b0, 2, w, unit, wsum, alpha, scale_o, nr, prefetch, o, ldo, col0);
        else
            ipv_pass(dt, NR, v, stride, nj, goff, b0, 1, w, unit, wsum, alpha, scale_o, nr, prefetch, o, ldo, col0);
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
            ipv_passes(dt, 4, v, stride, nj, goff, g0, sp, w, unit, wsum, alpha, scale_o, nr, prefetch, o, ldo);
        else if (ints && nr == 2)
            ipv_passes(dt, 2, v, stride, nj, goff, g0, sp, w, unit, wsum, alpha, scale_o, nr, prefetch, o, ldo);
        else if (ints)
            ipv_passes(dt, 1, v, stride, nj, goff, g0, sp, w, unit, wsum, alpha, scale_o, nr, prefetch, o, ldo);
        for (int b0 = 0; !ints && b0 < sp.blocks; b0 += 2) {
            const int col0 = (g0 + b0) * ATTN_QBLOCK, nbp = b0 + 1 < sp.blocks ? 2 : 1;
            if (nbp == 2)
                fpv_pass(dt, v, stride, nj, goff, b0, 2, (const pv_fweights *)wf, table, alpha, scale_o, nr, prefetch, o, ldo, col0);
            else
                fpv_pass(dt, v, stride, nj, goff, b0, 1, (const pv_fweights *)wf, table, alpha, scale_o, nr, prefetch, o, ldo, col0);
        }
    }
}

void attn__pv_rows_q_avx512vnni(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt,
                                int64_t ldp, const float *alpha, int rows, float *o, int64_t ldo) {
    pv_rows_q(dt, v, vs_row, nj, Dv, pt, ldp, alpha, rows, o, ldo);
}

// quant_kernels_avx512vnni.c - the q.k of the decode row kernels of cpu.h for Q8_0 and Q4_0 keys
// (prep_q, qk_rows_q) on AVX512-VNNI's vpdpbusd, for the tables "avx512vnni", "avx512bf16" and
// "amxbf16"; and, at the end, the P V on vpdpwssd of quant_pv_int16.h in its form without
// AVX512-VBMI, the "avx512vnni" table's on CPUs without it (quant_kernels_avx512vbmi.c has the other
// form). Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni for this file only.
//
// A float32 kernel spends 7 instructions dequantising a block for its 8 FMAs with the four query
// rows of a GQA group (quant_kernels_avx512.c); here prep_q rounds each query row to int8 per block
// of 32, with a float scale d_q = max|q| / 127, as ggml rounds its query to Q8_0 for these types,
// laid out for the steps below (q_group). Four keys go at once, in step vectors whose lane 4l + c
// holds key l's bytes for column c (one block's): Q4_0's group of a row (four blocks, 72 bytes) is
// gathered by one vpermt2w a key and the four keys' 128-bit quarters transposed, then split into
// low and high nibbles; Q8_0's (two blocks, 68 bytes) loads as one vector a key (a block a half),
// two qword permutes a key pair and four quarter shuffles transpose it, and its quants are flipped
// to q + 128.
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
#include "cpu/x86/quant_pv_int16.h"
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

// The word indices gathering a key's Q4_0 group from its two 64-byte loads in q.k's order: dword
// 4t + c of the result is the group's quant dword key_dword(t, c) (block b's quants start at byte 2
// of the block: word 9 b + 1; four dwords a block).
INLINE __m512i key_words(void) {
    const int half = ATTN_Q4_0_BYTES / 2, per_block = ATTN_QBLOCK / 8;
    uint16_t w[32];
    for (int t = 0; t < 4; t++)
        for (int c = 0; c < 4; c++) {
            const int d = key_dword(ATTN_DTYPE_Q4_0, t, c), word = half * (d / per_block) + 1 + 2 * (d % per_block);
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
// The keys' groups are gathered and transposed so that vector t holds step t of every key (Q4_0:
// each key's group in step order by kw, then its 128-bit quarters; Q8_0: below), then split into
// nibbles (Q4_0) or flipped (Q8_0); each row's steps meet them with its query bytes (repeated for
// the four keys), and one float conversion and one multiply by d_k d_q apply to four keys at once.
INLINE void keys_group(const attn_dtype dt, const int NR, const uint8_t *const x[4], group_span sp,
                       const q_group *const p[4], __m512i kw, __m512i s01, __m512i s23, __m512 acc[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    __m512i z0[4], k[8], st[4];
    for (int l = 0; l < 4; l++) z0[l] = _mm512_maskz_loadu_epi8(sp.m0, x[l]);
    if (dt == ATTN_DTYPE_Q4_0) {
        __m512i kc[4];
        for (int l = 0; l < 4; l++) kc[l] = _mm512_permutex2var_epi16(z0[l], kw, _mm512_maskz_loadu_epi8(sp.m1, x[l] + 64));
        // quarter t of kc[l] -> quarter l of step t
        const __m512i a = _mm512_shuffle_i32x4(kc[0], kc[1], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i b = _mm512_shuffle_i32x4(kc[0], kc[1], _MM_SHUFFLE(3, 2, 3, 2));
        const __m512i c = _mm512_shuffle_i32x4(kc[2], kc[3], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i d = _mm512_shuffle_i32x4(kc[2], kc[3], _MM_SHUFFLE(3, 2, 3, 2));
        st[0] = _mm512_shuffle_i32x4(a, c, _MM_SHUFFLE(2, 0, 2, 0)), st[1] = _mm512_shuffle_i32x4(a, c, _MM_SHUFFLE(3, 1, 3, 1));
        st[2] = _mm512_shuffle_i32x4(b, d, _MM_SHUFFLE(2, 0, 2, 0)), st[3] = _mm512_shuffle_i32x4(b, d, _MM_SHUFFLE(3, 1, 3, 1));
    } else {
        // Q8_0: step t's quarter l is key l's quant qword t of each block (key_dword), so each key's
        // two blocks' quants load as the halves of one vector (qwords 0-3 block 0's, 4-7 block 1's;
        // zeros for a group of one block, which meet query bytes 0) and two qword permutes a key
        // pair and four quarter shuffles transpose them
        __m512i kq[4];
        for (int l = 0; l < 4; l++) {
            const __m256i b0 = _mm256_loadu_si256((const __m256i *)(x[l] + 2));
            const __m256i b1 = sp.blocks == 2 ? _mm256_loadu_si256((const __m256i *)(x[l] + 2 + ATTN_Q8_0_BYTES))
                                              : _mm256_setzero_si256();
            kq[l] = _mm512_inserti64x4(_mm512_castsi256_si512(b0), b1, 1);
        }
        const __m512i even = _mm512_setr_epi64(0, 4, 8, 12, 1, 5, 9, 13), odd = _mm512_setr_epi64(2, 6, 10, 14, 3, 7, 11, 15);
        const __m512i a01 = _mm512_permutex2var_epi64(kq[0], even, kq[1]), b01 = _mm512_permutex2var_epi64(kq[0], odd, kq[1]);
        const __m512i a23 = _mm512_permutex2var_epi64(kq[2], even, kq[3]), b23 = _mm512_permutex2var_epi64(kq[2], odd, kq[3]);
        st[0] = _mm512_shuffle_i32x4(a01, a23, _MM_SHUFFLE(1, 0, 1, 0)), st[1] = _mm512_shuffle_i32x4(a01, a23, _MM_SHUFFLE(3, 2, 3, 2));
        st[2] = _mm512_shuffle_i32x4(b01, b23, _MM_SHUFFLE(1, 0, 1, 0)), st[3] = _mm512_shuffle_i32x4(b01, b23, _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int t = 0; t < 4; t++) {
        if (dt == ATTN_DTYPE_Q4_0) k[t] = _mm512_and_si512(st[t], m4), k[4 + t] = _mm512_and_si512(_mm512_srli_epi16(st[t], 4), m4);
        else k[t] = _mm512_xor_si512(st[t], flip); // q + 128, unsigned
    }
    // lane 4l + c: key l's scale for column c
    const __m512i dw = _mm512_mask_blend_epi16(0xFF00u, _mm512_permutex2var_epi16(z0[0], s01, z0[1]),
                                               _mm512_permutex2var_epi16(z0[2], s23, z0[3]));
    const __m512 dk = nan_if_infinite(_mm512_cvtph_ps(_mm512_castsi512_si256(dw)));
    for (int r = 0; r < NR; r++) {
        // Q8_0's four steps in one chain; Q4_0's eight in two (the low nibbles' and the high ones'),
        // whose addition costs less than a chain of eight's latency there
        __m512i e = _mm512_load_si512(p[r]->init);
        for (int s = 0; s < 4; s++) e = _mm512_dpbusd_epi32(e, k[s], _mm512_load_si512(p[r]->q[s]));
        if (dt == ATTN_DTYPE_Q4_0) {
            __m512i h = _mm512_dpbusd_epi32(_mm512_setzero_si512(), k[4], _mm512_load_si512(p[r]->q[4]));
            for (int s = 5; s < 8; s++) h = _mm512_dpbusd_epi32(h, k[s], _mm512_load_si512(p[r]->q[s]));
            e = _mm512_add_epi32(e, h);
        }
        const __m512 dq = _mm512_load_ps(p[r]->dq);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(e), _mm512_mul_ps(dk, dq), acc[r]);
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
    const __m512i kw = key_words(), s01 = key_scale_words(dt, 0), s23 = key_scale_words(dt, 2);
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

// ---- P V (quant_pv_int16.h) ----

void attn__pv_rows_q_avx512vnni(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt,
                                int64_t ldp, const float *alpha, int rows, float *o, int64_t ldo) {
    pv_rows_q(dt, v, vs_row, nj, Dv, pt, ldp, alpha, rows, o, ldo);
}

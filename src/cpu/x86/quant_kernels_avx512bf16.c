// quant_kernels_avx512bf16.c - the decode row kernels of cpu.h for Q4_0 keys and values on the
// dot-product instructions of the two bf16 tables ("avx512bf16", "amxbf16"): q.k on AVX512-VNNI's
// vpdpbusd, P V on AVX512-BF16's vdpbf16ps. Compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512vnni -mavx512bf16 for this file only. Q8_0 goes to the float kernels of
// quant_kernels_avx512.c (prep_q copies its query as it is).
//
// A float32 kernel spends 7 instructions dequantising a Q4_0 block for its 8 FMAs with the four
// query rows of a GQA group (quant_kernels_avx512.c); here:
//  - prep_q rounds each query row to int8 per block of 32, with a float scale d_q = max|q| / 127,
//    as ggml's Q8_0 does for its q4_0 dot product, laid out like the keys' nibbles (q4_query). A
//    key row's four blocks (72 bytes) become 64 bytes of low and 64 of high nibbles (one vpermt2w);
//    each nibble n (0..15) meets its query byte in vpdpbusd (64 products an instruction), which sums
//    four products a lane; the -8 of (n - 8) is the lane's start, -8 times the block's query sum.
//    A lane's int32 (four lanes a block) is converted and multiplied by d_k d_q: 5 instructions a
//    row and key for 128 values, where the float kernel had 32 FMAs. A query holding a NaN or an
//    infinity stays float (prep_header) and goes to the float kernel, whose scores match the
//    reference's in which keys they make infinite;
//  - pv_rows multiplies each weight by its key's block scale and rounds the product to bf16 (as
//    FlashAttention rounds P before P V), and the values n - 8, exact in bf16, are built for two
//    keys at once as interleaved pairs (unpack, widen, a 32-entry vpermw table): vdpbf16ps adds
//    two keys' products a lane, 16 instructions a key for four rows and 128 columns instead of 32.
// The error this adds (the query's rounding, the weights' bf16 rounding and the flush of their
// denormals) is written with the kv_dtype bound of attn.h and tested (tests/test_quant.c).
//
// A block whose scale is infinite or NaN makes its key's score NaN (d_k + (d_k - d_k) is NaN there,
// added to every row's scale) and, through the weight p d, its value NaN or +-inf for the rows that
// weigh it, as the float kernels' q d values do.
#include "cpu/x86/simd512.h"

#include <math.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/x86/decode_prefetch.h"
#include "cpu/x86/quant_block.h"
#include "cpu/x86/quant_kernels.h"
#include "cpu/x86/sum512.h"
#include "half.h"

#define Q4_BYTES ATTN_Q4_0_BYTES // 18: the scale's 2 bytes, 16 bytes of nibbles
#define GROUP_BLOCKS 4           // blocks of a key row handled together: 128 values, 72 bytes
#define GROUP_BYTES (GROUP_BLOCKS * Q4_BYTES)

// One query row's group of 4 blocks as prep_q lays it out: byte 16b + i of lo is the int8 query
// value 32b + i (i < 16) and of hi value 32b + 16 + i, the nibble order of the keys; lane 4b of init
// holds -8 times block b's sum of int8 values (the other lanes 0); lanes 4b..4b+3 of dq its scale.
// Blocks past the row's end are zero.
typedef struct q4_query {
    int8_t lo[64], hi[64];
    int32_t init[16];
    float dq[16];
} __attribute__((aligned(64))) q4_query;

static int groups_of(int D) { return (D / ATTN_QBLOCK + GROUP_BLOCKS - 1) / GROUP_BLOCKS; }

// Blocks and bytes of group g of a row of nb blocks, and the byte masks of its two loads: the
// first 64 bytes, then the rest (a whole group: 8 more).
typedef struct group_span {
    int blocks;
    __mmask64 m0, m1;
} group_span;

static group_span span_of(int nb, int g) {
    group_span s;
    s.blocks = nb - GROUP_BLOCKS * g < GROUP_BLOCKS ? nb - GROUP_BLOCKS * g : GROUP_BLOCKS;
    const int bytes = s.blocks * Q4_BYTES;
    s.m0 = bytes >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << bytes) - 1);
    s.m1 = bytes > 64 ? (((__mmask64)1 << (bytes - 64)) - 1) : 0;
    return s;
}

// The quantisation of one block of 32 query values: d = max|x| / 127 and q = x / d rounded to
// nearest even; a block whose largest magnitude is below 2^-96 becomes zeros (1/d would overflow
// for the smallest ones). The values are finite (prep_q keeps a query with NaN or inf as floats).
static void quantise_block(const float *x, int8_t *lo, int8_t *hi, int32_t *init, float *dq) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    // 0 * x is NaN for a NaN or an infinity, and their sum then too
    const bool ok = amax >= 0x1p-96f;
    const float d = ok ? amax / 127.0f : 0.0f;
    const __m512 id = _mm512_set1_ps(ok ? 127.0f / amax : 0.0f);
    const __m512i i0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(x0, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i i1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(x1, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128((__m128i *)lo, _mm512_cvtepi32_epi8(i0));
    _mm_storeu_si128((__m128i *)hi, _mm512_cvtepi32_epi8(i1));
    *init = -8 * _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    for (int t = 0; t < 4; t++) dq[t] = d;
}

// The prepared query: a header saying which form follows, then the rows. A query holding a NaN or
// an infinity keeps its float rows (the float kernel then gives the float kernels' results: an
// infinite element makes each score +-inf or NaN, as the reference's).
typedef struct prep_header {
    int32_t quantised;
    uint8_t pad[60];
} prep_header;

void attn__prep_q_avx512bf16(attn_dtype dt, const float *q, int rows, int D, void *out) {
    prep_header *h = out;
    uint32_t special = 0; // an exponent of all ones: NaN or inf
    for (int64_t i = 0; i < (int64_t)rows * D; i++) {
        uint32_t u;
        memcpy(&u, &q[i], sizeof u);
        special |= (u & 0x7f800000u) == 0x7f800000u;
    }
    h->quantised = dt == ATTN_DTYPE_Q4_0 && !special;
    if (!h->quantised) {
        memcpy(h + 1, q, (size_t)rows * (size_t)D * sizeof(float));
        return;
    }
    const int G = groups_of(D), nb = D / ATTN_QBLOCK;
    q4_query *qq = (q4_query *)(h + 1);
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < G; g++) {
            q4_query *p = qq + (int64_t)r * G + g;
            memset(p, 0, sizeof *p);
            for (int b = 0; b < span_of(nb, g).blocks; b++)
                quantise_block(q + (int64_t)r * D + (int64_t)(GROUP_BLOCKS * g + b) * ATTN_QBLOCK, p->lo + 16 * b,
                               p->hi + 16 * b, &p->init[4 * b], &p->dq[4 * b]);
        }
}

// The word indices gathering a group's nibbles (word 8b + i of the result is word 9b + 1 + i of the
// row: block b's bytes 2..17) and its scales (word l < 16 is block l / 4's first word).
static __m512i nibble_words(void) {
    uint16_t w[32];
    for (int i = 0; i < 32; i++) w[i] = (uint16_t)(9 * (i / 8) + 1 + i % 8);
    return _mm512_loadu_si512(w);
}
static __m512i scale_words(void) {
    uint16_t w[32];
    for (int i = 0; i < 32; i++) w[i] = (uint16_t)(i < 16 ? 9 * (i / 4) : 0);
    return _mm512_loadu_si512(w);
}

// A group's block scales, lanes 4b..4b+3 block b's, plus d - d (NaN for an infinite scale).
INLINE __m512 group_scales(__m512i z0, __m512i sw) {
    const __m512 d = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(sw, z0)));
    return _mm512_add_ps(d, _mm512_sub_ps(d, d));
}

// The word indices putting block b's scale of key c (word 9b of its group) at word 4b + c, for keys
// 0 and 1 (from two rows' first 64 bytes) and for keys 2 and 3.
static __m512i key_scale_words(int c0) {
    uint16_t w[32] = {0};
    for (int b = 0; b < GROUP_BLOCKS; b++) w[4 * b + c0] = (uint16_t)(9 * b), w[4 * b + c0 + 1] = (uint16_t)(32 + 9 * b);
    return _mm512_loadu_si512(w);
}

// Four key rows' groups at x[c] (the group's blocks and load masks in sp) against four query rows'
// groups p[r]: acc[r] lane 4b + c gains row r's sum with key c over block b. Each key's int32 lanes
// (four a block) are summed with its three neighbours' in two unpack levels before the float
// conversion and the scales d_k d_q, which then apply to four keys at once.
INLINE void keys_group(const uint8_t *const x[4], group_span sp, const q4_query *const p[4], __m512i nw, __m512i s01,
                       __m512i s23, __m512 acc[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i klo[4], khi[4], z0[4];
    for (int c = 0; c < 4; c++) {
        z0[c] = _mm512_maskz_loadu_epi8(sp.m0, x[c]);
        const __m512i nib = _mm512_permutex2var_epi16(z0[c], nw, _mm512_maskz_loadu_epi8(sp.m1, x[c] + 64));
        klo[c] = _mm512_and_si512(nib, m4), khi[c] = _mm512_and_si512(_mm512_srli_epi16(nib, 4), m4);
    }
    // lane 4b + c: key c's scale of block b, plus d - d (NaN for an infinite scale)
    const __m512i dw = _mm512_mask_blend_epi16(0xCCCCCCCCu, _mm512_permutex2var_epi16(z0[0], s01, z0[1]),
                                               _mm512_permutex2var_epi16(z0[2], s23, z0[3]));
    const __m512 d = _mm512_cvtph_ps(_mm512_castsi512_si256(dw)), dk = _mm512_add_ps(d, _mm512_sub_ps(d, d));
    for (int r = 0; r < 4; r++) {
        const __m512i init = _mm512_loadu_si512(p[r]->init), lo = _mm512_loadu_si512(p[r]->lo), hi = _mm512_loadu_si512(p[r]->hi);
        __m512i a[4];
        for (int c = 0; c < 4; c++) a[c] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(init, klo[c], lo), khi[c], hi);
        // per 128-bit lane (block): (k0, k1, k0, k1) half sums, then (k0, k1, k2, k3) whole ones
        const __m512i x01 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[0], a[1]), _mm512_unpackhi_epi32(a[0], a[1]));
        const __m512i x23 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2], a[3]), _mm512_unpackhi_epi32(a[2], a[3]));
        const __m512i y = _mm512_add_epi32(_mm512_unpacklo_epi64(x01, x23), _mm512_unpackhi_epi64(x01, x23));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(y), _mm512_mul_ps(dk, _mm512_loadu_ps(p[r]->dq)), acc[r]);
    }
}

void attn__qk_rows_q_avx512bf16(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const void *q, int rows,
                                float *s, int64_t s_r, int64_t s_j) {
    const prep_header *h = q;
    if (!h->quantised) {
        attn__qk_rows_q_avx512(dt, k, ks_row, nj, D, h + 1, rows, s, s_r, s_j);
        return;
    }
    const int nb = D / ATTN_QBLOCK, G = groups_of(D), row_bytes = nb * Q4_BYTES;
    const int64_t stride = ks_row / ATTN_QBLOCK * Q4_BYTES;
    const __m512i nw = nibble_words(), s01 = key_scale_words(0), s23 = key_scale_words(2);
    const __m512i to_key_major = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const q4_query *qq = (const q4_query *)(h + 1);
    for (int r0 = 0; r0 < rows; r0 += 4) {
        const int nr = rows - r0 < 4 ? rows - r0 : 4;
        const q4_query *qr[4]; // missing rows repeat the first
        for (int r = 0; r < 4; r++) qr[r] = qq + (int64_t)(r0 + (r < nr ? r : 0)) * G;
        for (int j = 0; j < nj; j += 4) {
            // a tile's last keys (nj not a multiple of 4) repeat its last key
            const uint8_t *x[4];
            for (int c = 0; c < 4; c++) {
                x[c] = (const uint8_t *)k + (int64_t)(j + c < nj ? j + c : nj - 1) * stride;
                if (r0 == 0) {
                    _mm_prefetch((const char *)x[c] + DECODE_PF_BYTES, _MM_HINT_T1);
                    _mm_prefetch((const char *)x[c] + DECODE_PF_BYTES + row_bytes - 1, _MM_HINT_T1);
                    for (int e = 64; e < row_bytes - 1; e += 64) _mm_prefetch((const char *)x[c] + DECODE_PF_BYTES + e, _MM_HINT_T1);
                }
            }
            __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            for (int g = 0; g < G; g++) {
                const int64_t off = (int64_t)g * GROUP_BYTES;
                const uint8_t *const xg[4] = {x[0] + off, x[1] + off, x[2] + off, x[3] + off};
                const q4_query *const pg[4] = {qr[0] + g, qr[1] + g, qr[2] + g, qr[3] + g};
                keys_group(xg, span_of(nb, g), pg, nw, s01, s23, acc);
            }
            // acc[r] lane 4b + c -> the sum over b, lane 4c + r (row-major quarters, then transposed)
            const __m512 p01 = ADD_QUARTERS(acc[0], acc[1], _MM_SHUFFLE(1, 0, 1, 0), _MM_SHUFFLE(3, 2, 3, 2));
            const __m512 p23 = ADD_QUARTERS(acc[2], acc[3], _MM_SHUFFLE(1, 0, 1, 0), _MM_SHUFFLE(3, 2, 3, 2));
            const __m512 rows4 = ADD_QUARTERS(p01, p23, _MM_SHUFFLE(2, 0, 2, 0), _MM_SHUFFLE(3, 1, 3, 1));
            const int nk = nj - j < 4 ? nj - j : 4;
            store_sums16(_mm512_permutexvar_ps(to_key_major, rows4), s + (int64_t)r0 * s_r + (int64_t)j * s_j, s_r, s_j,
                         nr, nk);
        }
    }
}

// The weights of four rows (pp[j * ldp + r]) times each key's block scales for one group, rounded
// to bf16 and paired along the keys: w[jp][4b + r] holds (key 2jp, key 2jp + 1)'s weights of row r
// for block b (an odd last key's partner 0).
INLINE void group_weights(const uint8_t *v, int64_t stride, int nj, const float *pp, int64_t ldp, group_span sp,
                          uint32_t (*w)[16]) {
    const __m512i sw = scale_words();
    uint16_t iw[32]; // word 2i from the first key's lane i, 2i + 1 from the second's
    for (int i = 0; i < 16; i++) iw[2 * i] = (uint16_t)i, iw[2 * i + 1] = (uint16_t)(16 + i);
    const __m512i ilv = _mm512_loadu_si512(iw);
    for (int j = 0; j < nj; j += 2) {
        __m512 x[2];
        for (int c = 0; c < 2; c++) {
            if (j + c == nj) {
                x[c] = _mm512_setzero_ps();
                break;
            }
            const __m512 d = group_scales(_mm512_maskz_loadu_epi8(sp.m0, v + (int64_t)(j + c) * stride), sw);
            x[c] = _mm512_mul_ps(_mm512_broadcast_f32x4(_mm_loadu_ps(pp + (int64_t)(j + c) * ldp)), d);
        }
        const __m512i b = (__m512i)_mm512_cvtne2ps_pbh(x[1], x[0]);
        _mm512_storeu_si512((void *)w[j / 2], _mm512_permutexvar_epi16(ilv, b));
    }
}

// The bf16 values n - 8 of a block's 16 nibble bytes of two keys, x and y, as pairs (x's, y's):
// lo for columns 0-15 (low nibbles), hi for 16-31. vpermw reads an index's low 5 bits: the table
// repeats its 16 entries.
INLINE void value_pairs(__m128i x, __m128i y, __m512i table, __m512bh *lo, __m512bh *hi) {
    const __m512i u = _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(x, y), _mm_unpacklo_epi8(x, y)));
    *lo = (__m512bh)_mm512_permutexvar_epi16(u, table);
    *hi = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(u, 4), table);
}

// One pass over nj keys for nbp (1 or 2) blocks starting at block b0 of the group at byte goff of
// each row: c[8 bb + 2 r + x] sums row r's columns 16x.. of block b0 + bb; then added to o.
INLINE void pv_pass(const uint8_t *v, int64_t stride, int nj, int64_t goff, int b0, const int nbp,
                    const uint32_t (*w)[16], __m512i table, const float *alpha, bool scale_o, int nr, bool prefetch,
                    float *o, int64_t ldo, int col0) {
    __m512 c[16];
    for (int x = 0; x < 16; x++) c[x] = _mm512_setzero_ps();
    const int64_t pf = FLASH_BC * stride;
    for (int j = 0; j < nj; j += 2) {
        const uint8_t *rx = v + (int64_t)j * stride + goff + (int64_t)b0 * Q4_BYTES;
        const uint8_t *ry = j + 1 < nj ? rx + stride : rx; // weight 0 for the missing partner
        if (prefetch) {
            _mm_prefetch((const char *)rx + pf, _MM_HINT_T1), _mm_prefetch((const char *)rx + pf + nbp * Q4_BYTES - 1, _MM_HINT_T1);
            _mm_prefetch((const char *)ry + pf, _MM_HINT_T1), _mm_prefetch((const char *)ry + pf + nbp * Q4_BYTES - 1, _MM_HINT_T1);
        }
        for (int bb = 0; bb < nbp; bb++) {
            __m512bh lo, hi;
            value_pairs(_mm_loadu_si128((const __m128i *)(rx + bb * Q4_BYTES + 2)),
                        _mm_loadu_si128((const __m128i *)(ry + bb * Q4_BYTES + 2)), table, &lo, &hi);
            const uint32_t *wj = w[j / 2] + 4 * (b0 + bb);
            for (int r = 0; r < 4; r++) {
                const __m512bh wr = (__m512bh)_mm512_set1_epi32((int)wj[r]);
                c[8 * bb + 2 * r] = _mm512_dpbf16_ps(c[8 * bb + 2 * r], lo, wr);
                c[8 * bb + 2 * r + 1] = _mm512_dpbf16_ps(c[8 * bb + 2 * r + 1], hi, wr);
            }
        }
    }
    for (int r = 0; r < nr; r++) {
        float *orow = o + (int64_t)r * ldo + col0;
        const __m512 a = _mm512_set1_ps(scale_o ? alpha[r] : 1.0f);
        for (int bb = 0; bb < nbp; bb++)
            for (int x = 0; x < 2; x++) {
                float *p = orow + ATTN_QBLOCK * bb + 16 * x;
                _mm512_storeu_ps(p, _mm512_fmadd_ps(a, _mm512_loadu_ps(p), c[8 * bb + 2 * r + x]));
            }
    }
}

// Four rows' weights pp (advancing by ldp a key) and nj <= FLASH_BC keys, a group of 4 blocks at a
// time: the group's paired weights, then passes of two blocks (one for an odd last block).
static void pv_q4(const void *v, int64_t vs_row, int nj, int Dv, const float *pp, int64_t ldp, const float *alpha,
                  bool scale_o, int nr, bool prefetch, float *o, int64_t ldo) {
    const int nb = Dv / ATTN_QBLOCK, G = groups_of(Dv);
    const int64_t stride = vs_row / ATTN_QBLOCK * Q4_BYTES;
    uint32_t w[FLASH_BC / 2][16];
    uint16_t tw[32];
    for (int i = 0; i < 32; i++) tw[i] = attn__f32_to_bf16((float)((i & 15) - 8));
    const __m512i table = _mm512_loadu_si512(tw);
    for (int g = 0; g < G; g++) {
        const group_span sp = span_of(nb, g);
        const uint8_t *vg = (const uint8_t *)v + (int64_t)g * GROUP_BYTES;
        group_weights(vg, stride, nj, pp, ldp, sp, w);
        for (int b0 = 0; b0 < sp.blocks; b0 += 2) {
            const int col0 = (GROUP_BLOCKS * g + b0) * ATTN_QBLOCK;
            if (b0 + 1 < sp.blocks)
                pv_pass((const uint8_t *)v, stride, nj, (int64_t)g * GROUP_BYTES, b0, 2, (const uint32_t(*)[16])w, table,
                        alpha, scale_o, nr, prefetch, o, ldo, col0);
            else
                pv_pass((const uint8_t *)v, stride, nj, (int64_t)g * GROUP_BYTES, b0, 1, (const uint32_t(*)[16])w, table,
                        alpha, scale_o, nr, prefetch, o, ldo, col0);
        }
    }
}

void attn__pv_rows_q_avx512bf16(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt,
                                int64_t ldp, const float *alpha, int rows, float *o, int64_t ldo) {
    if (dt != ATTN_DTYPE_Q4_0) {
        attn__pv_rows_q_avx512(dt, v, vs_row, nj, Dv, pt, ldp, alpha, rows, o, ldo);
        return;
    }
    for (int r0 = 0; r0 < rows; r0 += 4) {
        const int nr = rows - r0 < 4 ? rows - r0 : 4;
        for (int j0 = 0; j0 < nj; j0 += FLASH_BC) {
            const int n = nj - j0 < FLASH_BC ? nj - j0 : FLASH_BC;
            pv_q4((const uint8_t *)v + (int64_t)j0 * (vs_row / ATTN_QBLOCK) * Q4_BYTES, vs_row, n, Dv,
                  pt + (int64_t)j0 * ldp + r0, ldp, alpha + r0, j0 == 0, nr, r0 == 0, o + (int64_t)r0 * ldo, ldo);
        }
    }
}

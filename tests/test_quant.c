// test_quant.c - the block-quantised k/v types Q8_0 and Q4_0:
//  - attn_convert F32 -> Q8_0 / Q4_0 writes the bytes of a plain-C model of ggml's reference
//    quantisers (written here from ggml's layout and rounding: half scale, roundf, x * id + 8.5
//    truncated), and the way back gives q * d exactly, on random blocks of every magnitude, ties,
//    denormals, zero blocks and magnitudes near the half limit;
//  - the documented per-value error bound on adversarial blocks, and NaN for blocks that cannot be
//    represented (NaN, infinities, scales past half's range);
//  - KV caches of both types: storage bytes, errors (head_dim not a multiple of 32), attend on every
//    ISA this CPU runs and 1-2 threads against the scalar reference on the same stored values (one
//    query, blocks of queries on the narrow and wide decode paths and the general forward, masks,
//    ALiBi, windows), and against the float keys and values they were quantised from within the
//    bound written in attn.h (large logits included);
//  - attn_sdpa_fwd and the varlen forward on caller-quantised k and v in a strided layout, and the
//    errors of layouts that break blocks; the backward refuses them.
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"
#include "test_data.h"

#define QK 32

static float *randu(int64_t n, float scale, uint32_t *seed) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = rand_sym(seed) * scale;
    return x;
}

static size_t qbytes(attn_dtype dt, int64_t n) { return (size_t)(n / QK) * attn_dtype_size(dt); }

// ---- a model of ggml's layout and rounding -----------------------------------------------------

// IEEE binary16 bits of a finite float, rounded to nearest even (double arithmetic, exact).
static uint16_t model_f16(float f) {
    const uint16_t sign = signbit(f) ? 0x8000 : 0;
    const double a = fabs((double)f);
    if (a >= 65520.0) return sign | 0x7c00;
    if (a < ldexp(1.0, -14)) return sign | (uint16_t)nearbyint(ldexp(a, 24)); // subnormal, units of 2^-24
    int e;
    frexp(a, &e); // a = m 2^e, m in [0.5, 1)
    double r = nearbyint((ldexp(a, 1 - e) - 1.0) * 1024.0);
    int E = e - 1;
    if (r == 1024.0) r = 0.0, E++;
    if (E > 15) return sign | 0x7c00;
    return sign | (uint16_t)((E + 15) << 10) | (uint16_t)r;
}

static double model_f16_value(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double s = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 31) return m ? NAN : s * INFINITY;
    return s * (e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25));
}

// ggml's quantize_row_q8_0_ref on one block: d = amax / 127, q = roundf(x * (1/d)).
static void model_q8_0(const float *x, uint8_t *y) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
    const float d = amax / 127;
    const float id = d ? 1.0f / d : 0.0f;
    const uint16_t h = model_f16(d);
    y[0] = (uint8_t)h, y[1] = (uint8_t)(h >> 8);
    for (int j = 0; j < QK; j++) y[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

// ggml's quantize_row_q4_0_ref on one block: d = max / -8 (max: the first value of largest
// magnitude), nibble = min(15, (int8_t)(x * (1/d) + 8.5f)); values j and j + 16 share byte j.
static void model_q4_0(const float *x, uint8_t *y) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK; j++)
        if (amax < fabsf(x[j])) amax = fabsf(x[j]), max = x[j];
    const float d = max / -8;
    const float id = d ? 1.0f / d : 0.0f;
    const uint16_t h = model_f16(d);
    y[0] = (uint8_t)h, y[1] = (uint8_t)(h >> 8);
    for (int j = 0; j < QK / 2; j++) {
        const float x0 = x[j] * id, x1 = x[QK / 2 + j] * id;
        const int8_t a = (int8_t)(x0 + 8.5f), b = (int8_t)(x1 + 8.5f);
        const uint8_t xi0 = (uint8_t)(a < 15 ? a : 15), xi1 = (uint8_t)(b < 15 ? b : 15);
        y[2 + j] = (uint8_t)(xi0 | xi1 << 4);
    }
}

// The scale d of a block (its first two bytes, a half).
static double model_scale(const uint8_t *y) { return model_f16_value((uint16_t)(y[0] | y[1] << 8)); }

// Value j of a model block (ggml's dequantize_row_*: q * d).
static double model_value(attn_dtype dt, const uint8_t *y, int j) {
    const double d = model_scale(y);
    if (dt == ATTN_DTYPE_Q8_0) return (double)(int8_t)y[2 + j] * d;
    const int byte = y[2 + j % 16];
    return (double)((j < 16 ? byte & 15 : byte >> 4) - 8) * d;
}

// The bound of attn.h (attn_convert) for a value of a block of largest magnitude m.
static double value_bound(attn_dtype dt, double m) {
    return dt == ATTN_DTYPE_Q8_0 ? m * (1.0 / 254 + ldexp(1, -11) + ldexp(1, -20)) + ldexp(1, -18)
                                 : m * (1.0 / 8 + ldexp(1, -10)) + ldexp(1, -21);
}

static const attn_dtype qtypes[2] = {ATTN_DTYPE_Q8_0, ATTN_DTYPE_Q4_0};

// A block of one kind: random values at a magnitude, ties, one outlier, all zero, denormals.
static void fill_block(float *x, int kind, float mag, uint32_t *seed) {
    for (int j = 0; j < QK; j++) x[j] = rand_sym(seed) * mag;
    switch (kind) {
    case 1: // exact ties of both rounding rules: q + 1/2 steps of d = 1 (Q8_0) and d = 1 or -1 (Q4_0)
        for (int j = 0; j < QK; j++) x[j] = (float)((j % 16) - 8) + 0.5f;
        x[0] = 127.0f, x[1] = -8.0f;
        break;
    case 2: // one outlier among small values
        x[(int)(lcg(seed) % QK)] = mag * 1e4f;
        break;
    case 3: memset(x, 0, QK * sizeof(float)); break;
    case 4: // negative zeros and denormals
        for (int j = 0; j < QK; j++) x[j] = j % 3 == 0 ? -0.0f : rand_sym(seed) * 1e-40f;
        break;
    case 5: // the largest magnitude first, both signs (Q4_0 maps it to nibble 0)
        x[0] = -mag, x[5] = mag;
        break;
    default: break;
    }
}

static void test_ggml_bytes(void) {
    uint32_t seed = 5;
    const float mags[] = {1e-30f, 1e-6f, 7e-3f, 0.5f, 1.0f, 3.0f, 100.0f, 6e4f, 5e5f, 8.2e6f};
    for (int t = 0; t < 2; t++) {
        const attn_dtype dt = qtypes[t];
        const float limit = dt == ATTN_DTYPE_Q8_0 ? 127.0f * 65504.0f : 8.0f * 65504.0f;
        for (int mi = 0; mi < (int)(sizeof mags / sizeof mags[0]); mi++)
            for (int kind = 0; kind < 6; kind++)
                for (int rep = 0; rep < 20; rep++) {
                    float x[QK], back[QK];
                    fill_block(x, kind, mags[mi], &seed);
                    float m = 0.0f;
                    for (int j = 0; j < QK; j++) m = fmaxf(m, fabsf(x[j]));
                    // ggml's behaviour is undefined when 1/d overflows (denormal blocks) or d
                    // overflows half: those are checked against attn.h's rules below instead
                    if (m >= limit || (m > 0.0f && m < 1e-36f)) continue;
                    uint8_t got[34], want[34];
                    ASSERT_OK(attn_convert(dt, got, ATTN_DTYPE_F32, x, QK));
                    (dt == ATTN_DTYPE_Q8_0 ? model_q8_0 : model_q4_0)(x, want);
                    harness_checks++;
                    if (memcmp(got, want, attn_dtype_size(dt)) != 0)
                        FAIL("%s: block (magnitude %g, kind %d) differs from ggml's bytes (scale %02x%02x vs %02x%02x)",
                             attn_dtype_name(dt), (double)mags[mi], kind, got[1], got[0], want[1], want[0]);
                    ASSERT_OK(attn_convert(ATTN_DTYPE_F32, back, dt, got, QK));
                    for (int j = 0; j < QK; j++) {
                        const double v = model_value(dt, want, j);
                        if ((double)back[j] != v) FAIL("%s: value %d reads back as %.9g, not q * d = %.9g", attn_dtype_name(dt), j, (double)back[j], v);
                    }
                }
        // several blocks in one call: the same bytes as block by block
        float *x = randu(4 * QK, 2.0f, &seed);
        uint8_t all[4 * 34], one[34];
        ASSERT_OK(attn_convert(dt, all, ATTN_DTYPE_F32, x, 4 * QK));
        for (int b = 0; b < 4; b++) {
            (dt == ATTN_DTYPE_Q8_0 ? model_q8_0 : model_q4_0)(x + b * QK, one);
            ASSERT_TRUE(memcmp(all + b * attn_dtype_size(dt), one, attn_dtype_size(dt)) == 0);
        }
        free(x);
    }
}

static void test_value_bound(void) {
    uint32_t seed = 9;
    const float mags[] = {1e-40f, 1e-38f, 1e-30f, 1e-7f, 6.1e-5f, 1e-3f, 1.0f, 37.0f, 1e4f, 5.2e5f, 8.3e6f};
    for (int t = 0; t < 2; t++) {
        const attn_dtype dt = qtypes[t];
        double worst = 0.0; // the largest error over the bound's c * m part, for the record
        for (int mi = 0; mi < (int)(sizeof mags / sizeof mags[0]); mi++)
            for (int kind = 0; kind < 6; kind++)
                for (int rep = 0; rep < 30; rep++) {
                    float x[QK], back[QK];
                    uint8_t q[34];
                    fill_block(x, kind, mags[mi], &seed);
                    double m = 0.0;
                    for (int j = 0; j < QK; j++) m = fmax(m, fabs((double)x[j]));
                    ASSERT_OK(attn_convert(dt, q, ATTN_DTYPE_F32, x, QK));
                    ASSERT_OK(attn_convert(ATTN_DTYPE_F32, back, dt, q, QK));
                    const uint16_t h = (uint16_t)(q[0] | q[1] << 8);
                    if ((h & 0x7c00) == 0x7c00) { // not representable: only past half's range here
                        harness_checks++;
                        if (m < (dt == ATTN_DTYPE_Q8_0 ? 127.0 * 65504.0 : 8.0 * 65504.0))
                            FAIL("%s: a block of largest magnitude %g was stored as NaN", attn_dtype_name(dt), m);
                        for (int j = 0; j < QK; j++) ASSERT_TRUE(isnan(back[j]));
                        continue;
                    }
                    for (int j = 0; j < QK; j++) {
                        const double err = fabs((double)back[j] - (double)x[j]);
                        harness_checks++;
                        if (!(err <= value_bound(dt, m)))
                            FAIL("%s: value %.9g read back as %.9g: error %.3g over the bound %.3g (block max %g)",
                                 attn_dtype_name(dt), (double)x[j], (double)back[j], err, value_bound(dt, m), m);
                        if (m > 1e-3 && err / m > worst) worst = err / m;
                    }
                }
        // the bound is not loose by much: the worst error seen is most of its c part
        const double c = dt == ATTN_DTYPE_Q8_0 ? 1.0 / 254 : 1.0 / 8;
        ASSERT_TRUE(worst > 0.9 * c);
        // non-finite values make the whole block NaN
        const float bad[4] = {NAN, INFINITY, -INFINITY, 9e6f};
        for (int b = 0; b < 4; b++) {
            float x[QK], back[QK];
            uint8_t q[34];
            fill_block(x, 0, 1.0f, &seed);
            x[7] = dt == ATTN_DTYPE_Q4_0 && b == 3 ? 6e5f : bad[b];
            ASSERT_OK(attn_convert(dt, q, ATTN_DTYPE_F32, x, QK));
            ASSERT_TRUE(q[0] == 0x00 && q[1] == 0x7e);
            ASSERT_OK(attn_convert(ATTN_DTYPE_F32, back, dt, q, QK));
            for (int j = 0; j < QK; j++) ASSERT_TRUE(isnan(back[j]));
        }
    }
    // types and errors of the public helpers
    ASSERT_EQ_INT((int)attn_dtype_size(ATTN_DTYPE_Q8_0), 34);
    ASSERT_EQ_INT((int)attn_dtype_size(ATTN_DTYPE_Q4_0), 18);
    ASSERT_EQ_INT((int)attn_dtype_block_size(ATTN_DTYPE_Q4_0), 32);
    ASSERT_EQ_INT((int)attn_dtype_block_size(ATTN_DTYPE_F16), 1);
    ASSERT_EQ_INT((int)attn_dtype_block_size((attn_dtype)99), 0);
    ASSERT_TRUE(strcmp(attn_dtype_name(ATTN_DTYPE_Q4_0), "Q4_0") == 0);
    float x[40] = {0};
    uint8_t q[80];
    ASSERT_STATUS(attn_convert(ATTN_DTYPE_Q8_0, q, ATTN_DTYPE_F32, x, 40), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_convert(ATTN_DTYPE_F16, q, ATTN_DTYPE_Q8_0, x, 32), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_convert(ATTN_DTYPE_Q4_0, q, ATTN_DTYPE_Q8_0, x, 32), ATTN_ERR_INVALID_ARG);
    ASSERT_OK(attn_convert(ATTN_DTYPE_Q4_0, q, ATTN_DTYPE_F32, x, 0));
}

// ---- KV caches -----------------------------------------------------------------------------

static attn_kv_cache *make_cache(attn_ctx *ctx, int64_t B, int64_t Hkv, int64_t D, int64_t Dv, int64_t cap,
                                 attn_dtype dt) {
    attn_kv_cache_config c;
    attn_kv_cache_config_init(&c);
    c.batch = B, c.n_kv_heads = Hkv, c.head_dim = D, c.head_dim_v = Dv, c.capacity = cap, c.dtype = dt;
    attn_kv_cache *kc = NULL;
    ASSERT_OK(attn_kv_cache_create(ctx, &c, &kc));
    return kc;
}

static void test_cache_storage(void) {
    attn_ctx *ctx = test_ctx(ATTN_ISA_AUTO, 1);
    uint32_t seed = 3;
    for (int t = 0; t < 2; t++) {
        const attn_dtype dt = qtypes[t];
        const int64_t B = 2, Hkv = 3, D = 64, Dv = 32, cap = 9, n = 5;
        attn_kv_cache *kc = make_cache(ctx, B, Hkv, D, Dv, cap, dt);
        // k as (B, n, Hkv, D) in memory (strided), v contiguous
        float *k = randu(B * n * Hkv * D, 3.0f, &seed), *v = randu(B * Hkv * n * Dv, 3.0f, &seed);
        const int64_t ks[4] = {n * Hkv * D, D, Hkv * D, 1};
        ASSERT_OK(attn_kv_cache_append(ctx, kc, n, k, ks, v, NULL));
        void *kst, *vst;
        int64_t kss[4], vss[4];
        attn_kv_cache_storage(kc, &kst, kss, &vst, vss);
        ASSERT_TRUE(kss[2] == D && kss[1] == cap * D && kss[3] == 1 && vss[0] == Hkv * cap * Dv);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hkv; h++)
                for (int64_t i = 0; i < n; i++) {
                    float row[64];
                    uint8_t want[2 * 34];
                    for (int64_t e = 0; e < D; e++) row[e] = k[b * ks[0] + h * ks[1] + i * ks[2] + e];
                    for (int blk = 0; blk < D / QK; blk++)
                        (dt == ATTN_DTYPE_Q8_0 ? model_q8_0 : model_q4_0)(row + blk * QK, want + blk * attn_dtype_size(dt));
                    const int64_t off = b * kss[0] + h * kss[1] + i * kss[2]; // in values
                    harness_checks++;
                    if (memcmp((const uint8_t *)kst + qbytes(dt, off), want, qbytes(dt, D)) != 0)
                        FAIL("%s cache: key row (%lld, %lld, %lld) is not ggml's bytes", attn_dtype_name(dt),
                             (long long)b, (long long)h, (long long)i);
                    (dt == ATTN_DTYPE_Q8_0 ? model_q8_0 : model_q4_0)(v + ((b * Hkv + h) * n + i) * Dv, want);
                    const int64_t voff = b * vss[0] + h * vss[1] + i * vss[2];
                    ASSERT_TRUE(memcmp((const uint8_t *)vst + qbytes(dt, voff), want, qbytes(dt, Dv)) == 0);
                }
        ASSERT_STATUS(attn_kv_cache_append(ctx, kc, 5, k, ks, v, NULL), ATTN_ERR_CAPACITY);
        free(k), free(v);
        attn_kv_cache_free(kc);
        // head dims that are not whole blocks
        attn_kv_cache_config c;
        attn_kv_cache_config_init(&c);
        c.batch = c.n_kv_heads = 1, c.head_dim = 48, c.capacity = 4, c.dtype = dt;
        ASSERT_STATUS(attn_kv_cache_create(ctx, &c, &kc), ATTN_ERR_BAD_SHAPE);
        ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "multiples of 32") != NULL);
        c.head_dim = 64, c.head_dim_v = 40;
        ASSERT_STATUS(attn_kv_cache_create(ctx, &c, &kc), ATTN_ERR_BAD_SHAPE);
        ASSERT_TRUE(kc == NULL);
    }
    attn_ctx_free(ctx);
}

// The reference on the storage of kc (the same stored values) for desc d: out, lse.
static void ref_on_storage(attn_kv_cache *kc, const attn_sdpa_desc *d, const float *q, float *out, float *lse) {
    const attn_kv_cache_config *c = attn_kv_cache_get_config(kc);
    attn_sdpa_desc r = *d;
    void *k, *v;
    attn_kv_cache_storage(kc, &k, r.k_stride, &v, r.v_stride);
    r.n_kv_heads = c->n_kv_heads, r.len_kv = attn_kv_cache_length(kc), r.kv_dtype = c->dtype, r.head_dim_v = c->head_dim_v;
    attn_ctx *ref = test_ctx(ATTN_ISA_REF, 1);
    ASSERT_OK(attn_sdpa_fwd(ref, &r, q, k, v, out, lse, NULL));
    attn_ctx_free(ref);
}

// The value at element offset off of a tensor of blocks of type dt.
static double stored_value(attn_dtype dt, const void *p, int64_t off) {
    return model_value(dt, (const uint8_t *)p + (size_t)(off / QK) * attn_dtype_size(dt), (int)(off % QK));
}

// attn.h's delta_q (kv_dtype) of a query row q (D values) against stored keys of largest magnitude
// kmax, with qstep for the query's rounding step (1/254; 0 for queries int8 holds exactly).
static double delta_q(const float *q, int64_t D, double scale, double qstep, double kmax) {
    double msum = 0.0; // sum over blocks of 32 times the block's largest |q|
    for (int64_t t0 = 0; t0 < D; t0 += QK) {
        double m = 0.0;
        for (int64_t t = t0; t < t0 + QK; t++) m = fmax(m, fabs((double)q[t]));
        msum += QK * m;
    }
    return (scale * (qstep + ldexp(1, -20)) * msum + ldexp(1, -96) * (double)D) * kmax;
}

// Whether ctx's kernels run d (of a block type) on attn.h's decode kernels of attn_isa_int8_query's
// ISAs, which round the query to int8 (a GQA group's queries, at most 8, against rows of contiguous
// blocks).
static bool q_rounds(const attn_ctx *ctx, const attn_sdpa_desc *d) {
    const int64_t group = d->n_heads / (d->n_kv_heads != 0 ? d->n_kv_heads : d->n_heads);
    return attn_isa_int8_query(attn_ctx_isa(ctx)) && group * d->len_q <= 8 && d->k_stride[3] == 1 && d->v_stride[3] == 1;
}

// Whether those kernels of ctx round the weights to int16 for P V (AVX2's vpmaddwd, AVX512_VNNI's
// and AMX_BF16's vpdpwssd) or to bf16 (AVX512_BF16's vdpbf16ps), as the library says.
static bool pv_int16(const attn_ctx *ctx) { return attn_isa_int16_weights(attn_ctx_isa(ctx)) != 0; }
static bool pv_bf16(const attn_ctx *ctx) { return attn_isa_int8_query(attn_ctx_isa(ctx)) && !pv_int16(ctx); }

// attn.h's u of those kernels' weights: 2^-8 where they are rounded to bf16, else 0.
static double weights_u(const attn_ctx *ctx) { return pv_bf16(ctx) ? ldexp(1, -8) : 0.0; }

// attn.h's f of those kernels: S 2^-122 with bf16 weights (the flush of tiny weights), Q (2^-9 m_d +
// S 2^-125) with int16 ones (m_d the values' largest block scale, dmax, Q = 128 for Q8_0 and 8 for
// Q4_0).
static double weights_f(const attn_ctx *ctx, attn_dtype dt, double dmax, int64_t S) {
    if (pv_bf16(ctx)) return (double)S * ldexp(1, -122);
    if (!pv_int16(ctx)) return 0.0;
    return (dt == ATTN_DTYPE_Q8_0 ? 128.0 : 8.0) * (ldexp(1, -9) * dmax + (double)S * ldexp(1, -125));
}

// The largest |d| of the blocks of a tensor of type dt (block scales), n values from element off.
static double stored_scale_max(attn_dtype dt, const void *p, int64_t off, int64_t n) {
    double m = 0.0;
    for (int64_t e = off; e < off + n; e += QK) {
        m = fmax(m, fabs(model_scale((const uint8_t *)p + (size_t)(e / QK) * attn_dtype_size(dt))));
    }
    return m;
}

// A model of that rounding: q times scale * log2(e) in float (the kernels' scaled query), each
// block of 32 rounded to int8 with d = max / 127 (nearest even; a block below 2^-96 to 0), and
// back to q's units: what the reference gives on it, the kernels give up to the weights' rounding.
static void model_rounded_query(const float *q, int64_t n, int64_t D, float scale, float *qm) {
    const float c = (float)((double)scale * 1.4426950408889634);
    for (int64_t r = 0; r < n; r += D)
        for (int64_t t0 = r; t0 < r + D; t0 += QK) {
            float x[QK], amax = 0.0f;
            for (int t = 0; t < QK; t++) x[t] = q[t0 + t] * c, amax = fmaxf(amax, fabsf(x[t]));
            const float d = amax >= 0x1p-96f ? amax / 127.0f : 0.0f, id = d > 0.0f ? 127.0f / amax : 0.0f;
            for (int t = 0; t < QK; t++) qm[t0 + t] = (float)((double)nearbyintf(x[t] * id) * (double)d / (double)c);
        }
}

// The block-type (dt) kernels of ctx (on d, with k and v the stored blocks of d's strides, len_kv
// and n_kv_heads) against the reference: o and lse (lse may be NULL) of every row, with float32
// rounding's 2e-6 + 2e-5 max|v'|. Where the query is rounded (q_rounds): against the reference on
// model_rounded_query's query within the weights' rounding (AVX512_BF16: 2^-8 max|v'| + S 2^-122;
// AVX512_VNNI, AMX_BF16 and AVX2: weights_f, their int16 rounding), and against the reference on q within attn.h's bound, delta_q with qstep (1/254; 0
// for queries int8 holds exactly) for 1/254; elsewhere against the reference on q.
static void assert_block_kernels(const char *what, attn_dtype dt, const attn_ctx *ctx, const attn_sdpa_desc *d,
                                 const float *q, const void *k, const void *v, const float *o, const float *lse,
                                 double qstep) {
    const int64_t B = d->batch, H = d->n_heads, Hkv = d->n_kv_heads, L = d->len_q, S = d->len_kv, D = d->head_dim;
    const int64_t Dv = d->head_dim_v != 0 ? d->head_dim_v : D, nq = B * H * L * D, no = B * H * L * Dv;
    const float scale = d->scale != 0.0f ? d->scale : (float)(1.0 / sqrt((double)D));
    // q as (B, H, L, D) rows; the reference on it and on the model's query, o as (B, H, L, Dv)
    float *qc = malloc((size_t)nq * 4), *qm = malloc((size_t)nq * 4), *oc = malloc((size_t)no * 4), *om = malloc((size_t)no * 4);
    float *lc = malloc((size_t)(B * H * L) * 4), *lm = malloc((size_t)(B * H * L) * 4);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++)
                for (int64_t t = 0; t < D; t++)
                    qc[((b * H + h) * L + i) * D + t] = q[b * d->q_stride[0] + h * d->q_stride[1] + i * d->q_stride[2] + t * d->q_stride[3]];
    model_rounded_query(qc, nq, D, scale, qm);
    attn_sdpa_desc r = *d;
    r.kv_dtype = dt;
    const bool rounds = q_rounds(ctx, &r);
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, L, D, r.q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, L, Dv, r.o_stride);
    attn_ctx *ref = test_ctx(ATTN_ISA_REF, 1);
    ASSERT_OK(attn_sdpa_fwd(ref, &r, qc, k, v, oc, lc, NULL));
    ASSERT_OK(attn_sdpa_fwd(ref, &r, rounds ? qm : qc, k, v, om, lm, NULL));
    attn_ctx_free(ref);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t hk = h / (H / Hkv);
            double kmax = 0.0, vmax = 0.0, dmax = 0.0;
            for (int64_t j = 0; j < S; j++) {
                for (int64_t t = 0; t < D; t++)
                    kmax = fmax(kmax, fabs(stored_value(dt, k, b * d->k_stride[0] + hk * d->k_stride[1] +
                                                                                j * d->k_stride[2] + t)));
                const int64_t vrow = b * d->v_stride[0] + hk * d->v_stride[1] + j * d->v_stride[2];
                for (int64_t t = 0; t < Dv; t++) vmax = fmax(vmax, fabs(stored_value(dt, v, vrow + t)));
                dmax = fmax(dmax, stored_scale_max(dt, v, vrow, Dv));
            }
            for (int64_t i = 0; i < L; i++) {
                const int64_t row = (b * H + h) * L + i;
                const double dq = rounds ? delta_q(qc + row * D, D, (double)fabsf(scale), qstep, kmax) : 0.0;
                const double u = rounds ? weights_u(ctx) : 0.0, flush = rounds ? weights_f(ctx, dt, dmax, S) : 0.0;
                const double bound = (exp(2 * dq) * (1 + u) - 1) * vmax + flush + 2e-6 + 2e-5 * vmax;
                for (int64_t e = 0; e < Dv; e++) {
                    const float got = o[b * d->o_stride[0] + h * d->o_stride[1] + i * d->o_stride[2] + e * d->o_stride[3]];
                    const double err = fabs((double)got - (double)oc[row * Dv + e]);
                    const double errm = fabs((double)got - (double)om[row * Dv + e]);
                    harness_checks += 2;
                    if (!(err <= bound))
                        FAIL("%s: row (%lld, %lld, %lld) col %lld: %.9g against %.9g, error %.3g over the bound %.3g", what,
                             (long long)b, (long long)h, (long long)i, (long long)e, (double)got, (double)oc[row * Dv + e], err, bound);
                    if (!(errm <= u * vmax + flush + 2e-6 + 2e-5 * vmax))
                        FAIL("%s: row (%lld, %lld, %lld) col %lld: %.9g against the model's %.9g (error %.3g)", what,
                             (long long)b, (long long)h, (long long)i, (long long)e, (double)got, (double)om[row * Dv + e], errm);
                }
                if (lse != NULL) {
                    const double err = fabs((double)lse[row] - (double)lc[row]), errm = fabs((double)lse[row] - (double)lm[row]);
                    harness_checks += 2;
                    if (!(err <= dq + 2e-6 + 2e-5 * fabs((double)lc[row])) && lse[row] != lc[row])
                        FAIL("%s: lse of row %lld: %.9g against %.9g, over the bound %.3g", what, (long long)row,
                             (double)lse[row], (double)lc[row], dq);
                    if (!(errm <= 2e-6 + 2e-5 * fabs((double)lm[row])) && lse[row] != lm[row])
                        FAIL("%s: lse of row %lld: %.9g against the model's %.9g", what, (long long)row, (double)lse[row],
                             (double)lm[row]);
                }
            }
        }
    free(qc), free(qm), free(oc), free(om), free(lc), free(lm);
}

// Every kernel table against the reference on the same quantised cache: one query, narrow blocks
// of queries (group * L <= 8), wide ones (up to 64 rows: the decode path's general products) and
// longer blocks (the general forward), with and without masks, ALiBi and a window.
static void test_cache_kernels(void) {
    uint32_t seed = 17;
    attn_isa isas[16];
    const int n_isa = fused_isas(isas);
    for (int t = 0; t < 2; t++)
        for (int ii = 0; ii < n_isa; ii++) {
            for (int threads = 1; threads <= 2; threads++) {
                attn_ctx *ctx = test_ctx(isas[ii], threads);
                const attn_dtype dt = qtypes[t];
                const int64_t B = 2, Hkv = 2, H = 8, D = 64, Dv = 96, cap = 1700;
                attn_kv_cache *kc = make_cache(ctx, B, Hkv, D, Dv, cap, dt);
                const int64_t blocks[3] = {37, 1, 1500};
                for (int s = 0; s < 3; s++) {
                    const int64_t n = blocks[s];
                    float *k = randu(B * Hkv * n * D, 2.0f, &seed), *v = randu(B * Hkv * n * Dv, 2.0f, &seed);
                    if (s == 2) k[5 * D + 3] = 40.0f, v[7 * Dv] = -30.0f; // outliers
                    ASSERT_OK(attn_kv_cache_append(ctx, kc, n, k, NULL, v, NULL));
                    free(k), free(v);
                    const int64_t S = attn_kv_cache_length(kc);
                    const int64_t lens[4] = {1, 2, 9, 40};
                    for (int li = 0; li < 4; li++)
                        for (int opt = 0; opt < 3; opt++) {
                            const int64_t L = lens[li] < S ? lens[li] : S;
                            float *q = randu(B * H * L * D, 1.5f, &seed);
                            float *o1 = malloc((size_t)(B * H * L * Dv) * 4), *o2 = malloc((size_t)(B * H * L * Dv) * 4);
                            float *l1 = malloc((size_t)(B * H * L) * 4), *l2 = malloc((size_t)(B * H * L) * 4);
                            float slopes[8];
                            uint8_t *kpm = calloc((size_t)(B * S), 1);
                            for (int64_t j = 0; j < B * S; j += 7) kpm[j] = 1;
                            attn_sdpa_desc d;
                            attn_sdpa_desc_init(&d);
                            d.batch = B, d.n_heads = H, d.len_q = L, d.head_dim = D, d.head_dim_v = Dv;
                            d.causal = opt == 1 ? ATTN_CAUSAL_NONE : ATTN_CAUSAL_BOTTOM_RIGHT;
                            attn_layout_strides(ATTN_LAYOUT_BLHD, B, H, L, D, d.q_stride);
                            attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, L, Dv, d.o_stride);
                            if (opt == 1) {
                                d.key_padding_mask = kpm, d.key_padding_mask_dtype = ATTN_DTYPE_BOOL;
                                d.key_padding_mask_stride[0] = S, d.key_padding_mask_stride[1] = 1;
                            } else if (opt == 2) {
                                for (int h = 0; h < 8; h++) slopes[h] = 0.01f * (float)(h + 1);
                                d.alibi_slopes = slopes, d.use_window = 1, d.window_left = 300, d.window_right = -1;
                                d.softcap = 20.0f;
                            }
                            ASSERT_OK(attn_kv_cache_attend(ctx, kc, &d, q, o1, l1));
                            ref_on_storage(kc, &d, q, o2, l2);
                            char what[96];
                            snprintf(what, sizeof what, "%s %s T=%d S=%lld L=%lld opt %d", attn_dtype_name(dt),
                                     attn_isa_name(isas[ii]), threads, (long long)S, (long long)L, opt);
                            if (attn_isa_int8_query(isas[ii])) { // the query rounded
                                attn_sdpa_desc r = d;
                                void *ks, *vs;
                                attn_kv_cache_storage(kc, &ks, r.k_stride, &vs, r.v_stride);
                                r.n_kv_heads = Hkv, r.len_kv = S;
                                assert_block_kernels(what, dt, ctx, &r, q, ks, vs, o1, l1, 1.0 / 254);
                            } else {
                                harness_assert_close(__FILE__, __LINE__, what, o1, o2, B * H * L * Dv, 2e-6, 2e-5);
                                harness_assert_close(__FILE__, __LINE__, what, l1, l2, B * H * L, 2e-6, 2e-5);
                            }
                            free(q), free(o1), free(o2), free(l1), free(l2), free(kpm);
                        }
                }
                attn_kv_cache_free(kc);
                attn_ctx_free(ctx);
            }
        }
}

// The bound of attn.h (kv_dtype) on every row, on every kernel table the CPU runs: the quantised
// cache against the float keys and values it was filled from, on moderate and large logits and on
// outliers.
static void test_attention_bound(void) {
    uint32_t seed = 23;
    attn_isa isas[16];
    const int n_isa = fused_isas(isas);
    for (int ii = 0; ii < n_isa; ii++)
    for (int t = 0; t < 2; t++)
        for (int mode = 0; mode < 3; mode++) {
            const attn_dtype dt = qtypes[t];
            const double c = dt == ATTN_DTYPE_Q8_0 ? 1.0 / 254 + ldexp(1, -11) + ldexp(1, -20) : 1.0 / 8 + ldexp(1, -10);
            const double a = dt == ATTN_DTYPE_Q8_0 ? ldexp(1, -18) : ldexp(1, -21);
            attn_ctx *ctx = test_ctx(isas[ii], 2), *ref = test_ctx(ATTN_ISA_REF, 1);
            const int64_t H = 4, Hkv = 2, D = 64, S = 700;
            const float qmag = mode == 1 ? 6.0f : 1.0f; // mode 1: large logits
            float *k = randu(Hkv * S * D, 1.0f, &seed), *v = randu(Hkv * S * D, 1.0f, &seed);
            if (mode == 2) // outliers: a few large keys and values, and a block of tiny ones
                for (int i = 0; i < 20; i++) k[lcg(&seed) % (Hkv * S * D)] = 25.0f, v[lcg(&seed) % (Hkv * S * D)] = -40.0f;
            attn_kv_cache *kc = make_cache(ctx, 1, Hkv, D, D, S, dt);
            ASSERT_OK(attn_kv_cache_append(ctx, kc, S, k, NULL, v, NULL));
            float *q = randu(H * D, qmag, &seed), *oq = malloc((size_t)(H * D) * 4), *of = malloc((size_t)(H * D) * 4);
            attn_sdpa_desc d;
            attn_sdpa_desc_init(&d);
            d.batch = 1, d.n_heads = H, d.n_kv_heads = Hkv, d.len_q = 1, d.len_kv = S, d.head_dim = D;
            d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
            attn_layout_strides(ATTN_LAYOUT_BHLD, 1, H, 1, D, d.q_stride);
            attn_layout_strides(ATTN_LAYOUT_BHLD, 1, H, 1, D, d.o_stride);
            attn_layout_strides(ATTN_LAYOUT_BHLD, 1, Hkv, S, D, d.k_stride);
            attn_layout_strides(ATTN_LAYOUT_BHLD, 1, Hkv, S, D, d.v_stride);
            ASSERT_OK(attn_kv_cache_attend(ctx, kc, &d, q, oq, NULL));
            ASSERT_OK(attn_sdpa_fwd(ref, &d, q, k, v, of, NULL, NULL)); // the float keys and values
            const float scale = 1.0f / sqrtf((float)D);
            for (int64_t h = 0; h < H; h++) {
                const int64_t hk = h / (H / Hkv);
                double mk = 0, mv = 0, sq = 0;
                for (int64_t e = 0; e < S * D; e++)
                    mk = fmax(mk, fabs((double)k[hk * S * D + e])), mv = fmax(mv, fabs((double)v[hk * S * D + e]));
                for (int64_t e = 0; e < D; e++) sq += fabs((double)q[h * D + e]);
                double delta = scale * sq * (c * mk + a), u = 0.0, flush = 0.0;
                if (attn_isa_int8_query(attn_ctx_isa(ctx))) { // the query rounded
                    const double mks = (1 + c) * mk + a; // the stored keys' largest magnitude, at most
                    delta += delta_q(q + h * D, D, scale, 1.0 / 254, mks);
                    // the stored blocks' scales: d = max / 127 (Q8_0) or max / -8 (Q4_0), as halves
                    const double dmax = mv / (dt == ATTN_DTYPE_Q8_0 ? 127.0 : 8.0) * (1 + ldexp(1, -10));
                    u = weights_u(ctx), flush = weights_f(ctx, dt, dmax, S);
                }
                const double bound = (exp(2 * delta) * (1 + c) * (1 + u) - 1) * mv + exp(2 * delta) * a + flush + 1e-5 * mv;
                for (int64_t e = 0; e < D; e++) {
                    const double err = fabs((double)oq[h * D + e] - (double)of[h * D + e]);
                    harness_checks++;
                    if (!(err <= bound))
                        FAIL("%s %s mode %d: head %lld error %.3g over the bound %.3g", attn_dtype_name(dt),
                             attn_isa_name(isas[ii]), mode, (long long)h, err, bound);
                }
            }
            free(k), free(v), free(q), free(oq), free(of);
            attn_kv_cache_free(kc);
            attn_ctx_free(ctx), attn_ctx_free(ref);
        }
}

// Caller-quantised k and v given to attn_sdpa_fwd in a (B, S, Hkv * D) layout, the varlen forward,
// and the layouts and calls that must be refused.
static void test_direct_sdpa(void) {
    uint32_t seed = 31;
    for (int t = 0; t < 2; t++) {
        const attn_dtype dt = qtypes[t];
        const int64_t B = 2, H = 4, Hkv = 2, L = 3, S = 130, D = 32, Dv = 64;
        float *kf = randu(B * S * Hkv * D, 1.0f, &seed), *vf = randu(B * S * Hkv * Dv, 1.0f, &seed);
        void *k = malloc(qbytes(dt, B * S * Hkv * D)), *v = malloc(qbytes(dt, B * S * Hkv * Dv));
        ASSERT_OK(attn_convert(dt, k, ATTN_DTYPE_F32, kf, B * S * Hkv * D));
        ASSERT_OK(attn_convert(dt, v, ATTN_DTYPE_F32, vf, B * S * Hkv * Dv));
        float *q = randu(B * H * L * D, 1.0f, &seed);
        float *o1 = malloc((size_t)(B * H * L * Dv) * 4), *o2 = malloc((size_t)(B * H * L * Dv) * 4);
        attn_sdpa_desc d;
        attn_sdpa_desc_init(&d);
        d.batch = B, d.n_heads = H, d.n_kv_heads = Hkv, d.len_q = L, d.len_kv = S, d.head_dim = D, d.head_dim_v = Dv;
        d.kv_dtype = dt, d.causal = ATTN_CAUSAL_TOP_LEFT;
        attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, L, D, d.q_stride);
        attn_layout_strides(ATTN_LAYOUT_BLHD, B, Hkv, S, D, d.k_stride);
        attn_layout_strides(ATTN_LAYOUT_BLHD, B, Hkv, S, Dv, d.v_stride);
        attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, L, Dv, d.o_stride);
        attn_ctx *ctx = test_ctx(ATTN_ISA_AUTO, 2), *ref = test_ctx(ATTN_ISA_REF, 1);
        ASSERT_OK(attn_sdpa_fwd(ctx, &d, q, k, v, o1, NULL, NULL));
        ASSERT_OK(attn_sdpa_fwd(ref, &d, q, k, v, o2, NULL, NULL));
        if (attn_isa_int8_query(attn_ctx_isa(ctx))) // the query rounded (attn.h)
            assert_block_kernels("direct", dt, ctx, &d, q, k, v, o1, NULL, 1.0 / 254);
        else
            ASSERT_CLOSE(o1, o2, B * H * L * Dv, 2e-6, 2e-5);
        // the reference on the dequantised values gives the same
        float *kd = malloc((size_t)(B * S * Hkv * D) * 4), *vd = malloc((size_t)(B * S * Hkv * Dv) * 4);
        ASSERT_OK(attn_convert(ATTN_DTYPE_F32, kd, dt, k, B * S * Hkv * D));
        ASSERT_OK(attn_convert(ATTN_DTYPE_F32, vd, dt, v, B * S * Hkv * Dv));
        attn_sdpa_desc f = d;
        f.kv_dtype = ATTN_DTYPE_F32;
        ASSERT_OK(attn_sdpa_fwd(ref, &f, q, kd, vd, o1, NULL, NULL));
        ASSERT_CLOSE(o2, o1, B * H * L * Dv, 1e-6, 1e-6);
        // varlen: two sequences of the packed (total_k, Hkv, D) k and v (batch 0's rows)
        const int64_t cu_q[3] = {0, 1, 3}, cu_k[3] = {0, 64, 130};
        attn_sdpa_desc p = d;
        p.batch = 2, p.len_q = 2, p.len_kv = 66, p.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
        const int64_t pq[4] = {0, D, H * D, 1}, pk[4] = {0, D, Hkv * D, 1}, pv[4] = {0, Dv, Hkv * Dv, 1}, po[4] = {0, Dv, H * Dv, 1};
        memcpy(p.q_stride, pq, sizeof pq), memcpy(p.k_stride, pk, sizeof pk), memcpy(p.v_stride, pv, sizeof pv);
        memcpy(p.o_stride, po, sizeof po);
        ASSERT_OK(attn_sdpa_varlen_fwd(ctx, &p, cu_q, cu_k, q, k, v, o1, NULL));
        ASSERT_OK(attn_sdpa_varlen_fwd(ref, &p, cu_q, cu_k, q, k, v, o2, NULL));
        if (attn_isa_int8_query(attn_ctx_isa(ctx))) {
            for (int s = 0; s < 2; s++) { // each sequence as a batch of one
                attn_sdpa_desc one = p;
                one.batch = 1, one.len_q = cu_q[s + 1] - cu_q[s], one.len_kv = cu_k[s + 1] - cu_k[s];
                const int64_t o_at = cu_q[s] * H * Dv;
                assert_block_kernels("varlen", dt, ctx, &one, q + cu_q[s] * H * D, (const char *)k + qbytes(dt, cu_k[s] * Hkv * D),
                                  (const char *)v + qbytes(dt, cu_k[s] * Hkv * Dv), o1 + o_at, NULL, 1.0 / 254);
            }
        } else {
            ASSERT_CLOSE(o1, o2, 3 * H * Dv, 2e-6, 2e-5);
        }
        // sequence 1 on its own: keys from row 64 (byte offset of whole blocks), queries 1 and 2
        attn_sdpa_desc one = p;
        one.batch = 1, one.len_q = 2, one.len_kv = 66;
        float *o3 = malloc((size_t)(2 * H * Dv) * 4);
        ASSERT_OK(attn_sdpa_fwd(ref, &one, q + H * D, (const char *)k + qbytes(dt, 64 * Hkv * D),
                                (const char *)v + qbytes(dt, 64 * Hkv * Dv), o3, NULL, NULL));
        if (!attn_isa_int8_query(attn_ctx_isa(ctx))) ASSERT_CLOSE(o1 + H * Dv, o3, 2 * H * Dv, 2e-6, 2e-5);
        else ASSERT_CLOSE(o2 + H * Dv, o3, 2 * H * Dv, 2e-6, 2e-5); // the references agree
        free(o3);
        // refused: head dims that are not whole blocks, values not contiguous, rows off a block
        attn_sdpa_desc e = d;
        e.head_dim = 16;
        ASSERT_STATUS(attn_sdpa_fwd(ctx, &e, q, k, v, o1, NULL, NULL), ATTN_ERR_BAD_SHAPE);
        e = d, e.k_stride[3] = 2;
        ASSERT_STATUS(attn_sdpa_fwd(ctx, &e, q, k, v, o1, NULL, NULL), ATTN_ERR_INVALID_ARG);
        ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "stride[3]") != NULL);
        e = d, e.v_stride[2] = Dv + 8;
        ASSERT_STATUS(attn_sdpa_fwd(ctx, &e, q, k, v, o1, NULL, NULL), ATTN_ERR_INVALID_ARG);
        ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "multiple of 32") != NULL);
        e = d, e.batch = 1, e.k_stride[0] = 7; // a length-1 dimension's stride is never used
        ASSERT_OK(attn_sdpa_fwd(ctx, &e, q, k, v, o1, NULL, NULL));
        float lse[2 * 4 * 3], g[2 * 4 * 3 * 64];
        memset(g, 0, sizeof g);
        ASSERT_STATUS(attn_sdpa_bwd(ctx, &d, q, k, v, o2, g, lse, NULL, g, g, g, NULL), ATTN_ERR_UNSUPPORTED);
        free(kf), free(vf), free(k), free(v), free(q), free(o1), free(o2), free(kd), free(vd);
        attn_ctx_free(ctx), attn_ctx_free(ref);
    }
}

// The decode kernels of attn_isa_int8_query's ISAs for both block types on queries of integers
// whose every block holds +-127: int8 holds them exactly, so the kernels differ from the reference
// only by the weights' rounding (bf16: 2^-8; the int16 weights of AVX2, AVX512_VNNI and AMX_BF16: weights_f),
// sharper than the general bound (a 1% error in the weights fails).
static void test_exact_query(void) {
    attn_isa isas[16];
    const int n_isa = fused_isas(isas);
    uint32_t seed = 41;
    int ran = 0;
    for (int ii = 0; ii < n_isa; ii++) {
        if (!attn_isa_int8_query(isas[ii])) continue; // the float kernels: the general bound's test
        for (int t = 0; t < 4; t++) { // Dv 96 and 224: the P V kernels' groups of four blocks, whole and not
            const attn_dtype dt = qtypes[t % 2];
            attn_ctx *ctx = test_ctx(isas[ii], 2);
            const int64_t B = 1, Hkv = 2, H = 8, D = 128, Dv = t < 2 ? 96 : 224, S = 777;
            attn_kv_cache *kc = make_cache(ctx, B, Hkv, D, Dv, S, dt);
            float *k = randu(B * Hkv * S * D, 2.0f, &seed), *v = randu(B * Hkv * S * Dv, 1.0f, &seed);
            for (int64_t i = 0; i < B * Hkv * S * Dv; i++) v[i] += 2.0f; // one sign: the output near max|v|
            ASSERT_OK(attn_kv_cache_append(ctx, kc, S, k, NULL, v, NULL));
            float *q = malloc((size_t)(B * H * D) * 4), *o = malloc((size_t)(B * H * Dv) * 4), *l = malloc((size_t)(B * H) * 4);
            for (int64_t i = 0; i < B * H * D; i++)
                q[i] = i % QK == (i / QK) % QK ? ((i / QK) % 2 ? 127.0f : -127.0f) : (float)((int)(lcg(&seed) % 255) - 127);
            attn_sdpa_desc d;
            attn_sdpa_desc_init(&d);
            d.batch = B, d.n_heads = H, d.len_q = 1, d.head_dim = D, d.head_dim_v = Dv, d.scale = 2e-3f;
            d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
            attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, 1, D, d.q_stride);
            attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, 1, Dv, d.o_stride);
            ASSERT_OK(attn_kv_cache_attend(ctx, kc, &d, q, o, l));
            void *ks, *vs;
            attn_kv_cache_storage(kc, &ks, d.k_stride, &vs, d.v_stride);
            d.n_kv_heads = Hkv, d.len_kv = S;
            char what[64];
            snprintf(what, sizeof what, "%s %s Dv=%lld", attn_dtype_name(dt), attn_isa_name(isas[ii]), (long long)Dv);
            assert_block_kernels(what, dt, ctx, &d, q, ks, vs, o, l, 0.0);
            free(k), free(v), free(q), free(o), free(l);
            attn_kv_cache_free(kc);
            attn_ctx_free(ctx);
            ran++;
        }
    }
    if (ran == 0) SKIP("this CPU has no AVX2");
}

// The rounding of the P V weights that attn_isa_int16_weights and attn_isa_int8_query name, seen in
// a decoding step on every ISA: two keys whose weights are 1 and p = exp(-9 * 127 / 2^23) (about
// 1 - 1.4e-4), values whose block scale d is a power of two (Q8_0: 2^-7, Q4_0: 2^-3; exact in fp16
// and bf16) and whose column 0 holds +0.5 and -0.5, so that out = 0.5 (p - 1) / (p + 1). Rounded to
// bf16, p d is d and out is 0; rounded to int16 against the largest weight, p becomes
// round(32767 p) / 32767, 0.46 / 32767 away (out off by about 3.5e-6); unrounded, out is the
// reference's to float32 rounding (about 1e-7).
static void test_weights_rounding(void) {
    attn_isa isas[16];
    const int n_isa = fused_isas(isas);
    const int64_t D = 32, S = 2;
    const double p = exp(-9.0 * 127.0 / 0x1p23);
    const double exact = 0.5 * (p - 1.0) / (p + 1.0), w16 = nearbyint(32767.0 * p) / 32767.0;
    const double as_int16 = 0.5 * (w16 - 1.0) / (w16 + 1.0), tol = 5e-7;
    ASSERT_TRUE(fabs(as_int16 - exact) > 5 * tol && fabs(exact) > 5 * tol); // the three apart
    for (int t = 0; t < 2; t++) {
        const attn_dtype dt = qtypes[t];
        // element 1 of every row sets the block scale d (Q8_0: max|x| / 127, Q4_0: the signed largest
        // / -8); the keys' element 0 are d apart, so the scores scale * 127 * k[0] differ by 9 * 127 / 2^23
        const float dk = dt == ATTN_DTYPE_Q8_0 ? 1.0f / 128.0f : 0.125f, top = dt == ATTN_DTYPE_Q8_0 ? 127.0f / 128.0f : -1.0f;
        const float scale = 9.0f / 65536.0f / (dk * 128.0f);
        float k[2 * 32] = {0}, v[2 * 32] = {0}, q[32] = {0}, o[32];
        k[0] = 0.5f - dk, k[32] = 0.5f, k[1] = k[33] = top;
        v[0] = 0.5f, v[32] = -0.5f, v[1] = v[33] = top;
        q[0] = 127.0f; // exact in int8 after any scaling: the only nonzero element of its block
        for (int ii = 0; ii < n_isa; ii++) {
            attn_ctx *ctx = test_ctx(isas[ii], 1);
            attn_kv_cache *kc = make_cache(ctx, 1, 1, D, D, S, dt);
            ASSERT_OK(attn_kv_cache_append(ctx, kc, S, k, NULL, v, NULL));
            attn_sdpa_desc d;
            attn_sdpa_desc_init(&d);
            d.batch = 1, d.n_heads = 1, d.len_q = 1, d.head_dim = D, d.head_dim_v = D, d.scale = scale;
            attn_layout_strides(ATTN_LAYOUT_BHLD, 1, 1, 1, D, d.q_stride);
            attn_layout_strides(ATTN_LAYOUT_BHLD, 1, 1, 1, D, d.o_stride);
            ASSERT_OK(attn_kv_cache_attend(ctx, kc, &d, q, o, NULL));
            const attn_isa isa = attn_ctx_isa(ctx);
            const double want = !attn_isa_int8_query(isa) ? exact : attn_isa_int16_weights(isa) ? as_int16 : 0.0;
            harness_checks++;
            if (!(fabs(o[0] - want) <= tol))
                FAIL("%s %s: out %.9g, want %.9g (unrounded %.9g, int16 %.9g, bf16 0)", attn_isa_name(isa),
                     attn_dtype_name(dt), o[0], want, exact, as_int16);
            attn_kv_cache_free(kc);
            attn_ctx_free(ctx);
        }
    }
}

// Value blocks with an infinite or NaN scale in a decoding step on every ISA: the output columns
// that weigh them are non-finite exactly where the reference's are (the int16 P V of AVX2,
// AVX512_VNNI and AMX_BF16 takes such a tile's float products instead of rounding its weights to int16), and the other columns, in the
// same tiles and in others, stay within a loose bound of the reference.
static void test_nonfinite_values(void) {
    attn_isa isas[16];
    const int n_isa = fused_isas(isas);
    uint32_t seed = 43;
    for (int ii = 0; ii < n_isa; ii++)
        for (int t = 0; t < 2; t++) {
            const attn_dtype dt = qtypes[t];
            attn_ctx *ctx = test_ctx(isas[ii], 1);
            const int64_t H = 4, D = 128, S = 300;
            attn_kv_cache *kc = make_cache(ctx, 1, 1, D, D, S, dt);
            float *k = randu(S * D, 1.0f, &seed), *v = randu(S * D, 1.0f, &seed);
            ASSERT_OK(attn_kv_cache_append(ctx, kc, S, k, NULL, v, NULL));
            void *ks, *vs;
            int64_t kst[4], vst[4];
            attn_kv_cache_storage(kc, &ks, kst, &vs, vst);
            // +inf in key 20's block 1, NaN in key 150's block 3, -inf in key 151's block 3 (tile 2)
            const struct { int64_t key, block; uint16_t h; } bad[3] = {{20, 1, 0x7C00}, {150, 3, 0x7E00}, {151, 3, 0xFC00}};
            for (int i = 0; i < 3; i++) {
                uint8_t *blk = (uint8_t *)vs + qbytes(dt, bad[i].key * vst[2] + bad[i].block * QK);
                blk[0] = (uint8_t)(bad[i].h & 0xFF), blk[1] = (uint8_t)(bad[i].h >> 8);
            }
            float *q = randu(H * D, 1.0f, &seed), *o = malloc((size_t)(H * D) * 4), *r = malloc((size_t)(H * D) * 4);
            attn_sdpa_desc d;
            attn_sdpa_desc_init(&d);
            d.batch = 1, d.n_heads = H, d.len_q = 1, d.head_dim = D, d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
            attn_layout_strides(ATTN_LAYOUT_BHLD, 1, H, 1, D, d.q_stride);
            attn_layout_strides(ATTN_LAYOUT_BHLD, 1, H, 1, D, d.o_stride);
            ASSERT_OK(attn_kv_cache_attend(ctx, kc, &d, q, o, NULL));
            ref_on_storage(kc, &d, q, r, NULL);
            int nonfinite = 0;
            for (int64_t e = 0; e < H * D; e++) {
                harness_checks++;
                if (!isfinite(r[e])) {
                    nonfinite++;
                    if (isfinite(o[e]) || (isnan(r[e]) && !isnan(o[e])) || (isinf(r[e]) && o[e] != r[e]))
                        FAIL("%s %s: out[%lld] = %g where the reference has %g", attn_dtype_name(dt), attn_isa_name(isas[ii]),
                             (long long)e, (double)o[e], (double)r[e]);
                } else if (!(fabs((double)o[e] - (double)r[e]) <= 0.02 + 0.02 * fabs((double)r[e]))) {
                    FAIL("%s %s: out[%lld] = %g against the reference's %g", attn_dtype_name(dt), attn_isa_name(isas[ii]),
                         (long long)e, (double)o[e], (double)r[e]);
                }
            }
            ASSERT_TRUE(nonfinite >= H * 2 * 16); // the columns of blocks 1 and 3 (but for quants of 0)
            free(k), free(v), free(q), free(o), free(r);
            attn_kv_cache_free(kc);
            attn_ctx_free(ctx);
        }
}

// The module's cached forward on a quantised cache follows the float forward within the bound's
// scale (head_dim 32).
static void test_module_cached(void) {
    attn_ctx *ctx = test_ctx(ATTN_ISA_AUTO, 2);
    attn_generator_seed(attn_ctx_generator(ctx), 1);
    const int64_t E = 64, H = 2, T = 12;
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, E, H);
    attn_mha *m = NULL;
    ASSERT_OK(attn_mha_create(ctx, &cfg, &m));
    uint32_t seed = 4;
    float *x = randu(T * E, 1.0f, &seed), *o8 = malloc((size_t)(T * E) * 4), *of = malloc((size_t)(T * E) * 4);
    attn_kv_cache *k8 = make_cache(ctx, 1, H, E / H, E / H, T, ATTN_DTYPE_Q8_0);
    attn_kv_cache *kf = make_cache(ctx, 1, H, E / H, E / H, T, ATTN_DTYPE_F32);
    for (int64_t t = 0; t < T; t++) {
        ASSERT_OK(attn_mha_forward_cached(ctx, m, k8, x + t * E, 1, 1, o8 + t * E));
        ASSERT_OK(attn_mha_forward_cached(ctx, m, kf, x + t * E, 1, 1, of + t * E));
    }
    ASSERT_CLOSE(o8, of, T * E, 2e-2, 2e-2);
    free(x), free(o8), free(of);
    attn_kv_cache_free(k8), attn_kv_cache_free(kf);
    attn_mha_free(m);
    attn_ctx_free(ctx);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_ggml_bytes),     HARNESS_CASE(test_value_bound),     HARNESS_CASE(test_cache_storage),
        HARNESS_CASE(test_cache_kernels),  HARNESS_CASE(test_attention_bound), HARNESS_CASE(test_direct_sdpa), HARNESS_CASE(test_exact_query),
        HARNESS_CASE(test_weights_rounding), HARNESS_CASE(test_nonfinite_values), HARNESS_CASE(test_module_cached),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

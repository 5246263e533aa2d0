// test_varlen.c - packed variable-length batches against a loop over the sequences, each copied
// out and run as its own (1, H, L, D) problem on the scalar reference: forward (out, lse) and
// backward (dq, dk, dv, and the sinks' gradient), with sequences of no queries or no keys, GQA,
// causal masks of both alignments, windows, half-precision k and v, attention sinks, and dropout
// (the same draws, sequence after sequence). The packed tensors are (total, H, D) token-major, as FlashAttention's varlen layout.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"
#include "test_data.h"


typedef struct config {
    int n;                  // sequences
    int64_t Lq[5], Sk[5];   // their query and key counts
    int64_t H, Hkv, D;
    attn_causal causal;
    int window;             // (3, 1) window
    attn_dtype kvdt;
    double dropout;
    int sinks;              // attention sinks, one per head in [-1, 2]
} config;

// Token-major (total, heads, width) strides as the desc wants them: (0, head, token, element).
static void packed_strides(int64_t heads, int64_t width, int64_t s[4]) {
    s[0] = 0, s[1] = width, s[2] = heads * width, s[3] = 1;
}

static void check_config(const config *c, attn_isa isa, int threads, uint32_t seed) {
    int64_t cu_q[6] = {0}, cu_k[6] = {0}, lmax = 1, smax = 1;
    for (int b = 0; b < c->n; b++) {
        cu_q[b + 1] = cu_q[b] + c->Lq[b], cu_k[b + 1] = cu_k[b] + c->Sk[b];
        if (c->Lq[b] > lmax) lmax = c->Lq[b];
        if (c->Sk[b] > smax) smax = c->Sk[b];
    }
    const int64_t TQ = cu_q[c->n], TK = cu_k[c->n], H = c->H, Hkv = c->Hkv, D = c->D;
    const int64_t nq = TQ * H * D, nk = TK * Hkv * D;
    float *q = malloc((size_t)nq * 4), *k = malloc((size_t)nk * 4), *v = malloc((size_t)nk * 4), *g = malloc((size_t)nq * 4);
    for (int64_t i = 0; i < nq; i++) q[i] = rand_sym(&seed), g[i] = rand_sym(&seed);
    for (int64_t i = 0; i < nk; i++) k[i] = rand_sym(&seed), v[i] = rand_sym(&seed);
    if (c->kvdt != ATTN_DTYPE_F32) { // the values k and v hold are their rounding
        for (int64_t i = 0; i < nk; i++) {
            uint16_t h[2];
            attn_convert(c->kvdt, h, ATTN_DTYPE_F32, &k[i], 1), attn_convert(ATTN_DTYPE_F32, &k[i], c->kvdt, h, 1);
            attn_convert(c->kvdt, h, ATTN_DTYPE_F32, &v[i], 1), attn_convert(ATTN_DTYPE_F32, &v[i], c->kvdt, h, 1);
        }
    }
    uint16_t *kh = malloc((size_t)nk * 2), *vh = malloc((size_t)nk * 2);
    ASSERT_OK(attn_convert(c->kvdt == ATTN_DTYPE_F32 ? ATTN_DTYPE_F16 : c->kvdt, kh, ATTN_DTYPE_F32, k, nk));
    ASSERT_OK(attn_convert(c->kvdt == ATTN_DTYPE_F32 ? ATTN_DTYPE_F16 : c->kvdt, vh, ATTN_DTYPE_F32, v, nk));
    const void *kp = c->kvdt == ATTN_DTYPE_F32 ? (const void *)k : kh, *vp = c->kvdt == ATTN_DTYPE_F32 ? (const void *)v : vh;

    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = c->n, d.n_heads = H, d.n_kv_heads = Hkv, d.len_q = lmax, d.len_kv = smax, d.head_dim = D;
    d.causal = c->causal, d.kv_dtype = c->kvdt, d.dropout_p = c->dropout;
    if (c->window) d.use_window = 1, d.window_left = 3, d.window_right = 1;
    float z[8], dz[8];
    double dz_want[8] = {0};
    for (int64_t h = 0; h < H; h++) z[h] = 3.0f * rand_unit(&seed) - 1.0f;
    if (c->sinks) d.sinks = z;
    packed_strides(H, D, d.q_stride), packed_strides(Hkv, D, d.k_stride), packed_strides(Hkv, D, d.v_stride);
    packed_strides(H, D, d.o_stride);
    float *out = malloc((size_t)nq * 4), *lse = malloc((size_t)(H * TQ) * 4);
    float *dq = malloc((size_t)nq * 4), *dk = malloc((size_t)nk * 4), *dv = malloc((size_t)nk * 4);
    attn_ctx *ctx = test_ctx(isa, threads);
    attn_generator_seed(attn_ctx_generator(ctx), 99);
    const attn_generator start = *attn_ctx_generator(ctx);
    ASSERT_OK(attn_sdpa_varlen_fwd(ctx, &d, cu_q, cu_k, q, kp, vp, out, lse));
    ASSERT_OK(attn_sdpa_varlen_bwd(ctx, &d, cu_q, cu_k, q, kp, vp, out, g, lse, &start, dq, dk, dv));
    if (c->sinks) ASSERT_OK(attn_sdpa_sinks_bwd(ctx, &d, cu_q, cu_k, out, g, lse, dz));

    // the loop over the sequences, on the reference, one generator consumed in order
    attn_ctx *ref = test_ctx(ATTN_ISA_REF, 1);
    attn_generator_seed(attn_ctx_generator(ref), 99);
    for (int b = 0; b < c->n; b++) {
        const int64_t L = c->Lq[b], S = c->Sk[b];
        if (L == 0) continue;
        float *qb = malloc((size_t)(H * L * D) * 4), *gb = malloc((size_t)(H * L * D) * 4);
        float *kb = malloc((size_t)(Hkv * (S + 1) * D) * 4), *vb = malloc((size_t)(Hkv * (S + 1) * D) * 4);
        float *ob = malloc((size_t)(H * L * D) * 4), *lb = malloc((size_t)(H * L) * 4);
        float *dqb = malloc((size_t)(H * L * D) * 4), *dkb = malloc((size_t)(Hkv * (S + 1) * D) * 4),
              *dvb = malloc((size_t)(Hkv * (S + 1) * D) * 4);
        for (int64_t h = 0; h < H; h++) // (1, H, L, D) copies
            for (int64_t i = 0; i < L; i++)
                for (int64_t e = 0; e < D; e++) {
                    qb[(h * L + i) * D + e] = q[((cu_q[b] + i) * H + h) * D + e];
                    gb[(h * L + i) * D + e] = g[((cu_q[b] + i) * H + h) * D + e];
                }
        for (int64_t h = 0; h < Hkv; h++)
            for (int64_t j = 0; j < S; j++)
                for (int64_t e = 0; e < D; e++) {
                    kb[(h * S + j) * D + e] = k[((cu_k[b] + j) * Hkv + h) * D + e];
                    vb[(h * S + j) * D + e] = v[((cu_k[b] + j) * Hkv + h) * D + e];
                }
        if (S == 0) { // no keys: zero output, lse -inf (or the sink), zero dq, nothing for the sinks
            for (int64_t i = 0; i < H * L * D; i++) ob[i] = 0.0f, dqb[i] = 0.0f;
            for (int64_t i = 0; i < H * L; i++) lb[i] = c->sinks ? z[i / L] : -INFINITY;
        } else {
            attn_sdpa_desc e = d;
            e.batch = 1, e.len_q = L, e.len_kv = S, e.kv_dtype = ATTN_DTYPE_F32;
            attn_layout_strides(ATTN_LAYOUT_BHLD, 1, H, L, D, e.q_stride);
            attn_layout_strides(ATTN_LAYOUT_BHLD, 1, Hkv, S, D, e.k_stride);
            attn_layout_strides(ATTN_LAYOUT_BHLD, 1, Hkv, S, D, e.v_stride);
            attn_layout_strides(ATTN_LAYOUT_BHLD, 1, H, L, D, e.o_stride);
            const attn_generator st = *attn_ctx_generator(ref);
            ASSERT_OK(attn_sdpa_fwd(ref, &e, qb, kb, vb, ob, lb, NULL));
            ASSERT_OK(attn_sdpa_bwd(ref, &e, qb, kb, vb, ob, gb, lb, &st, dqb, dkb, dvb, NULL));
            if (c->sinks) {
                float dzb[8];
                ASSERT_OK(attn_sdpa_sinks_bwd(ref, &e, NULL, NULL, ob, gb, lb, dzb));
                for (int64_t h = 0; h < H; h++) dz_want[h] += dzb[h];
            }
        }
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++) {
                harness_assert_close(__FILE__, __LINE__, "out", out + ((cu_q[b] + i) * H + h) * D, ob + (h * L + i) * D, D,
                                     1e-6, 1e-5);
                harness_assert_close(__FILE__, __LINE__, "lse", lse + h * TQ + cu_q[b] + i, lb + h * L + i, 1, 1e-6, 1e-5);
                harness_assert_close(__FILE__, __LINE__, "dq", dq + ((cu_q[b] + i) * H + h) * D, dqb + (h * L + i) * D, D,
                                     1e-5, 1e-4);
            }
        for (int64_t h = 0; h < Hkv; h++)
            for (int64_t j = 0; j < S; j++) {
                harness_assert_close(__FILE__, __LINE__, "dk", dk + ((cu_k[b] + j) * Hkv + h) * D, dkb + (h * S + j) * D, D,
                                     1e-5, 1e-4);
                harness_assert_close(__FILE__, __LINE__, "dv", dv + ((cu_k[b] + j) * Hkv + h) * D, dvb + (h * S + j) * D, D,
                                     1e-5, 1e-4);
            }
        free(qb), free(gb), free(kb), free(vb), free(ob), free(lb), free(dqb), free(dkb), free(dvb);
    }
    for (int64_t h = 0; c->sinks && h < H; h++) { // the sequences' sums in another order
        const float want = (float)dz_want[h];
        harness_assert_close(__FILE__, __LINE__, "dsinks", &dz[h], &want, 1, 1e-5, 1e-4);
    }
    for (int b = 0; b < c->n; b++) // keys of a sequence without queries: zero gradients
        if (c->Lq[b] == 0)
            for (int64_t i = cu_k[b] * Hkv * D; i < cu_k[b + 1] * Hkv * D; i++) ASSERT_TRUE(dk[i] == 0.0f && dv[i] == 0.0f);
    attn_ctx_free(ref), attn_ctx_free(ctx);
    free(q), free(k), free(v), free(g), free(kh), free(vh), free(out), free(lse), free(dq), free(dk), free(dv);
}

static void test_against_sequence_loop(void) {
    const config cases[] = {
        {3, {5, 1, 70}, {5, 9, 70}, 4, 2, 16, ATTN_CAUSAL_NONE, 0, ATTN_DTYPE_F32, 0.0, 0},
        {4, {33, 0, 7, 2}, {40, 3, 7, 0}, 4, 4, 8, ATTN_CAUSAL_BOTTOM_RIGHT, 0, ATTN_DTYPE_F32, 0.0, 0},
        {2, {64, 65}, {64, 65}, 2, 1, 32, ATTN_CAUSAL_TOP_LEFT, 1, ATTN_DTYPE_F32, 0.0, 0},
        {3, {9, 130, 1}, {20, 130, 300}, 8, 2, 24, ATTN_CAUSAL_BOTTOM_RIGHT, 0, ATTN_DTYPE_F16, 0.0, 0},
        {2, {6, 11}, {6, 11}, 2, 2, 8, ATTN_CAUSAL_NONE, 0, ATTN_DTYPE_F32, 0.3, 0}, // dropout: draws in sequence order
        {5, {1, 1, 1, 1, 1}, {3, 100, 7, 1, 2000}, 8, 2, 64, ATTN_CAUSAL_BOTTOM_RIGHT, 0, ATTN_DTYPE_BF16, 0.0, 0}, // decode
        {4, {33, 0, 7, 2}, {40, 3, 7, 0}, 4, 2, 8, ATTN_CAUSAL_BOTTOM_RIGHT, 0, ATTN_DTYPE_F32, 0.0, 1}, // sinks
        {5, {1, 1, 3, 1, 1}, {3, 100, 7, 0, 2000}, 8, 2, 64, ATTN_CAUSAL_NONE, 1, ATTN_DTYPE_F16, 0.2, 1},
    };
    const attn_isa isas[2] = {ATTN_ISA_REF, ATTN_ISA_AUTO};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int a = 0; a < 2; a++) check_config(&cases[i], isas[a], 1 + a, 17u * (uint32_t)i + 1u);
}

static void test_errors(void) {
    attn_ctx *ctx = test_ctx(ATTN_ISA_AUTO, 1);
    float q[64] = {0}, k[64] = {0}, v[64] = {0}, o[64], l[8], g[64] = {0};
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = 2, d.n_heads = 1, d.len_q = 2, d.len_kv = 2, d.head_dim = 4;
    packed_strides(1, 4, d.q_stride), packed_strides(1, 4, d.k_stride), packed_strides(1, 4, d.v_stride);
    packed_strides(1, 4, d.o_stride);
    const int64_t cu[3] = {0, 2, 4}, bad_start[3] = {1, 2, 4}, down[3] = {0, 3, 2}, long_seq[3] = {0, 3, 4};
    ASSERT_OK(attn_sdpa_varlen_fwd(ctx, &d, cu, cu, q, k, v, o, l));
    ASSERT_STATUS(attn_sdpa_varlen_fwd(ctx, &d, bad_start, cu, q, k, v, o, l), ATTN_ERR_BAD_SHAPE);
    ASSERT_STATUS(attn_sdpa_varlen_fwd(ctx, &d, cu, down, q, k, v, o, l), ATTN_ERR_BAD_SHAPE);
    ASSERT_STATUS(attn_sdpa_varlen_fwd(ctx, &d, long_seq, cu, q, k, v, o, l), ATTN_ERR_BAD_SHAPE);
    ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "len_q") != NULL);
    // an offset far below the previous: a decrease, not a length (whose subtraction would overflow;
    // the sanitizer builds run this)
    const int64_t plunge[3] = {0, 1, INT64_MIN};
    ASSERT_STATUS(attn_sdpa_varlen_fwd(ctx, &d, plunge, cu, q, k, v, o, l), ATTN_ERR_BAD_SHAPE);
    ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "decrease") != NULL);
    ASSERT_STATUS(attn_sdpa_varlen_desc_check(ctx, &d, cu, plunge), ATTN_ERR_BAD_SHAPE);
    ASSERT_STATUS(attn_sdpa_varlen_fwd(ctx, &d, NULL, cu, q, k, v, o, l), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_sdpa_varlen_fwd(ctx, &d, cu, cu, q, k, v, NULL, l), ATTN_ERR_INVALID_ARG);
    uint8_t kpm[4] = {0};
    d.key_padding_mask = kpm, d.key_padding_mask_dtype = ATTN_DTYPE_BOOL;
    ASSERT_STATUS(attn_sdpa_varlen_fwd(ctx, &d, cu, cu, q, k, v, o, l), ATTN_ERR_UNSUPPORTED);
    d.key_padding_mask = NULL, d.dropout_p = 0.5;
    ASSERT_STATUS(attn_sdpa_varlen_bwd(ctx, &d, cu, cu, q, k, v, o, g, l, NULL, q, k, v), ATTN_ERR_INVALID_ARG);
    d.dropout_p = 0, d.batch = 0;
    ASSERT_STATUS(attn_sdpa_varlen_fwd(ctx, &d, cu, cu, q, k, v, o, l), ATTN_ERR_BAD_SHAPE);
    attn_ctx_free(ctx);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_against_sequence_loop),
        HARNESS_CASE(test_errors),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

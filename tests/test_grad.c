// test_grad.c - the attention backward against finite differences: a double-precision forward
// written in this file (every option: bool/float masks broadcast or per head, key padding, both
// causal alignments, GQA, Dk != Dv, custom scale, dropout with the forward's mask from the context's
// generator or from Philox), central
// differences of the loss sum(G * out), and attn_sdpa_bwd on every ISA (the reference and the fused
// kernels). Also: the fused backward against the reference on a size grid, identical bits for 1, 2
// and 3 threads, fully masked rows, masked NaN, NaN and inf in rows against the reference, mask
// views whose cells overlap, and argument errors.
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"
#include "test_data.h"
#include "philox.h"

typedef struct prob {
    int64_t B, H, Hkv, L, S, D, Dv;
    attn_causal causal;
    int mask;  // 0 none, 1 bool (L, S), 2 float per (b, h), 3 float (L, S) broadcast, 4 float (H, L, S) over B
    int kpm;   // 0 none, 1 bool, 2 float
    float scale;
    double dropout;
    int window;      // 0 none, else a local window (wl, wr)
    int64_t wl, wr;
    int alibi;       // ALiBi slopes 2^-(h+1)
    float softcap;   // 0 none
    attn_dtype kvdt; // k and v as F32 (0), F16 or BF16
    int philox;      // dropout from Philox (ATTN_DROPOUT_RNG_PHILOX) instead of the context's generator
    int sinks;       // attention sinks, one per head in [-1, 2]
} prob;
// no window, ALiBi, soft-capping or sinks; float k and v; torch's dropout
#define NO_EXT 0, 0, 0, 0, 0.0f, ATTN_DTYPE_F32, 0, 0

typedef struct tensors {
    double *q, *k, *v, *fmask; // double copies (the finite-difference variables)
    float *qf, *kf, *vf, *fmaskf, *g;
    uint8_t *bmask, *bkpm;
    float *fkpm;
    float *keep; // dropout keep mask (B, H, L, S), 0/1, drawn like the forward
    uint16_t *kh, *vh;  // half-precision k and v (kvdt F16 / BF16); kf, vf, k, v hold their values
    const void *kp, *vp; // what the calls get
    float *slopes;
    double *z;  // the sinks (H), a finite-difference variable, and as floats in zf
    float *zf;
    attn_sdpa_desc d;
    int64_t nq, nk, nv, no, nm, nmask;
} tensors;


static const uint64_t dropout_seed = 777;

static void mask_strides(const prob *p, int64_t st[4]) {
    if (p->mask == 2) st[0] = p->H * p->L * p->S, st[1] = p->L * p->S, st[2] = p->S, st[3] = 1;
    else if (p->mask == 4) st[0] = 0, st[1] = p->L * p->S, st[2] = p->S, st[3] = 1;
    else st[0] = 0, st[1] = 0, st[2] = p->S, st[3] = 1;
}

static tensors make(const prob *p, uint32_t seed) {
    tensors t;
    memset(&t, 0, sizeof t);
    t.nq = p->B * p->H * p->L * p->D, t.nk = p->B * p->Hkv * p->S * p->D, t.nv = p->B * p->Hkv * p->S * p->Dv;
    t.no = p->B * p->H * p->L * p->Dv, t.nm = p->B * p->H * p->L * p->S;
    t.nmask = p->mask == 2 ? t.nm : p->mask == 4 ? p->H * p->L * p->S : p->L * p->S;
    t.q = malloc((size_t)t.nq * 8), t.k = malloc((size_t)t.nk * 8), t.v = malloc((size_t)t.nv * 8);
    t.qf = malloc((size_t)t.nq * 4), t.kf = malloc((size_t)t.nk * 4), t.vf = malloc((size_t)t.nv * 4);
    t.g = malloc((size_t)t.no * 4), t.fmask = malloc((size_t)t.nmask * 8), t.fmaskf = malloc((size_t)t.nmask * 4);
    t.bmask = malloc((size_t)t.nmask), t.bkpm = malloc((size_t)(p->B * p->S)), t.fkpm = malloc((size_t)(p->B * p->S) * 4);
    t.keep = malloc((size_t)t.nm * 4);
    for (int64_t i = 0; i < t.nq; i++) t.qf[i] = (float)(2 * rand_unit_d(&seed) - 1), t.q[i] = t.qf[i];
    for (int64_t i = 0; i < t.nk; i++) t.kf[i] = (float)(2 * rand_unit_d(&seed) - 1), t.k[i] = t.kf[i];
    for (int64_t i = 0; i < t.nv; i++) t.vf[i] = (float)(2 * rand_unit_d(&seed) - 1), t.v[i] = t.vf[i];
    for (int64_t i = 0; i < t.no; i++) t.g[i] = (float)(2 * rand_unit_d(&seed) - 1);
    for (int64_t i = 0; i < t.nmask; i++) {
        t.bmask[i] = rand_unit_d(&seed) < 0.2;
        t.fmaskf[i] = rand_unit_d(&seed) < 0.1 ? -INFINITY : (float)(rand_unit_d(&seed) - 0.5);
        t.fmask[i] = t.fmaskf[i];
    }
    for (int64_t i = 0; i < p->B * p->S; i++) {
        t.bkpm[i] = rand_unit_d(&seed) < 0.15;
        t.fkpm[i] = rand_unit_d(&seed) < 0.1 ? -INFINITY : (float)(rand_unit_d(&seed) - 0.5);
    }
    t.kp = t.kf, t.vp = t.vf;
    if (p->kvdt != ATTN_DTYPE_F32) { // the values k and v denote are the rounded ones
        t.kh = malloc((size_t)t.nk * 2), t.vh = malloc((size_t)t.nv * 2);
        ASSERT_OK(attn_convert(p->kvdt, t.kh, ATTN_DTYPE_F32, t.kf, t.nk));
        ASSERT_OK(attn_convert(p->kvdt, t.vh, ATTN_DTYPE_F32, t.vf, t.nv));
        ASSERT_OK(attn_convert(ATTN_DTYPE_F32, t.kf, p->kvdt, t.kh, t.nk));
        ASSERT_OK(attn_convert(ATTN_DTYPE_F32, t.vf, p->kvdt, t.vh, t.nv));
        for (int64_t i = 0; i < t.nk; i++) t.k[i] = t.kf[i];
        for (int64_t i = 0; i < t.nv; i++) t.v[i] = t.vf[i];
        t.kp = t.kh, t.vp = t.vh;
    }
    t.slopes = malloc((size_t)p->H * 4);
    for (int64_t h = 0; h < p->H; h++) t.slopes[h] = ldexpf(1.0f, -(int)(h + 1));
    t.z = malloc((size_t)p->H * 8), t.zf = malloc((size_t)p->H * 4);
    for (int64_t h = 0; h < p->H; h++) t.zf[h] = (float)(3 * rand_unit_d(&seed) - 1), t.z[h] = t.zf[h];
    attn_generator gen;
    attn_generator_seed(&gen, dropout_seed);
    if (p->dropout > 0 && !p->philox) attn_rand_bernoulli(&gen, t.keep, t.nm, 1.0 - p->dropout); // the forward's draws
    if (p->dropout > 0 && p->philox) // the words attn.h names, element by element
        for (int64_t e = 0; e < t.nm; e++) {
            const int64_t j = e % p->S, i = e / p->S % p->L, bh = e / (p->S * p->L);
            t.keep[e] = (float)attn__philox_dropout_kept(dropout_seed, 5u, attn__philox_keep_threshold(p->dropout), bh,
                                                         i, j);
        }
    attn_sdpa_desc *d = &t.d;
    attn_sdpa_desc_init(d);
    d->batch = p->B, d->n_heads = p->H, d->n_kv_heads = p->Hkv, d->len_q = p->L, d->len_kv = p->S;
    d->head_dim = p->D, d->head_dim_v = p->Dv, d->scale = p->scale, d->causal = p->causal, d->dropout_p = p->dropout;
    attn_layout_strides(ATTN_LAYOUT_BHLD, p->B, p->H, p->L, p->D, d->q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, p->B, p->Hkv, p->S, p->D, d->k_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, p->B, p->Hkv, p->S, p->Dv, d->v_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, p->B, p->H, p->L, p->Dv, d->o_stride);
    d->kv_dtype = p->kvdt, d->softcap = p->softcap;
    if (p->philox) d->dropout_rng = ATTN_DROPOUT_RNG_PHILOX, d->dropout_seed = dropout_seed, d->dropout_offset = 5u;
    if (p->alibi) d->alibi_slopes = t.slopes;
    if (p->sinks) d->sinks = t.zf;
    if (p->window) d->use_window = 1, d->window_left = p->wl, d->window_right = p->wr;
    if (p->mask) {
        d->mask = p->mask == 1 ? (const void *)t.bmask : (const void *)t.fmaskf;
        d->mask_dtype = p->mask == 1 ? ATTN_DTYPE_BOOL : ATTN_DTYPE_F32;
        mask_strides(p, d->mask_stride);
    }
    if (p->kpm) {
        d->key_padding_mask = p->kpm == 1 ? (const void *)t.bkpm : (const void *)t.fkpm;
        d->key_padding_mask_dtype = p->kpm == 1 ? ATTN_DTYPE_BOOL : ATTN_DTYPE_F32;
        d->key_padding_mask_stride[0] = p->S, d->key_padding_mask_stride[1] = 1;
    }
    return t;
}

static void release(tensors *t) {
    free(t->q), free(t->k), free(t->v), free(t->qf), free(t->kf), free(t->vf), free(t->g), free(t->fmask);
    free(t->fmaskf), free(t->bmask), free(t->bkpm), free(t->fkpm), free(t->keep), free(t->kh), free(t->vh);
    free(t->slopes), free(t->z), free(t->zf);
}

// loss = sum G * out in double, for the double copies of q, k, v, the float mask and the sinks.
static double loss(const prob *p, const tensors *t) {
    // the scale as the float the library uses
    const double scale = p->scale != 0 ? (double)p->scale : (double)(float)(1.0 / sqrt((double)p->D));
    const double c = p->dropout > 0 ? (double)(1.0f / (float)(1.0 - p->dropout)) : 1.0;
    int64_t ms[4];
    mask_strides(p, ms);
    double total = 0, s[256];
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < p->H; h++)
            for (int64_t i = 0; i < p->L; i++) {
                const int64_t hk = h / (p->H / p->Hkv);
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < p->S; j++) {
                    const int64_t off = p->causal == ATTN_CAUSAL_BOTTOM_RIGHT ? p->S - p->L : 0;
                    bool hidden = p->causal != ATTN_CAUSAL_NONE && j > i + off;
                    if (p->window && p->wl >= 0) hidden = hidden || j < i + off - p->wl;
                    if (p->window && p->wr >= 0) hidden = hidden || j > i + off + p->wr;
                    double bias = 0;
                    const int64_t mo = b * ms[0] + h * ms[1] + i * ms[2] + j;
                    if (p->mask == 1) hidden = hidden || t->bmask[mo];
                    if (p->mask >= 2) bias += t->fmask[mo];
                    if (p->kpm == 1) hidden = hidden || t->bkpm[b * p->S + j];
                    if (p->kpm == 2) bias += t->fkpm[b * p->S + j];
                    if (hidden || bias == -INFINITY) {
                        s[j] = -INFINITY;
                        continue;
                    }
                    double dot = 0;
                    for (int64_t e = 0; e < p->D; e++)
                        dot += t->q[((b * p->H + h) * p->L + i) * p->D + e] * t->k[((b * p->Hkv + hk) * p->S + j) * p->D + e];
                    s[j] = scale * dot;
                    if (p->softcap > 0) s[j] = p->softcap * tanh(s[j] / p->softcap);
                    if (p->alibi) s[j] -= (double)t->slopes[h] * (double)llabs(i + off - j);
                    s[j] += bias;
                    if (s[j] > mx) mx = s[j];
                }
                const double z = p->sinks ? t->z[h] : -INFINITY; // the sink: one more term of the sum
                if (z > mx) mx = z;
                if (mx == -INFINITY) continue; // fully masked: zero output
                sum = exp(z - mx);
                for (int64_t j = 0; j < p->S; j++) sum += s[j] == -INFINITY ? 0 : exp(s[j] - mx);
                for (int64_t j = 0; j < p->S; j++) {
                    if (s[j] == -INFINITY) continue;
                    double w = exp(s[j] - mx) / sum;
                    if (p->dropout > 0) w *= t->keep[((b * p->H + h) * p->L + i) * p->S + j] * c;
                    for (int64_t e = 0; e < p->Dv; e++)
                        total += w * t->v[((b * p->Hkv + hk) * p->S + j) * p->Dv + e] *
                                 t->g[((b * p->H + h) * p->L + i) * p->Dv + e];
                }
            }
    return total;
}

// Central differences of `loss` for every element of x (n of them), step h.
static void finite_diff(const prob *p, tensors *t, double *x, int64_t n, double *grad) {
    const double h = 1e-4;
    for (int64_t i = 0; i < n; i++) {
        const double keep = x[i];
        if (isinf(keep)) {
            grad[i] = 0;
            continue;
        }
        x[i] = keep + h;
        const double up = loss(p, t);
        x[i] = keep - h;
        const double down = loss(p, t);
        x[i] = keep;
        grad[i] = (up - down) / (2 * h);
    }
}

static void compare(const char *what, const char *isa, const float *got, const double *want, int64_t n) {
    double worst = 0, scale = 1e-3;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    int64_t bad = -1;
    for (int64_t i = 0; i < n; i++) {
        const double err = fabs((double)got[i] - want[i]);
        if (!(err <= worst)) worst = err, bad = i;
    }
    harness_checks++;
    if (!(worst <= 2e-4 * scale + 1e-5))
        FAIL("%s on %s: |got - finite difference| = %.3g at [%lld] (got %.7g, want %.7g; largest gradient %.3g)", what,
             isa, worst, (long long)bad, (double)got[bad], want[bad], scale);
}

// The forward's output and lse on ctx (dropout drawn from dropout_seed), then the backward (and the
// sinks' gradient into dz when the problem has sinks).
static void run_both(attn_ctx *ctx, const prob *p, const tensors *t, float *dq, float *dk, float *dv, float *dmask,
                     float *dz) {
    float *out = malloc((size_t)t->no * 4), *lse = malloc((size_t)(p->B * p->H * p->L) * 4);
    attn_generator *g = attn_ctx_generator(ctx);
    attn_generator_seed(g, dropout_seed);
    attn_generator start = *g;
    ASSERT_OK(attn_sdpa_fwd(ctx, &t->d, t->qf, t->kp, t->vp, out, lse, NULL));
    // Philox dropout needs no generator state (and its forward leaves the context's generator alone)
    if (p->philox && memcmp(g, &start, sizeof start) != 0) FAIL("Philox dropout moved the context's generator");
    attn_status st = attn_sdpa_bwd(ctx, &t->d, t->qf, t->kp, t->vp, out, t->g, lse,
                                   p->dropout > 0 && !p->philox ? &start : NULL, dq, dk, dv, dmask);
    if (st != ATTN_OK) FAIL("sdpa_bwd: %s", attn_ctx_last_error(ctx));
    if (p->sinks) ASSERT_OK(attn_sdpa_sinks_bwd(ctx, &t->d, NULL, NULL, out, t->g, lse, dz));
    free(out), free(lse);
}

static void check_against_fd(const prob *p, uint32_t seed) {
    tensors t = make(p, seed);
    double *gq = malloc((size_t)t.nq * 8), *gk = malloc((size_t)t.nk * 8), *gv = malloc((size_t)t.nv * 8);
    double *gm = malloc((size_t)t.nmask * 8), *gz = malloc((size_t)p->H * 8);
    finite_diff(p, &t, t.q, t.nq, gq);
    finite_diff(p, &t, t.k, t.nk, gk);
    finite_diff(p, &t, t.v, t.nv, gv);
    const bool want_dmask = p->mask >= 2;
    if (want_dmask) finite_diff(p, &t, t.fmask, t.nmask, gm);
    if (p->sinks) finite_diff(p, &t, t.z, p->H, gz);
    float *dq = malloc((size_t)t.nq * 4), *dk = malloc((size_t)t.nk * 4), *dv = malloc((size_t)t.nv * 4);
    float *dmask = malloc((size_t)t.nmask * 4), *dz = malloc((size_t)p->H * 4);
    const attn_isa isas[4] = {ATTN_ISA_REF, ATTN_ISA_GENERIC, ATTN_ISA_AVX2, ATTN_ISA_AVX512};
    for (int i = 0; i < 4; i++) {
        if (!attn_isa_supported(isas[i])) continue;
        attn_ctx *ctx = test_ctx(isas[i], 2);
        run_both(ctx, p, &t, dq, dk, dv, want_dmask ? dmask : NULL, dz);
        const char *name = attn_isa_name(isas[i]);
        compare("dq", name, dq, gq, t.nq);
        compare("dk", name, dk, gk, t.nk);
        compare("dv", name, dv, gv, t.nv);
        if (want_dmask) compare("dmask", name, dmask, gm, t.nmask);
        if (p->sinks) compare("dsinks", name, dz, gz, p->H);
        attn_ctx_free(ctx);
    }
    free(gq), free(gk), free(gv), free(gm), free(gz), free(dq), free(dk), free(dv), free(dmask), free(dz);
    release(&t);
}

static void test_finite_differences_every_option(void) {
    const prob cases[] = {
        {1, 1, 1, 3, 4, 2, 2, ATTN_CAUSAL_NONE, 0, 0, 0.0f, 0.0, NO_EXT},
        {2, 2, 1, 4, 5, 3, 2, ATTN_CAUSAL_NONE, 0, 0, 0.7f, 0.0, NO_EXT},              // GQA, Dv != D, scale
        {1, 2, 2, 5, 5, 4, 4, ATTN_CAUSAL_TOP_LEFT, 0, 0, 0.0f, 0.0, NO_EXT},
        {1, 2, 2, 3, 6, 3, 3, ATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 0.0f, 0.0, NO_EXT},      // L < S
        {1, 2, 2, 6, 3, 3, 3, ATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 0.0f, 0.0, NO_EXT},      // L > S: rows that see nothing
        {2, 2, 2, 4, 5, 3, 3, ATTN_CAUSAL_NONE, 1, 1, 0.0f, 0.0, NO_EXT},              // bool mask, bool padding
        {2, 2, 2, 4, 5, 3, 3, ATTN_CAUSAL_NONE, 2, 2, 0.0f, 0.0, NO_EXT},              // float per-head mask + float kpm
        {2, 3, 3, 4, 5, 3, 3, ATTN_CAUSAL_TOP_LEFT, 3, 0, 0.0f, 0.0, NO_EXT},          // float (L, S) broadcast: summed
        {2, 3, 1, 4, 5, 3, 3, ATTN_CAUSAL_NONE, 4, 1, 0.0f, 0.0, NO_EXT},              // float (H, L, S) over B, MQA
        {2, 2, 2, 4, 6, 3, 3, ATTN_CAUSAL_NONE, 0, 0, 0.0f, 0.5, NO_EXT},              // dropout
        {1, 2, 1, 5, 5, 4, 2, ATTN_CAUSAL_TOP_LEFT, 2, 1, 0.5f, 0.3, NO_EXT},  // everything at once
        {1, 2, 2, 6, 7, 3, 3, ATTN_CAUSAL_NONE, 0, 0, 0.0f, 0.0, 1, 2, 1, 0, 0.0f, 0, 0, 0},       // local window
        {1, 2, 2, 5, 7, 3, 3, ATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 0.0f, 0.0, 1, 1, -1, 0, 0.0f, 0, 0, 0}, // window + causal
        {1, 2, 1, 5, 6, 3, 3, ATTN_CAUSAL_NONE, 0, 0, 0.0f, 0.0, 0, 0, 0, 1, 0.0f, 0, 0, 0},       // ALiBi, GQA
        {1, 2, 2, 4, 5, 3, 3, ATTN_CAUSAL_NONE, 0, 0, 3.0f, 0.0, 0, 0, 0, 0, 1.0f, 0, 0, 0},       // soft-capping
        {1, 2, 2, 4, 5, 3, 3, ATTN_CAUSAL_NONE, 2, 0, 0.0f, 0.0, 0, 0, 0, 1, 2.0f, 0, 0, 0},       // cap + ALiBi + mask
        {1, 2, 2, 4, 5, 3, 3, ATTN_CAUSAL_TOP_LEFT, 0, 0, 0.0f, 0.0, 0, 0, 0, 0, 0.0f, ATTN_DTYPE_F16, 0, 0},
        {1, 2, 1, 4, 5, 3, 2, ATTN_CAUSAL_NONE, 0, 1, 0.0f, 0.0, 1, 1, 1, 1, 1.5f, ATTN_DTYPE_BF16, 0, 0}, // all new ones
        {2, 2, 2, 4, 6, 3, 3, ATTN_CAUSAL_NONE, 0, 0, 0.0f, 0.5, 0, 0, 0, 0, 0.0f, 0, 1, 0},          // Philox dropout
        {1, 2, 1, 5, 7, 4, 2, ATTN_CAUSAL_TOP_LEFT, 2, 1, 0.5f, 0.3, 1, 3, 1, 1, 1.0f, 0, 1, 0},    // ... with the rest
        {2, 2, 1, 4, 5, 3, 2, ATTN_CAUSAL_NONE, 0, 0, 0.0f, 0.0, 0, 0, 0, 0, 0.0f, 0, 0, 1},       // sinks, GQA
        {1, 2, 2, 6, 3, 3, 3, ATTN_CAUSAL_BOTTOM_RIGHT, 2, 0, 0.0f, 0.0, 0, 0, 0, 0, 0.0f, 0, 0, 1}, // + rows seeing nothing
        {1, 2, 1, 5, 7, 4, 2, ATTN_CAUSAL_TOP_LEFT, 2, 1, 0.5f, 0.3, 1, 3, 1, 1, 1.0f, 0, 1, 1},    // + everything
        {2, 2, 2, 4, 6, 3, 3, ATTN_CAUSAL_NONE, 1, 0, 0.0f, 0.5, 0, 0, 0, 0, 0.0f, ATTN_DTYPE_BF16, 0, 1}, // torch dropout
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) check_against_fd(&cases[c], 11u * (uint32_t)c + 3u);
}

// The fused backward against the reference on larger shapes (many tiles), and identical bits for
// every thread count.
static void test_fused_against_reference(void) {
    const prob cases[] = {
        {1, 2, 2, 130, 70, 64, 64, ATTN_CAUSAL_NONE, 0, 0, 0.0f, 0.0, NO_EXT},
        {2, 4, 2, 65, 129, 33, 17, ATTN_CAUSAL_TOP_LEFT, 0, 0, 0.0f, 0.0, NO_EXT},
        {1, 3, 3, 100, 100, 16, 16, ATTN_CAUSAL_BOTTOM_RIGHT, 2, 1, 0.0f, 0.0, NO_EXT},
        {2, 2, 1, 70, 90, 8, 8, ATTN_CAUSAL_NONE, 3, 2, 0.0f, 0.2, NO_EXT},
        {1, 2, 2, 200, 64, 7, 65, ATTN_CAUSAL_TOP_LEFT, 4, 0, 0.0f, 0.0, NO_EXT},
        {2, 4, 2, 90, 75, 16, 16, ATTN_CAUSAL_NONE, 1, 2, 0.0f, 0.3, NO_EXT}, // one pass with dropout and masks
        {3, 2, 2, 64, 200, 32, 48, ATTN_CAUSAL_BOTTOM_RIGHT, 0, 1, 0.7f, 0.0, NO_EXT},
        {2, 4, 2, 100, 300, 32, 32, ATTN_CAUSAL_NONE, 0, 0, 0.0f, 0.0, 1, 70, 10, 1, 0.0f, 0, 0, 0},  // window: tiles skipped
        {1, 2, 2, 130, 130, 24, 24, ATTN_CAUSAL_TOP_LEFT, 2, 0, 0.0f, 0.0, 1, 40, -1, 0, 2.0f, 0, 0, 0}, // cap, dmask
        {2, 2, 1, 70, 150, 64, 64, ATTN_CAUSAL_BOTTOM_RIGHT, 0, 1, 0.0f, 0.1, 0, 0, 0, 1, 0.0f, ATTN_DTYPE_F16, 0, 0},
        {3, 4, 2, 65, 129, 40, 24, ATTN_CAUSAL_NONE, 1, 0, 0.0f, 0.0, 1, 3, 3, 0, 4.0f, ATTN_DTYPE_BF16, 0, 0}, // one pass
        {2, 4, 2, 90, 75, 16, 16, ATTN_CAUSAL_NONE, 1, 2, 0.0f, 0.3, 0, 0, 0, 0, 0.0f, 0, 1, 0},      // Philox, one pass
        {1, 2, 2, 130, 131, 24, 40, ATTN_CAUSAL_TOP_LEFT, 2, 0, 0.0f, 0.2, 0, 0, 0, 1, 0.0f, ATTN_DTYPE_F16, 1, 0}, // dmask
        {2, 4, 2, 150, 70, 32, 16, ATTN_CAUSAL_BOTTOM_RIGHT, 2, 1, 0.0f, 0.0, 0, 0, 0, 0, 0.0f, 0, 0, 1}, // sinks
        {1, 4, 1, 90, 200, 16, 24, ATTN_CAUSAL_NONE, 0, 0, 0.0f, 0.3, 1, 30, 5, 1, 2.0f, ATTN_DTYPE_BF16, 1, 1},
    };
    // Without a mask gradient, 1 thread takes the one-pass schedule and 3 threads the two passes
    // whenever B * Hkv < 6: the bit comparison below covers both schedules.
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const prob *p = &cases[c];
        tensors t = make(p, 100u + (uint32_t)c);
        const bool want_dmask = p->mask >= 2;
        float *r[5], *f[5], *f3[5];
        const int64_t n[5] = {t.nq, t.nk, t.nv, t.nmask, p->H};
        for (int i = 0; i < 5; i++)
            r[i] = malloc((size_t)n[i] * 4), f[i] = malloc((size_t)n[i] * 4), f3[i] = malloc((size_t)n[i] * 4);
        attn_ctx *ref = test_ctx(ATTN_ISA_REF, 1);
        run_both(ref, p, &t, r[0], r[1], r[2], want_dmask ? r[3] : NULL, r[4]);
        attn_ctx_free(ref);
        const attn_isa isas[3] = {ATTN_ISA_GENERIC, ATTN_ISA_AVX2, ATTN_ISA_AVX512};
        for (int i = 0; i < 3; i++) {
            if (!attn_isa_supported(isas[i])) continue;
            attn_ctx *c1 = test_ctx(isas[i], 1), *c3 = test_ctx(isas[i], 3);
            run_both(c1, p, &t, f[0], f[1], f[2], want_dmask ? f[3] : NULL, f[4]);
            for (int g = 0; g < 5; g++)
                if (g < 3 || (g == 3 && want_dmask) || (g == 4 && p->sinks))
                    harness_assert_close(__FILE__, __LINE__, attn_isa_name(isas[i]), f[g], r[g], n[g], 1e-5, 1e-4);
            run_both(c3, p, &t, f3[0], f3[1], f3[2], want_dmask ? f3[3] : NULL, f3[4]);
            for (int g = 0; g < (want_dmask ? 4 : 3); g++)
                if (memcmp(f[g], f3[g], (size_t)n[g] * 4) != 0)
                    FAIL("%s: gradient %d differs between 1 and 3 threads", attn_isa_name(isas[i]), g);
            attn_ctx_free(c1), attn_ctx_free(c3);
        }
        for (int i = 0; i < 5; i++) free(r[i]), free(f[i]), free(f3[i]);
        release(&t);
    }
}

// Fully masked rows give zero gradients; NaN behind a mask reaches no gradient.
static void test_masked_rows_and_nan(void) {
    prob p = {1, 2, 2, 70, 70, 16, 16, ATTN_CAUSAL_BOTTOM_RIGHT, 1, 0, 0.0f, 0.0, NO_EXT};
    tensors t = make(&p, 5);
    for (int64_t j = 0; j < p.S; j++) t.bmask[3 * p.S + j] = 1; // row 3 of every head sees nothing
    for (int64_t e = 0; e < p.D; e++) t.kf[(p.S - 1) * p.D + e] = NAN; // last key: seen by the last row only
    for (int64_t e = 0; e < p.Dv; e++) t.vf[(p.S - 1) * p.Dv + e] = INFINITY;
    const attn_isa isas[4] = {ATTN_ISA_REF, ATTN_ISA_GENERIC, ATTN_ISA_AVX2, ATTN_ISA_AVX512};
    float *dq = malloc((size_t)t.nq * 4), *dk = malloc((size_t)t.nk * 4), *dv = malloc((size_t)t.nv * 4);
    for (int i = 0; i < 4; i++) {
        if (!attn_isa_supported(isas[i])) continue;
        attn_ctx *ctx = test_ctx(isas[i], 2);
        if (t.bmask[(p.L - 1) * p.S + p.S - 1]) t.bmask[(p.L - 1) * p.S + p.S - 1] = 0; // the last row sees it
        run_both(ctx, &p, &t, dq, dk, dv, NULL, NULL);
        for (int64_t e = 0; e < p.D; e++) {
            ASSERT_TRUE(dq[(0 * p.L + 3) * p.D + e] == 0.0f); // the fully masked row
            ASSERT_TRUE(isfinite(dq[(0 * p.L + 10) * p.D + e]));
            ASSERT_TRUE(!isfinite(dq[(0 * p.L + p.L - 1) * p.D + e])); // the only row that sees the NaN
        }
        attn_ctx_free(ctx);
    }
    free(dq), free(dk), free(dv);
    release(&t);
}

// Each fused gradient against the reference's, non-finite values included: non-finite in the same
// places, finite values close; and the same bits for 1 and 3 threads.
static void check_like_reference(const prob *p, const tensors *t, bool want_dmask, int64_t nmask_out) {
    const int64_t n[4] = {t->nq, t->nk, t->nv, nmask_out};
    const char *names[4] = {"dq", "dk", "dv", "dmask"};
    float *r[4], *f[4], *f3[4];
    for (int g = 0; g < 4; g++)
        r[g] = calloc((size_t)n[g], 4), f[g] = calloc((size_t)n[g], 4), f3[g] = calloc((size_t)n[g], 4);
    attn_ctx *ref = test_ctx(ATTN_ISA_REF, 1);
    run_both(ref, p, t, r[0], r[1], r[2], want_dmask ? r[3] : NULL, NULL);
    attn_ctx_free(ref);
    const attn_isa isas[3] = {ATTN_ISA_GENERIC, ATTN_ISA_AVX2, ATTN_ISA_AVX512};
    for (int i = 0; i < 3; i++) {
        if (!attn_isa_supported(isas[i])) continue;
        attn_ctx *c1 = test_ctx(isas[i], 1), *c3 = test_ctx(isas[i], 3);
        run_both(c1, p, t, f[0], f[1], f[2], want_dmask ? f[3] : NULL, NULL);
        run_both(c3, p, t, f3[0], f3[1], f3[2], want_dmask ? f3[3] : NULL, NULL);
        for (int g = 0; g < (want_dmask ? 4 : 3); g++) {
            for (int64_t e = 0; e < n[g]; e++) {
                harness_checks++;
                const float a = f[g][e], b = r[g][e];
                if (isfinite(a) != isfinite(b)) // which non-finite value (inf - inf or not) may differ
                    FAIL("%s: %s[%lld] is %g, the reference's %g", attn_isa_name(isas[i]), names[g], (long long)e,
                         (double)a, (double)b);
                if (isfinite(b) && !(fabsf(a - b) <= 1e-4f + 1e-4f * fabsf(b)))
                    FAIL("%s: %s[%lld] = %.8g, reference %.8g", attn_isa_name(isas[i]), names[g], (long long)e,
                         (double)a, (double)b);
            }
            if (memcmp(f[g], f3[g], (size_t)n[g] * 4) != 0)
                FAIL("%s: %s differs between 1 and 3 threads", attn_isa_name(isas[i]), names[g]);
        }
        attn_ctx_free(c1), attn_ctx_free(c3);
    }
    for (int g = 0; g < 4; g++) free(r[g]), free(f[g]), free(f3[g]);
}

// NaN or inf in a row's dout, or a dout . v that overflows float, reaches only the gradients of
// pairs the row sees: never keys it cannot see (weight 0), and a row that sees nothing gets dq = 0,
// as the reference, which never reads a pair without weight. A NaN in q makes the row's weights NaN
// everywhere (softmax of a row holding NaN), hidden keys included, in both.
static void test_nonfinite_rows_reach_no_hidden_pair(void) {
    for (int variant = 0; variant < 3; variant++) {
        // top-left causal: row i sees keys 0..i; bottom-right with L > S: the first rows see nothing
        prob p = {2, 2, 2, 100, variant == 2 ? 60 : 100, 16, 16,
                  variant == 2 ? ATTN_CAUSAL_BOTTOM_RIGHT : ATTN_CAUSAL_TOP_LEFT, variant == 1 ? 1 : 0, 0, 0.0f, 0.0,
                  NO_EXT};
        tensors t = make(&p, 900u + (uint32_t)variant);
        if (variant == 1) // row 3 of every head sees nothing
            for (int64_t j = 0; j < p.S; j++) t.bmask[3 * p.S + j] = 1;
        t.g[5 * p.Dv + 1] = NAN;                                  // (b0, h0) row 5: keys 6.. are hidden from it
        t.g[((1 * p.H + 1) * p.L + 70) * p.Dv] = INFINITY;        // (b1, h1) row 70
        t.qf[(1 * p.L + 20) * p.D + 2] = NAN; // (b0, h1) row 20: NaN scores, NaN weights everywhere (as torch)
        if (variant == 1) t.g[3 * p.Dv] = NAN;                    // the fully masked row of (b0, h0)
        if (variant == 2) { // finite inputs: a hidden pair's dout . v overflows (row 0 sees nothing)
            for (int64_t e = 0; e < p.Dv; e++) t.vf[e] = 3e37f, t.g[e] = 100.0f;
            for (int64_t e = 40 * p.Dv; e < p.L * p.Dv; e++) t.g[e] = 0.0f; // rows that see key 0: dS = 0 exactly
        }
        check_like_reference(&p, &t, false, 1);
        release(&t);
    }
}

// A float mask whose strides make cells share elements without broadcasting ({0, 1, 1, 1}: cell
// (b, h, i, j) is element h + i + j): the mask gradient sums every cell into its element, the same
// for every thread count.
static void test_dmask_overlapping_strides(void) {
    prob p = {2, 3, 3, 70, 80, 16, 16, ATTN_CAUSAL_NONE, 2, 0, 0.0f, 0.0, NO_EXT};
    tensors t = make(&p, 950u);
    const int64_t st[4] = {0, 1, 1, 1};
    memcpy(t.d.mask_stride, st, sizeof st);
    for (int64_t e = 0; e < t.nmask; e++) t.fmaskf[e] = isfinite(t.fmaskf[e]) ? t.fmaskf[e] : -2.0f;
    check_like_reference(&p, &t, true, (p.H - 1) + (p.L - 1) + (p.S - 1) + 1);
    release(&t);
}

static void test_errors(void) {
    prob p = {1, 2, 2, 4, 5, 3, 3, ATTN_CAUSAL_NONE, 1, 0, 0.0f, 0.0, NO_EXT};
    tensors t = make(&p, 1);
    attn_ctx *ctx = test_ctx(ATTN_ISA_AUTO, 1);
    float out[2 * 4 * 3], lse[8], dq[24], dk[30], dv[30], dm[20];
    ASSERT_OK(attn_sdpa_fwd(ctx, &t.d, t.qf, t.kf, t.vf, out, lse, NULL));
    ASSERT_OK(attn_sdpa_bwd(ctx, &t.d, t.qf, t.kf, t.vf, out, t.g, lse, NULL, dq, dk, dv, NULL));
    ASSERT_STATUS(attn_sdpa_bwd(ctx, &t.d, t.qf, t.kf, t.vf, out, t.g, lse, NULL, dq, dk, dv, dm), ATTN_ERR_BAD_MASK);
    ASSERT_STATUS(attn_sdpa_bwd(ctx, &t.d, t.qf, t.kf, t.vf, out, NULL, lse, NULL, dq, dk, dv, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_sdpa_bwd(ctx, &t.d, t.qf, t.kf, t.vf, out, t.g, NULL, NULL, dq, dk, dv, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_sdpa_bwd(NULL, &t.d, t.qf, t.kf, t.vf, out, t.g, lse, NULL, dq, dk, dv, NULL), ATTN_ERR_INVALID_ARG);
    attn_sdpa_desc d = t.d;
    d.dropout_p = 0.1;
    ASSERT_STATUS(attn_sdpa_bwd(ctx, &d, t.qf, t.kf, t.vf, out, t.g, lse, NULL, dq, dk, dv, NULL), ATTN_ERR_INVALID_ARG);
    d = t.d;
    d.k_stride[2] = 0; // keys broadcast over the sequence: dk cannot be written
    ASSERT_STATUS(attn_sdpa_bwd(ctx, &d, t.qf, t.kf, t.vf, out, t.g, lse, NULL, dq, dk, dv, NULL), ATTN_ERR_INVALID_ARG);
    size_t bytes = 0;
    ASSERT_OK(attn_sdpa_bwd_workspace_size(ctx, &t.d, 0, &bytes));
    ASSERT_TRUE(bytes > 0);
    ASSERT_STATUS(attn_sdpa_bwd_workspace_size(ctx, &t.d, 1, &bytes), ATTN_ERR_BAD_MASK);
    // the sinks' gradient: a desc without sinks, NULL arguments, one packed offset array without
    // the other, a bad descriptor; dsinks untouched by each
    float dz[2] = {-7.0f, -7.0f};
    const int64_t cu[2] = {0, 4};
    ASSERT_STATUS(attn_sdpa_sinks_bwd(ctx, &t.d, NULL, NULL, out, t.g, lse, dz), ATTN_ERR_INVALID_ARG);
    d = t.d;
    d.sinks = t.zf;
    ASSERT_STATUS(attn_sdpa_sinks_bwd(ctx, &d, NULL, NULL, NULL, t.g, lse, dz), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_sdpa_sinks_bwd(ctx, &d, NULL, NULL, out, t.g, lse, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_sdpa_sinks_bwd(ctx, &d, cu, NULL, out, t.g, lse, dz), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_sdpa_sinks_bwd(NULL, &d, NULL, NULL, out, t.g, lse, dz), ATTN_ERR_INVALID_ARG);
    d.n_heads = 3; // not a multiple of n_kv_heads
    ASSERT_STATUS(attn_sdpa_sinks_bwd(ctx, &d, NULL, NULL, out, t.g, lse, dz), ATTN_ERR_BAD_SHAPE);
    ASSERT_TRUE(dz[0] == -7.0f && dz[1] == -7.0f);
    d = t.d;
    d.sinks = t.zf;
    ASSERT_OK(attn_sdpa_sinks_bwd(ctx, &d, NULL, NULL, out, t.g, lse, dz));
    attn_ctx_free(ctx);
    release(&t);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_finite_differences_every_option),
        HARNESS_CASE(test_fused_against_reference),
        HARNESS_CASE(test_masked_rows_and_nan),
        HARNESS_CASE(test_nonfinite_rows_reach_no_hidden_pair),
        HARNESS_CASE(test_dmask_overlapping_strides),
        HARNESS_CASE(test_errors),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

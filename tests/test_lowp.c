// test_lowp.c - float16 and bfloat16 q, k, v, out and gradients: the fused kernels of every
// instruction set this CPU runs against the scalar reference (double sums on the rounded inputs),
// through the public API, on random shapes and options (GQA, both causal alignments, windows,
// ALiBi, soft-capping, masks, key padding, Dk != Dv, odd sizes), the forward, the backward, packed
// batches and the KV cache; the error bounds of attn.h on adversarial inputs (large logits, long
// rows); identical bits for every thread count, and whatever the scratch held before a backward.
#include <float.h>
#include <stdbool.h>

#include "attn.h"
#include "harness.h"
#include "test_data.h"


// The unit roundoff of a type: 2^-8 (BF16), 2^-11 (F16), 2^-24 (F32).
static double unit(attn_dtype t) { return t == ATTN_DTYPE_BF16 ? 0x1p-8 : t == ATTN_DTYPE_F16 ? 0x1p-11 : 0x1p-24; }
// The smallest subnormal of a type (the spacing of values below its smallest normal).
static double tiny(attn_dtype t) { return t == ATTN_DTYPE_BF16 ? 0x1p-133 : t == ATTN_DTYPE_F16 ? 0x1p-24 : 0x1p-149; }

// A tensor of n elements of type t, filled from floats (rounded to t).
typedef struct tensor {
    attn_dtype t;
    int64_t n;
    void *p;
} tensor;

static tensor make_tensor(attn_dtype t, const float *x, int64_t n) {
    tensor a = {t, n, malloc((size_t)n * attn_dtype_size(t) + 4)};
    if (a.p == NULL) FAIL("out of memory");
    if (x != NULL && attn_convert(t, a.p, ATTN_DTYPE_F32, x, n) != ATTN_OK) FAIL("attn_convert to %s", attn_dtype_name(t));
    if (x == NULL) memset(a.p, 0xff, (size_t)n * attn_dtype_size(t) + 4); // NaN everywhere until written
    return a;
}

static float at(const tensor *a, int64_t i) {
    float f;
    if (attn_convert(ATTN_DTYPE_F32, &f, a->t, (const char *)a->p + (size_t)i * attn_dtype_size(a->t), 1) != ATTN_OK)
        FAIL("attn_convert from %s", attn_dtype_name(a->t));
    return f;
}

typedef struct problem {
    int64_t B, H, Hkv, L, S, D, Dv;
    attn_causal causal;
    int mask, kpm;          // 0 none, 1 bool, 2 float
    int window, alibi;
    int64_t wl, wr;
    float softcap, scale;
    float qmag;             // q elements drawn from [-qmag, qmag]
    attn_dtype qt, kvt, ot, gt;
    float kmag;             // k elements drawn from [-kmag, kmag] (0: 1)
    int positive;           // q and k from [mag/2, mag) instead
} problem;

typedef struct data {
    tensor q, k, v, dout;
    float *slopes, *fmask, *fkpm;
    uint8_t *bmask, *bkpm;
    attn_sdpa_desc d;
} data;

static data make_data(const problem *p, uint32_t seed) {
    data x;
    memset(&x, 0, sizeof x);
    const int64_t nq = p->B * p->H * p->L * p->D, nk = p->B * p->Hkv * p->S * p->D, nv = p->B * p->Hkv * p->S * p->Dv;
    const int64_t no = p->B * p->H * p->L * p->Dv, nm = p->B * p->H * p->L * p->S;
    float *f = malloc((size_t)(nq + nk + nv + no) * 4);
    const float kmag = p->kmag > 0.0f ? p->kmag : 1.0f;
    for (int64_t i = 0; i < nq + nk + nv + no; i++) {
        const float u = rand_unit(&seed), mag = i < nq ? p->qmag : i < nq + nk ? kmag : 1.0f;
        f[i] = mag * (p->positive && i < nq + nk ? 0.5f + 0.5f * u : 2.0f * u - 1.0f);
    }
    x.q = make_tensor(p->qt, f, nq), x.k = make_tensor(p->kvt, f + nq, nk), x.v = make_tensor(p->kvt, f + nq + nk, nv);
    x.dout = make_tensor(p->ot, f + nq + nk + nv, no);
    free(f);
    x.slopes = malloc((size_t)p->H * 4);
    for (int64_t h = 0; h < p->H; h++) x.slopes[h] = ldexpf(1.0f, -(int)(h + 1));
    x.fmask = malloc((size_t)nm * 4), x.bmask = malloc((size_t)nm);
    x.fkpm = malloc((size_t)(p->B * p->S) * 4), x.bkpm = malloc((size_t)(p->B * p->S));
    for (int64_t i = 0; i < nm; i++) {
        const float u = rand_unit(&seed);
        x.bmask[i] = u < 0.2f;
        x.fmask[i] = u < 0.1f ? -INFINITY : 2.0f * rand_unit(&seed) - 1.0f;
    }
    for (int64_t i = 0; i < p->B * p->S; i++) {
        x.bkpm[i] = rand_unit(&seed) < 0.15f;
        x.fkpm[i] = rand_unit(&seed) < 0.1f ? -INFINITY : rand_unit(&seed) - 0.5f;
    }
    attn_sdpa_desc *d = &x.d;
    attn_sdpa_desc_init(d);
    d->batch = p->B, d->n_heads = p->H, d->n_kv_heads = p->Hkv, d->len_q = p->L, d->len_kv = p->S;
    d->head_dim = p->D, d->head_dim_v = p->Dv, d->scale = p->scale, d->causal = p->causal;
    d->q_dtype = p->qt, d->kv_dtype = p->kvt, d->out_dtype = p->ot, d->grad_dtype = p->gt;
    attn_layout_strides(ATTN_LAYOUT_BHLD, p->B, p->H, p->L, p->D, d->q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, p->B, p->Hkv, p->S, p->D, d->k_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, p->B, p->Hkv, p->S, p->Dv, d->v_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, p->B, p->H, p->L, p->Dv, d->o_stride);
    if (p->window) d->use_window = 1, d->window_left = p->wl, d->window_right = p->wr;
    if (p->alibi) d->alibi_slopes = x.slopes;
    d->softcap = p->softcap;
    if (p->mask) {
        const int64_t per_head[4] = {p->H * p->L * p->S, p->L * p->S, p->S, 1};
        d->mask = p->mask == 1 ? (const void *)x.bmask : (const void *)x.fmask;
        d->mask_dtype = p->mask == 1 ? ATTN_DTYPE_BOOL : ATTN_DTYPE_F32;
        memcpy(d->mask_stride, per_head, sizeof per_head);
    }
    if (p->kpm) {
        d->key_padding_mask = p->kpm == 1 ? (const void *)x.bkpm : (const void *)x.fkpm;
        d->key_padding_mask_dtype = p->kpm == 1 ? ATTN_DTYPE_BOOL : ATTN_DTYPE_F32;
        d->key_padding_mask_stride[0] = p->S, d->key_padding_mask_stride[1] = 1;
    }
    return x;
}

static void free_data(data *x) {
    free(x->q.p), free(x->k.p), free(x->v.p), free(x->dout.p);
    free(x->slopes), free(x->fmask), free(x->bmask), free(x->fkpm), free(x->bkpm);
}

// The forward bound of attn.h for row r (b, h, i): 2 u_out |ref| + tiny_out + (exp(2 delta) - 1 + eps) max|v|,
// delta = (D + 2) 2^-24 scale sum_t |q_t| max|k| + 2^-22 (softcap + largest ALiBi term + largest
// |float mask|), eps = 2^-16 (float32 products). On the bf16 dot products (`dot`): eps = 2^-8 + 2^-16
// (weights rounded to bf16), delta + 2^-126 scale sum_t |q_t| + 2^-125 D max|k| and S 2^-125 more in
// the absolute term (denormals flushed by the instruction).
static double row_delta(const problem *p, const data *x, int64_t r, double kmax, bool dot) {
    const double scale = p->scale != 0.0f ? p->scale : 1.0 / sqrt((double)p->D);
    double qsum = 0;
    for (int64_t t = 0; t < p->D; t++) qsum += fabs(at(&x->q, r * p->D + t));
    double extra = p->softcap;
    if (p->alibi) extra += 0.5 * (double)(p->L > p->S ? p->L : p->S);
    if (p->mask == 2 || p->kpm == 2) extra += 2.0;
    const double flushed = dot ? 0x1p-126 * scale * qsum + 0x1p-125 * (double)p->D * kmax : 0;
    return (double)(p->D + 2) * 0x1p-24 * scale * qsum * kmax + 0x1p-22 * extra + flushed;
}

static double max_abs(const tensor *a) {
    double m = 0;
    for (int64_t i = 0; i < a->n; i++) m = fmax(m, fabs(at(a, i)));
    return m;
}

static long compared;
static double worst_fwd, worst_bwd; // largest error as a fraction of its bound

// Whether the forward of p runs on the bf16 dot products on isa (attn.h: bf16 q, k and v, an even
// head dim; the tests' key and value rows are contiguous).
static bool on_dot(attn_isa isa, const problem *p) {
    return attn_isa_bf16_dot(isa) && p->qt == ATTN_DTYPE_BF16 && p->kvt == ATTN_DTYPE_BF16 && p->D % 2 == 0;
}

static void check_forward(const problem *p, const data *x, const tensor *got, const tensor *ref, attn_isa isa) {
    const char *what = attn_isa_name(isa);
    const bool dot = on_dot(isa, p);
    const double kmax = max_abs(&x->k), vmax = max_abs(&x->v), u = unit(p->ot);
    const double eps = dot ? 0x1p-8 + 0x1p-16 : 0x1p-16, flushed = dot ? (double)p->S * 0x1p-125 : 0;
    const double keep = x->d.dropout_p > 0.0 ? 1.0 / (1.0 - x->d.dropout_p) : 1.0; // kept weights' scale
    for (int64_t r = 0; r < p->B * p->H * p->L; r++) {
        const double delta = row_delta(p, x, r, kmax, dot), abs_term = (exp(2 * delta) - 1 + eps) * keep * vmax + flushed;
        for (int64_t c = 0; c < p->Dv; c++) {
            const double g = at(got, r * p->Dv + c), w = at(ref, r * p->Dv + c);
            const double bound = 2 * u * fabs(w) + tiny(p->ot) + abs_term;
            harness_checks++;
            if (!(fabs(g - w) <= bound))
                FAIL("%s: out[%lld, %lld] = %.8g, reference %.8g: error %.3g above the bound %.3g (q %s kv %s out %s; "
                     "B%lld H%lld/%lld L%lld S%lld D%lld Dv%lld causal %d mask %d kpm %d window %d alibi %d cap %g)",
                     what, (long long)r, (long long)c, g, w, fabs(g - w), bound, attn_dtype_name(p->qt),
                     attn_dtype_name(p->kvt), attn_dtype_name(p->ot), (long long)p->B, (long long)p->H,
                     (long long)p->Hkv, (long long)p->L, (long long)p->S, (long long)p->D, (long long)p->Dv, p->causal,
                     p->mask, p->kpm, p->window, p->alibi, (double)p->softcap);
            worst_fwd = fmax(worst_fwd, fabs(g - w) / bound);
        }
    }
}

static void run_fwd(attn_ctx *ctx, const data *x, tensor *out, float *lse) {
    if (attn_sdpa_fwd(ctx, &x->d, x->q.p, x->k.p, x->v.p, out->p, lse, NULL) != ATTN_OK)
        FAIL("sdpa_fwd on %s: %s", attn_isa_name(attn_ctx_isa(ctx)), attn_ctx_last_error(ctx));
}

// The context's scratch moved to a caller workspace of `need` bytes filled with 0xff (NaN in every
// float type), so a result that reads scratch before writing it shows; poisoned_scratch_end gives
// the context its own scratch back and frees the buffer.
static char *poisoned_scratch(attn_ctx *ctx, size_t need) {
    char *ws = malloc(need + 1);
    if (ws == NULL) FAIL("out of memory");
    memset(ws, 0xff, need + 1);
    ASSERT_EQ_INT(attn_ctx_set_workspace(ctx, ws, need + 1), ATTN_OK);
    return ws;
}

static void poisoned_scratch_end(attn_ctx *ctx, char *ws) {
    ASSERT_EQ_INT(attn_ctx_set_workspace(ctx, NULL, 0), ATTN_OK);
    free(ws);
}

// run_fwd on poisoned scratch: the results must not depend on what the scratch held.
static void run_fwd_on_poisoned_scratch(attn_ctx *ctx, const data *x, tensor *out, float *lse) {
    size_t need = 0;
    ASSERT_EQ_INT(attn_sdpa_fwd_workspace_size(ctx, &x->d, &need), ATTN_OK);
    char *ws = poisoned_scratch(ctx, need);
    run_fwd(ctx, x, out, lse);
    poisoned_scratch_end(ctx, ws);
}

// The forward of x (made from p) on every instruction set against the reference.
static void forward_data(const problem *p, data *xp) {
    data x = *xp;
    const int64_t no = p->B * p->H * p->L * p->Dv, nl = p->B * p->H * p->L;
    tensor ref = make_tensor(p->ot, NULL, no), o1 = make_tensor(p->ot, NULL, no), o2 = make_tensor(p->ot, NULL, no);
    float *lr = malloc((size_t)nl * 4), *l1 = malloc((size_t)nl * 4), *l2 = malloc((size_t)nl * 4);
    attn_ctx *rc = test_ctx(ATTN_ISA_REF, 1);
    run_fwd(rc, &x, &ref, lr);
    attn_ctx_free(rc);
    attn_isa isas[16];
    const int n = fused_isas(isas);
    for (int ii = 0; ii < n; ii++) {
        attn_ctx *c1 = test_ctx(isas[ii], 1), *c3 = test_ctx(isas[ii], 3);
        run_fwd(c1, &x, &o1, l1);
        run_fwd_on_poisoned_scratch(c3, &x, &o2, l2);
        attn_ctx_free(c1), attn_ctx_free(c3);
        check_forward(p, &x, &o1, &ref, isas[ii]);
        for (int64_t i = 0; i < nl; i++) // lse stays float32: the float32 kernels' accuracy
            if (!(lr[i] == l1[i] || fabs(lr[i] - l1[i]) <= 1e-4 * (1 + fabs(lr[i]))))
                FAIL("%s: lse[%lld] %.8g, reference %.8g", attn_isa_name(isas[ii]), (long long)i, l1[i], lr[i]);
        if (memcmp(o1.p, o2.p, (size_t)no * attn_dtype_size(p->ot)) != 0 || memcmp(l1, l2, (size_t)nl * 4) != 0)
            FAIL("%s: 3 threads (scratch filled with NaN first) give other bits than 1 (L%lld S%lld)",
                 attn_isa_name(isas[ii]), (long long)p->L, (long long)p->S);
        compared++;
    }
    free(ref.p), free(o1.p), free(o2.p), free(lr), free(l1), free(l2);
}

static void forward_problem(const problem *p, uint32_t seed) {
    data x = make_data(p, seed);
    forward_data(p, &x);
    free_data(&x);
}

static const attn_dtype half_types[2] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16};
static const attn_dtype all_types[3] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16, ATTN_DTYPE_F32};

static problem random_problem(uint32_t *s, bool backward) {
    problem p;
    memset(&p, 0, sizeof p);
    p.Hkv = 1 + rand_pick(s, 3);
    p.H = p.Hkv * (1 + rand_pick(s, 3));
    p.B = 1 + rand_pick(s, 2);
    static const int64_t lens[8] = {1, 3, 16, 33, 64, 100, 129, 200};
    static const int64_t dims[7] = {1, 8, 16, 31, 64, 65, 80};
    p.L = lens[rand_pick(s, backward ? 7 : 8)], p.S = lens[rand_pick(s, 8)];
    p.D = dims[rand_pick(s, 7)], p.Dv = rand_pick(s, 3) == 0 ? dims[rand_pick(s, 7)] : p.D;
    p.causal = (attn_causal)rand_pick(s, 3);
    p.mask = rand_pick(s, 4) == 0 ? 1 + rand_pick(s, 2) : 0;
    p.kpm = rand_pick(s, 4) == 0 ? 1 + rand_pick(s, 2) : 0;
    p.window = rand_pick(s, 4) == 0;
    p.wl = rand_pick(s, 40) - 1, p.wr = rand_pick(s, 10) - 1;
    p.alibi = rand_pick(s, 5) == 0;
    p.softcap = rand_pick(s, 5) == 0 ? 20.0f : 0.0f;
    p.scale = rand_pick(s, 3) == 0 ? 0.3f : 0.0f;
    p.qmag = 2.0f;
    // mostly one half type for everything (as models run), sometimes mixed
    const attn_dtype t = half_types[rand_pick(s, 2)];
    p.qt = p.kvt = p.ot = p.gt = t;
    if (rand_pick(s, 3) == 0) p.qt = all_types[rand_pick(s, 3)], p.kvt = all_types[rand_pick(s, 3)];
    if (rand_pick(s, 3) == 0) p.ot = all_types[rand_pick(s, 3)], p.gt = all_types[rand_pick(s, 3)];
    return p;
}

static void test_forward_random(void) {
    uint32_t s = 12345;
    for (int c = 0; c < 80; c++) {
        problem p = random_problem(&s, false);
        forward_problem(&p, 1000u + (uint32_t)c);
    }
    fprintf(stderr, "    %ld comparisons; largest error %.2f of the bound\n", compared, worst_fwd);
}

// Decoding shapes (few queries per kv head: the decode path) with half q and out, strided.
static void test_decode_shapes(void) {
    for (int c = 0; c < 12; c++) {
        problem p = {1 + c % 2, 8, c % 3 == 0 ? 8 : 2, 1 + (c % 4 == 3 ? 4 : 0), 1 + 97 * c, 64, c % 5 == 4 ? 48 : 64,
                     c % 2 ? ATTN_CAUSAL_BOTTOM_RIGHT : ATTN_CAUSAL_NONE, c % 6 == 5 ? 2 : 0, c % 4 == 1, c % 7 == 3,
                     0, 100, 0, 0.0f, 0.0f, 2.0f, half_types[c % 2], half_types[(c / 2) % 2], half_types[c % 2],
                     ATTN_DTYPE_F32, 0.0f, 0};
        forward_problem(&p, 77u + (uint32_t)c);
    }
}

// Large logits (scale 1, |q| up to 8: one key takes nearly all the weight, exp2 arguments near
// -126) and long rows (S = 8192: long sums), for each half type.
static void test_adversarial_bounds(void) {
    for (int t = 0; t < 2; t++) {
        problem big = {1, 2, 1, 40, 300, 64, 64, ATTN_CAUSAL_NONE, 0, 0, 0, 0, 0, 0, 0.0f, 1.0f, 8.0f,
                       half_types[t], half_types[t], half_types[t], half_types[t], 0.0f, 0};
        forward_problem(&big, 31u + (uint32_t)t);
        problem lng = {1, 2, 2, 24, 8192, 64, 64, ATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 0, 0, 0.0f, 0.0f, 2.0f,
                       half_types[t], half_types[t], half_types[t], half_types[t], 0.0f, 0};
        forward_problem(&lng, 57u + (uint32_t)t);
    }
    fprintf(stderr, "    largest error %.2f of the bound\n", worst_fwd);
}

// Scores rising along the keys: ALiBi with gentle slopes (a 96-key tile's bias rises by about 3.5
// and 7 in log2) and a steep one (35): the bf16 softmax keeps a query's running max as its base
// while a tile passes it by at most 8 (weights up to 2^8) and takes the new max otherwise; every
// instruction set against the reference within attn.h's bound.
static void test_rising_scores(void) {
    const float slopes[3] = {0.025f, 0.05f, 0.25f};
    for (int t = 0; t < 2; t++) {
        const attn_dtype h = half_types[t];
        problem p = {1, 3, 1, 24, 2000, 64, 64, ATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 1, 0, 0, 0.0f, 0.0f, 1.0f, h, h, h, h,
                     0.0f, 0};
        data x = make_data(&p, 91u + (uint32_t)t);
        for (int i = 0; i < 3; i++) x.slopes[i] = slopes[i];
        forward_data(&p, &x);
        free_data(&x);
    }
    fprintf(stderr, "    largest error %.2f of the bound\n", worst_fwd);
}

static void backward_problem(const problem *p, uint32_t seed);

// Philox dropout in the half-precision forward (the bf16 dot products drop weights before they
// round them), with GQA and causal masking: every instruction set against the reference, the bound
// taken with the kept weights' scale.
static void test_dropout_forward(void) {
    for (int t = 0; t < 2; t++) {
        const attn_dtype h = half_types[t];
        problem p = {2, 4, 2, 100, 150, 32, 32, ATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 0, 0, 0.0f, 0.0f, 2.0f, h, h, h, h,
                     0.0f, 0};
        data x = make_data(&p, 81u + (uint32_t)t);
        x.d.dropout_p = 0.25, x.d.dropout_rng = ATTN_DROPOUT_RNG_PHILOX, x.d.dropout_seed = 12345, x.d.dropout_offset = 7;
        forward_data(&p, &x);
        free_data(&x);
    }
}

// Scores of moderate size from q.k sums beyond the float range and a tiny scale (q and k elements
// in [2^62, 2^63), 16 of them: sums of at least 2^128, times 2^-124: scores in [16, 64), weights far
// above 2^-126, where the kernels flush): the kernels must scale before
// the sums overflow, as the bf16 dot products do by folding the scale's power of two into the
// packed queries; forward and backward against the reference with attn.h's bounds.
static void test_unscaled_overflow(void) { // bf16 only: float16 cannot hold such values
    const float big = 0x1p63f;
    const attn_dtype bf = ATTN_DTYPE_BF16;
    problem p = {1, 2, 1, 72, 40, 16, 16, ATTN_CAUSAL_NONE, 0, 0, 0, 0, 0, 0, 0.0f, 0x1p-124f, big, bf, bf, bf, bf,
                 big, 1};
    forward_problem(&p, 71u);
    backward_problem(&p, 73u);
    p.scale = 0x1p-120f; // scores in [256, 1024): most weights flushed, gradients near 2^-126
    forward_problem(&p, 75u);
    backward_problem(&p, 77u);
}

// The gradient bound of attn.h: |g - g_ref| <= 2 u_grad |g_ref| + tiny_grad + (4 u_out + 2^-14 + 4 delta
// [+ delta / softcap]) M + F,
// M the sum of the absolute values of the terms of g's sum (with |dP_ij - D_i| taken as |dP_ij| +
// sum_t |dO_it O_it|), delta the largest row's. M from the reference's weights p (B, H, L, S).
// F: the same sums with 2^-126 in place of each weight a row sees (weights under 2^-126 are flushed
// to zero by the fused kernels' exp2), added to the bound as they are.
typedef struct magnitudes {
    double *dq, *dk, *dv;
    double *fdq, *fdk, *fdv;
} magnitudes;

static magnitudes grad_magnitudes(const problem *p, const data *x, const float *w, const tensor *out) {
    const int64_t B = p->B, H = p->H, L = p->L, S = p->S, D = p->D, Dv = p->Dv, G = p->H / p->Hkv;
    magnitudes m = {calloc((size_t)(B * H * L * D), 8), calloc((size_t)(B * p->Hkv * S * D), 8),
                    calloc((size_t)(B * p->Hkv * S * Dv), 8), calloc((size_t)(B * H * L * D), 8),
                    calloc((size_t)(B * p->Hkv * S * D), 8), calloc((size_t)(B * p->Hkv * S * Dv), 8)};
    const double scale = p->scale != 0.0f ? p->scale : 1.0 / sqrt((double)D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++) {
                const int64_t row = (b * H + h) * L + i, hk = b * p->Hkv + h / G;
                double R = 0;
                for (int64_t t = 0; t < Dv; t++) R += fabs(at(&x->dout, row * Dv + t) * at(out, row * Dv + t));
                for (int64_t j = 0; j < S; j++) {
                    const double pij = w[row * S + j];
                    if (pij == 0) continue;
                    double dp = 0;
                    for (int64_t t = 0; t < Dv; t++) dp += at(&x->dout, row * Dv + t) * at(&x->v, (hk * S + j) * Dv + t);
                    const double ds = scale * pij * (fabs(dp) + R), fds = scale * 0x1p-126 * (fabs(dp) + R);
                    for (int64_t t = 0; t < D; t++) {
                        const double kk = fabs(at(&x->k, (hk * S + j) * D + t)), qq = fabs(at(&x->q, row * D + t));
                        m.dq[row * D + t] += ds * kk, m.fdq[row * D + t] += fds * kk;
                        m.dk[(hk * S + j) * D + t] += ds * qq, m.fdk[(hk * S + j) * D + t] += fds * qq;
                    }
                    for (int64_t t = 0; t < Dv; t++) {
                        const double g = fabs(at(&x->dout, row * Dv + t));
                        m.dv[(hk * S + j) * Dv + t] += pij * g, m.fdv[(hk * S + j) * Dv + t] += 0x1p-126 * g;
                    }
                }
            }
    return m;
}

// The backward's bound of attn.h (grad_dtype); on the bf16 dot products (`dot`: bf16 q, k, v and out,
// even head dims) c gains 2^-8 (dS and P rounded to bf16) and delta the flushed denormals' term.
static void check_grad(const problem *p, const data *x, const char *what, const tensor *got, const tensor *ref,
                       const double *mag, const double *flush, attn_isa isa) {
    const bool dot = on_dot(isa, p) && p->ot == ATTN_DTYPE_BF16 && p->Dv % 2 == 0;
    const double kmax = max_abs(&x->k), u = unit(p->gt);
    double delta = 0;
    for (int64_t r = 0; r < p->B * p->H * p->L; r++) delta = fmax(delta, row_delta(p, x, r, kmax, dot));
    const double c = 4 * unit(p->ot) + 0x1p-14 + 4 * delta + (p->softcap > 0 ? delta / p->softcap : 0.0) +
                     (dot ? 0x1p-8 : 0.0);
    for (int64_t i = 0; i < ref->n; i++) {
        const double g = at(got, i), w = at(ref, i), bound = 2 * u * fabs(w) + tiny(p->gt) + c * mag[i] + flush[i];
        harness_checks++;
        if (!(fabs(g - w) <= bound))
            FAIL("%s[%lld] = %.8g, reference %.8g: error %.3g above the bound %.3g (q %s kv %s out %s grad %s; B%lld "
                 "H%lld/%lld L%lld S%lld D%lld Dv%lld causal %d mask %d kpm %d window %d alibi %d cap %g)",
                 what, (long long)i, g, w, fabs(g - w), bound, attn_dtype_name(p->qt), attn_dtype_name(p->kvt),
                 attn_dtype_name(p->ot), attn_dtype_name(p->gt), (long long)p->B, (long long)p->H, (long long)p->Hkv,
                 (long long)p->L, (long long)p->S, (long long)p->D, (long long)p->Dv, p->causal, p->mask, p->kpm,
                 p->window, p->alibi, (double)p->softcap);
        if (bound > 0) worst_bwd = fmax(worst_bwd, fabs(g - w) / bound);
    }
}

typedef struct grads {
    tensor dq, dk, dv;
} grads;

static grads make_grads(const problem *p) {
    grads g = {make_tensor(p->gt, NULL, p->B * p->H * p->L * p->D), make_tensor(p->gt, NULL, p->B * p->Hkv * p->S * p->D),
               make_tensor(p->gt, NULL, p->B * p->Hkv * p->S * p->Dv)};
    return g;
}

static void free_grads(grads *g) { free(g->dq.p), free(g->dk.p), free(g->dv.p); }

static void run_bwd(attn_ctx *ctx, const data *x, const tensor *out, const float *lse, grads *g) {
    if (attn_sdpa_bwd(ctx, &x->d, x->q.p, x->k.p, x->v.p, out->p, x->dout.p, lse, NULL, g->dq.p, g->dk.p, g->dv.p,
                      NULL) != ATTN_OK)
        FAIL("sdpa_bwd on %s: %s", attn_isa_name(attn_ctx_isa(ctx)), attn_ctx_last_error(ctx));
}

// run_bwd on poisoned scratch: the gradients must not depend on what the scratch held.
static void run_bwd_on_poisoned_scratch(attn_ctx *ctx, const data *x, const tensor *out, const float *lse, grads *g) {
    size_t need = 0;
    ASSERT_EQ_INT(attn_sdpa_bwd_workspace_size(ctx, &x->d, 0, &need), ATTN_OK);
    char *ws = poisoned_scratch(ctx, need);
    run_bwd(ctx, x, out, lse, g);
    poisoned_scratch_end(ctx, ws);
}

static void backward_problem(const problem *p, uint32_t seed) {
    data x = make_data(p, seed);
    const int64_t no = p->B * p->H * p->L * p->Dv, nl = p->B * p->H * p->L;
    // out and lse from the reference: the backward's inputs are then the same for every kernel
    tensor out = make_tensor(p->ot, NULL, no);
    float *lse = malloc((size_t)nl * 4), *w = malloc((size_t)(nl * p->S) * 4);
    attn_ctx *rc = test_ctx(ATTN_ISA_REF, 1);
    run_fwd(rc, &x, &out, lse);
    attn_sdpa_desc dw = x.d;
    dw.weights_mode = ATTN_WEIGHTS_PER_HEAD;
    tensor scratch = make_tensor(p->ot, NULL, no);
    ASSERT_EQ_INT(attn_sdpa_fwd(rc, &dw, x.q.p, x.k.p, x.v.p, scratch.p, NULL, w), ATTN_OK);
    free(scratch.p);
    magnitudes mag = grad_magnitudes(p, &x, w, &out);
    grads ref = make_grads(p), g1 = make_grads(p), g2 = make_grads(p);
    run_bwd(rc, &x, &out, lse, &ref);
    attn_ctx_free(rc);
    attn_isa isas[16];
    const int n = fused_isas(isas);
    for (int ii = 0; ii < n; ii++) {
        attn_ctx *c1 = test_ctx(isas[ii], 1), *c3 = test_ctx(isas[ii], 3);
        run_bwd(c1, &x, &out, lse, &g1);
        run_bwd(c3, &x, &out, lse, &g2);
        check_grad(p, &x, "dq", &g1.dq, &ref.dq, mag.dq, mag.fdq, isas[ii]);
        check_grad(p, &x, "dk", &g1.dk, &ref.dk, mag.dk, mag.fdk, isas[ii]);
        check_grad(p, &x, "dv", &g1.dv, &ref.dv, mag.dv, mag.fdv, isas[ii]);
        const size_t es = attn_dtype_size(p->gt);
        if (memcmp(g1.dq.p, g2.dq.p, (size_t)g1.dq.n * es) != 0 || memcmp(g1.dk.p, g2.dk.p, (size_t)g1.dk.n * es) != 0 ||
            memcmp(g1.dv.p, g2.dv.p, (size_t)g1.dv.n * es) != 0)
            FAIL("%s: 3 threads give other gradient bits than 1", attn_isa_name(isas[ii]));
        run_bwd_on_poisoned_scratch(c3, &x, &out, lse, &g2);
        if (memcmp(g1.dq.p, g2.dq.p, (size_t)g1.dq.n * es) != 0 || memcmp(g1.dk.p, g2.dk.p, (size_t)g1.dk.n * es) != 0 ||
            memcmp(g1.dv.p, g2.dv.p, (size_t)g1.dv.n * es) != 0)
            FAIL("%s: scratch filled with NaN first gives other gradient bits", attn_isa_name(isas[ii]));
        attn_ctx_free(c1), attn_ctx_free(c3);
        compared++;
    }
    free_grads(&ref), free_grads(&g1), free_grads(&g2);
    free(out.p), free(lse), free(w), free(mag.dq), free(mag.dk), free(mag.dv);
    free(mag.fdq), free(mag.fdk), free(mag.fdv);
    free_data(&x);
}

static void test_backward_random(void) {
    uint32_t s = 777;
    for (int c = 0; c < 40; c++) {
        problem p = random_problem(&s, true);
        backward_problem(&p, 5000u + (uint32_t)c);
    }
    problem big = {1, 4, 2, 96, 160, 64, 64, ATTN_CAUSAL_TOP_LEFT, 0, 0, 0, 0, 0, 0, 0.0f, 1.0f, 6.0f,
                   ATTN_DTYPE_BF16, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16, 0.0f, 0};
    backward_problem(&big, 99);
    fprintf(stderr, "    largest error %.2f of the bound\n", worst_bwd);
}

// Local windows whose edges cut through the tiles (no mask, ALiBi or soft cap: the tiles whose
// products skip what the bounds hide, on the bf16 dot products and on the float32 kernels), both
// edges and each causal alignment, forward and backward, each half type.
static void test_window_edges(void) {
    static const int64_t wins[4][2] = {{5, 0}, {40, 7}, {17, -1}, {-1, 3}};
    for (int c = 0; c < 12; c++) {
        const attn_dtype t = half_types[c % 2];
        problem p = {1, 2, 1, 300, c % 3 == 2 ? 350 : 300, 64, 64, (attn_causal)(c % 3), 0, 0, 1, 0,
                     wins[c % 4][0], wins[c % 4][1], 0.0f, 0.0f, 2.0f, t, t, t, t, 0.0f, 0};
        forward_problem(&p, 400u + (uint32_t)c);
        if (c % 3 != 0) backward_problem(&p, 500u + (uint32_t)c);
    }
    fprintf(stderr, "    largest error %.2f of the forward's bound, %.2f of the backward's\n", worst_fwd, worst_bwd);
}

// Packed batches, half types: every instruction set's result equals, bit for bit, its own calls on
// each sequence alone (the reference included).
static void same_bits(const char *what, const void *a, const void *b, size_t n) {
    harness_checks++;
    if (memcmp(a, b, n) != 0) FAIL("%s: the packed call differs from the call on the sequence alone", what);
}

static void test_varlen(void) {
    for (int t = 0; t < 2; t++) {
        const attn_dtype dt = half_types[t];
        const int64_t cu_q[4] = {0, 5, 5, 40}, cu_k[4] = {0, 17, 20, 90}, H = 4, Hkv = 2, D = 32;
        const int64_t TQ = cu_q[3], TK = cu_k[3];
        float *f = malloc((size_t)(2 * TQ * H * D + 2 * TK * Hkv * D) * 4);
        uint32_t s = 3u + (uint32_t)t;
        for (int64_t i = 0; i < 2 * TQ * H * D + 2 * TK * Hkv * D; i++) f[i] = 2.0f * rand_unit(&s) - 1.0f;
        tensor q = make_tensor(dt, f, TQ * H * D), k = make_tensor(dt, f + TQ * H * D, TK * Hkv * D);
        tensor v = make_tensor(dt, f + TQ * H * D + TK * Hkv * D, TK * Hkv * D);
        tensor dout = make_tensor(dt, f + TQ * H * D + 2 * TK * Hkv * D, TQ * H * D);
        free(f);
        attn_sdpa_desc d;
        attn_sdpa_desc_init(&d);
        d.batch = 3, d.n_heads = H, d.n_kv_heads = Hkv, d.len_q = 35, d.len_kv = 70, d.head_dim = D;
        d.causal = ATTN_CAUSAL_BOTTOM_RIGHT, d.q_dtype = d.kv_dtype = d.out_dtype = d.grad_dtype = dt;
        const int64_t qs[4] = {0, D, H * D, 1}, ks[4] = {0, D, Hkv * D, 1};
        memcpy(d.q_stride, qs, sizeof qs), memcpy(d.o_stride, qs, sizeof qs);
        memcpy(d.k_stride, ks, sizeof ks), memcpy(d.v_stride, ks, sizeof ks);
        attn_isa isas[16];
        int n = fused_isas(isas);
        isas[n++] = ATTN_ISA_REF;
        const size_t es = attn_dtype_size(dt);
        tensor out = make_tensor(dt, NULL, TQ * H * D), o1 = make_tensor(dt, NULL, TQ * H * D);
        grads g = {make_tensor(dt, NULL, TQ * H * D), make_tensor(dt, NULL, TK * Hkv * D), make_tensor(dt, NULL, TK * Hkv * D)};
        grads g1 = {make_tensor(dt, NULL, TQ * H * D), make_tensor(dt, NULL, TK * Hkv * D), make_tensor(dt, NULL, TK * Hkv * D)};
        float *lse = malloc((size_t)(H * TQ) * 4), *l1 = malloc((size_t)(H * TQ) * 4);
        for (int ii = 0; ii < n; ii++) {
            attn_ctx *ctx = test_ctx(isas[ii], 2);
            ASSERT_EQ_INT(attn_sdpa_varlen_fwd(ctx, &d, cu_q, cu_k, q.p, k.p, v.p, out.p, lse), ATTN_OK);
            ASSERT_EQ_INT(attn_sdpa_varlen_bwd(ctx, &d, cu_q, cu_k, q.p, k.p, v.p, out.p, dout.p, lse, NULL, g.dq.p,
                                               g.dk.p, g.dv.p),
                          ATTN_OK);
            for (int b = 0; b < 3; b++) {
                const int64_t L = cu_q[b + 1] - cu_q[b], S = cu_k[b + 1] - cu_k[b];
                if (L == 0) continue;
                attn_sdpa_desc e = d;
                e.batch = 1, e.len_q = L, e.len_kv = S;
                const size_t qo = (size_t)(cu_q[b] * H * D) * es, ko = (size_t)(cu_k[b] * Hkv * D) * es;
                char *qb = (char *)q.p + qo, *kb = (char *)k.p + ko, *vb = (char *)v.p + ko;
                ASSERT_EQ_INT(attn_sdpa_fwd(ctx, &e, qb, kb, vb, (char *)o1.p + qo, l1, NULL), ATTN_OK);
                same_bits("out", (char *)o1.p + qo, (char *)out.p + qo, (size_t)(L * H * D) * es);
                for (int64_t h = 0; h < H; h++) same_bits("lse", l1 + h * L, lse + h * TQ + cu_q[b], (size_t)L * 4);
                for (int64_t h = 0; h < H; h++) memcpy(l1 + h * L, lse + h * TQ + cu_q[b], (size_t)L * 4);
                ASSERT_EQ_INT(attn_sdpa_bwd(ctx, &e, qb, kb, vb, (char *)out.p + qo, (char *)dout.p + qo, l1, NULL,
                                            (char *)g1.dq.p + qo, (char *)g1.dk.p + ko, (char *)g1.dv.p + ko, NULL),
                              ATTN_OK);
                same_bits("dq", (char *)g1.dq.p + qo, (char *)g.dq.p + qo, (size_t)(L * H * D) * es);
                same_bits("dk", (char *)g1.dk.p + ko, (char *)g.dk.p + ko, (size_t)(S * Hkv * D) * es);
                same_bits("dv", (char *)g1.dv.p + ko, (char *)g.dv.p + ko, (size_t)(S * Hkv * D) * es);
            }
            attn_ctx_free(ctx);
        }
        free_grads(&g), free_grads(&g1);
        free(out.p), free(o1.p), free(lse), free(l1), free(q.p), free(k.p), free(v.p), free(dout.p);
    }
}

// A KV cache of each type attended by half-precision queries, out in half precision: every fused
// instruction set against the reference, on one query (decoding) and a block of 7 (prefill).
static void test_kv_cache(void) {
    for (int c = 0; c < 6; c++) {
        const attn_dtype cache_t = all_types[c % 3], qt = half_types[c % 2];
        const int64_t B = 2, Hkv = 2, H = 8, D = 64, cap = 300, len = 250;
        attn_kv_cache_config kc;
        attn_kv_cache_config_init(&kc);
        kc.batch = B, kc.n_kv_heads = Hkv, kc.head_dim = D, kc.capacity = cap, kc.dtype = cache_t;
        attn_isa isas[16];
        int n = fused_isas(isas);
        isas[n++] = ATTN_ISA_REF;
        uint32_t s = 11u + (uint32_t)c;
        float *kv = malloc((size_t)(2 * B * Hkv * len * D) * 4);
        for (int64_t i = 0; i < 2 * B * Hkv * len * D; i++) kv[i] = 2.0f * rand_unit(&s) - 1.0f;
        for (int Lq = 1; Lq <= 7; Lq += 6) {
            float *qf = malloc((size_t)(B * H * Lq * D) * 4);
            for (int64_t i = 0; i < B * H * Lq * D; i++) qf[i] = 2.0f * rand_unit(&s) - 1.0f;
            tensor q = make_tensor(qt, qf, B * H * Lq * D), ref = make_tensor(qt, NULL, B * H * Lq * D);
            tensor got = make_tensor(qt, NULL, B * H * Lq * D);
            free(qf);
            for (int ii = n - 1; ii >= 0; ii--) {
                attn_ctx *ctx = test_ctx(isas[ii], 2);
                attn_kv_cache *cache;
                ASSERT_EQ_INT(attn_kv_cache_create(ctx, &kc, &cache), ATTN_OK);
                ASSERT_EQ_INT(attn_kv_cache_append(ctx, cache, len, kv, NULL, kv + B * Hkv * len * D, NULL), ATTN_OK);
                attn_sdpa_desc d;
                attn_sdpa_desc_init(&d);
                d.batch = B, d.n_heads = H, d.len_q = Lq, d.head_dim = D, d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
                d.q_dtype = d.out_dtype = qt;
                // (B, L, H, D) layout: strided views
                const int64_t st[4] = {Lq * H * D, D, H * D, 1};
                memcpy(d.q_stride, st, sizeof st), memcpy(d.o_stride, st, sizeof st);
                tensor *dst = ii == n - 1 ? &ref : &got;
                ASSERT_EQ_INT(attn_kv_cache_attend(ctx, cache, &d, q.p, dst->p, NULL), ATTN_OK);
                attn_kv_cache_free(cache);
                attn_ctx_free(ctx);
                if (dst == &ref) continue;
                for (int64_t i = 0; i < ref.n; i++) {
                    const double a = at(&got, i), b = at(&ref, i);
                    harness_checks++;
                    if (!(fabs(a - b) <= 2 * unit(qt) * fabs(b) + 1e-4))
                        FAIL("cache %s, q/out %s, L %d on %s: [%lld] %.8g, reference %.8g", attn_dtype_name(cache_t),
                             attn_dtype_name(qt), Lq, attn_isa_name(isas[ii]), (long long)i, a, b);
                }
            }
            free(q.p), free(ref.p), free(got.p);
        }
        free(kv);
    }
}

// The reference itself on exactly representable data: bfloat16 inputs whose products and sums
// are exact give the exact result, rounded once.
static void test_reference_exact(void) {
    // q = e0 (one-hot), k rows with integer entries: scores are integers; v = small integers. With
    // two equal top scores and the others hidden by a mask, out = (v0 + v1) / 2 exactly.
    const int64_t S = 4, D = 4;
    const float qf[4] = {1, 0, 0, 0}, kf[16] = {3, 1, 2, 0, 3, -1, 0, 5, 1, 0, 0, 0, 2, 0, 0, 0};
    const float vf[16] = {1, 2, 3, 4, 3, 6, -3, 8, 100, 100, 100, 100, 50, 50, 50, 50};
    const uint8_t mask[4] = {0, 0, 1, 1};
    tensor q = make_tensor(ATTN_DTYPE_BF16, qf, 4), k = make_tensor(ATTN_DTYPE_BF16, kf, 16);
    tensor v = make_tensor(ATTN_DTYPE_BF16, vf, 16), out = make_tensor(ATTN_DTYPE_BF16, NULL, 4);
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = d.n_heads = d.len_q = 1, d.len_kv = S, d.head_dim = D, d.scale = 1.0f;
    d.q_dtype = d.kv_dtype = d.out_dtype = ATTN_DTYPE_BF16;
    attn_layout_strides(ATTN_LAYOUT_BHLD, 1, 1, 1, D, d.q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, 1, 1, S, D, d.k_stride);
    memcpy(d.v_stride, d.k_stride, sizeof d.k_stride), memcpy(d.o_stride, d.q_stride, sizeof d.q_stride);
    d.mask = mask, d.mask_dtype = ATTN_DTYPE_BOOL, d.mask_stride[3] = 1;
    attn_ctx *ctx = test_ctx(ATTN_ISA_REF, 1);
    ASSERT_EQ_INT(attn_sdpa_fwd(ctx, &d, q.p, k.p, v.p, out.p, NULL, NULL), ATTN_OK);
    const float want[4] = {2, 4, 0, 6};
    for (int c = 0; c < 4; c++) ASSERT_TRUE(at(&out, c) == want[c]);
    attn_ctx_free(ctx);
    free(q.p), free(k.p), free(v.p), free(out.p);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_reference_exact), HARNESS_CASE(test_forward_random), HARNESS_CASE(test_decode_shapes),
        HARNESS_CASE(test_adversarial_bounds), HARNESS_CASE(test_rising_scores),
        HARNESS_CASE(test_unscaled_overflow),
        HARNESS_CASE(test_dropout_forward), HARNESS_CASE(test_backward_random), HARNESS_CASE(test_window_edges),
        HARNESS_CASE(test_varlen),
        HARNESS_CASE(test_kv_cache),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

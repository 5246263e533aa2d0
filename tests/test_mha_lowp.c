// test_mha_lowp.c - nn.MultiheadAttention with float16 / bfloat16 parameters, inputs and outputs,
// through the public API: creation (torch's float32 draws rounded to the type), loading from state
// tensors of each type, the typed parameter accessors; the forward against the float32 module on
// the same rounded parameters and inputs within attn.h's bound, with every option, on every
// instruction set this CPU runs and the reference; the training forward and backward against the
// float32 module's; identical bits for 1 and 3 threads; the cached forward with half and float32
// caches against the full causal forward; and every bad argument.
#include <float.h>
#include <stdbool.h>

#include "attn.h"
#include "harness.h"
#include "test_data.h"


static attn_ctx *make_ctx(attn_isa isa, int threads, uint64_t seed) {
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.isa = isa;
    p.n_threads = threads;
    p.seed = seed;
    attn_ctx *ctx = NULL;
    if (attn_ctx_create(&p, &ctx) != ATTN_OK) FAIL("cannot create a %s context", attn_isa_name(isa));
    return ctx;
}

// The instruction sets to test: every fused one this CPU runs, then the reference.
static int all_isas(attn_isa *isas) {
    int n = fused_isas(isas);
    isas[n++] = ATTN_ISA_REF;
    return n;
}

static double unit(attn_dtype t) { return t == ATTN_DTYPE_BF16 ? 0x1p-8 : 0x1p-11; }
static double tiny(attn_dtype t) { return t == ATTN_DTYPE_BF16 ? 0x1p-133 : 0x1p-24; }

// A tensor both ways: h (n elements of the half type) and f (the same values as float).
typedef struct pair {
    uint16_t *h;
    float *f;
    int64_t n;
} pair;

static pair pair_new(int64_t n) {
    pair p = {calloc((size_t)n + 1, 2), calloc((size_t)n + 1, 4), n};
    return p;
}
static void pair_free(pair *p) { free(p->h), free(p->f); }
// Random values in [-scale, scale), rounded to dt.
static pair pair_rand(attn_dtype dt, int64_t n, float scale, uint32_t *seed) {
    pair p = pair_new(n);
    for (int64_t i = 0; i < n; i++) p.f[i] = scale * (2 * rand_unit(seed) - 1);
    ASSERT_OK(attn_convert(dt, p.h, ATTN_DTYPE_F32, p.f, n));
    ASSERT_OK(attn_convert(ATTN_DTYPE_F32, p.f, dt, p.h, n));
    return p;
}
// p.f = the values of p.h.
static void pair_widen(attn_dtype dt, pair *p) { ASSERT_OK(attn_convert(ATTN_DTYPE_F32, p->f, dt, p->h, p->n)); }

typedef struct mcase {
    int64_t N, L, S, E, H, kdim, vdim;
    int bias, bias_kv, zero_attn, batch_first, unbatched, self;
    int mask;   // 0 none, 1 bool (L, S), 2 float (N*H, L, S), 3 causal
    int kpm;    // 0 none, 1 bool
    int weights; // 0 none, 1 averaged, 2 per head
} mcase;

static mcase random_case(uint32_t *s) {
    mcase c = {0};
    c.H = 1 + rand_pick(s, 3);
    c.E = c.H * (int64_t)(4 + 4 * rand_pick(s, 4)); // head dims 4 .. 16
    c.self = rand_pick(s, 3) == 0;
    c.kdim = c.self || rand_pick(s, 2) ? c.E : 3 + rand_pick(s, 9);
    c.vdim = c.self || rand_pick(s, 2) ? c.kdim : 3 + rand_pick(s, 9);
    c.unbatched = rand_pick(s, 5) == 0;
    c.N = c.unbatched ? 1 : 1 + rand_pick(s, 3);
    c.L = 1 + rand_pick(s, 12);
    c.S = c.self ? c.L : 1 + rand_pick(s, 14);
    c.bias = rand_pick(s, 4) != 0, c.bias_kv = rand_pick(s, 3) == 0, c.zero_attn = rand_pick(s, 4) == 0;
    c.batch_first = rand_pick(s, 2);
    c.mask = rand_pick(s, 4), c.kpm = rand_pick(s, 3) == 0, c.weights = rand_pick(s, 3);
    return c;
}

static attn_mha_config case_config(const mcase *c, attn_dtype dt) {
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, c->E, c->H);
    cfg.kdim = c->kdim, cfg.vdim = c->vdim, cfg.bias = c->bias, cfg.add_bias_kv = c->bias_kv;
    cfg.add_zero_attn = c->zero_attn, cfg.batch_first = c->batch_first, cfg.dtype = dt;
    return cfg;
}

// The same module twice: m16 of type dt and m32 of float32 holding its values.
static void module_pair(attn_ctx *ctx, const mcase *c, attn_dtype dt, uint64_t seed, attn_mha **m16, attn_mha **m32) {
    attn_mha_config cfg = case_config(c, dt);
    attn_generator_seed(attn_ctx_generator(ctx), seed);
    ASSERT_OK(attn_mha_create(ctx, &cfg, m16));
    cfg.dtype = ATTN_DTYPE_F32;
    ASSERT_OK(attn_mha_create(ctx, &cfg, m32));
    for (int i = 0; i < attn_mha_param_count(*m32); i++) {
        int64_t shape[3];
        int nd;
        attn_dtype t;
        void *h;
        float *f;
        ASSERT_OK(attn_mha_param_typed_at(*m16, i, NULL, &nd, shape, &t, &h));
        ASSERT_EQ_INT(t, dt);
        ASSERT_OK(attn_mha_param_at(*m32, i, NULL, &nd, shape, &f));
        int64_t n = 1;
        for (int d = 0; d < nd; d++) n *= shape[d];
        ASSERT_OK(attn_convert(ATTN_DTYPE_F32, f, dt, h, n));
    }
}

// Element (n, r, i) of an input of width w: (rows, N, w), (N, rows, w) batch first, (rows, w) unbatched.
static int64_t at(const mcase *c, int64_t n, int64_t r, int64_t i, int64_t rows, int64_t w) {
    return c->batch_first || c->unbatched ? (n * rows + r) * w + i : (r * c->N + n) * w + i;
}

static const float *param(attn_mha *m, const char *name) {
    float *d = NULL;
    return attn_mha_param(m, name, NULL, NULL, &d) == ATTN_OK ? d : NULL;
}

// x (rows, width) of sequence n projected by W (E, width) and b: y (rows, E), double; ya the sums of
// the terms' absolute values (|b| included), rho the bound on the dot-product projections' extra
// error (attn.h: 2 (d + 2) 2^-24 ya + 2^-126 (sum_i |W_ti| + 2 d + 2)).
static void project(const mcase *c, const float *x, int64_t n, int64_t rows, int64_t width, const float *W,
                    const float *b, double *y, double *rho) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t e = 0; e < c->E; e++) {
            double a = b != NULL ? b[e] : 0.0, ya = b != NULL ? fabs(b[e]) : 0.0, wa = 0.0;
            for (int64_t i = 0; i < width; i++) {
                const double t = (double)x[at(c, n, r, i, rows, width)] * W[e * width + i];
                a += t, ya += fabs(t), wa += fabs(W[e * width + i]);
            }
            y[r * c->E + e] = a;
            rho[r * c->E + e] = 2.0 * (double)(width + 2) * 0x1p-24 * ya + 0x1p-126 * (wa + 2.0 * (double)width + 2.0);
        }
}

// attn.h's bound on |out16 - out32| and |weights16 - weights32| for the float32 module m32 on the
// float inputs q, k, v; checks every element of out16 (float values of the half results) and w16.
// dot: the half module ran on bf16 dot products (its projections' sums in their order, rho; the
// attention's weights rounded to bf16 where it asks for no weights; the instructions' flushing).
static void check_bound(const mcase *c, attn_dtype dt, bool dot, attn_mha *m32, const float *q, const float *k,
                        const float *v, const float *out32, const float *out16, const float *w32, const float *w16,
                        const char *what) {
    const int64_t N = c->N, L = c->L, S = c->S, E = c->E, H = c->H, hd = E / H;
    const int64_t S2 = S + c->bias_kv + c->zero_attn;
    const double u = unit(dt);
    const bool packed = param(m32, "in_proj_weight") != NULL;
    const float *wq = packed ? param(m32, "in_proj_weight") : param(m32, "q_proj_weight");
    const float *wk = packed ? wq + E * E : param(m32, "k_proj_weight");
    const float *wv = packed ? wq + 2 * E * E : param(m32, "v_proj_weight");
    const float *bi = param(m32, "in_proj_bias"), *wo = param(m32, "out_proj.weight"), *bo = param(m32, "out_proj.bias");
    const float *bk = param(m32, "bias_k"), *bv = param(m32, "bias_v");
    double *Q = calloc((size_t)(L * E), 8), *K = calloc((size_t)(S2 * E), 8), *V = calloc((size_t)(S2 * E), 8);
    double *rQ = calloc((size_t)(L * E), 8), *rK = calloc((size_t)(S2 * E), 8), *rV = calloc((size_t)(S2 * E), 8);
    double *eps = calloc((size_t)H, 8), *vmax = calloc((size_t)H, 8);
    const bool dot_attn = dot && c->weights == 0; // attn.h: the weights keep the float32 attention
    for (int64_t n = 0; n < N; n++) {
        project(c, q, n, L, E, wq, bi, Q, rQ);
        project(c, k, n, S, c->kdim, wk, bi != NULL ? bi + E : NULL, K, rK);
        project(c, v, n, S, c->vdim, wv, bi != NULL ? bi + 2 * E : NULL, V, rV);
        for (int64_t e = 0; bk != NULL && e < E; e++) K[S * E + e] = bk[e], V[S * E + e] = bv[e]; // zero key: 0
        if (!dot) // the float32 products of both modules sum in the same order: the same projections
            for (int64_t i = 0; i < L * E; i++) rQ[i] = 0;
        for (int64_t i = 0; !dot && i < S2 * E; i++) rK[i] = rV[i] = 0;
        for (int64_t i = 0; i < L; i++) {
            double dmax = 0;
            for (int64_t h = 0; h < H; h++) {
                double qs = 0, qe = 0, km = 0, ke = 0, vm = 0, rv = 0;
                for (int64_t t = 0; t < hd; t++) {
                    const int64_t o = i * E + h * hd + t;
                    qs += fabs(Q[o]), qe += u * fabs(Q[o]) + (1 + u) * rQ[o];
                }
                for (int64_t j = 0; j < S2; j++)
                    for (int64_t t = 0; t < hd; t++) {
                        const int64_t o = j * E + h * hd + t;
                        km = fmax(km, fabs(K[o])), ke = fmax(ke, u * fabs(K[o]) + (1 + u) * rK[o]);
                        vm = fmax(vm, fabs(V[o])), rv = fmax(rv, rV[o]);
                    }
                double delta = ((km + ke) * qe + qs * ke + 2 * (hd + 2) * 0x1p-24 * qs * km) / sqrt((double)hd);
                if (dot_attn) delta += 0x1p-126 * qs / sqrt((double)hd) + 0x1p-125 * (double)hd * km;
                eps[h] = (exp(2 * delta) - 1 + (dot_attn ? 3 : 2) * u + 0x1p-15) * (vm + 2 * rv) + 2 * rv +
                         (dot_attn ? (double)S2 * 0x1p-125 : 0.0);
                vmax[h] = vm;
                dmax = fmax(dmax, delta);
            }
            const int64_t row = c->batch_first || c->unbatched ? n * L + i : i * N + n;
            for (int64_t e = 0; e < E; e++) {
                double rest = 2 * E * 0x1p-24 * (bo != NULL ? fabs(bo[e]) : 0.0), wa = 0;
                for (int64_t t = 0; t < E; t++) {
                    rest += fabs(wo[e * E + t]) * (eps[t / hd] + 2 * E * 0x1p-24 * vmax[t / hd]);
                    wa += fabs(wo[e * E + t]);
                }
                if (dot) rest += 0x1p-126 * (wa + 2.0 * (double)E + 2.0); // the instructions' flushing
                const double want = out32[row * E + e], got = out16[row * E + e];
                const double bound = u * fabs(want) + (1 + u) * rest + tiny(dt);
                harness_checks++;
                if (!(fabs(got - want) <= bound))
                    FAIL("%s: out[%lld] = %.9g, float32 module %.9g: error %.3g > bound %.3g", what,
                         (long long)(row * E + e), got, want, fabs(got - want), bound);
            }
            if (w16 == NULL) continue;
            // weights: each p within exp(2 delta) - 1 of the float32 module's, then rounded
            const int64_t heads = c->weights == 2 ? H : 1;
            for (int64_t h = 0; h < heads; h++)
                for (int64_t j = 0; j < S2; j++) {
                    const int64_t o = ((n * heads + h) * L + i) * S2 + j;
                    const double want = w32[o], got = w16[o];
                    const double bound = u * fabs(want) + (1 + u) * (exp(2 * dmax) - 1 + 0x1p-15) + tiny(dt);
                    harness_checks++;
                    if (!(fabs(got - want) <= bound))
                        FAIL("%s: weights[%lld] = %.9g, float32 module %.9g: error %.3g > bound %.3g", what, (long long)o,
                             got, want, fabs(got - want), bound);
                }
        }
    }
    free(Q), free(K), free(V), free(rQ), free(rK), free(rV), free(eps), free(vmax);
}

// Inputs and masks of a case, of type dt (and as floats).
typedef struct inputs {
    pair q, k, v;
    uint8_t *bmask, *kpm;
    float *fmask;
} inputs;

static inputs make_inputs(const mcase *c, attn_dtype dt, uint32_t *seed, float scale) {
    inputs x = {0};
    x.q = pair_rand(dt, c->N * c->L * c->E, scale, seed);
    if (!c->self) {
        x.k = pair_rand(dt, c->N * c->S * c->kdim, scale, seed);
        x.v = pair_rand(dt, c->N * c->S * c->vdim, scale, seed);
    }
    const int64_t nm = c->N * c->H * c->L * c->S;
    x.bmask = calloc((size_t)nm, 1), x.fmask = calloc((size_t)nm, 4), x.kpm = calloc((size_t)(c->N * c->S), 1);
    for (int64_t i = 0; i < nm; i++) x.bmask[i] = rand_pick(seed, 4) == 0, x.fmask[i] = rand_pick(seed, 6) == 0 ? -INFINITY : rand_unit(seed);
    for (int64_t i = 0; i < c->N * c->S; i++) x.kpm[i] = rand_pick(seed, 4) == 0;
    return x;
}

static void free_inputs(inputs *x) {
    pair_free(&x->q), pair_free(&x->k), pair_free(&x->v);
    free(x->bmask), free(x->fmask), free(x->kpm);
}

// The args of a case for the half inputs (half = true) or their float values.
static attn_mha_args case_args(const mcase *c, const inputs *x, bool half) {
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = half ? (const void *)x->q.h : (const void *)x->q.f;
    if (!c->self) {
        a.key = half ? (const void *)x->k.h : (const void *)x->k.f;
        a.value = half ? (const void *)x->v.h : (const void *)x->v.f;
    }
    a.batch = c->N, a.len_q = c->L, a.len_kv = c->S, a.unbatched = c->unbatched;
    if (c->mask == 1) a.attn_mask = x->bmask, a.attn_mask_dtype = ATTN_DTYPE_BOOL, a.attn_mask_ndim = 2;
    if (c->mask == 2) a.attn_mask = x->fmask, a.attn_mask_dtype = ATTN_DTYPE_F32, a.attn_mask_ndim = 3;
    if (c->mask == 2 && c->unbatched) a.attn_mask_ndim = 2;
    a.causal = c->mask == 3;
    if (c->kpm) a.key_padding_mask = x->kpm, a.key_padding_mask_dtype = ATTN_DTYPE_BOOL;
    a.need_weights = c->weights != 0, a.average_attn_weights = c->weights == 1;
    return a;
}

static int64_t weights_size(const mcase *c) {
    return c->N * (c->weights == 2 ? c->H : 1) * c->L * (c->S + c->bias_kv + c->zero_attn);
}

static void forward_case(const mcase *c, attn_dtype dt, uint32_t seed, float scale) {
    attn_isa isas[17]; // the fused ones and the reference
    const int n_isa = all_isas(isas);
    for (int ii = 0; ii < n_isa; ii++) {
        attn_ctx *ctx = make_ctx(isas[ii], 2, 0);
        attn_mha *m16, *m32;
        module_pair(ctx, c, dt, seed, &m16, &m32);
        uint32_t s = seed * 7u + 1u;
        inputs x = make_inputs(c, dt, &s, scale);
        const int64_t no = c->N * c->L * c->E, nw = weights_size(c);
        pair out = pair_new(no), w = pair_new(nw);
        float *out32 = calloc((size_t)no, 4), *w32 = calloc((size_t)nw + 1, 4);
        attn_mha_args a16 = case_args(c, &x, true), a32 = case_args(c, &x, false);
        if (attn_mha_forward(ctx, m16, &a16, out.h, c->weights ? w.h : NULL) != ATTN_OK)
            FAIL("%s forward on %s: %s", attn_dtype_name(dt), attn_isa_name(isas[ii]), attn_ctx_last_error(ctx));
        ASSERT_OK(attn_mha_forward(ctx, m32, &a32, out32, c->weights ? w32 : NULL));
        pair_widen(dt, &out);
        pair_widen(dt, &w);
        char what[96];
        snprintf(what, sizeof what, "%s %s seed %u", attn_dtype_name(dt), attn_isa_name(isas[ii]), seed);
        const bool dot = dt == ATTN_DTYPE_BF16 && attn_isa_bf16_dot(isas[ii]);
        check_bound(c, dt, dot, m32, x.q.f, c->self ? x.q.f : x.k.f, c->self ? x.q.f : x.v.f, out32, out.f, w32,
                    c->weights ? w.f : NULL, what);
        pair_free(&out), pair_free(&w), free(out32), free(w32);
        free_inputs(&x);
        attn_mha_free(m16), attn_mha_free(m32);
        attn_ctx_free(ctx);
    }
}

static void test_forward_random(void) {
    uint32_t s = 12345;
    for (int it = 0; it < 60; it++) {
        const mcase c = random_case(&s);
        forward_case(&c, it % 2 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16, 100u + (uint32_t)it, 1.0f);
    }
}

// Large inputs: logits of hundreds, where the bound's exp(2 delta) term matters.
static void test_forward_large_logits(void) {
    uint32_t s = 777;
    for (int it = 0; it < 12; it++) {
        mcase c = random_case(&s);
        c.weights = it / 2 % 2; // without weights a bf16 module's attention may run on the dot products
        forward_case(&c, it % 2 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16, 900u + (uint32_t)it, 30.0f);
    }
}

// Sequences longer than a block of the products' rows (64) and inputs wide enough for their
// 16-pair steps, without weights: the shapes of the bf16 dot-product path, with its odd widths.
static void test_forward_long(void) {
    const int64_t shapes[][5] = {{64, 4, 70, 70, 64}, {96, 2, 130, 67, 33}, {48, 3, 9, 200, 48}}; // E, H, L, S, kdim
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 2; t++) {
            mcase c = {.N = 2 - i % 2, .E = shapes[i][0], .H = shapes[i][1], .L = shapes[i][2], .S = shapes[i][3]};
            c.kdim = shapes[i][4], c.vdim = c.E, c.bias = 1, c.self = c.L == c.S && c.kdim == c.E;
            c.batch_first = i == 1, c.mask = i == 0 ? 3 : 0, c.kpm = i == 2;
            forward_case(&c, t ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16, 1300u + (uint32_t)(2 * i + t), 1.0f);
        }
}

// create: torch's float32 draws rounded to nearest even; the accessors.
static void test_create_rounds(void) {
    const attn_dtype types[2] = {ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
    for (int t = 0; t < 2; t++) {
        attn_ctx *ctx = make_ctx(ATTN_ISA_AUTO, 1, 5);
        attn_mha_config cfg;
        attn_mha_config_init(&cfg, 8, 2);
        cfg.add_bias_kv = 1;
        attn_mha *m32, *m16;
        ASSERT_OK(attn_mha_create(ctx, &cfg, &m32));
        attn_generator_seed(attn_ctx_generator(ctx), 5);
        cfg.dtype = types[t];
        ASSERT_OK(attn_mha_create(ctx, &cfg, &m16));
        ASSERT_EQ_INT(attn_mha_get_config(m16)->dtype, types[t]);
        ASSERT_EQ_INT(attn_mha_param_count(m16), attn_mha_param_count(m32));
        int nonzero = 0;
        for (int i = 0; i < attn_mha_param_count(m16); i++) {
            const char *n16, *n32;
            int nd;
            int64_t shape[3];
            float *f;
            void *h;
            attn_dtype dt = ATTN_DTYPE_F32;
            ASSERT_OK(attn_mha_param_at(m32, i, &n32, &nd, shape, &f));
            ASSERT_OK(attn_mha_param_typed_at(m16, i, &n16, &nd, shape, &dt, &h));
            ASSERT_TRUE(strcmp(n16, n32) == 0);
            ASSERT_EQ_INT(dt, types[t]);
            int64_t n = 1;
            for (int d = 0; d < nd; d++) n *= shape[d];
            uint16_t *want = malloc((size_t)n * 2);
            ASSERT_OK(attn_convert(types[t], want, ATTN_DTYPE_F32, f, n));
            ASSERT_TRUE(memcmp(want, h, (size_t)n * 2) == 0);
            for (int64_t j = 0; j < n; j++) nonzero += want[j] != 0;
            free(want);
            // the float accessors refuse a half module's data, not its description
            float *bad = (float *)&nonzero;
            ASSERT_STATUS(attn_mha_param_at(m16, i, NULL, NULL, NULL, &bad), ATTN_ERR_INVALID_ARG);
            ASSERT_TRUE(bad == (float *)&nonzero);
            ASSERT_OK(attn_mha_param_at(m16, i, NULL, &nd, shape, NULL));
            ASSERT_STATUS(attn_mha_param(m16, n16, NULL, NULL, &bad), ATTN_ERR_INVALID_ARG);
            void *h2;
            ASSERT_OK(attn_mha_param_typed(m16, n16, NULL, NULL, &dt, &h2));
            ASSERT_TRUE(h2 == h);
        }
        ASSERT_TRUE(nonzero > 100);
        attn_dtype dt;
        ASSERT_STATUS(attn_mha_param_typed(m16, "nope", NULL, NULL, &dt, NULL), ATTN_ERR_NOT_FOUND);
        ASSERT_STATUS(attn_mha_param_typed_at(m16, 99, NULL, NULL, NULL, &dt, NULL), ATTN_ERR_INVALID_ARG);
        attn_mha_free(m16), attn_mha_free(m32);
        attn_ctx_free(ctx);
    }
}

// create_from_state: F16 / BF16 tensors, F32 tensors rounded on request, the refused combinations.
static void test_from_state(void) {
    attn_ctx *ctx = make_ctx(ATTN_ISA_AUTO, 1, 3);
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, 8, 2);
    attn_mha *m32;
    ASSERT_OK(attn_mha_create(ctx, &cfg, &m32));
    const int np = attn_mha_param_count(m32);
    attn_tensor t32[4], t16[4];
    uint16_t *bufs[4];
    for (int i = 0; i < np; i++) {
        int nd;
        int64_t shape[3];
        float *f;
        const char *name;
        ASSERT_OK(attn_mha_param_at(m32, i, &name, &nd, shape, &f));
        memset(&t32[i], 0, sizeof t32[i]);
        t32[i].name = (char *)(uintptr_t)name, t32[i].dtype = ATTN_DTYPE_F32, t32[i].ndim = nd, t32[i].data = f;
        for (int d = 0; d < nd; d++) t32[i].shape[d] = shape[d];
        t16[i] = t32[i];
        const int64_t n = attn_tensor_numel(&t32[i]);
        bufs[i] = malloc((size_t)n * 2);
        ASSERT_OK(attn_convert(ATTN_DTYPE_BF16, bufs[i], ATTN_DTYPE_F32, f, n));
        t16[i].dtype = ATTN_DTYPE_BF16, t16[i].data = bufs[i];
    }
    attn_tensor_list l32 = {np, t32}, l16 = {np, t16};
    attn_mha *a, *b;
    ASSERT_OK(attn_mha_create_from_state(ctx, &l16, 2, NULL, &a)); // BF16 tensors: a BF16 module
    attn_mha_config extra;
    attn_mha_config_init(&extra, 1, 1);
    extra.dtype = ATTN_DTYPE_BF16;
    ASSERT_OK(attn_mha_create_from_state(ctx, &l32, 2, &extra, &b)); // F32 tensors rounded
    ASSERT_EQ_INT(attn_mha_get_config(a)->dtype, ATTN_DTYPE_BF16);
    ASSERT_EQ_INT(attn_mha_get_config(b)->dtype, ATTN_DTYPE_BF16);
    for (int i = 0; i < np; i++) {
        void *pa, *pb;
        int64_t shape[3];
        ASSERT_OK(attn_mha_param_typed_at(a, i, NULL, NULL, shape, NULL, &pa));
        ASSERT_OK(attn_mha_param_typed_at(b, i, NULL, NULL, shape, NULL, &pb));
        const size_t bytes = (size_t)attn_tensor_numel(&t16[i]) * 2;
        ASSERT_TRUE(memcmp(pa, bufs[i], bytes) == 0);
        ASSERT_TRUE(memcmp(pb, bufs[i], bytes) == 0);
    }
    attn_mha_free(a), attn_mha_free(b);
    attn_mha *m = NULL;
    extra.dtype = ATTN_DTYPE_F16; // BF16 tensors into an F16 module: a second rounding, refused
    ASSERT_STATUS(attn_mha_create_from_state(ctx, &l16, 2, &extra, &m), ATTN_ERR_INVALID_ARG);
    ASSERT_TRUE(m == NULL && strstr(attn_ctx_last_error(ctx), "BF16") != NULL);
    extra.dtype = ATTN_DTYPE_Q8_0;
    ASSERT_STATUS(attn_mha_create_from_state(ctx, &l32, 2, &extra, &m), ATTN_ERR_INVALID_ARG);
    t16[0].dtype = ATTN_DTYPE_F16; // mixed types
    ASSERT_STATUS(attn_mha_create_from_state(ctx, &l16, 2, NULL, &m), ATTN_ERR_UNSUPPORTED);
    ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "expected") != NULL);
    for (int i = 0; i < np; i++) free(bufs[i]);
    attn_mha_free(m32);
    attn_ctx_free(ctx);
}

// Training: forward_train and backward of the half module against the float32 module's gradients
// on the same values; identical bits for 1 and 3 threads.
static void train_case(const mcase *c, attn_dtype dt, uint32_t seed) {
    attn_isa isas[17]; // the fused ones and the reference
    const int n_isa = all_isas(isas);
    for (int ii = 0; ii < n_isa; ii++) {
        attn_ctx *ctx = make_ctx(isas[ii], 1, 0), *ctx3 = make_ctx(isas[ii], 3, 0);
        attn_mha *m16, *m32;
        module_pair(ctx, c, dt, seed, &m16, &m32);
        uint32_t s = seed * 3u + 7u;
        inputs x = make_inputs(c, dt, &s, 1.0f);
        const int64_t no = c->N * c->L * c->E;
        pair out = pair_new(no), dout = pair_rand(dt, no, 1.0f, &s);
        float *out32 = calloc((size_t)no, 4);
        attn_mha_args a16 = case_args(c, &x, true), a32 = case_args(c, &x, false);
        a16.need_weights = a32.need_weights = 0;
        size_t n16, n32;
        ASSERT_OK(attn_mha_saved_size(ctx, m16, &a16, &n16));
        ASSERT_OK(attn_mha_saved_size(ctx, m32, &a32, &n32));
        void *sv16 = malloc(n16), *sv32 = malloc(n32);
        if (attn_mha_forward_train(ctx, m16, &a16, out.h, NULL, sv16, n16) != ATTN_OK)
            FAIL("forward_train: %s", attn_ctx_last_error(ctx));
        ASSERT_OK(attn_mha_forward_train(ctx, m32, &a32, out32, NULL, sv32, n32));
        const int np = attn_mha_param_count(m16);
        float *dp16[9] = {0}, *dp32[9] = {0}, *dp16b[9] = {0};
        int64_t pn[9];
        for (int i = 0; i < np; i++) {
            int nd;
            int64_t shape[3];
            ASSERT_OK(attn_mha_param_typed_at(m16, i, NULL, &nd, shape, NULL, NULL));
            pn[i] = 1;
            for (int d = 0; d < nd; d++) pn[i] *= shape[d];
            dp16[i] = calloc((size_t)pn[i], 4), dp32[i] = calloc((size_t)pn[i], 4), dp16b[i] = calloc((size_t)pn[i], 4);
        }
        const int64_t nk = c->self ? 1 : c->N * c->S * c->kdim, nv = c->self ? 1 : c->N * c->S * c->vdim;
        pair dq = pair_new(no), dk = pair_new(nk), dv = pair_new(nv), dq3 = pair_new(no);
        float *dq32 = calloc((size_t)no, 4), *dk32 = calloc((size_t)nk, 4), *dv32 = calloc((size_t)nv, 4);
        if (attn_mha_backward(ctx, m16, &a16, sv16, n16, dout.h, dq.h, c->self ? NULL : dk.h, c->self ? NULL : dv.h,
                              dp16) != ATTN_OK)
            FAIL("backward: %s", attn_ctx_last_error(ctx));
        ASSERT_OK(attn_mha_backward(ctx, m32, &a32, sv32, n32, dout.f, dq32, c->self ? NULL : dk32,
                                    c->self ? NULL : dv32, dp32));
        // 3 threads: the same bits
        ASSERT_OK(attn_mha_backward(ctx3, m16, &a16, sv16, n16, dout.h, dq3.h, NULL, NULL, dp16b));
        ASSERT_TRUE(memcmp(dq3.h, dq.h, (size_t)no * 2) == 0);
        for (int i = 0; i < np; i++) ASSERT_BITS_EQ(dp16b[i], dp16[i], pn[i]);
        // the saved buffer of the float32 module is not the half module's
        ASSERT_STATUS(attn_mha_backward(ctx, m16, &a16, sv32, n32, dout.h, dq.h, NULL, NULL, NULL), ATTN_ERR_INVALID_ARG);
        // against the float32 module: each gradient within 8 u of its largest element (2.8 u seen) (the
        // projections, the heads' output and out rounded in the forward; float32 gradients otherwise)
        pair_widen(dt, &out), pair_widen(dt, &dq), pair_widen(dt, &dk), pair_widen(dt, &dv);
        const double u = unit(dt);
        struct {
            const char *name;
            const float *got, *want;
            int64_t n;
        } g[13] = {{"out", out.f, out32, no}, {"dquery", dq.f, dq32, no}, {"dkey", dk.f, dk32, c->self ? 0 : nk},
                   {"dvalue", dv.f, dv32, c->self ? 0 : nv}};
        int ng = 4;
        for (int i = 0; i < np; i++) g[ng].name = "dparam", g[ng].got = dp16[i], g[ng].want = dp32[i], g[ng++].n = pn[i];
        for (int i = 0; i < ng; i++) {
            double mx = 0;
            for (int64_t j = 0; j < g[i].n; j++) mx = fmax(mx, fabs(g[i].want[j]));
            char what[96];
            snprintf(what, sizeof what, "%s %s %s seed %u", g[i].name, attn_dtype_name(dt), attn_isa_name(isas[ii]), seed);
            harness_assert_close(__FILE__, __LINE__, what, g[i].got, g[i].want, g[i].n, 8 * u * mx + 1e-30, 0);
        }
        for (int i = 0; i < np; i++) free(dp16[i]), free(dp32[i]), free(dp16b[i]);
        pair_free(&dq), pair_free(&dk), pair_free(&dv), pair_free(&dq3), pair_free(&out), pair_free(&dout);
        free(dq32), free(dk32), free(dv32), free(out32), free(sv16), free(sv32);
        free_inputs(&x);
        attn_mha_free(m16), attn_mha_free(m32);
        attn_ctx_free(ctx), attn_ctx_free(ctx3);
    }
}

static void test_training(void) {
    uint32_t s = 4242;
    for (int it = 0; it < 16; it++) {
        mcase c = random_case(&s);
        train_case(&c, it % 2 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16, 300u + (uint32_t)it);
    }
}

// The cached forward of a half module, with a cache of its type and a float32 one, prefill then
// token by token, against the full causal forward of the same module at every step. Every
// parameter is random, the biases too (the module's initialisation leaves them 0): the steps'
// projections read the weights in the module's type and the biases converted (mha.c).
static void test_cached(void) {
    const attn_dtype types[2] = {ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
    attn_isa isas[17]; // the fused ones and the reference
    const int n_isa = all_isas(isas);
    for (int t = 0; t < 2; t++)
        for (int ii = 0; ii < n_isa; ii++)
            for (int cache_t = 0; cache_t < 2; cache_t++) {
                const attn_dtype dt = types[t];
                const int64_t E = 32, H = 4, N = 2, P = 5, T = 4, total = P + T;
                attn_ctx *ctx = make_ctx(isas[ii], 2, 11);
                attn_mha_config cfg;
                attn_mha_config_init(&cfg, E, H);
                cfg.dtype = dt, cfg.batch_first = 1;
                attn_mha *m;
                ASSERT_OK(attn_mha_create(ctx, &cfg, &m));
                uint32_t s = 99;
                for (int i = 0; i < attn_mha_param_count(m); i++) {
                    int64_t shape[3], numel = 1;
                    int nd;
                    void *h;
                    ASSERT_OK(attn_mha_param_typed_at(m, i, NULL, &nd, shape, NULL, &h));
                    for (int d = 0; d < nd; d++) numel *= shape[d];
                    pair p = pair_rand(dt, numel, 0.4f, &s);
                    memcpy(h, p.h, (size_t)numel * 2);
                    pair_free(&p);
                }
                attn_kv_cache_config kc;
                attn_kv_cache_config_init(&kc);
                kc.batch = N, kc.n_kv_heads = H, kc.head_dim = E / H, kc.capacity = total;
                kc.dtype = cache_t ? ATTN_DTYPE_F32 : dt;
                attn_kv_cache *cache;
                ASSERT_OK(attn_kv_cache_create(ctx, &kc, &cache));
                pair x = pair_rand(dt, N * total * E, 1.0f, &s), full = pair_new(N * total * E);
                attn_mha_args a;
                attn_mha_args_init(&a);
                a.query = x.h, a.batch = N, a.len_q = total, a.causal = 1, a.need_weights = 0;
                ASSERT_OK(attn_mha_forward(ctx, m, &a, full.h, NULL));
                pair_widen(dt, &full);
                // prefill P tokens, then one at a time: x is (N, total, E); pack each step's rows
                int64_t done = 0;
                while (done < total) {
                    const int64_t len = done == 0 ? P : 1;
                    uint16_t *xs = malloc((size_t)(N * len * E) * 2), *os = malloc((size_t)(N * len * E) * 2);
                    for (int64_t n = 0; n < N; n++)
                        memcpy(xs + n * len * E, x.h + (n * total + done) * E, (size_t)(len * E) * 2);
                    if (attn_mha_forward_cached(ctx, m, cache, xs, N, len, os) != ATTN_OK)
                        FAIL("cached: %s", attn_ctx_last_error(ctx));
                    for (int64_t n = 0; n < N; n++)
                        for (int64_t r = 0; r < len; r++) {
                            float got[32], want[32];
                            ASSERT_OK(attn_convert(ATTN_DTYPE_F32, got, dt, os + (n * len + r) * E, E));
                            memcpy(want, full.f + (n * total + done + r) * E, sizeof want);
                            double mx = 0;
                            for (int e = 0; e < E; e++) mx = fmax(mx, fabs(want[e]));
                            char what[80];
                            snprintf(what, sizeof what, "%s %s cache %s step %lld", attn_dtype_name(dt),
                                     attn_isa_name(isas[ii]), attn_dtype_name(kc.dtype), (long long)done);
                            harness_assert_close(__FILE__, __LINE__, what, got, want, E, 4 * unit(dt) * mx, 0);
                        }
                    free(xs), free(os);
                    done += len;
                }
                attn_kv_cache_free(cache);
                // the other half type would round the keys again
                kc.dtype = dt == ATTN_DTYPE_F16 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
                ASSERT_OK(attn_kv_cache_create(ctx, &kc, &cache));
                ASSERT_STATUS(attn_mha_forward_cached(ctx, m, cache, x.h, N, 1, full.h), ATTN_ERR_INVALID_ARG);
                ASSERT_TRUE(strstr(attn_ctx_last_error(ctx), "round") != NULL);
                ASSERT_EQ_INT(attn_kv_cache_length(cache), 0);
                attn_kv_cache_free(cache);
                pair_free(&x), pair_free(&full);
                attn_mha_free(m);
                attn_ctx_free(ctx);
            }
}

static void test_bad_arguments(void) {
    attn_ctx *ctx = make_ctx(ATTN_ISA_AUTO, 1, 0);
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, 8, 2);
    attn_mha *m = NULL;
    const attn_dtype bad[] = {ATTN_DTYPE_F64, ATTN_DTYPE_BOOL, ATTN_DTYPE_U8, ATTN_DTYPE_I32, ATTN_DTYPE_Q8_0,
                              ATTN_DTYPE_Q4_0, (attn_dtype)77, (attn_dtype)-1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cfg.dtype = bad[i];
        ASSERT_STATUS(attn_mha_create(ctx, &cfg, &m), ATTN_ERR_INVALID_ARG);
        ASSERT_TRUE(m == NULL && strstr(attn_ctx_last_error(ctx), "dtype") != NULL);
    }
    cfg.dtype = ATTN_DTYPE_BF16;
    ASSERT_OK(attn_mha_create(ctx, &cfg, &m));
    uint16_t x[2 * 3 * 8] = {0}, out[2 * 3 * 8];
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = x, a.batch = 2, a.len_q = 3, a.need_weights = 0;
    ASSERT_OK(attn_mha_forward(ctx, m, &a, out, NULL));
    // masks stay BOOL or F32 (a half float mask is refused)
    uint16_t mask[9] = {0};
    a.attn_mask = mask, a.attn_mask_dtype = ATTN_DTYPE_BF16, a.attn_mask_ndim = 2;
    ASSERT_STATUS(attn_mha_forward(ctx, m, &a, out, NULL), ATTN_ERR_BAD_MASK);
    a.attn_mask = NULL;
    ASSERT_STATUS(attn_mha_forward(ctx, m, &a, NULL, NULL), ATTN_ERR_INVALID_ARG);
    a.query = NULL;
    ASSERT_STATUS(attn_mha_forward(ctx, m, &a, out, NULL), ATTN_ERR_INVALID_ARG);
    attn_mha_free(m);
    attn_ctx_free(ctx);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_create_rounds),  HARNESS_CASE(test_from_state),  HARNESS_CASE(test_forward_random),
        HARNESS_CASE(test_forward_large_logits),
        HARNESS_CASE(test_forward_long), HARNESS_CASE(test_training), HARNESS_CASE(test_cached),
        HARNESS_CASE(test_bad_arguments),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

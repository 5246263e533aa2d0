// test_kernels.c - the fused kernels (every ISA this CPU runs, the portable one forced too) against
// the scalar reference over a grid of sizes: 1, 7, 63, 64, 65 and 129 for L and S, head dims that
// are not multiples of the vector width, L != S, causal masks of both alignments with L < S and
// L > S, bool and float masks (broadcast and per head), key padding, GQA, custom scales, dropout,
// fully masked rows and non-finite inputs. Outputs and log-sum-exp agree to 1e-6 absolute + 1e-5
// relative; 1, 2 and 3 threads give identical bits.
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "cpu/cpu.h"
#include "half.h"
#include "harness.h"
#include "quant.h"
#include "test_data.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__SSE__)
#include <xmmintrin.h>
#endif

static int use_blas = 1; // the contexts' use_blas (test_linear_and_modules runs with 0 and 1)

static attn_ctx *make_ctx(attn_isa isa, int threads) {
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.isa = isa;
    p.n_threads = threads;
    p.use_blas = use_blas;
    attn_ctx *ctx = NULL;
    if (attn_ctx_create(&p, &ctx) != ATTN_OK) FAIL("cannot create a %s context", attn_isa_name(isa));
    return ctx;
}

typedef struct problem {
    int64_t B, H, Hkv, L, S, D, Dv;
    attn_causal causal;
    int mask;   // 0 none, 1 bool (L, S), 2 float per (b, h), 3 bool per (b, h)
    int kpm;    // 0 none, 1 bool, 2 float
    float scale;
    double dropout;
    int poison; // 0 none, 1 NaN in a key, 2 inf in the last value, 3 a fully masked row via the mask,
                // 4 inf in the first value
    int window; // 0 none, else a local window (wl, wr)
    int64_t wl, wr;
    int alibi;        // ALiBi slopes: 1: 2^-(h+1); 2: near float's largest (slope * log2(e) overflows)
    float softcap;    // 0 none
    attn_dtype kvdt;  // k and v as F32 (0), F16 or BF16
    int sinks;        // attention sinks: 0 none; 1 finite, in [-3, 5]; 2 per head: -inf, 30 (the sink
                      // takes nearly all the weight), NaN, +inf, then finite
} problem;
#define NO_EXT 0, 0, 0, 0, 0.0f, ATTN_DTYPE_F32, 0 // no window, ALiBi, soft-capping, sinks; float k and v

typedef struct data {
    float *q, *k, *v, *fmask, *fkpm;
    uint16_t *kh, *vh; // k and v in half precision (kvdt F16 / BF16)
    const void *kp, *vp; // what the calls get
    float *slopes, *sinks;
    uint8_t *bmask, *bkpm;
    attn_sdpa_desc d;
} data;


static data make_data(const problem *p, uint32_t seed) {
    data x;
    memset(&x, 0, sizeof x);
    const int64_t nq = p->B * p->H * p->L * p->D, nk = p->B * p->Hkv * p->S * p->D, nv = p->B * p->Hkv * p->S * p->Dv;
    const int64_t nm = p->B * p->H * p->L * p->S;
    x.q = malloc((size_t)nq * 4), x.k = malloc((size_t)nk * 4), x.v = malloc((size_t)nv * 4);
    x.fmask = malloc((size_t)nm * 4), x.bmask = malloc((size_t)nm);
    x.fkpm = malloc((size_t)(p->B * p->S) * 4), x.bkpm = malloc((size_t)(p->B * p->S));
    for (int64_t i = 0; i < nq; i++) x.q[i] = 4.0f * rand_unit(&seed) - 2.0f;
    for (int64_t i = 0; i < nk; i++) x.k[i] = 4.0f * rand_unit(&seed) - 2.0f;
    for (int64_t i = 0; i < nv; i++) x.v[i] = rand_sym(&seed);
    for (int64_t i = 0; i < nm; i++) {
        float u = rand_unit(&seed);
        x.bmask[i] = u < 0.2f;
        x.fmask[i] = u < 0.1f ? -INFINITY : 3.0f * rand_unit(&seed) - 1.5f;
    }
    for (int64_t i = 0; i < p->B * p->S; i++) {
        x.bkpm[i] = rand_unit(&seed) < 0.15f;
        x.fkpm[i] = rand_unit(&seed) < 0.1f ? -INFINITY : rand_unit(&seed) - 0.5f;
    }
    if (p->poison == 1) x.k[(p->S / 2) * p->D] = NAN;         // key S/2 of (b, hk) = (0, 0)
    if (p->poison == 2) x.v[(p->S - 1) * p->Dv] = INFINITY;   // last value of (0, 0)
    if (p->poison == 4) x.v[0] = INFINITY;                     // first value of (0, 0)
    x.kp = x.k, x.vp = x.v;
    attn_sdpa_desc *d = &x.d;
    attn_sdpa_desc_init(d);
    if (p->kvdt != ATTN_DTYPE_F32) {
        x.kh = malloc((size_t)nk * 2), x.vh = malloc((size_t)nv * 2);
        if (attn_convert(p->kvdt, x.kh, ATTN_DTYPE_F32, x.k, nk) != ATTN_OK ||
            attn_convert(p->kvdt, x.vh, ATTN_DTYPE_F32, x.v, nv) != ATTN_OK)
            FAIL("attn_convert to %s failed", attn_dtype_name(p->kvdt));
        x.kp = x.kh, x.vp = x.vh, d->kv_dtype = p->kvdt;
    }
    x.slopes = malloc((size_t)p->H * 4);
    static const float huge[4] = {FLT_MAX, 3e38f, 2.4e38f, 1e38f};
    for (int64_t h = 0; h < p->H; h++) x.slopes[h] = p->alibi == 2 ? huge[h % 4] : ldexpf(1.0f, -(int)(h + 1));
    if (p->alibi) d->alibi_slopes = x.slopes;
    x.sinks = malloc((size_t)p->H * 4);
    static const float odd[4] = {-INFINITY, 30.0f, NAN, INFINITY};
    for (int64_t h = 0; h < p->H; h++) x.sinks[h] = p->sinks == 2 && h < 4 ? odd[h] : 8.0f * rand_unit(&seed) - 3.0f;
    if (p->sinks) d->sinks = x.sinks;
    d->softcap = p->softcap;
    if (p->window) d->use_window = 1, d->window_left = p->wl, d->window_right = p->wr;
    d->batch = p->B, d->n_heads = p->H, d->n_kv_heads = p->Hkv, d->len_q = p->L, d->len_kv = p->S;
    d->head_dim = p->D, d->head_dim_v = p->Dv, d->scale = p->scale, d->causal = p->causal, d->dropout_p = p->dropout;
    attn_layout_strides(ATTN_LAYOUT_BHLD, p->B, p->H, p->L, p->D, d->q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, p->B, p->Hkv, p->S, p->D, d->k_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, p->B, p->Hkv, p->S, p->Dv, d->v_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, p->B, p->H, p->L, p->Dv, d->o_stride);
    const int64_t per_head[4] = {p->H * p->L * p->S, p->L * p->S, p->S, 1}, shared[4] = {0, 0, p->S, 1};
    if (p->poison == 3) { // row 0 of every head sees nothing
        for (int64_t b = 0; b < p->B * p->H; b++)
            for (int64_t j = 0; j < p->S; j++) x.bmask[b * p->L * p->S + j] = 1;
    }
    if (p->mask == 1 || p->mask == 3 || p->poison == 3) {
        d->mask = x.bmask, d->mask_dtype = ATTN_DTYPE_BOOL;
        memcpy(d->mask_stride, p->mask == 1 ? shared : per_head, sizeof per_head);
    } else if (p->mask == 2) {
        d->mask = x.fmask, d->mask_dtype = ATTN_DTYPE_F32;
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
    free(x->q), free(x->k), free(x->v), free(x->fmask), free(x->bmask), free(x->fkpm), free(x->bkpm);
    free(x->kh), free(x->vh), free(x->slopes), free(x->sinks);
}

// Runs d on ctx; out (B,H,L,Dv) and lse (B,H,L) allocated by the caller.
static void run(attn_ctx *ctx, const data *x, float *out, float *lse) {
    attn_generator_seed(attn_ctx_generator(ctx), 4242);
    attn_status st = attn_sdpa_fwd(ctx, &x->d, x->q, x->kp, x->vp, out, lse, NULL);
    if (st != ATTN_OK) FAIL("sdpa_fwd on %s: %s", attn_isa_name(attn_ctx_isa(ctx)), attn_ctx_last_error(ctx));
}

static long compared;

static void check_problem(const problem *p, uint32_t seed) {
    data x = make_data(p, seed);
    const int64_t no = p->B * p->H * p->L * p->Dv, nl = p->B * p->H * p->L;
    float *ref_o = malloc((size_t)no * 4), *ref_l = malloc((size_t)nl * 4);
    float *o1 = malloc((size_t)no * 4), *l1 = malloc((size_t)nl * 4), *o2 = malloc((size_t)no * 4),
          *l2 = malloc((size_t)nl * 4);
    attn_ctx *ref = make_ctx(ATTN_ISA_REF, 1);
    run(ref, &x, ref_o, ref_l);
    attn_ctx_free(ref);
    attn_isa isas[16];
    int n = fused_isas(isas);
    for (int ii = 0; ii < n; ii++) {
        attn_ctx *c1 = make_ctx(isas[ii], 1);
        run(c1, &x, o1, l1);
        attn_ctx_free(c1);
        for (int64_t i = 0; i < no; i++)
            if (isnan(ref_o[i]) != isnan(o1[i]))
                FAIL("%s: NaN pattern differs at %lld (B%lld H%lld/%lld L%lld S%lld D%lld Dv%lld causal %d mask %d "
                     "kpm %d poison %d)", attn_isa_name(isas[ii]), (long long)i, (long long)p->B, (long long)p->H,
                     (long long)p->Hkv, (long long)p->L, (long long)p->S, (long long)p->D, (long long)p->Dv,
                     p->causal, p->mask, p->kpm, p->poison);
        harness_assert_close(__FILE__, __LINE__, attn_isa_name(isas[ii]), o1, ref_o, no, 1e-6, 1e-5);
        harness_assert_close(__FILE__, __LINE__, "lse", l1, ref_l, nl, 1e-6, 1e-5);
        for (int threads = 2; threads <= 3; threads++) { // identical bits for every thread count
            attn_ctx *ct = make_ctx(isas[ii], threads);
            run(ct, &x, o2, l2);
            attn_ctx_free(ct);
            if (memcmp(o1, o2, (size_t)no * 4) != 0 || memcmp(l1, l2, (size_t)nl * 4) != 0)
                FAIL("%s: %d threads give different bits than 1 thread (L%lld S%lld D%lld)", attn_isa_name(isas[ii]),
                     threads, (long long)p->L, (long long)p->S, (long long)p->D);
        }
        compared++;
    }
    free(ref_o), free(ref_l), free(o1), free(l1), free(o2), free(l2);
    free_data(&x);
}

// Every (L, S) pair of the grid with head dims around the vector width, options cycling.
static void test_size_grid(void) {
    const int64_t sizes[6] = {1, 7, 63, 64, 65, 129};
    const int64_t dims[5][2] = {{1, 1}, {7, 7}, {64, 64}, {65, 33}, {16, 8}};
    int idx = 0;
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++, idx++) {
            const int64_t *dd = dims[idx % 5];
            problem p = {1 + idx % 2, 4, idx % 3 == 0 ? 1 : (idx % 3 == 1 ? 2 : 4), sizes[a], sizes[b], dd[0], dd[1],
                         (attn_causal)(idx % 3), (idx / 3) % 4, (idx / 2) % 3, idx % 4 == 0 ? 0.3f : 0.0f,
                         idx % 7 == 3 ? 0.25 : 0.0, 0, NO_EXT};
            check_problem(&p, (uint32_t)idx * 7919u + 1u);
        }
}

static void test_options(void) {
    // causal with L < S and L > S, each alignment, with and without masks
    const int64_t LS[4][2] = {{5, 130}, {130, 5}, {97, 200}, {200, 97}};
    for (int c = 0; c < 4; c++)
        for (int causal = 1; causal <= 2; causal++)
            for (int mask = 0; mask <= 2; mask += 2) {
                problem p = {2, 3, 3, LS[c][0], LS[c][1], 40, 24, (attn_causal)causal, mask, mask ? 1 : 0, 0.0f, 0.0, 0, NO_EXT};
                check_problem(&p, 99u + (uint32_t)(c * 10 + causal * 3 + mask));
            }
    // a long key sequence: many key tiles, online rescaling across them
    problem longp = {1, 2, 1, 33, 1000, 64, 64, ATTN_CAUSAL_NONE, 0, 0, 0.0f, 0.0, 0, NO_EXT};
    check_problem(&longp, 5u);
    // dropout with every mask kind, p = 1 included
    const double ps[3] = {0.1, 0.5, 1.0};
    for (int i = 0; i < 3; i++) {
        problem p = {2, 2, 2, 37, 70, 16, 16, ATTN_CAUSAL_TOP_LEFT, i, i % 3, 0.0f, ps[i], 0, NO_EXT};
        check_problem(&p, 11u + (uint32_t)i);
    }
}

// Local windows (tiles wholly outside skipped), ALiBi, soft-capping and half-precision k and v, alone
// and together with causal masks, masks, GQA and dropout; windows narrower than a tile, empty
// windows (fully masked rows), and windows on one side only.
static void test_window_alibi_softcap_half(void) {
    const int64_t win[7][2] = {{0, 0}, {3, 0}, {100, -1}, {-1, 5}, {17, 40}, {200, 200}, {1, 1}};
    int idx = 0;
    for (int w = 0; w < 7; w++)
        for (int causal = 0; causal <= 2; causal++, idx++) {
            problem p = {1 + idx % 2, 4, idx % 2 ? 2 : 4, idx % 3 ? 150 : 70, idx % 3 ? 260 : 130, 24 + idx % 3 * 20, 16,
                         (attn_causal)causal, (idx % 4 == 1) ? 2 : 0, idx % 5 == 2 ? 1 : 0, 0.0f,
                         idx % 6 == 5 ? 0.2 : 0.0, 0, 1, win[w][0], win[w][1], idx % 2, idx % 3 == 1 ? 5.0f : 0.0f,
                         (attn_dtype)(idx % 3 == 0 ? ATTN_DTYPE_F32 : idx % 3 == 1 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16),
                         0};
            check_problem(&p, 501u + (uint32_t)idx);
        }
    // each feature alone, and a key length far beyond the window (many skipped tiles)
    const attn_dtype dts[3] = {ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
    for (int t = 0; t < 3; t++) {
        problem half = {2, 2, 1, 65, 129, 64, 64, ATTN_CAUSAL_NONE, 0, 0, 0.0f, 0.0, 0, 0, 0, 0, 0, 0.0f, dts[t],
                        0};
        check_problem(&half, 601u + (uint32_t)t);
        problem cap = {1, 2, 2, 64, 64, 32, 32, (attn_causal)t, 0, 0, 0.0f, 0.0, 0, 0, 0, 0, 0, 1.5f, 0, 0};
        check_problem(&cap, 611u + (uint32_t)t);
        problem alibi = {1, 3, 1, 40, 90, 16, 16, (attn_causal)t, 0, 0, 0.0f, 0.0, 0, 0, 0, 0, 1, 0.0f, 0, 0};
        check_problem(&alibi, 621u + (uint32_t)t);
        problem longw = {1, 2, 2, 300, 2000, 32, 32, (attn_causal)t, 0, 0, 0.0f, 0.0, 0, 1, 64, t == 0 ? 64 : 0, 1,
                         0.0f, dts[t], 0};
        check_problem(&longw, 631u + (uint32_t)t);
    }
    // soft caps and slopes at the ends of float's range (the kernels work in log2 units: softcap *
    // log2(e), its inverse and slope * log2(e) must not overflow into inf * 0)
    static const float caps[4] = {FLT_MAX, 3e38f, 1e-39f, FLT_TRUE_MIN};
    for (int c = 0; c < 4; c++) {
        problem cap = {1, 2, 2, 33, 70, 16, 16, (attn_causal)(c % 3), 0, 0, 0.0f, 0.0, 0, 0, 0, 0, 0, caps[c], 0, 0};
        check_problem(&cap, 651u + (uint32_t)c);
    }
    for (int causal = 0; causal <= 2; causal++) {
        problem alibi = {1, 4, 2, 33, 70, 16, 16, (attn_causal)causal, 0, 0, 0.0f, 0.0, 0, 0, 0, 0, 2, 0.0f, 0, 0};
        check_problem(&alibi, 661u + (uint32_t)causal);
    }
    // NaN in a key the window hides, with half-precision k
    problem nanw = {1, 2, 2, 70, 130, 16, 16, ATTN_CAUSAL_NONE, 0, 0, 0.0f, 0.0, 1, 1, 2, 2, 0, 0.0f, ATTN_DTYPE_F16, 0};
    check_problem(&nanw, 641u);
}

// Value rows a multiple of 512 bytes apart (Dv = 128, 256), which the forward copies or converts
// into a tile with padded rows (flash_fwd.c's copies_v): float32, half precision, causal,
// masks, dropout, and an infinite value (the tile's zero-skipping P V on the copy); and the decoding
// path's wide tiles (group x L from 9 to 64 rows), which copy them the same way, and their key rows
// (as far apart) too.
static void test_value_rows_512(void) {
    for (int c = 0; c <= 2; c++) {
        problem p = {1, 2, 1, 130, 200, 128, 128, (attn_causal)c, c, c == 1 ? 1 : 0, 0.0f, c == 2 ? 0.2 : 0.0, 0, NO_EXT};
        check_problem(&p, 671u + (uint32_t)c);
    }
    problem wide = {2, 2, 2, 70, 100, 64, 256, ATTN_CAUSAL_NONE, 0, 0, 0.0f, 0.0, 0, NO_EXT};
    check_problem(&wide, 681u);
    for (int poison = 2; poison <= 4; poison += 2) {
        problem inf = {1, 2, 1, 40, 150, 128, 128, ATTN_CAUSAL_NONE, 0, 0, 0.0f, 0.0, poison, NO_EXT};
        check_problem(&inf, 683u + (uint32_t)poison);
    }
    problem half = {1, 2, 1, 70, 130, 128, 128, ATTN_CAUSAL_TOP_LEFT, 0, 0, 0.0f, 0.0, 0, 0, 0, 0, 0, 0.0f,
                    ATTN_DTYPE_F16, 0};
    check_problem(&half, 691u);
    for (int c = 0; c < 4; c++) { // 16 rows, one chunk; 64 rows, two chunks, bottom-right; inf; float16
        const attn_causal causal = c == 1 ? ATTN_CAUSAL_BOTTOM_RIGHT : ATTN_CAUSAL_NONE;
        problem dec = {1, 8, 2, c == 1 ? 16 : 4, c == 1 ? 1600 : 300, 128, 128, causal, 0, 0, 0.0f, 0.0, c == 2 ? 2 : 0,
                       0, 0, 0, 0, 0.0f, c == 3 ? ATTN_DTYPE_F16 : ATTN_DTYPE_F32, 0};
        check_problem(&dec, 695u + (uint32_t)c);
    }
}

// Attention sinks on every path that ends a softmax row: the tiled forward (fully masked rows from
// causal alignment, a mask or a window, dropout, half precision, ALiBi and soft-capping beside), the
// decoding path (one and several chunks), and sinks that take all the weight, none, or are NaN or
// +inf.
static void test_sinks(void) {
    for (int mode = 1; mode <= 2; mode++) {
        problem tiled = {2, 4, 2, 70, 130, 24, 16, ATTN_CAUSAL_NONE, 0, 0, 0.0f, 0.0, 0, 0, 0, 0, 0, 0.0f,
                         ATTN_DTYPE_F32, mode};
        check_problem(&tiled, 701u + (uint32_t)mode);
        problem below = {1, 4, 4, 140, 65, 16, 16, ATTN_CAUSAL_BOTTOM_RIGHT, 2, 1, 0.0f, 0.2, 0, 0, 0, 0, 0, 0.0f,
                         ATTN_DTYPE_F32, mode};
        check_problem(&below, 711u + (uint32_t)mode); // rows 0..74 see no key
        problem masked = {2, 4, 1, 33, 90, 16, 8, ATTN_CAUSAL_TOP_LEFT, 0, 0, 0.0f, 0.0, 3, 1, 2, 2, 1, 2.0f,
                          ATTN_DTYPE_BF16, mode}; // row 0 of every head fully masked
        check_problem(&masked, 721u + (uint32_t)mode);
        const int64_t Ss[3] = {1, 97, 5000};
        for (int si = 0; si < 3; si++) { // the decoding path: L * group rows at most 64
            problem dec = {2, 8, 2, si == 1 ? 3 : 1, Ss[si], 64, 64, (attn_causal)si, si == 2 ? 2 : 0, 0, 0.0f, 0.0, 0,
                           0, 0, 0, 0, 0.0f, ATTN_DTYPE_F32, mode};
            dec.kvdt = si == 1 ? ATTN_DTYPE_F16 : ATTN_DTYPE_F32;
            check_problem(&dec, 731u + (uint32_t)(mode * 3 + si));
        }
    }
}

// Few queries per kv head (the decoding path: the group's heads packed in one tile, the keys split
// in chunks of 1536 merged by log-sum-exp): one and several chunks, chunk edges, GQA groups up to 8,
// causal alignments, windows, masks, ALiBi, soft-capping, half precision, inf in a value, every
// row count of the narrow row kernels.
static void test_decode_shapes(void) {
    const int64_t Ss[5] = {1, 97, 1536, 1537, 5000};
    const int64_t shapes[4][3] = {{1, 8, 2}, {3, 8, 8}, {1, 32, 8}, {16, 4, 1}}; // L, H, Hkv
    int idx = 0;
    for (int si = 0; si < 5; si++)
        for (int sh = 0; sh < 4; sh++, idx++) {
            const int64_t L = shapes[sh][0], H = shapes[sh][1], Hkv = shapes[sh][2], S = Ss[si];
            problem p = {1 + idx % 2, H, Hkv, L, S, idx % 3 == 2 ? 37 : idx % 3 ? 64 : 40, idx % 3 ? 64 : 24,
                         (attn_causal)(idx % 3 == 1 ? ATTN_CAUSAL_BOTTOM_RIGHT : idx % 3 == 2 ? ATTN_CAUSAL_TOP_LEFT : 0),
                         idx % 5 == 3 ? 2 : 0, idx % 4 == 1 ? 1 : 0, 0.0f, 0.0, idx % 7 == 2 ? 2 : 0,
                         idx % 6 == 4, 700, 0, idx % 4 == 2, idx % 5 == 1 ? 3.0f : 0.0f,
                         (attn_dtype)(idx % 3 == 0 ? ATTN_DTYPE_F16 : idx % 3 == 1 ? ATTN_DTYPE_F32 : ATTN_DTYPE_BF16), 0};
            check_problem(&p, 801u + (uint32_t)idx);
        }
    // every packed row count of the row kernels (1 to 8: a block of four rows and a partial one, one
    // or two rows alone: decoding without GQA), with value widths that end in a partial vector and in
    // a partial block of columns, and head dims that end in a partial vector
    const int64_t rows_shapes[7][3] = {{2, 1, 1}, {1, 5, 1}, {2, 3, 1}, {1, 7, 1}, {1, 16, 2}, {1, 3, 3}, {1, 1, 1}};
    for (int c = 0; c < 7; c++) { // rows_shapes: L, H, Hkv
        problem p = {1, rows_shapes[c][1], rows_shapes[c][2], rows_shapes[c][0], 300, c < 5 ? 40 : 37, c % 2 ? 72 : 20,
                     ATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 0.0f, 0.0, 0, 0, 0, 0, 0, 0.0f,
                     (attn_dtype)(c % 3 == 0 ? ATTN_DTYPE_F32 : c % 3 == 1 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16), 0};
        check_problem(&p, 851u + (uint32_t)c);
    }
    // inf in the first value, which the window hides from every query: it shares its tile with keys
    // they see, and must not reach them
    for (int w = 0; w < 2; w++) {
        problem p = {1, 8, 2, 3, 50 + 2000 * w, 64, 64, ATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 0.0f, 0.0, 4,
                     1, 5 + 2000 * w, 0, 0, 0.0f, w ? ATTN_DTYPE_F16 : ATTN_DTYPE_F32, 0};
        check_problem(&p, 901u + (uint32_t)w);
    }
}

// A table's q . k rows for keys of type dt (the block types' kernel on q as its prep_q left it),
// into the compact tile (a key's four rows adjacent).
static void qk_rows_any(const attn__kernels *kn, attn_dtype dt, const void *k, int nj, int D, const void *q, int rows,
                        float *s) {
    if (attn__is_block_dtype(dt)) kn->qk_rows_q(dt, k, D, nj, D, q, rows, s, 1, 4);
    else kn->qk_rows(dt, k, D, nj, D, (const float *)q, rows, s, 1, 4);
}

// The decode row kernels' blocks of one and two rows (and of three, a four-row block with a row
// repeated) against the four-row block, on every table: a row's scores (qk_rows, and qk_rows_q on
// prep_q's form) and its P V sums (pv_rows, pv_rows_q) must be the same bits whatever the number of
// rows beside it, for float32, float16, bfloat16, Q8_0 and Q4_0 keys and values, head dims ending in
// a partial vector and value widths ending in a partial block. An ISA's other forms
// (attn__kernel_tables: the "avx512vnni" P V without AVX512-VBMI on a CPU with it) must give the
// first form's bits, scores and sums.
static void test_decode_rows_bits(void) {
    enum { NJ = 96, MAXD = 128, MAXDV = 288, NDIMS = 6 };
    // D, Dv: {37, 20} and {40, 200} float only; Dv = 224 and 288 take the quantised kernels' P V passes of
    // every width (8, 4, 2 and 1 blocks)
    const int dims[NDIMS][2] = {{64, 64}, {128, 96}, {37, 20}, {40, 200}, {96, 224}, {32, 288}};
    const attn_dtype dts[5] = {ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16, ATTN_DTYPE_Q8_0, ATTN_DTYPE_Q4_0};
    const int njs[2] = {NJ, 7};
    float *kf = malloc(sizeof(float) * NJ * MAXD), *vf = malloc(sizeof(float) * NJ * MAXDV);
    float *q = malloc(sizeof(float) * 4 * MAXD), *pt = malloc(sizeof(float) * NJ * 4), alpha[4];
    float *s4 = malloc(sizeof(float) * NJ * 4), *sr = malloc(sizeof(float) * NJ * 4);
    float *o4 = malloc(sizeof(float) * 4 * MAXDV), *orr = malloc(sizeof(float) * 4 * MAXDV);
    float *o0 = malloc(sizeof(float) * 4 * MAXDV), *s_first = malloc(sizeof(float) * NJ * 4);
    float *o_first = malloc(sizeof(float) * 4 * MAXDV);
    int forms_compared = 0;
    void *kx = malloc(sizeof(float) * NJ * MAXD), *vx = malloc(sizeof(float) * NJ * MAXDV);
    void *qp4 = aligned_alloc(64, (ATTN_QPREP_BYTES(4, MAXD) + 63) / 64 * 64);
    void *qpr = aligned_alloc(64, (ATTN_QPREP_BYTES(4, MAXD) + 63) / 64 * 64);
    uint32_t seed = 97;
    for (int i = 0; i < NJ * MAXD; i++) kf[i] = rand_sym(&seed);
    for (int i = 0; i < NJ * MAXDV; i++) vf[i] = rand_sym(&seed);
    for (int i = 0; i < 4 * MAXD; i++) q[i] = 2.0f * rand_sym(&seed);
    for (int i = 0; i < NJ * 4; i++) pt[i] = rand_unit(&seed);
    for (int i = 0; i < 4 * MAXDV; i++) o0[i] = rand_sym(&seed);
    for (int r = 0; r < 4; r++) alpha[r] = 0.25f + rand_unit(&seed);
    for (int isa = ATTN_ISA_GENERIC; isa <= ATTN_ISA_AVX512_VNNI; isa++) {
        const attn__kernels *forms[ATTN_MAX_ISA_TABLES];
        const int n_forms = attn__kernel_tables((attn_isa)isa, forms);
        for (int ti = 0; ti < 5; ti++)
            for (int di = 0; di < NDIMS; di++) {
                const attn_dtype dt = dts[ti];
                const bool block = attn__is_block_dtype(dt);
                const int D = dims[di][0], Dv = dims[di][1];
                if (block && (D % 32 || Dv % 32)) continue;
                if (block) {
                    attn__quantize(dt, kf, kx, (int64_t)NJ * D);
                    attn__quantize(dt, vf, vx, (int64_t)NJ * Dv);
                } else {
                    ASSERT_OK(attn_convert(dt, kx, ATTN_DTYPE_F32, kf, (int64_t)NJ * D));
                    ASSERT_OK(attn_convert(dt, vx, ATTN_DTYPE_F32, vf, (int64_t)NJ * Dv));
                }
                for (int ni = 0; ni < 2; ni++)
                    for (int fi = 0; fi < n_forms; fi++) {
                        const attn__kernels *kn = forms[fi];
                        const int nj = njs[ni];
                        // the four-row block: scores in the compact tile (a key's four rows adjacent)
                        const void *q4 = q, *qr = q;
                        if (block && kn->prep_q != NULL) {
                            kn->prep_q(dt, q, 4, D, qp4), q4 = qp4;
                        }
                        qk_rows_any(kn, dt, kx, nj, D, q4, 4, s4);
                        memcpy(o4, o0, sizeof(float) * 4 * Dv);
                        (block ? kn->pv_rows_q : kn->pv_rows)(dt, vx, Dv, nj, Dv, pt, 4, alpha, 4, o4, Dv);
                        if (fi == 0) {
                            memcpy(s_first, s4, sizeof(float) * (size_t)nj * 4);
                            memcpy(o_first, o4, sizeof(float) * 4 * (size_t)Dv);
                        } else {
                            forms_compared++;
                            for (int i = 0; i < nj * 4; i++) {
                                harness_checks++;
                                if (memcmp(&s4[i], &s_first[i], sizeof(float)) != 0)
                                    FAIL("%s qk_rows %s D %d: key %d row %d %.9g, %s %.9g", kn->name,
                                         attn_dtype_name(dt), D, i / 4, i % 4, s4[i], forms[0]->name, s_first[i]);
                            }
                            for (int i = 0; i < 4 * Dv; i++) {
                                harness_checks++;
                                if (memcmp(&o4[i], &o_first[i], sizeof(float)) != 0)
                                    FAIL("%s pv_rows %s Dv %d, %d keys: row %d column %d %.9g, %s %.9g", kn->name,
                                         attn_dtype_name(dt), Dv, nj, i / Dv, i % Dv, o4[i], forms[0]->name,
                                         o_first[i]);
                            }
                        }
                        for (int rows = 1; rows <= 3; rows++) {
                            if (block && kn->prep_q != NULL) {
                                kn->prep_q(dt, q, rows, D, qpr), qr = qpr;
                            }
                            for (int i = 0; i < NJ * 4; i++) sr[i] = NAN;
                            qk_rows_any(kn, dt, kx, nj, D, qr, rows, sr);
                            memcpy(orr, o0, sizeof(float) * 4 * Dv);
                            (block ? kn->pv_rows_q : kn->pv_rows)(dt, vx, Dv, nj, Dv, pt, 4, alpha, rows, orr, Dv);
                            for (int j = 0; j < nj; j++)
                                for (int r = 0; r < rows; r++) {
                                    harness_checks++;
                                    if (memcmp(&sr[j * 4 + r], &s4[j * 4 + r], sizeof(float)) != 0)
                                        FAIL("%s qk_rows %s D %d, %d rows: key %d row %d %.9g, four rows %.9g",
                                             kn->name, attn_dtype_name(dt), D, rows, j, r, sr[j * 4 + r],
                                             s4[j * 4 + r]);
                                }
                            for (int r = 0; r < rows; r++)
                                for (int e = 0; e < Dv; e++) {
                                    harness_checks++;
                                    if (memcmp(&orr[r * Dv + e], &o4[r * Dv + e], sizeof(float)) != 0)
                                        FAIL("%s pv_rows %s Dv %d, %d rows: row %d column %d %.9g, four rows %.9g",
                                             kn->name, attn_dtype_name(dt), Dv, rows, r, e, orr[r * Dv + e],
                                             o4[r * Dv + e]);
                                }
                            for (int r = rows; r < 4; r++) // rows past `rows` untouched
                                for (int e = 0; e < Dv; e++)
                                    if (memcmp(&orr[r * Dv + e], &o0[r * Dv + e], sizeof(float)) != 0)
                                        FAIL("%s pv_rows %s, %d rows: wrote row %d", kn->name, attn_dtype_name(dt),
                                             rows, r);
                        }
                    }
            }
    }
    free(kf), free(vf), free(q), free(pt), free(s4), free(sr), free(o4), free(orr), free(o0), free(kx), free(vx);
    free(qp4), free(qpr), free(s_first), free(o_first);
    printf("decode rows: %d comparisons of an ISA's second kernel form with its first\n", forms_compared);
}

// Half-precision k and v against float32 ones: the first-order bound of attn.h,
// |out_half - out_f32| <= (exp(2 delta) - 1 + u) max|v| with delta = u scale sum_t |q_t| max|k_t|
// (u = 2^-11 for F16, 2^-8 for BF16), holds on every row, for the reference and the fused kernels.
static void test_half_error_bound(void) {
    const attn_dtype dts[2] = {ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
    const double units[2] = {0x1p-11, 0x1p-8};
    for (int t = 0; t < 2; t++) {
        problem p = {2, 4, 2, 50, 300, 64, 64, ATTN_CAUSAL_NONE, 0, 0, 0.0f, 0.0, 0, NO_EXT};
        data x = make_data(&p, 4711u + (uint32_t)t);
        const int64_t no = p.B * p.H * p.L * p.Dv, nk = p.B * p.Hkv * p.S * p.D, nv = p.B * p.Hkv * p.S * p.Dv;
        uint16_t *kh = malloc((size_t)nk * 2), *vh = malloc((size_t)nv * 2);
        ASSERT_OK(attn_convert(dts[t], kh, ATTN_DTYPE_F32, x.k, nk));
        ASSERT_OK(attn_convert(dts[t], vh, ATTN_DTYPE_F32, x.v, nv));
        float *o32 = malloc((size_t)no * 4), *o16 = malloc((size_t)no * 4);
        double kmax = 0, vmax = 0;
        for (int64_t i = 0; i < nk; i++) kmax = fmax(kmax, fabs(x.k[i]));
        for (int64_t i = 0; i < nv; i++) vmax = fmax(vmax, fabs(x.v[i]));
        const attn_isa isas[2] = {ATTN_ISA_REF, ATTN_ISA_AUTO};
        for (int ii = 0; ii < 2; ii++) {
            attn_ctx *ctx = make_ctx(isas[ii], 2);
            ASSERT_OK(attn_sdpa_fwd(ctx, &x.d, x.q, x.k, x.v, o32, NULL, NULL));
            attn_sdpa_desc dh = x.d;
            dh.kv_dtype = dts[t];
            ASSERT_OK(attn_sdpa_fwd(ctx, &dh, x.q, kh, vh, o16, NULL, NULL));
            double worst_ratio = 0;
            for (int64_t r = 0; r < p.B * p.H * p.L; r++) {
                double qsum = 0;
                for (int64_t c = 0; c < p.D; c++) qsum += fabs(x.q[r * p.D + c]);
                const double delta = units[t] * (1.0 / sqrt((double)p.D)) * qsum * kmax;
                const double bound = (exp(2 * delta) - 1 + units[t]) * vmax;
                for (int64_t c = 0; c < p.Dv; c++) {
                    const double err = fabs((double)o16[r * p.Dv + c] - o32[r * p.Dv + c]);
                    harness_checks++;
                    if (!(err <= bound))
                        FAIL("%s k/v on %s: row %lld error %.3g exceeds the bound %.3g", attn_dtype_name(dts[t]),
                             attn_isa_name(attn_ctx_isa(ctx)), (long long)r, err, bound);
                    worst_ratio = fmax(worst_ratio, err / bound);
                }
            }
            fprintf(stderr, "    %s k/v on %s: largest error %.2f of the bound\n", attn_dtype_name(dts[t]),
                    attn_isa_name(attn_ctx_isa(ctx)), worst_ratio);
            attn_ctx_free(ctx);
        }
        free(kh), free(vh), free(o32), free(o16);
        free_data(&x);
    }
}

static void test_non_finite_and_fully_masked(void) {
    // causal 2 (bottom-right, L < S): the last key is seen by the last query only, so an inf in its
    // value must reach that row alone although its key tile is shared with rows that hide it.
    // The inf in the last value also with float16 and bfloat16 values (each type's scan of the value
    // tiles for non-finite elements).
    const attn_dtype dts[3] = {ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
    for (int poison = 1; poison <= 3; poison++)
        for (int causal = 0; causal <= 2; causal++)
            for (int t = 0; t < (poison == 2 ? 3 : 1); t++) {
                problem p = {1, 2, 2, 70, 130, 16, 16, (attn_causal)causal, 0, poison == 2 ? 1 : 0, 0.0f, 0.0, poison, NO_EXT};
                p.kvdt = dts[t];
                check_problem(&p, 31u + (uint32_t)(poison * 2 + causal));
            }
    fprintf(stderr, "    %ld kernel runs compared with the reference\n", compared);
}

// Float mask terms past the kernels' log2 domain (attn.h, the note before attn_causal): a key whose
// mask entry is near FLT_MAX takes its row's whole weight, as in the reference (NaN rows before
// the terms were clamped), and the row's lse is the reference's up to FLT_MAX ln 2. Rows of one
// query (the decoding path) and of several (the forward), on every fused ISA; the backward's
// gradients are the reference's from the table's lse and from the reference's.
static void test_float_mask_past_log2_range(void) {
    const int64_t H = 2, S = 200, D = 16;
    const float top = (float)((double)FLT_MAX * 0.6931471805599453);
    attn_isa isas[16];
    const int n = fused_isas(isas);
    for (int64_t L = 1; L <= 3; L += 2) {
        uint32_t seed = 5u + (uint32_t)L;
        const size_t nq = (size_t)(H * L * D), nk = (size_t)(H * S * D), nm = (size_t)(H * L * S);
        float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *m = malloc(nm * 4), *dout = malloc(nq * 4);
        for (size_t i = 0; i < nq; i++) q[i] = rand_sym(&seed), dout[i] = rand_sym(&seed);
        for (size_t i = 0; i < nk; i++) k[i] = rand_sym(&seed), v[i] = rand_sym(&seed);
        for (size_t i = 0; i < nm; i++) m[i] = rand_sym(&seed);
        m[5] = FLT_MAX;                      // head 0, row 0
        m[L * S + 150] = 3e38f;              // head 1, row 0 (another key tile)
        if (L > 1) m[S + 70] = 2.5e38f;      // head 0, row 1
        attn_sdpa_desc d;
        attn_sdpa_desc_init(&d);
        d.batch = 1, d.n_heads = H, d.len_q = L, d.len_kv = S, d.head_dim = D;
        attn_layout_strides(ATTN_LAYOUT_BHLD, 1, H, L, D, d.q_stride);
        attn_layout_strides(ATTN_LAYOUT_BHLD, 1, H, S, D, d.k_stride);
        attn_layout_strides(ATTN_LAYOUT_BHLD, 1, H, S, D, d.v_stride);
        attn_layout_strides(ATTN_LAYOUT_BHLD, 1, H, L, D, d.o_stride);
        attn_layout_strides(ATTN_LAYOUT_BHLD, 1, H, L, S, d.mask_stride);
        d.mask = m, d.mask_dtype = ATTN_DTYPE_F32;
        float ro[2 * 3 * 16], rl[2 * 3], o[2 * 3 * 16], l[2 * 3];
        // the reference's gradients (its own lse) and a fused table's: [0] dq, [1] dk, [2] dv, [3] dmask
        float *rg[4] = {malloc(nq * 4), malloc(nk * 4), malloc(nk * 4), malloc(nm * 4)};
        float *g[4] = {malloc(nq * 4), malloc(nk * 4), malloc(nk * 4), malloc(nm * 4)};
        const size_t gn[4] = {nq, nk, nk, nm};
        attn_ctx *ref = make_ctx(ATTN_ISA_REF, 1);
        ASSERT_OK(attn_sdpa_fwd(ref, &d, q, k, v, ro, rl, NULL));
        ASSERT_OK(attn_sdpa_bwd(ref, &d, q, k, v, ro, dout, rl, NULL, rg[0], rg[1], rg[2], rg[3]));
        attn_ctx_free(ref);
        ASSERT_TRUE(rl[0] > top); // the reference's lse past the kernels' range
        for (int ii = 0; ii < n; ii++) {
            attn_ctx *ctx = make_ctx(isas[ii], 2);
            ASSERT_OK(attn_sdpa_fwd(ctx, &d, q, k, v, o, l, NULL));
            for (int64_t r = 0; r < H * L; r++) {
                const float want_l = rl[r] > top ? top : rl[r];
                if (!(fabsf(l[r] - want_l) <= 1e-6f * fabsf(want_l) + 1e-5f))
                    FAIL("%s L=%lld: lse of row %lld %.9g, want %.9g", attn_isa_name(isas[ii]), (long long)L, (long long)r,
                         (double)l[r], (double)want_l);
                for (int64_t e = 0; e < D; e++)
                    if (!(fabsf(o[r * D + e] - ro[r * D + e]) <= 1e-5f))
                        FAIL("%s L=%lld: out (%lld, %lld) %.9g, want %.9g", attn_isa_name(isas[ii]), (long long)L,
                             (long long)r, (long long)e, (double)o[r * D + e], (double)ro[r * D + e]);
            }
            // the backward from this table's forward (lse clamped) and from the reference's (lse past
            // the range: the backward clamps it as the forward clamps the scores)
            for (int from_ref = 0; from_ref <= 1; from_ref++) {
                ASSERT_OK(attn_sdpa_bwd(ctx, &d, q, k, v, from_ref ? ro : o, dout, from_ref ? rl : l, NULL, g[0], g[1],
                                        g[2], g[3]));
                for (int t = 0; t < 4; t++)
                    for (size_t e = 0; e < gn[t]; e++)
                        if (!(fabsf(g[t][e] - rg[t][e]) <= 1e-5f))
                            FAIL("%s L=%lld, lse of %s: %s[%zu] %.9g, want %.9g", attn_isa_name(isas[ii]), (long long)L,
                                 from_ref ? "the reference" : "the table", (const char *[]){"dq", "dk", "dv", "dmask"}[t],
                                 e, (double)g[t][e], (double)rg[t][e]);
            }
            attn_ctx_free(ctx);
        }
        for (int t = 0; t < 4; t++) free(rg[t]), free(g[t]);
        free(q), free(k), free(v), free(m), free(dout);
    }
}

// attn_linear (both weight layouts, sizes around the GEMM's 64-row and 96/192-feature blocks) and a
// full nn.MultiheadAttention forward on every ISA against the reference; bits equal across threads.
static void linear_and_modules(void);

// Both with CBLAS (where this build has it) and with the library's own GEMM on every ISA.
static void test_linear_and_modules(void) {
    for (use_blas = 0; use_blas <= 1; use_blas++) linear_and_modules();
    use_blas = 1;
}

static void linear_and_modules(void) {
    const int64_t shapes[][3] = {{1, 7, 5},       {3, 768, 500},  {8, 37, 200},  {63, 64, 97},
                                 {65, 130, 193}, {130, 768, 200}, {200, 33, 384}}; // rows <= 8: the dot-product path
    attn_isa isas[16];
    int n = fused_isas(isas);
    uint32_t seed = 17;
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int64_t rows = shapes[c][0], in = shapes[c][1], out = shapes[c][2];
        float *x = malloc((size_t)(rows * in) * 4), *w = malloc((size_t)(in * out) * 4), *b = malloc((size_t)out * 4);
        float *want = malloc((size_t)(rows * out) * 4), *got = malloc((size_t)(rows * out) * 4),
              *got3 = malloc((size_t)(rows * out) * 4);
        for (int64_t i = 0; i < rows * in; i++) x[i] = rand_unit(&seed) - 0.5f;
        for (int64_t i = 0; i < in * out; i++) w[i] = rand_unit(&seed) - 0.5f;
        for (int64_t i = 0; i < out; i++) b[i] = rand_unit(&seed);
        for (int layout = 0; layout < 2; layout++) {
            attn_ctx *ref = make_ctx(ATTN_ISA_REF, 1);
            ASSERT_OK(attn_linear(ref, x, rows, in, w, (attn_weight_layout)layout, b, out, want));
            attn_ctx_free(ref);
            for (int ii = 0; ii < n; ii++) {
                attn_ctx *c1 = make_ctx(isas[ii], 1), *c3 = make_ctx(isas[ii], 3);
                ASSERT_OK(attn_linear(c1, x, rows, in, w, (attn_weight_layout)layout, b, out, got));
                ASSERT_OK(attn_linear(c3, x, rows, in, w, (attn_weight_layout)layout, b, out, got3));
                harness_assert_close(__FILE__, __LINE__, attn_isa_name(isas[ii]), got, want, rows * out, 1e-5, 1e-5);
                ASSERT_BITS_EQ(got, got3, rows * out);
                attn_ctx_free(c1), attn_ctx_free(c3);
            }
        }
        free(x), free(w), free(b), free(want), free(got), free(got3);
    }
    // nn.MultiheadAttention with every feature that changes the pipeline
    const int64_t E = 96, H = 4, L = 70, S = 45, N = 2;
    attn_ctx *ref = make_ctx(ATTN_ISA_REF, 1);
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, E, H);
    cfg.add_bias_kv = 1, cfg.add_zero_attn = 1, cfg.kdim = 40, cfg.batch_first = 1;
    attn_mha *m;
    ASSERT_OK(attn_mha_create(ref, &cfg, &m));
    float *q = malloc((size_t)(N * L * E) * 4), *k = malloc((size_t)(N * S * 40) * 4), *v = malloc((size_t)(N * S * E) * 4);
    for (int64_t i = 0; i < N * L * E; i++) q[i] = rand_unit(&seed) - 0.5f;
    for (int64_t i = 0; i < N * S * 40; i++) k[i] = rand_unit(&seed) - 0.5f;
    for (int64_t i = 0; i < N * S * E; i++) v[i] = rand_unit(&seed) - 0.5f;
    uint8_t *kpm = calloc((size_t)(N * S), 1);
    for (int64_t i = 0; i < N * S; i++) kpm[i] = rand_unit(&seed) < 0.2f;
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = q, a.key = k, a.value = v, a.batch = N, a.len_q = L, a.len_kv = S, a.need_weights = 0;
    a.key_padding_mask = kpm, a.key_padding_mask_dtype = ATTN_DTYPE_BOOL;
    float *want = malloc((size_t)(N * L * E) * 4), *got = malloc((size_t)(N * L * E) * 4);
    ASSERT_OK(attn_mha_forward(ref, m, &a, want, NULL));
    for (int ii = 0; ii < n; ii++) {
        attn_ctx *c2 = make_ctx(isas[ii], 2);
        ASSERT_OK(attn_mha_forward(c2, m, &a, got, NULL));
        harness_assert_close(__FILE__, __LINE__, attn_isa_name(isas[ii]), got, want, N * L * E, 1e-5, 1e-5);
        attn_ctx_free(c2);
    }
    fprintf(stderr, "    linear and MHA on %d ISAs agree with the reference (use_blas %d, CBLAS in this build: %s)\n",
            n, use_blas, attn_has_blas() ? "yes" : "no");
    free(q), free(k), free(v), free(kpm), free(want), free(got);
    attn_mha_free(m);
    attn_ctx_free(ref);
}

// The few-rows linear map (decoding's projections) with float16 and bfloat16 weights read as they
// are (attn__linear_half, what a half-precision module's cached forward runs): the same bits as the
// float32 map on the weights widened, on every fused table, 1 and 3 threads, rows 1 to 8, x at a
// row stride wider than in (the rows packed first) and not.
static void test_linear_half_weights(void) {
    const int64_t shapes[][3] = {{1, 7, 5}, {3, 768, 500}, {8, 37, 200}, {5, 64, 193}}; // rows, in, out
    const attn_dtype types[2] = {ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
    attn_isa isas[16];
    const int n = fused_isas(isas);
    const int saved_blas = use_blas;
    use_blas = 0; // the float32 map's own products (BLAS would sum in its own order)
    uint32_t seed = 23;
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++)
        for (int t = 0; t < 2; t++) {
            const int64_t rows = shapes[c][0], in = shapes[c][1], out = shapes[c][2], ldx = in + (int64_t)c % 2 * 3;
            const attn_dtype dt = types[t];
            float *x = malloc((size_t)(rows * ldx) * 4), *w = malloc((size_t)(out * in) * 4), *b = malloc((size_t)out * 4);
            uint16_t *h = malloc((size_t)(out * in) * 2);
            float *want = malloc((size_t)(rows * out) * 4), *got = malloc((size_t)(rows * out) * 4);
            for (int64_t i = 0; i < rows * ldx; i++) x[i] = rand_unit(&seed) - 0.5f;
            for (int64_t i = 0; i < out * in; i++) w[i] = rand_unit(&seed) - 0.5f;
            for (int64_t i = 0; i < out; i++) b[i] = rand_unit(&seed);
            ASSERT_OK(attn_convert(dt, h, ATTN_DTYPE_F32, w, out * in));
            ASSERT_OK(attn_convert(ATTN_DTYPE_F32, w, dt, h, out * in)); // w: the half weights widened
            for (int ii = 0; ii < n; ii++)
                for (int threads = 1; threads <= 3; threads += 2) {
                    attn_ctx *ctx = make_ctx(isas[ii], threads);
                    ASSERT_TRUE(attn__linear_half_applies(ctx, dt, rows, in));
                    void *ws = malloc(attn__linear_workspace(ctx, in));
                    ASSERT_TRUE(ws != NULL);
                    attn__linear(ctx, x, rows, in, ldx, w, false, b, out, want, out, ws);
                    memset(got, 0xFF, (size_t)(rows * out) * 4);
                    attn__linear_half(ctx, x, rows, in, ldx, h, dt, b, out, got, out, ws);
                    ASSERT_BITS_EQ(got, want, rows * out);
                    free(ws);
                    attn_ctx_free(ctx);
                }
            free(x), free(w), free(b), free(h), free(want), free(got);
        }
    attn_ctx *ref = make_ctx(ATTN_ISA_REF, 1); // no kernels: the map needs its float32 weights
    ASSERT_TRUE(!attn__linear_half_applies(ref, ATTN_DTYPE_BF16, 1, 16));
    attn_ctx_free(ref);
    use_blas = saved_blas;
}

// The linear map with bfloat16 weights on the bf16 dot products (attn__linear_half past the few
// rows, what a bf16 module's projections run on AVX512-BF16 and AMX-BF16): against double sums of
// the exact products on x rounded to bf16, within (in + 2) 2^-24 of the terms' absolute sum plus the
// instructions' flushing (gemm.h); the same bits on 1 and 3 threads; rows past a 64-row block, odd
// out, in not a multiple of 16, x at a wider row stride; and where the path does not apply.
static void test_linear_bf16_dot(void) {
    const int64_t shapes[][3] = {{9, 2, 5}, {64, 768, 200}, {130, 38, 97}, {65, 96, 193}, {12, 30, 1}}; // rows, in, out
    attn_isa isas[16];
    const int n = fused_isas(isas);
    uint32_t seed = 31;
    int ran = 0;
    for (int ii = 0; ii < n; ii++) {
        attn_ctx *probe = make_ctx(isas[ii], 1);
        ASSERT_TRUE(!attn__linear_half_applies(probe, ATTN_DTYPE_F16, 9, 64));
        ASSERT_TRUE(!attn__linear_half_applies(probe, ATTN_DTYPE_BF16, 9, 63));
        ASSERT_EQ_INT(attn__linear_half_applies(probe, ATTN_DTYPE_BF16, 9, 64), attn_isa_bf16_dot(isas[ii]) != 0);
        attn_ctx_free(probe);
        if (!attn_isa_bf16_dot(isas[ii])) continue;
        for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
            const int64_t rows = shapes[c][0], in = shapes[c][1], out = shapes[c][2], ldx = in + (int64_t)c % 2 * 3;
            float *x = malloc((size_t)(rows * ldx) * 4), *b = malloc((size_t)out * 4);
            uint16_t *w = malloc((size_t)(out * in) * 2);
            float *got = malloc((size_t)(rows * out) * 4), *got3 = malloc((size_t)(rows * out) * 4);
            for (int64_t i = 0; i < rows * ldx; i++) x[i] = 4.0f * rand_unit(&seed) - 2.0f; // rounded by the map
            for (int64_t i = 0; i < out * in; i++) w[i] = attn__f32_to_bf16(rand_unit(&seed) - 0.5f);
            for (int64_t i = 0; i < out; i++) b[i] = rand_unit(&seed);
            for (int threads = 1; threads <= 3; threads += 2) {
                attn_ctx *ctx = make_ctx(isas[ii], threads);
                ASSERT_TRUE(attn__linear_half_applies(ctx, ATTN_DTYPE_BF16, rows, in));
                void *ws = malloc(attn__linear_workspace(ctx, in));
                ASSERT_TRUE(ws != NULL);
                float *y = threads == 1 ? got : got3;
                memset(y, 0xFF, (size_t)(rows * out) * 4);
                attn__linear_half(ctx, x, rows, in, ldx, w, ATTN_DTYPE_BF16, c % 2 ? b : NULL, out, y, out, ws);
                free(ws);
                attn_ctx_free(ctx);
            }
            ASSERT_BITS_EQ(got3, got, rows * out);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t o = 0; o < out; o++) {
                    double want = c % 2 ? b[o] : 0.0, abs = c % 2 ? fabs(b[o]) : 0.0, wa = 0.0;
                    for (int64_t i = 0; i < in; i++) {
                        const double t = (double)attn__bf16_to_f32(attn__f32_to_bf16(x[r * ldx + i])) *
                                         attn__bf16_to_f32(w[o * in + i]);
                        want += t, abs += fabs(t), wa += fabs(attn__bf16_to_f32(w[o * in + i]));
                    }
                    const double bound = (double)(in + 2) * 0x1p-24 * abs + 0x1p-126 * (wa + 2.0 * (double)in + 2.0);
                    const double e = fabs(got[r * out + o] - want);
                    harness_checks++;
                    if (!(e <= bound))
                        FAIL("%s rows %lld in %lld: y[%lld][%lld] = %.9g, want %.9g (error %.3g > %.3g)",
                             attn_isa_name(isas[ii]), (long long)rows, (long long)in, (long long)r, (long long)o,
                             got[r * out + o], want, e, bound);
                }
            free(x), free(b), free(w), free(got), free(got3);
        }
        ran++;
    }
    if (ran == 0) SKIP("no instruction set with bf16 dot products on this CPU");
}

// The exponential of the softmax: relative error against exp2 in double over [-126, 128] at most
// 1.2e-7 (about 1 ulp) on every table, exact 0 for -inf and far below
// the float range, exact 1 at 0, +inf past 128, NaN kept.
static void test_exp2_error_bound(void) {
    const attn_isa isas[4] = {ATTN_ISA_GENERIC, ATTN_ISA_AVX2, ATTN_ISA_AVX512};
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    for (int t = 0; t < 3; t++) {
        bool ok;
        const attn__kernels *kn = attn__kernels_for(isas[t], &ok);
        if (!ok) continue;
        double worst = 0;
        for (int pass = 0; pass < 4; pass++) {
            for (int i = 0; i < N; i++) x[i] = -126.0f + 254.0f * ((float)i + 0.25f * (float)pass) / (float)N;
            kn->exp2(x, y, N);
            for (int i = 0; i < N; i++) {
                double want = exp2((double)x[i]), err = fabs((double)y[i] - want) / want;
                if (!(err <= worst)) worst = err;
            }
        }
        const double bound = 1.2e-7;
        fprintf(stderr, "    exp2 %-8s max relative error %.3g on [-126, 128] (bound %.2g)\n", kn->name, worst, bound);
        if (!(worst <= bound)) FAIL("%s exp2: relative error %.3g exceeds %.2g", kn->name, worst, bound);
        const float special[7] = {-INFINITY, -1000.0f, -151.0f, 0.0f, 129.0f, INFINITY, NAN};
        float out[7];
        kn->exp2(special, out, 7);
        ASSERT_TRUE(out[0] == 0.0f && out[1] == 0.0f && out[2] == 0.0f && out[3] == 1.0f);
        ASSERT_TRUE(isinf(out[4]) && out[4] > 0 && isinf(out[5]) && isnan(out[6]));
    }
    free(x), free(y);
}

// The float P V of every table against double sums: ot[d][i] = alpha[i] ot[d][i] + sum_j v[j][d]
// st[j][i] for output rows Dv from 1 to 13, 64 and 97 (the register blocks and their remainders),
// tiles of 16 to 128 columns (32-column blocks and a 16-column tail), value rows in place (vs_d = 1)
// or strided (a transposed layout), the rows of st and ot br or br + 16 floats apart (the padding
// columns NaN: neither read, which would make sums NaN, nor written).
static void test_pv_blocks(void) {
    const int dvs[15] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 64, 97}, brs[4] = {16, 32, 48, 128}, njs[3] = {1, 7, 96};
    const int maxdv = 97, maxbr = 128, maxnj = 96, maxld = maxbr + 16;
    float *v = malloc(sizeof(float) * maxnj * maxdv), *s0 = malloc(sizeof(float) * maxnj * maxbr);
    float *st = aligned_alloc(64, sizeof(float) * maxnj * maxld), *ot = aligned_alloc(64, sizeof(float) * maxdv * maxld);
    float *o0 = malloc(sizeof(float) * maxdv * maxbr);
    _Alignas(64) float alpha[128];
    uint32_t seed = 11;
    for (int i = 0; i < maxnj * maxdv; i++) v[i] = rand_sym(&seed);
    for (int i = 0; i < maxnj * maxbr; i++) s0[i] = rand_unit(&seed);
    for (int i = 0; i < maxdv * maxbr; i++) o0[i] = rand_sym(&seed);
    for (int i = 0; i < maxbr; i++) alpha[i] = i % 5 == 0 ? 0.0f : rand_unit(&seed);
    for (int isa = ATTN_ISA_GENERIC; isa <= ATTN_ISA_AMX_BF16; isa++) {
        bool ok;
        const attn__kernels *kn = attn__kernels_for((attn_isa)isa, &ok);
        if (!ok) continue;
        for (int di = 0; di < 15; di++)
            for (int bi = 0; bi < 4; bi++)
                for (int ni = 0; ni < 3; ni++)
                    for (int layout = 0; layout < 4; layout++) {
                        const int Dv = dvs[di], br = brs[bi], nj = njs[ni], ld = layout < 2 ? br : br + 16;
                        const int64_t vs_row = layout % 2 == 0 ? Dv : 1, vs_d = layout % 2 == 0 ? 1 : nj;
                        for (int r = 0; r < nj; r++)
                            for (int i = 0; i < ld; i++) st[r * ld + i] = i < br ? s0[r * br + i] : NAN;
                        for (int r = 0; r < Dv; r++)
                            for (int i = 0; i < ld; i++) ot[r * ld + i] = i < br ? o0[r * br + i] : NAN;
                        kn->pv(v, vs_row, vs_d, nj, Dv, st, br, ld, alpha, ot);
                        for (int d = 0; d < Dv; d++)
                            for (int i = 0; i < ld; i++) {
                                if (i >= br) {
                                    if (!isnan(ot[d * ld + i])) FAIL("%s pv ld %d: wrote padding ot[%d][%d]", kn->name, ld, d, i);
                                    continue;
                                }
                                double want = (double)alpha[i] * o0[d * br + i], mag = fabs(want);
                                for (int j = 0; j < nj; j++) {
                                    const double p = (double)v[j * vs_row + d * vs_d] * s0[j * br + i];
                                    want += p, mag += fabs(p);
                                }
                                harness_checks++;
                                if (!(fabs(ot[d * ld + i] - want) <= (nj + 2) * 0x1p-24 * mag))
                                    FAIL("%s pv Dv %d br %d ld %d nj %d vs_d %lld: ot[%d][%d] = %.9g, want %.9g", kn->name,
                                         Dv, br, ld, nj, (long long)vs_d, d, i, (double)ot[d * ld + i], want);
                            }
                    }
    }
    free(v), free(s0), free(st), free(ot), free(o0);
}

// The scratch arena: sizing (no base) and carving take the same bytes; every piece is aligned,
// inside the size and after the one before; pieces of 4 KiB or more, here all multiples of 4 KiB as
// the tiles are, start at addresses modulo 4096 that differ from those of the 63 such pieces before
// (attn__arena_take).
static void test_arena_pieces(void) {
    enum { N = 200 };
    size_t sizes[N];
    for (int i = 0; i < N; i++) sizes[i] = i % 3 == 1 ? (size_t)(24 + i) : (size_t)(1 + i % 4) * 4096;
    attn__arena sz = {0};
    for (int i = 0; i < N; i++) harness_checks++, (void)attn__arena_take(&sz, sizes[i]);
    char *base = aligned_alloc(4096, (sz.used + 4095) / 4096 * 4096);
    if (base == NULL) FAIL("out of memory");
    attn__arena a = {.base = base};
    int large = 0;
    size_t large_mod[N], end = 0;
    for (int i = 0; i < N; i++) {
        const size_t at = (size_t)((char *)attn__arena_take(&a, sizes[i]) - base);
        harness_checks++;
        if (at % ATTN_ALIGN != 0 || at < end || at + sizes[i] > sz.used)
            FAIL("arena piece %d (%zu bytes) at %zu: the one before ends at %zu, size %zu", i, sizes[i], at, end, sz.used);
        end = at + sizes[i];
        if (sizes[i] < 4096) continue;
        for (int k = 0; k < large && k < 63; k++) {
            harness_checks++;
            if (large_mod[large - 1 - k] == at % 4096)
                FAIL("arena pieces of 4 KiB or more %d apart start at the same address modulo 4096 (%zu)", k + 1, at % 4096);
        }
        large_mod[large++] = at % 4096;
    }
    harness_checks++;
    if (a.used != sz.used) FAIL("arena: carved %zu bytes, sized %zu", a.used, sz.used);
    free(base);
}

// The float product of every table (cpu.h's gemm, which every float tile product and P V run on)
// against double sums: every row count from 1 to 13 and 64 and 97 (the register blocks and each
// remainder of them), A read by rows (a_cs = 1) and by columns (a_rs = 1), sums started from 0 over
// a NaN-poisoned C and accumulated onto C; the columns past N of each row of C stay untouched.
static void test_gemm_blocks(void) {
    const int ms[15] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 64, 97}, ks[3] = {1, 7, 64}, ns[2] = {16, 48};
    const int maxm = 97, maxk = 64, ldb = 64, ldc = 64;
    float *A = malloc(sizeof(float) * maxm * maxk), *B = malloc(sizeof(float) * maxk * ldb);
    float *C = malloc(sizeof(float) * maxm * ldc), *C0 = malloc(sizeof(float) * maxm * ldc);
    uint32_t seed = 7;
    for (int i = 0; i < maxm * maxk; i++) A[i] = rand_sym(&seed);
    for (int i = 0; i < maxk * ldb; i++) B[i] = rand_sym(&seed);
    for (int i = 0; i < maxm * ldc; i++) C0[i] = rand_sym(&seed);
    for (int isa = ATTN_ISA_GENERIC; isa <= ATTN_ISA_AMX_BF16; isa++) {
        bool ok;
        const attn__kernels *kn = attn__kernels_for((attn_isa)isa, &ok);
        if (!ok) continue;
        for (int mi = 0; mi < 15; mi++)
            for (int ki = 0; ki < 3; ki++)
                for (int ni = 0; ni < 2; ni++)
                    for (int layout = 0; layout < 2; layout++)
                        for (int acc = 0; acc < 2; acc++) {
                            const int M = ms[mi], K = ks[ki], N = ns[ni];
                            const int64_t a_rs = layout == 0 ? K : 1, a_cs = layout == 0 ? 1 : M;
                            for (int i = 0; i < M * ldc; i++) C[i] = acc || i % ldc >= N ? C0[i] : NAN;
                            kn->gemm(A, a_rs, a_cs, M, K, B, ldb, N, C, ldc, acc != 0);
                            for (int m = 0; m < M; m++)
                                for (int n = 0; n < ldc; n++) {
                                    const float got = C[m * ldc + n];
                                    harness_checks++;
                                    if (n >= N) {
                                        if (attn__f32_bits(got) != attn__f32_bits(C0[m * ldc + n]))
                                            FAIL("%s gemm M%d K%d N%d: C[%d][%d] past N written", kn->name, M, K, N, m, n);
                                        continue;
                                    }
                                    double want = acc ? C0[m * ldc + n] : 0.0, mag = fabs(want);
                                    for (int k = 0; k < K; k++) {
                                        const double p = (double)A[m * a_rs + k * a_cs] * B[k * ldb + n];
                                        want += p, mag += fabs(p);
                                    }
                                    if (!(fabs(got - want) <= (K + 2) * 0x1p-24 * mag))
                                        FAIL("%s gemm M%d K%d N%d a_rs %lld acc %d: C[%d][%d] = %.9g, want %.9g", kn->name,
                                             M, K, N, (long long)a_rs, acc, m, n, (double)got, want);
                                }
                        }
    }
    free(A), free(B), free(C), free(C0);
}

// The online softmax kernel of every table against double precision, on wide tiles (br a multiple
// of 16) and the compact tiles of decoding (br 4 and 8): scores in [-2, 2] with one key per column
// 300 higher (at a different key in each column, so only each column's maximum over all of the
// tile's keys keeps exp2 finite), a column hidden so far and in this tile (m and every score
// -inf: weights and alpha 0), -inf scores, and tiles of 1 to 97 keys; the wide tiles' rows also
// br + 16 floats apart, the padding columns NaN (neither read nor written).
static void test_softmax_tiles(void) {
    const attn_isa isas[3] = {ATTN_ISA_GENERIC, ATTN_ISA_AVX2, ATTN_ISA_AVX512};
    const int brs[4] = {4, 8, 16, 32}, njs[5] = {1, 2, 3, 7, 97};
    float *st = aligned_alloc(64, 97 * 48 * sizeof(float)), *s0 = malloc(97 * 32 * sizeof(float));
    _Alignas(64) float m[32], l[32], alpha[32];
    float m0[32], l0[32];
    uint32_t seed = 99;
    for (int t = 0; t < 3; t++) {
        bool ok;
        const attn__kernels *kn = attn__kernels_for(isas[t], &ok);
        if (!ok) continue;
        for (int bi = 0; bi < 8; bi++)
            for (int ni = 0; ni < 5; ni++) {
                const int br = brs[bi % 4], nj = njs[ni], ld = bi < 4 ? br : br + 16;
                if (ld != br && br < 16) continue; // compact tiles: ld = br
                for (int i = 0; i < br; i++) {
                    m0[i] = i % 3 == 0 ? -INFINITY : 4.0f * rand_unit(&seed) - 2.0f;
                    l0[i] = m0[i] == -INFINITY ? 0.0f : 1.0f + rand_unit(&seed);
                }
                m0[1] = -INFINITY, l0[1] = 0.0f;
                for (int j = 0; j < nj; j++)
                    for (int i = 0; i < br; i++) {
                        float x = 4.0f * rand_unit(&seed) - 2.0f;
                        if (j == (i * 3 + 1) % nj) x += 300.0f;
                        if (i == 1 || (j + i) % 11 == 5) x = -INFINITY;
                        s0[j * br + i] = x;
                    }
                for (int j = 0; j < nj; j++)
                    for (int i = 0; i < ld; i++) st[j * ld + i] = i < br ? s0[j * br + i] : NAN;
                memcpy(m, m0, sizeof m), memcpy(l, l0, sizeof l);
                kn->softmax(st, nj, br, ld, m, l, alpha);
                for (int j = 0; j < nj; j++)
                    for (int i = br; i < ld; i++)
                        if (!isnan(st[j * ld + i])) FAIL("%s softmax br %d ld %d: wrote padding [%d][%d]", kn->name, br, ld, j, i);
                for (int i = 0; i < br; i++) {
                    double mx = m0[i];
                    for (int j = 0; j < nj; j++) mx = fmax(mx, s0[j * br + i]);
                    const double base = mx == -INFINITY ? 0.0 : mx, a = exp2((double)m0[i] - base);
                    double sum = 0;
                    for (int j = 0; j < nj; j++) {
                        const double p = exp2((double)s0[j * br + i] - base);
                        sum += p;
                        harness_checks++;
                        if (!(fabs(st[j * ld + i] - p) <= 1e-6 * p + 0x1p-126)) // below 2^-126: 0
                            FAIL("%s softmax br %d ld %d nj %d: weight [%d][%d] %.9g, want %.9g", kn->name, br, ld, nj, j,
                                 i, (double)st[j * ld + i], p);
                    }
                    const double lw = a * l0[i] + sum;
                    harness_checks++;
                    if (!((float)mx == m[i] && fabs(alpha[i] - a) <= 1e-6 * a + 0x1p-126 && fabs(l[i] - lw) <= 1e-6 * lw))
                        FAIL("%s softmax br %d nj %d column %d: m %g alpha %g l %g, want %g %g %g", kn->name, br, nj,
                             i, (double)m[i], (double)alpha[i], (double)l[i], mx, a, lw);
                }
            }
    }
    free(st), free(s0);
}

// The bf16 dot-product primitives of the tables that have them (cpu.h), against plain C: the pairing
// of float rows rounded to bf16 (to nearest even, ties to even, NaN kept, a missing odd row 0), of
// bf16 rows (a tail of columns past 16, zero padding), and gemm_bf16 with and without rowscale over
// edge sizes (M not a multiple of 6, N of 16, 32 and 80 columns) against double sums of the pairs.
static uint16_t bf16_of(float x) {
    uint16_t h;
    if (attn_convert(ATTN_DTYPE_BF16, &h, ATTN_DTYPE_F32, &x, 1) != ATTN_OK) FAIL("attn_convert");
    return h;
}
static double f_of_bf16(uint16_t h) {
    float f;
    if (attn_convert(ATTN_DTYPE_F32, &f, ATTN_DTYPE_BF16, &h, 1) != ATTN_OK) FAIL("attn_convert");
    return f;
}

static void test_bf16_primitives(void) {
    int tables = 0;
    for (int isa = ATTN_ISA_GENERIC; isa <= ATTN_ISA_AVX512_VNNI; isa++) {
        bool ok;
        const attn__kernels *kn = attn__kernels_for((attn_isa)isa, &ok);
        if (!ok || kn->gemm_bf16 == NULL) continue;
        tables++;
        uint32_t seed = 7;
        // pack_pairs_bf16: 5 rows of 32 (the sixth row missing), ties and specials in row 0
        enum { R = 5, N = 32 };
        float x[R * N];
        for (int i = 0; i < R * N; i++) x[i] = rand_sym(&seed) * 3.0f;
        x[0] = 1.0f + 0x1p-8f;          // a tie: to 1 (even)
        x[1] = 1.0f + 3 * 0x1p-8f;      // a tie: to 1 + 2^-6 (even)
        x[2] = NAN, x[3] = INFINITY, x[4] = 0.0f, x[5] = -0.0f;
        uint16_t y[(R + 1) * N];
        memset(y, 0xab, sizeof y);
        kn->pack_pairs_bf16(x, N, R, N, y);
        for (int r = 0; r < R + 1; r++)
            for (int c = 0; c < N; c++) {
                const uint16_t got = y[2 * ((r / 2) * N + c) + r % 2];
                if (r == R) {
                    ASSERT_TRUE(got == 0);
                    continue;
                }
                const float v = x[r * N + c];
                if (isnan(v)) ASSERT_TRUE(isnan(f_of_bf16(got)));
                else if (got != bf16_of(v)) FAIL("%s pack_pairs_bf16 row %d col %d: 0x%04x, want 0x%04x", kn->name, r, c, got, bf16_of(v));
            }
        ASSERT_TRUE(y[0] == 0x3f80 && y[2] == 0x3f82);
        // pair_rows_bf16: 3 rows of 19 values (row stride 23) into 32 columns
        uint16_t v[3 * 23], w[4 * 32];
        for (int i = 0; i < 3 * 23; i++) v[i] = (uint16_t)(1 + i);
        memset(w, 0xab, sizeof w);
        kn->pair_rows_bf16(v, 23, 3, 19, 32, w);
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 32; c++) {
                const uint16_t want = r < 3 && c < 19 ? v[r * 23 + c] : 0;
                if (w[2 * ((r / 2) * 32 + c) + r % 2] != want) FAIL("%s pair_rows_bf16 row %d col %d", kn->name, r, c);
            }
        // transpose_pairs_bf16: 19 rows of 40 pairs (two blocks of 16 and 8 more) into 32 columns, times
        // 2^k: exact moves of the exponent, and through float where values are or become subnormal,
        // overflow, or are zero, inf or NaN
        if (kn->transpose_pairs_bf16 != NULL) {
            enum { TR = 19, TP = 40, TW = 32, TLD = 2 * TP + 6 };
            uint16_t tx[TR * TLD], ty[TP * TW * 2];
            for (int i = 0; i < TR * TLD; i++) tx[i] = bf16_of(rand_sym(&seed) * 8.0f);
            tx[0] = 0x0001, tx[1] = 0x0080, tx[2] = 0x7f7f, tx[3] = 0x7fc1, tx[4] = 0xff80, tx[5] = 0x8000;
            tx[TLD + 40] = 0x0003, tx[5 * TLD + 77] = 0x7f00; // in the remainder pairs
            const int ks[3] = {0, -3, 5};
            for (int ki = 0; ki < 3; ki++) {
                memset(ty, 0xab, sizeof ty);
                kn->transpose_pairs_bf16(tx, TLD, TR, TP, TW, ks[ki], ty);
                for (int e = 0; e < TP; e++)
                    for (int i = 0; i < TW; i++)
                        for (int t = 0; t < 2; t++) {
                            const uint16_t got = ty[2 * (e * TW + i) + t];
                            if (i >= TR) {
                                if (got != 0) FAIL("%s transpose_pairs_bf16 padding column %d: 0x%04x", kn->name, i, got);
                                continue;
                            }
                            const double want = ldexp(f_of_bf16(tx[i * TLD + 2 * e + t]), ks[ki]);
                            if (isnan(want)) ASSERT_TRUE(isnan(f_of_bf16(got)));
                            else if (got != bf16_of((float)want))
                                FAIL("%s transpose_pairs_bf16 k %d row %d pair %d.%d: 0x%04x, want 0x%04x", kn->name, ks[ki], i,
                                     e, t, got, bf16_of((float)want));
                        }
            }
        }
        // scale_to_bf16: 37 values (two vectors and a tail) with ties, subnormal results, overflow and NaN
        if (kn->scale_to_bf16 != NULL) {
            float sx[37];
            uint16_t sy[37];
            for (int i = 0; i < 37; i++) sx[i] = rand_sym(&seed) * 4.0f;
            sx[0] = 1.0f + 0x1p-8f, sx[1] = 1.0f + 3 * 0x1p-8f, sx[2] = 0x1p-130f, sx[3] = 3e38f, sx[4] = NAN;
            sx[5] = -INFINITY, sx[6] = -0.0f, sx[7] = 0x1.8p-133f, sx[36] = 0x1p-128f;
            const float scales[2] = {1.0f, 1.75f};
            for (int si = 0; si < 2; si++) {
                kn->scale_to_bf16(sx, 37, scales[si], sy);
                for (int i = 0; i < 37; i++) {
                    const float want = sx[i] * scales[si];
                    if (isnan(want)) ASSERT_TRUE(isnan(f_of_bf16(sy[i])));
                    else if (sy[i] != bf16_of(want))
                        FAIL("%s scale_to_bf16 x[%d] = %a times %g: 0x%04x, want 0x%04x", kn->name, i, sx[i], scales[si],
                             sy[i], bf16_of(want));
                }
            }
        }
        // softmax_pairs_bf16 against softmax then pack_pairs_bf16: the same bits, for an odd key count
        // and columns with hidden keys, a running maximum, and nothing seen yet; then with spans of
        // keys per 16 columns (the scores outside them -inf): odd and even ends, an empty span, a
        // span of one key, the whole tile; softmax_pairs_bf16's scores in rows SL apart (the padding
        // NaN, unread)
        if (kn->softmax_pairs_bf16 != NULL) {
            enum { SJ = 7, SB = 32, SL = SB + 16 };
            const int32_t spans[4][4] = {{2, 5, 1, 7}, {0, 0, 6, 7}, {3, 4, 0, 7}, {4, 6, 3, 3}};
            for (int sv = 0; sv <= 4; sv++) { // sv == 4: no span
                const int32_t *span = sv < 4 ? spans[sv] : NULL;
                _Alignas(64) float s1[SJ * SB], s2[SJ * SL], m1[SB], m2[SB], l1[SB], l2[SB], a1[SB], a2[SB];
                uint16_t p1[(SJ + 1) * SB], p2[(SJ + 1) * SB];
                for (int i = 0; i < SJ * SB; i++) s1[i] = i % 11 == 3 ? -INFINITY : rand_sym(&seed) * 20.0f;
                for (int i = 0; i < SB; i++) {
                    m1[i] = m2[i] = i % 4 == 0 ? -INFINITY : rand_sym(&seed) * 10.0f;
                    l1[i] = l2[i] = m1[i] == -INFINITY ? 0.0f : rand_unit(&seed) * 3.0f;
                }
                for (int i = 0; i < SJ; i++) s1[i * SB + 5] = -INFINITY; // a column hiding every key
                for (int j = 0; j < SJ && span != NULL; j++)
                    for (int i = 0; i < SB; i++)
                        if (j < span[2 * (i / 16)] || j >= span[2 * (i / 16) + 1]) s1[j * SB + i] = -INFINITY;
                for (int j = 0; j < SJ; j++)
                    for (int i = 0; i < SL; i++) s2[j * SL + i] = i < SB ? s1[j * SB + i] : NAN;
                memset(p1, 0xab, sizeof p1), memset(p2, 0xcd, sizeof p2);
                kn->softmax(s1, SJ, SB, SB, m1, l1, a1);
                kn->pack_pairs_bf16(s1, SB, SJ, SB, p1);
                kn->softmax_pairs_bf16(s2, SJ, SB, SL, m2, l2, a2, p2, span);
                ASSERT_TRUE(memcmp(p1, p2, sizeof(uint16_t) * (SJ + 1) * SB) == 0);
                ASSERT_TRUE(memcmp(m1, m2, sizeof m1) == 0 && memcmp(l1, l2, sizeof l1) == 0 && memcmp(a1, a2, sizeof a1) == 0);
            }
            // every running max finite: columns 0-15's scores pass theirs by at most 8 (the first try
            // stands: m kept, alpha 1, weights 2^(s - m) within bf16's rounding, l their sum added),
            // one of columns 16-31 passes its max by more (the same bits as softmax then pack); with
            // keys [1, 6) of columns 0-15 in a span
            for (int sv = 0; sv < 2; sv++) {
                const int32_t span[4] = {1, 6, 0, SJ};
                _Alignas(64) float s1[SJ * SB], s2[SJ * SB], m1[SB], m2[SB], l1[SB], l2[SB], a1[SB], a2[SB];
                uint16_t p1[(SJ + 1) * SB], p2[(SJ + 1) * SB];
                for (int i = 0; i < SB; i++) m1[i] = m2[i] = rand_sym(&seed) * 10.0f, l1[i] = l2[i] = 1.0f + rand_unit(&seed);
                for (int j = 0; j < SJ; j++)
                    for (int i = 0; i < SB; i++) {
                        float sc = m1[i] + 8.0f - 30.0f * rand_unit(&seed);
                        if (j == 2 && i == 17) sc = m1[i] + 8.5f;
                        if (j == 3 && i == 4) sc = m1[i] + 8.0f; // at the limit
                        if (j == 5 && i == 6) sc = -INFINITY;
                        if (sv == 1 && i < 16 && (j < span[0] || j >= span[1])) sc = -INFINITY;
                        s1[j * SB + i] = s2[j * SB + i] = sc;
                    }
                memset(p1, 0xab, sizeof p1), memset(p2, 0xcd, sizeof p2);
                kn->softmax(s1, SJ, SB, SB, m1, l1, a1);
                kn->pack_pairs_bf16(s1, SB, SJ, SB, p1);
                const float m_old[16] = {m2[0], m2[1], m2[2], m2[3], m2[4], m2[5], m2[6], m2[7], m2[8], m2[9], m2[10],
                                         m2[11], m2[12], m2[13], m2[14], m2[15]};
                const float l_old[16] = {l2[0], l2[1], l2[2], l2[3], l2[4], l2[5], l2[6], l2[7], l2[8], l2[9], l2[10],
                                         l2[11], l2[12], l2[13], l2[14], l2[15]};
                kn->softmax_pairs_bf16(s2, SJ, SB, SB, m2, l2, a2, p2, sv == 1 ? span : NULL);
                for (int i = 0; i < 16; i++) {
                    ASSERT_TRUE(m2[i] == m_old[i] && a2[i] == 1.0f);
                    double sum = 0.0;
                    for (int j = 0; j < SJ + 1; j++) {
                        const double want = j < SJ ? exp2((double)s2[j * SB + i] - (double)m_old[i]) : 0.0;
                        const double got = f_of_bf16(p2[2 * ((j / 2) * SB + i) + j % 2]);
                        sum += want;
                        if (!(fabs(got - want) <= 0x1p-8 * want))
                            FAIL("%s softmax_pairs_bf16 first try: column %d key %d: %.9g, want %.9g", kn->name, i, j, got, want);
                    }
                    if (!(fabs((double)l2[i] - ((double)l_old[i] + sum)) <= 1e-6 * ((double)l_old[i] + sum)))
                        FAIL("%s softmax_pairs_bf16 first try: l of column %d %.9g, want %.9g", kn->name, i, (double)l2[i],
                             (double)l_old[i] + sum);
                }
                for (int j = 0; j < (SJ + 1) / 2; j++)
                    ASSERT_TRUE(memcmp(p1 + 2 * (j * SB + 16), p2 + 2 * (j * SB + 16), 16 * 2 * sizeof(uint16_t)) == 0);
                ASSERT_TRUE(memcmp(m1 + 16, m2 + 16, 64) == 0 && memcmp(l1 + 16, l2 + 16, 64) == 0 && memcmp(a1 + 16, a2 + 16, 64) == 0);
            }
        }
        // gemm_bf16 against double sums of the same pairs, A's pairs contiguous (a_ps = 2) or A itself
        // packed in pairs (a_rs = 2), sizes past one 32 x 32 block and past 128 pairs
        const int Ms[4] = {1, 7, 13, 40}, Ns[3] = {16, 32, 80}, K2s[4] = {1, 5, 40, 150};
        for (int mi = 0; mi < 4; mi++)
            for (int ni = 0; ni < 3; ni++)
                for (int ki = 0; ki < 4; ki++)
                    for (int variant = 0; variant < 4; variant++) {
                        const int M = Ms[mi], Nn = Ns[ni], K2 = K2s[ki], with_scale = variant & 1, paired = variant >> 1;
                        const int64_t a_rs = paired ? 2 : 2 * K2 + 3, a_ps = paired ? 2 * (M + 3) : 2;
                        const int64_t a_len = paired ? K2 * a_ps : M * a_rs, ldb = Nn + 16, ldc = Nn + 5;
                        uint16_t *A = malloc((size_t)a_len * 2), *B = malloc((size_t)(K2 * 2 * ldb) * 2);
                        float *C = malloc((size_t)(M * ldc) * 4), *C0 = malloc((size_t)(M * ldc) * 4), rs[40];
                        for (int i = 0; i < a_len; i++) A[i] = bf16_of(rand_sym(&seed));
                        for (int i = 0; i < K2 * 2 * ldb; i++) B[i] = bf16_of(rand_sym(&seed));
                        for (int i = 0; i < M * ldc; i++) C[i] = C0[i] = rand_sym(&seed);
                        for (int m = 0; m < M; m++) rs[m] = rand_unit(&seed);
                        const float scale = 0.75f;
                        kn->gemm_bf16(A, a_rs, a_ps, M, K2, B, ldb, Nn, C, ldc, with_scale ? rs : NULL, scale);
                        for (int m = 0; m < M; m++)
                            for (int n = 0; n < ldc; n++) {
                                const int64_t at = (int64_t)m * ldc + n;
                                if (n >= Nn) { // past N: untouched
                                    ASSERT_TRUE(C[at] == C0[at]);
                                    continue;
                                }
                                double sum = 0, mag = 0;
                                for (int e = 0; e < K2; e++)
                                    for (int t = 0; t < 2; t++) {
                                        const double p = f_of_bf16(A[m * a_rs + e * a_ps + t]) * f_of_bf16(B[2 * (e * ldb + n) + t]);
                                        sum += p, mag += fabs(p);
                                    }
                                const double want = (with_scale ? rs[m] * (double)C0[at] : 0.0) + scale * sum;
                                const double tol = 0x1p-22 * (2 * K2 + 2) * (scale * mag + (with_scale ? fabs(C0[at]) : 0.0));
                                if (!(fabs(C[at] - want) <= tol))
                                    FAIL("%s gemm_bf16 M%d N%d K2 %d rowscale %d a_ps %lld: C[%d][%d] = %.9g, want %.9g",
                                         kn->name, M, Nn, K2, with_scale, (long long)a_ps, m, n, C[at], want);
                            }
                        free(A), free(B), free(C), free(C0);
                    }
    }
    if (tables == 0) SKIP("no kernel table with bf16 dot products on this CPU (make test-emu512 emulates one)");
    fprintf(stderr, "    %d kernel tables with bf16 dot products checked\n", tables);
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__SSE__)
// Fails when MXCSR's underflow (0x10) or denormal-operand (0x02) flag is set, which `call` raised
// since the six sticky exception flags were cleared; clears them for the next call.
static void assert_no_denormal_flags(const char *isa, bool bf16, bool causal, const char *call) {
    const unsigned flags = _mm_getcsr();
    _mm_setcsr(flags & ~0x3Fu);
    if (flags & 0x12u)
        FAIL("%s %s %s %s: MXCSR flags %#x (0x10 underflow, 0x02 denormal operand)", isa, bf16 ? "bf16" : "f32", call,
             causal ? "causal" : "window", flags & 0x3Fu);
}
#endif

// No denormal is computed by a causal or windowed forward and backward on normal inputs, float32 and
// bf16, on any table (one thread: the x86 MXCSR flags are the calling thread's): the masked keys'
// -inf and the far keys' tiny weights must give exact zeros without making a denormal on the way,
// which Intel's cores pay for with a microcode assist each (the AVX-512 exp2 once took a causal
// forward's time up by a third so). The underflow and denormal-operand flags must stay clear.
static void test_no_denormals(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__SSE__)
    enum { H = 2, L = 301, D = 64, N = H * L * D };
    float *x[4], *o = malloc(sizeof(float) * N), *lse = malloc(sizeof(float) * H * L); // x: q, k, v, dout
    float *g[3] = {malloc(sizeof(float) * N), malloc(sizeof(float) * N), malloc(sizeof(float) * N)};
    uint16_t *h[4]; // x in bf16
    uint32_t seed = 71;
    for (int t = 0; t < 4; t++) {
        x[t] = malloc(sizeof(float) * N), h[t] = malloc(sizeof(uint16_t) * N);
        for (int i = 0; i < N; i++) x[t][i] = (t == 0 ? 4.0f : 1.0f) * rand_sym(&seed);
        ASSERT_OK(attn_convert(ATTN_DTYPE_BF16, h[t], ATTN_DTYPE_F32, x[t], N));
    }
    for (int isa = ATTN_ISA_GENERIC; isa <= ATTN_ISA_AVX512_VNNI; isa++) {
        if (!attn_isa_supported((attn_isa)isa)) continue;
        attn_ctx *ctx = make_ctx((attn_isa)isa, 1);
        const char *name = attn_isa_name((attn_isa)isa);
        for (int c = 0; c < 4; c++) {
            attn_sdpa_desc d;
            attn_sdpa_desc_init(&d);
            d.batch = 1, d.n_heads = H, d.len_q = L, d.len_kv = L, d.head_dim = D;
            attn_layout_strides(ATTN_LAYOUT_BHLD, 1, H, L, D, d.q_stride);
            memcpy(d.k_stride, d.q_stride, sizeof d.q_stride), memcpy(d.v_stride, d.q_stride, sizeof d.q_stride);
            memcpy(d.o_stride, d.q_stride, sizeof d.q_stride);
            const bool causal = c % 2 == 0;
            d.causal = causal ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
            if (!causal) d.use_window = 1, d.window_left = 40, d.window_right = 7;
            const bool bf16 = c >= 2; // the bf16 tensors' kernels (bf16 dot products where the table has them)
            if (bf16) d.q_dtype = d.out_dtype = d.grad_dtype = ATTN_DTYPE_BF16, d.kv_dtype = ATTN_DTYPE_BF16;
            const void *in[4];
            for (int t = 0; t < 4; t++) in[t] = bf16 ? (const void *)h[t] : (const void *)x[t];
            _mm_setcsr(_mm_getcsr() & ~0x3Fu); // the six sticky exception flags
            ASSERT_OK(attn_sdpa_fwd(ctx, &d, in[0], in[1], in[2], o, lse, NULL));
            assert_no_denormal_flags(name, bf16, causal, "forward");
            ASSERT_OK(attn_sdpa_bwd(ctx, &d, in[0], in[1], in[2], o, in[3], lse, NULL, g[0], g[1], g[2], NULL));
            assert_no_denormal_flags(name, bf16, causal, "backward");
        }
        attn_ctx_free(ctx);
    }
    for (int t = 0; t < 4; t++) free(x[t]), free(h[t]);
    free(o), free(lse), free(g[0]), free(g[1]), free(g[2]);
#else
    SKIP("the exception flags read here are x86's MXCSR");
#endif
}

// AUTO's rule on the capabilities of CPUs it meets: the first of AMX_BF16, AVX512_BF16 (where the
// bf16 dot product is not slow), AVX512_VNNI, AVX512, AVX2, GENERIC that the CPU runs.
static void test_auto_isa_rule(void) {
    static const struct {
        attn__isa_caps caps;
        attn_isa want;
    } cases[] = {
        {{false, false, false, false, false, false}, ATTN_ISA_GENERIC},         // no x86 kernels
        {{true, false, false, false, false, false}, ATTN_ISA_AVX2},             // Zen 3, Haswell
        {{true, false, false, false, false, true}, ATTN_ISA_AVX2},              // an Intel with AVX2
        {{true, true, false, false, false, true}, ATTN_ISA_AVX512},             // Skylake-X
        {{true, true, true, false, false, true}, ATTN_ISA_AVX512_VNNI},         // Ice Lake
        {{true, true, true, true, false, false}, ATTN_ISA_AVX512_BF16},         // Zen 4, Zen 5
        {{true, true, true, true, false, true}, ATTN_ISA_AVX512_VNNI},          // Sapphire Rapids, no tiles
        {{true, true, true, true, true, true}, ATTN_ISA_AMX_BF16},              // Sapphire Rapids, tiles
        {{true, true, true, true, true, false}, ATTN_ISA_AMX_BF16},             // tiles first anywhere
        {{false, false, false, true, false, true}, ATTN_ISA_GENERIC},           // (bf16 alone: slow, nothing else)
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) ASSERT_EQ_INT(attn__auto_isa(&cases[i].caps), cases[i].want);
}

static void test_isa_requests(void) {
    ASSERT_TRUE(attn_isa_supported(ATTN_ISA_AUTO) && attn_isa_supported(ATTN_ISA_REF) &&
                attn_isa_supported(ATTN_ISA_GENERIC));
    attn_ctx *ctx = make_ctx(ATTN_ISA_GENERIC, 1);
    ASSERT_EQ_INT(attn_ctx_isa(ctx), ATTN_ISA_GENERIC);
    attn_ctx_free(ctx);
    // AUTO: the rule's choice on this CPU's capabilities, which are what attn_isa_supported says, an
    // Intel CPU's bf16 dot product counted slow (not in the emulated build)
    attn__isa_caps now;
    attn__isa_caps_now(&now);
    ASSERT_EQ_INT(now.avx2, attn_isa_supported(ATTN_ISA_AVX2));
    ASSERT_EQ_INT(now.avx512, attn_isa_supported(ATTN_ISA_AVX512));
    ASSERT_EQ_INT(now.avx512_vnni, attn_isa_supported(ATTN_ISA_AVX512_VNNI));
    ASSERT_EQ_INT(now.avx512_bf16, attn_isa_supported(ATTN_ISA_AVX512_BF16));
    ASSERT_EQ_INT(now.amx_bf16, attn_isa_supported(ATTN_ISA_AMX_BF16));
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(ATTN_EMULATE_AVX512)
    __builtin_cpu_init();
    ASSERT_EQ_INT(now.slow_bf16_dot, __builtin_cpu_is("intel") != 0);
#else
    ASSERT_TRUE(!now.slow_bf16_dot);
#endif
    ctx = make_ctx(ATTN_ISA_AUTO, 1);
    ASSERT_EQ_INT(attn_ctx_isa(ctx), attn__auto_isa(&now));
    // a table with bf16 dot products also runs every AVX-512 kernel and the VNNI q.k: it is offered
    // only with them
    if (attn_isa_supported(ATTN_ISA_AVX512_BF16)) ASSERT_TRUE(attn_isa_supported(ATTN_ISA_AVX512_VNNI));
    if (attn_isa_supported(ATTN_ISA_AVX512_VNNI)) ASSERT_TRUE(attn_isa_supported(ATTN_ISA_AVX512));
    if (attn_isa_supported(ATTN_ISA_AMX_BF16)) ASSERT_TRUE(attn_isa_supported(ATTN_ISA_AVX512_BF16));
    for (int isa = ATTN_ISA_AUTO; isa <= ATTN_ISA_AVX512_VNNI; isa++)
        ASSERT_EQ_INT(attn_isa_bf16_dot((attn_isa)isa), isa == ATTN_ISA_AVX512_BF16 || isa == ATTN_ISA_AMX_BF16);
    for (int isa = ATTN_ISA_AUTO; isa <= ATTN_ISA_AVX512_VNNI; isa++)
        ASSERT_EQ_INT(attn_isa_int8_query((attn_isa)isa), isa == ATTN_ISA_AVX2 || isa == ATTN_ISA_AVX512_VNNI ||
                                                              isa == ATTN_ISA_AVX512_BF16 || isa == ATTN_ISA_AMX_BF16);
    attn_ctx_free(ctx);
    ctx = make_ctx(ATTN_ISA_REF, 1);
    ASSERT_EQ_INT(attn_ctx_isa(ctx), ATTN_ISA_REF);
    attn_ctx_free(ctx);
    ASSERT_TRUE(strcmp(attn_isa_name(ATTN_ISA_AVX2), "avx2") == 0);
    ASSERT_TRUE(strcmp(attn_isa_name(ATTN_ISA_AVX512_BF16), "avx512bf16") == 0);
    ASSERT_TRUE(strcmp(attn_isa_name(ATTN_ISA_AMX_BF16), "amxbf16") == 0);
    ASSERT_TRUE(strcmp(attn_isa_name(ATTN_ISA_AVX512_VNNI), "avx512vnni") == 0);
    ASSERT_TRUE(strcmp(attn_isa_name((attn_isa)(ATTN_ISA_AVX512_VNNI + 1)), "?") == 0);
    // names back to values: each of ATTN_ISA_NAMES ("a, b, ... or z") is the name of the value in its
    // place, and nothing else parses
    char list[] = ATTN_ISA_NAMES;
    int named = 0;
    for (char *t = strtok(list, ", "); t != NULL; t = strtok(NULL, ", ")) {
        if (strcmp(t, "or") == 0) continue;
        attn_isa isa = (attn_isa)99;
        ASSERT_OK(attn_isa_from_name(t, &isa));
        ASSERT_TRUE(strcmp(attn_isa_name(isa), t) == 0);
        named++;
    }
    ASSERT_EQ_INT(named, ATTN_ISA_AVX512_VNNI + 1); // every value, AUTO .. AVX512_VNNI
    for (int isa = ATTN_ISA_AUTO; isa <= ATTN_ISA_AVX512_VNNI; isa++) {
        attn_isa got = (attn_isa)99;
        ASSERT_OK(attn_isa_from_name(attn_isa_name((attn_isa)isa), &got));
        ASSERT_EQ_INT(got, isa);
    }
    static const char *const bad[] = {"", "?", "AVX2", "avx", "avx2 ", "avx512_bf16", "none"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        attn_isa got = (attn_isa)99;
        ASSERT_STATUS(attn_isa_from_name(bad[i], &got), ATTN_ERR_INVALID_ARG);
        ASSERT_EQ_INT(got, 99); // untouched
    }
    attn_isa got = ATTN_ISA_AUTO;
    ASSERT_STATUS(attn_isa_from_name(NULL, &got), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_isa_from_name("avx2", NULL), ATTN_ERR_INVALID_ARG);
    for (attn_isa isa = ATTN_ISA_AVX2; isa <= ATTN_ISA_AVX512_VNNI; isa++)
        if (!attn_isa_supported(isa)) {
            attn_ctx_params p;
            attn_ctx_params_init(&p);
            p.isa = isa;
            ASSERT_STATUS(attn_ctx_create(&p, &ctx), ATTN_ERR_UNSUPPORTED);
        }
}

// attn__f16_to_f32 (half.h: the reference's, the kernels' and attn_convert's conversion) on all
// 65536 halves against a model of IEEE binary16 built from their fields: (1024 + man) 2^(exp - 25)
// for a normal, man 2^-24 for zero and subnormals, infinities, and NaN with its payload in the top
// of float's mantissa; the same bits, sign included (-0 too).
static void test_f16_every_value(void) {
    for (uint32_t h = 0; h < 65536; h++) {
        const uint32_t exp = (h >> 10) & 31, man = h & 1023;
        float want;
        uint32_t want_bits;
        if (exp == 31) {
            want_bits = 0x7f800000u | man << 13;
        } else {
            want = exp == 0 ? ldexpf((float)man, -24) : ldexpf((float)(1024 + man), (int)exp - 25);
            memcpy(&want_bits, &want, 4);
        }
        want_bits |= (h & 0x8000u) << 16;
        const float got = attn__f16_to_f32((uint16_t)h);
        uint32_t got_bits;
        memcpy(&got_bits, &got, 4);
        harness_checks++;
        if (got_bits != want_bits) FAIL("half 0x%04x: 0x%08x, expected 0x%08x", (unsigned)h, (unsigned)got_bits, (unsigned)want_bits);
    }
}

// Float32 rounded to a half type, modelled in double arithmetic (exact): F16 by scaling to its
// unit in the last place, BF16 by the same at 8 significant bits; to nearest even (nearbyint),
// overflow to infinity, NaN quiet with the top of its payload.
static uint16_t model_half(attn_dtype dt, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const bool f16 = dt == ATTN_DTYPE_F16;
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (isnan(f)) return f16 ? (uint16_t)(sign | 0x7e00u | ((u >> 13) & 0x3ffu)) : (uint16_t)((u >> 16) | 0x40u);
    const double a = fabs((double)f);
    const int mant = f16 ? 10 : 7, emin = f16 ? -14 : -126, bias = f16 ? 15 : 127, emax = f16 ? 15 : 127;
    int e;
    frexp(a, &e); // a = m 2^e, m in [0.5, 1): the leading bit is 2^(e - 1)
    const int E = a == 0.0 || e - 1 < emin ? emin : e - 1;
    const double units = nearbyint(ldexp(a, mant - E)); // in units of 2^(E - mant)
    const double r = ldexp(units, E - mant);             // the rounded magnitude, exact
    if (r >= ldexp(2.0, emax)) return (uint16_t)(sign | (f16 ? 0x7c00u : 0x7f80u));
    if (r < ldexp(1.0, emin)) return (uint16_t)(sign | (uint16_t)ldexp(r, mant - emin)); // subnormal or zero
    frexp(r, &e);
    const int Er = e - 1;
    return (uint16_t)(sign | (uint16_t)((Er + bias) << mant) | (uint16_t)(ldexp(r, mant - Er) - ldexp(1.0, mant)));
}

// cpu.h's f32_to_half of every table and attn__f32_to_f16 / attn__f32_to_bf16 against model_half:
// every sign and exponent with the bits below each type's last place at the rounding points (0,
// 1, just below, at and above half, all ones) over random upper bits, plus random floats, in an
// array whose length leaves a tail past the tables' vectors.
static void test_f32_to_half(void) {
    uint32_t seed = 11;
    enum { PER = 24 };
    const int64_t n = 512 * 2 * 6 * PER + 3 * 4099 + 13;
    float *x = malloc((size_t)n * 4);
    uint16_t *y = malloc((size_t)n * 2);
    int64_t k = 0;
    for (uint32_t se = 0; se < 512; se++)          // sign and exponent
        for (int t = 0; t < 2; t++) {              // the bits dropped: 13 (F16) or 16 (BF16)
            const int drop = t == 0 ? 13 : 16;
            const uint32_t half = 1u << (drop - 1), low[6] = {0, 1, half - 1, half, half + 1, (1u << drop) - 1};
            for (int l = 0; l < 6; l++)
                for (int r = 0; r < PER; r++) {
                    const uint32_t upper = (lcg(&seed) << drop) & 0x7fffffu;
                    const uint32_t u = se << 23 | upper | low[l];
                    memcpy(&x[k++], &u, 4);
                }
        }
    while (k < n) {
        const uint32_t u = lcg(&seed) ^ (lcg(&seed) << 16);
        memcpy(&x[k++], &u, 4);
    }
    for (int di = 0; di < 2; di++) {
        const attn_dtype dt = di == 0 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
        for (int64_t i = 0; i < n; i++) {
            const uint16_t want = model_half(dt, x[i]), got = dt == ATTN_DTYPE_F16 ? attn__f32_to_f16(x[i]) : attn__f32_to_bf16(x[i]);
            harness_checks++;
            if (got != want) FAIL("%s of 0x%08x: scalar 0x%04x, model 0x%04x", attn_dtype_name(dt), (unsigned)attn__f32_bits(x[i]), got, want);
        }
        for (int isa = ATTN_ISA_GENERIC; isa <= ATTN_ISA_AVX512_VNNI; isa++) {
            bool ok;
            const attn__kernels *kn = attn__kernels_for((attn_isa)isa, &ok);
            if (!ok) continue;
            memset(y, 0xab, (size_t)n * 2);
            kn->f32_to_half(dt, x, y, n);
            for (int64_t i = 0; i < n; i++) {
                const uint16_t want = model_half(dt, x[i]);
                harness_checks++;
                if (y[i] != want)
                    FAIL("%s f32_to_half %s of 0x%08x (element %lld): 0x%04x, model 0x%04x", kn->name, attn_dtype_name(dt),
                         (unsigned)attn__f32_bits(x[i]), (long long)i, y[i], want);
            }
        }
    }
    free(x), free(y);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_isa_requests),        HARNESS_CASE(test_f16_every_value),
        HARNESS_CASE(test_f32_to_half),
        HARNESS_CASE(test_bf16_primitives),
        HARNESS_CASE(test_exp2_error_bound),
        HARNESS_CASE(test_size_grid),
        HARNESS_CASE(test_options),
        HARNESS_CASE(test_window_alibi_softcap_half),
        HARNESS_CASE(test_value_rows_512),
        HARNESS_CASE(test_half_error_bound),
        HARNESS_CASE(test_decode_shapes),
        HARNESS_CASE(test_decode_rows_bits),
        HARNESS_CASE(test_sinks),
        HARNESS_CASE(test_softmax_tiles),
        HARNESS_CASE(test_gemm_blocks),
        HARNESS_CASE(test_pv_blocks),
        HARNESS_CASE(test_arena_pieces),
        HARNESS_CASE(test_non_finite_and_fully_masked),
        HARNESS_CASE(test_float_mask_past_log2_range),
        HARNESS_CASE(test_linear_and_modules),
        HARNESS_CASE(test_linear_half_weights),
        HARNESS_CASE(test_linear_bf16_dot),
        HARNESS_CASE(test_auto_isa_rule),
        HARNESS_CASE(test_no_denormals),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

// test_cuda_sdpa.c - libattn_cuda's SDPA forward on the GPU against the library's scalar reference
// (attn_sdpa_fwd on an ATTN_ISA_REF context, float32 copies of the same rounded inputs), through
// the public API: random shapes, layouts, GQA, every option of attn_sdpa_desc (Philox dropout: the
// reference draws the same mask), BF16/F16/F32, both kernels, packed batches; the backward against the
// reference's and bit-identical on a second run; fresh random data for every case (seed printed),
// outputs poisoned (NaN)
// before each run; bad arguments get a status and launch nothing. Without a usable GPU, context
// creation must answer ATTN_ERR_DEVICE with a message, and the GPU cases report themselves skipped
// (exit 77), or fail when ATTN_CUDA_REQUIRE_GPU is set (make test-cuda).
//
// Tolerances (|gpu - ref| <= tol * max|v| per output row, lse absolute), with u the unit roundoff
// of the element type (BF16 2^-8, F16 2^-11): tensor cores round the weights P to the element type
// before P V (relative error u per weight) and the output once (u): 4u for BF16/F16 outputs, 1e-5
// for F32; lse 1e-3 (BF16/F16 inputs are exact in float32, sums differ in order only), 1e-5 (F32).
#include <cuda_runtime_api.h>
#include <float.h>
#include <time.h>

#include "attn_cuda.h"
#include "harness.h"

static uint64_t rng_state;
static uint32_t next32(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng_state >> 33);
}
static float urand(void) { return (float)(next32() >> 8) * (1.0f / 16777216.0f); }
static int pick(int n) { return (int)(next32() % (uint32_t)n); }

static attn_cuda_ctx *gpu_ctx_of(attn_cuda_kernels kernels, int deterministic) {
    char why[256];
    if (attn_cuda_probe(0, why, sizeof why) != ATTN_OK) {
        if (getenv("ATTN_CUDA_REQUIRE_GPU") != NULL) FAIL("no usable GPU: %s", why); // make test-cuda
        SKIP("no usable GPU: %s", why);
    }
    attn_cuda_ctx_params p;
    attn_cuda_ctx_params_init(&p);
    p.kernels = kernels;
    p.deterministic = deterministic;
    attn_cuda_ctx *ctx = NULL;
    ASSERT_OK(attn_cuda_ctx_create(&p, &ctx));
    return ctx;
}

static attn_cuda_ctx *gpu_ctx(attn_cuda_kernels kernels) { return gpu_ctx_of(kernels, 0); }

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes > 0 ? bytes : 1) != cudaSuccess) FAIL("cudaMalloc(%zu)", bytes);
    return p;
}
static void to_dev(void *d, const void *h, size_t n) {
    if (cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess) FAIL("cudaMemcpy to the device");
}
static void from_dev(void *h, const void *d, size_t n) {
    if (cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) != cudaSuccess) FAIL("cudaMemcpy from the device");
}

// Host floats rounded to `t` in place (so the reference sees exactly what the GPU reads), and
// their bytes in `t` on the device.
static void *upload(float *x, int64_t n, attn_dtype t) {
    const size_t esz = attn_dtype_size(t);
    void *tmp = malloc((size_t)n * esz + 1);
    if (tmp == NULL) FAIL("out of memory");
    ASSERT_OK(attn_convert(t, tmp, ATTN_DTYPE_F32, x, n));
    ASSERT_OK(attn_convert(ATTN_DTYPE_F32, x, t, tmp, n));
    void *d = dev_alloc((size_t)n * esz);
    to_dev(d, tmp, (size_t)n * esz);
    free(tmp);
    return d;
}

static double unit(attn_dtype t) { return t == ATTN_DTYPE_BF16 ? 0x1p-8 : t == ATTN_DTYPE_F16 ? 0x1p-11 : 0x1p-24; }

static void fill_strides(int64_t s[4], int64_t B, int64_t H, int64_t L, int64_t D, int blhd) {
    (void)B;
    if (blhd) s[0] = L * H * D, s[1] = D, s[2] = H * D, s[3] = 1;
    else s[0] = H * L * D, s[1] = L * D, s[2] = D, s[3] = 1;
}

static void check_backward(attn_cuda_ctx *ctx, attn_ctx *host, const attn_sdpa_desc *rd, const attn_sdpa_desc *gd,
                           const int64_t *cu_q, const int64_t *cu_k, const float *q, const float *k, const float *v,
                           const float *ref, const float *ref_lse, const void *dq, const void *dk, const void *dv,
                           attn_dtype t, int64_t nq, int64_t nk, int64_t nl, uint64_t seed);

static int decode_shapes; // the cases' shapes: decoding (1 or 2 queries, up to 3000 keys)
// When set, scores rise along the keys by about this many log2 units a 64-key tile (positive queries,
// keys growing along the sequence; the scale negative in half the cases, the keys then falling): the
// flash forward's running max then moves on (steep) or stays within its slack (gentle) tile after tile.
static double rising_slope;
static int huge_mask; // every case with a float (L, S) mask, a term past FLT_MAX / log2 e in some rows
static int64_t only_dim; // every case at this head dim (0: drawn)
static int sm90_cases; // cases the forward ran on "flash-sm90"

static void run_case(attn_cuda_ctx *ctx, attn_dtype t, int allow_options, int packed, int backward) {
    static const int64_t dims[] = {32, 64, 96, 128, 256, 40};
    const uint64_t seed = rng_state;
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    const int64_t Hkv = 1 + pick(3), group = 1 + pick(3);
    d.batch = 1 + pick(3), d.n_heads = Hkv * group, d.n_kv_heads = Hkv;
    d.len_q = 1 + pick(300), d.len_kv = 1 + pick(400);
    if (decode_shapes) d.len_q = 1 + pick(2), d.len_kv = 1 + pick(3000); // a new token or two, a long cache
    d.head_dim = dims[pick(t == ATTN_DTYPE_F32 ? 6 : 5)];
    if (only_dim != 0) d.head_dim = only_dim;
    d.q_dtype = d.kv_dtype = d.out_dtype = t;
    int64_t cu_q[5] = {0}, cu_k[5] = {0};
    if (packed) {
        for (int64_t b = 0; b < d.batch; b++) cu_q[b + 1] = cu_q[b] + pick((int)d.len_q + 1), cu_k[b + 1] = cu_k[b] + pick((int)d.len_kv + 1);
        if (cu_q[d.batch] == 0) cu_q[d.batch] = 1; // at least one query and one key in all
        if (cu_k[d.batch] == 0) cu_k[d.batch] = 1;
    }
    const int64_t B = packed ? 1 : d.batch, L = packed ? cu_q[d.batch] : d.len_q, S = packed ? cu_k[d.batch] : d.len_kv;
    const int64_t H = d.n_heads, D = d.head_dim;
    const int blhd = packed ? 1 : pick(2);
    fill_strides(d.q_stride, B, H, L, D, blhd), fill_strides(d.o_stride, B, H, L, D, blhd);
    fill_strides(d.k_stride, B, Hkv, S, D, blhd), fill_strides(d.v_stride, B, Hkv, S, D, blhd);
    if (packed) d.q_stride[0] = d.o_stride[0] = d.k_stride[0] = d.v_stride[0] = 0;
    const int64_t nq = B * H * L * D, nk = B * Hkv * S * D;
    float *mask = NULL, *slopes = NULL;
    unsigned char *bmask = NULL;
    void *dmask = NULL, *dslopes = NULL;
    if (allow_options) {
        d.causal = (attn_causal)pick(3);
        if (pick(3) == 0) d.use_window = 1, d.window_left = pick(3) == 0 ? -1 : pick(64), d.window_right = pick(3) == 0 ? -1 : pick(16);
        if (pick(3) == 0) d.softcap = 5.0f + 20.0f * urand();
        if (pick(3) == 0) d.scale = 0.05f + urand() * 0.2f;
        if (pick(3) == 0) // the CPU reference draws the same Philox mask
            d.dropout_p = 0.1 + 0.4 * urand(), d.dropout_rng = ATTN_DROPOUT_RNG_PHILOX, d.dropout_seed = next32(),
            d.dropout_offset = next32();
        if (pick(3) == 0) {
            slopes = malloc((size_t)H * sizeof(float));
            for (int64_t h = 0; h < H; h++) slopes[h] = 0.01f + 0.1f * urand();
            dslopes = dev_alloc((size_t)H * sizeof(float));
            to_dev(dslopes, slopes, (size_t)H * sizeof(float));
            d.alibi_slopes = slopes; // the reference's; the GPU's pointer is set before its call
        }
        if (!packed && (huge_mask || pick(2) == 0)) { // an (L, S) mask broadcast over B and H, bool or float
            const int64_t n = L * S;
            d.mask_stride[0] = d.mask_stride[1] = 0, d.mask_stride[2] = S, d.mask_stride[3] = 1;
            if (!huge_mask && pick(2) == 0) {
                bmask = malloc((size_t)n);
                for (int64_t i = 0; i < n; i++) bmask[i] = pick(4) == 0;
                d.mask = bmask, d.mask_dtype = ATTN_DTYPE_BOOL;
                dmask = dev_alloc((size_t)n), to_dev(dmask, bmask, (size_t)n);
            } else {
                mask = malloc((size_t)n * sizeof(float));
                for (int64_t i = 0; i < n; i++) mask[i] = pick(8) == 0 ? -INFINITY : urand() - 0.5f;
                // one term past the log2 domain in a third of the rows (one a row: two such keys of
                // different values share the weight once clamped, where the reference gives it all
                // to the larger)
                static const float huge[] = {FLT_MAX, 3e38f, 2.4e38f};
                for (int64_t i = 0; huge_mask && i < L; i++)
                    if (pick(3) == 0) mask[i * S + pick((int)S)] = huge[pick(3)];
                d.mask = mask, d.mask_dtype = ATTN_DTYPE_F32;
                dmask = dev_alloc((size_t)n * sizeof(float)), to_dev(dmask, mask, (size_t)n * sizeof(float));
            }
        }
    }
    float *q = malloc((size_t)nq * sizeof(float)), *k = malloc((size_t)nk * sizeof(float)), *v = malloc((size_t)nk * sizeof(float));
    float *ref = malloc((size_t)nq * sizeof(float)), *got = malloc((size_t)nq * sizeof(float));
    const int64_t nl = H * (packed ? L : B * L);
    float *ref_lse = malloc((size_t)nl * sizeof(float)), *got_lse = malloc((size_t)nl * sizeof(float));
    if (!q || !k || !v || !ref || !got || !ref_lse || !got_lse) FAIL("out of memory");
    for (int64_t i = 0; i < nq; i++) q[i] = 2.0f * urand() - 1.0f;
    for (int64_t i = 0; i < nk; i++) k[i] = 2.0f * urand() - 1.0f, v[i] = 2.0f * urand() - 1.0f;
    if (rising_slope != 0) {
        if (pick(2) == 0) d.scale = -(d.scale != 0 ? d.scale : 1.0f / sqrtf((float)D));
        const double sc = d.scale != 0 ? d.scale : 1.0 / sqrt((double)D);
        const double c = rising_slope / (sc * (double)D * 0.75 * 64 * 1.4426950408889634); // q averages 0.75
        for (int64_t i = 0; i < nq; i++) q[i] = 0.5f + 0.5f * urand();
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hkv; h++)
                for (int64_t j = 0; j < S; j++)
                    for (int64_t e = 0; e < D; e++)
                        k[b * d.k_stride[0] + h * d.k_stride[1] + j * d.k_stride[2] + e * d.k_stride[3]] = (float)(c * (double)j) + 0.1f * (2.0f * urand() - 1.0f);
    }
    void *dq = upload(q, nq, t), *dk = upload(k, nk, t), *dv = upload(v, nk, t);
    const size_t esz = attn_dtype_size(t);
    void *dout = dev_alloc((size_t)nq * esz);
    float *dlse = dev_alloc((size_t)nl * sizeof(float));
    cudaMemset(dout, 0xff, (size_t)nq * esz); // NaN in every type until written
    cudaMemset(dlse, 0xff, (size_t)nl * sizeof(float));

    // the reference: float32 copies of the rounded inputs on the scalar path
    attn_ctx_params hp;
    attn_ctx_params_init(&hp);
    hp.isa = ATTN_ISA_REF;
    attn_ctx *host = NULL;
    ASSERT_OK(attn_ctx_create(&hp, &host));
    attn_sdpa_desc rd = d;
    rd.q_dtype = rd.kv_dtype = rd.out_dtype = ATTN_DTYPE_F32;
    if (packed) ASSERT_OK(attn_sdpa_varlen_fwd(host, &rd, cu_q, cu_k, q, k, v, ref, ref_lse));
    else ASSERT_OK(attn_sdpa_fwd(host, &rd, q, k, v, ref, ref_lse, NULL));

    attn_sdpa_desc gd = d;
    gd.mask = dmask, gd.alibi_slopes = dslopes;
    const char *kname = "?";
    attn_sdpa_desc kd = gd; // a packed batch gets the kernel of one sequence of its rows
    if (packed) kd.batch = 1;
    ASSERT_OK(attn_cuda_sdpa_kernel_name(ctx, &kd, &kname));
    sm90_cases += strcmp(kname, "flash-sm90") == 0;
    attn_status st = packed ? attn_cuda_sdpa_varlen_fwd(ctx, &gd, cu_q, cu_k, dq, dk, dv, dout, dlse)
                            : attn_cuda_sdpa_fwd(ctx, &gd, dq, dk, dv, dout, dlse);
    if (st != ATTN_OK) FAIL("seed %llu: %s", (unsigned long long)seed, attn_cuda_ctx_last_error(ctx));
    if (cudaStreamSynchronize((cudaStream_t)attn_cuda_ctx_stream(ctx)) != cudaSuccess) FAIL("kernel failed (seed %llu)", (unsigned long long)seed);
    void *raw = malloc((size_t)nq * esz);
    from_dev(raw, dout, (size_t)nq * esz);
    ASSERT_OK(attn_convert(ATTN_DTYPE_F32, got, t, raw, nq));
    from_dev(got_lse, dlse, (size_t)nl * sizeof(float));
    free(raw);

    double vmax = 0;
    for (int64_t i = 0; i < nk; i++) vmax = fmax(vmax, fabs(v[i]));
    const double tol = (t == ATTN_DTYPE_F32 ? 1e-5 : 4 * unit(t)) * (vmax > 0 ? vmax : 1);
    const double lse_tol = t == ATTN_DTYPE_F32 ? 1e-5 : 1e-3;
    for (int64_t i = 0; i < nq; i++) {
        const double e = fabs((double)got[i] - ref[i]);
        if (!(e <= tol) && !(isnan(got[i]) && isnan(ref[i])))
            FAIL("%s %s seed %llu: out[%lld] = %g, reference %g (tol %g)", kname, attn_dtype_name(t), (unsigned long long)seed,
                 (long long)i, got[i], ref[i], tol);
    }
    const double top = (double)FLT_MAX * 0.6931471805599453; // the kernels' lse range (attn.h)
    for (int64_t i = 0; i < nl; i++) {
        const double want = fmin(fmax(ref_lse[i], -top), top);
        if (ref_lse[i] == -INFINITY ? got_lse[i] != -INFINITY : !(fabs((double)got_lse[i] - want) <= lse_tol * fmax(1, fabs(want))))
            FAIL("%s seed %llu: lse[%lld] = %g, reference %g", kname, (unsigned long long)seed, (long long)i, got_lse[i], ref_lse[i]);
    }
    if (backward) check_backward(ctx, host, &rd, &gd, packed ? cu_q : NULL, cu_k, q, k, v, ref, ref_lse, dq, dk, dv, t, nq, nk, nl, seed);
    attn_ctx_free(host);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dlse), cudaFree(dmask), cudaFree(dslopes);
    free(q), free(k), free(v), free(ref), free(got), free(ref_lse), free(got_lse), free(mask), free(bmask), free(slopes);
}

// The backward of a case against the reference's (attn_sdpa_bwd / attn_sdpa_varlen_bwd on the
// scalar path), both from the reference's out rounded to the element type and its lse, with the same
// dout; run twice. Tolerances (per element, against the largest reference gradient g of the tensor):
//  - simple kernels: 1e-4 g (float32 throughout; the two differ in the order of float sums and in
//    exp's rounding);
//  - flash: 8u g, u = 2^-8 (BF16) or 2^-11 (F16). The tensor cores take P and dS rounded to the
//    element type (as FlashAttention does): each term of dV = sum_i P_ij dO_i and dK = scale sum_i
//    dS_ij q_i, dQ = scale sum_j dS_ij k_j carries a relative error up to u, and with random signs
//    the error of the sum grows like the sum itself, so a few u of the largest gradient; 8u leaves a
//    margin of 2-4 for sums that cancel. A wrong index or a lost term costs O(g).
//  - both: plus the part that comes from out's rounding and D_i's float sums. The GPU takes
//    D_i = dout_i . out_i from the forward's out, rounded to the element type, where the reference
//    sums p dp in double from the weights; the difference |dout_i . (out_i - rounded out_i)| (0 for
//    F32) enters dS_ij = P_ij (dP_ij - D_i) as P_ij dD_i, and so do the float32 sums of D_i and dP_ij
//    (each of D terms: up to gamma = D 2^-24 of the sum of the terms' magnitudes, sum |dout| (|out| +
//    max|v|) for both). So dq_i moves by at most scale dD_i max|k| (the weights of a row sum to 1)
//    and dk_j of kv head hk by at most scale max|q| times the sum of dD_i over the rows of its heads.
//    The float part matters where the gradients cancel exactly (one visible key per row: dS = 0 in
//    exact arithmetic, so the relative tolerance is 0).
// The second run must give the same bits, except dq of "flash" (float32 atomics: the order of the
// additions changes between runs), which must then be within the tolerance. With bwd_check_ctx set,
// the same backward on that context (the simple kernels) is compared with this one too.
// dD of the row of out starting at `row` (D elements, `step` apart): |dout . (out - rounded out)|,
// how far the GPU's rowdot (from out in the element type) is from the reference's.
static double out_rounding_dd(const float *go, const float *ref, const float *o, double vmax, int64_t row, int64_t D,
                              int64_t step) {
    double dd = 0, mag = 0;
    for (int64_t e = 0; e < D; e++) {
        dd += (double)go[row + e * step] * ((double)ref[row + e * step] - o[row + e * step]);
        mag += fabs((double)go[row + e * step]) * (fabs((double)o[row + e * step]) + vmax);
    }
    return fabs(dd) + (double)D * 0x1p-24 * mag;
}

// The out-rounding and D_i part of the tolerance above, per element of dq (which = 0: q's layout) or
// dk (which = 1: k's layout). d holds the strides (o's those of q); packed batches are one row run.
static float *rounding_bound(const attn_sdpa_desc *d, const int64_t *cu_q, const int64_t *cu_k, const float *q,
                             const float *k, const float *v, const float *ref, const float *o, const float *go, int which) {
    const int64_t B = cu_q != NULL ? 1 : d->batch, H = d->n_heads, Hkv = d->n_kv_heads, D = d->head_dim;
    const int64_t L = cu_q != NULL ? cu_q[d->batch] : d->len_q, S = cu_q != NULL ? cu_k[d->batch] : d->len_kv;
    const double scale = d->scale != 0.0f ? d->scale : 1.0 / sqrt((double)D);
    const int64_t *qs = d->q_stride, *ks = d->k_stride;
    const int64_t *vs = d->v_stride;
    double qmax = 0, kmax = 0, vmax = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++)
                for (int64_t e = 0; e < D; e++) qmax = fmax(qmax, fabs(q[b * qs[0] + h * qs[1] + i * qs[2] + e * qs[3]]));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hkv; h++)
            for (int64_t j = 0; j < S; j++)
                for (int64_t e = 0; e < D; e++) {
                    kmax = fmax(kmax, fabs(k[b * ks[0] + h * ks[1] + j * ks[2] + e * ks[3]]));
                    vmax = fmax(vmax, fabs(v[b * vs[0] + h * vs[1] + j * vs[2] + e * vs[3]]));
                }
    const int64_t n = which == 0 ? B * H * L * D : B * Hkv * S * D;
    float *t = calloc((size_t)n, sizeof(float));
    double *sum = calloc((size_t)(B * Hkv), sizeof(double)); // sum of dD over the rows of each (b, kv head)
    if (t == NULL || sum == NULL) FAIL("out of memory");
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++) {
                const int64_t row = b * qs[0] + h * qs[1] + i * qs[2];
                const double dd = out_rounding_dd(go, ref, o, vmax, row, D, qs[3]);
                sum[b * Hkv + h / (H / Hkv)] += dd;
                if (which == 0)
                    for (int64_t e = 0; e < D; e++) t[row + e * qs[3]] = (float)(1.01 * scale * dd * kmax);
            }
    if (which == 1)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hkv; h++)
                for (int64_t j = 0; j < S; j++)
                    for (int64_t e = 0; e < D; e++)
                        t[b * ks[0] + h * ks[1] + j * ks[2] + e * ks[3]] = (float)(1.01 * scale * qmax * sum[b * Hkv + h]);
    free(sum);
    return t;
}

static attn_cuda_ctx *bwd_check_ctx;
static double bwd_worst_u; // the largest error of a flash case, in units of u times the largest gradient
static int bwd_flash_cases, bwd_cases;

static void check_backward(attn_cuda_ctx *ctx, attn_ctx *host, const attn_sdpa_desc *rd, const attn_sdpa_desc *gd,
                           const int64_t *cu_q, const int64_t *cu_k, const float *q, const float *k, const float *v,
                           const float *ref, const float *ref_lse, const void *dq, const void *dk, const void *dv,
                           attn_dtype t, int64_t nq, int64_t nk, int64_t nl, uint64_t seed) {
    float *o = malloc((size_t)nq * sizeof(float)), *go = malloc((size_t)nq * sizeof(float));
    float *r[3], *g[3][3];
    const int64_t n[3] = {nq, nk, nk};
    for (int i = 0; i < 3; i++) {
        r[i] = malloc((size_t)n[i] * sizeof(float));
        for (int run = 0; run < 3; run++) g[run][i] = malloc((size_t)n[i] * sizeof(float));
    }
    memcpy(o, ref, (size_t)nq * sizeof(float));
    for (int64_t i = 0; i < nq; i++) go[i] = 2.0f * urand() - 1.0f;
    void *d_out = upload(o, nq, t), *d_go = upload(go, nq, t); // o and go now hold the rounded values
    float *d_lse = dev_alloc((size_t)nl * sizeof(float));
    to_dev(d_lse, ref_lse, (size_t)nl * sizeof(float));
    void *dg[3];
    for (int i = 0; i < 3; i++) dg[i] = dev_alloc((size_t)n[i] * sizeof(float));
    if (cu_q != NULL) ASSERT_OK(attn_sdpa_varlen_bwd(host, rd, cu_q, cu_k, q, k, v, o, go, ref_lse, NULL, r[0], r[1], r[2]));
    else ASSERT_OK(attn_sdpa_bwd(host, rd, q, k, v, o, go, ref_lse, NULL, r[0], r[1], r[2], NULL));
    // the kernels (a packed batch gets those of one sequence of its rows: the choice depends on the
    // types, head dims and views only)
    attn_sdpa_desc nd = *gd;
    if (cu_q != NULL) nd.batch = 1;
    const char *kname = "?";
    ASSERT_OK(attn_cuda_sdpa_bwd_kernel_name(ctx, &nd, &kname));
    const int runs = bwd_check_ctx != NULL ? 3 : 2;
    for (int run = 0; run < runs; run++) {
        attn_cuda_ctx *c = run < 2 ? ctx : bwd_check_ctx;
        for (int i = 0; i < 3; i++) cudaMemset(dg[i], 0xff, (size_t)n[i] * sizeof(float));
        const attn_status st = cu_q != NULL ? attn_cuda_sdpa_varlen_bwd(c, gd, cu_q, cu_k, dq, dk, dv, d_out, d_go, d_lse, dg[0], dg[1], dg[2])
                                            : attn_cuda_sdpa_bwd(c, gd, dq, dk, dv, d_out, d_go, d_lse, dg[0], dg[1], dg[2], NULL);
        if (st != ATTN_OK) FAIL("seed %llu: backward: %s", (unsigned long long)seed, attn_cuda_ctx_last_error(c));
        if (cudaStreamSynchronize((cudaStream_t)attn_cuda_ctx_stream(c)) != cudaSuccess)
            FAIL("%s backward kernel failed (seed %llu)", kname, (unsigned long long)seed);
        for (int i = 0; i < 3; i++) from_dev(g[run][i], dg[i], (size_t)n[i] * sizeof(float));
    }
    float *extra[3] = {rounding_bound(rd, cu_q, cu_k, q, k, v, ref, o, go, 0), rounding_bound(rd, cu_q, cu_k, q, k, v, ref, o, go, 1), NULL};
    const int flash = strncmp(kname, "flash", 5) == 0, atomic = strcmp(kname, "flash") == 0;
    bwd_cases++, bwd_flash_cases += flash;
    static const char *names[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; i++) {
        double mx = 0;
        for (int64_t e = 0; e < n[i]; e++) mx = fmax(mx, fabs(r[i][e]));
        const double tol = flash ? 8 * unit(t) * mx + 1e-6 : 1e-4 * (mx > 0 ? mx : 1) + 1e-6;
        for (int run = 0; run < runs; run++) {
            // run 2 (the simple kernels) against run 0: within the flash tolerance plus the simple one
            const float *want = run < 2 ? r[i] : g[0][i];
            const double tol_run = run < 2 ? tol : tol + 1e-4 * (mx > 0 ? mx : 1);
            for (int64_t e = 0; e < n[i]; e++) {
                const double err = fabs((double)g[run][i][e] - want[e]);
                if (!(err <= tol_run + (run < 2 && extra[i] != NULL ? extra[i][e] : 0.0)))
                    FAIL("%s %s seed %llu: %s[%lld] = %g, %s %g (tol %g)", kname, attn_dtype_name(t), (unsigned long long)seed,
                         names[i], (long long)e, g[run][i][e], run < 2 ? "reference" : "flash", want[e], tol_run);
                if (flash && run == 0 && mx > 0) bwd_worst_u = fmax(bwd_worst_u, err / (unit(t) * mx));
            }
        }
        if (!(atomic && i == 0) && memcmp(g[0][i], g[1][i], (size_t)n[i] * sizeof(float)) != 0)
            FAIL("%s seed %llu: %s differs between two runs", kname, (unsigned long long)seed, names[i]);
    }
    free(extra[0]), free(extra[1]);
    for (int i = 0; i < 3; i++) {
        free(r[i]), cudaFree(dg[i]);
        for (int run = 0; run < 3; run++) free(g[run][i]);
    }
    free(o), free(go), cudaFree(d_out), cudaFree(d_go), cudaFree(d_lse);
}

static void seed_rng(void) {
    const char *s = getenv("ATTN_TEST_SEED");
    rng_state = s != NULL ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    fprintf(stderr, "    seed %llu (ATTN_TEST_SEED to repeat)\n", (unsigned long long)rng_state);
}

static void cases_of(attn_cuda_kernels kernels, int options, int packed, int backward) {
    attn_cuda_ctx *ctx = gpu_ctx(kernels);
    seed_rng();
    const attn_dtype types[] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16, ATTN_DTYPE_F32};
    for (int r = 0; r < 24; r++) run_case(ctx, types[r % 3], options, packed, backward);
    attn_cuda_ctx_free(ctx);
}

// Backward cases on a context: kernels and the deterministic flag; with check_simple the simple
// kernels' backward of each case is compared with the context's too. Prints how many cases ran on
// the tensor-core backward and its largest error (for the tolerance's margin).
static void backward_cases(attn_cuda_kernels kernels, int deterministic, int packed, int check_simple) {
    attn_cuda_ctx *ctx = gpu_ctx_of(kernels, deterministic);
    bwd_check_ctx = check_simple ? gpu_ctx(ATTN_CUDA_KERNELS_SIMPLE) : NULL;
    seed_rng();
    bwd_worst_u = 0, bwd_flash_cases = bwd_cases = 0;
    const attn_dtype types[] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16, ATTN_DTYPE_F32};
    for (int r = 0; r < 24; r++) run_case(ctx, types[r % 3], 1, packed, 1);
    fprintf(stderr, "    %d of %d cases on the flash backward%s, largest error %.2f u of the largest gradient\n",
            bwd_flash_cases, bwd_cases, deterministic ? " (deterministic)" : "", bwd_worst_u);
    if (kernels != ATTN_CUDA_KERNELS_SIMPLE && bwd_flash_cases == 0) FAIL("no case ran on the flash backward");
    attn_cuda_ctx_free(bwd_check_ctx), bwd_check_ctx = NULL;
    attn_cuda_ctx_free(ctx);
}

static void test_plain_auto(void) { cases_of(ATTN_CUDA_KERNELS_AUTO, 0, 0, 0); }
static void test_options_auto(void) { cases_of(ATTN_CUDA_KERNELS_AUTO, 1, 0, 0); }
static void test_options_simple(void) { cases_of(ATTN_CUDA_KERNELS_SIMPLE, 1, 0, 0); }
static void test_varlen_auto(void) { cases_of(ATTN_CUDA_KERNELS_AUTO, 1, 1, 0); }
static void test_backward(void) { backward_cases(ATTN_CUDA_KERNELS_AUTO, 0, 0, 0); }
static void test_backward_simple(void) { backward_cases(ATTN_CUDA_KERNELS_SIMPLE, 0, 0, 0); }
static void test_backward_flash_vs_simple(void) { backward_cases(ATTN_CUDA_KERNELS_AUTO, 0, 0, 1); }
static void test_backward_deterministic(void) { // every gradient the same bits on a second run
    backward_cases(ATTN_CUDA_KERNELS_AUTO, 1, 0, 0);
    backward_cases(ATTN_CUDA_KERNELS_AUTO, 1, 1, 0);
}
static void test_decode(void) { // split-KV decoding (every option, packed batches too)
    decode_shapes = 1;
    cases_of(ATTN_CUDA_KERNELS_AUTO, 1, 0, 0);
    cases_of(ATTN_CUDA_KERNELS_AUTO, 1, 1, 0);
    decode_shapes = 0;
}
static void test_backward_varlen(void) { backward_cases(ATTN_CUDA_KERNELS_AUTO, 0, 1, 0); }
// The tensor-core backward at head dim 256 (two blocks a key tile, each accumulating 128 columns of
// the gradients), taken when SM80 names the mma.sync kernels (AUTO does not take it yet): every
// option, against the reference and the simple kernels, deterministic, packed batches.
static void test_backward_d256(void) {
    only_dim = 256;
    backward_cases(ATTN_CUDA_KERNELS_SM80, 0, 0, 1);
    backward_cases(ATTN_CUDA_KERNELS_SM80, 1, 0, 0);
    backward_cases(ATTN_CUDA_KERNELS_SM80, 0, 1, 0);
    only_dim = 0;
}
// Scores rising along the keys, gently and steeply, with and without the options: the forward's
// running max kept within its slack or taken anew (flash_sm80.cuh), the scale folded into the
// exponent or not (a negative scale).
static void test_rising_scores(void) {
    static const double slopes[] = {0.5, 4, 12, 40};
    for (int s = 0; s < 4; s++) {
        rising_slope = slopes[s];
        cases_of(ATTN_CUDA_KERNELS_AUTO, 0, 0, 0);
        cases_of(ATTN_CUDA_KERNELS_AUTO, 1, 0, 0);
    }
    rising_slope = 0;
}

// Float mask terms past the kernels' log2 domain (attn.h, the note before attn_causal): a row with a
// term near FLT_MAX gives that key its whole weight, as the reference does (NaN rows before the
// kernels clamped the score plus its mask terms), its lse the reference's up to FLT_MAX ln 2; the
// backward, given the reference's lse (past that range), clamps it as the scores and gives the
// reference's gradients. Every kernel family: flash and split-KV decoding (AUTO), the simple kernels.
static void test_float_mask_past_log2_range(void) {
    huge_mask = 1;
    cases_of(ATTN_CUDA_KERNELS_AUTO, 1, 0, 0);
    cases_of(ATTN_CUDA_KERNELS_SIMPLE, 1, 0, 0);
    backward_cases(ATTN_CUDA_KERNELS_AUTO, 0, 0, 0);
    backward_cases(ATTN_CUDA_KERNELS_SIMPLE, 0, 0, 0);
    decode_shapes = 1;
    cases_of(ATTN_CUDA_KERNELS_AUTO, 1, 0, 0);
    decode_shapes = 0;
    huge_mask = 0;
}

// The Hopper forward (ATTN_CUDA_KERNELS_SM90) on the cases of the tests above: plain, with options
// (the calls it does not take run the other kernels), packed batches, decoding shapes (one or two
// queries, up to 24 key tiles) and rising scores. Where the library takes it (compute capability 9.0
// and sm_90a code in the build, as ctx.c decides) cases must have run on it.
static void test_sm90(void) {
    attn_cuda_ctx *ctx = gpu_ctx(ATTN_CUDA_KERNELS_SM90); // skips without a GPU
    attn_cuda_device_props props;
    ASSERT_OK(attn_cuda_ctx_device(ctx, &props));
    attn_cuda_ctx_free(ctx);
    sm90_cases = 0;
    cases_of(ATTN_CUDA_KERNELS_SM90, 0, 0, 0);
    cases_of(ATTN_CUDA_KERNELS_SM90, 1, 0, 0);
    cases_of(ATTN_CUDA_KERNELS_SM90, 1, 1, 0);
    decode_shapes = 1;
    cases_of(ATTN_CUDA_KERNELS_SM90, 0, 0, 0);
    decode_shapes = 0;
    static const double slopes[] = {0.5, 12};
    for (int i = 0; i < 2; i++) {
        rising_slope = slopes[i];
        cases_of(ATTN_CUDA_KERNELS_SM90, 0, 0, 0);
    }
    rising_slope = 0;
    fprintf(stderr, "    %d cases on flash-sm90 (%s, compute capability %d.%d)\n", sm90_cases, props.name, props.cc_major,
            props.cc_minor);
    const int sm90a = props.cc_major == 9 && props.cc_minor == 0 && strstr(props.arch_built, "90a") != NULL;
    if (sm90a && sm90_cases == 0) FAIL("no case ran on flash-sm90");
}

// The float mask's gradient (dmask) against attn_sdpa_bwd's on the reference: random F32 and BF16
// cases (GQA, causal, soft cap, Philox dropout), the mask (L, S) broadcast over B and H or full
// (B, H, L, S), with hidden (-inf) elements; dmask poisoned (NaN) first, so every element of the
// extent must be written. Tolerance 1e-4 of the largest reference element (float32 sums in another
// order; F32 inputs, and BF16 given an out rounded to BF16 whose rounding the bound below adds:
// per element P dD summed over the cells sharing it, at most the sum of dD over those rows). A bool
// mask or none is refused (ATTN_ERR_BAD_MASK) with dmask unchanged.
static void test_backward_dmask(void) {
    attn_cuda_ctx *ctx = gpu_ctx(ATTN_CUDA_KERNELS_AUTO);
    seed_rng();
    attn_ctx_params hp;
    attn_ctx_params_init(&hp);
    hp.isa = ATTN_ISA_REF;
    attn_ctx *host = NULL;
    ASSERT_OK(attn_ctx_create(&hp, &host));
    for (int c = 0; c < 12; c++) {
        const uint64_t seed = rng_state;
        const attn_dtype t = c % 2 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F32;
        static const int64_t dims[] = {32, 64, 128};
        attn_sdpa_desc d;
        attn_sdpa_desc_init(&d);
        const int64_t Hkv = 1 + pick(2), G = 1 + pick(2), B = 1 + pick(2), L = 1 + pick(90), S = 1 + pick(120);
        const int64_t H = Hkv * G, D = dims[pick(3)];
        d.batch = B, d.n_heads = H, d.n_kv_heads = Hkv, d.len_q = L, d.len_kv = S, d.head_dim = D;
        d.q_dtype = d.kv_dtype = d.out_dtype = t;
        fill_strides(d.q_stride, B, H, L, D, 0), fill_strides(d.o_stride, B, H, L, D, 0);
        fill_strides(d.k_stride, B, Hkv, S, D, 0), fill_strides(d.v_stride, B, Hkv, S, D, 0);
        d.causal = (attn_causal)pick(3);
        if (pick(3) == 0) d.softcap = 5.0f + 20.0f * urand();
        if (pick(3) == 0)
            d.dropout_p = 0.1 + 0.4 * urand(), d.dropout_rng = ATTN_DROPOUT_RNG_PHILOX, d.dropout_seed = next32(),
            d.dropout_offset = next32();
        const int full = pick(2);
        const int64_t nm = full ? B * H * L * S : L * S;
        if (full) d.mask_stride[0] = H * L * S, d.mask_stride[1] = L * S;
        d.mask_stride[2] = S, d.mask_stride[3] = 1;
        float *mask = malloc((size_t)nm * sizeof(float));
        for (int64_t i = 0; i < nm; i++) mask[i] = pick(8) == 0 ? -INFINITY : urand() - 0.5f;
        d.mask = mask, d.mask_dtype = ATTN_DTYPE_F32;
        const int64_t nq = B * H * L * D, nk = B * Hkv * S * D, nl = B * H * L;
        float *q = malloc((size_t)nq * 4), *k = malloc((size_t)nk * 4), *v = malloc((size_t)nk * 4);
        float *o = malloc((size_t)nq * 4), *go = malloc((size_t)nq * 4), *lse = malloc((size_t)nl * 4);
        float *rg[3] = {malloc((size_t)nq * 4), malloc((size_t)nk * 4), malloc((size_t)nk * 4)};
        float *rmask = malloc((size_t)nm * 4), *gmask = malloc((size_t)nm * 4);
        for (int64_t i = 0; i < nq; i++) q[i] = 2.0f * urand() - 1.0f, go[i] = 2.0f * urand() - 1.0f;
        for (int64_t i = 0; i < nk; i++) k[i] = 2.0f * urand() - 1.0f, v[i] = 2.0f * urand() - 1.0f;
        void *dq = upload(q, nq, t), *dk = upload(k, nk, t), *dv = upload(v, nk, t), *d_go = upload(go, nq, t);
        attn_sdpa_desc rd = d;
        rd.q_dtype = rd.kv_dtype = rd.out_dtype = ATTN_DTYPE_F32;
        ASSERT_OK(attn_sdpa_fwd(host, &rd, q, k, v, o, lse, NULL));
        float *ref_o = malloc((size_t)nq * 4);
        memcpy(ref_o, o, (size_t)nq * 4);
        void *d_o = upload(o, nq, t); // o now holds the rounded values the GPU reads
        ASSERT_OK(attn_sdpa_bwd(host, &rd, q, k, v, o, go, lse, NULL, rg[0], rg[1], rg[2], rmask));
        float *d_lse = dev_alloc((size_t)nl * 4), *d_mask = dev_alloc((size_t)nm * 4), *d_dmask = dev_alloc((size_t)nm * 4);
        to_dev(d_lse, lse, (size_t)nl * 4), to_dev(d_mask, mask, (size_t)nm * 4);
        void *dg[3] = {dev_alloc((size_t)nq * 4), dev_alloc((size_t)nk * 4), dev_alloc((size_t)nk * 4)};
        attn_sdpa_desc gd = d;
        gd.mask = d_mask;
        cudaMemset(d_dmask, 0xff, (size_t)nm * 4);
        // refused: a bool mask, no mask (dmask untouched)
        attn_sdpa_desc bad = gd;
        bad.mask_dtype = ATTN_DTYPE_BOOL;
        ASSERT_STATUS(attn_cuda_sdpa_bwd(ctx, &bad, dq, dk, dv, d_o, d_go, d_lse, dg[0], dg[1], dg[2], d_dmask), ATTN_ERR_BAD_MASK);
        bad = gd, bad.mask = NULL;
        ASSERT_STATUS(attn_cuda_sdpa_bwd(ctx, &bad, dq, dk, dv, d_o, d_go, d_lse, dg[0], dg[1], dg[2], d_dmask), ATTN_ERR_BAD_MASK);
        from_dev(gmask, d_dmask, (size_t)nm * 4);
        for (int64_t i = 0; i < nm; i++)
            if (!isnan(gmask[i])) FAIL("seed %llu: a refused call wrote dmask[%lld]", (unsigned long long)seed, (long long)i);
        const attn_status st = attn_cuda_sdpa_bwd(ctx, &gd, dq, dk, dv, d_o, d_go, d_lse, dg[0], dg[1], dg[2], d_dmask);
        if (st != ATTN_OK) FAIL("seed %llu: %s", (unsigned long long)seed, attn_cuda_ctx_last_error(ctx));
        if (cudaStreamSynchronize((cudaStream_t)attn_cuda_ctx_stream(ctx)) != cudaSuccess) FAIL("kernel failed (seed %llu)", (unsigned long long)seed);
        from_dev(gmask, d_dmask, (size_t)nm * 4);
        // out's rounding (BF16) and D_i's float sums: dS moves by P dD_i <= dD_i per cell; a mask element sums its cells
        double *slack = calloc((size_t)nm, sizeof(double));
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < L; i++) {
                    const int64_t row = b * d.q_stride[0] + h * d.q_stride[1] + i * d.q_stride[2];
                    const double dd = out_rounding_dd(go, ref_o, o, 1.0, row, D, 1); // |v| <= 1
                    for (int64_t j = 0; j < S; j++) slack[b * d.mask_stride[0] + h * d.mask_stride[1] + i * S + j] += dd;
                }
        double mx = 0;
        for (int64_t i = 0; i < nm; i++) mx = fmax(mx, fabs(rmask[i]));
        for (int64_t i = 0; i < nm; i++) {
            const double err = fabs((double)gmask[i] - rmask[i]);
            if (!(err <= 1e-4 * mx + 1e-6 + 1.01 * slack[i]))
                FAIL("%s seed %llu (%s mask): dmask[%lld] = %g, reference %g (tol %g)", attn_dtype_name(t),
                     (unsigned long long)seed, full ? "full" : "(L, S)", (long long)i, gmask[i], rmask[i],
                     1e-4 * mx + 1e-6 + slack[i]);
        }
        harness_checks++;
        free(slack);
        for (int i = 0; i < 3; i++) free(rg[i]), cudaFree(dg[i]);
        cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(d_go), cudaFree(d_o), cudaFree(d_lse), cudaFree(d_mask), cudaFree(d_dmask);
        free(q), free(k), free(v), free(o), free(go), free(lse), free(rmask), free(gmask), free(mask), free(ref_o);
    }
    attn_ctx_free(host);
    attn_cuda_ctx_free(ctx);
}

// Device memory hooks that count, and fail the allocation numbered fail_at (from 0; -1: none).
typedef struct counting_mem {
    int calls, fail_at, allocs, frees;
} counting_mem;
static void *counting_alloc(void *user, size_t size, attn_cuda_stream stream) {
    counting_mem *m = user;
    (void)stream;
    if (m->calls++ == m->fail_at) return NULL;
    void *p = NULL;
    if (cudaMalloc(&p, size) != cudaSuccess) return NULL;
    m->allocs++;
    return p;
}
static void counting_free(void *user, void *p, attn_cuda_stream stream) {
    counting_mem *m = user;
    (void)stream;
    m->frees++;
    cudaFree(p);
}

// Without a GPU: ATTN_ERR_DEVICE, no context, a message naming the cause. With one: a context.
static void test_context_without_gpu(void) {
    char why[256] = "unchanged";
    const attn_status probe = attn_cuda_probe(0, why, sizeof why);
    attn_cuda_ctx *ctx = (attn_cuda_ctx *)&why; // must be overwritten
    const attn_status st = attn_cuda_ctx_create(NULL, &ctx);
    ASSERT_STATUS(st, probe);
    if (st == ATTN_OK) {
        ASSERT_TRUE(ctx != NULL);
        attn_cuda_device_props props;
        ASSERT_OK(attn_cuda_ctx_device(ctx, &props));
        fprintf(stderr, "    %s, compute capability %d.%d, code for %s\n", props.name, props.cc_major, props.cc_minor,
                props.arch_built);
        attn_cuda_ctx_free(ctx);
        return;
    }
    ASSERT_STATUS(st, ATTN_ERR_DEVICE);
    ASSERT_TRUE(ctx == NULL);
    ASSERT_TRUE(why[0] != '\0' && strcmp(why, "unchanged") != 0 && strchr(why, '\n') == NULL);
    fprintf(stderr, "    no GPU: %s\n", why);
    attn_cuda_ctx_params p;
    attn_cuda_ctx_params_init(&p);
    p.device = -1;
    ASSERT_STATUS(attn_cuda_ctx_create(&p, &ctx), ATTN_ERR_INVALID_ARG);
    p.device = 0, p.allocator.alloc = counting_alloc; // half an allocator: refused before the device is asked
    ASSERT_STATUS(attn_cuda_ctx_create(&p, &ctx), ATTN_ERR_INVALID_ARG);
    ASSERT_TRUE(ctx == NULL);
    ASSERT_STATUS(attn_cuda_ctx_create(NULL, NULL), ATTN_ERR_INVALID_ARG);
    attn_cuda_ctx_free(NULL);
    ASSERT_TRUE(strcmp(attn_cuda_ctx_last_error(NULL), "") == 0);
}

// After the stream's work: every one of the n bytes of the device array out still 0xab (its fill
// before a call that must write nothing, named by `what`).
static void expect_untouched(const void *out, size_t n, const char *what) {
    ASSERT_OK(cudaDeviceSynchronize() == cudaSuccess ? ATTN_OK : ATTN_ERR_DEVICE);
    unsigned char *h = malloc(n);
    from_dev(h, out, n);
    for (size_t i = 0; i < n; i++)
        if (h[i] != 0xab) FAIL("byte %zu of out was written by %s", i, what);
    free(h);
}

// Bad arguments: a status, a message, and nothing launched (the poisoned output stays as it was).
static void test_bad_arguments(void) {
    attn_cuda_ctx *ctx = gpu_ctx(ATTN_CUDA_KERNELS_AUTO);
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = 1, d.n_heads = 2, d.len_q = 8, d.len_kv = 8, d.head_dim = 64;
    const int64_t s[4] = {2 * 8 * 64, 8 * 64, 64, 1};
    memcpy(d.q_stride, s, sizeof s), memcpy(d.k_stride, s, sizeof s), memcpy(d.v_stride, s, sizeof s), memcpy(d.o_stride, s, sizeof s);
    d.q_dtype = d.kv_dtype = d.out_dtype = ATTN_DTYPE_BF16;
    const size_t n = 2 * 8 * 64 * 2;
    void *a = dev_alloc(n), *out = dev_alloc(n);
    cudaMemset(a, 0, n), cudaMemset(out, 0xab, n);
    attn_sdpa_desc bad = d;
    bad.n_kv_heads = 3;
    ASSERT_STATUS(attn_cuda_sdpa_fwd(ctx, &bad, a, a, a, out, NULL), ATTN_ERR_BAD_SHAPE);
    ASSERT_TRUE(strlen(attn_cuda_ctx_last_error(ctx)) > 0);
    bad = d, bad.dropout_p = 0.5; // the context generator's dropout: CPU-only
    ASSERT_STATUS(attn_cuda_sdpa_fwd(ctx, &bad, a, a, a, out, NULL), ATTN_ERR_UNSUPPORTED);
    ASSERT_TRUE(strstr(attn_cuda_ctx_last_error(ctx), "PHILOX") != NULL);
    float *lse = dev_alloc(2 * 8 * sizeof(float)), dm;
    // dmask without a float mask (as attn_sdpa_bwd answers)
    ASSERT_STATUS(attn_cuda_sdpa_bwd(ctx, &d, a, a, a, out, a, lse, out, out, out, &dm), ATTN_ERR_BAD_MASK);
    ASSERT_TRUE(strstr(attn_cuda_ctx_last_error(ctx), "F32 attention mask") != NULL);
    ASSERT_STATUS(attn_cuda_sdpa_bwd(ctx, &d, a, a, a, out, NULL, lse, out, out, out, NULL), ATTN_ERR_INVALID_ARG);
    bad = d, bad.q_stride[2] = 0; // a gradient row would overwrite another
    ASSERT_STATUS(attn_cuda_sdpa_bwd(ctx, &bad, a, a, a, out, a, lse, out, out, out, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_cuda_sdpa_fwd(ctx, &d, a, NULL, a, out, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_cuda_sdpa_fwd(NULL, &d, a, a, a, out, NULL), ATTN_ERR_INVALID_ARG);
    int pageable = 0;
    cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0);
    if (!pageable) { // a host array the GPU cannot read is refused before the launch
        static unsigned char host_q[2 * 8 * 64 * 2];
        ASSERT_STATUS(attn_cuda_sdpa_fwd(ctx, &d, host_q, a, a, out, NULL), ATTN_ERR_INVALID_ARG);
        ASSERT_TRUE(strstr(attn_cuda_ctx_last_error(ctx), "host memory") != NULL);
        static unsigned char host_ws[4096]; // the kernels would write it
        ASSERT_STATUS(attn_cuda_ctx_set_workspace(ctx, host_ws, sizeof host_ws), ATTN_ERR_INVALID_ARG);
        ASSERT_TRUE(strstr(attn_cuda_ctx_last_error(ctx), "host memory") != NULL);
    }
    void *ws = dev_alloc(64);
    const int64_t cu[2] = {0, 8};
    ASSERT_OK(attn_cuda_ctx_set_workspace(ctx, ws, 1)); // too small for the offsets
    attn_sdpa_desc vd = d;
    vd.q_stride[0] = vd.k_stride[0] = vd.v_stride[0] = vd.o_stride[0] = 0;
    ASSERT_STATUS(attn_cuda_sdpa_varlen_fwd(ctx, &vd, cu, cu, a, a, a, out, NULL), ATTN_ERR_WORKSPACE);
    expect_untouched(out, n, "a rejected call");
    ASSERT_OK(attn_cuda_ctx_set_workspace(ctx, NULL, 0));
    cudaFree(a), cudaFree(out), cudaFree(ws), cudaFree(lse);
    attn_cuda_ctx_free(ctx);
}

// The caller's allocator (attn_cuda_ctx_params.allocator): the workspace, KV caches and modules
// allocate through it; an injected failure is ATTN_ERR_OUT_OF_MEMORY with a message, writes
// nothing and leaks nothing, and the next call works. Streams: one of the context's device is
// taken (a second GPU, when there is one, checks that its streams are refused).
static void test_allocator(void) {
    attn_cuda_ctx *probe_ctx = gpu_ctx(ATTN_CUDA_KERNELS_AUTO); // skips without a GPU
    attn_cuda_ctx_free(probe_ctx);
    counting_mem cm = {0, -1, 0, 0};
    attn_cuda_ctx_params p;
    attn_cuda_ctx_params_init(&p);
    p.allocator.alloc = counting_alloc, p.allocator.free = counting_free, p.allocator.user = &cm;
    attn_cuda_ctx *ctx = NULL;
    ASSERT_OK(attn_cuda_ctx_create(&p, &ctx));
    // the workspace: a packed batch needs one for its offsets
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = 1, d.n_heads = 2, d.len_q = 8, d.len_kv = 8, d.head_dim = 64;
    const int64_t st4[4] = {0, 8 * 64, 64, 1}, cu[2] = {0, 8};
    memcpy(d.q_stride, st4, sizeof st4), memcpy(d.k_stride, st4, sizeof st4), memcpy(d.v_stride, st4, sizeof st4);
    memcpy(d.o_stride, st4, sizeof st4);
    d.q_dtype = d.kv_dtype = d.out_dtype = ATTN_DTYPE_BF16;
    const size_t n = 2 * 8 * 64 * 2;
    void *a = dev_alloc(n), *out = dev_alloc(n);
    cudaMemset(a, 0, n), cudaMemset(out, 0xab, n);
    cm.fail_at = cm.calls;
    ASSERT_STATUS(attn_cuda_sdpa_varlen_fwd(ctx, &d, cu, cu, a, a, a, out, NULL), ATTN_ERR_OUT_OF_MEMORY);
    ASSERT_TRUE(strstr(attn_cuda_ctx_last_error(ctx), "workspace") != NULL);
    expect_untouched(out, n, "a call whose workspace failed");
    cm.fail_at = -1;
    ASSERT_OK(attn_cuda_sdpa_varlen_fwd(ctx, &d, cu, cu, a, a, a, out, NULL));
    ASSERT_TRUE(cm.allocs >= 1);
    // a paged KV cache: its allocations fail one after the other, then it is made
    attn_cuda_kv_cache_config kc;
    attn_cuda_kv_cache_config_init(&kc);
    kc.batch = 2, kc.n_kv_heads = 2, kc.head_dim = 64, kc.capacity = 100, kc.page_size = 16, kc.dtype = ATTN_DTYPE_BF16;
    int made = 0;
    for (int k = 0; k < 16 && !made; k++) {
        attn_cuda_kv_cache *c = (attn_cuda_kv_cache *)&cm; // must be overwritten
        const int live = cm.allocs - cm.frees;
        cm.fail_at = cm.calls + k;
        const attn_status st = attn_cuda_kv_cache_create(ctx, &kc, &c);
        if (st == ATTN_OK) {
            made = 1;
            ASSERT_TRUE(k >= 3); // the storage of k and v, the lengths and the page table
            attn_cuda_kv_cache_free(c);
        } else {
            ASSERT_STATUS(st, ATTN_ERR_OUT_OF_MEMORY);
            ASSERT_TRUE(c == NULL && strlen(attn_cuda_ctx_last_error(ctx)) > 0);
        }
        if (cm.allocs - cm.frees != live) FAIL("kv cache (failing allocation %d): %d device allocations leaked", k, cm.allocs - cm.frees - live);
    }
    ASSERT_TRUE(made);
    // the module: its parameters
    attn_mha_config mc;
    attn_mha_config_init(&mc, 32, 2);
    attn_ctx *cpu = NULL;
    ASSERT_OK(attn_ctx_create(NULL, &cpu));
    attn_mha *host = NULL;
    ASSERT_OK(attn_mha_create(cpu, &mc, &host));
    for (int k = 0; k < 2; k++) {
        attn_cuda_mha *m = NULL;
        const int live = cm.allocs - cm.frees;
        cm.fail_at = cm.calls + k;
        ASSERT_STATUS(attn_cuda_mha_create(ctx, host, &m), ATTN_ERR_OUT_OF_MEMORY);
        ASSERT_TRUE(m == NULL && strstr(attn_cuda_ctx_last_error(ctx), "cannot be had") != NULL);
        if (cm.allocs - cm.frees != live) FAIL("module (failing allocation %d): allocations leaked", k);
    }
    cm.fail_at = -1;
    attn_mha_free(host);
    attn_ctx_free(cpu);
    // streams
    cudaStream_t s = NULL;
    if (cudaStreamCreate(&s) != cudaSuccess) FAIL("cudaStreamCreate");
    ASSERT_OK(attn_cuda_ctx_set_stream(ctx, (attn_cuda_stream)s));
    ASSERT_OK(attn_cuda_sdpa_varlen_fwd(ctx, &d, cu, cu, a, a, a, out, NULL));
    int ndev = 0;
    cudaGetDeviceCount(&ndev);
    if (ndev > 1) {
        cudaStream_t other = NULL;
        cudaSetDevice(1);
        if (cudaStreamCreate(&other) != cudaSuccess) FAIL("cudaStreamCreate on device 1");
        cudaSetDevice(0);
        ASSERT_STATUS(attn_cuda_ctx_set_stream(ctx, (attn_cuda_stream)other), ATTN_ERR_INVALID_ARG);
        ASSERT_TRUE(attn_cuda_ctx_stream(ctx) == (attn_cuda_stream)s);
        cudaStreamDestroy(other);
    } else {
        fprintf(stderr, "    one GPU: a stream of another device is not tried\n");
    }
    if (cudaStreamSynchronize(s) != cudaSuccess) FAIL("the stream failed");
    ASSERT_OK(attn_cuda_ctx_set_stream(ctx, NULL));
    cudaStreamDestroy(s);
    attn_cuda_ctx_free(ctx);
    ASSERT_OK(cudaDeviceSynchronize() == cudaSuccess ? ATTN_OK : ATTN_ERR_DEVICE);
    if (cm.allocs != cm.frees) FAIL("%d allocations, %d frees", cm.allocs, cm.frees);
    cudaFree(a), cudaFree(out);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {HARNESS_CASE(test_context_without_gpu), HARNESS_CASE(test_bad_arguments),
                                         HARNESS_CASE(test_allocator),
                                         HARNESS_CASE(test_plain_auto),          HARNESS_CASE(test_options_auto),
                                         HARNESS_CASE(test_options_simple),      HARNESS_CASE(test_varlen_auto),
                                         HARNESS_CASE(test_backward),            HARNESS_CASE(test_backward_varlen),
                                         HARNESS_CASE(test_backward_simple),     HARNESS_CASE(test_backward_flash_vs_simple),
                                         HARNESS_CASE(test_backward_deterministic),
                                         HARNESS_CASE(test_decode),              HARNESS_CASE(test_backward_dmask),
                                         HARNESS_CASE(test_rising_scores),       HARNESS_CASE(test_sm90),
                                         HARNESS_CASE(test_float_mask_past_log2_range),
                                         HARNESS_CASE(test_backward_d256)};
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

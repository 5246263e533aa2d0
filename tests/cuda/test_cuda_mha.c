// test_cuda_mha.c - nn.MultiheadAttention on the GPU (attn_cuda_mha_*) against the CPU module
// (attn_mha_*) holding the same parameters, through the public APIs: random configurations (self,
// cross and key = value attention, batch_first, unbatched, bias or not, kdim and vdim other than E
// (separate q/k/v weights), add_bias_kv, add_zero_attn, causal, bool and float masks of 2 and 3
// dimensions, key padding masks), forward, training forward and backward (every
// parameter's and input's gradient), F32 within 1e-4 of the largest element and BF16 within 2^-5
// (the GPU rounds the projections and the intermediate gradients to bfloat16, the CPU keeps
// them in float32); Philox dropout: the same seed and offset give the same bits, another offset
// another mask; the parameters copied back; decoding with a device cache (contiguous and paged)
// against the CPU module's cached forward, which refuses the modules it cannot serve. Without a GPU: argument checks, and the GPU cases
// report themselves skipped (ATTN_CUDA_REQUIRE_GPU makes that a failure, as make test-cuda sets).
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_cuda.h"
#include "harness.h"
#include "cuda_test_util.h"

// Values of type t (float, or half bit patterns) as floats.
static float *as_floats(const void *x, attn_dtype t, int64_t n) {
    float *f = malloc((size_t)n * sizeof(float));
    ASSERT_OK(attn_convert(ATTN_DTYPE_F32, f, t, x, n));
    return f;
}

static void close_to(const char *what, const float *got, const float *want, int64_t n, double tol, uint64_t seed) {
    double mx = 1e-6;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(want[i]));
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= tol * mx))
            FAIL("seed %llu: %s[%lld] = %g, CPU %g (tolerance %g of the largest, %g)", (unsigned long long)seed, what,
                 (long long)i, got[i], want[i], tol, mx);
    harness_checks++;
}

// A CPU module of cfg (its parameters drawn by a context seeded with seed) and its copy on the GPU;
// without cuBLASLt the case is skipped.
static void module_pair(attn_cuda_ctx *g, const attn_mha_config *cfg, uint64_t seed, attn_ctx **cpu, attn_mha **host,
                        attn_cuda_mha **dev) {
    ASSERT_OK(attn_ctx_create(NULL, cpu));
    attn_generator_seed(attn_ctx_generator(*cpu), seed);
    ASSERT_OK(attn_mha_create(*cpu, cfg, host));
    const attn_status cs = attn_cuda_mha_create(g, *host, dev);
    if (cs == ATTN_ERR_UNSUPPORTED) SKIP("%s", attn_cuda_ctx_last_error(g));
    ASSERT_OK(cs);
}

// The elements of the host module's parameter i.
static int64_t param_numel(attn_mha *host, int i) {
    int ndim;
    int64_t shape[3], n = 1;
    ASSERT_OK(attn_mha_param_typed_at(host, i, NULL, &ndim, shape, NULL, NULL));
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

static void run_case(attn_cuda_ctx *g, attn_dtype dt, int use_dropout) {
    const uint64_t seed = rng;
    const int64_t H = 1 + pick(4), hd = (int64_t)8 << pick(3), E = H * hd;
    const int kind = pick(3); // 0 self, 1 cross, 2 key = value
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, E, H);
    cfg.bias = pick(4) != 0, cfg.batch_first = pick(2), cfg.dtype = dt;
    cfg.dropout = use_dropout ? 0.25 : 0.0;
    if (kind != 0 && pick(2) == 0) { // separate q/k/v weights: the key's and value's widths (equal when key = value)
        cfg.kdim = 8 * (1 + pick(6));
        cfg.vdim = kind == 2 ? cfg.kdim : 8 * (1 + pick(6));
    }
    cfg.add_bias_kv = pick(3) == 0, cfg.add_zero_attn = pick(3) == 0;
    const int64_t kd = cfg.kdim != 0 ? cfg.kdim : E, vd = cfg.vdim != 0 ? cfg.vdim : E;
    attn_ctx *cpu = NULL;
    attn_mha *host = NULL;
    attn_cuda_mha *dev = NULL;
    module_pair(g, &cfg, seed, &cpu, &host, &dev);

    const int unbatched = pick(5) == 0;
    const int64_t N = unbatched ? 1 : 1 + pick(3), L = 1 + pick(40), S = kind == 0 ? L : 1 + pick(40);
    const size_t es = attn_dtype_size(dt);
    const int64_t nq = N * L * E, nk = N * S * kd, nv = N * S * vd;
    float *xq = malloc((size_t)nq * 4), *xk = malloc((size_t)nk * 4), *xv = malloc((size_t)nv * 4);
    for (int64_t i = 0; i < nq; i++) xq[i] = urand();
    for (int64_t i = 0; i < nk; i++) xk[i] = urand();
    for (int64_t i = 0; i < nv; i++) xv[i] = urand();
    void *hq = malloc((size_t)nq * es), *hk = malloc((size_t)nk * es), *hv = malloc((size_t)nv * es);
    ASSERT_OK(attn_convert(dt, hq, ATTN_DTYPE_F32, xq, nq));
    ASSERT_OK(attn_convert(dt, hk, ATTN_DTYPE_F32, xk, nk));
    ASSERT_OK(attn_convert(dt, hv, ATTN_DTYPE_F32, xv, nv));
    void *dq_in = up(hq, (size_t)nq * es), *dk_in = up(hk, (size_t)nk * es), *dv_in = up(hv, (size_t)nv * es);

    attn_mha_args ca;
    attn_mha_args_init(&ca);
    ca.need_weights = 0, ca.unbatched = unbatched, ca.batch = N, ca.len_q = L, ca.len_kv = S;
    attn_cuda_mha_args ga;
    attn_cuda_mha_args_init(&ga);
    ga.base.need_weights = 0, ga.base.unbatched = unbatched, ga.base.batch = N, ga.base.len_q = L, ga.base.len_kv = S;
    ca.query = hq, ga.base.query = dq_in;
    if (kind == 1) ca.key = hk, ca.value = hv, ga.base.key = dk_in, ga.base.value = dv_in;
    if (kind == 2) ca.key = ca.value = hk, ga.base.key = ga.base.value = dk_in;
    void *dmask = NULL, *dkpm = NULL, *mask = NULL;
    uint8_t *kpm = NULL;
    const int mask_kind = pick(4); // 0 none, 1 causal, 2 bool (L, S), 3 float (N H, L, S)
    if (mask_kind == 1 && kind == 0) ca.causal = ga.base.causal = 1;
    if (mask_kind == 2 || mask_kind == 3) {
        const int64_t n = mask_kind == 2 ? L * S : N * H * L * S;
        const size_t b = mask_kind == 2 ? 1 : 4;
        mask = malloc((size_t)n * b);
        for (int64_t i = 0; i < n; i++) {
            if (mask_kind == 2) ((uint8_t *)mask)[i] = pick(5) == 0;
            else ((float *)mask)[i] = urand();
        }
        dmask = up(mask, (size_t)n * b);
        ca.attn_mask = mask, ga.base.attn_mask = dmask;
        ca.attn_mask_dtype = ga.base.attn_mask_dtype = mask_kind == 2 ? ATTN_DTYPE_BOOL : ATTN_DTYPE_F32;
        ca.attn_mask_ndim = ga.base.attn_mask_ndim = mask_kind == 2 ? 2 : 3;
    }
    if (pick(3) == 0) {
        kpm = malloc((size_t)(N * S));
        for (int64_t i = 0; i < N * S; i++) kpm[i] = pick(6) == 0;
        dkpm = up(kpm, (size_t)(N * S));
        ca.key_padding_mask = kpm, ga.base.key_padding_mask = dkpm;
        ca.key_padding_mask_dtype = ga.base.key_padding_mask_dtype = ATTN_DTYPE_BOOL;
    }
    const double tol = dt == ATTN_DTYPE_F32 ? 1e-4 : 0x1p-5;

    // forward (inference) against the CPU module
    void *hout = malloc((size_t)nq * es), *dout_buf = up(NULL, (size_t)nq * es), *gout = malloc((size_t)nq * es);
    ASSERT_OK(attn_mha_forward(cpu, host, &ca, hout, NULL));
    if (attn_cuda_mha_forward(g, dev, &ga, dout_buf) != ATTN_OK) FAIL("seed %llu: %s", (unsigned long long)seed, attn_cuda_ctx_last_error(g));
    down(gout, dout_buf, (size_t)nq * es);
    float *a = as_floats(gout, dt, nq), *b = as_floats(hout, dt, nq);
    close_to("out", a, b, nq, tol, seed);
    free(a), free(b);

    // training: forward_train and backward (without dropout against the CPU; with it, repeatable)
    ca.training = ga.base.training = 1;
    ga.dropout_seed = 99, ga.dropout_offset = 7;
    size_t sbytes = 0;
    ASSERT_OK(attn_cuda_mha_saved_size(g, dev, &ga, &sbytes));
    void *saved = up(NULL, sbytes);
    float *go = malloc((size_t)nq * 4);
    for (int64_t i = 0; i < nq; i++) go[i] = urand();
    void *hgo = malloc((size_t)nq * es);
    ASSERT_OK(attn_convert(dt, hgo, ATTN_DTYPE_F32, go, nq));
    void *dgo = up(hgo, (size_t)nq * es);
    const int np = attn_mha_param_count(host);
    float *dparams[8] = {0}, *hparams[8] = {0};
    int64_t pn[8];
    for (int i = 0; i < np; i++) {
        pn[i] = param_numel(host, i);
        dparams[i] = up(NULL, (size_t)pn[i] * 4), hparams[i] = malloc((size_t)pn[i] * 4);
    }
    void *gdq = up(NULL, (size_t)nq * es), *gdk = kind != 0 ? up(NULL, (size_t)nk * es) : NULL;
    void *gdv = kind == 1 ? up(NULL, (size_t)nv * es) : NULL;
    ASSERT_OK(attn_cuda_mha_forward_train(g, dev, &ga, dout_buf, saved, sbytes));
    if (attn_cuda_mha_backward(g, dev, &ga, saved, sbytes, dgo, gdq, gdk, gdv, dparams) != ATTN_OK)
        FAIL("seed %llu: backward: %s", (unsigned long long)seed, attn_cuda_ctx_last_error(g));
    if (!use_dropout) {
        size_t hbytes = 0;
        ASSERT_OK(attn_mha_saved_size(cpu, host, &ca, &hbytes));
        void *hsaved = malloc(hbytes);
        void *hdq = malloc((size_t)nq * es), *hdk = kind != 0 ? malloc((size_t)nk * es) : NULL;
        void *hdv = kind == 1 ? malloc((size_t)nv * es) : NULL;
        ASSERT_OK(attn_mha_forward_train(cpu, host, &ca, hout, NULL, hsaved, hbytes));
        ASSERT_OK(attn_mha_backward(cpu, host, &ca, hsaved, hbytes, hgo, hdq, hdk, hdv, hparams));
        void *grads[3][2] = {{gdq, hdq}, {gdk, hdk}, {gdv, hdv}};
        const int64_t gn[3] = {nq, nk, nv};
        static const char *gname[3] = {"dquery", "dkey", "dvalue"};
        for (int x = 0; x < 3; x++) {
            if (grads[x][0] == NULL) continue;
            void *raw = malloc((size_t)gn[x] * es);
            down(raw, grads[x][0], (size_t)gn[x] * es);
            float *ga_f = as_floats(raw, dt, gn[x]), *ha_f = as_floats(grads[x][1], dt, gn[x]);
            close_to(gname[x], ga_f, ha_f, gn[x], 4 * tol, seed);
            free(raw), free(ga_f), free(ha_f);
        }
        for (int i = 0; i < np; i++) {
            float *gp = malloc((size_t)pn[i] * 4);
            down(gp, dparams[i], (size_t)pn[i] * 4);
            const char *name;
            ASSERT_OK(attn_mha_param_typed_at(host, i, &name, NULL, NULL, NULL, NULL));
            close_to(name, gp, hparams[i], pn[i], 4 * tol, seed);
            free(gp);
        }
        free(hsaved), free(hdq), free(hdk), free(hdv);
    } else { // the same seed and offset: the same bits; another offset: another output
        void *o1 = malloc((size_t)nq * es), *o2 = malloc((size_t)nq * es);
        down(o1, dout_buf, (size_t)nq * es);
        ASSERT_OK(attn_cuda_mha_forward_train(g, dev, &ga, dout_buf, saved, sbytes));
        down(o2, dout_buf, (size_t)nq * es);
        ASSERT_TRUE(memcmp(o1, o2, (size_t)nq * es) == 0);
        ga.dropout_offset = 8;
        ASSERT_OK(attn_cuda_mha_forward_train(g, dev, &ga, dout_buf, saved, sbytes));
        down(o2, dout_buf, (size_t)nq * es);
        ASSERT_TRUE(nq * (int64_t)es < 64 || memcmp(o1, o2, (size_t)nq * es) != 0);
        free(o1), free(o2);
    }
    ASSERT_OK(attn_cuda_mha_to_host(g, dev, host)); // the same values back
    for (int i = 0; i < np; i++) cudaFree(dparams[i]), free(hparams[i]);
    cudaFree(dq_in), cudaFree(dk_in), cudaFree(dv_in), cudaFree(dmask), cudaFree(dkpm), cudaFree(dout_buf);
    cudaFree(saved), cudaFree(dgo), cudaFree(gdq), cudaFree(gdk), cudaFree(gdv);
    free(xq), free(xk), free(xv), free(hq), free(hk), free(hv), free(mask), free(kpm), free(hout), free(gout), free(go);
    free(hgo);
    attn_cuda_mha_free(dev);
    attn_mha_free(host);
    attn_ctx_free(cpu);
}

static void test_f32_against_cpu(void) {
    attn_cuda_ctx *g = gpu_ctx();
    for (int r = 0; r < 16; r++) run_case(g, ATTN_DTYPE_F32, 0);
    attn_cuda_ctx_free(g);
}

static void test_bf16_against_cpu(void) {
    attn_cuda_ctx *g = gpu_ctx();
    for (int r = 0; r < 8; r++) run_case(g, ATTN_DTYPE_BF16, 0);
    attn_cuda_ctx_free(g);
}

static void test_dropout_repeatable(void) {
    attn_cuda_ctx *g = gpu_ctx();
    for (int r = 0; r < 4; r++) run_case(g, ATTN_DTYPE_F32, 1);
    attn_cuda_ctx_free(g);
}

// Decoding: a prompt then single tokens through attn_cuda_mha_forward_cached with a contiguous and
// a paged device cache, against attn_mha_forward_cached with a CPU cache (F32, 1e-4 of the largest);
// modules with separate q/k/v weights or added keys refused, as the CPU refuses them.
static void test_cached_against_cpu(void) {
    attn_cuda_ctx *g = gpu_ctx();
    for (int opt = 0; opt < 3; opt++) {
        attn_mha_config cfg;
        attn_mha_config_init(&cfg, 32, 4);
        if (opt == 0) cfg.kdim = 16;
        if (opt == 1) cfg.add_bias_kv = 1;
        if (opt == 2) cfg.add_zero_attn = 1;
        attn_ctx *cpu = NULL;
        attn_mha *host = NULL;
        attn_cuda_mha *dev = NULL;
        module_pair(g, &cfg, rng, &cpu, &host, &dev);
        attn_cuda_kv_cache_config dc;
        attn_cuda_kv_cache_config_init(&dc);
        dc.batch = 1, dc.n_kv_heads = 4, dc.head_dim = 8, dc.capacity = 8, dc.dtype = ATTN_DTYPE_F32;
        attn_cuda_kv_cache *dcache = NULL;
        ASSERT_OK(attn_cuda_kv_cache_create(g, &dc, &dcache));
        void *dx = up(NULL, 32 * 4), *dout = up(NULL, 32 * 4);
        ASSERT_STATUS(attn_cuda_mha_forward_cached(g, dev, dcache, dx, 1, 1, dout), ATTN_ERR_UNSUPPORTED);
        cudaFree(dx), cudaFree(dout);
        attn_cuda_kv_cache_free(dcache);
        attn_cuda_mha_free(dev);
        attn_mha_free(host);
        attn_ctx_free(cpu);
    }
    for (int paged = 0; paged < 2; paged++) {
        const uint64_t seed = rng;
        const int64_t E = 64, H = 4, N = 2, steps[4] = {5, 1, 1, 3};
        attn_mha_config cfg;
        attn_mha_config_init(&cfg, E, H);
        cfg.batch_first = pick(2);
        attn_ctx *cpu = NULL;
        attn_mha *host = NULL;
        attn_cuda_mha *dev = NULL;
        module_pair(g, &cfg, seed, &cpu, &host, &dev);
        attn_kv_cache_config hc;
        attn_kv_cache_config_init(&hc);
        hc.batch = N, hc.n_kv_heads = H, hc.head_dim = E / H, hc.capacity = 32;
        attn_kv_cache *hcache = NULL;
        ASSERT_OK(attn_kv_cache_create(cpu, &hc, &hcache));
        attn_cuda_kv_cache_config dc;
        attn_cuda_kv_cache_config_init(&dc);
        dc.batch = N, dc.n_kv_heads = H, dc.head_dim = E / H, dc.capacity = 32, dc.dtype = ATTN_DTYPE_F32;
        dc.page_size = paged ? 16 : 0;
        attn_cuda_kv_cache *dcache = NULL;
        ASSERT_OK(attn_cuda_kv_cache_create(g, &dc, &dcache));
        for (int st = 0; st < 4; st++) {
            const int64_t n = N * steps[st] * E;
            float *x = malloc((size_t)n * 4), *want = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
            for (int64_t i = 0; i < n; i++) x[i] = urand();
            void *dx = up(x, (size_t)n * 4), *dout = up(NULL, (size_t)n * 4);
            ASSERT_OK(attn_mha_forward_cached(cpu, host, hcache, x, N, steps[st], want));
            if (attn_cuda_mha_forward_cached(g, dev, dcache, dx, N, steps[st], dout) != ATTN_OK)
                FAIL("seed %llu: %s", (unsigned long long)seed, attn_cuda_ctx_last_error(g));
            down(got, dout, (size_t)n * 4);
            close_to(paged ? "paged cached out" : "cached out", got, want, n, 1e-4, seed);
            cudaFree(dx), cudaFree(dout);
            free(x), free(want), free(got);
        }
        attn_cuda_kv_cache_free(dcache);
        attn_kv_cache_free(hcache);
        attn_cuda_mha_free(dev);
        attn_mha_free(host);
        attn_ctx_free(cpu);
    }
    attn_cuda_ctx_free(g);
}

// Refused calls change nothing and launch nothing: decoding with a cache that does not fit the
// module (another batch, head dim or type: the module's buffers have N rows of E, so an append before
// the check would read past them and write the cache) or has no room left keeps the cache's lengths
// and out's bytes; a training forward and a backward with a mask of a type masks cannot have are
// refused before any projection, so out, saved and every gradient keep their poison; host pointers
// the GPU cannot read (inputs, out, a cache's new keys) are refused before anything reads them.
static void test_refusals_change_nothing(void) {
    attn_cuda_ctx *g = gpu_ctx();
    const int64_t E = 32, H = 4, N = 2, L = 3;
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, E, H);
    attn_ctx *cpu = NULL;
    attn_mha *host = NULL;
    attn_cuda_mha *dev = NULL;
    module_pair(g, &cfg, rng, &cpu, &host, &dev);
    float x[2 * 3 * 32];
    for (int i = 0; i < N * L * E; i++) x[i] = urand();
    const size_t bytes = (size_t)(N * L * E) * 4;
    unsigned char poison[2 * 3 * 32 * 4], back[2 * 3 * 32 * 4];
    memset(poison, 0x7b, sizeof poison);
    void *dx = up(x, bytes), *dout = up(poison, bytes);
    // caches that do not fit: batch N + 3, head dim 16 (4 heads of 16 > E), BF16; then one of
    // capacity 4 holding 2 tokens, 3 more asked for
    for (int k = 0; k < 4; k++) {
        attn_cuda_kv_cache_config dc;
        attn_cuda_kv_cache_config_init(&dc);
        dc.batch = k == 0 ? N + 3 : N, dc.n_kv_heads = H, dc.head_dim = k == 1 ? 16 : E / H, dc.capacity = k == 3 ? 4 : 16;
        dc.dtype = k == 2 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F32;
        attn_cuda_kv_cache *c = NULL;
        ASSERT_OK(attn_cuda_kv_cache_create(g, &dc, &c));
        int64_t before[5] = {0}, after[5] = {0};
        if (k == 3) { // two tokens in
            ASSERT_OK(attn_cuda_mha_forward_cached(g, dev, c, dx, N, 2, dout));
            if (cudaMemcpy(dout, poison, bytes, cudaMemcpyHostToDevice) != cudaSuccess) FAIL("cudaMemcpy");
        }
        ASSERT_OK(attn_cuda_kv_cache_lengths(c, before));
        const attn_status st = attn_cuda_mha_forward_cached(g, dev, c, dx, N, L, dout);
        ASSERT_STATUS(st, k == 3 ? ATTN_ERR_CAPACITY : ATTN_ERR_BAD_SHAPE);
        ASSERT_TRUE(strchr(attn_cuda_ctx_last_error(g), '\n') == NULL && attn_cuda_ctx_last_error(g)[0] != '\0');
        ASSERT_OK(attn_cuda_kv_cache_lengths(c, after));
        ASSERT_TRUE(memcmp(before, after, sizeof before) == 0);
        if (cudaDeviceSynchronize() != cudaSuccess) FAIL("cudaDeviceSynchronize");
        down(back, dout, bytes);
        ASSERT_TRUE(memcmp(back, poison, bytes) == 0);
        attn_cuda_kv_cache_free(c);
    }
    // host memory the GPU cannot read (where it reads pageable memory, such pointers are valid)
    int pageable = 0;
    cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0);
    if (!pageable) {
        attn_cuda_mha_args h;
        attn_cuda_mha_args_init(&h);
        h.base.batch = N, h.base.len_q = L, h.base.query = x; // host
        ASSERT_STATUS(attn_cuda_mha_forward(g, dev, &h, dout), ATTN_ERR_INVALID_ARG);
        ASSERT_TRUE(strstr(attn_cuda_ctx_last_error(g), "query is host memory") != NULL);
        h.base.query = dx;
        ASSERT_STATUS(attn_cuda_mha_forward(g, dev, &h, back), ATTN_ERR_INVALID_ARG);
        ASSERT_TRUE(strstr(attn_cuda_ctx_last_error(g), "out is host memory") != NULL);
        attn_cuda_kv_cache_config dc;
        attn_cuda_kv_cache_config_init(&dc);
        dc.batch = N, dc.n_kv_heads = H, dc.head_dim = E / H, dc.capacity = 16, dc.dtype = ATTN_DTYPE_F32;
        attn_cuda_kv_cache *c = NULL;
        ASSERT_OK(attn_cuda_kv_cache_create(g, &dc, &c));
        ASSERT_STATUS(attn_cuda_mha_forward_cached(g, dev, c, x, N, L, dout), ATTN_ERR_INVALID_ARG);
        const int64_t n1[2] = {1, 1}, zero[2] = {0, 0};
        int64_t lens[2] = {-1, -1};
        ASSERT_STATUS(attn_cuda_kv_cache_append(g, c, n1, x, dx), ATTN_ERR_INVALID_ARG);
        ASSERT_TRUE(strstr(attn_cuda_ctx_last_error(g), "k is host memory") != NULL);
        ASSERT_OK(attn_cuda_kv_cache_lengths(c, lens));
        ASSERT_TRUE(memcmp(lens, zero, sizeof zero) == 0);
        attn_cuda_kv_cache_free(c);
        if (cudaDeviceSynchronize() != cudaSuccess) FAIL("cudaDeviceSynchronize");
        down(back, dout, bytes);
        ASSERT_TRUE(memcmp(back, poison, bytes) == 0);
    }
    // a mask of type Q8_0: the training forward and the backward refuse it before any launch
    attn_cuda_mha_args a;
    attn_cuda_mha_args_init(&a);
    a.base.batch = N, a.base.len_q = L, a.base.query = dx, a.base.training = 1;
    size_t sbytes = 0;
    ASSERT_OK(attn_cuda_mha_saved_size(g, dev, &a, &sbytes));
    unsigned char *spoison = malloc(sbytes), *sback = malloc(sbytes);
    memset(spoison, 0x7b, sbytes);
    void *saved = up(spoison, sbytes), *dmask = up(poison, (size_t)(L * L));
    a.base.attn_mask = dmask, a.base.attn_mask_dtype = ATTN_DTYPE_Q8_0, a.base.attn_mask_ndim = 2;
    ASSERT_STATUS(attn_cuda_mha_forward_train(g, dev, &a, dout, saved, sbytes), ATTN_ERR_BAD_MASK);
    const int np = attn_mha_param_count(host);
    float *dparams[8] = {0};
    int64_t pn[8];
    for (int i = 0; i < np; i++) {
        pn[i] = param_numel(host, i);
        float *h = malloc((size_t)pn[i] * 4);
        memset(h, 0x7b, (size_t)pn[i] * 4);
        dparams[i] = up(h, (size_t)pn[i] * 4);
        free(h);
    }
    void *dgo = up(x, bytes), *dq = up(poison, bytes);
    ASSERT_STATUS(attn_cuda_mha_backward(g, dev, &a, saved, sbytes, dgo, dq, NULL, NULL, dparams), ATTN_ERR_BAD_MASK);
    if (cudaDeviceSynchronize() != cudaSuccess) FAIL("cudaDeviceSynchronize");
    down(back, dout, bytes);
    ASSERT_TRUE(memcmp(back, poison, bytes) == 0);
    down(back, dq, bytes);
    ASSERT_TRUE(memcmp(back, poison, bytes) == 0);
    down(sback, saved, sbytes);
    ASSERT_TRUE(memcmp(sback, spoison, sbytes) == 0);
    for (int i = 0; i < np; i++) {
        float *h = malloc((size_t)pn[i] * 4);
        down(h, dparams[i], (size_t)pn[i] * 4);
        for (int64_t j = 0; j < pn[i]; j++) ASSERT_TRUE(((const unsigned char *)h)[4 * j] == 0x7b);
        free(h), cudaFree(dparams[i]);
    }
    cudaFree(dx), cudaFree(dout), cudaFree(saved), cudaFree(dmask), cudaFree(dgo), cudaFree(dq);
    free(spoison), free(sback);
    attn_cuda_mha_free(dev);
    attn_mha_free(host);
    attn_ctx_free(cpu);
    attn_cuda_ctx_free(g);
}

// Without a GPU (or before any device work): argument checks that need no device.
static void test_arguments(void) {
    attn_cuda_mha_args a;
    memset(&a, 0x5a, sizeof a);
    attn_cuda_mha_args_init(&a);
    ASSERT_EQ_INT(a.base.need_weights, 0);
    ASSERT_EQ_INT(a.base.training, 0);
    ASSERT_EQ_U64(a.dropout_seed, 0);
    attn_cuda_mha *m = (attn_cuda_mha *)&a;
    ASSERT_STATUS(attn_cuda_mha_create(NULL, NULL, &m), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_cuda_mha_forward(NULL, NULL, &a, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_cuda_mha_param(NULL, "in_proj_weight", NULL, NULL, NULL, NULL), ATTN_ERR_INVALID_ARG);
    attn_cuda_mha_free(NULL);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {HARNESS_CASE(test_arguments), HARNESS_CASE(test_f32_against_cpu),
                                         HARNESS_CASE(test_bf16_against_cpu), HARNESS_CASE(test_dropout_repeatable),
                                         HARNESS_CASE(test_cached_against_cpu), HARNESS_CASE(test_refusals_change_nothing)};
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

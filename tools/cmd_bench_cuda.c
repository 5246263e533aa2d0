// cmd_bench_cuda.c - attn bench --device cuda: times libattn_cuda's SDPA forward (or forward and
// backward, --backward) with CUDA events
// (median of --repeat runs after --warmup, rotating over --sets input sets so no run finds the
// previous one's inputs in L2). In a build without libattn_cuda the options are still parsed and
// the command answers that the GPU path is not built.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#ifdef ATTN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "attn_cuda.h"
#endif

static const char *summary =
    "usage: attn bench --device cuda [--op sdpa|decode|mha] [--dtype bf16|f16|f32] [--batch B] [--heads H]\n"
    "                  [--kv-heads Hkv] [--len-q L] [--len-kv S] [--head-dim D] [--causal] [--backward]\n"
    "                  [--deterministic] [--dropout P] [--page-size P] [--repeat R] [--warmup W] [--sets N]\n"
    "                  [--kernels auto|simple|sm80|sm90] [--json]\n"
    "Times libattn_cuda on GPU 0 with CUDA events: the median of R runs after W warm-up runs, the inputs\n"
    "rotating over N sets. --op sdpa (q (B, H, L, D), k and v (B, Hkv, S, D), contiguous) reports ms and\n"
    "TFLOP/s (4 B H D times the visible (query, key) pairs); with --backward each run is the forward and\n"
    "the backward, counted as 3.5 times the forward's flops; the kernel column names the forward's and the\n"
    "backward's (fwd+bwd), --deterministic sets the context's deterministic flag (the backward's dQ\n"
    "without atomics). --dropout P draws Philox dropout (seed 1). --kernels sets the context's kernel\n"
    "choice (attn_cuda_kernels; sm90: the warpgroup-MMA forward where it applies, AUTO does not take it yet).\n"
    "--op mha times attn_cuda_mha_forward (with --backward forward_train and backward) on self-attention\n"
    "(L, B, E) inputs, E = H * D (--embed-dim to set it), heads H, causal with --causal; TFLOP/s counts\n"
    "the projections (8 B L E^2) beside the attention (3x both with --backward).\n"
    "--op decode times one decoding step against a device KV cache holding --len-kv tokens per sequence\n"
    "(contiguous, or paged with --page-size): one new query per sequence and head, bottom-right causal;\n"
    "it reports GB/s of K and V read. See docs/cuda.md and bench/run_bench_cuda.py.";

typedef struct cuda_bench_opts {
    const char *device, *op, *dtype, *kernels;
    int64_t B, H, Hkv, L, S, D, E, page_size, repeat, warmup, sets;
    double dropout;
    bool causal, json, backward, deterministic;
    int kernel_choice; // attn_cuda_kernels' value of --kernels
} cuda_bench_opts;

#ifdef ATTN_HAVE_CUDA
_Static_assert(ATTN_CUDA_KERNELS_AUTO == 0 && ATTN_CUDA_KERNELS_SIMPLE == 1 && ATTN_CUDA_KERNELS_SM80 == 2 &&
                   ATTN_CUDA_KERNELS_SM90 == 3,
               "--kernels' names in attn_cuda_kernels' order");

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

// Visible (query, key) pairs: L*S, or under top-left causal masking sum_i min(i + 1, S).
static double pairs(const cuda_bench_opts *o) {
    if (!o->causal) return (double)o->L * (double)o->S;
    double n = 0;
    for (int64_t i = 0; i < o->L; i++) n += (double)(i + 1 < o->S ? i + 1 : o->S);
    return n;
}

// One timed run: run r of -warmup .. repeat - 1 (the sdpa step picks its input set by it).
typedef attn_status (*bench_step)(void *arg, int64_t r);

// Runs step between two CUDA events on the default stream --warmup times untimed, then --repeat
// times into ms (sorted on return). Returns EXIT_OK, or EXIT_FAILURE_RUN with the failure printed.
static int time_steps(const cuda_bench_opts *o, attn_cuda_ctx *ctx, bench_step step, void *arg, float *ms) {
    cudaEvent_t ev[2] = {NULL, NULL};
    int rc = EXIT_OK;
    if (cudaEventCreate(&ev[0]) != cudaSuccess || cudaEventCreate(&ev[1]) != cudaSuccess) {
        rc = cli_error("bench", EXIT_FAILURE_RUN, "--device cuda: CUDA events cannot be made");
        goto done;
    }
    for (int64_t r = -o->warmup; r < o->repeat; r++) {
        cudaEventRecord(ev[0], NULL);
        const attn_status st = step(arg, r);
        cudaEventRecord(ev[1], NULL);
        if (st != ATTN_OK || cudaEventSynchronize(ev[1]) != cudaSuccess) {
            rc = cli_error("bench", EXIT_FAILURE_RUN, "--device cuda: %s", st != ATTN_OK ? attn_cuda_ctx_last_error(ctx) : "a run failed");
            goto done;
        }
        if (r >= 0) cudaEventElapsedTime(&ms[r], ev[0], ev[1]);
    }
    qsort(ms, (size_t)o->repeat, sizeof *ms, cmp_float);
done:
    if (ev[0] != NULL) cudaEventDestroy(ev[0]);
    if (ev[1] != NULL) cudaEventDestroy(ev[1]);
    return rc;
}

// --op sdpa: the forward (and the backward) on input set r % sets of `mem`.
typedef struct sdpa_step_arg {
    const cuda_bench_opts *o;
    attn_cuda_ctx *ctx;
    const attn_sdpa_desc *d;
    unsigned char *mem;
    size_t set_bytes, esz, nq, nk, lse_at;
} sdpa_step_arg;

static attn_status sdpa_step(void *arg, int64_t r) {
    const sdpa_step_arg *a = arg;
    const size_t nq = a->nq, nk = a->nk, esz = a->esz;
    unsigned char *base = a->mem + (size_t)((r + a->o->warmup) % a->o->sets) * a->set_bytes;
    void *q = base, *k = base + nq * esz, *v = base + (nq + nk) * esz, *out = base + (nq + 2 * nk) * esz;
    unsigned char *g = base + (2 * nq + 2 * nk) * esz; // dout, dq, dk, dv
    float *lse = (float *)(base + a->lse_at);
    attn_status st = attn_cuda_sdpa_fwd(a->ctx, a->d, q, k, v, out, a->o->backward ? lse : NULL);
    if (st == ATTN_OK && a->o->backward)
        st = attn_cuda_sdpa_bwd(a->ctx, a->d, q, k, v, out, g, lse, g + nq * esz, g + 2 * nq * esz, g + (2 * nq + nk) * esz, NULL);
    return st;
}

static int run_sdpa(const cuda_bench_opts *o, attn_dtype dt) {
    char why[256];
    if (attn_cuda_probe(0, why, sizeof why) != ATTN_OK) return cli_error("bench", EXIT_FAILURE_RUN, "--device cuda: %s", why);
    attn_cuda_ctx *ctx = NULL;
    attn_cuda_ctx_params cp;
    attn_cuda_ctx_params_init(&cp);
    cp.deterministic = o->deterministic;
    cp.kernels = (attn_cuda_kernels)o->kernel_choice;
    attn_status st = attn_cuda_ctx_create(&cp, &ctx);
    if (st != ATTN_OK) return cli_error("bench", EXIT_FAILURE_RUN, "--device cuda: %s", attn_strerror(st));
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = o->B, d.n_heads = o->H, d.n_kv_heads = o->Hkv, d.len_q = o->L, d.len_kv = o->S, d.head_dim = o->D;
    const int64_t qs[4] = {o->H * o->L * o->D, o->L * o->D, o->D, 1}, ks[4] = {o->Hkv * o->S * o->D, o->S * o->D, o->D, 1};
    memcpy(d.q_stride, qs, sizeof qs), memcpy(d.o_stride, qs, sizeof qs), memcpy(d.k_stride, ks, sizeof ks), memcpy(d.v_stride, ks, sizeof ks);
    d.q_dtype = d.kv_dtype = d.out_dtype = dt;
    d.causal = o->causal ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
    d.grad_dtype = dt;
    if (o->dropout > 0) d.dropout_p = o->dropout, d.dropout_rng = ATTN_DROPOUT_RNG_PHILOX, d.dropout_seed = 1;
    const char *kernel = "?", *bwd_kernel = NULL;
    char kernels[64];
    int rc = EXIT_OK;
    const size_t esz = attn_dtype_size(dt);
    const size_t nq = (size_t)(o->B * o->H * o->L * o->D), nk = (size_t)(o->B * o->Hkv * o->S * o->D);
    // a set: q, k, v, out, and for the backward dout, dq, dk, dv; then lse (float32, 256-byte aligned)
    const size_t tensors = (o->backward ? 4 * nq + 4 * nk : 2 * nq + 2 * nk) * esz;
    const size_t lse_at = (tensors + 255) & ~(size_t)255, nl = (size_t)(o->B * o->H * o->L);
    const size_t set_bytes = (lse_at + nl * sizeof(float) + 255) & ~(size_t)255;
    unsigned char *mem = NULL;
    float *host = malloc((nq > nk ? nq : nk) * sizeof(float));
    void *conv = malloc((nq > nk ? nq : nk) * esz);
    float *ms = malloc((size_t)o->repeat * sizeof(float));
    if ((st = attn_cuda_sdpa_kernel_name(ctx, &d, &kernel)) != ATTN_OK ||
        (o->backward && (st = attn_cuda_sdpa_bwd_kernel_name(ctx, &d, &bwd_kernel)) != ATTN_OK)) {
        rc = cli_error("bench", EXIT_USAGE, "--device cuda: %s", attn_cuda_ctx_last_error(ctx));
        goto done;
    }
    if (host == NULL || conv == NULL || ms == NULL || cudaMalloc((void **)&mem, set_bytes * (size_t)o->sets) != cudaSuccess) {
        rc = cli_error("bench", EXIT_FAILURE_RUN, "--device cuda: %zu bytes of inputs cannot be had", set_bytes * (size_t)o->sets);
        goto done;
    }
    uint64_t s = 88172645463325252ULL; // inputs uniform in [-1, 1), the same in every set
    const size_t nmax = nq > nk ? nq : nk;
    for (size_t i = 0; i < nmax; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        host[i] = (float)(s >> 40) * (2.0f / 16777216.0f) - 1.0f;
    }
    attn_convert(dt, conv, ATTN_DTYPE_F32, host, (int64_t)nmax);
    for (int64_t k = 0; k < o->sets; k++) {
        unsigned char *base = mem + (size_t)k * set_bytes;
        cudaMemcpy(base, conv, nq * esz, cudaMemcpyHostToDevice);
        cudaMemcpy(base + nq * esz, conv, nk * esz, cudaMemcpyHostToDevice);
        cudaMemcpy(base + (nq + nk) * esz, conv, nk * esz, cudaMemcpyHostToDevice);
        if (o->backward) cudaMemcpy(base + (2 * nq + 2 * nk) * esz, conv, nq * esz, cudaMemcpyHostToDevice); // dout
    }
    sdpa_step_arg sa = {.o = o, .ctx = ctx, .d = &d, .mem = mem, .set_bytes = set_bytes, .esz = esz, .nq = nq, .nk = nk,
                        .lse_at = lse_at};
    if ((rc = time_steps(o, ctx, sdpa_step, &sa, ms)) != EXIT_OK) goto done;
    snprintf(kernels, sizeof kernels, "%s%s%s", kernel, bwd_kernel != NULL ? "+" : "", bwd_kernel != NULL ? bwd_kernel : "");
    kernel = kernels;
    const double flops = (o->backward ? 3.5 : 1.0) * 4.0 * (double)(o->B * o->H * o->D) * pairs(o);
    const double med = ms[o->repeat / 2], tflops = flops / (med * 1e-3) / 1e12;
    attn_cuda_device_props props;
    attn_cuda_ctx_device(ctx, &props);
    printf("cuda sdpa%s %s B=%lld H=%lld Hkv=%lld L=%lld S=%lld D=%lld%s on %s: kernel %s, median %.4f ms (min %.4f) of %lld, "
           "%.1f TFLOP/s\n",
           o->backward ? " fwd+bwd" : "", o->dtype, (long long)o->B, (long long)o->H, (long long)o->Hkv, (long long)o->L, (long long)o->S, (long long)o->D,
           o->causal ? " causal" : "", props.name, kernel, med, ms[0], (long long)o->repeat, tflops);
    if (o->json)
        printf("{\"device\": \"%s\", \"op\": \"sdpa\", \"backward\": %s, \"dropout\": %g, \"dtype\": \"%s\", \"kernel\": \"%s\", "
               "\"B\": %lld, \"H\": %lld, \"Hkv\": %lld, "
               "\"L\": %lld, \"S\": %lld, \"D\": %lld, \"causal\": %s, \"median_ms\": %.6f, \"min_ms\": %.6f, \"tflops\": %.3f}\n",
               props.name, o->backward ? "true" : "false", o->dropout, o->dtype, kernel, (long long)o->B, (long long)o->H, (long long)o->Hkv, (long long)o->L,
               (long long)o->S, (long long)o->D, o->causal ? "true" : "false", med, ms[0], tflops);
done:
    cudaFree(mem);
    free(host), free(conv), free(ms);
    attn_cuda_ctx_free(ctx);
    return rc;
}

// --op mha: the module's forward (forward_train and backward with --backward).
typedef struct mha_step_arg {
    const cuda_bench_opts *o;
    attn_cuda_ctx *ctx;
    attn_cuda_mha *m;
    const attn_cuda_mha_args *a;
    void *out, *saved, *dx;
    size_t saved_size;
    float **dparams;
} mha_step_arg;

static attn_status mha_step(void *arg, int64_t r) {
    (void)r;
    const mha_step_arg *s = arg;
    if (!s->o->backward) return attn_cuda_mha_forward(s->ctx, s->m, s->a, s->out);
    attn_status st = attn_cuda_mha_forward_train(s->ctx, s->m, s->a, s->out, s->saved, s->saved_size);
    if (st == ATTN_OK) st = attn_cuda_mha_backward(s->ctx, s->m, s->a, s->saved, s->saved_size, s->out, s->dx, NULL, NULL, s->dparams);
    return st;
}

// --op mha: the module on the GPU, self-attention on (L, B, E).
static int run_mha(const cuda_bench_opts *o, attn_dtype dt) {
    char why[256];
    if (attn_cuda_probe(0, why, sizeof why) != ATTN_OK) return cli_error("bench", EXIT_FAILURE_RUN, "--device cuda: %s", why);
    attn_ctx *cpu = NULL;
    attn_cuda_ctx *ctx = NULL;
    attn_mha *host = NULL;
    attn_cuda_mha *m = NULL;
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, o->E, o->H);
    cfg.dtype = dt;
    int rc = EXIT_FAILURE_RUN;
    const size_t nx = (size_t)(o->L * o->B * o->E), es = attn_dtype_size(dt);
    float *ms = malloc((size_t)o->repeat * sizeof(float));
    void *x = NULL, *out = NULL, *saved = NULL, *dx = NULL;
    float *dparams[8] = {0};
    size_t saved_size = 0;
    if (attn_ctx_create(NULL, &cpu) != ATTN_OK || attn_mha_create(cpu, &cfg, &host) != ATTN_OK ||
        attn_cuda_ctx_create(NULL, &ctx) != ATTN_OK) {
        cli_error("bench", EXIT_FAILURE_RUN, "--device cuda --op mha: the module cannot be made");
        goto done;
    }
    if (attn_cuda_mha_create(ctx, host, &m) != ATTN_OK) {
        cli_error("bench", EXIT_FAILURE_RUN, "--device cuda --op mha: %s", attn_cuda_ctx_last_error(ctx));
        goto done;
    }
    attn_cuda_mha_args a;
    attn_cuda_mha_args_init(&a);
    a.base.batch = o->B, a.base.len_q = o->L, a.base.causal = o->causal, a.base.training = o->backward;
    if (ms == NULL || cudaMalloc(&x, nx * es) != cudaSuccess || cudaMalloc(&out, nx * es) != cudaSuccess ||
        cudaMalloc(&dx, nx * es) != cudaSuccess) {
        cli_error("bench", EXIT_FAILURE_RUN, "--device cuda: memory for the inputs cannot be had");
        goto done;
    }
    cudaMemset(x, 0x3c, nx * es); // not zeros (which can time faster): 0x3c3c.. is about 1.06 in f16, 0.0115 in bf16/f32
    a.base.query = x;
    if (o->backward) {
        if (attn_cuda_mha_saved_size(ctx, m, &a, &saved_size) != ATTN_OK || cudaMalloc(&saved, saved_size) != cudaSuccess) {
            cli_error("bench", EXIT_FAILURE_RUN, "--device cuda: the saved buffer cannot be had");
            goto done;
        }
        for (int i = 0; i < attn_mha_param_count(host); i++) {
            int ndim;
            int64_t sh[3], n = 1;
            attn_mha_param_typed_at(host, i, NULL, &ndim, sh, NULL, NULL);
            for (int d = 0; d < ndim; d++) n *= sh[d];
            if (cudaMalloc((void **)&dparams[i], (size_t)n * sizeof(float)) != cudaSuccess) {
                cli_error("bench", EXIT_FAILURE_RUN, "--device cuda: memory for the parameters' gradients cannot be had");
                goto done;
            }
        }
    }
    mha_step_arg sa = {.o = o, .ctx = ctx, .m = m, .a = &a, .out = out, .saved = saved, .dx = dx, .saved_size = saved_size,
                       .dparams = dparams};
    if (time_steps(o, ctx, mha_step, &sa, ms) != EXIT_OK) goto done;
    const double pairs_ = o->causal ? (double)o->L * (double)(o->L + 1) / 2.0 : (double)o->L * (double)o->L;
    const double fwd = 8.0 * (double)o->B * (double)o->L * (double)o->E * (double)o->E + 4.0 * (double)o->B * (double)o->E * pairs_;
    const double med = ms[o->repeat / 2], tflops = (o->backward ? 3.0 : 1.0) * fwd / (med * 1e-3) / 1e12;
    printf("cuda mha%s %s B=%lld E=%lld H=%lld L=%lld%s: median %.4f ms (min %.4f) of %lld, %.1f TFLOP/s\n",
           o->backward ? " fwd+bwd" : "", o->dtype, (long long)o->B, (long long)o->E, (long long)o->H, (long long)o->L,
           o->causal ? " causal" : "", med, ms[0], (long long)o->repeat, tflops);
    if (o->json)
        printf("{\"op\": \"mha\", \"backward\": %s, \"dtype\": \"%s\", \"B\": %lld, \"E\": %lld, \"H\": %lld, \"L\": %lld, "
               "\"causal\": %s, \"median_ms\": %.6f, \"min_ms\": %.6f, \"tflops\": %.3f}\n",
               o->backward ? "true" : "false", o->dtype, (long long)o->B, (long long)o->E, (long long)o->H, (long long)o->L,
               o->causal ? "true" : "false", med, ms[0], tflops);
    rc = EXIT_OK;
done:
    cudaFree(x), cudaFree(out), cudaFree(dx), cudaFree(saved);
    for (int i = 0; i < 8; i++) cudaFree(dparams[i]);
    free(ms);
    attn_cuda_mha_free(m);
    attn_cuda_ctx_free(ctx);
    attn_mha_free(host);
    attn_ctx_free(cpu);
    return rc;
}

// --op decode: one attend of the new queries against the cache.
typedef struct decode_step_arg {
    attn_cuda_ctx *ctx;
    attn_cuda_kv_cache *cache;
    const attn_sdpa_desc *d;
    const int64_t *cu_q;
    const void *q;
    void *out;
} decode_step_arg;

static attn_status decode_step(void *arg, int64_t r) {
    (void)r;
    const decode_step_arg *s = arg;
    return attn_cuda_kv_cache_attend(s->ctx, s->cache, s->d, s->cu_q, s->q, s->out, NULL);
}

// --op decode: one new token per sequence against a filled KV cache.
static int run_decode(const cuda_bench_opts *o, attn_dtype dt) {
    char why[256];
    if (attn_cuda_probe(0, why, sizeof why) != ATTN_OK) return cli_error("bench", EXIT_FAILURE_RUN, "--device cuda: %s", why);
    attn_cuda_ctx *ctx = NULL;
    attn_cuda_kv_cache *cache = NULL;
    int rc = EXIT_FAILURE_RUN;
    const size_t es = attn_dtype_size(dt);
    const int64_t chunk = o->S < 4096 ? o->S : 4096;
    void *rows = NULL, *q = NULL, *out = NULL;
    float *ms = malloc((size_t)o->repeat * sizeof(float));
    int64_t *n = malloc((size_t)o->B * sizeof(int64_t)), *cu_q = malloc((size_t)(o->B + 1) * sizeof(int64_t));
    attn_cuda_kv_cache_config cfg;
    attn_cuda_kv_cache_config_init(&cfg);
    cfg.batch = o->B, cfg.n_kv_heads = o->Hkv, cfg.head_dim = o->D, cfg.capacity = o->S, cfg.dtype = dt;
    cfg.page_size = o->page_size;
    if (ms == NULL || n == NULL || cu_q == NULL || attn_cuda_ctx_create(NULL, &ctx) != ATTN_OK) {
        cli_error("bench", EXIT_FAILURE_RUN, "--device cuda: the context cannot be made");
        goto done;
    }
    if (attn_cuda_kv_cache_create(ctx, &cfg, &cache) != ATTN_OK) {
        cli_error("bench", EXIT_FAILURE_RUN, "--device cuda: %s", attn_cuda_ctx_last_error(ctx));
        goto done;
    }
    const size_t chunk_bytes = (size_t)(o->B * chunk * o->Hkv * o->D) * es, q_bytes = (size_t)(o->B * o->H * o->D) * es;
    if (cudaMalloc(&rows, chunk_bytes) != cudaSuccess || cudaMalloc(&q, q_bytes) != cudaSuccess ||
        cudaMalloc(&out, q_bytes) != cudaSuccess) {
        cli_error("bench", EXIT_FAILURE_RUN, "--device cuda: memory for the inputs cannot be had");
        goto done;
    }
    cudaMemset(rows, 0x3c, chunk_bytes), cudaMemset(q, 0x3c, q_bytes); // not zeros, as above
    for (int64_t filled = 0; filled < o->S; filled += chunk) {
        for (int64_t b = 0; b < o->B; b++) n[b] = o->S - filled < chunk ? o->S - filled : chunk;
        if (attn_cuda_kv_cache_append(ctx, cache, n, rows, rows) != ATTN_OK) {
            cli_error("bench", EXIT_FAILURE_RUN, "--device cuda: %s", attn_cuda_ctx_last_error(ctx));
            goto done;
        }
    }
    for (int64_t b = 0; b <= o->B; b++) cu_q[b] = b;
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = o->B, d.n_heads = o->H, d.n_kv_heads = o->Hkv, d.len_q = 1, d.head_dim = o->D;
    d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    d.q_stride[1] = d.o_stride[1] = o->D, d.q_stride[2] = d.o_stride[2] = o->H * o->D, d.q_stride[3] = d.o_stride[3] = 1;
    d.q_dtype = d.kv_dtype = d.out_dtype = dt;
    decode_step_arg sa = {.ctx = ctx, .cache = cache, .d = &d, .cu_q = cu_q, .q = q, .out = out};
    if (time_steps(o, ctx, decode_step, &sa, ms) != EXIT_OK) goto done;
    const double med = ms[o->repeat / 2], bytes = 2.0 * (double)(o->B * o->Hkv) * (double)o->S * (double)o->D * (double)es;
    const double gbps = bytes / (med * 1e-3) / 1e9;
    printf("cuda decode %s B=%lld H=%lld Hkv=%lld S=%lld D=%lld page_size=%lld: median %.4f ms (min %.4f) of %lld, %.0f GB/s "
           "of K and V\n",
           o->dtype, (long long)o->B, (long long)o->H, (long long)o->Hkv, (long long)o->S, (long long)o->D,
           (long long)o->page_size, med, ms[0], (long long)o->repeat, gbps);
    if (o->json)
        printf("{\"op\": \"decode\", \"dtype\": \"%s\", \"B\": %lld, \"H\": %lld, \"Hkv\": %lld, \"S\": %lld, \"D\": %lld, "
               "\"page_size\": %lld, \"median_ms\": %.6f, \"min_ms\": %.6f, \"gbps\": %.1f}\n",
               o->dtype, (long long)o->B, (long long)o->H, (long long)o->Hkv, (long long)o->S, (long long)o->D,
               (long long)o->page_size, med, ms[0], gbps);
    rc = EXIT_OK;
done:
    cudaFree(rows), cudaFree(q), cudaFree(out);
    free(ms), free(n), free(cu_q);
    attn_cuda_kv_cache_free(cache);
    attn_cuda_ctx_free(ctx);
    return rc;
}
#endif

int cmd_bench_cuda(int argc, char **argv) {
    cuda_bench_opts o = {.device = "cuda", .op = "sdpa", .dtype = "bf16", .B = 1, .H = 16, .Hkv = 0, .L = 4096, .S = 0,
                         .D = 128, .repeat = 20, .warmup = 5, .sets = 4, .kernels = "auto"};
    arg_spec specs[] = {
        {"--device", ARG_STRING, &o.device, "cuda", "the GPU path (this summary)", false, false},
        {"--op", ARG_STRING, &o.op, "sdpa|decode|mha", "what to time (default sdpa)", false, false},
        {"--dtype", ARG_STRING, &o.dtype, "T", "bf16, f16 or f32 (default bf16)", false, false},
        {"--batch", ARG_INT, &o.B, "B", "batch size (default 1)", false, false},
        {"--heads", ARG_INT, &o.H, "H", "query heads (default 16)", false, false},
        {"--kv-heads", ARG_INT, &o.Hkv, "Hkv", "key/value heads (default H)", false, false},
        {"--len-q", ARG_INT, &o.L, "L", "query length (default 4096)", false, false},
        {"--len-kv", ARG_INT, &o.S, "S", "key length (default L)", false, false},
        {"--head-dim", ARG_INT, &o.D, "D", "head dimension (default 128)", false, false},
        {"--embed-dim", ARG_INT, &o.E, "E", "mha: embedding dimension (default H * D)", false, false},
        {"--causal", ARG_FLAG, &o.causal, NULL, "causal mask (top-left)", false, false},
        {"--backward", ARG_FLAG, &o.backward, NULL, "time the forward and the backward (sdpa)", false, false},
        {"--deterministic", ARG_FLAG, &o.deterministic, NULL, "the backward without atomics (sdpa)", false, false},
        {"--dropout", ARG_FLOAT, &o.dropout, "P", "Philox dropout probability in [0, 1) (default 0)", false, false},
        {"--page-size", ARG_INT, &o.page_size, "P", "decode: tokens per page of a paged cache (0: contiguous)", false, false},
        {"--repeat", ARG_INT, &o.repeat, "R", "timed runs (default 20)", false, false},
        {"--warmup", ARG_INT, &o.warmup, "W", "untimed runs first (default 5)", false, false},
        {"--sets", ARG_INT, &o.sets, "N", "input sets the runs rotate over (default 4)", false, false},
        {"--kernels", ARG_STRING, &o.kernels, "K", "sdpa: auto, simple, sm80 or sm90 (default auto)", false, false},
        {"--json", ARG_FLAG, &o.json, NULL, "end with a JSON object on one line", false, false},
    };
    int rc = args_parse("bench", summary, argc, argv, specs, (int)(sizeof specs / sizeof specs[0]));
    if (rc != 0) return rc < 0 ? EXIT_OK : rc;
    if (strcmp(o.device, "cuda") != 0) return cli_error("bench", EXIT_USAGE, "--device must be cpu or cuda");
    const bool sdpa = strcmp(o.op, "sdpa") == 0;
    if (!sdpa && strcmp(o.op, "decode") != 0 && strcmp(o.op, "mha") != 0)
        return cli_error("bench", EXIT_USAGE, "--op must be sdpa, decode or mha");
    attn_dtype dt;
    if (!cli_parse_float_dtype(o.dtype, &dt)) return cli_error("bench", EXIT_USAGE, "--dtype must be bf16, f16 or f32, not '%s'", o.dtype);
    if (o.Hkv == 0) o.Hkv = o.H;
    if (o.S == 0) o.S = o.L;
    if (o.B < 1 || o.H < 1 || o.Hkv < 1 || o.L < 1 || o.S < 1 || o.D < 1 || o.repeat < 1 || o.warmup < 0 || o.sets < 1 ||
        o.page_size < 0)
        return cli_error("bench", EXIT_USAGE, "sizes, --repeat and --sets must be >= 1, --warmup and --page-size >= 0");
    if (o.H % o.Hkv != 0) return cli_error("bench", EXIT_USAGE, "--heads must be a multiple of --kv-heads");
    if (!(o.dropout >= 0.0 && o.dropout < 1.0)) return cli_error("bench", EXIT_USAGE, "--dropout must be in [0, 1)");
    const bool mha = strcmp(o.op, "mha") == 0;
    if (o.backward && !sdpa && !mha) return cli_error("bench", EXIT_USAGE, "--backward applies to --op sdpa and mha");
    if (mha && o.dropout > 0) return cli_error("bench", EXIT_USAGE, "--dropout applies to --op sdpa");
    if (o.E == 0) o.E = o.H * o.D;
    if (o.E < 1 || o.E % o.H != 0) return cli_error("bench", EXIT_USAGE, "--embed-dim must be a multiple of --heads");
    if (o.page_size > 0 && strcmp(o.op, "decode") != 0) return cli_error("bench", EXIT_USAGE, "--page-size applies to --op decode");
    static const char *const kernel_names[] = {"auto", "simple", "sm80", "sm90"}; // attn_cuda_kernels' order
    o.kernel_choice = -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(o.kernels, kernel_names[i]) == 0) o.kernel_choice = i;
    if (o.kernel_choice < 0) return cli_error("bench", EXIT_USAGE, "--kernels must be auto, simple, sm80 or sm90, not '%s'", o.kernels);
    if (o.kernel_choice != 0 && !sdpa) return cli_error("bench", EXIT_USAGE, "--kernels applies to --op sdpa");
#ifdef ATTN_HAVE_CUDA
    return mha ? run_mha(&o, dt) : sdpa ? run_sdpa(&o, dt) : run_decode(&o, dt);
#else
    return cli_error("bench", EXIT_FAILURE_RUN,
                     "--device cuda: this attn was built without libattn_cuda (no CUDA compiler when it was configured)");
#endif
}

// cmd_bench.c - `attn bench`: times the library on one problem shape. It first checks the kernels
// in use against the scalar reference on a sample of query rows (strided views of the same tensors,
// so the check costs a few rows of the reference), then runs a warm-up and R timed runs and prints
// the median time, GFLOP/s and the peak resident memory.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "../bench/peak_loops.h"
#include "cli.h"

static const char summary[] =
    "usage: attn bench [--op sdpa|mha|decode|mha-decode] [--batch B] [--heads H] [--kv-heads Hkv] [--len-q L] [--len-kv S]\n"
    "                  [--head-dim D] [--embed-dim E] [--causal] [--window LEFT,RIGHT] [--threads T]\n"
    "                  [--isa ISA]\n"
    "                  [--backward] [--dropout P] [--dtype f32|f16|bf16] [--repeat R] [--no-check] [--blas]\n"
    "                  [--json] [--device cpu|cuda]\n"
    "\n"
    "Times scaled dot-product attention (--op sdpa: q, k, v of shape (B, H, L, D), (B, Hkv, S, D)) or the\n"
    "nn.MultiheadAttention forward (--op mha: self-attention on (L, B, E) with E = --embed-dim, heads H,\n"
    "need_weights=False). Inputs are standard normal. Before timing, the kernels in use are compared\n"
    "with the scalar reference on 8 query rows of up to 2 heads (sdpa; --no-check skips it; the mha\n"
    "forward is not checked here: its tests compare it with PyTorch). Prints the median\n"
    "of R runs after one warm-up (and the fastest run: the steadier figure on a busy machine; without\n"
    "--repeat, R is 5 or, for a short call, as many runs as the warm-up's time fits in 0.25 s, at most\n"
    "1000: a few runs of a sub-millisecond call are mostly first-call costs), the\n"
    "GFLOP/s (SDPA: 4*B*H*L*S*D, halved with --causal; MHA adds the four projections, 8*B*L*E^2) and\n"
    "the peak resident set; --json ends the output with one JSON object.\n"
    "--window LEFT,RIGHT (sdpa) makes it local attention as attn sdpa's (attn_sdpa_desc's use_window):\n"
    "query i sees keys i - LEFT .. i + RIGHT (-1: unbounded side; --causal bounds the right at i); the\n"
    "GFLOP/s then count the visible pairs.\n"
    "With --backward (sdpa) each run is a forward and a backward, counted as 3.5 times the forward's\n"
    "flops (the backward as 2.5 times).\n"
    "--dtype (sdpa) gives q, k, v, out and the gradients that element type (attn_sdpa_desc's dtypes) and\n"
    "measures, with the same threads, the peak of the instructions the kernels used for the products\n"
    "(fp32 FMAs, 256- or 512-bit; bf16 tensors on avx512bf16: vdpbf16ps, on amxbf16: tdpbf16ps),\n"
    "printed with the row's % of it.\n"
    "With --op mha, --dtype f16 or bf16 runs the module in that type (attn_mha_config.dtype: parameters,\n"
    "input and output of the type, float32 sums), with the same peak measurement (a bf16 module's\n"
    "products run on the bf16 dot products where the CPU has them).\n"
    "--dropout P (sdpa) applies dropout drawn from the counter-based Philox generator (dropout_rng =\n"
    "ATTN_DROPOUT_RNG_PHILOX, seed 1), in the forward and the backward; the sampled check is skipped\n"
    "then (its strided view moves the rows the mask is drawn for).\n"
    "Defaults: sdpa, B=1, H=12, L=S=1024, D=64, E=768, 1 thread, R=5.\n"
    "--op decode times one decoding step against a KV cache: see attn bench --op decode --help;\n"
    "--op mha-decode one decoding step of the module (attn_mha_forward_cached): attn bench --op mha-decode --help.";

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; // Linux reports KiB
}

bool cli_too_large(int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t n;
    return __builtin_mul_overflow(a, b, &n) || __builtin_mul_overflow(n, c, &n) || __builtin_mul_overflow(n, d, &n) ||
           n > INT64_MAX / 8;
}

int cli_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static float *alloc_randn(attn_ctx *ctx, size_t n) {
    float *x = malloc(n * sizeof(float));
    if (x != NULL && attn_rand_normal(attn_ctx_generator(ctx), x, (int64_t)n, 0.0, 1.0) != ATTN_OK) {
        free(x);
        return NULL;
    }
    return x;
}

typedef struct bench_opts {
    const char *op, *isa, *dtype, *device, *window;
    int64_t B, H, Hkv, L, S, D, E, threads, repeat;
    int64_t win_left, win_right; // --window (-1: unbounded side)
    double dropout;
    bool causal, no_check, json, backward, blas;
} bench_opts;

// Element i of a buffer of type dt, as a double.
static double elem(const void *p, attn_dtype dt, int64_t i) {
    float f = 0;
    attn_convert(ATTN_DTYPE_F32, &f, dt, (const char *)p + (size_t)i * attn_dtype_size(dt), 1);
    return f;
}

// Rounds n floats to dt in place (the buffer keeps its float size).
static void round_in_place(float *x, size_t n, attn_dtype dt) {
    if (dt == ATTN_DTYPE_F32 || x == NULL) return;
    uint16_t *h = malloc(n * 2 + 2);
    if (h == NULL) return;
    attn_convert(dt, h, ATTN_DTYPE_F32, x, (int64_t)n);
    memcpy(x, h, n * 2);
    free(h);
}

// The instructions the kernels of `isa` compute the row's products with, for the peak: the bf16 dot
// products for SDPA on bf16 tensors and for a bf16 module (its projections and attention) on
// AVX512-BF16 or AMX-BF16 (attn.h), float32 FMAs otherwise.
static bool row_peak_kind(attn_isa isa, const bench_opts *o, attn_dtype dt, peak_kind *kind) {
    const bool mha = strcmp(o->op, "mha") == 0;
    const bool dot = dt == ATTN_DTYPE_BF16 && (mha ? o->E % 2 == 0 : o->D % 2 == 0);
    if (isa == ATTN_ISA_AMX_BF16) *kind = dot ? PEAK_AMXBF16 : PEAK_FMA512;
    else if (isa == ATTN_ISA_AVX512_BF16) *kind = dot ? PEAK_DPBF16 : PEAK_FMA512;
    else if (isa == ATTN_ISA_AVX512 || isa == ATTN_ISA_AVX512_VNNI) *kind = PEAK_FMA512;
    else if (isa == ATTN_ISA_AVX2) *kind = PEAK_FMA256;
    else return false; // the portable kernels and the reference: no instruction to measure
    return true;
}

// Whether query i sees key j under --causal (top left) and --window.
static bool visible(const bench_opts *o, int64_t i, int64_t j) {
    if (o->causal && j > i) return false;
    if (o->window == NULL) return true;
    return (o->win_left < 0 || j >= i - o->win_left) && (o->win_right < 0 || j <= i + o->win_right);
}

// Query-key pairs that --causal and --window leave visible (the causal count kept as L S / 2).
static double visible_pairs(const bench_opts *o) {
    if (o->window == NULL) return (double)o->L * (double)o->S * (o->causal ? 0.5 : 1.0);
    double n = 0;
    for (int64_t i = 0; i < o->L; i++) {
        const int64_t lo = o->win_left < 0 || i - o->win_left < 0 ? 0 : i - o->win_left;
        int64_t hi = o->S - 1;
        if (o->win_right >= 0 && i + o->win_right < hi) hi = i + o->win_right;
        if (o->causal && i < hi) hi = i;
        if (hi >= lo) n += (double)(hi - lo + 1);
    }
    return n;
}

// Checks sampled rows of `out` (B, H, L, D contiguous) against the reference: up to 2 heads of batch
// 0, 8 evenly spaced query rows, as a strided view with a float mask standing in for causality. The
// error of each element is taken relative to |reference| + max|v| (attn.h's bounds have both terms).
static int check_sdpa(const bench_opts *o, const attn_sdpa_desc *d, const void *q, const void *k, const void *v,
                      const void *out, double *max_err) {
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.isa = ATTN_ISA_REF;
    attn_ctx *ref;
    if (cli_context("bench", &p, &ref) != 0) return EXIT_FAILURE_RUN;
    const int64_t rows = o->L < 8 ? o->L : 8, step = o->L / rows, heads = o->H < 2 ? o->H : 2;
    attn_sdpa_desc s = *d;
    s.batch = 1, s.n_heads = heads, s.len_q = rows;
    s.n_kv_heads = heads; // heads 0 and 1 of q use kv heads (h / group), given through the k stride
    const int64_t group = o->H / o->Hkv;
    s.k_stride[1] = s.v_stride[1] = group > 1 ? 0 : d->k_stride[1]; // with GQA both sampled heads share kv head 0
    s.q_stride[2] = d->q_stride[2] * step;
    s.causal = ATTN_CAUSAL_NONE, s.use_window = 0; // the mask below stands in for both at the sampled rows
    float *mask = calloc((size_t)(rows * o->S), sizeof(float));
    float *got = malloc((size_t)(heads * rows * o->D) * sizeof(float));
    if (mask == NULL || got == NULL) {
        free(mask), free(got);
        attn_ctx_free(ref);
        return cli_error("bench", EXIT_FAILURE_RUN, "out of memory");
    }
    if (o->causal || o->window != NULL) {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < o->S; j++)
                if (!visible(o, r * step, j)) mask[r * o->S + j] = -INFINITY;
        s.mask = mask, s.mask_dtype = ATTN_DTYPE_F32;
        s.mask_stride[0] = s.mask_stride[1] = 0, s.mask_stride[2] = o->S, s.mask_stride[3] = 1;
    }
    attn_layout_strides(ATTN_LAYOUT_BHLD, 1, heads, rows, o->D, s.o_stride);
    attn_status st = attn_sdpa_fwd(ref, &s, q, k, v, got, NULL, NULL);
    double worst = 0, vmax = 0;
    for (int64_t i = 0, n = o->B * o->Hkv * o->S * o->D; i < n; i++) vmax = fmax(vmax, fabs(elem(v, d->kv_dtype, i)));
    for (int64_t h = 0; h < heads && st == ATTN_OK; h++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t t = 0; t < o->D; t++) {
                double want = elem(got, d->out_dtype, (h * rows + r) * o->D + t);
                double have = elem(out, d->out_dtype, ((h * o->L) + r * step) * o->D + t);
                double err = fabs(have - want) / (1e-30 + fabs(want) + vmax);
                if (!(err <= worst)) worst = err; // NaN counts as the worst
            }
    free(mask);
    free(got);
    if (st != ATTN_OK) {
        cli_fail("bench", ref, st, "reference check");
        attn_ctx_free(ref);
        return EXIT_FAILURE_RUN;
    }
    attn_ctx_free(ref);
    *max_err = worst;
    const double tol = d->out_dtype == ATTN_DTYPE_BF16 ? 1e-2 : d->out_dtype == ATTN_DTYPE_F16 ? 2e-3 : 1e-5;
    if (!(worst < tol))
        return cli_error("bench", EXIT_FAILURE_RUN, "the kernels disagree with the reference: relative error %.3g", worst);
    return 0;
}

int cmd_bench(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++) // the GPU has options of its own
        if (strcmp(argv[i], "--device") == 0 && strcmp(argv[i + 1], "cpu") != 0) return cmd_bench_cuda(argc, argv);
    for (int i = 1; i + 1 < argc; i++) // decoding has options of its own
        if (strcmp(argv[i], "--op") == 0 && strcmp(argv[i + 1], "decode") == 0) return cmd_bench_decode(argc, argv);
        else if (strcmp(argv[i], "--op") == 0 && strcmp(argv[i + 1], "mha-decode") == 0)
            return cmd_bench_mha_decode(argc, argv);
    bench_opts o = {.op = "sdpa", .isa = "auto", .B = 1, .H = 12, .Hkv = 0, .L = 1024, .S = 0, .D = 64, .E = 768,
                    .threads = 1, .repeat = 5};
    arg_spec specs[] = {
        {"--op", ARG_STRING, &o.op, "sdpa|mha|decode|mha-decode", "what to time (default sdpa)", false, false},
        {"--batch", ARG_INT, &o.B, "B", "batch size (default 1)", false, false},
        {"--heads", ARG_INT, &o.H, "H", "query heads (default 12)", false, false},
        {"--kv-heads", ARG_INT, &o.Hkv, "Hkv", "key/value heads for sdpa (default H)", false, false},
        {"--len-q", ARG_INT, &o.L, "L", "query length (default 1024)", false, false},
        {"--len-kv", ARG_INT, &o.S, "S", "key length for sdpa (default L)", false, false},
        {"--head-dim", ARG_INT, &o.D, "D", "head dimension for sdpa (default 64)", false, false},
        {"--embed-dim", ARG_INT, &o.E, "E", "embedding dimension for mha (default 768)", false, false},
        {"--causal", ARG_FLAG, &o.causal, NULL, "causal mask", false, false},
        {"--window", ARG_STRING, &o.window, "LEFT,RIGHT", "local window sizes (sdpa; -1: unbounded)", false, false},
        {"--backward", ARG_FLAG, &o.backward, NULL, "time forward + backward (sdpa)", false, false},
        {"--dropout", ARG_FLOAT, &o.dropout, "P", "Philox dropout probability in [0, 1) (sdpa; default 0)", false, false},
        {"--dtype", ARG_STRING, &o.dtype, "T", "element type f32, f16 or bf16 (sdpa; the module with mha); reports % of peak",
         false, false},
        {"--threads", ARG_INT, &o.threads, "T", "threads (default 1)", false, false},
        {"--isa", ARG_STRING, &o.isa, "ISA", "kernels: " ATTN_ISA_NAMES " (default auto)", false, false},
        {"--repeat", ARG_INT, &o.repeat, "R", "timed runs (default 5, more for short calls: see above)", false, false},
        {"--no-check", ARG_FLAG, &o.no_check, NULL, "skip the check against the reference", false, false},
        {"--blas", ARG_FLAG, &o.blas, NULL, "projections through CBLAS (use_blas = 1; its own threads)", false, false},
        {"--json", ARG_FLAG, &o.json, NULL, "end with a JSON object on one line", false, false},
        {"--device", ARG_STRING, &o.device, "cpu|cuda", "cpu (default) or cuda: attn bench --device cuda --help", false, false},
    };
    int rc = args_parse("bench", summary, argc, argv, specs, (int)(sizeof specs / sizeof specs[0]));
    const bool repeat_given = args_seen(specs, (int)(sizeof specs / sizeof specs[0]), "--repeat");
    if (rc != 0) return rc < 0 ? EXIT_OK : rc;
    const bool mha = strcmp(o.op, "mha") == 0;
    if (!mha && strcmp(o.op, "sdpa") != 0) return cli_error("bench", EXIT_USAGE, "--op must be sdpa or mha");
    attn_isa isa;
    if ((rc = cli_isa("bench", o.isa, &isa)) != 0) return rc;
    if (o.Hkv == 0) o.Hkv = o.H;
    if (o.S == 0) o.S = o.L;
    if (o.B < 1 || o.H < 1 || o.Hkv < 1 || o.L < 1 || o.S < 1 || o.D < 1 || o.E < 1 || o.repeat < 1 || o.threads < 1 ||
        o.threads > 4096)
        return cli_error("bench", EXIT_USAGE, "sizes, --threads and --repeat must be >= 1");
    if (o.H % o.Hkv != 0) return cli_error("bench", EXIT_USAGE, "--heads must be a multiple of --kv-heads");
    if (mha && o.E % o.H != 0) return cli_error("bench", EXIT_USAGE, "--embed-dim must be a multiple of --heads");
    if (mha && o.backward) return cli_error("bench", EXIT_USAGE, "--backward times sdpa only");
    if (o.window != NULL && (mha || !cli_parse_window(o.window, &o.win_left, &o.win_right)))
        return cli_error("bench", EXIT_USAGE, "--window wants LEFT,RIGHT with integers >= -1, with --op sdpa");
    if (!(o.dropout >= 0.0 && o.dropout < 1.0) || (mha && o.dropout > 0.0))
        return cli_error("bench", EXIT_USAGE, "--dropout must be in [0, 1), with --op sdpa");
    if (mha) o.S = o.L, o.Hkv = o.H, o.D = o.E / o.H;
    if (cli_too_large(o.B, o.H, o.L, o.D) || cli_too_large(o.B, o.Hkv, o.S, o.D) || cli_too_large(o.L, o.B, o.E, 1))
        return cli_error("bench", EXIT_USAGE, "the tensors of these sizes would pass 2^63 bytes");
    attn_dtype dt = ATTN_DTYPE_F32;
    if (o.dtype != NULL && !cli_parse_float_dtype(o.dtype, &dt))
        return cli_error("bench", EXIT_USAGE, "--dtype must be f32, f16 or bf16, not '%s'", o.dtype);

    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.n_threads = (int)o.threads;
    p.isa = isa;
    p.use_blas = o.blas;
    attn_ctx *ctx;
    if (cli_context("bench", &p, &ctx) != 0) return EXIT_FAILURE_RUN;
    attn_status st = ATTN_OK;
    float *q = NULL, *k = NULL, *v = NULL, *out = NULL, *lse = NULL, *dout = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    attn_mha *m = NULL;
    attn_sdpa_desc d;
    attn_mha_args a;
    double check_err = -1, flops;
    rc = EXIT_FAILURE_RUN;
    const size_t nq = (size_t)(o.B * o.H * o.L * o.D), nk = (size_t)(o.B * o.Hkv * o.S * o.D);
    if (!mha) {
        q = alloc_randn(ctx, nq), k = alloc_randn(ctx, nk), v = alloc_randn(ctx, nk), out = malloc(nq * sizeof(float));
        lse = malloc((size_t)(o.B * o.H * o.L) * sizeof(float));
        if (o.backward)
            dout = alloc_randn(ctx, nq), dq = malloc(nq * sizeof(float)), dk = malloc(nk * sizeof(float)),
            dv = malloc(nk * sizeof(float));
        if (q == NULL || k == NULL || v == NULL || out == NULL || lse == NULL ||
            (o.backward && (dout == NULL || dq == NULL || dk == NULL || dv == NULL))) {
            cli_error("bench", EXIT_FAILURE_RUN, "out of memory for the inputs");
            goto done;
        }
        attn_sdpa_desc_init(&d);
        d.batch = o.B, d.n_heads = o.H, d.n_kv_heads = o.Hkv, d.len_q = o.L, d.len_kv = o.S, d.head_dim = o.D;
        d.causal = o.causal ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
        if (o.window != NULL) d.use_window = 1, d.window_left = o.win_left, d.window_right = o.win_right;
        attn_layout_strides(ATTN_LAYOUT_BHLD, o.B, o.H, o.L, o.D, d.q_stride);
        attn_layout_strides(ATTN_LAYOUT_BHLD, o.B, o.Hkv, o.S, o.D, d.k_stride);
        memcpy(d.v_stride, d.k_stride, sizeof d.k_stride);
        memcpy(d.o_stride, d.q_stride, sizeof d.q_stride);
        flops = 4.0 * (double)o.B * (double)o.H * (double)o.D * visible_pairs(&o);
        if (o.backward) flops *= 3.5;
        d.q_dtype = d.kv_dtype = d.out_dtype = d.grad_dtype = dt;
        if (o.dropout > 0.0) d.dropout_p = o.dropout, d.dropout_rng = ATTN_DROPOUT_RNG_PHILOX, d.dropout_seed = 1;
        round_in_place(q, nq, dt), round_in_place(k, nk, dt), round_in_place(v, nk, dt), round_in_place(dout, nq, dt);
    } else {
        attn_mha_config cfg;
        attn_mha_config_init(&cfg, o.E, o.H);
        cfg.dtype = dt;
        st = attn_mha_create(ctx, &cfg, &m);
        const size_t nx = (size_t)(o.L * o.B * o.E);
        q = alloc_randn(ctx, nx), out = malloc(nx * sizeof(float));
        k = dt != ATTN_DTYPE_F32 ? malloc(nx * attn_dtype_size(dt)) : NULL; // the query of the module's type
        if (st != ATTN_OK || q == NULL || out == NULL || (dt != ATTN_DTYPE_F32 && k == NULL)) {
            cli_error("bench", EXIT_FAILURE_RUN, "cannot set up the module: %s", attn_ctx_last_error(ctx));
            goto done;
        }
        if (k != NULL) attn_convert(dt, k, ATTN_DTYPE_F32, q, (int64_t)nx);
        attn_mha_args_init(&a);
        a.query = k != NULL ? (const void *)k : (const void *)q;
        a.batch = o.B, a.len_q = o.L, a.causal = o.causal, a.need_weights = 0;
        flops = 8.0 * (double)o.B * (double)o.L * (double)o.E * (double)o.E +
                4.0 * (double)o.B * (double)o.L * (double)o.L * (double)o.E * (o.causal ? 0.5 : 1.0);
    }
    // warm-up (also the run that is checked)
    const double warm0 = cli_now();
    st = mha ? attn_mha_forward(ctx, m, &a, out, NULL) : attn_sdpa_fwd(ctx, &d, q, k, v, out, lse, NULL);
    if (st == ATTN_OK && o.backward) st = attn_sdpa_bwd(ctx, &d, q, k, v, out, dout, lse, NULL, dq, dk, dv, NULL);
    const double warm = cli_now() - warm0;
    if (st != ATTN_OK) {
        cli_fail("bench", ctx, st, "forward");
        goto done;
    }
    if (!repeat_given && warm * 5.0 < 0.25) // a short call: as many runs as 0.25 s holds, at most 1000
        o.repeat = warm * 1000.0 <= 0.25 ? 1000 : (int64_t)(0.25 / warm);
    if (!o.no_check && !mha && o.dropout == 0.0 && check_sdpa(&o, &d, q, k, v, out, &check_err) != 0) goto done;
    double *times = malloc((size_t)o.repeat * sizeof(double));
    if (times == NULL) goto done;
    double started = cli_now();
    for (int64_t r = 0; r < o.repeat; r++) {
        double t0 = cli_now();
        st = mha ? attn_mha_forward(ctx, m, &a, out, NULL) : attn_sdpa_fwd(ctx, &d, q, k, v, out, lse, NULL);
        if (st == ATTN_OK && o.backward) st = attn_sdpa_bwd(ctx, &d, q, k, v, out, dout, lse, NULL, dq, dk, dv, NULL);
        times[r] = cli_now() - t0;
        if (st != ATTN_OK) break;
        if (cli_now() - started > 10.0 && !o.json)
            fprintf(stderr, "attn bench: run %lld of %lld, %.1f ms\n", (long long)r + 1, (long long)o.repeat,
                    times[r] * 1e3);
    }
    if (st != ATTN_OK) {
        free(times);
        cli_fail("bench", ctx, st, "forward");
        goto done;
    }
    qsort(times, (size_t)o.repeat, sizeof(double), cli_cmp_double);
    const double median = o.repeat % 2 ? times[o.repeat / 2] : 0.5 * (times[o.repeat / 2 - 1] + times[o.repeat / 2]);
    const double fastest = times[0];
    free(times);
    const double gflops = flops / median / 1e9, rss = peak_rss_mb();
    peak_kind kind = PEAK_FMA256;
    double peak = 0;
    float sink = 0;
    if (o.dtype != NULL && row_peak_kind(attn_ctx_isa(ctx), &o, dt, &kind))
        peak = peak_measure(kind, (int)o.threads, 20000000L, 3, &sink);
    const double io_mb = mha ? 2.0 * (double)(o.L * o.B * o.E) * (double)attn_dtype_size(dt) / 1048576.0
                             : (double)(2 * nq + 2 * nk) * (double)attn_dtype_size(dt) / 1048576.0; // q, k, v, out
    char shape[160], window[48] = ""; // "LEFT,RIGHT"
    if (o.window != NULL) snprintf(window, sizeof window, "%lld,%lld", (long long)o.win_left, (long long)o.win_right);
    if (mha)
        snprintf(shape, sizeof shape, "mha %s B=%lld E=%lld H=%lld L=%lld", attn_dtype_name(dt), (long long)o.B,
                 (long long)o.E, (long long)o.H, (long long)o.L);
    else
        snprintf(shape, sizeof shape, "sdpa B=%lld H=%lld Hkv=%lld L=%lld S=%lld D=%lld", (long long)o.B,
                 (long long)o.H, (long long)o.Hkv, (long long)o.L, (long long)o.S, (long long)o.D);
    printf("%s%s%s%s%s%s threads=%lld isa=%s: median %.3f ms (fastest %.3f), %.1f GFLOP/s, peak RSS %.1f MiB (inputs+outputs %.1f MiB)%s\n",
           shape, o.causal ? " causal" : "", o.window != NULL ? " window=" : "", window, o.dropout > 0.0 ? " dropout(Philox)" : "", o.backward ? " forward+backward" : "",
           (long long)o.threads, attn_isa_name(attn_ctx_isa(ctx)), median * 1e3, fastest * 1e3, gflops,
           rss, io_mb, check_err >= 0 ? "; agrees with the reference" : "");
    if (o.dtype != NULL) {
        if (peak > 0)
            printf("%s: %.0f%% of the %s peak (%.1f GFLOP/s measured now on %lld threads)\n", o.dtype,
                   100.0 * gflops / peak, peak_name(kind), peak, (long long)o.threads);
        else
            printf("%s: no peak measured for the %s kernels\n", o.dtype, attn_isa_name(attn_ctx_isa(ctx)));
    }
    if (o.json)
        printf("{\"op\": \"%s\", \"batch\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"len_q\": %lld, \"len_kv\": %lld, "
               "\"head_dim\": %lld, \"embed_dim\": %lld, \"causal\": %s, \"window\": %s%s%s, \"backward\": %s, \"threads\": %lld, \"isa\": \"%s\", "
               "\"repeat\": %lld, \"median_ms\": %.4f, \"fastest_ms\": %.4f, \"warmup_ms\": %.4f, \"gflops\": %.2f, \"peak_rss_mb\": %.1f, \"io_mb\": %.1f, "
               "\"check_rel_err\": %.3g, \"dtype\": \"%s\", \"peak_instr\": %s%s%s, \"peak_gflops\": %.2f, "
               "\"pct_peak\": %.2f}\n",
               mha ? "mha" : "sdpa", (long long)o.B, (long long)o.H, (long long)o.Hkv, (long long)o.L, (long long)o.S,
               (long long)o.D, (long long)o.E, o.causal ? "true" : "false", o.window != NULL ? "\"" : "", o.window != NULL ? window : "null", o.window != NULL ? "\"" : "", o.backward ? "true" : "false",
               (long long)o.threads,
               attn_isa_name(attn_ctx_isa(ctx)), (long long)o.repeat, median * 1e3, fastest * 1e3, warm * 1e3, gflops,
               rss, io_mb, check_err,
               attn_dtype_name(dt), peak > 0 ? "\"" : "", peak > 0 ? peak_name(kind) : "null", peak > 0 ? "\"" : "", peak,
               peak > 0 ? 100.0 * gflops / peak : 0.0);
    rc = EXIT_OK;
done:
    free(q), free(k), free(v), free(out), free(lse), free(dout), free(dq), free(dk), free(dv);
    attn_mha_free(m);
    attn_ctx_free(ctx);
    return rc;
}

// cmd_bench_mha_decode.c - `attn bench --op mha-decode`: one decoding step of nn.MultiheadAttention
// (attn_mha_forward_cached: one new token per sequence, its four projections and the attention over
// a KV cache of S positions), the call a generating model makes per layer and token. Reports the
// median time and the bytes the step reads (the projections' weights, the cache's keys and values)
// over it.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char summary[] =
    "usage: attn bench --op mha-decode [--batch B] [--heads H] [--embed-dim E] [--len-kv S]\n"
    "                  [--dtype f32|f16|bf16] [--kv-dtype f32|f16|bf16|q8_0|q4_0] [--threads T] [--isa ISA]\n"
    "                  [--repeat R] [--json]\n"
    "\n"
    "Times attn_mha_forward_cached for one new token per sequence: a module of embedding dimension E and\n"
    "H heads (attn_mha_config.dtype --dtype; parameters drawn as torch draws them), x of shape (1, B, E),\n"
    "and a KV cache (B, H, S, E/H) of type --kv-dtype (default: the module's type) already holding S\n"
    "positions of standard normal keys and values. Each timed step appends its token, so the cache grows\n"
    "from S to S + R. Prints the median of R steps after one warm-up (and the fastest step) and the\n"
    "bytes a step reads over the median: the four projections' weights (4*E*E*bytes(dtype)) and the\n"
    "cache's keys and values at S positions (B*S*2*E*bytes(kv-dtype), 34/32 bytes per value for q8_0,\n"
    "18/32 for q4_0). The results are not checked here (the module's tests compare it with PyTorch).\n"
    "--json ends the output with one JSON object (median_ms, fastest_ms, gbps, ...).\n"
    "Defaults: B=1, H=12, E=768, S=1024, f32, 1 thread, R=50.";

#define STEP_INPUTS 16 // different tokens the timed steps take in turn

int cmd_bench_mha_decode(int argc, char **argv) {
    const char *op = "mha-decode", *isa_name = "auto", *dtype_name = "f32", *kv_name = NULL;
    int64_t B = 1, H = 12, E = 768, S = 1024, threads = 1, repeat = 50;
    bool json = false;
    arg_spec specs[] = {
        {"--op", ARG_STRING, &op, "mha-decode", "what to time", false, false},
        {"--batch", ARG_INT, &B, "B", "sequences (default 1)", false, false},
        {"--heads", ARG_INT, &H, "H", "heads (default 12)", false, false},
        {"--embed-dim", ARG_INT, &E, "E", "embedding dimension, a multiple of H (default 768)", false, false},
        {"--len-kv", ARG_INT, &S, "S", "cached positions before the timed steps (default 1024)", false, false},
        {"--dtype", ARG_STRING, &dtype_name, "T", "the module's type: f32, f16 or bf16 (default f32)", false, false},
        {"--kv-dtype", ARG_STRING, &kv_name, "T", "cache type: f32, f16, bf16, q8_0 or q4_0 (default the module's)",
         false, false},
        {"--threads", ARG_INT, &threads, "T", "threads (default 1)", false, false},
        {"--isa", ARG_STRING, &isa_name, "ISA", "kernels: " ATTN_ISA_NAMES, false, false},
        {"--repeat", ARG_INT, &repeat, "R", "timed steps (default 50)", false, false},
        {"--json", ARG_FLAG, &json, NULL, "end with a JSON object on one line", false, false},
    };
    int rc = args_parse("bench", summary, argc, argv, specs, (int)(sizeof specs / sizeof specs[0]));
    if (rc != 0) return rc < 0 ? EXIT_OK : rc;
    attn_dtype dt, kdt;
    if (!cli_parse_float_dtype(dtype_name, &dt))
        return cli_error("bench", EXIT_USAGE, "--dtype must be f32, f16 or bf16, not '%s'", dtype_name);
    if (kv_name == NULL) kdt = dt, kv_name = dtype_name;
    else if (!cli_parse_kv_dtype(kv_name, &kdt))
        return cli_error("bench", EXIT_USAGE, "--kv-dtype must be f32, f16, bf16, q8_0 or q4_0, not '%s'", kv_name);
    attn_isa isa;
    if ((rc = cli_isa("bench", isa_name, &isa)) != 0) return rc;
    if (B < 1 || H < 1 || E < 1 || S < 1 || repeat < 1 || threads < 1 || threads > 4096)
        return cli_error("bench", EXIT_USAGE, "sizes, --threads and --repeat must be >= 1");
    if (E % H != 0) return cli_error("bench", EXIT_USAGE, "--embed-dim must be a multiple of --heads");
    if (cli_too_large(STEP_INPUTS, B, E, 1) || S > INT64_MAX - repeat - 1)
        return cli_error("bench", EXIT_USAGE, "--batch times --embed-dim, or --len-kv plus --repeat, is too large");
    const int64_t D = E / H;

    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.n_threads = (int)threads, p.isa = isa;
    attn_ctx *ctx;
    if (cli_context("bench", &p, &ctx) != 0) return EXIT_FAILURE_RUN;
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, E, H);
    cfg.dtype = dt;
    attn_mha *m = NULL;
    attn_kv_cache *kc = NULL;
    const size_t es = attn_dtype_size(dt);
    float *xf = malloc((size_t)(STEP_INPUTS * B * E) * sizeof(float));
    void *x = malloc((size_t)(STEP_INPUTS * B * E) * es), *out = malloc((size_t)(B * E) * es);
    double *times = malloc((size_t)repeat * sizeof(double));
    rc = EXIT_FAILURE_RUN;
    attn_status st;
    if (xf == NULL || x == NULL || out == NULL || times == NULL) {
        cli_error("bench", EXIT_FAILURE_RUN, "out of memory");
        goto done;
    }
    if ((st = attn_mha_create(ctx, &cfg, &m)) != ATTN_OK) {
        cli_fail("bench", ctx, st, "creating the module");
        goto done;
    }
    attn_kv_cache_config cc;
    attn_kv_cache_config_init(&cc);
    cc.batch = B, cc.n_kv_heads = H, cc.head_dim = D, cc.capacity = S + repeat + 1, cc.dtype = kdt;
    if ((st = attn_kv_cache_create(ctx, &cc, &kc)) != ATTN_OK || (st = cli_fill_cache(ctx, kc, B, H, S, D)) != ATTN_OK ||
        (st = attn_rand_normal(attn_ctx_generator(ctx), xf, STEP_INPUTS * B * E, 0.0, 1.0)) != ATTN_OK ||
        (st = attn_convert(dt, x, ATTN_DTYPE_F32, xf, STEP_INPUTS * B * E)) != ATTN_OK) {
        cli_fail("bench", ctx, st, "filling the cache");
        goto done;
    }
    for (int64_t r = -1; r < repeat; r++) { // r = -1: the warm-up
        const void *xr = (const char *)x + (size_t)(((r + 1) % STEP_INPUTS) * B * E) * es;
        const double t0 = cli_now();
        if ((st = attn_mha_forward_cached(ctx, m, kc, xr, B, 1, out)) != ATTN_OK) {
            cli_fail("bench", ctx, st, "decoding step");
            goto done;
        }
        if (r >= 0) times[r] = cli_now() - t0;
    }
    qsort(times, (size_t)repeat, sizeof(double), cli_cmp_double);
    const double median = repeat % 2 ? times[repeat / 2] : 0.5 * (times[repeat / 2 - 1] + times[repeat / 2]);
    const double fastest = times[0];
    const double wbytes = 4.0 * (double)E * (double)E * (double)es;
    const double kvbytes = (double)B * (double)S * 2.0 * (double)E * (double)attn_dtype_size(kdt) /
                           (double)attn_dtype_block_size(kdt);
    const double gbps = (wbytes + kvbytes) / median / 1e9;
    printf("mha-decode B=%lld E=%lld H=%lld S=%lld dtype=%s kv=%s threads=%lld isa=%s: median %.3f ms (fastest %.3f) a "
           "step, %.1f GB/s (weights %.1f MiB, K and V %.1f MiB a step)\n",
           (long long)B, (long long)E, (long long)H, (long long)S, dtype_name, kv_name, (long long)threads,
           attn_isa_name(attn_ctx_isa(ctx)), median * 1e3, fastest * 1e3, gbps, wbytes / 1048576.0, kvbytes / 1048576.0);
    if (json)
        printf("{\"op\": \"mha-decode\", \"batch\": %lld, \"embed_dim\": %lld, \"heads\": %lld, \"len_kv\": %lld, "
               "\"dtype\": \"%s\", \"kv_dtype\": \"%s\", \"threads\": %lld, \"isa\": \"%s\", \"repeat\": %lld, "
               "\"median_ms\": %.4f, \"fastest_ms\": %.4f, \"gbps\": %.2f, \"weight_bytes\": %.0f, \"kv_bytes\": %.0f}\n",
               (long long)B, (long long)E, (long long)H, (long long)S, dtype_name, kv_name, (long long)threads,
               attn_isa_name(attn_ctx_isa(ctx)), (long long)repeat, median * 1e3, fastest * 1e3, gbps, wbytes, kvbytes);
    rc = EXIT_OK;
done:
    free(xf), free(x), free(out), free(times);
    attn_kv_cache_free(kc);
    attn_mha_free(m);
    attn_ctx_free(ctx);
    return rc;
}

// cmd_bench_decode.c - `attn bench --op decode`: one decoding step (one query per head) against a
// KV cache of S positions, the memory-bound call of token-by-token generation. Reports the median
// time and the effective bandwidth: the bytes of K and V read per step over the median time.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char summary[] =
    "usage: attn bench --op decode [--batch B] [--heads H] [--kv-heads Hkv] [--len-kv S] [--head-dim D]\n"
    "                  [--kv-dtype f32|f16|bf16|q8_0|q4_0] [--threads T] [--isa ISA] [--repeat R] [--no-check] [--json]\n"
    "\n"
    "Times attn_kv_cache_attend for one new query per head (B, H, 1, D) against a cache of S positions\n"
    "(B, Hkv, S, D) of the given type, filled with standard normal keys and values (q8_0 and q4_0:\n"
    "quantised in blocks of 32 along D, which must be a multiple of 32). Before timing, the result is\n"
    "compared with the scalar reference on the same stored values (--no-check skips it; q8_0 and q4_0\n"
    "on avx2, avx512vnni and the bf16 ISAs, whose kernels round the query to int8, within attn.h's\n"
    "bound for that). Prints the median of R steps after one warm-up (and the fastest step) and the\n"
    "effective bandwidth, the bytes of K and V the kernels read per step over the median:\n"
    "B*Hkv*S*2*D*bytes(kv-dtype), with 34/32 bytes per value for q8_0 and 18/32 for q4_0 (scales\n"
    "included); --json ends the output with one JSON object (median_ms, fastest_ms, gbps, ...).\n"
    "Defaults: B=1, H=32, Hkv=8, S=4096, D=128, f32, 1 thread, R=50.";

attn_status cli_fill_cache(attn_ctx *ctx, attn_kv_cache *kc, int64_t B, int64_t Hkv, int64_t S, int64_t D) {
    const int64_t block = 1024;
    float *k = malloc((size_t)(B * Hkv * block * D) * sizeof(float));
    float *v = malloc((size_t)(B * Hkv * block * D) * sizeof(float));
    attn_status st = k != NULL && v != NULL ? ATTN_OK : ATTN_ERR_OUT_OF_MEMORY;
    for (int64_t at = 0; at < S && st == ATTN_OK; at += block) {
        const int64_t n = S - at < block ? S - at : block;
        st = attn_rand_normal(attn_ctx_generator(ctx), k, B * Hkv * n * D, 0.0, 1.0);
        if (st == ATTN_OK) st = attn_rand_normal(attn_ctx_generator(ctx), v, B * Hkv * n * D, 0.0, 1.0);
        if (st == ATTN_OK) st = attn_kv_cache_append(ctx, kc, n, k, NULL, v, NULL);
    }
    free(k), free(v);
    return st;
}

// The largest magnitude of a value of kv head hk of a block type (Q8_0 values are at most 127 |d|
// of their block, Q4_0 ones 8 |d|).
static double block_head_max(attn_dtype dt, const void *x, const int64_t st[4], int64_t b, int64_t hk, int64_t S,
                             int64_t D) {
    const double most = dt == ATTN_DTYPE_Q8_0 ? 127.0 : 8.0;
    double m = 0.0;
    for (int64_t j = 0; j < S; j++)
        for (int64_t t = 0; t < D; t += 32) {
            const uint8_t *blk = (const uint8_t *)x + (b * st[0] + hk * st[1] + j * st[2] + t) / 32 * attn_dtype_size(dt);
            uint16_t h;
            memcpy(&h, blk, 2);
            float f;
            attn_convert(ATTN_DTYPE_F32, &f, ATTN_DTYPE_F16, &h, 1);
            m = fmax(m, most * fabs((double)f));
        }
    return m;
}

// The reference on the cache's own storage (the same rounded values), relative error of `out`;
// with q_rounded (Q8_0 and Q4_0 on attn_isa_int8_query's ISAs: the query rounded to int8), the
// error beyond attn.h's bound for that rounding, with the weights' rounding of the ISA `isa`
// (bf16 on the bf16 ISAs, int16 on AVX512_VNNI).
static attn_status check(const attn_sdpa_desc *d, attn_kv_cache *kc, const float *q, const float *out, bool q_rounded,
                         attn_isa isa, double *worst) {
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.isa = ATTN_ISA_REF;
    attn_ctx *ref;
    attn_status st = attn_ctx_create(&p, &ref);
    if (st != ATTN_OK) return st;
    const attn_kv_cache_config *c = attn_kv_cache_get_config(kc);
    attn_sdpa_desc r = *d;
    void *k, *v;
    attn_kv_cache_storage(kc, &k, r.k_stride, &v, r.v_stride);
    r.n_kv_heads = c->n_kv_heads, r.len_kv = attn_kv_cache_length(kc), r.kv_dtype = c->dtype;
    const int64_t n = d->batch * d->n_heads * d->head_dim;
    float *want = malloc((size_t)n * sizeof(float));
    st = want != NULL ? attn_sdpa_fwd(ref, &r, q, k, v, want, NULL, NULL) : ATTN_ERR_OUT_OF_MEMORY;
    *worst = 0;
    const int64_t D = d->head_dim, group = d->n_heads / c->n_kv_heads;
    double allowed = 0.0; // the row's: attn.h (kv_dtype), (exp(2 delta_q) (1 + u) - 1) max|v'| + f
    const bool bf16 = attn_isa_bf16_dot(isa), int16 = isa == ATTN_ISA_AVX512_VNNI;
    const double u = bf16 ? ldexp(1, -8) : 0.0, f = bf16 ? (double)r.len_kv * ldexp(1, -122) : 0.0;
    // AVX512_VNNI: Q (2^-9 m_d + S 2^-125), Q m_d from block_head_max (127 |d| for Q8_0: Q = 128)
    const double q_most = c->dtype == ATTN_DTYPE_Q8_0 ? 128.0 : 8.0, q_ratio = c->dtype == ATTN_DTYPE_Q8_0 ? 128.0 / 127.0 : 1.0;
    double kmax = 0.0, vmax = 0.0; // of the kv head (b, hk) = `head`, a group's rows in a row
    int64_t head = -1;
    for (int64_t i = 0; st == ATTN_OK && i < n; i++) {
        if (q_rounded && i % D == 0) {
            const int64_t row = i / D, b = row / d->n_heads, hk = row % d->n_heads / group;
            if (b * c->n_kv_heads + hk != head) {
                head = b * c->n_kv_heads + hk;
                kmax = block_head_max(c->dtype, k, r.k_stride, b, hk, r.len_kv, D);
                vmax = block_head_max(c->dtype, v, r.v_stride, b, hk, r.len_kv, D);
            }
            double msum = 0.0;
            for (int64_t t0 = 0; t0 < D; t0 += 32) {
                double m = 0.0;
                for (int64_t t = t0; t < t0 + 32; t++) m = fmax(m, fabs((double)q[row * D + t]));
                msum += 32.0 * m;
            }
            const double dq = ((1.0 / sqrt((double)D)) * (1.0 / 254 + ldexp(1, -20)) * msum + ldexp(1, -96) * (double)D) * kmax;
            allowed = (exp(2 * dq) * (1 + u) - 1) * vmax + f +
                      (int16 ? q_ratio * vmax * ldexp(1, -9) + q_most * (double)r.len_kv * ldexp(1, -125) : 0.0);
        }
        const double e = fmax(0.0, fabs((double)out[i] - want[i]) - allowed) / (1e-3 + fabs((double)want[i]));
        if (!(e <= *worst)) *worst = e;
    }
    free(want);
    attn_ctx_free(ref);
    return st;
}

int cmd_bench_decode(int argc, char **argv) {
    const char *op = "decode", *isa_name = "auto", *dtype_name = "f32";
    int64_t B = 1, H = 32, Hkv = 8, S = 4096, D = 128, threads = 1, repeat = 50;
    bool no_check = false, json = false;
    arg_spec specs[] = {
        {"--op", ARG_STRING, &op, "decode", "what to time", false, false},
        {"--batch", ARG_INT, &B, "B", "batch size (default 1)", false, false},
        {"--heads", ARG_INT, &H, "H", "query heads (default 32)", false, false},
        {"--kv-heads", ARG_INT, &Hkv, "Hkv", "key/value heads (default 8)", false, false},
        {"--len-kv", ARG_INT, &S, "S", "cached positions (default 4096)", false, false},
        {"--head-dim", ARG_INT, &D, "D", "head dimension (default 128)", false, false},
        {"--kv-dtype", ARG_STRING, &dtype_name, "T", "cache type: f32, f16, bf16, q8_0 or q4_0 (default f32)", false,
         false},
        {"--threads", ARG_INT, &threads, "T", "threads (default 1)", false, false},
        {"--isa", ARG_STRING, &isa_name, "ISA", "kernels: " ATTN_ISA_NAMES, false, false},
        {"--repeat", ARG_INT, &repeat, "R", "timed steps (default 50)", false, false},
        {"--no-check", ARG_FLAG, &no_check, NULL, "skip the check against the reference", false, false},
        {"--json", ARG_FLAG, &json, NULL, "end with a JSON object on one line", false, false},
    };
    int rc = args_parse("bench", summary, argc, argv, specs, (int)(sizeof specs / sizeof specs[0]));
    if (rc != 0) return rc < 0 ? EXIT_OK : rc;
    attn_dtype dt;
    if (!cli_parse_kv_dtype(dtype_name, &dt))
        return cli_error("bench", EXIT_USAGE, "--kv-dtype must be f32, f16, bf16, q8_0 or q4_0, not '%s'", dtype_name);
    attn_isa isa;
    if ((rc = cli_isa("bench", isa_name, &isa)) != 0) return rc;
    if (B < 1 || H < 1 || Hkv < 1 || S < 1 || D < 1 || repeat < 1 || threads < 1 || threads > 4096)
        return cli_error("bench", EXIT_USAGE, "sizes, --threads and --repeat must be >= 1");
    if (H % Hkv != 0) return cli_error("bench", EXIT_USAGE, "--heads must be a multiple of --kv-heads");
    if (cli_too_large(B, H, D, 1))
        return cli_error("bench", EXIT_USAGE, "--batch times --heads times --head-dim is too large");

    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.n_threads = (int)threads, p.isa = isa;
    attn_ctx *ctx;
    if (cli_context("bench", &p, &ctx) != 0) return EXIT_FAILURE_RUN;
    attn_status st = ATTN_OK;
    attn_kv_cache_config cc;
    attn_kv_cache_config_init(&cc);
    cc.batch = B, cc.n_kv_heads = Hkv, cc.head_dim = D, cc.capacity = S, cc.dtype = dt;
    attn_kv_cache *kc = NULL;
    float *q = malloc((size_t)(B * H * D) * sizeof(float)), *out = malloc((size_t)(B * H * D) * sizeof(float));
    double *times = malloc((size_t)repeat * sizeof(double));
    rc = EXIT_FAILURE_RUN;
    if (q == NULL || out == NULL || times == NULL) {
        cli_error("bench", EXIT_FAILURE_RUN, "out of memory");
        goto done;
    }
    if ((st = attn_kv_cache_create(ctx, &cc, &kc)) != ATTN_OK || (st = cli_fill_cache(ctx, kc, B, Hkv, S, D)) != ATTN_OK ||
        (st = attn_rand_normal(attn_ctx_generator(ctx), q, B * H * D, 0.0, 1.0)) != ATTN_OK) {
        cli_fail("bench", ctx, st, "filling the cache");
        goto done;
    }
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = B, d.n_heads = H, d.len_q = 1, d.head_dim = D, d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, 1, D, d.q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, 1, D, d.o_stride);
    if ((st = attn_kv_cache_attend(ctx, kc, &d, q, out, NULL)) != ATTN_OK) { // warm-up
        cli_fail("bench", ctx, st, "attend");
        goto done;
    }
    double check_err = -1;
    const bool q_rounded = (dt == ATTN_DTYPE_Q8_0 || dt == ATTN_DTYPE_Q4_0) && attn_isa_int8_query(attn_ctx_isa(ctx));
    if (!no_check) {
        if ((st = check(&d, kc, q, out, q_rounded, attn_ctx_isa(ctx), &check_err)) !=
            ATTN_OK) {
            cli_error("bench", EXIT_FAILURE_RUN, "reference check: %s", attn_strerror(st));
            goto done;
        }
        if (!(check_err < 1e-4)) {
            cli_error("bench", EXIT_FAILURE_RUN, "the kernels disagree with the reference: relative error %.3g", check_err);
            goto done;
        }
    }
    for (int64_t r = 0; r < repeat && st == ATTN_OK; r++) {
        const double t0 = cli_now();
        st = attn_kv_cache_attend(ctx, kc, &d, q, out, NULL);
        times[r] = cli_now() - t0;
    }
    if (st != ATTN_OK) {
        cli_fail("bench", ctx, st, "attend");
        goto done;
    }
    qsort(times, (size_t)repeat, sizeof(double), cli_cmp_double);
    const double median = repeat % 2 ? times[repeat / 2] : 0.5 * (times[repeat / 2 - 1] + times[repeat / 2]);
    const double fastest = times[0];
    const double bytes = (double)B * (double)Hkv * (double)S * 2.0 * (double)D * (double)attn_dtype_size(dt) /
                         (double)attn_dtype_block_size(dt);
    const double gbps = bytes / median / 1e9;
    printf("decode B=%lld H=%lld Hkv=%lld S=%lld D=%lld kv=%s threads=%lld isa=%s: median %.3f ms (fastest %.3f), %.1f GB/s of K and V "
           "(%.1f MiB per step)%s\n",
           (long long)B, (long long)H, (long long)Hkv, (long long)S, (long long)D, dtype_name, (long long)threads,
           attn_isa_name(attn_ctx_isa(ctx)), median * 1e3, fastest * 1e3, gbps, bytes / 1048576.0,
           check_err < 0 ? "" : q_rounded ? "; agrees with the reference within attn.h's bound for the int8 query"
                                          : "; agrees with the reference");
    if (json)
        printf("{\"op\": \"decode\", \"batch\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"len_kv\": %lld, "
               "\"head_dim\": %lld, \"kv_dtype\": \"%s\", \"threads\": %lld, \"isa\": \"%s\", \"repeat\": %lld, "
               "\"median_ms\": %.4f, \"fastest_ms\": %.4f, \"gbps\": %.2f, \"bytes\": %.0f, \"check_rel_err\": %.3g}\n",
               (long long)B, (long long)H, (long long)Hkv, (long long)S, (long long)D, dtype_name, (long long)threads,
               attn_isa_name(attn_ctx_isa(ctx)), (long long)repeat, median * 1e3, fastest * 1e3, gbps, bytes, check_err);
    rc = EXIT_OK;
done:
    free(q), free(out), free(times);
    attn_kv_cache_free(kc);
    attn_ctx_free(ctx);
    return rc;
}

// gpt2_decode.c - the attention layer of a GPT-2 (small) block decoding with a KV cache.
//
// GPT-2 small's attention: 12 heads, E = 768 (head dim 64), biases on the q, k, v projections
// (c_attn) and on the output projection (c_proj), a context of 1024 positions. Here it is
// nn.MultiheadAttention(768, 12) created with attn_mha_create (torch's initialisation from a seeded
// generator); torch initialises in_proj_bias and out_proj.bias to 0, so both are drawn again,
// U(-1/sqrt(E), 1/sqrt(E)) as nn.Linear's biases, for the biases to count in the check.
//
// There is no vocabulary, no embedding table and no other layer: the inputs are random token
// vectors x_t ~ N(0, 1), the scale of what the LayerNorm before the attention hands it in a real
// block. The program
//   1. creates a KV cache for the whole context (1024 positions) of the chosen storage type,
//   2. prefills it with the prompt (one attn_mha_forward_cached call over P tokens),
//   3. decodes T tokens one at a time (attn_mha_forward_cached with len = 1: project the new token,
//      append its key and value to the cache, attend to every cached position, out_proj),
//   4. after the prefill and after every decoding step, recomputes the attention of the whole
//      sequence so far with attn_mha_forward (causal mask, no cache) and compares the rows of the
//      new tokens with the cached outputs.
// Decode speed counts only the attn_mha_forward_cached calls, never the check.
//
// Check tolerance, per element: |cached - full| <= atol + rtol * |full|. With a float32 cache both
// paths compute the same thing in a different order: atol = rtol = 1e-5. A half cache stores k and
// v rounded (relative error 2^-11 for f16, 2^-8 for bf16), which the full recompute does not, so
// the outputs differ by about that rounding: f16 atol 2e-3, rtol 1e-2 (as tests/test_kv_cache.c);
// bf16, 8 times coarser, atol 1.6e-2, rtol 8e-2. The quantised caches (blocks of 32 along the head
// dimension, ggml's Q8_0 and Q4_0) err by up to 1/254 and 1/8 of each block's largest magnitude:
// q8_0 atol 1.5e-2, rtol 6e-2; q4_0 atol 0.25, rtol 0.5 (seen: 0.006 and 0.11 at most with the
// defaults).
//
// Usage: gpt2_decode [--prompt P] [--tokens T] [--batch B] [--threads N] [--kv-dtype f32|f16|bf16|q8_0|q4_0]
//                    [--check | --no-check] [--seed S]
//   P + T <= 1024. --check (the default) runs the comparison and exits 1 when it fails;
//   --no-check times the decoding alone. Prints the prefill time, tokens per second of the
//   decoding (B tokens per step) and the largest error against the full recompute.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "example_check.h"

enum { E = 768, HEADS = 12, CONTEXT = 1024 };

#define CHECK(expr)                                                              \
    do {                                                                         \
        if ((expr) != ATTN_OK) {                                                 \
            fprintf(stderr, "%s: %s\n", #expr, attn_ctx_last_error(ctx));        \
            goto done;                                                           \
        }                                                                        \
    } while (0)

static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [--prompt P] [--tokens T] [--batch B] [--threads N] [--kv-dtype f32|f16|bf16|q8_0|q4_0]\n"
            "       [--check | --no-check] [--seed S]      (P + T <= %d)\n",
            prog, CONTEXT);
}

int main(int argc, char **argv) {
    int64_t prompt = 128, tokens = 128, batch = 1;
    int threads = 1, check = 1;
    unsigned long seed = 0;
    attn_dtype kv_dtype = ATTN_DTYPE_F32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int has_value = i + 1 < argc;
        if (strcmp(a, "--prompt") == 0 && has_value) prompt = atoll(argv[++i]);
        else if (strcmp(a, "--tokens") == 0 && has_value) tokens = atoll(argv[++i]);
        else if (strcmp(a, "--batch") == 0 && has_value) batch = atoll(argv[++i]);
        else if (strcmp(a, "--threads") == 0 && has_value) threads = atoi(argv[++i]);
        else if (strcmp(a, "--seed") == 0 && has_value) seed = strtoul(argv[++i], NULL, 10);
        else if (strcmp(a, "--check") == 0) check = 1;
        else if (strcmp(a, "--no-check") == 0) check = 0;
        else if (strcmp(a, "--kv-dtype") == 0 && has_value) {
            const char *t = argv[++i];
            if (strcmp(t, "f32") == 0) kv_dtype = ATTN_DTYPE_F32;
            else if (strcmp(t, "f16") == 0) kv_dtype = ATTN_DTYPE_F16;
            else if (strcmp(t, "bf16") == 0) kv_dtype = ATTN_DTYPE_BF16;
            else if (strcmp(t, "q8_0") == 0) kv_dtype = ATTN_DTYPE_Q8_0;
            else if (strcmp(t, "q4_0") == 0) kv_dtype = ATTN_DTYPE_Q4_0;
            else {
                fprintf(stderr, "%s: --kv-dtype must be f32, f16, bf16, q8_0 or q4_0, not '%s'\n", argv[0], t);
                return 2;
            }
        } else {
            usage(argv[0]);
            return 2;
        }
    }
    if (prompt < 1 || tokens < 0 || batch < 1 || batch > 64 || threads < 1 || prompt + tokens > CONTEXT) {
        fprintf(stderr, "%s: need --prompt >= 1, --tokens >= 0, prompt + tokens <= %d, 1 <= --batch <= 64, "
                        "--threads >= 1\n", argv[0], CONTEXT);
        usage(argv[0]);
        return 2;
    }
    const double atol = kv_dtype == ATTN_DTYPE_F32    ? 1e-5
                        : kv_dtype == ATTN_DTYPE_F16  ? 2e-3
                        : kv_dtype == ATTN_DTYPE_BF16 ? 1.6e-2
                        : kv_dtype == ATTN_DTYPE_Q8_0 ? 1.5e-2
                                                      : 0.25;
    const double rtol = kv_dtype == ATTN_DTYPE_F32    ? 1e-5
                        : kv_dtype == ATTN_DTYPE_F16  ? 1e-2
                        : kv_dtype == ATTN_DTYPE_BF16 ? 8e-2
                        : kv_dtype == ATTN_DTYPE_Q8_0 ? 6e-2
                                                      : 0.5;
    const int64_t N = batch, total = prompt + tokens;

    int rc = 1;
    attn_ctx *ctx = NULL;
    attn_mha *mha = NULL;
    attn_kv_cache *cache = NULL;
    float *x = NULL, *out = NULL, *full = NULL;
    attn_ctx_params cp;
    attn_ctx_params_init(&cp);
    cp.seed = seed, cp.n_threads = threads;
    if (attn_ctx_create(&cp, &ctx) != ATTN_OK) {
        fprintf(stderr, "%s: cannot create a context with %d threads\n", argv[0], threads);
        return 1;
    }
    attn_generator *gen = attn_ctx_generator(ctx);

    // ---- the module: nn.MultiheadAttention(768, 12), sequence-first (L, N, E), biases drawn
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, E, HEADS);
    CHECK(attn_mha_create(ctx, &cfg, &mha));
    float *in_bias, *out_bias;
    CHECK(attn_mha_param(mha, "in_proj_bias", NULL, NULL, &in_bias));
    CHECK(attn_mha_param(mha, "out_proj.bias", NULL, NULL, &out_bias));
    const double bound = 1.0 / sqrt((double)E);
    CHECK(attn_rand_uniform(gen, in_bias, 3 * E, -bound, bound));
    CHECK(attn_rand_uniform(gen, out_bias, E, -bound, bound));

    // ---- the token vectors of the whole run, x (total, N, E): the first `prompt` rows are the
    // prompt, row t then is decoding step t's input (N, E), contiguous; the prefix of any length
    // is itself an (L, N, E) tensor, which is what the check recomputes.
    x = malloc(sizeof(float) * (size_t)(total * N * E));
    out = malloc(sizeof(float) * (size_t)(total * N * E)); // cached outputs, same layout
    full = malloc(sizeof(float) * (size_t)(total * N * E)); // the full recompute's
    if (x == NULL || out == NULL || full == NULL) {
        fprintf(stderr, "%s: out of memory\n", argv[0]);
        goto done;
    }
    CHECK(attn_rand_normal(gen, x, total * N * E, 0.0, 1.0));

    // ---- the cache: every head's keys and values for the whole context
    attn_kv_cache_config kc;
    attn_kv_cache_config_init(&kc);
    kc.batch = N, kc.n_kv_heads = HEADS, kc.head_dim = E / HEADS, kc.capacity = CONTEXT, kc.dtype = kv_dtype;
    CHECK(attn_kv_cache_create(ctx, &kc, &cache));
    const double cache_mib = 2.0 * (double)(N * HEADS * CONTEXT * (E / HEADS)) * (double)attn_dtype_size(kv_dtype) /
                             (double)attn_dtype_block_size(kv_dtype) / 1048576.0;

    printf("GPT-2 attention layer: E=%d, %d heads of %d, qkv bias, context %d; batch %lld, %d thread%s, "
           "%s kernels, %s KV cache (%.1f MiB)\n",
           E, HEADS, E / HEADS, CONTEXT, (long long)N, threads, threads == 1 ? "" : "s",
           attn_isa_name(attn_ctx_isa(ctx)), attn_dtype_name(kv_dtype), cache_mib);

    attn_mha_args args;
    attn_mha_args_init(&args);
    args.query = x, args.batch = N, args.causal = 1, args.need_weights = 0;
    example_errors err = {0.0, 0.0};

    // ---- prefill: the whole prompt in one call
    double t0 = example_now();
    CHECK(attn_mha_forward_cached(ctx, mha, cache, x, N, prompt, out));
    const double prefill_s = example_now() - t0;
    if (check) {
        args.len_q = prompt;
        CHECK(attn_mha_forward(ctx, mha, &args, full, NULL));
        example_compare(&err, out, full, prompt * N * E, atol, rtol);
    }
    printf("prefill: %lld tokens x %lld in %.2f ms (%.0f tokens/s)\n", (long long)prompt, (long long)N,
           1e3 * prefill_s, (double)(prompt * N) / prefill_s);

    // ---- decode: one token per sequence per step
    double decode_s = 0.0;
    for (int64_t t = prompt; t < total; t++) {
        const float *xt = x + t * N * E;
        float *ot = out + t * N * E;
        t0 = example_now();
        CHECK(attn_mha_forward_cached(ctx, mha, cache, xt, N, 1, ot));
        decode_s += example_now() - t0;
        if (check) { // the whole sequence 0..t again, causal, without the cache: its last row is step t's
            args.len_q = t + 1;
            CHECK(attn_mha_forward(ctx, mha, &args, full, NULL));
            example_compare(&err, ot, full + t * N * E, N * E, atol, rtol);
        }
    }
    if (tokens > 0)
        printf("decode:  %lld steps x %lld in %.2f ms: %.0f tokens/s (%.3f ms per step, cache length %lld to %lld)\n",
               (long long)tokens, (long long)N, 1e3 * decode_s, (double)(tokens * N) / decode_s,
               1e3 * decode_s / (double)tokens, (long long)prompt + 1, (long long)total);

    if (check) {
        const int ok = err.max_ratio <= 1.0;
        printf("check:   max |cached - full causal recompute| = %.3g over %lld positions x %lld; tolerance %g + %g "
               "|full|, the worst element at %.0f%% of it: %s\n",
               err.max_abs, (long long)total, (long long)N, atol, rtol, 100.0 * err.max_ratio, ok ? "ok" : "FAILED");
        rc = ok ? 0 : 1;
    } else {
        rc = 0;
    }

done:
    free(x), free(out), free(full);
    attn_kv_cache_free(cache);
    attn_mha_free(mha);
    attn_ctx_free(ctx);
    return rc;
}

// gpt2_model.c - a whole GPT-2 in C on attn (the model is in examples/gpt2/): loads a Hugging Face
// GPT-2 checkpoint of any size, or makes one with random weights, and generates tokens from token
// ids, greedy or top-k sampled, printing the prefill and decode speed.
//
// There is no tokenizer: prompts and outputs are token ids of GPT-2's vocabulary (for text, encode
// and decode with any GPT-2 tokenizer, e.g. transformers' GPT2TokenizerFast). A prompt is given
// with --prompt (comma-separated ids), or drawn at random (--prompt-len, uniform over the
// vocabulary from the seeded generator).
//
// --check runs, after the prefill and after every decoding step, the whole sequence again without
// the KV caches (gpt2_forward_full: every block's causal attention recomputed) and compares the
// logits that chose the next token with the cached ones; the prefill's logits at every prompt
// position too. Tolerance, per logit: |cached - full| <= tol + tol |full|, tol = 2e-5 with a
// float32 cache (both paths compute the same sums in another order; measured on random GPT-2
// small weights, 12 layers: 4.4e-6), 4e-3 with a float16 cache and 3.2e-2 with a bfloat16 one,
// whose keys and values are rounded where the recomputation's are not (measured: 6.6e-4 and
// 5.3e-3). Timings never include the check.
//
// Usage: gpt2_model [--model PATH] [--config FILE] [--prompt IDS | --prompt-len P] [--tokens T]
//                   [--top-k K] [--temperature X] [--seed S] [--threads N] [--kv-dtype f32|f16|bf16]
//                   [--check] [--logits-out FILE.npy] [--save DIR] [--json] [--quiet]
//                   [--layers L] [--embd E] [--heads H] [--vocab V] [--context C] [--inner I]
//   --model PATH: a model.safetensors, or a directory holding one and its config.json (see gpt2.h);
//   without it, a model with random weights of the shape given by --layers ... (GPT-2 small's by
//   default), drawn from the generator seeded with --seed.
// Exit status: 0, 1 when the model cannot be loaded or run or the check fails, 2 for a usage error.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "example_check.h"
#include "gpt2/gpt2.h"

static void usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s [--model PATH] [--config FILE] [--prompt IDS | --prompt-len P] [--tokens T]\n"
            "       [--top-k K] [--temperature X] [--seed S] [--threads N] [--kv-dtype f32|f16|bf16]\n"
            "       [--check] [--logits-out FILE.npy] [--save DIR] [--json] [--quiet]\n"
            "       [--layers L] [--embd E] [--heads H] [--vocab V] [--context C] [--inner I]\n"
            "\n"
            "GPT-2 in C on attn: generates T tokens (default 32) after a prompt of token ids (--prompt 1,2,3,\n"
            "or P random ids, default 16), greedy unless --top-k K > 1 with --temperature X > 0 (default 1).\n"
            "--model: a Hugging Face GPT-2 model.safetensors or a directory holding it and config.json;\n"
            "without it, random weights (seed --seed) of GPT-2 small's shape or the one --layers ... give.\n"
            "--check compares every step's logits with a recomputation without the KV caches;\n"
            "--logits-out writes the prompt's logits (P, V); --save writes the model as Hugging Face files.\n",
            prog);
}

typedef struct options {
    const char *model, *config, *prompt, *logits_out, *save;
    int64_t prompt_len, tokens, top_k, threads;
    double temperature;
    unsigned long long seed;
    attn_dtype kv_dtype;
    int check, json, quiet;
    gpt2_config shape; // of a random model
} options;

static int parse_int(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    const long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0) return 0;
    *out = v;
    return 1;
}

// 0 on success, 2 for a usage error (after a message), -1 for --help.
static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.prompt_len = 16, .tokens = 32, .top_k = 0, .threads = 1, .temperature = 1.0};
    gpt2_config_init(&o->shape);
    o->shape.n_inner = 0; // 4 E unless --inner
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t *size = NULL;
        const char **text = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return -1;
        if (strcmp(a, "--check") == 0) { o->check = 1; continue; }
        if (strcmp(a, "--json") == 0) { o->json = 1; continue; }
        if (strcmp(a, "--quiet") == 0) { o->quiet = 1; continue; }
        if (strcmp(a, "--model") == 0) text = &o->model;
        else if (strcmp(a, "--config") == 0) text = &o->config;
        else if (strcmp(a, "--prompt") == 0) text = &o->prompt;
        else if (strcmp(a, "--logits-out") == 0) text = &o->logits_out;
        else if (strcmp(a, "--save") == 0) text = &o->save;
        else if (strcmp(a, "--prompt-len") == 0) size = &o->prompt_len;
        else if (strcmp(a, "--tokens") == 0) size = &o->tokens;
        else if (strcmp(a, "--top-k") == 0) size = &o->top_k;
        else if (strcmp(a, "--threads") == 0) size = &o->threads;
        else if (strcmp(a, "--layers") == 0) size = &o->shape.n_layer;
        else if (strcmp(a, "--embd") == 0) size = &o->shape.n_embd;
        else if (strcmp(a, "--heads") == 0) size = &o->shape.n_head;
        else if (strcmp(a, "--vocab") == 0) size = &o->shape.vocab_size;
        else if (strcmp(a, "--context") == 0) size = &o->shape.n_positions;
        else if (strcmp(a, "--inner") == 0) size = &o->shape.n_inner;
        else if (strcmp(a, "--temperature") != 0 && strcmp(a, "--seed") != 0 && strcmp(a, "--kv-dtype") != 0) {
            fprintf(stderr, "%s: unknown option '%s' (see --help)\n", argv[0], a);
            return 2;
        }
        if (v == NULL) {
            fprintf(stderr, "%s: %s needs a value\n", argv[0], a);
            return 2;
        }
        i++;
        if (text != NULL) {
            *text = v;
        } else if (size != NULL) {
            if (!parse_int(v, size)) {
                fprintf(stderr, "%s: %s expects an integer, got '%s'\n", argv[0], a, v);
                return 2;
            }
        } else if (strcmp(a, "--temperature") == 0) {
            char *end;
            o->temperature = strtod(v, &end);
            if (end == v || *end != '\0') {
                fprintf(stderr, "%s: --temperature expects a number, got '%s'\n", argv[0], v);
                return 2;
            }
        } else if (strcmp(a, "--seed") == 0) {
            int64_t s;
            if (!parse_int(v, &s) || s < 0) {
                fprintf(stderr, "%s: --seed expects an integer >= 0, got '%s'\n", argv[0], v);
                return 2;
            }
            o->seed = (unsigned long long)s;
        } else if (strcmp(v, "f32") == 0 || strcmp(v, "f16") == 0 || strcmp(v, "bf16") == 0) {
            o->kv_dtype = v[0] == 'b' ? ATTN_DTYPE_BF16 : v[1] == '1' ? ATTN_DTYPE_F16 : ATTN_DTYPE_F32;
        } else {
            fprintf(stderr, "%s: --kv-dtype must be f32, f16 or bf16, not '%s'\n", argv[0], v);
            return 2;
        }
    }
    if (o->shape.n_inner == 0) o->shape.n_inner = 4 * o->shape.n_embd;
    if (o->prompt_len < 1 || o->tokens < 0 || o->threads < 1 || o->threads > 1024 || o->top_k < 0) {
        fprintf(stderr, "%s: need --prompt-len >= 1, --tokens >= 0, 1 <= --threads <= 1024, --top-k >= 0\n", argv[0]);
        return 2;
    }
    if (!(o->temperature >= 0.0) || o->temperature > 1e30) {
        fprintf(stderr, "%s: --temperature must be >= 0\n", argv[0]);
        return 2;
    }
    return 0;
}

// The ids of "1,2,3" into *ids (allocated); 0 and a message when the list is malformed.
static int parse_ids(const char *prog, const char *list, int32_t **ids, int64_t *n) {
    int64_t count = 1;
    for (const char *p = list; *p; p++) count += *p == ',';
    *ids = malloc((size_t)count * sizeof **ids);
    if (*ids == NULL) return 0;
    const char *p = list;
    for (int64_t i = 0; i < count; i++) {
        char *end;
        errno = 0;
        const long v = strtol(p, &end, 10);
        if (end == p || (*end != ',' && *end != '\0') || errno != 0 || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "%s: --prompt must be comma-separated token ids, not '%s'\n", prog, list);
            free(*ids);
            *ids = NULL;
            return 0;
        }
        (*ids)[i] = (int32_t)v;
        p = end + 1;
    }
    *n = count;
    return 1;
}

typedef struct checker {
    attn_ctx *ctx;
    const gpt2_model *model;
    gpt2_state *state;
    float *full; // (V) the recomputation's logits
    double atol, rtol;
    example_errors err;
    int64_t steps;
    char *msg;
} checker;

// After each step of gpt2_generate: the same logits from the whole sequence without the caches.
static attn_status check_step(void *user, const int32_t *tokens, int64_t len, const float *logits) {
    checker *c = user;
    attn_status st = gpt2_forward_full(c->ctx, c->model, c->state, tokens, len, c->full, 0, c->msg);
    if (st == ATTN_OK) example_compare(&c->err, logits, c->full, c->model->cfg.vocab_size, c->atol, c->rtol);
    c->steps++;
    return st;
}

static void print_ids(const char *label, const int32_t *ids, int64_t n) {
    printf("%s", label);
    for (int64_t i = 0; i < n; i++) printf("%s%ld", i ? " " : "", (long)ids[i]);
    printf("\n");
}

int main(int argc, char **argv) {
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc != 0) {
        if (rc < 0) usage(stdout, argv[0]);
        return rc < 0 ? 0 : rc;
    }
    attn_ctx *ctx = NULL;
    gpt2_model *model = NULL;
    gpt2_state *state = NULL;
    gpt2_sampler sampler = {0};
    int32_t *tokens = NULL, *prompt = NULL;
    float *logits = NULL, *full = NULL;
    char err[GPT2_ERR_LEN] = "";
    rc = 1;
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.seed = o.seed, p.n_threads = (int)o.threads;
    if (attn_ctx_create(&p, &ctx) != ATTN_OK) {
        fprintf(stderr, "%s: cannot create a context with %lld threads\n", argv[0], (long long)o.threads);
        return 1;
    }
    attn_generator *gen = attn_ctx_generator(ctx);
    const double t_load = example_now();
    if (o.model != NULL) {
        if (gpt2_load(ctx, o.model, o.config, &model, err) != ATTN_OK) goto fail;
    } else {
        if (gpt2_create_random(ctx, &o.shape, &model, err) != ATTN_OK) goto fail;
    }
    const double load_s = example_now() - t_load;
    const gpt2_config *c = &model->cfg;
    if (o.save != NULL && gpt2_save(ctx, model, o.save, err) != ATTN_OK) goto fail;

    // the prompt
    int64_t n_prompt = o.prompt_len;
    if (o.prompt != NULL) {
        if (!parse_ids(argv[0], o.prompt, &prompt, &n_prompt)) {
            rc = 2;
            goto done;
        }
    } else {
        float *u = malloc((size_t)n_prompt * sizeof *u);
        prompt = malloc((size_t)n_prompt * sizeof *prompt);
        if (u == NULL || prompt == NULL || attn_rand_uniform(gen, u, n_prompt, 0.0, 1.0) != ATTN_OK) {
            free(u);
            snprintf(err, sizeof err, "cannot draw a prompt of %lld tokens", (long long)n_prompt);
            goto fail;
        }
        for (int64_t i = 0; i < n_prompt; i++) {
            const int64_t id = (int64_t)((double)u[i] * (double)c->vocab_size);
            prompt[i] = (int32_t)(id < c->vocab_size ? id : c->vocab_size - 1);
        }
        free(u);
    }
    const int64_t total = n_prompt + o.tokens;
    if (total > c->n_positions) {
        snprintf(err, sizeof err, "%lld prompt tokens + %lld new ones pass the model's context of %lld",
                 (long long)n_prompt, (long long)o.tokens, (long long)c->n_positions);
        goto fail;
    }
    const int64_t rows = o.logits_out != NULL || o.check ? n_prompt : 1; // logits of every prompt position, or one
    tokens = malloc((size_t)total * sizeof *tokens);
    logits = malloc((size_t)(rows * c->vocab_size) * sizeof *logits);
    full = malloc((size_t)(rows * c->vocab_size) * sizeof *full);
    if (tokens == NULL || logits == NULL || full == NULL) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    memcpy(tokens, prompt, (size_t)n_prompt * sizeof *tokens);
    if (gpt2_state_create(ctx, model, total, o.kv_dtype, &state, err) != ATTN_OK ||
        gpt2_sampler_init(&sampler, o.top_k, o.temperature, c->vocab_size, err) != ATTN_OK)
        goto fail;
    if (!o.quiet)
        printf("GPT-2 (%s): %lld layers, E=%lld, %lld heads, vocab %lld, context %lld, %.1fM parameters, %.2f s to %s; "
               "%lld thread%s, %s kernels, %s KV cache\n",
               o.model != NULL ? o.model : "random weights", (long long)c->n_layer, (long long)c->n_embd,
               (long long)c->n_head, (long long)c->vocab_size, (long long)c->n_positions,
               (double)gpt2_param_count(c) / 1e6, load_s, o.model != NULL ? "load" : "draw", (long long)o.threads,
               o.threads == 1 ? "" : "s", attn_isa_name(attn_ctx_isa(ctx)), attn_dtype_name(o.kv_dtype));

    const double tol = o.kv_dtype == ATTN_DTYPE_F32 ? 2e-5 : o.kv_dtype == ATTN_DTYPE_F16 ? 4e-3 : 3.2e-2;
    checker chk = {ctx, model, state, full, tol, tol, {0.0, 0.0}, 0, err};
    // the prompt's logits at every position: for --logits-out, and checked against the recomputation
    if (o.logits_out != NULL || o.check) {
        gpt2_state_reset(model, state);
        if (gpt2_forward(ctx, model, state, prompt, n_prompt, logits, 1, err) != ATTN_OK) goto fail;
        if (o.check) {
            if (gpt2_forward_full(ctx, model, state, prompt, n_prompt, full, 1, err) != ATTN_OK) goto fail;
            example_compare(&chk.err, logits, full, n_prompt * c->vocab_size, tol, tol);
        }
        const int64_t shape[2] = {n_prompt, c->vocab_size};
        if (o.logits_out != NULL && attn_npy_write(ctx, o.logits_out, ATTN_DTYPE_F32, 2, shape, logits) != ATTN_OK) {
            snprintf(err, sizeof err, "%s: %s", o.logits_out, attn_ctx_last_error(ctx));
            goto fail;
        }
    }

    gpt2_timing tm;
    if (gpt2_generate(ctx, model, state, &sampler, tokens, n_prompt, o.tokens, logits, o.check ? check_step : NULL,
                      &chk, &tm, err) != ATTN_OK)
        goto fail;
    const double prefill_tps = o.tokens > 0 ? (double)n_prompt / tm.prefill_s : 0.0;
    const double decode_tps = tm.decode_steps > 0 ? (double)tm.decode_steps / tm.decode_s : 0.0;
    if (!o.quiet) {
        print_ids("prompt:    ", prompt, n_prompt);
        printf("%s", sampler.index == NULL ? "greedy:    " : "sampled:   ");
        print_ids("", tokens + n_prompt, o.tokens);
        if (o.tokens > 0)
            printf("prefill:   %lld tokens in %.2f ms: %.1f tokens/s (the first new token included)\n",
                   (long long)n_prompt, 1e3 * tm.prefill_s, prefill_tps);
        if (tm.decode_steps > 0)
            printf("decode:    %lld tokens in %.2f ms: %.1f tokens/s (%.2f ms per token)\n", (long long)tm.decode_steps,
                   1e3 * tm.decode_s, decode_tps, 1e3 * tm.decode_s / (double)tm.decode_steps);
    }
    int ok = 1;
    if (o.check) {
        ok = chk.err.max_ratio <= 1.0;
        printf("check:     max |cached - recomputed| = %.3g over the prompt's %lld positions and %lld steps' logits; "
               "tolerance %g + %g |recomputed|, the worst at %.0f%% of it: %s\n",
               chk.err.max_abs, (long long)n_prompt, (long long)chk.steps, tol, tol, 100.0 * chk.err.max_ratio,
               ok ? "ok" : "FAILED");
    }
    if (o.json) {
        printf("{\"params\": %lld, \"layers\": %lld, \"embd\": %lld, \"heads\": %lld, \"vocab\": %lld, \"threads\": %lld, "
               "\"isa\": \"%s\", \"kv_dtype\": \"%s\", \"prompt_tokens\": %lld, \"new_tokens\": %lld, "
               "\"prefill_s\": %.9g, \"decode_s\": %.9g, \"decode_steps\": %lld, \"prefill_tokens_per_s\": %.6g, "
               "\"decode_tokens_per_s\": %.6g, \"tokens\": [",
               (long long)gpt2_param_count(c), (long long)c->n_layer, (long long)c->n_embd, (long long)c->n_head,
               (long long)c->vocab_size, (long long)o.threads, attn_isa_name(attn_ctx_isa(ctx)),
               attn_dtype_name(o.kv_dtype), (long long)n_prompt, (long long)o.tokens, tm.prefill_s, tm.decode_s,
               (long long)tm.decode_steps, prefill_tps, decode_tps);
        for (int64_t i = 0; i < o.tokens; i++) printf("%s%ld", i ? ", " : "", (long)tokens[n_prompt + i]);
        printf("]}\n");
    }
    rc = ok ? 0 : 1;
    goto done;
fail:
    fprintf(stderr, "%s: %s\n", argv[0], err);
    rc = 1;
done:
    gpt2_sampler_free(&sampler);
    gpt2_state_free(model, state);
    gpt2_free(model);
    free(tokens), free(prompt), free(logits), free(full);
    attn_ctx_free(ctx);
    return rc;
}

// model.c - GPT-2's parameters, random initialisation, the per-sequence state and the forward
// pass (cached and fully recomputed).
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_internal.h"

attn_status gpt2__fail(char *err, attn_status st, const char *fmt, ...) {
    if (err != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, GPT2_ERR_LEN, fmt, ap);
        va_end(ap);
    }
    return st;
}

attn_status gpt2__lib_fail(char *err, const attn_ctx *ctx, attn_status st, const char *what) {
    const char *msg = ctx != NULL ? attn_ctx_last_error(ctx) : "";
    return gpt2__fail(err, st, "%s: %s", what, msg[0] != '\0' ? msg : attn_strerror(st));
}

void gpt2__transpose(const float *src, int64_t rows, int64_t cols, float *dst) {
    // src (rows, cols), dst (cols, rows); blocks of 32 x 32 keep both sides in cache
    for (int64_t r0 = 0; r0 < rows; r0 += 32)
        for (int64_t c0 = 0; c0 < cols; c0 += 32)
            for (int64_t r = r0; r < rows && r < r0 + 32; r++)
                for (int64_t c = c0; c < cols && c < c0 + 32; c++) dst[c * rows + r] = src[r * cols + c];
}

// ---- parameters ---------------------------------------------------------------------------------

// The next n floats of the parameter block.
static float *take(float **p, int64_t n) {
    float *q = *p;
    *p += n;
    return q;
}

attn_status gpt2__alloc(const gpt2_config *cfg, gpt2_model **out, char *err) {
    *out = NULL;
    GPT2_RETURN_IF_ERR(gpt2_config_check(cfg, err));
    const int64_t V = cfg->vocab_size, E = cfg->n_embd, I = cfg->n_inner, L = cfg->n_layer;
    const int64_t per_block = 4 * E + I * E + I + E * I + E; // LayerNorms and MLP (attention: in the MHA)
    const int64_t total = V * E * (cfg->tie_word_embeddings ? 1 : 2) + cfg->n_positions * E + 2 * E + L * per_block;
    gpt2_model *m = calloc(1, sizeof *m);
    if (m != NULL) m->blocks = calloc((size_t)L, sizeof *m->blocks);
    if (m != NULL) m->params = calloc((size_t)total, sizeof(float));
    if (m == NULL || m->blocks == NULL || m->params == NULL) {
        gpt2_free(m);
        return gpt2__fail(err, ATTN_ERR_OUT_OF_MEMORY, "out of memory for %lld parameters", (long long)total);
    }
    m->cfg = *cfg;
    float *p = m->params;
    m->wte = take(&p, V * E);
    m->wpe = take(&p, cfg->n_positions * E);
    m->ln_f_weight = take(&p, E);
    m->ln_f_bias = take(&p, E);
    m->lm_head = cfg->tie_word_embeddings ? m->wte : take(&p, V * E);
    for (int64_t l = 0; l < L; l++) {
        gpt2_block *b = &m->blocks[l];
        b->ln_1_weight = take(&p, E);
        b->ln_1_bias = take(&p, E);
        b->ln_2_weight = take(&p, E);
        b->ln_2_bias = take(&p, E);
        b->fc_weight = take(&p, I * E);
        b->fc_bias = take(&p, I);
        b->proj_weight = take(&p, E * I);
        b->proj_bias = take(&p, E);
    }
    *out = m;
    return ATTN_OK;
}

attn_status gpt2__set_attention(attn_ctx *ctx, gpt2_model *m, int64_t l, const float *w_qkv, const float *b_qkv,
                                const float *w_o, const float *b_o, char *err) {
    const int64_t E = m->cfg.n_embd;
    attn_tensor t[4] = {
        {.name = (char *)"in_proj_weight", .dtype = ATTN_DTYPE_F32, .ndim = 2, .shape = {3 * E, E}, .data = (void *)w_qkv},
        {.name = (char *)"in_proj_bias", .dtype = ATTN_DTYPE_F32, .ndim = 1, .shape = {3 * E}, .data = (void *)b_qkv},
        {.name = (char *)"out_proj.weight", .dtype = ATTN_DTYPE_F32, .ndim = 2, .shape = {E, E}, .data = (void *)w_o},
        {.name = (char *)"out_proj.bias", .dtype = ATTN_DTYPE_F32, .ndim = 1, .shape = {E}, .data = (void *)b_o},
    };
    const attn_tensor_list state = {4, t};
    attn_mha_free(m->blocks[l].attn);
    m->blocks[l].attn = NULL;
    attn_status st = attn_mha_create_from_state(ctx, &state, m->cfg.n_head, NULL, &m->blocks[l].attn);
    if (st != ATTN_OK) {
        char what[64];
        snprintf(what, sizeof what, "block %lld: attention", (long long)l);
        return gpt2__lib_fail(err, ctx, st, what);
    }
    return ATTN_OK;
}

void gpt2_free(gpt2_model *m) {
    if (m == NULL) return;
    if (m->blocks != NULL)
        for (int64_t l = 0; l < m->cfg.n_layer; l++) attn_mha_free(m->blocks[l].attn);
    free(m->blocks);
    free(m->params);
    free(m);
}

// N(0, std) into dst (rows, cols) drawn in the (cols, rows) order Hugging Face's Conv1D stores, i.e.
// the draws fill src^T; scratch holds rows * cols floats.
static attn_status draw_conv1d(attn_generator *gen, float *dst, int64_t rows, int64_t cols, double std, float *scratch) {
    attn_status st = attn_rand_normal(gen, scratch, rows * cols, 0.0, std);
    if (st == ATTN_OK) gpt2__transpose(scratch, cols, rows, dst);
    return st;
}

attn_status gpt2_create_random(attn_ctx *ctx, const gpt2_config *cfg, gpt2_model **out, char *err) {
    gpt2_model *m;
    GPT2_RETURN_IF_ERR(gpt2__alloc(cfg, &m, err));
    const int64_t V = cfg->vocab_size, E = cfg->n_embd, I = cfg->n_inner;
    const double std = 0.02, std_resid = 0.02 / sqrt(2.0 * (double)cfg->n_layer);
    attn_generator *gen = attn_ctx_generator(ctx);
    const int64_t most = 3 * E * E > I * E ? 3 * E * E : I * E;
    float *scratch = malloc((size_t)most * sizeof(float)), *attn_w = calloc((size_t)(4 * E * E + 4 * E), sizeof(float));
    if (scratch == NULL || attn_w == NULL) {
        free(scratch), free(attn_w), gpt2_free(m);
        return gpt2__fail(err, ATTN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    float *w_qkv = attn_w, *w_o = attn_w + 3 * E * E, *biases = attn_w + 4 * E * E; // biases: 4E zeros
    attn_status st = attn_rand_normal(gen, m->wte, V * E, 0.0, std);
    if (st == ATTN_OK) st = attn_rand_normal(gen, m->wpe, cfg->n_positions * E, 0.0, std);
    for (int64_t l = 0; st == ATTN_OK && l < cfg->n_layer; l++) {
        gpt2_block *b = &m->blocks[l];
        for (int64_t i = 0; i < E; i++) b->ln_1_weight[i] = b->ln_2_weight[i] = 1.0f;
        st = draw_conv1d(gen, w_qkv, 3 * E, E, std, scratch);
        if (st == ATTN_OK) st = draw_conv1d(gen, w_o, E, E, std_resid, scratch);
        if (st == ATTN_OK) st = draw_conv1d(gen, b->fc_weight, I, E, std, scratch);
        if (st == ATTN_OK) st = draw_conv1d(gen, b->proj_weight, E, I, std_resid, scratch);
        if (st != ATTN_OK) gpt2__lib_fail(err, ctx, st, "random weights");
        if (st == ATTN_OK) st = gpt2__set_attention(ctx, m, l, w_qkv, biases, w_o, biases + 3 * E, err);
    }
    for (int64_t i = 0; i < E; i++) m->ln_f_weight[i] = 1.0f;
    if (st == ATTN_OK && !cfg->tie_word_embeddings) {
        st = attn_rand_normal(gen, m->lm_head, V * E, 0.0, std);
        if (st != ATTN_OK) gpt2__lib_fail(err, ctx, st, "random weights");
    }
    free(scratch);
    free(attn_w);
    if (st != ATTN_OK) {
        gpt2_free(m);
        return st;
    }
    *out = m;
    return ATTN_OK;
}

// ---- the state of one sequence --------------------------------------------------------------------

attn_status gpt2_state_create(attn_ctx *ctx, const gpt2_model *m, int64_t capacity, attn_dtype kv_dtype,
                              gpt2_state **out, char *err) {
    *out = NULL;
    const gpt2_config *c = &m->cfg;
    if (capacity < 1 || capacity > c->n_positions)
        return gpt2__fail(err, ATTN_ERR_CONTEXT_LENGTH, "a sequence of %lld positions: the model's context is 1 to %lld",
                          (long long)capacity, (long long)c->n_positions);
    gpt2_state *s = calloc(1, sizeof *s);
    if (s != NULL) {
        s->capacity = capacity;
        s->cache = calloc((size_t)c->n_layer, sizeof *s->cache);
        s->x = malloc((size_t)(capacity * c->n_embd) * sizeof(float));
        s->h = malloc((size_t)(capacity * c->n_embd) * sizeof(float));
        s->a = malloc((size_t)(capacity * c->n_embd) * sizeof(float));
        s->m = malloc((size_t)(capacity * c->n_inner) * sizeof(float));
    }
    if (s == NULL || s->cache == NULL || s->x == NULL || s->h == NULL || s->a == NULL || s->m == NULL) {
        gpt2_state_free(m, s);
        return gpt2__fail(err, ATTN_ERR_OUT_OF_MEMORY, "out of memory for a state of %lld positions",
                          (long long)capacity);
    }
    attn_kv_cache_config kc;
    attn_kv_cache_config_init(&kc);
    kc.batch = 1, kc.n_kv_heads = c->n_head, kc.head_dim = c->n_embd / c->n_head, kc.capacity = capacity;
    kc.dtype = kv_dtype;
    for (int64_t l = 0; l < c->n_layer; l++) {
        attn_status st = attn_kv_cache_create(ctx, &kc, &s->cache[l]);
        if (st != ATTN_OK) {
            gpt2_state_free(m, s);
            return gpt2__lib_fail(err, ctx, st, "KV cache");
        }
    }
    *out = s;
    return ATTN_OK;
}

void gpt2_state_free(const gpt2_model *m, gpt2_state *s) {
    if (s == NULL) return;
    if (s->cache != NULL)
        for (int64_t l = 0; l < m->cfg.n_layer; l++) attn_kv_cache_free(s->cache[l]);
    free(s->cache);
    free(s->x), free(s->h), free(s->a), free(s->m);
    free(s);
}

void gpt2_state_reset(const gpt2_model *m, gpt2_state *s) {
    for (int64_t l = 0; l < m->cfg.n_layer; l++) attn_kv_cache_reset(s->cache[l]);
}

int64_t gpt2_state_length(const gpt2_state *s) { return attn_kv_cache_length(s->cache[0]); }

// ---- the forward pass -----------------------------------------------------------------------------

static void add(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

// Tokens tokens[0 .. n) at positions pos0 .. pos0 + n - 1 through the model, attention through the
// caches (cached) or recomputed over the n tokens (pos0 = 0); logits of all rows or the last.
static attn_status forward(attn_ctx *ctx, const gpt2_model *m, gpt2_state *s, const int32_t *tokens, int64_t n,
                           int cached, float *logits, int all_logits, char *err) {
    const gpt2_config *c = &m->cfg;
    const int64_t E = c->n_embd, I = c->n_inner, V = c->vocab_size;
    if (tokens == NULL || logits == NULL || n < 1)
        return gpt2__fail(err, ATTN_ERR_INVALID_ARG, "forward: needs tokens, logits and n >= 1 (n = %lld)", (long long)n);
    const int64_t pos0 = cached ? gpt2_state_length(s) : 0;
    if (n > s->capacity - pos0)
        return gpt2__fail(err, cached ? ATTN_ERR_CAPACITY : ATTN_ERR_CONTEXT_LENGTH,
                          "forward: %lld tokens after %lld do not fit the state's %lld positions", (long long)n,
                          (long long)pos0, (long long)s->capacity);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return gpt2__fail(err, ATTN_ERR_INVALID_ARG, "forward: token %lld is %ld, outside the vocabulary [0, %lld)",
                              (long long)i, (long)tokens[i], (long long)V);
    float *x = s->x, *h = s->h, *a = s->a, *mh = s->m; // x, h, a: (n, E); mh: (n, I)
    for (int64_t i = 0; i < n; i++) {
        const float *te = m->wte + (int64_t)tokens[i] * E, *pe = m->wpe + (pos0 + i) * E;
        for (int64_t e = 0; e < E; e++) x[i * E + e] = te[e] + pe[e];
    }
    attn_mha_args args;
    attn_mha_args_init(&args);
    args.batch = 1, args.len_q = n, args.causal = 1, args.need_weights = 0; // (n, 1, E) = (n, E)
    char what[64];
    for (int64_t l = 0; l < c->n_layer; l++) {
        const gpt2_block *b = &m->blocks[l];
        gpt2_layer_norm(x, n, E, b->ln_1_weight, b->ln_1_bias, c->layer_norm_epsilon, h);
        attn_status st;
        if (cached) {
            st = attn_mha_forward_cached(ctx, b->attn, s->cache[l], h, 1, n, a);
        } else {
            args.query = h;
            st = attn_mha_forward(ctx, b->attn, &args, a, NULL);
        }
        if (st == ATTN_OK) {
            add(x, a, n * E);
            gpt2_layer_norm(x, n, E, b->ln_2_weight, b->ln_2_bias, c->layer_norm_epsilon, h);
            st = attn_linear(ctx, h, n, E, b->fc_weight, ATTN_WEIGHT_OUT_IN, b->fc_bias, I, mh);
        }
        if (st == ATTN_OK) {
            gpt2_gelu(mh, n * I, c->activation);
            st = attn_linear(ctx, mh, n, I, b->proj_weight, ATTN_WEIGHT_OUT_IN, b->proj_bias, E, a);
        }
        if (st != ATTN_OK) {
            snprintf(what, sizeof what, "forward: block %lld", (long long)l);
            return gpt2__lib_fail(err, ctx, st, what);
        }
        add(x, a, n * E);
    }
    const int64_t first = all_logits ? 0 : n - 1, rows = n - first;
    gpt2_layer_norm(x + first * E, rows, E, m->ln_f_weight, m->ln_f_bias, c->layer_norm_epsilon, h);
    attn_status st = attn_linear(ctx, h, rows, E, m->lm_head, ATTN_WEIGHT_OUT_IN, NULL, V, logits);
    return st == ATTN_OK ? ATTN_OK : gpt2__lib_fail(err, ctx, st, "forward: output head");
}

attn_status gpt2_forward(attn_ctx *ctx, const gpt2_model *m, gpt2_state *s, const int32_t *tokens, int64_t n,
                         float *logits, int all_logits, char *err) {
    return forward(ctx, m, s, tokens, n, 1, logits, all_logits, err);
}

attn_status gpt2_forward_full(attn_ctx *ctx, const gpt2_model *m, gpt2_state *s, const int32_t *tokens, int64_t n,
                              float *logits, int all_logits, char *err) {
    return forward(ctx, m, s, tokens, n, 0, logits, all_logits, err);
}

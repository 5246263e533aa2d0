// book.c - the attention modules of "Build a Large Language Model (From Scratch)", ch. 3:
// SelfAttention_v1/v2, CausalAttention, MultiHeadAttentionWrapper and the weight-split
// MultiHeadAttention, plus the simplified self-attention without trainable weights.
//
// Nothing here computes attention itself: each module describes its projections to the shared
// multi-head pipeline (mha_core.c), and the simplified attention calls SDPA directly. The wrapper
// really runs its heads one after the other, each a single-head causal module writing its column
// block of the output, as the Python class does.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "mha_core.h"

struct attn_book {
    attn_allocator alloc;
    attn_book_kind kind;
    int64_t d_in, d_out, context_length, num_heads;
    double dropout;
    bool qkv_bias;
    attn__params params; // state_dict order
};

// Pointers of one projection group (a head of the wrapper, or the whole module otherwise).
typedef struct group_views {
    const float *wq, *wk, *wv, *bq, *bk, *bv;
} group_views;

static bool is_linear_kind(attn_book_kind k) { return k != ATTN_BOOK_SELF_ATTENTION_V1; }
static bool is_causal_kind(attn_book_kind k) {
    return k == ATTN_BOOK_CAUSAL_ATTENTION || k == ATTN_BOOK_MHA_WRAPPER || k == ATTN_BOOK_MHA;
}
static int64_t n_groups(const attn_book *m) { return m->kind == ATTN_BOOK_MHA_WRAPPER ? m->num_heads : 1; }

int64_t attn_book_out_features(const attn_book *m) {
    if (m == NULL) return 0;
    return m->kind == ATTN_BOOK_MHA_WRAPPER ? m->num_heads * m->d_out : m->d_out;
}

void attn_book_free(attn_book *m) {
    if (m == NULL) return;
    attn_allocator a = m->alloc;
    attn__params_free(&a, &m->params);
    attn__free_with(&a, m);
}

attn_book_kind attn_book_get_kind(const attn_book *m) { return m != NULL ? m->kind : (attn_book_kind)0; }

// Name of a parameter of group g: "W_query.weight", or "heads.1.W_query.weight" for the wrapper.
static void param_name(const attn_book *m, int64_t g, const char *proj, const char *suffix, char *buf, size_t cap) {
    if (m->kind == ATTN_BOOK_MHA_WRAPPER)
        snprintf(buf, cap, "heads.%lld.%s%s", (long long)g, proj, suffix);
    else
        snprintf(buf, cap, "%s%s", proj, suffix);
}

static group_views group_of(const attn_book *m, int64_t g) {
    static const char *const projs[3] = {"W_query", "W_key", "W_value"};
    const float *w[3], *b[3];
    for (int i = 0; i < 3; i++) {
        char name[ATTN_PARAM_NAME_MAX];
        param_name(m, g, projs[i], is_linear_kind(m->kind) ? ".weight" : "", name, sizeof name);
        w[i] = attn__params_find(&m->params, name)->data;
        param_name(m, g, projs[i], ".bias", name, sizeof name);
        const attn__param *bp = attn__params_find(&m->params, name);
        b[i] = bp != NULL ? bp->data : NULL;
    }
    return (group_views){w[0], w[1], w[2], b[0], b[1], b[2]};
}

// Builds the module: registers parameters in state_dict order, then draws them in the Python
// constructor's order (which is the same order).
static attn_status book_create(attn_ctx *ctx, attn_book_kind kind, int64_t d_in, int64_t d_out, int64_t context_length,
                               double dropout, int64_t num_heads, int qkv_bias, attn_book **out) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (out == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "book: out is NULL");
    *out = NULL;
    if (d_in < 1 || d_out < 1 || num_heads < 1 || context_length < 1)
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE,
                          "book: d_in (%lld), d_out (%lld), num_heads (%lld) and context_length (%lld) must be >= 1",
                          (long long)d_in, (long long)d_out, (long long)num_heads, (long long)context_length);
    if (kind == ATTN_BOOK_MHA && d_out % num_heads != 0)
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "book: d_out (%lld) must be divisible by num_heads (%lld)",
                          (long long)d_out, (long long)num_heads);
    if (!(dropout >= 0.0 && dropout <= 1.0))
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "book: dropout = %g must be in [0, 1]", dropout);
    int64_t width;
    if (!attn__mul_i64(num_heads, d_out, &width)) return attn__fail(ctx, ATTN_ERR_OVERFLOW, "book: num_heads*d_out overflows");

    attn_book *m;
    ATTN_RETURN_IF_ERR(attn__alloc(ctx, sizeof *m, (void **)&m));
    memset(m, 0, sizeof *m);
    m->alloc = ctx->alloc;
    m->kind = kind;
    m->d_in = d_in, m->d_out = d_out, m->context_length = context_length, m->num_heads = num_heads;
    m->dropout = dropout;
    m->qkv_bias = qkv_bias != 0;

    static const char *const projs[3] = {"W_query", "W_key", "W_value"};
    attn_status st = ATTN_OK;
    char name[ATTN_PARAM_NAME_MAX];
    for (int64_t g = 0; st == ATTN_OK && g < n_groups(m); g++) {
        for (int i = 0; st == ATTN_OK && i < 3; i++) {
            if (!is_linear_kind(kind)) { // nn.Parameter(torch.rand(d_in, d_out))
                param_name(m, g, projs[i], "", name, sizeof name);
                st = attn__params_add(ctx, &m->params, name, 2, (int64_t[]){d_in, d_out});
                continue;
            }
            param_name(m, g, projs[i], ".weight", name, sizeof name); // nn.Linear(d_in, d_out)
            st = attn__params_add(ctx, &m->params, name, 2, (int64_t[]){d_out, d_in});
            if (st == ATTN_OK && m->qkv_bias) {
                param_name(m, g, projs[i], ".bias", name, sizeof name);
                st = attn__params_add(ctx, &m->params, name, 1, (int64_t[]){d_out});
            }
        }
    }
    if (st == ATTN_OK && kind == ATTN_BOOK_MHA) {
        st = attn__params_add(ctx, &m->params, "out_proj.weight", 2, (int64_t[]){d_out, d_out});
        if (st == ATTN_OK) st = attn__params_add(ctx, &m->params, "out_proj.bias", 1, (int64_t[]){d_out});
    }
    if (st == ATTN_OK) st = attn__params_alloc(ctx, &m->params);
    // Draws, in registration order: torch.rand for v1; nn.Linear (weight, then bias) otherwise.
    for (int i = 0; st == ATTN_OK && i < m->params.count; i++) {
        attn__param *p = &m->params.items[i];
        if (!is_linear_kind(kind)) {
            st = attn_rand_uniform(&ctx->gen, p->data, p->numel, 0.0, 1.0);
        } else if (p->ndim == 2) {
            attn__param *bias = i + 1 < m->params.count && m->params.items[i + 1].ndim == 1 ? &m->params.items[i + 1] : NULL;
            st = attn_init_linear(&ctx->gen, p->data, bias != NULL ? bias->data : NULL, p->shape[1], p->shape[0]);
        }
    }
    if (st != ATTN_OK) {
        attn_book_free(m);
        return st;
    }
    *out = m;
    return ATTN_OK;
}

attn_status attn_book_self_attention_v1(attn_ctx *ctx, int64_t d_in, int64_t d_out, attn_book **m) {
    return book_create(ctx, ATTN_BOOK_SELF_ATTENTION_V1, d_in, d_out, 1, 0.0, 1, 0, m);
}

attn_status attn_book_self_attention_v2(attn_ctx *ctx, int64_t d_in, int64_t d_out, int qkv_bias, attn_book **m) {
    return book_create(ctx, ATTN_BOOK_SELF_ATTENTION_V2, d_in, d_out, 1, 0.0, 1, qkv_bias, m);
}

attn_status attn_book_causal_attention(attn_ctx *ctx, int64_t d_in, int64_t d_out, int64_t context_length,
                                       double dropout, int qkv_bias, attn_book **m) {
    return book_create(ctx, ATTN_BOOK_CAUSAL_ATTENTION, d_in, d_out, context_length, dropout, 1, qkv_bias, m);
}

attn_status attn_book_mha_wrapper(attn_ctx *ctx, int64_t d_in, int64_t d_out, int64_t context_length, double dropout,
                                  int64_t num_heads, int qkv_bias, attn_book **m) {
    return book_create(ctx, ATTN_BOOK_MHA_WRAPPER, d_in, d_out, context_length, dropout, num_heads, qkv_bias, m);
}

attn_status attn_book_mha(attn_ctx *ctx, int64_t d_in, int64_t d_out, int64_t context_length, double dropout,
                          int64_t num_heads, int qkv_bias, attn_book **m) {
    return book_create(ctx, ATTN_BOOK_MHA, d_in, d_out, context_length, dropout, num_heads, qkv_bias, m);
}

int attn_book_param_count(const attn_book *m) { return m != NULL ? m->params.count : 0; }

attn_status attn_book_param_at(attn_book *m, int index, const char **name, int *ndim, int64_t shape[2], float **data) {
    if (m == NULL || index < 0 || index >= m->params.count) return ATTN_ERR_INVALID_ARG;
    attn__param_describe(&m->params.items[index], name, ndim, shape, 2, NULL);
    if (data != NULL) *data = m->params.items[index].data; // the book's modules are float32
    return ATTN_OK;
}

attn_status attn_book_param(attn_book *m, const char *name, int *ndim, int64_t shape[2], float **data) {
    if (m == NULL || name == NULL) return ATTN_ERR_INVALID_ARG;
    const attn__param *p = attn__params_find(&m->params, name);
    if (p == NULL) return ATTN_ERR_NOT_FOUND;
    attn__param_describe(p, NULL, ndim, shape, 2, NULL);
    if (data != NULL) *data = p->data;
    return ATTN_OK;
}

// The spec and io of projection group g (heads of the wrapper run one group each).
static void group_problem(const attn_book *m, int64_t g, const float *x, int64_t batch, int64_t n, bool training,
                          float *out, float *weights, attn__mha_spec *spec, attn__mha_io *io) {
    const group_views v = group_of(m, g);
    memset(spec, 0, sizeof *spec);
    spec->E = m->d_out;
    spec->H = m->kind == ATTN_BOOK_MHA ? m->num_heads : 1;
    spec->dq = spec->dk = spec->dv = m->d_in;
    spec->wq = v.wq, spec->wk = v.wk, spec->wv = v.wv, spec->bq = v.bq, spec->bk = v.bk, spec->bv = v.bv;
    spec->w_in_out = !is_linear_kind(m->kind);
    if (m->kind == ATTN_BOOK_MHA) {
        spec->wo = attn__params_find(&m->params, "out_proj.weight")->data;
        spec->bo = attn__params_find(&m->params, "out_proj.bias")->data;
    }
    spec->prescale_q = false; // the book divides the scores by sqrt(d_k)
    spec->dropout = m->dropout;

    const int64_t width = attn_book_out_features(m);
    memset(io, 0, sizeof *io);
    io->query = io->key = io->value = x;
    io->N = batch, io->L = io->S = n;
    io->q_rs = io->k_rs = io->v_rs = m->d_in;
    io->q_bs = io->k_bs = io->v_bs = n * m->d_in;
    io->out = out + g * m->d_out; // the wrapper's head g fills columns [g*d_out, (g+1)*d_out)
    io->o_rs = width, io->o_bs = n * width;
    io->causal = is_causal_kind(m->kind);
    io->training = training;
    io->weights = weights;
    io->weights_mode = weights != NULL ? ATTN_WEIGHTS_PER_HEAD : ATTN_WEIGHTS_NONE;
}

// Checks a forward's arguments and plans group 0 (every group has the same shapes, so one plan
// sizes them all). `group_saved` is the bytes one group saves, rounded to ATTN_ALIGN.
static attn_status book_plan(attn_ctx *ctx, const char *what, attn_book *m, const float *x, int64_t batch,
                             int64_t n_tokens, int training, float *weights, attn__mha_plan *plan,
                             size_t *saved_bytes) {
    if (m == NULL || x == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "%s: the module and x must not be NULL", what);
    if (batch < 1 || n_tokens < 1)
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "%s: batch (%lld) and n_tokens (%lld) must be >= 1", what,
                          (long long)batch, (long long)n_tokens);
    if (is_causal_kind(m->kind) && n_tokens > m->context_length)
        return attn__fail(ctx, ATTN_ERR_CONTEXT_LENGTH, "%s: %lld tokens exceed the module's context_length of %lld",
                          what, (long long)n_tokens, (long long)m->context_length);
    // The input's and the output's element counts bound every stride computed below.
    int64_t numel;
    ATTN_RETURN_IF_ERR(attn__numel(ctx, what, 3, (int64_t[]){batch, n_tokens, m->d_in}, &numel));
    ATTN_RETURN_IF_ERR(attn__numel(ctx, what, 3, (int64_t[]){batch, n_tokens, attn_book_out_features(m)}, &numel));
    attn__mha_spec spec;
    attn__mha_io io;
    float dummy;
    group_problem(m, 0, x, batch, n_tokens, training != 0, &dummy, weights, &spec, &io);
    ATTN_RETURN_IF_ERR(attn__mha_core_plan(ctx, &spec, &io, plan));
    const size_t group_saved = (plan->saved_size + ATTN_ALIGN - 1) & ~(size_t)(ATTN_ALIGN - 1);
    if (group_saved != 0 && (size_t)n_groups(m) > SIZE_MAX / group_saved)
        return attn__fail(ctx, ATTN_ERR_OVERFLOW, "%s: the saved activations overflow size_t", what);
    *saved_bytes = group_saved * (size_t)n_groups(m);
    return ATTN_OK;
}

// The forward of every group; with `saved`, group g keeps its activations at g * group_saved.
static attn_status book_run(attn_ctx *ctx, const char *what, attn_book *m, const float *x, int64_t batch,
                            int64_t n_tokens, int training, float *out, float *weights, void *saved, size_t saved_size) {
    if (out == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "%s: out must not be NULL", what);
    attn__mha_plan plan;
    size_t saved_bytes;
    ATTN_RETURN_IF_ERR(book_plan(ctx, what, m, x, batch, n_tokens, training, weights, &plan, &saved_bytes));
    if (saved != NULL && (uintptr_t)saved % ATTN_SAVED_ALIGN != 0)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "%s: saved must be %d-byte aligned (as malloc's are)", what,
                          ATTN_SAVED_ALIGN);
    if (saved != NULL && saved_size < saved_bytes)
        return attn__fail(ctx, ATTN_ERR_WORKSPACE, "%s: saved needs %zu bytes, got %zu", what, saved_bytes, saved_size);
    const bool wrapper = m->kind == ATTN_BOOK_MHA_WRAPPER;
    attn__arena a = {0};
    attn__arena_take(&a, plan.ws_size);
    float *head_w = NULL;
    size_t head_w_bytes = 0;
    if (wrapper && weights != NULL) { // one head's (batch, 1, n, n) weights before they are interleaved
        int64_t nw;
        ATTN_RETURN_IF_ERR(attn__numel(ctx, what, 3, (int64_t[]){batch, n_tokens, n_tokens}, &nw));
        ATTN_RETURN_IF_ERR(attn__bytes(ctx, what, nw, sizeof(float), &head_w_bytes));
        attn__arena_take(&a, head_w_bytes);
    }
    void *ws;
    ATTN_RETURN_IF_ERR(attn__workspace(ctx, a.used, &ws));
    a = (attn__arena){.base = ws};
    void *core_ws = attn__arena_take(&a, plan.ws_size);
    if (head_w_bytes > 0) head_w = attn__arena_take(&a, head_w_bytes);

    const size_t group_saved = saved_bytes / (size_t)n_groups(m);
    for (int64_t g = 0; g < n_groups(m); g++) {
        attn__mha_spec spec;
        attn__mha_io io;
        group_problem(m, g, x, batch, n_tokens, training != 0, out, wrapper ? head_w : weights, &spec, &io);
        attn__mha_core_run(ctx, &spec, &io, &plan, core_ws, saved != NULL ? (char *)saved + g * group_saved : NULL);
        if (head_w != NULL) // weights (batch, num_heads, n, n) <- head g's (batch, n, n)
            for (int64_t b = 0; b < batch; b++)
                memcpy(weights + (b * m->num_heads + g) * n_tokens * n_tokens, head_w + b * n_tokens * n_tokens,
                       (size_t)(n_tokens * n_tokens) * sizeof(float));
    }
    return ATTN_OK;
}

attn_status attn_book_forward(attn_ctx *ctx, attn_book *m, const float *x, int64_t batch, int64_t n_tokens,
                              int training, float *out, float *weights) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    return book_run(ctx, "book_forward", m, x, batch, n_tokens, training, out, weights, NULL, 0);
}

attn_status attn_book_saved_size(attn_ctx *ctx, attn_book *m, int64_t batch, int64_t n_tokens, size_t *bytes) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (bytes == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "book_saved_size: bytes is NULL");
    attn__mha_plan plan;
    const float dummy = 0.0f;
    return book_plan(ctx, "book_saved_size", m, &dummy, batch, n_tokens, 0, NULL, &plan, bytes);
}

attn_status attn_book_forward_train(attn_ctx *ctx, attn_book *m, const float *x, int64_t batch, int64_t n_tokens,
                                    int training, float *out, float *weights, void *saved, size_t saved_size) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (saved == NULL) return attn__fail(ctx, ATTN_ERR_WORKSPACE, "book_forward_train: saved is NULL");
    return book_run(ctx, "book_forward_train", m, x, batch, n_tokens, training, out, weights, saved, saved_size);
}

attn_status attn_book_backward(attn_ctx *ctx, attn_book *m, const float *x, int64_t batch, int64_t n_tokens,
                               int training, const void *saved, size_t saved_size, const float *dout, float *dx,
                               float *const *dparams) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    const char *what = "book_backward";
    if (dout == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "%s: dout is NULL", what);
    attn__mha_plan plan;
    size_t saved_bytes;
    ATTN_RETURN_IF_ERR(book_plan(ctx, what, m, x, batch, n_tokens, training, NULL, &plan, &saved_bytes));
    if (saved != NULL && (uintptr_t)saved % ATTN_SAVED_ALIGN != 0)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "%s: saved must be %d-byte aligned (as malloc's are)", what,
                          ATTN_SAVED_ALIGN);
    const size_t group_saved = saved_bytes / (size_t)n_groups(m);
    bool matches = saved != NULL && saved_size >= saved_bytes;
    for (int64_t g = 0; matches && g < n_groups(m); g++) {
        attn__mha_spec spec;
        attn__mha_io io;
        group_problem(m, g, x, batch, n_tokens, training != 0, (float *)(uintptr_t)dout, NULL, &spec, &io);
        matches = attn__mha_saved_matches(&spec, &io, &plan, (const char *)saved + g * group_saved);
    }
    if (!matches)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG,
                          "%s: saved does not hold the activations of a training forward with these arguments", what);
    void *ws;
    ATTN_RETURN_IF_ERR(attn__workspace(ctx, plan.bwd_ws_size, &ws));
    for (int64_t g = 0; g < n_groups(m); g++) {
        attn__mha_spec spec;
        attn__mha_io io;
        // dout has out's layout: group g reads its column block, as its forward wrote it
        group_problem(m, g, x, batch, n_tokens, training != 0, (float *)(uintptr_t)dout, NULL, &spec, &io);
        attn__mha_grads gr = {.dquery = dx, .add_to_inputs = g > 0}; // x is query, key and value: one sum
        float **slots[] = {&gr.dwq, &gr.dwk, &gr.dwv, &gr.dbq, &gr.dbk, &gr.dbv};
        const float *mine[] = {spec.wq, spec.wk, spec.wv, spec.bq, spec.bk, spec.bv};
        for (int i = 0; dparams != NULL && i < m->params.count; i++) {
            const float *data = m->params.items[i].data;
            for (int j = 0; j < 6; j++)
                if (mine[j] != NULL && data == mine[j]) *slots[j] = dparams[i];
            if (data == spec.wo) gr.dwo = dparams[i];
            if (spec.bo != NULL && data == spec.bo) gr.dbo = dparams[i];
        }
        attn__mha_core_backward(ctx, &spec, &io, &plan, (const char *)saved + g * group_saved, io.out, &gr, ws);
    }
    return ATTN_OK;
}

attn_status attn_book_transfer_v2_to_v1(const attn_book *v2, attn_book *v1) {
    if (v2 == NULL || v1 == NULL || v2->kind != ATTN_BOOK_SELF_ATTENTION_V2 || v1->kind != ATTN_BOOK_SELF_ATTENTION_V1)
        return ATTN_ERR_INVALID_ARG;
    if (v2->d_in != v1->d_in || v2->d_out != v1->d_out) return ATTN_ERR_BAD_SHAPE;
    if (v2->qkv_bias) return ATTN_ERR_UNSUPPORTED; // v1 has no bias to receive it
    static const char *const projs[3] = {"W_query", "W_key", "W_value"};
    for (int i = 0; i < 3; i++) {
        char name[ATTN_PARAM_NAME_MAX];
        snprintf(name, sizeof name, "%s.weight", projs[i]);
        const float *w2 = attn__params_find(&v2->params, name)->data; // (d_out, d_in)
        float *w1 = attn__params_find(&v1->params, projs[i])->data;    // (d_in, d_out)
        for (int64_t r = 0; r < v1->d_in; r++)
            for (int64_t c = 0; c < v1->d_out; c++) w1[r * v1->d_out + c] = w2[c * v1->d_in + r];
    }
    return ATTN_OK;
}

attn_status attn_simple_self_attention(attn_ctx *ctx, const float *x, int64_t n, int64_t d, attn_simple_norm norm,
                                       float *scores, float *weights, float *context) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (x == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "simple_self_attention: x is NULL");
    if (n < 1 || d < 1)
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "simple_self_attention: n (%lld) and d (%lld) must be >= 1",
                          (long long)n, (long long)d);
    if (norm != ATTN_SIMPLE_SOFTMAX && norm != ATTN_SIMPLE_SUM)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "simple_self_attention: unknown normalisation %d", (int)norm);
    size_t nn_bytes, nd_bytes;
    int64_t nn, nd;
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "simple_self_attention: scores", 2, (int64_t[]){n, n}, &nn));
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "simple_self_attention: context", 2, (int64_t[]){n, d}, &nd));
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "simple_self_attention: scores", nn, sizeof(float), &nn_bytes));
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "simple_self_attention: context", nd, sizeof(float), &nd_bytes));
    // The SDPA view: one batch, one head, q = k = v = x (n, d), scale 1.
    attn_sdpa_desc sd;
    attn_sdpa_desc_init(&sd);
    sd.batch = 1, sd.n_heads = 1, sd.len_q = sd.len_kv = n, sd.head_dim = d, sd.scale = 1.0f;
    attn_layout_strides(ATTN_LAYOUT_BHLD, 1, 1, n, d, sd.q_stride);
    memcpy(sd.k_stride, sd.q_stride, sizeof sd.q_stride);
    memcpy(sd.v_stride, sd.q_stride, sizeof sd.q_stride);
    memcpy(sd.o_stride, sd.q_stride, sizeof sd.q_stride);
    sd.weights_mode = ATTN_WEIGHTS_PER_HEAD;
    attn__sdpa_shape sh;
    ATTN_RETURN_IF_ERR(attn__sdpa_check(ctx, &sd, &sh));

    attn__arena a = {0};
    attn__arena_take(&a, scores == NULL ? nn_bytes : 0);
    attn__arena_take(&a, weights == NULL ? nn_bytes : 0);
    attn__arena_take(&a, context == NULL ? nd_bytes : 0);
    attn__arena_take(&a, attn__sdpa_workspace(ctx, &sh, &sd));
    attn__arena_take(&a, attn__linear_workspace(ctx, n > d ? n : d));
    void *ws;
    ATTN_RETURN_IF_ERR(attn__workspace(ctx, a.used, &ws));
    a = (attn__arena){.base = ws};
    float *s = scores != NULL ? scores : attn__arena_take(&a, nn_bytes);     // (n, n)
    float *w = weights != NULL ? weights : attn__arena_take(&a, nn_bytes);   // (n, n)
    float *c = context != NULL ? context : attn__arena_take(&a, nd_bytes);   // (n, d)
    void *sdpa_ws = attn__arena_take(&a, attn__sdpa_workspace(ctx, &sh, &sd));
    void *linear_ws = attn__arena_take(&a, attn__linear_workspace(ctx, n > d ? n : d));

    attn__linear(ctx, x, n, d, d, x, false, NULL, n, s, n, linear_ws); // scores = x x^T
    if (norm == ATTN_SIMPLE_SOFTMAX) {
        attn__sdpa_run(ctx, &sd, &sh, x, x, x, c, NULL, w, sdpa_ws);
    } else { // weights = scores / row sum, context = weights x
        for (int64_t i = 0; i < n; i++) {
            double sum = 0.0;
            for (int64_t j = 0; j < n; j++) sum += s[i * n + j];
            for (int64_t j = 0; j < n; j++) w[i * n + j] = (float)(s[i * n + j] / sum);
        }
        attn__linear(ctx, w, n, n, n, x, true, NULL, d, c, d, linear_ws);
    }
    return ATTN_OK;
}

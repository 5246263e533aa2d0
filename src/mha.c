// mha.c - nn.MultiheadAttention: configuration, parameters under PyTorch's state_dict names, the
// constructor's initialisation, and the forward pass (validated here, computed by mha_core.c).
#include <math.h>
#include <string.h>

#include "half.h"
#include "mha_core.h"
#include "mha_internal.h"

void attn_mha_config_init(attn_mha_config *cfg, int64_t embed_dim, int64_t num_heads) {
    if (cfg == NULL) return;
    memset(cfg, 0, sizeof *cfg);
    cfg->embed_dim = embed_dim;
    cfg->num_heads = num_heads;
    cfg->bias = 1;
}

void attn_mha_args_init(attn_mha_args *args) {
    if (args == NULL) return;
    memset(args, 0, sizeof *args);
    args->need_weights = 1;
    args->average_attn_weights = 1;
}

static attn_status check_config(attn_ctx *ctx, const attn_mha_config *in, attn_mha_config *out) {
    *out = *in;
    if (in->embed_dim < 1 || in->num_heads < 1)
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "mha: embed_dim (%lld) and num_heads (%lld) must be >= 1",
                          (long long)in->embed_dim, (long long)in->num_heads);
    if (in->embed_dim % in->num_heads != 0)
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "mha: embed_dim (%lld) must be divisible by num_heads (%lld)",
                          (long long)in->embed_dim, (long long)in->num_heads);
    if (in->kdim < 0 || in->vdim < 0)
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "mha: kdim and vdim must be >= 1 (or 0 for embed_dim)");
    if (!(in->dropout >= 0.0 && in->dropout <= 1.0))
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "mha: dropout = %g must be in [0, 1]", in->dropout);
    if (!attn__is_float_dtype(in->dtype))
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "mha: dtype must be F32, F16 or BF16, not %s",
                          attn_dtype_name(in->dtype));
    out->kdim = in->kdim == 0 ? in->embed_dim : in->kdim;
    out->vdim = in->vdim == 0 ? in->embed_dim : in->vdim;
    out->bias = in->bias != 0;
    out->add_bias_kv = in->add_bias_kv != 0;
    out->add_zero_attn = in->add_zero_attn != 0;
    out->batch_first = in->batch_first != 0;
    return ATTN_OK;
}

void attn_mha_free(attn_mha *m) {
    if (m == NULL) return;
    attn_allocator a = m->alloc;
    attn__params_free(&a, &m->params);
    attn__free_with(&a, m);
}

attn_status attn__mha_alloc(attn_ctx *ctx, const attn_mha_config *cfg_in, bool separate_qkv, attn_mha **out) {
    attn_mha_config cfg;
    ATTN_RETURN_IF_ERR(check_config(ctx, cfg_in, &cfg));
    attn_mha *m;
    ATTN_RETURN_IF_ERR(attn__alloc(ctx, sizeof *m, (void **)&m));
    memset(m, 0, sizeof *m);
    m->alloc = ctx->alloc;
    m->cfg = cfg;
    const int64_t E = cfg.embed_dim;
    m->packed = cfg.kdim == E && cfg.vdim == E && !separate_qkv;
    m->params.dtype = cfg.dtype;
    int64_t E3;
    attn_status st = attn__mul_i64(3, E, &E3) ? ATTN_OK : attn__fail(ctx, ATTN_ERR_OVERFLOW, "mha: 3*embed_dim overflows");
    // state_dict order
    if (st == ATTN_OK && m->packed) st = attn__params_add(ctx, &m->params, "in_proj_weight", 2, (int64_t[]){E3, E});
    if (st == ATTN_OK && !m->packed) st = attn__params_add(ctx, &m->params, "q_proj_weight", 2, (int64_t[]){E, E});
    if (st == ATTN_OK && !m->packed)
        st = attn__params_add(ctx, &m->params, "k_proj_weight", 2, (int64_t[]){E, cfg.kdim});
    if (st == ATTN_OK && !m->packed)
        st = attn__params_add(ctx, &m->params, "v_proj_weight", 2, (int64_t[]){E, cfg.vdim});
    if (st == ATTN_OK && cfg.bias) st = attn__params_add(ctx, &m->params, "in_proj_bias", 1, (int64_t[]){E3});
    if (st == ATTN_OK && cfg.add_bias_kv) st = attn__params_add(ctx, &m->params, "bias_k", 3, (int64_t[]){1, 1, E});
    if (st == ATTN_OK && cfg.add_bias_kv) st = attn__params_add(ctx, &m->params, "bias_v", 3, (int64_t[]){1, 1, E});
    if (st == ATTN_OK) st = attn__params_add(ctx, &m->params, "out_proj.weight", 2, (int64_t[]){E, E});
    if (st == ATTN_OK && cfg.bias) st = attn__params_add(ctx, &m->params, "out_proj.bias", 1, (int64_t[]){E});
    if (st == ATTN_OK) st = attn__params_alloc(ctx, &m->params);
    if (st != ATTN_OK) {
        attn_mha_free(m);
        return st;
    }
    *out = m;
    return ATTN_OK;
}

// ---- where the parameters live ------------------------------------------------------------------
// The one map from the state_dict's names to the four projections (q, k, v, out): the table item
// holding each one's weight (E rows of `width` inputs) and bias (E values) and their element offsets
// there. in_proj_weight stacks W_q, W_k, W_v (the packed layout; else q_proj_weight, k_proj_weight
// and v_proj_weight hold one each), in_proj_bias stacks b_q, b_k, b_v. Every view of the parameters
// (float32, typed, the gradients, the forward's conversions) is made through it.
enum { PROJ_Q, PROJ_K, PROJ_V, PROJ_O, PROJS };

typedef struct proj_place {
    const attn__param *w, *b; // b NULL without biases
    int64_t woff, boff, width;
} proj_place;

static void proj_places(const attn_mha *m, proj_place pl[PROJS]) {
    const attn__params *p = &m->params;
    const int64_t E = m->cfg.embed_dim, width[3] = {E, m->cfg.kdim, m->cfg.vdim};
    static const char *const own[3] = {"q_proj_weight", "k_proj_weight", "v_proj_weight"};
    const attn__param *in_w = attn__params_find(p, "in_proj_weight"), *in_b = attn__params_find(p, "in_proj_bias");
    for (int i = 0; i < 3; i++)
        pl[i] = (proj_place){.w = m->packed ? in_w : attn__params_find(p, own[i]), .b = in_b,
                             .woff = m->packed ? i * E * E : 0, .boff = i * E, .width = width[i]};
    pl[PROJ_O] = (proj_place){.w = attn__params_find(p, "out_proj.weight"), .b = attn__params_find(p, "out_proj.bias"),
                              .width = E};
}

// The module's projection weights and biases and bias_k / bias_v, as float32.
typedef struct mha_views {
    const float *w[PROJS], *b[PROJS], *bias_k, *bias_v;
} mha_views;

// The views of `all`: every parameter, as float32, in table order (m->params.numel values). With
// all NULL, markers only: each present parameter points at the module's storage (a call is planned
// before its float32 copy exists; planning needs to know which parameters there are).
static mha_views views_of(const attn_mha *m, const float *all) {
    proj_place pl[PROJS];
    proj_places(m, pl);
    const float *mk = m->params.storage;
    const attn__param *bk = attn__params_find(&m->params, "bias_k"), *bv = attn__params_find(&m->params, "bias_v");
    mha_views v = {0};
    for (int i = 0; i < PROJS; i++) {
        v.w[i] = all == NULL ? mk : all + pl[i].w->offset + pl[i].woff;
        if (pl[i].b != NULL) v.b[i] = all == NULL ? mk : all + pl[i].b->offset + pl[i].boff;
    }
    if (bk != NULL) v.bias_k = all == NULL ? mk : all + bk->offset;
    if (bv != NULL) v.bias_v = all == NULL ? mk : all + bv->offset;
    return v;
}

// The four projections of attn_mha_forward_cached: weights of type dt (F32: the module's or the
// call's float32 copy; F16 / BF16: the module's storage, read as it is by attn__linear_half) and
// float32 biases.
typedef struct proj_weights {
    const void *w[PROJS];
    const float *b[PROJS];
    attn_dtype dt;
} proj_weights;

// An F16 / BF16 module's weights in its storage, its biases converted into bias (4E floats: q, k,
// v, then out; NULL where the module has none; bias NULL: the biases left NULL).
static proj_weights half_weights_of(const attn_ctx *ctx, const attn_mha *m, float *bias) {
    const int64_t E = m->cfg.embed_dim;
    const attn_dtype dt = m->params.dtype;
    const size_t size = attn_dtype_size(dt);
    const char *base = m->params.storage;
    proj_place pl[PROJS];
    proj_places(m, pl);
    proj_weights h = {.dt = dt};
    for (int i = 0; i < PROJS; i++) {
        h.w[i] = base + (size_t)(pl[i].w->offset + pl[i].woff) * size;
        if (bias != NULL && pl[i].b != NULL) {
            attn__to_f32(ctx, dt, base + (size_t)(pl[i].b->offset + pl[i].boff) * size, bias + i * E, E);
            h.b[i] = bias + i * E;
        }
    }
    return h;
}

// ---- F16 / BF16 modules: float32 at the edges ---------------------------------------------------
// A module of F16 or BF16 computes with the pipeline of the float32 module: each call converts its
// parameters and inputs (exactly) to float32 in the call's workspace, the pipeline rounds the
// projections and the heads' output to the type (mha_core.c), and the results are rounded to the
// type once as they are written to the caller's buffers. The module keeps no float32 copy.

// The float32 copies of a call, carved from its workspace (NULL where not needed).
typedef struct stage_bufs {
    float *params;                // every parameter, table order
    float *query, *key, *value;   // the inputs, sharing a copy where the caller's pointers are equal
    float *out, *weights;         // the forward's results before rounding (out: dout in the backward)
    float *dquery, *dkey, *dvalue; // the backward's input gradients before rounding
} stage_bufs;

typedef struct stage_sizes {
    int64_t query, key, value, out, weights; // elements; 0 = not staged
    bool key_is_query, value_is_query, value_is_key;
    bool backward;
    bool no_params;                          // the parameters are read in their own type (no copy)
    const void *dquery, *dkey, *dvalue;      // the caller's gradient buffers (backward)
} stage_sizes;

static void stage_layout(const attn_mha *m, const stage_sizes *z, attn__arena *a, stage_bufs *b) {
    memset(b, 0, sizeof *b);
    if (m->cfg.dtype == ATTN_DTYPE_F32) return;
    const size_t f = sizeof(float);
    b->params = z->no_params ? NULL : attn__arena_take(a, (size_t)m->params.numel * f);
    b->query = attn__arena_take(a, (size_t)z->query * f);
    b->key = z->key_is_query ? b->query : attn__arena_take(a, (size_t)z->key * f);
    b->value = z->value_is_query ? b->query : z->value_is_key ? b->key : attn__arena_take(a, (size_t)z->value * f);
    b->out = attn__arena_take(a, (size_t)z->out * f);
    b->weights = z->weights > 0 ? attn__arena_take(a, (size_t)z->weights * f) : NULL;
    if (z->backward) {
        b->dquery = z->dquery != NULL ? attn__arena_take(a, (size_t)z->query * f) : NULL;
        b->dkey = z->dkey != NULL ? attn__arena_take(a, (size_t)z->key * f) : NULL;
        b->dvalue = z->dvalue != NULL ? attn__arena_take(a, (size_t)z->value * f) : NULL;
    }
}

attn_status attn__mha_convert(attn_ctx *ctx, attn_mha *src, attn_dtype dtype, attn_mha **out) {
    *out = NULL;
    attn_mha_config c = src->cfg;
    c.dtype = dtype;
    attn_mha *m;
    attn_status st = attn__mha_alloc(ctx, &c, !src->packed, &m);
    if (st != ATTN_OK) { // m was not set: nothing of it to free
        attn_mha_free(src);
        return st;
    }
    st = attn_convert(dtype, m->params.storage, src->params.dtype, src->params.storage, src->params.numel);
    attn_mha_free(src);
    if (st != ATTN_OK) {
        attn_mha_free(m);
        return attn__fail(ctx, st, "mha: converting the parameters to %s failed", attn_dtype_name(dtype));
    }
    *out = m;
    return ATTN_OK;
}

attn_status attn_mha_create(attn_ctx *ctx, const attn_mha_config *cfg, attn_mha **out) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (cfg == NULL || out == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "mha_create: NULL argument");
    *out = NULL;
    // F16 / BF16: drawn in float32, then rounded to nearest even (module.to(torch.bfloat16))
    attn_mha_config c32 = *cfg;
    c32.dtype = ATTN_DTYPE_F32;
    attn_mha *m;
    ATTN_RETURN_IF_ERR(attn__is_float_dtype(cfg->dtype) ? attn__mha_alloc(ctx, &c32, false, &m)
                                                         : attn__mha_alloc(ctx, cfg, false, &m)); // reports the dtype
    // nn.MultiheadAttention.__init__: out_proj = Linear(E, E, bias) is built (and drawn) first, then
    // _reset_parameters: xavier_uniform_ on the input projections, zero biases, xavier_normal_ on
    // bias_k and bias_v.
    attn_generator *g = &ctx->gen;
    const int64_t E = m->cfg.embed_dim;
    attn__param *wo = attn__params_find(&m->params, "out_proj.weight");
    attn__param *bo = attn__params_find(&m->params, "out_proj.bias");
    attn_status st = attn_init_linear(g, wo->data, bo != NULL ? bo->data : NULL, E, E);
    if (st == ATTN_OK && m->packed)
        st = attn_init_xavier_uniform(g, attn__params_find(&m->params, "in_proj_weight")->data, 3 * E, E);
    if (st == ATTN_OK && !m->packed)
        st = attn_init_xavier_uniform(g, attn__params_find(&m->params, "q_proj_weight")->data, E, E);
    if (st == ATTN_OK && !m->packed)
        st = attn_init_xavier_uniform(g, attn__params_find(&m->params, "k_proj_weight")->data, E, m->cfg.kdim);
    if (st == ATTN_OK && !m->packed)
        st = attn_init_xavier_uniform(g, attn__params_find(&m->params, "v_proj_weight")->data, E, m->cfg.vdim);
    attn__param *bi = attn__params_find(&m->params, "in_proj_bias");
    if (bi != NULL) memset(bi->data, 0, (size_t)bi->numel * sizeof(float));
    if (bo != NULL) memset(bo->data, 0, (size_t)bo->numel * sizeof(float));
    if (st == ATTN_OK && m->cfg.add_bias_kv) {
        st = attn_init_xavier_normal(g, attn__params_find(&m->params, "bias_k")->data, E, E, E);
        if (st == ATTN_OK) st = attn_init_xavier_normal(g, attn__params_find(&m->params, "bias_v")->data, E, E, E);
    }
    if (st != ATTN_OK) {
        attn_mha_free(m);
        return attn__fail(ctx, st, "mha_create: parameter initialisation failed");
    }
    if (cfg->dtype != ATTN_DTYPE_F32) return attn__mha_convert(ctx, m, cfg->dtype, out);
    *out = m;
    return ATTN_OK;
}

const attn_mha_config *attn_mha_get_config(const attn_mha *m) { return m != NULL ? &m->cfg : NULL; }

int attn_mha_param_count(const attn_mha *m) { return m != NULL ? m->params.count : 0; }

attn_status attn_mha_param_typed_at(attn_mha *m, int index, const char **name, int *ndim, int64_t shape[3],
                                    attn_dtype *dtype, void **data) {
    if (m == NULL || index < 0 || index >= m->params.count) return ATTN_ERR_INVALID_ARG;
    attn__param_describe(&m->params.items[index], name, ndim, shape, 3, data);
    if (dtype != NULL) *dtype = m->params.dtype;
    return ATTN_OK;
}

attn_status attn_mha_param_typed(attn_mha *m, const char *name, int *ndim, int64_t shape[3], attn_dtype *dtype,
                                 void **data) {
    if (m == NULL || name == NULL) return ATTN_ERR_INVALID_ARG;
    const attn__param *p = attn__params_find(&m->params, name);
    if (p == NULL) return ATTN_ERR_NOT_FOUND;
    attn__param_describe(p, NULL, ndim, shape, 3, data);
    if (dtype != NULL) *dtype = m->params.dtype;
    return ATTN_OK;
}

// The float accessors: `data` only for float32 modules (the typed ones serve every module).
attn_status attn_mha_param_at(attn_mha *m, int index, const char **name, int *ndim, int64_t shape[3], float **data) {
    if (m != NULL && data != NULL && m->params.dtype != ATTN_DTYPE_F32) return ATTN_ERR_INVALID_ARG;
    void *d;
    ATTN_RETURN_IF_ERR(attn_mha_param_typed_at(m, index, name, ndim, shape, NULL, &d));
    if (data != NULL) *data = d;
    return ATTN_OK;
}

attn_status attn_mha_param(attn_mha *m, const char *name, int *ndim, int64_t shape[3], float **data) {
    if (m != NULL && data != NULL && m->params.dtype != ATTN_DTYPE_F32) return ATTN_ERR_INVALID_ARG;
    void *d;
    ATTN_RETURN_IF_ERR(attn_mha_param_typed(m, name, ndim, shape, NULL, &d));
    if (data != NULL) *data = d;
    return ATTN_OK;
}

int64_t attn_mha_weights_len_kv(const attn_mha *m, int64_t len_kv) {
    if (m == NULL) return 0;
    return len_kv + (m->cfg.add_bias_kv ? 1 : 0) + (m->cfg.add_zero_attn ? 1 : 0);
}

static attn_status check_mask(attn_ctx *ctx, const char *what, attn_dtype dt) {
    if (dt != ATTN_DTYPE_BOOL && dt != ATTN_DTYPE_F32 && dt != ATTN_DTYPE_U8)
        return attn__fail(ctx, ATTN_ERR_BAD_MASK, "mha: %s must be BOOL or F32 (U8 is read as BOOL), not %s", what,
                          attn_dtype_name(dt));
    return ATTN_OK;
}

static void set_weights(attn__mha_spec *spec, const mha_views *v) {
    spec->wq = v->w[PROJ_Q], spec->wk = v->w[PROJ_K], spec->wv = v->w[PROJ_V], spec->wo = v->w[PROJ_O];
    spec->bq = v->b[PROJ_Q], spec->bk = v->b[PROJ_K], spec->bv = v->b[PROJ_V], spec->bo = v->b[PROJ_O];
    spec->bias_k = v->bias_k, spec->bias_v = v->bias_v;
}

// Validates args against the module and fills the core's spec and io.
// for_backward: `out` stands for dout (only its layout matters) and the weights are not produced.
static attn_status mha_prepare(attn_ctx *ctx, const attn_mha *m, const attn_mha_args *a, const void *out,
                               const void *weights, bool for_backward, attn__mha_spec *spec, attn__mha_io *io) {
    const attn_mha_config *c = &m->cfg;
    const int64_t E = c->embed_dim, H = c->num_heads;
    if (a->query == NULL || out == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "mha: query and out must not be NULL");
    if (!for_backward && a->need_weights && weights == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "mha: need_weights is set but weights is NULL");
    if (!for_backward && !a->need_weights && weights != NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "mha: weights given but need_weights is not set");
    const void *key = a->key != NULL ? a->key : a->query;
    const void *value = a->value != NULL ? a->value : key;
    const int64_t N = a->unbatched ? 1 : a->batch, L = a->len_q;
    const int64_t S = a->key != NULL ? a->len_kv : a->len_q;
    if (N < 1 || L < 1 || S < 1)
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "mha: batch (%lld), len_q (%lld) and len_kv (%lld) must be >= 1",
                          (long long)N, (long long)L, (long long)S);
    if (a->key == NULL && c->kdim != E)
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "mha: key omitted but kdim (%lld) != embed_dim (%lld)",
                          (long long)c->kdim, (long long)E);
    if (a->value == NULL && c->vdim != (a->key == NULL ? E : c->kdim))
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "mha: value omitted but vdim (%lld) differs from the key's width",
                          (long long)c->vdim);
    // The tensors' element counts bound every stride computed below.
    int64_t numel;
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "mha: query", 3, (int64_t[]){N, L, E}, &numel));
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "mha: key", 3, (int64_t[]){N, S, c->kdim}, &numel));
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "mha: value", 3, (int64_t[]){N, S, c->vdim}, &numel));
    if (a->causal && a->attn_mask != NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "mha: causal and attn_mask are exclusive");
    if (a->attn_mask != NULL) {
        ATTN_RETURN_IF_ERR(check_mask(ctx, "attn_mask", a->attn_mask_dtype));
        if (a->attn_mask_ndim != 2 && a->attn_mask_ndim != 3)
            return attn__fail(ctx, ATTN_ERR_BAD_MASK, "mha: attn_mask must be 2-D (L, S) or 3-D (N*H, L, S), not %d-D",
                              a->attn_mask_ndim);
    }
    if (a->key_padding_mask != NULL) ATTN_RETURN_IF_ERR(check_mask(ctx, "key_padding_mask", a->key_padding_mask_dtype));

    // float32 modules compute on their own storage; the others are planned with markers until the
    // call's float32 copy exists (set_weights again in mha_begin)
    const mha_views v = views_of(m, c->dtype == ATTN_DTYPE_F32 ? (const float *)m->params.storage : NULL);
    memset(spec, 0, sizeof *spec);
    spec->E = E, spec->H = H, spec->dq = E, spec->dk = c->kdim, spec->dv = c->vdim;
    set_weights(spec, &v);
    spec->add_zero_attn = c->add_zero_attn;
    spec->prescale_q = true, spec->dropout = c->dropout, spec->dtype = c->dtype;

    memset(io, 0, sizeof *io);
    // the caller's tensors; for an F16 / BF16 module mha_begin points these at float32 copies
    io->query = a->query, io->key = key, io->value = value, io->out = (float *)(uintptr_t)out;
    io->N = N, io->L = L, io->S = S;
    // Row stride r and batch stride b of each tensor: (L,N,E) -> (N*E, E); (N,L,E) -> (E, L*E).
    const bool bf = a->unbatched || c->batch_first;
    io->q_rs = bf ? E : N * E, io->q_bs = a->unbatched ? 0 : (bf ? L * E : E);
    io->k_rs = bf ? c->kdim : N * c->kdim, io->k_bs = a->unbatched ? 0 : (bf ? S * c->kdim : c->kdim);
    io->v_rs = bf ? c->vdim : N * c->vdim, io->v_bs = a->unbatched ? 0 : (bf ? S * c->vdim : c->vdim);
    io->o_rs = bf ? E : N * E, io->o_bs = a->unbatched ? 0 : (bf ? L * E : E);
    if (a->attn_mask != NULL) {
        io->attn_mask = a->attn_mask;
        io->attn_mask_dtype = a->attn_mask_dtype == ATTN_DTYPE_U8 ? ATTN_DTYPE_BOOL : a->attn_mask_dtype;
        io->attn_mask_ndim = a->attn_mask_ndim;
    }
    if (a->key_padding_mask != NULL) {
        io->key_padding_mask = a->key_padding_mask;
        io->kpm_dtype = a->key_padding_mask_dtype == ATTN_DTYPE_U8 ? ATTN_DTYPE_BOOL : a->key_padding_mask_dtype;
        io->kpm_bs = a->unbatched ? 0 : S;
    }
    io->causal = a->causal != 0;
    io->training = a->training != 0;
    io->weights = (float *)(uintptr_t)weights;
    io->weights_mode = !a->need_weights || for_backward ? ATTN_WEIGHTS_NONE
                       : a->average_attn_weights ? ATTN_WEIGHTS_AVERAGE
                                                 : ATTN_WEIGHTS_PER_HEAD;
    return ATTN_OK;
}

// A planned call: the pipeline's problem and, for an F16 / BF16 module, what it stages.
typedef struct mha_call {
    attn__mha_spec spec;
    attn__mha_io io;
    attn__mha_plan plan;
    stage_sizes z;
} mha_call;

// Validates and plans a call (forward, training forward or backward). out, weights: the caller's
// (dout and NULL for the backward, whose input gradients dq, dk, dv are given here to be staged).
static attn_status mha_setup(attn_ctx *ctx, attn_mha *m, const attn_mha_args *args, const void *out,
                             const void *weights, bool for_backward, const void *dq, const void *dk, const void *dv,
                             mha_call *c) {
    if (m == NULL || args == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "mha: NULL module or args");
    ATTN_RETURN_IF_ERR(mha_prepare(ctx, m, args, out, weights, for_backward, &c->spec, &c->io));
    ATTN_RETURN_IF_ERR(attn__mha_core_plan(ctx, &c->spec, &c->io, &c->plan));
    const attn__mha_io *io = &c->io;
    const int64_t E = m->cfg.embed_dim, N = io->N, L = io->L, S = io->S, S2 = c->plan.S2;
    stage_sizes *z = &c->z;
    memset(z, 0, sizeof *z);
    z->query = N * L * E, z->key = N * S * m->cfg.kdim, z->value = N * S * m->cfg.vdim, z->out = N * L * E;
    z->weights = io->weights_mode == ATTN_WEIGHTS_PER_HEAD ? N * m->cfg.num_heads * L * S2
                 : io->weights_mode == ATTN_WEIGHTS_AVERAGE ? N * L * S2
                                                            : 0;
    z->key_is_query = io->key == io->query;
    z->value_is_query = io->value == io->query;
    z->value_is_key = io->value == io->key;
    z->backward = for_backward, z->dquery = dq, z->dkey = dk, z->dvalue = dv;
    return ATTN_OK;
}

// A forward's float32 copy of the parameters into all (table order): every parameter but the
// weights its projections read in place (attn__linear_half_applies for their token rows, L for q
// and out, S for k and v, and input width, the rule of mha_core.c's projections), whose slots are
// left unwritten.
static void stage_forward_params(attn_ctx *ctx, const attn_mha *m, const attn__mha_io *io, float *all) {
    const attn_dtype dt = m->params.dtype;
    const int64_t E = m->cfg.embed_dim, rows[PROJS] = {io->L, io->S, io->S, io->L};
    const char *base = m->params.storage;
    proj_place pl[PROJS];
    proj_places(m, pl);
    for (int i = 0; i < m->params.count; i++) {
        const attn__param *p = &m->params.items[i];
        bool weights = false; // p holds projection weights: converted projection by projection
        for (int k = 0; k < PROJS; k++) {
            if (pl[k].w != p) continue;
            weights = true;
            if (attn__linear_half_applies(ctx, dt, rows[k], pl[k].width)) continue;
            const int64_t off = p->offset + pl[k].woff;
            attn__to_f32(ctx, dt, base + (size_t)off * attn_dtype_size(dt), all + off, E * pl[k].width);
        }
        if (!weights) attn__to_f32(ctx, dt, base + (size_t)p->offset * attn_dtype_size(dt), all + p->offset, p->numel);
    }
}

// Takes the call's workspace: core_size bytes for the pipeline (*core_ws) and, for an F16 / BF16
// module, the float32 copies, filled (parameters and inputs converted; for the backward, dout in
// place of out), with the spec and io pointed at them.
static attn_status mha_begin(attn_ctx *ctx, const attn_mha *m, mha_call *c, size_t core_size, void **core_ws,
                             stage_bufs *b) {
    attn__arena a = {0};
    attn__arena_take(&a, core_size);
    stage_layout(m, &c->z, &a, b);
    void *ws;
    ATTN_RETURN_IF_ERR(attn__workspace(ctx, a.used, &ws));
    a = (attn__arena){.base = ws};
    *core_ws = attn__arena_take(&a, core_size);
    stage_layout(m, &c->z, &a, b);
    const attn_dtype dt = m->cfg.dtype;
    if (dt == ATTN_DTYPE_F32) return ATTN_OK;
    const stage_sizes *z = &c->z;
    attn__mha_io *io = &c->io;
    if (z->backward) attn__to_f32(ctx, dt, m->params.storage, b->params, m->params.numel);
    else stage_forward_params(ctx, m, &c->io, b->params);
    const mha_views v = views_of(m, b->params);
    set_weights(&c->spec, &v);
    const proj_weights h = half_weights_of(ctx, m, NULL); // read in place where the products can
    c->spec.wq_t = h.w[PROJ_Q], c->spec.wk_t = h.w[PROJ_K], c->spec.wv_t = h.w[PROJ_V], c->spec.wo_t = h.w[PROJ_O];
    attn__to_f32(ctx, dt, io->query, b->query, z->query);
    if (b->key != b->query) attn__to_f32(ctx, dt, io->key, b->key, z->key);
    if (b->value != b->query && b->value != b->key) attn__to_f32(ctx, dt, io->value, b->value, z->value);
    if (z->backward) attn__to_f32(ctx, dt, io->out, b->out, z->out); // dout
    io->query = b->query, io->key = b->key, io->value = b->value, io->out = b->out, io->weights = b->weights;
    return ATTN_OK;
}

attn_status attn_mha_forward(attn_ctx *ctx, attn_mha *m, const attn_mha_args *args, void *out, void *weights) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    mha_call c;
    ATTN_RETURN_IF_ERR(mha_setup(ctx, m, args, out, weights, false, NULL, NULL, NULL, &c));
    void *ws;
    stage_bufs b;
    ATTN_RETURN_IF_ERR(mha_begin(ctx, m, &c, c.plan.ws_size, &ws, &b));
    attn__mha_core_run(ctx, &c.spec, &c.io, &c.plan, ws, NULL);
    if (b.out != NULL) attn__from_f32(ctx, m->cfg.dtype, b.out, out, c.z.out); // F16 / BF16: rounded once
    if (b.weights != NULL) attn__from_f32(ctx, m->cfg.dtype, b.weights, weights, c.z.weights);
    return ATTN_OK;
}

attn_status attn_mha_saved_size(attn_ctx *ctx, attn_mha *m, const attn_mha_args *args, size_t *bytes) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (bytes == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "mha_saved_size: bytes is NULL");
    mha_call c;
    float dummy;
    ATTN_RETURN_IF_ERR(mha_setup(ctx, m, args, &dummy, NULL, true, NULL, NULL, NULL, &c));
    *bytes = c.plan.saved_size;
    return ATTN_OK;
}

attn_status attn_mha_forward_train(attn_ctx *ctx, attn_mha *m, const attn_mha_args *args, void *out, void *weights,
                                   void *saved, size_t saved_size) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    mha_call c;
    ATTN_RETURN_IF_ERR(mha_setup(ctx, m, args, out, weights, false, NULL, NULL, NULL, &c));
    if (saved != NULL && (uintptr_t)saved % ATTN_SAVED_ALIGN != 0)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "mha_forward_train: saved must be %d-byte aligned (as malloc's are)",
                          ATTN_SAVED_ALIGN);
    if (saved == NULL || saved_size < c.plan.saved_size)
        return attn__fail(ctx, ATTN_ERR_WORKSPACE, "mha_forward_train: saved needs %zu bytes, got %zu",
                          c.plan.saved_size, saved == NULL ? (size_t)0 : saved_size);
    void *ws;
    stage_bufs b;
    ATTN_RETURN_IF_ERR(mha_begin(ctx, m, &c, c.plan.ws_size, &ws, &b));
    attn__mha_core_run(ctx, &c.spec, &c.io, &c.plan, ws, saved);
    if (b.out != NULL) attn__from_f32(ctx, m->cfg.dtype, b.out, out, c.z.out);
    if (b.weights != NULL) attn__from_f32(ctx, m->cfg.dtype, b.weights, weights, c.z.weights);
    return ATTN_OK;
}

attn_status attn_mha_backward(attn_ctx *ctx, attn_mha *m, const attn_mha_args *args, const void *saved,
                              size_t saved_size, const void *dout, void *dquery, void *dkey, void *dvalue,
                              float *const *dparams) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (dout == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "mha_backward: dout is NULL");
    mha_call c;
    ATTN_RETURN_IF_ERR(mha_setup(ctx, m, args, dout, NULL, true, dquery, dkey, dvalue, &c));
    if (saved != NULL && (uintptr_t)saved % ATTN_SAVED_ALIGN != 0)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "mha_backward: saved must be %d-byte aligned (as malloc's are)",
                          ATTN_SAVED_ALIGN);
    if (saved == NULL || saved_size < c.plan.saved_size || !attn__mha_saved_matches(&c.spec, &c.io, &c.plan, saved))
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG,
                          "mha_backward: saved does not hold the activations of a training forward with these args");
    const bool key_is_query = args->key == NULL || args->key == args->query;
    const bool value_is_other = args->value == NULL || args->value == c.io.key || args->value == args->query;
    if (key_is_query && dkey != NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "mha_backward: key is the query tensor: its gradient is in dquery");
    if (value_is_other && dvalue != NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG,
                          "mha_backward: value is the query or key tensor: its gradient is summed there");
    void *ws;
    stage_bufs b;
    ATTN_RETURN_IF_ERR(mha_begin(ctx, m, &c, c.plan.bwd_ws_size, &ws, &b));
    const bool staged = m->cfg.dtype != ATTN_DTYPE_F32;
    attn__mha_grads g = {0};
    g.dquery = staged ? b.dquery : dquery, g.dkey = staged ? b.dkey : dkey, g.dvalue = staged ? b.dvalue : dvalue;
    if (dparams != NULL) { // each parameter's gradient buffer, seen as the projections' (proj_places)
        proj_place pl[PROJS];
        proj_places(m, pl);
        float **dw[PROJS] = {&g.dwq, &g.dwk, &g.dwv, &g.dwo}, **db[PROJS] = {&g.dbq, &g.dbk, &g.dbv, &g.dbo};
        for (int k = 0; k < PROJS; k++) {
            float *gw = dparams[pl[k].w - m->params.items], *gb = pl[k].b != NULL ? dparams[pl[k].b - m->params.items] : NULL;
            *dw[k] = gw != NULL ? gw + pl[k].woff : NULL;
            *db[k] = gb != NULL ? gb + pl[k].boff : NULL;
        }
        const attn__param *bk = attn__params_find(&m->params, "bias_k"), *bv = attn__params_find(&m->params, "bias_v");
        if (bk != NULL) g.dbias_k = dparams[bk - m->params.items];
        if (bv != NULL) g.dbias_v = dparams[bv - m->params.items];
    }
    attn__mha_core_backward(ctx, &c.spec, &c.io, &c.plan, saved, c.io.out, &g, ws);
    if (b.dquery != NULL) attn__from_f32(ctx, m->cfg.dtype, b.dquery, dquery, c.z.query);
    if (b.dkey != NULL) attn__from_f32(ctx, m->cfg.dtype, b.dkey, dkey, c.z.key);
    if (b.dvalue != NULL) attn__from_f32(ctx, m->cfg.dtype, b.dvalue, dvalue, c.z.value);
    return ATTN_OK;
}

// ---- decoding with a KV cache ---------------------------------------------------------------

// One projection of attn_mha_forward_cached, y (rows, E; row stride ldy) = x (rows, E) W^T + b with
// W of type dt (proj_weights).
static void cached_project(attn_ctx *ctx, const float *x, int64_t rows, int64_t E, const void *w, attn_dtype dt,
                           const float *b, float *y, int64_t ldy, void *ws) {
    if (dt != ATTN_DTYPE_F32) attn__linear_half(ctx, x, rows, E, E, w, dt, b, E, y, ldy, ws);
    else attn__linear(ctx, x, rows, E, E, w, false, b, E, y, ldy, ws);
}

attn_status attn_mha_forward_cached(attn_ctx *ctx, attn_mha *m, attn_kv_cache *cache, const void *x, int64_t batch,
                                    int64_t len, void *out) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (m == NULL || cache == NULL || x == NULL || out == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "mha_cached: module, cache, x and out must not be NULL");
    const attn_mha_config *c = &m->cfg;
    const int64_t E = c->embed_dim, H = c->num_heads, Dh = E / H, N = batch;
    if (c->kdim != E || c->vdim != E || c->add_zero_attn || attn__params_find(&m->params, "bias_k") != NULL)
        return attn__fail(ctx, ATTN_ERR_UNSUPPORTED,
                          "mha_cached: needs kdim = vdim = embed_dim and no bias_k/bias_v or zero attention");
    if (N < 1 || len < 1)
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "mha_cached: batch (%lld) and len (%lld) must be >= 1",
                          (long long)N, (long long)len);
    const attn_kv_cache_config *kc = attn_kv_cache_get_config(cache);
    if (kc->batch != N || kc->n_kv_heads != H || kc->head_dim != Dh || kc->head_dim_v != Dh)
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE,
                          "mha_cached: the cache holds (batch %lld, %lld heads, dims %lld/%lld); this module needs "
                          "(%lld, %lld, %lld/%lld)",
                          (long long)kc->batch, (long long)kc->n_kv_heads, (long long)kc->head_dim,
                          (long long)kc->head_dim_v, (long long)N, (long long)H, (long long)Dh, (long long)Dh);
    const attn_dtype dt = c->dtype;
    if (dt != ATTN_DTYPE_F32 && attn__is_float_dtype(kc->dtype) && kc->dtype != ATTN_DTYPE_F32 && kc->dtype != dt)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG,
                          "mha_cached: a %s cache would round the %s module's keys and values again: use a cache of %s "
                          "(or F32, Q8_0, Q4_0)",
                          attn_dtype_name(kc->dtype), attn_dtype_name(dt), attn_dtype_name(dt));
    const int64_t length = attn_kv_cache_length(cache);
    if (len > kc->capacity - length)
        return attn__fail(ctx, ATTN_ERR_CAPACITY, "mha_cached: %lld tokens do not fit: %lld of the capacity %lld are used",
                          (long long)len, (long long)length, (long long)kc->capacity);
    int64_t rows, n3;
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "mha_cached: x", 2, (int64_t[]){N, len}, &rows));
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "mha_cached: projections", 3, (int64_t[]){rows, 4, E}, &n3));

    // Rows of x, qkv and the attention output in x's order: (len, N) or (N, len) with batch_first.
    // qkv (rows, 3E): q | k | v; head h is the column block [h*Dh, (h+1)*Dh) of each.
    const bool bf = c->batch_first != 0;
    const int64_t W3 = 3 * E;
    const int64_t qkv_s[4] = {bf ? len * W3 : W3, Dh, bf ? W3 : N * W3, 1};
    const int64_t ctx_s[4] = {bf ? len * E : E, Dh, bf ? E : N * E, 1};
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = N, d.n_heads = H, d.n_kv_heads = H, d.len_q = len, d.len_kv = length + len, d.head_dim = Dh;
    d.causal = ATTN_CAUSAL_BOTTOM_RIGHT, d.kv_dtype = kc->dtype;
    memcpy(d.q_stride, qkv_s, sizeof qkv_s);
    memcpy(d.o_stride, ctx_s, sizeof ctx_s);
    void *kstore, *vstore;
    attn_kv_cache_storage(cache, &kstore, d.k_stride, &vstore, d.v_stride);
    attn__sdpa_shape sh;
    attn_sdpa_desc run;
    ATTN_RETURN_IF_ERR(attn__sdpa_prepare(ctx, &d, &sh, &run));
    // A BF16 module with a BF16 cache attends on the bf16 dot products where the step's shape fits
    // them (a prompt; decoding steps stay float32), q then as bf16 rows of E (qh, ctx_s's layout)
    bool dot = false;
    if (dt == ATTN_DTYPE_BF16 && kc->dtype == ATTN_DTYPE_BF16) {
        attn_sdpa_desc dd = d;
        attn__sdpa_shape shd;
        attn_sdpa_desc rund;
        dd.q_dtype = ATTN_DTYPE_BF16;
        memcpy(dd.q_stride, ctx_s, sizeof ctx_s);
        ATTN_RETURN_IF_ERR(attn__sdpa_prepare(ctx, &dd, &shd, &rund));
        dot = attn__sdpa_dot_applies(ctx, &rund, &shd);
        if (dot) sh = shd, run = rund;
    }

    const size_t lin_ws = attn__linear_workspace(ctx, E), sdpa_ws = attn__sdpa_workspace(ctx, &sh, &run);
    // x and out of an F16 / BF16 module are staged as float32, x as the forward's query; its
    // parameters too, unless the few rows of a decoding step read them as they are (direct)
    const bool direct = dt != ATTN_DTYPE_F32 && attn__linear_half_applies(ctx, dt, rows, E);
    const stage_sizes z = {.query = rows * E, .out = rows * E, .no_params = direct};
    attn__arena a = {0};
    attn__arena_take(&a, (size_t)(rows * W3) * sizeof(float));
    attn__arena_take(&a, (size_t)(rows * E) * sizeof(float));
    attn__arena_take(&a, lin_ws > sdpa_ws ? lin_ws : sdpa_ws);
    attn__arena_take(&a, direct ? (size_t)(4 * E) * sizeof(float) : 0);
    attn__arena_take(&a, dot ? (size_t)(rows * E) * sizeof(uint16_t) : 0);
    stage_bufs b;
    stage_layout(m, &z, &a, &b);
    void *ws;
    ATTN_RETURN_IF_ERR(attn__workspace(ctx, a.used, &ws));
    a = (attn__arena){.base = ws};
    float *qkv = attn__arena_take(&a, (size_t)(rows * W3) * sizeof(float));
    float *att = attn__arena_take(&a, (size_t)(rows * E) * sizeof(float));
    void *scratch = attn__arena_take(&a, lin_ws > sdpa_ws ? lin_ws : sdpa_ws);
    float *bias = attn__arena_take(&a, direct ? (size_t)(4 * E) * sizeof(float) : 0);
    uint16_t *qh = attn__arena_take(&a, dot ? (size_t)(rows * E) * sizeof(uint16_t) : 0);
    stage_layout(m, &z, &a, &b);
    const float *xf = x;
    float *of = out;
    if (dt != ATTN_DTYPE_F32) {
        if (!direct) attn__to_f32(ctx, dt, m->params.storage, b.params, m->params.numel);
        attn__to_f32(ctx, dt, x, b.query, z.query);
        xf = b.query, of = b.out;
    }

    proj_weights h;
    if (direct) h = half_weights_of(ctx, m, bias);
    else {
        const mha_views v = views_of(m, dt == ATTN_DTYPE_F32 ? (const float *)m->params.storage : b.params);
        h = (proj_weights){.dt = ATTN_DTYPE_F32};
        for (int i = 0; i < PROJS; i++) h.w[i] = v.w[i], h.b[i] = v.b[i];
    }
    for (int i = PROJ_Q; i <= PROJ_V; i++) cached_project(ctx, xf, rows, E, h.w[i], h.dt, h.b[i], qkv + i * E, W3, scratch);
    attn__round_half(ctx, dt, qkv, rows * W3); // the projections are tensors of the module's type
    ATTN_RETURN_IF_ERR(attn_kv_cache_append(ctx, cache, len, qkv + E, qkv_s, qkv + 2 * E, qkv_s)); // fits: checked
    if (dot) // qkv's q rows hold bf16 values: exact
        for (int64_t r = 0; r < rows; r++) attn__from_f32(ctx, dt, qkv + r * W3, qh + r * E, E);
    attn__sdpa_run(ctx, &run, &sh, dot ? (const void *)qh : qkv, kstore, vstore, att, NULL, NULL, scratch);
    attn__round_half(ctx, dt, att, rows * E);
    cached_project(ctx, att, rows, E, h.w[PROJ_O], h.dt, h.b[PROJ_O], of, E, scratch);
    if (dt != ATTN_DTYPE_F32) attn__from_f32(ctx, dt, b.out, out, z.out);
    return ATTN_OK;
}

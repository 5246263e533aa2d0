// mha_state.c - builds an nn.MultiheadAttention module from a state_dict (e.g. a safetensors file):
// the module's options follow from which tensors are present and their shapes.
#include <stdio.h>
#include <string.h>

#include "mha_internal.h"

static const char *const known_names[] = {"in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
                                          "in_proj_bias",   "bias_k",        "bias_v",        "out_proj.weight",
                                          "out_proj.bias"};

static attn_status expect_shape(attn_ctx *ctx, const attn_tensor *t, attn_dtype dtype, int ndim, const int64_t *shape) {
    if (t->dtype != dtype)
        return attn__fail(ctx, ATTN_ERR_UNSUPPORTED, "state: %s has dtype %s, expected %s (as out_proj.weight)", t->name,
                          attn_dtype_name(t->dtype), attn_dtype_name(dtype));
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char want[96] = "", got[96] = "";
        for (int i = 0; i < ndim; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "", (long long)shape[i]);
        for (int i = 0; i < t->ndim && i < ATTN_MAX_DIMS; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "state: %s has shape (%s), expected (%s)", t->name, got, want);
    }
    return ATTN_OK;
}

attn_status attn_mha_create_from_state(attn_ctx *ctx, const attn_tensor_list *state, int64_t num_heads,
                                       const attn_mha_config *extra, attn_mha **out) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (state == NULL || out == NULL || (state->count > 0 && state->tensors == NULL))
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "mha_create_from_state: NULL argument");
    *out = NULL;
    for (int i = 0; i < state->count; i++) {
        const char *name = state->tensors[i].name;
        bool known = false;
        for (size_t j = 0; name != NULL && j < sizeof known_names / sizeof known_names[0]; j++)
            known = known || strcmp(name, known_names[j]) == 0;
        if (!known)
            return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "state: unexpected tensor '%s' for nn.MultiheadAttention",
                              name != NULL ? name : "(unnamed)");
    }
    const attn_tensor *wo = attn_tensor_list_find(state, "out_proj.weight");
    if (wo == NULL) return attn__fail(ctx, ATTN_ERR_NOT_FOUND, "state: out_proj.weight is missing");
    if (wo->ndim != 2 || wo->shape[0] < 1 || wo->shape[0] != wo->shape[1])
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "state: out_proj.weight must be square (E, E)");
    // Every tensor has out_proj.weight's type; the module's is cfg_extra->dtype when it is F16 or
    // BF16 (float32 tensors are then rounded to it), else the tensors'.
    const attn_dtype src_dt = wo->dtype;
    if (!attn__is_float_dtype(src_dt))
        return attn__fail(ctx, ATTN_ERR_UNSUPPORTED, "state: out_proj.weight has dtype %s; F32, F16 or BF16 expected",
                          attn_dtype_name(src_dt));
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, wo->shape[0], num_heads);
    cfg.dtype = src_dt;
    if (extra != NULL) {
        cfg.add_zero_attn = extra->add_zero_attn;
        cfg.batch_first = extra->batch_first;
        cfg.dropout = extra->dropout;
        if (extra->dtype != ATTN_DTYPE_F32 && !(extra->dtype == src_dt || (src_dt == ATTN_DTYPE_F32 && attn__is_float_dtype(extra->dtype))))
            return attn__fail(ctx, ATTN_ERR_INVALID_ARG,
                              "state: %s tensors cannot make a %s module (only F32 ones are rounded to F16 or BF16)",
                              attn_dtype_name(src_dt), attn_dtype_name(extra->dtype));
        if (extra->dtype != ATTN_DTYPE_F32) cfg.dtype = extra->dtype;
    }
    const attn_tensor *qw = attn_tensor_list_find(state, "q_proj_weight");
    const attn_tensor *kw = attn_tensor_list_find(state, "k_proj_weight");
    const attn_tensor *vw = attn_tensor_list_find(state, "v_proj_weight");
    const attn_tensor *inw = attn_tensor_list_find(state, "in_proj_weight");
    if (inw != NULL && (qw != NULL || kw != NULL || vw != NULL))
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "state: both in_proj_weight and q/k/v_proj_weight are present");
    if (inw == NULL && (qw == NULL || kw == NULL || vw == NULL))
        return attn__fail(ctx, ATTN_ERR_NOT_FOUND, "state: needs in_proj_weight or all of q/k/v_proj_weight");
    if (inw == NULL) {
        if (kw->ndim != 2 || vw->ndim != 2)
            return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "state: k_proj_weight and v_proj_weight must be 2-D");
        cfg.kdim = kw->shape[1];
        cfg.vdim = vw->shape[1];
    }
    const attn_tensor *bi = attn_tensor_list_find(state, "in_proj_bias");
    const attn_tensor *bo = attn_tensor_list_find(state, "out_proj.bias");
    if ((bi == NULL) != (bo == NULL))
        return attn__fail(ctx, ATTN_ERR_NOT_FOUND, "state: in_proj_bias and out_proj.bias must be both present or both absent");
    cfg.bias = bi != NULL;
    const attn_tensor *bk = attn_tensor_list_find(state, "bias_k"), *bv = attn_tensor_list_find(state, "bias_v");
    if ((bk == NULL) != (bv == NULL))
        return attn__fail(ctx, ATTN_ERR_NOT_FOUND, "state: bias_k and bias_v must be both present or both absent");
    cfg.add_bias_kv = bk != NULL;

    attn_mha *m;
    // Separate q/k/v_proj_weight are kept even when kdim == vdim == E (PyTorch itself would pack
    // them; the results are the same).
    ATTN_RETURN_IF_ERR(attn__mha_alloc(ctx, &cfg, inw == NULL, &m));
    // Every parameter of the module must come from the state with the module's shape.
    attn_status st = ATTN_OK;
    for (int i = 0; st == ATTN_OK && i < m->params.count; i++) {
        const attn__param *p = &m->params.items[i];
        const attn_tensor *t = attn_tensor_list_find(state, p->name);
        if (t == NULL) {
            st = attn__fail(ctx, ATTN_ERR_NOT_FOUND, "state: %s is missing", p->name);
            break;
        }
        st = expect_shape(ctx, t, src_dt, p->ndim, p->shape);
        if (st == ATTN_OK) st = attn_convert(cfg.dtype, p->data, src_dt, t->data, p->numel);
    }
    if (st != ATTN_OK) {
        attn_mha_free(m);
        return st;
    }
    *out = m;
    return ATTN_OK;
}

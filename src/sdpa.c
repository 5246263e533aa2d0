// sdpa.c - the public scaled dot-product attention entry points: validate, size the scratch,
// pick the kernel for the context, run.
#include <math.h>
#include <string.h>

#include "cpu/flash.h"
#include "dropout.h"
#include "internal.h"

void attn_sdpa_desc_init(attn_sdpa_desc *desc) {
    if (desc != NULL) memset(desc, 0, sizeof *desc);
}

attn_status attn_layout_strides(attn_layout layout, int64_t B, int64_t H, int64_t L, int64_t D, int64_t stride[4]) {
    if (stride == NULL || B < 1 || H < 1 || L < 1 || D < 1) return ATTN_ERR_INVALID_ARG;
    int64_t HD, LHD, BHD, HLD;
    if (!attn__mul_i64(H, D, &HD) || !attn__mul_i64(L, HD, &LHD) || !attn__mul_i64(B, HD, &BHD) ||
        !attn__mul_i64(L, D, &HLD) || !attn__mul_i64(HLD, H, &HLD))
        return ATTN_ERR_OVERFLOW;
    switch (layout) {
    case ATTN_LAYOUT_BHLD: // (B, H, L, D)
        stride[0] = HLD, stride[1] = L * D, stride[2] = D, stride[3] = 1;
        return ATTN_OK;
    case ATTN_LAYOUT_BLHD: // (B, L, H*D)
        stride[0] = LHD, stride[1] = D, stride[2] = HD, stride[3] = 1;
        return ATTN_OK;
    case ATTN_LAYOUT_LBHD: // (L, B, H*D)
        stride[0] = HD, stride[1] = D, stride[2] = BHD, stride[3] = 1;
        return ATTN_OK;
    }
    return ATTN_ERR_INVALID_ARG;
}

// Strides >= 0 whose largest offset, in elements and in bytes of up to 4 per element (every type a
// view may hold; block types take less), fits int64_t: a larger view cannot lie in memory, and the
// kernels form byte sizes and offsets from it (the backward zeroes dmask over its extent's bytes).
static attn_status check_view(attn_ctx *ctx, const char *what, const int64_t n[4], const int64_t s[4]) {
    for (int i = 0; i < 4; i++)
        if (s[i] < 0)
            return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "%s: stride[%d] = %lld is negative", what, i, (long long)s[i]);
    int64_t extent;
    if (!attn__view_extent(n, s, &extent))
        return attn__fail(ctx, ATTN_ERR_OVERFLOW, "%s: the offsets reached by the strides overflow", what);
    if (extent >= INT64_MAX / 4)
        return attn__fail(ctx, ATTN_ERR_OVERFLOW, "%s: the bytes reached by the strides (offset %lld) overflow", what,
                          (long long)extent);
    return ATTN_OK;
}

static attn_status check_mask_dtype(attn_ctx *ctx, const char *what, attn_dtype dt) {
    if (dt != ATTN_DTYPE_BOOL && dt != ATTN_DTYPE_F32)
        return attn__fail(ctx, ATTN_ERR_BAD_MASK, "%s must be BOOL or F32, not %s", what, attn_dtype_name(dt));
    return ATTN_OK;
}

attn_status attn__sdpa_check(attn_ctx *ctx, const attn_sdpa_desc *d, attn__sdpa_shape *sh) {
    sh->B = d->batch, sh->H = d->n_heads, sh->L = d->len_q, sh->S = d->len_kv, sh->D = d->head_dim;
    sh->Hkv = d->n_kv_heads == 0 ? d->n_heads : d->n_kv_heads;
    sh->Dv = d->head_dim_v == 0 ? d->head_dim : d->head_dim_v;
    sh->seq0 = 0;
    const struct {
        const char *name;
        int64_t value;
    } sizes[] = {{"batch", sh->B},  {"n_heads", sh->H}, {"n_kv_heads", sh->Hkv}, {"len_q", sh->L},
                 {"len_kv", sh->S}, {"head_dim", sh->D}, {"head_dim_v", sh->Dv}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].value < 1)
            return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "sdpa: %s = %lld must be >= 1", sizes[i].name,
                              (long long)sizes[i].value);
    if (sh->H % sh->Hkv != 0)
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "sdpa: n_heads (%lld) is not a multiple of n_kv_heads (%lld)",
                          (long long)sh->H, (long long)sh->Hkv);
    sh->group = sh->H / sh->Hkv;
    if (!isfinite(d->scale)) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa: scale must be finite");
    sh->scale = d->scale != 0.0f ? d->scale : (float)(1.0 / sqrt((double)sh->D));
    if (d->causal != ATTN_CAUSAL_NONE && d->causal != ATTN_CAUSAL_TOP_LEFT && d->causal != ATTN_CAUSAL_BOTTOM_RIGHT)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa: unknown causal mode %d", (int)d->causal);
    if (!(d->dropout_p >= 0.0 && d->dropout_p <= 1.0))
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa: dropout_p = %g must be in [0, 1]", d->dropout_p);
    if (d->dropout_rng != ATTN_DROPOUT_RNG_CONTEXT && d->dropout_rng != ATTN_DROPOUT_RNG_PHILOX)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa: unknown dropout_rng %d", (int)d->dropout_rng);
    if (d->dropout_rng == ATTN_DROPOUT_RNG_PHILOX && d->dropout_p > 0.0 &&
        (sh->L > ((int64_t)1 << 32) || sh->S > ((int64_t)1 << 34) || sh->B > ((int64_t)1 << 32) / sh->H))
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE,
                          "sdpa: Philox dropout counts queries, keys and batch * heads in 32 bits (len_q <= 2^32, "
                          "len_kv <= 2^34, batch * n_heads <= 2^32)");
    if (d->weights_mode != ATTN_WEIGHTS_NONE && d->weights_mode != ATTN_WEIGHTS_PER_HEAD &&
        d->weights_mode != ATTN_WEIGHTS_AVERAGE)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa: unknown weights_mode %d", (int)d->weights_mode);
    if (d->use_window && (d->window_left < -1 || d->window_right < -1))
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa: window sizes (%lld, %lld) must be >= 0, or -1 for unbounded",
                          (long long)d->window_left, (long long)d->window_right);
    if (!(d->softcap >= 0.0f) || isinf(d->softcap))
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa: softcap must be 0 (none) or a finite positive value");
    const struct {
        const char *name;
        attn_dtype dtype;
    } types[] = {{"kv_dtype", d->kv_dtype}, {"q_dtype", d->q_dtype}, {"out_dtype", d->out_dtype},
                 {"grad_dtype", d->grad_dtype}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!attn__is_float_dtype(types[i].dtype) && !(i == 0 && attn__is_block_dtype(d->kv_dtype)))
            return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa: %s must be F32, F16 or BF16%s, not %s", types[i].name,
                              i == 0 ? " (or Q8_0, Q4_0)" : "", attn_dtype_name(types[i].dtype));
    if (attn__is_block_dtype(d->kv_dtype)) ATTN_RETURN_IF_ERR(attn__check_block_kv(ctx, d, sh));

    const int64_t nq[4] = {sh->B, sh->H, sh->L, sh->D}, nk[4] = {sh->B, sh->Hkv, sh->S, sh->D};
    const int64_t nv[4] = {sh->B, sh->Hkv, sh->S, sh->Dv}, no[4] = {sh->B, sh->H, sh->L, sh->Dv};
    ATTN_RETURN_IF_ERR(check_view(ctx, "sdpa: q", nq, d->q_stride));
    ATTN_RETURN_IF_ERR(check_view(ctx, "sdpa: k", nk, d->k_stride));
    ATTN_RETURN_IF_ERR(check_view(ctx, "sdpa: v", nv, d->v_stride));
    ATTN_RETURN_IF_ERR(check_view(ctx, "sdpa: out", no, d->o_stride));
    for (int i = 0; i < 4; i++)
        if (no[i] > 1 && d->o_stride[i] == 0)
            return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa: out stride[%d] is 0, rows would overwrite each other", i);
    if (d->mask != NULL) {
        ATTN_RETURN_IF_ERR(check_mask_dtype(ctx, "sdpa: mask", d->mask_dtype));
        const int64_t nm[4] = {sh->B, sh->H, sh->L, sh->S};
        ATTN_RETURN_IF_ERR(check_view(ctx, "sdpa: mask", nm, d->mask_stride));
    }
    if (d->key_padding_mask != NULL) {
        ATTN_RETURN_IF_ERR(check_mask_dtype(ctx, "sdpa: key_padding_mask", d->key_padding_mask_dtype));
        const int64_t nm[4] = {sh->B, sh->S, 1, 1};
        const int64_t sm[4] = {d->key_padding_mask_stride[0], d->key_padding_mask_stride[1], 0, 0};
        ATTN_RETURN_IF_ERR(check_view(ctx, "sdpa: key_padding_mask", nm, sm));
    }
    // Sizes of the contiguous optional outputs and of the scratch must fit in size_t.
    int64_t n;
    const int64_t dims[4] = {sh->B, sh->H, sh->L, sh->S};
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "sdpa: weights", 4, dims, &n));
    size_t bytes;
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "sdpa: weights", n, sizeof(float), &bytes));
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "sdpa: scores", sh->S, 2 * sizeof(double), &bytes));
    // the kernels' tiles hold up to 256 rows of q and of out (D + Dv floats each)
    int64_t dims_sum;
    if (!attn__add_i64(sh->D, sh->Dv, &dims_sum))
        return attn__fail(ctx, ATTN_ERR_OVERFLOW, "sdpa: head_dim + head_dim_v overflows");
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "sdpa: tiles", dims_sum, 256 * sizeof(float), &bytes));
    return ATTN_OK;
}

attn_status attn_sdpa_desc_check(attn_ctx *ctx, const attn_sdpa_desc *desc) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (desc == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa: desc is NULL");
    attn__sdpa_shape sh;
    return attn__sdpa_check(ctx, desc, &sh);
}

// The descriptor the kernels run: the caller's, with the strides of length-1 dimensions set to 0.
// Such a stride is never needed to reach an element, and any value is accepted there, but the
// kernels step their pointers by it after the last row: a huge one would overflow the pointer.
attn_status attn__sdpa_prepare(attn_ctx *ctx, const attn_sdpa_desc *desc, attn__sdpa_shape *sh, attn_sdpa_desc *run) {
    ATTN_RETURN_IF_ERR(attn__sdpa_check(ctx, desc, sh));
    *run = *desc;
    const int64_t nq[4] = {sh->B, sh->H, sh->L, sh->D}, nk[4] = {sh->B, sh->Hkv, sh->S, sh->D};
    const int64_t nv[4] = {sh->B, sh->Hkv, sh->S, sh->Dv}, no[4] = {sh->B, sh->H, sh->L, sh->Dv};
    const int64_t nm[4] = {sh->B, sh->H, sh->L, sh->S};
    for (int i = 0; i < 4; i++) {
        if (nq[i] == 1) run->q_stride[i] = 0;
        if (nk[i] == 1) run->k_stride[i] = 0;
        if (nv[i] == 1) run->v_stride[i] = 0;
        if (no[i] == 1) run->o_stride[i] = 0;
        if (nm[i] == 1) run->mask_stride[i] = 0;
    }
    if (sh->B == 1) run->key_padding_mask_stride[0] = 0;
    if (sh->S == 1) run->key_padding_mask_stride[1] = 0;
    return ATTN_OK;
}

// The fused kernels serve every call that does not ask for the attention weights.
static bool use_flash(const attn_ctx *ctx, const attn_sdpa_desc *d) {
    return ctx->kernels != NULL && d->weights_mode == ATTN_WEIGHTS_NONE;
}

bool attn__sdpa_dot_applies(const attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh) {
    return ctx->kernels != NULL && attn__fwd_dot_applies(ctx->kernels, d, sh);
}

size_t attn__sdpa_workspace(const attn_ctx *ctx, const attn__sdpa_shape *sh, const attn_sdpa_desc *d) {
    return use_flash(ctx, d) ? attn__flash_fwd_workspace(ctx, sh, d) : attn__sdpa_ref_workspace(sh);
}

void attn__sdpa_run(attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh, const void *q,
                    const void *k, const void *v, void *out, float *lse, float *weights, void *ws) {
    if (use_flash(ctx, d))
        attn__flash_fwd(ctx, d, sh, q, k, v, out, lse, ws);
    else
        attn__sdpa_fwd_ref(d, sh, &ctx->gen, q, k, v, out, lse, weights, ws);
}

attn_status attn_sdpa_fwd_workspace_size(const attn_ctx *ctx, const attn_sdpa_desc *desc, size_t *bytes) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn_ctx *mctx = (attn_ctx *)ctx; // only the error message is written
    attn__clear_error(mctx);
    if (desc == NULL || bytes == NULL)
        return attn__fail(mctx, ATTN_ERR_INVALID_ARG, "sdpa_fwd_workspace_size: desc and bytes must not be NULL");
    attn__sdpa_shape sh;
    attn_sdpa_desc run;
    ATTN_RETURN_IF_ERR(attn__sdpa_prepare(mctx, desc, &sh, &run));
    *bytes = attn__sdpa_workspace(ctx, &sh, &run) + ATTN_ALIGN - 1; // room to align any buffer
    return ATTN_OK;
}

attn_status attn_sdpa_fwd(attn_ctx *ctx, const attn_sdpa_desc *desc, const void *q, const void *k, const void *v,
                          void *out, float *lse, float *weights) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (desc == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa: desc is NULL");
    if (q == NULL || k == NULL || v == NULL || out == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa: q, k, v and out must not be NULL");
    if ((desc->weights_mode != ATTN_WEIGHTS_NONE) != (weights != NULL))
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG,
                          "sdpa: weights must be given exactly when weights_mode is not ATTN_WEIGHTS_NONE");
    attn__sdpa_shape sh;
    attn_sdpa_desc run;
    ATTN_RETURN_IF_ERR(attn__sdpa_prepare(ctx, desc, &sh, &run));
    void *ws;
    ATTN_RETURN_IF_ERR(attn__workspace(ctx, attn__sdpa_workspace(ctx, &sh, &run), &ws));
    attn__sdpa_run(ctx, &run, &sh, q, k, v, out, lse, weights, ws);
    return ATTN_OK;
}

// ---- backward ---------------------------------------------------------------------------------

attn_status attn__sdpa_bwd_check(attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh, bool want_dmask) {
    const int64_t nq[4] = {sh->B, sh->H, sh->L, sh->D}, nk[4] = {sh->B, sh->Hkv, sh->S, sh->D};
    const int64_t nv[4] = {sh->B, sh->Hkv, sh->S, sh->Dv};
    const struct {
        const char *name;
        const int64_t *n, *s;
    } grads[3] = {{"dq", nq, d->q_stride}, {"dk", nk, d->k_stride}, {"dv", nv, d->v_stride}};
    for (int g = 0; g < 3; g++)
        for (int i = 0; i < 4; i++)
            if (grads[g].n[i] > 1 && grads[g].s[i] == 0)
                return attn__fail(ctx, ATTN_ERR_INVALID_ARG,
                                  "sdpa_bwd: %s would be written at stride 0 on dimension %d (a broadcast input)",
                                  grads[g].name, i);
    if (attn__is_block_dtype(d->kv_dtype))
        return attn__fail(ctx, ATTN_ERR_UNSUPPORTED, "sdpa_bwd: k and v of type %s are for the forward only",
                          attn_dtype_name(d->kv_dtype));
    if (want_dmask && (d->mask == NULL || d->mask_dtype != ATTN_DTYPE_F32))
        return attn__fail(ctx, ATTN_ERR_BAD_MASK, "sdpa_bwd: dmask needs an F32 attention mask");
    // the reference keeps double accumulators for every key and value element
    int64_t n;
    size_t bytes;
    const int64_t dk_dims[4] = {sh->B, sh->Hkv, sh->S, sh->D + sh->Dv};
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "sdpa_bwd: key and value gradients", 4, dk_dims, &n));
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "sdpa_bwd: key and value gradients", n, 2 * sizeof(double), &bytes));
    return ATTN_OK;
}

size_t attn__sdpa_bwd_workspace(const attn_ctx *ctx, const attn__sdpa_shape *sh, const attn_sdpa_desc *d,
                                bool want_dmask) {
    return ctx->kernels != NULL ? attn__flash_bwd_workspace(ctx, sh, d, want_dmask)
                                : attn__sdpa_bwd_ref_workspace(d, sh, want_dmask);
}

void attn__sdpa_bwd_run(attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh,
                        const attn_generator *dropout_state, const void *q, const void *k, const void *v,
                        const void *out, const void *dout, const float *lse, void *dq, void *dk, void *dv,
                        float *dmask, void *ws) {
    if (ctx->kernels != NULL)
        attn__flash_bwd(ctx, d, sh, dropout_state, q, k, v, out, dout, lse, dq, dk, dv, dmask, ws);
    else
        attn__sdpa_bwd_ref(d, sh, dropout_state, q, k, v, dout, dq, dk, dv, dmask, ws);
}

static attn_status bwd_prepare(attn_ctx *ctx, const attn_sdpa_desc *desc, bool want_dmask, attn__sdpa_shape *sh,
                               attn_sdpa_desc *run, size_t *bytes) {
    ATTN_RETURN_IF_ERR(attn__sdpa_prepare(ctx, desc, sh, run));
    ATTN_RETURN_IF_ERR(attn__sdpa_bwd_check(ctx, desc, sh, want_dmask));
    *bytes = attn__sdpa_bwd_workspace(ctx, sh, run, want_dmask);
    return ATTN_OK;
}

attn_status attn_sdpa_bwd_workspace_size(const attn_ctx *ctx, const attn_sdpa_desc *desc, int dmask_wanted,
                                         size_t *bytes) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn_ctx *mctx = (attn_ctx *)ctx; // only the error message is written
    attn__clear_error(mctx);
    if (desc == NULL || bytes == NULL)
        return attn__fail(mctx, ATTN_ERR_INVALID_ARG, "sdpa_bwd_workspace_size: desc and bytes must not be NULL");
    attn__sdpa_shape sh;
    attn_sdpa_desc run;
    ATTN_RETURN_IF_ERR(bwd_prepare(mctx, desc, dmask_wanted != 0, &sh, &run, bytes));
    *bytes += ATTN_ALIGN - 1; // room to align any buffer
    return ATTN_OK;
}

attn_status attn_sdpa_bwd(attn_ctx *ctx, const attn_sdpa_desc *desc, const void *q, const void *k, const void *v,
                          const void *out, const void *dout, const float *lse, const attn_generator *dropout_state,
                          void *dq, void *dk, void *dv, float *dmask) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (desc == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa_bwd: desc is NULL");
    if (q == NULL || k == NULL || v == NULL || out == NULL || dout == NULL || lse == NULL || dq == NULL ||
        dk == NULL || dv == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa_bwd: q, k, v, out, dout, lse, dq, dk and dv must not be NULL");
    if (attn__dropout_needs_state(desc) && dropout_state == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa_bwd: dropout needs the generator state of the forward");
    attn__sdpa_shape sh;
    size_t bytes;
    attn_sdpa_desc run;
    ATTN_RETURN_IF_ERR(bwd_prepare(ctx, desc, dmask != NULL, &sh, &run, &bytes));
    void *ws;
    ATTN_RETURN_IF_ERR(attn__workspace(ctx, bytes, &ws));
    attn__sdpa_bwd_run(ctx, &run, &sh, dropout_state, q, k, v, out, dout, lse, dq, dk, dv, dmask, ws);
    return ATTN_OK;
}

// mha_core.c - the multi-head attention pipeline shared by every module (see mha_core.h).
//
// Buffers (in the workspace, or for a training forward partly in the caller's `saved` buffer):
//   qb (N, L, E), kb (N, S', E), vb (N, S', E)   projections, batch-major
//   cb (N, L, E)                                 merged heads, when there is an out_proj or when
//                                                training (the backward needs the attention output)
//   lse (N, H, L)                                the attention's log-sum-exp (training)
//   qh, kh, vh (as qb, kb, vb; bf16)             q, k, v for an attention on bf16 dot products
//   masks widened to S' columns                  only when extra keys exist and a mask is given
// Heads are column blocks of width hd = E / H, so SDPA reads them in place through strides.
//
// The backward follows the forward in reverse: out_proj (dWo = sum dY^T C, dC = dY Wo), the
// attention backward (dropout regenerated from the saved generator state), bias_k/bias_v (the
// gradients of the appended key rows), and the input projections (dW = sum dP^T X, dX = dP W); a
// tensor used as several of query/key/value gets the sum of those paths.
//
// A spec of dtype F16 or BF16 rounds the projections q, k, v (before q's scaling) and the heads'
// output to the type, as torch's bfloat16 / float16 modules hold them; the buffers stay float32, so
// SDPA and the products read the type's values exactly as they would read the type. The backward
// keeps its gradients in float32 (the rounding is the identity there, as in autograd). Projections
// read the weights in the spec's type where attn__linear_half can (few rows, or BF16 on bf16 dot
// products), and a BF16 spec's attention runs on the bf16 dot products when it fits them
// (plan->dot: qh, kh, vh, the scale in the kernel; the float32 copies kept only for the backward).
#include <math.h>
#include <string.h>

#include "cpu/cpu.h"
#include "half.h"
#include "mha_core.h"

// Layout of the workspace and of the saved activations; with NULL bases it only measures.
typedef struct core_bufs {
    attn_generator *gen;      // saved: the generator before the attention (training)
    float *qb, *kb, *vb, *cb, *lse;
    uint16_t *qh, *kh, *vh;   // plan->dot: q, k, v as bf16 for the attention
    void *mask, *kpm;
    void *sdpa_ws;
    void *linear_ws;
} core_bufs;

#define SAVED_MAGIC 0x6174746e6d686131ull // identifies a saved-activations buffer

typedef struct saved_header {
    uint64_t magic;
    int64_t N, L, S2, E, H, dtype;
} saved_header;

// The widened masks of a pass (forward and backward each widen their own): the causal mask as
// bool (L, S2), or the attention mask padded to S2 columns, and the padded key padding mask; NULL
// where the plan needs none.
static void take_masks(const attn__mha_spec *spec, const attn__mha_io *io, const attn__mha_plan *plan, attn__arena *a,
                       void **mask, void **kpm) {
    const size_t N = (size_t)io->N, L = (size_t)io->L, S2 = (size_t)plan->S2;
    *mask = NULL;
    if (plan->causal_mask) {
        *mask = attn__arena_take(a, L * S2);
    } else if (plan->pad_mask) {
        const size_t rows = io->attn_mask_ndim == 3 ? N * (size_t)spec->H : 1;
        *mask = attn__arena_take(a, rows * L * S2 * attn_dtype_size(io->attn_mask_dtype));
    }
    *kpm = plan->pad_kpm ? attn__arena_take(a, N * S2 * attn_dtype_size(io->kpm_dtype)) : NULL;
}

static void core_layout(const attn__mha_spec *spec, const attn__mha_io *io, const attn__mha_plan *plan,
                        attn__arena *a, attn__arena *sv, core_bufs *b) {
    const size_t E = (size_t)spec->E, N = (size_t)io->N, L = (size_t)io->L, S2 = (size_t)plan->S2;
    const size_t f = sizeof(float);
    attn__arena *keep = sv != NULL ? sv : a; // what the backward reads lives in `saved` when training
    if (sv != NULL) {
        attn__arena_take(sv, sizeof(saved_header));
        b->gen = attn__arena_take(sv, sizeof(attn_generator));
    } else {
        b->gen = NULL;
    }
    b->qb = attn__arena_take(keep, N * L * E * f);
    b->kb = attn__arena_take(keep, N * S2 * E * f);
    b->vb = attn__arena_take(keep, N * S2 * E * f);
    b->cb = spec->wo != NULL || sv != NULL ? attn__arena_take(keep, N * L * E * f) : NULL;
    b->lse = sv != NULL ? attn__arena_take(sv, N * (size_t)spec->H * L * f) : NULL;
    const size_t h = plan->dot ? sizeof(uint16_t) : 0;
    b->qh = attn__arena_take(a, N * L * E * h);
    b->kh = attn__arena_take(a, N * S2 * E * h);
    b->vh = attn__arena_take(a, N * S2 * E * h);
    take_masks(spec, io, plan, a, &b->mask, &b->kpm);
    b->sdpa_ws = attn__arena_take(a, plan->sdpa_ws_size);
    b->linear_ws = attn__arena_take(a, plan->linear_ws_size);
}

// Backward scratch: gradients of the attention's output and inputs, the widened masks again.
typedef struct bwd_bufs {
    float *dcb, *dqb, *dkb, *dvb;
    void *mask, *kpm;
    void *sdpa_ws, *mm_ws;
} bwd_bufs;

static void bwd_layout(const attn__mha_spec *spec, const attn__mha_io *io, const attn__mha_plan *plan, attn__arena *a,
                       bwd_bufs *b) {
    const size_t E = (size_t)spec->E, N = (size_t)io->N, L = (size_t)io->L, S2 = (size_t)plan->S2;
    const size_t f = sizeof(float);
    b->dcb = attn__arena_take(a, N * L * E * f);
    b->dqb = attn__arena_take(a, N * L * E * f);
    b->dkb = attn__arena_take(a, N * S2 * E * f);
    b->dvb = attn__arena_take(a, N * S2 * E * f);
    take_masks(spec, io, plan, a, &b->mask, &b->kpm);
    b->sdpa_ws = attn__arena_take(a, plan->sdpa_bwd_ws_size);
    b->mm_ws = attn__arena_take(a, plan->matmul_ws_size);
}

// The attention's descriptor on bf16 copies of q, k and v (plan->dot), from d.
static attn_sdpa_desc dot_desc(attn_sdpa_desc d, float scale) {
    d.q_dtype = d.kv_dtype = ATTN_DTYPE_BF16;
    d.scale = scale;
    return d;
}

attn_status attn__mha_core_plan(attn_ctx *ctx, const attn__mha_spec *spec, const attn__mha_io *io,
                                attn__mha_plan *plan) {
    memset(plan, 0, sizeof *plan);
    const int64_t extra = (spec->bias_k != NULL ? 1 : 0) + (spec->add_zero_attn ? 1 : 0);
    if (__builtin_add_overflow(io->S, extra, &plan->S2))
        return attn__fail(ctx, ATTN_ERR_OVERFLOW, "mha: %lld keys plus %lld added keys overflow", (long long)io->S,
                          (long long)extra);
    plan->hd = spec->E / spec->H;
    // Every offset into the caller's tensors and every buffer size must be representable before
    // anything is read or allocated.
    const struct {
        const char *name;
        int64_t rows, bs, rs, width;
    } views[4] = {{"query", io->L, io->q_bs, io->q_rs, spec->dq},
                  {"key", io->S, io->k_bs, io->k_rs, spec->dk},
                  {"value", io->S, io->v_bs, io->v_rs, spec->dv},
                  {"output", io->L, io->o_bs, io->o_rs, spec->E}};
    for (int i = 0; i < 4; i++) {
        const int64_t vn[4] = {io->N, views[i].rows, views[i].width, 1};
        const int64_t vs[4] = {views[i].bs, views[i].rs, 1, 0};
        int64_t extent;
        if (!attn__view_extent(vn, vs, &extent))
            return attn__fail(ctx, ATTN_ERR_OVERFLOW, "%s: the offsets of (%lld, %lld, %lld) overflow", views[i].name,
                              (long long)io->N, (long long)views[i].rows, (long long)views[i].width);
    }
    int64_t n;
    const int64_t qdims[3] = {io->N, io->L, spec->E}, kdims[3] = {io->N, plan->S2, spec->E};
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "query projection", 3, qdims, &n));
    size_t bytes;
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "query projection", n, 4 * sizeof(float), &bytes));
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "key projection", 3, kdims, &n));
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "key projection", n, 4 * sizeof(float), &bytes));
    const bool widen = extra > 0;
    plan->causal_mask = io->causal && widen;
    plan->pad_mask = io->attn_mask != NULL && widen;
    plan->pad_kpm = io->key_padding_mask != NULL && widen;
    const int64_t mdims[4] = {io->N, spec->H, io->L, plan->S2};
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "attention mask", 4, mdims, &n));
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "attention mask", n, sizeof(float), &bytes));

    attn_sdpa_desc *d = &plan->sd;
    attn_sdpa_desc_init(d);
    const int64_t E = spec->E, hd = plan->hd, L = io->L, S2 = plan->S2;
    d->batch = io->N, d->n_heads = spec->H, d->len_q = L, d->len_kv = S2, d->head_dim = hd;
    // qb (N, L, E) and kb, vb (N, S', E): heads are column blocks.
    d->q_stride[0] = L * E, d->q_stride[1] = hd, d->q_stride[2] = E, d->q_stride[3] = 1;
    d->k_stride[0] = S2 * E, d->k_stride[1] = hd, d->k_stride[2] = E, d->k_stride[3] = 1;
    memcpy(d->v_stride, d->k_stride, sizeof d->k_stride);
    if (spec->wo != NULL) {
        memcpy(d->o_stride, d->q_stride, sizeof d->q_stride);
    } else {
        d->o_stride[0] = io->o_bs, d->o_stride[1] = hd, d->o_stride[2] = io->o_rs, d->o_stride[3] = 1;
    }
    d->scale = spec->prescale_q ? 1.0f : (float)(1.0 / sqrt((double)hd));
    d->causal = io->causal && !widen ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
    const int64_t mS = widen ? S2 : io->S; // row length of the mask SDPA reads
    if (plan->causal_mask) {
        d->mask_dtype = ATTN_DTYPE_BOOL;
        d->mask_stride[0] = 0, d->mask_stride[1] = 0, d->mask_stride[2] = S2, d->mask_stride[3] = 1;
    } else if (io->attn_mask != NULL) {
        d->mask_dtype = io->attn_mask_dtype;
        if (io->attn_mask_ndim == 3) { // (N*H, L, S): index n*H + h
            d->mask_stride[0] = spec->H * L * mS, d->mask_stride[1] = L * mS;
        } else { // (L, S) broadcast
            d->mask_stride[0] = 0, d->mask_stride[1] = 0;
        }
        d->mask_stride[2] = mS, d->mask_stride[3] = 1;
    }
    if (io->key_padding_mask != NULL) {
        d->key_padding_mask_dtype = io->kpm_dtype;
        d->key_padding_mask_stride[0] = widen ? S2 : io->kpm_bs;
        d->key_padding_mask_stride[1] = 1;
    }
    d->dropout_p = io->training ? spec->dropout : 0.0;
    d->weights_mode = io->weights_mode;
    // Placeholders so the check sees non-NULL masks where they will exist.
    d->mask = (io->attn_mask != NULL || plan->causal_mask) ? (const void *)plan : NULL;
    d->key_padding_mask = io->key_padding_mask != NULL ? (const void *)plan : NULL;
    if (spec->dtype != ATTN_DTYPE_F32 && spec->wo == NULL) // the heads' output is rounded in cb
        return attn__fail(ctx, ATTN_ERR_UNSUPPORTED, "mha: a %s pipeline needs an output projection",
                          attn_dtype_name(spec->dtype));
    ATTN_RETURN_IF_ERR(attn__sdpa_check(ctx, d, &plan->sh));
    d->mask = NULL;
    d->key_padding_mask = NULL;
    plan->sdpa_ws_size = attn__sdpa_workspace(ctx, &plan->sh, d);
    d->mask = (io->attn_mask != NULL || plan->causal_mask) ? (const void *)plan : NULL;
    // A BF16 pipeline whose attention fits the bf16 dot products runs it there: on bf16 copies of
    // q, k and v, with q's division by sqrt(hd) left to the kernel's scale (the same scores for head
    // dims that are powers of 4), its weights rounded to bf16 before P V (attn.h).
    if (spec->dtype == ATTN_DTYPE_BF16 && d->weights_mode == ATTN_WEIGHTS_NONE) {
        const float div = (float)sqrt((double)plan->hd); // q's division (attn__mha_core_run)
        attn_sdpa_desc dd = dot_desc(*d, spec->prescale_q ? 1.0f / div : d->scale);
        dd.key_padding_mask = io->key_padding_mask != NULL ? (const void *)plan : NULL;
        ATTN_RETURN_IF_ERR(attn__sdpa_check(ctx, &dd, &plan->sh_dot));
        plan->dot = attn__sdpa_dot_applies(ctx, &dd, &plan->sh_dot);
        if (plan->dot) {
            plan->dot_scale = dd.scale;
            dd.mask = dd.key_padding_mask = NULL;
            const size_t w = attn__sdpa_workspace(ctx, &plan->sh_dot, &dd);
            if (w > plan->sdpa_ws_size) plan->sdpa_ws_size = w;
        }
    }
    ATTN_RETURN_IF_ERR(attn__sdpa_bwd_check(ctx, d, &plan->sh, false));
    d->mask = NULL;
    int64_t widest = spec->dq > spec->dk ? spec->dq : spec->dk;
    widest = widest > spec->dv ? widest : spec->dv;
    widest = widest > spec->E ? widest : spec->E;
    plan->linear_ws_size = attn__linear_workspace(ctx, widest);

    attn__arena a = {0}, sv = {0};
    core_bufs b;
    core_layout(spec, io, plan, &a, NULL, &b);
    plan->ws_size = a.used;
    a = (attn__arena){0};
    core_layout(spec, io, plan, &a, &sv, &b);
    plan->saved_size = sv.used;
    // the backward: the attention's backward and the products of the projections
    plan->sdpa_bwd_ws_size = attn__sdpa_bwd_workspace(ctx, &plan->sh, d, false);
    plan->matmul_ws_size = attn__matmul_workspace(ctx, widest);
    a = (attn__arena){0};
    bwd_bufs bb;
    bwd_layout(spec, io, plan, &a, &bb);
    plan->bwd_ws_size = a.used;
    return ATTN_OK;
}

// Copies an (rows, L, S) mask into (rows, L, S2) with zero/False in the new columns.
static void widen_mask(const void *src, void *dst, size_t elem, int64_t rows, int64_t L, int64_t S, int64_t S2) {
    for (int64_t r = 0; r < rows * L; r++) {
        char *out = (char *)dst + (size_t)(r * S2) * elem;
        memcpy(out, (const char *)src + (size_t)(r * S) * elem, (size_t)S * elem);
        memset(out + (size_t)S * elem, 0, (size_t)(S2 - S) * elem);
    }
}

// Fills the SDPA descriptor's mask pointers, widening the masks into the buffers when needed.
static void set_masks(const attn__mha_spec *spec, const attn__mha_io *io, const attn__mha_plan *plan, void *mask_buf,
                      void *kpm_buf, attn_sdpa_desc *d) {
    const int64_t N = io->N, L = io->L, S = io->S, S2 = plan->S2;
    if (plan->causal_mask) {
        uint8_t *m = mask_buf;
        for (int64_t i = 0; i < L; i++)
            for (int64_t j = 0; j < S2; j++) m[i * S2 + j] = (uint8_t)(j > i && j < S);
        d->mask = m;
    } else if (plan->pad_mask) {
        int64_t rows = io->attn_mask_ndim == 3 ? N * spec->H : 1;
        widen_mask(io->attn_mask, mask_buf, attn_dtype_size(io->attn_mask_dtype), rows, L, S, S2);
        d->mask = mask_buf;
    } else {
        d->mask = io->attn_mask;
    }
    if (plan->pad_kpm) {
        size_t elem = attn_dtype_size(io->kpm_dtype);
        for (int64_t n = 0; n < N; n++)
            widen_mask((const char *)io->key_padding_mask + (size_t)(n * io->kpm_bs) * elem,
                       (char *)kpm_buf + (size_t)(n * S2) * elem, elem, 1, 1, S, S2);
        d->key_padding_mask = kpm_buf;
    } else {
        d->key_padding_mask = io->key_padding_mask;
    }
}

// y (rows, E; row stride ldy) = x (rows, d; row stride ldx) W^T + b: with the weights in the spec's
// type (Wt) where those can be read in place, else with the float32 ones.
static void project(attn_ctx *ctx, const attn__mha_spec *spec, const float *x, int64_t rows, int64_t d, int64_t ldx,
                    const float *W, bool w_in_out, const void *Wt, const float *b, float *y, int64_t ldy, void *ws) {
    if (Wt != NULL && attn__linear_half_applies(ctx, spec->dtype, rows, d))
        attn__linear_half(ctx, x, rows, d, ldx, Wt, spec->dtype, b, spec->E, y, ldy, ws);
    else
        attn__linear(ctx, x, rows, d, ldx, W, w_in_out, b, spec->E, y, ldy, ws);
}

void attn__mha_core_run(attn_ctx *ctx, const attn__mha_spec *spec, const attn__mha_io *io,
                        const attn__mha_plan *plan, void *ws, void *saved) {
    const int64_t N = io->N, L = io->L, S = io->S, S2 = plan->S2, E = spec->E;
    attn__arena a = {.base = ws}, sv = {.base = saved};
    core_bufs b;
    core_layout(spec, io, plan, &a, saved != NULL ? &sv : NULL, &b);
    // the float32 q, k, v feed the attention, or only the backward when it runs on bf16 copies
    const bool keep_float = !plan->dot || saved != NULL;

    // 1. projections, one sequence at a time: qb[n] = query[n] Wq^T + bq, etc.
    for (int64_t n = 0; n < N; n++) {
        project(ctx, spec, io->query + n * io->q_bs, L, spec->dq, io->q_rs, spec->wq, spec->w_in_out, spec->wq_t, spec->bq,
                b.qb + n * L * E, E, b.linear_ws);
        project(ctx, spec, io->key + n * io->k_bs, S, spec->dk, io->k_rs, spec->wk, spec->w_in_out, spec->wk_t, spec->bk,
                b.kb + n * S2 * E, E, b.linear_ws);
        project(ctx, spec, io->value + n * io->v_bs, S, spec->dv, io->v_rs, spec->wv, spec->w_in_out, spec->wv_t, spec->bv,
                b.vb + n * S2 * E, E, b.linear_ws);
        // 2. extra key positions: bias_k/bias_v, then the zero key/value
        int64_t s = S;
        if (spec->bias_k != NULL) {
            memcpy(b.kb + (n * S2 + s) * E, spec->bias_k, (size_t)E * sizeof(float));
            memcpy(b.vb + (n * S2 + s) * E, spec->bias_v, (size_t)E * sizeof(float));
            s++;
        }
        if (spec->add_zero_attn) {
            memset(b.kb + (n * S2 + s) * E, 0, (size_t)E * sizeof(float));
            memset(b.vb + (n * S2 + s) * E, 0, (size_t)E * sizeof(float));
        }
        // the projections of a low-precision module are tensors of its type (bias_k, bias_v are)
        if (keep_float) {
            attn__round_half(ctx, spec->dtype, b.qb + n * L * E, L * E);
            attn__round_half(ctx, spec->dtype, b.kb + n * S2 * E, S * E);
            attn__round_half(ctx, spec->dtype, b.vb + n * S2 * E, S * E);
        }
    }
    // q, k, v rounded to bf16 for the attention on dot products (the values of the kept copies)
    if (plan->dot) {
        attn__round_bf16_any(ctx->kernels, b.qb, N * L * E, b.qh);
        attn__round_bf16_any(ctx->kernels, b.kb, N * S2 * E, b.kh);
        attn__round_bf16_any(ctx->kernels, b.vb, N * S2 * E, b.vh);
    }
    // 3. nn.MultiheadAttention scales q before the product: a float32 division by float(sqrt(hd))
    if (spec->prescale_q && keep_float) {
        const float div = (float)sqrt((double)plan->hd);
        for (int64_t i = 0; i < N * L * E; i++) b.qb[i] /= div;
    }
    // 4. masks, widened to the extra keys (which no mask hides)
    attn_sdpa_desc d = plan->sd;
    set_masks(spec, io, plan, b.mask, b.kpm, &d);
    // 5. attention over all heads at once (into cb when it feeds out_proj or the backward)
    if (b.gen != NULL) {
        saved_header hdr = {SAVED_MAGIC, N, L, S2, E, spec->H, spec->dtype};
        memcpy(saved, &hdr, sizeof hdr);
        *b.gen = ctx->gen; // the dropout mask is regenerated from this state in the backward
    }
    if (plan->dot) { // cb exists: a BF16 spec has an output projection
        attn_sdpa_desc dc = dot_desc(d, plan->dot_scale);
        memcpy(dc.o_stride, plan->sd.q_stride, sizeof dc.o_stride);
        attn__sdpa_run(ctx, &dc, &plan->sh_dot, b.qh, b.kh, b.vh, b.cb, b.lse, NULL, b.sdpa_ws);
    } else if (b.cb != NULL) {
        attn_sdpa_desc dc = d;
        memcpy(dc.o_stride, plan->sd.q_stride, sizeof dc.o_stride); // cb is (N, L, E) like qb
        attn__sdpa_run(ctx, &dc, &plan->sh, b.qb, b.kb, b.vb, b.cb, b.lse, io->weights, b.sdpa_ws);
    } else {
        attn__sdpa_run(ctx, &d, &plan->sh, b.qb, b.kb, b.vb, io->out, NULL, io->weights, b.sdpa_ws);
    }
    if (b.cb != NULL) attn__round_half(ctx, spec->dtype, b.cb, N * L * E); // the heads' output, of the type
    // 6. output projection of the concatenated heads, or the heads themselves
    for (int64_t n = 0; n < N && b.cb != NULL; n++) {
        if (spec->wo != NULL) {
            project(ctx, spec, b.cb + n * L * E, L, E, E, spec->wo, false, spec->wo_t, spec->bo, io->out + n * io->o_bs,
                    io->o_rs, b.linear_ws);
        } else {
            for (int64_t r = 0; r < L; r++)
                memcpy(io->out + n * io->o_bs + r * io->o_rs, b.cb + (n * L + r) * E, (size_t)E * sizeof(float));
        }
    }
}

bool attn__mha_saved_matches(const attn__mha_spec *spec, const attn__mha_io *io, const attn__mha_plan *plan,
                             const void *saved) {
    saved_header hdr;
    memcpy(&hdr, saved, sizeof hdr);
    return hdr.magic == SAVED_MAGIC && hdr.N == io->N && hdr.L == io->L && hdr.S2 == plan->S2 && hdr.E == spec->E &&
           hdr.H == spec->H && hdr.dtype == spec->dtype;
}

// Gradient of one input projection: P = X W^T + b (or X W + b), given dP for every sequence.
//   dW (+)= sum_n dP_n^T X_n, db (+)= column sums of dP, dX_n (+)= dP_n W
static void projection_backward(attn_ctx *ctx, const attn__mha_spec *spec, const attn__mha_io *io, const float *dp,
                                int64_t dp_bs, int64_t rows, const float *x, int64_t x_bs, int64_t x_rs, int64_t din,
                                const float *W, float *dW, float *db, float *dx, bool dx_accumulate, void *mm_ws) {
    const int64_t E = spec->E, N = io->N;
    for (int64_t n = 0; n < N; n++) {
        const float *dpn = dp + n * dp_bs, *xn = x + n * x_bs;
        if (dW != NULL) {
            if (spec->w_in_out) // W (din, E): dW = X^T dP
                attn__matmul(ctx, din, E, rows, xn, 1, x_rs, dpn, E, 1, dW, E, n > 0, mm_ws);
            else // W (E, din): dW = dP^T X
                attn__matmul(ctx, E, din, rows, dpn, 1, E, xn, x_rs, 1, dW, din, n > 0, mm_ws);
        }
        if (dx != NULL) { // dX = dP W (W read as (E, din)) or dP W^T for (din, E)
            if (spec->w_in_out)
                attn__matmul(ctx, rows, din, E, dpn, E, 1, W, 1, E, dx + n * x_bs, x_rs, dx_accumulate, mm_ws);
            else
                attn__matmul(ctx, rows, din, E, dpn, E, 1, W, din, 1, dx + n * x_bs, x_rs, dx_accumulate, mm_ws);
        }
    }
    if (db != NULL)
        for (int64_t e = 0; e < E; e++) {
            double acc = 0.0;
            for (int64_t n = 0; n < N; n++)
                for (int64_t r = 0; r < rows; r++) acc += dp[n * dp_bs + r * E + e];
            db[e] = (float)acc;
        }
}

void attn__mha_core_backward(attn_ctx *ctx, const attn__mha_spec *spec, const attn__mha_io *io,
                             const attn__mha_plan *plan, const void *saved, const float *dout,
                             const attn__mha_grads *g, void *ws) {
    const int64_t N = io->N, L = io->L, S = io->S, S2 = plan->S2, E = spec->E;
    attn__arena a = {0}, sv = {.base = (char *)(uintptr_t)saved};
    core_bufs b;
    core_layout(spec, io, plan, &a, &sv, &b); // the saved activations (a only measures)
    attn__arena wa = {.base = ws};
    bwd_bufs w;
    bwd_layout(spec, io, plan, &wa, &w);

    // 1. out_proj: dC = dY Wo, dWo = sum dY^T C, dbo = sum dY; without it dC = dY
    for (int64_t n = 0; n < N; n++) {
        const float *dy = dout + n * io->o_bs;
        if (spec->wo != NULL) {
            attn__matmul(ctx, L, E, E, dy, io->o_rs, 1, spec->wo, E, 1, w.dcb + n * L * E, E, false, w.mm_ws);
            if (g->dwo != NULL) attn__matmul(ctx, E, E, L, dy, 1, io->o_rs, b.cb + n * L * E, E, 1, g->dwo, E, n > 0, w.mm_ws);
        } else {
            for (int64_t r = 0; r < L; r++) memcpy(w.dcb + (n * L + r) * E, dy + r * io->o_rs, (size_t)E * sizeof(float));
        }
    }
    if (spec->wo != NULL && g->dbo != NULL)
        for (int64_t e = 0; e < E; e++) {
            double acc = 0.0;
            for (int64_t n = 0; n < N; n++)
                for (int64_t r = 0; r < L; r++) acc += dout[n * io->o_bs + r * io->o_rs + e];
            g->dbo[e] = (float)acc;
        }
    // 2. the attention (q was pre-divided by sqrt(hd) when prescale_q: its gradient is divided too)
    attn_sdpa_desc d = plan->sd;
    set_masks(spec, io, plan, w.mask, w.kpm, &d);
    memcpy(d.o_stride, plan->sd.q_stride, sizeof d.o_stride);
    d.weights_mode = ATTN_WEIGHTS_NONE;
    attn__sdpa_bwd_run(ctx, &d, &plan->sh, b.gen, b.qb, b.kb, b.vb, b.cb, w.dcb, b.lse, w.dqb, w.dkb, w.dvb, NULL,
                       w.sdpa_ws);
    if (spec->prescale_q) {
        const float div = (float)sqrt((double)plan->hd);
        for (int64_t i = 0; i < N * L * E; i++) w.dqb[i] /= div;
    }
    // 3. bias_k / bias_v: the appended key and value rows (the zero key has no parameter)
    if (spec->bias_k != NULL)
        for (int64_t e = 0; e < E; e++) {
            double ak = 0.0, av = 0.0;
            for (int64_t n = 0; n < N; n++) ak += w.dkb[(n * S2 + S) * E + e], av += w.dvb[(n * S2 + S) * E + e];
            if (g->dbias_k != NULL) g->dbias_k[e] = (float)ak;
            if (g->dbias_v != NULL) g->dbias_v[e] = (float)av;
        }
    // 4. the input projections; a tensor used twice or three times accumulates its gradients
    float *dq_dst = g->dquery;
    float *dk_dst = io->key == io->query ? g->dquery : g->dkey;
    float *dv_dst = io->value == io->key ? dk_dst : io->value == io->query ? g->dquery : g->dvalue;
    projection_backward(ctx, spec, io, w.dqb, L * E, L, io->query, io->q_bs, io->q_rs, spec->dq, spec->wq, g->dwq,
                        g->dbq, dq_dst, g->add_to_inputs, w.mm_ws);
    projection_backward(ctx, spec, io, w.dkb, S2 * E, S, io->key, io->k_bs, io->k_rs, spec->dk, spec->wk, g->dwk,
                        g->dbk, dk_dst, g->add_to_inputs || dk_dst == dq_dst, w.mm_ws);
    projection_backward(ctx, spec, io, w.dvb, S2 * E, S, io->value, io->v_bs, io->v_rs, spec->dv, spec->wv, g->dwv,
                        g->dbv, dv_dst, g->add_to_inputs || dv_dst == dq_dst || dv_dst == dk_dst, w.mm_ws);
}

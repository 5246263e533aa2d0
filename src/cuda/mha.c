// mha.c - nn.MultiheadAttention on the GPU (attn_cuda.h): the parameters of a libattn module copied
// to the device, projections on cuBLASLt (gemm.c), attention through attn_cuda_sdpa_fwd/bwd, bias
// gradients by column sums (kernels/colsum.cu), the added keys and widened masks by
// kernels/mha_rows.cu.
//
// The heads are column blocks of the projections, so the attention reads them in place through the
// descriptor's strides: a projection buffer of `ld` elements per row, rows in the input's order
// ((L, N) or, batch_first, (N, L)), is the (N, H, T, hd) view {ld, hd, N ld, 1} or {T ld, hd, ld, 1}.
// Self-attention (query, key and value the same tensor) projects once into an (M, 3E) buffer; with
// key = value k and v share one (M, 2E) product; otherwise (and always with separate q/k/v weights,
// kdim or vdim other than E, or added keys) each has its own.
//
// Added keys (add_bias_kv: bias_k/bias_v; add_zero_attn: a zero key and value, after them) make the
// key and value buffers S' = S + 1 or S + 2 tokens long: in (L, N) order the projection fills tokens
// 0 .. S - 1 and the added tokens follow; with batch_first each sequence's S rows are projected into
// a staging region first and copied to rows b S' .. b S' + S - 1. The masks are widened to S' columns
// (the added keys visible; causal becomes a bool (L, S') mask), as the CPU module does.
//
// Buffers of a call, in this order, each on a 256-byte boundary: the projections (q, k, v regions),
// the attention's output (Mq, E), the staging region and the widened masks when there are added
// keys, and for training the attention's log-sum-exp (N, H, L) float32. The training
// forward writes them into the caller's `saved`; the inference forward into the module's scratch,
// which the backward also uses for d(attention output) and the projections' gradients.
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "gemm.h"
#include "launch.h"

#define MHA_MAX_PARAMS 8

struct attn_cuda_mha {
    attn_mha_config cfg;
    int64_t E, H, hd, kdim, vdim;
    int64_t extra; // keys added after the inputs' (bias_k, the zero key): 0, 1 or 2
    attn_dtype dt;
    int n_params;
    const char *names[MHA_MAX_PARAMS]; // the host module's names (static strings of libattn)
    int ndim[MHA_MAX_PARAMS];
    int64_t shape[MHA_MAX_PARAMS][3];
    void *data[MHA_MAX_PARAMS];        // device copies
    int i_w_in, i_b_in, i_w_out, i_b_out; // indices of in_proj_weight/bias, out_proj.weight/bias (-1: none)
    int i_w[3];                           // q_proj_weight, k_proj_weight, v_proj_weight (-1: packed)
    int i_bias_kv[3];                     // [1] bias_k, [2] bias_v (-1: none; [0] unused)
    attn__cuda_blas *blas;
    void *scratch;
    size_t scratch_size;
    cudaStream_t scratch_stream;
    attn_cuda_allocator mem; // the creating context's hooks, and its stream then (the parameters')
    cudaStream_t mem_stream;
};

// ---- the module -----------------------------------------------------------------------------------

void attn_cuda_mha_free(attn_cuda_mha *m) {
    if (m == NULL) return;
    for (int i = 0; i < m->n_params; i++) attn__cuda_mem_free(&m->mem, m->data[i], m->mem_stream, false);
    attn__cuda_mem_free(&m->mem, m->scratch, m->scratch_stream, true);
    attn__cuda_blas_close(m->blas);
    free(m);
}

static int find_param(const attn_cuda_mha *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->names[i], name) == 0) return i;
    return -1;
}

attn_status attn_cuda_mha_create(attn_cuda_ctx *ctx, attn_mha *host, attn_cuda_mha **out) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__cuda_err *e = &ctx->err;
    if (out == NULL || host == NULL) return attn__cuda_fail(e, ATTN_ERR_INVALID_ARG, "cuda mha: host and mha must not be NULL");
    *out = NULL;
    const attn_mha_config *cfg = attn_mha_get_config(host);
    const int n = attn_mha_param_count(host);
    if (n > MHA_MAX_PARAMS) return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED, "cuda mha: %d parameters", n);
    attn_cuda_mha *m = calloc(1, sizeof *m);
    if (m == NULL) return attn__cuda_fail(e, ATTN_ERR_OUT_OF_MEMORY, "cuda mha: out of host memory");
    m->cfg = *cfg, m->E = cfg->embed_dim, m->H = cfg->num_heads, m->hd = cfg->embed_dim / cfg->num_heads;
    m->kdim = cfg->kdim, m->vdim = cfg->vdim, m->extra = (cfg->add_bias_kv ? 1 : 0) + (cfg->add_zero_attn ? 1 : 0);
    m->dt = cfg->dtype, m->mem = ctx->mem, m->mem_stream = ctx->stream;
    attn_status st = ATTN_OK;
    for (int i = 0; i < n && st == ATTN_OK; i++) {
        attn_dtype pdt;
        void *src;
        st = attn_mha_param_typed_at(host, i, &m->names[i], &m->ndim[i], m->shape[i], &pdt, &src);
        if (st != ATTN_OK) break;
        int64_t numel = 1;
        for (int d = 0; d < m->ndim[i]; d++) numel *= m->shape[i][d];
        const size_t bytes = (size_t)numel * attn_dtype_size(pdt);
        cudaError_t err = (cudaError_t)attn__cuda_mem_alloc(&m->mem, &m->data[i], bytes, m->mem_stream, false);
        if (err == cudaSuccess) err = cudaMemcpy(m->data[i], src, bytes, cudaMemcpyHostToDevice);
        m->n_params = i + 1;
        if (err == cudaErrorMemoryAllocation)
            st = attn__cuda_fail(e, ATTN_ERR_OUT_OF_MEMORY, "cuda mha: %zu bytes for %s cannot be had", bytes, m->names[i]);
        else if (err != cudaSuccess)
            st = attn__cuda_device_fail(e, err, "cuda mha: copying the parameters");
    }
    if (st == ATTN_OK) st = attn__cuda_blas_open(e, &m->blas);
    if (st != ATTN_OK) {
        attn_cuda_mha_free(m);
        return st;
    }
    m->i_w_in = find_param(m, "in_proj_weight"), m->i_b_in = find_param(m, "in_proj_bias");
    m->i_w_out = find_param(m, "out_proj.weight"), m->i_b_out = find_param(m, "out_proj.bias");
    m->i_w[0] = find_param(m, "q_proj_weight"), m->i_w[1] = find_param(m, "k_proj_weight");
    m->i_w[2] = find_param(m, "v_proj_weight");
    m->i_bias_kv[0] = -1, m->i_bias_kv[1] = find_param(m, "bias_k"), m->i_bias_kv[2] = find_param(m, "bias_v");
    *out = m;
    return ATTN_OK;
}

attn_status attn_cuda_mha_param(attn_cuda_mha *m, const char *name, int *ndim, int64_t shape[3], attn_dtype *dtype,
                                void **data) {
    if (m == NULL || name == NULL) return ATTN_ERR_INVALID_ARG;
    const int i = find_param(m, name);
    if (i < 0) return ATTN_ERR_NOT_FOUND;
    if (ndim != NULL) *ndim = m->ndim[i];
    if (shape != NULL) memcpy(shape, m->shape[i], sizeof m->shape[i]);
    if (dtype != NULL) *dtype = m->dt;
    if (data != NULL) *data = m->data[i];
    return ATTN_OK;
}

attn_status attn_cuda_mha_to_host(attn_cuda_ctx *ctx, const attn_cuda_mha *m, attn_mha *host) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (m == NULL || host == NULL) return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda mha: NULL module");
    if (attn_mha_param_count(host) != m->n_params || attn_mha_get_config(host)->dtype != m->dt)
        return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda mha: the host module is not this module's kind");
    for (int i = 0; i < m->n_params; i++) {
        int ndim;
        int64_t shape[3];
        void *dst;
        ATTN__CU_TRY(attn_mha_param_typed_at(host, i, NULL, &ndim, shape, NULL, &dst));
        int64_t numel = 1;
        for (int d = 0; d < ndim; d++) numel *= shape[d];
        const cudaError_t err = cudaMemcpyAsync(dst, m->data[i], (size_t)numel * attn_dtype_size(m->dt),
                                                cudaMemcpyDeviceToHost, ctx->stream);
        if (err != cudaSuccess) return attn__cuda_device_fail(&ctx->err, err, "cuda mha: copying the parameters back");
    }
    const cudaError_t err = cudaStreamSynchronize(ctx->stream);
    if (err != cudaSuccess) return attn__cuda_device_fail(&ctx->err, err, "cuda mha: copying the parameters back");
    return ATTN_OK;
}

void attn_cuda_mha_args_init(attn_cuda_mha_args *args) {
    if (args == NULL) return;
    memset(args, 0, sizeof *args);
    attn_mha_args_init(&args->base);
    args->base.need_weights = 0; // the GPU writes no weights
}

// ---- one call's shapes and buffers ----------------------------------------------------------------

typedef struct region {
    size_t off; // bytes from the buffer's start
    int64_t ld; // elements per row
} region;

typedef struct call {
    int64_t N, L, S, S2, Mq, Mkv;    // S2: the key and value buffers' tokens (S plus the added keys)
    const void *x_q, *x_k, *x_v;     // the inputs (device)
    bool self, kv_same;              // query = key = value; key = value (one product for them)
    bool token_major;                // buffers in (T, N) token order (not batch_first, or N = 1)
    bool staged;                     // added keys and (N, T) order: k and v projected via stage_off
    region q, k, v, attn;            // projections and the attention's output
    size_t stage_off, mask_off, kpm_off; // with added keys: staging (batch_first), widened masks
    size_t lse_off, bytes, bytes_train;
} call;

// A call's device tensors (NULL ones skipped), checked as the SDPA entry points check theirs: a host
// pointer the GPU cannot read is refused before any product reads it.
static attn_status check_ptrs(attn_cuda_ctx *ctx, int n, const void *const p[], const char *const what[]) {
    for (int i = 0; i < n; i++) ATTN__CU_TRY(attn__cuda_check_device_ptr(ctx, p[i], what[i]));
    return ATTN_OK;
}

static attn_status plan_call(attn_cuda_ctx *ctx, const attn_cuda_mha *m, const attn_cuda_mha_args *args, call *c) {
    attn__cuda_err *e = &ctx->err;
    if (m == NULL || args == NULL) return attn__cuda_fail(e, ATTN_ERR_INVALID_ARG, "cuda mha: mha and args must not be NULL");
    const attn_mha_args *a = &args->base;
    if (a->query == NULL) return attn__cuda_fail(e, ATTN_ERR_INVALID_ARG, "cuda mha: query must not be NULL");
    if (a->need_weights)
        return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED, "cuda mha: the attention weights are CPU-only (need_weights = 0)");
    if (a->causal && a->attn_mask != NULL)
        return attn__cuda_fail(e, ATTN_ERR_INVALID_ARG, "cuda mha: causal and attn_mask are exclusive");
    if (a->attn_mask != NULL && a->attn_mask_ndim != 2 && a->attn_mask_ndim != 3)
        return attn__cuda_fail(e, ATTN_ERR_BAD_MASK, "cuda mha: attn_mask_ndim must be 2 or 3");
    const void *const in[] = {a->query, a->key, a->value, a->attn_mask, a->key_padding_mask};
    static const char *const in_names[] = {"cuda mha: query", "cuda mha: key", "cuda mha: value", "cuda mha: attn_mask",
                                           "cuda mha: key_padding_mask"};
    ATTN__CU_TRY(check_ptrs(ctx, 5, in, in_names));
    memset(c, 0, sizeof *c);
    c->N = a->unbatched ? 1 : a->batch, c->L = a->len_q;
    c->x_q = a->query, c->x_k = a->key != NULL ? a->key : a->query;
    c->x_v = a->value != NULL ? a->value : c->x_k;
    c->S = a->key != NULL ? a->len_kv : c->L;
    if (c->N < 1 || c->L < 1 || c->S < 1)
        return attn__cuda_fail(e, ATTN_ERR_BAD_SHAPE, "cuda mha: batch %lld, len_q %lld, len_kv %lld must be >= 1",
                               (long long)c->N, (long long)c->L, (long long)c->S);
    if ((c->x_k == c->x_q || c->x_v == c->x_q) && c->S != c->L)
        return attn__cuda_fail(e, ATTN_ERR_BAD_SHAPE, "cuda mha: len_kv must be len_q when key or value is query");
    if ((c->x_k == c->x_q && m->kdim != m->E) || (c->x_v == c->x_q && m->vdim != m->E) ||
        (c->x_v == c->x_k && m->vdim != m->kdim))
        return attn__cuda_fail(e, ATTN_ERR_BAD_SHAPE,
                               "cuda mha: one tensor passed as inputs of widths %lld (query), %lld (key), %lld (value)",
                               (long long)m->E, (long long)m->kdim, (long long)m->vdim);
    const bool fuse = m->i_w_in >= 0 && m->extra == 0; // the packed weight and no added keys
    c->self = fuse && c->x_k == c->x_q && c->x_v == c->x_q;
    c->kv_same = fuse && !c->self && c->x_k == c->x_v;
    c->token_major = !m->cfg.batch_first || c->N == 1;
    c->staged = m->extra > 0 && !c->token_major;
    const int64_t E = m->E;
    int64_t rows, elems, widest = E > m->kdim ? E : m->kdim;
    widest = widest > m->vdim ? widest : m->vdim;
    if (__builtin_add_overflow(c->S, m->extra, &c->S2) ||
        __builtin_mul_overflow(c->N, c->L > c->S2 ? c->L : c->S2, &rows) ||
        __builtin_mul_overflow(rows, 5 * widest, &elems) || elems > INT64_MAX / 8 ||
        __builtin_mul_overflow(c->N, m->H, &elems) || __builtin_mul_overflow(elems, c->L, &elems) ||
        __builtin_mul_overflow(elems, c->S2, &elems) || elems > INT64_MAX / 8)
        return attn__cuda_fail(e, ATTN_ERR_OVERFLOW, "cuda mha: the buffers' sizes overflow");
    c->Mq = c->N * c->L, c->Mkv = c->N * c->S;
    const size_t es = attn_dtype_size(m->dt);
    size_t used = 0;
    if (c->self) {
        c->q.off = attn__cuda_ws_take(&used, (size_t)(c->Mq * 3 * E) * es), c->q.ld = c->k.ld = c->v.ld = 3 * E;
        c->k.off = c->q.off + (size_t)E * es, c->v.off = c->q.off + (size_t)(2 * E) * es;
    } else {
        c->q.off = attn__cuda_ws_take(&used, (size_t)(c->Mq * E) * es), c->q.ld = E;
        if (c->kv_same) {
            c->k.off = attn__cuda_ws_take(&used, (size_t)(c->Mkv * 2 * E) * es), c->k.ld = c->v.ld = 2 * E;
            c->v.off = c->k.off + (size_t)E * es;
        } else {
            c->k.off = attn__cuda_ws_take(&used, (size_t)(c->N * c->S2 * E) * es), c->k.ld = E;
            c->v.off = attn__cuda_ws_take(&used, (size_t)(c->N * c->S2 * E) * es), c->v.ld = E;
        }
    }
    c->attn.off = attn__cuda_ws_take(&used, (size_t)(c->Mq * E) * es), c->attn.ld = E;
    if (m->extra > 0) {
        if (c->staged) c->stage_off = attn__cuda_ws_take(&used, (size_t)(c->Mkv * E) * es);
        if (a->causal) c->mask_off = attn__cuda_ws_take(&used, (size_t)(c->L * c->S2));
        const int64_t mask_rows = a->attn_mask_ndim == 3 ? c->N * m->H * c->L : c->L;
        if (a->attn_mask != NULL)
            c->mask_off = attn__cuda_ws_take(&used, (size_t)(mask_rows * c->S2) * attn_dtype_size(a->attn_mask_dtype));
        if (a->key_padding_mask != NULL)
            c->kpm_off = attn__cuda_ws_take(&used, (size_t)(c->N * c->S2) * attn_dtype_size(a->key_padding_mask_dtype));
    }
    c->bytes = used;
    c->lse_off = attn__cuda_ws_take(&used, (size_t)(c->N * m->H * c->L) * sizeof(float));
    c->bytes_train = used;
    return ATTN_OK;
}

// The buffer row of token t of sequence 0, and the rows between one sequence's token and the next's.
static int64_t token_row(const call *c, int64_t t, int64_t *step) {
    *step = c->token_major ? 1 : c->S2;
    return c->token_major ? t * c->N : t;
}

// The (N, H, T, hd) strides of a region whose rows hold T tokens of every batch entry.
static void head_strides(const attn_cuda_mha *m, const call *c, const region *r, int64_t T, int64_t st[4]) {
    if (m->cfg.batch_first) st[0] = T * r->ld, st[1] = m->hd, st[2] = r->ld, st[3] = 1;
    else st[0] = r->ld, st[1] = m->hd, st[2] = c->N * r->ld, st[3] = 1;
}

// The attention's descriptor; `base` holds the widened masks (call c's layout) when keys are added.
static void describe(const attn_cuda_mha *m, const attn_cuda_mha_args *args, const call *c, const unsigned char *base,
                     attn_sdpa_desc *d) {
    const attn_mha_args *a = &args->base;
    const bool widen = m->extra > 0;
    attn_sdpa_desc_init(d);
    d->batch = c->N, d->n_heads = m->H, d->len_q = c->L, d->len_kv = c->S2, d->head_dim = m->hd;
    head_strides(m, c, &c->q, c->L, d->q_stride);
    head_strides(m, c, &c->k, c->S2, d->k_stride);
    head_strides(m, c, &c->v, c->S2, d->v_stride);
    head_strides(m, c, &c->attn, c->L, d->o_stride);
    d->q_dtype = d->kv_dtype = d->out_dtype = d->grad_dtype = m->dt;
    d->causal = a->causal && !widen ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
    const int64_t mS = widen ? c->S2 : c->S; // the row length of the mask the attention reads
    if (a->causal && widen) { // the added keys stay visible: a bool (L, S') mask
        d->mask = base + c->mask_off, d->mask_dtype = ATTN_DTYPE_BOOL;
        d->mask_stride[0] = 0, d->mask_stride[1] = 0, d->mask_stride[2] = mS, d->mask_stride[3] = 1;
    } else if (a->attn_mask != NULL) {
        d->mask = widen ? (const void *)(base + c->mask_off) : a->attn_mask, d->mask_dtype = a->attn_mask_dtype;
        const int64_t LS = c->L * mS;
        if (a->attn_mask_ndim == 2) d->mask_stride[0] = 0, d->mask_stride[1] = 0;
        else d->mask_stride[0] = m->H * LS, d->mask_stride[1] = LS;
        d->mask_stride[2] = mS, d->mask_stride[3] = 1;
    }
    if (a->key_padding_mask != NULL) {
        d->key_padding_mask = widen ? (const void *)(base + c->kpm_off) : a->key_padding_mask;
        d->key_padding_mask_dtype = a->key_padding_mask_dtype;
        d->key_padding_mask_stride[0] = a->unbatched ? 0 : mS, d->key_padding_mask_stride[1] = 1;
    }
    if (a->training && m->cfg.dropout > 0.0) {
        d->dropout_p = m->cfg.dropout, d->dropout_rng = ATTN_DROPOUT_RNG_PHILOX;
        d->dropout_seed = args->dropout_seed, d->dropout_offset = args->dropout_offset;
    }
}

// The masks widened to the added keys into `base` (call c's layout); nothing without added keys.
static attn_status widen_masks(attn_cuda_ctx *ctx, const attn_cuda_mha *m, const attn_cuda_mha_args *args,
                               const call *c, unsigned char *base) {
    const attn_mha_args *a = &args->base;
    if (m->extra == 0) return ATTN_OK;
    int err = cudaSuccess;
    if (a->causal) {
        err = attn__cuda_launch_mask_widen(base + c->mask_off, NULL, 0, c->L, c->L, c->S, c->S2, 1, ctx->stream);
    } else if (a->attn_mask != NULL) {
        const int64_t rows = a->attn_mask_ndim == 3 ? c->N * m->H * c->L : c->L;
        err = attn__cuda_launch_mask_widen(base + c->mask_off, a->attn_mask, c->S, rows, c->L, c->S, c->S2,
                                           (int64_t)attn_dtype_size(a->attn_mask_dtype), ctx->stream);
    }
    if (err == cudaSuccess && a->key_padding_mask != NULL)
        err = attn__cuda_launch_mask_widen(base + c->kpm_off, a->key_padding_mask, c->S, c->N, 1, c->S, c->S2,
                                           (int64_t)attn_dtype_size(a->key_padding_mask_dtype), ctx->stream);
    return err == cudaSuccess ? ATTN_OK : attn__cuda_device_fail(&ctx->err, err, "cuda mha: widening the masks");
}

// Module-owned device scratch of at least `bytes`, grown stream-ordered on the context's stream.
static attn_status scratch(attn_cuda_ctx *ctx, attn_cuda_mha *m, size_t bytes, unsigned char **out) {
    if (m->scratch_size < bytes) {
        attn__cuda_mem_free(&m->mem, m->scratch, m->scratch_stream, true);
        m->scratch = NULL, m->scratch_size = 0;
        const cudaError_t err = (cudaError_t)attn__cuda_mem_alloc(&m->mem, &m->scratch, bytes, ctx->stream, true);
        if (err == cudaErrorMemoryAllocation)
            return attn__cuda_fail(&ctx->err, ATTN_ERR_OUT_OF_MEMORY, "cuda mha: %zu bytes of scratch cannot be had", bytes);
        if (err != cudaSuccess) return attn__cuda_device_fail(&ctx->err, err, "cuda mha: cudaMallocAsync");
        m->scratch_size = bytes, m->scratch_stream = ctx->stream;
    }
    *out = m->scratch;
    return ATTN_OK;
}

static const unsigned char *param(const attn_cuda_mha *m, int i) {
    return i >= 0 ? (const unsigned char *)m->data[i] : NULL;
}

// The input projection `which` (0 q, 1 k, 2 v): its input width, its weight's first row (E rows of
// that width; the packed in_proj_weight holds the three in turn, so one product may take several
// projections' rows) and its bias (in_proj_bias: 3E either way); their gradients' places likewise.
static int64_t in_width(const attn_cuda_mha *m, int which) {
    return which == 1 ? m->kdim : which == 2 ? m->vdim : m->E;
}

static const unsigned char *in_weight(const attn_cuda_mha *m, int which) {
    if (m->i_w_in < 0) return param(m, m->i_w[which]);
    return param(m, m->i_w_in) + (size_t)(which * m->E * m->E) * attn_dtype_size(m->dt);
}

static const unsigned char *in_bias(const attn_cuda_mha *m, int which) {
    const unsigned char *b = param(m, m->i_b_in);
    return b != NULL ? b + (size_t)(which * m->E) * attn_dtype_size(m->dt) : NULL;
}

static float *in_weight_grad(const attn_cuda_mha *m, float *const *dparams, int which) {
    if (dparams == NULL) return NULL;
    if (m->i_w_in < 0) return dparams[m->i_w[which]];
    return dparams[m->i_w_in] != NULL ? dparams[m->i_w_in] + which * m->E * m->E : NULL;
}

static float *in_bias_grad(const attn_cuda_mha *m, float *const *dparams, int which) {
    if (dparams == NULL || m->i_b_in < 0 || dparams[m->i_b_in] == NULL) return NULL;
    return dparams[m->i_b_in] + which * m->E;
}

// C (rows x cols, ldc) = X (rows x width, ld ldx) W^T + b for projection `which` and the `cols`
// weight rows from its first (cols > E: the following projections' too, packed weight only).
static attn_status project_ld(attn_cuda_ctx *ctx, const attn_cuda_mha *m, int which, const void *x, int64_t ldx,
                              int64_t rows, int64_t cols, void *out, int64_t ldc) {
    const int64_t width = in_width(m, which);
    const attn__cuda_gemm g = {.m = rows, .n = cols, .k = width, .a = x, .lda = ldx, .b = in_weight(m, which),
                               .ldb = width, .trans_b = true, .c = out, .ldc = ldc, .bias = in_bias(m, which),
                               .alpha = 1.0f, .beta = 0.0f, .ab_type = m->dt, .c_type = m->dt};
    return attn__cuda_gemm_run(&ctx->err, m->blas, &g, ctx->stream);
}

static attn_status project(attn_cuda_ctx *ctx, const attn_cuda_mha *m, int which, const void *x, int64_t rows,
                           int64_t cols, void *out, int64_t ldc) {
    return project_ld(ctx, m, which, x, in_width(m, which), rows, cols, out, ldc);
}

// `height` blocks of `width` bytes, `spitch` apart from src and `dpitch` apart to dst (one 2-D copy
// while the pitches are within what such copies take, else block by block).
static attn_status copy_2d(attn_cuda_ctx *ctx, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                           size_t height) {
    cudaError_t err = cudaSuccess;
    if (dpitch <= INT32_MAX && spitch <= INT32_MAX)
        err = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDeviceToDevice, ctx->stream);
    else
        for (size_t i = 0; i < height && err == cudaSuccess; i++)
            err = cudaMemcpyAsync((unsigned char *)dst + i * dpitch, (const unsigned char *)src + i * spitch, width,
                                  cudaMemcpyDeviceToDevice, ctx->stream);
    return err == cudaSuccess ? ATTN_OK : attn__cuda_device_fail(&ctx->err, err, "cuda mha: copying rows");
}

// Key or value projection `which` (1 or 2) into its region of S' tokens a sequence: the S projected
// tokens, then bias_k / bias_v and the zero row where the module adds them.
static attn_status project_kv(attn_cuda_ctx *ctx, const attn_cuda_mha *m, const call *c, int which, const void *x,
                              unsigned char *buf, const region *r) {
    const size_t es = attn_dtype_size(m->dt), row = (size_t)r->ld * es;
    unsigned char *dst = buf + r->off;
    if (!c->staged) {
        ATTN__CU_TRY(project(ctx, m, which, x, c->Mkv, m->E, dst, r->ld));
    } else { // each sequence's S rows staged, then copied to rows b S' ..
        ATTN__CU_TRY(project(ctx, m, which, x, c->Mkv, m->E, buf + c->stage_off, m->E));
        ATTN__CU_TRY(copy_2d(ctx, dst, (size_t)c->S2 * row, buf + c->stage_off, (size_t)(c->S * m->E) * es,
                             (size_t)(c->S * m->E) * es, (size_t)c->N));
    }
    int64_t step, t = c->S;
    int err = cudaSuccess;
    if (m->i_bias_kv[which] >= 0) {
        const int64_t at = token_row(c, t++, &step);
        err = attn__cuda_launch_rows_put(dst + (size_t)at * row, c->N, step * (int64_t)row, param(m, m->i_bias_kv[which]),
                                         m->E * (int64_t)es, ctx->stream);
    }
    if (err == cudaSuccess && m->cfg.add_zero_attn) {
        const int64_t at = token_row(c, t, &step);
        err = attn__cuda_launch_rows_put(dst + (size_t)at * row, c->N, step * (int64_t)row, NULL, m->E * (int64_t)es,
                                         ctx->stream);
    }
    return err == cudaSuccess ? ATTN_OK : attn__cuda_device_fail(&ctx->err, err, "cuda mha: the added keys");
}

// The attention's descriptor on the buffers at base (call c's layout) into d, checked by the planner
// of the forward or the backward (masks, options, the GPU's limits) before anything of the call is
// launched: a refused call changes nothing of the caller's.
static attn_status check_attention(attn_cuda_ctx *ctx, const attn_cuda_mha *m, const attn_cuda_mha_args *args,
                                   const call *c, const unsigned char *base, bool backward, attn_sdpa_desc *d) {
    describe(m, args, c, base, d);
    size_t bytes;
    return backward ? attn_cuda_sdpa_bwd_workspace_size(ctx, d, &bytes) : attn_cuda_sdpa_fwd_workspace_size(ctx, d, &bytes);
}

// The projections, the attention and out_proj into `buf` (call c's layout) and out.
static attn_status forward_into(attn_cuda_ctx *ctx, attn_cuda_mha *m, const attn_cuda_mha_args *args, const call *c,
                                unsigned char *buf, void *out, float *lse) {
    const int64_t E = m->E;
    attn_sdpa_desc d;
    ATTN__CU_TRY(check_attention(ctx, m, args, c, buf, false, &d));
    if (c->self) {
        ATTN__CU_TRY(project(ctx, m, 0, c->x_q, c->Mq, 3 * E, buf + c->q.off, 3 * E));
    } else {
        ATTN__CU_TRY(project(ctx, m, 0, c->x_q, c->Mq, E, buf + c->q.off, c->q.ld));
        if (c->kv_same) {
            ATTN__CU_TRY(project(ctx, m, 1, c->x_k, c->Mkv, 2 * E, buf + c->k.off, c->k.ld));
        } else {
            ATTN__CU_TRY(project_kv(ctx, m, c, 1, c->x_k, buf, &c->k));
            ATTN__CU_TRY(project_kv(ctx, m, c, 2, c->x_v, buf, &c->v));
        }
    }
    ATTN__CU_TRY(widen_masks(ctx, m, args, c, buf));
    ATTN__CU_TRY(attn_cuda_sdpa_fwd(ctx, &d, buf + c->q.off, buf + c->k.off, buf + c->v.off, buf + c->attn.off, lse));
    const attn__cuda_gemm g = {.m = c->Mq, .n = E, .k = E, .a = buf + c->attn.off, .lda = E, .b = param(m, m->i_w_out),
                               .ldb = E, .trans_b = true, .c = out, .ldc = E, .bias = param(m, m->i_b_out), .alpha = 1.0f,
                               .ab_type = m->dt, .c_type = m->dt};
    return attn__cuda_gemm_run(&ctx->err, m->blas, &g, ctx->stream);
}

static attn_status check_out(attn_cuda_ctx *ctx, const void *out) {
    if (out == NULL) return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda mha: out must not be NULL");
    return attn__cuda_check_device_ptr(ctx, out, "cuda mha: out");
}

attn_status attn_cuda_mha_forward(attn_cuda_ctx *ctx, attn_cuda_mha *m, const attn_cuda_mha_args *args, void *out) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    call c;
    ATTN__CU_TRY(plan_call(ctx, m, args, &c));
    ATTN__CU_TRY(check_out(ctx, out));
    unsigned char *buf = NULL;
    ATTN__CU_TRY(scratch(ctx, m, c.bytes, &buf));
    return forward_into(ctx, m, args, &c, buf, out, NULL);
}

attn_status attn_cuda_mha_saved_size(attn_cuda_ctx *ctx, attn_cuda_mha *m, const attn_cuda_mha_args *args,
                                     size_t *bytes) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (bytes == NULL) return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda mha: bytes is NULL");
    call c;
    ATTN__CU_TRY(plan_call(ctx, m, args, &c));
    *bytes = c.bytes_train + ATTN__CU_WS_ALIGN - 1;
    return ATTN_OK;
}

// The caller's saved buffer from its first 256-byte boundary, or ATTN_ERR_WORKSPACE when too small.
static attn_status saved_base(attn_cuda_ctx *ctx, const call *c, const void *saved, size_t size, unsigned char **base) {
    if (saved == NULL) return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda mha: saved must not be NULL");
    ATTN__CU_TRY(attn__cuda_check_device_ptr(ctx, saved, "cuda mha: saved"));
    const uintptr_t p = (uintptr_t)saved, at = (p + ATTN__CU_WS_ALIGN - 1) & ~(uintptr_t)(ATTN__CU_WS_ALIGN - 1);
    if (size < c->bytes_train + (at - p))
        return attn__cuda_fail(&ctx->err, ATTN_ERR_WORKSPACE, "cuda mha: saved holds %zu bytes, %zu are needed", size,
                               c->bytes_train + ATTN__CU_WS_ALIGN - 1);
    *base = (unsigned char *)at;
    return ATTN_OK;
}

attn_status attn_cuda_mha_forward_train(attn_cuda_ctx *ctx, attn_cuda_mha *m, const attn_cuda_mha_args *args,
                                        void *out, void *saved, size_t saved_size) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    call c;
    ATTN__CU_TRY(plan_call(ctx, m, args, &c));
    ATTN__CU_TRY(check_out(ctx, out));
    unsigned char *buf = NULL;
    ATTN__CU_TRY(saved_base(ctx, &c, saved, saved_size, &buf));
    return forward_into(ctx, m, args, &c, buf, out, (float *)(buf + c.lse_off));
}

// ---- backward ---------------------------------------------------------------------------------------

// dW = G^T X and db = column sums of G for projection `which` (and, packed, the following ones when
// cols > E), whose gradient G (M x cols at ldg) came from input X (M x its width).
static attn_status proj_param_grads(attn_cuda_ctx *ctx, const attn_cuda_mha *m, float *const *dparams, const void *G,
                                    int64_t ldg, int64_t M, int64_t cols, const void *X, int which) {
    float *dw = in_weight_grad(m, dparams, which), *db = in_bias_grad(m, dparams, which);
    const int64_t width = in_width(m, which);
    if (dw != NULL) {
        const attn__cuda_gemm g = {.m = cols, .n = width, .k = M, .a = G, .lda = ldg, .trans_a = true, .b = X,
                                   .ldb = width, .c = dw, .ldc = width, .alpha = 1.0f, .ab_type = m->dt,
                                   .c_type = ATTN_DTYPE_F32};
        ATTN__CU_TRY(attn__cuda_gemm_run(&ctx->err, m->blas, &g, ctx->stream));
    }
    if (db != NULL) {
        const int err = attn__cuda_launch_colsum(G, m->dt, M, cols, ldg, db, ctx->stream);
        if (err != cudaSuccess) return attn__cuda_device_fail(&ctx->err, err, "cuda mha: bias gradient");
    }
    return ATTN_OK;
}

// dX (M x width) (+)= G (M x cols at ldg) W: the input's gradient of projection `which` (and the
// following ones when cols > E).
static attn_status input_grad(attn_cuda_ctx *ctx, const attn_cuda_mha *m, const void *G, int64_t ldg, int64_t M,
                              int64_t cols, int which, void *dx, bool accumulate) {
    if (dx == NULL) return ATTN_OK;
    const int64_t width = in_width(m, which);
    const attn__cuda_gemm g = {.m = M, .n = width, .k = cols, .a = G, .lda = ldg, .b = in_weight(m, which),
                               .ldb = width, .c = dx, .ldc = width, .alpha = 1.0f, .beta = accumulate ? 1.0f : 0.0f,
                               .ab_type = m->dt, .c_type = m->dt};
    return attn__cuda_gemm_run(&ctx->err, m->blas, &g, ctx->stream);
}

// The gradient of key or value projection `which` (its region r of S' tokens in g): bias_k's or
// bias_v's (the added row summed over the sequences), then the S projected tokens' rows, staged in
// sequence order with batch_first; *G and *ldg say where they are.
static attn_status kv_grad_rows(attn_cuda_ctx *ctx, const attn_cuda_mha *m, const call *c, float *const *dparams,
                                int which, unsigned char *g, const region *r, const unsigned char **G, int64_t *ldg) {
    const size_t es = attn_dtype_size(m->dt), row = (size_t)r->ld * es;
    const int i = m->i_bias_kv[which];
    if (dparams != NULL && i >= 0 && dparams[i] != NULL) {
        int64_t step;
        const int64_t at = token_row(c, c->S, &step);
        const int err = attn__cuda_launch_colsum(g + r->off + (size_t)at * row, m->dt, c->N, m->E, step * r->ld, dparams[i],
                                                 ctx->stream);
        if (err != cudaSuccess) return attn__cuda_device_fail(&ctx->err, err, "cuda mha: bias_k / bias_v gradient");
    }
    *G = g + r->off, *ldg = r->ld;
    if (!c->staged) return ATTN_OK;
    ATTN__CU_TRY(copy_2d(ctx, g + c->stage_off, (size_t)(c->S * m->E) * es, g + r->off, (size_t)c->S2 * row,
                         (size_t)(c->S * m->E) * es, (size_t)c->N));
    *G = g + c->stage_off, *ldg = m->E;
    return ATTN_OK;
}

attn_status attn_cuda_mha_backward(attn_cuda_ctx *ctx, attn_cuda_mha *m, const attn_cuda_mha_args *args,
                                   const void *saved, size_t saved_size, const void *dout, void *dquery, void *dkey,
                                   void *dvalue, float *const *dparams) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    call c;
    ATTN__CU_TRY(plan_call(ctx, m, args, &c));
    if (dout == NULL) return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda mha: dout must not be NULL");
    // a tensor used as several inputs gets the sum of its uses in the first one (as attn.h's backward)
    if ((c.x_k == c.x_q && dkey != NULL) || ((c.x_v == c.x_q || c.x_v == c.x_k) && dvalue != NULL))
        return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG,
                               "cuda mha: a tensor passed as several inputs has its gradient in the first (dkey / dvalue "
                               "must be NULL)");
    const void *const grads[] = {dout, dquery, dkey, dvalue};
    static const char *const grad_names[] = {"cuda mha: dout", "cuda mha: dquery", "cuda mha: dkey", "cuda mha: dvalue"};
    ATTN__CU_TRY(check_ptrs(ctx, 4, grads, grad_names));
    for (int i = 0; dparams != NULL && i < m->n_params; i++)
        ATTN__CU_TRY(attn__cuda_check_device_ptr(ctx, dparams[i], "cuda mha: a parameter's gradient (dparams)"));
    unsigned char *sv = NULL;
    ATTN__CU_TRY(saved_base(ctx, &c, saved, saved_size, &sv));
    // the attention's backward on the forward's buffers (its widened masks in `saved`), checked first
    attn_sdpa_desc d;
    ATTN__CU_TRY(check_attention(ctx, m, args, &c, sv, true, &d));
    unsigned char *g = NULL;
    ATTN__CU_TRY(scratch(ctx, m, c.bytes, &g)); // d(attention output) and the projections' gradients
    const int64_t E = m->E;
    // out_proj: d_attn = dout W_out; dW_out = dout^T attn; db_out = column sums of dout
    const attn__cuda_gemm ga = {.m = c.Mq, .n = E, .k = E, .a = dout, .lda = E, .b = param(m, m->i_w_out), .ldb = E,
                                .c = g + c.attn.off, .ldc = E, .alpha = 1.0f, .ab_type = m->dt, .c_type = m->dt};
    ATTN__CU_TRY(attn__cuda_gemm_run(&ctx->err, m->blas, &ga, ctx->stream));
    if (dparams != NULL && m->i_w_out >= 0 && dparams[m->i_w_out] != NULL) {
        const attn__cuda_gemm gw = {.m = E, .n = E, .k = c.Mq, .a = dout, .lda = E, .trans_a = true, .b = sv + c.attn.off,
                                    .ldb = E, .c = dparams[m->i_w_out], .ldc = E, .alpha = 1.0f, .ab_type = m->dt,
                                    .c_type = ATTN_DTYPE_F32};
        ATTN__CU_TRY(attn__cuda_gemm_run(&ctx->err, m->blas, &gw, ctx->stream));
    }
    if (dparams != NULL && m->i_b_out >= 0 && dparams[m->i_b_out] != NULL) {
        const int err = attn__cuda_launch_colsum(dout, m->dt, c.Mq, E, E, dparams[m->i_b_out], ctx->stream);
        if (err != cudaSuccess) return attn__cuda_device_fail(&ctx->err, err, "cuda mha: bias gradient");
    }
    // the attention's backward into the projections' gradients (the layout of their values)
    ATTN__CU_TRY(attn_cuda_sdpa_bwd(ctx, &d, sv + c.q.off, sv + c.k.off, sv + c.v.off, sv + c.attn.off, g + c.attn.off,
                                    (const float *)(sv + c.lse_off), g + c.q.off, g + c.k.off, g + c.v.off, NULL));
    if (c.self) { // one (M, 3E) gradient: dW_in = G^T x, dx = G W_in
        ATTN__CU_TRY(proj_param_grads(ctx, m, dparams, g + c.q.off, 3 * E, c.Mq, 3 * E, c.x_q, 0));
        return input_grad(ctx, m, g + c.q.off, 3 * E, c.Mq, 3 * E, 0, dquery, false);
    }
    ATTN__CU_TRY(proj_param_grads(ctx, m, dparams, g + c.q.off, c.q.ld, c.Mq, E, c.x_q, 0));
    ATTN__CU_TRY(input_grad(ctx, m, g + c.q.off, c.q.ld, c.Mq, E, 0, dquery, false));
    void *dk_to = c.x_k == c.x_q ? dquery : dkey; // key's gradient, added to query's when it is query
    const bool k_acc = c.x_k == c.x_q;
    if (c.kv_same) {
        ATTN__CU_TRY(proj_param_grads(ctx, m, dparams, g + c.k.off, c.k.ld, c.Mkv, 2 * E, c.x_k, 1));
        return input_grad(ctx, m, g + c.k.off, c.k.ld, c.Mkv, 2 * E, 1, dk_to, k_acc);
    }
    const unsigned char *G;
    int64_t ldg;
    ATTN__CU_TRY(kv_grad_rows(ctx, m, &c, dparams, 1, g, &c.k, &G, &ldg));
    ATTN__CU_TRY(proj_param_grads(ctx, m, dparams, G, ldg, c.Mkv, E, c.x_k, 1));
    ATTN__CU_TRY(input_grad(ctx, m, G, ldg, c.Mkv, E, 1, dk_to, k_acc));
    ATTN__CU_TRY(kv_grad_rows(ctx, m, &c, dparams, 2, g, &c.v, &G, &ldg)); // after key's products (stream order)
    ATTN__CU_TRY(proj_param_grads(ctx, m, dparams, G, ldg, c.Mkv, E, c.x_v, 2));
    void *dv_to = c.x_v == c.x_q ? dquery : c.x_v == c.x_k ? dk_to : dvalue;
    return input_grad(ctx, m, G, ldg, c.Mkv, E, 2, dv_to, c.x_v == c.x_q || c.x_v == c.x_k);
}

// ---- decoding with a device KV cache ------------------------------------------------------------

attn_status attn_cuda_mha_forward_cached(attn_cuda_ctx *ctx, attn_cuda_mha *m, attn_cuda_kv_cache *cache, const void *x,
                                         int64_t batch, int64_t len, void *out) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__cuda_err *e = &ctx->err;
    if (m == NULL || cache == NULL || x == NULL || out == NULL)
        return attn__cuda_fail(e, ATTN_ERR_INVALID_ARG, "cuda mha: mha, cache, x and out must not be NULL");
    if (m->i_w_in < 0 || m->extra > 0)
        return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED,
                               "cuda mha: decoding needs kdim = vdim = embed_dim and no bias_k/bias_v or zero attention");
    if (batch < 1 || len < 1) return attn__cuda_fail(e, ATTN_ERR_BAD_SHAPE, "cuda mha: batch and len must be >= 1");
    const void *const io[] = {x, out};
    static const char *const io_names[] = {"cuda mha: x", "cuda mha: out"};
    ATTN__CU_TRY(check_ptrs(ctx, 2, io, io_names));
    const int64_t E = m->E, N = batch, L = len;
    int64_t M;
    if (__builtin_mul_overflow(N, L, &M) || M > INT64_MAX / 32 / E)
        return attn__cuda_fail(e, ATTN_ERR_OVERFLOW, "cuda mha: batch %lld times len %lld rows of %lld overflow", (long long)N,
                               (long long)L, (long long)E);
    const size_t es = attn_dtype_size(m->dt);
    // q, k, v and the attention's output, sequence after sequence ((N, L, E) rows), in the scratch
    size_t used = 0;
    const size_t qo = attn__cuda_ws_take(&used, (size_t)(M * E) * es), ko = attn__cuda_ws_take(&used, (size_t)(M * E) * es);
    const size_t vo = attn__cuda_ws_take(&used, (size_t)(M * E) * es), ao = attn__cuda_ws_take(&used, (size_t)(M * E) * es);
    // the step: L new tokens a sequence, the queries packed (N, L) with heads as column blocks
    int64_t *n = malloc((size_t)(2 * N + 1) * sizeof(int64_t));
    if (n == NULL) return attn__cuda_fail(e, ATTN_ERR_OUT_OF_MEMORY, "cuda mha: out of host memory");
    int64_t *cu_q = n + N;
    for (int64_t b = 0; b < N; b++) n[b] = L, cu_q[b] = b * L;
    cu_q[N] = M;
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = N, d.n_heads = m->H, d.n_kv_heads = m->H, d.len_q = L, d.head_dim = m->hd;
    d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    d.q_stride[1] = d.o_stride[1] = m->hd, d.q_stride[2] = d.o_stride[2] = E, d.q_stride[3] = d.o_stride[3] = 1;
    d.q_dtype = d.kv_dtype = d.out_dtype = m->dt;
    // the cache's fit (batch, heads, dims, type), its capacity and the attention's checks, before
    // anything is projected or appended
    unsigned char *buf = NULL;
    attn_status st = scratch(ctx, m, used, &buf);
    if (st == ATTN_OK) st = attn__cuda_kv_cache_check_step(ctx, cache, n, &d, cu_q, buf + qo, buf + ao);
    // x's rows of sequence b: consecutive with batch_first, else every N-th row
    const bool bf = m->cfg.batch_first != 0;
    const int64_t ldx = bf ? E : N * E;
    for (int64_t b = 0; b < N && st == ATTN_OK; b++) {
        const unsigned char *xb = (const unsigned char *)x + (size_t)((bf ? b * L : b) * E) * es;
        const size_t rows_b = (size_t)(b * L * E) * es;
        st = project_ld(ctx, m, 0, xb, ldx, L, E, buf + qo + rows_b, E);
        if (st == ATTN_OK) st = project_ld(ctx, m, 1, xb, ldx, L, E, buf + ko + rows_b, E);
        if (st == ATTN_OK) st = project_ld(ctx, m, 2, xb, ldx, L, E, buf + vo + rows_b, E);
    }
    if (st == ATTN_OK) st = attn_cuda_kv_cache_append(ctx, cache, n, buf + ko, buf + vo);
    if (st == ATTN_OK) st = attn_cuda_kv_cache_attend(ctx, cache, &d, cu_q, buf + qo, buf + ao, NULL);
    free(n);
    ATTN__CU_TRY(st);
    // out_proj, each sequence's rows back to x's order
    for (int64_t b = 0; b < N; b++) {
        const attn__cuda_gemm g = {.m = L, .n = E, .k = E, .a = buf + ao + (size_t)(b * L * E) * es, .lda = E,
                                   .b = param(m, m->i_w_out), .ldb = E, .trans_b = true,
                                   .c = (unsigned char *)out + (size_t)((bf ? b * L : b) * E) * es, .ldc = ldx,
                                   .bias = param(m, m->i_b_out), .alpha = 1.0f, .ab_type = m->dt, .c_type = m->dt};
        ATTN__CU_TRY(attn__cuda_gemm_run(&ctx->err, m->blas, &g, ctx->stream));
    }
    return ATTN_OK;
}

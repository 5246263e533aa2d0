// cp_ring.c - context-parallel SDPA over MPI: the handle, argument checks, and the ring of the
// forward and the backward. Everything local is done by attn_sdpa_fwd / attn_sdpa_bwd on blocks.
//
// Forward (Ring Attention, Liu et al. 2023; the merge of FlashAttention's online softmax): at step
// s = 0..P-1 rank r holds the key/value block of rank o = r - s (mod P). It posts the receive of the
// next block from r-1 and the send of the current one to r+1, then computes its queries against the
// current block and merges each call's (out_b, lse_b) into the running (out, lse) of its rows:
//   lse' = log(exp(lse) + exp(lse_b)),  out' = exp(lse - lse') out + exp(lse_b - lse') out_b.
// Causal masking on global positions: the chunks of a layout partition the sequence, so a (query
// chunk, key chunk) pair is fully visible (keys before queries), hidden (skipped), or the same chunk
// (the diagonal: ATTN_CAUSAL_TOP_LEFT). The visible pairs of a step are grouped into as few calls as
// their row ranges allow (with the zigzag layout: one call per step off the diagonal).
//
// Backward (FlashAttention-2): with the forward's global out and lse, attn_sdpa_bwd on one block
// recomputes that block's weights exp(s - lse) exactly and gives its contribution to dq and to the
// block's dk, dv. dq sums on the rank in step order. The block's dk, dv accumulator travels with the
// block, one step behind it: rank r receives the accumulator of block o from r-1, adds its own
// contribution (computed while the accumulator was in flight) and sends it on; after P steps it
// reaches its owner. Every sum is formed in an order fixed by the layout, never by timing.
//
// Overlap: each step's calls are cut into pieces of query rows (poll_rows), and MPI_Testall is
// called between them: without it, Open MPI's large transfers (shared-memory single copy, TCP
// fragments) only progress inside MPI calls, so they would wait for the end of the computation.
// The cut depends on shapes only, so the sums (and the bits) do not depend on timing.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp/cp_internal.h"

#define TAG_KV 0x4b56
#define TAG_DKV 0x644b
// poll_rows 0 (automatic): pieces of at most AUTO_MAX_ROWS rows, and at least AUTO_PIECES of them
// when pieces of AUTO_MIN_ROWS rows or more allow it, so that MPI is polled several times per step.
#define AUTO_MAX_ROWS 512
#define AUTO_MIN_ROWS 64
#define AUTO_PIECES 8

// ---- errors, allocation ----------------------------------------------------------------------

static attn_status cp_fail(attn_cp *cp, attn_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static attn_status cp_fail(attn_cp *cp, attn_status st, const char *fmt, ...) {
    if (cp == NULL) return st;
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(cp->err, sizeof cp->err, "cp (rank %d): ", cp->rank);
    if (n < 0 || (size_t)n >= sizeof cp->err) n = 0;
    vsnprintf(cp->err + n, sizeof cp->err - (size_t)n, fmt, ap);
    va_end(ap);
    return st;
}

static attn_status mpi_fail(attn_cp *cp, int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
    msg[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING - 1] = '\0';
    return cp_fail(cp, ATTN_ERR_IO, "%s failed: %s", what, msg);
}

static void *sys_alloc(void *user, size_t size, size_t align) {
    (void)user;
    size = (size + align - 1) / align * align;
    return aligned_alloc(align, size == 0 ? align : size);
}

static void sys_free(void *user, void *ptr) {
    (void)user;
    free(ptr);
}

// ---- handle ----------------------------------------------------------------------------------

void attn_cp_params_init(attn_cp_params *params) {
    if (params != NULL) memset(params, 0, sizeof *params);
}

void attn_cp_desc_init(attn_cp_desc *desc) {
    if (desc == NULL) return;
    memset(desc, 0, sizeof *desc);
    attn_sdpa_desc_init(&desc->sdpa);
}

attn_status attn_cp_create(MPI_Comm comm, const attn_cp_params *params, attn_cp **out) {
    if (out == NULL) return ATTN_ERR_INVALID_ARG;
    *out = NULL;
    int init = 0, fin = 0;
    if (MPI_Initialized(&init) != MPI_SUCCESS || MPI_Finalized(&fin) != MPI_SUCCESS || !init || fin)
        return ATTN_ERR_INVALID_ARG;
    if (comm == MPI_COMM_NULL) return ATTN_ERR_INVALID_ARG;
    int inter = 0;
    if (MPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter) return ATTN_ERR_INVALID_ARG;
    attn_cp_params p;
    attn_cp_params_init(&p);
    if (params != NULL) p = *params;
    attn_status st = ATTN_OK;
    if ((p.allocator.alloc == NULL) != (p.allocator.free == NULL) || p.poll_rows < -1) st = ATTN_ERR_INVALID_ARG;
    if (p.allocator.alloc == NULL) p.allocator = (attn_allocator){sys_alloc, sys_free, NULL};

    MPI_Comm dup;
    if (MPI_Comm_dup(comm, &dup) != MPI_SUCCESS) return ATTN_ERR_IO;
    MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    attn_cp *cp = NULL;
    if (st == ATTN_OK) {
        cp = p.allocator.alloc(p.allocator.user, sizeof *cp, CP_ALIGN);
        if (cp == NULL) st = ATTN_ERR_OUT_OF_MEMORY;
    }
    // every rank learns whether another failed, so that all keep or free the communicator
    int64_t mine = st, worst = 0;
    if (MPI_Allreduce(&mine, &worst, 1, MPI_INT64_T, MPI_MAX, dup) != MPI_SUCCESS) worst = ATTN_ERR_IO;
    if (worst != ATTN_OK) {
        if (cp != NULL) p.allocator.free(p.allocator.user, cp);
        MPI_Comm_free(&dup);
        return st != ATTN_OK ? st : (attn_status)worst;
    }
    memset(cp, 0, sizeof *cp);
    cp->comm = dup;
    MPI_Comm_rank(dup, &cp->rank);
    MPI_Comm_size(dup, &cp->world);
    cp->alloc = p.allocator;
    cp->poll_rows = p.poll_rows;
    *out = cp;
    return ATTN_OK;
}

void attn_cp_free(attn_cp *cp) {
    if (cp == NULL) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&cp->comm);
    attn_allocator a = cp->alloc;
    if (cp->mem != NULL) a.free(a.user, cp->mem);
    a.free(a.user, cp);
}

const char *attn_cp_last_error(const attn_cp *cp) { return cp != NULL ? cp->err : "cp: NULL handle"; }
int attn_cp_rank(const attn_cp *cp) { return cp != NULL ? cp->rank : -1; }
int attn_cp_world(const attn_cp *cp) { return cp != NULL ? cp->world : -1; }

attn_status attn_cp_last_stats(const attn_cp *cp, attn_cp_stats *stats) {
    if (cp == NULL || stats == NULL) return ATTN_ERR_INVALID_ARG;
    *stats = cp->stats;
    return ATTN_OK;
}

// ---- shapes and buffers ----------------------------------------------------------------------

typedef struct cp_shape {
    int64_t B, H, Hkv, D, Dv;
    int64_t L;       // this rank's rows
    int64_t Smax;    // the longest rank's rows
    int64_t kv_tok;  // floats per key position in a key/value block: B*Hkv*(D+Dv) (+ B with a mask)
    int64_t dkv_tok; // floats per key position in a gradient block: B*Hkv*(D+Dv)
    bool kpm;        // blocks carry the key padding mask (as F32: 0 / value / -inf)
    bool q_packed;   // q (and dq) strides are those of a contiguous (B, H, L, D)
    bool o_packed;   // out (and dout) strides are those of a contiguous (B, H, L, Dv)
    bool causal;
    cp_chunks mine;
} cp_shape;

typedef struct cp_bufs {
    float *kv[2];                   // key/value blocks (Smax * kv_tok)
    float *o_blk, *lse_blk;         // forward: a call's out (B, H, L, Dv) and lse (B, H, L)
    double *lse_run;                // forward: the running lse of the rows (B, H, L)
    float *dkv[2], *dkv_step, *dkv_tmp; // backward: gradient blocks (Smax * dkv_tok)
    float *q_pack, *o_pack, *do_pack;   // backward: contiguous copies when needed (else NULL)
    float *dq_acc, *dq_tmp;         // backward: (B, H, L, D); dq_acc NULL when dq itself serves
    float *lse_g;                   // backward: a call's rows of lse (B, H, L)
} cp_bufs;

typedef struct cp_arena {
    char *base;
    size_t used;
} cp_arena;

static void *arena_take(cp_arena *a, int64_t n, size_t elem) {
    void *p = a->base != NULL ? a->base + a->used : NULL;
    a->used += ((size_t)n * elem + CP_ALIGN - 1) / CP_ALIGN * CP_ALIGN;
    return p;
}

static size_t bufs_layout(const cp_shape *s, bool bwd, char *base, cp_bufs *b) {
    cp_arena a = {base, 0};
    memset(b, 0, sizeof *b);
    const int64_t rows = s->B * s->H * s->L, kvn = s->Smax * s->kv_tok, dkvn = s->Smax * s->dkv_tok;
    for (int i = 0; i < 2; i++) b->kv[i] = arena_take(&a, kvn, sizeof(float));
    if (!bwd) {
        b->o_blk = arena_take(&a, rows * s->Dv, sizeof(float));
        b->lse_blk = arena_take(&a, rows, sizeof(float));
        b->lse_run = arena_take(&a, rows, sizeof(double));
        return a.used;
    }
    for (int i = 0; i < 2; i++) b->dkv[i] = arena_take(&a, dkvn, sizeof(float));
    b->dkv_step = arena_take(&a, dkvn, sizeof(float));
    b->dkv_tmp = arena_take(&a, dkvn, sizeof(float));
    if (!s->q_packed) {
        b->q_pack = arena_take(&a, rows * s->D, sizeof(float));
        b->dq_acc = arena_take(&a, rows * s->D, sizeof(float));
    }
    if (!s->o_packed) {
        b->o_pack = arena_take(&a, rows * s->Dv, sizeof(float));
        b->do_pack = arena_take(&a, rows * s->Dv, sizeof(float));
    }
    b->dq_tmp = arena_take(&a, rows * s->D, sizeof(float));
    b->lse_g = arena_take(&a, rows, sizeof(float));
    return a.used;
}

// Whether strides address a view (n) exactly as a contiguous tensor of that shape does.
static bool is_packed(const int64_t n[4], const int64_t s[4]) {
    const int64_t want[4] = {n[1] * n[2] * n[3], n[2] * n[3], n[3], 1};
    for (int i = 0; i < 4; i++)
        if (n[i] > 1 && s[i] != want[i]) return false;
    return true;
}

static void packed_strides(int64_t H, int64_t L, int64_t D, int64_t s[4]) {
    s[0] = H * L * D, s[1] = L * D, s[2] = D, s[3] = 1;
}

// The descriptor of one kernel call, built from attn_sdpa_desc_init so that options of the local
// call that depend on positions never leak into a block call: the caller's sizes, q and out
// strides, scale and soft-capping; the block's strides for k, v and its F32 key padding mask.
static void call_desc(const attn_cp_desc *desc, const cp_shape *s, int64_t So, int64_t nq, int64_t nk,
                      attn_causal causal, const float *mask, attn_sdpa_desc *d) {
    const attn_sdpa_desc *sd = &desc->sdpa;
    attn_sdpa_desc_init(d);
    d->batch = s->B, d->n_heads = s->H, d->n_kv_heads = s->Hkv, d->head_dim = s->D, d->head_dim_v = s->Dv;
    d->len_q = nq, d->len_kv = nk, d->causal = causal;
    d->scale = sd->scale, d->softcap = sd->softcap;
    memcpy(d->q_stride, sd->q_stride, sizeof d->q_stride);
    memcpy(d->o_stride, sd->o_stride, sizeof d->o_stride);
    packed_strides(s->Hkv, So, s->D, d->k_stride);
    packed_strides(s->Hkv, So, s->Dv, d->v_stride);
    d->key_padding_mask = mask;
    d->key_padding_mask_dtype = ATTN_DTYPE_F32;
    d->key_padding_mask_stride[0] = So, d->key_padding_mask_stride[1] = 1;
}

// Checks the caller's arguments on this rank (every status path leaves a message), fills the shape,
// sizes the buffers and the context's scratch. Nothing collective.
typedef struct cp_args {
    const float *q, *k, *v, *out, *dout, *lse, *dq, *dk, *dv; // those the call needs are non-NULL
    bool bwd;
    bool check_ptrs;
} cp_args;

static attn_status check_local(attn_cp *cp, attn_ctx *ctx, const attn_cp_desc *desc, const cp_args *a, cp_shape *s) {
    memset(s, 0, sizeof *s);
    if (ctx == NULL) return cp_fail(cp, ATTN_ERR_INVALID_ARG, "ctx is NULL");
    if (desc == NULL) return cp_fail(cp, ATTN_ERR_INVALID_ARG, "desc is NULL");
    const attn_cp_layout *l = &desc->layout;
    if (!attn__cp_layout_ok(l))
        return cp_fail(cp, ATTN_ERR_INVALID_ARG,
                       "invalid layout (chunking %d, len %lld, rank %d, world %d): use attn_cp_layout_init",
                       (int)l->chunking, (long long)l->len, l->rank, l->world);
    if (l->world != cp->world || l->rank != cp->rank)
        return cp_fail(cp, ATTN_ERR_INVALID_ARG, "layout says rank %d of %d, the communicator rank %d of %d", l->rank,
                       l->world, cp->rank, cp->world);
    const attn_sdpa_desc *sd = &desc->sdpa;
    if (sd->mask != NULL)
        return cp_fail(cp, ATTN_ERR_UNSUPPORTED, "an attention mask (sdpa.mask) is not supported; use causal and "
                                                 "the key padding mask");
    if (sd->dropout_p != 0.0) return cp_fail(cp, ATTN_ERR_UNSUPPORTED, "dropout is not supported");
    if (sd->weights_mode != ATTN_WEIGHTS_NONE)
        return cp_fail(cp, ATTN_ERR_UNSUPPORTED, "attention weights are not supported");
    if (sd->use_window || sd->alibi_slopes != NULL)
        return cp_fail(cp, ATTN_ERR_UNSUPPORTED, "a local window and ALiBi are not supported (they depend on "
                                                 "positions; only causal masking is applied on global positions)");
    if (sd->kv_dtype != ATTN_DTYPE_F32 || sd->q_dtype != ATTN_DTYPE_F32 || sd->out_dtype != ATTN_DTYPE_F32 ||
        sd->grad_dtype != ATTN_DTYPE_F32)
        return cp_fail(cp, ATTN_ERR_UNSUPPORTED, "every tensor must be F32 (kv_dtype %s, q_dtype %s, out_dtype %s, grad_dtype %s)",
                       attn_dtype_name(sd->kv_dtype), attn_dtype_name(sd->q_dtype), attn_dtype_name(sd->out_dtype),
                       attn_dtype_name(sd->grad_dtype));
    if (a->bwd && attn_ctx_isa(ctx) == ATTN_ISA_REF)
        return cp_fail(cp, ATTN_ERR_UNSUPPORTED, "the backward needs fused kernels (the context's ISA is REF)");
    attn__cp_chunks_of(l, l->rank, &s->mine);
    s->L = s->mine.total;
    if ((sd->len_q != 0 && sd->len_q != s->L) || (sd->len_kv != 0 && sd->len_kv != s->L))
        return cp_fail(cp, ATTN_ERR_BAD_SHAPE, "sdpa.len_q = %lld and len_kv = %lld must be 0 or the local length %lld",
                       (long long)sd->len_q, (long long)sd->len_kv, (long long)s->L);
    s->B = sd->batch, s->H = sd->n_heads, s->Hkv = sd->n_kv_heads == 0 ? sd->n_heads : sd->n_kv_heads;
    s->D = sd->head_dim, s->Dv = sd->head_dim_v == 0 ? sd->head_dim : sd->head_dim_v;
    // the rest (sizes, strides, masks, scale) as libattn checks a call on the local slices; a rank
    // without rows has nothing to address: its strides are checked as those of one packed row
    attn_sdpa_desc v = *sd;
    v.len_q = v.len_kv = s->L > 0 ? s->L : 1;
    if (s->L == 0) {
        packed_strides(s->H, 1, s->D, v.q_stride), packed_strides(s->Hkv, 1, s->D, v.k_stride);
        packed_strides(s->Hkv, 1, s->Dv, v.v_stride), packed_strides(s->H, 1, s->Dv, v.o_stride);
        v.key_padding_mask_stride[0] = v.key_padding_mask_stride[1] = 1;
    }
    size_t bytes;
    attn_status st = a->bwd ? attn_sdpa_bwd_workspace_size(ctx, &v, 0, &bytes) : attn_sdpa_fwd_workspace_size(ctx, &v, &bytes);
    if (st != ATTN_OK) return cp_fail(cp, st, "local slices: %s", attn_ctx_last_error(ctx));
    s->causal = sd->causal != ATTN_CAUSAL_NONE;
    // a rank without rows may leave the mask out: its blocks are empty, and it sizes for one
    s->kpm = sd->key_padding_mask != NULL || s->L == 0;
    if (a->check_ptrs && s->L > 0) {
        const bool miss = a->q == NULL || a->k == NULL || a->v == NULL || a->out == NULL ||
                          (a->bwd && (a->dout == NULL || a->lse == NULL || a->dq == NULL || a->dk == NULL || a->dv == NULL));
        if (miss)
            return cp_fail(cp, ATTN_ERR_INVALID_ARG, a->bwd ? "q, k, v, out, dout, lse, dq, dk and dv must not be NULL"
                                                            : "q, k, v and out must not be NULL");
    }
    for (int r = 0; r < l->world; r++) {
        cp_chunks c;
        attn__cp_chunks_of(l, r, &c);
        if (c.total > s->Smax) s->Smax = c.total;
    }
    int64_t hd, t, rows;
    if (!cp_add(s->D, s->Dv, &hd) || !cp_mul(s->B * s->Hkv, hd, &s->dkv_tok) ||
        !cp_add(s->dkv_tok, s->kpm ? s->B : 0, &s->kv_tok) || !cp_mul(s->Smax, s->kv_tok, &t) ||
        t > CP_SEG * CP_MAX_SEG || !cp_mul(s->B * s->H, s->L, &rows) || !cp_mul(rows, s->D > s->Dv ? s->D : s->Dv, &t))
        return cp_fail(cp, ATTN_ERR_OVERFLOW, "a key/value block of %lld positions exceeds 2^32 floats",
                       (long long)s->Smax);
    const int64_t nq[4] = {s->B, s->H, s->L, s->D}, no[4] = {s->B, s->H, s->L, s->Dv};
    s->q_packed = is_packed(nq, sd->q_stride);
    s->o_packed = is_packed(no, sd->o_stride);
    return ATTN_OK;
}

// Rows of the largest kernel call.
static int64_t max_call_rows(const attn_cp *cp, const cp_shape *s) {
    const int64_t cap = cp->poll_rows > 0 ? cp->poll_rows : cp->poll_rows == 0 ? AUTO_MAX_ROWS : s->L;
    return cap < s->L ? cap : s->L;
}

// The scratch the largest kernel call needs (0 for a rank without rows).
static attn_status kernel_scratch(attn_cp *cp, attn_ctx *ctx, const attn_cp_desc *desc, const cp_shape *s, bool bwd,
                                  size_t *bytes) {
    *bytes = 0;
    if (s->L == 0) return ATTN_OK;
    static const float dummy_mask[1] = {0.0f};
    attn_sdpa_desc d;
    const int64_t rows = max_call_rows(cp, s);
    call_desc(desc, s, s->Smax, rows, s->Smax, ATTN_CAUSAL_NONE, s->kpm ? dummy_mask : NULL, &d);
    packed_strides(s->H, rows, s->Dv, d.o_stride);
    if (bwd) {
        packed_strides(s->H, s->L, s->D, d.q_stride);
        packed_strides(s->H, s->L, s->Dv, d.o_stride);
    }
    attn_status st = bwd ? attn_sdpa_bwd_workspace_size(ctx, &d, 0, bytes) : attn_sdpa_fwd_workspace_size(ctx, &d, bytes);
    if (st != ATTN_OK) return cp_fail(cp, st, "block call: %s", attn_ctx_last_error(ctx));
    return ATTN_OK;
}

// check_local, then the handle's buffers and the context's scratch.
static attn_status prepare(attn_cp *cp, attn_ctx *ctx, const attn_cp_desc *desc, const cp_args *a, cp_shape *s,
                           cp_bufs *b) {
    ATTN_CP_RETURN_IF_ERR(check_local(cp, ctx, desc, a, s));
    const size_t need = bufs_layout(s, a->bwd, NULL, b);
    if (need > cp->mem_size) {
        if (cp->mem != NULL) cp->alloc.free(cp->alloc.user, cp->mem);
        cp->mem = cp->alloc.alloc(cp->alloc.user, need, CP_ALIGN);
        cp->mem_size = cp->mem != NULL ? need : 0;
        if (cp->mem == NULL) return cp_fail(cp, ATTN_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of ring buffers", need);
    }
    bufs_layout(s, a->bwd, cp->mem, b);
    size_t scratch;
    ATTN_CP_RETURN_IF_ERR(kernel_scratch(cp, ctx, desc, s, a->bwd, &scratch));
    attn_status st = attn_ctx_reserve(ctx, scratch);
    if (st != ATTN_OK) return cp_fail(cp, st, "context scratch of %zu bytes: %s", scratch, attn_strerror(st));
    return ATTN_OK;
}

attn_status attn_cp_workspace_size(const attn_cp *ccp, const attn_cp_desc *desc, int backward, size_t *bytes) {
    if (ccp == NULL) return ATTN_ERR_INVALID_ARG;
    attn_cp *cp = (attn_cp *)ccp; // only the error message is written
    cp->err[0] = '\0';
    if (bytes == NULL) return cp_fail(cp, ATTN_ERR_INVALID_ARG, "bytes is NULL");
    attn_ctx *ctx;
    if (attn_ctx_create(NULL, &ctx) != ATTN_OK) return cp_fail(cp, ATTN_ERR_OUT_OF_MEMORY, "cannot create a context");
    cp_args a = {.bwd = backward != 0};
    cp_shape s;
    cp_bufs b;
    attn_status st = check_local(cp, ctx, desc, &a, &s);
    attn_ctx_free(ctx);
    if (st != ATTN_OK) return st;
    *bytes = bufs_layout(&s, a.bwd, NULL, &b) + CP_ALIGN;
    return ATTN_OK;
}

attn_status attn_cp_reserve(attn_cp *cp, attn_ctx *ctx, const attn_cp_desc *desc, int backward) {
    if (cp == NULL) return ATTN_ERR_INVALID_ARG;
    cp->err[0] = '\0';
    cp_args a = {.bwd = backward != 0};
    cp_shape s;
    cp_bufs b;
    return prepare(cp, ctx, desc, &a, &s, &b);
}

// ---- agreement between ranks -----------------------------------------------------------------

enum { AG_STATUS, AG_FAILED_RANK, AG_BWD, AG_CHUNKING, AG_LEN, AG_WORLD, AG_B, AG_H, AG_HKV, AG_D, AG_DV, AG_CAUSAL,
       AG_KPM, AG_SCALE, AG_N };
static const char *const ag_names[AG_N] = {"status", "rank", "forward/backward", "chunking", "sequence length",
                                           "world", "batch", "n_heads", "n_kv_heads", "head_dim", "head_dim_v",
                                           "causal", "key padding mask", "scale"};
#define AG_NEUTRAL (INT64_MIN / 2)

// Every rank learns the worst status of all and whether their descriptors agree; then all go on or
// all return an error. With a mask on some ranks only, ranks without rows follow the others.
static attn_status agree(attn_cp *cp, attn_status st, const attn_cp_desc *desc, bool bwd, cp_shape *s) {
    int64_t v[AG_N] = {0}, send[2 * AG_N], recv[2 * AG_N];
    v[AG_STATUS] = st, v[AG_FAILED_RANK] = st != ATTN_OK ? cp->rank : -1, v[AG_BWD] = bwd;
    if (st == ATTN_OK) {
        uint32_t scale_bits;
        memcpy(&scale_bits, &desc->sdpa.scale, sizeof scale_bits);
        v[AG_CHUNKING] = desc->layout.chunking, v[AG_LEN] = desc->layout.len, v[AG_WORLD] = desc->layout.world;
        v[AG_B] = s->B, v[AG_H] = s->H, v[AG_HKV] = s->Hkv, v[AG_D] = s->D, v[AG_DV] = s->Dv;
        v[AG_CAUSAL] = s->causal, v[AG_KPM] = desc->sdpa.key_padding_mask != NULL, v[AG_SCALE] = scale_bits;
    }
    for (int i = 0; i < AG_N; i++) {
        const bool neutral = (i >= AG_CHUNKING && st != ATTN_OK) || (i == AG_KPM && s->L == 0);
        send[i] = neutral ? AG_NEUTRAL : v[i];
        send[AG_N + i] = neutral ? AG_NEUTRAL : -v[i];
    }
    send[AG_N + AG_STATUS] = send[AG_N + AG_FAILED_RANK] = AG_NEUTRAL;
    const int rc = MPI_Allreduce(send, recv, 2 * AG_N, MPI_INT64_T, MPI_MAX, cp->comm);
    if (rc != MPI_SUCCESS) return mpi_fail(cp, rc, "MPI_Allreduce");
    if (st != ATTN_OK) return st;
    if (recv[AG_STATUS] != ATTN_OK)
        return cp_fail(cp, (attn_status)recv[AG_STATUS], "rank %lld rejected the call: %s", (long long)recv[AG_FAILED_RANK],
                       attn_strerror((attn_status)recv[AG_STATUS]));
    for (int i = AG_BWD; i < AG_N; i++) {
        if (recv[i] == AG_NEUTRAL) continue;
        if (recv[i] != -recv[AG_N + i])
            return cp_fail(cp, ATTN_ERR_INVALID_ARG, "the ranks' descriptors disagree on the %s", ag_names[i]);
    }
    // what every rank now uses for the blocks' format
    s->kpm = recv[AG_KPM] == 1;
    s->kv_tok = s->dkv_tok + (s->kpm ? s->B : 0);
    return ATTN_OK;
}

// Every rank returns the worst status of the ring (a kernel failing mid-ring on one rank).
static attn_status agree_end(attn_cp *cp, attn_status st) {
    int64_t mine = st, worst = 0;
    const int rc = MPI_Allreduce(&mine, &worst, 1, MPI_INT64_T, MPI_MAX, cp->comm);
    if (rc != MPI_SUCCESS) return mpi_fail(cp, rc, "MPI_Allreduce");
    if (st != ATTN_OK) return st;
    if (worst != ATTN_OK)
        return cp_fail(cp, (attn_status)worst, "another rank failed during the ring: %s", attn_strerror((attn_status)worst));
    return ATTN_OK;
}

// ---- transfers -------------------------------------------------------------------------------

typedef struct cp_xfer {
    MPI_Request r[CP_MAX_SEG];
    int n;
} cp_xfer;

// Posts a send or receive of n floats in segments of at most CP_SEG (nothing for n = 0).
static attn_status xfer_post(attn_cp *cp, cp_xfer *x, float *buf, int64_t n, int peer, int tag, bool send) {
    x->n = 0;
    const double t0 = MPI_Wtime();
    for (int64_t off = 0; off < n; off += CP_SEG) {
        const int cnt = (int)(n - off < CP_SEG ? n - off : CP_SEG);
        const int rc = send ? MPI_Isend(buf + off, cnt, MPI_FLOAT, peer, tag, cp->comm, &x->r[x->n])
                            : MPI_Irecv(buf + off, cnt, MPI_FLOAT, peer, tag, cp->comm, &x->r[x->n]);
        if (rc != MPI_SUCCESS) return mpi_fail(cp, rc, send ? "MPI_Isend" : "MPI_Irecv");
        x->n++;
        if (send) cp->stats.messages++;
    }
    cp->stats.progress_s += MPI_Wtime() - t0;
    return ATTN_OK;
}

static attn_status xfer_wait(attn_cp *cp, cp_xfer *x) {
    if (x->n == 0) return ATTN_OK;
    const double t0 = MPI_Wtime();
    const int rc = MPI_Waitall(x->n, x->r, MPI_STATUSES_IGNORE);
    cp->stats.wait_s += MPI_Wtime() - t0;
    x->n = 0;
    return rc == MPI_SUCCESS ? ATTN_OK : mpi_fail(cp, rc, "MPI_Waitall");
}

// Lets MPI progress the transfers in flight (no waiting).
static void xfer_poll(attn_cp *cp, cp_xfer *xs, int n) {
    const double t0 = MPI_Wtime();
    for (int i = 0; i < n; i++) {
        int done = 0;
        if (xs[i].n > 0) MPI_Testall(xs[i].n, xs[i].r, &done, MPI_STATUSES_IGNORE);
    }
    cp->stats.progress_s += MPI_Wtime() - t0;
}

// ---- blocks ----------------------------------------------------------------------------------

// Copies the rank's keys, values and key padding mask (as F32) into a block buffer:
// k (B, Hkv, L, D), v (B, Hkv, L, Dv), mask (B, L), one after the other.
static void pack_block(const cp_shape *s, const attn_sdpa_desc *sd, const float *k, const float *v, float *blk) {
    const int64_t L = s->L;
    float *bk = blk, *bv = blk + s->B * s->Hkv * L * s->D, *bm = bv + s->B * s->Hkv * L * s->Dv;
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->Hkv; h++)
            for (int64_t j = 0; j < L; j++) {
                const float *kr = k + b * sd->k_stride[0] + h * sd->k_stride[1] + j * sd->k_stride[2];
                const float *vr = v + b * sd->v_stride[0] + h * sd->v_stride[1] + j * sd->v_stride[2];
                float *dk = bk + ((b * s->Hkv + h) * L + j) * s->D, *dv = bv + ((b * s->Hkv + h) * L + j) * s->Dv;
                for (int64_t t = 0; t < s->D; t++) dk[t] = kr[t * sd->k_stride[3]];
                for (int64_t t = 0; t < s->Dv; t++) dv[t] = vr[t * sd->v_stride[3]];
            }
    if (!s->kpm) return;
    const char *m = sd->key_padding_mask;
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t j = 0; j < L; j++) {
            const int64_t e = b * sd->key_padding_mask_stride[0] + j * sd->key_padding_mask_stride[1];
            if (m == NULL) bm[b * L + j] = 0.0f;
            else if (sd->key_padding_mask_dtype == ATTN_DTYPE_BOOL) bm[b * L + j] = m[e] ? -INFINITY : 0.0f;
            else bm[b * L + j] = ((const float *)(const void *)m)[e];
        }
}

// (B, H, L, D) at strides <-> contiguous.
static void copy_view(const float *src, const int64_t ss[4], float *dst, const int64_t ds[4], const int64_t n[4]) {
    for (int64_t b = 0; b < n[0]; b++)
        for (int64_t h = 0; h < n[1]; h++)
            for (int64_t i = 0; i < n[2]; i++) {
                const float *x = src + b * ss[0] + h * ss[1] + i * ss[2];
                float *y = dst + b * ds[0] + h * ds[1] + i * ds[2];
                for (int64_t t = 0; t < n[3]; t++) y[t * ds[3]] = x[t * ss[3]];
            }
}

// The calls of one step: a range of local query rows against a range of the block's key rows.
typedef struct cp_call {
    int64_t q0, nq, k0, nk;
    bool diag; // same chunk: query row i sees key rows <= i
} cp_call;

// The visible (query chunk, key chunk) pairs of the rank's rows against block `kc`, grouped.
static int step_calls(const cp_chunks *qc, const cp_chunks *kc, bool causal, cp_call calls[4]) {
    int n = 0;
    if (qc->total == 0 || kc->total == 0) return 0;
    if (!causal) {
        calls[n++] = (cp_call){0, qc->total, 0, kc->total, false};
        return n;
    }
    unsigned full[2] = {0, 0}; // per query chunk: the key chunks it sees whole
    for (int a = 0; a < qc->n; a++)
        for (int c = 0; c < kc->n; c++) {
            if (qc->len[a] == 0 || kc->len[c] == 0) continue;
            if (kc->start[c] + kc->len[c] <= qc->start[a]) full[a] |= 1u << c;
            else if (kc->start[c] == qc->start[a]) // the same chunk (chunks partition the sequence)
                calls[n++] = (cp_call){qc->local[a], qc->len[a], kc->local[c], kc->len[c], true};
            // else the keys all follow the queries: hidden
        }
    // key chunks are adjacent in the block, so a set of them is one row range
    for (int a = 0; a < qc->n; a++) {
        if (full[a] == 0) continue;
        const int c0 = (full[a] & 1u) ? 0 : 1, c1 = (full[a] & 2u) ? 1 : 0;
        const int64_t k0 = kc->local[c0], k1 = kc->local[c1] + kc->len[c1];
        if (a == 0 && qc->n == 2 && full[1] == full[0]) { // both query chunks: one call
            calls[n++] = (cp_call){0, qc->total, k0, k1 - k0, false};
            break;
        }
        calls[n++] = (cp_call){qc->local[a], qc->len[a], k0, k1 - k0, false};
    }
    return n;
}

// Piece p of np over n rows: [*r0, *r1).
static void piece(int64_t n, int64_t np, int64_t p, int64_t *r0, int64_t *r1) {
    const int64_t q = n / np, r = n % np;
    *r0 = p * q + (p < r ? p : r);
    *r1 = *r0 + q + (p < r ? 1 : 0);
}

static int64_t n_pieces(const attn_cp *cp, int64_t rows) {
    if (cp->poll_rows < 0) return 1;
    if (cp->poll_rows > 0) return (rows + cp->poll_rows - 1) / cp->poll_rows;
    const int64_t by_max = (rows + AUTO_MAX_ROWS - 1) / AUTO_MAX_ROWS, by_min = rows / AUTO_MIN_ROWS;
    const int64_t want = by_min < AUTO_PIECES ? by_min : AUTO_PIECES;
    return by_max > want ? by_max : want > 1 ? want : 1;
}

// Query-key pairs of one call (per batch and head).
static double call_cells(int64_t nq, int64_t nk, attn_causal causal) {
    if (causal == ATTN_CAUSAL_NONE) return (double)nq * (double)nk;
    return (double)nq * (double)(nk - nq) + (double)nq * (double)(nq + 1) / 2.0; // bottom-right, nk >= nq
}

// ---- forward ---------------------------------------------------------------------------------

typedef struct fwd_run {
    attn_cp *cp;
    attn_ctx *ctx;
    const attn_cp_desc *desc;
    const cp_shape *s;
    cp_bufs *b;
    const float *q;
    float *out;
} fwd_run;

// Merges a call's (o_blk, lse_blk) for rows [q0, q0 + nq) into the running out and lse.
static void merge_rows(const fwd_run *R, int64_t q0, int64_t nq) {
    const cp_shape *s = R->s;
    const int64_t *os = R->desc->sdpa.o_stride;
    for (int64_t bh = 0; bh < s->B * s->H; bh++) {
        const int64_t b = bh / s->H, h = bh % s->H;
        for (int64_t i = 0; i < nq; i++) {
            const double lb = R->b->lse_blk[bh * nq + i];
            if (lb == -INFINITY) continue; // no key of the block is visible to this row
            double *lr = &R->b->lse_run[bh * s->L + q0 + i];
            float *o = R->out + b * os[0] + h * os[1] + (q0 + i) * os[2];
            const float *ob = R->b->o_blk + (bh * nq + i) * s->Dv;
            if (*lr == -INFINITY) {
                for (int64_t t = 0; t < s->Dv; t++) o[t * os[3]] = ob[t];
                *lr = lb;
                continue;
            }
            const double m = *lr > lb ? *lr : lb;
            const double ln = m + log(exp(*lr - m) + exp(lb - m));
            const double wa = exp(*lr - ln), wb = exp(lb - ln);
            for (int64_t t = 0; t < s->Dv; t++) o[t * os[3]] = (float)(wa * (double)o[t * os[3]] + wb * (double)ob[t]);
            *lr = ln;
        }
    }
}

// Attention sinks (sdpa.sinks): once every block is merged, each row's sink joins its normaliser as
// one more term exp(sinks[h]), as attn_sdpa_fwd adds it once a row's keys are summed: lse becomes
// log(exp(lse) + exp(sink)) and the row is scaled by exp(lse - that). A row that saw no key keeps its
// zeros, its lse the sink; a NaN or +inf sink makes the row NaN. (The block calls never see sinks:
// call_desc leaves them out, and the backward's block calls take this lse.)
static void fold_sinks(const fwd_run *R) {
    const cp_shape *s = R->s;
    const int64_t *os = R->desc->sdpa.o_stride;
    const float *sinks = R->desc->sdpa.sinks;
    for (int64_t bh = 0; bh < s->B * s->H; bh++) {
        const int64_t b = bh / s->H, h = bh % s->H;
        const double z = sinks[h];
        if (z == -INFINITY) continue; // no sink for this head
        for (int64_t i = 0; i < s->L; i++) {
            double *lr = &R->b->lse_run[bh * s->L + i];
            const double top = z > *lr ? z : *lr;
            const double ln = top + log(exp(*lr - top) + exp(z - top));
            const double w = exp(*lr - ln);
            float *o = R->out + b * os[0] + h * os[1] + i * os[2];
            for (int64_t t = 0; t < s->Dv; t++) o[t * os[3]] = (float)(w * (double)o[t * os[3]]);
            *lr = ln;
        }
    }
}

static attn_status fwd_call(const fwd_run *R, const float *blk, int64_t So, int64_t q0, int64_t nq, int64_t k0,
                            int64_t nk, attn_causal causal) {
    const cp_shape *s = R->s;
    const float *bk = blk, *bv = blk + s->B * s->Hkv * So * s->D, *bm = bv + s->B * s->Hkv * So * s->Dv;
    attn_sdpa_desc d;
    call_desc(R->desc, s, So, nq, nk, causal, s->kpm ? bm + k0 : NULL, &d);
    packed_strides(s->H, nq, s->Dv, d.o_stride);
    const float *q = R->q + q0 * R->desc->sdpa.q_stride[2];
    const attn_status st = attn_sdpa_fwd(R->ctx, &d, q, bk + k0 * s->D, bv + k0 * s->Dv, R->b->o_blk, R->b->lse_blk, NULL);
    if (st != ATTN_OK) return cp_fail(R->cp, st, "block call: %s", attn_ctx_last_error(R->ctx));
    merge_rows(R, q0, nq);
    R->cp->stats.cells += call_cells(nq, nk, causal) * (double)(s->B * s->H);
    R->cp->stats.kernel_calls++;
    return ATTN_OK;
}

attn_status attn_cp_fwd(attn_cp *cp, attn_ctx *ctx, const attn_cp_desc *desc, const float *q, const float *k,
                        const float *v, float *out, float *lse) {
    if (cp == NULL) return ATTN_ERR_INVALID_ARG;
    cp->err[0] = '\0';
    const double t_start = MPI_Wtime();
    cp_args a = {.q = q, .k = k, .v = v, .out = out, .bwd = false, .check_ptrs = true};
    cp_shape s;
    cp_bufs b;
    attn_status st = prepare(cp, ctx, desc, &a, &s, &b);
    ATTN_CP_RETURN_IF_ERR(agree(cp, st, desc, false, &s));
    const int P = cp->world, r = cp->rank, right = (r + 1) % P, left = (r + P - 1) % P;
    memset(&cp->stats, 0, sizeof cp->stats);
    cp->stats.steps = P;
    const attn_sdpa_desc *sd = &desc->sdpa;
    const int64_t rows = s.B * s.H * s.L;
    for (int64_t e = 0; e < rows; e++) b.lse_run[e] = -INFINITY;
    const int64_t no[4] = {s.B, s.H, s.L, s.Dv}, zs[4] = {0, 0, 0, 0};
    static const float zero = 0.0f;
    if (s.L > 0) copy_view(&zero, zs, out, sd->o_stride, no);
    if (s.L > 0) pack_block(&s, sd, k, v, b.kv[0]);

    fwd_run R = {cp, ctx, desc, &s, &b, q, out};
    cp_xfer xs[2] = {{.n = 0}, {.n = 0}}; // receive, send
    attn_status kst = ATTN_OK;            // a kernel failure: the ring goes on without computing
    int cur = 0;
    for (int step = 0; step < P && st == ATTN_OK; step++) {
        const int o = (r - step + P) % P, onext = (o + P - 1) % P;
        cp_chunks kc, kn;
        attn__cp_chunks_of(&desc->layout, o, &kc);
        attn__cp_chunks_of(&desc->layout, onext, &kn);
        if (step < P - 1) {
            st = xfer_post(cp, &xs[0], b.kv[1 - cur], kn.total * s.kv_tok, left, TAG_KV, false);
            if (st == ATTN_OK) st = xfer_post(cp, &xs[1], b.kv[cur], kc.total * s.kv_tok, right, TAG_KV, true);
            if (st != ATTN_OK) break;
            cp->stats.kv_bytes += kc.total * s.kv_tok * (int64_t)sizeof(float);
        }
        cp_call calls[4];
        const int nc = kst == ATTN_OK ? step_calls(&s.mine, &kc, s.causal, calls) : 0;
        for (int c = 0; c < nc && kst == ATTN_OK; c++) {
            const int64_t np = n_pieces(cp, calls[c].nq);
            for (int64_t p = 0; p < np && kst == ATTN_OK; p++) {
                int64_t r0, r1;
                piece(calls[c].nq, np, p, &r0, &r1);
                const double t0 = MPI_Wtime();
                if (calls[c].diag)
                    kst = fwd_call(&R, b.kv[cur], kc.total, calls[c].q0 + r0, r1 - r0, calls[c].k0, r1,
                                   r0 == 0 ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_BOTTOM_RIGHT);
                else
                    kst = fwd_call(&R, b.kv[cur], kc.total, calls[c].q0 + r0, r1 - r0, calls[c].k0, calls[c].nk,
                                   ATTN_CAUSAL_NONE);
                cp->stats.compute_s += MPI_Wtime() - t0;
                xfer_poll(cp, xs, 2);
            }
        }
        st = xfer_wait(cp, &xs[0]);
        if (st == ATTN_OK) st = xfer_wait(cp, &xs[1]);
        cur = 1 - cur;
    }
    if (st != ATTN_OK) return st; // MPI failed: the other ranks cannot be relied on
    if (kst == ATTN_OK && sd->sinks != NULL) fold_sinks(&R);
    if (lse != NULL)
        for (int64_t e = 0; e < rows; e++) lse[e] = (float)b.lse_run[e];
    cp->stats.total_s = MPI_Wtime() - t_start;
    cp->stats.flops = cp->stats.cells * 2.0 * (double)(s.D + s.Dv);
    return agree_end(cp, kst);
}

// ---- backward --------------------------------------------------------------------------------

typedef struct bwd_run {
    attn_cp *cp;
    attn_ctx *ctx;
    const attn_cp_desc *desc;
    const cp_shape *s;
    cp_bufs *b;
    const float *q, *out, *dout, *lse; // q, out, dout contiguous (B, H, L, .)
    float *dq_acc;                     // contiguous (B, H, L, D)
} bwd_run;

// Adds rows [r0, r0 + n) of the (B, X, R, W) contiguous src into dst.
static void add_rows(float *dst, const float *src, int64_t BX, int64_t R, int64_t W, int64_t r0, int64_t n) {
    for (int64_t bx = 0; bx < BX; bx++) {
        float *y = dst + (bx * R + r0) * W;
        const float *x = src + (bx * R + r0) * W;
        for (int64_t e = 0; e < n * W; e++) y[e] += x[e];
    }
}

// One call: its dq rows into dq_acc, its dk/dv rows into the step's accumulator `acc`.
static attn_status bwd_call(const bwd_run *R, const float *blk, float *acc, int64_t So, int64_t q0, int64_t nq,
                            int64_t k0, int64_t nk, attn_causal causal) {
    const cp_shape *s = R->s;
    const int64_t kvD = s->B * s->Hkv * So * s->D;
    const float *bk = blk, *bv = blk + kvD, *bm = bv + s->B * s->Hkv * So * s->Dv;
    attn_sdpa_desc d;
    call_desc(R->desc, s, So, nq, nk, causal, s->kpm ? bm + k0 : NULL, &d);
    packed_strides(s->H, s->L, s->D, d.q_stride);
    packed_strides(s->H, s->L, s->Dv, d.o_stride);
    for (int64_t bh = 0; bh < s->B * s->H; bh++) // the call's rows of lse, contiguous
        memcpy(R->b->lse_g + bh * nq, R->lse + bh * s->L + q0, (size_t)nq * sizeof(float));
    float *tk = R->b->dkv_tmp, *tv = R->b->dkv_tmp + kvD;
    const attn_status st = attn_sdpa_bwd(R->ctx, &d, R->q + q0 * s->D, bk + k0 * s->D, bv + k0 * s->Dv,
                                         R->out + q0 * s->Dv, R->dout + q0 * s->Dv, R->b->lse_g, NULL,
                                         R->b->dq_tmp + q0 * s->D, tk + k0 * s->D, tv + k0 * s->Dv, NULL);
    if (st != ATTN_OK) return cp_fail(R->cp, st, "block call: %s", attn_ctx_last_error(R->ctx));
    add_rows(R->dq_acc, R->b->dq_tmp, s->B * s->H, s->L, s->D, q0, nq);
    add_rows(acc, tk, s->B * s->Hkv, So, s->D, k0, nk);
    add_rows(acc + kvD, tv, s->B * s->Hkv, So, s->Dv, k0, nk);
    R->cp->stats.cells += call_cells(nq, nk, causal) * (double)(s->B * s->H);
    R->cp->stats.kernel_calls++;
    return ATTN_OK;
}

static void add_all(float *dst, const float *src, int64_t n) {
    for (int64_t e = 0; e < n; e++) dst[e] += src[e];
}

attn_status attn_cp_bwd(attn_cp *cp, attn_ctx *ctx, const attn_cp_desc *desc, const float *q, const float *k,
                        const float *v, const float *out, const float *dout, const float *lse, float *dq, float *dk,
                        float *dv) {
    if (cp == NULL) return ATTN_ERR_INVALID_ARG;
    cp->err[0] = '\0';
    const double t_start = MPI_Wtime();
    cp_args a = {.q = q, .k = k, .v = v, .out = out, .dout = dout, .lse = lse, .dq = dq, .dk = dk, .dv = dv,
                 .bwd = true, .check_ptrs = true};
    cp_shape s;
    cp_bufs b;
    attn_status st = prepare(cp, ctx, desc, &a, &s, &b);
    ATTN_CP_RETURN_IF_ERR(agree(cp, st, desc, true, &s));
    const int P = cp->world, r = cp->rank, right = (r + 1) % P, left = (r + P - 1) % P;
    memset(&cp->stats, 0, sizeof cp->stats);
    cp->stats.backward = 1;
    cp->stats.steps = P;
    const attn_sdpa_desc *sd = &desc->sdpa;
    const int64_t nq4[4] = {s.B, s.H, s.L, s.D}, no4[4] = {s.B, s.H, s.L, s.Dv};
    int64_t qs[4], os[4];
    packed_strides(s.H, s.L, s.D, qs);
    packed_strides(s.H, s.L, s.Dv, os);
    bwd_run R = {cp, ctx, desc, &s, &b, q, out, dout, lse, s.q_packed ? dq : b.dq_acc};
    if (s.L > 0) {
        if (!s.q_packed) copy_view(q, sd->q_stride, b.q_pack, qs, nq4), R.q = b.q_pack;
        if (!s.o_packed) {
            copy_view(out, sd->o_stride, b.o_pack, os, no4), R.out = b.o_pack;
            copy_view(dout, sd->o_stride, b.do_pack, os, no4), R.dout = b.do_pack;
        }
        memset(R.dq_acc, 0, (size_t)(s.B * s.H * s.L * s.D) * sizeof(float));
        pack_block(&s, sd, k, v, b.kv[0]);
    }

    cp_xfer xs[4] = {{.n = 0}, {.n = 0}, {.n = 0}, {.n = 0}}; // kv receive, kv send, dkv receive, dkv send
    attn_status kst = ATTN_OK;
    int cur = 0, in = 0; // kv[cur]: the block computed on; dkv[in]: its gradient accumulator
    for (int step = 0; step < P && st == ATTN_OK; step++) {
        const int o = (r - step + P) % P, onext = (o + P - 1) % P;
        cp_chunks kc, kn;
        attn__cp_chunks_of(&desc->layout, o, &kc);
        attn__cp_chunks_of(&desc->layout, onext, &kn);
        const int64_t dkv_n = kc.total * s.dkv_tok;
        if (step < P - 1) {
            st = xfer_post(cp, &xs[0], b.kv[1 - cur], kn.total * s.kv_tok, left, TAG_KV, false);
            if (st == ATTN_OK) st = xfer_post(cp, &xs[1], b.kv[cur], kc.total * s.kv_tok, right, TAG_KV, true);
            cp->stats.kv_bytes += kc.total * s.kv_tok * (int64_t)sizeof(float);
        }
        // the accumulator of block o, from the rank before (free: its send was waited last step)
        if (st == ATTN_OK && step > 0) st = xfer_post(cp, &xs[2], b.dkv[in], dkv_n, left, TAG_DKV, false);
        if (st != ATTN_OK) break;
        float *acc = step == 0 ? b.dkv[in] : b.dkv_step;
        memset(acc, 0, (size_t)dkv_n * sizeof(float));
        cp_call calls[4];
        const int nc = kst == ATTN_OK ? step_calls(&s.mine, &kc, s.causal, calls) : 0;
        for (int c = 0; c < nc && kst == ATTN_OK; c++) {
            const int64_t np = n_pieces(cp, calls[c].nq);
            for (int64_t p = 0; p < np && kst == ATTN_OK; p++) {
                int64_t r0, r1;
                piece(calls[c].nq, np, p, &r0, &r1);
                const double t0 = MPI_Wtime();
                if (calls[c].diag)
                    kst = bwd_call(&R, b.kv[cur], acc, kc.total, calls[c].q0 + r0, r1 - r0, calls[c].k0, r1,
                                   r0 == 0 ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_BOTTOM_RIGHT);
                else
                    kst = bwd_call(&R, b.kv[cur], acc, kc.total, calls[c].q0 + r0, r1 - r0, calls[c].k0, calls[c].nk,
                                   ATTN_CAUSAL_NONE);
                cp->stats.compute_s += MPI_Wtime() - t0;
                xfer_poll(cp, xs, 4);
            }
        }
        if (step > 0) {
            st = xfer_wait(cp, &xs[2]);
            if (st != ATTN_OK) break;
            const double t0 = MPI_Wtime();
            add_all(b.dkv[in], b.dkv_step, dkv_n); // contributions of ranks o..r-1, then r's
            cp->stats.compute_s += MPI_Wtime() - t0;
        }
        if (P > 1) { // on to the next rank; the last step's goes home to its owner
            st = xfer_wait(cp, &xs[3]);
            if (st == ATTN_OK) st = xfer_post(cp, &xs[3], b.dkv[in], dkv_n, right, TAG_DKV, true);
            if (st != ATTN_OK) break;
            cp->stats.dkv_bytes += dkv_n * (int64_t)sizeof(float);
            in = 1 - in;
        }
        st = xfer_wait(cp, &xs[0]);
        if (st == ATTN_OK) st = xfer_wait(cp, &xs[1]);
        cur = 1 - cur;
    }
    if (st == ATTN_OK && P > 1) { // this rank's own block, having been round the ring
        st = xfer_post(cp, &xs[2], b.dkv[in], s.L * s.dkv_tok, left, TAG_DKV, false);
        if (st == ATTN_OK) st = xfer_wait(cp, &xs[2]);
        if (st == ATTN_OK) st = xfer_wait(cp, &xs[3]);
    }
    if (st != ATTN_OK) return st;
    if (s.L > 0 && kst == ATTN_OK) {
        const int64_t nk4[4] = {s.B, s.Hkv, s.L, s.D}, nv4[4] = {s.B, s.Hkv, s.L, s.Dv};
        int64_t ks[4], vs[4];
        packed_strides(s.Hkv, s.L, s.D, ks);
        packed_strides(s.Hkv, s.L, s.Dv, vs);
        copy_view(b.dkv[in], ks, dk, sd->k_stride, nk4);
        copy_view(b.dkv[in] + s.B * s.Hkv * s.L * s.D, vs, dv, sd->v_stride, nv4);
        if (!s.q_packed) copy_view(b.dq_acc, qs, dq, sd->q_stride, nq4);
    }
    cp->stats.total_s = MPI_Wtime() - t_start;
    cp->stats.flops = cp->stats.cells * (6.0 * (double)s.D + 4.0 * (double)s.Dv);
    return agree_end(cp, kst);
}

// plan.c - host-side checks and planning of libattn_cuda's calls (see plan.h). No CUDA here: the
// same code runs in the library and, against described devices, in tests/cuda/test_cuda_plan.c.
#include "plan.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../philox.h"

attn_status attn__cuda_fail(attn__cuda_err *e, attn_status st, const char *fmt, ...) {
    if (e != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

// A failure of libattn's shared checks: its message becomes ours.
static attn_status shared_fail(attn__cuda_err *e, attn_status st) {
    if (st != ATTN_OK) attn__cuda_fail(e, st, "%s", attn_ctx_last_error(e->host));
    return st;
}

const char *attn__cuda_kernel_name(attn__cuda_kernel k) {
    switch (k) {
    case ATTN__CU_KERNEL_SIMPLE: return "simple";
    case ATTN__CU_KERNEL_FLASH: return "flash";
    case ATTN__CU_KERNEL_DECODE: return "decode";
    case ATTN__CU_KERNEL_DECODE_VEC: return "decode-vec";
    case ATTN__CU_KERNEL_FLASH_SM90: return "flash-sm90";
    }
    return "?";
}

size_t attn__cuda_ws_take(size_t *used, size_t bytes) {
    const size_t at = (*used + ATTN__CU_WS_ALIGN - 1) & ~(size_t)(ATTN__CU_WS_ALIGN - 1);
    *used = at + bytes;
    return at;
}

// ---- kernel resources (must agree with the kernels' own layouts) -------------------------------

// Simple kernel: 4 warps, each with a float q row (D) and accumulator (Dv) in shared memory.
size_t attn__cuda_simple_smem(const attn__cuda_sdpa_params *p) { return (size_t)(4 * (p->D + p->Dv)) * sizeof(float); }

// Simple backward (kernels/simple_bwd.cu): per warp q, dout and dq (the dq kernel), or k, v, dk and
// dv (the dk/dv kernel), as floats; 4 warps.
size_t attn__cuda_simple_bwd_smem(const attn__cuda_sdpa_params *p) {
    const size_t dq = (size_t)(4 * (2 * p->D + p->Dv)) * sizeof(float);
    const size_t dkdv = (size_t)(4 * 2 * (p->D + p->Dv)) * sizeof(float);
    return dq > dkdv ? dq : dkdv;
}

// Flash kernel: Q (Br rows) and STAGES tiles of K and V (Bc rows), rows padded by 8 elements. The
// tile shapes are those of kernels/flash_traits.cuh's 8-warp form (one table, copied here for the
// host); its 4-warp ("wide") form has the same Br and key tiles no longer, so no more shared memory.
typedef struct flash_shape {
    int d, br, bc, stages;
} flash_shape;
static const flash_shape flash_shapes[] = {{32, 128, 128, 2}, {64, 128, 128, 2}, {96, 128, 64, 2}, {128, 128, 64, 2},
                                           {256, 128, 32, 2}};

static const flash_shape *flash_shape_of(int64_t d) {
    for (size_t i = 0; i < sizeof flash_shapes / sizeof flash_shapes[0]; i++)
        if (flash_shapes[i].d == d) return &flash_shapes[i];
    return NULL;
}

size_t attn__cuda_flash_smem(int head_dim) {
    const flash_shape *f = flash_shape_of(head_dim);
    if (f == NULL) return 0;
    return (size_t)(f->br + 2 * f->stages * f->bc) * (size_t)(f->d + 8) * 2;
}

// Hopper forward (kernels/flash_sm90.cuh): Q (128 rows) and two stages of K and V tiles of 128 rows,
// unpadded (128-byte swizzle), and 1024 bytes to align them; head dims 64 and 128.
size_t attn__cuda_flash_sm90_smem(int head_dim) {
    if (head_dim != 64 && head_dim != 128) return 0;
    return (size_t)(128 + 2 * 2 * 128) * (size_t)head_dim * 2 + 1024;
}

// Tensor-core backward: the tile shapes of kernels/flash_traits.cuh's FlashBwdTraits (copied here):
// dK/dV kernel key tiles of 64 rows, query tiles of 64 rows (D = 32) or 32, K, V, Q, dO, dS^T, lse
// and D in shared memory; deterministic dQ kernel 64 query rows, key tiles of 64 rows (32 at
// D = 256) in two stages; at D = 256 two blocks a tile, each accumulating 128 columns of the gradients.
static bool flash_bwd_dim(int64_t d) { return d == 32 || d == 64 || d == 96 || d == 128 || d == 256; }
static int64_t flash_bwd_slices(int64_t d) { return d > 128 ? d / 128 : 1; }

size_t attn__cuda_flash_bwd_smem(int head_dim, bool deterministic) {
    if (!flash_bwd_dim(head_dim)) return 0;
    const size_t ld = (size_t)head_dim + 8, bc = 64, br = head_dim <= 32 ? 64 : 32, bcq = head_dim <= 128 ? 64 : 32;
    const size_t dkdv = (2 * bc + 2 * br) * ld * 2 + bc * (br + 8) * 2 + 2 * br * sizeof(float);
    const size_t dq = (2 * 64 + 2 * 2 * bcq) * ld * 2;
    return deterministic && dq > dkdv ? dq : dkdv;
}

// ---- SDPA ------------------------------------------------------------------------------------

static bool float_dtype(int32_t t) { return t == ATTN_DTYPE_F32 || t == ATTN_DTYPE_F16 || t == ATTN_DTYPE_BF16; }
static bool fast_dtype(int32_t t) { return t == ATTN_DTYPE_BF16 || t == ATTN_DTYPE_F16; }
static bool fast_dim(int64_t d) { return flash_shape_of(d) != NULL; }
static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

// A view read or written 16 bytes at a time: unit stride along D, other strides multiples of 8
// elements (2-byte types), base pointer 16-byte aligned (NULL: not known yet, not checked).
static bool vec_view(const int64_t s[4], const void *ptr) {
    return s[3] == 1 && s[0] % 8 == 0 && s[1] % 8 == 0 && s[2] % 8 == 0 && (ptr == NULL || aligned16(ptr));
}

static int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); } // a >= 0, b > 0: no overflow

// Whether the tensor-core kernels may take the call's operands: q, k, v, out all BF16 or all F16,
// head_dim = head_dim_v and dim_ok (an instance exists), q, k, v read 16 bytes at a time, sm_80 or
// later, kernels not forced to SIMPLE. (The caller checks the views the kernel moves 16 bytes at a
// time besides these: out for the forward, dout for the backward.)
static bool flash_operands(const attn__cuda_sdpa_params *p, const attn__cuda_device *dev, attn_cuda_kernels kernels,
                           bool dim_ok, const void *q, const void *k, const void *v) {
    const bool same = p->q_dtype == p->kv_dtype && p->kv_dtype == p->out_dtype && fast_dtype(p->q_dtype);
    return kernels != ATTN_CUDA_KERNELS_SIMPLE && dev->cc_major >= 8 && same && p->D == p->Dv && dim_ok &&
           vec_view(p->q_stride, q) && vec_view(p->k_stride, k) && vec_view(p->v_stride, v);
}

// The shared descriptor checks for the call's form.
static attn_status check_desc(attn__cuda_err *e, const attn_sdpa_desc *d, const attn__cuda_seqs *s) {
    if (s != NULL) return shared_fail(e, attn_sdpa_varlen_desc_check(e->host, d, s->cu_q, s->cu_k));
    return shared_fail(e, attn_sdpa_desc_check(e->host, d));
}

static attn_status gpu_limits(attn__cuda_err *e, const attn_sdpa_desc *d, int64_t D, int64_t Dv) {
    if (d->dropout_p != 0.0 && d->dropout_rng != ATTN_DROPOUT_RNG_PHILOX)
        return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED,
                               "cuda sdpa: dropout from the context's generator is CPU-only (dropout_p %g); the GPU "
                               "draws dropout_rng = ATTN_DROPOUT_RNG_PHILOX",
                               d->dropout_p);
    if (d->weights_mode != ATTN_WEIGHTS_NONE)
        return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED, "cuda sdpa: the attention weights output is not available on the GPU");
    if (d->sinks != NULL)
        return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED, "cuda sdpa: attention sinks (sinks) are not available on the GPU yet");
    if (!float_dtype(d->q_dtype) || !float_dtype(d->kv_dtype) || !float_dtype(d->out_dtype))
        return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED, "cuda sdpa: q, k, v and out must be F32, F16 or BF16 on the GPU (k, v: %s)",
                               attn_dtype_name(d->kv_dtype));
    if (D > ATTN__CU_MAX_HEAD_DIM || Dv > ATTN__CU_MAX_HEAD_DIM)
        return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED, "cuda sdpa: head_dim %lld / head_dim_v %lld above %d", (long long)D,
                               (long long)Dv, ATTN__CU_MAX_HEAD_DIM);
    return ATTN_OK;
}

attn_status attn__cuda_plan_sdpa(attn__cuda_err *e, const attn__cuda_device *dev, attn_cuda_kernels kernels,
                                 const attn_sdpa_desc *d, const attn__cuda_seqs *seqs, const void *q,
                                 const void *k, const void *v, const void *out, attn__cuda_sdpa_plan *plan) {
    memset(plan, 0, sizeof *plan);
    if (d == NULL) return attn__cuda_fail(e, ATTN_ERR_INVALID_ARG, "cuda sdpa: desc is NULL");
    ATTN__CU_TRY(check_desc(e, d, seqs));
    attn__cuda_sdpa_params *p = &plan->p;
    const bool packed = seqs != NULL;
    p->B = d->batch, p->H = d->n_heads, p->Hkv = d->n_kv_heads == 0 ? d->n_heads : d->n_kv_heads;
    p->group = p->H / p->Hkv, p->L = d->len_q, p->S = d->len_kv, p->D = d->head_dim;
    p->Dv = d->head_dim_v == 0 ? d->head_dim : d->head_dim_v;
    ATTN__CU_TRY(gpu_limits(e, d, p->D, p->Dv));
    if (packed) { // len_q and len_kv only bound a packed batch's sequences: the grids take the longest
        p->L = p->S = 0; // (the shared check refuses a batch without queries or without keys)
        for (int64_t b = 0; b < p->B; b++) {
            const int64_t lq = seqs->cu_q[b + 1] - seqs->cu_q[b], lk = seqs->cu_k[b + 1] - seqs->cu_k[b];
            p->L = lq > p->L ? lq : p->L, p->S = lk > p->S ? lk : p->S;
        }
    }
    memcpy(p->q_stride, d->q_stride, sizeof p->q_stride);
    memcpy(p->k_stride, d->k_stride, sizeof p->k_stride);
    memcpy(p->v_stride, d->v_stride, sizeof p->v_stride);
    memcpy(p->o_stride, d->o_stride, sizeof p->o_stride);
    memcpy(p->mask_stride, d->mask_stride, sizeof p->mask_stride);
    memcpy(p->kpm_stride, d->key_padding_mask_stride, sizeof p->kpm_stride);
    // Strides of length-1 dimensions never reach an element: 0, so they do not defeat alignment.
    // A packed batch's rows are the sequences' rows one after another: its row stride is used
    // whatever the longest sequence's length (a batch of single queries included).
    const int64_t nq[4] = {p->B, p->H, p->L, p->D}, nk[4] = {p->B, p->Hkv, p->S, p->D};
    const int64_t nv[4] = {p->B, p->Hkv, p->S, p->Dv}, no[4] = {p->B, p->H, p->L, p->Dv};
    for (int i = 0; i < 4; i++) {
        if (packed && i == 2) continue;
        if (nq[i] == 1) p->q_stride[i] = 0;
        if (no[i] == 1) p->o_stride[i] = 0;
        if (nk[i] == 1) p->k_stride[i] = 0;
        if (nv[i] == 1) p->v_stride[i] = 0;
    }
    if (packed) p->q_stride[0] = p->o_stride[0] = p->k_stride[0] = p->v_stride[0] = 0;
    p->q_dtype = d->q_dtype, p->kv_dtype = d->kv_dtype, p->out_dtype = d->out_dtype;
    p->mask = d->mask, p->mask_dtype = d->mask_dtype;
    p->kpm = d->key_padding_mask, p->kpm_dtype = d->key_padding_mask_dtype;
    p->alibi = d->alibi_slopes;
    p->scale = d->scale != 0.0f ? d->scale : (float)(1.0 / sqrt((double)p->D));
    p->softcap = d->softcap;
    p->causal = (int32_t)d->causal, p->use_window = d->use_window != 0;
    p->window_left = d->window_left, p->window_right = d->window_right;
    if (d->dropout_p > 0.0) {
        p->dropout = 1, p->drop_seed = d->dropout_seed, p->drop_offset = d->dropout_offset;
        p->drop_threshold = attn__philox_keep_threshold(d->dropout_p);
        p->keep_scale = d->dropout_p >= 1.0 ? 0.0f : 1.0f / (float)(1.0 - d->dropout_p);
    }
    plan->total_q = packed ? seqs->cu_q[p->B] : p->B * p->L;
    if (packed) {
        p->lse_stride[0] = 0, p->lse_stride[1] = plan->total_q, p->lse_stride[2] = 1;
    } else {
        p->lse_stride[0] = p->H * p->L, p->lse_stride[1] = p->L, p->lse_stride[2] = 1;
    }

    // ---- the kernel ----
    attn__cuda_kernel kern = ATTN__CU_KERNEL_SIMPLE;
    if (flash_operands(p, dev, kernels, fast_dim(p->D), q, k, v) && vec_view(p->o_stride, out) &&
        attn__cuda_flash_smem((int)p->D) <= dev->smem_optin)
        kern = ATTN__CU_KERNEL_FLASH;
    // ... on Hopper when asked (ATTN_CUDA_KERNELS_SM90, a build with sm_90a code): the warpgroup-MMA
    // form for its head dims, the bounds alone, no dropout and keys in sequence order
    const size_t sm90_smem = attn__cuda_flash_sm90_smem((int)p->D);
    if (kern == ATTN__CU_KERNEL_FLASH && kernels == ATTN_CUDA_KERNELS_SM90 && dev->flash_sm90 && sm90_smem != 0 &&
        sm90_smem <= dev->smem_optin && !attn__cuda_elementwise(p) && !p->dropout && (seqs == NULL || seqs->page_size == 0))
        kern = ATTN__CU_KERNEL_FLASH_SM90;
    // Few query rows per kv head (decoding): split-KV, every row of a group in one warp. 16 rows of
    // head dims above 128 would hold 128 accumulators a lane: those stay on the other kernels.
    const int64_t rows = p->group * p->L, dmax = p->D > p->Dv ? p->D : p->Dv;
    if (kernels == ATTN_CUDA_KERNELS_AUTO && rows <= 16 && dmax <= 256 && !(rows > 4 && dmax > 128) &&
        (size_t)(rows * p->D) * sizeof(float) <= dev->smem_optin)
        kern = ATTN__CU_KERNEL_DECODE;
    // ... its vector form: BF16/F16 throughout, D = Dv of 64 or 128 read 16 bytes at a time, the
    // bounds alone (no masks, ALiBi, soft cap or dropout), at most 4 rows per kv head, and pages (of
    // a paged cache) that hold whole passes of a warp's loop (1024 / D keys: 8 or 16)
    if (kern == ATTN__CU_KERNEL_DECODE && rows <= 4 && p->D == p->Dv && (p->D == 64 || p->D == 128) &&
        flash_operands(p, dev, kernels, true, q, k, v) && !attn__cuda_elementwise(p) && !p->dropout &&
        (seqs == NULL || seqs->page_size % (1024 / p->D) == 0))
        kern = ATTN__CU_KERNEL_DECODE_VEC;
    if (kern == ATTN__CU_KERNEL_SIMPLE && attn__cuda_simple_smem(p) > dev->smem_optin)
        return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED, "cuda sdpa: head dims %lld/%lld need more shared memory than the device has",
                               (long long)p->D, (long long)p->Dv);
    plan->kernel = kern;
    const int64_t tile = kern == ATTN__CU_KERNEL_FLASH ? flash_shape_of(p->D)->br : kern == ATTN__CU_KERNEL_FLASH_SM90 ? 128 : 4;
    plan->row_blocks = ceil_div(p->L, tile);
    if (plan->row_blocks > INT32_MAX / (p->B * p->H))
        return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED, "cuda sdpa: %lld x %lld x %lld blocks exceed the grid's limit",
                               (long long)p->B, (long long)p->H, (long long)plan->row_blocks);
    // ---- the workspace: the device copy of the offsets; the decode splits' partial results ----
    size_t used = 0;
    if (packed) plan->ws_cu = attn__cuda_ws_take(&used, (size_t)(2 * (p->B + 1)) * sizeof(int64_t));
    if (kern == ATTN__CU_KERNEL_DECODE || kern == ATTN__CU_KERNEL_DECODE_VEC) {
        // splits of at least 32 keys, a multiple of 32, at most as many warps in all as the device
        // holds at once: the vector form's launch bounds (at most 168 registers a thread) fit 12
        // warps an SM (3 blocks of 4), so one wave of long splits; the general form 32 warps an SM
        // (two waves)
        const int64_t per_sm = kern == ATTN__CU_KERNEL_DECODE_VEC ? 12 : 32;
        const int64_t heads = p->B * p->Hkv, want = (int64_t)(dev->sm_count > 0 ? dev->sm_count : 1) * per_sm / heads;
        int64_t keys = ceil_div(p->S, want < 1 ? 1 : want);
        keys = ceil_div(keys < 32 ? 32 : keys, 32) * 32;
        plan->split_keys = keys, plan->n_splits = ceil_div(p->S, keys), plan->decode_rows = (int)rows;
        if (ceil_div(plan->n_splits, 4) > INT32_MAX / heads || heads * rows > INT32_MAX)
            return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED, "cuda sdpa: the decode grid exceeds its limit");
        plan->row_blocks = 1;
        plan->ws_part = attn__cuda_ws_take(&used, (size_t)(heads * plan->n_splits * rows * (2 + p->Dv)) * sizeof(float));
    }
    plan->ws_bytes = used > 0 ? used + ATTN__CU_WS_ALIGN - 1 : 0;
    return ATTN_OK;
}

attn_status attn__cuda_plan_sdpa_bwd(attn__cuda_err *e, const attn__cuda_device *dev, attn_cuda_kernels kernels,
                                     bool deterministic, const attn_sdpa_desc *d, const attn__cuda_seqs *seqs,
                                     bool dmask_wanted, const attn__cuda_bwd_tensors *t, attn__cuda_sdpa_plan *plan) {
    ATTN__CU_TRY(attn__cuda_plan_sdpa(e, dev, kernels, d, seqs, NULL, NULL, NULL, NULL, plan));
    attn__cuda_sdpa_params *p = &plan->p;
    if (dmask_wanted && (d->mask == NULL || d->mask_dtype != ATTN_DTYPE_F32))
        return attn__cuda_fail(e, ATTN_ERR_BAD_MASK, "cuda sdpa_bwd: dmask needs an F32 attention mask");
    p->mask_extent = 0;
    if (dmask_wanted) { // the elements the mask's strides reach (strides are checked >= 0 with the mask,
                        // the bytes of its largest offset to fit int64_t: no overflow here)
        const int64_t n[4] = {p->B, p->H, p->L, p->S};
        int64_t last = 0;
        for (int i = 0; i < 4; i++) last += (n[i] - 1) * p->mask_stride[i];
        p->mask_extent = last + 1;
    }
    // dq, dk and dv are written at q_stride, k_stride, v_stride: no two elements may share a place
    const int64_t nq[4] = {p->B, p->H, p->L, p->D}, nk[4] = {p->B, p->Hkv, p->S, p->D};
    const int64_t nv[4] = {p->B, p->Hkv, p->S, p->Dv};
    const bool packed = seqs != NULL;
    for (int i = 0; i < 4; i++) {
        if (packed && i == 0) continue; // a packed batch is one sequence of rows
        if ((nq[i] > 1 && d->q_stride[i] == 0) || (nk[i] > 1 && d->k_stride[i] == 0) || (nv[i] > 1 && d->v_stride[i] == 0))
            return attn__cuda_fail(e, ATTN_ERR_INVALID_ARG,
                                   "cuda sdpa_bwd: q, k and v strides must not be 0 on dimension %d: the gradients are "
                                   "written through them",
                                   i);
    }
    p->grad_dtype = d->grad_dtype;
    // ---- the kernels: tensor cores where the forward's would run (q, k, v, out and dout read 16
    // bytes at a time) and an instance exists, else the simple ones ----
    const attn__cuda_bwd_tensors none = {NULL, NULL, NULL, NULL, NULL};
    if (t == NULL) t = &none;
    plan->kernel = ATTN__CU_KERNEL_SIMPLE;
    plan->deterministic = deterministic;
    // Head dim 256 (two blocks a key tile) only when the mma.sync kernels are asked for by name
    // (SM80, SM90): AUTO keeps the simple kernels there until a GPU has run it (docs/cuda.md).
    const bool dim_ok = flash_bwd_dim(p->D) && (p->D <= 128 || kernels == ATTN_CUDA_KERNELS_SM80 || kernels == ATTN_CUDA_KERNELS_SM90);
    if (!dmask_wanted && flash_operands(p, dev, kernels, dim_ok, t->q, t->k, t->v) && vec_view(p->o_stride, t->out) &&
        vec_view(p->o_stride, t->dout) && attn__cuda_flash_bwd_smem((int)p->D, deterministic) <= dev->smem_optin)
        plan->kernel = ATTN__CU_KERNEL_FLASH;
    if (plan->kernel == ATTN__CU_KERNEL_SIMPLE && attn__cuda_simple_bwd_smem(p) > dev->smem_optin)
        return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED,
                               "cuda sdpa_bwd: head dims %lld/%lld need more shared memory than the device has",
                               (long long)p->D, (long long)p->Dv);
    // grids: rows of 4 queries per (b, h) (rowdot, dq conversion, simple dq; more blocks than the
    // deterministic dQ kernel's query tiles of 64 times its slices), key tiles of 64 times the slices
    // (flash dK/dV) or rows of 4 keys (simple) per (b, kv head)
    const bool flash = plan->kernel == ATTN__CU_KERNEL_FLASH;
    const int64_t kv_blocks = flash ? ceil_div(p->S, 64) * flash_bwd_slices(p->D) : ceil_div(p->S, 4);
    if (kv_blocks > INT32_MAX / (p->B * p->Hkv) || ceil_div(p->L, 4) > INT32_MAX / (p->B * p->H))
        return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED, "cuda sdpa_bwd: the grid exceeds its limit");
    plan->row_blocks = ceil_div(p->L, 4);
    // ---- the workspace: offsets, rowdot (lse's layout), the atomic mode's float32 dQ rows ----
    size_t used = 0;
    plan->ws_cu = plan->ws_part = plan->ws_dq_acc = 0;
    if (packed) plan->ws_cu = attn__cuda_ws_take(&used, (size_t)(2 * (p->B + 1)) * sizeof(int64_t));
    plan->ws_rowdot = attn__cuda_ws_take(&used, (size_t)(p->H * plan->total_q) * sizeof(float));
    if (plan->kernel == ATTN__CU_KERNEL_FLASH && !deterministic) {
        if ((uint64_t)(p->H * plan->total_q) > (uint64_t)(SIZE_MAX / 2 / sizeof(float)) / (uint64_t)p->D)
            return attn__cuda_fail(e, ATTN_ERR_OVERFLOW, "cuda sdpa_bwd: the dQ accumulator's size overflows");
        plan->ws_dq_acc = attn__cuda_ws_take(&used, (size_t)(p->H * plan->total_q * p->D) * sizeof(float));
    }
    plan->ws_bytes = used + ATTN__CU_WS_ALIGN - 1;
    return ATTN_OK;
}

const char *attn__cuda_bwd_kernel_name(const attn__cuda_sdpa_plan *plan) {
    if (plan->kernel == ATTN__CU_KERNEL_FLASH) return plan->deterministic ? "flash-deterministic" : "flash";
    return attn__cuda_kernel_name(plan->kernel);
}

// ---- KV caches -------------------------------------------------------------------------------

attn_status attn__cuda_kv_layout_of(attn__cuda_err *e, const attn_cuda_kv_cache_config *cfg, attn__cuda_kv_layout *out) {
    memset(out, 0, sizeof *out);
    const int64_t B = cfg->batch, Hkv = cfg->n_kv_heads, D = cfg->head_dim, Dv = cfg->head_dim_v ? cfg->head_dim_v : D;
    const int64_t cap = cfg->capacity, ps = cfg->page_size;
    if (B < 1 || Hkv < 1 || D < 1 || Dv < 1 || cap < 1 || ps < 0)
        return attn__cuda_fail(e, ATTN_ERR_BAD_SHAPE, "cuda kv_cache: batch, n_kv_heads, head dims and capacity must be >= 1, page_size >= 0");
    if (cfg->dtype != ATTN_DTYPE_F32 && cfg->dtype != ATTN_DTYPE_F16 && cfg->dtype != ATTN_DTYPE_BF16)
        return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED, "cuda kv_cache: dtype must be F32, F16 or BF16, not %s",
                               attn_dtype_name(cfg->dtype));
    const int64_t pages = ps > 0 ? ceil_div(cap, ps) : 0;
    int64_t rows = cap, bh, nk, nv; // rows: token rows per sequence (whole pages when paged)
    if ((ps > 0 && __builtin_mul_overflow(pages, ps, &rows)) || __builtin_mul_overflow(B, Hkv, &bh) ||
        __builtin_mul_overflow(bh, rows, &nk) || __builtin_mul_overflow(nk, D, &nk) || __builtin_mul_overflow(bh * rows, Dv, &nv) ||
        nk > INT64_MAX / 8 || nv > INT64_MAX / 8)
        return attn__cuda_fail(e, ATTN_ERR_OVERFLOW, "cuda kv_cache: the sizes overflow");
    if (B * pages > INT32_MAX) // B pages <= B Hkv rows: no overflow
        return attn__cuda_fail(e, ATTN_ERR_OVERFLOW, "cuda kv_cache: %lld pages overflow the page table's int32 entries",
                               (long long)(B * pages));
    const int64_t block = ps > 0 ? ps : cap; // rows per (sequence or page, head)
    out->Dv = Dv, out->pages = pages, out->k_elems = nk, out->v_elems = nv;
    out->k_stride[0] = Hkv * block * D, out->k_stride[1] = block * D, out->k_stride[2] = D, out->k_stride[3] = 1;
    out->v_stride[0] = Hkv * block * Dv, out->v_stride[1] = block * Dv, out->v_stride[2] = Dv, out->v_stride[3] = 1;
    return ATTN_OK;
}

attn_status attn__cuda_kv_check_desc(attn__cuda_err *e, const attn_cuda_kv_cache_config *cfg, const attn_sdpa_desc *d) {
    const int64_t Hkv = d->n_kv_heads ? d->n_kv_heads : d->n_heads, Dv = d->head_dim_v ? d->head_dim_v : d->head_dim;
    const int64_t cDv = cfg->head_dim_v ? cfg->head_dim_v : cfg->head_dim;
    if (d->batch != cfg->batch || Hkv != cfg->n_kv_heads || d->head_dim != cfg->head_dim || Dv != cDv || d->kv_dtype != cfg->dtype)
        return attn__cuda_fail(e, ATTN_ERR_BAD_SHAPE,
                               "cuda kv_cache: the cache holds (batch %lld, %lld kv heads, dims %lld/%lld, %s); the call "
                               "has (%lld, %lld, %lld/%lld, %s)",
                               (long long)cfg->batch, (long long)cfg->n_kv_heads, (long long)cfg->head_dim, (long long)cDv,
                               attn_dtype_name(cfg->dtype), (long long)d->batch, (long long)Hkv, (long long)d->head_dim,
                               (long long)Dv, attn_dtype_name(d->kv_dtype));
    if (d->mask != NULL || d->key_padding_mask != NULL)
        return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED, "cuda kv_cache: no attention or key padding mask with a cache");
    if (d->causal == ATTN_CAUSAL_TOP_LEFT)
        return attn__cuda_fail(e, ATTN_ERR_INVALID_ARG, "cuda kv_cache: causal must be ATTN_CAUSAL_BOTTOM_RIGHT or NONE");
    return ATTN_OK;
}

attn_status attn__cuda_kv_append_offsets(attn__cuda_err *e, int64_t B, int64_t capacity, const int64_t *len,
                                         const int64_t *n, int64_t *cu) {
    cu[0] = 0;
    for (int64_t b = 0; b < B; b++) {
        if (n[b] < 0) return attn__cuda_fail(e, ATTN_ERR_INVALID_ARG, "cuda kv_cache: n_new[%lld] is negative", (long long)b);
        if (n[b] > capacity - len[b])
            return attn__cuda_fail(e, ATTN_ERR_CAPACITY, "cuda kv_cache: sequence %lld holds %lld of %lld tokens, %lld more do not fit",
                                   (long long)b, (long long)len[b], (long long)capacity, (long long)n[b]);
        cu[b + 1] = cu[b] + n[b]; // <= B capacity, within the cache's element count
    }
    return ATTN_OK;
}

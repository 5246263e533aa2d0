// sdpa.c - the SDPA entry points of libattn_cuda: plan on the host (plan.c: every check, the kernel,
// the workspace), then fill in the tensors' pointers and enqueue on the context's stream. A bad
// argument returns before anything is enqueued; nothing here synchronises.
#include <stdint.h>
#include <string.h>

#include "ctx.h"
#include "launch.h"

attn_status attn__cuda_check_device_ptr(attn_cuda_ctx *ctx, const void *p, const char *what) {
    if (p == NULL || ctx->pageable_ok) return ATTN_OK;
    struct cudaPointerAttributes a;
    const cudaError_t err = cudaPointerGetAttributes(&a, p);
    if (err != cudaSuccess) return attn__cuda_device_fail(&ctx->err, err, "cuda: cudaPointerGetAttributes");
    if (a.type == cudaMemoryTypeUnregistered || (a.type == cudaMemoryTypeHost && a.devicePointer != p))
        return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "%s is host memory the GPU cannot read", what);
    return ATTN_OK;
}

static attn_status check_tensors(attn_cuda_ctx *ctx, const attn_sdpa_desc *d, const void *q, const void *k,
                                 const void *v, const void *out, const float *lse) {
    if (q == NULL || k == NULL || v == NULL || out == NULL)
        return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda sdpa: q, k, v and out must not be NULL");
    if (d == NULL) return ATTN_OK; // the planner reports it
    const struct {
        const void *p;
        const char *name;
    } t[] = {{q, "cuda sdpa: q"}, {k, "cuda sdpa: k"}, {v, "cuda sdpa: v"}, {out, "cuda sdpa: out"}, {lse, "cuda sdpa: lse"},
             {d->mask, "cuda sdpa: mask"}, {d->key_padding_mask, "cuda sdpa: key_padding_mask"},
             {d->alibi_slopes, "cuda sdpa: alibi_slopes"}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) ATTN__CU_TRY(attn__cuda_check_device_ptr(ctx, t[i].p, t[i].name));
    return ATTN_OK;
}

// Plans a call (seqs NULL: a plain batch).
static attn_status plan_call(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc, const attn__cuda_seqs *seqs,
                             const void *q, const void *k, const void *v, const void *out, attn__cuda_sdpa_plan *plan) {
    return attn__cuda_plan_sdpa(&ctx->err, &ctx->dev, ctx->kernels, desc, seqs, q, k, v, out, plan);
}

// Takes the workspace of a planned call and enqueues the offsets' copy into it (packed batches).
static attn_status stage(attn_cuda_ctx *ctx, attn__cuda_sdpa_plan *plan, const attn__cuda_seqs *seqs,
                         unsigned char **ws_out) {
    unsigned char *ws = NULL;
    ATTN__CU_TRY(attn__cuda_workspace(ctx, plan->ws_bytes, &ws));
    *ws_out = ws;
    attn__cuda_sdpa_params *p = &plan->p;
    if (seqs != NULL) {
        int64_t *cu = (int64_t *)(ws + plan->ws_cu);
        const size_t n = (size_t)(p->B + 1) * sizeof(int64_t);
        // From pageable host memory: staged before the call returns, so the caller may reuse them.
        cudaError_t err = cudaMemcpyAsync(cu, seqs->cu_q, n, cudaMemcpyHostToDevice, ctx->stream);
        if (err == cudaSuccess) err = cudaMemcpyAsync(cu + p->B + 1, seqs->cu_k, n, cudaMemcpyHostToDevice, ctx->stream);
        if (err != cudaSuccess) return attn__cuda_device_fail(&ctx->err, err, "cuda sdpa: copying cu_seqlens");
        p->cu_q = cu, p->cu_k = cu + p->B + 1;
    }
    return ATTN_OK;
}

// Enqueues a planned forward: the offsets' copy (packed batches), then the kernel.
static attn_status run(attn_cuda_ctx *ctx, attn__cuda_sdpa_plan *plan, const attn__cuda_seqs *seqs, const void *q,
                       const void *k, const void *v, void *out, float *lse) {
    attn__cuda_sdpa_params *p = &plan->p;
    p->q = q, p->k = k, p->v = v, p->out = out, p->lse = lse;
    unsigned char *ws;
    ATTN__CU_TRY(stage(ctx, plan, seqs, &ws));
    int err;
    if (plan->kernel == ATTN__CU_KERNEL_FLASH)
        err = attn__cuda_launch_flash(p, plan->row_blocks, ctx->stream);
    else if (plan->kernel == ATTN__CU_KERNEL_FLASH_SM90)
        err = attn__cuda_launch_flash_sm90(p, plan->row_blocks, ctx->stream);
    else if (plan->kernel == ATTN__CU_KERNEL_DECODE || plan->kernel == ATTN__CU_KERNEL_DECODE_VEC)
        err = attn__cuda_launch_decode(p, plan->kernel == ATTN__CU_KERNEL_DECODE_VEC, plan->split_keys, plan->n_splits,
                                       plan->decode_rows, (float *)(ws + plan->ws_part), ctx->dev.decode_pdl,
                                       ctx->stream);
    else
        err = attn__cuda_launch_simple(p, plan->row_blocks, ctx->stream);
    if (err != cudaSuccess) return attn__cuda_device_fail(&ctx->err, err, "cuda sdpa: launch");
    return ATTN_OK;
}

attn_status attn__cuda_run_planned(attn_cuda_ctx *ctx, const attn_sdpa_desc *d, attn__cuda_sdpa_plan *plan,
                                   const attn__cuda_seqs *seqs, const void *q, const void *k, const void *v, void *out,
                                   float *lse) {
    ATTN__CU_TRY(check_tensors(ctx, d, q, k, v, out, lse));
    return run(ctx, plan, seqs, q, k, v, out, lse);
}

attn_status attn_cuda_sdpa_fwd_workspace_size(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc, size_t *bytes) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (bytes == NULL) return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda sdpa: bytes is NULL");
    attn__cuda_sdpa_plan plan;
    ATTN__CU_TRY(plan_call(ctx, desc, NULL, NULL, NULL, NULL, NULL, &plan));
    *bytes = plan.ws_bytes;
    return ATTN_OK;
}

attn_status attn_cuda_sdpa_fwd(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc, const void *q, const void *k,
                               const void *v, void *out, float *lse) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    ATTN__CU_TRY(check_tensors(ctx, desc, q, k, v, out, lse));
    attn__cuda_sdpa_plan plan;
    ATTN__CU_TRY(plan_call(ctx, desc, NULL, q, k, v, out, &plan));
    return run(ctx, &plan, NULL, q, k, v, out, lse);
}

attn_status attn_cuda_sdpa_varlen_fwd_workspace_size(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc,
                                                     const int64_t *cu_seqlens_q, const int64_t *cu_seqlens_k,
                                                     size_t *bytes) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (bytes == NULL) return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda sdpa_varlen: bytes is NULL");
    const attn__cuda_seqs seqs = {cu_seqlens_q, cu_seqlens_k, 0};
    attn__cuda_sdpa_plan plan;
    ATTN__CU_TRY(plan_call(ctx, desc, &seqs, NULL, NULL, NULL, NULL, &plan));
    *bytes = plan.ws_bytes;
    return ATTN_OK;
}

attn_status attn_cuda_sdpa_varlen_fwd(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc, const int64_t *cu_seqlens_q,
                                      const int64_t *cu_seqlens_k, const void *q, const void *k, const void *v,
                                      void *out, float *lse) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    ATTN__CU_TRY(check_tensors(ctx, desc, q, k, v, out, lse));
    const attn__cuda_seqs seqs = {cu_seqlens_q, cu_seqlens_k, 0};
    attn__cuda_sdpa_plan plan;
    ATTN__CU_TRY(plan_call(ctx, desc, &seqs, q, k, v, out, &plan));
    return run(ctx, &plan, &seqs, q, k, v, out, lse);
}

attn_status attn_cuda_sdpa_kernel_name(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc, const char **name) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (name == NULL) return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda sdpa: name is NULL");
    attn__cuda_sdpa_plan plan;
    ATTN__CU_TRY(plan_call(ctx, desc, NULL, NULL, NULL, NULL, NULL, &plan));
    *name = attn__cuda_kernel_name(plan.kernel);
    return ATTN_OK;
}

// ---- backward ------------------------------------------------------------------------------------

static attn_status check_bwd_tensors(attn_cuda_ctx *ctx, const attn_sdpa_desc *d, const void *q, const void *k,
                                     const void *v, const void *out, const void *dout, const float *lse,
                                     const void *dq, const void *dk, const void *dv) {
    if (dout == NULL || lse == NULL || dq == NULL || dk == NULL || dv == NULL)
        return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG,
                               "cuda sdpa_bwd: q, k, v, out, dout, lse, dq, dk and dv must not be NULL");
    ATTN__CU_TRY(check_tensors(ctx, d, q, k, v, out, lse));
    const struct {
        const void *p;
        const char *name;
    } t[] = {{dout, "cuda sdpa_bwd: dout"}, {dq, "cuda sdpa_bwd: dq"}, {dk, "cuda sdpa_bwd: dk"}, {dv, "cuda sdpa_bwd: dv"}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) ATTN__CU_TRY(attn__cuda_check_device_ptr(ctx, t[i].p, t[i].name));
    return ATTN_OK;
}

// Plans a backward (seqs NULL: a plain batch; t NULL: tensors not known, as for the sizes).
static attn_status plan_bwd(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc, const attn__cuda_seqs *seqs, bool dmask_wanted,
                            const attn__cuda_bwd_tensors *t, attn__cuda_sdpa_plan *plan) {
    return attn__cuda_plan_sdpa_bwd(&ctx->err, &ctx->dev, ctx->kernels, ctx->deterministic, desc, seqs, dmask_wanted, t,
                                    plan);
}

static attn_status run_bwd(attn_cuda_ctx *ctx, attn__cuda_sdpa_plan *plan, const attn__cuda_seqs *seqs, const void *q,
                           const void *k, const void *v, const void *out, const void *dout, const float *lse, void *dq,
                           void *dk, void *dv, float *dmask) {
    attn__cuda_sdpa_params *p = &plan->p;
    p->q = q, p->k = k, p->v = v, p->out = (void *)(uintptr_t)out, p->lse = (float *)(uintptr_t)lse;
    p->dout = dout, p->dq = dq, p->dk = dk, p->dv = dv, p->dmask = dmask;
    unsigned char *ws;
    ATTN__CU_TRY(stage(ctx, plan, seqs, &ws));
    if (dmask != NULL) {
        const cudaError_t merr = cudaMemsetAsync(dmask, 0, (size_t)p->mask_extent * sizeof(float), ctx->stream);
        if (merr != cudaSuccess) return attn__cuda_device_fail(&ctx->err, merr, "cuda sdpa_bwd: zeroing dmask");
    }
    p->rowdot = (float *)(ws + plan->ws_rowdot);
    int err;
    if (plan->kernel == ATTN__CU_KERNEL_FLASH) {
        p->dq_acc = plan->deterministic ? NULL : (float *)(ws + plan->ws_dq_acc);
        err = attn__cuda_launch_flash_bwd(p, plan->deterministic, ctx->stream);
    } else {
        err = attn__cuda_launch_simple_bwd(p, ctx->stream);
    }
    if (err != cudaSuccess) return attn__cuda_device_fail(&ctx->err, err, "cuda sdpa_bwd: launch");
    return ATTN_OK;
}

attn_status attn_cuda_sdpa_bwd_workspace_size(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc, size_t *bytes) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (bytes == NULL) return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda sdpa_bwd: bytes is NULL");
    attn__cuda_sdpa_plan plan;
    ATTN__CU_TRY(plan_bwd(ctx, desc, NULL, false, NULL, &plan));
    *bytes = plan.ws_bytes;
    return ATTN_OK;
}

attn_status attn_cuda_sdpa_bwd(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc, const void *q, const void *k,
                               const void *v, const void *out, const void *dout, const float *lse, void *dq, void *dk,
                               void *dv, float *dmask) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    ATTN__CU_TRY(check_bwd_tensors(ctx, desc, q, k, v, out, dout, lse, dq, dk, dv));
    attn__cuda_sdpa_plan plan;
    const attn__cuda_bwd_tensors t = {q, k, v, out, dout};
    ATTN__CU_TRY(plan_bwd(ctx, desc, NULL, dmask != NULL, &t, &plan));
    if (dmask != NULL) ATTN__CU_TRY(attn__cuda_check_device_ptr(ctx, dmask, "cuda sdpa_bwd: dmask"));
    return run_bwd(ctx, &plan, NULL, q, k, v, out, dout, lse, dq, dk, dv, dmask);
}

attn_status attn_cuda_sdpa_varlen_bwd_workspace_size(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc,
                                                     const int64_t *cu_seqlens_q, const int64_t *cu_seqlens_k,
                                                     size_t *bytes) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (bytes == NULL) return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda sdpa_varlen_bwd: bytes is NULL");
    const attn__cuda_seqs seqs = {cu_seqlens_q, cu_seqlens_k, 0};
    attn__cuda_sdpa_plan plan;
    ATTN__CU_TRY(plan_bwd(ctx, desc, &seqs, false, NULL, &plan));
    *bytes = plan.ws_bytes;
    return ATTN_OK;
}

attn_status attn_cuda_sdpa_varlen_bwd(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc, const int64_t *cu_seqlens_q,
                                      const int64_t *cu_seqlens_k, const void *q, const void *k, const void *v,
                                      const void *out, const void *dout, const float *lse, void *dq, void *dk,
                                      void *dv) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    ATTN__CU_TRY(check_bwd_tensors(ctx, desc, q, k, v, out, dout, lse, dq, dk, dv));
    const attn__cuda_seqs seqs = {cu_seqlens_q, cu_seqlens_k, 0};
    attn__cuda_sdpa_plan plan;
    const attn__cuda_bwd_tensors t = {q, k, v, out, dout};
    ATTN__CU_TRY(plan_bwd(ctx, desc, &seqs, false, &t, &plan));
    return run_bwd(ctx, &plan, &seqs, q, k, v, out, dout, lse, dq, dk, dv, NULL);
}

attn_status attn_cuda_sdpa_bwd_kernel_name(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc, const char **name) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (name == NULL) return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda sdpa_bwd: name is NULL");
    attn__cuda_sdpa_plan plan;
    ATTN__CU_TRY(plan_bwd(ctx, desc, NULL, false, NULL, &plan));
    *name = attn__cuda_bwd_kernel_name(&plan);
    return ATTN_OK;
}

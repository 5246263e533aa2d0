// kv_cache.c - device KV caches (attn_cuda.h): contiguous (B, Hkv, capacity, D) or paged (a pool of
// pages of page_size tokens, (Hkv, page_size, D) each, and a page table per sequence), appended to by
// kernels/kv_append.cu and attended through the SDPA planner and kernels with per-sequence key
// counts (attn__cuda_sdpa_params.seq_k) and the page table.
//
// The page table maps page p of sequence b to physical page p * B + b: the pages of a sequence are
// not adjacent in the pool, so every read goes through the table as it would with an allocator's.
// The sequences' lengths live on the host (what the checks read) and on the device (what the
// kernels read), updated together by each append.
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "launch.h"

struct attn_cuda_kv_cache {
    attn_cuda_kv_cache_config cfg;
    int64_t max_pages;       // pages per sequence (paged)
    void *k, *v;             // device storage
    int64_t k_stride[4], v_stride[4];
    int32_t *page_table;     // device (B, max_pages), or NULL
    int64_t *len;            // host (B)
    int64_t *d_len;          // device (B)
    attn_cuda_allocator mem; // the creating context's hooks, and its stream then
    cudaStream_t mem_stream;
};

void attn_cuda_kv_cache_config_init(attn_cuda_kv_cache_config *cfg) {
    if (cfg != NULL) memset(cfg, 0, sizeof *cfg);
}

void attn_cuda_kv_cache_free(attn_cuda_kv_cache *c) {
    if (c == NULL) return;
    attn__cuda_mem_free(&c->mem, c->k, c->mem_stream, false), attn__cuda_mem_free(&c->mem, c->v, c->mem_stream, false);
    attn__cuda_mem_free(&c->mem, c->page_table, c->mem_stream, false);
    attn__cuda_mem_free(&c->mem, c->d_len, c->mem_stream, false);
    free(c->len);
    free(c);
}

attn_status attn_cuda_kv_cache_create(attn_cuda_ctx *ctx, const attn_cuda_kv_cache_config *cfg,
                                      attn_cuda_kv_cache **out) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__cuda_err *e = &ctx->err;
    if (cfg == NULL || out == NULL) return attn__cuda_fail(e, ATTN_ERR_INVALID_ARG, "cuda kv_cache: cfg and cache must not be NULL");
    *out = NULL;
    attn__cuda_kv_layout lay;
    ATTN__CU_TRY(attn__cuda_kv_layout_of(e, cfg, &lay));
    const int64_t B = cfg->batch, pages = lay.pages;
    attn_cuda_kv_cache *c = calloc(1, sizeof *c);
    if (c == NULL) return attn__cuda_fail(e, ATTN_ERR_OUT_OF_MEMORY, "cuda kv_cache: out of host memory");
    c->cfg = *cfg, c->cfg.head_dim_v = lay.Dv, c->max_pages = pages, c->mem = ctx->mem, c->mem_stream = ctx->stream;
    c->len = calloc((size_t)B, sizeof(int64_t));
    const size_t es = attn_dtype_size(cfg->dtype);
    cudaError_t err = c->len != NULL ? cudaSuccess : cudaErrorMemoryAllocation;
    if (err == cudaSuccess) err = (cudaError_t)attn__cuda_mem_alloc(&c->mem, &c->k, (size_t)lay.k_elems * es, c->mem_stream, false);
    if (err == cudaSuccess) err = (cudaError_t)attn__cuda_mem_alloc(&c->mem, &c->v, (size_t)lay.v_elems * es, c->mem_stream, false);
    if (err == cudaSuccess) err = (cudaError_t)attn__cuda_mem_alloc(&c->mem, (void **)&c->d_len, (size_t)B * sizeof(int64_t), c->mem_stream, false);
    if (err == cudaSuccess) err = cudaMemset(c->d_len, 0, (size_t)B * sizeof(int64_t));
    if (err == cudaSuccess && pages > 0) {
        int32_t *table = malloc((size_t)(B * pages) * sizeof(int32_t));
        if (table == NULL) err = cudaErrorMemoryAllocation; // B pages <= INT32_MAX (the layout)
        for (int64_t b = 0; err == cudaSuccess && b < B; b++)
            for (int64_t p = 0; p < pages; p++) table[b * pages + p] = (int32_t)(p * B + b);
        if (err == cudaSuccess)
            err = (cudaError_t)attn__cuda_mem_alloc(&c->mem, (void **)&c->page_table, (size_t)(B * pages) * sizeof(int32_t), c->mem_stream, false);
        if (err == cudaSuccess)
            err = cudaMemcpy(c->page_table, table, (size_t)(B * pages) * sizeof(int32_t), cudaMemcpyHostToDevice);
        free(table);
    }
    if (err != cudaSuccess) {
        attn_cuda_kv_cache_free(c);
        return err == cudaErrorMemoryAllocation ? attn__cuda_fail(e, ATTN_ERR_OUT_OF_MEMORY, "cuda kv_cache: memory cannot be had")
                                                : attn__cuda_device_fail(e, err, "cuda kv_cache: allocation");
    }
    memcpy(c->k_stride, lay.k_stride, sizeof c->k_stride), memcpy(c->v_stride, lay.v_stride, sizeof c->v_stride);
    *out = c;
    return ATTN_OK;
}

attn_status attn_cuda_kv_cache_lengths(const attn_cuda_kv_cache *c, int64_t *lengths) {
    if (c == NULL || lengths == NULL) return ATTN_ERR_INVALID_ARG;
    memcpy(lengths, c->len, (size_t)c->cfg.batch * sizeof(int64_t));
    return ATTN_OK;
}

attn_status attn_cuda_kv_cache_reset(attn_cuda_ctx *ctx, attn_cuda_kv_cache *c) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (c == NULL) return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda kv_cache: cache is NULL");
    memset(c->len, 0, (size_t)c->cfg.batch * sizeof(int64_t));
    const cudaError_t err = cudaMemsetAsync(c->d_len, 0, (size_t)c->cfg.batch * sizeof(int64_t), ctx->stream);
    return err == cudaSuccess ? ATTN_OK : attn__cuda_device_fail(&ctx->err, err, "cuda kv_cache: reset");
}

attn_status attn_cuda_kv_cache_truncate(attn_cuda_ctx *ctx, attn_cuda_kv_cache *c, const int64_t *lengths) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (c == NULL || lengths == NULL)
        return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda kv_cache: cache and lengths must not be NULL");
    for (int64_t b = 0; b < c->cfg.batch; b++)
        if (lengths[b] < 0 || lengths[b] > c->len[b])
            return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG,
                                   "cuda kv_cache: lengths[%lld] = %lld is outside 0 .. %lld (the sequence's length)",
                                   (long long)b, (long long)lengths[b], (long long)c->len[b]);
    memcpy(c->len, lengths, (size_t)c->cfg.batch * sizeof(int64_t));
    // staged from the host at once (pageable memory), as append does
    const cudaError_t err = cudaMemcpyAsync(c->d_len, c->len, (size_t)c->cfg.batch * sizeof(int64_t),
                                            cudaMemcpyHostToDevice, ctx->stream);
    return err == cudaSuccess ? ATTN_OK : attn__cuda_device_fail(&ctx->err, err, "cuda kv_cache: truncate");
}

attn_status attn_cuda_kv_cache_append(attn_cuda_ctx *ctx, attn_cuda_kv_cache *c, const int64_t *n_new, const void *k,
                                      const void *v) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (c == NULL || n_new == NULL || k == NULL || v == NULL)
        return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda kv_cache: cache, n_new, k and v must not be NULL");
    ATTN__CU_TRY(attn__cuda_check_device_ptr(ctx, k, "cuda kv_cache: k"));
    ATTN__CU_TRY(attn__cuda_check_device_ptr(ctx, v, "cuda kv_cache: v"));
    const int64_t B = c->cfg.batch;
    int64_t *cu = malloc((size_t)(2 * B + 1) * sizeof(int64_t));
    if (cu == NULL) return attn__cuda_fail(&ctx->err, ATTN_ERR_OUT_OF_MEMORY, "cuda kv_cache: out of host memory");
    attn_status st = attn__cuda_kv_append_offsets(&ctx->err, B, c->cfg.capacity, c->len, n_new, cu);
    unsigned char *ws = NULL;
    const size_t bytes = (size_t)(2 * B + 1) * sizeof(int64_t);
    if (st == ATTN_OK) st = attn__cuda_workspace(ctx, bytes + ATTN__CU_WS_ALIGN, &ws);
    if (st == ATTN_OK) {
        memcpy(cu + B + 1, c->len, (size_t)B * sizeof(int64_t)); // the lengths before the append
        cudaError_t err = cudaMemcpyAsync(ws, cu, bytes, cudaMemcpyHostToDevice, ctx->stream);
        attn__cuda_kv_append a = {.k = c->k, .v = c->v, .k_new = k, .v_new = v, .cu_new = (const int64_t *)ws,
                                  .len = (const int64_t *)ws + B + 1, .page_table = c->page_table,
                                  .page_size = c->cfg.page_size, .max_pages = c->max_pages, .B = B,
                                  .Hkv = c->cfg.n_kv_heads, .D = c->cfg.head_dim, .Dv = c->cfg.head_dim_v,
                                  .total_new = cu[B], .elem_size = (int32_t)attn_dtype_size(c->cfg.dtype)};
        memcpy(a.k_stride, c->k_stride, sizeof a.k_stride), memcpy(a.v_stride, c->v_stride, sizeof a.v_stride);
        if (err == cudaSuccess) err = (cudaError_t)attn__cuda_launch_kv_append(&a, ctx->stream);
        for (int64_t b = 0; b < B; b++) c->len[b] += n_new[b];
        if (err == cudaSuccess) // the new lengths, staged from the host at once
            err = cudaMemcpyAsync(c->d_len, c->len, (size_t)B * sizeof(int64_t), cudaMemcpyHostToDevice, ctx->stream);
        if (err != cudaSuccess) st = attn__cuda_device_fail(&ctx->err, err, "cuda kv_cache: append");
    }
    free(cu);
    return st;
}

// An attend call planned on the cache as it will be after an append of n_new[b] tokens (n_new NULL:
// as it is): the descriptor against the cache, the append's counts against the capacity, then the
// planner's checks and choice on the packed form (q packed; keys counted per sequence: cu_k, B + 1,
// from the host's lengths) into *d and *plan. Nothing is changed or launched.
static attn_status plan_attend(attn_cuda_ctx *ctx, const attn_cuda_kv_cache *c, const attn_sdpa_desc *desc,
                               const int64_t *cu_seqlens_q, const int64_t *n_new, const void *q, const void *out,
                               int64_t *cu_k, attn_sdpa_desc *d, attn__cuda_sdpa_plan *plan) {
    attn__cuda_err *e = &ctx->err;
    const attn_cuda_kv_cache_config *cf = &c->cfg;
    ATTN__CU_TRY(attn__cuda_kv_check_desc(e, cf, desc));
    if (n_new != NULL) ATTN__CU_TRY(attn__cuda_kv_append_offsets(e, cf->batch, cf->capacity, c->len, n_new, cu_k));
    cu_k[0] = 0;
    int64_t longest = 1;
    for (int64_t b = 0; b < cf->batch; b++) {
        const int64_t n = c->len[b] + (n_new != NULL ? n_new[b] : 0); // <= capacity
        cu_k[b + 1] = cu_k[b] + n;
        if (n > longest) longest = n;
    }
    *d = *desc;
    d->len_kv = longest;
    memcpy(d->k_stride, c->k_stride, sizeof d->k_stride), memcpy(d->v_stride, c->v_stride, sizeof d->v_stride);
    const attn__cuda_seqs seqs = {cu_seqlens_q, cu_k, cf->page_size};
    return attn__cuda_plan_sdpa(e, &ctx->dev, ctx->kernels, d, &seqs, q, c->k, c->v, out, plan);
}

attn_status attn__cuda_kv_cache_check_step(attn_cuda_ctx *ctx, const attn_cuda_kv_cache *c, const int64_t *n_new,
                                           const attn_sdpa_desc *desc, const int64_t *cu_seqlens_q, const void *q,
                                           const void *out) {
    int64_t *cu_k = malloc((size_t)(c->cfg.batch + 1) * sizeof(int64_t));
    if (cu_k == NULL) return attn__cuda_fail(&ctx->err, ATTN_ERR_OUT_OF_MEMORY, "cuda kv_cache: out of host memory");
    attn_sdpa_desc d;
    attn__cuda_sdpa_plan plan;
    const attn_status st = plan_attend(ctx, c, desc, cu_seqlens_q, n_new, q, out, cu_k, &d, &plan);
    free(cu_k);
    return st;
}

attn_status attn_cuda_kv_cache_attend(attn_cuda_ctx *ctx, const attn_cuda_kv_cache *c, const attn_sdpa_desc *desc,
                                      const int64_t *cu_seqlens_q, const void *q, void *out, float *lse) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (c == NULL || desc == NULL || cu_seqlens_q == NULL || q == NULL || out == NULL)
        return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda kv_cache: cache, desc, cu_seqlens_q, q and out must not be NULL");
    int64_t *cu_k = malloc((size_t)(c->cfg.batch + 1) * sizeof(int64_t));
    if (cu_k == NULL) return attn__cuda_fail(&ctx->err, ATTN_ERR_OUT_OF_MEMORY, "cuda kv_cache: out of host memory");
    attn_sdpa_desc d;
    attn__cuda_sdpa_plan plan;
    attn_status st = plan_attend(ctx, c, desc, cu_seqlens_q, NULL, q, out, cu_k, &d, &plan);
    if (st == ATTN_OK) {
        attn__cuda_sdpa_params *p = &plan.p;
        memcpy(p->k_stride, c->k_stride, sizeof p->k_stride), memcpy(p->v_stride, c->v_stride, sizeof p->v_stride);
        p->seq_k = c->d_len, p->page_table = c->page_table, p->page_size = c->cfg.page_size, p->max_pages = c->max_pages;
        const attn__cuda_seqs seqs = {cu_seqlens_q, cu_k, c->cfg.page_size};
        st = attn__cuda_run_planned(ctx, &d, &plan, &seqs, q, c->k, c->v, out, lse);
    }
    free(cu_k);
    return st;
}

// ctx.c - the context: allocator, generator, error message, scratch memory; checked size math.
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE // madvise(), for the huge pages of attn__alloc_large
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "cpu/cpu.h"
#include "internal.h"

// ---- errors ----------------------------------------------------------------------------------

attn_status attn__fail(attn_ctx *ctx, attn_status status, const char *fmt, ...) {
    if (ctx != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
        va_end(ap);
    }
    return status;
}

void attn__clear_error(attn_ctx *ctx) {
    if (ctx != NULL) ctx->err[0] = '\0';
}

const char *attn_ctx_last_error(const attn_ctx *ctx) { return ctx != NULL ? ctx->err : ""; }

// ---- memory ----------------------------------------------------------------------------------

static void *system_alloc(void *user, size_t size, size_t align) {
    (void)user;
    void *p = NULL;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size) != 0) return NULL;
    return p;
}

static void system_free(void *user, void *p) {
    (void)user;
    free(p);
}

void attn__default_allocator(attn_allocator *a) {
    a->alloc = system_alloc;
    a->free = system_free;
    a->user = NULL;
}

void *attn__alloc_with(const attn_allocator *a, size_t size) {
    if (size == 0) return NULL;
    return a->alloc(a->user, size, ATTN_ALIGN);
}

void attn__free_with(const attn_allocator *a, void *p) {
    if (p != NULL) a->free(a->user, p);
}

attn_status attn__alloc(attn_ctx *ctx, size_t size, void **out) {
    *out = attn__alloc_with(&ctx->alloc, size == 0 ? 1 : size);
    if (*out == NULL) return attn__fail(ctx, ATTN_ERR_OUT_OF_MEMORY, "could not allocate %zu bytes", size);
    return ATTN_OK;
}

void attn__free(attn_ctx *ctx, void *p) { attn__free_with(&ctx->alloc, p); }

attn_status attn__alloc_large(attn_ctx *ctx, size_t size, void **out) {
    if (ctx->alloc.alloc != system_alloc || size < ATTN_HUGE_PAGE) return attn__alloc(ctx, size, out);
    *out = system_alloc(NULL, size, ATTN_HUGE_PAGE);
    if (*out == NULL) return attn__fail(ctx, ATTN_ERR_OUT_OF_MEMORY, "could not allocate %zu bytes", size);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)madvise(*out, size, MADV_HUGEPAGE); // advice only: without transparent huge pages it changes nothing
#endif
    return ATTN_OK;
}

attn_status attn__workspace(attn_ctx *ctx, size_t size, void **out) {
    if (size <= ctx->ws_size && (ctx->ws != NULL || size == 0)) {
        *out = ctx->ws;
        return ATTN_OK;
    }
    if (ctx->ws_external)
        return attn__fail(ctx, ATTN_ERR_WORKSPACE,
                          "the call needs %zu bytes of workspace, the context has %zu after %d-byte alignment", size,
                          ctx->ws_size, ATTN_ALIGN);
    void *p = NULL;
    ATTN_RETURN_IF_ERR(attn__alloc(ctx, size, &p));
    attn__free(ctx, ctx->ws);
    ctx->ws = p;
    ctx->ws_size = size;
    *out = p;
    return ATTN_OK;
}

// A piece of 4 KiB or more starts at the next address whose offset in the workspace is, modulo
// 4096, 17 lines (of ATTN_ALIGN bytes) times the number of such pieces before it, modulo 64 lines:
// 64 in a row start at different addresses modulo 4096. Tiles whose sizes are multiples of 4 KiB
// would otherwise all start at the same address modulo 4096, and a load that matches an earlier
// store still in flight in its address's low 12 bits waits as though it read that store ("4K
// aliasing"; the tile kernels read one tile while they write another). Measured: the AVX2 P V of a
// forward tile in L2 89 GFLOP/s with its tiles aliased, 96 without.
void *attn__arena_take(attn__arena *a, size_t bytes) {
    size_t start = (a->used + (ATTN_ALIGN - 1)) & ~(size_t)(ATTN_ALIGN - 1);
    if (bytes >= 4096) {
        const size_t want = (size_t)(a->tiles++ * 17 % 64) * ATTN_ALIGN;
        start += (want + 4096 - start % 4096) % 4096;
    }
    a->used = start + bytes;
    return a->base != NULL ? a->base + start : NULL;
}

// ---- context ---------------------------------------------------------------------------------

void attn_ctx_params_init(attn_ctx_params *params) {
    if (params == NULL) return;
    memset(params, 0, sizeof *params);
    params->n_threads = 1;
    params->isa = ATTN_ISA_AUTO;
    params->use_blas = 0;
}

attn_status attn_ctx_create(const attn_ctx_params *params, attn_ctx **out) {
    if (out == NULL) return ATTN_ERR_INVALID_ARG;
    *out = NULL;
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    if (params != NULL) p = *params;
    if (p.n_threads < 0 || p.n_threads > 4096) return ATTN_ERR_INVALID_ARG;
    if (p.isa < ATTN_ISA_AUTO || p.isa > ATTN_ISA_AVX512_VNNI) return ATTN_ERR_INVALID_ARG;
    bool isa_ok;
    const attn__kernels *kernels = attn__kernels_for(p.isa, &isa_ok);
    if (!isa_ok) return ATTN_ERR_UNSUPPORTED;
    if ((p.allocator.alloc == NULL) != (p.allocator.free == NULL)) return ATTN_ERR_INVALID_ARG;
    if (p.executor.parallel == NULL && p.executor.user != NULL) return ATTN_ERR_INVALID_ARG;
    attn_allocator a = p.allocator;
    if (a.alloc == NULL) attn__default_allocator(&a);
    attn_ctx *ctx = attn__alloc_with(&a, sizeof *ctx);
    if (ctx == NULL) return ATTN_ERR_OUT_OF_MEMORY;
    memset(ctx, 0, sizeof *ctx);
    ctx->alloc = a;
    ctx->isa = p.isa;
    ctx->kernels = kernels;
    ctx->n_threads = p.n_threads == 0 ? 1 : p.n_threads;
    ctx->use_blas = p.use_blas != 0;
    attn_generator_seed(&ctx->gen, p.seed);
    attn_status st = attn__pool_create(ctx, ctx->n_threads, &p.executor, &ctx->pool);
    if (st != ATTN_OK) {
        attn__free_with(&a, ctx);
        return st;
    }
    attn__blas_load(ctx); // use_blas: the CBLAS library, loaded now (no library: the own GEMM serves)
    *out = ctx;
    return ATTN_OK;
}

void attn_ctx_free(attn_ctx *ctx) {
    if (ctx == NULL) return;
    attn_allocator a = ctx->alloc;
    attn__pool_free(ctx->pool);
    attn__blas_unload(ctx);
    if (!ctx->ws_external) attn__free_with(&a, ctx->ws);
    attn__free_with(&a, ctx);
}

attn_generator *attn_ctx_generator(attn_ctx *ctx) { return ctx != NULL ? &ctx->gen : NULL; }

attn_status attn_ctx_set_workspace(attn_ctx *ctx, void *buffer, size_t size) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if ((buffer == NULL) != (size == 0))
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "workspace buffer and size must be both set or both empty");
    if (!ctx->ws_external) attn__free(ctx, ctx->ws);
    // The kernels use aligned vector loads on scratch: use the buffer from its first ATTN_ALIGN
    // boundary (the sizes the library reports include room for this).
    const size_t pad = (size_t)(-(uintptr_t)buffer & (ATTN_ALIGN - 1));
    ctx->ws = buffer == NULL ? NULL : (char *)buffer + (pad < size ? pad : size);
    ctx->ws_size = pad < size ? size - pad : 0;
    ctx->ws_external = buffer != NULL;
    return ATTN_OK;
}

attn_status attn_ctx_reserve(attn_ctx *ctx, size_t size) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    void *ws;
    return attn__workspace(ctx, size, &ws);
}

// ---- checked size arithmetic -------------------------------------------------------------

bool attn__mul_i64(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return false;
    return !__builtin_mul_overflow(a, b, out);
}

bool attn__add_i64(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return false;
    return !__builtin_add_overflow(a, b, out);
}

attn_status attn__numel(attn_ctx *ctx, const char *what, int n, const int64_t *dims, int64_t *out) {
    int64_t p = 1;
    for (int i = 0; i < n; i++) {
        if (dims[i] < 1) return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "%s: size %lld must be >= 1", what, (long long)dims[i]);
        if (!attn__mul_i64(p, dims[i], &p))
            return attn__fail(ctx, ATTN_ERR_OVERFLOW, "%s: the number of elements overflows", what);
    }
    *out = p;
    return ATTN_OK;
}

attn_status attn__bytes(attn_ctx *ctx, const char *what, int64_t count, size_t elem, size_t *out) {
    size_t r;
    if (count < 0 || __builtin_mul_overflow((size_t)count, elem, &r) || r > (size_t)INT64_MAX)
        return attn__fail(ctx, ATTN_ERR_OVERFLOW, "%s: the size in bytes overflows", what);
    *out = r;
    return ATTN_OK;
}

bool attn__view_extent(const int64_t n[4], const int64_t s[4], int64_t *max_offset) {
    int64_t off = 0;
    for (int i = 0; i < 4; i++) {
        int64_t t;
        if (n[i] < 1 || s[i] < 0) return false;
        if (!attn__mul_i64(n[i] - 1, s[i], &t) || !attn__add_i64(off, t, &off)) return false;
    }
    *max_offset = off;
    return true;
}

bool attn__view_disjoint(const int64_t n[4], const int64_t s[4]) {
    int idx[4], m = 0;
    for (int i = 0; i < 4; i++)
        if (n[i] > 1 && s[i] != 0) idx[m++] = i;
    for (int a = 1; a < m; a++) // insertion sort by stride
        for (int b = a; b > 0 && s[idx[b]] < s[idx[b - 1]]; b--) {
            const int t = idx[b];
            idx[b] = idx[b - 1], idx[b - 1] = t;
        }
    int64_t reach = 0; // largest offset of the dimensions so far (no overflow: the view's extent fits)
    for (int a = 0; a < m; a++) {
        if (s[idx[a]] <= reach) return false;
        reach += (n[idx[a]] - 1) * s[idx[a]];
    }
    return true;
}

// internal.h - declarations shared by libattn's sources; not installed.
//
// Rules the sources follow:
//  - Internal non-static symbols start with attn__.
//  - Public entry points validate every argument, then take scratch memory once with
//    attn__workspace() and pass explicit (pointer, size) workspaces down. Internal functions never
//    call attn__workspace() themselves (it may move the context's scratch buffer).
//  - Errors are reported with attn__fail(), which records a message in the context and returns
//    the status, so `return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "...")` is the idiom.
//  - Macros that return say so in their name (ATTN_RETURN_IF_ERR).
#ifndef ATTN_INTERNAL_H
#define ATTN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attn.h"

#define ATTN_ALIGN 64
#define ATTN_SAVED_ALIGN 16 // saved activations: what malloc guarantees on 64-bit systems
#define ATTN_ERR_MSG_SIZE 256

typedef struct attn__pool attn__pool;
typedef struct attn__kernels attn__kernels;

struct attn_ctx {
    attn_allocator alloc;
    attn_isa isa;                   // as asked for
    const attn__kernels *kernels;   // the kernel table chosen for isa (NULL for ATTN_ISA_REF)
    int n_threads;
    bool use_blas;                  // projections may go through CBLAS
    void *blas_lib;                 // with use_blas: the CBLAS library loaded for it (blas.c), or NULL
    void (*blas_sgemm)(void);       // its cblas_sgemm (NULL: the library's own GEMM serves)
    attn__pool *pool;               // NULL when n_threads == 1
    attn_generator gen;
    char err[ATTN_ERR_MSG_SIZE];
    void *ws;          // scratch buffer (owned unless ws_external)
    size_t ws_size;
    bool ws_external;
};

#define ATTN_RETURN_IF_ERR(expr)            \
    do {                                    \
        attn_status attn__st_ = (expr);     \
        if (attn__st_ != ATTN_OK) return attn__st_; \
    } while (0)

#if defined(__GNUC__)
#define ATTN_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define ATTN_PRINTF(f, a)
#endif

// Records "message" in ctx (if not NULL) and returns status.
attn_status attn__fail(attn_ctx *ctx, attn_status status, const char *fmt, ...) ATTN_PRINTF(3, 4);
// Clears the context's last error (called at the start of public entry points).
void attn__clear_error(attn_ctx *ctx);

// ---- memory -------------------------------------------------------------------------------
// The system allocator used when the caller gives none (aligned, NULL on failure).
void attn__default_allocator(attn_allocator *a);
// Allocates `size` bytes aligned to ATTN_ALIGN through `a`; NULL on failure or size 0.
void *attn__alloc_with(const attn_allocator *a, size_t size);
void attn__free_with(const attn_allocator *a, void *p);
// Same through ctx->alloc, recording an error message on failure.
attn_status attn__alloc(attn_ctx *ctx, size_t size, void **out);
void attn__free(attn_ctx *ctx, void *p);
// attn__alloc for a large buffer that is read whole again and again (a KV cache), freed with
// attn__free: with the system allocator, one of ATTN_HUGE_PAGE bytes or more starts on an
// ATTN_HUGE_PAGE boundary and, on Linux, is advised for transparent huge pages (madvise
// MADV_HUGEPAGE), so that streaming it takes fewer TLB misses. A caller's allocator decides alone.
#define ATTN_HUGE_PAGE ((size_t)2 << 20)
attn_status attn__alloc_large(attn_ctx *ctx, size_t size, void **out);
// Returns ctx scratch of at least `size` bytes in *out (grows the owned buffer if needed).
attn_status attn__workspace(attn_ctx *ctx, size_t size, void **out);

// A bump allocator over a workspace: every piece starts on an ATTN_ALIGN boundary (those of 4 KiB or
// more staggered against each other: attn__arena_take). Used both to size a workspace (base NULL:
// only `used` grows) and to carve it, so the two cannot disagree.
typedef struct attn__arena {
    char *base;
    size_t used;
    int tiles; // pieces of 4 KiB or more taken so far (attn__arena_take staggers them)
} attn__arena;
void *attn__arena_take(attn__arena *a, size_t bytes);

// ---- threads -------------------------------------------------------------------------------------
// fn(arg, task, thread): thread is in [0, n_threads) and indexes per-thread scratch.
typedef void (*attn__task_fn)(void *arg, int64_t task, int thread);
// Starts n_threads - 1 workers (none when n_threads <= 1: *out = NULL), or, with an executor
// (executor->parallel set), none: its loops then run through the executor.
attn_status attn__pool_create(attn_ctx *ctx, int n_threads, const attn_executor *executor, attn__pool **out);
void attn__pool_free(attn__pool *p);
int attn__pool_threads(const attn__pool *p);
// Runs tasks 0..n_tasks-1 on the workers and the caller (or the executor's threads); returns when
// all are done. p may be NULL.
void attn__pool_run(attn__pool *p, int64_t n_tasks, attn__task_fn fn, void *arg);
// The pool to run a loop of about `flops` floating-point operations on: NULL (the caller alone)
// below ATTN_SERIAL_FLOPS, where waking a worker would cost more than it saves.
attn__pool *attn__pool_for(attn__pool *p, double flops);

// Whether dtype is one of the floating-point element types tensors may have (F32, F16, BF16).
static inline bool attn__is_float_dtype(attn_dtype t) {
    return t == ATTN_DTYPE_F32 || t == ATTN_DTYPE_F16 || t == ATTN_DTYPE_BF16;
}

// Whether dtype is a block-quantised type (Q8_0, Q4_0: blocks of 32 values, see attn.h).
static inline bool attn__is_block_dtype(attn_dtype t) { return t == ATTN_DTYPE_Q8_0 || t == ATTN_DTYPE_Q4_0; }
// Bytes from the start of a k or v tensor of type dt to its element `off` (for a block type, off
// is a multiple of the block size: the start of a block).
static inline size_t attn__kv_bytes(attn_dtype dt, int64_t off) {
    return (size_t)(off / attn_dtype_block_size(dt)) * attn_dtype_size(dt);
}

// ---- element types -------------------------------------------------------------------------------
// dst[i] = src[i] of dtype dt (F32, F16 or BF16) as float, exactly, i < n (the context's vector
// conversion when it has kernels; ctx may be NULL).
void attn__to_f32(const attn_ctx *ctx, attn_dtype dt, const void *src, float *dst, int64_t n);
// dst[i] (of dtype dt: F32, F16 or BF16) = src[i] rounded to nearest even, i < n (the context's
// vector conversion when it has kernels; ctx may be NULL).
void attn__from_f32(const attn_ctx *ctx, attn_dtype dt, const float *src, void *dst, int64_t n);
// x[i] = x[i] rounded to nearest even in dtype dt (F16 or BF16) and back, exactly, i < n: the float32
// value a tensor of that type would hold. Other dtypes leave x as it is.
void attn__round_half(const attn_ctx *ctx, attn_dtype dt, float *x, int64_t n);

// ---- checked size arithmetic -------------------------------------------------------------
// Return false on overflow (or a negative operand), true otherwise.
bool attn__mul_i64(int64_t a, int64_t b, int64_t *out);
bool attn__add_i64(int64_t a, int64_t b, int64_t *out);
// numel = prod(dims[0..n)), each >= 1. Records an error naming `what` on failure.
attn_status attn__numel(attn_ctx *ctx, const char *what, int n, const int64_t *dims, int64_t *out);
// bytes = count * elem as a size_t, checked.
attn_status attn__bytes(attn_ctx *ctx, const char *what, int64_t count, size_t elem, size_t *out);
// Element offset of index (i0, i1, i2, i3) in a view with strides s: 64-bit throughout, valid
// whenever the view passed attn__view_extent.
static inline int64_t attn__offset4(const int64_t s[4], int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return i0 * s[0] + i1 * s[1] + i2 * s[2] + i3 * s[3];
}
// Largest offset reached by an (n0, n1, n2, n3) view with strides s (all n >= 1); false on overflow.
bool attn__view_extent(const int64_t n[4], const int64_t s[4], int64_t *max_offset);
// Whether the dimensions of a view (extents n, strides s, checked by attn__view_extent) with a
// non-zero stride and n > 1 address distinct elements for distinct indices, by the sufficient test
// that, in ascending order of stride, each stride exceeds the largest offset of the dimensions
// before it. False for overlapping views such as strides {0, 1, 1, 1}; broadcast (stride 0)
// dimensions are left out.
bool attn__view_disjoint(const int64_t n[4], const int64_t s[4]);

// ---- scaled dot-product attention ------------------------------------------------------------
// Checks a descriptor; on success fills the resolved values (Hkv, Dv, scale).
typedef struct attn__sdpa_shape {
    int64_t B, H, Hkv, L, S, D, Dv;
    int64_t group; // H / Hkv
    float scale;
    int64_t seq0;  // index of the run's first sequence (a packed batch runs sequence b alone, seq0 = b)
} attn__sdpa_shape;
attn_status attn__sdpa_check(attn_ctx *ctx, const attn_sdpa_desc *d, attn__sdpa_shape *sh);
// The layout rules of Q8_0 and Q4_0 k and v (attn.h, kv_dtype), for a checked shape (quant.c).
attn_status attn__check_block_kv(attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh);
// The checks of the public SDPA entry points; *run receives the descriptor the kernels take (the
// strides of length-1 dimensions zeroed).
attn_status attn__sdpa_prepare(attn_ctx *ctx, const attn_sdpa_desc *desc, attn__sdpa_shape *sh, attn_sdpa_desc *run);
// Scratch needed by attn__sdpa_run for a checked descriptor.
size_t attn__sdpa_workspace(const attn_ctx *ctx, const attn__sdpa_shape *sh, const attn_sdpa_desc *d);
// Whether attn__sdpa_run's forward runs on ctx's bf16 dot products for a checked descriptor.
bool attn__sdpa_dot_applies(const attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh);
// Runs the kernel chosen for ctx on a checked descriptor with `ws` (>= attn__sdpa_workspace bytes).
// q, out (and in the backward out, dout, dq, dk, dv) are of the desc's q_dtype, out_dtype, grad_dtype.
void attn__sdpa_run(attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh, const void *q,
                    const void *k, const void *v, void *out, float *lse, float *weights, void *ws);

// The end of a fused kernel's softmax row (sinks.c): m and l are the row's running max and sum in
// base 2 (l = sum_j 2^(s_j - m) over the keys seen; 0 when none was, NaN after a NaN score). Adds
// the head's sink when `sinks` is not NULL (attn.h, attn_sdpa_desc.sinks), writes the row's
// natural-log lse (when lse is not NULL) and returns the factor of the unnormalised output:
// keep_scale / the normaliser, 0 for a row without weight, NaN for a NaN row.
float attn__softmax_finish(float m, float l, float keep_scale, const float *sinks, int64_t h, float *lse);

// The scalar reference kernel (src/ref/sdpa_ref.c): the specification every other kernel is
// tested against. Workspace: attn__sdpa_ref_workspace bytes.
size_t attn__sdpa_ref_workspace(const attn__sdpa_shape *sh);
void attn__sdpa_fwd_ref(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, attn_generator *gen, const void *q,
                        const void *k, const void *v, void *out, float *lse, float *weights, void *ws);

// The scalar reference backward (src/ref/sdpa_bwd_ref.c).
size_t attn__sdpa_bwd_ref_workspace(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, bool want_dmask);
void attn__sdpa_bwd_ref(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, const attn_generator *dropout_state,
                        const void *q, const void *k, const void *v, const void *dout, void *dq, void *dk, void *dv,
                        float *dmask, void *ws);
// Checks the gradient outputs of a checked descriptor (strides, dmask) and sizes the scratch.
attn_status attn__sdpa_bwd_check(attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh, bool want_dmask);
size_t attn__sdpa_bwd_workspace(const attn_ctx *ctx, const attn__sdpa_shape *sh, const attn_sdpa_desc *d,
                                bool want_dmask);
void attn__sdpa_bwd_run(attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh,
                        const attn_generator *dropout_state, const void *q, const void *k, const void *v,
                        const void *out, const void *dout, const float *lse, void *dq, void *dk, void *dv,
                        float *dmask, void *ws);

// ---- dense linear algebra -------------------------------------------------------------------
// y[r, o] = sum_i x[r, i] * W(o, i) + b[o] for r < rows, o < out.
//   x: (rows, in) with row stride ldx;  y: (rows, out) with row stride ldy
//   W: (out, in) row-major when !w_in_out (nn.Linear), (in, out) row-major when w_in_out (x @ W)
//   b: (out) or NULL
// Reference loops on ATTN_ISA_REF contexts, the fast GEMM (cpu/gemm.c) otherwise. ws must hold
// attn__linear_workspace(ctx, in) bytes.
size_t attn__linear_workspace(const attn_ctx *ctx, int64_t in);
// C (M x N, row stride ldc) = (accumulate ? C : 0) + A B, with A(m, k) = A[m*a_rs + k*a_cs] and
// B(k, n) = B[k*b_rs + n*b_cs]: the products of the backward passes (transposes are strides).
// Reference loops on ATTN_ISA_REF contexts, the gemm kernel on the context's threads otherwise;
// every element's sum runs over k in ascending order, so threads do not change the result.
size_t attn__matmul_workspace(const attn_ctx *ctx, int64_t N);
void attn__matmul(attn_ctx *ctx, int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_cs,
                  const float *B, int64_t b_rs, int64_t b_cs, float *C, int64_t ldc, bool accumulate, void *ws);
// The same product through CBLAS when ctx loaded it and it is the faster choice for ctx's kernels
// (see blas.c); returns false (doing nothing) otherwise.
bool attn__blas_linear(const attn_ctx *ctx, const float *x, int64_t rows, int64_t in, int64_t ldx, const float *W,
                       bool w_in_out, const float *b, int64_t out, float *y, int64_t ldy);
// With use_blas: loads the CBLAS library into ctx->blas_lib / blas_sgemm (left NULL where this
// build has none or it cannot be loaded); attn__blas_unload lets it go.
void attn__blas_load(attn_ctx *ctx);
void attn__blas_unload(attn_ctx *ctx);
void attn__linear(attn_ctx *ctx, const float *x, int64_t rows, int64_t in, int64_t ldx, const float *W, bool w_in_out,
                  const float *b, int64_t out, float *y, int64_t ldy, void *ws);
// The same map (W in nn.Linear's layout) with W of type wdt (F16 or BF16) read as it is, never
// through BLAS. Few rows (decoding): W converted exactly as it is loaded, the bits of the library's
// own few-rows product on W converted to float32. More rows, BF16 W on a table with bf16 dot
// products (AVX512-BF16, AMX-BF16): x's rows rounded to bf16 and the products on those instructions
// (cpu/gemm.h's attn__gemm_dot_linear: float32 sums in their own order). Only where
// attn__linear_half_applies (a context with kernels, not ATTN_ISA_REF, and one of those two cases).
// ws as attn__linear's.
bool attn__linear_half_applies(const attn_ctx *ctx, attn_dtype wdt, int64_t rows, int64_t in);
void attn__linear_half(attn_ctx *ctx, const float *x, int64_t rows, int64_t in, int64_t ldx, const void *W,
                       attn_dtype wdt, const float *b, int64_t out, float *y, int64_t ldy, void *ws);

// ---- random ------------------------------------------------------------------------------------
// One float32 uniform in [0,1) with 24 random bits (torch's uniform_real_distribution<float>).
float attn__rand_unit_f32(attn_generator *gen);
// One double uniform in [0,1) with 53 random bits.
double attn__rand_unit_f64(attn_generator *gen);
// True when a dropout draw keeps the element (u < 1 - p, two 32-bit draws).
static inline bool attn__dropout_keep(attn_generator *gen, double keep_prob) {
    return attn__rand_unit_f64(gen) < keep_prob;
}

// ---- module parameters (shared by attn_mha and attn_book) --------------------------------------
// A module's parameters: a small table of named tensors of one element type (F32, or F16 / BF16
// for a low-precision nn.MultiheadAttention) sharing one allocation, laid end to end in table order.
#define ATTN_PARAM_NAME_MAX 48
typedef struct attn__param {
    char name[ATTN_PARAM_NAME_MAX];
    int ndim;
    int64_t shape[3];
    int64_t numel;
    int64_t offset; // elements from the start of the storage
    void *data;     // numel elements of the table's dtype
} attn__param;

typedef struct attn__params {
    attn__param *items;
    int count, capacity;
    attn_dtype dtype; // of every parameter: F32 (0, the default), F16 or BF16
    int64_t numel;    // all parameters together (set by attn__params_alloc)
    void *storage;
} attn__params;

// Appends a parameter (data assigned by attn__params_alloc). Returns an error for overflow.
attn_status attn__params_add(attn_ctx *ctx, attn__params *p, const char *name, int ndim, const int64_t *shape);
// Allocates zeroed storage of p->dtype for every parameter added so far and points each `data`
// (and `offset`) into it.
attn_status attn__params_alloc(attn_ctx *ctx, attn__params *p);
void attn__params_free(const attn_allocator *a, attn__params *p);
// Looks a parameter up by name (NULL if absent).
attn__param *attn__params_find(const attn__params *p, const char *name);
// Fills the optional outputs of the public *_param_at / *_param functions.
void attn__param_describe(const attn__param *prm, const char **name, int *ndim, int64_t *shape, int shape_len,
                          void **data);

#endif // ATTN_INTERNAL_H

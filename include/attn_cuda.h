/*
 * attn_cuda.h - attention on NVIDIA GPUs: the public interface of libattn_cuda.
 *
 * libattn_cuda is a library of its own beside libattn (which it uses for descriptors, checks and
 * the CPU modules), so libattn keeps needing nothing but libc, libm and pthreads. It runs:
 *  - scaled dot-product attention forward with the semantics of attn_sdpa_desc (attn.h): strides,
 *    GQA, scale, causal top-left and bottom-right, local windows, ALiBi, soft cap, bool or float
 *    attention mask, key padding mask, log-sum-exp out, Philox dropout; q, k, v and out in BF16 or
 *    F16 (float32 accumulation) or F32; packed variable-length batches;
 *  - its backward (dq, dk, dv from the forward's out and lse), for the same options;
 *  - nn.MultiheadAttention's forward and its training (attn_cuda_mha_*), projections on cuBLASLt;
 *  - KV caches on the device, contiguous or paged, appended to and attended by a batch of sequences
 *    of different lengths.
 *
 * Conventions (beside those of attn.h):
 *  - Tensors are device pointers (cudaMalloc'd or otherwise device-accessible); host arrays are
 *    named so (cu_seqlens, per-sequence counts). Strides count elements, as in attn.h.
 *  - Work runs on the context's stream, in order. No call synchronises the device or the stream
 *    behind the caller's back: compute calls return when the work is enqueued. Host arrays passed
 *    to a call (cu_seqlens, counts) may be reused as soon as it returns (they are copied to the
 *    device with cudaMemcpyAsync from pageable memory, which stages them at once).
 *    Contexts allocate their own workspace stream-ordered (cudaMallocAsync / cudaFreeAsync) when
 *    the caller gives none; compute calls allocate only when that workspace must grow.
 *  - A tensor the device cannot read (pageable host memory, unless the system lets GPUs read it) is
 *    refused with ATTN_ERR_INVALID_ARG (cudaPointerGetAttributes on each pointer), not left to fault.
 *  - Every argument is checked on the host before anything is launched: a bad argument returns a
 *    status with a one-line message (attn_cuda_ctx_last_error) and enqueues nothing. A CUDA failure
 *    returns ATTN_ERR_DEVICE with the CUDA error in the message. The library never aborts.
 *  - Without a usable GPU (no driver, no device, compute capability below 8.0) attn_cuda_ctx_create
 *    returns ATTN_ERR_DEVICE; attn_cuda_probe says why.
 *  - Asynchronous errors of earlier work (a kernel that faulted) surface at a later call or at the
 *    caller's own synchronisation, as everywhere in CUDA.
 *  - One context must not be used by two threads at once; a cache or module is used on one stream.
 *  - Dropout on the GPU is counter-based: dropout_rng = ATTN_DROPOUT_RNG_PHILOX with dropout_seed and
 *    dropout_offset (attn.h), the same mask the CPU draws for that descriptor, so a GPU result can
 *    be checked against the CPU's. The context generator's dropout (ATTN_DROPOUT_RNG_CONTEXT, torch's
 *    CPU F.dropout bit for bit) is the CPU's alone: the GPU calls reject it, and weights_mode != NONE,
 *    with ATTN_ERR_UNSUPPORTED.
 *  - A key that the masks hide never contributes its score. Unlike on the CPU, NaN or inf stored in
 *    the *value* row of a hidden key inside a processed tile can reach the row through the tensor-core
 *    product (0 * inf); the simple kernel (ATTN_CUDA_KERNELS_SIMPLE) skips such keys as the CPU does.
 */
#ifndef ATTN_CUDA_H
#define ATTN_CUDA_H

#include "attn.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(ATTN_CUDA_SHARED_BUILD)
#define ATTN_CUDA_API __declspec(dllexport)
#elif defined(__GNUC__)
#define ATTN_CUDA_API __attribute__((visibility("default")))
#else
#define ATTN_CUDA_API
#endif

/* The CUDA stream type without the CUDA headers: attn_cuda_stream is cudaStream_t. */
struct CUstream_st;
typedef struct CUstream_st *attn_cuda_stream;

/* ------------------------------------------------------------------------------------------ */
/* Devices and contexts                                                                       */
/* ------------------------------------------------------------------------------------------ */

/** Which kernels a context runs. AUTO picks the fastest that applies to the device and the call. */
typedef enum attn_cuda_kernels {
    ATTN_CUDA_KERNELS_AUTO = 0,
    ATTN_CUDA_KERNELS_SIMPLE = 1, /* the simple kernel for every call: float32 arithmetic, one warp per
                                     query row, any head dim, every option (the fallback and the check) */
    ATTN_CUDA_KERNELS_SM80 = 2,   /* the mma.sync (sm_80) kernels even on Hopper; the simple kernel where
                                     they do not apply */
    ATTN_CUDA_KERNELS_SM90 = 3    /* as SM80, and on a device of compute capability 9.0 (a library built
                                     with sm_90a code, the default) the forward on Hopper's warpgroup
                                     MMA ("flash-sm90") where it applies; AUTO does not choose it yet
                                     (docs/cuda.md: its state) */
} attn_cuda_kernels;

/**
 * Device memory hooks (attn_cuda_ctx_params.allocator): every device allocation the library makes
 * for a context (its workspace, KV caches and modules created on it: storage, parameters, scratch)
 * goes through them, e.g. to a framework's caching allocator. alloc returns `size` bytes of device
 * memory of the context's device that any stream may use from then on (as cudaMalloc's, or a
 * caching allocator's block for `stream`), or NULL (ATTN_ERR_OUT_OF_MEMORY, nothing else changed);
 * free gives back a pointer alloc returned while work enqueued on `stream` may still be using it
 * (a caching allocator reuses it after that work, as for a block recorded on the stream; a plain
 * cudaFree waits). Both NULL (the default):
 * cudaMallocAsync / cudaFreeAsync on the stream for the workspace and modules' scratch, cudaMalloc /
 * cudaFree for caches and parameters. One set and not the other: ATTN_ERR_INVALID_ARG.
 */
typedef struct attn_cuda_allocator {
    void *(*alloc)(void *user, size_t size, attn_cuda_stream stream);
    void (*free)(void *user, void *ptr, attn_cuda_stream stream);
    void *user;
} attn_cuda_allocator;

typedef struct attn_cuda_ctx_params {
    int device;                /* CUDA device ordinal (default 0) */
    attn_cuda_stream stream;   /* stream the work is enqueued on; NULL = the default stream */
    attn_cuda_kernels kernels; /* kernel selection (default AUTO) */
    int deterministic;         /* nonzero: the backward gives the same bits on every run (the tensor-core
                                  backward computes dQ per query tile in a kernel of its own instead of
                                  adding into it with float32 atomics; predicted cost in docs/cuda.md).
                                  Default 0: atomics, which sum dQ in a run-dependent order. The simple
                                  kernels are deterministic either way. */
    attn_cuda_allocator allocator; /* device memory hooks (above); all NULL = the CUDA runtime's */
} attn_cuda_ctx_params;

typedef struct attn_cuda_ctx attn_cuda_ctx;

/** What the context's device is. */
typedef struct attn_cuda_device_props {
    char name[256];
    int cc_major, cc_minor;    /* compute capability */
    int sm_count;
    size_t global_mem;         /* bytes */
    int driver_version, runtime_version; /* as cudaDriverGetVersion / cudaRuntimeGetVersion */
    char arch_built[64];       /* the architectures this library carries machine code for, e.g. "80-real;90a-real" */
} attn_cuda_device_props;

/** Fills `params` with the defaults (device 0, default stream, AUTO, not deterministic, the CUDA
 *  runtime's allocations). */
ATTN_CUDA_API void attn_cuda_ctx_params_init(attn_cuda_ctx_params *params);
/**
 * Whether `device` can run this library, with the reason when it cannot in msg, one line (msg may be
 * NULL). Makes `device` current on the calling thread when it exists (cudaSetDevice).
 * @return ATTN_OK; ATTN_ERR_DEVICE when there is no CUDA driver or device, when the ordinal is out of
 *         range, or when the device's compute capability is below 8.0 or has no machine code here.
 */
ATTN_CUDA_API attn_status attn_cuda_probe(int device, char *msg, size_t msg_size);
/**
 * Creates a context on params->device (NULL params: the defaults). Makes that device current on
 * the calling thread (cudaSetDevice).
 * @return ATTN_OK and *ctx; ATTN_ERR_DEVICE (see attn_cuda_probe for the reason), ATTN_ERR_INVALID_ARG
 *         (bad kernels value or device, half an allocator, a stream of another device: see
 *         attn_cuda_ctx_set_stream), ATTN_ERR_OUT_OF_MEMORY; *ctx = NULL on failure.
 */
ATTN_CUDA_API attn_status attn_cuda_ctx_create(const attn_cuda_ctx_params *params, attn_cuda_ctx **ctx);
/** Frees a context and the workspace it owns (after the context's stream has finished with it:
 *  stream-ordered). NULL is allowed. */
ATTN_CUDA_API void attn_cuda_ctx_free(attn_cuda_ctx *ctx);
/** @return the message of the last failure on this context ("" if none). */
ATTN_CUDA_API const char *attn_cuda_ctx_last_error(const attn_cuda_ctx *ctx);
/** Enqueues later work on `stream`. The caller orders the old stream's work before the new one's
 *  (the context's workspace is reused across calls). A stream of another device than the
 *  context's is refused (ATTN_ERR_INVALID_ARG, the stream unchanged), as cudaStreamGetDevice tells;
 *  NULL (the legacy default stream) is always accepted. */
ATTN_CUDA_API attn_status attn_cuda_ctx_set_stream(attn_cuda_ctx *ctx, attn_cuda_stream stream);
ATTN_CUDA_API attn_cuda_stream attn_cuda_ctx_stream(const attn_cuda_ctx *ctx);
/** Describes the context's device. */
ATTN_CUDA_API attn_status attn_cuda_ctx_device(const attn_cuda_ctx *ctx, attn_cuda_device_props *props);
/**
 * Gives the context a caller-owned device workspace (any alignment: the context uses it from its
 * first 256-byte boundary; the sizes the *_workspace_size calls report include that). From then on
 * a call needing more fails with ATTN_ERR_WORKSPACE. NULL, 0 goes back to context-owned workspace.
 * Host memory the device cannot read is refused (ATTN_ERR_INVALID_ARG), the context unchanged.
 */
ATTN_CUDA_API attn_status attn_cuda_ctx_set_workspace(attn_cuda_ctx *ctx, void *buffer, size_t size);
/** Grows the context-owned workspace to `size` bytes now (stream-ordered). */
ATTN_CUDA_API attn_status attn_cuda_ctx_reserve(attn_cuda_ctx *ctx, size_t size);

/* ------------------------------------------------------------------------------------------ */
/* Scaled dot-product attention forward                                                       */
/* ------------------------------------------------------------------------------------------ */

/*
 * The GPU runs attn_sdpa_desc as attn.h defines it (the descriptor is checked by
 * attn_sdpa_desc_check, as on the CPU), with these limits (ATTN_ERR_UNSUPPORTED otherwise):
 * dropout only from ATTN_DROPOUT_RNG_PHILOX, weights_mode = NONE, no sinks (yet); head_dim and head_dim_v <= 1024. The
 * mask, key padding mask and alibi_slopes pointers are device pointers. Kernels:
 *  - "flash": tensor cores (mma.sync, sm_80 and later) for q, k, v and out all BF16 or all F16,
 *    head_dim = head_dim_v in {32, 64, 96, 128, 256}, unit stride along D and 16-byte aligned
 *    pointers and row strides (multiples of 8 elements);
 *  - "flash-sm90": with ATTN_CUDA_KERNELS_SM90 on compute capability 9.0, the "flash" calls with
 *    head_dim 64 or 128, no mask, key padding mask, ALiBi, soft cap or dropout, and keys in
 *    sequence order (no page table): warpgroup MMA (wgmma, sm_90a) reading K and V from shared
 *    memory;
 *  - "decode": split-KV decoding (flash-decoding) when a kv head has at most 16 query rows
 *    (n_heads / n_kv_heads * len_q <= 16: one or a few new tokens), head dims up to 256 (128 above
 *    4 rows), any element types and strides, every option; with the AUTO kernel choice;
 *  - "simple": everything else (F32, mixed types, other head dims, unaligned views).
 * Results agree with the CPU reference to the tolerances docs/cuda.md gives per type.
 */

/** Device workspace bytes attn_cuda_sdpa_fwd needs for `desc` (0 for plain batches; varlen calls need room for the device copy of the offsets). */
ATTN_CUDA_API attn_status attn_cuda_sdpa_fwd_workspace_size(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc,
                                                            size_t *bytes);
/**
 * SDPA forward on device tensors, enqueued on the context's stream.
 * @param q, k, v, out  as attn_sdpa_fwd, device pointers of desc->q_dtype, kv_dtype, out_dtype
 * @param lse           (B, H, L) contiguous float32 device array, or NULL
 */
ATTN_CUDA_API attn_status attn_cuda_sdpa_fwd(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc, const void *q,
                                             const void *k, const void *v, void *out, float *lse);
/** Variable-length packed batches, as attn_sdpa_varlen_fwd (cu_seqlens are HOST arrays of B + 1
 *  offsets; lse is (H, total_q)). */
ATTN_CUDA_API attn_status attn_cuda_sdpa_varlen_fwd_workspace_size(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc,
                                                                   const int64_t *cu_seqlens_q,
                                                                   const int64_t *cu_seqlens_k, size_t *bytes);
ATTN_CUDA_API attn_status attn_cuda_sdpa_varlen_fwd(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc,
                                                    const int64_t *cu_seqlens_q, const int64_t *cu_seqlens_k,
                                                    const void *q, const void *k, const void *v, void *out,
                                                    float *lse);
/* ------------------------------------------------------------------------------------------ */
/* Scaled dot-product attention backward                                                      */
/* ------------------------------------------------------------------------------------------ */

/*
 * The gradients of attn_sdpa_bwd (attn.h) on device tensors: the weights are recomputed from q, k
 * and the forward's lse (nothing of size L x S is stored); Philox dropout regenerates the forward's
 * mask from the same descriptor. Every option and type of the forward; dq, dk, dv of
 * desc->grad_dtype at q_stride, k_stride, v_stride (no stride 0 on a dimension longer than 1; with
 * GQA dk and dv hold the sum over the query heads of each kv head). Kernels
 * (attn_cuda_sdpa_bwd_kernel_name says which):
 *  - "flash": tensor cores (FlashAttention-2's backward on mma.sync, sm_80 and later) on the
 *    forward's "flash" conditions (q, k, v, out, dout all BF16 or all F16, unit stride along D,
 *    16-byte aligned pointers and row strides) with head_dim = head_dim_v in {32, 64, 96, 128}, and
 *    256 when ATTN_CUDA_KERNELS_SM80 or SM90 names these kernels (AUTO runs the simple kernels at
 *    256 until a GPU has run this form: docs/cuda.md). The
 *    weights P and the score gradients dS are rounded to the input type before their products, as
 *    FlashAttention does (tolerances in docs/cuda.md). dq is summed with float32 atomics, in an
 *    order that varies between runs (last-bit differences); with attn_cuda_ctx_params.deterministic
 *    a separate dQ kernel makes every run give the same bits;
 *  - "simple": everything else (float32 arithmetic, one warp per query row for dq and per key row
 *    for dk and dv, no atomics: the same bits on every run).
 * dmask, the float mask's gradient (as attn_sdpa_bwd's: written at mask_stride over the mask's
 * whole extent, cells sharing an element summed; an F32 mask is needed, ATTN_ERR_BAD_MASK
 * otherwise), runs the simple kernels whatever the types, adding each dS into dmask with float32
 * atomics: where several cells share a mask element (a broadcast mask) the order of the additions,
 * and so the last bits, vary between runs. Workspace: one float per query row (dout . out), plus the
 * offsets of packed batches, plus for "flash" (not deterministic) head_dim floats per query row.
 */
ATTN_CUDA_API attn_status attn_cuda_sdpa_bwd_workspace_size(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc,
                                                            size_t *bytes);
/**
 * SDPA backward on device tensors, enqueued on the context's stream.
 * @param q, k, v, out, lse  the forward's inputs, output and log-sum-exp ((B, H, L) float32)
 * @param dout      (B, H, L, Dv) at o_stride, of desc->out_dtype
 * @param dq, dk, dv  written, of desc->grad_dtype
 * @param dmask     NULL, or the float mask's gradient (device memory, float32, zeroed and then
 *                  written over the mask's extent)
 */
ATTN_CUDA_API attn_status attn_cuda_sdpa_bwd(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc, const void *q,
                                             const void *k, const void *v, const void *out, const void *dout,
                                             const float *lse, void *dq, void *dk, void *dv, float *dmask);
/** Packed batches, as attn_sdpa_varlen_bwd (cu_seqlens are HOST arrays; lse is (H, total_q)). */
ATTN_CUDA_API attn_status attn_cuda_sdpa_varlen_bwd_workspace_size(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc,
                                                                   const int64_t *cu_seqlens_q,
                                                                   const int64_t *cu_seqlens_k, size_t *bytes);
ATTN_CUDA_API attn_status attn_cuda_sdpa_varlen_bwd(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc,
                                                    const int64_t *cu_seqlens_q, const int64_t *cu_seqlens_k,
                                                    const void *q, const void *k, const void *v, const void *out,
                                                    const void *dout, const float *lse, void *dq, void *dk,
                                                    void *dv);

/* ------------------------------------------------------------------------------------------ */
/* KV caches on the device                                                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * A KV cache for a batch of sequences of different lengths, in device memory of F32, F16 or BF16:
 * contiguous ((batch, n_kv_heads, capacity, head_dim) keys and (..., head_dim_v) values) or, with
 * page_size > 0, paged as vLLM and FlashInfer page theirs (a pool of pages of page_size tokens,
 * (n_kv_heads, page_size, head_dim) each, and a page table per sequence that the kernels read every
 * key through). Appends take the new rows of every sequence packed; attend runs the planner's kernel
 * (split-KV decoding for few new tokens, tensor cores or the simple kernel otherwise) on each
 * sequence's keys so far. Paged and contiguous caches holding the same rows give the same results
 * (the same kernels; only the addresses differ). A cache is used on one stream.
 */
typedef struct attn_cuda_kv_cache attn_cuda_kv_cache;

typedef struct attn_cuda_kv_cache_config {
    int64_t batch, n_kv_heads, head_dim, head_dim_v; /* head_dim_v 0 means head_dim */
    int64_t capacity;  /* tokens per sequence */
    attn_dtype dtype;  /* F32, F16 or BF16 */
    int64_t page_size; /* 0: contiguous; else tokens per page */
} attn_cuda_kv_cache_config;

/** Zeroes `cfg`. */
ATTN_CUDA_API void attn_cuda_kv_cache_config_init(attn_cuda_kv_cache_config *cfg);
/** Allocates an empty cache on the context's device. ATTN_ERR_BAD_SHAPE, ATTN_ERR_UNSUPPORTED (dtype),
 *  ATTN_ERR_OVERFLOW, ATTN_ERR_OUT_OF_MEMORY. */
ATTN_CUDA_API attn_status attn_cuda_kv_cache_create(attn_cuda_ctx *ctx, const attn_cuda_kv_cache_config *cfg,
                                                    attn_cuda_kv_cache **cache);
ATTN_CUDA_API void attn_cuda_kv_cache_free(attn_cuda_kv_cache *cache);
/** The tokens each sequence holds (host array of batch values). */
ATTN_CUDA_API attn_status attn_cuda_kv_cache_lengths(const attn_cuda_kv_cache *cache, int64_t *lengths);
/** Empties every sequence. */
ATTN_CUDA_API attn_status attn_cuda_kv_cache_reset(attn_cuda_ctx *ctx, attn_cuda_kv_cache *cache);
/** Cuts sequence b back to lengths[b] tokens (a host array of batch values, 0 <= lengths[b] <= its
 *  length: a roll-back after rejected speculative tokens); the positions past it are forgotten.
 *  ATTN_ERR_INVALID_ARG, with nothing changed, for a length outside that range. */
ATTN_CUDA_API attn_status attn_cuda_kv_cache_truncate(attn_cuda_ctx *ctx, attn_cuda_kv_cache *cache,
                                                      const int64_t *lengths);
/**
 * Appends n_new[b] tokens to sequence b (n_new: host array of batch counts, 0 allowed): k (sum n_new,
 * n_kv_heads, head_dim) and v (sum n_new, n_kv_heads, head_dim_v), contiguous device arrays of the
 * cache's dtype, sequence 0's rows first. ATTN_ERR_CAPACITY (nothing appended) when a sequence
 * would grow past the capacity.
 */
ATTN_CUDA_API attn_status attn_cuda_kv_cache_append(attn_cuda_ctx *ctx, attn_cuda_kv_cache *cache,
                                                    const int64_t *n_new, const void *k, const void *v);
/**
 * Attention of packed queries against each sequence's cached keys and values: desc as for
 * attn_cuda_sdpa_varlen_fwd (batch, n_kv_heads, head dims and kv_dtype the cache's; q_stride and
 * o_stride read (0, head, token, dim); len_q the longest query count; len_kv is ignored), the queries
 * of sequence b at rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] (a HOST array of batch + 1 offsets);
 * causal NONE or BOTTOM_RIGHT (the last query of a sequence at its last key); no masks. lse is
 * (H, total_q) or NULL.
 */
ATTN_CUDA_API attn_status attn_cuda_kv_cache_attend(attn_cuda_ctx *ctx, const attn_cuda_kv_cache *cache,
                                                    const attn_sdpa_desc *desc, const int64_t *cu_seqlens_q,
                                                    const void *q, void *out, float *lse);

/* ------------------------------------------------------------------------------------------ */
/* nn.MultiheadAttention on the GPU                                                           */
/* ------------------------------------------------------------------------------------------ */

/*
 * A module on the GPU with the parameters of a libattn module (attn_mha, attn.h): the same
 * state_dict names, shapes and dtype (F32, F16 or BF16), copied to device memory. The forward is
 * attn_mha_forward's: projections x W^T + b on cuBLASLt (float32 accumulation; q, k, v rounded to
 * the module's type), the heads read in place as column blocks by attn_cuda_sdpa_fwd (scale
 * 1/sqrt(head_dim) on the scores), out_proj on cuBLASLt. Inputs and outputs are device tensors of
 * the module's type, (L, N, E) or (N, L, E) with batch_first, or (L, E) unbatched, contiguous;
 * masks as attn_mha_args says, on the device. kdim and vdim other than E (separate q/k/v weights;
 * key and value then of widths kdim and vdim), add_bias_kv and add_zero_attn as on the CPU (the keys
 * they add after the inputs' stay visible: the masks are widened to them on the device, in the
 * module's scratch or the training forward's saved buffer).
 * Not on the GPU (ATTN_ERR_UNSUPPORTED): the attention weights (need_weights must be 0), dropout
 * from the context's generator (the GPU's is Philox, from the seed and offset of the arguments);
 * attn_cuda_mha_forward_cached needs kdim = vdim = E and no added keys (as attn_mha_forward_cached).
 * cuBLASLt is opened at run time (libcublasLt.so.13, .so.12, .so, or $ATTN_CUBLASLT_LIBRARY):
 * without it attn_cuda_mha_create answers ATTN_ERR_UNSUPPORTED. A module is used on one stream
 * (it keeps a scratch buffer allocated on the context's stream).
 * Training: attn_cuda_mha_forward_train keeps the projections, the attention's output and its
 * log-sum-exp in a caller device buffer of attn_cuda_mha_saved_size bytes; attn_cuda_mha_backward
 * takes the same args and that buffer and writes the inputs' gradients (the module's type; a tensor
 * passed as several inputs receives the sum of its uses in the first: dkey / dvalue must then be
 * NULL) and the parameters' gradients (float32 device arrays in state_dict order, each NULL or of
 * the parameter's shape; overwritten, not accumulated). With F16/BF16 modules the gradient of the
 * attention's output and of the projections are rounded to the type between the steps (the CPU
 * keeps them in float32).
 */
typedef struct attn_cuda_mha attn_cuda_mha;

/** Copies `host`'s configuration and parameters to the context's device. */
ATTN_CUDA_API attn_status attn_cuda_mha_create(attn_cuda_ctx *ctx, attn_mha *host, attn_cuda_mha **mha);
/** Frees a module (NULL allowed). */
ATTN_CUDA_API void attn_cuda_mha_free(attn_cuda_mha *mha);
/** A parameter by state_dict name: its shape, dtype and device pointer (any output may be NULL).
 *  @return ATTN_ERR_NOT_FOUND if absent. */
ATTN_CUDA_API attn_status attn_cuda_mha_param(attn_cuda_mha *mha, const char *name, int *ndim, int64_t shape[3],
                                              attn_dtype *dtype, void **data);
/** Copies the parameters back into `host` (a module of the same configuration), waiting for the
 *  context's stream. */
ATTN_CUDA_API attn_status attn_cuda_mha_to_host(attn_cuda_ctx *ctx, const attn_cuda_mha *mha, attn_mha *host);

typedef struct attn_cuda_mha_args {
    attn_mha_args base;      /* attn.h's arguments; pointers are device pointers; need_weights = 0 */
    uint64_t dropout_seed;   /* with base.training and the module's dropout > 0: the Philox key ... */
    uint32_t dropout_offset; /* ... and offset of the mask (attn_sdpa_desc.dropout_rng = PHILOX) */
} attn_cuda_mha_args;

/** attn_mha_args_init's defaults with need_weights = 0, seed and offset 0. */
ATTN_CUDA_API void attn_cuda_mha_args_init(attn_cuda_mha_args *args);
/** The forward (out: the query's shape, the module's type). */
ATTN_CUDA_API attn_status attn_cuda_mha_forward(attn_cuda_ctx *ctx, attn_cuda_mha *mha, const attn_cuda_mha_args *args,
                                                void *out);
/** Device bytes attn_cuda_mha_forward_train keeps for `args` (the buffer may start anywhere: the
 *  size includes room to align it). */
ATTN_CUDA_API attn_status attn_cuda_mha_saved_size(attn_cuda_ctx *ctx, attn_cuda_mha *mha,
                                                   const attn_cuda_mha_args *args, size_t *bytes);
/** The forward, keeping what the backward needs in `saved` (ATTN_ERR_WORKSPACE if too small). */
ATTN_CUDA_API attn_status attn_cuda_mha_forward_train(attn_cuda_ctx *ctx, attn_cuda_mha *mha,
                                                      const attn_cuda_mha_args *args, void *out, void *saved,
                                                      size_t saved_size);
/** Gradients given dout (out's shape); args and saved as the training forward's. */
ATTN_CUDA_API attn_status attn_cuda_mha_backward(attn_cuda_ctx *ctx, attn_cuda_mha *mha, const attn_cuda_mha_args *args,
                                                 const void *saved, size_t saved_size, const void *dout, void *dquery,
                                                 void *dkey, void *dvalue, float *const *dparams);

/**
 * Self-attention of `len` new tokens with a device KV cache (decoding), as attn_mha_forward_cached:
 * projects x ((len, batch, E), or (batch, len, E) with batch_first, device, the module's type), appends
 * the keys and values (heads split) to `cache` (batch sequences, n_kv_heads = num_heads, head_dim =
 * E / num_heads, the module's dtype; contiguous or paged), attends from the new queries to every
 * cached position (bottom-right causal) and applies out_proj into out (x's shape). A cache that does
 * not fit the module (ATTN_ERR_BAD_SHAPE) or has no room for len more tokens in a sequence
 * (ATTN_ERR_CAPACITY) is refused before anything is projected or appended: nothing changes.
 */
ATTN_CUDA_API attn_status attn_cuda_mha_forward_cached(attn_cuda_ctx *ctx, attn_cuda_mha *mha, attn_cuda_kv_cache *cache,
                                                       const void *x, int64_t batch, int64_t len, void *out);

/** The kernels the context's attn_cuda_sdpa_bwd would run for `desc` (16-byte aligned tensors):
 *  "flash" (tensor cores, dQ summed with float32 atomics), "flash-deterministic" (tensor cores, the
 *  context's deterministic flag: dQ by a kernel of its own) or "simple" (*name static). */
ATTN_CUDA_API attn_status attn_cuda_sdpa_bwd_kernel_name(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc,
                                                         const char **name);

/** The kernel the context would run for `desc`: "flash", "flash-sm90", "decode" or "simple" (*name
 *  static). */
ATTN_CUDA_API attn_status attn_cuda_sdpa_kernel_name(attn_cuda_ctx *ctx, const attn_sdpa_desc *desc,
                                                     const char **name);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_CUDA_H */

/*
 * attn.h - attention mechanisms in C: the public interface of libattn.
 *
 * libattn computes scaled dot-product attention (SDPA), PyTorch's nn.MultiheadAttention, and the
 * step-by-step attention modules of "Build a Large Language Model (From Scratch)", ch. 3, with
 * PyTorch's semantics: the same parameter names and layouts as a state_dict, the same masks, and a
 * CPU random generator that draws PyTorch's numbers, so a module seeded like a PyTorch example
 * holds PyTorch's weights bit for bit.
 *
 * Conventions used throughout:
 *  - Every function that can fail returns an attn_status; ATTN_OK is 0. The library never prints,
 *    never exits and never aborts on a caller's error. After a failure on a context,
 *    attn_ctx_last_error() gives a one-line message naming the offending argument.
 *  - Tensors are float32 unless said otherwise, passed as a pointer plus element strides (SDPA) or
 *    as contiguous row-major arrays (modules). Shapes are written as in PyTorch: (L, N, E) means
 *    L*N*E floats with E varying fastest.
 *  - Sizes are int64_t. Every size must be >= 1 unless a comment allows 0; products of sizes that
 *    overflow are rejected with ATTN_ERR_OVERFLOW before anything is allocated.
 *  - Bool tensors (masks) are one byte per element: 0 is False, any other value is True.
 *  - There is no global mutable state: an attn_ctx carries the random generator, the allocator,
 *    the thread count and the scratch memory. One context must not be used by two threads at
 *    once; separate contexts may be used concurrently.
 *  - Fully masked rows: when every key of a query row is masked, the row's attention weights and
 *    its output (context vector) are exactly zero and its log-sum-exp is -inf. They are never NaN.
 *    (PyTorch 1.13 returns NaN for such rows; PyTorch >= 2.5 SDPA, MLX and others return zeros.)
 */
#ifndef ATTN_H
#define ATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(ATTN_SHARED_BUILD)
#define ATTN_API __declspec(dllexport)
#elif defined(_WIN32) && defined(ATTN_SHARED)
#define ATTN_API __declspec(dllimport)
#elif defined(__GNUC__)
#define ATTN_API __attribute__((visibility("default")))
#else
#define ATTN_API
#endif

/* ------------------------------------------------------------------------------------------ */
/* Version                                                                                    */
/* ------------------------------------------------------------------------------------------ */

#define ATTN_VERSION_MAJOR 0
#define ATTN_VERSION_MINOR 1
#define ATTN_VERSION_PATCH 0
#define ATTN_VERSION_NUMBER (ATTN_VERSION_MAJOR * 10000 + ATTN_VERSION_MINOR * 100 + ATTN_VERSION_PATCH)

/** @return ATTN_VERSION_NUMBER of the library actually linked. */
ATTN_API int attn_version_number(void);
/** @return the version as "MAJOR.MINOR.PATCH". */
ATTN_API const char *attn_version_string(void);

/* ------------------------------------------------------------------------------------------ */
/* Status codes (values are pinned: they never change meaning)                                */
/* ------------------------------------------------------------------------------------------ */

typedef enum attn_status {
    ATTN_OK = 0,
    ATTN_ERR_INVALID_ARG = 1,     /* NULL pointer, value out of range, unknown enum value      */
    ATTN_ERR_BAD_SHAPE = 2,       /* sizes < 1 or that disagree; embed_dim % num_heads != 0    */
    ATTN_ERR_OVERFLOW = 3,        /* a product of sizes overflows int64_t / size_t             */
    ATTN_ERR_OUT_OF_MEMORY = 4,   /* the allocator returned NULL                               */
    ATTN_ERR_BAD_MASK = 5,        /* mask of the wrong dtype or shape                          */
    ATTN_ERR_CONTEXT_LENGTH = 6,  /* sequence longer than a module's context_length            */
    ATTN_ERR_WORKSPACE = 7,       /* caller-provided workspace is too small                    */
    ATTN_ERR_UNSUPPORTED = 8,     /* valid request this build or dtype does not support        */
    ATTN_ERR_NOT_FOUND = 9,       /* a named parameter or tensor is missing                    */
    ATTN_ERR_IO = 10,             /* a file could not be opened, read, written or renamed      */
    ATTN_ERR_BAD_FILE = 11,       /* a file is truncated or malformed, or its header lies      */
    ATTN_ERR_CAPACITY = 12,       /* a KV cache would grow past its capacity                   */
    ATTN_ERR_DEVICE = 13          /* a GPU is absent, or its driver or a launch failed (libattn_cuda) */
} attn_status;

/** @return a static, human-readable description of a status code (never NULL). */
ATTN_API const char *attn_strerror(attn_status status);

/* ------------------------------------------------------------------------------------------ */
/* Data types                                                                                 */
/* ------------------------------------------------------------------------------------------ */

typedef enum attn_dtype {
    ATTN_DTYPE_F32 = 0,
    ATTN_DTYPE_F64 = 1,
    ATTN_DTYPE_F16 = 2,
    ATTN_DTYPE_BF16 = 3,
    ATTN_DTYPE_BOOL = 4, /* one byte, 0 = False */
    ATTN_DTYPE_U8 = 5,
    ATTN_DTYPE_I32 = 6,
    ATTN_DTYPE_I64 = 7,
    /* Block-quantised types, ggml's layouts, for k and v (KV caches, attn_sdpa_fwd) and attn_convert:
     * a tensor of n values (n a multiple of 32) is n / 32 blocks laid end to end, each encoding 32
     * consecutive values with one scale d (IEEE half, little-endian, the block's first 2 bytes).
     * Q8_0: 34 bytes, then 32 int8 q[i]; value i = q[i] * d.
     * Q4_0: 18 bytes, then 16 bytes qs; value i = ((qs[i] & 15) - 8) * d and value i + 16 =
     *       ((qs[i] >> 4) - 8) * d for i < 16 (low nibbles hold the block's first half). */
    ATTN_DTYPE_Q8_0 = 8,
    ATTN_DTYPE_Q4_0 = 9
} attn_dtype;

/** @return the size in bytes of one element of `dtype`, or for a block type (Q8_0, Q4_0) of one
 *  block of attn_dtype_block_size(dtype) values (34, 18); 0 for an unknown value. The bytes of n
 *  values are n / attn_dtype_block_size(dtype) * attn_dtype_size(dtype). */
ATTN_API size_t attn_dtype_size(attn_dtype dtype);
/** @return the values per block: 32 for Q8_0 and Q4_0, 1 for the other types, 0 for an unknown value. */
ATTN_API int64_t attn_dtype_block_size(attn_dtype dtype);
/** @return a short name ("F32", "BOOL", "Q8_0", ...) or "?" for an unknown value. */
ATTN_API const char *attn_dtype_name(attn_dtype dtype);

/**
 * Converts n elements between F32 and F16 or BF16 (either way; the same type is a copy). F32 to
 * half rounds to nearest even as torch's .half() / .bfloat16(), overflow gives inf and NaN stays
 * NaN; half to F32 is exact. (This, as all of the library's float arithmetic, assumes the default
 * floating-point environment: rounding to nearest, subnormals not flushed.) dst and src may be the same buffer only for the same type.
 * F32 to Q8_0 or Q4_0 quantises n values (n a multiple of 32) block by block and writes the bytes
 * ggml's reference quantisers (quantize_row_q8_0_ref, quantize_row_q4_0_ref) write for the same
 * finite input: Q8_0 d = max|x| / 127, q = roundf(x * (1/d)); Q4_0 d = x_m / -8 with x_m the
 * block's value of largest magnitude (the first one), nibble = min(15, (int)(x * (1/d) + 8.5f));
 * d stored rounded to half (1/d taken before that rounding; d = 0, or 1/d overflowing on a block of
 * denormals, gives q = 0, nibble 8, where ggml's behaviour is undefined). A block
 * holding a NaN or an infinity, or whose scale rounds to infinity in half (max|x| >= about
 * 127 * 65520 for Q8_0, 8 * 65520 for Q4_0), cannot be represented: it is stored with a NaN scale (0x7e00) and
 * zero quants (Q4_0: nibbles 8), so all its 32 values read back as NaN. Q8_0 or Q4_0 to F32 gives
 * q * d exactly. Error of a value x of a block whose largest magnitude is m, for finite
 * representable blocks (tested, also on denormals, zero blocks and magnitudes near the limits):
 *   Q8_0: |x' - x| <= c * m + a,  c = 1/254 + 2^-11 + 2^-20,  a = 2^-18
 *   Q4_0: |x' - x| <= c * m + a,  c = 1/8 + 2^-10,            a = 2^-21
 * (1/254 and 1/8 are the quantisation steps: Q4_0 has 16 levels, so the value opposite x_m may
 * lose a whole step; the 2^-11 and 2^-10 terms cover the half rounding of d, a its subnormal range).
 * @return ATTN_OK, or ATTN_ERR_INVALID_ARG for another pair of types, n < 0, NULL buffers or, for
 *         a block type, n not a multiple of 32.
 */
ATTN_API attn_status attn_convert(attn_dtype dst_dtype, void *dst, attn_dtype src_dtype, const void *src, int64_t n);

/* ------------------------------------------------------------------------------------------ */
/* PyTorch-compatible CPU random generator                                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * attn_generator reproduces PyTorch's default CPU generator (torch 1.13 and 2.x, builds without
 * MKL, float32 kernels with AVX2 dispatch, i.e. any x86-64 PC): a 32-bit MT19937 seeded like
 * torch.manual_seed, plus the cached second value of the double-precision Box-Muller transform.
 * Each function below draws the same numbers, in the same order, as the PyTorch call it names,
 * so interleaving them like a Python program does reproduces that program's tensors bit for bit.
 * The struct is public so it can live on the stack; treat its fields as private.
 */
typedef struct attn_generator {
    uint32_t mt[624];
    int32_t left;        /* draws left before the next twist */
    int32_t next;        /* index of the next state word */
    int32_t has_normal;  /* 1 when `normal` holds a cached Box-Muller value */
    int32_t reserved;
    double normal;
} attn_generator;

/** torch.manual_seed(seed): only the low 32 bits of `seed` are used; clears the normal cache. */
ATTN_API void attn_generator_seed(attn_generator *gen, uint64_t seed);
/** One tempered 32-bit MT19937 output (torch's generator.random()). */
ATTN_API uint32_t attn_generator_random(attn_generator *gen);
/** Two outputs, the first one as the high word (torch's generator.random64()). */
ATTN_API uint64_t attn_generator_random64(attn_generator *gen);

/**
 * out[0..n) = torch.empty(n).uniform_(from, to), in memory order (torch.rand when from=0, to=1).
 * Each element takes one 32-bit draw. from and to are rounded to float first, as PyTorch does;
 * x * (to - from) + from is one fused multiply-add, as in PyTorch's AVX2 kernels. n may be 0.
 * @return ATTN_ERR_INVALID_ARG for a NULL generator, a NULL out with n > 0, n < 0, non-finite
 *         bounds, from > to, bounds outside the float range or to - from > FLT_MAX (as PyTorch).
 */
ATTN_API attn_status attn_rand_uniform(attn_generator *gen, float *out, int64_t n, double from, double to);
/**
 * out[0..n) = torch.empty(n).normal_(mean, std) on a contiguous float32 tensor (torch.randn when
 * mean=0, std=1): n < 16 uses double Box-Muller with the cached value and computes z*std + mean as
 * one double fused multiply-add; n >= 16 uses the 16-wide block transform of PyTorch's vectorised
 * kernel with mean and std rounded to float. n may be 0. The n < 16 path calls the C library's
 * double log/sin/cos, as PyTorch does: identical to PyTorch on glibc.
 * @return ATTN_ERR_INVALID_ARG for NULL pointers, n < 0, std < 0 or non-finite mean/std.
 */
ATTN_API attn_status attn_rand_normal(attn_generator *gen, float *out, int64_t n, double mean, double std);
/**
 * out[i] = 1 with probability p, else 0: torch.empty(n).bernoulli_(p) (scalar p, non-MKL path:
 * one 53-bit double (two 32-bit draws) per element, 1 when u < p; also for p = 0 and p = 1).
 * @return ATTN_ERR_INVALID_ARG for NULL pointers, n < 0 or p outside [0, 1].
 */
ATTN_API attn_status attn_rand_bernoulli(attn_generator *gen, float *out, int64_t n, double p);
/**
 * y = torch.nn.functional.dropout(x, p, training=True) on n contiguous floats: y = x * noise with
 * noise = float(1/float(1-p)) for kept elements and 0 for dropped ones (so a dropped -1 gives -0.0
 * and a dropped inf gives NaN, as in PyTorch). p = 0 copies x and p = 1 gives x * 0, both without
 * drawing. x and y may be the same array.
 * @return ATTN_ERR_INVALID_ARG for NULL pointers, n < 0 or p outside [0, 1].
 */
ATTN_API attn_status attn_rand_dropout(attn_generator *gen, const float *x, float *y, int64_t n, double p);

/*
 * Initialisers. Each returns ATTN_ERR_INVALID_ARG for NULL pointers, ATTN_ERR_BAD_SHAPE for sizes
 * < 1 and ATTN_ERR_OVERFLOW when the element count overflows; nothing is drawn on error.
 */
/**
 * nn.Linear(in_features, out_features, bias) initialisation: weight (out_features, in_features)
 * from kaiming_uniform_(a=sqrt(5)), then bias (out_features) from U(-1/sqrt(in), 1/sqrt(in)).
 * bias may be NULL (bias=False: no draws for it).
 */
ATTN_API attn_status attn_init_linear(attn_generator *gen, float *weight, float *bias, int64_t in_features,
                                      int64_t out_features);
/** nn.init.xavier_uniform_ on a (fan_out, fan_in) matrix, gain 1. */
ATTN_API attn_status attn_init_xavier_uniform(attn_generator *gen, float *w, int64_t fan_out, int64_t fan_in);
/** nn.init.xavier_normal_ on n elements with the given fans (a (1,1,E) tensor has fans E and E). */
ATTN_API attn_status attn_init_xavier_normal(attn_generator *gen, float *w, int64_t n, int64_t fan_in,
                                             int64_t fan_out);
/** nn.Embedding(num, dim, padding_idx): N(0,1) over num*dim, then row padding_idx zeroed. A negative
 *  padding_idx means none (PyTorch's negative indices count from the end: convert them first);
 *  padding_idx >= num is ATTN_ERR_INVALID_ARG. */
ATTN_API attn_status attn_init_embedding(attn_generator *gen, float *w, int64_t num, int64_t dim,
                                         int64_t padding_idx);

/* ------------------------------------------------------------------------------------------ */
/* Context                                                                                    */
/* ------------------------------------------------------------------------------------------ */

typedef struct attn_ctx attn_ctx;

/** Memory hooks. alloc returns memory aligned to `align` (a power of two) or NULL. */
typedef struct attn_allocator {
    void *(*alloc)(void *user, size_t size, size_t align);
    void (*free)(void *user, void *ptr);
    void *user;
} attn_allocator;

/**
 * Threads of the caller's for a context's parallel loops (attn_ctx_params.executor), in place of
 * threads the context starts itself: a program with a thread pool of its own (an OpenMP runtime,
 * PyTorch's) runs attn's loops on that pool rather than beside it, where the two pools' threads
 * would share the cores (an OpenMP runtime's idle threads busy-wait for milliseconds after each
 * parallel region).
 * `parallel` calls task(task_arg, i) for every i in [0, n) and returns when those calls have
 * returned, the returns synchronising with its own (a thread join, a barrier); the calls may run at
 * once, on up to n threads (the caller's among them), or one after another, in any order. n is
 * the context's n_threads; i picks per-thread scratch memory, so calls running at the same time
 * need different i. The work is handed out inside those calls (tasks taken from a shared counter),
 * so results are the same bits however many run at once; tasks no call took (an executor that ran
 * none) run on the calling thread after `parallel` returns.
 * attn_executor_gomp makes one from an OpenMP runtime.
 */
typedef struct attn_executor {
    void (*parallel)(void *user, int n, void (*task)(void *task_arg, int i), void *task_arg);
    void *user;
} attn_executor;

/**
 * An executor on an OpenMP runtime, given its entry point GOMP_parallel (GCC's libgomp exports it,
 * LLVM's libomp and Intel's libiomp5 as well for GCC's code; pass what dlsym returns for it, from
 * the runtime the program already runs, e.g. the one PyTorch loaded): each loop is one parallel
 * region of n threads, which take the indices i in turn, so an OpenMP thread team that is already
 * waiting runs it at once. The library links no OpenMP runtime; it calls the one given. Called from
 * inside a parallel region (without nested parallelism) a loop runs on the calling thread alone.
 * @return ATTN_OK and *out, or ATTN_ERR_INVALID_ARG for NULL arguments (*out untouched).
 */
ATTN_API attn_status attn_executor_gomp(void *gomp_parallel, attn_executor *out);

/**
 * Which kernels a context uses. AUTO picks the fastest this CPU runs. REF is the scalar reference
 * (the specification: plain loops, one thread, slow); GENERIC the fused kernels in portable C;
 * AVX2 the fused kernels with AVX2 and FMA3 (Q8_0 and Q4_0 decoding on 8- and 16-bit integer
 * products: attn_sdpa_desc.kv_dtype; where the CPU also has AVX-VNNI, Intel's cores since Alder
 * Lake and Sapphire Rapids, on its 256-bit dot products, the same results in fewer instructions);
 * AVX512 with AVX-512F; AVX512_VNNI the AVX512 kernels
 * with the q . k of Q8_0 and Q4_0 decoding on 8-bit dot products (vpdpbusd, AVX512-VNNI with
 * AVX512-BW and VL: CPUs without AVX512-BF16 such as Intel's Cascade Lake and Ice Lake) and a P V of
 * their own that scales the weights by the block scales instead of the values (see
 * attn_sdpa_desc.kv_dtype; where the CPU also has AVX512-VBMI, every such CPU since Ice Lake, that
 * P V pairs the keys' quants with its byte permutes, the same results in fewer instructions);
 * AVX512_BF16 the AVX512_VNNI kernels plus bf16 dot products (vdpbf16ps, AVX512-BF16 and
 * AVX512-BW) for the fused forward and backward of bf16 tensors
 * (attn_sdpa_desc.q_dtype and grad_dtype say how their errors differ); AMX_BF16 the AVX512_BF16
 * kernels with those products on AMX tiles (tdpbf16ps, AMX-BF16: the same exact bf16 products
 * summed in float32, so the same error bounds; Xeons since Sapphire Rapids, Linux granting the
 * process the tile state). Each is chosen at run time from what the CPU supports, never required at
 * build time; AUTO prefers AMX_BF16, then AVX512_BF16 except on Intel's CPUs, AVX512_VNNI,
 * AVX512, AVX2, GENERIC. (The values follow the order in which they were added, not this
 * preference.) Intel's cores run vdpbf16ps at half the flops a cycle of their float32 FMAs (a
 * Sapphire Rapids-generation Xeon: 86 against 174 GFLOP/s a core), so there the AVX512_VNNI
 * kernels, float32 products on the converted bf16 values and vpdpwssd in quantised decoding, are
 * the faster (1.15-1.75 times, BENCHMARKS.md); a context that asks for AVX512_BF16 still gets it.
 * The fused kernels agree with the reference to about 1e-6 relative; calls that ask for the
 * attention weights run the reference whatever the ISA. Their softmax computes 2^x with a degree-6
 * polynomial: relative error below 1.2e-7 for arguments in [-126, 128] (about 1 ulp); weights below
 * 2^-126 of a row's largest become 0 (AVX-512: all of them, so that no denormal is computed, which
 * Intel's cores pay for with a microcode assist; AVX2, portable: those below 2^-126.5, denormal
 * between); masked keys get exactly 0.
 */
typedef enum attn_isa {
    ATTN_ISA_AUTO = 0,
    ATTN_ISA_REF = 1,
    ATTN_ISA_GENERIC = 2,
    ATTN_ISA_AVX2 = 3,
    ATTN_ISA_AVX512 = 4,
    ATTN_ISA_AVX512_BF16 = 5,
    ATTN_ISA_AMX_BF16 = 6,
    ATTN_ISA_AVX512_VNNI = 7
} attn_isa;

/** @return whether this build and this CPU can run `isa` (AUTO, REF and GENERIC always can). */
ATTN_API int attn_isa_supported(attn_isa isa);
/** @return "auto", "ref", "generic", "avx2", "avx512", "avx512bf16", "amxbf16", "avx512vnni" or "?". */
ATTN_API const char *attn_isa_name(attn_isa isa);
/* The names attn_isa_from_name takes, as a list for help texts and messages. */
#define ATTN_ISA_NAMES "auto, ref, generic, avx2, avx512, avx512vnni, avx512bf16 or amxbf16"
/** The ISA whose attn_isa_name is `name` ("auto" included; case-sensitive) into *isa, whether or
 * not this CPU supports it (attn_isa_supported says).
 * @return ATTN_OK, or ATTN_ERR_INVALID_ARG for NULL arguments or a name no ISA has (*isa untouched). */
ATTN_API attn_status attn_isa_from_name(const char *name, attn_isa *isa);
/** @return whether `isa` multiplies bf16 tensors on bf16 dot products (AVX512_BF16 and AMX_BF16),
 * whose error bounds attn_sdpa_desc.q_dtype and grad_dtype give beside float32's; those sets also
 * decode Q8_0 and Q4_0 caches on 8-bit and bf16 dot products (attn_sdpa_desc.kv_dtype). */
ATTN_API int attn_isa_bf16_dot(attn_isa isa);
/** @return whether the few-row decode kernels of `isa` round the query to int8 for Q8_0 and Q4_0
 * caches and meet the quants in 8-bit products (AVX2, AVX512_VNNI and the bf16 ISAs; the bound is
 * attn_sdpa_desc.kv_dtype's), as ggml rounds its activations for these types. */
ATTN_API int attn_isa_int8_query(attn_isa isa);
/** @return whether those decode kernels of `isa` round each P V weight times its key's block scale
 * to int16 (AVX2, AVX512_VNNI and AMX_BF16); the other ISAs of attn_isa_int8_query round it to bf16
 * (AVX512_BF16), the rest do not round it. attn_sdpa_desc.kv_dtype gives each rounding's bound. */
ATTN_API int attn_isa_int16_weights(attn_isa isa);

/**
 * @return 1 when contexts with use_blas can compute projections through CBLAS, which they do on AVX2
 * or portable kernels: this build knows one (found at build time, option ATTN_BLAS; not linked) and
 * it can be loaded now; 0 otherwise. The library is loaded (dlopen) by the first context created
 * with use_blas, or by this call, and stays loaded for the process; a program that does neither
 * never loads it, nor starts its threads. BLAS calls run the BLAS library's own threads (for
 * OpenBLAS: OPENBLAS_NUM_THREADS, which it reads when it is loaded).
 */
ATTN_API int attn_has_blas(void);

typedef struct attn_ctx_params {
    int n_threads;            /* threads used by compute calls (the caller's plus n_threads - 1
                                 started by the context); 0 = 1. Results are identical for every
                                 thread count. */
    attn_isa isa;             /* kernel selection, ATTN_ISA_AUTO by default */
    uint64_t seed;            /* seed of the context's generator (default 0) */
    attn_allocator allocator; /* all allocations go through it; {NULL,NULL,NULL} = aligned_alloc/free */
    int use_blas;             /* 0 (default): every product on the library's own GEMM and the
                                 context's threads; 1: projections through CBLAS (see attn_has_blas:
                                 loaded when the context is created; where it cannot be, the
                                 context's own GEMM serves) on contexts running AVX2 or portable
                                 kernels, except the decoding steps of F16 / BF16 modules (see
                                 there). The BLAS runs its own threads (OPENBLAS_NUM_THREADS), which
                                 busy-wait after each call and compete with the context's: measured
                                 in BENCHMARKS.md. */
    attn_executor executor;   /* {NULL, NULL} (default): the context starts n_threads - 1 threads of
                                 its own; else it starts none and runs each parallel loop through
                                 executor.parallel with n = n_threads (see attn_executor). */
} attn_ctx_params;

/** Fills `params` with the defaults (1 thread, AUTO, seed 0, system allocator, use_blas 0, the
 * context's own threads). */
ATTN_API void attn_ctx_params_init(attn_ctx_params *params);
/**
 * Creates a context. `params` may be NULL for the defaults.
 * @return ATTN_OK and *ctx, or an error and *ctx = NULL: ATTN_ERR_UNSUPPORTED when params->isa
 *         cannot run here, ATTN_ERR_OUT_OF_MEMORY when memory or threads cannot be had,
 *         ATTN_ERR_INVALID_ARG for n_threads outside [0, 4096], an unknown isa, an allocator or
 *         an executor with `user` set but no function.
 */
ATTN_API attn_status attn_ctx_create(const attn_ctx_params *params, attn_ctx **ctx);
/** @return the instruction set the context's kernels use (AUTO resolved), or REF. */
ATTN_API attn_isa attn_ctx_isa(const attn_ctx *ctx);
/** Frees a context, its threads and its scratch memory. NULL is allowed. */
ATTN_API void attn_ctx_free(attn_ctx *ctx);
/** @return the message of the last failure on this context ("" if none). Valid until the next call. */
ATTN_API const char *attn_ctx_last_error(const attn_ctx *ctx);
/** @return the context's generator, for seeding or drawing (torch.manual_seed = attn_generator_seed). */
ATTN_API attn_generator *attn_ctx_generator(attn_ctx *ctx);
/**
 * Gives the context a caller-owned scratch buffer. From then on compute calls never allocate
 * scratch memory; a call that needs more than `size` bytes fails with ATTN_ERR_WORKSPACE. Pass
 * NULL, 0 to go back to context-owned scratch (grown on demand, kept between calls). Any
 * alignment is accepted: the context uses the buffer from its first 64-byte boundary, and the
 * sizes attn_sdpa_*_workspace_size report include the 63 bytes this may cost.
 */
ATTN_API attn_status attn_ctx_set_workspace(attn_ctx *ctx, void *buffer, size_t size);
/** Grows the context-owned scratch to at least `size` bytes now, so later calls do not allocate. */
ATTN_API attn_status attn_ctx_reserve(attn_ctx *ctx, size_t size);

/* ------------------------------------------------------------------------------------------ */
/* Scaled dot-product attention                                                               */
/* ------------------------------------------------------------------------------------------ */

/*
 * For every batch b, head h and query row i:
 *   s[j]  = cap(scale * dot(q[b,h,i,:], k[b,hk,j,:])) + a(h,i,j) + m(b,h,i,j)
 *                                                       j = 0..S-1, hk = h / (H/Hkv)
 *   p     = softmax(s)                                  (a row with every s[j] = -inf gives p = 0)
 *   p'    = dropout(p)                                  (when dropout_p > 0)
 *   o[b,h,i,:] = sum_j p'[j] v[b,hk,j,:]
 *   lse[b,h,i] = log(sum_j exp(s[j]))                   (-inf for a fully masked row)
 * where m adds -inf for causally hidden keys and keys outside a local window, the attention mask and
 * the key padding mask; cap(x) = softcap * tanh(x / softcap) when softcap > 0 (else x); a(h,i,j) =
 * -alibi_slopes[h] * |i + off - j| with ALiBi (else 0). Query i and key j are aligned as the causal
 * mode says: off = S - L for ATTN_CAUSAL_BOTTOM_RIGHT, else 0 (the last query sees the last key).
 * Masks: a BOOL mask blocks where True (the nn.MultiheadAttention convention, the opposite of
 * torch SDPA's bool mask); an F32 mask is added (-inf blocks). When several masks are given their
 * contributions are added, and a key that any of them blocks (causal, a True bool entry or a
 * -inf float entry) is hidden: its score is -inf whatever the other masks and its q, k hold, so
 * NaN or inf in data a row cannot see does not reach that row.
 * Float arithmetic: the fused kernels fold scale * log2(e) into q, so a q element times that factor
 * must be a finite float (|scale * q| < about 2.3e38); past that, the row is NaN. They add the
 * float mask terms in that log2 domain too, clamped to float's range (attn_cuda.h's kernels as
 * well): where a score plus its finite mask terms passes about +-2.36e38 (FLT_MAX / log2(e)), it
 * counts as that value, so keys past it weigh alike and the row's lse lies within about +-2.36e38
 * (FLT_MAX * ln 2), where the reference's double sums hold more. The fused backwards clamp the lse
 * they are given the same way, so the reference's lse of such a row serves them too.
 */

typedef enum attn_causal {
    ATTN_CAUSAL_NONE = 0,
    ATTN_CAUSAL_TOP_LEFT = 1,    /* query i sees keys j <= i: torch.triu(ones(L,S), 1) blocks */
    ATTN_CAUSAL_BOTTOM_RIGHT = 2 /* query i sees keys j <= i + S - L (KV-cache decoding) */
} attn_causal;

typedef enum attn_weights_mode {
    ATTN_WEIGHTS_NONE = 0,
    ATTN_WEIGHTS_PER_HEAD = 1, /* weights out is (B, H, L, S), contiguous */
    ATTN_WEIGHTS_AVERAGE = 2   /* weights out is (B, L, S): sum over heads / H */
} attn_weights_mode;

/** Source of the dropout mask (attn_sdpa_desc.dropout_rng). */
typedef enum attn_dropout_rng {
    ATTN_DROPOUT_RNG_CONTEXT = 0, /* the context's generator: torch's CPU F.dropout, bit for bit (CPU only) */
    ATTN_DROPOUT_RNG_PHILOX = 1   /* counter-based Philox4x32-10 from dropout_seed and dropout_offset */
} attn_dropout_rng;

/** Memory layouts with a ready stride helper (attn_layout_strides). */
typedef enum attn_layout {
    ATTN_LAYOUT_BHLD = 0, /* (B, H, L, D) contiguous */
    ATTN_LAYOUT_BLHD = 1, /* (B, L, H*D): batch_first (N, L, E) with heads as column blocks */
    ATTN_LAYOUT_LBHD = 2  /* (L, B, H*D): PyTorch's default (L, N, E) */
} attn_layout;

/**
 * Fills stride[4] (elements, in (B, H, L, D) order) for a tensor of logical shape (B, H, L, D)
 * stored in `layout`. @return ATTN_ERR_INVALID_ARG for a bad layout or sizes < 1.
 */
ATTN_API attn_status attn_layout_strides(attn_layout layout, int64_t B, int64_t H, int64_t L, int64_t D,
                                         int64_t stride[4]);

typedef struct attn_sdpa_desc {
    int64_t batch;      /* B */
    int64_t n_heads;    /* H: query heads */
    int64_t n_kv_heads; /* Hkv: key/value heads, H % Hkv == 0 (GQA); 0 means H */
    int64_t len_q;      /* L */
    int64_t len_kv;     /* S */
    int64_t head_dim;   /* D of q and k */
    int64_t head_dim_v; /* Dv of v and out; 0 means D */
    /* Element strides in (B, H, L, D) order for q (B,H,L,D), k (B,Hkv,S,D), v (B,Hkv,S,Dv) and
     * out (B,H,L,Dv). Strides may be 0 (broadcast) for inputs, not for out. */
    int64_t q_stride[4], k_stride[4], v_stride[4], o_stride[4];
    float scale;          /* 0 means 1/sqrt(D); otherwise any finite value */
    attn_causal causal;   /* causal masking, combined with the masks below */
    /* Attention mask, logical shape (B, H, L, S) with element strides in that order: strides
     * {0, 0, S, 1} broadcast an (L, S) mask; {H*L*S, L*S, S, 1} give one per (batch, head). */
    const void *mask;     /* NULL: no mask */
    attn_dtype mask_dtype;  /* ATTN_DTYPE_BOOL (True blocks) or ATTN_DTYPE_F32 (added) */
    int64_t mask_stride[4];
    /* Key padding mask, logical shape (B, S), element strides {b, s}. */
    const void *key_padding_mask; /* NULL: none */
    attn_dtype key_padding_mask_dtype; /* BOOL (True = ignore that key) or F32 (added) */
    int64_t key_padding_mask_stride[2];
    /* Dropout on the attention weights with probability dropout_p in [0, 1], drawn by default from
     * the context's generator exactly like F.dropout on the (B*H, L, S) weights in row-major order
     * (dropout_rng below gives the other source). */
    double dropout_p;
    attn_weights_mode weights_mode; /* which weights the `weights` argument receives */
    /* Local (sliding-window) attention, as FlashAttention's window_size: with use_window set, query
     * i sees keys j with i + off - window_left <= j <= i + off + window_right (off as above); -1
     * leaves that side unbounded. Key tiles wholly outside the window are skipped. */
    int use_window;
    int64_t window_left, window_right;
    /* ALiBi: NULL, or H slopes (one per query head): a(h,i,j) = -slopes[h] * |i + off - j|. */
    const float *alibi_slopes;
    /* Logit soft-capping (Gemma 2): 0 for none, else > 0: scores = softcap * tanh(scores / softcap),
     * applied to the scaled q.k before ALiBi and the masks. */
    float softcap;
    /* Element type of k and v: ATTN_DTYPE_F32 (0, the default), ATTN_DTYPE_F16 or ATTN_DTYPE_BF16
     * (IEEE half and bfloat16 bit patterns, 2 bytes each; strides still count elements). Products
     * and sums are always computed in float32. Against the float32 k and v they were rounded from,
     * a row's output differs by at most (exp(2 delta) - 1 + u) * max|v| with
     * delta = u * scale * sum_t |q_t| * max|k| and u = 2^-11 (F16) or 2^-8 (BF16) (tested).
     * ATTN_DTYPE_Q8_0 or ATTN_DTYPE_Q4_0 (forward only: attn_sdpa_fwd, attn_sdpa_varlen_fwd and KV
     * caches; the backward answers ATTN_ERR_UNSUPPORTED): k and v are blocks of 32 values along D
     * (layouts in attn_dtype), read directly by the kernels (no dequantised copy). D and Dv must be
     * multiples of 32 (else ATTN_ERR_BAD_SHAPE). Strides still count values: k_stride[3] and
     * v_stride[3] must be 1 and the other strides multiples of 32 (dimensions of extent 1 excepted),
     * so every row is whole blocks: value (b, h, s, t) lies in block o / 32 of the tensor, o =
     * b*stride[0] + h*stride[1] + s*stride[2] + t, at byte (o / 32) * attn_dtype_size(kv_dtype);
     * ATTN_ERR_INVALID_ARG otherwise. Scores are float32 sums of products with the dequantised keys
     * (q * d, exact); in the weighted sum of the values the decode kernels of AVX2, AVX512_VNNI and
     * the bf16 ISAs multiply each weight by the block's scale d first and round that product (below;
     * in a tile whose weights are not all finite AVX2, AVX512_VNNI and AMX_BF16 multiply it by q in float32,
     * one float32 rounding more per product), the other AVX-512 ones multiply each weight by the
     * exact q * d. Against the float32 k and v they were quantised from, a row's output
     * differs by at most (exp(2 delta) * (1 + c) - 1) * max|v| + exp(2 delta) * a, plus float32 rounding,
     * with delta = scale * sum_t |q_t| * (c * max|k| + a), max over the row's kv head, and c, a the
     * per-value bound of attn_convert (Q8_0: c = 1/254 + 2^-11 + 2^-20, a = 2^-18; Q4_0: c = 1/8 +
     * 2^-10, a = 2^-21) (tested, with large logits and outliers). The query is not quantised, except by
     * the decode kernels of the ISAs of attn_isa_int8_query (ATTN_ISA_AVX2, ATTN_ISA_AVX512_VNNI,
     * ATTN_ISA_AVX512_BF16 and ATTN_ISA_AMX_BF16; the few-row decoding path: a GQA group's queries, at
     * most 8, against rows of contiguous blocks), which run q . k on 8-bit products (AVX2's vpmaddubsw,
     * or AVX-VNNI's vpdpbusd where the CPU has it; AVX512-VNNI's vpdpbusd), as ggml rounds its query to Q8_0 for these types: each query row (scaled
     * by scale * log2(e)) is rounded to int8 per block of 32 with a float scale max|q_b| / 127 (a block
     * below 2^-96 in magnitude becomes 0; a query holding a NaN or an infinity is left in float32).
     * AVX512_BF16 also runs P V on vdpbf16ps (attn_isa_int16_weights says which ISA rounds how):
     * each weight times its key's block scale d is rounded to bf16 (to nearest even; vdpbf16ps
     * takes one below 2^-126 as 0) before meeting the values' quants (Q8_0's q, Q4_0's q - 8:
     * exact in bf16). AVX512_VNNI and AMX_BF16 (whose CPUs,
     * Intel's, run vdpbf16ps at a quarter of vpdpwssd's rate) run P V on vpdpwssd and AVX2 on
     * vpmaddwd (AVX-VNNI's vpdpwssd where the CPU has it; the same results): each weight times its key's block scale, w = p * d, is rounded to int16
     * against the largest |w| of its row and block over a tile of at most 96 keys, W (32767 * w / W
     * to nearest; W taken as at least 2^-110), and meets the quants as int16 (exact); a tile holding
     * a weight that is not finite runs the float products instead. Against the
     * reference on the same stored blocks (k', v' the dequantised values, S keys) a row of those
     * kernels then differs by at most (exp(2 delta_q) * (1 + u) - 1) * max|v'| + f, plus float32
     * rounding, with u = 2^-8 and f = S * 2^-122 on AVX512_BF16, u = 0 and f = Q * (2^-9 * m_d +
     * S * 2^-125) on AVX512_VNNI, AMX_BF16 and AVX2 (m_d the largest |d| of the kv head's value blocks, Q = 128
     * for Q8_0 and 8 for Q4_0: the quants' largest magnitude, so that Q * m_d is about max|v'| for
     * blocks attn_convert wrote); delta_q = (scale * (1/254 + 2^-20) * sum_b 32 m_b + 2^-96 D) * max|k'| and m_b the
     * largest |q_t| of the row's block b (D / 32 blocks), and its lse by at most delta_q; against the
     * float32 k and v the bound above holds with delta + delta_q for delta, (1 + c) (1 + u) for 1 + c
     * and f added (both tested; in decoding on AVX512-BF16, Q4_0 about 1.5 and Q8_0 about 1.25 times as
     * fast as the float kernels, on AVX512_VNNI about 1.4-1.6 and 1.3 times on an Ice Lake Xeon, on
     * AVX2 about 1.4 and 1.1 times, BENCHMARKS.md). A key block with an infinite scale makes its key's score NaN there (the float
     * kernels: +-inf or NaN). ATTN_ISA_AVX512 runs the float kernels on AVX-512
     * CPUs, ATTN_ISA_GENERIC on any.
     * Half values and blocks the caller wrote are read as they are, whatever their bits: a half is
     * its IEEE value (subnormals, infinities and NaN included) and a block's value is q * d in
     * float, so a NaN scale makes all 32 values NaN, an infinite one makes them +-inf (NaN where
     * q = 0), a subnormal or zero scale is exact. Such values then act as NaN and infinite inputs
     * do: they reach the rows that see them (masking, windows and causality keep them from the
     * others), where kernels and reference give non-finite results in the same places
     * (differential fuzzing with raw half values and raw Q8_0 / Q4_0 blocks). */
    attn_dtype kv_dtype;
    /* Element types of q and of out: ATTN_DTYPE_F32 (0, the default), ATTN_DTYPE_F16 or
     * ATTN_DTYPE_BF16; strides still count elements. attn_sdpa_bwd reads out and dout in out_dtype.
     * Half-precision q, k and v are converted exactly to float32 as the kernels load them; products
     * and sums are float32, and each output element is rounded to out_dtype once, to nearest even.
     * lse, weights and dmask stay float32. Every instruction set runs the float32 kernels on the
     * converted values, except the forward of bf16 q, k and v on the bf16 dot products of
     * ATTN_ISA_AVX512_BF16 and ATTN_ISA_AMX_BF16 (attn_isa_bf16_dot; even
     * head_dim, key and value rows with contiguous elements, no weights asked for): its products
     * run on vdpbf16ps or tdpbf16ps (exact bf16 products summed in float32, so the scores are as below), and the
     * weights are rounded to bf16 (to nearest even) before P V, as FlashAttention does on GPUs;
     * decoding-shaped calls (a GQA group's queries fit one tile) stay float32. The backward runs
     * on them too when out and dout are bf16 as well, both head dims are even and every input is
     * finite (see grad_dtype).
     * Error against the scalar reference (ATTN_ISA_REF: double sums on the same rounded inputs,
     * then rounded to the output type), tested on every instruction set with random and adversarial
     * inputs (large logits, rows of 8192 keys): for each element of out's row (b, h, i)
     *   |out - out_ref| <= 2 u_o |out_ref| + t_o + (exp(2 delta) - 1 + 2^-16) max_j |v_j|
     * with u = 2^-8 (BF16), 2^-11 (F16), 2^-24 (F32) the unit roundoff of the type, t its smallest
     * subnormal (2^-133, 2^-24, 2^-149), max over the values of the row's kv head, and
     *   delta = (D + 2) 2^-24 scale sum_t |q_t| max_j |k_j|_inf + 2^-22 (softcap + |largest ALiBi
     *           term| + |largest float mask term|)
     * (the float32 rounding of the scores, in the exponent). On the bf16 dot products the 2^-16
     * becomes 2^-8 + 2^-16 (the rounded weights), and, as the instructions treat bf16 and float32
     * denormals as zero, delta gains 2^-126 scale sum_t |q_t| + 2^-125 D max_j |k_j|_inf and the bound
     * S 2^-125 (tested in an emulated build on every CPU with AVX2, and on the instructions
     * themselves by the same tests on a CPU that has them). */
    attn_dtype q_dtype;
    attn_dtype out_dtype;
    /* Element type of dq, dk and dv written by attn_sdpa_bwd: F32 (0, the default), F16 or BF16.
     * Each gradient element g satisfies |g - g_ref| <= 2 u_g |g_ref| + t_g + (4 u_o + 2^-14 +
     * 4 delta) M, where M is the sum of the absolute values of the terms of g's sum (dq_i =
     * scale sum_j dS_ij k_j, dk_j = scale sum_i dS_ij q_i, dv_j = sum_i P_ij dout_i), with
     * |dS_ij| taken as P_ij (|dout_i . v_j| + sum_t |dout_it out_it|), delta the largest row's
     * (tested); with a soft cap c the factor of M gains delta / c (the cap's derivative
     * 1 - tanh^2(s / c) moves by up to 0.77 e / c for a score error e: small caps amplify it).
     * The 4 u_o term is FlashAttention's use of the stored, rounded out in
     * D_i = dout_i . out_i. Where out's elements are subnormal in its type, their rounding adds
     * t_o (its smallest subnormal) per element: the same sum again with |dS_ij| taken as
     * 2 t_o P_ij sum_t |dout_it| (found by fuzz_bwd_diff). The fused kernels flush weights below
     * 2^-126 to zero: add M's sum once more with 2^-126 in place of every P_ij the row sees
     * (visible only where the gradients themselves are near 2^-126; tested). On
     * the bf16 dot products (attn_isa_bf16_dot; bf16 q, k, v, out and dout, even head_dim and
     * head_dim_v, contiguous key and value rows, finite inputs) dS and P are rounded to bf16
     * before the products that make the gradients: the factor of M gains 2^-8, and delta the
     * forward's terms for the dot products (tested in an emulated build). */
    attn_dtype grad_dtype;
    /* Where the dropout mask comes from (with dropout_p > 0):
     *  ATTN_DROPOUT_RNG_CONTEXT (0, the default): the context's generator, F.dropout's draws bit for
     *    bit as dropout_p says above; the backward regenerates them from the forward's starting
     *    state (its dropout_state argument). CPU only: the mask is a sequential stream, so the
     *    kernels keep it as (B, H, L, S) bits in their scratch.
     *  ATTN_DROPOUT_RNG_PHILOX: counter-based, as GPU libraries draw dropout: element (b, h, i, j)
     *    (b the sequence of a packed batch, i and j the query and key inside it) takes word j % 4 of
     *    Philox4x32-10 with counter {j / 4, i, b * H + h, dropout_offset} and key {low, high 32 bits
     *    of dropout_seed}, and is kept when that word is below floor((1 - dropout_p) * 2^32); kept
     *    weights are multiplied by float(1 / float(1 - dropout_p)), as F.dropout does. The mask is
     *    a function of its coordinates: the same on every thread count, instruction set and device
     *    (CPU and libattn_cuda), the context's generator is not used, and the kernels store nothing
     *    of size L x S (O(N) memory with dropout). The backward takes the same desc (dropout_state
     *    is ignored). Calls that need independent masks (layers, steps) use different seeds or
     *    offsets. Needs L < 2^32, S < 2^34 and B * H < 2^32 (ATTN_ERR_BAD_SHAPE otherwise). */
    attn_dropout_rng dropout_rng;
    uint32_t dropout_offset;
    uint64_t dropout_seed;
    /* Attention sinks (gpt-oss's per-head sink logits; ggml's ggml_flash_attn_ext_add_sinks): NULL,
     * or H float32 logits, one per query head (host memory). Each row's softmax gains a term
     * without a value: with the row's scores s_j (after the masks) and z = sinks[h],
     *   p_j = exp(s_j) / (exp(z) + sum_k exp(s_k)),   out = sum_j p_j v_j,
     *   lse = log(exp(z) + sum_k exp(s_k))
     * as softmax over the row with z appended, its last column dropped (Hugging Face's gpt-oss
     * eager attention), so a row can give weight to nothing: its weights sum to less than 1, a
     * fully masked row gives zeros and lse = z. Dropout applies to the keys' weights; the weights
     * output (weights_mode) holds the keys' p_j. z = -inf is no sink for that head; a NaN or +inf
     * z makes every row of the head NaN (out and lse), as softmax over the extended row does. The
     * fused kernels add the sink to a row's sum in double once its keys are summed, z in their
     * log2 domain (a z past about +-2.36e38 counts as that value: the note on float arithmetic
     * before attn_causal), so the error bounds of kv_dtype and q_dtype above hold as without a
     * sink. Every SDPA call takes them: padded and packed batches, KV cache attends, the
     * backwards (attn_sdpa_bwd and attn_sdpa_varlen_bwd take the same desc; the sinks enter
     * through lse) and the sinks' own gradient, attn_sdpa_sinks_bwd. The checks
     * (attn_sdpa_desc_check) do not read them. Context parallelism (attn_cp.h) takes them too.
     * Not supported by libattn_cuda yet: ATTN_ERR_UNSUPPORTED. */
    const float *sinks;
} attn_sdpa_desc;

/** Zeroes `desc`: no masks, no dropout, default scale, n_kv_heads = H, head_dim_v = D. */
ATTN_API void attn_sdpa_desc_init(attn_sdpa_desc *desc);

/**
 * Checks `desc` as every SDPA entry point does before it reads a tensor: sizes, GQA, scale, causal
 * mode, dropout range, weights mode, window, soft cap, element types (F32, F16 or BF16), strides
 * (offsets that overflow, in elements or in bytes of 4 per element: ATTN_ERR_OVERFLOW; an out
 * stride of 0) and the masks' types and strides. It does not check
 * what one backend supports (the CPU kernels take F32 q and out; attn_cuda.h lists the GPU's). Other
 * backends (libattn_cuda) validate through it, so every backend rejects a descriptor the same way.
 * @return ATTN_OK, or the status and message (attn_ctx_last_error) attn_sdpa_fwd would give.
 */
ATTN_API attn_status attn_sdpa_desc_check(attn_ctx *ctx, const attn_sdpa_desc *desc);

/**
 * Scratch bytes attn_sdpa_fwd needs for `desc` (for attn_ctx_set_workspace / attn_ctx_reserve).
 */
ATTN_API attn_status attn_sdpa_fwd_workspace_size(const attn_ctx *ctx, const attn_sdpa_desc *desc,
                                                  size_t *bytes);

/**
 * Scaled dot-product attention forward.
 * @param q        (B, H, L, D) at desc->q_stride, of desc->q_dtype (float unless set)
 * @param k        (B, Hkv, S, D) at desc->k_stride, of desc->kv_dtype (float unless set)
 * @param v        (B, Hkv, S, Dv) at desc->v_stride, of desc->kv_dtype
 * @param out      (B, H, L, Dv) at desc->o_stride, of desc->out_dtype; must not overlap the inputs
 * @param lse      (B, H, L) contiguous natural-log log-sum-exp of the masked, scaled scores
 *                 (before dropout), or NULL
 * @param weights  attention weights after dropout, shaped by desc->weights_mode (contiguous);
 *                 must be non-NULL exactly when weights_mode != ATTN_WEIGHTS_NONE
 * @return ATTN_OK; ATTN_ERR_INVALID_ARG, ATTN_ERR_BAD_SHAPE, ATTN_ERR_BAD_MASK, ATTN_ERR_OVERFLOW
 *         for bad arguments (nothing written); ATTN_ERR_OUT_OF_MEMORY, ATTN_ERR_WORKSPACE.
 */
ATTN_API attn_status attn_sdpa_fwd(attn_ctx *ctx, const attn_sdpa_desc *desc, const void *q, const void *k,
                                   const void *v, void *out, float *lse, float *weights);

/** Scratch bytes attn_sdpa_bwd needs for `desc` (dmask_wanted: whether dmask will be asked for). */
ATTN_API attn_status attn_sdpa_bwd_workspace_size(const attn_ctx *ctx, const attn_sdpa_desc *desc, int dmask_wanted,
                                                  size_t *bytes);

/**
 * Scaled dot-product attention backward: the gradients of a loss L with respect to q, k, v (and an
 * additive mask) given dout = dL/dout. The weights are recomputed from q, k and the forward's
 * log-sum-exp (FlashAttention-2); nothing of size L x S is stored.
 * @param q, k, v   the forward's inputs (desc as in the forward; desc->weights_mode is ignored)
 * @param out, lse  the forward's output (at o_stride) and log-sum-exp ((B, H, L) contiguous)
 * @param dout      (B, H, L, Dv) at o_stride
 * @param dropout_state  with desc->dropout_p > 0: the context generator's state as it was when the
 *                  forward started (copy it before the forward); the forward's dropout mask is
 *                  regenerated from it, and the context's own generator is not touched. NULL
 *                  otherwise.
 * @param dq, dk, dv  of desc->grad_dtype (float32 unless set), written at q_stride, k_stride,
 *                  v_stride (those strides must not be 0 on a dimension longer than 1), whatever
 *                  desc->q_dtype and desc->kv_dtype are. With grouped-query
 *                  attention dk and dv hold the sum over the query heads sharing each kv head.
 * @param dmask     NULL, or the gradient of an F32 desc->mask, written at mask_stride over the
 *                  mask's whole extent: elements several cells share (a broadcast dimension of
 *                  stride 0, or strides that overlap) receive the sum.
 * A hidden (query, key) pair (score -inf) contributes nothing to any gradient, whatever that row's
 * q, dout or dout . v hold (NaN, inf, overflow), so fully masked rows contribute nothing and get
 * dq = 0; a row with a NaN score gives NaN to the keys it sees only (PyTorch's math path spreads
 * it to every key). dq and dk are sums formed before the scale multiplies them: where
 * sum_j |dS_ij| |k_j| (or sum_i |dS_ij| |q_i|) leaves the float range while the scaled gradient
 * would fit (a tiny |scale| with huge q or k), they may be infinite. Results are identical for
 * every thread count.
 * @return as attn_sdpa_fwd; ATTN_ERR_BAD_MASK for dmask without an F32 mask.
 */
ATTN_API attn_status attn_sdpa_bwd(attn_ctx *ctx, const attn_sdpa_desc *desc, const void *q, const void *k,
                                   const void *v, const void *out, const void *dout, const float *lse,
                                   const attn_generator *dropout_state, void *dq, void *dk, void *dv, float *dmask);

/**
 * Gradient of the attention sinks (attn_sdpa_desc.sinks) from the forward's out and lse:
 *   dsinks[h] = -sum_{b, i} exp(sinks[h] - lse[b, h, i]) (dout[b, h, i, :] . out[b, h, i, :])
 * (the sink's weight in the row times minus the row's dout . out; with dropout too, as out holds
 * the dropped weights' sum). Each head's sum is formed in double over (b, i) in order and rounded
 * to float once: the same bits on every thread count and instruction set. A row where the sink
 * has no weight (z = -inf) adds nothing, whatever its out and dout hold.
 * @param cu_seqlens_q, cu_seqlens_k  NULL for the (B, H, L) tensors of attn_sdpa_fwd; or both
 *                  the offsets of a packed batch (then out, dout and lse are laid out as
 *                  attn_sdpa_varlen_fwd's, and the offsets are checked as it checks them)
 * @param out, dout (B, H, L, Dv) at o_stride, of out_dtype (or packed)
 * @param lse       the forward's log-sum-exp ((B, H, L), or (H, total_q) packed)
 * @param dsinks    (H) float32, overwritten
 * @return ATTN_OK; ATTN_ERR_INVALID_ARG when desc->sinks is NULL, or as attn_sdpa_bwd.
 */
ATTN_API attn_status attn_sdpa_sinks_bwd(attn_ctx *ctx, const attn_sdpa_desc *desc, const int64_t *cu_seqlens_q,
                                         const int64_t *cu_seqlens_k, const void *out, const void *dout,
                                         const float *lse, float *dsinks);

/*
 * Variable-length packed batches (FlashAttention's varlen interface): desc->batch sequences laid
 * end to end with no padding; sequence b has queries cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1 and
 * keys cu_seqlens_k[b] .. cu_seqlens_k[b+1] - 1 (cu_seqlens_*: batch + 1 increasing offsets from 0).
 * q (total_q, H, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv), out (total_q, H, Dv) are read
 * through the desc's strides as (0, head, token, dim): q_stride[2] steps a token, q_stride[1] a
 * head, q_stride[3] an element (stride[0] is not used). lse is (H, total_q) contiguous. len_q and
 * len_kv give the longest sequence (an upper bound checked against the offsets). Each sequence
 * is attention on its own: causal masks, windows and ALiBi align within the sequence; no
 * attention or key padding mask. Dropout draws sequence after sequence, each in (h, i, j) order,
 * as a loop over the sequences calling F.dropout would. The backward takes the same arguments.
 */
ATTN_API attn_status attn_sdpa_varlen_fwd(attn_ctx *ctx, const attn_sdpa_desc *desc, const int64_t *cu_seqlens_q,
                                          const int64_t *cu_seqlens_k, const void *q, const void *k, const void *v,
                                          void *out, float *lse);
/** The checks of attn_sdpa_varlen_fwd on `desc` and the host offsets cu_seqlens_q/k (see
 *  attn_sdpa_desc_check), without reading a tensor. */
ATTN_API attn_status attn_sdpa_varlen_desc_check(attn_ctx *ctx, const attn_sdpa_desc *desc,
                                                 const int64_t *cu_seqlens_q, const int64_t *cu_seqlens_k);
ATTN_API attn_status attn_sdpa_varlen_bwd(attn_ctx *ctx, const attn_sdpa_desc *desc, const int64_t *cu_seqlens_q,
                                          const int64_t *cu_seqlens_k, const void *q, const void *k, const void *v,
                                          const void *out, const void *dout, const float *lse,
                                          const attn_generator *dropout_state, void *dq, void *dk, void *dv);

/* ------------------------------------------------------------------------------------------ */
/* KV cache for token-by-token decoding                                                       */
/* ------------------------------------------------------------------------------------------ */

/*
 * One layer's keys and values: (B, Hkv, capacity, D) and (B, Hkv, capacity, Dv), of which the
 * first `length` positions are filled, stored as F32, F16 or BF16, or quantised as Q8_0 or Q4_0
 * (blocks of 32 values along D, ggml's layouts: see attn_dtype; D and Dv must then be multiples of
 * 32). Append converts new keys and values (float32) to that type (quantising each row's blocks as
 * attn_convert does); attend runs SDPA of a block of new queries against the filled positions,
 * reading the stored type directly (the error bound of quantised types: attn_sdpa_desc.kv_dtype).
 * A cache is not thread-safe: one caller at a time.
 */
typedef struct attn_kv_cache attn_kv_cache;

typedef struct attn_kv_cache_config {
    int64_t batch;       /* B >= 1 */
    int64_t n_kv_heads;  /* Hkv >= 1 */
    int64_t head_dim;    /* D >= 1 */
    int64_t head_dim_v;  /* Dv; 0 means D */
    int64_t capacity;    /* positions per sequence, >= 1 */
    attn_dtype dtype;    /* ATTN_DTYPE_F32 (default), F16, BF16, Q8_0 or Q4_0 (head_dim and
                            head_dim_v multiples of 32, else ATTN_ERR_BAD_SHAPE at create) */
} attn_kv_cache_config;

/** Zeroes `cfg` (dtype F32). */
ATTN_API void attn_kv_cache_config_init(attn_kv_cache_config *cfg);
/**
 * Allocates a cache (through ctx's allocator) of length 0. With the system allocator (params'
 * allocator left {NULL, NULL, NULL}), keys or values of 2 MiB or more start on a 2 MiB boundary
 * and, on Linux, are advised for transparent huge pages (madvise MADV_HUGEPAGE; it takes effect
 * where /sys/kernel/mm/transparent_hugepage/enabled is "madvise" or "always"): a decoding step
 * reads the whole cache, and over 32768 cached tokens it ran 1.07-1.16 times as fast on huge pages
 * as on 4 KiB ones (BENCHMARKS.md). A caller's allocator is asked for the usual alignment only.
 */
ATTN_API attn_status attn_kv_cache_create(attn_ctx *ctx, const attn_kv_cache_config *cfg, attn_kv_cache **cache);
/** Frees a cache; NULL is allowed. */
ATTN_API void attn_kv_cache_free(attn_kv_cache *cache);
/** @return the cache's configuration. */
ATTN_API const attn_kv_cache_config *attn_kv_cache_get_config(const attn_kv_cache *cache);
/** @return the number of filled positions (0 .. capacity). */
ATTN_API int64_t attn_kv_cache_length(const attn_kv_cache *cache);

/**
 * Appends n positions: k (B, Hkv, n, D) at k_stride, v (B, Hkv, n, Dv) at v_stride (element
 * strides in (B, Hkv, n, D) order; NULL strides mean contiguous), float32.
 * @return ATTN_ERR_CAPACITY (nothing written) when length + n would exceed the capacity.
 */
ATTN_API attn_status attn_kv_cache_append(attn_ctx *ctx, attn_kv_cache *cache, int64_t n, const float *k,
                                          const int64_t k_stride[4], const float *v, const int64_t v_stride[4]);
/** Forgets positions from `length` on (0 <= length <= current length): a roll-back after rejected
 *  speculative tokens. */
ATTN_API attn_status attn_kv_cache_truncate(attn_ctx *ctx, attn_kv_cache *cache, int64_t length);
/** Empties the cache (length 0); its memory is kept. */
ATTN_API void attn_kv_cache_reset(attn_kv_cache *cache);
/**
 * Direct access to the storage: k (B, Hkv, capacity, D) and v (B, Hkv, capacity, Dv) of the
 * cache's dtype, with their element strides. Any output may be NULL. For Q8_0 and Q4_0 the strides
 * count values, as attn_sdpa_desc's do (contiguous rows of D / 32 blocks): value offset o is in the
 * block at byte (o / 32) * attn_dtype_size(dtype).
 */
ATTN_API void attn_kv_cache_storage(attn_kv_cache *cache, void **k, int64_t k_stride[4], void **v,
                                    int64_t v_stride[4]);

/**
 * SDPA of new queries q (B, H, L, D) at desc->q_stride against the cache's `length` positions,
 * written to out (B, H, L, Dv) at desc->o_stride, lse (B, H, L) contiguous or NULL.
 * From desc: batch (= B), n_heads (a multiple of Hkv: grouped-query attention), len_q, head_dim
 * (= D), head_dim_v (0 or Dv), the q/o strides, scale, causal, local window, ALiBi, softcap, and
 * the attention mask and key padding mask over the cache's positions. The cache supplies k, v,
 * len_kv, n_kv_heads and kv_dtype (those desc fields are ignored). causal must be
 * ATTN_CAUSAL_BOTTOM_RIGHT (the usual case: query i of the L newest tokens sees positions
 * < length - L + i + 1) or ATTN_CAUSAL_NONE; dropout_p must be 0 and weights_mode NONE.
 * One-query decoding splits the cache's positions among the threads and merges the partial
 * results by log-sum-exp, reading each kv head once for all the query heads that share it.
 */
ATTN_API attn_status attn_kv_cache_attend(attn_ctx *ctx, const attn_kv_cache *cache, const attn_sdpa_desc *desc,
                                          const void *q, void *out, float *lse);

/* ------------------------------------------------------------------------------------------ */
/* Linear maps                                                                                */
/* ------------------------------------------------------------------------------------------ */

/** How a weight matrix is stored. */
typedef enum attn_weight_layout {
    ATTN_WEIGHT_OUT_IN = 0, /* (out_features, in_features), nn.Linear's layout: y = x W^T + b */
    ATTN_WEIGHT_IN_OUT = 1  /* (in_features, out_features): y = x W + b */
} attn_weight_layout;

/**
 * y = x W^T + b (nn.Linear) or y = x W + b, the projections every module uses; also gives the raw
 * scores Q K^T (x = Q, W = K in ATTN_WEIGHT_OUT_IN layout).
 * @param x  (rows, in_features), contiguous
 * @param w  (out_features, in_features) or (in_features, out_features) per `layout`
 * @param b  (out_features) or NULL
 * @param y  (rows, out_features), contiguous; must not overlap x, w or b
 */
ATTN_API attn_status attn_linear(attn_ctx *ctx, const float *x, int64_t rows, int64_t in_features, const float *w,
                                 attn_weight_layout layout, const float *b, int64_t out_features, float *y);

/* ------------------------------------------------------------------------------------------ */
/* Multi-head attention with nn.MultiheadAttention semantics                                  */
/* ------------------------------------------------------------------------------------------ */

/*
 * Parameters, by state_dict name (all of the module's dtype, float32 unless set; row-major):
 *   in_proj_weight (3E, E)    when kdim == vdim == E; rows [0,E) W_q, [E,2E) W_k, [2E,3E) W_v
 *   q_proj_weight (E, E), k_proj_weight (E, kdim), v_proj_weight (E, vdim)   otherwise
 *   in_proj_bias (3E)         when bias
 *   bias_k (1, 1, E), bias_v (1, 1, E)   when add_bias_kv
 *   out_proj.weight (E, E), out_proj.bias (E)   (the bias when bias)
 * The forward follows torch 1.13's F.multi_head_attention_forward: projections (x W^T + b; one
 * packed product when query, key and value are the same pointer), bias_k/bias_v appended as one
 * extra key position, heads split as column blocks, a zero key appended when add_zero_attn, masks
 * merged, q divided by sqrt(head_dim), softmax, dropout (training only), weights @ v, heads
 * concatenated, out_proj. Differences from torch 1.13, both deliberate: fully masked rows give 0,
 * not NaN; a float key_padding_mask is added to an attention mask of either dtype (torch 2.x
 * semantics; 1.13 ORs it into a bool mask and rejects it beside a float mask).
 */

typedef struct attn_mha attn_mha;

/*
 * Float16 and bfloat16 modules (attn_mha_config.dtype = ATTN_DTYPE_F16 or ATTN_DTYPE_BF16), as
 * torch's nn.MultiheadAttention(...).to(torch.float16 / torch.bfloat16) on the CPU:
 *  - The parameters are stored in the type (2 bytes each; attn_mha_param_typed_at gives them as
 *    uint16_t bit patterns). attn_mha_create draws them in float32 and rounds them to nearest even;
 *    attn_mha_create_from_state takes tensors of the type, or float32 ones it rounds.
 *  - query, key, value, out, weights, dout and dquery, dkey, dvalue are tensors of the type (uint16_t
 *    bit patterns). Masks stay BOOL or F32 (torch wants a float mask in the query's type; an F32 mask
 *    holding those values gives the same result).
 *  - Computation: the projections x W^T + b are float32 sums of the exact values, then q, k and v are
 *    rounded to the type (torch's bfloat16 linear); bias_k and bias_v are values of the type; q is
 *    then divided by sqrt(head_dim) in float32; the attention is the float32 SDPA on those values
 *    (exactly what attn_sdpa_fwd computes with q_dtype and kv_dtype of the type; a BF16 module on
 *    the bf16 dot products differs, below); its output (the heads concatenated) is rounded to the
 *    type, as torch's is, before out_proj; out_proj's float32 sum is rounded once into out. The weights are computed in float32 and rounded once.
 *    Where torch 2.x differs: with need_weights it rounds the scores and the softmax to the type too
 *    (its fused path does not); it scales q after rounding it in the type (q * (1/sqrt(head_dim)),
 *    the same for head dims that are powers of 4); and its products are its own. Measured against
 *    torch 2.x on random modules (parity_mha_lowp): outputs and weights within 2 units of the type
 *    (2^-8 bf16, 2^-11 f16) of the largest element.
 *  - A call converts the inputs and the parameters it reads as float32 (below) to float32 in the
 *    context's scratch memory (4 bytes per parameter and input element, plus the float32 results
 *    before rounding: for E = 768, 9.4 MB for all the parameters); the module keeps no float32
 *    copy, so its own memory is half the float32 module's, and parameters written through
 *    attn_mha_param_typed_at are used by the next call. Two exceptions, on contexts with kernels
 *    (not ATTN_ISA_REF), where the projections read the weights in the type, never through CBLAS
 *    (use_blas):
 *    - Few rows: a projection of at most 8 token rows (a sequence's in attn_mha_forward, batch *
 *      len in attn_mha_forward_cached: decoding steps) converts each weight exactly as it is
 *      loaded, with the sums the library's own product gives the float32 weights (the same bits).
 *      Such a step of attn_mha_forward_cached converts only the biases. Decoding reads every
 *      weight once a step, so there a half module's step is faster than a float32 module's
 *      (BENCHMARKS.md).
 *    - bf16 dot products (attn_isa_bf16_dot: ATTN_ISA_AVX512_BF16, ATTN_ISA_AMX_BF16): a BF16
 *      module's projections of more rows with an even input width (embed_dim, kdim, vdim) run on
 *      vdpbf16ps / tdpbf16ps: exact products of the bf16 inputs and weights summed in float32 in
 *      the instructions' order (not the float32 module's bits). Its attention, when no weights
 *      are asked for and head_dim is even, runs as attn_sdpa_fwd does on bf16 q, k and v there:
 *      q's division by sqrt(head_dim) becomes the kernel's scale (the same scores when head_dim
 *      is a power of 4) and the weights are rounded to bf16 before P V; attn_mha_forward_cached
 *      with a BF16 cache attends so too (a prompt's rows; decoding-shaped steps keep the float32
 *      kernels, as attn_sdpa_fwd does). attn_mha_forward_train runs the same forward; the backward
 *      stays float32. Such a module is about 1.8x faster than the float32 one at E = 768,
 *      L = 1024, 1.9x at E = 2048 (BENCHMARKS.md); F16 modules and CPUs without the instructions
 *      keep the float32 products.
 *    A forward (attn_mha_forward, attn_mha_forward_train, attn_mha_forward_cached) converts only
 *    what it reads as float32: the biases and the weights of the projections outside these two
 *    cases; attn_mha_backward converts every parameter.
 *  - Training: attn_mha_backward treats each rounding as the identity (as autograd does) and keeps
 *    its sums and intermediate gradients in float32. dquery, dkey and dvalue are rounded once to the
 *    type; the parameters' gradients are float32 (dparams stays float *): a mixed-precision trainer
 *    keeps float32 master weights and optimiser state and wants the gradient, a sum over every token,
 *    without a rounding to 8 bits; attn_convert rounds it when the type's gradient is wanted (torch's
 *    .grad of a bfloat16 parameter is that rounding of a float32 sum).
 *  - The KV cache of attn_mha_forward_cached may be of the module's type, F32, Q8_0 or Q4_0.
 * Error bound against the float32 module holding the same (rounded) parameters, on the same
 * (rounded) inputs (tested on every instruction set with every option and with large logits, in
 * test_mha_lowp): with u the type's unit roundoff (2^-11 F16, 2^-8 BF16), t its smallest subnormal,
 * q, k, v the float32 module's projections (q before its division by sqrt(hd), k and v including
 * the bias_k and zero keys), for each output element (row i, feature e)
 *   |out' - out| <= u |out| + (1 + u) (sum_h sum_{t in head h} |Wo[e,t]| (eps_h + 2 E 2^-24 V_h)
 *                   + 2 E 2^-24 |bo[e]|) + t
 *   eps_h = (exp(2 delta_h) - 1 + 2 u + 2^-15) V_h,  V_h = max_j |v_j|_inf over head h's keys,
 *   delta_h = (2 u + u^2 + 2 (hd + 2) 2^-24) sum_t |q_it| max_j |k_j|_inf / sqrt(hd) over head h,
 * and each attention weight w' (averaged or per head) within u |w| + (1 + u)(exp(2 max_h delta_h) -
 * 1 + 2^-15) + t of w. (The 2^-24 terms are the float32 sums of both modules; delta_h is the
 * change of the scores from rounding q and k, in the exponent; 2 u covers the rounding of v and of
 * the heads' output.) On the bf16 dot products (above) the projections' sums differ from the
 * float32 module's by up to r = 2 (d + 2) 2^-24 (sum_i |x_i W_ti| + |b_t|) + 2^-126 (sum_i |W_ti| +
 * 2 d + 2) per element (d the input width; the last term the instructions' flushing of subnormals
 * to zero), so the bound takes, with e_q = u |q_it| + (1 + u) r_q and e_k = max over head h's keys
 * of u |k_jt| + (1 + u) r_k,
 *   delta_h = ((K_h + e_k) sum_t e_q + e_k sum_t |q_it| + 2 (hd + 2) 2^-24 K_h sum_t |q_it|) / sqrt(hd),
 *   K_h = max_j |k_j|_inf,  eps_h = (exp(2 delta_h) - 1 + c u + 2^-15)(V_h + 2 R_h) + 2 R_h,
 * R_h the largest r of head h's values, c = 3 where the attention ran on the dot products (the
 * rounded weights; delta_h then gains 2^-126 sum_t |q_it| / sqrt(hd) + 2^-125 hd K_h and eps_h
 * S' 2^-125, attn_sdpa_desc.q_dtype's terms) and 2 otherwise, and the output's sum of |Wo| terms
 * gains 2^-126 (sum_t |Wo[e,t]| + 2 E + 2). (With r = 0 these are the expressions above.) The
 * gradients are checked against the float32 module's within 8 u of each tensor's largest element
 * (2.8 u seen); this is a tested tolerance, not a proven bound.
 */

typedef struct attn_mha_config {
    int64_t embed_dim;  /* E */
    int64_t num_heads;  /* H; E % H must be 0 */
    int64_t kdim;       /* 0 means E */
    int64_t vdim;       /* 0 means E */
    int bias;           /* in_proj_bias and out_proj.bias (default 1) */
    int add_bias_kv;    /* bias_k, bias_v (default 0) */
    int add_zero_attn;  /* append a zero key/value (default 0) */
    int batch_first;    /* batched inputs are (N, L, E) instead of (L, N, E) (default 0) */
    double dropout;     /* dropout on the attention weights in training mode, [0, 1) */
    attn_dtype dtype;   /* ATTN_DTYPE_F32 (0, the default), ATTN_DTYPE_F16 or ATTN_DTYPE_BF16: the type
                           of the parameters, the inputs and the outputs (see "Float16 and bfloat16
                           modules" below); any other value is ATTN_ERR_INVALID_ARG */
} attn_mha_config;

/** Fills `cfg` with nn.MultiheadAttention(embed_dim, num_heads)'s defaults. */
ATTN_API void attn_mha_config_init(attn_mha_config *cfg, int64_t embed_dim, int64_t num_heads);

/**
 * Creates a module and initialises its parameters exactly like nn.MultiheadAttention's
 * constructor, drawing from the context's generator (so seeding the context with s first gives
 * torch.manual_seed(s)'s weights). With cfg->dtype F16 or BF16 the values are drawn in float32 and
 * rounded to nearest even, as module.to(torch.bfloat16) / .half() does.
 */
ATTN_API attn_status attn_mha_create(attn_ctx *ctx, const attn_mha_config *cfg, attn_mha **mha);
/** Frees a module; NULL is allowed. */
ATTN_API void attn_mha_free(attn_mha *mha);
/** @return the module's configuration (with kdim/vdim resolved). */
ATTN_API const attn_mha_config *attn_mha_get_config(const attn_mha *mha);
/** @return the number of parameters (state_dict entries). */
ATTN_API int attn_mha_param_count(const attn_mha *mha);
/**
 * Describes parameter `index` (0 .. count-1, state_dict order): name, ndim, shape, data.
 * Any output pointer may be NULL. `data` points into the module and may be written.
 * @return ATTN_ERR_INVALID_ARG for a bad index, or when `data` is asked of a module whose dtype is
 *         not F32 (its parameters are not floats: use attn_mha_param_typed_at).
 */
ATTN_API attn_status attn_mha_param_at(attn_mha *mha, int index, const char **name, int *ndim, int64_t shape[3],
                                       float **data);
/** Looks a parameter up by its state_dict name. @return ATTN_ERR_NOT_FOUND if absent;
 *  ATTN_ERR_INVALID_ARG when `data` is asked of a module whose dtype is not F32. */
ATTN_API attn_status attn_mha_param(attn_mha *mha, const char *name, int *ndim, int64_t shape[3], float **data);
/** attn_mha_param_at for a module of any dtype: *dtype receives the parameters' type (the module's:
 *  F32, F16 or BF16) and *data their elements (float, or uint16_t bit patterns of the half types). */
ATTN_API attn_status attn_mha_param_typed_at(attn_mha *mha, int index, const char **name, int *ndim,
                                             int64_t shape[3], attn_dtype *dtype, void **data);
/** attn_mha_param for a module of any dtype (see attn_mha_param_typed_at). */
ATTN_API attn_status attn_mha_param_typed(attn_mha *mha, const char *name, int *ndim, int64_t shape[3],
                                          attn_dtype *dtype, void **data);

typedef struct attn_mha_args {
    /* Inputs. Batched: query (L, N, E), key (S, N, kdim), value (S, N, vdim), or (N, L, E) etc.
     * with batch_first. Unbatched (`unbatched` = 1): query (L, E), key (S, kdim), value (S, vdim).
     * key NULL means key = query; value NULL means value = key. Equal pointers mean the same
     * tensor, as `query is key` in PyTorch (one packed projection). Elements of the module's dtype
     * (float, or uint16_t bit patterns for F16 / BF16 modules). */
    const void *query, *key, *value;
    int64_t batch;   /* N (ignored when unbatched) */
    int64_t len_q;   /* L */
    int64_t len_kv;  /* S (ignored when key is NULL: S = L) */
    int unbatched;
    /* attn_mask: (L, S) when attn_mask_ndim = 2, (N*H, L, S) when 3 (index n*H + h).
     * BOOL (True = not allowed) or F32 (added). */
    const void *attn_mask;
    attn_dtype attn_mask_dtype;
    int attn_mask_ndim;
    /* key_padding_mask: (N, S) batched, (S) unbatched; BOOL (True = ignore) or F32 (added). */
    const void *key_padding_mask;
    attn_dtype key_padding_mask_dtype;
    int causal;               /* attn_mask = triu(ones(L, S), 1) as bool; exclusive with attn_mask */
    int need_weights;         /* write the attention weights to `weights` */
    int average_attn_weights; /* weights averaged over heads (N, L, S') rather than (N, H, L, S') */
    int training;             /* apply the module's dropout (drawn from the context's generator) */
} attn_mha_args;

/** Zeroes `args` and sets need_weights = average_attn_weights = 1 (PyTorch's defaults). */
ATTN_API void attn_mha_args_init(attn_mha_args *args);

/** S' = S + add_bias_kv + add_zero_attn: the key count of the returned weights. */
ATTN_API int64_t attn_mha_weights_len_kv(const attn_mha *mha, int64_t len_kv);

/**
 * nn.MultiheadAttention forward.
 * @param out      (L, N, E), (N, L, E) with batch_first, or (L, E) unbatched; contiguous; of the
 *                 module's dtype
 * @param weights  when args->need_weights: (N, L, S') averaged or (N, H, L, S') per head;
 *                 unbatched drops N; of the module's dtype. NULL otherwise.
 */
ATTN_API attn_status attn_mha_forward(attn_ctx *ctx, attn_mha *mha, const attn_mha_args *args, void *out,
                                      void *weights);

/*
 * Training. attn_mha_forward_train runs the forward like attn_mha_forward and keeps what the
 * backward needs (the projections, the attention's output and log-sum-exp, and the generator's
 * state before the dropout) in a caller buffer of attn_mha_saved_size bytes, aligned to 16 bytes
 * (as malloc's are; it may be copied or moved between the calls). attn_mha_backward then takes dout = dL/dout (out's shape) and writes the gradients:
 *   dquery, dkey, dvalue  the inputs' shapes and the module's dtype (NULL to skip). A tensor passed as several of query,
 *                         key and value (self-attention) receives the sum of its uses in the
 *                         first of them: dkey (dvalue) must then be NULL.
 *   dparams               NULL, or attn_mha_param_count pointers in state_dict order, each NULL
 *                         or a buffer of that parameter's shape (in_proj_weight's gradient holds
 *                         the three projections' blocks). Always float32, whatever the
 *                         module's dtype (see "Float16 and bfloat16 modules" below).
 * dout has out's shape and the module's dtype.
 * Every gradient is overwritten, not accumulated. The args, the inputs and the parameters must be
 * the forward's, unchanged. Results are identical for every thread count.
 */
/** Bytes attn_mha_forward_train saves for these args. */
ATTN_API attn_status attn_mha_saved_size(attn_ctx *ctx, attn_mha *mha, const attn_mha_args *args, size_t *bytes);
/** The forward of attn_mha_forward, also filling `saved` (ATTN_ERR_WORKSPACE if it is too small). */
ATTN_API attn_status attn_mha_forward_train(attn_ctx *ctx, attn_mha *mha, const attn_mha_args *args, void *out,
                                            void *weights, void *saved, size_t saved_size);
/** Gradients of the loss given dout; see above. ATTN_ERR_INVALID_ARG if `saved` is not from this
 *  module's training forward with these args. */
ATTN_API attn_status attn_mha_backward(attn_ctx *ctx, attn_mha *mha, const attn_mha_args *args, const void *saved,
                                       size_t saved_size, const void *dout, void *dquery, void *dkey,
                                       void *dvalue, float *const *dparams);

/**
 * Self-attention of `len` new tokens x with a KV cache, for decoding: projects x, appends its keys
 * and values (heads split) to `cache`, and attends from the new queries to every cached position
 * with bottom-right causal masking, then out_proj. x and out are (len, batch, E), or (batch, len, E)
 * with batch_first (contiguous). The cache must be configured with batch = `batch`,
 * n_kv_heads = num_heads, head_dim = E / num_heads; the module must have kdim = vdim = E and no
 * bias_k/bias_v or zero attention. Equal, to float rounding, to attn_mha_forward with causal
 * masking over the whole sequence so far, at the rows of the new tokens (tested to 1e-5).
 * x and out are of the module's dtype. An F16 / BF16 module appends its rounded keys and values:
 * its cache may be of its own dtype (exact), F32, Q8_0 or Q4_0; the other half type would round
 * them again (ATTN_ERR_INVALID_ARG).
 */
ATTN_API attn_status attn_mha_forward_cached(attn_ctx *ctx, attn_mha *mha, attn_kv_cache *cache, const void *x,
                                             int64_t batch, int64_t len, void *out);

/* ------------------------------------------------------------------------------------------ */
/* The book's attention modules (ch. 3), built on the general code above                      */
/* ------------------------------------------------------------------------------------------ */

/*
 * One module type serves the chapter's classes. Each constructor draws its parameters from the
 * context's generator in the same order as the Python class, so after seeding the context like
 * the book seeds torch the module holds the book's weights. Parameter names follow the class's
 * state_dict:
 *   SelfAttention_v1:  W_query, W_key, W_value              (d_in, d_out) from torch.rand
 *   SelfAttention_v2:  W_query.weight, W_key.weight, W_value.weight (d_out, d_in) nn.Linear,
 *                      and W_*.bias (d_out) when qkv_bias
 *   CausalAttention:   as v2
 *   MultiHeadAttentionWrapper: heads.<h>.W_query.weight ... for h = 0 .. num_heads-1
 *   MultiHeadAttention (weight splits): as v2, plus out_proj.weight (d_out, d_out), out_proj.bias
 * Scores are divided by sqrt(head dim) after the product and after masking, as in the book.
 * Inputs x are (batch, n_tokens, d_in), or (n_tokens, d_in) with batch = 1 for v1/v2.
 */

typedef enum attn_book_kind {
    ATTN_BOOK_SELF_ATTENTION_V1 = 1,
    ATTN_BOOK_SELF_ATTENTION_V2 = 2,
    ATTN_BOOK_CAUSAL_ATTENTION = 3,
    ATTN_BOOK_MHA_WRAPPER = 4,
    ATTN_BOOK_MHA = 5
} attn_book_kind;

typedef struct attn_book attn_book;

/** SelfAttention_v1(d_in, d_out): three torch.rand(d_in, d_out), no scaling tricks. */
ATTN_API attn_status attn_book_self_attention_v1(attn_ctx *ctx, int64_t d_in, int64_t d_out, attn_book **m);
/** SelfAttention_v2(d_in, d_out, qkv_bias): three nn.Linear(d_in, d_out, bias=qkv_bias). */
ATTN_API attn_status attn_book_self_attention_v2(attn_ctx *ctx, int64_t d_in, int64_t d_out, int qkv_bias,
                                                 attn_book **m);
/** CausalAttention(d_in, d_out, context_length, dropout, qkv_bias). */
ATTN_API attn_status attn_book_causal_attention(attn_ctx *ctx, int64_t d_in, int64_t d_out, int64_t context_length,
                                                double dropout, int qkv_bias, attn_book **m);
/** MultiHeadAttentionWrapper(d_in, d_out, context_length, dropout, num_heads, qkv_bias): output width
 *  num_heads * d_out. */
ATTN_API attn_status attn_book_mha_wrapper(attn_ctx *ctx, int64_t d_in, int64_t d_out, int64_t context_length,
                                           double dropout, int64_t num_heads, int qkv_bias, attn_book **m);
/** MultiHeadAttention(d_in, d_out, context_length, dropout, num_heads, qkv_bias): weight splits,
 *  head_dim = d_out / num_heads, out_proj. */
ATTN_API attn_status attn_book_mha(attn_ctx *ctx, int64_t d_in, int64_t d_out, int64_t context_length, double dropout,
                                   int64_t num_heads, int qkv_bias, attn_book **m);
ATTN_API void attn_book_free(attn_book *m);
ATTN_API attn_book_kind attn_book_get_kind(const attn_book *m);
/** Output features per token: d_out, or num_heads * d_out for the wrapper. */
ATTN_API int64_t attn_book_out_features(const attn_book *m);
ATTN_API int attn_book_param_count(const attn_book *m);
ATTN_API attn_status attn_book_param_at(attn_book *m, int index, const char **name, int *ndim, int64_t shape[2],
                                        float **data);
ATTN_API attn_status attn_book_param(attn_book *m, const char *name, int *ndim, int64_t shape[2], float **data);

/**
 * Forward: x (batch, n_tokens, d_in) -> out (batch, n_tokens, out_features). `training` applies the
 * module's dropout from the context's generator (nn.Module.train()). `weights`, when not NULL,
 * receives the attention weights after dropout, (batch, heads, n_tokens, n_tokens) where heads is
 * num_heads for the wrapper and weight-split modules and 1 otherwise.
 * @return ATTN_ERR_CONTEXT_LENGTH when n_tokens exceeds the module's context_length.
 */
ATTN_API attn_status attn_book_forward(attn_ctx *ctx, attn_book *m, const float *x, int64_t batch, int64_t n_tokens,
                                       int training, float *out, float *weights);

/*
 * Training the book's modules, as attn_mha_forward_train / attn_mha_backward do for
 * nn.MultiheadAttention: attn_book_forward_train is attn_book_forward that also keeps what the
 * backward needs in `saved` (attn_book_saved_size bytes, 16-byte aligned). attn_book_backward then
 * takes dout = dL/dout (batch, n_tokens, out_features) and writes
 *   dx       (batch, n_tokens, d_in): the sum of x's uses as query, key and value (and, for the
 *            wrapper, over the heads); NULL to skip
 *   dparams  NULL, or attn_book_param_count pointers in state_dict order (attn_book_param_at),
 *            each NULL or a buffer of that parameter's shape
 * Gradients are overwritten, not accumulated. x, batch, n_tokens, training and the parameters must
 * be the forward's; with training and dropout the backward uses the forward's dropout mask.
 */
/** Bytes attn_book_forward_train saves for this input shape. */
ATTN_API attn_status attn_book_saved_size(attn_ctx *ctx, attn_book *m, int64_t batch, int64_t n_tokens,
                                          size_t *bytes);
/** attn_book_forward, also filling `saved` (ATTN_ERR_WORKSPACE if it is too small). */
ATTN_API attn_status attn_book_forward_train(attn_ctx *ctx, attn_book *m, const float *x, int64_t batch,
                                             int64_t n_tokens, int training, float *out, float *weights,
                                             void *saved, size_t saved_size);
/** Gradients given dout; see above. ATTN_ERR_INVALID_ARG if `saved` is not from a training forward
 *  of this module with these arguments. */
ATTN_API attn_status attn_book_backward(attn_ctx *ctx, attn_book *m, const float *x, int64_t batch, int64_t n_tokens,
                                        int training, const void *saved, size_t saved_size, const float *dout,
                                        float *dx, float *const *dparams);

/** The exercise's weight transfer: v1.W_x = v2.W_x.weight^T (v2 must have no qkv bias). */
ATTN_API attn_status attn_book_transfer_v2_to_v1(const attn_book *v2, attn_book *v1);

/** How the simplified self-attention normalises its scores. */
typedef enum attn_simple_norm {
    ATTN_SIMPLE_SOFTMAX = 0, /* softmax(scores) */
    ATTN_SIMPLE_SUM = 1      /* scores / sum(scores): the naive normalisation */
} attn_simple_norm;

/**
 * Simplified self-attention without trainable weights: scores = x x^T (no scaling), weights =
 * norm(scores) row by row, context = weights x.
 * @param x        (n, d)
 * @param scores   (n, n) or NULL
 * @param weights  (n, n) or NULL
 * @param context  (n, d) or NULL
 */
ATTN_API attn_status attn_simple_self_attention(attn_ctx *ctx, const float *x, int64_t n, int64_t d,
                                                attn_simple_norm norm, float *scores, float *weights,
                                                float *context);

/* ------------------------------------------------------------------------------------------ */
/* Tensor files: .npy and .safetensors                                                        */
/* ------------------------------------------------------------------------------------------ */

#define ATTN_MAX_DIMS 8

/** A named, owned, contiguous row-major tensor. */
typedef struct attn_tensor {
    char *name;      /* NUL-terminated; NULL for .npy */
    attn_dtype dtype;
    int ndim;        /* 0 .. ATTN_MAX_DIMS */
    int64_t shape[ATTN_MAX_DIMS];
    void *data;      /* numel * dtype size bytes */
} attn_tensor;

/** A list of tensors read from one file, in data-offset order (empty tensors in header order). */
typedef struct attn_tensor_list {
    int count;
    attn_tensor *tensors;
} attn_tensor_list;

/** @return the number of elements of `t` (1 for ndim 0), or -1 for NULL, a bad ndim, a negative size
 *  or an overflowing product. */
ATTN_API int64_t attn_tensor_numel(const attn_tensor *t);
/** Frees a tensor's name and data (allocated through ctx) and zeroes it. */
ATTN_API void attn_tensor_release(attn_ctx *ctx, attn_tensor *t);
/** Frees every tensor of a list and the list's array. */
ATTN_API void attn_tensor_list_release(attn_ctx *ctx, attn_tensor_list *list);
/** @return the tensor called `name` in `list`, or NULL. */
ATTN_API const attn_tensor *attn_tensor_list_find(const attn_tensor_list *list, const char *name);

/**
 * Reads a .npy file (format 1.0-3.0, little-endian, C order; dtypes f4, f8, f2, b1, u1, i4, i8).
 * The header is never trusted: its shape must match the file's size exactly before anything of that
 * size is allocated. *out is overwritten (not released first) and zeroed on failure.
 * @return ATTN_ERR_IO (cannot open or read), ATTN_ERR_BAD_FILE (truncated, malformed, or a header
 *         that lies, size overflow included), ATTN_ERR_UNSUPPORTED (other dtypes, big-endian data,
 *         fortran_order, more than ATTN_MAX_DIMS dims, or a big-endian host), ATTN_ERR_OUT_OF_MEMORY.
 */
ATTN_API attn_status attn_npy_read(attn_ctx *ctx, const char *path, attn_tensor *out);
/** Parses .npy bytes already in memory (same checks as attn_npy_read). */
ATTN_API attn_status attn_npy_parse(attn_ctx *ctx, const void *bytes, size_t size, attn_tensor *out);
/**
 * Writes a .npy file (format 1.0, the bytes numpy.save writes) whole or not at all: the bytes go to a
 * temporary file in the same directory, which is flushed and renamed over `path`; on failure `path`
 * is left untouched and no temporary file remains. data may be NULL only for 0 elements.
 */
ATTN_API attn_status attn_npy_write(attn_ctx *ctx, const char *path, attn_dtype dtype, int ndim,
                                    const int64_t *shape, const void *data);
/** Reads a .safetensors file; every tensor's offsets and size are checked against the file and the
 *  data buffer must be covered exactly (no gaps, no overlaps). Errors as attn_npy_read. */
ATTN_API attn_status attn_safetensors_read(attn_ctx *ctx, const char *path, attn_tensor_list *out);
/** Parses .safetensors bytes already in memory. */
ATTN_API attn_status attn_safetensors_parse(attn_ctx *ctx, const void *bytes, size_t size, attn_tensor_list *out);
/** Writes `count` tensors to a .safetensors file, atomically like attn_npy_write. Names must be
 *  non-empty, valid UTF-8, unique and not "__metadata__". */
ATTN_API attn_status attn_safetensors_write(attn_ctx *ctx, const char *path, const attn_tensor *tensors, int count);

/**
 * Creates an nn.MultiheadAttention module from a state_dict (e.g. read from safetensors): the
 * options follow from the tensors present (in_proj_bias -> bias, bias_k -> add_bias_kv,
 * q_proj_weight -> separate kdim/vdim, which may also equal embed_dim); embed_dim from
 * out_proj.weight. add_zero_attn,
 * batch_first and dropout come from `cfg_extra` (its other fields are ignored), which may be NULL.
 * Every tensor must have the right shape and one type, F32, F16 or BF16 (else ATTN_ERR_UNSUPPORTED);
 * unknown names are an error. The module's dtype is the tensors' type, or cfg_extra->dtype when that
 * is F16 or BF16: F32 tensors are then rounded to it (module.to(dtype)); half tensors of the other
 * half type are ATTN_ERR_INVALID_ARG.
 */
ATTN_API attn_status attn_mha_create_from_state(attn_ctx *ctx, const attn_tensor_list *state, int64_t num_heads,
                                                const attn_mha_config *cfg_extra, attn_mha **mha);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_H */

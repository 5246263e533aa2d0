// blas.c - the projections through CBLAS (sgemm), when the build found it (ATTN_HAVE_CBLAS).
//
// Used for y = x W^T + b when the caller asks for it (attn_ctx_params.use_blas, off by default) on
// contexts whose kernels are AVX2 or portable. OpenBLAS's sgemm alone can beat the library's AVX2
// GEMM, but it runs its own threads (OPENBLAS_NUM_THREADS), not the context's, and they busy-wait
// after each call. On 2 cores with a 2-thread context, the nn.MultiheadAttention forward (E = 768,
// L = 1024, AVX2) took 44 to 68 ms over five processes with OPENBLAS_NUM_THREADS=2 and 68 to 80 ms
// with 1, against 47 to 50 ms on the library's GEMM, which also follows the context's thread count
// (BENCHMARKS.md has the rows). Its sgemm does not split the inner dimension, so results do not
// depend on its threads.
//
// The library is not linked: a context with use_blas loads it (dlopen, by the file name CMake found,
// ATTN_CBLAS_SONAME) and keeps its cblas_sgemm. OpenBLAS starts its threads when it is loaded, and
// they busy-wait for about 80 ms on every core but one before sleeping: linked, every program
// using libattn paid that at start-up, use_blas or not. Loaded with RTLD_NODELETE, it stays in the
// process once loaded (unloading OpenBLAS while its threads live is not safe), and a later context
// finds it there.
#include "cpu/cpu.h"
#include "internal.h"

#if defined(ATTN_HAVE_CBLAS) && !defined(_WIN32)
#include <cblas.h>
#include <dlfcn.h>

#ifndef RTLD_NODELETE
#define RTLD_NODELETE 0
#endif

typedef __typeof__(&cblas_sgemm) sgemm_fn;

// The loaded library and its cblas_sgemm, or NULL (and *sgemm NULL) when either is missing.
static void *open_cblas(sgemm_fn *sgemm) {
    *sgemm = NULL;
    void *lib = dlopen(ATTN_CBLAS_SONAME, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (lib == NULL) return NULL;
    *(void **)sgemm = dlsym(lib, "cblas_sgemm"); // a function pointer as POSIX's dlsym returns it
    if (*sgemm == NULL) {
        dlclose(lib);
        return NULL;
    }
    return lib;
}

void attn__blas_load(attn_ctx *ctx) {
    sgemm_fn f;
    ctx->blas_lib = ctx->use_blas ? open_cblas(&f) : NULL;
    ctx->blas_sgemm = ctx->blas_lib != NULL ? (void (*)(void))f : NULL;
}

void attn__blas_unload(attn_ctx *ctx) {
    if (ctx->blas_lib != NULL) dlclose(ctx->blas_lib);
    ctx->blas_lib = NULL, ctx->blas_sgemm = NULL;
}

bool attn__blas_linear(const attn_ctx *ctx, const float *x, int64_t rows, int64_t in, int64_t ldx, const float *W,
                       bool w_in_out, const float *b, int64_t out, float *y, int64_t ldy) {
    if (ctx->blas_sgemm == NULL || ctx->kernels == NULL) return false;
    // the AVX-512 tables' own GEMM is faster (attn.h, attn_has_blas): BLAS for AVX2 and portable only
    if (ctx->kernels->isa != ATTN_ISA_AVX2 && ctx->kernels->isa != ATTN_ISA_GENERIC) return false;
    if (rows > INT32_MAX || in > INT32_MAX || out > INT32_MAX || ldx > INT32_MAX || ldy > INT32_MAX) return false;
    const sgemm_fn sgemm = (sgemm_fn)ctx->blas_sgemm;
    sgemm(CblasRowMajor, CblasNoTrans, w_in_out ? CblasNoTrans : CblasTrans, (int)rows, (int)out, (int)in, 1.0f, x,
          (int)ldx, W, w_in_out ? (int)out : (int)in, 0.0f, y, (int)ldy);
    if (b != NULL)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t o = 0; o < out; o++) y[r * ldy + o] += b[o];
    return true;
}

int attn_has_blas(void) {
    sgemm_fn f;
    void *lib = open_cblas(&f);
    if (lib == NULL) return 0;
    dlclose(lib);
    return 1;
}
#else
void attn__blas_load(attn_ctx *ctx) { ctx->blas_lib = NULL, ctx->blas_sgemm = NULL; }

void attn__blas_unload(attn_ctx *ctx) { (void)ctx; }

bool attn__blas_linear(const attn_ctx *ctx, const float *x, int64_t rows, int64_t in, int64_t ldx, const float *W,
                       bool w_in_out, const float *b, int64_t out, float *y, int64_t ldy) {
    (void)ctx, (void)x, (void)rows, (void)in, (void)ldx, (void)W, (void)w_in_out, (void)b, (void)out, (void)y, (void)ldy;
    return false;
}

int attn_has_blas(void) { return 0; }
#endif

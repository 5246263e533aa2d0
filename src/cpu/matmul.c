// matmul.c - the general strided product C (+)= A B of the backward passes (see internal.h): the
// reference loops, and a parallel version on the kernel table's gemm. Work items are blocks of 64
// rows of C; each packs B a chunk of 256 rows at a time into rows padded to 16 columns and sums
// into a private block of C, so every element's sum runs over k in the same order whatever the
// thread count.
#include <string.h>

#include "cpu/cpu.h"

#define MM_ROWS 64   // rows of C per item
#define MM_KCHUNK 256 // rows of B packed at a time

static int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }

static size_t per_thread(int64_t N) {
    attn__arena a = {0};
    attn__arena_take(&a, (size_t)(MM_KCHUNK * pad16(N)) * sizeof(float)); // packed B chunk
    attn__arena_take(&a, (size_t)(MM_ROWS * pad16(N)) * sizeof(float));   // private C block
    return (a.used + ATTN_ALIGN - 1) & ~(size_t)(ATTN_ALIGN - 1);
}

size_t attn__matmul_workspace(const attn_ctx *ctx, int64_t N) {
    if (ctx->kernels == NULL) return 0;
    return per_thread(N) * (size_t)attn__pool_threads(ctx->pool) + ATTN_ALIGN;
}

typedef struct mm_job {
    const attn__kernels *kn;
    int64_t M, N, K, a_rs, a_cs, b_rs, b_cs, ldc;
    const float *A, *B;
    float *C;
    bool accumulate;
    char *scratch;
    size_t per_thread;
} mm_job;

static void mm_task(void *arg, int64_t task, int thread) {
    const mm_job *J = arg;
    const int64_t m0 = task * MM_ROWS, nm = J->M - m0 < MM_ROWS ? J->M - m0 : MM_ROWS, Np = pad16(J->N);
    attn__arena a = {.base = J->scratch + (size_t)thread * J->per_thread};
    float *bp = attn__arena_take(&a, (size_t)(MM_KCHUNK * Np) * sizeof(float));
    float *cp = attn__arena_take(&a, (size_t)(MM_ROWS * Np) * sizeof(float));
    for (int64_t m = 0; m < nm; m++)
        for (int64_t n = 0; n < Np; n++) cp[m * Np + n] = J->accumulate && n < J->N ? J->C[(m0 + m) * J->ldc + n] : 0.0f;
    for (int64_t k0 = 0; k0 < J->K; k0 += MM_KCHUNK) {
        const int64_t nk = J->K - k0 < MM_KCHUNK ? J->K - k0 : MM_KCHUNK;
        for (int64_t k = 0; k < nk; k++)
            for (int64_t n = 0; n < Np; n++)
                bp[k * Np + n] = n < J->N ? J->B[(k0 + k) * J->b_rs + n * J->b_cs] : 0.0f;
        J->kn->gemm(J->A + m0 * J->a_rs + k0 * J->a_cs, J->a_rs, J->a_cs, (int)nm, (int)nk, bp, Np, (int)Np, cp, Np,
                    true);
    }
    for (int64_t m = 0; m < nm; m++) memcpy(J->C + (m0 + m) * J->ldc, cp + m * Np, (size_t)J->N * sizeof(float));
}

void attn__matmul(attn_ctx *ctx, int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_cs,
                  const float *B, int64_t b_rs, int64_t b_cs, float *C, int64_t ldc, bool accumulate, void *ws) {
    if (ctx->kernels == NULL) { // the reference: double sums, one rounding per element
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double acc = accumulate ? (double)C[m * ldc + n] : 0.0;
                for (int64_t k = 0; k < K; k++) acc += (double)A[m * a_rs + k * a_cs] * (double)B[k * b_rs + n * b_cs];
                C[m * ldc + n] = (float)acc;
            }
        return;
    }
    mm_job J = {ctx->kernels, M, N, K, a_rs, a_cs, b_rs, b_cs, ldc, A, B, C, accumulate,
                (char *)(((uintptr_t)ws + ATTN_ALIGN - 1) & ~(uintptr_t)(ATTN_ALIGN - 1)), per_thread(N)};
    attn__pool_run(ctx->pool, (M + MM_ROWS - 1) / MM_ROWS, mm_task, &J);
}

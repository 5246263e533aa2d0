// gemm.c - times y = x W^T (M x N from K) through attn_linear on each instruction set the CPU runs,
// and through cblas_sgemm when built with -DHAVE_CBLAS; prints one JSON object per line. Used by
// bench/run_bench.py to decide, by measurement, what the library hands to BLAS.
//   cc -O2 -Iinclude bench/gemm.c build/libattn.a [-DHAVE_CBLAS -lopenblas] -lm -lpthread
//   gemm M N K THREADS
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "attn.h"
#if defined(HAVE_CBLAS)
#include <cblas.h>
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: gemm M N K THREADS\n");
        return 2;
    }
    const int M = atoi(argv[1]), N = atoi(argv[2]), K = atoi(argv[3]), T = atoi(argv[4]);
    float *x = malloc(sizeof(float) * (size_t)M * K), *w = malloc(sizeof(float) * (size_t)N * K);
    float *y = malloc(sizeof(float) * (size_t)M * N);
    if (x == NULL || w == NULL || y == NULL || M < 1 || N < 1 || K < 1 || T < 1) return 1;
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)N * K; i++) w[i] = (float)(i % 7) * 0.01f;
    const double flops = 2.0 * M * N * K;
    const attn_isa isas[3] = {ATTN_ISA_GENERIC, ATTN_ISA_AVX2, ATTN_ISA_AVX512};
    for (int i = 0; i < 3; i++) {
        if (!attn_isa_supported(isas[i]) || isas[i] == ATTN_ISA_GENERIC) continue;
        attn_ctx_params p;
        attn_ctx_params_init(&p);
        p.isa = isas[i], p.n_threads = T, p.use_blas = 0; // the library's own GEMM
        attn_ctx *ctx;
        if (attn_ctx_create(&p, &ctx) != ATTN_OK) return 1;
        double best = 1e30;
        for (int r = 0; r < 12; r++) {
            double t = now();
            attn_linear(ctx, x, M, K, w, ATTN_WEIGHT_OUT_IN, NULL, N, y);
            t = now() - t;
            if (r > 1 && t < best) best = t;
        }
        printf("{\"impl\": \"attn %s\", \"M\": %d, \"N\": %d, \"K\": %d, \"ms\": %.4f, \"gflops\": %.1f}\n",
               attn_isa_name(isas[i]), M, N, K, best * 1e3, flops / best / 1e9);
        attn_ctx_free(ctx);
    }
#if defined(HAVE_CBLAS)
    double best = 1e30;
    for (int r = 0; r < 12; r++) {
        double t = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
        t = now() - t;
        if (r > 1 && t < best) best = t;
    }
    printf("{\"impl\": \"cblas_sgemm\", \"M\": %d, \"N\": %d, \"K\": %d, \"ms\": %.4f, \"gflops\": %.1f}\n", M, N, K,
           best * 1e3, flops / best / 1e9);
#endif
    free(x), free(w), free(y);
    return 0;
}

// gemm.h - the matrix products of libattn_cuda's modules: row-major C = op(A) op(B) (+ bias) on
// cuBLASLt, float32 accumulation. cuBLASLt is loaded at run time (dlopen) when a module first needs
// it, so libattn_cuda itself still needs only the CUDA driver: without the library a module call
// answers ATTN_ERR_UNSUPPORTED with the names it looked for.
#ifndef ATTN_CUDA_GEMM_H
#define ATTN_CUDA_GEMM_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

#include "plan.h"

typedef struct attn__cuda_blas attn__cuda_blas; // the loaded library and a handle

// Loads cuBLASLt (once per module: $ATTN_CUBLASLT_LIBRARY, else libcublasLt.so.13, .so.12,
// .so) and creates a handle. ATTN_ERR_UNSUPPORTED when it cannot be found, ATTN_ERR_DEVICE when the
// handle cannot be created.
attn_status attn__cuda_blas_open(attn__cuda_err *e, attn__cuda_blas **blas);
void attn__cuda_blas_close(attn__cuda_blas *blas);

// One product, row-major: C (m x n, leading dimension ldc, type c_type) = alpha op(A) op(B) +
// beta C, plus bias[n] on every row when bias is not NULL (bias of c_type). op(A) is m x k: A is
// m x k (lda) or, with trans_a, k x m (lda); op(B) is k x n: B is k x n (ldb) or, with trans_b,
// n x k. A and B are of ab_type (ATTN_DTYPE_F32, F16 or BF16), C of ab_type or F32; float32
// arithmetic throughout (no TF32).
typedef struct attn__cuda_gemm {
    int64_t m, n, k;
    const void *a, *b;
    int64_t lda, ldb, ldc;
    bool trans_a, trans_b;
    void *c;
    const void *bias;
    float alpha, beta;
    int ab_type, c_type;
} attn__cuda_gemm;

attn_status attn__cuda_gemm_run(attn__cuda_err *e, attn__cuda_blas *blas, const attn__cuda_gemm *g,
                                cudaStream_t stream);

#endif

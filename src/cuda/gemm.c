// gemm.c - row-major products on cuBLASLt, loaded at run time (see gemm.h).
//
// A row-major m x n product C = op(A) op(B) is the column-major n x m product C^T = op(B)^T op(A)^T,
// and a row-major matrix is its transpose read column-major: so cuBLASLt gets B first and A second,
// each with its own transposition flag, and a row-major bias of n values is cuBLASLt's bias along
// the rows of the column-major result (CUBLASLT_EPILOGUE_BIAS).
#include "gemm.h"

#include <cublasLt.h>
#include <dlfcn.h>
#include <stdlib.h>

typedef cublasStatus_t (*create_fn)(cublasLtHandle_t *);
typedef cublasStatus_t (*destroy_fn)(cublasLtHandle_t);
typedef cublasStatus_t (*desc_create_fn)(cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t);
typedef cublasStatus_t (*desc_destroy_fn)(cublasLtMatmulDesc_t);
typedef cublasStatus_t (*desc_set_fn)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void *, size_t);
typedef cublasStatus_t (*layout_create_fn)(cublasLtMatrixLayout_t *, cudaDataType, uint64_t, uint64_t, int64_t);
typedef cublasStatus_t (*layout_destroy_fn)(cublasLtMatrixLayout_t);
typedef cublasStatus_t (*matmul_fn)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *,
                                    cublasLtMatrixLayout_t, const void *, cublasLtMatrixLayout_t, const void *,
                                    const void *, cublasLtMatrixLayout_t, void *, cublasLtMatrixLayout_t,
                                    const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t);

struct attn__cuda_blas {
    void *dl;
    cublasLtHandle_t handle;
    create_fn create;
    destroy_fn destroy;
    desc_create_fn desc_create;
    desc_destroy_fn desc_destroy;
    desc_set_fn desc_set;
    layout_create_fn layout_create;
    layout_destroy_fn layout_destroy;
    matmul_fn matmul;
};

attn_status attn__cuda_blas_open(attn__cuda_err *e, attn__cuda_blas **out) {
    *out = NULL;
    const char *env = getenv("ATTN_CUBLASLT_LIBRARY");
    const char *names[] = {env, "libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
    void *dl = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && dl == NULL; i++)
        if (names[i] != NULL && names[i][0] != '\0') dl = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL)
        return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED,
                               "cuda mha: cuBLASLt was not found (libcublasLt.so.13, .so.12 or .so on the loader's path, "
                               "or $ATTN_CUBLASLT_LIBRARY)");
    attn__cuda_blas *b = calloc(1, sizeof *b);
    if (b == NULL) {
        dlclose(dl);
        return attn__cuda_fail(e, ATTN_ERR_OUT_OF_MEMORY, "cuda mha: out of host memory");
    }
    b->dl = dl;
    // POSIX: a function pointer read through a void * (dlsym's documented use)
    *(void **)&b->create = dlsym(dl, "cublasLtCreate");
    *(void **)&b->destroy = dlsym(dl, "cublasLtDestroy");
    *(void **)&b->desc_create = dlsym(dl, "cublasLtMatmulDescCreate");
    *(void **)&b->desc_destroy = dlsym(dl, "cublasLtMatmulDescDestroy");
    *(void **)&b->desc_set = dlsym(dl, "cublasLtMatmulDescSetAttribute");
    *(void **)&b->layout_create = dlsym(dl, "cublasLtMatrixLayoutCreate");
    *(void **)&b->layout_destroy = dlsym(dl, "cublasLtMatrixLayoutDestroy");
    *(void **)&b->matmul = dlsym(dl, "cublasLtMatmul");
    if (b->create == NULL || b->destroy == NULL || b->desc_create == NULL || b->desc_destroy == NULL ||
        b->desc_set == NULL || b->layout_create == NULL || b->layout_destroy == NULL || b->matmul == NULL) {
        attn__cuda_blas_close(b);
        return attn__cuda_fail(e, ATTN_ERR_UNSUPPORTED, "cuda mha: the cuBLASLt found lacks a function it needs");
    }
    const cublasStatus_t st = b->create(&b->handle);
    if (st != CUBLAS_STATUS_SUCCESS) {
        b->handle = NULL;
        attn__cuda_blas_close(b);
        return attn__cuda_fail(e, ATTN_ERR_DEVICE, "cuda mha: cublasLtCreate failed (status %d)", (int)st);
    }
    *out = b;
    return ATTN_OK;
}

void attn__cuda_blas_close(attn__cuda_blas *b) {
    if (b == NULL) return;
    if (b->handle != NULL) b->destroy(b->handle);
    dlclose(b->dl);
    free(b);
}

static cudaDataType_t data_type(int t) {
    return t == ATTN_DTYPE_BF16 ? CUDA_R_16BF : t == ATTN_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

attn_status attn__cuda_gemm_run(attn__cuda_err *e, attn__cuda_blas *b, const attn__cuda_gemm *g, cudaStream_t stream) {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t lb = NULL, la = NULL, lc = NULL;
    const cublasOperation_t tb = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, ta = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cudaDataType_t ab = data_type(g->ab_type), c = data_type(g->c_type);
    cublasStatus_t st = b->desc_create(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    // cuBLASLt's first operand is B: n x k column-major (B read as stored), or k x n transposed
    if (st == CUBLAS_STATUS_SUCCESS) st = b->desc_set(op, CUBLASLT_MATMUL_DESC_TRANSA, &tb, sizeof tb);
    if (st == CUBLAS_STATUS_SUCCESS) st = b->desc_set(op, CUBLASLT_MATMUL_DESC_TRANSB, &ta, sizeof ta);
    if (st == CUBLAS_STATUS_SUCCESS && g->bias != NULL) {
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        st = b->desc_set(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        if (st == CUBLAS_STATUS_SUCCESS) st = b->desc_set(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias);
        if (st == CUBLAS_STATUS_SUCCESS) st = b->desc_set(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &c, sizeof c);
    }
    if (st == CUBLAS_STATUS_SUCCESS)
        st = g->trans_b ? b->layout_create(&lb, ab, (uint64_t)g->k, (uint64_t)g->n, g->ldb)
                        : b->layout_create(&lb, ab, (uint64_t)g->n, (uint64_t)g->k, g->ldb);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = g->trans_a ? b->layout_create(&la, ab, (uint64_t)g->m, (uint64_t)g->k, g->lda)
                        : b->layout_create(&la, ab, (uint64_t)g->k, (uint64_t)g->m, g->lda);
    if (st == CUBLAS_STATUS_SUCCESS) st = b->layout_create(&lc, c, (uint64_t)g->n, (uint64_t)g->m, g->ldc);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = b->matmul(b->handle, op, &g->alpha, g->b, lb, g->a, la, &g->beta, g->c, lc, g->c, lc, NULL, NULL, 0, stream);
    if (lc != NULL) b->layout_destroy(lc);
    if (la != NULL) b->layout_destroy(la);
    if (lb != NULL) b->layout_destroy(lb);
    if (op != NULL) b->desc_destroy(op);
    if (st != CUBLAS_STATUS_SUCCESS)
        return attn__cuda_fail(e, ATTN_ERR_DEVICE, "cuda mha: cuBLASLt matmul (%lld x %lld x %lld) failed with status %d",
                               (long long)g->m, (long long)g->n, (long long)g->k, (int)st);
    return ATTN_OK;
}

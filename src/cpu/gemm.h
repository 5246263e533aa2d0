// gemm.h - the fast linear map of gemm.c.
#ifndef ATTN_CPU_GEMM_H
#define ATTN_CPU_GEMM_H

#include "internal.h"

// Scratch bytes attn__gemm_linear needs on this context for `in` input features.
size_t attn__gemm_workspace(const attn_ctx *ctx, int64_t in);
// y (rows, out) at row stride ldy = x (rows, in) at ldx times W^T (+ b), on ctx's kernels and threads.
void attn__gemm_linear(attn_ctx *ctx, const float *x, int64_t rows, int64_t in, int64_t ldx, const float *W,
                       bool w_in_out, const float *b, int64_t out, float *y, int64_t ldy, void *ws);

#endif

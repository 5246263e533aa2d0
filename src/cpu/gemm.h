// gemm.h - the fast linear map of gemm.c.
#ifndef ATTN_CPU_GEMM_H
#define ATTN_CPU_GEMM_H

#include "internal.h"

// Scratch bytes attn__gemm_linear needs on this context for `in` input features.
size_t attn__gemm_workspace(const attn_ctx *ctx, int64_t in);
// y (rows, out) at row stride ldy = x (rows, in) at ldx times W^T (+ b), on ctx's kernels and threads.
void attn__gemm_linear(attn_ctx *ctx, const float *x, int64_t rows, int64_t in, int64_t ldx, const float *W,
                       bool w_in_out, const float *b, int64_t out, float *y, int64_t ldy, void *ws);
// Whether attn__gemm_linear takes the few-rows path (dot products along W's rows, W (out, in)) for
// rows rows of in features: the path attn__gemv_linear runs.
bool attn__gemv_applies(int64_t rows, int64_t in);
// The few-rows path with W (out, in) of type wdt (F32, F16 or BF16) read as it is (half precision
// converted exactly as it is loaded): y = x W^T (+ b), the sums of the float32 path on the same
// values. Only where attn__gemv_applies; ws as attn__gemm_linear's.
void attn__gemv_linear(attn_ctx *ctx, const float *x, int64_t rows, int64_t in, int64_t ldx, const void *W,
                       attn_dtype wdt, const float *b, int64_t out, float *y, int64_t ldy, void *ws);
// Whether attn__gemm_dot_linear runs on ctx for `in` input features: a kernel table with bf16 dot
// products (gemm_bf16) and in even.
bool attn__gemm_dot_applies(const attn_ctx *ctx, int64_t in);
// y = x W^T (+ b) with W (out, in) of bfloat16 read in place and the rows of x rounded to bfloat16
// (exact when they hold bfloat16 values), on gemm_bf16: float32 sums of the exact products, each
// over the input pairs in ascending order (not the float32 path's order or bits; the dot
// instructions flush subnormal inputs and results to zero). Only where attn__gemm_dot_applies; ws
// as attn__gemm_linear's.
void attn__gemm_dot_linear(attn_ctx *ctx, const float *x, int64_t rows, int64_t in, int64_t ldx, const uint16_t *W,
                           const float *b, int64_t out, float *y, int64_t ldy, void *ws);

#endif

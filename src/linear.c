// linear.c - dense products used by the modules: y = x W^T + b (nn.Linear) or y = x W + b.
//
// The reference implementation is here: plain loops with double accumulators, rounded to float
// once per output. Contexts with fused kernels use the fast GEMM of cpu/gemm.c instead.
#include "cpu/gemm.h"
#include "internal.h"

static void linear_ref(const float *x, int64_t rows, int64_t in, int64_t ldx, const float *W, bool w_in_out,
                       const float *b, int64_t out, float *y, int64_t ldy) {
    // x: (rows, in) at row stride ldx; W: (out, in) or (in, out); y: (rows, out) at row stride ldy
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ldx;
        float *yr = y + r * ldy;
        for (int64_t o = 0; o < out; o++) {
            double acc = 0.0;
            if (w_in_out) {
                for (int64_t i = 0; i < in; i++) acc += (double)xr[i] * (double)W[i * out + o];
            } else {
                const float *wr = W + o * in;
                for (int64_t i = 0; i < in; i++) acc += (double)xr[i] * (double)wr[i];
            }
            if (b != NULL) acc += (double)b[o];
            yr[o] = (float)acc;
        }
    }
}

size_t attn__linear_workspace(const attn_ctx *ctx, int64_t in) {
    return ctx->kernels != NULL ? attn__gemm_workspace(ctx, in) : 0;
}

void attn__linear(attn_ctx *ctx, const float *x, int64_t rows, int64_t in, int64_t ldx, const float *W, bool w_in_out,
                  const float *b, int64_t out, float *y, int64_t ldy, void *ws) {
    if (attn__blas_linear(ctx, x, rows, in, ldx, W, w_in_out, b, out, y, ldy)) return;
    if (ctx->kernels != NULL)
        attn__gemm_linear(ctx, x, rows, in, ldx, W, w_in_out, b, out, y, ldy, ws);
    else
        linear_ref(x, rows, in, ldx, W, w_in_out, b, out, y, ldy);
}

bool attn__linear_half_applies(const attn_ctx *ctx, attn_dtype wdt, int64_t rows, int64_t in) {
    return ctx->kernels != NULL &&
           (attn__gemv_applies(rows, in) || (wdt == ATTN_DTYPE_BF16 && attn__gemm_dot_applies(ctx, in)));
}

void attn__linear_half(attn_ctx *ctx, const float *x, int64_t rows, int64_t in, int64_t ldx, const void *W,
                       attn_dtype wdt, const float *b, int64_t out, float *y, int64_t ldy, void *ws) {
    if (attn__gemv_applies(rows, in)) attn__gemv_linear(ctx, x, rows, in, ldx, W, wdt, b, out, y, ldy, ws);
    else attn__gemm_dot_linear(ctx, x, rows, in, ldx, W, b, out, y, ldy, ws);
}

attn_status attn_linear(attn_ctx *ctx, const float *x, int64_t rows, int64_t in_features, const float *w,
                        attn_weight_layout layout, const float *b, int64_t out_features, float *y) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (x == NULL || w == NULL || y == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "linear: x, w and y must not be NULL");
    if (layout != ATTN_WEIGHT_OUT_IN && layout != ATTN_WEIGHT_IN_OUT)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "linear: unknown weight layout %d", (int)layout);
    int64_t n;
    const int64_t dims_x[2] = {rows, in_features}, dims_y[2] = {rows, out_features}, dims_w[2] = {out_features, in_features};
    size_t bytes;
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "linear: x", 2, dims_x, &n));
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "linear: x", n, sizeof(float), &bytes));
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "linear: y", 2, dims_y, &n));
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "linear: y", n, sizeof(float), &bytes));
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "linear: w", 2, dims_w, &n));
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "linear: w", n, sizeof(float), &bytes));
    size_t ws_bytes;
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "linear: workspace", in_features, (size_t)1, &ws_bytes));
    void *ws;
    ATTN_RETURN_IF_ERR(attn__workspace(ctx, attn__linear_workspace(ctx, in_features), &ws));
    attn__linear(ctx, x, rows, in_features, in_features, w, layout == ATTN_WEIGHT_IN_OUT, b, out_features, y,
                 out_features, ws);
    return ATTN_OK;
}

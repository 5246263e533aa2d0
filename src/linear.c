// linear.c - dense products used by the modules: y = x W^T + b (nn.Linear) or y = x W + b.
//
// This is the reference implementation: plain loops with double accumulators, rounded to float
// once per output. Faster kernels (BLAS, SIMD) plug in behind the same function.
#include "internal.h"

void attn__linear(const attn_ctx *ctx, const float *x, int64_t rows, int64_t in, int64_t ldx, const float *W,
                  bool w_in_out, const float *b, int64_t out, float *y, int64_t ldy) {
    (void)ctx;
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

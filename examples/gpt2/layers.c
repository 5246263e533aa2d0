// layers.c - the two layers of GPT-2 that are not attention or a projection: LayerNorm and GELU.
#include <math.h>

#include "gpt2.h"

void gpt2_layer_norm(const float *x, int64_t rows, int64_t E, const float *weight, const float *bias, double eps,
                     float *y) {
    // x, y: (rows, E); weight, bias: (E)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * E;
        float *yr = y + r * E;
        double sum = 0.0;
        for (int64_t i = 0; i < E; i++) sum += (double)xr[i];
        const double mean = sum / (double)E;
        double sq = 0.0;
        for (int64_t i = 0; i < E; i++) {
            const double d = (double)xr[i] - mean;
            sq += d * d;
        }
        const float inv = (float)(1.0 / sqrt(sq / (double)E + eps)), m = (float)mean;
        for (int64_t i = 0; i < E; i++) yr[i] = (xr[i] - m) * inv * weight[i] + bias[i];
    }
}

void gpt2_gelu(float *x, int64_t n, gpt2_activation act) {
    // x: (n), in place
    if (act == GPT2_GELU_ERF) {
        for (int64_t i = 0; i < n; i++) x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
        return;
    }
    // 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3): one exponential
    // per element, and for large |x| the limits x and -0 without the cancellation in 1 + tanh(u).
    const float c = 0.79788456080286536f; // sqrt(2 / pi)
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i], u = c * (v + 0.044715f * v * v * v);
        x[i] = v / (1.0f + expf(-2.0f * u));
    }
}

// quant.h - the block-quantised k/v types Q8_0 and Q4_0 (layouts in attn.h, attn_dtype; element
// reader attn__kv_at in half.h): quantisation of float rows with ggml's reference rounding, and
// dequantisation. Scalar code, used by attn_convert, KV cache appends and the portable kernels.
#ifndef ATTN_QUANT_H
#define ATTN_QUANT_H

#include "internal.h"

// Per-value error of the quantisation (attn.h, attn_convert): |x' - x| <= c * m + a for a value of a
// finite, representable block whose largest magnitude is m.
typedef struct attn__quant_bound {
    double c, a;
} attn__quant_bound;
attn__quant_bound attn__quant_error(attn_dtype dt);

// n values of x (n a multiple of ATTN_QBLOCK) quantised to dt (Q8_0 or Q4_0) at dst: n / 32 blocks.
void attn__quantize(attn_dtype dt, const float *x, void *dst, int64_t n);
// n values (n a multiple of ATTN_QBLOCK) of a dt tensor from its start, as floats.
void attn__dequantize(attn_dtype dt, const void *src, float *y, int64_t n);

#endif

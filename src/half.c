// half.c - attn_convert: float32 to and from IEEE half and bfloat16 (the element types a k/v
// tensor or a KV cache may hold), with the exact conversions of half.h, and to and from the
// block-quantised Q8_0 and Q4_0 (quant.c).
#include "cpu/cpu.h"
#include "half.h"
#include "internal.h"
#include "quant.h"

static bool half_type(attn_dtype t) { return t == ATTN_DTYPE_F16 || t == ATTN_DTYPE_BF16; }

attn_status attn_convert(attn_dtype dst_dtype, void *dst, attn_dtype src_dtype, const void *src, int64_t n) {
    if (n < 0 || (n > 0 && (dst == NULL || src == NULL))) return ATTN_ERR_INVALID_ARG;
    if (attn__is_block_dtype(dst_dtype) || attn__is_block_dtype(src_dtype)) {
        const bool quantize = src_dtype == ATTN_DTYPE_F32 && attn__is_block_dtype(dst_dtype);
        const bool dequantize = attn__is_block_dtype(src_dtype) && dst_dtype == ATTN_DTYPE_F32;
        if ((!quantize && !dequantize) || n % ATTN_QBLOCK != 0) return ATTN_ERR_INVALID_ARG;
        if (quantize)
            attn__quantize(dst_dtype, src, dst, n);
        else
            attn__dequantize(src_dtype, src, dst, n);
        return ATTN_OK;
    }
    const bool to_half = src_dtype == ATTN_DTYPE_F32 && half_type(dst_dtype);
    const bool from_half = half_type(src_dtype) && dst_dtype == ATTN_DTYPE_F32;
    if (!to_half && !from_half && !(src_dtype == dst_dtype && (half_type(src_dtype) || src_dtype == ATTN_DTYPE_F32)))
        return ATTN_ERR_INVALID_ARG;
    if (src_dtype == dst_dtype) {
        memmove(dst, src, (size_t)n * attn_dtype_size(src_dtype));
    } else if (from_half) {
        attn__to_f32(NULL, src_dtype, src, dst, n);
    } else {
        attn__from_f32(NULL, dst_dtype, src, dst, n);
    }
    return ATTN_OK;
}

void attn__to_f32(const attn_ctx *ctx, attn_dtype dt, const void *src, float *dst, int64_t n) {
    const uint16_t *h = src;
    if (dt == ATTN_DTYPE_F32)
        memmove(dst, src, (size_t)n * sizeof(float));
    else if (ctx != NULL && ctx->kernels != NULL)
        ctx->kernels->half_to_f32(dt, h, dst, n);
    else if (dt == ATTN_DTYPE_BF16) // the type tested once: the loops vectorise
        for (int64_t i = 0; i < n; i++) dst[i] = attn__bf16_to_f32(h[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = attn__f16_to_f32(h[i]);
}

void attn__from_f32(const attn_ctx *ctx, attn_dtype dt, const float *src, void *dst, int64_t n) {
    uint16_t *h = dst;
    if (dt == ATTN_DTYPE_F32)
        memmove(dst, src, (size_t)n * sizeof(float));
    else if (ctx != NULL && ctx->kernels != NULL)
        ctx->kernels->f32_to_half(dt, src, h, n);
    else if (dt == ATTN_DTYPE_BF16) // the type tested once: the loops vectorise
        for (int64_t i = 0; i < n; i++) h[i] = attn__f32_to_bf16(src[i]);
    else
        for (int64_t i = 0; i < n; i++) h[i] = attn__f32_to_f16(src[i]);
}

void attn__round_half(const attn_ctx *ctx, attn_dtype dt, float *x, int64_t n) {
    if (dt != ATTN_DTYPE_F16 && dt != ATTN_DTYPE_BF16) return;
    uint16_t h[1024]; // a chunk at a time, through the context's vector conversions
    for (int64_t i = 0; i < n; i += 1024) {
        const int64_t c = n - i < 1024 ? n - i : 1024;
        attn__from_f32(ctx, dt, x + i, h, c);
        attn__to_f32(ctx, dt, h, x + i, c);
    }
}

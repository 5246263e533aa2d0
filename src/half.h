// half.h - IEEE binary16 and bfloat16 conversions, scalar and exact: every half value converts to
// the float it denotes, and floats convert with round-to-nearest-even (as PyTorch's .half() and
// .bfloat16() do), NaN staying NaN. Also the element reader of every type k and v may have,
// the block-quantised Q8_0 and Q4_0 included (their layout: attn.h, attn_dtype; quantisation:
// quant.c).
#ifndef ATTN_HALF_H
#define ATTN_HALF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float attn__bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t attn__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

// Whether n contiguous floats hold an infinity or a NaN (all exponent bits set), in integer
// operations the compiler vectorises.
static inline int attn__f32_any_nonfinite(const float *x, int64_t n) {
    uint32_t any = 0;
    for (int64_t i = 0; i < n; i++) any |= (uint32_t)((attn__f32_bits(x[i]) & 0x7f800000u) == 0x7f800000u);
    return any != 0;
}

// Without branches (selects), so that a loop of them vectorises: a normal half moves its exponent and
// mantissa into place and rebiases the exponent (+112); infinity and NaN get exponent 255 (NaN's
// payload kept); zero and subnormals are man * 2^-24, exact in float; the sign is put back last.
static inline float attn__f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu;
    const uint32_t normal = (em << 13) + 0x38000000u, special = (em << 13) | 0x7f800000u;
    const uint32_t sub = attn__f32_bits((float)(int32_t)em * 5.9604644775390625e-8f);
    const uint32_t is_special = 0u - (uint32_t)(em >= 0x7c00u), is_sub = 0u - (uint32_t)(em < 0x400u); // all ones or 0
    const uint32_t big = (special & is_special) | (normal & ~is_special);
    return attn__bits_f32((sub & is_sub) | (big & ~is_sub) | sign);
}

// The three cases as selects too (a loop of them vectorises): a normal half rounds the 13 dropped
// mantissa bits to nearest even and rebiases; below 2^-14 the sum |f| + 0.5 rounds |f| to a
// multiple of 2^-24 (0.5's unit in the last place; to nearest even, the float addition's rounding
// in the default environment) whose count is the subnormal half (1024: the smallest normal one);
// 65520 and above is infinity; NaN stays NaN, quiet, with the top of its payload.
static inline uint16_t attn__f32_to_f16(float f) {
    const uint32_t u = attn__f32_bits(f), sign = (u >> 16) & 0x8000u, abs = u & 0x7fffffffu;
    const uint32_t nan = 0x7e00u | ((abs >> 13) & 0x3ffu);
    const uint32_t normal = ((abs + 0xfffu + ((abs >> 13) & 1u) - 0x38000000u) >> 13) & 0x7fffu;
    const uint32_t sub = attn__f32_bits(attn__bits_f32(abs) + 0.5f) - 0x3f000000u;
    const uint32_t is_sub = 0u - (uint32_t)(abs < 0x38800000u), is_big = 0u - (uint32_t)(abs >= 0x477ff000u);
    const uint32_t is_nan = 0u - (uint32_t)(abs > 0x7f800000u); // all ones or 0
    const uint32_t finite = (sub & is_sub) | (normal & ~is_sub), big = (nan & is_nan) | (0x7c00u & ~is_nan);
    return (uint16_t)(sign | (big & is_big) | (finite & ~is_big));
}

static inline float attn__bf16_to_f32(uint16_t h) { return attn__bits_f32((uint32_t)h << 16); }

static inline uint16_t attn__f32_to_bf16(float f) {
    const uint32_t u = attn__f32_bits(f);
    const uint32_t nearest = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet_nan = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : nearest); // a select: loops vectorise
}

// v * 2^k rounded to bf16 (to nearest even): v itself for k = 0, the exponent field moved when v is
// normal and stays so (exact), through float32 otherwise (subnormal, zero, inf or NaN, or a result
// leaving the normal range).
static inline uint16_t attn__bf16_times_pow2(uint16_t v, int k) {
    if (k == 0) return v;
    const int ex = (v >> 7) & 0xff;
    if (ex != 0 && ex != 0xff && ex + k >= 1 && ex + k <= 0xfe) return (uint16_t)(v + k * 128);
    return attn__f32_to_bf16(ldexpf(attn__bf16_to_f32(v), k));
}

// The block types: ATTN_QBLOCK values per block, a half scale (little-endian) then the quants.
#define ATTN_QBLOCK 32
#define ATTN_Q8_0_BYTES 34 // d, int8 q[32]
#define ATTN_Q4_0_BYTES 18 // d, qs[16]: value i in the low nibble of qs[i], value i + 16 in the high one

// The scale of the block at b.
static inline float attn__qblock_scale(const uint8_t *b) { return attn__f16_to_f32((uint16_t)(b[0] | b[1] << 8)); }

// Value off of a Q8_0 tensor: q * d, exact in float.
static inline float attn__q8_0_at(const void *p, int64_t off) {
    const uint8_t *b = (const uint8_t *)p + off / ATTN_QBLOCK * ATTN_Q8_0_BYTES;
    return (float)(int8_t)b[2 + off % ATTN_QBLOCK] * attn__qblock_scale(b);
}

// Value off of a Q4_0 tensor: (nibble - 8) * d, exact in float.
static inline float attn__q4_0_at(const void *p, int64_t off) {
    const uint8_t *b = (const uint8_t *)p + off / ATTN_QBLOCK * ATTN_Q4_0_BYTES;
    const int i = (int)(off % ATTN_QBLOCK), byte = b[2 + i % 16];
    return (float)((i < 16 ? byte & 15 : byte >> 4) - 8) * attn__qblock_scale(b);
}

// Element `off` of a tensor of dtype F32, F16 or BF16 (q, k, v, out, a gradient) or Q8_0, Q4_0 (k, v),
// as float.
static inline float attn__kv_at(const void *p, int dtype, int64_t off) {
    if (dtype == 2) return attn__f16_to_f32(((const uint16_t *)p)[off]);  // ATTN_DTYPE_F16
    if (dtype == 3) return attn__bf16_to_f32(((const uint16_t *)p)[off]); // ATTN_DTYPE_BF16
    if (dtype == 8) return attn__q8_0_at(p, off);                          // ATTN_DTYPE_Q8_0
    if (dtype == 9) return attn__q4_0_at(p, off);                          // ATTN_DTYPE_Q4_0
    return ((const float *)p)[off];
}

// Writes x as element `off` of a tensor of dtype F32, F16 or BF16 (rounded to nearest even).
static inline void attn__elem_set(void *p, int dtype, int64_t off, float x) {
    if (dtype == 2) ((uint16_t *)p)[off] = attn__f32_to_f16(x);       // ATTN_DTYPE_F16
    else if (dtype == 3) ((uint16_t *)p)[off] = attn__f32_to_bf16(x); // ATTN_DTYPE_BF16
    else ((float *)p)[off] = x;
}

// dst[i] = scale * element off + i * stride of p (a dtype of attn__kv_at), i < n: the type tested
// once, float32 read directly.
static inline void attn__gather(float *dst, const void *p, int dtype, int64_t off, int64_t stride, int64_t n,
                                float scale) {
    if (dtype == 0) // ATTN_DTYPE_F32
        for (int64_t i = 0; i < n; i++) dst[i] = ((const float *)p)[off + i * stride] * scale;
    else
        for (int64_t i = 0; i < n; i++) dst[i] = attn__kv_at(p, dtype, off + i * stride) * scale;
}

// Element off + i * stride of p (dtype F32, F16 or BF16) = scale * src[i * src_stride], i < n.
static inline void attn__scatter(void *p, int dtype, int64_t off, int64_t stride, const float *src, int64_t src_stride,
                                 int64_t n, float scale) {
    if (dtype == 0) { // ATTN_DTYPE_F32
        for (int64_t i = 0; i < n; i++) ((float *)p)[off + i * stride] = src[i * src_stride] * scale;
    } else if (dtype == 3) { // ATTN_DTYPE_BF16: the contiguous case on its own, so that it vectorises
        uint16_t *y = (uint16_t *)p + off;
        if (stride == 1 && src_stride == 1)
            for (int64_t i = 0; i < n; i++) y[i] = attn__f32_to_bf16(src[i] * scale);
        else
            for (int64_t i = 0; i < n; i++) y[i * stride] = attn__f32_to_bf16(src[i * src_stride] * scale);
    } else { // ATTN_DTYPE_F16, the same way
        uint16_t *y = (uint16_t *)p + off;
        if (stride == 1 && src_stride == 1)
            for (int64_t i = 0; i < n; i++) y[i] = attn__f32_to_f16(src[i] * scale);
        else
            for (int64_t i = 0; i < n; i++) y[i * stride] = attn__f32_to_f16(src[i * src_stride] * scale);
    }
}

#endif

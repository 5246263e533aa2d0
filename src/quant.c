// quant.c - quantisation of float rows to Q8_0 and Q4_0 with the rounding of ggml's reference
// quantisers (so a block holds the bytes ggml writes for the same finite input), and the way back.
// Compiled without FMA contraction (-ffp-contract=off, as the whole library): x * (1/d) + 8.5 is
// two float roundings, as in ggml's C.
#include <math.h>
#include <string.h>

#include "half.h"
#include "quant.h"

#define QK ATTN_QBLOCK

attn__quant_bound attn__quant_error(attn_dtype dt) {
    if (dt == ATTN_DTYPE_Q8_0) return (attn__quant_bound){1.0 / 254 + ldexp(1, -11) + ldexp(1, -20), ldexp(1, -18)};
    return (attn__quant_bound){1.0 / 8 + ldexp(1, -10), ldexp(1, -21)};
}

// A block that cannot be represented (a NaN, an infinity, a scale that rounds to inf in half): NaN
// scale, quants of value 0 (`zero` is the byte of a zero quant pair).
static void nan_block(uint8_t *b, int nq, uint8_t zero) {
    b[0] = 0x00, b[1] = 0x7e;
    memset(b + 2, zero, (size_t)nq);
}

static bool finite_block(const float *x) {
    bool ok = true;
    for (int j = 0; j < QK; j++) ok &= isfinite(x[j]) != 0;
    return ok;
}

// Stores d rounded to half in b[0..1]; false when that is not finite.
static bool put_scale(uint8_t *b, float d) {
    const uint16_t h = attn__f32_to_f16(d);
    b[0] = (uint8_t)(h & 0xff), b[1] = (uint8_t)(h >> 8);
    return (h & 0x7c00u) != 0x7c00u;
}

static void q8_0_block(const float *x, uint8_t *b) {
    if (!finite_block(x)) {
        nan_block(b, QK, 0);
        return;
    }
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (!put_scale(b, d)) {
        nan_block(b, QK, 0);
        return;
    }
    for (int j = 0; j < QK; j++) // |x * id| <= 127 (1 + 2^-22): roundf lands in [-127, 127]
        b[2 + j] = isinf(id) ? 0 : (uint8_t)(int8_t)roundf(x[j] * id);
}

static void q4_0_block(const float *x, uint8_t *b) {
    if (!finite_block(x)) {
        nan_block(b, QK / 2, 0x88);
        return;
    }
    float amax = 0.0f, max = 0.0f; // the first value of largest magnitude, with its sign
    for (int j = 0; j < QK; j++)
        if (amax < fabsf(x[j])) amax = fabsf(x[j]), max = x[j];
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (!put_scale(b, d)) {
        nan_block(b, QK / 2, 0x88);
        return;
    }
    for (int j = 0; j < QK / 2; j++) {
        int lo = 8, hi = 8;
        if (!isinf(id)) { // x * id is in [-8, 8] (to rounding): + 8.5 truncates to [0, 16]
            const float x0 = x[j] * id, x1 = x[QK / 2 + j] * id;
            lo = (int)(x0 + 8.5f), hi = (int)(x1 + 8.5f);
            lo = lo < 15 ? lo : 15, hi = hi < 15 ? hi : 15;
        }
        b[2 + j] = (uint8_t)(lo | hi << 4);
    }
}

void attn__quantize(attn_dtype dt, const float *x, void *dst, int64_t n) {
    uint8_t *b = dst;
    const size_t bytes = attn_dtype_size(dt);
    for (int64_t i = 0; i < n; i += QK, b += bytes) {
        if (dt == ATTN_DTYPE_Q8_0)
            q8_0_block(x + i, b);
        else
            q4_0_block(x + i, b);
    }
}

// A block at a time: its scale converted once, q * d (Q8_0) or (n - 8) * d (Q4_0) as
// attn__q8_0_at and attn__q4_0_at give them, in loops a compiler vectorises: the quants widened
// into int32 first, then converted and scaled in one loop over the block (GCC left the two
// half-block loops of Q4_0 scalar, on x86-64 and on AArch64).
void attn__dequantize(attn_dtype dt, const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    const size_t bytes = attn_dtype_size(dt);
    for (int64_t i = 0; i < n; i += QK, b += bytes) {
        const float d = attn__qblock_scale(b);
        float *o = y + i;
        int32_t v[QK];
        if (dt == ATTN_DTYPE_Q8_0)
            for (int t = 0; t < QK; t++) v[t] = (int8_t)b[2 + t];
        else
            for (int t = 0; t < QK / 2; t++) v[t] = (b[2 + t] & 15) - 8, v[t + QK / 2] = (b[2 + t] >> 4) - 8;
        for (int t = 0; t < QK; t++) o[t] = (float)v[t] * d;
    }
}

attn_status attn__check_block_kv(attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh) {
    const char *name = attn_dtype_name(d->kv_dtype);
    if (sh->D % QK != 0 || sh->Dv % QK != 0)
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE,
                          "sdpa: %s k and v need head_dim and head_dim_v multiples of %d, not %lld and %lld", name, QK,
                          (long long)sh->D, (long long)sh->Dv);
    const int64_t nk[3] = {sh->B, sh->Hkv, sh->S}; // extents of k's and v's first three dimensions
    const struct {
        const char *what;
        const int64_t *s;
    } views[2] = {{"k", d->k_stride}, {"v", d->v_stride}};
    for (int t = 0; t < 2; t++) {
        const int64_t *s = views[t].s;
        if (s[3] != 1)
            return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa: %s %s: stride[3] = %lld must be 1 (values in blocks)",
                              name, views[t].what, (long long)s[3]);
        for (int i = 0; i < 3; i++) // a dimension of extent 1 never uses its stride
            if (nk[i] > 1 && s[i] % QK != 0)
                return attn__fail(ctx, ATTN_ERR_INVALID_ARG,
                                  "sdpa: %s %s: stride[%d] = %lld must be a multiple of %d (rows start on a block)", name,
                                  views[t].what, i, (long long)s[i], QK);
    }
    return ATTN_OK;
}

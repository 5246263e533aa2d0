// kv_cache.c - a layer's key/value cache for decoding: storage (B, Hkv, capacity, D|Dv) of F32,
// F16 or BF16, or of the block types Q8_0 and Q4_0 (each row quantised on append, blocks of 32
// along D), append with conversion, truncate/reset, and attend (SDPA of new queries against the
// filled positions, through attn_sdpa_fwd: the fused kernels' decode path serves one query).
#include <string.h>

#include "half.h"
#include "internal.h"
#include "quant.h"

struct attn_kv_cache {
    attn_allocator alloc;
    attn_kv_cache_config cfg; // head_dim_v resolved
    int64_t length;
    void *k, *v;              // (B, Hkv, capacity, D), (B, Hkv, capacity, Dv), contiguous
};

void attn_kv_cache_config_init(attn_kv_cache_config *cfg) {
    if (cfg != NULL) memset(cfg, 0, sizeof *cfg);
}

static attn_status check_config(attn_ctx *ctx, const attn_kv_cache_config *c, attn_kv_cache_config *out) {
    *out = *c;
    if (out->head_dim_v == 0) out->head_dim_v = c->head_dim;
    const struct {
        const char *name;
        int64_t value;
    } sizes[] = {{"batch", c->batch},        {"n_kv_heads", c->n_kv_heads},     {"head_dim", c->head_dim},
                 {"head_dim_v", out->head_dim_v}, {"capacity", c->capacity}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].value < 1)
            return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "kv_cache: %s = %lld must be >= 1", sizes[i].name,
                              (long long)sizes[i].value);
    if (!attn__is_float_dtype(c->dtype) && !attn__is_block_dtype(c->dtype))
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "kv_cache: dtype must be F32, F16, BF16, Q8_0 or Q4_0, not %s",
                          attn_dtype_name(c->dtype));
    if (attn__is_block_dtype(c->dtype) && (c->head_dim % ATTN_QBLOCK != 0 || out->head_dim_v % ATTN_QBLOCK != 0))
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE,
                          "kv_cache: a %s cache needs head_dim and head_dim_v multiples of %d (blocks of %d values), "
                          "not %lld and %lld",
                          attn_dtype_name(c->dtype), ATTN_QBLOCK, ATTN_QBLOCK, (long long)c->head_dim,
                          (long long)out->head_dim_v);
    return ATTN_OK;
}

attn_status attn_kv_cache_create(attn_ctx *ctx, const attn_kv_cache_config *cfg, attn_kv_cache **cache) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (cfg == NULL || cache == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "kv_cache_create: NULL argument");
    *cache = NULL;
    attn_kv_cache_config c;
    ATTN_RETURN_IF_ERR(check_config(ctx, cfg, &c));
    const int64_t kd[4] = {c.batch, c.n_kv_heads, c.capacity, c.head_dim};
    const int64_t vd[4] = {c.batch, c.n_kv_heads, c.capacity, c.head_dim_v};
    int64_t nk, nv;
    size_t kb, vb;
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "kv_cache: keys", 4, kd, &nk));
    ATTN_RETURN_IF_ERR(attn__numel(ctx, "kv_cache: values", 4, vd, &nv));
    const int64_t blk = attn_dtype_block_size(c.dtype); // head_dim and head_dim_v are multiples of it
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "kv_cache: keys", nk / blk, attn_dtype_size(c.dtype), &kb));
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "kv_cache: values", nv / blk, attn_dtype_size(c.dtype), &vb));
    attn_kv_cache *kc;
    ATTN_RETURN_IF_ERR(attn__alloc(ctx, sizeof *kc, (void **)&kc));
    memset(kc, 0, sizeof *kc);
    kc->alloc = ctx->alloc, kc->cfg = c;
    attn_status st = attn__alloc_large(ctx, kb, &kc->k);
    if (st == ATTN_OK) st = attn__alloc_large(ctx, vb, &kc->v);
    if (st != ATTN_OK) {
        attn_kv_cache_free(kc);
        return st;
    }
    *cache = kc;
    return ATTN_OK;
}

void attn_kv_cache_free(attn_kv_cache *cache) {
    if (cache == NULL) return;
    attn_allocator a = cache->alloc;
    attn__free_with(&a, cache->k);
    attn__free_with(&a, cache->v);
    attn__free_with(&a, cache);
}

const attn_kv_cache_config *attn_kv_cache_get_config(const attn_kv_cache *cache) {
    return cache != NULL ? &cache->cfg : NULL;
}

int64_t attn_kv_cache_length(const attn_kv_cache *cache) { return cache != NULL ? cache->length : 0; }

static void strides_of(const attn_kv_cache_config *c, int64_t n, int64_t ks[4], int64_t vs[4]) {
    const int64_t k[4] = {c->n_kv_heads * n * c->head_dim, n * c->head_dim, c->head_dim, 1};
    const int64_t v[4] = {c->n_kv_heads * n * c->head_dim_v, n * c->head_dim_v, c->head_dim_v, 1};
    memcpy(ks, k, sizeof k);
    memcpy(vs, v, sizeof v);
}

void attn_kv_cache_storage(attn_kv_cache *cache, void **k, int64_t k_stride[4], void **v, int64_t v_stride[4]) {
    if (cache == NULL) return;
    int64_t ks[4], vs[4];
    strides_of(&cache->cfg, cache->cfg.capacity, ks, vs);
    if (k != NULL) *k = cache->k;
    if (v != NULL) *v = cache->v;
    if (k_stride != NULL) memcpy(k_stride, ks, sizeof ks);
    if (v_stride != NULL) memcpy(v_stride, vs, sizeof vs);
}

// Rows (B, Hkv, n) of width w from src (at stride s) into dst (B, Hkv, capacity, w) from position
// `at`, converted to dt (block types: quantised block by block; halves of contiguous rows by the
// context's vector conversion).
static void copy_rows(const attn_ctx *ctx, const attn_kv_cache_config *c, attn_dtype dt, int64_t at, int64_t n,
                      int64_t w, const float *src, const int64_t s[4], void *dst) {
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t h = 0; h < c->n_kv_heads; h++)
            for (int64_t i = 0; i < n; i++) {
                const float *r = src + attn__offset4(s, b, h, i, 0);
                const int64_t o = ((b * c->n_kv_heads + h) * c->capacity + at + i) * w;
                if (attn__is_block_dtype(dt)) {
                    for (int64_t e0 = 0; e0 < w; e0 += ATTN_QBLOCK) {
                        float block[ATTN_QBLOCK]; // the strided row's block, contiguous
                        for (int e = 0; e < ATTN_QBLOCK; e++) block[e] = r[(e0 + e) * s[3]];
                        attn__quantize(dt, block, (char *)dst + attn__kv_bytes(dt, o + e0), ATTN_QBLOCK);
                    }
                } else if (dt == ATTN_DTYPE_F32) {
                    float *d = (float *)dst + o;
                    for (int64_t e = 0; e < w; e++) d[e] = r[e * s[3]];
                } else if (s[3] == 1) {
                    attn__from_f32(ctx, dt, r, (uint16_t *)dst + o, w);
                } else {
                    uint16_t *d = (uint16_t *)dst + o;
                    for (int64_t e = 0; e < w; e++) attn__elem_set(d, dt, e, r[e * s[3]]);
                }
            }
}

static attn_status check_strides(attn_ctx *ctx, const char *what, const int64_t n[4], const int64_t s[4]) {
    for (int i = 0; i < 4; i++)
        if (s[i] < 0)
            return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "kv_cache_append: %s stride[%d] = %lld is negative", what, i,
                              (long long)s[i]);
    int64_t extent;
    if (!attn__view_extent(n, s, &extent))
        return attn__fail(ctx, ATTN_ERR_OVERFLOW, "kv_cache_append: the offsets of %s overflow", what);
    return ATTN_OK;
}

attn_status attn_kv_cache_append(attn_ctx *ctx, attn_kv_cache *cache, int64_t n, const float *k,
                                 const int64_t k_stride[4], const float *v, const int64_t v_stride[4]) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (cache == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "kv_cache_append: cache is NULL");
    if (n < 0) return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "kv_cache_append: n = %lld is negative", (long long)n);
    if (n == 0) return ATTN_OK;
    if (k == NULL || v == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "kv_cache_append: k and v must not be NULL");
    const attn_kv_cache_config *c = &cache->cfg;
    if (n > c->capacity - cache->length)
        return attn__fail(ctx, ATTN_ERR_CAPACITY,
                          "kv_cache_append: %lld positions do not fit: %lld of the capacity %lld are used",
                          (long long)n, (long long)cache->length, (long long)c->capacity);
    int64_t ks[4], vs[4];
    strides_of(c, n, ks, vs);
    if (k_stride != NULL) memcpy(ks, k_stride, sizeof ks);
    if (v_stride != NULL) memcpy(vs, v_stride, sizeof vs);
    const int64_t nk[4] = {c->batch, c->n_kv_heads, n, c->head_dim}, nv[4] = {c->batch, c->n_kv_heads, n, c->head_dim_v};
    ATTN_RETURN_IF_ERR(check_strides(ctx, "k", nk, ks));
    ATTN_RETURN_IF_ERR(check_strides(ctx, "v", nv, vs));
    copy_rows(ctx, c, c->dtype, cache->length, n, c->head_dim, k, ks, cache->k);
    copy_rows(ctx, c, c->dtype, cache->length, n, c->head_dim_v, v, vs, cache->v);
    cache->length += n;
    return ATTN_OK;
}

attn_status attn_kv_cache_truncate(attn_ctx *ctx, attn_kv_cache *cache, int64_t length) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (cache == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "kv_cache_truncate: cache is NULL");
    if (length < 0 || length > cache->length)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "kv_cache_truncate: length %lld is not in [0, %lld]",
                          (long long)length, (long long)cache->length);
    cache->length = length;
    return ATTN_OK;
}

void attn_kv_cache_reset(attn_kv_cache *cache) {
    if (cache != NULL) cache->length = 0;
}

attn_status attn_kv_cache_attend(attn_ctx *ctx, const attn_kv_cache *cache, const attn_sdpa_desc *desc,
                                 const void *q, void *out, float *lse) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (cache == NULL || desc == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "kv_cache_attend: cache and desc must not be NULL");
    const attn_kv_cache_config *c = &cache->cfg;
    if (cache->length == 0) return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "kv_cache_attend: the cache is empty");
    if (desc->causal != ATTN_CAUSAL_NONE && desc->causal != ATTN_CAUSAL_BOTTOM_RIGHT)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG,
                          "kv_cache_attend: causal must be ATTN_CAUSAL_BOTTOM_RIGHT or ATTN_CAUSAL_NONE");
    if (desc->dropout_p != 0.0 || desc->weights_mode != ATTN_WEIGHTS_NONE)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "kv_cache_attend: no dropout and no weights output");
    if (desc->batch != c->batch || desc->head_dim != c->head_dim ||
        (desc->head_dim_v != 0 && desc->head_dim_v != c->head_dim_v))
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE,
                          "kv_cache_attend: batch %lld, head_dim %lld, head_dim_v %lld do not match the cache's "
                          "%lld, %lld, %lld",
                          (long long)desc->batch, (long long)desc->head_dim, (long long)desc->head_dim_v,
                          (long long)c->batch, (long long)c->head_dim, (long long)c->head_dim_v);
    attn_sdpa_desc d = *desc;
    d.n_kv_heads = c->n_kv_heads, d.len_kv = cache->length, d.head_dim_v = c->head_dim_v, d.kv_dtype = c->dtype;
    strides_of(c, c->capacity, d.k_stride, d.v_stride);
    return attn_sdpa_fwd(ctx, &d, q, cache->k, cache->v, out, lse, NULL);
}

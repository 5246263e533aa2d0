// flash_masks.c - what the fused forward and backward apply to a transposed score tile st (nj keys
// x nq queries, rows ld apart, log2 domain, scores already times scale*log2 e): the causal and local-window
// bounds (whole tiles outside them are skipped by the callers), soft-capping and ALiBi, attention
// masks (bool or additive) and key padding masks. A hidden score becomes -inf whatever its value,
// so NaN in a key that a query cannot see never reaches that query.
#include <float.h>
#include <math.h>

#include "cpu/cpu.h"
#include "cpu/flash.h"

#define LOG2E 1.4426950408889634

// Key j is visible from query i when lo(i) <= j <= hi(i); these give the bounds (INT64_MIN/MAX
// for an unbounded side).
static int64_t diag_off(const attn_sdpa_desc *d, const attn__sdpa_shape *sh) {
    return d->causal == ATTN_CAUSAL_BOTTOM_RIGHT ? sh->S - sh->L : 0;
}

static int64_t hi_of(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t i) {
    int64_t hi = INT64_MAX;
    if (d->causal != ATTN_CAUSAL_NONE) hi = i + diag_off(d, sh);
    if (d->use_window && d->window_right >= 0 && i + diag_off(d, sh) + d->window_right < hi)
        hi = i + diag_off(d, sh) + d->window_right;
    return hi;
}

static int64_t lo_of(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t i) {
    if (d->use_window && d->window_left >= 0) return i + diag_off(d, sh) - d->window_left;
    return INT64_MIN;
}

int64_t attn__keys_visible_until(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t last_query) {
    const int64_t hi = hi_of(d, sh, last_query); // one past the last key any query up to last_query sees
    const int64_t end = hi >= sh->S ? sh->S : hi + 1;
    return end < 0 ? 0 : end;
}

int64_t attn__keys_visible_from(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t first_query) {
    const int64_t lo = lo_of(d, sh, first_query); // the first key any query from first_query on sees
    return lo <= 0 ? 0 : lo > sh->S ? sh->S : lo;
}

int attn__first_query_seeing(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t i0, int nq, int64_t jj) {
    const int64_t h0 = hi_of(d, sh, 0); // hi(i) = i + h0: both edges it takes the lesser of move with i
    if (h0 == INT64_MAX) return 0;
    const int64_t f = jj - h0 - i0;
    return f <= 0 ? 0 : f >= nq ? nq : (int)f;
}

int attn__last_query_seeing(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t i0, int nq, int64_t jj) {
    if (!d->use_window || d->window_left < 0) return nq;
    const int64_t e = jj - lo_of(d, sh, 0) - i0 + 1; // lo(i) = i + lo(0): the queries i <= jj - lo(0) see jj
    return e <= 0 ? 0 : e >= nq ? nq : (int)e;
}

void attn__tile_keys_seen(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t q0, int n, int64_t j0, int nj,
                          int *lo, int *hi) {
    const int64_t a = attn__keys_visible_from(d, sh, q0) - j0;
    const int64_t b = attn__keys_visible_until(d, sh, q0 + n - 1) - j0;
    *lo = a < 0 ? 0 : a > nj ? nj : (int)a;
    *hi = b < *lo ? *lo : b > nj ? nj : (int)b;
}

void attn__key_group_columns(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t i0, int nq, int w,
                             int64_t first, int64_t last, int *c0, int *c1) {
    const int e = attn__last_query_seeing(d, sh, i0, nq, last);
    *c0 = attn__first_query_seeing(d, sh, i0, nq, first) / 16 * 16;
    *c1 = e == nq ? w : (e + 15) / 16 * 16 < w ? (e + 15) / 16 * 16 : w;
}

void attn__key_rows_product(const attn__kernels *kn, const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t i0,
                            int nq, int64_t j0, int nj, const float *A, int64_t a_rs, int64_t a_cs, int K,
                            const float *B, int w, int64_t ld, float *C) {
    for (int r = 0; r < nj; r += ATTN_TRIM_ROWS) {
        const int rows = nj - r < ATTN_TRIM_ROWS ? nj - r : ATTN_TRIM_ROWS;
        int c0, c1;
        attn__key_group_columns(d, sh, i0, nq, w, j0 + r, j0 + r + rows - 1, &c0, &c1);
        if (c0 >= c1) continue; // no query sees these keys
        kn->gemm(A + (int64_t)r * a_rs, a_rs, a_cs, rows, K, B + c0, ld, c1 - c0, C + (int64_t)r * ld + c0, ld, false);
    }
}

void attn__key_rows_product_bf16(const attn__kernels *kn, const attn_sdpa_desc *d, const attn__sdpa_shape *sh,
                                 int64_t i0, int nq, int64_t j0, int nj, const uint16_t *A, int64_t a_rs, int K2,
                                 const uint16_t *B, int w, float *C, int64_t ld, float scale) {
    for (int r = 0; r < nj; r += ATTN_TRIM_ROWS_BF16) {
        const int rows = nj - r < ATTN_TRIM_ROWS_BF16 ? nj - r : ATTN_TRIM_ROWS_BF16;
        int c0, c1;
        attn__key_group_columns(d, sh, i0, nq, w, j0 + r, j0 + r + rows - 1, &c0, &c1);
        if (c0 >= c1) continue; // no query sees these keys
        kn->gemm_bf16(A + (int64_t)r * a_rs, a_rs, 2, rows, K2, B + 2 * (int64_t)c0, w, c1 - c0,
                      C + (int64_t)r * ld + c0, ld, NULL, scale);
    }
}

void attn__query_rows_product_bf16(const attn__kernels *kn, const attn_sdpa_desc *d, const attn__sdpa_shape *sh,
                                   int64_t i0, int nq, int64_t j0, int nj, const uint16_t *A, int w, const uint16_t *B,
                                   int64_t ldb, int N, float *C, int64_t ldc, const float *rowscale) {
    for (int r = 0; r < nq; r += ATTN_TRIM_ROWS_BF16) {
        const int rows = nq - r < ATTN_TRIM_ROWS_BF16 ? nq - r : ATTN_TRIM_ROWS_BF16;
        int lo, hi;
        attn__tile_keys_seen(d, sh, i0 + r, rows, j0, nj, &lo, &hi);
        if (lo == hi) continue;
        const int p0 = lo / 2, p1 = (hi + 1) / 2;
        kn->gemm_bf16(A + 2 * ((int64_t)p0 * w + r), 2, 2 * (int64_t)w, rows, p1 - p0, B + 2 * (int64_t)p0 * ldb, ldb,
                      N, C + (int64_t)r * ldc, ldc, rowscale + r, 1.0f);
    }
}

void attn__keys_from_queries_bf16(const attn__kernels *kn, const attn_sdpa_desc *d, const attn__sdpa_shape *sh,
                                  int64_t i0, int nq, int64_t j0, int nj, const uint16_t *A, int64_t a_rs,
                                  const uint16_t *B, int64_t ldb, int N, float *C, int64_t ldc, const float *ones) {
    for (int r = 0; r < nj; r += ATTN_TRIM_ROWS_BF16) {
        const int rows = nj - r < ATTN_TRIM_ROWS_BF16 ? nj - r : ATTN_TRIM_ROWS_BF16;
        const int c = attn__first_query_seeing(d, sh, i0, nq, j0 + r);
        const int e = attn__last_query_seeing(d, sh, i0, nq, j0 + r + rows - 1);
        if (c >= e) continue;
        const int p0 = c / 2, p1 = (e + 1) / 2;
        kn->gemm_bf16(A + (int64_t)r * a_rs + 2 * p0, a_rs, 2, rows, p1 - p0, B + 2 * (int64_t)p0 * ldb, ldb, N,
                      C + (int64_t)r * ldc, ldc, ones + r, 1.0f);
    }
}

bool attn__tile_crosses_bounds(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t i0, int nq, int64_t j0,
                               int nj) {
    if (d->causal == ATTN_CAUSAL_NONE && !d->use_window) return false;
    return j0 + nj - 1 > hi_of(d, sh, i0) || j0 < lo_of(d, sh, i0 + nq - 1);
}

bool attn__bounds_tile(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t ld, int64_t i0, int nq, int64_t j0,
                       int nj, float *st) {
    bool any_visible = false;
    // Key jj is seen by the queries i with lo(i) <= jj <= hi(i). lo and hi never decrease with i, so
    // hi(i) >= jj holds on a suffix [first, nq) and lo(i) <= jj on a prefix [0, end); both ends only
    // move up as jj grows, so they are carried from key to key.
    int64_t first = 0, end = 0;
    for (int j = 0; j < nj; j++) {
        const int64_t jj = j0 + j;
        float *s = st + (int64_t)j * ld;
        while (first < nq && hi_of(d, sh, i0 + first) < jj) first++;
        while (end < nq && lo_of(d, sh, i0 + end) <= jj) end++;
        const int64_t last = end > first ? end : first; // visible: [first, last)
        for (int64_t i = 0; i < first; i++) s[i] = -INFINITY;
        for (int64_t i = last; i < nq; i++) s[i] = -INFINITY;
        any_visible = any_visible || first < end;
    }
    return any_visible;
}

static inline float mask_value(const void *mask, attn_dtype dt, int64_t off) {
    if (dt == ATTN_DTYPE_BOOL) return ((const uint8_t *)mask)[off] ? -INFINITY : 0.0f;
    return ((const float *)mask)[off];
}

bool attn__mask_tile(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t ld, int64_t b, int64_t h, int64_t i0,
                     int nq, int64_t j0, int nj, float *st) {
    const bool bounded = d->causal != ATTN_CAUSAL_NONE || d->use_window;
    bool any_visible = false;
    for (int j = 0; j < nj; j++) {
        const int64_t jj = j0 + j;
        float kpm = 0.0f;
        if (d->key_padding_mask != NULL)
            kpm = mask_value(d->key_padding_mask, d->key_padding_mask_dtype,
                             b * d->key_padding_mask_stride[0] + jj * d->key_padding_mask_stride[1]);
        float *s = st + (int64_t)j * ld;
        for (int i = 0; i < nq; i++) {
            const int64_t ii = i0 + i;
            bool hidden = kpm == -INFINITY || (bounded && (jj > hi_of(d, sh, ii) || jj < lo_of(d, sh, ii)));
            double bias = kpm;
            if (!hidden && d->mask != NULL) {
                const float mv = mask_value(d->mask, d->mask_dtype, attn__offset4(d->mask_stride, b, h, ii, jj));
                hidden = mv == -INFINITY;
                bias += mv;
            }
            if (hidden) {
                s[i] = -INFINITY;
            } else {
                // in double, clamped to float's range: a finite mask term past FLT_MAX / log2(e) (about
                // 2.36e38), or a score plus one past FLT_MAX, stays finite (an infinite score would make
                // its row NaN); the row's weights are then the reference's, its lse within +-FLT_MAX ln 2
                if (bias != 0.0) s[i] = attn__clamp_flt((double)s[i] + bias * LOG2E);
                any_visible = true;
            }
        }
    }
    return any_visible;
}

// tanh(z) for n values of a row: an odd polynomial below |z| = 0.3 (relative error < 2e-8), else
// (1 - e) / (1 + e) with e = exp(-2|z|) from the table's exp2 (no cancellation past 0.3).
static void tanh_row(const attn__kernels *kn, const float *z, float *out, int n) {
    float e[64];
    for (int c = 0; c < n; c += 64) {
        const int m = n - c < 64 ? n - c : 64;
        for (int i = 0; i < m; i++) e[i] = -2.0f * (float)LOG2E * fabsf(z[c + i]);
        kn->exp2(e, e, m);
        for (int i = 0; i < m; i++) {
            const float x = z[c + i], x2 = x * x;
            float t;
            if (fabsf(x) < 0.3f)
                t = x * (1.0f + x2 * (-1.0f / 3.0f + x2 * (2.0f / 15.0f + x2 * (-17.0f / 315.0f + x2 * (62.0f / 2835.0f)))));
            else
                t = copysignf((1.0f - e[i]) / (1.0f + e[i]), x);
            out[c + i] = isnan(x) ? x : t;
        }
    }
}

void attn__score_transform(const attn__kernels *kn, const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t ld,
                           int64_t h, int64_t i0, int nq, int64_t j0, int nj, float *st, float *th) {
    if (d->softcap > 0.0f) { // log2 domain: st = C2 tanh(st / C2) with C2 = softcap * log2 e
        // In double, then clamped to float's range: a cap near FLT_MAX (or near 0) must not turn
        // C2 (or 1 / C2) into inf, which would make 0 * inf = NaN of a zero score.
        const float c2 = attn__clamp_flt((double)d->softcap * LOG2E), inv = attn__clamp_flt(1.0 / (double)c2);
        float z[64];
        for (int j = 0; j < nj; j++) {
            float *s = st + (int64_t)j * ld, *t = th + (int64_t)j * ld;
            for (int c = 0; c < nq; c += 64) {
                const int m = nq - c < 64 ? nq - c : 64;
                for (int i = 0; i < m; i++) z[i] = s[c + i] * inv;
                tanh_row(kn, z, t + c, m);
                for (int i = 0; i < m; i++) s[c + i] = c2 * t[c + i];
            }
        }
    }
    if (d->alibi_slopes != NULL) {
        const float slope2 = attn__clamp_flt((double)d->alibi_slopes[h] * LOG2E); // inf * 0 on the diagonal: NaN
        const int64_t off = diag_off(d, sh);
        for (int j = 0; j < nj; j++) {
            float *s = st + (int64_t)j * ld;
            for (int i = 0; i < nq; i++) {
                const int64_t dist = i0 + i + off - (j0 + j);
                s[i] -= slope2 * (float)(dist < 0 ? -dist : dist);
            }
        }
    }
}

/*
 * fuzz_data.h - turns one fuzz input into the values a fuzz target needs: bounded integers, bools,
 * picks from tables, floats and doubles (NaN, infinities, huge and tiny values included, chosen by
 * the input), a seed for a small generator, and raw bytes.
 *
 * As in LLVM's FuzzedDataProvider, numbers are taken from the end of the input and raw bytes from
 * the front, so a mutation of the numbers does not shift the bytes and vice versa. Every function
 * is deterministic, never reads outside [data, data + size), and once the input is used up returns
 * the smallest value it can (0, false, the lower bound, an empty byte run).
 *
 * Also declares LLVMFuzzerTestOneInput, which every target defines and fuzz/replay.c calls.
 */
#ifndef ATTN_FUZZ_DATA_H
#define ATTN_FUZZ_DATA_H

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct fuzz_data {
    const uint8_t *data; /* the bytes not consumed yet */
    size_t size;
} fuzz_data;

static inline void fuzz_data_init(fuzz_data *fd, const uint8_t *data, size_t size) {
    fd->data = data;
    fd->size = data != NULL ? size : 0;
}

static inline size_t fuzz_data_remaining(const fuzz_data *fd) { return fd->size; }

/* An integer in [min, max], built from as few trailing bytes as the width of the range needs. */
static inline uint64_t fuzz_data_u64_range(fuzz_data *fd, uint64_t min, uint64_t max) {
    if (min >= max) return min;
    const uint64_t range = max - min;
    uint64_t result = 0;
    for (unsigned shift = 0; shift < 64 && (range >> shift) != 0 && fd->size > 0; shift += 8) {
        result = (result << 8) | fd->data[fd->size - 1];
        fd->size--;
    }
    if (range != UINT64_MAX) result %= range + 1;
    return min + result;
}

static inline int64_t fuzz_data_i64_range(fuzz_data *fd, int64_t min, int64_t max) {
    if (min >= max) return min;
    const uint64_t r = fuzz_data_u64_range(fd, 0, (uint64_t)max - (uint64_t)min);
    return (int64_t)((uint64_t)min + r);
}

static inline int fuzz_data_int_range(fuzz_data *fd, int min, int max) {
    return (int)fuzz_data_i64_range(fd, min, max);
}

static inline uint8_t fuzz_data_u8(fuzz_data *fd) { return (uint8_t)fuzz_data_u64_range(fd, 0, UINT8_MAX); }
static inline uint32_t fuzz_data_u32(fuzz_data *fd) { return (uint32_t)fuzz_data_u64_range(fd, 0, UINT32_MAX); }
static inline uint64_t fuzz_data_u64(fuzz_data *fd) { return fuzz_data_u64_range(fd, 0, UINT64_MAX); }
static inline bool fuzz_data_bool(fuzz_data *fd) { return (fuzz_data_u8(fd) & 1) != 0; }

/* An index in [0, n) (0 when n is 0). */
static inline size_t fuzz_data_pick(fuzz_data *fd, size_t n) {
    return n == 0 ? 0 : (size_t)fuzz_data_u64_range(fd, 0, (uint64_t)n - 1);
}

/* True with probability about num/den (num <= den, den in 1..256); false once the input is used up. */
static inline bool fuzz_data_chance(fuzz_data *fd, unsigned num, unsigned den) {
    return num > 0 && (unsigned)fuzz_data_u64_range(fd, 0, den - 1) >= den - num;
}

/* A double in [0, 1] from four bytes. */
static inline double fuzz_data_unit(fuzz_data *fd) { return (double)fuzz_data_u32(fd) / (double)UINT32_MAX; }

/* A float in [lo, hi] (finite bounds, lo <= hi). */
static inline float fuzz_data_float_range(fuzz_data *fd, float lo, float hi) {
    return (float)((double)lo + ((double)hi - (double)lo) * fuzz_data_unit(fd));
}

/*
 * A float that is usually ordinary and sometimes special: NaN, +-inf, +-FLT_MAX, the smallest
 * normal and subnormal numbers, +-0, +-1e30, or any bit pattern.
 */
static inline float fuzz_data_float_special(fuzz_data *fd) {
    const unsigned sel = fuzz_data_u8(fd);
    switch (sel % 16) {
    case 0: return NAN;
    case 1: return INFINITY;
    case 2: return -INFINITY;
    case 3: return FLT_MAX;
    case 4: return -FLT_MAX;
    case 5: return FLT_MIN;
    case 6: return FLT_TRUE_MIN;
    case 7: return -0.0f;
    case 8: return 0.0f;
    case 9: return sel < 128 ? 1e30f : -1e30f;
    case 10: {
        uint32_t bits = fuzz_data_u32(fd);
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    default: return fuzz_data_float_range(fd, -8.0f, 8.0f);
    }
}

/*
 * A double, usually in [lo, hi] (finite bounds), sometimes special: NaN, +-inf, +-DBL_MAX, -0,
 * the bounds themselves, just outside them, or any bit pattern.
 */
static inline double fuzz_data_double_special(fuzz_data *fd, double lo, double hi) {
    const unsigned sel = fuzz_data_u8(fd);
    switch (sel % 16) {
    case 0: return NAN;
    case 1: return INFINITY;
    case 2: return -INFINITY;
    case 3: return sel < 128 ? DBL_MAX : -DBL_MAX;
    case 4: return -0.0;
    case 5: return lo;
    case 6: return hi;
    case 7: return nextafter(lo, -INFINITY);
    case 8: return nextafter(hi, INFINITY);
    case 9: {
        uint64_t bits = fuzz_data_u64(fd);
        double d;
        memcpy(&d, &bits, sizeof d);
        return d;
    }
    default: return lo + (hi - lo) * fuzz_data_unit(fd);
    }
}

/*
 * An int64 that breaks careless size arithmetic: 0, -1, -2, INT64_MIN, INT64_MAX, powers of two
 * around 2^31, 2^32, 2^40 and 2^62, a square root or cube root of 2^63 (products of two or three
 * of them just overflow), or any 64-bit value.
 */
static inline int64_t fuzz_data_i64_edge(fuzz_data *fd) {
    static const int64_t edges[] = {0,
                                    -1,
                                    -2,
                                    INT64_MIN,
                                    INT64_MAX,
                                    INT64_MAX / 2 + 1,
                                    (int64_t)INT32_MAX,
                                    (int64_t)INT32_MAX + 1,
                                    (int64_t)UINT32_MAX,
                                    (int64_t)UINT32_MAX + 1,
                                    (int64_t)1 << 40,
                                    (int64_t)1 << 62,
                                    3037000500, /* its square just overflows int64 */
                                    2097152,    /* 2^21: its cube is 2^63 */
                                    1 << 24,
                                    65536};
    const size_t n = sizeof edges / sizeof edges[0];
    const size_t sel = fuzz_data_pick(fd, n + 1);
    return sel < n ? edges[sel] : (int64_t)fuzz_data_u64(fd);
}

/* A size-like int64: in [lo, hi] with probability 1 - num/den, otherwise fuzz_data_i64_edge. */
static inline int64_t fuzz_data_size(fuzz_data *fd, int64_t lo, int64_t hi, unsigned num, unsigned den) {
    if (fuzz_data_chance(fd, num, den)) return fuzz_data_i64_edge(fd);
    return fuzz_data_i64_range(fd, lo, hi);
}

/* Copies up to n bytes from the front into dst and zero-fills the rest; returns the bytes copied. */
static inline size_t fuzz_data_bytes(fuzz_data *fd, void *dst, size_t n) {
    const size_t k = n < fd->size ? n : fd->size;
    if (k > 0) memcpy(dst, fd->data, k);
    if (n > k) memset((uint8_t *)dst + k, 0, n - k);
    fd->data += k;
    fd->size -= k;
    return k;
}

/* Takes the bytes left (pointer into the input; *n may be 0). */
static inline const uint8_t *fuzz_data_rest(fuzz_data *fd, size_t *n) {
    const uint8_t *p = fd->data;
    *n = fd->size;
    fd->data += fd->size;
    fd->size = 0;
    return p;
}

/* ---- a small deterministic generator for bulk values (splitmix64) --------------------------- */

typedef struct fuzz_rng {
    uint64_t state;
} fuzz_rng;

static inline uint64_t fuzz_rng_next(fuzz_rng *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static inline float fuzz_rng_float(fuzz_rng *r, float lo, float hi) {
    const double u = (double)(fuzz_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)((double)lo + ((double)hi - (double)lo) * u);
}

/* Uniform in [0, n) (0 when n is 0). */
static inline uint64_t fuzz_rng_below(fuzz_rng *r, uint64_t n) { return n == 0 ? 0 : fuzz_rng_next(r) % n; }

#endif /* ATTN_FUZZ_DATA_H */

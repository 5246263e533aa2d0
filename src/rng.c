// rng.c - PyTorch's default CPU generator (MT19937 + cached Box-Muller value) and the float32
// transforms built on it: uniform_, normal_, bernoulli_, dropout and the nn module initialisers.
//
// Every function draws the same 32-bit words, in the same order, as the ATen code it names
// (torch 1.13 / 2.x, non-MKL, AVX2 kernel flavour). The build uses -ffp-contract=off, so each
// fused multiply-add below is written with fmaf/fma where the compiled ATen kernel has one, and
// every other operation rounds on its own.
#include <float.h>
#include <math.h>
#include <string.h>

#include "internal.h"

// ---- MT19937 (ATen MT19937RNGEngine.h, at::mt19937) ------------------------------------------

enum { MT_N = 624, MT_M = 397 };
#define MT_MATRIX_A 0x9908b0dfu
#define MT_UMASK 0x80000000u
#define MT_LMASK 0x7fffffffu

static uint32_t mt_twist(uint32_t u, uint32_t v) {
    return (((u & MT_UMASK) | (v & MT_LMASK)) >> 1) ^ ((v & 1u) ? MT_MATRIX_A : 0u);
}

// at::mt19937::next_state()
static void mt_next_state(attn_generator *gen) {
    uint32_t *s = gen->mt;
    int j;
    for (j = 0; j < MT_N - MT_M; j++) s[j] = s[j + MT_M] ^ mt_twist(s[j], s[j + 1]);
    for (; j < MT_N - 1; j++) s[j] = s[j + MT_M - MT_N] ^ mt_twist(s[j], s[j + 1]);
    s[MT_N - 1] = s[MT_M - 1] ^ mt_twist(s[MT_N - 1], s[0]);
    gen->left = MT_N;
    gen->next = 0;
}

// CPUGeneratorImpl::set_current_seed -> at::mt19937(seed): only the low 32 bits are used, and the
// first draw twists (left = 1). The cached normal is dropped (next_double_normal_sample reset).
void attn_generator_seed(attn_generator *gen, uint64_t seed) {
    if (gen == NULL) return;
    gen->mt[0] = (uint32_t)(seed & 0xffffffffu);
    for (uint32_t j = 1; j < MT_N; j++) gen->mt[j] = 1812433253u * (gen->mt[j - 1] ^ (gen->mt[j - 1] >> 30)) + j;
    gen->left = 1;
    gen->next = 0;
    gen->has_normal = 0;
    gen->reserved = 0;
    gen->normal = 0.0;
}

// at::mt19937::operator()(): one tempered output. (The bounds check on `next` only guards
// against a generator that was never seeded; a seeded one never trips it.)
uint32_t attn_generator_random(attn_generator *gen) {
    if (gen == NULL) return 0;
    if (--gen->left <= 0 || gen->next < 0 || gen->next >= MT_N) mt_next_state(gen);
    uint32_t y = gen->mt[gen->next++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

// CPUGeneratorImpl::random64(): make64BitsFrom32Bits(first, second), the first draw is the high word.
uint64_t attn_generator_random64(attn_generator *gen) {
    uint64_t hi = attn_generator_random(gen);
    uint64_t lo = attn_generator_random(gen);
    return (hi << 32) | lo;
}

// ---- unit uniforms (TransformationHelper.h uniform_real) -------------------------------------

// uniform_real_distribution<float>(0, 1): (random() & (2^24 - 1)) * 2^-24, exact in float.
float attn__rand_unit_f32(attn_generator *gen) {
    return (float)(attn_generator_random(gen) & 0xffffffu) * 0x1p-24f;
}

// uniform_real_distribution<double>(0, 1): (random64() & (2^53 - 1)) * 2^-53.
double attn__rand_unit_f64(attn_generator *gen) {
    return (double)(attn_generator_random64(gen) & ((UINT64_C(1) << 53) - 1)) * 0x1p-53;
}

// ---- uniform_ (native/cpu/DistributionTemplates.h uniform_kernel) ----------------------------

// The argument checks of uniform_impl_ (native/DistributionTemplates.h): both bounds within the
// float range (so finite), from <= to, and to - from (in double) at most FLT_MAX.
static bool uniform_bounds_ok(double from, double to) {
    if (!(from >= -FLT_MAX && from <= FLT_MAX && to >= -FLT_MAX && to <= FLT_MAX)) return false;
    return from <= to && to - from <= FLT_MAX;
}

// uniform_kernel: from/to cast to float; per element x * (to - from) + from, which the AVX2
// build compiles to one FMA.
static void uniform_fill(attn_generator *gen, float *out, int64_t n, float from, float to) {
    const float range = to - from;
    for (int64_t i = 0; i < n; i++) out[i] = fmaf(attn__rand_unit_f32(gen), range, from);
}

attn_status attn_rand_uniform(attn_generator *gen, float *out, int64_t n, double from, double to) {
    if (gen == NULL || n < 0 || (out == NULL && n > 0)) return ATTN_ERR_INVALID_ARG;
    if (!uniform_bounds_ok(from, to)) return ATTN_ERR_INVALID_ARG;
    uniform_fill(gen, out, n, (float)from, (float)to);
    return ATTN_OK;
}

// ---- normal_, small path (DistributionsHelper.h normal_distribution<double>) -----------------

// One draw of normal_distribution<double>(mean, std): Box-Muller in double; the sine value is
// cached in the generator and returned by the next call instead of drawing.
static double normal_double(attn_generator *gen, double mean, double std) {
    double z;
    if (gen->has_normal) {
        gen->has_normal = 0;
        z = gen->normal;
    } else {
        const double u1 = attn__rand_unit_f64(gen);
        const double u2 = attn__rand_unit_f64(gen);
        const double r = sqrt(-2.0 * log(1.0 - u2));
        const double theta = 2.0 * 3.14159265358979323846 * u1;
        gen->normal = r * sin(theta);
        gen->has_normal = 1;
        z = r * cos(theta);
    }
    // transformation::normal: z * std + mean, contracted to an FMA in the AVX2 build.
    return fma(z, std, mean);
}

// ---- normal_, 16-wide path (native/cpu/avx_mathfun.h, normal_fill_16_AVX2) --------------------
// Each function below is one lane of the AVX2 code. Constants are double literals rounded to
// float, as avx_mathfun.h's _PS256_CONST tables are.

static float bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

// log256_ps for x in (0, 1] (here x = 1 - u with u in [0, 1), never 0 nor subnormal, so the
// clamping and NaN handling of the original are not needed).
static float log_avx2(float x) {
    static const float SQRTHF = (float)0.707106781186547524;
    static const float P[9] = {(float)7.0376836292E-2, (float)-1.1514610310E-1, (float)1.1676998740E-1,
                               (float)-1.2420140846E-1, (float)1.4249322787E-1, (float)-1.6668057665E-1,
                               (float)2.0000714765E-1,  (float)-2.4999993993E-1, (float)3.3333331174E-1};
    static const float Q1 = (float)-2.12194440e-4;
    static const float Q2 = (float)0.693359375;

    const uint32_t bits = f32_to_bits(x);
    const int32_t exponent = (int32_t)(bits >> 23) - 0x7f;
    const float m = bits_to_f32((bits & ~0x7f800000u) | 0x3f000000u); // mantissa in [0.5, 1)
    float e = (float)exponent + 1.0f;
    const bool below = m < SQRTHF;
    x = m - 1.0f;
    e = e - (below ? 1.0f : 0.0f);
    x = x + (below ? m : 0.0f);
    const float z = x * x;
    float y = P[0];
    for (int i = 1; i < 9; i++) y = fmaf(y, x, P[i]);
    y = y * x;
    y = fmaf(y, z, e * Q1); // compiled as fma(y, z, e*q1): y*z is the fused product
    y = y - z * 0.5f;       // z*0.5 is exact, so fused or not gives the same value
    x = x + y;
    return fmaf(e, Q2, x);
}

// sincos256_ps for theta >= 0 (here theta = 2*pi*u in [0, 2*pi)).
static void sincos_avx2(float x, float *s, float *c) {
    static const float FOPI = (float)1.27323954473516;
    static const float DP1 = (float)-0.78515625, DP2 = (float)-2.4187564849853515625e-4,
                       DP3 = (float)-3.77489497744594108e-8;
    static const float SIN0 = (float)-1.9515295891E-4, SIN1 = (float)8.3321608736E-3,
                       SIN2 = (float)-1.6666654611E-1;
    static const float COS0 = (float)2.443315711809948E-005, COS1 = (float)-1.388731625493765E-003,
                       COS2 = (float)4.166664568298827E-002;

    // Octant j (even), then x reduced by j*pi/4 in three steps (extended-precision Cody-Waite).
    int32_t j = (int32_t)(x * FOPI); // _mm256_cvttps_epi32 truncates
    j = (j + 1) & ~1;
    const float y = (float)j;
    x = fmaf(y, DP1, x);
    x = fmaf(y, DP2, x);
    x = fmaf(y, DP3, x);
    const float z = x * x;

    // cos polynomial, 0 <= x <= pi/4; compiled as fma(yc, z, -(z*0.5)).
    float yc = fmaf(fmaf(COS0, z, COS1), z, COS2);
    yc = yc * z;
    yc = fmaf(yc, z, -(z * 0.5f));
    yc = yc + 1.0f;
    // sin polynomial.
    float ys = fmaf(fmaf(SIN0, z, SIN1), z, SIN2);
    ys = ys * z;
    ys = fmaf(ys, x, x);

    const bool poly_sin = (j & 2) == 0;
    float sv = poly_sin ? ys : yc;
    float cv = poly_sin ? yc : ys;
    if (j & 4) sv = -sv;
    if (((j - 2) & 4) == 0) cv = -cv;
    *s = sv;
    *c = cv;
}

// normal_fill_16_AVX2: pairs (j, j+8) of 16 uniforms become two normals each.
static void normal_fill_16(float *d, float mean, float std) {
    static const float TWO_PI = (float)(2.0 * 3.14159265358979323846); // _mm256_set1_ps(2.0f * pi<double>)
    for (int j = 0; j < 8; j++) {
        const float u1 = 1.0f - d[j];
        const float u2 = d[j + 8];
        const float radius = sqrtf(-2.0f * log_avx2(u1));
        const float theta = TWO_PI * u2;
        float s, c;
        sincos_avx2(theta, &s, &c);
        d[j] = fmaf(radius * c, std, mean); // _mm256_fmadd_ps(n1, std, mean)
        d[j + 8] = fmaf(radius * s, std, mean);
    }
}

// normal_fill_AVX2: n >= 16 uniforms first, every complete block of 16 transformed in place; if
// n % 16 != 0 the last 16 slots are drawn again and transformed again.
static void normal_fill(attn_generator *gen, float *d, int64_t n, float mean, float std) {
    for (int64_t i = 0; i < n; i++) d[i] = attn__rand_unit_f32(gen);
    for (int64_t i = 0; i + 16 <= n; i += 16) normal_fill_16(d + i, mean, std);
    if (n % 16 != 0) {
        float *tail = d + n - 16;
        for (int i = 0; i < 16; i++) tail[i] = attn__rand_unit_f32(gen);
        normal_fill_16(tail, mean, std);
    }
}

// normal_kernel: contiguous float32 with numel >= 16 takes normal_fill_AVX2 (mean and std cast to
// float), anything smaller the per-element double path.
static void normal_any(attn_generator *gen, float *out, int64_t n, double mean, double std) {
    if (n >= 16) {
        normal_fill(gen, out, n, (float)mean, (float)std);
    } else {
        for (int64_t i = 0; i < n; i++) out[i] = (float)normal_double(gen, mean, std);
    }
}

attn_status attn_rand_normal(attn_generator *gen, float *out, int64_t n, double mean, double std) {
    if (gen == NULL || n < 0 || (out == NULL && n > 0)) return ATTN_ERR_INVALID_ARG;
    if (!isfinite(mean) || !isfinite(std) || !(std >= 0.0)) return ATTN_ERR_INVALID_ARG;
    normal_any(gen, out, n, mean, std);
    return ATTN_OK;
}

// ---- bernoulli_ and dropout (bernoulli_kernel default path; native/Dropout.cpp) --------------

// bernoulli_(p) with a scalar p: one bernoulli_distribution<double> per element, u < p. Draws
// two words per element for every p, 0 and 1 included.
attn_status attn_rand_bernoulli(attn_generator *gen, float *out, int64_t n, double p) {
    if (gen == NULL || n < 0 || (out == NULL && n > 0)) return ATTN_ERR_INVALID_ARG;
    if (!(p >= 0.0 && p <= 1.0)) return ATTN_ERR_INVALID_ARG;
    for (int64_t i = 0; i < n; i++) out[i] = attn__rand_unit_f64(gen) < p ? 1.0f : 0.0f;
    return ATTN_OK;
}

// _dropout_impl: p == 0 returns the input; p == 1 is input * 0 (so -0 for negative inputs);
// otherwise noise = bernoulli_(1 - p) / (1 - p) and y = x * noise, i.e. a kept element is
// x * fl(1 / fl(1 - p)) and a dropped one x * 0.
attn_status attn_rand_dropout(attn_generator *gen, const float *x, float *y, int64_t n, double p) {
    if (gen == NULL || n < 0 || ((x == NULL || y == NULL) && n > 0)) return ATTN_ERR_INVALID_ARG;
    if (!(p >= 0.0 && p <= 1.0)) return ATTN_ERR_INVALID_ARG;
    if (n == 0) return ATTN_OK;
    if (p == 0.0) {
        if (x != y) memmove(y, x, (size_t)n * sizeof *y);
        return ATTN_OK;
    }
    if (p == 1.0) {
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * 0.0f;
        return ATTN_OK;
    }
    const double keep = 1.0 - p;
    const float scale = 1.0f / (float)keep;
    for (int64_t i = 0; i < n; i++) {
        const float noise = attn__dropout_keep(gen, keep) ? scale : 0.0f;
        y[i] = x[i] * noise;
    }
    return ATTN_OK;
}

// ---- module initialisation (torch/nn/init.py, nn.Linear, nn.Embedding) -----------------------

// Sizes of init functions: each >= 1, the element count must fit in int64_t.
static attn_status init_count(int64_t a, int64_t b, int64_t *n) {
    if (a < 1 || b < 1) return ATTN_ERR_BAD_SHAPE;
    if (!attn__mul_i64(a, b, n)) return ATTN_ERR_OVERFLOW;
    return ATTN_OK;
}

// nn.Linear.reset_parameters: kaiming_uniform_(weight, a=sqrt(5)) then, with a bias,
// uniform_(bias, -1/sqrt(fan_in), 1/sqrt(fan_in)). Bounds are Python doubles, as in init.py.
attn_status attn_init_linear(attn_generator *gen, float *weight, float *bias, int64_t in_features,
                             int64_t out_features) {
    if (gen == NULL || weight == NULL) return ATTN_ERR_INVALID_ARG;
    int64_t n;
    ATTN_RETURN_IF_ERR(init_count(out_features, in_features, &n));
    // kaiming_uniform_: gain = calculate_gain('leaky_relu', a) = sqrt(2 / (1 + a**2)),
    // std = gain / sqrt(fan_in), bound = sqrt(3) * std.
    const double a = sqrt(5.0);
    const double gain = sqrt(2.0 / (1.0 + a * a));
    const double w_bound = sqrt(3.0) * (gain / sqrt((double)in_features));
    uniform_fill(gen, weight, n, (float)-w_bound, (float)w_bound);
    if (bias != NULL) {
        const double b_bound = 1.0 / sqrt((double)in_features);
        uniform_fill(gen, bias, out_features, (float)-b_bound, (float)b_bound);
    }
    return ATTN_OK;
}

// xavier_uniform_(gain=1): a = sqrt(3) * sqrt(2 / (fan_in + fan_out)), uniform_(-a, a).
attn_status attn_init_xavier_uniform(attn_generator *gen, float *w, int64_t fan_out, int64_t fan_in) {
    if (gen == NULL || w == NULL) return ATTN_ERR_INVALID_ARG;
    int64_t n, fans;
    ATTN_RETURN_IF_ERR(init_count(fan_out, fan_in, &n));
    if (!attn__add_i64(fan_in, fan_out, &fans)) return ATTN_ERR_OVERFLOW;
    const double bound = sqrt(3.0) * sqrt(2.0 / (double)fans);
    uniform_fill(gen, w, n, (float)-bound, (float)bound);
    return ATTN_OK;
}

// xavier_normal_(gain=1): normal_(0, sqrt(2 / (fan_in + fan_out))) on n elements.
attn_status attn_init_xavier_normal(attn_generator *gen, float *w, int64_t n, int64_t fan_in, int64_t fan_out) {
    if (gen == NULL || w == NULL) return ATTN_ERR_INVALID_ARG;
    int64_t fans;
    if (n < 1 || fan_in < 1 || fan_out < 1) return ATTN_ERR_BAD_SHAPE;
    if (!attn__add_i64(fan_in, fan_out, &fans)) return ATTN_ERR_OVERFLOW;
    normal_any(gen, w, n, 0.0, sqrt(2.0 / (double)fans));
    return ATTN_OK;
}

// nn.Embedding.reset_parameters: normal_(weight) over all rows, then row padding_idx filled with 0.
attn_status attn_init_embedding(attn_generator *gen, float *w, int64_t num, int64_t dim, int64_t padding_idx) {
    if (gen == NULL || w == NULL) return ATTN_ERR_INVALID_ARG;
    int64_t n;
    ATTN_RETURN_IF_ERR(init_count(num, dim, &n));
    if (padding_idx >= num) return ATTN_ERR_INVALID_ARG;
    normal_any(gen, w, n, 0.0, 1.0);
    if (padding_idx >= 0)
        for (int64_t i = 0; i < dim; i++) w[padding_idx * dim + i] = 0.0f;
    return ATTN_OK;
}

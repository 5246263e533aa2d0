// test_rng.c - the PyTorch-compatible generator: every value of golden/rng_fixtures.h (produced by
// torch, see golden/gen_rng_fixtures.py) bit for bit, draw counts, argument checks and properties.
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "golden/rng_fixtures.h"
#include "harness.h"
#include "internal.h"

// ---- running the fixtures ----------------------------------------------------------------------

#define GUARD 4                     // floats past the end of every output buffer
#define GUARD_BITS 0x7fc0dead

static long fixture_values; // expected values compared so far

static uint64_t f64_bits(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

// A buffer of n floats followed by GUARD sentinels (caught if a function writes past n).
static float *guarded_alloc(int64_t n) {
    float *p = malloc((size_t)(n + GUARD) * sizeof *p);
    if (p == NULL) FAIL("out of memory");
    for (int64_t i = 0; i < n + GUARD; i++) {
        uint32_t g = GUARD_BITS;
        memcpy(&p[i], &g, 4);
    }
    return p;
}

static uint64_t fnv1a64(const float *x, int64_t n) { // the hash gen_rng_fixtures.py uses
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (int64_t i = 0; i < n; i++) {
        uint32_t w = harness_f32_bits(x[i]);
        for (int k = 0; k < 4; k++) h = (h ^ ((w >> (8 * k)) & 0xffu)) * UINT64_C(0x100000001b3);
    }
    return h;
}

// Compares got[0..n) with the fixture: value by value at rng_fx_u32[want_off], or, for outputs too
// large to store (want_off < 0), through their hash rng_fx_u64[hash_idx]. Frees got.
static void expect_bits(const rng_fx_case *c, int step, const char *what, float *got, int64_t n, int32_t want_off,
                        int32_t hash_idx) {
    for (int64_t i = n; i < n + GUARD; i++)
        if (harness_f32_bits(got[i]) != GUARD_BITS) {
            free(got);
            FAIL("%s, step %d, %s: wrote past the end (element %lld)", c->name, step, what, (long long)i);
        }
    if (want_off < 0) {
        uint64_t h = fnv1a64(got, n);
        free(got);
        if (hash_idx < 0) FAIL("%s, step %d: the fixture has no expected %s", c->name, step, what);
        if (h != rng_fx_u64[hash_idx])
            FAIL("%s, step %d, %s: the %lld values differ from torch's (hash 0x%016llx, torch 0x%016llx)", c->name, step,
                 what, (long long)n, (unsigned long long)h, (unsigned long long)rng_fx_u64[hash_idx]);
        fixture_values += n;
        return;
    }
    const uint32_t *want = rng_fx_u32 + want_off;
    for (int64_t i = 0; i < n; i++) {
        uint32_t g = harness_f32_bits(got[i]);
        if (g != want[i]) {
            float w, gf = got[i];
            memcpy(&w, &want[i], 4);
            free(got);
            FAIL("%s, step %d, %s[%lld]: got %.9g (0x%08x), torch %.9g (0x%08x)", c->name, step, what, (long long)i,
                 (double)gf, g, (double)w, want[i]);
        }
    }
    fixture_values += n;
    free(got);
}

// Inverse of MT19937's output tempering: the state word that the generator outputs as y.
static uint32_t untemper(uint32_t y) {
    y ^= y >> 18;
    y ^= (y << 15) & 0xefc60000u;
    uint32_t t = y;
    for (int i = 0; i < 5; i++) t = y ^ ((t << 7) & 0x9d2c5680u);
    y = t;
    for (int i = 0; i < 3; i++) t = y ^ (t >> 11);
    return t;
}

static void run_step(const rng_fx_case *c, int si, const rng_fx_step *st, attn_generator *g) {
    float *out, *bias;
    switch (st->op) {
    case RNG_FX_SEED:
        attn_generator_seed(g, (uint64_t)st->i0);
        break;
    case RNG_FX_SET_WORDS:
        // Chosen next outputs, written straight into the state (fields the library treats as private;
        // torch's state was set the same way through set_rng_state).
        if (st->n % 8 != 0 || st->i0 < 2 * st->n + 1 || st->i0 > 624) FAIL("%s: bad SET_WORDS step", c->name);
        for (int64_t i = 0; i < st->n; i++) {
            uint32_t w = untemper(rng_fx_u32[st->input + i]);
            int64_t block = i / 8, j = i % 8;
            g->mt[16 * block + j] = w;
            g->mt[16 * block + 8 + j] = w;
        }
        g->next = 0;
        g->left = (int32_t)st->i0;
        break;
    case RNG_FX_RAW_U32:
        for (int64_t i = 0; i < st->n; i++) {
            uint32_t got = attn_generator_random(g), want = rng_fx_u32[st->want + i];
            if (got != want) FAIL("%s: word %lld: got 0x%08x, torch 0x%08x", c->name, (long long)i, got, want);
        }
        fixture_values += st->n;
        break;
    case RNG_FX_RAND_F64: {
        attn_generator twin = *g; // the same words through random64: 53 low bits, first word high
        for (int64_t i = 0; i < st->n; i++) {
            uint64_t want = rng_fx_u64[st->want64 + i];
            uint64_t got = f64_bits(attn__rand_unit_f64(g));
            uint64_t got64 = f64_bits((double)(attn_generator_random64(&twin) & ((UINT64_C(1) << 53) - 1)) * 0x1p-53);
            if (got != want || got64 != want)
                FAIL("%s: element %lld: got 0x%016llx / random64 0x%016llx, torch 0x%016llx", c->name, (long long)i,
                     (unsigned long long)got, (unsigned long long)got64, (unsigned long long)want);
        }
        fixture_values += st->n;
        break;
    }
    case RNG_FX_UNIFORM:
        out = guarded_alloc(st->n);
        if (attn_rand_uniform(g, out, st->n, st->a, st->b) != ATTN_OK) FAIL("%s: attn_rand_uniform failed", c->name);
        expect_bits(c, si, "uniform", out, st->n, st->want, st->want64);
        break;
    case RNG_FX_NORMAL:
        out = guarded_alloc(st->n);
        if (attn_rand_normal(g, out, st->n, st->a, st->b) != ATTN_OK) FAIL("%s: attn_rand_normal failed", c->name);
        expect_bits(c, si, "normal", out, st->n, st->want, st->want64);
        break;
    case RNG_FX_BERNOULLI:
        out = guarded_alloc(st->n);
        if (attn_rand_bernoulli(g, out, st->n, st->a) != ATTN_OK) FAIL("%s: attn_rand_bernoulli failed", c->name);
        expect_bits(c, si, "bernoulli", out, st->n, st->want, st->want64);
        break;
    case RNG_FX_DROPOUT: {
        // Out of place, then in place (x == y) on a copy of the generator: both must match torch.
        attn_generator twin = *g;
        float *x = guarded_alloc(st->n);
        memcpy(x, rng_fx_u32 + st->input, (size_t)st->n * sizeof *x);
        out = guarded_alloc(st->n);
        attn_status s1 = attn_rand_dropout(g, x, out, st->n, st->a);
        if (s1 != ATTN_OK) FAIL("%s: attn_rand_dropout failed", c->name);
        expect_bits(c, si, "dropout", out, st->n, st->want, st->want64);
        attn_status s2 = attn_rand_dropout(&twin, x, x, st->n, st->a); // x == y
        if (s2 != ATTN_OK) FAIL("%s: in-place dropout failed", c->name);
        expect_bits(c, si, "dropout in place", x, st->n, st->want, st->want64);
        if (memcmp(&twin, g, sizeof twin) != 0) FAIL("%s: in-place dropout drew differently", c->name);
        break;
    }
    case RNG_FX_LINEAR:
        out = guarded_alloc(st->n);
        bias = st->i2 ? guarded_alloc(st->i1) : NULL;
        if (attn_init_linear(g, out, bias, st->i0, st->i1) != ATTN_OK) FAIL("%s: attn_init_linear failed", c->name);
        expect_bits(c, si, "weight", out, st->n, st->want, st->want64);
        // want2: the bias values, or with a hashed weight (want < 0) the bias's hash.
        if (bias != NULL && st->want2 >= 0)
            expect_bits(c, si, "bias", bias, st->i1, st->want >= 0 ? st->want2 : -1, st->want2);
        else
            free(bias);
        break;
    case RNG_FX_XAVIER_UNIFORM:
        out = guarded_alloc(st->n);
        if (attn_init_xavier_uniform(g, out, st->i0, st->i1) != ATTN_OK) FAIL("%s: xavier_uniform failed", c->name);
        expect_bits(c, si, "xavier_uniform", out, st->n, st->want, st->want64);
        break;
    case RNG_FX_XAVIER_NORMAL:
        out = guarded_alloc(st->n);
        if (attn_init_xavier_normal(g, out, st->n, st->i0, st->i1) != ATTN_OK) FAIL("%s: xavier_normal failed", c->name);
        expect_bits(c, si, "xavier_normal", out, st->n, st->want, st->want64);
        break;
    case RNG_FX_EMBEDDING:
        out = guarded_alloc(st->n);
        if (attn_init_embedding(g, out, st->i0, st->i1, st->i2) != ATTN_OK) FAIL("%s: init_embedding failed", c->name);
        expect_bits(c, si, "embedding", out, st->n, st->want, st->want64);
        break;
    default:
        FAIL("%s: unknown fixture op %d", c->name, st->op);
    }
}

// Runs every fixture case of one kind: seed, steps, then the next four raw words (draw count).
static void run_kind(int kind) {
    int ran = 0;
    long before = fixture_values;
    for (int ci = 0; ci < RNG_FX_N_CASES; ci++) {
        const rng_fx_case *c = &rng_fx_cases[ci];
        if (c->kind != kind) continue;
        attn_generator g;
        attn_generator_seed(&g, c->seed);
        for (int si = 0; si < c->n_steps; si++) run_step(c, si, &rng_fx_steps[c->first_step + si], &g);
        for (int i = 0; i < 4; i++) {
            uint32_t got = attn_generator_random(&g);
            if (got != c->next[i])
                FAIL("%s: next word %d after the call: got 0x%08x, torch 0x%08x (draw count differs)", c->name, i, got,
                     c->next[i]);
        }
        fixture_values += 4;
        harness_checks++;
        ran++;
    }
    ASSERT_TRUE(ran > 0);
    fprintf(stderr, "    %d torch cases, %ld values bit for bit\n", ran, fixture_values - before);
}

static void test_fixture_mt19937(void) { run_kind(RNG_FX_KIND_MT); }
static void test_fixture_rand(void) { run_kind(RNG_FX_KIND_RAND); }
static void test_fixture_uniform(void) { run_kind(RNG_FX_KIND_UNIFORM); }
static void test_fixture_rand_f64(void) { run_kind(RNG_FX_KIND_RAND_F64); }
static void test_fixture_randn(void) { run_kind(RNG_FX_KIND_RANDN); }
static void test_fixture_normal(void) { run_kind(RNG_FX_KIND_NORMAL); }
static void test_fixture_normal_cache(void) { run_kind(RNG_FX_KIND_NORMAL_CACHE); }
static void test_fixture_bernoulli(void) { run_kind(RNG_FX_KIND_BERNOULLI); }
static void test_fixture_dropout(void) { run_kind(RNG_FX_KIND_DROPOUT); }
static void test_fixture_linear(void) { run_kind(RNG_FX_KIND_LINEAR); }
static void test_fixture_mha(void) { run_kind(RNG_FX_KIND_MHA); }
static void test_fixture_embedding(void) { run_kind(RNG_FX_KIND_EMBEDDING); }

// Every case in the table belongs to a kind that one of the tests above runs.
static void test_fixture_table_covered(void) {
    for (int ci = 0; ci < RNG_FX_N_CASES; ci++) {
        ASSERT_TRUE(rng_fx_cases[ci].kind >= RNG_FX_KIND_MT && rng_fx_cases[ci].kind <= RNG_FX_KIND_EMBEDDING);
        ASSERT_TRUE(rng_fx_cases[ci].n_steps >= 1);
    }
    fprintf(stderr, "    fixture table: %d cases, %d expected values\n", RNG_FX_N_CASES, RNG_FX_N_VALUES);
}

// ---- properties ---------------------------------------------------------------------------------

// manual_seed uses only the low 32 bits of the seed.
static void test_seed_low_32_bits(void) {
    attn_generator a, b;
    attn_generator_seed(&a, 5);
    attn_generator_seed(&b, (UINT64_C(1) << 32) + 5);
    ASSERT_TRUE(memcmp(&a, &b, sizeof a) == 0);
    for (int i = 0; i < 1000; i++) ASSERT_EQ_U64(attn_generator_random(&a), attn_generator_random(&b));
    attn_generator_seed(&b, 6);
    ASSERT_TRUE(attn_generator_random(&a) != attn_generator_random(&b));
}

// The reference MT19937 check: the 10000th output of mt19937 seeded with 5489 (C++ std::mt19937).
static void test_mt19937_10000th(void) {
    attn_generator g;
    attn_generator_seed(&g, 5489);
    uint32_t v = 0;
    for (int i = 0; i < 10000; i++) v = attn_generator_random(&g);
    ASSERT_EQ_U64(v, 4123659995u);
}

// random64 is two words, the first one high; the unit uniforms use the documented bits.
static void test_random64_and_units(void) {
    attn_generator a, b;
    attn_generator_seed(&a, 99);
    attn_generator_seed(&b, 99);
    for (int i = 0; i < 50; i++) {
        uint64_t hi = attn_generator_random(&b), lo = attn_generator_random(&b);
        ASSERT_EQ_U64(attn_generator_random64(&a), (hi << 32) | lo);
    }
    for (int i = 0; i < 50; i++) {
        uint32_t r = attn_generator_random(&b);
        float f = attn__rand_unit_f32(&a);
        ASSERT_TRUE(f == (float)(r & 0xffffffu) / 16777216.0f);
        ASSERT_TRUE(f >= 0.0f && f < 1.0f);
    }
    for (int i = 0; i < 50; i++) {
        uint64_t r = attn_generator_random64(&b);
        double d = attn__rand_unit_f64(&a);
        ASSERT_TRUE(d == (double)(r & ((UINT64_C(1) << 53) - 1)) / 9007199254740992.0);
    }
}

// Reseeding clears the cached Box-Muller value; the >= 16 path neither uses nor clears it.
static void test_seed_clears_normal_cache(void) {
    attn_generator g;
    float first, again, big[32];
    attn_generator_seed(&g, 21);
    ASSERT_OK(attn_rand_normal(&g, &first, 1, 0.0, 1.0));
    ASSERT_EQ_INT(g.has_normal, 1);
    double cached = g.normal;
    ASSERT_OK(attn_rand_normal(&g, big, 32, 0.0, 1.0));
    ASSERT_EQ_INT(g.has_normal, 1);
    ASSERT_TRUE(g.normal == cached);
    attn_generator_seed(&g, 21);
    ASSERT_EQ_INT(g.has_normal, 0);
    ASSERT_OK(attn_rand_normal(&g, &again, 1, 0.0, 1.0));
    ASSERT_EQ_U64(harness_f32_bits(again), harness_f32_bits(first));
    // The second small draw takes the cache: no words consumed.
    attn_generator before = g;
    float second;
    ASSERT_OK(attn_rand_normal(&g, &second, 1, 0.0, 1.0));
    ASSERT_TRUE(second == (float)cached);
    ASSERT_EQ_INT(g.next, before.next);
    ASSERT_EQ_INT(g.has_normal, 0);
}

// The AVX2 uniform_ is one fused multiply-add: the fixture of uniform_(-0.37, 0.37) is reproduced
// by fmaf and contradicted by two roundings, so a lost fusion cannot go unnoticed.
static void test_uniform_fixture_needs_fma(void) {
    const rng_fx_case *c = NULL;
    for (int ci = 0; ci < RNG_FX_N_CASES; ci++)
        if (rng_fx_cases[ci].kind == RNG_FX_KIND_UNIFORM && rng_fx_steps[rng_fx_cases[ci].first_step].n >= 200) {
            c = &rng_fx_cases[ci];
            break;
        }
    ASSERT_TRUE(c != NULL);
    const rng_fx_step *st = &rng_fx_steps[c->first_step];
    attn_generator g;
    attn_generator_seed(&g, c->seed);
    const float from = (float)st->a, range = (float)st->b - (float)st->a;
    int unfused_differs = 0;
    for (int64_t i = 0; i < st->n; i++) {
        float x = attn__rand_unit_f32(&g);
        volatile float prod = x * range;
        float two_roundings = prod + from;
        ASSERT_EQ_U64(harness_f32_bits(fmaf(x, range, from)), rng_fx_u32[st->want + i]);
        if (harness_f32_bits(two_roundings) != rng_fx_u32[st->want + i]) unfused_differs++;
    }
    ASSERT_TRUE(unfused_differs > 0);
}

// uniform_ draws one word per element, serially: n at once equals k then n - k.
static void test_uniform_is_serial(void) {
    attn_generator a, b;
    float x[50], y[50];
    attn_generator_seed(&a, 8);
    attn_generator_seed(&b, 8);
    ASSERT_OK(attn_rand_uniform(&a, x, 50, -2.0, 3.0));
    ASSERT_OK(attn_rand_uniform(&b, y, 17, -2.0, 3.0));
    ASSERT_OK(attn_rand_uniform(&b, y + 17, 33, -2.0, 3.0));
    ASSERT_BITS_EQ(x, y, 50);
    for (int i = 0; i < 50; i++) ASSERT_TRUE(x[i] >= -2.0f && x[i] < 3.0f);
    ASSERT_TRUE(memcmp(&a, &b, sizeof a) == 0);
}

// p = 0 and p = 1 dropout draw nothing; p = 1 is x * 0 (signed zeros), p = 0 copies.
static void test_dropout_extremes(void) {
    attn_generator g, before;
    float x[5] = {-1.5f, 2.0f, -0.0f, 3.25f, -7.0f}, y[5];
    attn_generator_seed(&g, 3);
    before = g;
    ASSERT_OK(attn_rand_dropout(&g, x, y, 5, 0.0));
    ASSERT_BITS_EQ(y, x, 5);
    ASSERT_OK(attn_rand_dropout(&g, x, y, 5, 1.0));
    for (int i = 0; i < 5; i++) {
        ASSERT_TRUE(y[i] == 0.0f);
        ASSERT_EQ_INT(signbit(y[i]) != 0, signbit(x[i]) != 0);
    }
    ASSERT_OK(attn_rand_dropout(&g, NULL, NULL, 0, 0.5));
    ASSERT_TRUE(memcmp(&g, &before, sizeof g) == 0);
    // Any other p draws two words per element, kept values are x * fl(1 / fl(1 - p)).
    ASSERT_OK(attn_rand_dropout(&g, x, y, 5, 0.25));
    ASSERT_EQ_INT(g.next - before.next, 10);
    for (int i = 0; i < 5; i++) ASSERT_TRUE(y[i] == 0.0f || y[i] == x[i] * (1.0f / 0.75f));
}

// Bernoulli draws two words per element for every p, 0 and 1 included.
static void test_bernoulli_draws(void) {
    for (int k = 0; k <= 2; k++) {
        double p = k * 0.5;
        attn_generator g;
        float out[7];
        attn_generator_seed(&g, 4);
        ASSERT_OK(attn_rand_bernoulli(&g, out, 7, p));
        ASSERT_EQ_INT(g.next, 14);
        for (int i = 0; i < 7; i++) ASSERT_TRUE(out[i] == 0.0f || out[i] == 1.0f);
        if (k == 0) for (int i = 0; i < 7; i++) ASSERT_TRUE(out[i] == 0.0f);
        if (k == 2) for (int i = 0; i < 7; i++) ASSERT_TRUE(out[i] == 1.0f);
    }
}

// normal_ with n >= 16 draws n words, plus 16 when n % 16 != 0; the small path 4 words per pair.
static void test_normal_draw_counts(void) {
    static float buf[100];
    const struct { int64_t n, words; } want[] = {{16, 16}, {17, 33}, {32, 32}, {33, 49}, {1, 4}, {2, 4}, {3, 8}, {15, 32}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        attn_generator g;
        attn_generator_seed(&g, 17);
        ASSERT_OK(attn_rand_normal(&g, buf, want[i].n, 0.0, 1.0));
        ASSERT_EQ_INT(g.next, want[i].words);
    }
}

// Embedding's padding row is zero; the other rows are the same draws as without padding.
static void test_embedding_padding(void) {
    attn_generator a, b;
    float w[40], v[40];
    attn_generator_seed(&a, 10);
    attn_generator_seed(&b, 10);
    ASSERT_OK(attn_init_embedding(&a, w, 8, 5, 6));
    ASSERT_OK(attn_init_embedding(&b, v, 8, 5, -1));
    for (int i = 0; i < 40; i++) {
        if (i / 5 == 6) ASSERT_EQ_U64(harness_f32_bits(w[i]), 0);
        else ASSERT_EQ_U64(harness_f32_bits(w[i]), harness_f32_bits(v[i]));
    }
}

// ---- argument checks: errors are returned and nothing is drawn -------------------------------------

#define ASSERT_FAILS_CLEANLY(expr, want)                         \
    do {                                                         \
        attn_generator saved_ = g;                               \
        ASSERT_STATUS(expr, want);                               \
        ASSERT_TRUE(memcmp(&saved_, &g, sizeof g) == 0);         \
    } while (0)

static void test_errors_uniform_normal(void) {
    attn_generator g;
    float out[4];
    attn_generator_seed(&g, 1);
    ASSERT_STATUS(attn_rand_uniform(NULL, out, 4, 0, 1), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_uniform(&g, NULL, 4, 0, 1), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_uniform(&g, out, -1, 0, 1), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_uniform(&g, out, 4, NAN, 1), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_uniform(&g, out, 4, 0, INFINITY), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_uniform(&g, out, 4, -INFINITY, 0), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_uniform(&g, out, 4, 5, 2), ATTN_ERR_INVALID_ARG);        // from > to
    ASSERT_FAILS_CLEANLY(attn_rand_uniform(&g, out, 4, -1e39, 0), ATTN_ERR_INVALID_ARG);    // beyond float
    ASSERT_FAILS_CLEANLY(attn_rand_uniform(&g, out, 4, -3e38, 3e38), ATTN_ERR_INVALID_ARG); // to - from
    ASSERT_FAILS_CLEANLY(attn_rand_uniform(&g, NULL, 0, 0, 1), ATTN_OK);
    ASSERT_OK(attn_rand_uniform(&g, out, 4, 1.5, 1.5));
    for (int i = 0; i < 4; i++) ASSERT_TRUE(out[i] == 1.5f);

    ASSERT_STATUS(attn_rand_normal(NULL, out, 4, 0, 1), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_normal(&g, NULL, 4, 0, 1), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_normal(&g, out, -3, 0, 1), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_normal(&g, out, 4, 0, -1), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_normal(&g, out, 4, 0, -0x1p-1074), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_normal(&g, out, 4, 0, NAN), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_normal(&g, out, 4, 0, INFINITY), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_normal(&g, out, 4, NAN, 1), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_normal(&g, out, 4, -INFINITY, 1), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_normal(&g, NULL, 0, 0, 1), ATTN_OK);
    ASSERT_OK(attn_rand_normal(&g, out, 4, 2.0, 0.0));
    for (int i = 0; i < 4; i++) ASSERT_TRUE(out[i] == 2.0f);
}

static void test_errors_bernoulli_dropout(void) {
    attn_generator g;
    float x[4] = {1, 2, 3, 4}, y[4];
    attn_generator_seed(&g, 2);
    ASSERT_STATUS(attn_rand_bernoulli(NULL, y, 4, 0.5), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_bernoulli(&g, NULL, 4, 0.5), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_bernoulli(&g, y, -1, 0.5), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_bernoulli(&g, y, 4, -0.01), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_bernoulli(&g, y, 4, 1.01), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_bernoulli(&g, y, 4, NAN), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_bernoulli(&g, NULL, 0, 0.5), ATTN_OK);

    ASSERT_STATUS(attn_rand_dropout(NULL, x, y, 4, 0.5), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_dropout(&g, NULL, y, 4, 0.5), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_dropout(&g, x, NULL, 4, 0.5), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_dropout(&g, x, y, -4, 0.5), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_dropout(&g, x, y, 4, -0.5), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_dropout(&g, x, y, 4, 1.5), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_rand_dropout(&g, x, y, 4, NAN), ATTN_ERR_INVALID_ARG);
}

static void test_errors_init(void) {
    attn_generator g;
    float w[64], b[8];
    attn_generator_seed(&g, 3);
    ASSERT_STATUS(attn_init_linear(NULL, w, b, 4, 2), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_init_linear(&g, NULL, b, 4, 2), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_init_linear(&g, w, b, 0, 2), ATTN_ERR_BAD_SHAPE);
    ASSERT_FAILS_CLEANLY(attn_init_linear(&g, w, b, 4, -2), ATTN_ERR_BAD_SHAPE);
    ASSERT_FAILS_CLEANLY(attn_init_linear(&g, w, b, INT64_MAX, 2), ATTN_ERR_OVERFLOW);

    ASSERT_STATUS(attn_init_xavier_uniform(NULL, w, 4, 4), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_init_xavier_uniform(&g, NULL, 4, 4), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_init_xavier_uniform(&g, w, 0, 4), ATTN_ERR_BAD_SHAPE);
    ASSERT_FAILS_CLEANLY(attn_init_xavier_uniform(&g, w, 4, -1), ATTN_ERR_BAD_SHAPE);
    ASSERT_FAILS_CLEANLY(attn_init_xavier_uniform(&g, w, INT64_MAX / 2, 3), ATTN_ERR_OVERFLOW);

    ASSERT_STATUS(attn_init_xavier_normal(NULL, w, 4, 4, 4), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_init_xavier_normal(&g, NULL, 4, 4, 4), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_init_xavier_normal(&g, w, 0, 4, 4), ATTN_ERR_BAD_SHAPE);
    ASSERT_FAILS_CLEANLY(attn_init_xavier_normal(&g, w, 4, 0, 4), ATTN_ERR_BAD_SHAPE);
    ASSERT_FAILS_CLEANLY(attn_init_xavier_normal(&g, w, 4, 4, -4), ATTN_ERR_BAD_SHAPE);
    ASSERT_FAILS_CLEANLY(attn_init_xavier_normal(&g, w, 4, INT64_MAX, 1), ATTN_ERR_OVERFLOW);

    ASSERT_STATUS(attn_init_embedding(NULL, w, 4, 4, -1), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_init_embedding(&g, NULL, 4, 4, -1), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_init_embedding(&g, w, 0, 4, -1), ATTN_ERR_BAD_SHAPE);
    ASSERT_FAILS_CLEANLY(attn_init_embedding(&g, w, 4, 0, -1), ATTN_ERR_BAD_SHAPE);
    ASSERT_FAILS_CLEANLY(attn_init_embedding(&g, w, 4, 4, 4), ATTN_ERR_INVALID_ARG);
    ASSERT_FAILS_CLEANLY(attn_init_embedding(&g, w, INT64_MAX, 2, -1), ATTN_ERR_OVERFLOW);

    // NULL generators: no crash, nothing returned.
    attn_generator_seed(NULL, 1);
    ASSERT_EQ_U64(attn_generator_random(NULL), 0);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_fixture_mt19937),        HARNESS_CASE(test_fixture_rand),
        HARNESS_CASE(test_fixture_uniform),        HARNESS_CASE(test_fixture_rand_f64),
        HARNESS_CASE(test_fixture_randn),          HARNESS_CASE(test_fixture_normal),
        HARNESS_CASE(test_fixture_normal_cache),   HARNESS_CASE(test_fixture_bernoulli),
        HARNESS_CASE(test_fixture_dropout),        HARNESS_CASE(test_fixture_linear),
        HARNESS_CASE(test_fixture_mha),            HARNESS_CASE(test_fixture_embedding),
        HARNESS_CASE(test_fixture_table_covered),  HARNESS_CASE(test_seed_low_32_bits),
        HARNESS_CASE(test_mt19937_10000th),        HARNESS_CASE(test_random64_and_units),
        HARNESS_CASE(test_seed_clears_normal_cache), HARNESS_CASE(test_uniform_fixture_needs_fma),
        HARNESS_CASE(test_uniform_is_serial),      HARNESS_CASE(test_dropout_extremes),
        HARNESS_CASE(test_bernoulli_draws),        HARNESS_CASE(test_normal_draw_counts),
        HARNESS_CASE(test_embedding_padding),      HARNESS_CASE(test_errors_uniform_normal),
        HARNESS_CASE(test_errors_bernoulli_dropout), HARNESS_CASE(test_errors_init),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

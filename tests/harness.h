// harness.h - a minimal test harness: each test file lists its cases and calls harness_main().
//
//   static void test_something(void) { ASSERT_EQ_INT(f(2), 4); }
//   int main(int argc, char **argv) {
//       static const harness_case cases[] = {HARNESS_CASE(test_something)};
//       return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
//   }
//
// `prog` runs every case, `prog NAME` one case, `prog --list` prints the names. A failed ASSERT
// prints file:line, both values, and ends the current case (longjmp); the process exits 1 if any
// case failed, 77 (CTest's skip code) if every case skipped.
#ifndef ATTN_TEST_HARNESS_H
#define ATTN_TEST_HARNESS_H

#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct harness_case {
    const char *name;
    void (*fn)(void);
} harness_case;

#define HARNESS_CASE(fn) {#fn, fn}
#define HARNESS_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static jmp_buf harness_jmp;
static int harness_failed_case;
static int harness_skipped_case;
static long harness_checks;

static void harness_fail_here(const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#include <stdarg.h>
static void harness_fail_here(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "    FAIL %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    harness_failed_case = 1;
    longjmp(harness_jmp, 1);
}

#define FAIL(...) harness_fail_here(__FILE__, __LINE__, __VA_ARGS__)

// Ends the current case as skipped (with a visible reason).
#define SKIP(...)                              \
    do {                                       \
        fprintf(stderr, "    SKIP: ");         \
        fprintf(stderr, __VA_ARGS__);          \
        fputc('\n', stderr);                   \
        harness_skipped_case = 1;              \
        longjmp(harness_jmp, 1);               \
    } while (0)

#define ASSERT_TRUE(c)                                        \
    do {                                                      \
        harness_checks++;                                     \
        if (!(c)) FAIL("expected true: %s", #c);              \
    } while (0)

#define ASSERT_EQ_INT(a, b)                                                                      \
    do {                                                                                         \
        long long harness_a_ = (long long)(a), harness_b_ = (long long)(b);                      \
        harness_checks++;                                                                        \
        if (harness_a_ != harness_b_) FAIL("%s == %s: %lld != %lld", #a, #b, harness_a_, harness_b_); \
    } while (0)

#define ASSERT_EQ_U64(a, b)                                                                                   \
    do {                                                                                                      \
        uint64_t harness_a_ = (uint64_t)(a), harness_b_ = (uint64_t)(b);                                      \
        harness_checks++;                                                                                     \
        if (harness_a_ != harness_b_)                                                                         \
            FAIL("%s == %s: 0x%016" PRIx64 " != 0x%016" PRIx64, #a, #b, harness_a_, harness_b_);              \
    } while (0)

// Status comparison that prints the names of both statuses.
#define ASSERT_STATUS(expr, want)                                                                     \
    do {                                                                                              \
        attn_status harness_s_ = (expr);                                                              \
        harness_checks++;                                                                             \
        if (harness_s_ != (want))                                                                     \
            FAIL("%s returned %d (%s), expected %d (%s)", #expr, (int)harness_s_, attn_strerror(harness_s_), \
                 (int)(want), attn_strerror(want));                                                   \
    } while (0)

#define ASSERT_OK(expr) ASSERT_STATUS(expr, ATTN_OK)

static inline uint32_t harness_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

// Every element: |got - want| <= atol + rtol * |want|; NaN only matches NaN. Reports the largest
// absolute and relative errors and the first bad index.
static inline void harness_assert_close(const char *file, int line, const char *what, const float *got,
                                        const float *want, int64_t n, double atol, double rtol) {
    double max_abs = 0, max_rel = 0;
    int64_t first_bad = -1;
    harness_checks++;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        int bad;
        if (isnan(w) || isnan(g)) {
            bad = !(isnan(w) && isnan(g));
        } else if (isinf(w) || isinf(g)) {
            bad = g != w;
        } else {
            double d = fabs(g - w);
            if (d > max_abs) max_abs = d;
            if (w != 0 && d / fabs(w) > max_rel) max_rel = d / fabs(w);
            bad = d > atol + rtol * fabs(w);
        }
        if (bad && first_bad < 0) first_bad = i;
    }
    if (first_bad >= 0)
        harness_fail_here(file, line, "%s: %lld elements, first bad [%lld] got %.9g want %.9g; max abs err %.3g, max rel err %.3g (atol %g rtol %g)",
                          what, (long long)n, (long long)first_bad, (double)got[first_bad], (double)want[first_bad],
                          max_abs, max_rel, atol, rtol);
}

#define ASSERT_CLOSE(got, want, n, atol, rtol) \
    harness_assert_close(__FILE__, __LINE__, #got " vs " #want, (got), (want), (n), (atol), (rtol))

// Bitwise equality of float arrays.
#define ASSERT_BITS_EQ(got, want, n)                                                                      \
    do {                                                                                                  \
        harness_checks++;                                                                                 \
        for (int64_t harness_i_ = 0; harness_i_ < (int64_t)(n); harness_i_++)                             \
            if (harness_f32_bits((got)[harness_i_]) != harness_f32_bits((want)[harness_i_]))              \
                FAIL("%s vs %s: element %lld differs: %.9g (0x%08x) vs %.9g (0x%08x)", #got, #want,        \
                     (long long)harness_i_, (double)(got)[harness_i_], harness_f32_bits((got)[harness_i_]), \
                     (double)(want)[harness_i_], harness_f32_bits((want)[harness_i_]));                    \
    } while (0)

static int harness_main(int argc, char **argv, const harness_case *cases, int n) {
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; i < n; i++) printf("%s\n", cases[i].name);
        return 0;
    }
    int failed = 0, ran = 0, skipped = 0;
    for (int i = 0; i < n; i++) {
        if (argc > 1 && strcmp(argv[1], cases[i].name) != 0) continue;
        ran++;
        harness_failed_case = 0;
        harness_skipped_case = 0;
        long before = harness_checks;
        if (setjmp(harness_jmp) == 0) cases[i].fn();
        if (harness_failed_case) {
            failed++;
            fprintf(stderr, "FAIL %s\n", cases[i].name);
        } else if (harness_skipped_case) {
            skipped++;
            fprintf(stderr, "SKIP %s\n", cases[i].name);
        } else if (harness_checks == before) {
            failed++;
            fprintf(stderr, "FAIL %s (the case checked nothing)\n", cases[i].name);
        } else {
            fprintf(stderr, "ok   %s (%ld checks)\n", cases[i].name, harness_checks - before);
        }
    }
    if (ran == 0) {
        fprintf(stderr, "no case named %s\n", argc > 1 ? argv[1] : "(none)");
        return 1;
    }
    fprintf(stderr, "%d cases: %d passed, %d failed, %d skipped\n", ran, ran - failed - skipped, failed, skipped);
    if (failed) return 1;
    return skipped == ran ? 77 : 0;
}

#endif

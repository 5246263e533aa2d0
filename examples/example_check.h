// example_check.h - what the examples share: a monotonic clock for their timings and an
// elementwise tolerance check for their comparisons.
#ifndef ATTN_EXAMPLES_CHECK_H
#define ATTN_EXAMPLES_CHECK_H

#include <math.h>
#include <stdint.h>
#include <time.h>

// Seconds on a monotonic clock.
static inline double example_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// The worst of a series of comparisons |got - want| <= atol + rtol |want|.
typedef struct example_errors {
    double max_abs;   // largest |got - want|
    double max_ratio; // largest |got - want| / (atol + rtol |want|): the check passes while <= 1
} example_errors;

// Folds n elements into e; NaN on either side fails the check.
static inline void example_compare(example_errors *e, const float *got, const float *want, int64_t n, double atol,
                                   double rtol) {
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - (double)want[i]);
        const double r = d / (atol + rtol * fabs((double)want[i]));
        if (d > e->max_abs || d != d) e->max_abs = d;
        if (r > e->max_ratio || r != r) e->max_ratio = r;
    }
}

#endif

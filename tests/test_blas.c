// test_blas.c - CBLAS is loaded by the contexts that ask for it (use_blas) and by nothing else: a
// process linking libattn does not load it (nor start its threads) before such a context; one with
// use_blas loads it exactly when attn_has_blas() says it can, and its projections then agree with
// the library's own GEMM; after it is freed, the next such context runs them again. Linux only
// (the loaded objects are read from /proc/self/maps).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "harness.h"
#include "test_data.h"

enum { ROWS = 70, IN = 48, OUT = 40 };

// 1 when a library whose file name holds "blas" (libopenblas.so.0, libcblas.so.3, ...) is mapped
// into this process, 0 when none is, -1 when this system cannot tell.
static int blas_mapped(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (f == NULL) return -1;
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        const char *name = strrchr(line, '/');
        found = name != NULL && strncmp(name, "/lib", 4) == 0 && strstr(name, "blas") != NULL;
    }
    fclose(f);
    return found;
}

static attn_ctx *make_ctx(int use_blas) {
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.isa = ATTN_ISA_GENERIC; // CBLAS serves contexts on the portable and AVX2 kernels
    p.use_blas = use_blas;
    attn_ctx *ctx = NULL;
    if (attn_ctx_create(&p, &ctx) != ATTN_OK) FAIL("attn_ctx_create(use_blas %d)", use_blas);
    return ctx;
}

// y (ROWS, OUT) = x W^T + b on ctx.
static void project(attn_ctx *ctx, const float *x, const float *w, const float *b, float *y) {
    if (attn_linear(ctx, x, ROWS, IN, w, ATTN_WEIGHT_OUT_IN, b, OUT, y) != ATTN_OK) FAIL("attn_linear");
}

static void test_loaded_only_when_asked(void) {
    const int at_start = blas_mapped();
    if (at_start < 0) SKIP("no /proc/self/maps: cannot see which libraries are loaded");
    ASSERT_EQ_INT(at_start, 0);
    float *x = malloc(sizeof(float) * ROWS * IN), *w = malloc(sizeof(float) * OUT * IN), b[OUT];
    float *y0 = malloc(sizeof(float) * ROWS * OUT), *y1 = malloc(sizeof(float) * ROWS * OUT);
    uint32_t seed = 5;
    for (int i = 0; i < ROWS * IN; i++) x[i] = rand_sym(&seed);
    for (int i = 0; i < OUT * IN; i++) w[i] = rand_sym(&seed);
    for (int i = 0; i < OUT; i++) b[i] = rand_sym(&seed);

    attn_ctx *own = make_ctx(0);
    project(own, x, w, b, y0);
    ASSERT_EQ_INT(blas_mapped(), 0); // a context without use_blas loads nothing
    for (int round = 0; round < 2; round++) { // the second context after the first is freed
        attn_ctx *blas = make_ctx(1);
        const int loaded = blas_mapped();
        ASSERT_EQ_INT(loaded, attn_has_blas());
        memset(y1, 0xff, sizeof(float) * ROWS * OUT); // NaN until written
        project(blas, x, w, b, y1);
        for (int i = 0; i < ROWS * OUT; i++) {
            harness_checks++;
            if (!(fabsf(y1[i] - y0[i]) <= 1e-5f * (1.0f + fabsf(y0[i]))))
                FAIL("round %d: y[%d] = %.9g through CBLAS (loaded: %d), %.9g on the own GEMM", round, i, (double)y1[i],
                     loaded, (double)y0[i]);
        }
        fprintf(stderr, "    round %d: CBLAS %s\n", round, loaded ? "loaded, projections agree" : "not available");
        attn_ctx_free(blas);
    }
    attn_ctx_free(own);
    free(x), free(w), free(y0), free(y1);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_loaded_only_when_asked),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

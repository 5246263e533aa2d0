// test_cuda_wgmma.c - the Hopper forward's building blocks (kernels/wgmma.cuh, through
// wgmma_kernels.cu) against products on the host: the swizzled tile copy, the descriptors of K-major
// and MN-major operands, wgmma with A from shared memory and from registers, and the accumulator
// layout, for bf16 and f16 at head dims 64 and 128. Where one of them is wrong, flash-sm90's results
// are wrong as a whole (cuda_sm90); here each is seen alone. Needs a device of compute capability 9.0
// and a library with sm_90a code (skipped otherwise).
#include "harness.h"

#include "cuda_test_util.h"

int attn_test_wgmma(int op, int bf16, int D, const void *a, const void *b, float *out);

// n values in [-1, 1) rounded to type t: their 16-bit form in bits, the rounded floats in x.
static void draw(attn_dtype t, int64_t n, float *x, uint16_t *bits) {
    for (int64_t i = 0; i < n; i++) x[i] = urand();
    ASSERT_OK(attn_convert(t, bits, ATTN_DTYPE_F32, x, n));
    ASSERT_OK(attn_convert(ATTN_DTYPE_F32, x, t, bits, n));
}

// got (rows x cols) against sum_k a[i][k] b[k][j] over K terms (a row-major rows x K; b given by
// b_at(k, j)), within 1e-5 of the sum of the terms' magnitudes: float32 sums of exact products.
static void check(const char *what, const float *got, const float *a, const float *b, int rows, int cols, int K, int b_kmajor) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            double want = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                const double bv = b_kmajor ? b[(int64_t)j * K + k] : b[(int64_t)k * cols + j];
                want += (double)a[(int64_t)i * K + k] * bv, mag += fabs((double)a[(int64_t)i * K + k] * bv);
            }
            const double e = fabs((double)got[i * cols + j] - want);
            if (!(e <= 1e-5 * mag + 1e-30)) FAIL("%s: element (%d, %d) = %g, want %g", what, i, j, got[i * cols + j], want);
        }
}

static void test_products(void) {
    attn_cuda_ctx *ctx = gpu_ctx();
    attn_cuda_device_props props;
    ASSERT_OK(attn_cuda_ctx_device(ctx, &props));
    attn_cuda_ctx_free(ctx);
    if (props.cc_major != 9 || props.cc_minor != 0 || strstr(props.arch_built, "90a") == NULL)
        SKIP("%s has compute capability %d.%d, the library carries %s: no sm_90a code to run", props.name, props.cc_major,
             props.cc_minor, props.arch_built);
    for (int t = 0; t < 2; t++)
        for (int D = 64; D <= 128; D += 64) {
            const attn_dtype dt = t == 0 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
            const int64_t na = 64 * 128, nb = 128 * (int64_t)D; // Q 64 x D or P 64 x 128; K or V 128 x D
            float *a = malloc((size_t)na * sizeof(float)), *b = malloc((size_t)nb * sizeof(float));
            float *got = malloc(64 * 128 * sizeof(float));
            uint16_t *ab = malloc((size_t)na * 2), *bb = malloc((size_t)nb * 2);
            if (!a || !b || !got || !ab || !bb) FAIL("out of memory");
            char what[64];
            for (int op = 0; op < 2; op++) {
                const int64_t n_a = op == 0 ? 64 * (int64_t)D : na, n_out = op == 0 ? 64 * 128 : 64 * (int64_t)D;
                draw(dt, n_a, a, ab);
                draw(dt, nb, b, bb);
                void *da = up(ab, (size_t)n_a * 2), *db = up(bb, (size_t)nb * 2);
                float *dout = up(NULL, (size_t)n_out * sizeof(float));
                cudaMemset(dout, 0xff, (size_t)n_out * sizeof(float)); // NaN until written
                const int err = attn_test_wgmma(op, t == 0, D, da, db, dout);
                if (err != 0) FAIL("%s D=%d op %d: %s", attn_dtype_name(dt), D, op, cudaGetErrorString((cudaError_t)err));
                down(got, dout, (size_t)n_out * sizeof(float));
                snprintf(what, sizeof what, "%s D=%d %s", attn_dtype_name(dt), D, op == 0 ? "Q K^T" : "P V");
                if (op == 0) check(what, got, a, b, 64, 128, D, 1);
                else check(what, got, a, b, 64, D, 128, 0);
                cudaFree(da), cudaFree(db), cudaFree(dout);
            }
            free(a), free(b), free(got), free(ab), free(bb);
        }
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {HARNESS_CASE(test_products)};
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

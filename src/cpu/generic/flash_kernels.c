// flash_kernels.c (generic) - the portable implementations of the flash primitives of cpu.h: plain
// C loops over the tile layouts, written so a compiler can vectorise them for any target, and the
// tile product (gemm, which pv runs on too) in GCC's and Clang's 128-bit vector types. Always
// built; selected with ATTN_ISA_GENERIC and on CPUs without AVX2. Same results as the AVX2 kernels
// up to the order of floating-point sums.
#include <math.h>
#include <string.h>

#include "cpu/cpu.h"
#include "philox.h"
#include "half.h"
#include "quant.h"

// 2^x as 2^n * p(x - n), n = round(x), p the degree-6 polynomial ATTN_EXP2_C1..C6 of cpu.h, fitted
// to 2^f on [-0.5, 0.5] for the smallest relative error. For x in [-126, 128] the relative error is
// below 1.2e-7 (measured: 7.7e-8 evaluated with fused multiply-adds as the SIMD kernels do, 9.6e-8
// with separate multiplies and adds as here; test_kernels checks it). x < -126.5 (including -inf)
// gives exactly 0; x > 128 gives +inf; NaN gives NaN.

// Written with selects instead of branches, so that loops of it vectorise: the clamped argument
// (NaN read as 0 for the integer part) rounded to nearest even by adding and subtracting 1.5 * 2^23
// (exact for |x| <= 2^22; the same as rintf), then infinity above 128 and NaN put back. Gives the
// same bits as the branching form for every float.
static inline float exp2_lanes(float x) {
    float c = x < -127.0f ? -127.0f : x;
    c = c > 128.0f ? 128.0f : c;
    c = c == c ? c : 0.0f;
    const float n = (c + 12582912.0f) - 12582912.0f;
    const float f = c - n; // exact
    float p = ATTN_EXP2_C6;
    p = p * f + ATTN_EXP2_C5;
    p = p * f + ATTN_EXP2_C4;
    p = p * f + ATTN_EXP2_C3;
    p = p * f + ATTN_EXP2_C2;
    p = p * f + ATTN_EXP2_C1;
    p = p * f + 1.0f;
    const int32_t e = (int32_t)n + 127; // 0 .. 255; 0 makes the scale (and the result) zero
    union {
        uint32_t u;
        float f;
    } scale = {.u = (uint32_t)(e < 255 ? e : 254) << 23};
    const float r = p * scale.f, r2 = r * 2.0f; // both computed: selects, not branches
    const float big = e == 255 ? r2 : r, capped = x > 128.0f ? INFINITY : big;
    return x == x ? capped : x;
}

float attn__exp2f(float x) { return exp2_lanes(x); }

static void exp2_generic(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = exp2_lanes(x[i]);
}

// The products a block of GEMM_MR rows and GEMM_NR columns at a time, its sums held in registers
// across the whole k loop instead of a row of C loaded and stored at every k: GCC's and Clang's
// vector types (the target's 128-bit vectors: SSE2, NEON, ...), with a plain loop elsewhere and for
// the edges. Each element still sums its products in k order from its start value (a multiply, then
// an add), so the results are those of a loop over one element at a time, bit for bit.
#define GEMM_MR 4
#define GEMM_NR 8

static void gemm_edge(const float *A, int64_t a_rs, int64_t a_cs, int mr, int K, const float *B, int64_t ldb, int nr,
                      float *C, int64_t ldc, bool accumulate) {
    for (int r = 0; r < mr; r++) {
        float *c = C + (int64_t)r * ldc;
        if (!accumulate)
            for (int n = 0; n < nr; n++) c[n] = 0.0f;
        for (int k = 0; k < K; k++) {
            const float a = A[(int64_t)r * a_rs + (int64_t)k * a_cs];
            const float *b = B + (int64_t)k * ldb;
            for (int n = 0; n < nr; n++) c[n] += a * b[n];
        }
    }
}

#if defined(__GNUC__)
typedef float gemm_vec __attribute__((vector_size(16))); // 4 floats

static inline gemm_vec vec_load(const float *p) {
    gemm_vec v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void gemm_full(const float *A, int64_t a_rs, int64_t a_cs, int K, const float *B, int64_t ldb, float *C,
                      int64_t ldc, bool accumulate) {
    gemm_vec c[GEMM_MR][2];
    for (int r = 0; r < GEMM_MR; r++)
        for (int h = 0; h < 2; h++) c[r][h] = accumulate ? vec_load(C + (int64_t)r * ldc + 4 * h) : (gemm_vec){0};
    for (int k = 0; k < K; k++) {
        const float *b = B + (int64_t)k * ldb;
        const gemm_vec b0 = vec_load(b), b1 = vec_load(b + 4);
        const float *a = A + (int64_t)k * a_cs;
        for (int r = 0; r < GEMM_MR; r++) {
            const float ar = a[(int64_t)r * a_rs];
            c[r][0] += ar * b0;
            c[r][1] += ar * b1;
        }
    }
    for (int r = 0; r < GEMM_MR; r++)
        for (int h = 0; h < 2; h++) memcpy(C + (int64_t)r * ldc + 4 * h, &c[r][h], sizeof(gemm_vec));
}
#else
static void gemm_full(const float *A, int64_t a_rs, int64_t a_cs, int K, const float *B, int64_t ldb, float *C,
                      int64_t ldc, bool accumulate) {
    gemm_edge(A, a_rs, a_cs, GEMM_MR, K, B, ldb, GEMM_NR, C, ldc, accumulate);
}
#endif

static void gemm_generic(const float *A, int64_t a_rs, int64_t a_cs, int M, int K, const float *B, int64_t ldb, int N,
                         float *C, int64_t ldc, bool accumulate) {
    for (int m0 = 0; m0 < M; m0 += GEMM_MR) {
        const int mr = M - m0 < GEMM_MR ? M - m0 : GEMM_MR;
        const float *a = A + (int64_t)m0 * a_rs;
        float *c = C + (int64_t)m0 * ldc;
        int n0 = 0;
        if (mr == GEMM_MR)
            for (; n0 + GEMM_NR <= N; n0 += GEMM_NR) gemm_full(a, a_rs, a_cs, K, B + n0, ldb, c + n0, ldc, accumulate);
        if (n0 < N) gemm_edge(a, a_rs, a_cs, mr, K, B + n0, ldb, N - n0, c + n0, ldc, accumulate);
    }
}

static void bwd_p_generic(float *st, int nj, int br, const float *lse2) {
    for (int j = 0; j < nj; j++)
        for (int i = 0; i < br; i++) {
            const float base = lse2[i] == -INFINITY ? 0.0f : lse2[i], x = st[(int64_t)j * br + i];
            const float e = exp2_lanes(x - base);
            st[(int64_t)j * br + i] = x == -INFINITY ? 0.0f : e; // hidden: 0 whatever lse2 is
        }
}

static void bwd_ds_generic(const float *pt, float *dst, int nj, int br, const float *rowdot) {
    for (int j = 0; j < nj; j++)
        for (int i = 0; i < br; i++) {
            const int64_t e = (int64_t)j * br + i;
            dst[e] = pt[e] == 0.0f ? 0.0f : pt[e] * (dst[e] - rowdot[i]); // nothing through zero weights
        }
}

// The rows' columns a chunk at a time, keys outer and columns inner, so that the 2^x and the sums run
// along contiguous columns (the same operations in the same order per column as one column at a
// time). The running max ignores NaN scores as fmaxf does.
#define SOFTMAX_COLS 64
static void softmax_generic(float *st, int nj, int br, int64_t ld, float *m, float *l, float *alpha) {
    for (int i0 = 0; i0 < br; i0 += SOFTMAX_COLS) {
        const int nc = br - i0 < SOFTMAX_COLS ? br - i0 : SOFTMAX_COLS;
        float mx[SOFTMAX_COLS], base[SOFTMAX_COLS], sum[SOFTMAX_COLS];
        for (int i = 0; i < nc; i++) mx[i] = m[i0 + i];
        for (int j = 0; j < nj; j++) {
            const float *row = st + (int64_t)j * ld + i0;
            for (int i = 0; i < nc; i++) mx[i] = row[i] > mx[i] || mx[i] != mx[i] ? row[i] : mx[i];
        }
        for (int i = 0; i < nc; i++) {
            base[i] = mx[i] == -INFINITY ? 0.0f : mx[i]; // a column with nothing visible yet
            alpha[i0 + i] = exp2_lanes(m[i0 + i] - base[i]);
            sum[i] = 0.0f;
        }
        for (int j = 0; j < nj; j++) {
            float *row = st + (int64_t)j * ld + i0;
            for (int i = 0; i < nc; i++) {
                const float e = exp2_lanes(row[i] - base[i]);
                row[i] = e;
                sum[i] += e;
            }
        }
        for (int i = 0; i < nc; i++) l[i0 + i] = alpha[i0 + i] * l[i0 + i] + sum[i], m[i0 + i] = mx[i];
    }
}

// ot = alpha ot + V^T st: the columns of ot scaled, then the product, V read as the transposed A.
static void pv_generic(const float *v, int64_t vs_row, int64_t vs_d, int nj, int Dv, const float *st, int br,
                       int64_t ld, const float *alpha, float *ot) {
    for (int d = 0; d < Dv; d++)
        for (int i = 0; i < br; i++) ot[(int64_t)d * ld + i] *= alpha[i];
    gemm_generic(v, vs_d, vs_row, Dv, nj, st, ld, br, ot, ld, true);
}

#define ROW_CHUNK 256 // values of a key or value row the decode row kernels convert at a time (a multiple of 32)
#define PARTS 8       // partial sums of a dot product: independent lanes a compiler can vectorise

static void half_to_f32_generic(attn_dtype dt, const uint16_t *x, float *y, int64_t n) {
    if (dt == ATTN_DTYPE_F16)
        for (int64_t i = 0; i < n; i++) y[i] = attn__f16_to_f32(x[i]);
    else
        for (int64_t i = 0; i < n; i++) y[i] = attn__bf16_to_f32(x[i]);
}

static void f32_to_half_generic(attn_dtype dt, const float *x, uint16_t *y, int64_t n) {
    if (dt == ATTN_DTYPE_F16)
        for (int64_t i = 0; i < n; i++) y[i] = attn__f32_to_f16(x[i]);
    else
        for (int64_t i = 0; i < n; i++) y[i] = attn__f32_to_bf16(x[i]);
}

// Values [off, off + n) of a row of dtype dt as floats, each converted once for all the query rows:
// in place for F32, else into buf (the block types: off and n multiples of 32, attn__dequantize).
static const float *row_chunk(attn_dtype dt, const void *p, int64_t off, int n, float *buf) {
    if (dt == ATTN_DTYPE_F32) return (const float *)p + off;
    if (dt == ATTN_DTYPE_Q8_0 || dt == ATTN_DTYPE_Q4_0)
        attn__dequantize(dt, (const uint8_t *)p + off / ATTN_QBLOCK * attn_dtype_size(dt), buf, n);
    else
        half_to_f32_generic(dt, (const uint16_t *)p + off, buf, n);
    return buf;
}

// part[r][i] += the products q[r ldq + d] kf[d] of d = i (mod PARTS) in order, for nr rows and
// d < n. Four rows at a time in vector registers (eight accumulators: the sums of one row alone
// would wait on each other's latency), the same sums in the same order as one row at a time.
static void dot_rows(const float *q, int64_t ldq, int nr, const float *kf, int n, float part[][PARTS]) {
    int r = 0;
#if defined(__GNUC__)
    _Static_assert(PARTS == 8, "two vectors of four partial sums a row");
    for (; r + 4 <= nr; r += 4) {
        gemm_vec a[4][2];
        for (int x = 0; x < 4; x++) a[x][0] = vec_load(part[r + x]), a[x][1] = vec_load(part[r + x] + 4);
        int d = 0;
        for (; d + PARTS <= n; d += PARTS) {
            const gemm_vec k0 = vec_load(kf + d), k1 = vec_load(kf + d + 4);
            for (int x = 0; x < 4; x++) {
                const float *qr = q + (int64_t)(r + x) * ldq + d;
                a[x][0] += vec_load(qr) * k0;
                a[x][1] += vec_load(qr + 4) * k1;
            }
        }
        for (int x = 0; x < 4; x++) {
            memcpy(part[r + x], &a[x][0], sizeof(gemm_vec)), memcpy(part[r + x] + 4, &a[x][1], sizeof(gemm_vec));
            for (int e = d; e < n; e++) part[r + x][e % PARTS] += q[(int64_t)(r + x) * ldq + e] * kf[e];
        }
    }
#endif
    for (; r < nr; r++) {
        const float *qr = q + (int64_t)r * ldq;
        float a[PARTS]; // in registers across the loop
        for (int i = 0; i < PARTS; i++) a[i] = part[r][i];
        int d = 0;
        for (; d + PARTS <= n; d += PARTS)
            for (int i = 0; i < PARTS; i++) a[i] += qr[d + i] * kf[d + i];
        for (; d < n; d++) a[d % PARTS] += qr[d] * kf[d];
        for (int i = 0; i < PARTS; i++) part[r][i] = a[i];
    }
}

// s[r s_r + j s_j] = q row r . key row j: each key row converted once (float32 read in place), the
// products summed in PARTS lanes (dot_rows), then the lanes in order.
static void qk_rows_generic(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const float *q, int rows,
                            float *s, int64_t s_r, int64_t s_j) {
    float buf[ROW_CHUNK];
    for (int j = 0; j < nj; j++)
        for (int r0 = 0; r0 < rows; r0 += 8) {
            const int nr = rows - r0 < 8 ? rows - r0 : 8;
            float part[8][PARTS] = {{0}};
            for (int c0 = 0; c0 < D; c0 += ROW_CHUNK) {
                const int n = D - c0 < ROW_CHUNK ? D - c0 : ROW_CHUNK;
                dot_rows(q + (int64_t)r0 * D + c0, D, nr, row_chunk(dt, k, (int64_t)j * ks_row + c0, n, buf), n, part);
            }
            for (int r = 0; r < nr; r++) {
                float acc = 0.0f;
                for (int i = 0; i < PARTS; i++) acc += part[r][i];
                s[(int64_t)(r0 + r) * s_r + (int64_t)j * s_j] = acc;
            }
        }
}

static void qk_rows_q_generic(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const void *q, int rows,
                              float *s, int64_t s_r, int64_t s_j) {
    qk_rows_generic(dt, k, ks_row, nj, D, q, rows, s, s_r, s_j);
}

// o row r = alpha[r] o row r + sum_j pt[j ldp + r] v row j on the tile product (pt as the
// transposed A): float32 rows read in place, other types PV_GROUP rows at a time converted once
// into a buffer. Each element sums its keys in order, as one key at a time would.
#define PV_GROUP 8
static void pv_rows_generic(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt,
                            int64_t ldp, const float *alpha, int rows, float *o, int64_t ldo) {
    for (int r = 0; r < rows; r++) {
        float *orow = o + (int64_t)r * ldo;
        for (int e = 0; e < Dv; e++) orow[e] *= alpha[r];
    }
    if (dt == ATTN_DTYPE_F32) {
        gemm_generic(pt, 1, ldp, rows, nj, (const float *)v, vs_row, Dv, o, ldo, true);
        return;
    }
    float buf[PV_GROUP][ROW_CHUNK];
    for (int j0 = 0; j0 < nj; j0 += PV_GROUP) {
        const int kg = nj - j0 < PV_GROUP ? nj - j0 : PV_GROUP;
        for (int c0 = 0; c0 < Dv; c0 += ROW_CHUNK) {
            const int n = Dv - c0 < ROW_CHUNK ? Dv - c0 : ROW_CHUNK;
            for (int j = 0; j < kg; j++) (void)row_chunk(dt, v, (int64_t)(j0 + j) * vs_row + c0, n, buf[j]);
            gemm_generic(pt + (int64_t)j0 * ldp, 1, ldp, rows, kg, buf[0], ROW_CHUNK, n, o + c0, ldo, true);
        }
    }
}

static void philox_lanes_generic(uint32_t c0, int64_t i0, uint32_t c2, uint32_t c3, uint64_t seed,
                                 uint32_t w[4][ATTN_PHILOX_LANES]) {
    attn__philox_lanes_scalar(c0, i0, c2, c3, seed, ATTN_PHILOX_LANES, w[0], w[1], w[2], w[3]);
}

const attn__kernels attn__kernels_generic = {
    .name = "generic",
    .isa = ATTN_ISA_GENERIC,
    .gemm = gemm_generic,
    .softmax = softmax_generic,
    .pv = pv_generic,
    .exp2 = exp2_generic,
    .bwd_p = bwd_p_generic,
    .bwd_ds = bwd_ds_generic,
    .qk_rows = qk_rows_generic,
    .pv_rows = pv_rows_generic,
    .half_to_f32 = half_to_f32_generic,
    .f32_to_half = f32_to_half_generic,
    .qk_rows_q = qk_rows_q_generic, // attn__kv_at reads every type
    .pv_rows_q = pv_rows_generic,
    .dequant_rows = attn__dequantize,
    .philox_lanes = philox_lanes_generic,
};

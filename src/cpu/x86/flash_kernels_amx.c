// flash_kernels_amx.c - gemm_bf16 (cpu.h) on AMX-BF16 tiles: tdpbf16ps multiplies a 16-row tile of
// bf16 pairs by a 16 x 16 tile of pairs into 16 x 16 float32 sums, 8192 multiply-adds per
// instruction (vdpbf16ps does 32). Same contract and same products as the AVX512-BF16 version (exact
// bf16 products summed in float32), blocked for the tiles:
//   C blocks of 32 x 32 floats in tiles 0-3 (tile 2*i + j: rows 16i.., columns 16j..),
//   A tiles 4-5 (16 rows x 16 pairs each), B tiles 6-7 (16 pair rows x 16 columns each).
// B is read in place (its layout is the tiles'); A in place when its pairs are contiguous (a_ps = 2)
// and the block is whole, otherwise gathered into a zero-padded block first, as are the last rows
// of B when the pair count is not a multiple of 16. The sums leave the tiles through a float block
// and take the row scale and scale with AVX-512. Compiled with -mamx-tile -mamx-bf16 and AVX-512
// for this file only; flash_kernels_avx512.c builds the "amxbf16" table from the "avx512bf16" one
// and this, chosen at run time where the CPU has AMX-BF16 and the OS grants the tile state.
#include "cpu/cpu.h"
#include "cpu/x86/amx.h"
#include "cpu/x86/simd512.h"

enum {
    KC = 128, // pairs of A packed per block (a block of 32 rows: 16 KiB)
};

// a (32 rows x kc16 pairs): rows m < mrows and pairs e < kc of A (A(m, e) at A + m*a_rs + e*a_ps),
// zero elsewhere; kc16 is kc rounded up to 16.
static void pack_a(const uint16_t *A, int64_t a_rs, int64_t a_ps, int mrows, int kc, int kc16, uint32_t *a) {
    for (int m = 0; m < 32; m++) {
        uint32_t *row = a + (int64_t)m * kc16;
        int e = 0;
        if (m < mrows) {
            const uint16_t *src = A + (int64_t)m * a_rs;
            if (a_ps == 2) {
                memcpy(row, src, (size_t)kc * 4);
                e = kc;
            } else {
                for (; e < kc; e++) memcpy(row + e, src + (int64_t)e * a_ps, 4);
            }
        }
        for (; e < kc16; e++) row[e] = 0;
    }
}

// C rows [0, mrows) x columns [0, 16*nvec) = first ? (rowscale ? rowscale[r] C : 0) + scale t
//                                                 : C + scale t, from t (32 x 32 floats).
static void epilogue(const float *t, int mrows, int nvec, float *Cm, int64_t ldc, const float *rowscale, float scale,
                     bool first) {
    const __m512 s = _mm512_set1_ps(scale);
    for (int r = 0; r < mrows; r++) {
        float *row = Cm + (int64_t)r * ldc;
        for (int x = 0; x < nvec; x++) {
            const __m512 v = _mm512_mul_ps(s, _mm512_loadu_ps(t + 32 * r + 16 * x));
            __m512 c;
            if (!first) c = _mm512_add_ps(_mm512_loadu_ps(row + 16 * x), v);
            else if (rowscale != NULL) c = _mm512_fmadd_ps(_mm512_set1_ps(rowscale[r]), _mm512_loadu_ps(row + 16 * x), v);
            else c = v;
            _mm512_storeu_ps(row + 16 * x, c);
        }
    }
}

void attn__gemm_bf16_amx(const uint16_t *A, int64_t a_rs, int64_t a_ps, int M, int K2, const uint16_t *B,
                         int64_t ldb, int N, float *Cm, int64_t ldc, const float *rowscale, float scale) {
    uint32_t apack[32 * KC];  // a block of A: 32 rows x up to KC pairs
    uint32_t btail[16 * 32];  // the last pair rows of B when fewer than 16: 16 rows x 32 columns
    float t[32 * 32];         // a block of sums out of the tiles
    const attn__amx_config cfg = amx_config_all();
    AMX_STATE;
    AMX_BEGIN(&cfg);
    for (int m0 = 0; m0 < M; m0 += 32) {
        const int mrows = M - m0 < 32 ? M - m0 : 32;
        const bool two_m = mrows > 16;
        for (int k0 = 0; k0 < K2; k0 += KC) {
            const int kc = K2 - k0 < KC ? K2 - k0 : KC, kc16 = (kc + 15) / 16 * 16;
            // the A block: in place, or packed
            const void *ab;
            int64_t a_stride; // bytes between rows
            if (a_ps == 2 && mrows == 32 && kc == kc16) {
                ab = A + (int64_t)m0 * a_rs + 2 * (int64_t)k0;
                a_stride = 2 * a_rs;
            } else {
                pack_a(A + (int64_t)m0 * a_rs + (int64_t)k0 * a_ps, a_rs, a_ps, mrows, kc, kc16, apack);
                ab = apack;
                a_stride = 4 * (int64_t)kc16;
            }
            for (int n0 = 0; n0 < N; n0 += 32) {
                const bool two_n = N - n0 > 16;
                AMX_ZERO(0);
                AMX_ZERO(1);
                AMX_ZERO(2);
                AMX_ZERO(3);
                for (int e = 0; e < kc; e += 16) {
                    const char *a = (const char *)ab + 4 * (int64_t)e;
                    AMX_LOAD(4, a, a_stride);
                    if (two_m) AMX_LOAD(5, a + 16 * a_stride, a_stride);
                    const uint16_t *b = B + 2 * ((int64_t)(k0 + e) * ldb + n0);
                    int64_t b_stride = 4 * ldb;
                    if (kc - e < 16) { // the last pair rows, zero-padded to 16
                        const int rows = kc - e, cols = two_n ? 32 : 16;
                        memset(btail, 0, sizeof btail);
                        for (int r = 0; r < rows; r++) memcpy(btail + 32 * r, b + 2 * (int64_t)r * ldb, (size_t)cols * 4);
                        b = (const uint16_t *)btail;
                        b_stride = 4 * 32;
                    }
                    AMX_LOAD(6, b, b_stride);
                    if (two_n) AMX_LOAD(7, b + 32, b_stride);
                    AMX_DPBF16(0, 4, 6);
                    if (two_n) AMX_DPBF16(1, 4, 7);
                    if (two_m) {
                        AMX_DPBF16(2, 5, 6);
                        if (two_n) AMX_DPBF16(3, 5, 7);
                    }
                }
                AMX_STORE(0, t, 128);
                AMX_STORE(1, t + 16, 128);
                AMX_STORE(2, t + 16 * 32, 128);
                AMX_STORE(3, t + 16 * 32 + 16, 128);
                epilogue(t, mrows, two_n ? 2 : 1, Cm + (int64_t)m0 * ldc + n0, ldc,
                         rowscale != NULL ? rowscale + m0 : NULL, scale, k0 == 0);
            }
        }
    }
    AMX_END();
}

// sum512.h - the sums of the lanes of 16 AVX-512 vectors at once (sum16; quarter_sums4, its last
// level) and their store into a score tile (store_sums16; store_dots16 from a block of rows and
// keys), for the row kernels' dot products (flash_kernels_avx512.c, quant_kernels_avx512.c,
// quant_kernels_avx512vnni.c). Include after simd512.h.
#ifndef ATTN_CPU_X86_SUM512_H
#define ATTN_CPU_X86_SUM512_H

#include <stdint.h>

#include "cpu/unroll.h"

// a + b with a's and b's 128-bit quarters picked by the shuffle constants ia and ib.
#define ADD_QUARTERS(a, b, ia, ib) _mm512_add_ps(_mm512_shuffle_f32x4(a, b, ia), _mm512_shuffle_f32x4(a, b, ib))

// The sums of each 128-bit quarter's four lanes of z[0..3] in one vector: lane 4q + i sums quarter
// q of z[i], as (lane 0 + lane 2) + (lane 1 + lane 3).
static inline __attribute__((always_inline)) __m512 quarter_sums4(const __m512 z[4]) {
    const __m512 u01 = _mm512_add_ps(_mm512_unpacklo_ps(z[0], z[1]), _mm512_unpackhi_ps(z[0], z[1]));
    const __m512 u23 = _mm512_add_ps(_mm512_unpacklo_ps(z[2], z[3]), _mm512_unpackhi_ps(z[2], z[3]));
    return _mm512_add_ps(_mm512_shuffle_ps(u01, u23, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(u01, u23, _MM_SHUFFLE(3, 2, 3, 2)));
}

// The sums of the 16 lanes of each of x[0..15] in one vector, lane i the sum of x[i]: the halves
// and then quarters of pairs of vectors added (two levels), then the four lanes of each quarter.
// Every x[i] is summed in the same order whatever its index.
static inline __attribute__((always_inline)) __m512 sum16(const __m512 x[16]) {
    __m512 y[8], z[4];
    for (int p = 0; p < 8; p++) { // y[p]: quarters 0, 1 from x[a], 2, 3 from x[a + 4], each half-summed
        const int a = (p % 2) * 8 + p / 2;
        y[p] = ADD_QUARTERS(x[a], x[a + 4], _MM_SHUFFLE(1, 0, 1, 0), _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int c = 0; c < 4; c++) // z[c]: quarter t holds x[c + 4t]'s four partial sums
        z[c] = ADD_QUARTERS(y[2 * c], y[2 * c + 1], _MM_SHUFFLE(2, 0, 2, 0), _MM_SHUFFLE(3, 1, 3, 1));
    return quarter_sums4(z);
}

// The dot products of nk <= 16 / NR keys with nr <= NR query rows, lane NR c + r of sums (key c, row
// r), into sj[c * s_j + r * s_r]: one store for the compact tile of four rows (s_r 1, s_j 4).
static inline __attribute__((always_inline)) void store_sums16(__m512 sums, const int NR, float *sj, int64_t s_r,
                                                              int64_t s_j, int nr, int nk) {
    if (NR == 4 && nr == 4 && s_r == 1 && s_j == 4 && nk == 4) {
        _mm512_storeu_ps(sj, sums);
        return;
    }
    float out[16];
    _mm512_storeu_ps(out, sums);
    for (int c = 0; c < nk; c++)
        for (int r = 0; r < nr; r++) sj[c * s_j + r * s_r] = out[NR * c + r];
}

// The dot products of NR rows with NK = 16 / NR keys, 16 lanes each in acc[r NK + c] (row r, key c),
// summed (sum16: lane NR c + r) and stored by store_sums16.
static inline __attribute__((always_inline)) void store_dots16(const __m512 acc[16], const int NR, float *sj,
                                                              int64_t s_r, int64_t s_j, int nr, int nk) {
    const int NK = 16 / NR;
    __m512 lanes[16]; // lane i: key i / NR, row i % NR
    ATTN_UNROLL
    for (int i = 0; i < 16; i++) lanes[i] = acc[(i % NR) * NK + i / NR];
    store_sums16(sum16(lanes), NR, sj, s_r, s_j, nr, nk);
}

#endif

// quant_steps.h - the layout of the int8 q.k that the decode kernels of quant_kernels_avx2.c (the
// AVX2 table: vpmaddubsw, two keys a vector) and quant_kernels_avx512vnni.c (the VNNI and bf16
// tables: vpdpbusd, four keys a vector) share: a row's blocks in groups, each group's quant bytes
// as step vectors whose 128-bit lanes hold one key each, the query bytes prep_q lays out to meet
// them, and the qk_rows_q entry both files share (qk_rows_prepared). Include after <immintrin.h> (or
// simd512.h); the including file defines struct q_group and qk_rows_int8 (declared below).
#ifndef ATTN_CPU_X86_QUANT_STEPS_H
#define ATTN_CPU_X86_QUANT_STEPS_H

#include <stdint.h>
#include <string.h>

#include "attn.h"
#include "cpu/x86/quant_block.h"
#include "cpu/x86/quant_rows.h"

// The start of what prep_q writes: whether the rows that follow are in the int8 form of the file
// or are the float rows (a query holding a NaN or an infinity keeps them, for the float kernel,
// whose scores match the reference's in which keys they make infinite).
typedef struct prep_header {
    int32_t quantised;
    uint8_t pad[60];
} prep_header;

// Per type, the blocks of a row that fill one key's 64 bytes of a q.k group: Q4_0 4 (128 values:
// 64 bytes holding a low and a high nibble each), Q8_0 2 (64 values).
INLINE int qk_blocks(attn_dtype dt) { return dt == ATTN_DTYPE_Q8_0 ? 2 : 4; }

INLINE int groups_of(attn_dtype dt, int D) { return (D / ATTN_QBLOCK + qk_blocks(dt) - 1) / qk_blocks(dt); }

// The lanes of a q.k step within a key's 128 bits: four "columns" c. A group's 64 quant bytes are
// 16 dwords of 4 bytes; step t (0..3) puts dword key_dword(t, c) of the key in column c, so that a
// column meets the same query bytes for every key: Q4_0, column c is block c and step t its dword t
// (values 4t.. in the low nibbles, 16 + 4t.. in the high ones); Q8_0, column c is block c / 2,
// dword 2t + c % 2 (values 4(2t + c % 2)..). A column sums its products over the steps, so no lane
// holds two blocks and no sums cross lanes until the keys' scores are complete.
INLINE int key_dword(attn_dtype dt, int t, int c) { return dt == ATTN_DTYPE_Q8_0 ? 8 * (c / 2) + 2 * t + c % 2 : 4 * c + t; }
INLINE int column_block(attn_dtype dt, int c) { return dt == ATTN_DTYPE_Q8_0 ? c / 2 : c; }
// Steps a row and group: Q4_0 8 (the low nibbles' four, then the high ones'), Q8_0 4.
INLINE int qk_steps(attn_dtype dt) { return dt == ATTN_DTYPE_Q8_0 ? 4 : 8; }

// One query row's group from its blocks rounded to int8 (v[b], scale d[b]; blocks past the row's
// end all 0): step[s][c] the 4 query bytes that column c's key dword meets at step s, sum[c] the
// sum of column c's bytes over the steps, dq[c] the scale of column c's block.
static inline void group_query(attn_dtype dt, const int8_t v[4][32], const float d[4], int32_t step[8][4],
                               int32_t sum[4], float dq[4]) {
    for (int c = 0; c < 4; c++) {
        const int blk = column_block(dt, c);
        sum[c] = 0, dq[c] = d[blk];
        for (int s = 0; s < qk_steps(dt); s++) {
            // Q4_0's step s reads value dword s of its block (the high nibbles' from s = 4 on)
            const int dw = dt == ATTN_DTYPE_Q4_0 ? s : key_dword(dt, s, c) % (ATTN_QBLOCK / 4);
            memcpy(&step[s][c], v[blk] + 4 * dw, 4);
            for (int i = 0; i < 4; i++) sum[c] += v[blk][4 * dw + i];
        }
    }
}

// What prep_q of both files writes at out: the header, then (a query holding a NaN or an infinity
// aside: its float rows) each row's groups in turn, group g of row r the file's layout at index
// r G + g: its blocks rounded by `quantise` (the file's vector form of attn.h's rounding: d =
// max|x| / 127, x * (127 / max|x|) to nearest even, zeros below 2^-96), group_query's bytes, column
// sums and scales handed to `store`.
typedef void (*quantise_fn)(const float *x, int8_t q[32], float *dq);
typedef void (*store_group_fn)(attn_dtype dt, void *groups, int64_t index, const int32_t step[8][4], const int32_t sum[4],
                               const float dq[4]);

INLINE void prep_rows(attn_dtype dt, const float *q, int rows, int D, void *out, quantise_fn quantise,
                      store_group_fn store) {
    prep_header *h = out;
    h->quantised = !attn__f32_any_nonfinite(q, (int64_t)rows * D);
    if (!h->quantised) {
        memcpy(h + 1, q, (size_t)rows * (size_t)D * sizeof(float));
        return;
    }
    const int G = groups_of(dt, D), nb = D / ATTN_QBLOCK, per = qk_blocks(dt);
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < G; g++) {
            int8_t v[4][32] = {{0}}; // the group's blocks, rounded
            float d[4] = {0};
            for (int b = 0; b < per && per * g + b < nb; b++)
                quantise(q + (int64_t)r * D + (int64_t)(per * g + b) * ATTN_QBLOCK, v[b], &d[b]);
            int32_t step[8][4], sum[4];
            float dq[4];
            group_query(dt, (const int8_t(*)[32])v, d, step, sum, dq);
            store(dt, h + 1, (int64_t)r * G + g, (const int32_t(*)[4])step, sum, dq);
        }
}

// The including file's layout of one query row's group (prep_q's store) and its int8 q.k: the
// prepared rows qg (G groups a row) against nj key rows of D elements (ks_row apart), scores at
// s[r s_r + j s_j].
typedef struct q_group q_group;
INLINE void qk_rows_int8(const attn_dtype dt, const void *k, int64_t ks_row, int nj, const int D, const int G,
                         const q_group *qg, int rows, float *s, int64_t s_r, int64_t s_j);

// qk_rows_int8 with D (and so the group count) a constant for D = 64 and 128, else read at run time.
INLINE void qk_rows_groups(const attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const q_group *qg,
                           int rows, float *s, int64_t s_r, int64_t s_j) {
    if (D == 128) qk_rows_int8(dt, k, ks_row, nj, 128, groups_of(dt, 128), qg, rows, s, s_r, s_j);
    else if (D == 64) qk_rows_int8(dt, k, ks_row, nj, 64, groups_of(dt, 64), qg, rows, s, s_r, s_j);
    else qk_rows_int8(dt, k, ks_row, nj, D, groups_of(dt, D), qg, rows, s, s_r, s_j);
}

// cpu.h's qk_rows_q for a table with prep_q: q is what prep_q wrote; its float rows (a query with
// a NaN or an infinity) go to quant_rows.h's float kernel, its int8 groups to qk_rows_int8.
INLINE void qk_rows_prepared(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const void *q, int rows,
                             float *s, int64_t s_r, int64_t s_j) {
    const prep_header *h = q;
    if (!h->quantised) qk_rows_q(dt, k, ks_row, nj, D, (const float *)(h + 1), rows, s, s_r, s_j);
    else if (dt == ATTN_DTYPE_Q4_0) qk_rows_groups(ATTN_DTYPE_Q4_0, k, ks_row, nj, D, (const q_group *)(h + 1), rows, s, s_r, s_j);
    else qk_rows_groups(ATTN_DTYPE_Q8_0, k, ks_row, nj, D, (const q_group *)(h + 1), rows, s, s_r, s_j);
}

#endif

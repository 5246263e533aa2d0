// decode_prefetch.h - software prefetch for the row kernels (qk_rows, pv_rows) of each x86 set.
//
// One-query decoding streams the whole cache once per step and is bound by memory. The hardware
// prefetchers alone left a core at about half of a STREAM triad's bandwidth (BENCHMARKS.md), so
// the kernels request lines into L2 ahead of their reads:
// - qk_rows reads each key row once, from its start: while it reads element i, the line
//   DECODE_PF_BYTES further on is requested (a row read a little later: rows of a KV cache, and
//   of a weight matrix in a matrix-vector product, lie end to end);
// - pv_rows passes over a tile's value rows several times, a block of columns per pass: while a
//   pass reads a row, it requests its own columns of the row one key tile (FLASH_BC rows) on,
//   which the same pass of the next tile reads. A distance in bytes would, for rows near the
//   tile's start, fall inside the tile itself: those lines would be requested only a pass before
//   they are read, and memory would idle through the later passes. A tile's distance gives each
//   request a tile's work to arrive; two tiles of K and V (192 KiB in f32 at D = 128) fit in L2.
// For other layouts a prefetch of an unneeded line only costs some bandwidth.
#ifndef ATTN_CPU_X86_DECODE_PREFETCH_H
#define ATTN_CPU_X86_DECODE_PREFETCH_H

#include <immintrin.h>
#include <stdint.h>

#include "attn.h"
#include "cpu/flash.h"

#define DECODE_PF_BYTES 16384

// Bytes per element of a cache of type dt (F32, F16 or BF16), inline for the kernels' inner loops.
static inline int decode_elem_bytes(attn_dtype dt) { return dt == ATTN_DTYPE_F32 ? 4 : 2; }

// Elements of type dt per 64-byte cache line: how often the loops issue a prefetch.
static inline int decode_line_elems(attn_dtype dt) { return 64 / decode_elem_bytes(dt); }

// Requests the line DECODE_PF_BYTES after element i of p (of type dt) into L2.
static inline __attribute__((always_inline)) void decode_prefetch(const void *p, attn_dtype dt, int64_t i) {
    _mm_prefetch((const char *)p + i * decode_elem_bytes(dt) + DECODE_PF_BYTES, _MM_HINT_T1);
}

// Requests into L2 the lines of the n bytes from p, `ahead` bytes on: a row of a block-type cache
// (Q8_0, Q4_0: blocks of 34 or 18 bytes, so a row starts anywhere in a line and its last line may
// start past the steps of 64).
static inline __attribute__((always_inline)) void decode_prefetch_bytes(const void *p, int64_t ahead, int n) {
    for (int x = 0; x < n; x += 64) _mm_prefetch((const char *)p + ahead + x, _MM_HINT_T1);
    _mm_prefetch((const char *)p + ahead + n - 1, _MM_HINT_T1);
}

// For a pass over columns [e, e + w) of a row (of Dv elements) whose column e is element i of p:
// the lines that start in those columns, FLASH_BC rows of row_stride elements on, into L2.
static inline __attribute__((always_inline)) void decode_prefetch_cols(const void *p, attn_dtype dt, int64_t i,
                                                                      int64_t row_stride, int e, int w, int Dv) {
    const int line = decode_line_elems(dt);
    for (int x = (line - e % line) % line; x < w && e + x < Dv; x += line)
        _mm_prefetch((const char *)p + (i + x + FLASH_BC * row_stride) * decode_elem_bytes(dt), _MM_HINT_T1);
}

#endif

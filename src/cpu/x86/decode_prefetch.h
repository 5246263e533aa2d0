// decode_prefetch.h - software prefetch for the decode kernels (qk_rows, pv_rows) of each x86 set.
//
// One-query decoding streams the whole cache once per step and is bound by memory. The hardware
// prefetchers alone left a core at about half of a STREAM triad's bandwidth (BENCHMARKS.md), so
// while element i of a key (value) row is read, the line DECODE_PF_BYTES further on is requested
// into L2. Rows of a KV cache lie end to end, so that is a row read a little later; for other
// layouts a prefetch of an unneeded line only costs some bandwidth.
#ifndef ATTN_CPU_X86_DECODE_PREFETCH_H
#define ATTN_CPU_X86_DECODE_PREFETCH_H

#include <immintrin.h>
#include <stdint.h>

#include "attn.h"

#define DECODE_PF_BYTES 16384

// Bytes per element of a cache of type dt (F32, F16 or BF16), inline for the kernels' inner loops.
static inline int decode_elem_bytes(attn_dtype dt) { return dt == ATTN_DTYPE_F32 ? 4 : 2; }

// Elements of type dt per 64-byte cache line: how often the loops issue a prefetch.
static inline int decode_line_elems(attn_dtype dt) { return 64 / decode_elem_bytes(dt); }

static inline __attribute__((always_inline)) void decode_prefetch(const void *p, attn_dtype dt, int64_t i) {
    _mm_prefetch((const char *)p + i * decode_elem_bytes(dt) + DECODE_PF_BYTES, _MM_HINT_T1);
}

#endif

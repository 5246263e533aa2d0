// quant_block.h - a Q8_0 / Q4_0 block's size, place and scale (attn.h has the layouts), for the
// x86 row kernels (quant_rows.h, quant_pv_rows.h, quant_groups512.h). Include after <immintrin.h>
// (or simd512.h) with F16C enabled.
#ifndef ATTN_CPU_X86_QUANT_BLOCK_H
#define ATTN_CPU_X86_QUANT_BLOCK_H

#include <stdint.h>

#include "attn.h"
#include "cpu/cpu.h"
#include "half.h"

#define INLINE static inline __attribute__((always_inline))

INLINE int block_bytes(attn_dtype dt) { return dt == ATTN_DTYPE_Q8_0 ? ATTN_Q8_0_BYTES : ATTN_Q4_0_BYTES; }

// The block holding element `off` (a multiple of 32) of a dt tensor.
INLINE const uint8_t *block_at(const void *p, attn_dtype dt, int64_t off) {
    return (const uint8_t *)p + off / ATTN_QBLOCK * block_bytes(dt);
}

// The scale d of the block at b: its first two bytes, the float16's bits.
INLINE uint16_t scale_bits(const uint8_t *b) {
    uint16_t h;
    __builtin_memcpy(&h, b, 2);
    return h;
}

// The scale d of the block at b as a float.
INLINE float scale_f(const uint8_t *b) { return _cvtsh_ss(scale_bits(b)); }

#endif

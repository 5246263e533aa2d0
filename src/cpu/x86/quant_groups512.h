// quant_groups512.h - what the AVX-512 decode kernels on dot-product instructions share
// (quant_kernels_avx512vnni.c: q.k on vpdpbusd; quant_kernels_avx512bf16.c: P V on vdpbf16ps): the
// span of a group of blocks in a key or value row and the masks of its two 64-byte loads, and the
// scale check that makes a key's score, or its weighted value, NaN where its block's scale is
// infinite or NaN. Include after simd512.h.
#ifndef ATTN_CPU_X86_QUANT_GROUPS512_H
#define ATTN_CPU_X86_QUANT_GROUPS512_H

#include "attn.h"
#include "cpu/x86/quant_block.h"

// The blocks of a group of at most `per` blocks starting at block first of a row of nb, and the byte
// masks of its two 64-byte loads.
typedef struct group_span {
    int blocks;
    __mmask64 m0, m1;
} group_span;

INLINE __mmask64 bytes_mask(int n) { return n >= 64 ? ~(__mmask64)0 : n <= 0 ? 0 : (((__mmask64)1 << n) - 1); }

INLINE group_span span_of(attn_dtype dt, int nb, int first, int per) {
    group_span s;
    s.blocks = nb - first < per ? nb - first : per;
    const int bytes = s.blocks * block_bytes(dt);
    s.m0 = bytes_mask(bytes), s.m1 = bytes_mask(bytes - 64);
    return s;
}

// d + (d - d): NaN for an infinite or NaN scale d, else d.
INLINE __m512 nan_if_infinite(__m512 d) { return _mm512_add_ps(d, _mm512_sub_ps(d, d)); }

#endif

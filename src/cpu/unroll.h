// unroll.h - ATTN_UNROLL: the loop that follows is unrolled whole. For the register blocks' loops
// over their rows and columns (trip counts that are constants after inlining): an accumulator array
// stays in registers only when every index into it is a constant. GCC obeys `#pragma GCC unroll`;
// clang reads that pragma but may still interchange the loops and keep the accumulators in memory
// (seen in its code for the 2- and 4-row P V blocks), so it gets its own pragma.
#ifndef ATTN_CPU_UNROLL_H
#define ATTN_CPU_UNROLL_H

#if defined(__clang__)
#define ATTN_UNROLL _Pragma("clang loop unroll(full)")
#else
#define ATTN_UNROLL _Pragma("GCC unroll 16")
#endif

#endif

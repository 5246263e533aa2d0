// simd512.h - the AVX-512 intrinsics of the 512-bit kernels. Normally the compiler's own
// (immintrin.h). A build configured with ATTN_EMULATE_AVX512=ON (for tests; see README) compiles the
// same kernel sources for AVX2 with SIMDe's portable versions of the intrinsics instead, plus the
// few that SIMDe 0.7 lacks (below), and runs them as if the CPU had AVX-512F and AVX512-BF16: the
// kernels' logic (blocking, masks, edges, packing) is then tested on any x86-64 CPU with AVX2.
// Emulation checks results, never speed, and not the hardware's bf16 rounding details (vdpbf16ps
// flushes denormal inputs and outputs to zero; SIMDe's version keeps them).
#ifndef ATTN_CPU_X86_SIMD512_H
#define ATTN_CPU_X86_SIMD512_H

#if !defined(ATTN_EMULATE_AVX512)
#include <immintrin.h>
#else
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define EMU_INLINE static inline __attribute__((always_inline))

// Lanes of a register through memory (the register types are plain vectors under SIMDe).
EMU_INLINE simde__m512 emu512_ps(const float f[16]) {
    simde__m512 r;
    memcpy(&r, f, sizeof r);
    return r;
}

// Masked loads touch only the selected lanes' memory, as the instructions do.
EMU_INLINE simde__m512 emu512_mask_loadu_ps(simde__m512 src, simde__mmask16 k, const void *p) {
    float f[16];
    memcpy(f, &src, sizeof f);
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1u) memcpy(&f[i], (const char *)p + 4 * i, 4);
    return emu512_ps(f);
}
EMU_INLINE simde__m512 emu512_maskz_loadu_ps(simde__mmask16 k, const void *p) {
    return emu512_mask_loadu_ps(simde_mm512_setzero_ps(), k, p);
}
EMU_INLINE void emu512_mask_storeu_ps(void *p, simde__mmask16 k, simde__m512 a) {
    float f[16];
    memcpy(f, &a, sizeof f);
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1u) memcpy((char *)p + 4 * i, &f[i], 4);
}
EMU_INLINE simde__m512 emu512_cvtph_ps(simde__m256i h) {
    simde__m256 lo = simde_mm256_cvtph_ps(simde_mm256_castsi256_si128(h));
    simde__m256 hi = simde_mm256_cvtph_ps(simde_mm256_extracti128_si256(h, 1));
    float f[16];
    memcpy(f, &lo, 32), memcpy(f + 8, &hi, 32);
    return emu512_ps(f);
}
// The 16 narrow lanes of x (T: uint16_t, int8_t or uint8_t) zero- or sign-extended, as T is, to 16
// int32 lanes (vpmovzxwd, vpmovsxbd, vpmovzxbd); and int32 lanes converted to float.
#define EMU512_WIDEN_EPI32(name, T, In)             \
    EMU_INLINE simde__m512i name(In x) {            \
        T u[16];                                    \
        int32_t w[16];                              \
        memcpy(u, &x, sizeof u);                    \
        for (int i = 0; i < 16; i++) w[i] = u[i];   \
        simde__m512i r;                             \
        memcpy(&r, w, sizeof r);                    \
        return r;                                   \
    }
EMU512_WIDEN_EPI32(emu512_cvtepu16_epi32, uint16_t, simde__m256i)
EMU512_WIDEN_EPI32(emu512_cvtepi8_epi32, int8_t, simde__m128i)
EMU512_WIDEN_EPI32(emu512_cvtepu8_epi32, uint8_t, simde__m128i)
EMU_INLINE simde__m512 emu512_cvtepi32_ps(simde__m512i a) {
    int32_t w[16];
    float f[16];
    memcpy(w, &a, sizeof w);
    for (int i = 0; i < 16; i++) f[i] = (float)w[i];
    return emu512_ps(f);
}
// a * 2^floor(b) per lane, overflowing only where the result does (SIMDe 0.7 multiplies by 2^b,
// which overflows first for results just under the largest float).
EMU_INLINE simde__m512 emu512_scalef_ps(simde__m512 a, simde__m512 b) {
    float fa[16], fb[16];
    memcpy(fa, &a, sizeof fa), memcpy(fb, &b, sizeof fb);
    for (int i = 0; i < 16; i++) {
        if (fa[i] != fa[i] || fb[i] != fb[i]) fa[i] = fa[i] + fb[i]; // NaN
        else if (fb[i] > 400.0f) fa[i] = fa[i] * 0x1p127f * 0x1p127f * 0x1p127f * 0x1p127f;
        else if (fb[i] < -400.0f) fa[i] = fa[i] * 0x1p-127f * 0x1p-127f * 0x1p-127f * 0x1p-127f;
        else fa[i] = ldexpf(fa[i], (int)floorf(fb[i]));
    }
    return emu512_ps(fa);
}
// The low bits (T: uint16_t or uint8_t) of each 32-bit lane (vpmovdw, vpmovdb; not in SIMDe 0.7).
#define EMU512_NARROW_EPI32(name, T, Out)           \
    EMU_INLINE Out name(simde__m512i a) {           \
        uint32_t w[16];                             \
        T n[16];                                    \
        memcpy(w, &a, sizeof w);                    \
        for (int i = 0; i < 16; i++) n[i] = (T)w[i];\
        Out r;                                      \
        memcpy(&r, n, sizeof r);                    \
        return r;                                   \
    }
EMU512_NARROW_EPI32(emu512_cvtepi32_epi16, uint16_t, simde__m256i)
EMU512_NARROW_EPI32(emu512_cvtepi32_epi8, uint8_t, simde__m128i)
// float to bfloat16 as vcvtne2ps2bf16 rounds: to nearest even, NaN kept quiet, denormals to zero.
EMU_INLINE uint16_t emu_bf16_rne(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// bf16 lanes 0-15 from b, 16-31 from a.
EMU_INLINE simde__m512bh emu512_cvtne2ps_pbh(simde__m512 a, simde__m512 b) {
    float fa[16], fb[16];
    uint16_t h[32];
    memcpy(fa, &a, sizeof fa), memcpy(fb, &b, sizeof fb);
    for (int i = 0; i < 16; i++) h[i] = emu_bf16_rne(fb[i]), h[16 + i] = emu_bf16_rne(fa[i]);
    simde__m512bh r;
    memcpy(&r, h, sizeof r);
    return r;
}

// The intrinsics of the Q4_0 kernels (quant_kernels_avx512vnni.c, quant_pv_int16.h,
// quant_kernels_avx512bf16.c) that SIMDe 0.7 lacks: masked byte loads (touching only the selected
// bytes), widening, reductions, rounding, arithmetic shifts of dwords.
EMU_INLINE simde__m512i emu512_maskz_loadu_epi8(simde__mmask64 k, const void *p) {
    uint8_t b[64];
    for (int i = 0; i < 64; i++) b[i] = (k >> i) & 1u ? ((const uint8_t *)p)[i] : 0;
    simde__m512i r;
    memcpy(&r, b, sizeof r);
    return r;
}
EMU_INLINE simde__m512i emu512_cvtepu8_epi16(simde__m256i x) {
    uint8_t u[32];
    uint16_t w[32];
    memcpy(u, &x, sizeof u);
    for (int i = 0; i < 32; i++) w[i] = u[i];
    simde__m512i r;
    memcpy(&r, w, sizeof r);
    return r;
}
EMU_INLINE simde__m512i emu512_cvt_roundps_epi32(simde__m512 a, int rounding) { // to nearest even only
    (void)rounding;
    float f[16];
    int32_t w[16];
    memcpy(f, &a, sizeof f);
    for (int i = 0; i < 16; i++) w[i] = f[i] == f[i] && fabsf(f[i]) < 0x1p31f ? (int32_t)nearbyintf(f[i]) : INT32_MIN;
    simde__m512i r;
    memcpy(&r, w, sizeof r);
    return r;
}
EMU_INLINE simde__m512i emu512_srai_epi32(simde__m512i a, unsigned imm) { // imm < 32
    int32_t w[16];
    memcpy(w, &a, sizeof w);
    for (int i = 0; i < 16; i++) w[i] = w[i] >= 0 ? w[i] >> imm : -1 - ((-1 - w[i]) >> imm); // floor(w / 2^imm)
    simde__m512i r;
    memcpy(&r, w, sizeof r);
    return r;
}
EMU_INLINE float emu512_reduce_max_ps(simde__m512 a) {
    float f[16];
    memcpy(f, &a, sizeof f);
    float m = f[0];
    for (int i = 1; i < 16; i++) m = f[i] > m ? f[i] : m;
    return m;
}
EMU_INLINE int32_t emu512_reduce_add_epi32(simde__m512i a) {
    int32_t w[16];
    memcpy(w, &a, sizeof w);
    uint32_t s = 0;
    for (int i = 0; i < 16; i++) s += (uint32_t)w[i];
    return (int32_t)s;
}

#undef _mm512_mask_loadu_ps
#undef _mm512_maskz_loadu_ps
#undef _mm512_mask_storeu_ps
#undef _mm512_cvtph_ps
#undef _mm512_cvtepu16_epi32
#undef _mm512_cvtepi32_epi16
#undef _mm512_cvtne2ps_pbh
#undef _mm512_shuffle_f32x4
#undef _mm512_scalef_ps
#undef _mm512_maskz_loadu_epi8
#undef _mm512_cvtepu8_epi16
#undef _mm512_cvtepi32_epi8
#undef _mm512_cvt_roundps_epi32
#undef _mm512_srai_epi32
#undef _mm512_reduce_max_ps
#undef _mm512_reduce_add_epi32
#define _mm512_mask_loadu_ps emu512_mask_loadu_ps
#define _mm512_maskz_loadu_ps emu512_maskz_loadu_ps
#define _mm512_mask_storeu_ps emu512_mask_storeu_ps
#define _mm512_cvtph_ps emu512_cvtph_ps
#define _mm512_cvtepu16_epi32 emu512_cvtepu16_epi32
#define _mm512_cvtepi8_epi32 emu512_cvtepi8_epi32
#define _mm512_cvtepu8_epi32 emu512_cvtepu8_epi32
#define _mm512_cvtepi32_ps emu512_cvtepi32_ps
#define _mm512_cvtepi32_epi16 emu512_cvtepi32_epi16
#define _mm512_cvtne2ps_pbh emu512_cvtne2ps_pbh
#define _mm512_shuffle_f32x4 simde_mm512_shuffle_f32x4
#define _mm512_scalef_ps emu512_scalef_ps
#define _mm512_maskz_loadu_epi8 emu512_maskz_loadu_epi8
#define _mm512_cvtepu8_epi16 emu512_cvtepu8_epi16
#define _mm512_cvtepi32_epi8 emu512_cvtepi32_epi8
#define _mm512_cvt_roundps_epi32 emu512_cvt_roundps_epi32
#define _mm512_srai_epi32 emu512_srai_epi32
#define _mm512_reduce_max_ps emu512_reduce_max_ps
#define _mm512_reduce_add_epi32 emu512_reduce_add_epi32
#endif

#endif

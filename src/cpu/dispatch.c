// dispatch.c - chooses a kernel table for a context's ISA request from what this build contains
// and what the CPU supports. The CPU is asked through the compiler's cpuid cache (filled once,
// read-only afterwards) and the cpuid instruction; nothing here keeps state of its own.
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE // syscall(), for the AMX tile permission
#endif
#include "cpu/cpu.h"

#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <cpuid.h>
#endif
#if defined(ATTN_HAVE_AMXBF16) && !defined(ATTN_EMULATE_AVX512) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

// The CPU checks below are static inline: a build without the kernels one checks for (any CPU
// but x86, or a compiler without the flags) never calls it.

static inline bool cpu_has_avx2_fma(void) {
#if defined(ATTN_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    unsigned a, b, c, d; // F16C (half-precision conversions): CPUID leaf 1, ECX bit 29
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
    return false;
#endif
}

// AVX-VNNI (CPUID leaf 7 subleaf 1, EAX bit 4, read where subleaf 0's EAX says subleaf 1 exists):
// the VEX-encoded vpdpbusd and vpdpwssd on 256-bit vectors, beside AVX2 (Intel's cores since Alder
// Lake and Sapphire Rapids, among others): the AVX2 table's "avx2+vnni" form.
static inline bool cpu_has_avx_vnni(void) {
#if defined(ATTN_EMULATE_AVX512) // the form's dot products are plain C there (quant_avx2.h)
    return cpu_has_avx2_fma();
#elif defined(ATTN_HAVE_AVXVNNI) && (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    unsigned a, b, c, d;
    if (!cpu_has_avx2_fma() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || a < 1) return false;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4)) != 0;
#else
    return false;
#endif
}

static inline bool cpu_has_avx512(void) {
#if defined(ATTN_EMULATE_AVX512) // the kernels run through SIMDe on AVX2 (a test build)
    return cpu_has_avx2_fma();
#elif defined(ATTN_HAVE_AVX512) && (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init(); // also checks that the OS saves the 512-bit state
    return __builtin_cpu_supports("avx512f") && cpu_has_avx2_fma();
#else
    return false;
#endif
}

// AVX512-VNNI (CPUID leaf 7, ECX bit 11) with AVX512-BW (EBX bit 30) for the byte and word
// permutes and AVX512-VL (EBX bit 31): the block-type decode kernels' q.k.
static inline bool cpu_has_avx512_vnni(void) {
#if defined(ATTN_EMULATE_AVX512)
    return cpu_has_avx512();
#elif defined(ATTN_HAVE_AVX512VNNI) && (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    unsigned a, b, c, d;
    if (!cpu_has_avx512() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (b & (1u << 30)) != 0 && (b & (1u << 31)) != 0 && (c & (1u << 11)) != 0;
#else
    return false;
#endif
}

// AVX512-VBMI (CPUID leaf 7, ECX bit 1) beside AVX512-VNNI: the byte permutes of the "avx512vnni"
// P V's faster form (every CPU with AVX512-VNNI but Intel's Cascade Lake and Cooper Lake).
static inline bool cpu_has_avx512_vbmi(void) {
#if defined(ATTN_EMULATE_AVX512)
    return cpu_has_avx512_vnni();
#elif defined(ATTN_HAVE_AVX512VBMI) && (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    unsigned a, b, c, d;
    if (!cpu_has_avx512_vnni() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (c & (1u << 1)) != 0;
#else
    return false;
#endif
}
// AVX512-BF16 (CPUID leaf 7 subleaf 1, EAX bit 5) beside AVX512-VNNI, whose q.k the bf16 tables'
// block-type decode kernels take (every CPU with AVX512-BF16 so far has it).
static inline bool cpu_has_avx512_bf16(void) {
#if defined(ATTN_EMULATE_AVX512)
    return cpu_has_avx512_vnni();
#elif defined(ATTN_HAVE_AVX512BF16) && (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    unsigned a1, b1, c1, d1;
    if (!cpu_has_avx512_vnni() || !__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) return false;
    return (a1 & (1u << 5)) != 0;
#else
    return false;
#endif
}

// AMX-BF16: CPUID leaf 7 EDX bits 22 (AMX-BF16) and 24 (AMX-TILE) beside AVX512-VBMI (for the
// table's decode P V; every CPU with tiles so far has it), the OS saving the tile state
// (XCR0 bits 17 and 18), and on Linux the process's permission to use it, which is asked for here
// (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA: granted once for the whole process, kept by the
// kernel; asking again is harmless). Without the permission the first tile instruction would fault.
static inline bool cpu_has_amx_bf16(void) {
#if defined(ATTN_EMULATE_AVX512)
    return cpu_has_avx512_bf16();
#elif defined(ATTN_HAVE_AMXBF16) && defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
    unsigned a, b, c, d;
    if (!cpu_has_avx512_bf16() || !cpu_has_avx512_vbmi() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if ((d & (1u << 22)) == 0 || (d & (1u << 24)) == 0) return false;
    if (!__get_cpuid(1, &a, &b, &c, &d) || (c & (1u << 27)) == 0) return false; // OSXSAVE: xgetbv allowed
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return false;
#endif
}

// Intel's cores, whose vdpbf16ps runs half the float32 FMAs' flops a cycle (attn__isa_caps): the
// vendor string of CPUID leaf 0. The emulated build's instructions have no such rates.
static inline bool cpu_is_intel(void) {
#if !defined(ATTN_EMULATE_AVX512) && (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    return b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu; // "Genu" "ineI" "ntel"
#else
    return false;
#endif
}

void attn__isa_caps_now(attn__isa_caps *caps) {
    bool ok;
    caps->avx2 = attn__kernels_for(ATTN_ISA_AVX2, &ok) != NULL;
    caps->avx512 = attn__kernels_for(ATTN_ISA_AVX512, &ok) != NULL;
    caps->avx512_vnni = attn__kernels_for(ATTN_ISA_AVX512_VNNI, &ok) != NULL;
    caps->avx512_bf16 = attn__kernels_for(ATTN_ISA_AVX512_BF16, &ok) != NULL;
    caps->amx_bf16 = attn__kernels_for(ATTN_ISA_AMX_BF16, &ok) != NULL;
    caps->slow_bf16_dot = cpu_is_intel();
}

attn_isa attn__auto_isa(const attn__isa_caps *caps) {
    if (caps->amx_bf16) return ATTN_ISA_AMX_BF16; // tiles: many times vdpbf16ps's rate on any CPU
    if (caps->avx512_bf16 && !caps->slow_bf16_dot) return ATTN_ISA_AVX512_BF16;
    if (caps->avx512_vnni) return ATTN_ISA_AVX512_VNNI;
    if (caps->avx512) return ATTN_ISA_AVX512;
    if (caps->avx2) return ATTN_ISA_AVX2;
    return ATTN_ISA_GENERIC;
}

const attn__kernels *attn__kernels_for(attn_isa isa, bool *ok) {
    *ok = true;
    switch (isa) {
    case ATTN_ISA_REF:
        return NULL;
    case ATTN_ISA_GENERIC:
        return &attn__kernels_generic;
    case ATTN_ISA_AVX2:
#if defined(ATTN_HAVE_AVXVNNI)
        if (cpu_has_avx_vnni()) return &attn__kernels_avx2_vnni;
#endif
#if defined(ATTN_HAVE_AVX2)
        if (cpu_has_avx2_fma()) return &attn__kernels_avx2;
#endif
        *ok = false;
        return NULL;
    case ATTN_ISA_AVX512:
#if defined(ATTN_HAVE_AVX512)
        if (cpu_has_avx512()) return &attn__kernels_avx512;
#endif
        *ok = false;
        return NULL;
    case ATTN_ISA_AVX512_VNNI:
#if defined(ATTN_HAVE_AVX512VBMI)
        if (cpu_has_avx512_vbmi()) return &attn__kernels_avx512vnni_vbmi;
#endif
#if defined(ATTN_HAVE_AVX512VNNI)
        if (cpu_has_avx512_vnni()) return &attn__kernels_avx512vnni;
#endif
        *ok = false;
        return NULL;
    case ATTN_ISA_AVX512_BF16:
#if defined(ATTN_HAVE_AVX512BF16)
        if (cpu_has_avx512_bf16()) return &attn__kernels_avx512bf16;
#endif
        *ok = false;
        return NULL;
    case ATTN_ISA_AMX_BF16:
#if defined(ATTN_HAVE_AMXBF16)
        if (cpu_has_amx_bf16()) return &attn__kernels_amxbf16;
#endif
        *ok = false;
        return NULL;
    case ATTN_ISA_AUTO: {
        attn__isa_caps caps;
        attn__isa_caps_now(&caps);
        return attn__kernels_for(attn__auto_isa(&caps), ok); // never AUTO again
    }
    }
    *ok = false;
    return NULL;
}

int attn__kernel_tables(attn_isa isa, const attn__kernels *out[ATTN_MAX_ISA_TABLES]) {
    bool ok;
    const attn__kernels *first = isa == ATTN_ISA_AUTO ? NULL : attn__kernels_for(isa, &ok);
    if (first == NULL) return 0;
    int n = 0;
    out[n++] = first;
#if defined(ATTN_HAVE_AVX512VNNI)
    if (first != &attn__kernels_avx512vnni && isa == ATTN_ISA_AVX512_VNNI) out[n++] = &attn__kernels_avx512vnni;
#endif
#if defined(ATTN_HAVE_AVX2)
    if (first != &attn__kernels_avx2 && isa == ATTN_ISA_AVX2) out[n++] = &attn__kernels_avx2;
#endif
    return n;
}

int attn_isa_supported(attn_isa isa) {
    bool ok;
    attn__kernels_for(isa, &ok);
    return ok;
}

const char *attn_isa_name(attn_isa isa) {
    switch (isa) {
    case ATTN_ISA_AUTO: return "auto";
    case ATTN_ISA_REF: return "ref";
    case ATTN_ISA_GENERIC: return "generic";
    case ATTN_ISA_AVX2: return "avx2";
    case ATTN_ISA_AVX512: return "avx512";
    case ATTN_ISA_AVX512_BF16: return "avx512bf16";
    case ATTN_ISA_AMX_BF16: return "amxbf16";
    case ATTN_ISA_AVX512_VNNI: return "avx512vnni";
    }
    return "?";
}

attn_status attn_isa_from_name(const char *name, attn_isa *isa) {
    if (name == NULL || isa == NULL) return ATTN_ERR_INVALID_ARG;
    // the enum's values are dense from AUTO: the first without a name ends them
    for (int i = ATTN_ISA_AUTO; strcmp(attn_isa_name((attn_isa)i), "?") != 0; i++)
        if (strcmp(name, attn_isa_name((attn_isa)i)) == 0) {
            *isa = (attn_isa)i;
            return ATTN_OK;
        }
    return ATTN_ERR_INVALID_ARG;
}

int attn_isa_bf16_dot(attn_isa isa) { return isa == ATTN_ISA_AVX512_BF16 || isa == ATTN_ISA_AMX_BF16; }

int attn_isa_int8_query(attn_isa isa) {
    return isa == ATTN_ISA_AVX2 || isa == ATTN_ISA_AVX512_VNNI || attn_isa_bf16_dot(isa);
}

int attn_isa_int16_weights(attn_isa isa) {
    return isa == ATTN_ISA_AVX2 || isa == ATTN_ISA_AVX512_VNNI || isa == ATTN_ISA_AMX_BF16;
}

attn_isa attn_ctx_isa(const attn_ctx *ctx) {
    if (ctx == NULL) return ATTN_ISA_AUTO;
    return ctx->kernels != NULL ? ctx->kernels->isa : ATTN_ISA_REF;
}

// zmm_mix.c - what a vector instruction costs beside the dot products of the decode kernels on this
// CPU: the cycles of a loop of 8 independent dot products, of 8 independent instructions of another
// kind, and of the two interleaved. Where the two kinds run on separate pipes the mix takes as long
// as the slower kind alone; where they share pipes (as 512-bit operations do on a CPU that runs them
// as two 256-bit halves, or on the pipe that shuffles) it takes more: "each adds" is the mix's
// cycles beyond the 8 dot products alone, per instruction of the other kind (1.00: it takes the dot
// products' pipes as if it were one).
//
// Two tables. With AVX512-VNNI, 512-bit instructions beside vdpbf16ps where the CPU has
// AVX512-BF16, else vpdpwssd (the P V of the "avx512vnni" table): the decode kernels of the bf16 and
// VNNI tables (src/cpu/x86/quant_kernels_avx512vnni.c, quant_kernels_avx512bf16.c) spend about as
// many of these other instructions as dot products; BENCHMARKS.md reads their cost from this. Rows
// whose instruction the CPU lacks (vcvtne2ps2bf16 without AVX512-BF16, the byte permutes without
// AVX512-VBMI) are left out. With AVX2 and FMA, 256-bit instructions beside vpmaddwd (the P V of the
// AVX2 table, src/cpu/x86/quant_avx2.h, whose q . k runs on vpmaddubsw, vpsignb and
// vpmaddwd): there the instructions of the other kind write six registers in turn (sixteen ymm
// registers hold the 8 products' results and the two sources), so an FMA, which reads its
// destination, would chain on its latency; vmulps stands for the float multiply pipes.
//
// Build and run (x86-64; one thread):
//   cc -O2 bench/zmm_mix.c -o zmm_mix
//   ./zmm_mix
// Cycles are wall time times the clock measured by a chain of dependent adds (one a cycle).
#define _POSIX_C_SOURCE 200809L
#include <cpuid.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>

#define ITERS 20000000L

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

#define CLOBBERS                                                                                                     \
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", \
        "xmm14", "xmm15", "memory"

// One instruction writing zmm register i (8 .. 15) from zmm30 and zmm31 (the broadcast: from the stack).
#define BF(i) "vdpbf16ps %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define WSSD(i) "vpdpwssd %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define FMA(i) "vfmadd231ps %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define PERMB(i) "vpermb %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define PERMT2B(i) "vpermt2b %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define DPBUSD(i) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define MULPS(i) "vmulps %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define PERMW(i) "vpermw %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define PERMT2W(i) "vpermt2w %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define PSHUFB(i) "vpshufb %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define SHUFI(i) "vshufi32x4 $0x44, %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define MOVZXBW(i) "vpmovzxbw %%ymm30, %%zmm" #i "\n\t"
#define MOVSXBD(i) "vpmovsxbd %%xmm30, %%zmm" #i "\n\t"
#define CVTDQ2PS(i) "vcvtdq2ps %%zmm30, %%zmm" #i "\n\t"
#define CVTPH2PS(i) "vcvtph2ps %%ymm30, %%zmm" #i "\n\t"
#define CVTNE2(i) "vcvtne2ps2bf16 %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define SRLW(i) "vpsrlw $4, %%zmm30, %%zmm" #i "\n\t"
#define ANDD(i) "vpandd %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define TERNLOG(i) "vpternlogd $0xf8, %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define BCSTD(i) "vpbroadcastd 8(%%rsp), %%zmm" #i "\n\t"

// 256-bit: one instruction writing ymm register i (8 .. 13) from ymm14 and ymm15.
#define Y_MADDWD(i) "vpmaddwd %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define Y_MADDUBSW(i) "vpmaddubsw %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define Y_SIGNB(i) "vpsignb %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define Y_MULPS(i) "vmulps %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define Y_PADDD(i) "vpaddd %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define Y_PADDW(i) "vpaddw %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define Y_PABSB(i) "vpabsb %%ymm15, %%ymm" #i "\n\t"
#define Y_PAND(i) "vpand %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define Y_SRLW(i) "vpsrlw $4, %%ymm15, %%ymm" #i "\n\t"
#define Y_UNPCKLBW(i) "vpunpcklbw %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define Y_UNPCKLQDQ(i) "vpunpcklqdq %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define Y_PSHUFB(i) "vpshufb %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define Y_PERMPS(i) "vpermps %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define Y_INSERT(i) "vinserti128 $1, %%xmm14, %%ymm15, %%ymm" #i "\n\t"
#define Y_MOVZXBW(i) "vpmovzxbw %%xmm15, %%ymm" #i "\n\t"
#define Y_MOVSXBW(i) "vpmovsxbw %%xmm15, %%ymm" #i "\n\t"
#define Y_CVTDQ2PS(i) "vcvtdq2ps %%ymm15, %%ymm" #i "\n\t"
#define Y_CVTPS2DQ(i) "vcvtps2dq %%ymm15, %%ymm" #i "\n\t"
#define Y_CVTPH2PS(i) "vcvtph2ps %%xmm15, %%ymm" #i "\n\t"
#define Y_HADDPS(i) "vhaddps %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define Y_BCSTD(i) "vpbroadcastd 8(%%rsp), %%ymm" #i "\n\t"
#define Y_BASE8(B) B(0) B(1) B(2) B(3) B(4) B(5) B(6) B(7)
#define Y_ALONE(OP) OP(8) OP(9) OP(10) OP(11) OP(12) OP(13) OP(8) OP(9)
#define Y_MIX(B, OP) B(0) OP(8) B(1) OP(9) B(2) OP(10) B(3) OP(11) B(4) OP(12) B(5) OP(13) B(6) OP(8) B(7) OP(9)

// The dot products accumulate into zmm0 .. 7 (eight chains), the other kind writes zmm8 .. 15.
#define BASE8(B) B(0) B(1) B(2) B(3) B(4) B(5) B(6) B(7)
#define ALONE(OP) OP(8) OP(9) OP(10) OP(11) OP(12) OP(13) OP(14) OP(15)
#define MIX(B, OP) B(0) OP(8) B(1) OP(9) B(2) OP(10) B(3) OP(11) B(4) OP(12) B(5) OP(13) B(6) OP(14) B(7) OP(15)

#define LOOP(name, body)                                                                                           \
    static void name(long n) {                                                                                     \
        for (long i = 0; i < n; i++) __asm__ volatile(body ::: CLOBBERS);                                          \
    }
#define KIND(OP) LOOP(alone_##OP, ALONE(OP)) LOOP(bf_##OP, MIX(BF, OP)) LOOP(wssd_##OP, MIX(WSSD, OP))

LOOP(bf_alone, BASE8(BF))
LOOP(wssd_alone, BASE8(WSSD))
KIND(DPBUSD) KIND(WSSD) KIND(FMA) KIND(MULPS) KIND(PERMW) KIND(PERMT2W) KIND(PERMB) KIND(PERMT2B) KIND(PSHUFB)
KIND(SHUFI) KIND(MOVZXBW) KIND(MOVSXBD) KIND(CVTDQ2PS) KIND(CVTPH2PS) KIND(CVTNE2) KIND(SRLW) KIND(ANDD)
KIND(TERNLOG) KIND(BCSTD)

LOOP(y_alone, Y_BASE8(Y_MADDWD))
#define Y_KIND(OP) LOOP(y_alone_##OP, Y_ALONE(Y_##OP)) LOOP(y_mix_##OP, Y_MIX(Y_MADDWD, Y_##OP))
Y_KIND(MADDWD) Y_KIND(MADDUBSW) Y_KIND(SIGNB) Y_KIND(MULPS) Y_KIND(PADDD) Y_KIND(PADDW) Y_KIND(PABSB)
Y_KIND(PAND) Y_KIND(SRLW) Y_KIND(UNPCKLBW) Y_KIND(UNPCKLQDQ) Y_KIND(PSHUFB) Y_KIND(PERMPS) Y_KIND(INSERT)
Y_KIND(MOVZXBW) Y_KIND(MOVSXBW) Y_KIND(CVTDQ2PS) Y_KIND(CVTPS2DQ) Y_KIND(CVTPH2PS) Y_KIND(HADDPS) Y_KIND(BCSTD)

static void add_chain(long n) {
    long x = 0;
    for (long i = 0; i < n; i++) __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
}

// Nanoseconds per iteration of f, the best of three runs.
static double ns_per_iter(void (*f)(long)) {
    double best = 1e30;
    f(ITERS / 20);
    for (int r = 0; r < 3; r++) {
        const double t0 = now_ns();
        f(ITERS);
        const double t = (now_ns() - t0) / (double)ITERS;
        if (t < best) best = t;
    }
    return best;
}

// The 512-bit table (AVX512-VNNI).
static void zmm_table(double ghz) {
    const bool bf16 = __builtin_cpu_supports("avx512bf16"), vbmi = __builtin_cpu_supports("avx512vbmi");
    const char *base_name = bf16 ? "vdpbf16ps" : "vpdpwssd";
    const double base = ns_per_iter(bf16 ? bf_alone : wssd_alone) * ghz;
    printf("512-bit: 8 %s alone: %.2f cycles\n", base_name, base);
    printf("%-16s %10s %11s %-9s %10s\n", "8 of", "alone", "with 8", base_name, "each adds");
    const struct {
        const char *name;
        void (*alone)(long), (*bf)(long), (*wssd)(long);
        bool needs_bf16, needs_vbmi;
    } kinds[] = {
#define ROW(OP, text, b, v) {text, alone_##OP, bf_##OP, wssd_##OP, b, v},
        ROW(DPBUSD, "vpdpbusd", false, false) ROW(WSSD, "vpdpwssd", false, false) ROW(FMA, "vfmadd231ps", false, false)
        ROW(MULPS, "vmulps", false, false) ROW(PERMW, "vpermw", false, false) ROW(PERMT2W, "vpermt2w", false, false)
        ROW(PERMB, "vpermb", false, true) ROW(PERMT2B, "vpermt2b", false, true) ROW(PSHUFB, "vpshufb", false, false)
        ROW(SHUFI, "vshufi32x4", false, false) ROW(MOVZXBW, "vpmovzxbw", false, false)
        ROW(MOVSXBD, "vpmovsxbd", false, false) ROW(CVTDQ2PS, "vcvtdq2ps", false, false)
        ROW(CVTPH2PS, "vcvtph2ps", false, false) ROW(CVTNE2, "vcvtne2ps2bf16", true, false)
        ROW(SRLW, "vpsrlw", false, false) ROW(ANDD, "vpandd", false, false) ROW(TERNLOG, "vpternlogd", false, false)
        ROW(BCSTD, "dword broadcast", false, false)
#undef ROW
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        if ((kinds[k].needs_bf16 && !bf16) || (kinds[k].needs_vbmi && !vbmi)) continue;
        const double a = ns_per_iter(kinds[k].alone) * ghz, m = ns_per_iter(bf16 ? kinds[k].bf : kinds[k].wssd) * ghz;
        printf("%-16s %10.2f %21.2f %10.2f\n", kinds[k].name, a, m, (m - base) / 8.0);
    }
}

// The 256-bit table (AVX2, FMA, F16C).
static void ymm_table(double ghz) {
    const double base = ns_per_iter(y_alone) * ghz;
    printf("256-bit: 8 vpmaddwd alone: %.2f cycles\n", base);
    printf("%-16s %10s %11s %-9s %10s\n", "8 of", "alone", "with 8", "vpmaddwd", "each adds");
    const struct {
        const char *name;
        void (*alone)(long), (*mix)(long);
    } kinds[] = {
#define ROW(OP, text) {text, y_alone_##OP, y_mix_##OP},
        ROW(MADDWD, "vpmaddwd") ROW(MADDUBSW, "vpmaddubsw") ROW(SIGNB, "vpsignb") ROW(MULPS, "vmulps") ROW(PADDD, "vpaddd") ROW(PADDW, "vpaddw") ROW(PABSB, "vpabsb") ROW(PAND, "vpand")
        ROW(SRLW, "vpsrlw") ROW(UNPCKLBW, "vpunpcklbw") ROW(UNPCKLQDQ, "vpunpcklqdq") ROW(PSHUFB, "vpshufb")
        ROW(PERMPS, "vpermps") ROW(INSERT, "vinserti128") ROW(MOVZXBW, "vpmovzxbw") ROW(MOVSXBW, "vpmovsxbw")
        ROW(CVTDQ2PS, "vcvtdq2ps") ROW(CVTPS2DQ, "vcvtps2dq") ROW(CVTPH2PS, "vcvtph2ps") ROW(HADDPS, "vhaddps")
        ROW(BCSTD, "dword broadcast")
#undef ROW
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        const double a = ns_per_iter(kinds[k].alone) * ghz, m = ns_per_iter(kinds[k].mix) * ghz;
        printf("%-16s %10.2f %21.2f %10.2f\n", kinds[k].name, a, m, (m - base) / 8.0);
    }
}

int main(void) {
    __builtin_cpu_init();
    const bool zmm = __builtin_cpu_supports("avx512vnni");
    unsigned a, b, c, d; // F16C: CPUID leaf 1, ECX bit 29 (not every compiler's __builtin_cpu_supports knows it)
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
    const bool ymm = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    if (!zmm && !ymm) {
        fprintf(stderr, "zmm_mix: this CPU lacks AVX512-VNNI and AVX2\n");
        return 1;
    }
    const double ghz = 4.0 / ns_per_iter(add_chain); // four dependent adds an iteration
    printf("clock %.2f GHz (dependent adds)\n", ghz);
    if (zmm) zmm_table(ghz);
    if (ymm) ymm_table(ghz);
    return 0;
}

// zmm_mix.c - what a 512-bit instruction costs beside vdpbf16ps on this CPU: the cycles of a loop of
// 8 independent vdpbf16ps, of 8 independent instructions of another kind, and of the two interleaved.
// Where the two kinds run on separate pipes the mix takes as long as the slower kind alone; where
// they share pipes (as 512-bit operations do on a CPU that runs them as two 256-bit halves) it takes
// more: "each adds" is the mix's cycles beyond the 8 vdpbf16ps alone, per instruction of the other
// kind (1.00: it takes the dot products' pipes as if it were one). The decode kernels of the bf16
// tables (src/cpu/x86/quant_kernels_avx512vnni.c, quant_kernels_avx512bf16.c) spend about as many
// of these other instructions as dot products; BENCHMARKS.md reads their cost from this.
//
// Build and run (x86-64 with AVX512-BF16, AVX512-VNNI and AVX512-VBMI; one thread):
//   cc -O2 -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mavx512vnni -mavx512vbmi bench/zmm_mix.c -o zmm_mix
//   ./zmm_mix
// Cycles are wall time times the clock measured by a chain of dependent adds (one a cycle).
#define _POSIX_C_SOURCE 200809L
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

// vdpbf16ps accumulates into zmm0 .. 7 (eight chains), the other kind writes zmm8 .. 15.
#define BF8 BF(0) BF(1) BF(2) BF(3) BF(4) BF(5) BF(6) BF(7)
#define ALONE(OP) OP(8) OP(9) OP(10) OP(11) OP(12) OP(13) OP(14) OP(15)
#define MIX(OP) BF(0) OP(8) BF(1) OP(9) BF(2) OP(10) BF(3) OP(11) BF(4) OP(12) BF(5) OP(13) BF(6) OP(14) BF(7) OP(15)

#define LOOP(name, body)                                                                                           \
    static void name(long n) {                                                                                     \
        for (long i = 0; i < n; i++) __asm__ volatile(body ::: CLOBBERS);                                          \
    }
#define KIND(OP) LOOP(alone_##OP, ALONE(OP)) LOOP(mix_##OP, MIX(OP))

LOOP(bf_alone, BF8)
KIND(DPBUSD) KIND(MULPS) KIND(PERMW) KIND(PERMT2W) KIND(PSHUFB) KIND(SHUFI) KIND(MOVZXBW) KIND(MOVSXBD)
KIND(CVTDQ2PS) KIND(CVTPH2PS) KIND(CVTNE2) KIND(SRLW) KIND(ANDD) KIND(TERNLOG) KIND(BCSTD)

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

int main(void) {
    const double ghz = 4.0 / ns_per_iter(add_chain); // four dependent adds an iteration
    const double bf = ns_per_iter(bf_alone) * ghz;
    printf("clock %.2f GHz (dependent adds); 8 vdpbf16ps alone: %.2f cycles\n", ghz, bf);
    printf("%-16s %10s %16s %14s\n", "8 of", "alone", "with 8 vdpbf16ps", "each adds");
    const struct {
        const char *name;
        void (*alone)(long), (*mix)(long);
    } kinds[] = {
#define ROW(OP, text) {text, alone_##OP, mix_##OP},
        ROW(DPBUSD, "vpdpbusd") ROW(MULPS, "vmulps") ROW(PERMW, "vpermw") ROW(PERMT2W, "vpermt2w") ROW(PSHUFB, "vpshufb")
        ROW(SHUFI, "vshufi32x4") ROW(MOVZXBW, "vpmovzxbw") ROW(MOVSXBD, "vpmovsxbd") ROW(CVTDQ2PS, "vcvtdq2ps")
        ROW(CVTPH2PS, "vcvtph2ps") ROW(CVTNE2, "vcvtne2ps2bf16") ROW(SRLW, "vpsrlw") ROW(ANDD, "vpandd")
        ROW(TERNLOG, "vpternlogd") ROW(BCSTD, "dword broadcast")
#undef ROW
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        const double a = ns_per_iter(kinds[k].alone) * ghz, m = ns_per_iter(kinds[k].mix) * ghz;
        printf("%-16s %10.2f %16.2f %14.2f\n", kinds[k].name, a, m, (m - bf) / 8.0);
    }
    return 0;
}

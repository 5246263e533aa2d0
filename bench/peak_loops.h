// peak_loops.h - the loops that measure the machine's arithmetic peaks, shared by bench/peak.c and
// `attn bench`: per thread, 12 independent chains held in registers (enough to cover the latency
// on two pipes) of one instruction, timed on 1..T threads at once:
//   PEAK_FMA256  vfmadd (256-bit AVX2/FMA3):        2 * 8 flops per instruction
//   PEAK_FMA512  vfmadd (512-bit AVX-512F):         2 * 16 flops
//   PEAK_DPBF16  vdpbf16ps (512-bit AVX512-BF16):   2 * 32 flops (two bf16 products per fp32 lane)
// Each is compiled with a target attribute and run only after the CPU reports the extension, so
// the file builds with any x86-64 flags (elsewhere every kind is unsupported).
#ifndef ATTN_BENCH_PEAK_LOOPS_H
#define ATTN_BENCH_PEAK_LOOPS_H

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PEAK_X86 1
#else
#define PEAK_X86 0
#endif

typedef enum peak_kind { PEAK_FMA256 = 0, PEAK_FMA512 = 1, PEAK_DPBF16 = 2 } peak_kind;

static inline double peak_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline const char *peak_name(peak_kind k) {
    return k == PEAK_FMA256 ? "FMA (256-bit)" : k == PEAK_FMA512 ? "FMA (512-bit)" : "vdpbf16ps";
}

// Flops of one instruction of the kind.
static inline double peak_flops_per_op(peak_kind k) { return k == PEAK_FMA256 ? 16.0 : k == PEAK_FMA512 ? 32.0 : 64.0; }

static inline int peak_supported(peak_kind k) {
#if PEAK_X86
    __builtin_cpu_init();
    if (k == PEAK_FMA256) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (k == PEAK_FMA512) return __builtin_cpu_supports("avx512f");
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
#else
    (void)k;
    return 0;
#endif
}

typedef struct peak_job {
    long iters;
    peak_kind kind;
    double seconds;
    float sink;
} peak_job;

#define PEAK_CHAINS(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11)

#if PEAK_X86
__attribute__((target("avx2,fma"))) static void peak_run_fma256(peak_job *j) {
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
#define DECL(i) __m256 a##i = _mm256_set1_ps((float)(i));
#define STEP(i) a##i = _mm256_fmadd_ps(a##i, m, c);
#define SUM(i) s = _mm256_add_ps(s, a##i);
    PEAK_CHAINS(DECL)
    const double t0 = peak_now();
    for (long it = 0; it < j->iters; it++) {
        PEAK_CHAINS(STEP)
        __asm__ volatile("" ::: "memory");
    }
    j->seconds = peak_now() - t0;
    __m256 s = _mm256_setzero_ps();
    PEAK_CHAINS(SUM)
    float out[8];
    _mm256_storeu_ps(out, s);
    j->sink = out[0];
#undef DECL
#undef STEP
#undef SUM
}

__attribute__((target("avx512f"))) static void peak_run_fma512(peak_job *j) {
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
#define DECL(i) __m512 a##i = _mm512_set1_ps((float)(i));
#define STEP(i) a##i = _mm512_fmadd_ps(a##i, m, c);
#define SUM(i) s = _mm512_add_ps(s, a##i);
    PEAK_CHAINS(DECL)
    const double t0 = peak_now();
    for (long it = 0; it < j->iters; it++) {
        PEAK_CHAINS(STEP)
        __asm__ volatile("" ::: "memory");
    }
    j->seconds = peak_now() - t0;
    __m512 s = _mm512_setzero_ps();
    PEAK_CHAINS(SUM)
    j->sink = _mm512_reduce_add_ps(s);
#undef DECL
#undef STEP
#undef SUM
}

// acc += a[2i] * b[2i] + a[2i+1] * b[2i+1] per fp32 lane, the bf16 pairs small so the sums stay finite.
__attribute__((target("avx512f,avx512bf16"))) static void peak_run_dpbf16(peak_job *j) {
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3800), b = (__m512bh)_mm512_set1_epi16(0x2000); // 2^-15, 2^-63
#define DECL(i) __m512 a##i = _mm512_set1_ps((float)(i));
#define STEP(i) a##i = _mm512_dpbf16_ps(a##i, a, b);
#define SUM(i) s = _mm512_add_ps(s, a##i);
    PEAK_CHAINS(DECL)
    const double t0 = peak_now();
    for (long it = 0; it < j->iters; it++) {
        PEAK_CHAINS(STEP)
        __asm__ volatile("" ::: "memory");
    }
    j->seconds = peak_now() - t0;
    __m512 s = _mm512_setzero_ps();
    PEAK_CHAINS(SUM)
    j->sink = _mm512_reduce_add_ps(s);
#undef DECL
#undef STEP
#undef SUM
}
#endif

static void *peak_thread(void *arg) {
    peak_job *j = arg;
#if PEAK_X86
    if (j->kind == PEAK_FMA256) peak_run_fma256(j);
    else if (j->kind == PEAK_FMA512) peak_run_fma512(j);
    else peak_run_dpbf16(j);
#endif
    return NULL;
}

// Best aggregate GFLOP/s of `threads` threads running the loop at once over `reps` tries; 0 when
// the CPU lacks the instruction or threads cannot be started.
static double peak_measure(peak_kind kind, int threads, long iters, int reps, float *sink) {
    if (!peak_supported(kind) || threads < 1) return 0;
    peak_job *jobs = calloc((size_t)threads, sizeof *jobs);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    double best = 0;
    for (int rep = 0; rep < reps && jobs != NULL && th != NULL; rep++) {
        int started = 0;
        for (int t = 0; t < threads; t++) {
            jobs[t] = (peak_job){iters, kind, 0, 0};
            if (pthread_create(&th[t], NULL, peak_thread, &jobs[t]) != 0) break;
            started++;
        }
        double total = 0;
        for (int t = 0; t < started; t++) {
            pthread_join(th[t], NULL);
            total += peak_flops_per_op(kind) * 12 * (double)iters / jobs[t].seconds;
            *sink += jobs[t].sink;
        }
        if (started == threads && total > best) best = total;
    }
    free(jobs);
    free(th);
    return best / 1e9;
}

#endif

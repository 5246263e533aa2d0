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

#if PEAK_X86
// The timed loop over 12 chains a##i = STEP(a##i) of vector type V, started from SET1(i), then
// summed into a float with SUM_ALL so the chains stay live.
#define PEAK_TIMED_CHAINS(j, V, SET1, STEP, ADD, SUM_ALL)                                   \
    do {                                                                                   \
        V a0 = SET1(0.0f), a1 = SET1(1.0f), a2 = SET1(2.0f), a3 = SET1(3.0f), a4 = SET1(4.0f); \
        V a5 = SET1(5.0f), a6 = SET1(6.0f), a7 = SET1(7.0f), a8 = SET1(8.0f), a9 = SET1(9.0f); \
        V a10 = SET1(10.0f), a11 = SET1(11.0f);                                            \
        const double t0 = peak_now();                                                      \
        for (long it = 0; it < (j)->iters; it++) {                                         \
            a0 = STEP(a0), a1 = STEP(a1), a2 = STEP(a2), a3 = STEP(a3), a4 = STEP(a4);     \
            a5 = STEP(a5), a6 = STEP(a6), a7 = STEP(a7), a8 = STEP(a8), a9 = STEP(a9);     \
            a10 = STEP(a10), a11 = STEP(a11);                                              \
            __asm__ volatile("" ::: "memory");                                             \
        }                                                                                  \
        (j)->seconds = peak_now() - t0;                                                    \
        V s = ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7)));           \
        s = ADD(s, ADD(ADD(a8, a9), ADD(a10, a11)));                                       \
        (j)->sink = SUM_ALL(s);                                                            \
    } while (0)

__attribute__((target("avx2,fma"))) static float peak_sum256(__m256 s) {
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

__attribute__((target("avx2,fma"))) static void peak_run_fma256(peak_job *j) {
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
#define STEP(x) _mm256_fmadd_ps(x, m, c)
    PEAK_TIMED_CHAINS(j, __m256, _mm256_set1_ps, STEP, _mm256_add_ps, peak_sum256);
#undef STEP
}

__attribute__((target("avx512f"))) static void peak_run_fma512(peak_job *j) {
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
#define STEP(x) _mm512_fmadd_ps(x, m, c)
    PEAK_TIMED_CHAINS(j, __m512, _mm512_set1_ps, STEP, _mm512_add_ps, _mm512_reduce_add_ps);
#undef STEP
}

// acc += a[2i] * b[2i] + a[2i+1] * b[2i+1] per fp32 lane, the bf16 pairs small so the sums stay finite.
__attribute__((target("avx512f,avx512bf16"))) static void peak_run_dpbf16(peak_job *j) {
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3800), b = (__m512bh)_mm512_set1_epi16(0x2000); // 2^-15, 2^-63
#define STEP(x) _mm512_dpbf16_ps(x, a, b)
    PEAK_TIMED_CHAINS(j, __m512, _mm512_set1_ps, STEP, _mm512_add_ps, _mm512_reduce_add_ps);
#undef STEP
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

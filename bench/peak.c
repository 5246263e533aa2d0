// peak.c - measures the machine's fp32 fused multiply-add peak on 1..T threads: 12 independent
// FMA chains held in registers per thread (enough to cover the FMA latency on two pipes), with
// 256-bit AVX2/FMA3 and, when the CPU has it, 512-bit AVX-512F. Prints one JSON object:
//   {"threads": T, "avx2_gflops": G, "avx512_gflops": G or null}
// Best of 5 runs. Built on its own with -mavx2 -mfma -mavx512f (bench/run_bench.py does it);
// the AVX-512 loop only runs after __builtin_cpu_supports("avx512f").
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct job {
    long iters;
    int wide; // 0: ymm, 1: zmm
    double seconds;
    float sink;
} job;

#define CHAINS(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11)

static void run_ymm(job *j) {
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
#define DECL(i) __m256 a##i = _mm256_set1_ps((float)(i));
#define STEP(i) a##i = _mm256_fmadd_ps(a##i, m, c);
#define SUM(i) s = _mm256_add_ps(s, a##i);
    CHAINS(DECL)
    double t0 = now();
    for (long it = 0; it < j->iters; it++) {
        CHAINS(STEP)
        __asm__ volatile("" ::: "memory");
    }
    j->seconds = now() - t0;
    __m256 s = _mm256_setzero_ps();
    CHAINS(SUM)
    float out[8];
    _mm256_storeu_ps(out, s);
    j->sink = out[0];
#undef DECL
#undef STEP
#undef SUM
}

__attribute__((target("avx512f"))) static void run_zmm(job *j) {
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
#define DECL(i) __m512 a##i = _mm512_set1_ps((float)(i));
#define STEP(i) a##i = _mm512_fmadd_ps(a##i, m, c);
#define SUM(i) s = _mm512_add_ps(s, a##i);
    CHAINS(DECL)
    double t0 = now();
    for (long it = 0; it < j->iters; it++) {
        CHAINS(STEP)
        __asm__ volatile("" ::: "memory");
    }
    j->seconds = now() - t0;
    __m512 s = _mm512_setzero_ps();
    CHAINS(SUM)
    j->sink = _mm512_reduce_add_ps(s);
#undef DECL
#undef STEP
#undef SUM
}

static void *run(void *arg) {
    job *j = arg;
    if (j->wide) run_zmm(j);
    else run_ymm(j);
    return NULL;
}

// Best aggregate GFLOP/s of `threads` threads running the loop at once.
static double measure(int threads, int wide, long iters, float *sink) {
    job *jobs = calloc((size_t)threads, sizeof *jobs);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        for (int t = 0; t < threads; t++) {
            jobs[t] = (job){iters, wide, 0, 0};
            pthread_create(&th[t], NULL, run, &jobs[t]);
        }
        double total = 0;
        for (int t = 0; t < threads; t++) {
            pthread_join(th[t], NULL);
            total += 2.0 * (wide ? 16 : 8) * 12 * (double)iters / jobs[t].seconds;
            *sink += jobs[t].sink;
        }
        if (total > best) best = total;
    }
    free(jobs);
    free(th);
    return best / 1e9;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    long iters = argc > 2 ? atol(argv[2]) : 50000000L;
    if (threads < 1 || threads > 1024 || iters < 1) {
        fprintf(stderr, "usage: peak [THREADS [ITERATIONS]]\n");
        return 2;
    }
    float sink = 0;
    double avx2 = measure(threads, 0, iters, &sink);
    printf("{\"threads\": %d, \"avx2_gflops\": %.2f, ", threads, avx2);
    if (__builtin_cpu_supports("avx512f"))
        printf("\"avx512_gflops\": %.2f", measure(threads, 1, iters, &sink));
    else
        printf("\"avx512_gflops\": null");
    printf(", \"sink\": %g}\n", (double)sink);
    return 0;
}

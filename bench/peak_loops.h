// peak_loops.h - the loops that measure the machine's arithmetic peaks, shared by bench/peak.c and
// `attn bench`: per thread, 12 independent chains held in registers (enough to cover the latency
// on two pipes) of one instruction, timed on 1..T threads at once:
//   PEAK_FMA256  vfmadd (256-bit AVX2/FMA3):        2 * 8 flops per instruction
//   PEAK_FMA512  vfmadd (512-bit AVX-512F):         2 * 16 flops
//   PEAK_DPBF16  vdpbf16ps (512-bit AVX512-BF16):   2 * 32 flops (two bf16 products per fp32 lane)
//   PEAK_AMXBF16 tdpbf16ps (AMX-BF16 tiles):        2 * 16 * 16 * 32 flops, 6 accumulator tiles
//                (chains), iterations / 16 (one instruction takes about 16 cycles)
// Each is compiled with a target attribute and run only after the CPU reports the extension, so
// the file builds with any x86-64 flags (elsewhere every kind is unsupported).
#ifndef ATTN_BENCH_PEAK_LOOPS_H
#define ATTN_BENCH_PEAK_LOOPS_H

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#include <string.h>
#define PEAK_X86 1
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
long syscall(long number, ...); // glibc's, hidden from strict ISO C builds
#endif
#else
#define PEAK_X86 0
#endif

typedef enum peak_kind { PEAK_FMA256 = 0, PEAK_FMA512 = 1, PEAK_DPBF16 = 2, PEAK_AMXBF16 = 3 } peak_kind;

static inline double peak_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline const char *peak_name(peak_kind k) {
    return k == PEAK_FMA256 ? "FMA (256-bit)" : k == PEAK_FMA512 ? "FMA (512-bit)" : k == PEAK_DPBF16 ? "vdpbf16ps" : "tdpbf16ps";
}

// Flops of one instruction of the kind.
static inline double peak_flops_per_op(peak_kind k) {
    return k == PEAK_FMA256 ? 16.0 : k == PEAK_FMA512 ? 32.0 : k == PEAK_DPBF16 ? 64.0 : 16384.0;
}

// AMX-BF16 and AMX-TILE (CPUID leaf 7 EDX bits 22 and 24), the tile state enabled in XCR0 (bits 17
// and 18) and, on Linux, granted to the process (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA).
static inline int peak_amx_usable(void) {
#if PEAK_X86 && defined(__linux__)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || (d & (1u << 22)) == 0 || (d & (1u << 24)) == 0) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || (c & (1u << 27)) == 0) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0;
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}

static inline int peak_supported(peak_kind k) {
#if PEAK_X86
    __builtin_cpu_init();
    if (k == PEAK_FMA256) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (k == PEAK_FMA512) return __builtin_cpu_supports("avx512f");
    if (k == PEAK_AMXBF16) return peak_amx_usable();
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

// 12 tdpbf16ps an iteration into 6 accumulator tiles (0-5) from tiles 6 and 7 of small bf16 values;
// tile 0 summed into the sink.
__attribute__((target("amx-tile,amx-bf16"))) static void peak_run_amxbf16(peak_job *j) {
    unsigned char cfg[64];
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1; // palette 1; 8 tiles of 16 rows x 64 bytes
    for (int t = 0; t < 8; t++) cfg[16 + 2 * t] = 64, cfg[48 + t] = 16;
    static const unsigned short a = 0x3800, b = 0x2000; // 2^-15, 2^-63
    unsigned short ab[2][16 * 32];
    float out[16 * 16];
    for (int i = 0; i < 16 * 32; i++) ab[0][i] = a, ab[1][i] = b;
    _tile_loadconfig(cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
    _tile_loadd(6, ab[0], 64);
    _tile_loadd(7, ab[1], 64);
    const double t0 = peak_now();
    for (long it = 0; it < j->iters; it++) {
        for (int r = 0; r < 2; r++) { // the tile numbers are immediates: written out
            _tile_dpbf16ps(0, 6, 7);
            _tile_dpbf16ps(1, 6, 7);
            _tile_dpbf16ps(2, 6, 7);
            _tile_dpbf16ps(3, 6, 7);
            _tile_dpbf16ps(4, 6, 7);
            _tile_dpbf16ps(5, 6, 7);
        }
    }
    j->seconds = peak_now() - t0;
    _tile_stored(0, out, 64);
    _tile_release();
    for (int i = 0; i < 16 * 16; i++) j->sink += out[i];
}
#endif

static void *peak_thread(void *arg) {
    peak_job *j = arg;
#if PEAK_X86
    if (j->kind == PEAK_FMA256) peak_run_fma256(j);
    else if (j->kind == PEAK_FMA512) peak_run_fma512(j);
    else if (j->kind == PEAK_DPBF16) peak_run_dpbf16(j);
    else peak_run_amxbf16(j);
#else
    (void)j; // no loops for other CPUs: peak_supported says so
#endif
    return NULL;
}

// Best aggregate GFLOP/s of `threads` threads running the loop at once over `reps` tries; 0 when
// the CPU lacks the instruction or threads cannot be started.
static double peak_measure(peak_kind kind, int threads, long iters, int reps, float *sink) {
    if (!peak_supported(kind) || threads < 1) return 0;
    if (kind == PEAK_AMXBF16) iters = iters / 16 + 1;
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

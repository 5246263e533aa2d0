// peak.c - measures the machine's arithmetic peaks on 1..T threads (the loops of peak_loops.h):
// the fp32 fused multiply-add with 256-bit AVX2/FMA3 and, when the CPU has them, 512-bit AVX-512F
// and the bf16 dot products vdpbf16ps (AVX512-BF16) and tdpbf16ps (AMX-BF16). Prints one JSON object:
//   {"threads": T, "avx2_gflops": G, "avx512_gflops": G or null, "bf16_dot_gflops": G or null,
//    "amx_bf16_gflops": G or null}
// Best of 5 runs. Built on its own (bench/run_bench.py does it: cc -O2 -pthread bench/peak.c); each
// loop carries its own target attribute and runs only after the CPU reports its extension.
#include <stdio.h>
#include <stdlib.h>

#include "peak_loops.h"

static void print_peak(const char *key, peak_kind kind, int threads, long iters, float *sink) {
    if (peak_supported(kind))
        printf("\"%s\": %.2f", key, peak_measure(kind, threads, iters, 5, sink));
    else
        printf("\"%s\": null", key);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    long iters = argc > 2 ? atol(argv[2]) : 50000000L;
    if (threads < 1 || threads > 1024 || iters < 1) {
        fprintf(stderr, "usage: peak [THREADS [ITERATIONS]]\n");
        return 2;
    }
    float sink = 0;
    printf("{\"threads\": %d, ", threads);
    print_peak("avx2_gflops", PEAK_FMA256, threads, iters, &sink);
    printf(", ");
    print_peak("avx512_gflops", PEAK_FMA512, threads, iters, &sink);
    printf(", ");
    print_peak("bf16_dot_gflops", PEAK_DPBF16, threads, iters, &sink);
    printf(", ");
    print_peak("amx_bf16_gflops", PEAK_AMXBF16, threads, iters, &sink);
    printf(", \"sink\": %g}\n", (double)sink);
    return 0;
}

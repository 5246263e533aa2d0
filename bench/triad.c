// triad.c - the machine's memory bandwidth as STREAM measures it: a[i] = b[i] + s * c[i] over
// arrays far larger than the caches, split among T threads; bytes counted 3 * 4 * N per pass
// (two reads and a write, as STREAM counts them). Prints the best of R passes as JSON.
// Build: cc -O2 -pthread bench/triad.c -o triad; run: ./triad THREADS [MiB per array] [R]
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct part {
    float *a, *b, *c;
    size_t n;
} part;

static void *triad(void *arg) {
    part *p = arg;
    for (size_t i = 0; i < p->n; i++) p->a[i] = p->b[i] + 3.0f * p->c[i];
    return NULL;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 1;
    const size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 256;
    const int rounds = argc > 3 ? atoi(argv[3]) : 10;
    if (threads < 1 || threads > 256 || mib < 1 || rounds < 1) {
        fprintf(stderr, "usage: triad THREADS [MiB per array] [rounds]\n");
        return 2;
    }
    const size_t n = mib * 1048576 / sizeof(float);
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), *c = malloc(n * sizeof(float));
    if (a == NULL || b == NULL || c == NULL) {
        fprintf(stderr, "triad: out of memory\n");
        return 1;
    }
    pthread_t tid[256];
    part parts[256];
    const size_t chunk = n / (size_t)threads;
    for (int t = 0; t < threads; t++) { // first touch by the thread that will use the pages
        const size_t lo = (size_t)t * chunk, hi = t == threads - 1 ? n : lo + chunk;
        for (size_t i = lo; i < hi; i++) a[i] = 0.0f, b[i] = 1.0f, c[i] = 2.0f;
        parts[t] = (part){a + lo, b + lo, c + lo, hi - lo};
    }
    double best = 1e30;
    for (int r = 0; r < rounds; r++) {
        const double t0 = now();
        for (int t = 1; t < threads; t++) pthread_create(&tid[t], NULL, triad, &parts[t]);
        triad(&parts[0]);
        for (int t = 1; t < threads; t++) pthread_join(tid[t], NULL);
        const double dt = now() - t0;
        if (dt < best) best = dt;
    }
    printf("{\"threads\": %d, \"mib_per_array\": %zu, \"best_s\": %.6f, \"gbps\": %.2f, \"check\": %.1f}\n", threads, mib,
           best, 3.0 * 4.0 * (double)n / best / 1e9, (double)a[n / 2]);
    free(a), free(b), free(c);
    return 0;
}

// flash_kernels.c - the float32 forward's tile kernels of each kernel table this CPU runs, alone:
// the product S^T = K Q^T (gemm), the online softmax and P V (pv), on one work item's tiles of
// FLASH_BC keys against BR = 128 queries (attn__qk and the calls of flash_fwd.c), over TILES key
// and value tiles walked in turn (8 by default: in L2). Reports GFLOP/s for the two products (2 nj
// BR D each a tile), nanoseconds a tile for the softmax, and the three together as GFLOP/s of the
// tile's two products, each the fastest of PASSES passes, then the three together's median pass:
// the kernels' instruction cost without the rest of a forward call (the gathering of q, masks, the
// output). The query, score and output tiles are carved by the library's scratch arena, as a forward
// work item's are, so that their addresses lie against each other the same way, their rows
// attn__fwd_tile_ld(128) floats apart as the forward's (`unpadded`: 128, 512 bytes). Compare the
// products with the one-thread FMA peak of bench/peak.c measured in the same minute.
//
// More tiles than L2 holds (at D = 64, 24 KiB of keys and 24 of values a tile) make the kernels
// read them from L3 or memory; with `prefetch`, the three together request the next tile's key and
// value lines into L2 before each tile, as a forward work item does (flash_fwd.c's prefetch_tile).
//
// Build against the static library of a build directory (the kernel tables are internal):
//   cc -O2 -Iinclude -Isrc bench/flash_kernels.c build/libattn.a -lm -lpthread -o flash_kernels
// (make builds it too, as build/bench/flash_kernels, with the library's flags)
//   ./flash_kernels [D [TILES [prefetch] [unpadded]]]     (D = Dv, default 64; TILES default 8)
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn.h"
#include "cpu/cpu.h"
#include "cpu/flash.h"

#define BR 128   // queries of a work item (flash_fwd.c's FLASH_BR)
#define TILES 8     // key and value tiles walked in turn by default (in L2 at D = 64: 8 x 2 x 24 KiB)
#define MAX_TILES 4096
#define PASSES 300

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

typedef struct bufs {
    int64_t ld;         // the row stride of qt, st and ot
    float *qt;          // (D, BR): the queries transposed, as flash_fwd.c lays them out
    float *k, *v;       // tiles * FLASH_BC rows of D values
    int tiles;
    bool prefetch;      // ALL: request the next tile's lines into L2 first
    float *st;          // (FLASH_BC, BR) scores, then weights
    float *ot;          // (D, BR) output, transposed
    float m[BR] __attribute__((aligned(64))), l[BR] __attribute__((aligned(64))), alpha[BR] __attribute__((aligned(64)));
} bufs;

static float *alloc_floats(int64_t n) { return aligned_alloc(64, ((size_t)n * sizeof(float) + 63) / 64 * 64); }

// A fixed sequence of values in [-scale/2, scale/2).
static void fill(float *x, int64_t n, float scale, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * scale;
    }
}

enum { QK, SOFTMAX, PV, ALL, N_KERNELS };

// Requests the lines of n floats at p into L2.
static void prefetch_l2(const float *p, int64_t n) {
#if defined(__GNUC__)
    for (int64_t x = 0; x < n; x += 16) __builtin_prefetch(p + x, 0, 2);
#else
    (void)p, (void)n;
#endif
}

// One pass of kernel `which` over the tiles (ALL: the three in turn on each tile).
static void run(const attn__kernels *kn, int D, bufs *b, int which) {
    for (int t = 0; t < b->tiles; t++) {
        const float *kt = b->k + (int64_t)t * FLASH_BC * D, *vt = b->v + (int64_t)t * FLASH_BC * D;
        if (which == ALL && b->prefetch && t + 1 < b->tiles) {
            prefetch_l2(kt + (int64_t)FLASH_BC * D, (int64_t)FLASH_BC * D);
            prefetch_l2(vt + (int64_t)FLASH_BC * D, (int64_t)FLASH_BC * D);
        }
        if (which == QK || which == ALL) attn__qk(kn, kt, D, 1, FLASH_BC, D, b->qt, BR, b->ld, b->st);
        if (which == SOFTMAX || which == ALL) {
            for (int i = 0; i < BR; i++) b->m[i] = 2.0f; // the weights stay at most 1, as after a first tile
            kn->softmax(b->st, FLASH_BC, BR, b->ld, b->m, b->l, b->alpha);
        }
        if (which == PV || which == ALL) kn->pv(vt, D, 1, FLASH_BC, D, b->st, BR, b->ld, b->alpha, b->ot);
    }
}

static const attn_isa isas[] = {ATTN_ISA_GENERIC, ATTN_ISA_AVX2, ATTN_ISA_AVX512, ATTN_ISA_AVX512_VNNI,
                                ATTN_ISA_AVX512_BF16, ATTN_ISA_AMX_BF16};

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const int D = argc > 1 ? atoi(argv[1]) : 64, tiles = argc > 2 ? atoi(argv[2]) : TILES;
    bool prefetch = false, unpadded = false, bad = argc > 5;
    for (int a = 3; a < argc; a++) {
        if (strcmp(argv[a], "prefetch") == 0) prefetch = true;
        else if (strcmp(argv[a], "unpadded") == 0) unpadded = true;
        else bad = true;
    }
    if (D < 1 || D > 512 || tiles < 1 || tiles > MAX_TILES || bad) {
        fprintf(stderr, "usage: %s [D [TILES [prefetch] [unpadded]]]   (D = Dv, 1 to 512; TILES 1 to %d, default %d)\n",
                argv[0], MAX_TILES, TILES);
        return 2;
    }
    const int passes = tiles <= TILES ? PASSES : (PASSES * TILES / tiles > 20 ? PASSES * TILES / tiles : 20);
    bufs b;
    b.tiles = tiles, b.prefetch = prefetch, b.ld = unpadded ? BR : attn__fwd_tile_ld(BR);
    // the three tiles carved from one block by the library's scratch arena, in flash_fwd.c's order,
    // so that they lie against each other as a forward work item's do (attn__arena_take)
    attn__arena sized = {0};
    const size_t qt_bytes = (size_t)D * (size_t)b.ld * sizeof(float), st_bytes = (size_t)FLASH_BC * (size_t)b.ld * sizeof(float);
    (void)attn__arena_take(&sized, qt_bytes), (void)attn__arena_take(&sized, st_bytes), (void)attn__arena_take(&sized, qt_bytes);
    char *tiles_block = aligned_alloc(4096, (sized.used + 4095) / 4096 * 4096);
    attn__arena carve = {.base = tiles_block};
    b.qt = attn__arena_take(&carve, qt_bytes), b.st = attn__arena_take(&carve, st_bytes), b.ot = attn__arena_take(&carve, qt_bytes);
    b.k = alloc_floats((int64_t)tiles * FLASH_BC * D), b.v = alloc_floats((int64_t)tiles * FLASH_BC * D);
    double *all_t = malloc(sizeof(double) * (size_t)passes);
    if (tiles_block == NULL || b.st == NULL || b.ot == NULL || b.k == NULL || b.v == NULL || all_t == NULL) return 1;
    // q pre-scaled as flash_fwd.c scales it (1/sqrt(D) log2(e)), so the scores stay small
    fill(b.qt, (int64_t)D * b.ld, 3.0f * 1.4426950f / sqrtf((float)D), 1u);
    fill(b.k, (int64_t)tiles * FLASH_BC * D, 3.0f, 2u);
    fill(b.v, (int64_t)tiles * FLASH_BC * D, 3.0f, 3u);
    const double flops = 2.0 * FLASH_BC * BR * D * tiles; // one product over the tiles
    printf("forward tile kernels, float32, %d queries x %d keys a tile (rows %d floats apart), D = Dv = %d, %d tiles "
           "in turn (%.2f MiB of K and V)%s, one thread (fastest of %d; all: also the median)\n",
           BR, FLASH_BC, (int)b.ld, D, tiles, 2.0 * tiles * FLASH_BC * D * sizeof(float) / 1048576.0,
           prefetch ? ", the next tile prefetched" : "", passes);
    printf("%-12s %12s %12s %12s %12s %12s\n", "isa", "qk GFLOP/s", "softmax ns", "P V GFLOP/s", "all GFLOP/s", "all median");
    double sink = 0.0;
    for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++) {
        bool ok = true;
        const attn__kernels *kn = attn__kernels_for(isas[ii], &ok);
        if (!ok || kn == NULL) continue;
        for (int i = 0; i < BR; i++) b.m[i] = 2.0f, b.l[i] = 0.0f, b.alpha[i] = 1.0f;
        memset(b.ot, 0, qt_bytes);
        double best[N_KERNELS] = {1e30, 1e30, 1e30, 1e30};
        for (int p = 0; p < passes; p++) {
            for (int w = 0; w < N_KERNELS; w++) {
                const double t0 = now_ns();
                run(kn, D, &b, w);
                const double t = now_ns() - t0;
                if (t < best[w]) best[w] = t;
                if (w == ALL) all_t[p] = t;
            }
            memset(b.ot, 0, qt_bytes); // P V's sums stay bounded
        }
        qsort(all_t, (size_t)passes, sizeof(double), cmp_double);
        printf("%-12s %12.1f %12.1f %12.1f %12.1f %12.1f\n", attn_isa_name(isas[ii]), flops / best[QK],
               best[SOFTMAX] / tiles, flops / best[PV], 2.0 * flops / best[ALL], 2.0 * flops / all_t[passes / 2]);
        run(kn, D, &b, ALL);
        sink += (double)b.ot[1] + (double)b.ot[(int64_t)(D - 1) * b.ld + BR - 1] + (double)b.l[0];
    }
    printf("(sink %g)\n", sink);
    free(tiles_block), free(b.k), free(b.v), free(all_t);
    return 0;
}

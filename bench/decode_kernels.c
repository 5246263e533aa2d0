// decode_kernels.c - the decode row kernels of each kernel table this CPU runs (every form of an
// ISA: attn__kernel_tables), alone: q . k (qk_rows / qk_rows_q, with prep_q where the table has
// one), the online softmax and P V (pv_rows / pv_rows_q) on one GQA group's four query rows against
// tiles of FLASH_BC keys that stay in L2 (16 tiles of keys and values, walked in turn), so that the
// figures are the kernels' instruction cost without the wait for memory that a decoding step over a
// long cache adds. Reports nanoseconds per key (and kv head) for each kernel, the fastest of many
// passes, for the cache types f16, q8_0 and q4_0 at D = Dv = 128 (or the head dim given). A decoding
// step of `attn bench --op decode` costs at least the sum per key and kv head, times the keys and kv
// heads, over the threads.
//
// With `stream`, the three kernels run in turn on each tile, as one work item of a decoding step
// does, over the same 16 tiles in L2 and then over a cache of STREAM_KEYS keys in memory (the keys
// and values of the 8 kv heads of `attn bench --op decode --len-kv 32768`, end to end; the cache on
// huge pages where the system gives them, 64 MiB of other data written between passes): the
// difference is what one thread waits for memory that its prefetches do not hide.
//
// Build against the static library of a build directory (the kernel tables are internal):
//   cc -O2 -Iinclude -Isrc bench/decode_kernels.c build/libattn.a -lm -lpthread -o decode_kernels
// (make builds it too, as build/bench/decode_kernels, with the library's flags)
//   ./decode_kernels [D] [stream]
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
#include "internal.h"

#define ROWS 4    // a GQA group of four query heads, one query each
#define TILES 16  // key tiles walked in turn (in L2 for D = 128 and the types below)
#define PASSES 400
#define STREAM_KEYS (8 * 32768) // stream: keys of the cache in memory
#define STREAM_PASSES 9
#define EVICT_BYTES ((size_t)64 << 20)

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

typedef struct bufs {
    void *k, *v;          // TILES * FLASH_BC rows of D values of the type
    size_t row_bytes;
    float q[ROWS * 1024]; // (ROWS, D)
    float st[FLASH_BC * ROWS], m[ROWS], l[ROWS], alpha[ROWS], o[ROWS * 1024];
    void *prep;
} bufs;

// Random values (standard-normal-ish, a fixed sequence) converted by attn_convert into n elements
// of type dt at out, a chunk at a time.
static int fill_into(attn_dtype dt, int64_t n, void *out) {
    const int64_t chunk = 1 << 16; // a multiple of the block size
    float *x = malloc((size_t)chunk * sizeof(float));
    if (x == NULL) return -1;
    uint32_t s = 12345;
    for (int64_t i0 = 0; i0 < n; i0 += chunk) {
        const int64_t c = n - i0 < chunk ? n - i0 : chunk;
        for (int64_t i = 0; i < c; i++) {
            s = s * 1664525u + 1013904223u;
            x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 3.0f;
        }
        char *dst = (char *)out + (size_t)i0 * attn_dtype_size(dt) / (size_t)attn_dtype_block_size(dt);
        if (attn_convert(dt, dst, ATTN_DTYPE_F32, x, c) != ATTN_OK) {
            free(x);
            return -1;
        }
    }
    free(x);
    return 0;
}

static int fill(attn_dtype dt, int64_t n, void **out) {
    *out = aligned_alloc(64, ((size_t)n * attn_dtype_size(dt) / (size_t)attn_dtype_block_size(dt) + 63) / 64 * 64);
    return *out == NULL ? -1 : fill_into(dt, n, *out);
}

// The row kernels of table kn on one key tile: q.k of b's query rows against the nj (at most
// FLASH_BC) key rows at kt into b->st (through prep_q's form where the table has one), and P V of
// b->st's weights with the nj value rows at vt into b->o.
static void qk_tile(const attn__kernels *kn, attn_dtype dt, int D, const void *kt, int nj, bufs *b) {
    if (!attn__is_block_dtype(dt)) kn->qk_rows(dt, kt, D, nj, D, b->q, ROWS, b->st, 1, ROWS);
    else kn->qk_rows_q(dt, kt, D, nj, D, kn->prep_q != NULL ? b->prep : (void *)b->q, ROWS, b->st, 1, ROWS);
}

static void pv_tile(const attn__kernels *kn, attn_dtype dt, int D, const void *vt, int nj, bufs *b) {
    (attn__is_block_dtype(dt) ? kn->pv_rows_q : kn->pv_rows)(dt, vt, D, nj, D, b->st, ROWS, b->alpha, ROWS, b->o, D);
}

// One kernel's time per key, the fastest pass over the TILES tiles (ns).
enum { QK, SOFTMAX, PV, N_KERNELS };

static void run(const attn__kernels *kn, attn_dtype dt, int D, bufs *b, int which) {
    for (int t = 0; t < TILES; t++) {
        const char *kt = (const char *)b->k + (size_t)t * FLASH_BC * b->row_bytes;
        const char *vt = (const char *)b->v + (size_t)t * FLASH_BC * b->row_bytes;
        if (which == QK) {
            qk_tile(kn, dt, D, kt, FLASH_BC, b);
        } else if (which == SOFTMAX) {
            for (int r = 0; r < ROWS; r++) b->m[r] = 4.0f; // the weights stay below 1, as after a first tile
            kn->softmax(b->st, FLASH_BC, ROWS, ROWS, b->m, b->l, b->alpha);
        } else {
            pv_tile(kn, dt, D, vt, FLASH_BC, b);
        }
    }
}

// stream: the three kernels in turn on each of the tiles of nkeys keys at k and v (rows of D
// values of type dt, row_bytes apart), as a decoding step's work item runs them; returns the
// fastest pass's nanoseconds per key. With evict, EVICT_BYTES of other data are written between
// passes, so that each pass reads the cache from memory.
static double walk(const attn__kernels *kn, attn_dtype dt, int D, const void *k, const void *v, int64_t nkeys,
                   bufs *b, char *evict, int passes) {
    double best = 1e30;
    for (int p = 0; p < passes; p++) {
        if (evict != NULL) memset(evict, p, EVICT_BYTES);
        for (int r = 0; r < ROWS; r++) b->m[r] = -INFINITY, b->l[r] = 0.0f;
        const double t0 = now_ns();
        for (int64_t j0 = 0; j0 < nkeys; j0 += FLASH_BC) { // the last tile holds what is left
            const int nj = nkeys - j0 < FLASH_BC ? (int)(nkeys - j0) : FLASH_BC;
            const char *kt = (const char *)k + (size_t)j0 * b->row_bytes;
            const char *vt = (const char *)v + (size_t)j0 * b->row_bytes;
            qk_tile(kn, dt, D, kt, nj, b);
            kn->softmax(b->st, nj, ROWS, ROWS, b->m, b->l, b->alpha);
            pv_tile(kn, dt, D, vt, nj, b);
        }
        const double t = (now_ns() - t0) / (double)nkeys;
        if (t < best) best = t;
    }
    return best;
}

static const attn_isa isas[] = {ATTN_ISA_GENERIC, ATTN_ISA_AVX2, ATTN_ISA_AVX512, ATTN_ISA_AVX512_VNNI,
                                ATTN_ISA_AVX512_BF16, ATTN_ISA_AMX_BF16};
static const attn_dtype types[] = {ATTN_DTYPE_F16, ATTN_DTYPE_Q8_0, ATTN_DTYPE_Q4_0};
static const char *const type_names[] = {"f16", "q8_0", "q4_0"};

// The kernels alone, tiles in L2 (the default).
static int kernels_alone(int D, bufs *b) {
    printf("decode row kernels, %d query rows, D = Dv = %d, %d tiles of %d keys in turn, ns per key (fastest of %d)\n",
           ROWS, D, TILES, FLASH_BC, PASSES);
    printf("%-16s %-5s %8s %8s %8s %8s\n", "kernels", "kv", "q.k", "softmax", "P V", "sum");
    for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++) {
        const attn__kernels *forms[ATTN_MAX_ISA_TABLES];
        const int n_forms = attn__kernel_tables(isas[ii], forms);
        for (int fi = 0; fi < n_forms; fi++) {
            for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
                const attn__kernels *kn = forms[fi];
                const attn_dtype dt = types[ti];
                const int64_t n = (int64_t)TILES * FLASH_BC * D;
                if (fill(dt, n, &b->k) != 0 || fill(dt, n, &b->v) != 0) return 1;
                b->row_bytes = (size_t)D * attn_dtype_size(dt) / (size_t)attn_dtype_block_size(dt);
                if (kn->prep_q != NULL) kn->prep_q(dt, b->q, ROWS, D, b->prep);
                double best[N_KERNELS] = {1e30, 1e30, 1e30};
                for (int p = 0; p < PASSES; p++)
                    for (int w = 0; w < N_KERNELS; w++) {
                        const double t0 = now_ns();
                        run(kn, dt, D, b, w);
                        const double t = (now_ns() - t0) / (TILES * FLASH_BC);
                        if (t < best[w]) best[w] = t;
                    }
                printf("%-16s %-5s %8.2f %8.2f %8.2f %8.2f\n", kn->name, type_names[ti], best[QK], best[SOFTMAX], best[PV],
                       best[QK] + best[SOFTMAX] + best[PV]);
                free(b->k), free(b->v);
            }
        }
    }
    return 0;
}

// stream: the kernels in turn, tiles in L2 against a cache in memory.
static int streaming(int D, bufs *b) {
    attn_ctx *ctx = NULL;
    if (attn_ctx_create(NULL, &ctx) != ATTN_OK) return 1;
    char *evict = malloc(EVICT_BYTES);
    if (evict == NULL) return 1;
    printf("decode row kernels in turn a tile (q.k, softmax, P V), %d query rows, D = Dv = %d, one thread, ns per key\n"
           "in L2: %d tiles of %d keys (fastest of %d passes); memory: %d keys (fastest of %d, %zu MiB written between)\n",
           ROWS, D, TILES, FLASH_BC, PASSES / 4, STREAM_KEYS, STREAM_PASSES, EVICT_BYTES >> 20);
    printf("%-16s %-5s %9s %8s %8s %8s %10s\n", "kernels", "kv", "MiB K+V", "in L2", "memory", "ratio", "GB/s");
    int rc = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0] && rc == 0; ti++) {
        const attn_dtype dt = types[ti];
        b->row_bytes = (size_t)D * attn_dtype_size(dt) / (size_t)attn_dtype_block_size(dt);
        const size_t bytes = (size_t)STREAM_KEYS * b->row_bytes;
        void *bk = NULL, *bv = NULL;
        const int64_t n = (int64_t)TILES * FLASH_BC * D;
        if (attn__alloc_large(ctx, bytes, &bk) != ATTN_OK || attn__alloc_large(ctx, bytes, &bv) != ATTN_OK ||
            fill_into(dt, (int64_t)STREAM_KEYS * D, bk) != 0 || fill_into(dt, (int64_t)STREAM_KEYS * D, bv) != 0 ||
            fill(dt, n, &b->k) != 0 || fill(dt, n, &b->v) != 0) {
            rc = 1;
        } else {
            for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++) {
                const attn__kernels *forms[ATTN_MAX_ISA_TABLES];
                const int n_forms = attn__kernel_tables(isas[ii], forms);
                for (int fi = 0; fi < n_forms; fi++) {
                    const attn__kernels *kn = forms[fi];
                    if (kn->prep_q != NULL) kn->prep_q(dt, b->q, ROWS, D, b->prep);
                    const double near = walk(kn, dt, D, b->k, b->v, (int64_t)TILES * FLASH_BC, b, NULL, PASSES / 4);
                    const double far = walk(kn, dt, D, bk, bv, STREAM_KEYS, b, evict, STREAM_PASSES);
                    printf("%-16s %-5s %9.1f %8.2f %8.2f %8.2f %10.2f\n", kn->name, type_names[ti],
                           2.0 * (double)bytes / 1048576.0, near, far, far / near, 2.0 * (double)b->row_bytes / far);
                }
            }
        }
        free(b->k), free(b->v);
        b->k = b->v = NULL;
        attn__free(ctx, bk), attn__free(ctx, bv);
    }
    free(evict);
    attn_ctx_free(ctx);
    return rc;
}

int main(int argc, char **argv) {
    const int D = argc > 1 ? atoi(argv[1]) : 128;
    const bool stream = argc > 2 && strcmp(argv[2], "stream") == 0;
    if (D < 32 || D > 1024 || D % 32 != 0 || argc > 3 || (argc > 2 && !stream)) {
        fprintf(stderr, "usage: %s [D [stream]]   (D a multiple of 32, at most 1024)\n", argv[0]);
        return 2;
    }
    bufs *b = aligned_alloc(64, (sizeof(bufs) + 63) / 64 * 64);
    if (b == NULL) return 1;
    memset(b, 0, sizeof *b);
    b->prep = aligned_alloc(64, (ATTN_QPREP_BYTES(ROWS, D) + 63) / 64 * 64);
    if (b->prep == NULL) return 1;
    for (int i = 0; i < ROWS * D; i++) b->q[i] = 0.02f * (float)((i * 37) % 101 - 50);
    const int rc = stream ? streaming(D, b) : kernels_alone(D, b);
    printf("(sink %g)\n", (double)b->o[1] + (double)b->st[3]);
    free(b->prep), free(b);
    return rc;
}

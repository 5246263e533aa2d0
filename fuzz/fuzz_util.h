/*
 * fuzz_util.h - what the fuzz targets share: the invariant check that aborts (so libFuzzer and
 * the replay driver report it), an allocator for contexts that counts live blocks (a leak check
 * that works without a sanitizer), refuses requests over a cap and can fail one chosen call, the
 * run of a call with each of its allocations failing in turn, the check of the error-reporting
 * contract, and helpers for exactly sized buffers and checked size arithmetic.
 */
#ifndef ATTN_FUZZ_UTIL_H
#define ATTN_FUZZ_UTIL_H

#include <dirent.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"

/* An invariant of the library failed: say which and where, then abort (reported as a crash). */
#define FUZZ_CHECK(cond, ...)                                                              \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "fuzz: %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

/* ---- allocator hooks ------------------------------------------------------------------------- */

/* Counters are atomic: a context's worker threads may allocate too. */
typedef struct fuzz_alloc {
    atomic_size_t live;           /* blocks handed out and not freed yet */
    atomic_uint_fast64_t calls;   /* allocation requests so far */
    atomic_uint_fast64_t refused; /* requests answered with NULL since the last fuzz_alloc_arm */
    uint64_t fail_at;             /* the request number (1-based) that gets NULL; 0 for none */
    size_t cap;                   /* requests above this many bytes get NULL; 0 for no cap */
} fuzz_alloc;

static inline size_t fuzz_alloc_live(fuzz_alloc *a) { return atomic_load(&a->live); }
static inline uint64_t fuzz_alloc_calls(fuzz_alloc *a) { return (uint64_t)atomic_load(&a->calls); }
static inline uint64_t fuzz_alloc_refused(fuzz_alloc *a) { return (uint64_t)atomic_load(&a->refused); }

static inline void *fuzz_alloc_fn(void *user, size_t size, size_t align) {
    fuzz_alloc *a = user;
    const uint64_t n = (uint64_t)atomic_fetch_add(&a->calls, 1) + 1;
    FUZZ_CHECK(align != 0 && (align & (align - 1)) == 0, "alignment %zu is not a power of two", align);
    if (n == a->fail_at || (a->cap != 0 && size > a->cap)) {
        atomic_fetch_add(&a->refused, 1);
        return NULL;
    }
    void *p = NULL;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size > 0 ? size : 1) != 0) {
        atomic_fetch_add(&a->refused, 1);
        return NULL;
    }
    atomic_fetch_add(&a->live, 1);
    return p;
}

static inline void fuzz_free_fn(void *user, void *p) {
    fuzz_alloc *a = user;
    if (p == NULL) return;
    FUZZ_CHECK(atomic_fetch_sub(&a->live, 1) > 0, "free of a block this allocator did not hand out");
    free(p);
}

/* Creates a context whose memory goes through `a`. Aborts if that fails (it is not under test). */
static inline attn_ctx *fuzz_ctx_new(fuzz_alloc *a, attn_isa isa, int n_threads, uint64_t seed) {
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.isa = isa;
    p.n_threads = n_threads;
    p.seed = seed;
    p.allocator.alloc = fuzz_alloc_fn;
    p.allocator.free = fuzz_free_fn;
    p.allocator.user = a;
    attn_ctx *ctx = NULL;
    const uint64_t fail_at = a->fail_at;
    a->fail_at = 0;
    const attn_status st = attn_ctx_create(&p, &ctx);
    a->fail_at = fail_at;
    FUZZ_CHECK(st == ATTN_OK && ctx != NULL, "attn_ctx_create: %s", attn_strerror(st));
    return ctx;
}

/* Arms the allocator for one call: request number `nth` from now fails (0: none). */
static inline void fuzz_alloc_arm(fuzz_alloc *a, uint64_t nth) {
    a->fail_at = nth == 0 ? 0 : fuzz_alloc_calls(a) + nth;
    atomic_store(&a->refused, 0);
}

/* ---- the error contract -------------------------------------------------------------------- */

/* The statuses attn.h defines (ATTN_ERR_DEVICE is the last). */
static inline bool fuzz_status_known(attn_status st) { return (int)st >= 0 && (int)st <= (int)ATTN_ERR_DEVICE; }

/* A failure on a context leaves a one-line message there (attn.h, "Conventions"). */
static inline void fuzz_check_error(const attn_ctx *ctx, attn_status st, const char *what) {
    FUZZ_CHECK(fuzz_status_known(st), "%s returned the unknown status %d", what, (int)st);
    FUZZ_CHECK(attn_strerror(st) != NULL, "attn_strerror(%d) is NULL", (int)st);
    if (st == ATTN_OK || ctx == NULL) return;
    const char *msg = attn_ctx_last_error(ctx);
    FUZZ_CHECK(msg != NULL && msg[0] != '\0', "%s failed with %s and no message", what, attn_strerror(st));
    FUZZ_CHECK(strchr(msg, '\n') == NULL, "%s: the message has a newline: %s", what, msg);
}

/* A fuzz input, as the `user` of a call that parses it. */
typedef struct fuzz_input {
    const uint8_t *data;
    size_t size;
} fuzz_input;

/* A call under test, on ctx, with what it needs in `user`. */
typedef attn_status (*fuzz_call_fn)(attn_ctx *ctx, void *user);

/*
 * Runs call(ctx, user) n times, the k-th time with its k-th allocation request failing (the call
 * must make the same requests each time): each run must return ATTN_ERR_OUT_OF_MEMORY with a
 * message on ctx and free every block it took. `what` names the call in the messages; `call` checks
 * what the call leaves in its outputs.
 */
static inline void fuzz_fail_each_alloc(fuzz_alloc *a, attn_ctx *ctx, uint64_t n, fuzz_call_fn call, void *user,
                                        const char *what) {
    for (uint64_t k = 1; k <= n; k++) {
        const size_t live = fuzz_alloc_live(a);
        fuzz_alloc_arm(a, k);
        const attn_status st = call(ctx, user);
        a->fail_at = 0;
        FUZZ_CHECK(st == ATTN_ERR_OUT_OF_MEMORY, "allocation %llu failing gave %s", (unsigned long long)k,
                   attn_strerror(st));
        fuzz_check_error(ctx, st, what);
        FUZZ_CHECK(fuzz_alloc_live(a) == live, "%zu blocks leaked after an allocation failure",
                   fuzz_alloc_live(a) - live);
    }
}

/* ---- buffers ---------------------------------------------------------------------------------- */

/* malloc of exactly `bytes` (at least 1) so that AddressSanitizer sees any access past the end. */
static inline void *fuzz_xmalloc(size_t bytes) {
    void *p = malloc(bytes > 0 ? bytes : 1);
    FUZZ_CHECK(p != NULL, "out of memory (%zu bytes)", bytes);
    return p;
}

/* A buffer of exactly `len` bytes holding the first `copy_len` bytes of src (at most len), zeros
 * after them: an input cut short or lengthened, with AddressSanitizer watching its end. */
static inline uint8_t *fuzz_copy_exact(const uint8_t *src, size_t len, size_t copy_len) {
    uint8_t *buf = fuzz_xmalloc(len);
    if (len > 0) {
        memset(buf, 0, len);
        memcpy(buf, src, copy_len < len ? copy_len : len);
    }
    return buf;
}

/* Overflow-checked a*b and a+b on non-negative int64 values; false (and *out unchanged) on
 * overflow or a negative operand. */
static inline bool fuzz_mul(int64_t a, int64_t b, int64_t *out) {
    int64_t r;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}

static inline bool fuzz_add(int64_t a, int64_t b, int64_t *out) {
    int64_t r;
    if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}

/* Product of n sizes (each >= 0); false on overflow. */
static inline bool fuzz_prod(int n, const int64_t *v, int64_t *out) {
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        if (!fuzz_mul(p, v[i], &p)) return false;
    *out = p;
    return true;
}

/* A tolerance comparison: NaN only against NaN, an infinity only against the same infinity. */
static inline bool fuzz_close(float a, float b, double rel, double abs_tol) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b)) return a == b;
    if (a == b) return true;
    /* b = 0 takes no relative part: under an infinite tolerance rel * 0 would be NaN */
    return fabs((double)a - (double)b) <= abs_tol + (b == 0.0f ? 0.0 : rel * fabs((double)b));
}

/* ---- files ---------------------------------------------------------------------------------- */

static char fuzz_scratch[512];

/* Removes the scratch directory and what the targets left in it (at exit). */
static inline void fuzz_scratch_remove(void) {
    DIR *d = opendir(fuzz_scratch);
    if (d == NULL) return;
    char path[1024];
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(path, sizeof path, "%s/%s", fuzz_scratch, e->d_name);
            remove(path);
        }
    closedir(d);
    remove(fuzz_scratch);
}

/* A directory of this process's own (made once under $TMPDIR or /tmp, removed at exit) where the
 * targets of the file writers write. */
static inline const char *fuzz_scratch_dir(void) {
    if (fuzz_scratch[0] == 0) {
        const char *tmp = getenv("TMPDIR");
        snprintf(fuzz_scratch, sizeof fuzz_scratch, "%s/attn-fuzz-XXXXXX", tmp != NULL && tmp[0] != 0 ? tmp : "/tmp");
        FUZZ_CHECK(mkdtemp(fuzz_scratch) != NULL, "cannot make a scratch directory %s", fuzz_scratch);
        atexit(fuzz_scratch_remove);
    }
    return fuzz_scratch;
}

/* The whole file at path (malloc'd, *len its size), or NULL when it cannot be read. */
static inline uint8_t *fuzz_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    size_t cap = 4096, n = 0;
    uint8_t *buf = fuzz_xmalloc(cap);
    for (size_t got; (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            uint8_t *bigger = realloc(buf, cap *= 2);
            FUZZ_CHECK(bigger != NULL, "out of memory reading %s", path);
            buf = bigger;
        }
    }
    fclose(f);
    *len = n;
    return buf;
}

/* How many entries other than . and .. the directory holds (a writer must leave no temporary
 * file behind). */
static inline int fuzz_dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    FUZZ_CHECK(d != NULL, "cannot list %s", dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* A write that had to be refused (status st, made over the file at path, which held `before`,
 * len bytes): it failed with a message, the file holds the same bytes, and nothing else is left in
 * its directory (the writers write whole files or none, through a temporary beside the file). */
static inline void fuzz_check_refused_write(const attn_ctx *ctx, attn_status st, const char *dir, const char *path,
                                            const uint8_t *before, size_t len, const char *what) {
    fuzz_check_error(ctx, st, what);
    FUZZ_CHECK(st != ATTN_OK, "%s was accepted", what);
    size_t after_len;
    uint8_t *after = fuzz_read_file(path, &after_len);
    FUZZ_CHECK(after != NULL && after_len == len && memcmp(after, before, len) == 0, "%s changed the file", what);
    const int n = fuzz_dir_entries(dir);
    FUZZ_CHECK(n == 1, "%d entries beside the file after %s", n - 1, what);
    free(after);
}

#endif /* ATTN_FUZZ_UTIL_H */

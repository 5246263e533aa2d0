// file.c - the file helpers declared in file.h: bounded whole-file reads, exact sequential reads
// and atomic writes (temporary file + fsync + rename), on POSIX systems.
// It does not do: Windows support, memory mapping, advisory locking.
#include "io/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FILE_PATH_TAIL 96
// Largest single read()/write() request (some systems reject counts above INT_MAX).
#define FILE_IO_CHUNK ((size_t)1 << 30)

const char *attn__path_tail(const char *path) {
    if (path == NULL) return "(null)";
    size_t n = strlen(path);
    return n > FILE_PATH_TAIL ? path + (n - FILE_PATH_TAIL) : path;
}

attn_status attn__file_status(attn_ctx *ctx, attn_status st, const char *path) {
    if (st == ATTN_OK || st == ATTN_ERR_IO || st == ATTN_ERR_OUT_OF_MEMORY) return st;
    char msg[ATTN_ERR_MSG_SIZE];
    memcpy(msg, ctx->err, sizeof msg);
    return attn__fail(ctx, st, "'%s': %s", attn__path_tail(path), msg);
}

// ATTN_ERR_IO "<action> '<path>': <strerror(err)>".
static attn_status io_fail(attn_ctx *ctx, int err, const char *action, const char *path) {
    char buf[128];
    if (strerror_r(err, buf, sizeof buf) != 0) snprintf(buf, sizeof buf, "error %d", err);
    return attn__fail(ctx, ATTN_ERR_IO, "%s '%s': %s", action, attn__path_tail(path), buf);
}

// ---- reading ---------------------------------------------------------------------------------

attn_status attn__file_open(attn_ctx *ctx, const char *path, attn__file *f) {
    if (f == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn__file_open: f is NULL");
    f->fd = -1;
    f->path = path;
    f->size = 0;
    f->pos = 0;
    if (path == NULL || path[0] == '\0') return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "path is NULL or empty");
    // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
    int fd;
    do {
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return io_fail(ctx, errno, "cannot open", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return io_fail(ctx, err, "cannot stat", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return attn__fail(ctx, ATTN_ERR_IO, "cannot read '%s': not a regular file", attn__path_tail(path));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    f->fd = fd;
    f->size = st.st_size < 0 ? 0 : (uint64_t)st.st_size;
    return ATTN_OK;
}

// Reads up to n bytes, stopping early only at end of file; *got = bytes read.
static attn_status read_some(attn_ctx *ctx, attn__file *f, void *buf, size_t n, size_t *got) {
    size_t done = 0;
    while (done < n) {
        size_t want = n - done < FILE_IO_CHUNK ? n - done : FILE_IO_CHUNK;
        ssize_t r = read(f->fd, (char *)buf + done, want);
        if (r < 0) {
            if (errno == EINTR) continue;
            return io_fail(ctx, errno, "cannot read", f->path);
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    f->pos += done;
    *got = done;
    return ATTN_OK;
}

attn_status attn__file_read(attn_ctx *ctx, attn__file *f, void *buf, size_t n) {
    if (f == NULL || f->fd < 0 || (buf == NULL && n > 0))
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn__file_read: file not open or buffer NULL");
    size_t got = 0;
    ATTN_RETURN_IF_ERR(read_some(ctx, f, buf, n, &got));
    if (got != n)
        return attn__fail(ctx, ATTN_ERR_IO, "cannot read '%s': unexpected end of file after %llu bytes "
                          "(the file changed while being read?)", attn__path_tail(f->path),
                          (unsigned long long)f->pos);
    return ATTN_OK;
}

attn_status attn__file_expect_end(attn_ctx *ctx, attn__file *f) {
    if (f == NULL || f->fd < 0) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn__file_expect_end: file not open");
    unsigned char extra;
    size_t got = 0;
    ATTN_RETURN_IF_ERR(read_some(ctx, f, &extra, 1, &got));
    if (got != 0)
        return attn__fail(ctx, ATTN_ERR_IO, "cannot read '%s': the file grew while being read",
                          attn__path_tail(f->path));
    return ATTN_OK;
}

void attn__file_close(attn__file *f) {
    if (f == NULL) return;
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
}

attn_status attn__file_read_all(attn_ctx *ctx, const char *path, size_t max_size, void **data, size_t *size) {
    if (data == NULL || size == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn__file_read_all: data or size is NULL");
    *data = NULL;
    *size = 0;
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__file f;
    ATTN_RETURN_IF_ERR(attn__file_open(ctx, path, &f));
    attn_status st = ATTN_OK;
    void *buf = NULL;
    if (f.size > max_size || f.size >= SIZE_MAX) {
        st = attn__fail(ctx, ATTN_ERR_IO, "cannot read '%s': the file has %llu bytes, more than the limit of %zu",
                        attn__path_tail(path), (unsigned long long)f.size, max_size);
    }
    if (st == ATTN_OK) st = attn__alloc(ctx, (size_t)f.size + 1, &buf);
    if (st == ATTN_OK) st = attn__file_read(ctx, &f, buf, (size_t)f.size);
    if (st == ATTN_OK) st = attn__file_expect_end(ctx, &f);
    attn__file_close(&f);
    if (st != ATTN_OK) {
        attn__free(ctx, buf);
        return st;
    }
    ((char *)buf)[f.size] = '\0';
    *data = buf;
    *size = (size_t)f.size;
    return ATTN_OK;
}

// ---- atomic writes ---------------------------------------------------------------------------

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Best effort: makes a rename in `dir_path` durable. Failures are ignored (some file systems
// cannot fsync a directory; the data itself is already on disk).
static void sync_directory(const char *tmp_path, size_t dir_len) {
    char dir[4096];
    if (dir_len == 0) {
        memcpy(dir, ".", 2);
    } else if (dir_len < sizeof dir) {
        memcpy(dir, tmp_path, dir_len);
        dir[dir_len] = '\0';
    } else {
        return;
    }
    int fd = open(dir, O_RDONLY | O_CLOEXEC | O_DIRECTORY);
    if (fd < 0) return;
    (void)fsync(fd);
    close(fd);
}

// Length of the directory part of path including its last '/', 0 if none.
static size_t dir_part_len(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash != NULL ? (size_t)(slash - path) + 1 : 0;
}

attn_status attn__atomic_begin(attn_ctx *ctx, const char *path, attn__atomic_file *w) {
    if (w == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn__atomic_begin: w is NULL");
    w->fd = -1;
    w->tmp_path = NULL;
    w->path = path;
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (path == NULL || path[0] == '\0') return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "path is NULL or empty");
    size_t len = strlen(path), dir_len = dir_part_len(path);
    const char *base = path + dir_len;
    size_t base_len = len - dir_len;
    if (base_len == 0)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "path '%s' ends with '/': it names a directory",
                          attn__path_tail(path));
    if (base_len > 64) base_len = 64; // keeps the temporary name within NAME_MAX
    // "<dir>/.<base>.<16 hex>.tmp"
    size_t cap = dir_len + 1 + base_len + 1 + 16 + 4 + 1;
    void *mem = NULL;
    ATTN_RETURN_IF_ERR(attn__alloc(ctx, cap, &mem));
    char *tmp = mem;
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) ts.tv_sec = ts.tv_nsec = 0;
    uint64_t state = (uint64_t)getpid() * 0x100000001B3ull ^ (uint64_t)ts.tv_sec * 1000000007ull ^
                     (uint64_t)ts.tv_nsec ^ (uint64_t)(uintptr_t)w ^ (uint64_t)(uintptr_t)mem;
    int fd = -1, err = 0;
    for (int attempt = 0; attempt < 100; attempt++) {
        snprintf(tmp, cap, "%.*s.%.*s.%016llx.tmp", (int)dir_len, path, (int)base_len, base,
                 (unsigned long long)splitmix64(&state));
        do {
            fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
        } while (fd < 0 && errno == EINTR);
        if (fd >= 0 || errno != EEXIST) break;
    }
    if (fd < 0) {
        err = errno;
        attn__free(ctx, mem);
        return io_fail(ctx, err, "cannot create a temporary file to write", path);
    }
    w->fd = fd;
    w->tmp_path = tmp;
    return ATTN_OK;
}

attn_status attn__atomic_write(attn_ctx *ctx, attn__atomic_file *w, const void *buf, size_t n) {
    if (w == NULL || w->fd < 0 || (buf == NULL && n > 0))
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn__atomic_write: file not open or buffer NULL");
    const char *p = buf;
    while (n > 0) {
        size_t want = n < FILE_IO_CHUNK ? n : FILE_IO_CHUNK;
        ssize_t r = write(w->fd, p, want);
        if (r < 0) {
            if (errno == EINTR) continue;
            return io_fail(ctx, errno, "cannot write", w->path);
        }
        if (r == 0) return attn__fail(ctx, ATTN_ERR_IO, "cannot write '%s': no progress", attn__path_tail(w->path));
        p += r;
        n -= (size_t)r;
    }
    return ATTN_OK;
}

void attn__atomic_abort(attn_ctx *ctx, attn__atomic_file *w) {
    if (w == NULL) return;
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
    if (w->tmp_path != NULL) {
        (void)unlink(w->tmp_path);
        if (ctx != NULL) attn__free(ctx, w->tmp_path);
    }
    w->tmp_path = NULL;
}

attn_status attn__atomic_commit(attn_ctx *ctx, attn__atomic_file *w) {
    if (w == NULL || w->fd < 0 || w->tmp_path == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn__atomic_commit: file not open");
    attn_status st = ATTN_OK;
    if (fsync(w->fd) != 0) st = io_fail(ctx, errno, "cannot flush", w->path);
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0 && st == ATTN_OK) st = io_fail(ctx, errno, "cannot close", w->path);
    if (st == ATTN_OK && rename(w->tmp_path, w->path) != 0) st = io_fail(ctx, errno, "cannot rename over", w->path);
    if (st != ATTN_OK) {
        attn__atomic_abort(ctx, w);
        return st;
    }
    sync_directory(w->tmp_path, dir_part_len(w->tmp_path));
    attn__free(ctx, w->tmp_path);
    w->tmp_path = NULL;
    return ATTN_OK;
}

attn_status attn__file_write_atomic(attn_ctx *ctx, const char *path, const void *data, size_t size) {
    attn__atomic_file w;
    ATTN_RETURN_IF_ERR(attn__atomic_begin(ctx, path, &w));
    attn_status st = attn__atomic_write(ctx, &w, data, size);
    if (st == ATTN_OK) st = attn__atomic_commit(ctx, &w);
    if (st != ATTN_OK) attn__atomic_abort(ctx, &w);
    return st;
}

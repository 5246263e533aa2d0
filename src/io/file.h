// file.h - whole-file reads with a size limit, checked sequential reads, and atomic writes.
//
// What it does (POSIX: open/read/write/fsync/rename):
//  - attn__file_read_all: reads a regular file into one buffer from the context's allocator,
//    refusing files larger than a limit before allocating anything.
//  - attn__file_open/read/expect_end/close: sequential reads of exactly the bytes asked for, for
//    readers that check a header before allocating room for the data behind it.
//  - attn__atomic_*: writes a file whole or not at all. The bytes go to a new temporary file in
//    the target's directory (".<name>.<random>.tmp", created with O_EXCL, mode 0666 & ~umask),
//    which is fsync'ed, closed and renamed over the target; the directory is then fsync'ed (best
//    effort). On any failure the temporary file is removed and the target is left untouched.
//    Renaming replaces a symbolic link at `path` itself, not the file it points to.
// Every failure is ATTN_ERR_IO with the path and strerror(errno) in the message (except
// ATTN_ERR_INVALID_ARG for bad arguments and ATTN_ERR_OUT_OF_MEMORY).
// What it does not do: Windows, memory mapping, locking, preserving the target's permissions.
#ifndef ATTN_IO_FILE_H
#define ATTN_IO_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

// The last characters of `path` (at most 96 bytes), for error messages.
const char *attn__path_tail(const char *path);

// A reader's status st for the file `path`, with the file named in front of the context's message
// when st says the file's contents are wrong (not for ATTN_ERR_IO or ATTN_ERR_OUT_OF_MEMORY, whose
// messages name it or have nothing of it to name).
attn_status attn__file_status(attn_ctx *ctx, attn_status st, const char *path);

// Reads the regular file `path` whole. *data (from attn__alloc; free it with attn__free) holds
// *size bytes plus a NUL byte after them, so text can be used as a C string. Files larger than
// max_size bytes are refused (ATTN_ERR_IO) before any allocation. On failure *data = NULL.
attn_status attn__file_read_all(attn_ctx *ctx, const char *path, size_t max_size, void **data, size_t *size);

// A regular file open for sequential reading.
typedef struct attn__file {
    int fd;           // -1 when closed
    const char *path; // borrowed, for messages
    uint64_t size;    // size when opened
    uint64_t pos;     // bytes read so far
} attn__file;

// Opens a regular file for reading (a FIFO or directory is refused without blocking).
attn_status attn__file_open(attn_ctx *ctx, const char *path, attn__file *f);
// Reads exactly n bytes; fewer (the file shrank) is ATTN_ERR_IO.
attn_status attn__file_read(attn_ctx *ctx, attn__file *f, void *buf, size_t n);
// ATTN_ERR_IO if the file has more bytes after the current position (it grew while being read).
attn_status attn__file_expect_end(attn_ctx *ctx, attn__file *f);
// Closes the file; safe to call twice or on a file that failed to open.
void attn__file_close(attn__file *f);

// A file being written atomically.
typedef struct attn__atomic_file {
    int fd;           // the temporary file, -1 when closed
    char *tmp_path;   // allocated through the context; NULL once committed or aborted
    const char *path; // the target (borrowed)
} attn__atomic_file;

// Creates the temporary file next to `path`. On failure nothing is left behind.
attn_status attn__atomic_begin(attn_ctx *ctx, const char *path, attn__atomic_file *w);
// Appends n bytes. On failure the caller must still call attn__atomic_abort.
attn_status attn__atomic_write(attn_ctx *ctx, attn__atomic_file *w, const void *buf, size_t n);
// fsync, close, rename over the target. On failure the temporary file is removed (no abort needed,
// but calling it is harmless).
attn_status attn__atomic_commit(attn_ctx *ctx, attn__atomic_file *w);
// Closes and removes the temporary file, if any. Safe after commit or a failed begin.
void attn__atomic_abort(attn_ctx *ctx, attn__atomic_file *w);
// begin + write(data, size) + commit, aborting on failure.
attn_status attn__file_write_atomic(attn_ctx *ctx, const char *path, const void *data, size_t size);

#endif // ATTN_IO_FILE_H

// cp_internal.h - declarations shared by libattn_cp's sources; not installed.
//
// libattn_cp is built on libattn's public interface only (attn.h): the ring calls attn_sdpa_fwd and
// attn_sdpa_bwd on blocks, and keeps its own error messages and buffers.
#ifndef ATTN_CP_INTERNAL_H
#define ATTN_CP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attn_cp.h"

#define CP_ALIGN 64
#define CP_ERR_MSG_SIZE 320

// Messages are cut into segments of at most CP_SEG floats (MPI counts are int), at most
// CP_MAX_SEG of them: a block holds at most 2^32 floats.
#define CP_SEG ((int64_t)1 << 28)
#define CP_MAX_SEG 16

struct attn_cp {
    MPI_Comm comm; // our duplicate of the caller's communicator
    int rank, world;
    attn_allocator alloc;
    int64_t poll_rows; // as given: > 0 rows, 0 automatic, -1 never
    void *mem;         // the ring's buffers (CP_ALIGN-aligned), mem_size bytes
    size_t mem_size;
    attn_cp_stats stats;
    char err[CP_ERR_MSG_SIZE];
};

#define ATTN_CP_RETURN_IF_ERR(expr)            \
    do {                                       \
        attn_status cp__st_ = (expr);          \
        if (cp__st_ != ATTN_OK) return cp__st_; \
    } while (0)

// ---- layout (cp_layout.c) -------------------------------------------------------------------
// The chunks of the sequence a rank holds, in local order, with their local row offsets.
typedef struct cp_chunks {
    int n;                // 1 or 2
    int64_t start[2];     // global position of the chunk's first row
    int64_t len[2];       // rows (may be 0)
    int64_t local[2];     // local row of the chunk's first row
    int64_t total;        // local rows
} cp_chunks;

// Chunks of `rank` under a valid layout (the layout's own rank is ignored).
void attn__cp_chunks_of(const attn_cp_layout *layout, int rank, cp_chunks *out);
// Whether the layout's fields are valid.
bool attn__cp_layout_ok(const attn_cp_layout *layout);

// ---- checked arithmetic ---------------------------------------------------------------------
static inline bool cp_mul(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return false;
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool cp_add(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return false;
    return !__builtin_add_overflow(a, b, out);
}

#endif

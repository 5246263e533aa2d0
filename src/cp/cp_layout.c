// cp_layout.c - which positions of the sequence each rank holds (contiguous or zigzag chunks), and
// the helpers that cut a whole tensor into a rank's slice and put a slice back.
//
// The zigzag layout balances causal attention (used by Megatron-LM's context parallelism and
// ring-flash-attention): with 2P chunks, rank r holds chunk r, whose queries see few keys, and chunk
// 2P-1-r, whose queries see many, so every rank computes about (2P+1)/(4P) of a full row block.
#include <string.h>

#include "cp/cp_internal.h"

bool attn__cp_layout_ok(const attn_cp_layout *l) {
    return l != NULL && (l->chunking == ATTN_CP_CONTIGUOUS || l->chunking == ATTN_CP_ZIGZAG) && l->len >= 1 &&
           l->world >= 1 && l->rank >= 0 && l->rank < l->world;
}

attn_status attn_cp_layout_init(attn_cp_layout *layout, attn_cp_chunking chunking, int64_t len, int rank, int world) {
    if (layout == NULL) return ATTN_ERR_INVALID_ARG;
    memset(layout, 0, sizeof *layout);
    if (chunking != ATTN_CP_CONTIGUOUS && chunking != ATTN_CP_ZIGZAG) return ATTN_ERR_INVALID_ARG;
    if (world < 1 || rank < 0 || rank >= world) return ATTN_ERR_INVALID_ARG;
    if (len < 1) return ATTN_ERR_BAD_SHAPE;
    layout->chunking = chunking, layout->len = len, layout->rank = rank, layout->world = world;
    return ATTN_OK;
}

const char *attn_cp_chunking_name(attn_cp_chunking chunking) {
    switch (chunking) {
    case ATTN_CP_CONTIGUOUS: return "contiguous";
    case ATTN_CP_ZIGZAG: return "zigzag";
    }
    return "?";
}

// Chunk c of n over len positions: the first len % n chunks hold one more position.
static void chunk(int64_t len, int64_t n, int64_t c, int64_t *start, int64_t *size) {
    const int64_t q = len / n, r = len % n;
    *start = c * q + (c < r ? c : r);
    *size = q + (c < r ? 1 : 0);
}

void attn__cp_chunks_of(const attn_cp_layout *l, int rank, cp_chunks *out) {
    memset(out, 0, sizeof *out);
    const int64_t P = l->world;
    if (l->chunking == ATTN_CP_CONTIGUOUS) {
        out->n = 1;
        chunk(l->len, P, rank, &out->start[0], &out->len[0]);
    } else {
        out->n = 2;
        chunk(l->len, 2 * P, rank, &out->start[0], &out->len[0]);
        chunk(l->len, 2 * P, 2 * P - 1 - rank, &out->start[1], &out->len[1]);
    }
    out->local[0] = 0;
    out->local[1] = out->len[0];
    out->total = out->len[0] + out->len[1];
}

attn_status attn_cp_chunks(const attn_cp_layout *layout, int *n_chunks, int64_t start[2], int64_t len[2]) {
    if (!attn__cp_layout_ok(layout) || n_chunks == NULL || start == NULL || len == NULL) return ATTN_ERR_INVALID_ARG;
    cp_chunks c;
    attn__cp_chunks_of(layout, layout->rank, &c);
    *n_chunks = c.n;
    for (int i = 0; i < 2; i++) start[i] = c.start[i], len[i] = c.len[i];
    return ATTN_OK;
}

attn_status attn_cp_local_len(const attn_cp_layout *layout, int64_t *local_len) {
    if (!attn__cp_layout_ok(layout) || local_len == NULL) return ATTN_ERR_INVALID_ARG;
    cp_chunks c;
    attn__cp_chunks_of(layout, layout->rank, &c);
    *local_len = c.total;
    return ATTN_OK;
}

attn_status attn_cp_positions(const attn_cp_layout *layout, int64_t *pos) {
    if (!attn__cp_layout_ok(layout)) return ATTN_ERR_INVALID_ARG;
    cp_chunks c;
    attn__cp_chunks_of(layout, layout->rank, &c);
    if (c.total > 0 && pos == NULL) return ATTN_ERR_INVALID_ARG;
    for (int k = 0; k < c.n; k++)
        for (int64_t i = 0; i < c.len[k]; i++) pos[c.local[k] + i] = c.start[k] + i;
    return ATTN_OK;
}

// The largest element offset of a view (n[i] >= 0; a view with an empty dimension has none).
static attn_status view_ok(const int64_t n[4], const int64_t s[4], size_t elem_size) {
    int64_t off = 0;
    for (int i = 0; i < 4; i++) {
        int64_t t;
        if (s[i] < 0) return ATTN_ERR_INVALID_ARG;
        if (n[i] == 0) return ATTN_OK;
        if (!cp_mul(n[i] - 1, s[i], &t) || !cp_add(off, t, &off)) return ATTN_ERR_OVERFLOW;
    }
    int64_t bytes;
    if (!cp_add(off, 1, &off) || !cp_mul(off, (int64_t)elem_size, &bytes)) return ATTN_ERR_OVERFLOW;
    return ATTN_OK;
}

// Copies the rank's rows between the whole tensor and the slice: to_local chooses the direction.
static attn_status copy_rows(const attn_cp_layout *layout, size_t elem_size, const int64_t shape[4],
                             const int64_t full_stride[4], const int64_t local_stride[4], char *full, char *local,
                             bool to_local) {
    if (!attn__cp_layout_ok(layout) || shape == NULL || full_stride == NULL || local_stride == NULL || elem_size == 0 ||
        elem_size > (size_t)INT64_MAX)
        return ATTN_ERR_INVALID_ARG;
    for (int i = 0; i < 4; i++)
        if (shape[i] < 1) return ATTN_ERR_BAD_SHAPE;
    if (shape[2] != layout->len) return ATTN_ERR_BAD_SHAPE;
    cp_chunks c;
    attn__cp_chunks_of(layout, layout->rank, &c);
    const int64_t nl[4] = {shape[0], shape[1], c.total, shape[3]};
    attn_status st = view_ok(shape, full_stride, elem_size);
    if (st == ATTN_OK) st = view_ok(nl, local_stride, elem_size);
    if (st != ATTN_OK) return st;
    if (c.total == 0) return ATTN_OK;
    if (full == NULL || local == NULL) return ATTN_ERR_INVALID_ARG;
    const int64_t es = (int64_t)elem_size;
    const bool rows = full_stride[3] == 1 && local_stride[3] == 1;
    for (int64_t b = 0; b < shape[0]; b++)
        for (int64_t h = 0; h < shape[1]; h++)
            for (int k = 0; k < c.n; k++)
                for (int64_t i = 0; i < c.len[k]; i++) {
                    char *f = full + (b * full_stride[0] + h * full_stride[1] + (c.start[k] + i) * full_stride[2]) * es;
                    char *l = local + (b * local_stride[0] + h * local_stride[1] + (c.local[k] + i) * local_stride[2]) * es;
                    if (rows) {
                        if (to_local) memcpy(l, f, (size_t)(shape[3] * es));
                        else memcpy(f, l, (size_t)(shape[3] * es));
                        continue;
                    }
                    for (int64_t d = 0; d < shape[3]; d++) {
                        if (to_local) memcpy(l + d * local_stride[3] * es, f + d * full_stride[3] * es, elem_size);
                        else memcpy(f + d * full_stride[3] * es, l + d * local_stride[3] * es, elem_size);
                    }
                }
    return ATTN_OK;
}

attn_status attn_cp_shard(const attn_cp_layout *layout, size_t elem_size, const int64_t shape[4], const void *full,
                          const int64_t full_stride[4], void *local, const int64_t local_stride[4]) {
    // the source is only read
    return copy_rows(layout, elem_size, shape, full_stride, local_stride, (char *)(uintptr_t)full, local, true);
}

attn_status attn_cp_unshard(const attn_cp_layout *layout, size_t elem_size, const int64_t shape[4], const void *local,
                            const int64_t local_stride[4], void *full, const int64_t full_stride[4]) {
    return copy_rows(layout, elem_size, shape, full_stride, local_stride, full, (char *)(uintptr_t)local, false);
}

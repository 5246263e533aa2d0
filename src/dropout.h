// dropout.h - the dropout mask of one SDPA call as every CPU kernel reads it, whichever its source
// (attn_sdpa_desc.dropout_rng): the context's generator (F.dropout's draws, kept as (B, H, L, S)
// bits in the kernel's scratch, since the stream is sequential) or Philox (src/philox.h, computed
// where it is needed, nothing stored).
#ifndef ATTN_DROPOUT_H
#define ATTN_DROPOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "internal.h"
#include "philox.h"

typedef struct attn__dropout {
    bool on;              // dropout_p > 0
    float keep_scale;     // float(1 / float(1 - p)); 0 when p = 1
    const uint8_t *bits;  // CONTEXT: (B, H, L, S) bits, 1 = kept, in the run's (b, h, i, j) order
    bool philox;          // PHILOX: kept = attn__philox_dropout_kept(seed, offset, threshold, ...)
    uint64_t seed, threshold;
    uint32_t offset;
    int64_t H, L, S, seq0; // the run's heads, queries, keys, and the index of its first sequence
    const attn__kernels *kn; // philox_lanes of the run's instruction set
} attn__dropout;

// Whether the backward needs the forward's generator state: dropout drawn from the context's generator.
static inline bool attn__dropout_needs_state(const attn_sdpa_desc *d) {
    return d->dropout_p > 0.0 && d->dropout_rng != ATTN_DROPOUT_RNG_PHILOX;
}

// Scratch bytes attn__dropout_init needs for the mask of d (0 without dropout or with Philox).
size_t attn__dropout_bits_bytes(const attn_sdpa_desc *d, const attn__sdpa_shape *sh);

// Prepares the mask of a checked descriptor for the fused kernels of table kn. With the context's generator the draws are taken from
// *gen in (b, h, i, j) order into `bits` (attn__dropout_bits_bytes bytes), advancing *gen exactly as
// F.dropout on the (B*H, L, S) weights would (not at all when p = 1, as torch); Philox uses
// neither. Without dropout dr->on is false.
void attn__dropout_init(attn__dropout *dr, const attn__kernels *kn, const attn_sdpa_desc *d, const attn__sdpa_shape *sh,
                        attn_generator *gen, uint8_t *bits);

// Whether the weight of (b, h, i, j) of the run is kept (dr->on).
static inline bool attn__dropout_kept(const attn__dropout *dr, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (dr->philox)
        return attn__philox_dropout_kept(dr->seed, dr->offset, dr->threshold, (dr->seq0 + b) * dr->H + h, i, j) != 0;
    const int64_t bit = ((b * dr->H + h) * dr->L + i) * dr->S + j;
    return ((dr->bits[bit >> 3] >> (bit & 7)) & 1) != 0;
}

// The scalar reference's draw for element (b, h, i, j), taken in (b, h, i, j) order: kept or not,
// from *gen (advancing it; never called when p = 1, as torch draws nothing then) or from Philox
// (threshold: attn__philox_keep_threshold(p); gen unused).
static inline bool attn__dropout_draw(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, attn_generator *gen,
                                      uint64_t threshold, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (d->dropout_rng == ATTN_DROPOUT_RNG_PHILOX)
        return attn__philox_dropout_kept(d->dropout_seed, d->dropout_offset, threshold, (sh->seq0 + b) * sh->H + h, i,
                                         j) != 0;
    return d->dropout_p < 1.0 && attn__dropout_keep(gen, 1.0 - d->dropout_p);
}

// Applies the mask to a score tile of (b, h): t[j * ld + i] for queries i0 + i (i < nq) and keys
// j0 + j (j < nj) becomes t * kept_mul where kept, 0 where dropped.
void attn__dropout_tile(const attn__dropout *dr, int64_t b, int64_t h, int64_t i0, int nq, int64_t j0, int nj,
                        float *t, int64_t ld, float kept_mul);

#endif

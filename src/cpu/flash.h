// flash.h - the fused attention forward of flash_fwd.c.
#ifndef ATTN_CPU_FLASH_H
#define ATTN_CPU_FLASH_H

#include "internal.h"

// Scratch bytes for a checked problem on this context (its thread count and kernel table).
size_t attn__flash_fwd_workspace(const attn_ctx *ctx, const attn__sdpa_shape *sh, const attn_sdpa_desc *d);
// Runs the problem with ctx->kernels on ctx's threads. weights are not produced (the reference
// kernel serves calls that ask for them).
void attn__flash_fwd(attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh, const float *q,
                     const float *k, const float *v, float *out, float *lse, void *ws);

// One past the last key any query up to `last_query` may see under the causal mask (S without one).
int64_t attn__keys_visible_until(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t last_query);
// Applies the causal, attention and key-padding masks to the score tile st (nj keys from j0, brp
// columns of which nq are the queries from i0), in the log2 domain. Returns false when every score
// of the tile is hidden.
bool attn__mask_tile(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int brp, int64_t b, int64_t h, int64_t i0,
                     int nq, int64_t j0, int nj, float *st);
// The causal mask alone on a tile that crosses the diagonal (each key row hides a prefix of queries).
void attn__causal_tile(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int brp, int64_t i0, int nq, int64_t j0,
                       int nj, float *st);

// The fused backward (flash_bwd.c).
size_t attn__flash_bwd_workspace(const attn_ctx *ctx, const attn__sdpa_shape *sh, const attn_sdpa_desc *d,
                                 bool want_dmask);
void attn__flash_bwd(attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh,
                     const attn_generator *dropout_state, const float *q, const float *k, const float *v,
                     const float *out, const float *dout, const float *lse, float *dq, float *dk, float *dv,
                     float *dmask, void *ws);

#endif

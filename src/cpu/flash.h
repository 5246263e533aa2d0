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

#endif

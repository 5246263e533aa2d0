// mha_internal.h - the attn_mha struct, shared by mha.c and mha_state.c.
#ifndef ATTN_MHA_INTERNAL_H
#define ATTN_MHA_INTERNAL_H

#include "internal.h"

struct attn_mha {
    attn_allocator alloc;  // the creating context's allocator (the module outlives no context call)
    attn_mha_config cfg;   // kdim/vdim resolved, flags 0/1
    bool packed;           // in_proj_weight (kdim == vdim == E) rather than q/k/v_proj_weight
    attn__params params;   // state_dict order
};

// Allocates a module with zeroed parameters (no generator draws). separate_qkv forces
// q/k/v_proj_weight even when kdim == vdim == embed_dim.
attn_status attn__mha_alloc(attn_ctx *ctx, const attn_mha_config *cfg, bool separate_qkv, attn_mha **out);
// *out = src with its parameters converted to `dtype` (F32 to F16 / BF16 rounds to nearest even, as
// module.to(dtype)); src is freed, also on failure.
attn_status attn__mha_convert(attn_ctx *ctx, attn_mha *src, attn_dtype dtype, attn_mha **out);

#endif

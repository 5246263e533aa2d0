// gpt2_internal.h - what the files of the GPT-2 example share and do not export.
#ifndef ATTN_EXAMPLES_GPT2_INTERNAL_H
#define ATTN_EXAMPLES_GPT2_INTERNAL_H

#include <stddef.h>

#include "gpt2.h"

// Returns the status of expr when it is not ATTN_OK.
#define GPT2_RETURN_IF_ERR(expr)                                                                   \
    do {                                                                                           \
        const attn_status st_ = (expr);                                                            \
        if (st_ != ATTN_OK) return st_;                                                            \
    } while (0)

// Writes the formatted message to err (when not NULL) and returns st.
attn_status gpt2__fail(char *err, attn_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
// For a failed library call: "what: <the context's message>" into err; returns st.
attn_status gpt2__lib_fail(char *err, const attn_ctx *ctx, attn_status st, const char *what);

// A model of configuration cfg (checked) with every float zeroed and the pointers set; no MHAs yet.
attn_status gpt2__alloc(const gpt2_config *cfg, gpt2_model **model, char *err);
// Block l's attention as nn.MultiheadAttention(E, H) from its packed projection in nn.Linear's
// layout: w_qkv (3E, E), b_qkv (3E), w_o (E, E), b_o (E) (copied).
attn_status gpt2__set_attention(attn_ctx *ctx, gpt2_model *model, int64_t l, const float *w_qkv, const float *b_qkv,
                                const float *w_o, const float *b_o, char *err);
// dst (cols, rows) = src (rows, cols)^T
void gpt2__transpose(const float *src, int64_t rows, int64_t cols, float *dst);

#endif

// mha_core.h - the one multi-head attention pipeline behind every module of the library:
//   project q, k, v -> append bias_k/bias_v and a zero key -> split heads -> SDPA -> merge heads
//   -> optional output projection.
// nn.MultiheadAttention (mha.c) and the book's modules (book.c) describe themselves with an
// attn__mha_spec and run through attn__mha_core_*; they differ only in the spec.
#ifndef ATTN_MHA_CORE_H
#define ATTN_MHA_CORE_H

#include "internal.h"

typedef struct attn__mha_spec {
    int64_t E;              // projected width (embed_dim, d_out)
    int64_t H;              // heads; head_dim = E / H
    int64_t dq, dk, dv;     // input widths of query, key, value
    const float *wq, *wk, *wv; // (E, d) nn.Linear layout, or (d, E) when w_in_out
    bool w_in_out;
    const float *bq, *bk, *bv; // (E) or NULL
    const float *bias_k, *bias_v; // (E) each or NULL: one extra key/value position
    bool add_zero_attn;     // one all-zero key/value position after bias_k
    const float *wo, *bo;   // out_proj (E, E) and (E), or wo = NULL for no output projection
    const void *wq_t, *wk_t, *wv_t, *wo_t; // the same weights in `dtype` (nn.Linear layout, not
                            // w_in_out), or NULL: read in place where attn__linear_half applies
    bool prescale_q;        // q /= sqrt(head_dim) before the product (nn.MultiheadAttention);
                            // otherwise the scores are scaled (the book's modules)
    double dropout;         // on the weights when io->training
    attn_dtype dtype;       // F32 (0), or F16 / BF16: the projected q, k, v and the heads' output are
                            // rounded to it (the buffers stay float32, holding the type's values)
} attn__mha_spec;

typedef struct attn__mha_io {
    // query: N sequences of L rows of dq floats; row r of batch n at query + n*q_bs + r*q_rs.
    const float *query, *key, *value;
    int64_t N, L, S;
    int64_t q_rs, q_bs, k_rs, k_bs, v_rs, v_bs;
    // out: (N, L, E) at out + n*o_bs + r*o_rs (columns contiguous).
    float *out;
    int64_t o_rs, o_bs;
    // attn_mask: (L, S) when mask_ndim 2, (N*H, L, S) when 3; BOOL (True blocks) or F32.
    const void *attn_mask;
    attn_dtype attn_mask_dtype;
    int attn_mask_ndim;
    // key_padding_mask: (N, S) with batch stride kpm_bs (0 for unbatched).
    const void *key_padding_mask;
    attn_dtype kpm_dtype;
    int64_t kpm_bs;
    bool causal;            // triu(ones(L, S), 1) blocks (extra keys stay visible)
    bool training;
    attn_weights_mode weights_mode; // (N, H, L, S') or (N, L, S'), contiguous
    float *weights;
} attn__mha_io;

typedef struct attn__mha_plan {
    int64_t S2;             // S' = S + extra keys
    int64_t hd;
    attn_sdpa_desc sd;      // strides set; pointers filled at run time
    attn__sdpa_shape sh;
    bool pad_mask, pad_kpm, causal_mask; // masks copied into the workspace, widened to S'
    bool dot;               // a BF16 spec on bf16 dot products: the attention runs on bf16 copies of
                            // q, k, v (sd with q_dtype = kv_dtype = BF16 and scale dot_scale, sh_dot)
    float dot_scale;
    attn__sdpa_shape sh_dot;
    size_t sdpa_ws_size;    // scratch of the SDPA kernel
    size_t linear_ws_size;  // scratch of the projections
    size_t ws_size;         // all scratch of the pipeline (forward)
    size_t saved_size;      // the training forward's saved activations
    size_t sdpa_bwd_ws_size, matmul_ws_size;
    size_t bwd_ws_size;     // all scratch of the backward
} attn__mha_plan;

// Checks sizes (overflow) and the SDPA problem; fills plan including its workspace sizes.
attn_status attn__mha_core_plan(attn_ctx *ctx, const attn__mha_spec *spec, const attn__mha_io *io,
                                attn__mha_plan *plan);
// Runs a planned problem with ws (>= plan->ws_size bytes). With `saved` (plan->saved_size bytes)
// the forward also keeps what attn__mha_core_backward needs: the generator state before the
// attention, the projections, the attention's output and its log-sum-exp.
void attn__mha_core_run(attn_ctx *ctx, const attn__mha_spec *spec, const attn__mha_io *io,
                        const attn__mha_plan *plan, void *ws, void *saved);

// Gradients of a pipeline, each NULL to skip: weights and biases with the spec's layouts, inputs
// with io's layouts. A tensor given as several of query/key/value receives the sum of its uses.
typedef struct attn__mha_grads {
    float *dwq, *dwk, *dwv, *dbq, *dbk, *dbv, *dbias_k, *dbias_v, *dwo, *dbo;
    float *dquery, *dkey, *dvalue;
    bool add_to_inputs; // add to dquery/dkey/dvalue instead of overwriting them (the wrapper's heads)
} attn__mha_grads;

// True when `saved` holds the activations of a training forward of this very problem.
bool attn__mha_saved_matches(const attn__mha_spec *spec, const attn__mha_io *io, const attn__mha_plan *plan,
                             const void *saved);

// Backward of a planned problem, given the forward's `saved` and dout (io->out's layout); ws holds
// plan->bwd_ws_size bytes.
void attn__mha_core_backward(attn_ctx *ctx, const attn__mha_spec *spec, const attn__mha_io *io,
                             const attn__mha_plan *plan, const void *saved, const float *dout,
                             const attn__mha_grads *g, void *ws);
#endif

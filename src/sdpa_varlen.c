// sdpa_varlen.c - variable-length packed batches: sequences laid end to end (cumulative offsets
// cu_seqlens), each one an SDPA problem of its own run by the general kernels through a view
// into the packed tensors (no copies of q, k, v or out). The log-sum-exp of a sequence is written
// by the kernels into scratch and scattered into the (H, total_q) output.
#include <math.h>
#include <string.h>

#include "dropout.h"
#include "half.h"
#include "internal.h"

// The offsets of a packed batch and what packed batches exclude (masks, weights).
static attn_status check_offsets(attn_ctx *ctx, const char *fn, const attn_sdpa_desc *desc, const int64_t *cu_q,
                                 const int64_t *cu_k) {
    const int64_t B = desc->batch;
    if (B < 1) return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "%s: batch (sequences) = %lld must be >= 1", fn, (long long)B);
    if (cu_q == NULL || cu_k == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "%s: cu_seqlens must not be NULL", fn);
    if (desc->mask != NULL || desc->key_padding_mask != NULL)
        return attn__fail(ctx, ATTN_ERR_UNSUPPORTED, "%s: no attention or key padding mask with packed sequences", fn);
    if (desc->weights_mode != ATTN_WEIGHTS_NONE)
        return attn__fail(ctx, ATTN_ERR_UNSUPPORTED, "%s: no weights output with packed sequences", fn);
    if (cu_q[0] != 0 || cu_k[0] != 0) return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "%s: cu_seqlens must start at 0", fn);
    for (int64_t b = 0; b < B; b++) {
        if (cu_q[b + 1] < cu_q[b] || cu_k[b + 1] < cu_k[b])
            return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "%s: cu_seqlens decrease at sequence %lld", fn, (long long)b);
        const int64_t Lb = cu_q[b + 1] - cu_q[b], Sb = cu_k[b + 1] - cu_k[b]; // offsets from 0, increasing: no overflow
        if (Lb > desc->len_q || Sb > desc->len_kv)
            return attn__fail(ctx, ATTN_ERR_BAD_SHAPE,
                              "%s: sequence %lld has %lld queries and %lld keys, more than len_q %lld / len_kv %lld", fn,
                              (long long)b, (long long)Lb, (long long)Sb, (long long)desc->len_q,
                              (long long)desc->len_kv);
    }
    if (cu_q[B] < 1 || cu_k[B] < 1)
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "%s: the batch holds no queries or no keys", fn);
    return ATTN_OK;
}

// The whole packed tensors as one (1, H, total_q, D) / (1, Hkv, total_k, D) problem, whose strides
// reach everything the sequences will read and write. Sequence b's view follows.
static attn_sdpa_desc whole_of(const attn_sdpa_desc *desc, const int64_t *cu_q, const int64_t *cu_k) {
    attn_sdpa_desc whole = *desc;
    whole.batch = 1, whole.len_q = cu_q[desc->batch], whole.len_kv = cu_k[desc->batch];
    whole.q_stride[0] = whole.k_stride[0] = whole.v_stride[0] = whole.o_stride[0] = 0;
    return whole;
}

static attn_status check_packed(attn_ctx *ctx, const char *fn, const attn_sdpa_desc *desc, const int64_t *cu_q,
                                const int64_t *cu_k, attn_sdpa_desc *whole, attn__sdpa_shape *sh) {
    ATTN_RETURN_IF_ERR(check_offsets(ctx, fn, desc, cu_q, cu_k));
    *whole = whole_of(desc, cu_q, cu_k);
    attn_sdpa_desc run;
    return attn__sdpa_prepare(ctx, whole, sh, &run);
}

attn_status attn_sdpa_varlen_desc_check(attn_ctx *ctx, const attn_sdpa_desc *desc, const int64_t *cu_seqlens_q,
                                        const int64_t *cu_seqlens_k) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (desc == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa_varlen: desc is NULL");
    ATTN_RETURN_IF_ERR(check_offsets(ctx, "sdpa_varlen", desc, cu_seqlens_q, cu_seqlens_k));
    const attn_sdpa_desc whole = whole_of(desc, cu_seqlens_q, cu_seqlens_k);
    attn__sdpa_shape sh;
    return attn__sdpa_check(ctx, &whole, &sh);
}

// Sequence b of a packed problem as its own descriptor (batch 1); q, k, v, out move to its rows.
typedef struct seq_view {
    attn_sdpa_desc d;
    int64_t L, S, q0, k0; // queries, keys, first query row, first key row
    int64_t b;            // the sequence
} seq_view;

static seq_view view_of(const attn_sdpa_desc *whole, const int64_t *cu_q, const int64_t *cu_k, int64_t b) {
    seq_view s;
    s.q0 = cu_q[b], s.k0 = cu_k[b], s.L = cu_q[b + 1] - s.q0, s.S = cu_k[b + 1] - s.k0, s.b = b;
    s.d = *whole;
    s.d.len_q = s.L, s.d.len_kv = s.S;
    return s;
}

// Row `row` of a packed tensor of dtype dt (row stride in elements; rows of the block types start on
// whole blocks); const dropped for outputs.
static void *rows_at(const void *p, attn_dtype dt, int64_t row, int64_t row_stride) {
    return (char *)(uintptr_t)p + attn__kv_bytes(dt, row * row_stride);
}

// Prepares sequence b's problem (false when it has no queries or no keys: nothing to run).
static attn_status prepare_seq(attn_ctx *ctx, const seq_view *s, attn__sdpa_shape *sh, attn_sdpa_desc *run, bool *runs) {
    *runs = s->L > 0 && s->S > 0;
    if (!*runs) return ATTN_OK;
    ATTN_RETURN_IF_ERR(attn__sdpa_prepare(ctx, &s->d, sh, run));
    sh->seq0 = s->b; // Philox dropout counts the packed batch's sequences
    return ATTN_OK;
}

// Scratch: the (H, longest L) log-sum-exp of one sequence, then the kernels' workspace for the
// most demanding sequence.
static attn_status take_workspace(attn_ctx *ctx, const attn_sdpa_desc *whole, int64_t B, const int64_t *cu_q,
                                  const int64_t *cu_k, bool backward, float **lse_tmp, void **scratch) {
    size_t most = 0;
    int64_t lmax = 1;
    for (int64_t b = 0; b < B; b++) {
        const seq_view s = view_of(whole, cu_q, cu_k, b);
        attn__sdpa_shape sh;
        attn_sdpa_desc run;
        bool runs;
        ATTN_RETURN_IF_ERR(prepare_seq(ctx, &s, &sh, &run, &runs));
        if (!runs) continue;
        const size_t w = backward ? attn__sdpa_bwd_workspace(ctx, &sh, &run, false) : attn__sdpa_workspace(ctx, &sh, &run);
        if (w > most) most = w;
        if (s.L > lmax) lmax = s.L;
    }
    const int64_t H = whole->n_heads;
    attn__arena a = {0};
    attn__arena_take(&a, (size_t)(H * lmax) * sizeof(float));
    attn__arena_take(&a, most);
    void *ws;
    ATTN_RETURN_IF_ERR(attn__workspace(ctx, a.used, &ws));
    a = (attn__arena){.base = ws};
    *lse_tmp = attn__arena_take(&a, (size_t)(H * lmax) * sizeof(float));
    *scratch = attn__arena_take(&a, most);
    return ATTN_OK;
}

// Sets rows [r0, r0 + n) of heads [h0, h1) of an (H, rows, w) view at strides s, of dtype dt, to x0.
static void fill_rows(void *x, attn_dtype dt, const int64_t s[4], int64_t h0, int64_t h1, int64_t r0, int64_t n,
                      int64_t w, float x0) {
    for (int64_t h = h0; h < h1; h++)
        for (int64_t i = r0; i < r0 + n; i++)
            for (int64_t e = 0; e < w; e++) attn__elem_set(x, dt, h * s[1] + i * s[2] + e * s[3], x0);
}

attn_status attn_sdpa_varlen_fwd(attn_ctx *ctx, const attn_sdpa_desc *desc, const int64_t *cu_seqlens_q,
                                 const int64_t *cu_seqlens_k, const void *q, const void *k, const void *v, void *out,
                                 float *lse) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (desc == NULL || q == NULL || k == NULL || v == NULL || out == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa_varlen_fwd: desc, q, k, v and out must not be NULL");
    attn_sdpa_desc whole;
    attn__sdpa_shape wsh;
    ATTN_RETURN_IF_ERR(check_packed(ctx, "sdpa_varlen_fwd", desc, cu_seqlens_q, cu_seqlens_k, &whole, &wsh));
    const int64_t B = desc->batch, H = wsh.H, total_q = cu_seqlens_q[B];
    float *lse_tmp;
    void *scratch;
    ATTN_RETURN_IF_ERR(take_workspace(ctx, &whole, B, cu_seqlens_q, cu_seqlens_k, false, &lse_tmp, &scratch));
    for (int64_t b = 0; b < B; b++) {
        const seq_view s = view_of(&whole, cu_seqlens_q, cu_seqlens_k, b);
        attn__sdpa_shape sh;
        attn_sdpa_desc run;
        bool runs;
        ATTN_RETURN_IF_ERR(prepare_seq(ctx, &s, &sh, &run, &runs));
        if (s.L == 0) continue;
        if (!runs) { // queries without keys: zeros and lse -inf, or the sink's (attn__softmax_finish)
            for (int64_t h = 0; h < H; h++) {
                float row_lse;
                const float inv = attn__softmax_finish(-INFINITY, 0.0f, 1.0f, whole.sinks, h, &row_lse);
                fill_rows(out, whole.out_dtype, whole.o_stride, h, h + 1, s.q0, s.L, wsh.Dv, 0.0f * inv); // NaN sink: NaN
                for (int64_t i = 0; lse != NULL && i < s.L; i++) lse[h * total_q + s.q0 + i] = row_lse;
            }
            continue;
        }
        attn__sdpa_run(ctx, &run, &sh, rows_at(q, whole.q_dtype, s.q0, whole.q_stride[2]),
                       rows_at(k, whole.kv_dtype, s.k0, whole.k_stride[2]), rows_at(v, whole.kv_dtype, s.k0, whole.v_stride[2]),
                       rows_at(out, whole.out_dtype, s.q0, whole.o_stride[2]), lse != NULL ? lse_tmp : NULL, NULL, scratch);
        for (int64_t h = 0; lse != NULL && h < H; h++)
            memcpy(lse + h * total_q + s.q0, lse_tmp + h * s.L, (size_t)s.L * sizeof(float));
    }
    return ATTN_OK;
}

attn_status attn_sdpa_varlen_bwd(attn_ctx *ctx, const attn_sdpa_desc *desc, const int64_t *cu_seqlens_q,
                                 const int64_t *cu_seqlens_k, const void *q, const void *k, const void *v,
                                 const void *out, const void *dout, const float *lse,
                                 const attn_generator *dropout_state, void *dq, void *dk, void *dv) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (desc == NULL || q == NULL || k == NULL || v == NULL || out == NULL || dout == NULL || lse == NULL ||
        dq == NULL || dk == NULL || dv == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG,
                          "sdpa_varlen_bwd: desc, q, k, v, out, dout, lse, dq, dk and dv must not be NULL");
    if (attn__dropout_needs_state(desc) && dropout_state == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "sdpa_varlen_bwd: dropout needs the generator state of the forward");
    attn_sdpa_desc whole;
    attn__sdpa_shape wsh;
    ATTN_RETURN_IF_ERR(check_packed(ctx, "sdpa_varlen_bwd", desc, cu_seqlens_q, cu_seqlens_k, &whole, &wsh));
    ATTN_RETURN_IF_ERR(attn__sdpa_bwd_check(ctx, &whole, &wsh, false));
    const int64_t B = desc->batch, H = wsh.H, total_q = cu_seqlens_q[B];
    float *lse_tmp;
    void *scratch;
    ATTN_RETURN_IF_ERR(take_workspace(ctx, &whole, B, cu_seqlens_q, cu_seqlens_k, true, &lse_tmp, &scratch));
    attn_generator gen;
    if (dropout_state != NULL) gen = *dropout_state;
    // as the forward's kernels draw from the context's generator (Philox draws from no stream)
    const bool draws = attn__dropout_needs_state(desc) && desc->dropout_p < 1.0;
    for (int64_t b = 0; b < B; b++) {
        const seq_view s = view_of(&whole, cu_seqlens_q, cu_seqlens_k, b);
        attn__sdpa_shape sh;
        attn_sdpa_desc run;
        bool runs;
        ATTN_RETURN_IF_ERR(prepare_seq(ctx, &s, &sh, &run, &runs));
        if (!runs) { // no queries: keys and values get no gradient; no keys: neither do the queries
            fill_rows(dk, whole.grad_dtype, whole.k_stride, 0, wsh.Hkv, s.k0, s.S, wsh.D, 0.0f);
            fill_rows(dv, whole.grad_dtype, whole.v_stride, 0, wsh.Hkv, s.k0, s.S, wsh.Dv, 0.0f);
            fill_rows(dq, whole.grad_dtype, whole.q_stride, 0, H, s.q0, s.L, wsh.D, 0.0f);
            continue;
        }
        for (int64_t h = 0; h < H; h++) memcpy(lse_tmp + h * s.L, lse + h * total_q + s.q0, (size_t)s.L * sizeof(float));
        const attn_dtype gt = whole.grad_dtype;
        attn__sdpa_bwd_run(ctx, &run, &sh, attn__dropout_needs_state(desc) ? &gen : NULL,
                           rows_at(q, whole.q_dtype, s.q0, whole.q_stride[2]),
                           rows_at(k, whole.kv_dtype, s.k0, whole.k_stride[2]),
                           rows_at(v, whole.kv_dtype, s.k0, whole.v_stride[2]),
                           rows_at(out, whole.out_dtype, s.q0, whole.o_stride[2]),
                           rows_at(dout, whole.out_dtype, s.q0, whole.o_stride[2]), lse_tmp,
                           rows_at(dq, gt, s.q0, whole.q_stride[2]), rows_at(dk, gt, s.k0, whole.k_stride[2]),
                           rows_at(dv, gt, s.k0, whole.v_stride[2]), NULL, scratch);
        if (draws) // past this sequence's draws, to the next one's
            for (int64_t n = H * s.L * s.S; n > 0; n--) (void)attn__dropout_keep(&gen, 0.5);
    }
    return ATTN_OK;
}

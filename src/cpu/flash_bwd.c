// flash_bwd.c - the fused attention backward (FlashAttention-2), independent of the instruction
// set: the weights are recomputed tile by tile from q, k and the forward's log-sum-exp, and every
// product runs on the kernel table's `gemm`.
//
// Every output element is owned by one work item and summed in a fixed order, so the result is the
// same for every thread count without atomics. Two schedules give the same bits:
//   one pass, one item per (batch, kv head): for each key tile j in turn, for each query head of
//           the group and each query tile i: dV_j += P_drop^T dO_i, dK_j += dS^T Q_i, and
//           dQ_i += dS K_j into a per-thread (group, L, D) accumulator. Each score tile is computed
//           once. Used when there are enough (batch, kv head) items to share out and no mask
//           gradient is asked for.
//   two passes, when the items would be too few for the threads, or for the mask gradient:
//     pass 1, one item per (batch, kv head, key tile): dV_j and dK_j exactly as above;
//     pass 2, one item per (batch, head, query tile): dQ_i = sum dS K_j over the key tiles in
//             ascending order (as the one pass adds them), and the additive mask's gradient dS
//             (items grouped so that the cells a broadcast mask shares are summed by one item, in
//             a fixed order; a mask whose strides overlap otherwise is summed by a single item).
//             The score tiles are computed twice.
// For a tile pair: S^T = K Q^T (masked as in the forward), P^T = exp2(S^T - lse2), dP^T = V dO^T
// (times the dropout mask), dS^T = P^T (dP^T - rowdot) with rowdot_i = dO_i . O_i, exactly 0 where
// P is (so NaN or inf in dO, or a dO . V that overflows, never reaches a hidden pair). Key or value
// tiles, and query tiles whose q or dO rows, hold NaN or inf take products that skip zero
// weights, so data a pair cannot see is never read.
// Soft-capping multiplies dS by 1 - tanh^2 of the capped score (the mask gradient is dS before
// that factor); ALiBi and the window enter as in the forward, and key tiles outside the window are
// skipped. Half-precision keys and values are converted to float copies once per call; half-precision
// q and dout are converted as they are packed (they always are then), out as rowdot reads it, and
// the gradients are rounded to grad_dtype as they are written.
// With bf16 dot products (a table with gemm_bf16; bf16 q, k, v and dout, even head dims, contiguous
// key and value rows, every input finite) the five products run on them: S^T and dP^T read the key
// and value rows in place against query and dout tiles packed in pairs once per call; dK and dV take
// dS^T and P^T rounded to bf16 rows against query and dout rows paired along the queries, dQ takes
// dS paired along the keys against key rows paired once per call (cpu.h's layouts). Inputs holding
// NaN or inf take the float32 path, whose products skip zero weights.
#include <math.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/flash.h"
#include "dropout.h"
#include "half.h"

#define LOG2E 1.4426950408889634
#define BWD_BR 64 // queries per tile
#define BWD_BC 64 // keys per tile

static int pad16(int64_t n) { return (int)((n + 15) / 16 * 16); }

typedef struct bwd_job {
    const attn_sdpa_desc *d;    // k_stride and v_stride: of k and v as read here (the float copies)
    const attn__sdpa_shape *sh;
    const attn__kernels *kn;
    const void *q, *dout;       // of d->q_dtype and d->out_dtype
    const float *k, *v;         // float32 (NULL with dot)
    void *dq, *dk, *dv;         // of d->grad_dtype
    float *dmask;
    const int64_t *dk_stride, *dv_stride; // where dk and dv are written (the caller's k and v strides)
    int Dp, Dvp;                // head dims padded to 16
    int64_t n_qtiles, n_kvtiles;
    float qscale;               // scale * log2(e)
    float qp2, qrest;           // dot: qscale split (attn__split_qscale)
    const float *lse2, *rowdot; // (B, H, L)
    attn__dropout drop;         // the forward's dropout mask (drop.on false without dropout)
    const uint8_t *kv_bad;      // (B, Hkv, n_kvtiles): key or value tile holds NaN or inf
    uint8_t *q_bad;             // (B, H, n_qtiles): q or dout rows of the query tile hold NaN or inf
    bool dmask_b, dmask_h, dmask_i; // pass 2 iterates over b / h / query tiles inside one item
    size_t dq_acc_off;          // one pass: offset of the (group, L, Dp) dQ accumulator in a thread's scratch
    // Packed once per call: every query tile transposed and scaled (qt_all) and every dout tile
    // transposed (dot_all), tile after tile; and row copies padded to 16 columns of q, dout and k,
    // unless the tensors themselves can be read as such rows (then *_rows point into them).
    float *qt_all, *dot_all;    // (B, H, n_qtiles, D or Dv, BR)
    const float *q_rows, *do_rows, *k_rows;
    int64_t q_ld, do_ld, k_ld;  // row strides of those rows
    float *q_pack, *do_pack, *k_pack; // the copies when needed, else NULL
    // With bf16 dot products (dot), instead of those: the caller's bf16 k and v (at d's strides),
    // and, packed once per call in cpu.h's pairs:
    bool dot;
    const uint16_t *kb, *vb;
    uint16_t *qp_all, *dop_all; // (B, H, n_qtiles, D/2 or Dv/2, BR) query and dout tiles, pairs along d
    uint16_t *qr_all, *dor_all; // (B, H, n_qtiles, BR/2, Dp or Dvp) query and dout rows paired
    uint16_t *kr_all;           // (B, Hkv, n_kvtiles, BC/2, Dp) key rows paired
    char *scratch;
    size_t per_thread;
} bwd_job;

// Per-thread tiles.
typedef struct bwd_tiles {
    const float *qt, *dot;   // views into qt_all, dot_all
    const uint16_t *qp, *dop, *qr, *dor; // dot: views into qp_all, dop_all, qr_all, dor_all
    float *st, *dpt;         // (BC, BR) P^T and dP^T -> dS^T
    float *acc1;             // (BC, Dp) dK accumulator / (BR, Dp) dQ accumulator
    float *acc2;             // (BC, Dvp) dV accumulator
    float *lse2, *rowdot;    // (BR) the tile's rows, padded (+inf, 0)
    float *th;               // (BC, BR) tanh of the soft-capped scores
    // dot: P^T and dS^T as bf16 rows (BC, BR), dS^T paired along the keys (BC/2, BR pairs), and
    // BR ones (gemm_bf16's row scale when it accumulates)
    uint16_t *pb, *dsb, *dsp;
    float *ones;
    bool trim;               // the pair's products only over what the bounds leave (tile_pair)
} bwd_tiles;

static size_t tiles_layout(int Dp, int Dvp, bool dot, bwd_tiles *t, char *base) {
    attn__arena a = {.base = base};
    const size_t f = sizeof(float), h = sizeof(uint16_t);
    const size_t rows = BWD_BR > BWD_BC ? BWD_BR : BWD_BC;
    bwd_tiles x;
    x.qt = x.dot = NULL;
    x.qp = x.dop = x.qr = x.dor = NULL;
    x.st = attn__arena_take(&a, (size_t)BWD_BC * BWD_BR * f);
    x.dpt = attn__arena_take(&a, (size_t)BWD_BC * BWD_BR * f);
    x.acc1 = attn__arena_take(&a, rows * (size_t)Dp * f);
    x.acc2 = attn__arena_take(&a, (size_t)BWD_BC * (size_t)Dvp * f);
    x.lse2 = attn__arena_take(&a, BWD_BR * f);
    x.rowdot = attn__arena_take(&a, BWD_BR * f);
    x.th = attn__arena_take(&a, (size_t)BWD_BC * BWD_BR * f);
    x.pb = dot ? attn__arena_take(&a, (size_t)BWD_BC * BWD_BR * h) : NULL;
    x.dsb = dot ? attn__arena_take(&a, (size_t)BWD_BC * BWD_BR * h) : NULL;
    x.dsp = dot ? attn__arena_take(&a, (size_t)BWD_BC * BWD_BR * h) : NULL;
    x.ones = dot ? attn__arena_take(&a, rows * f) : NULL;
    if (t != NULL) {
        for (size_t i = 0; x.ones != NULL && i < rows; i++) x.ones[i] = 1.0f;
        *t = x;
    }
    return a.used;
}

// Points t at query tile `it` of head (b, h) and copies the tile's lse2 and rowdot.
static void load_queries(const bwd_job *J, bwd_tiles *t, int64_t b, int64_t h, int64_t it, int nq) {
    const int64_t bh = b * J->sh->H + h, i0 = it * BWD_BR, tile = bh * J->n_qtiles + it;
    if (J->dot) {
        t->qp = J->qp_all + tile * J->sh->D * BWD_BR, t->dop = J->dop_all + tile * J->sh->Dv * BWD_BR;
        t->qr = J->qr_all + tile * BWD_BR * J->Dp, t->dor = J->dor_all + tile * BWD_BR * J->Dvp;
    } else {
        t->qt = J->qt_all + tile * J->sh->D * BWD_BR, t->dot = J->dot_all + tile * J->sh->Dv * BWD_BR;
    }
    for (int i = 0; i < BWD_BR; i++) {
        t->lse2[i] = i < nq ? J->lse2[bh * J->sh->L + i0 + i] : INFINITY; // padding: weight 0
        t->rowdot[i] = i < nq ? J->rowdot[bh * J->sh->L + i0 + i] : 0.0f;
    }
}

// A tile pair that the causal or window bounds alone cut through (no mask, no soft-capping or ALiBi)
// takes its five products in groups of keys or queries (ATTN_TRIM_ROWS, the float32 gemm kernels'
// 6-row block; ATTN_TRIM_ROWS_BF16 on the bf16 dot products, whose sums over queries or keys go in
// pairs) without what the bounds hide, as the forward does: S^T and dP^T each group of keys from the
// first 16-query block that sees its first key to the end of the block in which the last query that
// sees its last key lies (attn__key_rows_product; the entries outside are hidden, so P and dS are 0
// there whatever they held), dK and dV each group of keys summed over the queries from the first
// that sees its first key to the last that sees its last, dQ each group of queries summed over the
// keys the group sees. Only zero products are left out.

// C (nj, BWD_BR) = A (nj rows at a_rs, a_cs; K) B (K, BWD_BR): S^T or dP^T of a tile pair.
static void keys_by_queries(const bwd_job *J, const bwd_tiles *t, int64_t i0, int nq, int64_t j0, int nj,
                            const float *A, int64_t a_rs, int64_t a_cs, int K, const float *B, float *C) {
    if (t->trim)
        attn__key_rows_product(J->kn, J->d, J->sh, i0, nq, j0, nj, A, a_rs, a_cs, K, B, BWD_BR, BWD_BR, C);
    else
        J->kn->gemm(A, a_rs, a_cs, nj, K, B, BWD_BR, BWD_BR, C, BWD_BR, false);
}

// C (nj, N) += A (nj keys x nq queries, rows BWD_BR apart) B (nq, N at ldb): dK or dV of a tile pair.
static void keys_from_queries(const bwd_job *J, const bwd_tiles *t, int64_t i0, int nq, int64_t j0, int nj,
                              const float *A, const float *B, int64_t ldb, int N, float *C, int64_t ldc) {
    if (!t->trim) {
        J->kn->gemm(A, BWD_BR, 1, nj, nq, B, ldb, N, C, ldc, true);
        return;
    }
    for (int r = 0; r < nj; r += ATTN_TRIM_ROWS) {
        const int rows = nj - r < ATTN_TRIM_ROWS ? nj - r : ATTN_TRIM_ROWS;
        const int c = attn__first_query_seeing(J->d, J->sh, i0, nq, j0 + r);
        const int e = attn__last_query_seeing(J->d, J->sh, i0, nq, j0 + r + rows - 1);
        if (c < e)
            J->kn->gemm(A + (int64_t)r * BWD_BR + c, BWD_BR, 1, rows, e - c, B + (int64_t)c * ldb, ldb, N,
                        C + (int64_t)r * ldc, ldc, true);
    }
}

// C (nq, N) += A^T B (nj, N at ldb), A the pair's dS^T (nj, BWD_BR) read transposed: dQ of a tile pair.
static void queries_from_keys(const bwd_job *J, const bwd_tiles *t, int64_t i0, int nq, int64_t j0, int nj,
                              const float *A, const float *B, int64_t ldb, int N, float *C, int64_t ldc) {
    if (!t->trim) {
        J->kn->gemm(A, 1, BWD_BR, nq, nj, B, ldb, N, C, ldc, true);
        return;
    }
    for (int r = 0; r < nq; r += ATTN_TRIM_ROWS) {
        const int rows = nq - r < ATTN_TRIM_ROWS ? nq - r : ATTN_TRIM_ROWS;
        int lo, hi;
        attn__tile_keys_seen(J->d, J->sh, i0 + r, rows, j0, nj, &lo, &hi);
        if (lo < hi)
            J->kn->gemm(A + (int64_t)lo * BWD_BR + r, 1, BWD_BR, rows, hi - lo, B + (int64_t)lo * ldb, ldb, N,
                        C + (int64_t)r * ldc, ldc, true);
    }
}

// The first two on the bf16 dot products (flash.h's *_bf16 products where the pair is trimmed; dQ's
// is add_dq_dot, below).
// C (nj, BWD_BR) = scale A (nj rows at a_rs, K2 pairs) B (K2, BWD_BR pairs): S^T or dP^T.
static void dot_keys_by_queries(const bwd_job *J, const bwd_tiles *t, int64_t i0, int nq, int64_t j0, int nj,
                                const uint16_t *A, int64_t a_rs, int K2, const uint16_t *B, float *C, float scale) {
    if (t->trim)
        attn__key_rows_product_bf16(J->kn, J->d, J->sh, i0, nq, j0, nj, A, a_rs, K2, B, BWD_BR, C, BWD_BR, scale);
    else
        J->kn->gemm_bf16(A, a_rs, 2, nj, K2, B, BWD_BR, BWD_BR, C, BWD_BR, NULL, scale);
}

// C (nj, N) += A (nj bf16 rows of BWD_BR queries) B (query pairs, N at ldb): dK or dV.
static void dot_keys_from_queries(const bwd_job *J, const bwd_tiles *t, int64_t i0, int nq, int64_t j0, int nj,
                                  const uint16_t *A, const uint16_t *B, int64_t ldb, int N, float *C) {
    if (t->trim)
        attn__keys_from_queries_bf16(J->kn, J->d, J->sh, i0, nq, j0, nj, A, BWD_BR, B, ldb, N, C, N, t->ones);
    else
        J->kn->gemm_bf16(A, BWD_BR, 2, nj, (nq + 1) / 2, B, ldb, N, C, N, t->ones, 1.0f); // a missing query is 0
}

// P^T and dS^T of tile pair (b, h, query tile at i0) x (key tile at j0) into t->st, t->dpt. Returns
// false when every score is hidden (the pair contributes nothing).
static bool tile_pair(const bwd_job *J, bwd_tiles *t, int64_t b, int64_t h, int64_t i0, int nq, int64_t j0, int nj) {
    const attn_sdpa_desc *d = J->d;
    const attn__sdpa_shape *sh = J->sh;
    const int64_t hk = h / sh->group;
    const bool masked = d->mask != NULL || d->key_padding_mask != NULL;
    const bool transform = d->softcap > 0.0f || d->alibi_slopes != NULL;
    t->trim = !masked && !transform && attn__tile_crosses_bounds(d, sh, i0, nq, j0, nj);
    if (J->dot) // S^T = scale log2(e) K Q^T, the key rows' pairs read in place
        dot_keys_by_queries(J, t, i0, nq, j0, nj, J->kb + attn__offset4(d->k_stride, b, hk, j0, 0), d->k_stride[2],
                            (int)sh->D / 2, t->qp, t->st, J->qrest);
    else
        keys_by_queries(J, t, i0, nq, j0, nj, J->k + attn__offset4(d->k_stride, b, hk, j0, 0), d->k_stride[2],
                        d->k_stride[3], (int)sh->D, t->qt, t->st);
    if (transform)
        attn__score_transform(J->kn, d, sh, BWD_BR, h, i0, nq, j0, nj, t->st, t->th);
    if (masked) {
        if (!attn__mask_tile(d, sh, BWD_BR, b, h, i0, nq, j0, nj, t->st)) return false;
    } else if (attn__tile_crosses_bounds(d, sh, i0, nq, j0, nj)) {
        if (!attn__bounds_tile(d, sh, BWD_BR, i0, nq, j0, nj, t->st)) return false;
    }
    J->kn->bwd_p(t->st, nj, BWD_BR, t->lse2);
    // dP^T = V dout^T
    if (J->dot)
        dot_keys_by_queries(J, t, i0, nq, j0, nj, J->vb + attn__offset4(d->v_stride, b, hk, j0, 0), d->v_stride[2],
                            (int)sh->Dv / 2, t->dop, t->dpt, 1.0f);
    else
        keys_by_queries(J, t, i0, nq, j0, nj, J->v + attn__offset4(d->v_stride, b, hk, j0, 0), d->v_stride[2],
                        d->v_stride[3], (int)sh->Dv, t->dot, t->dpt);
    if (J->drop.on) // the forward's dropout: dP of dropped weights is 0, kept ones scaled
        attn__dropout_tile(&J->drop, b, h, i0, nq, j0, nj, t->dpt, BWD_BR, J->drop.keep_scale);
    J->kn->bwd_ds(t->st, t->dpt, nj, BWD_BR, t->rowdot); // 0 where P is 0, whatever dP holds
    return true;
}

// Soft-capping: dS of the capped score times d cap / d x = 1 - tanh^2 (zeros stay zero, whatever
// the padding or hidden entries of th hold).
static void cap_grad(const bwd_job *J, bwd_tiles *t, int nj) {
    if (!(J->d->softcap > 0.0f)) return;
    for (int64_t e = 0; e < (int64_t)nj * BWD_BR; e++)
        if (t->dpt[e] != 0.0f) t->dpt[e] *= 1.0f - t->th[e] * t->th[e];
}

// Whether the key tile [j0, j0+nj) lies wholly left of the window of every query from i0 on.
static bool left_of_window(const bwd_job *J, int64_t i0, int64_t j0, int nj) {
    return attn__keys_visible_from(J->d, J->sh, i0) >= j0 + nj;
}

// C (M x N) += A (M x K at strides) B (K x N), skipping zero elements of A (so NaN or inf in the
// rows of B they would multiply is not read).
static void gemm_skip_zeros(const float *A, int64_t a_rs, int64_t a_cs, int M, int K, const float *B, int64_t ldb,
                            int N, float *C, int64_t ldc) {
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) {
            const float a = A[(int64_t)m * a_rs + (int64_t)k * a_cs];
            if (a == 0.0f) continue;
            for (int n = 0; n < N; n++) C[(int64_t)m * ldc + n] += a * B[(int64_t)k * ldb + n];
        }
}

// dQ_i (nq rows, row stride Dp) += dS K_j on the dot products: dS paired along the keys against
// the key tile's paired rows.
static void add_dq_dot(const bwd_job *J, bwd_tiles *t, int64_t b, int64_t hk, int64_t i0, int nq, int64_t jt, int nj,
                       float *dqi) {
    J->kn->pack_pairs_bf16(t->dpt, BWD_BR, nj, BWD_BR, t->dsp);
    const uint16_t *kr = J->kr_all + ((b * J->sh->Hkv + hk) * J->n_kvtiles + jt) * BWD_BC * J->Dp;
    if (t->trim)
        attn__query_rows_product_bf16(J->kn, J->d, J->sh, i0, nq, jt * BWD_BC, nj, t->dsp, BWD_BR, kr, J->Dp, J->Dp, dqi,
                                      J->Dp, t->ones);
    else
        J->kn->gemm_bf16(t->dsp, 2, 2 * BWD_BR, nq, (nj + 1) / 2, kr, J->Dp, J->Dp, dqi, J->Dp, t->ones, 1.0f);
}

// The gradients of key tile jt of (b, hk): dK_j and dV_j, written out; with dq_acc (the group's
// (group, L, Dp) dQ accumulator) also each pair's dS K_j added to the query rows.
static void kv_tile(const bwd_job *J, bwd_tiles *t, int64_t b, int64_t hk, int64_t jt, float *dq_acc) {
    const attn_sdpa_desc *d = J->d;
    const attn__sdpa_shape *sh = J->sh;
    const int64_t j0 = jt * BWD_BC;
    const int nj = (int)(sh->S - j0 < BWD_BC ? sh->S - j0 : BWD_BC);
    const bool bad = J->kv_bad[(b * sh->Hkv + hk) * J->n_kvtiles + jt];
    memset(t->acc1, 0, (size_t)nj * (size_t)J->Dp * sizeof(float));
    memset(t->acc2, 0, (size_t)nj * (size_t)J->Dvp * sizeof(float));
    const float *kr = J->dot           ? NULL
                      : J->k_pack != NULL ? J->k_rows + ((b * sh->Hkv + hk) * sh->S + j0) * J->k_ld
                                          : J->k + attn__offset4(d->k_stride, b, hk, j0, 0);
    for (int64_t h = hk * sh->group; h < (hk + 1) * sh->group; h++)
        for (int64_t it = 0; it < J->n_qtiles; it++) {
            const int64_t i0 = it * BWD_BR;
            const int nq = (int)(sh->L - i0 < BWD_BR ? sh->L - i0 : BWD_BR);
            if (attn__keys_visible_until(d, sh, i0 + nq - 1) <= j0) continue; // every key hidden (causal)
            if (left_of_window(J, i0, j0, nj)) continue;
            load_queries(J, t, b, h, it, nq);
            if (!tile_pair(J, t, b, h, i0, nq, j0, nj)) continue;
            cap_grad(J, t, nj);
            if (J->dot) { // dK_j += dS^T Q_i, dQ_i += dS K_j, dV_j += P_drop^T dO_i, dS and P rounded to bf16
                J->kn->round_bf16(t->dpt, (int64_t)nj * BWD_BR, t->dsb);
                dot_keys_from_queries(J, t, i0, nq, j0, nj, t->dsb, t->qr, J->Dp, J->Dp, t->acc1);
                if (dq_acc != NULL)
                    add_dq_dot(J, t, b, hk, i0, nq, jt, nj, dq_acc + ((h - hk * sh->group) * sh->L + i0) * J->Dp);
                if (J->drop.on) attn__dropout_tile(&J->drop, b, h, i0, nq, j0, nj, t->st, BWD_BR, J->drop.keep_scale);
                J->kn->round_bf16(t->st, (int64_t)nj * BWD_BR, t->pb);
                dot_keys_from_queries(J, t, i0, nq, j0, nj, t->pb, t->dor, J->Dvp, J->Dvp, t->acc2);
                continue;
            }
            const bool qbad = J->q_bad[(b * sh->H + h) * J->n_qtiles + it];
            // dK_j += dS^T q_rows; dV_j += P_drop^T dout_rows (P_drop = P * dropout mask * scale)
            const int64_t row0 = (b * sh->H + h) * sh->L + i0; // row index into the packed copies
            const float *qr = J->q_pack != NULL ? J->q_rows + row0 * J->q_ld
                                                : (const float *)J->q + attn__offset4(d->q_stride, b, h, i0, 0);
            const float *dr = J->do_pack != NULL ? J->do_rows + row0 * J->do_ld
                                                 : (const float *)J->dout + attn__offset4(d->o_stride, b, h, i0, 0);
            if (qbad)
                gemm_skip_zeros(t->dpt, BWD_BR, 1, nj, nq, qr, J->q_ld, J->Dp, t->acc1, J->Dp);
            else
                keys_from_queries(J, t, i0, nq, j0, nj, t->dpt, qr, J->q_ld, J->Dp, t->acc1, J->Dp);
            if (dq_acc != NULL) { // dQ_i += dS k_rows, dS read transposed from dS^T (as pass 2 does)
                float *dqi = dq_acc + ((h - hk * sh->group) * sh->L + i0) * J->Dp;
                if (bad)
                    gemm_skip_zeros(t->dpt, 1, BWD_BR, nq, nj, kr, J->k_ld, J->Dp, dqi, J->Dp);
                else
                    queries_from_keys(J, t, i0, nq, j0, nj, t->dpt, kr, J->k_ld, J->Dp, dqi, J->Dp);
            }
            if (J->drop.on) attn__dropout_tile(&J->drop, b, h, i0, nq, j0, nj, t->st, BWD_BR, J->drop.keep_scale);
            if (qbad)
                gemm_skip_zeros(t->st, BWD_BR, 1, nj, nq, dr, J->do_ld, J->Dvp, t->acc2, J->Dvp);
            else
                keys_from_queries(J, t, i0, nq, j0, nj, t->st, dr, J->do_ld, J->Dvp, t->acc2, J->Dvp);
        }
    const float scale = J->sh->scale;
    for (int j = 0; j < nj; j++) {
        const int64_t dkr = attn__offset4(J->dk_stride, b, hk, j0 + j, 0);
        const int64_t dvr = attn__offset4(J->dv_stride, b, hk, j0 + j, 0);
        attn__scatter(J->dk, d->grad_dtype, dkr, J->dk_stride[3], t->acc1 + (int64_t)j * J->Dp, 1, sh->D, scale);
        attn__scatter(J->dv, d->grad_dtype, dvr, J->dv_stride[3], t->acc2 + (int64_t)j * J->Dvp, 1, sh->Dv, 1.0f);
    }
}

static void pass1_task(void *arg, int64_t task, int thread) {
    const bwd_job *J = arg;
    const int64_t jt = task % J->n_kvtiles, bhk = task / J->n_kvtiles;
    bwd_tiles t;
    tiles_layout(J->Dp, J->Dvp, J->dot, &t, J->scratch + (size_t)thread * J->per_thread);
    kv_tile(J, &t, bhk / J->sh->Hkv, bhk % J->sh->Hkv, jt, NULL);
}

// The one-pass schedule: every key tile of (b, hk) in ascending order, then dQ of the group's heads.
static void one_pass_task(void *arg, int64_t bhk, int thread) {
    const bwd_job *J = arg;
    const attn_sdpa_desc *d = J->d;
    const attn__sdpa_shape *sh = J->sh;
    const int64_t b = bhk / sh->Hkv, hk = bhk % sh->Hkv;
    char *mine = J->scratch + (size_t)thread * J->per_thread;
    bwd_tiles t;
    tiles_layout(J->Dp, J->Dvp, J->dot, &t, mine);
    float *dq_acc = (float *)(mine + J->dq_acc_off); // (group, L, Dp)
    memset(dq_acc, 0, (size_t)(sh->group * sh->L * J->Dp) * sizeof(float));
    for (int64_t jt = 0; jt < J->n_kvtiles; jt++) kv_tile(J, &t, b, hk, jt, dq_acc);
    const float scale = sh->scale;
    for (int64_t g = 0; g < sh->group; g++)
        for (int64_t i = 0; i < sh->L; i++) {
            const int64_t dqr = attn__offset4(d->q_stride, b, hk * sh->group + g, i, 0);
            const float *acc = dq_acc + (g * sh->L + i) * J->Dp;
            attn__scatter(J->dq, d->grad_dtype, dqr, d->q_stride[3], acc, 1, sh->D, scale);
        }
}

// dQ (and the mask gradient) of one query tile of one head.
static void pass2_tile(const bwd_job *J, bwd_tiles *t, int64_t b, int64_t h, int64_t it) {
    const attn_sdpa_desc *d = J->d;
    const attn__sdpa_shape *sh = J->sh;
    const int64_t hk = h / sh->group, i0 = it * BWD_BR;
    const int nq = (int)(sh->L - i0 < BWD_BR ? sh->L - i0 : BWD_BR);
    load_queries(J, t, b, h, it, nq);
    memset(t->acc1, 0, (size_t)BWD_BR * (size_t)J->Dp * sizeof(float));
    const int64_t j_end = attn__keys_visible_until(d, sh, i0 + nq - 1);
    for (int64_t j0 = 0; j0 < j_end; j0 += BWD_BC) {
        const int nj = (int)(sh->S - j0 < BWD_BC ? sh->S - j0 : BWD_BC);
        const bool bad = J->kv_bad[(b * sh->Hkv + hk) * J->n_kvtiles + j0 / BWD_BC];
        if (left_of_window(J, i0, j0, nj)) continue;
        if (!tile_pair(J, t, b, h, i0, nq, j0, nj)) continue;
        if (J->dmask != NULL) // the mask's gradient is dS (natural-log domain: no scale)
            for (int j = 0; j < nj; j++)
                for (int i = 0; i < nq; i++)
                    J->dmask[attn__offset4(d->mask_stride, b, h, i0 + i, j0 + j)] += t->dpt[(int64_t)j * BWD_BR + i];
        cap_grad(J, t, nj);
        if (J->dot) {
            add_dq_dot(J, t, b, hk, i0, nq, j0 / BWD_BC, nj, t->acc1);
            continue;
        }
        // dQ_i += dS k_rows, with dS read transposed from dS^T
        const float *kr = J->k_pack != NULL ? J->k_rows + ((b * sh->Hkv + hk) * sh->S + j0) * J->k_ld
                                            : J->k + attn__offset4(d->k_stride, b, hk, j0, 0);
        if (bad)
            gemm_skip_zeros(t->dpt, 1, BWD_BR, nq, nj, kr, J->k_ld, J->Dp, t->acc1, J->Dp);
        else
            queries_from_keys(J, t, i0, nq, j0, nj, t->dpt, kr, J->k_ld, J->Dp, t->acc1, J->Dp);
    }
    const float scale = sh->scale;
    for (int i = 0; i < nq; i++) {
        const int64_t dqr = attn__offset4(d->q_stride, b, h, i0 + i, 0);
        attn__scatter(J->dq, d->grad_dtype, dqr, d->q_stride[3], t->acc1 + (int64_t)i * J->Dp, 1, sh->D, scale);
    }
}

// An item covers the (b, h, query tile) cells that share mask-gradient cells: dimensions the mask
// broadcasts are iterated inside the item, in ascending order.
static void pass2_task(void *arg, int64_t task, int thread) {
    const bwd_job *J = arg;
    const attn__sdpa_shape *sh = J->sh;
    const int64_t nb = J->dmask_b ? 1 : sh->B, nh = J->dmask_h ? 1 : sh->H;
    const int64_t it0 = task % (J->dmask_i ? 1 : J->n_qtiles), rest = task / (J->dmask_i ? 1 : J->n_qtiles);
    const int64_t h0 = rest % nh, b0 = rest / nh;
    bwd_tiles t;
    tiles_layout(J->Dp, J->Dvp, J->dot, &t, J->scratch + (size_t)thread * J->per_thread);
    for (int64_t b = J->dmask_b ? 0 : b0; b < (J->dmask_b ? sh->B : b0 + 1); b++)
        for (int64_t h = J->dmask_h ? 0 : h0; h < (J->dmask_h ? sh->H : h0 + 1); h++)
            for (int64_t it = J->dmask_i ? 0 : it0; it < (J->dmask_i ? J->n_qtiles : it0 + 1); it++)
                pass2_tile(J, &t, b, h, it);
    (void)nb;
}

// rowdot = dout . out and lse2 = lse * log2(e) for every row, the packed query and dout tiles and
// rows; flags of key/value tiles holding NaN or inf, and the packed key rows.
typedef struct prep_job {
    const bwd_job *J;
    const void *out;            // of d->out_dtype
    const float *lse;
    float *lse2, *rowdot;
    uint8_t *kv_bad;
} prep_job;

// y (rows/2 x w pairs): y[2*((i/2)*w + c) + i%2] = x[b, h, i0 + i, c] for i < nr and c < n, 0 elsewhere:
// a tile's rows paired (contiguous rows by the kernel table's pair_rows_bf16, the padding rows
// zeroed after them).
static void pair_along_rows(const attn__kernels *kn, const uint16_t *x, const int64_t s[4], int64_t b, int64_t h,
                            int64_t i0, int64_t nr, int64_t n, int64_t w, int64_t rows, uint16_t *y) {
    if (kn->pair_rows_bf16 != NULL && s[3] == 1 && nr > 0) {
        kn->pair_rows_bf16(x + attn__offset4(s, b, h, i0, 0), s[2], (int)nr, (int)n, (int)w, y);
        const int64_t done = (nr + 1) / 2 * 2; // rows written, the odd last one's partner included
        memset(y + done * w, 0, (size_t)((rows - done) * w) * sizeof *y);
        return;
    }
    for (int64_t i = 0; i < rows; i++) {
        const uint16_t *xr = i < nr ? x + attn__offset4(s, b, h, i0 + i, 0) : NULL; // the row, once
        uint16_t *yr = y + 2 * (i / 2) * w + i % 2;
        for (int64_t c = 0; c < w; c++) yr[2 * c] = xr != NULL && c < n ? xr[c * s[3]] : 0;
    }
}

// Element off of x (type dt: F32 or a half type).
static const void *elem(const void *x, attn_dtype dt, int64_t off) { return (const char *)x + attn__kv_bytes(dt, off); }

#define ROWDOT_CHUNK 64
static void prep_rows_task(void *arg, int64_t bh, int thread) {
    (void)thread;
    const prep_job *P = arg;
    const bwd_job *J = P->J;
    const attn_sdpa_desc *d = J->d;
    const attn__sdpa_shape *sh = J->sh;
    const int64_t b = bh / sh->H, h = bh % sh->H;
    for (int64_t it = 0; J->dot && it < J->n_qtiles; it++) { // dot: the tiles in pairs (all finite)
        const int64_t i0 = it * BWD_BR, nq = sh->L - i0 < BWD_BR ? sh->L - i0 : BWD_BR, tile = bh * J->n_qtiles + it;
        attn__pair_tile_bf16(J->kn, J->q, d->q_stride, b, h, i0, nq, sh->D, BWD_BR, J->qp2, J->qp_all + tile * sh->D * BWD_BR);
        attn__pair_tile_bf16(J->kn, J->dout, d->o_stride, b, h, i0, nq, sh->Dv, BWD_BR, 1.0f,
                             J->dop_all + tile * sh->Dv * BWD_BR);
        pair_along_rows(J->kn, J->q, d->q_stride, b, h, i0, nq, sh->D, J->Dp, BWD_BR, J->qr_all + tile * BWD_BR * J->Dp);
        pair_along_rows(J->kn, J->dout, d->o_stride, b, h, i0, nq, sh->Dv, J->Dvp, BWD_BR, J->dor_all + tile * BWD_BR * J->Dvp);
        J->q_bad[tile] = 0;
    }
    // every query tile of the head transposed (and scaled), and every dout tile transposed
    for (int64_t it = 0; !J->dot && it < J->n_qtiles; it++) {
        const int64_t i0 = it * BWD_BR, nq = sh->L - i0 < BWD_BR ? sh->L - i0 : BWD_BR;
        float *qt = J->qt_all + (bh * J->n_qtiles + it) * sh->D * BWD_BR;
        float *dot = J->dot_all + (bh * J->n_qtiles + it) * sh->Dv * BWD_BR;
        attn__tile_f32(J->kn, J->q, d->q_dtype, d->q_stride, b, h, i0, nq, sh->D, BWD_BR, BWD_BR, J->qscale, qt);
        attn__tile_f32(J->kn, J->dout, d->out_dtype, d->o_stride, b, h, i0, nq, sh->Dv, BWD_BR, BWD_BR, 1.0f, dot);
        uint8_t bad = 0;
        for (int64_t e = 0; e < sh->D * BWD_BR; e++) bad |= !isfinite(qt[e]);
        for (int64_t e = 0; e < sh->Dv * BWD_BR; e++) bad |= !isfinite(dot[e]);
        J->q_bad[bh * J->n_qtiles + it] = bad;
    }
    for (int64_t i = 0; J->q_pack != NULL && i < sh->L; i++) {
        float *r = J->q_pack + (bh * sh->L + i) * J->q_ld;
        attn__rows_as_f32(J->kn, d->q_dtype, elem(J->q, d->q_dtype, attn__offset4(d->q_stride, b, h, i, 0)), 0,
                          d->q_stride[3], 1, sh->D, J->q_ld, r);
        for (int64_t c = sh->D; c < J->q_ld; c++) r[c] = 0.0f;
    }
    for (int64_t i = 0; J->do_pack != NULL && i < sh->L; i++) {
        float *r = J->do_pack + (bh * sh->L + i) * J->do_ld;
        attn__rows_as_f32(J->kn, d->out_dtype, elem(J->dout, d->out_dtype, attn__offset4(d->o_stride, b, h, i, 0)), 0,
                          d->o_stride[3], 1, sh->Dv, J->do_ld, r);
        for (int64_t c = sh->Dv; c < J->do_ld; c++) r[c] = 0.0f;
    }
    for (int64_t i = 0; i < sh->L; i++) { // dout . out in double, ROWDOT_CHUNK elements of each as floats at a time
        const int64_t o = attn__offset4(d->o_stride, b, h, i, 0), es = d->o_stride[3];
        // dout's row as floats where the loop above packed it (the same values: the conversion is exact)
        const float *packed = J->do_pack != NULL ? J->do_pack + (bh * sh->L + i) * J->do_ld : NULL;
        double acc = 0.0;
        for (int64_t c0 = 0; c0 < sh->Dv; c0 += ROWDOT_CHUNK) {
            const int64_t n = sh->Dv - c0 < ROWDOT_CHUNK ? sh->Dv - c0 : ROWDOT_CHUNK;
            float of[ROWDOT_CHUNK], df[ROWDOT_CHUNK];
            attn__rows_as_f32(J->kn, d->out_dtype, elem(P->out, d->out_dtype, o + c0 * es), 0, es, 1, n, n, of);
            if (packed == NULL)
                attn__rows_as_f32(J->kn, d->out_dtype, elem(J->dout, d->out_dtype, o + c0 * es), 0, es, 1, n, n, df);
            const float *dr = packed != NULL ? packed + c0 : df;
            for (int64_t c = 0; c < n; c++) acc += (double)of[c] * dr[c];
        }
        P->rowdot[bh * sh->L + i] = (float)acc;
        // clamped as the forward clamps its scores: an lse past FLT_MAX ln 2 (the reference's, of a
        // row with a float mask term that large) still gives its top keys their weight
        P->lse2[bh * sh->L + i] = attn__clamp_flt((double)P->lse[bh * sh->L + i] * LOG2E);
    }
}

static void prep_tiles_task(void *arg, int64_t task, int thread) {
    (void)thread;
    const prep_job *P = arg;
    const attn_sdpa_desc *d = P->J->d;
    const attn__sdpa_shape *sh = P->J->sh;
    const int64_t jt = task % P->J->n_kvtiles, bhk = task / P->J->n_kvtiles;
    const int64_t b = bhk / sh->Hkv, hk = bhk % sh->Hkv;
    const int64_t j_end = (jt + 1) * BWD_BC < sh->S ? (jt + 1) * BWD_BC : sh->S;
    if (P->J->dot) { // the key rows paired (all finite)
        pair_along_rows(P->J->kn, P->J->kb, d->k_stride, b, hk, jt * BWD_BC, j_end - jt * BWD_BC, sh->D, P->J->Dp, BWD_BC,
                        P->J->kr_all + task * BWD_BC * P->J->Dp);
        P->kv_bad[task] = 0;
        return;
    }
    uint8_t bad = 0;
    for (int64_t j = jt * BWD_BC; j < j_end && !bad; j++) {
        const float *kr = P->J->k + attn__offset4(d->k_stride, b, hk, j, 0);
        const float *vr = P->J->v + attn__offset4(d->v_stride, b, hk, j, 0);
        for (int64_t c = 0; c < sh->D; c++) bad |= !isfinite(kr[c * d->k_stride[3]]);
        for (int64_t c = 0; c < sh->Dv; c++) bad |= !isfinite(vr[c * d->v_stride[3]]);
    }
    P->kv_bad[task] = bad;
    for (int64_t j = jt * BWD_BC; P->J->k_pack != NULL && j < j_end; j++) { // key rows padded to Dp
        float *r = P->J->k_pack + (bhk * sh->S + j) * P->J->k_ld;
        const float *src = P->J->k + attn__offset4(d->k_stride, b, hk, j, 0);
        for (int64_t c = 0; c < P->J->k_ld; c++) r[c] = c < sh->D ? src[c * d->k_stride[3]] : 0.0f;
    }
}

typedef struct bwd_layout {
    uint8_t *fin;         // (B*H + B*Hkv) dot: 1 where a head's q and dout, or k and v, hold NaN or inf
    uint16_t *qp_all, *dop_all, *qr_all, *dor_all, *kr_all; // dot (bwd_job)
    float *lse2, *rowdot, *qt_all, *dot_all, *q_pack, *do_pack, *k_pack;
    float *k_f32, *v_f32; // half-precision k and v as floats, (B, Hkv, S, D) and (B, Hkv, S, Dv)
    uint8_t *kv_bad, *q_bad, *keep;
    char *scratch;
    size_t per_thread, dq_acc_off;
} bwd_layout;

// Rows of a (.., rows, n) tensor can serve as a gemm operand in place when their elements are
// contiguous and n is a multiple of 16 (the operand's padded width).
static bool rows_in_place(int64_t n, const int64_t stride[4]) { return stride[3] == 1 && n % 16 == 0; }

// The one-pass schedule needs enough (batch, kv head) items for the threads, and no mask gradient.
static bool use_one_pass(const attn_ctx *ctx, const attn__sdpa_shape *sh, bool want_dmask) {
    return !want_dmask && sh->B * sh->Hkv >= 2 * (int64_t)attn__pool_threads(ctx->pool);
}

// Whether the backward may run on the table's bf16 dot products (when its inputs are finite too):
// the forward's conditions, and bf16 dout, an even value head dim and contiguous value rows.
static bool use_dot(const attn__kernels *kn, const attn_sdpa_desc *d, const attn__sdpa_shape *sh) {
    return attn__fwd_dot_applies(kn, d, sh) && d->out_dtype == ATTN_DTYPE_BF16 && sh->Dv % 2 == 0 &&
           d->v_stride[3] == 1;
}

// The call's memory; `dot` for the bf16 dot products. fin comes first in both layouts.
static size_t layout(const attn_ctx *ctx, const attn__sdpa_shape *sh, const attn_sdpa_desc *d, bool want_dmask,
                     bool dot, char *base, bwd_layout *bl) {
    const int threads = attn__pool_threads(ctx->pool);
    const int64_t rows = sh->B * sh->H * sh->L, n_kvtiles = (sh->S + BWD_BC - 1) / BWD_BC;
    const int64_t n_qtiles = (sh->L + BWD_BR - 1) / BWD_BR, Dp = pad16(sh->D), Dvp = pad16(sh->Dv);
    const int64_t qtiles = sh->B * sh->H * n_qtiles, ktiles = sh->B * sh->Hkv * n_kvtiles;
    const size_t f = sizeof(float), hs = sizeof(uint16_t);
    const bool half = d->kv_dtype != ATTN_DTYPE_F32 && !dot, pack = !dot;
    attn__arena a = {.base = base};
    bl->fin = attn__arena_take(&a, (size_t)(sh->B * sh->H + sh->B * sh->Hkv));
    bl->lse2 = attn__arena_take(&a, (size_t)rows * f);
    bl->rowdot = attn__arena_take(&a, (size_t)rows * f);
    bl->qp_all = dot ? attn__arena_take(&a, (size_t)(qtiles * sh->D) * BWD_BR * hs) : NULL;
    bl->dop_all = dot ? attn__arena_take(&a, (size_t)(qtiles * sh->Dv) * BWD_BR * hs) : NULL;
    bl->qr_all = dot ? attn__arena_take(&a, (size_t)(qtiles * Dp) * BWD_BR * hs) : NULL;
    bl->dor_all = dot ? attn__arena_take(&a, (size_t)(qtiles * Dvp) * BWD_BR * hs) : NULL;
    bl->kr_all = dot ? attn__arena_take(&a, (size_t)(ktiles * Dp) * BWD_BC * hs) : NULL;
    bl->qt_all = pack ? attn__arena_take(&a, (size_t)(qtiles * sh->D) * BWD_BR * f) : NULL;
    bl->dot_all = pack ? attn__arena_take(&a, (size_t)(qtiles * sh->Dv) * BWD_BR * f) : NULL;
    const bool q_in_place = dot || (d->q_dtype == ATTN_DTYPE_F32 && rows_in_place(sh->D, d->q_stride));
    const bool do_in_place = dot || (d->out_dtype == ATTN_DTYPE_F32 && rows_in_place(sh->Dv, d->o_stride));
    bl->q_pack = q_in_place ? NULL : attn__arena_take(&a, (size_t)(rows * Dp) * f);
    bl->do_pack = do_in_place ? NULL : attn__arena_take(&a, (size_t)(rows * Dvp) * f);
    bl->k_pack = dot || (half ? sh->D % 16 == 0 : rows_in_place(sh->D, d->k_stride))
                     ? NULL
                     : attn__arena_take(&a, (size_t)(sh->B * sh->Hkv * sh->S * Dp) * f);
    bl->kv_bad = attn__arena_take(&a, (size_t)ktiles);
    bl->q_bad = attn__arena_take(&a, (size_t)qtiles);
    bl->k_f32 = half ? attn__arena_take(&a, (size_t)(sh->B * sh->Hkv * sh->S * sh->D) * f) : NULL;
    bl->v_f32 = half ? attn__arena_take(&a, (size_t)(sh->B * sh->Hkv * sh->S * sh->Dv) * f) : NULL;
    bl->keep = attn__arena_take(&a, attn__dropout_bits_bytes(d, sh));
    bl->per_thread = (tiles_layout((int)Dp, (int)Dvp, dot, NULL, NULL) + ATTN_ALIGN - 1) & ~(size_t)(ATTN_ALIGN - 1);
    bl->dq_acc_off = bl->per_thread;
    if (use_one_pass(ctx, sh, want_dmask)) bl->per_thread += (size_t)(sh->group * sh->L * Dp) * f;
    bl->scratch = attn__arena_take(&a, bl->per_thread * (size_t)threads);
    return a.used;
}

// One (b, hk) of half-precision k and v converted to the float copies.
typedef struct half_job {
    const attn__kernels *kn;
    const attn_sdpa_desc *d;
    const attn__sdpa_shape *sh;
    const void *k, *v;
    float *k_f32, *v_f32;
} half_job;

static void half_task(void *arg, int64_t bhk, int thread) {
    (void)thread;
    const half_job *H = arg;
    const attn_sdpa_desc *d = H->d;
    const attn__sdpa_shape *sh = H->sh;
    const int64_t b = bhk / sh->Hkv, hk = bhk % sh->Hkv;
    attn__rows_as_f32(H->kn, d->kv_dtype, (const uint16_t *)H->k + attn__offset4(d->k_stride, b, hk, 0, 0),
                      d->k_stride[2], d->k_stride[3], (int)sh->S, sh->D, sh->D, H->k_f32 + bhk * sh->S * sh->D);
    attn__rows_as_f32(H->kn, d->kv_dtype, (const uint16_t *)H->v + attn__offset4(d->v_stride, b, hk, 0, 0),
                      d->v_stride[2], d->v_stride[3], (int)sh->S, sh->Dv, sh->Dv, H->v_f32 + bhk * sh->S * sh->Dv);
}

size_t attn__flash_bwd_workspace(const attn_ctx *ctx, const attn__sdpa_shape *sh, const attn_sdpa_desc *d,
                                 bool want_dmask) {
    bwd_layout bl;
    const size_t plain = layout(ctx, sh, d, want_dmask, false, NULL, &bl);
    const size_t dot = use_dot(ctx->kernels, d, sh) ? layout(ctx, sh, d, want_dmask, true, NULL, &bl) : 0;
    return plain > dot ? plain : dot;
}

// fin[task] = 1 when head (b, h) of q or dout (task < B*H), or kv head (b, hk) of k or v (after),
// holds a NaN or an infinity (bf16: all exponent bits set).
typedef struct finite_job {
    const attn_sdpa_desc *d;
    const attn__sdpa_shape *sh;
    const uint16_t *q, *k, *v, *dout;
    uint8_t *fin;
} finite_job;

static uint8_t bf16_head_nonfinite(const uint16_t *x, const int64_t s[4], int64_t b, int64_t h, int64_t rows,
                                   int64_t n) {
    unsigned bad = 0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < n; c++) bad |= (x[attn__offset4(s, b, h, i, c)] & 0x7f80u) == 0x7f80u;
    return (uint8_t)bad;
}

static void finite_task(void *arg, int64_t task, int thread) {
    (void)thread;
    const finite_job *F = arg;
    const attn__sdpa_shape *sh = F->sh;
    const int64_t nh = sh->B * sh->H;
    if (task < nh) {
        const int64_t b = task / sh->H, h = task % sh->H;
        F->fin[task] = bf16_head_nonfinite(F->q, F->d->q_stride, b, h, sh->L, sh->D) |
                       bf16_head_nonfinite(F->dout, F->d->o_stride, b, h, sh->L, sh->Dv);
    } else {
        const int64_t b = (task - nh) / sh->Hkv, hk = (task - nh) % sh->Hkv;
        F->fin[task] = bf16_head_nonfinite(F->k, F->d->k_stride, b, hk, sh->S, sh->D) |
                       bf16_head_nonfinite(F->v, F->d->v_stride, b, hk, sh->S, sh->Dv);
    }
}

void attn__flash_bwd(attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh,
                     const attn_generator *dropout_state, const void *q, const void *k, const void *v,
                     const void *out, const void *dout, const float *lse, void *dq, void *dk, void *dv,
                     float *dmask, void *ws) {
    bwd_layout bl;
    layout(ctx, sh, d, dmask != NULL, false, ws, &bl);
    bool dot = use_dot(ctx->kernels, d, sh);
    if (dot) { // only on finite inputs: the float32 path's products skip zero weights, so that NaN or inf stays where it belongs
        const int64_t n = sh->B * sh->H + sh->B * sh->Hkv;
        finite_job fj = {d, sh, q, k, v, dout, bl.fin};
        attn__pool_run(ctx->pool, n, finite_task, &fj);
        for (int64_t i = 0; i < n && dot; i++) dot = bl.fin[i] == 0;
        if (dot) layout(ctx, sh, d, dmask != NULL, true, ws, &bl);
    }
    attn_sdpa_desc dr = *d; // as read: half-precision k and v become contiguous float copies
    if (d->kv_dtype != ATTN_DTYPE_F32 && !dot) {
        half_job hj = {ctx->kernels, d, sh, k, v, bl.k_f32, bl.v_f32};
        attn__pool_run(ctx->pool, sh->B * sh->Hkv, half_task, &hj);
        const int64_t ks[4] = {sh->Hkv * sh->S * sh->D, sh->S * sh->D, sh->D, 1};
        const int64_t vs[4] = {sh->Hkv * sh->S * sh->Dv, sh->S * sh->Dv, sh->Dv, 1};
        memcpy(dr.k_stride, ks, sizeof ks);
        memcpy(dr.v_stride, vs, sizeof vs);
        dr.kv_dtype = ATTN_DTYPE_F32;
        k = bl.k_f32, v = bl.v_f32;
    }
    bwd_job J = {
        .d = &dr, .sh = sh, .kn = ctx->kernels, .q = q, .dout = dout,
        .k = dot ? NULL : k, .v = dot ? NULL : v, .dot = dot, .kb = dot ? k : NULL, .vb = dot ? v : NULL,
        .qp_all = bl.qp_all, .dop_all = bl.dop_all, .qr_all = bl.qr_all, .dor_all = bl.dor_all, .kr_all = bl.kr_all,
        .dq = dq, .dk = dk, .dv = dv, .dmask = dmask, .dk_stride = d->k_stride, .dv_stride = d->v_stride,
        .Dp = pad16(sh->D), .Dvp = pad16(sh->Dv),
        .n_qtiles = (sh->L + BWD_BR - 1) / BWD_BR, .n_kvtiles = (sh->S + BWD_BC - 1) / BWD_BC,
        .qscale = (float)((double)sh->scale * LOG2E),
        .lse2 = bl.lse2, .rowdot = bl.rowdot, .kv_bad = bl.kv_bad, .q_bad = bl.q_bad,
        .qt_all = bl.qt_all, .dot_all = bl.dot_all, .q_pack = bl.q_pack, .do_pack = bl.do_pack, .k_pack = bl.k_pack,
        .scratch = bl.scratch, .per_thread = bl.per_thread, .dq_acc_off = bl.dq_acc_off,
    };
    J.q_rows = bl.q_pack, J.do_rows = bl.do_pack, J.k_rows = bl.k_pack;
    attn__split_qscale(J.qscale, &J.qp2, &J.qrest);
    J.q_ld = bl.q_pack != NULL ? J.Dp : d->q_stride[2];
    J.do_ld = bl.do_pack != NULL ? J.Dvp : d->o_stride[2];
    J.k_ld = bl.k_pack != NULL ? J.Dp : dr.k_stride[2];
    prep_job P = {&J, out, lse, bl.lse2, bl.rowdot, bl.kv_bad};
    attn__pool_run(ctx->pool, sh->B * sh->H, prep_rows_task, &P);
    attn__pool_run(ctx->pool, sh->B * sh->Hkv * J.n_kvtiles, prep_tiles_task, &P);
    if (d->dropout_p > 0.0) { // the forward's mask: its draws regenerated from its starting state, or Philox
        attn_generator gen;
        if (attn__dropout_needs_state(d)) gen = *dropout_state;
        attn__dropout_init(&J.drop, ctx->kernels, d, sh, &gen, bl.keep);
    }
    if (use_one_pass(ctx, sh, dmask != NULL)) {
        attn__pool_run(ctx->pool, sh->B * sh->Hkv, one_pass_task, &J);
        return;
    }
    attn__pool_run(ctx->pool, sh->B * sh->Hkv * J.n_kvtiles, pass1_task, &J);
    if (dmask != NULL) {
        const int64_t n[4] = {sh->B, sh->H, sh->L, sh->S};
        int64_t extent = 0;
        attn__view_extent(n, d->mask_stride, &extent);
        memset(dmask, 0, (size_t)(extent + 1) * sizeof(float));
        // Strides under which distinct cells share elements other than by broadcasting: one item
        // sums everything, in order (items on several threads would add into the same elements).
        const bool shared = !attn__view_disjoint(n, d->mask_stride);
        J.dmask_b = sh->B > 1 && (d->mask_stride[0] == 0 || shared);
        J.dmask_h = sh->H > 1 && (d->mask_stride[1] == 0 || shared);
        J.dmask_i = sh->L > 1 && (d->mask_stride[2] == 0 || shared);
    }
    const int64_t items = (J.dmask_b ? 1 : sh->B) * (J.dmask_h ? 1 : sh->H) * (J.dmask_i ? 1 : J.n_qtiles);
    attn__pool_run(ctx->pool, items, pass2_task, &J);
}

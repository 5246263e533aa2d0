// flash.h - the fused attention forward of flash_fwd.c.
#ifndef ATTN_CPU_FLASH_H
#define ATTN_CPU_FLASH_H

#include <float.h>
#include <math.h>

#include "internal.h"

// x rounded to float, finite values beyond float's range clamped to +-FLT_MAX (NaN and the
// infinities stay what they are): the log2-domain scores and log-sum-exps of the fused kernels.
static inline float attn__clamp_flt(double x) {
    if (!isfinite(x)) return (float)x;
    return x > FLT_MAX ? FLT_MAX : x < -FLT_MAX ? -FLT_MAX : (float)x;
}

#ifndef FLASH_BC
#define FLASH_BC 96 // keys per forward tile: a multiple of the 6-row register block
#endif

// The row stride of the forward's query, score and output tiles of brp columns: brp, 16 more where
// brp floats are a multiple of 512 bytes (brp = 128, the usual width). The softmax's two passes and
// P V walk the score tile down a column of 16 queries (a line a key), and 96 lines 512 bytes apart
// fall into 8 of a 32 KiB L1's 64 sets, too few ways to keep them between passes: with 576 bytes the
// AVX2 softmax of a 96 x 128 tile in L2 took 3.6 us instead of 4.0, and P V at D = 64 reached 98-99
// GFLOP/s instead of 93-97 (bench/flash_kernels).
static inline int64_t attn__fwd_tile_ld(int brp) { return brp % 128 == 0 ? brp + 16 : brp; }

// Whether a key or value tensor (type dt, element strides s) has float32 rows, elements contiguous,
// a multiple of 512 bytes apart: rows a product would read down a column through a few of L1's sets,
// which the forward (values) and decoding's wide tiles (keys and values) copy into padded rows.
static inline bool attn__f32_rows_512_apart(attn_dtype dt, const int64_t s[4]) {
    return dt == ATTN_DTYPE_F32 && s[3] == 1 && s[2] != 0 && s[2] % 128 == 0;
}

// A forward thread's tiles (brp query columns), carved from its scratch by attn__fwd_tiles_layout
// (which returns the bytes; base NULL only sizes).
typedef struct attn__fwd_tiles {
    int64_t ld;             // the row stride of qt, st, ot and th: attn__fwd_tile_ld(brp)
    float *qt;              // (D, brp; rows ld apart) queries transposed, times scale * log2 e
    float *st;              // (BC, brp; rows ld apart) scores, then weights
    float *ot;              // (Dv, brp; rows ld apart) output accumulator
    float *m, *l, *alpha;   // (brp) running max (log2), sum, rescale factor
    float *th;              // (BC, brp; rows ld apart) tanh of soft-capped scores (with softcap)
    float *kf;              // (BC, D): a half-precision key tile as floats, or a float32 one copied (copy_k)
    float *vf;              // (BC, vld): a half-precision value tile as floats, or a float32 one copied
    int64_t vld;            // vf's row stride (Dv, or Dv + 16: flash_fwd.c's vtile_ld)
    // With bf16 dot products (`dot`; cpu.h's gemm_bf16, its "packed in pairs" layouts), instead of
    // qt, ot, kf and vf:
    int dvp;                // Dv rounded up to a multiple of 16
    uint16_t *qp;           // (D/2, brp) pairs: the queries' bf16 elements 2e, 2e+1 (unscaled)
    uint16_t *pp;           // (BC/2, brp) pairs: the weights of keys 2e, 2e+1 rounded to bf16
    uint16_t *vp;           // (BC/2, dvp) pairs: the values of keys 2e, 2e+1
    float *o;               // (brp, dvp) the output accumulator, rows of queries
} attn__fwd_tiles;
// copy_k: kf also for float32 keys (decoding's wide tiles copy key rows a multiple of 512 bytes apart).
size_t attn__fwd_tiles_layout(const attn__sdpa_shape *sh, const attn_sdpa_desc *d, int brp, bool dot, bool copy_k,
                              attn__fwd_tiles *t, char *base);
// O^T += V^T P^T with a loop that skips zero weights, for value tiles holding NaN or inf.
void attn__pv_skipping_zeros(const float *v, int64_t vs_row, int64_t vs_d, int nj, int Dv, const float *st, int br,
                             int64_t ld, const float *alpha, float *ot);

// The bf16 dot products' score scale (scale * log2 e, given as qscale) = *qp2 * *qrest: the power of
// two *qp2 is multiplied into the packed bf16 queries (exactly, unless that underflows) and *qrest
// (of magnitude in [1, 2), or 0) into the sums, so that the sums overflow about where the float32
// path's, which scales the queries first, do (unscaled sums would overflow 1 / scale times sooner).
static inline void attn__split_qscale(float qscale, float *qp2, float *qrest) {
    int e;
    const float m = frexpf(fabsf(qscale), &e); // |qscale| = m 2^e, m in [0.5, 1)
    if (m == 0.0f || !isfinite(qscale)) {
        *qp2 = 1.0f, *qrest = qscale;
        return;
    }
    *qp2 = ldexpf(1.0f, e - 1), *qrest = qscale / *qp2;
}

// Scratch bytes for a checked problem on this context (its thread count and kernel table).
size_t attn__flash_fwd_workspace(const attn_ctx *ctx, const attn__sdpa_shape *sh, const attn_sdpa_desc *d);
// Runs the problem with ctx->kernels on ctx's threads. weights are not produced (the reference
// kernel serves calls that ask for them). q and out are of d->q_dtype and d->out_dtype: converted
// to float as the query tiles are packed, and rounded once as the output is written.
void attn__flash_fwd(attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh, const void *q,
                     const void *k, const void *v, void *out, float *lse, void *ws);

// The forward for few queries per kv head (flash_decode.c): used by attn__flash_fwd when group * L
// packed query rows fit one tile and there is no dropout.
bool attn__decode_applies(const attn__sdpa_shape *sh, const attn_sdpa_desc *d);
size_t attn__decode_workspace(const attn_ctx *ctx, const attn__sdpa_shape *sh, const attn_sdpa_desc *d);
void attn__decode_fwd(attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh, const float *q,
                      const void *k, const void *v, float *out, float *lse, void *ws);

// Keys visible from queries: one past the last key any query up to `last_query` may see, and the
// first key any query from `first_query` on may see, under the causal mask and the local window.
int64_t attn__keys_visible_until(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t last_query);
int64_t attn__keys_visible_from(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t first_query);
// The first query of [i0, i0 + nq) that sees key jj under the causal and window bounds' upper edge
// (hi(i) >= jj), as i - i0; nq when none does. The queries after it see jj too, up to the window's
// lower edge.
int attn__first_query_seeing(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t i0, int nq, int64_t jj);
// One past the last query of [i0, i0 + nq) that sees key jj under the window's lower edge (lo(i) <=
// jj), as i - i0 (0 when none does; nq without a lower edge). The queries before it see jj down to
// the upper edge's first one.
int attn__last_query_seeing(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t i0, int nq, int64_t jj);
// The keys [*lo, *hi) of the tile of nj keys from j0 that any of the n queries from q0 sees under
// the causal and window bounds, relative to j0 and clamped to the tile (*lo == *hi: none).
void attn__tile_keys_seen(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t q0, int n, int64_t j0, int nj,
                          int *lo, int *hi);
// The columns [*c0, *c1) of a tile of w columns (its first nq the queries from i0) that the products
// of the keys first .. last need: from the first 16-query block in which a query sees key `first`
// to the end of the block holding the last query that sees key `last` (w when that is the tile's
// last real query); *c0 >= *c1 when no query sees them.
void attn__key_group_columns(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t i0, int nq, int w,
                             int64_t first, int64_t last, int *c0, int *c1);
// The float32 gemm kernels' row block (cpu.h's gemm: 6 rows at a time), the groups of key or query rows
// in which products of tiles cut by the bounds skip what the bounds hide.
#define ATTN_TRIM_ROWS 6
// C (nj, w; rows ld apart) = A (nj rows at a_rs, a_cs; K) B (K, w; rows ld apart) for a tile the causal
// or window bounds cut through, its rows the nj keys from j0, its first nq of w columns the queries
// from i0 (S^T = K Q^T, or the backward's dP^T = V dO^T): each group of ATTN_TRIM_ROWS keys over
// the columns attn__key_group_columns gives it. The entries outside, hidden (or the padding past
// nq), are not written.
void attn__key_rows_product(const attn__kernels *kn, const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t i0,
                            int nq, int64_t j0, int nj, const float *A, int64_t a_rs, int64_t a_cs, int K,
                            const float *B, int w, int64_t ld, float *C);
// The bf16 forms (cpu.h's gemm_bf16 and its pair layouts), for the products of the bf16 dot-product
// path, in groups of ATTN_TRIM_ROWS_BF16 rows (a multiple of the AVX-512 kernel's 6-row block). Each
// leaves out only products with weights the bounds make 0, or entries they hide: the same sums as
// the whole tile's, exact.
#define ATTN_TRIM_ROWS_BF16 24
// C (nj, w; rows ld apart) = scale A B: A the nj key (or value) rows from j0 (a_rs apart, elements
// in pairs: K2 of them), B (K2, w pairs; rows w pairs apart) the query (or dout) tile paired along
// the features, its first nq of w columns the queries from i0 (S^T, or the backward's dP^T): each
// group of keys over the columns attn__key_group_columns gives it; the entries outside are not
// written.
void attn__key_rows_product_bf16(const attn__kernels *kn, const attn_sdpa_desc *d, const attn__sdpa_shape *sh,
                                 int64_t i0, int nq, int64_t j0, int nj, const uint16_t *A, int64_t a_rs, int K2,
                                 const uint16_t *B, int w, float *C, int64_t ld, float scale);
// C (nq rows ldc apart) = rowscale C + A B for the nq queries from i0: A the tile's weights (or the
// backward's dS) in pack_pairs_bf16's layout, paired along its nj keys from j0 (the pair of keys 2p
// and 2p + 1 of query m at A + 2 (p w + m)), B (key pairs, N; rows ldb pairs apart): each group of
// queries over the key pairs from the first key its first query sees to the last its last query
// sees (O = alpha O + P V, or dQ += dS K with rowscale all ones). A group that sees no key of the
// tile is left as it is (the forward's alpha is 1 there).
void attn__query_rows_product_bf16(const attn__kernels *kn, const attn_sdpa_desc *d, const attn__sdpa_shape *sh,
                                   int64_t i0, int nq, int64_t j0, int nj, const uint16_t *A, int w, const uint16_t *B,
                                   int64_t ldb, int N, float *C, int64_t ldc, const float *rowscale);
// C (nj rows ldc apart) += A B for the nj keys from j0: A (nj rows a_rs apart) the tile's dS^T or
// P^T as bf16 rows over its nq queries from i0 (pairs of consecutive queries), B (query pairs, N;
// rows ldb pairs apart) the query or dout rows paired along the queries, ones at least nj ones: each
// group of keys over the query pairs from the first query that sees its first key to the last that
// sees its last (the backward's dK += dS^T Q and dV += P^T dO).
void attn__keys_from_queries_bf16(const attn__kernels *kn, const attn_sdpa_desc *d, const attn__sdpa_shape *sh,
                                  int64_t i0, int nq, int64_t j0, int nj, const uint16_t *A, int64_t a_rs,
                                  const uint16_t *B, int64_t ldb, int N, float *C, int64_t ldc, const float *ones);
// True when the causal or window bounds cut through the tile (some of its scores are hidden).
bool attn__tile_crosses_bounds(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t i0, int nq, int64_t j0,
                               int nj);
// The causal and window bounds alone on the score tile st (nj keys from j0, rows ld floats apart,
// whose first nq columns are the queries from i0). Returns false when every score of the tile is
// hidden.
bool attn__bounds_tile(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t ld, int64_t i0, int nq, int64_t j0,
                       int nj, float *st);
// The bounds, the attention mask and the key padding mask on the tile, in the log2 domain.
// Returns false when every score of the tile is hidden.
bool attn__mask_tile(const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t ld, int64_t b, int64_t h, int64_t i0,
                     int nq, int64_t j0, int nj, float *st);
// Soft-capping and ALiBi on the tile (before the masks); th (nj rows ld apart) receives tanh of the
// capped scores over the cap, for the backward (unused without soft-capping).
void attn__score_transform(const attn__kernels *kn, const attn_sdpa_desc *d, const attn__sdpa_shape *sh, int64_t ld,
                           int64_t h, int64_t i0, int nq, int64_t j0, int nj, float *st, float *th);

// Whether the forward (flash_fwd.c) runs on the table's bf16 dot products: bf16 q, k and v, an even
// head dim and contiguous key and value rows (their pairs are read in place).
bool attn__fwd_dot_applies(const attn__kernels *kn, const attn_sdpa_desc *d, const attn__sdpa_shape *sh);

// A tile of bf16 rows in pairs along the head dim, for the bf16 dot products: y (n/2 x w pairs),
// y[2*(e*w + i) + t] = x[b, h, i0 + i, 2e + t] * p2 (x at element strides s; p2 a power of two, 1
// copies) for i < nr, 0 for nr <= i < w (n even, w a multiple of 16): the table's
// transpose_pairs_bf16 for contiguous rows.
void attn__pair_tile_bf16(const attn__kernels *kn, const uint16_t *x, const int64_t s[4], int64_t b, int64_t h,
                          int64_t i0, int64_t nr, int64_t n, int64_t w, float p2, uint16_t *y);

// A tile of rows transposed to floats: y (n rows ld apart, w columns), y[c*ld + i] = x[b, h, i0 + i, c]
// * scale for i < nr, 0 for nr <= i < w (x of type dt, F32 or a half type, at element strides s).
// Contiguous rows are read 8 at a time, 64 elements of each (half types through the table's
// half_to_f32); other layouts element by element.
void attn__tile_f32(const attn__kernels *kn, const void *x, attn_dtype dt, const int64_t s[4], int64_t b, int64_t h,
                    int64_t i0, int64_t nr, int64_t n, int64_t w, int64_t ld, float scale, float *y);

// Rows [0, nj) of a key or value tile, or of query, out or dout rows (row stride rs, element stride
// es) of any type k and v may have (F32; half precision; block-quantised, Q8_0 and Q4_0: es = 1, rs a
// multiple of 32) as floats, (nj, n), rows ld floats apart.
void attn__rows_as_f32(const attn__kernels *kn, attn_dtype dt, const void *src, int64_t rs, int64_t es, int nj,
                       int64_t n, int64_t ld, float *dst);

// The fused backward (flash_bwd.c).
size_t attn__flash_bwd_workspace(const attn_ctx *ctx, const attn__sdpa_shape *sh, const attn_sdpa_desc *d,
                                 bool want_dmask);
// q of d->q_dtype, out and dout of d->out_dtype, dq, dk, dv of d->grad_dtype.
void attn__flash_bwd(attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh,
                     const attn_generator *dropout_state, const void *q, const void *k, const void *v,
                     const void *out, const void *dout, const float *lse, void *dq, void *dk, void *dv,
                     float *dmask, void *ws);

#endif

// flash_fwd.c - the fused attention forward (FlashAttention-2 on the CPU), independent of the
// instruction set: it tiles the problem, applies masks, runs the online softmax and finalises,
// calling the primitives of a kernel table (cpu.h) for the inner loops.
//
// Work items are (batch, head, tile of BR queries), shared by the context's threads: a head's query
// tiles in a row, heaviest first, so that a thread's next item usually reads the keys and values its
// caches already hold (every item streams its head's K and V).
// For each item the queries are packed once (transposed, scaled by scale*log2 e); then each tile of
// BC keys gives S^T = K Q^T, the masks turn hidden scores into -inf (a hidden key is never read),
// the online softmax rescales the running output, and O^T += V^T P^T. No (L, S) matrix exists; the
// extra memory is a few tiles per thread. Causal masking skips every key tile above the diagonal.
// A query row's result does not depend on the tile sizes along the queries or on the thread that
// computed it, so every thread count gives the same bits.
//
// Semantics are those of the reference (src/ref/sdpa_ref.c): fully masked rows give zeros and
// lse = -inf; NaN reaches only the rows that see it (value tiles holding NaN or inf are multiplied
// with a loop that skips zero weights, as the reference does); dropout uses the same draws as the
// reference, generated up front in (b, h, i, j) order from the context's generator.
#include <math.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/flash.h"
#include "dropout.h"
#include "half.h"

#define LOG2E 1.4426950408889634

typedef struct flash_job {
    const attn_sdpa_desc *d;
    const attn__sdpa_shape *sh;
    const attn__kernels *kn;
    const void *q;              // of d->q_dtype
    const void *k, *v;          // of d->kv_dtype
    void *out;                  // of d->out_dtype
    float *lse;
    int br, brp;                // queries per item, and padded to ATTN_TILE_BR_ALIGN
    int64_t n_qtiles, n_kvtiles;
    float qscale;               // scale * log2(e), folded into the packed queries (or the scores)
    bool dot;                   // bf16 products on the table's gemm_bf16 (attn__fwd_dot_applies)
    float qp2, qrest;           // dot: qscale split (attn__split_qscale)
    const uint8_t *v_bad;       // (B, Hkv, n_kvtiles): 1 when the value tile holds NaN or inf
    attn__dropout drop;         // the dropout mask (drop.on false without dropout)
    char *scratch;              // per thread: per_thread bytes
    size_t per_thread;
} flash_job;

// The row stride of a value tile in scratch: Dv floats, 16 more where Dv floats are a multiple of 512
// bytes. P V walks a column of the tile down its rows (a block of output rows against every key),
// and rows 512 bytes apart fall into 8 of a 32 KiB L1's 64 sets, too few ways for a tile's 96 rows
// beside the weights' (as with the score tile: attn__fwd_tile_ld): at D = 128 the AVX2 P V in L2
// read 89 GFLOP/s with value rows 512 bytes apart, 94-96 with 576 (score rows 512 apart both times).
static int64_t vtile_ld(int64_t Dv) { return Dv % 128 == 0 ? Dv + 16 : Dv; }

// Whether the float32 forward copies each value tile into vf: value rows (float32, elements
// contiguous) a multiple of 512 bytes apart, which P V would read down a column through a few of L1's
// sets (vtile_ld).
static bool copies_v(const attn_sdpa_desc *d, bool dot) {
    return !dot && attn__f32_rows_512_apart(d->kv_dtype, d->v_stride);
}

size_t attn__fwd_tiles_layout(const attn__sdpa_shape *sh, const attn_sdpa_desc *d, int brp, bool dot, bool copy_k,
                              attn__fwd_tiles *t, char *base) {
    attn__arena a = {.base = base};
    const size_t f = sizeof(float), h = sizeof(uint16_t);
    const bool half = d->kv_dtype != ATTN_DTYPE_F32 && !dot;
    attn__fwd_tiles x;
    x.dvp = (int)((sh->Dv + 15) / 16 * 16);
    x.ld = attn__fwd_tile_ld(brp);
    x.qt = dot ? NULL : attn__arena_take(&a, (size_t)sh->D * (size_t)x.ld * f);
    x.st = attn__arena_take(&a, (size_t)FLASH_BC * (size_t)x.ld * f);
    x.ot = dot ? NULL : attn__arena_take(&a, (size_t)sh->Dv * (size_t)x.ld * f);
    x.m = attn__arena_take(&a, (size_t)brp * f);
    x.l = attn__arena_take(&a, (size_t)brp * f);
    x.alpha = attn__arena_take(&a, (size_t)brp * f);
    x.th = d->softcap > 0.0f ? attn__arena_take(&a, (size_t)FLASH_BC * (size_t)x.ld * f) : NULL;
    x.kf = half || copy_k ? attn__arena_take(&a, (size_t)FLASH_BC * (size_t)sh->D * f) : NULL;
    x.vld = vtile_ld(sh->Dv);
    x.vf = half || copies_v(d, dot) ? attn__arena_take(&a, (size_t)FLASH_BC * (size_t)x.vld * f) : NULL;
    x.qp = dot ? attn__arena_take(&a, (size_t)sh->D * (size_t)brp * h) : NULL;
    x.pp = dot ? attn__arena_take(&a, (size_t)FLASH_BC * (size_t)brp * h) : NULL;
    x.vp = dot ? attn__arena_take(&a, (size_t)FLASH_BC * (size_t)x.dvp * h) : NULL;
    x.o = dot ? attn__arena_take(&a, (size_t)brp * (size_t)x.dvp * f) : NULL;
    if (t != NULL) *t = x;
    return a.used;
}

// Rows [0, nj) of a k or v tile of any cache type (row stride rs, element stride es; block types:
// es = 1, rs a multiple of the block) as floats (nj, n), rows ld apart (flash.h).
void attn__rows_as_f32(const attn__kernels *kn, attn_dtype dt, const void *src, int64_t rs, int64_t es, int nj,
                       int64_t n, int64_t ld, float *dst) {
    const size_t row_bytes = attn__kv_bytes(dt, rs); // rows rs elements apart (a whole number of blocks)
    for (int j = 0; j < nj; j++) {
        const void *r = (const char *)src + (size_t)j * row_bytes;
        float *o = dst + (int64_t)j * ld;
        if (dt == ATTN_DTYPE_F32 && es == 1)
            memcpy(o, r, (size_t)n * sizeof(float));
        else if (attn__is_block_dtype(dt))
            kn->dequant_rows(dt, r, o, n);
        else if (es == 1)
            kn->half_to_f32(dt, r, o, n);
        else
            for (int64_t c = 0; c < n; c++) o[c] = attn__kv_at(r, dt, c * es);
    }
}

// Queries per work item: 128, fewer when that would leave threads idle (the result of a row does not
// depend on this choice). Each item streams its head's whole K and V once, so long sequences, whose
// K and V outgrow L2, go faster with more queries per item: 128 against 64 measured +9% (AVX2) and
// +3% (AVX-512) at L = S = 4096, +7% and +8% at 8192, and no change at 1024.
#ifndef FLASH_BR
#define FLASH_BR 128
#endif
static int choose_br(const attn__sdpa_shape *sh, int threads) {
    int br = FLASH_BR;
    while (br > 16 && sh->B * sh->H * ((sh->L + br - 1) / br) < 4 * (int64_t)threads) br /= 2;
    if (sh->L < br) br = (int)((sh->L + ATTN_TILE_BR_ALIGN - 1) / ATTN_TILE_BR_ALIGN * ATTN_TILE_BR_ALIGN);
    return br;
}

void attn__pv_skipping_zeros(const float *v, int64_t vs_row, int64_t vs_d, int nj, int Dv, const float *st, int br,
                              int64_t ld, const float *alpha, float *ot) {
    for (int t = 0; t < Dv; t++) {
        float *o = ot + (int64_t)t * ld;
        for (int i = 0; i < br; i++) o[i] *= alpha[i];
        for (int j = 0; j < nj; j++) {
            const float vv = v[(int64_t)j * vs_row + (int64_t)t * vs_d];
            const float *p = st + (int64_t)j * ld;
            for (int i = 0; i < br; i++)
                if (p[i] != 0.0f) o[i] += vv * p[i];
        }
    }
}

bool attn__fwd_dot_applies(const attn__kernels *kn, const attn_sdpa_desc *d, const attn__sdpa_shape *sh) {
    return kn->gemm_bf16 != NULL && d->q_dtype == ATTN_DTYPE_BF16 && d->kv_dtype == ATTN_DTYPE_BF16 &&
           sh->D % 2 == 0 && d->k_stride[3] == 1 && (d->v_stride[3] == 1 || sh->Dv == 1);
}

void attn__pair_tile_bf16(const attn__kernels *kn, const uint16_t *x, const int64_t s[4], int64_t b, int64_t h,
                          int64_t i0, int64_t nr, int64_t n, int64_t w, float p2, uint16_t *y) {
    int k;
    frexpf(p2, &k);
    k -= 1; // p2 = 2^k
    if (kn->transpose_pairs_bf16 != NULL && s[3] == 1) {
        kn->transpose_pairs_bf16(x + attn__offset4(s, b, h, i0, 0), s[2], (int)nr, (int)(n / 2), (int)w, k, y);
        return;
    }
    for (int64_t i = 0; i < w; i++) {
        if (i >= nr) { // padding columns
            for (int64_t e = 0; e < n / 2; e++) y[2 * (e * w + i)] = y[2 * (e * w + i) + 1] = 0;
            continue;
        }
        const uint16_t *row = x + attn__offset4(s, b, h, i0 + i, 0);
        const int64_t es = s[3];
        uint16_t *yi = y + 2 * i;
        for (int64_t e = 0; e < n / 2; e++) {
            yi[2 * e * w] = attn__bf16_times_pow2(row[2 * e * es], k);
            yi[2 * e * w + 1] = attn__bf16_times_pow2(row[(2 * e + 1) * es], k);
        }
    }
}

#define TILE_ROWS 8  // rows attn__tile_f32 reads at a time
#define TILE_COLS 64 // and elements of each
void attn__tile_f32(const attn__kernels *kn, const void *x, attn_dtype dt, const int64_t s[4], int64_t b, int64_t h,
                    int64_t i0, int64_t nr, int64_t n, int64_t w, int64_t ld, float scale, float *y) {
    if (s[3] == 1 || n == 1) {
        float buf[TILE_ROWS][TILE_COLS];
        const float *row[TILE_ROWS];
        for (int64_t i = 0; i < nr; i += TILE_ROWS) {
            const int ni = nr - i < TILE_ROWS ? (int)(nr - i) : TILE_ROWS;
            for (int64_t c = 0; c < n; c += TILE_COLS) {
                const int nc = n - c < TILE_COLS ? (int)(n - c) : TILE_COLS;
                for (int r = 0; r < ni; r++) {
                    const int64_t src = attn__offset4(s, b, h, i0 + i + r, c);
                    if (dt == ATTN_DTYPE_F32) {
                        row[r] = (const float *)x + src;
                    } else {
                        kn->half_to_f32(dt, (const uint16_t *)x + src, buf[r], nc);
                        row[r] = buf[r];
                    }
                }
                for (int cc = 0; cc < nc; cc++)
                    for (int r = 0; r < ni; r++) y[(c + cc) * ld + i + r] = row[r][cc] * scale;
            }
        }
    } else {
        for (int64_t c = 0; c < n; c++)
            attn__gather(y + c * ld, x, dt, attn__offset4(s, b, h, i0, c), s[2], nr, scale);
    }
    for (int64_t c = 0; c < n; c++)
        for (int64_t i = nr; i < w; i++) y[c * ld + i] = 0.0f;
}

// The bf16 path's O += P V for a value tile holding NaN or inf: o[i*ldo + c] = alpha[i] o[i*ldo + c]
// + sum over the keys j whose weight st[j*ld + i] is not 0 of that weight times v[j*vs_row + c].
static void pv_rows_skipping_zeros(const uint16_t *v, int64_t vs_row, int nj, int Dv, const float *st, int64_t ld,
                                   const float *alpha, int nq, float *o, int64_t ldo) {
    for (int i = 0; i < nq; i++) {
        float *row = o + (int64_t)i * ldo;
        for (int c = 0; c < Dv; c++) row[c] *= alpha[i];
        for (int j = 0; j < nj; j++) {
            const float p = st[(int64_t)j * ld + i];
            if (p == 0.0f) continue;
            for (int c = 0; c < Dv; c++) row[c] += p * attn__bf16_to_f32(v[(int64_t)j * vs_row + c]);
        }
    }
}

// Requests the lines of rows [j0, j0 + n) of a key or value head (n elements of type dt a row, rows
// rs elements apart, elements contiguous) into L2: the next key tile's, while this one is computed,
// so that heads larger than L2 stream from memory behind the arithmetic rather than stall it.
static void prefetch_tile(const char *head, attn_dtype dt, int64_t rs, int64_t j0, int nj, int64_t n) {
#if defined(__GNUC__)
    const int64_t bytes = attn__kv_bytes(dt, n);
    const size_t row_bytes = attn__kv_bytes(dt, rs);
    for (int j = 0; j < nj; j++) {
        const char *row = head + (size_t)(j0 + j) * row_bytes;
        for (int64_t x = 0; x < bytes; x += 64) __builtin_prefetch(row + x, 0, 2);
    }
#else
    (void)head, (void)dt, (void)rs, (void)j0, (void)nj, (void)n;
#endif
}

// The float32 products of a tile that the causal or window bounds cut through, without what they
// hide (the bf16 ones are flash.h's *_bf16 products): S^T by attn__key_rows_product (key rows in groups
// of the gemm kernels' 6-row block), and O^T's query columns, TRIM_COLS at a time (the AVX-512 pv's
// 32-column block), over the keys from the first their first query sees to the last their last one
// sees. The sums of the whole tile with only zero products left out (the pv kernels add each column's
// keys in order).
#define TRIM_COLS 32

static void pv_f32_trimmed(const flash_job *J, const float *vt, int64_t vs_row, int64_t vs_d, int nj,
                           const attn__fwd_tiles *t, int64_t i0, int nq, int64_t j0) {
    for (int c = 0; c < nq; c += TRIM_COLS) { // columns past nq are padding, never read
        const int w = J->brp - c < TRIM_COLS ? J->brp - c : TRIM_COLS; // brp: a multiple of 16
        int lo, hi;
        attn__tile_keys_seen(J->d, J->sh, i0 + c, nq - c < w ? nq - c : w, j0, nj, &lo, &hi);
        if (lo == hi) continue; // their running maxima unchanged: alpha = 1
        J->kn->pv(vt + (int64_t)lo * vs_row, vs_row, vs_d, hi - lo, (int)J->sh->Dv, t->st + (int64_t)lo * t->ld + c, w,
                  t->ld, t->alpha + c, t->ot + c);
    }
}

// For each ATTN_TILE_BR_ALIGN (16) query columns c of the tile (i0, nq) x (j0, nj): the keys [span[2c],
// span[2c + 1]) of the tile that any of them sees (none for columns past nq), for softmax_pairs_bf16.
static void visible_spans(const flash_job *J, int64_t i0, int nq, int64_t j0, int nj, int32_t *span) {
    for (int c = 0; c < J->brp / ATTN_TILE_BR_ALIGN; c++) {
        const int first = c * ATTN_TILE_BR_ALIGN, n = nq - first < ATTN_TILE_BR_ALIGN ? nq - first : ATTN_TILE_BR_ALIGN;
        int lo = 0, hi = 0;
        if (n > 0) attn__tile_keys_seen(J->d, J->sh, i0 + first, n, j0, nj, &lo, &hi);
        span[2 * c] = lo, span[2 * c + 1] = hi;
    }
}

// y[c] = col[c * ld] * scale rounded to the half type dt (to nearest even), c < n: a query's column of
// the transposed output tile, 64 values at a time through the table's f32_to_half.
static void column_to_half(const attn__kernels *kn, attn_dtype dt, const float *col, int64_t ld, int n, float scale,
                           uint16_t *y) {
    float buf[64];
    for (int c0 = 0; c0 < n; c0 += 64) {
        const int nc = n - c0 < 64 ? n - c0 : 64;
        for (int c = 0; c < nc; c++) buf[c] = col[(int64_t)(c0 + c) * ld] * scale;
        kn->f32_to_half(dt, buf, y + c0, nc);
    }
}

static void flash_task(void *arg, int64_t task, int thread) {
    const flash_job *J = arg;
    const attn_sdpa_desc *d = J->d;
    const attn__sdpa_shape *sh = J->sh;
    // a head's items in turn, its heaviest query tiles (the last ones, under a causal mask) first.
    // Taken query tile by query tile across the heads instead, consecutive items read different
    // heads' K and V from L3 or memory (on an Ice Lake, one thread at L = S = 1024 then spent a tenth
    // of its time in the next tile's prefetches: BENCHMARKS.md)
    const int64_t qtile = J->n_qtiles - 1 - task % J->n_qtiles, bh = task / J->n_qtiles;
    const int64_t b = bh / sh->H, h = bh % sh->H, hk = h / sh->group;
    const int64_t i0 = qtile * J->br;
    const int nq = (int)(sh->L - i0 < J->br ? sh->L - i0 : J->br), brp = J->brp;
    const int D = (int)sh->D, Dv = (int)sh->Dv;
    attn__fwd_tiles t;
    const bool dot = J->dot;
    attn__fwd_tiles_layout(sh, d, brp, dot, false, &t, J->scratch + (size_t)thread * J->per_thread);
    const int64_t ld = t.ld; // qt's, st's and ot's row stride

    if (dot) {
        // qp (D/2, brp pairs): the queries' bf16 elements times the power of two qp2
        attn__pair_tile_bf16(J->kn, J->q, d->q_stride, b, h, i0, nq, D, brp, J->qp2, t.qp);
        memset(t.o, 0, (size_t)brp * (size_t)t.dvp * sizeof(float));
    } else { // qt (D, brp) = q[b, h, i0:i0+nq, :]^T * scale * log2(e) as floats, zero padding columns
        attn__tile_f32(J->kn, J->q, d->q_dtype, d->q_stride, b, h, i0, nq, D, brp, ld, J->qscale, t.qt);
        memset(t.ot, 0, (size_t)Dv * (size_t)ld * sizeof(float));
    }
    for (int i = 0; i < brp; i++) t.m[i] = -INFINITY, t.l[i] = 0.0f;

    const bool masked = d->mask != NULL || d->key_padding_mask != NULL;
    const bool transform = d->softcap > 0.0f || d->alibi_slopes != NULL;
    const bool half = d->kv_dtype != ATTN_DTYPE_F32 && !dot;
    const int64_t j_end = attn__keys_visible_until(d, sh, i0 + nq - 1);
    const int64_t j_begin = attn__keys_visible_from(d, sh, i0) / FLASH_BC * FLASH_BC; // whole tiles
    const char *kbase = (const char *)J->k + attn__kv_bytes(d->kv_dtype, attn__offset4(d->k_stride, b, hk, 0, 0));
    const char *vbase = (const char *)J->v + attn__kv_bytes(d->kv_dtype, attn__offset4(d->v_stride, b, hk, 0, 0));
    const bool contiguous_rows = d->k_stride[3] == 1 && d->v_stride[3] == 1;
    for (int64_t j0 = j_begin; j0 < j_end; j0 += FLASH_BC) {
        const int nj = (int)(j_end - j0 < FLASH_BC ? j_end - j0 : FLASH_BC);
        if (contiguous_rows && j0 + FLASH_BC < j_end) {
            const int next = (int)(j_end - j0 - FLASH_BC < FLASH_BC ? j_end - j0 - FLASH_BC : FLASH_BC);
            prefetch_tile(kbase, d->kv_dtype, d->k_stride[2], j0 + FLASH_BC, next, D);
            prefetch_tile(vbase, d->kv_dtype, d->v_stride[2], j0 + FLASH_BC, next, Dv);
        }
        // the key and value tiles as floats: in place, or converted from half precision
        const float *kt = (const float *)(kbase + attn__kv_bytes(d->kv_dtype, j0 * d->k_stride[2]));
        const float *vt = (const float *)(vbase + attn__kv_bytes(d->kv_dtype, j0 * d->v_stride[2]));
        int64_t ks_row = d->k_stride[2], ks_d = d->k_stride[3], vs_row = d->v_stride[2], vs_d = d->v_stride[3];
        if (half) {
            attn__rows_as_f32(J->kn, d->kv_dtype, kt, ks_row, ks_d, nj, D, D, t.kf);
            kt = t.kf, ks_row = D, ks_d = 1;
        }
        if (t.vf != NULL) { // half precision, or float32 rows a multiple of 512 bytes apart
            attn__rows_as_f32(J->kn, d->kv_dtype, vt, vs_row, vs_d, nj, Dv, t.vld, t.vf);
            vt = t.vf, vs_row = t.vld, vs_d = 1;
        }
        // the bounds alone hide some of this tile's scores: the products skip what they hide
        const bool bounded = !masked && attn__tile_crosses_bounds(d, sh, i0, nq, j0, nj);
        const bool trim = bounded && !transform;
        if (trim && dot) // each group of keys over the queries that see it (flash.h)
            attn__key_rows_product_bf16(J->kn, d, sh, i0, nq, j0, nj, (const uint16_t *)kt, ks_row, D / 2, t.qp, brp, t.st,
                                        ld, J->qrest);
        else if (trim)
            attn__key_rows_product(J->kn, d, sh, i0, nq, j0, nj, kt, ks_row, ks_d, D, t.qt, brp, ld, t.st);
        else if (dot) // S^T (nj, brp) = scale log2(e) K Q^T, the key rows' pairs read in place
            J->kn->gemm_bf16((const uint16_t *)kt, ks_row, 2, nj, D / 2, t.qp, brp, brp, t.st, ld, NULL, J->qrest);
        else
            attn__qk(J->kn, kt, ks_row, ks_d, nj, D, t.qt, brp, ld, t.st);
        if (transform) attn__score_transform(J->kn, d, sh, ld, h, i0, nq, j0, nj, t.st, t.th);
        if (masked) {
            if (!attn__mask_tile(d, sh, ld, b, h, i0, nq, j0, nj, t.st)) continue; // every score hidden: nothing to add
        } else if (bounded) {
            if (!attn__bounds_tile(d, sh, ld, i0, nq, j0, nj, t.st)) continue;
        }
        const bool v_bad = J->v_bad[(b * sh->Hkv + hk) * J->n_kvtiles + j0 / FLASH_BC];
        // bf16 dot products on finite values without dropout: the weights go straight into bf16 pairs
        const bool fused = dot && !v_bad && !J->drop.on && J->kn->softmax_pairs_bf16 != NULL;
        if (fused) { // on a trimmed tile, each 16 columns' exps over the keys they see
            int32_t span[2 * ((FLASH_BR + ATTN_TILE_BR_ALIGN - 1) / ATTN_TILE_BR_ALIGN)]; // brp / 16 pairs
            if (trim) visible_spans(J, i0, nq, j0, nj, span);
            J->kn->softmax_pairs_bf16(t.st, nj, brp, ld, t.m, t.l, t.alpha, t.pp, trim ? span : NULL);
        } else {
            J->kn->softmax(t.st, nj, brp, ld, t.m, t.l, t.alpha);
            if (J->drop.on) // dropout: weights of dropped keys become 0 (after the row sums)
                attn__dropout_tile(&J->drop, b, h, i0, nq, j0, nj, t.st, ld, 1.0f);
        }
        if (dot && v_bad) {
            pv_rows_skipping_zeros((const uint16_t *)vt, vs_row, nj, Dv, t.st, ld, t.alpha, nq, t.o, t.dvp);
        } else if (dot) { // O (nq, dvp) = alpha O + P V: weights rounded to bf16, both paired along the keys
            if (!fused) J->kn->pack_pairs_bf16(t.st, ld, nj, brp, t.pp);
            J->kn->pair_rows_bf16((const uint16_t *)vt, vs_row, nj, Dv, t.dvp, t.vp);
            if (trim) // each group of queries over the keys it sees
                attn__query_rows_product_bf16(J->kn, d, sh, i0, nq, j0, nj, t.pp, brp, t.vp, t.dvp, t.dvp, t.o, t.dvp,
                                              t.alpha);
            else
                J->kn->gemm_bf16(t.pp, 2, 2 * (int64_t)brp, nq, (nj + 1) / 2, t.vp, t.dvp, t.dvp, t.o, t.dvp, t.alpha, 1.0f);
        } else if (v_bad) {
            attn__pv_skipping_zeros(vt, vs_row, vs_d, nj, Dv, t.st, brp, ld, t.alpha, t.ot);
        } else if (trim) {
            pv_f32_trimmed(J, vt, vs_row, vs_d, nj, &t, i0, nq, j0);
        } else {
            J->kn->pv(vt, vs_row, vs_d, nj, Dv, t.st, brp, ld, t.alpha, t.ot);
        }
    }
    // out = O / l (0 for a fully masked row; l with the head's sink), times the dropout scale; lse
    // in natural log
    for (int i = 0; i < nq; i++) {
        const float keep_scale = J->drop.on ? J->drop.keep_scale : 1.0f;
        float row_lse;
        const float inv = attn__softmax_finish(t.m[i], t.l[i], keep_scale, d->sinks, h, &row_lse);
        const int64_t o = attn__offset4(d->o_stride, b, h, i0 + i, 0);
        if (dot && d->out_dtype == ATTN_DTYPE_BF16 && d->o_stride[3] == 1 && J->kn->scale_to_bf16 != NULL)
            J->kn->scale_to_bf16(t.o + (int64_t)i * t.dvp, Dv, inv, (uint16_t *)J->out + o);
        else if (dot) attn__scatter(J->out, d->out_dtype, o, d->o_stride[3], t.o + (int64_t)i * t.dvp, 1, Dv, inv);
        else if (d->out_dtype != ATTN_DTYPE_F32 && d->o_stride[3] == 1)
            column_to_half(J->kn, d->out_dtype, t.ot + i, ld, Dv, inv, (uint16_t *)J->out + o);
        else attn__scatter(J->out, d->out_dtype, o, d->o_stride[3], t.ot + i, ld, Dv, inv);
        if (J->lse != NULL) J->lse[bh * sh->L + i0 + i] = row_lse;
    }
}

// 1 for every (b, hk, key tile) whose value rows hold a NaN or an infinity.
typedef struct vscan_job {
    const attn_sdpa_desc *d;
    const attn__sdpa_shape *sh;
    const void *v;
    int64_t n_kvtiles;
    uint8_t *v_bad;
} vscan_job;

// Whether a contiguous row of n bfloat16 or float16 values holds an infinity or a NaN (as
// half.h's attn__f32_any_nonfinite for floats): `exp` holds the type's exponent bits (0x7f80 or
// 0x7c00).
static bool u16_row_nonfinite(const uint16_t *row, int64_t n, uint16_t exp) {
    uint32_t all = 0;
    for (int64_t t = 0; t < n; t++) all |= (uint32_t)((row[t] & exp) == exp);
    return all != 0;
}

static void vscan_task(void *arg, int64_t task, int thread) {
    (void)thread;
    const vscan_job *J = arg;
    const attn_sdpa_desc *d = J->d;
    const int64_t b = task / J->sh->Hkv, hk = task % J->sh->Hkv, Dv = J->sh->Dv;
    // dense rows of a float type by their bits; other layouts and the block-quantised types per element
    const bool dense = d->v_stride[3] == 1 || Dv == 1;
    const uint16_t exp16 = d->kv_dtype == ATTN_DTYPE_BF16 ? 0x7f80 : d->kv_dtype == ATTN_DTYPE_F16 ? 0x7c00 : 0;
    for (int64_t tile = 0; tile < J->n_kvtiles; tile++) {
        uint8_t bad = 0;
        const int64_t j_end = (tile + 1) * FLASH_BC < J->sh->S ? (tile + 1) * FLASH_BC : J->sh->S;
        for (int64_t j = tile * FLASH_BC; j < j_end && !bad; j++) {
            const int64_t row = attn__offset4(d->v_stride, b, hk, j, 0);
            if (dense && d->kv_dtype == ATTN_DTYPE_F32) {
                bad = attn__f32_any_nonfinite((const float *)J->v + row, Dv);
                continue;
            }
            if (dense && exp16 != 0) {
                bad = u16_row_nonfinite((const uint16_t *)J->v + row, Dv, exp16);
                continue;
            }
            for (int64_t t = 0; t < Dv; t++) bad |= !isfinite(attn__kv_at(J->v, d->kv_dtype, row + t * d->v_stride[3]));
        }
        J->v_bad[task * J->n_kvtiles + tile] = bad;
    }
}

typedef struct flash_layout {
    uint8_t *v_bad, *keep;
    char *scratch;
    size_t per_thread;
} flash_layout;

static size_t layout(const attn_ctx *ctx, const attn__sdpa_shape *sh, const attn_sdpa_desc *d, char *base,
                     flash_layout *fl) {
    const int threads = attn__pool_threads(ctx->pool);
    const int br = choose_br(sh, threads);
    const int64_t n_kvtiles = (sh->S + FLASH_BC - 1) / FLASH_BC;
    attn__arena a = {.base = base};
    fl->v_bad = attn__arena_take(&a, (size_t)(sh->B * sh->Hkv * n_kvtiles));
    fl->keep = attn__arena_take(&a, attn__dropout_bits_bytes(d, sh));
    const int brp = (br + ATTN_TILE_BR_ALIGN - 1) / ATTN_TILE_BR_ALIGN * ATTN_TILE_BR_ALIGN;
    const bool dot = attn__fwd_dot_applies(ctx->kernels, d, sh);
    fl->per_thread =
        (attn__fwd_tiles_layout(sh, d, brp, dot, false, NULL, NULL) + ATTN_ALIGN - 1) & ~(size_t)(ATTN_ALIGN - 1);
    fl->scratch = attn__arena_take(&a, fl->per_thread * (size_t)threads);
    return a.used;
}

// The decode path reads a float32 q and writes a float32 out: half-precision ones are staged through
// contiguous float copies, (B, H, L, D) and (B, H, L, Dv), ahead of its own workspace. *dd receives
// the descriptor the decode path runs.
typedef struct decode_staging {
    float *q, *out;
    void *ws;
} decode_staging;

static size_t decode_staging_layout(const attn_ctx *ctx, const attn__sdpa_shape *sh, const attn_sdpa_desc *d,
                                    char *base, decode_staging *st, attn_sdpa_desc *dd) {
    attn__arena a = {.base = base};
    *dd = *d;
    st->q = st->out = NULL;
    if (d->q_dtype != ATTN_DTYPE_F32 || d->out_dtype != ATTN_DTYPE_F32) {
        st->q = attn__arena_take(&a, (size_t)(sh->B * sh->H * sh->L * sh->D) * sizeof(float));
        st->out = attn__arena_take(&a, (size_t)(sh->B * sh->H * sh->L * sh->Dv) * sizeof(float));
        attn_layout_strides(ATTN_LAYOUT_BHLD, sh->B, sh->H, sh->L, sh->D, dd->q_stride);
        attn_layout_strides(ATTN_LAYOUT_BHLD, sh->B, sh->H, sh->L, sh->Dv, dd->o_stride);
        dd->q_dtype = dd->out_dtype = ATTN_DTYPE_F32;
    }
    st->ws = attn__arena_take(&a, attn__decode_workspace(ctx, sh, dd));
    return a.used;
}

// Copies the (B, H, L, n) view `src` at strides s of dtype dt into or out of a contiguous float array.
static void stage_view(const attn__sdpa_shape *sh, int64_t n, const int64_t s[4], int dt, void *view, float *flat,
                       bool into_flat) {
    int64_t e = 0;
    for (int64_t b = 0; b < sh->B; b++)
        for (int64_t h = 0; h < sh->H; h++)
            for (int64_t i = 0; i < sh->L; i++)
                for (int64_t c = 0; c < n; c++, e++) {
                    const int64_t o = attn__offset4(s, b, h, i, c);
                    if (into_flat) flat[e] = attn__kv_at(view, dt, o);
                    else attn__elem_set(view, dt, o, flat[e]);
                }
}

size_t attn__flash_fwd_workspace(const attn_ctx *ctx, const attn__sdpa_shape *sh, const attn_sdpa_desc *d) {
    if (attn__decode_applies(sh, d)) {
        decode_staging st;
        attn_sdpa_desc dd;
        return decode_staging_layout(ctx, sh, d, NULL, &st, &dd);
    }
    flash_layout fl;
    return layout(ctx, sh, d, NULL, &fl);
}

void attn__flash_fwd(attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh, const void *q,
                     const void *k, const void *v, void *out, float *lse, void *ws) {
    if (attn__decode_applies(sh, d)) {
        decode_staging st;
        attn_sdpa_desc dd;
        decode_staging_layout(ctx, sh, d, ws, &st, &dd);
        if (st.q == NULL) {
            attn__decode_fwd(ctx, d, sh, q, k, v, out, lse, st.ws);
            return;
        }
        stage_view(sh, sh->D, d->q_stride, d->q_dtype, (void *)(uintptr_t)q, st.q, true);
        attn__decode_fwd(ctx, &dd, sh, st.q, k, v, st.out, lse, st.ws);
        stage_view(sh, sh->Dv, d->o_stride, d->out_dtype, out, st.out, false);
        return;
    }
    flash_layout fl;
    layout(ctx, sh, d, ws, &fl);
    const int threads = attn__pool_threads(ctx->pool);
    flash_job J = {
        .d = d, .sh = sh, .kn = ctx->kernels, .q = q, .k = k, .v = v, .out = out, .lse = lse,
        .br = choose_br(sh, threads),
        .n_kvtiles = (sh->S + FLASH_BC - 1) / FLASH_BC,
        .qscale = (float)((double)sh->scale * LOG2E),
        .dot = attn__fwd_dot_applies(ctx->kernels, d, sh),
        .v_bad = fl.v_bad,
        .scratch = fl.scratch, .per_thread = fl.per_thread,
    };
    J.brp = (J.br + ATTN_TILE_BR_ALIGN - 1) / ATTN_TILE_BR_ALIGN * ATTN_TILE_BR_ALIGN;
    attn__split_qscale(J.qscale, &J.qp2, &J.qrest);
    J.n_qtiles = (sh->L + J.br - 1) / J.br;
    // q k^T and p v: 2 (D + Dv) flops per query row and key
    attn__pool *pool = attn__pool_for(ctx->pool, 2.0 * (double)(sh->B * sh->H * sh->L) * (double)sh->S *
                                                     (double)(sh->D + sh->Dv));
    vscan_job vj = {d, sh, v, J.n_kvtiles, fl.v_bad};
    attn__pool_run(pool, sh->B * sh->Hkv, vscan_task, &vj);
    // the dropout mask: the reference's draws in (b, h, i, j) order kept as bits, or Philox
    attn__dropout_init(&J.drop, ctx->kernels, d, sh, &ctx->gen, fl.keep);
    attn__pool_run(pool, sh->B * sh->H * J.n_qtiles, flash_task, &J);
}

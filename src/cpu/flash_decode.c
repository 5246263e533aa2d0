// flash_decode.c - the fused forward for few queries per kv head (token-by-token decoding, short
// prefill blocks): the queries of all the heads that share a kv head are packed into one tile, so
// each key and value tile is read once for the whole group, and the keys are split into chunks
// that the threads share; the chunks' partial results are merged by log-sum-exp.
//
// Work items are (batch, kv head, chunk of keys). An item packs the group's queries as columns
// r = g * L + i (head hk * group + g, query i), runs the online softmax over its chunk's key tiles
// (masks, windows, ALiBi and soft-capping applied head by head on the tile's column blocks) and
// leaves (m, l, O) unnormalised. The merge then gives out = sum_c 2^(m_c - M) O_c / sum_c
// 2^(m_c - M) l_c per row. The chunk length depends on the problem only, never on the thread
// count, so every thread count gives the same bits. NaN or inf in a value a row cannot see must
// not reach it (0 * inf is NaN), but checking every value tile would cost a pass over memory-bound
// data: an item runs unchecked, and only when its result holds a NaN or an inf is it run again
// with the value tiles checked and zero weights skipped (a finite result proves that no product
// met a non-finite value).
//
// With at most NARROW_ROWS packed rows (and key and value rows contiguous) the products are taken
// along the rows: the scores as dot products of each key row with the few query rows (qk_rows),
// written straight into a compact score tile (a key's rows adjacent, the row count rounded up to
// 4: no softmax work on padding) for the masks and the softmax, and O (rows, Dv) = alpha O + P V
// reading value rows as vectors with the tile's weights broadcast (pv_rows), so a key or value
// element costs about rows/16 vector FMAs instead of one; half-precision keys and values are
// converted in registers as they are loaded, and the block types Q8_0 and Q4_0 (blocks of 32 along
// D) have row kernels of their own that dequantise in registers (qk_rows_q, pv_rows_q).
#include <math.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/flash.h"
#include "half.h"

#define LOG2E 1.4426950408889634
#define DECODE_ROWS 64             // packed query rows (group * L) handled by this path
#define DECODE_CHUNK (16 * FLASH_BC) // keys per work item
#define NARROW_ROWS 8

static int brp_of(const attn__sdpa_shape *sh) {
    const int64_t rows = sh->group * sh->L;
    return (int)((rows + ATTN_TILE_BR_ALIGN - 1) / ATTN_TILE_BR_ALIGN * ATTN_TILE_BR_ALIGN);
}

bool attn__decode_applies(const attn__sdpa_shape *sh, const attn_sdpa_desc *d) {
    return d->dropout_p == 0.0 && sh->group * sh->L <= DECODE_ROWS;
}

// The keys any query may see, and its split into chunks of whole tiles.
typedef struct key_range {
    int64_t begin, end, n_chunks;
} key_range;

static key_range keys_of(const attn__sdpa_shape *sh, const attn_sdpa_desc *d) {
    key_range r;
    r.begin = attn__keys_visible_from(d, sh, 0) / FLASH_BC * FLASH_BC;
    r.end = attn__keys_visible_until(d, sh, sh->L - 1);
    r.n_chunks = r.end > r.begin ? (r.end - r.begin + DECODE_CHUNK - 1) / DECODE_CHUNK : 1;
    return r;
}

typedef struct decode_job {
    const attn_sdpa_desc *d;
    const attn__sdpa_shape *sh;
    const attn__kernels *kn;
    const float *q;
    const void *k, *v;
    float *out, *lse;
    int brp;
    key_range keys;
    float qscale;
    float *part;        // per item: m (brp), l (brp), O (rows, Dv) row by row
    size_t part_floats; // floats per item
    bool narrow;        // the row-major products (see above)
    char *scratch;
    size_t per_thread, narrow_off; // narrow: offset of (NARROW_ROWS, Dv) O and (NARROW_ROWS, D) q,
    size_t prep_off;               // and of q as the kernel table's prep_q writes it (block types)
} decode_job;

// The narrow path applies: few rows, keys feature-major (position stride 1), values row-major.
static bool narrow_applies(const attn__sdpa_shape *sh, const attn_sdpa_desc *d) {
    return sh->group * sh->L <= NARROW_ROWS && d->k_stride[3] == 1 && d->v_stride[3] == 1;
}

// Whether the wide path copies each float32 key tile before K Q^T: key rows a multiple of 512 bytes
// apart (D = 128, 256 contiguous), which the product read in place from memory about a fifth slower
// than from the copy at D = 128 (at D = 64, rows 256 bytes apart, the copy was slower: BENCHMARKS.md).
static bool copies_k(const attn__sdpa_shape *sh, const attn_sdpa_desc *d) {
    return !narrow_applies(sh, d) && attn__f32_rows_512_apart(d->kv_dtype, d->k_stride);
}

// 1 when the (nj, n) tile at row stride rs, element stride es holds a NaN or an infinity.
static bool tile_not_finite(const float *x, int64_t rs, int64_t es, int nj, int64_t n) {
    uint32_t any = 0;
    for (int j = 0; j < nj; j++) {
        const float *r = x + (int64_t)j * rs;
        if (es == 1) any |= (uint32_t)attn__f32_any_nonfinite(r, n);
        else
            for (int64_t c = 0; c < n; c++) any |= !isfinite(r[c * es]);
    }
    return any != 0;
}

// One item; `careful`: check each value tile and skip zero weights where it holds NaN or inf.
// Returns whether the item's partial output is finite.
static bool decode_item(const decode_job *J, int64_t task, int thread, bool careful) {
    const attn_sdpa_desc *d = J->d;
    const attn__sdpa_shape *sh = J->sh;
    const int64_t chunk = task % J->keys.n_chunks, bhk = task / J->keys.n_chunks;
    const int64_t b = bhk / sh->Hkv, hk = bhk % sh->Hkv, L = sh->L;
    const int brp = J->brp, D = (int)sh->D, Dv = (int)sh->Dv, rows = (int)(sh->group * L);
    attn__fwd_tiles t;
    attn__fwd_tiles_layout(sh, d, brp, false, copies_k(sh, d), &t, J->scratch + (size_t)thread * J->per_thread);
    const int64_t ld = J->narrow ? (rows + 3) / 4 * 4 : t.ld; // the tiles' row stride (narrow: a compact st)
    const int br = J->narrow ? (int)ld : brp;                  // the score tile's columns

    // qt (D, brp): column g * L + i = q[b, hk * group + g, i, :] * scale * log2(e) (narrow: qr below)
    if (!J->narrow) {
        for (int dd = 0; dd < D; dd++) {
            float *row = t.qt + (int64_t)dd * ld;
            for (int64_t g = 0; g < sh->group; g++) {
                const float *src = J->q + attn__offset4(d->q_stride, b, hk * sh->group + g, 0, dd);
                for (int64_t i = 0; i < L; i++) row[g * L + i] = src[i * d->q_stride[2]] * J->qscale;
            }
            for (int r = rows; r < brp; r++) row[r] = 0.0f;
        }
        memset(t.ot, 0, (size_t)Dv * (size_t)ld * sizeof(float));
    }
    for (int r = 0; r < brp; r++) t.m[r] = -INFINITY, t.l[r] = 0.0f;

    const bool masked = d->mask != NULL || d->key_padding_mask != NULL;
    const bool transform = d->softcap > 0.0f || d->alibi_slopes != NULL;
    const bool half = d->kv_dtype != ATTN_DTYPE_F32; // converted as read: F16, BF16, Q8_0 or Q4_0
    const bool quant = attn__is_block_dtype(d->kv_dtype);
    const int64_t c_begin = J->keys.begin + chunk * DECODE_CHUNK;
    const int64_t c_end = c_begin + DECODE_CHUNK < J->keys.end ? c_begin + DECODE_CHUNK : J->keys.end;
    const char *kbase = (const char *)J->k + attn__kv_bytes(d->kv_dtype, attn__offset4(d->k_stride, b, hk, 0, 0));
    const char *vbase = (const char *)J->v + attn__kv_bytes(d->kv_dtype, attn__offset4(d->v_stride, b, hk, 0, 0));
    // narrow: q row by row (rows, D), O (rows, Dv); qk_rows_q reads qq (q or what prep_q made of it)
    float *qr = NULL, *orow = NULL;
    const void *qq = NULL;
    if (J->narrow) {
        char *mine = J->scratch + (size_t)thread * J->per_thread + J->narrow_off;
        orow = (float *)mine, qr = orow + NARROW_ROWS * Dv;
        for (int r = 0; r < rows; r++) { // row g * L + i: the column of qt above
            const float *src = J->q + attn__offset4(d->q_stride, b, hk * sh->group + r / L, r % L, 0);
            for (int dd = 0; dd < D; dd++) qr[(int64_t)r * D + dd] = src[dd * d->q_stride[3]] * J->qscale;
        }
        qq = qr;
        if (quant && J->kn->prep_q != NULL) {
            void *prep = J->scratch + (size_t)thread * J->per_thread + J->prep_off;
            J->kn->prep_q(d->kv_dtype, qr, rows, D, prep);
            qq = prep;
        }
        memset(orow, 0, (size_t)rows * (size_t)Dv * sizeof(float));
        memset(t.st, 0, (size_t)FLASH_BC * (size_t)ld * sizeof(float)); // padding columns stay 0
    }
    for (int64_t j0 = c_begin; j0 < c_end; j0 += FLASH_BC) {
        const int nj = (int)(c_end - j0 < FLASH_BC ? c_end - j0 : FLASH_BC);
        const void *kraw = kbase + attn__kv_bytes(d->kv_dtype, j0 * d->k_stride[2]); // of d->kv_dtype
        const void *vraw = vbase + attn__kv_bytes(d->kv_dtype, j0 * d->v_stride[2]);
        const float *kt = kraw, *vt = vraw; // as floats (converted tiles for half precision)
        int64_t ks_row = d->k_stride[2], ks_d = d->k_stride[3], vs_row = d->v_stride[2], vs_d = d->v_stride[3];
        if (J->narrow) { // S^T (nj, ld) = K Q^T, dot products along the key rows
            if (quant) J->kn->qk_rows_q(d->kv_dtype, kraw, ks_row, nj, D, qq, rows, t.st, 1, ld);
            else J->kn->qk_rows(d->kv_dtype, kraw, ks_row, nj, D, qr, rows, t.st, 1, ld);
        } else {
            if (t.kf != NULL) { // half precision as floats, or float32 rows a multiple of 512 bytes apart
                attn__rows_as_f32(J->kn, d->kv_dtype, kraw, ks_row, ks_d, nj, D, D, t.kf);
                kt = t.kf, ks_row = D, ks_d = 1;
            }
            attn__qk(J->kn, kt, ks_row, ks_d, nj, D, t.qt, brp, ld, t.st);
        }
        bool any_visible = !(masked || attn__tile_crosses_bounds(d, sh, 0, (int)L, j0, nj));
        for (int64_t g = 0; g < sh->group; g++) { // the group's heads: column blocks of L
            const int64_t h = hk * sh->group + g;
            float *sg = t.st + g * L;
            if (transform) // th exists with soft-capping only
                attn__score_transform(J->kn, d, sh, ld, h, 0, (int)L, j0, nj, sg, t.th != NULL ? t.th + g * L : NULL);
            if (masked)
                any_visible |= attn__mask_tile(d, sh, ld, b, h, 0, (int)L, j0, nj, sg);
            else if (attn__tile_crosses_bounds(d, sh, 0, (int)L, j0, nj))
                any_visible |= attn__bounds_tile(d, sh, ld, 0, (int)L, j0, nj, sg);
        }
        if (!any_visible) continue;
        J->kn->softmax(t.st, nj, br, ld, t.m, t.l, t.alpha);
        // as floats: half precision (narrow: only to skip a bad tile's zero weights), and for the wide
        // tile's P V float32 rows a multiple of 512 bytes apart (as the forward copies them)
        if (t.vf != NULL && (!J->narrow || (half && careful))) {
            attn__rows_as_f32(J->kn, d->kv_dtype, vraw, vs_row, vs_d, nj, Dv, t.vld, t.vf);
            vt = t.vf, vs_row = t.vld, vs_d = 1;
        }
        const bool bad = careful && tile_not_finite(vt, vs_row, vs_d, nj, Dv);
        if (J->narrow) { // O (rows, Dv) = alpha O + P V, P read from the tile
            if (bad) { // skip zero weights: a hidden key's NaN or inf value is never read
                for (int r = 0; r < rows; r++) {
                    float *o = orow + (int64_t)r * Dv;
                    for (int e = 0; e < Dv; e++) o[e] *= t.alpha[r];
                    for (int j = 0; j < nj; j++) {
                        const float p = t.st[(int64_t)j * ld + r];
                        if (p != 0.0f)
                            for (int e = 0; e < Dv; e++) o[e] += p * vt[(int64_t)j * vs_row + e];
                    }
                }
            } else {
                (quant ? J->kn->pv_rows_q : J->kn->pv_rows)(d->kv_dtype, vraw, d->v_stride[2], nj, Dv, t.st, ld, t.alpha,
                                                            rows, orow, Dv);
            }
        } else if (bad) {
            attn__pv_skipping_zeros(vt, vs_row, vs_d, nj, Dv, t.st, brp, ld, t.alpha, t.ot);
        } else {
            J->kn->pv(vt, vs_row, vs_d, nj, Dv, t.st, brp, ld, t.alpha, t.ot);
        }
    }
    float *part = J->part + task * J->part_floats;
    memcpy(part, t.m, (size_t)brp * sizeof(float));
    memcpy(part + brp, t.l, (size_t)brp * sizeof(float));
    float *po = part + 2 * brp; // O row by row
    if (J->narrow)
        memcpy(po, orow, (size_t)rows * (size_t)Dv * sizeof(float));
    else
        for (int r = 0; r < rows; r++)
            for (int e = 0; e < Dv; e++) po[(int64_t)r * Dv + e] = t.ot[(int64_t)e * ld + r];
    return !attn__f32_any_nonfinite(po, (int64_t)rows * Dv);
}

static void decode_task(void *arg, int64_t task, int thread) {
    const decode_job *J = arg;
    if (!decode_item(J, task, thread, false)) decode_item(J, task, thread, true);
}

// Merges the chunks of (b, hk) into out and lse.
static void merge_task(void *arg, int64_t bhk, int thread) {
    (void)thread;
    const decode_job *J = arg;
    const attn_sdpa_desc *d = J->d;
    const attn__sdpa_shape *sh = J->sh;
    const int64_t b = bhk / sh->Hkv, hk = bhk % sh->Hkv, L = sh->L, nc = J->keys.n_chunks;
    const int brp = J->brp;
    for (int64_t r = 0; r < sh->group * L; r++) {
        const int64_t h = hk * sh->group + r / L, i = r % L;
        float mx = -INFINITY;
        for (int64_t c = 0; c < nc; c++) {
            const float *p = J->part + (bhk * nc + c) * J->part_floats;
            if (p[brp + r] != 0.0f && p[r] > mx) mx = p[r]; // chunks that saw a key
        }
        float l = 0.0f;
        float *o = J->out + attn__offset4(d->o_stride, b, h, i, 0);
        for (int64_t e = 0; e < sh->Dv; e++) o[e * d->o_stride[3]] = 0.0f;
        for (int64_t c = 0; c < nc; c++) {
            const float *p = J->part + (bhk * nc + c) * J->part_floats;
            const float lc = p[brp + r];
            if (lc == 0.0f) continue;
            const float w = mx == -INFINITY ? 1.0f : exp2f(p[r] - mx); // mx -inf: l is NaN (NaN scores)
            l += w * lc;
            for (int64_t e = 0; e < sh->Dv; e++) o[e * d->o_stride[3]] += w * p[2 * brp + r * sh->Dv + e];
        }
        float row_lse;
        const float inv = attn__softmax_finish(mx, l, 1.0f, d->sinks, h, &row_lse);
        for (int64_t e = 0; e < sh->Dv; e++) o[e * d->o_stride[3]] *= inv;
        if (J->lse != NULL) J->lse[(b * sh->H + h) * L + i] = row_lse;
    }
}

typedef struct decode_layout {
    float *part;
    char *scratch;
    size_t per_thread, part_floats, narrow_off, prep_off;
} decode_layout;

static size_t layout(const attn_ctx *ctx, const attn__sdpa_shape *sh, const attn_sdpa_desc *d, char *base,
                     decode_layout *dl) {
    const int brp = brp_of(sh);
    const key_range keys = keys_of(sh, d);
    attn__arena a = {.base = base};
    dl->part_floats = (size_t)brp * (size_t)(2 + sh->Dv);
    dl->part = attn__arena_take(&a, (size_t)(sh->B * sh->Hkv * keys.n_chunks) * dl->part_floats * sizeof(float));
    const size_t align = ATTN_ALIGN - 1;
    dl->per_thread = (attn__fwd_tiles_layout(sh, d, brp, false, copies_k(sh, d), NULL, NULL) + align) & ~align;
    dl->narrow_off = dl->prep_off = dl->per_thread;
    if (narrow_applies(sh, d)) { // O (rows, Dv), q (rows, D), then q for prep_q (block types)
        dl->per_thread += ((size_t)NARROW_ROWS * (size_t)(sh->Dv + sh->D) * sizeof(float) + align) & ~align;
        dl->prep_off = dl->per_thread;
        if (attn__is_block_dtype(d->kv_dtype) && ctx->kernels->prep_q != NULL)
            dl->per_thread += (ATTN_QPREP_BYTES(NARROW_ROWS, sh->D) + align) & ~align;
    }
    dl->scratch = attn__arena_take(&a, dl->per_thread * (size_t)attn__pool_threads(ctx->pool));
    return a.used;
}

size_t attn__decode_workspace(const attn_ctx *ctx, const attn__sdpa_shape *sh, const attn_sdpa_desc *d) {
    decode_layout dl;
    return layout(ctx, sh, d, NULL, &dl);
}

void attn__decode_fwd(attn_ctx *ctx, const attn_sdpa_desc *d, const attn__sdpa_shape *sh, const float *q,
                      const void *k, const void *v, float *out, float *lse, void *ws) {
    decode_layout dl;
    layout(ctx, sh, d, ws, &dl);
    decode_job J = {
        .d = d, .sh = sh, .kn = ctx->kernels, .q = q, .k = k, .v = v, .out = out, .lse = lse,
        .brp = brp_of(sh), .keys = keys_of(sh, d), .qscale = (float)((double)sh->scale * LOG2E),
        .part = dl.part, .part_floats = dl.part_floats, .narrow = narrow_applies(sh, d), .scratch = dl.scratch,
        .per_thread = dl.per_thread, .narrow_off = dl.narrow_off, .prep_off = dl.prep_off,
    };
    // q k^T and p v: 2 (D + Dv) flops per query row and key
    attn__pool *pool = attn__pool_for(ctx->pool, 2.0 * (double)(sh->B * sh->H * sh->L) * (double)sh->S *
                                                     (double)(sh->D + sh->Dv));
    attn__pool_run(pool, sh->B * sh->Hkv * J.keys.n_chunks, decode_task, &J);
    attn__pool_run(pool, sh->B * sh->Hkv, merge_task, &J);
}

// gemm.c - the fast linear map y = x W^T + b (or x W + b) of the modules, built on the `qk`
// microkernel of the context's kernel table: Y^T = W X^T is the same product as S^T = K Q^T, with
// W's rows in place of the keys and a packed block of 64 input rows in place of the query tile.
//
// Work items are (block of 64 rows, block of 192 output features), spread over the context's
// threads a row block at a time: a thread packs a block's rows once for its items of that block (a
// few rows take the dot-product path of gemv_task instead, which also reads float16 and bfloat16
// weights as they are). bfloat16 weights on a table with bf16 dot products (gemm_bf16) run the same
// items on that kernel instead: the rows packed in bf16 pairs, W's rows read in place. Every output
// element is computed by one item with a fixed order of operations, so the result does not depend
// on the thread count.
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/gemm.h"

#define GEMM_ROWS 64  // input rows per item (the packed tile's width)
#define GEMM_OUT 192  // output features per item
#define GEMM_OUT_SUB 96 // output features per microkernel call (rows of the score-like tile)

typedef struct gemm_job {
    const attn__kernels *kn;
    const float *x, *b;
    const void *W;        // of type wdt: F32 (gemm_task), BF16 (gemm_dot_task), F32, F16 or BF16 (gemv_task)
    attn_dtype wdt;
    int64_t rows, in, ldx, out, ldy;
    int64_t ws_row, ws_d; // W as "key rows": element (o, i) at o*ws_row + i*ws_d
    float *y;
    int64_t n_out_blocks;
    char *scratch;
    size_t per_thread;
} gemm_job;

// A thread's scratch: the packed input rows xt (in, w), the row block they hold (packed_rb: -1 at
// the start of a call) and the microkernel's output tile st (96, w), w <= 64 the block's rows
// rounded up to whole vectors. The dot path keeps in xt's bytes the rows rounded to bf16 (64, in)
// and then those rows in pairs along in (in / 2, w pairs).
typedef struct gemm_scratch {
    int64_t *packed_rb;
    float *xt, *st;
} gemm_scratch;

// The bytes of a thread's scratch for `in` input features; with s, its pieces from base.
static size_t thread_scratch(int64_t in, char *base, gemm_scratch *s) {
    attn__arena a = {.base = base};
    int64_t *tag = attn__arena_take(&a, sizeof(int64_t));
    float *p = attn__arena_take(&a, (size_t)in * GEMM_ROWS * sizeof(float));
    float *q = attn__arena_take(&a, (size_t)GEMM_OUT_SUB * GEMM_ROWS * sizeof(float));
    if (s != NULL) s->packed_rb = tag, s->xt = p, s->st = q;
    return a.used;
}

size_t attn__gemm_workspace(const attn_ctx *ctx, int64_t in) {
    size_t per = (thread_scratch(in, NULL, NULL) + ATTN_ALIGN - 1) & ~(size_t)(ATTN_ALIGN - 1);
    return per * (size_t)attn__pool_threads(ctx->pool) + ATTN_ALIGN;
}

// The tile width for nr rows: whole vectors of the microkernels (a block of few rows computes no
// more than its rows need).
static int64_t tile_width(int64_t nr) { return (nr + ATTN_TILE_BR_ALIGN - 1) / ATTN_TILE_BR_ALIGN * ATTN_TILE_BR_ALIGN; }

// y[r0:r0+nr, o:o+nj] = st^T (+ b[o:o+nj]), st (nj, w) the microkernel's tile.
static void write_rows(const gemm_job *J, int64_t r0, int64_t nr, int64_t o, int nj, const float *st, int64_t w) {
    for (int64_t r = 0; r < nr; r++) {
        float *yr = J->y + (r0 + r) * J->ldy + o;
        for (int j = 0; j < nj; j++) yr[j] = st[(int64_t)j * w + r] + (J->b != NULL ? J->b[o + j] : 0.0f);
    }
}

static void gemm_task(void *arg, int64_t task, int thread) {
    const gemm_job *J = arg;
    const int64_t rb = task / J->n_out_blocks, ob = task % J->n_out_blocks;
    const int64_t r0 = rb * GEMM_ROWS, nr = J->rows - r0 < GEMM_ROWS ? J->rows - r0 : GEMM_ROWS;
    const int64_t o0 = ob * GEMM_OUT, no = J->out - o0 < GEMM_OUT ? J->out - o0 : GEMM_OUT;
    gemm_scratch sc;
    thread_scratch(J->in, J->scratch + (size_t)thread * J->per_thread, &sc);
    int64_t *packed_rb = sc.packed_rb;
    float *xt = sc.xt, *st = sc.st;
    const int64_t w = tile_width(nr);
    // xt (in, w) = x[r0:r0+nr, :]^T, zero columns past nr; in tiles of 16 inputs, so each row of x
    // is read a cache line at a time and the tile of xt written stays in L1. Items go row block by
    // row block, so a thread's next item usually has the same rows packed already.
    for (int64_t i0 = 0; *packed_rb != rb && i0 < J->in; i0 += 16) {
        const int64_t ni = J->in - i0 < 16 ? J->in - i0 : 16;
        for (int64_t r = 0; r < nr; r++) {
            const float *src = J->x + (r0 + r) * J->ldx + i0;
            for (int64_t i = 0; i < ni; i++) xt[(i0 + i) * w + r] = src[i];
        }
        for (int64_t i = 0; i < ni; i++)
            for (int64_t r = nr; r < w; r++) xt[(i0 + i) * w + r] = 0.0f;
    }
    *packed_rb = rb;
    for (int64_t s0 = 0; s0 < no; s0 += GEMM_OUT_SUB) {
        const int nj = (int)(no - s0 < GEMM_OUT_SUB ? no - s0 : GEMM_OUT_SUB);
        const int64_t o = o0 + s0;
        // st (nj, w) = W[o:o+nj, :] xt, i.e. y[r0:r0+nr, o:o+nj]^T
        attn__qk(J->kn, (const float *)J->W + o * J->ws_row, J->ws_row, J->ws_d, nj, (int)J->in, xt, (int)w, w, st);
        write_rows(J, r0, nr, o, nj, st, w);
    }
}

// gemm_task on bf16 dot products: the block's rows rounded to bf16 (exact for rows holding bf16
// values) and paired along the input features, then st = W[o:o+nj, :] (its bf16 pairs in place)
// times them, each sum over the pairs in ascending order.
static void gemm_dot_task(void *arg, int64_t task, int thread) {
    const gemm_job *J = arg;
    const int64_t rb = task / J->n_out_blocks, ob = task % J->n_out_blocks;
    const int64_t r0 = rb * GEMM_ROWS, nr = J->rows - r0 < GEMM_ROWS ? J->rows - r0 : GEMM_ROWS;
    const int64_t o0 = ob * GEMM_OUT, no = J->out - o0 < GEMM_OUT ? J->out - o0 : GEMM_OUT;
    const int64_t in = J->in, w = tile_width(nr);
    gemm_scratch sc;
    thread_scratch(in, J->scratch + (size_t)thread * J->per_thread, &sc);
    uint16_t *xr = (uint16_t *)sc.xt, *xp = xr + GEMM_ROWS * in; // (nr, in) bf16; (in / 2, w) pairs
    if (*sc.packed_rb != rb) {
        for (int64_t r = 0; r < nr; r++) attn__round_bf16_any(J->kn, J->x + (r0 + r) * J->ldx, in, xr + r * in);
        J->kn->transpose_pairs_bf16(xr, in, (int)nr, (int)(in / 2), (int)w, 0, xp);
        *sc.packed_rb = rb;
    }
    const uint16_t *W = J->W;
    for (int64_t s0 = 0; s0 < no; s0 += GEMM_OUT_SUB) {
        const int nj = (int)(no - s0 < GEMM_OUT_SUB ? no - s0 : GEMM_OUT_SUB);
        const int64_t o = o0 + s0;
        J->kn->gemm_bf16(W + o * in, in, 2, nj, (int)(in / 2), xp, w, (int)w, sc.st, w, NULL, 1.0f);
        write_rows(J, r0, nr, o, nj, sc.st, w);
    }
}

// Few rows (decoding: one token per sequence) with W in nn.Linear's layout: y = x W^T as dot
// products along W's rows (the qk_rows kernel, which converts float16 and bfloat16 rows exactly as
// it loads them), so W streams through once at memory speed instead of feeding a tile of 64 mostly
// empty rows. Items are blocks of output features.
static void gemv_task(void *arg, int64_t task, int thread) {
    const gemm_job *J = arg;
    const int64_t o0 = task * GEMM_OUT, no = J->out - o0 < GEMM_OUT ? J->out - o0 : GEMM_OUT;
    const float *xr = J->x;
    if (J->ldx != J->in) { // rows packed at stride in, as qk_rows reads them
        gemm_scratch sc;
        thread_scratch(J->in, J->scratch + (size_t)thread * J->per_thread, &sc);
        float *xt = sc.xt;
        for (int64_t r = 0; r < J->rows; r++) memcpy(xt + r * J->in, J->x + r * J->ldx, (size_t)J->in * sizeof(float));
        xr = xt;
    }
    const char *w = (const char *)J->W + (size_t)(o0 * J->in) * attn_dtype_size(J->wdt);
    J->kn->qk_rows(J->wdt, w, J->in, (int)no, (int)J->in, xr, (int)J->rows, J->y + o0, J->ldy, 1);
    if (J->b != NULL)
        for (int64_t r = 0; r < J->rows; r++)
            for (int64_t j = 0; j < no; j++) J->y[r * J->ldy + o0 + j] += J->b[o0 + j];
}

#define GEMV_MAX_ROWS 8

bool attn__gemv_applies(int64_t rows, int64_t in) { return rows <= GEMV_MAX_ROWS && in <= INT32_MAX; }

static gemm_job job_of(attn_ctx *ctx, const float *x, int64_t rows, int64_t in, int64_t ldx, const void *W,
                       attn_dtype wdt, bool w_in_out, const float *b, int64_t out, float *y, int64_t ldy, void *ws) {
    const size_t per = (thread_scratch(in, NULL, NULL) + ATTN_ALIGN - 1) & ~(size_t)(ATTN_ALIGN - 1);
    return (gemm_job){
        .kn = ctx->kernels, .x = x, .b = b, .W = W, .wdt = wdt, .rows = rows,
        .in = in, .ldx = ldx, .out = out, .ldy = ldy, .ws_row = w_in_out ? 1 : in, .ws_d = w_in_out ? out : 1, .y = y,
        .n_out_blocks = (out + GEMM_OUT - 1) / GEMM_OUT,
        .scratch = (char *)(((uintptr_t)ws + ATTN_ALIGN - 1) & ~(uintptr_t)(ATTN_ALIGN - 1)), .per_thread = per,
    };
}

void attn__gemv_linear(attn_ctx *ctx, const float *x, int64_t rows, int64_t in, int64_t ldx, const void *W,
                       attn_dtype wdt, const float *b, int64_t out, float *y, int64_t ldy, void *ws) {
    gemm_job J = job_of(ctx, x, rows, in, ldx, W, wdt, false, b, out, y, ldy, ws);
    attn__pool_run(ctx->pool, J.n_out_blocks, gemv_task, &J);
}

// Runs J's tiled items (64 rows by 192 output features) with `task`, no rows packed yet.
static void run_tiles(attn_ctx *ctx, gemm_job *J, void (*task)(void *, int64_t, int)) {
    for (int t = 0; t < attn__pool_threads(ctx->pool); t++) {
        gemm_scratch sc;
        thread_scratch(J->in, J->scratch + (size_t)t * J->per_thread, &sc);
        *sc.packed_rb = -1;
    }
    attn__pool_run(ctx->pool, ((J->rows + GEMM_ROWS - 1) / GEMM_ROWS) * J->n_out_blocks, task, J);
}

void attn__gemm_linear(attn_ctx *ctx, const float *x, int64_t rows, int64_t in, int64_t ldx, const float *W,
                       bool w_in_out, const float *b, int64_t out, float *y, int64_t ldy, void *ws) {
    if (!w_in_out && attn__gemv_applies(rows, in)) {
        attn__gemv_linear(ctx, x, rows, in, ldx, W, ATTN_DTYPE_F32, b, out, y, ldy, ws);
    } else {
        gemm_job J = job_of(ctx, x, rows, in, ldx, W, ATTN_DTYPE_F32, w_in_out, b, out, y, ldy, ws);
        run_tiles(ctx, &J, gemm_task);
    }
}

bool attn__gemm_dot_applies(const attn_ctx *ctx, int64_t in) {
    return ctx->kernels != NULL && ctx->kernels->gemm_bf16 != NULL && in % 2 == 0 && in <= INT32_MAX;
}

void attn__gemm_dot_linear(attn_ctx *ctx, const float *x, int64_t rows, int64_t in, int64_t ldx, const uint16_t *W,
                           const float *b, int64_t out, float *y, int64_t ldy, void *ws) {
    gemm_job J = job_of(ctx, x, rows, in, ldx, W, ATTN_DTYPE_BF16, false, b, out, y, ldy, ws);
    run_tiles(ctx, &J, gemm_dot_task);
}

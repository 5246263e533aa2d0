/*
 * fuzz_api.c - fuzz target for the argument validation of libattn's compute entry points:
 * attn_sdpa_fwd (and attn_sdpa_fwd_workspace_size), attn_mha_create (float32, float16 and bfloat16
 * modules; their parameters through the float and typed accessors) + attn_mha_forward, the
 * attn_book_* constructors + attn_book_forward + attn_book_transfer_v2_to_v1,
 * attn_simple_self_attention, attn_linear, the generator and initialiser functions, the KV cache
 * (attn_kv_cache_create, append, truncate, reset, attend), the backward passes after valid forwards
 * (attn_sdpa_bwd, attn_sdpa_sinks_bwd; the module's attn_mha_forward_train and
 * attn_mha_backward), the module's cached forward (attn_mha_forward_cached), packed batches
 * (attn_sdpa_varlen_fwd and _bwd), and
 * attn_ctx_create (ISA and thread count from the input; the context the rest of the input uses).
 *
 * The input chooses an entry point and its arguments: sizes that are small, zero, negative or huge,
 * strides that are permuted-contiguous, broadcast, padded, negative or huge, enum values in and
 * out of range, NaN/inf/huge scalars, NULL pointers, caller-owned workspaces of every size, and
 * an allocation that fails. This file then judges the call from attn.h alone, without looking at
 * how the library does it:
 *  - INVALID: the header says the call must fail (a NULL that is not allowed, a size < 1, an enum
 *    out of range, a product of sizes or an element offset that overflows, ...). The call is made
 *    with NULL or tiny buffers and must return an error, leave a message, and write nothing.
 *  - VALID: the call must succeed. Every buffer is allocated with exactly the number of elements
 *    its sizes and strides reach (so AddressSanitizer sees any access outside them), and the call
 *    must return ATTN_OK (or ATTN_ERR_OUT_OF_MEMORY / ATTN_ERR_WORKSPACE when an allocation was
 *    refused or the workspace given is too small). With finite, moderate inputs the outputs must
 *    hold what attn.h promises: no NaN, fully masked rows exactly zero with log-sum-exp -inf,
 *    other rows' weights summing to 1.
 *  - UNSURE: the header does not settle it (a negative stride, an MHA dropout of exactly 1, an output that
 *    overlaps itself, a U8 mask). The call is made only with exactly sized buffers and any status
 *    is accepted.
 * Calls whose buffers would exceed a few MB (or whose work would be long) are judged but not
 * made, unless they are INVALID. Everything allocated through the context is counted: a leak
 * aborts even without a sanitizer.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "fuzz_data.h"
#include "fuzz_util.h"

#define SMALL_BYTES ((int64_t)4 << 20) /* all buffers of one call */
#define SMALL_WORK ((int64_t)1 << 22)  /* multiply-adds of one call */
#define TAME_VALUE 1e3f                /* inputs within +-this cannot overflow any sane kernel */
#define TAME_MASK 1e30f                /* additive mask values within +-this, or -inf */

/* ---- verdicts ------------------------------------------------------------------------------- */

enum { J_VALID = 0, J_UNSURE = 1, J_INVALID = 2 };

typedef struct judge {
    int v;
    const char *why; /* the first reason for the verdict */
} judge;

static void bad(judge *j, const char *why) {
    if (j->v != J_INVALID) j->v = J_INVALID, j->why = why;
}

static void doubt(judge *j, const char *why) {
    if (j->v == J_VALID) j->v = J_UNSURE, j->why = why;
}

/* ---- the environment of one input ------------------------------------------------------------- */

typedef struct env {
    fuzz_data *fd;
    fuzz_alloc *alloc;
    attn_ctx *ctx;     /* the context under test */
    uint64_t fail_nth; /* which allocation of a call fails (0: none) */
    fuzz_rng rng;      /* bulk values */
    void *blocks[48];  /* buffers of the current call */
    int n_blocks;
} env;

/* An exactly sized block, freed by env_release. */
static void *env_buf(env *e, size_t bytes) {
    FUZZ_CHECK(e->n_blocks < (int)(sizeof e->blocks / sizeof e->blocks[0]), "too many blocks");
    void *p = fuzz_xmalloc(bytes);
    memset(p, 0xCD, bytes > 0 ? bytes : 1);
    e->blocks[e->n_blocks++] = p;
    return p;
}

/* A block of `bytes` starting on a 64-byte boundary, freed by env_release. */
static void *env_buf_aligned(env *e, size_t bytes) {
    FUZZ_CHECK(e->n_blocks < (int)(sizeof e->blocks / sizeof e->blocks[0]), "too many blocks");
    void *p = NULL;
    FUZZ_CHECK(posix_memalign(&p, 64, bytes > 0 ? bytes : 1) == 0, "out of memory (%zu bytes)", bytes);
    memset(p, 0xCD, bytes > 0 ? bytes : 1);
    e->blocks[e->n_blocks++] = p;
    return p;
}

static void env_release(env *e) {
    for (int i = 0; i < e->n_blocks; i++) free(e->blocks[i]);
    e->n_blocks = 0;
}

/* The context to pass: usually the real one, rarely NULL. */
static attn_ctx *env_ctx(env *e) { return fuzz_data_chance(e->fd, 1, 64) ? NULL : e->ctx; }

static void arm(env *e) { fuzz_alloc_arm(e->alloc, e->fail_nth); }
static void disarm(env *e) { e->alloc->fail_at = 0; }

/* Checks a status against a verdict: INVALID must fail; VALID must succeed unless memory was
 * refused (or the caller's workspace was too small, when ws_short). */
static void expect(const env *e, const judge *j, attn_ctx *ctx, attn_status st, bool ws_short, const char *what) {
    fuzz_check_error(ctx, st, what);
    if (j->v == J_INVALID) {
        FUZZ_CHECK(st != ATTN_OK, "%s accepted an invalid call (%s)", what, j->why);
    } else if (j->v == J_VALID) {
        const bool oom = st == ATTN_ERR_OUT_OF_MEMORY && fuzz_alloc_refused(e->alloc) > 0;
        const bool ws = st == ATTN_ERR_WORKSPACE && ws_short;
        FUZZ_CHECK(st == ATTN_OK || oom || ws, "%s rejected a valid call: %s: %s", what, attn_strerror(st),
                   ctx != NULL ? attn_ctx_last_error(ctx) : "");
    }
}

/* True when the status means "bad arguments", after which nothing may have been written. */
static bool is_argument_error(attn_status st) {
    return st == ATTN_ERR_INVALID_ARG || st == ATTN_ERR_BAD_SHAPE || st == ATTN_ERR_BAD_MASK || st == ATTN_ERR_OVERFLOW;
}

/* The bytes of a dummy buffer (see dummy), handed to calls that must fail. */
#define DUMMY_BYTES (16 * sizeof(float))

/* Whether the `bytes` bytes at p (a buffer of env_buf: poisoned with 0xCD) still hold the poison;
 * true for p NULL (none given). */
static bool poisoned(const void *p, int64_t bytes) {
    const uint8_t *b = p;
    for (int64_t i = 0; b != NULL && i < bytes; i++)
        if (b[i] != 0xCD) return false;
    return true;
}

/* A call rejected its arguments: it wrote nothing to the dummy output p (NULL: none given), which
 * `what` names. */
static void check_untouched(const void *p, const char *what) {
    FUZZ_CHECK(poisoned(p, (int64_t)DUMMY_BYTES), "%s written by a rejected call", what);
}

/* ---- values ----------------------------------------------------------------------------------- */

/* Fills n floats with values in [-amp, amp], a few replaced by specials; true if all stay tame. */
static bool fill_floats(env *e, float *p, int64_t n, float amp) {
    for (int64_t i = 0; i < n; i++) p[i] = fuzz_rng_float(&e->rng, -amp, amp);
    if (n > 0 && fuzz_data_chance(e->fd, 1, 8)) {
        const int k = fuzz_data_int_range(e->fd, 1, 4);
        for (int i = 0; i < k; i++) p[fuzz_rng_below(&e->rng, (uint64_t)n)] = fuzz_data_float_special(e->fd);
    }
    bool tame = true;
    for (int64_t i = 0; i < n; i++) tame = tame && isfinite(p[i]) && fabsf(p[i]) <= TAME_VALUE;
    return tame;
}

static float pick_amp(env *e) {
    static const float amps[] = {1.0f, 4.0f, 30.0f, 1000.0f};
    return amps[fuzz_data_pick(e->fd, 4)];
}

/* Fills a mask of n elements of dtype BOOL (any non-zero byte is True) or F32 (0, -inf, random,
 * very negative, a few specials); true if every value is tame (finite within TAME_MASK, or -inf). */
static bool fill_mask(env *e, void *m, int64_t n, attn_dtype dt) {
    const unsigned density = (unsigned)fuzz_data_u8(e->fd); /* out of 256: how many entries block */
    if (dt != ATTN_DTYPE_F32) {
        uint8_t *b = m;
        for (int64_t i = 0; i < n; i++)
            b[i] = fuzz_rng_below(&e->rng, 256) < density ? (uint8_t)(1 + fuzz_rng_below(&e->rng, 255)) : 0;
        return true;
    }
    float *f = m;
    for (int64_t i = 0; i < n; i++) {
        const uint64_t r = fuzz_rng_below(&e->rng, 256);
        if (r < density)
            f[i] = -INFINITY;
        else if (r % 4 == 0)
            f[i] = fuzz_rng_float(&e->rng, -5.0f, 5.0f);
        else if (r % 16 == 1)
            f[i] = -1e30f;
        else
            f[i] = 0.0f;
    }
    if (n > 0 && fuzz_data_chance(e->fd, 1, 8)) {
        const int k = fuzz_data_int_range(e->fd, 1, 3);
        for (int i = 0; i < k; i++) f[fuzz_rng_below(&e->rng, (uint64_t)n)] = fuzz_data_float_special(e->fd);
    }
    bool tame = true;
    for (int64_t i = 0; i < n; i++) tame = tame && (f[i] == -INFINITY || (isfinite(f[i]) && fabsf(f[i]) <= TAME_MASK));
    return tame;
}

/* True when mask element `off` blocks (BOOL True or F32 -inf). */
static bool blocks_at(const void *m, attn_dtype dt, int64_t off) {
    if (dt == ATTN_DTYPE_F32) return ((const float *)m)[off] == -INFINITY;
    return ((const uint8_t *)m)[off] != 0;
}

static attn_dtype pick_mask_dtype(env *e) {
    switch (fuzz_data_pick(e->fd, 8)) {
    case 0: return ATTN_DTYPE_F32;
    case 1: return ATTN_DTYPE_F32;
    case 2: return ATTN_DTYPE_F32;
    case 3: return (attn_dtype)fuzz_data_int_range(e->fd, -2, 12);
    default: return ATTN_DTYPE_BOOL;
    }
}

/* ---- strides and spans ------------------------------------------------------------------------ */

/* Element offsets reached by a view: [lo, hi]; ok false if one of them overflows int64. */
typedef struct span {
    bool ok, negative;
    int64_t lo, hi;
} span;

static span view_span(int nd, const int64_t *n, const int64_t *s) {
    span r = {true, false, 0, 0};
    int64_t pos = 0, neg = 0;
    for (int i = 0; i < nd; i++) {
        const int64_t m = n[i] - 1;
        int64_t t;
        if (s[i] < 0) r.negative = true;
        if (m == 0) continue;
        int64_t sum;
        if (s[i] >= 0) {
            if (fuzz_mul(m, s[i], &t) && fuzz_add(pos, t, &sum))
                pos = sum;
            else
                r.ok = false;
        } else {
            if (s[i] != INT64_MIN && fuzz_mul(m, -s[i], &t) && fuzz_add(neg, t, &sum))
                neg = sum;
            else
                r.ok = false;
        }
    }
    r.lo = -neg;
    r.hi = pos;
    return r;
}

/* Elements a span covers; false if that overflows. */
static bool span_count(const span *sp, int64_t *count) {
    int64_t c;
    return sp->ok && fuzz_add(sp->hi, -sp->lo, &c) && fuzz_add(c, 1, count);
}

/* Elements of a span known not to overflow. */
static int64_t span_elems(const span *sp) {
    int64_t c = 0;
    FUZZ_CHECK(span_count(sp, &c), "span");
    return c;
}

static int64_t random_stride(env *e) {
    switch (fuzz_data_pick(e->fd, 10)) {
    case 0: return 0;
    case 1: return 1;
    case 2: return fuzz_data_i64_range(e->fd, -4, -1);
    case 3: return fuzz_data_i64_edge(e->fd);
    default: return fuzz_data_i64_range(e->fd, 0, 24);
    }
}

/*
 * Strides for an nd-dim view of sizes n: usually contiguous in a permuted dimension order with
 * optional padding, each dimension of an input broadcast (stride 0) with probability bcast/16;
 * otherwise random. *plain tells whether no two elements share an offset (permuted, unbroadcast).
 */
static void gen_strides(env *e, int nd, const int64_t *n, unsigned bcast, int64_t *s, bool *plain) {
    *plain = false;
    if (fuzz_data_pick(e->fd, 8) != 0) {
        int perm[4] = {0, 1, 2, 3};
        for (int i = nd - 1; i > 0; i--) {
            const int j = (int)fuzz_data_pick(e->fd, (size_t)i + 1), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        int64_t acc = 1;
        bool ok = true;
        for (int i = nd - 1; i >= 0 && ok; i--) { /* perm[nd-1] varies fastest */
            const int d = perm[i];
            const int64_t pad = fuzz_data_chance(e->fd, 1, 6) ? fuzz_data_i64_range(e->fd, 1, 3) : 0;
            s[d] = acc;
            ok = n[d] >= 1 && fuzz_mul(acc, n[d], &acc) && fuzz_add(acc, pad, &acc);
        }
        if (ok) {
            *plain = true;
            for (int d = 0; d < nd; d++)
                if (bcast > 0 && fuzz_data_chance(e->fd, bcast, 16)) s[d] = 0, *plain = false;
            return;
        }
    }
    for (int d = 0; d < nd; d++) s[d] = random_stride(e);
}

/* A block covering span sp of elements of `elem` bytes; returns the pointer for offset 0. */
static void *span_buf(env *e, const span *sp, size_t elem) {
    uint8_t *p = env_buf(e, (size_t)span_elems(sp) * elem);
    return p - sp->lo * (int64_t)elem;
}

/* A tiny block or NULL, for calls that must fail. */
static void *dummy(env *e, bool null) { return null ? NULL : env_buf(e, DUMMY_BYTES); }

static int64_t off4(const int64_t s[4], int64_t a, int64_t b, int64_t c, int64_t d) {
    return a * s[0] + b * s[1] + c * s[2] + d * s[3];
}

/* A caller-owned workspace for the context, sometimes: exact, larger, smaller or random in size,
 * 64-byte aligned or not (attn.h states no alignment). Returns its size, or SIZE_MAX for none. */
static size_t maybe_workspace(env *e, attn_ctx *ctx, size_t need, bool need_known) {
    if (ctx == NULL || !fuzz_data_chance(e->fd, 1, 4)) return SIZE_MAX;
    size_t size;
    switch (fuzz_data_pick(e->fd, 4)) {
    case 0: size = need_known ? need : (size_t)fuzz_data_u64_range(e->fd, 1, 1 << 16); break;
    case 1: size = need_known ? need + (size_t)fuzz_data_u64_range(e->fd, 1, 256) : 1 << 18; break;
    case 2: size = need_known && need > 1 ? (size_t)fuzz_data_u64_range(e->fd, 1, need - 1) : 1; break;
    default: size = (size_t)fuzz_data_u64_range(e->fd, 1, 1 << 18); break;
    }
    if (size == 0) size = 1;
    /* The buffer starts `offset` bytes past a 64-byte boundary and ends where its block ends. */
    static const size_t offsets[] = {0, 0, 0, 0, 8, 16, 32, 4, 1};
    size_t offset = offsets[fuzz_data_pick(e->fd, sizeof offsets / sizeof offsets[0])];
    uint8_t *b = env_buf_aligned(e, offset + size);
    const attn_status st = attn_ctx_set_workspace(ctx, b + offset, size);
    FUZZ_CHECK(st == ATTN_OK, "attn_ctx_set_workspace(%zu bytes): %s", size, attn_strerror(st));
    return size;
}

static void drop_workspace(attn_ctx *ctx, size_t ws) {
    if (ws == SIZE_MAX) return;
    FUZZ_CHECK(attn_ctx_set_workspace(ctx, NULL, 0) == ATTN_OK, "attn_ctx_set_workspace(NULL, 0)");
}

/* ============================================================================================ */
/* Scaled dot-product attention                                                                 */
/* ============================================================================================ */

static int64_t gen_size(env *e, int64_t lo, int64_t hi) { return fuzz_data_size(e->fd, lo, hi, 1, 40); }

/* What fuzz_sdpa_bwd needs of the forward's views: the spans of q, k, v, out and the mask (NULL:
 * none), and whether q, k and v are plain (no two elements share an offset). */
typedef struct sdpa_views {
    const span *q, *k, *v, *o, *mask;
    bool plain;
} sdpa_views;

/* Whether a buffer of span_buf (the pointer for offset 0 of span sp) still holds its poison. */
static bool untouched_span(const void *base, const span *sp, size_t elem) {
    return poisoned((const uint8_t *)base + sp->lo * (int64_t)elem, span_elems(sp) * (int64_t)elem);
}

/*
 * attn_sdpa_bwd after a valid forward of fuzz_sdpa (its descriptor, tensors and log-sum-exp), the
 * gradients in buffers covering exactly their views (q's, k's, v's strides; dmask the mask's), all
 * poisoned. Judged from attn.h: NULL dout, lse, dq, dk or dv, dropout from the context's generator
 * without the forward's state, a gradient view of stride 0 on a dimension longer than 1 (a
 * broadcast input), dmask without an F32 mask are refused, with nothing written; the rest runs
 * (memory and the caller's workspace aside). Then, for plain views of tame inputs: finite
 * gradients, and dq = 0 on rows every key is hidden from.
 */
static void fuzz_sdpa_bwd(env *e, attn_ctx *ctx, const attn_sdpa_desc *d, const sdpa_views *vw, const float *q,
                          const float *k, const float *v, const float *o, const float *lse, const attn_generator *before) {
    fuzz_data *fd = e->fd;
    const int64_t B = d->batch, H = d->n_heads, L = d->len_q, S = d->len_kv, D = d->head_dim;
    const int64_t Hkv = d->n_kv_heads == 0 ? H : d->n_kv_heads, Dv = d->head_dim_v == 0 ? D : d->head_dim_v;
    const int64_t nq[4] = {B, H, L, D}, nk[4] = {B, Hkv, S, D}, nv[4] = {B, Hkv, S, Dv};
    const bool null_dout = fuzz_data_chance(fd, 1, 40), null_lse = fuzz_data_chance(fd, 1, 40);
    const bool null_dq = fuzz_data_chance(fd, 1, 40), null_dk = fuzz_data_chance(fd, 1, 40), null_dv = fuzz_data_chance(fd, 1, 40);
    const bool want_dmask = vw->mask != NULL ? fuzz_data_chance(fd, 1, 2) : fuzz_data_chance(fd, 1, 32);
    const bool needs_state = d->dropout_p > 0.0 && d->dropout_rng != ATTN_DROPOUT_RNG_PHILOX;
    const bool give_state = needs_state ? !fuzz_data_chance(fd, 1, 16) : fuzz_data_chance(fd, 1, 8);

    /* what the call does, which its sizing judges too */
    const struct {
        const int64_t *n, *s;
    } g[3] = {{nq, d->q_stride}, {nk, d->k_stride}, {nv, d->v_stride}};
    judge jw = {J_VALID, NULL};
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 4; i++)
            if (g[t].n[i] > 1 && g[t].s[i] == 0) bad(&jw, "a gradient's stride is 0 on a dimension longer than 1");
    if (want_dmask && (d->mask == NULL || d->mask_dtype != ATTN_DTYPE_F32)) bad(&jw, "dmask without an F32 mask");
    judge jb = jw;
    if (null_dout || null_lse || null_dq || null_dk || null_dv) bad(&jb, "dout, lse, dq, dk or dv is NULL");
    if (needs_state && !give_state) bad(&jb, "dropout without the forward's generator state");
    if (!vw->plain) doubt(&jb, "a gradient view overlaps itself");

    size_t need = 0;
    bool need_known = false;
    {
        arm(e);
        const attn_status st = attn_sdpa_bwd_workspace_size(ctx, d, want_dmask, &need);
        disarm(e);
        expect(e, &jw, ctx, st, false, "attn_sdpa_bwd_workspace_size");
        need_known = st == ATTN_OK;
    }

    float *dout = null_dout ? NULL : span_buf(e, vw->o, 4);
    const bool tame = dout == NULL || fill_floats(e, dout + vw->o->lo, span_elems(vw->o), 1.0f);
    float *dq = null_dq ? NULL : span_buf(e, vw->q, 4), *dk = null_dk ? NULL : span_buf(e, vw->k, 4);
    float *dv = null_dv ? NULL : span_buf(e, vw->v, 4);
    float *dmask = NULL;
    if (want_dmask) dmask = vw->mask != NULL ? span_buf(e, vw->mask, 4) : dummy(e, false);
    const size_t ws = maybe_workspace(e, ctx, need, need_known);
    attn_generator own = *attn_ctx_generator(ctx);
    arm(e);
    const attn_status st = attn_sdpa_bwd(ctx, d, q, k, v, o, dout, null_lse ? NULL : lse, give_state ? before : NULL, dq, dk,
                                         dv, dmask);
    disarm(e);
    const bool ws_short = ws != SIZE_MAX && (!need_known || ws < need);
    expect(e, &jb, ctx, st, ws_short, "attn_sdpa_bwd");
    drop_workspace(ctx, ws);
    FUZZ_CHECK(memcmp(&own, attn_ctx_generator(ctx), sizeof own) == 0, "attn_sdpa_bwd moved the context's generator");
    if (jb.v == J_VALID && need_known && ws != SIZE_MAX && ws >= need)
        FUZZ_CHECK(st != ATTN_ERR_WORKSPACE, "a %zu-byte backward workspace refused, %zu needed", ws, need);
    if (is_argument_error(st)) { /* nothing written */
        FUZZ_CHECK(dq == NULL || untouched_span(dq, vw->q, 4), "dq written by a rejected backward");
        FUZZ_CHECK(dk == NULL || untouched_span(dk, vw->k, 4), "dk written by a rejected backward");
        FUZZ_CHECK(dv == NULL || untouched_span(dv, vw->v, 4), "dv written by a rejected backward");
        if (dmask != NULL && vw->mask != NULL)
            FUZZ_CHECK(untouched_span(dmask, vw->mask, 4), "dmask written by a rejected backward");
        if (dmask != NULL && vw->mask == NULL) check_untouched(dmask, "dmask");
    }
    if (st != ATTN_OK || jb.v != J_VALID || !tame) return;
    /* tame forward inputs and dout in [-1, 1]: finite gradients; a row with every key hidden has dq = 0 */
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++) {
                const bool hidden = lse[(b * H + h) * L + i] == -INFINITY;
                for (int64_t t = 0; t < D; t++) {
                    const float x = dq[off4(d->q_stride, b, h, i, t)];
                    FUZZ_CHECK(isfinite(x), "dq[%lld,%lld,%lld,%lld] = %g", (long long)b, (long long)h, (long long)i,
                               (long long)t, (double)x);
                    FUZZ_CHECK(!hidden || x == 0.0f, "dq = %g on a fully masked row", (double)x);
                }
            }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hkv; h++)
            for (int64_t j = 0; j < S; j++) {
                for (int64_t t = 0; t < D; t++)
                    FUZZ_CHECK(isfinite(dk[off4(d->k_stride, b, h, j, t)]), "dk = %g", (double)dk[off4(d->k_stride, b, h, j, t)]);
                for (int64_t t = 0; t < Dv; t++)
                    FUZZ_CHECK(isfinite(dv[off4(d->v_stride, b, h, j, t)]), "dv = %g", (double)dv[off4(d->v_stride, b, h, j, t)]);
            }
}

/*
 * attn_sdpa_sinks_bwd on a valid forward's descriptor, out and lse (drawn after everything else:
 * older inputs decode as they did). Judged from attn.h: a descriptor without sinks, a NULL out,
 * dout, lse or dsinks, and one packed offset array without the other are refused with dsinks
 * untouched; the rest runs and writes exactly H floats.
 */
static void fuzz_sdpa_sinks_bwd(env *e, attn_ctx *ctx, const attn_sdpa_desc *d, const span *so, const float *o,
                                const float *lse) {
    fuzz_data *fd = e->fd;
    if (!fuzz_data_chance(fd, 1, 2)) return;
    const int64_t H = d->n_heads;
    attn_sdpa_desc ds = *d;
    float *sinks = NULL;
    if (!fuzz_data_chance(fd, 1, 8)) {
        sinks = env_buf(e, (size_t)H * 4);
        fill_floats(e, sinks, H, 8.0f);
        ds.sinks = sinks;
    }
    const bool null_out = fuzz_data_chance(fd, 1, 16), null_dout = fuzz_data_chance(fd, 1, 16);
    const bool null_lse = fuzz_data_chance(fd, 1, 16), null_dsinks = fuzz_data_chance(fd, 1, 16);
    const int64_t cu[2] = {0, 1};
    const int one_offset = fuzz_data_chance(fd, 1, 16) ? 1 + (int)fuzz_data_pick(fd, 2) : 0; /* 1: q's only, 2: k's */
    judge j = {J_VALID, NULL};
    if (sinks == NULL) bad(&j, "no sinks to differentiate");
    if (null_out || null_dout || null_lse || null_dsinks) bad(&j, "out, dout, lse or dsinks is NULL");
    if (one_offset) bad(&j, "one packed offset array without the other");
    float *dout = null_dout ? NULL : span_buf(e, so, 4);
    if (dout != NULL) fill_floats(e, dout + so->lo, span_elems(so), 1.0f);
    float *dsinks = null_dsinks ? NULL : env_buf(e, (size_t)(H + 4) * 4); /* 4 guard floats past H */
    arm(e);
    const attn_status st = attn_sdpa_sinks_bwd(ctx, &ds, one_offset == 1 ? cu : NULL, one_offset == 2 ? cu : NULL,
                                               null_out ? NULL : o, dout, null_lse ? NULL : lse, dsinks);
    disarm(e);
    expect(e, &j, ctx, st, false, "attn_sdpa_sinks_bwd");
    if (dsinks == NULL) return;
    if (is_argument_error(st)) FUZZ_CHECK(poisoned(dsinks, (H + 4) * 4), "dsinks written by a rejected call");
    else FUZZ_CHECK(poisoned(dsinks + H, 16), "attn_sdpa_sinks_bwd wrote past dsinks[H - 1]");
}

static void fuzz_sdpa(env *e) {
    fuzz_data *fd = e->fd;
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = gen_size(e, 1, 3);
    d.n_heads = gen_size(e, 1, 4);
    switch (fuzz_data_pick(fd, 4)) {
    case 0: d.n_kv_heads = 0; break;
    case 1: d.n_kv_heads = gen_size(e, 1, 4); break;
    default: { /* a divisor of n_heads */
        const int64_t h = d.n_heads >= 1 && d.n_heads <= 64 ? d.n_heads : 1;
        int64_t k = fuzz_data_i64_range(fd, 1, h);
        while (h % k != 0) k--;
        d.n_kv_heads = k;
    }
    }
    d.len_q = gen_size(e, 1, 6);
    d.len_kv = gen_size(e, 1, 6);
    d.head_dim = gen_size(e, 1, 8);
    d.head_dim_v = fuzz_data_bool(fd) ? 0 : gen_size(e, 1, 8);
    switch (fuzz_data_pick(fd, 4)) {
    case 0: d.scale = fuzz_data_float_special(fd); break;
    case 1: d.scale = fuzz_data_float_range(fd, -3.0f, 3.0f); break;
    default: d.scale = 0.0f; break;
    }
    d.causal =
        fuzz_data_chance(fd, 1, 32) ? (attn_causal)fuzz_data_int_range(fd, -3, 8) : (attn_causal)fuzz_data_pick(fd, 3);
    d.weights_mode = fuzz_data_chance(fd, 1, 32) ? (attn_weights_mode)fuzz_data_int_range(fd, -3, 8)
                                                 : (attn_weights_mode)fuzz_data_pick(fd, 3);
    switch (fuzz_data_pick(fd, 8)) {
    case 0: d.dropout_p = fuzz_data_double_special(fd, 0.0, 1.0); break;
    case 1: d.dropout_p = fuzz_data_unit(fd) * 0.9; break;
    default: d.dropout_p = 0.0; break;
    }

    const int64_t B = d.batch, H = d.n_heads, L = d.len_q, S = d.len_kv, D = d.head_dim;
    const int64_t Hkv = d.n_kv_heads == 0 ? H : d.n_kv_heads, Dv = d.head_dim_v == 0 ? D : d.head_dim_v;
    const int64_t nq[4] = {B, H, L, D}, nk[4] = {B, Hkv, S, D}, nv[4] = {B, Hkv, S, Dv}, no[4] = {B, H, L, Dv};
    const int64_t nm[4] = {B, H, L, S}, nkpm[2] = {B, S};
    bool plain_q, plain_k, plain_v, plain_o, plain_m, plain_kpm;
    gen_strides(e, 4, nq, 1, d.q_stride, &plain_q);
    gen_strides(e, 4, nk, 1, d.k_stride, &plain_k);
    gen_strides(e, 4, nv, 1, d.v_stride, &plain_v);
    gen_strides(e, 4, no, 0, d.o_stride, &plain_o);
    const bool use_mask = fuzz_data_chance(fd, 1, 3), use_kpm = fuzz_data_chance(fd, 1, 4);
    if (use_mask) {
        d.mask_dtype = pick_mask_dtype(e);
        gen_strides(e, 4, nm, 6, d.mask_stride, &plain_m);
    }
    if (use_kpm) {
        d.key_padding_mask_dtype = pick_mask_dtype(e);
        gen_strides(e, 2, nkpm, 3, d.key_padding_mask_stride, &plain_kpm);
    }
    const bool null_q = fuzz_data_chance(fd, 1, 48), null_k = fuzz_data_chance(fd, 1, 48);
    const bool null_v = fuzz_data_chance(fd, 1, 48), null_o = fuzz_data_chance(fd, 1, 48);
    const bool want_lse = fuzz_data_bool(fd);
    const bool want_w =
        fuzz_data_chance(fd, 1, 32) ? d.weights_mode == ATTN_WEIGHTS_NONE : d.weights_mode != ATTN_WEIGHTS_NONE;
    const bool null_desc = fuzz_data_chance(fd, 1, 64), null_bytes = fuzz_data_chance(fd, 1, 64);
    /* the dropout's source (drawn last): the context's generator, Philox, or now and then no such value */
    if (fuzz_data_chance(fd, 1, 4)) {
        d.dropout_rng = fuzz_data_chance(fd, 1, 8) ? (attn_dropout_rng)fuzz_data_int_range(fd, -3, 8) : ATTN_DROPOUT_RNG_PHILOX;
        d.dropout_seed = fuzz_data_u64(fd), d.dropout_offset = fuzz_data_u32(fd);
    }
    attn_ctx *ctx = env_ctx(e);

    /* ---- the descriptor, judged from attn.h ---- */
    judge jd = {J_VALID, NULL};
    const bool sizes_ok =
        B >= 1 && H >= 1 && Hkv >= 1 && L >= 1 && S >= 1 && D >= 1 && Dv >= 1 && d.n_kv_heads >= 0 && d.head_dim_v >= 0;
    if (!sizes_ok)
        bad(&jd, "a size < 1");
    else if (H % Hkv != 0)
        bad(&jd, "n_heads is not a multiple of n_kv_heads");
    if (!isfinite(d.scale)) bad(&jd, "scale is not finite");
    if (d.causal != ATTN_CAUSAL_NONE && d.causal != ATTN_CAUSAL_TOP_LEFT && d.causal != ATTN_CAUSAL_BOTTOM_RIGHT)
        bad(&jd, "unknown causal mode");
    if (d.weights_mode != ATTN_WEIGHTS_NONE && d.weights_mode != ATTN_WEIGHTS_PER_HEAD &&
        d.weights_mode != ATTN_WEIGHTS_AVERAGE)
        bad(&jd, "unknown weights_mode");
    if (!(d.dropout_p >= 0.0 && d.dropout_p <= 1.0)) bad(&jd, "dropout_p outside [0, 1]");
    if (d.dropout_rng != ATTN_DROPOUT_RNG_CONTEXT && d.dropout_rng != ATTN_DROPOUT_RNG_PHILOX)
        bad(&jd, "unknown dropout_rng");
    const bool mask_dt_ok = d.mask_dtype == ATTN_DTYPE_BOOL || d.mask_dtype == ATTN_DTYPE_F32;
    const bool kpm_dt_ok = d.key_padding_mask_dtype == ATTN_DTYPE_BOOL || d.key_padding_mask_dtype == ATTN_DTYPE_F32;
    if (use_mask && !mask_dt_ok) bad(&jd, "mask dtype is not BOOL or F32");
    if (use_kpm && !kpm_dt_ok) bad(&jd, "key_padding_mask dtype is not BOOL or F32");

    span sq = {0}, sk = {0}, sv = {0}, so = {0}, sm = {0}, skpm = {0};
    int64_t n_lse = 0, n_w = 0;
    bool lse_ok = true, w_ok = true;
    if (sizes_ok) {
        sq = view_span(4, nq, d.q_stride), sk = view_span(4, nk, d.k_stride);
        sv = view_span(4, nv, d.v_stride), so = view_span(4, no, d.o_stride);
        const span *views[4] = {&sq, &sk, &sv, &so};
        for (int i = 0; i < 4; i++) {
            if (!views[i]->ok) bad(&jd, "an element offset of q, k, v or out overflows");
            if (views[i]->negative) doubt(&jd, "a negative stride");
        }
        for (int i = 0; i < 4; i++) {
            if (d.o_stride[i] == 0 && no[i] > 1) bad(&jd, "an out stride is 0");
            if (d.o_stride[i] == 0 && no[i] == 1) doubt(&jd, "an out stride is 0 over a size of 1");
        }
        if (!plain_o) doubt(&jd, "out may overlap itself");
        if (use_mask) {
            sm = view_span(4, nm, d.mask_stride);
            if (!sm.ok) bad(&jd, "a mask offset overflows");
            if (sm.negative) doubt(&jd, "a negative mask stride");
        }
        if (use_kpm) {
            skpm = view_span(2, nkpm, d.key_padding_mask_stride);
            if (!skpm.ok) bad(&jd, "a key padding mask offset overflows");
            if (skpm.negative) doubt(&jd, "a negative key padding mask stride");
        }
        const int64_t dl[3] = {B, H, L}, dw[4] = {B, H, L, S}, dwa[3] = {B, L, S};
        lse_ok = fuzz_prod(3, dl, &n_lse) && fuzz_mul(n_lse, 4, &(int64_t){0});
        if (d.weights_mode == ATTN_WEIGHTS_PER_HEAD) w_ok = fuzz_prod(4, dw, &n_w);
        if (d.weights_mode == ATTN_WEIGHTS_AVERAGE) w_ok = fuzz_prod(3, dwa, &n_w);
        w_ok = w_ok && fuzz_mul(n_w, 4, &(int64_t){0});
        if (!w_ok) bad(&jd, "the weights' size overflows");
    }

    /* ---- the call, judged ---- */
    judge jc = jd;
    if (ctx == NULL) bad(&jc, "ctx is NULL");
    if (null_desc) bad(&jc, "desc is NULL");
    if (null_q || null_k || null_v || null_o) bad(&jc, "q, k, v or out is NULL");
    if (want_w != (d.weights_mode != ATTN_WEIGHTS_NONE)) bad(&jc, "weights given iff weights_mode");
    if (sizes_ok && want_lse && !lse_ok) bad(&jc, "the log-sum-exp size overflows");

    /* Small enough to run with exact buffers? */
    bool small = sizes_ok && jd.v != J_INVALID && lse_ok && w_ok;
    int64_t total = 0;
    if (small) {
        const span *views[4] = {&sq, &sk, &sv, &so};
        for (int i = 0; i < 4 && small; i++) {
            int64_t c;
            small = span_count(views[i], &c) && fuzz_mul(c, 4, &c) && fuzz_add(total, c, &total);
        }
        int64_t c;
        if (small && use_mask) small = span_count(&sm, &c) && fuzz_mul(c, 4, &c) && fuzz_add(total, c, &total);
        if (small && use_kpm) small = span_count(&skpm, &c) && fuzz_mul(c, 4, &c) && fuzz_add(total, c, &total);
        small = small && fuzz_add(total, 4 * n_lse, &total) && fuzz_add(total, 4 * n_w, &total) && total <= SMALL_BYTES;
        int64_t dsum = 0, work = 0;
        small = small && fuzz_add(D, Dv, &dsum) && fuzz_add(dsum, 2, &dsum);
        const int64_t dims[5] = {B, H, L, S, dsum};
        small = small && fuzz_prod(5, dims, &work) && work <= SMALL_WORK;
    }

    /* attn_sdpa_fwd_workspace_size judges the descriptor alone. */
    size_t need = 0;
    bool need_known = false; /* need is the workspace the call must be given */
    {
        d.mask = use_mask ? dummy(e, false) : NULL; /* only their presence matters here */
        d.key_padding_mask = use_kpm ? dummy(e, false) : NULL;
        arm(e);
        const attn_status st = attn_sdpa_fwd_workspace_size(ctx, null_desc ? NULL : &d, null_bytes ? NULL : &need);
        disarm(e);
        judge jw = jd;
        if (ctx == NULL || null_desc || null_bytes) bad(&jw, "NULL argument");
        if (jw.v == J_VALID && !small) jw.v = J_UNSURE;
        expect(e, &jw, ctx, st, false, "attn_sdpa_fwd_workspace_size");
        need_known = st == ATTN_OK && jd.v == J_VALID;
    }

    if (jc.v == J_INVALID) { /* must fail before touching memory */
        float *q = dummy(e, null_q), *k = dummy(e, null_k), *v = dummy(e, null_v), *o = dummy(e, null_o);
        float *lse = dummy(e, !want_lse), *w = dummy(e, !want_w);
        d.mask = use_mask ? dummy(e, false) : NULL;
        d.key_padding_mask = use_kpm ? dummy(e, false) : NULL;
        arm(e);
        const attn_status st = attn_sdpa_fwd(ctx, null_desc ? NULL : &d, q, k, v, o, lse, w);
        disarm(e);
        expect(e, &jc, ctx, st, false, "attn_sdpa_fwd");
        if (is_argument_error(st)) {
            check_untouched(o, "out");
            check_untouched(lse, "lse");
            check_untouched(w, "weights");
        }
        return;
    }
    if (!small) return; /* valid or unsure, and too large to cover honestly */

    /* ---- exactly sized buffers ---- */
    const float amp = pick_amp(e);
    float *q = span_buf(e, &sq, 4), *k = span_buf(e, &sk, 4), *v = span_buf(e, &sv, 4), *o = span_buf(e, &so, 4);
    bool tame = fill_floats(e, q + sq.lo, span_elems(&sq), amp);
    tame = fill_floats(e, k + sk.lo, span_elems(&sk), amp) && tame;
    tame = fill_floats(e, v + sv.lo, span_elems(&sv), amp) && tame;
    const size_t esz = d.mask_dtype == ATTN_DTYPE_F32 ? 4 : 1;
    if (use_mask) {
        uint8_t *m = span_buf(e, &sm, esz);
        tame = fill_mask(e, m + sm.lo * (int64_t)esz, span_elems(&sm), d.mask_dtype) && tame;
        d.mask = m;
    }
    const size_t kesz = d.key_padding_mask_dtype == ATTN_DTYPE_F32 ? 4 : 1;
    if (use_kpm) {
        uint8_t *m = span_buf(e, &skpm, kesz);
        tame = fill_mask(e, m + skpm.lo * (int64_t)kesz, span_elems(&skpm), d.key_padding_mask_dtype) && tame;
        d.key_padding_mask = m;
    }
    tame = tame && fabsf(d.scale) <= TAME_VALUE;
    float *lse = want_lse ? env_buf(e, (size_t)n_lse * 4) : NULL;
    float *w = want_w ? env_buf(e, (size_t)n_w * 4) : NULL;
    const size_t ws = maybe_workspace(e, ctx, need, need_known);

    const attn_generator before = ctx != NULL ? *attn_ctx_generator(ctx) : (attn_generator){0};
    arm(e);
    const attn_status st = attn_sdpa_fwd(ctx, &d, q, k, v, o, lse, w);
    disarm(e);
    const bool ws_short = ws != SIZE_MAX && (!need_known || ws < need);
    expect(e, &jc, ctx, st, ws_short, "attn_sdpa_fwd");
    drop_workspace(ctx, ws);
    if (jc.v == J_VALID && need_known && ws != SIZE_MAX && ws >= need)
        FUZZ_CHECK(st != ATTN_ERR_WORKSPACE, "a %zu-byte workspace refused, %zu needed", ws, need);
    if (st != ATTN_OK || jc.v != J_VALID || !tame) return;

    /* ---- what attn.h promises about the results ---- */
    const bool dropout = d.dropout_p > 0.0;
    const int64_t ks[4] = {d.key_padding_mask_stride[0], d.key_padding_mask_stride[1], 0, 0};
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i = 0; i < L; i++) {
            int64_t open_heads = 0;
            for (int64_t h = 0; h < H; h++) {
                bool all = true;
                for (int64_t j = 0; j < S && all; j++) {
                    bool hidden = (d.causal == ATTN_CAUSAL_TOP_LEFT && j > i) ||
                                  (d.causal == ATTN_CAUSAL_BOTTOM_RIGHT && j > i + S - L);
                    hidden = hidden || (use_mask && blocks_at(d.mask, d.mask_dtype, off4(d.mask_stride, b, h, i, j)));
                    hidden = hidden ||
                             (use_kpm && blocks_at(d.key_padding_mask, d.key_padding_mask_dtype, off4(ks, b, j, 0, 0)));
                    all = hidden;
                }
                open_heads += !all;
                for (int64_t t = 0; t < Dv; t++) {
                    const float x = o[off4(d.o_stride, b, h, i, t)];
                    FUZZ_CHECK(isfinite(x), "out[%lld,%lld,%lld,%lld] = %g", (long long)b, (long long)h, (long long)i,
                               (long long)t, (double)x);
                    FUZZ_CHECK(!all || x == 0.0f, "fully masked row with out = %g", (double)x);
                }
                if (lse != NULL) {
                    const float l = lse[(b * H + h) * L + i];
                    FUZZ_CHECK(all ? l == -INFINITY : isfinite(l), "lse = %g for a %s row", (double)l,
                               all ? "fully masked" : "visible");
                }
                if (d.weights_mode == ATTN_WEIGHTS_PER_HEAD) {
                    const float *row = w + ((b * H + h) * L + i) * S;
                    double sum = 0.0;
                    for (int64_t j = 0; j < S; j++) {
                        FUZZ_CHECK(isfinite(row[j]) && row[j] >= 0.0f, "weight %g", (double)row[j]);
                        FUZZ_CHECK(!all || row[j] == 0.0f, "fully masked row with weight %g", (double)row[j]);
                        sum += row[j];
                    }
                    if (!dropout) FUZZ_CHECK(fabs(sum - (all ? 0.0 : 1.0)) <= 1e-4, "weights sum to %.9g", sum);
                }
            }
            if (d.weights_mode == ATTN_WEIGHTS_AVERAGE) {
                const float *row = w + (b * L + i) * S;
                double sum = 0.0;
                for (int64_t j = 0; j < S; j++) {
                    FUZZ_CHECK(isfinite(row[j]) && row[j] >= 0.0f, "averaged weight %g", (double)row[j]);
                    sum += row[j];
                }
                if (!dropout)
                    FUZZ_CHECK(fabs(sum - (double)open_heads / (double)H) <= 1e-4, "averaged weights sum to %.9g", sum);
            }
        }
    }
    if (lse != NULL) {
        const sdpa_views views = {&sq, &sk, &sv, &so, use_mask ? &sm : NULL, plain_q && plain_k && plain_v};
        fuzz_sdpa_bwd(e, ctx, &d, &views, q, k, v, o, lse, &before);
        fuzz_sdpa_sinks_bwd(e, ctx, &d, &so, o, lse);
    }
}

/* ============================================================================================ */
/* nn.MultiheadAttention                                                                        */
/* ============================================================================================ */

static int gen_flag(env *e) {
    switch (fuzz_data_pick(e->fd, 8)) {
    case 0: return -1;
    case 1: return 2;
    case 2: return fuzz_data_chance(e->fd, 1, 2) ? INT32_MIN : INT32_MAX;
    case 3:
    case 4: return 1;
    default: return 0;
    }
}

static double gen_dropout(env *e) {
    switch (fuzz_data_pick(e->fd, 8)) {
    case 0: return fuzz_data_double_special(e->fd, 0.0, 1.0);
    case 1:
    case 2: return fuzz_data_unit(e->fd) * 0.9;
    default: return 0.0;
    }
}

static void judge_dropout(judge *j, double p) {
    if (!(p >= 0.0 && p <= 1.0))
        bad(j, "dropout outside [0, 1]");
    else if (p == 1.0)
        doubt(j, "dropout = 1");
}

/* The row-sum promise of attention weights: rows (index r, S entries) sum to 1, or to 0 when
 * fully masked (open = false), each entry in [0, 1]. */
static void check_weight_row(const float *row, int64_t S, double expect_sum, bool exact_sum) {
    double sum = 0.0;
    for (int64_t j = 0; j < S; j++) {
        FUZZ_CHECK(isfinite(row[j]) && row[j] >= 0.0f, "weight %g", (double)row[j]);
        sum += row[j];
    }
    if (exact_sum) FUZZ_CHECK(fabs(sum - expect_sum) <= 1e-4, "weights sum to %.9g, not %g", sum, expect_sum);
}

static void check_finite(const float *p, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++) FUZZ_CHECK(isfinite(p[i]), "%s[%lld] = %g", what, (long long)i, (double)p[i]);
}

/* A valid forward of mha_forward_once: its context, args (inputs in place), how key and value were
 * given (0 omitted, 1 the previous input's pointer, 2 their own), the inputs' and out's element
 * counts, and its weights buffer (NULL without need_weights). */
typedef struct mha_call {
    attn_ctx *ctx;
    const attn_mha_args *a;
    int kmode, vmode;
    int64_t nq, nk, nv;
    float *w;
} mha_call;

/*
 * Training on a valid forward's call: attn_mha_saved_size, attn_mha_forward_train into a buffer of
 * that size (or one byte short: ATTN_ERR_WORKSPACE, and its backward then refuses the unfilled
 * buffer), attn_mha_backward with drawn arguments, judged from attn.h: NULL dout or saved, a saved
 * size short of the training forward's, dkey given for a key that is the query, dvalue for a value
 * that is the query or the key are refused, every gradient buffer (poisoned) left whole; dparams
 * NULL or any of its entries NULL skips them. Accepted on tame inputs: finite gradients.
 */
static void mha_train_once(env *e, attn_mha *m, const mha_call *c) {
    fuzz_data *fd = e->fd;
    const attn_mha_args *a = c->a;
    size_t bytes = 0;
    arm(e);
    attn_status st = attn_mha_saved_size(c->ctx, m, a, &bytes);
    disarm(e);
    const judge ok = {J_VALID, NULL};
    expect(e, &ok, c->ctx, st, false, "attn_mha_saved_size");
    if (st != ATTN_OK) return;
    const bool short_saved = fuzz_data_chance(fd, 1, 8) && bytes > 0;
    const size_t size = short_saved ? bytes - 1 : bytes;
    void *saved = env_buf_aligned(e, size);
    float *o = env_buf(e, (size_t)c->nq * 4);
    arm(e);
    st = attn_mha_forward_train(c->ctx, m, a, o, c->w, saved, size);
    disarm(e);
    judge jt = {J_VALID, NULL};
    if (short_saved) bad(&jt, "saved one byte short");
    expect(e, &jt, c->ctx, st, false, "attn_mha_forward_train");
    const bool filled = st == ATTN_OK;

    /* the backward's arguments */
    const bool null_dout = fuzz_data_chance(fd, 1, 32), null_saved = fuzz_data_chance(fd, 1, 32);
    const bool shorter = fuzz_data_chance(fd, 1, 16) && size > 0;
    const bool key_is_query = c->kmode != 2, value_shared = c->vmode != 2;
    const bool give_dk = key_is_query ? fuzz_data_chance(fd, 1, 16) : fuzz_data_bool(fd);
    const bool give_dv = value_shared ? fuzz_data_chance(fd, 1, 16) : fuzz_data_bool(fd);
    const bool give_dq = fuzz_data_chance(fd, 7, 8), give_dparams = fuzz_data_chance(fd, 3, 4);
    judge jb = {J_VALID, NULL};
    if (null_dout || null_saved) bad(&jb, "dout or saved is NULL");
    if (shorter || !filled) bad(&jb, "saved is not a training forward's of this size");
    if (key_is_query && give_dk) bad(&jb, "dkey for a key that is the query");
    if (value_shared && give_dv) bad(&jb, "dvalue for a value that is the query or the key");
    float *dout = null_dout ? NULL : env_buf(e, (size_t)c->nq * 4);
    const bool tame = dout == NULL || fill_floats(e, dout, c->nq, 1.0f);
    float *dq = give_dq ? env_buf(e, (size_t)c->nq * 4) : NULL;
    float *dk = give_dk ? env_buf(e, (size_t)(key_is_query ? c->nq : c->nk) * 4) : NULL;
    float *dv = give_dv ? env_buf(e, (size_t)(value_shared ? c->nq : c->nv) * 4) : NULL;
    const int np = attn_mha_param_count(m);
    float *dparams[8] = {NULL};
    int64_t pn[8] = {0};
    FUZZ_CHECK(np >= 1 && np <= 8, "%d parameters", np);
    for (int i = 0; give_dparams && i < np; i++) {
        int ndim;
        int64_t shape[3];
        FUZZ_CHECK(attn_mha_param_at(m, i, NULL, &ndim, shape, NULL) == ATTN_OK, "param_at(%d)", i);
        pn[i] = 1;
        for (int dd = 0; dd < ndim; dd++) pn[i] *= shape[dd];
        if (fuzz_data_chance(fd, 7, 8)) dparams[i] = env_buf(e, (size_t)pn[i] * 4);
    }
    arm(e);
    st = attn_mha_backward(c->ctx, m, a, null_saved ? NULL : saved, shorter ? size - 1 : size, dout, dq, dk, dv,
                           give_dparams ? dparams : NULL);
    disarm(e);
    expect(e, &jb, c->ctx, st, false, "attn_mha_backward");
    const struct {
        const float *p;
        int64_t n;
        const char *name;
    } grads[3] = {{dq, c->nq, "dquery"}, {dk, key_is_query ? c->nq : c->nk, "dkey"}, {dv, value_shared ? c->nq : c->nv, "dvalue"}};
    if (is_argument_error(st)) { /* nothing written */
        for (int g = 0; g < 3; g++)
            FUZZ_CHECK(poisoned(grads[g].p, grads[g].n * 4), "%s written by a rejected backward", grads[g].name);
        for (int i = 0; i < np; i++)
            FUZZ_CHECK(poisoned(dparams[i], pn[i] * 4), "dparams[%d] written by a rejected backward", i);
    }
    if (st != ATTN_OK || jb.v != J_VALID || !tame) return;
    for (int g = 0; g < 3; g++)
        if (grads[g].p != NULL) check_finite(grads[g].p, grads[g].n, grads[g].name);
    for (int i = 0; i < np; i++)
        if (dparams[i] != NULL) check_finite(dparams[i], pn[i], "a parameter's gradient");
}

/* Runs one forward pass of module m (configuration cfg as created) with arguments from the input. */
/* attn_mha_forward on arguments judged j, armed (the failing allocator, a workspace maybe short);
 * its status checked against j. */
static attn_status run_mha_forward(env *e, const judge *j, attn_ctx *ctx, attn_mha *m, const attn_mha_args *a,
                                   void *o, void *w, const char *what) {
    const size_t ws = maybe_workspace(e, ctx, 0, false);
    arm(e);
    const attn_status st = attn_mha_forward(ctx, m, a, o, w);
    disarm(e);
    expect(e, j, ctx, st, ws != SIZE_MAX, what);
    drop_workspace(ctx, ws);
    return st;
}

static void mha_forward_once(env *e, attn_mha *m, const attn_mha_config *cfg) {
    fuzz_data *fd = e->fd;
    const int64_t E = cfg->embed_dim, H = cfg->num_heads, kd = cfg->kdim, vd = cfg->vdim;
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.unbatched = fuzz_data_chance(fd, 1, 4) ? gen_flag(e) : 0;
    a.batch = gen_size(e, 1, 3);
    a.len_q = gen_size(e, 1, 5);
    a.len_kv = gen_size(e, 1, 5);
    const int kmode = (int)fuzz_data_pick(fd, 3), vmode = (int)fuzz_data_pick(fd, 3); /* NULL, shared, own */
    const bool use_mask = fuzz_data_chance(fd, 1, 3), use_kpm = fuzz_data_chance(fd, 1, 3);
    if (use_mask) {
        a.attn_mask_dtype = fuzz_data_chance(fd, 1, 16) ? ATTN_DTYPE_U8 : pick_mask_dtype(e);
        a.attn_mask_ndim =
            fuzz_data_chance(fd, 1, 24) ? fuzz_data_int_range(fd, -1, 5) : 2 + (int)fuzz_data_pick(fd, 2);
    }
    if (use_kpm) a.key_padding_mask_dtype = fuzz_data_chance(fd, 1, 16) ? ATTN_DTYPE_U8 : pick_mask_dtype(e);
    a.causal = fuzz_data_chance(fd, 1, 3) ? gen_flag(e) : 0;
    a.need_weights = gen_flag(e);
    a.average_attn_weights = gen_flag(e);
    a.training = fuzz_data_chance(fd, 1, 3) ? gen_flag(e) : 0;
    const bool want_w = fuzz_data_chance(fd, 1, 32) ? a.need_weights == 0 : a.need_weights != 0;
    const bool null_q = fuzz_data_chance(fd, 1, 48), null_o = fuzz_data_chance(fd, 1, 48);
    const bool null_m = fuzz_data_chance(fd, 1, 64), null_args = fuzz_data_chance(fd, 1, 64);
    attn_ctx *ctx = env_ctx(e);

    judge j = {J_VALID, NULL};
    const bool unb = a.unbatched != 0;
    const int64_t N = unb ? 1 : a.batch, L = a.len_q, S = kmode == 0 ? a.len_q : a.len_kv;
    if (ctx == NULL || null_m || null_args) bad(&j, "ctx, module or args is NULL");
    if (null_q || null_o) bad(&j, "query or out is NULL");
    if (want_w != (a.need_weights != 0)) bad(&j, "weights given iff need_weights");
    const bool sizes_ok = N >= 1 && L >= 1 && S >= 1;
    if (!sizes_ok) bad(&j, "batch, len_q or len_kv < 1");
    if (kmode == 0 && kd != E) bad(&j, "key omitted but kdim != embed_dim");
    const int64_t kwidth = kmode == 0 ? E : kd;
    if (vmode == 0 && vd != kwidth) bad(&j, "value omitted but vdim differs from the key's width");
    if (kmode == 1 && (kd != E || S != L)) doubt(&j, "key is the query's pointer with another shape");
    if (vmode == 1 && vd != kwidth) doubt(&j, "value is the key's pointer with another width");
    if (a.causal != 0 && use_mask) bad(&j, "causal with attn_mask");
    if (use_mask) {
        if (a.attn_mask_dtype == ATTN_DTYPE_U8)
            doubt(&j, "U8 attn_mask");
        else if (a.attn_mask_dtype != ATTN_DTYPE_BOOL && a.attn_mask_dtype != ATTN_DTYPE_F32)
            bad(&j, "attn_mask dtype");
        if (a.attn_mask_ndim != 2 && a.attn_mask_ndim != 3) bad(&j, "attn_mask ndim");
    }
    if (use_kpm) {
        if (a.key_padding_mask_dtype == ATTN_DTYPE_U8)
            doubt(&j, "U8 key_padding_mask");
        else if (a.key_padding_mask_dtype != ATTN_DTYPE_BOOL && a.key_padding_mask_dtype != ATTN_DTYPE_F32)
            bad(&j, "key_padding_mask dtype");
    }
    if (cfg->dropout == 1.0 && a.training != 0) doubt(&j, "training with dropout 1");

    /* Element counts of every buffer (overflow: the call cannot be honest, it must fail). */
    const int64_t extra = (cfg->add_bias_kv ? 1 : 0) + (cfg->add_zero_attn ? 1 : 0);
    int64_t nq = 0, nk = 0, nv = 0, nw = 0, nmask = 0, nkpm = 0, S2 = 0, work = 0;
    bool counts_ok = sizes_ok;
    if (sizes_ok) {
        const int64_t dq[3] = {L, N, E}, dk[3] = {S, N, kd}, dv[3] = {S, N, vd};
        counts_ok = fuzz_prod(3, dq, &nq) && fuzz_prod(3, dk, &nk) && fuzz_prod(3, dv, &nv) && fuzz_add(S, extra, &S2);
        if (counts_ok) {
            const int64_t dw[4] = {N, a.average_attn_weights ? 1 : H, L, S2};
            const int64_t dm[4] = {a.attn_mask_ndim == 3 ? N : 1, a.attn_mask_ndim == 3 ? H : 1, L, S};
            counts_ok = fuzz_prod(4, dw, &nw) && fuzz_prod(4, dm, &nmask) && fuzz_mul(N, S, &nkpm);
        }
        int64_t t;
        counts_ok = counts_ok && fuzz_mul(nq, 4, &t) && fuzz_mul(nk, 4, &t) && fuzz_mul(nv, 4, &t) &&
                    fuzz_mul(nw, 4, &t) && fuzz_mul(nmask, 4, &t);
        if (!counts_ok) bad(&j, "a buffer size overflows");
        const int64_t wmax = E > kd ? (E > vd ? E : vd) : (kd > vd ? kd : vd);
        int64_t rows_all, e2, w1 = 0, w2 = 0;
        work = INT64_MAX;
        if (counts_ok && fuzz_add(L, S2, &rows_all) && fuzz_add(rows_all, S2, &rows_all) && fuzz_mul(E, 2, &e2)) {
            const int64_t dwork[4] = {N, rows_all, E, wmax}, dattn[4] = {N, L, S2, e2};
            if (!(fuzz_prod(4, dwork, &w1) && fuzz_prod(4, dattn, &w2) && fuzz_add(w1, w2, &work))) work = INT64_MAX;
        }
    }

    const size_t mesz = a.attn_mask_dtype == ATTN_DTYPE_F32 ? 4 : 1,
                 kesz = a.key_padding_mask_dtype == ATTN_DTYPE_F32 ? 4 : 1;
    if (j.v == J_INVALID) {
        float *q = dummy(e, null_q), *o = dummy(e, null_o), *w = dummy(e, !want_w);
        a.query = q;
        a.key = kmode == 0 ? NULL : kmode == 1 ? q : dummy(e, false);
        a.value = vmode == 0 ? NULL : vmode == 1 ? (a.key != NULL ? a.key : q) : dummy(e, false);
        a.attn_mask = use_mask ? dummy(e, false) : NULL;
        a.key_padding_mask = use_kpm ? dummy(e, false) : NULL;
        arm(e);
        const attn_status st = attn_mha_forward(ctx, null_m ? NULL : m, null_args ? NULL : &a, o, w);
        disarm(e);
        expect(e, &j, ctx, st, false, "attn_mha_forward");
        if (is_argument_error(st)) {
            check_untouched(o, "out");
            check_untouched(w, "weights");
        }
        return;
    }
    int64_t total = 0;
    const bool small = counts_ok && work <= SMALL_WORK && fuzz_add(nq + nk + nv, nq + nw, &total) &&
                       fuzz_add(total, nmask + nkpm, &total) && total <= SMALL_BYTES / 4;
    if (!small) return;

    /* Buffers: a shared pointer covers every tensor it stands for. */
    const float amp = pick_amp(e);
    int64_t nqbuf = nq, nkbuf = nk;
    if (kmode == 1 && nk > nqbuf) nqbuf = nk;
    if (vmode == 1 && kmode != 2 && nv > nqbuf) nqbuf = nv;
    if (vmode == 1 && kmode == 2 && nv > nkbuf) nkbuf = nv;
    if (kmode == 0 && vmode == 0 && nv > nqbuf) nqbuf = nv;
    float *q = env_buf(e, (size_t)nqbuf * 4);
    bool tame = fill_floats(e, q, nqbuf, amp);
    float *k = NULL, *v = NULL;
    if (kmode == 2) {
        k = env_buf(e, (size_t)nkbuf * 4);
        tame = fill_floats(e, k, nkbuf, amp) && tame;
    }
    if (vmode == 2) {
        v = env_buf(e, (size_t)nv * 4);
        tame = fill_floats(e, v, nv, amp) && tame;
    }
    a.query = q;
    a.key = kmode == 0 ? NULL : kmode == 1 ? q : k;
    a.value = vmode == 0 ? NULL : vmode == 1 ? (a.key != NULL ? a.key : q) : v;
    if (use_mask) {
        void *mk = env_buf(e, (size_t)nmask * mesz);
        tame = fill_mask(e, mk, nmask, a.attn_mask_dtype) && tame;
        a.attn_mask = mk;
    }
    if (use_kpm) {
        void *pk = env_buf(e, (size_t)nkpm * kesz);
        tame = fill_mask(e, pk, nkpm, a.key_padding_mask_dtype) && tame;
        a.key_padding_mask = pk;
    }
    float *o = env_buf(e, (size_t)nq * 4);
    float *w = want_w ? env_buf(e, (size_t)nw * 4) : NULL;
    const attn_status st = run_mha_forward(e, &j, ctx, m, &a, o, w, "attn_mha_forward");
    if (st != ATTN_OK || j.v != J_VALID || !tame) return;

    /* Module parameters are finite (initialised by the library), inputs are tame. */
    check_finite(o, nq, "out");
    if (fuzz_data_chance(fd, 1, 2)) {
        const mha_call call = {ctx, &a, kmode, vmode, nq, nk, nv, w};
        mha_train_once(e, m, &call);
    }
    if (w == NULL) return;
    const bool sums = a.training == 0 || cfg->dropout == 0.0;
    const int64_t hw = a.average_attn_weights ? 1 : H;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t i = 0; i < L; i++) {
            int64_t open = 0;
            bool open_h[64] = {false};
            for (int64_t h = 0; h < H; h++) {
                bool all = extra == 0;
                for (int64_t jj = 0; jj < S && all; jj++) {
                    bool hidden = a.causal != 0 && jj > i;
                    if (use_mask) {
                        const int64_t off = a.attn_mask_ndim == 3 ? ((n * H + h) * L + i) * S + jj : i * S + jj;
                        hidden = hidden || blocks_at(a.attn_mask, a.attn_mask_dtype, off);
                    }
                    if (use_kpm) hidden = hidden || blocks_at(a.key_padding_mask, a.key_padding_mask_dtype, n * S + jj);
                    all = hidden;
                }
                open += !all;
                if (h < 64) open_h[h] = !all;
            }
            for (int64_t h = 0; h < hw; h++) {
                const float *row = w + ((n * hw + h) * L + i) * S2;
                const double want =
                    a.average_attn_weights ? (double)open / (double)H : (open_h[h < 64 ? h : 0] ? 1.0 : 0.0);
                check_weight_row(row, S2, want, sums && (a.average_attn_weights || H <= 64));
            }
        }
    }
}

/* The bytes of n values of a cache type (block types: n / 32 blocks). */
static int64_t kv_bytes(attn_dtype dt, int64_t n) {
    return n / (int64_t)attn_dtype_block_size(dt) * (int64_t)attn_dtype_size(dt);
}

/*
 * attn_mha_forward_cached on a valid module: a cache configured around the module's (batch, heads,
 * head dim, type, capacity; now and then another batch, head count, head dim or value dim), then up
 * to three steps of drawn batch and len (now and then zero, negative or past the room), x or out
 * NULL. Judged from attn.h: a module with kdim or vdim other than E, bias_k or add_zero_attn, a
 * cache that does not fit the module and the batch, batch or len < 1, len past the cache's room, a
 * NULL argument fail, and so does a half module's cache of the other half type; a refusal leaves
 * out, the cache's length and its storage's bytes as they were; an accepted step adds len to the
 * length and, for a float32 module, gives finite outputs while every step's input has been tame (a
 * cached NaN reaches later queries; a half module's tame values may still pass float16's range).
 * A half module takes and gives values of its type (x drawn as floats, then rounded).
 */
static void mha_cached_once(env *e, attn_mha *m, const attn_mha_config *rc) {
    fuzz_data *fd = e->fd;
    const int64_t E = rc->embed_dim, H = rc->num_heads, hd = E / H;
    attn_kv_cache_config kcfg;
    attn_kv_cache_config_init(&kcfg);
    kcfg.batch = 1 + (int64_t)fuzz_data_pick(fd, 3);
    kcfg.n_kv_heads = fuzz_data_chance(fd, 1, 10) ? 1 + (int64_t)fuzz_data_pick(fd, 4) : H;
    kcfg.head_dim = fuzz_data_chance(fd, 1, 10) ? 1 + (int64_t)fuzz_data_pick(fd, 8) : hd;
    kcfg.head_dim_v = fuzz_data_chance(fd, 1, 10) ? 1 + (int64_t)fuzz_data_pick(fd, 8) : fuzz_data_bool(fd) ? 0 : hd;
    kcfg.capacity = 1 + (int64_t)fuzz_data_pick(fd, 8);
    static const attn_dtype types[3] = {ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
    kcfg.dtype = types[fuzz_data_pick(fd, 3)];
    attn_kv_cache *kc = NULL;
    if (attn_kv_cache_create(e->ctx, &kcfg, &kc) != ATTN_OK) return;
    const attn_kv_cache_config *c = attn_kv_cache_get_config(kc);
    const bool module_ok = rc->kdim == E && rc->vdim == E && !rc->add_bias_kv && !rc->add_zero_attn;
    const bool half = rc->dtype != ATTN_DTYPE_F32;
    const size_t es = half ? 2 : 4;
    const int steps = 1 + (int)fuzz_data_pick(fd, 3);
    bool tame_cache = true; /* every step so far appended tame keys and values */
    for (int st_i = 0; st_i < steps; st_i++) {
        const int64_t len = attn_kv_cache_length(kc), room = c->capacity - len;
        const int64_t batch = fuzz_data_chance(fd, 1, 10) ? gen_size(e, -1, 4) : c->batch;
        const int64_t n = fuzz_data_chance(fd, 1, 10) ? gen_size(e, -1, room + 2) : 1 + fuzz_data_i64_range(fd, 0, room > 1 ? room - 1 : 0);
        const bool null_x = fuzz_data_chance(fd, 1, 32), null_o = fuzz_data_chance(fd, 1, 32);
        attn_ctx *ctx = env_ctx(e);
        judge j = {J_VALID, NULL};
        if (ctx == NULL || null_x || null_o) bad(&j, "NULL argument");
        if (!module_ok) bad(&j, "a module decoding cannot serve");
        if (batch < 1 || n < 1) bad(&j, "batch or len < 1");
        if (c->batch != batch || c->n_kv_heads != H || c->head_dim != hd || c->head_dim_v != hd) bad(&j, "a cache that does not fit");
        if (n > room) bad(&j, "len past the cache's room");
        if (half && (c->dtype == ATTN_DTYPE_F16 || c->dtype == ATTN_DTYPE_BF16) && c->dtype != rc->dtype)
            bad(&j, "a half cache of the other half type");
        int64_t rows = 0, nx = 0;
        const bool small = batch >= 1 && n >= 1 && fuzz_mul(batch, n, &rows) && fuzz_mul(rows, E, &nx) && nx <= (1 << 14);
        if (!small && j.v != J_INVALID) continue;
        float *x = null_x ? NULL : small ? env_buf(e, (size_t)nx * 4) : dummy(e, false);
        const bool tame = x == NULL || !small || fill_floats(e, x, nx, pick_amp(e));
        void *xin = x;
        if (half && x != NULL && small) {
            xin = env_buf(e, (size_t)nx * 2);
            FUZZ_CHECK(attn_convert(rc->dtype, xin, ATTN_DTYPE_F32, x, nx) == ATTN_OK, "convert x");
        }
        void *o = null_o ? NULL : small ? env_buf(e, (size_t)nx * es) : dummy(e, false);
        void *kst, *vst;
        attn_kv_cache_storage(kc, &kst, NULL, &vst, NULL);
        const int64_t kb = kv_bytes(c->dtype, c->batch * c->n_kv_heads * c->capacity * c->head_dim);
        const int64_t vb = kv_bytes(c->dtype, c->batch * c->n_kv_heads * c->capacity * c->head_dim_v);
        uint8_t *k0 = env_buf(e, (size_t)kb), *v0 = env_buf(e, (size_t)vb);
        memcpy(k0, kst, (size_t)kb), memcpy(v0, vst, (size_t)vb);
        const size_t ws = maybe_workspace(e, ctx, 0, false);
        arm(e);
        const attn_status st = attn_mha_forward_cached(ctx, m, kc, xin, batch, n, o);
        disarm(e);
        expect(e, &j, ctx, st, ws != SIZE_MAX, "attn_mha_forward_cached");
        drop_workspace(ctx, ws);
        if (st != ATTN_OK) {
            FUZZ_CHECK(attn_kv_cache_length(kc) == len, "a refused cached forward changed the cache's length");
            if (is_argument_error(st) || st == ATTN_ERR_CAPACITY || st == ATTN_ERR_UNSUPPORTED) {
                FUZZ_CHECK(memcmp(k0, kst, (size_t)kb) == 0 && memcmp(v0, vst, (size_t)vb) == 0,
                           "a refused cached forward wrote the cache");
                FUZZ_CHECK(poisoned(o, small ? nx * (int64_t)es : (int64_t)DUMMY_BYTES), "out written by a refused cached forward");
            }
            continue;
        }
        FUZZ_CHECK(attn_kv_cache_length(kc) == len + n, "length after a cached forward of %lld", (long long)n);
        tame_cache = tame_cache && tame;
        if (j.v == J_VALID && tame_cache && !half) check_finite(o, nx, "cached out");
    }
    attn_kv_cache_free(kc);
}

/* A half module's forward on valid arguments of the shapes its products take on the bf16 dot
 * products and in tiles (more than 8 and more than 64 rows, any widths, self-attention or not,
 * causal, weights, training): the inputs drawn as floats and rounded to the module's type, out and
 * the weights of that type. (Argument checks are the float32 module's, shared; the values are
 * tests/test_mha_lowp.c's.) */
static void mha_half_forward_once(env *e, attn_mha *m, const attn_mha_config *rc) {
    fuzz_data *fd = e->fd;
    const int64_t E = rc->embed_dim, H = rc->num_heads, kd = rc->kdim, vd = rc->vdim;
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.batch = 1 + (int64_t)fuzz_data_pick(fd, 2);
    a.len_q = 1 + (int64_t)fuzz_data_pick(fd, 80);
    const bool self = kd == E && vd == E && fuzz_data_bool(fd);
    a.len_kv = self ? a.len_q : 1 + (int64_t)fuzz_data_pick(fd, 80);
    a.causal = fuzz_data_chance(fd, 1, 3);
    a.need_weights = fuzz_data_chance(fd, 1, 4);
    a.average_attn_weights = fuzz_data_bool(fd);
    a.training = rc->dropout < 1.0 && fuzz_data_chance(fd, 1, 4);
    const int64_t N = a.batch, L = a.len_q, S = a.len_kv, S2 = S + (rc->add_bias_kv ? 1 : 0) + (rc->add_zero_attn ? 1 : 0);
    int64_t nq, nk, nv, nw;
    if (!(fuzz_mul(N * L, E, &nq) && fuzz_mul(N * S, kd, &nk) && fuzz_mul(N * S, vd, &nv) &&
          fuzz_mul(N * (a.average_attn_weights ? 1 : H) * L, S2, &nw)))
        return;
    int64_t work; /* the projections' and the attention's multiply-adds, about */
    if (nq + nk + nv + (a.need_weights ? nw : 0) > (1 << 16) || !fuzz_mul(N * (L + 2 * S2), E, &work) ||
        !fuzz_mul(work, E + S2, &work) || work > SMALL_WORK)
        return;
    const int64_t nx = nq > nk ? (nq > nv ? nq : nv) : (nk > nv ? nk : nv);
    float *x = env_buf(e, (size_t)nx * 4);
    fill_floats(e, x, nx, pick_amp(e));
    void *q = env_buf(e, (size_t)nq * 2), *k = self ? q : env_buf(e, (size_t)nk * 2), *v = self ? q : env_buf(e, (size_t)nv * 2);
    FUZZ_CHECK(attn_convert(rc->dtype, q, ATTN_DTYPE_F32, x, nq) == ATTN_OK, "convert query");
    if (!self) {
        FUZZ_CHECK(attn_convert(rc->dtype, k, ATTN_DTYPE_F32, x, nk) == ATTN_OK, "convert key");
        FUZZ_CHECK(attn_convert(rc->dtype, v, ATTN_DTYPE_F32, x, nv) == ATTN_OK, "convert value");
    }
    a.query = q;
    a.key = self ? NULL : k;
    a.value = self ? NULL : v;
    void *o = env_buf(e, (size_t)nq * 2), *w = a.need_weights ? env_buf(e, (size_t)nw * 2) : NULL;
    attn_ctx *ctx = env_ctx(e);
    if (ctx == NULL) return;
    const judge j = {J_VALID, NULL};
    const attn_status st = run_mha_forward(e, &j, ctx, m, &a, o, w, "attn_mha_forward (half module)");
    if (st == ATTN_OK) FUZZ_CHECK(!poisoned(o, 2), "out of a half module's forward not written");
}

static void fuzz_mha(env *e) {
    fuzz_data *fd = e->fd;
    attn_mha_config cfg;
    attn_mha_config_init(&cfg, gen_size(e, 1, 12), 1);
    switch (fuzz_data_pick(fd, 3)) {
    case 0: cfg.num_heads = gen_size(e, 1, 4); break;
    default: { /* a divisor of embed_dim */
        const int64_t E = cfg.embed_dim >= 1 && cfg.embed_dim <= 64 ? cfg.embed_dim : 1;
        int64_t h = fuzz_data_i64_range(fd, 1, E);
        while (E % h != 0) h--;
        cfg.num_heads = h;
    }
    }
    cfg.kdim = fuzz_data_bool(fd) ? 0 : gen_size(e, 1, 10);
    cfg.vdim = fuzz_data_bool(fd) ? 0 : gen_size(e, 1, 10);
    cfg.bias = fuzz_data_chance(fd, 1, 4) ? gen_flag(e) : 1;
    cfg.add_bias_kv = gen_flag(e);
    cfg.add_zero_attn = gen_flag(e);
    cfg.batch_first = gen_flag(e);
    cfg.dropout = gen_dropout(e);
    const bool null_cfg = fuzz_data_chance(fd, 1, 64), null_out = fuzz_data_chance(fd, 1, 64);
    /* The parameters' type from a byte at the front (the numbers above come from the end, so inputs
     * written before it decode their numbers as they did): mostly F32, then F16, BF16 and others. */
    uint8_t type_byte = 0;
    fuzz_data_bytes(fd, &type_byte, 1);
    cfg.dtype = type_byte < 224 ? ATTN_DTYPE_F32 : type_byte < 238 ? ATTN_DTYPE_F16
                : type_byte < 252 ? ATTN_DTYPE_BF16 : (attn_dtype)(type_byte - 252 + ATTN_DTYPE_BOOL);
    attn_ctx *ctx = env_ctx(e);

    judge j = {J_VALID, NULL};
    const int64_t E = cfg.embed_dim, H = cfg.num_heads;
    if (ctx == NULL || null_cfg || null_out) bad(&j, "NULL argument");
    if (cfg.dtype != ATTN_DTYPE_F32 && cfg.dtype != ATTN_DTYPE_F16 && cfg.dtype != ATTN_DTYPE_BF16)
        bad(&j, "dtype not F32, F16 or BF16");
    if (E < 1 || H < 1)
        bad(&j, "embed_dim or num_heads < 1");
    else if (E % H != 0)
        bad(&j, "embed_dim % num_heads != 0");
    if (cfg.kdim < 0 || cfg.vdim < 0) bad(&j, "kdim or vdim < 0");
    judge_dropout(&j, cfg.dropout);
    const int64_t kd = cfg.kdim == 0 ? E : cfg.kdim, vd = cfg.vdim == 0 ? E : cfg.vdim;
    /* Parameter count: in_proj_weight (3E, E) or q/k/v_proj_weight, in_proj_bias (3E), bias_k and
     * bias_v (E each), out_proj.weight (E, E), out_proj.bias (E). */
    int64_t nparams = 0;
    bool size_ok = E >= 1 && kd >= 1 && vd >= 1;
    if (size_ok) {
        const bool packed = kd == E && vd == E;
        int64_t ee, ek, ev, e3, t = 0;
        size_ok = fuzz_mul(E, E, &ee) && fuzz_mul(E, kd, &ek) && fuzz_mul(E, vd, &ev) && fuzz_mul(E, 3, &e3);
        if (size_ok && packed) size_ok = fuzz_mul(ee, 3, &t);
        if (size_ok && !packed) size_ok = fuzz_add(ee, ek, &t) && fuzz_add(t, ev, &t);
        if (size_ok && cfg.bias != 0) size_ok = fuzz_add(t, e3, &t) && fuzz_add(t, E, &t);
        if (size_ok && cfg.add_bias_kv != 0) size_ok = fuzz_add(t, E, &t) && fuzz_add(t, E, &t);
        size_ok = size_ok && fuzz_add(t, ee, &nparams);
        if (!size_ok) bad(&j, "the parameters' size overflows");
    }
    /* Valid but large: the allocator's cap answers, any status, nothing may leak. */
    if (j.v != J_INVALID && !(size_ok && nparams <= (1 << 16))) j.v = J_UNSURE;

    attn_mha *m = (attn_mha *)(uintptr_t)1;
    arm(e);
    const attn_status st = attn_mha_create(ctx, null_cfg ? NULL : &cfg, null_out ? NULL : &m);
    disarm(e);
    expect(e, &j, ctx, st, false, "attn_mha_create");
    if (st != ATTN_OK) return;
    FUZZ_CHECK(m != NULL && m != (attn_mha *)(uintptr_t)1, "no module returned");

    /* The configuration, resolved, and the parameters under PyTorch's names. */
    const attn_mha_config *rc = attn_mha_get_config(m);
    FUZZ_CHECK(rc->embed_dim == E && rc->num_heads == H && rc->kdim == kd && rc->vdim == vd, "configuration");
    FUZZ_CHECK(rc->bias == (cfg.bias != 0) && rc->add_bias_kv == (cfg.add_bias_kv != 0) &&
                   rc->add_zero_attn == (cfg.add_zero_attn != 0) && rc->batch_first == (cfg.batch_first != 0),
               "flags not resolved to 0/1");
    const bool packed = kd == E && vd == E;
    const int want_count = (packed ? 1 : 3) + (rc->bias ? 2 : 0) + (rc->add_bias_kv ? 2 : 0) + 1;
    FUZZ_CHECK(attn_mha_param_count(m) == want_count, "%d parameters, %d expected", attn_mha_param_count(m),
               want_count);
    const bool f32 = cfg.dtype == ATTN_DTYPE_F32;
    for (int i = -1; i <= want_count; i++) {
        const char *name = NULL;
        int ndim = -1;
        int64_t shape[3];
        float *data = NULL;
        /* the float view: a half module's parameters are not floats */
        const attn_status ps = attn_mha_param_at(m, i, &name, &ndim, shape, &data);
        void *typed = NULL;
        attn_dtype dt = ATTN_DTYPE_U8;
        const attn_status ts = attn_mha_param_typed_at(m, i, NULL, NULL, NULL, &dt, &typed);
        if (i < 0 || i >= want_count) {
            FUZZ_CHECK(ps == ATTN_ERR_INVALID_ARG && ts == ATTN_ERR_INVALID_ARG, "param_at(%d)", i);
            continue;
        }
        FUZZ_CHECK(ts == ATTN_OK && dt == cfg.dtype && typed != NULL, "param_typed_at(%d)", i);
        if (f32) FUZZ_CHECK(ps == ATTN_OK && data == typed, "param_at(%d)", i);
        else {
            FUZZ_CHECK(ps == ATTN_ERR_INVALID_ARG && data == NULL, "param_at(%d) of a %s module", i,
                       attn_dtype_name(cfg.dtype));
            FUZZ_CHECK(attn_mha_param_at(m, i, &name, &ndim, shape, NULL) == ATTN_OK, "param_at(%d) without data", i);
        }
        FUZZ_CHECK(name != NULL && ndim >= 1 && ndim <= 3, "param_at(%d)", i);
        int64_t numel = 1;
        for (int dd = 0; dd < ndim; dd++) numel *= shape[dd];
        if (f32) check_finite(data, numel, name);
        else {
            float *values = malloc((size_t)numel * sizeof(float));
            FUZZ_CHECK(values != NULL, "out of memory");
            FUZZ_CHECK(attn_convert(ATTN_DTYPE_F32, values, cfg.dtype, typed, numel) == ATTN_OK, "convert %s", name);
            check_finite(values, numel, name);
            free(values);
        }
        int ndim2 = -1;
        int64_t shape2[3];
        void *typed2 = NULL;
        FUZZ_CHECK(attn_mha_param_typed(m, name, &ndim2, shape2, &dt, &typed2) == ATTN_OK && typed2 == typed &&
                       ndim2 == ndim && memcmp(shape2, shape, (size_t)ndim * sizeof shape[0]) == 0,
                   "attn_mha_param_typed(%s)", name);
        float *data2 = NULL;
        const attn_status ns = attn_mha_param(m, name, &ndim2, NULL, &data2);
        FUZZ_CHECK(f32 ? ns == ATTN_OK && data2 == data : ns == ATTN_ERR_INVALID_ARG, "attn_mha_param(%s)", name);
    }
    FUZZ_CHECK(attn_mha_param(m, "no_such_parameter", NULL, NULL, NULL) == ATTN_ERR_NOT_FOUND, "unknown name found");
    FUZZ_CHECK(attn_mha_param_typed(m, "no_such_parameter", NULL, NULL, NULL, NULL) == ATTN_ERR_NOT_FOUND,
               "unknown name found (typed)");
    FUZZ_CHECK(attn_mha_weights_len_kv(m, 5) == 5 + rc->add_bias_kv + rc->add_zero_attn, "weights_len_kv");
    if (!f32) { /* the forwards below build float inputs (half modules: tests/test_mha_lowp.c) */
        if (fuzz_data_chance(fd, 1, 2)) {
            mha_half_forward_once(e, m, rc);
            env_release(e);
        }
        if (fuzz_data_chance(fd, 1, 3)) {
            mha_cached_once(e, m, rc);
            env_release(e);
        }
        attn_mha_free(m);
        return;
    }

    const int passes = 1 + (int)fuzz_data_pick(fd, 3);
    for (int p = 0; p < passes; p++) {
        mha_forward_once(e, m, rc);
        env_release(e);
    }
    if (fuzz_data_chance(fd, 1, 3)) {
        mha_cached_once(e, m, rc);
        env_release(e);
    }
    attn_mha_free(m);
}

/* ============================================================================================ */
/* The book's modules                                                                           */
/* ============================================================================================ */

static void check_transfer(env *e, attn_book *m) {
    /* A second module of kind v1 or v2, and the transfer in some direction. */
    fuzz_data *fd = e->fd;
    const int64_t din = gen_size(e, 1, 6), dout = gen_size(e, 1, 6);
    const bool v2 = fuzz_data_bool(fd);
    const int bias = fuzz_data_chance(fd, 1, 4);
    attn_book *o = NULL;
    const attn_status cs = v2 ? attn_book_self_attention_v2(e->ctx, din, dout, bias, &o)
                              : attn_book_self_attention_v1(e->ctx, din, dout, &o);
    if (cs != ATTN_OK) return;
    const bool m_is_src = fuzz_data_bool(fd);
    attn_book *src = m_is_src ? m : o, *dst = m_is_src ? o : m;
    if (fuzz_data_chance(fd, 1, 16)) src = NULL;
    if (fuzz_data_chance(fd, 1, 16)) dst = NULL;
    judge j = {J_VALID, NULL};
    if (src == NULL || dst == NULL)
        bad(&j, "NULL module");
    else if (attn_book_get_kind(src) != ATTN_BOOK_SELF_ATTENTION_V2 ||
             attn_book_get_kind(dst) != ATTN_BOOK_SELF_ATTENTION_V1)
        bad(&j, "not v2 -> v1");
    int64_t shape_s[2] = {0, 0}, shape_d[2] = {0, 0};
    float *ws = NULL, *wd = NULL;
    if (j.v == J_VALID) {
        attn_book_param(src, "W_query.weight", NULL, shape_s, &ws);
        attn_book_param(dst, "W_query", NULL, shape_d, &wd);
        if (shape_s[0] != shape_d[1] || shape_s[1] != shape_d[0]) bad(&j, "sizes differ");
        if (attn_book_param(src, "W_query.bias", NULL, NULL, NULL) == ATTN_OK) bad(&j, "v2 has a qkv bias");
    }
    const attn_status st = attn_book_transfer_v2_to_v1(src, dst);
    FUZZ_CHECK(fuzz_status_known(st), "transfer status");
    if (j.v == J_INVALID) {
        FUZZ_CHECK(st != ATTN_OK, "attn_book_transfer_v2_to_v1 accepted an invalid call (%s)", j.why);
    } else {
        FUZZ_CHECK(st == ATTN_OK, "attn_book_transfer_v2_to_v1: %s", attn_strerror(st));
        static const char *const names[3][2] = {
            {"W_query.weight", "W_query"}, {"W_key.weight", "W_key"}, {"W_value.weight", "W_value"}};
        for (int p = 0; p < 3; p++) {
            FUZZ_CHECK(attn_book_param(src, names[p][0], NULL, shape_s, &ws) == ATTN_OK, "v2 %s", names[p][0]);
            FUZZ_CHECK(attn_book_param(dst, names[p][1], NULL, shape_d, &wd) == ATTN_OK, "v1 %s", names[p][1]);
            for (int64_t r = 0; r < shape_d[0]; r++)
                for (int64_t c = 0; c < shape_d[1]; c++)
                    FUZZ_CHECK(wd[r * shape_d[1] + c] == ws[c * shape_s[1] + r], "%s not transposed", names[p][1]);
        }
    }
    attn_book_free(o);
}

static void fuzz_book(env *e) {
    fuzz_data *fd = e->fd;
    const attn_book_kind kind = (attn_book_kind)(1 + fuzz_data_pick(fd, 5));
    const int64_t din = gen_size(e, 1, 8), ctx_len = gen_size(e, 1, 8);
    int64_t dout = gen_size(e, 1, 8), heads = gen_size(e, 1, 3);
    if (kind == ATTN_BOOK_MHA && fuzz_data_chance(fd, 3, 4) && heads >= 1 && heads <= 8 && dout >= 1 && dout <= 8)
        dout = heads * (1 + (int64_t)fuzz_data_pick(fd, 3));
    const double dropout = gen_dropout(e);
    const int qkv_bias = fuzz_data_chance(fd, 1, 3) ? gen_flag(e) : 0;
    const bool null_out = fuzz_data_chance(fd, 1, 64);
    attn_ctx *ctx = env_ctx(e);

    judge j = {J_VALID, NULL};
    if (ctx == NULL || null_out) bad(&j, "NULL argument");
    if (din < 1 || dout < 1) bad(&j, "d_in or d_out < 1");
    const bool causal = kind == ATTN_BOOK_CAUSAL_ATTENTION || kind == ATTN_BOOK_MHA_WRAPPER || kind == ATTN_BOOK_MHA;
    if (causal) {
        if (ctx_len < 1) bad(&j, "context_length < 1");
        judge_dropout(&j, dropout);
    }
    const bool multi = kind == ATTN_BOOK_MHA_WRAPPER || kind == ATTN_BOOK_MHA;
    if (multi && heads < 1) bad(&j, "num_heads < 1");
    if (kind == ATTN_BOOK_MHA && heads >= 1 && dout >= 1 && dout % heads != 0) bad(&j, "d_out % num_heads != 0");
    const int64_t groups = kind == ATTN_BOOK_MHA_WRAPPER ? heads : 1;
    const bool linear = kind != ATTN_BOOK_SELF_ATTENTION_V1, has_bias = linear && qkv_bias != 0;
    /* Parameter count: three (d_in, d_out) projections per group (plus their biases), and the
     * weight-split module's out_proj (d_out, d_out) + (d_out). */
    int64_t nparams = 0, outf = dout;
    bool size_ok = din >= 1 && dout >= 1 && (!multi || heads >= 1);
    if (size_ok) {
        int64_t per, t;
        size_ok = fuzz_mul(din, dout, &per) && fuzz_add(per, has_bias ? dout : 0, &per) && fuzz_mul(per, 3, &t) &&
                  fuzz_mul(t, groups, &nparams);
        if (size_ok && kind == ATTN_BOOK_MHA)
            size_ok = fuzz_mul(dout, dout, &t) && fuzz_add(nparams, t, &nparams) && fuzz_add(nparams, dout, &nparams);
        if (size_ok && kind == ATTN_BOOK_MHA_WRAPPER) size_ok = fuzz_mul(heads, dout, &outf);
        if (!size_ok) bad(&j, "the parameters' size overflows");
    }
    if (j.v != J_INVALID && !(size_ok && nparams <= (1 << 16))) j.v = J_UNSURE;

    attn_book *m = NULL;
    attn_book **mp = null_out ? NULL : &m;
    arm(e);
    attn_status st;
    switch (kind) {
    case ATTN_BOOK_SELF_ATTENTION_V1: st = attn_book_self_attention_v1(ctx, din, dout, mp); break;
    case ATTN_BOOK_SELF_ATTENTION_V2: st = attn_book_self_attention_v2(ctx, din, dout, qkv_bias, mp); break;
    case ATTN_BOOK_CAUSAL_ATTENTION:
        st = attn_book_causal_attention(ctx, din, dout, ctx_len, dropout, qkv_bias, mp);
        break;
    case ATTN_BOOK_MHA_WRAPPER:
        st = attn_book_mha_wrapper(ctx, din, dout, ctx_len, dropout, heads, qkv_bias, mp);
        break;
    default: st = attn_book_mha(ctx, din, dout, ctx_len, dropout, heads, qkv_bias, mp); break;
    }
    disarm(e);
    expect(e, &j, ctx, st, false, "attn_book constructor");
    if (st != ATTN_OK) return;
    FUZZ_CHECK(m != NULL && attn_book_get_kind(m) == kind, "kind");
    FUZZ_CHECK(attn_book_out_features(m) == outf, "out_features %lld", (long long)attn_book_out_features(m));
    const int want_count = (int)groups * 3 * (has_bias ? 2 : 1) + (kind == ATTN_BOOK_MHA ? 2 : 0);
    FUZZ_CHECK(attn_book_param_count(m) == want_count, "%d parameters, %d expected", attn_book_param_count(m),
               want_count);
    for (int i = 0; i < want_count; i++) {
        const char *name = NULL;
        float *data = NULL, *data2 = NULL;
        int ndim = 0;
        int64_t shape[2] = {0, 0};
        FUZZ_CHECK(attn_book_param_at(m, i, &name, &ndim, shape, &data) == ATTN_OK && name != NULL, "param_at(%d)", i);
        FUZZ_CHECK(attn_book_param(m, name, NULL, NULL, &data2) == ATTN_OK && data2 == data, "param(%s)", name);
        check_finite(data, ndim == 1 ? shape[0] : shape[0] * shape[1], name);
    }
    FUZZ_CHECK(attn_book_param_at(m, want_count, NULL, NULL, NULL, NULL) == ATTN_ERR_INVALID_ARG, "param_at(count)");

    /* Forward passes. */
    const int passes = 1 + (int)fuzz_data_pick(fd, 2);
    for (int p = 0; p < passes; p++) {
        const int64_t batch = gen_size(e, 1, 3), n = gen_size(e, 1, 9);
        const int training = fuzz_data_chance(fd, 1, 3) ? gen_flag(e) : 0;
        const bool null_x = fuzz_data_chance(fd, 1, 48), null_o = fuzz_data_chance(fd, 1, 48);
        const bool null_m = fuzz_data_chance(fd, 1, 64), want_w = fuzz_data_bool(fd);
        attn_ctx *fctx = env_ctx(e);
        judge jf = {J_VALID, NULL};
        if (fctx == NULL || null_m || null_x || null_o) bad(&jf, "NULL argument");
        if (batch < 1 || n < 1) bad(&jf, "batch or n_tokens < 1");
        if (causal && n > ctx_len) bad(&jf, "n_tokens > context_length");
        const int64_t hw = multi ? heads : 1;
        int64_t nx = 0, no = 0, nw = 0, work = INT64_MAX;
        bool counts_ok = batch >= 1 && n >= 1;
        if (counts_ok) {
            const int64_t dx[3] = {batch, n, din}, dov[3] = {batch, n, outf}, dw[4] = {batch, hw, n, n};
            int64_t t;
            counts_ok = fuzz_prod(3, dx, &nx) && fuzz_prod(3, dov, &no) && (!want_w || fuzz_prod(4, dw, &nw)) &&
                        fuzz_mul(nx, 4, &t) && fuzz_mul(no, 4, &t) && fuzz_mul(nw, 4, &t);
            if (!counts_ok) bad(&jf, "a buffer size overflows");
            int64_t f1, f2; /* per token and group: (3 d_in + n + 1) x (2 d_out + 1) */
            if (!(counts_ok && fuzz_mul(din, 3, &f1) && fuzz_add(f1, n, &f1) && fuzz_add(f1, 1, &f1) &&
                  fuzz_mul(dout, 2, &f2) && fuzz_add(f2, 1, &f2))) {
                work = INT64_MAX;
            } else {
                const int64_t dwork[5] = {batch, n, groups, f1, f2};
                if (!fuzz_prod(5, dwork, &work)) work = INT64_MAX;
            }
        }
        if (training != 0 && dropout == 1.0) doubt(&jf, "training with dropout 1");
        float *x, *o, *w;
        attn_status fs;
        if (jf.v == J_INVALID) {
            x = dummy(e, null_x), o = dummy(e, null_o), w = dummy(e, !want_w);
            arm(e);
            fs = attn_book_forward(fctx, null_m ? NULL : m, x, batch, n, training, o, w);
            disarm(e);
            expect(e, &jf, fctx, fs, false, "attn_book_forward");
            if (is_argument_error(fs) || fs == ATTN_ERR_CONTEXT_LENGTH) {
                check_untouched(o, "out");
                check_untouched(w, "weights");
            }
        } else if (counts_ok && work <= SMALL_WORK && nx + no + nw <= SMALL_BYTES / 4) {
            x = env_buf(e, (size_t)nx * 4), o = env_buf(e, (size_t)no * 4),
            w = want_w ? env_buf(e, (size_t)nw * 4) : NULL;
            const bool tame = fill_floats(e, x, nx, pick_amp(e));
            const size_t ws = maybe_workspace(e, fctx, 0, false);
            arm(e);
            fs = attn_book_forward(fctx, m, x, batch, n, training, o, w);
            disarm(e);
            expect(e, &jf, fctx, fs, ws != SIZE_MAX, "attn_book_forward");
            drop_workspace(fctx, ws);
            if (fs == ATTN_OK && jf.v == J_VALID && tame) {
                check_finite(o, no, "out");
                const bool sums = training == 0 || dropout == 0.0;
                for (int64_t r = 0; w != NULL && r < batch * hw * n; r++) check_weight_row(w + r * n, n, 1.0, sums);
            }
        }
        env_release(e);
    }
    if (kind == ATTN_BOOK_SELF_ATTENTION_V1 || kind == ATTN_BOOK_SELF_ATTENTION_V2) check_transfer(e, m);
    attn_book_free(m);
}

/* ============================================================================================ */
/* attn_simple_self_attention and attn_linear                                                   */
/* ============================================================================================ */

static void fuzz_simple(env *e) {
    fuzz_data *fd = e->fd;
    const int64_t n = gen_size(e, 1, 8), dd = gen_size(e, 1, 8);
    const attn_simple_norm norm = fuzz_data_chance(fd, 1, 24) ? (attn_simple_norm)fuzz_data_int_range(fd, -2, 5)
                                                              : (attn_simple_norm)fuzz_data_pick(fd, 2);
    const bool null_x = fuzz_data_chance(fd, 1, 32);
    const bool want_s = fuzz_data_bool(fd), want_w = fuzz_data_bool(fd), want_c = fuzz_data_bool(fd);
    attn_ctx *ctx = env_ctx(e);
    judge j = {J_VALID, NULL};
    if (ctx == NULL || null_x) bad(&j, "ctx or x is NULL");
    if (n < 1 || dd < 1) bad(&j, "n or d < 1");
    if (norm != ATTN_SIMPLE_SOFTMAX && norm != ATTN_SIMPLE_SUM) bad(&j, "unknown normalisation");
    int64_t nn = 0, nd = 0, t, work = INT64_MAX;
    const bool counts_ok =
        n >= 1 && dd >= 1 && fuzz_mul(n, n, &nn) && fuzz_mul(n, dd, &nd) && fuzz_mul(nn, 4, &t) && fuzz_mul(nd, 4, &t);
    if (n >= 1 && dd >= 1 && !counts_ok) bad(&j, "n*n or n*d overflows");
    if (counts_ok && !fuzz_mul(nn, 3 * dd, &work)) work = INT64_MAX;
    attn_status st;
    if (j.v == J_INVALID) {
        float *x = dummy(e, null_x), *s = dummy(e, !want_s), *w = dummy(e, !want_w), *c = dummy(e, !want_c);
        arm(e);
        st = attn_simple_self_attention(ctx, x, n, dd, norm, s, w, c);
        disarm(e);
        expect(e, &j, ctx, st, false, "attn_simple_self_attention");
        if (is_argument_error(st)) {
            check_untouched(s, "scores");
            check_untouched(w, "weights");
            check_untouched(c, "context");
        }
        return;
    }
    if (!(counts_ok && work <= SMALL_WORK && 2 * nn + 2 * nd <= SMALL_BYTES / 4)) return;
    float *x = env_buf(e, (size_t)nd * 4);
    float *s = want_s ? env_buf(e, (size_t)nn * 4) : NULL, *w = want_w ? env_buf(e, (size_t)nn * 4) : NULL;
    float *c = want_c ? env_buf(e, (size_t)nd * 4) : NULL;
    const bool tame = fill_floats(e, x, nd, pick_amp(e));
    const size_t ws = maybe_workspace(e, ctx, 0, false);
    arm(e);
    st = attn_simple_self_attention(ctx, x, n, dd, norm, s, w, c);
    disarm(e);
    expect(e, &j, ctx, st, ws != SIZE_MAX, "attn_simple_self_attention");
    drop_workspace(ctx, ws);
    if (st != ATTN_OK || !tame) return;
    if (s != NULL) check_finite(s, nn, "scores");
    if (norm == ATTN_SIMPLE_SOFTMAX) { /* the naive normalisation may divide by zero */
        if (c != NULL) check_finite(c, nd, "context");
        for (int64_t r = 0; w != NULL && r < n; r++) check_weight_row(w + r * n, n, 1.0, true);
    }
}

static void fuzz_linear(env *e) {
    fuzz_data *fd = e->fd;
    const int64_t rows = gen_size(e, 1, 6), in = gen_size(e, 1, 8), out = gen_size(e, 1, 8);
    const attn_weight_layout layout = fuzz_data_chance(fd, 1, 24) ? (attn_weight_layout)fuzz_data_int_range(fd, -2, 5)
                                                                  : (attn_weight_layout)fuzz_data_pick(fd, 2);
    const bool null_x = fuzz_data_chance(fd, 1, 32), null_w = fuzz_data_chance(fd, 1, 32);
    const bool null_y = fuzz_data_chance(fd, 1, 32), want_b = fuzz_data_bool(fd);
    attn_ctx *ctx = env_ctx(e);
    judge j = {J_VALID, NULL};
    if (ctx == NULL || null_x || null_w || null_y) bad(&j, "NULL argument");
    if (layout != ATTN_WEIGHT_OUT_IN && layout != ATTN_WEIGHT_IN_OUT) bad(&j, "unknown layout");
    if (rows < 1 || in < 1 || out < 1) bad(&j, "a size < 1");
    int64_t nx = 0, nw = 0, ny = 0, t, work = INT64_MAX;
    const bool counts_ok = rows >= 1 && in >= 1 && out >= 1 && fuzz_mul(rows, in, &nx) && fuzz_mul(in, out, &nw) &&
                           fuzz_mul(rows, out, &ny) && fuzz_mul(nx, 4, &t) && fuzz_mul(nw, 4, &t) &&
                           fuzz_mul(ny, 4, &t);
    if (rows >= 1 && in >= 1 && out >= 1 && !counts_ok) bad(&j, "a buffer size overflows");
    if (counts_ok && !fuzz_mul(ny, in, &work)) work = INT64_MAX;
    attn_status st;
    if (j.v == J_INVALID) {
        float *x = dummy(e, null_x), *w = dummy(e, null_w), *b = dummy(e, !want_b), *y = dummy(e, null_y);
        arm(e);
        st = attn_linear(ctx, x, rows, in, w, layout, b, out, y);
        disarm(e);
        expect(e, &j, ctx, st, false, "attn_linear");
        if (is_argument_error(st)) check_untouched(y, "y");
        return;
    }
    if (!(counts_ok && work <= SMALL_WORK && nx + nw + ny + out <= SMALL_BYTES / 4)) return;
    float *x = env_buf(e, (size_t)nx * 4), *w = env_buf(e, (size_t)nw * 4), *y = env_buf(e, (size_t)ny * 4);
    float *b = want_b ? env_buf(e, (size_t)out * 4) : NULL;
    const float amp = pick_amp(e);
    bool tame = fill_floats(e, x, nx, amp);
    tame = fill_floats(e, w, nw, amp) && tame;
    if (b != NULL) tame = fill_floats(e, b, out, amp) && tame;
    arm(e);
    st = attn_linear(ctx, x, rows, in, w, layout, b, out, y);
    disarm(e);
    expect(e, &j, ctx, st, false, "attn_linear");
    if (st != ATTN_OK || !tame) return;
    /* y agrees with a double-precision product within float rounding of the terms' magnitudes. */
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t o = 0; o < out; o++) {
            double acc = b != NULL ? b[o] : 0.0, mag = b != NULL ? fabs(b[o]) : 0.0;
            for (int64_t i = 0; i < in; i++) {
                const double wv = layout == ATTN_WEIGHT_OUT_IN ? w[o * in + i] : w[i * out + o];
                acc += (double)x[r * in + i] * wv;
                mag += fabs((double)x[r * in + i] * wv);
            }
            const double got = y[r * out + o];
            FUZZ_CHECK(fabs(got - acc) <= (double)(in + 2) * 1.2e-7 * mag + 1e-30, "y[%lld,%lld] = %.9g, expected %.9g",
                       (long long)r, (long long)o, got, acc);
        }
    }
}

/* ============================================================================================ */
/* The generator and the initialisers                                                           */
/* ============================================================================================ */

/* ============================================================================================ */
/* Packed batches                                                                               */
/* ============================================================================================ */

/*
 * attn_sdpa_varlen_fwd and, after a valid one, attn_sdpa_varlen_bwd: up to 3 sequences of drawn
 * lengths (0 to 4) packed end to end, their offsets now and then broken (not from 0, decreasing,
 * edge values, values whose differences overflow, NULL), len_q and len_kv at, above or below the longest sequence, q, k, v and out
 * token-major or head-major with any value in the unused stride[0], the options a packed batch
 * takes (and now and then a mask or weights, which it does not). Judged from attn.h: offsets from
 * 0 increasing, no sequence past the bounds, no mask, no weights, NULL only for lse (forward), the
 * shared descriptor's rules; no query or no key in the whole batch is not settled. A refused call
 * leaves out, lse and the gradients whole; accepted calls on tame inputs give finite results and a
 * sequence without keys zero rows.
 */
static void fuzz_varlen(env *e) {
    fuzz_data *fd = e->fd;
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    const int64_t B = 1 + (int64_t)fuzz_data_pick(fd, 3);
    d.batch = fuzz_data_chance(fd, 1, 32) ? fuzz_data_int_range(fd, -1, 0) : B; /* never past the arrays' B + 1 */
    d.n_heads = 1 + (int64_t)fuzz_data_pick(fd, 4);
    d.n_kv_heads = fuzz_data_bool(fd) ? 0 : fuzz_data_chance(fd, 1, 8) ? 3 : 1;
    d.head_dim = 1 + (int64_t)fuzz_data_pick(fd, 8);
    d.head_dim_v = fuzz_data_bool(fd) ? 0 : 1 + (int64_t)fuzz_data_pick(fd, 8);
    int64_t cq[4] = {0}, ck[4] = {0}, lmax = 0, smax = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t lq = (int64_t)fuzz_data_pick(fd, 5), lk = (int64_t)fuzz_data_pick(fd, 5);
        cq[b + 1] = cq[b] + lq, ck[b + 1] = ck[b] + lk;
        lmax = lq > lmax ? lq : lmax, smax = lk > smax ? lk : smax;
    }
    const int64_t TQ = cq[B], TK = ck[B];
    int64_t use_q[4], use_k[4];
    memcpy(use_q, cq, sizeof cq), memcpy(use_k, ck, sizeof ck);
    bool offsets_ok = true;
    if (fuzz_data_chance(fd, 1, 6)) { /* a broken offset */
        int64_t *a = fuzz_data_bool(fd) ? use_q : use_k;
        static const int64_t far[4] = {INT64_MIN, INT64_MAX, INT64_MIN + 1, INT64_MAX - 1}; /* differences overflow */
        const int pick = (int)fuzz_data_pick(fd, 3);
        a[fuzz_data_pick(fd, (size_t)B + 1)] = pick == 0   ? far[fuzz_data_pick(fd, 4)]
                                               : pick == 1 ? fuzz_data_i64_edge(fd)
                                                           : fuzz_data_i64_range(fd, -2, 9);
        offsets_ok = use_q[0] == 0 && use_k[0] == 0;
        for (int64_t b = 0; b < B; b++) offsets_ok = offsets_ok && use_q[b + 1] >= use_q[b] && use_k[b + 1] >= use_k[b];
        /* offsets still from 0 and increasing but other than the tensors': not a call to make honestly */
        if (offsets_ok && (memcmp(use_q, cq, sizeof cq) != 0 || memcmp(use_k, ck, sizeof ck) != 0)) return;
    }
    d.len_q = fuzz_data_chance(fd, 1, 8) ? gen_size(e, 0, lmax + 1) : lmax > 0 ? lmax : 1;
    d.len_kv = fuzz_data_chance(fd, 1, 8) ? gen_size(e, 0, smax + 1) : smax > 0 ? smax : 1;
    d.causal = fuzz_data_chance(fd, 1, 16) ? (attn_causal)fuzz_data_int_range(fd, -1, 4) : (attn_causal)fuzz_data_pick(fd, 3);
    d.scale = fuzz_data_chance(fd, 1, 4) ? fuzz_data_float_range(fd, -2.0f, 2.0f) : 0.0f;
    if (fuzz_data_chance(fd, 1, 4)) {
        d.dropout_p = fuzz_data_unit(fd) * 0.9;
        if (fuzz_data_bool(fd)) d.dropout_rng = ATTN_DROPOUT_RNG_PHILOX, d.dropout_seed = fuzz_data_u64(fd);
    }
    const bool with_mask = fuzz_data_chance(fd, 1, 16), with_weights = fuzz_data_chance(fd, 1, 16);
    if (with_weights) d.weights_mode = ATTN_WEIGHTS_PER_HEAD;
    const int64_t H = d.n_heads, Hkv = d.n_kv_heads ? d.n_kv_heads : H, D = d.head_dim, Dv = d.head_dim_v ? d.head_dim_v : D;
    const bool token_major = fuzz_data_bool(fd);
    const int64_t junk = fuzz_data_chance(fd, 1, 2) ? fuzz_data_i64_edge(fd) : 0; /* stride[0]: not used */
    const int64_t tq = TQ > 0 ? TQ : 1, tk = TK > 0 ? TK : 1;
    const int64_t sq[4] = {junk, token_major ? D : tq * D, token_major ? H * D : D, 1};
    const int64_t sk[4] = {junk, token_major ? D : tk * D, token_major ? Hkv * D : D, 1};
    const int64_t sv[4] = {junk, token_major ? Dv : tk * Dv, token_major ? Hkv * Dv : Dv, 1};
    const int64_t so[4] = {junk, token_major ? Dv : tq * Dv, token_major ? H * Dv : Dv, 1};
    memcpy(d.q_stride, sq, sizeof sq), memcpy(d.k_stride, sk, sizeof sk), memcpy(d.v_stride, sv, sizeof sv);
    memcpy(d.o_stride, so, sizeof so);
    const bool null_cu = fuzz_data_chance(fd, 1, 32), null_q = fuzz_data_chance(fd, 1, 40), null_o = fuzz_data_chance(fd, 1, 40);
    const bool want_lse = fuzz_data_chance(fd, 3, 4);
    attn_ctx *ctx = env_ctx(e);

    judge j = {J_VALID, NULL};
    if (ctx == NULL || null_cu || null_q || null_o) bad(&j, "NULL argument");
    if (d.batch < 1) bad(&j, "batch < 1");
    if (!offsets_ok) bad(&j, "offsets not from 0 or decreasing");
    if (offsets_ok && (lmax > d.len_q || smax > d.len_kv)) bad(&j, "a sequence past len_q or len_kv");
    if (d.len_q < 1 || d.len_kv < 1) bad(&j, "len_q or len_kv < 1");
    if (H % Hkv != 0) bad(&j, "n_heads not a multiple of n_kv_heads");
    if (d.causal != ATTN_CAUSAL_NONE && d.causal != ATTN_CAUSAL_TOP_LEFT && d.causal != ATTN_CAUSAL_BOTTOM_RIGHT) bad(&j, "causal");
    if (with_mask || with_weights) bad(&j, "a mask or weights with packed sequences");
    if (TQ == 0 || TK == 0) doubt(&j, "no query or no key in the batch");
    const float mask_dummy = 0.0f;
    if (with_mask) d.mask = &mask_dummy, d.mask_dtype = ATTN_DTYPE_F32;
    /* the batch's tensors: (1, H, TQ, D) etc. at the strides, stride[0] unused */
    const int64_t nq[4] = {1, H, tq, D}, nk[4] = {1, Hkv, tk, D}, nv[4] = {1, Hkv, tk, Dv}, no[4] = {1, H, tq, Dv};
    const span spq = view_span(4, nq, sq), spk = view_span(4, nk, sk), spv = view_span(4, nv, sv), spo = view_span(4, no, so);
    float *q = null_q ? NULL : span_buf(e, &spq, 4), *k = span_buf(e, &spk, 4), *v = span_buf(e, &spv, 4);
    float *o = null_o ? NULL : span_buf(e, &spo, 4);
    bool tame = q == NULL || fill_floats(e, q + spq.lo, span_elems(&spq), pick_amp(e));
    tame = fill_floats(e, k + spk.lo, span_elems(&spk), pick_amp(e)) && tame;
    tame = fill_floats(e, v + spv.lo, span_elems(&spv), pick_amp(e)) && tame;
    float *lse = want_lse ? env_buf(e, (size_t)(H * tq) * 4) : NULL;
    const attn_generator before = *attn_ctx_generator(e->ctx);
    arm(e);
    const attn_status st = attn_sdpa_varlen_fwd(ctx, &d, null_cu ? NULL : use_q, use_k, q, k, v, o, lse);
    disarm(e);
    expect(e, &j, ctx, st, false, "attn_sdpa_varlen_fwd");
    if (is_argument_error(st) || st == ATTN_ERR_UNSUPPORTED) {
        FUZZ_CHECK(o == NULL || untouched_span(o, &spo, 4), "out written by a refused packed call");
        FUZZ_CHECK(poisoned(lse, H * tq * 4), "lse written by a refused packed call");
    }
    if (st != ATTN_OK || j.v != J_VALID) return;
    if (tame && fabsf(d.scale) <= TAME_VALUE)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = cq[b]; i < cq[b + 1]; i++)
                    for (int64_t t = 0; t < Dv; t++) {
                        const float x = o[off4(so, 0, h, i, t)];
                        FUZZ_CHECK(isfinite(x), "packed out = %g", (double)x);
                        FUZZ_CHECK(ck[b + 1] > ck[b] || x == 0.0f, "a sequence without keys gave out = %g", (double)x);
                    }
    if (lse == NULL) return;

    /* the backward with the same arguments */
    const bool null_dout = fuzz_data_chance(fd, 1, 32), null_grad = fuzz_data_chance(fd, 1, 32);
    const bool needs_state = d.dropout_p > 0.0 && d.dropout_rng != ATTN_DROPOUT_RNG_PHILOX;
    const bool give_state = needs_state ? !fuzz_data_chance(fd, 1, 16) : fuzz_data_bool(fd);
    judge jb = {J_VALID, NULL};
    if (null_dout || null_grad) bad(&jb, "dout or a gradient is NULL");
    if (needs_state && !give_state) bad(&jb, "dropout without the forward's generator state");
    float *dout = null_dout ? NULL : span_buf(e, &spo, 4);
    const bool tame_dout = dout == NULL || fill_floats(e, dout + spo.lo, span_elems(&spo), 1.0f);
    float *dq = null_grad ? NULL : span_buf(e, &spq, 4), *dk = span_buf(e, &spk, 4), *dv = span_buf(e, &spv, 4);
    arm(e);
    const attn_status bs = attn_sdpa_varlen_bwd(ctx, &d, use_q, use_k, q, k, v, o, dout, lse, give_state ? &before : NULL, dq, dk, dv);
    disarm(e);
    expect(e, &jb, ctx, bs, false, "attn_sdpa_varlen_bwd");
    if (is_argument_error(bs)) {
        FUZZ_CHECK((dq == NULL || untouched_span(dq, &spq, 4)) && untouched_span(dk, &spk, 4) && untouched_span(dv, &spv, 4),
                   "gradients written by a refused packed backward");
    }
    if (bs != ATTN_OK || jb.v != J_VALID || !tame || !tame_dout || fabsf(d.scale) > TAME_VALUE) return;
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < TQ; i++)
            for (int64_t t = 0; t < D; t++) FUZZ_CHECK(isfinite(dq[off4(sq, 0, h, i, t)]), "packed dq not finite");
    for (int64_t h = 0; h < Hkv; h++)
        for (int64_t i = 0; i < TK; i++) {
            for (int64_t t = 0; t < D; t++) FUZZ_CHECK(isfinite(dk[off4(sk, 0, h, i, t)]), "packed dk not finite");
            for (int64_t t = 0; t < Dv; t++) FUZZ_CHECK(isfinite(dv[off4(sv, 0, h, i, t)]), "packed dv not finite");
        }
}

/* ============================================================================================ */
/* KV caches                                                                                    */
/* ============================================================================================ */

/* One append to a cache of length len: n drawn (negative, 0, within or past the room), k and v of
 * (B, Hkv, n, D|Dv) at NULL (contiguous) or drawn strides, or NULL. Judged from attn.h: n < 0, NULL
 * k or v for n >= 1 and a view whose offsets overflow fail, n past the room with
 * ATTN_ERR_CAPACITY; negative strides, and NULL k or v for n = 0, are not settled. A refused call
 * changes neither the length nor a byte of the storage; an accepted one adds n to the length and
 * leaves the filled positions' bytes as they were. Returns whether the values it appended (if any)
 * were tame. */
static bool kv_append_once(env *e, attn_ctx *ctx, attn_kv_cache *kc, const attn_kv_cache_config *c) {
    fuzz_data *fd = e->fd;
    const int64_t len = attn_kv_cache_length(kc), room = c->capacity - len;
    const int64_t n = fuzz_data_chance(fd, 1, 8) ? gen_size(e, -2, room + 2) : fuzz_data_i64_range(fd, 0, room + 1);
    const int64_t nk[4] = {c->batch, c->n_kv_heads, n, c->head_dim}, nv[4] = {c->batch, c->n_kv_heads, n, c->head_dim_v};
    int64_t ks[4] = {0, 0, c->head_dim, 1}, vs[4] = {0, 0, c->head_dim_v, 1}; /* contiguous where n fits */
    if (n >= 0 && n <= room) {
        ks[0] = c->n_kv_heads * n * c->head_dim, ks[1] = n * c->head_dim;
        vs[0] = c->n_kv_heads * n * c->head_dim_v, vs[1] = n * c->head_dim_v;
    }
    const bool own_ks = fuzz_data_chance(fd, 1, 3), own_vs = fuzz_data_chance(fd, 1, 3);
    bool plain;
    if (own_ks && n >= 1) gen_strides(e, 4, nk, 4, ks, &plain);
    if (own_vs && n >= 1) gen_strides(e, 4, nv, 4, vs, &plain);
    const bool null_k = fuzz_data_chance(fd, 1, 24), null_v = fuzz_data_chance(fd, 1, 24);
    judge j = {J_VALID, NULL};
    if (ctx == NULL) bad(&j, "ctx is NULL");
    if (n < 0) bad(&j, "n < 0");
    if (n >= 1 && (null_k || null_v)) bad(&j, "k or v is NULL");
    if (n == 0 && (null_k || null_v)) doubt(&j, "k or v NULL for n = 0");
    if (n > room) bad(&j, "n past the capacity");
    span sk = {true, false, 0, 0}, sv = sk;
    if (n >= 1) {
        sk = view_span(4, nk, ks), sv = view_span(4, nv, vs);
        if (!sk.ok || !sv.ok) bad(&j, "an offset of k or v overflows");
        if (sk.negative || sv.negative) doubt(&j, "a negative stride");
    }
    int64_t ck = 0, cv = 0;
    const bool small = n >= 1 && span_count(&sk, &ck) && span_count(&sv, &cv) && ck <= (1 << 16) && cv <= (1 << 16);
    if (j.v != J_INVALID && n >= 1 && !small) return true; /* too large to run honestly */
    float *k = NULL, *v = NULL;
    bool tame = true;
    if (!null_k) {
        k = n >= 1 && small ? span_buf(e, &sk, 4) : dummy(e, false);
        if (n >= 1 && small) tame = fill_floats(e, k + sk.lo, ck, pick_amp(e));
    }
    if (!null_v) {
        v = n >= 1 && small ? span_buf(e, &sv, 4) : dummy(e, false);
        if (n >= 1 && small) tame = fill_floats(e, v + sv.lo, cv, pick_amp(e)) && tame;
    }
    void *kst, *vst;
    attn_kv_cache_storage(kc, &kst, NULL, &vst, NULL);
    const int64_t rows = c->batch * c->n_kv_heads * c->capacity;
    const int64_t kb = kv_bytes(c->dtype, rows * c->head_dim), vb = kv_bytes(c->dtype, rows * c->head_dim_v);
    uint8_t *k0 = env_buf(e, (size_t)kb), *v0 = env_buf(e, (size_t)vb);
    memcpy(k0, kst, (size_t)kb), memcpy(v0, vst, (size_t)vb);
    arm(e);
    const attn_status st = attn_kv_cache_append(ctx, kc, n, k, own_ks ? ks : NULL, v, own_vs ? vs : NULL);
    disarm(e);
    expect(e, &j, ctx, st, false, "attn_kv_cache_append");
    if (n > room && j.v == J_INVALID && n >= 0 && !null_k && !null_v && ctx != NULL)
        FUZZ_CHECK(st == ATTN_ERR_CAPACITY || st == ATTN_ERR_OVERFLOW, "appending past the capacity: %s", attn_strerror(st));
    if (st != ATTN_OK) {
        FUZZ_CHECK(attn_kv_cache_length(kc) == len, "a refused append changed the length");
        FUZZ_CHECK(memcmp(k0, kst, (size_t)kb) == 0 && memcmp(v0, vst, (size_t)vb) == 0, "a refused append wrote the cache");
        return true;
    }
    FUZZ_CHECK(attn_kv_cache_length(kc) == len + n, "length %lld after appending %lld to %lld", (long long)attn_kv_cache_length(kc),
               (long long)n, (long long)len);
    for (int64_t r = 0; r < c->batch * c->n_kv_heads; r++) { /* the filled positions as they were */
        const int64_t ko = kv_bytes(c->dtype, r * c->capacity * c->head_dim), kl = kv_bytes(c->dtype, len * c->head_dim);
        const int64_t vo = kv_bytes(c->dtype, r * c->capacity * c->head_dim_v), vl = kv_bytes(c->dtype, len * c->head_dim_v);
        FUZZ_CHECK(memcmp(k0 + ko, (const uint8_t *)kst + ko, (size_t)kl) == 0 &&
                       memcmp(v0 + vo, (const uint8_t *)vst + vo, (size_t)vl) == 0,
                   "an append changed filled positions");
    }
    return tame;
}

/* One attend on the cache: new queries (B, H, L, D) contiguous, a descriptor drawn around the cache's
 * (batch, head dims, causal mode, dropout, weights_mode, a head count that divides or not). Judged
 * from attn.h: the cache's batch, head_dim and head_dim_v (0 or Dv), causal NONE or BOTTOM_RIGHT,
 * no dropout, no weights, n_heads a multiple of the cache's kv heads, the shared descriptor's rules;
 * an empty cache is not settled. A refused call leaves out and lse as they were; an accepted one on
 * tame queries and a cache filled from tame values gives finite outputs. */
static void kv_attend_once(env *e, attn_ctx *ctx, const attn_kv_cache *kc, const attn_kv_cache_config *c, bool tame_cache) {
    fuzz_data *fd = e->fd;
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = fuzz_data_chance(fd, 1, 12) ? gen_size(e, 1, 4) : c->batch;
    d.n_heads = fuzz_data_chance(fd, 1, 12) ? gen_size(e, 1, 7) : c->n_kv_heads * (1 + (int64_t)fuzz_data_pick(fd, 3));
    d.len_q = gen_size(e, 1, 3);
    d.head_dim = fuzz_data_chance(fd, 1, 12) ? gen_size(e, 1, 8) : c->head_dim;
    d.head_dim_v = fuzz_data_chance(fd, 1, 12) ? gen_size(e, 1, 8) : fuzz_data_bool(fd) ? 0 : c->head_dim_v;
    d.causal = fuzz_data_chance(fd, 1, 8) ? (attn_causal)fuzz_data_int_range(fd, -1, 3)
                                          : fuzz_data_bool(fd) ? ATTN_CAUSAL_BOTTOM_RIGHT : ATTN_CAUSAL_NONE;
    if (fuzz_data_chance(fd, 1, 12)) d.dropout_p = fuzz_data_unit(fd) * 0.5;
    if (fuzz_data_chance(fd, 1, 12)) d.weights_mode = ATTN_WEIGHTS_PER_HEAD;
    d.scale = fuzz_data_chance(fd, 1, 4) ? fuzz_data_float_range(fd, -2.0f, 2.0f) : 0.0f;
    const bool want_lse = fuzz_data_bool(fd), null_q = fuzz_data_chance(fd, 1, 32), null_o = fuzz_data_chance(fd, 1, 32);
    const int64_t B = d.batch, H = d.n_heads, L = d.len_q, D = d.head_dim, Dv = d.head_dim_v ? d.head_dim_v : D;
    judge j = {J_VALID, NULL};
    if (ctx == NULL) bad(&j, "ctx is NULL");
    if (null_q || null_o) bad(&j, "q or out is NULL");
    if (B < 1 || H < 1 || L < 1 || D < 1 || Dv < 1) bad(&j, "a size < 1");
    if (B != c->batch || D != c->head_dim || (d.head_dim_v != 0 && d.head_dim_v != c->head_dim_v))
        bad(&j, "batch or head dims other than the cache's");
    if (d.causal != ATTN_CAUSAL_NONE && d.causal != ATTN_CAUSAL_BOTTOM_RIGHT) bad(&j, "causal not NONE or BOTTOM_RIGHT");
    if (d.dropout_p != 0.0 || d.weights_mode != ATTN_WEIGHTS_NONE) bad(&j, "dropout or weights with a cache");
    if (H >= 1 && H % c->n_kv_heads != 0) bad(&j, "n_heads not a multiple of the cache's kv heads");
    if (attn_kv_cache_length(kc) == 0) doubt(&j, "an empty cache");
    int64_t nq = 0, no = 0, nl = 0;
    const int64_t dq[4] = {B, H, L, D}, dout[4] = {B, H, L, c->head_dim_v}, dl[3] = {B, H, L};
    const bool small = B >= 1 && H >= 1 && L >= 1 && D >= 1 && fuzz_prod(4, dq, &nq) && fuzz_prod(4, dout, &no) &&
                       fuzz_prod(3, dl, &nl) && nq <= (1 << 16) && no <= (1 << 16);
    if (!small && j.v != J_INVALID) return;
    if (small) { /* contiguous q and out (the sizes' products fit) */
        const int64_t qs[4] = {H * L * D, L * D, D, 1}, os[4] = {H * L * c->head_dim_v, L * c->head_dim_v, c->head_dim_v, 1};
        memcpy(d.q_stride, qs, sizeof qs), memcpy(d.o_stride, os, sizeof os);
    }
    float *q = null_q ? NULL : small ? env_buf(e, (size_t)nq * 4) : dummy(e, false);
    const bool tame = q == NULL || !small || fill_floats(e, q, nq, pick_amp(e));
    float *o = null_o ? NULL : small ? env_buf(e, (size_t)no * 4) : dummy(e, false);
    float *lse = want_lse ? (small ? env_buf(e, (size_t)nl * 4) : dummy(e, false)) : NULL;
    const size_t ws = maybe_workspace(e, ctx, 0, false);
    arm(e);
    const attn_status st = attn_kv_cache_attend(ctx, kc, &d, q, o, lse);
    disarm(e);
    expect(e, &j, ctx, st, ws != SIZE_MAX, "attn_kv_cache_attend");
    drop_workspace(ctx, ws);
    if (is_argument_error(st)) {
        FUZZ_CHECK(poisoned(o, small ? no * 4 : (int64_t)DUMMY_BYTES), "out written by a rejected attend");
        FUZZ_CHECK(poisoned(lse, small ? nl * 4 : (int64_t)DUMMY_BYTES), "lse written by a rejected attend");
    }
    if (st != ATTN_OK || j.v != J_VALID || !tame || !tame_cache || fabsf(d.scale) > TAME_VALUE) return;
    check_finite(o, no, "out");
}

/*
 * attn_kv_cache_create on a drawn configuration (sizes in and out of range, every type and values
 * outside the enum, head dims that are or are not multiples of 32 for the block types), then a few
 * appends, truncations, resets and attends in any order (kv_append_once, kv_attend_once). Create
 * is judged from attn.h: sizes >= 1 (head_dim_v 0 means head_dim), a type of the five, head dims
 * multiples of 32 for Q8_0 and Q4_0, sizes whose bytes fit; the resolved configuration is kept and
 * the length starts at 0. Truncate takes 0 .. length, nothing else, and changes nothing when it
 * refuses.
 */
static void fuzz_kv_cache(env *e) {
    fuzz_data *fd = e->fd;
    attn_kv_cache_config cfg;
    attn_kv_cache_config_init(&cfg);
    static const attn_dtype types[5] = {ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16, ATTN_DTYPE_Q8_0, ATTN_DTYPE_Q4_0};
    cfg.dtype = fuzz_data_chance(fd, 1, 16) ? (attn_dtype)fuzz_data_int_range(fd, -2, 12) : types[fuzz_data_pick(fd, 5)];
    const bool blocks = cfg.dtype == ATTN_DTYPE_Q8_0 || cfg.dtype == ATTN_DTYPE_Q4_0;
    cfg.batch = gen_size(e, 1, 2);
    cfg.n_kv_heads = gen_size(e, 1, 2);
    cfg.head_dim = blocks && fuzz_data_chance(fd, 7, 8) ? 32 * (1 + (int64_t)fuzz_data_pick(fd, 2)) : gen_size(e, 1, 8);
    cfg.head_dim_v = fuzz_data_bool(fd) ? 0 : blocks && fuzz_data_chance(fd, 7, 8) ? 32 : gen_size(e, 1, 8);
    cfg.capacity = gen_size(e, 1, 6);
    const bool null_cfg = fuzz_data_chance(fd, 1, 64), null_out = fuzz_data_chance(fd, 1, 64);
    attn_ctx *ctx = env_ctx(e);
    const int64_t B = cfg.batch, Hkv = cfg.n_kv_heads, D = cfg.head_dim, Dv = cfg.head_dim_v ? cfg.head_dim_v : D,
                  cap = cfg.capacity;
    judge j = {J_VALID, NULL};
    if (ctx == NULL || null_cfg || null_out) bad(&j, "NULL argument");
    const bool sizes_ok = B >= 1 && Hkv >= 1 && D >= 1 && cfg.head_dim_v >= 0 && cap >= 1;
    if (!sizes_ok) bad(&j, "a size < 1");
    bool type_ok = false;
    for (int t = 0; t < 5; t++) type_ok = type_ok || cfg.dtype == types[t];
    if (!type_ok) bad(&j, "an unknown dtype");
    if (blocks && (D % 32 != 0 || Dv % 32 != 0)) bad(&j, "block type with head dims not multiples of 32");
    int64_t nk = 0, nv = 0, t = 0;
    const int64_t dk[4] = {B, Hkv, cap, D}, dv[4] = {B, Hkv, cap, Dv};
    const bool counts_ok = sizes_ok && fuzz_prod(4, dk, &nk) && fuzz_prod(4, dv, &nv) && fuzz_mul(nk, 4, &t) && fuzz_mul(nv, 4, &t);
    if (sizes_ok && !counts_ok) bad(&j, "the storage's size overflows");
    if (j.v != J_INVALID && !(counts_ok && nk <= (1 << 15) && nv <= (1 << 15))) j.v = J_UNSURE; /* the allocator's cap answers */
    attn_kv_cache *kc = (attn_kv_cache *)(uintptr_t)1;
    arm(e);
    const attn_status st = attn_kv_cache_create(ctx, null_cfg ? NULL : &cfg, null_out ? NULL : &kc);
    disarm(e);
    expect(e, &j, ctx, st, false, "attn_kv_cache_create");
    if (st != ATTN_OK) return;
    FUZZ_CHECK(kc != NULL && kc != (attn_kv_cache *)(uintptr_t)1, "no cache returned");
    const attn_kv_cache_config *rc = attn_kv_cache_get_config(kc);
    FUZZ_CHECK(rc->batch == B && rc->n_kv_heads == Hkv && rc->head_dim == D && rc->head_dim_v == Dv && rc->capacity == cap &&
                   rc->dtype == cfg.dtype,
               "configuration not kept (head_dim_v resolved)");
    FUZZ_CHECK(attn_kv_cache_length(kc) == 0, "a new cache holds %lld positions", (long long)attn_kv_cache_length(kc));
    const int steps = 1 + (int)fuzz_data_pick(fd, 6);
    bool tame_cache = true; /* every value appended so far tame */
    for (int s = 0; s < steps; s++) {
        attn_ctx *cctx = env_ctx(e);
        switch (fuzz_data_pick(fd, 8)) {
        case 0: { /* truncate */
            const int64_t len = attn_kv_cache_length(kc), to = fuzz_data_chance(fd, 1, 8) ? gen_size(e, -2, len + 2)
                                                                                          : fuzz_data_i64_range(fd, 0, len);
            judge jt = {J_VALID, NULL};
            if (cctx == NULL) bad(&jt, "ctx is NULL");
            if (to < 0 || to > len) bad(&jt, "length outside 0 .. length");
            const attn_status ts = attn_kv_cache_truncate(cctx, kc, to);
            expect(e, &jt, cctx, ts, false, "attn_kv_cache_truncate");
            FUZZ_CHECK(attn_kv_cache_length(kc) == (ts == ATTN_OK ? to : len), "length after truncate");
            break;
        }
        case 1:
            attn_kv_cache_reset(kc);
            FUZZ_CHECK(attn_kv_cache_length(kc) == 0, "length after reset");
            break;
        case 2:
        case 3:
        case 4: tame_cache = kv_append_once(e, cctx, kc, rc) && tame_cache; break;
        default: kv_attend_once(e, cctx, kc, rc, tame_cache); break;
        }
    }
    attn_kv_cache_free(kc);
}

static void fuzz_random(env *e) {
    fuzz_data *fd = e->fd;
    const int which = (int)fuzz_data_pick(fd, 8);
    attn_generator gen;
    attn_generator_seed(&gen, fuzz_data_u32(fd));
    attn_generator *g = fuzz_data_chance(fd, 1, 32) ? NULL : &gen;
    const int64_t n = gen_size(e, 0, 40), n2 = gen_size(e, 1, 12), n3 = gen_size(e, 1, 12);
    const bool null_out = fuzz_data_chance(fd, 1, 32);
    judge j = {J_VALID, NULL};
    if (g == NULL) bad(&j, "NULL generator");
    double p1 = 0.0, p2 = 0.0;
    int64_t count = 0; /* elements written */
    switch (which) {
    case 0: /* uniform */
    case 1: /* normal */
        p1 = fuzz_data_double_special(fd, -10.0, 10.0), p2 = fuzz_data_double_special(fd, -10.0, 10.0);
        if (which == 0 && fuzz_data_bool(fd) && !(p1 <= p2)) {
            const double t = p1;
            p1 = p2, p2 = t;
        }
        if (which == 1 && fuzz_data_bool(fd)) p2 = fabs(p2);
        if (n < 0) bad(&j, "n < 0");
        if (null_out && n > 0) bad(&j, "out is NULL");
        if (!isfinite(p1) || !isfinite(p2)) bad(&j, "non-finite parameter");
        if (which == 0 && p1 > p2) bad(&j, "from > to");
        if (which == 1 && p2 < 0) bad(&j, "std < 0");
        if (fabs(p1) > 1e30 || fabs(p2) > 1e30) doubt(&j, "bounds near the float range");
        count = n;
        break;
    case 2: /* bernoulli */
    case 3: /* dropout */
        p1 = fuzz_data_double_special(fd, 0.0, 1.0);
        if (n < 0) bad(&j, "n < 0");
        if (null_out && n > 0) bad(&j, "out is NULL");
        if (!(p1 >= 0.0 && p1 <= 1.0)) bad(&j, "p outside [0, 1]");
        count = n;
        break;
    case 4: /* init_linear: in = n2, out = n3 */
    case 5: /* xavier_uniform: fan_out = n2, fan_in = n3 */
        if (null_out) bad(&j, "NULL weight");
        if (n2 < 1 || n3 < 1) bad(&j, "a size < 1");
        if (n2 >= 1 && n3 >= 1 && !fuzz_mul(n2, n3, &count)) bad(&j, "size overflows");
        break;
    case 6: /* xavier_normal: n, fans n2, n3 */
        if (null_out) bad(&j, "NULL weight");
        if (n < 1 || n2 < 1 || n3 < 1) bad(&j, "a size < 1");
        if (n2 >= 1 && n3 >= 1 && !fuzz_add(n2, n3, &(int64_t){0})) doubt(&j, "fan_in + fan_out overflows");
        count = n;
        break;
    default: /* embedding: num = n2, dim = n3, padding_idx */
        p1 = (double)fuzz_data_i64_range(fd, -3, 14);
        if (null_out) bad(&j, "NULL weight");
        if (n2 < 1 || n3 < 1) bad(&j, "a size < 1");
        if (n2 >= 1 && n3 >= 1 && !fuzz_mul(n2, n3, &count)) bad(&j, "size overflows");
        if (p1 >= (double)n2) bad(&j, "padding_idx >= num");
        break;
    }
    if (j.v != J_INVALID && !(count >= 0 && count <= 4096)) return;
    const size_t cnt = j.v == J_INVALID ? 16 : (size_t)count;
    float *out = null_out ? NULL : env_buf(e, cnt * 4);
    float *bias = which == 4 && fuzz_data_bool(fd) ? env_buf(e, (size_t)(n3 > 0 && n3 <= 4096 ? n3 : 16) * 4) : NULL;
    float *x = which == 3 ? env_buf(e, cnt * 4) : NULL;
    if (x != NULL) fill_floats(e, x, (int64_t)cnt, 4.0f);
    if (which == 3 && out != NULL && fuzz_data_bool(fd)) memcpy(out, x, cnt * 4), x = out; /* in place */
    const attn_generator before = gen;
    attn_status st;
    switch (which) {
    case 0: st = attn_rand_uniform(g, out, n, p1, p2); break;
    case 1: st = attn_rand_normal(g, out, n, p1, p2); break;
    case 2: st = attn_rand_bernoulli(g, out, n, p1); break;
    case 3: st = attn_rand_dropout(g, x, out, n, p1); break;
    case 4: st = attn_init_linear(g, out, bias, n2, n3); break;
    case 5: st = attn_init_xavier_uniform(g, out, n2, n3); break;
    case 6: st = attn_init_xavier_normal(g, out, n, n2, n3); break;
    default: st = attn_init_embedding(g, out, n2, n3, (int64_t)p1); break;
    }
    FUZZ_CHECK(fuzz_status_known(st), "status %d", (int)st);
    if (j.v == J_INVALID) {
        FUZZ_CHECK(st != ATTN_OK, "generator call %d accepted an invalid call (%s)", which, j.why);
        if (which >= 4) FUZZ_CHECK(memcmp(&before, &gen, sizeof gen) == 0, "an initialiser drew on error");
        return;
    }
    if (j.v == J_VALID) FUZZ_CHECK(st == ATTN_OK, "generator call %d: %s", which, attn_strerror(st));
    if (st != ATTN_OK || j.v != J_VALID) return;
    for (int64_t i = 0; i < count; i++) {
        const float v = out[i];
        switch (which) {
        case 0: {
            const double tol = 1e-6 * (fabs(p1) + fabs(p2)) + 1e-30;
            FUZZ_CHECK(v >= p1 - tol && v <= p2 + tol, "uniform %g outside [%g, %g]", (double)v, p1, p2);
            break;
        }
        case 1: FUZZ_CHECK(isfinite(v), "normal %g", (double)v); break;
        case 2:
            FUZZ_CHECK(v == 0.0f || v == 1.0f, "bernoulli %g", (double)v);
            FUZZ_CHECK((p1 != 0.0 || v == 0.0f) && (p1 != 1.0 || v == 1.0f), "bernoulli(%g) gave %g", p1, (double)v);
            break;
        case 4: FUZZ_CHECK(fabsf(v) <= 1.0f / sqrtf((float)n2) * 1.0001f, "kaiming weight %g", (double)v); break;
        case 5: FUZZ_CHECK(fabs(v) <= sqrt(6.0 / (double)(n2 + n3)) * 1.0001, "xavier weight %g", (double)v); break;
        case 6: FUZZ_CHECK(isfinite(v), "xavier normal %g", (double)v); break;
        case 7:
            FUZZ_CHECK(isfinite(v), "embedding %g", (double)v);
            if (p1 >= 0 && i / n3 == (int64_t)p1) FUZZ_CHECK(v == 0.0f, "padding row not zero");
            break;
        default: break;
        }
    }
    if (which == 3 && x != out && p1 == 0.0)
        for (int64_t i = 0; i < count; i++)
            FUZZ_CHECK(fuzz_close(out[i], x[i], 0.0, 0.0), "dropout(p = 0) changed %g to %g", (double)x[i],
                       (double)out[i]);
    if (which == 4 && bias != NULL)
        for (int64_t i = 0; i < n3; i++)
            FUZZ_CHECK(fabsf(bias[i]) <= 1.0f / sqrtf((float)n2) * 1.0001f, "linear bias %g", (double)bias[i]);
}

/* ============================================================================================ */

/* An executor (attn_executor) that runs a loop's indices on the caller, last first. */
static void fuzz_serial_parallel(void *user, int n, void (*task)(void *, int), void *arg) {
    for (int i = n - 1; i >= 0; i--) task(arg, i);
}

/* attn_ctx_create with parameters from the input; the context the rest of the input runs on. */
static attn_ctx *fuzz_ctx_create(env *e) {
    fuzz_data *fd = e->fd;
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    if (fuzz_data_chance(fd, 1, 4)) p.isa = (attn_isa)fuzz_data_int_range(fd, -1, 8);
    bool executor_user_only = false;
    switch (fuzz_data_pick(fd, 16)) {
    case 0: p.n_threads = fuzz_data_int_range(fd, 2, 4); break;
    case 3: /* the caller's executor: its loops on the calling thread, or a user pointer alone */
        p.n_threads = fuzz_data_int_range(fd, 1, 4);
        executor_user_only = fuzz_data_chance(fd, 1, 4);
        p.executor = executor_user_only ? (attn_executor){NULL, e} : (attn_executor){fuzz_serial_parallel, NULL};
        break;
    case 1: p.n_threads = fuzz_data_chance(fd, 1, 2) ? -1 : INT32_MIN; break;
    case 2: p.n_threads = 0; break;
    default: p.n_threads = 1; break;
    }
    p.seed = fuzz_data_u64(fd);
    p.allocator.alloc = fuzz_alloc_fn;
    p.allocator.free = fuzz_free_fn;
    p.allocator.user = e->alloc;
    judge j = {J_VALID, NULL};
    if (p.isa != ATTN_ISA_AUTO && p.isa != ATTN_ISA_REF && !attn_isa_supported(p.isa))
        bad(&j, "an ISA this build or CPU cannot run");
    if (p.n_threads < 0) doubt(&j, "negative n_threads");
    if (executor_user_only) bad(&j, "an executor's user pointer without its function");
    attn_ctx *ctx = (attn_ctx *)(uintptr_t)1;
    arm(e);
    const attn_status st = attn_ctx_create(&p, &ctx);
    disarm(e);
    expect(e, &j, NULL, st, false, "attn_ctx_create");
    if (st != ATTN_OK) {
        FUZZ_CHECK(ctx == NULL, "attn_ctx_create failed without setting *ctx to NULL");
        return fuzz_ctx_new(e->alloc, ATTN_ISA_AUTO, 1, p.seed);
    }
    const attn_isa got = attn_ctx_isa(ctx);
    FUZZ_CHECK(got != ATTN_ISA_AUTO && attn_isa_supported(got), "attn_ctx_isa = %d", (int)got);
    if (p.isa != ATTN_ISA_AUTO) FUZZ_CHECK(got == p.isa, "asked for ISA %d, got %d", (int)p.isa, (int)got);
    return ctx;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_data fd;
    fuzz_data_init(&fd, data, size);
    fuzz_alloc alloc = {0};
    alloc.cap = 2u << 20;
    env e = {0};
    e.fd = &fd;
    e.alloc = &alloc;
    const unsigned what = fuzz_data_u8(&fd);
    e.fail_nth = fuzz_data_chance(&fd, 1, 10) ? fuzz_data_u64_range(&fd, 1, 12) : 0;
    e.rng.state = fuzz_data_u64(&fd);
    e.ctx = fuzz_ctx_create(&e);

    switch (what % 16) {
    case 0:
    case 1:
    case 2:
    case 3:
    case 4:
    case 5: fuzz_sdpa(&e); break;
    case 6:
    case 7:
    case 8: fuzz_mha(&e); break;
    case 9:
    case 10:
    case 11: fuzz_book(&e); break;
    case 12: fuzz_simple(&e); break;
    case 13: fuzz_linear(&e); break;
    case 14: fuzz_kv_cache(&e); break;
    default: /* 15: half each */
        if (what & 16) fuzz_varlen(&e);
        else fuzz_random(&e);
        break;
    }
    env_release(&e);
    attn_ctx_free(e.ctx);
    FUZZ_CHECK(fuzz_alloc_live(&alloc) == 0, "%zu blocks leaked", fuzz_alloc_live(&alloc));
    return 0;
}

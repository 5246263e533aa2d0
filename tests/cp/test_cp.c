// test_cp.c - context-parallel SDPA against the single-process result, run under mpirun with any
// number of ranks (tests/cp/run_cp.sh runs it with P = 1, 2, 3, 4 and over TCP).
//
// Every rank draws the same whole tensors (seeded), computes the single-process reference with
// attn_sdpa_fwd / attn_sdpa_bwd, shards the inputs with attn_cp_shard, runs attn_cp_fwd / attn_cp_bwd
// and compares its rows (out, lse, dq, dk, dv) to the reference's: |got - want| <= 1e-5 * max(1,
// |want|). Cases cover both layouts, causal and not, odd and tiny lengths (ranks holding nothing),
// GQA, D != Dv, bool and float key padding masks (with fully masked rows), strided (L, B, H*D)
// slices and calls cut into pieces. Also: the backward is reproducible bit for bit, the layouts
// cover every position once, shard/unshard round-trip, and argument errors reach every rank.
//
// The ranks agree on each result (MPI_Allreduce) so that all of them take the same path; no check
// ends a rank early. Exit status: 0 when every check passed on every rank, 1 otherwise.
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_cp.h"

#define TOL 1e-5

static int g_rank, g_world;
static int g_failed, g_checks;

// Every rank passes `ok`; all learn whether each did. Rank 0 reports.
static bool check_all(bool ok, const char *what) {
    int mine = ok ? 0 : 1, bad = 0;
    MPI_Allreduce(&mine, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    g_checks++;
    if (bad != 0) {
        g_failed++;
        if (g_rank == 0) fprintf(stderr, "FAIL (%d of %d ranks): %s\n", bad, g_world, what);
    }
    return bad == 0;
}

static double max_all(double x) {
    double y = 0.0;
    MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return y;
}

static float *fmalloc(int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (p == NULL) {
        fprintf(stderr, "test_cp: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1); // the test program, not the library
    }
    return p;
}

// The largest |got - want| / max(1, |want|) over n elements (equal infinities count as equal).
static double max_err(const float *got, const float *want, int64_t n) {
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double g = got[i], w = want[i];
        if (g == w) continue;
        if (isnan(g) || isnan(w) || isinf(g) || isinf(w)) return INFINITY;
        const double d = fabs(g - w) / (fabs(w) > 1.0 ? fabs(w) : 1.0);
        if (d > e) e = d;
    }
    return e;
}

static void contiguous(int64_t H, int64_t L, int64_t D, int64_t s[4]) {
    s[0] = H * L * D, s[1] = L * D, s[2] = D, s[3] = 1;
}

// ---- one configuration ------------------------------------------------------------------------

typedef struct cfg {
    attn_cp_chunking chunking;
    int64_t L, B, H, Hkv, D, Dv;
    attn_causal causal;
    int kpm;        // 0 none, 1 BOOL, 2 F32
    bool strided;   // local slices as (L, B, H*D) (PyTorch's default layout) instead of (B, H, L, D)
    int handle;     // which handle (poll_rows): 0 default, 1 tiny pieces, 2 never cut
    float softcap;  // logit soft-capping (0: none)
    bool sinks;     // attention sinks (a logit per head; one head's -inf: no sink there)
    uint64_t seed;
} cfg;

static attn_cp *g_cp[3];
static attn_ctx *g_ctx;

static void fill(attn_generator *g, float *x, int64_t n) { attn_rand_normal(g, x, n, 0.0, 1.0); }

// Local (B, X, Lloc, W) strides: contiguous, or (Lloc, B, X*W).
static void local_strides(const cfg *c, int64_t X, int64_t Lloc, int64_t W, int64_t s[4]) {
    if (!c->strided) {
        contiguous(X, Lloc, W, s);
        return;
    }
    s[0] = X * W, s[1] = W, s[2] = c->B * X * W, s[3] = 1;
}

// Copies a (B, X, Lloc, W) view at strides to contiguous.
static void to_contiguous(const float *src, const int64_t s[4], int64_t B, int64_t X, int64_t L, int64_t W, float *dst) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t x = 0; x < X; x++)
            for (int64_t i = 0; i < L; i++)
                for (int64_t t = 0; t < W; t++)
                    dst[((b * X + x) * L + i) * W + t] = src[b * s[0] + x * s[1] + i * s[2] + t * s[3]];
}

static const char *causal_name(attn_causal c) {
    return c == ATTN_CAUSAL_NONE ? "none" : c == ATTN_CAUSAL_TOP_LEFT ? "top-left" : "bottom-right";
}

static void run_cfg(const cfg *c) {
    const int64_t B = c->B, H = c->H, Hkv = c->Hkv, L = c->L, D = c->D, Dv = c->Dv;
    char what[256];
    snprintf(what, sizeof what, "%s L=%lld causal=%s B=%lld H=%lld Hkv=%lld D=%lld Dv=%lld kpm=%d %s handle=%d%s%s",
             attn_cp_chunking_name(c->chunking), (long long)L, causal_name(c->causal), (long long)B, (long long)H,
             (long long)Hkv, (long long)D, (long long)Dv, c->kpm, c->strided ? "(L,B,H*D)" : "(B,H,L,D)", c->handle,
             c->softcap > 0.0f ? " softcap" : "", c->sinks ? " sinks" : "");

    // whole tensors, identical on every rank
    attn_generator g;
    attn_generator_seed(&g, c->seed);
    float *q = fmalloc(B * H * L * D), *k = fmalloc(B * Hkv * L * D), *v = fmalloc(B * Hkv * L * Dv);
    float *dout = fmalloc(B * H * L * Dv), *mask_f = fmalloc(B * L);
    unsigned char *mask_b = malloc((size_t)(B * L));
    fill(&g, q, B * H * L * D), fill(&g, k, B * Hkv * L * D), fill(&g, v, B * Hkv * L * Dv);
    fill(&g, dout, B * H * L * Dv);
    float *u = fmalloc(B * L);
    attn_rand_uniform(&g, u, B * L, 0.0, 1.0);
    for (int64_t e = 0; e < B * L; e++) {
        // batch 1 (when there is one) is padded entirely when seed % 4 == 3: fully masked rows
        const bool pad = (B > 1 && e / L == 1 && c->seed % 4 == 3) || u[e] < 0.3f;
        mask_b[e] = pad;
        mask_f[e] = pad ? -INFINITY : (u[e] - 0.5f);
    }
    float sinks[4]; // H <= 4: logits around the scores' size, the last head's -inf (no sink)
    attn_rand_normal(&g, sinks, H, 0.5, 1.0);
    sinks[H - 1] = -INFINITY;
    attn_sdpa_desc full;
    attn_sdpa_desc_init(&full);
    full.batch = B, full.n_heads = H, full.n_kv_heads = Hkv, full.len_q = full.len_kv = L;
    full.head_dim = D, full.head_dim_v = Dv, full.causal = c->causal, full.softcap = c->softcap;
    full.sinks = c->sinks ? sinks : NULL;
    contiguous(H, L, D, full.q_stride), contiguous(Hkv, L, D, full.k_stride);
    contiguous(Hkv, L, Dv, full.v_stride), contiguous(H, L, Dv, full.o_stride);
    if (c->kpm != 0) {
        full.key_padding_mask = c->kpm == 1 ? (const void *)mask_b : (const void *)mask_f;
        full.key_padding_mask_dtype = c->kpm == 1 ? ATTN_DTYPE_BOOL : ATTN_DTYPE_F32;
        full.key_padding_mask_stride[0] = L, full.key_padding_mask_stride[1] = 1;
    }
    float *ro = fmalloc(B * H * L * Dv), *rlse = fmalloc(B * H * L), *rdq = fmalloc(B * H * L * D);
    float *rdk = fmalloc(B * Hkv * L * D), *rdv = fmalloc(B * Hkv * L * Dv);
    float rds[4] = {0}; // the sinks' gradient over the whole sequence
    bool ok = attn_sdpa_fwd(g_ctx, &full, q, k, v, ro, rlse, NULL) == ATTN_OK &&
              attn_sdpa_bwd(g_ctx, &full, q, k, v, ro, dout, rlse, NULL, rdq, rdk, rdv, NULL) == ATTN_OK &&
              (!c->sinks || attn_sdpa_sinks_bwd(g_ctx, &full, NULL, NULL, ro, dout, rlse, rds) == ATTN_OK);
    if (!check_all(ok, "single-process reference")) goto done_ref;

    // this rank's slices
    attn_cp_desc d;
    attn_cp_desc_init(&d);
    attn_cp_layout_init(&d.layout, c->chunking, L, g_rank, g_world);
    int64_t n;
    attn_cp_local_len(&d.layout, &n);
    d.sdpa = full;
    d.sdpa.len_q = d.sdpa.len_kv = n;
    local_strides(c, H, n, D, d.sdpa.q_stride), local_strides(c, Hkv, n, D, d.sdpa.k_stride);
    local_strides(c, Hkv, n, Dv, d.sdpa.v_stride), local_strides(c, H, n, Dv, d.sdpa.o_stride);
    float *lq = fmalloc(B * H * n * D), *lk = fmalloc(B * Hkv * n * D), *lv = fmalloc(B * Hkv * n * Dv);
    float *ldo = fmalloc(B * H * n * Dv), *lo = fmalloc(B * H * n * Dv), *llse = fmalloc(B * H * n);
    float *ldq = fmalloc(B * H * n * D), *ldk = fmalloc(B * Hkv * n * D), *ldv = fmalloc(B * Hkv * n * Dv);
    float *ldq2 = fmalloc(B * H * n * D), *ldk2 = fmalloc(B * Hkv * n * D), *ldv2 = fmalloc(B * Hkv * n * Dv);
    unsigned char *lmb = malloc((size_t)(B * (n > 0 ? n : 1)));
    float *lmf = fmalloc(B * n);
    const int64_t sq[4] = {B, H, L, D}, sk[4] = {B, Hkv, L, D}, sv[4] = {B, Hkv, L, Dv}, so[4] = {B, H, L, Dv};
    const int64_t sm[4] = {B, 1, L, 1}, fm_s[4] = {L, 0, 1, 0}, lm_s[4] = {n, 0, 1, 0};
    ok = attn_cp_shard(&d.layout, 4, sq, q, full.q_stride, lq, d.sdpa.q_stride) == ATTN_OK &&
         attn_cp_shard(&d.layout, 4, sk, k, full.k_stride, lk, d.sdpa.k_stride) == ATTN_OK &&
         attn_cp_shard(&d.layout, 4, sv, v, full.v_stride, lv, d.sdpa.v_stride) == ATTN_OK &&
         attn_cp_shard(&d.layout, 4, so, dout, full.o_stride, ldo, d.sdpa.o_stride) == ATTN_OK &&
         attn_cp_shard(&d.layout, 1, sm, mask_b, fm_s, lmb, lm_s) == ATTN_OK &&
         attn_cp_shard(&d.layout, 4, sm, mask_f, fm_s, lmf, lm_s) == ATTN_OK;
    if (c->kpm != 0) {
        d.sdpa.key_padding_mask = c->kpm == 1 ? (const void *)lmb : (const void *)lmf;
        d.sdpa.key_padding_mask_stride[0] = n, d.sdpa.key_padding_mask_stride[1] = 1;
    }
    check_all(ok, "shard");

    // forward
    attn_cp *cp = g_cp[c->handle];
    attn_status st = attn_cp_fwd(cp, g_ctx, &d, lq, lk, lv, lo, llse);
    if (st != ATTN_OK) fprintf(stderr, "rank %d: %s\n", g_rank, attn_cp_last_error(cp));
    if (!check_all(st == ATTN_OK, what)) goto done;
    // the reference's rows of this rank, as the slices are laid out (contiguous copies to compare)
    float *want = fmalloc(B * H * n * (D > Dv ? D : Dv)), *got = fmalloc(B * H * n * (D > Dv ? D : Dv));
    const int64_t cs_o[4] = {H * n * Dv, n * Dv, Dv, 1}, cs_l[4] = {H * n, n, 1, 0};
    const int64_t sl[4] = {B, H, L, 1}, fl_s[4] = {H * L, L, 1, 0};
    attn_cp_shard(&d.layout, 4, so, ro, full.o_stride, want, cs_o);
    to_contiguous(lo, d.sdpa.o_stride, B, H, n, Dv, got);
    const double e_out = max_all(max_err(got, want, B * H * n * Dv));
    attn_cp_shard(&d.layout, 4, sl, rlse, fl_s, want, cs_l);
    const double e_lse = max_all(max_err(llse, want, B * H * n));
    if (c->kpm != 0 && B > 1 && c->seed % 4 == 3) { // batch 1 fully masked: zeros and -inf (the sink), exactly
        bool z = true;
        for (int64_t e = H * n; e < 2 * H * n; e++) z = z && llse[e] == (c->sinks ? sinks[e / n % H] : -INFINITY);
        for (int64_t e = H * n * Dv; e < 2 * H * n * Dv; e++) z = z && got[e] == 0.0f;
        check_all(z, "fully masked rows: output 0 and lse -inf (the sink)");
    }

    // backward, twice: the same bits
    st = attn_cp_bwd(cp, g_ctx, &d, lq, lk, lv, lo, ldo, llse, ldq, ldk, ldv);
    if (st != ATTN_OK) fprintf(stderr, "rank %d: %s\n", g_rank, attn_cp_last_error(cp));
    attn_status st2 = attn_cp_bwd(cp, g_ctx, &d, lq, lk, lv, lo, ldo, llse, ldq2, ldk2, ldv2);
    if (!check_all(st == ATTN_OK && st2 == ATTN_OK, what)) goto done2;
    const int64_t cs_q[4] = {H * n * D, n * D, D, 1}, cs_k[4] = {Hkv * n * D, n * D, D, 1};
    const int64_t cs_v[4] = {Hkv * n * Dv, n * Dv, Dv, 1};
    attn_cp_shard(&d.layout, 4, sq, rdq, full.q_stride, want, cs_q);
    to_contiguous(ldq, d.sdpa.q_stride, B, H, n, D, got);
    const double e_dq = max_all(max_err(got, want, B * H * n * D));
    attn_cp_shard(&d.layout, 4, sk, rdk, full.k_stride, want, cs_k);
    to_contiguous(ldk, d.sdpa.k_stride, B, Hkv, n, D, got);
    const double e_dk = max_all(max_err(got, want, B * Hkv * n * D));
    attn_cp_shard(&d.layout, 4, sv, rdv, full.v_stride, want, cs_v);
    to_contiguous(ldv, d.sdpa.v_stride, B, Hkv, n, Dv, got);
    const double e_dv = max_all(max_err(got, want, B * Hkv * n * Dv));
    // same bits: compare through the strides (each buffer holds exactly its view's elements)
    to_contiguous(ldq, d.sdpa.q_stride, B, H, n, D, got), to_contiguous(ldq2, d.sdpa.q_stride, B, H, n, D, want);
    bool same = memcmp(got, want, (size_t)(B * H * n * D) * sizeof(float)) == 0;
    to_contiguous(ldk, d.sdpa.k_stride, B, Hkv, n, D, got), to_contiguous(ldk2, d.sdpa.k_stride, B, Hkv, n, D, want);
    same = same && memcmp(got, want, (size_t)(B * Hkv * n * D) * sizeof(float)) == 0;
    to_contiguous(ldv, d.sdpa.v_stride, B, Hkv, n, Dv, got), to_contiguous(ldv2, d.sdpa.v_stride, B, Hkv, n, Dv, want);
    same = same && memcmp(got, want, (size_t)(B * Hkv * n * Dv) * sizeof(float)) == 0;

    // the sinks' gradient: attn_sdpa_sinks_bwd on this rank's rows, summed over the ranks
    double e_ds = 0.0;
    if (c->sinks) {
        float lds[4] = {0}, sum[4] = {0};
        // (a rank without rows adds nothing: libattn takes no empty extent)
        check_all(n == 0 || attn_sdpa_sinks_bwd(g_ctx, &d.sdpa, NULL, NULL, lo, ldo, llse, lds) == ATTN_OK,
                  "sinks' gradient");
        MPI_Allreduce(lds, sum, (int)H, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        e_ds = max_err(sum, rds, H);
    }
    const double worst = fmax(fmax(fmax(e_out, e_lse), fmax(e_dq, e_dk)), fmax(e_dv, e_ds));
    char line[512];
    snprintf(line, sizeof line, "%s: max err out %.1e lse %.1e dq %.1e dk %.1e dv %.1e%s%s", what, e_out, e_lse, e_dq,
             e_dk, e_dv, c->sinks ? " dsinks" : "", same ? "" : " (backward not reproducible)");
    if (check_all(worst <= TOL && same, line) && g_rank == 0) printf("ok   %s\n", line);
done2:
    free(want), free(got);
done:
    free(lq), free(lk), free(lv), free(ldo), free(lo), free(llse), free(ldq), free(ldk), free(ldv);
    free(ldq2), free(ldk2), free(ldv2), free(lmb), free(lmf);
done_ref:
    free(q), free(k), free(v), free(dout), free(mask_f), free(mask_b), free(u);
    free(ro), free(rlse), free(rdq), free(rdk), free(rdv);
}

// ---- layouts, helpers and errors --------------------------------------------------------------

// Every position is held by exactly one rank, chunks are balanced, zigzag balances causal work.
static void test_layouts(void) {
    bool ok = true;
    for (int P = 1; P <= 9 && ok; P++)
        for (int ch = 0; ch < 2 && ok; ch++)
            for (int64_t L = 1; L <= 40 && ok; L++) {
                int *seen = calloc((size_t)L, sizeof(int));
                double work_min = INFINITY, work_max = 0.0;
                for (int r = 0; r < P && ok; r++) {
                    attn_cp_layout l;
                    int64_t n = 0, pos[64];
                    ok = attn_cp_layout_init(&l, (attn_cp_chunking)ch, L, r, P) == ATTN_OK &&
                         attn_cp_local_len(&l, &n) == ATTN_OK && attn_cp_positions(&l, pos) == ATTN_OK;
                    double work = 0.0;
                    for (int64_t i = 0; i < n && ok; i++) {
                        ok = pos[i] >= 0 && pos[i] < L;
                        if (ok) seen[pos[i]]++, work += (double)pos[i] + 1.0;
                    }
                    work_min = fmin(work_min, work), work_max = fmax(work_max, work);
                }
                for (int64_t i = 0; i < L && ok; i++) ok = seen[i] == 1;
                // causal work per rank: zigzag within one longest row of the mean when L % 2P == 0
                if (ok && ch == ATTN_CP_ZIGZAG && L % (2 * P) == 0) ok = work_max - work_min <= 0.0;
                free(seen);
            }
    check_all(ok, "layouts: every position on exactly one rank; zigzag balances causal work");

    attn_cp_layout l;
    int n_chunks;
    int64_t start[2], len[2];
    ok = attn_cp_layout_init(&l, ATTN_CP_ZIGZAG, 10, 1, 2) == ATTN_OK &&
         attn_cp_chunks(&l, &n_chunks, start, len) == ATTN_OK && n_chunks == 2 && start[0] == 3 && len[0] == 3 &&
         start[1] == 6 && len[1] == 2; // chunks of 10 over 4: [0,3) [3,6) [6,8) [8,10); rank 1: chunks 1, 2
    check_all(ok, "attn_cp_chunks: zigzag rank 1 of 2, L = 10");
    ok = attn_cp_layout_init(&l, ATTN_CP_ZIGZAG, 0, 0, 1) == ATTN_ERR_BAD_SHAPE &&
         attn_cp_layout_init(&l, ATTN_CP_ZIGZAG, 5, 2, 2) == ATTN_ERR_INVALID_ARG &&
         attn_cp_layout_init(&l, (attn_cp_chunking)7, 5, 0, 1) == ATTN_ERR_INVALID_ARG &&
         attn_cp_layout_init(NULL, ATTN_CP_ZIGZAG, 5, 0, 1) == ATTN_ERR_INVALID_ARG &&
         attn_cp_local_len(NULL, &start[0]) == ATTN_ERR_INVALID_ARG;
    check_all(ok, "layout argument errors");

    // shard then unshard rebuilds the whole tensor (2-byte elements, (2, 3, 11, 5))
    const int64_t shape[4] = {2, 3, 11, 5}, fs[4] = {165, 55, 5, 1};
    uint16_t full[330], back[330], loc[330];
    for (int i = 0; i < 330; i++) full[i] = (uint16_t)(i * 7 + 1);
    ok = true;
    for (int P = 1; P <= 4 && ok; P++) {
        memset(back, 0, sizeof back);
        for (int r = 0; r < P && ok; r++) {
            attn_cp_layout_init(&l, ATTN_CP_ZIGZAG, 11, r, P);
            int64_t n;
            attn_cp_local_len(&l, &n);
            const int64_t ls[4] = {15, 5, 30, 1}; // (L, B, H, D) in memory
            ok = attn_cp_shard(&l, 2, shape, full, fs, loc, ls) == ATTN_OK &&
                 attn_cp_unshard(&l, 2, shape, loc, ls, back, fs) == ATTN_OK;
        }
        ok = ok && memcmp(full, back, sizeof full) == 0;
    }
    check_all(ok, "shard/unshard round trip");
    ok = attn_cp_shard(&l, 4, (const int64_t[4]){1, 1, 12, 1}, full, (const int64_t[4]){12, 12, 1, 1}, loc,
                       (const int64_t[4]){1, 1, 1, 1}) == ATTN_ERR_BAD_SHAPE && // wrong length
         attn_cp_shard(&l, 0, (const int64_t[4]){1, 1, 11, 1}, full, (const int64_t[4]){11, 11, 1, 1}, loc,
                       (const int64_t[4]){1, 1, 1, 1}) == ATTN_ERR_INVALID_ARG &&
         attn_cp_shard(&l, 4, (const int64_t[4]){1, 1, 11, 1}, full, (const int64_t[4]){11, 11, -1, 1}, loc,
                       (const int64_t[4]){1, 1, 1, 1}) == ATTN_ERR_INVALID_ARG;
    check_all(ok, "shard argument errors");
}

// Errors are returned by every rank, with a message; nothing hangs.
static void test_errors(void) {
    const int64_t L = 12, B = 1, H = 2, D = 4;
    attn_cp_desc d;
    attn_cp_desc_init(&d);
    attn_cp_layout_init(&d.layout, ATTN_CP_ZIGZAG, L, g_rank, g_world);
    int64_t n;
    attn_cp_local_len(&d.layout, &n);
    d.sdpa.batch = B, d.sdpa.n_heads = H, d.sdpa.head_dim = D;
    contiguous(H, n, D, d.sdpa.q_stride), contiguous(H, n, D, d.sdpa.k_stride);
    contiguous(H, n, D, d.sdpa.v_stride), contiguous(H, n, D, d.sdpa.o_stride);
    float *x = fmalloc(B * H * n * D * 9), *o = x + B * H * n * D, *lse = x + 2 * B * H * n * D;
    float *dq = x + 3 * B * H * n * D, *dk = x + 4 * B * H * n * D, *dv = x + 5 * B * H * n * D;
    for (int64_t i = 0; i < B * H * n * D * 9; i++) x[i] = 0.25f;
    attn_cp *cp = g_cp[0];
    check_all(attn_cp_fwd(cp, g_ctx, &d, x, x, x, o, lse) == ATTN_OK, "errors: a valid call first");

    attn_cp_desc e = d;
    e.sdpa.mask = x, e.sdpa.mask_dtype = ATTN_DTYPE_F32;
    check_all(attn_cp_fwd(cp, g_ctx, &e, x, x, x, o, lse) == ATTN_ERR_UNSUPPORTED && attn_cp_last_error(cp)[0] != 0,
              "errors: attention mask is unsupported on every rank");
    e = d, e.sdpa.dropout_p = 0.1;
    check_all(attn_cp_bwd(cp, g_ctx, &e, x, x, x, o, o, lse, dq, dk, dv) == ATTN_ERR_UNSUPPORTED,
              "errors: dropout is unsupported");
    e = d, e.sdpa.use_window = 1, e.sdpa.window_left = 2, e.sdpa.window_right = 0;
    check_all(attn_cp_fwd(cp, g_ctx, &e, x, x, x, o, lse) == ATTN_ERR_UNSUPPORTED, "errors: a window is unsupported");
    e = d, e.sdpa.alibi_slopes = x;
    check_all(attn_cp_fwd(cp, g_ctx, &e, x, x, x, o, lse) == ATTN_ERR_UNSUPPORTED, "errors: ALiBi is unsupported");
    e = d, e.sdpa.kv_dtype = ATTN_DTYPE_F16;
    check_all(attn_cp_fwd(cp, g_ctx, &e, x, x, x, o, lse) == ATTN_ERR_UNSUPPORTED, "errors: F16 keys are unsupported");
    e = d, e.layout.world = g_world + 1;
    check_all(attn_cp_fwd(cp, g_ctx, &e, x, x, x, o, lse) == ATTN_ERR_INVALID_ARG, "errors: world size mismatch");
    e = d, e.sdpa.len_q = L + 1;
    check_all(attn_cp_fwd(cp, g_ctx, &e, x, x, x, o, lse) == ATTN_ERR_BAD_SHAPE, "errors: len_q is not the local length");
    check_all(attn_cp_fwd(cp, g_ctx, NULL, x, x, x, o, lse) == ATTN_ERR_INVALID_ARG, "errors: NULL desc");
    check_all(attn_cp_fwd(cp, NULL, &d, x, x, x, o, lse) == ATTN_ERR_INVALID_ARG, "errors: NULL ctx");
    check_all(attn_cp_fwd(NULL, g_ctx, &d, x, x, x, o, lse) == ATTN_ERR_INVALID_ARG, "errors: NULL handle");

    // one rank alone is wrong: every rank fails, the others with the status of the one
    e = d;
    if (g_rank == g_world - 1) e.sdpa.head_dim = 0;
    attn_status st = attn_cp_fwd(cp, g_ctx, &e, x, x, x, o, lse);
    check_all(st == ATTN_ERR_BAD_SHAPE, "errors: a bad shape on the last rank fails every rank");
    if (g_world > 1) {
        e = d;
        if (g_rank == 0) e.sdpa.scale = 0.5f;
        st = attn_cp_fwd(cp, g_ctx, &e, x, x, x, o, lse);
        check_all(st == ATTN_ERR_INVALID_ARG && strstr(attn_cp_last_error(cp), "scale") != NULL,
                  "errors: ranks that disagree on the scale all fail, naming it");
        e = d;
        if (g_rank == 1) e.sdpa.causal = ATTN_CAUSAL_TOP_LEFT;
        st = attn_cp_fwd(cp, g_ctx, &e, x, x, x, o, lse);
        check_all(st == ATTN_ERR_INVALID_ARG && strstr(attn_cp_last_error(cp), "causal") != NULL,
                  "errors: ranks that disagree on causal all fail, naming it");
    }
    if (n > 0) {
        st = attn_cp_fwd(cp, g_ctx, &d, NULL, x, x, o, lse);
    } else {
        st = attn_cp_fwd(cp, g_ctx, &d, x, x, x, o, lse);
        st = st == ATTN_OK ? ATTN_ERR_INVALID_ARG : ATTN_OK; // a rank without rows may pass NULL
    }
    check_all(st == ATTN_ERR_INVALID_ARG, "errors: NULL q");

    // the reference kernels cannot run the backward (they do not take the lse)
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.isa = ATTN_ISA_REF;
    attn_ctx *ref;
    attn_ctx_create(&p, &ref);
    check_all(attn_cp_fwd(cp, ref, &d, x, x, x, o, lse) == ATTN_OK, "errors: the forward runs on ATTN_ISA_REF");
    check_all(attn_cp_bwd(cp, ref, &d, x, x, x, o, o, lse, dq, dk, dv) == ATTN_ERR_UNSUPPORTED,
              "errors: the backward rejects ATTN_ISA_REF");
    attn_ctx_free(ref);
    check_all(attn_cp_fwd(cp, g_ctx, &d, x, x, x, o, lse) == ATTN_OK, "errors: the handle still works");
    attn_cp_stats s;
    check_all(attn_cp_last_stats(cp, &s) == ATTN_OK && s.steps == g_world && s.backward == 0, "stats of the last call");

    // create: invalid parameters on one rank fail every rank
    attn_cp_params pp;
    attn_cp_params_init(&pp);
    if (g_rank == 0) pp.poll_rows = -5;
    attn_cp *bad = NULL;
    st = attn_cp_create(MPI_COMM_WORLD, &pp, &bad);
    check_all((g_rank == 0 ? st == ATTN_ERR_INVALID_ARG : st != ATTN_OK) && bad == NULL,
              "create: bad parameters on rank 0 fail every rank");
    check_all(attn_cp_create(MPI_COMM_NULL, NULL, &bad) == ATTN_ERR_INVALID_ARG, "create: MPI_COMM_NULL");
    size_t bytes = 0;
    check_all(attn_cp_workspace_size(cp, &d, 1, &bytes) == ATTN_OK && bytes > 0, "workspace size");
    free(x);
}

// ---- the cases --------------------------------------------------------------------------------

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world);
    attn_ctx_params cp_params;
    attn_ctx_params_init(&cp_params);
    if (attn_ctx_create(&cp_params, &g_ctx) != ATTN_OK) {
        fprintf(stderr, "test_cp: cannot create a context\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const int64_t polls[3] = {0, 3, -1};
    for (int i = 0; i < 3; i++) {
        attn_cp_params p;
        attn_cp_params_init(&p);
        p.poll_rows = polls[i];
        if (attn_cp_create(MPI_COMM_WORLD, &p, &g_cp[i]) != ATTN_OK) {
            fprintf(stderr, "test_cp: cannot create a handle\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    if (g_rank == 0) printf("test_cp: %d rank(s), kernels %s\n", g_world, attn_isa_name(attn_ctx_isa(g_ctx)));

    test_layouts();
    test_errors();

    static const int64_t lens[] = {1, 2, 3, 5, 8, 13, 31, 67, 130};
    static const attn_causal causals[] = {ATTN_CAUSAL_NONE, ATTN_CAUSAL_TOP_LEFT, ATTN_CAUSAL_BOTTOM_RIGHT};
    uint64_t seed = 1;
    for (int ch = 0; ch < 2; ch++)
        for (int ci = 0; ci < 3; ci++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++, seed++) {
                // the other options vary with the case so that each meets every layout and mode
                cfg c = {.chunking = (attn_cp_chunking)ch, .L = lens[li], .causal = causals[ci], .seed = seed};
                c.B = 1 + (int64_t)(seed % 2);
                c.H = seed % 3 == 0 ? 4 : 2;
                c.Hkv = seed % 4 == 1 ? 1 : c.H; // GQA / MQA in a quarter of the cases
                c.D = seed % 5 == 0 ? 24 : 16;
                c.Dv = seed % 7 == 3 ? 8 : c.D;
                c.kpm = (int)(seed % 3);
                c.strided = seed % 4 >= 2;
                c.handle = (int)(seed % 3);
                c.softcap = seed % 5 == 2 ? 4.0f : 0.0f;
                c.sinks = seed % 3 == 1;
                run_cfg(&c);
            }
    // longer sequences, cut into many calls (poll_rows 3) and not
    for (int h = 0; h < 3; h++, seed++) {
        cfg c = {.chunking = ATTN_CP_ZIGZAG, .L = 257, .causal = ATTN_CAUSAL_TOP_LEFT, .B = 1, .H = 4, .Hkv = 2,
                 .D = 32, .Dv = 32, .kpm = 1, .strided = h == 1, .handle = h, .sinks = h == 2, .seed = seed};
        run_cfg(&c);
    }

    for (int i = 0; i < 3; i++) attn_cp_free(g_cp[i]);
    attn_ctx_free(g_ctx);
    if (g_rank == 0)
        printf("test_cp: %d rank(s): %d of %d checks passed\n", g_world, g_checks - g_failed, g_checks);
    const int rc = g_failed == 0 ? 0 : 1;
    MPI_Finalize();
    return rc;
}

// cp_bench.c - `attn-cp bench`: times context-parallel attention on the ranks of MPI_COMM_WORLD.
//
// For each layout: the forward (and the backward) once to warm up, then R timed runs, each started
// after a barrier. The run reported is the median by its slowest rank's time. Per rank: the
// library's statistics of that run (attn_cp_last_stats: kernel time, time blocked in MPI waits,
// work), and the time the same ring of messages takes with nothing computed ("communication
// alone", the median of R rings timed here with the same MPI calls). The overlap is the share of
// that communication the computation hid: 1 - (wait + time inside the non-blocking MPI calls) /
// alone, clamped to [0, 1]. A wait also includes time spent waiting for a slower neighbour, so an
// unbalanced layout shows a low overlap.
//
// The model of one ring step (docs/context-parallel.md): with Lloc positions per rank, one step
// computes c(Lloc) = B*H*Lloc^2*f flops (f = 2(D+Dv) forward, 6D+4Dv backward; halved when causal,
// which the zigzag layout spreads evenly) and moves t(Lloc) = A + Lloc*bytes/BW (bytes per position:
// B*Hkv*(D+Dv)*4, twice that in the backward with the key/value gradients). The transfer hides
// when c/R >= t, R being the measured kernel speed of one rank.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp_tool.h"

#define MAX_RUNS 4 // layouts x passes

typedef struct rank_row {
    double rows, cells, flops, compute_s, wait_s, progress_s, total_s, alone_s, bytes;
} rank_row;

typedef struct run_result {
    const char *layout;
    int backward;
    rank_row *ranks; // world rows, on rank 0
} run_result;

typedef struct bench {
    const cpt_bench_opts *o;
    int rank, world;
    attn_ctx *ctx;
    attn_cp *cp;
    run_result res[MAX_RUNS];
    int n_res;
} bench;

static int fail(const bench *b, const char *what, const char *msg) {
    fprintf(stderr, "attn-cp bench (rank %d): %s: %s\n", b->rank, what, msg);
    return CPT_FAILURE;
}

static float *falloc(int64_t n) { return malloc((size_t)(n > 0 ? n : 1) * sizeof(float)); }

static int cmp_double(const void *x, const void *y) {
    const double a = *(const double *)x, c = *(const double *)y;
    return (a > c) - (a < c);
}

static void packed(int64_t H, int64_t L, int64_t D, int64_t s[4]) {
    s[0] = H * L * D, s[1] = L * D, s[2] = D, s[3] = 1;
}

// ---- communication alone: the library's ring of messages, nothing computed --------------------

static int64_t rows_of(const attn_cp_layout *l, int r) {
    attn_cp_layout x = *l;
    x.rank = r;
    int64_t n = 0;
    attn_cp_local_len(&x, &n);
    return n;
}

// One ring of the forward's (or backward's) messages; returns this rank's wall time.
static double ring_alone(const bench *b, const attn_cp_layout *l, int64_t kv_tok, int backward, float *kv[2],
                         float *dkv[2]) {
    const int P = b->world, r = b->rank, right = (r + 1) % P, left = (r + P - 1) % P;
    MPI_Request req[4];
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    int cur = 0, in = 0, dsend = 0;
    for (int s = 0; s < P; s++) {
        const int o = (r - s + P) % P, on = (o + P - 1) % P;
        int n = 0;
        if (s < P - 1) {
            MPI_Irecv(kv[1 - cur], (int)(rows_of(l, on) * kv_tok), MPI_FLOAT, left, 1, MPI_COMM_WORLD, &req[n++]);
            MPI_Isend(kv[cur], (int)(rows_of(l, o) * kv_tok), MPI_FLOAT, right, 1, MPI_COMM_WORLD, &req[n++]);
        }
        if (backward && P > 1) { // the gradient accumulator of block o: from the left, then on
            const int cnt = (int)(rows_of(l, o) * kv_tok);
            if (s > 0) MPI_Recv(dkv[in], cnt, MPI_FLOAT, left, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (dsend) MPI_Wait(&req[3], MPI_STATUS_IGNORE);
            MPI_Isend(dkv[in], cnt, MPI_FLOAT, right, 2, MPI_COMM_WORLD, &req[3]);
            dsend = 1, in = 1 - in;
        }
        MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
        cur = 1 - cur;
    }
    if (backward && P > 1) {
        MPI_Recv(dkv[in], (int)(rows_of(l, r) * kv_tok), MPI_FLOAT, left, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Wait(&req[3], MPI_STATUS_IGNORE);
    }
    return MPI_Wtime() - t0;
}

// ---- one layout -------------------------------------------------------------------------------

typedef struct slices {
    float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
} slices;

static void free_slices(slices *s) {
    free(s->q), free(s->k), free(s->v), free(s->out), free(s->lse);
    free(s->dout), free(s->dq), free(s->dk), free(s->dv);
}

static int alloc_slices(const bench *b, int64_t n, slices *s) {
    const cpt_bench_opts *o = b->o;
    const int64_t B = o->batch, H = o->heads, Hkv = o->kv_heads, D = o->head_dim, Dv = o->head_dim_v;
    *s = (slices){falloc(B * H * n * D), falloc(B * Hkv * n * D), falloc(B * Hkv * n * Dv), falloc(B * H * n * Dv),
                  falloc(B * H * n), falloc(B * H * n * Dv), falloc(B * H * n * D), falloc(B * Hkv * n * D),
                  falloc(B * Hkv * n * Dv)};
    if (!s->q || !s->k || !s->v || !s->out || !s->lse || !s->dout || !s->dq || !s->dk || !s->dv) return -1;
    attn_generator g;
    attn_generator_seed(&g, 1000 + (uint64_t)b->rank);
    attn_rand_normal(&g, s->q, B * H * n * D, 0.0, 1.0);
    attn_rand_normal(&g, s->k, B * Hkv * n * D, 0.0, 1.0);
    attn_rand_normal(&g, s->v, B * Hkv * n * Dv, 0.0, 1.0);
    attn_rand_normal(&g, s->dout, B * H * n * Dv, 0.0, 1.0);
    return 0;
}

static attn_status run_pass(bench *b, const attn_cp_desc *d, const slices *s, int backward) {
    if (!backward) return attn_cp_fwd(b->cp, b->ctx, d, s->q, s->k, s->v, s->out, s->lse);
    return attn_cp_bwd(b->cp, b->ctx, d, s->q, s->k, s->v, s->out, s->dout, s->lse, s->dq, s->dk, s->dv);
}

// Times one pass (forward or backward) R times; fills this rank's row of the median run.
static int time_pass(bench *b, const attn_cp_desc *d, const slices *s, int backward, rank_row *row, float *kv[2],
                     float *dkv[2], int64_t kv_tok) {
    const int64_t R = b->o->repeat;
    attn_cp_stats st[1000];
    double slowest[1000], alone[1000];
    attn_status e = ATTN_OK;
    for (int64_t i = 0; i < R && e == ATTN_OK; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        e = run_pass(b, d, s, backward);
        if (e == ATTN_OK) attn_cp_last_stats(b->cp, &st[i]);
        if (e == ATTN_OK) MPI_Allreduce(&st[i].total_s, &slowest[i], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
    if (e != ATTN_OK) return fail(b, backward ? "attn_cp_bwd" : "attn_cp_fwd", attn_cp_last_error(b->cp));
    for (int64_t i = 0; i < R; i++) alone[i] = ring_alone(b, &d->layout, kv_tok, backward, kv, dkv);
    double sorted[1000];
    memcpy(sorted, slowest, (size_t)R * sizeof(double));
    qsort(sorted, (size_t)R, sizeof(double), cmp_double);
    int64_t med = 0;
    while (slowest[med] != sorted[R / 2]) med++; // the same run on every rank: slowest[] agrees
    qsort(alone, (size_t)R, sizeof(double), cmp_double);
    const attn_cp_stats *m = &st[med];
    *row = (rank_row){(double)rows_of(&d->layout, b->rank), m->cells, m->flops, m->compute_s, m->wait_s,
                      m->progress_s, m->total_s, alone[R / 2], (double)(m->kv_bytes + m->dkv_bytes)};
    return CPT_OK;
}

static int run_layout(bench *b, attn_cp_chunking chunking) {
    const cpt_bench_opts *o = b->o;
    const int64_t B = o->batch, H = o->heads, Hkv = o->kv_heads, D = o->head_dim, Dv = o->head_dim_v;
    attn_cp_desc d;
    attn_cp_desc_init(&d);
    attn_cp_layout_init(&d.layout, chunking, o->len, b->rank, b->world);
    int64_t n = 0, smax = 0;
    attn_cp_local_len(&d.layout, &n);
    for (int r = 0; r < b->world; r++) smax = rows_of(&d.layout, r) > smax ? rows_of(&d.layout, r) : smax;
    d.sdpa.batch = B, d.sdpa.n_heads = H, d.sdpa.n_kv_heads = Hkv, d.sdpa.head_dim = D, d.sdpa.head_dim_v = Dv;
    d.sdpa.len_q = d.sdpa.len_kv = n;
    d.sdpa.causal = o->causal ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
    packed(H, n, D, d.sdpa.q_stride), packed(Hkv, n, D, d.sdpa.k_stride);
    packed(Hkv, n, Dv, d.sdpa.v_stride), packed(H, n, Dv, d.sdpa.o_stride);
    const int64_t kv_tok = B * Hkv * (D + Dv);
    slices s;
    float *kv[2] = {falloc(smax * kv_tok), falloc(smax * kv_tok)}, *dkv[2] = {falloc(smax * kv_tok), falloc(smax * kv_tok)};
    int rc = alloc_slices(b, n, &s) == 0 && kv[0] && kv[1] && dkv[0] && dkv[1] ? CPT_OK : CPT_FAILURE;
    if (rc != CPT_OK) fail(b, "memory", "cannot allocate the slices");
    int bad = rc != CPT_OK, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) rc = CPT_FAILURE;
    // allocate the ring's buffers and the kernels' scratch now, then one untimed run of each pass
    attn_status e = ATTN_OK;
    if (rc == CPT_OK) e = attn_cp_reserve(b->cp, b->ctx, &d, o->backward);
    bad = e != ATTN_OK, any = 0;
    if (bad) fail(b, "attn_cp_reserve", attn_cp_last_error(b->cp));
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) rc = CPT_FAILURE;
    for (int pass = 0; pass <= (int)o->backward && rc == CPT_OK; pass++)
        if (run_pass(b, &d, &s, pass) != ATTN_OK) rc = fail(b, "warm-up", attn_cp_last_error(b->cp));
    for (int pass = 0; pass <= (int)o->backward && rc == CPT_OK; pass++) {
        rank_row row;
        rc = time_pass(b, &d, &s, pass, &row, kv, dkv, kv_tok);
        if (rc != CPT_OK) break;
        run_result *res = &b->res[b->n_res++];
        res->layout = attn_cp_chunking_name(chunking), res->backward = pass;
        res->ranks = b->rank == 0 ? malloc((size_t)b->world * sizeof(rank_row)) : NULL;
        MPI_Gather(&row, (int)(sizeof row / sizeof(double)), MPI_DOUBLE, res->ranks,
                   (int)(sizeof row / sizeof(double)), MPI_DOUBLE, 0, MPI_COMM_WORLD);
    }
    free_slices(&s);
    free(kv[0]), free(kv[1]), free(dkv[0]), free(dkv[1]);
    return rc;
}

// ---- report -----------------------------------------------------------------------------------

// Lloc at which a step's computation covers its transfer: a*x^2 = A + c*x.
static double crossover(double a, double c, double lat) {
    return (c + sqrt(c * c + 4.0 * a * lat)) / (2.0 * a);
}

static void report(const bench *b, const run_result *res) {
    const cpt_bench_opts *o = b->o;
    const int P = b->world;
    printf("\n%s, %s, %s:\n", res->layout, o->causal ? "causal" : "not causal", res->backward ? "backward" : "forward");
    printf("rank     rows  work (M pairs)  kernels (ms)  in MPI (ms)  waits (ms)  total (ms)  comm alone (ms)  overlap"
           "  GFLOP/s\n");
    double wmax = 0.0, wsum = 0.0, cmax = 0.0, csum = 0.0, flops = 0.0, comp = 0.0, tmax = 0.0;
    for (int r = 0; r < P; r++) {
        const rank_row *x = &res->ranks[r];
        char ov[16] = "-";
        if (P > 1 && x->alone_s > 0.0) {
            const double h = 1.0 - (x->wait_s + x->progress_s) / x->alone_s;
            snprintf(ov, sizeof ov, "%.0f%%", 100.0 * (h < 0.0 ? 0.0 : h > 1.0 ? 1.0 : h));
        }
        printf("%4d %8.0f %15.3f %13.3f %12.3f %11.3f %11.3f %16.3f %8s %8.2f\n", r, x->rows, x->cells * 1e-6,
               x->compute_s * 1e3, x->progress_s * 1e3, x->wait_s * 1e3, x->total_s * 1e3, x->alone_s * 1e3, ov,
               x->compute_s > 0.0 ? x->flops / x->compute_s * 1e-9 : 0.0);
        wmax = fmax(wmax, x->cells), wsum += x->cells, cmax = fmax(cmax, x->compute_s), csum += x->compute_s;
        flops += x->flops, comp += x->compute_s, tmax = fmax(tmax, x->total_s);
    }
    printf("balance: largest/mean work %.3f, largest/mean kernel time %.3f; whole call %.3f ms, %.2f GFLOP/s in all\n",
           wsum > 0.0 ? wmax / (wsum / P) : 1.0, csum > 0.0 ? cmax / (csum / P) : 1.0, tmax * 1e3,
           tmax > 0.0 ? flops / tmax * 1e-9 : 0.0);
    if (P > 1 && res->ranks[0].alone_s > 0.0)
        printf("this machine's ring: %.2f GB/s per link (bytes sent by rank 0 / communication alone)\n",
               res->ranks[0].bytes / res->ranks[0].alone_s * 1e-9);
    // the model of one step, with this machine's measured kernel speed per rank
    const double R = comp > 0.0 ? flops / comp : 0.0;
    if (R <= 0.0) return;
    const double B = (double)o->batch, H = (double)o->heads, Hkv = (double)o->kv_heads;
    const double D = (double)o->head_dim, Dv = (double)o->head_dim_v;
    const double fpc = (res->backward ? 6.0 * D + 4.0 * Dv : 2.0 * (D + Dv)) * (o->causal ? 0.5 : 1.0);
    const double bytes = B * Hkv * (D + Dv) * 4.0 * (res->backward ? 2.0 : 1.0), lat = o->latency_us * 1e-6;
    const double a = B * H * fpc / R, lloc = (double)o->len / P;
    printf("model of one step at %.2f GFLOP/s per rank, %.0f us latency (Lloc = %.0f: computation %.3g ms):\n", R * 1e-9,
           o->latency_us, lloc, a * lloc * lloc * 1e3);
    const double bws[2] = {25e9, 200e9};
    for (int i = 0; i < 2; i++) {
        const double c = bytes / bws[i];
        printf("  %3.0f GB/s: transfer %.3g ms at Lloc = %.0f; hidden from Lloc >= %.0f (L >= %.0f on %d ranks)\n",
               bws[i] * 1e-9, (lat + c * lloc) * 1e3, lloc, ceil(crossover(a, c, lat)), ceil(crossover(a, c, lat)) * P, P);
    }
}

static void report_json(const bench *b) {
    const cpt_bench_opts *o = b->o;
    printf("{\"world\": %d, \"len\": %lld, \"batch\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"head_dim\": %lld, "
           "\"head_dim_v\": %lld, \"causal\": %s, \"threads\": %lld, \"kernels\": \"%s\", \"runs\": [",
           b->world, (long long)o->len, (long long)o->batch, (long long)o->heads, (long long)o->kv_heads,
           (long long)o->head_dim, (long long)o->head_dim_v, o->causal ? "true" : "false", (long long)o->threads,
           attn_isa_name(attn_ctx_isa(b->ctx)));
    for (int i = 0; i < b->n_res; i++) {
        const run_result *res = &b->res[i];
        printf("%s{\"layout\": \"%s\", \"pass\": \"%s\", \"ranks\": [", i ? ", " : "", res->layout,
               res->backward ? "backward" : "forward");
        for (int r = 0; r < b->world; r++) {
            const rank_row *x = &res->ranks[r];
            printf("%s{\"rows\": %.0f, \"pairs\": %.0f, \"flops\": %.0f, \"kernels_s\": %.6f, \"in_mpi_s\": %.6f, "
                   "\"wait_s\": %.6f, \"total_s\": %.6f, \"comm_alone_s\": %.6f, \"bytes_sent\": %.0f}",
                   r ? ", " : "", x->rows, x->cells, x->flops, x->compute_s, x->progress_s, x->wait_s, x->total_s,
                   x->alone_s, x->bytes);
        }
        printf("]}");
    }
    printf("]}\n");
}

// ---- entry ------------------------------------------------------------------------------------

int cpt_bench(const cpt_bench_opts *o) {
    bench b = {.o = o};
    MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &b.world);
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.n_threads = (int)o->threads;
    if (attn_isa_from_name(o->isa, &p.isa) != ATTN_OK) p.isa = ATTN_ISA_AUTO; // checked by the option parser
    attn_status e = attn_ctx_create(&p, &b.ctx);
    attn_cp_params cpp;
    attn_cp_params_init(&cpp);
    cpp.poll_rows = o->poll_rows;
    int bad = e != ATTN_OK, any = 0;
    if (bad) fail(&b, "context", attn_strerror(e));
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) {
        attn_ctx_free(b.ctx);
        return CPT_FAILURE;
    }
    e = attn_cp_create(MPI_COMM_WORLD, &cpp, &b.cp); // collective: fails on every rank or none
    if (e != ATTN_OK) {
        attn_ctx_free(b.ctx);
        return fail(&b, "attn_cp_create", attn_strerror(e));
    }
    if (b.rank == 0)
        printf("attn-cp bench: %d rank(s), L = %lld (B %lld, H %lld, Hkv %lld, D %lld, Dv %lld), %s, %lld thread(s) "
               "per rank, %s kernels, median of %lld\n",
               b.world, (long long)o->len, (long long)o->batch, (long long)o->heads, (long long)o->kv_heads,
               (long long)o->head_dim, (long long)o->head_dim_v, o->causal ? "causal" : "not causal",
               (long long)o->threads, attn_isa_name(attn_ctx_isa(b.ctx)), (long long)o->repeat);
    int rc = CPT_OK;
    const bool both = strcmp(o->layout, "both") == 0;
    if (both || strcmp(o->layout, "contiguous") == 0) rc = run_layout(&b, ATTN_CP_CONTIGUOUS);
    if (rc == CPT_OK && (both || strcmp(o->layout, "zigzag") == 0)) rc = run_layout(&b, ATTN_CP_ZIGZAG);
    if (b.rank == 0) {
        for (int i = 0; i < b.n_res; i++) report(&b, &b.res[i]);
        if (o->json && rc == CPT_OK) report_json(&b);
    }
    for (int i = 0; i < b.n_res; i++) free(b.res[i].ranks);
    attn_cp_free(b.cp);
    attn_ctx_free(b.ctx);
    return rc;
}

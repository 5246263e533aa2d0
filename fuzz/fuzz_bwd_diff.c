/*
 * fuzz_bwd_diff.c - differential fuzz target for the backward passes: attn_sdpa_bwd,
 * attn_mha_forward_train + attn_mha_backward and attn_book_forward_train + attn_book_backward,
 * through a context with the fused kernels (ATTN_ISA_AUTO, or now and then any other ISA the CPU
 * runs) against one with the scalar reference, ATTN_ISA_REF; sometimes a third context runs the
 * fused kernels with another thread count and must give the same bits.
 *
 * SDPA: the problems of fuzz_sdpa_diff.c (B, H, Hkv (GQA), L, S, D, Dv up to about 12, sometimes
 * long sequences over several kernel tiles or wide heads; q/k/v/out in permuted, padded layouts
 * whose length-1 dimensions may have any stride; masks of both dtypes broadcast by their strides,
 * rarely with strides that make cells share elements; key padding masks; every causal mode;
 * custom scales; dropout; local windows, ALiBi, soft-capping, float16/bfloat16 k and v), run
 * forward, then backward with a random dout; dmask is asked for with most F32 masks. The backward
 * reads the reference's out and log-sum-exp, or (one input in three) each context's own; the
 * dropout state is each context's generator copied before its forward.
 * Checks: every call succeeds; the forward draws exactly what F.dropout draws on (B*H, L, S)
 * (attn_rand_dropout on a copy of the state) and the backward draws nothing; dq, dk, dv, dmask
 * agree with the reference within a bound computed per element (see "Tolerances"); an element
 * that no visible (query, key) pair reaches (a fully masked row's dq, the dk and dv of a key no
 * query sees, dmask cells all hidden) is exactly 0; padding between rows is left untouched (dmask:
 * 0 between its cells, as attn.h says); with finite, moderate inputs every gradient is finite.
 *
 * nn.MultiheadAttention: tiny modules with every option (bias, add_bias_kv, add_zero_attn,
 * kdim/vdim, batch_first, dropout) and parameters from the constructor or random, inputs batched
 * or unbatched, key and value omitted, shared with the query (self-attention: the gradient of a
 * tensor used several times is the sum, in the first of them) or their own, masks of both dtypes
 * (2-D and 3-D), key padding masks, causal, need_weights, training. attn_mha_forward_train's
 * output and weights agree as in fuzz_sdpa_diff.c; attn_mha_backward's dquery, dkey, dvalue and
 * every parameter gradient (some left NULL) agree within a bound from the magnitudes of the
 * inputs, parameters and dout; `saved` is sometimes moved before the backward.
 *
 * The book's modules: every kind, checked like the MHA module (bwd_book).
 *
 * Packed batches (first bytes 156, 188, 220, 252): attn_sdpa_varlen_bwd against each sequence's
 * attn_sdpa_bwd alone on the same context, bit for bit (bwd_varlen).
 *
 * Known open bugs of the library can be steered around with ATTN_FUZZ_SKIP (fuzz_diff.h).
 */
#include "fuzz_diff.h"

/* Largest weight the fused kernels may flush to 0 (attn.h: weights below 2^-126 become 0 or
 * denormal): an absolute error of every weight. */
#define FLUSH 1.1754943508222875e-38 /* 2^-126 */

/* Finite inputs of at most this magnitude (and F32 mask values that are -inf or finite up to
 * TAME_MASK) must give finite gradients. */
#define TAME_VALUE 1e3
#define TAME_MASK 1e30

static int64_t off4(const int64_t s[4], int64_t a, int64_t b, int64_t c, int64_t d) {
    return a * s[0] + b * s[1] + c * s[2] + d * s[3];
}

/* Sets the stride of some length-1 dimensions to values no element is reached through (attn.h
 * accepts any stride there). */
static void scramble_unit_strides(pair *p, int nd, const int64_t *n, int64_t *s) {
    static const int64_t junk[] = {0, 1, 7, 1000003, (int64_t)1 << 40};
    for (int d = 0; d < nd; d++)
        if (n[d] == 1 && fuzz_data_chance(p->fd, 1, 4)) s[d] = junk[fuzz_data_pick(p->fd, 5)];
}

/* Sentinel of buffers the library writes, so untouched elements can be told apart. */
#define SENTINEL 0xCD

static float *sentinel_floats(int64_t n) {
    float *x = new_floats(n);
    memset(x, SENTINEL, (size_t)(n > 0 ? n : 1) * sizeof(float));
    return x;
}

static bool is_sentinel(const float *x) {
    uint8_t b[sizeof(float)];
    memcpy(b, x, sizeof b);
    for (size_t i = 0; i < sizeof b; i++)
        if (b[i] != SENTINEL) return false;
    return true;
}

static bool all_finite_within(const float *x, int64_t n, double lim) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]) || fabs((double)x[i]) > lim) return false;
    return true;
}

/* Where a gradient lives: per element of its buffer, whether the view reaches it, the error
 * bound and magnitude accumulated over the terms that reach it, and how many terms there are. */
typedef struct grad_bound {
    int64_t n;
    uint8_t *reached;
    double *err, *mag;
    int32_t *terms;
} grad_bound;

static void gb_init(grad_bound *g, int64_t n) {
    g->n = n;
    g->reached = fuzz_xmalloc((size_t)n);
    memset(g->reached, 0, (size_t)n);
    g->err = fuzz_xmalloc((size_t)n * sizeof(double));
    g->mag = fuzz_xmalloc((size_t)n * sizeof(double));
    g->terms = fuzz_xmalloc((size_t)n * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) g->err[i] = g->mag[i] = 0.0, g->terms[i] = 0;
}

static void gb_free(grad_bound *g) { free(g->reached), free(g->err), free(g->mag), free(g->terms); }

/* Marks the elements of a (n0, n1, n2, n3) view with strides s in `reached`. */
static void mark_reached(uint8_t *reached, const int64_t n[4], const int64_t s[4]) {
    for (int64_t a = 0; a < n[0]; a++)
        for (int64_t b = 0; b < n[1]; b++)
            for (int64_t c = 0; c < n[2]; c++)
                for (int64_t d = 0; d < n[3]; d++) reached[off4(s, a, b, c, d)] = 1;
}
static void gb_reach(grad_bound *g, const int64_t n[4], const int64_t s[4]) { mark_reached(g->reached, n, s); }

static void gb_add(grad_bound *g, int64_t e, double err, double mag) {
    g->err[e] += err, g->mag[e] += mag, g->terms[e]++;
}

/*
 * Compares a gradient buffer of the kernels (a) with the reference's (r), element by element:
 *  - an element the view does not reach (padding) holds the sentinel in both, except in dmask,
 *    which attn.h says is written over the mask's whole extent: there the elements between the
 *    view's first and last are 0 in both;
 *  - one no term reaches is exactly 0 in both (masked keys, fully masked rows, dropped weights
 *    and hidden cells are never read, as in the reference);
 *  - otherwise |a - r| <= REL_TOL |r| + ABS_TOL * mag + 2 * err (+ the float underflow), where
 *    err is the first-order error bound of the kernels' float arithmetic and mag the sum of the
 *    magnitudes of the terms; where the bound is not finite (non-finite inputs or weights the
 *    float exponent cannot pin down) the values are not compared.
 */
/* Float16/bfloat16 q, out and gradients (attn.h's bound of grad_dtype): each side rounds its result
 * to the type once (2 u of |ref| and the type's smallest subnormal), and the kernels take
 * D_i = dout_i . out_i from the stored, rounded out, which the reference computes from its own
 * weights: 4 u_o sum_t |dout_it out_it| more in D_i (out_round = 4 u_o), and where out is
 * subnormal in its type its rounding is absolute, up to half the smallest subnormal s_o
 * (out_round_abs = s_o); all 0 for float32. */
static double grad_round_rel, grad_round_abs, out_round, out_round_abs;
/* On the bf16 dot products (attn.h: attn_isa_bf16_dot, everything bf16, even head dims,
 * contiguous key and value rows, finite inputs) dS and P are rounded to bf16 before the products
 * that make dq, dk and dv: dot_round = 2^-8 of each term's magnitude; 0 otherwise. */
static double dot_round;

/* dq and dk are sums the kernels form before the scale multiplies them (attn.h): where the
 * unscaled magnitude (mag / |scale|, grad_unscale = 1 / |scale|) leaves the float range they may be
 * infinite, and are not compared. 0: no such limit (dv, dmask). */
static double grad_unscale;

/* The largest finite value of a gradient's type. */
static double type_largest(attn_dtype t) {
    return t == ATTN_DTYPE_F16 ? 65504.0 : t == ATTN_DTYPE_BF16 ? 0x1.fep127 : (double)FLT_MAX;
}

/* t: the type the kernels stored the gradient in. A result the type cannot hold rounds to an
 * infinity: one side infinite is within the tolerance where the other side's interval reaches the
 * type's largest value with that sign. */
static void compare_grad(const float *a, const float *r, const grad_bound *g, bool whole_extent, attn_dtype t,
                         const char *what) {
    int64_t last = -1; /* the view's last element */
    for (int64_t e = 0; e < g->n; e++)
        if (g->reached[e]) last = e;
    for (int64_t e = 0; e < g->n; e++) {
        if (!g->reached[e] && whole_extent && e < last) {
            FUZZ_CHECK(a[e] == 0.0f && r[e] == 0.0f,
                       "%s[%lld] lies between the view's elements but is not 0 (%g, %g) in %s", what, (long long)e,
                       (double)a[e], (double)r[e], problem);
            continue;
        }
        if (!g->reached[e]) {
            FUZZ_CHECK(is_sentinel(&a[e]) && is_sentinel(&r[e]), "%s[%lld] is padding but was written (%g, %g) in %s",
                       what, (long long)e, (double)a[e], (double)r[e], problem);
            continue;
        }
        if (g->terms[e] == 0) {
            FUZZ_CHECK(a[e] == 0.0f && r[e] == 0.0f, "%s[%lld] has no visible term: kernels %.9g, reference %.9g in %s",
                       what, (long long)e, (double)a[e], (double)r[e], problem);
            continue;
        }
        const double tol_abs = ABS_TOL * g->mag[e] + 2.0 * g->err[e];
        if (!isfinite(tol_abs) || g->mag[e] * grad_unscale > (double)FLT_MAX / 16.0) continue;
        const double rel = REL_TOL + grad_round_rel, abs_tol = tol_abs + UNDERFLOW_TOL + grad_round_abs;
        if (isinf(a[e]) != isinf(r[e]) && !isnan(a[e]) && !isnan(r[e])) {
            const float fin = isinf(a[e]) ? r[e] : a[e], inf = isinf(a[e]) ? a[e] : r[e];
            const double reach = abs_tol + rel * fabs((double)fin);
            if (inf > 0 ? (double)fin + reach >= type_largest(t) : (double)fin - reach <= -type_largest(t)) continue;
        }
        FUZZ_CHECK(fuzz_close(a[e], r[e], rel, abs_tol),
                   "%s[%lld]: kernels %.9g, reference %.9g (tolerance %g + %g |ref|, magnitude %g) in %s", what,
                   (long long)e, (double)a[e], (double)r[e], tol_abs, REL_TOL, g->mag[e], problem);
    }
}

/* A buffer the library wrote in half type t (first n 16-bit elements) as floats in place: the
 * reached elements' values, the unreached ones the float sentinel if their half sentinel is intact
 * (else a value compare_grad reports as written padding). */
static void widen(float *x, int64_t n, attn_dtype t, const uint8_t *reached) {
    uint16_t *h = fuzz_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(uint16_t));
    memcpy(h, x, (size_t)n * sizeof(uint16_t));
    for (int64_t e = 0; e < n; e++) {
        if (reached == NULL || reached[e]) x[e] = (float)half_value(t, h[e]);
        else if (h[e] == (SENTINEL << 8 | SENTINEL)) memset(&x[e], SENTINEL, sizeof x[e]);
        else x[e] = 0.5f; /* not the sentinel: written padding */
    }
    free(h);
}

/* Finite, moderate inputs give finite gradients, except where the gradient's type cannot hold
 * them: an element stored in a half type (t) may round to infinity where its bound (mag + err)
 * reaches the type's largest value (float16: 65504, from inputs of +-1e3 as well). */
static void check_finite_grad(const float *x, const grad_bound *g, attn_dtype t, int c, const char *what) {
    for (int64_t e = 0; e < g->n; e++)
        FUZZ_CHECK(!g->reached[e] || isfinite(x[e]) || g->mag[e] + g->err[e] >= type_largest(t),
                   "%s[%lld] = %g from finite, moderate inputs (context %d; its bound %g) in %s", what, (long long)e,
                   (double)x[e], c, g->mag[e] + g->err[e], problem);
}

/* ---- SDPA ------------------------------------------------------------------------------------ */

/* The score rule of attn.h (as the reference applies it): -inf when causal masking, the local
 * window or any mask term blocks the key; else cap(scale * q.k) + ALiBi + the mask terms. Also the
 * magnitudes the float arithmetic works on: |scale| * sum |q_t k_t| (*dot_mag), and in *mask_mag
 * those of the mask and ALiBi terms plus 6 times the soft cap (the error of the kernels' tanh is
 * about 16 U times the cap; the bounds take 3 U of *mask_mag); *dcap = d score / d (scale q.k). */
typedef struct sdpa_problem {
    const attn_sdpa_desc *d;
    int64_t B, H, Hkv, G, L, S, D, Dv;
    double scale;
    const float *q, *k, *v;
} sdpa_problem;

static double mask_term(const void *m, attn_dtype dt, int64_t off) {
    if (dt == ATTN_DTYPE_BOOL) return ((const uint8_t *)m)[off] ? -INFINITY : 0.0;
    return (double)((const float *)m)[off];
}

static double score(const sdpa_problem *P, int64_t b, int64_t h, int64_t i, int64_t j, double *dot_mag,
                    double *mask_mag, double *dcap) {
    const attn_sdpa_desc *d = P->d;
    *dot_mag = *mask_mag = 0.0, *dcap = 1.0;
    const int64_t off = d->causal == ATTN_CAUSAL_BOTTOM_RIGHT ? P->S - P->L : 0; /* query i's diagonal key */
    if (d->causal != ATTN_CAUSAL_NONE && j > i + off) return -INFINITY;
    if (d->use_window && d->window_left >= 0 && j < i + off - d->window_left) return -INFINITY;
    if (d->use_window && d->window_right >= 0 && j > i + off + d->window_right) return -INFINITY;
    double bias = 0.0;
    if (d->mask != NULL) {
        const double t = mask_term(d->mask, d->mask_dtype, off4(d->mask_stride, b, h, i, j));
        if (t == -INFINITY) return -INFINITY;
        bias += t, *mask_mag += fabs(t);
    }
    if (d->key_padding_mask != NULL) {
        const int64_t ks[4] = {d->key_padding_mask_stride[0], d->key_padding_mask_stride[1], 0, 0};
        const double t = mask_term(d->key_padding_mask, d->key_padding_mask_dtype, off4(ks, b, j, 0, 0));
        if (t == -INFINITY) return -INFINITY;
        bias += t, *mask_mag += fabs(t);
    }
    const int64_t hk = h / P->G;
    double dot = 0.0, mag = 0.0;
    for (int64_t t = 0; t < P->D; t++) {
        const double x = (double)P->q[off4(d->q_stride, b, h, i, t)] * (double)P->k[off4(d->k_stride, b, hk, j, t)];
        dot += x, mag += fabs(x);
    }
    *dot_mag = fabs(P->scale) * mag;
    double sc = P->scale * dot;
    if (d->softcap > 0.0f) {
        const double c = (double)d->softcap, th = tanh(sc / c);
        sc = c * th, *dcap = 1.0 - th * th;
        *mask_mag += 6.0 * c;
    }
    if (d->alibi_slopes != NULL) {
        const double a = -(double)d->alibi_slopes[h] * (double)(i + off - j < 0 ? j - i - off : i + off - j);
        sc += a, *mask_mag += fabs(a);
    }
    return sc + bias;
}

/*
 * Tolerances of the backward, per element, in double. For a row (b, h, i) with weights p_j
 * (the reference's, before dropout), dropout noise c_j (0 or 1/(1-p)), dp_j = c_j dout.v_j and
 * rowdot = sum_j p_j dp_j, the exact gradients are dS_j = p_j (dp_j - rowdot),
 * dq = scale sum_j dS_j k_j, dk_j = scale sum dS_j q (over the rows and the heads sharing the kv
 * head), dv_j = sum c_j p_j dout, dmask = sum dS over the cells an element stands for.
 * The fused kernels recompute p from the float scores and the forward's float log-sum-exp:
 * P = exp2(s*log2e - lse*log2e). With U = 2^-24 their exponent is off by at most
 *   delta_j = (D+4) U |scale| sum|q k| + 3 U |mask terms| + 2 U |s_j| + 3 U |lse| + U |s_j - lse|
 *             + (error of the lse given) + 4 U (exp2's polynomial),
 * so |P - p| <= p expm1(delta_j) + 2^-126 (flushed weights). Note the U |lse| terms: a row whose
 * visible scores are all huge (an additive mask of -1e9 on each) has no accurate float P at all.
 * dP is a float dot product of Dv terms: |error| <= (Dv+2) U c sum|dout v|; rowdot = dout.out in
 * double from the float out: |error| <= 2 U sum|dout out| + sum|dout| |error of out|. Then
 *   |error of dS_j| <= |P - p| |dp_j - rowdot| + P (|error of dP_j| + |error of rowdot|) + 2 U |dS_j|,
 * and each gradient sums n terms in float: |error| <= sum |error of term| + (n+2) U sum |term|.
 * The out and lse given are the reference's (rounded to float: U |x|) or the kernels' own, whose
 * error is bounded the same way (the forward's weights are off by the forward's exponent error).
 */
typedef struct sdpa_bounds {
    grad_bound dq, dk, dv, dm;
} sdpa_bounds;

/* Magnitudes from which the kernels' float arithmetic may overflow where the reference's double
 * does not: intermediate scores, dP, rowdot and gradient sums past this are not compared. */
#define FLOAT_BIG ((double)FLT_MAX / 64.0)

/* Fills the bounds; returns whether some intermediate of the kernels may leave the float range. */
static bool sdpa_bwd_bounds(const sdpa_problem *P, const float *noise, const float *out, const float *dout,
                            bool own_forward, int64_t cm, sdpa_bounds *gb) {
    bool overflow = false;
    const attn_sdpa_desc *d = P->d;
    const int64_t B = P->B, H = P->H, L = P->L, S = P->S, D = P->D, Dv = P->Dv, G = P->G;
    double *s = fuzz_xmalloc((size_t)S * sizeof(double)), *pw = fuzz_xmalloc((size_t)S * sizeof(double));
    double *sm = fuzz_xmalloc((size_t)S * sizeof(double)), *bm = fuzz_xmalloc((size_t)S * sizeof(double));
    double *dp = fuzz_xmalloc((size_t)S * sizeof(double)), *dpm = fuzz_xmalloc((size_t)S * sizeof(double));
    double *dc = fuzz_xmalloc((size_t)S * sizeof(double));
    double *dout_err = fuzz_xmalloc((size_t)Dv * sizeof(double));
    bool *term = fuzz_xmalloc((size_t)S);
    int32_t *cells = NULL; /* how many (b, h, i, j) cells share each dmask element */
    if (gb->dm.n > 0) {
        cells = fuzz_xmalloc((size_t)cm * sizeof(int32_t));
        for (int64_t e = 0; e < cm; e++) cells[e] = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < L; i++)
                    for (int64_t j = 0; j < S; j++) cells[off4(d->mask_stride, b, h, i, j)]++;
    }
    const double aq = fabs(P->scale);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t hk = h / G;
            for (int64_t i = 0; i < L; i++) {
                /* the reference's weights of the row */
                double max = -INFINITY;
                bool has_nan = false;
                for (int64_t j = 0; j < S; j++) {
                    s[j] = score(P, b, h, i, j, &sm[j], &bm[j], &dc[j]);
                    if (s[j] == -INFINITY) continue;
                    if (isnan(s[j]))
                        has_nan = true;
                    else if (s[j] > max)
                        max = s[j];
                }
                /* the head's sink: one more term of the sum (NaN or +inf: a NaN row) */
                const double z = d->sinks != NULL ? (double)d->sinks[h] : -INFINITY;
                has_nan = has_nan || isnan(z) || z == INFINITY;
                const double top = z > max ? z : max;
                double sum = z == -INFINITY || has_nan ? 0.0 : exp(z - top);
                if (!has_nan && top != -INFINITY)
                    for (int64_t j = 0; j < S; j++) sum += s[j] == -INFINITY ? 0.0 : exp(s[j] - top);
                const double lse = has_nan ? NAN : top == -INFINITY ? -INFINITY : top + log(sum);
                const float *c_row = noise != NULL ? noise + ((b * H + h) * L + i) * S : NULL;
                /* a term for every key the row reads: visible ones, and every key of a NaN row */
                double pdp = 0.0, delta_max = 0.0;
                for (int64_t j = 0; j < S; j++) {
                    term[j] = has_nan || s[j] != -INFINITY;
                    pw[j] = has_nan ? NAN : !term[j] ? 0.0 : exp(s[j] - top) / sum;
                    dp[j] = dpm[j] = 0.0;
                    if (!term[j]) continue;
                    const double cj = c_row != NULL ? (double)c_row[j] : 1.0;
                    if (cj != 0.0) {
                        double dot = 0.0, mag = 0.0;
                        for (int64_t t = 0; t < Dv; t++) {
                            const double x = (double)dout[off4(d->o_stride, b, h, i, t)] *
                                             (double)P->v[off4(d->v_stride, b, hk, j, t)];
                            dot += x, mag += fabs(x);
                        }
                        dp[j] = cj * dot, dpm[j] = cj * mag;
                    }
                    if (pw[j] != 0.0) pdp += pw[j] * dp[j];
                    const double dj = (double)(D + 4) * U * sm[j] + 3.0 * U * bm[j] + 2.0 * U * fabs(s[j]) + 4.0 * U;
                    if (dj > delta_max || isnan(dj)) delta_max = dj;
                }
                if (has_nan) pdp = NAN;
                bool any = false;
                for (int64_t j = 0; j < S; j++) any = any || term[j];
                if (!any) continue; /* fully masked: the row contributes nothing */
                /* the error of the lse and out given */
                const double lse_err = own_forward ? delta_max + 3.0 * U * fabs(lse) + (double)(S + 4) * U
                                                   : U * fabs(lse);
                double rowdot_mag = 0.0, rowdot_err = 0.0;
                for (int64_t t = 0; t < Dv; t++) dout_err[t] = 0.0;
                for (int64_t t = 0; t < Dv; t++) {
                    const double o = (double)out[off4(d->o_stride, b, h, i, t)];
                    const double g = fabs((double)dout[off4(d->o_stride, b, h, i, t)]);
                    rowdot_mag += g * fabs(o);
                    double oerr = U * fabs(o) + out_round_abs; /* a subnormal out's rounding is absolute */
                    if (!own_forward) { /* the reference's out: float weights times the float dropout
                                         * noise (2 U each, of the terms' magnitudes, where out's terms
                                         * may cancel), then summed in double and rounded (U |o|); a
                                         * weight past float's range (below about 2^-149) is 0 there,
                                         * where the backward's reference sums p dp from double
                                         * weights (FLUSH, the kernels' margin, bounds it) */
                        for (int64_t j = 0; j < S; j++) {
                            if (!term[j]) continue;
                            const double cj = c_row != NULL ? (double)c_row[j] : 1.0;
                            oerr += cj * (2.0 * U * pw[j] + FLUSH) * fabs((double)P->v[off4(d->v_stride, b, hk, j, t)]);
                        }
                    }
                    if (own_forward) { /* the forward's weights are off by its own exponent error */
                        for (int64_t j = 0; j < S; j++) {
                            if (!term[j]) continue;
                            const double cj = c_row != NULL ? (double)c_row[j] : 1.0;
                            const double dfj = (double)(D + 4) * U * sm[j] + 3.0 * U * bm[j] + 2.0 * U * fabs(s[j]) +
                                               delta_max + (double)(S + 8) * U;
                            const double vv = fabs((double)P->v[off4(d->v_stride, b, hk, j, t)]);
                            if (cj != 0.0)
                                oerr += cj * (pw[j] * expm1(dfj) + FLUSH) * vv + (double)(S + 2) * U * cj * pw[j] * vv;
                        }
                    }
                    rowdot_err += g * oerr;
                }
                rowdot_err += (2.0 * U + out_round) * rowdot_mag;
                overflow = overflow || rowdot_mag > FLOAT_BIG;
                for (int64_t j = 0; j < S; j++)
                    overflow = overflow || (term[j] && (sm[j] + bm[j] > FLOAT_BIG || dpm[j] > FLOAT_BIG));
                for (int64_t j = 0; j < S; j++) {
                    if (!term[j]) continue;
                    const double cj = c_row != NULL ? (double)c_row[j] : 1.0;
                    const double delta = (double)(D + 4) * U * sm[j] + 3.0 * U * bm[j] + 2.0 * U * fabs(s[j]) +
                                         3.0 * U * fabs(lse) + U * fabs(s[j] - lse) + lse_err + 4.0 * U;
                    double dP = pw[j] * expm1(delta) + FLUSH; /* |P - p| */
                    if (delta > 1.0 && s[j] != -INFINITY) dP += exp(fmin(s[j] - lse + delta, 700.0));
                    const double p_hi = pw[j] + dP;
                    const double ddp = (double)(Dv + 2) * U * dpm[j];
                    const double dS_mag = p_hi * (fabs(dp[j]) + fabs(pdp) + ddp + rowdot_err);
                    const double dS_err = dP * fabs(dp[j] - pdp) + p_hi * (ddp + rowdot_err) + 2.0 * U * dS_mag;
                    /* through the soft cap to q.k: times 1 - tanh^2(z), z = s / c, which the kernels'
                     * tanh gets within about 16 U at their z; the float score's error e moves the
                     * factor by at most 0.77 e / c more (attn.h: the largest slope of 1 - tanh^2,
                     * not the slope at z: a score error past the cap, e / c >> 1, can move it from 1
                     * to 0, and it never moves by more than 1) */
                    const double cap_err = d->softcap > 0.0f
                                               ? 16.0 * U + fmin(1.0, 0.77 * ((double)(D + 4) * U * sm[j] + 2.0 * U) / (double)d->softcap)
                                               : 0.0;
                    const double dSq_mag = dS_mag * (dc[j] + cap_err), dSq_err = dS_err * dc[j] + dS_mag * cap_err;
                    for (int64_t t = 0; t < D; t++) {
                        const double kk = fabs((double)P->k[off4(d->k_stride, b, hk, j, t)]);
                        const double qq = fabs((double)P->q[off4(d->q_stride, b, h, i, t)]);
                        gb_add(&gb->dq, off4(d->q_stride, b, h, i, t),
                               aq * (dSq_err * kk + ((double)(S + 2) * U + dot_round) * dSq_mag * kk), aq * dSq_mag * kk);
                        gb_add(&gb->dk, off4(d->k_stride, b, hk, j, t),
                               aq * (dSq_err * qq + ((double)(G * L + 2) * U + dot_round) * dSq_mag * qq),
                               aq * dSq_mag * qq);
                    }
                    if (cj != 0.0)
                        for (int64_t t = 0; t < Dv; t++) {
                            const double g = fabs((double)dout[off4(d->o_stride, b, h, i, t)]);
                            gb_add(&gb->dv, off4(d->v_stride, b, hk, j, t),
                                   cj * dP * g + ((double)(G * L + 2) * U + dot_round) * cj * p_hi * g, cj * p_hi * g);
                        }
                    if (gb->dm.n > 0) {
                        const int64_t e = off4(d->mask_stride, b, h, i, j);
                        gb_add(&gb->dm, e, dS_err + (double)(cells[e] + 2) * U * dS_mag, dS_mag);
                    }
                }
            }
        }
    free(s), free(pw), free(sm), free(bm), free(dp), free(dpm), free(dc), free(dout_err), free(term), free(cells);
    const grad_bound *all[4] = {&gb->dq, &gb->dk, &gb->dv, &gb->dm};
    for (int g = 0; g < 4; g++)
        for (int64_t e = 0; e < all[g]->n; e++) overflow = overflow || all[g]->mag[e] > FLOAT_BIG;
    return overflow;
}

/* The Philox mask of d's (B, H, L, S) cells as noise (0, or float(1 / float(1 - p)) where kept), read
 * through the weights output of a forward on zero q, k and v with no masks (every weight 1/S before
 * the dropout): the public API's view of the mask attn.h defines. */
/* Element off of x, of type t, as a double. */
static double elem_at(const void *x, attn_dtype t, int64_t off) {
    return t == ATTN_DTYPE_F32 ? (double)((const float *)x)[off] : half_value(t, ((const uint16_t *)x)[off]);
}

/* attn_sdpa_sinks_bwd's sums as attn.h states them, in its order: for each head, the rows (b, i) of
 * a (B, H, L) problem (a packed batch: B = 1, L = total_q, o_stride[0] unused), each adding
 * -exp(z - lse) dout.out unless the sink's weight is 0. The library's result must have these bits. */
static void sinks_grad_model(const attn_sdpa_desc *d, int64_t B, int64_t L, const void *out, const void *dout,
                             const float *lse, float *dz) {
    const int64_t H = d->n_heads, Dv = d->head_dim_v != 0 ? d->head_dim_v : d->head_dim;
    for (int64_t h = 0; h < H; h++) {
        const double z = (double)d->sinks[h];
        double acc = 0.0;
        for (int64_t b = 0; b < B && z != -INFINITY; b++)
            for (int64_t i = 0; i < L; i++) {
                const double w = exp(z - (double)lse[(b * H + h) * L + i]);
                if (w == 0.0) continue;
                double dot = 0.0;
                for (int64_t t = 0; t < Dv; t++) {
                    const int64_t o = (B > 1 ? b * d->o_stride[0] : 0) + h * d->o_stride[1] + i * d->o_stride[2] +
                                      t * d->o_stride[3];
                    dot += elem_at(dout, d->out_dtype, o) * elem_at(out, d->out_dtype, o);
                }
                acc -= w * dot;
            }
        dz[h] = (float)acc;
    }
}

/* The sinks' gradient on ctx against sinks_grad_model, bit for bit (any NaN for a NaN; pb: the
 * packed batch, or NULL for (B, H, L) tensors). */
static void check_sinks_grad(attn_ctx *ctx, const attn_sdpa_desc *d, const packed_batch *pb, int64_t B, int64_t L,
                             const void *out, const void *dout, const float *lse) {
    if (d->sinks == NULL) return;
    const int64_t H = d->n_heads;
    float *got = sentinel_floats(H), *want = new_floats(H);
    const attn_status st = attn_sdpa_sinks_bwd(ctx, d, pb != NULL ? pb->cu_q : NULL, pb != NULL ? pb->cu_k : NULL, out,
                                               dout, lse, got);
    fuzz_check_error(ctx, st, "attn_sdpa_sinks_bwd");
    FUZZ_CHECK(st == ATTN_OK, "attn_sdpa_sinks_bwd: %s in %s", attn_ctx_last_error(ctx), problem);
    sinks_grad_model(d, B, L, out, dout, lse, want);
    for (int64_t h = 0; h < H; h++)
        FUZZ_CHECK((isnan(got[h]) && isnan(want[h])) || memcmp(&got[h], &want[h], sizeof(float)) == 0,
                   "dsinks[%lld] = %.9g, want %.9g (attn.h's sum) in %s",
                   (long long)h, (double)got[h], (double)want[h], problem);
    free(got), free(want);
}

static void philox_noise(pair *p, const attn_sdpa_desc *d, int64_t B, int64_t H, int64_t L, int64_t S, float *noise) {
    attn_sdpa_desc z;
    attn_sdpa_desc_init(&z);
    z.batch = B, z.n_heads = H, z.len_q = L, z.len_kv = S, z.head_dim = 1;
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, L, 1, z.q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, S, 1, z.k_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, S, 1, z.v_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, L, 1, z.o_stride);
    z.dropout_p = d->dropout_p, z.dropout_rng = d->dropout_rng, z.dropout_seed = d->dropout_seed;
    z.dropout_offset = d->dropout_offset, z.weights_mode = ATTN_WEIGHTS_PER_HEAD;
    float *zq = calloc((size_t)(B * H * L), sizeof(float)), *zk = calloc((size_t)(B * H * S), sizeof(float));
    float *zo = new_floats(B * H * L);
    FUZZ_CHECK(zq != NULL && zk != NULL, "out of memory");
    FUZZ_CHECK(attn_sdpa_fwd(p->ctx[0], &z, zq, zk, zk, zo, NULL, noise) == ATTN_OK, "the Philox mask: %s",
               attn_ctx_last_error(p->ctx[0]));
    const float keep = d->dropout_p < 1.0 ? 1.0f / (float)(1.0 - d->dropout_p) : 0.0f;
    for (int64_t e = 0; e < B * H * L * S; e++) noise[e] = noise[e] != 0.0f ? keep : 0.0f;
    free(zq), free(zk), free(zo);
}

static void bwd_sdpa(pair *p) {
    fuzz_data *fd = p->fd;
    attn_sdpa_desc d;
    const sdpa_shape z = decode_sdpa_shape(p, &d, 150, 150000, 30000);
    const int64_t B = z.B, H = z.H, Hkv = z.Hkv, G = z.G, L = z.L, S = z.S, D = z.D, Dv = z.Dv;
    /* Gradients are written at the inputs' strides: no broadcast inputs (attn.h), but any stride
     * on a dimension of length 1. */
    const int64_t nq[4] = {B, H, L, D}, nk[4] = {B, Hkv, S, D}, nv[4] = {B, Hkv, S, Dv}, no[4] = {B, H, L, Dv};
    const int64_t cq = layout(p, 4, nq, 0, d.q_stride), ck = layout(p, 4, nk, 0, d.k_stride);
    const int64_t cv = layout(p, 4, nv, 0, d.v_stride), co = layout(p, 4, no, 0, d.o_stride);
    scramble_unit_strides(p, 4, nq, d.q_stride);
    scramble_unit_strides(p, 4, nk, d.k_stride);
    scramble_unit_strides(p, 4, nv, d.v_stride);
    scramble_unit_strides(p, 4, no, d.o_stride);
    d.scale = decode_scale(fd);
    if (!isfinite(d.scale)) d.scale = 0.0f; /* attn.h: any finite value */
    d.causal = (attn_causal)fuzz_data_pick(fd, 3);
    if (fuzz_data_chance(fd, 1, 4)) d.dropout_p = fuzz_data_chance(fd, 1, 16) ? 1.0 : fuzz_data_unit(fd) * 0.95;
    const bool own_forward_drawn = fuzz_data_chance(fd, 1, 3);
    const attn_weights_mode bwd_weights_mode = (attn_weights_mode)fuzz_data_pick(fd, 3); /* ignored by the bwd */

    const float amp = pick_amp(p), gamp = pick_amp(p);
    float *q = new_floats(cq), *k = new_floats(ck), *v = new_floats(cv), *dout = new_floats(co);
    fill(p, q, cq, amp);
    fill(p, k, ck, amp);
    fill(p, v, cv, amp);
    fill(p, dout, co, gamp);
    void *mask = NULL, *kpm = NULL;
    int64_t cm = 0;
    bool want_dmask = false, overlapping = false;
    if (fuzz_data_chance(fd, 1, 2)) {
        d.mask_dtype = fuzz_data_bool(fd) ? ATTN_DTYPE_F32 : ATTN_DTYPE_BOOL;
        const int64_t nm[4] = {B, H, L, S};
        overlapping = fuzz_data_chance(fd, 1, 16);
        if (overlapping) { /* strides under which cells share elements */
            for (int i = 0; i < 4; i++) d.mask_stride[i] = fuzz_data_i64_range(fd, 0, 3);
            cm = layout_elems(d.mask_stride, B, H, L, S);
        } else {
            cm = layout(p, 4, nm, 8, d.mask_stride);
        }
        scramble_unit_strides(p, 4, nm, d.mask_stride);
        mask = fuzz_xmalloc((size_t)cm * attn_dtype_size(d.mask_dtype));
        fill_mask(p, mask, cm, d.mask_dtype);
        d.mask = mask;
        want_dmask = d.mask_dtype == ATTN_DTYPE_F32 && fuzz_data_chance(fd, 3, 4);
    }
    kpm = decode_key_padding_mask(p, &d);
    sdpa_extras ex;
    decode_extras(p, &d, &ex);
    kv_for_dtype(p, &d, k, ck, v, cv, &ex);
    const void *kin = ex.kh != NULL ? (const void *)ex.kh : k, *vin = ex.vh != NULL ? (const void *)ex.vh : v;
    /* q, out, dout and the gradients in float16 or bfloat16 now and then (drawn last: older inputs
     * decode as they did); q and dout then hold the values their half copies denote, and both
     * backwards take the reference's forward (its out rounded once, the same for both). */
    attn_dtype gt = ATTN_DTYPE_F32;
    if (fuzz_data_chance(fd, 1, 4)) gt = fuzz_data_bool(fd) ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
    uint16_t *qh = gt != ATTN_DTYPE_F32 ? to_half(p, gt, q, cq) : NULL;
    uint16_t *douth = gt != ATTN_DTYPE_F32 ? to_half(p, gt, dout, co) : NULL;
    d.q_dtype = d.out_dtype = d.grad_dtype = gt;
    const void *qin = qh != NULL ? (const void *)qh : q, *doutin = douth != NULL ? (const void *)douth : dout;
    const bool own_forward = own_forward_drawn && gt == ATTN_DTYPE_F32;
    /* Philox dropout now and then (drawn after the types): the mask from the descriptor alone */
    const bool philox = d.dropout_p > 0.0 && fuzz_data_chance(fd, 1, 3);
    if (philox) d.dropout_rng = ATTN_DROPOUT_RNG_PHILOX, d.dropout_seed = fuzz_data_u64(fd), d.dropout_offset = fuzz_data_u32(fd);
    decode_sinks(p, &d, &ex);
    grad_round_rel = gt == ATTN_DTYPE_BF16 ? 0x1p-7 : gt == ATTN_DTYPE_F16 ? 0x1p-10 : 0.0;
    grad_round_abs = gt == ATTN_DTYPE_BF16 ? 0x1p-133 : gt == ATTN_DTYPE_F16 ? 0x1p-24 : 0.0;
    out_round = gt == ATTN_DTYPE_BF16 ? 0x1p-6 : gt == ATTN_DTYPE_F16 ? 0x1p-9 : 0.0;
    out_round_abs = grad_round_abs;
    dot_round = attn_isa_bf16_dot(attn_ctx_isa(p->ctx[0])) && gt == ATTN_DTYPE_BF16 &&
                        d.kv_dtype == ATTN_DTYPE_BF16 && D % 2 == 0 && Dv % 2 == 0 && d.k_stride[3] == 1 &&
                        d.v_stride[3] == 1
                    ? 0x1p-8
                    : 0.0;
    char extras[160];
    describe_extras(&d, extras, sizeof extras);
    snprintf(problem, sizeof problem,
             "sdpa_bwd q/out/grad=%s B=%lld H=%lld Hkv=%lld L=%lld S=%lld D=%lld Dv=%lld scale=%g causal=%d mask=%s%s kpm=%s "
             "mask_stride={%lld,%lld,%lld,%lld}%s dropout=%g%s own_forward=%d%s non-finite q/k/v/dout=%d/%d/%d/%d isa=%s "
             "threads=%d/%d/%d",
             attn_dtype_name(gt), (long long)B, (long long)H, (long long)Hkv, (long long)L, (long long)S, (long long)D,
             (long long)Dv, (double)d.scale, (int)d.causal, d.mask == NULL ? "none" : attn_dtype_name(d.mask_dtype),
             want_dmask ? "+dmask" : "", d.key_padding_mask == NULL ? "none" : attn_dtype_name(d.key_padding_mask_dtype),
             (long long)d.mask_stride[0], (long long)d.mask_stride[1], (long long)d.mask_stride[2],
             (long long)d.mask_stride[3], overlapping ? " (cells share elements)" : "", d.dropout_p, philox ? " (Philox)" : "", own_forward, extras, any_nonfinite(q, cq), any_nonfinite(k, ck),
             any_nonfinite(v, cv), any_nonfinite(dout, co), attn_isa_name(attn_ctx_isa(p->ctx[0])), p->threads[0],
             p->threads[1], p->n == 3 ? p->threads[2] : 0);

    /* ---- forward on every context, each generator copied first ---- */
    const int64_t nl = B * H * L, ncell = B * H * L * S;
    float *out[3] = {NULL, NULL, NULL}, *lse[3] = {NULL, NULL, NULL};
    attn_generator g0[3];
    attn_status st[3];
    for (int c = 0; c < p->n; c++) {
        g0[c] = *attn_ctx_generator(p->ctx[c]);
        out[c] = sentinel_floats(co), lse[c] = sentinel_floats(nl);
        st[c] = attn_sdpa_fwd(p->ctx[c], &d, qin, kin, vin, out[c], lse[c], NULL);
    }
    compare_status(p, st, "attn_sdpa_fwd");
    FUZZ_CHECK(st[0] == ATTN_OK, "attn_sdpa_fwd: %s in %s", attn_ctx_last_error(p->ctx[0]), problem);
    compare_generators(p);
    /* The forward's dropout is F.dropout on the (B*H, L, S) weights: the same draws as
     * attn_rand_dropout on as many elements, whose noise (0 or 1/(1-p)) the bounds use. */
    float *noise = NULL;
    if (philox) {
        noise = new_floats(ncell);
        philox_noise(p, &d, B, H, L, S, noise);
        for (int c = 0; c < p->n; c++)
            FUZZ_CHECK(memcmp(&g0[c], attn_ctx_generator(p->ctx[c]), sizeof g0[c]) == 0,
                       "the Philox forward moved the context's generator in %s", problem);
    } else if (d.dropout_p > 0.0) {
        float *ones = new_floats(ncell);
        noise = new_floats(ncell);
        for (int64_t e = 0; e < ncell; e++) ones[e] = 1.0f;
        attn_generator g = g0[1];
        FUZZ_CHECK(attn_rand_dropout(&g, ones, noise, ncell, d.dropout_p) == ATTN_OK, "attn_rand_dropout");
        const attn_generator *after = attn_ctx_generator(p->ctx[1]);
        FUZZ_CHECK(memcmp(g.mt, after->mt, sizeof g.mt) == 0 && g.left == after->left && g.next == after->next,
                   "the forward did not draw what F.dropout draws on %lld weights in %s", (long long)ncell, problem);
        free(ones);
    }

    /* ---- backward ---- */
    attn_sdpa_desc db = d;
    db.weights_mode = bwd_weights_mode;
    float *dq[3] = {NULL, NULL, NULL}, *dk[3] = {NULL, NULL, NULL}, *dv[3] = {NULL, NULL, NULL};
    float *dm[3] = {NULL, NULL, NULL};
    for (int c = 0; c < p->n; c++) {
        const int src = own_forward ? c : 1;
        dq[c] = sentinel_floats(cq), dk[c] = sentinel_floats(ck), dv[c] = sentinel_floats(cv);
        if (want_dmask) dm[c] = sentinel_floats(cm);
        const attn_generator before = *attn_ctx_generator(p->ctx[c]), state = g0[c];
        st[c] = attn_sdpa_bwd(p->ctx[c], &db, qin, kin, vin, out[src], doutin, lse[src],
                              d.dropout_p > 0.0 && !philox ? &g0[c] : NULL, dq[c], dk[c], dv[c], dm[c]);
        FUZZ_CHECK(memcmp(&before, attn_ctx_generator(p->ctx[c]), sizeof before) == 0,
                   "attn_sdpa_bwd drew from the context's generator (context %d)", c);
        FUZZ_CHECK(memcmp(&state, &g0[c], sizeof state) == 0, "attn_sdpa_bwd changed the dropout state");
    }
    compare_status(p, st, "attn_sdpa_bwd");
    FUZZ_CHECK(st[0] == ATTN_OK, "attn_sdpa_bwd: %s in %s", attn_ctx_last_error(p->ctx[0]), problem);
    for (int c = 0; c < p->n; c++) {
        const int src = own_forward ? c : 1;
        check_sinks_grad(p->ctx[c], &d, NULL, B, L, out[src], doutin, lse[src]);
    }

    /* ---- comparisons ---- */
    sdpa_problem P = {&d, B, H, Hkv, G, L, S, D, Dv, 0.0, q, k, v};
    P.scale = d.scale != 0.0f ? (double)d.scale : (double)(float)(1.0 / sqrt((double)D));
    sdpa_bounds gb;
    gb_init(&gb.dq, cq), gb_init(&gb.dk, ck), gb_init(&gb.dv, cv);
    gb_init(&gb.dm, want_dmask ? cm : 0);
    gb_reach(&gb.dq, nq, d.q_stride), gb_reach(&gb.dk, nk, d.k_stride), gb_reach(&gb.dv, nv, d.v_stride);
    if (want_dmask) {
        const int64_t nm[4] = {B, H, L, S};
        gb_reach(&gb.dm, nm, d.mask_stride);
    }
    if (gt != ATTN_DTYPE_F32)
        for (int c = 0; c < p->n; c++) {
            widen(out[c], co, gt, NULL);
            widen(dq[c], cq, gt, gb.dq.reached), widen(dk[c], ck, gt, gb.dk.reached), widen(dv[c], cv, gt, gb.dv.reached);
        }
    const bool overflow = sdpa_bwd_bounds(&P, noise, out[1], dout, own_forward, cm, &gb);
    /* attn.h leaves rows open where scale * log2(e) * q leaves the float range (forward NaN). */
    const double qmax = max_abs(q, cq);
    const bool float_range = fabs(P.scale) * (qmax > 1.0 ? qmax : 1.0) > (double)FLT_MAX / 4.0;
    if (!float_range && !overflow) {
        grad_unscale = 1.0 / fabs(P.scale);
        compare_grad(dq[0], dq[1], &gb.dq, false, gt, "dq");
        compare_grad(dk[0], dk[1], &gb.dk, false, gt, "dk");
        grad_unscale = 0.0;
        compare_grad(dv[0], dv[1], &gb.dv, false, gt, "dv");
        if (want_dmask) compare_grad(dm[0], dm[1], &gb.dm, true, ATTN_DTYPE_F32, "dmask");
    }
    if (p->n == 3) {
        compare_bits(dq[0], dq[2], cq, "dq");
        compare_bits(dk[0], dk[2], ck, "dk");
        compare_bits(dv[0], dv[2], cv, "dv");
        if (want_dmask) compare_bits(dm[0], dm[2], cm, "dmask");
    }
    /* Finite, moderate inputs: finite gradients. */
    bool tame = all_finite_within(q, cq, TAME_VALUE) && all_finite_within(k, ck, TAME_VALUE) &&
                all_finite_within(v, cv, TAME_VALUE) && all_finite_within(dout, co, TAME_VALUE) &&
                fabs(P.scale) <= TAME_VALUE && (ex.slopes == NULL || all_finite_within(ex.slopes, H, TAME_VALUE)) &&
                (ex.sinks == NULL || all_finite_within(ex.sinks, H, TAME_VALUE));
    if (mask != NULL && d.mask_dtype == ATTN_DTYPE_F32)
        for (int64_t e = 0; e < cm; e++) {
            const float x = ((const float *)mask)[e];
            tame = tame && (x == -INFINITY || (isfinite(x) && fabsf(x) <= TAME_MASK));
        }
    if (kpm != NULL && d.key_padding_mask_dtype == ATTN_DTYPE_F32) {
        const int64_t ks[4] = {d.key_padding_mask_stride[0], d.key_padding_mask_stride[1], 0, 0};
        for (int64_t e = 0, n = layout_elems(ks, B, S, 1, 1); e < n; e++) {
            const float x = ((const float *)kpm)[e];
            tame = tame && (x == -INFINITY || (isfinite(x) && fabsf(x) <= TAME_MASK));
        }
    }
    for (int c = 0; c < p->n && tame; c++) {
        check_finite_grad(dq[c], &gb.dq, gt, c, "dq");
        check_finite_grad(dk[c], &gb.dk, gt, c, "dk");
        check_finite_grad(dv[c], &gb.dv, gt, c, "dv");
        if (want_dmask) check_finite_grad(dm[c], &gb.dm, ATTN_DTYPE_F32, c, "dmask");
    }
    gb_free(&gb.dq), gb_free(&gb.dk), gb_free(&gb.dv), gb_free(&gb.dm);
    for (int c = 0; c < p->n; c++) free(out[c]), free(lse[c]), free(dq[c]), free(dk[c]), free(dv[c]), free(dm[c]);
    free(q), free(k), free(v), free(dout), free(mask), free(kpm), free(noise), free(qh), free(douth);
    free_extras(&ex);
    grad_round_rel = grad_round_abs = out_round = out_round_abs = dot_round = 0.0;
}

/* ---- nn.MultiheadAttention ------------------------------------------------------------------- */

/*
 * Tolerances of the module's gradients, one per tensor, from bounds of the magnitudes (the
 * forward's are module_tols). With inputs up to `amp`, parameters whose 2-D blocks have row and
 * column sums up to wsum and whose vectors are up to bmax, the projections are up to proj = amp *
 * wsum + bmax and the scores up to smag = sqrt(hd) proj^2 (q is divided by sqrt(hd)); finite F32
 * mask terms add up to mmax, so |lse| <= smag + mmax + log(S'). The kernels' exponent error is then
 * about ds = 1e-6 + 4 (width + hd + 8) U smag + 8 U (mmax + |lse|) in the forward and again in the
 * backward, so the weights are off by a relative rP = expm1(3 ds) (plus the sums' rounding). dout
 * up to g gives dC = dout Wo up to gc = g max(wsum, 1), |dP - rowdot| <= 2 keep hd gc proj = dpm,
 * and since a row's weights sum to 1 and a key's over L rows to at most L:
 *   dq' <= dpm proj / sqrt(hd),  dk' <= L dpm proj / sqrt(hd),  dv' <= L keep gc.
 * An input's gradient sums up to three of them times the projection (<= wsum each); a projection
 * weight's sums N max(L, S) of them times an input element; out_proj's weight sums N L dout times
 * attention outputs (<= keep proj). Each tolerance is ABS_TOL * magnitude + 2 r magnitude where r
 * is rP, the float rounding of the sums ((n + 2) U for n terms) and the forward's error of the
 * saved activations (3 ds).
 */
typedef struct mha_grad_tols {
    tol in, w, b, bkv, wo, bo;
} mha_grad_tols;

static tol grad_tol(double mag, double r) {
    const tol t = {REL_TOL, ABS_TOL * mag + 2.0 * r * mag};
    return t;
}

static void mha_bwd_tols(double amp, double g, double wsum, double bmax, double mmax, int64_t width, int64_t hd,
                         int64_t E, int64_t N, int64_t L, int64_t S, int64_t S2, double keep, mha_grad_tols *t) {
    const double proj = amp * wsum + bmax, smag = sqrt((double)hd) * proj * proj;
    const double lmag = smag + mmax + log((double)S2 + 1.0);
    const double ds = 1e-6 + 4.0 * (double)(width + hd + 8) * U * smag + 8.0 * U * (mmax + lmag);
    const double rP = expm1(3.0 * ds) + 4.0 * (double)(S2 + 4) * U;
    const double gc = g * (wsum > 1.0 ? wsum : 1.0);
    const double dpm = 2.0 * keep * (double)hd * gc * proj;
    const double mq = dpm * proj / sqrt((double)hd), mk = (double)L * mq, mv = (double)L * keep * gc;
    const double r_sdpa = 2.0 * rP + 3.0 * ds + 8.0 * (double)(width + E + hd + S2 + L + 8) * U;
    const double mmax3 = fmax(mq, fmax(mk, mv));
    const double rows = (double)N * (double)(L > S ? L : S);
    t->in = grad_tol(wsum * (mq + mk + mv), r_sdpa + 4.0 * (double)(width + E + 2) * U);
    t->w = grad_tol(rows * mmax3 * amp, r_sdpa + 4.0 * (rows + 2.0) * U);
    t->b = grad_tol(rows * mmax3, r_sdpa + 4.0 * (rows + 2.0) * U);
    t->bkv = grad_tol((double)N * fmax(mk, mv), r_sdpa + 4.0 * (double)(N + 2) * U);
    t->wo = grad_tol((double)N * (double)L * g * keep * proj, rP + 3.0 * ds + 4.0 * (double)(N * L + width + E + 8) * U);
    t->bo = grad_tol((double)N * (double)L * g, 4.0 * (double)(N * L + 2) * U);
}

static bool any_sentinel(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (is_sentinel(&x[i])) return true;
    return false;
}

/* ---- module parameters ------------------------------------------------------------------------ */

/* The data of parameter i of context c's module; `modules` is the attn_mha *[3] or attn_book *[3]. */
typedef float *(*param_data_fn)(void *modules, int c, int i);

static float *mha_param(void *modules, int c, int i) {
    float *data;
    attn_mha_param_at(((attn_mha **)modules)[c], i, NULL, NULL, NULL, &data);
    return data;
}

static float *book_param(void *modules, int c, int i) {
    float *data;
    attn_book_param_at(((attn_book **)modules)[c], i, NULL, NULL, NULL, &data);
    return data;
}

/* With probability 1/2, random parameters (of pn[i] elements each), the same in every context's
 * module, instead of the constructor's. */
static void randomize_params(pair *p, int count, const int64_t *pn, param_data_fn param, void *modules) {
    if (!fuzz_data_chance(p->fd, 1, 2)) return;
    static const float pamps[] = {0.25f, 1.0f, 3.0f};
    const float pamp = pamps[fuzz_data_pick(p->fd, 3)];
    for (int i = 0; i < count; i++) {
        float *x = new_floats(pn[i]);
        fill(p, x, pn[i], pamp);
        for (int c = 0; c < p->n; c++) memcpy(param(modules, c, i), x, (size_t)pn[i] * sizeof(float));
        free(x);
    }
}

/* A module's gradients: the inputs' and one buffer per parameter (NULL when not asked for). */
typedef struct mha_grads {
    float *dq, *dk, *dv;
    float *dp[8];
} mha_grads;

static void bwd_mha(pair *p) {
    fuzz_data *fd = p->fd;
    attn_mha_config cfg;
    attn_mha *m[3] = {NULL, NULL, NULL};
    int64_t pn[8];
    const char *pname[8];
    const int count = open_mha(p, &cfg, m, pn, pname);
    const int64_t H = cfg.num_heads, E = cfg.embed_dim, hd = E / H;
    const int64_t kd = cfg.kdim == 0 ? E : cfg.kdim, vd = cfg.vdim == 0 ? E : cfg.vdim;
    attn_status st[3];
    randomize_params(p, count, pn, mha_param, m); /* non-zero biases among them */

    attn_mha_args a;
    decode_mha_batch(fd, &a);
    const int64_t N = a.batch, L = a.len_q;
    /* key: omitted, the query's pointer (self-attention) or its own tensor; value: omitted, the
     * key's pointer (the query's when the key is), its own, or the query's while the key is its own */
    int kmode = (int)fuzz_data_pick(fd, 3);
    if (kmode != 2 && kd != E) kmode = 2;
    const int64_t kw = kmode == 2 ? kd : E;
    int vmode = (int)fuzz_data_pick(fd, 4);
    if (vmode <= 1 && vd != kw) vmode = 2;
    if (vmode == 3 && (kmode != 2 || vd != E)) vmode = 2;
    const int64_t S = kmode == 2 && vmode != 3 ? fuzz_data_i64_range(fd, 1, 5) : L;
    a.len_kv = S;
    a.training = fuzz_data_chance(fd, 1, 3);
    const float amp = pick_amp(p), gamp = pick_amp(p);
    float *q = new_floats(L * N * E), *k = NULL, *v = NULL, *dout = new_floats(L * N * E);
    fill(p, q, L * N * E, amp);
    if (kmode == 2) k = new_floats(S * N * kd), fill(p, k, S * N * kd, amp);
    if (vmode == 2) v = new_floats(S * N * vd), fill(p, v, S * N * vd, amp);
    fill(p, dout, L * N * E, gamp);
    a.query = q;
    a.key = kmode == 0 ? NULL : kmode == 1 ? q : k;
    a.value = vmode == 0 ? NULL : vmode == 1 ? (a.key != NULL ? a.key : q) : vmode == 3 ? q : v;
    void *mask, *kpm;
    const int64_t nmask = decode_mha_masks(p, &a, H, &mask, &kpm);
    /* which gradients are asked for: the ones attn.h allows, some left NULL */
    const bool want_dq = fuzz_data_chance(fd, 5, 6), want_dk = kmode == 2 && fuzz_data_chance(fd, 5, 6);
    const bool want_dv = vmode == 2 && fuzz_data_chance(fd, 5, 6), want_dp = fuzz_data_chance(fd, 5, 6);
    bool want_p[8];
    for (int i = 0; i < count; i++) want_p[i] = fuzz_data_chance(fd, 5, 6);
    const bool move_saved = fuzz_data_chance(fd, 1, 4);

    /* ---- tolerances ---- */
    double wsum = 0.0, bmax = 0.0;
    bool nonfinite = false, tame = true;
    for (int i = 0; i < count; i++) {
        int64_t shape[3];
        int ndim;
        float *data;
        attn_mha_param_at(m[1], i, NULL, &ndim, shape, &data);
        param_bounds(ndim, shape, data, &wsum, &bmax);
        nonfinite = nonfinite || any_nonfinite(data, pn[i]);
        tame = tame && all_finite_within(data, pn[i], TAME_VALUE);
    }
    double in_amp = max_abs(q, L * N * E);
    if (k != NULL && max_abs(k, S * N * kd) > in_amp) in_amp = max_abs(k, S * N * kd);
    if (v != NULL && max_abs(v, S * N * vd) > in_amp) in_amp = max_abs(v, S * N * vd);
    nonfinite = nonfinite || any_nonfinite(q, L * N * E) || (k != NULL && any_nonfinite(k, S * N * kd)) ||
                (v != NULL && any_nonfinite(v, S * N * vd)) || any_nonfinite(dout, L * N * E);
    tame = tame && all_finite_within(q, L * N * E, TAME_VALUE) && all_finite_within(dout, L * N * E, TAME_VALUE) &&
           (k == NULL || all_finite_within(k, S * N * kd, TAME_VALUE)) &&
           (v == NULL || all_finite_within(v, S * N * vd, TAME_VALUE));
    double mmax = 0.0;
    const void *fmasks[2] = {mask != NULL && a.attn_mask_dtype == ATTN_DTYPE_F32 ? mask : NULL,
                             kpm != NULL && a.key_padding_mask_dtype == ATTN_DTYPE_F32 ? kpm : NULL};
    const int64_t fmask_n[2] = {nmask, N * S};
    for (int f = 0; f < 2; f++) {
        double mx = 0.0;
        for (int64_t i = 0; fmasks[f] != NULL && i < fmask_n[f]; i++) {
            const float x = ((const float *)fmasks[f])[i];
            nonfinite = nonfinite || isnan(x) || x == INFINITY;
            tame = tame && (x == -INFINITY || (isfinite(x) && fabsf(x) <= TAME_MASK));
            if (isfinite(x) && fabs((double)x) > mx) mx = fabs((double)x);
        }
        mmax += mx;
    }
    const int64_t width = kd > vd ? (kd > E ? kd : E) : (vd > E ? vd : E);
    const double keep = a.training && cfg.dropout > 0.0 ? 1.0 / (1.0 - cfg.dropout) : 1.0;
    const int64_t S2 = attn_mha_weights_len_kv(m[0], S);
    tol t_out, t_w;
    double smag;
    module_tols(in_amp, wsum, bmax, width, hd, E, keep, &t_out, &t_w, &smag);
    mha_grad_tols tg;
    mha_bwd_tols(in_amp, max_abs(dout, L * N * E), wsum, bmax, mmax, width, hd, E, N, L, S, S2, keep, &tg);
    /* Non-finite values reach different elements through the projections' products in float and
     * double; the SDPA part of this target pins their placement down. Scores near the float range
     * overflow in float only. */
    loose_nonfinite = nonfinite || smag > (double)FLT_MAX / 16.0;
    snprintf(problem, sizeof problem,
             "mha_bwd E=%lld H=%lld kdim=%lld vdim=%lld bias=%d bias_kv=%d zero_attn=%d batch_first=%d dropout=%g "
             "N=%lld L=%lld S=%lld unbatched=%d key=%d value=%d mask=%s/%d kpm=%s causal=%d weights=%d/%d "
             "training=%d isa=%s contexts=%d",
             (long long)E, (long long)H, (long long)kd, (long long)vd, cfg.bias, cfg.add_bias_kv, cfg.add_zero_attn,
             cfg.batch_first, cfg.dropout, (long long)N, (long long)L, (long long)S, a.unbatched, kmode, vmode,
             a.attn_mask == NULL ? "none" : attn_dtype_name(a.attn_mask_dtype), a.attn_mask_ndim,
             a.key_padding_mask == NULL ? "none" : attn_dtype_name(a.key_padding_mask_dtype), a.causal, a.need_weights,
             a.average_attn_weights, a.training, attn_isa_name(attn_ctx_isa(p->ctx[0])), p->n);

    /* ---- training forward ---- */
    const int64_t nw = a.need_weights ? N * (a.average_attn_weights ? 1 : H) * L * S2 : 0;
    float *out[3] = {NULL, NULL, NULL}, *w[3] = {NULL, NULL, NULL};
    void *saved[3] = {NULL, NULL, NULL};
    size_t saved_size[3] = {0, 0, 0};
    attn_generator g_fwd[3];
    for (int c = 0; c < p->n; c++) {
        g_fwd[c] = *attn_ctx_generator(p->ctx[c]);
        st[c] = attn_mha_saved_size(p->ctx[c], m[c], &a, &saved_size[c]);
        FUZZ_CHECK(st[c] == ATTN_OK && saved_size[c] > 0, "attn_mha_saved_size: %s in %s", attn_ctx_last_error(p->ctx[c]),
                   problem);
        saved[c] = fuzz_xmalloc(saved_size[c]);
        out[c] = sentinel_floats(L * N * E);
        if (nw > 0) w[c] = sentinel_floats(nw);
        st[c] = attn_mha_forward_train(p->ctx[c], m[c], &a, out[c], w[c], saved[c], saved_size[c]);
    }
    compare_status(p, st, "attn_mha_forward_train");
    FUZZ_CHECK(st[0] == ATTN_OK, "attn_mha_forward_train: %s in %s", attn_ctx_last_error(p->ctx[0]), problem);
    compare_generators(p);
    for (int c = 1; c < p->n; c++) {
        compare_run(p, c, out[0], out[c], L * N * E, t_out, "mha_train out");
        if (nw > 0) compare_run(p, c, w[0], w[c], nw, t_w, "mha_train weights");
    }
    if (move_saved) /* attn.h: `saved` may be copied or moved between the calls */
        for (int c = 0; c < p->n; c++) {
            void *moved = fuzz_xmalloc(saved_size[c]);
            memcpy(moved, saved[c], saved_size[c]);
            memset(saved[c], 0xAB, saved_size[c]);
            free(saved[c]);
            saved[c] = moved;
        }

    /* ---- backward ---- */
    mha_grads gr[3];
    for (int c = 0; c < p->n; c++) {
        memset(&gr[c], 0, sizeof gr[c]);
        if (want_dq) gr[c].dq = sentinel_floats(L * N * E);
        if (want_dk) gr[c].dk = sentinel_floats(S * N * kd);
        if (want_dv) gr[c].dv = sentinel_floats(S * N * vd);
        for (int i = 0; want_dp && i < count; i++)
            if (want_p[i]) gr[c].dp[i] = sentinel_floats(pn[i]);
        const attn_generator before = *attn_ctx_generator(p->ctx[c]);
        st[c] = attn_mha_backward(p->ctx[c], m[c], &a, saved[c], saved_size[c], dout, gr[c].dq, gr[c].dk, gr[c].dv,
                                  want_dp ? gr[c].dp : NULL);
        FUZZ_CHECK(memcmp(&before, attn_ctx_generator(p->ctx[c]), sizeof before) == 0,
                   "attn_mha_backward drew from the context's generator (context %d)", c);
    }
    compare_status(p, st, "attn_mha_backward");
    FUZZ_CHECK(st[0] == ATTN_OK, "attn_mha_backward: %s in %s", attn_ctx_last_error(p->ctx[0]), problem);
    for (int c = 0; c < p->n; c++) { /* every gradient asked for is written whole */
        FUZZ_CHECK(gr[c].dq == NULL || !any_sentinel(gr[c].dq, L * N * E), "dquery not written whole in %s", problem);
        FUZZ_CHECK(gr[c].dk == NULL || !any_sentinel(gr[c].dk, S * N * kd), "dkey not written whole in %s", problem);
        FUZZ_CHECK(gr[c].dv == NULL || !any_sentinel(gr[c].dv, S * N * vd), "dvalue not written whole in %s", problem);
        for (int i = 0; i < count; i++)
            FUZZ_CHECK(gr[c].dp[i] == NULL || !any_sentinel(gr[c].dp[i], pn[i]), "d%s not written whole in %s",
                       pname[i], problem);
    }
    for (int c = 1; c < p->n; c++) {
        if (want_dq) compare_run(p, c, gr[0].dq, gr[c].dq, L * N * E, tg.in, "dquery");
        if (want_dk) compare_run(p, c, gr[0].dk, gr[c].dk, S * N * kd, tg.in, "dkey");
        if (want_dv) compare_run(p, c, gr[0].dv, gr[c].dv, S * N * vd, tg.in, "dvalue");
        for (int i = 0; i < count; i++) {
            if (gr[0].dp[i] == NULL) continue;
            const char *nm = pname[i];
            const tol t = strcmp(nm, "in_proj_bias") == 0                                   ? tg.b
                          : strcmp(nm, "bias_k") == 0 || strcmp(nm, "bias_v") == 0          ? tg.bkv
                          : strcmp(nm, "out_proj.weight") == 0                              ? tg.wo
                          : strcmp(nm, "out_proj.bias") == 0                                ? tg.bo
                                                                                            : tg.w;
            char what[64];
            snprintf(what, sizeof what, "d%s", nm);
            compare_run(p, c, gr[0].dp[i], gr[c].dp[i], pn[i], t, what);
        }
    }
    if (tame) /* finite, moderate inputs and parameters: finite outputs and gradients */
        for (int c = 0; c < p->n; c++) {
            FUZZ_CHECK(!any_nonfinite(out[c], L * N * E), "non-finite out (context %d) in %s", c, problem);
            FUZZ_CHECK(gr[c].dq == NULL || !any_nonfinite(gr[c].dq, L * N * E), "non-finite dquery (context %d) in %s",
                       c, problem);
            FUZZ_CHECK(gr[c].dk == NULL || !any_nonfinite(gr[c].dk, S * N * kd), "non-finite dkey (context %d) in %s", c,
                       problem);
            FUZZ_CHECK(gr[c].dv == NULL || !any_nonfinite(gr[c].dv, S * N * vd), "non-finite dvalue (context %d) in %s",
                       c, problem);
            for (int i = 0; i < count; i++)
                FUZZ_CHECK(gr[c].dp[i] == NULL || !any_nonfinite(gr[c].dp[i], pn[i]),
                           "non-finite d%s (context %d) in %s", pname[i], c, problem);
        }

    /* ---- self-attention: a shared tensor's gradient is the sum of its uses ---- */
    /* On the reference: the same call with every use given its own copy of the tensor, from the
     * same generator state; the shared tensor's gradient must be the sum of the copies'. */
    const bool shared = kmode != 2 || vmode != 2;
    if (shared && want_dq && fuzz_data_chance(fd, 1, 2)) {
        attn_ctx *ctx = p->ctx[1];
        const float *kt = kmode == 2 ? k : q; /* the tensors standing for key and value */
        const float *vt = vmode == 2 ? v : vmode == 3 ? q : kt;
        const int64_t nk = S * N * kd, nv = S * N * vd;
        float *kc = new_floats(nk), *vc = new_floats(nv);
        memcpy(kc, kt, (size_t)nk * sizeof(float));
        memcpy(vc, vt, (size_t)nv * sizeof(float));
        attn_mha_args a2 = a;
        a2.key = kc, a2.value = vc, a2.len_kv = S;
        attn_generator *gen = attn_ctx_generator(ctx);
        const attn_generator after = *gen;
        *gen = g_fwd[1]; /* the state the first training forward started from: the same dropout */
        size_t sz2 = 0;
        FUZZ_CHECK(attn_mha_saved_size(ctx, m[1], &a2, &sz2) == ATTN_OK, "attn_mha_saved_size (copies)");
        void *saved2 = fuzz_xmalloc(sz2);
        float *out2 = new_floats(L * N * E), *w2 = nw > 0 ? new_floats(nw) : NULL;
        float *dq2 = new_floats(L * N * E), *dk2 = new_floats(nk), *dv2 = new_floats(nv);
        float *dp2[8] = {NULL};
        for (int i = 0; want_dp && i < count; i++)
            if (want_p[i]) dp2[i] = new_floats(pn[i]);
        FUZZ_CHECK(attn_mha_forward_train(ctx, m[1], &a2, out2, w2, saved2, sz2) == ATTN_OK,
                   "attn_mha_forward_train (copies): %s", attn_ctx_last_error(ctx));
        FUZZ_CHECK(memcmp(gen, &after, sizeof after) == 0, "the copies' forward drew differently in %s", problem);
        FUZZ_CHECK(attn_mha_backward(ctx, m[1], &a2, saved2, sz2, dout, dq2, dk2, dv2, want_dp ? dp2 : NULL) == ATTN_OK,
                   "attn_mha_backward (copies): %s", attn_ctx_last_error(ctx));
        compare(out2, out[1], L * N * E, t_out, "out (copies)");
        /* query's gradient: its own use, plus the key's when the key is the query, plus the
         * value's when the value is the query */
        const bool key_is_q = kmode != 2, value_is_q = vmode == 3 || (vmode != 2 && key_is_q);
        const bool value_is_k = kmode == 2 && vmode == 1;
        float *sum = new_floats(L * N * E);
        for (int64_t e = 0; e < L * N * E; e++)
            sum[e] = (float)((double)dq2[e] + (key_is_q ? (double)dk2[e] : 0.0) + (value_is_q ? (double)dv2[e] : 0.0));
        compare(sum, gr[1].dq, L * N * E, tg.in, "dquery (sum of the copies' gradients)");
        free(sum);
        if (value_is_k && want_dk) {
            float *ksum = new_floats(nk);
            for (int64_t e = 0; e < nk; e++) ksum[e] = (float)((double)dk2[e] + (double)dv2[e]);
            compare(ksum, gr[1].dk, nk, tg.in, "dkey (sum of the key's and value's gradients)");
            free(ksum);
        }
        for (int i = 0; i < count; i++)
            if (dp2[i] != NULL) {
                char what[64];
                snprintf(what, sizeof what, "d%s (copies)", pname[i]);
                compare(dp2[i], gr[1].dp[i], pn[i], tg.w.abs > tg.wo.abs ? tg.w : tg.wo, what);
            }
        *gen = after;
        free(saved2), free(out2), free(w2), free(dq2), free(dk2), free(dv2);
        for (int i = 0; i < 8; i++) free(dp2[i]);
        free(kc), free(vc);
    }

    for (int c = 0; c < p->n; c++) {
        free(out[c]), free(w[c]), free(saved[c]), free(gr[c].dq), free(gr[c].dk), free(gr[c].dv);
        for (int i = 0; i < 8; i++) free(gr[c].dp[i]);
        attn_mha_free(m[c]);
    }
    free(q), free(k), free(v), free(dout), free(mask), free(kpm);
}

/* ---- the book's modules ---------------------------------------------------------------------- */

/* The tolerance of a book parameter's gradient, by its name's last part. */
static tol book_param_tol(const char *name, const mha_grad_tols *tg) {
    const size_t n = strlen(name);
    if (strstr(name, "out_proj.weight") != NULL) return tg->wo;
    if (strstr(name, "out_proj.bias") != NULL) return tg->bo;
    if (n >= 5 && strcmp(name + n - 5, ".bias") == 0) return tg->b;
    return tg->w;
}

/*
 * attn_book_forward_train + attn_book_backward on every kind of module, parameters from the
 * constructor or random, training with dropout or not: the same status everywhere, outputs and
 * weights as in fuzz_sdpa_diff.c, dx and every parameter gradient (some left NULL) within the
 * bounds of the MHA backward (times the head count for the wrapper, whose heads' gradients add up),
 * the same bits for another thread count, nothing drawn by the backward, and finite gradients from
 * finite, moderate inputs.
 */
static void bwd_book(pair *p) {
    fuzz_data *fd = p->fd;
    book_config b;
    attn_book *m[3] = {NULL, NULL, NULL};
    open_book(p, &b, m);
    attn_status st[3];
    const int count = attn_book_param_count(m[0]);
    int64_t *pn = fuzz_xmalloc((size_t)count * sizeof(int64_t));
    const char **pname = fuzz_xmalloc((size_t)count * sizeof(char *));
    for (int i = 0; i < count; i++) {
        int64_t shape[2];
        int ndim;
        float *data;
        attn_book_param_at(m[0], i, &pname[i], &ndim, shape, &data);
        pn[i] = ndim == 2 ? shape[0] * shape[1] : shape[0];
    }
    randomize_params(p, count, pn, book_param, m);
    const int64_t batch = fuzz_data_i64_range(fd, 1, 3), n = fuzz_data_i64_range(fd, 1, b.context_length);
    const int64_t outf = attn_book_out_features(m[0]);
    const int64_t hw = b.kind == ATTN_BOOK_MHA_WRAPPER || b.kind == ATTN_BOOK_MHA ? b.heads : 1;
    const int training = fuzz_data_chance(fd, 1, 3), want_w = fuzz_data_bool(fd);
    const bool want_dx = fuzz_data_chance(fd, 5, 6), want_dp = fuzz_data_chance(fd, 5, 6);
    const int64_t nx = batch * n * b.d_in, no = batch * n * outf, nw = want_w ? batch * hw * n * n : 0;
    float *x = new_floats(nx), *dout = new_floats(no);
    fill(p, x, nx, pick_amp(p));
    fill(p, dout, no, pick_amp(p));
    bool *want_p = fuzz_xmalloc((size_t)count * sizeof(bool));
    for (int i = 0; i < count; i++) want_p[i] = fuzz_data_chance(fd, 5, 6);

    double wsum = 0.0, bmax = 0.0;
    bool tame = all_finite_within(x, nx, TAME_VALUE) && all_finite_within(dout, no, TAME_VALUE);
    bool nonfinite = any_nonfinite(x, nx) || any_nonfinite(dout, no);
    for (int i = 0; i < count; i++) {
        int64_t shape[2];
        int ndim;
        float *data;
        attn_book_param_at(m[1], i, NULL, &ndim, shape, &data);
        param_bounds(ndim, shape, data, &wsum, &bmax);
        tame = tame && all_finite_within(data, pn[i], TAME_VALUE);
        nonfinite = nonfinite || any_nonfinite(data, pn[i]);
    }
    const int64_t hd = b.kind == ATTN_BOOK_MHA ? b.d_out / b.heads : b.d_out;
    const double keep = training && b.dropout > 0.0 ? 1.0 / (1.0 - b.dropout) : 1.0;
    const int64_t width = b.d_in > b.d_out ? b.d_in : b.d_out;
    tol t_out, t_w;
    double smag;
    module_tols(max_abs(x, nx), wsum, bmax, width, hd, outf, keep, &t_out, &t_w, &smag);
    mha_grad_tols tg;
    mha_bwd_tols(max_abs(x, nx), max_abs(dout, no), wsum, bmax, 0.0, width, hd, outf, batch, n, n, n, keep, &tg);
    if (b.kind == ATTN_BOOK_MHA_WRAPPER) /* dx sums the heads' */
        tg.in.abs *= (double)b.heads;
    loose_nonfinite = nonfinite || smag > (double)FLT_MAX / 16.0;
    snprintf(problem, sizeof problem,
             "book_bwd kind=%d d_in=%lld d_out=%lld heads=%lld context_length=%lld dropout=%g bias=%d batch=%lld "
             "n=%lld training=%d weights=%d isa=%s contexts=%d",
             (int)b.kind, (long long)b.d_in, (long long)b.d_out, (long long)b.heads, (long long)b.context_length,
             b.dropout, b.bias, (long long)batch, (long long)n, training, want_w,
             attn_isa_name(attn_ctx_isa(p->ctx[0])), p->n);

    float *out[3] = {NULL, NULL, NULL}, *w[3] = {NULL, NULL, NULL}, *dx[3] = {NULL, NULL, NULL};
    float **dp[3] = {NULL, NULL, NULL};
    void *saved[3] = {NULL, NULL, NULL};
    size_t saved_size[3] = {0, 0, 0};
    for (int c = 0; c < p->n; c++) {
        st[c] = attn_book_saved_size(p->ctx[c], m[c], batch, n, &saved_size[c]);
        FUZZ_CHECK(st[c] == ATTN_OK && saved_size[c] > 0, "attn_book_saved_size: %s in %s",
                   attn_ctx_last_error(p->ctx[c]), problem);
        saved[c] = fuzz_xmalloc(saved_size[c]);
        out[c] = sentinel_floats(no);
        if (want_w) w[c] = sentinel_floats(nw);
        st[c] = attn_book_forward_train(p->ctx[c], m[c], x, batch, n, training, out[c], w[c], saved[c], saved_size[c]);
    }
    compare_status(p, st, "attn_book_forward_train");
    FUZZ_CHECK(st[0] == ATTN_OK, "attn_book_forward_train: %s in %s", attn_ctx_last_error(p->ctx[0]), problem);
    compare_generators(p);
    for (int c = 1; c < p->n; c++) {
        compare_run(p, c, out[0], out[c], no, t_out, "book_train out");
        if (want_w) compare_run(p, c, w[0], w[c], nw, t_w, "book_train weights");
    }
    for (int c = 0; c < p->n; c++) {
        if (want_dx) dx[c] = sentinel_floats(nx);
        dp[c] = fuzz_xmalloc((size_t)count * sizeof(float *));
        for (int i = 0; i < count; i++) dp[c][i] = want_p[i] ? sentinel_floats(pn[i]) : NULL;
        const attn_generator before = *attn_ctx_generator(p->ctx[c]);
        st[c] = attn_book_backward(p->ctx[c], m[c], x, batch, n, training, saved[c], saved_size[c], dout, dx[c],
                                   want_dp ? dp[c] : NULL);
        FUZZ_CHECK(memcmp(&before, attn_ctx_generator(p->ctx[c]), sizeof before) == 0,
                   "attn_book_backward drew from the context's generator (context %d)", c);
    }
    compare_status(p, st, "attn_book_backward");
    FUZZ_CHECK(st[0] == ATTN_OK, "attn_book_backward: %s in %s", attn_ctx_last_error(p->ctx[0]), problem);
    for (int c = 0; c < p->n; c++) {
        FUZZ_CHECK(dx[c] == NULL || !any_sentinel(dx[c], nx), "dx not written whole in %s", problem);
        for (int i = 0; i < count; i++) {
            const bool written = dp[c][i] != NULL && !any_sentinel(dp[c][i], pn[i]);
            FUZZ_CHECK(dp[c][i] == NULL || (want_dp ? written : !written), "d%s %s in %s", pname[i],
                       want_dp ? "not written whole" : "written although dparams is NULL", problem);
        }
    }
    for (int c = 1; c < p->n; c++) {
        if (want_dx) compare_run(p, c, dx[0], dx[c], nx, tg.in, "dx");
        for (int i = 0; want_dp && i < count; i++) {
            if (dp[0][i] == NULL) continue;
            char what[80];
            snprintf(what, sizeof what, "d%s", pname[i]);
            compare_run(p, c, dp[0][i], dp[c][i], pn[i], book_param_tol(pname[i], &tg), what);
        }
    }
    if (tame)
        for (int c = 0; c < p->n; c++) {
            FUZZ_CHECK(!any_nonfinite(out[c], no), "non-finite out (context %d) in %s", c, problem);
            FUZZ_CHECK(dx[c] == NULL || !any_nonfinite(dx[c], nx), "non-finite dx (context %d) in %s", c, problem);
            for (int i = 0; want_dp && i < count; i++)
                FUZZ_CHECK(dp[c][i] == NULL || !any_nonfinite(dp[c][i], pn[i]), "non-finite d%s (context %d) in %s",
                           pname[i], c, problem);
        }
    for (int c = 0; c < p->n; c++) {
        for (int i = 0; i < count; i++) free(dp[c][i]);
        free(dp[c]), free(dx[c]), free(out[c]), free(w[c]), free(saved[c]);
        attn_book_free(m[c]);
    }
    free(x), free(dout), free(pn), free(pname), free(want_p);
}

/* ---- packed batches (first byte 156, 188, 220 or 252) ---------------------------------------- */

/*
 * attn_sdpa_varlen_bwd on packed batches (decode_packed: empty sequences, loose bounds, permuted
 * layouts with a junk batch stride; causal both ways, windows, ALiBi, soft caps, scales, half k and
 * v, half q, out and gradients; no dropout), on each context: the forward, then the backward with a
 * random dout from that forward's out and lse; then each sequence alone (attn_sdpa_bwd, batch 1) on
 * the same context from the same rows of out, dout and lse. Its dq, dk and dv must be the packed
 * call's bits (attn.h: each sequence is attention on its own); a sequence without keys has dq 0,
 * one without queries dk and dv 0; elements between the rows (padding) keep their sentinel. The
 * kernels against the reference on such problems are bwd_sdpa's (the same kernels, batch by batch).
 */
static void bwd_varlen(pair *p) {
    fuzz_data *fd = p->fd;
    attn_sdpa_desc d;
    const sdpa_shape z = decode_sdpa_shape(p, &d, 220, 300000, 40000);
    const int64_t B = z.B, H = z.H, Hkv = z.Hkv, D = z.D, Dv = z.Dv;
    packed_batch pb;
    decode_packed(p, &z, &d, &pb);
    const int64_t TQ = pb.tq, TK = pb.tk, cq = pb.c[0], ck = pb.c[1], cv = pb.c[2], co = pb.c[3];
    d.scale = decode_scale(fd);
    d.causal = (attn_causal)fuzz_data_pick(fd, 3);
    const float amp = pick_amp(p);
    float *q = new_floats(cq), *k = new_floats(ck), *v = new_floats(cv), *dout = new_floats(co);
    fill(p, q, cq, amp), fill(p, k, ck, amp), fill(p, v, cv, amp), fill(p, dout, co, amp);
    sdpa_extras ex;
    decode_extras(p, &d, &ex);
    kv_for_dtype(p, &d, k, ck, v, cv, &ex);
    const void *kin = ex.kh != NULL ? (const void *)ex.kh : k, *vin = ex.vh != NULL ? (const void *)ex.vh : v;
    if (fuzz_data_chance(fd, 1, 4)) d.q_dtype = d.out_dtype = d.grad_dtype = fuzz_data_bool(fd) ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
    uint16_t *qh = d.q_dtype != ATTN_DTYPE_F32 ? to_half(p, d.q_dtype, q, cq) : NULL;
    uint16_t *gh = d.out_dtype != ATTN_DTYPE_F32 ? to_half(p, d.out_dtype, dout, co) : NULL;
    const void *qin = qh != NULL ? (const void *)qh : q, *gin = gh != NULL ? (const void *)gh : dout;
    decode_sinks(p, &d, &ex);
    char extras[160];
    describe_extras(&d, extras, sizeof extras);
    snprintf(problem, sizeof problem,
             "varlen bwd B=%lld H=%lld Hkv=%lld cu_q=%lld,%lld,%lld,%lld cu_k=%lld,%lld,%lld,%lld len_q=%lld len_kv=%lld "
             "D=%lld Dv=%lld stride0=%lld scale=%g causal=%d%s q=%s",
             (long long)B, (long long)H, (long long)Hkv, (long long)pb.cu_q[0], (long long)pb.cu_q[1], (long long)pb.cu_q[2],
             (long long)pb.cu_q[3], (long long)pb.cu_k[0], (long long)pb.cu_k[1], (long long)pb.cu_k[2], (long long)pb.cu_k[3],
             (long long)d.len_q, (long long)d.len_kv, (long long)D, (long long)Dv, (long long)pb.junk, (double)d.scale,
             (int)d.causal, extras, attn_dtype_name(d.q_dtype));
    const size_t os = attn_dtype_size(d.out_dtype), gs = attn_dtype_size(d.grad_dtype);
    const size_t qs = attn_dtype_size(d.q_dtype), ks = attn_dtype_size(d.kv_dtype);
    const int64_t nl = H * TQ;
    uint8_t *reached[3] = {calloc((size_t)cq, 1), calloc((size_t)ck, 1), calloc((size_t)cv, 1)};
    FUZZ_CHECK(reached[0] != NULL && reached[1] != NULL && reached[2] != NULL, "out of memory");
    const int64_t nq[4] = {1, H, TQ, D}, nk[4] = {1, Hkv, TK, D}, nv[4] = {1, Hkv, TK, Dv}; /* batch stride unused */
    mark_reached(reached[0], nq, d.q_stride), mark_reached(reached[1], nk, d.k_stride), mark_reached(reached[2], nv, d.v_stride);
    const int64_t cg[3] = {cq, ck, cv};
    const int64_t *gst[3] = {d.q_stride, d.k_stride, d.v_stride};
    for (int c = 0; c < p->n; c++) {
        attn_ctx *ctx = p->ctx[c];
        void *out = fuzz_xmalloc((size_t)co * os);
        float *lse = new_floats(nl);
        const attn_status sf = attn_sdpa_varlen_fwd(ctx, &d, pb.cu_q, pb.cu_k, qin, kin, vin, out, lse);
        fuzz_check_error(ctx, sf, "attn_sdpa_varlen_fwd");
        if (sf != ATTN_OK) { /* a refused argument (a NaN scale, ...): the backward refuses it too */
            void *g = fuzz_xmalloc((size_t)cq * gs);
            FUZZ_CHECK(attn_sdpa_varlen_bwd(ctx, &d, pb.cu_q, pb.cu_k, qin, kin, vin, out, gin, lse, NULL, g, g, g) == sf,
                       "the backward does not refuse what the forward refused (%s) in %s", attn_strerror(sf), problem);
            free(g), free(out), free(lse);
            continue;
        }
        uint8_t *gp[3];
        for (int i = 0; i < 3; i++) gp[i] = fuzz_xmalloc((size_t)cg[i] * gs), memset(gp[i], SENTINEL, (size_t)cg[i] * gs);
        const attn_status sb = attn_sdpa_varlen_bwd(ctx, &d, pb.cu_q, pb.cu_k, qin, kin, vin, out, gin, lse, NULL, gp[0], gp[1], gp[2]);
        fuzz_check_error(ctx, sb, "attn_sdpa_varlen_bwd");
        FUZZ_CHECK(sb == ATTN_OK, "attn_sdpa_varlen_bwd: %s in %s", attn_ctx_last_error(ctx), problem);
        check_sinks_grad(ctx, &d, &pb, 1, TQ, out, gin, lse);
        static const char *names[3] = {"dq", "dk", "dv"};
        for (int i = 0; i < 3; i++) /* padding untouched */
            for (int64_t e = 0; e < cg[i]; e++) {
                bool sent = true;
                for (size_t u = 0; u < gs; u++) sent = sent && gp[i][(size_t)e * gs + u] == SENTINEL;
                FUZZ_CHECK(reached[i][e] || sent, "%s[%lld], between the rows, was written in %s", names[i], (long long)e, problem);
            }
        for (int64_t b = 0; b < B; b++) {
            const int64_t lq = pb.cu_q[b + 1] - pb.cu_q[b], lk = pb.cu_k[b + 1] - pb.cu_k[b];
            const int64_t r0[3] = {pb.cu_q[b], pb.cu_k[b], pb.cu_k[b]}, rows[3] = {lq, lk, lk};
            const int64_t heads[3] = {H, Hkv, Hkv}, width[3] = {D, D, Dv};
            uint8_t *ga[3] = {NULL, NULL, NULL};
            if (lq > 0 && lk > 0) { /* the sequence alone, from the packed call's rows */
                const attn_sdpa_desc db = packed_seq_desc(&d, &pb, b);
                float *lb = new_floats(H * lq);
                for (int64_t h = 0; h < H; h++)
                    for (int64_t i = 0; i < lq; i++) lb[h * lq + i] = lse[h * TQ + pb.cu_q[b] + i];
                for (int i = 0; i < 3; i++) ga[i] = fuzz_xmalloc((size_t)cg[i] * gs), memset(ga[i], SENTINEL, (size_t)cg[i] * gs);
                const size_t oq = (size_t)(pb.cu_q[b] * d.q_stride[2]), okk = (size_t)(pb.cu_k[b] * d.k_stride[2]);
                const size_t ov = (size_t)(pb.cu_k[b] * d.v_stride[2]), oo = (size_t)(pb.cu_q[b] * d.o_stride[2]);
                const attn_status s1 = attn_sdpa_bwd(ctx, &db, (const char *)qin + oq * qs, (const char *)kin + okk * ks,
                                                     (const char *)vin + ov * ks, (const char *)out + oo * os,
                                                     (const char *)gin + oo * os, lb, NULL, ga[0] + oq * gs, ga[1] + okk * gs,
                                                     ga[2] + ov * gs, NULL);
                FUZZ_CHECK(s1 == ATTN_OK, "sequence %lld alone: %s in %s", (long long)b, attn_ctx_last_error(ctx), problem);
                free(lb);
            }
            for (int i = 0; i < 3; i++)
                for (int64_t h = 0; h < heads[i]; h++)
                    for (int64_t t = r0[i]; t < r0[i] + rows[i]; t++)
                        for (int64_t e = 0; e < width[i]; e++) {
                            const size_t at = (size_t)off4(gst[i], 0, h, t, e) * gs;
                            if (ga[i] != NULL) {
                                FUZZ_CHECK(memcmp(gp[i] + at, ga[i] + at, gs) == 0, "%s of sequence %lld (head %lld, row %lld, "
                                           "element %lld): the packed call's bits differ from the sequence's alone on %s in %s",
                                           names[i], (long long)b, (long long)h, (long long)t, (long long)e,
                                           attn_isa_name(attn_ctx_isa(ctx)), problem);
                            } else { /* no keys (dq) or no queries (dk, dv): nothing reaches it */
                                bool zero = true;
                                for (size_t u = 0; u < gs; u++) zero = zero && gp[i][at + u] == 0;
                                FUZZ_CHECK(zero, "%s of sequence %lld (row %lld) is not 0 with %lld queries and %lld keys in %s",
                                           names[i], (long long)b, (long long)t, (long long)lq, (long long)lk, problem);
                            }
                        }
            for (int i = 0; i < 3; i++) free(ga[i]);
        }
        for (int i = 0; i < 3; i++) free(gp[i]);
        free(out), free(lse);
    }
    for (int i = 0; i < 3; i++) free(reached[i]);
    free(q), free(k), free(v), free(dout), free(qh), free(gh);
    free_extras(&ex);
}

static void run(pair *p, unsigned what) {
    switch (what % 8) {
    case 0:
    case 1:
    case 2:
    case 3:
    case 4: /* 156, 188, 220, 252 (first bytes no corpus input had before): packed batches */
        if (what % 8 == 4 && what >= 156 && (what - 156) % 32 == 0)
            bwd_varlen(p);
        else
            bwd_sdpa(p);
        break;
    case 5:
    case 6: bwd_mha(p); break;
    default: bwd_book(p); break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return diff_main(data, size, run); }

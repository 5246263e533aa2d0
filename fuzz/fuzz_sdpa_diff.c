/*
 * fuzz_sdpa_diff.c - differential fuzz target: the kernels a context picks with ATTN_ISA_AUTO (or,
 * now and then, any other ISA the CPU runs) against the scalar reference, ATTN_ISA_REF.
 *
 * SDPA problems have B, H, Hkv, L, S, D, Dv up to about 12 (sometimes long sequences spanning
 * several kernel tiles, or wide heads), q/k/v/out in permuted contiguous layouts (with padding,
 * and broadcast inputs), attention masks of both dtypes broadcast by their strides, key padding
 * masks, every causal mode, scales, weights modes, log-sum-exp and dropout, local windows, ALiBi,
 * soft-capping and float16/bfloat16 k and v (converted with attn_convert, whose rounding is
 * checked on the way); KV caches of every type, Q8_0 and Q4_0 included (first byte 156, 188, 220
 * or 252), appended and attended in the same steps on each context; nn.MultiheadAttention
 * and the book's modules run tiny configurations the same way. The contexts are seeded alike, so
 * with dropout too the runs must agree: the same status; outputs within 1e-5 relative plus an
 * absolute tolerance of 1e-6 scaled by the magnitudes involved and widened by what float
 * arithmetic can lose on large scores (see "Tolerances" below); NaN and infinities, a fully masked
 * row's -inf log-sum-exp included, in the same places; padding between output rows left alike; the
 * generators in the same state afterwards. Sometimes a third context runs the same kernels with
 * another thread count and must give the same bits. First bytes 155, 187, 219 and 251 run SDPA on
 * raw half values and raw Q8_0 / Q4_0 blocks against attn.h's stated bound (diff_sdpa_raw); 153,
 * 185, 217 and 249 packed batches (attn_sdpa_varlen_fwd), against the reference and against each
 * sequence alone (diff_varlen).
 */
#include "fuzz_diff.h"

/* The reference's lse as the fused kernels can hold it (attn.h: the note on float arithmetic
 * before attn_causal): they work in the log2 domain with scores clamped to float's range, so an
 * lse past +-FLT_MAX * ln 2 (float mask terms or sinks near +-FLT_MAX) is that there. Applied to
 * every context's results (a call asking for the weights runs the reference everywhere); the
 * infinities (NaN rows, fully masked ones) stay. */
static void lse_in_log2_range(float *lse, int64_t n) {
    const float top = (float)((double)FLT_MAX * 0.6931471805599453);
    for (int64_t i = 0; i < n; i++)
        if (isfinite(lse[i])) lse[i] = lse[i] > top ? top : lse[i] < -top ? -top : lse[i];
}

/* ---- KV caches of every type, the block-quantised Q8_0 and Q4_0 included -------------------- */

/*
 * Each context gets its own cache of the drawn type (F32, F16, BF16, Q8_0 or Q4_0; head dims of
 * whole blocks of 32 for the last two), filled by the same appends of values with specials
 * (NaN and infinities make their quantised blocks NaN), and attends with bottom-right causal
 * masking, optionally a key padding mask and a window: the caches must hold the same bytes, and
 * the results agree as SDPA's do (both sides compute on the same stored values; block types on the bf16
 * ISAs within attn.h's bound for its rounded query), raw blocks (see overwrite_blocks) included.
 */
/*
 * Now and then (from the pair's generator, so the input decodes as before) a few stored Q8_0/Q4_0
 * blocks of the filled positions are overwritten, in every context's cache alike, with raw bytes
 * drawn by raw_blocks (the raw-type mode's blocks: zero, subnormal, largest, infinite or NaN
 * scales, zero or extreme quants). Returns
 * the largest magnitude a stored value now has (0 when nothing was written); NaN when a block is
 * not finite.
 */
static uint8_t *raw_blocks(pair *p, attn_dtype dt, int64_t n, int special_rate);
static float *dequantise(attn_dtype dt, const uint8_t *x, int64_t n);

/* The largest finite magnitude among the first S of each of the `rows` rows (cap positions of
 * width values, blocks of type dt) of a cache's keys or values; non-finite values are skipped. */
static double finite_max_stored(attn_dtype dt, const void *x, int64_t rows, int64_t cap, int64_t width, int64_t S) {
    float *f = dequantise(dt, x, rows * cap * width);
    double m = 0.0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t e = 0; e < S * width; e++) {
            const float y = f[r * cap * width + e];
            if (isfinite(y)) m = fmax(m, fabs((double)y));
        }
    free(f);
    return m;
}

/* The largest finite block scale magnitude |d| among the first S rows of each of the `rows` rows
 * (as finite_max_stored). */
static double finite_scale_max(attn_dtype dt, const void *x, int64_t rows, int64_t cap, int64_t width, int64_t S) {
    const size_t bsize = attn_dtype_size(dt);
    double m = 0.0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t e = 0; e < S * width; e += 32) {
            const uint8_t *b = (const uint8_t *)x + (size_t)((r * cap * width + e) / 32) * bsize;
            uint16_t h = (uint16_t)(b[0] | b[1] << 8);
            float f;
            FUZZ_CHECK(attn_convert(ATTN_DTYPE_F32, &f, ATTN_DTYPE_F16, &h, 1) == ATTN_OK, "attn_convert");
            if (isfinite(f)) m = fmax(m, fabs((double)f));
        }
    return m;
}

static double overwrite_blocks(pair *p, attn_kv_cache *const kc[3], attn_dtype dt, int64_t rows, int64_t cap,
                         int64_t D, int64_t Dv, int64_t S) {
    if (fuzz_rng_below(&p->rng, 4) != 0) return 0.0;
    const size_t bsize = attn_dtype_size(dt);
    double mag = 0.0;
    const int n = 1 + (int)fuzz_rng_below(&p->rng, 3);
    for (int r = 0; r < n; r++) {
        const bool in_v = fuzz_rng_below(&p->rng, 2) != 0;
        const int64_t width = in_v ? Dv : D, per_row = width / 32;
        const int64_t row = (int64_t)fuzz_rng_below(&p->rng, (uint64_t)rows), pos = (int64_t)fuzz_rng_below(&p->rng, (uint64_t)S);
        const int64_t blk = (row * cap + pos) * per_row + (int64_t)fuzz_rng_below(&p->rng, (uint64_t)per_row);
        uint8_t *bytes = raw_blocks(p, dt, 32, 48); /* one block, special three times in four */
        const uint16_t sc = (uint16_t)(bytes[0] | bytes[1] << 8);
        for (int c = 0; c < p->n; c++) {
            void *k, *v;
            attn_kv_cache_storage(kc[c], &k, NULL, &v, NULL);
            memcpy((uint8_t *)(in_v ? v : k) + (size_t)blk * bsize, bytes, bsize);
        }
        free(bytes);
        const double f = fabs(half_value(ATTN_DTYPE_F16, sc)) * (dt == ATTN_DTYPE_Q8_0 ? 128.0 : 8.0);
        mag = !isfinite(f) || isnan(mag) ? NAN : fmax(mag, f); /* an infinite scale too: not finite */
    }
    return mag;
}

static void diff_kv_cache(pair *p) {
    fuzz_data *fd = p->fd;
    static const attn_dtype types[5] = {ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16, ATTN_DTYPE_Q8_0,
                                        ATTN_DTYPE_Q4_0};
    const attn_dtype dt = types[fuzz_data_pick(fd, 5)];
    const int64_t unit = dt == ATTN_DTYPE_Q8_0 || dt == ATTN_DTYPE_Q4_0 ? 32 : 1;
    const int64_t B = fuzz_data_i64_range(fd, 1, 2), Hkv = fuzz_data_i64_range(fd, 1, 3), G = fuzz_data_i64_range(fd, 1, 4);
    const int64_t D = unit * fuzz_data_i64_range(fd, 1, unit > 1 ? 6 : 40), Dv = unit * fuzz_data_i64_range(fd, 1, unit > 1 ? 6 : 40);
    const int64_t cap = fuzz_data_i64_range(fd, 1, 300), H = Hkv * G;
    attn_kv_cache_config c;
    attn_kv_cache_config_init(&c);
    c.batch = B, c.n_kv_heads = Hkv, c.head_dim = D, c.head_dim_v = Dv, c.capacity = cap, c.dtype = dt;
    attn_kv_cache *kc[3] = {NULL, NULL, NULL};
    for (int i = 0; i < p->n; i++)
        FUZZ_CHECK(attn_kv_cache_create(p->ctx[i], &c, &kc[i]) == ATTN_OK, "kv_cache_create: %s", attn_ctx_last_error(p->ctx[i]));
    const float amp = pick_amp(p);
    snprintf(problem, sizeof problem, "kv cache %s B=%lld H=%lld Hkv=%lld D=%lld Dv=%lld cap=%lld amp=%g", attn_dtype_name(dt),
             (long long)B, (long long)H, (long long)Hkv, (long long)D, (long long)Dv, (long long)cap, (double)amp);
    const int steps = fuzz_data_int_range(fd, 1, 4);
    double raw_all = 0.0; /* what overwrite_blocks has written in every step so far: the blocks stay */
    for (int step = 0; step < steps; step++) {
        const int64_t len = attn_kv_cache_length(kc[0]);
        if (len == cap) break;
        const int64_t n = fuzz_data_i64_range(fd, 1, cap - len);
        float *k = new_floats(B * Hkv * n * D), *v = new_floats(B * Hkv * n * Dv);
        fill(p, k, B * Hkv * n * D, amp), fill(p, v, B * Hkv * n * Dv, amp);
        for (int i = 0; i < p->n; i++)
            FUZZ_CHECK(attn_kv_cache_append(p->ctx[i], kc[i], n, k, NULL, v, NULL) == ATTN_OK, "kv_cache_append: %s",
                       attn_ctx_last_error(p->ctx[i]));
        free(k), free(v);
        const int64_t S = len + n, L = fuzz_data_i64_range(fd, 1, S < 12 ? S : 12);
        attn_sdpa_desc d;
        attn_sdpa_desc_init(&d);
        d.batch = B, d.n_heads = H, d.len_q = L, d.head_dim = D, d.head_dim_v = Dv, d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
        attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, L, D, d.q_stride);
        attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, L, Dv, d.o_stride);
        uint8_t *kpm = NULL;
        if (fuzz_data_chance(fd, 1, 3)) {
            kpm = fuzz_xmalloc((size_t)(B * S));
            for (int64_t j = 0; j < B * S; j++) kpm[j] = fuzz_rng_below(&p->rng, 4) == 0;
            d.key_padding_mask = kpm, d.key_padding_mask_dtype = ATTN_DTYPE_BOOL;
            d.key_padding_mask_stride[0] = S, d.key_padding_mask_stride[1] = 1;
        }
        if (fuzz_data_chance(fd, 1, 4)) d.use_window = 1, d.window_left = fuzz_data_i64_range(fd, 0, S), d.window_right = -1;
        float *q = new_floats(B * H * L * D), *o[3], *lse[3];
        fill(p, q, B * H * L * D, amp);
        const double written = unit > 1 ? overwrite_blocks(p, kc, dt, B * Hkv, cap, D, Dv, S) : 0.0;
        raw_all = isnan(raw_all) || isnan(written) ? NAN : fmax(raw_all, written);
        attn_status st[3];
        for (int i = 0; i < p->n; i++) {
            o[i] = new_floats(B * H * L * Dv), lse[i] = new_floats(B * H * L);
            st[i] = attn_kv_cache_attend(p->ctx[i], kc[i], &d, q, o[i], lse[i]);
        }
        compare_status(p, st, "kv_cache_attend");
        if (st[0] == ATTN_OK) {
            void *s0, *s1;
            attn_kv_cache_storage(kc[0], &s0, NULL, NULL, NULL);
            attn_kv_cache_storage(kc[1], &s1, NULL, NULL, NULL);
            const size_t head = (size_t)(cap * D / unit) * attn_dtype_size(dt), filled = (size_t)(S * D / unit) * attn_dtype_size(dt);
            for (int64_t bh = 0; bh < B * Hkv; bh++) /* the filled positions of each head */
                FUZZ_CHECK(memcmp((const char *)s0 + (size_t)bh * head, (const char *)s1 + (size_t)bh * head, filled) == 0,
                           "the caches hold different keys in %s", problem);
            /* magnitudes of what the rows sum (a dequantised value is at most the block's largest) */
            const double mk = isnan(raw_all) ? amp : fmax(amp, raw_all), ds = 4.0 * (double)(D + 8) * U * (double)D * mk * max_abs(q, B * H * L * D) / sqrt((double)D);
            /* block types on the int8 ISAs: attn.h's delta_q (m_b <= max|q|) and on AVX512_BF16
             * the weights' bf16 rounding, with the stored keys' and values' largest finite
             * magnitudes (raw blocks included: mk leaves them out once one is not finite) */
            double dq = 0.0, wq = 0.0;
            if (fuzz_on_int8_query(p->ctx[0], dt)) {
                void *ks, *vs;
                attn_kv_cache_storage(kc[0], &ks, NULL, &vs, NULL);
                const double kf = finite_max_stored(dt, ks, B * Hkv, cap, D, S), vf = finite_max_stored(dt, vs, B * Hkv, cap, Dv, S);
                dq = ((double)D * max_abs(q, B * H * L * D) / sqrt((double)D) * (1.0 / 254 + 0x1p-20) + 0x1p-96 * (double)D) * kf;
                const int w8 = fuzz_int8_weights(p->ctx[0], dt);
                wq = vf * (expm1(2.0 * dq) + (w8 ? 0x1p-8 * exp(2.0 * dq) : 0.0)) + (w8 ? (double)S * 0x1p-122 : 0.0);
                if (fuzz_int16_weights(p->ctx[0], dt)) wq += fuzz_int16_term(dt, finite_scale_max(dt, vs, B * Hkv, cap, Dv, S), S);
            }
            loose_nonfinite = true; /* specials: the flush of tiny weights may differ (see above) */
            const tol t = {REL_TOL + 4.0 * ds, ABS_TOL * (1.0 + mk) + mk * (3.0 * ds + 4.0 * (double)(S + 8) * U) + wq};
            for (int i = 0; i < p->n; i++) lse_in_log2_range(lse[i], B * H * L);
            for (int i = 1; i < p->n; i++) { /* [2] runs [0]'s kernels: the same rounding */
                compare_run(p, i, o[0], o[i], B * H * L * Dv, t, "kv cache out");
                compare_run(p, i, lse[0], lse[i], B * H * L, (tol){REL_TOL + 4.0 * ds, ABS_TOL + 4.0 * ds + dq}, "kv cache lse");
            }
            loose_nonfinite = false;
        }
        for (int i = 0; i < p->n; i++) free(o[i]), free(lse[i]);
        free(q), free(kpm);
    }
    for (int i = 0; i < p->n; i++) attn_kv_cache_free(kc[i]);
}

/* ---- SDPA ---------------------------------------------------------------------------------- */

/* The tolerances of a forward's out and lse (diff_sdpa's and diff_varlen's), and loose_nonfinite:
 * scores up to smag (q . k, plus twice mmax, the float mask's largest finite term, plus the ALiBi
 * terms), error ds in them (soft-capping adds the error of its tanh, relative to the cap); S keys at
 * most in a row; nonfinite: a NaN or infinity among the inputs (q, k, v, the slopes, and what the
 * caller adds in extra_nonfinite). *ds_out receives ds. */
static void forward_tolerances(const pair *p, const attn_sdpa_desc *d, const float *q, int64_t cq, const float *k,
                               int64_t ck, const float *v, int64_t cv, const sdpa_extras *ex, double mmax, int64_t S,
                               bool extra_nonfinite, tol *t_out, tol *t_lse, double *ds_out) {
    const double scale = d->scale != 0.0f ? fabs((double)d->scale) : 1.0 / sqrt((double)d->head_dim), qmax = max_abs(q, cq);
    const double smag = scale * (double)d->head_dim * qmax * max_abs(k, ck) + 2.0 * mmax + ex->alibi_mag;
    const double cap = d->softcap > 0.0f ? fmin((double)d->softcap, smag) : 0.0;
    const double ds = 1e-6 + 4.0 * (double)(d->head_dim + 4) * U * smag + 16.0 * U * cap;
    const double keep = d->dropout_p > 0.0 && d->dropout_p < 1.0 ? 1.0 / (1.0 - d->dropout_p) : 1.0;
    const double vmax = max_abs(v, cv);
    *t_out = (tol){REL_TOL, keep * vmax * (ABS_TOL + 3.0 * ds)}, *t_lse = (tol){REL_TOL, ABS_TOL + ds};
    *ds_out = ds;
    if (d->out_dtype != ATTN_DTYPE_F32) /* both results rounded to the type: 2 u |ref| and its smallest subnormal */
        t_out->rel += d->out_dtype == ATTN_DTYPE_BF16 ? 0x1p-7 : 0x1p-10,
            t_out->abs += d->out_dtype == ATTN_DTYPE_BF16 ? 0x1p-133 : 0x1p-24;
    if (fuzz_on_dot(p->ctx[0], d)) /* weights rounded to bf16; denormals flushed */
        t_out->abs += keep * vmax * 0x1p-8 + (double)S * 0x1p-125;
    const bool nonfinite = extra_nonfinite || any_nonfinite(q, cq) || any_nonfinite(k, ck) || any_nonfinite(v, cv) ||
                           (ex->slopes != NULL && any_nonfinite(ex->slopes, d->n_heads));
    /* Scores (times log2 e) near the float range overflow in float kernels, not in the reference;
     * a scale near the float underflow turns scale * q into 0 and 0 * inf into NaN. */
    loose_nonfinite = (nonfinite && (2.0 * smag > 80.0 || scale < 1e-30)) || smag > (double)FLT_MAX / 16.0;
    if (smag > (double)FLT_MAX / 16.0) t_out->abs = t_lse->abs = INFINITY; /* float cannot hold the scores */
    if (keep * vmax * (double)S > (double)FLT_MAX / 16.0) { /* nor the sums of the values */
        loose_nonfinite = true;
        t_out->abs = INFINITY;
    }
    /* The fused kernels fold scale * log2(e) into q; attn.h leaves the result open when a product
     * leaves the float range, although the scores may fit. */
    if (scale * (qmax > 1.0 ? qmax : 1.0) > (double)FLT_MAX / 4.0) {
        loose_nonfinite = true;
        t_out->abs = t_lse->abs = INFINITY;
    }
}

static void diff_sdpa(pair *p) {
    fuzz_data *fd = p->fd;
    attn_sdpa_desc d;
    const sdpa_shape z = decode_sdpa_shape(p, &d, 220, 300000, 40000);
    const int64_t B = z.B, H = z.H, Hkv = z.Hkv, L = z.L, S = z.S, D = z.D, Dv = z.Dv;
    const int64_t nq[4] = {B, H, L, D}, nk[4] = {B, Hkv, S, D}, nv[4] = {B, Hkv, S, Dv}, no[4] = {B, H, L, Dv};
    const int64_t cq = layout(p, 4, nq, 1, d.q_stride), ck = layout(p, 4, nk, 1, d.k_stride);
    const int64_t cv = layout(p, 4, nv, 1, d.v_stride), co = layout(p, 4, no, 0, d.o_stride);
    d.scale = decode_scale(fd);
    d.causal = (attn_causal)fuzz_data_pick(fd, 3);
    d.weights_mode = (attn_weights_mode)fuzz_data_pick(fd, 3);
    if (fuzz_data_chance(fd, 1, 4)) d.dropout_p = fuzz_data_chance(fd, 1, 16) ? 1.0 : fuzz_data_unit(fd) * 0.95;
    const bool want_lse = fuzz_data_bool(fd);

    const float amp = pick_amp(p);
    float *q = new_floats(cq), *k = new_floats(ck), *v = new_floats(cv);
    fill(p, q, cq, amp);
    fill(p, k, ck, amp);
    fill(p, v, cv, amp);
    void *mask = NULL, *kpm = NULL;
    if (fuzz_data_chance(fd, 1, 2)) {
        d.mask_dtype = fuzz_data_bool(fd) ? ATTN_DTYPE_F32 : ATTN_DTYPE_BOOL;
        const int64_t nm[4] = {B, H, L, S};
        const int64_t cm = layout(p, 4, nm, 8, d.mask_stride);
        mask = fuzz_xmalloc((size_t)cm * attn_dtype_size(d.mask_dtype));
        fill_mask(p, mask, cm, d.mask_dtype);
        d.mask = mask;
    }
    kpm = decode_key_padding_mask(p, &d);
    sdpa_extras ex;
    decode_extras(p, &d, &ex);
    kv_for_dtype(p, &d, k, ck, v, cv, &ex);
    const void *kin = ex.kh != NULL ? (const void *)ex.kh : k, *vin = ex.vh != NULL ? (const void *)ex.vh : v;
    uint16_t *qh = decode_half_q_out(p, &d, q, cq);
    const void *qin = qh != NULL ? (const void *)qh : q;
    /* Philox dropout now and then (drawn after the types): the same mask on every context */
    if (d.dropout_p > 0.0 && fuzz_data_chance(fd, 1, 3))
        d.dropout_rng = ATTN_DROPOUT_RNG_PHILOX, d.dropout_seed = fuzz_data_u64(fd), d.dropout_offset = fuzz_data_u32(fd);
    decode_sinks(p, &d, &ex);
    double mmax = 0.0; /* the float mask's largest finite term (huge ones aside) */
    bool mask_nonfinite = false;
    if (d.mask != NULL && d.mask_dtype == ATTN_DTYPE_F32) {
        const float *f = d.mask;
        for (int64_t i = 0, n = layout_elems(d.mask_stride, B, H, L, S); i < n; i++) {
            if (isfinite(f[i]) && fabsf(f[i]) < 1e20f && fabs((double)f[i]) > mmax) mmax = fabs((double)f[i]);
            mask_nonfinite = mask_nonfinite || isnan(f[i]) || f[i] == INFINITY;
        }
    }
    if (d.key_padding_mask != NULL && d.key_padding_mask_dtype == ATTN_DTYPE_F32) {
        const int64_t ks[4] = {d.key_padding_mask_stride[0], d.key_padding_mask_stride[1], 0, 0};
        for (int64_t i = 0, n = layout_elems(ks, B, S, 1, 1); i < n; i++)
            mask_nonfinite = mask_nonfinite || isnan(((const float *)kpm)[i]) || ((const float *)kpm)[i] == INFINITY;
    }
    tol t_out, t_lse;
    double ds;
    forward_tolerances(p, &d, q, cq, k, ck, v, cv, &ex, mmax, S, mask_nonfinite, &t_out, &t_lse, &ds);
    const tol t_w = {REL_TOL + 4.0 * ds, ABS_TOL};
    char extras[160];
    describe_extras(&d, extras, sizeof extras);
    snprintf(problem, sizeof problem,
             "sdpa B=%lld H=%lld Hkv=%lld L=%lld S=%lld D=%lld Dv=%lld scale=%g causal=%d mask=%s kpm=%s dropout=%g%s "
             "weights=%d lse=%d%s q=%s out=%s isa=%s",
             (long long)B, (long long)H, (long long)Hkv, (long long)L, (long long)S, (long long)D, (long long)Dv,
             (double)d.scale, (int)d.causal, d.mask == NULL ? "none" : attn_dtype_name(d.mask_dtype),
             d.key_padding_mask == NULL ? "none" : attn_dtype_name(d.key_padding_mask_dtype), d.dropout_p,
             d.dropout_rng == ATTN_DROPOUT_RNG_PHILOX ? " (Philox)" : "",
             (int)d.weights_mode, want_lse, extras, attn_dtype_name(d.q_dtype), attn_dtype_name(d.out_dtype),
             attn_isa_name(attn_ctx_isa(p->ctx[0])));
    const int64_t nl = B * H * L;
    const int64_t nw = d.weights_mode == ATTN_WEIGHTS_PER_HEAD  ? B * H * L * S
                       : d.weights_mode == ATTN_WEIGHTS_AVERAGE ? B * L * S
                                                                : 0;
    float *out[3] = {NULL, NULL, NULL}, *lse[3] = {NULL, NULL, NULL}, *w[3] = {NULL, NULL, NULL};
    attn_status st[3];
    for (int c = 0; c < p->n; c++) {
        out[c] = new_floats(co);
        memset(out[c], 0xCD, (size_t)co * sizeof(float));
        if (want_lse) lse[c] = new_floats(nl), memset(lse[c], 0xCD, (size_t)nl * sizeof(float));
        if (nw > 0) w[c] = new_floats(nw), memset(w[c], 0xCD, (size_t)nw * sizeof(float));
        st[c] = attn_sdpa_fwd(p->ctx[c], &d, qin, kin, vin, out[c], lse[c], w[c]);
        if (st[c] == ATTN_OK) half_out_as_floats(out[c], d.out_dtype, co); /* the half results as floats */
    }
    compare_status(p, st, "attn_sdpa_fwd");
    for (int c = 0; c < p->n && want_lse; c++)
        if (st[c] == ATTN_OK) lse_in_log2_range(lse[c], nl);
    for (int c = 1; c < p->n && st[0] == ATTN_OK; c++) {
        compare_run(p, c, out[0], out[c], co, t_out, "out");
        if (want_lse) compare_run(p, c, lse[0], lse[c], nl, t_lse, "lse");
        if (nw > 0) compare_run(p, c, w[0], w[c], nw, t_w, "weights");
    }
    compare_generators(p);
    for (int c = 0; c < p->n; c++) free(out[c]), free(lse[c]), free(w[c]);
    free(q), free(k), free(v), free(mask), free(kpm), free(qh);
    free_extras(&ex);
}

/* ---- packed batches (first byte 153, 185, 217 or 249) -------------------------------------- */

/*
 * attn_sdpa_varlen_fwd on up to 3 sequences of drawn lengths (some empty, at least one query and
 * one key in all) packed end to end, read through (0, head, token, dim) strides of any permuted
 * layout whose batch stride, unused (attn.h), holds a drawn value; the options a packed batch takes
 * (causal both ways, windows, ALiBi, soft caps, scales, half q, k, v and out, dropout from the
 * context's generator or Philox; no masks): kernels against the reference as diff_sdpa compares
 * them, out's rows and lse (H, total_q). Then, where dropout does not depend on the sequence's
 * index (none, or the context's generator), the reference's packed result against attn_sdpa_fwd on
 * each sequence alone on the reference (attn.h: each sequence is attention on its own, dropout
 * drawn sequence after sequence), from the generator's state before the packed call, which must
 * end where the packed call left it; a sequence without keys gives zero rows and an lse of -inf.
 * Sequences all of one length, with any dropout (Philox included): the plain batch of them, bit for
 * bit.
 * Now and then the offsets are made invalid (not from 0, decreasing, a sequence longer than len_q
 * or len_kv): every context must refuse alike and leave out and lse as they were.
 */
static void diff_varlen(pair *p) {
    fuzz_data *fd = p->fd;
    attn_sdpa_desc d;
    const sdpa_shape z = decode_sdpa_shape(p, &d, 220, 300000, 40000);
    const int64_t B = z.B, H = z.H, Hkv = z.Hkv, D = z.D, Dv = z.Dv;
    packed_batch pb;
    decode_packed(p, &z, &d, &pb);
    const int64_t *cu_q = pb.cu_q, *cu_k = pb.cu_k, lmax = pb.lmax, smax = pb.smax, TQ = pb.tq, junk = pb.junk;
    const int64_t cq = pb.c[0], ck = pb.c[1], cv = pb.c[2], co = pb.c[3];
    d.scale = decode_scale(fd);
    d.causal = (attn_causal)fuzz_data_pick(fd, 3);
    if (fuzz_data_chance(fd, 1, 4)) d.dropout_p = fuzz_data_chance(fd, 1, 16) ? 1.0 : fuzz_data_unit(fd) * 0.95;
    if (d.dropout_p > 0.0 && fuzz_data_chance(fd, 1, 3))
        d.dropout_rng = ATTN_DROPOUT_RNG_PHILOX, d.dropout_seed = fuzz_data_u64(fd), d.dropout_offset = fuzz_data_u32(fd);
    int bad = fuzz_data_chance(fd, 1, 8) ? 1 + (int)fuzz_data_pick(fd, 4) : 0;
    int64_t use_q[4], use_k[4];
    memcpy(use_q, cu_q, sizeof use_q), memcpy(use_k, cu_k, sizeof use_k);
    if (bad == 1) use_q[0] = 1;                                 /* not from 0 */
    if (bad == 2 && B >= 2) use_k[1] = use_k[2] + 1;            /* decreasing */
    if (bad == 2 && B < 2) use_k[0] = -1;

    const float amp = pick_amp(p);
    float *q = new_floats(cq), *k = new_floats(ck), *v = new_floats(cv);
    fill(p, q, cq, amp), fill(p, k, ck, amp), fill(p, v, cv, amp);
    sdpa_extras ex;
    decode_extras(p, &d, &ex);
    if (bad == 3) d.len_q = lmax - 1; /* a sequence longer than the bound (or a bound of 0) */
    if (bad == 4) d.len_kv = smax - 1;
    kv_for_dtype(p, &d, k, ck, v, cv, &ex);
    const void *kin = ex.kh != NULL ? (const void *)ex.kh : k, *vin = ex.vh != NULL ? (const void *)ex.vh : v;
    uint16_t *qh = decode_half_q_out(p, &d, q, cq);
    const void *qin = qh != NULL ? (const void *)qh : q;
    decode_sinks(p, &d, &ex);
    tol t_out, t_lse;
    double ds;
    forward_tolerances(p, &d, q, cq, k, ck, v, cv, &ex, 0.0, smax, false, &t_out, &t_lse, &ds);
    char extras[160];
    describe_extras(&d, extras, sizeof extras);
    snprintf(problem, sizeof problem,
             "varlen B=%lld H=%lld Hkv=%lld cu_q=%lld,%lld,%lld,%lld cu_k=%lld,%lld,%lld,%lld len_q=%lld len_kv=%lld D=%lld "
             "Dv=%lld stride0=%lld scale=%g causal=%d dropout=%g%s bad=%d%s q=%s out=%s isa=%s",
             (long long)B, (long long)H, (long long)Hkv, (long long)use_q[0], (long long)use_q[1], (long long)use_q[2],
             (long long)use_q[3], (long long)use_k[0], (long long)use_k[1], (long long)use_k[2], (long long)use_k[3],
             (long long)d.len_q, (long long)d.len_kv, (long long)D, (long long)Dv, (long long)junk, (double)d.scale,
             (int)d.causal, d.dropout_p, d.dropout_rng == ATTN_DROPOUT_RNG_PHILOX ? " (Philox)" : "", bad, extras,
             attn_dtype_name(d.q_dtype), attn_dtype_name(d.out_dtype), attn_isa_name(attn_ctx_isa(p->ctx[0])));
    const int64_t nl = H * TQ;
    float *out[3] = {NULL, NULL, NULL}, *lse[3] = {NULL, NULL, NULL};
    attn_status st[3];
    const attn_generator before = *attn_ctx_generator(p->ctx[1]);
    float *ref_lse = new_floats(nl); /* the reference's, before lse_in_log2_range */
    for (int c = 0; c < p->n; c++) {
        out[c] = new_floats(co), lse[c] = new_floats(nl);
        memset(out[c], 0xCD, (size_t)co * sizeof(float)), memset(lse[c], 0xCD, (size_t)nl * sizeof(float));
        st[c] = attn_sdpa_varlen_fwd(p->ctx[c], &d, use_q, use_k, qin, kin, vin, out[c], lse[c]);
        if (st[c] == ATTN_OK) half_out_as_floats(out[c], d.out_dtype, co); /* the half results as floats */
    }
    compare_status(p, st, "attn_sdpa_varlen_fwd");
    if (bad != 0) {
        FUZZ_CHECK(st[0] != ATTN_OK, "invalid offsets or bounds accepted in %s", problem);
        for (int c = 0; c < p->n; c++)
            for (int64_t i = 0; i < co; i++) {
                uint32_t bits;
                memcpy(&bits, &out[c][i], sizeof bits);
                FUZZ_CHECK(bits == 0xCDCDCDCDu, "a refused call wrote out[%lld] in %s", (long long)i, problem);
            }
    } else if (st[0] == ATTN_OK) { /* (other arguments may be refused: a NaN scale, ...) */
        memcpy(ref_lse, lse[1], (size_t)nl * sizeof(float));
        for (int c = 0; c < p->n; c++) lse_in_log2_range(lse[c], nl);
        for (int c = 1; c < p->n; c++) {
            compare_run(p, c, out[0], out[c], co, t_out, "out");
            compare_run(p, c, lse[0], lse[c], nl, t_lse, "lse");
        }
    }
    compare_generators(p);
    /* each sequence alone on the reference, drawing as the packed call drew */
    if (bad == 0 && st[0] == ATTN_OK && d.dropout_rng != ATTN_DROPOUT_RNG_PHILOX) {
        attn_generator *g = attn_ctx_generator(p->ctx[1]);
        const attn_generator after = *g;
        *g = before;
        for (int64_t b = 0; b < B; b++) {
            const int64_t lq = cu_q[b + 1] - cu_q[b], lk = cu_k[b + 1] - cu_k[b];
            if (lq == 0) continue;
            const float *orow = out[1] + cu_q[b] * d.o_stride[2];
            if (lk == 0) { /* no key: zero rows, lse -inf; with a sink zh, lse = zh (NaN rows for zh NaN or +inf) */
                for (int64_t h = 0; h < H; h++) {
                    float zh = d.sinks != NULL ? d.sinks[h] : -INFINITY;
                    const bool nan_row = isnan(zh) || zh == INFINITY;
                    lse_in_log2_range(&zh, 1); /* the kernels' clamp (attn.h), which the sink goes through */
                    for (int64_t i = 0; i < lq; i++) {
                        const float l = ref_lse[h * TQ + cu_q[b] + i];
                        FUZZ_CHECK(nan_row ? isnan(l) : l == zh, "a sequence without keys: lse %g in %s", (double)l, problem);
                        for (int64_t e = 0; e < Dv; e++) {
                            const float o = orow[h * d.o_stride[1] + i * d.o_stride[2] + e * d.o_stride[3]];
                            FUZZ_CHECK(nan_row ? isnan(o) : o == 0.0f, "a sequence without keys: out %g in %s", (double)o,
                                       problem);
                        }
                    }
                }
                continue;
            }
            const attn_sdpa_desc db = packed_seq_desc(&d, &pb, b);
            const size_t qs = attn_dtype_size(d.q_dtype), ks = attn_dtype_size(d.kv_dtype), os = attn_dtype_size(d.out_dtype);
            const char *qb = (const char *)qin + (size_t)(cu_q[b] * d.q_stride[2]) * qs;
            const char *kb = (const char *)kin + (size_t)(cu_k[b] * d.k_stride[2]) * ks;
            const char *vb = (const char *)vin + (size_t)(cu_k[b] * d.v_stride[2]) * ks;
            void *ob = fuzz_xmalloc((size_t)co * os);
            float *lb = new_floats(H * lq);
            const attn_status sb = attn_sdpa_fwd(p->ctx[1], &db, qb, kb, vb, ob, lb, NULL);
            FUZZ_CHECK(sb == ATTN_OK, "sequence %lld alone: %s in %s", (long long)b, attn_ctx_last_error(p->ctx[1]), problem);
            float *of = new_floats(co); /* ob as floats, at out's offsets from the sequence's first row */
            const int64_t n_used = (H - 1) * d.o_stride[1] + (lq - 1) * d.o_stride[2] + (Dv - 1) * d.o_stride[3] + 1;
            if (d.out_dtype != ATTN_DTYPE_F32)
                FUZZ_CHECK(attn_convert(ATTN_DTYPE_F32, of, d.out_dtype, ob, n_used) == ATTN_OK, "attn_convert");
            else
                memcpy(of, ob, (size_t)n_used * sizeof(float));
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < lq; i++) {
                    const float lp = ref_lse[h * TQ + cu_q[b] + i], la = lb[h * lq + i];
                    FUZZ_CHECK(memcmp(&lp, &la, sizeof lp) == 0 || (isnan(lp) && isnan(la)),
                               "sequence %lld row %lld head %lld: packed lse %.9g, alone %.9g in %s", (long long)b,
                               (long long)i, (long long)h, (double)lp, (double)la, problem);
                    for (int64_t e = 0; e < Dv; e++) {
                        const int64_t at = h * d.o_stride[1] + i * d.o_stride[2] + e * d.o_stride[3];
                        FUZZ_CHECK(memcmp(&orow[at], &of[at], sizeof(float)) == 0 || (isnan(orow[at]) && isnan(of[at])),
                                   "sequence %lld out[%lld]: packed %.9g, alone %.9g in %s", (long long)b, (long long)at,
                                   (double)orow[at], (double)of[at], problem);
                    }
                }
            free(ob), free(lb), free(of);
        }
        FUZZ_CHECK(memcmp(g->mt, after.mt, sizeof g->mt) == 0 && g->left == after.left && g->next == after.next,
                   "the sequences alone drew differently from the packed call in %s", problem);
        *g = after;
    }
    /* sequences all of one length: the packed batch is a plain batch of them (attn.h: Philox counts
     * the packed batch's sequences as a plain batch's, the context's generator draws sequence after
     * sequence), whatever the dropout: the reference's bits and generator state */
    bool equal = bad == 0 && st[0] == ATTN_OK;
    for (int64_t b = 0; equal && b < B; b++)
        equal = cu_q[b + 1] - cu_q[b] == cu_q[1] && cu_k[b + 1] - cu_k[b] == cu_k[1] && cu_q[1] > 0 && cu_k[1] > 0;
    if (equal) {
        const int64_t lq = cu_q[1], lk = cu_k[1];
        attn_sdpa_desc dp = d;
        dp.len_q = lq, dp.len_kv = lk;
        dp.q_stride[0] = lq * d.q_stride[2], dp.o_stride[0] = lq * d.o_stride[2];
        dp.k_stride[0] = lk * d.k_stride[2], dp.v_stride[0] = lk * d.v_stride[2];
        attn_generator *g = attn_ctx_generator(p->ctx[1]);
        const attn_generator after = *g;
        *g = before;
        float *op = new_floats(co), *lp = new_floats(nl);
        memset(op, 0xCD, (size_t)co * sizeof(float));
        const attn_status sp = attn_sdpa_fwd(p->ctx[1], &dp, qin, kin, vin, op, lp, NULL);
        FUZZ_CHECK(sp == ATTN_OK, "the plain batch: %s in %s", attn_ctx_last_error(p->ctx[1]), problem);
        half_out_as_floats(op, d.out_dtype, co);
        for (int64_t i = 0; i < co; i++)
            FUZZ_CHECK(memcmp(&out[1][i], &op[i], sizeof(float)) == 0 || (isnan(out[1][i]) && isnan(op[i])),
                       "out[%lld]: packed %.9g, the plain batch of its sequences %.9g in %s", (long long)i,
                       (double)out[1][i], (double)op[i], problem);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < lq; i++) {
                    const float x = ref_lse[h * TQ + b * lq + i], y = lp[(b * H + h) * lq + i];
                    FUZZ_CHECK(memcmp(&x, &y, sizeof x) == 0 || (isnan(x) && isnan(y)),
                               "lse (%lld, %lld, %lld): packed %.9g, plain batch %.9g in %s", (long long)b, (long long)h,
                               (long long)i, (double)x, (double)y, problem);
                }
        FUZZ_CHECK(memcmp(g->mt, after.mt, sizeof g->mt) == 0 && g->left == after.left && g->next == after.next,
                   "the plain batch drew differently from the packed call in %s", problem);
        *g = after;
        free(op), free(lp);
    }
    for (int c = 0; c < p->n; c++) free(out[c]), free(lse[c]);
    free(ref_lse);
    free(q), free(k), free(v), free(qh);
    free_extras(&ex);
}

/* ---- raw half values and raw Q8_0 / Q4_0 blocks (first byte 155, 187, 219 or 251) ------------ */

/* A half bit pattern: now and then a special (signed zeros, the smallest and largest subnormals,
 * the smallest normal, the largest finite value, infinities, quiet and signalling NaNs, 1), else
 * a moderate value (|x| up to 2^(e-15) or 2^(e-127) for the drawn exponent range). */
static uint16_t raw_half(pair *p, attn_dtype dt, int special_rate) {
    static const uint16_t f16[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x03ff, 0x0400, 0x7bff, 0xfbff,
                                   0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe00, 0x3c00};
    static const uint16_t bf16[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x007f, 0x0080, 0x7f7f, 0xff7f,
                                    0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffc0, 0x3f80};
    if ((int)fuzz_rng_below(&p->rng, 64) < special_rate)
        return (dt == ATTN_DTYPE_BF16 ? bf16 : f16)[fuzz_rng_below(&p->rng, 14)];
    /* sign, an exponent near 1 (within 2^-6 .. 2^2), random mantissa */
    const uint16_t sign = (uint16_t)(fuzz_rng_below(&p->rng, 2) << 15);
    if (dt == ATTN_DTYPE_BF16)
        return (uint16_t)(sign | (uint16_t)((121 + fuzz_rng_below(&p->rng, 8)) << 7) | (uint16_t)fuzz_rng_below(&p->rng, 128));
    return (uint16_t)(sign | (uint16_t)((9 + fuzz_rng_below(&p->rng, 8)) << 10) | (uint16_t)fuzz_rng_below(&p->rng, 1024));
}

/* n values of a block type as raw blocks: each block is all zero, has a zero scale, a special
 * scale (NaN, inf, subnormal, the largest half) with random or zero quants, extreme quants (-128,
 * 127; nibbles 0 and 15), or (mostly) a moderate scale with random quants. */
static uint8_t *raw_blocks(pair *p, attn_dtype dt, int64_t n, int special_rate) {
    const int64_t nb = n / 32;
    const size_t bs = attn_dtype_size(dt);
    uint8_t *x = fuzz_xmalloc((size_t)(nb > 0 ? nb : 1) * bs);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = x + (size_t)b * bs;
        const int kind = (int)fuzz_rng_below(&p->rng, 64) < special_rate ? (int)fuzz_rng_below(&p->rng, 5) : 5;
        uint16_t d = kind == 0 || kind == 1 ? (uint16_t)(fuzz_rng_below(&p->rng, 2) << 15)
                     : kind == 2            ? raw_half(p, ATTN_DTYPE_F16, 64)
                     : kind == 3            ? (fuzz_rng_below(&p->rng, 2) ? 0x7bff : 0x0001)
                                            : raw_half(p, ATTN_DTYPE_F16, 0);
        if (kind == 5) d = (uint16_t)((d & 0x83ff) | (uint16_t)((4 + fuzz_rng_below(&p->rng, 10)) << 10)); /* 2^-11 .. 2^-2 */
        blk[0] = (uint8_t)(d & 0xff), blk[1] = (uint8_t)(d >> 8);
        for (size_t i = 2; i < bs; i++) {
            const uint8_t r = (uint8_t)fuzz_rng_below(&p->rng, 256);
            blk[i] = kind == 0 ? 0 : kind == 3 ? (dt == ATTN_DTYPE_Q8_0 ? (r & 1 ? 0x80 : 0x7f) : (r & 1 ? 0x0f : 0xf0)) : r;
        }
        if (kind == 2 && fuzz_rng_below(&p->rng, 2)) memset(blk + 2, dt == ATTN_DTYPE_Q8_0 ? 0 : 0x88, bs - 2);
    }
    return x;
}

/* The values of raw blocks, decoded here (value = q * d in float, d the IEEE half scale), checked
 * against attn_convert's, which attn.h says is q * d exactly. */
static float *dequantise(attn_dtype dt, const uint8_t *x, int64_t n) {
    float *f = new_floats(n), *g = new_floats(n);
    const size_t bs = attn_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *blk = x + (size_t)(i / 32) * bs;
        const float d = (float)half_value(ATTN_DTYPE_F16, (uint16_t)(blk[0] | blk[1] << 8));
        const int j = (int)(i % 32);
        const int q = dt == ATTN_DTYPE_Q8_0 ? (int)(int8_t)blk[2 + j]
                                            : (j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4)) - 8;
        f[i] = (float)q * d;
    }
    FUZZ_CHECK(attn_convert(ATTN_DTYPE_F32, g, dt, x, n) == ATTN_OK, "attn_convert %s -> F32", attn_dtype_name(dt));
    for (int64_t i = 0; i < n; i++)
        FUZZ_CHECK(isnan(f[i]) ? isnan(g[i]) : memcmp(&f[i], &g[i], sizeof(float)) == 0,
                   "attn_convert %s -> F32: value %lld of a raw block is %.9g, not q * d = %.9g", attn_dtype_name(dt),
                   (long long)i, (double)g[i], (double)f[i]);
    free(g);
    return f;
}

/*
 * SDPA with k and v given as raw bit patterns (F16, BF16, or Q8_0 / Q4_0 blocks, specials
 * included) and q as floats or raw halves, against the reference, with the bound attn.h states
 * for half and quantised types (attn_sdpa_desc.q_dtype): for each element of a row (b, h, i)
 *   |out - out_ref| <= 2 u_o |out_ref| + t_o + (exp(2 delta) - 1 + 2^-16) max_j |v_j|,
 *   delta = (D + 2) 2^-24 scale sum_t |q_t| max_j |k_j|_inf + 2^-22 softcap,
 * and on the bf16 dot products (attn_isa_bf16_dot, bf16 q, k and v, even D) 2^-8 more beside
 * 2^-16, 2^-126 scale sum_t |q_t| + 2^-125 D max_j |k_j|_inf more in delta and S 2^-125 more in all;
 * with Q8_0 and Q4_0 on the int8 ISAs (fuzz_on_int8_query: the query rounded to int8) attn.h's delta_q more in
 * delta, and on AVX512_BF16 (fuzz_int8_weights) 2^-8 exp(2 delta) beside 2^-16 and S 2^-122 more in all,
 * on AVX512_VNNI, AMX_BF16 and AVX2 (fuzz_int16_weights) Q (2^-9 m_d + S 2^-125) more in all (m_d: the value blocks'
 * largest finite scale).
 * Rows that see a NaN or infinite key or value (a NaN or infinite scale makes its block's values
 * NaN or +-inf: q * d), or whose q holds one, must be non-finite in the same places on both sides
 * (unless the scores span more than the flush of tiny weights, see loose_nonfinite); rows that see
 * none must be finite on both.
 */
static void diff_sdpa_raw(pair *p) {
    fuzz_data *fd = p->fd;
    static const attn_dtype kv_types[4] = {ATTN_DTYPE_F16, ATTN_DTYPE_BF16, ATTN_DTYPE_Q8_0, ATTN_DTYPE_Q4_0};
    static const attn_dtype types[3] = {ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.kv_dtype = kv_types[fuzz_data_pick(fd, 4)];
    d.q_dtype = types[fuzz_data_pick(fd, 3)];
    d.out_dtype = types[fuzz_data_pick(fd, 3)];
    const bool quant = d.kv_dtype == ATTN_DTYPE_Q8_0 || d.kv_dtype == ATTN_DTYPE_Q4_0;
    const int64_t B = fuzz_data_i64_range(fd, 1, 2), Hkv = fuzz_data_i64_range(fd, 1, 3), G = fuzz_data_i64_range(fd, 1, 3);
    const int64_t L = fuzz_data_i64_range(fd, 1, 12), S = fuzz_data_i64_range(fd, 1, 80), H = Hkv * G;
    const int64_t D = quant ? 32 * fuzz_data_i64_range(fd, 1, 3) : fuzz_data_i64_range(fd, 1, 40);
    const int64_t Dv = quant ? 32 * fuzz_data_i64_range(fd, 1, 2) : fuzz_data_i64_range(fd, 1, 40);
    d.batch = B, d.n_heads = H, d.n_kv_heads = Hkv, d.len_q = L, d.len_kv = S, d.head_dim = D, d.head_dim_v = Dv;
    d.causal = (attn_causal)fuzz_data_pick(fd, 3);
    if (fuzz_data_chance(fd, 1, 3)) d.scale = fuzz_data_float_range(fd, -2.0f, 2.0f);
    if (fuzz_data_chance(fd, 1, 4)) d.softcap = fuzz_data_float_range(fd, 0.5f, 50.0f);
    /* k and v (B, Hkv, S, D) contiguous or token-major (B, S, Hkv, D): strides whole blocks */
    const attn_layout kl = fuzz_data_bool(fd) ? ATTN_LAYOUT_BLHD : ATTN_LAYOUT_BHLD;
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, L, D, d.q_stride);
    attn_layout_strides(kl, B, Hkv, S, D, d.k_stride);
    attn_layout_strides(kl, B, Hkv, S, Dv, d.v_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, L, Dv, d.o_stride);
    const int special_rate = (int)fuzz_data_pick(fd, 5) * (int)fuzz_data_pick(fd, 5); /* of 64: often none */
    const int64_t nq = B * H * L * D, nk = B * Hkv * S * D, nv = B * Hkv * S * Dv, no = B * H * L * Dv;

    float *q = new_floats(nq), *k, *v;
    void *kraw, *vraw, *qraw = NULL;
    fill(p, q, nq, pick_amp(p));
    if (d.q_dtype != ATTN_DTYPE_F32) {
        uint16_t *h = fuzz_xmalloc((size_t)nq * sizeof(uint16_t));
        for (int64_t i = 0; i < nq; i++) h[i] = raw_half(p, d.q_dtype, special_rate);
        FUZZ_CHECK(attn_convert(ATTN_DTYPE_F32, q, d.q_dtype, h, nq) == ATTN_OK, "attn_convert");
        qraw = h;
    }
    if (quant) {
        kraw = raw_blocks(p, d.kv_dtype, nk, special_rate), vraw = raw_blocks(p, d.kv_dtype, nv, special_rate);
        k = dequantise(d.kv_dtype, kraw, nk), v = dequantise(d.kv_dtype, vraw, nv);
    } else {
        uint16_t *kh = fuzz_xmalloc((size_t)nk * sizeof(uint16_t)), *vh = fuzz_xmalloc((size_t)nv * sizeof(uint16_t));
        for (int64_t i = 0; i < nk; i++) kh[i] = raw_half(p, d.kv_dtype, special_rate);
        for (int64_t i = 0; i < nv; i++) vh[i] = raw_half(p, d.kv_dtype, special_rate);
        k = new_floats(nk), v = new_floats(nv);
        FUZZ_CHECK(attn_convert(ATTN_DTYPE_F32, k, d.kv_dtype, kh, nk) == ATTN_OK, "attn_convert");
        FUZZ_CHECK(attn_convert(ATTN_DTYPE_F32, v, d.kv_dtype, vh, nv) == ATTN_OK, "attn_convert");
        kraw = kh, vraw = vh;
    }
    float *sinks = NULL; /* finite attention sinks now and then (drawn last: older inputs decode as they did) */
    if (fuzz_data_chance(fd, 1, 4)) {
        sinks = new_floats(H);
        for (int64_t h = 0; h < H; h++) sinks[h] = fuzz_rng_float(&p->rng, -30.0f, 30.0f);
        d.sinks = sinks;
    }
    snprintf(problem, sizeof problem,
             "sdpa raw B=%lld H=%lld Hkv=%lld L=%lld S=%lld D=%lld Dv=%lld scale=%g softcap=%g causal=%d q=%s kv=%s "
             "out=%s kv layout=%d specials=%d/64 sinks=%d isa=%s",
             (long long)B, (long long)H, (long long)Hkv, (long long)L, (long long)S, (long long)D, (long long)Dv,
             (double)d.scale, (double)d.softcap, (int)d.causal, attn_dtype_name(d.q_dtype), attn_dtype_name(d.kv_dtype),
             attn_dtype_name(d.out_dtype), (int)kl, special_rate, sinks != NULL, attn_isa_name(attn_ctx_isa(p->ctx[0])));
    float *out[3] = {NULL, NULL, NULL}, *lse[3] = {NULL, NULL, NULL};
    attn_status st[3];
    for (int c = 0; c < p->n; c++) {
        out[c] = new_floats(no), lse[c] = new_floats(B * H * L);
        st[c] = attn_sdpa_fwd(p->ctx[c], &d, qraw != NULL ? qraw : (const void *)q, kraw, vraw, out[c], lse[c], NULL);
        if (st[c] == ATTN_OK) half_out_as_floats(out[c], d.out_dtype, no); /* the half results as floats */
    }
    compare_status(p, st, "attn_sdpa_fwd");
    FUZZ_CHECK(st[0] == ATTN_OK, "attn_sdpa_fwd: %s in %s", attn_ctx_last_error(p->ctx[0]), problem);
    const double u_o = d.out_dtype == ATTN_DTYPE_BF16 ? 0x1p-8 : d.out_dtype == ATTN_DTYPE_F16 ? 0x1p-11 : 0x1p-24;
    const double t_o = d.out_dtype == ATTN_DTYPE_BF16 ? 0x1p-133 : d.out_dtype == ATTN_DTYPE_F16 ? 0x1p-24 : 0x1p-149;
    const double o_max = d.out_dtype == ATTN_DTYPE_F16 ? 65504.0 : 0x1.fep127; /* BF16's largest; F32 near it */
    const bool dot = fuzz_on_dot(p->ctx[0], &d);
    const int i8dot = fuzz_on_int8_query(p->ctx[0], d.kv_dtype); /* the query rounded to int8 */
    const int i8w = fuzz_int8_weights(p->ctx[0], d.kv_dtype);    /* and the weights to bf16 */
    const double eps = dot ? 0x1p-8 + 0x1p-16 : 0x1p-16,
                 flushed = dot ? (double)S * 0x1p-125 : i8w ? (double)S * 0x1p-122 : 0.0,
                 /* and on AVX512_VNNI, AMX_BF16 and AVX2 to int16 (the largest finite scale of all the value blocks) */
                 i16 = fuzz_int16_weights(p->ctx[0], d.kv_dtype)
                           ? fuzz_int16_term(d.kv_dtype, finite_scale_max(d.kv_dtype, vraw, 1, nv / Dv, Dv, nv / Dv), S)
                           : 0.0;
    const double scale = d.scale != 0.0f ? fabs((double)d.scale) : 1.0 / sqrt((double)D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t hk = h / G;
            double kmax = 0.0, vmax = 0.0; /* over the kv head's finite values */
            bool kv_nonfinite = false, k_nonfinite = false;
            for (int64_t j = 0; j < S; j++) {
                const float *kr = k + b * d.k_stride[0] + hk * d.k_stride[1] + j * d.k_stride[2];
                const float *vr = v + b * d.v_stride[0] + hk * d.v_stride[1] + j * d.v_stride[2];
                for (int64_t t = 0; t < D; t++) k_nonfinite |= !isfinite(kr[t]), kmax = isfinite(kr[t]) ? fmax(kmax, fabs((double)kr[t])) : kmax;
                for (int64_t t = 0; t < Dv; t++) kv_nonfinite |= !isfinite(vr[t]), vmax = isfinite(vr[t]) ? fmax(vmax, fabs((double)vr[t])) : vmax;
            }
            kv_nonfinite |= k_nonfinite;
            for (int64_t i = 0; i < L; i++) {
                const float *qr = q + b * d.q_stride[0] + h * d.q_stride[1] + i * d.q_stride[2];
                double qsum = 0.0, qmax = 1.0;
                bool q_nonfinite = false;
                for (int64_t t = 0; t < D; t++)
                    q_nonfinite |= !isfinite(qr[t]), qsum += isfinite(qr[t]) ? fabs((double)qr[t]) : 0.0,
                        qmax = isfinite(qr[t]) ? fmax(qmax, fabs((double)qr[t])) : qmax;
                const double delta = (double)(D + 2) * 0x1p-24 * scale * qsum * kmax + 0x1p-22 * (double)d.softcap +
                                     (dot ? 0x1p-126 * scale * qsum + 0x1p-125 * (double)D * kmax : 0.0) +
                                     fuzz_int8_delta(i8dot, qr, D, d.q_stride[3], scale, kmax);
                const double u_w = i8w ? 0x1p-8 * exp(2.0 * delta) : 0.0; /* the weights' bf16 rounding */
                /* the scores' magnitude: an infinite q or k element makes a score infinite, which the
                 * soft cap turns into +-cap (the finite elements' sums alone miss it) */
                const double smag = d.softcap > 0.0f ? (q_nonfinite || k_nonfinite ? (double)d.softcap
                                                                                   : fmin((double)d.softcap, scale * qsum * kmax))
                                                     : scale * qsum * kmax;
                const bool seen_nonfinite = q_nonfinite || kv_nonfinite; /* the row may see one */
                /* attn.h: |scale * q| past about 2.3e38 makes the fused kernels' row NaN */
                const bool in_range = scale * qsum * kmax < (double)FLT_MAX / 16.0 && vmax * (double)S < (double)FLT_MAX / 16.0 &&
                                      scale * qmax <= (double)FLT_MAX / 4.0;
                /* attn.h's bound on |kernels - reference| for an output of size |r|: 2 u_o |r| + spread */
                const double spread = t_o + (expm1(2.0 * delta) + eps + u_w) * vmax + flushed + i16;
                for (int64_t e = 0; e < Dv; e++) {
                    const int64_t o = b * d.o_stride[0] + h * d.o_stride[1] + i * d.o_stride[2] + e;
                    const float a = out[0][o], r = out[1][o];
                    if (!isfinite(a) || !isfinite(r)) {
                        /* finite inputs give finite results unless float or the output type cannot
                         * hold the scores, the sums of values or the output */
                        FUZZ_CHECK(seen_nonfinite || !in_range || vmax >= o_max,
                                   "out[%lld] = %g (kernels), %g (reference) from finite inputs in %s", (long long)o,
                                   (double)a, (double)r, problem);
                        const bool same = fuzz_close(a, r, 0.0, 0.0);
                        /* rounded either way: the finite side at the type's largest value, or within the
                         * bound of a value the type cannot hold while the other side is that infinity */
                        const float fin = isfinite(a) ? a : r, other = isfinite(a) ? r : a;
                        const double f = fabs((double)fin);
                        const bool overflow = f >= o_max || (isinf(other) && signbit(other) == signbit(fin) &&
                                                             f + 2.0 * u_o * f + spread >= o_max);
                        FUZZ_CHECK(same || overflow || !in_range || 2.0 * smag > 80.0,
                                   "out[%lld]: kernels %g, reference %g in %s", (long long)o, (double)a, (double)r, problem);
                        continue;
                    }
                    const double bound = 2.0 * u_o * fabs((double)r) + spread;
                    FUZZ_CHECK(fabs((double)a - (double)r) <= bound || !isfinite(bound) || !in_range,
                               "out[%lld]: kernels %.9g, reference %.9g, beyond attn.h's bound %g in %s", (long long)o,
                               (double)a, (double)r, bound, problem);
                }
            }
        }
    for (int c = 2; c < p->n; c++) compare_bits(out[0], out[c], no, "out"), compare_bits(lse[0], lse[c], B * H * L, "lse");
    compare_generators(p);
    /* read as they are: the reference on float32 copies of the decoded values gives the same */
    {
        attn_sdpa_desc df = d;
        df.kv_dtype = ATTN_DTYPE_F32, df.q_dtype = ATTN_DTYPE_F32;
        float *of = new_floats(no), *lf = new_floats(B * H * L);
        FUZZ_CHECK(attn_sdpa_fwd(p->ctx[1], &df, q, k, v, of, lf, NULL) == ATTN_OK, "attn_sdpa_fwd: %s",
                   attn_ctx_last_error(p->ctx[1]));
        half_out_as_floats(of, d.out_dtype, no);
        compare_bits(out[1], of, no, "out of the reference on the decoded values");
        compare_bits(lse[1], lf, B * H * L, "lse of the reference on the decoded values");
        free(of), free(lf);
    }
    for (int c = 0; c < p->n; c++) free(out[c]), free(lse[c]);
    free(q), free(k), free(v), free(qraw), free(kraw), free(vraw), free(sinks);
}

/* ---- nn.MultiheadAttention ------------------------------------------------------------------- */

static void diff_mha(pair *p) {
    fuzz_data *fd = p->fd;
    attn_mha_config cfg;
    attn_mha *m[3] = {NULL, NULL, NULL};
    int64_t pn[8];
    const char *pname[8];
    const int count = open_mha(p, &cfg, m, pn, pname);
    const int64_t H = cfg.num_heads, E = cfg.embed_dim, hd = E / H;
    const int64_t kd = cfg.kdim == 0 ? E : cfg.kdim, vd = cfg.vdim == 0 ? E : cfg.vdim;
    attn_status st[3];

    attn_mha_args a;
    decode_mha_batch(fd, &a);
    const int64_t N = a.batch, L = a.len_q;
    /* key: omitted (only when kdim == E), the query itself (same shape), or its own tensor. */
    int kmode = (int)fuzz_data_pick(fd, 3);
    if (kmode != 2 && kd != E) kmode = 2;
    const int64_t S = kmode == 2 ? fuzz_data_i64_range(fd, 1, 5) : L;
    a.len_kv = S;
    const int64_t kw = kmode == 2 ? kd : E;
    int vmode = (int)fuzz_data_pick(fd, 3);
    if (vmode != 2 && vd != kw) vmode = 2;
    a.training = fuzz_data_chance(fd, 1, 3);
    const float amp = pick_amp(p);
    float *q = new_floats(L * N * E), *k = NULL, *v = NULL;
    fill(p, q, L * N * E, amp);
    if (kmode == 2) k = new_floats(S * N * kd), fill(p, k, S * N * kd, amp);
    if (vmode == 2) v = new_floats(S * N * vd), fill(p, v, S * N * vd, amp);
    a.query = q;
    a.key = kmode == 0 ? NULL : kmode == 1 ? q : k;
    a.value = vmode == 0 ? NULL : vmode == 1 ? (a.key != NULL ? a.key : q) : v;
    void *mask, *kpm;
    const int64_t nmask = decode_mha_masks(p, &a, H, &mask, &kpm);
    double wsum = 0.0, bmax = 0.0;
    for (int i = 0; i < count; i++) {
        int64_t shape[3];
        int ndim;
        float *data;
        attn_mha_param_at(m[1], i, NULL, &ndim, shape, &data);
        param_bounds(ndim, shape, data, &wsum, &bmax);
    }
    double in_amp = max_abs(q, L * N * E);
    if (k != NULL && max_abs(k, S * N * kd) > in_amp) in_amp = max_abs(k, S * N * kd);
    if (v != NULL && max_abs(v, S * N * vd) > in_amp) in_amp = max_abs(v, S * N * vd);
    const int64_t width = kd > vd ? (kd > E ? kd : E) : (vd > E ? vd : E);
    const double keep = a.training && cfg.dropout > 0.0 ? 1.0 / (1.0 - cfg.dropout) : 1.0;
    tol t_out, t_w;
    double smag;
    module_tols(in_amp, wsum, bmax, width, hd, E, keep, &t_out, &t_w, &smag);
    bool nonfinite = any_nonfinite(q, L * N * E) || (k != NULL && any_nonfinite(k, S * N * kd)) ||
                     (v != NULL && any_nonfinite(v, S * N * vd));
    if (mask != NULL && a.attn_mask_dtype == ATTN_DTYPE_F32)
        for (int64_t i = 0; i < nmask; i++)
            nonfinite = nonfinite || isnan(((const float *)mask)[i]) || ((const float *)mask)[i] == INFINITY;
    if (kpm != NULL && a.key_padding_mask_dtype == ATTN_DTYPE_F32)
        for (int64_t i = 0; i < N * S; i++)
            nonfinite = nonfinite || isnan(((const float *)kpm)[i]) || ((const float *)kpm)[i] == INFINITY;
    loose_nonfinite = (nonfinite && 2.0 * smag > 80.0) || smag > (double)FLT_MAX / 16.0;
    snprintf(problem, sizeof problem,
             "mha E=%lld H=%lld kdim=%lld vdim=%lld bias=%d bias_kv=%d zero_attn=%d batch_first=%d dropout=%g N=%lld "
             "L=%lld S=%lld unbatched=%d key=%d value=%d mask=%s/%d kpm=%s causal=%d weights=%d/%d training=%d isa=%s",
             (long long)E, (long long)H, (long long)kd, (long long)vd, cfg.bias, cfg.add_bias_kv, cfg.add_zero_attn,
             cfg.batch_first, cfg.dropout, (long long)N, (long long)L, (long long)S, a.unbatched, kmode, vmode,
             a.attn_mask == NULL ? "none" : attn_dtype_name(a.attn_mask_dtype), a.attn_mask_ndim,
             a.key_padding_mask == NULL ? "none" : attn_dtype_name(a.key_padding_mask_dtype), a.causal, a.need_weights,
             a.average_attn_weights, a.training, attn_isa_name(attn_ctx_isa(p->ctx[0])));
    const int64_t S2 = attn_mha_weights_len_kv(m[0], S);
    const int64_t nw = a.need_weights ? N * (a.average_attn_weights ? 1 : H) * L * S2 : 0;
    float *out[3] = {NULL, NULL, NULL}, *w[3] = {NULL, NULL, NULL};
    for (int c = 0; c < p->n; c++) {
        out[c] = new_floats(L * N * E);
        memset(out[c], 0xCD, (size_t)(L * N * E) * sizeof(float));
        if (nw > 0) w[c] = new_floats(nw), memset(w[c], 0xCD, (size_t)nw * sizeof(float));
        st[c] = attn_mha_forward(p->ctx[c], m[c], &a, out[c], w[c]);
    }
    compare_status(p, st, "attn_mha_forward");
    FUZZ_CHECK(st[0] == ATTN_OK, "attn_mha_forward: %s", attn_ctx_last_error(p->ctx[0]));
    for (int c = 1; c < p->n; c++) {
        compare_run(p, c, out[0], out[c], L * N * E, t_out, "mha out");
        if (nw > 0) compare_run(p, c, w[0], w[c], nw, t_w, "mha weights");
    }
    compare_generators(p);
    for (int c = 0; c < p->n; c++) free(out[c]), free(w[c]), attn_mha_free(m[c]);
    free(q), free(k), free(v), free(mask), free(kpm);
}

/* ---- the book's modules ---------------------------------------------------------------------- */

static void diff_book(pair *p) {
    fuzz_data *fd = p->fd;
    book_config b;
    attn_book *m[3] = {NULL, NULL, NULL};
    open_book(p, &b, m);
    attn_status st[3];
    const int64_t batch = fuzz_data_i64_range(fd, 1, 3), n = fuzz_data_i64_range(fd, 1, b.context_length);
    const int64_t outf = attn_book_out_features(m[0]);
    const int64_t hw = b.kind == ATTN_BOOK_MHA_WRAPPER || b.kind == ATTN_BOOK_MHA ? b.heads : 1;
    const int training = fuzz_data_chance(fd, 1, 3), want_w = fuzz_data_bool(fd);
    float *x = new_floats(batch * n * b.d_in);
    fill(p, x, batch * n * b.d_in, pick_amp(p));
    double wsum = 0.0, bmax = 0.0;
    for (int i = 0; i < attn_book_param_count(m[1]); i++) {
        int64_t shape[2];
        int ndim;
        float *data;
        attn_book_param_at(m[1], i, NULL, &ndim, shape, &data);
        param_bounds(ndim, shape, data, &wsum, &bmax);
    }
    const int64_t hd = b.kind == ATTN_BOOK_MHA ? b.d_out / b.heads : b.d_out;
    const double keep = training && b.dropout > 0.0 ? 1.0 / (1.0 - b.dropout) : 1.0;
    tol t_out, t_w;
    double smag;
    const int64_t width = b.d_in > b.d_out ? b.d_in : b.d_out;
    module_tols(max_abs(x, batch * n * b.d_in), wsum, bmax, width, hd, b.d_out, keep, &t_out, &t_w, &smag);
    loose_nonfinite = (any_nonfinite(x, batch * n * b.d_in) && 2.0 * smag > 80.0) || smag > (double)FLT_MAX / 16.0;
    snprintf(problem, sizeof problem,
             "book kind=%d d_in=%lld d_out=%lld heads=%lld context_length=%lld dropout=%g bias=%d batch=%lld n=%lld "
             "training=%d weights=%d isa=%s",
             (int)b.kind, (long long)b.d_in, (long long)b.d_out, (long long)b.heads, (long long)b.context_length,
             b.dropout, b.bias, (long long)batch, (long long)n, training, want_w,
             attn_isa_name(attn_ctx_isa(p->ctx[0])));
    float *out[3] = {NULL, NULL, NULL}, *w[3] = {NULL, NULL, NULL};
    const int64_t no = batch * n * outf, nw = want_w ? batch * hw * n * n : 0;
    for (int c = 0; c < p->n; c++) {
        out[c] = new_floats(no);
        memset(out[c], 0xCD, (size_t)no * sizeof(float));
        if (want_w) w[c] = new_floats(nw), memset(w[c], 0xCD, (size_t)nw * sizeof(float));
        st[c] = attn_book_forward(p->ctx[c], m[c], x, batch, n, training, out[c], w[c]);
    }
    compare_status(p, st, "attn_book_forward");
    FUZZ_CHECK(st[0] == ATTN_OK, "attn_book_forward: %s", attn_ctx_last_error(p->ctx[0]));
    for (int c = 1; c < p->n; c++) {
        compare_run(p, c, out[0], out[c], no, t_out, "book out");
        if (want_w) compare_run(p, c, w[0], w[c], nw, t_w, "book weights");
    }
    compare_generators(p);
    for (int c = 0; c < p->n; c++) free(out[c]), free(w[c]), attn_book_free(m[c]);
    free(x);
}

static void run(pair *p, unsigned what) {
    switch (what % 8) {
    case 0:
    case 1:
    case 2:
    case 3:
    case 4: /* 156, 188, 220, 252 (first bytes no corpus input had before): KV caches; 155, 187,
             * 219, 251 (none either): raw half values and raw Q8_0 / Q4_0 blocks; 153, 185, 217,
             * 249 (none either): packed batches */
        if (what % 8 == 4 && what >= 156 && (what - 156) % 32 == 0)
            diff_kv_cache(p);
        else if (what % 8 == 3 && what >= 155 && (what - 155) % 32 == 0)
            diff_sdpa_raw(p);
        else if (what % 8 == 1 && what >= 153 && (what - 153) % 32 == 0)
            diff_varlen(p);
        else
            diff_sdpa(p);
        break;
    case 5:
    case 6: diff_mha(p); break;
    default: diff_book(p); break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return diff_main(data, size, run); }

// cmd_sdpa.c - `attn sdpa`: scaled dot-product attention on .npy tensors in (B, H, L, D) layout.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char summary[] =
    "usage: attn sdpa --q Q.npy --k K.npy --v V.npy --out O.npy [--scale X]\n"
    "                 [--causal | --causal-bottom-right] [--mask M.npy] [--key-padding-mask P.npy]\n"
    "                 [--dropout P --seed S] [--lse-out LSE.npy] [--weights-out W.npy [--average-weights]]\n"
    "                 [--window LEFT,RIGHT] [--alibi SLOPES.npy] [--softcap C] [--sinks Z.npy]\n"
    "                 [--kv-dtype f32|f16|bf16|q8_0|q4_0] [--dtype f32|f16|bf16] [--isa ISA]\n"
    "                 [--grad-out DO.npy --grads-out G.safetensors]\n"
    "\n"
    "softmax(scale * q k^T + masks) v over float32 tensors q (B, H, L, D), k (B, Hkv, S, D) and\n"
    "v (B, Hkv, S, Dv); H must be a multiple of Hkv (grouped-query attention: query head h uses kv\n"
    "head h / (H/Hkv)). The scale defaults to 1/sqrt(D). --causal hides keys j > i (top-left aligned,\n"
    "torch.triu(ones(L, S), 1)); --causal-bottom-right hides j > i + S - L. The mask is bool (True =\n"
    "blocked, the nn.MultiheadAttention convention) or float32 (added), of any shape that broadcasts to\n"
    "(B, H, L, S); the key padding mask is (B, S), bool (True = ignore) or float32. A fully masked row\n"
    "gives zeros. Dropout draws like torch.manual_seed(S) then F.dropout on the (B, H, L, S) weights.\n"
    "--window LEFT,RIGHT: query i sees keys i + off - LEFT .. i + off + RIGHT (off = S - L with\n"
    "--causal-bottom-right, else 0; -1 = unbounded side). --alibi: float32 (H) slopes, adding\n"
    "-slope[h] * |i + off - j|. --softcap C: scores become C * tanh(scores / C) before ALiBi and masks.\n"
    "--sinks: float32 (H) attention sink logits (gpt-oss): each row's softmax gains exp(z[h]) in its\n"
    "normaliser, with no value (the weights sum to less than 1; the log-sum-exp includes it).\n"
    "k and v may be float16 .npy files (then both); --kv-dtype f16 or bf16 rounds float32 k and v to\n"
    "that type before the call (products and sums stay float32); q8_0 or q4_0 quantises them in blocks\n"
    "of 32 along D and Dv (ggml's Q8_0 and Q4_0; D and Dv multiples of 32; forward only), which the\n"
    "kernels read directly. Gradients are float32 unless --dtype says otherwise.\n"
    "--dtype f16 or bf16 rounds q, k, v (and dL/d out) to that type and computes out and the gradients in\n"
    "it (attn_sdpa_desc's q/kv/out/grad dtypes); they are written as float32 arrays holding those values.\n"
    "--isa picks the kernels (" ATTN_ISA_NAMES "; default auto).\n"
    "Outputs: out (B, H, L, Dv), log-sum-exp (B, H, L), weights (B, H, L, S) or averaged (B, L, S).\n"
    "With --grad-out DO.npy (dL/d out) the backward runs too and --grads-out receives \"q\", \"k\", \"v\" and,\n"
    "for a float32 mask, \"mask\" (its gradient, summed over the dimensions it broadcasts) and, with\n"
    "--sinks, \"sinks\".";

// Strides (B, H, L, S order) that broadcast a tensor of shape t to (B, H, L, S), right-aligned.
static int broadcast_strides(const char *what, const attn_tensor *t, const int64_t target[4], int64_t stride[4]) {
    if (t->ndim > 4) return cli_error("sdpa", EXIT_FAILURE_RUN, "%s has %d dims, at most 4 broadcast", what, t->ndim);
    int64_t s = 1;
    for (int i = 3, j = t->ndim - 1; i >= 0; i--, j--) {
        int64_t n = j >= 0 ? t->shape[j] : 1;
        if (n != 1 && n != target[i]) {
            char got[96], want[96];
            return cli_error("sdpa", EXIT_FAILURE_RUN, "%s of shape %s does not broadcast to %s", what,
                             cli_shape_str(t->ndim, t->shape, got, sizeof got), cli_shape_str(4, target, want, sizeof want));
        }
        stride[i] = n == 1 ? 0 : s;
        s *= n;
    }
    return 0;
}

// A float32 (H) array of per-head values (--alibi, --sinks).
static int read_per_head(attn_ctx *ctx, const char *what, const char *path, int64_t H, attn_tensor *t) {
    attn_status st = attn_npy_read(ctx, path, t);
    if (st != ATTN_OK) return cli_fail("sdpa", ctx, st, what);
    if (t->dtype != ATTN_DTYPE_F32 || t->ndim != 1 || t->shape[0] != H) {
        char got[96];
        return cli_error("sdpa", EXIT_FAILURE_RUN, "%s must be float32 (%lld), got %s %s", what, (long long)H,
                         attn_dtype_name(t->dtype), cli_shape_str(t->ndim, t->shape, got, sizeof got));
    }
    return 0;
}

// A 4-D float32 array (float16 too when half_ok).
static int read_4d(attn_ctx *ctx, const char *what, const char *path, bool half_ok, attn_tensor *t) {
    attn_status st = attn_npy_read(ctx, path, t);
    if (st != ATTN_OK) return cli_fail("sdpa", ctx, st, what);
    if (!(t->dtype == ATTN_DTYPE_F32 || (half_ok && t->dtype == ATTN_DTYPE_F16)) || t->ndim != 4) {
        char shape[96];
        return cli_error("sdpa", EXIT_FAILURE_RUN, "%s must be a 4-D float32%s array, got %s %s", what,
                         half_ok ? " or float16" : "", attn_dtype_name(t->dtype),
                         cli_shape_str(t->ndim, t->shape, shape, sizeof shape));
    }
    return 0;
}

int cmd_sdpa(int argc, char **argv) {
    const char *q_path = NULL, *k_path = NULL, *v_path = NULL, *mask_path = NULL, *kpm_path = NULL, *out_path = NULL;
    const char *lse_path = NULL, *w_path = NULL, *grad_path = NULL, *grads_path = NULL;
    const char *window = NULL, *alibi_path = NULL, *sinks_path = NULL, *kv_dtype = NULL, *all_dtype = NULL;
    const char *isa_name = "auto";
    double scale = 0.0, dropout = 0.0, softcap = 0.0;
    int64_t seed = 0;
    bool causal = false, causal_br = false, average = false;
    arg_spec specs[] = {
        {"--q", ARG_STRING, &q_path, "Q.npy", "queries (B, H, L, D)", true, false},
        {"--k", ARG_STRING, &k_path, "K.npy", "keys (B, Hkv, S, D)", true, false},
        {"--v", ARG_STRING, &v_path, "V.npy", "values (B, Hkv, S, Dv)", true, false},
        {"--out", ARG_STRING, &out_path, "O.npy", "output (B, H, L, Dv)", true, false},
        {"--scale", ARG_FLOAT, &scale, "X", "score scale (default 1/sqrt(D))", false, false},
        {"--causal", ARG_FLAG, &causal, NULL, "causal mask, top-left aligned", false, false},
        {"--causal-bottom-right", ARG_FLAG, &causal_br, NULL, "causal mask, bottom-right aligned", false, false},
        {"--mask", ARG_STRING, &mask_path, "M.npy", "attention mask broadcasting to (B, H, L, S)", false, false},
        {"--key-padding-mask", ARG_STRING, &kpm_path, "P.npy", "key padding mask (B, S)", false, false},
        {"--dropout", ARG_FLOAT, &dropout, "P", "dropout probability on the weights", false, false},
        {"--seed", ARG_INT, &seed, "S", "generator seed (needed with --dropout)", false, false},
        {"--lse-out", ARG_STRING, &lse_path, "LSE.npy", "log-sum-exp per row (B, H, L)", false, false},
        {"--weights-out", ARG_STRING, &w_path, "W.npy", "attention weights after dropout", false, false},
        {"--average-weights", ARG_FLAG, &average, NULL, "average the weights over heads: (B, L, S)", false, false},
        {"--window", ARG_STRING, &window, "LEFT,RIGHT", "local window sizes (-1: unbounded)", false, false},
        {"--alibi", ARG_STRING, &alibi_path, "SLOPES.npy", "ALiBi slopes, float32 (H)", false, false},
        {"--softcap", ARG_FLOAT, &softcap, "C", "logit soft-capping C * tanh(s / C)", false, false},
        {"--sinks", ARG_STRING, &sinks_path, "Z.npy", "attention sink logits, float32 (H)", false, false},
        {"--kv-dtype", ARG_STRING, &kv_dtype, "T", "f32, f16, bf16, q8_0 or q4_0: round k and v to T first", false, false},
        {"--dtype", ARG_STRING, &all_dtype, "T", "f32, f16 or bf16: q, k, v, out and gradients in T", false, false},
        {"--isa", ARG_STRING, &isa_name, "ISA", "kernels: " ATTN_ISA_NAMES, false, false},
        {"--grad-out", ARG_STRING, &grad_path, "DO.npy", "dL/d out: run the backward too", false, false},
        {"--grads-out", ARG_STRING, &grads_path, "G.safetensors", "q, k, v (and mask, sinks) gradients", false, false},
    };
    const int n_specs = (int)(sizeof specs / sizeof specs[0]);
    int rc = args_parse("sdpa", summary, argc, argv, specs, n_specs);
    if (rc != 0) return rc < 0 ? EXIT_OK : rc;
    if (causal && causal_br) return cli_error("sdpa", EXIT_USAGE, "--causal and --causal-bottom-right are exclusive");
    if (!(dropout >= 0.0 && dropout < 1.0)) return cli_error("sdpa", EXIT_USAGE, "--dropout must be in [0, 1)");
    if (dropout > 0.0 && !args_seen(specs, n_specs, "--seed")) return cli_error("sdpa", EXIT_USAGE, "--dropout needs --seed");
    if (average && w_path == NULL) return cli_error("sdpa", EXIT_USAGE, "--average-weights needs --weights-out");
    if ((grad_path == NULL) != (grads_path == NULL))
        return cli_error("sdpa", EXIT_USAGE, "--grad-out and --grads-out go together");
    int64_t win_left = -1, win_right = -1;
    if (window != NULL && !cli_parse_window(window, &win_left, &win_right))
        return cli_error("sdpa", EXIT_USAGE, "--window wants LEFT,RIGHT with integers >= -1, got '%s'", window);
    if (!(softcap >= 0.0) || softcap > 3.4e38) return cli_error("sdpa", EXIT_USAGE, "--softcap must be >= 0 and finite");
    attn_dtype want_kv = ATTN_DTYPE_F32, want_all = ATTN_DTYPE_F32;
    if (kv_dtype != NULL && !cli_parse_kv_dtype(kv_dtype, &want_kv))
        return cli_error("sdpa", EXIT_USAGE, "--kv-dtype must be f32, f16, bf16, q8_0 or q4_0, not '%s'", kv_dtype);
    if (all_dtype != NULL && !cli_parse_float_dtype(all_dtype, &want_all))
        return cli_error("sdpa", EXIT_USAGE, "--dtype must be f32, f16 or bf16, not '%s'", all_dtype);
    if (kv_dtype != NULL && all_dtype != NULL && want_kv != want_all)
        return cli_error("sdpa", EXIT_USAGE, "--dtype and --kv-dtype disagree");
    if (all_dtype != NULL) want_kv = want_all;
    attn_ctx_params cp;
    attn_ctx_params_init(&cp);
    if ((rc = cli_isa("sdpa", isa_name, &cp.isa)) != 0) return rc;

    attn_ctx *ctx = NULL;
    attn_tensor q = {0}, k = {0}, v = {0}, mask = {0}, kpm = {0}, dout = {0}, slopes = {0}, sinks = {0};
    float *out = NULL, *lse = NULL, *weights = NULL;
    attn_tensor grads[5];
    int n_grads = 0;
    memset(grads, 0, sizeof grads);
    if (cli_context("sdpa", &cp, &ctx) != 0) return EXIT_FAILURE_RUN;
    attn_status st = ATTN_OK;
    rc = EXIT_FAILURE_RUN;
    if (read_4d(ctx, "q", q_path, false, &q) != 0 || read_4d(ctx, "k", k_path, true, &k) != 0 ||
        read_4d(ctx, "v", v_path, true, &v) != 0)
        goto done;
    if (k.dtype != v.dtype) {
        cli_error("sdpa", EXIT_FAILURE_RUN, "k and v must have the same dtype, got %s and %s", attn_dtype_name(k.dtype),
                  attn_dtype_name(v.dtype));
        goto done;
    }
    if (want_kv != ATTN_DTYPE_F32) {
        if (k.dtype != ATTN_DTYPE_F32) {
            cli_error("sdpa", EXIT_FAILURE_RUN, "--kv-dtype converts float32 k and v; these are already %s",
                      attn_dtype_name(k.dtype));
            goto done;
        }
        const int64_t blk = attn_dtype_block_size(want_kv);
        if (k.shape[3] % blk != 0 || v.shape[3] % blk != 0) {
            cli_error("sdpa", EXIT_FAILURE_RUN, "--kv-dtype %s needs D and Dv multiples of %lld, got %lld and %lld",
                      kv_dtype, (long long)blk, (long long)k.shape[3], (long long)v.shape[3]);
            goto done;
        }
        if ((st = cli_to_dtype(&k, want_kv)) != ATTN_OK || (st = cli_to_dtype(&v, want_kv)) != ATTN_OK ||
            (want_all != ATTN_DTYPE_F32 && (st = cli_to_dtype(&q, want_all)) != ATTN_OK)) {
            cli_fail("sdpa", ctx, st, "converting q, k and v");
            goto done;
        }
    }
    const int64_t B = q.shape[0], H = q.shape[1], L = q.shape[2], D = q.shape[3];
    const int64_t Hkv = k.shape[1], S = k.shape[2], Dv = v.shape[3];
    if (k.shape[0] != B || v.shape[0] != B || k.shape[3] != D || v.shape[1] != Hkv || v.shape[2] != S) {
        char a[96], b[96], c[96];
        cli_error("sdpa", EXIT_FAILURE_RUN, "shapes do not fit together: q %s, k %s, v %s (need k (B, Hkv, S, D), v (B, Hkv, S, Dv))",
                  cli_shape_str(4, q.shape, a, sizeof a), cli_shape_str(4, k.shape, b, sizeof b),
                  cli_shape_str(4, v.shape, c, sizeof c));
        goto done;
    }
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = B, d.n_heads = H, d.n_kv_heads = Hkv, d.len_q = L, d.len_kv = S, d.head_dim = D, d.head_dim_v = Dv;
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, L, D, d.q_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, Hkv, S, D, d.k_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, Hkv, S, Dv, d.v_stride);
    attn_layout_strides(ATTN_LAYOUT_BHLD, B, H, L, Dv, d.o_stride);
    d.scale = (float)scale;
    d.causal = causal ? ATTN_CAUSAL_TOP_LEFT : causal_br ? ATTN_CAUSAL_BOTTOM_RIGHT : ATTN_CAUSAL_NONE;
    d.kv_dtype = k.dtype;
    d.q_dtype = d.out_dtype = d.grad_dtype = want_all;
    d.softcap = (float)softcap;
    if (window != NULL) d.use_window = 1, d.window_left = win_left, d.window_right = win_right;
    if (alibi_path != NULL) {
        if (read_per_head(ctx, "--alibi", alibi_path, H, &slopes) != 0) goto done;
        d.alibi_slopes = slopes.data;
    }
    if (sinks_path != NULL) {
        if (read_per_head(ctx, "--sinks", sinks_path, H, &sinks) != 0) goto done;
        d.sinks = sinks.data;
    }
    const int64_t target[4] = {B, H, L, S};
    if (mask_path != NULL) {
        st = attn_npy_read(ctx, mask_path, &mask);
        if (st != ATTN_OK) {
            cli_fail("sdpa", ctx, st, "mask");
            goto done;
        }
        if (broadcast_strides("mask", &mask, target, d.mask_stride) != 0) goto done;
        d.mask = mask.data, d.mask_dtype = mask.dtype == ATTN_DTYPE_U8 ? ATTN_DTYPE_BOOL : mask.dtype;
    }
    if (kpm_path != NULL) {
        st = attn_npy_read(ctx, kpm_path, &kpm);
        if (st != ATTN_OK) {
            cli_fail("sdpa", ctx, st, "key padding mask");
            goto done;
        }
        const int64_t kpm_target[4] = {1, 1, B, S};
        int64_t s4[4];
        if (broadcast_strides("key padding mask", &kpm, kpm_target, s4) != 0) goto done;
        d.key_padding_mask = kpm.data, d.key_padding_mask_dtype = kpm.dtype == ATTN_DTYPE_U8 ? ATTN_DTYPE_BOOL : kpm.dtype;
        d.key_padding_mask_stride[0] = s4[2], d.key_padding_mask_stride[1] = s4[3];
    }
    d.dropout_p = dropout;
    if (dropout > 0.0) attn_generator_seed(attn_ctx_generator(ctx), (uint64_t)seed);
    const attn_generator start = *attn_ctx_generator(ctx); // the backward regenerates the dropout from it
    d.weights_mode = w_path == NULL ? ATTN_WEIGHTS_NONE : average ? ATTN_WEIGHTS_AVERAGE : ATTN_WEIGHTS_PER_HEAD;
    size_t n_out, n_lse, n_w;
    if (__builtin_mul_overflow((size_t)(B * H * L), (size_t)Dv, &n_out) ||
        __builtin_mul_overflow((size_t)(B * (average ? 1 : H)), (size_t)(L), &n_w) ||
        __builtin_mul_overflow(n_w, (size_t)S, &n_w) || n_w > SIZE_MAX / sizeof(float)) {
        cli_error("sdpa", EXIT_FAILURE_RUN, "the outputs are too large");
        goto done;
    }
    n_lse = (size_t)(B * H * L);
    out = malloc(n_out * sizeof(float));
    lse = lse_path != NULL || grad_path != NULL ? malloc(n_lse * sizeof(float)) : NULL;
    weights = w_path != NULL ? malloc(n_w * sizeof(float)) : NULL;
    if (out == NULL || ((lse_path != NULL || grad_path != NULL) && lse == NULL) || (w_path != NULL && weights == NULL)) {
        cli_error("sdpa", EXIT_FAILURE_RUN, "out of memory");
        goto done;
    }
    st = attn_sdpa_fwd(ctx, &d, q.data, k.data, v.data, out, lse, weights);
    if (st != ATTN_OK) {
        cli_fail("sdpa", ctx, st, "forward");
        goto done;
    }
    if (grad_path != NULL) {
        st = attn_npy_read(ctx, grad_path, &dout);
        if (st != ATTN_OK) {
            cli_fail("sdpa", ctx, st, "--grad-out");
            goto done;
        }
        const int64_t want[4] = {B, H, L, Dv};
        if (dout.dtype != ATTN_DTYPE_F32 || dout.ndim != 4 || memcmp(dout.shape, want, sizeof want) != 0) {
            char got[96], exp[96];
            cli_error("sdpa", EXIT_FAILURE_RUN, "--grad-out must be float32 %s, got %s %s",
                      cli_shape_str(4, want, exp, sizeof exp), attn_dtype_name(dout.dtype),
                      cli_shape_str(dout.ndim, dout.shape, got, sizeof got));
            goto done;
        }
        if (want_all != ATTN_DTYPE_F32 && (st = cli_to_dtype(&dout, want_all)) != ATTN_OK) {
            cli_fail("sdpa", ctx, st, "converting --grad-out");
            goto done;
        }
        const attn_tensor *src[3] = {&q, &k, &v};
        const char *names[5] = {"q", "k", "v", "mask", "sinks"};
        for (int i = 0; i < 3; i++) {
            grads[i] = *src[i];
            grads[i].dtype = ATTN_DTYPE_F32;
            grads[i].name = (char *)(uintptr_t)names[i];
            grads[i].data = malloc((size_t)attn_tensor_numel(src[i]) * sizeof(float));
        }
        n_grads = 3;
        const bool dmask = d.mask != NULL && d.mask_dtype == ATTN_DTYPE_F32;
        const attn_tensor *more[2] = {dmask ? &mask : NULL, d.sinks != NULL ? &sinks : NULL};
        for (int i = 0; i < 2; i++)
            if (more[i] != NULL) {
                grads[n_grads] = *more[i];
                grads[n_grads].name = (char *)(uintptr_t)names[3 + i];
                grads[n_grads].data = malloc((size_t)attn_tensor_numel(more[i]) * sizeof(float));
                n_grads++;
            }
        for (int i = 0; i < n_grads; i++)
            if (grads[i].data == NULL) {
                cli_error("sdpa", EXIT_FAILURE_RUN, "out of memory");
                goto done;
            }
        st = attn_sdpa_bwd(ctx, &d, q.data, k.data, v.data, out, dout.data, lse, dropout > 0.0 ? &start : NULL,
                           grads[0].data, grads[1].data, grads[2].data, dmask ? grads[3].data : NULL);
        if (st == ATTN_OK && d.sinks != NULL)
            st = attn_sdpa_sinks_bwd(ctx, &d, NULL, NULL, out, dout.data, lse, grads[n_grads - 1].data);
        for (int i = 0; i < 3 && st == ATTN_OK; i++) st = cli_to_float(&grads[i], want_all);
        if (st == ATTN_OK) st = attn_safetensors_write(ctx, grads_path, grads, n_grads);
        if (st != ATTN_OK) {
            cli_fail("sdpa", ctx, st, "backward");
            goto done;
        }
    }
    const int64_t o_shape[4] = {B, H, L, Dv}, w_shape[4] = {B, H, L, S}, wa_shape[3] = {B, L, S};
    attn_tensor out_t = {.dtype = want_all, .ndim = 1, .shape = {(int64_t)n_out}, .data = out};
    st = cli_to_float(&out_t, want_all);
    if (st == ATTN_OK) st = attn_npy_write(ctx, out_path, ATTN_DTYPE_F32, 4, o_shape, out);
    if (st == ATTN_OK && lse_path != NULL) st = attn_npy_write(ctx, lse_path, ATTN_DTYPE_F32, 3, o_shape, lse);
    if (st == ATTN_OK && w_path != NULL)
        st = attn_npy_write(ctx, w_path, ATTN_DTYPE_F32, average ? 3 : 4, average ? wa_shape : w_shape, weights);
    if (st != ATTN_OK) {
        cli_fail("sdpa", ctx, st, "writing the outputs");
        goto done;
    }
    rc = EXIT_OK;
done:
    free(out);
    free(lse);
    free(weights);
    for (int i = 0; i < n_grads; i++) free(grads[i].data);
    attn_tensor_release(ctx, &dout);
    attn_tensor_release(ctx, &q);
    attn_tensor_release(ctx, &k);
    attn_tensor_release(ctx, &v);
    attn_tensor_release(ctx, &mask);
    attn_tensor_release(ctx, &kpm);
    attn_tensor_release(ctx, &slopes);
    attn_tensor_release(ctx, &sinks);
    attn_ctx_free(ctx);
    return rc;
}

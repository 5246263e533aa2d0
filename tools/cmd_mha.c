// cmd_mha.c - `attn mha`: nn.MultiheadAttention forward on a state_dict saved as safetensors and
// inputs saved as .npy, writing outputs with PyTorch's shapes.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char summary[] =
    "usage: attn mha --state S.safetensors --heads H --query Q.npy [--key K.npy] [--value V.npy]\n"
    "                [--batch-first] [--causal | --attn-mask M.npy] [--key-padding-mask P.npy]\n"
    "                [--add-zero-attn] [--per-head-weights] [--dropout P --seed S]\n"
    "                --out O.npy [--weights-out W.npy] [--grad-out DY.npy --grads-out G.safetensors]\n"
    "                [--dtype f32|f16|bf16] [--isa ISA]\n"
    "\n"
    "Runs torch.nn.MultiheadAttention's forward. The module's options follow from the tensors in the\n"
    "state file (in_proj_bias -> bias, bias_k/bias_v -> add_bias_kv, q/k/v_proj_weight -> kdim/vdim);\n"
    "embed_dim comes from out_proj.weight. Inputs are float32 .npy: (L, N, E) batched, (N, L, E) with\n"
    "--batch-first, or (L, E) unbatched. Without --key, key = query (self-attention, one packed\n"
    "projection); without --value, value = key. Masks are bool (True = blocked / ignored) or float32\n"
    "(added): attn_mask (L, S) or (N*H, L, S), key_padding_mask (N, S) or (S). --causal means\n"
    "attn_mask = triu(ones(L, S), 1). With --dropout P --seed S the module runs in training mode and\n"
    "matches torch.manual_seed(S); m.train(); m(...). Outputs are written atomically.\n"
    "With --grad-out DY.npy (dL/d attn_output, the output's shape) the backward runs too and\n"
    "--grads-out receives every gradient: the parameters under their state_dict names, \"query\", and\n"
    "\"key\" / \"value\" when they were given as separate files (otherwise their gradients are summed\n"
    "into the tensor they are).\n"
    "--dtype f16 or bf16 runs the module in that type (attn_mha_config.dtype): float32 state tensors are\n"
    "rounded to it (F16 / BF16 ones of that type are taken as they are; without --dtype the module has\n"
    "the state's type), float32 inputs and DY are rounded to it (float16 .npy inputs are read as they\n"
    "are), the projections and the heads' output are rounded as torch's bfloat16 / float16 modules do,\n"
    "and the output, the weights and the inputs' gradients, computed in that type, are written as\n"
    "float32 arrays holding its values; the parameters' gradients are float32.\n"
    "--isa picks the kernels (" ATTN_ISA_NAMES "; default auto).";

typedef struct mha_files {
    attn_tensor query, key, value, mask, kpm;
    attn_tensor_list state;
} mha_files;

static int read_npy(const char *what, attn_ctx *ctx, const char *path, attn_tensor *t) {
    attn_status st = attn_npy_read(ctx, path, t);
    return st != ATTN_OK ? cli_fail("mha", ctx, st, what) : 0;
}

static int expect_dims(const char *what, const attn_tensor *t, int ndim, const int64_t *want) {
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == want[i];
    if (!ok) {
        char got[128], exp[128];
        return cli_error("mha", EXIT_FAILURE_RUN, "%s has shape %s, expected %s", what,
                         cli_shape_str(t->ndim, t->shape, got, sizeof got), cli_shape_str(ndim, want, exp, sizeof exp));
    }
    return 0;
}

// Rounds a float32 input to the module's type dt in place, or accepts one already of that type.
static int input_dtype(const char *what, attn_tensor *t, attn_dtype dt) {
    if (t->dtype == dt) return 0;
    if (t->dtype != ATTN_DTYPE_F32)
        return cli_error("mha", EXIT_FAILURE_RUN, "%s must be float32%s%s, not %s", what, dt != ATTN_DTYPE_F32 ? " or " : "",
                         dt != ATTN_DTYPE_F32 ? attn_dtype_name(dt) : "", attn_dtype_name(t->dtype));
    attn_status st = cli_to_dtype(t, dt);
    return st != ATTN_OK ? cli_fail("mha", NULL, st, what) : 0;
}

// Writes n elements of type dt at data (room for n floats) as a float32 .npy.
static attn_status write_as_f32(attn_ctx *ctx, const char *path, attn_dtype dt, int ndim, const int64_t *shape,
                                void *data) {
    attn_tensor t = {0};
    t.dtype = dt, t.ndim = ndim, t.data = data;
    memcpy(t.shape, shape, (size_t)ndim * sizeof shape[0]);
    attn_status st = cli_to_float(&t, dt);
    return st != ATTN_OK ? st : attn_npy_write(ctx, path, ATTN_DTYPE_F32, ndim, shape, data);
}

static int mask_dtype_ok(const char *what, const attn_tensor *t) {
    if (t->dtype != ATTN_DTYPE_BOOL && t->dtype != ATTN_DTYPE_F32 && t->dtype != ATTN_DTYPE_U8)
        return cli_error("mha", EXIT_FAILURE_RUN, "%s must be bool or float32, not %s", what, attn_dtype_name(t->dtype));
    return 0;
}

int cmd_mha(int argc, char **argv) {
    const char *state_path = NULL, *query_path = NULL, *key_path = NULL, *value_path = NULL, *mask_path = NULL;
    const char *kpm_path = NULL, *out_path = NULL, *weights_path = NULL, *grad_path = NULL, *grads_path = NULL;
    const char *dtype_name = NULL, *isa_name = "auto";
    int64_t heads = 0, seed = 0;
    double dropout = 0.0;
    bool batch_first = false, causal = false, zero_attn = false, per_head = false;
    arg_spec specs[] = {
        {"--state", ARG_STRING, &state_path, "S.safetensors", "the module's state_dict (F32, F16 or BF16 tensors)", true,
         false},
        {"--heads", ARG_INT, &heads, "H", "num_heads", true, false},
        {"--query", ARG_STRING, &query_path, "Q.npy", "query (L, N, E), (N, L, E) or (L, E)", true, false},
        {"--key", ARG_STRING, &key_path, "K.npy", "key (S, N, kdim); default: the query", false, false},
        {"--value", ARG_STRING, &value_path, "V.npy", "value (S, N, vdim); default: the key", false, false},
        {"--batch-first", ARG_FLAG, &batch_first, NULL, "batched inputs and output are (N, L, E)", false, false},
        {"--causal", ARG_FLAG, &causal, NULL, "attn_mask = triu(ones(L, S), 1) (bool)", false, false},
        {"--attn-mask", ARG_STRING, &mask_path, "M.npy", "attn_mask (L, S) or (N*H, L, S), bool or float32", false, false},
        {"--key-padding-mask", ARG_STRING, &kpm_path, "P.npy", "key_padding_mask (N, S) or (S), bool or float32", false,
         false},
        {"--add-zero-attn", ARG_FLAG, &zero_attn, NULL, "the module's add_zero_attn option", false, false},
        {"--per-head-weights", ARG_FLAG, &per_head, NULL, "weights per head (average_attn_weights=False)", false, false},
        {"--dropout", ARG_FLOAT, &dropout, "P", "the module's dropout; P > 0 runs in training mode", false, false},
        {"--seed", ARG_INT, &seed, "S", "torch.manual_seed before the forward (needed with --dropout)", false, false},
        {"--out", ARG_STRING, &out_path, "O.npy", "attn_output", true, false},
        {"--weights-out", ARG_STRING, &weights_path, "W.npy", "attention weights (need_weights=True)", false, false},
        {"--grad-out", ARG_STRING, &grad_path, "DY.npy", "dL/d attn_output: run the backward too", false, false},
        {"--grads-out", ARG_STRING, &grads_path, "G.safetensors", "every gradient (with --grad-out)", false, false},
        {"--dtype", ARG_STRING, &dtype_name, "T", "f32, f16 or bf16: the module's type (default: the state's)", false,
         false},
        {"--isa", ARG_STRING, &isa_name, "ISA", "kernels: " ATTN_ISA_NAMES, false, false},
    };
    int rc = args_parse("mha", summary, argc, argv, specs, (int)(sizeof specs / sizeof specs[0]));
    if (rc != 0) return rc < 0 ? EXIT_OK : rc;
    if (causal && mask_path != NULL) return cli_error("mha", EXIT_USAGE, "--causal and --attn-mask are exclusive");
    if (heads < 1) return cli_error("mha", EXIT_USAGE, "--heads must be >= 1");
    if (!(dropout >= 0.0 && dropout < 1.0)) return cli_error("mha", EXIT_USAGE, "--dropout must be in [0, 1)");
    const int n_specs = (int)(sizeof specs / sizeof specs[0]);
    if (dropout > 0.0 && !args_seen(specs, n_specs, "--seed")) return cli_error("mha", EXIT_USAGE, "--dropout needs --seed");
    if (per_head && weights_path == NULL) return cli_error("mha", EXIT_USAGE, "--per-head-weights needs --weights-out");
    if ((grad_path == NULL) != (grads_path == NULL))
        return cli_error("mha", EXIT_USAGE, "--grad-out and --grads-out go together");
    attn_dtype want_dt = ATTN_DTYPE_F32;
    if (dtype_name != NULL && !cli_parse_float_dtype(dtype_name, &want_dt))
        return cli_error("mha", EXIT_USAGE, "--dtype must be f32, f16 or bf16, not '%s'", dtype_name);
    attn_ctx_params cp;
    attn_ctx_params_init(&cp);
    if ((rc = cli_isa("mha", isa_name, &cp.isa)) != 0) return rc;

    attn_ctx *ctx = NULL;
    attn_mha *m = NULL;
    mha_files f;
    memset(&f, 0, sizeof f);
    float *out = NULL, *weights = NULL;
    attn_tensor dy = {0};
    void *saved = NULL;
    attn_tensor grads[12];
    int n_grads = 0;
    memset(grads, 0, sizeof grads);
    if (cli_context("mha", &cp, &ctx) != 0) return EXIT_FAILURE_RUN;
    attn_status st = ATTN_OK;

    rc = EXIT_FAILURE_RUN;
    st = attn_safetensors_read(ctx, state_path, &f.state);
    if (st != ATTN_OK) {
        cli_fail("mha", ctx, st, "state");
        goto done;
    }
    attn_mha_config extra;
    attn_mha_config_init(&extra, 1, 1);
    extra.add_zero_attn = zero_attn;
    extra.batch_first = batch_first;
    extra.dropout = dropout;
    extra.dtype = want_dt;
    st = attn_mha_create_from_state(ctx, &f.state, heads, &extra, &m);
    if (st != ATTN_OK) {
        cli_fail("mha", ctx, st, state_path);
        goto done;
    }
    const attn_mha_config *cfg = attn_mha_get_config(m);
    const int64_t E = cfg->embed_dim, H = cfg->num_heads;
    if (dtype_name != NULL && cfg->dtype != want_dt) { // f32 asked of a half state
        cli_error("mha", EXIT_FAILURE_RUN, "--dtype %s: the state's tensors are %s", dtype_name,
                  attn_dtype_name(cfg->dtype));
        goto done;
    }
    const attn_dtype dt = cfg->dtype;

    // query: (L, N, E), (N, L, E) or (L, E)
    if (read_npy("query", ctx, query_path, &f.query) != 0) goto done;
    if (input_dtype("query", &f.query, dt) != 0) goto done;
    if (f.query.ndim != 2 && f.query.ndim != 3) {
        cli_error("mha", EXIT_FAILURE_RUN, "query must be 2-D (L, E) or 3-D, not %d-D", f.query.ndim);
        goto done;
    }
    const bool unbatched = f.query.ndim == 2;
    const bool bf = batch_first && !unbatched;
    const int64_t L = unbatched ? f.query.shape[0] : f.query.shape[bf ? 1 : 0];
    const int64_t N = unbatched ? 1 : f.query.shape[bf ? 0 : 1];
    if (f.query.shape[f.query.ndim - 1] != E) {
        cli_error("mha", EXIT_FAILURE_RUN, "query has %lld features, the module's embed_dim is %lld",
                  (long long)f.query.shape[f.query.ndim - 1], (long long)E);
        goto done;
    }
    // key (S, N, kdim) and value (S, N, vdim), or the query itself
    const attn_tensor *key = &f.query, *value;
    if (key_path != NULL) {
        if (read_npy("key", ctx, key_path, &f.key) != 0) goto done;
        key = &f.key;
    }
    value = key;
    if (value_path != NULL) {
        if (read_npy("value", ctx, value_path, &f.value) != 0) goto done;
        value = &f.value;
    }
    const int64_t S = key->ndim >= 2 ? (unbatched ? key->shape[0] : key->shape[bf ? 1 : 0]) : 0;
    const attn_tensor *kv[2] = {key, value};
    const char *kv_name[2] = {"key", "value"};
    const int64_t kv_dim[2] = {cfg->kdim, cfg->vdim};
    for (int i = 0; i < 2; i++) {
        if (kv[i] != &f.query && (i == 0 || kv[1] != kv[0]) &&
            input_dtype(kv_name[i], (attn_tensor *)(uintptr_t)kv[i], dt) != 0)
            goto done;
        int64_t want[3];
        if (unbatched) {
            want[0] = S, want[1] = kv_dim[i];
        } else {
            want[0] = bf ? N : S, want[1] = bf ? S : N, want[2] = kv_dim[i];
        }
        if (expect_dims(kv_name[i], kv[i], unbatched ? 2 : 3, want) != 0) goto done;
    }
    attn_mha_args a;
    attn_mha_args_init(&a);
    a.query = f.query.data;
    a.key = key_path != NULL ? f.key.data : NULL;
    a.value = value_path != NULL ? f.value.data : NULL;
    a.batch = N, a.len_q = L, a.len_kv = S, a.unbatched = unbatched;
    a.causal = causal;
    if (mask_path != NULL) {
        if (read_npy("attn_mask", ctx, mask_path, &f.mask) != 0 || mask_dtype_ok("attn_mask", &f.mask) != 0) goto done;
        const int64_t want2[2] = {L, S}, want3[3] = {N * H, L, S};
        if (expect_dims("attn_mask", &f.mask, f.mask.ndim == 3 ? 3 : 2, f.mask.ndim == 3 ? want3 : want2) != 0)
            goto done;
        a.attn_mask = f.mask.data, a.attn_mask_dtype = f.mask.dtype, a.attn_mask_ndim = f.mask.ndim;
    }
    if (kpm_path != NULL) {
        if (read_npy("key_padding_mask", ctx, kpm_path, &f.kpm) != 0 || mask_dtype_ok("key_padding_mask", &f.kpm) != 0)
            goto done;
        const int64_t want[2] = {N, S};
        if (expect_dims("key_padding_mask", &f.kpm, unbatched ? 1 : 2, unbatched ? want + 1 : want) != 0) goto done;
        a.key_padding_mask = f.kpm.data, a.key_padding_mask_dtype = f.kpm.dtype;
    }
    a.need_weights = weights_path != NULL;
    a.average_attn_weights = !per_head;
    a.training = dropout > 0.0;
    if (a.training) attn_generator_seed(attn_ctx_generator(ctx), (uint64_t)seed);

    const int64_t S2 = attn_mha_weights_len_kv(m, S);
    size_t n_out, n_w;
    if (__builtin_mul_overflow((size_t)(L * N), (size_t)E, &n_out) ||
        __builtin_mul_overflow((size_t)N * (size_t)(per_head ? H : 1), (size_t)L, &n_w) ||
        __builtin_mul_overflow(n_w, (size_t)S2, &n_w) || n_w > SIZE_MAX / sizeof(float)) {
        cli_error("mha", EXIT_FAILURE_RUN, "the outputs are too large");
        goto done;
    }
    out = malloc(n_out * sizeof(float));
    weights = a.need_weights ? malloc(n_w * sizeof(float)) : NULL;
    if (out == NULL || (a.need_weights && weights == NULL)) {
        cli_error("mha", EXIT_FAILURE_RUN, "out of memory");
        goto done;
    }
    size_t saved_size = 0;
    if (grad_path != NULL) { // the training forward keeps what the backward needs
        st = attn_mha_saved_size(ctx, m, &a, &saved_size);
        saved = st == ATTN_OK ? malloc(saved_size) : NULL;
        if (st != ATTN_OK || saved == NULL) {
            cli_fail("mha", ctx, st != ATTN_OK ? st : ATTN_ERR_OUT_OF_MEMORY, "saving activations");
            goto done;
        }
        st = attn_mha_forward_train(ctx, m, &a, out, weights, saved, saved_size);
    } else {
        st = attn_mha_forward(ctx, m, &a, out, weights);
    }
    if (st != ATTN_OK) {
        cli_fail("mha", ctx, st, "forward");
        goto done;
    }
    if (grad_path != NULL) {
        if (read_npy("--grad-out", ctx, grad_path, &dy) != 0 || expect_dims("--grad-out", &dy, f.query.ndim, f.query.shape))
            goto done;
        if (input_dtype("--grad-out", &dy, dt) != 0) goto done;
        // one gradient per parameter, then query (and key/value when given as their own files)
        const int np = attn_mha_param_count(m);
        float *dparams[8] = {0};
        for (int i = 0; i < np; i++) {
            const char *name;
            int64_t shape[3];
            attn_mha_param_typed_at(m, i, &name, &grads[n_grads].ndim, shape, NULL, NULL);
            grads[n_grads].name = (char *)(uintptr_t)name;
            grads[n_grads].dtype = ATTN_DTYPE_F32;
            memcpy(grads[n_grads].shape, shape, sizeof shape);
            dparams[i] = grads[n_grads].data = malloc((size_t)attn_tensor_numel(&grads[n_grads]) * sizeof(float));
            n_grads++;
        }
        const attn_tensor *inputs[3] = {&f.query, key_path != NULL ? &f.key : NULL, value_path != NULL ? &f.value : NULL};
        const char *input_names[3] = {"query", "key", "value"};
        void *dx[3] = {NULL, NULL, NULL};
        const int first_dx = n_grads;
        for (int i = 0; i < 3; i++) {
            if (inputs[i] == NULL) continue;
            grads[n_grads] = *inputs[i];
            grads[n_grads].name = (char *)(uintptr_t)input_names[i];
            dx[i] = grads[n_grads].data = malloc((size_t)attn_tensor_numel(inputs[i]) * sizeof(float));
            n_grads++;
        }
        for (int i = 0; i < n_grads; i++)
            if (grads[i].data == NULL) {
                cli_error("mha", EXIT_FAILURE_RUN, "out of memory");
                goto done;
            }
        st = attn_mha_backward(ctx, m, &a, saved, saved_size, dy.data, dx[0], dx[1], dx[2], dparams);
        if (st != ATTN_OK) {
            cli_fail("mha", ctx, st, "backward");
            goto done;
        }
        for (int i = first_dx; i < n_grads && st == ATTN_OK; i++) st = cli_to_float(&grads[i], dt);
        if (st == ATTN_OK) st = attn_safetensors_write(ctx, grads_path, grads, n_grads);
        if (st != ATTN_OK) {
            cli_fail("mha", ctx, st, "--grads-out");
            goto done;
        }
    }
    st = write_as_f32(ctx, out_path, dt, f.query.ndim, f.query.shape, out);
    if (st != ATTN_OK) {
        cli_fail("mha", ctx, st, "--out");
        goto done;
    }
    if (weights_path != NULL) {
        // (N, L, S') or (N, H, L, S'); unbatched drops N
        int64_t shape[4];
        int nd = 0;
        if (!unbatched) shape[nd++] = N;
        if (per_head) shape[nd++] = H;
        shape[nd++] = L;
        shape[nd++] = S2;
        st = write_as_f32(ctx, weights_path, dt, nd, shape, weights);
        if (st != ATTN_OK) {
            cli_fail("mha", ctx, st, "--weights-out");
            goto done;
        }
    }
    rc = EXIT_OK;
done:
    free(out);
    free(weights);
    free(saved);
    for (int i = 0; i < n_grads; i++) free(grads[i].data);
    attn_tensor_release(ctx, &dy);
    attn_mha_free(m);
    attn_tensor_release(ctx, &f.query);
    attn_tensor_release(ctx, &f.key);
    attn_tensor_release(ctx, &f.value);
    attn_tensor_release(ctx, &f.mask);
    attn_tensor_release(ctx, &f.kpm);
    attn_tensor_list_release(ctx, &f.state);
    attn_ctx_free(ctx);
    return rc;
}

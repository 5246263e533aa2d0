// checkpoint.c - GPT-2 to and from Hugging Face's files: model.safetensors with GPT2LMHeadModel's
// (or GPT2Model's) tensor names and Conv1D (in, out) weights, and config.json.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gpt2_internal.h"

// The tensors of one block, after "h.<l>.", in the order save_pretrained writes them.
enum { N_BLOCK_TENSORS = 12 };
static const char *const block_names[N_BLOCK_TENSORS] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
// Buffers of old checkpoints that hold the causal mask, not parameters: skipped.
static const char *const mask_buffers[] = {"attn.bias", "attn.masked_bias"};

// Where one stored tensor goes: its shape in the file, (rows) or (rows, cols); conv1d: a Conv1D
// weight, stored (in, out) and kept as (out, in); the float32 buffer of the model's layout.
typedef struct slot {
    int64_t rows, cols; // cols 0: one dimension
    int conv1d;
    float *data;
} slot;

// The slots of block b; the attention's four tensors use the given buffers (nn.Linear layout).
static void block_slots(const gpt2_config *c, const gpt2_block *b, float *w_qkv, float *b_qkv, float *w_o, float *b_o,
                        slot s[N_BLOCK_TENSORS]) {
    const int64_t E = c->n_embd, I = c->n_inner;
    s[0] = (slot){E, 0, 0, b->ln_1_weight};
    s[1] = (slot){E, 0, 0, b->ln_1_bias};
    s[2] = (slot){E, 3 * E, 1, w_qkv};
    s[3] = (slot){3 * E, 0, 0, b_qkv};
    s[4] = (slot){E, E, 1, w_o};
    s[5] = (slot){E, 0, 0, b_o};
    s[6] = (slot){E, 0, 0, b->ln_2_weight};
    s[7] = (slot){E, 0, 0, b->ln_2_bias};
    s[8] = (slot){E, I, 1, b->fc_weight};
    s[9] = (slot){I, 0, 0, b->fc_bias};
    s[10] = (slot){I, E, 1, b->proj_weight};
    s[11] = (slot){E, 0, 0, b->proj_bias};
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int readable(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f != NULL) fclose(f);
    return f != NULL;
}

static int find(const attn_tensor_list *list, const char *name) {
    for (int i = 0; i < list->count; i++)
        if (list->tensors[i].name != NULL && strcmp(list->tensors[i].name, name) == 0) return i;
    return -1;
}

static const char *shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < ndim && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, ")");
    return buf;
}

// ---- loading ----------------------------------------------------------------------------------------

// Whether `name` (prefix removed) is a tensor of a GPT-2 of n_layer blocks; *skip when it is a mask buffer.
static int known_name(const char *name, int64_t n_layer, int *skip) {
    static const char *const top[] = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"};
    *skip = 0;
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (strcmp(name, top[i]) == 0) return 1;
    if (strncmp(name, "h.", 2) != 0 || name[2] < '0' || name[2] > '9') return 0;
    char *end;
    const long long l = strtoll(name + 2, &end, 10);
    char canonical[32];
    snprintf(canonical, sizeof canonical, "h.%lld.", l);
    if (strncmp(name, canonical, strlen(canonical)) != 0 || l >= n_layer) return 0; // "h.01." or a block too many
    const char *rest = name + strlen(canonical);
    for (int i = 0; i < N_BLOCK_TENSORS; i++)
        if (strcmp(rest, block_names[i]) == 0) return 1;
    for (size_t i = 0; i < sizeof mask_buffers / sizeof mask_buffers[0]; i++)
        if (strcmp(rest, mask_buffers[i]) == 0) return *skip = 1;
    return 0;
}

// Copies the tensor `name` into s->data as float32 (transposed for Conv1D weights) after checking
// its type and shape, then releases it. scratch: rows * cols floats, for half-precision weights.
static attn_status take_tensor(attn_ctx *ctx, attn_tensor_list *list, const char *name, const slot *s, float *scratch,
                               char *err) {
    const int i = find(list, name);
    if (i < 0) return gpt2__fail(err, ATTN_ERR_NOT_FOUND, "tensor '%s' is missing", name);
    attn_tensor *t = &list->tensors[i];
    if (t->dtype != ATTN_DTYPE_F32 && t->dtype != ATTN_DTYPE_F16 && t->dtype != ATTN_DTYPE_BF16)
        return gpt2__fail(err, ATTN_ERR_UNSUPPORTED, "tensor '%s' is %s; GPT-2's tensors must be F32, F16 or BF16", name,
                          attn_dtype_name(t->dtype));
    const int ndim = s->cols > 0 ? 2 : 1;
    const int64_t want[2] = {s->rows, s->cols};
    if (t->ndim != ndim || t->shape[0] != want[0] || (ndim == 2 && t->shape[1] != want[1])) {
        char got[96], exp[64];
        return gpt2__fail(err, ATTN_ERR_BAD_SHAPE, "tensor '%s' has shape %s, the configuration needs %s", name,
                          shape_str(got, sizeof got, t->ndim, t->shape), shape_str(exp, sizeof exp, ndim, want));
    }
    const int64_t n = s->rows * (ndim == 2 ? s->cols : 1);
    const float *src = t->data;
    if (t->dtype != ATTN_DTYPE_F32) {
        float *dst = s->conv1d ? scratch : s->data;
        attn_status st = attn_convert(ATTN_DTYPE_F32, dst, t->dtype, t->data, n);
        if (st != ATTN_OK) return gpt2__fail(err, st, "tensor '%s': conversion to float32 failed", name);
        src = dst;
    }
    if (s->conv1d) gpt2__transpose(src, s->rows, s->cols, s->data);
    else if (src != s->data) memcpy(s->data, src, (size_t)n * sizeof(float));
    attn_tensor_release(ctx, t);
    return ATTN_OK;
}

// Sets *size from a tensor's dimension, or checks the configuration's value against it.
static attn_status size_from(int64_t *size, const char *field, int64_t dim, const char *name, const char *config,
                             char *err) {
    if (*size == 0) *size = dim;
    else if (*size != dim)
        return gpt2__fail(err, ATTN_ERR_BAD_SHAPE, "%s gives %s = %lld, but '%s' has %lld", config, field, (long long)*size,
                          name, (long long)dim);
    return ATTN_OK;
}

// The configuration: config.json's fields, then the sizes the tensors' shapes tell.
static attn_status settle_config(const attn_tensor_list *list, const char *prefix, const char *config, gpt2_config *c,
                                 char *err) {
    char name[128];
    const attn_tensor *wte, *wpe, *fc;
    snprintf(name, sizeof name, "%swte.weight", prefix);
    wte = attn_tensor_list_find(list, name);
    snprintf(name, sizeof name, "%swpe.weight", prefix);
    wpe = attn_tensor_list_find(list, name);
    if (wte == NULL || wpe == NULL || wte->ndim != 2 || wpe->ndim != 2)
        return gpt2__fail(err, ATTN_ERR_BAD_FILE, "%swte.weight and %swpe.weight must be 2-D tensors", prefix, prefix);
    const char *from = config != NULL ? config : "the shapes";
    GPT2_RETURN_IF_ERR(size_from(&c->vocab_size, "vocab_size", wte->shape[0], wte->name, from, err));
    GPT2_RETURN_IF_ERR(size_from(&c->n_embd, "n_embd", wte->shape[1], wte->name, from, err));
    GPT2_RETURN_IF_ERR(size_from(&c->n_positions, "n_positions", wpe->shape[0], wpe->name, from, err));
    int64_t blocks = 0;
    for (;; blocks++) {
        snprintf(name, sizeof name, "%sh.%lld.ln_1.weight", prefix, (long long)blocks);
        if (attn_tensor_list_find(list, name) == NULL) break;
    }
    if (blocks == 0) return gpt2__fail(err, ATTN_ERR_NOT_FOUND, "no transformer block: '%sh.0.ln_1.weight' is missing", prefix);
    if (c->n_layer != 0 && c->n_layer != blocks)
        return gpt2__fail(err, ATTN_ERR_BAD_SHAPE, "%s gives n_layer = %lld, but the file holds %lld blocks", from,
                          (long long)c->n_layer, (long long)blocks);
    c->n_layer = blocks;
    snprintf(name, sizeof name, "%sh.0.mlp.c_fc.weight", prefix);
    fc = attn_tensor_list_find(list, name);
    if (c->n_inner == 0 && fc != NULL && fc->ndim == 2) c->n_inner = fc->shape[1];
    if (c->n_head == 0) {
        if (c->n_embd % 64 != 0)
            return gpt2__fail(err, ATTN_ERR_NOT_FOUND, "no config.json gives n_head, and n_embd %lld is not a multiple of "
                              "GPT-2's head size 64: give the configuration", (long long)c->n_embd);
        c->n_head = c->n_embd / 64;
    }
    return gpt2_config_check(c, err);
}

// Every block's tensors into the model. scratch: as take_tensor's; attn_w: 4 E^2 + 4 E floats where
// the attention's weights wait, in nn.Linear's layout, for the MHA that copies them.
static attn_status load_blocks(attn_ctx *ctx, attn_tensor_list *list, const char *prefix, gpt2_model *m,
                               float *scratch, float *attn_w, char *err) {
    const int64_t E = m->cfg.n_embd;
    float *w_qkv = attn_w, *b_qkv = attn_w + 3 * E * E, *w_o = b_qkv + 3 * E, *b_o = w_o + E * E;
    char name[160];
    for (int64_t l = 0; l < m->cfg.n_layer; l++) {
        slot s[N_BLOCK_TENSORS];
        block_slots(&m->cfg, &m->blocks[l], w_qkv, b_qkv, w_o, b_o, s);
        for (int i = 0; i < N_BLOCK_TENSORS; i++) {
            snprintf(name, sizeof name, "%sh.%lld.%s", prefix, (long long)l, block_names[i]);
            GPT2_RETURN_IF_ERR(take_tensor(ctx, list, name, &s[i], scratch, err));
        }
        GPT2_RETURN_IF_ERR(gpt2__set_attention(ctx, m, l, w_qkv, b_qkv, w_o, b_o, err));
    }
    return ATTN_OK;
}

attn_status gpt2_load(attn_ctx *ctx, const char *path, const char *config_path, gpt2_model **out, char *err) {
    *out = NULL;
    char file[4096], config[4096];
    const int dir = is_dir(path);
    const char *slash = strrchr(path, '/');
    if (snprintf(file, sizeof file, dir ? "%s/model.safetensors" : "%s", path) >= (int)sizeof file ||
        snprintf(config, sizeof config, "%.*s%sconfig.json", dir ? (int)strlen(path) : slash ? (int)(slash - path + 1) : 0,
                 path, dir ? "/" : "") >= (int)sizeof config)
        return gpt2__fail(err, ATTN_ERR_INVALID_ARG, "path too long: %s", path);
    if (config_path != NULL) snprintf(config, sizeof config, "%s", config_path);
    const int has_config = config_path != NULL || readable(config);

    gpt2_config c = {.layer_norm_epsilon = 1e-5, .activation = GPT2_GELU_TANH, .tie_word_embeddings = 1};
    if (has_config) GPT2_RETURN_IF_ERR(gpt2_config_read(config, &c, err));
    attn_tensor_list list = {0, NULL};
    attn_status st = attn_safetensors_read(ctx, file, &list);
    if (st != ATTN_OK) return gpt2__lib_fail(err, ctx, st, "reading the model");

    gpt2_model *m = NULL;
    float *scratch = NULL, *attn_w = NULL;
    const char *prefix = attn_tensor_list_find(&list, "transformer.wte.weight") != NULL ? "transformer." : "";
    if (find(&list, "wte.weight") < 0 && prefix[0] == '\0')
        st = gpt2__fail(err, ATTN_ERR_NOT_FOUND, "%s: not a GPT-2 checkpoint (no transformer.wte.weight or wte.weight)",
                        file);
    if (st == ATTN_OK) st = settle_config(&list, prefix, has_config ? config : NULL, &c, err);
    // every name must be GPT-2's
    const size_t plen = strlen(prefix);
    for (int i = 0; st == ATTN_OK && i < list.count; i++) {
        const char *name = list.tensors[i].name;
        int skip = 0;
        if (strcmp(name, "lm_head.weight") == 0) skip = c.tie_word_embeddings; // tied: the head is wte (as transformers)
        else if (strncmp(name, prefix, plen) != 0 || !known_name(name + plen, c.n_layer, &skip))
            st = gpt2__fail(err, ATTN_ERR_INVALID_ARG, "%s: unexpected tensor '%s' for a GPT-2 of %lld blocks", file, name,
                            (long long)c.n_layer);
        if (skip) attn_tensor_release(ctx, &list.tensors[i]);
    }
    if (st == ATTN_OK) st = gpt2__alloc(&c, &m, err);
    const int64_t E = c.n_embd, I = c.n_inner;
    if (st == ATTN_OK) {
        scratch = malloc((size_t)(3 * E * E > I * E ? 3 * E * E : I * E) * sizeof(float));
        attn_w = malloc((size_t)(4 * E * E + 4 * E) * sizeof(float));
        if (scratch == NULL || attn_w == NULL) st = gpt2__fail(err, ATTN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    char name[160];
    if (st == ATTN_OK) {
        const slot top[4] = {{c.vocab_size, E, 0, m->wte}, {c.n_positions, E, 0, m->wpe}, {E, 0, 0, m->ln_f_weight},
                             {E, 0, 0, m->ln_f_bias}};
        static const char *const top_names[4] = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"};
        for (int i = 0; st == ATTN_OK && i < 4; i++) {
            snprintf(name, sizeof name, "%s%s", prefix, top_names[i]);
            st = take_tensor(ctx, &list, name, &top[i], scratch, err);
        }
        if (st == ATTN_OK && !c.tie_word_embeddings) {
            const slot head = {c.vocab_size, E, 0, m->lm_head};
            st = take_tensor(ctx, &list, "lm_head.weight", &head, scratch, err);
        }
    }
    if (st == ATTN_OK) st = load_blocks(ctx, &list, prefix, m, scratch, attn_w, err);
    free(scratch);
    free(attn_w);
    attn_tensor_list_release(ctx, &list);
    if (st != ATTN_OK) {
        gpt2_free(m);
        return st;
    }
    *out = m;
    return ATTN_OK;
}

// ---- saving -----------------------------------------------------------------------------------------

enum { NAME_LEN = 160 };

// t: a float32 tensor of slot s's stored shape holding data, called name (or, for block >= 0,
// "transformer.h.<block>.<name>"), the name written into name_buf (NAME_LEN bytes).
static void describe(attn_tensor *t, char *name_buf, const char *name, int64_t block, const slot *s, float *data) {
    if (block >= 0) snprintf(name_buf, NAME_LEN, "transformer.h.%lld.%s", (long long)block, name);
    else snprintf(name_buf, NAME_LEN, "%s", name);
    *t = (attn_tensor){.name = name_buf, .dtype = ATTN_DTYPE_F32, .ndim = s->cols > 0 ? 2 : 1,
                       .shape = {s->rows, s->cols}, .data = data};
}

attn_status gpt2_save(attn_ctx *ctx, const gpt2_model *m, const char *dir, char *err) {
    const gpt2_config *c = &m->cfg;
    const int64_t E = c->n_embd, I = c->n_inner, L = c->n_layer;
    char path[4096];
    if (!is_dir(dir) && mkdir(dir, 0777) != 0)
        return gpt2__fail(err, ATTN_ERR_IO, "%s: cannot create the directory: %s", dir, strerror(errno));
    const int count = 4 + !c->tie_word_embeddings + (int)L * N_BLOCK_TENSORS;
    const int64_t per_block = 3 * E * E + E * E + I * E + E * I; // the Conv1D weights, transposed back
    attn_tensor *t = calloc((size_t)count, sizeof *t);
    char *names = calloc((size_t)count, NAME_LEN);
    float *conv = malloc((size_t)(L * per_block) * sizeof(float));
    attn_status st = t == NULL || names == NULL || conv == NULL ? gpt2__fail(err, ATTN_ERR_OUT_OF_MEMORY, "out of memory")
                                                                 : ATTN_OK;
    int n = 0;
    slot top[5] = {{c->vocab_size, E, 0, m->wte}, {c->n_positions, E, 0, m->wpe}, {E, 0, 0, m->ln_f_weight},
                   {E, 0, 0, m->ln_f_bias}, {c->vocab_size, E, 0, m->lm_head}};
    static const char *const top_names[5] = {"transformer.wte.weight", "transformer.wpe.weight",
                                             "transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"};
    float *next = conv;
    for (int i = 0; st == ATTN_OK && i < 5; i++) {
        if (i == 4 && c->tie_word_embeddings) break;
        describe(&t[n], names + (size_t)n * NAME_LEN, top_names[i], -1, &top[i], top[i].data);
        n++;
    }
    for (int64_t l = 0; st == ATTN_OK && l < L; l++) {
        float *w_qkv, *b_qkv, *w_o, *b_o;
        attn_mha *a = m->blocks[l].attn;
        if (attn_mha_param(a, "in_proj_weight", NULL, NULL, &w_qkv) != ATTN_OK ||
            attn_mha_param(a, "in_proj_bias", NULL, NULL, &b_qkv) != ATTN_OK ||
            attn_mha_param(a, "out_proj.weight", NULL, NULL, &w_o) != ATTN_OK ||
            attn_mha_param(a, "out_proj.bias", NULL, NULL, &b_o) != ATTN_OK) {
            st = gpt2__fail(err, ATTN_ERR_NOT_FOUND, "block %lld: the attention lacks a parameter", (long long)l);
            break;
        }
        slot s[N_BLOCK_TENSORS];
        block_slots(c, &m->blocks[l], w_qkv, b_qkv, w_o, b_o, s);
        for (int i = 0; i < N_BLOCK_TENSORS; i++) {
            float *data = s[i].data;
            if (s[i].conv1d) { // kept (out, in) = (cols, rows): back to the file's (rows, cols)
                gpt2__transpose(s[i].data, s[i].cols, s[i].rows, next);
                data = next;
                next += s[i].rows * s[i].cols;
            }
            describe(&t[n], names + (size_t)n * NAME_LEN, block_names[i], l, &s[i], data);
            n++;
        }
    }
    if (st == ATTN_OK && snprintf(path, sizeof path, "%s/model.safetensors", dir) >= (int)sizeof path)
        st = gpt2__fail(err, ATTN_ERR_INVALID_ARG, "path too long: %s", dir);
    if (st == ATTN_OK) {
        st = attn_safetensors_write(ctx, path, t, n);
        if (st != ATTN_OK) gpt2__lib_fail(err, ctx, st, path);
    }
    if (st == ATTN_OK && snprintf(path, sizeof path, "%s/config.json", dir) < (int)sizeof path)
        st = gpt2_config_write(path, c, err);
    free(t), free(names), free(conv);
    return st;
}

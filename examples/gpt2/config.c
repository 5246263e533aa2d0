// config.c - GPT-2's configuration: defaults, checks, and Hugging Face's config.json read and
// written. The reader is a small JSON parser for one object: the fields GPT-2 needs are read and
// type-checked, every other value (nested objects and arrays included) is skipped.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_internal.h"

void gpt2_config_init(gpt2_config *cfg) {
    *cfg = (gpt2_config){.vocab_size = 50257, .n_positions = 1024, .n_embd = 768, .n_head = 12, .n_layer = 12,
                         .n_inner = 3072, .layer_norm_epsilon = 1e-5, .activation = GPT2_GELU_TANH,
                         .tie_word_embeddings = 1};
}

int64_t gpt2_param_count(const gpt2_config *c) {
    const int64_t E = c->n_embd, I = c->n_inner;
    const int64_t block = 2 * E                  // ln_1
                          + 3 * E * E + 3 * E    // c_attn
                          + E * E + E            // attn.c_proj
                          + 2 * E                // ln_2
                          + I * E + I + E * I + E; // c_fc, mlp.c_proj
    return c->vocab_size * E * (c->tie_word_embeddings ? 1 : 2) + c->n_positions * E + c->n_layer * block + 2 * E;
}

attn_status gpt2_config_check(const gpt2_config *c, char *err) {
    const int64_t sizes[] = {c->vocab_size, c->n_positions, c->n_embd, c->n_head, c->n_layer, c->n_inner};
    static const char *const names[] = {"vocab_size", "n_positions", "n_embd", "n_head", "n_layer", "n_inner"};
    for (int i = 0; i < 6; i++) {
        if (sizes[i] < 1) return gpt2__fail(err, ATTN_ERR_BAD_SHAPE, "config: %s = %lld, must be >= 1", names[i], (long long)sizes[i]);
        if (sizes[i] > (int64_t)1 << 24) // keeps every product below within int64_t and the count below
            return gpt2__fail(err, ATTN_ERR_BAD_SHAPE, "config: %s = %lld is larger than 2^24", names[i], (long long)sizes[i]);
    }
    if (c->n_embd % c->n_head != 0)
        return gpt2__fail(err, ATTN_ERR_BAD_SHAPE, "config: n_embd %lld is not a multiple of n_head %lld",
                          (long long)c->n_embd, (long long)c->n_head);
    if (!(c->layer_norm_epsilon > 0.0 && c->layer_norm_epsilon < 1.0))
        return gpt2__fail(err, ATTN_ERR_INVALID_ARG, "config: layer_norm_epsilon %g must be in (0, 1)",
                          c->layer_norm_epsilon);
    if (c->activation != GPT2_GELU_TANH && c->activation != GPT2_GELU_ERF)
        return gpt2__fail(err, ATTN_ERR_INVALID_ARG, "config: unknown activation %d", (int)c->activation);
    // The floats of one model must be addressable: 2^40 of them (4 TiB) is far beyond any GPT-2.
    const double n = (double)c->vocab_size * (double)c->n_embd * 2.0 + (double)c->n_positions * (double)c->n_embd +
                     (double)c->n_layer * (12.0 * (double)c->n_embd * (double)c->n_embd +
                                           2.0 * (double)c->n_inner * (double)c->n_embd);
    if (n > 1099511627776.0)
        return gpt2__fail(err, ATTN_ERR_OVERFLOW, "config: %.3g parameters are more than this program handles", n);
    return ATTN_OK;
}

// ---- config.json --------------------------------------------------------------------------------

typedef struct json_in {
    const char *p, *end;
} json_in;

typedef enum { J_NUMBER, J_STRING, J_TRUE, J_FALSE, J_NULL, J_NESTED } json_kind;

typedef struct json_value {
    json_kind kind;
    double number;
    int is_integer;  // the number has no fraction or exponent
    char string[64]; // a string's first 63 bytes (escapes other than \" and \\ kept as they are)
} json_value;

static void skip_space(json_in *in) {
    while (in->p < in->end && (*in->p == ' ' || *in->p == '\t' || *in->p == '\n' || *in->p == '\r')) in->p++;
}

static int expect_char(json_in *in, char c) {
    skip_space(in);
    if (in->p >= in->end || *in->p != c) return 0;
    in->p++;
    return 1;
}

// A string after its opening quote, up to the closing one; its start copied into out.
static int read_string(json_in *in, char *out, size_t cap) {
    size_t n = 0;
    while (in->p < in->end && *in->p != '"') {
        char c = *in->p++;
        if ((unsigned char)c < 0x20) return 0;
        if (c == '\\') {
            if (in->p >= in->end) return 0;
            c = *in->p++;
        }
        if (n + 1 < cap) out[n++] = c;
    }
    if (cap > 0) out[n] = '\0';
    if (in->p >= in->end) return 0;
    in->p++;
    return 1;
}

static int read_literal(json_in *in, const char *word) {
    const size_t n = strlen(word);
    if ((size_t)(in->end - in->p) < n || memcmp(in->p, word, n) != 0) return 0;
    in->p += n;
    return 1;
}

static int read_value(json_in *in, json_value *v, int depth);

// An object or an array after its opening bracket, skipped.
static int skip_nested(json_in *in, char close, int depth) {
    json_value ignored;
    skip_space(in);
    if (in->p < in->end && *in->p == close) return in->p++, 1;
    for (;;) {
        if (close == '}') {
            char key[1];
            if (!expect_char(in, '"') || !read_string(in, key, sizeof key) || !expect_char(in, ':')) return 0;
        }
        if (!read_value(in, &ignored, depth + 1)) return 0;
        skip_space(in);
        if (in->p >= in->end) return 0;
        const char c = *in->p++;
        if (c == close) return 1;
        if (c != ',') return 0;
    }
}

static int read_value(json_in *in, json_value *v, int depth) {
    if (depth > 64) return 0;
    skip_space(in);
    if (in->p >= in->end) return 0;
    const char c = *in->p;
    memset(v, 0, sizeof *v);
    if (c == '"') {
        in->p++;
        v->kind = J_STRING;
        return read_string(in, v->string, sizeof v->string);
    }
    if (c == '{' || c == '[') {
        in->p++;
        v->kind = J_NESTED;
        return skip_nested(in, c == '{' ? '}' : ']', depth);
    }
    if (c == 't') return v->kind = J_TRUE, read_literal(in, "true");
    if (c == 'f') return v->kind = J_FALSE, read_literal(in, "false");
    if (c == 'n') return v->kind = J_NULL, read_literal(in, "null");
    char buf[64];
    size_t n = 0;
    v->is_integer = 1;
    while (in->p < in->end && n + 1 < sizeof buf && strchr("+-0123456789.eE", *in->p) != NULL) {
        if (strchr(".eE", *in->p) != NULL) v->is_integer = 0;
        buf[n++] = *in->p++;
    }
    buf[n] = '\0';
    char *end;
    v->kind = J_NUMBER;
    v->number = strtod(buf, &end);
    return n > 0 && *end == '\0';
}

// The fields read: which gpt2_config member each sets, and how.
typedef enum { F_SIZE, F_SIZE_OR_NULL, F_EPS, F_ACTIVATION, F_TIE, F_MUST_BE_TRUE, F_MUST_BE_FALSE, F_MODEL_TYPE } field_kind;

static attn_status apply_field(const char *path, const char *key, const json_value *v, gpt2_config *cfg,
                               int *seen_positions, char *err) {
    static const struct {
        const char *key;
        field_kind kind;
        size_t offset;
    } fields[] = {
        {"vocab_size", F_SIZE, offsetof(gpt2_config, vocab_size)},
        {"n_positions", F_SIZE, offsetof(gpt2_config, n_positions)},
        {"n_ctx", F_SIZE, offsetof(gpt2_config, n_positions)},
        {"n_embd", F_SIZE, offsetof(gpt2_config, n_embd)},
        {"n_head", F_SIZE, offsetof(gpt2_config, n_head)},
        {"n_layer", F_SIZE, offsetof(gpt2_config, n_layer)},
        {"n_inner", F_SIZE_OR_NULL, offsetof(gpt2_config, n_inner)},
        {"layer_norm_epsilon", F_EPS, 0},
        {"activation_function", F_ACTIVATION, 0},
        {"tie_word_embeddings", F_TIE, 0},
        {"scale_attn_weights", F_MUST_BE_TRUE, 0},
        {"scale_attn_by_inverse_layer_idx", F_MUST_BE_FALSE, 0},
        {"add_cross_attention", F_MUST_BE_FALSE, 0},
        {"model_type", F_MODEL_TYPE, 0},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        if (strcmp(key, fields[i].key) != 0) continue;
        const field_kind k = fields[i].kind;
        int64_t *size = (int64_t *)((char *)cfg + fields[i].offset);
        switch (k) {
        case F_SIZE_OR_NULL:
            if (v->kind == J_NULL) return *size = 0, ATTN_OK; // 0: 4 n_embd, settled by the caller
            /* fall through */
        case F_SIZE:
            if (v->kind != J_NUMBER || !v->is_integer || v->number < 1 || v->number > 9e15)
                return gpt2__fail(err, ATTN_ERR_BAD_FILE, "%s: %s must be a positive integer", path, key);
            if (strcmp(key, "n_ctx") == 0 && *seen_positions) return ATTN_OK; // n_positions wins
            if (strcmp(key, "n_positions") == 0) *seen_positions = 1;
            *size = (int64_t)v->number;
            return ATTN_OK;
        case F_EPS:
            if (v->kind != J_NUMBER) return gpt2__fail(err, ATTN_ERR_BAD_FILE, "%s: %s must be a number", path, key);
            cfg->layer_norm_epsilon = v->number;
            return ATTN_OK;
        case F_ACTIVATION:
            if (v->kind != J_STRING) return gpt2__fail(err, ATTN_ERR_BAD_FILE, "%s: %s must be a string", path, key);
            if (strcmp(v->string, "gelu_new") == 0 || strcmp(v->string, "gelu_pytorch_tanh") == 0 ||
                strcmp(v->string, "gelu_fast") == 0)
                cfg->activation = GPT2_GELU_TANH;
            else if (strcmp(v->string, "gelu") == 0)
                cfg->activation = GPT2_GELU_ERF;
            else
                return gpt2__fail(err, ATTN_ERR_UNSUPPORTED, "%s: activation_function '%s' is not supported "
                                  "(gelu_new, gelu_pytorch_tanh, gelu_fast or gelu)", path, v->string);
            return ATTN_OK;
        case F_TIE:
        case F_MUST_BE_TRUE:
        case F_MUST_BE_FALSE:
            if (v->kind != J_TRUE && v->kind != J_FALSE)
                return gpt2__fail(err, ATTN_ERR_BAD_FILE, "%s: %s must be true or false", path, key);
            if (k == F_TIE) cfg->tie_word_embeddings = v->kind == J_TRUE;
            else if ((k == F_MUST_BE_TRUE) != (v->kind == J_TRUE))
                return gpt2__fail(err, ATTN_ERR_UNSUPPORTED, "%s: %s = %s is not supported", path, key,
                                  v->kind == J_TRUE ? "true" : "false");
            return ATTN_OK;
        case F_MODEL_TYPE:
            if (v->kind != J_STRING || strcmp(v->string, "gpt2") != 0)
                return gpt2__fail(err, ATTN_ERR_UNSUPPORTED, "%s: model_type '%s' is not gpt2", path,
                                  v->kind == J_STRING ? v->string : "?");
            return ATTN_OK;
        }
    }
    return ATTN_OK; // a field GPT-2's forward does not use
}

attn_status gpt2_config_read(const char *path, gpt2_config *cfg, char *err) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return gpt2__fail(err, ATTN_ERR_IO, "%s: cannot open the file", path);
    enum { MAX_BYTES = 1 << 20 };
    char *text = malloc(MAX_BYTES);
    size_t len = text != NULL ? fread(text, 1, MAX_BYTES, f) : 0;
    const int too_long = text != NULL && len == MAX_BYTES && fgetc(f) != EOF, bad_read = ferror(f);
    fclose(f);
    if (text == NULL) return gpt2__fail(err, ATTN_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    attn_status st = ATTN_OK;
    if (bad_read) st = gpt2__fail(err, ATTN_ERR_IO, "%s: read error", path);
    else if (too_long) st = gpt2__fail(err, ATTN_ERR_BAD_FILE, "%s: larger than 1 MiB, not a config.json", path);
    gpt2_config c = *cfg;
    int seen_positions = 0, ok = st == ATTN_OK;
    json_in in = {text, text + len};
    if (ok && !expect_char(&in, '{')) ok = 0;
    if (ok && !expect_char(&in, '}')) {
        for (;;) {
            char key[64];
            json_value v;
            if (!expect_char(&in, '"') || !read_string(&in, key, sizeof key) || !expect_char(&in, ':') ||
                !read_value(&in, &v, 1)) {
                ok = 0;
                break;
            }
            st = apply_field(path, key, &v, &c, &seen_positions, err);
            if (st != ATTN_OK) break;
            if (expect_char(&in, '}')) break;
            if (!expect_char(&in, ',')) {
                ok = 0;
                break;
            }
        }
    }
    if (ok && st == ATTN_OK) {
        skip_space(&in);
        ok = in.p == in.end;
    }
    if (st == ATTN_OK && !ok)
        st = gpt2__fail(err, ATTN_ERR_BAD_FILE, "%s: not a JSON object (near byte %lld)", path, (long long)(in.p - text));
    free(text);
    if (st != ATTN_OK) return st;
    if (c.n_inner == 0) c.n_inner = 4 * c.n_embd;
    *cfg = c;
    return ATTN_OK;
}

attn_status gpt2_config_write(const char *path, const gpt2_config *c, char *err) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return gpt2__fail(err, ATTN_ERR_INVALID_ARG, "%s: path too long", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL) return gpt2__fail(err, ATTN_ERR_IO, "%s: cannot create the file", tmp);
    const char *eot = c->vocab_size > 50256 ? "50256" : "null"; // GPT-2's <|endoftext|>, when the vocabulary has it
    fprintf(f,
            "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
            "  \"vocab_size\": %lld,\n  \"n_positions\": %lld,\n  \"n_embd\": %lld,\n  \"n_head\": %lld,\n"
            "  \"n_layer\": %lld,\n  \"n_inner\": %lld,\n  \"layer_norm_epsilon\": %.17g,\n"
            "  \"activation_function\": \"%s\",\n  \"tie_word_embeddings\": %s,\n"
            "  \"bos_token_id\": %s,\n  \"eos_token_id\": %s,\n"
            "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0\n}\n",
            (long long)c->vocab_size, (long long)c->n_positions, (long long)c->n_embd, (long long)c->n_head,
            (long long)c->n_layer, (long long)c->n_inner, c->layer_norm_epsilon,
            c->activation == GPT2_GELU_ERF ? "gelu" : "gelu_new", c->tie_word_embeddings ? "true" : "false", eot, eot);
    const int bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        remove(tmp);
        return gpt2__fail(err, ATTN_ERR_IO, "%s: cannot write the file", path);
    }
    return ATTN_OK;
}

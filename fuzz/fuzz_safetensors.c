/*
 * fuzz_safetensors.c - fuzz target for the .safetensors reader: attn_safetensors_parse on the raw
 * input, then attn_mha_create_from_state on what it returns.
 *
 * On failure the status must be one the reader documents and the list empty. On success every
 * tensor must be consistent (non-empty unique name, dtype, sizes, data bytes), and the tensors, in
 * the list's order, must tile the input's data buffer exactly with their data equal to its bytes.
 * Then, in memory: the list written as a .safetensors file parses back equal; the input one byte
 * shorter or longer is rejected; each allocation of the parse failing in turn gives
 * ATTN_ERR_OUT_OF_MEMORY and leaks nothing. Through files: attn_safetensors_write of the list reads
 * back equal with attn_safetensors_read, and a write it must refuse (a name emptied, made invalid
 * UTF-8 or "__metadata__", two tensors of one name, a negative extent, data missing) leaves that
 * file as it was, with no temporary file beside it. Last, the list is offered to
 * attn_mha_create_from_state with several head counts: a module it accepts must hold the state's
 * tensors and run a small forward pass.
 */
#include <stdio.h>
#include <string.h>

#include "attn.h"
#include "fuzz_data.h"
#include "fuzz_util.h"

static uint64_t read_le64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

static size_t tensor_bytes(const attn_tensor *t) { return (size_t)attn_tensor_numel(t) * attn_dtype_size(t->dtype); }

/* Checks a parsed list against the input it came from. */
static void check_list(const attn_tensor_list *list, const uint8_t *data, size_t size) {
    FUZZ_CHECK(size >= 8, "a %zu-byte input was accepted", size);
    const uint64_t n = read_le64(data);
    FUZZ_CHECK(n <= size - 8, "header length %llu past the end", (unsigned long long)n);
    const uint8_t *buf = data + 8 + n;
    const size_t buf_len = size - 8 - (size_t)n;
    FUZZ_CHECK(list->count >= 0, "count %d", list->count);
    FUZZ_CHECK(list->count == 0 || list->tensors != NULL, "no tensor array for %d tensors", list->count);
    size_t pos = 0;
    for (int i = 0; i < list->count; i++) {
        const attn_tensor *t = &list->tensors[i];
        FUZZ_CHECK(t->name != NULL && t->name[0] != '\0', "tensor %d has no name", i);
        FUZZ_CHECK(strcmp(t->name, "__metadata__") != 0, "a tensor is called __metadata__");
        FUZZ_CHECK(attn_dtype_size(t->dtype) > 0, "tensor %d: dtype %d", i, (int)t->dtype);
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= ATTN_MAX_DIMS, "tensor %d: ndim %d", i, t->ndim);
        const int64_t numel = attn_tensor_numel(t);
        FUZZ_CHECK(numel >= 0, "tensor %d: numel %lld", i, (long long)numel);
        const size_t esize = attn_dtype_size(t->dtype);
        FUZZ_CHECK((uint64_t)numel <= (buf_len - pos) / esize, "tensor %d does not fit in the data buffer", i);
        const size_t bytes = (size_t)numel * esize;
        FUZZ_CHECK(bytes == 0 || t->data != NULL, "tensor %d has no data", i);
        FUZZ_CHECK(bytes == 0 || memcmp(t->data, buf + pos, bytes) == 0, "tensor %d: data differs from the file", i);
        pos += bytes;
        for (int j = 0; j < i; j++)
            FUZZ_CHECK(strcmp(list->tensors[j].name, t->name) != 0, "tensors %d and %d share a name", j, i);
        FUZZ_CHECK(attn_tensor_list_find(list, t->name) == t, "attn_tensor_list_find misses tensor %d", i);
    }
    FUZZ_CHECK(pos == buf_len, "the tensors cover %zu of the %zu data bytes", pos, buf_len);
}

/* ---- writing in memory ------------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

static void sb_put(sbuf *b, const void *s, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap == 0 ? 256 : b->cap;
        while (cap < b->len + n) cap *= 2;
        char *p = realloc(b->p, cap);
        FUZZ_CHECK(p != NULL, "out of memory");
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(sbuf *b, uint64_t v) {
    char t[24];
    int k = snprintf(t, sizeof t, "%llu", (unsigned long long)v);
    sb_put(b, t, (size_t)k);
}

/* A JSON string: quotes, backslashes and control characters escaped, other bytes as they are. */
static void sb_json_string(sbuf *b, const char *s) {
    sb_str(b, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c != '\0'; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            sb_put(b, e, 2);
        } else if (*c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", *c);
            sb_str(b, e);
        } else {
            sb_put(b, c, 1);
        }
    }
    sb_str(b, "\"");
}

/* The .safetensors bytes of a list, tensors laid out in list order; returns a malloc'd buffer. */
static uint8_t *st_encode(const attn_tensor_list *list, size_t *len) {
    sbuf h = {0};
    sb_str(&h, "{");
    uint64_t off = 0;
    for (int i = 0; i < list->count; i++) {
        const attn_tensor *t = &list->tensors[i];
        if (i > 0) sb_str(&h, ",");
        sb_json_string(&h, t->name);
        sb_str(&h, ":{\"dtype\":\"");
        sb_str(&h, attn_dtype_name(t->dtype));
        sb_str(&h, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d > 0) sb_str(&h, ",");
            sb_u64(&h, (uint64_t)t->shape[d]);
        }
        sb_str(&h, "],\"data_offsets\":[");
        sb_u64(&h, off);
        sb_str(&h, ",");
        off += tensor_bytes(t);
        sb_u64(&h, off);
        sb_str(&h, "]}");
    }
    sb_str(&h, "}");
    while (h.len % 8 != 0) sb_str(&h, " ");
    *len = 8 + h.len + (size_t)off;
    uint8_t *out = fuzz_xmalloc(*len);
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    memcpy(out + 8, h.p, h.len);
    size_t pos = 8 + h.len;
    for (int i = 0; i < list->count; i++) {
        const size_t b = tensor_bytes(&list->tensors[i]);
        if (b > 0) memcpy(out + pos, list->tensors[i].data, b);
        pos += b;
    }
    free(h.p);
    return out;
}

static void check_same_list(const attn_tensor_list *a, const attn_tensor_list *b) {
    FUZZ_CHECK(a->count == b->count, "round trip: %d tensors became %d", a->count, b->count);
    for (int i = 0; i < a->count; i++) {
        const attn_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        FUZZ_CHECK(strcmp(x->name, y->name) == 0, "round trip: tensor %d renamed", i);
        FUZZ_CHECK(x->dtype == y->dtype && x->ndim == y->ndim, "round trip: tensor %d dtype or ndim changed", i);
        for (int d = 0; d < x->ndim; d++) FUZZ_CHECK(x->shape[d] == y->shape[d], "round trip: tensor %d shape", i);
        const size_t bytes = tensor_bytes(x);
        FUZZ_CHECK(bytes == 0 || memcmp(x->data, y->data, bytes) == 0, "round trip: tensor %d data changed", i);
    }
}

static attn_status parse_copy(attn_ctx *ctx, const uint8_t *src, size_t len, size_t copy_len, attn_tensor_list *out) {
    uint8_t *buf = fuzz_copy_exact(src, len, copy_len);
    attn_status st = attn_safetensors_parse(ctx, buf, len, out);
    free(buf);
    return st;
}

/* The input, for fuzz_fail_each_alloc: parses it, and a failure must leave the list empty. */
static attn_status parse_input(attn_ctx *ctx, void *user) {
    const fuzz_input *in = user;
    attn_tensor_list list;
    const attn_status st = attn_safetensors_parse(ctx, in->data, in->size, &list);
    FUZZ_CHECK(st == ATTN_OK || (list.count == 0 && list.tensors == NULL), "the list is not empty after a failure");
    return st;
}

/* attn_mha_create_from_state's arguments, for fuzz_fail_each_alloc. */
typedef struct from_state {
    const attn_tensor_list *list;
    int64_t heads;
    const attn_mha_config *extra;
} from_state;

static attn_status create_from_state(attn_ctx *ctx, void *user) {
    const from_state *a = user;
    attn_mha *m = NULL;
    return attn_mha_create_from_state(ctx, a->list, a->heads, a->extra, &m);
}

/* The file round trip and a refused write over the file (which refusal: pick). */
static void check_files(attn_ctx *ctx, const attn_tensor_list *list, uint8_t pick) {
    const char *dir = fuzz_scratch_dir();
    char path[640];
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    attn_status st = attn_safetensors_write(ctx, path, list->tensors, list->count);
    fuzz_check_error(ctx, st, "attn_safetensors_write");
    FUZZ_CHECK(st == ATTN_OK, "attn_safetensors_write of a parsed list: %s", attn_ctx_last_error(ctx));
    attn_tensor_list back;
    st = attn_safetensors_read(ctx, path, &back);
    FUZZ_CHECK(st == ATTN_OK, "attn_safetensors_read of attn_safetensors_write's file: %s", attn_ctx_last_error(ctx));
    check_same_list(list, &back);
    attn_tensor_list_release(ctx, &back);

    size_t before_len;
    uint8_t *before = fuzz_read_file(path, &before_len);
    FUZZ_CHECK(before != NULL, "cannot read back %s", path);
    const int n = list->count > 0 ? list->count : 1;
    attn_tensor *t = fuzz_xmalloc((size_t)n * sizeof *t);
    float one = 1.0f;
    if (list->count > 0) memcpy(t, list->tensors, (size_t)n * sizeof *t);
    else t[0] = (attn_tensor){.name = (char *)"x", .dtype = ATTN_DTYPE_F32, .ndim = 1, .shape = {1}, .data = &one};
    attn_tensor *v = &t[(pick >> 3) % n];
    int count = n;
    char bad_utf8[] = {'a', (char)0xC3, 0}; /* a lead byte without its continuation */
    switch (pick % 6) {
    case 0: v->name = (char *)""; break;
    case 1: v->name = bad_utf8; break;
    case 2: v->name = (char *)"__metadata__"; break;
    case 3:
        if (n >= 2) t[1].name = t[0].name;
        else count = -1;
        break;
    case 4: v->ndim = v->ndim > 0 ? v->ndim : 1, v->shape[0] = -1; break;
    default: v->ndim = 1, v->shape[0] = 3, v->data = NULL; break;
    }
    char what[64];
    snprintf(what, sizeof what, "attn_safetensors_write (refusal %d)", pick % 6);
    fuzz_check_refused_write(ctx, attn_safetensors_write(ctx, path, t, count), dir, path, before, before_len, what);
    free(t), free(before);
}

/* ---- nn.MultiheadAttention from the state ----------------------------------------------------- */

static void try_module(attn_ctx *ctx, fuzz_alloc *alloc, const attn_tensor_list *list, int64_t heads,
                       const attn_mha_config *extra) {
    attn_mha *m = NULL;
    const uint64_t calls0 = fuzz_alloc_calls(alloc);
    attn_status st = attn_mha_create_from_state(ctx, list, heads, extra, &m);
    const uint64_t calls = fuzz_alloc_calls(alloc) - calls0;
    fuzz_check_error(ctx, st, "attn_mha_create_from_state");
    if (heads < 1) FUZZ_CHECK(st != ATTN_OK, "num_heads %lld accepted", (long long)heads);
    if (st != ATTN_OK) return;
    const attn_mha_config *cfg = attn_mha_get_config(m);
    const attn_tensor *wo = attn_tensor_list_find(list, "out_proj.weight");
    FUZZ_CHECK(wo != NULL && wo->ndim == 2 && cfg->embed_dim == wo->shape[0], "embed_dim is not out_proj's");
    FUZZ_CHECK(cfg->num_heads == heads && cfg->embed_dim % heads == 0, "num_heads %lld", (long long)cfg->num_heads);
    FUZZ_CHECK(cfg->kdim >= 1 && cfg->vdim >= 1, "kdim/vdim unresolved");
    /* Every parameter is one of the state's tensors, unchanged; every tensor is a parameter. */
    const int count = attn_mha_param_count(m);
    FUZZ_CHECK(count == list->count, "%d parameters from %d tensors", count, list->count);
    for (int i = 0; i < count; i++) {
        const char *name;
        int ndim;
        int64_t shape[3];
        float *pdata;
        FUZZ_CHECK(attn_mha_param_at(m, i, &name, &ndim, shape, &pdata) == ATTN_OK, "param_at(%d)", i);
        const attn_tensor *t = attn_tensor_list_find(list, name);
        FUZZ_CHECK(t != NULL && t->dtype == ATTN_DTYPE_F32 && t->ndim == ndim, "parameter %s", name);
        const int64_t numel = attn_tensor_numel(t);
        for (int d = 0; d < ndim; d++) FUZZ_CHECK(shape[d] == t->shape[d], "parameter %s: shape", name);
        FUZZ_CHECK(numel == 0 || memcmp(pdata, t->data, (size_t)numel * sizeof(float)) == 0, "parameter %s: data",
                   name);
    }
    /* A small forward pass on the module. */
    const int64_t E = cfg->embed_dim, kd = cfg->kdim, vd = cfg->vdim;
    if (E <= 64 && kd <= 64 && vd <= 64) {
        const int64_t N = 2, L = 3, S = 2, H = cfg->num_heads;
        const int64_t S2 = attn_mha_weights_len_kv(m, S);
        float *q = fuzz_xmalloc((size_t)(L * N * E) * sizeof(float));
        float *k = fuzz_xmalloc((size_t)(S * N * kd) * sizeof(float));
        float *v = fuzz_xmalloc((size_t)(S * N * vd) * sizeof(float));
        float *o = fuzz_xmalloc((size_t)(L * N * E) * sizeof(float));
        float *w = fuzz_xmalloc((size_t)(N * H * L * S2) * sizeof(float));
        fuzz_rng r = {(uint64_t)E * 31 + (uint64_t)kd};
        for (int64_t i = 0; i < L * N * E; i++) q[i] = fuzz_rng_float(&r, -1, 1);
        for (int64_t i = 0; i < S * N * kd; i++) k[i] = fuzz_rng_float(&r, -1, 1);
        for (int64_t i = 0; i < S * N * vd; i++) v[i] = fuzz_rng_float(&r, -1, 1);
        attn_mha_args a;
        attn_mha_args_init(&a);
        a.query = q, a.key = k, a.value = v;
        a.batch = N, a.len_q = L, a.len_kv = S;
        a.average_attn_weights = (int)(E & 1);
        st = attn_mha_forward(ctx, m, &a, o, w);
        fuzz_check_error(ctx, st, "attn_mha_forward");
        FUZZ_CHECK(st == ATTN_OK, "forward on a module from a state: %s", attn_ctx_last_error(ctx));
        free(q), free(k), free(v), free(o), free(w);
    }
    attn_mha_free(m);
    /* Each allocation failing in turn: out of memory, nothing kept. */
    from_state args = {list, heads, extra};
    fuzz_fail_each_alloc(alloc, ctx, calls, create_from_state, &args,
                         "attn_mha_create_from_state (allocation failure)");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_alloc alloc = {0};
    attn_ctx *ctx = fuzz_ctx_new(&alloc, ATTN_ISA_AUTO, 1, 0);
    const size_t live0 = fuzz_alloc_live(&alloc);

    attn_tensor_list list;
    memset(&list, 0xA5, sizeof list);
    const uint64_t calls0 = fuzz_alloc_calls(&alloc);
    attn_status st = attn_safetensors_parse(ctx, data, size, &list);
    const uint64_t calls = fuzz_alloc_calls(&alloc) - calls0;
    fuzz_check_error(ctx, st, "attn_safetensors_parse");
    if (st != ATTN_OK) {
        FUZZ_CHECK(st == ATTN_ERR_BAD_FILE || st == ATTN_ERR_UNSUPPORTED || st == ATTN_ERR_OUT_OF_MEMORY ||
                       st == ATTN_ERR_OVERFLOW,
                   "status %s", attn_strerror(st));
        FUZZ_CHECK(list.count == 0 && list.tensors == NULL, "the list is not empty after a failure");
        FUZZ_CHECK(fuzz_alloc_live(&alloc) == live0, "%zu blocks leaked by a failed parse",
                   fuzz_alloc_live(&alloc) - live0);
        attn_ctx_free(ctx);
        FUZZ_CHECK(fuzz_alloc_live(&alloc) == 0, "%zu blocks leaked", fuzz_alloc_live(&alloc));
        return 0;
    }
    check_list(&list, data, size);

    /* Written back, it reads back the same. */
    size_t elen;
    uint8_t *enc = st_encode(&list, &elen);
    attn_tensor_list back;
    st = attn_safetensors_parse(ctx, enc, elen, &back);
    FUZZ_CHECK(st == ATTN_OK, "re-encoded list rejected: %s", attn_ctx_last_error(ctx));
    check_same_list(&list, &back);
    attn_tensor_list_release(ctx, &back);
    free(enc);

    /* A byte less or a byte more breaks the tiling of the data buffer. */
    attn_tensor_list other;
    st = parse_copy(ctx, data, size - 1, size, &other);
    FUZZ_CHECK(st != ATTN_OK, "the input minus its last byte was accepted");
    fuzz_check_error(ctx, st, "attn_safetensors_parse (truncated)");
    st = parse_copy(ctx, data, size + 1, size, &other);
    FUZZ_CHECK(st != ATTN_OK, "the input plus one byte was accepted");
    fuzz_check_error(ctx, st, "attn_safetensors_parse (extended)");

    /* Each allocation failing in turn (the first few hundred): out of memory, nothing kept. */
    fuzz_input in = {data, size};
    fuzz_fail_each_alloc(&alloc, ctx, calls < 300 ? calls : 300, parse_input, &in,
                         "attn_safetensors_parse (allocation failure)");

    check_files(ctx, &list, data[size - 1]);

    /* The list as an nn.MultiheadAttention state_dict. */
    if (attn_tensor_list_find(&list, "out_proj.weight") != NULL) {
        attn_mha_config extra;
        attn_mha_config_init(&extra, 0, 0);
        extra.add_zero_attn = 1;
        extra.batch_first = 1;
        extra.dropout = 0.25;
        try_module(ctx, &alloc, &list, 1, NULL);
        try_module(ctx, &alloc, &list, 2, &extra);
        try_module(ctx, &alloc, &list, 3, NULL);
        try_module(ctx, &alloc, &list, 0, NULL);
        try_module(ctx, &alloc, &list, -1, &extra);
    }

    attn_tensor_list_release(ctx, &list);
    FUZZ_CHECK(list.count == 0 && list.tensors == NULL, "attn_tensor_list_release left tensors");
    attn_ctx_free(ctx);
    FUZZ_CHECK(fuzz_alloc_live(&alloc) == 0, "%zu blocks leaked", fuzz_alloc_live(&alloc));
    return 0;
}

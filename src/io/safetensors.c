// safetensors.c - .safetensors files: attn_safetensors_read, attn_safetensors_parse and
// attn_safetensors_write.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON, then the data buffer. The
// JSON is an object mapping each tensor name to {"dtype": D, "shape": [...], "data_offsets":
// [begin, end]} (offsets relative to the data buffer), plus an optional "__metadata__" object of
// string values, which is checked and ignored.
// Reading checks, before allocating anything sized by the header: N <= 100,000,000 (the reference
// implementation's limit) and N <= file size - 8; strict JSON (json.h) whose root is an object;
// each entry has exactly the three keys; dtype one of F32 F64 F16 BF16 BOOL U8 I32 I64 (others:
// ATTN_ERR_UNSUPPORTED); at most ATTN_MAX_DIMS non-negative integer sizes; integer offsets with
// begin <= end <= buffer size and end - begin == numel * dtype size (overflow-checked); names
// non-empty, without NUL bytes, unique; and, as the format requires, that the tensors cover the
// data buffer exactly: sorted by offset, each starts where the previous one ends, the first at 0,
// the last at the end of the file. Every violation is ATTN_ERR_BAD_FILE.
// The tensors of the returned list are in data-offset order (ties, i.e. empty tensors, in header
// order): the order torch/safetensors writers lay them out, independent of the JSON key order.
// attn_safetensors_read streams the data from the file into each tensor (the file is not loaded
// whole). The JSON tree of a header of N bytes takes at most about 10 * N bytes.
// Writing lays the tensors out in the order given, without gaps, with the header padded with
// spaces to a multiple of 8 bytes (as the reference implementation does) and no __metadata__;
// the file is written atomically (file.h).
// It does not do: memory mapping, metadata on write, dtypes beyond the eight above.
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "io/file.h"
#include "io/json.h"
#include "io/sort.h"

#define ST_MAX_HEADER 100000000u

static const struct {
    const char *name;
    attn_dtype dtype;
} st_dtypes[] = {{"F32", ATTN_DTYPE_F32}, {"F64", ATTN_DTYPE_F64}, {"F16", ATTN_DTYPE_F16},
                 {"BF16", ATTN_DTYPE_BF16}, {"BOOL", ATTN_DTYPE_BOOL}, {"U8", ATTN_DTYPE_U8},
                 {"I32", ATTN_DTYPE_I32}, {"I64", ATTN_DTYPE_I64}};

// Name of a tensor for messages: at most 40 printable bytes.
static const char *msg_name(char out[48], const char *s, size_t len) {
    size_t k = len < 40 ? len : 40;
    for (size_t i = 0; i < k; i++) out[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    if (len > k) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = '\0';
    return out;
}

// ---- reading ---------------------------------------------------------------------------------

typedef struct st_entry {
    const char *name;
    size_t name_len;
    attn_dtype dtype;
    int ndim;
    int64_t shape[ATTN_MAX_DIMS];
    uint64_t begin, end;
    size_t index; // position in the header
} st_entry;

static int entry_cmp(const void *a, const void *b, void *user) {
    (void)user;
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static attn_status check_metadata(attn_ctx *ctx, const attn__json *m) {
    if (attn__json_kind(m) != ATTN__JSON_OBJECT)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: __metadata__ is a %s, not an object",
                          attn__json_kind_name(attn__json_kind(m)));
    for (size_t i = 0; i < attn__json_len(m); i++) {
        const attn__json *v = attn__json_at(m, i);
        if (attn__json_kind(v) != ATTN__JSON_STRING) {
            size_t klen;
            const char *k = attn__json_key(v, &klen);
            char nm[48];
            return attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: __metadata__ value '%s' is a %s, not a string",
                              msg_name(nm, k, klen), attn__json_kind_name(attn__json_kind(v)));
        }
    }
    return ATTN_OK;
}

// Checks one tensor entry (member `m` of the header object) against a buffer of data_len bytes.
static attn_status check_entry(attn_ctx *ctx, const attn__json *m, uint64_t data_len, st_entry *e) {
    char nm[48];
    size_t name_len;
    const char *name = attn__json_key(m, &name_len);
    msg_name(nm, name, name_len);
    if (name_len == 0) return attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: a tensor has an empty name");
    if (memchr(name, '\0', name_len) != NULL)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: tensor name '%s' contains a NUL character", nm);
    if (attn__json_kind(m) != ATTN__JSON_OBJECT)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: tensor '%s' is described by a %s, not an object", nm,
                          attn__json_kind_name(attn__json_kind(m)));
    for (size_t i = 0; i < attn__json_len(m); i++) {
        const char *k = attn__json_key(attn__json_at(m, i), NULL);
        if (strcmp(k, "dtype") != 0 && strcmp(k, "shape") != 0 && strcmp(k, "data_offsets") != 0) {
            char kn[48];
            size_t klen;
            k = attn__json_key(attn__json_at(m, i), &klen);
            return attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: tensor '%s' has an unexpected key '%s'", nm,
                              msg_name(kn, k, klen));
        }
    }
    const attn__json *jd = attn__json_get(m, "dtype"), *js = attn__json_get(m, "shape");
    const attn__json *jo = attn__json_get(m, "data_offsets");
    if (jd == NULL || js == NULL || jo == NULL)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: tensor '%s' lacks '%s'", nm,
                          jd == NULL ? "dtype" : js == NULL ? "shape" : "data_offsets");

    memset(e, 0, sizeof *e);
    e->name = name;
    e->name_len = name_len;
    size_t dlen;
    const char *dname = attn__json_string(jd, &dlen);
    if (dname == NULL)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: tensor '%s': dtype is a %s, not a string", nm,
                          attn__json_kind_name(attn__json_kind(jd)));
    int found = -1;
    for (int i = 0; i < (int)(sizeof st_dtypes / sizeof st_dtypes[0]); i++)
        if (strlen(st_dtypes[i].name) == dlen && memcmp(st_dtypes[i].name, dname, dlen) == 0) found = i;
    if (found < 0) {
        char dn[48];
        return attn__fail(ctx, ATTN_ERR_UNSUPPORTED, "safetensors: tensor '%s': dtype '%s' is not supported", nm,
                          msg_name(dn, dname, dlen));
    }
    e->dtype = st_dtypes[found].dtype;

    if (attn__json_kind(js) != ATTN__JSON_ARRAY)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: tensor '%s': shape is a %s, not an array", nm,
                          attn__json_kind_name(attn__json_kind(js)));
    if (attn__json_len(js) > ATTN_MAX_DIMS)
        return attn__fail(ctx, ATTN_ERR_UNSUPPORTED, "safetensors: tensor '%s' has %zu dimensions, more than %d", nm,
                          attn__json_len(js), ATTN_MAX_DIMS);
    e->ndim = (int)attn__json_len(js);
    int64_t numel = 1;
    for (int i = 0; i < e->ndim; i++) {
        int64_t d;
        if (!attn__json_int64(attn__json_at(js, (size_t)i), &d) || d < 0)
            return attn__fail(ctx, ATTN_ERR_BAD_FILE,
                              "safetensors: tensor '%s': shape[%d] is not a non-negative integer", nm, i);
        e->shape[i] = d;
        if (!attn__mul_i64(numel, d, &numel))
            return attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: tensor '%s': the shape has more than 2^63 elements",
                              nm);
    }
    int64_t off[2];
    if (attn__json_kind(jo) != ATTN__JSON_ARRAY || attn__json_len(jo) != 2 ||
        !attn__json_int64(attn__json_at(jo, 0), &off[0]) || !attn__json_int64(attn__json_at(jo, 1), &off[1]) ||
        off[0] < 0 || off[1] < 0)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE,
                          "safetensors: tensor '%s': data_offsets is not a pair of non-negative integers", nm);
    e->begin = (uint64_t)off[0];
    e->end = (uint64_t)off[1];
    if (e->end < e->begin || e->end > data_len)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE,
                          "safetensors: tensor '%s': data_offsets [%llu, %llu] outside the %llu-byte data buffer", nm,
                          (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)data_len);
    uint64_t bytes;
    if (__builtin_mul_overflow((uint64_t)numel, (uint64_t)attn_dtype_size(e->dtype), &bytes) ||
        bytes != e->end - e->begin)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE,
                          "safetensors: tensor '%s': %s with %lld elements does not fill data_offsets [%llu, %llu]", nm,
                          st_dtypes[found].name, (long long)numel, (unsigned long long)e->begin,
                          (unsigned long long)e->end);
    return ATTN_OK;
}

// Validates the header JSON hdr[0..n) for a data buffer of data_len bytes. On success *sorted (one
// allocation through ctx, free with attn__free) holds *count pointers to the entries, which live
// in the same allocation, sorted by data offset. The entries point into *doc (keep it alive).
static attn_status parse_header(attn_ctx *ctx, const char *hdr, size_t n, uint64_t data_len, attn__json_doc *doc,
                                st_entry ***sorted, size_t *count) {
    *sorted = NULL;
    *count = 0;
    attn__json_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.what = "safetensors header";
    opts.max_depth = 8;
    opts.max_nodes = n / 4 + 16; // a valid header spends at least 4.7 bytes per JSON value
    ATTN_RETURN_IF_ERR(attn__json_parse(ctx, hdr, n, &opts, doc));
    const attn__json *root = doc->root;
    attn_status st = ATTN_OK;
    if (attn__json_kind(root) != ATTN__JSON_OBJECT)
        st = attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: the header is a JSON %s, not an object",
                        attn__json_kind_name(attn__json_kind(root)));
    size_t members = attn__json_len(root), ntensors = 0;
    for (size_t i = 0; st == ATTN_OK && i < members; i++) {
        const attn__json *m = attn__json_at(root, i);
        if (strcmp(attn__json_key(m, NULL), "__metadata__") == 0)
            st = check_metadata(ctx, m);
        else
            ntensors++;
    }
    if (st == ATTN_OK && ntensors > (size_t)INT32_MAX)
        st = attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: too many tensors (%zu)", ntensors);
    // ntensors <= header bytes / 16: the array is bounded by the (checked) header size.
    void *mem = NULL;
    size_t bytes = 0;
    if (st == ATTN_OK && __builtin_mul_overflow(ntensors, sizeof(st_entry) + sizeof(st_entry *), &bytes))
        st = attn__fail(ctx, ATTN_ERR_OVERFLOW, "safetensors: too many tensors (%zu)", ntensors);
    if (st == ATTN_OK) st = attn__alloc(ctx, bytes, &mem);
    if (st != ATTN_OK) {
        attn__json_free(ctx, doc);
        return st;
    }
    st_entry **ptrs = mem;
    st_entry *entries = (st_entry *)(ptrs + ntensors);
    size_t k = 0;
    for (size_t i = 0; st == ATTN_OK && i < members; i++) {
        const attn__json *m = attn__json_at(root, i);
        if (strcmp(attn__json_key(m, NULL), "__metadata__") == 0) continue;
        st = check_entry(ctx, m, data_len, &entries[k]);
        entries[k].index = k;
        ptrs[k] = &entries[k];
        k++;
    }
    if (st == ATTN_OK) {
        attn__sort_ptrs((void **)ptrs, ntensors, entry_cmp, NULL);
        // The tensors must tile the buffer: no gap, no overlap, nothing after the last one.
        uint64_t pos = 0;
        for (size_t i = 0; st == ATTN_OK && i < ntensors; i++) {
            const st_entry *e = ptrs[i];
            if (e->begin != pos) {
                char a[48], b[48];
                if (i == 0)
                    st = attn__fail(ctx, ATTN_ERR_BAD_FILE,
                                    "safetensors: the data buffer starts with %llu bytes no tensor covers (first "
                                    "tensor '%s')",
                                    (unsigned long long)e->begin, msg_name(a, e->name, e->name_len));
                else
                    st = attn__fail(ctx, ATTN_ERR_BAD_FILE,
                                    "safetensors: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) %s",
                                    msg_name(a, ptrs[i - 1]->name, ptrs[i - 1]->name_len),
                                    (unsigned long long)ptrs[i - 1]->begin, (unsigned long long)ptrs[i - 1]->end,
                                    msg_name(b, e->name, e->name_len), (unsigned long long)e->begin,
                                    (unsigned long long)e->end, e->begin < pos ? "overlap" : "leave a gap");
            }
            pos = e->end;
        }
        if (st == ATTN_OK && pos != data_len)
            st = attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: %llu bytes of the data buffer after the last tensor",
                            (unsigned long long)(data_len - pos));
    }
    if (st != ATTN_OK) {
        attn__free(ctx, mem);
        attn__json_free(ctx, doc);
        return st;
    }
    *sorted = ptrs;
    *count = ntensors;
    return ATTN_OK;
}

// Fills a list from checked entries. Data comes from `data` (the buffer in memory) or, when it is
// NULL, sequentially from `file` (positioned at the start of the buffer: the sorted entries tile
// it, so reading them in order reads it front to back).
static attn_status build_list(attn_ctx *ctx, st_entry **sorted, size_t count, const unsigned char *data,
                              attn__file *file, attn_tensor_list *out) {
    attn_tensor_list list = {0, NULL};
    if (count > 0) {
        void *mem = NULL;
        size_t bytes; // count <= INT32_MAX
        if (__builtin_mul_overflow(count, sizeof(attn_tensor), &bytes))
            return attn__fail(ctx, ATTN_ERR_OVERFLOW, "safetensors: too many tensors (%zu)", count);
        ATTN_RETURN_IF_ERR(attn__alloc(ctx, bytes, &mem));
        memset(mem, 0, bytes);
        list.tensors = mem;
        list.count = (int)count;
    }
    attn_status st = ATTN_OK;
    for (size_t i = 0; st == ATTN_OK && i < count; i++) {
        const st_entry *e = sorted[i];
        attn_tensor *t = &list.tensors[i];
        size_t bytes = (size_t)(e->end - e->begin); // checked against the buffer size
        t->dtype = e->dtype;
        t->ndim = e->ndim;
        memcpy(t->shape, e->shape, sizeof t->shape);
        void *name = NULL;
        st = attn__alloc(ctx, e->name_len + 1, &name);
        if (st != ATTN_OK) break;
        memcpy(name, e->name, e->name_len + 1);
        t->name = name;
        st = attn__alloc(ctx, bytes, &t->data);
        if (st != ATTN_OK) break;
        if (data != NULL)
            memcpy(t->data, data + e->begin, bytes);
        else
            st = attn__file_read(ctx, file, t->data, bytes);
    }
    if (st != ATTN_OK) {
        attn_tensor_list_release(ctx, &list);
        return st;
    }
    *out = list;
    return ATTN_OK;
}

static uint64_t read_le64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

// Checks the 8-byte header length against the total size.
static attn_status check_header_len(attn_ctx *ctx, uint64_t n, uint64_t size) {
    if (n > size - 8)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: header length %llu goes past the end of the file "
                          "(%llu bytes)", (unsigned long long)n, (unsigned long long)size);
    if (n > ST_MAX_HEADER)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: header length %llu is over the limit of %u bytes",
                          (unsigned long long)n, ST_MAX_HEADER);
    return ATTN_OK;
}

attn_status attn_safetensors_parse(attn_ctx *ctx, const void *bytes, size_t size, attn_tensor_list *out) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (out == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_safetensors_parse: out is NULL");
    out->count = 0;
    out->tensors = NULL;
    if (bytes == NULL && size > 0)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_safetensors_parse: bytes is NULL");
    if (size < 8)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: truncated: %zu bytes, shorter than the header length",
                          size);
    const unsigned char *b = bytes;
    uint64_t n = read_le64(b);
    ATTN_RETURN_IF_ERR(check_header_len(ctx, n, size));
    attn__json_doc doc;
    st_entry **sorted;
    size_t count;
    ATTN_RETURN_IF_ERR(parse_header(ctx, (const char *)b + 8, (size_t)n, size - 8 - n, &doc, &sorted, &count));
    attn_status st = build_list(ctx, sorted, count, b + 8 + n, NULL, out);
    attn__free(ctx, sorted);
    attn__json_free(ctx, &doc);
    return st;
}

static attn_status read_file(attn_ctx *ctx, attn__file *f, attn_tensor_list *out) {
    unsigned char lenb[8];
    if (f->size < 8)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "safetensors: truncated: %llu bytes, shorter than the header length",
                          (unsigned long long)f->size);
    ATTN_RETURN_IF_ERR(attn__file_read(ctx, f, lenb, 8));
    uint64_t n = read_le64(lenb);
    ATTN_RETURN_IF_ERR(check_header_len(ctx, n, f->size));
    void *hdr = NULL; // n is at most the file size and ST_MAX_HEADER
    ATTN_RETURN_IF_ERR(attn__alloc(ctx, (size_t)n, &hdr));
    attn_status st = attn__file_read(ctx, f, hdr, (size_t)n);
    attn__json_doc doc;
    st_entry **sorted = NULL;
    size_t count = 0;
    if (st == ATTN_OK) st = parse_header(ctx, hdr, (size_t)n, f->size - 8 - n, &doc, &sorted, &count);
    if (st == ATTN_OK) {
        st = build_list(ctx, sorted, count, NULL, f, out);
        if (st == ATTN_OK) st = attn__file_expect_end(ctx, f);
        if (st != ATTN_OK) attn_tensor_list_release(ctx, out);
        attn__free(ctx, sorted);
        attn__json_free(ctx, &doc);
    }
    attn__free(ctx, hdr);
    return st;
}

attn_status attn_safetensors_read(attn_ctx *ctx, const char *path, attn_tensor_list *out) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (out == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_safetensors_read: out is NULL");
    out->count = 0;
    out->tensors = NULL;
    if (path == NULL || path[0] == '\0')
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_safetensors_read: path is NULL or empty");
    attn__file f;
    ATTN_RETURN_IF_ERR(attn__file_open(ctx, path, &f));
    attn_status st = read_file(ctx, &f, out);
    attn__file_close(&f);
    return attn__file_status(ctx, st, path); // names the file in format errors
}

// ---- writing ---------------------------------------------------------------------------------

// Appends to a buffer, or only counts when buf is NULL (so one function both sizes and fills).
typedef struct st_out {
    char *buf;
    size_t len;
} st_out;

static void put(st_out *o, const char *s, size_t n) {
    if (o->buf != NULL) memcpy(o->buf + o->len, s, n);
    o->len += n;
}

static void put_str(st_out *o, const char *s) { put(o, s, strlen(s)); }

static void put_u64(st_out *o, uint64_t v) {
    char b[24];
    int n = snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    put(o, b, (size_t)n);
}

// {"name":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},...}
static void put_header(st_out *o, const attn_tensor *tensors, int count, const uint64_t *offsets) {
    put_str(o, "{");
    for (int i = 0; i < count; i++) {
        const attn_tensor *t = &tensors[i];
        if (i > 0) put_str(o, ",");
        size_t nlen = strlen(t->name);
        o->len += attn__json_write_string(o->buf != NULL ? o->buf + o->len : NULL, t->name, nlen);
        put_str(o, ":{\"dtype\":\"");
        put_str(o, attn_dtype_name(t->dtype));
        put_str(o, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d > 0) put_str(o, ",");
            put_u64(o, (uint64_t)t->shape[d]);
        }
        put_str(o, "],\"data_offsets\":[");
        put_u64(o, offsets[i]);
        put_str(o, ",");
        put_u64(o, offsets[i + 1]);
        put_str(o, "]}");
    }
    put_str(o, "}");
}

static int name_cmp(const void *a, const void *b, void *user) {
    (void)user;
    return strcmp(((const attn_tensor *)a)->name, ((const attn_tensor *)b)->name);
}

attn_status attn_safetensors_write(attn_ctx *ctx, const char *path, const attn_tensor *tensors, int count) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (path == NULL || path[0] == '\0')
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_safetensors_write: path is NULL or empty");
    if (count < 0) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_safetensors_write: count %d < 0", count);
    if (count > 0 && tensors == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_safetensors_write: tensors is NULL");
    for (int i = 0; i < count; i++) {
        const attn_tensor *t = &tensors[i];
        if (t->name == NULL || t->name[0] == '\0')
            return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_safetensors_write: tensor %d has no name", i);
        char nm[48];
        size_t nlen = strlen(t->name);
        msg_name(nm, t->name, nlen);
        if (!attn__json_utf8_valid(t->name, nlen))
            return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_safetensors_write: name '%s' is not valid UTF-8", nm);
        if (strcmp(t->name, "__metadata__") == 0)
            return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_safetensors_write: '__metadata__' is a reserved name");
        if (attn_dtype_block_size(t->dtype) != 1) // unknown, or a block type (Q8_0, Q4_0)
            return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_safetensors_write: tensor '%s' has dtype %d (%s), not one of "
                              "the eight element types", nm, (int)t->dtype, attn_dtype_name(t->dtype));
        if (t->ndim < 0 || t->ndim > ATTN_MAX_DIMS)
            return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_safetensors_write: tensor '%s' has ndim %d", nm,
                              t->ndim);
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] < 0)
                return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "attn_safetensors_write: tensor '%s' has shape[%d] = %lld",
                                  nm, d, (long long)t->shape[d]);
        int64_t numel = attn_tensor_numel(t);
        if (numel < 0)
            return attn__fail(ctx, ATTN_ERR_OVERFLOW, "attn_safetensors_write: tensor '%s': element count overflows",
                              nm);
        size_t bytes;
        ATTN_RETURN_IF_ERR(attn__bytes(ctx, "attn_safetensors_write", numel, attn_dtype_size(t->dtype), &bytes));
        if (bytes > 0 && t->data == NULL)
            return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_safetensors_write: tensor '%s' has no data", nm);
    }

    // offsets (count + 1) | name-sorted pointers (count), for the duplicate check
    void *mem = NULL;
    size_t n1 = (size_t)count + 1;
    ATTN_RETURN_IF_ERR(attn__alloc(ctx, n1 * sizeof(uint64_t) + (size_t)count * sizeof(void *), &mem));
    uint64_t *offsets = mem;
    const void **byname = (const void **)(offsets + n1);
    attn_status st = ATTN_OK;
    offsets[0] = 0;
    for (int i = 0; i < count && st == ATTN_OK; i++) {
        uint64_t b = (uint64_t)attn_tensor_numel(&tensors[i]) * attn_dtype_size(tensors[i].dtype); // checked above
        if (__builtin_add_overflow(offsets[i], b, &offsets[i + 1]) || offsets[i + 1] > (uint64_t)INT64_MAX)
            st = attn__fail(ctx, ATTN_ERR_OVERFLOW, "attn_safetensors_write: the data buffer size overflows");
        byname[i] = &tensors[i];
    }
    if (st == ATTN_OK) {
        attn__sort_ptrs((void **)byname, (size_t)count, name_cmp, NULL);
        for (int i = 1; i < count && st == ATTN_OK; i++)
            if (name_cmp(byname[i - 1], byname[i], NULL) == 0) {
                char nm[48];
                const char *s = ((const attn_tensor *)byname[i])->name;
                st = attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_safetensors_write: duplicate name '%s'",
                                msg_name(nm, s, strlen(s)));
            }
    }
    // Header: 8-byte length, JSON, spaces up to a multiple of 8.
    st_out o = {NULL, 0};
    char *hdr = NULL;
    size_t padded = 0;
    if (st == ATTN_OK) {
        put_header(&o, tensors, count, offsets);
        padded = (o.len + 7) & ~(size_t)7;
        void *h = NULL;
        st = attn__alloc(ctx, 8 + padded, &h);
        hdr = h;
    }
    if (st == ATTN_OK) {
        o.buf = hdr + 8;
        o.len = 0;
        put_header(&o, tensors, count, offsets);
        memset(hdr + 8 + o.len, ' ', padded - o.len);
        for (int i = 0; i < 8; i++) hdr[i] = (char)(((uint64_t)padded >> (8 * i)) & 0xFF);
        attn__atomic_file w;
        st = attn__atomic_begin(ctx, path, &w);
        if (st == ATTN_OK) {
            st = attn__atomic_write(ctx, &w, hdr, 8 + padded);
            for (int i = 0; i < count && st == ATTN_OK; i++)
                st = attn__atomic_write(ctx, &w, tensors[i].data, (size_t)(offsets[i + 1] - offsets[i]));
            if (st == ATTN_OK) st = attn__atomic_commit(ctx, &w);
            if (st != ATTN_OK) attn__atomic_abort(ctx, &w);
        }
    }
    attn__free(ctx, hdr);
    attn__free(ctx, mem);
    return st;
}

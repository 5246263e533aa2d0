// npy.c - NumPy .npy files: attn_npy_read, attn_npy_parse, attn_npy_write.
//
// Reads format versions 1.0, 2.0 and 3.0 of little-endian, C-order arrays of the dtypes
// '<f4' '<f8' '<f2' '|b1' '|u1' '<i4' '<i8' (attn_dtype F32 F64 F16 BOOL U8 I32 I64). The header
// is a Python dict literal; it is parsed by a small grammar (strings without escapes, True/False,
// tuples of non-negative integers) and must hold exactly the keys 'descr', 'fortran_order' and
// 'shape'. Nothing in it is trusted: the data size computed from the shape (overflow-checked)
// must equal the bytes after the header exactly before the data is allocated.
// Writes version 1.0 with the same bytes as numpy.save (numpy >= 1.24): dict keys sorted, 21
// growth spaces, header padded with spaces and '\n' to a multiple of 64 bytes.
// It does not do: other dtypes (e.g. '|i1', '<u2', complex, strings, objects or structured:
// ATTN_ERR_UNSUPPORTED naming the dtype), big-endian data or fortran_order True (both
// ATTN_ERR_UNSUPPORTED), big-endian hosts, pickles, .npz archives, memory mapping.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "io/file.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
// Longest header accepted. A header for ATTN_MAX_DIMS dimensions needs under 300 bytes; numpy
// itself refuses headers over 10000 bytes unless told to trust the file.
#define NPY_MAX_HEADER 65536
#define NPY_ALIGN 64
#define NPY_GROWTH_DIGITS 21

static bool host_is_little_endian(void) {
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

static const char *npy_descr(attn_dtype dtype) {
    switch (dtype) {
    case ATTN_DTYPE_F32: return "<f4";
    case ATTN_DTYPE_F64: return "<f8";
    case ATTN_DTYPE_F16: return "<f2";
    case ATTN_DTYPE_BOOL: return "|b1";
    case ATTN_DTYPE_U8: return "|u1";
    case ATTN_DTYPE_I32: return "<i4";
    case ATTN_DTYPE_I64: return "<i8";
    case ATTN_DTYPE_BF16: return NULL;
    case ATTN_DTYPE_Q8_0: return NULL;
    case ATTN_DTYPE_Q4_0: return NULL;
    }
    return NULL;
}

// ---- header ----------------------------------------------------------------------------------

typedef struct npy_info {
    char descr[48];
    bool descr_truncated;
    bool fortran;
    int ndim; // may exceed ATTN_MAX_DIMS (then only the first ATTN_MAX_DIMS sizes are kept)
    int64_t shape[ATTN_MAX_DIMS];
} npy_info;

typedef struct hparser {
    attn_ctx *ctx;
    const char *s;
    size_t n, pos;
    size_t base; // file offset of s[0], for messages
} hparser;

static attn_status hfail(hparser *h, const char *fmt, ...) ATTN_PRINTF(2, 3);
static attn_status hfail(hparser *h, const char *fmt, ...) {
    char msg[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return attn__fail(h->ctx, ATTN_ERR_BAD_FILE, "npy: malformed header at byte %zu: %s", h->base + h->pos, msg);
}

static void hskip_ws(hparser *h) {
    while (h->pos < h->n && (h->s[h->pos] == ' ' || h->s[h->pos] == '\t' || h->s[h->pos] == '\n' ||
                             h->s[h->pos] == '\r'))
        h->pos++;
}

static bool hpeek(const hparser *h, char c) { return h->pos < h->n && h->s[h->pos] == c; }

static attn_status hexpect(hparser *h, char c) {
    if (!hpeek(h, c)) return hfail(h, "expected '%c'", c);
    h->pos++;
    return ATTN_OK;
}

// A Python string literal without escapes; copies up to cap-1 bytes to out (NUL-terminated).
static attn_status hstring(hparser *h, char *out, size_t cap, bool *truncated) {
    if (!hpeek(h, '\'') && !hpeek(h, '"')) return hfail(h, "expected a quoted string");
    char q = h->s[h->pos++];
    size_t k = 0;
    *truncated = false;
    for (;;) {
        if (h->pos >= h->n) return hfail(h, "unterminated string");
        unsigned char c = (unsigned char)h->s[h->pos];
        if ((char)c == q) break;
        if (c == '\\') return hfail(h, "escapes in strings are not supported");
        if (c < 0x20 || c >= 0x7f) return hfail(h, "byte 0x%02x in a string", c);
        if (k + 1 < cap)
            out[k++] = (char)c;
        else
            *truncated = true;
        h->pos++;
    }
    h->pos++;
    out[k] = '\0';
    return ATTN_OK;
}

static bool hword(hparser *h, const char *w) {
    size_t k = strlen(w);
    if (h->n - h->pos < k || memcmp(h->s + h->pos, w, k) != 0) return false;
    if (h->pos + k < h->n) {
        char c = h->s[h->pos + k];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_') return false;
    }
    h->pos += k;
    return true;
}

static attn_status hint(hparser *h, int64_t *out) {
    if (h->pos >= h->n || h->s[h->pos] < '0' || h->s[h->pos] > '9')
        return hfail(h, "expected a non-negative integer");
    if (h->s[h->pos] == '0' && h->pos + 1 < h->n && h->s[h->pos + 1] >= '0' && h->s[h->pos + 1] <= '9')
        return hfail(h, "integer with a leading zero");
    int64_t v = 0;
    while (h->pos < h->n && h->s[h->pos] >= '0' && h->s[h->pos] <= '9') {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, h->s[h->pos] - '0', &v))
            return hfail(h, "dimension does not fit in int64");
        h->pos++;
    }
    *out = v;
    return ATTN_OK;
}

static attn_status htuple(hparser *h, npy_info *info) {
    ATTN_RETURN_IF_ERR(hexpect(h, '('));
    hskip_ws(h);
    info->ndim = 0;
    if (hpeek(h, ')')) {
        h->pos++;
        return ATTN_OK;
    }
    for (;;) {
        int64_t d = 0;
        ATTN_RETURN_IF_ERR(hint(h, &d));
        if (info->ndim < ATTN_MAX_DIMS) info->shape[info->ndim] = d;
        info->ndim++; // at most NPY_MAX_HEADER / 2
        hskip_ws(h);
        if (hpeek(h, ',')) {
            h->pos++;
            hskip_ws(h);
            if (hpeek(h, ')')) {
                h->pos++;
                return ATTN_OK;
            }
            continue;
        }
        if (hpeek(h, ')')) {
            if (info->ndim == 1) return hfail(h, "shape '(n)' is not a tuple (write '(n,)')");
            h->pos++;
            return ATTN_OK;
        }
        return hfail(h, "expected ',' or ')' in the shape");
    }
}

// Parses the header dict s[0..n) into info. BAD_FILE for anything malformed; UNSUPPORTED for a
// structured (list) descr.
static attn_status parse_header_dict(attn_ctx *ctx, const char *s, size_t n, size_t base, npy_info *info) {
    hparser h = {ctx, s, n, 0, base};
    memset(info, 0, sizeof *info);
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    hskip_ws(&h);
    ATTN_RETURN_IF_ERR(hexpect(&h, '{'));
    for (;;) {
        hskip_ws(&h);
        if (hpeek(&h, '}')) {
            h.pos++;
            break;
        }
        char key[32];
        bool trunc;
        size_t key_at = h.pos;
        ATTN_RETURN_IF_ERR(hstring(&h, key, sizeof key, &trunc));
        hskip_ws(&h);
        ATTN_RETURN_IF_ERR(hexpect(&h, ':'));
        hskip_ws(&h);
        bool *seen;
        if (!trunc && strcmp(key, "descr") == 0) {
            seen = &seen_descr;
            if (hpeek(&h, '['))
                return attn__fail(ctx, ATTN_ERR_UNSUPPORTED,
                                  "npy: structured dtypes (a list 'descr') are not supported");
            ATTN_RETURN_IF_ERR(hstring(&h, info->descr, sizeof info->descr, &info->descr_truncated));
        } else if (!trunc && strcmp(key, "fortran_order") == 0) {
            seen = &seen_fortran;
            if (hword(&h, "True"))
                info->fortran = true;
            else if (hword(&h, "False"))
                info->fortran = false;
            else
                return hfail(&h, "fortran_order must be True or False");
        } else if (!trunc && strcmp(key, "shape") == 0) {
            seen = &seen_shape;
            ATTN_RETURN_IF_ERR(htuple(&h, info));
        } else {
            h.pos = key_at;
            return hfail(&h, "unexpected key '%s%s'", key, trunc ? "..." : "");
        }
        if (*seen) {
            h.pos = key_at;
            return hfail(&h, "duplicate key '%s'", key);
        }
        *seen = true;
        hskip_ws(&h);
        if (hpeek(&h, ',')) {
            h.pos++;
            continue;
        }
        if (hpeek(&h, '}')) {
            h.pos++;
            break;
        }
        return hfail(&h, "expected ',' or '}' after a value");
    }
    hskip_ws(&h);
    if (h.pos != h.n) return hfail(&h, "unexpected characters after the header dict");
    if (!seen_descr || !seen_fortran || !seen_shape)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "npy: the header lacks the key '%s'",
                          !seen_descr ? "descr" : !seen_fortran ? "fortran_order" : "shape");
    return ATTN_OK;
}

// Turns a parsed header into dtype/shape and the data size; checks it against `available` bytes.
static attn_status check_header(attn_ctx *ctx, const npy_info *info, uint64_t available, attn_tensor *t,
                                size_t *bytes) {
    static const struct {
        const char *descr;
        attn_dtype dtype;
    } map[] = {{"<f4", ATTN_DTYPE_F32}, {"<f8", ATTN_DTYPE_F64}, {"<f2", ATTN_DTYPE_F16}, {"|b1", ATTN_DTYPE_BOOL},
               {"|u1", ATTN_DTYPE_U8},  {"<i4", ATTN_DTYPE_I32}, {"<i8", ATTN_DTYPE_I64}};
    int found = -1;
    for (int i = 0; i < (int)(sizeof map / sizeof map[0]); i++)
        if (!info->descr_truncated && strcmp(info->descr, map[i].descr) == 0) found = i;
    if (found < 0) {
        const char *more = info->descr_truncated ? "..." : "";
        if (info->descr[0] == '>')
            return attn__fail(ctx, ATTN_ERR_UNSUPPORTED, "npy: big-endian dtype '%s%s' is not supported", info->descr,
                              more);
        return attn__fail(ctx, ATTN_ERR_UNSUPPORTED,
                          "npy: dtype '%s%s' is not supported (only <f4 <f8 <f2 |b1 |u1 <i4 <i8)", info->descr, more);
    }
    if (info->fortran)
        return attn__fail(ctx, ATTN_ERR_UNSUPPORTED, "npy: fortran_order True (column-major data) is not supported");
    if (info->ndim > ATTN_MAX_DIMS)
        return attn__fail(ctx, ATTN_ERR_UNSUPPORTED, "npy: %d dimensions, more than ATTN_MAX_DIMS = %d", info->ndim,
                          ATTN_MAX_DIMS);
    attn_dtype dtype = map[found].dtype;
    int64_t numel = 1;
    for (int i = 0; i < info->ndim; i++)
        if (!attn__mul_i64(numel, info->shape[i], &numel))
            return attn__fail(ctx, ATTN_ERR_BAD_FILE, "npy: the header's shape has more than 2^63 elements");
    size_t esize = attn_dtype_size(dtype), nbytes;
    if (__builtin_mul_overflow((size_t)numel, esize, &nbytes) || (uint64_t)numel > SIZE_MAX / esize)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "npy: the header's shape needs more bytes than size_t holds");
    if ((uint64_t)nbytes != available)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE,
                          "npy: the header's shape and dtype '%s' need %zu data bytes, the file has %llu", info->descr,
                          nbytes, (unsigned long long)available);
    t->dtype = dtype;
    t->ndim = info->ndim;
    for (int i = 0; i < info->ndim; i++) t->shape[i] = info->shape[i];
    *bytes = nbytes;
    return ATTN_OK;
}

// ---- reading ---------------------------------------------------------------------------------

// Bytes come either from memory or from a file; `size` is the total in both cases.
typedef struct npy_src {
    const unsigned char *mem; // NULL for a file
    attn__file *file;
    uint64_t size;
    uint64_t pos;
} npy_src;

static attn_status src_read(attn_ctx *ctx, npy_src *s, void *dst, size_t n) {
    // Callers have checked n against size - pos.
    if (s->mem != NULL) {
        if (n > 0) memcpy(dst, s->mem + s->pos, n);
    } else {
        ATTN_RETURN_IF_ERR(attn__file_read(ctx, s->file, dst, n));
    }
    s->pos += n;
    return ATTN_OK;
}

static attn_status npy_load(attn_ctx *ctx, npy_src *src, attn_tensor *out) {
    if (!host_is_little_endian())
        return attn__fail(ctx, ATTN_ERR_UNSUPPORTED, "npy: big-endian hosts are not supported");
    unsigned char pro[12];
    uint64_t size = src->size;
    if (size < 8) {
        size_t k = size < NPY_MAGIC_LEN ? (size_t)size : NPY_MAGIC_LEN;
        ATTN_RETURN_IF_ERR(src_read(ctx, src, pro, k));
        if (memcmp(pro, NPY_MAGIC, k) != 0)
            return attn__fail(ctx, ATTN_ERR_BAD_FILE, "npy: not a .npy file (no \\x93NUMPY magic)");
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "npy: truncated: %llu bytes, shorter than the preamble",
                          (unsigned long long)size);
    }
    ATTN_RETURN_IF_ERR(src_read(ctx, src, pro, 8));
    if (memcmp(pro, NPY_MAGIC, NPY_MAGIC_LEN) != 0)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "npy: not a .npy file (no \\x93NUMPY magic)");
    int major = pro[6], minor = pro[7];
    if (major < 1 || major > 3 || minor != 0)
        return attn__fail(ctx, ATTN_ERR_UNSUPPORTED, "npy: format version %d.%d is not supported (1.0, 2.0, 3.0 are)",
                          major, minor);
    size_t len_bytes = major == 1 ? 2 : 4;
    if (size < 8 + len_bytes)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "npy: truncated: %llu bytes, shorter than the preamble",
                          (unsigned long long)size);
    ATTN_RETURN_IF_ERR(src_read(ctx, src, pro + 8, len_bytes));
    uint64_t header_len = (uint64_t)pro[8] | (uint64_t)pro[9] << 8;
    if (len_bytes == 4) header_len |= (uint64_t)pro[10] << 16 | (uint64_t)pro[11] << 24;
    size_t header_start = 8 + len_bytes;
    if (header_len > size - header_start)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "npy: header length %llu goes past the end of the file (%llu bytes)",
                          (unsigned long long)header_len, (unsigned long long)size);
    if (header_len > NPY_MAX_HEADER)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "npy: header length %llu is absurd (the limit is %d bytes)",
                          (unsigned long long)header_len, NPY_MAX_HEADER);

    npy_info info;
    attn_status st;
    if (src->mem != NULL) {
        st = parse_header_dict(ctx, (const char *)src->mem + header_start, (size_t)header_len, header_start, &info);
        src->pos += header_len;
    } else {
        void *hbuf = NULL; // header_len is checked against the file size and NPY_MAX_HEADER
        ATTN_RETURN_IF_ERR(attn__alloc(ctx, (size_t)header_len, &hbuf));
        st = src_read(ctx, src, hbuf, (size_t)header_len);
        if (st == ATTN_OK) st = parse_header_dict(ctx, hbuf, (size_t)header_len, header_start, &info);
        attn__free(ctx, hbuf);
    }
    if (st != ATTN_OK) return st;

    attn_tensor t;
    memset(&t, 0, sizeof t);
    size_t bytes = 0;
    ATTN_RETURN_IF_ERR(check_header(ctx, &info, size - src->pos, &t, &bytes));
    ATTN_RETURN_IF_ERR(attn__alloc(ctx, bytes, &t.data)); // bytes == what the file holds
    st = src_read(ctx, src, t.data, bytes);
    if (st == ATTN_OK && src->file != NULL) st = attn__file_expect_end(ctx, src->file);
    if (st != ATTN_OK) {
        attn__free(ctx, t.data);
        return st;
    }
    *out = t;
    return ATTN_OK;
}

attn_status attn_npy_parse(attn_ctx *ctx, const void *bytes, size_t size, attn_tensor *out) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (out == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_npy_parse: out is NULL");
    memset(out, 0, sizeof *out);
    if (bytes == NULL && size > 0) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_npy_parse: bytes is NULL");
    npy_src src = {bytes != NULL ? bytes : (const unsigned char *)"", NULL, size, 0};
    return npy_load(ctx, &src, out);
}

attn_status attn_npy_read(attn_ctx *ctx, const char *path, attn_tensor *out) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (out == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_npy_read: out is NULL");
    memset(out, 0, sizeof *out);
    if (path == NULL || path[0] == '\0')
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_npy_read: path is NULL or empty");
    attn__file f;
    ATTN_RETURN_IF_ERR(attn__file_open(ctx, path, &f));
    npy_src src = {NULL, &f, f.size, 0};
    attn_status st = npy_load(ctx, &src, out);
    attn__file_close(&f);
    return attn__file_status(ctx, st, path); // names the file in format errors
}

// ---- writing ---------------------------------------------------------------------------------

attn_status attn_npy_write(attn_ctx *ctx, const char *path, attn_dtype dtype, int ndim, const int64_t *shape,
                           const void *data) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    attn__clear_error(ctx);
    if (path == NULL || path[0] == '\0')
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_npy_write: path is NULL or empty");
    if (attn_dtype_size(dtype) == 0)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_npy_write: unknown dtype %d", (int)dtype);
    const char *descr = npy_descr(dtype);
    if (descr == NULL)
        return attn__fail(ctx, ATTN_ERR_UNSUPPORTED, "attn_npy_write: .npy has no %s dtype", attn_dtype_name(dtype));
    if (ndim < 0 || ndim > ATTN_MAX_DIMS)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_npy_write: ndim %d is outside [0, %d]", ndim, ATTN_MAX_DIMS);
    if (ndim > 0 && shape == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_npy_write: shape is NULL");
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "attn_npy_write: shape[%d] = %lld is negative", i,
                              (long long)shape[i]);
        if (!attn__mul_i64(numel, shape[i], &numel))
            return attn__fail(ctx, ATTN_ERR_OVERFLOW, "attn_npy_write: the number of elements overflows");
    }
    size_t bytes;
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "attn_npy_write", numel, attn_dtype_size(dtype), &bytes));
    if (bytes > 0 && data == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn_npy_write: data is NULL");
    if (!host_is_little_endian())
        return attn__fail(ctx, ATTN_ERR_UNSUPPORTED, "attn_npy_write: big-endian hosts are not supported");

    // Header, exactly as numpy.save writes it (format 1.0):
    //   "\x93NUMPY" 1 0 <u16 len> "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
    //   + (21 - digits of shape[0]) spaces + padding spaces + "\n", total a multiple of 64.
    char hdr[512];
    size_t k = 10;
    k += (size_t)snprintf(hdr + k, sizeof hdr - k, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int i = 0; i < ndim; i++)
        k += (size_t)snprintf(hdr + k, sizeof hdr - k, i == 0 ? "%lld" : ", %lld", (long long)shape[i]);
    k += (size_t)snprintf(hdr + k, sizeof hdr - k, "%s), }", ndim == 1 ? "," : "");
    if (ndim > 0) {
        char digits[24];
        int nd = snprintf(digits, sizeof digits, "%lld", (long long)shape[0]);
        for (int i = nd; i < NPY_GROWTH_DIGITS; i++) hdr[k++] = ' ';
    }
    size_t pad = NPY_ALIGN - ((k + 1) % NPY_ALIGN); // numpy pads by 64 when already aligned
    memset(hdr + k, ' ', pad);
    k += pad;
    hdr[k++] = '\n';
    memcpy(hdr, NPY_MAGIC, NPY_MAGIC_LEN);
    hdr[6] = 1;
    hdr[7] = 0;
    hdr[8] = (char)((k - 10) & 0xFF);
    hdr[9] = (char)((k - 10) >> 8);

    attn__atomic_file w;
    ATTN_RETURN_IF_ERR(attn__atomic_begin(ctx, path, &w));
    attn_status st = attn__atomic_write(ctx, &w, hdr, k);
    if (st == ATTN_OK) st = attn__atomic_write(ctx, &w, data, bytes);
    if (st == ATTN_OK) st = attn__atomic_commit(ctx, &w);
    if (st != ATTN_OK) attn__atomic_abort(ctx, &w);
    return st;
}

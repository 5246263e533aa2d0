// print.c - format float32 tensors exactly as PyTorch 1.13's str(tensor) does (see print.h).
//
// The layout mirrors torch/_tensor_str.py with the default print options: a _Formatter picks the
// notation and the common width from the shown elements, then the nested brackets are written
// recursively, vectors wrapped at 80 columns, and the suffixes placed as _add_suffixes places them.
// Output goes either to a caller's buffer (snprintf-like, counting past its end) or to a FILE.
#include "print.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

// PyTorch's default print options.
enum {
    PRINT_PRECISION = 4,
    PRINT_THRESHOLD = 1000,
    PRINT_EDGEITEMS = 3,
    PRINT_LINEWIDTH = 80,
};

// len("tensor(")
#define PRINT_INDENT 7

// ---- output sink ------------------------------------------------------------------------------

typedef struct out_sink {
    char *buf;  // destination buffer, or NULL
    size_t cap; // its size in bytes, NUL included
    size_t len; // bytes produced so far (may exceed cap)
    FILE *f;    // destination stream, or NULL
    int err;    // a write to f failed
    size_t col; // characters (code points) since the last '\n'
} out_sink;

static void out_put(out_sink *o, const char *s, size_t n) {
    if (n == 0) return;
    // Track the column the way Python's len() counts characters: UTF-8 continuation bytes don't count.
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            o->col = 0;
        else if ((c & 0xC0) != 0x80)
            o->col++;
    }
    if (o->f) {
        if (!o->err && fwrite(s, 1, n, o->f) != n) o->err = 1;
    } else if (o->buf && o->cap > 0 && o->len < o->cap - 1) {
        size_t room = o->cap - 1 - o->len;
        memcpy(o->buf + o->len, s, n < room ? n : room);
    }
    o->len = (o->len > SIZE_MAX - n) ? SIZE_MAX : o->len + n;
}

static void out_str(out_sink *o, const char *s) { out_put(o, s, strlen(s)); }

static void out_spaces(out_sink *o, int64_t n) {
    static const char spaces[] = "                                                                ";
    while (n > 0) {
        size_t k = n < (int64_t)(sizeof(spaces) - 1) ? (size_t)n : sizeof(spaces) - 1;
        out_put(o, spaces, k);
        n -= (int64_t)k;
    }
}

static void out_chars(out_sink *o, char c, int64_t n) {
    for (int64_t i = 0; i < n; i++) out_put(o, &c, 1);
}

// ---- tensor view ------------------------------------------------------------------------------

typedef struct tensor_view {
    const float *data;
    int ndim;
    const int64_t *shape;
    int64_t stride[ATTN_PRINT_MAX_NDIM];
    int summarize; // numel > threshold: show only edgeitems at each end of every long dimension
} tensor_view;

// Number of entries shown along a dimension of extent n (the "..." not counted).
static int64_t shown_count(const tensor_view *t, int64_t n) {
    return (t->summarize && n > 2 * PRINT_EDGEITEMS) ? 2 * PRINT_EDGEITEMS : n;
}

// Index of the k-th shown entry along a dimension of extent n.
static int64_t shown_index(const tensor_view *t, int64_t n, int64_t k) {
    if (t->summarize && n > 2 * PRINT_EDGEITEMS && k >= PRINT_EDGEITEMS) return n - 2 * PRINT_EDGEITEMS + k;
    return k;
}

// ---- the formatter (torch._tensor_str._Formatter) ---------------------------------------------

typedef struct formatter {
    int int_mode;
    int sci_mode;
    int max_width;
} formatter;

typedef struct fmt_stats {
    int any;       // a nonzero finite value was seen
    int int_mode;  // every nonzero finite value is an integer
    double min_abs; // over nonzero finite values
    double max_abs;
} fmt_stats;

// Writes the unpadded text of one value into tmp (at least 64 bytes) and returns its length.
static int format_value(const formatter *fm, float x, char *tmp, size_t tmpsz) {
    if (isnan(x)) return snprintf(tmp, tmpsz, "nan");
    if (isinf(x)) return snprintf(tmp, tmpsz, x > 0 ? "inf" : "-inf");
    if (fm->sci_mode) return snprintf(tmp, tmpsz, "%.*e", PRINT_PRECISION, (double)x);
    if (fm->int_mode) return snprintf(tmp, tmpsz, "%.0f.", (double)x);
    return snprintf(tmp, tmpsz, "%.*f", PRINT_PRECISION, (double)x);
}

// Visits the shown elements: pass 0 gathers the statistics, pass 1 the widest text.
static void scan_values(const tensor_view *t, int d, int64_t off, int pass, fmt_stats *st, formatter *fm) {
    if (d == t->ndim) {
        float x = t->data[off];
        if (!isfinite(x) || x == 0.0f) return;
        if (pass == 0) {
            double a = fabs((double)x);
            if (!st->any || a < st->min_abs) st->min_abs = a;
            if (!st->any || a > st->max_abs) st->max_abs = a;
            st->any = 1;
            if (x != ceilf(x)) st->int_mode = 0;
        } else {
            char tmp[64];
            int len = format_value(fm, x, tmp, sizeof(tmp));
            if (len > fm->max_width) fm->max_width = len;
        }
        return;
    }
    int64_t n = t->shape[d], count = shown_count(t, n);
    for (int64_t k = 0; k < count; k++) scan_values(t, d + 1, off + shown_index(t, n, k) * t->stride[d], pass, st, fm);
}

static formatter make_formatter(const tensor_view *t) {
    formatter fm = {1, 0, 1};
    fmt_stats st = {0, 1, 0.0, 0.0};
    scan_values(t, 0, 0, 0, &st, &fm);
    if (!st.any) return fm; // no nonzero finite value: integer style, width 1
    double ratio = st.max_abs / st.min_abs;
    fm.int_mode = st.int_mode;
    if (fm.int_mode)
        fm.sci_mode = ratio > 1000.0 || st.max_abs > 1.0e8;
    else
        fm.sci_mode = ratio > 1000.0 || st.max_abs > 1.0e8 || st.min_abs < 1.0e-4;
    scan_values(t, 0, 0, 1, &st, &fm);
    return fm;
}

static void put_value(out_sink *o, const formatter *fm, float x) {
    char tmp[64];
    int len = format_value(fm, x, tmp, sizeof(tmp));
    if (len < 0) len = 0;
    if ((size_t)len >= sizeof(tmp)) len = (int)sizeof(tmp) - 1;
    out_spaces(o, fm->max_width - len);
    out_put(o, tmp, (size_t)len);
}

// ---- layout (_vector_str, _tensor_str_with_formatter) -----------------------------------------

static void put_vector(out_sink *o, const tensor_view *t, const formatter *fm, int64_t off, int indent) {
    int64_t n = t->shape[t->ndim - 1];
    int elided = t->summarize && n > 2 * PRINT_EDGEITEMS;
    int64_t count = elided ? 2 * PRINT_EDGEITEMS + 1 : n;
    int64_t element_length = (int64_t)fm->max_width + 2;
    int64_t room = PRINT_LINEWIDTH - indent;
    int64_t per_line = room > 0 ? room / element_length : 0;
    if (per_line < 1) per_line = 1;
    out_put(o, "[", 1);
    for (int64_t k = 0; k < count; k++) {
        if (k > 0) {
            if (k % per_line == 0) {
                out_put(o, ",\n", 2);
                out_spaces(o, indent + 1);
            } else {
                out_put(o, ", ", 2);
            }
        }
        if (elided && k == PRINT_EDGEITEMS) {
            out_put(o, " ...", 4);
        } else {
            int64_t idx = (elided && k > PRINT_EDGEITEMS) ? n - count + k : k;
            put_value(o, fm, t->data[off + idx]);
        }
    }
    out_put(o, "]", 1);
}

static void put_tensor(out_sink *o, const tensor_view *t, const formatter *fm, int d, int64_t off, int indent) {
    int dims_left = t->ndim - d;
    if (dims_left == 0) {
        put_value(o, fm, t->data[off]);
        return;
    }
    if (dims_left == 1) {
        put_vector(o, t, fm, off, indent);
        return;
    }
    int64_t n = t->shape[d];
    int elided = t->summarize && n > 2 * PRINT_EDGEITEMS;
    int64_t count = elided ? 2 * PRINT_EDGEITEMS + 1 : n;
    out_put(o, "[", 1);
    for (int64_t k = 0; k < count; k++) {
        if (k > 0) {
            out_put(o, ",", 1);
            out_chars(o, '\n', dims_left - 1);
            out_spaces(o, indent + 1);
        }
        if (elided && k == PRINT_EDGEITEMS) {
            out_put(o, "...", 3);
        } else {
            int64_t idx = (elided && k > PRINT_EDGEITEMS) ? n - count + k : k;
            put_tensor(o, t, fm, d + 1, off + idx * t->stride[d], indent + 1);
        }
    }
    out_put(o, "]", 1);
}

// ---- suffixes (_add_suffixes) -----------------------------------------------------------------

static size_t count_chars(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

// `last` is _add_suffixes's last_line_len; returns its new value.
static size_t put_suffix(out_sink *o, size_t last, const char *s, size_t n) {
    size_t slen = count_chars(s, n);
    if (last + slen + 2 > PRINT_LINEWIDTH) {
        out_put(o, ",\n", 2);
        out_spaces(o, PRINT_INDENT);
        out_put(o, s, n);
        return PRINT_INDENT + slen;
    }
    out_put(o, ", ", 2);
    out_put(o, s, n);
    return last + slen + 2;
}

// ---- entry points -----------------------------------------------------------------------------

// Checks the arguments and fills the view; returns the element count, or -1 when invalid.
static int64_t make_view(tensor_view *t, const float *data, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > ATTN_PRINT_MAX_NDIM) return -1;
    if (ndim > 0 && !shape) return -1;
    int64_t numel = 1;
    int zero = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return -1;
        if (shape[d] == 0) zero = 1;
    }
    if (zero) {
        numel = 0;
    } else {
        const int64_t limit = (int64_t)(PTRDIFF_MAX / (ptrdiff_t)sizeof(float));
        for (int d = ndim - 1; d >= 0; d--) {
            t->stride[d] = numel;
            if (numel > limit / shape[d]) return -1;
            numel *= shape[d];
        }
        if (!data) return -1;
    }
    t->data = data;
    t->ndim = ndim;
    t->shape = shape;
    t->summarize = numel > PRINT_THRESHOLD;
    return numel;
}

static void format_into(out_sink *o, const tensor_view *t, int64_t numel, const char *suffix, int parameter) {
    if (parameter) out_str(o, "Parameter containing:\n");
    out_str(o, "tensor(");
    size_t last;
    if (numel == 0) {
        out_put(o, "[]", 2);
        last = o->col + 2;
        if (t->ndim != 1) {
            // str(tuple(shape)): "(2, 0, 3)"; ndim is at least 2 here.
            char size[32 + ATTN_PRINT_MAX_NDIM * 24];
            size_t n = (size_t)snprintf(size, sizeof(size), "size=(");
            for (int d = 0; d < t->ndim; d++)
                n += (size_t)snprintf(size + n, sizeof(size) - n, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
            n += (size_t)snprintf(size + n, sizeof(size) - n, ")");
            last = put_suffix(o, last, size, n);
        }
    } else {
        formatter fm = make_formatter(t);
        put_tensor(o, t, &fm, 0, 0, PRINT_INDENT);
        last = o->col + 2;
    }
    if (parameter) last = put_suffix(o, last, "requires_grad=True", strlen("requires_grad=True"));
    if (suffix) {
        const char *p = suffix;
        while (*p) {
            const char *e = strchr(p, '\n');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            if (n > 0) last = put_suffix(o, last, p, n);
            p += n;
            if (*p == '\n') p++;
        }
    }
    out_put(o, ")", 1);
}

static size_t format_buf(char *buf, size_t cap, const float *data, int ndim, const int64_t *shape,
                         const char *suffix, int parameter) {
    out_sink o = {buf, cap, 0, NULL, 0, 0};
    tensor_view t;
    int64_t numel = make_view(&t, data, ndim, shape);
    if (numel >= 0) format_into(&o, &t, numel, suffix, parameter);
    if (buf && cap > 0) buf[o.len < cap ? o.len : cap - 1] = '\0';
    return o.len;
}

static int print_file(FILE *f, const float *data, int ndim, const int64_t *shape, const char *suffix,
                      int parameter) {
    tensor_view t;
    int64_t numel = make_view(&t, data, ndim, shape);
    if (!f || numel < 0) return -1;
    out_sink o = {NULL, 0, 0, f, 0, 0};
    format_into(&o, &t, numel, suffix, parameter);
    out_put(&o, "\n", 1);
    return o.err ? -1 : 0;
}

size_t attn_format_tensor(char *buf, size_t cap, const float *data, int ndim, const int64_t *shape,
                          const char *suffix) {
    return format_buf(buf, cap, data, ndim, shape, suffix, 0);
}

size_t attn_format_parameter(char *buf, size_t cap, const float *data, int ndim, const int64_t *shape,
                             const char *suffix) {
    return format_buf(buf, cap, data, ndim, shape, suffix, 1);
}

int attn_print_tensor(FILE *f, const float *data, int ndim, const int64_t *shape, const char *suffix) {
    return print_file(f, data, ndim, shape, suffix, 0);
}

int attn_print_parameter(FILE *f, const float *data, int ndim, const int64_t *shape, const char *suffix) {
    return print_file(f, data, ndim, shape, suffix, 1);
}

// json.c - the strict JSON parser declared in json.h.
//
// The parser runs the same recursive-descent code three times over the input:
//  1. COUNT: validates everything (all errors are found here) and counts values, containers,
//     decoded string bytes and the largest object;
//  2. SHAPE: records each container's child count (containers numbered in input order);
//  3. BUILD: fills one block allocated after pass 1, giving every container its children as one
//     contiguous array (so indexing an array is O(1)).
// Then duplicate keys are looked for by sorting each object's members (no allocation). The only
// allocation is the block; its size is linear in the input size (see json.h).
// It does not do: streaming, incremental parsing, or any output beyond escaping one string.
#include "io/json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/file.h"
#include "io/sort.h"

#define JSON_DEFAULT_DEPTH 128
#define JSON_MAX_DEPTH 1024
// Significant digits kept when converting a decimal number; more than the 767 a double can need
// to be rounded correctly, the rest folded into one sticky digit.
#define JSON_MAX_SIG_DIGITS 780

enum { PASS_COUNT, PASS_SHAPE, PASS_BUILD };

typedef struct jparser {
    attn_ctx *ctx;
    const unsigned char *s;
    size_t n, pos;
    const char *what;
    int max_depth;
    size_t max_nodes;
    bool allow_nonfinite;
    int pass;
    // totals of PASS_COUNT
    size_t n_nodes, n_containers, n_str, max_members;
    // PASS_SHAPE and PASS_BUILD
    uint32_t *counts;      // (n_containers) child counts, in opening order
    size_t next_container;
    attn__json *nodes;     // (n_nodes) the tree, root first
    size_t next_node;
    char *strs;            // (n_str) decoded strings and keys, each NUL-terminated
    size_t next_str;
} jparser;

static attn_status jfail(jparser *p, size_t at, const char *fmt, ...) ATTN_PRINTF(3, 4);
static attn_status jfail(jparser *p, size_t at, const char *fmt, ...) {
    char msg[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return attn__fail(p->ctx, ATTN_ERR_BAD_FILE, "%s at byte %zu: %s", p->what, at, msg);
}

// "'x'", "byte 0x80" or "end of input", for messages.
static const char *describe_at(const jparser *p, size_t at, char buf[16]) {
    if (at >= p->n) return "end of input";
    unsigned c = p->s[at];
    if (c > 0x20 && c < 0x7f)
        snprintf(buf, 16, "'%c'", (char)c);
    else
        snprintf(buf, 16, "byte 0x%02x", c);
    return buf;
}

static void skip_ws(jparser *p) {
    while (p->pos < p->n) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

// Length of the valid UTF-8 sequence at s (avail bytes available), or 0 if it is invalid.
static size_t utf8_seq_len(const unsigned char *s, size_t avail) {
    unsigned c0 = s[0];
    if (c0 < 0x80) return 1;
    if (c0 < 0xC2 || c0 > 0xF4) return 0; // continuation byte, overlong 2-byte form, > U+10FFFF
    size_t len = c0 < 0xE0 ? 2 : c0 < 0xF0 ? 3 : 4;
    if (avail < len) return 0;
    unsigned lo = 0x80, hi = 0xBF; // allowed range of the second byte
    if (c0 == 0xE0) lo = 0xA0;      // overlong 3-byte form
    if (c0 == 0xED) hi = 0x9F;      // UTF-16 surrogates
    if (c0 == 0xF0) lo = 0x90;      // overlong 4-byte form
    if (c0 == 0xF4) hi = 0x8F;      // > U+10FFFF
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return len;
}

bool attn__json_utf8_valid(const char *s, size_t len) {
    if (s == NULL) return len == 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_seq_len(u + i, len - i);
        if (k == 0) return false;
        i += k;
    }
    return true;
}

static int hex_value(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Reads the 4 hex digits of a \u escape starting at s[at]; -1 if there are not 4 hex digits.
static long read_hex4(const jparser *p, size_t at) {
    if (at > p->n || p->n - at < 4) return -1;
    long v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_value(p->s[at + i]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

// Appends code point cp as UTF-8 at dst + *o (when dst is not NULL) and advances *o.
static void put_utf8(char *dst, size_t *o, unsigned long cp) {
    unsigned char b[4];
    size_t k;
    if (cp < 0x80) {
        b[0] = (unsigned char)cp;
        k = 1;
    } else if (cp < 0x800) {
        b[0] = (unsigned char)(0xC0 | (cp >> 6));
        b[1] = (unsigned char)(0x80 | (cp & 0x3F));
        k = 2;
    } else if (cp < 0x10000) {
        b[0] = (unsigned char)(0xE0 | (cp >> 12));
        b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (unsigned char)(0x80 | (cp & 0x3F));
        k = 3;
    } else {
        b[0] = (unsigned char)(0xF0 | (cp >> 18));
        b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (unsigned char)(0x80 | (cp & 0x3F));
        k = 4;
    }
    if (dst != NULL) memcpy(dst + *o, b, k);
    *o += k;
}

// Scans the string starting at the '"' at p->pos; writes the decoded bytes to dst when not NULL.
// The decoded length never exceeds the source length.
static attn_status scan_string(jparser *p, char *dst, uint32_t *len) {
    const unsigned char *s = p->s;
    size_t start = p->pos++;
    size_t o = 0;
    for (;;) {
        if (p->pos >= p->n) return jfail(p, start, "unterminated string");
        unsigned c = s[p->pos];
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20) return jfail(p, p->pos, "raw control character 0x%02x in a string (it must be escaped)", c);
        if (c == '\\') {
            size_t at = p->pos;
            if (at + 1 >= p->n) return jfail(p, start, "unterminated string");
            unsigned e = s[at + 1];
            char one;
            switch (e) {
            case '"': one = '"'; break;
            case '\\': one = '\\'; break;
            case '/': one = '/'; break;
            case 'b': one = '\b'; break;
            case 'f': one = '\f'; break;
            case 'n': one = '\n'; break;
            case 'r': one = '\r'; break;
            case 't': one = '\t'; break;
            case 'u': {
                long cp = read_hex4(p, at + 2);
                if (cp < 0) return jfail(p, at, "invalid \\u escape: expected 4 hex digits");
                p->pos = at + 6;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    long lo = -1;
                    if (p->pos + 1 < p->n && s[p->pos] == '\\' && s[p->pos + 1] == 'u') lo = read_hex4(p, p->pos + 2);
                    if (lo < 0xDC00 || lo > 0xDFFF)
                        return jfail(p, at, "high surrogate \\u%04lX is not followed by a low surrogate", cp);
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    p->pos += 6;
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    return jfail(p, at, "low surrogate \\u%04lX without a high surrogate before it", cp);
                }
                put_utf8(dst, &o, (unsigned long)cp);
                continue;
            }
            default: {
                char b[16];
                return jfail(p, at, "invalid escape: backslash followed by %s", describe_at(p, at + 1, b));
            }
            }
            if (dst != NULL) dst[o] = one;
            o++;
            p->pos = at + 2;
        } else if (c < 0x80) {
            if (dst != NULL) dst[o] = (char)c;
            o++;
            p->pos++;
        } else {
            size_t k = utf8_seq_len(s + p->pos, p->n - p->pos);
            if (k == 0) return jfail(p, p->pos, "invalid UTF-8 in a string");
            if (dst != NULL) memcpy(dst + o, s + p->pos, k);
            o += k;
            p->pos += k;
        }
    }
    *len = (uint32_t)o; // o < input size < 4 GiB
    return ATTN_OK;
}

// Correctly rounded value of the decimal number int_digits.frac_digits * 10^e10 (locale-free:
// strtod only ever sees "DIGITSe-EXP", without a decimal point).
static double decimal_to_double(const unsigned char *s, size_t ib, size_t ie, size_t fb, size_t fe, long long e10) {
    char buf[JSON_MAX_SIG_DIGITS + 32];
    size_t nd = 0;
    long long ex = 0;
    bool tail = false;
    for (size_t i = ib; i < ie; i++) {
        char c = (char)s[i];
        if (nd == 0 && c == '0') continue;
        if (nd < JSON_MAX_SIG_DIGITS) {
            buf[nd++] = c;
        } else {
            ex++;
            tail |= c != '0';
        }
    }
    for (size_t i = fb; i < fe; i++) {
        char c = (char)s[i];
        if (nd == 0 && c == '0') {
            ex--;
        } else if (nd < JSON_MAX_SIG_DIGITS) {
            buf[nd++] = c;
            ex--;
        } else {
            tail |= c != '0';
        }
    }
    if (nd == 0) return 0.0;
    if (tail) { // a nonzero digit below the kept ones: enough to round correctly
        buf[nd++] = '1';
        ex--;
    }
    ex += e10;
    if (ex + (long long)nd > 400) return INFINITY;
    if (ex + (long long)nd < -400) return 0.0;
    snprintf(buf + nd, sizeof buf - nd, "e%lld", ex);
    return strtod(buf, NULL);
}

static bool match_word(const jparser *p, size_t at, const char *w) {
    size_t k = strlen(w);
    return p->n - at >= k && memcmp(p->s + at, w, k) == 0;
}

static attn_status parse_number(jparser *p, attn__json *v) {
    const unsigned char *s = p->s;
    size_t n = p->n, start = p->pos, i = start;
    bool neg = false;
    v->type = ATTN__JSON_NUMBER;
    if (s[i] == '-') {
        neg = true;
        i++;
    }
    if (p->allow_nonfinite && i < n && (s[i] == 'I' || (s[i] == 'N' && !neg))) {
        if (match_word(p, i, "Infinity")) {
            v->u.num = neg ? -INFINITY : INFINITY;
            p->pos = i + 8;
            return ATTN_OK;
        }
        if (match_word(p, i, "NaN")) {
            v->u.num = NAN;
            p->pos = i + 3;
            return ATTN_OK;
        }
        return jfail(p, start, "invalid literal");
    }
    if (i >= n || !is_digit(s[i])) {
        char b[16];
        return jfail(p, i, "expected a digit after '-', found %s", describe_at(p, i, b));
    }
    size_t ib = i;
    if (s[i] == '0') {
        i++;
        if (i < n && is_digit(s[i])) return jfail(p, start, "numbers must not have leading zeros");
    } else {
        while (i < n && is_digit(s[i])) i++;
    }
    size_t ie = i, fb = i, fe = i;
    bool has_frac = false, has_exp = false;
    if (i < n && s[i] == '.') {
        has_frac = true;
        i++;
        fb = i;
        if (i >= n || !is_digit(s[i])) return jfail(p, i, "expected a digit after the decimal point");
        while (i < n && is_digit(s[i])) i++;
        fe = i;
    }
    long long e10 = 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        has_exp = true;
        bool eneg = false;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) eneg = s[i++] == '-';
        if (i >= n || !is_digit(s[i])) return jfail(p, i, "expected a digit in the exponent");
        for (; i < n && is_digit(s[i]); i++)
            if (e10 < 1000000000) e10 = e10 * 10 + (s[i] - '0'); // saturates: the result is 0 or inf anyway
        if (eneg) e10 = -e10;
    }
    p->pos = i;
    if (p->pass == PASS_SHAPE) return ATTN_OK; // checked in PASS_COUNT
    if (!has_frac && !has_exp) {
        int64_t acc = 0;
        bool ok = true;
        for (size_t k = ib; k < ie && ok; k++) {
            int d = s[k] - '0';
            ok = !__builtin_mul_overflow(acc, 10, &acc) &&
                 !(neg ? __builtin_sub_overflow(acc, d, &acc) : __builtin_add_overflow(acc, d, &acc));
        }
        if (ok) {
            v->flags |= ATTN__JSON_F_INT;
            v->u.integer = acc;
            return ATTN_OK;
        }
    }
    double d = decimal_to_double(s, ib, ie, fb, fe, e10);
    if (isinf(d)) return jfail(p, start, "number out of the range of a double");
    v->u.num = neg ? -d : d;
    return ATTN_OK;
}

static attn_status parse_value(jparser *p, attn__json *v, int depth);

// Common end of an array or object: record the child count for the pass.
static void close_container(jparser *p, attn__json *v, attn__json_type type, size_t ci, attn__json *items,
                            uint32_t count) {
    v->type = (uint8_t)type;
    v->len = count;
    if (p->pass == PASS_COUNT) {
        p->n_containers++;
        if (type == ATTN__JSON_OBJECT && count > p->max_members) p->max_members = count;
    } else if (p->pass == PASS_SHAPE) {
        p->counts[ci] = count;
    } else {
        v->u.items = items;
    }
}

// Start of an array or object: depth check, container number and (BUILD) its children's slots.
static attn_status open_container(jparser *p, int depth, size_t *ci, attn__json **items) {
    if (depth >= p->max_depth) return jfail(p, p->pos, "arrays/objects nested deeper than %d levels", p->max_depth);
    *ci = p->next_container++;
    *items = NULL;
    if (p->pass == PASS_BUILD) {
        *items = p->nodes + p->next_node;
        p->next_node += p->counts[*ci];
    }
    p->pos++;
    skip_ws(p);
    return ATTN_OK;
}

static attn_status parse_array(jparser *p, attn__json *v, int depth) {
    size_t start = p->pos, ci = 0;
    attn__json *items = NULL;
    ATTN_RETURN_IF_ERR(open_container(p, depth, &ci, &items));
    uint32_t count = 0;
    if (p->pos < p->n && p->s[p->pos] == ']') {
        p->pos++;
    } else {
        for (;;) {
            attn__json scratch;
            ATTN_RETURN_IF_ERR(parse_value(p, items != NULL ? &items[count] : &scratch, depth + 1));
            count++;
            skip_ws(p);
            char b[16];
            if (p->pos >= p->n) return jfail(p, p->pos, "end of input inside the array opened at byte %zu", start);
            if (p->s[p->pos] == ']') {
                p->pos++;
                break;
            }
            if (p->s[p->pos] != ',')
                return jfail(p, p->pos, "expected ',' or ']' after an array element, found %s",
                             describe_at(p, p->pos, b));
            p->pos++;
            skip_ws(p);
        }
    }
    close_container(p, v, ATTN__JSON_ARRAY, ci, items, count);
    return ATTN_OK;
}

static attn_status parse_object(jparser *p, attn__json *v, int depth) {
    size_t start = p->pos, ci = 0;
    attn__json *items = NULL;
    ATTN_RETURN_IF_ERR(open_container(p, depth, &ci, &items));
    uint32_t count = 0;
    if (p->pos < p->n && p->s[p->pos] == '}') {
        p->pos++;
    } else {
        for (;;) {
            char b[16];
            if (p->pos >= p->n) return jfail(p, p->pos, "end of input inside the object opened at byte %zu", start);
            if (p->s[p->pos] != '"')
                return jfail(p, p->pos, "expected a string key, found %s", describe_at(p, p->pos, b));
            char *key = p->pass == PASS_BUILD ? p->strs + p->next_str : NULL;
            uint32_t key_len;
            ATTN_RETURN_IF_ERR(scan_string(p, key, &key_len));
            if (p->pass == PASS_COUNT) p->n_str += (size_t)key_len + 1;
            if (key != NULL) {
                key[key_len] = '\0';
                p->next_str += (size_t)key_len + 1;
            }
            skip_ws(p);
            if (p->pos >= p->n || p->s[p->pos] != ':')
                return jfail(p, p->pos, "expected ':' after an object key, found %s", describe_at(p, p->pos, b));
            p->pos++;
            skip_ws(p);
            attn__json scratch;
            attn__json *child = items != NULL ? &items[count] : &scratch;
            ATTN_RETURN_IF_ERR(parse_value(p, child, depth + 1));
            child->key = key;
            child->key_len = key_len;
            count++;
            skip_ws(p);
            if (p->pos >= p->n) return jfail(p, p->pos, "end of input inside the object opened at byte %zu", start);
            if (p->s[p->pos] == '}') {
                p->pos++;
                break;
            }
            if (p->s[p->pos] != ',')
                return jfail(p, p->pos, "expected ',' or '}' after an object member, found %s",
                             describe_at(p, p->pos, b));
            p->pos++;
            skip_ws(p);
        }
    }
    close_container(p, v, ATTN__JSON_OBJECT, ci, items, count);
    return ATTN_OK;
}

static attn_status parse_value(jparser *p, attn__json *v, int depth) {
    memset(v, 0, sizeof *v);
    v->offset = (uint32_t)p->pos;
    if (p->pos >= p->n) return jfail(p, p->pos, "unexpected end of input, expected a value");
    if (p->pass == PASS_COUNT && ++p->n_nodes > p->max_nodes)
        return jfail(p, p->pos, "more than %zu values", p->max_nodes);
    unsigned char c = p->s[p->pos];
    switch (c) {
    case '{': return parse_object(p, v, depth);
    case '[': return parse_array(p, v, depth);
    case '"': {
        char *dst = p->pass == PASS_BUILD ? p->strs + p->next_str : NULL;
        uint32_t len;
        ATTN_RETURN_IF_ERR(scan_string(p, dst, &len));
        if (p->pass == PASS_COUNT) p->n_str += (size_t)len + 1;
        if (dst != NULL) {
            dst[len] = '\0';
            p->next_str += (size_t)len + 1;
        }
        v->type = ATTN__JSON_STRING;
        v->len = len;
        v->u.str = dst;
        return ATTN_OK;
    }
    case 't':
    case 'f':
    case 'n': {
        const char *w = c == 't' ? "true" : c == 'f' ? "false" : "null";
        if (!match_word(p, p->pos, w)) return jfail(p, p->pos, "invalid literal (expected %s)", w);
        p->pos += strlen(w);
        v->type = c == 'n' ? ATTN__JSON_NULL : ATTN__JSON_BOOL;
        v->flags = c == 't' ? ATTN__JSON_F_TRUE : 0;
        return ATTN_OK;
    }
    default:
        if (c == '-' || is_digit(c) || (p->allow_nonfinite && (c == 'N' || c == 'I'))) return parse_number(p, v);
        char b[16];
        return jfail(p, p->pos, "unexpected %s, expected a value", describe_at(p, p->pos, b));
    }
}

// One pass over the whole input.
static attn_status run_pass(jparser *p, int pass, attn__json *root) {
    p->pass = pass;
    p->pos = 0;
    p->next_container = 0;
    p->next_node = 1;
    p->next_str = 0;
    skip_ws(p);
    attn__json scratch;
    ATTN_RETURN_IF_ERR(parse_value(p, root != NULL ? root : &scratch, 0));
    skip_ws(p);
    char b[16];
    if (p->pos < p->n) return jfail(p, p->pos, "unexpected %s after the JSON value", describe_at(p, p->pos, b));
    return ATTN_OK;
}

static int member_cmp(const void *a, const void *b, void *user) {
    (void)user;
    const attn__json *x = a, *y = b;
    size_t k = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = k > 0 ? memcmp(x->key, y->key, k) : 0;
    if (c != 0) return c;
    if (x->key_len != y->key_len) return x->key_len < y->key_len ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

// Copies up to 40 bytes of s, replacing non-printable bytes with '?', for messages.
static void printable(char out[48], const char *s, size_t len) {
    size_t k = len < 40 ? len : 40;
    for (size_t i = 0; i < k; i++) out[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    if (len > k) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = '\0';
}

static attn_status check_duplicate_keys(jparser *p, void **scratch) {
    for (size_t i = 0; i < p->n_nodes; i++) {
        const attn__json *o = &p->nodes[i];
        if (o->type != ATTN__JSON_OBJECT || o->len < 2) continue;
        attn__json *members = p->nodes + (o->u.items - p->nodes);
        for (uint32_t k = 0; k < o->len; k++) scratch[k] = &members[k];
        attn__sort_ptrs(scratch, o->len, member_cmp, NULL);
        for (uint32_t k = 1; k < o->len; k++) {
            const attn__json *a = scratch[k - 1], *b = scratch[k];
            if (a->key_len == b->key_len && memcmp(a->key, b->key, a->key_len) == 0) {
                char name[48];
                printable(name, b->key, b->key_len);
                return jfail(p, b->offset, "duplicate key \"%s\" in the object at byte %u", name, (unsigned)o->offset);
            }
        }
    }
    return ATTN_OK;
}

attn_status attn__json_parse(attn_ctx *ctx, const char *text, size_t len, const attn__json_opts *opts,
                             attn__json_doc *doc) {
    if (doc == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn__json_parse: doc is NULL");
    memset(doc, 0, sizeof *doc);
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (text == NULL && len > 0) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn__json_parse: text is NULL");
    jparser p;
    memset(&p, 0, sizeof p);
    p.ctx = ctx;
    p.s = (const unsigned char *)(text != NULL ? text : "");
    p.n = len;
    p.what = opts != NULL && opts->what != NULL ? opts->what : "JSON";
    p.max_depth = opts != NULL && opts->max_depth > 0 ? opts->max_depth : JSON_DEFAULT_DEPTH;
    if (p.max_depth > JSON_MAX_DEPTH) p.max_depth = JSON_MAX_DEPTH;
    p.max_nodes = opts != NULL && opts->max_nodes > 0 ? opts->max_nodes : SIZE_MAX;
    p.allow_nonfinite = opts != NULL && opts->allow_nonfinite;
    if (len >= UINT32_MAX)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "%s: %zu bytes is too large (the limit is 4 GiB)", p.what, len);

    ATTN_RETURN_IF_ERR(run_pass(&p, PASS_COUNT, NULL));

    // One block: nodes | member pointers (duplicate check) | child counts | strings.
    // Every term is bounded by the input size: n_nodes <= len, n_str <= 2 * len.
    size_t nodes_bytes, ptrs_bytes, counts_bytes, total;
    if (__builtin_mul_overflow(p.n_nodes, sizeof(attn__json), &nodes_bytes) ||
        __builtin_mul_overflow(p.max_members, sizeof(void *), &ptrs_bytes) ||
        __builtin_mul_overflow(p.n_containers, sizeof(uint32_t), &counts_bytes) ||
        __builtin_add_overflow(nodes_bytes, ptrs_bytes, &total) ||
        __builtin_add_overflow(total, counts_bytes, &total) || __builtin_add_overflow(total, p.n_str, &total))
        return attn__fail(ctx, ATTN_ERR_OVERFLOW, "%s: the parse tree's size overflows", p.what);
    void *mem = NULL;
    ATTN_RETURN_IF_ERR(attn__alloc(ctx, total, &mem));
    char *base = mem;
    p.nodes = (attn__json *)base;
    void **scratch = (void **)(base + nodes_bytes);
    p.counts = (uint32_t *)(base + nodes_bytes + ptrs_bytes);
    p.strs = base + nodes_bytes + ptrs_bytes + counts_bytes;

    attn_status st = run_pass(&p, PASS_SHAPE, NULL);
    if (st == ATTN_OK) st = run_pass(&p, PASS_BUILD, &p.nodes[0]);
    if (st == ATTN_OK) st = check_duplicate_keys(&p, scratch);
    if (st != ATTN_OK) {
        attn__free(ctx, mem);
        return st;
    }
    doc->root = p.nodes;
    doc->n_nodes = p.n_nodes;
    doc->bytes = total;
    doc->mem_ = mem;
    return ATTN_OK;
}

attn_status attn__json_parse_file(attn_ctx *ctx, const char *path, size_t max_size, const attn__json_opts *opts,
                                  attn__json_doc *doc) {
    if (doc == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn__json_parse_file: doc is NULL");
    memset(doc, 0, sizeof *doc);
    void *text = NULL;
    size_t len = 0;
    ATTN_RETURN_IF_ERR(attn__file_read_all(ctx, path, max_size, &text, &len));
    attn__json_opts o;
    if (opts != NULL)
        o = *opts;
    else
        memset(&o, 0, sizeof o);
    if (o.what == NULL) o.what = attn__path_tail(path);
    attn_status st = attn__json_parse(ctx, text, len, &o, doc);
    attn__free(ctx, text);
    return st;
}

void attn__json_free(attn_ctx *ctx, attn__json_doc *doc) {
    if (doc == NULL) return;
    if (ctx != NULL) attn__free(ctx, doc->mem_);
    memset(doc, 0, sizeof *doc);
}

// ---- accessors -------------------------------------------------------------------------------

attn__json_type attn__json_kind(const attn__json *v) { return v != NULL ? (attn__json_type)v->type : ATTN__JSON_NONE; }

const char *attn__json_kind_name(attn__json_type type) {
    switch (type) {
    case ATTN__JSON_NONE: return "none";
    case ATTN__JSON_NULL: return "null";
    case ATTN__JSON_BOOL: return "boolean";
    case ATTN__JSON_NUMBER: return "number";
    case ATTN__JSON_STRING: return "string";
    case ATTN__JSON_ARRAY: return "array";
    case ATTN__JSON_OBJECT: return "object";
    }
    return "?";
}

size_t attn__json_offset(const attn__json *v) { return v != NULL ? v->offset : 0; }

size_t attn__json_len(const attn__json *v) {
    if (v == NULL || (v->type != ATTN__JSON_ARRAY && v->type != ATTN__JSON_OBJECT)) return 0;
    return v->len;
}

const attn__json *attn__json_at(const attn__json *v, size_t i) {
    if (i >= attn__json_len(v)) return NULL;
    return &v->u.items[i];
}

const attn__json *attn__json_getn(const attn__json *obj, const char *key, size_t key_len) {
    if (obj == NULL || obj->type != ATTN__JSON_OBJECT || (key == NULL && key_len > 0)) return NULL;
    for (uint32_t i = 0; i < obj->len; i++) {
        const attn__json *m = &obj->u.items[i];
        if (m->key_len == key_len && (key_len == 0 || memcmp(m->key, key, key_len) == 0)) return m;
    }
    return NULL;
}

const attn__json *attn__json_get(const attn__json *obj, const char *key) {
    if (key == NULL) return NULL;
    return attn__json_getn(obj, key, strlen(key));
}

const char *attn__json_key(const attn__json *v, size_t *len) {
    if (v == NULL || v->key == NULL) return NULL;
    if (len != NULL) *len = v->key_len;
    return v->key;
}

bool attn__json_is_null(const attn__json *v) { return v != NULL && v->type == ATTN__JSON_NULL; }

bool attn__json_bool(const attn__json *v, bool *out) {
    if (v == NULL || v->type != ATTN__JSON_BOOL) return false;
    if (out != NULL) *out = (v->flags & ATTN__JSON_F_TRUE) != 0;
    return true;
}

bool attn__json_number(const attn__json *v, double *out) {
    if (v == NULL || v->type != ATTN__JSON_NUMBER) return false;
    if (out != NULL) *out = (v->flags & ATTN__JSON_F_INT) ? (double)v->u.integer : v->u.num;
    return true;
}

bool attn__json_is_int(const attn__json *v) {
    return v != NULL && v->type == ATTN__JSON_NUMBER && (v->flags & ATTN__JSON_F_INT) != 0;
}

bool attn__json_int64(const attn__json *v, int64_t *out) {
    if (!attn__json_is_int(v)) return false;
    if (out != NULL) *out = v->u.integer;
    return true;
}

const char *attn__json_string(const attn__json *v, size_t *len) {
    if (v == NULL || v->type != ATTN__JSON_STRING) return NULL;
    if (len != NULL) *len = v->len;
    return v->u.str;
}

// ---- numeric arrays --------------------------------------------------------------------------

// true and *bits when v is a string "0x" + 8 hex digits.
static bool f32_bits_leaf(const attn__json *v, uint32_t *bits) {
    if (v->type != ATTN__JSON_STRING || v->len != 10 || v->u.str[0] != '0' || v->u.str[1] != 'x') return false;
    uint32_t b = 0;
    for (int i = 2; i < 10; i++) {
        int h = hex_value((unsigned char)v->u.str[i]);
        if (h < 0) return false;
        b = b << 4 | (uint32_t)h;
    }
    *bits = b;
    return true;
}

static attn_status shape_check(attn_ctx *ctx, const attn__json *v, const char *what, int depth, int ndim,
                               const int64_t *shape) {
    if (depth == ndim) {
        uint32_t bits;
        if (v->type == ATTN__JSON_NUMBER || v->type == ATTN__JSON_BOOL || f32_bits_leaf(v, &bits)) return ATTN_OK;
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "%s: expected a number at byte %u (depth %d), found %s", what,
                          (unsigned)v->offset, depth, attn__json_kind_name((attn__json_type)v->type));
    }
    if (v->type != ATTN__JSON_ARRAY)
        return attn__fail(ctx, ATTN_ERR_BAD_FILE, "%s: expected an array at byte %u (depth %d), found %s", what,
                          (unsigned)v->offset, depth, attn__json_kind_name((attn__json_type)v->type));
    if (v->len != shape[depth])
        return attn__fail(ctx, ATTN_ERR_BAD_FILE,
                          "%s: ragged array at byte %u: %u elements at depth %d where the first had %lld", what,
                          (unsigned)v->offset, (unsigned)v->len, depth, (long long)shape[depth]);
    for (uint32_t i = 0; i < v->len; i++)
        ATTN_RETURN_IF_ERR(shape_check(ctx, &v->u.items[i], what, depth + 1, ndim, shape));
    return ATTN_OK;
}

attn_status attn__json_shape(attn_ctx *ctx, const attn__json *v, const char *what, int max_dims, int64_t *shape,
                             int *ndim, int64_t *numel) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (what == NULL) what = "value";
    if (shape == NULL || ndim == NULL || numel == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn__json_shape(%s): NULL output", what);
    if (v == NULL) return attn__fail(ctx, ATTN_ERR_NOT_FOUND, "%s: no such value", what);
    if (max_dims < 0) max_dims = 0;
    if (max_dims > ATTN_MAX_DIMS) max_dims = ATTN_MAX_DIMS;
    int d = 0;
    for (const attn__json *c = v; c->type == ATTN__JSON_ARRAY; c = &c->u.items[0]) {
        if (d >= max_dims)
            return attn__fail(ctx, ATTN_ERR_BAD_FILE, "%s: more than %d dimensions (array at byte %u)", what, max_dims,
                              (unsigned)c->offset);
        shape[d++] = c->len;
        if (c->len == 0) break;
    }
    ATTN_RETURN_IF_ERR(shape_check(ctx, v, what, 0, d, shape));
    int64_t count = 1;
    for (int i = 0; i < d; i++)
        if (!attn__mul_i64(count, shape[i], &count))
            return attn__fail(ctx, ATTN_ERR_OVERFLOW, "%s: the element count overflows", what);
    *ndim = d;
    *numel = count;
    return ATTN_OK;
}

static double leaf_value(const attn__json *v) {
    if (v->type == ATTN__JSON_BOOL) return (v->flags & ATTN__JSON_F_TRUE) ? 1.0 : 0.0;
    return (v->flags & ATTN__JSON_F_INT) ? (double)v->u.integer : v->u.num;
}

// Writes the leaves of a checked value in row-major order.
static void flatten(const attn__json *v, bool f32, void *dst, int64_t *k) {
    if (v->type != ATTN__JSON_ARRAY) {
        uint32_t bits;
        float fx;
        if (f32_bits_leaf(v, &bits)) {
            memcpy(&fx, &bits, sizeof fx);
            if (f32)
                ((float *)dst)[(*k)++] = fx;
            else
                ((double *)dst)[(*k)++] = (double)fx;
            return;
        }
        double x = leaf_value(v);
        if (f32)
            ((float *)dst)[(*k)++] = (float)x;
        else
            ((double *)dst)[(*k)++] = x;
        return;
    }
    for (uint32_t i = 0; i < v->len; i++) flatten(&v->u.items[i], f32, dst, k);
}

static attn_status flatten_checked(attn_ctx *ctx, const attn__json *v, const char *what, bool f32, void *dst,
                                   int64_t n) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (what == NULL) what = "value";
    int64_t shape[ATTN_MAX_DIMS] = {0}, numel = 0;
    int ndim = 0;
    ATTN_RETURN_IF_ERR(attn__json_shape(ctx, v, what, ATTN_MAX_DIMS, shape, &ndim, &numel));
    if (numel != n)
        return attn__fail(ctx, ATTN_ERR_BAD_SHAPE, "%s: has %lld elements, the destination %lld", what,
                          (long long)numel, (long long)n);
    if (dst == NULL && n > 0) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "%s: destination is NULL", what);
    int64_t k = 0;
    if (n > 0) flatten(v, f32, dst, &k);
    return ATTN_OK;
}

attn_status attn__json_flatten_f32(attn_ctx *ctx, const attn__json *v, const char *what, float *dst, int64_t n) {
    return flatten_checked(ctx, v, what, true, dst, n);
}

attn_status attn__json_flatten_f64(attn_ctx *ctx, const attn__json *v, const char *what, double *dst, int64_t n) {
    return flatten_checked(ctx, v, what, false, dst, n);
}

static attn_status to_buffer(attn_ctx *ctx, const attn__json *v, const char *what, bool f32, int64_t *shape,
                             int *ndim, void **data) {
    *data = NULL;
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (what == NULL) what = "value";
    if (shape == NULL || ndim == NULL)
        return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn__json_to_f32/f64(%s): NULL output", what);
    int64_t numel = 0;
    size_t bytes = 0;
    ATTN_RETURN_IF_ERR(attn__json_shape(ctx, v, what, ATTN_MAX_DIMS, shape, ndim, &numel));
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, what, numel, f32 ? sizeof(float) : sizeof(double), &bytes));
    void *buf = NULL;
    ATTN_RETURN_IF_ERR(attn__alloc(ctx, bytes, &buf));
    int64_t k = 0;
    if (numel > 0) flatten(v, f32, buf, &k);
    *data = buf;
    return ATTN_OK;
}

attn_status attn__json_to_f32(attn_ctx *ctx, const attn__json *v, const char *what, int64_t *shape, int *ndim,
                              float **data) {
    if (data == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn__json_to_f32: data is NULL");
    void *buf = NULL;
    attn_status st = to_buffer(ctx, v, what, true, shape, ndim, &buf);
    *data = buf;
    return st;
}

attn_status attn__json_to_f64(attn_ctx *ctx, const attn__json *v, const char *what, int64_t *shape, int *ndim,
                              double **data) {
    if (data == NULL) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "attn__json_to_f64: data is NULL");
    void *buf = NULL;
    attn_status st = to_buffer(ctx, v, what, false, shape, ndim, &buf);
    *data = buf;
    return st;
}

// ---- writing ---------------------------------------------------------------------------------

size_t attn__json_write_string(char *dst, const char *s, size_t len) {
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (dst != NULL) dst[o] = '"';
    o++;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc = 0;
        switch (c) {
        case '"': esc = '"'; break;
        case '\\': esc = '\\'; break;
        case '\b': esc = 'b'; break;
        case '\f': esc = 'f'; break;
        case '\n': esc = 'n'; break;
        case '\r': esc = 'r'; break;
        case '\t': esc = 't'; break;
        default: break;
        }
        if (esc != 0) {
            if (dst != NULL) {
                dst[o] = '\\';
                dst[o + 1] = esc;
            }
            o += 2;
        } else if (c < 0x20) {
            if (dst != NULL) {
                memcpy(dst + o, "\\u00", 4);
                dst[o + 4] = hex[c >> 4];
                dst[o + 5] = hex[c & 15];
            }
            o += 6;
        } else {
            if (dst != NULL) dst[o] = (char)c;
            o++;
        }
    }
    if (dst != NULL) dst[o] = '"';
    return o + 1;
}

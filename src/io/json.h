// json.h - a small, strict JSON (RFC 8259) parser for libattn's file readers and tests.
//
// What it does:
//  - Parses one JSON text (objects, arrays, strings with every escape incl. \uXXXX and surrogate
//    pairs, numbers, true/false/null) into a read-only tree that lives in ONE allocation made
//    through the context's allocator. The input must be valid UTF-8; a BOM, comments, trailing
//    commas, leading zeros, lone surrogates, raw control characters in strings and anything after
//    the value (other than whitespace) are errors.
//  - Rejects duplicate keys inside an object.
//  - Bounds memory by the input: every value costs at least one input byte, so the tree holds at
//    most `len` nodes (sizeof(attn__json) is 32 bytes on 64-bit targets; plus the decoded strings,
//    never longer than their source); opts->max_nodes can lower that bound, opts->max_depth
//    limits nesting (default 128). Inputs of 4 GiB or more are refused.
//  - Reports every error through attn__fail with ATTN_ERR_BAD_FILE (ATTN_ERR_OUT_OF_MEMORY when
//    the allocation fails) and a message "<what> at byte N: <reason>".
// What it does not do: write JSON (except escaping one string, attn__json_write_string), keep
// comments, or accept the NaN/Infinity extensions unless opts->allow_nonfinite is set (Python's
// json.dumps writes them by default).
//
// Numbers: every number is converted to the nearest double (correctly rounded, independent of
// the C locale); numbers whose magnitude overflows a double are errors. A number written as an
// integer (no fraction, no exponent) that fits int64_t is also kept exactly: attn__json_is_int()
// is true and attn__json_int64() returns it, so "2" is an integer while "2.0" and "2e0" are not.
//
// Usage:
//   attn__json_doc doc;
//   attn_status st = attn__json_parse(ctx, text, len, NULL, &doc);   // or attn__json_parse_file
//   if (st != ATTN_OK) return st;
//   const attn__json *a = attn__json_get(doc.root, "a");           // NULL if absent
//   const attn__json *w = attn__json_get(a, "float32");             // accessors accept NULL
//   int64_t shape[ATTN_MAX_DIMS]; int ndim; float *x;
//   st = attn__json_to_f32(ctx, w, "a.float32", shape, &ndim, &x);  // x from attn__alloc
//   ...
//   attn__free(ctx, x);
//   attn__json_free(ctx, &doc);
#ifndef ATTN_IO_JSON_H
#define ATTN_IO_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

typedef enum attn__json_type {
    ATTN__JSON_NONE = 0, // not a value: what the accessors report for a NULL node
    ATTN__JSON_NULL = 1,
    ATTN__JSON_BOOL = 2,
    ATTN__JSON_NUMBER = 3,
    ATTN__JSON_STRING = 4,
    ATTN__JSON_ARRAY = 5,
    ATTN__JSON_OBJECT = 6
} attn__json_type;

// One value. Treat the fields as private and use the accessors below.
typedef struct attn__json attn__json;
struct attn__json {
    uint8_t type;     // attn__json_type
    uint8_t flags;    // ATTN__JSON_F_* below
    uint16_t reserved;
    uint32_t offset;  // byte offset of the value's first character in the input
    uint32_t len;     // string: bytes (without the NUL); array/object: number of children
    uint32_t key_len; // member of an object: bytes of the key
    const char *key;  // member of an object: the key (NUL-terminated); NULL otherwise
    union {
        double num;          // number without ATTN__JSON_F_INT
        int64_t integer;     // number with ATTN__JSON_F_INT
        const char *str;     // string, NUL-terminated (may also contain NULs from \u0000)
        const attn__json *items; // array elements / object members, contiguous
    } u;
};
#define ATTN__JSON_F_TRUE 1u // bool: true
#define ATTN__JSON_F_INT 2u  // number: written as an integer that fits int64_t

// Parse options; a zero-initialised struct (or NULL) gives the defaults.
typedef struct attn__json_opts {
    const char *what;     // names the input in error messages (default "JSON")
    int max_depth;        // deepest nesting of arrays/objects; 0 = 128; at most 1024
    size_t max_nodes;     // most values in the tree; 0 = no limit beyond the input size
    bool allow_nonfinite; // accept NaN, Infinity and -Infinity as numbers
} attn__json_opts;

// A parsed document. root is valid until attn__json_free.
typedef struct attn__json_doc {
    const attn__json *root;
    size_t n_nodes; // values in the tree
    size_t bytes;   // size of the allocation holding the tree
    void *mem_;     // private
} attn__json_doc;

// Parses text[0..len) (it need not be NUL-terminated). On failure *doc is zeroed and nothing is
// left allocated. opts may be NULL.
attn_status attn__json_parse(attn_ctx *ctx, const char *text, size_t len, const attn__json_opts *opts,
                             attn__json_doc *doc);
// Reads the file at `path` (at most max_size bytes, see attn__file_read_all) and parses it; the
// tree does not refer to the file's bytes, which are freed before returning. opts->what defaults
// to the path.
attn_status attn__json_parse_file(attn_ctx *ctx, const char *path, size_t max_size, const attn__json_opts *opts,
                                  attn__json_doc *doc);
// Frees the tree and zeroes *doc. Safe on a zeroed or already freed doc.
void attn__json_free(attn_ctx *ctx, attn__json_doc *doc);

// ---- accessors (all accept NULL and then report "absent") ------------------------------------
attn__json_type attn__json_kind(const attn__json *v);
// "null", "boolean", "number", "string", "array", "object" ("none" for NONE).
const char *attn__json_kind_name(attn__json_type type);
// Byte offset of the value in the input (0 for NULL).
size_t attn__json_offset(const attn__json *v);
// Number of elements of an array or members of an object; 0 for anything else.
size_t attn__json_len(const attn__json *v);
// Element i of an array or member i of an object (in input order); NULL when out of range.
const attn__json *attn__json_at(const attn__json *v, size_t i);
// Member of object `obj` whose key is exactly `key` (NUL-terminated) / key[0..key_len); or NULL.
const attn__json *attn__json_get(const attn__json *obj, const char *key);
const attn__json *attn__json_getn(const attn__json *obj, const char *key, size_t key_len);
// The key of an object member (NUL-terminated; *len, if not NULL, gets its length); NULL when v is
// not an object member.
const char *attn__json_key(const attn__json *v, size_t *len);
bool attn__json_is_null(const attn__json *v);
// true and *out when v is a boolean.
bool attn__json_bool(const attn__json *v, bool *out);
// true and *out when v is a number (integers converted to the nearest double).
bool attn__json_number(const attn__json *v, double *out);
// true when v is a number written as an integer that fits int64_t.
bool attn__json_is_int(const attn__json *v);
// true and *out when attn__json_is_int(v).
bool attn__json_int64(const attn__json *v, int64_t *out);
// The decoded string (NUL-terminated; *len, if not NULL, gets its length) or NULL.
const char *attn__json_string(const attn__json *v, size_t *len);

// ---- numeric arrays --------------------------------------------------------------------------
// Nested arrays of numbers as tensors: [[1, 2], [3, 4]] has shape (2, 2); a bare number has
// ndim 0; [] has shape (0). Leaves may be numbers, booleans (true = 1, false = 0) or strings
// "0x" + 8 hex digits, the bit pattern of a float32 (e.g. "0x3f800000" is 1.0f; taken exactly,
// NaN payloads included, and widened for f64 output). Every sub-array of one level must have the
// same length and leaves must all sit at depth ndim.

// Shape of `v` (at most max_dims <= ATTN_MAX_DIMS dimensions) and its element count.
// Errors (ATTN_ERR_BAD_FILE) name `what` and the byte offset of the offending value.
attn_status attn__json_shape(attn_ctx *ctx, const attn__json *v, const char *what, int max_dims, int64_t *shape,
                             int *ndim, int64_t *numel);
// Writes the n = numel leaves of `v` in row-major order to dst (float: rounded to nearest).
attn_status attn__json_flatten_f32(attn_ctx *ctx, const attn__json *v, const char *what, float *dst, int64_t n);
attn_status attn__json_flatten_f64(attn_ctx *ctx, const attn__json *v, const char *what, double *dst, int64_t n);
// attn__json_shape + a buffer from attn__alloc (free it with attn__free; at least 1 byte even
// for 0 elements) + flatten. shape has room for ATTN_MAX_DIMS entries. On failure *data = NULL.
attn_status attn__json_to_f32(attn_ctx *ctx, const attn__json *v, const char *what, int64_t *shape, int *ndim,
                              float **data);
attn_status attn__json_to_f64(attn_ctx *ctx, const attn__json *v, const char *what, int64_t *shape, int *ndim,
                              double **data);

// ---- helpers for writers ---------------------------------------------------------------------
// true when s[0..len) is valid UTF-8 (no overlong forms, surrogates or code points > U+10FFFF).
bool attn__json_utf8_valid(const char *s, size_t len);
// Writes s[0..len) as a quoted JSON string ('"', '\\' and control characters escaped; other
// bytes copied) to dst when dst is not NULL. Returns the number of bytes (no NUL is written).
size_t attn__json_write_string(char *dst, const char *s, size_t len);

#endif // ATTN_IO_JSON_H

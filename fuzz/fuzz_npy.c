/*
 * fuzz_npy.c - fuzz target for the .npy reader: attn_npy_parse on the raw input.
 *
 * On failure the status must be one the reader documents and the output tensor zeroed. On
 * success the tensor must be consistent (dtype, ndim, sizes, numel * dtype size data bytes) and
 * its data must be the last bytes of the input (the header has to match the size exactly). Then,
 * in memory: the tensor written as numpy.save writes it parses back equal; the input one byte
 * shorter or longer is rejected; and every allocation of the parse, made to fail in turn, gives
 * ATTN_ERR_OUT_OF_MEMORY with a zeroed tensor and nothing leaked. Through files: attn_npy_write of
 * the tensor reads back equal with attn_npy_read, and a write it must refuse (ndim out of range,
 * a negative extent, an extent that overflows, an unknown dtype) leaves that file as it was, with
 * no temporary file beside it.
 */
#include <stdio.h>
#include <string.h>

#include "attn.h"
#include "fuzz_data.h"
#include "fuzz_util.h"

static const char *descr_of(attn_dtype dtype) {
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

static bool tensor_is_zero(const attn_tensor *t) {
    bool zero = t->name == NULL && t->data == NULL && t->ndim == 0 && (int)t->dtype == 0;
    for (int i = 0; i < ATTN_MAX_DIMS; i++) zero = zero && t->shape[i] == 0;
    return zero;
}

/* Checks a parsed tensor against the input it came from; returns its data size in bytes. */
static size_t check_tensor(const attn_tensor *t, const uint8_t *data, size_t size) {
    FUZZ_CHECK(t->name == NULL, "a .npy tensor has a name");
    FUZZ_CHECK(descr_of(t->dtype) != NULL, "dtype %d has no .npy descr", (int)t->dtype);
    FUZZ_CHECK(t->ndim >= 0 && t->ndim <= ATTN_MAX_DIMS, "ndim %d", t->ndim);
    for (int i = 0; i < t->ndim; i++) FUZZ_CHECK(t->shape[i] >= 0, "shape[%d] = %lld", i, (long long)t->shape[i]);
    const int64_t numel = attn_tensor_numel(t);
    FUZZ_CHECK(numel >= 0, "attn_tensor_numel = %lld", (long long)numel);
    const size_t esize = attn_dtype_size(t->dtype);
    FUZZ_CHECK(esize > 0, "dtype size 0");
    FUZZ_CHECK((uint64_t)numel <= size / esize, "%lld elements of %zu bytes in a %zu-byte input", (long long)numel,
               esize, size);
    const size_t nbytes = (size_t)numel * esize;
    if (nbytes > 0) {
        FUZZ_CHECK(t->data != NULL, "no data for %zu bytes", nbytes);
        FUZZ_CHECK(memcmp(t->data, data + (size - nbytes), nbytes) == 0, "the data is not the input's last %zu bytes",
                   nbytes);
    }
    return nbytes;
}

/* The bytes numpy.save writes for a tensor (format 1.0); returns a malloc'd buffer. */
static uint8_t *npy_encode(const attn_tensor *t, size_t nbytes, size_t *len) {
    char hdr[512];
    int k = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr_of(t->dtype));
    for (int i = 0; i < t->ndim; i++)
        k += snprintf(hdr + k, sizeof hdr - (size_t)k, i == 0 ? "%lld" : ", %lld", (long long)t->shape[i]);
    k += snprintf(hdr + k, sizeof hdr - (size_t)k, "%s), }", t->ndim == 1 ? "," : "");
    size_t hlen = (size_t)k;
    const size_t total_hdr = (10 + hlen + 1 + 63) / 64 * 64; /* preamble + dict + '\n', padded to 64 */
    const size_t dict_len = total_hdr - 10;
    uint8_t *out = fuzz_xmalloc(total_hdr + nbytes);
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (uint8_t)(dict_len & 0xFF);
    out[9] = (uint8_t)(dict_len >> 8);
    memcpy(out + 10, hdr, hlen);
    memset(out + 10 + hlen, ' ', dict_len - hlen - 1);
    out[total_hdr - 1] = '\n';
    if (nbytes > 0) memcpy(out + total_hdr, t->data, nbytes);
    *len = total_hdr + nbytes;
    return out;
}

/* Parses `len` bytes copied to an exactly sized buffer. */
static attn_status parse_copy(attn_ctx *ctx, const uint8_t *src, size_t len, size_t copy_len, attn_tensor *t) {
    uint8_t *buf = fuzz_copy_exact(src, len, copy_len);
    attn_status st = attn_npy_parse(ctx, buf, len, t);
    free(buf);
    return st;
}

/* The input, for fuzz_fail_each_alloc: parses it, and a failure must leave the tensor zeroed. */
static attn_status parse_input(attn_ctx *ctx, void *user) {
    const fuzz_input *in = user;
    attn_tensor t;
    const attn_status st = attn_npy_parse(ctx, in->data, in->size, &t);
    FUZZ_CHECK(st == ATTN_OK || tensor_is_zero(&t), "the tensor is not zeroed after a failure");
    return st;
}

/* The file round trip and a refused write over the file (which refusal: pick). */
static void check_files(attn_ctx *ctx, const attn_tensor *t, size_t nbytes, uint8_t pick) {
    const char *dir = fuzz_scratch_dir();
    char path[640];
    snprintf(path, sizeof path, "%s/t.npy", dir);
    attn_status st = attn_npy_write(ctx, path, t->dtype, t->ndim, t->shape, t->data);
    fuzz_check_error(ctx, st, "attn_npy_write");
    FUZZ_CHECK(st == ATTN_OK, "attn_npy_write of a parsed tensor: %s", attn_ctx_last_error(ctx));
    attn_tensor u;
    st = attn_npy_read(ctx, path, &u);
    FUZZ_CHECK(st == ATTN_OK, "attn_npy_read of attn_npy_write's file: %s", attn_ctx_last_error(ctx));
    FUZZ_CHECK(u.dtype == t->dtype && u.ndim == t->ndim, "file round trip changed dtype or ndim");
    for (int i = 0; i < t->ndim; i++) FUZZ_CHECK(u.shape[i] == t->shape[i], "file round trip changed shape[%d]", i);
    FUZZ_CHECK(nbytes == 0 || memcmp(u.data, t->data, nbytes) == 0, "file round trip changed the data");
    attn_tensor_release(ctx, &u);

    size_t before_len;
    uint8_t *before = fuzz_read_file(path, &before_len);
    FUZZ_CHECK(before != NULL, "cannot read back %s", path);
    int64_t shape[ATTN_MAX_DIMS + 1];
    for (int i = 0; i <= ATTN_MAX_DIMS; i++) shape[i] = i < t->ndim ? t->shape[i] : 1;
    int ndim = t->ndim;
    attn_dtype dt = t->dtype;
    switch (pick % 4) {
    case 0: ndim = pick & 4 ? -1 : ATTN_MAX_DIMS + 1; break;
    case 1: ndim = ndim > 0 ? ndim : 1, shape[(pick >> 2) % ndim] = -1 - (pick >> 5); break;
    case 2: ndim = 3, shape[0] = shape[1] = shape[2] = INT64_C(1) << 22; break; /* 2^66 elements */
    default: dt = (attn_dtype)(100 + (pick >> 2)); break;
    }
    char what[96];
    snprintf(what, sizeof what, "attn_npy_write of dtype %d, ndim %d (refusal %d)", (int)dt, ndim, pick % 4);
    fuzz_check_refused_write(ctx, attn_npy_write(ctx, path, dt, ndim, shape, t->data), dir, path, before, before_len,
                             what);
    free(before);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_alloc alloc = {0};
    attn_ctx *ctx = fuzz_ctx_new(&alloc, ATTN_ISA_AUTO, 1, 0);
    const size_t live0 = fuzz_alloc_live(&alloc);

    attn_tensor t;
    memset(&t, 0xA5, sizeof t);
    const uint64_t calls0 = fuzz_alloc_calls(&alloc);
    attn_status st = attn_npy_parse(ctx, data, size, &t);
    const uint64_t calls = fuzz_alloc_calls(&alloc) - calls0;
    fuzz_check_error(ctx, st, "attn_npy_parse");
    if (st != ATTN_OK) {
        FUZZ_CHECK(st == ATTN_ERR_BAD_FILE || st == ATTN_ERR_UNSUPPORTED || st == ATTN_ERR_OUT_OF_MEMORY, "status %s",
                   attn_strerror(st));
        FUZZ_CHECK(tensor_is_zero(&t), "the tensor is not zeroed after a failure");
        FUZZ_CHECK(fuzz_alloc_live(&alloc) == live0, "%zu blocks leaked by a failed parse",
                   fuzz_alloc_live(&alloc) - live0);
    } else {
        const size_t nbytes = check_tensor(&t, data, size);

        /* Written back as numpy does, it reads back the same. */
        size_t elen;
        uint8_t *enc = npy_encode(&t, nbytes, &elen);
        attn_tensor u;
        st = attn_npy_parse(ctx, enc, elen, &u);
        FUZZ_CHECK(st == ATTN_OK, "re-encoded tensor rejected: %s", attn_ctx_last_error(ctx));
        FUZZ_CHECK(u.dtype == t.dtype && u.ndim == t.ndim, "round trip changed dtype or ndim");
        for (int i = 0; i < t.ndim; i++) FUZZ_CHECK(u.shape[i] == t.shape[i], "round trip changed shape[%d]", i);
        FUZZ_CHECK(nbytes == 0 || memcmp(u.data, t.data, nbytes) == 0, "round trip changed the data");
        attn_tensor_release(ctx, &u);
        free(enc);

        /* A byte less or a byte more breaks the size match. */
        attn_tensor v;
        st = parse_copy(ctx, data, size - 1, size, &v);
        FUZZ_CHECK(st != ATTN_OK, "the input minus its last byte was accepted");
        fuzz_check_error(ctx, st, "attn_npy_parse (truncated)");
        FUZZ_CHECK(tensor_is_zero(&v), "the tensor is not zeroed after a failure");
        st = parse_copy(ctx, data, size + 1, size, &v);
        FUZZ_CHECK(st != ATTN_OK, "the input plus one byte was accepted");
        FUZZ_CHECK(tensor_is_zero(&v), "the tensor is not zeroed after a failure");

        /* Each allocation failing in turn: out of memory, nothing kept. */
        fuzz_input in = {data, size};
        fuzz_fail_each_alloc(&alloc, ctx, calls, parse_input, &in, "attn_npy_parse (allocation failure)");

        check_files(ctx, &t, nbytes, data[0] ^ data[size - 1]);
        attn_tensor_release(ctx, &t);
        FUZZ_CHECK(tensor_is_zero(&t), "attn_tensor_release did not zero the tensor");
    }
    attn_ctx_free(ctx);
    FUZZ_CHECK(fuzz_alloc_live(&alloc) == 0, "%zu blocks leaked", fuzz_alloc_live(&alloc));
    return 0;
}

// status.c - status strings, version queries and dtype helpers.
#include "half.h"
#include "internal.h"

#define ATTN_STATUS_MAP(X)                                                         \
    X(ATTN_OK, "success")                                                          \
    X(ATTN_ERR_INVALID_ARG, "invalid argument")                                    \
    X(ATTN_ERR_BAD_SHAPE, "bad or mismatched shape")                               \
    X(ATTN_ERR_OVERFLOW, "size arithmetic overflows")                              \
    X(ATTN_ERR_OUT_OF_MEMORY, "out of memory")                                     \
    X(ATTN_ERR_BAD_MASK, "bad mask (dtype or shape)")                              \
    X(ATTN_ERR_CONTEXT_LENGTH, "sequence longer than the module's context_length") \
    X(ATTN_ERR_WORKSPACE, "workspace too small")                                   \
    X(ATTN_ERR_UNSUPPORTED, "unsupported")                                         \
    X(ATTN_ERR_NOT_FOUND, "not found")                                             \
    X(ATTN_ERR_IO, "input/output error")                                           \
    X(ATTN_ERR_BAD_FILE, "malformed file")                                         \
    X(ATTN_ERR_CAPACITY, "KV cache capacity exceeded")                              \
    X(ATTN_ERR_DEVICE, "GPU device error")

const char *attn_strerror(attn_status status) {
    switch (status) {
#define ATTN_STATUS_CASE(code, text) \
    case code:                       \
        return text;
        ATTN_STATUS_MAP(ATTN_STATUS_CASE)
#undef ATTN_STATUS_CASE
    }
    return "unknown status";
}

int attn_version_number(void) { return ATTN_VERSION_NUMBER; }

#define ATTN_STR2(x) #x
#define ATTN_STR(x) ATTN_STR2(x)
const char *attn_version_string(void) {
    return ATTN_STR(ATTN_VERSION_MAJOR) "." ATTN_STR(ATTN_VERSION_MINOR) "." ATTN_STR(ATTN_VERSION_PATCH);
}

size_t attn_dtype_size(attn_dtype dtype) {
    switch (dtype) {
    case ATTN_DTYPE_F32: return 4;
    case ATTN_DTYPE_F64: return 8;
    case ATTN_DTYPE_F16: return 2;
    case ATTN_DTYPE_BF16: return 2;
    case ATTN_DTYPE_BOOL: return 1;
    case ATTN_DTYPE_U8: return 1;
    case ATTN_DTYPE_I32: return 4;
    case ATTN_DTYPE_I64: return 8;
    case ATTN_DTYPE_Q8_0: return ATTN_Q8_0_BYTES;
    case ATTN_DTYPE_Q4_0: return ATTN_Q4_0_BYTES;
    }
    return 0;
}

int64_t attn_dtype_block_size(attn_dtype dtype) {
    if (dtype == ATTN_DTYPE_Q8_0 || dtype == ATTN_DTYPE_Q4_0) return ATTN_QBLOCK;
    return attn_dtype_size(dtype) > 0 ? 1 : 0;
}

const char *attn_dtype_name(attn_dtype dtype) {
    switch (dtype) {
    case ATTN_DTYPE_F32: return "F32";
    case ATTN_DTYPE_F64: return "F64";
    case ATTN_DTYPE_F16: return "F16";
    case ATTN_DTYPE_BF16: return "BF16";
    case ATTN_DTYPE_BOOL: return "BOOL";
    case ATTN_DTYPE_U8: return "U8";
    case ATTN_DTYPE_I32: return "I32";
    case ATTN_DTYPE_I64: return "I64";
    case ATTN_DTYPE_Q8_0: return "Q8_0";
    case ATTN_DTYPE_Q4_0: return "Q4_0";
    }
    return "?";
}

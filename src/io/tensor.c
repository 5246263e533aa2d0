// tensor.c - attn_tensor and attn_tensor_list helpers: element count, release, lookup by name.
// It does not read or write files (npy.c, safetensors.c do).
#include <string.h>

#include "internal.h"

int64_t attn_tensor_numel(const attn_tensor *t) {
    // -1 for a tensor that cannot describe a valid array (NULL, bad ndim, negative size, overflow).
    if (t == NULL || t->ndim < 0 || t->ndim > ATTN_MAX_DIMS) return -1;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        if (!attn__mul_i64(n, t->shape[i], &n)) return -1;
    return n;
}

void attn_tensor_release(attn_ctx *ctx, attn_tensor *t) {
    if (ctx == NULL || t == NULL) return;
    attn__free(ctx, t->name);
    attn__free(ctx, t->data);
    memset(t, 0, sizeof *t);
}

void attn_tensor_list_release(attn_ctx *ctx, attn_tensor_list *list) {
    if (ctx == NULL || list == NULL) return;
    if (list->tensors != NULL)
        for (int i = 0; i < list->count; i++) attn_tensor_release(ctx, &list->tensors[i]);
    attn__free(ctx, list->tensors);
    list->tensors = NULL;
    list->count = 0;
}

const attn_tensor *attn_tensor_list_find(const attn_tensor_list *list, const char *name) {
    if (list == NULL || list->tensors == NULL || name == NULL) return NULL;
    for (int i = 0; i < list->count; i++) {
        const attn_tensor *t = &list->tensors[i];
        if (t->name != NULL && strcmp(t->name, name) == 0) return t;
    }
    return NULL;
}

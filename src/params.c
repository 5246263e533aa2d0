// params.c - the named parameter table shared by attn_mha and attn_book.
#include <string.h>

#include "internal.h"

attn_status attn__params_add(attn_ctx *ctx, attn__params *p, const char *name, int ndim, const int64_t *shape) {
    if (p->count == p->capacity) {
        int cap = p->capacity == 0 ? 8 : p->capacity * 2;
        attn__param *items;
        ATTN_RETURN_IF_ERR(attn__alloc(ctx, (size_t)cap * sizeof *items, (void **)&items));
        if (p->count > 0) memcpy(items, p->items, (size_t)p->count * sizeof *items);
        attn__free(ctx, p->items);
        p->items = items;
        p->capacity = cap;
    }
    attn__param *prm = &p->items[p->count];
    memset(prm, 0, sizeof *prm);
    size_t len = strlen(name);
    if (len >= sizeof prm->name) return attn__fail(ctx, ATTN_ERR_INVALID_ARG, "parameter name too long: %s", name);
    memcpy(prm->name, name, len + 1);
    prm->ndim = ndim;
    for (int i = 0; i < ndim; i++) prm->shape[i] = shape[i];
    ATTN_RETURN_IF_ERR(attn__numel(ctx, name, ndim, shape, &prm->numel));
    p->count++;
    return ATTN_OK;
}

attn_status attn__params_alloc(attn_ctx *ctx, attn__params *p) {
    int64_t total = 0;
    for (int i = 0; i < p->count; i++)
        if (!attn__add_i64(total, p->items[i].numel, &total))
            return attn__fail(ctx, ATTN_ERR_OVERFLOW, "the parameters' total size overflows");
    size_t bytes;
    const size_t elem = attn_dtype_size(p->dtype);
    ATTN_RETURN_IF_ERR(attn__bytes(ctx, "parameters", total, elem, &bytes));
    ATTN_RETURN_IF_ERR(attn__alloc(ctx, bytes, &p->storage));
    memset(p->storage, 0, bytes);
    p->numel = total;
    int64_t off = 0;
    for (int i = 0; i < p->count; i++) {
        p->items[i].offset = off;
        p->items[i].data = (char *)p->storage + (size_t)off * elem;
        off += p->items[i].numel;
    }
    return ATTN_OK;
}

void attn__params_free(const attn_allocator *a, attn__params *p) {
    attn__free_with(a, p->storage);
    attn__free_with(a, p->items);
    memset(p, 0, sizeof *p);
}

attn__param *attn__params_find(const attn__params *p, const char *name) {
    if (name == NULL) return NULL;
    for (int i = 0; i < p->count; i++)
        if (strcmp(p->items[i].name, name) == 0) return &p->items[i];
    return NULL;
}

void attn__param_describe(const attn__param *prm, const char **name, int *ndim, int64_t *shape, int shape_len,
                          void **data) {
    if (name != NULL) *name = prm->name;
    if (ndim != NULL) *ndim = prm->ndim;
    if (shape != NULL)
        for (int i = 0; i < shape_len; i++) shape[i] = i < prm->ndim ? prm->shape[i] : 0;
    if (data != NULL) *data = prm->data;
}

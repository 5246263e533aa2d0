// sort.h - an allocation-free heapsort over an array of pointers, shared by the tensor-file code.
//
// The C library's qsort may allocate behind the caller's back (glibc's merge sort does), which
// would bypass the context's allocator; this one never allocates. It is not stable: callers that
// need a deterministic order for equal keys break ties in their comparison.
#ifndef ATTN_IO_SORT_H
#define ATTN_IO_SORT_H

#include <stddef.h>

// Returns < 0, 0 or > 0 as *a orders before, with or after *b.
typedef int (*attn__ptr_cmp)(const void *a, const void *b, void *user);

static inline void attn__sift_down_(void **v, size_t root, size_t n, attn__ptr_cmp cmp, void *user) {
    for (;;) {
        size_t child = 2 * root + 1;
        if (child >= n) return;
        if (child + 1 < n && cmp(v[child], v[child + 1], user) < 0) child++;
        if (cmp(v[root], v[child], user) >= 0) return;
        void *t = v[root];
        v[root] = v[child];
        v[child] = t;
        root = child;
    }
}

// Sorts v[0..n) ascending by cmp in O(n log n) time and O(1) extra memory.
static inline void attn__sort_ptrs(void **v, size_t n, attn__ptr_cmp cmp, void *user) {
    if (n < 2) return;
    for (size_t i = n / 2; i-- > 0;) attn__sift_down_(v, i, n, cmp, user);
    for (size_t end = n - 1; end > 0; end--) {
        void *t = v[0];
        v[0] = v[end];
        v[end] = t;
        attn__sift_down_(v, 0, end, cmp, user);
    }
}

#endif // ATTN_IO_SORT_H

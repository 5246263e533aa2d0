// sdpa_params.h - the one parameter block every attention kernel of libattn_cuda takes, filled
// and checked on the host (plan.c) and passed by value to the kernels. Plain C, shared by the host
// code and the .cu files. Shapes and strides are in elements, 64-bit; pointers are device pointers.
#ifndef ATTN_CUDA_SDPA_PARAMS_H
#define ATTN_CUDA_SDPA_PARAMS_H

#include <stdint.h>

// Element types as attn_dtype's values (F32 0, F16 2, BF16 3, BOOL 4).
enum { ATTN__CU_F32 = 0, ATTN__CU_F16 = 2, ATTN__CU_BF16 = 3, ATTN__CU_BOOL = 4 };

typedef struct attn__cuda_sdpa_params {
    // q: (B, H, L, D) at q_stride; k: (B, Hkv, S, D) at k_stride; v: (B, Hkv, S, Dv) at v_stride;
    // out: (B, H, L, Dv) at o_stride. With cu_q and cu_k the batch strides are 0.
    const void *q, *k, *v;
    void *out;
    float *lse;              // element (b, h, i) at b*lse_stride[0] + h*lse_stride[1] + (row0 + i)*lse_stride[2]
    const void *mask;        // (B, H, L, S) at mask_stride: BOOL (True hides) or F32 (added)
    const void *kpm;         // key padding mask (B, S) at kpm_stride: BOOL or F32
    const float *alibi;      // (H) slopes or NULL
    int64_t B, H, Hkv, group, L, S, D, Dv;
    int64_t q_stride[4], k_stride[4], v_stride[4], o_stride[4], mask_stride[4], kpm_stride[2];
    int64_t lse_stride[3];
    int32_t q_dtype, kv_dtype, out_dtype, mask_dtype, kpm_dtype;
    float scale;             // resolved (never 0)
    float softcap;           // 0: none
    int32_t causal;          // attn_causal
    int32_t use_window;
    int64_t window_left, window_right;
    // Packed batches (device arrays of B + 1 offsets; NULL for a plain batch): query i of sequence
    // b is row cu_q[b] + i, key j row cu_k[b] + j; L_b = cu_q[b+1] - cu_q[b], S_b likewise.
    const int64_t *cu_q, *cu_k;
    // KV caches (attn_cuda_kv_cache_attend): seq_k (device, B) the keys of each sequence (the batch
    // strides then step sequences: key j of sequence b is row j of its own block); with page_table
    // (device, (B, max_pages) int32) key j of sequence b is row j % page_size of page
    // page_table[b][j / page_size], and the k and v batch strides step pages instead of sequences.
    const int64_t *seq_k;
    const int32_t *page_table;
    int64_t page_size, max_pages;
    // Dropout (ATTN_DROPOUT_RNG_PHILOX, src/philox.h) when `dropout` is set: the weight of (b, h, i, j)
    // is kept when its Philox word is below drop_threshold (b the sequence of a packed batch), and
    // kept weights are multiplied by keep_scale.
    int32_t dropout;
    uint32_t drop_offset;
    uint64_t drop_seed, drop_threshold;
    float keep_scale;
    // Backward (attn_cuda_sdpa_bwd): lse above is the forward's (read); dout in out's layout and
    // out_dtype; rowdot = dout . out per row, float32 in lse's layout (workspace); dq, dk, dv of
    // grad_dtype at q_stride, k_stride, v_stride.
    const void *dout;
    float *rowdot;
    void *dq, *dk, *dv;
    int32_t grad_dtype;
    // The tensor-core backward's dQ accumulator (default, atomic mode): (H * total rows, D) float32,
    // row r = lse's index of (b, h, i), zeroed by the rowdot kernel, summed into by atomicAdd,
    // converted to dq at the end; NULL in the deterministic mode and in the simple backward.
    float *dq_acc;
    // The float mask's gradient (attn_cuda_sdpa_bwd's dmask): dS of (b, h, i, j) added at
    // mask_stride by the simple backward's dq kernel (float32 atomics); zeroed over mask_extent
    // elements first. NULL when not asked for.
    float *dmask;
    int64_t mask_extent;
} attn__cuda_sdpa_params;

#ifdef __CUDACC__
#define ATTN__CU_HOST_DEVICE __host__ __device__
#else
#define ATTN__CU_HOST_DEVICE
#endif

// Whether the score needs more than scale * dot on keys inside the bounds: a mask, a key padding
// mask, ALiBi or a soft cap (the kernels then apply the whole score rule per element; the planner
// keeps such calls off the kernels that apply the bounds alone).
static inline ATTN__CU_HOST_DEVICE int attn__cuda_elementwise(const attn__cuda_sdpa_params *p) {
    return p->mask != 0 || p->kpm != 0 || p->alibi != 0 || p->softcap > 0.0f;
}

// One append to a device KV cache (kv_cache.c, kernels/kv_append.cu): the packed new rows k_new
// (total_new, Hkv, D) and v_new (total_new, Hkv, Dv), sequence b's at rows cu_new[b] .. cu_new[b+1]
// (device), written at positions len[b] .. (device, before the append) of the cache's k and v at
// their strides (pages with page_table).
typedef struct attn__cuda_kv_append {
    void *k, *v;
    const void *k_new, *v_new;
    const int64_t *cu_new, *len;
    const int32_t *page_table;
    int64_t page_size, max_pages;
    int64_t B, Hkv, D, Dv, total_new;
    int64_t k_stride[4], v_stride[4];
    int32_t elem_size;
} attn__cuda_kv_append;

#endif

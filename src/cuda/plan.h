// plan.h - the host side of every libattn_cuda call that can be decided without a GPU: argument
// checks (sharing libattn's descriptor checks), kernel choice, launch geometry and workspace
// layout. Plain C with no CUDA header, so tests/cuda/test_cuda_plan.c runs it on any machine with a
// described (fake) device. The entry points (sdpa.c) plan first, then launch.
#ifndef ATTN_CUDA_PLAN_H
#define ATTN_CUDA_PLAN_H

#include <stdbool.h>
#include <stddef.h>

#include "attn_cuda.h"
#include "sdpa_params.h"

#define ATTN__CU_TRY(expr)                      \
    do {                                        \
        const attn_status attn__cu_st_ = (expr); \
        if (attn__cu_st_ != ATTN_OK) return attn__cu_st_; \
    } while (0)

#define ATTN__CU_ERR_SIZE 256
#define ATTN__CU_WS_ALIGN 256 // every workspace piece starts on this boundary
#define ATTN__CU_MAX_HEAD_DIM 1024

// Where messages go: a buffer, and libattn's context whose descriptor checks we share.
typedef struct attn__cuda_err {
    char msg[ATTN__CU_ERR_SIZE];
    attn_ctx *host; // checks of attn_sdpa_desc_check write their message here; copied into msg
} attn__cuda_err;

attn_status attn__cuda_fail(attn__cuda_err *e, attn_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

// What the planner (and, for decode_pdl, the decode launch) needs to know of the device.
typedef struct attn__cuda_device {
    int cc_major, cc_minor;
    int sm_count;
    size_t smem_optin; // largest dynamic shared memory per block
    bool decode_pdl;   // the loaded decode kernels were compiled for sm_90 or later (programmatic launch)
    bool flash_sm90;   // compute capability 9.0 and the library carries sm_90a machine code (the Hopper forward)
} attn__cuda_device;

typedef enum attn__cuda_kernel {
    ATTN__CU_KERNEL_SIMPLE = 0,
    ATTN__CU_KERNEL_FLASH = 1,
    ATTN__CU_KERNEL_DECODE = 2,    // split-KV decoding (kernels/decode.cu): few query rows per kv head
    ATTN__CU_KERNEL_DECODE_VEC = 3, // the same, 16-byte rows of BF16/F16 at D = Dv in {64, 128}, bounds only
    ATTN__CU_KERNEL_FLASH_SM90 = 4  // the forward on warpgroup MMA (kernels/flash_sm90.cuh), compute capability 9.x
} attn__cuda_kernel;

const char *attn__cuda_kernel_name(attn__cuda_kernel k);

// The sizes of each sequence of a call, on the host (what the device arrays will hold).
typedef struct attn__cuda_seqs {
    const int64_t *cu_q, *cu_k; // host (B + 1) or NULL (both given for a packed batch)
    int64_t page_size;          // a paged KV cache's tokens per page; 0: keys in sequence order
} attn__cuda_seqs;

// A planned SDPA call: the parameters with every pointer but the tensors' set at launch, the
// kernel, its launch geometry and the workspace layout.
typedef struct attn__cuda_sdpa_plan {
    attn__cuda_sdpa_params p;
    attn__cuda_kernel kernel;
    int64_t row_blocks;      // query tiles per (b, h)
    int64_t total_q;         // rows of q (packed) or B*L
    size_t ws_cu;            // offset inside the workspace of the device copy of cu_q, cu_k
    size_t ws_rowdot;        // backward: offset of rowdot (H * total_q floats)
    size_t ws_dq_acc;        // flash backward, atomic mode: offset of the dQ accumulator (H * total_q * D floats)
    bool deterministic;      // backward: the flash backward's dQ kernel without atomics
    // decode: keys per split, splits per sequence, query rows per kv head (group * L), and the offset
    // of the splits' partial results (B * Hkv * n_splits * rows * (2 + Dv) floats)
    int64_t split_keys, n_splits;
    int decode_rows;
    size_t ws_part;
    size_t ws_bytes;         // total (0 when nothing is needed), alignment slack included
} attn__cuda_sdpa_plan;

// Checks a descriptor for the GPU (attn_sdpa_desc_check or attn_sdpa_varlen_desc_check, then the
// GPU's own limits) and plans the call. seqs gives per-sequence sizes (NULL: a plain batch); a
// packed batch's p.L and p.S are then its longest sequences (len_q and len_kv only bound them).
// Pointers are checked for alignment when given (NULL pointers are checked by the entry points).
attn_status attn__cuda_plan_sdpa(attn__cuda_err *e, const attn__cuda_device *dev, attn_cuda_kernels kernels,
                                 const attn_sdpa_desc *d, const attn__cuda_seqs *seqs,
                                 const void *q, const void *k, const void *v, const void *out,
                                 attn__cuda_sdpa_plan *plan);

// The backward's tensors the kernel choice looks at (alignment of the 16-byte loads); any may be
// NULL: not known yet (sizing calls), not checked.
typedef struct attn__cuda_bwd_tensors {
    const void *q, *k, *v, *out, *dout;
} attn__cuda_bwd_tensors;

// A planned SDPA backward: the forward's plan of the same call (its checks and parameters), with the
// gradients' type checked; the tensor-core kernels (flash) where the forward's conditions hold for
// q, k, v, out and dout, head_dim = head_dim_v in {32, 64, 96, 128} (256 when SM80 or SM90 names
// these kernels) and the shared memory fits, else
// the simple ones; deterministic selects the flash backward's dQ kernel without atomics. Workspace:
// the offsets (packed), rowdot (lse's layout) at ws_rowdot, and for the flash backward's atomic mode
// the float32 dQ accumulator (H * total_q rows of D) at ws_dq_acc. dmask_wanted: the float mask's
// gradient (an F32 mask needed, ATTN_ERR_BAD_MASK otherwise, as on the CPU): the simple kernels, with
// p.mask_extent set to the elements the mask's strides reach.
attn_status attn__cuda_plan_sdpa_bwd(attn__cuda_err *e, const attn__cuda_device *dev, attn_cuda_kernels kernels,
                                     bool deterministic, const attn_sdpa_desc *d, const attn__cuda_seqs *seqs,
                                     bool dmask_wanted, const attn__cuda_bwd_tensors *t, attn__cuda_sdpa_plan *plan);

// The name of a planned backward's kernels: "flash", "flash-deterministic" or "simple".
const char *attn__cuda_bwd_kernel_name(const attn__cuda_sdpa_plan *plan);

// Dynamic shared memory of the kernels (bytes), from the plan.
size_t attn__cuda_simple_smem(const attn__cuda_sdpa_params *p);
size_t attn__cuda_flash_smem(int head_dim);
size_t attn__cuda_flash_sm90_smem(int head_dim); // 0: no instance
size_t attn__cuda_simple_bwd_smem(const attn__cuda_sdpa_params *p);
// The tensor-core backward's (the larger of its two kernels' with `deterministic`); 0: no instance.
size_t attn__cuda_flash_bwd_smem(int head_dim, bool deterministic);

// A device KV cache's geometry (kv_cache.c) from its configuration, checked: sizes >= 1, page_size
// >= 0, dtype F32, F16 or BF16; the element counts of the key and value storage and their bytes
// within int64 (ATTN_ERR_OVERFLOW), a paged cache's page table entries (page p of sequence b is
// physical page p B + b) within int32. Strides of a (sequence or page, head, token, column) element.
typedef struct attn__cuda_kv_layout {
    int64_t Dv;                       // head_dim_v resolved
    int64_t pages;                    // pages per sequence (0: contiguous)
    int64_t k_elems, v_elems;         // elements of the key and value storage
    int64_t k_stride[4], v_stride[4];
} attn__cuda_kv_layout;
attn_status attn__cuda_kv_layout_of(attn__cuda_err *e, const attn_cuda_kv_cache_config *cfg, attn__cuda_kv_layout *out);

// An attend call's descriptor against the cache it reads (cfg as created): batch, kv heads, head
// dims and kv_dtype the cache's (ATTN_ERR_BAD_SHAPE, the message giving both), no attention or key
// padding mask (ATTN_ERR_UNSUPPORTED), causal NONE or BOTTOM_RIGHT (ATTN_ERR_INVALID_ARG).
attn_status attn__cuda_kv_check_desc(attn__cuda_err *e, const attn_cuda_kv_cache_config *cfg, const attn_sdpa_desc *d);

// The offsets cu (B + 1) of an append of n[b] tokens to sequences holding len[b] of `capacity`:
// ATTN_ERR_INVALID_ARG for n[b] < 0, ATTN_ERR_CAPACITY where len[b] + n[b] > capacity.
attn_status attn__cuda_kv_append_offsets(attn__cuda_err *e, int64_t B, int64_t capacity, const int64_t *len,
                                         const int64_t *n, int64_t *cu);

// Workspace pieces: offsets advance by aligned sizes (arena over device memory, or sizing only).
size_t attn__cuda_ws_take(size_t *used, size_t bytes);

#endif

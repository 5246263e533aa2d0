// launch.h - the kernels' launchers, defined in the .cu files and called by the host code (C).
// Each enqueues on `stream` and returns the cudaError_t of the launch (0 = cudaSuccess); none
// synchronises. Preconditions are the planner's (plan.c): the launchers trust their parameters.
#ifndef ATTN_CUDA_LAUNCH_H
#define ATTN_CUDA_LAUNCH_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "sdpa_params.h"

#ifdef __cplusplus
extern "C" {
#endif

// kernels/simple.cu: row_blocks = ceil(L / 4) query tiles per (b, h).
int attn__cuda_launch_simple(const attn__cuda_sdpa_params *p, int64_t row_blocks, cudaStream_t stream);

// kernels/flash_dispatch.cu: the tensor-core forward (kernels/flash_sm80.cuh) for q_dtype BF16 or
// F16 and head dim 32, 64, 96, 128 or 256, one instance per (type, dim) generated from
// kernels/flash_inst.cu.in. Other combinations return cudaErrorInvalidValue.
int attn__cuda_launch_flash(const attn__cuda_sdpa_params *p, int64_t row_blocks, cudaStream_t stream);
// The Hopper forward (kernels/flash_sm90.cuh): BF16 or F16, D = 64 or 128, on compute capability 9.x.
int attn__cuda_launch_flash_sm90(const attn__cuda_sdpa_params *p, int64_t row_blocks, cudaStream_t stream);

// kernels/simple_bwd.cu: the simple backward (rowdot, dq, dk and dv kernels in turn) for a plan
// whose dout, rowdot (workspace), dq, dk, dv and lse (the forward's) are set.
int attn__cuda_launch_simple_bwd(const attn__cuda_sdpa_params *p, cudaStream_t stream);

// kernels/bwd_rows.cu: the backward's row kernels (rows of one (b, h) per block; each launcher picks
// the vector form where the views allow it): rowdot (dout . out per query row into p->rowdot, and
// zeroing p->dq_acc's rows when it is set), and dq_convert (dq = scale * p->dq_acc in grad_dtype at
// q_stride).
int attn__cuda_launch_bwd_rowdot(const attn__cuda_sdpa_params *p, cudaStream_t stream);
int attn__cuda_launch_bwd_dq_convert(const attn__cuda_sdpa_params *p, cudaStream_t stream);

// kernels/flash_dispatch.cu: the tensor-core backward (kernels/flash_bwd_sm80.cuh) for q_dtype BF16
// or F16 and head dim 32, 64, 96, 128 or 256: rowdot, the dK/dV kernel, then dq_convert (atomic mode:
// p->dq_acc set, zeroed by rowdot) or the dQ kernel (deterministic: p->dq_acc NULL).
int attn__cuda_launch_flash_bwd(const attn__cuda_sdpa_params *p, int deterministic, cudaStream_t stream);

// kernels/decode.cu: split-KV decoding for `rows` (group * L <= 16) query rows per kv head: splits of
// split_keys keys into `part` (the plan's partial results; vec: the vector kernel, on the planner's
// conditions for it), then their combination into out and lse. pdl: both launched as programmatic
// dependents (only where attn__cuda_decode_pdl() says the loaded code waits for its predecessor).
int attn__cuda_launch_decode(const attn__cuda_sdpa_params *p, int vec, int64_t split_keys, int64_t n_splits, int rows,
                             float *part, int pdl, cudaStream_t stream);

// kernels/decode.cu: 1 when the decode kernels the current device loads were compiled for sm_90 or
// later (their PTX version: code JIT-compiled from compute_80 PTX lacks the griddepcontrol wait, so
// a programmatic launch would let it read before its predecessor's writes), else 0.
int attn__cuda_decode_pdl(void);

// kernels/kv_append.cu: the rows of one append written into the cache.
int attn__cuda_launch_kv_append(const attn__cuda_kv_append *a, cudaStream_t stream);

// kernels/colsum.cu: out[c] = sum over r < rows of x[r * ld + c] (x of dtype F32, F16 or BF16), c < cols.
int attn__cuda_launch_colsum(const void *x, int32_t dtype, int64_t rows, int64_t cols, int64_t ld, float *out,
                             cudaStream_t stream);

// kernels/mha_rows.cu: rows_put writes `rows` rows of `width` bytes, `pitch` bytes apart from dst, each
// a copy of src (width bytes) or zeros when src is NULL; mask_widen writes (rows, S2) elements of
// `elem` bytes: column j < S from src's row r (src_pitch elements a row), zero from S on, or, with src
// NULL, the bool causal mask of query r % L (1 where S > j > r % L).
int attn__cuda_launch_rows_put(void *dst, int64_t rows, int64_t pitch, const void *src, int64_t width,
                               cudaStream_t stream);
int attn__cuda_launch_mask_widen(void *dst, const void *src, int64_t src_pitch, int64_t rows, int64_t L, int64_t S,
                                 int64_t S2, int64_t elem, cudaStream_t stream);

// kernels/simple.cu: whether this build carries code the current device can run (a kernel's
// attributes are queried, which loads its module): 0 (cudaSuccess) or the CUDA error.
int attn__cuda_kernels_loadable(void);

#ifdef __cplusplus
}
#endif

#endif

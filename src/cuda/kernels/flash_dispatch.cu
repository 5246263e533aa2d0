// flash_dispatch.cu - picks the instance of the tensor-core forward (one per element type and head
// dim, compiled from flash_inst.cu.in) or backward (flash_bwd_inst.cu.in) for a planned call. The kernel template itself is not seen
// here, so this file compiles in a moment and every instance is compiled once, in its own file.
#include <cuda_runtime.h>

#include "../launch.h"
#include "common.cuh"

namespace attn_cuda {
template <typename T, int D> int flash_launch(const P &p, int64_t row_blocks, cudaStream_t stream);
template <typename T, int D> int flash_bwd_launch(const P &p, int deterministic, cudaStream_t stream);
template <typename T, int D> int flash_sm90_launch(const P &p, int64_t row_blocks, cudaStream_t stream);

template <typename T> static int flash_sm90_by_dim(const P &p, int64_t row_blocks, cudaStream_t stream) {
    if (p.D == 64) return flash_sm90_launch<T, 64>(p, row_blocks, stream);
    if (p.D == 128) return flash_sm90_launch<T, 128>(p, row_blocks, stream);
    return cudaErrorInvalidValue;
}

template <typename T> static int flash_by_dim(const P &p, int64_t row_blocks, cudaStream_t stream) {
    switch (p.D) {
    case 32: return flash_launch<T, 32>(p, row_blocks, stream);
    case 64: return flash_launch<T, 64>(p, row_blocks, stream);
    case 96: return flash_launch<T, 96>(p, row_blocks, stream);
    case 128: return flash_launch<T, 128>(p, row_blocks, stream);
    case 256: return flash_launch<T, 256>(p, row_blocks, stream);
    default: return cudaErrorInvalidValue;
    }
}

template <typename T> static int flash_bwd_by_dim(const P &p, int deterministic, cudaStream_t stream) {
    switch (p.D) {
    case 32: return flash_bwd_launch<T, 32>(p, deterministic, stream);
    case 64: return flash_bwd_launch<T, 64>(p, deterministic, stream);
    case 96: return flash_bwd_launch<T, 96>(p, deterministic, stream);
    case 128: return flash_bwd_launch<T, 128>(p, deterministic, stream);
    case 256: return flash_bwd_launch<T, 256>(p, deterministic, stream);
    default: return cudaErrorInvalidValue;
    }
}
} // namespace attn_cuda

extern "C" int attn__cuda_launch_flash(const attn__cuda_sdpa_params *p, int64_t row_blocks, cudaStream_t stream) {
    if (p->q_dtype == ATTN__CU_BF16) return attn_cuda::flash_by_dim<__nv_bfloat16>(*p, row_blocks, stream);
    if (p->q_dtype == ATTN__CU_F16) return attn_cuda::flash_by_dim<__half>(*p, row_blocks, stream);
    return cudaErrorInvalidValue;
}

extern "C" int attn__cuda_launch_flash_sm90(const attn__cuda_sdpa_params *p, int64_t row_blocks, cudaStream_t stream) {
    if (p->q_dtype == ATTN__CU_BF16) return attn_cuda::flash_sm90_by_dim<__nv_bfloat16>(*p, row_blocks, stream);
    if (p->q_dtype == ATTN__CU_F16) return attn_cuda::flash_sm90_by_dim<__half>(*p, row_blocks, stream);
    return cudaErrorInvalidValue;
}

extern "C" int attn__cuda_launch_flash_bwd(const attn__cuda_sdpa_params *p, int deterministic, cudaStream_t stream) {
    if ((p->dq_acc == nullptr) != (deterministic != 0)) return cudaErrorInvalidValue;
    int err = attn__cuda_launch_bwd_rowdot(p, stream);
    if (err != cudaSuccess) return err;
    if (p->q_dtype == ATTN__CU_BF16)
        err = attn_cuda::flash_bwd_by_dim<__nv_bfloat16>(*p, deterministic, stream);
    else if (p->q_dtype == ATTN__CU_F16)
        err = attn_cuda::flash_bwd_by_dim<__half>(*p, deterministic, stream);
    else
        err = cudaErrorInvalidValue;
    if (err != cudaSuccess || deterministic) return err;
    return attn__cuda_launch_bwd_dq_convert(p, stream);
}

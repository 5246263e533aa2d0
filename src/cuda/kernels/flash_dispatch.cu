// flash_dispatch.cu - picks the instance of the tensor-core forward (one per element type and head
// dim, compiled from flash_inst.cu.in) for a planned call. The kernel template itself is not seen
// here, so this file compiles in a moment and every instance is compiled once, in its own file.
#include <cuda_runtime.h>

#include "../launch.h"
#include "common.cuh"

namespace attn_cuda {
template <typename T, int D> int flash_launch(const P &p, int64_t row_blocks, cudaStream_t stream);

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
} // namespace attn_cuda

extern "C" int attn__cuda_launch_flash(const attn__cuda_sdpa_params *p, int64_t row_blocks, cudaStream_t stream) {
    if (p->q_dtype == ATTN__CU_BF16) return attn_cuda::flash_by_dim<__nv_bfloat16>(*p, row_blocks, stream);
    if (p->q_dtype == ATTN__CU_F16) return attn_cuda::flash_by_dim<__half>(*p, row_blocks, stream);
    return cudaErrorInvalidValue;
}

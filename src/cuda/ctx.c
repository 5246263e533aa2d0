// ctx.c - libattn_cuda's contexts: the device check, the stream, the workspace and the last error.
// Nothing here synchronises the device or the stream: the owned workspace is allocated and freed
// stream-ordered (cudaMallocAsync / cudaFreeAsync, or the caller's hooks: mem.c).
#include "ctx.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

#ifndef ATTN_CUDA_ARCHS
#define ATTN_CUDA_ARCHS "unknown"
#endif

attn_status attn__cuda_device_fail(attn__cuda_err *e, int cuda_error, const char *what) {
    const cudaError_t c = (cudaError_t)cuda_error;
    return attn__cuda_fail(e, ATTN_ERR_DEVICE, "%s: %s: %s", what, cudaGetErrorName(c), cudaGetErrorString(c));
}

void attn_cuda_ctx_params_init(attn_cuda_ctx_params *params) {
    if (params != NULL) memset(params, 0, sizeof *params);
}

// The device check of attn_cuda_probe and attn_cuda_ctx_create; fills *dev on success.
static attn_status probe(attn__cuda_err *e, int device, attn__cuda_device *dev) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) return attn__cuda_device_fail(e, err, "cuda: no usable GPU (cudaGetDeviceCount)");
    if (n < 1) return attn__cuda_fail(e, ATTN_ERR_DEVICE, "cuda: no GPU is visible");
    if (device < 0 || device >= n)
        return attn__cuda_fail(e, ATTN_ERR_DEVICE, "cuda: device %d does not exist (%d visible)", device, n);
    struct cudaDeviceProp prop;
    err = cudaGetDeviceProperties(&prop, device);
    if (err != cudaSuccess) return attn__cuda_device_fail(e, err, "cuda: cudaGetDeviceProperties");
    if (prop.major < 8)
        return attn__cuda_fail(e, ATTN_ERR_DEVICE, "cuda: %s has compute capability %d.%d; libattn_cuda needs 8.0 or later",
                               prop.name, prop.major, prop.minor);
    err = cudaSetDevice(device);
    if (err != cudaSuccess) return attn__cuda_device_fail(e, err, "cuda: cudaSetDevice");
    err = (cudaError_t)attn__cuda_kernels_loadable();
    if (err != cudaSuccess) {
        attn__cuda_device_fail(e, err, "cuda: no machine code for this device");
        const size_t len = strlen(e->msg);
        snprintf(e->msg + len, sizeof e->msg - len, " (compute capability %d.%d; built for %s)", prop.major, prop.minor,
                 ATTN_CUDA_ARCHS);
        return ATTN_ERR_DEVICE;
    }
    dev->cc_major = prop.major, dev->cc_minor = prop.minor;
    dev->sm_count = prop.multiProcessorCount;
    dev->smem_optin = prop.sharedMemPerBlockOptin;
    dev->decode_pdl = attn__cuda_decode_pdl() != 0;
    // the runtime loads a build's sm_90a code on a 9.0 device (an exact match); elsewhere the Hopper
    // forward's kernel has no body (kernels/wgmma.cuh)
    dev->flash_sm90 = prop.major == 9 && prop.minor == 0 && strstr(ATTN_CUDA_ARCHS, "90a") != NULL;
    return ATTN_OK;
}

attn_status attn_cuda_probe(int device, char *msg, size_t msg_size) {
    attn__cuda_err e = {{0}, NULL};
    attn__cuda_device dev;
    const attn_status st = probe(&e, device, &dev);
    if (msg != NULL && msg_size > 0) snprintf(msg, msg_size, "%s", st == ATTN_OK ? "" : e.msg);
    return st;
}

// A stream given for `device`'s work must be of that device (cudaStreamGetDevice); NULL, the legacy
// default stream, follows the current device.
static attn_status check_stream(attn__cuda_err *e, int device, cudaStream_t stream) {
    if (stream == NULL) return ATTN_OK;
    int dev = -1;
    const cudaError_t err = cudaStreamGetDevice(stream, &dev);
    if (err != cudaSuccess) {
        (void)cudaGetLastError(); // not sticky: clear it
        return attn__cuda_device_fail(e, err, "cuda: the stream's device (cudaStreamGetDevice)");
    }
    if (dev != device)
        return attn__cuda_fail(e, ATTN_ERR_INVALID_ARG, "cuda: the stream belongs to device %d, the context to device %d",
                               dev, device);
    return ATTN_OK;
}

attn_status attn_cuda_ctx_create(const attn_cuda_ctx_params *params, attn_cuda_ctx **out) {
    if (out == NULL) return ATTN_ERR_INVALID_ARG;
    *out = NULL;
    attn_cuda_ctx_params pr;
    attn_cuda_ctx_params_init(&pr);
    if (params != NULL) pr = *params;
    if (pr.kernels < ATTN_CUDA_KERNELS_AUTO || pr.kernels > ATTN_CUDA_KERNELS_SM90 || pr.device < 0 ||
        (pr.allocator.alloc == NULL) != (pr.allocator.free == NULL))
        return ATTN_ERR_INVALID_ARG;
    attn_cuda_ctx *ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL) return ATTN_ERR_OUT_OF_MEMORY;
    attn_ctx_params hp;
    attn_ctx_params_init(&hp);
    attn_status st = attn_ctx_create(&hp, &ctx->err.host);
    if (st == ATTN_OK) st = probe(&ctx->err, pr.device, &ctx->dev);
    if (st == ATTN_OK) st = check_stream(&ctx->err, pr.device, (cudaStream_t)pr.stream);
    if (st != ATTN_OK) {
        attn_cuda_ctx_free(ctx);
        return st;
    }
    ctx->device = pr.device, ctx->stream = (cudaStream_t)pr.stream, ctx->kernels = pr.kernels;
    ctx->deterministic = pr.deterministic != 0, ctx->mem = pr.allocator;
    int pageable = 0;
    if (cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, pr.device) == cudaSuccess)
        ctx->pageable_ok = pageable != 0;
    *out = ctx;
    return ATTN_OK;
}

void attn_cuda_ctx_free(attn_cuda_ctx *ctx) {
    if (ctx == NULL) return;
    if (!ctx->ws_external) attn__cuda_mem_free(&ctx->mem, ctx->ws, ctx->stream, true);
    attn_ctx_free(ctx->err.host);
    free(ctx);
}

const char *attn_cuda_ctx_last_error(const attn_cuda_ctx *ctx) { return ctx != NULL ? ctx->err.msg : ""; }

attn_status attn_cuda_ctx_set_stream(attn_cuda_ctx *ctx, attn_cuda_stream stream) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    ATTN__CU_TRY(check_stream(&ctx->err, ctx->device, (cudaStream_t)stream));
    ctx->stream = (cudaStream_t)stream;
    return ATTN_OK;
}

attn_cuda_stream attn_cuda_ctx_stream(const attn_cuda_ctx *ctx) {
    return ctx != NULL ? (attn_cuda_stream)ctx->stream : NULL;
}

attn_status attn_cuda_ctx_device(const attn_cuda_ctx *ctx, attn_cuda_device_props *props) {
    if (ctx == NULL || props == NULL) return ATTN_ERR_INVALID_ARG;
    attn__cuda_err *e = (attn__cuda_err *)&ctx->err; // messages are the context's mutable part
    memset(props, 0, sizeof *props);
    struct cudaDeviceProp prop;
    cudaError_t err = cudaGetDeviceProperties(&prop, ctx->device);
    if (err != cudaSuccess) return attn__cuda_device_fail(e, err, "cuda: cudaGetDeviceProperties");
    snprintf(props->name, sizeof props->name, "%s", prop.name);
    props->cc_major = prop.major, props->cc_minor = prop.minor;
    props->sm_count = prop.multiProcessorCount;
    props->global_mem = prop.totalGlobalMem;
    if ((err = cudaDriverGetVersion(&props->driver_version)) != cudaSuccess ||
        (err = cudaRuntimeGetVersion(&props->runtime_version)) != cudaSuccess)
        return attn__cuda_device_fail(e, err, "cuda: version query");
    snprintf(props->arch_built, sizeof props->arch_built, "%s", ATTN_CUDA_ARCHS);
    return ATTN_OK;
}

static void drop_owned(attn_cuda_ctx *ctx) {
    if (!ctx->ws_external) attn__cuda_mem_free(&ctx->mem, ctx->ws, ctx->stream, true);
    ctx->ws = NULL, ctx->ws_size = 0, ctx->ws_external = false;
}

attn_status attn_cuda_ctx_set_workspace(attn_cuda_ctx *ctx, void *buffer, size_t size) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if ((buffer == NULL) != (size == 0))
        return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda set_workspace: buffer and size must be both set or both 0");
    ATTN__CU_TRY(attn__cuda_check_device_ptr(ctx, buffer, "cuda set_workspace: buffer"));
    drop_owned(ctx);
    if (buffer != NULL) ctx->ws = buffer, ctx->ws_size = size, ctx->ws_external = true;
    return ATTN_OK;
}

// Grows the owned workspace to `size` bytes, stream-ordered.
static attn_status grow(attn_cuda_ctx *ctx, size_t size) {
    if (ctx->ws_size >= size) return ATTN_OK;
    drop_owned(ctx);
    void *p = NULL;
    const cudaError_t err = (cudaError_t)attn__cuda_mem_alloc(&ctx->mem, &p, size, ctx->stream, true);
    if (err == cudaErrorMemoryAllocation)
        return attn__cuda_fail(&ctx->err, ATTN_ERR_OUT_OF_MEMORY, "cuda: a workspace of %zu bytes cannot be had", size);
    if (err != cudaSuccess) return attn__cuda_device_fail(&ctx->err, err, "cuda: cudaMallocAsync (workspace)");
    ctx->ws = p, ctx->ws_size = size;
    return ATTN_OK;
}

attn_status attn_cuda_ctx_reserve(attn_cuda_ctx *ctx, size_t size) {
    if (ctx == NULL) return ATTN_ERR_INVALID_ARG;
    if (ctx->ws_external)
        return attn__cuda_fail(&ctx->err, ATTN_ERR_INVALID_ARG, "cuda reserve: the context uses the caller's workspace");
    return grow(ctx, size);
}

attn_status attn__cuda_workspace(attn_cuda_ctx *ctx, size_t bytes, unsigned char **base) {
    *base = NULL;
    if (bytes == 0) return ATTN_OK;
    if (ctx->ws_external) {
        if (ctx->ws_size < bytes)
            return attn__cuda_fail(&ctx->err, ATTN_ERR_WORKSPACE, "cuda: the call needs %zu workspace bytes, %zu were given",
                                   bytes, ctx->ws_size);
    } else {
        ATTN__CU_TRY(grow(ctx, bytes));
    }
    const uintptr_t at = ((uintptr_t)ctx->ws + ATTN__CU_WS_ALIGN - 1) & ~(uintptr_t)(ATTN__CU_WS_ALIGN - 1);
    *base = (unsigned char *)at;
    return ATTN_OK;
}

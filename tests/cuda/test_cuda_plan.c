// test_cuda_plan.c - the host side of libattn_cuda without a GPU: the planner (src/cuda/plan.c)
// against described devices. Every descriptor the CPU rejects is rejected with the CPU's status and
// message; the GPU's own limits; the kernel each call gets (tensor cores only for aligned BF16/F16
// views of the head dims they are built for); launch geometry, resolved parameters and workspace;
// Philox dropout's parameters; the backward's plan.
#include "attn.h"
#include "harness.h"
#include "plan.h"

// An H100 (sm_90, 132 SMs, 227 KiB of shared memory per block, a build with sm_90a code) and an A100
// (sm_80, 163 KiB).
static const attn__cuda_device h100 = {9, 0, 132, 232448, true, true};
static const attn__cuda_device a100 = {8, 0, 108, 166912, false, false};

static attn_ctx *cpu_ctx(void) {
    attn_ctx *ctx = NULL;
    if (attn_ctx_create(NULL, &ctx) != ATTN_OK) FAIL("attn_ctx_create");
    return ctx;
}

// A contiguous (B, H, L, D) descriptor of one element type.
static attn_sdpa_desc desc_of(int64_t B, int64_t H, int64_t Hkv, int64_t L, int64_t S, int64_t D, attn_dtype t) {
    attn_sdpa_desc d;
    attn_sdpa_desc_init(&d);
    d.batch = B, d.n_heads = H, d.n_kv_heads = Hkv, d.len_q = L, d.len_kv = S, d.head_dim = D;
    const int64_t q[4] = {H * L * D, L * D, D, 1}, k[4] = {Hkv * S * D, S * D, D, 1};
    memcpy(d.q_stride, q, sizeof q), memcpy(d.o_stride, q, sizeof q);
    memcpy(d.k_stride, k, sizeof k), memcpy(d.v_stride, k, sizeof k);
    d.q_dtype = d.kv_dtype = d.out_dtype = t;
    return d;
}

// Three packed sequences (query lengths 10, 40, 27; key lengths 20, 50, 20) of 4 query and 2 kv
// heads of dimension D, type t: rows of H * D (q, out) and Hkv * D (k, v) elements.
static const int64_t packed_cq[4] = {0, 10, 50, 77}, packed_ck[4] = {0, 20, 70, 90};
static const attn__cuda_seqs packed_seqs = {packed_cq, packed_ck, 0};

static attn_sdpa_desc packed_desc(int64_t D, attn_dtype t) {
    attn_sdpa_desc d = desc_of(1, 4, 2, 40, 50, D, t);
    d.batch = 3;
    const int64_t q[4] = {0, D, 4 * D, 1}, k[4] = {0, D, 2 * D, 1};
    memcpy(d.q_stride, q, sizeof q), memcpy(d.o_stride, q, sizeof q), memcpy(d.k_stride, k, sizeof k), memcpy(d.v_stride, k, sizeof k);
    return d;
}

static attn_status plan(attn__cuda_err *e, const attn__cuda_device *dev, attn_cuda_kernels kern, const attn_sdpa_desc *d,
                        const attn__cuda_seqs *s, attn__cuda_sdpa_plan *out) {
    return attn__cuda_plan_sdpa(e, dev, kern, d, s, NULL, NULL, NULL, NULL, out);
}

static const char *kernel_of(const attn_sdpa_desc *d, attn_cuda_kernels kern) {
    attn__cuda_err e = {{0}, cpu_ctx()};
    attn__cuda_sdpa_plan p;
    const attn_status st = plan(&e, &h100, kern, d, NULL, &p);
    attn_ctx_free(e.host);
    if (st != ATTN_OK) FAIL("plan: %s", e.msg);
    return attn__cuda_kernel_name(p.kernel);
}

// Every bad descriptor gets the CPU's status and message, through the same shared check.
static void test_rejects_as_cpu(void) {
    attn__cuda_err e = {{0}, cpu_ctx()};
    attn_ctx *cpu = cpu_ctx();
    for (int c = 0; c < 12; c++) {
        attn_sdpa_desc d = desc_of(2, 4, 2, 16, 16, 64, ATTN_DTYPE_BF16);
        switch (c) {
        case 0: d.batch = 0; break;
        case 1: d.n_kv_heads = 3; break;
        case 2: d.head_dim = -1; break;
        case 3: d.causal = (attn_causal)7; break;
        case 4: d.scale = NAN; break;
        case 5: d.o_stride[2] = 0; break;
        case 6: d.softcap = -1.0f; break;
        case 7: d.use_window = 1, d.window_left = -2; break;
        case 8: d.q_dtype = (attn_dtype)99; break;
        case 9: d.mask = &d, d.mask_dtype = ATTN_DTYPE_F16; break;
        case 10: d.dropout_p = 1.5; break;
        case 11: d.q_stride[0] = d.q_stride[1] = INT64_MAX / 2; break;
        }
        attn__cuda_sdpa_plan p;
        const attn_status want = attn_sdpa_desc_check(cpu, &d);
        if (want == ATTN_OK) FAIL("case %d: the CPU accepts the descriptor", c);
        ASSERT_STATUS(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, &p), want);
        if (strcmp(e.msg, attn_ctx_last_error(cpu)) != 0) FAIL("case %d: '%s' != '%s'", c, e.msg, attn_ctx_last_error(cpu));
    }
    ASSERT_STATUS(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, NULL, NULL, &(attn__cuda_sdpa_plan){0}), ATTN_ERR_INVALID_ARG);
    attn_ctx_free(cpu);
    attn_ctx_free(e.host);
}

// What the CPU takes and the GPU does not: dropout, weights, sinks, quantised k/v, huge head dims.
static void test_gpu_limits(void) {
    attn__cuda_err e = {{0}, cpu_ctx()};
    attn__cuda_sdpa_plan p;
    attn_sdpa_desc d = desc_of(1, 2, 2, 8, 8, 64, ATTN_DTYPE_F32);
    d.weights_mode = ATTN_WEIGHTS_PER_HEAD;
    ASSERT_STATUS(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, &p), ATTN_ERR_UNSUPPORTED);
    d = desc_of(1, 2, 2, 8, 8, 64, ATTN_DTYPE_BF16);
    const float sinks[2] = {0.5f, -1.0f};
    d.sinks = sinks;
    ASSERT_OK(attn_sdpa_desc_check(e.host, &d)); // the CPU takes them
    ASSERT_STATUS(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, &p), ATTN_ERR_UNSUPPORTED);
    ASSERT_TRUE(strstr(e.msg, "sinks") != NULL);
    d = desc_of(1, 2, 2, 8, 8, 64, ATTN_DTYPE_F32);
    d.kv_dtype = ATTN_DTYPE_Q8_0;
    ASSERT_STATUS(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, &p), ATTN_ERR_UNSUPPORTED);
    ASSERT_TRUE(strstr(e.msg, "Q8_0") != NULL || strstr(e.msg, "q8_0") != NULL);
    d = desc_of(1, 2, 2, 8, 8, 2048, ATTN_DTYPE_F32);
    ASSERT_STATUS(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, &p), ATTN_ERR_UNSUPPORTED);
    d = desc_of(1, 2, 2, 8, 8, 1024, ATTN_DTYPE_F32); // 4 warps x (1024 + 1024) floats: 32 KiB, fits
    ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, &p));
    attn__cuda_device small = h100;
    small.smem_optin = 16384; // a device with less shared memory than the simple kernel needs
    ASSERT_STATUS(plan(&e, &small, ATTN_CUDA_KERNELS_AUTO, &d, NULL, &p), ATTN_ERR_UNSUPPORTED);
    attn_ctx_free(e.host);
}

// Tensor cores for aligned BF16/F16 views of the built head dims, the simple kernel otherwise.
static void test_kernel_choice(void) {
    const int64_t dims[] = {32, 64, 96, 128, 256};
    for (int i = 0; i < 5; i++) {
        attn_sdpa_desc d = desc_of(2, 8, 2, 200, 300, dims[i], ATTN_DTYPE_BF16);
        ASSERT_TRUE(strcmp(kernel_of(&d, ATTN_CUDA_KERNELS_AUTO), "flash") == 0);
        d.q_dtype = d.kv_dtype = d.out_dtype = ATTN_DTYPE_F16;
        ASSERT_TRUE(strcmp(kernel_of(&d, ATTN_CUDA_KERNELS_SM80), "flash") == 0);
        ASSERT_TRUE(strcmp(kernel_of(&d, ATTN_CUDA_KERNELS_SIMPLE), "simple") == 0);
    }
    attn_sdpa_desc d = desc_of(2, 8, 2, 200, 300, 128, ATTN_DTYPE_F32);
    ASSERT_TRUE(strcmp(kernel_of(&d, ATTN_CUDA_KERNELS_AUTO), "simple") == 0);
    d = desc_of(2, 8, 2, 200, 300, 80, ATTN_DTYPE_BF16); // no instance for D = 80
    ASSERT_TRUE(strcmp(kernel_of(&d, ATTN_CUDA_KERNELS_AUTO), "simple") == 0);
    d = desc_of(2, 8, 2, 200, 300, 64, ATTN_DTYPE_BF16);
    d.kv_dtype = ATTN_DTYPE_F16; // mixed types
    ASSERT_TRUE(strcmp(kernel_of(&d, ATTN_CUDA_KERNELS_AUTO), "simple") == 0);
    d = desc_of(2, 8, 2, 200, 300, 64, ATTN_DTYPE_BF16);
    d.head_dim_v = 32, d.v_stride[0] = 2 * 300 * 32, d.v_stride[1] = 300 * 32, d.v_stride[2] = 32;
    d.o_stride[0] = 8 * 200 * 32, d.o_stride[1] = 200 * 32, d.o_stride[2] = 32;
    ASSERT_TRUE(strcmp(kernel_of(&d, ATTN_CUDA_KERNELS_AUTO), "simple") == 0); // Dv != D
    d = desc_of(2, 8, 2, 200, 300, 64, ATTN_DTYPE_BF16);
    d.q_stride[2] = 68, d.q_stride[1] = 200 * 68, d.q_stride[0] = 8 * 200 * 68; // rows not 16-byte aligned
    ASSERT_TRUE(strcmp(kernel_of(&d, ATTN_CUDA_KERNELS_AUTO), "simple") == 0);
    d = desc_of(2, 8, 2, 200, 300, 64, ATTN_DTYPE_BF16);
    d.k_stride[3] = 2, d.k_stride[2] = 128, d.k_stride[1] = 300 * 128, d.k_stride[0] = 2 * 300 * 128; // D not unit stride
    ASSERT_TRUE(strcmp(kernel_of(&d, ATTN_CUDA_KERNELS_AUTO), "simple") == 0);
    // (B, L, H, D) storage (torch's usual layout) is aligned: tensor cores.
    d = desc_of(2, 8, 2, 200, 300, 64, ATTN_DTYPE_BF16);
    const int64_t q[4] = {200 * 8 * 64, 64, 8 * 64, 1}, k[4] = {300 * 2 * 64, 64, 2 * 64, 1};
    memcpy(d.q_stride, q, sizeof q), memcpy(d.o_stride, q, sizeof q), memcpy(d.k_stride, k, sizeof k), memcpy(d.v_stride, k, sizeof k);
    ASSERT_TRUE(strcmp(kernel_of(&d, ATTN_CUDA_KERNELS_AUTO), "flash") == 0);
    // Every option keeps the tensor cores (the score rule runs on the tiles that need it).
    d.causal = ATTN_CAUSAL_BOTTOM_RIGHT, d.softcap = 30.0f, d.use_window = 1, d.window_left = 16, d.window_right = 0;
    ASSERT_TRUE(strcmp(kernel_of(&d, ATTN_CUDA_KERNELS_AUTO), "flash") == 0);
}

// A misaligned base pointer moves the call to the simple kernel.
static void test_pointer_alignment(void) {
    attn__cuda_err e = {{0}, cpu_ctx()};
    attn__cuda_sdpa_plan p;
    attn_sdpa_desc d = desc_of(1, 2, 2, 64, 64, 64, ATTN_DTYPE_F16);
    const void *good = (const void *)(uintptr_t)0x10000, *odd = (const void *)(uintptr_t)0x10002;
    ASSERT_OK(attn__cuda_plan_sdpa(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, good, good, good, good, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_FLASH);
    ASSERT_OK(attn__cuda_plan_sdpa(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, good, odd, good, good, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_SIMPLE);
    ASSERT_OK(attn__cuda_plan_sdpa(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, good, good, good, odd, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_SIMPLE);
    attn_ctx_free(e.host);
}

// Resolved parameters: scale, strides of extent-1 dimensions, GQA group, grid, lse strides.
static void test_parameters(void) {
    attn__cuda_err e = {{0}, cpu_ctx()};
    attn__cuda_sdpa_plan p;
    attn_sdpa_desc d = desc_of(3, 8, 2, 300, 500, 128, ATTN_DTYPE_BF16);
    ASSERT_OK(plan(&e, &a100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_FLASH);
    ASSERT_TRUE(fabsf(p.p.scale - 1.0f / sqrtf(128.0f)) < 1e-7f);
    ASSERT_EQ_INT(p.p.group, 4);
    ASSERT_EQ_INT(p.row_blocks, 3); // ceil(300 / 128)
    ASSERT_EQ_INT(p.p.lse_stride[0], 8 * 300);
    ASSERT_EQ_INT(p.p.lse_stride[1], 300);
    ASSERT_EQ_INT(p.ws_bytes, 0);
    ASSERT_TRUE(attn__cuda_flash_smem(256) <= a100.smem_optin); // every instance fits an A100
    ASSERT_TRUE(attn__cuda_flash_smem(80) == 0);
    d = desc_of(1, 1, 1, 5, 7, 16, ATTN_DTYPE_F32);
    d.scale = 0.25f;
    ASSERT_OK(plan(&e, &a100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_DECODE); // 5 query rows per kv head
    ASSERT_OK(plan(&e, &a100, ATTN_CUDA_KERNELS_SIMPLE, &d, NULL, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_SIMPLE);
    ASSERT_TRUE(p.p.scale == 0.25f);
    ASSERT_EQ_INT(p.row_blocks, 2); // ceil(5 / 4)
    ASSERT_EQ_INT(p.p.q_stride[0], 0);
    ASSERT_EQ_INT(p.p.q_stride[1], 0);
    ASSERT_EQ_INT(p.p.q_stride[2], 16);
    attn_ctx_free(e.host);
}

// Packed batches: the CPU's offset checks, lse (H, total_q), the workspace for the offsets.
static void test_varlen(void) {
    attn__cuda_err e = {{0}, cpu_ctx()};
    attn_ctx *cpu = cpu_ctx();
    attn__cuda_sdpa_plan p;
    attn_sdpa_desc d = packed_desc(64, ATTN_DTYPE_BF16);
    attn__cuda_seqs s = packed_seqs;
    ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, &s, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_FLASH);
    ASSERT_EQ_INT(p.total_q, 77);
    ASSERT_EQ_INT(p.p.lse_stride[1], 77);
    ASSERT_EQ_INT(p.p.q_stride[0], 0);
    ASSERT_TRUE(p.ws_bytes >= 8 * sizeof(int64_t));
    // offsets the CPU refuses: decreasing, past len_q, not from 0, NULL
    const int64_t bad[3][4] = {{0, 30, 20, 77}, {0, 10, 55, 77}, {1, 10, 50, 77}};
    for (int c = 0; c < 3; c++) {
        s.cu_q = bad[c];
        const attn_status want = attn_sdpa_varlen_desc_check(cpu, &d, bad[c], packed_ck);
        if (want == ATTN_OK) FAIL("case %d: the CPU accepts the offsets", c);
        ASSERT_STATUS(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, &s, &p), want);
        ASSERT_TRUE(strcmp(e.msg, attn_ctx_last_error(cpu)) == 0);
    }
    s.cu_q = NULL;
    ASSERT_STATUS(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, &s, &p), ATTN_ERR_INVALID_ARG);
    // len_q and len_kv only bound the sequences: the grids follow the longest (40 queries, 50 keys),
    // however loose the bounds (2^62 overflowed the planner's arithmetic before; fuzz_cuda_plan)
    s = packed_seqs;
    d.len_q = d.len_kv = (int64_t)1 << 62;
    ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, &s, &p));
    ASSERT_EQ_INT(p.p.L, 40);
    ASSERT_EQ_INT(p.p.S, 50);
    ASSERT_EQ_INT(p.row_blocks, 1);
    ASSERT_OK(attn__cuda_plan_sdpa_bwd(&e, &h100, ATTN_CUDA_KERNELS_AUTO, false, &d, &s, false, NULL, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_FLASH);
    static const int64_t empty[4] = {0, 0, 0, 0}; // no query: refused as on the CPU (so the longest is >= 1)
    s.cu_q = empty;
    ASSERT_STATUS(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, &s, &p), ATTN_ERR_BAD_SHAPE);
    d = packed_desc(64, ATTN_DTYPE_BF16);
    // one query and one key per sequence (decoding): the rows still follow each other, so the row
    // strides stay although len_q = len_kv = 1
    static const int64_t one_q[4] = {0, 1, 2, 3};
    d.len_q = d.len_kv = 1, s.cu_q = one_q, s.cu_k = one_q;
    ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, &s, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_DECODE_VEC); // BF16, D = 64, 2 rows per kv head
    ASSERT_EQ_INT(p.p.q_stride[2], 4 * 64);
    ASSERT_EQ_INT(p.p.o_stride[2], 4 * 64);
    ASSERT_EQ_INT(p.p.k_stride[2], 2 * 64);
    ASSERT_EQ_INT(p.p.v_stride[2], 2 * 64);
    attn_ctx_free(cpu);
    attn_ctx_free(e.host);
}

// Dropout: the context generator's is refused (CPU-only, the message names the GPU's source), the
// Philox one resolved into the parameters the kernels read (threshold, keep scale, seed, offset).
static void test_dropout(void) {
    attn__cuda_err e = {{0}, cpu_ctx()};
    attn__cuda_sdpa_plan p;
    attn_sdpa_desc d = desc_of(1, 2, 2, 64, 64, 64, ATTN_DTYPE_BF16);
    d.dropout_p = 0.25;
    ASSERT_STATUS(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, &p), ATTN_ERR_UNSUPPORTED);
    ASSERT_TRUE(strstr(e.msg, "ATTN_DROPOUT_RNG_PHILOX") != NULL);
    d.dropout_rng = ATTN_DROPOUT_RNG_PHILOX, d.dropout_seed = 0x1234567890ull, d.dropout_offset = 77;
    ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_FLASH); // the tensor-core kernel drops weights too
    ASSERT_EQ_INT(p.p.dropout, 1);
    ASSERT_EQ_U64(p.p.drop_threshold, (uint64_t)3 << 30);
    ASSERT_TRUE(p.p.keep_scale == 1.0f / 0.75f);
    ASSERT_EQ_U64(p.p.drop_seed, 0x1234567890ull);
    ASSERT_EQ_INT(p.p.drop_offset, 77);
    d.dropout_p = 0.0; // no dropout: nothing to draw, whatever the source
    ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, &p));
    ASSERT_EQ_INT(p.p.dropout, 0);
    attn_ctx_free(e.host);
}

// The backward's plan: the forward's checks, room for rowdot (one float per query row, after the
// offsets of a packed batch), the mask gradient refused, gradient views checked.
static void test_backward(void) {
    attn__cuda_err e = {{0}, cpu_ctx()};
    attn__cuda_sdpa_plan p;
    attn_sdpa_desc d = desc_of(2, 8, 2, 300, 500, 128, ATTN_DTYPE_BF16);
    ASSERT_OK(attn__cuda_plan_sdpa_bwd(&e, &h100, ATTN_CUDA_KERNELS_SIMPLE, false, &d, NULL, false, NULL, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_SIMPLE);
    ASSERT_EQ_INT(p.row_blocks, 75);
    ASSERT_TRUE(p.ws_rowdot + 2 * 8 * 300 * sizeof(float) <= p.ws_bytes - (ATTN__CU_WS_ALIGN - 1));
    ASSERT_EQ_U64(p.ws_dq_acc, 0); // no accumulator for the simple kernels
    ASSERT_EQ_INT(p.p.grad_dtype, ATTN_DTYPE_F32);
    d.grad_dtype = ATTN_DTYPE_BF16;
    ASSERT_OK(attn__cuda_plan_sdpa_bwd(&e, &h100, ATTN_CUDA_KERNELS_AUTO, false, &d, NULL, false, NULL, &p));
    ASSERT_EQ_INT(p.p.grad_dtype, ATTN_DTYPE_BF16);
    // the mask's gradient: an F32 mask needed (as on the CPU); then the simple kernels, the
    // extent the mask's strides reach to zero
    ASSERT_STATUS(attn__cuda_plan_sdpa_bwd(&e, &h100, ATTN_CUDA_KERNELS_AUTO, false, &d, NULL, true, NULL, &p), ATTN_ERR_BAD_MASK);
    ASSERT_TRUE(strstr(e.msg, "F32 attention mask") != NULL);
    static const uint8_t bmask[1] = {0};
    attn_sdpa_desc md = d;
    md.mask = bmask, md.mask_dtype = ATTN_DTYPE_BOOL, md.mask_stride[2] = 500, md.mask_stride[3] = 1;
    ASSERT_STATUS(attn__cuda_plan_sdpa_bwd(&e, &h100, ATTN_CUDA_KERNELS_AUTO, false, &md, NULL, true, NULL, &p), ATTN_ERR_BAD_MASK);
    static const float fmask[1] = {0};
    md.mask = fmask, md.mask_dtype = ATTN_DTYPE_F32; // (L, S) broadcast over B and H
    ASSERT_OK(attn__cuda_plan_sdpa_bwd(&e, &h100, ATTN_CUDA_KERNELS_AUTO, false, &md, NULL, false, NULL, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_FLASH); // without dmask the tensor cores take it
    ASSERT_EQ_INT(p.p.mask_extent, 0);
    ASSERT_OK(attn__cuda_plan_sdpa_bwd(&e, &h100, ATTN_CUDA_KERNELS_AUTO, false, &md, NULL, true, NULL, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_SIMPLE);
    ASSERT_EQ_INT(p.p.mask_extent, 300 * 500);
    md.mask_stride[0] = 8 * 300 * 500, md.mask_stride[1] = 300 * 500; // a full (B, H, L, S) mask
    ASSERT_OK(attn__cuda_plan_sdpa_bwd(&e, &h100, ATTN_CUDA_KERNELS_AUTO, false, &md, NULL, true, NULL, &p));
    ASSERT_EQ_INT(p.p.mask_extent, 2 * 8 * 300 * 500);
    // a mask whose largest offset fits int64_t but not its bytes: refused by the shared check (the
    // planner added 1 to an offset of INT64_MAX before; found by fuzz_cuda_plan)
    md.mask_stride[0] = INT64_MAX, md.mask_stride[1] = md.mask_stride[2] = md.mask_stride[3] = 0;
    ASSERT_STATUS(attn__cuda_plan_sdpa_bwd(&e, &h100, ATTN_CUDA_KERNELS_AUTO, false, &md, NULL, true, NULL, &p), ATTN_ERR_OVERFLOW);
    ASSERT_TRUE(strstr(e.msg, "sdpa: mask: the bytes") != NULL);
    attn_sdpa_desc bad = d;
    bad.k_stride[2] = 0; // one key row broadcast: fine for the forward, not for dk
    ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &bad, NULL, &p));
    ASSERT_STATUS(attn__cuda_plan_sdpa_bwd(&e, &h100, ATTN_CUDA_KERNELS_AUTO, false, &bad, NULL, false, NULL, &p), ATTN_ERR_INVALID_ARG);
    bad = d, bad.grad_dtype = ATTN_DTYPE_Q8_0; // the shared check refuses it first, as the CPU does
    ASSERT_STATUS(attn__cuda_plan_sdpa_bwd(&e, &h100, ATTN_CUDA_KERNELS_AUTO, false, &bad, NULL, false, NULL, &p), ATTN_ERR_INVALID_ARG);
    bad = d, bad.head_dim = 1024; // 4 warps x 2 x (1024 + 1024) floats: 64 KiB
    bad.head_dim_v = 1024;
    attn__cuda_device small = h100;
    small.smem_optin = 48 * 1024;
    ASSERT_STATUS(attn__cuda_plan_sdpa_bwd(&e, &small, ATTN_CUDA_KERNELS_AUTO, false, &bad, NULL, false, NULL, &p), ATTN_ERR_UNSUPPORTED);
    // packed: offsets first, then rowdot for H * total_q rows
    d = packed_desc(64, ATTN_DTYPE_F16);
    const attn__cuda_seqs s = packed_seqs;
    ASSERT_OK(attn__cuda_plan_sdpa_bwd(&e, &h100, ATTN_CUDA_KERNELS_AUTO, false, &d, &s, false, NULL, &p));
    ASSERT_TRUE(p.ws_rowdot >= 8 * sizeof(int64_t));
    ASSERT_TRUE(p.ws_rowdot + 4 * 77 * sizeof(float) <= p.ws_bytes - (ATTN__CU_WS_ALIGN - 1));
    attn_ctx_free(e.host);
}

#define ASSERT_NAME(got, want)                                                  \
    do {                                                                        \
        const char *got_ = (got);                                               \
        if (strcmp(got_, (want)) != 0) FAIL("kernel %s, expected %s", got_, (want)); \
    } while (0)

static const char *bwd_kernel_of(const attn__cuda_device *dev, attn_cuda_kernels kern, bool deterministic,
                                 const attn_sdpa_desc *d, const attn__cuda_bwd_tensors *t) {
    attn__cuda_err e = {{0}, cpu_ctx()};
    attn__cuda_sdpa_plan p;
    const attn_status st = attn__cuda_plan_sdpa_bwd(&e, dev, kern, deterministic, d, NULL, false, t, &p);
    attn_ctx_free(e.host);
    if (st != ATTN_OK) FAIL("plan: %s", e.msg);
    return attn__cuda_bwd_kernel_name(&p);
}

// The tensor-core backward: chosen where the forward's flash kernel would run and an instance exists
// (head dims 32-128; 256 only when SM80 or SM90 names the mma.sync kernels), on the tensors'
// alignment (out and dout included); deterministic selects its own name and drops the dQ
// accumulator; the workspace holds H * total_q rows of D floats for it after rowdot; shared memory
// within an A100's for every instance.
static void test_backward_flash_choice(void) {
    static const int64_t dims[] = {32, 64, 96, 128, 256};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        const attn_sdpa_desc d = desc_of(2, 8, 2, 300, 500, dims[i], ATTN_DTYPE_BF16);
        ASSERT_NAME(bwd_kernel_of(&h100, ATTN_CUDA_KERNELS_AUTO, false, &d, NULL), dims[i] <= 128 ? "flash" : "simple");
        ASSERT_NAME(bwd_kernel_of(&h100, ATTN_CUDA_KERNELS_SM90, false, &d, NULL), "flash");
        ASSERT_NAME(bwd_kernel_of(&a100, ATTN_CUDA_KERNELS_SM80, true, &d, NULL), "flash-deterministic");
        ASSERT_NAME(bwd_kernel_of(&h100, ATTN_CUDA_KERNELS_SIMPLE, false, &d, NULL), "simple");
        ASSERT_TRUE(attn__cuda_flash_bwd_smem((int)dims[i], true) <= a100.smem_optin);
        ASSERT_TRUE(attn__cuda_flash_bwd_smem((int)dims[i], false) <= attn__cuda_flash_bwd_smem((int)dims[i], true));
    }
    ASSERT_EQ_U64(attn__cuda_flash_bwd_smem(40, true), 0);
    ASSERT_EQ_U64(attn__cuda_flash_bwd_smem(512, false), 0);
    // D = 128, atomic mode: key tiles of 64, query tiles of 32 rows, K, V, Q, dO padded rows, dS^T,
    // lse and D: (2*64 + 2*32) * 136 * 2 + 64 * 40 * 2 + 2 * 32 * 4 bytes
    ASSERT_EQ_U64(attn__cuda_flash_bwd_smem(128, false), 192 * 136 * 2 + 64 * 40 * 2 + 256);
    ASSERT_EQ_U64(attn__cuda_flash_bwd_smem(128, true), (2 * 64 + 2 * 2 * 64) * 136 * 2); // dQ kernel: Q, dO, 2 stages of K, V
    // D = 256: the same tiles with rows of 264; the dQ kernel's key tiles of 32
    ASSERT_EQ_U64(attn__cuda_flash_bwd_smem(256, false), 192 * 264 * 2 + 64 * 40 * 2 + 256);
    ASSERT_EQ_U64(attn__cuda_flash_bwd_smem(256, true), (2 * 64 + 2 * 2 * 32) * 264 * 2);
    attn_sdpa_desc d = desc_of(2, 8, 2, 300, 500, 256, ATTN_DTYPE_BF16); // runs forward on flash ...
    ASSERT_NAME(kernel_of(&d, ATTN_CUDA_KERNELS_AUTO), "flash");
    ASSERT_NAME(bwd_kernel_of(&h100, ATTN_CUDA_KERNELS_AUTO, false, &d, NULL), "simple"); // ... AUTO's backward not yet
    ASSERT_NAME(bwd_kernel_of(&h100, ATTN_CUDA_KERNELS_SM80, false, &d, NULL), "flash");
    d = desc_of(2, 8, 2, 300, 500, 64, ATTN_DTYPE_F32);
    ASSERT_NAME(bwd_kernel_of(&h100, ATTN_CUDA_KERNELS_AUTO, false, &d, NULL), "simple");
    d = desc_of(2, 8, 2, 300, 500, 64, ATTN_DTYPE_F16);
    d.kv_dtype = ATTN_DTYPE_BF16; // mixed types
    ASSERT_NAME(bwd_kernel_of(&h100, ATTN_CUDA_KERNELS_AUTO, false, &d, NULL), "simple");
    d = desc_of(2, 8, 2, 300, 500, 64, ATTN_DTYPE_F16);
    d.head_dim_v = 32, d.v_stride[0] = 2 * 500 * 32, d.v_stride[1] = 500 * 32, d.v_stride[2] = 32;
    d.o_stride[0] = 8 * 300 * 32, d.o_stride[1] = 300 * 32, d.o_stride[2] = 32;
    ASSERT_NAME(bwd_kernel_of(&h100, ATTN_CUDA_KERNELS_AUTO, false, &d, NULL), "simple"); // D != Dv
    attn__cuda_device old = h100;
    old.cc_major = 7, old.cc_minor = 5;
    d = desc_of(2, 8, 2, 300, 500, 64, ATTN_DTYPE_F16);
    ASSERT_NAME(bwd_kernel_of(&old, ATTN_CUDA_KERNELS_AUTO, false, &d, NULL), "simple");
    attn__cuda_device small = h100;
    small.smem_optin = 48 * 1024; // the D = 128 kernels need more
    d = desc_of(2, 8, 2, 300, 500, 128, ATTN_DTYPE_F16);
    ASSERT_NAME(bwd_kernel_of(&small, ATTN_CUDA_KERNELS_AUTO, false, &d, NULL), "simple");
    // the tensors' alignment, one at a time: a 16-byte aligned base, then one 8-byte aligned
    static _Alignas(16) unsigned char buf[64];
    const void *al = buf, *mis = buf + 8;
    attn__cuda_bwd_tensors t = {al, al, al, al, al};
    ASSERT_NAME(bwd_kernel_of(&h100, ATTN_CUDA_KERNELS_AUTO, false, &d, &t), "flash");
    for (int which = 0; which < 5; which++) {
        attn__cuda_bwd_tensors u = t;
        const void **f[5] = {&u.q, &u.k, &u.v, &u.out, &u.dout};
        *f[which] = mis;
        ASSERT_NAME(bwd_kernel_of(&h100, ATTN_CUDA_KERNELS_AUTO, false, &d, &u), "simple");
    }
    d.o_stride[2] = 132; // a row stride not a multiple of 8 elements (out and dout share it)
    d.o_stride[1] = 300 * 132, d.o_stride[0] = 8 * 300 * 132;
    ASSERT_NAME(bwd_kernel_of(&h100, ATTN_CUDA_KERNELS_AUTO, false, &d, NULL), "simple");

    // workspace: rowdot, then the dQ accumulator (atomic mode only); packed batches after the offsets
    attn__cuda_err e = {{0}, cpu_ctx()};
    attn__cuda_sdpa_plan p;
    d = desc_of(2, 8, 2, 300, 500, 64, ATTN_DTYPE_BF16);
    ASSERT_OK(attn__cuda_plan_sdpa_bwd(&e, &h100, ATTN_CUDA_KERNELS_AUTO, false, &d, NULL, false, NULL, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_FLASH);
    ASSERT_TRUE(!p.deterministic);
    ASSERT_TRUE(p.ws_dq_acc >= p.ws_rowdot + 2 * 8 * 300 * sizeof(float));
    ASSERT_TRUE(p.ws_dq_acc % ATTN__CU_WS_ALIGN == 0);
    ASSERT_TRUE(p.ws_dq_acc + 2 * 8 * 300 * 64 * sizeof(float) <= p.ws_bytes - (ATTN__CU_WS_ALIGN - 1));
    const size_t atomic_bytes = p.ws_bytes;
    ASSERT_OK(attn__cuda_plan_sdpa_bwd(&e, &h100, ATTN_CUDA_KERNELS_AUTO, true, &d, NULL, false, NULL, &p));
    ASSERT_TRUE(p.deterministic);
    ASSERT_EQ_U64(p.ws_dq_acc, 0);
    ASSERT_TRUE(p.ws_bytes + 2 * 8 * 300 * 64 * sizeof(float) <= atomic_bytes);
    ASSERT_TRUE(p.ws_rowdot + 2 * 8 * 300 * sizeof(float) <= p.ws_bytes - (ATTN__CU_WS_ALIGN - 1));
    d = packed_desc(32, ATTN_DTYPE_F16);
    const attn__cuda_seqs s = packed_seqs;
    ASSERT_OK(attn__cuda_plan_sdpa_bwd(&e, &h100, ATTN_CUDA_KERNELS_AUTO, false, &d, &s, false, NULL, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_FLASH);
    ASSERT_TRUE(p.ws_rowdot >= 8 * sizeof(int64_t));
    ASSERT_TRUE(p.ws_dq_acc >= p.ws_rowdot + 4 * 77 * sizeof(float));
    ASSERT_TRUE(p.ws_dq_acc + 4 * 77 * 32 * sizeof(float) <= p.ws_bytes - (ATTN__CU_WS_ALIGN - 1));
    attn_ctx_free(e.host);
}

// Few query rows per kv head: split-KV decoding, splits of a multiple of 32 keys sized so the device
// holds every warp at once (the vector form: 12 warps an SM; the general form 32), their partial
// results in the workspace; otherwise the other kernels.
static void test_decode_choice(void) {
    attn__cuda_err e = {{0}, cpu_ctx()};
    attn__cuda_sdpa_plan p;
    attn_sdpa_desc d = desc_of(8, 32, 8, 1, 32768, 128, ATTN_DTYPE_BF16); // one token, GQA group of 4
    d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_DECODE_VEC); // BF16, D = 128, 16-byte rows, bounds only
    ASSERT_TRUE(strcmp(attn__cuda_kernel_name(p.kernel), "decode-vec") == 0);
    ASSERT_EQ_INT(p.decode_rows, 4);
    ASSERT_EQ_INT(p.split_keys % 32, 0);
    ASSERT_TRUE(p.n_splits * p.split_keys >= 32768 && (p.n_splits - 1) * p.split_keys < 32768);
    ASSERT_TRUE(8 * 8 * p.n_splits <= 132 * 12 && 8 * 8 * p.n_splits >= 132 * 12 / 2); // one full wave
    ASSERT_TRUE(p.ws_part + (size_t)(8 * 8 * p.n_splits * 4 * 130) * sizeof(float) <= p.ws_bytes);
    // the vector form's conditions, one at a time: otherwise the general decode kernel
    {
        const attn_sdpa_desc v = d;
        attn_sdpa_desc x = v;
        x.softcap = 30.0f; // an element-wise term
        ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &x, NULL, &p));
        ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_DECODE);
        ASSERT_TRUE(8 * 8 * p.n_splits <= 132 * 32 && 8 * 8 * p.n_splits >= 132 * 32 / 2); // 32 warps an SM
        x = v, x.dropout_p = 0.1, x.dropout_rng = ATTN_DROPOUT_RNG_PHILOX;
        ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &x, NULL, &p));
        ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_DECODE);
        x = desc_of(8, 32, 8, 1, 32768, 96, ATTN_DTYPE_BF16); // no D = 96 instance
        ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &x, NULL, &p));
        ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_DECODE);
        x = desc_of(8, 64, 8, 1, 32768, 128, ATTN_DTYPE_BF16); // 8 rows per kv head
        ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &x, NULL, &p));
        ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_DECODE);
        x = v, x.k_stride[2] = 132; // key rows not 16-byte aligned
        ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &x, NULL, &p));
        ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_DECODE);
        x = v, x.q_dtype = x.kv_dtype = x.out_dtype = ATTN_DTYPE_F16;
        ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &x, NULL, &p));
        ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_DECODE_VEC);
    }
    d = desc_of(1, 4, 4, 1, 10, 64, ATTN_DTYPE_F32); // few keys: one split of 32
    ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_DECODE);
    ASSERT_EQ_INT(p.n_splits, 1);
    ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_SIMPLE, &d, NULL, &p)); // forced kernels are kept
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_SIMPLE);
    d = desc_of(1, 32, 8, 4, 4096, 256, ATTN_DTYPE_BF16); // 16 rows of 256 dims: flash
    ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_FLASH);
    d = desc_of(1, 32, 8, 5, 4096, 64, ATTN_DTYPE_BF16); // 20 rows per kv head
    ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_AUTO, &d, NULL, &p));
    ASSERT_EQ_INT(p.kernel, ATTN__CU_KERNEL_FLASH);
    attn_ctx_free(e.host);
}

// The Hopper forward: only when asked (ATTN_CUDA_KERNELS_SM90), on compute capability 9.x, for the
// "flash" calls of head dims 64 and 128 with the bounds alone, no dropout and keys in sequence order;
// every other call gets what SM80 gives it; the backward keeps its own kernels.
static void test_sm90_choice(void) {
    attn__cuda_err e = {{0}, cpu_ctx()};
    attn__cuda_sdpa_plan p;
    for (int t = 0; t < 2; t++)
        for (int64_t D = 32; D <= 256; D += 32) {
            const attn_dtype dt = t == 0 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
            const bool built = D == 64 || D == 128;
            for (int c = 0; c < 3; c++) { // plain, causal bottom-right, window
                attn_sdpa_desc d = desc_of(2, 8, 2, 200, 300, D, dt);
                if (c == 1) d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
                if (c == 2) d.use_window = 1, d.window_left = 17, d.window_right = 3;
                const char *sm80 = kernel_of(&d, ATTN_CUDA_KERNELS_SM80);
                ASSERT_NAME(kernel_of(&d, ATTN_CUDA_KERNELS_SM90), built ? "flash-sm90" : sm80);
                ASSERT_NAME(kernel_of(&d, ATTN_CUDA_KERNELS_AUTO), sm80); // not chosen by AUTO
                ASSERT_OK(plan(&e, &a100, ATTN_CUDA_KERNELS_SM90, &d, NULL, &p)); // an sm_80 device
                ASSERT_NAME(attn__cuda_kernel_name(p.kernel), sm80);
                if (built) {
                    ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_SM90, &d, NULL, &p));
                    ASSERT_EQ_INT(p.row_blocks, 2); // 128-row query tiles
                    ASSERT_EQ_INT(p.ws_bytes, 0);
                }
            }
        }
    // what it does not take: element-wise terms, dropout, pages, F32, too little shared memory, no sm_90a code
    for (int c = 0; c < 9; c++) {
        attn_sdpa_desc d = desc_of(2, 8, 2, 200, 300, 128, ATTN_DTYPE_BF16);
        float slopes[8] = {0};
        attn__cuda_device dev = h100;
        const attn__cuda_seqs paged = {packed_cq, packed_ck, 16};
        const attn__cuda_seqs *seqs = NULL;
        switch (c) {
        case 0: d.mask = &d, d.mask_dtype = ATTN_DTYPE_BOOL; break;
        case 1: d.key_padding_mask = &d, d.key_padding_mask_dtype = ATTN_DTYPE_BOOL; break;
        case 2: d.alibi_slopes = slopes; break;
        case 3: d.softcap = 30.0f; break;
        case 4: d.dropout_p = 0.1, d.dropout_rng = ATTN_DROPOUT_RNG_PHILOX; break;
        case 5: d = packed_desc(128, ATTN_DTYPE_BF16), seqs = &paged; break;
        case 6: d = desc_of(2, 8, 2, 200, 300, 128, ATTN_DTYPE_F32); break;
        case 7: dev.smem_optin = attn__cuda_flash_sm90_smem(128) - 1; break;
        case 8: dev.flash_sm90 = false; break; // a build without sm_90a code
        }
        const attn_status st = plan(&e, &dev, ATTN_CUDA_KERNELS_SM90, &d, seqs, &p);
        if (st != ATTN_OK) FAIL("case %d: %s", c, e.msg);
        if (p.kernel == ATTN__CU_KERNEL_FLASH_SM90) FAIL("case %d took flash-sm90", c);
    }
    // packed batches take it (the tile of a sequence's rows)
    attn_sdpa_desc d = packed_desc(64, ATTN_DTYPE_BF16);
    ASSERT_OK(plan(&e, &h100, ATTN_CUDA_KERNELS_SM90, &d, &packed_seqs, &p));
    ASSERT_NAME(attn__cuda_kernel_name(p.kernel), "flash-sm90");
    ASSERT_EQ_INT(attn__cuda_flash_sm90_smem(128), (128 + 4 * 128) * 128 * 2 + 1024);
    ASSERT_EQ_INT(attn__cuda_flash_sm90_smem(96), 0);
    // the backward plans its own kernels
    d = desc_of(2, 8, 2, 200, 300, 128, ATTN_DTYPE_BF16);
    ASSERT_OK(attn__cuda_plan_sdpa_bwd(&e, &h100, ATTN_CUDA_KERNELS_SM90, false, &d, NULL, false, NULL, &p));
    ASSERT_NAME(attn__cuda_bwd_kernel_name(&p), "flash");
    attn_ctx_free(e.host);
}

static void test_workspace_offsets(void) {
    size_t used = 0;
    ASSERT_EQ_INT(attn__cuda_ws_take(&used, 10), 0);
    ASSERT_EQ_INT(attn__cuda_ws_take(&used, 1), ATTN__CU_WS_ALIGN);
    ASSERT_EQ_INT(used, ATTN__CU_WS_ALIGN + 1);
}

// A device KV cache's geometry: strides of the contiguous and paged layouts, whole pages, the
// sizes' checks without overflow in the arithmetic (UBSan builds run this), the page table's int32
// entries; an append's offsets and its refusals.
static void test_kv_layout(void) {
    attn__cuda_err e = {{0}, NULL};
    attn_cuda_kv_cache_config c;
    memset(&c, 0, sizeof c);
    c.batch = 3, c.n_kv_heads = 2, c.head_dim = 64, c.head_dim_v = 32, c.capacity = 100, c.dtype = ATTN_DTYPE_BF16;
    attn__cuda_kv_layout l;
    ASSERT_OK(attn__cuda_kv_layout_of(&e, &c, &l));
    ASSERT_EQ_INT(l.pages, 0);
    ASSERT_EQ_INT(l.Dv, 32);
    ASSERT_EQ_INT(l.k_elems, 3 * 2 * 100 * 64);
    ASSERT_EQ_INT(l.v_elems, 3 * 2 * 100 * 32);
    ASSERT_EQ_INT(l.k_stride[0], 2 * 100 * 64); ASSERT_EQ_INT(l.k_stride[1], 100 * 64); ASSERT_EQ_INT(l.k_stride[2], 64);
    ASSERT_EQ_INT(l.v_stride[0], 2 * 100 * 32); ASSERT_EQ_INT(l.v_stride[1], 100 * 32); ASSERT_EQ_INT(l.v_stride[2], 32);
    c.page_size = 16, c.head_dim_v = 0; // 7 pages of 16 tokens a sequence, (Hkv, 16, D) each
    ASSERT_OK(attn__cuda_kv_layout_of(&e, &c, &l));
    ASSERT_EQ_INT(l.pages, 7);
    ASSERT_EQ_INT(l.Dv, 64);
    ASSERT_EQ_INT(l.k_elems, 3 * 2 * 7 * 16 * 64);
    ASSERT_EQ_INT(l.k_stride[0], 2 * 16 * 64); ASSERT_EQ_INT(l.k_stride[1], 16 * 64); ASSERT_EQ_INT(l.k_stride[2], 64);
    // refusals: each field out of range, a quantised type
    const attn_cuda_kv_cache_config good = c;
    int64_t *const fields[] = {&c.batch, &c.n_kv_heads, &c.head_dim, &c.capacity};
    for (int f = 0; f < 4; f++) {
        c = good, *fields[f] = 0;
        ASSERT_STATUS(attn__cuda_kv_layout_of(&e, &c, &l), ATTN_ERR_BAD_SHAPE);
    }
    c = good, c.head_dim_v = -1;
    ASSERT_STATUS(attn__cuda_kv_layout_of(&e, &c, &l), ATTN_ERR_BAD_SHAPE);
    c = good, c.page_size = -1;
    ASSERT_STATUS(attn__cuda_kv_layout_of(&e, &c, &l), ATTN_ERR_BAD_SHAPE);
    c = good, c.dtype = ATTN_DTYPE_Q8_0;
    ASSERT_STATUS(attn__cuda_kv_layout_of(&e, &c, &l), ATTN_ERR_UNSUPPORTED);
    ASSERT_TRUE(strstr(e.msg, attn_dtype_name(ATTN_DTYPE_Q8_0)) != NULL);
    // sizes whose products overflow int64 at each step: batch times heads, the pages' rows, the
    // elements, their bytes
    c = good, c.batch = INT64_C(1) << 33, c.n_kv_heads = INT64_C(1) << 33;
    ASSERT_STATUS(attn__cuda_kv_layout_of(&e, &c, &l), ATTN_ERR_OVERFLOW);
    c = good, c.batch = 1, c.n_kv_heads = 1, c.head_dim = 1, c.capacity = INT64_MAX, c.page_size = INT64_MAX / 2 + 1;
    ASSERT_STATUS(attn__cuda_kv_layout_of(&e, &c, &l), ATTN_ERR_OVERFLOW); // two pages of 2^62 rows
    c = good, c.capacity = INT64_MAX, c.page_size = 3;
    ASSERT_STATUS(attn__cuda_kv_layout_of(&e, &c, &l), ATTN_ERR_OVERFLOW);
    c = good, c.batch = 1, c.n_kv_heads = 1, c.head_dim = 1, c.head_dim_v = 1, c.page_size = 0, c.capacity = INT64_MAX / 8 + 1;
    ASSERT_STATUS(attn__cuda_kv_layout_of(&e, &c, &l), ATTN_ERR_OVERFLOW); // elements past INT64_MAX / 8
    c.capacity = INT64_MAX / 8;
    ASSERT_OK(attn__cuda_kv_layout_of(&e, &c, &l));
    // a paged cache's table entries p B + b within int32, at the edge
    c = good, c.batch = 1, c.n_kv_heads = 1, c.head_dim = 1, c.page_size = 1, c.capacity = INT32_MAX;
    ASSERT_OK(attn__cuda_kv_layout_of(&e, &c, &l));
    c.capacity = (int64_t)INT32_MAX + 1;
    ASSERT_STATUS(attn__cuda_kv_layout_of(&e, &c, &l), ATTN_ERR_OVERFLOW);
    ASSERT_TRUE(strstr(e.msg, "page table") != NULL);
    // an append: offsets of the new tokens; a negative count; one past the capacity
    const int64_t len[3] = {0, 90, 100}, n_ok[3] = {5, 10, 0}, n_neg[3] = {1, -1, 0}, n_over[3] = {0, 11, 0};
    int64_t cu[4] = {-1, -1, -1, -1};
    ASSERT_OK(attn__cuda_kv_append_offsets(&e, 3, 100, len, n_ok, cu));
    ASSERT_EQ_INT(cu[0], 0); ASSERT_EQ_INT(cu[1], 5); ASSERT_EQ_INT(cu[2], 15); ASSERT_EQ_INT(cu[3], 15);
    ASSERT_STATUS(attn__cuda_kv_append_offsets(&e, 3, 100, len, n_neg, cu), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn__cuda_kv_append_offsets(&e, 3, 100, len, n_over, cu), ATTN_ERR_CAPACITY);
    ASSERT_TRUE(strstr(e.msg, "sequence 1 holds 90 of 100 tokens, 11 more") != NULL);
    const int64_t len_max[1] = {INT64_MAX - 1}, n_max[1] = {INT64_MAX};
    ASSERT_STATUS(attn__cuda_kv_append_offsets(&e, 1, INT64_MAX, len_max, n_max, cu), ATTN_ERR_CAPACITY);
}

// An attend call's descriptor against its cache: every field of the fit, the masks, the causal
// alignment; the message names both sides.
static void test_kv_attend_desc(void) {
    attn__cuda_err e = {{0}, NULL};
    attn_cuda_kv_cache_config c;
    memset(&c, 0, sizeof c);
    c.batch = 2, c.n_kv_heads = 2, c.head_dim = 64, c.capacity = 100, c.dtype = ATTN_DTYPE_F16;
    attn_sdpa_desc d = desc_of(2, 8, 2, 1, 1, 64, ATTN_DTYPE_F16);
    d.causal = ATTN_CAUSAL_BOTTOM_RIGHT;
    ASSERT_OK(attn__cuda_kv_check_desc(&e, &c, &d));
    d.n_kv_heads = 0, d.n_heads = 2; // kv heads = n_heads when 0
    ASSERT_OK(attn__cuda_kv_check_desc(&e, &c, &d));
    d.head_dim_v = 64;
    ASSERT_OK(attn__cuda_kv_check_desc(&e, &c, &d));
    const attn_sdpa_desc good = d;
    for (int k = 0; k < 5; k++) {
        d = good;
        if (k == 0) d.batch = 3;
        if (k == 1) d.n_kv_heads = 1;
        if (k == 2) d.head_dim = 32, d.head_dim_v = 0;
        if (k == 3) d.head_dim_v = 32;
        if (k == 4) d.kv_dtype = ATTN_DTYPE_BF16;
        ASSERT_STATUS(attn__cuda_kv_check_desc(&e, &c, &d), ATTN_ERR_BAD_SHAPE);
        ASSERT_TRUE(strstr(e.msg, "the cache holds (batch 2, 2 kv heads, dims 64/64, ") != NULL);
    }
    d = good, d.mask = &c;
    ASSERT_STATUS(attn__cuda_kv_check_desc(&e, &c, &d), ATTN_ERR_UNSUPPORTED);
    d = good, d.key_padding_mask = &c;
    ASSERT_STATUS(attn__cuda_kv_check_desc(&e, &c, &d), ATTN_ERR_UNSUPPORTED);
    d = good, d.causal = ATTN_CAUSAL_TOP_LEFT;
    ASSERT_STATUS(attn__cuda_kv_check_desc(&e, &c, &d), ATTN_ERR_INVALID_ARG);
    d = good, d.causal = ATTN_CAUSAL_NONE;
    ASSERT_OK(attn__cuda_kv_check_desc(&e, &c, &d));
    c.head_dim_v = 32, d = good, d.head_dim_v = 32; // a cache of other value dims
    ASSERT_OK(attn__cuda_kv_check_desc(&e, &c, &d));
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {HARNESS_CASE(test_rejects_as_cpu), HARNESS_CASE(test_gpu_limits),
                                         HARNESS_CASE(test_kernel_choice),  HARNESS_CASE(test_pointer_alignment),
                                         HARNESS_CASE(test_parameters),     HARNESS_CASE(test_varlen),
                                         HARNESS_CASE(test_workspace_offsets), HARNESS_CASE(test_dropout),
                                         HARNESS_CASE(test_backward), HARNESS_CASE(test_backward_flash_choice), HARNESS_CASE(test_decode_choice),
                                         HARNESS_CASE(test_sm90_choice), HARNESS_CASE(test_kv_layout),
                                         HARNESS_CASE(test_kv_attend_desc)};
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}

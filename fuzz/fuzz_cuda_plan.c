/*
 * fuzz_cuda_plan.c - fuzz target for libattn_cuda's host-side planner (src/cuda/plan.c): the checks
 * and decisions every GPU SDPA call makes before it launches anything, run here against described
 * devices (plain C: no GPU and no CUDA header needed, so it is built and replayed everywhere).
 *
 * The input chooses a device (compute capability, SM count, shared memory, the Hopper forward's
 * availability), the kernel choice (AUTO, SIMPLE, SM80, SM90), a descriptor (sizes small, zero,
 * negative or huge; contiguous, permuted, broadcast, padded, negative or huge strides; element
 * types in and out of range; masks, key padding, ALiBi, windows, soft caps, scales and dropout of
 * every kind), a plain or packed batch (offsets increasing or not, a paged cache's page size), the
 * tensors' alignment, and for the backward the deterministic flag and whether dmask is wanted.
 * It then plans the forward and the backward and checks, from attn_cuda.h, attn.h and docs/cuda.md:
 *  - a refusal is a known status with a one-line message, and only what those documents refuse
 *    is refused among calls the shared descriptor check accepts (GPU limits: dropout other than
 *    Philox, attention weights, non-float element types, head dims above 1024; dmask without an F32
 *    mask; the backward's zero strides; grids or shared memory past the device's);
 *  - a plan's kernel is one whose conditions hold (the tensor-core forward: BF16 or F16 throughout,
 *    head_dim = head_dim_v with an instance, 16-byte views, sm_80+, its shared memory; flash-sm90
 *    only when SM90 asks for it on a 9.0 device, head dims 64 and 128, no element-wise term, no
 *    dropout, no pages; split-KV decoding only with AUTO and at most 16 rows a kv head; the
 *    tensor-core backward at 32-128, at 256 only when SM80 or SM90 names it, never for dmask);
 *  - its launch geometry fits the grid's limit (every kernel's block count below 2^31) and covers
 *    the call (query tiles, decode splits of whole multiples of 32 keys covering S);
 *  - its workspace holds every piece at an aligned offset without wrapping, the dQ accumulator
 *    exactly in the backward's atomic mode;
 *  - the resolved scale is the descriptor's, or 1/sqrt(head_dim) for 0.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "attn_cuda.h"
#include "fuzz_data.h"
#include "fuzz_util.h"
#include "plan.h"

#define MAX_SEQS 8

/* ---- the input ------------------------------------------------------------------------------ */

static attn__cuda_device draw_device(fuzz_data *fd) {
    static const int majors[] = {7, 8, 8, 9, 9, 10, 12};
    static const size_t smem[] = {0, 16384, 49152, 101376, 166912, 232448};
    attn__cuda_device dev;
    dev.cc_major = majors[fuzz_data_pick(fd, sizeof majors / sizeof majors[0])];
    dev.cc_minor = fuzz_data_chance(fd, 3, 4) ? 0 : fuzz_data_int_range(fd, 1, 9);
    dev.sm_count = fuzz_data_chance(fd, 1, 16) ? fuzz_data_int_range(fd, 0, 1 << 20) : fuzz_data_int_range(fd, 1, 200);
    const size_t pick = fuzz_data_pick(fd, sizeof smem / sizeof smem[0] + 1);
    dev.smem_optin = pick < sizeof smem / sizeof smem[0] ? smem[pick] : (size_t)fuzz_data_u32(fd);
    dev.decode_pdl = dev.cc_major >= 9 && fuzz_data_bool(fd);
    // as ctx.c decides: compute capability 9.0 and sm_90a code in the library
    dev.flash_sm90 = dev.cc_major == 9 && dev.cc_minor == 0 && fuzz_data_chance(fd, 3, 4);
    return dev;
}

static int32_t draw_dtype(fuzz_data *fd) {
    static const int32_t common[] = {ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
    if (fuzz_data_chance(fd, 15, 16)) return common[fuzz_data_pick(fd, 3)];
    return fuzz_data_int_range(fd, -1, 12); /* BOOL, U8, Q8_0, Q4_0, unknown values */
}

static int64_t draw_dim(fuzz_data *fd) {
    static const int64_t dims[] = {32, 64, 96, 128, 256, 40, 8, 1, 80, 160, 192, 1024, 1032, 2048};
    if (fuzz_data_chance(fd, 1, 24)) return fuzz_data_i64_edge(fd);
    return dims[fuzz_data_pick(fd, sizeof dims / sizeof dims[0])];
}

/* a * b as the hardware wraps it (the input's sizes may be anything; the planner must cope). */
static int64_t wrap_mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
static int64_t wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }

/* Strides of a (n0, n1, n2, n3) tensor: contiguous in BHLD or BLHD order, rows padded, a broadcast
 * or edge value now and then, unit or not along the last dimension. */
static void draw_strides(fuzz_data *fd, int64_t s[4], const int64_t n[4]) {
    const int64_t pad = fuzz_data_chance(fd, 3, 4) ? 0 : fuzz_data_int_range(fd, 1, 16);
    const int64_t row = wrap_add(n[3], pad), plane = wrap_mul(wrap_mul(n[1], n[2]), row);
    if (fuzz_data_bool(fd)) s[3] = 1, s[2] = row, s[1] = wrap_mul(n[2], row), s[0] = plane;
    else s[3] = 1, s[1] = row, s[2] = wrap_mul(n[1], row), s[0] = plane;
    if (fuzz_data_chance(fd, 1, 8)) {
        const int which = fuzz_data_int_range(fd, 0, 3);
        s[which] = fuzz_data_chance(fd, 1, 2) ? fuzz_data_i64_range(fd, -4, 4) : fuzz_data_i64_edge(fd);
    }
}

/* A pointer that is never dereferenced: NULL, 16-byte aligned or 8 bytes off. */
static const void *draw_ptr(fuzz_data *fd, bool may_be_null) {
    const int k = fuzz_data_int_range(fd, 0, 7);
    if (k == 0 && may_be_null) return NULL;
    return (const void *)(uintptr_t)(0x10000 + (k == 7 ? 8 : 16 * k));
}

typedef struct problem {
    attn__cuda_device dev;
    attn_cuda_kernels kernels;
    attn_sdpa_desc d;
    bool packed, deterministic, dmask;
    int64_t cu_q[MAX_SEQS + 1], cu_k[MAX_SEQS + 1];
    attn__cuda_seqs seqs;
    const void *q, *k, *v, *out, *dout;
} problem;

static void draw_problem(fuzz_data *fd, problem *pr) {
    memset(pr, 0, sizeof *pr);
    pr->dev = draw_device(fd);
    pr->kernels = (attn_cuda_kernels)fuzz_data_int_range(fd, 0, 3);
    attn_sdpa_desc *d = &pr->d;
    attn_sdpa_desc_init(d);
    pr->packed = fuzz_data_chance(fd, 1, 4);
    d->batch = pr->packed ? fuzz_data_int_range(fd, 1, MAX_SEQS) : fuzz_data_size(fd, 1, 8, 1, 24);
    const int64_t hkv = fuzz_data_size(fd, 1, 8, 1, 32), group = fuzz_data_size(fd, 1, 8, 1, 32);
    d->n_kv_heads = fuzz_data_chance(fd, 1, 8) ? 0 : hkv;
    d->n_heads = fuzz_data_chance(fd, 1, 16) ? fuzz_data_size(fd, 1, 64, 1, 4) : wrap_mul(hkv, group);
    d->len_q = fuzz_data_chance(fd, 1, 3) ? fuzz_data_int_range(fd, 1, 4) : fuzz_data_size(fd, 1, 70000, 1, 24);
    d->len_kv = fuzz_data_size(fd, 1, 140000, 1, 24);
    d->head_dim = draw_dim(fd);
    d->head_dim_v = fuzz_data_chance(fd, 3, 4) ? 0 : draw_dim(fd);
    d->q_dtype = (attn_dtype)draw_dtype(fd);
    d->kv_dtype = fuzz_data_chance(fd, 7, 8) ? d->q_dtype : (attn_dtype)draw_dtype(fd);
    d->out_dtype = fuzz_data_chance(fd, 7, 8) ? d->q_dtype : (attn_dtype)draw_dtype(fd);
    d->grad_dtype = fuzz_data_chance(fd, 1, 2) ? ATTN_DTYPE_F32 : (attn_dtype)draw_dtype(fd);
    const int64_t H = d->n_heads, Hkv = d->n_kv_heads == 0 ? H : d->n_kv_heads;
    const int64_t D = d->head_dim, Dv = d->head_dim_v == 0 ? D : d->head_dim_v;
    const int64_t nq[4] = {d->batch, H, d->len_q, D}, nk[4] = {d->batch, Hkv, d->len_kv, D};
    const int64_t nv[4] = {d->batch, Hkv, d->len_kv, Dv}, no[4] = {d->batch, H, d->len_q, Dv};
    draw_strides(fd, d->q_stride, nq), draw_strides(fd, d->k_stride, nk);
    draw_strides(fd, d->v_stride, nv), draw_strides(fd, d->o_stride, no);
    if (pr->packed) { /* rows of the sequences one after another, (0, head, token, dim) */
        const int mq = d->len_q < 0 ? 0 : d->len_q > 300 ? 300 : (int)d->len_q;
        const int mk = d->len_kv < 0 ? 0 : d->len_kv > 400 ? 400 : (int)d->len_kv;
        for (int64_t b = 0; b < d->batch; b++) {
            pr->cu_q[b + 1] = pr->cu_q[b] + (fuzz_data_chance(fd, 1, 16) ? -1 : fuzz_data_int_range(fd, 0, mq));
            pr->cu_k[b + 1] = pr->cu_k[b] + (fuzz_data_chance(fd, 1, 16) ? -1 : fuzz_data_int_range(fd, 0, mk));
        }
        if (fuzz_data_chance(fd, 1, 32)) pr->cu_q[0] = 1;
        pr->seqs.cu_q = pr->cu_q, pr->seqs.cu_k = pr->cu_k;
        if (fuzz_data_chance(fd, 1, 4)) pr->seqs.page_size = (int64_t)1 << fuzz_data_int_range(fd, 0, 7);
        d->q_stride[0] = d->k_stride[0] = d->v_stride[0] = d->o_stride[0] = fuzz_data_chance(fd, 1, 8) ? 1 : 0;
    }
    d->causal = (attn_causal)(fuzz_data_chance(fd, 1, 32) ? fuzz_data_int_range(fd, -1, 5) : fuzz_data_int_range(fd, 0, 2));
    if (fuzz_data_chance(fd, 1, 4)) {
        d->use_window = 1;
        d->window_left = fuzz_data_chance(fd, 1, 4) ? -1 : fuzz_data_size(fd, 0, 4096, 1, 16);
        d->window_right = fuzz_data_chance(fd, 1, 4) ? -1 : fuzz_data_size(fd, 0, 64, 1, 16);
    }
    if (fuzz_data_chance(fd, 1, 4)) d->scale = fuzz_data_chance(fd, 3, 4) ? fuzz_data_float_range(fd, -2.0f, 2.0f) : fuzz_data_float_special(fd);
    if (fuzz_data_chance(fd, 1, 6)) d->softcap = fuzz_data_chance(fd, 3, 4) ? fuzz_data_float_range(fd, 1.0f, 50.0f) : fuzz_data_float_special(fd);
    if (fuzz_data_chance(fd, 1, 4)) {
        d->dropout_p = fuzz_data_chance(fd, 3, 4) ? fuzz_data_unit(fd) : fuzz_data_double_special(fd, -1.0, 2.0);
        d->dropout_rng = (attn_dropout_rng)(fuzz_data_chance(fd, 3, 4) ? ATTN_DROPOUT_RNG_PHILOX : fuzz_data_int_range(fd, -1, 3));
        d->dropout_seed = fuzz_data_u64(fd), d->dropout_offset = fuzz_data_u32(fd);
    }
    if (fuzz_data_chance(fd, 1, 16)) d->weights_mode = (attn_weights_mode)fuzz_data_int_range(fd, -1, 3);
    if (fuzz_data_chance(fd, 1, 5)) d->alibi_slopes = (const float *)draw_ptr(fd, false);
    if (!pr->packed && fuzz_data_chance(fd, 1, 4)) {
        d->mask = draw_ptr(fd, false);
        d->mask_dtype = fuzz_data_chance(fd, 7, 8) ? (fuzz_data_bool(fd) ? ATTN_DTYPE_F32 : ATTN_DTYPE_BOOL) : (attn_dtype)draw_dtype(fd);
        const int64_t ls = wrap_mul(d->len_q, d->len_kv), full[4] = {wrap_mul(H, ls), ls, d->len_kv, 1};
        for (int i = 0; i < 4; i++) d->mask_stride[i] = fuzz_data_chance(fd, 1, 3) ? 0 : full[i];
        if (fuzz_data_chance(fd, 1, 8)) d->mask_stride[fuzz_data_int_range(fd, 0, 3)] = fuzz_data_i64_edge(fd);
    }
    if (!pr->packed && fuzz_data_chance(fd, 1, 6)) {
        d->key_padding_mask = draw_ptr(fd, false);
        d->key_padding_mask_dtype = fuzz_data_bool(fd) ? ATTN_DTYPE_F32 : ATTN_DTYPE_BOOL;
        d->key_padding_mask_stride[0] = fuzz_data_chance(fd, 1, 4) ? 0 : d->len_kv, d->key_padding_mask_stride[1] = 1;
    }
    pr->q = draw_ptr(fd, true), pr->k = draw_ptr(fd, true), pr->v = draw_ptr(fd, true);
    pr->out = draw_ptr(fd, true), pr->dout = draw_ptr(fd, true);
    pr->deterministic = fuzz_data_bool(fd);
    pr->dmask = fuzz_data_chance(fd, 1, 6);
}

/* The sizes as the planner resolves them (the shared check accepted the descriptor): a packed
 * batch's L and S are its longest sequences (len_q and len_kv only bound them). */
typedef struct sizes {
    int64_t B, H, Hkv, L, S, D, Dv;
} sizes;

static sizes sizes_of(const problem *pr) {
    const attn_sdpa_desc *d = &pr->d;
    sizes z = {d->batch, d->n_heads, d->n_kv_heads == 0 ? d->n_heads : d->n_kv_heads, d->len_q, d->len_kv, d->head_dim,
               d->head_dim_v == 0 ? d->head_dim : d->head_dim_v};
    if (pr->packed) {
        z.L = z.S = 0;
        for (int64_t b = 0; b < d->batch; b++) {
            const int64_t lq = pr->cu_q[b + 1] - pr->cu_q[b], lk = pr->cu_k[b + 1] - pr->cu_k[b];
            z.L = lq > z.L ? lq : z.L, z.S = lk > z.S ? lk : z.S;
        }
    }
    return z;
}

/* ---- what a plan must satisfy ---------------------------------------------------------------- */

static bool two_byte(int32_t t) { return t == ATTN_DTYPE_F16 || t == ATTN_DTYPE_BF16; }
static bool aligned16(const void *p) { return p == NULL || ((uintptr_t)p & 15u) == 0; }
/* Read 16 bytes at a time: unit stride along D, other strides multiples of 8 elements. */
static bool vec_strides(const int64_t s[4]) { return s[3] == 1 && s[0] % 8 == 0 && s[1] % 8 == 0 && s[2] % 8 == 0; }
static int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); } /* a >= 0, b > 0 */

/* blocks * a * b (each >= 1) within a grid's x dimension (2^31 - 1), without overflowing. */
static bool grid_fits(int64_t blocks, int64_t a, int64_t b) {
    const __int128 n = (__int128)blocks * a;
    return n >= 0 && n <= INT32_MAX && n * b >= 0 && n * b <= INT32_MAX;
}

/* A workspace piece at `off` of `bytes` lies inside the plan's total, aligned. */
static void check_piece(const attn__cuda_sdpa_plan *plan, size_t off, __int128 bytes, const char *what) {
    FUZZ_CHECK(off % ATTN__CU_WS_ALIGN == 0, "%s at offset %zu, not a multiple of %d", what, off, ATTN__CU_WS_ALIGN);
    FUZZ_CHECK((__int128)off + bytes <= (__int128)plan->ws_bytes, "%s (%zu + %.0f bytes) past the workspace's %zu", what, off,
               (double)bytes, plan->ws_bytes);
}

/* Whether the tensor-core kernels' operand conditions hold: BF16 or F16 throughout, D = Dv, sm_80+,
 * not SIMPLE, q, k and v read 16 bytes at a time (flash_views: out written so too; split-KV
 * decoding writes out element by element). */
static bool vec_operands(const problem *pr, const attn__cuda_sdpa_params *p) {
    return p->q_dtype == p->kv_dtype && p->kv_dtype == p->out_dtype && two_byte(p->q_dtype) && p->D == p->Dv &&
           pr->dev.cc_major >= 8 && pr->kernels != ATTN_CUDA_KERNELS_SIMPLE && vec_strides(p->q_stride) &&
           vec_strides(p->k_stride) && vec_strides(p->v_stride) && aligned16(pr->q) && aligned16(pr->k) && aligned16(pr->v);
}
static bool flash_views(const problem *pr, const attn__cuda_sdpa_params *p) {
    return vec_operands(pr, p) && vec_strides(p->o_stride);
}

static void check_forward(const problem *pr, const attn__cuda_sdpa_plan *plan) {
    const attn__cuda_sdpa_params *p = &plan->p;
    const attn_sdpa_desc *d = &pr->d;
    FUZZ_CHECK(d->dropout_p == 0.0 || d->dropout_rng == ATTN_DROPOUT_RNG_PHILOX, "dropout %g from rng %d planned", d->dropout_p,
               (int)d->dropout_rng);
    FUZZ_CHECK(d->weights_mode == ATTN_WEIGHTS_NONE, "weights_mode %d planned", (int)d->weights_mode);
    FUZZ_CHECK(p->D <= ATTN__CU_MAX_HEAD_DIM && p->Dv <= ATTN__CU_MAX_HEAD_DIM, "head dims %lld/%lld planned", (long long)p->D,
               (long long)p->Dv);
    const float want = d->scale != 0.0f ? d->scale : (float)(1.0 / sqrt((double)p->D));
    FUZZ_CHECK(p->scale == want && p->scale != 0.0f, "scale %g, want %g", p->scale, want);
    FUZZ_CHECK(p->group >= 1 && p->H == p->Hkv * p->group, "H %lld, Hkv %lld, group %lld", (long long)p->H, (long long)p->Hkv,
               (long long)p->group);
    const sizes z = sizes_of(pr);
    FUZZ_CHECK(p->L == z.L && p->S == z.S, "L %lld, S %lld planned for %lld, %lld", (long long)p->L, (long long)p->S,
               (long long)z.L, (long long)z.S);
    const int64_t rows = p->group * p->L;
    switch (plan->kernel) {
    case ATTN__CU_KERNEL_FLASH:
        FUZZ_CHECK(flash_views(pr, p) && aligned16(pr->q) && aligned16(pr->k) && aligned16(pr->v) && aligned16(pr->out),
                   "flash planned on views it cannot read 16 bytes at a time");
        FUZZ_CHECK(attn__cuda_flash_smem((int)p->D) != 0 && attn__cuda_flash_smem((int)p->D) <= pr->dev.smem_optin,
                   "flash at head dim %lld, shared memory %zu of %zu", (long long)p->D, attn__cuda_flash_smem((int)p->D),
                   pr->dev.smem_optin);
        FUZZ_CHECK(plan->row_blocks == ceil_div(p->L, 128), "flash: %lld row blocks for L %lld", (long long)plan->row_blocks,
                   (long long)p->L);
        break;
    case ATTN__CU_KERNEL_FLASH_SM90:
        FUZZ_CHECK(pr->kernels == ATTN_CUDA_KERNELS_SM90 && pr->dev.flash_sm90, "flash-sm90 without being asked for (kernels %d)",
                   (int)pr->kernels);
        FUZZ_CHECK(flash_views(pr, p) && (p->D == 64 || p->D == 128) && !attn__cuda_elementwise(p) && !p->dropout &&
                       pr->seqs.page_size == 0,
                   "flash-sm90 on a call it does not take");
        FUZZ_CHECK(attn__cuda_flash_sm90_smem((int)p->D) <= pr->dev.smem_optin, "flash-sm90's shared memory");
        FUZZ_CHECK(plan->row_blocks == ceil_div(p->L, 128), "flash-sm90: %lld row blocks", (long long)plan->row_blocks);
        break;
    case ATTN__CU_KERNEL_DECODE:
    case ATTN__CU_KERNEL_DECODE_VEC: {
        FUZZ_CHECK(pr->kernels == ATTN_CUDA_KERNELS_AUTO, "decoding planned with kernels %d", (int)pr->kernels);
        FUZZ_CHECK(rows <= 16 && plan->decode_rows == rows, "decoding for %lld rows a kv head", (long long)rows);
        if (plan->kernel == ATTN__CU_KERNEL_DECODE_VEC)
            FUZZ_CHECK(rows <= 4 && vec_operands(pr, p) && (p->D == 64 || p->D == 128) && !attn__cuda_elementwise(p) &&
                           !p->dropout && pr->seqs.page_size % (1024 / p->D) == 0,
                       "decode-vec on a call it does not take");
        FUZZ_CHECK(plan->split_keys >= 32 && plan->split_keys % 32 == 0, "splits of %lld keys", (long long)plan->split_keys);
        FUZZ_CHECK(plan->n_splits >= 1 && (__int128)plan->n_splits * plan->split_keys >= p->S &&
                       (__int128)(plan->n_splits - 1) * plan->split_keys < p->S,
                   "%lld splits of %lld keys for S %lld", (long long)plan->n_splits, (long long)plan->split_keys, (long long)p->S);
        FUZZ_CHECK(grid_fits(ceil_div(plan->n_splits, 4), p->B, p->Hkv) && grid_fits(1, p->B * p->Hkv, rows),
                   "decode grid past the limit");
        check_piece(plan, plan->ws_part, (__int128)p->B * p->Hkv * plan->n_splits * rows * (2 + p->Dv) * 4, "the splits' results");
        break;
    }
    case ATTN__CU_KERNEL_SIMPLE:
        FUZZ_CHECK(attn__cuda_simple_smem(p) <= pr->dev.smem_optin, "simple kernel's shared memory %zu of %zu",
                   attn__cuda_simple_smem(p), pr->dev.smem_optin);
        FUZZ_CHECK(plan->row_blocks == ceil_div(p->L, 4), "simple: %lld row blocks", (long long)plan->row_blocks);
        break;
    default: FUZZ_CHECK(0, "unknown kernel %d", (int)plan->kernel);
    }
    if (plan->kernel != ATTN__CU_KERNEL_DECODE && plan->kernel != ATTN__CU_KERNEL_DECODE_VEC)
        FUZZ_CHECK(grid_fits(plan->row_blocks, p->B, p->H), "%lld row blocks x %lld x %lld past the grid's limit",
                   (long long)plan->row_blocks, (long long)p->B, (long long)p->H);
    if (pr->packed) check_piece(plan, plan->ws_cu, (__int128)2 * (p->B + 1) * 8, "the offsets");
}

/* The backward's plan: its kernel (FLASH or SIMPLE), what it writes through, its grids and workspace. */
static void check_backward_plan(const problem *pr, const attn__cuda_sdpa_plan *plan) {
    const attn__cuda_sdpa_params *p = &plan->p;
    const attn_sdpa_desc *d = &pr->d;
    FUZZ_CHECK(plan->kernel == ATTN__CU_KERNEL_FLASH || plan->kernel == ATTN__CU_KERNEL_SIMPLE, "backward kernel %d",
               (int)plan->kernel);
    FUZZ_CHECK(d->dropout_p == 0.0 || d->dropout_rng == ATTN_DROPOUT_RNG_PHILOX, "dropout from rng %d planned", (int)d->dropout_rng);
    if (pr->dmask)
        FUZZ_CHECK(d->mask != NULL && d->mask_dtype == ATTN_DTYPE_F32 && plan->kernel == ATTN__CU_KERNEL_SIMPLE && p->mask_extent >= 1,
                   "dmask planned without an F32 mask or off the simple kernels");
    const int64_t nq[4] = {p->B, p->H, p->L, p->D}, nk[4] = {p->B, p->Hkv, p->S, p->D}, nv[4] = {p->B, p->Hkv, p->S, p->Dv};
    for (int i = pr->packed ? 1 : 0; i < 4; i++)
        FUZZ_CHECK(!(nq[i] > 1 && d->q_stride[i] == 0) && !(nk[i] > 1 && d->k_stride[i] == 0) && !(nv[i] > 1 && d->v_stride[i] == 0),
                   "a gradient written through stride 0 on dimension %d", i);
    if (plan->kernel == ATTN__CU_KERNEL_FLASH) {
        const bool named = pr->kernels == ATTN_CUDA_KERNELS_SM80 || pr->kernels == ATTN_CUDA_KERNELS_SM90;
        FUZZ_CHECK(p->D <= 128 || (p->D == 256 && named), "tensor-core backward at head dim %lld with kernels %d", (long long)p->D,
                   (int)pr->kernels);
        FUZZ_CHECK(!pr->dmask && flash_views(pr, p) && aligned16(pr->q) && aligned16(pr->k) && aligned16(pr->v) &&
                       aligned16(pr->out) && aligned16(pr->dout),
                   "tensor-core backward on views it cannot read 16 bytes at a time");
        const size_t smem = attn__cuda_flash_bwd_smem((int)p->D, pr->deterministic);
        FUZZ_CHECK(smem != 0 && smem <= pr->dev.smem_optin, "tensor-core backward's shared memory %zu of %zu", smem,
                   pr->dev.smem_optin);
        FUZZ_CHECK(grid_fits(ceil_div(p->S, 64) * (p->D > 128 ? 2 : 1), p->B, p->Hkv), "dK/dV grid past the limit");
        FUZZ_CHECK(plan->deterministic == pr->deterministic, "deterministic flag lost");
        if (!pr->deterministic) check_piece(plan, plan->ws_dq_acc, (__int128)p->H * plan->total_q * p->D * 4, "the dQ accumulator");
    } else {
        FUZZ_CHECK(attn__cuda_simple_bwd_smem(p) <= pr->dev.smem_optin, "simple backward's shared memory");
        FUZZ_CHECK(grid_fits(ceil_div(p->S, 4), p->B, p->Hkv), "simple dK/dV grid past the limit");
    }
    FUZZ_CHECK(grid_fits(ceil_div(p->L, 4), p->B, p->H), "row kernels' grid past the limit");
    check_piece(plan, plan->ws_rowdot, (__int128)p->H * plan->total_q * 4, "rowdot");
    if (pr->packed) check_piece(plan, plan->ws_cu, (__int128)2 * (p->B + 1) * 8, "the offsets");
}

/* ---- what justifies a refusal of a call the shared check accepts ------------------------------ */

static bool float_dtype(int32_t t) { return t == ATTN_DTYPE_F32 || two_byte(t); }

/* attn_cuda.h's limits of the GPU, the simple kernels' shared memory (the fallback of every call),
 * and the grids: the row kernels' (4 queries a block, the most blocks of any forward) and split-KV
 * decoding's (a block per kv head and 4 splits; B * Hkv * rows its rows). */
static bool forward_refusable(const problem *pr) {
    const attn_sdpa_desc *d = &pr->d;
    const sizes z = sizes_of(pr);
    if (d->dropout_p != 0.0 && d->dropout_rng != ATTN_DROPOUT_RNG_PHILOX) return true;
    if (d->weights_mode != ATTN_WEIGHTS_NONE) return true;
    if (!float_dtype(d->q_dtype) || !float_dtype(d->kv_dtype) || !float_dtype(d->out_dtype)) return true;
    if (z.D > ATTN__CU_MAX_HEAD_DIM || z.Dv > ATTN__CU_MAX_HEAD_DIM) return true;
    if ((size_t)(4 * (z.D + z.Dv)) * sizeof(float) > pr->dev.smem_optin) return true;
    const int64_t B = pr->packed ? d->batch : z.B;
    if (!grid_fits(ceil_div(z.L, 4), B, z.H)) return true;
    return !grid_fits(1, B * z.Hkv, (z.H / z.Hkv) * z.L);
}

/* The forward's, and the backward's own: dmask without an F32 mask, a stride 0 it would write
 * through, the simple backward's shared memory, its key rows' grid (4 keys a block; the
 * tensor-core one has fewer), the dQ accumulator's size. */
static bool backward_refusable(const problem *pr) {
    const attn_sdpa_desc *d = &pr->d;
    const sizes z = sizes_of(pr);
    if (forward_refusable(pr)) return true;
    if (pr->dmask && (d->mask == NULL || d->mask_dtype != ATTN_DTYPE_F32)) return true;
    const int64_t nq[4] = {z.B, z.H, z.L, z.D}, nk[4] = {z.B, z.Hkv, z.S, z.D}, nv[4] = {z.B, z.Hkv, z.S, z.Dv};
    for (int i = pr->packed ? 1 : 0; i < 4; i++)
        if ((nq[i] > 1 && d->q_stride[i] == 0) || (nk[i] > 1 && d->k_stride[i] == 0) || (nv[i] > 1 && d->v_stride[i] == 0))
            return true;
    const size_t dq = (size_t)(4 * (2 * z.D + z.Dv)) * sizeof(float), dkdv = (size_t)(4 * 2 * (z.D + z.Dv)) * sizeof(float);
    if ((dq > dkdv ? dq : dkdv) > pr->dev.smem_optin) return true;
    const int64_t B = pr->packed ? d->batch : z.B;
    if (!grid_fits(ceil_div(z.S, 4), B, z.Hkv)) return true;
    const int64_t total_q = pr->packed ? pr->cu_q[d->batch] : z.B * z.L;
    return (__int128)z.H * total_q * z.D * 4 > (__int128)(SIZE_MAX / 2);
}

/* ---- the target ------------------------------------------------------------------------------ */

static attn_ctx *host_ctx(void) {
    static attn_ctx *ctx;
    if (ctx == NULL) {
        attn_ctx_params cp;
        attn_ctx_params_init(&cp);
        cp.n_threads = 1;
        FUZZ_CHECK(attn_ctx_create(&cp, &ctx) == ATTN_OK, "context");
    }
    return ctx;
}

static void check_refusal(attn_status st, const attn__cuda_err *e, const char *what) {
    FUZZ_CHECK(fuzz_status_known(st) && st != ATTN_OK, "%s returned status %d", what, (int)st);
    FUZZ_CHECK(e->msg[0] != '\0' && strchr(e->msg, '\n') == NULL, "%s failed with %s and no one-line message", what,
               attn_strerror(st));
}

/* ---- KV caches ---------------------------------------------------------------------------- */

/* a * b, or `big` once it passes it (a, b >= 0): products of four int64 sizes without overflow. */
static __int128 sat_mul(__int128 a, __int128 b) {
    const __int128 big = (__int128)1 << 100;
    return a != 0 && b > big / a ? big : a * b;
}

/* A device KV cache's layout (kv_cache.c's create) and an append's offsets, drawn from what the SDPA
 * problem left of the input. The layout: BAD_SHAPE for a size below 1 (page_size below 0),
 * UNSUPPORTED for a type other than F32, F16 and BF16, OVERFLOW exactly where the key or value
 * elements pass INT64_MAX / 8 or the page table's B * pages entries pass INT32_MAX, else sequences of
 * whole pages holding the capacity and the strides of (sequence or page, head, token, column). The
 * problem's descriptor as an attend call on the cache (attn__cuda_kv_check_desc: the cache's fit, no
 * masks, no top-left alignment; half the caches take the problem's sizes so that the fit holds). The
 * offsets, on a cache so laid out (its lengths within the capacity): the first sequence's refusal
 * (a negative count INVALID_ARG, one past the capacity CAPACITY), else the running sums. */
static void check_kv_cache(fuzz_data *fd, const attn_sdpa_desc *d) {
    attn_cuda_kv_cache_config c;
    memset(&c, 0, sizeof c);
    if (fuzz_data_bool(fd)) { // the problem's batch, heads, dims and type, so that attend's fit holds now and then
        c.batch = d->batch, c.n_kv_heads = d->n_kv_heads ? d->n_kv_heads : d->n_heads;
        c.head_dim = d->head_dim, c.head_dim_v = d->head_dim_v, c.dtype = (attn_dtype)d->kv_dtype;
    } else {
        c.batch = fuzz_data_size(fd, 1, MAX_SEQS, 1, 8), c.n_kv_heads = fuzz_data_size(fd, 1, 16, 1, 8);
        c.head_dim = draw_dim(fd), c.head_dim_v = fuzz_data_chance(fd, 3, 4) ? 0 : draw_dim(fd);
        c.dtype = (attn_dtype)draw_dtype(fd);
    }
    c.capacity = fuzz_data_size(fd, 1, 5000, 1, 4);
    c.page_size = fuzz_data_bool(fd) ? 0 : fuzz_data_size(fd, 1, 256, 1, 4);
    attn__cuda_err e = {.msg = "", .host = NULL};
    attn__cuda_kv_layout l;
    const attn_status st = attn__cuda_kv_layout_of(&e, &c, &l);
    if (st != ATTN_OK) check_refusal(st, &e, "attn__cuda_kv_layout_of");
    const int64_t B = c.batch, Hkv = c.n_kv_heads, D = c.head_dim, Dv = c.head_dim_v ? c.head_dim_v : D;
    const int64_t cap = c.capacity, ps = c.page_size;
    if (B < 1 || Hkv < 1 || D < 1 || Dv < 1 || cap < 1 || ps < 0) {
        FUZZ_CHECK(st == ATTN_ERR_BAD_SHAPE, "kv layout of sizes out of range: %s", attn_strerror(st));
        return;
    }
    if (c.dtype != ATTN_DTYPE_F32 && c.dtype != ATTN_DTYPE_F16 && c.dtype != ATTN_DTYPE_BF16) {
        FUZZ_CHECK(st == ATTN_ERR_UNSUPPORTED, "kv layout of type %d: %s", (int)c.dtype, attn_strerror(st));
        return;
    }
    const __int128 pages = ps > 0 ? ((__int128)cap + ps - 1) / ps : 0, rows = ps > 0 ? pages * ps : cap;
    const __int128 nk = sat_mul(sat_mul(sat_mul(B, Hkv), rows), D), nv = sat_mul(sat_mul(sat_mul(B, Hkv), rows), Dv);
    if (nk > INT64_MAX / 8 || nv > INT64_MAX / 8 || (__int128)B * pages > INT32_MAX) {
        FUZZ_CHECK(st == ATTN_ERR_OVERFLOW, "kv layout past the limits: %s", attn_strerror(st));
        return;
    }
    FUZZ_CHECK(st == ATTN_OK, "kv layout within the limits refused: %s (%s)", attn_strerror(st), e.msg);
    const int64_t block = ps > 0 ? ps : cap;
    FUZZ_CHECK(l.pages == (int64_t)pages && l.Dv == Dv && l.k_elems == (int64_t)nk && l.v_elems == (int64_t)nv,
               "kv layout: pages %lld, elements %lld, %lld", (long long)l.pages, (long long)l.k_elems, (long long)l.v_elems);
    const int64_t ks[4] = {Hkv * block * D, block * D, D, 1}, vs[4] = {Hkv * block * Dv, block * Dv, Dv, 1};
    FUZZ_CHECK(memcmp(l.k_stride, ks, sizeof ks) == 0 && memcmp(l.v_stride, vs, sizeof vs) == 0, "kv layout: strides");
    // the problem's descriptor as an attend call on this cache: refused for a misfit (batch, kv heads,
    // head dims, kv_dtype), masks, or top-left causal alignment, in that order
    const int64_t dHkv = d->n_kv_heads ? d->n_kv_heads : d->n_heads, dDv = d->head_dim_v ? d->head_dim_v : d->head_dim;
    const attn_status want_fit = d->batch != B || dHkv != Hkv || d->head_dim != D || dDv != Dv || d->kv_dtype != c.dtype ? ATTN_ERR_BAD_SHAPE
                                 : d->mask != NULL || d->key_padding_mask != NULL                                   ? ATTN_ERR_UNSUPPORTED
                                 : d->causal == ATTN_CAUSAL_TOP_LEFT                                                ? ATTN_ERR_INVALID_ARG
                                                                                                                   : ATTN_OK;
    const attn_status fit = attn__cuda_kv_check_desc(&e, &c, d);
    FUZZ_CHECK(fit == want_fit, "kv attend's descriptor: %s, expected %s", attn_strerror(fit), attn_strerror(want_fit));
    if (fit != ATTN_OK) check_refusal(fit, &e, "attn__cuda_kv_check_desc");
    if (B > MAX_SEQS) return;
    int64_t len[MAX_SEQS], n[MAX_SEQS], cu[MAX_SEQS + 1];
    for (int64_t b = 0; b < B; b++) {
        len[b] = fuzz_data_i64_range(fd, 0, cap);
        n[b] = fuzz_data_chance(fd, 1, 8) ? fuzz_data_i64_edge(fd) : fuzz_data_i64_range(fd, 0, cap - len[b] + 1);
    }
    const attn_status ast = attn__cuda_kv_append_offsets(&e, B, cap, len, n, cu);
    attn_status want = ATTN_OK;
    for (int64_t b = 0; b < B && want == ATTN_OK; b++)
        want = n[b] < 0 ? ATTN_ERR_INVALID_ARG : n[b] > cap - len[b] ? ATTN_ERR_CAPACITY : ATTN_OK;
    FUZZ_CHECK(ast == want, "kv append offsets: %s, expected %s", attn_strerror(ast), attn_strerror(want));
    if (ast != ATTN_OK) check_refusal(ast, &e, "attn__cuda_kv_append_offsets");
    else
        for (int64_t b = 0; b < B; b++) FUZZ_CHECK(cu[0] == 0 && cu[b + 1] == cu[b] + n[b], "kv append offsets: cu[%lld]", (long long)b + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_data fd;
    fuzz_data_init(&fd, data, size);
    problem pr;
    draw_problem(&fd, &pr);
    attn_ctx *host = host_ctx();
    const attn__cuda_seqs *seqs = pr.packed ? &pr.seqs : NULL;
    const attn_status shared = pr.packed ? attn_sdpa_varlen_desc_check(host, &pr.d, pr.cu_q, pr.cu_k) : attn_sdpa_desc_check(host, &pr.d);

    attn__cuda_err e = {.msg = "", .host = host};
    attn__cuda_sdpa_plan plan;
    attn_status st = attn__cuda_plan_sdpa(&e, &pr.dev, pr.kernels, &pr.d, seqs, pr.q, pr.k, pr.v, pr.out, &plan);
    if (shared != ATTN_OK) FUZZ_CHECK(st == shared, "the shared check says %s, the planner %s", attn_strerror(shared), attn_strerror(st));
    if (st != ATTN_OK) check_refusal(st, &e, "attn__cuda_plan_sdpa");
    else check_forward(&pr, &plan);
    if (shared == ATTN_OK && st != ATTN_OK)
        FUZZ_CHECK(forward_refusable(&pr), "a call within the GPU's documented limits refused: %s (%s)", attn_strerror(st), e.msg);

    memset(&e, 0, sizeof e), e.host = host;
    const attn__cuda_bwd_tensors t = {pr.q, pr.k, pr.v, pr.out, pr.dout};
    const attn_status bst = attn__cuda_plan_sdpa_bwd(&e, &pr.dev, pr.kernels, pr.deterministic, &pr.d, seqs, pr.dmask, &t, &plan);
    if (st != ATTN_OK) FUZZ_CHECK(bst != ATTN_OK, "the backward planned a call the forward refused (%s)", attn_strerror(st));
    if (bst != ATTN_OK) check_refusal(bst, &e, "attn__cuda_plan_sdpa_bwd");
    else check_backward_plan(&pr, &plan);
    if (shared == ATTN_OK && bst != ATTN_OK)
        FUZZ_CHECK(backward_refusable(&pr), "a backward within the GPU's documented limits refused: %s (%s)", attn_strerror(bst),
                   e.msg);
    check_kv_cache(&fd, &pr.d);
    return 0;
}

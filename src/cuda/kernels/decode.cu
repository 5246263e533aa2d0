// decode.cu - split-KV decoding (flash-decoding): calls with few query rows per kv head (R = group * L
// rows, at most 16: one new token for each head of a GQA group, or a few), where a tile of 128 query
// rows would be mostly empty. Every query row of a kv head is handled by the same warp, so each key
// and value row is read once for the whole group.
//
// Pass 1 (decode_split_kernel): the keys of a sequence are cut into splits of split_keys; one warp
// per (split, b, kv head), 4 warps per block. Lane l holds elements l, l + 32, ... of a row (PL per
// lane, D and Dv <= 32 PL); the group's query rows, pre-scaled, sit in shared memory. Per key: the R
// dot products (lane partial sums reduced across the warp), the score rule where the call needs it,
// one online-softmax step per row (exp2 domain), and the accumulators updated with the value row
// (Philox dropout after the row sums, as the other kernels). The split's (m, l, acc) per row go to
// the workspace.
// Pass 2 (decode_combine_kernel): one warp per query row merges its splits: M = max m, out =
// sum 2^(m - M) acc / sum 2^(m - M) l (times keep_scale with dropout), lse = (M + log2 l) ln 2.
// Where the loaded code was compiled for sm_90 or later (attn__cuda_decode_pdl, launch.h) both
// passes are launched as programmatic dependents (common.cuh, pdl_wait): pass 2's
// blocks start as pass 1's blocks leave and wait there for its results, and pass 1 of the next call
// in the stream is set up while this call's pass 2 runs.
#include <cuda_runtime.h>

#include "../launch.h"
#include "common.cuh"

namespace attn_cuda {

constexpr int kDecWarps = 4;

// Pass 1's work: a block holds kDecWarps consecutive splits of the keys of one (sequence b, kv
// head hk), a warp one split. (Two helpers, so a kernel can form the split index where it needs it:
// held across the split kernel's barrier it costs a register.)
struct SplitHead {
    int64_t b, hk;
};
__device__ __forceinline__ SplitHead split_head(const P &p, int64_t n_splits) {
    const int64_t bid = (int64_t)blockIdx.x / ((n_splits + kDecWarps - 1) / kDecWarps);
    SplitHead w;
    w.hk = bid % p.Hkv, w.b = bid / p.Hkv;
    return w;
}
__device__ __forceinline__ int64_t warp_split(int64_t n_splits) {
    return (int64_t)blockIdx.x % ((n_splits + kDecWarps - 1) / kDecWarps) * kDecWarps + threadIdx.x / 32;
}

// Row r of a kv head's group: query i = r % L of head h = hk * group + r / L.
struct GroupRow {
    int64_t i, h;
};
__device__ __forceinline__ GroupRow group_row(const P &p, int64_t hk, int64_t r) {
    GroupRow g;
    g.i = r % p.L, g.h = hk * p.group + r / p.L;
    return g;
}

// Offset in the workspace of split `split`'s partial result (m, l, acc[Dv]) for row r of (b, hk).
__device__ __forceinline__ int64_t part_offset(const P &p, int64_t b, int64_t hk, int64_t n_splits, int64_t split, int R,
                                               int r) {
    return (((b * p.Hkv + hk) * n_splits + split) * R + r) * (2 + p.Dv);
}

// Rows of the group and of the sequence: row r is group_row(r).
template <int ROWS, int PL>
__global__ void __launch_bounds__(32 * kDecWarps) decode_split_kernel(const P p, int64_t split_keys, int64_t n_splits,
                                                                     int R, float *part) {
    extern __shared__ float q_s[]; // (R, D) query rows times scale * log2(e) (raw with the whole score rule)
    pdl_wait();
    pdl_release();
    const int lane = threadIdx.x % 32;
    const SplitHead w = split_head(p, n_splits);
    const int64_t b = w.b, hk = w.hk;
    const Seq s = seq_of(p, b);
    // masks, ALiBi and soft caps take the whole score rule per key; causality and windows alone only
    // the bounds test (the queries then carry scale * log2(e))
    const bool rule = has_elementwise(p);
    const float qscale = rule ? 1.0f : p.scale * kLog2e;
    for (int x = threadIdx.x; x < R * p.D; x += blockDim.x) {
        const int r = x / (int)p.D;
        const int64_t e = x % p.D;
        const GroupRow g = group_row(p, hk, r);
        q_s[x] = g.i < s.L ? load_as_float(p.q, p.q_dtype, q_row(p, s, b, g.h, g.i) + e * p.q_stride[3]) * qscale : 0.0f;
    }
    __syncthreads();
    const int64_t split = warp_split(n_splits);
    if (split >= n_splits) return;
    const int64_t j_lo = split * split_keys, j_hi = min(j_lo + split_keys, s.S);

    float m[ROWS], l[ROWS], acc[ROWS][PL];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        m[r] = -CUDART_INF_F, l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < PL; e++) acc[r][e] = 0.0f;
    }
    // key and value rows one ahead: the loads of key j + 1 are in flight while key j is computed
    float kn[PL], vn[PL];
    auto load_row = [&](int64_t j, float *kd, float *vd) {
        const int64_t ko = kv_row(p, p.k_stride, s, b, hk, j), vo = kv_row(p, p.v_stride, s, b, hk, j);
#pragma unroll
        for (int e = 0; e < PL; e++) {
            const int64_t d = lane + 32 * e;
            kd[e] = d < p.D ? load_as_float(p.k, p.kv_dtype, ko + d * p.k_stride[3]) : 0.0f;
            vd[e] = d < p.Dv ? load_as_float(p.v, p.kv_dtype, vo + d * p.v_stride[3]) : 0.0f;
        }
    };
    if (j_lo < j_hi) load_row(j_lo, kn, vn);
    for (int64_t j = j_lo; j < j_hi; j++) {
        float kv[PL], vv[PL];
#pragma unroll
        for (int e = 0; e < PL; e++) kv[e] = kn[e], vv[e] = vn[e];
        if (j + 1 < j_hi) load_row(j + 1, kn, vn);
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            if (r >= R) break;
            float part = 0.0f;
#pragma unroll
            for (int e = 0; e < PL; e++)
                if (lane + 32 * e < p.D) part += q_s[r * p.D + lane + 32 * e] * kv[e];
            const float dot = warp_sum(part);
            const GroupRow g = group_row(p, hk, r);
            const int64_t i = g.i, h = g.h;
            if (i >= s.L) continue;
            const float x = rule ? score_log2(p, s, dot, b, h, i, j) : (bounds_hide(p, s, i, j) ? -CUDART_INF_F : dot);
            const float m_new = fmaxf(m[r], x);
            if (m_new == -CUDART_INF_F) continue; // hidden, and nothing seen yet
            const float alpha = exp2f(m[r] - m_new), pj = exp2f(x - m_new);
            l[r] = l[r] * alpha + pj;
            m[r] = m_new;
            const float w = p.dropout && !dropout_kept(p, b, h, i, j) ? 0.0f : pj;
#pragma unroll
            for (int e = 0; e < PL; e++) acc[r][e] = acc[r][e] * alpha + w * vv[e];
        }
    }
    // the split's partial result per row
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        if (r >= R) break;
        float *o = part + part_offset(p, b, hk, n_splits, split, R, r);
        if (lane == 0) o[0] = m[r], o[1] = l[r];
#pragma unroll
        for (int e = 0; e < PL; e++)
            if (lane + 32 * e < p.Dv) o[2 + lane + 32 * e] = acc[r][e];
    }
}

// Pass 1, vector form (decode-vec): BF16/F16 q, k, v and out, D = Dv in {64, 128}, rows read 16
// bytes at a time (unit stride along D, 16-byte aligned), the bounds alone (no mask, ALiBi, soft cap
// or dropout), at most 4 rows per kv head. A key row is G = D / 8 lanes, 8 elements each, so a warp
// takes KPW = 32 / G keys a step and issues the loads of U steps before using them (KPW U key and
// value rows in flight a warp); the scores of a key are summed over its G lanes by shuffles. Each
// group of G lanes keeps the online softmax of its own keys (one rescale per U steps), and the
// groups merge at the end into the split's (m, l, acc), written as decode_split_kernel writes them.
// PAGED: keys through a paged cache's page table (one entry a pass). At most 168 registers a thread
// (3 blocks an SM, held by the launch bounds; 4 rows use all of them on sm_90a): 12 warps an SM,
// which the planner's split count assumes.
template <typename T, int D, int ROWS, bool PAGED>
__global__ void __launch_bounds__(32 * kDecWarps, 3) decode_vec_kernel(const P p, int64_t split_keys, int64_t n_splits,
                                                                   int R, float *part) {
    constexpr int G = D / 8, KPW = 32 / G, U = 4;
    pdl_wait();
    pdl_release();
    const int lane = threadIdx.x % 32, kg = lane / G, e0 = (lane % G) * 8;
    const SplitHead w = split_head(p, n_splits);
    const int64_t split = warp_split(n_splits), b = w.b, hk = w.hk;
    const Seq s = seq_of(p, b);
    if (split >= n_splits) return; // (no block-wide barrier in this kernel)
    const int64_t j_lo = split * split_keys, j_hi = min(j_lo + split_keys, s.S);
    const T *gk = static_cast<const T *>(p.k), *gv = static_cast<const T *>(p.v);

    // the rows: query i of head h (row r = (h - hk group) L + i), this lane's 8 elements of it times
    // scale log2(e), and the keys [klo, khi] its bounds let it see; kmin..kmax lie in the bounds of
    // every row of the call (a row past R or past the sequence's queries, never read, has klo > khi
    // and scores its zero query in a step inside kmin..kmax)
    float q[ROWS][8], m[ROWS], l[ROWS], acc[ROWS][8];
    int64_t klo[ROWS], khi[ROWS], kmin = 0, kmax = INT64_MAX;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        m[r] = -CUDART_INF_F, l[r] = 0.0f, klo[r] = 0, khi[r] = -1;
#pragma unroll
        for (int e = 0; e < 8; e++) q[r][e] = 0.0f, acc[r][e] = 0.0f;
        const GroupRow g = group_row(p, hk, r);
        const int64_t i = g.i;
        if (r < R && i < s.L) {
            const uint4 raw = *reinterpret_cast<const uint4 *>(static_cast<const T *>(p.q) + q_row(p, s, b, g.h, i) + e0);
            const T *x = reinterpret_cast<const T *>(&raw);
#pragma unroll
            for (int e = 0; e < 8; e++) q[r][e] = to_float<T>(x[e]) * (p.scale * kLog2e);
            klo[r] = first_key(p, s, i), khi[r] = end_key(p, s, i) - 1;
            kmin = max(kmin, klo[r]), kmax = min(kmax, khi[r]);
        }
    }
    // A pass of the loop takes U steps, KPW U keys: key jj[u] = j0 + u KPW + kg, addressed from the
    // pass's first row, KPW rows on per u. A paged cache's pages hold whole passes (the planner's
    // condition: page_size a multiple of KPW U; splits start at multiples of 32), so a pass's keys
    // lie in one page: its page-table entry is loaded a pass ahead (no dependent load before a
    // key's own), its row in the page counted along. A pass whose keys all lie in kmin..kmax (and
    // below j_hi) skips the per-key bound test.
    const int32_t *pt = PAGED ? p.page_table + b * p.max_pages : nullptr;
    int64_t pg = 0, pr = 0; // the pass's page (index in the table) and first row in it
    int32_t ent = 0;        // its entry
    if constexpr (PAGED) {
        pg = j_lo / p.page_size, pr = j_lo % p.page_size;
        if (j_lo < j_hi) ent = __ldg(pt + pg);
    }
    const int64_t klane = hk * p.k_stride[1] + kg * p.k_stride[2] + e0 +
                          (PAGED ? 0 : b * p.k_stride[0] + s.k_row0 * p.k_stride[2]);
    const int64_t vlane = hk * p.v_stride[1] + kg * p.v_stride[2] + e0 +
                          (PAGED ? 0 : b * p.v_stride[0] + s.k_row0 * p.v_stride[2]);
    const int64_t kstep = KPW * p.k_stride[2], vstep = KPW * p.v_stride[2];
    kmax = min(kmax, j_hi - 1);
    for (int64_t j0 = j_lo; j0 < j_hi; j0 += KPW * U) {
        const T *pk = gk + klane + (PAGED ? ent * p.k_stride[0] + pr * p.k_stride[2] : j0 * p.k_stride[2]);
        const T *pv = gv + vlane + (PAGED ? ent * p.v_stride[0] + pr * p.v_stride[2] : j0 * p.v_stride[2]);
        uint4 kr[U], vr[U];
        int64_t jj[U];
#pragma unroll
        for (int u = 0; u < U; u++) { // every load of the U steps first
            jj[u] = j0 + u * KPW + kg;
            if (jj[u] < j_hi) {
                kr[u] = __ldg(reinterpret_cast<const uint4 *>(pk + u * kstep));
                vr[u] = __ldg(reinterpret_cast<const uint4 *>(pv + u * vstep));
            } else {
                kr[u] = make_uint4(0, 0, 0, 0), vr[u] = make_uint4(0, 0, 0, 0);
            }
        }
        if constexpr (PAGED) {
            pr += KPW * U;
            if (pr == p.page_size) pr = 0, pg++;
            if (j0 + KPW * U < j_hi) ent = __ldg(pt + pg);
        }
        const bool inside = j0 >= kmin && j0 + KPW * U - 1 <= kmax; // the same for the whole warp
        float sc[U][ROWS];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const T *x = reinterpret_cast<const T *>(&kr[u]);
            float kf[8];
#pragma unroll
            for (int e = 0; e < 8; e++) kf[e] = to_float<T>(x[e]);
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++) d = fmaf(q[r][e], kf[e], d);
#pragma unroll
                for (int o = G / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                sc[u][r] = d;
            }
        }
        if (!inside) {
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < ROWS; r++)
                    if (!(jj[u] < j_hi && jj[u] >= klo[r] && jj[u] <= khi[r])) sc[u][r] = -CUDART_INF_F;
        }
        float vf[U][8];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const T *x = reinterpret_cast<const T *>(&vr[u]);
#pragma unroll
            for (int e = 0; e < 8; e++) vf[u][e] = to_float<T>(x[e]);
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++) { // one rescale per U steps
            float mc = sc[0][r];
#pragma unroll
            for (int u = 1; u < U; u++) mc = fmaxf(mc, sc[u][r]);
            const float m_new = fmaxf(m[r], mc);
            const float m_use = m_new == -CUDART_INF_F ? 0.0f : m_new; // nothing seen yet: weights 0, not NaN
            const float alpha = exp2f(m[r] - m_use);
            l[r] *= alpha;
#pragma unroll
            for (int e = 0; e < 8; e++) acc[r][e] *= alpha;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const float pu = exp2f(sc[u][r] - m_use);
                l[r] += pu;
#pragma unroll
                for (int e = 0; e < 8; e++) acc[r][e] = fmaf(pu, vf[u][e], acc[r][e]);
            }
            m[r] = m_new;
        }
    }
    // the key groups merged (lanes l and l ^ G kG hold the same elements of other keys)
#pragma unroll
    for (int o = G; o < 32; o <<= 1) {
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[r], o), lo = __shfl_xor_sync(0xffffffffu, l[r], o);
            const float mm = fmaxf(m[r], mo), mu = mm == -CUDART_INF_F ? 0.0f : mm;
            const float a = exp2f(m[r] - mu), c = exp2f(mo - mu);
            l[r] = l[r] * a + lo * c;
#pragma unroll
            for (int e = 0; e < 8; e++) acc[r][e] = acc[r][e] * a + __shfl_xor_sync(0xffffffffu, acc[r][e], o) * c;
            m[r] = mm;
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        if (r >= R || lane >= G) continue;
        float *o = part + part_offset(p, b, hk, n_splits, split, R, r);
        if (lane == 0) o[0] = m[r], o[1] = l[r];
#pragma unroll
        for (int e = 0; e < 8; e++) o[2 + e0 + e] = acc[r][e];
    }
}

// One warp per query row (b, h, i): the splits merged, out and lse written. The rows of kMergeAhead
// splits are loaded before any is summed (the loads of one row of elements a split: L2 latency per
// kMergeAhead splits).
constexpr int kMergeAhead = 8;
__global__ void __launch_bounds__(32 * kDecWarps) decode_combine_kernel(const P p, int64_t n_splits, int R,
                                                                       const float *part) {
    pdl_wait();
    pdl_release();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t row = (int64_t)blockIdx.x * kDecWarps + warp; // (b, hk, r)
    if (row >= p.B * p.Hkv * R) return;
    const int r = (int)(row % R);
    const int64_t bk = row / R, hk = bk % p.Hkv, b = bk / p.Hkv;
    const Seq s = seq_of(p, b);
    const GroupRow g = group_row(p, hk, r);
    const int64_t i = g.i, h = g.h;
    if (i >= s.L) return;
    const int64_t tstride = R * (2 + p.Dv);
    const float *base = part + part_offset(p, b, hk, n_splits, 0, R, r); // split t at base + t * tstride
    float M = -CUDART_INF_F;
    for (int64_t t = lane; t < n_splits; t += 32) M = fmaxf(M, base[t * tstride]);
    M = warp_max(M);
    // splits 32 at a time: lane t's weight 2^(m - M) (0 for a split that saw nothing), handed round by
    // shuffles; each lane sums its elements e = lane + 32 k of the value rows, the rows of kMergeAhead
    // splits in flight (in split order, so the sums are those of one split at a time)
    float L = 0.0f, a[8];
#pragma unroll
    for (int k = 0; k < 8; k++) a[k] = 0.0f;
    for (int64_t t0 = 0; t0 < n_splits; t0 += 32) {
        const int64_t t = t0 + lane;
        const float mt = t < n_splits ? base[t * tstride] : -CUDART_INF_F;
        const float w = mt != -CUDART_INF_F ? exp2f(mt - M) : 0.0f;
        if (t < n_splits) L += w * base[t * tstride + 1];
        const int n = (int)min((int64_t)32, n_splits - t0);
        for (int u0 = 0; u0 < n; u0 += kMergeAhead) { // the rows of kMergeAhead splits loaded before any is summed
            float wu[kMergeAhead], x[kMergeAhead][8];
#pragma unroll
            for (int v = 0; v < kMergeAhead; v++) {
                wu[v] = __shfl_sync(0xffffffffu, w, (u0 + v) & 31);
                const float *row = base + (t0 + u0 + v) * tstride + 2;
#pragma unroll
                for (int k = 0; k < 8; k++)
                    x[v][k] = u0 + v < n && lane + 32 * k < p.Dv && wu[v] != 0.0f ? row[lane + 32 * k] : 0.0f;
            }
#pragma unroll
            for (int v = 0; v < kMergeAhead; v++)
#pragma unroll
                for (int k = 0; k < 8; k++)
                    if (wu[v] != 0.0f) a[k] += wu[v] * x[v][k];
        }
    }
    L = warp_sum(L);
    const float inv = L > 0.0f ? (p.dropout ? p.keep_scale : 1.0f) / L : 0.0f;
    const int64_t oo = o_row(p, s, b, h, i);
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (lane + 32 * k < p.Dv) store_from_float(p.out, p.out_dtype, oo + (lane + 32 * k) * p.o_stride[3], a[k] * inv);
    if (p.lse != nullptr && lane == 0) p.lse[lse_index(p, s, b, h, i)] = lse_of(M, L);
}

// Where a launch goes: the stream, and whether as a programmatic dependent (attn__cuda_decode_pdl).
struct Where {
    cudaStream_t stream;
    bool pdl;
};

// kernel<<<blocks, 32 kDecWarps, smem, at.stream>>>(args...), with the programmatic-dependent
// attribute where at.pdl.
template <typename... K, typename... A>
static int launch(const Where &at, void (*kernel)(K...), int64_t blocks, size_t smem, A... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)blocks), cfg.blockDim = dim3(32 * kDecWarps), cfg.dynamicSmemBytes = smem;
    cfg.stream = at.stream, cfg.attrs = attr, cfg.numAttrs = at.pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <int ROWS, int PL>
static int split_launch(const P &p, int64_t split_keys, int64_t n_splits, int R, float *part, const Where &at) {
    const size_t smem = (size_t)R * (size_t)p.D * sizeof(float);
    cudaError_t err = cudaFuncSetAttribute(decode_split_kernel<ROWS, PL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem);
    if (err != cudaSuccess) return err;
    const int64_t blocks = (n_splits + kDecWarps - 1) / kDecWarps * p.B * p.Hkv;
    return launch(at, decode_split_kernel<ROWS, PL>, blocks, smem, p, split_keys, n_splits, R, part);
}

template <int ROWS>
static int split_by_lanes(const P &p, int64_t split_keys, int64_t n_splits, int R, float *part, const Where &at) {
    const int64_t dmax = p.D > p.Dv ? p.D : p.Dv;
    if (dmax <= 64) return split_launch<ROWS, 2>(p, split_keys, n_splits, R, part, at);
    if (dmax <= 128) return split_launch<ROWS, 4>(p, split_keys, n_splits, R, part, at);
    if constexpr (ROWS <= 4) return split_launch<ROWS, 8>(p, split_keys, n_splits, R, part, at);
    return cudaErrorInvalidValue; // 16 rows of 256 dims: the planner keeps them off (128 accumulators a lane)
}

template <typename T, int D, bool PAGED>
static int vec_launch(const P &p, int64_t split_keys, int64_t n_splits, int R, float *part, const Where &at) {
    const int64_t blocks = (n_splits + kDecWarps - 1) / kDecWarps * p.B * p.Hkv;
    return R <= 1 ? launch(at, decode_vec_kernel<T, D, 1, PAGED>, blocks, 0, p, split_keys, n_splits, R, part)
                  : launch(at, decode_vec_kernel<T, D, 4, PAGED>, blocks, 0, p, split_keys, n_splits, R, part);
}

template <typename T, int D>
static int vec_by_paging(const P &p, int64_t split_keys, int64_t n_splits, int R, float *part, const Where &at) {
    return p.page_table != nullptr ? vec_launch<T, D, true>(p, split_keys, n_splits, R, part, at)
                                   : vec_launch<T, D, false>(p, split_keys, n_splits, R, part, at);
}

template <typename T>
static int vec_by_dim(const P &p, int64_t split_keys, int64_t n_splits, int R, float *part, const Where &at) {
    return p.D == 64 ? vec_by_paging<T, 64>(p, split_keys, n_splits, R, part, at)
                     : vec_by_paging<T, 128>(p, split_keys, n_splits, R, part, at);
}

} // namespace attn_cuda

extern "C" int attn__cuda_decode_pdl(void) {
    cudaFuncAttributes a;
    if (cudaFuncGetAttributes(&a, attn_cuda::decode_combine_kernel) != cudaSuccess) return 0;
    return a.ptxVersion >= 90;
}

extern "C" int attn__cuda_launch_decode(const attn__cuda_sdpa_params *p, int vec, int64_t split_keys, int64_t n_splits,
                                        int rows, float *part, int pdl, cudaStream_t stream) {
    using namespace attn_cuda;
    const Where at = {stream, pdl != 0};
    int err;
    if (vec) // the planner's conditions: BF16 or F16 throughout, D = Dv in {64, 128}, rows <= 4
        err = p->q_dtype == ATTN__CU_BF16 ? vec_by_dim<__nv_bfloat16>(*p, split_keys, n_splits, rows, part, at)
                                          : vec_by_dim<__half>(*p, split_keys, n_splits, rows, part, at);
    else if (rows <= 1) err = split_by_lanes<1>(*p, split_keys, n_splits, rows, part, at);
    else if (rows <= 4) err = split_by_lanes<4>(*p, split_keys, n_splits, rows, part, at);
    else err = split_by_lanes<16>(*p, split_keys, n_splits, rows, part, at);
    if (err != cudaSuccess) return err;
    const int64_t rows_total = p->B * p->Hkv * rows;
    return launch(at, decode_combine_kernel, (rows_total + kDecWarps - 1) / kDecWarps, 0, *p, n_splits, rows,
                  (const float *)part);
}

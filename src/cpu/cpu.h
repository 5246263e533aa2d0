// cpu.h - the CPU kernel table: the few primitives whose speed matters, one implementation per
// instruction set, behind one signature each. The algorithms (tiling, masks, online softmax,
// threads) live in ISA-independent drivers (flash_fwd.c) that call these through the table.
//
// Tile layout used by the flash primitives (FlashAttention-2, computed transposed so that every
// reduction of the online softmax runs across vector registers rather than within them):
//   qt (D, BR):   the query tile, transposed and pre-multiplied by scale*log2(e); BR is the tile
//                 width padded to a multiple of 16 (padding columns are zero)
//   st (nj, BR):  S^T = K qt for the nj keys of a key tile; then, in place, P^T = exp2(S^T - m)
//   ot (Dv, BR):  the output accumulator, transposed
//   m, l (BR):    running maximum (log2 domain) and running sum of each query column
// The rows of qt, st and ot lie ld floats apart (ld >= BR, a multiple of 16): the forward pads them
// when BR floats are a multiple of 512 bytes, whose walks down a column would crowd a few of L1's sets.
// Key and value rows are read in place from the caller's tensors with any strides.
#ifndef ATTN_CPU_H
#define ATTN_CPU_H

#include "half.h"
#include "internal.h"

#define ATTN_TILE_BR_ALIGN 16 // tile widths are multiples of this

// Bytes prep_q may write for rows query rows of D values (a 64-byte header, then 4 bytes a value,
// or 640 a row and group of 64 or 128 values, one group past D / 64).
#define ATTN_QPREP_BYTES(rows, D) (64 + (size_t)(rows) * ((size_t)(D) * 10 + 640))

#define ATTN_PHILOX_LANES 16

struct attn__kernels {
    const char *name;
    attn_isa isa;
    // The general product every tile product is an instance of:
    //   C[m*ldc + n] = (accumulate ? C[m*ldc + n] : 0) + sum_k A[m*a_rs + k*a_cs] * B[k*ldb + n]
    // for m < M, n < N, k < K. A is read element by element (any strides), B and C by rows of
    // vectors: N must be a multiple of ATTN_TILE_BR_ALIGN (pad B and C).
    void (*gemm)(const float *A, int64_t a_rs, int64_t a_cs, int M, int K, const float *B, int64_t ldb, int N, float *C,
                 int64_t ldc, bool accumulate);
    // Online softmax update of one key tile, in place (all in the log2 domain), st[j][i] standing for
    // st[j*ld + i], columns i < br:
    //   m' = max(m, max_j st[j][i]); alpha[i] = exp2(m - m'); st = exp2(st - m');
    //   l = alpha*l + sum_j st[j][i]; m = m'. A column whose m' is -inf gets st = 0, alpha = 0.
    //   br is a multiple of ATTN_TILE_BR_ALIGN (ld too, ld >= br; columns br to ld are neither read
    //   nor written), or 4 or 8 with ld = br: a compact tile of few rows (decoding).
    void (*softmax)(float *st, int nj, int br, int64_t ld, float *m, float *l, float *alpha);
    // ot[d*ld + i] = alpha[i] * ot[d*ld + i] + sum_j v[j*vs_row + d*vs_d] * st[j*ld + i] for i < br
    // (br and ld as softmax's, br a multiple of ATTN_TILE_BR_ALIGN)
    void (*pv)(const float *v, int64_t vs_row, int64_t vs_d, int nj, int Dv, const float *st, int br, int64_t ld,
               const float *alpha, float *ot);
    // y[i] = 2^x[i] for n values, with the error bound documented in attn.h (exp2 of -inf is 0).
    void (*exp2)(const float *x, float *y, int64_t n);
    // Backward: st[j][i] = exp2(st[j][i] - lse2[i]), the forward's weights from scores in the log2
    // domain and the row's log2-sum-exp2 (a row with lse2 = -inf is fully masked: its weights are 0;
    // a hidden score, -inf, gives 0 whatever lse2 holds, NaN included).
    void (*bwd_p)(float *st, int nj, int br, const float *lse2);
    // Backward: dst[j][i] = pt[j][i] * (dst[j][i] - rowdot[i]): the score gradient from the weights,
    // the weights' gradient (in dst) and rowdot = sum_t dout[i][t] * out[i][t]; exactly 0 where
    // pt is 0, whatever dst holds (NaN or inf there must not reach hidden pairs).
    void (*bwd_ds)(const float *pt, float *dst, int nj, int br, const float *rowdot);
    // Decoding, few query rows, k and v of type dt (F32, F16 or BF16, converted as they are loaded):
    //   qk_rows: s[r*s_r + j*s_j] = sum_d q[r*D + d] * k[j*ks_row + d] (r < rows, j < nj; key
    //            elements contiguous), each a dot product of vectors along d (s_r = 1, s_j = ld:
    //            the tile layout of the scores, key j's at s + j*ld);
    //   pv_rows: o[r*ldo + e] = alpha[r] * o[r*ldo + e] + sum_j pt[j*ldp + r] * v[j*vs_row + e]
    //            (r < rows, e < Dv), value rows read as vectors, the weights (in the tile layout)
    //            broadcast; pt's columns up to rows rounded up to a multiple of 4 are read.
    void (*qk_rows)(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const float *q, int rows, float *s,
                    int64_t s_r, int64_t s_j);
    void (*pv_rows)(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt, int64_t ldp,
                    const float *alpha, int rows, float *o, int64_t ldo);
    // y[i] = x[i] converted exactly from ATTN_DTYPE_F16 or ATTN_DTYPE_BF16 to float, n values.
    void (*half_to_f32)(attn_dtype dt, const uint16_t *x, float *y, int64_t n);
    // y[i] = x[i] rounded to ATTN_DTYPE_F16 or ATTN_DTYPE_BF16 to nearest even, n values: the bits
    // attn__f32_to_f16 and attn__f32_to_bf16 give.
    void (*f32_to_half)(attn_dtype dt, const float *x, uint16_t *y, int64_t n);
    // The block types Q8_0 and Q4_0 (attn.h; blocks of 32 values along the rows, ks_row and vs_row
    // multiples of 32, D and Dv too): qk_rows_q and pv_rows_q compute what qk_rows and pv_rows do,
    // dequantising in registers; dequant_rows writes n values (a multiple of 32) of x as floats.
    // prep_q (NULL in tables whose qk_rows_q reads the float rows) writes the rows (rows, D) of q
    // in the form its table's qk_rows_q reads, into ATTN_QPREP_BYTES(rows, D) bytes at out (64-byte
    // aligned), once for a block of queries; qk_rows_q's q is then out (else the float rows). The
    // AVX2, AVX512-VNNI and bf16 tables' block kernels round q to int8 there (quant_kernels_avx2.c,
    // quant_kernels_avx512vnni.c; attn_isa_int8_query).
    void (*qk_rows_q)(attn_dtype dt, const void *k, int64_t ks_row, int nj, int D, const void *q, int rows, float *s,
                      int64_t s_r, int64_t s_j);
    void (*prep_q)(attn_dtype dt, const float *q, int rows, int D, void *out);
    void (*pv_rows_q)(attn_dtype dt, const void *v, int64_t vs_row, int nj, int Dv, const float *pt, int64_t ldp,
                      const float *alpha, int rows, float *o, int64_t ldo);
    void (*dequant_rows)(attn_dtype dt, const void *x, float *y, int64_t n);
    // bf16 products on dot-product instructions (AVX512-BF16's vdpbf16ps: one float32 lane adds the
    // two exact products of a pair of bf16 values; AMX-BF16's tdpbf16ps, the same on tiles); NULL in
    // tables without them. A matrix "packed in
    // pairs" along its reduction index holds elements 2e and 2e+1 of that index side by side.
    //   gemm_bf16: C[m*ldc + n] = (rowscale ? rowscale[m] * C[m*ldc + n] : 0)
    //                             + scale * sum_{e < K2} A(m, e) . B(e, n)   (m < M, n < N)
    //     with A(m, e) the bf16 pair at A + m*a_rs + e*a_ps and B(e, n) the pair at B + 2*(e*ldb + n);
    //     N a multiple of ATTN_TILE_BR_ALIGN.
    //   pack_pairs_bf16: y[2*((r/2)*n + c) + r%2] = x[r*ld + c] rounded to bf16 (to nearest even) for
    //     r < rows rounded up to even (a missing row gives 0) and c < n (a multiple of 16).
    //   pair_rows_bf16: y[2*((r/2)*n + c) + r%2] = x[r*ld + c], bf16 rows of cols values: 0 for
    //     cols <= c < n (a multiple of 16) and for the missing row of an odd count.
    //   round_bf16: y[i] = x[i] rounded to bf16 (to nearest even), n a multiple of 16.
    //   transpose_pairs_bf16: y[2*(e*w + i) + t] = x[i*ld + 2e + t] * 2^k rounded to bf16 (to nearest
    //     even; exact unless that leaves the normal range) for i < rows, 0 for rows <= i < w (a
    //     multiple of 16), e < npairs: bf16 rows (elements contiguous) in pairs along the rows.
    //   softmax_pairs_bf16: softmax (above) for br a multiple of 16 (st's rows ld apart) whose weights
    //     go, rounded to bf16, to y in pack_pairs_bf16's layout (y (ceil(nj/2), br pairs)) instead of
    //     back into st. span (NULL: every key) holds, for columns 16c to 16c + 15, keys [span[2c],
    //     span[2c + 1]) outside which their scores are all -inf: the kernel skips those keys (their
    //     weights written 0).
    //   scale_to_bf16: y[i] = x[i] * scale (a float32 product) rounded to bf16 to nearest even, i < n,
    //     subnormals included (the bits attn__f32_to_bf16 gives).
    void (*gemm_bf16)(const uint16_t *A, int64_t a_rs, int64_t a_ps, int M, int K2, const uint16_t *B, int64_t ldb,
                      int N, float *C, int64_t ldc, const float *rowscale, float scale);
    void (*pack_pairs_bf16)(const float *x, int64_t ld, int rows, int n, uint16_t *y);
    void (*pair_rows_bf16)(const uint16_t *x, int64_t ld, int rows, int cols, int n, uint16_t *y);
    void (*round_bf16)(const float *x, int64_t n, uint16_t *y);
    void (*transpose_pairs_bf16)(const uint16_t *x, int64_t ld, int rows, int npairs, int w, int k, uint16_t *y);
    void (*scale_to_bf16)(const float *x, int64_t n, float scale, uint16_t *y);
    void (*softmax_pairs_bf16)(float *st, int nj, int br, int64_t ld, float *m, float *l, float *alpha, uint16_t *y,
                               const int32_t *span);
    // Dropout (src/philox.h): the Philox4x32-10 words w[word][l] of the counters {c0, i0 + l, c2, c3},
    // l < ATTN_PHILOX_LANES, under key {low, high 32 bits of seed}: one key group of a tile for that
    // many consecutive query rows.
    void (*philox_lanes)(uint32_t c0, int64_t i0, uint32_t c2, uint32_t c3, uint64_t seed,
                         uint32_t w[4][ATTN_PHILOX_LANES]);
};

// S^T = K Q^T: st (nj, br) = k (nj, D at row/feature strides) times qt (D, br), the rows of qt and
// st ld apart.
static inline void attn__qk(const attn__kernels *kn, const float *k, int64_t ks_row, int64_t ks_d, int nj, int D,
                            const float *qt, int br, int64_t ld, float *st) {
    kn->gemm(k, ks_row, ks_d, nj, D, qt, ld, br, st, ld, false);
}

// y[i] = x[i] rounded to bf16, i < n of any size (a table with round_bf16): the kernel on the whole
// vectors, attn__f32_to_bf16 on the last n % 16 values.
static inline void attn__round_bf16_any(const attn__kernels *kn, const float *x, int64_t n, uint16_t *y) {
    const int64_t n16 = n / 16 * 16;
    kn->round_bf16(x, n16, y);
    for (int64_t i = n16; i < n; i++) y[i] = attn__f32_to_bf16(x[i]);
}

extern const attn__kernels attn__kernels_generic;
#if defined(ATTN_HAVE_AVX2)
extern const attn__kernels attn__kernels_avx2;
#if defined(ATTN_HAVE_AVXVNNI)
// Its twin with the block types' decode kernels on AVX-VNNI (the same bits).
extern const attn__kernels attn__kernels_avx2_vnni;
#endif
// The AVX2 philox_lanes and f32_to_half, which the AVX-512 tables share (flash_kernels_avx2.c).
void attn__philox_lanes_avx2(uint32_t c0, int64_t i0, uint32_t c2, uint32_t c3, uint64_t seed,
                             uint32_t w[4][ATTN_PHILOX_LANES]);
void attn__f32_to_half_avx2(attn_dtype dt, const float *x, uint16_t *y, int64_t n);
#endif
#if defined(ATTN_HAVE_AVX512)
extern const attn__kernels attn__kernels_avx512;
#endif
#if defined(ATTN_HAVE_AVX512VNNI)
// The AVX-512 table with the q.k of the block types on 8-bit products (quant_kernels_avx512vnni.c),
// and its twin whose P V pairs keys with AVX512-VBMI's byte permutes (the same bits).
extern const attn__kernels attn__kernels_avx512vnni;
#endif
#if defined(ATTN_HAVE_AVX512VBMI)
extern const attn__kernels attn__kernels_avx512vnni_vbmi;
#endif
#if defined(ATTN_HAVE_AVX512BF16)
// The AVX-512 table with the bf16 entries of flash_kernels_avx512bf16.c.
extern const attn__kernels attn__kernels_avx512bf16;
void attn__gemm_bf16_avx512(const uint16_t *A, int64_t a_rs, int64_t a_ps, int M, int K2, const uint16_t *B,
                            int64_t ldb, int N, float *C, int64_t ldc, const float *rowscale, float scale);
void attn__pack_pairs_bf16_avx512(const float *x, int64_t ld, int rows, int n, uint16_t *y);
void attn__pair_rows_bf16_avx512(const uint16_t *x, int64_t ld, int rows, int cols, int n, uint16_t *y);
void attn__round_bf16_avx512(const float *x, int64_t n, uint16_t *y);
void attn__transpose_pairs_bf16_avx512(const uint16_t *x, int64_t ld, int rows, int npairs, int w, int k, uint16_t *y);
void attn__scale_to_bf16_avx512(const float *x, int64_t n, float scale, uint16_t *y);
void attn__softmax_pairs_bf16_avx512(float *st, int nj, int br, int64_t ld, float *m, float *l, float *alpha,
                                     uint16_t *pp, const int32_t *span);
#endif
#if defined(ATTN_HAVE_AMXBF16)
// The "avx512bf16" table with gemm_bf16 on AMX-BF16 tiles (flash_kernels_amx.c).
extern const attn__kernels attn__kernels_amxbf16;
void attn__gemm_bf16_amx(const uint16_t *A, int64_t a_rs, int64_t a_ps, int M, int K2, const uint16_t *B, int64_t ldb,
                         int N, float *C, int64_t ldc, const float *rowscale, float scale);
#endif

// The table for an ISA request (AUTO: attn__auto_isa on this CPU's capabilities), or NULL if this
// build or this CPU cannot run it. ATTN_ISA_REF has no table (NULL, and *ok = true).
const attn__kernels *attn__kernels_for(attn_isa isa, bool *ok);

// Every table of isa (not AUTO) that this build and this CPU run, attn__kernels_for's first, then
// the forms it passes over (the "avx512vnni" table without AVX512-VBMI's pairing on a CPU with it,
// "avx2" without AVX-VNNI's dot products on a CPU with them),
// which give the same bits: their number (0 for one that does not run, and for ATTN_ISA_REF), for
// tests and benchmarks that compare them.
#define ATTN_MAX_ISA_TABLES 2
int attn__kernel_tables(attn_isa isa, const attn__kernels *out[ATTN_MAX_ISA_TABLES]);

// What AUTO chooses from: the tables this build and this CPU can run, and whether the CPU's bf16 dot
// product (vdpbf16ps) runs fewer flops a cycle than its float32 FMAs, as on Intel's cores (measured
// on Xeons of the Sapphire Rapids generation: half the FMAs' rate, BENCHMARKS.md), where the float32
// kernels on converted values and AVX512-VNNI's decode kernels are the faster ones.
typedef struct attn__isa_caps {
    bool avx2, avx512, avx512_vnni, avx512_bf16, amx_bf16;
    bool slow_bf16_dot;
} attn__isa_caps;

// This build's and this CPU's capabilities (slow_bf16_dot: an Intel CPU; never in the emulated build).
void attn__isa_caps_now(attn__isa_caps *caps);

// AUTO's choice for caps: AMX_BF16, then AVX512_BF16 unless slow_bf16_dot, AVX512_VNNI, AVX512,
// AVX2, GENERIC: the first caps allow.
attn_isa attn__auto_isa(const attn__isa_caps *caps);

// The polynomial of every table's exp2: 2^x = 2^n p(x - n), n = round(x), p(f) = 1 + C1 f + ... +
// C6 f^6 fitted to 2^f on [-0.5, 0.5] for the smallest relative error (below 1.2e-7 for x in
// [-126, 128]; generic/flash_kernels.c has the measured figures, test_kernels checks them).
#define ATTN_EXP2_C1 0.6931471824645996f
#define ATTN_EXP2_C2 0.24022647738456726f
#define ATTN_EXP2_C3 0.055503323674201965f
#define ATTN_EXP2_C4 0.00961843691766262f
#define ATTN_EXP2_C5 0.0013398875016719103f
#define ATTN_EXP2_C6 0.00015353360504377633f

// Scalar exp2 with the same polynomial as every table's exp2 (used by the generic kernels).
float attn__exp2f(float x);

#endif

/*
 * attn_cp.h - context-parallel (ring) attention over MPI: the public interface of libattn_cp.
 *
 * A sequence too long for one process is split along its length across the P ranks of an MPI
 * communicator. Each rank holds a slice of q, k and v (and of the key padding mask). The key/value
 * slices travel around a ring (rank r sends to r+1 and receives from r-1) while every rank runs
 * libattn's fused kernel (attn_sdpa_fwd / attn_sdpa_bwd) on its local queries against the visiting
 * block; the partial results are merged by log-sum-exp (Ring Attention, Liu et al. 2023; the
 * FlashAttention-2 backward with the global log-sum-exp). The transfer of the next block is posted
 * (non-blocking, double-buffered) before the current block is computed, and MPI is polled between
 * kernel calls so that it progresses during the computation. The backward sends the key/value
 * gradients around the ring with the keys and values; each reaches its owner after P steps.
 *
 * The result equals attn_sdpa_fwd / attn_sdpa_bwd on the whole sequence (self-attention: queries
 * and keys share the sequence and its layout) to about 1e-6 relative, with causal masking on global
 * positions, a key padding mask and grouped-query attention. Results are deterministic: the same
 * inputs, world size, layout and poll_rows give the same bits on every run (sums are formed in a
 * fixed order whatever the timing), but not the bits of the single-process call.
 *
 * Conventions are those of attn.h: every function returns an attn_status, never prints, exits or
 * aborts; there is no global state. In addition:
 *  - attn_cp_create, attn_cp_free, attn_cp_fwd and attn_cp_bwd are collective: every rank of the
 *    communicator calls them, in the same order, with descriptors that agree (same layout apart from
 *    the rank, same shapes, causal mode, scale, key-padding dtype). The calls check this: when one
 *    rank rejects its arguments, or the ranks disagree, every rank returns an error (nobody waits
 *    forever on a rank that gave up).
 *  - MPI must be initialised by the caller; MPI_THREAD_FUNNELED is enough (only the calling thread
 *    calls MPI; the context's worker threads do not). Free the handle before MPI_Finalize.
 *  - A failure of MPI itself (a broken link) returns ATTN_ERR_IO with MPI's message; the handle's
 *    communicator is then in an unknown state and the handle should be freed.
 *  - Messages travel on a duplicate of the caller's communicator, so they never match the caller's.
 */
#ifndef ATTN_CP_H
#define ATTN_CP_H

#include <mpi.h>

#include "attn.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(ATTN_CP_SHARED_BUILD)
#define ATTN_CP_API __declspec(dllexport)
#elif defined(_WIN32)
#define ATTN_CP_API __declspec(dllimport)
#elif defined(__GNUC__)
#define ATTN_CP_API __attribute__((visibility("default")))
#else
#define ATTN_CP_API
#endif

/* ------------------------------------------------------------------------------------------ */
/* Layouts: which positions of the sequence a rank holds                                      */
/* ------------------------------------------------------------------------------------------ */

/*
 * The sequence of length L is cut into n chunks of nearly equal length: chunk c holds positions
 * [c*(L/n) + min(c, L%n), ...) with L/n + 1 positions for c < L%n and L/n for the others.
 *  - CONTIGUOUS: n = P, rank r holds chunk r. Causal attention is unbalanced: rank P-1 computes
 *    about 2P-1 times the work of rank 0.
 *  - ZIGZAG: n = 2P, rank r holds chunk r followed by chunk 2P-1-r (in that order in its local
 *    slice), so that with causal masking every rank computes the same work (to within one row).
 * Chunks may be empty when L < n (a rank may then hold nothing): such ranks take part in the ring
 * and pass the blocks on. Without causal masking both layouts do the same work on every rank.
 */
typedef enum attn_cp_chunking {
    ATTN_CP_CONTIGUOUS = 0,
    ATTN_CP_ZIGZAG = 1
} attn_cp_chunking;

/** Where one rank's slice lies in the sequence. Plain data; fill with attn_cp_layout_init. */
typedef struct attn_cp_layout {
    attn_cp_chunking chunking;
    int64_t len; /* L: the global sequence length, >= 1 */
    int rank;    /* this rank, 0 <= rank < world */
    int world;   /* P: the number of ranks, >= 1 */
} attn_cp_layout;

/**
 * Fills and checks a layout.
 * @return ATTN_OK; ATTN_ERR_INVALID_ARG for a NULL layout, an unknown chunking, world < 1 or a rank
 *         outside [0, world); ATTN_ERR_BAD_SHAPE for len < 1; ATTN_ERR_OVERFLOW when 2*world
 *         chunks cannot be counted in int64_t (never in practice).
 */
ATTN_CP_API attn_status attn_cp_layout_init(attn_cp_layout *layout, attn_cp_chunking chunking, int64_t len, int rank,
                                            int world);

/** @return "contiguous", "zigzag" or "?". */
ATTN_CP_API const char *attn_cp_chunking_name(attn_cp_chunking chunking);

/**
 * The rank's chunks in local order: *n_chunks is 1 (CONTIGUOUS) or 2 (ZIGZAG); chunk c covers the
 * global positions [start[c], start[c] + len[c]) and, in the local slice, the rows after those of
 * the chunks before it. len[c] may be 0. Unused entries are set to 0.
 * @return ATTN_ERR_INVALID_ARG for NULL pointers or an invalid layout.
 */
ATTN_CP_API attn_status attn_cp_chunks(const attn_cp_layout *layout, int *n_chunks, int64_t start[2],
                                       int64_t len[2]);

/** *local_len = the number of positions the rank holds (0 is possible when len < chunks). */
ATTN_CP_API attn_status attn_cp_local_len(const attn_cp_layout *layout, int64_t *local_len);

/** @param pos (local_len) receives the global position of each local row, in local order. */
ATTN_CP_API attn_status attn_cp_positions(const attn_cp_layout *layout, int64_t *pos);

/**
 * Copies the rank's rows of a whole tensor into its local slice. The tensor has logical shape
 * shape = (B, H, L, D), the sequence on dimension 2 (shape[2] must equal layout->len); any element
 * type (elem_size bytes: 4 for float, 1 for a BOOL mask). A key padding mask (B, L) is the shape
 * (B, 1, L, 1) with strides {b, 0, l, 0}.
 * @param full   (B, H, L, D) at full_stride (elements)
 * @param local  (B, H, local_len, D) at local_stride (elements); must not overlap full
 * @return ATTN_ERR_INVALID_ARG for NULL pointers (allowed when local_len is 0), elem_size 0,
 *         negative strides or an invalid layout; ATTN_ERR_BAD_SHAPE for sizes < 1 or
 *         shape[2] != layout->len; ATTN_ERR_OVERFLOW when an offset overflows.
 */
ATTN_CP_API attn_status attn_cp_shard(const attn_cp_layout *layout, size_t elem_size, const int64_t shape[4],
                                      const void *full, const int64_t full_stride[4], void *local,
                                      const int64_t local_stride[4]);

/**
 * The inverse of attn_cp_shard: writes the rank's local rows into their places in the whole
 * tensor (other positions are not touched). Gathering every rank's slice (for instance with
 * MPI_Gatherv of the local slices, then attn_cp_unshard with each rank's layout) rebuilds it.
 * Arguments and errors as attn_cp_shard.
 */
ATTN_CP_API attn_status attn_cp_unshard(const attn_cp_layout *layout, size_t elem_size, const int64_t shape[4],
                                        const void *local, const int64_t local_stride[4], void *full,
                                        const int64_t full_stride[4]);

/* ------------------------------------------------------------------------------------------ */
/* The ring                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/**
 * One rank's part of a context-parallel SDPA.
 * `sdpa` describes the LOCAL slices exactly as for attn_sdpa_fwd: batch, n_heads, n_kv_heads (GQA),
 * head_dim, head_dim_v, the element strides of the local q (B, H, Lloc, D), k (B, Hkv, Lloc, D),
 * v (B, Hkv, Lloc, Dv) and out (B, H, Lloc, Dv), scale, and the local slice of the key padding
 * mask (B, Lloc) with its strides and dtype (BOOL or F32), where Lloc = attn_cp_local_len(layout).
 * len_q and len_kv must be 0 or Lloc. `sdpa.causal` applies to global positions (queries and keys
 * share the sequence, so TOP_LEFT and BOTTOM_RIGHT are the same mask); sdpa.softcap applies as in
 * attn_sdpa_fwd, and so do attention sinks (sdpa.sinks, H logits, the same on every rank): each
 * row's sink joins its normaliser once, after the blocks are merged, so out and lse are
 * attn_sdpa_fwd's with sinks; the sinks' gradient is attn_sdpa_sinks_bwd on each rank's rows (this
 * descriptor's sdpa, the rank's out, dout and lse; a rank without rows adds nothing) summed over
 * the ranks (MPI_Allreduce). Not supported (ATTN_ERR_UNSUPPORTED): an attention mask (sdpa.mask), dropout,
 * attention weights, a local window and ALiBi (they depend on positions), kv_dtype other than F32.
 * The block calls are described from attn_sdpa_desc_init with the fields named here; other fields
 * of sdpa are not used.
 */
typedef struct attn_cp_desc {
    attn_cp_layout layout;
    attn_sdpa_desc sdpa;
} attn_cp_desc;

/** Fills `desc`: attn_sdpa_desc_init on sdpa, a zero layout (to be set with attn_cp_layout_init). */
ATTN_CP_API void attn_cp_desc_init(attn_cp_desc *desc);

typedef struct attn_cp_params {
    attn_allocator allocator; /* the handle's buffers; {NULL, NULL, NULL} = aligned_alloc/free */
    int64_t poll_rows;        /* query rows per kernel call: the computation against one block is
                                 cut into calls of at most this many rows, and MPI is polled between
                                 them so that transfers progress while computing (Open MPI moves
                                 large messages only inside MPI calls). 0 = automatic: at most 512
                                 rows, and at least 8 calls per block when calls of 64 rows or more
                                 allow it; -1 = never cut (MPI then progresses only while waiting).
                                 The cut depends on shapes only, never on timing; changing it may
                                 change the order of the backward's sums. */
} attn_cp_params;

/** Fills `params` with the defaults: system allocator, poll_rows 0 (automatic). */
ATTN_CP_API void attn_cp_params_init(attn_cp_params *params);

typedef struct attn_cp attn_cp;

/**
 * Creates a handle on `comm` (collective: duplicates the communicator). The handle owns the ring's
 * buffers, grown by attn_cp_reserve or by the first call that needs more, and the statistics of its
 * last call. One handle must not be used by two threads at once.
 * @return ATTN_OK and *cp; ATTN_ERR_INVALID_ARG for a NULL cp, MPI_COMM_NULL, an inter-communicator,
 *         a half-set allocator or poll_rows < -1; ATTN_ERR_OUT_OF_MEMORY; ATTN_ERR_IO when MPI
 *         fails (MPI not initialised is ATTN_ERR_INVALID_ARG).
 */
ATTN_CP_API attn_status attn_cp_create(MPI_Comm comm, const attn_cp_params *params, attn_cp **cp);

/** Frees a handle and its buffers (collective: frees its communicator). NULL is allowed. */
ATTN_CP_API void attn_cp_free(attn_cp *cp);

/** @return the message of the last failure on this handle ("" if none). Valid until the next call. */
ATTN_CP_API const char *attn_cp_last_error(const attn_cp *cp);

/** @return the handle's rank and size in its communicator (-1 for a NULL handle). */
ATTN_CP_API int attn_cp_rank(const attn_cp *cp);
ATTN_CP_API int attn_cp_world(const attn_cp *cp);

/**
 * Bytes of the buffers the handle needs for `desc` (backward: 0 for attn_cp_fwd, 1 for attn_cp_bwd).
 * The forward keeps two key/value blocks of the longest rank's length and the output and
 * log-sum-exp of one block; the backward two key/value blocks, three key/value-gradient blocks,
 * one more for a call's gradients, and the local dq, plus copies of q, out and dout when their
 * strides are not contiguous (B, H, Lloc, D).
 * Local (not collective). @return as attn_cp_fwd's argument checks.
 */
ATTN_CP_API attn_status attn_cp_workspace_size(const attn_cp *cp, const attn_cp_desc *desc, int backward,
                                               size_t *bytes);

/**
 * Allocates the handle's buffers for `desc` and grows ctx's scratch (attn_ctx_reserve) for the
 * largest kernel call, so that attn_cp_fwd / attn_cp_bwd on such descriptors allocate nothing.
 * Local (not collective). @return ATTN_ERR_OUT_OF_MEMORY; ATTN_ERR_WORKSPACE when ctx has a
 * caller-owned workspace too small for the kernel calls; the argument errors of attn_cp_fwd.
 */
ATTN_CP_API attn_status attn_cp_reserve(attn_cp *cp, attn_ctx *ctx, const attn_cp_desc *desc, int backward);

/**
 * Context-parallel SDPA forward over the whole sequence (collective).
 * @param ctx  the local kernels' context (threads, ISA, scratch); any ISA
 * @param q    (B, H, Lloc, D) at desc->sdpa.q_stride: the rank's queries
 * @param k    (B, Hkv, Lloc, D) at k_stride, v (B, Hkv, Lloc, Dv) at v_stride: the rank's keys/values
 * @param out  (B, H, Lloc, Dv) at o_stride: the rank's rows of the output; must not overlap inputs
 * @param lse  (B, H, Lloc) contiguous: the rows' log-sum-exp over the whole sequence (what
 *             attn_cp_bwd needs), or NULL
 * Pointers may be NULL on a rank whose Lloc is 0.
 * @return ATTN_OK; for bad arguments on any rank (nothing written): ATTN_ERR_INVALID_ARG (NULL
 *         pointers, a layout whose rank/world is not the communicator's, descriptors that disagree
 *         between ranks), ATTN_ERR_BAD_SHAPE, ATTN_ERR_BAD_MASK, ATTN_ERR_OVERFLOW (also a block of
 *         more than 2^32 floats), ATTN_ERR_UNSUPPORTED (mask, dropout, weights), the status of
 *         another rank that rejected its arguments; ATTN_ERR_OUT_OF_MEMORY, ATTN_ERR_WORKSPACE;
 *         ATTN_ERR_IO when MPI fails.
 */
ATTN_CP_API attn_status attn_cp_fwd(attn_cp *cp, attn_ctx *ctx, const attn_cp_desc *desc, const float *q,
                                    const float *k, const float *v, float *out, float *lse);

/**
 * Context-parallel SDPA backward (collective): the gradients of the whole sequence's loss with
 * respect to the rank's q, k and v.
 * @param q, k, v   as given to attn_cp_fwd
 * @param out, lse  attn_cp_fwd's out (at o_stride) and lse ((B, H, Lloc) contiguous)
 * @param dout      (B, H, Lloc, Dv) at o_stride: dLoss/dout of the rank's rows
 * @param dq        (B, H, Lloc, D) at q_stride
 * @param dk, dv    (B, Hkv, Lloc, D) at k_stride and (B, Hkv, Lloc, Dv) at v_stride: the gradients
 *                  of the rank's keys and values from every rank's queries (summed over the query
 *                  heads of each kv head with GQA). Gradient strides must not be 0 on a dimension
 *                  longer than 1.
 * The key/value gradients of a block are summed along the ring, starting at their owner: block r
 * receives the contributions of ranks r, r+1, ..., r-1 in that order; each rank sums its dq over
 * the blocks in the order they arrive. So results are reproducible bit for bit for a given world
 * size, layout and poll_rows, and agree with attn_sdpa_bwd on the whole sequence to about 1e-6.
 * @return as attn_cp_fwd; ATTN_ERR_UNSUPPORTED for a context with ATTN_ISA_REF (the reference
 *         backward recomputes the softmax of each block from the block alone, not from lse).
 */
ATTN_CP_API attn_status attn_cp_bwd(attn_cp *cp, attn_ctx *ctx, const attn_cp_desc *desc, const float *q,
                                    const float *k, const float *v, const float *out, const float *dout,
                                    const float *lse, float *dq, float *dk, float *dv);

/** What the last attn_cp_fwd / attn_cp_bwd on a handle did on this rank. */
typedef struct attn_cp_stats {
    int backward;        /* 0: forward, 1: backward */
    int steps;           /* blocks computed against: P */
    double total_s;      /* wall time of the call (MPI_Wtime), from entry to the ring's end */
    double compute_s;    /* in the local kernels and the merges of their results */
    double wait_s;       /* blocked in MPI waits: communication the computation did not hide (and
                            time spent waiting for a slower neighbour) */
    double progress_s;   /* inside the non-blocking MPI calls (posting, polling): the transport's
                            own work on this thread, e.g. the copies of a shared-memory transport */
    double cells;        /* query-key pairs computed, times B*H (causally hidden pairs excluded) */
    double flops;        /* cells times 2*(D+Dv) (forward) or 6*D+4*Dv (backward) */
    int64_t kernel_calls;/* attn_sdpa_fwd / attn_sdpa_bwd calls */
    int64_t kv_bytes;    /* key/value (and key padding) bytes this rank sent */
    int64_t dkv_bytes;   /* key/value gradient bytes this rank sent (backward) */
    int64_t messages;    /* point-to-point messages this rank sent */
} attn_cp_stats;

/** Copies the statistics of the handle's last successful call (zeros before any). */
ATTN_CP_API attn_status attn_cp_last_stats(const attn_cp *cp, attn_cp_stats *stats);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_CP_H */

// cp_tool.h - the attn-cp command: declarations shared by its sources (tools/cp/).
#ifndef ATTN_CP_TOOL_H
#define ATTN_CP_TOOL_H

#include <stdbool.h>
#include <stdint.h>

#include "attn_cp.h"

// Exit codes, as the attn command: 0 success, 1 a run that failed, 2 a usage error.
enum { CPT_OK = 0, CPT_FAILURE = 1, CPT_USAGE = 2 };

typedef struct cpt_bench_opts {
    int64_t len, batch, heads, kv_heads, head_dim, head_dim_v; // the global problem
    int64_t threads, repeat, poll_rows;
    const char *layout; // "zigzag", "contiguous" or "both"
    const char *isa;    // one of ATTN_ISA_NAMES
    bool causal, backward, json;
    double latency_us;  // per-message latency of the modelled links
} cpt_bench_opts;

// Runs the benchmark on every rank of MPI_COMM_WORLD (collective). Rank 0 prints.
// @return CPT_OK or CPT_FAILURE (with a message on stderr from the rank that saw it).
int cpt_bench(const cpt_bench_opts *o);

#endif

// cli.h - helpers shared by the attn tool's subcommands.
#ifndef ATTN_TOOLS_CLI_H
#define ATTN_TOOLS_CLI_H

#include "args.h"
#include "attn.h"

// Prints "attn CMD: WHAT: <library message or status text>" and returns EXIT_FAILURE_RUN.
int cli_fail(const char *cmd, const attn_ctx *ctx, attn_status st, const char *what);
// attn_ctx_create(params, ctx); on failure prints "attn CMD: cannot create a context: ..." (for an
// --isa this CPU or build cannot run, which ISAs it can) and returns EXIT_FAILURE_RUN, else 0.
int cli_context(const char *cmd, const attn_ctx_params *params, attn_ctx **ctx);
// Prints "attn CMD: <message>" and returns `code`.
int cli_error(const char *cmd, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
// attn_isa_from_name(name, isa); for a name it does not know prints "attn CMD: --isa must be
// <the names>, not 'NAME'" and returns EXIT_USAGE, else 0.
int cli_isa(const char *cmd, const char *name, attn_isa *isa);
// "f32", "f16" or "bf16" (false for anything else).
bool cli_parse_float_dtype(const char *name, attn_dtype *dt); // f32, f16, bf16
bool cli_parse_kv_dtype(const char *name, attn_dtype *dt);    // those and q8_0, q4_0
// "LEFT,RIGHT" (--window of attn sdpa and attn bench), each an integer >= -1 (-1: unbounded).
bool cli_parse_window(const char *s, int64_t *left, int64_t *right);
// Replaces a float32 tensor's values by their conversion to `dt` (F16, BF16, or Q8_0 / Q4_0 with
// its last dimension a multiple of 32), in its own buffer (never larger than the floats).
attn_status cli_to_dtype(attn_tensor *t, attn_dtype dt);
// Replaces the values of a buffer holding numel(t) elements of `dt` (room for as many floats) by
// those values as float32.
attn_status cli_to_float(attn_tensor *t, attn_dtype dt);
// Shape as "(2, 3, 4)" into buf.
const char *cli_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);

int cmd_demo(int argc, char **argv);
int cmd_mha(int argc, char **argv);
int cmd_sdpa(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_decode(int argc, char **argv); // attn bench --op decode
int cmd_bench_mha_decode(int argc, char **argv); // attn bench --op mha-decode
// The benches' clock (seconds, monotonic) and qsort comparison of doubles (cmd_bench.c).
double cli_now(void);
int cli_cmp_double(const void *a, const void *b);
// Whether a tensor of a * b * c * d elements (each >= 1) of up to 8 bytes each passes 2^63 bytes.
bool cli_too_large(int64_t a, int64_t b, int64_t c, int64_t d);
// Appends S positions of standard normal keys and values (B, Hkv, S, D) to kc, a block at a time
// (cmd_bench_decode.c).
attn_status cli_fill_cache(attn_ctx *ctx, attn_kv_cache *kc, int64_t B, int64_t Hkv, int64_t S, int64_t D);
int cmd_bench_cuda(int argc, char **argv);   // attn bench --device cuda

#endif

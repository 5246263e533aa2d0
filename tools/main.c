// main.c - the attn command: dispatches to a subcommand.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const struct {
    const char *name;
    int (*run)(int, char **);
    const char *help;
} commands[] = {
    {"demo", cmd_demo, "walk through attention step by step, printing every tensor as PyTorch does"},
    {"mha", cmd_mha, "nn.MultiheadAttention forward on a state_dict (.safetensors) and .npy inputs"},
    {"sdpa", cmd_sdpa, "scaled dot-product attention on .npy tensors"},
    {"bench", cmd_bench, "time attention on one problem shape (median ms, GFLOP/s, peak memory)"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
    fprintf(f, "usage: attn <command> [options]\n\nattn %s - attention mechanisms in C.\n\nCommands:\n",
            attn_version_string());
    for (size_t i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'attn <command> --help' documents each command. 'attn --version' prints the version.\n"
               "Exit status: 0 on success, 1 when the inputs cannot be processed, 2 for a usage error.\n");
}

int cli_fail(const char *cmd, const attn_ctx *ctx, attn_status st, const char *what) {
    const char *msg = ctx != NULL ? attn_ctx_last_error(ctx) : "";
    fprintf(stderr, "attn %s: %s: %s\n", cmd, what, msg[0] != '\0' ? msg : attn_strerror(st));
    return EXIT_FAILURE_RUN;
}

int cli_context(const char *cmd, const attn_ctx_params *params, attn_ctx **ctx) {
    const attn_status st = attn_ctx_create(params, ctx);
    if (st == ATTN_OK) return 0;
    if (st != ATTN_ERR_UNSUPPORTED || attn_isa_supported(params->isa))
        return cli_error(cmd, EXIT_FAILURE_RUN, "cannot create a context: %s", attn_strerror(st));
    char have[160] = "";
    for (int i = ATTN_ISA_REF; i <= ATTN_ISA_AVX512_VNNI; i++)
        if (attn_isa_supported((attn_isa)i))
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", have[0] != '\0' ? ", " : "",
                     attn_isa_name((attn_isa)i));
    return cli_error(cmd, EXIT_FAILURE_RUN, "cannot create a context: --isa %s is not available on this CPU or in this "
                     "build (available: auto, %s)", attn_isa_name(params->isa), have);
}

int cli_isa(const char *cmd, const char *name, attn_isa *isa) {
    if (attn_isa_from_name(name, isa) == ATTN_OK) return 0;
    return cli_error(cmd, EXIT_USAGE, "--isa must be " ATTN_ISA_NAMES ", not '%s'", name);
}

int cli_error(const char *cmd, int code, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "attn %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return code;
}

// Names of the element types the CLI takes: the float types first, then the quantised k/v blocks.
static const struct {
    const char *name;
    attn_dtype dt;
} dtype_names[] = {{"f32", ATTN_DTYPE_F32}, {"f16", ATTN_DTYPE_F16}, {"bf16", ATTN_DTYPE_BF16},
                   {"q8_0", ATTN_DTYPE_Q8_0}, {"q4_0", ATTN_DTYPE_Q4_0}};

static bool parse_dtype(const char *name, size_t count, attn_dtype *dt) {
    for (size_t i = 0; i < count; i++)
        if (strcmp(name, dtype_names[i].name) == 0) {
            *dt = dtype_names[i].dt;
            return true;
        }
    return false;
}

bool cli_parse_float_dtype(const char *name, attn_dtype *dt) { return parse_dtype(name, 3, dt); }

bool cli_parse_kv_dtype(const char *name, attn_dtype *dt) {
    return parse_dtype(name, sizeof dtype_names / sizeof dtype_names[0], dt);
}

bool cli_parse_window(const char *s, int64_t *left, int64_t *right) {
    char *end;
    long long a = strtoll(s, &end, 10);
    if (end == s || *end != ',') return false;
    const char *r = end + 1;
    long long b = strtoll(r, &end, 10);
    if (end == r || *end != '\0' || a < -1 || b < -1) return false;
    *left = a, *right = b;
    return true;
}

const char *cli_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t len = 0;
    len += (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (len < cap) snprintf(buf + len, cap - len, ")");
    return buf;
}

attn_status cli_to_dtype(attn_tensor *t, attn_dtype dt) {
    const int64_t n = attn_tensor_numel(t);
    const size_t bytes = (size_t)(n / attn_dtype_block_size(dt)) * attn_dtype_size(dt);
    void *h = malloc(bytes + 2);
    if (h == NULL) return ATTN_ERR_OUT_OF_MEMORY;
    attn_status st = attn_convert(dt, h, ATTN_DTYPE_F32, t->data, n);
    if (st == ATTN_OK) memcpy(t->data, h, bytes), t->dtype = dt;
    free(h);
    return st;
}

attn_status cli_to_float(attn_tensor *t, attn_dtype dt) {
    if (dt == ATTN_DTYPE_F32) return ATTN_OK;
    const int64_t n = attn_tensor_numel(t);
    float *f = malloc((size_t)n * sizeof(float) + 4);
    if (f == NULL) return ATTN_ERR_OUT_OF_MEMORY;
    attn_status st = attn_convert(ATTN_DTYPE_F32, f, dt, t->data, n);
    if (st == ATTN_OK) memcpy(t->data, f, (size_t)n * sizeof(float)), t->dtype = ATTN_DTYPE_F32;
    free(f);
    return st;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "attn: no command given (see 'attn --help')\n");
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("attn %s\n", attn_version_string());
        return EXIT_OK;
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "attn: unknown command '%s' (see 'attn --help')\n", argv[1]);
    return EXIT_USAGE;
}

// attn_cp_tool.c - the attn-cp command: context-parallel attention over MPI, run under mpirun.
//
//   mpirun -np P attn-cp bench [options]     times attn_cp_fwd / attn_cp_bwd (see cp_bench.c)
//
// Every rank parses the same command line, so all of them agree on a usage error; only rank 0
// prints. Exit status: 0 success, 1 a run that failed, 2 a usage error.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp_tool.h"

static const char usage[] =
    "usage: mpirun -np P attn-cp bench [--len L] [--batch B] [--heads H] [--kv-heads Hkv] [--head-dim D]\n"
    "                [--head-dim-v Dv] [--causal] [--layout zigzag|contiguous|both] [--backward]\n"
    "                [--repeat R] [--threads T] [--isa NAME] [--poll-rows N]\n"
    "                [--latency-us A] [--json]\n"
    "       attn-cp --help | --version\n"
    "\n"
    "Context-parallel scaled dot-product attention (libattn_cp) over the ranks of MPI_COMM_WORLD: the\n"
    "global sequence of L positions is cut into the ranks' slices (--layout), q, k, v are standard normal.\n"
    "For each layout the forward (and with --backward the backward) runs once to warm up, then R times;\n"
    "rank 0 prints, for the median run, each rank's rows, work (query-key pairs times B*H), time in\n"
    "the kernels, time inside the non-blocking MPI calls, time blocked in MPI waits, total time, the time\n"
    "the same ring of messages takes with no computation (communication alone), the share of it hidden\n"
    "behind the computation (overlap), and the kernels' GFLOP/s; then the balance (largest over mean work) and a model of one ring step on links of\n"
    "25 and 200 GB/s with A microseconds of latency per message (default 10), using the measured speed.\n"
    "--isa picks the kernels (" ATTN_ISA_NAMES "; default auto).\n"
    "--json ends the output with one JSON object.\n"
    "Defaults: L=8192, B=1, H=8, Hkv=H, D=64, Dv=D, zigzag, forward only, R=3, 1 thread per rank, auto\n"
    "kernels, poll-rows 0 (the library's default).";

typedef struct opt {
    const char *name;
    char kind; // 'f' flag, 'i' integer, 'd' double, 's' string
    void *target;
} opt;

static int usage_error(int rank, const char *fmt, const char *arg) {
    if (rank == 0) {
        fprintf(stderr, "attn-cp bench: ");
        fprintf(stderr, fmt, arg);
        fprintf(stderr, " (see attn-cp --help)\n");
    }
    return CPT_USAGE;
}

static int parse_bench(int rank, int argc, char **argv, cpt_bench_opts *o) {
    *o = (cpt_bench_opts){.len = 8192, .batch = 1, .heads = 8, .head_dim = 64, .threads = 1, .repeat = 3,
                          .layout = "zigzag", .isa = "auto", .latency_us = 10.0};
    const opt opts[] = {
        {"--len", 'i', &o->len},           {"--batch", 'i', &o->batch},         {"--heads", 'i', &o->heads},
        {"--kv-heads", 'i', &o->kv_heads}, {"--head-dim", 'i', &o->head_dim}, {"--head-dim-v", 'i', &o->head_dim_v},
        {"--repeat", 'i', &o->repeat},     {"--threads", 'i', &o->threads},   {"--poll-rows", 'i', &o->poll_rows},
        {"--layout", 's', &o->layout},     {"--isa", 's', &o->isa},           {"--latency-us", 'd', &o->latency_us},
        {"--causal", 'f', &o->causal},     {"--backward", 'f', &o->backward}, {"--json", 'f', &o->json},
    };
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        const size_t n = eq != NULL ? (size_t)(eq - a) : strlen(a);
        const opt *hit = NULL;
        for (size_t k = 0; k < sizeof opts / sizeof opts[0] && hit == NULL; k++)
            if (strlen(opts[k].name) == n && strncmp(opts[k].name, a, n) == 0) hit = &opts[k];
        if (hit == NULL) return usage_error(rank, "unknown option '%s'", a);
        if (hit->kind == 'f') {
            if (eq != NULL) return usage_error(rank, "%s takes no value", hit->name);
            *(bool *)hit->target = true;
            continue;
        }
        const char *val = eq != NULL ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (val == NULL || *val == '\0') return usage_error(rank, "%s needs a value", hit->name);
        char *end;
        errno = 0;
        if (hit->kind == 'i') {
            const long long v = strtoll(val, &end, 10);
            if (errno != 0 || *end != '\0') return usage_error(rank, "'%s' is not an integer", val);
            *(int64_t *)hit->target = v;
        } else if (hit->kind == 'd') {
            const double v = strtod(val, &end);
            if (errno != 0 || *end != '\0') return usage_error(rank, "'%s' is not a number", val);
            *(double *)hit->target = v;
        } else {
            *(const char **)hit->target = val;
        }
    }
    if (o->kv_heads == 0) o->kv_heads = o->heads;
    if (o->head_dim_v == 0) o->head_dim_v = o->head_dim;
    if (o->len < 1 || o->batch < 1 || o->heads < 1 || o->kv_heads < 1 || o->head_dim < 1 || o->head_dim_v < 1)
        return usage_error(rank, "%s", "sizes must be >= 1");
    if (o->heads % o->kv_heads != 0) return usage_error(rank, "%s", "--heads must be a multiple of --kv-heads");
    if (o->repeat < 1 || o->repeat > 1000) return usage_error(rank, "%s", "--repeat must be in [1, 1000]");
    if (o->threads < 1 || o->threads > 1024) return usage_error(rank, "%s", "--threads must be in [1, 1024]");
    if (o->poll_rows < -1) return usage_error(rank, "%s", "--poll-rows must be >= -1");
    if (!(o->latency_us >= 0.0 && o->latency_us < 1e6)) return usage_error(rank, "%s", "--latency-us must be >= 0");
    if (strcmp(o->layout, "zigzag") != 0 && strcmp(o->layout, "contiguous") != 0 && strcmp(o->layout, "both") != 0)
        return usage_error(rank, "--layout must be zigzag, contiguous or both, not '%s'", o->layout);
    attn_isa isa;
    if (attn_isa_from_name(o->isa, &isa) != ATTN_OK)
        return usage_error(rank, "--isa must be " ATTN_ISA_NAMES ", not '%s'", o->isa);
    return CPT_OK;
}

int main(int argc, char **argv) {
    int provided = 0, rank = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "attn-cp: MPI_Init_thread failed\n");
        return CPT_FAILURE;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int rc;
    if (argc < 2) {
        if (rank == 0) fprintf(stderr, "%s\n", usage);
        rc = CPT_USAGE;
    } else if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        if (rank == 0) printf("%s\n", usage);
        rc = CPT_OK;
    } else if (strcmp(argv[1], "--version") == 0) {
        if (rank == 0) printf("attn-cp %s\n", attn_version_string());
        rc = CPT_OK;
    } else if (strcmp(argv[1], "bench") == 0) {
        cpt_bench_opts o;
        rc = parse_bench(rank, argc - 2, argv + 2, &o);
        if (rc == CPT_OK) rc = cpt_bench(&o);
    } else {
        if (rank == 0) fprintf(stderr, "attn-cp: unknown command '%s' (see attn-cp --help)\n", argv[1]);
        rc = CPT_USAGE;
    }
    MPI_Finalize();
    return rc;
}

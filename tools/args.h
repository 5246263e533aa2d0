// args.h - command-line options for the attn tool: a table per subcommand, parsed with clear
// one-line errors, and the same table printed as --help.
#ifndef ATTN_TOOLS_ARGS_H
#define ATTN_TOOLS_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum arg_kind { ARG_FLAG, ARG_INT, ARG_FLOAT, ARG_STRING } arg_kind;

typedef struct arg_spec {
    const char *name;    // "--heads"
    arg_kind kind;
    void *target;        // bool*, int64_t*, double*, const char**
    const char *metavar; // "H" (NULL for flags)
    const char *help;
    bool required;
    bool seen;           // set by args_parse
} arg_spec;

// Exit codes of the tool.
enum { EXIT_OK = 0, EXIT_FAILURE_RUN = 1, EXIT_USAGE = 2 };

// Parses argv[1..argc) ("--name value" or "--name=value"). On error prints
// "attn <cmd>: <message>" to stderr and returns EXIT_USAGE. Returns -1 when --help was given
// (after printing the help), 0 on success.
int args_parse(const char *cmd, const char *summary, int argc, char **argv, arg_spec *specs, int n);
// True when the option called `name` was given.
bool args_seen(const arg_spec *specs, int n, const char *name);
void args_help(FILE *f, const char *cmd, const char *summary, const arg_spec *specs, int n);

#endif

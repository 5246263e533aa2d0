// args.c - option parsing for the attn tool (see args.h).
#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

bool args_seen(const arg_spec *specs, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(specs[i].name, name) == 0) return specs[i].seen;
    return false;
}

void args_help(FILE *f, const char *cmd, const char *summary, const arg_spec *specs, int n) {
    fprintf(f, "%s\n\nOptions:\n", summary);
    for (int i = 0; i < n; i++) {
        char left[64];
        if (specs[i].kind == ARG_FLAG)
            snprintf(left, sizeof left, "%s", specs[i].name);
        else
            snprintf(left, sizeof left, "%s %s", specs[i].name, specs[i].metavar ? specs[i].metavar : "X");
        fprintf(f, "  %-26s %s%s\n", left, specs[i].help, specs[i].required ? " (required)" : "");
    }
    fprintf(f, "  %-26s %s\n", "--help", "show this help");
    (void)cmd;
}

static int usage_error(const char *cmd, const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "attn %s: ", cmd);
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, " (see 'attn %s --help')\n", cmd);
    return EXIT_USAGE;
}

static int set_value(const char *cmd, arg_spec *s, const char *val) {
    char *end = NULL;
    errno = 0;
    switch (s->kind) {
    case ARG_INT: {
        long long v = strtoll(val, &end, 10);
        if (end == val || *end != '\0' || errno == ERANGE)
            return usage_error(cmd, "%s expects an integer, got '%s'", s->name, val);
        *(int64_t *)s->target = (int64_t)v;
        return 0;
    }
    case ARG_FLOAT: {
        double v = strtod(val, &end);
        if (end == val || *end != '\0' || errno == ERANGE || !isfinite(v))
            return usage_error(cmd, "%s expects a finite number, got '%s'", s->name, val);
        *(double *)s->target = v;
        return 0;
    }
    case ARG_STRING:
        if (val[0] == '\0') return usage_error(cmd, "%s expects a non-empty value%s", s->name, "");
        *(const char **)s->target = val;
        return 0;
    case ARG_FLAG:
        break;
    }
    return usage_error(cmd, "%s takes no value%s", s->name, "");
}

int args_parse(const char *cmd, const char *summary, int argc, char **argv, arg_spec *specs, int n) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            args_help(stdout, cmd, summary, specs, n);
            return -1;
        }
        if (strncmp(a, "--", 2) != 0) return usage_error(cmd, "unexpected argument '%s'%s", a, "");
        const char *eq = strchr(a, '=');
        size_t len = eq != NULL ? (size_t)(eq - a) : strlen(a);
        arg_spec *s = NULL;
        for (int j = 0; j < n; j++)
            if (strlen(specs[j].name) == len && strncmp(specs[j].name, a, len) == 0) s = &specs[j];
        if (s == NULL) {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(len < 60 ? len : 60), a);
            return usage_error(cmd, "unknown option '%s'%s", name, "");
        }
        if (s->seen) return usage_error(cmd, "%s given more than once%s", s->name, "");
        s->seen = true;
        if (s->kind == ARG_FLAG) {
            if (eq != NULL) return usage_error(cmd, "%s takes no value%s", s->name, "");
            *(bool *)s->target = true;
            continue;
        }
        const char *val = eq != NULL ? eq + 1 : NULL;
        if (val == NULL) {
            if (i + 1 >= argc) return usage_error(cmd, "%s needs a value%s", s->name, "");
            val = argv[++i];
        }
        int rc = set_value(cmd, s, val);
        if (rc != 0) return rc;
    }
    for (int j = 0; j < n; j++)
        if (specs[j].required && !specs[j].seen) return usage_error(cmd, "%s is required%s", specs[j].name, "");
    return 0;
}

/*
 * replay.c - runs a fuzz target without libFuzzer: calls LLVMFuzzerTestOneInput once on every file
 * named on the command line, walking directories recursively, in sorted path order so runs are
 * reproducible. Each input is passed in a buffer of exactly its size. A target reports a failed
 * invariant by aborting, so a failure ends the program with that signal (after naming the input);
 * otherwise it prints how many inputs it ran and exits 0. A path that cannot be read is an error
 * (exit 1).
 */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_data.h"

typedef struct path_list {
    char **items;
    size_t count, cap;
} path_list;

static void add_path(path_list *l, const char *path) {
    if (l->count == l->cap) {
        l->cap = l->cap == 0 ? 64 : 2 * l->cap;
        char **items = realloc(l->items, l->cap * sizeof *items);
        if (items == NULL) {
            fprintf(stderr, "replay: out of memory\n");
            exit(1);
        }
        l->items = items;
    }
    const size_t n = strlen(path) + 1;
    l->items[l->count] = malloc(n);
    if (l->items[l->count] == NULL) {
        fprintf(stderr, "replay: out of memory\n");
        exit(1);
    }
    memcpy(l->items[l->count++], path, n);
}

/* Adds `path` if it is a file, or every file under it if it is a directory. */
static int collect(path_list *l, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: cannot stat '%s'\n", path);
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
        add_path(l, path);
        return 0;
    }
    DIR *d = opendir(path);
    if (d == NULL) {
        fprintf(stderr, "replay: cannot open directory '%s'\n", path);
        return 1;
    }
    int rc = 0;
    const struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (ent->d_name[0] == '.') continue; /* ".", ".." and hidden files */
        const size_t n = strlen(path) + strlen(ent->d_name) + 2;
        char *child = malloc(n);
        if (child == NULL) {
            fprintf(stderr, "replay: out of memory\n");
            exit(1);
        }
        snprintf(child, n, "%s/%s", path, ent->d_name);
        rc |= collect(l, child);
        free(child);
    }
    closedir(d);
    return rc;
}

/* The input being run, named if the target dies on it. */
static const char *current_input;

static void on_fatal_signal(int sig) {
    static const char prefix[] = "replay: the target failed on ";
    if (current_input != NULL) {
        ssize_t r = write(STDERR_FILENO, prefix, sizeof prefix - 1);
        r = write(STDERR_FILENO, current_input, strlen(current_input));
        r = write(STDERR_FILENO, "\n", 1);
        (void)r;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static int cmp_paths(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Reads a whole file into an exactly sized buffer (1 byte, unread, for an empty file). */
static int read_file(const char *path, uint8_t **data, size_t *size) {
    *data = NULL;
    *size = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL) return 1;
    int rc = 0;
    if (fseek(f, 0, SEEK_END) != 0) rc = 1;
    const long len = rc == 0 ? ftell(f) : -1;
    if (len < 0 || fseek(f, 0, SEEK_SET) != 0) rc = 1;
    if (rc == 0) {
        *data = malloc(len > 0 ? (size_t)len : 1); /* never NULL, as under libFuzzer */
        if (*data == NULL || (len > 0 && fread(*data, 1, (size_t)len, f) != (size_t)len)) rc = 1;
        *size = (size_t)len;
    }
    fclose(f);
    if (rc != 0) {
        free(*data);
        *data = NULL;
    }
    return rc;
}

int main(int argc, char **argv) {
    path_list files = {NULL, 0, 0};
    int rc = 0;
    for (int i = 1; i < argc; i++) rc |= collect(&files, argv[i]);
    if (rc != 0) return 1;
    if (files.count > 1) qsort(files.items, files.count, sizeof *files.items, cmp_paths);
    signal(SIGABRT, on_fatal_signal);
    signal(SIGSEGV, on_fatal_signal);
    signal(SIGILL, on_fatal_signal);
    signal(SIGFPE, on_fatal_signal);
    signal(SIGBUS, on_fatal_signal);
    size_t ran = 0;
    for (size_t i = 0; i < files.count; i++) {
        uint8_t *data;
        size_t size;
        if (read_file(files.items[i], &data, &size) != 0) {
            fprintf(stderr, "replay: cannot read '%s'\n", files.items[i]);
            return 1;
        }
        if (getenv("REPLAY_VERBOSE") != NULL) fprintf(stderr, "replay: %s (%zu bytes)\n", files.items[i], size);
        current_input = files.items[i];
        LLVMFuzzerTestOneInput(data, size);
        current_input = NULL;
        free(data);
        ran++;
    }
    for (size_t i = 0; i < files.count; i++) free(files.items[i]);
    free(files.items);
    printf("replay: %zu inputs ran\n", ran);
    return 0;
}

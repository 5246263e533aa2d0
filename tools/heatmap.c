// heatmap.c - labelled heatmaps of attention weights: CSV files, then PNG through matplotlib or
// gnuplot run as child processes (see heatmap.h).
#include "heatmap.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"

#define ANNOTATE_MAX 16 // as plot.py: cells show their values up to 16 x 16

int heatmap_parse_plotter(const char *name, heatmap_plotter *p) {
    static const char *const names[] = {"auto", "matplotlib", "gnuplot"};
    for (int i = 0; i < 3; i++)
        if (strcmp(name, names[i]) == 0) {
            *p = (heatmap_plotter)i;
            return 1;
        }
    return 0;
}

int heatmap_open(heatmap_set *s, const char *cmd, const char *dir) {
    s->cmd = cmd, s->dir = dir, s->count = 0;
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT || mkdir(dir, 0777) != 0)
            return cli_error(cmd, EXIT_FAILURE_RUN, "--plot %s: cannot create the directory: %s", dir, strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) {
        return cli_error(cmd, EXIT_FAILURE_RUN, "--plot %s: exists and is not a directory", dir);
    } else if (access(dir, W_OK | X_OK) != 0) {
        return cli_error(cmd, EXIT_FAILURE_RUN, "--plot %s: the directory is not writable: %s", dir, strerror(errno));
    }
    return EXIT_OK;
}

static int path_of(const heatmap_set *s, const char *name, const char *ext, char *buf, size_t cap) {
    return snprintf(buf, cap, "%s/%s%s", s->dir, name, ext) < (int)cap;
}

int heatmap_add(heatmap_set *s, const char *name, const char *title, const float *w, int64_t rows, int64_t cols,
                const char *const *row_labels, const char *const *col_labels) {
    char path[4096], tmp[4104];
    if (s->count >= HEATMAP_MAX || strlen(name) >= sizeof s->items[0].name || !path_of(s, name, ".csv", path, sizeof path))
        return cli_error(s->cmd, EXIT_FAILURE_RUN, "--plot %s: cannot add the heatmap %s", s->dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL) return cli_error(s->cmd, EXIT_FAILURE_RUN, "--plot: cannot write %s: %s", tmp, strerror(errno));
    fprintf(f, "query/key");
    for (int64_t j = 0; j < cols; j++) fprintf(f, ",%s", col_labels[j]);
    fprintf(f, "\n");
    for (int64_t i = 0; i < rows; i++) {
        fprintf(f, "%s", row_labels[i]);
        for (int64_t j = 0; j < cols; j++) fprintf(f, ",%.9g", (double)w[i * cols + j]);
        fprintf(f, "\n");
    }
    const int bad = ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        const int e = errno;
        remove(tmp);
        return cli_error(s->cmd, EXIT_FAILURE_RUN, "--plot: cannot write %s: %s", path, strerror(e));
    }
    double lo = 0.0, hi = -INFINITY;
    for (int64_t i = 0; i < rows * cols; i++) {
        lo = w[i] < lo ? w[i] : lo;
        hi = w[i] > hi ? w[i] : hi;
    }
    snprintf(s->items[s->count].name, sizeof s->items[0].name, "%s", name);
    snprintf(s->items[s->count].title, sizeof s->items[0].title, "%s", title);
    s->items[s->count].rows = rows, s->items[s->count].cols = cols;
    s->items[s->count].lo = lo, s->items[s->count].hi = hi > lo ? hi : lo + 1.0;
    s->count++;
    return EXIT_OK;
}

// ---- the plotters ---------------------------------------------------------------------------------

// Writes a program's standard input.
typedef void (*emit_fn)(FILE *f, const heatmap_set *s);

// Runs argv (looked up on PATH) in directory dir (NULL: here), what emit writes on its standard
// input, its standard output discarded (and its standard error too when quiet). Returns its exit
// status: 127 when it could not be started, 128 + N when signal N ended it, -1 when no process
// could be made.
static int run(const char *dir, char *const argv[], emit_fn emit, const heatmap_set *s, int quiet) {
    int fd[2];
    if (pipe(fd) != 0) return -1;
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]), close(fd[1]);
        return -1;
    }
    if (pid == 0) { // the child: stdin from the pipe, stdout (and stderr) to /dev/null, then exec
        dup2(fd[0], STDIN_FILENO);
        close(fd[0]), close(fd[1]);
        const int null = open("/dev/null", O_WRONLY);
        if (null >= 0) {
            dup2(null, STDOUT_FILENO);
            if (quiet) dup2(null, STDERR_FILENO);
            close(null);
        }
        if (dir != NULL && chdir(dir) != 0) _exit(127);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(fd[0]);
    struct sigaction ignore, old;
    memset(&ignore, 0, sizeof ignore);
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, &old); // a child that exits early must not end this process
    FILE *in = fdopen(fd[1], "w");
    if (in != NULL) {
        if (emit != NULL) emit(in, s);
        fclose(in);
    } else {
        close(fd[1]);
    }
    sigaction(SIGPIPE, &old, NULL);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

static void emit_python(FILE *f, const heatmap_set *s) {
    (void)s;
    fputs((const char *)heatmap_plot_script, f);
}

// A gnuplot string: single quotes, a quote inside written twice.
static void gp_string(FILE *f, const char *text) {
    fputc('\'', f);
    for (const char *p = text; *p; p++) {
        if (*p == '\'') fputc('\'', f);
        fputc(*p, f);
    }
    fputc('\'', f);
}

// The gnuplot program drawing every CSV of the set, in its directory: the matrix with its row and
// column headers as tics, a viridis-like palette, and the values in the cells of small matrices
// (black on light cells, white on dark ones).
static void emit_gnuplot(FILE *f, const heatmap_set *s) {
    fputs("set datafile separator comma\nset tics scale 0\nset xtics rotate by 45 right\nset xlabel 'key'\n"
          "set ylabel 'query'\nset palette defined (0 '#440154', 1 '#3b528b', 2 '#21918c', 3 '#5ec962', 4 '#fde725')\n",
          f);
    for (int i = 0; i < s->count; i++) {
        const char *name = s->items[i].name;
        const int64_t rows = s->items[i].rows, cols = s->items[i].cols;
        const double lo = s->items[i].lo, hi = s->items[i].hi;
        fprintf(f, "set terminal pngcairo size %lld, %lld noenhanced font ',11'\nset output '%s.png'\nset title ",
                (long long)(cols < 20 ? 200 + 70 * cols : 1600), (long long)(rows < 20 ? 160 + 62 * rows : 1400), name);
        gp_string(f, s->items[i].title);
        fprintf(f, "\nset cbrange [%.9g:%.9g]\nset xrange [-0.5:%lld.5]\nset yrange [%lld.5:-0.5]\n", lo, hi,
                (long long)cols - 1, (long long)rows - 1);
        fprintf(f, "plot '%s.csv' matrix rowheaders columnheaders using 1:2:3 with image notitle", name);
        if (rows <= ANNOTATE_MAX && cols <= ANNOTATE_MAX)
            fprintf(f, ", '' matrix rowheaders columnheaders using 1:2:(sprintf('%%.2f', $3)):($3 > %.9g ? 0 : 0xffffff) "
                       "with labels tc rgb variable notitle", (lo + hi) / 2);
        fputc('\n', f);
    }
}

static int has_matplotlib(const char *python) {
    char *const argv[] = {(char *)python, (char *)"-c", (char *)"import matplotlib", NULL};
    return run(NULL, argv, NULL, NULL, 1) == 0;
}

static int has_gnuplot(void) {
    char *const argv[] = {(char *)"gnuplot", (char *)"--version", NULL};
    return run(NULL, argv, NULL, NULL, 1) == 0;
}

int heatmap_draw(const heatmap_set *s, heatmap_plotter p, const char *python) {
    if (s->count == 0) return EXIT_OK;
    const int mpl = p != HEATMAP_GNUPLOT && has_matplotlib(python);
    const int gp = !mpl && p != HEATMAP_MATPLOTLIB && has_gnuplot();
    if (!mpl && !gp) {
        if (p == HEATMAP_MATPLOTLIB)
            return cli_error(s->cmd, EXIT_FAILURE_RUN, "--plot: no matplotlib: %s cannot import it; the matrices are in "
                             "%s/*.csv", python, s->dir);
        if (p == HEATMAP_GNUPLOT)
            return cli_error(s->cmd, EXIT_FAILURE_RUN, "--plot: gnuplot is not installed; the matrices are in %s/*.csv",
                             s->dir);
        return cli_error(s->cmd, EXIT_FAILURE_RUN, "--plot: no plotter: %s cannot import matplotlib and gnuplot is not "
                         "installed; the matrices are in %s/*.csv", python, s->dir);
    }
    int status;
    if (mpl) {
        // argv: python - CSV PNG TITLE ... (the script from standard input)
        char *argv[2 + 3 * HEATMAP_MAX + 1];
        char files[2 * HEATMAP_MAX][56];
        int n = 0;
        argv[n++] = (char *)python;
        argv[n++] = (char *)"-";
        for (int i = 0; i < s->count; i++) {
            snprintf(files[2 * i], sizeof files[0], "%s.csv", s->items[i].name);
            snprintf(files[2 * i + 1], sizeof files[0], "%s.png", s->items[i].name);
            argv[n++] = files[2 * i];
            argv[n++] = files[2 * i + 1];
            argv[n++] = (char *)s->items[i].title;
        }
        argv[n] = NULL;
        status = run(s->dir, argv, emit_python, s, 0);
    } else {
        char *const argv[] = {(char *)"gnuplot", NULL};
        status = run(s->dir, argv, emit_gnuplot, s, 0);
    }
    const char *used = mpl ? "matplotlib" : "gnuplot";
    if (status != 0)
        return cli_error(s->cmd, EXIT_FAILURE_RUN, "--plot: %s failed (exit status %d); the matrices are in %s/*.csv", used,
                         status, s->dir);
    for (int i = 0; i < s->count; i++) { // the plotter said yes: every PNG must be there
        char path[4096];
        struct stat st;
        if (!path_of(s, s->items[i].name, ".png", path, sizeof path) || stat(path, &st) != 0 || st.st_size == 0)
            return cli_error(s->cmd, EXIT_FAILURE_RUN, "--plot: %s wrote no %s; the matrices are in %s/*.csv", used, path,
                             s->dir);
    }
    printf("attn %s: %d heatmaps drawn with %s: %s/*.png (the matrices: %s/*.csv)\n", s->cmd, s->count, used, s->dir,
           s->dir);
    return EXIT_OK;
}

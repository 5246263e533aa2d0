// heatmap.h - attention-weight matrices as labelled heatmaps, for `attn demo --plot DIR`.
//
// Each matrix is written as DIR/NAME.csv: a header row (a corner cell "query/key", then the keys'
// labels), then one row per query (its label, then its weights, %.9g). heatmap_draw then draws all
// of them as DIR/NAME.png (tokens on both axes, a colour bar, the values in the cells when the
// matrix is at most 16 x 16) with matplotlib, through python/attn/plot.py (compiled into the tool
// and run as `PYTHON - CSV PNG TITLE ...`), or with gnuplot (its pngcairo terminal), whichever is
// present: matplotlib first. The plotters run as child processes in DIR, with their standard output
// discarded; nothing goes through a shell.
#ifndef ATTN_TOOLS_HEATMAP_H
#define ATTN_TOOLS_HEATMAP_H

#include <stdint.h>

typedef enum heatmap_plotter { HEATMAP_AUTO = 0, HEATMAP_MATPLOTLIB = 1, HEATMAP_GNUPLOT = 2 } heatmap_plotter;

#define HEATMAP_MAX 32 // matrices per set

typedef struct heatmap_set {
    const char *cmd; // the subcommand, for messages ("demo")
    const char *dir;
    int count;
    struct {
        char name[48];    // file name without extension
        char title[200];
        int64_t rows, cols;
        double lo, hi;    // the colour scale: min(0, smallest weight) to the largest
    } items[HEATMAP_MAX];
} heatmap_set;

// The text of python/attn/plot.py (generated at build time), NUL-terminated.
extern const unsigned char heatmap_plot_script[];

// "auto", "matplotlib" or "gnuplot"; 0 for another name.
int heatmap_parse_plotter(const char *name, heatmap_plotter *p);

// Starts a set writing into dir, created (one level) when missing. Returns 0, or EXIT_FAILURE_RUN
// after a one-line message when dir is not a directory, cannot be created or is not writable.
int heatmap_open(heatmap_set *s, const char *cmd, const char *dir);

// Writes DIR/NAME.csv (atomically) for the weights w (rows, cols), row-major, with a label per
// query (row_labels) and per key (col_labels), and records it for heatmap_draw. Returns 0, or
// EXIT_FAILURE_RUN after a message.
int heatmap_add(heatmap_set *s, const char *name, const char *title, const float *w, int64_t rows, int64_t cols,
                const char *const *row_labels, const char *const *col_labels);

// Draws every recorded CSV to PNG with the plotter asked for (AUTO: matplotlib through `python`
// when it imports matplotlib, else gnuplot) and prints one line saying where they are. Returns 0,
// or EXIT_FAILURE_RUN after a one-line message when no plotter is present or the plotter fails
// (the CSV files stay).
int heatmap_draw(const heatmap_set *s, heatmap_plotter p, const char *python);

#endif

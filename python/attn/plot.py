"""attn.plot - attention weights as labelled heatmaps, with matplotlib.

    import attn.plot
    ax = attn.plot.heatmap(weights, tokens, title="causal attention")  # (L, S), queries down, keys across
    attn.plot.save_heatmap("weights.png", weights, tokens)              # to a PNG, no window
    fig = attn.plot.heads(weights, tokens)                              # (H, L, S): one panel per head

Weights are anything numpy.asarray takes (arrays, lists, CPU torch tensors): the values of one
attention matrix, row i holding query i's weights over the keys. Labels are the tokens; the keys'
default to the queries'. Cells show their values when the matrix is small enough to read them
(annotate=None: at most 16 x 16).

The file is also the script `attn demo --plot DIR` runs (compiled into the attn tool), and needs
nothing but matplotlib:

    python3 plot.py CSV PNG TITLE [CSV PNG TITLE ...]

draws each CSV file (first row: a corner cell, then the keys' labels; every other row: a query's
label, then its weights) to a PNG file with its title. read_csv reads those files.
"""
import csv
import sys

__all__ = ["heatmap", "heads", "save_heatmap", "read_csv"]

ANNOTATE_MAX = 16  # rows and columns up to which cells show their values by default


def _matrix(weights):
    import numpy as np

    if hasattr(weights, "detach"):  # a torch tensor
        weights = weights.detach().cpu().numpy()
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"attn.plot: weights must be a matrix (L, S), not of shape {w.shape}")
    return w


def _labels(labels, n, what):
    if labels is None:
        return [str(i) for i in range(n)]
    labels = [str(x) for x in labels]
    if len(labels) != n:
        raise ValueError(f"attn.plot: {len(labels)} {what} labels for {n} {what}s")
    return labels


def heatmap(weights, row_labels=None, col_labels=None, title=None, ax=None, annotate=None, cmap="viridis",
            vmin=None, vmax=None, colorbar=True, fmt="{:.2f}"):
    """Draws weights (L, S) as a heatmap: queries (row_labels, L of them) down the left, keys
    (col_labels, S; default row_labels) along the bottom, a colour bar, and the values in the cells
    (annotate: None = when L and S are at most 16). The colour scale runs from min(0, smallest) to
    the largest value unless vmin/vmax say otherwise. Draws on `ax`, or on a new pyplot figure.
    Returns the Axes."""
    w = _matrix(weights)
    L, S = w.shape
    rows = _labels(row_labels, L, "query")
    cols = _labels(col_labels if col_labels is not None else (row_labels if S == L else None), S, "key")
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=_size(L, S))
    lo = min(0.0, float(w.min())) if vmin is None else vmin
    hi = float(w.max()) if vmax is None else vmax
    if hi <= lo:
        hi = lo + 1.0
    im = ax.imshow(w, cmap=cmap, vmin=lo, vmax=hi, aspect="equal", interpolation="nearest")
    ax.set_xticks(range(S))
    ax.set_xticklabels(cols, rotation=45, ha="right", rotation_mode="anchor")
    ax.set_yticks(range(L))
    ax.set_yticklabels(rows)
    ax.tick_params(length=0)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if annotate is None:
        annotate = L <= ANNOTATE_MAX and S <= ANNOTATE_MAX
    if annotate:
        mid = lo + (hi - lo) / 2
        for i in range(L):
            for j in range(S):
                ax.text(j, i, fmt.format(w[i, j]), ha="center", va="center", fontsize=9,
                        color="black" if w[i, j] > mid else "white")
    return ax


def heads(weights, row_labels=None, col_labels=None, title=None, **kwargs):
    """One heatmap per head of weights (H, L, S), side by side, on a new pyplot figure (returned)."""
    import matplotlib.pyplot as plt
    import numpy as np

    if hasattr(weights, "detach"):
        weights = weights.detach().cpu().numpy()
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 3:
        raise ValueError(f"attn.plot.heads: weights must be (H, L, S), not of shape {w.shape}")
    H, L, S = w.shape
    width, height = _size(L, S)
    fig, axes = plt.subplots(1, H, figsize=(width * H, height), squeeze=False)
    for h in range(H):
        heatmap(w[h], row_labels, col_labels, title=f"head {h}", ax=axes[0][h], **kwargs)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def save_heatmap(path, weights, row_labels=None, col_labels=None, title=None, dpi=100, **kwargs):
    """heatmap() on a figure of its own, saved to `path` (PNG, or any format matplotlib writes by
    the name's extension) without pyplot, so no window opens. Returns path."""
    from matplotlib.figure import Figure

    w = _matrix(weights)
    fig = Figure(figsize=_size(*w.shape))
    heatmap(w, row_labels, col_labels, title=title, ax=fig.subplots(), **kwargs)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    return path


def read_csv(path):
    """(weights, row_labels, col_labels) of a CSV file as `attn demo --plot` writes them."""
    import numpy as np

    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    if len(rows) < 2 or any(len(r) != len(rows[0]) for r in rows) or len(rows[0]) < 2:
        raise ValueError(f"{path}: not a labelled matrix (a header row, then rows of the same length)")
    return np.array([[float(x) for x in r[1:]] for r in rows[1:]]), [r[0] for r in rows[1:]], rows[0][1:]


def _size(L, S):
    """A figure size (inches) that leaves cells room for their values and labels."""
    return (min(16.0, 2.6 + 0.62 * S), min(14.0, 1.8 + 0.55 * L))


def main(argv):
    if len(argv) == 0 or len(argv) % 3 != 0:
        print("usage: plot.py CSV PNG TITLE [CSV PNG TITLE ...]", file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    for i in range(0, len(argv), 3):
        w, rows, cols = read_csv(argv[i])
        save_heatmap(argv[i + 1], w, rows, cols, title=argv[i + 2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

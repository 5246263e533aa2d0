"""Tests of attn.plot (python/attn/plot.py): attention weights drawn as labelled heatmaps.

Covered: heatmap() puts the tokens on both axes, a colour bar beside the matrix and each value in
its cell (black on light cells, white on dark ones) when the matrix is at most 16 x 16, none past
that; keys' labels default to the queries'; heads() draws one panel per head; save_heatmap()
writes a PNG without pyplot; torch tensors are taken as they are; bad shapes and label counts raise
ValueError; the script form (`python plot.py CSV PNG TITLE ...`, what `attn demo --plot` runs)
draws the CSV files read_csv reads, and with $ATTN_TOOL set, the files `attn demo --plot` writes.

Run: /usr/bin/python3 tests/python/test_plot.py [-v]. Exits 77 (skipped) without matplotlib.
"""
import os
import subprocess
import sys
import tempfile
import unittest

import source_tree  # tests/python/source_tree.py, beside this file

ROOT = source_tree.ROOT
source_tree.use_package(default_library=False)

try:
    import matplotlib
    import numpy as np
except ImportError as exc:  # pragma: no cover
    print("SKIP: attn.plot's tests need matplotlib and numpy (%s); install python3-matplotlib" % exc, file=sys.stderr)
    sys.exit(77)
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import attn.plot  # noqa: E402

SCRIPT = os.path.join(ROOT, "python", "attn", "plot.py")
TOKENS = ["Your", "journey", "starts", "with", "one", "step"]


def causal_weights(n, seed=0):
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((n, n))
    s[np.triu_indices(n, 1)] = -np.inf
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def is_png(path):
    with open(path, "rb") as fh:
        return fh.read(8) == b"\x89PNG\r\n\x1a\n"


class Heatmap(unittest.TestCase):
    def tearDown(self):
        plt.close("all")

    def test_labels_colorbar_values(self):
        w = causal_weights(6)
        ax = attn.plot.heatmap(w, TOKENS, title="causal")
        self.assertEqual([t.get_text() for t in ax.get_xticklabels()], TOKENS)
        self.assertEqual([t.get_text() for t in ax.get_yticklabels()], TOKENS)
        self.assertEqual((ax.get_xlabel(), ax.get_ylabel(), ax.get_title()), ("key", "query", "causal"))
        self.assertEqual(len(ax.figure.axes), 2)  # the matrix and its colour bar
        texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t for t in ax.texts}
        self.assertEqual(len(texts), 36)
        for i in range(6):
            for j in range(6):
                t = texts[(i, j)]
                self.assertEqual(t.get_text(), "%.2f" % w[i, j])
                light = w[i, j] > w.max() / 2
                self.assertEqual(matplotlib.colors.to_hex(t.get_color()), "#000000" if light else "#ffffff")
        np.testing.assert_array_equal(ax.images[0].get_array(), w)

    def test_rectangular_and_key_labels(self):
        w = np.full((2, 3), 1 / 3)
        ax = attn.plot.heatmap(w, ["a", "b"], ["k1", "k2", "k3"], annotate=False, colorbar=False)
        self.assertEqual([t.get_text() for t in ax.get_xticklabels()], ["k1", "k2", "k3"])
        self.assertEqual(len(ax.texts), 0)
        self.assertEqual(len(ax.figure.axes), 1)

    def test_large_matrix_not_annotated(self):
        ax = attn.plot.heatmap(causal_weights(20), [str(i) for i in range(20)])
        self.assertEqual(len(ax.texts), 0)
        ax = attn.plot.heatmap(causal_weights(16), [str(i) for i in range(16)])
        self.assertEqual(len(ax.texts), 256)

    def test_default_labels_are_positions(self):
        ax = attn.plot.heatmap(causal_weights(3))
        self.assertEqual([t.get_text() for t in ax.get_yticklabels()], ["0", "1", "2"])

    def test_heads(self):
        w = np.stack([causal_weights(6, s) for s in range(3)])
        fig = attn.plot.heads(w, TOKENS, title="three heads")
        panels = [ax for ax in fig.axes if ax.get_title().startswith("head ")]
        self.assertEqual([ax.get_title() for ax in panels], ["head 0", "head 1", "head 2"])
        np.testing.assert_array_equal(panels[2].images[0].get_array(), w[2])
        with self.assertRaises(ValueError):
            attn.plot.heads(w[0], TOKENS)

    def test_errors(self):
        with self.assertRaises(ValueError):
            attn.plot.heatmap(np.zeros((2, 6, 6)), TOKENS)
        with self.assertRaises(ValueError):
            attn.plot.heatmap(causal_weights(6), TOKENS[:5])
        with self.assertRaises(ValueError):
            attn.plot.heatmap(np.zeros((2, 3)), ["a", "b"], ["only", "two"])

    def test_torch_tensor(self):
        try:
            import torch
            torch.zeros(1).numpy()
        except (ImportError, RuntimeError) as exc:  # no torch, or one built against another numpy
            self.skipTest("no usable torch: %s" % exc)
        w = torch.tensor(causal_weights(4), requires_grad=True)
        ax = attn.plot.heatmap(w, list("abcd"))
        np.testing.assert_allclose(ax.images[0].get_array(), w.detach().numpy())

    def test_save_heatmap(self):
        with tempfile.TemporaryDirectory() as d:
            path = attn.plot.save_heatmap(os.path.join(d, "w.png"), causal_weights(6), TOKENS, title="t")
            self.assertTrue(is_png(path))


class Script(unittest.TestCase):
    def write_csv(self, path, w, labels):
        with open(path, "w") as fh:
            fh.write("query/key," + ",".join(labels) + "\n")
            for lab, row in zip(labels, w):
                fh.write(lab + "," + ",".join("%.9g" % x for x in row) + "\n")

    def test_csv_round_trip_and_script(self):
        with tempfile.TemporaryDirectory() as d:
            w = causal_weights(6)
            self.write_csv(os.path.join(d, "a.csv"), w, TOKENS)
            got, rows, cols = attn.plot.read_csv(os.path.join(d, "a.csv"))
            np.testing.assert_allclose(got, w, rtol=1e-8)
            self.assertEqual((rows, cols), (TOKENS, TOKENS))
            self.write_csv(os.path.join(d, "b.csv"), causal_weights(3), ["x", "y", "z"])
            with open(SCRIPT) as fh:  # as attn demo --plot runs it: the script on standard input
                r = subprocess.run([sys.executable, "-", "a.csv", "a.png", "title a", "b.csv", "b.png", "title b"],
                                   stdin=fh, cwd=d, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(is_png(os.path.join(d, "a.png")) and is_png(os.path.join(d, "b.png")))
            r = subprocess.run([sys.executable, SCRIPT, "a.csv", "a.png"], cwd=d, capture_output=True, text=True)
            self.assertEqual(r.returncode, 2)
            self.assertIn("usage", r.stderr)

    def test_malformed_csv(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "bad.csv")
            with open(path, "w") as fh:
                fh.write("query/key,a,b\na,1\n")
            with self.assertRaises(ValueError):
                attn.plot.read_csv(path)

    def test_demo_files(self):
        tool = os.environ.get("ATTN_TOOL")
        if not tool:
            self.skipTest("ATTN_TOOL (the attn command) is not set")
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([tool, "demo", "--plot", d, "--plotter", "matplotlib", "--python", sys.executable],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            w, rows, cols = attn.plot.read_csv(os.path.join(d, "04_causal.csv"))
            self.assertEqual(rows, TOKENS)
            np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6)
            self.assertTrue(np.all(w[np.triu_indices(6, 1)] == 0))
            self.assertTrue(is_png(os.path.join(d, "04_causal.png")))


if __name__ == "__main__":
    unittest.main()

"""Tests of the attn package as a user gets it: `python -m attn`, the library and the tool it
finds, and (with ATTN_EXPECT_INSTALLED=1, as tests/pip_install_test.sh runs it in a fresh virtual
environment) an installation by `pip install .` that is self-contained: the library and the tool
inside the installed package, nothing referring to the source tree or the build.

Run from the build tree by CTest (python_package, PYTHONPATH=python) or by pip_install_test.sh.
Needs numpy only; exits 77 (skipped) without it.
"""
import os
import subprocess
import sys
import sysconfig
import unittest

try:
    import numpy as np
except ImportError as exc:  # pragma: no cover
    print("SKIP: the package's tests need numpy (%s)" % exc, file=sys.stderr)
    sys.exit(77)

import attn  # noqa: E402
from attn import _lib  # noqa: E402

INSTALLED = os.environ.get("ATTN_EXPECT_INSTALLED") == "1"
SOURCE_DIR = os.environ.get("ATTN_SOURCE_DIR")  # the tree the package was built from, if known
PKG = os.path.dirname(os.path.abspath(attn.__file__))


def run_module(*args):
    return subprocess.run([sys.executable, "-m", "attn"] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=300)


class TestModule(unittest.TestCase):
    def test_demo(self):
        r = run_module()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith("attn demo: attention step by step"), r.stdout[:200])
        self.assertIn("== 1. Self-attention without trainable weights", r.stdout)
        self.assertIn("MultiheadAttention", r.stdout)

    def test_arguments_go_to_the_tool(self):
        r = run_module("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("usage: attn <command>", r.stdout)
        self.assertIn(attn.__version__, r.stdout)
        r = run_module("no-such-command")
        self.assertEqual(r.returncode, 2)
        self.assertTrue(r.stderr.strip())

    def test_library_works(self):
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
        s = np.einsum("bhld,bhsd->bhls", q, k) / 2.0
        p = np.exp(s - s.max(-1, keepdims=True))
        want = (p / p.sum(-1, keepdims=True)) @ v
        np.testing.assert_allclose(attn.sdpa(q, k, v), want, rtol=1e-5, atol=1e-6)


@unittest.skipUnless(INSTALLED, "ATTN_EXPECT_INSTALLED=1 is set for an installed package")
class TestInstalled(unittest.TestCase):
    def test_everything_inside_the_package(self):
        site = sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]
        self.assertTrue(any(PKG.startswith(os.path.realpath(s)) or PKG.startswith(s) for s in site), PKG)
        self.assertNotIn("ATTN_LIBRARY", os.environ)
        self.assertEqual(os.path.dirname(os.path.abspath(attn.library_path)), PKG)
        self.assertEqual(os.path.dirname(os.path.dirname(_lib.tool_path())), PKG)

    def test_same_version_as_the_distribution(self):
        from importlib import metadata
        self.assertEqual(metadata.version("attn"), attn.__version__)

    def test_no_reference_to_the_source_tree(self):
        if not SOURCE_DIR:
            self.skipTest("ATTN_SOURCE_DIR not given")
        needle = os.path.realpath(SOURCE_DIR).encode()
        for root, _, files in os.walk(PKG):
            for f in files:
                if f.endswith(".pyc"):
                    continue
                with open(os.path.join(root, f), "rb") as fh:
                    self.assertNotIn(needle, fh.read(), os.path.join(root, f))

    def test_console_script(self):
        exe = os.path.join(sysconfig.get_paths()["scripts"], "attn")
        r = subprocess.run([exe, "--help"], stdout=subprocess.PIPE, universal_newlines=True, timeout=60)
        self.assertEqual(r.returncode, 0)
        self.assertIn("usage: attn <command>", r.stdout)


if __name__ == "__main__":
    print("attn %s from %s, library %s, tool %s" % (attn.__version__, PKG, attn.library_path, _lib.tool_path()),
          file=sys.stderr)
    unittest.main()

"""source_tree.py - the attn package of this source tree, for the tests that run from it (test_binding,
test_plot, test_threads, test_validation, test_torch_validation; fuzz/python/fuzz_binding through
test_binding). The tests that pip_install_test.sh also runs against the installed package
(test_package, test_torch_ops, test_hf) are copied alone and do not import this.

ROOT: the source tree. use_package(): python/ first on sys.path, so `import attn` finds the
package here; with default_library, ATTN_LIBRARY set to build/libattn.so (what `make` builds)
unless the caller set it. numpy_or_skip(): numpy, or exit 77 (skipped) without it.
"""
import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def use_package(default_library=True):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    if default_library:
        os.environ.setdefault("ATTN_LIBRARY", os.path.join(ROOT, "build", "libattn.so"))


def numpy_or_skip():
    try:
        import numpy
    except ImportError:
        print("SKIP: numpy is not installed")
        sys.exit(77)
    return numpy

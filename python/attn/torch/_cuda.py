"""_cuda.py - where CUDA tensors go: libattn_cuda, the CUDA library built beside libattn.

libattn_cuda is a library of its own (CMake ATTN_CUDA=ON where nvcc is found; `pip install .
--config-settings=cmake.define.ATTN_CUDA=ON` puts it in the package beside libattn). It is looked
up like libattn: $ATTN_CUDA_LIBRARY, this package's folder, build/ of the source tree, the system
loader.

This is the one place the torch ops call for CUDA tensors (sdpa_forward / sdpa_backward, with the
tensors the CPU path gets; the calls run on torch.cuda.current_stream(q.device)). Without
libattn_cuda they raise AttnError(ATTN_ERR_UNSUPPORTED) saying so. With it, they still raise: this
version of the package has no binding of libattn_cuda's functions yet.
"""
import ctypes
import ctypes.util
import os
import sys

from .. import _lib
from .._lib import AttnError

_found = []


def _candidates():
    env = os.environ.get("ATTN_CUDA_LIBRARY")
    if env:
        yield env
        return
    names = ["libattn_cuda.dylib"] if sys.platform == "darwin" else ["libattn_cuda.so", "libattn_cuda.so.0"]
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for folder in (pkg, os.path.normpath(os.path.join(pkg, "..", "..", "build"))):
        for n in names:
            p = os.path.join(folder, n)
            if os.path.exists(p):
                yield p
    found = ctypes.util.find_library("attn_cuda")
    if found:
        yield found


def library():
    """(ctypes library, path) of libattn_cuda, or None when it is not installed (looked up once)."""
    if not _found:
        lib = None
        for path in _candidates():
            try:
                lib = (ctypes.CDLL(path), path)
                break
            except OSError:
                continue
        _found.append(lib)
    return _found[0]


def _unavailable(q):
    lib = library()
    if lib is None:
        raise AttnError(_lib.ERR_UNSUPPORTED,
                        "tensors on %s need libattn_cuda, which was not found (build it with CMake "
                        "-DATTN_CUDA=ON where nvcc is present, or set ATTN_CUDA_LIBRARY to it); "
                        "CPU tensors run on libattn" % (q.device,))
    raise AttnError(_lib.ERR_UNSUPPORTED,
                    "libattn_cuda was found at %s, but this version of the attn package does not bind "
                    "it yet: CPU tensors run on libattn" % lib[1])


def sdpa_forward(q, k, v):
    _unavailable(q)


def sdpa_backward(q, k, v):
    _unavailable(q)

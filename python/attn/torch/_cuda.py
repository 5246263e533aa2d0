"""_cuda.py - where CUDA tensors go: libattn_cuda, the CUDA library built beside libattn.

libattn_cuda is a library of its own (CMake ATTN_CUDA=ON where nvcc is found; `pip install .
--config-settings=cmake.define.ATTN_CUDA=ON` puts it in the package beside libattn). It is looked
up like libattn: $ATTN_CUDA_LIBRARY, this package's folder, build/ of the source tree, the system
loader.

The torch ops (_call.py) build the descriptor as for CPU tensors and call run() here: one
attn_cuda_ctx per (thread, device, deterministic), whose stream is set to
torch.cuda.current_stream(device) before every call, so the work is ordered with torch's. Under
torch.use_deterministic_algorithms(True) the calls go to a context made with
attn_cuda_ctx_params.deterministic set, so the backward's dQ is summed without atomics (the same
bits on every run) instead of raising, as torch's own deterministic fallbacks do. Without libattn_cuda, run() raises
AttnError(ATTN_ERR_UNSUPPORTED) saying so.
"""
import ctypes
import ctypes.util
import os
import sys
import threading

from .. import _lib
from .._lib import AttnError

_found = []
_local = threading.local()


class _CtxParams(ctypes.Structure):  # attn_cuda_ctx_params (attn_cuda_ctx_params_init fills all of it)
    _fields_ = [("device", ctypes.c_int), ("stream", ctypes.c_void_p), ("kernels", ctypes.c_int),
                ("deterministic", ctypes.c_int),
                ("alloc", ctypes.c_void_p), ("free", ctypes.c_void_p), ("alloc_user", ctypes.c_void_p)]  # allocator


def _candidates():
    env = os.environ.get("ATTN_CUDA_LIBRARY")
    if env:
        yield env
        return
    names = ["libattn_cuda.dylib"] if sys.platform == "darwin" else ["libattn_cuda.so", "libattn_cuda.so.0"]
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for folder in (pkg, os.path.normpath(os.path.join(pkg, "..", "..", "build")),
                   os.path.normpath(os.path.join(pkg, "..", "..", "build", "src", "cuda"))):
        for n in names:
            p = os.path.join(folder, n)
            if os.path.exists(p):
                yield p
    found = ctypes.util.find_library("attn_cuda")
    if found:
        yield found


def _declare(lib):
    vp, P = ctypes.c_void_p, ctypes.POINTER
    st = ctypes.c_int
    lib.attn_cuda_ctx_params_init.argtypes, lib.attn_cuda_ctx_params_init.restype = [P(_CtxParams)], None
    lib.attn_cuda_ctx_create.argtypes, lib.attn_cuda_ctx_create.restype = [P(_CtxParams), P(vp)], st
    lib.attn_cuda_ctx_set_stream.argtypes, lib.attn_cuda_ctx_set_stream.restype = [vp, vp], st
    lib.attn_cuda_ctx_last_error.argtypes, lib.attn_cuda_ctx_last_error.restype = [vp], ctypes.c_char_p
    lib.attn_cuda_probe.argtypes, lib.attn_cuda_probe.restype = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t], st
    desc = P(_lib.SdpaDesc)
    signatures = {
        "attn_cuda_sdpa_fwd": [vp, desc] + [vp] * 5,
        "attn_cuda_sdpa_bwd": [vp, desc] + [vp] * 10,
        "attn_cuda_sdpa_varlen_fwd": [vp, desc] + [vp] * 7,
        "attn_cuda_sdpa_varlen_bwd": [vp, desc] + [vp] * 10,
    }
    for name, args in signatures.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, st
    return lib


def library():
    """(ctypes library, path) of libattn_cuda, or None when it is not installed (looked up once)."""
    if not _found:
        lib = None
        for path in _candidates():
            try:
                lib = (_declare(ctypes.CDLL(path)), path)
                break
            except (OSError, AttributeError):  # not loadable, or an older library without these symbols
                continue
        _found.append(lib)
    return _found[0]


def _context(lib, device, deterministic=False):
    """This thread's attn_cuda_ctx for `device` (a torch.device of type cuda) and the deterministic
    flag, created on first use."""
    ctxs = getattr(_local, "ctxs", None)
    if ctxs is None:
        ctxs = _local.ctxs = {}
    index = device.index if device.index is not None else 0
    key = (index, bool(deterministic))
    ctx = ctxs.get(key)
    if ctx is None:
        params = _CtxParams()
        lib.attn_cuda_ctx_params_init(ctypes.byref(params))
        params.device = index
        params.deterministic = 1 if deterministic else 0
        ptr = ctypes.c_void_p()
        status = lib.attn_cuda_ctx_create(ctypes.byref(params), ctypes.byref(ptr))
        if status != _lib.OK:
            why = ctypes.create_string_buffer(256)
            lib.attn_cuda_probe(index, why, 256)
            raise AttnError(status, "cuda:%d: %s" % (index, why.value.decode(errors="replace")))
        ctx = ctxs[key] = ptr
    return ctx


def run(name, device, desc, *pointers):
    """Calls libattn_cuda's `name` (attn_cuda_sdpa_fwd, ..._bwd, ..._varlen_fwd, ..._varlen_bwd) with
    the descriptor and the pointers that follow it, on torch's current stream of `device`."""
    import torch

    found = library()
    if found is None:
        raise AttnError(_lib.ERR_UNSUPPORTED,
                        "tensors on %s need libattn_cuda, which was not found (build it with CMake "
                        "-DATTN_CUDA=ON where nvcc is present, or set ATTN_CUDA_LIBRARY to it); "
                        "CPU tensors run on libattn" % (device,))
    lib = found[0]
    with torch.cuda.device(device):
        ctx = _context(lib, device, torch.are_deterministic_algorithms_enabled())
        status = lib.attn_cuda_ctx_set_stream(ctx, ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream))
        if status == _lib.OK:
            status = getattr(lib, name)(ctx, ctypes.byref(desc), *pointers)
    if status != _lib.OK:
        raise AttnError(status, lib.attn_cuda_ctx_last_error(ctx).decode(errors="replace"))

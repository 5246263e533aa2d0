"""files.py - .safetensors files through the library's reader and writer (attn_safetensors_*)."""
import ctypes
from collections import OrderedDict

import numpy as np

from . import _lib
from ._arrays import fail
from ._lib import fn
from .context import resolve

_TO_NP = {
    _lib.DTYPE_F32: np.float32, _lib.DTYPE_F64: np.float64, _lib.DTYPE_F16: np.float16, _lib.DTYPE_BOOL: np.bool_,
    _lib.DTYPE_U8: np.uint8, _lib.DTYPE_I32: np.int32, _lib.DTYPE_I64: np.int64,
}
_FROM_NP = {np.dtype(v): k for k, v in _TO_NP.items()}


class TensorList:
    """An attn_tensor_list over numpy arrays the caller keeps (no copies, nothing owned by C)."""

    def __init__(self, tensors):
        self._keep = []
        items = list(tensors.items())
        self.array = (_lib.Tensor * max(1, len(items)))()
        for i, (name, a) in enumerate(items):
            a = np.ascontiguousarray(a)
            if a.dtype not in _FROM_NP:
                fail(_lib.ERR_UNSUPPORTED, "tensor %r: dtype %s is not one of %s" % (name, a.dtype,
                                                                                     sorted(str(d) for d in _FROM_NP)))
            if a.ndim > _lib.MAX_DIMS:
                fail(_lib.ERR_UNSUPPORTED, "tensor %r has %d dimensions (at most %d)" % (name, a.ndim, _lib.MAX_DIMS))
            bname = str(name).encode()
            self._keep += [a, bname]
            t = self.array[i]
            t.name, t.dtype, t.ndim = bname, _FROM_NP[a.dtype], a.ndim
            t.shape[:a.ndim] = a.shape
            t.data = a.ctypes.data if a.size else None
        self.list = _lib.TensorList(len(items), ctypes.cast(self.array, ctypes.POINTER(_lib.Tensor)))


def _to_numpy(ctx, t):
    shape = tuple(t.shape[:t.ndim])
    n = int(np.prod(shape, dtype=np.int64))
    if t.dtype == _lib.DTYPE_BF16:  # numpy has no bfloat16: widen, exactly
        out = np.empty(shape, dtype=np.float32)
        if n:
            ctx.check(fn("attn_convert")(_lib.DTYPE_F32, out.ctypes.data, _lib.DTYPE_BF16, t.data, n))
        return out
    dt = np.dtype(_TO_NP[t.dtype])
    if n == 0:
        return np.empty(shape, dtype=dt)
    raw = (ctypes.c_char * (n * dt.itemsize)).from_address(t.data)
    return np.frombuffer(raw, dtype=dt).reshape(shape).copy()


def load_safetensors(path, ctx=None):
    """Reads a .safetensors file: an OrderedDict name -> numpy array in the file's order
    (BF16 tensors come back as float32, exactly)."""
    ctx = resolve(ctx)
    lst = _lib.TensorList()
    ctx.check(fn("attn_safetensors_read")(ctx.ptr, str(path).encode(), ctypes.byref(lst)))
    try:
        return OrderedDict((lst.tensors[i].name.decode(), _to_numpy(ctx, lst.tensors[i])) for i in range(lst.count))
    finally:
        fn("attn_tensor_list_release")(ctx.ptr, ctypes.byref(lst))


def save_safetensors(path, tensors, ctx=None):
    """Writes {name: array} to a .safetensors file (atomically), in the dict's order."""
    ctx = resolve(ctx)
    tl = TensorList(tensors)
    ctx.check(fn("attn_safetensors_write")(ctx.ptr, str(path).encode(), tl.array, tl.list.count))

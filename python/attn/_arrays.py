"""_arrays.py - numpy arrays as (pointer, element strides) for the C calls, and argument checks."""
import numpy as np

from . import _lib
from ._lib import AttnError

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
BF16_BITS = np.dtype(np.uint16)  # numpy has no bfloat16: bfloat16 tensors travel as their bits


def fail(status, message):
    raise AttnError(status, message)


def shape_str(shape):
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


def elem_strides(a):
    """a's strides in elements, or None when one is negative or not a multiple of the item size."""
    out = []
    for n, s in zip(a.shape, a.strides):
        if n == 1:
            out.append(0)  # never used to reach an element
        elif s < 0 or s % a.itemsize:
            return None
        else:
            out.append(s // a.itemsize)
    return out


_KINDS = {"f": "a floating-point type", "i": "an integer type", "u": "an integer type", "b": "bool"}


def as_array(a, dtype, what):
    """a as a numpy array of dtype, converted only where every value keeps its meaning: a float
    type from any float type (float64 rounded to float32 as documented), an integer type from any
    integer type (values checked by the library). Complex, object, string, bool or integer arrays
    where floats are meant (and floats where integers are) raise AttnError (ATTN_ERR_INVALID_ARG)
    naming the argument, before any work."""
    want = np.dtype(dtype)
    try:
        src = a if isinstance(a, np.ndarray) else np.asarray(a)
    except (TypeError, ValueError) as exc:
        fail(_lib.ERR_INVALID_ARG, "%s: cannot be read as an array (%s)" % (what, exc))
    ok = src.dtype == want or (want.kind == "f" and src.dtype.kind == "f") or \
        (want.kind in "iu" and src.dtype.kind in "iu")
    if not ok:
        fail(_lib.ERR_INVALID_ARG, "%s: dtype %s where %s (%s) is needed" % (
            what, src.dtype, _KINDS.get(want.kind, want.name), want.name))
    return np.asarray(src, dtype=want)


def view(a, dtype, what):
    """a as an array of dtype (converted only if needed, see as_array) whose strides the library can
    take: returns (array, element strides). A copy is made only for negative strides or strides
    that are not whole elements."""
    a = as_array(a, dtype, what)
    s = elem_strides(a)
    if s is None:
        a = np.ascontiguousarray(a)
        s = elem_strides(a)
    return a, s


def contiguous(a, dtype, what):
    """a as a C-contiguous array of dtype (see as_array)."""
    return np.ascontiguousarray(as_array(a, dtype, what))


def mask_array(mask, what):
    """A mask as (contiguous-or-strided array, dtype code): bool (True = blocked) or a floating-point
    type (added, as float32); any other dtype raises AttnError (ATTN_ERR_BAD_MASK)."""
    m = np.asarray(mask)
    if m.dtype == np.bool_:
        return m, _lib.DTYPE_BOOL
    if m.dtype.kind != "f":
        fail(_lib.ERR_BAD_MASK, "%s must be bool (True = blocked) or floating point (added), not %s" % (what, m.dtype))
    return as_array(m, F32, what), _lib.DTYPE_F32


def ptr(a):
    return a.ctypes.data if a is not None else None


def check_ndim(a, ndim, what, layout):
    if a.ndim != ndim:
        fail(_lib.ERR_BAD_SHAPE, "%s must have %d dimensions %s, got shape %s" % (what, ndim, layout, shape_str(a.shape)))


def check_shape(a, expected, what, names):
    """expected: tuple of ints or None (any size); names: their letters for the message."""
    if len(a.shape) != len(expected) or any(e is not None and e != s for e, s in zip(expected, a.shape)):
        want = ", ".join("%s=%d" % (n, e) if e is not None else n for n, e in zip(names, expected))
        fail(_lib.ERR_BAD_SHAPE, "%s has shape %s, expected (%s)" % (what, shape_str(a.shape), want))


def check_qkv(q, k, v):
    """q (B, H, L, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv), numpy arrays or torch tensors: the
    extents the library cannot check. Returns (B, H, L, D, Hkv, S, Dv)."""
    check_ndim(q, 4, "q", "(B, H, L, D)")
    check_ndim(k, 4, "k", "(B, Hkv, S, D)")
    check_ndim(v, 4, "v", "(B, Hkv, S, Dv)")
    B, H, L, D = q.shape
    check_shape(k, (B, None, None, D), "k", ("B", "Hkv", "S", "D"))
    Hkv, S = k.shape[1], k.shape[2]
    check_shape(v, (B, Hkv, S, None), "v", ("B", "Hkv", "S", "Dv"))
    return B, H, L, D, Hkv, S, v.shape[3]


def check_qkv_varlen(q, k, v):
    """Packed q (total_q, H, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv). Returns
    (total_q, H, D, total_k, Hkv, Dv)."""
    check_ndim(q, 3, "q", "(total_q, H, D)")
    check_ndim(k, 3, "k", "(total_k, Hkv, D)")
    check_ndim(v, 3, "v", "(total_k, Hkv, Dv)")
    Tq, H, D = q.shape
    check_shape(k, (None, None, D), "k", ("total_k", "Hkv", "D"))
    Tk, Hkv = k.shape[0], k.shape[1]
    check_shape(v, (Tk, Hkv, None), "v", ("total_k", "Hkv", "Dv"))
    return Tq, H, D, Tk, Hkv, v.shape[2]


_KV_DTYPES = {"f32": _lib.DTYPE_F32, "float32": _lib.DTYPE_F32, "f16": _lib.DTYPE_F16, "float16": _lib.DTYPE_F16,
              "bf16": _lib.DTYPE_BF16, "bfloat16": _lib.DTYPE_BF16}


def kv_dtype_code(name):
    if name not in _KV_DTYPES:
        fail(_lib.ERR_INVALID_ARG, "dtype must be 'f32', 'f16' or 'bf16', not %r" % (name,))
    return _KV_DTYPES[name]


def kv_views(k, v, kv_dtype):
    """k and v as arrays of one storage type: float32, float16, or bfloat16 bits (uint16, with
    kv_dtype="bf16"). Returns (k, k_strides, v, v_strides, dtype code)."""
    k, v = np.asarray(k), np.asarray(v)
    if kv_dtype is None:
        if k.dtype == F16 and v.dtype == F16:
            code = _lib.DTYPE_F16
        elif k.dtype == BF16_BITS or v.dtype == BF16_BITS:
            fail(_lib.ERR_INVALID_ARG, "uint16 k/v need kv_dtype='bf16' (bfloat16 bits)")
        else:
            code = _lib.DTYPE_F32
    else:
        code = kv_dtype_code(kv_dtype)
    np_dtype = {_lib.DTYPE_F32: F32, _lib.DTYPE_F16: F16, _lib.DTYPE_BF16: BF16_BITS}[code]
    if code == _lib.DTYPE_BF16 and (k.dtype != BF16_BITS or v.dtype != BF16_BITS):
        fail(_lib.ERR_INVALID_ARG, "kv_dtype='bf16' takes k and v as uint16 arrays of bfloat16 bits "
             "(see attn.to_bfloat16), got %s and %s" % (k.dtype, v.dtype))
    if code == _lib.DTYPE_F16 and (k.dtype != F16 or v.dtype != F16):
        fail(_lib.ERR_INVALID_ARG, "kv_dtype='f16' takes float16 k and v, got %s and %s" % (k.dtype, v.dtype))
    k, ks = view(k, np_dtype, "k")
    v, vs = view(v, np_dtype, "v")
    return k, ks, v, vs, code


def mask_view(mask, shape, what):
    """A bool (True = blocked) or float (added) mask broadcast to `shape`.
    Returns (kept-alive array, pointer, dtype code, element strides), or Nones for no mask."""
    if mask is None:
        return None, None, _lib.DTYPE_F32, [0] * len(shape)
    m, code = mask_array(mask, what)
    m, _ = view(m, m.dtype, what)  # whole, non-negative element strides
    try:
        b = np.broadcast_to(m, shape)
    except ValueError:
        fail(_lib.ERR_BAD_MASK, "%s of shape %s does not broadcast to %s" % (what, shape_str(m.shape), shape_str(shape)))
    s = [0 if n == 1 else st // b.itemsize for n, st in zip(b.shape, b.strides)]
    return m, b.ctypes.data, code, s

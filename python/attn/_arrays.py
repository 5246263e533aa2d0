"""_arrays.py - numpy arrays as (pointer, element strides) for the C calls, and argument checks.

Every argument of the package passes through the checks here before any work: arrays through
view()/contiguous()/mask_view() (their element kind must mean what the library reads: floats for
data, bool or float for masks, integers for offsets, uint16 for bfloat16 bits; never complex,
object or string), Python values through real(), integer(), flag() and choice()."""
import numbers
import operator

import numpy as np

from . import _lib
from ._lib import AttnError, AttnTypeError

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
BF16_BITS = np.dtype(np.uint16)  # numpy has no bfloat16: bfloat16 tensors travel as their bits


def fail(status, message):
    raise AttnError(status, message)


def fail_type(message):
    raise AttnTypeError(_lib.ERR_INVALID_ARG, message)


# ---- Python values ------------------------------------------------------------------------------

def real(x, what):
    """x as a float: a real number (int, float, numpy or torch scalar), not a bool, string or complex."""
    if type(x) is float:  # the common case, without the checks' isinstance calls
        return x
    if not isinstance(x, (bool, np.bool_, str, bytes, numbers.Complex)) or isinstance(x, numbers.Real):
        if not isinstance(x, (bool, np.bool_)):
            try:
                return float(x)
            except (TypeError, ValueError):
                pass
    fail_type("%s must be a real number, not %s" % (what, type(x).__name__))


def integer(x, what):
    """x as an int: an integer (int, numpy integer), not a bool, float or string."""
    if isinstance(x, (bool, np.bool_)):
        fail_type("%s must be an integer, not bool" % what)
    try:
        return operator.index(x)
    except TypeError:
        fail_type("%s must be an integer, not %s" % (what, type(x).__name__))


def flag(x, what):
    """x as a bool: True/False (or 0/1, numpy bools)."""
    if isinstance(x, (bool, np.bool_)) or (isinstance(x, numbers.Integral) and x in (0, 1)):
        return bool(x)
    fail_type("%s must be True or False, not %r" % (what, x))


def choice(x, table, what):
    """table[x] for x None, a bool or a string among table's keys; else AttnError naming them."""
    if (x is None or isinstance(x, (bool, str))) and x in table:
        return table[x]
    fail(_lib.ERR_INVALID_ARG, "%s must be one of %s, not %r" % (what, ", ".join(repr(k) for k in table), x))


# ---- arrays ----------------------------------------------------------------------------------------

_KINDS = {"f": "floating-point (float16, float32, float64)", "b": "bool", "i": "integer", "u": "integer"}


def checked(a, dtype, what):
    """a as a numpy array whose element type the library reads as `dtype` without losing meaning:
    floats for a float dtype, bools for bool, integers for an integer dtype, exactly uint16 for
    bfloat16 bits. Complex, object, string and other kinds raise AttnTypeError naming `what`."""
    try:
        arr = np.asarray(a)
    except Exception as exc:  # ragged lists and the like
        fail_type("%s: cannot be read as an array (%s)" % (what, exc))
    want = np.dtype(dtype)
    kind = arr.dtype.kind
    ok = arr.dtype == want if want == BF16_BITS else kind == want.kind or (want.kind in "iu" and kind in "iu")
    if not ok:
        expected = "uint16 (bfloat16 bits)" if want == BF16_BITS else _KINDS[want.kind]
        fail_type("%s: %s arrays are not accepted, expected %s" % (what, arr.dtype, expected))
    return arr


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


def view(a, dtype, what):
    """a as an array of dtype (converted only if needed) whose strides the library can take:
    returns (array, element strides). A copy is made only for negative strides or strides that are
    not whole elements."""
    a = checked(a, dtype, what).astype(dtype, copy=False)
    s = elem_strides(a)
    if s is None:
        a = np.ascontiguousarray(a)
        s = elem_strides(a)
    return a, s


def contiguous(a, dtype, what):
    return np.ascontiguousarray(checked(a, dtype, what), dtype=dtype)


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
    kB, Hkv, S, kD = k.shape
    if kB != B or kD != D:
        check_shape(k, (B, None, None, D), "k", ("B", "Hkv", "S", "D"))
    vB, vH, vS, Dv = v.shape
    if vB != B or vH != Hkv or vS != S:
        check_shape(v, (B, Hkv, S, None), "v", ("B", "Hkv", "S", "Dv"))
    return B, H, L, D, Hkv, S, Dv


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


def kv_dtype_code(name, what="dtype"):
    return choice(name, _KV_DTYPES, what)


def kv_views(k, v, kv_dtype):
    """k and v as arrays of one storage type: float32, float16, or bfloat16 bits (uint16, with
    kv_dtype="bf16"). Returns (k, k_strides, v, v_strides, dtype code)."""
    if kv_dtype is None and any(getattr(a, "dtype", None) == BF16_BITS for a in (k, v)):
        fail(_lib.ERR_INVALID_ARG, "uint16 k/v need kv_dtype='bf16' (bfloat16 bits)")
    k = checked(k, BF16_BITS if kv_dtype in ("bf16", "bfloat16") else F32, "k")
    v = checked(v, BF16_BITS if kv_dtype in ("bf16", "bfloat16") else F32, "v")
    if k.dtype != v.dtype:
        fail_type("k and v must have the same dtype, got %s and %s" % (k.dtype, v.dtype))
    if kv_dtype is None:
        if k.dtype == F16 and v.dtype == F16:
            code = _lib.DTYPE_F16
        else:
            code = _lib.DTYPE_F32
    else:
        code = kv_dtype_code(kv_dtype, "kv_dtype")
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
    code = mask_code(mask, what)
    m, _ = view(mask, np.bool_ if code == _lib.DTYPE_BOOL else F32, what)
    try:
        b = np.broadcast_to(m, shape)
    except ValueError:
        fail(_lib.ERR_BAD_MASK, "%s of shape %s does not broadcast to %s" % (what, shape_str(m.shape), shape_str(shape)))
    s = [0 if n == 1 else st // b.itemsize for n, st in zip(b.shape, b.strides)]
    return m, b.ctypes.data, code, s


def mask_code(mask, what):
    """DTYPE_BOOL for a bool mask, DTYPE_F32 for a float one (read as float32); integer, complex
    and other masks have no defined meaning and raise AttnTypeError."""
    try:
        m = np.asarray(mask)
    except Exception as exc:
        fail_type("%s: cannot be read as an array (%s)" % (what, exc))
    if m.dtype == np.bool_:
        return _lib.DTYPE_BOOL
    if m.dtype.kind != "f":
        fail_type("%s: %s masks are not accepted, expected bool (True = blocked) or floating-point (added)"
                  % (what, m.dtype))
    return _lib.DTYPE_F32

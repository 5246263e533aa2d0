"""_lib.py - loads libattn and declares the C structs and function prototypes of include/attn.h.

The library is looked up in this order:
  1. the path in the environment variable ATTN_LIBRARY;
  2. this package's own folder, where `pip install .` puts it (attn/libattn.so);
  3. build/ of the source tree this package sits in (python/attn/../../build), as `make` leaves it;
  4. the system loader (an installed libattn.so.0 / libattn.so).
Functions are resolved on first use, so a library that lacks a symbol still loads; calling a
binding whose symbol is missing raises AttnError with status ATTN_ERR_UNSUPPORTED, and
has_symbol() says in advance.
"""
import ctypes
import ctypes.util
import os
import sys

# ---- status codes and the exception ------------------------------------------------------------

STATUS_NAMES = {
    0: "ATTN_OK",
    1: "ATTN_ERR_INVALID_ARG",
    2: "ATTN_ERR_BAD_SHAPE",
    3: "ATTN_ERR_OVERFLOW",
    4: "ATTN_ERR_OUT_OF_MEMORY",
    5: "ATTN_ERR_BAD_MASK",
    6: "ATTN_ERR_CONTEXT_LENGTH",
    7: "ATTN_ERR_WORKSPACE",
    8: "ATTN_ERR_UNSUPPORTED",
    9: "ATTN_ERR_NOT_FOUND",
    10: "ATTN_ERR_IO",
    11: "ATTN_ERR_BAD_FILE",
    12: "ATTN_ERR_CAPACITY",
    13: "ATTN_ERR_DEVICE",
}
_STATUS_BY_NAME = {v: k for k, v in STATUS_NAMES.items()}

OK = 0
ERR_INVALID_ARG = 1
ERR_BAD_SHAPE = 2
ERR_BAD_MASK = 5
ERR_UNSUPPORTED = 8


class AttnError(RuntimeError):
    """A libattn call failed, or the binding rejected its arguments before calling (a RuntimeError,
    as torch's own operators raise for the same mistakes; AttnTypeError for an argument of the
    wrong type).

    status: the attn_status value (int); name: its enum name ("ATTN_ERR_BAD_SHAPE");
    message: the context's attn_ctx_last_error() (or the binding's own message)."""

    def __init__(self, status, message=""):
        self.status = int(status)
        self.name = STATUS_NAMES.get(self.status, "ATTN_ERR_%d" % self.status)
        self.message = message
        super().__init__("%s: %s" % (self.name, message) if message else self.name)


class AttnTypeError(AttnError, TypeError):
    """An argument of a type the library cannot take (a complex, integer or object array where
    floats are meant, a string where a number is): ATTN_ERR_INVALID_ARG, and a TypeError."""


# ---- finding and loading the library -----------------------------------------------------------

def _candidates():
    env = os.environ.get("ATTN_LIBRARY")
    if env:
        yield env
        return
    if sys.platform == "darwin":
        names = ["libattn.dylib", "libattn.0.dylib"]
    elif sys.platform == "win32":
        names = ["attn.dll", "libattn.dll"]
    else:
        names = ["libattn.so", "libattn.so.0"]
    here = os.path.dirname(os.path.abspath(__file__))
    build = os.path.normpath(os.path.join(here, "..", "..", "build"))
    for folder in (here, build):
        for n in names:
            p = os.path.join(folder, n)
            if os.path.exists(p):
                yield p
    for n in names:
        yield n
    found = ctypes.util.find_library("attn")
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as exc:
            tried.append("%s (%s)" % (path, exc))
    raise ImportError("libattn not found; install the package (pip install .), build it with `make`, or set "
                      "ATTN_LIBRARY to its path. Tried: "
                      + "; ".join(tried))


lib, path = _load()


def tool_path():
    """Path of the `attn` command-line tool that goes with this package, or None: $ATTN_TOOL, the
    copy `pip install .` puts inside the package (attn/bin/attn), then build/attn of the source tree
    this package sits in. PATH is not searched (the `attn` there may be this package's own script)."""
    env = os.environ.get("ATTN_TOOL")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    exe = "attn.exe" if sys.platform == "win32" else "attn"
    for p in (os.path.join(here, "bin", exe), os.path.normpath(os.path.join(here, "..", "..", "build", exe))):
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None

# ---- enums ---------------------------------------------------------------------------------------

DTYPE_F32, DTYPE_F64, DTYPE_F16, DTYPE_BF16, DTYPE_BOOL, DTYPE_U8, DTYPE_I32, DTYPE_I64 = range(8)
ISA = {"auto": 0, "ref": 1, "generic": 2, "avx2": 3, "avx512": 4, "avx512bf16": 5, "amxbf16": 6, "avx512vnni": 7}
CAUSAL = {None: 0, False: 0, "none": 0, "top_left": 1, True: 1, "bottom_right": 2}
WEIGHTS = {None: 0, False: 0, "per_head": 1, "average": 2}
DROPOUT_RNG_PHILOX = 1  # attn_dropout_rng

# ---- structs (field for field as in attn.h) ---------------------------------------------------

c_int64_p = ctypes.POINTER(ctypes.c_int64)
c_float_p = ctypes.POINTER(ctypes.c_float)
I64x4 = ctypes.c_int64 * 4


class Generator(ctypes.Structure):
    _fields_ = [("mt", ctypes.c_uint32 * 624), ("left", ctypes.c_int32), ("next", ctypes.c_int32),
                ("has_normal", ctypes.c_int32), ("reserved", ctypes.c_int32), ("normal", ctypes.c_double)]


class Allocator(ctypes.Structure):
    _fields_ = [("alloc", ctypes.c_void_p), ("free", ctypes.c_void_p), ("user", ctypes.c_void_p)]


class Executor(ctypes.Structure):
    _fields_ = [("parallel", ctypes.c_void_p), ("user", ctypes.c_void_p)]


class CtxParams(ctypes.Structure):
    _fields_ = [("n_threads", ctypes.c_int), ("isa", ctypes.c_int), ("seed", ctypes.c_uint64),
                ("allocator", Allocator), ("use_blas", ctypes.c_int), ("executor", Executor)]


class SdpaDesc(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int64), ("n_heads", ctypes.c_int64), ("n_kv_heads", ctypes.c_int64),
                ("len_q", ctypes.c_int64), ("len_kv", ctypes.c_int64), ("head_dim", ctypes.c_int64),
                ("head_dim_v", ctypes.c_int64),
                ("q_stride", I64x4), ("k_stride", I64x4), ("v_stride", I64x4), ("o_stride", I64x4),
                ("scale", ctypes.c_float), ("causal", ctypes.c_int),
                ("mask", ctypes.c_void_p), ("mask_dtype", ctypes.c_int), ("mask_stride", I64x4),
                ("key_padding_mask", ctypes.c_void_p), ("key_padding_mask_dtype", ctypes.c_int),
                ("key_padding_mask_stride", ctypes.c_int64 * 2),
                ("dropout_p", ctypes.c_double), ("weights_mode", ctypes.c_int),
                ("use_window", ctypes.c_int), ("window_left", ctypes.c_int64), ("window_right", ctypes.c_int64),
                ("alibi_slopes", ctypes.c_void_p), ("softcap", ctypes.c_float), ("kv_dtype", ctypes.c_int),
                ("q_dtype", ctypes.c_int), ("out_dtype", ctypes.c_int), ("grad_dtype", ctypes.c_int),
                ("dropout_rng", ctypes.c_int), ("dropout_offset", ctypes.c_uint32), ("dropout_seed", ctypes.c_uint64),
                ("sinks", ctypes.c_void_p)]


class KVCacheConfig(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int64), ("n_kv_heads", ctypes.c_int64), ("head_dim", ctypes.c_int64),
                ("head_dim_v", ctypes.c_int64), ("capacity", ctypes.c_int64), ("dtype", ctypes.c_int)]


class MhaConfig(ctypes.Structure):
    _fields_ = [("embed_dim", ctypes.c_int64), ("num_heads", ctypes.c_int64), ("kdim", ctypes.c_int64),
                ("vdim", ctypes.c_int64), ("bias", ctypes.c_int), ("add_bias_kv", ctypes.c_int),
                ("add_zero_attn", ctypes.c_int), ("batch_first", ctypes.c_int), ("dropout", ctypes.c_double),
                ("dtype", ctypes.c_int)]


class MhaArgs(ctypes.Structure):
    _fields_ = [("query", ctypes.c_void_p), ("key", ctypes.c_void_p), ("value", ctypes.c_void_p),
                ("batch", ctypes.c_int64), ("len_q", ctypes.c_int64), ("len_kv", ctypes.c_int64),
                ("unbatched", ctypes.c_int),
                ("attn_mask", ctypes.c_void_p), ("attn_mask_dtype", ctypes.c_int), ("attn_mask_ndim", ctypes.c_int),
                ("key_padding_mask", ctypes.c_void_p), ("key_padding_mask_dtype", ctypes.c_int),
                ("causal", ctypes.c_int), ("need_weights", ctypes.c_int), ("average_attn_weights", ctypes.c_int),
                ("training", ctypes.c_int)]


MAX_DIMS = 8


class Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * MAX_DIMS), ("data", ctypes.c_void_p)]


class TensorList(ctypes.Structure):
    _fields_ = [("count", ctypes.c_int), ("tensors", ctypes.POINTER(Tensor))]


# ---- prototypes ----------------------------------------------------------------------------------

P = ctypes.POINTER
vp, i64, i32, f64, st = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double, ctypes.c_int
_PROTOTYPES = {
    "attn_version_number": (ctypes.c_int, []),
    "attn_version_string": (ctypes.c_char_p, []),
    "attn_strerror": (ctypes.c_char_p, [st]),
    "attn_dtype_size": (ctypes.c_size_t, [i32]),
    "attn_dtype_name": (ctypes.c_char_p, [i32]),
    "attn_convert": (st, [i32, vp, i32, vp, i64]),
    "attn_generator_seed": (None, [P(Generator), ctypes.c_uint64]),
    "attn_isa_supported": (ctypes.c_int, [i32]),
    "attn_isa_name": (ctypes.c_char_p, [i32]),
    "attn_has_blas": (ctypes.c_int, []),
    "attn_ctx_params_init": (None, [P(CtxParams)]),
    "attn_ctx_create": (st, [P(CtxParams), P(vp)]),
    "attn_executor_gomp": (st, [vp, P(Executor)]),
    "attn_ctx_isa": (i32, [vp]),
    "attn_ctx_free": (None, [vp]),
    "attn_ctx_last_error": (ctypes.c_char_p, [vp]),
    "attn_ctx_generator": (P(Generator), [vp]),
    "attn_ctx_reserve": (st, [vp, ctypes.c_size_t]),
    "attn_sdpa_desc_init": (None, [P(SdpaDesc)]),
    "attn_sdpa_fwd": (st, [vp, P(SdpaDesc), vp, vp, vp, vp, vp, vp]),
    "attn_sdpa_bwd": (st, [vp, P(SdpaDesc), vp, vp, vp, vp, vp, vp, P(Generator), vp, vp, vp, vp]),
    "attn_sdpa_sinks_bwd": (st, [vp, P(SdpaDesc), vp, vp, vp, vp, vp, vp]),
    "attn_sdpa_varlen_fwd": (st, [vp, P(SdpaDesc), vp, vp, vp, vp, vp, vp, vp]),
    "attn_sdpa_varlen_bwd": (st, [vp, P(SdpaDesc), vp, vp, vp, vp, vp, vp, vp, vp, P(Generator), vp, vp, vp]),
    "attn_kv_cache_config_init": (None, [P(KVCacheConfig)]),
    "attn_kv_cache_create": (st, [vp, P(KVCacheConfig), P(vp)]),
    "attn_kv_cache_free": (None, [vp]),
    "attn_kv_cache_get_config": (P(KVCacheConfig), [vp]),
    "attn_kv_cache_length": (i64, [vp]),
    "attn_kv_cache_append": (st, [vp, vp, i64, vp, c_int64_p, vp, c_int64_p]),
    "attn_kv_cache_truncate": (st, [vp, vp, i64]),
    "attn_kv_cache_reset": (None, [vp]),
    "attn_kv_cache_storage": (None, [vp, P(vp), c_int64_p, P(vp), c_int64_p]),
    "attn_kv_cache_attend": (st, [vp, vp, P(SdpaDesc), vp, vp, vp]),
    "attn_mha_config_init": (None, [P(MhaConfig), i64, i64]),
    "attn_mha_create": (st, [vp, P(MhaConfig), P(vp)]),
    "attn_mha_free": (None, [vp]),
    "attn_mha_get_config": (P(MhaConfig), [vp]),
    "attn_mha_param_count": (ctypes.c_int, [vp]),
    "attn_mha_param_at": (st, [vp, ctypes.c_int, P(ctypes.c_char_p), P(ctypes.c_int), c_int64_p, P(c_float_p)]),
    "attn_mha_param_typed_at": (st, [vp, ctypes.c_int, P(ctypes.c_char_p), P(ctypes.c_int), c_int64_p, P(ctypes.c_int),
                                     P(vp)]),
    "attn_mha_args_init": (None, [P(MhaArgs)]),
    "attn_mha_weights_len_kv": (i64, [vp, i64]),
    "attn_mha_forward": (st, [vp, vp, P(MhaArgs), vp, vp]),
    "attn_mha_forward_cached": (st, [vp, vp, vp, vp, i64, i64, vp]),
    "attn_mha_create_from_state": (st, [vp, P(TensorList), i64, P(MhaConfig), P(vp)]),
    "attn_safetensors_read": (st, [vp, ctypes.c_char_p, P(TensorList)]),
    "attn_safetensors_write": (st, [vp, ctypes.c_char_p, P(Tensor), ctypes.c_int]),
    "attn_tensor_list_release": (None, [vp, P(TensorList)]),
}
del P, vp, i64, i32, f64, st

_resolved = {}


def has_symbol(name):
    """Whether the loaded library exports `name` (e.g. "attn_sdpa_varlen_fwd")."""
    try:
        getattr(lib, name)
        return True
    except AttributeError:
        return False


def fn(name):
    """The ctypes function `name` with its prototype; AttnError(ATTN_ERR_UNSUPPORTED) if the
    loaded library does not export it."""
    f = _resolved.get(name)
    if f is None:
        try:
            f = getattr(lib, name)
        except AttributeError:
            raise AttnError(ERR_UNSUPPORTED, "%s is not exported by %s (an older build?)" % (name, path)) from None
        f.restype, f.argtypes = _PROTOTYPES[name]
        _resolved[name] = f
    return f


def strerror(status):
    return fn("attn_strerror")(status).decode()


def check(status, ctx_ptr=None):
    """Raises AttnError for a non-OK status, with the context's last error message."""
    if status != OK:
        msg = ""
        if ctx_ptr:
            msg = fn("attn_ctx_last_error")(ctx_ptr).decode(errors="replace")
        if not msg:
            msg = strerror(status)
        raise AttnError(status, msg)

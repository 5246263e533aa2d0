"""attn - Python binding of libattn (ctypes + numpy).

    import numpy as np, attn
    q = np.random.randn(2, 8, 16, 64).astype(np.float32)
    k = v = np.random.randn(2, 2, 16, 64).astype(np.float32)
    out, lse = attn.sdpa(q, k, v, causal="top_left", return_lse=True)
    dq, dk, dv = attn.sdpa_backward(q, k, v, out, np.ones_like(out), lse, causal="top_left")

What is here:
  Context                 an attn_ctx (threads, kernel set, seed); calls default to one per thread
  openmp_runtime          the OpenMP runtime loaded in the process (Context(openmp=True) runs on it)
  sdpa, sdpa_backward     scaled dot-product attention on (B, H, L, D) arrays, any strides
  sdpa_varlen, sdpa_varlen_backward   packed variable-length batches (cu_seqlens)
  MHA                     nn.MultiheadAttention: constructed like torch's, or from a state_dict /
                          .safetensors file; forward, parameters, state_dict, forward_cached
  KVCache                 keys and values for decoding: append, attend, truncate, reset
  load_safetensors, save_safetensors, to_bfloat16, from_bfloat16
  AttnError               raised for every failure: .status, .name ("ATTN_ERR_BAD_SHAPE"), .message
Submodules, imported on demand: attn.torch (PyTorch >= 2.4: custom ops, scaled_dot_product_attention,
MultiheadAttention) and attn.hf (transformers: attn.hf.register()). `python -m attn` runs the attn
tool (the walkthrough without arguments).
The library is found through $ATTN_LIBRARY, then this package's folder (pip install .), then
../../build of this package, then the system loader (see _lib.py).
"""
import numpy as _np

from . import _lib
from ._arrays import choice as _choice, contiguous as _contiguous
from ._lib import STATUS_NAMES, AttnError, AttnTypeError, has_symbol
from .context import Context, Philox, RngState, default_context, openmp_runtime
from .files import load_safetensors, save_safetensors
from .kv_cache import KVCache, has_kv_cache
from .mha import MHA
from .sdpa import has_varlen, sdpa, sdpa_backward, sdpa_varlen, sdpa_varlen_backward

__version__ = _lib.fn("attn_version_string")().decode()
library_path = _lib.path


def version_number():
    """ATTN_VERSION_NUMBER of the loaded library (major * 10000 + minor * 100 + patch)."""
    return _lib.fn("attn_version_number")()


def isa_supported(isa):
    """Whether this build and CPU can run `isa` ("auto", "ref", "generic", "avx2", "avx512",
    "avx512vnni", "avx512bf16", "amxbf16")."""
    return bool(_lib.fn("attn_isa_supported")(_choice(isa, _lib.ISA, "isa")))


def has_blas():
    """Whether contexts made with use_blas=True compute projections through CBLAS (the build knows
    one and it can be loaded; this loads it, as such a context does)."""
    return bool(_lib.fn("attn_has_blas")())


def _convert(dst_code, dst_dtype, src_code, a):
    src = _np.ascontiguousarray(a)
    out = _np.empty(src.shape, dtype=dst_dtype)
    if src.size:
        _lib.check(_lib.fn("attn_convert")(dst_code, out.ctypes.data, src_code, src.ctypes.data, src.size))
    return out


def to_bfloat16(x):
    """float32 values -> uint16 array of bfloat16 bits, rounded to nearest even like torch's
    .bfloat16() (for KVCache storage checks and sdpa(..., kv_dtype="bf16"))."""
    return _convert(_lib.DTYPE_BF16, _np.uint16, _lib.DTYPE_F32, _contiguous(x, _np.float32, "x"))


def from_bfloat16(bits):
    """uint16 array of bfloat16 bits -> float32 values (exact)."""
    return _convert(_lib.DTYPE_F32, _np.float32, _lib.DTYPE_BF16, _contiguous(bits, _np.uint16, "bits"))


__all__ = ["AttnError", "AttnTypeError", "STATUS_NAMES", "Context", "Philox", "RngState", "default_context",
           "openmp_runtime", "sdpa", "sdpa_backward",
           "sdpa_varlen", "sdpa_varlen_backward", "has_varlen", "MHA", "KVCache", "has_kv_cache",
           "load_safetensors", "save_safetensors", "to_bfloat16", "from_bfloat16", "isa_supported", "has_blas",
           "has_symbol", "version_number", "library_path", "__version__"]

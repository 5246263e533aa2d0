"""kv_cache.py - KVCache: one layer's keys and values for decoding (attn_kv_cache_*)."""
import ctypes

import numpy as np

from . import _lib
from ._arrays import (F32, check_ndim, check_shape, choice, elem_strides, flag, integer, mask_view,
                      ptr, view)
from ._handle import Handle
from ._lib import fn
from .context import resolve
from .sdpa import _options

# The block-quantised types (ATTN_DTYPE_Q8_0, ATTN_DTYPE_Q4_0: blocks of 32 values along the head
# dimension, each with a float16 scale; ggml's layouts): a block's values and its bytes.
_QUANT = {"q8_0": (8, 34), "q4_0": (9, 18)}
_CACHE_DTYPES = {"f32": _lib.DTYPE_F32, "float32": _lib.DTYPE_F32, "f16": _lib.DTYPE_F16, "float16": _lib.DTYPE_F16,
                 "bf16": _lib.DTYPE_BF16, "bfloat16": _lib.DTYPE_BF16, "q8_0": 8, "q4_0": 9}
_DTYPE_NAMES = {_lib.DTYPE_F32: "f32", _lib.DTYPE_F16: "f16", _lib.DTYPE_BF16: "bf16", 8: "q8_0", 9: "q4_0"}


def has_kv_cache():
    """Whether the loaded library has the KV cache and the module's cached forward."""
    return all(_lib.has_symbol(s) for s in ("attn_kv_cache_create", "attn_kv_cache_attend",
                                             "attn_mha_forward_cached"))


class KVCache(Handle):
    """KVCache(batch, n_kv_heads, head_dim, capacity, dtype="f32", head_dim_v=None, ctx=None):
    keys (B, Hkv, capacity, D) and values (B, Hkv, capacity, Dv) stored as float32, float16 or
    bfloat16, or quantised on append as "q8_0" or "q4_0" (ggml's Q8_0 and Q4_0: blocks of 32 values
    along D with a float16 scale each; D and Dv must be multiples of 32), of which the first
    len(cache) positions are filled. On the instruction sets with 8-bit products ("avx2",
    "avx512vnni", "avx512bf16", "amxbf16"), attend with up to 8 query rows per kv head (decoding)
    rounds the query to int8 per block of 32 for the quantised types, as ggml does, and rounds the
    weights times the block scales to bf16 on "avx512bf16", to int16 on the others (attn.h,
    kv_dtype, states the error bounds)."""

    _FREE, _WHAT = "attn_kv_cache_free", "the cache"

    def __init__(self, batch, n_kv_heads, head_dim, capacity, dtype="f32", head_dim_v=None, *, ctx=None):
        self._ptr = None
        self.ctx = resolve(ctx)
        cfg = _lib.KVCacheConfig()
        fn("attn_kv_cache_config_init")(ctypes.byref(cfg))
        cfg.batch, cfg.n_kv_heads = integer(batch, "batch"), integer(n_kv_heads, "n_kv_heads")
        cfg.head_dim, cfg.capacity = integer(head_dim, "head_dim"), integer(capacity, "capacity")
        cfg.head_dim_v = 0 if head_dim_v is None else integer(head_dim_v, "head_dim_v")
        cfg.dtype = choice(dtype, _CACHE_DTYPES, "dtype")
        p = ctypes.c_void_p()
        self.ctx.check(fn("attn_kv_cache_create")(self.ctx.ptr, ctypes.byref(cfg), ctypes.byref(p)))
        self._ptr = p.value
        c = fn("attn_kv_cache_get_config")(self._ptr)[0]
        self.batch, self.n_kv_heads, self.head_dim, self.head_dim_v = c.batch, c.n_kv_heads, c.head_dim, c.head_dim_v
        self.capacity, self.dtype = c.capacity, _DTYPE_NAMES[c.dtype]

    def len(self):
        """The number of filled positions."""
        return fn("attn_kv_cache_length")(self.ptr)

    __len__ = len

    def append(self, k, v, *, ctx=None):
        """Appends n positions: k (B, Hkv, n, D) and v (B, Hkv, n, Dv), any float arrays (stored
        converted to the cache's dtype). AttnError ATTN_ERR_CAPACITY (nothing written) when they
        do not fit."""
        ctx = resolve(ctx, self.ctx)
        k, ks = view(k, F32, "k")
        v, vs = view(v, F32, "v")
        check_ndim(k, 4, "k", "(B, Hkv, n, D)")
        check_shape(k, (self.batch, self.n_kv_heads, None, self.head_dim), "k", ("B", "Hkv", "n", "D"))
        check_shape(v, (self.batch, self.n_kv_heads, k.shape[2], self.head_dim_v), "v", ("B", "Hkv", "n", "Dv"))
        ctx.check(fn("attn_kv_cache_append")(ctx.ptr, self.ptr, k.shape[2], ptr(k), _lib.I64x4(*ks), ptr(v),
                                             _lib.I64x4(*vs)))

    def truncate(self, length, *, ctx=None):
        """Forgets the positions from `length` on (0 <= length <= len(cache))."""
        ctx = resolve(ctx, self.ctx)
        ctx.check(fn("attn_kv_cache_truncate")(ctx.ptr, self.ptr, integer(length, "length")))

    def reset(self):
        """Empties the cache (its memory is kept)."""
        fn("attn_kv_cache_reset")(self.ptr)

    def _filled(self, which):
        kp, vp = ctypes.c_void_p(), ctypes.c_void_p()
        ks, vs = _lib.I64x4(), _lib.I64x4()
        fn("attn_kv_cache_storage")(self.ptr, ctypes.byref(kp), ks, ctypes.byref(vp), vs)
        p, s, d = (kp.value, ks, self.head_dim) if which == "k" else (vp.value, vs, self.head_dim_v)
        n = self.len()
        if self.dtype in _QUANT:  # rows of whole blocks: each (b, h) holds n * d values from its start
            code, block = _QUANT[self.dtype]
            out = np.empty((self.batch, self.n_kv_heads, n, d), dtype=F32)
            for b in range(self.batch):
                for h in range(self.n_kv_heads):
                    at = p + (b * s[0] + h * s[1]) // 32 * block
                    self.ctx.check(fn("attn_convert")(_lib.DTYPE_F32, out[b, h].ctypes.data, code, at, n * d))
            return out
        code = {"f32": _lib.DTYPE_F32, "f16": _lib.DTYPE_F16, "bf16": _lib.DTYPE_BF16}[self.dtype]
        size = 4 if code == _lib.DTYPE_F32 else 2
        full = (self.batch, self.n_kv_heads, self.capacity, d)
        count = int(np.prod(full))
        raw = np.frombuffer((ctypes.c_char * (count * size)).from_address(p),
                            dtype={4: np.float32, 2: np.uint16}[size])
        raw = np.lib.stride_tricks.as_strided(raw, full, [x * size for x in s])[:, :, :n]
        out = np.empty(raw.shape, dtype=F32)
        if out.size:
            src = np.ascontiguousarray(raw)
            self.ctx.check(fn("attn_convert")(_lib.DTYPE_F32, out.ctypes.data, code, src.ctypes.data, out.size))
        return out

    def keys(self):
        """A float32 copy of the filled keys, (B, Hkv, len, D)."""
        return self._filled("k")

    def values(self):
        """A float32 copy of the filled values, (B, Hkv, len, Dv)."""
        return self._filled("v")

    def attend(self, q, *, causal="bottom_right", mask=None, key_padding_mask=None, scale=None, window=None,
               alibi_slopes=None, softcap=0.0, sinks=None, return_lse=False, ctx=None):
        """SDPA of new queries q (B, H, L, D) against the filled positions (attn_kv_cache_attend),
        H a multiple of n_kv_heads. causal: "bottom_right" (query i of the L newest tokens sees
        positions < len - L + i + 1) or None. mask broadcasts to (B, H, L, len), key_padding_mask
        to (B, len); alibi_slopes and sinks (H,) as in attn.sdpa. Returns out (B, H, L, Dv), and
        lse (B, H, L) with return_lse."""
        ctx = resolve(ctx, self.ctx)
        choice(causal, {"bottom_right": 2, None: 0}, "causal (for a KV cache)")
        return_lse = flag(return_lse, "return_lse")
        q, qs = view(q, F32, "q")
        check_ndim(q, 4, "q", "(B, H, L, D)")
        check_shape(q, (self.batch, None, None, self.head_dim), "q", ("B", "H", "L", "D"))
        B, H, L, _ = q.shape
        S = self.len()
        desc = _lib.SdpaDesc()
        fn("attn_sdpa_desc_init")(ctypes.byref(desc))
        desc.batch, desc.n_heads, desc.len_q, desc.head_dim, desc.head_dim_v = B, H, L, self.head_dim, self.head_dim_v
        desc.q_stride[:] = qs
        keep = []
        for m, shape, what in ((mask, (B, H, L, S), "mask"), (key_padding_mask, (B, S), "key_padding_mask")):
            a, mp, dt, ms = mask_view(m, shape, what)
            if a is not None:
                keep.append(a)
                if what == "mask":
                    desc.mask, desc.mask_dtype = mp, dt
                    desc.mask_stride[:] = ms
                else:
                    desc.key_padding_mask, desc.key_padding_mask_dtype = mp, dt
                    desc.key_padding_mask_stride[:] = ms
        _options(desc, H, causal, scale, 0.0, window, alibi_slopes, softcap, sinks, keep)
        out = np.empty((B, H, L, self.head_dim_v), dtype=F32)
        desc.o_stride[:] = elem_strides(out)
        lse = np.empty((B, H, L), dtype=F32) if return_lse else None
        ctx.check(fn("attn_kv_cache_attend")(ctx.ptr, self.ptr, ctypes.byref(desc), ptr(q), ptr(out), ptr(lse)))
        return (out, lse) if return_lse else out

    def __repr__(self):
        if getattr(self, "_ptr", None) is None:
            return "KVCache(closed)"
        return "KVCache(batch=%d, n_kv_heads=%d, head_dim=%d, head_dim_v=%d, capacity=%d, dtype=%r, len=%d)" % (
            self.batch, self.n_kv_heads, self.head_dim, self.head_dim_v, self.capacity, self.dtype, self.len())

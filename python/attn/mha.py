"""mha.py - MHA: nn.MultiheadAttention (attn_mha_*), created like torch's or from a state_dict."""
import ctypes
from collections import OrderedDict

import numpy as np

from . import _lib
from ._arrays import (BF16_BITS, F16, F32, check_shape, contiguous, fail, flag, integer, kv_dtype_code, mask_code, real,
                      shape_str)
from ._lib import fn
from .context import resolve
from ._handle import Handle
from .files import TensorList


# The numpy type of a module's parameters, inputs and outputs, by its dtype code (bfloat16 as its bits).
_NP_TYPES = {_lib.DTYPE_F32: F32, _lib.DTYPE_F16: F16, _lib.DTYPE_BF16: BF16_BITS}


def _param_view(owner, data, shape, dtype=F32):
    n = int(np.prod(shape, dtype=np.int64))
    buf = (ctypes.c_char * (n * dtype.itemsize)).from_address(ctypes.cast(data, ctypes.c_void_p).value)
    buf._owner = owner  # the view keeps the module alive
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def _mask(m, what):
    if mask_code(m, what) == _lib.DTYPE_BOOL:
        return contiguous(m, np.bool_, what), _lib.DTYPE_BOOL
    return contiguous(m, F32, what), _lib.DTYPE_F32


class MHA(Handle):
    """nn.MultiheadAttention in libattn.

    MHA(embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
        kdim=None, vdim=None, batch_first=False, dtype="f32", ctx=None)
    initialises the parameters exactly like torch's constructor from the context's generator
    (after ctx.manual_seed(s), torch.manual_seed(s)'s weights). dtype "f16" or "bf16" makes a
    float16 / bfloat16 module (attn_mha_config.dtype; torch's .to(dtype)): its parameters, inputs
    and outputs are float16 arrays, or uint16 arrays of bfloat16 bits (attn.to_bfloat16). MHA.from_safetensors and
    MHA.from_state_dict load a state_dict instead. The module keeps its context and uses it
    unless a call passes another."""

    _FREE, _WHAT = "attn_mha_free", "the module"

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, dtype="f32", *, ctx=None):
        ctx = resolve(ctx)
        cfg = _lib.MhaConfig()
        fn("attn_mha_config_init")(ctypes.byref(cfg), integer(embed_dim, "embed_dim"), integer(num_heads, "num_heads"))
        cfg.kdim = 0 if kdim is None else integer(kdim, "kdim")
        cfg.vdim = 0 if vdim is None else integer(vdim, "vdim")
        cfg.bias, cfg.add_bias_kv = flag(bias, "bias"), flag(add_bias_kv, "add_bias_kv")
        cfg.add_zero_attn, cfg.batch_first = flag(add_zero_attn, "add_zero_attn"), flag(batch_first, "batch_first")
        cfg.dropout = real(dropout, "dropout")
        cfg.dtype = kv_dtype_code(dtype, "dtype")
        p = ctypes.c_void_p()
        ctx.check(fn("attn_mha_create")(ctx.ptr, ctypes.byref(cfg), ctypes.byref(p)))
        self._init(ctx, p.value)

    def _init(self, ctx, ptr):
        self._ptr, self.ctx = ptr, ctx

    @classmethod
    def from_state_dict(cls, state, num_heads, batch_first=False, add_zero_attn=False, dropout=0.0, dtype=None, *,
                        ctx=None):
        """A module holding `state` ({name: array}, e.g. {k: v.numpy() for k, v in
        torch_mha.state_dict().items()}); bias, add_bias_kv and kdim/vdim follow from the names
        present (attn_mha_create_from_state). The arrays are copied: all float16 ones make a
        float16 module, others are read as float32; dtype "f16" or "bf16" rounds them to that type."""
        ctx = resolve(ctx)
        half = len(state) > 0 and all(np.asarray(v).dtype == F16 for v in state.values())
        tl = TensorList(OrderedDict((k, contiguous(v, F16 if half else F32, k)) for k, v in state.items()))
        return cls._from_list(ctx, tl.list, num_heads, batch_first, add_zero_attn, dropout, dtype)

    @classmethod
    def from_safetensors(cls, path, num_heads, batch_first=False, add_zero_attn=False, dropout=0.0, dtype=None, *,
                         ctx=None):
        """A module from a .safetensors file holding an nn.MultiheadAttention state_dict
        (attn_safetensors_read + attn_mha_create_from_state): of the tensors' type (F32, F16 or
        BF16), or float32 tensors rounded to dtype "f16" / "bf16"."""
        ctx = resolve(ctx)
        lst = _lib.TensorList()
        ctx.check(fn("attn_safetensors_read")(ctx.ptr, str(path).encode(), ctypes.byref(lst)))
        try:
            return cls._from_list(ctx, lst, num_heads, batch_first, add_zero_attn, dropout, dtype)
        finally:
            fn("attn_tensor_list_release")(ctx.ptr, ctypes.byref(lst))

    @classmethod
    def _from_list(cls, ctx, lst, num_heads, batch_first, add_zero_attn, dropout, dtype):
        extra = _lib.MhaConfig()
        extra.batch_first, extra.add_zero_attn = flag(batch_first, "batch_first"), flag(add_zero_attn, "add_zero_attn")
        extra.dropout = real(dropout, "dropout")
        extra.dtype = _lib.DTYPE_F32 if dtype is None else kv_dtype_code(dtype, "dtype")
        p = ctypes.c_void_p()
        ctx.check(fn("attn_mha_create_from_state")(ctx.ptr, ctypes.byref(lst), integer(num_heads, "num_heads"), ctypes.byref(extra),
                                                   ctypes.byref(p)))
        self = cls.__new__(cls)
        self._init(ctx, p.value)
        return self

    # ---- configuration and parameters --------------------------------------------------------

    @property
    def config(self):
        """A dict of the module's configuration (kdim/vdim resolved)."""
        c = fn("attn_mha_get_config")(self.ptr)[0]
        return dict(embed_dim=c.embed_dim, num_heads=c.num_heads, kdim=c.kdim, vdim=c.vdim, bias=bool(c.bias),
                    add_bias_kv=bool(c.add_bias_kv), add_zero_attn=bool(c.add_zero_attn),
                    batch_first=bool(c.batch_first), dropout=c.dropout,
                    dtype={_lib.DTYPE_F32: "f32", _lib.DTYPE_F16: "f16", _lib.DTYPE_BF16: "bf16"}[c.dtype])

    embed_dim = property(lambda self: self.config["embed_dim"])
    num_heads = property(lambda self: self.config["num_heads"])
    batch_first = property(lambda self: self.config["batch_first"])
    dtype = property(lambda self: self.config["dtype"])
    # the numpy type of the parameters, inputs and outputs (uint16 bits for bfloat16)
    _np = property(lambda self: _NP_TYPES[kv_dtype_code(self.dtype)])

    def named_parameters(self):
        """[(name, array)] in state_dict order; the arrays are views of the module's memory
        (writing them changes the module; they are invalid after close())."""
        out = []
        for i in range(fn("attn_mha_param_count")(self.ptr)):
            name, ndim = ctypes.c_char_p(), ctypes.c_int()
            shape, dt, data = (ctypes.c_int64 * 3)(), ctypes.c_int(), ctypes.c_void_p()
            self.ctx.check(fn("attn_mha_param_typed_at")(self.ptr, i, ctypes.byref(name), ctypes.byref(ndim), shape,
                                                         ctypes.byref(dt), ctypes.byref(data)))
            out.append((name.value.decode(), _param_view(self, data, tuple(shape[:ndim.value]), _NP_TYPES[dt.value])))
        return out

    def parameters(self):
        return [a for _, a in self.named_parameters()]

    def state_dict(self):
        """OrderedDict name -> a copy of each parameter, torch's state_dict order and names."""
        return OrderedDict((n, a.copy()) for n, a in self.named_parameters())

    def load_state_dict(self, state):
        """Copies {name: array} into the parameters (every name and shape must match)."""
        params = OrderedDict(self.named_parameters())
        if set(state) != set(params):
            fail(_lib.ERR_NOT_FOUND if set(params) - set(state) else _lib.ERR_INVALID_ARG,
                 "state names %s differ from the module's %s" % (sorted(state), list(params)))
        for n, a in state.items():
            a = contiguous(a, self._np, n)
            if a.shape != params[n].shape:
                fail(_lib.ERR_BAD_SHAPE, "%s has shape %s, the module's %s" % (n, shape_str(a.shape),
                                                                                shape_str(params[n].shape)))
            params[n][...] = a

    def save_safetensors(self, path):
        from .files import save_safetensors
        save_safetensors(path, self.state_dict(), ctx=self.ctx)

    # ---- forward ----------------------------------------------------------------------------------

    def forward(self, query, key=None, value=None, key_padding_mask=None, *, attn_mask=None, causal=False,
                need_weights=True, average_attn_weights=True, training=False, ctx=None):
        """nn.MultiheadAttention.forward: returns (out, weights), weights None without need_weights.

        query (L, N, E), key (S, N, kdim), value (S, N, vdim), or (N, L, E) etc. with batch_first;
        (L, E), (S, kdim), (S, vdim) unbatched. key None means key = query, value None value = key;
        passing the same array object for several of them is self-attention with one packed
        projection, as `query is key` in torch. attn_mask: (L, S) or (N*H, L, S), bool
        (True = not allowed) or float (added); key_padding_mask: (N, S) or (S,), bool (True =
        ignore) or float; causal: triu(ones(L, S), 1) as the mask (exclusive with attn_mask).
        weights: (N, L, S') averaged over heads, or (N, H, L, S') per head, N dropped unbatched,
        with S' = S + add_bias_kv + add_zero_attn. training applies the module's dropout."""
        ctx = resolve(ctx, self.ctx)
        c = self.config
        E, H, kdim, vdim, bf = c["embed_dim"], c["num_heads"], c["kdim"], c["vdim"], c["batch_first"]
        npt = self._np  # float32, float16, or uint16 bfloat16 bits: inputs and outputs of the module's type
        q = contiguous(query, npt, "query")
        if q.ndim not in (2, 3):
            fail(_lib.ERR_BAD_SHAPE, "query must be (L, N, E), (N, L, E) with batch_first, or (L, E) unbatched; "
                 "got shape %s" % shape_str(q.shape))
        unbatched = q.ndim == 2
        if unbatched:
            N, L = 1, q.shape[0]
            check_shape(q, (None, E), "query", ("L", "E"))
        else:
            N, L = (q.shape[0], q.shape[1]) if bf else (q.shape[1], q.shape[0])
            check_shape(q, (N, L, E) if bf else (L, N, E), "query", ("N", "L", "E") if bf else ("L", "N", "E"))

        def tokens(x, dim, what):
            """x's sequence length after checking its other sizes."""
            if unbatched:
                check_shape(x, (None, dim), what, ("S", what[0] + "dim"))
                return x.shape[0]
            names = ("N", "S", what[0] + "dim") if bf else ("S", "N", what[0] + "dim")
            check_shape(x, (N, None, dim) if bf else (None, N, dim), what, names)
            return x.shape[1] if bf else x.shape[0]

        if key is None:
            k, S = None, L
            if kdim != E:
                fail(_lib.ERR_BAD_SHAPE, "key = query needs kdim == embed_dim (%d != %d)" % (kdim, E))
        else:
            k = q if key is query else contiguous(key, npt, "key")
            S = tokens(k, kdim, "key")
        if value is None:
            v = None
            if vdim != kdim:
                fail(_lib.ERR_BAD_SHAPE, "value = key needs vdim == kdim (%d != %d)" % (vdim, kdim))
        else:
            v = q if value is query else k if (value is key and k is not None) else contiguous(value, npt, "value")
            if tokens(v, vdim, "value") != S:
                fail(_lib.ERR_BAD_SHAPE, "value has %d positions, key %d" % (tokens(v, vdim, "value"), S))
        args = _lib.MhaArgs()
        fn("attn_mha_args_init")(ctypes.byref(args))
        args.query = q.ctypes.data
        args.key = None if k is None else k.ctypes.data
        args.value = None if v is None else v.ctypes.data
        args.batch, args.len_q, args.len_kv, args.unbatched = N, L, S, int(unbatched)
        keep = []
        if attn_mask is not None:
            m, dt = _mask(attn_mask, "attn_mask")
            if m.ndim == 2:
                check_shape(m, (L, S), "attn_mask", ("L", "S"))
            elif m.ndim == 3:
                check_shape(m, (N * H, L, S), "attn_mask", ("N*H", "L", "S"))
            else:
                fail(_lib.ERR_BAD_MASK, "attn_mask must be (L, S) or (N*H, L, S), got shape %s" % shape_str(m.shape))
            keep.append(m)
            args.attn_mask, args.attn_mask_dtype, args.attn_mask_ndim = m.ctypes.data, dt, m.ndim
        if key_padding_mask is not None:
            m, dt = _mask(key_padding_mask, "key_padding_mask")
            if m.shape != ((S,) if unbatched else (N, S)):
                fail(_lib.ERR_BAD_MASK, "key_padding_mask has shape %s, expected %s" % (
                    shape_str(m.shape), "(S=%d)" % S if unbatched else "(N=%d, S=%d)" % (N, S)))
            keep.append(m)
            args.key_padding_mask, args.key_padding_mask_dtype = m.ctypes.data, dt
        args.causal = flag(causal, "causal")
        args.need_weights = flag(need_weights, "need_weights")
        args.average_attn_weights = flag(average_attn_weights, "average_attn_weights")
        args.training = flag(training, "training")
        out = np.empty(q.shape, dtype=npt)
        weights = None
        if need_weights:
            Sw = fn("attn_mha_weights_len_kv")(self.ptr, S)
            shape = (L, Sw) if average_attn_weights else (H, L, Sw)
            weights = np.empty(shape if unbatched else (N,) + shape, dtype=npt)
        ctx.check(fn("attn_mha_forward")(ctx.ptr, self.ptr, ctypes.byref(args), out.ctypes.data,
                                         None if weights is None else weights.ctypes.data))
        return out, weights

    __call__ = forward

    def forward_cached(self, x, cache, *, ctx=None):
        """Self-attention of new tokens x with a KVCache (attn_mha_forward_cached): x (len, N, E),
        or (N, len, E) with batch_first; appends their keys and values to `cache` and attends with
        bottom-right causal masking over everything cached. Returns out, x's shape."""
        ctx = resolve(ctx, self.ctx)
        from .kv_cache import KVCache
        if not isinstance(cache, KVCache):
            fail(_lib.ERR_INVALID_ARG, "cache must be an attn.KVCache, not %s" % type(cache).__name__)
        x = contiguous(x, self._np, "x")
        E, bf = self.embed_dim, self.batch_first
        if x.ndim != 3 or x.shape[2] != E:
            fail(_lib.ERR_BAD_SHAPE, "x has shape %s, expected %s with E=%d" % (
                shape_str(x.shape), "(N, len, E)" if bf else "(len, N, E)", E))
        N, n = (x.shape[0], x.shape[1]) if bf else (x.shape[1], x.shape[0])
        out = np.empty(x.shape, dtype=x.dtype)
        ctx.check(fn("attn_mha_forward_cached")(ctx.ptr, self.ptr, cache.ptr, x.ctypes.data, N, n, out.ctypes.data))
        return out

    def __repr__(self):
        if getattr(self, "_ptr", None) is None:
            return "MHA(closed)"
        c = self.config
        return "MHA(embed_dim=%d, num_heads=%d, kdim=%d, vdim=%d, bias=%s, batch_first=%s, dtype=%s)" % (
            c["embed_dim"], c["num_heads"], c["kdim"], c["vdim"], c["bias"], c["batch_first"], c["dtype"])
